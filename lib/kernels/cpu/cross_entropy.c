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
 * same bits whatever the thread count.  Rows are fp32 or, in the bf16
 * twins, bf16 (cpu_internal.h). */
#define CE_LANES 8

FLOW_CPU_INLINE float row_max(const void *x, size_t n, bool bf16)
{
	float m[CE_LANES];
	size_t j = 0;
	for (size_t l = 0; l < CE_LANES; l++)
		m[l] = flow_cpu_act_load(x, 0, bf16);
	for (; j + CE_LANES <= n; j += CE_LANES)
		for (size_t l = 0; l < CE_LANES; l++) {
			float v = flow_cpu_act_load(x, j + l, bf16);
			m[l] = v > m[l] ? v : m[l];
		}
	for (; j < n; j++) {
		float v = flow_cpu_act_load(x, j, bf16);
		m[0] = v > m[0] ? v : m[0];
	}
	for (size_t l = 1; l < CE_LANES; l++)
		m[0] = m[l] > m[0] ? m[l] : m[0];
	return m[0];
}

/* The sum of exp(x[j] - maxv) in double (a float sum of ~50k terms drifts
 * by ~1e-5 relative, the whole budget), in one pass while the row is in
 * cache.  An fp32 row keeps each exponential in place for the gradient's
 * pass; a bf16 row could not hold them, so that pass computes them
 * again, to the same floats. */
FLOW_CPU_INLINE double row_exp_sum(void *x, size_t n, float maxv, bool bf16)
{
	double s[CE_LANES] = { 0 };
	size_t j = 0;
	for (; j + CE_LANES <= n; j += CE_LANES)
		for (size_t l = 0; l < CE_LANES; l++) {
			float e = flow_cpu_expf(
				flow_cpu_act_load(x, j + l, bf16) - maxv);
			if (!bf16)
				((float *)x)[j + l] = e;
			s[l] += e;
		}
	for (; j < n; j++) {
		float e = flow_cpu_expf(flow_cpu_act_load(x, j, bf16) - maxv);
		if (!bf16)
			((float *)x)[j] = e;
		s[0] += e;
	}
	double sum = 0.0;
	for (size_t l = 0; l < CE_LANES; l++)
		sum += s[l];
	return sum;
}

/* One row's loss and, over it, its gradient. */
FLOW_CPU_INLINE void cross_entropy_row(float *loss, void *x, int32_t tgt,
				       size_t V, size_t Vp, float dloss,
				       bool bf16)
{
	/* An ignored row (negative target) contributes nothing. */
	if (tgt < 0 || V == 0) {
		*loss = 0.0f;
		memset(x, 0, Vp * (bf16 ? sizeof(flow_bf16_t) : sizeof(float)));
		return;
	}

	float maxv = row_max(x, V, bf16);
	float xt = flow_cpu_act_load(x, (size_t)tgt, bf16);
	double sum = row_exp_sum(x, V, maxv, bf16);
	*loss = (float)(log(sum) - ((double)xt - (double)maxv));

	float inv = (float)(1.0 / sum);
	float pt = (bf16 ? flow_cpu_expf(xt - maxv) : ((float *)x)[tgt]) * inv;
	for (size_t j = 0; j < V; j++) {
		float e = bf16 ? flow_cpu_expf(flow_cpu_act_load(x, j, true) -
					       maxv) :
				 ((float *)x)[j];
		flow_cpu_act_store(x, j, dloss * (e * inv), bf16);
	}
	flow_cpu_act_store(x, (size_t)tgt, dloss * (pt - 1.0f), bf16);
	for (size_t j = V; j < Vp; j++)
		flow_cpu_act_store(x, j, 0.0f, bf16);
}

void flow_cpu_cross_entropy_forward_backward(float *losses, float *logits,
					     const int32_t *targets, size_t n,
					     size_t V, size_t Vp, float dloss)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++)
		cross_entropy_row(&losses[r], logits + r * Vp, targets[r], V,
				  Vp, dloss, false);
}

void flow_cpu_cross_entropy_bf16_forward_backward(float *losses,
						  flow_bf16_t *logits,
						  const int32_t *targets,
						  size_t n, size_t V, size_t Vp,
						  float dloss)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < n; r++)
		cross_entropy_row(&losses[r], logits + r * Vp, targets[r], V,
				  Vp, dloss, true);
}

