/* CPU fused softmax cross-entropy: per row, the loss and (in place over the
 * logits) its gradient, in one kernel so the (n, Vp) probabilities are never
 * materialised as a second vocabulary-sized tensor; and the same over a
 * column shard of the logits, in the three steps flow/kernels.h gives. */
#include <config.h>

#include <math.h>
#include <string.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

/* Rows are 50k wide, so a single accumulator would make the row's max and
 * sum one long chain of dependent operations; CE_LANES independent
 * accumulators, combined in a fixed order, let them vectorise and give the
 * same bits whatever the thread count. */
#define CE_LANES 8

static float row_max(const float *restrict x, size_t n)
{
	float m[CE_LANES];
	size_t j = 0;
	for (size_t l = 0; l < CE_LANES; l++)
		m[l] = x[0];
	for (; j + CE_LANES <= n; j += CE_LANES)
		for (size_t l = 0; l < CE_LANES; l++)
			m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
	for (; j < n; j++)
		m[0] = x[j] > m[0] ? x[j] : m[0];
	for (size_t l = 1; l < CE_LANES; l++)
		m[0] = m[l] > m[0] ? m[l] : m[0];
	return m[0];
}

/* x[j] = exp(x[j] - maxv) in place, returning their sum in double (a float
 * sum of ~50k terms drifts by ~1e-5 relative, the whole budget); one pass
 * while the row is in cache. */
static double row_exp_sum(float *restrict x, size_t n, float maxv)
{
	double s[CE_LANES] = { 0 };
	size_t j = 0;
	for (; j + CE_LANES <= n; j += CE_LANES)
		for (size_t l = 0; l < CE_LANES; l++) {
			x[j + l] = flow_cpu_expf(x[j + l] - maxv);
			s[l] += x[j + l];
		}
	for (; j < n; j++) {
		x[j] = flow_cpu_expf(x[j] - maxv);
		s[0] += x[j];
	}
	double sum = 0.0;
	for (size_t l = 0; l < CE_LANES; l++)
		sum += s[l];
	return sum;
}

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

		float maxv = row_max(x, V);
		float xt = x[tgt];
		double sum = row_exp_sum(x, V, maxv);
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

/* ---- over a column shard ---------------------------------------------------- */

void flow_cpu_cross_entropy_split_max(float *max, const float *logits,
				      const flow_logits_shard_t *s)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < s->n; r++) {
		const float *x = logits + r * s->cols;
		float m = -INFINITY;
		for (size_t j = 0; j < s->valid; j++)
			m = fmaxf(m, x[j]);
		max[r] = m;
	}
}

void flow_cpu_cross_entropy_split_sums(float *sums, float *max,
				       const float *gathered, size_t p,
				       const float *logits,
				       const flow_logits_shard_t *s)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < s->n; r++) {
		const float *x = logits + r * s->cols;
		float m = gathered[r];
		for (size_t q = 1; q < p; q++)
			m = fmaxf(m, gathered[q * s->n + r]);
		max[r] = m;
		double sum = 0.0;
		for (size_t j = 0; j < s->valid; j++)
			sum += exp((double)x[j] - m);
		sums[r] = (float)sum;
	}
}

void flow_cpu_cross_entropy_split_finish(float *losses, float *logits,
					 const int32_t *targets,
					 const float *max, const float *sums,
					 const flow_logits_shard_t *s,
					 float dloss)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < s->n; r++) {
		float *x = logits + r * s->cols;
		int64_t t = targets[r] - s->c0;
		bool counted = targets[r] >= 0;
		bool held = counted && t >= 0 && t < (int64_t)s->valid;
		double loss = s->first && counted ?
				      log((double)sums[r]) + max[r] : 0.0;
		if (held)
			loss -= x[t];
		losses[r] = (float)loss;
		for (size_t j = 0; j < s->cols; j++) {
			float pj = j < s->valid && counted ?
					   (float)(exp((double)x[j] - max[r]) /
						   sums[r]) :
					   0.0f;
			if (held && (int64_t)j == t)
				pj -= 1.0f;
			x[j] = dloss * pj;
		}
	}
}
