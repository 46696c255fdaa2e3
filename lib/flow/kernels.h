/* Kernels, forward and backward, for the GPT op set: the contract of every
 * kernel, written once as a function type (flow_<kernel>_fn), the table of
 * them that a kernel set fills (flow_kernels_t), and the CPU set.  The
 * reference set, which checks this one, is in flow/kernels_ref.h; its
 * functions have the same types, so no signature is written twice.
 *
 * Conventions shared by every kernel of every set:
 * - fp32, contiguous, row-major; pointers must not alias unless a kernel
 *   says so; sizes are element counts.  The *_bf16 twins (below, "bf16
 *   activations") store some operands in bf16 instead.
 * - Forward kernels overwrite their outputs.
 * - Backward kernels ACCUMULATE (+=) into every gradient they write, so a
 *   tensor consumed twice (the residual stream) or a parameter used by
 *   several micro-batches simply sums its gradients; callers zero gradients
 *   first.  Any gradient pointer documented as optional may be NULL to skip
 *   it.
 * - Kernels cannot fail given valid arguments; they do not check them.
 *
 * The CPU set (flow_cpu_*) runs on the calling thread's OpenMP team and
 * BLAS.  Every result is bit-for-bit identical whatever the number of
 * OpenMP threads: reductions use a fixed partition of the work, never one
 * that depends on the thread count.  The GEMMs inside matmul are the
 * BLAS's, so their bits also depend on the BLAS's own thread count and
 * kernel choice (OpenBLAS 0.3.21 is not invariant in its thread count for
 * every shape or core type); keep the BLAS configuration fixed for
 * reproducible runs.
 *
 * lib/kernels/cuda/ mirrors the CPU set signature for signature
 * (kernels_cuda.h); how a CUDA set fills the table is said at
 * flow_kernels_t.
 */
#ifndef FLOW_KERNELS_H
#define FLOW_KERNELS_H

#include <flow/box.h>
#include <flow/common.h>
#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- matmul: out[n,o] = inp[n,i] . weight[o,i]^T + bias[o] ------------- */
/* weight is (out_dim, in_dim) as in PyTorch nn.Linear; bias may be NULL. */
typedef void flow_matmul_forward_fn(float *out, const float *inp,
				    const float *weight, const float *bias,
				    size_t n, size_t in_dim, size_t out_dim);
/* dinp[n,i] += dout . weight; dweight[o,i] += dout^T . inp;
 * dbias[o] += sum_n dout.  dinp, dweight, dbias are each optional. */
typedef void flow_matmul_backward_fn(float *dinp, float *dweight,
				     float *dbias, const float *dout,
				     const float *inp, const float *weight,
				     size_t n, size_t in_dim, size_t out_dim);

/* ---- token + position embedding ---------------------------------------- */
/* wte holds rows [row0, row0 + rows) of the token table: all of it
 * (row0 0, rows the vocabulary), or a shard of its rows under a
 * vocabulary-parallel plan (flow/localize.h), where a token outside the
 * shard adds nothing here, its holder adding it.  Tokens are in
 * [0, vocab).
 *
 * out[b,t,:] = wte[tokens[b,t] - row0,:] (0 outside) + wpe[t,:]. */
/* The row of the shard [row0, row0 + rows) holding token, or -1: the
 * rule of every set, the GPU's included. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int64_t flow_embedding_row(int32_t token, int64_t row0,
					 size_t rows)
{
	int64_t row = (int64_t)token - row0;
	return row >= 0 && row < (int64_t)rows ? row : -1;
}

typedef void flow_embedding_forward_fn(float *out, const int32_t *tokens,
				       const float *wte, const float *wpe,
				       int64_t row0, size_t rows, size_t B,
				       size_t T, size_t C);
/* dwte[tokens[b,t] - row0,:] += dout[b,t,:] for the tokens it holds;
 * dwpe[t,:] += sum_b dout[b,t,:].  dwte and dwpe are each optional. */
typedef void flow_embedding_backward_fn(float *dwte, float *dwpe,
					const float *dout,
					const int32_t *tokens, int64_t row0,
					size_t rows, size_t B, size_t T,
					size_t C);

/* ---- layernorm over the last dimension, eps = FLOW_LAYERNORM_EPS -------- */
#define FLOW_LAYERNORM_EPS 1e-5f
/* out[n,c] = (inp - mean) * rstd * weight[c] + bias[c]; mean and rstd are
 * (n) and are saved for the backward pass. */
