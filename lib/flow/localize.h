/* One rank's share of a plan: the training graph as that rank runs it.
 *
 * flow_local_build takes the plan (flow/plan.h), the global training graph
 * it describes (flow_gpt_build + flow_graph_backward at the plan's batch)
 * and the rank's mesh position, and writes a graph of local shapes: every
 * tensor as the box of the logical tensor its layout gives this position
 * (flow_nd_sbp_local_box), every op with the SBP signature the plan gives
 * it, and a boxing op (FLOW_OP_BOXING, with its plan from
 * flow_boxing_plan) wherever an op reads a tensor, or writes one, in a
 * layout other than the tensor's own: forward and backward.  Ops that must
 * know their shard get it in their attrs: an embedding over a row shard of
 * wte (row_start, split_axes), a cross-entropy over a column shard of the
 * logits (the classes split: the executor sums its row statistics over
 * the group).  The executor runs the result (flow_exec_set_dist).
 *
 * Tensor i < global->ntensors of the local graph is global tensor i, in
 * its own layout; the boxing outputs come after.  A parameter gradient is
 * held in the layout its backward ops write (partial on the dp axis,
 * where every rank adds its own batch): its sync to the plan's layout is
 * the caller's (flow/zero.h), which is why those two may differ only by P
 * against B (or S(0), under ZeRO) on the axis named dp. */
#ifndef FLOW_LOCALIZE_H
#define FLOW_LOCALIZE_H

#include <flow/boxing.h>
#include <flow/graph.h>
#include <flow/plan.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flow_local {
	flow_graph_t graph;         /* local shapes, boxing ops inserted */
	int64_t index;              /* this rank's mesh position */
	flow_nd_sbp_t *sbp;         /* per local tensor: its layout */
	flow_box_t *box;            /* per local tensor: its box of the
				     * logical tensor */
	flow_shape_t *logical;      /* per local tensor: the logical shape */
	flow_boxing_plan_t *boxings; /* the boxing ops' plans */
	size_t nboxings;
	unsigned loss_partial_axes; /* axes where the losses are partial
				     * (P): the loss is their sum there */
} flow_local_t;

/* Build rank `index`'s graph of plan (valid: flow_plan_check) from global
 * (its training graph).  FLOW_ERR_NOTSUP "PATH:LINE: ..." naming the
 * plan's op or tensor line for what this runtime cannot run (a write in a
 * layout other than its tensor's into a gradient other ops add to, a
 * parameter gradient whose written and synced layouts differ other than
 * on dp, attention on split heads).  Release with flow_local_release(). */
FLOW_EXPORT flow_err_t flow_local_build(const flow_plan_t *plan,
					const flow_graph_t *global,
					int64_t index, flow_local_t *local_out,
					flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_local_release(flow_local_t *local);

/* Is this rank the one that holds tensor t's box for the mesh: the first
 * position (coordinate 0) on every axis of size > 1 where t's layout
 * replicates (B)?  Exactly one rank per distinct box is, so writing or
 * summing only there counts each element once. */
FLOW_EXPORT bool flow_local_owns(const flow_local_t *local,
				 const flow_mesh_t *mesh, int t);

#ifdef __cplusplus
}
#endif

#endif
