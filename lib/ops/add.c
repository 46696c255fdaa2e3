/* add: out = a + b, same shapes (the residual connection).  Its backward
 * passes dout unchanged into da and db. */
#include <config.h>

#include "ops_internal.h"

enum { A, B };

static flow_err_t add_infer(const flow_graph_t *g, const flow_graph_op_t *op,
			    flow_shape_t shapes_out[FLOW_OP_MAX_IO],
			    flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
			    flow_diag_t *diag)
{
	flow_err_t err = flow_op_check_inputs(g, op, diag);

	if (err != FLOW_OK)
		return err;
	const flow_shape_t *a = flow_op_in_shape(g, op, A);

	if (!flow_shape_equal(flow_op_in_shape(g, op, B), a))
		return flow_op_mismatch(g, op, B, A, diag, "%s",
					flow_shape_text(a).s);
	shapes_out[0] = *a;
	dtypes_out[0] = FLOW_DTYPE_F32; /* the residual stream */
	return FLOW_OK;
}

/* One add per element; backward one per element and gradient. */
static double add_flops(const flow_graph_t *g, const flow_graph_op_t *op)
{
	return flow_shape_elems(flow_op_in_shape(g, op, A));
}

static double add_backward_flops(const flow_graph_t *g,
				 const flow_graph_op_t *op)
{
	double n = flow_shape_elems(flow_op_in_shape(g, op, 0));

	return n * ((op->out[0] >= 0) + (op->out[1] >= 0));
}

/* ---- SBP signatures ---------------------------------------------------------
 *
 * Per mesh axis, elementwise on equal shapes:
 *   split    a S(k), b S(k) -> out S(k), any axis k
 *   partial  a P, b P       -> out P (the sum of sums)
 * (broadcast_add, lib/ops/broadcast_add.c, is the broadcasting one.) */

static flow_err_t add_sig_rule(const flow_sig_query_t *q,
			       flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_shape_t *a = &q->in[A];
	flow_sig_t *s;

	if (!flow_shape_equal(&q->in[B], a))
		return flow_sig_mismatch(q, diag, "b", &q->in[B], "a", a, "%s",
					 flow_shape_text(a).s);
	if (!flow_shape_equal(&q->out[0], a))
		return flow_sig_mismatch(q, diag, "out", &q->out[0], "a", a,
					 "%s", flow_shape_text(a).s);
	for (int k = 0; k < a->ndim; k++) {
		s = flow_sig_push(b, "split");
		s->in[A] = s->in[B] = s->out[0] = FLOW_SIG_S(k);
	}
	s = flow_sig_push(b, "partial");
	s->in[A] = s->in[B] = s->out[0] = FLOW_SIG_P;
	return FLOW_OK;
}

static const flow_sig_op_t add_sig = {
	.nin = 2,
	.nin_min = 2,
	.nout = 1,
	.nout_min = 1,
	.in_names = { "a", "b" },
	.out_names = { "out" },
	.rule = add_sig_rule,
};

/* The backward op's, by the adjoint (flow_sig_adjoint): split gives da and
 * db split as dout; partial reads dout B and gives both B. */
static flow_err_t add_backward_sig_rule(const flow_sig_query_t *q,
					flow_sig_builder_t *b,
					flow_diag_t *diag)
{
	flow_sig_query_t f = { .op = "add", .nin = 2, .nout = 1,
			       .attrs = q->attrs,
			       .axis_size = q->axis_size };

	f.in[A] = q->out[0];
	f.in[B] = q->out[1];
	f.in_present[A] = f.in_present[B] = true;
	f.out[0] = q->in[0];
	return flow_sig_adjoint(&f, &flow_op_add_info, b, diag);
}

static const flow_sig_op_t add_backward_sig = {
	.nin = 1,
	.nin_min = 1,
	.nout = 2,
	.nout_min = 2,
	.in_names = { "dout" },
	.out_names = { "da", "db" },
	.rule = add_backward_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_add_info = {
	.def = {
		.kind = FLOW_OP_ADD,
		.name = "add",
		.nin = 2,
		.nout = 1,
		.in_names = { "a", "b" },
		.out_names = { "out" },
		.backward_kind = FLOW_OP_ADD_BACKWARD,
		.infer = add_infer,
		.backward = flow_op_backward_rule,
		.flops = add_flops,
		.scratch = flow_op_no_scratch,
	},
	.sig = &add_sig,
	.act_in = 1u << B, /* the branch: a matmul's output */
};

const flow_op_info_t flow_op_add_backward_info = {
	.def = {
		.kind = FLOW_OP_ADD_BACKWARD,
		.name = "add_backward",
		.nin = 1,
		.nout = 2,
		.in_names = { "dout" },
		.out_names = { "da", "db" },
		.accumulates = 3,
		.backward_kind = FLOW_OP_ADD_BACKWARD,
		.infer = flow_op_backward_infer,
		.flops = add_backward_flops,
		.scratch = flow_op_no_scratch,
	},
	.sig = &add_backward_sig,
};
