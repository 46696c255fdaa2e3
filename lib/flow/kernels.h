/* CPU kernels, forward and backward, for the GPT op set.
 *
 * Conventions shared by every kernel here:
 * - fp32, contiguous, row-major; pointers must not alias unless a kernel says
 *   so; sizes are element counts.
 * - Forward kernels overwrite their outputs.
 * - Backward kernels ACCUMULATE (+=) into every gradient they write, so a
 *   tensor consumed twice (the residual stream) or a parameter used by several
 *   micro-batches simply sums its gradients; callers zero gradients first.
 *   Any gradient pointer documented as optional may be NULL to skip it.
 * - Kernels run on the calling thread's OpenMP team and BLAS.  Every result
 *   is bit-for-bit identical whatever the number of OpenMP threads:
 *   reductions use a fixed partition of the work, never one that depends on
 *   the thread count.  The GEMMs inside matmul are the BLAS's, so their bits
 *   also depend on the BLAS's own thread count and kernel choice (OpenBLAS
 *   0.3.21 is not invariant in its thread count for every shape or core
 *   type); keep the BLAS configuration fixed for reproducible runs.
 * - Kernels cannot fail given valid arguments; they do not check them.
 *
 * lib/kernels/cuda/ mirrors this file signature for signature (kernels_cuda.h).
 */
#ifndef FLOW_KERNELS_H
#define FLOW_KERNELS_H

#include <flow/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- matmul: out[n,o] = inp[n,i] . weight[o,i]^T + bias[o] ------------- */
/* weight is (out_dim, in_dim) as in PyTorch nn.Linear; bias may be NULL.
 * Computed with cblas_sgemm. */
FLOW_EXPORT void flow_cpu_matmul_forward(float *out, const float *inp,
					 const float *weight, const float *bias,
					 size_t n, size_t in_dim, size_t out_dim);
/* dinp[n,i] += dout . weight; dweight[o,i] += dout^T . inp;
 * dbias[o] += sum_n dout.  dinp, dweight, dbias are each optional. */
FLOW_EXPORT void flow_cpu_matmul_backward(float *dinp, float *dweight,
					  float *dbias, const float *dout,
					  const float *inp, const float *weight,
					  size_t n, size_t in_dim,
					  size_t out_dim);

/* ---- token + position embedding ---------------------------------------- */
/* out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; tokens are in [0, vocab). */
FLOW_EXPORT void flow_cpu_embedding_forward(float *out, const int32_t *tokens,
					    const float *wte, const float *wpe,
					    size_t B, size_t T, size_t C);
/* dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:].
 * dwte and dwpe are each optional. */
FLOW_EXPORT void flow_cpu_embedding_backward(float *dwte, float *dwpe,
					     const float *dout,
					     const int32_t *tokens, size_t B,
					     size_t T, size_t C);

/* ---- layernorm over the last dimension, eps = FLOW_LAYERNORM_EPS -------- */
#define FLOW_LAYERNORM_EPS 1e-5f
/* out[n,c] = (inp - mean) * rstd * weight[c] + bias[c]; mean and rstd are
 * (n) and are saved for the backward pass. */
FLOW_EXPORT void flow_cpu_layernorm_forward(float *out, float *mean,
					    float *rstd, const float *inp,
					    const float *weight,
					    const float *bias, size_t n,
					    size_t C);
/* dinp, dweight, dbias are each optional. */
FLOW_EXPORT void flow_cpu_layernorm_backward(float *dinp, float *dweight,
					     float *dbias, const float *dout,
					     const float *inp,
					     const float *weight,
					     const float *mean,
					     const float *rstd, size_t n,
					     size_t C);

/* ---- GELU, tanh approximation (PyTorch approximate='tanh') -------------- */
FLOW_EXPORT void flow_cpu_gelu_forward(float *out, const float *inp, size_t n);
FLOW_EXPORT void flow_cpu_gelu_backward(float *dinp, const float *inp,
					const float *dout, size_t n);

