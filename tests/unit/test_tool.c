/* The shared program plumbing: exit codes, the error grammar, strict option
 * values and the stdout check.  Functions that exit run in a child. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../bin/tool.h"

typedef void (*child_fn)(void);

/* Run fn in a child with stdout and stderr captured; return its exit
 * status, or 1000 + signal. */
static int run_child(child_fn fn, char *out, size_t out_cap, char *err,
		     size_t err_cap)
{
	int po[2], pe[2];
	assert_int_equal(pipe(po), 0);
	assert_int_equal(pipe(pe), 0);
	fflush(stdout);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(pe[0]);
		fn();
		_exit(99);
	}
	close(po[1]);
	close(pe[1]);
	ssize_t n = read(po[0], out, out_cap - 1);
	out[n > 0 ? n : 0] = '\0';
	n = read(pe[0], err, err_cap - 1);
	err[n > 0 ? n : 0] = '\0';
	close(po[0]);
	close(pe[0]);
	int status;
	waitpid(pid, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
}

static flow_tool_t tool;

static void usage_error_child(void)
{
	flow_tool_init(&tool, "flow-test", "usage: flow-test\n", 0);
	flow_tool_usage_error(&tool, "unknown kernel '%s'", "matmull");
}

static void bad_int_child(void)
{
	flow_tool_init(&tool, "flow-test", "usage\n", 0);
	flow_tool_int(&tool, "--iters", "10x", 1, 100);
	_exit(0);
}

static void help_child(void)
{
	flow_tool_init(&tool, "flow-test", "usage: flow-test [options]\n", 0);
	char *argv[] = { "flow-test", NULL };
	flow_tool_common_option(&tool, 'h', argv);
}

static void version_child(void)
{
	flow_tool_init(&tool, "flow-test", "usage\n", 0);
	char *argv[] = { "flow-test", NULL };
	flow_tool_common_option(&tool, FLOW_OPT_VERSION, argv);
}

static void unknown_option_child(void)
{
	flow_tool_init(&tool, "flow-test", "usage\n", 0);
	char *argv[] = { "flow-test", "--bogus", NULL };
	static const struct option opts[] = { FLOW_COMMON_OPTIONS, { 0 } };
	int opt = getopt_long(2, argv, FLOW_COMMON_SHORT_OPTIONS, opts, NULL);
	flow_tool_common_option(&tool, opt, argv);
	_exit(0);
}

static void bad_env_child(void)
{
	setenv("FLOW_LOG_LEVEL", "loud", 1);
	flow_tool_init(&tool, "flow-test", "usage\n", 0);
	_exit(0);
}

static void test_tool_usage_error_exits_2_with_hint(void **state)
{
	(void)state;
	char out[512], err[512];
	assert_int_equal(run_child(usage_error_child, out, sizeof(out), err, sizeof(err)), 2);
	assert_string_equal(out, "");
	assert_string_equal(err, "flow-test: unknown kernel 'matmull'\n"
				 "Try 'flow-test --help' for more information.\n");
}

static void test_tool_bad_number_names_the_option(void **state)
{
	(void)state;
	char out[512], err[512];
	assert_int_equal(run_child(bad_int_child, out, sizeof(out), err, sizeof(err)), 2);
	assert_non_null(strstr(err, "flow-test: --iters: invalid integer '10x'\n"));
}

static void test_tool_help_and_version_go_to_stdout(void **state)
{
	(void)state;
	char out[512], err[512];
	assert_int_equal(run_child(help_child, out, sizeof(out), err, sizeof(err)), 0);
	assert_string_equal(out, "usage: flow-test [options]\n");
	assert_string_equal(err, "");
	assert_int_equal(run_child(version_child, out, sizeof(out), err, sizeof(err)), 0);
	assert_non_null(strstr(out, "flow-test 0."));
	assert_non_null(strstr(out, "cuda: "));
	assert_non_null(strstr(out, "pmix: "));
}

static void test_tool_unknown_option_is_a_usage_error(void **state)
{
	(void)state;
	char out[512], err[512];
	assert_int_equal(run_child(unknown_option_child, out, sizeof(out), err, sizeof(err)), 2);
	assert_non_null(strstr(err, "flow-test: unknown option '--bogus'\n"));
}

static void test_tool_invalid_log_level_is_a_usage_error(void **state)
{
	(void)state;
	char out[512], err[512];
	assert_int_equal(run_child(bad_env_child, out, sizeof(out), err, sizeof(err)), 2);
	assert_non_null(strstr(err, "invalid FLOW_LOG_LEVEL 'loud'"));
}

static void full_disk_child(void)
{
	/* /dev/full fails every write with ENOSPC. */
	int fd = open("/dev/full", O_WRONLY);
	if (fd < 0)
		_exit(77);
	dup2(fd, 1);
	flow_tool_init(&tool, "flow-test", "usage\n", 0);
	printf("data\n");
	_exit(flow_tool_finish(&tool, 0));
}

static void test_tool_finish_reports_a_full_disk(void **state)
{
	(void)state;
	char out[512], err[512];
	int status = run_child(full_disk_child, out, sizeof(out), err, sizeof(err));
	if (status == 77)
		skip();
	assert_int_equal(status, 1);
	assert_non_null(strstr(err, "flow-test: cannot write standard output: No space left on device"));
}

static void closed_pipe_child(void)
{
	int p[2];
	if (pipe(p) != 0)
		_exit(98);
	close(p[0]); /* the reader went away, as with | head */
	dup2(p[1], 1);
	flow_tool_init(&tool, "flow-test", "usage\n", 0);
	flow_tool_install_signal_cleanup(); /* ignores SIGPIPE */
	printf("data\n");
	_exit(flow_tool_finish(&tool, 0));
}

static void test_tool_finish_accepts_a_closed_pipe(void **state)
{
	(void)state;
	char out[512], err[512];
	assert_int_equal(run_child(closed_pipe_child, out, sizeof(out), err, sizeof(err)), 0);
	assert_string_equal(err, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tool_usage_error_exits_2_with_hint),
		cmocka_unit_test(test_tool_bad_number_names_the_option),
		cmocka_unit_test(test_tool_help_and_version_go_to_stdout),
		cmocka_unit_test(test_tool_unknown_option_is_a_usage_error),
		cmocka_unit_test(test_tool_invalid_log_level_is_a_usage_error),
		cmocka_unit_test(test_tool_finish_reports_a_full_disk),
		cmocka_unit_test(test_tool_finish_accepts_a_closed_pipe),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
