/* ZeRO layouts from plans: which parameters are split at each stage, the
 * shards of every rank tiling each parameter (uneven splits included, a
 * property over random small GPTs and dp sizes), one-rank collectives,
 * which parameters an overwrite makes stale, and the layouts refused with
 * the plan's line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/zero.h>

#define SMALL "gpt:layers=1,heads=2,dim=8,vocab=30,seq=8"

static flow_plan_t *standard(const char *model, const char *mesh, uint32_t B,
			     int zero)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *p = NULL;

	if (flow_plan_standard(model, mesh, "dp", B, 0, 1, zero, &p, &diag))
		fail_msg("%s", diag.msg);
	return p;
}

/* The training graph the plan describes. */
static void build(const flow_plan_t *p, flow_graph_t *g)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	flow_graph_init(g);
	if (flow_gpt_build(&p->cfg, p->batch, p->seq_len, g, &diag) ||
	    flow_graph_backward(g, &diag))
		fail_msg("%s", diag.msg);
}

static flow_zero_t *zero_of(const flow_plan_t *p, const flow_graph_t *g,
			    int rank, int size)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_zero_t *z = NULL;

	if (flow_zero_new(p, g, NULL, rank, size, &z, &diag))
		fail_msg("%s", diag.msg);
	return z;
}

/* Each stage splits what it says, on every parameter of the model. */
static void test_zero_stages_split_what_they_say(void **state)
{
	(void)state;
	for (int stage = 0; stage <= 3; stage++) {
		flow_plan_t *p = standard(SMALL, "2", 2, stage);
		flow_graph_t g;
		build(p, &g);
		flow_zero_t *z = zero_of(p, &g, 1, 2);
		assert_true(z->nparams > 0);
		assert_int_equal(z->any_split, stage >= 1);
		for (size_t i = 0; i < z->nparams; i++) {
			const flow_zero_param_t *zp = &z->params[i];
			assert_int_equal(zp->state_split, stage >= 1);
			assert_int_equal(zp->grad_split, stage >= 2);
			assert_int_equal(zp->param_split, stage >= 3);
			assert_ptr_equal(flow_zero_param(z, zp->tensor), zp);
		}
		flow_zero_free(z);
		flow_graph_release(&g);
		flow_plan_free(p);
	}
}

/* wte is (128, 8) padded: on 3 ranks rows 43, 43, 42; each rank's shard
 * starts where the previous one ends and the counts sum to the whole. */
static void test_zero_uneven_shards_follow_each_other(void **state)
{
	(void)state;
	flow_plan_t *p = standard(SMALL, "3", 3, 3);
	flow_graph_t g;
	build(p, &g);
	int wte = flow_graph_find(&g, "wte");
	size_t expect_begin = 0;
	for (int r = 0; r < 3; r++) {
		flow_zero_t *z = zero_of(p, &g, r, 3);
		const flow_zero_param_t *zp = flow_zero_param(z, wte);
		assert_non_null(zp);
		assert_int_equal(zp->numel, 128 * 8);
		assert_int_equal(zp->counts[0], 43 * 8);
		assert_int_equal(zp->counts[1], 43 * 8);
		assert_int_equal(zp->counts[2], 42 * 8);
		assert_int_equal(zp->begin, expect_begin);
		assert_int_equal(zp->count, zp->counts[r]);
		assert_int_equal(zp->box.start[0], (int64_t)(expect_begin / 8));
		assert_int_equal(zp->box.extent[0], (int64_t)(zp->count / 8));
		assert_int_equal(zp->box.extent[1], 8);
		expect_begin += zp->count;
		flow_zero_free(z);
	}
	flow_graph_release(&g);
	flow_plan_free(p);
}

/* Property: random small GPTs on random dp sizes, every stage: the ranks'
 * shards tile each parameter in rank order. */
