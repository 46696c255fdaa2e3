/* The --nproc launcher (lib/comm/launch.c) in one process: the ranks'
 * command line without --nproc, the refusals before anything starts (a
 * rank count out of range, no command line, already inside a job of
 * several ranks, a program that cannot be found or run), each with its
 * exact message, and the exit status and one-line report of a job whose
 * rank fails without ever joining it.
 *
 * Jobs whose ranks join through PMIx (1 to 4 ranks, two launchers at
 * once, a rank that fails mid-job, SIGINT to the launcher) run in
 * tests/cluster/launch.bats, with comm_check as the ranks.
 *
 * A launcher takes over process-wide state while it runs (signals, child
 * reaping) and leaves libpmix's server up for the life of the process, so
 * each job here runs in a child process of its own, its stderr in a file. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <flow/launch.h>

#include "testutil.h"
#include "worldutil.h"

static char tmpdir[256];

static int setup(void **state)
{
	(void)state;
	worldutil_clear_launcher_environment();
	return testutil_mkdtemp(tmpdir, sizeof(tmpdir), "launch");
}

static int teardown(void **state)
{
	(void)state;
	return testutil_rmtree(tmpdir);
}

/* ---- the ranks' command line ------------------------------------------------ */

/* argv less option, as a NULL-ended array to compare with want. */
static void assert_stripped(int argc, char **argv, const char *option,
			    const char *const *want)
{
	char **out = flow_launch_strip_option(argc, argv, option);
	size_t i = 0;
	assert_non_null(out);
	for (; want[i]; i++) {
		assert_non_null(out[i]);
		assert_string_equal(out[i], want[i]);
	}
	assert_null(out[i]);
	free(out);
}

static void test_launch_strip_option_removes_both_spellings(void **state)
{
	char *argv1[] = { "flow-train", "--nproc", "4", "--steps", "3", NULL };
	char *argv2[] = { "flow-train", "--steps=3", "--nproc=2", NULL };
	const char *const want1[] = { "flow-train", "--steps", "3", NULL };
	const char *const want2[] = { "flow-train", "--steps=3", NULL };
	(void)state;
	assert_stripped(5, argv1, "--nproc", want1);
	assert_stripped(3, argv2, "--nproc", want2);
}

static void test_launch_strip_option_keeps_what_only_looks_like_it(void **state)
{
	/* A longer option, the program's own name, and everything after
	 * "--" stay; a value-less option at the end goes alone. */
	char *argv[] = { "--nproc", "--nprocs", "8", "-n", "2", "--",
			 "--nproc", "3", NULL };
	char *tail[] = { "prog", "-v", "--nproc", NULL };
	const char *const want[] = { "--nproc", "--nprocs", "8", "-n", "2",
				     "--", "--nproc", "3", NULL };
	const char *const want_tail[] = { "prog", "-v", NULL };
	(void)state;
	assert_stripped(8, argv, "--nproc", want);
	assert_stripped(3, tail, "--nproc", want_tail);
}

static void test_launch_strip_option_of_argv0_alone(void **state)
{
	char *argv[] = { "flow-bench", NULL };
	const char *const want[] = { "flow-bench", NULL };
	(void)state;
	assert_stripped(1, argv, "--nproc", want);
}

/* ---- refusals before anything starts ---------------------------------------- */

static char *sh_argv[] = { "sh", "-c", "exit 0", NULL };

/* flow_launch of opts, which must refuse with err and message. */
static void assert_refused(const flow_launch_opts_t *opts, flow_err_t err,
			   const char *message)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_launch(opts, &diag), -1);
	assert_int_equal(diag.err, err);
	assert_string_equal(diag.msg, message);
}

#ifdef HAVE_PMIX

static void test_launch_refuses_a_rank_count_out_of_range(void **state)
{
	flow_launch_opts_t opts = { .nproc = 0, .path = "/bin/sh",
				    .argv = sh_argv, .prog = "t" };
	(void)state;
	assert_refused(&opts, FLOW_ERR_USAGE,
		       "cannot launch 0 ranks: expected 1 to 4096");
	opts.nproc = 4097;
	assert_refused(&opts, FLOW_ERR_USAGE,
		       "cannot launch 4097 ranks: expected 1 to 4096");
}

