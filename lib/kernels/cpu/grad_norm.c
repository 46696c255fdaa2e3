/* CPU global gradient-norm clipping (torch.nn.utils.clip_grad_norm_) and the
 * thread-count-invariant sum of squares it is built on. */
#include <config.h>

#include <math.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

static double sum_squares_chunk(const float *restrict x, size_t n)
{
	double s = 0.0;

#pragma omp simd reduction(+ : s)
	for (size_t i = 0; i < n; i++)
		s += (double)x[i] * (double)x[i];
	return s;
}

double flow_cpu_sum_squares(const float *x, size_t n)
{
	size_t nchunks = (n + FLOW_CPU_SQ_CHUNK - 1) / FLOW_CPU_SQ_CHUNK;
	double total = 0.0;

	/* Chunks of FLOW_CPU_SQ_CHUNK elements have fixed boundaries; their
	 * partials are added in chunk order, so the result is the same bits for
	 * any thread count.  Groups of chunks bound the stack buffer. */
	for (size_t g0 = 0; g0 < nchunks; g0 += FLOW_CPU_SQ_GROUP) {
		size_t ng = nchunks - g0 < FLOW_CPU_SQ_GROUP ?
				    nchunks - g0 : FLOW_CPU_SQ_GROUP;
		double part[FLOW_CPU_SQ_GROUP];

#pragma omp parallel for schedule(static)
		for (size_t k = 0; k < ng; k++) {
			size_t off = (g0 + k) * FLOW_CPU_SQ_CHUNK;
			size_t len = n - off < FLOW_CPU_SQ_CHUNK ?
					     n - off : FLOW_CPU_SQ_CHUNK;
			part[k] = sum_squares_chunk(x + off, len);
		}
		for (size_t k = 0; k < ng; k++)
			total += part[k];
	}
	return total;
}

void flow_cpu_scale(float *x, size_t n, float s)
{
	float *restrict y = x;

#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		y[i] *= s;
}

void flow_cpu_clip_to_norm(float *const *grads, const size_t *counts,
			   size_t ntensors, float norm, float max_norm)
{
	/* PyTorch multiplies by the coefficient clamped to 1, the identity
	 * when it is 1: only a coefficient below 1 changes anything. */
	float coef = flow_clip_coef(norm, max_norm);
	if (coef < 1.0f)
		for (size_t i = 0; i < ntensors; i++)
			flow_cpu_scale(grads[i], counts[i], coef);
}

float flow_cpu_clip_grad_norm(float *const *grads, const size_t *counts,
			      size_t ntensors, float max_norm)
{
	double ss = 0.0;

	for (size_t i = 0; i < ntensors; i++)
		ss += flow_cpu_sum_squares(grads[i], counts[i]);
	float norm = (float)sqrt(ss);
	flow_cpu_clip_to_norm(grads, counts, ntensors, norm, max_norm);
	return norm;
}
