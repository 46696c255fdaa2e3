/* boxing_check: run boxing plans on real ranks with flow_boxing_run and
 * compare each rank's result, bit for bit, with the reference executor.
 *
 * Each rank joins the job through PMIx (srun --mpi=pmix, mpirun, or flow's
 * own launcher with --nproc) and runs the same property test: seeded
 * random logical shapes (1 to 3 dimensions of 1 to 7 elements, so most
 * splits are uneven), on every mesh of the world's ranks with one or two
 * axes (row-major, and column-major too), for every pair of valid
 * nd-SBPs.  Every rank builds every rank's
 * source piece from one integer-valued f32 tensor (P copies hold non-zero
 * integer addends that sum to it exactly), runs flow_boxing_simulate on
 * all of them in-process as the oracle, runs flow_boxing_run on its own
 * piece, and compares its destination piece with the oracle's with
 * memcmp; it also checks that its source piece is untouched and that
 * nothing is written past its destination piece.  That includes the
 * plans with send/recv steps, which the planner picks on 2-D meshes when
 * they are cheapest.  Plans with broadcast steps, which the distributed
 * executor refuses (FLOW_ERR_NOTSUP), are checked to be refused and
 * counted as skipped; the planner makes none, so the count stays 0. */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/boxing.h>
#include <flow/comm.h>
#include <flow/launch.h>
#include <flow/log.h>
#include <flow/mem.h>
#include <flow/parse.h>
#include <flow/world.h>

#define PROG "boxing_check"
#define MAX_RANKS 64
/* Defaults, as numbers and as the help text shows them. */
#define DEFAULT_SEED 20261201
#define DEFAULT_SEED_TEXT "20261201"
#define DEFAULT_TRIALS 4
#define DEFAULT_TRIALS_TEXT "4"
/* Logical shapes: 1 to MAX_NDIM dimensions of 1 to MAX_EXTENT. */
#define MAX_NDIM 3
#define MAX_EXTENT 7
/* Meshes of the world's ranks tried: 1-D, and 2-D factorisations both
 * row-major and column-major. */
#define MAX_MESHES 16
/* nd-SBPs per mesh: (ndim + 2)^axes, at most 5^2. */
#define MAX_LAYOUTS 32
/* Wrong results each rank prints in full; the rest are only counted. */
#define WRONG_SHOWN_MAX 10
/* Bytes after the destination piece that the executor must leave alone,
 * and what the piece holds before it runs. */
#define GUARD_BYTES 64
#define GUARD_BYTE 0xa5
#define POISON_BYTE 0xcd
/* Logical values are LOGICAL_BASE + 3 e for element e, and P addends but
 * the first are in [-ADDEND_MAX, ADDEND_MAX] \ {0}: the first addend
 * stays far from 0, and every sum is an exact f32. */
#define LOGICAL_BASE 1000
#define ADDEND_MAX 3

static const char usage_text[] =
	"Usage: " PROG " [--nproc N] [--seed S] [--trials N] [--timeout S]\n"
	"Run random boxing plans on real ranks (flow_boxing_run) and compare\n"
	"every rank's result bit for bit with the reference executor\n"
	"(flow_boxing_simulate): for each trial a random logical shape, on\n"
	"every 1-D and 2-D mesh of the world's ranks (2-D ones row-major and\n"
	"column-major), every pair of valid nd-SBPs.  Run it under any PMIx\n"
	"launcher (srun --mpi=pmix, mpirun) or start the ranks with --nproc.\n"
	"\n"
	"Options:\n"
	"  --nproc N      start N ranks on this machine and exit with the\n"
	"                 job's status\n"
	"  --seed S       seed of the random shapes (default "
	DEFAULT_SEED_TEXT ")\n"
	"  --trials N     random shapes to try (default "
	DEFAULT_TRIALS_TEXT ")\n"
	"  --timeout S    deadline of start-up and of each collective, in\n"
	"                 seconds (default 60)\n"
	"  -h, --help     print this help and exit\n"
	"\n"
	"Output: rank 0 prints one line on stdout (wrapped here),\n"
	"  " PROG ": N ranks, transport T: P plans (R send/recv), S steps,\n"
	"  K skipped, W wrong\n"
	"with P the plans run, R of them with send/recv steps, S their steps\n"
	"(the same on every rank), K the plans with broadcast steps, which must\n"
	"be refused with FLOW_ERR_NOTSUP (the planner makes none), and W the\n"
	"wrong results summed over the ranks; every rank prints its first 10\n"
	"wrong results on stderr.\n"
	"\n"
	"Exit status: 0 when every result was right, 1 when one was wrong or\n"
	"something failed, 2 for a usage error; with --nproc, the status of the\n"
	"first rank that failed (128+N when signal N killed it).\n";

