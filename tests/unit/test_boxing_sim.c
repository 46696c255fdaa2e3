/* The reference executor (lib/sbp/boxing_sim.c) running the planner's
 * plans, as property tests: for thousands of random tensors, meshes,
 * placements and pairs of valid nd-SBPs, a plan run by the reference
 * executor must leave every destination rank exactly its slice (a P
 * destination: the sum over its copies), and the bytes the executor counts
 * must equal what the planner's formulas say.
 *
 * Values are distinct integers and P addends are small integers that
 * cancel, so every sum is exact and results compare with ==.  Each case is
 * generated from its own seed, printed on failure; FLOW_TEST_SEED sets the
 * first one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flow/boxing.h>
#include <flow/mem.h>
#include <flow/parse.h>

#include "sbputil.h"

#define DEFAULT_SEED 20261130u
#define CONFIGS 2400        /* shape + placements drawn */
#define ALL_PAIRS 36        /* draws with at most this many pairs run them all */
#define PAIRS_PER_CONFIG 12 /* else a sample of this many */
#define MAX_LAYOUTS 1024

static uint64_t first_seed = DEFAULT_SEED;

/* ---- drawing cases ------------------------------------------------------------- */

static void random_dims(uint64_t *s, int ndim, int64_t max_size, int64_t *dims)
{
	for (;;) {
		int64_t size = 1;
		for (int i = 0; i < ndim; i++) {
			dims[i] = splitmix64_range(s, 1, 4);
			size *= dims[i];
		}
		if (size <= max_size)
			return;
	}
}

static flow_mesh_t make_mesh(int ndim, const int64_t *dims, int64_t base)
{
	flow_mesh_t m;
	assert_int_equal(flow_mesh_init(&m, ndim, dims, base, NULL), FLOW_OK);
	return m;
}

/* m over the same ranks in column-major order: axis 0 varies fastest. */
static flow_mesh_t column_major(const flow_mesh_t *m)
{
	flow_mesh_t t = *m;
	int64_t stride = 1;
	for (int i = 0; i < t.ndim; i++) {
		t.stride[i] = stride;
		stride *= t.dims[i];
	}
	assert_int_equal(flow_mesh_check(&t, NULL), FLOW_OK);
	return t;
}

/* A different mesh over the ranks of m: another factorisation of its
 * size, or m in column-major order. */
static flow_mesh_t reshaped(uint64_t *s, const flow_mesh_t *m)
{
	int64_t size = flow_mesh_size(m);
	if (m->ndim >= 2 && splitmix64_range(s, 0, 1))
		return column_major(m);
	for (;;) {
		int ndim = (int)splitmix64_range(s, 1, 3);
		int64_t dims[3], rest = size;
		for (int i = 0; i < ndim - 1; i++) {
			int64_t d;
			do
				d = splitmix64_range(s, 1, rest);
			while (rest % d);
			dims[i] = d;
			rest /= d;
		}
		dims[ndim - 1] = rest;
		flow_mesh_t t = make_mesh(ndim, dims, m->base);
		if (!flow_mesh_equal(&t, m))
			return t;
		if (size == 1)
			return t;
	}
}

/* ---- values ------------------------------------------------------------------- */

static double logical_value(int64_t e)
{
	return (double)(3 * e + 1);
}

/* Addend k > 0 of element e, a small integer; addend 0 makes up the rest. */
static double addend(int64_t e, int64_t k)
{
	uint64_t h = (uint64_t)e * 0x9e3779b97f4a7c15u + (uint64_t)k * 0xc2b2ae3d27d4eb4fu;
	h ^= h >> 29;
	return (double)((int64_t)(h % 7) - 3);
}

static void put(flow_dtype_t dtype, void *buf, int64_t i, double v)
{
	switch (dtype) {
	case FLOW_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
	case FLOW_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
	case FLOW_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
	default: fail();
	}
}

static double get(flow_dtype_t dtype, const void *buf, int64_t i)
{
	switch (dtype) {
	case FLOW_DTYPE_F32: return ((const float *)buf)[i];
	case FLOW_DTYPE_I32: return ((const int32_t *)buf)[i];
	case FLOW_DTYPE_I64: return (double)((const int64_t *)buf)[i];
	default: fail();
	}
	return 0;
}