static void test_zero_shards_tile_each_parameter(void **state)
{
	(void)state;
	srand(7);
	for (int trial = 0; trial < 30; trial++) {
		int heads = 1 + rand() % 3, dim = heads * (2 + rand() % 4);
		int dp = 1 + rand() % 5, stage = rand() % 4;
		char model[128], mesh[8];
		snprintf(model, sizeof model,
			 "gpt:layers=%d,heads=%d,dim=%d,vocab=%d,seq=%d,pad=8",
			 1 + rand() % 2, heads, dim, 10 + rand() % 40,
			 dp + rand() % 8);
		snprintf(mesh, sizeof mesh, "%d", dp);
		flow_plan_t *p = standard(model, mesh, (uint32_t)dp, stage);
		flow_graph_t g;
		build(p, &g);
		for (size_t i = 0;; i++) {
			size_t next = 0, nparams = 0;
			for (int r = 0; r < dp; r++) {
				flow_zero_t *z = zero_of(p, &g, r, dp);
				nparams = z->nparams;
				if (i >= nparams) {
					flow_zero_free(z);
					break;
				}
				const flow_zero_param_t *zp = &z->params[i];
				size_t sum = 0;
				for (int k = 0; k < dp; k++)
					sum += zp->counts[k];
				if (zp->state_split) {
					assert_int_equal(sum, zp->numel);
					assert_int_equal(zp->begin, next);
					next += zp->count;
				} else {
					assert_int_equal(zp->begin, 0);
					assert_int_equal(zp->count, zp->numel);
				}
				flow_zero_free(z);
			}
			if (i >= nparams)
				break;
		}
		flow_graph_release(&g);
		flow_plan_free(p);
	}
}

/* On one rank the collectives are identities and nothing is stale. */
static void test_zero_one_rank_splits_nothing(void **state)
{
	(void)state;
	flow_plan_t *p = standard(SMALL, "1", 2, 3);
	flow_graph_t g;
	build(p, &g);
	flow_zero_t *z = zero_of(p, &g, 0, 1);
	assert_false(z->any_split); /* an axis of size 1 splits nothing */
	assert_false(z->params_stale);
	flow_zero_free(z);
	flow_graph_release(&g);
	flow_plan_free(p);
}

/* Overwritten parameters (a resume) make exactly the kept-split ones
 * (ZeRO 3) stale, so the next forward pass gathers them; the others are
 * whole on every rank already. */
static void test_zero_params_changed_marks_kept_split_parameters_stale(void **state)
{
	(void)state;
	for (int stage = 0; stage <= 3; stage++) {
		flow_plan_t *p = standard(SMALL, "2", 2, stage);
		flow_graph_t g;
		build(p, &g);
		flow_zero_t *z = zero_of(p, &g, 0, 2);
		assert_false(z->params_stale);
		flow_zero_params_changed(z);
		assert_int_equal(z->params_stale, stage == 3);
		flow_zero_free(z);
		flow_graph_release(&g);
		flow_plan_free(p);
	}
}

/* A layout the runtime cannot execute is refused, naming the line. */
static void test_zero_refuses_layouts_naming_the_plan_line(void **state)
{
	(void)state;
	flow_plan_t *p = standard(SMALL, "2", 2, 2);
	flow_graph_t g;
	build(p, &g);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_zero_t *z = NULL;
	for (size_t i = 0; i < p->ntensors; i++) {
		flow_plan_tensor_t *t = &p->tensors[i];
		if (strcmp(t->name, "adamw.m/wte") == 0)
			t->sbp.sbp[0] = (flow_sbp_t){ FLOW_SBP_SPLIT, 1 };
	}
	assert_int_equal(flow_zero_new(p, &g, NULL, 0, 2, &z, &diag),
			 FLOW_ERR_NOTSUP);
	assert_non_null(strstr(diag.msg, "'adamw.m/wte' is (S(1)): this flow-train shards only dimension 0 on dp"));
	assert_non_null(strstr(diag.msg, p->path));
	for (size_t i = 0; i < p->ntensors; i++) {
		flow_plan_tensor_t *t = &p->tensors[i];
		if (strncmp(t->name, "adamw.", 6) == 0 &&
		    strcmp(t->name + 8, "wte") == 0)
			t->sbp.sbp[0] = (flow_sbp_t){ FLOW_SBP_BROADCAST, 0 };
	}
	diag = (flow_diag_t)FLOW_DIAG_INIT;
	assert_int_equal(flow_zero_new(p, &g, NULL, 0, 2, &z, &diag),
			 FLOW_ERR_NOTSUP);
	assert_non_null(strstr(diag.msg, "'wte.grad' is split on dp but its optimizer state"));
	flow_graph_release(&g);
	flow_plan_free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_zero_stages_split_what_they_say),
		cmocka_unit_test(test_zero_uneven_shards_follow_each_other),
		cmocka_unit_test(test_zero_shards_tile_each_parameter),
		cmocka_unit_test(test_zero_one_rank_splits_nothing),
		cmocka_unit_test(test_zero_params_changed_marks_kept_split_parameters_stale),
		cmocka_unit_test(test_zero_refuses_layouts_naming_the_plan_line),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
