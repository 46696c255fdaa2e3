/* zstd frames: round trip, size checks, corruption detected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <flow/compress.h>

static void test_compress_round_trip(void **state)
{
	(void)state;
	size_t n = 100000;
	unsigned char *src = malloc(n), *back = malloc(n);
	for (size_t i = 0; i < n; i++)
		src[i] = (unsigned char)((i / 7) % 251);
	size_t cap = flow_zstd_bound(n), len;
	unsigned char *dst = malloc(cap);
	assert_int_equal(flow_zstd_compress(dst, cap, src, n, 3, &len, NULL), FLOW_OK);
	assert_true(len < n / 4); /* a period-1757 pattern: zstd finds it */
	uint64_t content;
	assert_int_equal(flow_zstd_frame_content_size(dst, len, &content, NULL), FLOW_OK);
	assert_int_equal(content, n);
	assert_int_equal(flow_zstd_decompress(back, n, dst, len, NULL), FLOW_OK);
	assert_memory_equal(src, back, n);
	free(src);
	free(back);
	free(dst);
}

static void test_compress_detects_wrong_size_and_corruption(void **state)
{
	(void)state;
	char src[4096], back[4096], dst[8192];
	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (char)(i * 37);
	size_t len;
	assert_int_equal(flow_zstd_compress(dst, sizeof(dst), src, sizeof(src), 1, &len, NULL), FLOW_OK);
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_zstd_decompress(back, 100, dst, len, &diag), FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg, "zstd frame holds 4096 bytes, expected 100");
	assert_int_equal(flow_zstd_decompress(back, sizeof(back), "garbage!", 8, NULL),
			 FLOW_ERR_FORMAT);
	assert_int_equal(flow_zstd_decompress(back, sizeof(back), dst, len - 3, NULL),
			 FLOW_ERR_FORMAT);
}

static void test_compress_rejects_bad_levels(void **state)
{
	(void)state;
	char dst[64];
	size_t len;
	assert_int_equal(flow_zstd_compress(dst, sizeof(dst), "x", 1, 0, &len, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_zstd_compress(dst, sizeof(dst), "x", 1, flow_zstd_max_level() + 1, &len, NULL),
			 FLOW_ERR_USAGE);
	assert_true(flow_zstd_min_level() < 0);
	assert_int_equal(flow_zstd_compress(dst, sizeof(dst), "x", 1, -1, &len, NULL), FLOW_OK);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_compress_round_trip),
		cmocka_unit_test(test_compress_detects_wrong_size_and_corruption),
		cmocka_unit_test(test_compress_rejects_bad_levels),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
