/* Private helpers shared by the CUDA kernels (the .cu files beside this): the
 * boundary macros that turn CUDA and cuBLAS errors into flow_err_t plus a
 * diagnostic, the per-thread cuBLAS handle, size checks, the access to
 * activations of either dtype, GELU, and deterministic warp/block
 * reductions.  Never installed; compiled by nvcc as C++. */
#ifndef FLOW_CUDA_INTERNAL_H
#define FLOW_CUDA_INTERNAL_H

#include <climits>
#include <cstddef>
#include <cstdint>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <flow/error.h>
#include <flow/kernels_cuda.h>

/* cuBLAS handles and caching allocators are per device; more devices than
 * this in one process are reported as FLOW_ERR_RANGE. */
#define FLOW_CUDA_MAX_DEVICES 64

/* Internal functions shared between .cu files: not part of the ABI. */
#if defined(__GNUC__)
#define FLOW_CUDA_HIDDEN __attribute__((visibility("hidden")))
#else
#define FLOW_CUDA_HIDDEN
#endif

/* Record a failed CUDA / cuBLAS call in diag ("CUDA call failed in
 * 'flow_cuda_matmul_forward' (matmul.cu:57): cudaErrorInvalidValue: invalid
 * argument") and return FLOW_ERR_DEVICE. */
FLOW_CUDA_HIDDEN flow_err_t flow_cuda__fail(flow_diag_t *diag, cudaError_t e,
					    const char *func, const char *file,
					    int line);
FLOW_CUDA_HIDDEN flow_err_t flow_cuda__fail_cublas(flow_diag_t *diag,
						   cublasStatus_t s,
						   const char *func,
						   const char *file, int line);

/* FLOW_CUDA_TRY(expr, label): evaluate a cudaError_t expression; on failure
 * set `err` (a flow_err_t in scope) to FLOW_ERR_DEVICE with the CUDA error
 * name and string in `diag` (a flow_diag_t * in scope), then goto label.
 * Because of the goto, C++ requires every local of the function to be
 * declared before the first TRY. */
#define FLOW_CUDA_TRY(expr, label)                                          \
	do {                                                                \
		cudaError_t flow_cuda_e_ = (expr);                          \
		if (flow_cuda_e_ != cudaSuccess) {                          \
			err = flow_cuda__fail(diag, flow_cuda_e_, __func__,  \
					      __FILE__, __LINE__);          \
			goto label;                                         \
		}                                                           \
	} while (0)

/* As FLOW_CUDA_TRY for a cublasStatus_t expression. */
#define FLOW_CUBLAS_TRY(expr, label)                                        \
	do {                                                                \
		cublasStatus_t flow_cublas_s_ = (expr);                     \
		if (flow_cublas_s_ != CUBLAS_STATUS_SUCCESS) {              \
			err = flow_cuda__fail_cublas(diag, flow_cublas_s_,   \
						     __func__, __FILE__,    \
						     __LINE__);             \
			goto label;                                         \
		}                                                           \
	} while (0)

/* After a <<<...>>> launch: report a bad launch configuration at once. */
#define FLOW_CUDA_LAUNCH_TRY(label) FLOW_CUDA_TRY(cudaGetLastError(), label)

/* Any flow_err_t-returning step: keep its error and goto label. */
#define FLOW_TRY(expr, label)                                               \
	do {                                                                \
		err = (expr);                                               \
		if (err != FLOW_OK)                                         \
			goto label;                                         \
	} while (0)

/* The calling thread's cuBLAS handle for its current device, created on
 * first use (math mode CUBLAS_DEFAULT_MATH with
 * CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, host pointer mode),
 * bound to stream. */
FLOW_CUDA_HIDDEN flow_err_t flow_cuda__cublas(cublasHandle_t *handle_out,
					      cudaStream_t stream,
					      flow_diag_t *diag);

