/* Causal attention through cuDNN's fused scaled-dot-product attention
 * (attention_cudnn.c), for the bf16 attention of attention.cu.  Private to
 * libflow-cuda; C linkage, so that the .cu files and the C file share it.
 *
 * cuDNN is opened with dlopen the first time a bf16 attention runs, never
 * linked: the module then loads where cuDNN is absent, and attention
 * falls back to the project's own kernel.  cuDNN declines a pass when it
 * is absent, was turned off with FLOW_CUDNN=0, or built no plan for the
 * sizes; then the caller runs its own kernel.  An error is a failure of a
 * plan that built.
 *
 * Layouts are attention.cu's, in bf16: qkv (B,T,3C) with q, k, v each NH
 * heads of hs = C/NH columns; o and dout (B,T,C); dqkv as qkv; lse
 * (B,NH,T) fp32, cuDNN's "stats" (the natural log of each row's sum of
 * exp(scale q.k) over its causal columns, as flow/kernels.h defines it).
 * All of device memory, 16-byte aligned. */
#ifndef FLOW_ATTENTION_CUDNN_H
#define FLOW_ATTENTION_CUDNN_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FLOW_CUDNN_HIDDEN __attribute__((visibility("hidden")))
#else
#define FLOW_CUDNN_HIDDEN
#endif

/* Whether this build has the cuDNN path (configure found cudnn.h). */
FLOW_CUDNN_HIDDEN bool flow_cuda__cudnn_built(void);

/* A built plan for one pass of one size (attention_cudnn.c). */
typedef struct flow_cudnn_plan flow_cudnn_plan_t;

/* The calling thread's plan for the forward (or backward) pass of these
 * sizes on the current device, loading cuDNN and building the plan on
 * first asking; NULL when cuDNN declines (either answer is remembered),
 * and then declined_why says why. */
FLOW_CUDNN_HIDDEN flow_cudnn_plan_t *
flow_cuda__cudnn_attention_plan(bool backward, size_t B, size_t T, size_t C,
				size_t NH);
FLOW_CUDNN_HIDDEN const char *flow_cuda__cudnn_declined_why(void);

/* The forward pass of plan's sizes: o and lse from qkv. */
FLOW_CUDNN_HIDDEN flow_err_t flow_cuda__cudnn_attention_forward(
	flow_cudnn_plan_t *plan, void *o, float *lse, const void *qkv,
	flow_diag_t *diag, cudaStream_t stream);

/* The backward pass of plan's sizes: dqkv (overwritten, bf16) from qkv,
 * o, dout and lse; softmax_sum is room for B*NH*T floats (rowsum(dout *
 * o), the graph's own intermediate). */
FLOW_CUDNN_HIDDEN flow_err_t flow_cuda__cudnn_attention_backward(
	flow_cudnn_plan_t *plan, void *dqkv, float *softmax_sum,
	const void *qkv, const void *o, const void *dout, const float *lse,
	flow_diag_t *diag, cudaStream_t stream);

/* Forget the calling thread's cuDNN handles and plans (with the cuBLAS
 * handles, flow_cuda_release_thread). */
FLOW_CUDNN_HIDDEN void flow_cuda__cudnn_release_thread(void);

#ifdef __cplusplus
}
#endif

#endif
