/* Live ranges and the memory plan.  The central property is checked
 * exhaustively, pair by pair: no two transient tensors that are live at the
 * same op share a byte (an in-place alias shares its target's bytes by
 * design, and the losses stay intact to the end of the step).  Checked on a
 * hand-built GPT-like graph and on random op chains; plus alignment, the
 * totals, exact small plans and determinism. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/graph.h>
#include <flow/kernels.h>

#include "graphutil.h"

/* The graph helpers fail the current test. */
static void fail_graph(const char *msg)
{
	fail_msg("%s", msg);
}

static void plan_build(const flow_graph_t *g, flow_memplan_t *plan)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	if (flow_memplan_build(g, plan, &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
}

static bool transient(flow_role_t role)
{
	return role == FLOW_ROLE_ACTIVATION || role == FLOW_ROLE_SAVED ||
	       role == FLOW_ROLE_GRAD;
}

static size_t align64(size_t n)
{
	return (n + 63) / 64 * 64;
}

/* ---- the checker ---------------------------------------------------------- */

static bool alias_related(const flow_graph_t *g, int a, int b)
{
	return g->tensors[a].alias_of == b || g->tensors[b].alias_of == a;
}

static bool bytes_overlap(const flow_graph_t *g, const flow_memplan_t *p,
			  int a, int b)
{
	size_t sa = flow_graph_tensor_bytes(g, a);
	size_t sb = flow_graph_tensor_bytes(g, b);

	return sa && sb && p->offset[a] < p->offset[b] + sb &&
	       p->offset[b] < p->offset[a] + sa;
}

/* Every property of a plan of g, every pair of tensors. */
static void check_plan(const flow_graph_t *g, const flow_memplan_t *p)
{
	size_t n = g->ntensors, unshared = 0, persistent = 0;
	int *first = calloc(n, sizeof(int)), *last = calloc(n, sizeof(int));

	assert_non_null(first);
	assert_non_null(last);
	assert_int_equal(p->ntensors, n);
	for (size_t t = 0; t < n; t++) {
		const flow_graph_tensor_t *x = &g->tensors[t];
		size_t bytes = align64(flow_graph_tensor_bytes(g, (int)t));

		flow_graph_live_range(g, (int)t, &first[t], &last[t]);
		if (!transient(x->role)) {
			persistent += bytes;
			assert_true(p->offset[t] == SIZE_MAX);
			continue;
		}
		if (x->alias_of >= 0) {
			assert_int_equal(p->offset[t], p->offset[x->alias_of]);
			continue;
		}
		unshared += bytes;
		assert_true(p->offset[t] != SIZE_MAX);
		assert_int_equal(p->offset[t] % 64, 0);
		assert_true(p->offset[t] + bytes <= p->arena_bytes);
	}
	assert_int_equal(p->unshared_bytes, unshared);
	assert_int_equal(p->persistent_bytes, persistent);

	for (size_t a = 0; a < n; a++) {
		if (!transient(g->tensors[a].role))
			continue;
		for (size_t b = a + 1; b < n; b++) {
			if (!transient(g->tensors[b].role) ||
			    alias_related(g, (int)a, (int)b))
				continue;
			bool live_together = first[a] >= 0 && first[b] >= 0 &&
					     first[a] <= last[b] &&
					     first[b] <= last[a];
			if (live_together && bytes_overlap(g, p, (int)a, (int)b))
				fail_msg("'%s' [%d,%d] @%zu and '%s' [%d,%d] "
					 "@%zu share bytes while both live",
					 g->tensors[a].name, first[a], last[a],
					 p->offset[a], g->tensors[b].name,
					 first[b], last[b], p->offset[b]);
		}
	}
	/* The losses are read after the pass: nothing written after them
	 * may take their bytes. */
	if (g->loss >= 0) {
		for (size_t t = 0; t < n; t++) {
			if (!transient(g->tensors[t].role) ||
			    (int)t == g->loss || first[t] < first[g->loss])
				continue;
			if (bytes_overlap(g, p, (int)t, g->loss))
				fail_msg("'%s' overwrites the losses",
					 g->tensors[t].name);
		}
	}
	/* No plan beats the peak: at each op, what is live must fit. */
	for (size_t i = 0; i < g->nops; i++) {
		size_t live = 0;
		for (size_t t = 0; t < n; t++)
			if (transient(g->tensors[t].role) &&
			    g->tensors[t].alias_of < 0 && first[t] <= (int)i &&
			    (int)i <= last[t])
				live += align64(flow_graph_tensor_bytes(g, (int)t));
		assert_true(live <= p->arena_bytes);
	}
	free(first);
	free(last);
}

/* ---- a GPT-like graph ------------------------------------------------- */

static const graphutil_gpt_t gpt_small = { .layers = 3, .B = 2, .T = 8,
					   .C = 24, .heads = 3, .V = 50,
					   .Vp = 64 };

static void test_memplan_gpt_graph_never_shares_live_bytes(void **state)
{
	flow_graph_t g;
	flow_memplan_t plan;

	(void)state;
	graphutil_gpt_build(&g, &gpt_small, true);
	plan_build(&g, &plan);
	check_plan(&g, &plan);
	/* Sharing pays: the arena is well below the sum of the tensors. */
	assert_true(plan.arena_bytes < plan.unshared_bytes / 2);
	assert_int_equal(plan.scratch_bytes,
			 flow_cpu_attention_scratch_bound(2, 8, 24, 3, true));
	/* The in-place logits gradient shares the logits' bytes. */
	int logits = flow_graph_find(&g, "lm_head.out");
	int dlogits = flow_graph_find(&g, "loss.dlogits");
	assert_int_equal(g.tensors[dlogits].alias_of, logits);
	assert_int_equal(plan.offset[dlogits], plan.offset[logits]);
	flow_memplan_release(&plan);
	flow_memplan_release(&plan); /* released twice is fine */
	flow_graph_release(&g);
}

static void test_memplan_is_deterministic(void **state)
{
	flow_graph_t g1, g2;
	flow_memplan_t p1, p2, p3;

	(void)state;
	graphutil_gpt_build(&g1, &gpt_small, true);
	graphutil_gpt_build(&g2, &gpt_small, true);
	plan_build(&g1, &p1);
	plan_build(&g1, &p2);
	plan_build(&g2, &p3);
	assert_int_equal(p1.arena_bytes, p2.arena_bytes);
	assert_int_equal(p1.arena_bytes, p3.arena_bytes);
	assert_memory_equal(p1.offset, p2.offset,
			    g1.ntensors * sizeof(*p1.offset));
	assert_memory_equal(p1.offset, p3.offset,
			    g1.ntensors * sizeof(*p1.offset));
	flow_memplan_release(&p1);
	flow_memplan_release(&p2);
	flow_memplan_release(&p3);
	flow_graph_release(&g1);
	flow_graph_release(&g2);
}

/* ---- random chains ---------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
	*s = *s * 6364136223846793005u + 1442695040888963407u;
	return *s >> 33;
}

static int rng_below(uint64_t *s, int n)
{
	return (int)(rng_next(s) % (uint64_t)n);
}

/* A chain of random ops over a pool of f32 tensors: every op reads tensors
 * already made (so ranges interleave), some params join on the way, and
 * the chain ends in a loss or is differentiated from its last output. */
static void random_graph(flow_graph_t *g, uint64_t seed)
{
	uint64_t s = seed;
	flow_diag_t diag = FLOW_DIAG_INIT;
	int pool[64], npool = 0, nparams = 0;
	char name[32];

	flow_graph_init(g);
	int B = 1 + rng_below(&s, 3), T = 1 + rng_below(&s, 4);
	int C = 3 * (1 + rng_below(&s, 3));
	pool[npool++] = PARAM(g, "x", B, T, C);
	int nops = 3 + rng_below(&s, 14);
	for (int i = 0; i < nops; i++) {
		int x = pool[rng_below(&s, npool)];
		const flow_shape_t *sh = &g->tensors[x].shape;
		int64_t last = sh->dims[sh->ndim - 1];
		int y = -1;
		snprintf(name, sizeof(name), "op%d", i);
		switch (rng_below(&s, 5)) {
		case 0:
			y = OP(g, FLOW_OP_GELU, name, x);
			break;
		case 1: { /* add x to an equal-shaped tensor, or a new param */
			int other = -1;
			for (int k = 0; k < npool; k++)
				if (pool[k] != x &&
				    flow_shape_equal(&g->tensors[pool[k]].shape,
						     sh))
					other = pool[k];
			if (other < 0 || rng_below(&s, 3) == 0) {
				snprintf(name, sizeof(name), "p%d", nparams++);
				other = graphutil_tensor(g, name,
							 FLOW_ROLE_PARAM,
							 FLOW_DTYPE_F32,
							 sh->ndim, sh->dims);
				snprintf(name, sizeof(name), "op%d", i);
			}
			y = OP(g, FLOW_OP_ADD, name, x, other);
			break;
		}
		case 2: { /* matmul to a new width, a multiple of 3 sometimes */
			int out = 1 + rng_below(&s, 9);
			snprintf(name, sizeof(name), "w%d", nparams++);
			int w = PARAM(g, name, out, last);
			snprintf(name, sizeof(name), "op%d", i);
			y = OP(g, FLOW_OP_MATMUL, name, x, w, -1);
			break;
		}
		case 3: {
			snprintf(name, sizeof(name), "lw%d", nparams);
			int w = PARAM(g, name, last);
			snprintf(name, sizeof(name), "lb%d", nparams++);
			int b = PARAM(g, name, last);
			snprintf(name, sizeof(name), "op%d", i);
			y = OP(g, FLOW_OP_LAYERNORM, name, x, w, b);
			break;
		}
		default: /* attention where the shape allows */
			if (sh->ndim == 3 && last % 3 == 0)
				y = graphutil_op(g, FLOW_OP_ATTENTION, name,
						 &x, 1, 1, 0);
			else
				y = OP(g, FLOW_OP_GELU, name, x);
			break;
		}
		if (npool < 64)
			pool[npool++] = y;
	}
	int last_out = pool[npool - 1];
	if (rng_below(&s, 2)) {
		/* The loss overwrites its logits in place, which attention's
		 * backward op reads (its output): a gelu between them. */
		int producer = g->tensors[last_out].producer;
		if (producer >= 0 &&
		    g->ops[producer].kind == FLOW_OP_ATTENTION)
			last_out = OP(g, FLOW_OP_GELU, "logits", last_out);
		const flow_shape_t *sh = &g->tensors[last_out].shape;
		int64_t Vp = sh->dims[sh->ndim - 1];
		flow_shape_t rows = *sh;
		rows.ndim--;
		int tgt = graphutil_tensor(g, "targets", FLOW_ROLE_INPUT,
					   FLOW_DTYPE_I32, rows.ndim,
					   rows.dims);
		int losses = graphutil_op(g, FLOW_OP_CROSS_ENTROPY, "loss",
					  (const int[]){ last_out, tgt }, 2, 0,
					  (uint32_t)Vp);
		if (flow_graph_set_loss(g, losses, &diag) != FLOW_OK ||
		    flow_graph_backward(g, &diag) != FLOW_OK)
			fail_msg("%s", flow_diag_message(&diag));
	} else {
		graphutil_must(flow_graph_backward_from(g, last_out, &diag),
			       &diag);
	}
}

static void test_memplan_random_chains_never_share_live_bytes(void **state)
{
	(void)state;
	for (uint64_t seed = 1; seed <= 200; seed++) {
		flow_graph_t g;
		flow_memplan_t plan;
		flow_diag_t diag = FLOW_DIAG_INIT;

		random_graph(&g, seed);
		if (flow_graph_validate(&g, &diag) != FLOW_OK)
			fail_msg("seed %llu: %s", (unsigned long long)seed,
				 flow_diag_message(&diag));
		plan_build(&g, &plan);
		check_plan(&g, &plan);
		flow_memplan_release(&plan);
		flow_graph_release(&g);
	}
}

/* ---- exact small cases ------------------------------------------------------- */

/* x -> gelu -> gelu -> gelu -> gelu, forward only, 64 bytes each: two
 * buffers, used alternately. */
static void test_memplan_chain_ping_pongs_two_buffers(void **state)
{
	flow_graph_t g;
	flow_memplan_t plan;
	int y[4];

	(void)state;
	flow_graph_init(&g);
	int x = PARAM(&g, "x", 16);
	y[0] = OP(&g, FLOW_OP_GELU, "g0", x);
	y[1] = OP(&g, FLOW_OP_GELU, "g1", y[0]);
	y[2] = OP(&g, FLOW_OP_GELU, "g2", y[1]);
	y[3] = OP(&g, FLOW_OP_GELU, "g3", y[2]);
	plan_build(&g, &plan);
	assert_int_equal(plan.offset[y[0]], 0);
	assert_int_equal(plan.offset[y[1]], 64);
	assert_int_equal(plan.offset[y[2]], 0);
	assert_int_equal(plan.offset[y[3]], 64);
	assert_true(plan.offset[x] == SIZE_MAX);
	assert_int_equal(plan.arena_bytes, 128);
	assert_int_equal(plan.unshared_bytes, 256);
	assert_int_equal(plan.persistent_bytes, 64);
	assert_int_equal(plan.scratch_bytes, 0);
	check_plan(&g, &plan);
	flow_memplan_release(&plan);
	flow_graph_release(&g);
}

/* Larger tensors are placed first, at the lowest free offset; sizes are
 * rounded up to 64 bytes. */
static void test_memplan_places_largest_first_at_lowest_offset(void **state)
{
	flow_graph_t g;
	flow_memplan_t plan;

	(void)state;
	flow_graph_init(&g);
	int x = PARAM(&g, "x", 2, 10);   /* 80 bytes -> 128 */
	int w = PARAM(&g, "w", 40, 10);
	int a = OP(&g, FLOW_OP_GELU, "a", x);                 /* 80: [0,1] */
	int b = OP(&g, FLOW_OP_MATMUL, "b", a, w);            /* 320: [1,2] */
	int c = OP(&g, FLOW_OP_ADD, "c", b, b);               /* 320: [2,2] */
	plan_build(&g, &plan);
	/* b first (larger, lower index than c) at 0; c overlaps b -> 320;
	 * a overlaps b only -> 320. */
	assert_int_equal(plan.offset[b], 0);
	assert_int_equal(plan.offset[c], 320);
	assert_int_equal(plan.offset[a], 320);
	assert_int_equal(plan.arena_bytes, 640);
	assert_int_equal(plan.unshared_bytes, 128 + 320 + 320);
	check_plan(&g, &plan);
	flow_memplan_release(&plan);
	flow_graph_release(&g);
}

static void test_memplan_live_ranges_follow_program_order(void **state)
{
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	int first, last;

	(void)state;
	flow_graph_init(&g);
	int x = PARAM(&g, "x", 4);
	int y0 = OP(&g, FLOW_OP_GELU, "g0", x);
	int y1 = OP(&g, FLOW_OP_GELU, "g1", y0);
	flow_graph_live_range(&g, y1, &first, &last);
	assert_int_equal(first, 1);
	assert_int_equal(last, 1);
	int root = graphutil_must(flow_graph_backward_from(&g, y1, &diag),
				  &diag);
	/* ops: 0 g0, 1 g1, 2 g1.backward (root, y0 -> y0.grad),
	 * 3 g0.backward (y0.grad, x -> x.grad) */
	assert_int_equal(g.nops, 4);
	const struct {
		int t, first, last;
	} want[] = {
		{ x, 0, 3 },
		{ root, 0, 3 },
		{ y0, 0, 2 },
		{ y1, 1, 1 },
		{ g.tensors[y0].grad, 2, 3 },
		{ g.tensors[x].grad, 3, 3 },
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		flow_graph_live_range(&g, want[i].t, &first, &last);
		if (first != want[i].first || last != want[i].last)
			fail_msg("'%s': [%d,%d], want [%d,%d]",
				 g.tensors[want[i].t].name, first, last,
				 want[i].first, want[i].last);
	}
	flow_graph_release(&g);
}

static void test_memplan_keeps_losses_to_the_end(void **state)
{
	flow_graph_t g;
	flow_memplan_t plan;
	flow_diag_t diag = FLOW_DIAG_INIT;

	(void)state;
	flow_graph_init(&g);
	int x = PARAM(&g, "x", 4, 8);
	int t = IDS(&g, "t", 4);
	int logits = OP(&g, FLOW_OP_GELU, "g", x);
	int losses = graphutil_op(&g, FLOW_OP_CROSS_ENTROPY, "loss",
				  (const int[]){ logits, t }, 2, 0, 8);
	graphutil_must(flow_graph_set_loss(&g, losses, &diag), &diag);
	graphutil_must(flow_graph_backward(&g, &diag), &diag);
	plan_build(&g, &plan);
	check_plan(&g, &plan);
	/* x.grad is a param grad: the only transient after the loss op is
	 * dlogits (read by g.backward), which aliases the logits. */
	assert_int_equal(plan.arena_bytes, align64(4 * 8 * 4) + 64);
	flow_memplan_release(&plan);
	flow_graph_release(&g);
}

static void test_memplan_empty_graph(void **state)
{
	flow_graph_t g;
	flow_memplan_t plan;

	(void)state;
	flow_graph_init(&g);
	plan_build(&g, &plan);
	assert_int_equal(plan.ntensors, 0);
	assert_int_equal(plan.arena_bytes, 0);
	assert_int_equal(plan.unshared_bytes, 0);
	flow_memplan_release(&plan);
	flow_graph_release(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_memplan_gpt_graph_never_shares_live_bytes),
		cmocka_unit_test(test_memplan_is_deterministic),
		cmocka_unit_test(test_memplan_random_chains_never_share_live_bytes),
		cmocka_unit_test(test_memplan_chain_ping_pongs_two_buffers),
		cmocka_unit_test(test_memplan_places_largest_first_at_lowest_offset),
		cmocka_unit_test(test_memplan_live_ranges_follow_program_order),
		cmocka_unit_test(test_memplan_keeps_losses_to_the_end),
		cmocka_unit_test(test_memplan_empty_graph),
	};

	graphutil_fail = fail_graph;
	return cmocka_run_group_tests(tests, NULL, NULL) ? EXIT_FAILURE :
							   EXIT_SUCCESS;
}
