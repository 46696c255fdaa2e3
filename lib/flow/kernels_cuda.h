/* CUDA kernels, forward and backward, for the GPT op set: the GPU mirror of
 * <flow/kernels.h>.  Installed only in CUDA builds.
 *
 * Mirroring.  Every flow_cpu_<op>_<dir>(args...) in kernels.h has a
 * flow_cuda_<op>_<dir>(args..., flow_diag_t *diag, cudaStream_t stream) here
 * with the same arguments in the same order and the same meaning (fp32,
 * contiguous, row-major; forward overwrites; backward ACCUMULATES into every
 * gradient; optional gradients may be NULL), and so has every bf16 twin
 * (kernels.h, "bf16 activations"): its flow_bf16_t operands are device
 * arrays of bf16, read exactly, computed on in fp32 and rounded once to
 * nearest even where stored.  Differences, all consistent:
 * - Tensor pointers are DEVICE pointers.  Sizes, the flow_adamw_params_t and
 *   the pointer/count arrays of flow_cuda_clip_grad_norm are host memory.
 * - Launches can fail, so every kernel returns flow_err_t (FLOW_MUST_CHECK):
 *   FLOW_OK, FLOW_ERR_DEVICE (a CUDA or cuBLAS call failed; diag names the
 *   call, the file:line and the foreign error string) or FLOW_ERR_RANGE (a
 *   size does not fit the int that cuBLAS or a launch takes).  A failed launch
 *   may leave outputs partly written.
 * - CPU functions that return a value (sum of squares, grad norm) write it
 *   through an extra output pointer placed before diag.
 * - Work is enqueued on `stream` and the functions return without waiting
 *   (except where a comment says "synchronises").  A few kernels need
 *   temporary device memory; they take it stream-ordered from the current
 *   device's default memory pool (cudaMallocAsync/cudaFreeAsync on stream).
 *
 * Runtime model.  Kernels run on the calling thread's current device
 * (cudaSetDevice / flow_cuda_set_device).  GEMMs go through cuBLAS and
 * cuBLASLt with one handle each per (thread, device), created on first use
 * and pointed at `stream` before each call, so any number of threads and
 * streams may run kernels at once without sharing a handle.  Beside the
 * handles a thread keeps, per device, cuBLASLt's workspace and its picks,
 * the storage's copy stream and one device double for sum_squares;
 * flow_cuda_release_thread() frees all of it (call it before a worker
 * thread exits; the main thread may leave it to process exit).  There is
 * no other state.
 *
 * Determinism.  Every reduction uses a fixed partition of the work and a fixed
 * combination order that depend only on the sizes, never on the device's
 * multiprocessor count or on timing; no float atomics are used.  cuBLAS is
 * run-to-run deterministic on one stream (cuBLAS documentation, "Results
 * reproducibility"); its math mode is CUBLAS_DEFAULT_MATH (true fp32, no
 * TF32) with CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (a bf16
 * output's split-K parts summed in fp32), and cuBLASLt's bf16 outputs take
 * no split-K reduction in bf16 either.  Results match the CPU kernels to
 * float rounding, not bit for bit (a bf16 result to one bf16 rounding where
 * the fp32 sums behind it differ across a rounding boundary): the
 * tolerances are documented in tests/gpu/test_cuda_kernels.c.
 *
 * Thread safety: every function may be called from any thread; a thread's
 * cuBLAS handles are its own.
 */
#ifndef FLOW_KERNELS_CUDA_H
#define FLOW_KERNELS_CUDA_H

#include <cuda_runtime_api.h>

#include <flow/caching_alloc.h>
#include <flow/common.h>
#include <flow/device.h>
#include <flow/error.h>
#include <flow/kernels.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime ------------------------------------------------------------- */

/* Number of CUDA devices in *count_out (written only on FLOW_OK; may be 0).
 * Returns FLOW_OK; FLOW_ERR_NOTSUP when this machine has no CUDA driver or
 * no CUDA device (diag says which, e.g. "no usable CUDA driver or device:
 * no CUDA-capable device is detected (cudaErrorNoDevice)");
 * FLOW_ERR_DEVICE for any other CUDA failure. */