typedef void flow_layernorm_forward_fn(float *out, float *mean, float *rstd,
				       const float *inp, const float *weight,
				       const float *bias, size_t n, size_t C);
/* The gradients of the forward pass, from its saved mean and rstd.  dinp,
 * dweight, dbias are each optional. */
typedef void flow_layernorm_backward_fn(float *dinp, float *dweight,
					float *dbias, const float *dout,
					const float *inp, const float *weight,
					const float *mean, const float *rstd,
					size_t n, size_t C);

/* ---- GELU, tanh approximation (PyTorch approximate='tanh') -------------- */
/* out = gelu(inp), n elements. */
typedef void flow_gelu_forward_fn(float *out, const float *inp, size_t n);
/* dinp += gelu'(inp) * dout. */
typedef void flow_gelu_backward_fn(float *dinp, const float *inp,
				   const float *dout, size_t n);

/* ---- matmul with the GELU of its output ---------------------------------- */
/* pre = inp . weight^T + bias, as matmul_forward computes it, and
 * out = gelu(pre): the two kernels in turn, in one pass where the set can
 * (a GPU's GEMM epilogue writes both, the same arithmetic to rounding).
 * The host sets call the two: the same bits.  bias may be NULL. */
typedef void flow_matmul_gelu_forward_fn(float *pre, float *out,
					 const float *inp, const float *weight,
					 const float *bias, size_t n,
					 size_t in_dim, size_t out_dim);

/* ---- causal multi-head self-attention ----------------------------------- */
/* qkv is (B,T,3C): q, k, v concatenated on the last dimension, each split
 * into NH heads of C/NH channels.  out is (B,T,C).  Scale 1/sqrt(C/NH).
 *
 * What the forward pass keeps for backward is lse (B,NH,T): the natural
 * log of the sum of exp(score) over each row's causal columns, with
 * score = scale q.k.  From it the backward pass recomputes each
 * probability as exp(score - lse), the same expression, on the same
 * scores, that the forward pass weighted v with: O(B NH T) saved instead
 * of the O(B NH T^2) probabilities, for one more q.k^T product in
 * backward.  The probabilities live only in scratch, one batch row of
 * heads at a time.  Backward, dpre = scale P (dP - rowsum(P dP)) is the
 * gradient of q.k^T, with dP = dout.v^T; dq = dpre.k, dk = dpre^T.q and
 * dv = P^T.dout. */
typedef void flow_attention_forward_fn(float *out, float *lse, void *scratch,
				       const float *qkv, size_t B, size_t T,
				       size_t C, size_t NH);
/* Bytes of scratch the same set's attention forward or backward pass
 * needs for these sizes, of the fp32 kernels or (bf16) of their bf16
 * twins (each set says what it keeps there); contents need not be
 * initialised and are garbage afterwards. */
typedef size_t flow_attention_scratch_bound_fn(size_t B, size_t T, size_t C,
					       size_t NH, bool bf16);
/* dqkv (B,T,3C) += gradient of out w.r.t. qkv, from the forward pass's
 * lse and out.  scratch, for both passes, holds at least the set's
 * attention_scratch_bound(.., false) bytes, 64-byte aligned.  out is what
 * the same set's forward pass wrote for qkv: the host sets do not read
 * it (they recompute the softmax backward's rowsum(P dP) from the
 * probabilities); cuDNN's fused backward takes it as rowsum(dout * out),
 * which equals it. */
typedef void flow_attention_backward_fn(float *dqkv, void *scratch,
					const float *dout, const float *qkv,
					const float *lse, const float *out,
					size_t B, size_t T, size_t C,
					size_t NH);

/* ---- residual add -------------------------------------------------------- */
/* out = a + b, n elements. */
typedef void flow_residual_forward_fn(float *out, const float *a,
				      const float *b, size_t n);
/* da += dout; db += dout.  da and db are each optional. */
typedef void flow_residual_backward_fn(float *da, float *db,
				       const float *dout, size_t n);

/* ---- residual add fused with the layernorm that reads it ---------------- */
/* res = a + b, then out, mean, rstd = layernorm(res) (n rows of C): the
 * same bits as residual_forward then layernorm_forward, in one pass over
 * the rows, so res is written but never read back.  The executor runs
 * so every ADD op whose output the next op layer-normalises (GPT-2's
 * residual adds), and their backward ops by the kernel below. */
