/* Private to the executor (lib/runtime/exec.c, the single-graph part, and
 * lib/runtime/exec_dist.c, the ops of a localized graph that talk to
 * other ranks): the executor's state and each op ready to run. */
#ifndef FLOW_EXEC_INTERNAL_H
#define FLOW_EXEC_INTERNAL_H

#include <flow/boxing_exec.h>
#include <flow/exec.h>
#include <flow/kernels.h>

#include "graph/graph_internal.h"
#include "ops/ops_internal.h"

/* Kernel sizes, by the forward op's kind. */
enum {
	DIM_B = 0, DIM_T = 1, DIM_C = 2, DIM_NH = 3, /* embedding, attention */
	DIM_N = 0,                                   /* rows or elements */
	DIM_IN = 1, DIM_OUT = 2,                     /* matmul (and C) */
	DIM_V = 1, DIM_VP = 2,                       /* cross-entropy */
	DIM_ROWS = 3,             /* embedding: rows of (the shard of) wte */
	DIM_COUNT = 4
};

/* One op, ready to run. */
typedef struct exec_op {
	flow_op_kind_t kind;
	const flow_op_attrs_t *attrs; /* the graph op's */
	void *in[FLOW_OP_MAX_IO];  /* NULL: optional input absent */
	void *out[FLOW_OP_MAX_IO]; /* NULL: gradient not needed */
	size_t dim[DIM_COUNT];
	size_t zero_first, nzero;  /* into flow_exec.zeros */
	double flops;
	/* This op and the next run as one kernel (a residual add and its
	 * layernorm, forward or backward: flow_graph_fused_with_next). */
	bool fuse_next;
	/* Its activations are bf16: it runs the kernels' bf16 twins
	 * (exec_op_bf16). */
	bool bf16;
} exec_op_t;

/* An activation gradient cleared before the first op accumulating into
 * it. */
typedef struct exec_zero {
	void *ptr;
	size_t bytes;
} exec_zero_t;

/* Rows of the profile: one per op kind, then named phases; a phase beyond
 * the table is counted under "other" in the last row. */
#define EXEC_PHASES 16

struct flow_exec {
	const flow_graph_t *g;
	const flow_kernels_t *kernels;
	const flow_exec_storage_t *storage; /* of the tensor buffers: params,
					     * param_grads, inputs, arena,
					     * scratch */
	flow_memplan_t plan;
	void *params, *param_grads, *inputs, *arena, *scratch;
	size_t param_bytes, grad_bytes, scratch_bytes;
	void **ptr;          /* per tensor */
	exec_op_t *ops;
	exec_zero_t *zeros;
	float loss_scale;
	double step_flops;
	bool profiling;
	size_t nphases;
	flow_profile_row_t profile[FLOW_OP_KIND_COUNT + EXEC_PHASES];
	/* A localized graph's boxing plans and communicators (flow_exec_set_
	 * dist); the first failure of a collective stops the pass. */
	const flow_boxing_plan_t *boxings;
	size_t nboxings;
	flow_boxing_comms_t *comms;
	flow_diag_t diag;
	flow_err_t err;
	float *losses_host;  /* the losses, copied out of a device storage */
	flow_exec_op_hook_fn *hook; /* flow_exec_set_op_hook */
	void *hook_ctx;
	float *dist_scratch; /* split cross-entropy's row statistics, in */
	size_t dist_scratch_n;
	const flow_exec_storage_t *dist_storage; /* the comms' storage */
};

/* Whether op runs the bf16 twins of its kernels (flow/kernels.h): its
 * forward op (itself, or the one a backward op differentiates) reads or
 * writes a bf16 tensor, which only an activation can be (flow/ops.h). */
bool flow_exec_op_bf16(const flow_graph_t *g, const flow_graph_op_t *op);

/* Call the bf16 twin when bf16, else the fp32 kernel, with the same
 * arguments (the executor's void pointers fit either). */
#define TWIN(bf16, twin, fp32, ...)        \
	do {                               \
		if (bf16)                  \
			twin(__VA_ARGS__); \
		else                       \
			fp32(__VA_ARGS__); \
	} while (0)

/* Run op o of a localized graph that talks to other ranks (boxing; the
 * cross-entropy split over mesh axes), its tensors in the memory the
 * communicators move, with their kernel set (flow_boxing_comms_kernels):
 * the executor's own, or host copies of them with the CPU set.  FLOW_OK,
 * or the error with its message in x->diag. */
flow_err_t flow_exec_dist_kernel(flow_exec_t *x, const exec_op_t *o)
	FLOW_MUST_CHECK;
/* The same for any storage: in place when the communicators move the
 * executor's memory, else on host copies of the op's tensors (op is o's
 * graph op). */
flow_err_t flow_exec_dist_op(flow_exec_t *x, const exec_op_t *o,
			     const flow_graph_op_t *op) FLOW_MUST_CHECK;

#endif
