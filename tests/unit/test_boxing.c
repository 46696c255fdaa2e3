/* Boxing plans: the 1-D table with its byte and time formulas, n-D
 * decomposition, normalisation, middle nodes, placements, the busiest
 * rank's bytes, the check of a plan in the reference executor (the
 * planner's plans pass it, tampered ones fail it with the exact message)
 * and plan printing.  The cluster profile's reader has test_cluster.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <flow/boxing.h>
#include <flow/mem.h>

#include "sbputil.h"

static void assert_near(double got, double want)
{
	if (fabs(got - want) > 1e-12 * fabs(want) + 1e-18)
		fail_msg("got %.15g, want %.15g", got, want);
}

/* The bytes each of ranks 0..n-1 sends and receives in step k. */
static void assert_rank_bytes(const flow_boxing_plan_t *plan, size_t k, int n,
			      const uint64_t *send, const uint64_t *recv)
{
	uint64_t max_send = 0, max_recv = 0, total = 0;
	for (int r = 0; r < n; r++) {
		uint64_t a, b;
		flow_boxing_step_rank_bytes(plan, k, r, &a, &b);
		if (a != send[r] || b != recv[r])
			fail_msg("step %zu rank %d: %llu/%llu bytes, want %llu/%llu", k, r,
				 (unsigned long long)a, (unsigned long long)b,
				 (unsigned long long)send[r], (unsigned long long)recv[r]);
		max_send = a > max_send ? a : max_send;
		max_recv = b > max_recv ? b : max_recv;
		total += a;
	}
	assert_int_equal(plan->steps[k].max_send_bytes, max_send);
	assert_int_equal(plan->steps[k].max_recv_bytes, max_recv);
	assert_int_equal(plan->steps[k].total_bytes, total);
}

static const double alpha = 5e-6, beta = 100e9; /* the default intra link */

/* ---- the 1-D table ------------------------------------------------------------ */

static void assert_one_step(const flow_boxing_plan_t *plan,
			    flow_boxing_kind_t kind, unsigned axes)
{
	assert_int_equal(plan->nsteps, 1);
	assert_string_equal(flow_boxing_kind_name(plan->steps[0].kind),
			    flow_boxing_kind_name(kind));
	assert_int_equal(plan->steps[0].axes, axes);
}

/* A (10,4) f32 tensor on 4 ranks: rows split 3,3,2,2 (12,12,8,8 elements,
 * T = 40), columns 1,1,1,1 (10 each). */
static void test_boxing_table_p_to_b_is_an_all_reduce(void **state)
{
	(void)state;
	flow_boxing_plan_t plan = plan_of("10,4", "4", "P", "4", "B", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_REDUCE, 1);
	/* Balanced split of 40 elements: 10 each; 2T - s_r - s_{r+1}. */
	static const uint64_t bytes[4] = { 240, 240, 240, 240 };
	assert_rank_bytes(&plan, 0, 4, bytes, bytes);
	assert_near(plan.steps[0].time_s, 6 * (alpha + 40 / beta));
	assert_near(plan.time_s, plan.steps[0].time_s);
	assert_int_equal(plan.total_bytes, 960);
}

static void test_boxing_table_p_to_s_is_a_reduce_scatter(void **state)
{
	(void)state;
	flow_boxing_plan_t plan = plan_of("10,4", "4", "P", "4", "S(0)", NULL);
	assert_one_step(&plan, FLOW_BOXING_REDUCE_SCATTER, 1);
	/* Sends T - s_r: 28,28,32,32; receives T - s_{r-1}: 32,28,28,32. */
	static const uint64_t send[4] = { 112, 112, 128, 128 };
	static const uint64_t recv[4] = { 128, 112, 112, 128 };
	assert_rank_bytes(&plan, 0, 4, send, recv);
	assert_near(plan.steps[0].time_s, 3 * (alpha + 48 / beta));
}

static void test_boxing_table_s_to_b_is_an_all_gather(void **state)
{
	(void)state;
	flow_boxing_plan_t plan = plan_of("10,4", "4", "S(0)", "4", "B", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_GATHER, 1);
	/* Sends T - s_{r+1}: 28,32,32,28; receives T - s_r: 28,28,32,32. */
	static const uint64_t send[4] = { 112, 128, 128, 112 };
	static const uint64_t recv[4] = { 112, 112, 128, 128 };
	assert_rank_bytes(&plan, 0, 4, send, recv);
	assert_near(plan.steps[0].time_s, 3 * (alpha + 48 / beta));
}