static unsigned partial_mask(const flow_nd_sbp_t *sbp, const flow_mesh_t *mesh)
{
	unsigned mask = 0;
	for (int i = 0; i < sbp->ndim; i++)
		if (sbp->sbp[i].kind == FLOW_SBP_PARTIAL && mesh->dims[i] > 1)
			mask |= 1u << i;
	return mask;
}

/* Index of position i among the copies of its P axes, and their count. */
static int64_t partial_index(const flow_mesh_t *mesh, unsigned pmask,
			     int64_t i, int64_t *count_out)
{
	int64_t c[FLOW_MESH_MAX_AXES], idx = 0, n = 1;
	flow_mesh_coords(mesh, i, c);
	for (int a = 0; a < mesh->ndim; a++)
		if (pmask & (1u << a)) {
			idx = idx * mesh->dims[a] + c[a];
			n *= mesh->dims[a];
		}
	*count_out = n;
	return idx;
}

static void fill_sources(const flow_boxing_plan_t *plan, void **local)
{
	const flow_mesh_t *mesh = &plan->src_mesh;
	unsigned pmask = partial_mask(&plan->src, mesh);
	for (int64_t i = 0; i < flow_mesh_size(mesh); i++) {
		flow_box_t box;
		flow_nd_sbp_local_box(&plan->shape, &plan->src, mesh, i, &box);
		int64_t copies, k = partial_index(mesh, pmask, i, &copies);
		int64_t n = flow_box_numel(&box);
		void *buf = flow_calloc((size_t)n, flow_dtype_size(plan->dtype));
		assert_non_null(buf);
		for (int64_t x = 0; x < n; x++) {
			int64_t e = flow_box_element(&plan->shape, &box, x, NULL);
			double v = logical_value(e);
			if (k > 0)
				v = addend(e, k);
			else
				for (int64_t o = 1; o < copies; o++)
					v -= addend(e, o);
			put(plan->dtype, buf, x, v);
		}
		local[flow_mesh_rank(mesh, i)] = buf;
	}
}

/* Every destination position with all P coordinates 0 sums its copies
 * (itself alone without P) and must find the logical slice. */
static bool destinations_exact(const flow_boxing_plan_t *plan, void **local,
			       char *why, size_t cap)
{
	const flow_mesh_t *mesh = &plan->dst_mesh;
	unsigned pmask = partial_mask(&plan->dst, mesh);
	for (int64_t i = 0; i < flow_mesh_size(mesh); i++) {
		int64_t copies;
		if (partial_index(mesh, pmask, i, &copies) != 0)
			continue;
		flow_box_t box;
		flow_nd_sbp_local_box(&plan->shape, &plan->dst, mesh, i, &box);
		flow_mesh_t group;
		flow_mesh_group(mesh, pmask, i, &group);
		for (int64_t x = 0; x < flow_box_numel(&box); x++) {
			double sum = 0;
			for (int64_t g = 0; g < copies; g++) {
				int64_t rank = pmask ? flow_mesh_rank(&group, g) :
						       flow_mesh_rank(mesh, i);
				sum += get(plan->dtype, local[rank], x);
			}
			int64_t e = flow_box_element(&plan->shape, &box, x, NULL);
			if (sum != logical_value(e)) {
				snprintf(why, cap,
					 "position %" PRId64 " element %" PRId64 ": got %g, want %g",
					 i, e, sum, logical_value(e));
				return false;
			}
		}
	}
	return true;
}

/* Consistency of a plan's steps with each other and with its per-rank
 * bytes. */
