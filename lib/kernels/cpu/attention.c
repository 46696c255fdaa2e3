/* CPU causal multi-head self-attention, forward and backward.
 *
 * The T x T x hs products of each (batch, head) pair are GEMMs handed to
 * cblas_sgemm, one pair after another, so the BLAS's own threads run each
 * of them at GEMM speed (hand-written dot-product loops reached a tenth of
 * it).  They are issued outside any OpenMP region: a threaded OpenBLAS
 * called from inside one would start a pool on top of ours.  The GEMMs
 * also fill the masked upper triangle; that costs at most twice the causal
 * work and is overwritten.  The row-wise softmax and its backward,
 * dpre = att * (datt - sum_j att*datt) (O(T) per row, not llm.c's O(T^2)
 * Jacobian), run across the (head, row) pairs of a batch row with OpenMP.
 *
 * Only lse leaves the forward pass (the contract in flow/kernels.h): the
 * probabilities of one batch row at a time live in scratch, and backward
 * recomputes them from the same GEMM on the same inputs, so they are the
 * forward pass's bits. */
#include <config.h>

#include <math.h>
#include <string.h>

#include <cblas.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

/* att (NH,T,T) = scale * q . k^T for batch row b. */
static void attention_scores(float *att, const float *qkv, size_t b,
			     size_t T, size_t C, size_t NH)
{
	const size_t hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
	const int t = (int)T, h3 = (int)C3, k = (int)hs;

	for (size_t h = 0; h < NH; h++) {
		const float *q = qkv + b * T * C3 + h * hs;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, k,
			    scale, q, h3, q + C, h3, 0.0f, att + h * T * T, t);
	}
}

/* Row t of scores in place: exp(score - lse) over columns [0, t], zero
 * after.  Returns lse = max + log(sum exp(score - max)): exp(x - max)
 * never overflows and the row has a term equal to 1, so the sum is >= 1. */
static float attention_softmax_row(float *restrict a, size_t t, size_t T)
{
	float maxv = a[0], sum = 0.0f;

	for (size_t j = 1; j <= t; j++)
		maxv = a[j] > maxv ? a[j] : maxv;
	for (size_t j = 0; j <= t; j++)
		sum += flow_cpu_expf(a[j] - maxv);
	float lse = maxv + logf(sum);
	for (size_t j = 0; j <= t; j++)
		a[j] = flow_cpu_expf(a[j] - lse);
	for (size_t j = t + 1; j < T; j++)
		a[j] = 0.0f;
	return lse;
}

/* The forward pass's probabilities again, from its lse. */
static void attention_probs_row(float *restrict a, float lse, size_t t,
				size_t T)
{
	for (size_t j = 0; j <= t; j++)
		a[j] = flow_cpu_expf(a[j] - lse);
	for (size_t j = t + 1; j < T; j++)
		a[j] = 0.0f;
}

void flow_cpu_attention_forward(float *out, float *lse, void *scratch,
				const float *qkv, size_t B, size_t T,
				size_t C, size_t NH)
{
	const size_t hs = C / NH, C3 = 3 * C;
	const int t = (int)T, h3 = (int)C3, c = (int)C, k = (int)hs;
	float *att = scratch;

	for (size_t b = 0; b < B; b++) {
		attention_scores(att, qkv, b, T, C, NH);
		float *l = lse + b * NH * T;
#pragma omp parallel for schedule(static)
		for (size_t r = 0; r < NH * T; r++)
			l[r] = attention_softmax_row(att + r * T, r % T, T);
		/* out = att . v, each head into its hs columns. */
		for (size_t h = 0; h < NH; h++) {
			const float *v = qkv + b * T * C3 + 2 * C + h * hs;
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t,
				    k, t, 1.0f, att + h * T * T, t, v, h3, 0.0f,
				    out + b * T * C + h * hs, c);
		}
	}
}

size_t flow_cpu_attention_scratch_bound(size_t B, size_t T, size_t C,
					size_t NH)
{
	(void)B;
	(void)C;
	/* att and datt of one batch row. */
	return 2 * NH * T * T * sizeof(float);
}

void flow_cpu_attention_backward(float *dqkv, void *scratch,
				 const float *dout, const float *qkv,
				 const float *lse, size_t B, size_t T,
				 size_t C, size_t NH)
{
	const size_t hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
	const int t = (int)T, h3 = (int)C3, c = (int)C, k = (int)hs;
	float *att = scratch, *datt = att + NH * T * T;

	for (size_t b = 0; b < B; b++) {
		const float *l = lse + b * NH * T;

		attention_scores(att, qkv, b, T, C, NH);
#pragma omp parallel for schedule(static)
		for (size_t r = 0; r < NH * T; r++)
			attention_probs_row(att + r * T, l[r], r % T, T);

		/* out = att . v: datt = dout . v^T and dv += att^T . dout. */
		for (size_t h = 0; h < NH; h++) {
			const float *v = qkv + b * T * C3 + 2 * C + h * hs;
			const float *d = dout + b * T * C + h * hs;
			const float *a = att + h * T * T;
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t,
				    t, k, 1.0f, d, c, v, h3, 0.0f,
				    datt + h * T * T, t);
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t,
				    k, t, 1.0f, a, t, d, c, 1.0f,
				    dqkv + b * T * C3 + 2 * C + h * hs, h3);
		}

		/* Softmax backward in place, masked entries to 0. */
#pragma omp parallel for schedule(static)
		for (size_t r = 0; r < NH * T; r++) {
			const float *restrict a = att + r * T;
			float *restrict g = datt + r * T;
			size_t row = r % T;
			float s = 0.0f;

			for (size_t j = 0; j <= row; j++)
				s += a[j] * g[j];
			for (size_t j = 0; j <= row; j++)
				g[j] = a[j] * (g[j] - s);
			for (size_t j = row + 1; j < T; j++)
				g[j] = 0.0f;
		}

		/* pre = scale q . k^T: dq += scale dpre . k,
		 * dk += scale dpre^T . q. */
		for (size_t h = 0; h < NH; h++) {
			const float *q = qkv + b * T * C3 + h * hs;
			float *dq = dqkv + b * T * C3 + h * hs;
			const float *g = datt + h * T * T;
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t,
				    k, t, scale, g, t, q + C, h3, 1.0f, dq, h3);
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t,
				    k, t, scale, g, t, q, h3, 1.0f, dq + C, h3);
		}
	}
}
