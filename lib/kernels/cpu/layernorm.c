/* CPU layernorm over the last dimension (biased variance, eps
 * FLOW_LAYERNORM_EPS, as torch.nn.LayerNorm), forward and backward, its
 * forward fused with the residual add before it, and their bf16 twins,
 * which share the loops below (cpu_internal.h): the input and the residual
 * stream stay fp32; the normalised output, its gradient and the branch of
 * the add are bf16. */
#include <config.h>

#include <math.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

/* One row: out = (x - mean) * rstd * weight + bias, with its mean and
 * rstd. */
FLOW_CPU_INLINE void layernorm_row(void *o, float *mean, float *rstd,
				   const float *restrict x, const float *weight,
				   const float *bias, size_t C, bool bf16)
{
	double s = 0.0, ss = 0.0;

	/* Two passes in double: the one-pass E[x^2]-E[x]^2 loses everything
	 * when |mean| >> std (e.g. a residual stream with an offset), and the
	 * double sums keep C=768..4096 at float rounding.  The simd reduction
	 * order is fixed at compile time, so it is thread-count invariant. */
#pragma omp simd reduction(+ : s)
	for (size_t c = 0; c < C; c++)
		s += x[c];
	double m = s / (double)C;
#pragma omp simd reduction(+ : ss)
	for (size_t c = 0; c < C; c++) {
		double d = x[c] - m;
		ss += d * d;
	}
	float mf = (float)m;
	float rs = (float)(1.0 / sqrt(ss / (double)C +
				      (double)FLOW_LAYERNORM_EPS));
	for (size_t c = 0; c < C; c++)
		flow_cpu_act_store(o, c, (x[c] - mf) * rs * weight[c] + bias[c],
				   bf16);
	*mean = mf;
	*rstd = rs;
}

/* One row of the residual add and the layernorm of its sum: the add's
 * float sums are residual_forward's, and the row is normalised while it
 * is in L1, so the bits are the unfused pair's. */
FLOW_CPU_INLINE void residual_layernorm_row(float *restrict x, void *o,
					    float *mean, float *rstd,
					    const float *restrict xa,
					    const void *xb,
					    const float *weight,
					    const float *bias, size_t C,
					    bool bf16)
{
#pragma omp simd
	for (size_t c = 0; c < C; c++)
		x[c] = xa[c] + flow_cpu_act_load(xb, c, bf16);
	layernorm_row(o, mean, rstd, x, weight, bias, C, bf16);
}

/* Columns [blk * FLOW_CPU_COL_BLOCK, +64) of dweight += sum_r dout*norm
 * and dbias += sum_r dout: a whole channel block per thread, rows in
 * order (thread-count invariant, no scratch). */
FLOW_CPU_INLINE void layernorm_param_block(float *dweight, float *dbias,
					   const void *dout, const float *inp,
					   const float *mean, const float *rstd,
					   size_t n, size_t C, size_t blk,
					   bool bf16)
{
	size_t c0 = blk * FLOW_CPU_COL_BLOCK;
	size_t w = C - c0 < FLOW_CPU_COL_BLOCK ? C - c0 : FLOW_CPU_COL_BLOCK;
	double aw[FLOW_CPU_COL_BLOCK] = { 0 };
	double ab[FLOW_CPU_COL_BLOCK] = { 0 };

	for (size_t r = 0; r < n; r++) {
		const float *restrict x = inp + r * C + c0;
		float m = mean[r], rs = rstd[r];
		for (size_t c = 0; c < w; c++) {
			float d = flow_cpu_act_load(dout, r * C + c0 + c, bf16);
			aw[c] += d * ((x[c] - m) * rs);
			ab[c] += d;
		}
	}
	if (dweight)
		for (size_t c = 0; c < w; c++)
			dweight[c0 + c] += (float)aw[c];
	if (dbias)
		for (size_t c = 0; c < w; c++)
			dbias[c0 + c] += (float)ab[c];
}

static void layernorm_param_grads(float *dweight, float *dbias,
				  const float *dout, const float *inp,
				  const float *mean, const float *rstd,
				  size_t n, size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t blk = 0; blk < flow_cpu_col_blocks(C); blk++)
		layernorm_param_block(dweight, dbias, dout, inp, mean, rstd, n,
				      C, blk, false);
}

static void layernorm_param_grads_bf16(float *dweight, float *dbias,
				       const flow_bf16_t *dout,
				       const float *inp, const float *mean,
				       const float *rstd, size_t n, size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t blk = 0; blk < flow_cpu_col_blocks(C); blk++)
		layernorm_param_block(dweight, dbias, dout, inp, mean, rstd, n,
				      C, blk, true);
}

/* One row of g += the gradient of the layernorm's input, d the row of
 * dout. */
FLOW_CPU_INLINE void layernorm_dinp_row(float *restrict g, const void *d,
					const float *restrict x,
					const float *weight, float m, float rs,
					size_t C, bool bf16)
{
	double sd = 0.0, sdn = 0.0;

	/* dx = rstd * (dn - mean(dn) - n * mean(dn * n)) with n the
	 * normalised input and dn = dout * weight. */
#pragma omp simd reduction(+ : sd, sdn)
	for (size_t c = 0; c < C; c++) {
		float dn = flow_cpu_act_load(d, c, bf16) * weight[c];
		sd += dn;
		sdn += dn * ((x[c] - m) * rs);
	}
	float mdn = (float)(sd / (double)C);
	float mdnn = (float)(sdn / (double)C);
	for (size_t c = 0; c < C; c++) {
		float nrm = (x[c] - m) * rs;
		float dn = flow_cpu_act_load(d, c, bf16) * weight[c];
		g[c] += (dn - mdn - nrm * mdnn) * rs;
	}
}