typedef void flow_residual_layernorm_forward_fn(float *res, float *out,
						float *mean, float *rstd,
						const float *a, const float *b,
						const float *weight,
						const float *bias, size_t n,
						size_t C);
/* Its backward, the other way round: layernorm_backward's gradient of res
 * added into dres (which the rest of the residual stream's gradient is
 * already in), then residual_backward of the whole dres into da and db:
 * the same bits as those two kernels in turn, in one pass over the rows.
 * dres is required; da, db, dweight and dbias are each optional. */
typedef void flow_layernorm_residual_backward_fn(
	float *dres, float *da, float *db, float *dweight, float *dbias,
	const float *dout, const float *res, const float *weight,
	const float *mean, const float *rstd, size_t n, size_t C);

/* ---- fused softmax cross-entropy ----------------------------------------- */
/* logits is (n, Vp) of which the first V columns are real and the rest
 * padding (masked out: they take no probability).  For each row with
 * targets[r] in [0, V): losses[r] = -log softmax(logits[r,:V])[targets[r]],
 * and logits[r,:] is overwritten IN PLACE with the gradient of
 * dloss * losses[r]: dloss * (softmax - onehot) on the first V columns, 0 on
 * the padding.  A row whose target is negative is ignored: loss 0,
 * gradient 0. */
typedef void flow_cross_entropy_forward_backward_fn(float *losses,
						    float *logits,
						    const int32_t *targets,
						    size_t n, size_t V,
						    size_t Vp, float dloss);

/* ---- cross-entropy over a column shard of the logits -------------------- */
/* Under a vocabulary-parallel plan (flow/localize.h) each rank of a group
 * holds columns [c0, c0 + Vl) of every padded row of the logits, the
 * first `valid` of them real (below the vocabulary).  A row's loss and
 * gradient need its maximum and its sum of exponentials over the whole
 * group, which the caller gathers between three kernels:
 *
 *   split_max     max[r] = the maximum of row r's real columns here
 *                 (-inf when it holds none);
 *   (the caller all-gathers max over the group into gathered: p blocks
 *   of n, member order)
 *   split_sums    max[r] = the maximum over gathered[q*n + r];
 *                 sums[r] = sum over the real columns here of
 *                 exp(logit - max[r]), in double, rounded once;
 *   (the caller all-reduces sums over the group)
 *   split_finish  losses[r] partial, so that the group's sum is the loss:
 *                 log(sums[r]) + max[r] on the group's first member,
 *                 minus the target's logit on its holder; logits[r,:]
 *                 overwritten with dloss * (softmax - onehot) of this
 *                 rank's columns, 0 on padding.  A row whose target is
 *                 negative gets loss 0 and gradient 0.
 *
 * Every step is exact or rounds once from double: on the host sets the
 * split gives a whole row's results to that rounding whatever the group
 * (a GPU's sums run in another order, within tolerance). */
typedef struct flow_logits_shard {
	size_t n;     /* rows */
	size_t cols;  /* columns held per row (Vl) */
	size_t valid; /* of them real */
	int64_t c0;   /* the first column held */
	bool first;   /* this rank is the group's first member */
} flow_logits_shard_t;

typedef void flow_cross_entropy_split_max_fn(float *max, const float *logits,
					     const flow_logits_shard_t *s);
typedef void flow_cross_entropy_split_sums_fn(float *sums, float *max,
					      const float *gathered, size_t p,
					      const float *logits,
					      const flow_logits_shard_t *s);
typedef void flow_cross_entropy_split_finish_fn(float *losses, float *logits,
						const int32_t *targets,
						const float *max,
						const float *sums,
						const flow_logits_shard_t *s,
						float dloss);

