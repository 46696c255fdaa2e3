/* The sum kernels of the CPU collectives.
 *
 * Each output element is computed from the inputs at the same index only,
 * so the output may be one of the inputs; the loops say so to the
 * compiler (omp simd), which then vectorises them without alias checks.
 * Two and three sources (the rings and the common small communicators)
 * have their own one-pass loops; more sources go through a small block
 * accumulator.  Signed integers add as unsigned (defined wrap-around, as
 * NCCL and MPI give in practice); bf16 and f16 accumulate in f32 and
 * round once per element. */
#include <config.h>

#include <string.h>

#include "comm_internal.h"

#define BLOCK 512

/* Unions rather than memcpy for the bit casts: gcc 12 vectorises these. */
typedef union bits32 {
	uint32_t u;
	float f;
} bits32_t;

static inline float bf16_to_f32(uint16_t h)
{
	bits32_t x = { .u = (uint32_t)h << 16 };
	return x.f;
}

/* flow_f32_to_bf16, branch-free so that the loops vectorise: round to
 * nearest even, and a NaN stays a quiet NaN. */
static inline uint16_t f32_to_bf16(float f)
{
	bits32_t x = { .f = f };
	uint32_t u = x.u;
	uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
	uint32_t nan = (u >> 16) | 0x40u;
	return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* One kernel per element type.  LOAD converts to the accumulator type,
 * STORE back; VEC is the loops' pragma, empty where a conversion is a
 * call that cannot vectorise (clang warns then). */
#define SIMD _Pragma("omp simd")
#define NO_SIMD
#define SUM_N(name, elem_t, acc_t, LOAD, STORE, VEC)                          \
	static void name(void *dst, const void *const *srcs, int n,          \
			 size_t count)                                        \
	{                                                                     \
		elem_t *d = dst;                                              \
		const elem_t *a = srcs[0], *b = n > 1 ? srcs[1] : a;          \
		if (n == 1) {                                                 \
			if (d != a)                                           \
				memmove(d, a, count * sizeof *d);             \
			return;                                               \
		}                                                             \
		if (n == 2) {                                                 \
			VEC                                                   \
			for (size_t i = 0; i < count; i++)                    \
				d[i] = STORE((acc_t)(LOAD(a[i]) + LOAD(b[i])));  \
			return;                                               \
		}                                                             \
		if (n == 3) {                                                 \
			const elem_t *c = srcs[2];                            \
			VEC                                                   \
			for (size_t i = 0; i < count; i++)                    \
				d[i] = STORE((acc_t)(LOAD(a[i]) + LOAD(b[i]) +    \
						     LOAD(c[i])));            \
			return;                                               \
		}                                                             \
		acc_t acc[BLOCK];                                             \
		for (size_t base = 0; base < count; base += BLOCK) {         \
			size_t m = count - base < BLOCK ? count - base : BLOCK; \
			const elem_t *s = a + base;                           \
			for (size_t i = 0; i < m; i++)                        \
				acc[i] = LOAD(s[i]);                          \
			for (int k = 1; k < n; k++) {                         \
				s = (const elem_t *)srcs[k] + base;           \
				VEC                                           \
				for (size_t i = 0; i < m; i++)                \
					acc[i] += LOAD(s[i]);                 \
			}                                                     \
			VEC                                                   \
			for (size_t i = 0; i < m; i++)                        \
				d[base + i] = STORE(acc[i]);                  \
		}                                                             \
	}

#define AS_IS(x) (x)
#define TO_U32(x) ((uint32_t)(x))
#define TO_I32(x) ((int32_t)(x))
#define TO_U64(x) ((uint64_t)(x))
#define TO_I64(x) ((int64_t)(x))
#define TO_U8(x) ((uint8_t)(x))
#define F16_LOAD(x) flow_f16_to_f32(x)
#define F16_STORE(x) flow_f32_to_f16(x)

SUM_N(sum_f32, float, float, AS_IS, AS_IS, SIMD)
SUM_N(sum_bf16, uint16_t, float, bf16_to_f32, f32_to_bf16, SIMD)
SUM_N(sum_f16, uint16_t, float, F16_LOAD, F16_STORE, NO_SIMD)
SUM_N(sum_i32, int32_t, uint32_t, TO_U32, TO_I32, SIMD)
SUM_N(sum_i64, int64_t, uint64_t, TO_U64, TO_I64, SIMD)
SUM_N(sum_u32, uint32_t, uint32_t, AS_IS, AS_IS, SIMD)
SUM_N(sum_u8, uint8_t, uint32_t, AS_IS, TO_U8, SIMD)

void flow_comm_sum_n(void *dst, const void *const *srcs, int n, size_t count,
		     flow_dtype_t dtype)
{
	switch (dtype) {
	case FLOW_DTYPE_F32: sum_f32(dst, srcs, n, count); break;
	case FLOW_DTYPE_BF16: sum_bf16(dst, srcs, n, count); break;
	case FLOW_DTYPE_F16: sum_f16(dst, srcs, n, count); break;
	case FLOW_DTYPE_I32: sum_i32(dst, srcs, n, count); break;
	case FLOW_DTYPE_I64: sum_i64(dst, srcs, n, count); break;
	case FLOW_DTYPE_U32: sum_u32(dst, srcs, n, count); break;
	case FLOW_DTYPE_U8: sum_u8(dst, srcs, n, count); break;
	default: break; /* flow_comm_can_reduce refused it earlier */
	}
}

void flow_comm_sum_into(void *dst, const void *src, size_t count,
			flow_dtype_t dtype)
{
	const void *srcs[2] = { dst, src };
	flow_comm_sum_n(dst, srcs, 2, count, dtype);
}

bool flow_comm_can_reduce(flow_comm_backend_t backend, flow_dtype_t dtype)
{
	switch (dtype) {
	case FLOW_DTYPE_F32:
	case FLOW_DTYPE_BF16:
	case FLOW_DTYPE_F16:
	case FLOW_DTYPE_I32:
	case FLOW_DTYPE_I64:
	case FLOW_DTYPE_U8:
	case FLOW_DTYPE_U32:
		return true;
	case FLOW_DTYPE_U16: /* neither NCCL nor the CPU kernels have it */
	default:
		(void)backend;
		return false;
	}
}
