/* CPU GELU, tanh approximation, with the same formula and operation order as
 * PyTorch's approximate='tanh' kernels; tanh is flow_cpu_tanhf (max abs
 * error 8e-8, libm's tanhf 1e-7) so the loops vectorise.  Never build this
 * with -ffast-math: finite-math and reassociation change tanh's large-|x|
 * behaviour (llm.c issue #168). */
#include <config.h>

#include <math.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

/* sqrt(2/pi) and the cubic coefficient, rounded to float once as PyTorch
 * does (kBeta = M_SQRT2 * M_2_SQRTPI * 0.5 cast to float); spelled out
 * because M_SQRT2 is not ISO C. */
#define GELU_BETA ((float)0.79788456080286535588)
#define GELU_KAPPA 0.044715f

/* gelu(x) and its slope gelu'(x), PyTorch's arithmetic. */
static inline float gelu_value(float x)
{
	float inner = GELU_BETA * (x + GELU_KAPPA * x * x * x);
	return 0.5f * x * (1.0f + flow_cpu_tanhf(inner));
}

static inline float gelu_slope(float x)
{
	float x2 = x * x;
	float inner = GELU_BETA * (x + GELU_KAPPA * x2 * x);
	float th = flow_cpu_tanhf(inner);
	float left = 0.5f * x;
	float right = 1.0f + th;
	float dleft = 0.5f * right;
	float dinner = GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x2);
	float dright = left * (1.0f - th * th) * dinner;
	return dleft + dright;
}

void flow_cpu_gelu_forward(float *out, const float *inp, size_t n)
{
	float *restrict o = out;
	const float *restrict x = inp;

#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		o[i] = gelu_value(x[i]);
}

void flow_cpu_gelu_backward(float *dinp, const float *inp, const float *dout,
			    size_t n)
{
	float *restrict g = dinp;
	const float *restrict x = inp;
	const float *restrict d = dout;

#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		g[i] += d[i] * gelu_slope(x[i]);
}

void flow_cpu_gelu_bf16_forward(flow_bf16_t *out, const flow_bf16_t *inp,
				size_t n)
{
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		out[i] = flow_bf16_narrow(gelu_value(flow_bf16_widen(inp[i])));
}

void flow_cpu_gelu_bf16_backward(flow_bf16_t *dinp, const flow_bf16_t *inp,
				 const flow_bf16_t *dout, size_t n)
{
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		dinp[i] = flow_bf16_narrow(
			flow_bf16_widen(dinp[i]) +
			flow_bf16_widen(dout[i]) *
				gelu_slope(flow_bf16_widen(inp[i])));
}
