/* Devices: the CPU, and CUDA GPUs through libflow-cuda, a module loaded on
 * demand.
 *
 * libflow itself links no CUDA library.  Everything that does (the CUDA
 * runtime, cuBLAS, cuBLASLt, cuDNN, NCCL) is in libflow-cuda.so, installed
 * beside libflow, which libflow dlopen()s the first time a run asks for a
 * CUDA device, device memory or the NCCL backend.  So every CPU tool starts
 * with none of those libraries mapped, and a CUDA build runs every CPU
 * feature on a node without a GPU, a driver or the CUDA libraries; asking
 * for CUDA there fails with one line saying what is missing.
 *
 * The module is looked for, in order: $FLOW_CUDA_MODULE (a path, for tests
 * and unusual installs), then libflow-cuda.so in the directory libflow was
 * loaded from, then the dynamic loader's search path.  The first load's
 * outcome, success or failure, is kept for the life of the process.
 *
 * Thread safety: every function may be called from any thread; the module
 * is loaded once (pthread_once). */
#ifndef FLOW_DEVICE_H
#define FLOW_DEVICE_H

#include <flow/common.h>
#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
	FLOW_DEVICE_CPU = 0,
	FLOW_DEVICE_CUDA = 1,
} flow_device_kind_t;

/* "cpu", "cuda". */
FLOW_EXPORT const char *flow_device_kind_name(flow_device_kind_t kind);
/* "cpu" or "cuda" into *kind_out; FLOW_ERR_USAGE naming the text
 * otherwise. */
FLOW_EXPORT flow_err_t flow_device_kind_parse(const char *text,
					      flow_device_kind_t *kind_out,
					      flow_diag_t *diag) FLOW_MUST_CHECK;

/* Describes one CUDA device. */
typedef struct flow_cuda_device_info {
	int device;             /* ordinal */
	char name[256];         /* e.g. "NVIDIA H200" */
	int cc_major, cc_minor; /* compute capability, e.g. 9.0 */
	int sm_count;           /* multiprocessors */
	size_t global_mem;      /* bytes */
	size_t l2_bytes;        /* L2 cache bytes */
	int runtime_version;    /* e.g. 13000 */
	int driver_version;     /* e.g. 13000 */
	char pci_bus_id[32];    /* "0000:19:00.0" */
} flow_cuda_device_info_t;

/* Load libflow-cuda and check that a CUDA driver and at least one device
 * are usable.  FLOW_ERR_NOTSUP with one line when this build has no CUDA
 * ("this build of flow has no CUDA support (configure found no CUDA
 * toolkit)"), when the module or a library it needs cannot be loaded
 * (dlerror's words: "cannot load the CUDA module
 * /usr/lib/libflow-cuda.so: libcudart.so.13: cannot open shared object
 * file"), when the module is of another flow version, or when there is no
 * usable driver or device ("no usable CUDA driver or device: ...").  Cheap
 * after the first call. */
FLOW_EXPORT flow_err_t flow_cuda_open(flow_diag_t *diag) FLOW_MUST_CHECK;

/* Whether libflow-cuda is mapped in this process (a CPU run never maps
 * it). */
FLOW_EXPORT bool flow_cuda_module_loaded(void);

/* The path the module was, or would be, loaded from; borrowed, valid for
 * the process. */
FLOW_EXPORT const char *flow_cuda_module_path(void);

/* The number of CUDA devices visible to this process (after
 * CUDA_VISIBLE_DEVICES) into *count_out (>= 1 on FLOW_OK); errors as
 * flow_cuda_open. */
FLOW_EXPORT flow_err_t flow_cuda_count(int *count_out,
				       flow_diag_t *diag) FLOW_MUST_CHECK;
/* Describe device into *info_out. */
FLOW_EXPORT flow_err_t flow_cuda_info(int device,
				      flow_cuda_device_info_t *info_out,
				      flow_diag_t *diag) FLOW_MUST_CHECK;
/* Make device the calling thread's current CUDA device. */
FLOW_EXPORT flow_err_t flow_cuda_select(int device,
					flow_diag_t *diag) FLOW_MUST_CHECK;

/* Device memory of the calling thread's current device, for tools and
 * tests (the executor has its own caching allocator): cudaMalloc'd bytes
 * (0 gives NULL) into *ptr_out, freed with flow_cuda_release (NULL is
 * ignored); synchronous copies. */
FLOW_EXPORT flow_err_t flow_cuda_alloc(void **ptr_out, size_t bytes,
				       flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_cuda_release(void *ptr);
FLOW_EXPORT flow_err_t flow_cuda_upload(void *dst, const void *src,
					size_t bytes,
					flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_cuda_download(void *dst, const void *src,
					  size_t bytes,
					  flow_diag_t *diag) FLOW_MUST_CHECK;

/* How the process's bf16 attention passes ran so far: through cuDNN's
 * fused attention or flow's own kernel, and why cuDNN declined the first
 * one it did ("" if none); see flow_cuda_attention_counts. */
FLOW_EXPORT flow_err_t flow_cuda_attention_paths(uint64_t *cudnn,
						 uint64_t *own,
						 const char **why_own,
						 flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* What the executors' caching allocator holds on device
 * (flow/caching_alloc.h): bytes in use and reserved, and their peaks. */
struct flow_alloc_stats;
FLOW_EXPORT flow_err_t flow_cuda_memory_stats(int device,
					      struct flow_alloc_stats *stats_out,
					      flow_diag_t *diag) FLOW_MUST_CHECK;

/* The datasheet's dense peak of a GPU named name (flow_cuda_device_info_t
 * .name), in GFLOP/s, for bf16 tensor-core math (bf16) or true fp32 (not
 * TF32); 0 for a GPU not in the table.  *source_out (may be NULL) names
 * the datasheet figure, e.g. "H100 SXM5 datasheet: 989.4 TFLOP/s bf16
 * dense".  The table: flow-train(1), MFU. */
FLOW_EXPORT double flow_cuda_peak_gflops(const char *name, bool bf16,
					 const char **source_out);

#ifdef __cplusplus
}
#endif

#endif
