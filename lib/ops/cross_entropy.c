/* cross_entropy: fused softmax cross-entropy over the first attrs.vocab
 * columns of logits[...,Vp], one loss per row.  The forward pass also
 * writes the logits' gradient in place (dlogits, an alias of the logits),
 * so its gradient rule appends no op: it makes dlogits the logits'
 * gradient, the seed of the backward pass. */
#include <config.h>

#include "ops_internal.h"

enum { LOGITS, TARGETS };
enum { LOSSES, DLOGITS };

static flow_err_t cross_entropy_infer(const flow_graph_t *g,
				      const flow_graph_op_t *op,
				      flow_shape_t shapes_out[FLOW_OP_MAX_IO],
				      flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
				      flow_diag_t *diag)
{
	flow_err_t err;

	if ((err = flow_op_check_inputs(g, op, diag)) ||
	    (err = flow_op_check_rank(g, op, LOGITS, -1, "(...,Vp)", diag)))
		return err;
	const flow_graph_tensor_t *logits = &g->tensors[op->in[LOGITS]];
	const flow_shape_t *x = &logits->shape;
	flow_shape_t rows = *x;
	int64_t Vp = x->dims[x->ndim - 1];

	rows.dims[--rows.ndim] = 0;
	if (!flow_shape_equal(flow_op_in_shape(g, op, TARGETS), &rows))
		return flow_op_mismatch(g, op, TARGETS, LOGITS, diag, "%s",
					flow_shape_text(&rows).s);
	if (op->attrs.vocab == 0 || op->attrs.vocab > Vp)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: vocab %u is outside [1, Vp %lld]",
				     op->name, op->attrs.vocab, (long long)Vp);
	/* The gradient overwrites the logits, which must therefore be
	 * scratch of this step, not a parameter or a fed input. */
	if (logits->role != FLOW_ROLE_ACTIVATION)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: logits '%s' must be an op's output, "
				     "not a %s: the loss gradient overwrites "
				     "them in place",
				     op->name, logits->name,
				     flow_role_name(logits->role));
	shapes_out[LOSSES] = (flow_shape_t){
		.ndim = 1, .dims = { (int64_t)flow_shape_rows(x) } };
	shapes_out[DLOGITS] = *x;
	dtypes_out[LOSSES] = dtypes_out[DLOGITS] = FLOW_DTYPE_F32;
	return FLOW_OK;
}

/* Only the loss op seeds the backward pass; a cross-entropy that is not
 * the loss (an evaluation head) sends no gradient. */
static flow_err_t cross_entropy_backward(flow_graph_t *g, int op,
					 flow_diag_t *diag)
{
	const flow_graph_op_t *f = &g->ops[op];
	flow_graph_tensor_t *logits = &g->tensors[f->in[LOGITS]];

	if (f->out[LOSSES] == g->loss && logits->requires_grad)
		logits->grad = f->out[DLOGITS];
	return FLOW_OK;
}

/* Rough arithmetic per real-vocabulary logit, for profiles: max, exp,
 * sum, normalise, gradient. */
static double cross_entropy_flops(const flow_graph_t *g,
				  const flow_graph_op_t *op)
{
	const flow_shape_t *x = flow_op_in_shape(g, op, LOGITS);

	return 5.0 * (double)flow_shape_rows(x) * op->attrs.vocab;
}

const flow_op_info_t flow_op_cross_entropy_info = {
	.def = {
		.kind = FLOW_OP_CROSS_ENTROPY,
		.name = "cross_entropy",
		.nin = 2,
		.nout = 2,
		.in_names = { "logits", "targets" },
		.out_names = { "losses", "dlogits" },
		.backward_kind = FLOW_OP_CROSS_ENTROPY,
		.infer = cross_entropy_infer,
		.backward = cross_entropy_backward,
		.flops = cross_entropy_flops,
		.scratch = flow_op_no_scratch,
	},
	.i32_in = 1u << TARGETS,
	.inplace_grad_out = 1u << DLOGITS,
};
