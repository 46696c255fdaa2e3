/* Boxing: plans that turn a tensor laid out as (placement A, nd-SBP X) into
 * (placement B, nd-SBP Y), with their costs on a cluster profile
 * (flow/cluster.h), a reference executor that runs a plan on in-process
 * buffers, and a check of a plan in it (flow(7), BOXING).
 *
 * A plan is a list of steps.  Each step is a collective on the groups of
 * some mesh axes (every group runs it independently, on the sub-tensor
 * that group holds), a local operation, or a send/recv of slice
 * intersections.  Between steps the tensor has a well-defined nd-SBP.
 *
 * Collectives follow the ring algorithms, and their bytes are counted as
 * the ring moves them; with the pieces s_0..s_{p-1} of a group of p ranks
 * (in group order, the balanced split of the sub-tensor, or each rank's
 * local piece) and T their sum:
 *   all-gather      rank r sends T - s_{r+1}, receives T - s_r
 *   reduce-scatter  rank r sends T - s_r,   receives T - s_{r-1}
 *   all-reduce      reduce-scatter then all-gather on the balanced split
 *                   of the element count
 *   all-to-all      rank r sends to each other rank the part of its piece
 *                   the other holds afterwards, receives likewise
 *   broadcast       (a chain from the group's first rank) every rank but
 *                   the last sends T, every rank but the first receives T
 *   send/recv       every rank sends each other rank the intersection of
 *                   what it holds with what the other needs (a P source
 *                   sends its addends, the receiver sums them)
 *   local ops       nothing
 * indices mod p.  Time under the alpha-beta model: a ring step on a group
 * costs alpha + bytes/beta of the slowest link class it crosses; a
 * collective takes (p-1) ring steps (2(p-1) for all-reduce) of the
 * largest piece; send/recv takes alpha per message plus the largest
 * per-rank byte count over beta; local ops take 0.  The planner searches
 * the cheapest route by time (ties: fewer bytes). */
#ifndef FLOW_BOXING_H
#define FLOW_BOXING_H

#include <stdio.h>

#include <flow/cluster.h>
#include <flow/sbp.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- plans ---------------------------------------------------------------------- */

typedef enum {
	FLOW_BOXING_ALL_REDUCE = 0,     /* P -> B on the groups of `axes` */
	FLOW_BOXING_REDUCE_SCATTER = 1, /* P -> S(k) */
	FLOW_BOXING_ALL_GATHER = 2,     /* S(k) -> B */
	FLOW_BOXING_ALL_TO_ALL = 3,     /* S(i) -> S(j) */
	FLOW_BOXING_BROADCAST = 4,      /* B on the group's first rank -> B */
	FLOW_BOXING_SLICE = 5,          /* B -> S(k): keep one's part, local */
	FLOW_BOXING_ZERO_FILL = 6,      /* B -> P: group's first rank keeps the
					 * tensor, the others zero, local */
	FLOW_BOXING_PAD_ZERO = 7,       /* S(k) -> P: each rank embeds its part
					 * in zeros, local */
	FLOW_BOXING_SEND_RECV = 8,      /* slice intersections between any two
					 * layouts and placements */
} flow_boxing_kind_t;

#define FLOW_BOXING_KIND_COUNT 9

/* "all-reduce", "reduce-scatter", "all-gather", "all-to-all", "broadcast",
 * "slice", "zero-fill", "pad-zero", "send-recv". */
FLOW_EXPORT const char *flow_boxing_kind_name(flow_boxing_kind_t kind);

typedef struct flow_boxing_step {
	flow_boxing_kind_t kind;
	unsigned axes;          /* mesh axes whose groups run it (bit i: axis
				 * i of the mesh), 0 for send/recv */
	flow_mesh_t mesh;       /* the placement the step starts on */
	flow_nd_sbp_t from;     /* layout before the step */
	flow_mesh_t to_mesh;    /* after (differs only for send/recv) */
	flow_nd_sbp_t to;       /* layout after */
	uint64_t max_send_bytes; /* over ranks */
	uint64_t max_recv_bytes;
	uint64_t total_bytes;   /* sent, summed over ranks */
	double time_s;          /* alpha-beta estimate */
} flow_boxing_step_t;

#define FLOW_BOXING_MAX_STEPS 16

typedef struct flow_boxing_plan {
	flow_shape_t shape;       /* logical */
	flow_dtype_t dtype;
	flow_mesh_t src_mesh, dst_mesh;
	flow_nd_sbp_t src, dst;
	size_t nsteps;
	flow_boxing_step_t steps[FLOW_BOXING_MAX_STEPS];
	uint64_t total_bytes;
	double time_s;
} flow_boxing_plan_t;

/* Plan the conversion of a tensor of shape and dtype from (src_mesh, src)
 * to (dst_mesh, dst), both valid for the shape (flow_nd_sbp_check):
 * normalise (size-1 mesh axes are B; adjacent axes with equal SBPs whose
 * splits merge exactly act as one axis), then search the cheapest route
 * (Dijkstra over the valid nd-SBPs of the mesh, each edge changing the SBP
 * of one axis, or of merged axes, by a 1-D rule legal there, plus direct
 * send/recv edges), so a conversion with no cheap direct route goes
 * through middle nd-SBPs.  Different placements (or different meshes over
 * the same ranks) go through send/recv, then local steps on the
 * destination.  Equal layouts give an empty plan.  cluster may be NULL
 * (flow_cluster_default).  FLOW_ERR_USAGE for an invalid layout. */
