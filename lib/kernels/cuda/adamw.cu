/* AdamW on the GPU.  Mirrors cpu/adamw.c, which reproduces the arithmetic
 * and its order of torch.optim.AdamW's single-tensor path (PyTorch 1.13):
 *
 *   p = p * (1 - lr*wd)                     (when the tensor decays)
 *   m = m*b1 + (1-b1)*g
 *   v = v*b2 + ((1-b2)*g)*g
 *   denom = sqrt(v) / sqrt(1 - b2^t) + eps
 *   p = p + (-(lr / (1 - b1^t)) * m) / denom      (addcdiv_, left to right)
 *
 * The scalars are computed on the host in double from the float
 * hyper-parameters, then rounded once to float, as Python does before torch
 * applies them to float tensors.  The element-wise steps use the _rn
 * intrinsics (IEEE-rounded, never contracted into FMAs), so each update
 * equals the CPU's bit for bit when the CPU build does not contract either. */
#include <config.h>

#include <cmath>
#include <new>

#include "cuda_internal.h"

#define ADAMW_THREADS 256

struct adamw_scalars {
	float decay;     /* 1 - lr*wd, or 1 */
	float b1;
	float w1;        /* 1 - b1 */
	float b2;
	float w2;        /* 1 - b2 */
	float bc2_sqrt;  /* sqrt(1 - b2^t) */
	float eps;
	float neg_step;  /* -lr / (1 - b1^t) */
	bool do_decay;
};

/* Element i of one tensor: the update, written once for both kernels. */
static __device__ __forceinline__ void adamw_element(
	float *__restrict__ param, const float *__restrict__ grad,
	float *__restrict__ m, float *__restrict__ v, size_t i, bool do_decay,
	const adamw_scalars &s)
{
	float p = param[i];
	const float g = grad[i];
	float mi = m[i], vi = v[i];
	if (do_decay)
		p = __fmul_rn(p, s.decay);
	mi = __fadd_rn(__fmul_rn(mi, s.b1), __fmul_rn(s.w1, g));
	vi = __fadd_rn(__fmul_rn(vi, s.b2), __fmul_rn(__fmul_rn(s.w2, g), g));
	const float denom =
		__fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
	p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step, mi), denom));
	param[i] = p;
	m[i] = mi;
	v[i] = vi;
}

static __global__ void adamw_kernel(float *__restrict__ param,
				    const float *__restrict__ grad,
				    float *__restrict__ m, float *__restrict__ v,
				    size_t n, adamw_scalars s)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		adamw_element(param, grad, m, v, i, s.do_decay, s);
}

/* One tensor of a multi-tensor update, and one tile of CHUNK elements of
 * one of them: a block per tile. */
struct adamw_tensor {
	float *param;
	const float *grad;
	float *m, *v;
	size_t n;
	bool decay;
};
struct adamw_tile {
	uint32_t tensor;
	size_t start;
};
#define ADAMW_CHUNK ((size_t)65536)

static __global__ void adamw_all_kernel(const adamw_tensor *__restrict__ tensors,
					const adamw_tile *__restrict__ tiles,
					adamw_scalars s)
{
	const adamw_tile tile = tiles[blockIdx.x];
	const adamw_tensor t = tensors[tile.tensor];
	size_t end = tile.start + ADAMW_CHUNK;
	if (end > t.n)
		end = t.n;
	for (size_t i = tile.start + threadIdx.x; i < end; i += blockDim.x)
		adamw_element(t.param, t.grad, t.m, t.v, i, t.decay, s);
}

/* The scalars of step t, in double from the float hyper-parameters and
 * rounded once, as Python does. */
