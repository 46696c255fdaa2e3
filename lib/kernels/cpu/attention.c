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
 * forward pass's bits.  The bf16 form rounds that row's qkv and dout into
 * scratch and the probabilities and dpre in place where they multiply;
 * the products of bf16 values are exact in fp32, so the sgemms then sum
 * what a GPU's tensor cores do. */
#include <config.h>

#include <math.h>
#include <string.h>

#include <cblas.h>

#include <flow/kernels.h>

#include "cpu_internal.h"
#include "kernels/host_bf16_internal.h"

/* The scratch of one batch row: the probabilities and their gradient, and
 * for bf16 the row's qkv and dout rounded (NULL for fp32, which has no
 * room for them). */
typedef struct {
	float *att, *datt; /* (NH,T,T) */
	float *qkv;        /* (T,3C) */
	float *dout;       /* (T,C) */
} attention_scratch_t;

static attention_scratch_t attention_carve(void *scratch, size_t T, size_t C,
					   size_t NH, bool bf16)
{
	attention_scratch_t s = { NULL, NULL, NULL, NULL };

	s.att = scratch;
	s.datt = s.att + NH * T * T;
	if (bf16) {
		s.qkv = s.datt + NH * T * T;
		s.dout = s.qkv + 3 * T * C;
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

void flow_cpu_attention_forward(float *out, float *lse, void *scratch,
				bool bf16, const float *qkv, size_t B,
				size_t T, size_t C, size_t NH)
{
	const size_t hs = C / NH, C3 = 3 * C;
	const int t = (int)T, h3 = (int)C3, c = (int)C, k = (int)hs;
	attention_scratch_t s = attention_carve(scratch, T, C, NH, bf16);

	for (size_t b = 0; b < B; b++) {
		const float *x = flow_host_bf16_operand(qkv + b * T * C3,
							T * C3, bf16, s.qkv);
		float *l = lse + b * NH * T;

		attention_scores(s.att, x, T, C, NH);
#pragma omp parallel for schedule(static)
		for (size_t r = 0; r < NH * T; r++)
			l[r] = attention_softmax_row(s.att + r * T, r % T, T);
		if (bf16)
			flow_host_round_bf16(s.att, s.att, NH * T * T);
		/* out = att . v, each head into its hs columns. */
		for (size_t h = 0; h < NH; h++)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t,
				    k, t, 1.0f, s.att + h * T * T, t,
				    x + 2 * C + h * hs, h3, 0.0f,
				    out + b * T * C + h * hs, c);
	}
}

size_t flow_cpu_attention_scratch_bound(size_t B, size_t T, size_t C,
					size_t NH, bool bf16)
{
	(void)B;
	return (2 * NH * T * T + (bf16 ? 4 * T * C : 0)) * sizeof(float);
}

void flow_cpu_attention_backward(float *dqkv, void *scratch, bool bf16,
				 const float *dout, const float *qkv,
				 const float *lse, const float *out, size_t B,
				 size_t T, size_t C, size_t NH)
{
	const size_t hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
	const int t = (int)T, h3 = (int)C3, c = (int)C, k = (int)hs;
	attention_scratch_t s = attention_carve(scratch, T, C, NH, bf16);

	(void)out; /* rowsum(P dP) comes from the probabilities */
	for (size_t b = 0; b < B; b++) {
		const float *x = flow_host_bf16_operand(qkv + b * T * C3,
							T * C3, bf16, s.qkv);
		const float *g = flow_host_bf16_operand(dout + b * T * C, T * C,
							bf16, s.dout);
		const float *l = lse + b * NH * T;
		float *dx = dqkv + b * T * C3;

		attention_scores(s.att, x, T, C, NH);
#pragma omp parallel for schedule(static)
		for (size_t r = 0; r < NH * T; r++)
			attention_probs_row(s.att + r * T, l[r], r % T, T);

		/* datt = dout . v^T. */
		for (size_t h = 0; h < NH; h++)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t,
				    t, k, 1.0f, g + h * hs, c,
				    x + 2 * C + h * hs, h3, 0.0f,
				    s.datt + h * T * T, t);

		/* dpre = scale att (datt - sum_j att datt) in place, masked
		 * entries to 0. */
#pragma omp parallel for schedule(static)
		for (size_t r = 0; r < NH * T; r++) {
			const float *restrict a = s.att + r * T;
			float *restrict d = s.datt + r * T;
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
			flow_host_round_bf16(s.att, s.att, NH * T * T);
			flow_host_round_bf16(s.datt, s.datt, NH * T * T);
		}

		/* dv += att^T . dout; pre = scale q . k^T: dq += dpre . k,
		 * dk += dpre^T . q. */
		for (size_t h = 0; h < NH; h++) {
			const float *a = s.att + h * T * T;
			const float *d = s.datt + h * T * T;
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t,
				    k, t, 1.0f, a, t, g + h * hs, c, 1.0f,
				    dx + 2 * C + h * hs, h3);
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t,
				    k, t, 1.0f, d, t, x + C + h * hs, h3, 1.0f,
				    dx + h * hs, h3);
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t,
				    k, t, 1.0f, d, t, x + h * hs, h3, 1.0f,
				    dx + C + h * hs, h3);
		}
	}
}
