/* Shared scaffolding of the multi-rank checkers (see checkutil.h): one
 * grammar for their usage errors, one --nproc launch, one way for a rank
 * into and out of the job, one report of a wrong result. */
#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/launch.h>
#include <flow/log.h>
#include <flow/parse.h>

#include "checkutil.h"

void check_opts_init(check_opts_t *common, const char *help, int max_ranks)
{
	*common = (check_opts_t){ .help = help,
				  .max_ranks = max_ranks,
				  .timeout_s = FLOW_COMM_TIMEOUT_DEFAULT };
}

void check_usage_error(const char *fmt, ...)
{
	va_list ap;
	fflush(stdout);
	fprintf(stderr, "%s: ", check_prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry '%s --help' for more information.\n",
		check_prog);
	exit(2);
}

int64_t check_int_arg(const char *option, const char *text, int64_t min,
		      int64_t max)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	int64_t value;
	if (flow_parse_int(text, min, max, &value, &diag) != FLOW_OK)
		check_usage_error("%s: %s", option, flow_diag_message(&diag));
	return value;
}

int check_getopt(check_opts_t *common, int argc, char **argv,
		 const struct option *long_options)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	int c;

	opterr = 0; /* getopt's own messages do not follow the grammar */
	while ((c = getopt_long(argc, argv, ":h", long_options, NULL)) != -1) {
		switch (c) {
		case CHECK_OPT_NPROC:
			common->nproc = (int)check_int_arg("--nproc", optarg, 1,
							   common->max_ranks);
			break;
		case CHECK_OPT_TIMEOUT:
			if (flow_parse_double(optarg, 0.001, 1e6,
					      &common->timeout_s,
					      &diag) != FLOW_OK)
				check_usage_error("--timeout: %s",
						  flow_diag_message(&diag));
			break;
		case 'h':
			fputs(common->help, stdout);
			exit(fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1);
		case ':':
			check_usage_error("option '%s' needs a value",
					  argv[optind - 1]);
		case '?':
			check_usage_error("unknown option '%s'", argv[optind - 1]);
		default:
			return c;
		}
	}
	if (optind < argc)
		check_usage_error("unexpected argument '%s'", argv[optind]);
	return -1;
}

int check_launch(int argc, char **argv, int nproc)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	char **rank_argv = flow_launch_strip_option(argc, argv, "--nproc");
	flow_launch_opts_t lo = { .nproc = nproc, .prog = check_prog };
	int status;

	if (!rank_argv) {
		fprintf(stderr, "%s: out of memory\n", check_prog);
		return 1;
	}
	lo.argv = rank_argv;
	status = flow_launch(&lo, &diag);
	free(rank_argv);
	if (status < 0) {
		fprintf(stderr, "%s: %s\n", check_prog,
			flow_diag_message(&diag));
		return diag.err == FLOW_ERR_USAGE ? 2 : 1;
	}
	return status;
}

flow_err_t check_join(double timeout_s, flow_world_t **world_out,
		      const flow_world_info_t **info_out, flow_diag_t *diag)
{
	flow_world_t *world;
	const flow_world_info_t *info;
	flow_err_t err;

	flow_log_set_prog(check_prog);
	err = flow_world_init(&world, timeout_s, diag);
	if (err != FLOW_OK)
		return err;
	info = flow_world_info(world);
	flow_log_set_rank(info->rank);
	*world_out = world;
	*info_out = info;
	return FLOW_OK;
}

int check_fail(const flow_diag_t *diag)
{
	fflush(stdout);
	fprintf(stderr, "%s: %s\n", check_prog, flow_diag_message(diag));
	return 1;
}

int check_abort(flow_world_t *world, flow_comm_t *comm,
		const flow_diag_t *diag)
{
	int status = check_fail(diag);
	flow_comm_free(comm);
	flow_world_abort(world, status, flow_diag_message(diag));
	return status;
}

int check_leave(flow_world_t *world, flow_diag_t *diag, int status)
{
	if (flow_world_free(world, diag) != FLOW_OK)
		return check_fail(diag);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "%s: cannot write to stdout: %s\n", check_prog,
			strerror(errno));
		return 1;
	}
	return status;
}

void check_show_wrong(int64_t *count, int rank, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	if ((*count)++ >= CHECK_WRONG_SHOWN_MAX)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	/* One write per line, so that ranks' lines do not interleave. */
	fflush(stdout);
	fprintf(stderr, "%s: rank %d: %s\n", check_prog, rank, line);
}
