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
 * bf16 (flow/kernels.h) rounds the row's qkv and dout into scratch, and
 * the softmax kernels write a rounded copy of att and dpre beside the fp32
 * ones, for the products; each product is then cublasGemmStridedBatchedEx
 * on bf16 operands with fp32 output and CUBLAS_COMPUTE_32F (tensor cores,
 * fp32 accumulation), the same call shapes as the fp32 sgemms.
 *
 * cuBLAS is column-major; a row-major (r x c) matrix with row stride ld is
 * its column-major (c x r) transpose with leading dimension ld, so each
 * row-major product P = X Y is issued as P^T = Y^T X^T.
 *
 * In bf16, cuDNN's fused attention (attention_cudnn.c) runs both passes
 * wherever it takes them: the whole batch at once, flash-style (the
 * probabilities never reach memory), on the operands rounded to bf16 as
 * above; its output and gradients come back in bf16 and are widened to
 * the fp32 activations.  The own kernel is the fallback (no cuDNN, a shape
 * it declines, FLOW_CUDNN=0) and the only fp32 path. */
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
static void own_bf16_pass(void)
{
	if (att_own++ == 0) {
		std::lock_guard<std::mutex> hold(att_why_lock);
		std::snprintf(att_why, sizeof(att_why), "%s",
			      flow_cuda__cudnn_declined_why());
	}
}

/* out[i] = in[i] widened to fp32, or (add) out[i] += it. */
static __global__ void widen_bf16_kernel(float *__restrict__ out,
					 const __nv_bfloat16 *__restrict__ in,
					 size_t n, bool add)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride) {
		const float x = __bfloat162float(in[i]);
		out[i] = add ? out[i] + x : x;
	}
}

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
	 * bf16 copies of the cuDNN path. */
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

/* The scratch of one batch row: the probabilities and their gradient in
 * fp32, and for bf16 their rounded copies and the row's rounded qkv and
 * dout, each at a FLOW_CUDA_BF16_ALIGN boundary. */
struct attention_scratch {
	float *att, *datt;                 /* (NH,T,T) */
	__nv_bfloat16 *pb, *db;            /* (NH,T,T) */
	__nv_bfloat16 *qkv, *dout;         /* (T,3C), (T,C) */
};

/* Byte offsets of the scratch's parts, and its size. */
struct attention_offsets {
	size_t att, datt, pb, db, qkv, dout, end;
};

static attention_offsets attention_layout(size_t T, size_t C, size_t NH,
					  bool bf16)
{
	const size_t tt = NH * T * T, e = sizeof(__nv_bfloat16);
	attention_offsets o;

	o.att = 0;
	o.datt = o.att + flow_cuda__bf16_align(tt * sizeof(float));
	o.pb = o.datt + flow_cuda__bf16_align(tt * sizeof(float));
	if (!bf16) { /* fp32 keeps no rounded copies */
		o.db = o.qkv = o.dout = o.end = o.pb;
		return o;
	}
	o.db = o.pb + flow_cuda__bf16_align(tt * e);
	o.qkv = o.db + flow_cuda__bf16_align(tt * e);
	o.dout = o.qkv + flow_cuda__bf16_align(3 * T * C * e);
	o.end = o.dout + flow_cuda__bf16_align(T * C * e);
	return o;
}

/* The parts of scratch; for fp32 the bf16 ones are NULL. */
static attention_scratch attention_carve(void *scratch, size_t T, size_t C,
					 size_t NH, bool bf16)
{
	const attention_offsets o = attention_layout(T, C, NH, bf16);
	char *base = (char *)scratch;
	attention_scratch s = {};

	s.att = (float *)(base + o.att);
	s.datt = (float *)(base + o.datt);
	if (bf16) {
		s.pb = (__nv_bfloat16 *)(base + o.pb);
		s.db = (__nv_bfloat16 *)(base + o.db);
		s.qkv = (__nv_bfloat16 *)(base + o.qkv);
		s.dout = (__nv_bfloat16 *)(base + o.dout);
	}
	return s;
}

/* The cuDNN path's scratch, for the whole batch: qkv, out and dout
 * rounded to bf16, dqkv as cuDNN writes it (bf16), and the backward's
 * per-row sum(dout * out) (fp32). */
