/* Token + position embedding on the GPU.  Mirrors cpu/embedding.c.
 *
 * The backward pass into wte must add the gradients of every position that
 * holds the same token.  Float atomics would make the sum depend on timing,
 * so instead the positions are stably sorted by token (CUB radix sort, which
 * is deterministic) and one thread per (token, channel) adds that token's
 * gradients in increasing position order: the same order as a sequential
 * loop over positions, so the result does not depend on the launch.  Over
 * a shard of wte's rows [row0, row0 + rows), a token outside it adds
 * nothing (flow/kernels.h). */
#include <config.h>

#include <cub/device/device_radix_sort.cuh>

#include "cuda_internal.h"

static __global__ void embedding_forward_kernel(float *__restrict__ out,
						const int32_t *__restrict__ tokens,
						const float *__restrict__ wte,
						const float *__restrict__ wpe,
						int64_t row0, size_t rows,
						size_t B, size_t T, size_t C)
{
	const size_t total = B * T * C;
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += stride) {
		const size_t bt = i / C, c = i % C, t = bt % T;
		const int64_t row = flow_embedding_row(tokens[bt], row0, rows);
		const float te = row < 0 ? 0.0f : wte[(size_t)row * C + c];
		out[i] = te + wpe[t * C + c];
	}
}

/* dwpe[t, c] += sum over b of dout[b, t, c], b in increasing order. */
static __global__ void embedding_dwpe_kernel(float *__restrict__ dwpe,
					     const float *__restrict__ dout,
					     size_t B, size_t T, size_t C)
{
	const size_t TC = T * C;
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < TC;
	     i += stride) {
		float acc = dwpe[i];
		for (size_t b = 0; b < B; b++)
			acc += dout[b * TC + i];
		dwpe[i] = acc;
	}
}

static __global__ void iota_kernel(int32_t *__restrict__ v, size_t n)
{
	const size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		v[i] = (int32_t)i;
}

/* Block x = one index i of the sorted tokens; blocks y and threads cover the
 * channels.  Only the first index of each run of equal tokens does work: it
 * walks the run (positions in increasing order, the sort being stable). */
static __global__ void embedding_dwte_kernel(float *__restrict__ dwte,
					     const float *__restrict__ dout,
					     const int32_t *__restrict__ keys,
					     const int32_t *__restrict__ pos,
					     int64_t row0, size_t rows,
					     size_t nt, size_t C)
{
	const size_t i = blockIdx.x;
	const size_t c = (size_t)blockIdx.y * blockDim.x + threadIdx.x;
	if (i >= nt || c >= C)
		return;
	const int32_t tok = keys[i];
	const int64_t row = flow_embedding_row(tok, row0, rows);
	if ((i > 0 && keys[i - 1] == tok) || row < 0)
		return;
	float *dst = dwte + (size_t)row * C + c;
	float acc = *dst;
	for (size_t j = i; j < nt && keys[j] == tok; j++)
		acc += dout[(size_t)pos[j] * C + c];
	*dst = acc;
}

#define EMB_THREADS 256
#define DWTE_THREADS 128

flow_err_t flow_cuda_embedding_forward(float *out, const int32_t *tokens,
				       const float *wte, const float *wpe,
				       int64_t row0, size_t rows, size_t B,
				       size_t T, size_t C, flow_diag_t *diag,
				       cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	const size_t total = B * T * C;

	if (total == 0)
		return FLOW_OK;
	embedding_forward_kernel<<<flow_cuda__grid(total, EMB_THREADS * 4),
				   EMB_THREADS, 0, stream>>>(out, tokens, wte,
							     wpe, row0, rows,
							     B, T, C);
	FLOW_CUDA_LAUNCH_TRY(out);
out:
	return err;
}

flow_err_t flow_cuda_embedding_backward(float *dwte, float *dwpe,
					const float *dout,
					const int32_t *tokens, int64_t row0,
					size_t rows, size_t B, size_t T,
					size_t C, flow_diag_t *diag,
					cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	const size_t nt = B * T;
	size_t sort_bytes = 0, ids_bytes = 0, total_bytes = 0;
	char *buf = NULL;
	int32_t *keys = NULL, *pos_in = NULL, *pos = NULL;
	void *sort_tmp = NULL;
	dim3 grid;
	cudaError_t free_e = cudaSuccess;

	if (nt == 0 || C == 0)
		return FLOW_OK;
	if (dwpe) {
		embedding_dwpe_kernel<<<flow_cuda__grid(T * C, EMB_THREADS),
					EMB_THREADS, 0, stream>>>(dwpe, dout, B,
								  T, C);
		FLOW_CUDA_LAUNCH_TRY(out);
	}
	if (!dwte)
		goto out;

	FLOW_TRY(flow_cuda__check_size(diag, __func__, "B*T", nt, INT_MAX),
		 out);
	FLOW_TRY(flow_cuda__check_size(diag, __func__, "C", C,
				       (size_t)65535 * DWTE_THREADS),
		 out);
	FLOW_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
			      NULL, sort_bytes, tokens, keys, pos_in, pos,
			      (int)nt, 0, 32, stream),
		      out);
	/* keys, pos_in, pos, then the sort's scratch, each 256-byte aligned. */
	ids_bytes = flow_cuda__ceil_div(nt * sizeof(int32_t), 256) * 256;
	total_bytes = 3 * ids_bytes + sort_bytes;
	FLOW_CUDA_TRY(cudaMallocAsync((void **)&buf, total_bytes, stream), out);
	keys = (int32_t *)buf;
	pos_in = (int32_t *)(buf + ids_bytes);
	pos = (int32_t *)(buf + 2 * ids_bytes);
	sort_tmp = buf + 3 * ids_bytes;

	iota_kernel<<<flow_cuda__grid(nt, EMB_THREADS), EMB_THREADS, 0,
		      stream>>>(pos_in, nt);
	FLOW_CUDA_LAUNCH_TRY(out_free);
	FLOW_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
			      sort_tmp, sort_bytes, tokens, keys, pos_in, pos,
			      (int)nt, 0, 32, stream),
		      out_free);
	grid = dim3((unsigned)nt,
		    (unsigned)flow_cuda__ceil_div(C, DWTE_THREADS));
	embedding_dwte_kernel<<<grid, DWTE_THREADS, 0, stream>>>(
		dwte, dout, keys, pos, row0, rows, nt, C);
	FLOW_CUDA_LAUNCH_TRY(out_free);
out_free:
	/* Stream-ordered: the memory is reused only after the kernels above. */
	free_e = cudaFreeAsync(buf, stream);
	if (free_e != cudaSuccess && err == FLOW_OK)
		err = flow_cuda__fail(diag, free_e, __func__, __FILE__,
				      __LINE__);
out:
	return err;
}
