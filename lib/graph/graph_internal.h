/* Private to the graph IR (lib/graph/graph.c, autograd.c, memplan.c) and
 * the code that builds or lays out graphs from their parts (the localizer,
 * lib/plan/localize.c; the executor, lib/runtime/exec.c): appending
 * tensors and ops without the public shape checks, reserving room ahead,
 * every live range at once, and the alignment of tensor storage. */
#ifndef FLOW_GRAPH_INTERNAL_H
#define FLOW_GRAPH_INTERNAL_H

#include <flow/graph.h>
#include <flow/mem.h>

/* Append op as given (kind, name, attrs, forward op, tensor indices of
 * g), for rewrites that build a graph op by op (lib/plan/localize.c): checks
 * the indices and counts only, flow_graph_validate the rest.  Marks each
 * output's producer when it has none.  Returns the index or <0. */
int flow_graph_append_op(flow_graph_t *g, const flow_graph_op_t *op,
			 flow_diag_t *diag);

/* Append a tensor with every field set from the arguments (producer,
 * grad, grad_of, alias_of -1; requires_grad false; no init): returns its
 * index or <0 with diag set.  The name must fit and be unique. */
int flow_graph_push_tensor(flow_graph_t *g, const char *name,
			   flow_role_t role, flow_dtype_t dtype,
			   const flow_shape_t *shape, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Make room for `more` tensors and ops without reallocating, so the
 * gradient rules cannot fail half-way for lack of memory. */
flow_err_t flow_graph_reserve(flow_graph_t *g, size_t more_tensors,
			      size_t more_ops, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Live ranges of every tensor at once (flow_graph_live_range, one pass):
 * first[t], last[t] for t < g->ntensors. */
void flow_graph_live_ranges(const flow_graph_t *g, int *first, int *last);

/* Are ops i and i + 1 a pair the executor runs as one kernel: a residual
 * add and the layernorm of its output, forward (ADD, then the LAYERNORM
 * of its output) or backward (LAYERNORM_BACKWARD, then the ADD_BACKWARD
 * of the gradient it adds into), or a matmul and the GELU of its output
 * (flow/kernels.h, residual_layernorm_forward, layernorm_residual_backward
 * and matmul_gelu_forward)?  The live ranges, and so the memory plan,
 * treat such a pair as one op. */
bool flow_graph_fused_with_next(const flow_graph_t *g, size_t i);

/* Whether flow_graph_backward(_from) has run: backward ops exist or some
 * tensor has its gradient. */
bool flow_graph_is_differentiated(const flow_graph_t *g);

/* Round bytes up to a multiple of FLOW_ALIGNMENT.  Tensor sizes are checked
 * against FLOW_GRAPH_BYTES_MAX when added, so this cannot overflow. */
#define FLOW_GRAPH_BYTES_MAX (SIZE_MAX / 2)
static inline size_t flow_graph_align(size_t bytes)
{
	return (bytes + FLOW_ALIGNMENT - 1) & ~(size_t)(FLOW_ALIGNMENT - 1);
}

#endif
