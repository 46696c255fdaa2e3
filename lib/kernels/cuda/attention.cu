/* Causal multi-head self-attention on the GPU, and its bf16 twins.  Mirrors
 * cpu/attention.c.
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
 * The bf16 twins are the same code over bf16 qkv, out, dout and dqkv (a
 * template over their element type): each product is
 * cublasGemmStridedBatchedEx on the bf16 tensors themselves, summed in
 * fp32 (CUBLAS_COMPUTE_32F: tensor cores), the scores and datt coming
 * out in fp32, out written in bf16 and dqkv accumulated in bf16 by the
 * GEMM's beta = 1 (its fp32 sum rounded once).  The softmax kernels write
 * a bf16 copy of att and dpre beside the fp32 ones, the operands of the
 * products (flow/kernels.h: P and dpre rounded where they multiply).
 *
 * cuBLAS is column-major; a row-major (r x c) matrix with row stride ld is
 * its column-major (c x r) transpose with leading dimension ld, so each
 * row-major product P = X Y is issued as P^T = Y^T X^T.
 *
 * In bf16, cuDNN's fused attention (attention_cudnn.c) runs both passes
 * wherever it takes them: the whole batch at once, flash-style (the
 * probabilities never reach memory), reading the bf16 tensors in place
 * and writing out directly; its backward overwrites a bf16 dqkv, which
 * goes to scratch and is then added into dqkv (the kernels accumulate).
 * The own kernel is the fallback (no cuDNN, a shape it declines,
 * FLOW_CUDNN=0). */
#include <config.h>

#include <atomic>
#include <cstdio>
#include <mutex>

#include "attention_cudnn.h"
#include "cuda_internal.h"

#define ATT_WARPS 8 /* rows per block in the softmax kernels */

/* The process's bf16 passes, by the way they ran, and why cuDNN declined
 * the first one it did (written once, under the lock). */
static std::atomic<uint64_t> att_cudnn, att_own;
static std::mutex att_why_lock;
static char att_why[576];

void flow_cuda_attention_counts(uint64_t *cudnn, uint64_t *own,
				const char **why_own)
{
	std::lock_guard<std::mutex> hold(att_why_lock);
	*cudnn = att_cudnn;
	*own = att_own;
	*why_own = att_why;
}

/* A bf16 pass that runs the own kernel: counted, and the first one's
 * reason kept. */
static void own_bf16_pass(const char *why)
{
	if (att_own++ == 0) {
		std::lock_guard<std::mutex> hold(att_why_lock);
		std::snprintf(att_why, sizeof(att_why), "%s", why);
	}
}

/* The cudaDataType_t of an element type. */
template <typename T> struct cuda_type;
template <> struct cuda_type<float> {
	static constexpr cudaDataType_t value = CUDA_R_32F;
};
template <> struct cuda_type<__nv_bfloat16> {
	static constexpr cudaDataType_t value = CUDA_R_16BF;
};

/* In place over rows of T scores (already scaled): row (h, t) of a batch
 * row keeps columns j <= t as exp(score - lse) and sets j > t to 0;
 * lse_out[row] = max + log(sum exp(score - max)).  Given lse_in (the
 * backward pass), that is read instead.  Given pb, the row also goes
 * there rounded to bf16. */
static __global__ void causal_softmax_kernel(float *__restrict__ att,
					     __nv_bfloat16 *__restrict__ pb,
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
		for (size_t j = lane; j < T; j += 32) {
			const float p = j <= t ? expf(a[j] - l) : 0.0f;
			a[j] = p;
			if (pb)
				pb[r * T + j] = __float2bfloat16_rn(p);
		}
	}
}

/* In place over datt: dpre[j] = scale * att[j] * (datt[j] - sum_k att[k]
 * datt[k]) for j <= t, 0 above the diagonal; given db, rounded to bf16
 * there too. */
static __global__ void causal_softmax_backward_kernel(
	float *__restrict__ datt, __nv_bfloat16 *__restrict__ db,
	const float *__restrict__ att, size_t rows, size_t T, float scale)
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
		for (size_t j = lane; j < T; j += 32) {
			const float g =
				j <= t ? scale * (a[j] * (d[j] - dot)) : 0.0f;
			d[j] = g;
			if (db)
				db[r * T + j] = __float2bfloat16_rn(g);
		}
	}
}

