/* The standard layouts: the Megatron and ZeRO rules, the arguments they
 * refuse, and a property: every standard plan of a small random GPT on a
 * small mesh passes the check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/plan.h>

#include "planutil.h"

static const char *tensor_sbp(const flow_plan_t *p, const char *name,
			      char *buf, size_t cap)
{
	for (size_t i = 0; i < p->ntensors; i++)
		if (strcmp(p->tensors[i].name, name) == 0) {
			flow_nd_sbp_format(&p->tensors[i].sbp, buf, cap);
			return buf;
		}
	fail_msg("no tensor '%s'", name);
	return NULL;
}

static const flow_plan_op_t *op_of(const flow_plan_t *p, const char *name)
{
	for (size_t i = 0; i < p->nops; i++)
		if (strcmp(p->ops[i].name, name) == 0)
			return &p->ops[i];
	fail_msg("no op '%s'", name);
	return NULL;
}

static void assert_sbp(const flow_nd_sbp_t *s, const char *want)
{
	char buf[FLOW_SBP_TEXT_MAX];

	flow_nd_sbp_format(s, buf, sizeof(buf));
	assert_string_equal(buf, want);
}

static void test_layouts_megatron_on_2x2(void **state)
{
	(void)state;
	flow_plan_t *p = planutil_standard(PLANUTIL_SMALL, "2x2", "dp,tp", 4, 0);
	char b[FLOW_SBP_TEXT_MAX];

	assert_string_equal(tensor_sbp(p, "tokens", b, sizeof(b)), "(S(0),B)");
	assert_string_equal(tensor_sbp(p, "wte", b, sizeof(b)), "(B,S(0))");
	assert_string_equal(tensor_sbp(p, "wpe", b, sizeof(b)), "(B,B)");
	assert_string_equal(tensor_sbp(p, "h.0.attn.c_attn.weight", b,
				       sizeof(b)), "(B,S(0))");
	assert_string_equal(tensor_sbp(p, "h.0.attn.c_attn.bias", b,
				       sizeof(b)), "(B,S(0))");
	assert_string_equal(tensor_sbp(p, "h.0.mlp.c_proj.weight", b,
				       sizeof(b)), "(B,S(1))");
	assert_string_equal(tensor_sbp(p, "h.0.ln_1.weight", b, sizeof(b)),
			    "(B,B)");
	assert_string_equal(tensor_sbp(p, "h.0.attn.c_proj.out", b,
				       sizeof(b)), "(S(0),P)");
	assert_string_equal(tensor_sbp(p, "h.0.residual_1.out", b,
				       sizeof(b)), "(S(0),B)");
	assert_string_equal(tensor_sbp(p, "lm_head.out", b, sizeof(b)),
			    "(S(0),S(2))");
	assert_string_equal(tensor_sbp(p, "wte.grad", b, sizeof(b)),
			    "(B,S(0))");
	/* Column parallel, row parallel, vocab-parallel embedding,
	 * model-parallel cross-entropy. */
	assert_sbp(&op_of(p, "h.0.mlp.c_fc")->out[0], "(S(0),S(2))");
	assert_sbp(&op_of(p, "h.0.mlp.c_proj")->in[0], "(S(0),S(2))");
	assert_sbp(&op_of(p, "h.0.mlp.c_proj")->out[0], "(S(0),P)");
	assert_sbp(&op_of(p, "h.0.residual_2")->in[1], "(S(0),B)");
	assert_sbp(&op_of(p, "embed")->out[0], "(S(0),P)");
	assert_sbp(&op_of(p, "loss")->out[0], "(S(0),P)");
	/* Gradients before their sync: P on dp. */
	assert_sbp(&op_of(p, "h.0.mlp.c_fc.backward")->out[1], "(P,S(0))");
	flow_plan_free(p);
}

