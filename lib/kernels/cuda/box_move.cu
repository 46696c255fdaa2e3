/* A region of one boxed piece into another on the GPU (flow/kernels.h,
 * box_move): what the boxing executor packs, unpacks and slices device
 * pieces with.  Mirrors flow_boxing_move_region, which the host sets use.
 *
 * One thread per element of the region: its row-major coordinates in the
 * region give its offsets in the two layouts, with strides worked out once
 * on the host.  Copies move the element's bytes; adds add as the host
 * does (integers wrap, bf16 and f16 through f32, rounded to nearest
 * even), so both executors give the same bits. */
#include <config.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_internal.h"

namespace {

/* The region's extents and, per dimension, the element strides of the
 * source and destination layouts; the offsets of its first element. */
struct move_geometry {
	int ndim;
	int64_t extent[FLOW_MAX_DIMS];
	int64_t src_stride[FLOW_MAX_DIMS];
	int64_t dst_stride[FLOW_MAX_DIMS];
	int64_t src_offset, dst_offset, numel;
};

/* Row-major strides of box's layout, and the offset of region's first
 * element in it. */
void layout(const flow_box_t *box, const flow_box_t *region, int64_t *stride,
	    int64_t *offset)
{
	int64_t s = 1;
	*offset = 0;
	for (int d = box->ndim - 1; d >= 0; d--) {
		stride[d] = s;
		*offset += (region->start[d] - box->start[d]) * s;
		s *= box->extent[d];
	}
}

struct copy_op {
	template <typename T> __device__ void operator()(T *d, const T *s) const
	{
		*d = *s;
	}
};

/* Integers as unsigned, so a sum wraps as two's complement hardware adds. */
struct add_op {
	__device__ void operator()(float *d, const float *s) const
	{
		*d += *s;
	}
	__device__ void operator()(__nv_bfloat16 *d, const __nv_bfloat16 *s) const
	{
		*d = __float2bfloat16_rn(__bfloat162float(*d) +
					 __bfloat162float(*s));
	}
	__device__ void operator()(__half *d, const __half *s) const
	{
		*d = __float2half_rn(__half2float(*d) + __half2float(*s));
	}
	template <typename T> __device__ void operator()(T *d, const T *s) const
	{
		*d = (T)(*d + *s);
	}
};

template <typename T, typename Op>
__global__ void box_move_kernel(T *__restrict__ dst, const T *__restrict__ src,
				move_geometry g, Op op)
{
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < g.numel; i += stride) {
		int64_t rest = i, so = g.src_offset, dof = g.dst_offset;
		for (int d = g.ndim - 1; d >= 0; d--) {
			const int64_t c = rest % g.extent[d];
			rest /= g.extent[d];
			so += c * g.src_stride[d];
			dof += c * g.dst_stride[d];
		}
		op(dst + dof, src + so);
	}
}

#define MOVE_THREADS 256

template <typename T, typename Op>
cudaError_t launch(void *dst, const void *src, const move_geometry &g, Op op,
		   cudaStream_t stream)
{
	box_move_kernel<T, Op>
		<<<flow_cuda__grid((size_t)g.numel, MOVE_THREADS * 4),
		   MOVE_THREADS, 0, stream>>>((T *)dst, (const T *)src, g, op);
	return cudaGetLastError();
}

} /* namespace */

flow_err_t flow_cuda_box_move(flow_dtype_t dtype, const void *src,
			      const flow_box_t *src_box, void *dst,
			      const flow_box_t *dst_box,
			      const flow_box_t *region, bool add,
			      flow_diag_t *diag, cudaStream_t stream)
{
	flow_err_t err = FLOW_OK;
	cudaError_t e = cudaSuccess;
	move_geometry g = {};
	const size_t esize = flow_dtype_size(dtype);

	g.ndim = region->ndim;
	g.numel = 1;
	for (int d = 0; d < region->ndim; d++) {
		g.extent[d] = region->extent[d];
		g.numel *= region->extent[d];
	}
	if (g.numel == 0)
		return FLOW_OK;
	layout(src_box, region, g.src_stride, &g.src_offset);
	layout(dst_box, region, g.dst_stride, &g.dst_offset);
	if (!add) {
		switch (esize) {
		case 1: e = launch<uint8_t>(dst, src, g, copy_op(), stream); break;
		case 2: e = launch<uint16_t>(dst, src, g, copy_op(), stream); break;
		case 4: e = launch<uint32_t>(dst, src, g, copy_op(), stream); break;
		case 8: e = launch<uint64_t>(dst, src, g, copy_op(), stream); break;
		default: goto unknown;
		}
	} else {
		switch (dtype) {
		case FLOW_DTYPE_F32: e = launch<float>(dst, src, g, add_op(), stream); break;
		case FLOW_DTYPE_BF16: e = launch<__nv_bfloat16>(dst, src, g, add_op(), stream); break;
		case FLOW_DTYPE_F16: e = launch<__half>(dst, src, g, add_op(), stream); break;
		case FLOW_DTYPE_I32:
		case FLOW_DTYPE_U32: e = launch<uint32_t>(dst, src, g, add_op(), stream); break;
		case FLOW_DTYPE_I64: e = launch<uint64_t>(dst, src, g, add_op(), stream); break;
		case FLOW_DTYPE_U16: e = launch<uint16_t>(dst, src, g, add_op(), stream); break;
		case FLOW_DTYPE_U8: e = launch<uint8_t>(dst, src, g, add_op(), stream); break;
		default: goto unknown;
		}
	}
	FLOW_CUDA_TRY(e, out);
out:
	return err;
unknown:
	return flow_diag_set(diag, FLOW_ERR_USAGE, "%s: unknown dtype %d",
			     __func__, (int)dtype);
}
