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

static __global__ void adamw_kernel(float *__restrict__ param,
				    const float *__restrict__ grad,
				    float *__restrict__ m, float *__restrict__ v,
				    size_t n, adamw_scalars s)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride) {
		float p = param[i];
		const float g = grad[i];
		float mi = m[i], vi = v[i];
		if (s.do_decay)
			p = __fmul_rn(p, s.decay);
		mi = __fadd_rn(__fmul_rn(mi, s.b1), __fmul_rn(s.w1, g));
		vi = __fadd_rn(__fmul_rn(vi, s.b2),
			       __fmul_rn(__fmul_rn(s.w2, g), g));
		const float denom =
			__fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
		p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step, mi), denom));
		param[i] = p;
		m[i] = mi;
		v[i] = vi;
	}
}

flow_err_t flow_cuda_adamw_update(float *param, const float *grad, float *m,
				  float *v, size_t n,
				  const flow_adamw_params_t *hp, uint64_t t,
				  bool decay, flow_diag_t *diag,
				  cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	adamw_scalars s;
	double bc1 = 0.0, bc2 = 0.0;

	if (t == 0) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "step t of '%s' is 1-based, got 0", __func__);
		goto out;
	}
	if (n == 0)
		goto out;
	bc1 = 1.0 - std::pow((double)hp->beta1, (double)t);
	bc2 = 1.0 - std::pow((double)hp->beta2, (double)t);
	s.decay = (float)(1.0 - (double)hp->lr * (double)hp->weight_decay);
	s.do_decay = decay;
	s.b1 = hp->beta1;
	s.w1 = (float)(1.0 - (double)hp->beta1);
	s.b2 = hp->beta2;
	s.w2 = (float)(1.0 - (double)hp->beta2);
	s.bc2_sqrt = (float)std::sqrt(bc2);
	s.eps = hp->eps;
	s.neg_step = (float)(-((double)hp->lr / bc1));
	adamw_kernel<<<flow_cuda__grid(n, ADAMW_THREADS * 4), ADAMW_THREADS, 0,
		       stream>>>(param, grad, m, v, n, s);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}