static void test_boxing_table_s_to_s_is_an_all_to_all(void **state)
{
	(void)state;
	flow_boxing_plan_t plan = plan_of("10,4", "4", "S(0)", "4", "S(1)", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_TO_ALL, 1);
	/* Rank q sends its rows of each other column: 3 rows_q; receives
	 * the other ranks' rows of its column: 10 - rows_q. */
	static const uint64_t send[4] = { 36, 36, 24, 24 };
	static const uint64_t recv[4] = { 28, 28, 32, 32 };
	assert_rank_bytes(&plan, 0, 4, send, recv);
	/* The largest message is 3 rows of one column. */
	assert_near(plan.steps[0].time_s, 3 * (alpha + 12 / beta));
}

static void test_boxing_table_local_rules_move_nothing(void **state)
{
	(void)state;
	static const struct {
		const char *from, *to;
		flow_boxing_kind_t kind;
	} cases[] = {
		{ "B", "S(0)", FLOW_BOXING_SLICE },
		{ "B", "S(1)", FLOW_BOXING_SLICE },
		{ "B", "P", FLOW_BOXING_ZERO_FILL },
		{ "S(0)", "P", FLOW_BOXING_PAD_ZERO },
	};
	static const uint64_t zero[4] = { 0 };
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		flow_boxing_plan_t plan = plan_of("10,4", "4", cases[i].from, "4", cases[i].to, NULL);
		assert_one_step(&plan, cases[i].kind, 1);
		assert_rank_bytes(&plan, 0, 4, zero, zero);
		assert_true(plan.steps[0].time_s == 0);
	}
	static const char *same[] = { "B", "P", "S(0)", "S(1)" };
	for (size_t i = 0; i < 4; i++) {
		flow_boxing_plan_t plan = plan_of("10,4", "4", same[i], "4", same[i], NULL);
		assert_int_equal(plan.nsteps, 0);
		assert_int_equal(plan.total_bytes, 0);
		assert_true(plan.time_s == 0);
	}
}

/* The worked example of flow(7), COSTS. */
static void test_boxing_worked_example_4mib_all_reduce(void **state)
{
	(void)state;
	flow_boxing_plan_t plan = plan_of("1048576", "4", "P", "4", "B", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_REDUCE, 1);
	static const uint64_t bytes[4] = { 6291456, 6291456, 6291456, 6291456 };
	assert_rank_bytes(&plan, 0, 4, bytes, bytes);
	assert_int_equal(plan.total_bytes, 25165824);
	assert_near(plan.time_s, 92.91456e-6);
}

static void test_boxing_link_class_follows_the_nodes_a_group_spans(void **state)
{
	(void)state;
	flow_cluster_t c;
	flow_cluster_default(&c);
	c.ranks_per_node = 2;
	/* Ranks 0..3 span two nodes: the slower link for every ring step. */
	flow_boxing_plan_t plan = plan_of("1048576", "4", "P", "4", "B", &c);
	assert_near(plan.time_s, 6 * (c.inter.alpha_s + 1048576.0 / c.inter.beta_bps));
	/* On a 2x2 mesh the axis-1 groups {0,1}, {2,3} stay on a node. */
	plan = plan_of("8,4", "2x2", "(B,P)", "2x2", "(B,B)", &c);
	assert_one_step(&plan, FLOW_BOXING_ALL_REDUCE, 2);
	assert_near(plan.time_s, 2 * (alpha + 64 / beta));
}

/* ---- n-D -------------------------------------------------------------------------- */

