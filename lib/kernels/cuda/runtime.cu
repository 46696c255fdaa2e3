/* CUDA runtime pieces behind kernels_cuda.h: error conversion at the CUDA and
 * cuBLAS boundary, the per-thread cuBLAS and cuBLASLt handles, device queries and the
 * memory helpers used by tools and tests. */
#include <config.h>

#include <cstdio>
#include <cstring>

#include <dlfcn.h>

#include "attention_cudnn.h"
#include "cuda_internal.h"


/* The cuBLAS handles' math mode (flow_cuda__cublas). */
static const cublasMath_t cublas_math_mode = static_cast<cublasMath_t>(
	CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);

/* The calling thread's handles, indexed by device ordinal. */
static thread_local cublasHandle_t tls_cublas[FLOW_CUDA_MAX_DEVICES];
static thread_local cublasLtHandle_t tls_cublaslt[FLOW_CUDA_MAX_DEVICES];
static thread_local void *tls_lt_workspace[FLOW_CUDA_MAX_DEVICES];
/* The stream of the workspace's last matmul, and an event after it. */
static thread_local cudaStream_t tls_lt_stream[FLOW_CUDA_MAX_DEVICES];
static thread_local cudaEvent_t tls_lt_done[FLOW_CUDA_MAX_DEVICES];
/* The copy stream batches come up on while the kernels run. */
static thread_local cudaStream_t tls_copy_stream[FLOW_CUDA_MAX_DEVICES];

/* "matmul.cu" from "/path/lib/kernels/cuda/matmul.cu". */
static const char *base_name(const char *path)
{
	const char *slash = std::strrchr(path, '/');
	return slash ? slash + 1 : path;
}

flow_err_t flow_cuda__fail(flow_diag_t *diag, cudaError_t e, const char *func,
			   const char *file, int line)
{
	return flow_diag_set(diag, FLOW_ERR_DEVICE,
			     "CUDA call failed in '%s' (%s:%d): %s: %s", func,
			     base_name(file), line, cudaGetErrorName(e),
			     cudaGetErrorString(e));
}

flow_err_t flow_cuda__fail_cublas(flow_diag_t *diag, cublasStatus_t s,
				  const char *func, const char *file, int line)
{
	return flow_diag_set(diag, FLOW_ERR_DEVICE,
			     "cuBLAS call failed in '%s' (%s:%d): %s: %s", func,
			     base_name(file), line, cublasGetStatusName(s),
			     cublasGetStatusString(s));
}

flow_err_t flow_cuda__check_size(flow_diag_t *diag, const char *func,
				 const char *what, size_t value, size_t limit)
{
	if (value <= limit)
		return FLOW_OK;
	return flow_diag_set(diag, FLOW_ERR_RANGE,
			     "size '%s' = %zu of '%s' exceeds %zu", what, value,
			     func, limit);
}

/* The calling thread's current device, as an index of the handle tables. */
static flow_err_t current_device(int *dev_out, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	int dev = 0;

	FLOW_CUDA_TRY(cudaGetDevice(&dev), out);
	if (dev < 0 || dev >= FLOW_CUDA_MAX_DEVICES)
		err = flow_diag_set(diag, FLOW_ERR_RANGE,
				    "CUDA device %d is beyond the %d devices "
				    "libflow supports",
				    dev, FLOW_CUDA_MAX_DEVICES);
	*dev_out = dev;
out:
	return err;
}

flow_err_t flow_cuda__cublaslt(cublasLtHandle_t *handle_out,
			       void **workspace_out, cudaStream_t stream,
			       flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	int dev = 0;

	FLOW_TRY(current_device(&dev, diag), out);
	if (!tls_cublaslt[dev])
		FLOW_CUBLAS_TRY(cublasLtCreate(&tls_cublaslt[dev]), out);
	if (!tls_lt_done[dev])
		FLOW_CUDA_TRY(cudaEventCreateWithFlags(&tls_lt_done[dev],
						       cudaEventDisableTiming),
			      out);
	if (!tls_lt_workspace[dev])
		FLOW_CUDA_TRY(cudaMalloc(&tls_lt_workspace[dev],
					 FLOW_CUDA_LT_WORKSPACE),
			      out);
	else if (tls_lt_stream[dev] != stream)
		FLOW_CUDA_TRY(cudaStreamWaitEvent(stream, tls_lt_done[dev], 0),
			      out);
	*handle_out = tls_cublaslt[dev];
	*workspace_out = tls_lt_workspace[dev];
out:
	return err;
}

