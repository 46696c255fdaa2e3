/* The sum kernels of the CPU collectives (lib/comm/comm_reduce.c), against
 * a scalar reference written from their contract: for every reducible
 * dtype, 1 to 6 sources, counts around the kernels' block size and the
 * two- and three-source special cases, in place and not.  Sums in f32 (and
 * f32 accumulators for bf16/f16) add in source order and round once, so
 * results are compared bit for bit; integers wrap.  The kernels are
 * private to libflow, so this test compiles them in.  The collectives
 * that call them are tested rank by rank in tests/cluster (comm_check). */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <flow/comm.h>

#include "comm/comm_internal.h"
#include "sbputil.h"

#define MAX_SOURCES 6

static const flow_dtype_t reducible[] = {
	FLOW_DTYPE_F32, FLOW_DTYPE_BF16, FLOW_DTYPE_F16, FLOW_DTYPE_I32,
	FLOW_DTYPE_I64, FLOW_DTYPE_U32,  FLOW_DTYPE_U8,
};

/* A float of any sign and a wide range of exponents: normals, now and
 * then a subnormal, a zero of either sign, an infinity or a NaN. */
static float random_float(uint64_t *s)
{
	uint64_t r = splitmix64(s);
	switch (r % 64) {
	case 0:
		return (r & 64) ? -0.0f : 0.0f;
	case 1:
		return (r & 64) ? -INFINITY : INFINITY;
	case 2:
		return NAN;
	case 3:
		return ldexpf((float)(r >> 40) / 16777216.0f, -130);
	default:
		return ldexpf((float)(r >> 40) / 16777216.0f - 0.5f,
			      (int)((r >> 8) % 40) - 20);
	}
}

static void fill(void *buf, flow_dtype_t dtype, size_t n, uint64_t *s)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t r = splitmix64(s);
		switch (dtype) {
		case FLOW_DTYPE_F32:
			((float *)buf)[i] = random_float(s);
			break;
		case FLOW_DTYPE_BF16:
			((uint16_t *)buf)[i] = flow_f32_to_bf16(random_float(s));
			break;
		case FLOW_DTYPE_F16:
			((uint16_t *)buf)[i] = flow_f32_to_f16(random_float(s));
			break;
		case FLOW_DTYPE_I32:
		case FLOW_DTYPE_U32:
			((uint32_t *)buf)[i] = (uint32_t)r;
			break;
		case FLOW_DTYPE_I64:
			((uint64_t *)buf)[i] = r;
			break;
		case FLOW_DTYPE_U8:
			((uint8_t *)buf)[i] = (uint8_t)r;
			break;
		default:
			fail();
		}
	}
}

/* Element i of the contract's sum of srcs[0..n), stored in out (an
 * element of dtype). */
static void reference_sum(const void *const *srcs, int n, size_t i,
			  flow_dtype_t dtype, void *out)
{
	switch (dtype) {
	case FLOW_DTYPE_F32: {
		float acc = ((const float *)srcs[0])[i];
		for (int k = 1; k < n; k++)
			acc += ((const float *)srcs[k])[i];
		*(float *)out = acc;
		break;
	}
	case FLOW_DTYPE_BF16:
	case FLOW_DTYPE_F16: {
		bool bf = dtype == FLOW_DTYPE_BF16;
		float acc = 0.0f;
		for (int k = 0; k < n; k++) {
			uint16_t h = ((const uint16_t *)srcs[k])[i];
			float v = bf ? flow_bf16_to_f32(h) : flow_f16_to_f32(h);
			acc = k ? acc + v : v;
		}
		*(uint16_t *)out = bf ? flow_f32_to_bf16(acc) :
					flow_f32_to_f16(acc);
		break;
	}
	case FLOW_DTYPE_I32:
	case FLOW_DTYPE_U32: {
		uint32_t acc = 0;
		for (int k = 0; k < n; k++)
			acc += ((const uint32_t *)srcs[k])[i];
		*(uint32_t *)out = acc;
		break;
	}
	case FLOW_DTYPE_I64: {
		uint64_t acc = 0;
		for (int k = 0; k < n; k++)
			acc += ((const uint64_t *)srcs[k])[i];
		*(uint64_t *)out = acc;
		break;
	}
	case FLOW_DTYPE_U8: {
		uint8_t acc = 0;
		for (int k = 0; k < n; k++)
			acc = (uint8_t)(acc + ((const uint8_t *)srcs[k])[i]);
		*(uint8_t *)out = acc;
		break;
	}
	default:
		fail();
	}
}