/* ---- bf16 activations (mixed precision) ------------------------------------ */
/* With --precision bf16 the activations that GEMMs read and write are
 * stored in bf16: the outputs of layernorm, matmul, GELU and attention,
 * and their gradients (flow/ops.h, "mixed precision"); the residual
 * stream and its gradient, the layernorm and attention statistics, the
 * losses, the parameters, their gradients and the optimizer's state stay
 * fp32.  Each kernel above that touches such a tensor has a twin,
 * <kernel>_bf16 below, with the same contract except that its operands
 * typed flow_bf16_t are stored in bf16 (flow/tensor.h).  A bf16 twin:
 * - reads a bf16 operand exactly (widened to fp32);
 * - computes as its fp32 kernel does: in fp32, the reference set in
 *   double, the same formulas and, on the host sets, the same order;
 * - rounds every bf16 value it stores once, to nearest even;
 * - accumulates into a bf16 gradient by reading it, adding in fp32 and
 *   rounding once: g = bf16(g + dg).
 * GEMMs take bf16 operands and sum their products in fp32: a GPU's
 * tensor cores, or, on the host sets, their fp32 GEMM on the widened
 * operands (a product of two bf16 values is exact in fp32, so only the
 * order of the additions differs).  A weight and a bias stay fp32: each
 * GEMM rounds them to bf16 for its products and sum, as PyTorch's
 * autocast does (and cuBLASLt's bias epilogue wants a bias of the
 * output's type), and their gradients are summed in fp32, never
 * rounded. */

/* ---- matmul ---------------------------------------------------------------- */
/* out = bf16(inp . bf16(weight)^T + bf16(bias)): scratch holds at least
 * the set's matmul_bf16_scratch_bound(n, in_dim, out_dim) bytes, 64-byte
 * aligned, for either pass (the rounded weight and bias, and on the host
 * sets one panel of rows of the widened operands); its contents need not be
 * initialised and are garbage afterwards.  The rows are taken in panels
 * of flow_matmul_bf16_panel_rows (below), so that the scratch stays
 * bounded however large n * out_dim (the logits) is. */
typedef size_t flow_matmul_bf16_scratch_bound_fn(size_t n, size_t in_dim,
						 size_t out_dim);
typedef void flow_matmul_bf16_forward_fn(flow_bf16_t *out, void *scratch,
					 const flow_bf16_t *inp,
					 const float *weight, const float *bias,
					 size_t n, size_t in_dim,
					 size_t out_dim);
/* dinp = bf16(dinp + dout . bf16(weight)); dweight += dout^T . inp and
 * dbias += sum_n dout, both fp32.  dinp, dweight, dbias are each
 * optional. */
typedef void flow_matmul_bf16_backward_fn(flow_bf16_t *dinp, float *dweight,
					  float *dbias, void *scratch,
					  const flow_bf16_t *dout,
					  const flow_bf16_t *inp,
					  const float *weight, size_t n,
					  size_t in_dim, size_t out_dim);
/* pre as matmul_bf16_forward writes it, and out = bf16(gelu(pre)).  The
 * host sets call the two kernels, so gelu reads the stored (rounded) pre:
 * the unfused pair's bits.  A GPU's GEMM epilogue takes the GELU of the
 * fp32 sum before rounding it, so its out may differ from the pair's by
 * one bf16 rounding. */
typedef void flow_matmul_gelu_bf16_forward_fn(flow_bf16_t *pre,
					      flow_bf16_t *out, void *scratch,
					      const flow_bf16_t *inp,
					      const float *weight,
					      const float *bias, size_t n,
					      size_t in_dim, size_t out_dim);

/* Rows per panel of a bf16 matmul when the rows of one panel may take
 * `budget` elements of each of inp and dinp, and of dout: at least 1, at
 * most n.  A set's scratch bound is then the rounded weight and bias,
 * (in_dim + 1) * out_dim elements, and one panel of the rest. */
static inline size_t flow_matmul_bf16_panel_rows(size_t n, size_t in_dim,
						 size_t out_dim, size_t budget)
{
	size_t width = 2 * in_dim + out_dim, rows = width ? budget / width : n;
	if (rows < 1)
		rows = 1;
	return rows < n ? rows : n;
}

/* ---- layernorm, GELU, residual add ----------------------------------------- */
/* The normalised output in bf16; mean, rstd and the input (the residual
 * stream) fp32. */
typedef void flow_layernorm_bf16_forward_fn(flow_bf16_t *out, float *mean,
					    float *rstd, const float *inp,
					    const float *weight,
					    const float *bias, size_t n,
					    size_t C);
typedef void flow_layernorm_bf16_backward_fn(float *dinp, float *dweight,
					     float *dbias,
					     const flow_bf16_t *dout,
					     const float *inp,
					     const float *weight,
					     const float *mean,
					     const float *rstd, size_t n,
					     size_t C);
