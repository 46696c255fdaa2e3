/* CPU fused softmax cross-entropy: per row, the loss and (in place over the
 * logits) its gradient, in one kernel so the (n, Vp) probabilities are never
 * materialised as a second vocabulary-sized tensor. */
#include <config.h>

#include <math.h>
#include <string.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

void flow_cpu_cross_entropy_forward_backward(float *losses, float *logits,
					     const int32_t *targets, size_t n,
					     size_t V, size_t Vp, float dloss)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++) {
		float *restrict x = logits + r * Vp;
		int32_t tgt = targets[r];

		/* An ignored row (negative target) contributes nothing. */
		if (tgt < 0 || V == 0) {
			losses[r] = 0.0f;
			memset(x, 0, Vp * sizeof(*x));
			continue;
		}

		float maxv = x[0];
		for (size_t j = 1; j < V; j++)
			maxv = x[j] > maxv ? x[j] : maxv;

		/* Keep exp(x - max) in place and sum it in double: a float sum
		 * of ~50k terms drifts by ~1e-5 relative, the whole budget. */
		float xt = x[tgt];
		double sum = 0.0;
		for (size_t j = 0; j < V; j++)
			x[j] = flow_cpu_expf(x[j] - maxv); /* vectorises */
		for (size_t j = 0; j < V; j++)
			sum += x[j];
		losses[r] = (float)(log(sum) - ((double)xt - (double)maxv));

		float inv = (float)(1.0 / sum);
		float pt = x[tgt] * inv;
		for (size_t j = 0; j < V; j++)
			x[j] = dloss * (x[j] * inv);
		x[tgt] = dloss * (pt - 1.0f);
		for (size_t j = V; j < Vp; j++)
			x[j] = 0.0f;
	}
}