/* dst[i] = bf16(dst[i] + src[i]): cuDNN's gradient into dqkv. */
static __global__ void
accumulate_bf16_kernel(__nv_bfloat16 *__restrict__ dst,
		       const __nv_bfloat16 *__restrict__ src, size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		flow_accumulate(&dst[i], flow_load(&src[i]));
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
	/* The matrices of a batch row in scratch, lse, and the whole batch's
	 * gradient of the cuDNN path. */
	if (!flow_mul_size(T, T, &tt) || !flow_mul_size(tt, NH, &btt) ||
	    !flow_mul_size(btt, 16, &btt) ||
	    !flow_mul_size(B, NH, &tt) || !flow_mul_size(tt, T, &tt) ||
	    !flow_mul_size(B, T, &tt) || !flow_mul_size(tt, C, &tt) ||
	    !flow_mul_size(tt, 16, &tt)) {
		err = flow_diag_set(diag, FLOW_ERR_RANGE,
				    "attention matrices of '%s' (B=%zu NH=%zu "
				    "T=%zu) overflow size_t",
				    func, B, NH, T);
		goto out;
	}
out:
	return err;
}

/* The own kernel's scratch, for one batch row: the probabilities and
 * their gradient in fp32 and, for bf16, their rounded copies (NULL for
 * fp32), each at a FLOW_CUDA_SCRATCH_ALIGN boundary. */
struct attention_scratch {
	float *att, *datt;      /* (NH,T,T) */
	__nv_bfloat16 *pb, *db; /* (NH,T,T) */
};

/* Byte offsets of the scratch's parts, and its size. */
struct attention_offsets {
	size_t att, datt, pb, db, end;
};

static attention_offsets attention_layout(size_t T, size_t NH, bool bf16)
{
	const size_t tt = NH * T * T, e = sizeof(__nv_bfloat16);
	attention_offsets o;

	o.att = 0;
	o.datt = o.att + flow_cuda__scratch_align(tt * sizeof(float));
	o.pb = o.datt + flow_cuda__scratch_align(tt * sizeof(float));
	if (!bf16) { /* fp32 keeps no rounded copies */
		o.db = o.end = o.pb;
		return o;
	}
	o.db = o.pb + flow_cuda__scratch_align(tt * e);
	o.end = o.db + flow_cuda__scratch_align(tt * e);
	return o;
}

static attention_scratch attention_carve(void *scratch, size_t T, size_t NH,
					 bool bf16)
{
	const attention_offsets o = attention_layout(T, NH, bf16);
	char *base = (char *)scratch;
	attention_scratch s = {};

	s.att = (float *)(base + o.att);
	s.datt = (float *)(base + o.datt);
	if (bf16) {
		s.pb = (__nv_bfloat16 *)(base + o.pb);
		s.db = (__nv_bfloat16 *)(base + o.db);
	}
	return s;
}

/* The cuDNN path's scratch, for the whole batch: dqkv as cuDNN writes it
 * (bf16), and the backward's per-row sum(dout * out) (fp32). */
struct cudnn_offsets {
	size_t dqkv, rowsum, end;
};

static cudnn_offsets cudnn_layout(size_t B, size_t T, size_t C, size_t NH)
{
	const size_t e = sizeof(__nv_bfloat16), btc = B * T * C;
	cudnn_offsets o;

	o.dqkv = 0;
	o.rowsum = o.dqkv + flow_cuda__scratch_align(3 * btc * e);
	o.end = o.rowsum + flow_cuda__scratch_align(B * NH * T * sizeof(float));
	return o;
}

/* Column-major strided-batched C = alpha op(A) op(B) + beta C, summed in
 * fp32: an sgemm when A, B and C are fp32 (the fp32 kernel), else on A and
 * B of type ab with C of type ct (CUBLAS_COMPUTE_32F; a bf16 C is read,
 * added to and rounded once). */
