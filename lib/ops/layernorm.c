/* layernorm over the last dimension: out = (x - mean) * rstd * weight +
 * bias, saving mean and rstd (one per row) for the backward op, which
 * writes dx, dweight and dbias. */
#include <config.h>

#include "ops_internal.h"

enum { X, WEIGHT, BIAS };
enum { OUT, MEAN, RSTD };

static flow_err_t layernorm_infer(const flow_graph_t *g,
				  const flow_graph_op_t *op,
				  flow_shape_t shapes_out[FLOW_OP_MAX_IO],
				  flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
				  flow_diag_t *diag)
{
	flow_err_t err;

	if ((err = flow_op_check_inputs(g, op, diag)) ||
	    (err = flow_op_check_rank(g, op, X, -1, "(...,C)", diag)) ||
	    (err = flow_op_check_rank(g, op, WEIGHT, 1, "(C)", diag)) ||
	    (err = flow_op_check_rank(g, op, BIAS, 1, "(C)", diag)))
		return err;
	const flow_shape_t *x = flow_op_in_shape(g, op, X);
	int64_t C = x->dims[x->ndim - 1];

	if (flow_op_in_shape(g, op, WEIGHT)->dims[0] != C)
		return flow_op_mismatch(g, op, WEIGHT, X, diag, "(%lld)",
					(long long)C);
	if (flow_op_in_shape(g, op, BIAS)->dims[0] != C)
		return flow_op_mismatch(g, op, BIAS, X, diag, "(%lld)",
					(long long)C);
	shapes_out[OUT] = *x;
	shapes_out[MEAN] = (flow_shape_t){
		.ndim = 1, .dims = { (int64_t)flow_shape_rows(x) } };
	shapes_out[RSTD] = shapes_out[MEAN];
	dtypes_out[OUT] = g->act_dtype;
	dtypes_out[MEAN] = dtypes_out[RSTD] = FLOW_DTYPE_F32;
	return FLOW_OK;
}

/* Rough arithmetic per element, for profiles: forward 8 (mean, variance,
 * normalise, scale and shift); backward 16 (xhat, the two row sums, dx, and
 * the dweight and dbias sums). */
static double layernorm_flops(const flow_graph_t *g, const flow_graph_op_t *op)
{
	return 8.0 * flow_shape_elems(flow_op_in_shape(g, op, X));
}

static double layernorm_backward_flops(const flow_graph_t *g,
				       const flow_graph_op_t *op)
{
	return 16.0 * flow_shape_elems(flow_op_in_shape(g, op, 0));
}

/* ---- SBP signatures ---------------------------------------------------------
 *
 * Per mesh axis, layernorm normalises each row (all but the last axis):
 *   rows   x S(i) (i a row axis), weight B, bias B
 *          -> out S(i), mean S(j), rstd S(j)
 * Never the normalised axis.  mean and rstd hold one value per row, here
 * flattened to [N]: S(i) of x is a split of them only where reshaping the
 * row axes to their shape carries it (flow_sig_reshape_map: the outermost
 * row axis of more than one row, when the parts of both hold the same
 * rows), so with rows [B,T] and stats [B*T], x S(0) -> mean S(0) needs B
 * and B*T divisible by the mesh axis (or T = 1) and x S(1) has no form.
 * Asked without mean and rstd (nout 1), every row axis splits.
 * layernorm_param_grad (dout, x, mean, rstd) -> (dweight, dbias):
 *   rows   dout S(i), x S(i), mean S(j), rstd S(j) -> dweight P, dbias P
 * as OneFlow's layer_norm_param_grad: each rank sums its own rows. */

enum { LN_DOUT = 0 };

/* map_out[i]: the axis of stats that S(i) of x gives, -1 for none; false
 * when stats does not hold one value per row of x. */
static bool layernorm_rows_map(const flow_shape_t *x,
			       const flow_shape_t *stats, int64_t axis_size,
			       int map_out[FLOW_MAX_DIMS])
{
	flow_shape_t rows = *x;
	int64_t n_rows, n_stats;

	rows.dims[--rows.ndim] = 0;
	if (!flow_sig_numel(&rows, &n_rows) ||
	    !flow_sig_numel(stats, &n_stats) || n_rows != n_stats)
		return false;
	flow_sig_reshape_map(&rows, stats, axis_size, map_out);
	return true;
}

