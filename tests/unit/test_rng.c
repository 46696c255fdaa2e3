/* Philox 4x32-10: known answers, and values that depend only on the
 * element index, so split tensors initialise like whole ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <flow/rng.h>

/* Known-answer vectors of Random123's kat_vectors for philox4x32 with 10
 * rounds. */
static void test_rng_philox_known_answers(void **state)
{
	(void)state;
	static const struct {
		uint32_t ctr[4], key[2], out[4];
	} kat[] = {
		{ { 0, 0, 0, 0 }, { 0, 0 },
		  { 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 } },
		{ { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff },
		  { 0xffffffff, 0xffffffff },
		  { 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd } },
		{ { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 },
		  { 0xa4093822, 0x299f31d0 },
		  { 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 } },
	};
	for (size_t i = 0; i < sizeof(kat) / sizeof(kat[0]); i++) {
		uint32_t out[4];
		flow_philox4x32_10(kat[i].ctr, kat[i].key, out);
		assert_memory_equal(out, kat[i].out, sizeof(out));
	}
}

static void test_rng_slices_equal_the_whole(void **state)
{
	(void)state;
	enum { N = 10007 };
	float *whole = malloc(N * sizeof(float)), *part = malloc(N * sizeof(float));
	flow_rng_fill_normal(whole, N, 1234, flow_rng_stream_id("h.0.attn.w"), 0, 0.0f, 0.02f);
	/* Uneven pieces, as a balanced split over 3 ranks gives. */
	size_t bounds[] = { 0, 3336, 6672, N };
	for (int r = 0; r < 3; r++) {
		size_t n = bounds[r + 1] - bounds[r];
		flow_rng_fill_normal(part, n, 1234, flow_rng_stream_id("h.0.attn.w"),
				     bounds[r], 0.0f, 0.02f);
		assert_memory_equal(part, whole + bounds[r], n * sizeof(float));
	}
	flow_rng_fill_uniform(whole, N, 7, 3, 0, -1.0f, 1.0f);
	flow_rng_fill_uniform(part, 10, 7, 3, 500, -1.0f, 1.0f);
	assert_memory_equal(part, whole + 500, 10 * sizeof(float));
	free(whole);
	free(part);
}

static void test_rng_streams_and_seeds_differ(void **state)
{
	(void)state;
	assert_true(flow_rng_stream_id("wte") != flow_rng_stream_id("wpe"));
	assert_true(flow_rng_normal(1, 2, 3) != flow_rng_normal(1, 2, 4));
	assert_true(flow_rng_normal(1, 2, 3) != flow_rng_normal(1, 5, 3));
	assert_true(flow_rng_normal(1, 2, 3) != flow_rng_normal(9, 2, 3));
	/* The high halves of seed, stream and index all matter. */
	assert_true(flow_rng_uniform(1, 2, 3) != flow_rng_uniform(1ull << 40 | 1, 2, 3));
	assert_true(flow_rng_uniform(1, 2, 3) != flow_rng_uniform(1, 1ull << 40 | 2, 3));
	assert_true(flow_rng_uniform(1, 2, 3) != flow_rng_uniform(1, 2, 1ull << 40 | 3));
}

/* Moments of a million draws, within 6 standard errors. */
static void test_rng_distributions_have_the_right_moments(void **state)
{
	(void)state;
	enum { N = 1000000 };
	double s1 = 0, s2 = 0, u1 = 0, umin = 1, umax = 0;
	for (uint64_t i = 0; i < N; i++) {
		double z = flow_rng_normal(42, 7, i);
		s1 += z;
		s2 += z * z;
		double u = flow_rng_uniform(42, 7, i);
		u1 += u;
		umin = fmin(umin, u);
		umax = fmax(umax, u);
	}
	double mean = s1 / N, var = s2 / N - mean * mean;
	assert_true(fabs(mean) < 6.0 / sqrt(N));
	assert_true(fabs(var - 1.0) < 6.0 * sqrt(2.0 / N));
	assert_true(fabs(u1 / N - 0.5) < 6.0 * sqrt(1.0 / 12 / N));
	assert_true(umin >= 0.0 && umax < 1.0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rng_philox_known_answers),
		cmocka_unit_test(test_rng_slices_equal_the_whole),
		cmocka_unit_test(test_rng_streams_and_seeds_differ),
		cmocka_unit_test(test_rng_distributions_have_the_right_moments),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