static void test_boxing_2d_one_all_reduce_per_column_group(void **state)
{
	(void)state;
	/* (8,8) on 4x2: each column group (ranks {0,2,4,6}, {1,3,5,7})
	 * all-reduces its 4 rows x 8 = 32 elements, 8 a piece. */
	flow_boxing_plan_t plan = plan_of("8,8", "4x2", "(P,S(0))", "4x2", "(B,S(0))", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_REDUCE, 1u << 0);
	uint64_t bytes[8];
	for (int r = 0; r < 8; r++)
		bytes[r] = 2 * (32 - 8) * 4;
	assert_rank_bytes(&plan, 0, 8, bytes, bytes);
	assert_near(plan.time_s, 6 * (alpha + 32 / beta));

	/* And per row group on the inner axis. */
	plan = plan_of("8,8", "2x4", "(S(0),P)", "2x4", "(S(0),B)", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_REDUCE, 1u << 1);
}

static void test_boxing_normalisation_drops_size_1_axes(void **state)
{
	(void)state;
	/* Size-1 axes hold one copy whatever their SBP. */
	flow_boxing_plan_t plan = plan_of("8,4", "1x4", "(S(1),P)", "1x4", "(B,B)", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_REDUCE, 1u << 1);
	flow_nd_sbp_t src = sbp_of("(S(1),P)"), dst = sbp_of("(B,B)");
	assert_true(flow_nd_sbp_equal(&plan.steps[0].from, &src));
	assert_true(flow_nd_sbp_equal(&plan.steps[0].to, &dst));
	plan = plan_of("8,4", "1x4x1", "(S(0),S(1),P)", "1x4x1", "(B,S(1),S(0))", NULL);
	assert_int_equal(plan.nsteps, 0);
	plan = plan_of("8,4", "1", "P", "1", "S(1)", NULL);
	assert_int_equal(plan.nsteps, 0);
}

static void test_boxing_normalisation_merges_equal_axes(void **state)
{
	(void)state;
	/* (P,P) -> (B,B): one all-reduce over all 4 ranks. */
	flow_boxing_plan_t plan = plan_of("8,8", "2x2", "(P,P)", "2x2", "(B,B)", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_REDUCE, 3);
	static const uint64_t ar[4] = { 384, 384, 384, 384 };
	assert_rank_bytes(&plan, 0, 4, ar, ar);

	/* 8 rows split over 2x2 as over 4: one all-gather over 4 ranks. */
	plan = plan_of("8,3", "2x2", "(S(0),S(0))", "2x2", "(B,B)", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_GATHER, 3);

	/* 6 rows split 2,1,2,1 over 2x2 but 2,2,1,1 over 4: no merge, two
	 * all-gathers, inner axis first. */
	plan = plan_of("6,3", "2x2", "(S(0),S(0))", "2x2", "(B,B)", NULL);
	assert_int_equal(plan.nsteps, 2);
	assert_int_equal(plan.steps[0].kind, FLOW_BOXING_ALL_GATHER);
	assert_int_equal(plan.steps[0].axes, 2);
	assert_int_equal(plan.steps[1].kind, FLOW_BOXING_ALL_GATHER);
	assert_int_equal(plan.steps[1].axes, 1);
	flow_nd_sbp_t mid = sbp_of("(S(0),B)");
	assert_true(flow_nd_sbp_equal(&plan.steps[0].to, &mid));

	/* 7 rows: 7 mod 4 = 3 = ab-1, which merges (4,3 -> 2,2,2,1). */
	plan = plan_of("7,3", "2x2", "(S(0),S(0))", "2x2", "(B,B)", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_GATHER, 3);
	/* 13 rows on 2x4: 7 -> 2,2,2,1 and 6 -> 2,2,1,1, unlike 2,2,2,2,2,1,1,1. */
	plan = plan_of("13", "2x4", "(S(0),S(0))", "2x4", "(B,B)", NULL);
	assert_int_equal(plan.nsteps, 2);
}

/* Plain layouts (no P) on one placement: fill each source with its slice
 * of 0..n-1, run the plan, and require each destination's slice. */