FLOW_EXPORT flow_err_t flow_cuda_device_count(int *count_out,
					      flow_diag_t *diag) FLOW_MUST_CHECK;

/* Make device the calling thread's current device. */
FLOW_EXPORT flow_err_t flow_cuda_set_device(int device,
					    flow_diag_t *diag) FLOW_MUST_CHECK;

/* flow_cuda_device_info_t is in <flow/device.h>. */

/* Describe device into *info_out (written only on FLOW_OK). */
FLOW_EXPORT flow_err_t flow_cuda_device_info(int device,
					     flow_cuda_device_info_t *info_out,
					     flow_diag_t *diag) FLOW_MUST_CHECK;

/* Free what the calling thread created on the devices it used: cuBLAS and
 * cuBLASLt handles, the workspace and picks, the copy stream, the
 * sum_squares double.  Safe to call more than once, and on a thread that
 * made none. */
FLOW_EXPORT void flow_cuda_release_thread(void);

/* ---- device memory helpers (for tools and tests) ------------------------- */

/* cudaMalloc of bytes (0 gives NULL and FLOW_OK).  *ptr_out is written only
 * on FLOW_OK.  Free with flow_cuda_free(). */
FLOW_EXPORT flow_err_t flow_cuda_malloc(void **ptr_out, size_t bytes,
					flow_diag_t *diag) FLOW_MUST_CHECK;
/* cudaFree; NULL is ignored.  Errors (a sticky context error) are dropped:
 * they are reported by the next call that can report them. */
