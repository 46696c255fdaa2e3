/* The contract between libflow and libflow-cuda.so (lib/device/device.c
 * loads it; lib/kernels/cuda/module.cu fills it): one table of functions,
 * obtained through the module's only entry point, so libflow names no CUDA
 * symbol and maps no CUDA library until a run asks for a device.  Both
 * sides are built from the same tree; FLOW_CUDA_MODULE_ABI changes with
 * any change to this table, and a module of another ABI is refused.
 *
 * No CUDA type appears here: streams are void *, device pointers are plain
 * pointers. */
#ifndef FLOW_CUDA_MODULE_INTERNAL_H
#define FLOW_CUDA_MODULE_INTERNAL_H

#include <stdint.h>

#include <flow/caching_alloc.h>
#include <flow/device.h>
#include <flow/error.h>
#include <flow/exec.h>
#include <flow/kernels.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLOW_CUDA_MODULE_ABI 14u
#define FLOW_CUDA_MODULE_ENTRY "flow_cuda_module_entry"

struct flow_comm;

typedef struct flow_cuda_module {
	uint32_t abi;       /* FLOW_CUDA_MODULE_ABI */
	const char *build;  /* "CUDA 13.0, cuBLAS 13.0.0, NCCL 2.27.7, sm_90" */

	/* ---- runtime (kernels_cuda.h) ---- */
	/* FLOW_ERR_NOTSUP when there is no usable driver or device. */
	flow_err_t (*device_count)(int *count_out, flow_diag_t *diag);
	flow_err_t (*device_info)(int device, flow_cuda_device_info_t *out,
				  flow_diag_t *diag);
	flow_err_t (*set_device)(int device, flow_diag_t *diag);
	flow_err_t (*malloc)(void **ptr_out, size_t bytes, flow_diag_t *diag);
	void (*free)(void *ptr);
	flow_err_t (*copy_to_device)(void *dst, const void *src, size_t bytes,
				     flow_diag_t *diag);
	flow_err_t (*copy_to_host)(void *dst, const void *src, size_t bytes,
				   flow_diag_t *diag);

	/* ---- the executor's kernel set and storage (flow/exec.h) ---- */
	const flow_kernels_t *kernels;
	const flow_exec_storage_t *storage;
	/* cuBLAS's own sgemm on the kernels' stream, row-major (benchmarks;
	 * flow_cuda_gemm in kernels_cuda.h); failures kept for last(). */
	void (*gemm)(bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
		     const float *a, const float *b, float beta, float *c);
	/* The storage's caching allocator on device. */
	flow_err_t (*storage_stats)(int device, flow_alloc_stats_t *stats_out,
				    flow_diag_t *diag);
	/* How bf16 attention ran (flow_cuda_attention_counts). */
	void (*attention_counts)(uint64_t *cudnn, uint64_t *own,
				 const char **why_own);

	/* ---- the NCCL backend of flow_comm (lib/comm/comm_nccl.c) ---- */
	/* NULL when the module was built without NCCL. */
	flow_err_t (*comm_nccl_init)(struct flow_comm *c,
				     struct flow_comm *parent,
				     flow_diag_t *diag);
} flow_cuda_module_t;

/* The module's entry point: its table when abi is the one it was built
 * for, else NULL. */
typedef const flow_cuda_module_t *flow_cuda_module_entry_fn(uint32_t abi);

/* libflow side: the loaded module's table into *module_out, loading it on
 * first use (flow/device.h says where from); FLOW_ERR_NOTSUP with one line
 * when it cannot be loaded.  Does not check for a driver or device. */
flow_err_t flow_cuda_module_get(const flow_cuda_module_t **module_out,
				flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