static void assert_simulates(const flow_boxing_plan_t *plan)
{
	const flow_mesh_t *sm = &plan->src_mesh, *dm = &plan->dst_mesh;
	size_t nranks = 64;
	void *local[64] = { 0 };
	uint64_t sent[64], recvd[64];
	for (int pass = 0; pass < 2; pass++) {
		const flow_mesh_t *m = pass ? dm : sm;
		const flow_nd_sbp_t *x = pass ? &plan->dst : &plan->src;
		for (int64_t i = 0; i < flow_mesh_size(m); i++) {
			flow_box_t b;
			flow_nd_sbp_local_box(&plan->shape, x, m, i, &b);
			int64_t r = flow_mesh_rank(m, i);
			int64_t n = b.extent[0] * b.extent[1];
			if (!pass) {
				local[r] = flow_calloc((size_t)n, sizeof(float));
				assert_non_null(local[r]);
			}
			for (int64_t e = 0; e < n; e++) {
				float v = (float)((b.start[0] + e / b.extent[1]) * plan->shape.dims[1] +
						  b.start[1] + e % b.extent[1]);
				if (!pass)
					((float *)local[r])[e] = v;
				else
					assert_true(((float *)local[r])[e] == v);
			}
		}
		if (!pass) {
			flow_diag_t diag = FLOW_DIAG_INIT;
			if (flow_boxing_simulate(plan, local, nranks, sent, recvd, &diag) != FLOW_OK)
				fail_msg("%s", diag.msg);
		}
	}
	for (size_t r = 0; r < nranks; r++) {
		uint64_t send = 0, recv = 0;
		for (size_t k = 0; k < plan->nsteps; k++) {
			uint64_t a, b;
			flow_boxing_step_rank_bytes(plan, k, (int64_t)r, &a, &b);
			send += a;
			recv += b;
		}
		assert_int_equal(sent[r], send);
		assert_int_equal(recvd[r], recv);
		flow_free(local[r]);
	}
}

static void test_boxing_nested_splits_route_through_middle_nodes(void **state)
{
	(void)state;
	/* 6 rows and columns over 2x2 do not merge, and changing either axis
	 * alone is illegal while the other splits the same dimension: the
	 * route goes through other nd-SBPs, each valid, each step legal. */
	flow_boxing_plan_t plan = plan_of("6,6", "2x2", "(S(0),S(0))", "2x2", "(S(1),S(1))", NULL);
	assert_true(plan.nsteps >= 2);
	for (size_t k = 0; k < plan.nsteps; k++) {
		const flow_boxing_step_t *st = &plan.steps[k];
		assert_int_not_equal(st->kind, FLOW_BOXING_SEND_RECV);
		assert_int_equal(flow_nd_sbp_check(&plan.shape, &st->to, &plan.src_mesh, NULL), FLOW_OK);
		for (int i = 0; i < 2; i++) {
			bool changed = !flow_sbp_equal(st->from.sbp[i], st->to.sbp[i]);
			assert_int_equal(changed, (st->axes >> i) & 1);
		}
	}
	assert_simulates(&plan);
	/* The same on 4x4, where the splits merge: one all-to-all. */
	plan = plan_of("16,16", "4x4", "(S(0),S(0))", "4x4", "(S(1),S(1))", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_TO_ALL, 3);
	assert_simulates(&plan);
	/* Only the outer axis changes, but the inner one splits the same
	 * dimension: no collective does it in one step, so the fallback, a
	 * send/recv of slice intersections, competes with middle nodes. */
	plan = plan_of("6,6", "2x2", "(S(0),S(0))", "2x2", "(S(1),S(0))", NULL);
	assert_true(plan.nsteps >= 2 || plan.steps[0].kind == FLOW_BOXING_SEND_RECV);
	assert_simulates(&plan);
	/* The inner axis may change under an outer split of its dimension. */
	plan = plan_of("6,6", "2x2", "(S(0),S(0))", "2x2", "(S(0),B)", NULL);
	assert_one_step(&plan, FLOW_BOXING_ALL_GATHER, 2);
	assert_simulates(&plan);
}

/* ---- placements ------------------------------------------------------------------- */

