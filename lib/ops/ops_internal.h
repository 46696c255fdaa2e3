/* Private to the op definitions (lib/ops/) and the graph code that drives
 * them (lib/graph/graph.c and autograd.c, lib/runtime/exec.c): what the
 * graph needs to know about an op beyond the public flow_op_def_t, the
 * checks every shape rule starts with, the one gradient rule shared by
 * every op whose backward is a single backward op, and what the SBP
 * signature rules share.  The graph's own internals are in
 * lib/graph/graph_internal.h. */
#ifndef FLOW_OPS_INTERNAL_H
#define FLOW_OPS_INTERNAL_H

#include <flow/ops.h>
#include <flow/signature.h>

/* A backward op reads dout and then tensors of its forward op, named by
 * these references into the forward op's inputs and outputs. */
#define FLOW_OP_FWD_IN(i) (i)
#define FLOW_OP_FWD_OUT(i) (FLOW_OP_MAX_IO + (i))

struct flow_sig_op;

/* One op's registry entry: the public definition, its SBP signatures, and
 * how the graph wires its tensors.  The fields after sig matter for
 * forward graph ops only.  A signature-only op (a kind from
 * FLOW_OP_KIND_COUNT on) fills def.kind, def.name and sig alone: no graph
 * holds it, so it has no shape or gradient rule. */
