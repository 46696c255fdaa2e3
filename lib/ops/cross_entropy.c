/* cross_entropy: fused softmax cross-entropy over the first attrs.vocab
 * columns of logits[...,Vp], one loss per row.  The forward pass also
 * writes the logits' gradient in place (dlogits, an alias of the logits),
 * so its gradient rule appends no op: it makes dlogits the logits'
 * gradient, the seed of the backward pass. */
#include <config.h>

#include "ops_internal.h"

enum { LOGITS, TARGETS };
enum { LOSSES, DLOGITS };

static flow_err_t cross_entropy_infer(const flow_graph_t *g,
				      const flow_graph_op_t *op,
				      flow_shape_t shapes_out[FLOW_OP_MAX_IO],
				      flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
				      flow_diag_t *diag)
{
	flow_err_t err;

	if ((err = flow_op_check_inputs(g, op, diag)) ||
	    (err = flow_op_check_rank(g, op, LOGITS, -1, "(...,Vp)", diag)))
		return err;
	const flow_graph_tensor_t *logits = &g->tensors[op->in[LOGITS]];
	const flow_shape_t *x = &logits->shape;
	flow_shape_t rows = *x;
	int64_t Vp = x->dims[x->ndim - 1];

	rows.dims[--rows.ndim] = 0;
	if (!flow_shape_equal(flow_op_in_shape(g, op, TARGETS), &rows))
		return flow_op_mismatch(g, op, TARGETS, LOGITS, diag, "%s",
					flow_shape_text(&rows).s);
	/* Split over ranks (attrs.split_axes), the logits hold columns
	 * [row_start, row_start + Vp) of the whole padded vocabulary. */
	if (op->attrs.vocab == 0 ||
	    (!op->attrs.split_axes && op->attrs.vocab > Vp))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: vocab %u is outside [1, Vp %lld]",
				     op->name, op->attrs.vocab, (long long)Vp);
	/* The gradient overwrites the logits, which must therefore be
	 * scratch of this step, not a parameter or a fed input. */
	if (logits->role != FLOW_ROLE_ACTIVATION)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: logits '%s' must be an op's output, "
				     "not a %s: the loss gradient overwrites "
				     "them in place",
				     op->name, logits->name,
				     flow_role_name(logits->role));
	shapes_out[LOSSES] = (flow_shape_t){
		.ndim = 1, .dims = { (int64_t)flow_shape_rows(x) } };
	shapes_out[DLOGITS] = *x;
	dtypes_out[LOSSES] = FLOW_DTYPE_F32;
	dtypes_out[DLOGITS] = logits->dtype;
	return FLOW_OK;
}

/* Only the loss op seeds the backward pass; a cross-entropy that is not
 * the loss (an evaluation head) sends no gradient. */
static flow_err_t cross_entropy_backward(flow_graph_t *g, int op,
					 flow_diag_t *diag)
{
	const flow_graph_op_t *f = &g->ops[op];
	flow_graph_tensor_t *logits = &g->tensors[f->in[LOGITS]];

	if (f->out[LOSSES] == g->loss && logits->requires_grad)
		logits->grad = f->out[DLOGITS];
	return FLOW_OK;
}

/* Rough arithmetic per real-vocabulary logit, for profiles: max, exp,
 * sum, normalise, gradient. */
static double cross_entropy_flops(const flow_graph_t *g,
				  const flow_graph_op_t *op)
{
	const flow_shape_t *x = flow_op_in_shape(g, op, LOGITS);
	int64_t cols = x->ndim ? x->dims[x->ndim - 1] : 1;
	int64_t real = (int64_t)op->attrs.vocab - op->attrs.row_start;

	real = real < 0 ? 0 : real < cols ? real : cols;
	return 5.0 * (double)flow_shape_rows(x) * (double)real;
}

/* ---- SBP signatures ---------------------------------------------------------
 *
 * Per mesh axis, one loss per row of logits[...,Vp]:
 *   rows   logits S(i) (i a row axis), targets S(i)
 *          -> losses S(j), dlogits S(i)
 *   vocab  logits S(last), targets B -> losses P, dlogits S(last)
 * rows: losses are flattened to [N], so S(i) reaches them only where
 * reshaping the row axes to the losses' shape carries it
 * (flow_sig_reshape_map), as for layernorm's statistics.
 * vocab is OneFlow's model-split sparse_softmax_cross_entropy_ms: the
 * padded vocabulary Vp is what is split (the kernel masks the columns
 * >= attrs.vocab on the rank whose part holds them, by global column), and
 * the log-sum-exp of a row spans the ranks.  OneFlow gathers the per-rank
 * row maxima and all-reduces the sums of exponentials; fused here, each
 * rank sends its row maximum and its sum of exp(x - that maximum), one
 * all-gather of 2 floats per row (gather_bytes = 8 N, N the query's rows),
 * from which every rank forms the global log-sum-exp and its own part of
 * softmax - onehot (dlogits, split as the logits).  The loss of a row is
 * then lse - logit[target] on the rank holding the target column and 0
 * elsewhere: P.  The optional second output dlogits (the graph op's
 * in-place logits gradient) is split as the logits in both forms. */

