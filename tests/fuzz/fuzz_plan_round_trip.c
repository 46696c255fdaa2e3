/* Plan files (flow_plan_parse, flow_plan_write; flow-plan(5)): parse,
 * print, parse the print and print again: the two prints must be the same
 * bytes.  A plan of a small model also goes through flow_plan_check,
 * whose messages must follow the rules of every diagnostic. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>

#include <flow/plan.h>

#include "fuzz_util.h"

/* The plan printed into a new buffer (free()). */
static char *print(const flow_plan_t *plan, size_t *len_out)
{
	char *buf = NULL;
	FILE *f = open_memstream(&buf, len_out);
	if (!f)
		fuzz_fail("open_memstream failed");
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_plan_write(plan, f, &diag);
	if (fclose(f) != 0 || err != FLOW_OK)
		fuzz_fail("flow_plan_write: %s", flow_diag_message(&diag));
	return buf;
}

/* flow_plan_check builds the model's graph: only for small ones. */
static bool small(const flow_plan_t *plan)
{
	const flow_gpt_config_t *c = &plan->cfg;
	return c->layers <= 2 && c->dim <= 256 && c->vocab <= 4096 &&
	       c->seq <= 256 && plan->seq_len <= 256 && plan->batch <= 64;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	flow_plan_t *plan = NULL, *again = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_plan_parse((const char *)data, size, "fuzz.plan",
					 &plan, &diag);
	fuzz_check_diag("flow_plan_parse", err, &diag);
	if (err != FLOW_OK)
		return 0;
	size_t alen, blen;
	char *a = print(plan, &alen);
	err = flow_plan_parse(a, alen, "print.plan", &again, &diag);
	if (err != FLOW_OK)
		fuzz_fail("a printed plan does not parse: %s",
			  flow_diag_message(&diag));
	char *b = print(again, &blen);
	fuzz_check_same("flow_plan_write", a, alen, b, blen);
	if (small(plan)) {
		flow_plan_summary_t summary;
		diag = (flow_diag_t)FLOW_DIAG_INIT;
		err = flow_plan_check(plan, 0, NULL, &summary, &diag);
		fuzz_check_diag("flow_plan_check", err, &diag);
	}
	free(b);
	free(a);
	flow_plan_free(again);
	flow_plan_free(plan);
	return 0;
}
