/* Meshes and nd-SBPs from their text forms, for the SBP, boxing and
 * signature tests: the texts are the tests' own, so a parse error is the
 * test's failure (cmocka's fail_msg, quoting the text).  Below them, what
 * the property tests draw their cases with, in this header alone so that
 * a program without cmocka (tests/cluster/boxing_check) can use it too. */
#ifndef FLOW_TEST_SBPUTIL_H
#define FLOW_TEST_SBPUTIL_H

#include <stddef.h>
#include <stdint.h>

#include <flow/boxing.h>
#include <flow/sbp.h>

flow_mesh_t mesh_of(const char *text);
flow_nd_sbp_t sbp_of(const char *text);
/* The boxing plan of shape (text) of dtype from sbp on mesh to sbp on
 * mesh, with cluster (NULL: the default); a refusal fails the test. */
flow_boxing_plan_t typed_plan_of(const char *shape, flow_dtype_t dtype,
				 const char *from_mesh, const char *from,
				 const char *to_mesh, const char *to,
				 const flow_cluster_t *cluster);
/* The same in f32. */
flow_boxing_plan_t plan_of(const char *shape, const char *from_mesh,
			   const char *from, const char *to_mesh,
			   const char *to, const flow_cluster_t *cluster);

/* ---- for property tests, and no cmocka ----------------------------------- */

/* splitmix64: a whole random case follows from one seed. */
static inline uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

/* An integer in [lo, hi], from splitmix64. */
static inline int64_t splitmix64_range(uint64_t *state, int64_t lo,
				       int64_t hi)
{
	return lo + (int64_t)(splitmix64(state) % (uint64_t)(hi - lo + 1));
}

/* Every valid nd-SBP of shape on mesh, from {B, P, S(0)..S(ndim-1)} per
 * axis, in a fixed order: the first cap of them into out.  Returns how
 * many it wrote. */
static inline size_t all_layouts(const flow_shape_t *shape,
				 const flow_mesh_t *mesh, flow_nd_sbp_t *out,
				 size_t cap)
{
	int kinds = shape->ndim + 2;
	int64_t total = 1;
	size_t n = 0;
	for (int i = 0; i < mesh->ndim; i++)
		total *= kinds;
	for (int64_t code = 0; code < total && n < cap; code++) {
		flow_nd_sbp_t sbp = { .ndim = mesh->ndim };
		int64_t c = code;
		for (int i = 0; i < mesh->ndim; i++, c /= kinds) {
			int d = (int)(c % kinds);
			sbp.sbp[i] = d == 0 ? (flow_sbp_t){ FLOW_SBP_BROADCAST, 0 } :
				     d == 1 ? (flow_sbp_t){ FLOW_SBP_PARTIAL, 0 } :
					      (flow_sbp_t){ FLOW_SBP_SPLIT, d - 2 };
		}
		if (flow_nd_sbp_check(shape, &sbp, mesh, NULL) == FLOW_OK)
			out[n++] = sbp;
	}
	return n;
}

#endif
