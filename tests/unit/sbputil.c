/* Meshes, nd-SBPs and boxing plans from text for the unit tests (see
 * sbputil.h). */
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

/* Plans shape (text) of dtype from sbp on mesh to sbp on mesh, with
 * cluster (NULL: the default). */
flow_boxing_plan_t typed_plan_of(const char *shape, flow_dtype_t dtype,
				 const char *from_mesh, const char *from,
				 const char *to_mesh, const char *to,
				 const flow_cluster_t *cluster)
{
	flow_shape_t s;
	assert_int_equal(flow_shape_parse(shape, &s, NULL), FLOW_OK);
	flow_mesh_t sm = mesh_of(from_mesh), dm = mesh_of(to_mesh);
	flow_nd_sbp_t x = sbp_of(from), y = sbp_of(to);
	flow_boxing_plan_t plan;
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_boxing_plan(&s, dtype, &sm, &x, &dm, &y, cluster, &plan, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	return plan;
}

/* The same in f32. */
flow_boxing_plan_t plan_of(const char *shape, const char *from_mesh,
			   const char *from, const char *to_mesh,
			   const char *to, const flow_cluster_t *cluster)
{
	return typed_plan_of(shape, FLOW_DTYPE_F32, from_mesh, from, to_mesh, to,
			     cluster);
}