/* ---- over a column shard ---------------------------------------------------- */

/* The maximum of a row's real columns here (-inf when it holds none). */
FLOW_CPU_INLINE float split_row_max(const void *x,
				    const flow_logits_shard_t *s, bool bf16)
{
	float m = -INFINITY;
	for (size_t j = 0; j < s->valid; j++)
		m = fmaxf(m, flow_cpu_act_load(x, j, bf16));
	return m;
}

/* Row r's maximum over the group's, and its sum of exponentials here. */
FLOW_CPU_INLINE void split_row_sums(float *sum, float *max,
				    const float *gathered, size_t p, size_t r,
				    const void *x,
				    const flow_logits_shard_t *s, bool bf16)
{
	float m = gathered[r];
	for (size_t q = 1; q < p; q++)
		m = fmaxf(m, gathered[q * s->n + r]);
	*max = m;
	double acc = 0.0;
	for (size_t j = 0; j < s->valid; j++)
		acc += exp((double)flow_cpu_act_load(x, j, bf16) - m);
	*sum = (float)acc;
}

/* Row r's partial loss and, over its columns here, its gradient. */
FLOW_CPU_INLINE void split_row_finish(float *loss, void *x, int32_t target,
				      float max, float sum,
				      const flow_logits_shard_t *s,
				      float dloss, bool bf16)
{
	int64_t t = target - s->c0;
	bool counted = target >= 0;
	bool held = counted && t >= 0 && t < (int64_t)s->valid;
	double l = s->first && counted ? log((double)sum) + max : 0.0;
	if (held)
		l -= flow_cpu_act_load(x, (size_t)t, bf16);
	*loss = (float)l;
	for (size_t j = 0; j < s->cols; j++) {
		float v = flow_cpu_act_load(x, j, bf16);
		float pj = j < s->valid && counted ?
				   (float)(exp((double)v - max) / sum) : 0.0f;
		if (held && (int64_t)j == t)
			pj -= 1.0f;
		flow_cpu_act_store(x, j, dloss * pj, bf16);
	}
}

void flow_cpu_cross_entropy_split_max(float *max, const float *logits,
				      const flow_logits_shard_t *s)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < s->n; r++)
		max[r] = split_row_max(logits + r * s->cols, s, false);
}

void flow_cpu_cross_entropy_split_sums(float *sums, float *max,
				       const float *gathered, size_t p,
				       const float *logits,
				       const flow_logits_shard_t *s)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < s->n; r++)
		split_row_sums(&sums[r], &max[r], gathered, p, r,
			       logits + r * s->cols, s, false);
}

void flow_cpu_cross_entropy_split_finish(float *losses, float *logits,
					 const int32_t *targets,
					 const float *max, const float *sums,
					 const flow_logits_shard_t *s,
					 float dloss)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < s->n; r++)
		split_row_finish(&losses[r], logits + r * s->cols, targets[r],
				 max[r], sums[r], s, dloss, false);
}

void flow_cpu_cross_entropy_bf16_split_max(float *max,
					   const flow_bf16_t *logits,
					   const flow_logits_shard_t *s)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < s->n; r++)
		max[r] = split_row_max(logits + r * s->cols, s, true);
}

void flow_cpu_cross_entropy_bf16_split_sums(float *sums, float *max,
					    const float *gathered, size_t p,
					    const flow_bf16_t *logits,
					    const flow_logits_shard_t *s)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < s->n; r++)
		split_row_sums(&sums[r], &max[r], gathered, p, r,
			       logits + r * s->cols, s, true);
}

void flow_cpu_cross_entropy_bf16_split_finish(float *losses,
					      flow_bf16_t *logits,
					      const int32_t *targets,
					      const float *max,
					      const float *sums,
					      const flow_logits_shard_t *s,
					      float dloss)
{
#pragma omp parallel for schedule(static)
	for (size_t r = 0; r < s->n; r++)
		split_row_finish(&losses[r], logits + r * s->cols, targets[r],
				 max[r], sums[r], s, dloss, true);
}