struct cudnn_offsets {
	size_t qkv, o, dout, dqkv, rowsum, end;
};

static cudnn_offsets cudnn_layout(size_t B, size_t T, size_t C, size_t NH)
{
	const size_t e = sizeof(__nv_bfloat16), btc = B * T * C;
	cudnn_offsets o;

	o.qkv = 0;
	o.o = o.qkv + flow_cuda__bf16_align(3 * btc * e);
	o.dout = o.o + flow_cuda__bf16_align(btc * e);
	o.dqkv = o.dout + flow_cuda__bf16_align(btc * e);
	o.rowsum = o.dqkv + flow_cuda__bf16_align(3 * btc * e);
	o.end = o.rowsum + flow_cuda__bf16_align(B * NH * T * sizeof(float));
	return o;
}

static __nv_bfloat16 *part(void *scratch, size_t offset)
{
	return (__nv_bfloat16 *)((char *)scratch + offset);
}

/* x (n floats) rounded into the scratch part at offset. */
static flow_err_t round_into(void *scratch, size_t offset, const float *x,
			     size_t n, flow_diag_t *diag, cudaStream_t stream)
{
	return flow_cuda__round_bf16(part(scratch, offset), x, n, diag, stream);
}

static flow_err_t widen_bf16(float *out, const __nv_bfloat16 *in, size_t n,
			     bool add, flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	widen_bf16_kernel<<<flow_cuda__grid(n, 256 * 4), 256, 0, stream>>>(
		out, in, n, add);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

/* The forward pass through cuDNN's plan for the sizes. */
static flow_err_t cudnn_forward(flow_cudnn_plan_t *plan, float *out,
				float *lse, void *scratch, const float *qkv,
				size_t B, size_t T, size_t C, size_t NH,
				flow_diag_t *diag, cudaStream_t stream)
{
	const cudnn_offsets o = cudnn_layout(B, T, C, NH);
	const size_t btc = B * T * C;
	flow_err_t err = FLOW_OK;

	FLOW_TRY(round_into(scratch, o.qkv, qkv, 3 * btc, diag, stream), out);
	FLOW_TRY(flow_cuda__cudnn_attention_forward(plan, part(scratch, o.o),
						    lse, part(scratch, o.qkv),
						    diag, stream),
		 out);
	FLOW_TRY(widen_bf16(out, part(scratch, o.o), btc, false, diag, stream),
		 out);
out:
	return err;
}

/* The backward pass through cuDNN.  Where the forward pass ran through
 * cuDNN too, out is its bf16 output widened, and rounding it gives those
 * bits back. */
static flow_err_t cudnn_backward(flow_cudnn_plan_t *plan, float *dqkv,
				 void *scratch, const float *dout,
				 const float *qkv, const float *lse,
				 const float *out_fwd, size_t B, size_t T,
				 size_t C, size_t NH, flow_diag_t *diag,
				 cudaStream_t stream)
{
	const cudnn_offsets o = cudnn_layout(B, T, C, NH);
	const size_t btc = B * T * C;
	flow_err_t err = FLOW_OK;

	FLOW_TRY(round_into(scratch, o.qkv, qkv, 3 * btc, diag, stream), out);
	FLOW_TRY(round_into(scratch, o.o, out_fwd, btc, diag, stream), out);
	FLOW_TRY(round_into(scratch, o.dout, dout, btc, diag, stream), out);
	FLOW_TRY(flow_cuda__cudnn_attention_backward(
			 plan, part(scratch, o.dqkv),
			 (float *)((char *)scratch + o.rowsum),
			 part(scratch, o.qkv), part(scratch, o.o),
			 part(scratch, o.dout), lse, diag, stream),
		 out);
	FLOW_TRY(widen_bf16(dqkv, part(scratch, o.dqkv), 3 * btc, true, diag,
			    stream),
		 out);
out:
	return err;
}

/* Element i of an operand of either precision. */
static const void *elem(const void *base, size_t i, bool bf16)
{
	return (const char *)base +
	       i * (bf16 ? sizeof(__nv_bfloat16) : sizeof(float));
}

/* Batch row b's rows of x (row_elems each): x itself, or for bf16 rounded
 * into room. */
static flow_err_t row_operand(const float *x, size_t row_elems, size_t b,
			      bool bf16, __nv_bfloat16 *room,
			      const void **out, flow_diag_t *diag,
			      cudaStream_t stream)
{
	*out = x + b * row_elems;
	if (!bf16)
		return FLOW_OK;
	*out = room;
	return flow_cuda__round_bf16(room, x + b * row_elems, row_elems, diag,
				     stream);
}

/* Column-major strided-batched C = alpha op(A) op(B) + beta C, fp32 C: an
 * sgemm, or on bf16 A and B summed in fp32 (CUBLAS_COMPUTE_32F). */
static flow_err_t bgemm(cublasHandle_t h, bool bf16, cublasOperation_t opa,
			cublasOperation_t opb, size_t m, size_t n, size_t k,
			float alpha, const void *a, size_t lda, size_t sa,
			const void *b, size_t ldb, size_t sb, float beta,
			float *c, size_t ldc, size_t sc, size_t batch,
			flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;

	if (bf16)
		FLOW_CUBLAS_TRY(cublasGemmStridedBatchedEx(
					h, opa, opb, (int)m, (int)n, (int)k,
					&alpha, a, CUDA_R_16BF, (int)lda,
					(long long)sa, b, CUDA_R_16BF, (int)ldb,
					(long long)sb, &beta, c, CUDA_R_32F,
					(int)ldc, (long long)sc, (int)batch,
					CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
				out);
	else
		FLOW_CUBLAS_TRY(cublasSgemmStridedBatched(
					h, opa, opb, (int)m, (int)n, (int)k,
					&alpha, (const float *)a, (int)lda,
					(long long)sa, (const float *)b,
					(int)ldb, (long long)sb, &beta, c,
					(int)ldc, (long long)sc, (int)batch),
				out);
out:
	return err;
}

flow_err_t flow_cuda_attention_forward(float *out, float *lse, void *scratch,
				       bool bf16, const float *qkv, size_t B,
				       size_t T, size_t C, size_t NH,
				       flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	size_t hs = 0, rows = 0;
	float scale = 0.0f;
	attention_scratch s = {};
	flow_cudnn_plan_t *plan = NULL;

	if (B == 0 || T == 0 || C == 0)
		return FLOW_OK;
	FLOW_TRY(attention_check(B, T, C, NH, __func__, diag), out);
	if (bf16 && (plan = flow_cuda__cudnn_attention_plan(false, B, T, C,
							     NH))) {
		att_cudnn++;
		return cudnn_forward(plan, out, lse, scratch, qkv, B, T, C, NH,
				     diag, stream);
	}
	if (bf16)
		own_bf16_pass();
	hs = C / NH;
	rows = NH * T;
	scale = 1.0f / sqrtf((float)hs);
	s = attention_carve(scratch, T, C, NH, bf16);
	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	for (size_t b = 0; b < B; b++) {
		const void *x = NULL;
		FLOW_TRY(row_operand(qkv, T * 3 * C, b, bf16, s.qkv, &x, diag,
				     stream),
			 out);
		/* att^T (T x T) = scale * k (hs x T, op T) . q^T (hs x T) */
		FLOW_TRY(bgemm(h, bf16, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs,
			       scale, elem(x, C, bf16), 3 * C, hs, x, 3 * C,
			       hs, 0.0f, s.att, T, T * T, NH, diag),
			 out);
		causal_softmax_kernel<<<flow_cuda__grid(rows, ATT_WARPS),
					ATT_WARPS * 32, 0, stream>>>(
			s.att, bf16 ? s.pb : NULL, lse + b * rows, NULL, rows,
			T);
		FLOW_CUDA_LAUNCH_TRY(out);
		/* out^T (hs x T) = v^T (hs x T) . att^T (T x T) */
		FLOW_TRY(bgemm(h, bf16, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T,
			       1.0f, elem(x, 2 * C, bf16), 3 * C, hs,
			       bf16 ? (const void *)s.pb : s.att, T, T * T,
			       0.0f, out + b * T * C, C, hs, NH, diag),
			 out);
	}
out:
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
	own = attention_layout(T, C, NH, bf16).end;
	/* A pure function: whether cuDNN will take the sizes is not known
	 * here, so a build with cuDNN plans room for either path. */
	if (bf16 && flow_cuda__cudnn_built())
		fused = cudnn_layout(B, T, C, NH).end;
	return own > fused ? own : fused;
}

flow_err_t flow_cuda_attention_backward(float *dqkv, void *scratch, bool bf16,
					const float *dout, const float *qkv,
					const float *lse, const float *out,
					size_t B, size_t T, size_t C, size_t NH,
					flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cublasHandle_t h = NULL;
	size_t hs = 0, rows = 0;
	float scale = 0.0f;
	attention_scratch s = {};
	flow_cudnn_plan_t *plan = NULL;

	if (B == 0 || T == 0 || C == 0)
		return FLOW_OK;
	FLOW_TRY(attention_check(B, T, C, NH, __func__, diag), out);
	if (bf16 && (plan = flow_cuda__cudnn_attention_plan(true, B, T, C,
							     NH))) {
		att_cudnn++;
		return cudnn_backward(plan, dqkv, scratch, dout, qkv, lse, out,
				      B, T, C, NH, diag, stream);
	}
	if (bf16)
		own_bf16_pass();
	hs = C / NH;
	rows = NH * T;
	scale = 1.0f / sqrtf((float)hs);
	s = attention_carve(scratch, T, C, NH, bf16);
	FLOW_TRY(flow_cuda__cublas(&h, stream, diag), out);
	for (size_t b = 0; b < B; b++) {
		const void *x = NULL, *g = NULL;
		const void *p = bf16 ? (const void *)s.pb : s.att;
		const void *dp = bf16 ? (const void *)s.db : s.datt;
		float *dq = dqkv + b * T * 3 * C;
		FLOW_TRY(row_operand(qkv, T * 3 * C, b, bf16, s.qkv, &x, diag,
				     stream),
			 out);
		FLOW_TRY(row_operand(dout, T * C, b, bf16, s.dout, &g, diag,
				     stream),
			 out);
		/* att as forward, from lse */
		FLOW_TRY(bgemm(h, bf16, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs,
			       scale, elem(x, C, bf16), 3 * C, hs, x, 3 * C,
			       hs, 0.0f, s.att, T, T * T, NH, diag),
			 out);
		causal_softmax_kernel<<<flow_cuda__grid(rows, ATT_WARPS),
					ATT_WARPS * 32, 0, stream>>>(
			s.att, bf16 ? s.pb : NULL, NULL, lse + b * rows, rows,
			T);
		FLOW_CUDA_LAUNCH_TRY(out);
		/* datt^T (T x T) = v (hs x T, op T) . dout^T (hs x T) */
		FLOW_TRY(bgemm(h, bf16, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs,
			       1.0f, elem(x, 2 * C, bf16), 3 * C, hs, g, C, hs,
			       0.0f, s.datt, T, T * T, NH, diag),
			 out);
		causal_softmax_backward_kernel<<<flow_cuda__grid(rows,
								 ATT_WARPS),
						 ATT_WARPS * 32, 0, stream>>>(
			s.datt, bf16 ? s.db : NULL, s.att, rows, T, scale);
		FLOW_CUDA_LAUNCH_TRY(out);
		/* dv^T (hs x T) += dout^T (hs x T) . att (att^T stored, op T) */
		FLOW_TRY(bgemm(h, bf16, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T,
			       1.0f, g, C, hs, p, T, T * T, 1.0f, dq + 2 * C,
			       3 * C, hs, NH, diag),
			 out);
		/* dq^T (hs x T) += k^T (hs x T) . dpre^T (dpre stored) */
		FLOW_TRY(bgemm(h, bf16, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T,
			       1.0f, elem(x, C, bf16), 3 * C, hs, dp, T, T * T,
			       1.0f, dq, 3 * C, hs, NH, diag),
			 out);
		/* dk^T (hs x T) += q^T (hs x T) . dpre (dpre^T stored, op T) */
		FLOW_TRY(bgemm(h, bf16, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T,
			       1.0f, x, 3 * C, hs, dp, T, T * T, 1.0f,
			       dq + C, 3 * C, hs, NH, diag),
			 out);
	}
out:
	return err;
}
