/* Meshes and nd-SBPs from text for the unit tests (see sbputil.h). */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sbputil.h"

flow_mesh_t mesh_of(const char *text)
{
	flow_mesh_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_mesh_parse(text, &m, &diag) != FLOW_OK)
		fail_msg("mesh '%s': %s", text, flow_diag_message(&diag));
	return m;
}

flow_nd_sbp_t sbp_of(const char *text)
{
	flow_nd_sbp_t s;
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_nd_sbp_parse(text, &s, &diag) != FLOW_OK)
		fail_msg("nd-SBP '%s': %s", text, flow_diag_message(&diag));
	return s;
}
