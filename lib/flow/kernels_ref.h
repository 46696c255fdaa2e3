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

/* out[n,o] = sum_i inp[n,i] * weight[o,i] + bias[o]; bias may be NULL. */
FLOW_EXPORT void flow_ref_matmul_forward(float *out, const float *inp,
					 const float *weight, const float *bias,
					 size_t n, size_t in_dim, size_t out_dim);
/* dinp[n,i] += sum_o dout[n,o] * weight[o,i];
 * dweight[o,i] += sum_n dout[n,o] * inp[n,i]; dbias[o] += sum_n dout[n,o].
 * dinp, dweight, dbias are each optional. */
FLOW_EXPORT void flow_ref_matmul_backward(float *dinp, float *dweight,
					  float *dbias, const float *dout,
					  const float *inp, const float *weight,
					  size_t n, size_t in_dim,
					  size_t out_dim);

/* out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. */
FLOW_EXPORT void flow_ref_embedding_forward(float *out, const int32_t *tokens,
					    const float *wte, const float *wpe,
					    size_t B, size_t T, size_t C);
/* dwte[v,:] += sum over positions whose token is v of dout[b,t,:];
 * dwpe[t,:] += sum_b dout[b,t,:].  Each is summed in double and added once. */
FLOW_EXPORT void flow_ref_embedding_backward(float *dwte, float *dwpe,
					     const float *dout,
					     const int32_t *tokens, size_t B,
					     size_t T, size_t C);

/* Two-pass mean and biased variance in double, rstd = 1/sqrt(var + eps)
 * with eps = FLOW_LAYERNORM_EPS. */
FLOW_EXPORT void flow_ref_layernorm_forward(float *out, float *mean,
					    float *rstd, const float *inp,
					    const float *weight,
					    const float *bias, size_t n,
					    size_t C);
/* With xhat = (inp - mean) * rstd and g = dout * weight:
 * dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat));
 * dweight[c] += sum_n dout * xhat; dbias[c] += sum_n dout. */
FLOW_EXPORT void flow_ref_layernorm_backward(float *dinp, float *dweight,
					     float *dbias, const float *dout,
					     const float *inp,
					     const float *weight,
					     const float *mean,
					     const float *rstd, size_t n,
					     size_t C);

/* gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). */
FLOW_EXPORT void flow_ref_gelu_forward(float *out, const float *inp,
				       size_t n);
/* dinp += gelu'(inp) * dout. */
FLOW_EXPORT void flow_ref_gelu_backward(float *dinp, const float *inp,
					const float *dout, size_t n);

/* Causal attention as flow_cpu_attention_forward: one (b, h, t) row at a
 * time, scores q.k/sqrt(hs) for s <= t, softmax in double, att zero above
 * the diagonal. */
FLOW_EXPORT void flow_ref_attention_forward(float *out, float *att,
					    const float *qkv, size_t B,
					    size_t T, size_t C, size_t NH);
/* Bytes of scratch flow_ref_attention_backward needs: one T x T matrix of
 * doubles (the score gradients of one head). */
FLOW_EXPORT size_t flow_ref_attention_scratch_bound(size_t B, size_t T,
						    size_t C, size_t NH);
/* dqkv += gradient through the saved probabilities att:
 * dv[s] = sum_t att[t,s] dout[t]; datt[t,s] = dout[t].v[s];
 * dpre[t,s] = att[t,s] (datt[t,s] - sum_s' att[t,s'] datt[t,s']);
 * dq[t] = sum_s dpre[t,s] k[s] / sqrt(hs); dk[s] = sum_t dpre[t,s] q[t] /
 * sqrt(hs).  scratch holds flow_ref_attention_scratch_bound() bytes, aligned
 * for double. */
FLOW_EXPORT void flow_ref_attention_backward(float *dqkv, void *scratch,
					     const float *dout,
					     const float *qkv,
					     const float *att, size_t B,
					     size_t T, size_t C, size_t NH);

FLOW_EXPORT void flow_ref_residual_forward(float *out, const float *a,
					   const float *b, size_t n);
FLOW_EXPORT void flow_ref_residual_backward(float *da, float *db,
					    const float *dout, size_t n);

/* As flow_cpu_cross_entropy_forward_backward: losses[r] and, in place,
 * logits[r,:] = dloss * (softmax - onehot) on the first V columns and 0 on
 * the padding; rows with a negative target give loss 0 and gradient 0. */
FLOW_EXPORT void flow_ref_cross_entropy_forward_backward(float *losses,
							 float *logits,
							 const int32_t *targets,
							 size_t n, size_t V,
							 size_t Vp,
							 float dloss);

/* AdamW exactly as documented for flow_cpu_adamw_update, in double. */
FLOW_EXPORT void flow_ref_adamw_update(float *param, const float *grad,
				       float *m, float *v, size_t n,
				       const flow_adamw_params_t *hp,
				       uint64_t t, bool decay);

/* Sum of squares in double, in index order. */
FLOW_EXPORT double flow_ref_sum_squares(const float *x, size_t n);
/* x *= s. */
FLOW_EXPORT void flow_ref_scale(float *x, size_t n, float s);
/* As flow_cpu_clip_grad_norm: returns the norm before clipping, and scales
 * every gradient by max_norm / (norm + 1e-6) when norm > max_norm > 0. */
FLOW_EXPORT float flow_ref_clip_grad_norm(float *const *grads,
					  const size_t *counts,
					  size_t ntensors, float max_norm);

#ifdef __cplusplus
}
#endif

#endif