/* ---- options ---------------------------------------------------------------- */

typedef struct options {
	int nproc; /* 0: this process is a rank */
	double timeout_s;
	uint64_t seed;
	int64_t trials;
} options_t;

enum { OPT_NPROC = 0x100, OPT_SEED, OPT_TRIALS, OPT_TIMEOUT };

static const struct option long_options[] = {
	{ "nproc", required_argument, NULL, OPT_NPROC },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "trials", required_argument, NULL, OPT_TRIALS },
	{ "timeout", required_argument, NULL, OPT_TIMEOUT },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static _Noreturn FLOW_PRINTF(1, 2) void usage_error(const char *fmt, ...)
{
	va_list ap;
	fflush(stdout);
	fputs(PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry '" PROG " --help' for more information.\n", stderr);
	exit(2);
}

static int64_t int_arg(const char *option, const char *text, int64_t min,
		       int64_t max)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	int64_t value;
	if (flow_parse_int(text, min, max, &value, &diag) != FLOW_OK)
		usage_error("%s: %s", option, flow_diag_message(&diag));
	return value;
}

static void parse_options(int argc, char **argv, options_t *opt)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	int c;

	*opt = (options_t){ .timeout_s = FLOW_COMM_TIMEOUT_DEFAULT,
			    .seed = DEFAULT_SEED,
			    .trials = DEFAULT_TRIALS };
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", long_options, NULL)) != -1) {
		switch (c) {
		case OPT_NPROC:
			opt->nproc = (int)int_arg("--nproc", optarg, 1, MAX_RANKS);
			break;
		case OPT_SEED:
			opt->seed = (uint64_t)int_arg("--seed", optarg, 0, INT64_MAX);
			break;
		case OPT_TRIALS:
			opt->trials = int_arg("--trials", optarg, 0, INT32_MAX);
			break;
		case OPT_TIMEOUT:
			if (flow_parse_double(optarg, 0.001, 1e6, &opt->timeout_s,
					      &diag) != FLOW_OK)
				usage_error("--timeout: %s",
					    flow_diag_message(&diag));
			break;
		case 'h':
			fputs(usage_text, stdout);
			exit(fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1);
		case ':':
			usage_error("option '%s' needs a value", argv[optind - 1]);
		default:
			usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);
}

/* ---- the job ------------------------------------------------------------------ */

typedef struct job {
	const options_t *opt;
	flow_world_t *world;
	const flow_world_info_t *info;
	flow_comm_t *comm;
	flow_diag_t diag;
	int64_t plans, send_recv_plans, steps, skipped, wrong;
} job_t;

/* One mesh of the world's ranks, with the executor's communicators. */
typedef struct mesh_case {
	flow_mesh_t mesh;
	flow_boxing_comms_t *comms;
} mesh_case_t;

/* One pair of layouts on one mesh. */
typedef struct pair {
	job_t *job;
	mesh_case_t *mc;
	flow_boxing_plan_t plan;
	void **local;     /* every rank's piece, for the oracle */
	void *mine;       /* this rank's source piece, given to the executor */
	void *pristine;   /* a copy of it */
	unsigned char *out; /* this rank's destination piece, then the guard */
	size_t src_bytes, dst_bytes;
} pair_t;

/* splitmix64: a whole trial follows from one seed. */
static uint64_t next_u64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

static int64_t uniform(uint64_t *s, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(next_u64(s) % (uint64_t)(hi - lo + 1));
}

static FLOW_PRINTF(2, 3) void show_wrong(job_t *job, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	job->wrong++;
	if (job->wrong > WRONG_SHOWN_MAX)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	/* One write per line, so that ranks' lines do not interleave. */
	fflush(stdout);
	fprintf(stderr, PROG ": rank %d: %s\n", job->info->rank, line);
}