static bool steps_consistent(const flow_boxing_plan_t *plan, size_t nranks,
			     char *why, size_t cap)
{
	uint64_t total = 0;
	for (size_t k = 0; k < plan->nsteps; k++) {
		const flow_boxing_step_t *st = &plan->steps[k];
		const flow_nd_sbp_t *prev = k ? &plan->steps[k - 1].to : &plan->src;
		if (!flow_nd_sbp_equal(&st->from, prev)) {
			snprintf(why, cap, "step %zu does not start where the last ended", k + 1);
			return false;
		}
		uint64_t send = 0, recv = 0, max_send = 0, max_recv = 0;
		for (size_t r = 0; r < nranks; r++) {
			uint64_t a, b;
			flow_boxing_step_rank_bytes(plan, k, (int64_t)r, &a, &b);
			send += a;
			recv += b;
			max_send = a > max_send ? a : max_send;
			max_recv = b > max_recv ? b : max_recv;
		}
		if (send != recv || send != st->total_bytes ||
		    max_send != st->max_send_bytes || max_recv != st->max_recv_bytes ||
		    !(st->time_s >= 0)) {
			snprintf(why, cap, "step %zu: sums %" PRIu64 "/%" PRIu64 " maxima %" PRIu64
				 "/%" PRIu64 " disagree with the step's %" PRIu64 " %" PRIu64 "/%" PRIu64,
				 k + 1, send, recv, max_send, max_recv, st->total_bytes,
				 st->max_send_bytes, st->max_recv_bytes);
			return false;
		}
		total += st->total_bytes;
	}
	if (plan->nsteps && !flow_nd_sbp_equal(&plan->steps[plan->nsteps - 1].to, &plan->dst)) {
		snprintf(why, cap, "the last step does not end at the destination");
		return false;
	}
	if (total != plan->total_bytes) {
		snprintf(why, cap, "plan total %" PRIu64 " is not the steps' %" PRIu64,
			 plan->total_bytes, total);
		return false;
	}
	return true;
}

typedef struct stats {
	long cases, steps, send_recv, multi_step, merged;
	long kinds[FLOW_BOXING_KIND_COUNT];
} stats_t;

static void describe(const flow_boxing_plan_t *plan, uint64_t seed,
		     const char *why)
{
	char shape[128], sm[FLOW_MESH_TEXT_MAX], dm[FLOW_MESH_TEXT_MAX];
	char s[FLOW_SBP_TEXT_MAX], d[FLOW_SBP_TEXT_MAX];
	flow_shape_format(&plan->shape, shape, sizeof(shape));
	flow_mesh_format(&plan->src_mesh, sm, sizeof(sm));
	flow_mesh_format(&plan->dst_mesh, dm, sizeof(dm));
	flow_nd_sbp_format(&plan->src, s, sizeof(s));
	flow_nd_sbp_format(&plan->dst, d, sizeof(d));
	fprintf(stderr, "seed %" PRIu64 ": %s %s on %s -> %s on %s (%s): %s\n",
		seed, shape, s, sm, d, dm, flow_dtype_name(plan->dtype), why);
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_boxing_plan_print(plan, stderr, &diag) != FLOW_OK)
		fprintf(stderr, "%s\n", flow_diag_message(&diag));
}

/* One case: plan, simulate, compare.  Returns false after describing a
 * failure. */
