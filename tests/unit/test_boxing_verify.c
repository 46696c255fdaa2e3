/* The --verify harness (lib/sbp/boxing_verify.c): a plan run in the
 * reference executor on exactly summable data leaves every destination
 * its slice and moves the bytes the plan says; the planner's plans pass
 * in every dtype, and tampered plans fail with the message naming the
 * element, the ranks or the bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <flow/boxing.h>

#include "sbputil.h"

static void assert_verify_fails(const flow_boxing_plan_t *plan,
				const char *want)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_boxing_verify(plan, &diag), FLOW_ERR_VERIFY);
	assert_string_equal(diag.msg, want);
}

static void test_boxing_verify_passes_the_planner_s_plans(void **state)
{
	(void)state;
	static const struct {
		const char *shape, *from_mesh, *from, *to_mesh, *to;
	} cases[] = {
		{ "6,8", "4", "P", "4", "B" },                      /* all-reduce */
		{ "7,5", "4", "P", "4", "S(0)" },                   /* reduce-scatter */
		{ "7,5", "3", "S(0)", "3", "B" },                   /* all-gather */
		{ "7,5", "3", "S(0)", "3", "S(1)" },                /* all-to-all */
		{ "6,8", "4", "B", "4", "S(1)" },                   /* slice */
		{ "6,8", "4", "B", "4", "P" },                      /* zero-fill */
		{ "6,8", "4", "S(0)", "4", "P" },                   /* pad-zero */
		{ "8,8", "2x2", "(S(0),S(0))", "2x2", "(S(1),S(1))" },
		{ "5,3,2", "2x3", "(S(0),P)", "2x3", "(B,S(1))" },
		{ "6,8", "2x2", "(S(0),B)", "2x2", "(P,P)" },
		{ "7,5", "2", "S(0)", "3@2", "S(1)" },              /* send/recv */
		{ "6", "2", "P", "2@4", "B" },
	};
	static const flow_dtype_t dtypes[] = {
		FLOW_DTYPE_F32, FLOW_DTYPE_BF16, FLOW_DTYPE_F16, FLOW_DTYPE_I32,
		FLOW_DTYPE_I64, FLOW_DTYPE_U16, FLOW_DTYPE_U8, FLOW_DTYPE_U32,
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
			flow_boxing_plan_t plan = typed_plan_of(cases[i].shape, dtypes[d],
								cases[i].from_mesh, cases[i].from,
								cases[i].to_mesh, cases[i].to, NULL);
			flow_diag_t diag = FLOW_DIAG_INIT;
			if (flow_boxing_verify(&plan, &diag) != FLOW_OK)
				fail_msg("%s %s from %s on %s to %s on %s: %s", cases[i].shape,
					 flow_dtype_name(dtypes[d]), cases[i].from,
					 cases[i].from_mesh, cases[i].to, cases[i].to_mesh,
					 diag.msg);
		}
	/* An empty plan holds the data where it was. */
	flow_boxing_plan_t plan = plan_of("6", "2", "S(0)", "2", "S(0)", NULL);
	assert_int_equal(plan.nsteps, 0);
	assert_int_equal(flow_boxing_verify(&plan, NULL), FLOW_OK);
}

static void test_boxing_verify_finds_tampered_steps(void **state)
{
	(void)state;
	/* Element e is 1 + e, and a P source's rank 0 holds the addends
	 * ceil((1 + e) / 2): broadcasting them instead of summing leaves
	 * 1, 1, 2, 2.  Every rank keeping the whole tensor, where only the
	 * first should, doubles each sum. */
	static const struct {
		const char *shape;
		flow_dtype_t dtype;
		const char *from, *to;
		flow_boxing_kind_t kind, tampered;
		const char *msg;
	} cases[] = {
		{ "4", FLOW_DTYPE_F32, "P", "B", FLOW_BOXING_ALL_REDUCE, FLOW_BOXING_BROADCAST,
		  "verification failed: element (1) on rank 0 is 1, expected 2" },
		{ "2,3", FLOW_DTYPE_I32, "P", "B", FLOW_BOXING_ALL_REDUCE, FLOW_BOXING_BROADCAST,
		  "verification failed: element (0,1) on rank 0 is 1, expected 2" },
		{ "3", FLOW_DTYPE_F32, "B", "P", FLOW_BOXING_ZERO_FILL, FLOW_BOXING_SLICE,
		  "verification failed: the addends of element (0) on ranks 0+1 sum to 2, expected 1" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		flow_boxing_plan_t plan = typed_plan_of(cases[i].shape, cases[i].dtype, "2",
							cases[i].from, "2", cases[i].to, NULL);
		assert_int_equal(plan.nsteps, 1);
		assert_int_equal(plan.steps[0].kind, cases[i].kind);
		assert_int_equal(flow_boxing_verify(&plan, NULL), FLOW_OK);
		plan.steps[0].kind = cases[i].tampered;
		assert_verify_fails(&plan, cases[i].msg);
	}
}

static void test_boxing_verify_finds_a_rank_that_holds_nothing(void **state)
{
	(void)state;
	/* The steps leave the data on ranks 0 and 1, the plan says 2 and 3. */
	flow_boxing_plan_t plan = plan_of("4", "2", "S(0)", "2", "B", NULL);
	plan.dst_mesh = mesh_of("2@2");
	assert_verify_fails(&plan, "verification failed: rank 2 holds nothing");
}

static void test_boxing_verify_finds_tampered_bytes(void **state)
{
	(void)state;
	/* An all-gather of 2 + 2 f32 elements: each rank sends 8 bytes. */
	flow_boxing_plan_t plan = plan_of("4", "2", "S(0)", "2", "B", NULL);
	assert_int_equal(plan.total_bytes, 16);
	plan.total_bytes = 20;
	assert_verify_fails(&plan, "verification failed: the ranks sent 16 bytes in all, the plan says 20");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_boxing_verify_passes_the_planner_s_plans),
		cmocka_unit_test(test_boxing_verify_finds_tampered_steps),
		cmocka_unit_test(test_boxing_verify_finds_a_rank_that_holds_nothing),
		cmocka_unit_test(test_boxing_verify_finds_tampered_bytes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
