/* CPU causal multi-head self-attention, forward and backward.  Work is split
 * across (batch, head) pairs; each pair is O(T^2 * hs), including the
 * softmax backward, which uses dpre = att * (datt - sum_j att*datt) instead
 * of llm.c's O(T^3) Jacobian loop.  The loops are written by hand rather
 * than as cblas calls: they run inside an OpenMP parallel region, where a
 * threaded OpenBLAS would start its own pool on top of ours. */
#include <config.h>

#include <math.h>
#include <string.h>

#include <flow/kernels.h>

#include "cpu_internal.h"

static inline float attention_dot(const float *restrict a,
				  const float *restrict b, size_t n)
{
	float s = 0.0f;

#pragma omp simd reduction(+ : s)
	for (size_t i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

static inline void attention_axpy(float *restrict y, float a,
				  const float *restrict x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += a * x[i];
}

void flow_cpu_attention_forward(float *out, float *att, const float *qkv,
				size_t B, size_t T, size_t C, size_t NH)
{
	size_t hs = C / NH;
	size_t C3 = 3 * C;
	float scale = 1.0f / sqrtf((float)hs);

#pragma omp parallel for collapse(2) schedule(static)
	for (size_t b = 0; b < B; b++) {
		for (size_t h = 0; h < NH; h++) {
			const float *base = qkv + b * T * C3 + h * hs;
			float *abase = att + (b * NH + h) * T * T;

			for (size_t t = 0; t < T; t++) {
				const float *q = base + t * C3;
				float *restrict a = abase + t * T;
				float *restrict o = out + (b * T + t) * C + h * hs;
				float maxv, sum = 0.0f;

				for (size_t j = 0; j <= t; j++)
					a[j] = scale * attention_dot(q,
						base + j * C3 + C, hs);
				maxv = a[0];
				for (size_t j = 1; j <= t; j++)
					maxv = a[j] > maxv ? a[j] : maxv;
				/* exp(x - max) never overflows; the row has at
				 * least one term equal to 1, so sum >= 1. */
				for (size_t j = 0; j <= t; j++) {
					a[j] = flow_cpu_expf(a[j] - maxv);
					sum += a[j];
				}
				float inv = 1.0f / sum;
				for (size_t j = 0; j <= t; j++)
					a[j] *= inv;
				for (size_t j = t + 1; j < T; j++)
					a[j] = 0.0f;

				memset(o, 0, hs * sizeof(*o));
				for (size_t j = 0; j <= t; j++)
					attention_axpy(o, a[j],
						       base + j * C3 + 2 * C,
						       hs);
			}
		}
	}
}

size_t flow_cpu_attention_scratch_bound(size_t B, size_t T, size_t C,
					size_t NH)
{
	/* One datt row per (b,h), so pairs never share scratch whatever the
	 * thread count (B*NH*T floats, tiny next to att's B*NH*T*T). */
	return B * NH * flow_cpu_attention_row_stride(T) * sizeof(float);
}

void flow_cpu_attention_backward(float *dqkv, void *scratch,
				 const float *dout, const float *qkv,
				 const float *att, size_t B, size_t T,
				 size_t C, size_t NH)
{
	size_t hs = C / NH;
	size_t C3 = 3 * C;
	size_t stride = flow_cpu_attention_row_stride(T);
	float scale = 1.0f / sqrtf((float)hs);

#pragma omp parallel for collapse(2) schedule(static)
	for (size_t b = 0; b < B; b++) {
		for (size_t h = 0; h < NH; h++) {
			const float *base = qkv + b * T * C3 + h * hs;
			float *dbase = dqkv + b * T * C3 + h * hs;
			const float *abase = att + (b * NH + h) * T * T;
			float *restrict datt =
				(float *)scratch + (b * NH + h) * stride;

			for (size_t t = 0; t < T; t++) {
				const float *restrict a = abase + t * T;
				const float *dout_t =
					dout + (b * T + t) * C + h * hs;
				const float *q = base + t * C3;
				float *dq = dbase + t * C3;
				float s = 0.0f;

				/* out_t = sum_j a_j v_j: datt_j = dout_t . v_j,
				 * dv_j += a_j dout_t. */
				for (size_t j = 0; j <= t; j++) {
					datt[j] = attention_dot(dout_t,
						base + j * C3 + 2 * C, hs);
					attention_axpy(dbase + j * C3 + 2 * C,
						       a[j], dout_t, hs);
				}
				/* Softmax backward in O(t):
				 * dpre_j = a_j (datt_j - sum_k a_k datt_k). */
				for (size_t j = 0; j <= t; j++)
					s += a[j] * datt[j];
				/* pre_j = scale q_t . k_j */
				for (size_t j = 0; j <= t; j++) {
					float dpre = scale * (a[j] *
							      (datt[j] - s));
					attention_axpy(dq, dpre,
						       base + j * C3 + C, hs);
					attention_axpy(dbase + j * C3 + C,
						       dpre, q, hs);
				}
			}
		}
	}
}