static void test_boxing_different_placements_use_send_recv(void **state)
{
	(void)state;
	/* Disjoint: rank j of 4..7 gathers column j from ranks 0..3. */
	flow_boxing_plan_t plan = plan_of("10,4", "4", "S(0)", "4@4", "S(1)", NULL);
	assert_one_step(&plan, FLOW_BOXING_SEND_RECV, 0);
	assert_true(flow_mesh_equal(&plan.steps[0].to_mesh, &plan.dst_mesh));
	static const uint64_t send[8] = { 48, 48, 32, 32, 0, 0, 0, 0 };
	static const uint64_t recv[8] = { 0, 0, 0, 0, 40, 40, 40, 40 };
	assert_rank_bytes(&plan, 0, 8, send, recv);
	/* Each receiver takes 4 messages; the busiest rank moves 48 bytes. */
	assert_near(plan.time_s, 4 * alpha + 48 / beta);
	assert_simulates(&plan);

	/* A B source: each receiver reads one replica, spread over them. */
	plan = plan_of("4,4", "2", "B", "2@2", "B", NULL);
	assert_one_step(&plan, FLOW_BOXING_SEND_RECV, 0);
	static const uint64_t send_b[4] = { 64, 64, 0, 0 };
	static const uint64_t recv_b[4] = { 0, 0, 64, 64 };
	assert_rank_bytes(&plan, 0, 4, send_b, recv_b);

	/* Another mesh over the same ranks, with the same pieces: a
	 * send/recv that moves nothing. */
	plan = plan_of("8,3", "4", "S(0)", "2x2", "(S(0),S(0))", NULL);
	assert_one_step(&plan, FLOW_BOXING_SEND_RECV, 0);
	assert_int_equal(plan.total_bytes, 0);
	assert_true(plan.time_s == 0);
	assert_simulates(&plan);

	/* Overlapping, column-major destination. */
	plan = plan_of("5,6", "2x2", "(S(1),S(0))", "2x3@2/1x2", "(S(0),S(1))", NULL);
	assert_simulates(&plan);
}

static void test_boxing_partial_destinations_finish_locally(void **state)
{
	(void)state;
	/* Send/recv delivers no P: a P destination is reached locally after
	 * it, here by pad-zero from the smaller S(0) pieces. */
	flow_boxing_plan_t plan = plan_of("64,64", "4", "P", "4@4", "P", NULL);
	assert_int_equal(plan.nsteps, 2);
	assert_int_equal(plan.steps[0].kind, FLOW_BOXING_SEND_RECV);
	assert_int_equal(plan.steps[1].kind, FLOW_BOXING_PAD_ZERO);
	/* A P source's addends are summed by the receivers: each of ranks
	 * 4..7 takes its 16 rows from all 4 sources. */
	static const uint64_t send[8] = { 16384, 16384, 16384, 16384, 0, 0, 0, 0 };
	static const uint64_t recv[8] = { 0, 0, 0, 0, 16384, 16384, 16384, 16384 };
	assert_rank_bytes(&plan, 0, 8, send, recv);
	/* A large P source on one node, B destination on another: reduce on
	 * the fast links first, then send one copy. */
	plan = plan_of("64,64", "8", "P", "8@8", "B", NULL);
	assert_int_equal(plan.nsteps, 2);
	assert_int_equal(plan.steps[0].kind, FLOW_BOXING_ALL_REDUCE);
	assert_int_equal(plan.steps[1].kind, FLOW_BOXING_SEND_RECV);
}

/* ---- the reference executor ------------------------------------------------------------ */

static void test_boxing_simulate_runs_a_broadcast_chain(void **state)
{
	(void)state;
	/* The planner makes no broadcast step; a plan written by hand: rank
	 * 0's data reaches ranks 1..3, each hop carrying T. */
	flow_boxing_plan_t plan;
	memset(&plan, 0, sizeof(plan));
	assert_int_equal(flow_shape_parse("3,2", &plan.shape, NULL), FLOW_OK);
	plan.dtype = FLOW_DTYPE_I32;
	plan.src_mesh = plan.dst_mesh = mesh_of("4");
	plan.src = plan.dst = sbp_of("B");
	plan.nsteps = 1;
	plan.steps[0] = (flow_boxing_step_t){ .kind = FLOW_BOXING_BROADCAST, .axes = 1,
					      .mesh = plan.src_mesh, .from = plan.src,
					      .to_mesh = plan.dst_mesh, .to = plan.dst };
	void *local[4];
	for (int r = 0; r < 4; r++) {
		local[r] = flow_calloc(6, sizeof(int32_t));
		assert_non_null(local[r]);
		for (int e = 0; e < 6; e++)
			((int32_t *)local[r])[e] = r == 0 ? e * 11 : -1;
	}
	uint64_t sent[4], recvd[4];
	assert_int_equal(flow_boxing_simulate(&plan, local, 4, sent, recvd, NULL), FLOW_OK);
	static const uint64_t send[4] = { 24, 24, 24, 0 }, recv[4] = { 0, 24, 24, 24 };
	for (int r = 0; r < 4; r++) {
		for (int e = 0; e < 6; e++)
			assert_int_equal(((int32_t *)local[r])[e], e * 11);
		assert_int_equal(sent[r], send[r]);
		assert_int_equal(recvd[r], recv[r]);
		uint64_t a, b;
		flow_boxing_step_rank_bytes(&plan, 0, r, &a, &b);
		assert_true(a == send[r] && b == recv[r]);
		flow_free(local[r]);
	}
}

