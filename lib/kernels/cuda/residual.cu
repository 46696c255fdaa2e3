/* Residual add on the GPU, and its bf16 twins (the branch b, and its
 * gradient, bf16; the residual stream fp32).  Mirrors cpu/residual.c; one
 * float addition per element (and in bf16 one rounding), so the results
 * equal the CPU's bit for bit. */
#include <config.h>

#include "cuda_internal.h"

#define RES_THREADS 256

template <typename TB>
static __global__ void residual_forward_kernel(float *__restrict__ out,
					       const float *__restrict__ a,
					       const TB *__restrict__ b,
					       size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		out[i] = a[i] + flow_load(&b[i]);
}

/* da += dout; db += dout (either may be NULL).  Not __restrict__: da and db
 * are distinct from dout by contract, but nothing is gained from it here. */
template <typename TB>
static __global__ void residual_backward_kernel(float *da, TB *db,
						const float *dout, size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride) {
		const float g = dout[i];
		if (da)
			da[i] += g;
		if (db)
			flow_accumulate(&db[i], g);
	}
}

template <typename TB>
static flow_err_t residual_forward(float *out, const float *a, const TB *b,
				   size_t n, flow_diag_t *diag,
				   cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	if (n == 0)
		return FLOW_OK;
	residual_forward_kernel<<<flow_cuda__grid(n, RES_THREADS * 4),
				  RES_THREADS, 0, stream>>>(out, a, b, n);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

template <typename TB>
static flow_err_t residual_backward(float *da, TB *db, const float *dout,
				    size_t n, flow_diag_t *diag,
				    cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	if (n == 0 || (!da && !db))
		return FLOW_OK;
	residual_backward_kernel<<<flow_cuda__grid(n, RES_THREADS * 4),
				   RES_THREADS, 0, stream>>>(da, db, dout, n);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

flow_err_t flow_cuda_residual_forward(float *out, const float *a,
				      const float *b, size_t n,
				      flow_diag_t *diag, cudaStream_t stream)
{
	return residual_forward(out, a, b, n, diag, stream);
}

flow_err_t flow_cuda_residual_backward(float *da, float *db, const float *dout,
				       size_t n, flow_diag_t *diag,
				       cudaStream_t stream)
{
	return residual_backward(da, db, dout, n, diag, stream);
}

flow_err_t flow_cuda_residual_bf16_forward(float *out, const float *a,
					   const flow_bf16_t *b, size_t n,
					   flow_diag_t *diag,
					   cudaStream_t stream)
{
	return residual_forward(out, a, flow_cuda__bf16(b), n, diag, stream);
}

flow_err_t flow_cuda_residual_bf16_backward(float *da, flow_bf16_t *db,
					    const float *dout, size_t n,
					    flow_diag_t *diag,
					    cudaStream_t stream)
{
	return residual_backward(da, flow_cuda__bf16(db), dout, n, diag,
				 stream);
}
