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

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <flow/boxing_exec.h>
#include <flow/comm.h>
#include <flow/mem.h>
#include <flow/world.h>

#include "checkutil.h"
#include "../unit/sbputil.h"

#define PROG "boxing_check"
const char check_prog[] = PROG; /* every message starts with it */
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
	CHECK_EXIT_STATUS_HELP;

/* ---- options ---------------------------------------------------------------- */

typedef struct options {
	check_opts_t common; /* --nproc, --timeout */
	uint64_t seed;
	int64_t trials;
} options_t;

enum { OPT_SEED = CHECK_OPT_OWN, OPT_TRIALS };

static const struct option long_options[] = {
	CHECK_COMMON_OPTIONS,
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "trials", required_argument, NULL, OPT_TRIALS },
	{ NULL, 0, NULL, 0 },
};

static void parse_options(int argc, char **argv, options_t *opt)
{
	int c;

	*opt = (options_t){ .seed = DEFAULT_SEED, .trials = DEFAULT_TRIALS };
	check_opts_init(&opt->common, usage_text, MAX_RANKS);
	while ((c = check_getopt(&opt->common, argc, argv, long_options)) != -1) {
		switch (c) {
		case OPT_SEED:
			opt->seed = (uint64_t)check_int_arg("--seed", optarg, 0,
							    INT64_MAX);
			break;
		case OPT_TRIALS:
			opt->trials = check_int_arg("--trials", optarg, 0,
						    INT32_MAX);
			break;
		}
	}
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

/* ---- pieces ----------------------------------------------------------------- */

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
	int64_t n = flow_box_numel(&box);
	float *buf = flow_calloc((size_t)n, sizeof(float));
	if (!buf)
		return flow_diag_set(&pr->job->diag, FLOW_ERR_NOMEM, "out of memory");
	for (int64_t x = 0; x < n; x++) {
		int64_t e = flow_box_element(&plan->shape, &box, x, NULL);
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
	int me = job->info->rank;
	const float *want = pr->local[me];
	const float *got = (const float *)pr->out;
	char what[512];
	describe(pr, what, sizeof what);
	if (memcmp(pr->out, want, pr->dst_bytes) != 0) {
		size_t x = 0;
		while (memcmp(&got[x], &want[x], sizeof(float)) == 0)
			x++;
		check_show_wrong(&job->wrong, me,
				 "%s: element %zu of %zu is %g, want %g", what,
				 x, pr->dst_bytes / sizeof(float),
				 (double)got[x], (double)want[x]);
	}
	for (size_t b = 0; b < GUARD_BYTES; b++)
		if (pr->out[pr->dst_bytes + b] != GUARD_BYTE) {
			check_show_wrong(&job->wrong, me,
					 "%s: byte %zu after the piece was overwritten",
					 what, b);
			break;
		}
	if (memcmp(pr->mine, pr->pristine, pr->src_bytes) != 0)
		check_show_wrong(&job->wrong, me, "%s: the source piece changed",
				 what);
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
		check_show_wrong(&job->wrong, job->info->rank,
				 "%s: expected FLOW_ERR_NOTSUP naming %s, got %s: %s",
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
	pr.dst_bytes = (size_t)flow_box_numel(&box) * sizeof(float);
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
	int ndim = (int)splitmix64_range(&s, 1, MAX_NDIM);
	flow_shape_t shape;
	flow_nd_sbp_t layouts[MAX_LAYOUTS];
	flow_err_t err;

	for (int d = 0; d < ndim; d++)
		dims[d] = splitmix64_range(&s, 1, MAX_EXTENT);
	err = flow_shape_init(&shape, ndim, dims, &job->diag);
	for (int m = 0; m < nmeshes && err == FLOW_OK; m++) {
		size_t nl = all_layouts(&shape, &meshes[m].mesh, layouts,
					MAX_LAYOUTS);
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
		err = flow_boxing_comms_new(job->comm, &meshes[m].mesh, NULL,
					    NULL, &meshes[m].comms, &job->diag);
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

static int run_rank(const options_t *opt)
{
	job_t job = { .opt = opt, .diag = FLOW_DIAG_INIT };
	int status = 1;

	if (check_join(opt->common.timeout_s, &job.world, &job.info,
		       &job.diag) != FLOW_OK)
		return check_fail(&job.diag);
	if (flow_comm_world(job.world, FLOW_COMM_CPU, &job.comm, &job.diag) != FLOW_OK)
		goto out_abort;
	if (check_everything(&job, &status) != FLOW_OK)
		goto out_abort;
	flow_comm_free(job.comm);
	return check_leave(job.world, &job.diag, status);

out_abort:
	return check_abort(job.world, job.comm, &job.diag);
}

int main(int argc, char **argv)
{
	options_t opt;
	parse_options(argc, argv, &opt);
	if (opt.common.nproc > 0)
		return check_launch(argc, argv, opt.common.nproc);
	return run_rank(&opt);
}