static void test_layouts_zero_stages_split_on_dp(void **state)
{
	(void)state;
	char b[FLOW_SBP_TEXT_MAX];

	for (int z = 0; z <= 3; z++) {
		flow_plan_t *p = planutil_standard(PLANUTIL_SMALL, "2", "dp", 4, z);
		flow_diag_t diag = FLOW_DIAG_INIT;

		assert_string_equal(tensor_sbp(p, "adamw.m/wte", b, sizeof(b)),
				    z >= 1 ? "(S(0))" : "(B)");
		assert_string_equal(tensor_sbp(p, "wte.grad", b, sizeof(b)),
				    z >= 2 ? "(S(0))" : "(B)");
		assert_string_equal(tensor_sbp(p, "wte", b, sizeof(b)),
				    z >= 3 ? "(S(0))" : "(B)");
		/* Ops read parameters whole. */
		assert_sbp(&op_of(p, "embed")->in[1], "(B)");
		assert_int_equal(flow_plan_check(p, 2, NULL, NULL, &diag),
				 FLOW_OK);
		flow_plan_free(p);
	}
}

static void test_layouts_reject_bad_arguments(void **state)
{
	(void)state;
	static const struct {
		const char *mesh, *axes;
		uint32_t B, T;
		int zero;
		const char *msg;
	} cases[] = {
		{ "2x2", "dp,pp", 4, 0, 0,
		  "unknown mesh axis 'pp' (the standard layouts know dp and tp)" },
		{ "2x2:dp,tp", "dp,tp", 4, 0, 0,
		  "mesh '2x2:dp,tp' names its axes and axes 'dp,tp' are given too" },
		{ "2x2", NULL, 4, 0, 0, "mesh '2x2' must name its axes (dp, tp)" },
		{ "4", "dp", 6, 0, 0,
		  "batch 6 is not divisible by the 4 ranks of axis 'dp'" },
		{ "4", "dp", 4, 9, 0, "seq-len 9 is more than the model's 8" },
		{ "2", "dp", 4, 0, 4, "zero stage 4 is not 0, 1, 2 or 3" },
		{ "2", "tp", 4, 0, 1, "zero 1 needs a mesh axis named 'dp'" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_plan_t *p = NULL;

		assert_int_equal(flow_plan_standard(PLANUTIL_SMALL, cases[i].mesh,
						    cases[i].axes, cases[i].B,
						    cases[i].T, 1, cases[i].zero,
						    &p, &diag), FLOW_ERR_USAGE);
		assert_string_equal(diag.msg, cases[i].msg);
		assert_null(p);
	}
}

static void test_layouts_pass_the_check_property(void **state)
{
	(void)state;
	srand(7);
	for (int iter = 0; iter < 40; iter++) {
		int heads = 1 + rand() % 3, hs = 1 + rand() % 3;
		int layers = 1 + rand() % 2, vocab = 5 + rand() % 40;
		int seq = 2 + rand() % 6;
		int d0 = 1 + rand() % 4, d1 = 1 + rand() % 4;
		bool two = rand() % 2, tp_first = rand() % 2;
		char model[128], mesh[32], axes[16];
		int dp = two ? (tp_first ? d1 : d0) : d0;
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_plan_t *p = NULL;

		snprintf(model, sizeof(model), "gpt:layers=%d,heads=%d,dim=%d,"
			 "vocab=%d,seq=%d,pad=4", layers, heads, heads * hs,
			 vocab, seq);
		if (two) {
			snprintf(mesh, sizeof(mesh), "%dx%d", d0, d1);
			snprintf(axes, sizeof(axes), "%s",
				 tp_first ? "tp,dp" : "dp,tp");
		} else {
			snprintf(mesh, sizeof(mesh), "%d", d0);
			snprintf(axes, sizeof(axes), "%s",
				 rand() % 2 ? "tp" : "dp");
			if (strcmp(axes, "tp") == 0)
				dp = 1;
		}
		int zero = dp > 1 || strstr(axes, "dp") ? rand() % 4 : 0;
		if (flow_plan_standard(model, mesh, axes, (uint32_t)dp * 2,
				       0, 2, zero, &p, &diag))
			fail_msg("%s %s %s: %s", model, mesh, axes, diag.msg);
		if (flow_plan_check(p, 0, NULL, NULL, &diag))
			fail_msg("%s %s %s zero %d: %s", model, mesh, axes,
				 zero, diag.msg);
		flow_plan_free(p);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layouts_megatron_on_2x2),
		cmocka_unit_test(test_layouts_zero_stages_split_on_dp),
		cmocka_unit_test(test_layouts_reject_bad_arguments),
		cmocka_unit_test(test_layouts_pass_the_check_property),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
