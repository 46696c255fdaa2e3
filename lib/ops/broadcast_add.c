/* broadcast_add: out = a + b with numpy broadcasting (shapes aligned at
 * their last axes; an axis of extent 1, or one a shorter shape lacks, is
 * repeated to the other's extent).  Signature only (no graph op): plans
 * can reason about models written with it.
 *
 * Per mesh axis (OneFlow's binary broadcast rows), for each axis i of out
 * with more than one element:
 *   split    a S(.) or B, b S(.) or B -> out S(i)
 * where an input splits its own axis aligned with i when it has that
 * extent there, and is B when it lacks the axis or has extent 1 there
 * (each rank then repeats all of it);
 *   partial  a P, b P -> out P (a broadcast of a sum is the sum of the
 *            broadcasts) */
#include <config.h>

#include "ops_internal.h"

enum { BC_A, BC_B };
enum { BC_OUT };

/* The axis of s aligned with axis i of an n-axis result, or -1 when s
 * has none there or extent 1 (broadcast). */
static int bc_axis(const flow_shape_t *s, int n, int i)
{
	int k = i - (n - s->ndim);

	return k >= 0 && s->dims[k] != 1 ? k : -1;
}

static flow_err_t broadcast_add_sig_rule(const flow_sig_query_t *q,
					 flow_sig_builder_t *b,
					 flow_diag_t *diag)
{
	const flow_shape_t *a = &q->in[BC_A], *bb = &q->in[BC_B];
	int n = a->ndim > bb->ndim ? a->ndim : bb->ndim;
	flow_shape_t want = { .ndim = n };
	flow_sig_t *s;

	for (int i = 0; i < n; i++) {
		int ka = i - (n - a->ndim), kb = i - (n - bb->ndim);
		int64_t ea = ka >= 0 ? a->dims[ka] : 1;
		int64_t eb = kb >= 0 ? bb->dims[kb] : 1;

		if (ea != eb && ea != 1 && eb != 1)
			return flow_sig_bad(q, diag,
					    "a %s and b %s do not broadcast: "
					    "%lld against %lld",
					    flow_shape_text(a).s,
					    flow_shape_text(bb).s,
					    (long long)ea, (long long)eb);
		want.dims[i] = ea == 1 ? eb : ea;
	}
	if (!flow_shape_equal(&q->out[BC_OUT], &want))
		return flow_sig_mismatch(q, diag, "out", &q->out[BC_OUT], "a",
					 a, "%s, the broadcast with b %s",
					 flow_shape_text(&want).s,
					 flow_shape_text(bb).s);
	for (int i = 0; i < n; i++) {
		int ka = bc_axis(a, n, i), kb = bc_axis(bb, n, i);

		if (want.dims[i] == 1)
			continue;
		s = flow_sig_push(b, "split");
		s->out[BC_OUT] = FLOW_SIG_S(i);
		if (ka >= 0)
			s->in[BC_A] = FLOW_SIG_S(ka);
		if (kb >= 0)
			s->in[BC_B] = FLOW_SIG_S(kb);
	}
	s = flow_sig_push(b, "partial");
	s->in[BC_A] = s->in[BC_B] = s->out[BC_OUT] = FLOW_SIG_P;
	return FLOW_OK;
}

static const flow_sig_op_t broadcast_add_sig = {
	.nin = 2,
	.nin_min = 2,
	.nout = 1,
	.nout_min = 1,
	.in_names = { "a", "b" },
	.out_names = { "out" },
	.rule = broadcast_add_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_broadcast_add_info = {
	.def = { .kind = FLOW_OP_BROADCAST_ADD, .name = "broadcast_add" },
	.sig = &broadcast_add_sig,
};
