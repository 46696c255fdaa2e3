/* Residual add on the GPU.  Mirrors cpu/residual.c; one float addition per
 * element, so the results equal the CPU's bit for bit. */
#include <config.h>

#include "cuda_internal.h"

#define RES_THREADS 256

static __global__ void residual_forward_kernel(float *__restrict__ out,
					       const float *__restrict__ a,
					       const float *__restrict__ b,
					       size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		out[i] = a[i] + b[i];
}

/* da += dout; db += dout (either may be NULL).  Not __restrict__: da and db
 * are distinct from dout by contract, but nothing is gained from it here. */
static __global__ void residual_backward_kernel(float *da, float *db,
						const float *dout, size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride) {
		const float g = dout[i];
		if (da)
			da[i] += g;
		if (db)
			db[i] += g;
	}
}

flow_err_t flow_cuda_residual_forward(float *out, const float *a,
				      const float *b, size_t n,
				      flow_diag_t *diag, cudaStream_t stream)
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

flow_err_t flow_cuda_residual_backward(float *da, float *db, const float *dout,
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
