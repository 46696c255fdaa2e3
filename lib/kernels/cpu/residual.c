/* CPU residual add, out = a + b, and its backward (the gradient flows
 * unchanged into both addends), and their bf16 twins. */
#include <config.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

void flow_cpu_residual_forward(float *out, const float *a, const float *b,
			       size_t n)
{
	float *restrict o = out;
	const float *restrict x = a;
	const float *restrict y = b;

#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		o[i] = x[i] + y[i];
}

void flow_cpu_residual_backward(float *da, float *db, const float *dout,
				size_t n)
{
	const float *restrict d = dout;

	/* One pass over dout for both gradients when both are wanted. */
	if (da && db) {
		float *restrict ga = da;
		float *restrict gb = db;
#pragma omp parallel for simd schedule(static)
		for (size_t i = 0; i < n; i++) {
			ga[i] += d[i];
			gb[i] += d[i];
		}
		return;
	}
	float *restrict g = da ? da : db;
	if (!g)
		return;
#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		g[i] += d[i];
}

/* a, out and da are the residual stream, fp32; b and db the branch. */
void flow_cpu_residual_bf16_forward(float *out, const float *a,
				    const flow_bf16_t *b, size_t n)
{
	float *restrict o = out;
	const float *restrict x = a;
	const flow_bf16_t *restrict y = b;

#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		o[i] = x[i] + flow_bf16_widen(y[i]);
}

void flow_cpu_residual_bf16_backward(float *da, flow_bf16_t *db,
				     const float *dout, size_t n)
{
	const float *restrict d = dout;

	if (da) {
		float *restrict ga = da;
#pragma omp parallel for simd schedule(static)
		for (size_t i = 0; i < n; i++)
			ga[i] += d[i];
	}
	if (db) {
		flow_bf16_t *restrict gb = db;
#pragma omp parallel for simd schedule(static)
		for (size_t i = 0; i < n; i++)
			gb[i] = flow_bf16_narrow(flow_bf16_widen(gb[i]) + d[i]);
	}
}
