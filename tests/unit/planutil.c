/* Plans and plan texts for the unit tests (see planutil.h). */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planutil.h"

flow_plan_t *planutil_standard(const char *model, const char *mesh,
			       const char *axes, uint32_t B, int zero)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *p = NULL;

	if (flow_plan_standard(model, mesh, axes, B, 0, 1, zero, &p, &diag))
		fail_msg("standard plan of %s on %s (%s): %s", model, mesh,
			 axes, diag.msg);
	return p;
}

char *planutil_text(const flow_plan_t *p, size_t *len_out)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	flow_diag_t diag = FLOW_DIAG_INIT;

	if (!f)
		fail_msg("open_memstream failed");
	if (flow_plan_write(p, f, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	fclose(f);
	*len_out = len;
	return buf;
}

flow_err_t planutil_parse_edited(const char *text, const char *from,
				 const char *to, flow_plan_t **plan_out,
				 flow_diag_t *diag)
{
	const char *at = strstr(text, from);
	size_t n = strlen(text) + strlen(to) + 1;
	char *edited = malloc(n);
	flow_err_t err;

	/* fail_msg jumps out of the test; the returns are for the compiler,
	 * which does not know that. */
	if (!at || !edited) {
		free(edited);
		if (!at)
			fail_msg("no '%s' in the plan", from);
		else
			fail_msg("out of memory");
		return FLOW_ERR_USAGE;
	}
	snprintf(edited, n, "%.*s%s%s", (int)(at - text), text, to,
		 at + strlen(from));
	err = flow_plan_parse(edited, strlen(edited), "t.plan", plan_out, diag);
	free(edited);
	return err;
}
