/* Verification of a boxing plan (flow_boxing_verify, flow-plan --verify):
 * run it in the reference executor on data whose every sum is exact, then
 * check each destination rank's slice element by element and each rank's
 * bytes against the planner's formulas.  The data and the checks know
 * nothing of the route, so a wrong step shows as a wrong element, and a
 * wrong byte formula as a count that differs from what was moved. */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <flow/boxing.h>
#include <flow/mem.h>

/* The data: element e of the logical tensor (row-major) is
 * 1 + e mod (bound - 1), an integer every dtype holds exactly, and a
 * partial-sum source splits it into non-negative integer addends, so every
 * sum the plan makes is exact and no larger than the element. */
static int64_t verify_bound(flow_dtype_t dtype)
{
	switch (dtype) {
	case FLOW_DTYPE_BF16:
		return 256;
	case FLOW_DTYPE_F16:
		return 2048;
	case FLOW_DTYPE_U8:
		return 255;
	case FLOW_DTYPE_U16:
		return 65535;
	case FLOW_DTYPE_F32:
		return (int64_t)1 << 24;
	default:
		return (int64_t)1 << 30;
	}
}

static unsigned partial_axes(const flow_nd_sbp_t *sbp)
{
	unsigned mask = 0;
	for (int a = 0; a < sbp->ndim; a++)
		if (sbp->sbp[a].kind == FLOW_SBP_PARTIAL)
			mask |= 1u << a;
	return mask;
}

/* Fill every source rank's piece with the data. */
static flow_err_t fill_sources(const flow_boxing_plan_t *plan, void **local,
			       flow_diag_t *diag)
{
	const flow_mesh_t *mesh = &plan->src_mesh;
	unsigned pmask = partial_axes(&plan->src);
	int64_t bound = verify_bound(plan->dtype);
	size_t dsize = flow_dtype_size(plan->dtype);
	for (int64_t i = 0; i < flow_mesh_size(mesh); i++) {
		int64_t rank = flow_mesh_rank(mesh, i);
		int64_t coords[FLOW_MESH_MAX_AXES], pos[FLOW_MAX_DIMS];
		flow_box_t box;
		flow_mesh_coords(mesh, i, coords);
		flow_nd_sbp_local_box(&plan->shape, &plan->src, mesh, i, &box);
		/* This rank's place j among the q addends of each element. */
		int64_t j = 0, q = 1;
		for (int a = 0; a < mesh->ndim; a++) {
			if (pmask & (1u << a)) {
				j = j * mesh->dims[a] + coords[a];
				q *= mesh->dims[a];
			}
		}
		size_t n = (size_t)flow_box_numel(&box), bytes;
		if (!flow_mul_size(n, dsize, &bytes) ||
		    !(local[rank] = flow_alloc(bytes)))
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "cannot allocate the piece of rank %" PRId64,
					     rank);
		for (size_t k = 0; k < n; k++) {
			int64_t v = 1 + flow_box_element(&plan->shape, &box, (int64_t)k, pos) % (bound - 1);
			flow_dtype_store(local[rank], k, plan->dtype,
					 (double)(v / q + (j < v % q)));
		}
	}
	return FLOW_OK;
}

static void format_position(const flow_box_t *box, const int64_t *pos,
			    char *buf, size_t cap)
{
	size_t len = 0;
	len += (size_t)snprintf(buf, cap, "(");
	for (int d = 0; d < box->ndim && len < cap; d++)
		len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64,
					d ? "," : "", pos[d]);
	if (len < cap)
		snprintf(buf + len, cap - len, ")");
}

/* Every destination rank (or partial-sum group of ranks) must hold its
 * slice of the data. */
