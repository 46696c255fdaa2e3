/* The plan checker: its errors, each naming the plan line (the line after
 * the last for something missing), the summary of boxings and memory, and
 * the memory held against a cluster profile. */
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

static void test_plan_check_errors_name_the_line(void **state)
{
	(void)state;
	static const struct {
		const char *from, *to, *msg;
	} cases[] = {
		/* The header. */
		{ "mesh 2x2:dp,tp", "mesh 2x1:dp,tp",
		  "t.plan:3: mesh '2x1:dp,tp' has 2 ranks, not the world size 4" },
		{ "batch 4", "batch 3",
		  "t.plan:4: batch 3 is not divisible by the 2 ranks of axis 'dp'" },
		{ "seq-len 8", "seq-len 9",
		  "t.plan:5: seq-len 9 is more than the model's 8" },
		/* Stages. */
		{ "stage embed 0", "stage embod 0", "t.plan:9: unknown stage 'embod'" },
		{ "stage embed 0", "stage embed 1",
		  "t.plan:9: stage 'embed' is 1: every layer is in stage 0 until "
		  "pipeline parallelism" },
		{ "stage embed 0\n", "", "t.plan:138: missing stage 'embed'" },
		/* Tensors and ops. */
		{ "tensor wpe param (B,B)", "tensor wpf param (B,B)",
		  "t.plan:42: unknown tensor 'wpf'" },
		{ "tensor wpe param (B,B)\n", "", "t.plan:138: missing tensor 'wpe'" },
		{ "tensor wpe param (B,B)", "tensor wpe param (B,S(2))",
		  "t.plan:42: tensor 'wpe': (B,S(2)) on 2x2:dp,tp: split dimension 2 "
		  "but (8,8) has 2 dimensions" },
		{ "op embed in", "op embod in", "t.plan:12: unknown op 'embod'" },
	};
	flow_plan_t *p = planutil_standard(PLANUTIL_SMALL, "2x2", "dp,tp", 4, 0);
	size_t n;
	char *t = planutil_text(p, &n);

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_plan_summary_t summary, before;
		flow_plan_t *q = NULL;

		if (planutil_parse_edited(t, cases[i].from, cases[i].to, &q,
					  &diag) != FLOW_OK)
			fail_msg("%s", diag.msg);
		memset(&summary, 0x5a, sizeof(summary));
		before = summary;
		assert_int_equal(flow_plan_check(q, 4, NULL, &summary, &diag),
				 FLOW_ERR_FORMAT);
		assert_string_equal(diag.msg, cases[i].msg);
		/* The summary is an output: untouched on failure. */
		assert_memory_equal(&summary, &before, sizeof(summary));
		flow_plan_free(q);
	}
	flow_plan_free(p);
	free(t);
}

static void test_plan_check_summarises_boxings_and_memory(void **state)
{
	(void)state;
	flow_plan_t *p = planutil_standard(PLANUTIL_SMALL, "2x2", "dp,tp", 4, 0);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_summary_t s;
	uint64_t count = 0, bytes = 0;

	assert_int_equal(flow_plan_check(p, 4, NULL, &s, &diag), FLOW_OK);
	assert_int_equal(s.tensors, p->ntensors);
	assert_int_equal(s.ops, p->nops);
	assert_int_equal(s.boxings, 34);
	assert_int_equal(s.boxing_count[FLOW_BOXING_ALL_REDUCE], 25);
	assert_int_equal(s.boxing_bytes[FLOW_BOXING_ALL_REDUCE], 41408);
	assert_int_equal(s.boxing_count[FLOW_BOXING_ALL_GATHER], 3);
	assert_int_equal(s.boxing_bytes[FLOW_BOXING_ALL_GATHER], 7168);
	for (int k = 0; k < FLOW_BOXING_KIND_COUNT; k++) {
		count += s.boxing_count[k];
		bytes += s.boxing_bytes[k];
	}
	assert_int_equal(count, 34); /* 3 slices and 3 zero-fills too */
	assert_int_equal(s.boxing_total_bytes, bytes);
	assert_int_equal(s.boxing_total_bytes, 48576);
	assert_int_equal(s.rank_bytes, s.param_bytes + s.grad_bytes +
			 s.optim_bytes + s.activation_bytes);
	/* Without ZeRO every rank holds two moments of its parameters. */
	assert_int_equal(s.optim_bytes, 2 * s.param_bytes);
	/* The summary may be left out. */
	assert_int_equal(flow_plan_check(p, 0, NULL, NULL, &diag), FLOW_OK);
	flow_plan_free(p);
}

