/* What the multi-rank checkers (comm_check, boxing_check) share: their
 * name in every message, the usage-error grammar, strict option values,
 * the options every checker takes (--nproc, --timeout, -h/--help), the
 * --nproc launch, a rank's way into and out of the job, and the report of
 * a wrong result.  Each checker keeps its own options, its checks and its
 * summary line. */
#ifndef FLOW_TESTS_CHECKUTIL_H
#define FLOW_TESTS_CHECKUTIL_H

#include <getopt.h>
#include <stdint.h>

#include <flow/comm.h>
#include <flow/common.h>
#include <flow/error.h>
#include <flow/world.h>

/* The checker's name ("comm_check"), which starts every message: each
 * checker defines it. */
extern const char check_prog[];

/* Wrong results each rank prints in full; the rest are only counted. */
#define CHECK_WRONG_SHOWN_MAX 10

/* The end of every checker's --help: what check_getopt, check_launch and
 * the rank paths below make of the exit status. */
#define CHECK_EXIT_STATUS_HELP                                                  \
	"Exit status: 0 when every result was right, 1 when one was wrong or\n" \
	"something failed, 2 for a usage error; with --nproc, the status of the\n" \
	"first rank that failed (128+N when signal N killed it).\n"

/* getopt codes of the common options; a checker numbers its own from
 * CHECK_OPT_OWN on. */
enum {
	CHECK_OPT_NPROC = 0x100,
	CHECK_OPT_TIMEOUT,
	CHECK_OPT_OWN = 0x110,
};

/* The common options, for the checker's getopt_long table. */
#define CHECK_COMMON_OPTIONS                                       \
	{ "nproc", required_argument, NULL, CHECK_OPT_NPROC },     \
	{ "timeout", required_argument, NULL, CHECK_OPT_TIMEOUT }, \
	{ "help", no_argument, NULL, 'h' }

/* The common options' values. */
typedef struct check_opts {
	const char *help; /* the checker's usage text, for --help */
	int max_ranks;    /* the largest --nproc */
	int nproc;        /* --nproc N; 0: this process is a rank */
	double timeout_s; /* --timeout S: start-up and each collective */
} check_opts_t;

/* No --nproc and the default timeout (FLOW_COMM_TIMEOUT_DEFAULT). */
void check_opts_init(check_opts_t *common, const char *help, int max_ranks);

/* The next of the checker's own options in argv (getopt_long over
 * long_options, which hold CHECK_COMMON_OPTIONS), or -1 after the last.
 * The common options go into *common on the way; --help prints
 * common->help and exits 0 (1 when stdout fails); a missing value, an
 * unknown option and, at the end, an argument that is no option are usage
 * errors. */
int check_getopt(check_opts_t *common, int argc, char **argv,
		 const struct option *long_options);

/* "PROG: <message>" and "Try 'PROG --help' for more information." on
 * stderr, after flushing stdout; exit 2. */
_Noreturn void check_usage_error(const char *fmt, ...) FLOW_PRINTF(1, 2);

/* text as an integer in [min, max], or a usage error naming option. */
int64_t check_int_arg(const char *option, const char *text, int64_t min,
		      int64_t max);

/* --nproc N: start N ranks of this program on this machine, with the same
 * arguments less --nproc (flow_launch).  Returns the job's status, or 1 (2
 * for a usage error) when it could not start, said on stderr. */
int check_launch(int argc, char **argv, int nproc);

/* This process as a rank: its log lines name the checker and the rank,
 * and it joins the job (flow_world_init).  Returns FLOW_OK with *world_out
 * (leave with check_leave or check_abort) and *info_out (borrowed from
 * it), or the error in diag. */
flow_err_t check_join(double timeout_s, flow_world_t **world_out,
		      const flow_world_info_t **info_out, flow_diag_t *diag);

/* "PROG: <diag's message>" on stderr, after flushing stdout.  Returns the
 * exit status, 1. */
int check_fail(const flow_diag_t *diag);

/* A rank that failed: check_fail, free comm (NULL is fine), and have the
 * launcher end the whole job.  Returns the exit status, 1. */
int check_abort(flow_world_t *world, flow_comm_t *comm,
		const flow_diag_t *diag);

/* A rank that ran to the end: leave the job and check stdout.  Returns
 * status, or 1 when either failed (said on stderr). */
int check_leave(flow_world_t *world, flow_diag_t *diag, int status);

/* One wrong result: *count goes up by one, and while it was below
 * CHECK_WRONG_SHOWN_MAX, "PROG: rank R: <message>" goes to stderr. */
void check_show_wrong(int64_t *count, int rank, const char *fmt, ...)
	FLOW_PRINTF(3, 4);

#endif