static flow_err_t bgemm(cublasHandle_t h, cudaDataType_t ab, cudaDataType_t ct,
			cublasOperation_t opa, cublasOperation_t opb, size_t m,
			size_t n, size_t k, float alpha, const void *a,
			size_t lda, size_t sa, const void *b, size_t ldb,
			size_t sb, float beta, void *c, size_t ldc, size_t sc,
			size_t batch, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;

	if (ab == CUDA_R_32F && ct == CUDA_R_32F)
		FLOW_CUBLAS_TRY(cublasSgemmStridedBatched(
					h, opa, opb, (int)m, (int)n, (int)k,
					&alpha, (const float *)a, (int)lda,
					(long long)sa, (const float *)b,
					(int)ldb, (long long)sb, &beta,
					(float *)c, (int)ldc, (long long)sc,
					(int)batch),
				out);
	else
		FLOW_CUBLAS_TRY(cublasGemmStridedBatchedEx(
					h, opa, opb, (int)m, (int)n, (int)k,
					&alpha, a, ab, (int)lda, (long long)sa,
					b, ab, (int)ldb, (long long)sb, &beta,
					c, ct, (int)ldc, (long long)sc,
					(int)batch, CUBLAS_COMPUTE_32F,
					CUBLAS_GEMM_DEFAULT),
				out);
out:
	return err;
}

/* The own kernel's forward pass on qkv and out of element type E (float,
 * or bf16 for the twin). */
template <typename E>
static flow_err_t own_forward(E *out, float *lse, void *scratch, const E *qkv,
			      size_t B, size_t T, size_t C, size_t NH,
			      flow_diag_t *diag, cudaStream_t stream)
{
	const cudaDataType_t e = cuda_type<E>::value;
	const bool bf16 = e != CUDA_R_32F;
	const size_t hs = C / NH, rows = NH * T;
	const float scale = 1.0f / sqrtf((float)hs);
	const attention_scratch s = attention_carve(scratch, T, NH, bf16);
	/* The probabilities as they multiply v: of E too. */
	const void *p = bf16 ? (const void *)s.pb : (const void *)s.att;
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;

	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	for (size_t b = 0; b < B; b++) {
		const E *x = qkv + b * T * 3 * C;
		/* att^T (T x T) = scale * k (hs x T, op T) . q^T (hs x T) */
		FLOW_TRY(bgemm(h, e, CUDA_R_32F, CUBLAS_OP_T, CUBLAS_OP_N, T, T,
			       hs, scale, x + C, 3 * C, hs, x, 3 * C, hs, 0.0f,
			       s.att, T, T * T, NH, diag),
			 out);
		causal_softmax_kernel<<<flow_cuda__grid(rows, ATT_WARPS),
					ATT_WARPS * 32, 0, stream>>>(
			s.att, s.pb, lse + b * rows, NULL, rows, T);
		FLOW_CUDA_LAUNCH_TRY(out);
		/* out^T (hs x T) = v^T (hs x T) . att^T (T x T) */
		FLOW_TRY(bgemm(h, e, e, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T,
			       1.0f, x + 2 * C, 3 * C, hs, p, T, T * T, 0.0f,
			       out + b * T * C, C, hs, NH, diag),
			 out);
	}
out:
	return err;
}