typedef struct flow_op_info {
	flow_op_def_t def;
	const struct flow_sig_op *sig; /* NULL: no signatures (boxing, whose
					* layouts the localizer chooses) */
	uint32_t i32_in;      /* bit i: input i holds token ids (i32) */
	uint32_t act_in;      /* bit i: input i is an activation in the
			       * graph's act_dtype (f32 or bf16); every
			       * other input is f32 */
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

/* Defined at the end of each op's file, registered in lib/ops/registry.c:
 * the graph ops, ... */
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
extern const flow_op_info_t flow_op_boxing_info;
/* ... and the signature-only ops. */
extern const flow_op_info_t flow_op_layernorm_param_grad_info;
extern const flow_op_info_t flow_op_reshape_info;
extern const flow_op_info_t flow_op_transpose_info;
extern const flow_op_info_t flow_op_reduce_sum_info;
extern const flow_op_info_t flow_op_reduce_mean_info;
extern const flow_op_info_t flow_op_bias_add_info;
extern const flow_op_info_t flow_op_broadcast_add_info;

/* The entry of a graph op kind, [0, FLOW_OP_KIND_COUNT); NULL for any
 * other kind, the signature-only ones included, so the graph code sees
 * graph ops only. */
const flow_op_info_t *flow_op_info(flow_op_kind_t kind);

/* The entry named name among the kinds [0, kind_end): FLOW_OP_KIND_COUNT
 * for the graph ops, FLOW_OP_ALL_KIND_COUNT for every op; NULL when none
 * is named so (or name is NULL). */
const flow_op_info_t *flow_op_info_find(const char *name, int kind_end);

/* Whether kind is one of the *_BACKWARD kinds. */
bool flow_op_kind_is_backward(flow_op_kind_t kind);
/* Whether an op of kind may sit in either pass (boxing). */
bool flow_op_kind_is_neutral(flow_op_kind_t kind);

/* ---- for shape rules ---------------------------------------------------- */

/* A shape's text, "(4,64,768)", by value so it can be a printf argument. */
typedef struct flow_shape_text {
	char s[FLOW_MAX_DIMS * 21 + 3];
} flow_shape_text_t;
flow_shape_text_t flow_shape_text(const flow_shape_t *shape);

/* The first check of every forward shape rule: each input index is a
 * tensor of g, or -1 where the input is optional, and has the dtype the
 * op reads (i32_in, act_in). */
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

/* The shape rule of every backward op: dout has the shape and dtype of
 * the forward op's first output, each gradient the shape and dtype of its
 * forward input. */
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

/* ---- SBP signatures (flow/signature.h) ---------------------------------- */

/* Where an op's rule writes its 1-D signatures: flow_sig_push() appends
 * one.  Room for FLOW_SIG_MAX - 1, the last slot being the all-broadcast
 * signature flow_sig_list() appends; a rule that writes more sets overflow
 * (its extra signatures go to sink), which flow_sig_list() reports.  op
 * is the definition whose rule runs, for rules that name its tensors. */
typedef struct flow_sig_builder {
	const flow_sig_query_t *query;
	const struct flow_sig_op *op;
	flow_sig_t *sigs;
	int n;
	bool overflow;
	flow_sig_t sink;
} flow_sig_builder_t;

/* The signatures of one op, defined in the op's file (lib/ops/<op>.c) and
 * reached through its registry entry (flow_op_info_t.sig), whose def.name
 * is the name flow_sig_query_t.op gives.  Before calling rule,
 * flow_sig_list() has checked the counts (nin_min <= query->nin <= nin,
 * the same for outputs), that every input below query->nin that is not in
 * optional_in is present, and that every shape has 0..FLOW_MAX_DIMS
 * non-negative dimensions.  The rule checks the shapes and attributes
 * (FLOW_ERR_USAGE with one line naming the op and the tensor, through
 * flow_sig_bad() and friends) and pushes its signatures, without the
 * all-broadcast one; flow_sig_list() drops duplicates, sets absent
 * inputs to B and appends all-broadcast. */
typedef struct flow_sig_op {
	int nin, nout;             /* the most inputs and outputs */
	int nin_min, nout_min;     /* the fewest: a trailing optional input
				    * may be left out (matmul's bias), and
				    * trailing by-products not asked for
				    * (layernorm's mean and rstd) */
	uint32_t optional_in;      /* bit i: input i may be absent */
	const char *in_names[FLOW_SIG_MAX_IO];
	const char *out_names[FLOW_SIG_MAX_IO];
	flow_err_t (*rule)(const flow_sig_query_t *q, flow_sig_builder_t *b,
			   flow_diag_t *diag);
} flow_sig_op_t;

/* SBP values for the rules. */
#define FLOW_SIG_S(k) ((flow_sbp_t){ .kind = FLOW_SBP_SPLIT, .axis = (k) })
#define FLOW_SIG_B ((flow_sbp_t){ .kind = FLOW_SBP_BROADCAST, .axis = 0 })
#define FLOW_SIG_P ((flow_sbp_t){ .kind = FLOW_SBP_PARTIAL, .axis = 0 })

/* Append a signature named name (a string literal) with every input and
 * output B and no gather bytes; the rule then sets what differs.  Never
 * NULL. */
flow_sig_t *flow_sig_push(flow_sig_builder_t *b, const char *name);

/* "<op>: <fmt...>" as FLOW_ERR_USAGE. */
flow_err_t flow_sig_bad(const flow_sig_query_t *q, flow_diag_t *diag,
			const char *fmt, ...) FLOW_PRINTF(3, 4);
/* Tensor `name` of shape s must have ndim dimensions (ndim < 0: at least
 * one): "<op>: <name> <shape> must be <form>" otherwise. */
flow_err_t flow_sig_check_rank(const flow_sig_query_t *q, const char *name,
			       const flow_shape_t *s, int ndim,
			       const char *form, flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* "<op>: <bad> <shape> does not match <ref> <shape>: expected <expect>",
 * as FLOW_ERR_USAGE (the graph's shape-rule wording). */
flow_err_t flow_sig_mismatch(const flow_sig_query_t *q, flow_diag_t *diag,
			     const char *bad, const flow_shape_t *bad_shape,
			     const char *ref, const flow_shape_t *ref_shape,
			     const char *expect_fmt, ...) FLOW_PRINTF(7, 8);
/* Element count of s; false when it does not fit an int64_t. */
bool flow_sig_numel(const flow_shape_t *s, int64_t *numel_out);

/* OneFlow's reshape rule (lib/ops/reshape.c): for x reshaped to y (equal
 * element counts), map_out[i] is the axis of y that S(i) of x becomes, or
 * -1 when splitting axis i of x gives no split of y.  Size-1 axes are
 * dropped; walking both shapes from the last axis with running products,
 * each point where the products agree closes a group, and the group's
 * first (outermost) axes map onto each other when their extents are equal,
 * or when axis_size > 0 divides both (the balanced parts then hold the
 * same elements).  axis_size 0 (unknown) allows equal extents only. */
void flow_sig_reshape_map(const flow_shape_t *x, const flow_shape_t *y,
			  int64_t axis_size, int map_out[FLOW_MAX_DIMS]);

/* The signatures of a backward op from those of its forward op
 * (fwd_query, answered by fwd_info->sig), wired as flow_op_backward_rule
 * wires the backward op of fwd_info (in: dout, then the saved tensors;
 * out: the gradients of inputs grad_in_first... in order), by the adjoint
 * of each forward signature but all-broadcast: dout takes out[0]'s SBP
 * with P turned into B; a saved tensor keeps its SBP; an input's gradient
 * keeps S(k), and turns B into P (the forward work was divided, so every
 * rank holds a part of the sum) and P into B (every addend receives the
 * whole gradient).  Pushes onto b, whose query is the backward one. */
flow_err_t flow_sig_adjoint(const flow_sig_query_t *fwd_query,
			    const flow_op_info_t *fwd_info,
			    flow_sig_builder_t *b, flow_diag_t *diag)
	FLOW_MUST_CHECK;

#endif
