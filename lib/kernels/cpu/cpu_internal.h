/* Private helpers shared by the CPU kernels (lib/kernels/cpu/): the fixed
 * work partitions that make every reduction independent of the number of
 * OpenMP threads, vectorisable exp and tanh, and the access to activations
 * stored in either fp32 or bf16 (flow/kernels.h, "bf16 activations"). */
#ifndef FLOW_CPU_INTERNAL_H
#define FLOW_CPU_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <flow/tensor.h>

/* Column (channel) block owned by one thread in the column reductions
 * (matmul dbias, layernorm dweight/dbias, embedding dwte/dwpe): one thread
 * sums a whole column in row order, so the bits never depend on how many
 * threads share the blocks.  64 floats = 4 cache lines per row, enough to
 * vectorise and to keep the per-block accumulators in registers/L1. */
#define FLOW_CPU_COL_BLOCK 64

/* The column blocks of a row of cols columns, the last one partial. */
static inline size_t flow_cpu_col_blocks(size_t cols)
{
	return (cols + FLOW_CPU_COL_BLOCK - 1) / FLOW_CPU_COL_BLOCK;
}

/* Elements per partial sum in flow_cpu_sum_squares: the partials are summed
 * in chunk order, so the result is the same for any thread count. */
#define FLOW_CPU_SQ_CHUNK ((size_t)65536)

/* Partials held on the stack at once by flow_cpu_sum_squares (it loops over
 * groups of this many chunks, so n is unbounded without a heap buffer). */
#define FLOW_CPU_SQ_GROUP 256

/* expf for the hot loops: libm's expf is a call the vectoriser cannot
 * inline, so softmax, cross-entropy and GELU ran one element at a time.
 * Straight-line code with no branches, so a loop calling it vectorises at
 * plain -O3 (SSE2: the rounding is the 1.5*2^23 trick, not rintf).
 *
 * x = n*ln2 + r, |r| <= ln2/2, with ln2 split in two so n*FLOW_LN2_HI is
 * exact for |n| <= 2^14; e^r is its Taylor series to r^7 (truncation
 * < 6e-9 relative); 2^n is built from exponent bits in two halves so that
 * results down in the subnormals (n to -150) round once, at the last
 * multiply.  The input is clamped to [-104, 89]: beyond those expf is 0 or
 * inf anyway, and the clamped arithmetic gives exactly that (89 -> 2^128
 * overflows to inf; -104 -> below half the smallest subnormal, 0).  NaN
 * passes both comparisons and comes out NaN.  Max error vs double exp over
 * [-104, 89], every float: 1.03 ulp. */
#define FLOW_CPU_LOG2E 1.44269504088896341f
#define FLOW_CPU_LN2_HI 0.693359375f
#define FLOW_CPU_LN2_LO -2.12194440e-4f

