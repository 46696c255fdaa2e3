/* What every flow-* program shares: the common options (-v, -q, --json,
 * -h, --version), the usage and error grammar, strict option-value parsing,
 * signal cleanup of artifacts and the final check of stdout.  Each tool's
 * main() follows the same five stages: parse options, validate, call
 * libflow, write results, return flow_tool_finish(). */
#ifndef FLOW_TOOL_H
#define FLOW_TOOL_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

#include <flow/error.h>

/* getopt codes for long-only options: common ones, then each tool's from
 * FLOW_OPT_TOOL on. */
enum {
	FLOW_OPT_JSON = 0x1000,
	FLOW_OPT_VERSION,
	FLOW_OPT_TOOL = 0x1100,
};

#define FLOW_COMMON_SHORT_OPTIONS "vqh"
#define FLOW_COMMON_OPTIONS                                   \
	{ "verbose", no_argument, NULL, 'v' },                \
	{ "quiet", no_argument, NULL, 'q' },                  \
	{ "json", no_argument, NULL, FLOW_OPT_JSON },         \
	{ "help", no_argument, NULL, 'h' },                   \
	{ "version", no_argument, NULL, FLOW_OPT_VERSION }

typedef struct flow_tool {
	const char *name;  /* "flow-bench" */
	const char *help;  /* full usage text, printed by --help */
	bool json;         /* --json given */
} flow_tool_t;

/* What a program is, for flow_tool_init. */
enum {
	/* Long-running: line-buffer stdout so `tail -f` shows rows as they
	 * happen. */
	FLOW_TOOL_LINE_BUFFERED = 1 << 0,
	/* Runs CPU kernels: make sure OpenMP and OpenBLAS are set up to be
	 * fast (see flow_tool_init). */
	FLOW_TOOL_COMPUTE = 1 << 1,
};

/* Set up logging (program name, FLOW_LOG_LEVEL) and make getopt silent so
 * errors follow flow's grammar; flags are FLOW_TOOL_* bits.  Exits 2 when
 * FLOW_LOG_LEVEL is invalid.  Call it first, before any other work: with
 * FLOW_TOOL_COMPUTE, when OMP_WAIT_POLICY is unset (OpenMP threads would
 * spin against the BLAS's own threads after every parallel region) or
 * OpenBLAS fell back to kernels slower than this CPU supports and
 * OPENBLAS_CORETYPE is unset, the program is executed again, once, with
 * OMP_WAIT_POLICY=PASSIVE and OPENBLAS_CORETYPE set (both libraries read
 * them only when they are loaded).  Values the user set are kept. */
void flow_tool_init(flow_tool_t *tool, const char *name, const char *help,
		    unsigned flags);

/* Handle one getopt result if it is a common option or an error ('?', ':'):
 * returns true when handled (-v/-q/--json), exits for --help (0), --version
 * (0) and errors (2), and returns false for the tool's own options. */
bool flow_tool_common_option(flow_tool_t *tool, int opt, char *const argv[]);

/* "flow-x: <message>" and "Try 'flow-x --help' for more information." on
 * stderr, exit 2. */
_Noreturn void flow_tool_usage_error(const flow_tool_t *tool, const char *fmt,
				     ...) __attribute__((format(printf, 2, 3)));

/* "flow-x: <message>" on stderr, after flushing stdout. */
void flow_tool_error(const flow_tool_t *tool, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Print diag's message as an error and return 1 (2 for FLOW_ERR_USAGE). */
int flow_tool_fail(const flow_tool_t *tool, const flow_diag_t *diag);

/* The --nproc N (or --nproc=N) option, looked for before getopt runs and
 * only before a "--" argument.  Absent, or with -h, --help or --version
 * (answered once, by getopt's usual path): returns -1, and the program goes
 * on as usual (it may be one of the ranks).  Present: N must be 1 to 1024 (a
 * usage error exits 2 otherwise); this process becomes the launcher of N
 * ranks of this same program, run with the same arguments less --nproc
 * (flow_launch), and the function returns the exit status for main:
 * the job's status, or flow_tool_fail's when the job could not start.
 * Call it right after flow_tool_init:
 *   int st = flow_tool_launch_if_asked(&tool, argc, argv);
 *   if (st >= 0)
 *           return st; */
int flow_tool_launch_if_asked(const flow_tool_t *tool, int argc, char **argv);

/* Strict option values: a bad value is a usage error naming the option. */
int64_t flow_tool_int(const flow_tool_t *tool, const char *option,
		      const char *text, int64_t min, int64_t max);
uint64_t flow_tool_size(const flow_tool_t *tool, const char *option,
			const char *text);
double flow_tool_double(const flow_tool_t *tool, const char *option,
			const char *text, double min, double max);

/* On SIGINT/SIGTERM/SIGHUP: remove every temporary an atomic file holds,
 * then re-raise so the shell sees 128+N. */
void flow_tool_install_signal_cleanup(void);

/* Flush stdout and check it: a write error (ENOSPC, EIO) turns status 0
 * into 1 with a message; a reader that closed the pipe early is not an
 * error.  Returns the exit status to return from main. */
int flow_tool_finish(const flow_tool_t *tool, int status);

#endif