typedef void flow_gelu_bf16_forward_fn(flow_bf16_t *out,
				       const flow_bf16_t *inp, size_t n);
typedef void flow_gelu_bf16_backward_fn(flow_bf16_t *dinp,
					const flow_bf16_t *inp,
					const flow_bf16_t *dout, size_t n);
/* out = a + b: the residual stream a and out fp32, the branch b (a
 * matmul's output) bf16; backward, da fp32 and db bf16. */
typedef void flow_residual_bf16_forward_fn(float *out, const float *a,
					   const flow_bf16_t *b, size_t n);
typedef void flow_residual_bf16_backward_fn(float *da, flow_bf16_t *db,
					    const float *dout, size_t n);
/* The fused pairs, with the same operands in bf16: res fp32 and out bf16
 * forward; dres and da fp32, db and dout bf16 backward. */
typedef void flow_residual_layernorm_bf16_forward_fn(
	float *res, flow_bf16_t *out, float *mean, float *rstd,
	const float *a, const flow_bf16_t *b, const float *weight,
	const float *bias, size_t n, size_t C);
typedef void flow_layernorm_residual_bf16_backward_fn(
	float *dres, float *da, flow_bf16_t *db, float *dweight, float *dbias,
	const flow_bf16_t *dout, const float *res, const float *weight,
	const float *mean, const float *rstd, size_t n, size_t C);

/* ---- attention -------------------------------------------------------------- */
/* qkv, out, dout and dqkv bf16, lse fp32; scratch holds the set's
 * attention_scratch_bound(.., true) bytes.  Its products round their
 * operands too, as flash attention's bf16 kernels do: the probabilities
 * P where they multiply (out = P.v, dv = P^T.dout) while the softmax and
 * its backward use them unrounded, and dpre where it multiplies. */
typedef void flow_attention_bf16_forward_fn(flow_bf16_t *out, float *lse,
					    void *scratch,
					    const flow_bf16_t *qkv, size_t B,
					    size_t T, size_t C, size_t NH);
typedef void flow_attention_bf16_backward_fn(flow_bf16_t *dqkv,
					     void *scratch,
					     const flow_bf16_t *dout,
					     const flow_bf16_t *qkv,
					     const float *lse,
					     const flow_bf16_t *out, size_t B,
					     size_t T, size_t C, size_t NH);

/* ---- cross-entropy ---------------------------------------------------------- */
/* The logits bf16, their gradient written over them in bf16; the losses
 * fp32, computed in fp32 (double sums) from the bf16 logits. */
typedef void flow_cross_entropy_bf16_forward_backward_fn(
	float *losses, flow_bf16_t *logits, const int32_t *targets, size_t n,
	size_t V, size_t Vp, float dloss);
typedef void flow_cross_entropy_bf16_split_max_fn(
	float *max, const flow_bf16_t *logits, const flow_logits_shard_t *s);
typedef void flow_cross_entropy_bf16_split_sums_fn(
	float *sums, float *max, const float *gathered, size_t p,
	const flow_bf16_t *logits, const flow_logits_shard_t *s);
typedef void flow_cross_entropy_bf16_split_finish_fn(
	float *losses, flow_bf16_t *logits, const int32_t *targets,
	const float *max, const float *sums, const flow_logits_shard_t *s,
	float dloss);

/* ---- boxing: a region of one piece into another -------------------------- */
/* dst, laid out row-major as dst_box, gets the elements of region (a box
 * inside both) from src, laid out as src_box: copied, or with add added
 * (integers wrap; bf16 and f16 through f32), elements of dtype.  What the
 * boxing executor (flow/boxing_exec.h) packs, unpacks and slices pieces
 * with, on the set's device. */
typedef void flow_box_move_fn(flow_dtype_t dtype, const void *src,
			      const flow_box_t *src_box, void *dst,
			      const flow_box_t *dst_box,
			      const flow_box_t *region, bool add);

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
typedef void flow_adamw_update_fn(float *param, const float *grad, float *m,
				  float *v, size_t n,
				  const flow_adamw_params_t *hp, uint64_t t,
				  bool decay);