static bool run_case(uint64_t seed, const flow_shape_t *shape,
		     flow_dtype_t dtype, const flow_mesh_t *sm,
		     const flow_nd_sbp_t *src, const flow_mesh_t *dm,
		     const flow_nd_sbp_t *dst, stats_t *stats)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_boxing_plan_t plan;
	if (flow_boxing_plan(shape, dtype, sm, src, dm, dst, NULL, &plan, &diag) != FLOW_OK) {
		char s[FLOW_SBP_TEXT_MAX], d[FLOW_SBP_TEXT_MAX];
		flow_nd_sbp_format(src, s, sizeof(s));
		flow_nd_sbp_format(dst, d, sizeof(d));
		fprintf(stderr, "seed %" PRIu64 ": %s -> %s: %s\n", seed, s, d,
			flow_diag_message(&diag));
		return false;
	}
	size_t nranks = (size_t)(flow_mesh_top_rank(sm) > flow_mesh_top_rank(dm) ? flow_mesh_top_rank(sm) : flow_mesh_top_rank(dm)) + 1;
	void **local = calloc(nranks, sizeof(*local));
	uint64_t *sent = calloc(nranks, sizeof(*sent));
	uint64_t *recvd = calloc(nranks, sizeof(*recvd));
	assert_true(local && sent && recvd);
	fill_sources(&plan, local);
	char why[256] = "";
	bool ok = steps_consistent(&plan, nranks, why, sizeof(why));
	if (ok && flow_boxing_simulate(&plan, local, nranks, sent, recvd, &diag) != FLOW_OK) {
		snprintf(why, sizeof(why), "simulate: %s", flow_diag_message(&diag));
		ok = false;
	}
	if (ok)
		ok = destinations_exact(&plan, local, why, sizeof(why));
	for (size_t r = 0; ok && r < nranks; r++) {
		uint64_t send = 0, recv = 0;
		for (size_t k = 0; k < plan.nsteps; k++) {
			uint64_t a, b;
			flow_boxing_step_rank_bytes(&plan, k, (int64_t)r, &a, &b);
			send += a;
			recv += b;
		}
		if (send != sent[r] || recv != recvd[r]) {
			snprintf(why, sizeof(why),
				 "rank %zu moved %" PRIu64 "/%" PRIu64 " bytes, the plan says %" PRIu64 "/%" PRIu64,
				 r, sent[r], recvd[r], send, recv);
			ok = false;
		}
	}
	if (!ok)
		describe(&plan, seed, why);
	stats->cases++;
	stats->steps += (long)plan.nsteps;
	stats->multi_step += plan.nsteps > 1;
	for (size_t k = 0; k < plan.nsteps; k++) {
		stats->send_recv += plan.steps[k].kind == FLOW_BOXING_SEND_RECV;
		stats->kinds[plan.steps[k].kind]++;
		stats->merged += __builtin_popcount(plan.steps[k].axes) > 1;
	}
	for (size_t r = 0; r < nranks; r++)
		flow_free(local[r]);
	free(recvd);
	free(sent);
	free(local);
	return ok;
}

/* One draw: a shape, a dtype, a source placement and a destination one
 * (the same, disjoint, overlapping, or another mesh over the same ranks),
 * then every pair of valid layouts, or a sample of them. */
static bool run_config(uint64_t seed, stats_t *stats)
{
	uint64_t s = seed;
	flow_shape_t shape = { .ndim = (int)splitmix64_range(&s, 1, 3) };
	/* Mostly small extents, so splits are uneven and nest; sometimes
	 * none at all, which no split accepts. */
	for (int d = 0; d < shape.ndim; d++) {
		int64_t kind = splitmix64_range(&s, 0, 39);
		shape.dims[d] = kind == 0 ? 0 : kind < 30 ? splitmix64_range(&s, 1, 5) : splitmix64_range(&s, 6, 13);
	}
	static const flow_dtype_t dtypes[] = { FLOW_DTYPE_F32, FLOW_DTYPE_I32, FLOW_DTYPE_I64 };
	flow_dtype_t dtype = dtypes[splitmix64_range(&s, 0, 2)];
	int64_t dims[3];
	int ndim = (int)splitmix64_range(&s, 1, 3);
	random_dims(&s, ndim, 16, dims);
	flow_mesh_t sm = make_mesh(ndim, dims, splitmix64_range(&s, 0, 3)), dm;
	if (ndim >= 2 && splitmix64_range(&s, 0, 4) == 0)
		sm = column_major(&sm);
	switch (splitmix64_range(&s, 0, 4)) {
	case 0:
	case 1:
		dm = sm;
		break;
	case 2: /* disjoint */
		ndim = (int)splitmix64_range(&s, 1, 3);
		random_dims(&s, ndim, 16, dims);
		dm = make_mesh(ndim, dims, flow_mesh_top_rank(&sm) + splitmix64_range(&s, 1, 3));
		break;
	case 3: /* overlapping */
		ndim = (int)splitmix64_range(&s, 1, 3);
		random_dims(&s, ndim, 16, dims);
		dm = make_mesh(ndim, dims, splitmix64_range(&s, sm.base, flow_mesh_top_rank(&sm)));
		break;
	default:
		dm = reshaped(&s, &sm);
		break;
	}
	static flow_nd_sbp_t from[MAX_LAYOUTS], to[MAX_LAYOUTS];
	size_t nf = all_layouts(&shape, &sm, from, MAX_LAYOUTS),
	       nt = all_layouts(&shape, &dm, to, MAX_LAYOUTS);
	bool ok = true;
	if (nf * nt <= ALL_PAIRS) {
		for (size_t a = 0; a < nf && ok; a++)
			for (size_t b = 0; b < nt && ok; b++)
				ok = run_case(seed, &shape, dtype, &sm, &from[a], &dm, &to[b], stats);
		return ok;
	}
	for (int k = 0; k < PAIRS_PER_CONFIG && ok; k++) {
		/* Drawn in separate statements: argument order is unspecified. */
		int64_t a = splitmix64_range(&s, 0, (int64_t)nf - 1);
		int64_t b = splitmix64_range(&s, 0, (int64_t)nt - 1);
		ok = run_case(seed, &shape, dtype, &sm, &from[a], &dm, &to[b], stats);
	}
	return ok;
}

