/* The entry point of libflow-cuda.so: the table libflow gets when it loads
 * the module (lib/device/cuda_module_internal.h).  Everything the module
 * offers libflow goes through this one table. */
#include <config.h>

#include <cublas_api.h>

#include <flow/kernels_cuda.h>

#include "device/cuda_module_internal.h"

#ifdef HAVE_NCCL
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include "comm/comm_internal.h"
#endif

#define STR2(x) #x
#define STR(x) STR2(x)

#ifdef HAVE_NCCL
#define NCCL_PART ", NCCL " STR(NCCL_MAJOR) "." STR(NCCL_MINOR) "." \
		  STR(NCCL_PATCH)
#else
#define NCCL_PART ", no NCCL"
#endif

static const flow_exec_storage_t storage = {
	.name = "cuda",
	.host_addressable = false,
	.alloc = flow_cuda_storage_alloc,
	.free = flow_cuda_storage_free,
	.zero = flow_cuda_storage_zero,
	.copy_in = flow_cuda_storage_copy_in,
	.copy_out = flow_cuda_storage_copy_out,
	.copy = flow_cuda_storage_copy,
	.host_alloc = flow_cuda_storage_host_alloc,
	.host_free = flow_cuda_storage_host_free,
	.event_new = flow_cuda_storage_event_new,
	.event_record = flow_cuda_storage_event_record,
	.event_wait = flow_cuda_storage_event_wait,
	.event_free = flow_cuda_storage_event_free,
	.copy_in_ahead = flow_cuda_storage_copy_in_ahead,
	.kernels_wait = flow_cuda_storage_kernels_wait,
};

static const flow_cuda_module_t module = {
	.abi = FLOW_CUDA_MODULE_ABI,
	.build = "CUDA runtime " STR(CUDART_VERSION) ", cuBLAS " STR(
		CUBLAS_VER_MAJOR) "." STR(CUBLAS_VER_MINOR) "." STR(CUBLAS_VER_PATCH)
		NCCL_PART ", " FLOW_CUDA_ARCH,
	.device_count = flow_cuda_device_count,
	.device_info = flow_cuda_device_info,
	.set_device = flow_cuda_set_device,
	.malloc = flow_cuda_malloc,
	.free = flow_cuda_free,
	.copy_to_device = flow_cuda_copy_to_device,
	.copy_to_host = flow_cuda_copy_to_host,
	.kernels = &flow_cuda_kernels,
	.storage = &storage,
	.gemm = flow_cuda_table_gemm,
	.storage_stats = flow_cuda_storage_stats,
	.attention_counts = flow_cuda_attention_counts,
#ifdef HAVE_NCCL
	.comm_nccl_init = flow_comm_nccl_init,
#endif
};

/* The module's one entry point (its table, for a caller of this ABI). */
__attribute__((visibility("default"))) const flow_cuda_module_t *
flow_cuda_module_entry(uint32_t abi);

const flow_cuda_module_t *flow_cuda_module_entry(uint32_t abi)
{
	return abi == FLOW_CUDA_MODULE_ABI ? &module : NULL;
}