/* The same update of ntensors tensors at once (on a GPU, one launch for
 * all of them instead of one per tensor): tensor i has counts[i] elements
 * at params[i], grads[i], m[i] and v[i], and decays when decay[i]; each
 * element gets exactly flow_adamw_update_fn's arithmetic.  The arrays are
 * host memory, the tensors the set's device's. */
typedef void flow_adamw_update_all_fn(float *const *params,
				      const float *const *grads,
				      float *const *m, float *const *v,
				      const size_t *counts, const bool *decay,
				      size_t ntensors,
				      const flow_adamw_params_t *hp,
				      uint64_t t);

/* ---- global gradient-norm clipping --------------------------------------- */
/* Sum of squares of n floats, accumulated in double in an order that
 * depends on n only. */
typedef double flow_sum_squares_fn(const float *x, size_t n);
/* x *= s. */
typedef void flow_scale_fn(float *x, size_t n, float s);
/* The global L2 norm of ntensors gradients (grads[i] has counts[i] floats);
 * when it exceeds max_norm (> 0) every gradient is scaled by
 * max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_.  Returns the
 * norm before clipping.  max_norm <= 0 only measures. */
typedef float flow_clip_grad_norm_fn(float *const *grads, const size_t *counts,
				     size_t ntensors, float max_norm);

/* The factor clipping multiplies every gradient by, as PyTorch computes
 * it: max_norm / (norm + 1e-6) in float; 1 (no change) when that is not
 * below 1 or max_norm <= 0. */
static inline float flow_clip_coef(float norm, float max_norm)
{
	if (max_norm <= 0.0f)
		return 1.0f;
	float coef = max_norm / (norm + 1e-6f);
	return coef < 1.0f ? coef : 1.0f;
}

/* ---- kernel sets ------------------------------------------------------------ */

/* One kernel set: a function of each kernel type above, picked once by the
 * caller (the executor maps flow_exec_new's flow_kernel_set_t to one) and
 * called through the table, so no caller names a set's functions.  Every
 * kernel member is set.  The tables are constant and live for the
 * program, so any number of threads may read them.
 *
 * Devices.  A set's kernels take pointers into its device's memory, which
 * the executor allocates through the storage that goes with the set
 * (flow/exec.h, flow_exec_storage_t): host memory for the CPU and
 * reference sets.  A CUDA set fills the same members with functions of
 * the same types, so the executor's dispatch stays as it is:
 * lib/kernels/cuda/ wraps each flow_cuda_<kernel>(args..., diag, stream)
 * of flow/kernels_cuda.h in a function of the type here that enqueues on
 * the stream bound to the calling thread and keeps the first failure
 * beside it (per-thread state, as the CUDA kernels already keep their
 * current device and cuBLAS handles), and the table gains one member,
 * last, that waits for that stream and returns the kept failure with its
 * diag, for the executor to call once per pass.  Host kernels run to
 * completion and cannot fail, so the host sets leave it NULL.  The CUDA
 * set (lib/kernels/cuda/table.cu, in libflow-cuda) is that table. */
