/* gelu, tanh approximation: out = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715
 * x^3))), elementwise on any shape.  Its backward writes dx from x. */
#include <config.h>

#include "ops_internal.h"

static flow_err_t gelu_infer(const flow_graph_t *g, const flow_graph_op_t *op,
			     flow_shape_t shapes_out[FLOW_OP_MAX_IO],
			     flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
			     flow_diag_t *diag)
{
	flow_err_t err = flow_op_check_inputs(g, op, diag);

	if (err != FLOW_OK)
		return err;
	shapes_out[0] = *flow_op_in_shape(g, op, 0);
	dtypes_out[0] = g->act_dtype;
	return FLOW_OK;
}

/* Rough arithmetic per element, for profiles, tanh counted as one: forward
 * 9, backward 16 (the forward's terms again and the derivative's). */
static double gelu_flops(const flow_graph_t *g, const flow_graph_op_t *op)
{
	return 9.0 * flow_shape_elems(flow_op_in_shape(g, op, 0));
}

static double gelu_backward_flops(const flow_graph_t *g,
				  const flow_graph_op_t *op)
{
	return 16.0 * flow_shape_elems(flow_op_in_shape(g, op, 0));
}

/* ---- SBP signatures ---------------------------------------------------------
 *
 * Per mesh axis, elementwise: split  x S(k) -> out S(k), any axis k.  No
 * P form: gelu is not linear. */

static flow_err_t gelu_sig_rule(const flow_sig_query_t *q,
				flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_shape_t *x = &q->in[0];

	if (!flow_shape_equal(&q->out[0], x))
		return flow_sig_mismatch(q, diag, "out", &q->out[0], "x", x,
					 "%s", flow_shape_text(x).s);
	for (int k = 0; k < x->ndim; k++) {
		flow_sig_t *s = flow_sig_push(b, "split");

		s->in[0] = s->out[0] = FLOW_SIG_S(k);
	}
	return FLOW_OK;
}

static const flow_sig_op_t gelu_sig = {
	.nin = 1,
	.nin_min = 1,
	.nout = 1,
	.nout_min = 1,
	.in_names = { "x" },
	.out_names = { "out" },
	.rule = gelu_sig_rule,
};

/* The backward op's, by the adjoint (flow_sig_adjoint): dout, x and dx
 * split alike. */
static flow_err_t gelu_backward_sig_rule(const flow_sig_query_t *q,
					 flow_sig_builder_t *b,
					 flow_diag_t *diag)
{
	flow_sig_query_t f = { .op = "gelu", .nin = 1, .nout = 1,
			       .attrs = q->attrs,
			       .axis_size = q->axis_size };

	f.in[0] = q->in[1];
	f.in_present[0] = true;
	f.out[0] = q->in[0];
	return flow_sig_adjoint(&f, &flow_op_gelu_info, b, diag);
}

static const flow_sig_op_t gelu_backward_sig = {
	.nin = 2,
	.nin_min = 2,
	.nout = 1,
	.nout_min = 1,
	.in_names = { "dout", "x" },
	.out_names = { "dx" },
	.rule = gelu_backward_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_gelu_info = {
	.def = {
		.kind = FLOW_OP_GELU,
		.name = "gelu",
		.nin = 1,
		.nout = 1,
		.in_names = { "x" },
		.out_names = { "out" },
		.backward_kind = FLOW_OP_GELU_BACKWARD,
		.infer = gelu_infer,
		.backward = flow_op_backward_rule,
		.flops = gelu_flops,
		.scratch = flow_op_no_scratch,
	},
	.sig = &gelu_sig,
	.act_in = 1u << 0,
	.nsaved = 1,
	.saved = { FLOW_OP_FWD_IN(0) },
};

const flow_op_info_t flow_op_gelu_backward_info = {
	.def = {
		.kind = FLOW_OP_GELU_BACKWARD,
		.name = "gelu_backward",
		.nin = 2,
		.nout = 1,
		.in_names = { "dout", "x" },
		.out_names = { "dx" },
		.accumulates = 1,
		.backward_kind = FLOW_OP_GELU_BACKWARD,
		.infer = flow_op_backward_infer,
		.flops = gelu_backward_flops,
		.scratch = flow_op_no_scratch,
	},
	.sig = &gelu_backward_sig,
};
