/* attention: causal multi-head self-attention over a fused qkv[B,T,3C]
 * (q, k, v concatenated, each split into attrs.heads heads), saving the
 * log-sum-exp of each row's scores, lse[B,NH,T], for the backward op,
 * which recomputes the probabilities from it and writes dqkv.  The
 * backward op also reads the output (cuDNN's fused backward pass needs
 * rowsum(dout * out); the matmul after attention keeps it alive until
 * then anyway).  The own kernels hold one batch row's probabilities in
 * scratch. */
#include <config.h>

#include "ops_internal.h"

enum { OUT, LSE };

static flow_err_t attention_infer(const flow_graph_t *g,
				  const flow_graph_op_t *op,
				  flow_shape_t shapes_out[FLOW_OP_MAX_IO],
				  flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
				  flow_diag_t *diag)
{
	flow_err_t err;

	if ((err = flow_op_check_inputs(g, op, diag)) ||
	    (err = flow_op_check_rank(g, op, 0, 3, "(B,T,3C)", diag)))
		return err;
	const flow_shape_t *qkv = flow_op_in_shape(g, op, 0);
	int64_t B = qkv->dims[0], T = qkv->dims[1], C = qkv->dims[2] / 3;
	uint32_t NH = op->attrs.heads;

	if (qkv->dims[2] % 3 != 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: qkv %s must be (B,T,3C): %lld is "
				     "not a multiple of 3",
				     op->name, flow_shape_text(qkv).s,
				     (long long)qkv->dims[2]);
	if (NH == 0 || C % NH != 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: %u heads do not divide C %lld",
				     op->name, NH, (long long)C);
	shapes_out[OUT] = (flow_shape_t){ .ndim = 3, .dims = { B, T, C } };
	shapes_out[LSE] = (flow_shape_t){ .ndim = 3, .dims = { B, NH, T } };
	dtypes_out[OUT] = g->act_dtype;
	dtypes_out[LSE] = FLOW_DTYPE_F32;
	return FLOW_OK;
}

/* The two products q.k^T and probs.v, counted over the full T x T square
 * as the 12 L T C of the PaLM MFU convention does: 2 * 2 B T T C forward,
 * twice that backward.  The softmax is left out, and so is the q.k^T that
 * backward recomputes: that is this implementation's work, not the
 * model's. */
static double attention_macs(const flow_graph_t *g, const flow_graph_op_t *fwd)
{
	const flow_shape_t *qkv = flow_op_in_shape(g, fwd, 0);

	return 2.0 * flow_shape_elems(qkv) / 3.0 * (double)qkv->dims[1];
}

static double attention_flops(const flow_graph_t *g, const flow_graph_op_t *op)
{
	return 2.0 * attention_macs(g, op);
}

static double attention_backward_flops(const flow_graph_t *g,
				       const flow_graph_op_t *op)
{
	return 4.0 * attention_macs(g, flow_op_forward_of(g, op));
}

/* One batch row's probabilities and their gradient, (2,NH,T,T) in f32,
 * and for bf16 the row's qkv, out or dout, and dqkv widened, (7,T,C) in
 * f32: the CPU set's bf16 figure, which covers either pass and precision.
 * The
 * executor asks its kernel set for its own, in the run's precision (the
 * reference set keeps doubles, the CUDA set bf16 copies of the
 * probabilities too). */
static size_t attention_rows_scratch(const flow_graph_t *g,
				     const flow_graph_op_t *fwd)
{
	const flow_shape_t *qkv = flow_op_in_shape(g, fwd, 0);
	size_t T = (size_t)qkv->dims[1], C = (size_t)qkv->dims[2] / 3;

	return (2 * fwd->attrs.heads * T * T + 7 * T * C) * sizeof(float);
}

static size_t attention_backward_scratch(const flow_graph_t *g,
					 const flow_graph_op_t *op)
{
	return attention_rows_scratch(g, flow_op_forward_of(g, op));
}

/* ---- SBP signatures ---------------------------------------------------------
 *
 * Per mesh axis:
 *   batch  qkv S(0) -> out S(0), lse S(0)
 *   heads  qkv S(3) -> out S(2), lse S(1), on the 5-D view only:
 *          qkv [B,T,3,NH,hs], out [B,T,NH,hs]
 * In the graph's fused qkv [B,T,3C] a rank's heads are three separate
 * column ranges (its q, k and v heads), which no split of the last axis
 * describes; the 5-D view makes them one range of axis 3.  The sequence
 * never splits: causal attention reads every earlier position. */

