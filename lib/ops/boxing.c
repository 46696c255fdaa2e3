/* boxing: the same logical tensor in another layout, out = box(x).  The
 * localizer (flow/localize.h) inserts one wherever an op reads a tensor in
 * a layout other than the one its producer wrote, in either pass; the
 * executor runs its plan (flow/boxing.h) through the communicators.  Its
 * output shape is the rank's local shape of the target layout, which the
 * input alone does not determine, so the rule takes the output as the
 * localizer made it and checks only that it exists with x's dtype. */
#include <config.h>

#include "ops_internal.h"

static flow_err_t boxing_infer(const flow_graph_t *g, const flow_graph_op_t *op,
			       flow_shape_t shapes_out[FLOW_OP_MAX_IO],
			       flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
			       flow_diag_t *diag)
{
	int x = op->in[0], out = op->out[0];

	if (x < 0 || (size_t)x >= g->ntensors || out < 0 ||
	    (size_t)out >= g->ntensors)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: boxing needs an input and an "
				     "existing output",
				     op->name);
	shapes_out[0] = g->tensors[out].shape;
	dtypes_out[0] = g->tensors[x].dtype;
	return FLOW_OK;
}

static double boxing_flops(const flow_graph_t *g, const flow_graph_op_t *op)
{
	(void)g;
	(void)op;
	return 0.0; /* sums of partial values are not model FLOPs */
}

const flow_op_info_t flow_op_boxing_info = {
	.def = {
		.kind = FLOW_OP_BOXING,
		.name = "boxing",
		.nin = 1,
		.nout = 1,
		.in_names = { "x" },
		.out_names = { "out" },
		.backward_kind = FLOW_OP_BOXING,
		.infer = boxing_infer,
		.flops = boxing_flops,
		.scratch = flow_op_no_scratch,
	},
};
