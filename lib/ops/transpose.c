/* transpose: y = x with its axes permuted, out axis i being in axis
 * attrs.perm[i].  Signature only (no graph op): plans can reason about
 * models written with it.
 *
 * Per mesh axis:
 *   split    x S(perm[i]) -> y S(i), for each out axis i
 *   partial  x P          -> y P */
#include <config.h>

#include "ops_internal.h"

enum { TR_X };
enum { TR_Y };

static flow_err_t transpose_sig_rule(const flow_sig_query_t *q,
				     flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_shape_t *x = &q->in[TR_X], *y = &q->out[TR_Y];
	const int *perm = q->attrs.perm;
	bool seen[FLOW_MAX_DIMS] = { false };
	flow_shape_t want = { .ndim = x->ndim };
	flow_sig_t *s;

	for (int i = 0; i < x->ndim; i++) {
		if (perm[i] < 0 || perm[i] >= x->ndim || seen[perm[i]])
			return flow_sig_bad(q, diag,
					    "perm is not a permutation of the "
					    "%d axes of x %s: perm[%d] = %d",
					    x->ndim, flow_shape_text(x).s, i,
					    perm[i]);
		seen[perm[i]] = true;
		want.dims[i] = x->dims[perm[i]];
	}
	if (!flow_shape_equal(y, &want))
		return flow_sig_mismatch(q, diag, "y", y, "x", x, "%s",
					 flow_shape_text(&want).s);
	for (int i = 0; i < x->ndim; i++) {
		s = flow_sig_push(b, "split");
		s->in[TR_X] = FLOW_SIG_S(perm[i]);
		s->out[TR_Y] = FLOW_SIG_S(i);
	}
	s = flow_sig_push(b, "partial");
	s->in[TR_X] = s->out[TR_Y] = FLOW_SIG_P;
	return FLOW_OK;
}

static const flow_sig_op_t transpose_sig = {
	.nin = 1,
	.nin_min = 1,
	.nout = 1,
	.nout_min = 1,
	.in_names = { "x" },
	.out_names = { "y" },
	.rule = transpose_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_transpose_info = {
	.def = { .kind = FLOW_OP_TRANSPOSE, .name = "transpose" },
	.sig = &transpose_sig,
};
