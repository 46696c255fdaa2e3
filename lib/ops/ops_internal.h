/* Private to the op definitions (lib/ops/) and the graph code that drives
 * them (lib/graph.c, lib/autograd.c, lib/memplan.c, lib/exec.c): what the
 * graph needs to know about an op beyond the public flow_op_def_t, the
 * checks every shape rule starts with, and the one gradient rule shared by
 * every op whose backward is a single backward op. */
#ifndef FLOW_OPS_INTERNAL_H
#define FLOW_OPS_INTERNAL_H

#include <flow/mem.h>
#include <flow/ops.h>

/* A backward op reads dout and then tensors of its forward op, named by
 * these references into the forward op's inputs and outputs. */
#define FLOW_OP_FWD_IN(i) (i)
#define FLOW_OP_FWD_OUT(i) (FLOW_OP_MAX_IO + (i))

/* One op: the public definition plus how the graph wires its tensors.  The
 * fields after def matter for forward ops only. */
typedef struct flow_op_info {
	flow_op_def_t def;
	uint32_t i32_in;      /* bit i: input i holds token ids (i32);
			       * every other input is f32 */
	uint32_t saved_out;   /* bit i: output i is a forward by-product
			       * kept for backward (role SAVED) */
	uint32_t inplace_grad_out; /* bit i: output i is input 0's gradient,
				    * written in place over it (role GRAD,
				    * alias of input 0: cross-entropy) */
	/* The generic gradient rule (flow_op_backward_rule): the backward op
	 * reads (dout, saved[0..nsaved)) and writes the gradients of inputs
	 * grad_in_first..nin-1, in order. */
	int grad_in_first;
	int nsaved;
	int saved[FLOW_OP_MAX_IO - 1]; /* FLOW_OP_FWD_IN/OUT references */
} flow_op_info_t;

/* One per op file, registered in lib/ops/registry.c. */
extern const flow_op_info_t flow_op_embedding_info;
extern const flow_op_info_t flow_op_embedding_backward_info;
extern const flow_op_info_t flow_op_layernorm_info;
extern const flow_op_info_t flow_op_layernorm_backward_info;
extern const flow_op_info_t flow_op_matmul_info;
extern const flow_op_info_t flow_op_matmul_backward_info;
extern const flow_op_info_t flow_op_attention_info;
extern const flow_op_info_t flow_op_attention_backward_info;
extern const flow_op_info_t flow_op_gelu_info;
extern const flow_op_info_t flow_op_gelu_backward_info;
extern const flow_op_info_t flow_op_add_info;
extern const flow_op_info_t flow_op_add_backward_info;
extern const flow_op_info_t flow_op_cross_entropy_info;

/* The info of kind; NULL for an unknown kind. */
const flow_op_info_t *flow_op_info(flow_op_kind_t kind);

/* Whether kind is one of the *_BACKWARD kinds. */
bool flow_op_kind_is_backward(flow_op_kind_t kind);

/* ---- for shape rules ---------------------------------------------------- */

/* A shape's text, "(4,64,768)", by value so it can be a printf argument. */
typedef struct flow_shape_text {
	char s[FLOW_MAX_DIMS * 21 + 3];
} flow_shape_text_t;
flow_shape_text_t flow_shape_text(const flow_shape_t *shape);

/* The first check of every forward shape rule: each input index is a
 * tensor of g, or -1 where the input is optional, and has the dtype the
 * op reads (i32_in). */
flow_err_t flow_op_check_inputs(const flow_graph_t *g,
				const flow_graph_op_t *op, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Shape of input i of op (which must be present). */
const flow_shape_t *flow_op_in_shape(const flow_graph_t *g,
				     const flow_graph_op_t *op, int i);

/* Input i must have ndim dimensions (ndim < 0: at least one);
 * "<op>: <input> <shape> must be <form>" otherwise. */
flow_err_t flow_op_check_rank(const flow_graph_t *g, const flow_graph_op_t *op,
			      int i, int ndim, const char *form,
			      flow_diag_t *diag) FLOW_MUST_CHECK;

/* "<op>: <input bad> <shape> does not match <input ref> <shape>: expected
 * <expect>", as FLOW_ERR_USAGE. */
flow_err_t flow_op_mismatch(const flow_graph_t *g, const flow_graph_op_t *op,
			    int bad, int ref, flow_diag_t *diag,
			    const char *expect_fmt, ...) FLOW_PRINTF(6, 7);

/* Product of all dimensions but the last (the rows of a [...,C] tensor). */
size_t flow_shape_rows(const flow_shape_t *shape);
/* The last dimension; 1 for a scalar. */
size_t flow_shape_last(const flow_shape_t *shape);
/* Element count as a double, for FLOP counts. */
double flow_shape_elems(const flow_shape_t *shape);

/* The scratch function of every op that needs none. */
size_t flow_op_no_scratch(const flow_graph_t *g, const flow_graph_op_t *op);

/* ---- for gradient rules -------------------------------------------------- */

/* The rule of every op but cross-entropy: when the op's first output has a
 * gradient, append one backward op reading (dout, saved...) and writing the
 * gradients of the inputs that require one (see flow_op_info_t). */
flow_err_t flow_op_backward_rule(flow_graph_t *g, int op, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* The shape rule of every backward op: dout has the shape of the forward
 * op's first output, each gradient the shape of its forward input. */
flow_err_t flow_op_backward_infer(const flow_graph_t *g,
				  const flow_graph_op_t *op,
				  flow_shape_t shapes_out[FLOW_OP_MAX_IO],
				  flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
				  flow_diag_t *diag) FLOW_MUST_CHECK;

/* The forward op a backward op differentiates (op->forward). */
static inline const flow_graph_op_t *flow_op_forward_of(const flow_graph_t *g,
							const flow_graph_op_t *op)
{
	return &g->ops[op->forward];
}

/* ---- graph internals shared by graph.c, autograd.c and memplan.c -------- */

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