/* The own kernel's backward pass, element type E as forward. */
template <typename E>
static flow_err_t own_backward(E *dqkv, void *scratch, const E *dout,
			       const E *qkv, const float *lse, size_t B,
			       size_t T, size_t C, size_t NH,
			       flow_diag_t *diag, cudaStream_t stream)
{
	const cudaDataType_t e = cuda_type<E>::value;
	const bool bf16 = e != CUDA_R_32F;
	const size_t hs = C / NH, rows = NH * T;
	const float scale = 1.0f / sqrtf((float)hs);
	const attention_scratch s = attention_carve(scratch, T, NH, bf16);
	/* The probabilities and dpre as they multiply: of E too. */
	const void *p = bf16 ? (const void *)s.pb : (const void *)s.att;
	const void *dp = bf16 ? (const void *)s.db : (const void *)s.datt;
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;

	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	for (size_t b = 0; b < B; b++) {
		const E *x = qkv + b * T * 3 * C;
		const E *g = dout + b * T * C;
		E *dq = dqkv + b * T * 3 * C;
		/* att as forward, from lse */
		FLOW_TRY(bgemm(h, e, CUDA_R_32F, CUBLAS_OP_T, CUBLAS_OP_N, T, T,
			       hs, scale, x + C, 3 * C, hs, x, 3 * C, hs, 0.0f,
			       s.att, T, T * T, NH, diag),
			 out);
		causal_softmax_kernel<<<flow_cuda__grid(rows, ATT_WARPS),
					ATT_WARPS * 32, 0, stream>>>(
			s.att, s.pb, NULL, lse + b * rows, rows, T);
		FLOW_CUDA_LAUNCH_TRY(out);
		/* datt^T (T x T) = v (hs x T, op T) . dout^T (hs x T) */
		FLOW_TRY(bgemm(h, e, CUDA_R_32F, CUBLAS_OP_T, CUBLAS_OP_N, T, T,
			       hs, 1.0f, x + 2 * C, 3 * C, hs, g, C, hs, 0.0f,
			       s.datt, T, T * T, NH, diag),
			 out);
		causal_softmax_backward_kernel<<<flow_cuda__grid(rows,
								 ATT_WARPS),
						 ATT_WARPS * 32, 0, stream>>>(
			s.datt, s.db, s.att, rows, T, scale);
		FLOW_CUDA_LAUNCH_TRY(out);
		/* dv^T (hs x T) += dout^T (hs x T) . att (att^T stored,
		 * op T) */
		FLOW_TRY(bgemm(h, e, e, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T,
			       1.0f, g, C, hs, p, T, T * T, 1.0f, dq + 2 * C,
			       3 * C, hs, NH, diag),
			 out);
		/* dq^T (hs x T) += k^T (hs x T) . dpre^T (dpre stored) */
		FLOW_TRY(bgemm(h, e, e, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T,
			       1.0f, x + C, 3 * C, hs, dp, T, T * T, 1.0f, dq,
			       3 * C, hs, NH, diag),
			 out);
		/* dk^T (hs x T) += q^T (hs x T) . dpre (dpre^T stored, op T) */
		FLOW_TRY(bgemm(h, e, e, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T,
			       1.0f, x, 3 * C, hs, dp, T, T * T, 1.0f, dq + C,
			       3 * C, hs, NH, diag),
			 out);
	}
out:
	return err;
}

flow_err_t flow_cuda_attention_forward(float *out, float *lse, void *scratch,
				       const float *qkv, size_t B, size_t T,
				       size_t C, size_t NH, flow_diag_t *diag,
				       cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	if (B == 0 || T == 0 || C == 0)
		return FLOW_OK;
	FLOW_TRY(attention_check(B, T, C, NH, __func__, diag), out);
	err = own_forward(out, lse, scratch, qkv, B, T, C, NH, diag, stream);
out:
	return err;
}

flow_err_t flow_cuda_attention_backward(float *dqkv, void *scratch,
					const float *dout, const float *qkv,
					const float *lse, const float *out,
					size_t B, size_t T, size_t C, size_t NH,
					flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	(void)out; /* rowsum(P dP) comes from the probabilities */
	if (B == 0 || T == 0 || C == 0)
		return FLOW_OK;
	FLOW_TRY(attention_check(B, T, C, NH, __func__, diag), done);
	err = own_backward(dqkv, scratch, dout, qkv, lse, B, T, C, NH, diag,
			   stream);
done:
	return err;
}

/* cuDNN's plan for a bf16 pass over these tensors, or NULL (the pass then
 * runs the own kernel, counted with the reason).  cuDNN reads and writes
 * the executor's tensors in place, and wants them 16-byte aligned, as an
 * arena's are. */
static flow_cudnn_plan_t *cudnn_plan(bool backward, const void *const *ptrs,
				     size_t nptrs, size_t B, size_t T,
				     size_t C, size_t NH)
{
	flow_cudnn_plan_t *plan = NULL;

	for (size_t i = 0; i < nptrs; i++)
		if ((uintptr_t)ptrs[i] % 16 != 0) {
			own_bf16_pass("a tensor is not 16-byte aligned, as "
				      "cuDNN's fused attention wants it");
			return NULL;
		}
	plan = flow_cuda__cudnn_attention_plan(backward, B, T, C, NH);
	if (plan)
		att_cudnn++;
	else
		own_bf16_pass(flow_cuda__cudnn_declined_why());
	return plan;
}

