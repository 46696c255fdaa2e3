/* CPU layernorm over the last dimension (biased variance, eps
 * FLOW_LAYERNORM_EPS, as torch.nn.LayerNorm), forward and backward, and
 * its forward fused with the residual add before it. */
#include <config.h>

#include <math.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

/* One row: out = (x - mean) * rstd * weight + bias, with its mean and
 * rstd. */
static inline void layernorm_row(float *restrict o, float *mean, float *rstd,
				 const float *restrict x, const float *weight,
				 const float *bias, size_t C)
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
		o[c] = (x[c] - mf) * rs * weight[c] + bias[c];
	*mean = mf;
	*rstd = rs;
}

void flow_cpu_layernorm_forward(float *out, float *mean, float *rstd,
				const float *inp, const float *weight,
				const float *bias, size_t n, size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++)
		layernorm_row(out + r * C, &mean[r], &rstd[r], inp + r * C,
			      weight, bias, C);
}

/* The residual row is summed and normalised while it is in L1: the add's
 * float sums are residual_forward's, so the bits are the unfused pair's. */
void flow_cpu_residual_layernorm_forward(float *res, float *out, float *mean,
					 float *rstd, const float *a,
					 const float *b, const float *weight,
					 const float *bias, size_t n, size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++) {
		float *restrict x = res + r * C;
		const float *restrict xa = a + r * C;
		const float *restrict xb = b + r * C;
#pragma omp simd
		for (size_t c = 0; c < C; c++)
			x[c] = xa[c] + xb[c];
		layernorm_row(out + r * C, &mean[r], &rstd[r], x, weight, bias,
			      C);
	}
}

/* dweight[c] += sum_r dout*norm, dbias[c] += sum_r dout: whole channel
 * blocks per thread, rows in order (thread-count invariant, no scratch). */
static void layernorm_param_grads(float *dweight, float *dbias,
				  const float *dout, const float *inp,
				  const float *mean, const float *rstd,
				  size_t n, size_t C)
{
	size_t nblocks = (C + FLOW_CPU_COL_BLOCK - 1) / FLOW_CPU_COL_BLOCK;

#pragma omp parallel for schedule(static)
	for (size_t blk = 0; blk < nblocks; blk++) {
		size_t c0 = blk * FLOW_CPU_COL_BLOCK;
		size_t w = C - c0 < FLOW_CPU_COL_BLOCK ? C - c0 :
							 FLOW_CPU_COL_BLOCK;
		double aw[FLOW_CPU_COL_BLOCK] = { 0 };
		double ab[FLOW_CPU_COL_BLOCK] = { 0 };

		for (size_t r = 0; r < n; r++) {
			const float *restrict x = inp + r * C + c0;
			const float *restrict d = dout + r * C + c0;
			float m = mean[r], rs = rstd[r];
			for (size_t c = 0; c < w; c++) {
				aw[c] += d[c] * ((x[c] - m) * rs);
				ab[c] += d[c];
			}
		}
		if (dweight)
			for (size_t c = 0; c < w; c++)
				dweight[c0 + c] += (float)aw[c];
		if (dbias)
			for (size_t c = 0; c < w; c++)
				dbias[c0 + c] += (float)ab[c];
	}
}

/* One row of dinp += the gradient of the layernorm's input. */
static inline void layernorm_dinp_row(float *restrict g,
				      const float *restrict d,
				      const float *restrict x,
				      const float *weight, float m, float rs,
				      size_t C)
{
	double sd = 0.0, sdn = 0.0;

	/* dx = rstd * (dn - mean(dn) - n * mean(dn * n)) with n the
	 * normalised input and dn = dout * weight. */
#pragma omp simd reduction(+ : sd, sdn)
	for (size_t c = 0; c < C; c++) {
		float dn = d[c] * weight[c];
		sd += dn;
		sdn += dn * ((x[c] - m) * rs);
	}
	float mdn = (float)(sd / (double)C);
	float mdnn = (float)(sdn / (double)C);
	for (size_t c = 0; c < C; c++) {
		float nrm = (x[c] - m) * rs;
		float dn = d[c] * weight[c];
		g[c] += (dn - mdn - nrm * mdnn) * rs;
	}
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
					   C);
	}
	if (dweight || dbias)
		layernorm_param_grads(dweight, dbias, dout, inp, mean, rstd,
				      n, C);
}

/* dres's row is added into da and db while it is in L1, each a float
 * addition as residual_backward's: the bits of the unfused pair. */
void flow_cpu_layernorm_residual_backward(float *dres, float *da, float *db,
					  float *dweight, float *dbias,
					  const float *dout, const float *res,
					  const float *weight,
					  const float *mean, const float *rstd,
					  size_t n, size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++) {
		float *restrict g = dres + r * C;
		layernorm_dinp_row(g, dout + r * C, res + r * C, weight,
				   mean[r], rstd[r], C);
		if (da && db) { /* one pass over g for both */
			float *restrict ga = da + r * C;
			float *restrict gb = db + r * C;
#pragma omp simd
			for (size_t c = 0; c < C; c++) {
				ga[c] += g[c];
				gb[c] += g[c];
			}
		} else if (da || db) {
			float *restrict gx = (da ? da : db) + r * C;
#pragma omp simd
			for (size_t c = 0; c < C; c++)
				gx[c] += g[c];
		}
	}
	if (dweight || dbias)
		layernorm_param_grads(dweight, dbias, dout, res, mean, rstd,
				      n, C);
}