/* The 1-D mesh of all n ranks and every 2-D factorisation of n, row-major
 * from rank 0, and each 2-D one also column-major ("axb/1xa"), where mesh
 * positions and ranks differ, as do the orders of a send/recv's
 * communicator and of the world. */
static int job_meshes(job_t *job, mesh_case_t *out)
{
	int64_t n = job->info->size;
	int count = 0;
	for (int64_t a = 1; a < n || count == 0; a++) {
		if (n % a != 0 || count + 2 > MAX_MESHES)
			continue;
		int64_t dims[2] = { a, n / a };
		int ndim = 2;
		if (a == 1) { /* the 1-D mesh */
			dims[0] = n;
			ndim = 1;
		}
		if (flow_mesh_init(&out[count].mesh, ndim, dims, 0, &job->diag) != FLOW_OK)
			return -1;
		out[count++].comms = NULL;
		if (ndim == 1)
			continue;
		out[count] = out[count - 1];
		out[count].mesh.stride[0] = 1;
		out[count].mesh.stride[1] = dims[0];
		if (flow_mesh_check(&out[count].mesh, &job->diag) != FLOW_OK)
			return -1;
		count++;
	}
	return count;
}

/* Every valid nd-SBP of shape on mesh, from {B, P, S(0)..S(ndim-1)} per
 * axis, in a fixed order. */
static size_t all_layouts(const flow_shape_t *shape, const flow_mesh_t *mesh,
			  flow_nd_sbp_t *out)
{
	int kinds = shape->ndim + 2;
	int64_t total = 1;
	size_t n = 0;
	for (int i = 0; i < mesh->ndim; i++)
		total *= kinds;
	for (int64_t code = 0; code < total && n < MAX_LAYOUTS; code++) {
		flow_nd_sbp_t sbp = { .ndim = mesh->ndim };
		int64_t c = code;
		for (int i = 0; i < mesh->ndim; i++, c /= kinds) {
			int d = (int)(c % kinds);
			sbp.sbp[i] = d == 0 ? (flow_sbp_t){ FLOW_SBP_BROADCAST, 0 } :
				     d == 1 ? (flow_sbp_t){ FLOW_SBP_PARTIAL, 0 } :
					      (flow_sbp_t){ FLOW_SBP_SPLIT, d - 2 };
		}
		if (flow_nd_sbp_check(shape, &sbp, mesh, NULL) == FLOW_OK)
			out[n++] = sbp;
	}
	return n;
}

/* ---- pieces ----------------------------------------------------------------- */

static int64_t box_numel(const flow_box_t *b)
{
	int64_t n = 1;
	for (int d = 0; d < b->ndim; d++)
		n *= b->extent[d];
	return n;
}

/* Row-major logical index of the element at offset x of a box. */
static int64_t logical_index(const flow_shape_t *shape, const flow_box_t *box,
			     int64_t x)
{
	int64_t idx = 0, inner = 1;
	for (int d = box->ndim - 1; d >= 0; d--) {
		idx += (box->start[d] + x % box->extent[d]) * inner;
		x /= box->extent[d];
		inner *= shape->dims[d];
	}
	return idx;
}

/* Addend k > 0 of element e: a small non-zero integer. */
static int64_t addend(int64_t e, int64_t k)
{
	uint64_t h = (uint64_t)e * 0x9e3779b97f4a7c15u +
		     (uint64_t)k * 0xc2b2ae3d27d4eb4fu;
	h ^= h >> 29;
	int64_t v = (int64_t)(h % (2 * ADDEND_MAX)) - ADDEND_MAX; /* -3..2 */
	return v >= 0 ? v + 1 : v;
}

/* Which addend position i holds: its index among the copies of the P
 * axes of src (0 for all without P), and how many copies there are. */
static int64_t addend_index(const flow_mesh_t *mesh, const flow_nd_sbp_t *src,
			    int64_t i, int64_t *copies_out)
{
	int64_t c[FLOW_MESH_MAX_AXES], k = 0, n = 1;
	flow_mesh_coords(mesh, i, c);
	for (int a = 0; a < mesh->ndim; a++)
		if (src->sbp[a].kind == FLOW_SBP_PARTIAL) {
			k = k * mesh->dims[a] + c[a];
			n *= mesh->dims[a];
		}
	*copies_out = n;
	return k;
}

