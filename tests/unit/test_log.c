/* Logging levels, rank filtering, prefixes and the settable sink. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <flow/error.h>
#include <flow/log.h>

static char captured[8][256];
static int ncaptured;

static void capture(flow_log_level_t level, const char *line, void *ud)
{
	(void)level;
	(void)ud;
	if (ncaptured < 8)
		snprintf(captured[ncaptured++], sizeof(captured[0]), "%s", line);
}

static int setup(void **state)
{
	(void)state;
	ncaptured = 0;
	flow_log_set_callback(capture, NULL);
	flow_log_set_level(FLOW_LOG_WARN);
	flow_log_set_rank(-1);
	flow_log_set_prog("flow-test");
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	flow_log_set_callback(NULL, NULL);
	return 0;
}

static void test_log_default_level_is_warn(void **state)
{
	(void)state;
	flow_log(FLOW_LOG_INFO, "hidden");
	flow_log(FLOW_LOG_WARN, "shown %d", 1);
	flow_log(FLOW_LOG_ERROR, "cannot open 'x'");
	assert_int_equal(ncaptured, 2);
	assert_string_equal(captured[0], "flow-test: warning: shown 1");
	assert_string_equal(captured[1], "flow-test: cannot open 'x'");
}

static void test_log_other_ranks_are_prefixed_and_quiet(void **state)
{
	(void)state;
	flow_log_set_level(FLOW_LOG_DEBUG);
	flow_log_set_rank(3);
	flow_log(FLOW_LOG_INFO, "progress");
	flow_log(FLOW_LOG_WARN, "slow link");
	assert_int_equal(ncaptured, 1);
	assert_string_equal(captured[0], "[rank 3] flow-test: warning: slow link");
	flow_log_set_rank(0);
	flow_log(FLOW_LOG_INFO, "progress");
	assert_int_equal(ncaptured, 2);
	assert_string_equal(captured[1], "flow-test: progress");
}

static void test_log_level_parse_accepts_names_and_numbers(void **state)
{
	(void)state;
	flow_log_level_t level;
	assert_int_equal(flow_log_level_parse("debug", &level), FLOW_OK);
	assert_int_equal(level, FLOW_LOG_DEBUG);
	assert_int_equal(flow_log_level_parse("TRACE", &level), FLOW_OK);
	assert_int_equal(level, FLOW_LOG_TRACE);
	assert_int_equal(flow_log_level_parse("0", &level), FLOW_OK);
	assert_int_equal(level, FLOW_LOG_OFF);
	assert_int_equal(flow_log_level_parse("6", &level), FLOW_ERR_USAGE);
	assert_int_equal(flow_log_level_parse("loud", &level), FLOW_ERR_USAGE);
}

static void test_log_level_from_env(void **state)
{
	(void)state;
	setenv("FLOW_LOG_LEVEL", "info", 1);
	assert_int_equal(flow_log_level_from_env(), FLOW_OK);
	assert_int_equal(flow_log_get_level(), FLOW_LOG_INFO);
	setenv("FLOW_LOG_LEVEL", "nonsense", 1);
	assert_int_equal(flow_log_level_from_env(), FLOW_ERR_USAGE);
	assert_int_equal(flow_log_get_level(), FLOW_LOG_INFO);
	unsetenv("FLOW_LOG_LEVEL");
	assert_int_equal(flow_log_level_from_env(), FLOW_OK);
}

static void test_log_off_silences_errors(void **state)
{
	(void)state;
	flow_log_set_level(FLOW_LOG_OFF);
	flow_log(FLOW_LOG_ERROR, "x");
	assert_int_equal(ncaptured, 0);
	assert_false(flow_log_enabled(FLOW_LOG_ERROR));
}

static void say(const char *prog, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flow_log_say(prog, fmt, ap);
	va_end(ap);
}

/* A program's last line: "prog: message", whole, in one write, whatever
 * the level (even off). */
static void test_log_say_writes_one_line_whatever_the_level(void **state)
{
	(void)state;
	int fd[2], saved = dup(STDERR_FILENO);
	char got[256] = { 0 };
	assert_int_equal(pipe(fd), 0);
	flow_log_set_level(FLOW_LOG_OFF);
	fflush(stderr);
	assert_true(dup2(fd[1], STDERR_FILENO) >= 0);
	say("flow-x", "rank %d (%s): peer rank %d died", 3, "node2", 5);
	fflush(stderr);
	assert_true(dup2(saved, STDERR_FILENO) >= 0);
	close(fd[1]);
	close(saved);
	/* The whole line and nothing else (one write: see log.c). */
	assert_true(read(fd[0], got, sizeof got - 1) > 0);
	close(fd[0]);
	assert_string_equal(got, "flow-x: rank 3 (node2): peer rank 5 died\n");
	flow_log_set_level(FLOW_LOG_WARN);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_log_default_level_is_warn, setup, teardown),
		cmocka_unit_test_setup_teardown(test_log_other_ranks_are_prefixed_and_quiet, setup, teardown),
		cmocka_unit_test_setup_teardown(test_log_level_parse_accepts_names_and_numbers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_log_level_from_env, setup, teardown),
		cmocka_unit_test_setup_teardown(test_log_off_silences_errors, setup, teardown),
		cmocka_unit_test(test_log_say_writes_one_line_whatever_the_level),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
