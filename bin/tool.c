/* Shared plumbing of the flow-* programs: common options, the usage and
 * error grammar, strict option values, signal cleanup and the stdout check. */
#include <config.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <flow/blas.h>
#include <flow/file.h>
#include <flow/launch.h>
#include <flow/log.h>
#include <flow/parse.h>
#include <flow/version.h>

#include "tool.h"

/* libgomp and OpenBLAS read their settings when they are loaded, before
 * main, so the only way to change them is to run the program again with the
 * environment set: the same argv, from /proc/self/cmdline.  Settings the
 * user made are kept; any failure just leaves the slower runtime. */
static void restart_with_tuned_runtime(void)
{
	const char *coretype = flow_blas_preferred_coretype();
	bool set_coretype = coretype && !getenv("OPENBLAS_CORETYPE");
	bool set_wait = !getenv("OMP_WAIT_POLICY");
	if (!set_coretype && !set_wait)
		return;
	FILE *f = fopen("/proc/self/cmdline", "rb");
	if (!f)
		return;
	static char cmdline[1 << 16];
	size_t len = fread(cmdline, 1, sizeof(cmdline) - 1, f);
	bool whole = feof(f);
	fclose(f);
	if (!whole || len == 0)
		return;
	cmdline[len] = '\0';
	size_t argc = 0;
	for (size_t i = 0; i < len; i++)
		argc += cmdline[i] == '\0';
	char **argv = calloc(argc + 1, sizeof(*argv));
	if (!argv)
		return;
	for (size_t i = 0, a = 0; a < argc; i += strlen(cmdline + i) + 1)
		argv[a++] = cmdline + i;
	if (set_coretype) {
		flow_log(FLOW_LOG_INFO,
			 "OpenBLAS chose kernels slower than this CPU supports; using OPENBLAS_CORETYPE=%s",
			 coretype);
		setenv("OPENBLAS_CORETYPE", coretype, 1);
	}
	/* Sleeping, not spinning, between parallel regions, so idle OpenMP
	 * threads leave the cores to OpenBLAS's threads (spinning cost the
	 * GEMMs up to half their speed on a 2-core machine). */
	if (set_wait)
		setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
	fflush(NULL);
	execv("/proc/self/exe", argv);
	if (set_coretype) /* exec failed: carry on as we are */
		unsetenv("OPENBLAS_CORETYPE");
	if (set_wait)
		unsetenv("OMP_WAIT_POLICY");
	free(argv);
}

void flow_tool_init(flow_tool_t *tool, const char *name, const char *help,
		    unsigned flags)
{
	tool->name = name;
	tool->help = help;
	tool->json = false;
	flow_log_set_prog(name);
	opterr = 0; /* getopt's own messages do not follow flow's grammar */
	if (flags & FLOW_TOOL_LINE_BUFFERED)
		setvbuf(stdout, NULL, _IOLBF, 0);
	if (flow_log_level_from_env() != FLOW_OK)
		flow_tool_usage_error(tool,
				      "invalid FLOW_LOG_LEVEL '%s' (expected off, error, warn, info, debug, trace or 0-5)",
				      getenv("FLOW_LOG_LEVEL"));
	if (flags & FLOW_TOOL_COMPUTE)
		restart_with_tuned_runtime();
}

static _Noreturn void print_help(const flow_tool_t *tool)
{
	fputs(tool->help, stdout);
	exit(flow_tool_finish(tool, 0));
}

static _Noreturn void print_version(const flow_tool_t *tool)
{
	printf("%s %s\n%s\n", tool->name, flow_version(), flow_features());
	exit(flow_tool_finish(tool, 0));
}

bool flow_tool_common_option(flow_tool_t *tool, int opt, char *const argv[])
{
	switch (opt) {
	case 'v':
		if (flow_log_get_level() < FLOW_LOG_TRACE)
			flow_log_set_level(flow_log_get_level() + 1);
		return true;
	case 'q':
		if (flow_log_get_level() > FLOW_LOG_OFF)
			flow_log_set_level(flow_log_get_level() - 1);
		return true;
	case FLOW_OPT_JSON:
		tool->json = true;
		return true;
	case 'h':
		print_help(tool);
	case FLOW_OPT_VERSION:
		print_version(tool);
	case ':':
		flow_tool_usage_error(tool, "option '%s' needs a value",
				      argv[optind - 1]);
	case '?':
		if (optopt && optopt < 0x100)
			flow_tool_usage_error(tool, "unknown option '-%c'",
					      optopt);
		flow_tool_usage_error(tool, "unknown option '%s'",
				      argv[optind - 1]);
	}
	return false;
}

void flow_tool_usage_error(const flow_tool_t *tool, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flow_log_say(tool->name, fmt, ap);
	va_end(ap);
	fprintf(stderr, "Try '%s --help' for more information.\n", tool->name);
	exit(2);
}

void flow_tool_error(const flow_tool_t *tool, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flow_log_say(tool->name, fmt, ap);
	va_end(ap);
}

