/* Causal multi-head self-attention on the GPU.  Mirrors cpu/attention.c.
 *
 * qkv is (B,T,3C); head h of q, k, v is the hs = C/NH columns starting at
 * h*hs, 2C + ... of each row, i.e. a (T x hs) matrix with row stride 3C.  For
 * each batch row b one cuBLAS strided-batched GEMM over the NH heads (head
 * stride hs) does each product, reading q, k, v in place: no permute
 * copies.  The probabilities of that row live in scratch (NH x T x T);
 * only lse (B,NH,T) is kept between the passes.
 *
 * forward:  att = scale * q k^T   (full T x T, upper triangle discarded)
 *           lse = log sum exp(att) over the causal columns; att =
 *                 exp(att - lse) in place (one warp per row)
 *           out = att v
 * backward: att as forward, recomputed: the same GEMM and the same
 *                 expression on the same inputs, so the same bits
 *           datt = dout v^T                     (scratch)
 *           dv  += att^T dout
 *           dpre = scale * att * (datt - rowsum(att * datt)), 0 above the
 *                  diagonal (O(T^2) softmax backward, in place in scratch)
 *           dq  += dpre k;   dk += dpre^T q
 *
 * cuBLAS is column-major; a row-major (r x c) matrix with row stride ld is
 * its column-major (c x r) transpose with leading dimension ld, so each
 * row-major product P = X Y is issued as P^T = Y^T X^T. */
#include <config.h>

#include "cuda_internal.h"

#define ATT_WARPS 8 /* rows per block in the softmax kernels */

/* In place over rows of T scores (already scaled): row (h, t) of a batch
 * row keeps columns j <= t as exp(score - lse) and sets j > t to 0;
 * lse_out[row] = max + log(sum exp(score - max)).  Given lse_in (the
 * backward pass), that is read instead. */
static __global__ void causal_softmax_kernel(float *__restrict__ att,
					     float *__restrict__ lse_out,
					     const float *__restrict__ lse_in,
					     size_t rows, size_t T)
{
	const unsigned lane = threadIdx.x & 31;
	const size_t row_stride = (size_t)gridDim.x * ATT_WARPS;
	for (size_t r = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
	     r < rows; r += row_stride) {
		const size_t t = r % T; /* query position */
		float *a = att + r * T;
		float l;
		if (lse_in) {
			l = lse_in[r];
		} else {
			float mx = -INFINITY;
			for (size_t j = lane; j <= t; j += 32)
				mx = fmaxf(mx, a[j]);
			mx = flow_warp_max(mx);
			float sum = 0.0f;
			for (size_t j = lane; j <= t; j += 32)
				sum += expf(a[j] - mx);
			sum = flow_warp_sum(sum);
			l = mx + logf(sum);
			if (lane == 0)
				lse_out[r] = l;
		}
		for (size_t j = lane; j < T; j += 32)
			a[j] = j <= t ? expf(a[j] - l) : 0.0f;
	}
}

/* In place over datt: dpre[j] = scale * att[j] * (datt[j] - sum_k att[k]
 * datt[k]) for j <= t, 0 above the diagonal. */
static __global__ void causal_softmax_backward_kernel(
	float *__restrict__ datt, const float *__restrict__ att, size_t rows,
	size_t T, float scale)
{
	const unsigned lane = threadIdx.x & 31;
	const size_t row_stride = (size_t)gridDim.x * ATT_WARPS;
	for (size_t r = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
	     r < rows; r += row_stride) {
		const size_t t = r % T;
		float *d = datt + r * T;
		const float *a = att + r * T;
		float dot = 0.0f;
		for (size_t j = lane; j <= t; j += 32)
			dot += a[j] * d[j];
		dot = flow_warp_sum(dot);
		for (size_t j = lane; j < T; j += 32)
			d[j] = j <= t ? scale * (a[j] * (d[j] - dot)) : 0.0f;
	}
}