typedef struct flow_kernels {
	const char *name; /* "cpu", "ref", "cuda" */
	flow_matmul_forward_fn *matmul_forward;
	flow_matmul_backward_fn *matmul_backward;
	flow_embedding_forward_fn *embedding_forward;
	flow_embedding_backward_fn *embedding_backward;
	flow_layernorm_forward_fn *layernorm_forward;
	flow_layernorm_backward_fn *layernorm_backward;
	flow_gelu_forward_fn *gelu_forward;
	flow_gelu_backward_fn *gelu_backward;
	flow_matmul_gelu_forward_fn *matmul_gelu_forward;
	flow_attention_forward_fn *attention_forward;
	flow_attention_scratch_bound_fn *attention_scratch_bound;
	flow_attention_backward_fn *attention_backward;
	flow_residual_forward_fn *residual_forward;
	flow_residual_backward_fn *residual_backward;
	flow_residual_layernorm_forward_fn *residual_layernorm_forward;
	flow_layernorm_residual_backward_fn *layernorm_residual_backward;
	flow_cross_entropy_forward_backward_fn *cross_entropy_forward_backward;
	flow_cross_entropy_split_max_fn *cross_entropy_split_max;
	flow_cross_entropy_split_sums_fn *cross_entropy_split_sums;
	flow_cross_entropy_split_finish_fn *cross_entropy_split_finish;
	/* The bf16 twins. */
	flow_matmul_bf16_scratch_bound_fn *matmul_bf16_scratch_bound;
	flow_matmul_bf16_forward_fn *matmul_bf16_forward;
	flow_matmul_bf16_backward_fn *matmul_bf16_backward;
	flow_matmul_gelu_bf16_forward_fn *matmul_gelu_bf16_forward;
	flow_layernorm_bf16_forward_fn *layernorm_bf16_forward;
	flow_layernorm_bf16_backward_fn *layernorm_bf16_backward;
	flow_gelu_bf16_forward_fn *gelu_bf16_forward;
	flow_gelu_bf16_backward_fn *gelu_bf16_backward;
	flow_residual_bf16_forward_fn *residual_bf16_forward;
	flow_residual_bf16_backward_fn *residual_bf16_backward;
	flow_residual_layernorm_bf16_forward_fn *residual_layernorm_bf16_forward;
	flow_layernorm_residual_bf16_backward_fn *layernorm_residual_bf16_backward;
	flow_attention_bf16_forward_fn *attention_bf16_forward;
	flow_attention_bf16_backward_fn *attention_bf16_backward;
	flow_cross_entropy_bf16_forward_backward_fn
		*cross_entropy_bf16_forward_backward;
	flow_cross_entropy_bf16_split_max_fn *cross_entropy_bf16_split_max;
	flow_cross_entropy_bf16_split_sums_fn *cross_entropy_bf16_split_sums;
	flow_cross_entropy_bf16_split_finish_fn *cross_entropy_bf16_split_finish;
	flow_box_move_fn *box_move;
	flow_adamw_update_fn *adamw_update;
	/* Optional (NULL in the host sets, whose per-tensor calls cost
	 * nothing extra): callers then call adamw_update per tensor. */
	flow_adamw_update_all_fn *adamw_update_all;
	flow_sum_squares_fn *sum_squares;
	flow_scale_fn *scale;
	flow_clip_grad_norm_fn *clip_grad_norm;
	/* Wait for every kernel this thread enqueued and return the first
	 * failure since the last call (FLOW_OK when none), its line in diag.
	 * NULL for sets whose kernels run to completion and cannot fail. */
	flow_err_t (*last)(flow_diag_t *diag);
} flow_kernels_t;

/* Wait for every kernel of set k the calling thread enqueued (last), its
 * first failure with the line in diag; FLOW_OK at once for a host set. */
static inline flow_err_t flow_kernels_wait(const flow_kernels_t *k,
					   flow_diag_t *diag)
{
	return k->last ? k->last(diag) : FLOW_OK;
}

/* ---- the CPU set ------------------------------------------------------------ */

/* The table of the flow_cpu_* functions below, named "cpu". */
FLOW_EXPORT extern const flow_kernels_t flow_cpu_kernels;

/* Every GEMM through cblas_sgemm. */
FLOW_EXPORT flow_matmul_forward_fn flow_cpu_matmul_forward;
FLOW_EXPORT flow_matmul_backward_fn flow_cpu_matmul_backward;
FLOW_EXPORT flow_embedding_forward_fn flow_cpu_embedding_forward;
FLOW_EXPORT flow_embedding_backward_fn flow_cpu_embedding_backward;
FLOW_EXPORT flow_layernorm_forward_fn flow_cpu_layernorm_forward;
FLOW_EXPORT flow_layernorm_backward_fn flow_cpu_layernorm_backward;
FLOW_EXPORT flow_gelu_forward_fn flow_cpu_gelu_forward;
FLOW_EXPORT flow_gelu_backward_fn flow_cpu_gelu_backward;
FLOW_EXPORT flow_matmul_gelu_forward_fn flow_cpu_matmul_gelu_forward;
FLOW_EXPORT flow_attention_forward_fn flow_cpu_attention_forward;
/* The probabilities and their gradient for one batch row, and with bf16
 * the row's qkv, out or dout, and dqkv widened: 2*NH*T*T + 7*T*C
 * floats. */
FLOW_EXPORT flow_attention_scratch_bound_fn flow_cpu_attention_scratch_bound;
FLOW_EXPORT flow_attention_backward_fn flow_cpu_attention_backward;
FLOW_EXPORT flow_residual_forward_fn flow_cpu_residual_forward;
FLOW_EXPORT flow_residual_backward_fn flow_cpu_residual_backward;
FLOW_EXPORT flow_residual_layernorm_forward_fn
	flow_cpu_residual_layernorm_forward;
