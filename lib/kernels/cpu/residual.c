/* CPU residual add, out = a + b, and its backward (the gradient flows
 * unchanged into both addends). */
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
