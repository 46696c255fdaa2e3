/* Meshes and nd-SBPs from their text forms, for the SBP, boxing and
 * signature tests: the texts are the tests' own, so a parse error is the
 * test's failure (cmocka's fail_msg, quoting the text). */
#ifndef FLOW_TEST_SBPUTIL_H
#define FLOW_TEST_SBPUTIL_H

#include <flow/sbp.h>

flow_mesh_t mesh_of(const char *text);
flow_nd_sbp_t sbp_of(const char *text);

#endif