/* Bit for bit, but any NaN equals any NaN: the kernels keep NaNs quiet
 * without promising which payload. */
static bool same_element(const void *a, const void *b, flow_dtype_t dtype)
{
	size_t es = flow_dtype_size(dtype);
	if (memcmp(a, b, es) == 0)
		return true;
	if (dtype == FLOW_DTYPE_F32)
		return isnan(*(const float *)a) && isnan(*(const float *)b);
	if (dtype == FLOW_DTYPE_BF16 || dtype == FLOW_DTYPE_F16) {
		uint16_t x = *(const uint16_t *)a, y = *(const uint16_t *)b;
		bool bf = dtype == FLOW_DTYPE_BF16;
		float fx = bf ? flow_bf16_to_f32(x) : flow_f16_to_f32(x);
		float fy = bf ? flow_bf16_to_f32(y) : flow_f16_to_f32(y);
		return isnan(fx) && isnan(fy);
	}
	return false;
}

static void check_sums(flow_dtype_t dtype, int n, size_t count, bool in_place,
		       uint64_t *s)
{
	size_t es = flow_dtype_size(dtype);
	void *src[MAX_SOURCES], *dst = malloc(count * es + 1);
	const void *srcs[MAX_SOURCES];
	unsigned char *want = malloc(count * es + 1);

	assert_non_null(dst);
	assert_non_null(want);
	for (int k = 0; k < n; k++) {
		src[k] = malloc(count * es + 1);
		assert_non_null(src[k]);
		fill(src[k], dtype, count, s);
		srcs[k] = src[k];
	}
	for (size_t i = 0; i < count; i++)
		reference_sum(srcs, n, i, dtype, want + i * es);
	if (in_place) { /* the output is the first source */
		memcpy(dst, src[0], count * es);
		srcs[0] = dst;
	}
	flow_comm_sum_n(dst, srcs, n, count, dtype);
	for (size_t i = 0; i < count; i++)
		if (!same_element((char *)dst + i * es, want + i * es, dtype))
			fail_msg("%s, %d sources, %zu elements%s: element %zu differs",
				 flow_dtype_name(dtype), n, count,
				 in_place ? ", in place" : "", i);
	for (int k = 0; k < n; k++)
		free(src[k]);
	free(want);
	free(dst);
}

static void test_comm_reduce_sum_n_is_the_ordered_sum(void **state)
{
	(void)state;
	static const size_t counts[] = { 0, 1, 7, 511, 512, 513, 1500 };
	uint64_t s = 0x5u;

	for (size_t d = 0; d < sizeof(reducible) / sizeof(reducible[0]); d++)
		for (int n = 1; n <= MAX_SOURCES; n++)
			for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
				for (int in_place = 0; in_place < 2; in_place++)
					check_sums(reducible[d], n, counts[c],
						   in_place, &s);
}

static void test_comm_reduce_sum_into_adds_one_source(void **state)
{
	(void)state;
	float dst[3] = { 1.0f, -2.5f, 1e30f };
	const float src[3] = { 0.5f, 2.5f, 1e30f };
	uint8_t b[2] = { 250, 1 };
	const uint8_t c[2] = { 10, 2 };

	flow_comm_sum_into(dst, src, 3, FLOW_DTYPE_F32);
	assert_true(dst[0] == 1.5f);
	assert_true(dst[1] == 0.0f);
	assert_true(dst[2] == 2e30f);
	flow_comm_sum_into(b, c, 2, FLOW_DTYPE_U8);
	assert_int_equal(b[0], 4); /* wraps */
	assert_int_equal(b[1], 3);
}

static void test_comm_reduce_can_reduce_every_dtype_but_u16(void **state)
{
	(void)state;
	for (int d = 0; d < FLOW_DTYPE_COUNT; d++)
		assert_int_equal(flow_comm_can_reduce(FLOW_COMM_CPU,
						      (flow_dtype_t)d),
				 d != FLOW_DTYPE_U16);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_comm_reduce_sum_n_is_the_ordered_sum),
		cmocka_unit_test(test_comm_reduce_sum_into_adds_one_source),
		cmocka_unit_test(test_comm_reduce_can_reduce_every_dtype_but_u16),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