static void test_launch_refuses_no_command_line(void **state)
{
	char *empty[] = { NULL };
	flow_launch_opts_t opts = { .nproc = 2, .path = "/bin/sh",
				    .argv = NULL, .prog = "t" };
	(void)state;
	assert_refused(&opts, FLOW_ERR_USAGE, "no command line for the ranks");
	opts.argv = empty;
	assert_refused(&opts, FLOW_ERR_USAGE, "no command line for the ranks");
}

static void test_launch_refuses_to_start_inside_a_job_of_several_ranks(void **state)
{
	static const char *const vars[] = { "SLURM_STEP_NUM_TASKS",
					    "OMPI_COMM_WORLD_SIZE",
					    "PMI_SIZE" };
	flow_launch_opts_t opts = { .nproc = 2, .path = "/bin/sh",
				    .argv = sh_argv, .prog = "t" };
	char want[FLOW_DIAG_MAX];
	(void)state;
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		setenv(vars[i], "3", 1);
		snprintf(want, sizeof(want),
			 "cannot launch ranks from inside a job of 3 ranks (%s=3): drop --nproc and let the job's launcher start the ranks, or give the job one task",
			 vars[i]);
		assert_refused(&opts, FLOW_ERR_USAGE, want);
		unsetenv(vars[i]);
	}
}

static void test_launch_refuses_a_program_that_cannot_run(void **state)
{
	char file[300], dir_path[300], want[FLOW_DIAG_MAX];
	flow_launch_opts_t opts = { .nproc = 1, .argv = sh_argv, .prog = "t" };
	(void)state;
	opts.path = "/nonexistent/flow-no-such-program";
	assert_refused(&opts, FLOW_ERR_IO,
		       "cannot execute '/nonexistent/flow-no-such-program': No such file or directory");
	/* Not executable, even for root: no execute bit. */
	snprintf(file, sizeof(file), "%s/plain", tmpdir);
	assert_int_equal(testutil_write_file(file, "#!/bin/sh\n", 10), 0);
	assert_int_equal(chmod(file, 0644), 0);
	opts.path = file;
	snprintf(want, sizeof(want), "cannot execute '%s': Permission denied",
		 file);
	assert_refused(&opts, FLOW_ERR_IO, want);
	/* A directory is no program either. */
	snprintf(dir_path, sizeof(dir_path), "%s/", tmpdir);
	opts.path = dir_path;
	snprintf(want, sizeof(want), "cannot execute '%s': Permission denied",
		 dir_path);
	assert_refused(&opts, FLOW_ERR_IO, want);
}

/* A name without '/' is looked for in PATH, once, before anything starts. */
static void test_launch_looks_for_a_name_in_path(void **state)
{
	char file[512];
	char *saved = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
	flow_launch_opts_t opts = { .nproc = 1, .argv = sh_argv, .prog = "t" };
	(void)state;
	snprintf(file, sizeof(file), "%s/flow-plain-tool", tmpdir);
	assert_int_equal(testutil_write_file(file, "#!/bin/sh\n", 10), 0);
	assert_int_equal(chmod(file, 0644), 0);
	setenv("PATH", tmpdir, 1);
	opts.path = "flow-no-such-program";
	assert_refused(&opts, FLOW_ERR_IO,
		       "cannot find program 'flow-no-such-program' in PATH");
	opts.path = "flow-plain-tool";
	assert_refused(&opts, FLOW_ERR_IO,
		       "cannot execute 'flow-plain-tool': Permission denied");
	if (saved)
		setenv("PATH", saved, 1);
	else
		unsetenv("PATH");
	free(saved);
}

/* ---- jobs whose ranks never join -------------------------------------------- */

/* What a job run in a child process gave: flow_launch's return value, and
 * what was written on stderr. */
typedef struct job_result {
	int status;
	char err[1024];
} job_result_t;

/* flow_launch(nproc ranks of `sh -c script`, messages prefixed "t") in a
 * child process whose stderr goes to a file. */