/* One row of the backward pair: g, the row of dres, += the layernorm's
 * input gradient, then added into da's and db's rows (each optional),
 * each a float addition as residual_backward's: the bits of the unfused
 * pair, while g is in L1. */
FLOW_CPU_INLINE void layernorm_residual_row(float *restrict g,
					    float *restrict ga, void *gb,
					    const void *d,
					    const float *restrict x,
					    const float *weight, float m,
					    float rs, size_t C, bool bf16)
{
	layernorm_dinp_row(g, d, x, weight, m, rs, C, bf16);
	if (ga && gb) { /* one pass over g for both */
#pragma omp simd
		for (size_t c = 0; c < C; c++) {
			ga[c] += g[c];
			flow_cpu_act_add(gb, c, g[c], bf16);
		}
	} else if (ga) {
#pragma omp simd
		for (size_t c = 0; c < C; c++)
			ga[c] += g[c];
	} else if (gb) {
#pragma omp simd
		for (size_t c = 0; c < C; c++)
			flow_cpu_act_add(gb, c, g[c], bf16);
	}
}

/* ---- the kernels: each its parallel loop over the functions above ------- */

void flow_cpu_layernorm_forward(float *out, float *mean, float *rstd,
				const float *inp, const float *weight,
				const float *bias, size_t n, size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++)
		layernorm_row(out + r * C, &mean[r], &rstd[r], inp + r * C,
			      weight, bias, C, false);
}

void flow_cpu_layernorm_bf16_forward(flow_bf16_t *out, float *mean,
				     float *rstd, const float *inp,
				     const float *weight, const float *bias,
				     size_t n, size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++)
		layernorm_row(out + r * C, &mean[r], &rstd[r], inp + r * C,
			      weight, bias, C, true);
}

void flow_cpu_residual_layernorm_forward(float *res, float *out, float *mean,
					 float *rstd, const float *a,
					 const float *b, const float *weight,
					 const float *bias, size_t n, size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++)
		residual_layernorm_row(res + r * C, out + r * C, &mean[r],
				       &rstd[r], a + r * C, b + r * C, weight,
				       bias, C, false);
}

void flow_cpu_residual_layernorm_bf16_forward(float *res, flow_bf16_t *out,
					      float *mean, float *rstd,
					      const float *a,
					      const flow_bf16_t *b,
					      const float *weight,
					      const float *bias, size_t n,
					      size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++)
		residual_layernorm_row(res + r * C, out + r * C, &mean[r],
				       &rstd[r], a + r * C, b + r * C, weight,
				       bias, C, true);
}

void flow_cpu_layernorm_backward(float *dinp, float *dweight, float *dbias,
				 const float *dout, const float *inp,
				 const float *weight, const float *mean,
				 const float *rstd, size_t n, size_t C)
{
	if (dinp) {
#pragma omp parallel for schedule(static)
		for (size_t r = 0; r < n; r++)
			layernorm_dinp_row(dinp + r * C, dout + r * C,
					   inp + r * C, weight, mean[r], rstd[r],
					   C, false);
	}
	if (dweight || dbias)
		layernorm_param_grads(dweight, dbias, dout, inp, mean, rstd,
				      n, C);
}

void flow_cpu_layernorm_bf16_backward(float *dinp, float *dweight,
				      float *dbias, const flow_bf16_t *dout,
				      const float *inp, const float *weight,
				      const float *mean, const float *rstd,
				      size_t n, size_t C)
{
	if (dinp) {
#pragma omp parallel for schedule(static)
		for (size_t r = 0; r < n; r++)
			layernorm_dinp_row(dinp + r * C, dout + r * C,
					   inp + r * C, weight, mean[r], rstd[r],
					   C, true);
	}
	if (dweight || dbias)
		layernorm_param_grads_bf16(dweight, dbias, dout, inp, mean,
					   rstd, n, C);
}

void flow_cpu_layernorm_residual_backward(float *dres, float *da, float *db,
					  float *dweight, float *dbias,
					  const float *dout, const float *res,
					  const float *weight,
					  const float *mean, const float *rstd,
					  size_t n, size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++)
		layernorm_residual_row(dres + r * C, da ? da + r * C : NULL,
				       db ? db + r * C : NULL, dout + r * C,
				       res + r * C, weight, mean[r], rstd[r],
				       C, false);
	if (dweight || dbias)
		layernorm_param_grads(dweight, dbias, dout, res, mean, rstd,
				      n, C);
}

void flow_cpu_layernorm_residual_bf16_backward(
	float *dres, float *da, flow_bf16_t *db, float *dweight, float *dbias,
	const flow_bf16_t *dout, const float *res, const float *weight,
	const float *mean, const float *rstd, size_t n, size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++)
		layernorm_residual_row(dres + r * C, da ? da + r * C : NULL,
				       db ? db + r * C : NULL, dout + r * C,
				       res + r * C, weight, mean[r], rstd[r],
				       C, true);
	if (dweight || dbias)
		layernorm_param_grads_bf16(dweight, dbias, dout, res, mean,
					   rstd, n, C);
}
