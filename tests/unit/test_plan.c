/* The plan format: a plan's lifecycle, text round trips, and the parser's
 * errors, each naming the line. */
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

static void test_plan_print_parse_print_is_identical(void **state)
{
	(void)state;
	const char *meshes[] = { "1", "2", "4", "2x2" };
	const char *axes[] = { "dp", "dp", "tp", "dp,tp" };

	for (int i = 0; i < 4; i++) {
		flow_plan_t *p = planutil_standard(PLANUTIL_SMALL, meshes[i],
						   axes[i], 4, 0), *q;
		flow_diag_t diag = FLOW_DIAG_INIT;
		size_t n1, n2;
		char *t1 = planutil_text(p, &n1), *t2;

		if (flow_plan_parse(t1, n1, "x.plan", &q, &diag))
			fail_msg("%s", diag.msg);
		t2 = planutil_text(q, &n2);
		assert_int_equal(n1, n2);
		assert_memory_equal(t1, t2, n1);
		/* The parsed plan's lines are the printed text's. */
		assert_int_equal(q->line_model, 2);
		assert_int_equal(q->line_recompute, 8);
		assert_int_equal(q->last_line, p->last_line);
		assert_int_equal(q->tensors[0].line, p->tensors[0].line);
		assert_string_equal(q->path, "x.plan");
		free(t1);
		free(t2);
		flow_plan_free(p);
		flow_plan_free(q);
	}
}

static void test_plan_release_accepts_released_and_null_plans(void **state)
{
	(void)state;
	flow_plan_t plan;

	flow_plan_init(&plan);
	assert_string_equal(plan.recompute, "none");
	assert_int_equal(plan.grad_accum, 1);
	assert_int_equal(plan.ntensors, 0);
	flow_plan_release(&plan);
	flow_plan_release(&plan);
	flow_plan_release(NULL);
	flow_plan_free(NULL);
}

static void test_plan_role_names(void **state)
{
	(void)state;
	assert_string_equal(flow_plan_role_name(FLOW_ROLE_PARAM), "param");
	assert_string_equal(flow_plan_role_name(FLOW_PLAN_ROLE_ADAMW_M),
			    "adamw.m");
	assert_string_equal(flow_plan_role_name(FLOW_PLAN_ROLE_ADAMW_V),
			    "adamw.v");
	assert_null(flow_plan_role_name(FLOW_PLAN_ROLE_COUNT));
	assert_null(flow_plan_role_name(-1));
}

/* The optional device and precision records: absent by default (nothing
 * printed), printed after the header when set, parsed back with their
 * lines. */
static void test_plan_device_and_precision_round_trip(void **state)
{
	(void)state;
	flow_plan_t *p = planutil_standard(PLANUTIL_SMALL, "2", "dp", 4, 0), *q;
	flow_diag_t diag = FLOW_DIAG_INIT;
	size_t n1, n2;
	char *t1 = planutil_text(p, &n1), *t2;

	assert_string_equal(p->device, "");
	assert_null(strstr(t1, "\ndevice "));
	free(t1);
	snprintf(p->device, sizeof p->device, "cuda");
	snprintf(p->precision, sizeof p->precision, "bf16");
	t1 = planutil_text(p, &n1);
	assert_non_null(strstr(t1, "recompute none\ndevice cuda\nprecision bf16\n"));
	if (flow_plan_parse(t1, n1, "x.plan", &q, &diag))
		fail_msg("%s", diag.msg);
	assert_string_equal(q->device, "cuda");
	assert_string_equal(q->precision, "bf16");
	assert_int_equal(q->line_device, 9);
	assert_int_equal(q->line_precision, 10);
	t2 = planutil_text(q, &n2);
	assert_int_equal(n1, n2);
	assert_memory_equal(t1, t2, n1);
	free(t1);
	free(t2);
	flow_plan_free(p);
	flow_plan_free(q);
}

