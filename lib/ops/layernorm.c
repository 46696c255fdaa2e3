/* layernorm over the last dimension: out = (x - mean) * rstd * weight +
 * bias, saving mean and rstd (one per row) for the backward op, which
 * writes dx, dweight and dbias. */
#include <config.h>

#include "ops_internal.h"

enum { X, WEIGHT, BIAS };
enum { OUT, MEAN, RSTD };

static flow_err_t layernorm_infer(const flow_graph_t *g,
				  const flow_graph_op_t *op,
				  flow_shape_t shapes_out[FLOW_OP_MAX_IO],
				  flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
				  flow_diag_t *diag)
{
	flow_err_t err;

	if ((err = flow_op_check_inputs(g, op, diag)) ||
	    (err = flow_op_check_rank(g, op, X, -1, "(...,C)", diag)) ||
	    (err = flow_op_check_rank(g, op, WEIGHT, 1, "(C)", diag)) ||
	    (err = flow_op_check_rank(g, op, BIAS, 1, "(C)", diag)))
		return err;
	const flow_shape_t *x = flow_op_in_shape(g, op, X);
	int64_t C = x->dims[x->ndim - 1];

	if (flow_op_in_shape(g, op, WEIGHT)->dims[0] != C)
		return flow_op_mismatch(g, op, WEIGHT, X, diag, "(%lld)",
					(long long)C);
	if (flow_op_in_shape(g, op, BIAS)->dims[0] != C)
		return flow_op_mismatch(g, op, BIAS, X, diag, "(%lld)",
					(long long)C);
	shapes_out[OUT] = *x;
	shapes_out[MEAN] = (flow_shape_t){
		.ndim = 1, .dims = { (int64_t)flow_shape_rows(x) } };
	shapes_out[RSTD] = shapes_out[MEAN];
	dtypes_out[OUT] = dtypes_out[MEAN] = dtypes_out[RSTD] = FLOW_DTYPE_F32;
	return FLOW_OK;
}

/* Rough arithmetic per element, for profiles: forward 8 (mean, variance,
 * normalise, scale and shift); backward 16 (xhat, the two row sums, dx, and
 * the dweight and dbias sums). */
static double layernorm_flops(const flow_graph_t *g, const flow_graph_op_t *op)
{
	return 8.0 * flow_shape_elems(flow_op_in_shape(g, op, X));
}

static double layernorm_backward_flops(const flow_graph_t *g,
				       const flow_graph_op_t *op)
{
	return 16.0 * flow_shape_elems(flow_op_in_shape(g, op, 0));
}

const flow_op_info_t flow_op_layernorm_info = {
	.def = {
		.kind = FLOW_OP_LAYERNORM,
		.name = "layernorm",
		.nin = 3,
		.nout = 3,
		.in_names = { "x", "weight", "bias" },
		.out_names = { "out", "mean", "rstd" },
		.backward_kind = FLOW_OP_LAYERNORM_BACKWARD,
		.infer = layernorm_infer,
		.backward = flow_op_backward_rule,
		.flops = layernorm_flops,
		.scratch = flow_op_no_scratch,
	},
	.saved_out = 1u << MEAN | 1u << RSTD,
	.nsaved = 4,
	.saved = { FLOW_OP_FWD_IN(X), FLOW_OP_FWD_IN(WEIGHT),
		   FLOW_OP_FWD_OUT(MEAN), FLOW_OP_FWD_OUT(RSTD) },
};

const flow_op_info_t flow_op_layernorm_backward_info = {
	.def = {
		.kind = FLOW_OP_LAYERNORM_BACKWARD,
		.name = "layernorm_backward",
		.nin = 5,
		.nout = 3,
		.in_names = { "dout", "x", "weight", "mean", "rstd" },
		.out_names = { "dx", "dweight", "dbias" },
		.accumulates = 7,
		.backward_kind = FLOW_OP_LAYERNORM_BACKWARD,
		.infer = flow_op_backward_infer,
		.flops = layernorm_backward_flops,
		.scratch = flow_op_no_scratch,
	},
};