static flow_err_t check_destinations(const flow_boxing_plan_t *plan,
				     void *const *local, flow_diag_t *diag)
{
	const flow_mesh_t *mesh = &plan->dst_mesh;
	unsigned pmask = partial_axes(&plan->dst);
	int64_t bound = verify_bound(plan->dtype);
	for (int64_t i = 0; i < flow_mesh_size(mesh); i++) {
		int64_t coords[FLOW_MESH_MAX_AXES], pos[FLOW_MAX_DIMS];
		flow_mesh_coords(mesh, i, coords);
		bool leader = true;
		for (int a = 0; a < mesh->ndim; a++)
			if ((pmask & (1u << a)) && coords[a] != 0)
				leader = false;
		if (!leader)
			continue;
		/* The ranks whose addends sum to the element (just this one
		 * when the destination has no P axis): they differ only in
		 * P coordinates, so they hold the same box. */
		flow_mesh_t group;
		flow_box_t box;
		flow_mesh_group(mesh, pmask, i, &group);
		flow_nd_sbp_local_box(&plan->shape, &plan->dst, mesh, i, &box);
		int64_t members = pmask ? flow_mesh_size(&group) : 1;
		char ranks[256] = "";
		size_t len = 0;
		for (int64_t g = 0; g < members; g++) {
			int64_t rank = pmask ? flow_mesh_rank(&group, g) :
					       flow_mesh_rank(mesh, i);
			if (!local[rank])
				return flow_diag_set(diag, FLOW_ERR_VERIFY,
						     "verification failed: rank %" PRId64 " holds nothing",
						     rank);
			if (len < sizeof(ranks))
				len += (size_t)snprintf(ranks + len, sizeof(ranks) - len,
							"%s%" PRId64, g ? "+" : "", rank);
		}
		for (size_t k = 0, n = (size_t)flow_box_numel(&box); k < n; k++) {
			int64_t e = flow_box_element(&plan->shape, &box, (int64_t)k, pos);
			double want = (double)(1 + e % (bound - 1)), got = 0;
			for (int64_t g = 0; g < members; g++) {
				int64_t rank = pmask ? flow_mesh_rank(&group, g) :
						       flow_mesh_rank(mesh, i);
				got += flow_dtype_load(local[rank], k, plan->dtype);
			}
			if (got != want) {
				char where[256];
				format_position(&box, pos, where, sizeof(where));
				if (members > 1)
					return flow_diag_set(diag, FLOW_ERR_VERIFY,
							     "verification failed: the addends of element %s on ranks %s sum to %g, expected %g",
							     where, ranks, got, want);
				return flow_diag_set(diag, FLOW_ERR_VERIFY,
						     "verification failed: element %s on rank %s is %g, expected %g",
						     where, ranks, got, want);
			}
		}
	}
	return FLOW_OK;
}

/* Each rank's bytes, as the executor moved them, must be the plan's. */
static flow_err_t check_bytes(const flow_boxing_plan_t *plan, size_t nranks,
			      const uint64_t *sent, const uint64_t *recvd,
			      flow_diag_t *diag)
{
	uint64_t total = 0;
	for (size_t r = 0; r < nranks; r++) {
		uint64_t want_sent, want_recvd;
		flow_boxing_plan_rank_bytes(plan, (int64_t)r, &want_sent,
					    &want_recvd);
		if (sent[r] != want_sent)
			return flow_diag_set(diag, FLOW_ERR_VERIFY,
					     "verification failed: rank %zu sent %" PRIu64 " bytes, the plan says %" PRIu64,
					     r, sent[r], want_sent);
		if (recvd[r] != want_recvd)
			return flow_diag_set(diag, FLOW_ERR_VERIFY,
					     "verification failed: rank %zu received %" PRIu64 " bytes, the plan says %" PRIu64,
					     r, recvd[r], want_recvd);
		total += sent[r];
	}
	if (total != plan->total_bytes)
		return flow_diag_set(diag, FLOW_ERR_VERIFY,
				     "verification failed: the ranks sent %" PRIu64 " bytes in all, the plan says %" PRIu64,
				     total, plan->total_bytes);
	return FLOW_OK;
}

flow_err_t flow_boxing_verify(const flow_boxing_plan_t *plan,
			      flow_diag_t *diag)
{
	int64_t top = flow_mesh_top_rank(&plan->src_mesh);
	if (flow_mesh_top_rank(&plan->dst_mesh) > top)
		top = flow_mesh_top_rank(&plan->dst_mesh);
	size_t nranks = (size_t)top + 1;
	flow_err_t err = FLOW_ERR_NOMEM;
	void **local = calloc(nranks, sizeof(*local));
	uint64_t *sent = calloc(nranks, sizeof(*sent));
	uint64_t *recvd = calloc(nranks, sizeof(*recvd));
	if (!local || !sent || !recvd) {
		flow_diag_set(diag, err, "cannot allocate %zu simulated ranks", nranks);
		goto out_free_arrays;
	}
	err = fill_sources(plan, local, diag);
	if (err == FLOW_OK)
		err = flow_boxing_simulate(plan, local, nranks, sent, recvd, diag);
	if (err == FLOW_OK)
		err = check_destinations(plan, local, diag);
	if (err == FLOW_OK)
		err = check_bytes(plan, nranks, sent, recvd, diag);
	for (size_t r = 0; r < nranks; r++)
		flow_free(local[r]);
out_free_arrays:
	free(recvd);
	free(sent);
	free(local);
	return err;
}
