/* embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].  Its backward
 * scatters dout into dwte by token and sums it over the batch into dwpe;
 * the tokens get no gradient. */
#include <config.h>

#include "ops_internal.h"

enum { TOKENS, WTE, WPE };

static flow_err_t embedding_infer(const flow_graph_t *g,
				  const flow_graph_op_t *op,
				  flow_shape_t shapes_out[FLOW_OP_MAX_IO],
				  flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
				  flow_diag_t *diag)
{
	flow_err_t err;

	if ((err = flow_op_check_inputs(g, op, diag)) ||
	    (err = flow_op_check_rank(g, op, TOKENS, 2, "(B,T)", diag)) ||
	    (err = flow_op_check_rank(g, op, WTE, 2, "(Vp,C)", diag)) ||
	    (err = flow_op_check_rank(g, op, WPE, 2, "(Tmax,C)", diag)))
		return err;
	const flow_shape_t *tokens = flow_op_in_shape(g, op, TOKENS);
	const flow_shape_t *wte = flow_op_in_shape(g, op, WTE);
	const flow_shape_t *wpe = flow_op_in_shape(g, op, WPE);

	if (wpe->dims[1] != wte->dims[1])
		return flow_op_mismatch(g, op, WPE, WTE, diag, "(Tmax,%lld)",
					(long long)wte->dims[1]);
	if (tokens->dims[1] > wpe->dims[0])
		return flow_op_mismatch(g, op, TOKENS, WPE, diag,
					"T <= Tmax %lld",
					(long long)wpe->dims[0]);
	shapes_out[0] = *tokens;
	shapes_out[0].ndim = 3;
	shapes_out[0].dims[2] = wte->dims[1];
	dtypes_out[0] = FLOW_DTYPE_F32;
	return FLOW_OK;
}

/* One add per output element, forward; one per element and gradient,
 * backward. */
static double embedding_flops(const flow_graph_t *g, const flow_graph_op_t *op)
{
	return flow_shape_elems(&g->tensors[op->out[0]].shape);
}

static double embedding_backward_flops(const flow_graph_t *g,
				       const flow_graph_op_t *op)
{
	double n = flow_shape_elems(flow_op_in_shape(g, op, 0));

	return n * ((op->out[0] >= 0) + (op->out[1] >= 0));
}

/* ---- SBP signatures ---------------------------------------------------------
 *
 * Per mesh axis, out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]:
 *   data    tokens S(0), wte B, wpe B            -> out S(0)
 *   seq     tokens S(1), wte B, wpe B            -> out S(1)
 *   hidden  tokens B, wte S(1), wpe S(1)         -> out S(2)
 *   vocab   tokens B, wte S(0), wpe P            -> out P
 * seq: a rank holding positions [t0, t0 + T_r) adds wpe rows t0..; the
 * kernel takes t0 (the start of its part, flow_split_part) as the first
 * position.  vocab (OneFlow's gather with the table split on its rows):
 * a rank holding rows [v0, v0 + V_r) of the padded vocabulary looks up the
 * tokens in that range at row token - v0 and writes zeros for the rest,
 * so exactly one rank contributes each token's row; wpe must then be P
 * (each rank adds its addend, a whole wpe held B becomes P for free by
 * boxing: zeros on all but the first rank) so the positions are counted
 * once in the sum.  The tokens are never split with the table: a token's
 * row lives on one rank only. */

enum { EMB_OUT };