/* The calling thread's cuBLASLt handle for its current device and the
 * workspace its matmuls may use (FLOW_CUDA_LT_WORKSPACE bytes of device
 * memory), both created on first use and released with the cuBLAS
 * handles (flow_cuda_release_thread), for a matmul on stream.  One
 * workspace serves all the thread's streams: when the last matmul that
 * used it ran on another stream, stream first waits for it.  Call
 * flow_cuda__cublaslt_used(stream) after enqueueing the matmul. */
#define FLOW_CUDA_LT_WORKSPACE ((size_t)32 << 20)
FLOW_CUDA_HIDDEN flow_err_t flow_cuda__cublaslt(cublasLtHandle_t *handle_out,
						void **workspace_out,
						cudaStream_t stream,
						flow_diag_t *diag);
FLOW_CUDA_HIDDEN flow_err_t flow_cuda__cublaslt_used(cudaStream_t stream,
						     flow_diag_t *diag);

/* The calling thread's copy stream for its current device (non-blocking),
 * created on first use and destroyed by flow_cuda_release_thread: the
 * storage's copy_in_ahead runs on it. */
FLOW_CUDA_HIDDEN flow_err_t flow_cuda__copy_stream(cudaStream_t *stream_out,
						   flow_diag_t *diag);

/* Forget the calling thread's cuBLASLt picks (matmul.cu): their handles
 * are going, and a new handle may get an old one's address. */
FLOW_CUDA_HIDDEN void flow_cuda__lt_picks_forget(void);
/* Free the calling thread's state of the kernel table (table.cu): the
 * device double sum_squares reduces into. */
FLOW_CUDA_HIDDEN void flow_cuda__table_release_thread(void);

/* cudaEventRecord as a flow_err_t. */
FLOW_CUDA_HIDDEN flow_err_t flow_cuda__event_record(cudaEvent_t event,
						    flow_diag_t *diag,
						    cudaStream_t stream);

/* FLOW_ERR_RANGE unless value <= limit; `what` names the size in the
 * message ("size 'n' = 3000000000 of 'flow_cuda_x' exceeds 2147483647"). */
FLOW_CUDA_HIDDEN flow_err_t flow_cuda__check_size(flow_diag_t *diag,
						  const char *func,
						  const char *what,
						  size_t value, size_t limit);

/* Offsets of the parts of a scratch are rounded up to this, so that every
 * part is aligned as the tensor-core kernels want. */
#define FLOW_CUDA_SCRATCH_ALIGN ((size_t)256)

static inline size_t flow_cuda__scratch_align(size_t bytes)
{
	return (bytes + FLOW_CUDA_SCRATCH_ALIGN - 1) / FLOW_CUDA_SCRATCH_ALIGN *
	       FLOW_CUDA_SCRATCH_ALIGN;
}

/* ---- bf16 activations (flow/kernels.h, "bf16 activations") --------------- */
/* The API's flow_bf16_t holds the bits of CUDA's __nv_bfloat16. */
static inline __nv_bfloat16 *flow_cuda__bf16(flow_bf16_t *p)
{
	return reinterpret_cast<__nv_bfloat16 *>(p);
}

static inline const __nv_bfloat16 *flow_cuda__bf16(const flow_bf16_t *p)
{
	return reinterpret_cast<const __nv_bfloat16 *>(p);
}

/* A kernel and its bf16 twin are one template over the element type of
 * the operands the twin stores in bf16 (float or __nv_bfloat16), reached
 * through these: a load widens exactly, a store rounds once to nearest
 * even (as the host's flow_bf16_narrow), and an accumulation reads, adds
 * in fp32 and rounds once. */
__device__ __forceinline__ float flow_load(const float *p)
{
	return *p;
}

__device__ __forceinline__ float flow_load(const __nv_bfloat16 *p)
{
	return __bfloat162float(*p);
}

__device__ __forceinline__ void flow_store(float *p, float v)
{
	*p = v;
}

