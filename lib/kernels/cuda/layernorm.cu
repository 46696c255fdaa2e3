/* LayerNorm over the last dimension on the GPU, its forward fused with the
 * residual add before it, and their bf16 twins (the normalised output, its
 * gradient and the add's branch bf16; the input, the residual stream and
 * the statistics fp32), one template over those operands' element type.
 * Mirrors cpu/layernorm.c.
 *
 * Forward and the dinp part of backward give one warp to each row (lanes
 * stride the channels, so each warp reads contiguous 128-byte segments); the
 * statistics are two-pass (mean, then the mean of squared deviations) with
 * double sums, as the CPU reference.  dweight/dbias are column sums over
 * rows (float products, double sums), done by a separate deterministic
 * column-reduction kernel. */
#include <config.h>

#include "cuda_internal.h"

#define LN_WARPS 8 /* rows per block */
#define LN_COLS_ROWS 32 /* row partitions of the column-sum kernel */

/* One warp per row.  With RESIDUAL the row is first res = a + b (each
 * lane writes and then reads back only its own channels, so no barrier),
 * as residual_forward's one float addition; otherwise it is inp.  TB is
 * the element type of b, TO of out. */
template <bool RESIDUAL, typename TB, typename TO>
static __global__ void layernorm_forward_kernel(
	TO *__restrict__ out, float *__restrict__ mean,
	float *__restrict__ rstd, float *res, const float *inp,
	const TB *__restrict__ b, const float *__restrict__ weight,
	const float *__restrict__ bias, size_t n, size_t C)
{
	const unsigned lane = threadIdx.x & 31;
	const size_t row_stride = (size_t)gridDim.x * LN_WARPS;
	for (size_t r = (size_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
	     r < n; r += row_stride) {
		const float *x = RESIDUAL ? res + r * C : inp + r * C;
		TO *y = out + r * C;
		double sum = 0.0;
		for (size_t c = lane; c < C; c += 32) {
			if (RESIDUAL) {
				const float v =
					__fadd_rn(inp[r * C + c],
						  flow_load(&b[r * C + c]));
				res[r * C + c] = v;
				sum += v;
			} else {
				sum += x[c];
			}
		}
		const double md = flow_warp_sum_d(sum) / (double)C;
		double sq = 0.0;
		for (size_t c = lane; c < C; c += 32) {
			const double d = x[c] - md;
			sq += d * d;
		}
		const double var = flow_warp_sum_d(sq) / (double)C;
		const float m = (float)md;
		const float s =
			(float)(1.0 / sqrt(var + (double)FLOW_LAYERNORM_EPS));
		for (size_t c = lane; c < C; c += 32) {
			/* (x - m) * s * w + b, rounded step by step as the CPU
			 * reference (no FMA contraction). */
			const float norm = __fmul_rn(__fsub_rn(x[c], m), s);
			flow_store(&y[c], __fadd_rn(__fmul_rn(norm, weight[c]),
						    bias[c]));
		}
		if (lane == 0) {
			if (mean)
				mean[r] = m;
			if (rstd)
				rstd[r] = s;
		}
	}
}

/* dinp += the gradient of the layernorm's input, a warp per row.  With
 * RESIDUAL, dinp is the residual stream's gradient dres, and each element
 * once summed is added into da and db (each optional), as
 * residual_backward's one float addition each: the lane that wrote it
 * reads it, so no barrier.  TD is the element type of dout and db. */
template <bool RESIDUAL, typename TD>
static __global__ void layernorm_dinp_kernel(
	float *__restrict__ dinp, float *__restrict__ da,
	TD *__restrict__ db, const TD *__restrict__ dout,
	const float *__restrict__ inp, const float *__restrict__ weight,
	const float *__restrict__ mean, const float *__restrict__ rstd,
	size_t n, size_t C)
{
	const unsigned lane = threadIdx.x & 31;
	const size_t row_stride = (size_t)gridDim.x * LN_WARPS;
	for (size_t r = (size_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
	     r < n; r += row_stride) {
		const float *x = inp + r * C;
		const TD *dy = dout + r * C;
		float *dx = dinp + r * C;
		const float m = mean[r], s = rstd[r];
		double a = 0.0, b = 0.0;
		for (size_t c = lane; c < C; c += 32) {
			const float norm = __fmul_rn(__fsub_rn(x[c], m), s);
			const float dnorm =
				__fmul_rn(flow_load(&dy[c]), weight[c]);
			a += dnorm;
			b += __fmul_rn(dnorm, norm);
		}
		const float dnorm_mean = (float)(flow_warp_sum_d(a) / (double)C);
		const float dnorm_norm_mean =
			(float)(flow_warp_sum_d(b) / (double)C);
		for (size_t c = lane; c < C; c += 32) {
			const float norm = __fmul_rn(__fsub_rn(x[c], m), s);
			const float dnorm =
				__fmul_rn(flow_load(&dy[c]), weight[c]);
			float d = __fsub_rn(dnorm, dnorm_mean);
			d = __fsub_rn(d, __fmul_rn(norm, dnorm_norm_mean));
			const float g = __fadd_rn(dx[c], __fmul_rn(d, s));
			dx[c] = g;
			if (RESIDUAL && da)
				da[r * C + c] = __fadd_rn(da[r * C + c], g);
			if (RESIDUAL && db)
				flow_accumulate(&db[r * C + c], g);
		}
	}
}

/* dweight[c] += sum_r dout[r,c] * norm[r,c]; dbias[c] += sum_r dout[r,c].
 * Block (32, LN_COLS_ROWS) owns 32 columns; thread y takes rows y,
 * y + LN_COLS_ROWS, ... in order; partials are combined in y order. */
template <typename TD>
static __global__ void layernorm_dparams_kernel(
	float *__restrict__ dweight, float *__restrict__ dbias,
	const TD *__restrict__ dout, const float *__restrict__ inp,
	const float *__restrict__ mean, const float *__restrict__ rstd,
	size_t n, size_t C)
{
	__shared__ double pw[LN_COLS_ROWS][33];
	__shared__ double pb[LN_COLS_ROWS][33];
	const size_t c = (size_t)blockIdx.x * 32 + threadIdx.x;
	double aw = 0.0, ab = 0.0;
	if (c < C) {
		for (size_t r = threadIdx.y; r < n; r += LN_COLS_ROWS) {
			const float dy = flow_load(&dout[r * C + c]);
			const float norm = __fmul_rn(
				__fsub_rn(inp[r * C + c], mean[r]), rstd[r]);
			aw += __fmul_rn(dy, norm);
			ab += dy;
		}
	}
	pw[threadIdx.y][threadIdx.x] = aw;
	pb[threadIdx.y][threadIdx.x] = ab;
	__syncthreads();
	if (threadIdx.y == 0 && c < C) {
		double sw = 0.0, sb = 0.0;
		for (int y = 0; y < LN_COLS_ROWS; y++) {
			sw += pw[y][threadIdx.x];
			sb += pb[y][threadIdx.x];
		}
		if (dweight)
			dweight[c] += (float)sw;
		if (dbias)
			dbias[c] += (float)sb;
	}
}

template <bool RESIDUAL, typename TB, typename TO>
static flow_err_t layernorm_forward(float *res, TO *out, float *mean,
				    float *rstd, const float *inp, const TB *b,
				    const float *weight, const float *bias,
				    size_t n, size_t C, flow_diag_t *diag,
				    cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;

	if (n == 0 || C == 0)
		return FLOW_OK;
	layernorm_forward_kernel<RESIDUAL, TB, TO>
		<<<flow_cuda__grid(n, LN_WARPS), LN_WARPS * 32, 0, stream>>>(
			out, mean, rstd, res, inp, b, weight, bias, n, C);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

flow_err_t flow_cuda_layernorm_forward(float *out, float *mean, float *rstd,
				       const float *inp, const float *weight,
				       const float *bias, size_t n, size_t C,
				       flow_diag_t *diag, cudaStream_t stream)
{
	return layernorm_forward<false>(NULL, out, mean, rstd, inp,
					(const float *)NULL, weight, bias, n,
					C, diag, stream);
}

flow_err_t flow_cuda_layernorm_bf16_forward(flow_bf16_t *out, float *mean,
					    float *rstd, const float *inp,
					    const float *weight,
					    const float *bias, size_t n,
					    size_t C, flow_diag_t *diag,
					    cudaStream_t stream)
{
	return layernorm_forward<false>(NULL, flow_cuda__bf16(out), mean, rstd,
					inp, (const __nv_bfloat16 *)NULL,
					weight, bias, n, C, diag, stream);
}

flow_err_t flow_cuda_residual_layernorm_forward(
	float *res, float *out, float *mean, float *rstd, const float *a,
	const float *b, const float *weight, const float *bias, size_t n,
	size_t C, flow_diag_t *diag, cudaStream_t stream)
{
	return layernorm_forward<true>(res, out, mean, rstd, a, b, weight, bias,
				       n, C, diag, stream);
}

flow_err_t flow_cuda_residual_layernorm_bf16_forward(
	float *res, flow_bf16_t *out, float *mean, float *rstd, const float *a,
	const flow_bf16_t *b, const float *weight, const float *bias, size_t n,
	size_t C, flow_diag_t *diag, cudaStream_t stream)
{
	return layernorm_forward<true>(res, flow_cuda__bf16(out), mean, rstd, a,
				       flow_cuda__bf16(b), weight, bias, n, C,
				       diag, stream);
}

/* The layernorm's backward (dinp, then the parameters' column sums),
 * with the residual add's backward fused into the dinp pass when da or db
 * is given. */
template <typename TD>
static flow_err_t layernorm_backward(float *dinp, float *da, TD *db,
				     float *dweight, float *dbias,
				     const TD *dout, const float *inp,
				     const float *weight, const float *mean,
				     const float *rstd, size_t n, size_t C,
				     flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	const dim3 block(32, LN_COLS_ROWS);

	if (n == 0 || C == 0)
		return FLOW_OK;
	if (dinp && (da || db)) {
		layernorm_dinp_kernel<true, TD><<<flow_cuda__grid(n, LN_WARPS),
						  LN_WARPS * 32, 0, stream>>>(
			dinp, da, db, dout, inp, weight, mean, rstd, n, C);
		FLOW_CUDA_LAUNCH_TRY(out);
	} else if (dinp) {
		layernorm_dinp_kernel<false, TD><<<flow_cuda__grid(n, LN_WARPS),
						   LN_WARPS * 32, 0, stream>>>(
			dinp, NULL, NULL, dout, inp, weight, mean, rstd, n, C);
		FLOW_CUDA_LAUNCH_TRY(out);
	}
	if (dweight || dbias) {
		FLOW_TRY(flow_cuda__check_size(diag, __func__, "C", C,
					       (size_t)INT_MAX * 32),
			 out);
		layernorm_dparams_kernel<TD>
			<<<(unsigned)flow_cuda__ceil_div(C, 32), block, 0,
			   stream>>>(dweight, dbias, dout, inp, mean, rstd, n,
				     C);
		FLOW_CUDA_LAUNCH_TRY(out);
	}
out:
	return err;
}

flow_err_t flow_cuda_layernorm_backward(float *dinp, float *dweight,
					float *dbias, const float *dout,
					const float *inp, const float *weight,
					const float *mean, const float *rstd,
					size_t n, size_t C, flow_diag_t *diag,
					cudaStream_t stream)
{
	return layernorm_backward(dinp, NULL, (float *)NULL, dweight, dbias,
				  dout, inp, weight, mean, rstd, n, C, diag,
				  stream);
}

flow_err_t flow_cuda_layernorm_bf16_backward(float *dinp, float *dweight,
					     float *dbias,
					     const flow_bf16_t *dout,
					     const float *inp,
					     const float *weight,
					     const float *mean,
					     const float *rstd, size_t n,
					     size_t C, flow_diag_t *diag,
					     cudaStream_t stream)
{
	return layernorm_backward(dinp, NULL, (__nv_bfloat16 *)NULL, dweight,
				  dbias, flow_cuda__bf16(dout), inp, weight,
				  mean, rstd, n, C, diag, stream);
}

flow_err_t flow_cuda_layernorm_residual_backward(
	float *dres, float *da, float *db, float *dweight, float *dbias,
	const float *dout, const float *res, const float *weight,
	const float *mean, const float *rstd, size_t n, size_t C,
	flow_diag_t *diag, cudaStream_t stream)
{
	return layernorm_backward(dres, da, db, dweight, dbias, dout, res,
				  weight, mean, rstd, n, C, diag, stream);
}

flow_err_t flow_cuda_layernorm_residual_bf16_backward(
	float *dres, float *da, flow_bf16_t *db, float *dweight, float *dbias,
	const flow_bf16_t *dout, const float *res, const float *weight,
	const float *mean, const float *rstd, size_t n, size_t C,
	flow_diag_t *diag, cudaStream_t stream)
{
	return layernorm_backward(dres, da, flow_cuda__bf16(db), dweight, dbias,
				  flow_cuda__bf16(dout), res, weight, mean,
				  rstd, n, C, diag, stream);
}
