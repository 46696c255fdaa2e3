/* Error names and diagnostics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include <flow/error.h>

static void test_error_names_are_stable(void **state)
{
	(void)state;
	assert_string_equal(flow_err_name(FLOW_OK), "FLOW_OK");
	assert_string_equal(flow_err_name(FLOW_ERR_IO), "FLOW_ERR_IO");
	assert_string_equal(flow_err_name(FLOW_ERR_VERIFY), "FLOW_ERR_VERIFY");
	assert_string_equal(flow_err_name((flow_err_t)-999), "FLOW_ERR_UNKNOWN");
	assert_int_equal(FLOW_ERR_NOMEM, -1);
	assert_int_equal(FLOW_ERR_PEER, -6);
	assert_int_equal(FLOW_ERR_DEVICE, -8);
}

static void test_error_diag_first_error_wins(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_string_equal(flow_diag_message(&diag), "");
	assert_int_equal(flow_diag_set(&diag, FLOW_ERR_FORMAT, "gpt.plan:%d: bad", 12),
			 FLOW_ERR_FORMAT);
	assert_int_equal(flow_diag_set(&diag, FLOW_ERR_IO, "later"), FLOW_ERR_IO);
	assert_int_equal(diag.err, FLOW_ERR_FORMAT);
	assert_string_equal(flow_diag_message(&diag), "gpt.plan:12: bad");
	flow_diag_clear(&diag);
	assert_int_equal(diag.err, FLOW_OK);
}

static void test_error_diag_errno_appends_strerror(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_diag_errno(&diag, FLOW_ERR_IO, ENOENT, "cannot open '%s'", "x");
	char want[128];
	snprintf(want, sizeof(want), "cannot open 'x': %s", strerror(ENOENT));
	assert_string_equal(flow_diag_message(&diag), want);
}

static void test_error_diag_null_is_allowed(void **state)
{
	(void)state;
	assert_int_equal(flow_diag_set(NULL, FLOW_ERR_USAGE, "x"), FLOW_ERR_USAGE);
	flow_diag_clear(NULL);
	assert_string_equal(flow_diag_message(NULL), "");
}

static void test_error_diag_without_text_names_the_code(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_diag_set(&diag, FLOW_ERR_TIMEOUT, "%s", "");
	assert_string_equal(flow_diag_message(&diag), "FLOW_ERR_TIMEOUT");
}

static void test_error_diag_truncates_long_messages(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	char big[2048];
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	flow_diag_set(&diag, FLOW_ERR_FORMAT, "%s", big);
	assert_int_equal(strlen(diag.msg), FLOW_DIAG_MAX - 1);
}

static void test_error_escape_line_makes_one_printable_line(void **state)
{
	(void)state;
	char out[64];
	assert_string_equal(flow_escape_line(out, sizeof(out), "plain 'x'"),
			    "plain 'x'");
	assert_string_equal(flow_escape_line(out, sizeof(out), "1\r"), "1\\r");
	assert_string_equal(flow_escape_line(out, sizeof(out), "a\nb\tc"),
			    "a\\nb\\tc");
	assert_string_equal(flow_escape_line(out, sizeof(out), "\x1b[2J\x7f"),
			    "\\x1b[2J\\x7f");
	/* Valid UTF-8 stays; C1 controls, overlongs, surrogates, stray
	 * continuation bytes and cut sequences are escaped byte by byte. */
	assert_string_equal(flow_escape_line(out, sizeof(out), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
			    "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
	assert_string_equal(flow_escape_line(out, sizeof(out), "\xc2\x9b" "1m"),
			    "\\xc2\\x9b1m");
	assert_string_equal(flow_escape_line(out, sizeof(out), "\xc0\xaf\xed\xa0\x80"),
			    "\\xc0\\xaf\\xed\\xa0\\x80");
	assert_string_equal(flow_escape_line(out, sizeof(out), "\x80\xe2\x82"),
			    "\\x80\\xe2\\x82");
	/* Escaping is idempotent. */
	char twice[64];
	flow_escape_line(out, sizeof(out), "a\r\x1b\xff");
	assert_string_equal(flow_escape_line(twice, sizeof(twice), out), out);
	/* Cut before an escape, never inside one. */
	char small[5];
	assert_string_equal(flow_escape_line(small, sizeof(small), "abc\nd"),
			    "abc");
	assert_string_equal(flow_escape_line(small, sizeof(small), "ab\xc3\xa9\xc3\xa9"),
			    "ab\xc3\xa9");
}

static void test_error_diag_escapes_quoted_input(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_diag_set(&diag, FLOW_ERR_FORMAT,
		      "gpt.plan:1: unsupported plan version '%s'", "1\r");
	assert_string_equal(flow_diag_message(&diag),
			    "gpt.plan:1: unsupported plan version '1\\r'");
	flow_diag_t nested = FLOW_DIAG_INIT;
	flow_diag_set(&nested, diag.err, "%s", flow_diag_message(&diag));
	assert_string_equal(flow_diag_message(&nested),
			    flow_diag_message(&diag));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_error_names_are_stable),
		cmocka_unit_test(test_error_diag_first_error_wins),
		cmocka_unit_test(test_error_diag_errno_appends_strerror),
		cmocka_unit_test(test_error_diag_null_is_allowed),
		cmocka_unit_test(test_error_diag_without_text_names_the_code),
		cmocka_unit_test(test_error_diag_truncates_long_messages),
		cmocka_unit_test(test_error_escape_line_makes_one_printable_line),
		cmocka_unit_test(test_error_diag_escapes_quoted_input),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