FLOW_EXPORT flow_layernorm_residual_backward_fn
	flow_cpu_layernorm_residual_backward;
FLOW_EXPORT flow_cross_entropy_forward_backward_fn
	flow_cpu_cross_entropy_forward_backward;
/* Rows in parallel, each as the reference computes it (the reference set
 * uses these too). */
FLOW_EXPORT flow_cross_entropy_split_max_fn flow_cpu_cross_entropy_split_max;
FLOW_EXPORT flow_cross_entropy_split_sums_fn flow_cpu_cross_entropy_split_sums;
FLOW_EXPORT flow_cross_entropy_split_finish_fn
	flow_cpu_cross_entropy_split_finish;
/* The bf16 twins: the GEMMs' operands widened to fp32 one panel of 2^24
 * elements at a time (lib/kernels/cpu/bf16.c), then the sgemms
 * above; every other kernel widens and rounds element by element, in the
 * loops of its fp32 twin. */
FLOW_EXPORT flow_matmul_bf16_scratch_bound_fn flow_cpu_matmul_bf16_scratch_bound;
FLOW_EXPORT flow_matmul_bf16_forward_fn flow_cpu_matmul_bf16_forward;
FLOW_EXPORT flow_matmul_bf16_backward_fn flow_cpu_matmul_bf16_backward;
FLOW_EXPORT flow_matmul_gelu_bf16_forward_fn flow_cpu_matmul_gelu_bf16_forward;
FLOW_EXPORT flow_layernorm_bf16_forward_fn flow_cpu_layernorm_bf16_forward;
FLOW_EXPORT flow_layernorm_bf16_backward_fn flow_cpu_layernorm_bf16_backward;
FLOW_EXPORT flow_gelu_bf16_forward_fn flow_cpu_gelu_bf16_forward;
FLOW_EXPORT flow_gelu_bf16_backward_fn flow_cpu_gelu_bf16_backward;
FLOW_EXPORT flow_residual_bf16_forward_fn flow_cpu_residual_bf16_forward;
FLOW_EXPORT flow_residual_bf16_backward_fn flow_cpu_residual_bf16_backward;
FLOW_EXPORT flow_residual_layernorm_bf16_forward_fn
	flow_cpu_residual_layernorm_bf16_forward;
FLOW_EXPORT flow_layernorm_residual_bf16_backward_fn
	flow_cpu_layernorm_residual_bf16_backward;
FLOW_EXPORT flow_attention_bf16_forward_fn flow_cpu_attention_bf16_forward;
FLOW_EXPORT flow_attention_bf16_backward_fn flow_cpu_attention_bf16_backward;
FLOW_EXPORT flow_cross_entropy_bf16_forward_backward_fn
	flow_cpu_cross_entropy_bf16_forward_backward;
FLOW_EXPORT flow_cross_entropy_bf16_split_max_fn
	flow_cpu_cross_entropy_bf16_split_max;
FLOW_EXPORT flow_cross_entropy_bf16_split_sums_fn
	flow_cpu_cross_entropy_bf16_split_sums;
FLOW_EXPORT flow_cross_entropy_bf16_split_finish_fn
	flow_cpu_cross_entropy_bf16_split_finish;
FLOW_EXPORT flow_adamw_update_fn flow_cpu_adamw_update;
/* Partial sums over fixed chunks, added in chunk order. */
FLOW_EXPORT flow_sum_squares_fn flow_cpu_sum_squares;
FLOW_EXPORT flow_scale_fn flow_cpu_scale;
/* flow_cpu_sum_squares over every gradient, then flow_cpu_clip_to_norm. */
FLOW_EXPORT flow_clip_grad_norm_fn flow_cpu_clip_grad_norm;

/* The second half of flow_cpu_clip_grad_norm, for a norm summed over
 * ranks: clipping to max_norm given the global norm.  A CPU helper of the
 * trainer, not a kernel of the table (the reference set has no twin). */
FLOW_EXPORT void flow_cpu_clip_to_norm(float *const *grads,
				       const size_t *counts, size_t ntensors,
				       float norm, float max_norm);

#ifdef __cplusplus
}
#endif

#endif