/* ---- causal multi-head self-attention ----------------------------------- */
/* qkv is (B,T,3C): q, k, v concatenated on the last dimension, each split into
 * NH heads of C/NH channels.  out is (B,T,C).  att is (B,NH,T,T) and receives
 * the softmax probabilities (zero above the diagonal), kept for backward.
 * Scale 1/sqrt(C/NH). */
FLOW_EXPORT void flow_cpu_attention_forward(float *out, float *att,
					    const float *qkv, size_t B,
					    size_t T, size_t C, size_t NH);
/* Bytes of scratch the backward pass needs for these sizes (the gradient of
 * att, B*NH*T*T floats; contents need not be initialised and are garbage
 * afterwards). */
FLOW_EXPORT size_t flow_cpu_attention_scratch_bound(size_t B, size_t T,
						    size_t C, size_t NH);
/* dqkv (B,T,3C) += gradient of out w.r.t. qkv.  scratch holds at least
 * flow_cpu_attention_scratch_bound() bytes, 64-byte aligned. */
FLOW_EXPORT void flow_cpu_attention_backward(float *dqkv, void *scratch,
					     const float *dout,
					     const float *qkv,
					     const float *att, size_t B,
					     size_t T, size_t C, size_t NH);

/* ---- residual add -------------------------------------------------------- */
FLOW_EXPORT void flow_cpu_residual_forward(float *out, const float *a,
					   const float *b, size_t n);
/* da += dout; db += dout.  da and db are each optional. */
FLOW_EXPORT void flow_cpu_residual_backward(float *da, float *db,
					    const float *dout, size_t n);

/* ---- fused softmax cross-entropy ----------------------------------------- */
/* logits is (n, Vp) of which the first V columns are real and the rest padding
 * (masked out: they take no probability).  For each row with targets[r] in
 * [0, V): losses[r] = -log softmax(logits[r,:V])[targets[r]], and logits[r,:]
 * is overwritten IN PLACE with the gradient of dloss * losses[r]:
 * dloss * (softmax - onehot) on the first V columns, 0 on the padding.
 * A row whose target is negative is ignored: loss 0, gradient 0. */
FLOW_EXPORT void flow_cpu_cross_entropy_forward_backward(float *losses,
							 float *logits,
							 const int32_t *targets,
							 size_t n, size_t V,
							 size_t Vp,
							 float dloss);

/* ---- AdamW (decoupled weight decay), as torch.optim.AdamW --------------- */
typedef struct flow_adamw_params {
	float lr;
	float beta1;
	float beta2;
	float eps;
	float weight_decay; /* applied only when the tensor decays */
} flow_adamw_params_t;

/* One update of n parameters at step t (1-based): param *= 1 - lr*wd (when
 * decay), m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g^2,
 * param -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). */
FLOW_EXPORT void flow_cpu_adamw_update(float *param, const float *grad,
				       float *m, float *v, size_t n,
				       const flow_adamw_params_t *hp,
				       uint64_t t, bool decay);

/* ---- global gradient-norm clipping --------------------------------------- */
/* Sum of squares of n floats, accumulated in double in a fixed order. */
FLOW_EXPORT double flow_cpu_sum_squares(const float *x, size_t n);
/* x *= s. */
FLOW_EXPORT void flow_cpu_scale(float *x, size_t n, float s);
/* The global L2 norm of ntensors gradients (grads[i] has counts[i] floats);
 * when it exceeds max_norm (> 0) every gradient is scaled by
 * max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_.  Returns the
 * norm before clipping.  max_norm <= 0 only measures. */
FLOW_EXPORT float flow_cpu_clip_grad_norm(float *const *grads,
					  const size_t *counts,
					  size_t ntensors, float max_norm);
/* Its second half, for a norm summed over ranks: clipping to max_norm
 * given the global norm. */
FLOW_EXPORT void flow_cpu_clip_to_norm(float *const *grads,
				       const size_t *counts, size_t ntensors,
				       float norm, float max_norm);

#ifdef __cplusplus
}
#endif

#endif