flow_err_t flow_cuda__cublaslt_used(cudaStream_t stream, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	int dev = 0;

	FLOW_TRY(current_device(&dev, diag), out);
	tls_lt_stream[dev] = stream;
	FLOW_CUDA_TRY(cudaEventRecord(tls_lt_done[dev], stream), out);
out:
	return err;
}

flow_err_t flow_cuda__copy_stream(cudaStream_t *stream_out, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	int dev = 0;

	FLOW_TRY(current_device(&dev, diag), out);
	/* Non-blocking: it must not wait for the legacy default stream's
	 * work, only for the events it is told to. */
	if (!tls_copy_stream[dev])
		FLOW_CUDA_TRY(cudaStreamCreateWithFlags(&tls_copy_stream[dev],
							cudaStreamNonBlocking),
			      out);
	*stream_out = tls_copy_stream[dev];
out:
	return err;
}

flow_err_t flow_cuda__cublas(cublasHandle_t *handle_out, cudaStream_t stream,
			     flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	int dev = 0;
	cublasHandle_t h = NULL;

	FLOW_TRY(current_device(&dev, diag), out);
	h = tls_cublas[dev];
	if (!h) {
		FLOW_CUBLAS_TRY(cublasCreate(&h), out);
		tls_cublas[dev] = h;
		/* True fp32: no TF32 tensor-core shortcut.  (The
		 * NVIDIA_TF32_OVERRIDE=1 environment variable could still force
		 * it; tests run without it.)  And a bf16 output's split-K
		 * parts summed in fp32, not in bf16, which cuBLAS may do
		 * unless told: the bf16 twins round each stored sum once.
		 * The flag changes nothing for fp32 outputs. */
		FLOW_CUBLAS_TRY(cublasSetMathMode(h, cublas_math_mode), out);
		FLOW_CUBLAS_TRY(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST),
				out);
	}
	FLOW_CUBLAS_TRY(cublasSetStream(h, stream), out);
	*handle_out = h;
out:
	return err;
}

void flow_cuda_release_thread(void)
{
	int saved = -1;
	bool have_saved = cudaGetDevice(&saved) == cudaSuccess;
	for (int dev = 0; dev < FLOW_CUDA_MAX_DEVICES; dev++) {
		if (!tls_cublas[dev] && !tls_cublaslt[dev] &&
		    !tls_lt_workspace[dev] && !tls_lt_done[dev] &&
		    !tls_copy_stream[dev])
			continue;
		/* cublasDestroy synchronises with the handle's device; the
		 * workspace is freed once its last matmul is done. */
		if (cudaSetDevice(dev) == cudaSuccess) {
			if (tls_cublas[dev])
				(void)cublasDestroy(tls_cublas[dev]);
			if (tls_cublaslt[dev])
				(void)cublasLtDestroy(tls_cublaslt[dev]);
			if (tls_lt_done[dev]) {
				(void)cudaEventSynchronize(tls_lt_done[dev]);
				(void)cudaEventDestroy(tls_lt_done[dev]);
			}
			(void)cudaFree(tls_lt_workspace[dev]);
			/* Returns at once; the stream goes once its copies
			 * are done. */
			if (tls_copy_stream[dev])
				(void)cudaStreamDestroy(tls_copy_stream[dev]);
		}
		tls_cublas[dev] = NULL;
		tls_cublaslt[dev] = NULL;
		tls_lt_workspace[dev] = NULL;
		tls_lt_stream[dev] = NULL;
		tls_lt_done[dev] = NULL;
		tls_copy_stream[dev] = NULL;
	}
	flow_cuda__lt_picks_forget();
	flow_cuda__table_release_thread();
	flow_cuda__cudnn_release_thread();
	if (have_saved)
		(void)cudaSetDevice(saved);
}

