/* Plans for the plan format, standard-layout and checker tests: the
 * standard plan of a model, its printed text, and the parse of that
 * text with one edit.  The tests ask only for what must work, so libflow refusing
 * it is the test's failure (cmocka's fail_msg, with the message). */
#ifndef FLOW_TEST_PLANUTIL_H
#define FLOW_TEST_PLANUTIL_H

#include <stddef.h>
#include <stdint.h>

#include <flow/plan.h>

/* A GPT small enough to plan and check in a blink. */
#define PLANUTIL_SMALL "gpt:layers=1,heads=2,dim=8,vocab=30,seq=8"

/* flow_plan_standard(model, mesh, axes, B, the model's T, K 1, zero);
 * free with flow_plan_free(). */
flow_plan_t *planutil_standard(const char *model, const char *mesh,
			       const char *axes, uint32_t B, int zero);

/* The plan's text (flow_plan_write), NUL-terminated, its length in
 * *len_out; free() it. */
char *planutil_text(const flow_plan_t *p, size_t *len_out);

/* Parse text with its first from (which must occur) replaced by to, as
 * "t.plan": flow_plan_parse's result, with the plan in *plan_out on
 * FLOW_OK. */
flow_err_t planutil_parse_edited(const char *text, const char *from,
				 const char *to, flow_plan_t **plan_out,
				 flow_diag_t *diag);

#endif
