/* CPU AdamW update with decoupled weight decay, reproducing the arithmetic
 * (and its order) of torch.optim.AdamW's single-tensor path in PyTorch 1.13,
 * so both agree to float rounding. */
#include <config.h>

#include <math.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <flow/kernels.h>

#include "cpu_internal.h"

/* Elements per OpenMP work item: big enough to amortise scheduling, small
 * enough to balance; the update is elementwise, so any split is exact. */
#define ADAMW_BLOCK 4096

typedef struct adamw_consts {
	float keep, b1, omb1, b2, omb2, bc2_sqrt, eps, neg_step;
} adamw_consts_t;

static void adamw_scalar(float *restrict p, const float *restrict g,
			 float *restrict m, float *restrict v, size_t n,
			 const adamw_consts_t *k)
{
	for (size_t i = 0; i < n; i++) {
		float mi = m[i] * k->b1 + k->omb1 * g[i];
		float vi = v[i] * k->b2 + k->omb2 * g[i] * g[i];
		float denom = sqrtf(vi) / k->bc2_sqrt + k->eps;
		m[i] = mi;
		v[i] = vi;
		/* addcdiv_: self + value * t1 / t2, left to right. */
		p[i] = p[i] * k->keep + k->neg_step * mi / denom;
	}
}

/* The same operations four lanes at a time.  Written with SSE2 intrinsics
 * because sqrtf may set errno, so without -fno-math-errno neither gcc nor
 * clang vectorises the scalar loop, and the update is then bound by scalar
 * sqrt/div rather than memory.  sqrt, mul, add and div are correctly
 * rounded in both forms, so vector and scalar lanes give the same bits. */
static void adamw_block(float *restrict p, const float *restrict g,
			float *restrict m, float *restrict v, size_t n,
			const adamw_consts_t *k)
{
	size_t i = 0;
#if defined(__SSE2__)
	const __m128 keep = _mm_set1_ps(k->keep), b1 = _mm_set1_ps(k->b1);
	const __m128 omb1 = _mm_set1_ps(k->omb1), b2 = _mm_set1_ps(k->b2);
	const __m128 omb2 = _mm_set1_ps(k->omb2);
	const __m128 bc2 = _mm_set1_ps(k->bc2_sqrt), eps = _mm_set1_ps(k->eps);
	const __m128 step = _mm_set1_ps(k->neg_step);

	for (; i + 4 <= n; i += 4) {
		__m128 gi = _mm_loadu_ps(g + i);
		__m128 mi = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(m + i), b1),
				       _mm_mul_ps(omb1, gi));
		__m128 vi = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(v + i), b2),
				       _mm_mul_ps(_mm_mul_ps(omb2, gi), gi));
		__m128 den = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), bc2), eps);
		__m128 pi = _mm_mul_ps(_mm_loadu_ps(p + i), keep);
		_mm_storeu_ps(m + i, mi);
		_mm_storeu_ps(v + i, vi);
		_mm_storeu_ps(p + i,
			      _mm_add_ps(pi, _mm_div_ps(_mm_mul_ps(step, mi),
							den)));
	}
#endif
	adamw_scalar(p + i, g + i, m + i, v + i, n - i, k);
}

void flow_cpu_adamw_update(float *param, const float *grad, float *m,
			   float *v, size_t n, const flow_adamw_params_t *hp,
			   uint64_t t, bool decay)
{
	/* PyTorch computes the scalars in double (Python floats) and casts
	 * each to float when it meets a float tensor; do the same. */
	double lr = hp->lr;
	double b1 = hp->beta1, b2 = hp->beta2;
	double bc1 = 1.0 - pow(b1, (double)t);
	double bc2 = 1.0 - pow(b2, (double)t);
	adamw_consts_t k = {
		/* p.mul_(1 - lr*wd) comes first; without decay, p * 1.0f is
		 * p exactly, so one code path serves both. */
		.keep = decay ? (float)(1.0 - lr * (double)hp->weight_decay) :
				1.0f,
		.b1 = hp->beta1,
		.omb1 = (float)(1.0 - b1),
		.b2 = hp->beta2,
		.omb2 = (float)(1.0 - b2),
		.bc2_sqrt = (float)sqrt(bc2),
		.eps = hp->eps,
		.neg_step = (float)(-(lr / bc1)),
	};
	size_t nblocks = (n + ADAMW_BLOCK - 1) / ADAMW_BLOCK;

#pragma omp parallel for schedule(static)
	for (size_t blk = 0; blk < nblocks; blk++) {
		size_t off = blk * ADAMW_BLOCK;
		size_t len = n - off < ADAMW_BLOCK ? n - off : ADAMW_BLOCK;
		adamw_block(param + off, grad + off, m + off, v + off, len,
			    &k);
	}
}
