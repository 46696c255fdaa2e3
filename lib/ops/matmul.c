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
	dtypes_out[0] = g->act_dtype;
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

/* ---- SBP signatures ---------------------------------------------------------
 *
 * Per mesh axis, out[...,O] = x[...,I] . weight[O,I]^T + bias[O]:
 *   data     x S(k) (any leading axis k), weight B, bias B  -> out S(k)
 *   column   x B, weight S(0) (O split), bias S(0)         -> out S(last)
 *   row      x S(last) (I split), weight S(1), bias P      -> out P
 *   partial  x P, weight B, bias P                         -> out P
 *   partial  x B, weight P, bias P                         -> out P
 * The three P forms are exact because every rank adds its own addend of
 * the bias: the sum over ranks of x_r . w_r^T + b_r is x . w^T + b.  A
 * bias held whole (B, as parameters are) becomes P for free by boxing
 * (zeros on all but the first rank of the axis), which is Megatron's
 * "add the bias once, after the all-reduce" without a rank-aware kernel.
 * Without a bias the forms are the same, less the bias. */

enum { MM_OUT };

static flow_err_t matmul_sig_rule(const flow_sig_query_t *q,
				  flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_shape_t *x = &q->in[X], *w = &q->in[WEIGHT];
	bool has_bias = q->nin > BIAS && q->in_present[BIAS];
	flow_shape_t want;
	flow_err_t err;
	flow_sig_t *s;

	if ((err = flow_sig_check_rank(q, "x", x, -1, "(...,I)", diag)) ||
	    (err = flow_sig_check_rank(q, "weight", w, 2, "(O,I)", diag)))
		return err;
	int n = x->ndim;
	int64_t in_dim = x->dims[n - 1], out_dim = w->dims[0];

	if (w->dims[1] != in_dim)
		return flow_sig_mismatch(q, diag, "weight", w, "x", x,
					 "(O,%lld)", (long long)in_dim);
	if (has_bias) {
		const flow_shape_t *bias = &q->in[BIAS];

		if ((err = flow_sig_check_rank(q, "bias", bias, 1, "(O)",
					       diag)))
			return err;
		if (bias->dims[0] != out_dim)
			return flow_sig_mismatch(q, diag, "bias", bias,
						 "weight", w, "(%lld)",
						 (long long)out_dim);
	}
	want = *x;
	want.dims[n - 1] = out_dim;
	if (!flow_shape_equal(&q->out[MM_OUT], &want))
		return flow_sig_mismatch(q, diag, "out", &q->out[MM_OUT], "x",
					 x, "%s", flow_shape_text(&want).s);

	for (int k = 0; k + 1 < n; k++) {
		s = flow_sig_push(b, "data");
		s->in[X] = FLOW_SIG_S(k);
		s->out[MM_OUT] = FLOW_SIG_S(k);
	}
	s = flow_sig_push(b, "column");
	s->in[WEIGHT] = s->in[BIAS] = FLOW_SIG_S(0);
	s->out[MM_OUT] = FLOW_SIG_S(n - 1);
	s = flow_sig_push(b, "row");
	s->in[X] = FLOW_SIG_S(n - 1);
	s->in[WEIGHT] = FLOW_SIG_S(1);
	s->in[BIAS] = s->out[MM_OUT] = FLOW_SIG_P;
	s = flow_sig_push(b, "partial");
	s->in[X] = s->in[BIAS] = s->out[MM_OUT] = FLOW_SIG_P;
	s = flow_sig_push(b, "partial");
	s->in[WEIGHT] = s->in[BIAS] = s->out[MM_OUT] = FLOW_SIG_P;
	return FLOW_OK;
}

static const flow_sig_op_t matmul_sig = {
	.nin = 3,
	.nin_min = 2,
	.nout = 1,
	.nout_min = 1,
	.optional_in = 1u << BIAS,
	.in_names = { "x", "weight", "bias" },
	.out_names = { "out" },
	.rule = matmul_sig_rule,
};

/* The backward op's, by the adjoint of each forward signature
 * (flow_sig_adjoint): data gives dweight and dbias P; column gives dx P
 * and dweight, dbias S(0); row reads dout B and gives dx S(last),
 * dweight S(1), dbias B; the partial forms read dout B.  The forward
 * query is rebuilt from the backward one: the bias existed when its
 * gradient is listed (flow_sig_query_of_op drops it otherwise). */
static flow_err_t matmul_backward_sig_rule(const flow_sig_query_t *q,
					   flow_sig_builder_t *b,
					   flow_diag_t *diag)
{
	flow_sig_query_t f = { .op = "matmul", .nin = 3, .nout = 1,
			       .attrs = q->attrs,
			       .axis_size = q->axis_size };

	f.in[X] = q->in[1];
	f.in[WEIGHT] = q->in[2];
	f.in_present[X] = f.in_present[WEIGHT] = true;
	f.in_present[BIAS] = q->nout > 2;
	if (f.in_present[BIAS])
		f.in[BIAS] = q->out[2];
	f.out[MM_OUT] = q->in[0];
	return flow_sig_adjoint(&f, &flow_op_matmul_info, b, diag);
}

static const flow_sig_op_t matmul_backward_sig = {
	.nin = 3,
	.nin_min = 3,
	.nout = 3,
	.nout_min = 2,
	.in_names = { "dout", "x", "weight" },
	.out_names = { "dx", "dweight", "dbias" },
	.rule = matmul_backward_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

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
	.sig = &matmul_sig,
	.act_in = 1u << X,
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
	.sig = &matmul_backward_sig,
};