static adamw_scalars scalars_of(const flow_adamw_params_t *hp, uint64_t t,
				bool decay)
{
	adamw_scalars s;
	double bc1 = 1.0 - std::pow((double)hp->beta1, (double)t);
	double bc2 = 1.0 - std::pow((double)hp->beta2, (double)t);
	s.decay = (float)(1.0 - (double)hp->lr * (double)hp->weight_decay);
	s.do_decay = decay;
	s.b1 = hp->beta1;
	s.w1 = (float)(1.0 - (double)hp->beta1);
	s.b2 = hp->beta2;
	s.w2 = (float)(1.0 - (double)hp->beta2);
	s.bc2_sqrt = (float)std::sqrt(bc2);
	s.eps = hp->eps;
	s.neg_step = (float)(-((double)hp->lr / bc1));
	return s;
}

flow_err_t flow_cuda_adamw_update(float *param, const float *grad, float *m,
				  float *v, size_t n,
				  const flow_adamw_params_t *hp, uint64_t t,
				  bool decay, flow_diag_t *diag,
				  cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	adamw_scalars s;

	if (t == 0) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "step t of '%s' is 1-based, got 0", __func__);
		goto out;
	}
	if (n == 0)
		goto out;
	s = scalars_of(hp, t, decay);
	adamw_kernel<<<flow_cuda__grid(n, ADAMW_THREADS * 4), ADAMW_THREADS, 0,
		       stream>>>(param, grad, m, v, n, s);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

flow_err_t flow_cuda_adamw_update_all(float *const *params,
				      const float *const *grads,
				      float *const *m, float *const *v,
				      const size_t *counts, const bool *decay,
				      size_t ntensors,
				      const flow_adamw_params_t *hp, uint64_t t,
				      flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	adamw_tensor *tensors = nullptr, *d_tensors = nullptr;
	adamw_tile *tiles = nullptr, *d_tiles = nullptr;
	size_t ntiles = 0, k = 0;

	if (t == 0) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "step t of '%s' is 1-based, got 0", __func__);
		goto out;
	}
	for (size_t i = 0; i < ntensors; i++)
		ntiles += flow_cuda__ceil_div(counts[i], ADAMW_CHUNK);
	if (ntiles == 0)
		goto out;
	FLOW_TRY(flow_cuda__check_size(diag, __func__, "tiles", ntiles, INT_MAX),
		 out);
	FLOW_TRY(flow_cuda__check_size(diag, __func__, "ntensors", ntensors,
				       UINT32_MAX),
		 out);
	tensors = new (std::nothrow) adamw_tensor[ntensors];
	tiles = new (std::nothrow) adamw_tile[ntiles];
	if (!tensors || !tiles) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM,
				    "out of memory for %zu AdamW tiles", ntiles);
		goto out;
	}
	for (size_t i = 0; i < ntensors; i++) {
		tensors[i] = { params[i], grads[i], m[i], v[i], counts[i],
			       decay[i] };
		for (size_t start = 0; start < counts[i]; start += ADAMW_CHUNK)
			tiles[k++] = { (uint32_t)i, start };
	}
	/* The tables go up stream-ordered and are freed after the launch
	 * that reads them, in stream order too. */
	FLOW_CUDA_TRY(cudaMallocAsync((void **)&d_tensors,
				      ntensors * sizeof *tensors, stream),
		      out);
	FLOW_CUDA_TRY(cudaMallocAsync((void **)&d_tiles, ntiles * sizeof *tiles,
				      stream),
		      out);
	FLOW_CUDA_TRY(cudaMemcpyAsync(d_tensors, tensors,
				      ntensors * sizeof *tensors,
				      cudaMemcpyHostToDevice, stream),
		      out);
	FLOW_CUDA_TRY(cudaMemcpyAsync(d_tiles, tiles, ntiles * sizeof *tiles,
				      cudaMemcpyHostToDevice, stream),
		      out);
	adamw_all_kernel<<<(unsigned)ntiles, ADAMW_THREADS, 0, stream>>>(
		d_tensors, d_tiles, scalars_of(hp, t, false));
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	if (d_tiles)
		(void)cudaFreeAsync(d_tiles, stream);
	if (d_tensors)
		(void)cudaFreeAsync(d_tensors, stream);
	/* Pageable sources: the copies have read them when they return. */
	delete[] tiles;
	delete[] tensors;
	return err;
}
