/* bias_add: out = x + bias broadcast along axis attrs.axis of x (bias has
 * x's extent there; a negative axis counts from the end).  Signature only
 * (no graph op): plans can reason about models written with it.
 *
 * Per mesh axis (OneFlow's bias_add rows):
 *   split    x S(i), bias B     -> out S(i), for each axis i != axis
 *   axis     x S(axis), bias S(0) -> out S(axis)
 *   partial  x P, bias P        -> out P
 * The partial row is exact as every rank adds its own addend of the bias
 * (a bias held B becomes P for free by boxing); it is the same choice as
 * matmul's bias in its row-parallel form (lib/ops/matmul.c), and lets a
 * row-parallel product followed by a bias_add stay partial until one
 * all-reduce. */
#include <config.h>

#include "ops_internal.h"

enum { BA_X, BA_BIAS };
enum { BA_OUT };

static flow_err_t bias_add_sig_rule(const flow_sig_query_t *q,
				    flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_shape_t *x = &q->in[BA_X], *bias = &q->in[BA_BIAS];
	int axis = q->attrs.axis;
	flow_err_t err;
	flow_sig_t *s;

	if ((err = flow_sig_check_rank(q, "x", x, -1, "(...)", diag)))
		return err;
	if (axis < -x->ndim || axis >= x->ndim)
		return flow_sig_bad(q, diag,
				    "axis %d is outside the %d axes of x %s",
				    axis, x->ndim, flow_shape_text(x).s);
	if (axis < 0)
		axis += x->ndim;
	if ((err = flow_sig_check_rank(q, "bias", bias, 1, "(N)", diag)))
		return err;
	if (bias->dims[0] != x->dims[axis])
		return flow_sig_mismatch(q, diag, "bias", bias, "x", x,
					 "(%lld), axis %d of x",
					 (long long)x->dims[axis], axis);
	if (!flow_shape_equal(&q->out[BA_OUT], x))
		return flow_sig_mismatch(q, diag, "out", &q->out[BA_OUT], "x",
					 x, "%s", flow_shape_text(x).s);
	for (int i = 0; i < x->ndim; i++) {
		s = flow_sig_push(b, i == axis ? "axis" : "split");
		s->in[BA_X] = s->out[BA_OUT] = FLOW_SIG_S(i);
		if (i == axis)
			s->in[BA_BIAS] = FLOW_SIG_S(0);
	}
	s = flow_sig_push(b, "partial");
	s->in[BA_X] = s->in[BA_BIAS] = s->out[BA_OUT] = FLOW_SIG_P;
	return FLOW_OK;
}

static const flow_sig_op_t bias_add_sig = {
	.nin = 2,
	.nin_min = 2,
	.nout = 1,
	.nout_min = 1,
	.in_names = { "x", "bias" },
	.out_names = { "out" },
	.rule = bias_add_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_bias_add_info = {
	.def = { .kind = FLOW_OP_BIAS_ADD, .name = "bias_add" },
	.sig = &bias_add_sig,
};