FLOW_EXPORT void flow_cuda_free(void *ptr);
/* Synchronous copies host -> device and device -> host. */
FLOW_EXPORT flow_err_t flow_cuda_copy_to_device(void *dst, const void *src,
						size_t bytes,
						flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_copy_to_host(void *dst, const void *src,
					      size_t bytes,
					      flow_diag_t *diag) FLOW_MUST_CHECK;
/* Set bytes of device memory to zero, ordered on stream. */
FLOW_EXPORT flow_err_t flow_cuda_zero(void *dst, size_t bytes,
				      flow_diag_t *diag,
				      cudaStream_t stream) FLOW_MUST_CHECK;
/* Wait for stream; reports any error of the work enqueued on it. */
FLOW_EXPORT flow_err_t flow_cuda_sync(cudaStream_t stream,
				      flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- matmul: out[n,o] = inp[n,i] . weight[o,i]^T + bias[o] --------------- */
/* How the calling thread's forward GEMMs with a bias or a GELU ran so
 * far: fused in cuBLASLt's epilogue, or as a GEMM and separate passes
 * (no algorithm for the form, an under-aligned bias): the GPU test says
 * which, since both give a right answer. */
FLOW_EXPORT void flow_cuda_matmul_epilogue_counts(uint64_t *fused,
						  uint64_t *two_pass);
/* Whether the calling thread's forward GEMMs may take cuBLASLt's
 * epilogue (true, the default) or always run the separate passes (false:
 * for the GPU test, which checks those passes too, though a GPU that
 * serves every form never takes them). */
FLOW_EXPORT void flow_cuda_matmul_use_epilogue(bool on);
/* With a bias, one cuBLASLt GEMM that adds it in its epilogue, or, where
 * cuBLASLt has no algorithm for the form (or the bias is under-aligned),
 * cuBLAS sgemm and then a bias kernel; bias may be NULL (cuBLAS sgemm
 * alone). */
FLOW_EXPORT flow_err_t flow_cuda_matmul_forward(float *out, const float *inp,
						const float *weight,
						const float *bias, size_t n,
						size_t in_dim, size_t out_dim,
						flow_diag_t *diag,
						cudaStream_t stream) FLOW_MUST_CHECK;
/* dinp += dout . weight; dweight += dout^T . inp (cuBLAS, beta = 1);
 * dbias += column sums of dout.  Each gradient is optional. */
FLOW_EXPORT flow_err_t flow_cuda_matmul_backward(float *dinp, float *dweight,
						 float *dbias,
						 const float *dout,
						 const float *inp,
						 const float *weight, size_t n,
						 size_t in_dim, size_t out_dim,
						 flow_diag_t *diag,
						 cudaStream_t stream) FLOW_MUST_CHECK;

/* The bf16 twins (flow/kernels.h, flow_matmul_bf16_forward_fn): the
 * weight and the bias rounded to bf16 into scratch once per call, then the
 * GEMMs on the bf16 activations in place, summed in fp32
 * (CUBLAS_COMPUTE_32F).  Forward, one cuBLASLt GEMM writing bf16 out with
 * the rounded bias (and the GELU, below) in its epilogue, which takes a
 * bias of the output's type; where cuBLASLt has no algorithm for that,
 * the fp32 sums of a panel of rows at a time in scratch and one pass
 * adding the bias, taking the GELU and rounding (the same arithmetic).
 * Backward, dinp accumulated in bf16 by cublasGemmEx's beta = 1 (one
 * rounding), dweight in fp32, dbias the column sums of the bf16 dout.
 * scratch holds flow_cuda_matmul_bf16_scratch_bound() bytes of device
 * memory: the rounded weight and bias, and that panel. */
FLOW_EXPORT size_t flow_cuda_matmul_bf16_scratch_bound(size_t n, size_t in_dim,
						       size_t out_dim);
FLOW_EXPORT flow_err_t flow_cuda_matmul_bf16_forward(
	flow_bf16_t *out, void *scratch, const flow_bf16_t *inp,
	const float *weight, const float *bias, size_t n, size_t in_dim,
	size_t out_dim, flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_matmul_bf16_backward(
	flow_bf16_t *dinp, float *dweight, float *dbias, void *scratch,
	const flow_bf16_t *dout, const flow_bf16_t *inp, const float *weight,
	size_t n, size_t in_dim, size_t out_dim, flow_diag_t *diag,
	cudaStream_t stream) FLOW_MUST_CHECK;

/* cuBLAS's own sgemm in the row-major convention of these kernels, for
 * benchmarks (flow-bench kernel --device cuda): C[m,n] = op(A) . op(B) +
 * beta * C, op(A) the [m,k] matrix A (trans_a: A is stored [k,m] and
 * transposed), op(B) the [k,n] matrix B (trans_b: stored [n,k]).  True
 * fp32 (no TF32), as the matmul kernels. */
FLOW_EXPORT flow_err_t flow_cuda_gemm(bool trans_a, bool trans_b, size_t m,
				      size_t n, size_t k, const float *a,
				      const float *b, float beta, float *c,
				      flow_diag_t *diag,
				      cudaStream_t stream) FLOW_MUST_CHECK;

/* ---- token + position embedding ------------------------------------------ */
/* tokens (device int32) must be in [0, vocab): they are not checked.  wte
 * holds rows [row0, row0 + rows) of the table (flow/kernels.h). */
FLOW_EXPORT flow_err_t flow_cuda_embedding_forward(float *out,
						   const int32_t *tokens,
						   const float *wte,
						   const float *wpe,
						   int64_t row0, size_t rows,
						   size_t B, size_t T, size_t C,
						   flow_diag_t *diag,
						   cudaStream_t stream) FLOW_MUST_CHECK;
/* dwte and dwpe are optional.  dwte uses stream-ordered temporary memory
 * (about 16 bytes per token plus a radix sort's scratch). */
FLOW_EXPORT flow_err_t flow_cuda_embedding_backward(float *dwte, float *dwpe,
						    const float *dout,
						    const int32_t *tokens,
						    int64_t row0, size_t rows,
						    size_t B, size_t T,
						    size_t C,
						    flow_diag_t *diag,
						    cudaStream_t stream) FLOW_MUST_CHECK;

/* ---- layernorm, eps = FLOW_LAYERNORM_EPS --------------------------------- */
FLOW_EXPORT flow_err_t flow_cuda_layernorm_forward(float *out, float *mean,
						   float *rstd,
						   const float *inp,
						   const float *weight,
						   const float *bias, size_t n,
						   size_t C, flow_diag_t *diag,
						   cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_layernorm_bf16_forward(
	flow_bf16_t *out, float *mean, float *rstd, const float *inp,
	const float *weight, const float *bias, size_t n, size_t C,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
/* res = a + b, then layernorm(res): the two kernels' bits in one pass. */
FLOW_EXPORT flow_err_t flow_cuda_residual_layernorm_forward(
	float *res, float *out, float *mean, float *rstd, const float *a,
	const float *b, const float *weight, const float *bias, size_t n,
	size_t C, flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_residual_layernorm_bf16_forward(
	float *res, flow_bf16_t *out, float *mean, float *rstd, const float *a,
	const flow_bf16_t *b, const float *weight, const float *bias, size_t n,
	size_t C, flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
/* layernorm_backward into dres, then residual_backward of dres into da and
 * db (each optional), in the dinp pass: the two kernels' bits. */
FLOW_EXPORT flow_err_t flow_cuda_layernorm_residual_backward(
	float *dres, float *da, float *db, float *dweight, float *dbias,
	const float *dout, const float *res, const float *weight,
	const float *mean, const float *rstd, size_t n, size_t C,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_layernorm_residual_bf16_backward(
	float *dres, float *da, flow_bf16_t *db, float *dweight, float *dbias,
	const flow_bf16_t *dout, const float *res, const float *weight,
	const float *mean, const float *rstd, size_t n, size_t C,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
/* dinp, dweight, dbias are each optional. */
FLOW_EXPORT flow_err_t flow_cuda_layernorm_backward(float *dinp,
						    float *dweight,
						    float *dbias,
						    const float *dout,
						    const float *inp,
						    const float *weight,
						    const float *mean,
						    const float *rstd, size_t n,
						    size_t C, flow_diag_t *diag,
						    cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_layernorm_bf16_backward(
	float *dinp, float *dweight, float *dbias, const flow_bf16_t *dout,
	const float *inp, const float *weight, const float *mean,
	const float *rstd, size_t n, size_t C, flow_diag_t *diag,
	cudaStream_t stream) FLOW_MUST_CHECK;

/* ---- GELU, tanh approximation -------------------------------------------- */
/* matmul_forward into pre and the GELU of it into out, in one cuBLASLt
 * GEMM with the GELU_AUX(_BIAS) epilogue where it has an algorithm
 * (flow/kernels.h, matmul_gelu_forward), else the matmul and gelu
 * kernels.  The bf16 twin is matmul_bf16_forward's (above): pre and out
 * rounded from the same fp32 sum, so out is the GELU of the unrounded
 * pre. */
FLOW_EXPORT flow_err_t flow_cuda_matmul_gelu_forward(
	float *pre, float *out, const float *inp, const float *weight,
	const float *bias, size_t n, size_t in_dim, size_t out_dim,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_matmul_gelu_bf16_forward(
	flow_bf16_t *pre, flow_bf16_t *out, void *scratch,
	const flow_bf16_t *inp, const float *weight, const float *bias,
	size_t n, size_t in_dim, size_t out_dim, flow_diag_t *diag,
	cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_gelu_forward(float *out, const float *inp,
					      size_t n, flow_diag_t *diag,
					      cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_gelu_backward(float *dinp, const float *inp,
					       const float *dout, size_t n,
					       flow_diag_t *diag,
					       cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_gelu_bf16_forward(
	flow_bf16_t *out, const flow_bf16_t *inp, size_t n, flow_diag_t *diag,
	cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_gelu_bf16_backward(
	flow_bf16_t *dinp, const flow_bf16_t *inp, const flow_bf16_t *dout,
	size_t n, flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;

/* ---- causal multi-head self-attention ------------------------------------ */
/* How the process's bf16 attention passes (forward and backward each
 * count one) ran so far: through cuDNN's fused attention, or the own
 * kernel; why_own is why cuDNN was not used for the first pass it was not
 * ("" while every pass ran through it).  FLOW_CUDNN=0 in the environment
 * turns cuDNN off for the process; fp32 passes always run the own
 * kernel. */
FLOW_EXPORT void flow_cuda_attention_counts(uint64_t *cudnn, uint64_t *own,
					    const char **why_own);
/* Builds cuDNN's forward and backward attention graphs for these sizes
 * as far as no device is needed: every tensor and operation descriptor
 * is finalized, which is where cuDNN checks their shapes, strides and
 * types; given device_json (cuDNN's JSON device properties of a GPU),
 * the operation graph is finalized too (cuDNN checks how the operations
 * connect) and cuDNN's heuristics must count an engine config for it on
 * that GPU.  They are lenient (a graph computing something else can
 * count one): the numbers, the configs themselves and the plans need a
 * GPU.  FLOW_ERR_NOTSUP when this
 * build or machine has no cuDNN (the message says which),
 * FLOW_ERR_DEVICE naming what cuDNN refused. */
FLOW_EXPORT flow_err_t flow_cuda_attention_cudnn_check(size_t B, size_t T,
						       size_t C, size_t NH,
						       const char *device_json,
						       flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* As flow_cpu_attention_forward: lse (B,NH,T) is kept, the probabilities
 * of one batch row at a time live in scratch, device memory of at least
 * flow_cuda_attention_scratch_bound(.., false) bytes, 16-byte aligned. */
FLOW_EXPORT flow_err_t flow_cuda_attention_forward(float *out, float *lse,
						   void *scratch,
						   const float *qkv, size_t B,
						   size_t T, size_t C,
						   size_t NH,
						   flow_diag_t *diag,
						   cudaStream_t stream) FLOW_MUST_CHECK;
/* Bytes of device scratch either pass needs, of the fp32 kernels or
 * (bf16) of their twins: one batch row's probabilities and their gradient
 * in fp32, 8*NH*T*T, and for bf16 their bf16 copies, 4*NH*T*T more; in a
 * build with cuDNN, bf16 covers the fused path too, the whole batch's
 * dqkv in bf16 and a float per row, 6*B*T*C + 4*B*NH*T, whichever is
 * larger; 0 when that overflows size_t (then the passes report
 * FLOW_ERR_RANGE).  A pure function: no device is touched. */
FLOW_EXPORT size_t flow_cuda_attention_scratch_bound(size_t B, size_t T,
						     size_t C, size_t NH,
						     bool bf16);
/* dqkv += gradient, the probabilities recomputed from lse; scratch as
 * the forward pass's; out is the forward pass's output (not read). */
FLOW_EXPORT flow_err_t flow_cuda_attention_backward(float *dqkv,
						    void *scratch,
						    const float *dout,
						    const float *qkv,
						    const float *lse,
						    const float *out, size_t B,
						    size_t T, size_t C,
						    size_t NH,
						    flow_diag_t *diag,
						    cudaStream_t stream) FLOW_MUST_CHECK;
/* The bf16 twins: cuDNN's fused attention where it takes the sizes (see
 * flow_cuda_attention_counts) on the bf16 tensors in place, its backward
 * writing its gradient into scratch and adding it into dqkv (so dqkv is
 * rounded twice, cuDNN's bf16 gradient and the sum); else the own kernel
 * with bf16 products, P and dpre rounded where they multiply, out written
 * and dqkv accumulated by the GEMMs (one rounding).  scratch holds
 * flow_cuda_attention_scratch_bound(.., true) bytes. */
FLOW_EXPORT flow_err_t flow_cuda_attention_bf16_forward(
	flow_bf16_t *out, float *lse, void *scratch, const flow_bf16_t *qkv,
	size_t B, size_t T, size_t C, size_t NH, flow_diag_t *diag,
	cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_attention_bf16_backward(
	flow_bf16_t *dqkv, void *scratch, const flow_bf16_t *dout,
	const flow_bf16_t *qkv, const float *lse, const flow_bf16_t *out,
	size_t B, size_t T, size_t C, size_t NH, flow_diag_t *diag,
	cudaStream_t stream) FLOW_MUST_CHECK;

/* ---- residual add -------------------------------------------------------- */
FLOW_EXPORT flow_err_t flow_cuda_residual_forward(float *out, const float *a,
						  const float *b, size_t n,
						  flow_diag_t *diag,
						  cudaStream_t stream) FLOW_MUST_CHECK;
/* da and db are each optional. */
FLOW_EXPORT flow_err_t flow_cuda_residual_backward(float *da, float *db,
						   const float *dout, size_t n,
						   flow_diag_t *diag,
						   cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_residual_bf16_forward(
	float *out, const float *a, const flow_bf16_t *b, size_t n,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_residual_bf16_backward(
	float *da, flow_bf16_t *db, const float *dout, size_t n,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;

/* ---- fused softmax cross-entropy ----------------------------------------- */
/* As the CPU kernel; targets are device int32.  A row whose target is
 * outside [0, V) (negative: ignored by contract) gets loss 0 and gradient 0. */
FLOW_EXPORT flow_err_t flow_cuda_cross_entropy_forward_backward(
	float *losses, float *logits, const int32_t *targets, size_t n,
	size_t V, size_t Vp, float dloss, flow_diag_t *diag,
	cudaStream_t stream) FLOW_MUST_CHECK;
/* The three steps over a column shard of the logits (flow/kernels.h), one
 * block per row; s is host memory, read before return. */
FLOW_EXPORT flow_err_t flow_cuda_cross_entropy_split_max(
	float *max, const float *logits, const flow_logits_shard_t *s,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_cross_entropy_split_sums(
	float *sums, float *max, const float *gathered, size_t p,
	const float *logits, const flow_logits_shard_t *s, flow_diag_t *diag,
	cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_cross_entropy_split_finish(
	float *losses, float *logits, const int32_t *targets, const float *max,
	const float *sums, const flow_logits_shard_t *s, float dloss,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
/* The bf16 twins of the four, over bf16 logits. */
FLOW_EXPORT flow_err_t flow_cuda_cross_entropy_bf16_forward_backward(
	float *losses, flow_bf16_t *logits, const int32_t *targets, size_t n,
	size_t V, size_t Vp, float dloss, flow_diag_t *diag,
	cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_cross_entropy_bf16_split_max(
	float *max, const flow_bf16_t *logits, const flow_logits_shard_t *s,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_cross_entropy_bf16_split_sums(
	float *sums, float *max, const float *gathered, size_t p,
	const flow_bf16_t *logits, const flow_logits_shard_t *s,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_cross_entropy_bf16_split_finish(
	float *losses, flow_bf16_t *logits, const int32_t *targets,
	const float *max, const float *sums, const flow_logits_shard_t *s,
	float dloss, flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;

/* ---- boxing -------------------------------------------------------------- */
/* flow/kernels.h's box_move on device memory; the boxes are host memory,
 * read before return.  FLOW_ERR_USAGE for an unknown dtype. */
FLOW_EXPORT flow_err_t flow_cuda_box_move(flow_dtype_t dtype, const void *src,
					  const flow_box_t *src_box, void *dst,
					  const flow_box_t *dst_box,
					  const flow_box_t *region, bool add,
					  flow_diag_t *diag,
					  cudaStream_t stream) FLOW_MUST_CHECK;

/* ---- AdamW --------------------------------------------------------------- */
/* As flow_cpu_adamw_update, in torch.optim.AdamW's (single-tensor) order of
 * operations; hp is host memory, read before return. */
FLOW_EXPORT flow_err_t flow_cuda_adamw_update(float *param, const float *grad,
					      float *m, float *v, size_t n,
					      const flow_adamw_params_t *hp,
					      uint64_t t, bool decay,
					      flow_diag_t *diag,
					      cudaStream_t stream) FLOW_MUST_CHECK;

/* The update of ntensors tensors in one launch (flow_adamw_update_all_fn):
 * the arrays are host memory, read before return; a tile of 65536
 * elements per block. */
FLOW_EXPORT flow_err_t flow_cuda_adamw_update_all(
	float *const *params, const float *const *grads, float *const *m,
	float *const *v, const size_t *counts, const bool *decay,
	size_t ntensors, const flow_adamw_params_t *hp, uint64_t t,
	flow_diag_t *diag, cudaStream_t stream) FLOW_MUST_CHECK;

/* ---- global gradient-norm clipping --------------------------------------- */
/* Sum of squares of n floats (squares and sums in double, fixed order) into
 * *sum_out, ONE double in DEVICE memory (so no synchronisation). */
FLOW_EXPORT flow_err_t flow_cuda_sum_squares(const float *x, size_t n,
					     double *sum_out,
					     flow_diag_t *diag,
					     cudaStream_t stream) FLOW_MUST_CHECK;
/* x *= s. */
FLOW_EXPORT flow_err_t flow_cuda_scale(float *x, size_t n, float s,
				       flow_diag_t *diag,
				       cudaStream_t stream) FLOW_MUST_CHECK;
/* As flow_cpu_clip_grad_norm: grads is a HOST array of ntensors DEVICE
 * pointers, counts a host array.  The norm and the clip coefficient are
 * computed on the device (no host round trip between the two passes).  When
 * norm_out is not NULL this synchronises on stream and writes the norm
 * before clipping to *norm_out (host); when NULL it returns at once. */
FLOW_EXPORT flow_err_t flow_cuda_clip_grad_norm(float *const *grads,
						const size_t *counts,
						size_t ntensors, float max_norm,
						float *norm_out,
						flow_diag_t *diag,
						cudaStream_t stream) FLOW_MUST_CHECK;

/* ---- the executor's kernel set and storage (table.cu) ------------------- */
/* The kernels above as flow_kernels_t members, on the calling thread's
 * stream (cudaStreamPerThread), each keeping its first failure for last(). */
FLOW_EXPORT extern const flow_kernels_t flow_cuda_kernels;
/* flow_cuda_gemm on that stream, its failure kept as the kernels' are. */
FLOW_EXPORT void flow_cuda_table_gemm(bool trans_a, bool trans_b, size_t m,
				      size_t n, size_t k, const float *a,
				      const float *b, float beta, float *c);
/* flow_exec_storage_t's members over device memory (flow/exec.h): zeroed
 * blocks of the current device's caching allocator over cudaMalloc (NULL
 * when out of memory), given back to its cache once the thread's stream
 * is idle, and zeroing and copies in order on that stream (copy_out
 * waits); failures are kept for flow_cuda_kernels.last(). */
FLOW_EXPORT void *flow_cuda_storage_alloc(size_t bytes);
FLOW_EXPORT void flow_cuda_storage_free(void *ptr);
FLOW_EXPORT void flow_cuda_storage_zero(void *ptr, size_t bytes);
FLOW_EXPORT void flow_cuda_storage_copy_in(void *dst, const void *src,
					   size_t bytes);
FLOW_EXPORT void flow_cuda_storage_copy_out(void *dst, const void *src,
					    size_t bytes);
FLOW_EXPORT void flow_cuda_storage_copy(void *dst, const void *src,
					size_t bytes);
/* Events without timing on the thread's stream (cudaEventRecord), waited
 * for with cudaEventSynchronize from any thread. */
FLOW_EXPORT void *flow_cuda_storage_event_new(void);
FLOW_EXPORT void flow_cuda_storage_event_record(void *event);
FLOW_EXPORT void flow_cuda_storage_event_wait(void *event);
FLOW_EXPORT void flow_cuda_storage_event_free(void *event);
/* copy_in_ahead on the thread's copy stream (non-blocking, one per
 * device), behind cudaStreamWaitEvent(after); kernels_wait is
 * cudaStreamWaitEvent on the thread's stream. */
FLOW_EXPORT void flow_cuda_storage_copy_in_ahead(void *dst, const void *src,
						 size_t bytes, void *after,
						 void *done);
FLOW_EXPORT void flow_cuda_storage_kernels_wait(void *event);
/* Page-locked host memory (cudaMallocHost), NULL when out of memory;
 * cudaFreeHost once the thread's stream is idle. */
FLOW_EXPORT void *flow_cuda_storage_host_alloc(size_t bytes);
FLOW_EXPORT void flow_cuda_storage_host_free(void *ptr);
/* The storage's caching allocator of device (flow/caching_alloc.h): all
 * zero before its first allocation. */
FLOW_EXPORT flow_err_t flow_cuda_storage_stats(int device,
					       flow_alloc_stats_t *stats_out,
					       flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