__device__ __forceinline__ void flow_store(__nv_bfloat16 *p, float v)
{
	*p = __float2bfloat16_rn(v);
}

template <typename T>
__device__ __forceinline__ void flow_accumulate(T *p, float v)
{
	flow_store(p, flow_load(p) + v);
}

/* ---- GELU, tanh approximation (PyTorch approximate='tanh') --------------- */
/* The value and the slope, shared by gelu.cu and the bf16 GEMM's own
 * epilogue (matmul.cu); tanhf, not a fast intrinsic, for accuracy. */
#define FLOW_GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define FLOW_GELU_COEF 0.044715f

__device__ __forceinline__ float flow_gelu(float x)
{
	const float cube = FLOW_GELU_COEF * x * x * x;
	return 0.5f * x * (1.0f + tanhf(FLOW_GELU_SCALE * (x + cube)));
}

__device__ __forceinline__ float flow_gelu_slope(float x)
{
	const float cube = FLOW_GELU_COEF * x * x * x;
	const float tanh_out = tanhf(FLOW_GELU_SCALE * (x + cube));
	const float sech2 = 1.0f - tanh_out * tanh_out;
	return 0.5f * (1.0f + tanh_out) +
	       x * 0.5f * sech2 * FLOW_GELU_SCALE *
		       (1.0f + 3.0f * FLOW_GELU_COEF * x * x);
}

/* ---- launch geometry ----------------------------------------------------- */

static inline size_t flow_cuda__ceil_div(size_t a, size_t b)
{
	return (a + b - 1) / b;
}

/* Blocks for a grid-stride loop over `work` items at `per_block` items per
 * block, capped so gridDim.x stays well inside its limit.  The cap does not
 * affect results: grid-stride loops of element-wise kernels are
 * order-independent, and reductions never use this helper. */
static inline unsigned flow_cuda__grid(size_t work, size_t per_block)
{
	size_t blocks = flow_cuda__ceil_div(work, per_block);
	const size_t cap = (size_t)1 << 20;
	if (blocks > cap)
		blocks = cap;
	if (blocks == 0)
		blocks = 1;
	return (unsigned)blocks;
}

/* ---- deterministic reductions -------------------------------------------- */
/* The xor butterfly combines the same operands in the same order on every
 * lane (a + b == b + a in IEEE arithmetic), so every lane ends with the
 * bitwise same total, run after run. */

__device__ __forceinline__ float flow_warp_sum(float v)
{
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	return v;
}

__device__ __forceinline__ double flow_warp_sum_d(double v)
{
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	return v;
}

__device__ __forceinline__ float flow_warp_max(float v)
{
	for (int off = 16; off > 0; off >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
	return v;
}

/* Sum over a 1-D block whose size is a multiple of 32 (at most 1024); every
 * thread receives the total.  shared must hold 32 values.  Fixed order:
 * each warp's butterfly, then warp 0 over the warp totals in warp order. */
template <typename F>
__device__ __forceinline__ F flow_block_sum(F v, F *shared)
{
	const int lane = threadIdx.x & 31;
	const int warp = threadIdx.x >> 5;
	const int nwarps = blockDim.x >> 5;
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	__syncthreads(); /* shared may still be read by a previous call */
	if (lane == 0)
		shared[warp] = v;
	__syncthreads();
	v = lane < nwarps ? shared[lane] : (F)0;
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	return v;
}

/* As flow_block_sum for the maximum. */
__device__ __forceinline__ float flow_block_max(float v, float *shared)
{
	const int lane = threadIdx.x & 31;
	const int warp = threadIdx.x >> 5;
	const int nwarps = blockDim.x >> 5;
	v = flow_warp_max(v);
	__syncthreads();
	if (lane == 0)
		shared[warp] = v;
	__syncthreads();
	v = lane < nwarps ? shared[lane] : -INFINITY;
	return flow_warp_max(v);
}

#endif