flow_err_t flow_cuda_device_count(int *count_out, flow_diag_t *diag)
{
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);
	if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
	    e == cudaErrorStubLibrary || e == cudaErrorCompatNotSupportedOnDevice) {
		(void)cudaGetLastError(); /* not sticky; clear it */
		/* The runtime loads the driver library itself; when it is not
		 * mapped now, it was not found: say so, not just "insufficient". */
		void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
		if (driver)
			dlclose(driver);
		return flow_diag_set(diag, FLOW_ERR_NOTSUP,
				     "no usable CUDA driver or device: %s (%s)%s",
				     cudaGetErrorString(e), cudaGetErrorName(e),
				     driver ? ""
					    : "; the NVIDIA driver library "
					      "libcuda.so.1 is not installed");
	}
	if (e != cudaSuccess)
		return flow_cuda__fail(diag, e, __func__, __FILE__, __LINE__);
	*count_out = count;
	return FLOW_OK;
}

flow_err_t flow_cuda_set_device(int device, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	cudaMemPool_t pool = nullptr;
	uint64_t keep = UINT64_MAX;

	FLOW_CUDA_TRY(cudaSetDevice(device), out);
	/* The pool the kernels' stream-ordered temporaries come from (the
	 * embedding backward's sort, AdamW's tables) keeps what they give
	 * back: by default it trims at every synchronisation, and each step
	 * would map the same memory again.  Only speed hangs on it: a device
	 * without pools runs as before. */
	if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess ||
	    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold,
				    &keep) != cudaSuccess)
		(void)cudaGetLastError();
out:
	return err;
}

flow_err_t flow_cuda_device_info(int device, flow_cuda_device_info_t *info_out,
				 flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	cudaDeviceProp prop;
	flow_cuda_device_info_t info;

	std::memset(&info, 0, sizeof(info));
	FLOW_CUDA_TRY(cudaGetDeviceProperties(&prop, device), out);
	info.device = device;
	std::snprintf(info.name, sizeof(info.name), "%s", prop.name);
	info.cc_major = prop.major;
	info.cc_minor = prop.minor;
	info.sm_count = prop.multiProcessorCount;
	info.global_mem = prop.totalGlobalMem;
	info.l2_bytes = prop.l2CacheSize > 0 ? (size_t)prop.l2CacheSize : 0;
	FLOW_CUDA_TRY(cudaRuntimeGetVersion(&info.runtime_version), out);
	FLOW_CUDA_TRY(cudaDriverGetVersion(&info.driver_version), out);
	FLOW_CUDA_TRY(cudaDeviceGetPCIBusId(info.pci_bus_id,
					    (int)sizeof(info.pci_bus_id), device),
		      out);
	*info_out = info;
out:
	return err;
}

flow_err_t flow_cuda_malloc(void **ptr_out, size_t bytes, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	void *p = NULL;
	if (bytes > 0)
		FLOW_CUDA_TRY(cudaMalloc(&p, bytes), out);
	*ptr_out = p;
out:
	return err;
}

void flow_cuda_free(void *ptr)
{
	if (ptr)
		(void)cudaFree(ptr);
}

flow_err_t flow_cuda_copy_to_device(void *dst, const void *src, size_t bytes,
				    flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	if (bytes > 0)
		FLOW_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
			      out);
out:
	return err;
}

flow_err_t flow_cuda_copy_to_host(void *dst, const void *src, size_t bytes,
				  flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	if (bytes > 0)
		FLOW_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost),
			      out);
out:
	return err;
}

flow_err_t flow_cuda_zero(void *dst, size_t bytes, flow_diag_t *diag,
			  cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	if (bytes > 0)
		FLOW_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, stream), out);
out:
	return err;
}

flow_err_t flow_cuda__event_record(cudaEvent_t event, flow_diag_t *diag,
				   cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	FLOW_CUDA_TRY(cudaEventRecord(event, stream), out);
out:
	return err;
}

flow_err_t flow_cuda_sync(cudaStream_t stream, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	FLOW_CUDA_TRY(cudaStreamSynchronize(stream), out);
out:
	return err;
}
