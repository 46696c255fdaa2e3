/* matmul: out[...,O] = x[...,I] . weight[O,I]^T + bias[O], weight in
 * nn.Linear's layout; bias is optional.  Its backward writes dx, dweight
 * and dbias (each only when required). */
#include <config.h>

#include "ops_internal.h"

enum { X, WEIGHT, BIAS };

static flow_err_t matmul_infer(const flow_graph_t *g, const flow_graph_op_t *op,
			       flow_shape_t shapes_out[FLOW_OP_MAX_IO],
			       flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
			       flow_diag_t *diag)
{
	flow_err_t err;

	if ((err = flow_op_check_inputs(g, op, diag)) ||
	    (err = flow_op_check_rank(g, op, X, -1, "(...,I)", diag)) ||
	    (err = flow_op_check_rank(g, op, WEIGHT, 2, "(O,I)", diag)))
		return err;
	const flow_shape_t *x = flow_op_in_shape(g, op, X);
	const flow_shape_t *w = flow_op_in_shape(g, op, WEIGHT);
	int64_t in_dim = x->dims[x->ndim - 1], out_dim = w->dims[0];

	if (w->dims[1] != in_dim)
		return flow_op_mismatch(g, op, WEIGHT, X, diag, "(O,%lld)",
					(long long)in_dim);
	if (op->in[BIAS] >= 0) {
		if ((err = flow_op_check_rank(g, op, BIAS, 1, "(O)", diag)))
			return err;
		if (flow_op_in_shape(g, op, BIAS)->dims[0] != out_dim)
			return flow_op_mismatch(g, op, BIAS, WEIGHT, diag,
						"(%lld)", (long long)out_dim);
	}
	shapes_out[0] = *x;
	shapes_out[0].dims[x->ndim - 1] = out_dim;
	dtypes_out[0] = FLOW_DTYPE_F32;
	return FLOW_OK;
}

/* Multiply-adds of one x . weight^T product: rows * I * O. */
static double matmul_macs(const flow_graph_t *g, const flow_graph_op_t *fwd)
{
	const flow_shape_t *x = flow_op_in_shape(g, fwd, X);
	const flow_shape_t *w = flow_op_in_shape(g, fwd, WEIGHT);

	return flow_shape_elems(x) * (double)w->dims[0];
}

static double matmul_flops(const flow_graph_t *g, const flow_graph_op_t *op)
{
	return 2.0 * matmul_macs(g, op);
}

/* dx and dweight are one product each; dbias a sum over the rows. */
static double matmul_backward_flops(const flow_graph_t *g,
				    const flow_graph_op_t *op)
{
	const flow_graph_op_t *f = flow_op_forward_of(g, op);
	double macs = matmul_macs(g, f);
	double flops = 0.0;

	if (op->out[0] >= 0)
		flops += 2.0 * macs;
	if (op->out[1] >= 0)
		flops += 2.0 * macs;
	if (op->out[2] >= 0)
		flops += flow_shape_elems(&g->tensors[f->out[0]].shape);
	return flops;
}

const flow_op_info_t flow_op_matmul_info = {
	.def = {
		.kind = FLOW_OP_MATMUL,
		.name = "matmul",
		.nin = 3,
		.nout = 1,
		.in_names = { "x", "weight", "bias" },
		.out_names = { "out" },
		.optional_in = 1u << BIAS,
		.backward_kind = FLOW_OP_MATMUL_BACKWARD,
		.infer = matmul_infer,
		.backward = flow_op_backward_rule,
		.flops = matmul_flops,
		.scratch = flow_op_no_scratch,
	},
	.nsaved = 2,
	.saved = { FLOW_OP_FWD_IN(X), FLOW_OP_FWD_IN(WEIGHT) },
};

const flow_op_info_t flow_op_matmul_backward_info = {
	.def = {
		.kind = FLOW_OP_MATMUL_BACKWARD,
		.name = "matmul_backward",
		.nin = 3,
		.nout = 3,
		.in_names = { "dout", "x", "weight" },
		.out_names = { "dx", "dweight", "dbias" },
		.accumulates = 7,
		.backward_kind = FLOW_OP_MATMUL_BACKWARD,
		.infer = flow_op_backward_infer,
		.flops = matmul_backward_flops,
		.scratch = flow_op_no_scratch,
	},
};