/* Shared argument checks: hs = C / NH, and every size cuBLAS sees fits int. */
static flow_err_t attention_check(size_t B, size_t T, size_t C, size_t NH,
				  const char *func, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	size_t tt = 0, btt = 0;

	if (NH == 0 || C % NH != 0) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "channels C = %zu of '%s' are not divisible "
				    "by the %zu heads",
				    C, func, NH);
		goto out;
	}
	FLOW_TRY(flow_cuda__check_size(diag, func, "T", T, INT_MAX), out);
	FLOW_TRY(flow_cuda__check_size(diag, func, "3C", C, INT_MAX / 3), out);
	FLOW_TRY(flow_cuda__check_size(diag, func, "NH", NH, INT_MAX), out);
	/* The two matrices of a batch row in scratch, and lse. */
	if (!flow_mul_size(T, T, &tt) || !flow_mul_size(tt, NH, &btt) ||
	    !flow_mul_size(btt, 2 * sizeof(float), &btt) ||
	    !flow_mul_size(B, NH, &tt) || !flow_mul_size(tt, T, &tt)) {
		err = flow_diag_set(diag, FLOW_ERR_RANGE,
				    "attention matrices of '%s' (B=%zu NH=%zu "
				    "T=%zu) overflow size_t",
				    func, B, NH, T);
		goto out;
	}
out:
	return err;
}

/* att (NH x T x T, row-major) = scale * q k^T of batch row b. */
static flow_err_t attention_scores(cublasHandle_t h, float *att,
				   const float *qkv, size_t b, size_t T,
				   size_t C, size_t NH, float scale,
				   flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	const size_t hs = C / NH;
	const float zero = 0.0f;
	const float *q = qkv + b * T * 3 * C;

	/* att^T (T x T) = scale * k (hs x T, op T) . q^T (hs x T) */
	FLOW_CUBLAS_TRY(cublasSgemmStridedBatched(
				h, CUBLAS_OP_T, CUBLAS_OP_N, (int)T, (int)T,
				(int)hs, &scale, q + C, (int)(3 * C),
				(long long)hs, q, (int)(3 * C), (long long)hs,
				&zero, att, (int)T, (long long)(T * T),
				(int)NH),
			out);
out:
	return err;
}

flow_err_t flow_cuda_attention_forward(float *out, float *lse, void *scratch,
				       const float *qkv, size_t B, size_t T,
				       size_t C, size_t NH, flow_diag_t *diag,
				       cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	size_t hs = 0, rows = 0;
	float scale = 0.0f;
	float *att = (float *)scratch;
	const float one = 1.0f, zero = 0.0f;

	if (B == 0 || T == 0 || C == 0)
		return FLOW_OK;
	FLOW_TRY(attention_check(B, T, C, NH, __func__, diag), out);
	hs = C / NH;
	rows = NH * T;
	scale = 1.0f / sqrtf((float)hs);
	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	for (size_t b = 0; b < B; b++) {
		const float *v = qkv + b * T * 3 * C + 2 * C;
		FLOW_TRY(attention_scores(h, att, qkv, b, T, C, NH, scale,
					  diag),
			 out);
		causal_softmax_kernel<<<flow_cuda__grid(rows, ATT_WARPS),
					ATT_WARPS * 32, 0, stream>>>(
			att, lse + b * rows, NULL, rows, T);
		FLOW_CUDA_LAUNCH_TRY(out);
		/* out^T (hs x T) = v^T (hs x T) . att^T (T x T) */
		FLOW_CUBLAS_TRY(cublasSgemmStridedBatched(
					h, CUBLAS_OP_N, CUBLAS_OP_N, (int)hs,
					(int)T, (int)T, &one, v, (int)(3 * C),
					(long long)hs, att, (int)T,
					(long long)(T * T), &zero,
					out + b * T * C, (int)C, (long long)hs,
					(int)NH),
				out);
	}
out:
	return err;
}