static void test_boxing_sim_random_layouts_convert_exactly(void **state)
{
	(void)state;
	stats_t stats = { 0 };
	clock_t t0 = clock();
	long failures = 0;
	for (uint64_t k = 0; k < CONFIGS && failures < 5; k++)
		failures += !run_config(first_seed + k, &stats);
	double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
	printf("# %ld cases from seeds %" PRIu64 "..%" PRIu64 " in %.2f s: %ld steps, %ld multi-step plans, %ld send/recv steps, %ld steps on merged axes\n",
	       stats.cases, first_seed, first_seed + CONFIGS - 1, secs, stats.steps,
	       stats.multi_step, stats.send_recv, stats.merged);
	printf("#");
	for (int k = 0; k < FLOW_BOXING_KIND_COUNT; k++)
		printf(" %s %ld", flow_boxing_kind_name((flow_boxing_kind_t)k), stats.kinds[k]);
	printf("\n");
	assert_int_equal(failures, 0);
	assert_true(stats.cases >= 1000);
	/* Every kind the planner makes was exercised (it never makes a
	 * broadcast: test_boxing runs one by hand). */
	for (int k = 0; k < FLOW_BOXING_KIND_COUNT; k++)
		if (k != FLOW_BOXING_BROADCAST)
			assert_true(stats.kinds[k] > 0);
}

/* Exhaustive on one small configuration: every pair of layouts of a
 * (5,3) tensor on a 2x2 mesh, where nested splits are uneven. */
static void test_boxing_sim_every_pair_on_2x2(void **state)
{
	(void)state;
	flow_shape_t shape = { 2, { 5, 3 } };
	int64_t dims[2] = { 2, 2 };
	flow_mesh_t mesh = make_mesh(2, dims, 0);
	static flow_nd_sbp_t all[MAX_LAYOUTS];
	size_t n = all_layouts(&shape, &mesh, all, MAX_LAYOUTS);
	stats_t stats = { 0 };
	for (size_t a = 0; a < n; a++)
		for (size_t b = 0; b < n; b++)
			assert_true(run_case(0, &shape, FLOW_DTYPE_F32, &mesh, &all[a],
					     &mesh, &all[b], &stats));
	printf("# %ld pairs of %zu layouts of (5,3) on 2x2: %ld multi-step plans\n",
	       stats.cases, n, stats.multi_step);
}

int main(void)
{
	const char *seed = getenv("FLOW_TEST_SEED");
	if (seed && *seed) {
		int64_t v;
		if (flow_parse_int(seed, 0, INT64_MAX, &v, NULL) != FLOW_OK) {
			fprintf(stderr, "FLOW_TEST_SEED '%s' is not a seed\n", seed);
			return 1;
		}
		first_seed = (uint64_t)v;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_boxing_sim_every_pair_on_2x2),
		cmocka_unit_test(test_boxing_sim_random_layouts_convert_exactly),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
