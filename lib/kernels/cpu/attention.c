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
 * forward pass's bits.  The bf16 twins widen a batch row's qkv, dout and
 * dqkv into scratch, round the probabilities and dpre in place where they
 * multiply, and round the row's out and dqkv back: the products of bf16
 * values are exact in fp32, so the sgemms then sum what a GPU's tensor
 * cores do. */
#include <config.h>

#include <math.h>
#include <string.h>

#include <cblas.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

/* The scratch of one batch row: the probabilities and their gradient, and
 * for the bf16 twins the row's qkv, out or dout, and dqkv widened (NULL
 * for fp32, which has no room for them). */
typedef struct {
	float *att, *datt; /* (NH,T,T) */
	float *qkv;        /* (T,3C) */
	float *out;        /* (T,C): out forward, dout backward */
	float *dqkv;       /* (T,3C) */
} attention_scratch_t;

static attention_scratch_t attention_carve(void *scratch, size_t T, size_t C,
					   size_t NH, bool bf16)
{
	attention_scratch_t s = { NULL, NULL, NULL, NULL, NULL };

	s.att = scratch;
	s.datt = s.att + NH * T * T;
	if (bf16) {
		s.qkv = s.datt + NH * T * T;
		s.out = s.qkv + 3 * T * C;
		s.dqkv = s.out + T * C;
	}
	return s;
}

/* att (NH,T,T) = scale * q . k^T for one batch row of qkv (T,3C). */
static void attention_scores(float *att, const float *qkv, size_t T,
			     size_t C, size_t NH)
{
	const size_t hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
	const int t = (int)T, h3 = (int)C3, k = (int)hs;

	for (size_t h = 0; h < NH; h++) {
		const float *q = qkv + h * hs;
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

/* One batch row of the forward pass: out (T,C) = softmax(q.k^T) . v and
 * lse (NH,T) from qkv (T,3C), the probabilities rounded to bf16 where
 * they multiply when bf16. */
static void attention_forward_row(float *out, float *lse, float *att,
				  const float *x, size_t T, size_t C,
				  size_t NH, bool bf16)
{
	const size_t hs = C / NH;
	const int t = (int)T, h3 = (int)(3 * C), c = (int)C, k = (int)hs;

	attention_scores(att, x, T, C, NH);
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < NH * T; r++)
		lse[r] = attention_softmax_row(att + r * T, r % T, T);
	if (bf16)
		flow_cpu_round_bf16(att, att, NH * T * T);
	/* out = att . v, each head into its hs columns. */
	for (size_t h = 0; h < NH; h++)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, k, t,
			    1.0f, att + h * T * T, t, x + 2 * C + h * hs, h3,
			    0.0f, out + h * hs, c);
}

/* One batch row of the backward pass: dx (T,3C) += the gradient from g
 * (T,C), with x the row's qkv and lse its forward pass's, the
 * probabilities and dpre rounded to bf16 where they multiply when bf16. */
static void attention_backward_row(float *dx, float *att, float *datt,
				   const float *g, const float *x,
				   const float *lse, size_t T, size_t C,
				   size_t NH, bool bf16)
{
	const size_t hs = C / NH;
	const float scale = 1.0f / sqrtf((float)hs);
	const int t = (int)T, h3 = (int)(3 * C), c = (int)C, k = (int)hs;

	attention_scores(att, x, T, C, NH);
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < NH * T; r++)
		attention_probs_row(att + r * T, lse[r], r % T, T);

	/* datt = dout . v^T. */
	for (size_t h = 0; h < NH; h++)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, k,
			    1.0f, g + h * hs, c, x + 2 * C + h * hs, h3, 0.0f,
			    datt + h * T * T, t);

	/* dpre = scale att (datt - sum_j att datt) in place, masked entries
	 * to 0. */
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < NH * T; r++) {
		const float *restrict a = att + r * T;
		float *restrict d = datt + r * T;
		size_t row = r % T;
		float sum = 0.0f;

		for (size_t j = 0; j <= row; j++)
			sum += a[j] * d[j];
		for (size_t j = 0; j <= row; j++)
			d[j] = scale * (a[j] * (d[j] - sum));
		for (size_t j = row + 1; j < T; j++)
			d[j] = 0.0f;
	}
	if (bf16) {
		flow_cpu_round_bf16(att, att, NH * T * T);
		flow_cpu_round_bf16(datt, datt, NH * T * T);
	}

	/* dv += att^T . dout; pre = scale q . k^T: dq += dpre . k,
	 * dk += dpre^T . q. */
	for (size_t h = 0; h < NH; h++) {
		const float *a = att + h * T * T;
		const float *d = datt + h * T * T;
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, k, t,
			    1.0f, a, t, g + h * hs, c, 1.0f, dx + 2 * C + h * hs,
			    h3);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, k, t,
			    1.0f, d, t, x + C + h * hs, h3, 1.0f, dx + h * hs,
			    h3);
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, k, t,
			    1.0f, d, t, x + h * hs, h3, 1.0f, dx + C + h * hs,
			    h3);
	}
}