size_t flow_cuda_attention_scratch_bound(size_t B, size_t T, size_t C,
					 size_t NH)
{
	size_t bytes = 0;
	(void)B;
	(void)C;
	/* att and datt of one batch row. */
	if (!flow_mul_size(T, T, &bytes) || !flow_mul_size(bytes, NH, &bytes) ||
	    !flow_mul_size(bytes, 2 * sizeof(float), &bytes))
		return 0;
	return bytes;
}

flow_err_t flow_cuda_attention_backward(float *dqkv, void *scratch,
					const float *dout, const float *qkv,
					const float *lse, size_t B, size_t T,
					size_t C, size_t NH, flow_diag_t *diag,
					cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	size_t hs = 0, rows = 0;
	float scale = 0.0f;
	float *att = (float *)scratch, *datt = NULL;
	const float one = 1.0f, zero = 0.0f;

	if (B == 0 || T == 0 || C == 0)
		return FLOW_OK;
	FLOW_TRY(attention_check(B, T, C, NH, __func__, diag), out);
	hs = C / NH;
	rows = NH * T;
	datt = att + rows * T;
	scale = 1.0f / sqrtf((float)hs);
	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	for (size_t b = 0; b < B; b++) {
		const float *q = qkv + b * T * 3 * C;
		const float *dy = dout + b * T * C;
		float *dq = dqkv + b * T * 3 * C;
		FLOW_TRY(attention_scores(h, att, qkv, b, T, C, NH, scale,
					  diag),
			 out);
		causal_softmax_kernel<<<flow_cuda__grid(rows, ATT_WARPS),
					ATT_WARPS * 32, 0, stream>>>(
			att, NULL, lse + b * rows, rows, T);
		FLOW_CUDA_LAUNCH_TRY(out);
		/* datt^T (T x T) = v (hs x T, op T) . dout^T (hs x T) */
		FLOW_CUBLAS_TRY(cublasSgemmStridedBatched(
					h, CUBLAS_OP_T, CUBLAS_OP_N, (int)T,
					(int)T, (int)hs, &one, q + 2 * C,
					(int)(3 * C), (long long)hs, dy, (int)C,
					(long long)hs, &zero, datt, (int)T,
					(long long)(T * T), (int)NH),
				out);
		/* dv^T (hs x T) += dout^T (hs x T) . att (att^T stored, op T) */
		FLOW_CUBLAS_TRY(cublasSgemmStridedBatched(
					h, CUBLAS_OP_N, CUBLAS_OP_T, (int)hs,
					(int)T, (int)T, &one, dy, (int)C,
					(long long)hs, att, (int)T,
					(long long)(T * T), &one, dq + 2 * C,
					(int)(3 * C), (long long)hs, (int)NH),
				out);
		causal_softmax_backward_kernel<<<flow_cuda__grid(rows,
								 ATT_WARPS),
						 ATT_WARPS * 32, 0, stream>>>(
			datt, att, rows, T, scale);
		FLOW_CUDA_LAUNCH_TRY(out);
		/* dq^T (hs x T) += k^T (hs x T) . dpre^T (dpre stored) */
		FLOW_CUBLAS_TRY(cublasSgemmStridedBatched(
					h, CUBLAS_OP_N, CUBLAS_OP_N, (int)hs,
					(int)T, (int)T, &one, q + C,
					(int)(3 * C), (long long)hs, datt,
					(int)T, (long long)(T * T), &one, dq,
					(int)(3 * C), (long long)hs, (int)NH),
				out);
		/* dk^T (hs x T) += q^T (hs x T) . dpre (dpre^T stored, op T) */
		FLOW_CUBLAS_TRY(cublasSgemmStridedBatched(
					h, CUBLAS_OP_N, CUBLAS_OP_T, (int)hs,
					(int)T, (int)T, &one, q, (int)(3 * C),
					(long long)hs, datt, (int)T,
					(long long)(T * T), &one, dq + C,
					(int)(3 * C), (long long)hs, (int)NH),
				out);
	}
out:
	return err;
}
