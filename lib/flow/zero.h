/* ZeRO on the data-parallel axis (flow-plan(5), "zero"): which elements of
 * each parameter, of its gradient and of its AdamW moments one
 * data-parallel rank holds, read from a plan's nd-SBPs, and the
 * collectives that move a parameter between its layouts.
 *
 * A ZeRO shard is S(0) on the dp axis: rank r holds the rows
 * flow_split_part gives it, so its shard is one contiguous run of the
 * row-major tensor and the shards of all ranks, in rank order, are the
 * tensor.  Three independent choices per parameter, as the plan states
 * them:
 *   state_split  the AdamW moments are shards: each rank updates only its
 *                rows, then the parameter is all-gathered (ZeRO 1);
 *   grad_split   the gradient is synced by reduce-scatter into the shard
 *                instead of all-reduce (ZeRO 2);
 *   param_split  the parameter itself lives as shards between steps (in
 *                checkpoints too) and is all-gathered before the next
 *                forward pass (ZeRO 3).
 * A gradient or parameter split requires split moments (the update reads
 * the shard).  On a graph localized for other axes (flow/localize.h) the
 * parameters are the local shards, and ZeRO must be off. */
#ifndef FLOW_ZERO_H
#define FLOW_ZERO_H

#include <flow/comm.h>
#include <flow/exec.h>
#include <flow/localize.h>
#include <flow/plan.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flow_zero_param {
	int tensor;           /* graph index of the parameter */
	bool state_split;     /* ZeRO 1: AdamW moments are this rank's rows */
	bool grad_split;      /* ZeRO 2: gradient reduce-scattered */
	bool param_split;     /* ZeRO 3: parameter kept as shards */
	size_t numel;
	size_t begin, count;  /* this rank's shard, in elements (the whole
			       * tensor when nothing is split) */
	size_t *counts;       /* every dp rank's shard, in elements */
	flow_box_t box;       /* this rank's shard as a box of the logical
			       * tensor */
	flow_box_t param_box; /* the box this rank's parameter buffer holds
			       * (the whole tensor, unless localized) */
	flow_shape_t shape;   /* the logical tensor's */
	bool owner;           /* this rank holds the first replica of its
			       * unsplit part: it writes it to checkpoints and
			       * counts it in the gradient norm */
} flow_zero_param_t;

typedef struct flow_zero {
	int dp_rank, dp_size;
	size_t nparams;
	flow_zero_param_t *params; /* the graph's parameters, in graph order */
	bool any_split;       /* some parameter has split moments */
	bool params_stale;    /* split parameters changed since gathered */
	/* The largest parameter's room, made on first need where the
	 * collectives land: in the executor's storage when its communicator
	 * moves that memory (the host's over a CPU communicator, a device's
	 * over NCCL), freed through that storage ... */
	float *scratch;
	const flow_exec_storage_t *scratch_storage;
	/* ... or, when a CPU communicator serves a device's storage
	 * (flow-train --comm cpu on a GPU), host copies: what it sends and
	 * what it receives. */
	float *staging, *host_scratch;
	size_t largest;       /* elements of the largest parameter */
} flow_zero_t;

/* The layout of every parameter of g for data-parallel rank dp_rank of
 * dp_size, from plan (NULL: everything replicated).  local (NULL: g is
 * the global graph) gives g's parameters' boxes and which of them this
 * rank owns, on plan's mesh.  FLOW_ERR_NOTSUP, "PATH:LINE: ..." naming the
 * plan's tensor line, for a layout this runtime cannot execute (a split
 * other than S(0) on dp, a split gradient or parameter with replicated
 * moments, m and v differing, ZeRO on a localized graph).  Free with
 * flow_zero_free(). */
FLOW_EXPORT flow_err_t flow_zero_new(const flow_plan_t *plan,
				     const flow_graph_t *g,
				     const flow_local_t *local, int dp_rank,
				     int dp_size, flow_zero_t **zero_out,
				     flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_zero_free(flow_zero_t *z);

/* The layout of graph tensor param; NULL when it is not a parameter. */
FLOW_EXPORT const flow_zero_param_t *flow_zero_param(const flow_zero_t *z,
						     int param);

/* Gradient sync: each parameter's gradient in exec is summed over comm
 * (the dp group), by all-reduce, or by reduce-scatter into this rank's
 * shard when it is split (the rest of that gradient is then stale). */
FLOW_EXPORT flow_err_t flow_zero_sync_grads(flow_zero_t *z, flow_comm_t *comm,
					    flow_exec_t *exec,
					    flow_diag_t *diag) FLOW_MUST_CHECK;

/* This rank's part of the squared L2 norm of the gradients (after the
 * sync): its shards of split ones, and the others where it is the owner,
 * so that the sum over all the ranks counts every element once. */
FLOW_EXPORT double flow_zero_grad_sum_squares(const flow_zero_t *z,
					      flow_exec_t *exec);

/* After an update of the shards: parameters with split moments but not
 * kept split are all-gathered now; kept-split ones are marked stale. */
FLOW_EXPORT flow_err_t flow_zero_after_update(flow_zero_t *z,
					      flow_comm_t *comm,
					      flow_exec_t *exec,
					      flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* The parameters in exec were overwritten in place (read from a
 * checkpoint, only this rank's shard of a kept-split one): the kept-split
 * ones are marked stale, so that the next flow_zero_before_forward
 * gathers them.  Not collective. */
FLOW_EXPORT void flow_zero_params_changed(flow_zero_t *z);

/* Before a forward pass: stale split parameters are all-gathered. */
FLOW_EXPORT flow_err_t flow_zero_before_forward(flow_zero_t *z,
						flow_comm_t *comm,
						flow_exec_t *exec,
						flow_diag_t *diag)
	FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