static flow_err_t attention_sig_rule(const flow_sig_query_t *q,
				     flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_shape_t *qkv = &q->in[0];
	flow_shape_t out, lse;
	int64_t B, T, NH, hs;
	flow_sig_t *s;

	if (qkv->ndim == 3) {
		int64_t C = qkv->dims[2] / 3;

		if (qkv->dims[2] % 3 != 0)
			return flow_sig_bad(q, diag,
					    "qkv %s must be (B,T,3C): %lld is "
					    "not a multiple of 3",
					    flow_shape_text(qkv).s,
					    (long long)qkv->dims[2]);
		if (q->attrs.heads == 0 || C % q->attrs.heads != 0)
			return flow_sig_bad(q, diag,
					    "%u heads do not divide C %lld",
					    q->attrs.heads, (long long)C);
		NH = q->attrs.heads;
		hs = C / NH;
	} else if (qkv->ndim == 5) {
		if (qkv->dims[2] != 3)
			return flow_sig_bad(q, diag,
					    "qkv %s must be (B,T,3,NH,hs)",
					    flow_shape_text(qkv).s);
		NH = qkv->dims[3];
		hs = qkv->dims[4];
		if (q->attrs.heads != 0 && q->attrs.heads != NH)
			return flow_sig_bad(q, diag,
					    "qkv %s has %lld heads, not %u",
					    flow_shape_text(qkv).s,
					    (long long)NH, q->attrs.heads);
	} else {
		return flow_sig_bad(q, diag,
				    "qkv %s must be (B,T,3C) or (B,T,3,NH,hs)",
				    flow_shape_text(qkv).s);
	}
	B = qkv->dims[0];
	T = qkv->dims[1];
	if (qkv->ndim == 3)
		out = (flow_shape_t){ .ndim = 3, .dims = { B, T, NH * hs } };
	else
		out = (flow_shape_t){ .ndim = 4, .dims = { B, T, NH, hs } };
	lse = (flow_shape_t){ .ndim = 3, .dims = { B, NH, T } };
	if (!flow_shape_equal(&q->out[OUT], &out))
		return flow_sig_mismatch(q, diag, "out", &q->out[OUT], "qkv",
					 qkv, "%s", flow_shape_text(&out).s);
	if (q->nout > LSE && !flow_shape_equal(&q->out[LSE], &lse))
		return flow_sig_mismatch(q, diag, "lse", &q->out[LSE], "qkv",
					 qkv, "%s", flow_shape_text(&lse).s);

	s = flow_sig_push(b, "batch");
	s->in[0] = s->out[OUT] = s->out[LSE] = FLOW_SIG_S(0);
	if (qkv->ndim == 5) {
		s = flow_sig_push(b, "heads");
		s->in[0] = FLOW_SIG_S(3);
		s->out[OUT] = FLOW_SIG_S(2);
		s->out[LSE] = FLOW_SIG_S(1);
	}
	return FLOW_OK;
}

static const flow_sig_op_t attention_sig = {
	.nin = 1,
	.nin_min = 1,
	.nout = 2,
	.nout_min = 1,
	.in_names = { "qkv" },
	.out_names = { "out", "lse" },
	.rule = attention_sig_rule,
};

/* The backward op's, by the adjoint (flow_sig_adjoint): dout, qkv, lse
 * and out split as forward give dqkv split as qkv. */
static flow_err_t attention_backward_sig_rule(const flow_sig_query_t *q,
					      flow_sig_builder_t *b,
					      flow_diag_t *diag)
{
	flow_sig_query_t f = { .op = "attention", .nin = 1, .nout = 2,
			       .attrs = q->attrs,
			       .axis_size = q->axis_size };

	f.in[0] = q->in[1];
	f.in_present[0] = true;
	f.out[OUT] = q->in[0];
	f.out[LSE] = q->in[2];
	return flow_sig_adjoint(&f, &flow_op_attention_info, b, diag);
}

static const flow_sig_op_t attention_backward_sig = {
	.nin = 4,
	.nin_min = 4,
	.nout = 1,
	.nout_min = 1,
	.in_names = { "dout", "qkv", "lse", "out" },
	.out_names = { "dqkv" },
	.rule = attention_backward_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_attention_info = {
	.def = {
		.kind = FLOW_OP_ATTENTION,
		.name = "attention",
		.nin = 1,
		.nout = 2,
		.in_names = { "qkv" },
		.out_names = { "out", "lse" },
		.backward_kind = FLOW_OP_ATTENTION_BACKWARD,
		.infer = attention_infer,
		.backward = flow_op_backward_rule,
		.flops = attention_flops,
		.scratch = attention_rows_scratch,
	},
	.sig = &attention_sig,
	.act_in = 1u << 0,
	.saved_out = 1u << LSE,
	.nsaved = 3,
	.saved = { FLOW_OP_FWD_IN(0), FLOW_OP_FWD_OUT(LSE),
		   FLOW_OP_FWD_OUT(OUT) },
};

const flow_op_info_t flow_op_attention_backward_info = {
	.def = {
		.kind = FLOW_OP_ATTENTION_BACKWARD,
		.name = "attention_backward",
		.nin = 4,
		.nout = 1,
		.in_names = { "dout", "qkv", "lse", "out" },
		.out_names = { "dqkv" },
		.accumulates = 1,
		.backward_kind = FLOW_OP_ATTENTION_BACKWARD,
		.infer = flow_op_backward_infer,
		.flops = attention_backward_flops,
		.scratch = attention_backward_scratch,
	},
	.sig = &attention_backward_sig,
};
