/* Strict number parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <flow/parse.h>

static void test_parse_int_accepts_whole_numbers_in_range(void **state)
{
	(void)state;
	int64_t v;
	assert_int_equal(flow_parse_int("42", 0, 100, &v, NULL), FLOW_OK);
	assert_int_equal(v, 42);
	assert_int_equal(flow_parse_int("-7", -10, 10, &v, NULL), FLOW_OK);
	assert_int_equal(v, -7);
	assert_int_equal(flow_parse_int("9223372036854775807", 0, INT64_MAX, &v, NULL), FLOW_OK);
	assert_int_equal(v, INT64_MAX);
}

static void test_parse_int_rejects_garbage_and_range(void **state)
{
	(void)state;
	int64_t v = 5;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_parse_int("12x", 0, 100, &v, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "invalid integer '12x'");
	assert_int_equal(flow_parse_int("", 0, 100, &v, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_int(" 1", 0, 100, &v, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_int("101", 0, 100, &v, NULL), FLOW_ERR_RANGE);
	assert_int_equal(flow_parse_int("99999999999999999999", 0, INT64_MAX, &v, NULL), FLOW_ERR_RANGE);
	assert_int_equal(v, 5); /* untouched on failure */
}

static void test_parse_size_suffixes_are_binary(void **state)
{
	(void)state;
	uint64_t v;
	assert_int_equal(flow_parse_size("64", &v, NULL), FLOW_OK);
	assert_int_equal(v, 64);
	assert_int_equal(flow_parse_size("4K", &v, NULL), FLOW_OK);
	assert_int_equal(v, 4096);
	assert_int_equal(flow_parse_size("2MiB", &v, NULL), FLOW_OK);
	assert_int_equal(v, 2u << 20);
	assert_int_equal(flow_parse_size("3g", &v, NULL), FLOW_OK);
	assert_int_equal(v, 3ull << 30);
	assert_int_equal(flow_parse_size("1T", &v, NULL), FLOW_OK);
	assert_int_equal(v, 1ull << 40);
}

static void test_parse_size_rejects_fractions_signs_and_overflow(void **state)
{
	(void)state;
	uint64_t v;
	assert_int_equal(flow_parse_size("1.5M", &v, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_size("-1", &v, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_size("4Q", &v, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_size("", &v, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_size("99999999999T", &v, NULL), FLOW_ERR_RANGE);
}

static void test_parse_double(void **state)
{
	(void)state;
	double v;
	assert_int_equal(flow_parse_double("6e-4", 0, 1, &v, NULL), FLOW_OK);
	assert_true(v == 6e-4);
	assert_int_equal(flow_parse_double("1.5x", 0, 10, &v, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_double("nan", 0, 10, &v, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_double("inf", 0, 10, &v, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_double("11", 0, 10, &v, NULL), FLOW_ERR_RANGE);
}

static void test_parse_dims(void **state)
{
	(void)state;
	uint64_t d[4];
	size_t n;
	assert_int_equal(flow_parse_dims("256,768,2304", 4, d, &n, NULL), FLOW_OK);
	assert_int_equal(n, 3);
	assert_int_equal(d[2], 2304);
	assert_int_equal(flow_parse_dims("2x4", 4, d, &n, NULL), FLOW_OK);
	assert_int_equal(n, 2);
	assert_int_equal(d[1], 4);
	assert_int_equal(flow_parse_dims("2,,4", 4, d, &n, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_dims("2,0", 4, d, &n, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_dims("2,", 4, d, &n, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_parse_dims("1,2,3,4,5", 4, d, &n, NULL), FLOW_ERR_USAGE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_int_accepts_whole_numbers_in_range),
		cmocka_unit_test(test_parse_int_rejects_garbage_and_range),
		cmocka_unit_test(test_parse_size_suffixes_are_binary),
		cmocka_unit_test(test_parse_size_rejects_fractions_signs_and_overflow),
		cmocka_unit_test(test_parse_double),
		cmocka_unit_test(test_parse_dims),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
