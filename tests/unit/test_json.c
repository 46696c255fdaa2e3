/* The JSON string writer (flow/json.h): what it escapes, what it passes
 * through, and that a failed write says so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include <flow/json.h>

/* What flow_json_write_string writes for s (free it). */
static char *written(const char *s)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	assert_true(flow_json_write_string(f, s));
	assert_int_equal(fclose(f), 0);
	return buf;
}

static void expect(const char *s, const char *json)
{
	char *got = written(s);

	assert_string_equal(got, json);
	free(got);
}

static void test_json_string_escapes_quotes_backslashes_and_controls(void **state)
{
	(void)state;
	expect("", "\"\"");
	expect("plain text", "\"plain text\"");
	expect("a\"b\\c\n", "\"a\\\"b\\\\c\\u000a\"");
	expect("\r\t\x1b\x01\x1f", "\"\\u000d\\u0009\\u001b\\u0001\\u001f\"");
	/* DEL and UTF-8 bytes are valid in a JSON string as they are. */
	expect("\x7f", "\"\x7f\"");
	expect("caf\xc3\xa9 \xe2\x86\x92", "\"caf\xc3\xa9 \xe2\x86\x92\"");
	expect("data/shard-00001.bin", "\"data/shard-00001.bin\"");
}

static void test_json_string_reports_a_failed_write(void **state)
{
	(void)state;
	FILE *f = fopen("/dev/full", "w");

	if (!f)
		skip();
	setvbuf(f, NULL, _IONBF, 0); /* so the write itself fails */
	assert_false(flow_json_write_string(f, "no room"));
	assert_true(ferror(f));
	fclose(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_json_string_escapes_quotes_backslashes_and_controls),
		cmocka_unit_test(test_json_string_reports_a_failed_write),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