/* Position i's source piece of the logical tensor, in a new buffer. */
static flow_err_t make_piece(pair_t *pr, int64_t i, void **out, size_t *bytes_out)
{
	const flow_boxing_plan_t *plan = &pr->plan;
	flow_box_t box;
	int64_t copies, k = addend_index(&plan->src_mesh, &plan->src, i, &copies);
	flow_nd_sbp_local_box(&plan->shape, &plan->src, &plan->src_mesh, i, &box);
	int64_t n = box_numel(&box);
	float *buf = flow_calloc((size_t)n, sizeof(float));
	if (!buf)
		return flow_diag_set(&pr->job->diag, FLOW_ERR_NOMEM, "out of memory");
	for (int64_t x = 0; x < n; x++) {
		int64_t e = logical_index(&plan->shape, &box, x);
		int64_t v = LOGICAL_BASE + 3 * e;
		if (k > 0)
			v = addend(e, k);
		else
			for (int64_t o = 1; o < copies; o++)
				v -= addend(e, o);
		buf[x] = (float)v;
	}
	*out = buf;
	if (bytes_out)
		*bytes_out = (size_t)n * sizeof(float);
	return FLOW_OK;
}

/* ---- one pair ----------------------------------------------------------------- */

static void pair_free(pair_t *pr)
{
	if (pr->local)
		for (int r = 0; r < pr->job->info->size; r++)
			flow_free(pr->local[r]);
	flow_free(pr->local);
	flow_free(pr->mine);
	flow_free(pr->pristine);
	flow_free(pr->out);
}

/* Whether flow_boxing_run runs plan: all but broadcast steps. */
static bool runs_here(const flow_boxing_plan_t *plan)
{
	for (size_t k = 0; k < plan->nsteps; k++)
		if (plan->steps[k].kind == FLOW_BOXING_BROADCAST)
			return false;
	return true;
}

/* "mesh '2x2' shape (5,7) (S(0),P) -> (B,S(1))", for wrong results. */
static void describe(const pair_t *pr, char *buf, size_t cap)
{
	const flow_boxing_plan_t *plan = &pr->plan;
	char mesh[FLOW_MESH_TEXT_MAX], src[FLOW_SBP_TEXT_MAX], dst[FLOW_SBP_TEXT_MAX];
	char shape[64] = "";
	size_t at = 0;
	flow_mesh_format(&plan->src_mesh, mesh, sizeof mesh);
	flow_nd_sbp_format(&plan->src, src, sizeof src);
	flow_nd_sbp_format(&plan->dst, dst, sizeof dst);
	for (int d = 0; d < plan->shape.ndim && at < sizeof shape; d++)
		at += (size_t)snprintf(shape + at, sizeof shape - at, "%s%" PRId64,
				       d ? "," : "", plan->shape.dims[d]);
	snprintf(buf, cap, "mesh '%s' shape (%s) %s -> %s (%zu steps)", mesh,
		 shape, src, dst, plan->nsteps);
}

static void compare(pair_t *pr)
{
	job_t *job = pr->job;
	const float *want = pr->local[job->info->rank];
	const float *got = (const float *)pr->out;
	char what[512];
	describe(pr, what, sizeof what);
	if (memcmp(pr->out, want, pr->dst_bytes) != 0) {
		size_t x = 0;
		while (memcmp(&got[x], &want[x], sizeof(float)) == 0)
			x++;
		show_wrong(job, "%s: element %zu of %zu is %g, want %g", what, x,
			   pr->dst_bytes / sizeof(float), (double)got[x],
			   (double)want[x]);
	}
	for (size_t b = 0; b < GUARD_BYTES; b++)
		if (pr->out[pr->dst_bytes + b] != GUARD_BYTE) {
			show_wrong(job, "%s: byte %zu after the piece was overwritten",
				   what, b);
			break;
		}
	if (memcmp(pr->mine, pr->pristine, pr->src_bytes) != 0)
		show_wrong(job, "%s: the source piece changed", what);
}

/* A plan with a broadcast step must be refused, on every rank alike and
 * before any collective, naming the step's kind. */