enum { CE_LOSSES, CE_DLOGITS };

/* Bytes each rank contributes per row to the vocab form's all-gather:
 * its row maximum and its sum of exponentials, f32. */
#define CE_GATHER_BYTES_PER_ROW 8

static flow_err_t cross_entropy_sig_rule(const flow_sig_query_t *q,
					 flow_sig_builder_t *b,
					 flow_diag_t *diag)
{
	const flow_shape_t *x = &q->in[LOGITS], *losses = &q->out[CE_LOSSES];
	flow_shape_t rows;
	int64_t Vp, n_rows, n_losses;
	int map[FLOW_MAX_DIMS];
	flow_err_t err;
	flow_sig_t *s;

	if ((err = flow_sig_check_rank(q, "logits", x, -1, "(...,Vp)", diag)))
		return err;
	Vp = x->dims[x->ndim - 1];
	rows = *x;
	rows.dims[--rows.ndim] = 0;
	if (!flow_shape_equal(&q->in[TARGETS], &rows))
		return flow_sig_mismatch(q, diag, "targets", &q->in[TARGETS],
					 "logits", x, "%s",
					 flow_shape_text(&rows).s);
	if (q->attrs.vocab > Vp)
		return flow_sig_bad(q, diag,
				    "vocab %u is more than Vp %lld",
				    q->attrs.vocab, (long long)Vp);
	if (!flow_sig_numel(&rows, &n_rows) ||
	    !flow_sig_numel(losses, &n_losses) || n_rows != n_losses)
		return flow_sig_mismatch(q, diag, "losses", losses, "logits",
					 x, "one loss per row, %zu",
					 flow_shape_rows(x));
	if (q->nout > CE_DLOGITS && !flow_shape_equal(&q->out[CE_DLOGITS], x))
		return flow_sig_mismatch(q, diag, "dlogits", &q->out[CE_DLOGITS],
					 "logits", x, "%s",
					 flow_shape_text(x).s);

	flow_sig_reshape_map(&rows, losses, q->axis_size, map);
	for (int i = 0; i < rows.ndim; i++) {
		if (map[i] < 0)
			continue;
		s = flow_sig_push(b, "rows");
		s->in[LOGITS] = s->in[TARGETS] = FLOW_SIG_S(i);
		s->out[CE_LOSSES] = FLOW_SIG_S(map[i]);
		s->out[CE_DLOGITS] = FLOW_SIG_S(i);
	}
	s = flow_sig_push(b, "vocab");
	s->in[LOGITS] = s->out[CE_DLOGITS] = FLOW_SIG_S(x->ndim - 1);
	s->out[CE_LOSSES] = FLOW_SIG_P;
	s->gather_bytes = (uint64_t)n_rows * CE_GATHER_BYTES_PER_ROW;
	return FLOW_OK;
}

static const flow_sig_op_t cross_entropy_sig = {
	.nin = 2,
	.nin_min = 2,
	.nout = 2,
	.nout_min = 1,
	.in_names = { "logits", "targets" },
	.out_names = { "losses", "dlogits" },
	.rule = cross_entropy_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_cross_entropy_info = {
	.def = {
		.kind = FLOW_OP_CROSS_ENTROPY,
		.name = "cross_entropy",
		.nin = 2,
		.nout = 2,
		.in_names = { "logits", "targets" },
		.out_names = { "losses", "dlogits" },
		.backward_kind = FLOW_OP_CROSS_ENTROPY,
		.infer = cross_entropy_infer,
		.backward = cross_entropy_backward,
		.flops = cross_entropy_flops,
		.scratch = flow_op_no_scratch,
	},
	.sig = &cross_entropy_sig,
	.i32_in = 1u << TARGETS,
	.act_in = 1u << LOGITS,
	.inplace_grad_out = 1u << DLOGITS,
};