/* x (...,C), the params (C) and, from stats_first on (nstats of them, in
 * the query's inputs or outputs), the per-row statistics. */
static flow_err_t layernorm_check_stats(const flow_sig_query_t *q,
					const flow_shape_t *x,
					const flow_shape_t *stats,
					const char *const *names, int nstats,
					int map_out[FLOW_MAX_DIMS],
					flow_diag_t *diag)
{
	for (int i = 0; i < FLOW_MAX_DIMS; i++)
		map_out[i] = i;
	for (int k = 0; k < nstats; k++) {
		if (!layernorm_rows_map(x, &stats[k], q->axis_size, map_out))
			return flow_sig_mismatch(
				q, diag, names[k], &stats[k], "x", x,
				"one value per row, %zu",
				flow_shape_rows(x));
		if (k > 0 && !flow_shape_equal(&stats[k], &stats[0]))
			return flow_sig_mismatch(q, diag, names[k], &stats[k],
						 names[0], &stats[0], "%s",
						 flow_shape_text(&stats[0]).s);
	}
	return FLOW_OK;
}

static flow_err_t layernorm_check_param(const flow_sig_query_t *q,
					const char *name,
					const flow_shape_t *p,
					const flow_shape_t *x,
					flow_diag_t *diag)
{
	int64_t C = x->dims[x->ndim - 1];
	flow_err_t err = flow_sig_check_rank(q, name, p, 1, "(C)", diag);

	if (err == FLOW_OK && p->dims[0] != C)
		err = flow_sig_mismatch(q, diag, name, p, "x", x, "(%lld)",
					(long long)C);
	return err;
}

static flow_err_t layernorm_sig_rule(const flow_sig_query_t *q,
				     flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_shape_t *x = &q->in[X];
	int map[FLOW_MAX_DIMS];
	flow_err_t err;

	if ((err = flow_sig_check_rank(q, "x", x, -1, "(...,C)", diag)) ||
	    (err = layernorm_check_param(q, "weight", &q->in[WEIGHT], x,
					 diag)) ||
	    (err = layernorm_check_param(q, "bias", &q->in[BIAS], x, diag)))
		return err;
	if (!flow_shape_equal(&q->out[OUT], x))
		return flow_sig_mismatch(q, diag, "out", &q->out[OUT], "x", x,
					 "%s", flow_shape_text(x).s);
	if ((err = layernorm_check_stats(q, x, &q->out[MEAN],
					 b->op->out_names + MEAN,
					 q->nout - MEAN, map, diag)))
		return err;
	for (int i = 0; i + 1 < x->ndim; i++) {
		flow_sig_t *s;

		if (map[i] < 0)
			continue;
		s = flow_sig_push(b, "rows");
		s->in[X] = s->out[OUT] = FLOW_SIG_S(i);
		s->out[MEAN] = s->out[RSTD] = FLOW_SIG_S(map[i]);
	}
	return FLOW_OK;
}

static const flow_sig_op_t layernorm_sig = {
	.nin = 3,
	.nin_min = 3,
	.nout = 3,
	.nout_min = 1,
	.in_names = { "x", "weight", "bias" },
	.out_names = { "out", "mean", "rstd" },
	.rule = layernorm_sig_rule,
};

enum { PG_DOUT, PG_X, PG_MEAN, PG_RSTD };
enum { PG_DWEIGHT, PG_DBIAS };

static flow_err_t layernorm_param_grad_sig_rule(const flow_sig_query_t *q,
						flow_sig_builder_t *b,
						flow_diag_t *diag)
{
	const flow_shape_t *x = &q->in[PG_X];
	int map[FLOW_MAX_DIMS];
	flow_err_t err;

	if ((err = flow_sig_check_rank(q, "x", x, -1, "(...,C)", diag)))
		return err;
	if (!flow_shape_equal(&q->in[PG_DOUT], x))
		return flow_sig_mismatch(q, diag, "dout", &q->in[PG_DOUT], "x",
					 x, "%s", flow_shape_text(x).s);
	if ((err = layernorm_check_stats(q, x, &q->in[PG_MEAN],
					 b->op->in_names + PG_MEAN, 2, map,
					 diag)) ||
	    (err = layernorm_check_param(q, "dweight", &q->out[PG_DWEIGHT], x,
					 diag)) ||
	    (err = layernorm_check_param(q, "dbias", &q->out[PG_DBIAS], x,
					 diag)))
		return err;
	for (int i = 0; i + 1 < x->ndim; i++) {
		flow_sig_t *s;

		if (map[i] < 0)
			continue;
		s = flow_sig_push(b, "rows");
		s->in[PG_DOUT] = s->in[PG_X] = FLOW_SIG_S(i);
		s->in[PG_MEAN] = s->in[PG_RSTD] = FLOW_SIG_S(map[i]);
		s->out[PG_DWEIGHT] = s->out[PG_DBIAS] = FLOW_SIG_P;
	}
	return FLOW_OK;
}