static void expect_refusal(pair_t *pr)
{
	job_t *job = pr->job;
	flow_diag_t diag = FLOW_DIAG_INIT;
	char what[512];
	const char *kind = NULL;
	for (size_t k = 0; k < pr->plan.nsteps && !kind; k++)
		if (pr->plan.steps[k].kind == FLOW_BOXING_BROADCAST)
			kind = flow_boxing_kind_name(pr->plan.steps[k].kind);
	flow_err_t err = flow_boxing_run(&pr->plan, pr->mc->comms, pr->mine,
					 pr->out, &diag);
	char quoted[32];
	snprintf(quoted, sizeof quoted, "'%s'", kind);
	describe(pr, what, sizeof what);
	if (err != FLOW_ERR_NOTSUP || !strstr(flow_diag_message(&diag), quoted))
		show_wrong(job, "%s: expected FLOW_ERR_NOTSUP naming %s, got %s: %s",
			   what, quoted, flow_err_name(err),
			   flow_diag_message(&diag));
	job->skipped++;
}

static flow_err_t check_pair(job_t *job, mesh_case_t *mc,
			     const flow_shape_t *shape,
			     const flow_nd_sbp_t *src, const flow_nd_sbp_t *dst)
{
	pair_t pr = { .job = job, .mc = mc };
	int n = job->info->size, me = job->info->rank;
	int64_t my_index = flow_mesh_index_of(&mc->mesh, me);
	flow_box_t box;
	flow_err_t err = flow_boxing_plan(shape, FLOW_DTYPE_F32, &mc->mesh, src,
					  &mc->mesh, dst, NULL, &pr.plan,
					  &job->diag);
	if (err == FLOW_OK)
		err = make_piece(&pr, my_index, &pr.mine, &pr.src_bytes);
	if (err == FLOW_OK)
		err = make_piece(&pr, my_index, &pr.pristine, NULL);
	if (err != FLOW_OK)
		goto out;
	flow_nd_sbp_local_box(shape, dst, &mc->mesh, my_index, &box);
	pr.dst_bytes = (size_t)box_numel(&box) * sizeof(float);
	pr.out = flow_alloc(pr.dst_bytes + GUARD_BYTES);
	pr.local = flow_calloc((size_t)n, sizeof(*pr.local));
	if (!pr.out || !pr.local) {
		err = flow_diag_set(&job->diag, FLOW_ERR_NOMEM, "out of memory");
		goto out;
	}
	memset(pr.out, POISON_BYTE, pr.dst_bytes);
	memset(pr.out + pr.dst_bytes, GUARD_BYTE, GUARD_BYTES);
	if (!runs_here(&pr.plan)) {
		expect_refusal(&pr);
		goto out;
	}
	for (int64_t i = 0; i < n && err == FLOW_OK; i++)
		err = make_piece(&pr, i, &pr.local[flow_mesh_rank(&mc->mesh, i)], NULL);
	if (err == FLOW_OK)
		err = flow_boxing_simulate(&pr.plan, pr.local, (size_t)n, NULL,
					   NULL, &job->diag);
	if (err == FLOW_OK)
		err = flow_boxing_run(&pr.plan, mc->comms, pr.mine, pr.out,
				      &job->diag);
	if (err != FLOW_OK)
		goto out;
	compare(&pr);
	job->plans++;
	for (size_t k = 0; k < pr.plan.nsteps; k++)
		if (pr.plan.steps[k].kind == FLOW_BOXING_SEND_RECV) {
			job->send_recv_plans++;
			break;
		}
	job->steps += (int64_t)pr.plan.nsteps;
out:
	pair_free(&pr);
	return err;
}

/* One random shape: every pair of layouts on every mesh. */
static flow_err_t run_trial(job_t *job, mesh_case_t *meshes, int nmeshes,
			    int64_t trial)
{
	uint64_t s = job->opt->seed ^ ((uint64_t)trial * 0xd1b54a32d192ed03u);
	int64_t dims[MAX_NDIM];
	int ndim = (int)uniform(&s, 1, MAX_NDIM);
	flow_shape_t shape;
	flow_nd_sbp_t layouts[MAX_LAYOUTS];
	flow_err_t err;

	for (int d = 0; d < ndim; d++)
		dims[d] = uniform(&s, 1, MAX_EXTENT);
	err = flow_shape_init(&shape, ndim, dims, &job->diag);
	for (int m = 0; m < nmeshes && err == FLOW_OK; m++) {
		size_t nl = all_layouts(&shape, &meshes[m].mesh, layouts);
		for (size_t a = 0; a < nl && err == FLOW_OK; a++)
			for (size_t b = 0; b < nl && err == FLOW_OK; b++)
				err = check_pair(job, &meshes[m], &shape,
						 &layouts[a], &layouts[b]);
	}
	return err;
}