int flow_tool_fail(const flow_tool_t *tool, const flow_diag_t *diag)
{
	flow_tool_error(tool, "%s", flow_diag_message(diag));
	return diag->err == FLOW_ERR_USAGE ? 2 : 1;
}

int64_t flow_tool_int(const flow_tool_t *tool, const char *option,
		      const char *text, int64_t min, int64_t max)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	int64_t value;
	if (flow_parse_int(text, min, max, &value, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s: %s", option,
				      flow_diag_message(&diag));
	return value;
}

uint64_t flow_tool_size(const flow_tool_t *tool, const char *option,
			const char *text)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	uint64_t value;
	if (flow_parse_size(text, &value, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s: %s", option,
				      flow_diag_message(&diag));
	return value;
}

double flow_tool_double(const flow_tool_t *tool, const char *option,
			const char *text, double min, double max)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	double value;
	if (flow_parse_double(text, min, max, &value, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s: %s", option,
				      flow_diag_message(&diag));
	return value;
}

#define NPROC_OPTION "--nproc"
#define NPROC_MAX 1024

/* --help and --version answer once, from this process, without ranks. */
static bool is_info_option(const char *arg)
{
	return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0 ||
	       strcmp(arg, "--version") == 0;
}

/* The value of the last --nproc before any "--", or NULL when there is
 * none or when --help or --version is asked for; a --nproc without a value
 * is a usage error. */
static const char *find_nproc(const flow_tool_t *tool, int argc, char **argv)
{
	const size_t len = strlen(NPROC_OPTION);
	const char *value = NULL;
	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		if (is_info_option(argv[i]))
			return NULL;
		if (strncmp(argv[i], NPROC_OPTION, len) != 0)
			continue;
		if (argv[i][len] == '=') {
			value = argv[i] + len + 1;
		} else if (argv[i][len] == '\0') {
			if (i + 1 >= argc)
				flow_tool_usage_error(tool,
						      "option '%s' needs a value",
						      NPROC_OPTION);
			value = argv[++i];
		}
	}
	return value;
}

/* N ranks on one machine each start as many OpenMP threads as it has
 * CPUs unless told otherwise, N times oversubscribing it; give each rank
 * its share when the user has not chosen. */
static void share_cpus(int nproc)
{
	if (getenv("OMP_NUM_THREADS"))
		return;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	long share = cpus > nproc ? cpus / nproc : 1;
	char text[24];
	snprintf(text, sizeof text, "%ld", share);
	setenv("OMP_NUM_THREADS", text, 1);
}

int flow_tool_launch_if_asked(const flow_tool_t *tool, int argc, char **argv)
{
	const char *value = find_nproc(tool, argc, argv);
	if (!value)
		return -1;
	int nproc = (int)flow_tool_int(tool, NPROC_OPTION, value, 1,
				       NPROC_MAX);
	share_cpus(nproc);
	char **rank_argv = flow_launch_strip_option(argc, argv, NPROC_OPTION);
	if (!rank_argv) {
		flow_tool_error(tool, "out of memory");
		return 1;
	}
	flow_launch_opts_t opts = {
		.nproc = nproc,
		.path = NULL, /* this program */
		.argv = rank_argv,
		.prog = tool->name,
	};
	flow_diag_t diag = FLOW_DIAG_INIT;
	int status = flow_launch(&opts, &diag);
	free(rank_argv);
	return status < 0 ? flow_tool_fail(tool, &diag) : status;
}

static void cleanup_and_reraise(int sig)
{
	flow_atomic_file_cleanup_all();
	signal(sig, SIG_DFL);
	raise(sig);
}

void flow_tool_install_signal_cleanup(void)
{
	static const int signals[] = { SIGINT, SIGTERM, SIGHUP };
	for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++) {
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = cleanup_and_reraise;
		sigemptyset(&sa.sa_mask);
		sigaction(signals[i], &sa, NULL);
	}
	/* A closed pipe shows up as EPIPE in flow_tool_finish instead. */
	signal(SIGPIPE, SIG_IGN);
}

/* True when standard output is a pipe whose reader has gone away: the
 * EPIPE may have happened in an earlier write, whose errno is lost. */
static bool stdout_reader_gone(void)
{
	struct pollfd p = { .fd = STDOUT_FILENO, .events = POLLOUT };
	return poll(&p, 1, 0) == 1 && (p.revents & POLLERR);
}

int flow_tool_finish(const flow_tool_t *tool, int status)
{
	errno = 0;
	int failed = fflush(stdout) != 0 || ferror(stdout);
	/* Like git: a reader that went away early (| head) is not an error. */
	if (failed && errno != EPIPE && !(errno == 0 && stdout_reader_gone())) {
		int saved = errno;
		fprintf(stderr, "%s: cannot write standard output%s%s\n",
			tool->name, saved ? ": " : "",
			saved ? strerror(saved) : "");
		return status ? status : 1;
	}
	return status;
}