void flow_cpu_attention_forward(float *out, float *lse, void *scratch,
				const float *qkv, size_t B, size_t T, size_t C,
				size_t NH)
{
	attention_scratch_t s = attention_carve(scratch, T, C, NH, false);

	for (size_t b = 0; b < B; b++)
		attention_forward_row(out + b * T * C, lse + b * NH * T, s.att,
				      qkv + b * T * 3 * C, T, C, NH, false);
}

void flow_cpu_attention_bf16_forward(flow_bf16_t *out, float *lse,
				     void *scratch, const flow_bf16_t *qkv,
				     size_t B, size_t T, size_t C, size_t NH)
{
	attention_scratch_t s = attention_carve(scratch, T, C, NH, true);

	for (size_t b = 0; b < B; b++) {
		flow_cpu_widen_bf16(s.qkv, qkv + b * T * 3 * C, T * 3 * C);
		attention_forward_row(s.out, lse + b * NH * T, s.att, s.qkv, T,
				      C, NH, true);
		flow_cpu_narrow_bf16(out + b * T * C, s.out, T * C);
	}
}

size_t flow_cpu_attention_scratch_bound(size_t B, size_t T, size_t C,
					size_t NH, bool bf16)
{
	(void)B;
	return (2 * NH * T * T + (bf16 ? 7 * T * C : 0)) * sizeof(float);
}

void flow_cpu_attention_backward(float *dqkv, void *scratch, const float *dout,
				 const float *qkv, const float *lse,
				 const float *out, size_t B, size_t T, size_t C,
				 size_t NH)
{
	attention_scratch_t s = attention_carve(scratch, T, C, NH, false);

	(void)out; /* rowsum(P dP) comes from the probabilities */
	for (size_t b = 0; b < B; b++)
		attention_backward_row(dqkv + b * T * 3 * C, s.att, s.datt,
				       dout + b * T * C, qkv + b * T * 3 * C,
				       lse + b * NH * T, T, C, NH, false);
}

void flow_cpu_attention_bf16_backward(flow_bf16_t *dqkv, void *scratch,
				      const flow_bf16_t *dout,
				      const flow_bf16_t *qkv, const float *lse,
				      const flow_bf16_t *out, size_t B,
				      size_t T, size_t C, size_t NH)
{
	attention_scratch_t s = attention_carve(scratch, T, C, NH, true);

	(void)out;
	for (size_t b = 0; b < B; b++) {
		flow_bf16_t *dx = dqkv + b * T * 3 * C;
		flow_cpu_widen_bf16(s.qkv, qkv + b * T * 3 * C, T * 3 * C);
		flow_cpu_widen_bf16(s.out, dout + b * T * C, T * C);
		flow_cpu_widen_bf16(s.dqkv, dx, T * 3 * C);
		attention_backward_row(s.dqkv, s.att, s.datt, s.out, s.qkv,
				       lse + b * NH * T, T, C, NH, true);
		flow_cpu_narrow_bf16(dx, s.dqkv, T * 3 * C);
	}
}