static job_result_t run_job(int nproc, const char *script)
{
	char *argv[] = { "sh", "-c", (char *)script, NULL };
	char errfile[512];
	int fds[2];
	job_result_t res;
	memset(&res, 0, sizeof(res));
	snprintf(errfile, sizeof(errfile), "%s/stderr", tmpdir);
	assert_int_equal(pipe(fds), 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		flow_launch_opts_t opts = { .nproc = nproc, .path = "/bin/sh",
					    .argv = argv, .grace_s = 2,
					    .prog = "t" };
		flow_diag_t diag = FLOW_DIAG_INIT;
		int fd = open(errfile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
			      0600);
		close(fds[0]);
		if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
			_exit(100);
		int status = flow_launch(&opts, &diag);
		if (status < 0)
			fprintf(stderr, "flow_launch: %s\n", diag.msg);
		ssize_t n = write(fds[1], &status, sizeof(status));
		_exit(n == (ssize_t)sizeof(status) ? 0 : 101);
	}
	close(fds[1]);
	ssize_t n = read(fds[0], &res.status, sizeof(res.status));
	close(fds[0]);
	int wst = 0;
	assert_int_equal(waitpid(pid, &wst, 0), pid);
	assert_true(WIFEXITED(wst));
	assert_int_equal(WEXITSTATUS(wst), 0);
	assert_int_equal(n, (ssize_t)sizeof(res.status));
	FILE *f = fopen(errfile, "r");
	assert_non_null(f);
	size_t len = fread(res.err, 1, sizeof(res.err) - 1, f);
	res.err[len] = '\0';
	fclose(f);
	return res;
}

static void test_launch_gives_a_failed_rank_s_status_and_names_it(void **state)
{
	(void)state;
	job_result_t res = run_job(1, "exit 3");
	assert_int_equal(res.status, 3);
	assert_string_equal(res.err, "t: rank 0 exited with status 3\n");
}

static void test_launch_fails_a_rank_that_exits_0_before_pmix_init(void **state)
{
	(void)state;
	job_result_t res = run_job(1, "exit 0");
	assert_int_equal(res.status, 1);
	assert_string_equal(res.err,
			    "t: rank 0 exited with status 0 before PMIx_Init\n");
}

static void test_launch_gives_128_plus_the_signal_of_a_killed_rank(void **state)
{
	(void)state;
	job_result_t res = run_job(1, "kill -9 $$");
	assert_int_equal(res.status, 137);
	assert_string_equal(res.err,
			    "t: rank 0 was killed by signal 9 (Killed)\n");
}

/* Each rank reads its rank from PMIX_RANK, which the launcher sets. */
static void test_launch_stops_the_other_ranks_when_one_fails(void **state)
{
	(void)state;
	job_result_t res = run_job(2, "[ \"$PMIX_RANK\" = 1 ] && exit 5; exec sleep 30");
	assert_int_equal(res.status, 5);
	assert_string_equal(res.err,
			    "t: rank 1 exited with status 5; stopping the other 1 rank\n");
}

#else /* !HAVE_PMIX */

static void test_launch_needs_a_build_with_pmix(void **state)
{
	flow_launch_opts_t opts = { .nproc = 2, .path = "/bin/sh",
				    .argv = sh_argv, .prog = "t" };
	(void)state;
	assert_refused(&opts, FLOW_ERR_NOTSUP,
		       "this build has no PMIx: --nproc needs libpmix-dev");
}

#endif /* HAVE_PMIX */

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_launch_strip_option_removes_both_spellings),
		cmocka_unit_test(test_launch_strip_option_keeps_what_only_looks_like_it),
		cmocka_unit_test(test_launch_strip_option_of_argv0_alone),
#ifdef HAVE_PMIX
		cmocka_unit_test(test_launch_refuses_a_rank_count_out_of_range),
		cmocka_unit_test(test_launch_refuses_no_command_line),
		cmocka_unit_test(test_launch_refuses_to_start_inside_a_job_of_several_ranks),
		cmocka_unit_test(test_launch_refuses_a_program_that_cannot_run),
		cmocka_unit_test(test_launch_looks_for_a_name_in_path),
		cmocka_unit_test(test_launch_gives_a_failed_rank_s_status_and_names_it),
		cmocka_unit_test(test_launch_fails_a_rank_that_exits_0_before_pmix_init),
		cmocka_unit_test(test_launch_gives_128_plus_the_signal_of_a_killed_rank),
		cmocka_unit_test(test_launch_stops_the_other_ranks_when_one_fails),
#else
		cmocka_unit_test(test_launch_needs_a_build_with_pmix),
#endif
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