flow_err_t flow_cuda_attention_bf16_forward(flow_bf16_t *out, float *lse,
					    void *scratch,
					    const flow_bf16_t *qkv, size_t B,
					    size_t T, size_t C, size_t NH,
					    flow_diag_t *diag,
					    cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	flow_cudnn_plan_t *plan = NULL;
	const void *const ptrs[] = { out, lse, qkv };

	if (B == 0 || T == 0 || C == 0)
		return FLOW_OK;
	FLOW_TRY(attention_check(B, T, C, NH, __func__, diag), done);
	plan = cudnn_plan(false, ptrs, sizeof ptrs / sizeof ptrs[0], B, T, C,
			  NH);
	if (plan)
		err = flow_cuda__cudnn_attention_forward(plan, out, lse, qkv,
							 diag, stream);
	else
		err = own_forward(flow_cuda__bf16(out), lse, scratch,
				  flow_cuda__bf16(qkv), B, T, C, NH, diag,
				  stream);
done:
	return err;
}

/* The backward pass through cuDNN: its gradient, which it overwrites, into
 * scratch, then added into dqkv. */
static flow_err_t cudnn_backward(flow_cudnn_plan_t *plan, flow_bf16_t *dqkv,
				 void *scratch, const flow_bf16_t *dout,
				 const flow_bf16_t *qkv, const float *lse,
				 const flow_bf16_t *out_fwd, size_t B, size_t T,
				 size_t C, size_t NH, flow_diag_t *diag,
				 cudaStream_t stream)
{
	const cudnn_offsets o = cudnn_layout(B, T, C, NH);
	const size_t n = 3 * B * T * C;
	__nv_bfloat16 *grad = (__nv_bfloat16 *)((char *)scratch + o.dqkv);
	flow_err_t err = FLOW_OK;

	FLOW_TRY(flow_cuda__cudnn_attention_backward(
			 plan, grad, (float *)((char *)scratch + o.rowsum), qkv,
			 out_fwd, dout, lse, diag, stream),
		 out);
	accumulate_bf16_kernel<<<flow_cuda__grid(n, 256 * 4), 256, 0,
				 stream>>>(flow_cuda__bf16(dqkv), grad, n);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

flow_err_t flow_cuda_attention_bf16_backward(flow_bf16_t *dqkv,
					     void *scratch,
					     const flow_bf16_t *dout,
					     const flow_bf16_t *qkv,
					     const float *lse,
					     const flow_bf16_t *out, size_t B,
					     size_t T, size_t C, size_t NH,
					     flow_diag_t *diag,
					     cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	flow_cudnn_plan_t *plan = NULL;
	const void *const ptrs[] = { dout, qkv, lse, out };

	if (B == 0 || T == 0 || C == 0)
		return FLOW_OK;
	FLOW_TRY(attention_check(B, T, C, NH, __func__, diag), done);
	plan = cudnn_plan(true, ptrs, sizeof ptrs / sizeof ptrs[0], B, T, C,
			  NH);
	if (plan)
		err = cudnn_backward(plan, dqkv, scratch, dout, qkv, lse, out,
				     B, T, C, NH, diag, stream);
	else
		err = own_backward(flow_cuda__bf16(dqkv), scratch,
				   flow_cuda__bf16(dout), flow_cuda__bf16(qkv),
				   lse, B, T, C, NH, diag, stream);
done:
	return err;
}

size_t flow_cuda_attention_scratch_bound(size_t B, size_t T, size_t C,
					 size_t NH, bool bf16)
{
	size_t tt = 0, tc = 0, own = 0, fused = 0;
	/* Sizes whose matrices overflow are refused by attention_check. */
	if (!flow_mul_size(T, T, &tt) || !flow_mul_size(tt, NH, &tt) ||
	    !flow_mul_size(tt, 16, &tt) || !flow_mul_size(T, C, &tc) ||
	    !flow_mul_size(tc, 8, &tc) || !flow_mul_size(tc, B, &tc) ||
	    !flow_mul_size(tc, 2, &tc))
		return 0;
	own = attention_layout(T, NH, bf16).end;
	/* A pure function: whether cuDNN will take the sizes is not known
	 * here, so a build with cuDNN plans room for either path. */
	if (bf16 && flow_cuda__cudnn_built())
		fused = cudnn_layout(B, T, C, NH).end;
	return own > fused ? own : fused;
}