static flow_err_t embedding_sig_rule(const flow_sig_query_t *q,
				     flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_shape_t *tokens = &q->in[TOKENS], *wte = &q->in[WTE];
	const flow_shape_t *wpe = &q->in[WPE];
	flow_shape_t want;
	flow_err_t err;
	flow_sig_t *s;

	if ((err = flow_sig_check_rank(q, "tokens", tokens, 2, "(B,T)",
				       diag)) ||
	    (err = flow_sig_check_rank(q, "wte", wte, 2, "(Vp,C)", diag)) ||
	    (err = flow_sig_check_rank(q, "wpe", wpe, 2, "(Tmax,C)", diag)))
		return err;
	if (wpe->dims[1] != wte->dims[1])
		return flow_sig_mismatch(q, diag, "wpe", wpe, "wte", wte,
					 "(Tmax,%lld)", (long long)wte->dims[1]);
	if (tokens->dims[1] > wpe->dims[0])
		return flow_sig_mismatch(q, diag, "tokens", tokens, "wpe", wpe,
					 "T <= Tmax %lld",
					 (long long)wpe->dims[0]);
	want = (flow_shape_t){ .ndim = 3, .dims = { tokens->dims[0],
		tokens->dims[1], wte->dims[1] } };
	if (!flow_shape_equal(&q->out[EMB_OUT], &want))
		return flow_sig_mismatch(q, diag, "out", &q->out[EMB_OUT],
					 "tokens", tokens, "%s",
					 flow_shape_text(&want).s);

	s = flow_sig_push(b, "data");
	s->in[TOKENS] = s->out[EMB_OUT] = FLOW_SIG_S(0);
	s = flow_sig_push(b, "seq");
	s->in[TOKENS] = s->out[EMB_OUT] = FLOW_SIG_S(1);
	s = flow_sig_push(b, "hidden");
	s->in[WTE] = s->in[WPE] = FLOW_SIG_S(1);
	s->out[EMB_OUT] = FLOW_SIG_S(2);
	s = flow_sig_push(b, "vocab");
	s->in[WTE] = FLOW_SIG_S(0);
	s->in[WPE] = s->out[EMB_OUT] = FLOW_SIG_P;
	return FLOW_OK;
}

static const flow_sig_op_t embedding_sig = {
	.nin = 3,
	.nin_min = 3,
	.nout = 1,
	.nout_min = 1,
	.in_names = { "tokens", "wte", "wpe" },
	.out_names = { "out" },
	.rule = embedding_sig_rule,
};

/* The backward op's, by the adjoint (flow_sig_adjoint): data and seq give
 * dwte and dwpe P (each rank scatters its own tokens); hidden gives both
 * S(1); vocab reads dout B and gives dwte S(0) (each rank keeps the rows
 * it owns) and dwpe B. */
static flow_err_t embedding_backward_sig_rule(const flow_sig_query_t *q,
					      flow_sig_builder_t *b,
					      flow_diag_t *diag)
{
	flow_sig_query_t f = { .op = "embedding", .nin = 3, .nout = 1,
			       .attrs = q->attrs,
			       .axis_size = q->axis_size };

	f.in[TOKENS] = q->in[1];
	f.in[WTE] = q->out[0];
	f.in[WPE] = q->out[1];
	f.in_present[TOKENS] = f.in_present[WTE] = f.in_present[WPE] = true;
	f.out[EMB_OUT] = q->in[0];
	return flow_sig_adjoint(&f, &flow_op_embedding_info, b, diag);
}

static const flow_sig_op_t embedding_backward_sig = {
	.nin = 2,
	.nin_min = 2,
	.nout = 2,
	.nout_min = 2,
	.in_names = { "dout", "tokens" },
	.out_names = { "dwte", "dwpe" },
	.rule = embedding_backward_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_embedding_info = {
	.def = {
		.kind = FLOW_OP_EMBEDDING,
		.name = "embedding",
		.nin = 3,
		.nout = 1,
		.in_names = { "tokens", "wte", "wpe" },
		.out_names = { "out" },
		.backward_kind = FLOW_OP_EMBEDDING_BACKWARD,
		.infer = embedding_infer,
		.backward = flow_op_backward_rule,
		.flops = embedding_flops,
		.scratch = flow_op_no_scratch,
	},
	.sig = &embedding_sig,
	.i32_in = 1u << TOKENS,
	.grad_in_first = WTE,
	.nsaved = 1,
	.saved = { FLOW_OP_FWD_IN(TOKENS) },
};

const flow_op_info_t flow_op_embedding_backward_info = {
	.def = {
		.kind = FLOW_OP_EMBEDDING_BACKWARD,
		.name = "embedding_backward",
		.nin = 2,
		.nout = 2,
		.in_names = { "dout", "tokens" },
		.out_names = { "dwte", "dwpe" },
		.accumulates = 3,
		.backward_kind = FLOW_OP_EMBEDDING_BACKWARD,
		.infer = flow_op_backward_infer,
		.flops = embedding_backward_flops,
		.scratch = flow_op_no_scratch,
	},
	.sig = &embedding_backward_sig,
};