static inline float flow_cpu_exp2i(int32_t n)
{
	uint32_t u = (uint32_t)(n + 127) << 23;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* c ? a : b on the bits, for the selects below: GCC at -O3 without
 * -ffast-math keeps a float ?: as control flow and will not vectorise it. */
static inline float flow_cpu_select(int c, float a, float b)
{
	uint32_t ua, ub, m = -(uint32_t)(c != 0), r;
	float f;

	memcpy(&ua, &a, sizeof(ua));
	memcpy(&ub, &b, sizeof(ub));
	r = (ua & m) | (ub & ~m);
	memcpy(&f, &r, sizeof(f));
	return f;
}

static inline float flow_cpu_expf(float x)
{
	const float shift = 12582912.0f; /* 1.5 * 2^23 */

	x = flow_cpu_select(x > 89.0f, 89.0f, x);
	x = flow_cpu_select(x < -104.0f, -104.0f, x);

	float nf = (x * FLOW_CPU_LOG2E + shift) - shift;
	int32_t n = (int32_t)nf;
	float r = (x - nf * FLOW_CPU_LN2_HI) - nf * FLOW_CPU_LN2_LO;

	float p = 1.0f / 5040.0f;
	p = p * r + 1.0f / 720.0f;
	p = p * r + 1.0f / 120.0f;
	p = p * r + 1.0f / 24.0f;
	p = p * r + 1.0f / 6.0f;
	p = p * r + 0.5f;
	p = 1.0f + (r + (r * r) * p);

	int32_t n1 = n / 2;
	return p * flow_cpu_exp2i(n1) * flow_cpu_exp2i(n - n1);
}

/* tanhf built on flow_cpu_expf, branch-free so it vectorises.  Near 0,
 * 1 - 2/(e^2u + 1) keeps only float's absolute precision near 1, so for
 * |u| < 0.625 the odd Taylor series to u^19 is used instead (next term
 * < 1e-8 relative there).  Both are computed and one is selected.  Max
 * error vs double tanh on [-20, 20], every float: 7.9e-8 absolute, 1.4e-7
 * relative (libm tanhf: 1.0e-7 absolute). */
static inline float flow_cpu_tanhf(float u)
{
	float a = flow_cpu_select(u < 0.0f, -u, u);
	float s = u * u;

	float p = -443861162.0f / 1856156927625.0f;
	p = p * s + 6404582.0f / 10854718875.0f;
	p = p * s - 929569.0f / 638512875.0f;
	p = p * s + 21844.0f / 6081075.0f;
	p = p * s - 1382.0f / 155925.0f;
	p = p * s + 62.0f / 2835.0f;
	p = p * s - 17.0f / 315.0f;
	p = p * s + 2.0f / 15.0f;
	p = p * s - 1.0f / 3.0f;
	float small = u + u * (s * p);

	float big = 1.0f - 2.0f / (flow_cpu_expf(2.0f * a) + 1.0f);
	big = flow_cpu_select(u < 0.0f, -big, big);

	return flow_cpu_select(a < 0.625f, small, big);
}

/* ---- activations of either dtype ------------------------------------------ */
/* A kernel and its bf16 twin share their row (or block, or element)
 * functions, written once over these: an activation pointer with a flag
 * saying whether it holds floats or bf16.  Those functions are
 * FLOW_CPU_INLINE and hold no OpenMP region: each kernel runs its own
 * parallel loop over them with a literal flag, so the branch folds away
 * and the fp32 loops vectorise as they did before there were twins.  (A
 * flag passed into a function holding the parallel loop would not fold:
 * the compiler outlines the loop's body before it inlines, and the flag
 * reaches the body as a variable.) */
#define FLOW_CPU_INLINE static inline __attribute__((always_inline))

/* Element i of x, widened to float when bf16. */
FLOW_CPU_INLINE float flow_cpu_act_load(const void *x, size_t i, bool bf16)
{
	return bf16 ? flow_bf16_widen(((const flow_bf16_t *)x)[i]) :
		      ((const float *)x)[i];
}

/* Store v as element i of x, rounded once to nearest even when bf16. */
FLOW_CPU_INLINE void flow_cpu_act_store(void *x, size_t i, float v, bool bf16)
{
	if (bf16)
		((flow_bf16_t *)x)[i] = flow_bf16_narrow(v);
	else
		((float *)x)[i] = v;
}

/* x[i] += v: in bf16, read, add in fp32, round once. */
FLOW_CPU_INLINE void flow_cpu_act_add(void *x, size_t i, float v, bool bf16)
{
	flow_cpu_act_store(x, i, flow_cpu_act_load(x, i, bf16) + v, bf16);
}

/* Rows the bf16 GEMMs and attention widen at once: out[i] = widen(in[i])
 * and out[i] = bf16(in[i]), n elements, across the OpenMP team (call
 * outside a parallel region); and x rounded to bf16 values kept as floats
 * (flow_round_bf16), in place or not: a weight, for a bf16 product. */
void flow_cpu_widen_bf16(float *out, const flow_bf16_t *in, size_t n);
void flow_cpu_narrow_bf16(flow_bf16_t *out, const float *in, size_t n);
void flow_cpu_round_bf16(float *out, const float *in, size_t n);

/* Elements of one panel of a bf16 GEMM's widened rows (64 MiB of floats):
 * large enough that a panel's sgemm runs at full speed, small beside the
 * logits. */
#define FLOW_CPU_BF16_PANEL ((size_t)1 << 24)

#endif
