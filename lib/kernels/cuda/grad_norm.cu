/* Global gradient-norm clipping on the GPU.  Mirrors cpu/grad_norm.c.
 *
 * Sum of squares: each square and every sum in double.  A tensor of n
 * elements is cut into blocks_for(n) blocks (a function of n alone, never of
 * the device); each block sums a fixed grid-stride subset and combines its
 * threads with flow_block_sum; one final block adds the per-block partials
 * in a fixed order.  So the result is the same on every run and every GPU.
 *
 * Clipping: all tensors' partials go to one buffer, one block reduces them
 * to the norm and the coefficient max_norm / (norm + 1e-6) (in float, as
 * torch.nn.utils.clip_grad_norm_ on float tensors) in device memory, and the
 * scale kernels read it there: no host round trip between the passes. */
#include <config.h>

#include <cmath>

#include "cuda_internal.h"

#define SS_THREADS 256
#define SS_MAX_BLOCKS 512
#define FINAL_THREADS 1024
#define SCALE_THREADS 256

static size_t blocks_for(size_t n)
{
	size_t b = flow_cuda__ceil_div(n, (size_t)SS_THREADS * 8);
	if (b > SS_MAX_BLOCKS)
		b = SS_MAX_BLOCKS;
	return b;
}

/* partials[blockIdx.x] = sum over this block's elements of x^2 (double). */
static __global__ void sum_squares_partial_kernel(double *__restrict__ partials,
						  const float *__restrict__ x,
						  size_t n)
{
	__shared__ double shared[32];
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	double acc = 0.0;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride) {
		const double xi = (double)x[i];
		acc += xi * xi;
	}
	acc = flow_block_sum(acc, shared);
	if (threadIdx.x == 0)
		partials[blockIdx.x] = acc;
}

/* One block: total = sum of the np partials; optional outputs: the total,
 * the float norm, and the clip coefficient (1 when max_norm <= 0). */
static __global__ void final_kernel(const double *__restrict__ partials,
				    size_t np, double *sum_out,
				    float *norm_out, float *coef_out,
				    float max_norm)
{
	__shared__ double shared[32];
	double acc = 0.0;
	for (size_t i = threadIdx.x; i < np; i += blockDim.x)
		acc += partials[i];
	acc = flow_block_sum(acc, shared);
	if (threadIdx.x == 0) {
		const float norm = (float)sqrt(acc);
		if (sum_out)
			*sum_out = acc;
		if (norm_out)
			*norm_out = norm;
		if (coef_out)
			*coef_out = max_norm > 0.0f
					    ? __fdiv_rn(max_norm,
							__fadd_rn(norm, 1e-6f))
					    : 1.0f;
	}
}

static __global__ void scale_kernel(float *__restrict__ x, size_t n, float s)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		x[i] *= s;
}

/* x *= *coef when *coef < 1 (the clip), else leave x alone. */
static __global__ void clip_kernel(float *__restrict__ x, size_t n,
				   const float *__restrict__ coef)
{
	const float c = *coef;
	if (!(c < 1.0f))
		return;
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		x[i] *= c;
}

flow_err_t flow_cuda_sum_squares(const float *x, size_t n, double *sum_out,
				 flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	const size_t nb = blocks_for(n);
	double *partials = NULL;
	cudaError_t free_e = cudaSuccess;

	if (n == 0) {
		FLOW_CUDA_TRY(cudaMemsetAsync(sum_out, 0, sizeof(double), stream),
			      out);
		goto out;
	}
	FLOW_CUDA_TRY(cudaMallocAsync((void **)&partials, nb * sizeof(double),
				      stream),
		      out);
	sum_squares_partial_kernel<<<(unsigned)nb, SS_THREADS, 0, stream>>>(
		partials, x, n);
	FLOW_CUDA_LAUNCH_TRY(out_free);
	final_kernel<<<1, FINAL_THREADS, 0, stream>>>(partials, nb, sum_out,
						       NULL, NULL, 0.0f);
	FLOW_CUDA_LAUNCH_TRY(out_free);
out_free:
	free_e = cudaFreeAsync(partials, stream);
	if (free_e != cudaSuccess && err == FLOW_OK)
		err = flow_cuda__fail(diag, free_e, __func__, __FILE__,
				      __LINE__);
out:
	return err;
}

flow_err_t flow_cuda_scale(float *x, size_t n, float s, flow_diag_t *diag,
			   cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	if (n == 0)
		return FLOW_OK;
	scale_kernel<<<flow_cuda__grid(n, SCALE_THREADS * 4), SCALE_THREADS, 0,
		       stream>>>(x, n, s);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

flow_err_t flow_cuda_clip_grad_norm(float *const *grads, const size_t *counts,
				    size_t ntensors, float max_norm,
				    float *norm_out, flow_diag_t *diag,
				    cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	size_t np = 0, off = 0;
	char *buf = NULL;
	double *partials = NULL;
	float *scalars = NULL; /* [0] norm, [1] coef */
	float norm_host = 0.0f;
	cudaError_t free_e = cudaSuccess;

	for (size_t i = 0; i < ntensors; i++)
		if (!flow_add_size(np, blocks_for(counts[i]), &np)) {
			err = flow_diag_set(diag, FLOW_ERR_RANGE,
					    "too many tensors in '%s'",
					    __func__);
			goto out;
		}
	/* partials (at least one, so the final kernel sees a valid pointer),
	 * then the two float scalars. */
	FLOW_CUDA_TRY(cudaMallocAsync((void **)&buf,
				      (np + 1) * sizeof(double) + 2 * sizeof(float),
				      stream),
		      out);
	partials = (double *)buf;
	scalars = (float *)(buf + (np + 1) * sizeof(double));
	for (size_t i = 0; i < ntensors; i++) {
		const size_t nb = blocks_for(counts[i]);
		if (nb == 0)
			continue;
		sum_squares_partial_kernel<<<(unsigned)nb, SS_THREADS, 0,
					     stream>>>(partials + off, grads[i],
						       counts[i]);
		FLOW_CUDA_LAUNCH_TRY(out_free);
		off += nb;
	}
	final_kernel<<<1, FINAL_THREADS, 0, stream>>>(
		partials, np, NULL, scalars, scalars + 1, max_norm);
	FLOW_CUDA_LAUNCH_TRY(out_free);
	if (max_norm > 0.0f) {
		for (size_t i = 0; i < ntensors; i++) {
			if (counts[i] == 0)
				continue;
			clip_kernel<<<flow_cuda__grid(counts[i],
						      SCALE_THREADS * 4),
				      SCALE_THREADS, 0, stream>>>(
				grads[i], counts[i], scalars + 1);
			FLOW_CUDA_LAUNCH_TRY(out_free);
		}
	}
	if (norm_out)
		FLOW_CUDA_TRY(cudaMemcpyAsync(&norm_host, scalars, sizeof(float),
					      cudaMemcpyDeviceToHost, stream),
			      out_free);
out_free:
	free_e = cudaFreeAsync(buf, stream);
	if (free_e != cudaSuccess && err == FLOW_OK)
		err = flow_cuda__fail(diag, free_e, __func__, __FILE__,
				      __LINE__);
	if (err == FLOW_OK && norm_out) {
		FLOW_CUDA_TRY(cudaStreamSynchronize(stream), out);
		*norm_out = norm_host;
	}
out:
	return err;
}
