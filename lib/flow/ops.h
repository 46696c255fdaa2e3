/* Op definitions: what each op of the graph IR means, apart from any kernel.
 *
 * An op definition gives its input and output names, the shape rule (checks
 * the inputs, derives the outputs), the gradient rule (appends the backward
 * ops to a graph), the FLOPs of one call and the scratch it needs.  The
 * planner, the checkpoint tools and the executor all read these; only the
 * executor (flow/exec.h) maps them to kernels.  One file per op under
 * lib/ops/ defines an op and its backward.
 *
 * Backward ops read what their forward op saved and ACCUMULATE into every
 * gradient output (flow/graph.h, "Gradient semantics").
 *
 * Mixed precision.  The tensors marked "act" below are stored in the
 * graph's act_dtype (flow/graph.h): f32, or bf16 for mixed precision.
 * They are what GEMMs read and write: the layernorm's, matmul's, GELU's
 * and attention's outputs, the logits, and (a gradient has its tensor's
 * dtype) their gradients.  The residual stream (the embedding's and add's
 * outputs) and its gradient, the statistics saved for backward, the
 * losses, parameters and their gradients are always f32: sums that many
 * small terms reach, kept as PyTorch's autocast keeps them.
 *
 * The ops (tensors are f32 unless marked i32 or act; N = product of all
 * but the last dimension):
 *   embedding   in (tokens i32[B,T], wte[Vp,C], wpe[Tmax,C]), T <= Tmax
 *               out (out[B,T,C])
 *   layernorm   in (x[...,C], weight[C], bias[C])
 *               out (out act[...,C], mean[N] saved, rstd[N] saved)
 *   matmul      in (x act[...,I], weight[O,I], bias[O] optional)
 *               out (out act[...,O])
 *   attention   in (qkv act[B,T,3C]), attrs.heads divides C
 *               out (out act[B,T,C], lse[B,NH,T] saved)
 *   gelu        in (x act) out (out act)
 *   add         in (a, b act) same shape, out (out): a and out the
 *               residual stream, b the branch
 *   cross_entropy  in (logits act[...,Vp], targets i32[...]), attrs.vocab
 *               = V <= Vp; out (losses[N], dlogits act[...,Vp] role GRAD,
 *               alias of logits).  Fused: the forward pass also writes the logits'
 *               gradient in place (scaled by the executor's loss scale), so
 *               the loss is the root of the backward pass and the logits
 *               are never held twice.  Its gradient rule appends no op: it
 *               makes dlogits the logits' gradient.
 *   *_backward  in: (dout, then what the forward saved), out: the input
 *               gradients in input order (absent when not required):
 *     embedding_backward  in (dout, tokens)          out (dwte, dwpe)
 *     layernorm_backward  in (dout, x, weight, mean, rstd)
 *                         out (dx, dweight, dbias)
 *     matmul_backward     in (dout, x, weight)       out (dx, dweight, dbias)
 *     attention_backward  in (dout, qkv, lse, out)   out (dqkv)
 *     gelu_backward       in (dout, x)               out (dx)
 *     add_backward        in (dout)                  out (da, db)
 */
#ifndef FLOW_OPS_H
#define FLOW_OPS_H

#include <flow/graph.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flow_op_def {
	flow_op_kind_t kind;
	const char *name;            /* "matmul", "matmul_backward" */
	int nin;                     /* inputs, optional ones included */
	int nout;
	const char *in_names[FLOW_OP_MAX_IO];   /* "x", "weight", "bias" */
	const char *out_names[FLOW_OP_MAX_IO];  /* "out", "mean", "rstd" */
	uint32_t optional_in;        /* bit i: input i may be -1 */
	uint32_t accumulates;        /* bit i: output i is added to */
	flow_op_kind_t backward_kind; /* forward ops: the kind of their
				       * backward op (cross_entropy: itself) */
	/* Check the inputs of op (in g) and write the outputs' shapes and
	 * dtypes; FLOW_ERR_USAGE with a message naming op->name. */
	flow_err_t (*infer)(const flow_graph_t *g, const flow_graph_op_t *op,
			    flow_shape_t shapes_out[FLOW_OP_MAX_IO],
			    flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
			    flow_diag_t *diag);
	/* Forward ops: append the backward op(s) of g->ops[op] to g, reading
	 * and creating gradients with flow_graph_grad_for() (flow/graph.h); NULL for
	 * backward ops. */
	flow_err_t (*backward)(flow_graph_t *g, int op, flow_diag_t *diag);
	/* FLOPs of one call (multiply-add = 2), for profiles and MFU. */
	double (*flops)(const flow_graph_t *g, const flow_graph_op_t *op);
	/* Bytes of scratch one call needs (0 for most ops). */
	size_t (*scratch)(const flow_graph_t *g, const flow_graph_op_t *op);
} flow_op_def_t;

/* The definition of kind; NULL for an unknown kind and for a
 * signature-only kind (flow/graph.h), which has no definition here. */
FLOW_EXPORT const flow_op_def_t *flow_op_def(flow_op_kind_t kind);
/* "matmul" -> FLOW_OP_MATMUL; FLOW_ERR_USAGE for an unknown name,
 * signature-only ops' ("reshape") included. */
FLOW_EXPORT flow_err_t flow_op_kind_parse(const char *name,
					  flow_op_kind_t *kind_out,
					  flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