static const flow_sig_op_t layernorm_param_grad_sig = {
	.nin = 4,
	.nin_min = 4,
	.nout = 2,
	.nout_min = 2,
	.in_names = { "dout", "x", "mean", "rstd" },
	.out_names = { "dweight", "dbias" },
	.rule = layernorm_param_grad_sig_rule,
};

/* The backward op's, by the adjoint (flow_sig_adjoint): rows reads dout,
 * x, mean, rstd split alike and gives dx S(i), dweight and dbias P, the
 * param-grad form above with dx. */
static flow_err_t layernorm_backward_sig_rule(const flow_sig_query_t *q,
					      flow_sig_builder_t *b,
					      flow_diag_t *diag)
{
	flow_sig_query_t f = { .op = "layernorm", .nin = 3, .nout = 3,
			       .attrs = q->attrs,
			       .axis_size = q->axis_size };

	f.in[X] = q->in[1];
	f.in[WEIGHT] = q->in[2];
	f.in[BIAS] = q->out[2];
	f.in_present[X] = f.in_present[WEIGHT] = f.in_present[BIAS] = true;
	f.out[OUT] = q->in[LN_DOUT];
	f.out[MEAN] = q->in[3];
	f.out[RSTD] = q->in[4];
	return flow_sig_adjoint(&f, &flow_op_layernorm_info, b, diag);
}

static const flow_sig_op_t layernorm_backward_sig = {
	.nin = 5,
	.nin_min = 5,
	.nout = 3,
	.nout_min = 3,
	.in_names = { "dout", "x", "weight", "mean", "rstd" },
	.out_names = { "dx", "dweight", "dbias" },
	.rule = layernorm_backward_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_layernorm_info = {
	.def = {
		.kind = FLOW_OP_LAYERNORM,
		.name = "layernorm",
		.nin = 3,
		.nout = 3,
		.in_names = { "x", "weight", "bias" },
		.out_names = { "out", "mean", "rstd" },
		.backward_kind = FLOW_OP_LAYERNORM_BACKWARD,
		.infer = layernorm_infer,
		.backward = flow_op_backward_rule,
		.flops = layernorm_flops,
		.scratch = flow_op_no_scratch,
	},
	.sig = &layernorm_sig,
	.saved_out = 1u << MEAN | 1u << RSTD,
	.nsaved = 4,
	.saved = { FLOW_OP_FWD_IN(X), FLOW_OP_FWD_IN(WEIGHT),
		   FLOW_OP_FWD_OUT(MEAN), FLOW_OP_FWD_OUT(RSTD) },
};

const flow_op_info_t flow_op_layernorm_backward_info = {
	.def = {
		.kind = FLOW_OP_LAYERNORM_BACKWARD,
		.name = "layernorm_backward",
		.nin = 5,
		.nout = 3,
		.in_names = { "dout", "x", "weight", "mean", "rstd" },
		.out_names = { "dx", "dweight", "dbias" },
		.accumulates = 7,
		.backward_kind = FLOW_OP_LAYERNORM_BACKWARD,
		.infer = flow_op_backward_infer,
		.flops = layernorm_backward_flops,
		.scratch = flow_op_no_scratch,
	},
	.sig = &layernorm_backward_sig,
};

const flow_op_info_t flow_op_layernorm_param_grad_info = {
	.def = {
		.kind = FLOW_OP_LAYERNORM_PARAM_GRAD,
		.name = "layernorm_param_grad",
	},
	.sig = &layernorm_param_grad_sig,
};
