/* Reference kernels: a second, deliberately naive implementation of every CPU
 * kernel in flow/kernels.h, used to check the optimised ones (flow-bench,
 * the unit tests).
 *
 * Each flow_ref_<op> has exactly the signature and the contract of the
 * matching flow_cpu_<op> (see flow/kernels.h: fp32 row-major tensors,
 * forward overwrites, backward ACCUMULATES, optional gradients may be NULL),
 * but is written for obviousness, not speed:
 * - plain loops in the order of the textbook formula, no blocking, no SIMD,
 *   no BLAS, no OpenMP: single-threaded, hence deterministic;
 * - every sum and every intermediate is computed in double, and each result
 *   is rounded to float once, when it is stored (or added to a gradient).
 * So a reference result is the exact result to within one float rounding
 * plus double-precision error, the yardstick for |a - b| <= atol + rtol*|ref|.
 *
 * Cost is that of the naive algorithm (a matmul is n*in*out multiply-adds
 * at scalar speed): callers that check large shapes check a sample (see
 * flow-bench(1), section OUTPUT). All functions are thread-safe: they touch
 * only their arguments. */
#ifndef FLOW_KERNELS_REF_H
#define FLOW_KERNELS_REF_H

#include <flow/common.h>
#include <flow/kernels.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same contract as flow_cpu_matmul_forward in <flow/kernels.h>, computed
 * naively in double. */
FLOW_EXPORT void flow_ref_matmul_forward(float *out, const float *inp,
					 const float *weight, const float *bias,
					 size_t n, size_t in_dim, size_t out_dim);
/* Same contract as flow_cpu_matmul_backward in <flow/kernels.h>, computed
 * naively in double. */
FLOW_EXPORT void flow_ref_matmul_backward(float *dinp, float *dweight,
					  float *dbias, const float *dout,
					  const float *inp, const float *weight,
					  size_t n, size_t in_dim,
					  size_t out_dim);

/* Same contract as flow_cpu_embedding_forward in <flow/kernels.h>, computed
 * naively in double. */
FLOW_EXPORT void flow_ref_embedding_forward(float *out, const int32_t *tokens,
					    const float *wte, const float *wpe,
					    size_t B, size_t T, size_t C);
/* Same contract as flow_cpu_embedding_backward in <flow/kernels.h>, computed
 * naively in double. */
FLOW_EXPORT void flow_ref_embedding_backward(float *dwte, float *dwpe,
					     const float *dout,
					     const int32_t *tokens, size_t B,
					     size_t T, size_t C);

/* Same contract as flow_cpu_layernorm_forward in <flow/kernels.h>, computed
 * naively in double: a two-pass mean and biased variance. */
FLOW_EXPORT void flow_ref_layernorm_forward(float *out, float *mean,
					    float *rstd, const float *inp,
					    const float *weight,
					    const float *bias, size_t n,
					    size_t C);
/* Same contract as flow_cpu_layernorm_backward in <flow/kernels.h>, computed
 * naively in double: with xhat = (inp - mean) * rstd and g = dout * weight,
 * dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat));
 * dweight[c] += sum_n dout * xhat; dbias[c] += sum_n dout. */
FLOW_EXPORT void flow_ref_layernorm_backward(float *dinp, float *dweight,
					     float *dbias, const float *dout,
					     const float *inp,
					     const float *weight,
					     const float *mean,
					     const float *rstd, size_t n,
					     size_t C);

/* Same contract as flow_cpu_gelu_forward in <flow/kernels.h>, computed
 * naively in double:
 * gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). */
FLOW_EXPORT void flow_ref_gelu_forward(float *out, const float *inp,
				       size_t n);
/* Same contract as flow_cpu_gelu_backward in <flow/kernels.h>, computed
 * naively in double. */
FLOW_EXPORT void flow_ref_gelu_backward(float *dinp, const float *inp,
					const float *dout, size_t n);

/* Same contract as flow_cpu_attention_forward in <flow/kernels.h>, computed
 * naively in double, one (b, h, t) row at a time. */
FLOW_EXPORT void flow_ref_attention_forward(float *out, float *att,
					    const float *qkv, size_t B,
					    size_t T, size_t C, size_t NH);
/* Bytes of scratch flow_ref_attention_backward needs: one T x T matrix of
 * doubles (the score gradients of one head). */
FLOW_EXPORT size_t flow_ref_attention_scratch_bound(size_t B, size_t T,
						    size_t C, size_t NH);
/* Same contract as flow_cpu_attention_backward in <flow/kernels.h>, computed
 * naively in double, except that scratch holds
 * flow_ref_attention_scratch_bound() bytes, aligned for double:
 * dv[s] = sum_t att[t,s] dout[t]; datt[t,s] = dout[t].v[s];
 * dpre[t,s] = att[t,s] (datt[t,s] - sum_s' att[t,s'] datt[t,s']);
 * dq[t] = sum_s dpre[t,s] k[s] / sqrt(hs); dk[s] = sum_t dpre[t,s] q[t] /
 * sqrt(hs). */
FLOW_EXPORT void flow_ref_attention_backward(float *dqkv, void *scratch,
					     const float *dout,
					     const float *qkv,
					     const float *att, size_t B,
					     size_t T, size_t C, size_t NH);

/* Same contract as flow_cpu_residual_forward in <flow/kernels.h>, computed
 * naively in double. */
FLOW_EXPORT void flow_ref_residual_forward(float *out, const float *a,
					   const float *b, size_t n);
/* Same contract as flow_cpu_residual_backward in <flow/kernels.h>, computed
 * naively in double. */
FLOW_EXPORT void flow_ref_residual_backward(float *da, float *db,
					    const float *dout, size_t n);

/* Same contract as flow_cpu_cross_entropy_forward_backward in
 * <flow/kernels.h>, computed naively in double. */
FLOW_EXPORT void flow_ref_cross_entropy_forward_backward(float *losses,
							 float *logits,
							 const int32_t *targets,
							 size_t n, size_t V,
							 size_t Vp,
							 float dloss);

/* Same contract as flow_cpu_adamw_update in <flow/kernels.h>, computed
 * naively in double. */
FLOW_EXPORT void flow_ref_adamw_update(float *param, const float *grad,
				       float *m, float *v, size_t n,
				       const flow_adamw_params_t *hp,
				       uint64_t t, bool decay);

/* Same contract as flow_cpu_sum_squares in <flow/kernels.h>, computed
 * naively in double, in index order. */
FLOW_EXPORT double flow_ref_sum_squares(const float *x, size_t n);
/* Same contract as flow_cpu_scale in <flow/kernels.h>, computed naively in
 * double. */
FLOW_EXPORT void flow_ref_scale(float *x, size_t n, float s);
/* Same contract as flow_cpu_clip_grad_norm in <flow/kernels.h>, computed
 * naively in double. */
FLOW_EXPORT float flow_ref_clip_grad_norm(float *const *grads,
					  const size_t *counts,
					  size_t ntensors, float max_norm);

#ifdef __cplusplus
}
#endif

#endif