static void test_boxing_simulate_sums_partial_integers_exactly(void **state)
{
	(void)state;
	/* i64 values beyond float precision: P -> S(0) -> the sums. */
	flow_boxing_plan_t plan = plan_of("5", "2", "P", "2", "S(0)", NULL);
	plan.dtype = FLOW_DTYPE_I64;
	void *local[2];
	for (int r = 0; r < 2; r++) {
		local[r] = flow_calloc(5, sizeof(int64_t));
		assert_non_null(local[r]);
		for (int e = 0; e < 5; e++)
			((int64_t *)local[r])[e] = r == 0 ? ((int64_t)1 << 60) + e : -e * 2;
	}
	assert_int_equal(flow_boxing_simulate(&plan, local, 2, NULL, NULL, NULL), FLOW_OK);
	/* Rank 0 holds rows 0..2, rank 1 rows 3..4. */
	for (int e = 0; e < 5; e++) {
		int64_t got = e < 3 ? ((int64_t *)local[0])[e] : ((int64_t *)local[1])[e - 3];
		assert_true(got == ((int64_t)1 << 60) - e);
	}
	flow_free(local[0]);
	flow_free(local[1]);
}

static void test_boxing_simulate_rejects_too_few_ranks(void **state)
{
	(void)state;
	flow_boxing_plan_t plan = plan_of("4", "2", "S(0)", "2@2", "B", NULL);
	void *local[2] = { NULL, NULL };
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_boxing_simulate(&plan, local, 2, NULL, NULL, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "boxing simulation: step 1 reaches rank 3 of 2 simulated ranks");
	void *more[4] = { NULL, NULL, NULL, NULL };
	flow_diag_clear(&diag);
	assert_int_equal(flow_boxing_simulate(&plan, more, 4, NULL, NULL, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "boxing simulation: rank 0 holds no buffer");
}

/* ---- errors, names, rank bytes ------------------------------------------------------ */

static void test_boxing_plan_rejects_invalid_layouts(void **state)
{
	(void)state;
	flow_shape_t s;
	assert_int_equal(flow_shape_parse("6,8", &s, NULL), FLOW_OK);
	flow_mesh_t m = mesh_of("2x4");
	flow_nd_sbp_t ok = sbp_of("(B,B)"), bad = sbp_of("(S(0),S(0))");
	flow_boxing_plan_t plan;
	memset(&plan, 0x77, sizeof(plan));
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_boxing_plan(&s, FLOW_DTYPE_F32, &m, &ok, &m, &bad, NULL, &plan, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "(S(0),S(0)) on 2x4: dimension 0 of (6,8) has 3 rows left for 4 ranks of axis 1");
	assert_int_equal(plan.nsteps, 0x7777777777777777u); /* untouched */
	flow_diag_clear(&diag);
	assert_int_equal(flow_boxing_plan(&s, (flow_dtype_t)99, &m, &ok, &m, &ok, NULL, &plan, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "boxing: unknown dtype 99");
	flow_cluster_t c;
	flow_cluster_default(&c);
	c.inter.beta_bps = 0;
	flow_diag_clear(&diag);
	assert_int_equal(flow_boxing_plan(&s, FLOW_DTYPE_F32, &m, &ok, &m, &ok, &c, &plan, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "boxing: link latency 1e-05 s, bandwidth 0 B/s: expected a latency >= 0 and a bandwidth > 0");
}

static void test_boxing_kind_names(void **state)
{
	(void)state;
	static const char *names[FLOW_BOXING_KIND_COUNT] = {
		"all-reduce", "reduce-scatter", "all-gather", "all-to-all", "broadcast",
		"slice", "zero-fill", "pad-zero", "send-recv",
	};
	for (int k = 0; k < FLOW_BOXING_KIND_COUNT; k++)
		assert_string_equal(flow_boxing_kind_name((flow_boxing_kind_t)k), names[k]);
	assert_string_equal(flow_boxing_kind_name((flow_boxing_kind_t)FLOW_BOXING_KIND_COUNT), "unknown");
}

static void test_boxing_rank_bytes_outside_the_step_are_zero(void **state)
{
	(void)state;
	flow_boxing_plan_t plan = plan_of("8", "4@4", "S(0)", "4@4", "B", NULL);
	uint64_t a = 1, b = 1;
	flow_boxing_step_rank_bytes(&plan, 0, 2, &a, &b);
	assert_true(a == 0 && b == 0);
	flow_boxing_step_rank_bytes(&plan, 0, 5, &a, &b);
	assert_true(a == 24 && b == 24);
	flow_boxing_step_rank_bytes(&plan, 1, 5, &a, &b);
	assert_true(a == 0 && b == 0);
}

/* ---- whole-plan bytes per rank ---------------------------------------------------- */

static void test_boxing_plan_rank_bytes_sum_the_steps(void **state)
{
	(void)state;
	/* Two all-gathers: on tp, ranks 0 and 2 send their 6 elements and
	 * receive 3, ranks 1 and 3 the other way round; then every rank 9
	 * elements each way on dp. */
	flow_boxing_plan_t plan = plan_of("6,3", "2x2:dp,tp", "(S(0),S(0))", "2x2:dp,tp", "(B,B)", NULL);
	uint64_t send, recv;
	assert_int_equal(plan.nsteps, 2);
	for (int64_t r = 0; r < 4; r++) {
		uint64_t want_send = 0, want_recv = 0;
		for (size_t k = 0; k < plan.nsteps; k++) {
			uint64_t a, b;
			flow_boxing_step_rank_bytes(&plan, k, r, &a, &b);
			want_send += a;
			want_recv += b;
		}
		flow_boxing_plan_rank_bytes(&plan, r, &send, &recv);
		assert_int_equal(send, want_send);
		assert_int_equal(recv, want_recv);
	}
	flow_boxing_plan_rank_bytes(&plan, 0, &send, &recv);
	assert_int_equal(send, 60);
	assert_int_equal(recv, 48);
	flow_boxing_plan_rank_bytes(&plan, 1, &send, &recv);
	assert_int_equal(send, 48);
	assert_int_equal(recv, 60);
	/* The busiest sender and receiver are different ranks. */
	flow_boxing_plan_busiest(&plan, &send, &recv);
	assert_int_equal(send, 60);
	assert_int_equal(recv, 60);
	flow_boxing_plan_rank_bytes(&plan, 4, &send, &recv);
	assert_int_equal(send, 0);
	assert_int_equal(recv, 0);
}

static void test_boxing_plan_busiest_takes_each_placement_s_ranks(void **state)
{
	(void)state;
	/* Ranks 0 and 1 send their 2 elements to both of ranks 2 and 3, of
	 * the other placement. */
	flow_boxing_plan_t plan = plan_of("4", "2", "S(0)", "2@2", "B", NULL);
	uint64_t send, recv;
	flow_boxing_plan_rank_bytes(&plan, 0, &send, &recv);
	assert_int_equal(send, 16);
	assert_int_equal(recv, 0);
	flow_boxing_plan_rank_bytes(&plan, 3, &send, &recv);
	assert_int_equal(send, 0);
	assert_int_equal(recv, 16);
	flow_boxing_plan_busiest(&plan, &send, &recv);
	assert_int_equal(send, 16);
	assert_int_equal(recv, 16);

	/* An empty plan moves nothing. */
	plan = plan_of("8", "3", "B", "3", "B", NULL);
	assert_int_equal(plan.nsteps, 0);
	flow_boxing_plan_busiest(&plan, &send, &recv);
	assert_int_equal(send, 0);
	assert_int_equal(recv, 0);

	/* Rank by rank, the busiest is the largest sum on each side. */
	plan = plan_of("7,5", "2x2", "(P,S(0))", "2x2", "(S(1),B)", NULL);
	uint64_t max_send = 0, max_recv = 0;
	for (int64_t r = 0; r < 4; r++) {
		flow_boxing_plan_rank_bytes(&plan, r, &send, &recv);
		max_send = send > max_send ? send : max_send;
		max_recv = recv > max_recv ? recv : max_recv;
	}
	flow_boxing_plan_busiest(&plan, &send, &recv);
	assert_true(max_send > 0 && max_recv > 0);
	assert_int_equal(send, max_send);
	assert_int_equal(recv, max_recv);
}

/* ---- printing ------------------------------------------------------------------------- */

static void test_boxing_plan_print_is_tsv_with_a_total(void **state)
{
	(void)state;
	flow_boxing_plan_t plan = plan_of("6,3", "2x2:dp,tp", "(S(0),S(0))", "2x2:dp,tp", "(B,B)", NULL);
	FILE *f = tmpfile();
	assert_non_null(f);
	assert_int_equal(flow_boxing_plan_print(&plan, f, NULL), FLOW_OK);
	rewind(f);
	char text[1024] = "";
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	/* Axis 1 groups gather 6,3 / 3,3 elements, axis 0 groups 9,9. */
	assert_string_equal(text,
		"step\tkind\taxes\tfrom\tto\tmax_send_bytes\tmax_recv_bytes\ttotal_bytes\ttime_us\n"
		"1\tall-gather\ttp\t(S(0),S(0))\t(S(0),B)\t24\t24\t72\t5.000\n"
		"2\tall-gather\tdp\t(S(0),B)\t(B,B)\t36\t36\t144\t5.000\n"
		"total\t-\t-\t(S(0),S(0))\t(B,B)\t60\t60\t216\t10.001\n");

	/* Between placements the layouts name their meshes. */
	plan = plan_of("4", "2", "S(0)", "2@2", "B", NULL);
	f = tmpfile();
	assert_non_null(f);
	assert_int_equal(flow_boxing_plan_print(&plan, f, NULL), FLOW_OK);
	rewind(f);
	n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	assert_non_null(strstr(text, "1\tsend-recv\t-\t(S(0)) on 2\t(B) on 2@2\t16\t16\t32\t"));

	/* A stream that cannot be written. */
	f = fopen("/dev/null", "r");
	assert_non_null(f);
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_boxing_plan_print(&plan, f, &diag), FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "cannot write boxing plan"));
	fclose(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_boxing_table_p_to_b_is_an_all_reduce),
		cmocka_unit_test(test_boxing_table_p_to_s_is_a_reduce_scatter),
		cmocka_unit_test(test_boxing_table_s_to_b_is_an_all_gather),
		cmocka_unit_test(test_boxing_table_s_to_s_is_an_all_to_all),
		cmocka_unit_test(test_boxing_table_local_rules_move_nothing),
		cmocka_unit_test(test_boxing_worked_example_4mib_all_reduce),
		cmocka_unit_test(test_boxing_link_class_follows_the_nodes_a_group_spans),
		cmocka_unit_test(test_boxing_2d_one_all_reduce_per_column_group),
		cmocka_unit_test(test_boxing_normalisation_drops_size_1_axes),
		cmocka_unit_test(test_boxing_normalisation_merges_equal_axes),
		cmocka_unit_test(test_boxing_nested_splits_route_through_middle_nodes),
		cmocka_unit_test(test_boxing_different_placements_use_send_recv),
		cmocka_unit_test(test_boxing_partial_destinations_finish_locally),
		cmocka_unit_test(test_boxing_simulate_runs_a_broadcast_chain),
		cmocka_unit_test(test_boxing_simulate_sums_partial_integers_exactly),
		cmocka_unit_test(test_boxing_simulate_rejects_too_few_ranks),
		cmocka_unit_test(test_boxing_plan_rejects_invalid_layouts),
		cmocka_unit_test(test_boxing_kind_names),
		cmocka_unit_test(test_boxing_rank_bytes_outside_the_step_are_zero),
		cmocka_unit_test(test_boxing_plan_rank_bytes_sum_the_steps),
		cmocka_unit_test(test_boxing_plan_busiest_takes_each_placement_s_ranks),
		cmocka_unit_test(test_boxing_plan_print_is_tsv_with_a_total),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
