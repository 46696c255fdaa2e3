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

/* A reused context writes the frames flow_zstd_compress writes, whatever
 * it compressed before (other sizes, other levels): flow_shard_write relies
 * on it for shards that are the same bytes with any number of threads. */
static void test_compress_cctx_matches_one_shot(void **state)
{
	(void)state;
	size_t n = 200000;
	unsigned char *src = malloc(n);
	uint64_t x = 1;
	for (size_t i = 0; i < n; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		src[i] = (unsigned char)(i % 5 ? (x >> 60) : (x >> 33));
	}
	size_t cap = flow_zstd_bound(n);
	unsigned char *a = malloc(cap), *b = malloc(cap);
	flow_zstd_cctx_t *cctx = NULL;
	assert_int_equal(flow_zstd_cctx_new(&cctx, NULL), FLOW_OK);
	static const size_t sizes[] = { 200000, 1, 4096, 131072, 0, 77777 };
	static const int levels[] = { 3, 1, 19, -5, 3, 9 };
	for (int round = 0; round < 2; round++)
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			size_t la, lb;
			int level = levels[(i + (size_t)round) % 6];
			assert_int_equal(flow_zstd_compress(a, cap, src, sizes[i], level,
							    &la, NULL), FLOW_OK);
			assert_int_equal(flow_zstd_cctx_compress(cctx, b, cap, src, sizes[i],
								 level, &lb, NULL), FLOW_OK);
			assert_int_equal(la, lb);
			assert_memory_equal(a, b, la);
		}
	/* Errors as flow_zstd_compress's, and the context still works. */
	flow_diag_t diag = FLOW_DIAG_INIT;
	size_t len = 12345;
	assert_int_equal(flow_zstd_cctx_compress(cctx, b, cap, src, 10, 0, &len, &diag),
			 FLOW_ERR_USAGE);
	assert_non_null(strstr(diag.msg, "invalid zstd level '0'"));
	assert_int_equal(len, 12345);
	flow_diag_clear(&diag);
	assert_int_equal(flow_zstd_cctx_compress(cctx, b, 4, src, n, 3, &len, &diag),
			 FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "zstd compression failed"));
	assert_int_equal(flow_zstd_cctx_compress(cctx, b, cap, src, n, 3, &len, NULL),
			 FLOW_OK);
	assert_int_equal(flow_zstd_decompress(a, n, b, len, NULL), FLOW_OK);
	assert_memory_equal(a, src, n);
	flow_zstd_cctx_free(cctx);
	flow_zstd_cctx_free(NULL);
	free(src);
	free(a);
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_compress_round_trip),
		cmocka_unit_test(test_compress_detects_wrong_size_and_corruption),
		cmocka_unit_test(test_compress_rejects_bad_levels),
		cmocka_unit_test(test_compress_cctx_matches_one_shot),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
