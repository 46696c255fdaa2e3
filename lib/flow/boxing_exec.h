/* The distributed boxing executor: runs a boxing plan (flow/boxing.h) on
 * real ranks, each rank moving its own piece through the communicators
 * (flow/comm.h) of the mesh's axis groups.  It is the runtime half of
 * boxing; the algebra, the planner and the reference executor that runs a
 * plan on simulated ranks (flow_boxing_simulate) need no ranks and live
 * in flow/boxing.h.  The two executors move the same bytes, so tests take
 * the reference one as the oracle (tests/cluster/boxing.bats). */
#ifndef FLOW_BOXING_EXEC_H
#define FLOW_BOXING_EXEC_H

#include <flow/boxing.h>
#include <flow/comm.h>
#include <flow/exec.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The communicators of a mesh's axis groups, for flow_boxing_run: one per
 * set of axes a step runs on, split from the world communicator on first
 * use (flow_comm_mesh_axes), so every rank of the mesh must run the same
 * plans in the same order (as ranks executing one training graph do). */
typedef struct flow_boxing_comms flow_boxing_comms_t;

/* For mesh, whose ranks are world ranks (flow_world_info()->rank; mesh->base
 * and strides map mesh positions to them), this rank one of them.  They are
 * translated to the ranks of the communicator world, which may be a group
 * of the world (flow_comm_world_rank): the mesh must cover exactly the
 * communicator's ranks, in an order that maps affinely onto communicator
 * ranks (each axis a fixed stride of them), else FLOW_ERR_USAGE.
 *
 * The pieces live in storage's memory, which the executor's scratch comes
 * from, and kernels (a set of that memory's device) packs, unpacks and
 * slices them with box_move and waits for them with last before each
 * collective; NULL for both: host memory and the CPU set (one NULL
 * without the other: FLOW_ERR_USAGE).  world must
 * move that memory (a CPU communicator host memory, storage->host_memory;
 * an NCCL one a GPU's), else FLOW_ERR_NOTSUP.  Not collective
 * (the groups are split on first use).  Free with
 * flow_boxing_comms_free(). */
FLOW_EXPORT flow_err_t flow_boxing_comms_new(flow_comm_t *world,
					     const flow_mesh_t *mesh,
					     const flow_kernels_t *kernels,
					     const flow_exec_storage_t *storage,
					     flow_boxing_comms_t **comms_out,
					     flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_boxing_comms_free(flow_boxing_comms_t *comms);
/* The storage and the kernel set the comms were made with
 * (flow_exec_storage_host and flow_cpu_kernels for NULL): whose memory
 * the pieces, and whatever else their collectives move, must be in, and
 * the kernels of that memory. */
FLOW_EXPORT const flow_exec_storage_t *
flow_boxing_comms_storage(const flow_boxing_comms_t *comms);
FLOW_EXPORT const flow_kernels_t *
flow_boxing_comms_kernels(const flow_boxing_comms_t *comms);
/* The communicator of the group of axes_mask (bit i: axis i of the mesh)
 * holding this rank, made on first use as above; borrowed. */
FLOW_EXPORT flow_err_t flow_boxing_comms_axes(flow_boxing_comms_t *comms,
					      unsigned axes_mask,
					      flow_comm_t **comm_out,
					      flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Run plan on this rank, which every rank of the plan's mesh calls with
 * the same plan: src holds this rank's piece in (plan->src_mesh,
 * plan->src), row-major, plan->dtype (any dtype; one the communicator
 * can reduce when an all-reduce or reduce-scatter step sums); dst
 * receives its piece in (plan->dst_mesh, plan->dst).  src and dst must
 * not overlap; an empty plan copies.  Collective sums are those of the
 * communicator (flow/comm.h), so the same bits on every rank of a group.
 * A send/recv step runs as one all-to-all over all the mesh's axes, each
 * rank sending each other the slice intersections the reference executor
 * sends; a receiver of addends sums them from zero in mesh-position order,
 * as flow_boxing_simulate does, so the results match it bit for bit.
 * plan->src_mesh must equal plan->dst_mesh and the comms' mesh
 * (FLOW_ERR_USAGE otherwise), so send/recv runs only within one mesh;
 * FLOW_ERR_NOTSUP for a broadcast step, which flow_boxing_plan never
 * emits; FLOW_ERR_PEER/TIMEOUT as the collectives give them. */
FLOW_EXPORT flow_err_t flow_boxing_run(const flow_boxing_plan_t *plan,
				       flow_boxing_comms_t *comms,
				       const void *src, void *dst,
				       flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
