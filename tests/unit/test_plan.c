/* Plans: text round trips, the standard layouts' rules, the checker's
 * errors with their lines, and a property: every standard plan of a
 * small random GPT on a small mesh passes the check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/plan.h>

#define SMALL "gpt:layers=1,heads=2,dim=8,vocab=30,seq=8"

static flow_plan_t *standard(const char *model, const char *mesh,
			     const char *axes, uint32_t B, int zero)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *p = NULL;

	if (flow_plan_standard(model, mesh, axes, B, 0, 1, zero, &p, &diag))
		fail_msg("%s", diag.msg);
	return p;
}

/* The printed text; free() it. */
static char *print(const flow_plan_t *p, size_t *len_out)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	assert_int_equal(flow_plan_write(p, f, NULL), FLOW_OK);
	fclose(f);
	*len_out = len;
	return buf;
}

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

static void test_plan_print_parse_print_is_identical(void **state)
{
	(void)state;
	const char *meshes[] = { "1", "2", "4", "2x2" };
	const char *axes[] = { "dp", "dp", "tp", "dp,tp" };

	for (int i = 0; i < 4; i++) {
		flow_plan_t *p = standard(SMALL, meshes[i], axes[i], 4, 0), *q;
		flow_diag_t diag = FLOW_DIAG_INIT;
		size_t n1, n2;
		char *t1 = print(p, &n1), *t2;

		if (flow_plan_parse(t1, n1, "x.plan", &q, &diag))
			fail_msg("%s", diag.msg);
		t2 = print(q, &n2);
		assert_int_equal(n1, n2);
		assert_memory_equal(t1, t2, n1);
		assert_int_equal(flow_plan_check(q, 0, NULL, NULL, &diag),
				 FLOW_OK);
		free(t1);
		free(t2);
		flow_plan_free(p);
		flow_plan_free(q);
	}
}

static void test_plan_standard_megatron_layouts_on_2x2(void **state)
{
	(void)state;
	flow_plan_t *p = standard(SMALL, "2x2", "dp,tp", 4, 0);
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

static void test_plan_standard_zero_stages_split_on_dp(void **state)
{
	(void)state;
	char b[FLOW_SBP_TEXT_MAX];

	for (int z = 0; z <= 3; z++) {
		flow_plan_t *p = standard(SMALL, "2", "dp", 4, z);
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

static void test_plan_standard_rejects_bad_arguments(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *p = NULL;

	assert_int_equal(flow_plan_standard(SMALL, "2x2", "dp,pp", 4, 0, 1, 0,
					    &p, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "unknown mesh axis 'pp' (the standard "
			    "layouts know dp and tp)");
	flow_diag_clear(&diag);
	assert_int_equal(flow_plan_standard(SMALL, "4", "dp", 6, 0, 1, 0, &p,
					    &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "batch 6 is not divisible by the 4 "
			    "ranks of axis 'dp'");
	flow_diag_clear(&diag);
	assert_int_equal(flow_plan_standard(SMALL, "2", "tp", 4, 0, 1, 1, &p,
					    &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "zero 1 needs a mesh axis named 'dp'");
	assert_null(p);
}

/* Replace the first occurrence of from in text with to, parse, and
 * expect the message of parse or check. */
static void expect_error(const char *text, const char *from, const char *to,
			 const char *want)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	const char *at = strstr(text, from);
	size_t n = strlen(text) + strlen(to) + 1;
	char *edited = malloc(n);
	flow_plan_t *p = NULL;

	assert_non_null(at);
	snprintf(edited, n, "%.*s%s%s", (int)(at - text), text, to,
		 at + strlen(from));
	if (flow_plan_parse(edited, strlen(edited), "t.plan", &p, &diag) ==
	    FLOW_OK) {
		assert_int_not_equal(flow_plan_check(p, 4, NULL, NULL, &diag),
				     FLOW_OK);
		flow_plan_free(p);
	}
	assert_string_equal(diag.msg, want);
	free(edited);
}

static void test_plan_errors_name_the_line(void **state)
{
	(void)state;
	flow_plan_t *p = standard(SMALL, "2x2", "dp,tp", 4, 0);
	size_t n;
	char *t = print(p, &n);

	expect_error(t, "flow-plan 1", "flow-plan 2",
		     "t.plan:1: unsupported plan version '2' (this flow reads "
		     "version 1)");
	expect_error(t, "zero 0\n", "zero 0\nfrobnicate 1\n",
		     "t.plan:8: unknown keyword 'frobnicate'");
	expect_error(t, "tensor wpe param (B,B)", "tensor wpe param (B,Q)",
		     "t.plan:42: nd-SBP '(B,Q)': expected S(k), B or P at 'Q'");
	expect_error(t, "tensor wpe param (B,B)", "tensor wpe param (B,S(2))",
		     "t.plan:42: tensor 'wpe': (B,S(2)) on 2x2:dp,tp: "
		     "split dimension 2 but (8,8) has 2 dimensions");
	expect_error(t, "mesh 2x2:dp,tp", "mesh 2x1:dp,tp",
		     "t.plan:3: mesh '2x1:dp,tp' has 2 ranks, not the world "
		     "size 4");
	flow_plan_free(p);
	free(t);
}

static void test_plan_standard_passes_check_property(void **state)
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
		cmocka_unit_test(test_plan_print_parse_print_is_identical),
		cmocka_unit_test(test_plan_standard_megatron_layouts_on_2x2),
		cmocka_unit_test(test_plan_standard_zero_stages_split_on_dp),
		cmocka_unit_test(test_plan_standard_rejects_bad_arguments),
		cmocka_unit_test(test_plan_errors_name_the_line),
		cmocka_unit_test(test_plan_standard_passes_check_property),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
