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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_error_names_are_stable),
		cmocka_unit_test(test_error_diag_first_error_wins),
		cmocka_unit_test(test_error_diag_errno_appends_strerror),
		cmocka_unit_test(test_error_diag_null_is_allowed),
		cmocka_unit_test(test_error_diag_without_text_names_the_code),
		cmocka_unit_test(test_error_diag_truncates_long_messages),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