/* A plan from before attention kept log-sum-exps names its saved tensor
 * h.0.attn.probs: it is read as h.0.attn.lse, checks, and prints as
 * today's plan does. */
static void test_plan_check_reads_attention_probs_as_lse(void **state)
{
	(void)state;
	flow_plan_t *p = planutil_standard(PLANUTIL_SMALL, "2x2", "dp,tp", 4, 0);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *q = NULL;
	size_t n, m;
	char *t = planutil_text(p, &n), *u;

	if (planutil_parse_edited(t, "tensor h.0.attn.lse saved",
				  "tensor h.0.attn.probs saved", &q,
				  &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	assert_int_equal(flow_plan_check(q, 4, NULL, NULL, &diag), FLOW_OK);
	u = planutil_text(q, &m);
	assert_int_equal(m, n);
	assert_string_equal(u, t);
	flow_plan_free(q);
	flow_plan_free(p);
	free(t);
	free(u);
}

static double gib(uint64_t bytes)
{
	return (double)bytes / 1073741824.0;
}

static void test_plan_check_holds_memory_to_the_cluster(void **state)
{
	(void)state;
	flow_plan_t *p = planutil_standard(PLANUTIL_SMALL, "2x2", "dp,tp", 4, 0);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_summary_t s;
	flow_cluster_t c;

	flow_cluster_default(&c);
	assert_int_equal(flow_plan_check(p, 4, &c, &s, &diag), FLOW_OK);
	c.memory_bytes = s.rank_bytes;
	assert_int_equal(flow_plan_check(p, 4, &c, &s, &diag), FLOW_OK);
	c.memory_bytes = s.rank_bytes - 1;
	assert_int_equal(flow_plan_check(p, 4, &c, &s, &diag), FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg, "(standard plan): a rank needs 0.00 GiB "
			    "(params 0.00, grads 0.00, optimizer 0.00, "
			    "activations 0.00), more than the cluster's 0.00 "
			    "GiB");

	/* At scale the message gives the summary's bytes in GiB. */
	flow_plan_free(p);
	p = planutil_standard("gpt:layers=2,heads=4,dim=2048,vocab=32000,seq=64",
			      "2", "dp", 2, 0);
	assert_int_equal(flow_plan_check(p, 2, NULL, &s, &diag), FLOW_OK);
	assert_true(s.rank_bytes > ((uint64_t)1 << 30));
	char want[256];
	snprintf(want, sizeof(want), "(standard plan): a rank needs %.2f GiB "
		 "(params %.2f, grads %.2f, optimizer %.2f, activations %.2f), "
		 "more than the cluster's 1.00 GiB", gib(s.rank_bytes),
		 gib(s.param_bytes), gib(s.grad_bytes), gib(s.optim_bytes),
		 gib(s.activation_bytes));
	c.memory_bytes = (uint64_t)1 << 30;
	flow_diag_clear(&diag);
	assert_int_equal(flow_plan_check(p, 2, &c, &s, &diag), FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg, want);
	flow_plan_free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plan_check_errors_name_the_line),
		cmocka_unit_test(test_plan_check_summarises_boxings_and_memory),
		cmocka_unit_test(test_plan_check_holds_memory_to_the_cluster),
		cmocka_unit_test(test_plan_check_reads_attention_probs_as_lse),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