FLOW_EXPORT flow_err_t flow_boxing_plan(const flow_shape_t *shape,
					flow_dtype_t dtype,
					const flow_mesh_t *src_mesh,
					const flow_nd_sbp_t *src,
					const flow_mesh_t *dst_mesh,
					const flow_nd_sbp_t *dst,
					const flow_cluster_t *cluster,
					flow_boxing_plan_t *plan_out,
					flow_diag_t *diag) FLOW_MUST_CHECK;

/* Bytes global rank `rank` sends and receives in step `step` of plan (0
 * for a rank the step does not involve), by the rules above. */
FLOW_EXPORT void flow_boxing_step_rank_bytes(const flow_boxing_plan_t *plan,
					     size_t step, int64_t rank,
					     uint64_t *send_out,
					     uint64_t *recv_out);

/* Bytes global rank `rank` sends and receives over all the plan's steps:
 * the sums of flow_boxing_step_rank_bytes (0 for a rank no step involves,
 * and for an empty plan). */
FLOW_EXPORT void flow_boxing_plan_rank_bytes(const flow_boxing_plan_t *plan,
					     int64_t rank, uint64_t *send_out,
					     uint64_t *recv_out);

/* The most bytes any one rank (of either placement) sends, and the most
 * any one receives, over the whole plan (flow_boxing_plan_rank_bytes),
 * maximised over ranks separately (the busiest sender and the busiest
 * receiver may differ).  Both 0 for
 * an empty plan.  These are the "total" row's send and receive bytes of
 * flow_boxing_plan_print and of flow-plan --boxing --json. */
FLOW_EXPORT void flow_boxing_plan_busiest(const flow_boxing_plan_t *plan,
					  uint64_t *send_out,
					  uint64_t *recv_out);

/* Print the plan as TSV: header
 * "step\tkind\taxes\tfrom\tto\tmax_send_bytes\tmax_recv_bytes\ttotal_bytes\ttime_us"
 * and one row per step, then a "total" row (its send and receive bytes
 * from flow_boxing_plan_busiest).  FLOW_OK, or FLOW_ERR_IO when out
 * reports a write error. */
FLOW_EXPORT flow_err_t flow_boxing_plan_print(const flow_boxing_plan_t *plan,
					      FILE *out, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* ---- the reference executor ------------------------------------------------- */

/* Copy (add: add, as both executors sum: integers wrap, bf16 and f16
 * through f32) the elements of region, a box inside both sbox and dbox,
 * from src laid out row-major as sbox into dst laid out as dbox: the host
 * kernel sets' box_move (flow/kernels.h). */
FLOW_EXPORT void flow_boxing_move_region(flow_dtype_t dtype, const void *src,
					 const flow_box_t *sbox, void *dst,
					 const flow_box_t *dbox,
					 const flow_box_t *region, bool add);

/* Run plan on simulated ranks: local[r] holds global rank r's piece
 * (row-major, plan->dtype; f32, f64 or integer types are summed exactly
 * for integer-valued data) for every rank of src_mesh on entry, and of
 * dst_mesh on exit; buffers are (re)allocated with flow_alloc as needed
 * (the caller frees each with flow_free).  nranks covers every rank of both
 * placements.  sent_out[r] and recvd_out[r] (may be NULL) receive the
 * bytes each rank moved, counted as the steps move them, for comparison
 * with flow_boxing_step_rank_bytes. */
FLOW_EXPORT flow_err_t flow_boxing_simulate(const flow_boxing_plan_t *plan,
					    void **local, size_t nranks,
					    uint64_t *sent_out,
					    uint64_t *recvd_out,
					    flow_diag_t *diag) FLOW_MUST_CHECK;

/* Check plan end to end in the reference executor.  The data: element e
 * of the logical tensor (row-major) is the integer 1 + e mod (bound - 1),
 * bound 256 for bf16, 2048 for f16, 255 for u8, 65535 for u16, 2^24 for
 * f32 and 2^30 for the other dtypes, so every dtype holds it exactly; a
 * source that is P on some axes splits each element into non-negative
 * integer addends, one per rank of its P group, so every sum is exact.
 * It fills the pieces of the source placement, runs flow_boxing_simulate
 * on global ranks 0 to the top rank of either placement (all in this
 * process: about one piece of the tensor per rank), and checks that every
 * destination rank holds its slice (with P axes: that the addends of the
 * ranks that differ only in their P coordinates sum to it), that every
 * rank sent and received, as the executor moved them, the bytes of
 * flow_boxing_plan_rank_bytes, and that the bytes sent add up to
 * plan->total_bytes.  Returns FLOW_OK when all hold.  FLOW_ERR_VERIFY
 * with the first difference found, as one of
 *   "verification failed: rank R holds nothing"
 *   "verification failed: element (I,J,...) on rank R is G, expected W"
 *   "verification failed: the addends of element (I,J,...) on ranks R+S
 *    sum to G, expected W"
 *   "verification failed: rank R sent N bytes, the plan says M"
 *   "verification failed: rank R received N bytes, the plan says M"
 *   "verification failed: the ranks sent N bytes in all, the plan says M";
 * FLOW_ERR_NOMEM; or flow_boxing_simulate's error (FLOW_ERR_USAGE for
 * steps that reach no simulated rank).  The plan is not changed and
 * nothing is kept. */
FLOW_EXPORT flow_err_t flow_boxing_verify(const flow_boxing_plan_t *plan,
					  flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