static void test_plan_parse_errors_name_the_line(void **state)
{
	(void)state;
	static const struct {
		const char *from, *to, *msg;
	} cases[] = {
		{ "flow-plan 1", "flow-plan 2",
		  "t.plan:1: unsupported plan version '2' (this flow reads version 1)" },
		{ "flow-plan 1", "flow-plot 1",
		  "t.plan:1: not a plan: expected 'flow-plan 1' on line 1" },
		{ "zero 0\n", "zero 0\nfrobnicate 1\n",
		  "t.plan:8: unknown keyword 'frobnicate'" },
		{ "mesh 2x2:dp,tp\n", "", "t.plan:3: expected 'mesh', got 'batch'" },
		{ "zero 0\n", "zero 0\nstage embed 0\n",
		  "t.plan:8: expected 'recompute', got 'stage'" },
		{ "batch 4", "batch 0", "t.plan:4: invalid batch '0'" },
		{ "recompute none", "recompute all",
		  "t.plan:8: unknown recompute policy 'all' (expected 'none')" },
		{ "tensor wpe param (B,B)", "tensor wpe weight (B,B)",
		  "t.plan:42: unknown role 'weight'" },
		{ "tensor wpe param (B,B)", "tensor wpe param (B,Q)",
		  "t.plan:42: nd-SBP '(B,Q)': expected S(k), B or P at 'Q'" },
		{ "zero 0\n", "zero 0\ndevice cuda\n",
		  "t.plan:8: expected 'recompute', got 'device'" },
		{ "recompute none\n", "recompute none\ndevice gpu\n",
		  "t.plan:9: unknown device 'gpu' (expected cpu or cuda)" },
		{ "recompute none\n", "recompute none\nprecision fp16\n",
		  "t.plan:9: unknown precision 'fp16' (expected fp32 or bf16)" },
		{ "recompute none\n", "recompute none\ndevice cuda\ndevice cpu\n",
		  "t.plan:10: duplicate 'device'" },
		{ "tensor wpe param (B,B)\n", "tensor wpe param (B,B)\nprecision bf16\n",
		  "t.plan:43: 'precision' must come before the stages, ops and tensors" },
	};
	flow_plan_t *p = planutil_standard(PLANUTIL_SMALL, "2x2", "dp,tp", 4, 0);
	size_t n;
	char *t = planutil_text(p, &n);

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_plan_t *q = NULL;

		assert_int_equal(planutil_parse_edited(t, cases[i].from,
						       cases[i].to, &q, &diag),
				 FLOW_ERR_FORMAT);
		assert_string_equal(diag.msg, cases[i].msg);
		assert_null(q);
	}
	flow_plan_free(p);
	free(t);
}

static void test_plan_parse_names_what_a_short_text_misses(void **state)
{
	(void)state;
	static const char header[] =
		"flow-plan 1\nmodel " PLANUTIL_SMALL "\n";
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *p = NULL;

	assert_int_equal(flow_plan_parse(header, strlen(header), "t.plan", &p,
					 &diag), FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg, "t.plan:3: unexpected end of file, "
			    "expected 'mesh'");
	flow_diag_clear(&diag);
	assert_int_equal(flow_plan_parse("", 0, "t.plan", &p, &diag),
			 FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg, "t.plan:1: unexpected end of file, "
			    "expected 'flow-plan 1'");
	assert_null(p);
}

static void test_plan_read_names_the_file(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *p = NULL;

	assert_int_equal(flow_plan_read("/nonexistent/x.plan", &p, &diag),
			 FLOW_ERR_IO);
	assert_string_equal(diag.msg, "cannot open '/nonexistent/x.plan': "
			    "No such file or directory");
	assert_null(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plan_print_parse_print_is_identical),
		cmocka_unit_test(test_plan_release_accepts_released_and_null_plans),
		cmocka_unit_test(test_plan_role_names),
		cmocka_unit_test(test_plan_device_and_precision_round_trip),
		cmocka_unit_test(test_plan_parse_errors_name_the_line),
		cmocka_unit_test(test_plan_parse_names_what_a_short_text_misses),
		cmocka_unit_test(test_plan_read_names_the_file),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
