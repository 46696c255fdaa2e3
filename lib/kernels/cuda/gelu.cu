/* GELU, tanh approximation (PyTorch approximate='tanh'), on the GPU, and its
 * bf16 twins.  Mirrors cpu/gelu.c: out = 0.5 x (1 + tanh(sqrt(2/pi) (x +
 * 0.044715 x^3))), flow_gelu and flow_gelu_slope of cuda_internal.h.
 * Element-wise grid-stride loops, one template over the activations'
 * element type. */
#include <config.h>

#include "cuda_internal.h"

#define GELU_THREADS 256

template <typename T>
static __global__ void gelu_forward_kernel(T *__restrict__ out,
					   const T *__restrict__ inp, size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		flow_store(&out[i], flow_gelu(flow_load(&inp[i])));
}

template <typename T>
static __global__ void gelu_backward_kernel(T *__restrict__ dinp,
					    const T *__restrict__ inp,
					    const T *__restrict__ dout,
					    size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		flow_accumulate(&dinp[i], flow_gelu_slope(flow_load(&inp[i])) *
						  flow_load(&dout[i]));
}

template <typename T>
static flow_err_t gelu_forward(T *out, const T *inp, size_t n,
			       flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	if (n == 0)
		return FLOW_OK;
	gelu_forward_kernel<<<flow_cuda__grid(n, GELU_THREADS * 4),
			      GELU_THREADS, 0, stream>>>(out, inp, n);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

template <typename T>
static flow_err_t gelu_backward(T *dinp, const T *inp, const T *dout,
				size_t n, flow_diag_t *diag,
				cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	if (n == 0)
		return FLOW_OK;
	gelu_backward_kernel<<<flow_cuda__grid(n, GELU_THREADS * 4),
			       GELU_THREADS, 0, stream>>>(dinp, inp, dout, n);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

flow_err_t flow_cuda_gelu_forward(float *out, const float *inp, size_t n,
				  flow_diag_t *diag, cudaStream_t stream)
{
	return gelu_forward(out, inp, n, diag, stream);
}

flow_err_t flow_cuda_gelu_backward(float *dinp, const float *inp,
				   const float *dout, size_t n,
				   flow_diag_t *diag, cudaStream_t stream)
{
	return gelu_backward(dinp, inp, dout, n, diag, stream);
}

flow_err_t flow_cuda_gelu_bf16_forward(flow_bf16_t *out,
				       const flow_bf16_t *inp, size_t n,
				       flow_diag_t *diag, cudaStream_t stream)
{
	return gelu_forward(flow_cuda__bf16(out), flow_cuda__bf16(inp), n, diag,
			    stream);
}

flow_err_t flow_cuda_gelu_bf16_backward(flow_bf16_t *dinp,
					const flow_bf16_t *inp,
					const flow_bf16_t *dout, size_t n,
					flow_diag_t *diag, cudaStream_t stream)
{
	return gelu_backward(flow_cuda__bf16(dinp), flow_cuda__bf16(inp),
			     flow_cuda__bf16(dout), n, diag, stream);
}
