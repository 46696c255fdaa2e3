/* reduce_sum and reduce_mean: y = the sum (mean) of x over the axes in
 * attrs.axes_mask, which stay as size-1 axes with attrs.keepdims and are
 * dropped otherwise.  Signature only (no graph op): plans can reason about
 * models written with them.
 *
 * Per mesh axis (OneFlow's reduce_sum rows):
 *   split    x S(i) -> y S(i'), i not reduced (i' its axis in y)
 *   reduce   x S(i) -> y P,     i reduced: each rank sums its part
 *   partial  x P    -> y P
 * reduce_mean shares them, being reduce_sum scaled by 1/count: a rank
 * holding part of a reduced axis divides its partial sum by the LOGICAL
 * count (the whole axis' extent), so the parts add up to the mean. */
#include <config.h>

#include "ops_internal.h"

enum { RD_X };
enum { RD_Y };

static flow_err_t reduce_sig_rule(const flow_sig_query_t *q,
				  flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_shape_t *x = &q->in[RD_X], *y = &q->out[RD_Y];
	unsigned mask = q->attrs.axes_mask;
	int where[FLOW_MAX_DIMS];
	flow_shape_t want = { .ndim = 0 };
	flow_sig_t *s;

	if (x->ndim < (int)(sizeof(mask) * 8) && (mask >> x->ndim) != 0)
		return flow_sig_bad(q, diag,
				    "axes_mask 0x%x names axes beyond the %d "
				    "of x %s",
				    mask, x->ndim, flow_shape_text(x).s);
	for (int i = 0; i < x->ndim; i++) {
		bool reduced = mask & (1u << i);

		where[i] = -1;
		if (!reduced || q->attrs.keepdims) {
			if (!reduced)
				where[i] = want.ndim;
			want.dims[want.ndim++] = reduced ? 1 : x->dims[i];
		}
	}
	if (!flow_shape_equal(y, &want))
		return flow_sig_mismatch(q, diag, "y", y, "x", x, "%s",
					 flow_shape_text(&want).s);
	for (int i = 0; i < x->ndim; i++) {
		bool reduced = mask & (1u << i);

		s = flow_sig_push(b, reduced ? "reduce" : "split");
		s->in[RD_X] = FLOW_SIG_S(i);
		s->out[RD_Y] = reduced ? FLOW_SIG_P : FLOW_SIG_S(where[i]);
	}
	s = flow_sig_push(b, "partial");
	s->in[RD_X] = s->out[RD_Y] = FLOW_SIG_P;
	return FLOW_OK;
}

static const flow_sig_op_t reduce_sig = {
	.nin = 1,
	.nin_min = 1,
	.nout = 1,
	.nout_min = 1,
	.in_names = { "x" },
	.out_names = { "y" },
	.rule = reduce_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_reduce_sum_info = {
	.def = { .kind = FLOW_OP_REDUCE_SUM, .name = "reduce_sum" },
	.sig = &reduce_sig,
};

const flow_op_info_t flow_op_reduce_mean_info = {
	.def = { .kind = FLOW_OP_REDUCE_MEAN, .name = "reduce_mean" },
	.sig = &reduce_sig,
};
