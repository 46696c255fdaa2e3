/* GELU, tanh approximation (PyTorch approximate='tanh'), on the GPU.
 * Mirrors cpu/gelu.c: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * Element-wise grid-stride loops; tanhf (not a fast intrinsic) for
 * accuracy. */
#include <config.h>

#include "cuda_internal.h"

#define GELU_THREADS 256
#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_COEF 0.044715f

static __global__ void gelu_forward_kernel(float *__restrict__ out,
					   const float *__restrict__ inp,
					   size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride) {
		const float x = inp[i];
		const float cube = GELU_COEF * x * x * x;
		out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
	}
}

static __global__ void gelu_backward_kernel(float *__restrict__ dinp,
					    const float *__restrict__ inp,
					    const float *__restrict__ dout,
					    size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride) {
		const float x = inp[i];
		const float cube = GELU_COEF * x * x * x;
		const float tanh_arg = GELU_SCALE * (x + cube);
		const float tanh_out = tanhf(tanh_arg);
		const float sech2 = 1.0f - tanh_out * tanh_out;
		const float grad =
			0.5f * (1.0f + tanh_out) +
			x * 0.5f * sech2 * GELU_SCALE *
				(1.0f + 3.0f * GELU_COEF * x * x);
		dinp[i] += grad * dout[i];
	}
}

flow_err_t flow_cuda_gelu_forward(float *out, const float *inp, size_t n,
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

flow_err_t flow_cuda_gelu_backward(float *dinp, const float *inp,
				   const float *dout, size_t n,
				   flow_diag_t *diag, cudaStream_t stream)
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