/* Every trial; rank 0 prints the summary.  Returns the exit status. */
static flow_err_t check_everything(job_t *job, int *status_out)
{
	mesh_case_t meshes[MAX_MESHES];
	int nmeshes = job_meshes(job, meshes);
	int64_t wrong = 0;
	flow_err_t err = nmeshes < 0 ? job->diag.err : FLOW_OK;

	for (int m = 0; m < nmeshes && err == FLOW_OK; m++)
		err = flow_boxing_comms_new(job->comm, &meshes[m].mesh,
					    &meshes[m].comms, &job->diag);
	for (int64_t t = 0; t < job->opt->trials && err == FLOW_OK; t++)
		err = run_trial(job, meshes, nmeshes, t);
	for (int m = 0; m < nmeshes; m++)
		flow_boxing_comms_free(meshes[m].comms);
	if (err == FLOW_OK)
		err = flow_all_reduce(job->comm, &job->wrong, &wrong, 1,
				      FLOW_DTYPE_I64, &job->diag);
	if (err != FLOW_OK)
		return err;
	if (job->info->rank == 0)
		printf(PROG ": %d ranks, transport %s: %" PRId64 " plans (%" PRId64
			    " send/recv), %" PRId64 " steps, %" PRId64
			    " skipped, %" PRId64 " wrong\n",
		       job->info->size, flow_comm_transport(job->comm),
		       job->plans, job->send_recv_plans, job->steps,
		       job->skipped, wrong);
	/* Before the other ranks can exit 1 and have the launcher stop this
	 * one. */
	fflush(stdout);
	*status_out = wrong == 0 ? 0 : 1;
	return FLOW_OK;
}

/* ---- main ---------------------------------------------------------------------- */

static int launch(int argc, char **argv, const options_t *opt)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	char **rank_argv = flow_launch_strip_option(argc, argv, "--nproc");
	flow_launch_opts_t lo = { .nproc = opt->nproc, .prog = PROG };
	int status;

	if (!rank_argv) {
		fprintf(stderr, PROG ": out of memory\n");
		return 1;
	}
	lo.argv = rank_argv;
	status = flow_launch(&lo, &diag);
	free(rank_argv);
	if (status < 0) {
		fprintf(stderr, PROG ": %s\n", flow_diag_message(&diag));
		return diag.err == FLOW_ERR_USAGE ? 2 : 1;
	}
	return status;
}

static int fail(job_t *job)
{
	fflush(stdout);
	fprintf(stderr, PROG ": %s\n", flow_diag_message(&job->diag));
	return 1;
}

static int run_rank(const options_t *opt)
{
	job_t job = { .opt = opt, .diag = FLOW_DIAG_INIT };
	int status = 1;

	flow_log_set_prog(PROG);
	if (flow_world_init(&job.world, opt->timeout_s, &job.diag) != FLOW_OK)
		return fail(&job);
	job.info = flow_world_info(job.world);
	flow_log_set_rank(job.info->rank);
	if (flow_comm_world(job.world, FLOW_COMM_CPU, &job.comm, &job.diag) != FLOW_OK)
		goto out_abort;
	if (check_everything(&job, &status) != FLOW_OK)
		goto out_abort;
	flow_comm_free(job.comm);
	if (flow_world_free(job.world, &job.diag) != FLOW_OK)
		return fail(&job);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, PROG ": cannot write to stdout: %s\n",
			strerror(errno));
		return 1;
	}
	return status;

out_abort:
	status = fail(&job);
	flow_comm_free(job.comm);
	flow_world_abort(job.world, status, flow_diag_message(&job.diag));
	return status;
}

int main(int argc, char **argv)
{
	options_t opt;
	parse_options(argc, argv, &opt);
	if (opt.nproc > 0)
		return launch(argc, argv, &opt);
	return run_rank(&opt);
}
