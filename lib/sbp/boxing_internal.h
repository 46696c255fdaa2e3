/* What the boxing planner (boxing.c), the reference executor
 * (boxing_sim.c) and the distributed executor (boxing_exec.c) must agree
 * on: which ranks form a group, in what order, which piece each member
 * holds, how a region of a piece is copied, and which source rank serves
 * which destination rank in a send/recv.  Byte counts are deliberately not
 * here: the planner derives them from formulas and the reference executor
 * counts what it moves, and the tests compare the two. */
#ifndef FLOW_BOXING_INTERNAL_H
#define FLOW_BOXING_INTERNAL_H

#include <flow/boxing.h>

/* Number of positions in a group of the axes in mask (bit i: axis i). */
static inline int64_t boxing_group_size(const flow_mesh_t *mesh, unsigned mask)
{
	int64_t p = 1;
	for (int i = 0; i < mesh->ndim; i++)
		if (mask & (1u << i))
			p *= mesh->dims[i];
	return p;
}

/* Whether position index is its group's first member (its coordinates on
 * the axes in mask are all 0): one group per such position. */
static inline bool boxing_group_leader(const flow_mesh_t *mesh, unsigned mask,
				       int64_t index)
{
	int64_t c[FLOW_MESH_MAX_AXES];
	flow_mesh_coords(mesh, index, c);
	for (int i = 0; i < mesh->ndim; i++)
		if ((mask & (1u << i)) && c[i] != 0)
			return false;
	return true;
}

/* The position of member q (row-major over the axes in mask, outer axis
 * first, so merged axes order their ranks as one axis of their product
 * would) of the group whose first member is leader. */
static inline int64_t boxing_group_member(const flow_mesh_t *mesh,
					  unsigned mask, int64_t leader,
					  int64_t q)
{
	int64_t index = leader, step = 1;
	for (int i = mesh->ndim - 1; i >= 0; i--) {
		if (mask & (1u << i)) {
			index += (q % mesh->dims[i]) * step;
			q /= mesh->dims[i];
		}
		step *= mesh->dims[i];
	}
	return index;
}

/* Where position index sits in its group of the axes in mask: returns its
 * member number (the q of boxing_group_member) and sets *leader_out to the
 * group's first member. */
static inline int64_t boxing_group_place(const flow_mesh_t *mesh,
					 unsigned mask, int64_t index,
					 int64_t *leader_out)
{
	int64_t c[FLOW_MESH_MAX_AXES], q = 0;
	flow_mesh_coords(mesh, index, c);
	for (int i = 0; i < mesh->ndim; i++)
		if (mask & (1u << i)) {
			q = q * mesh->dims[i] + c[i];
			c[i] = 0;
		}
	*leader_out = flow_mesh_index(mesh, c);
	return q;
}

/* The boxes member q of the group of axes (st->axes; all the mesh's for a
 * send/recv within st's mesh) whose first member is leader holds before
 * and after step st, on st's mesh; returns its position. */
static inline int64_t boxing_member_boxes(const flow_shape_t *shape,
					  const flow_boxing_step_t *st,
					  unsigned axes, int64_t leader,
					  int64_t q, flow_box_t *from_out,
					  flow_box_t *to_out)
{
	int64_t i = boxing_group_member(&st->mesh, axes, leader, q);
	flow_nd_sbp_local_box(shape, &st->from, &st->mesh, i, from_out);
	flow_nd_sbp_local_box(shape, &st->to, &st->mesh, i, to_out);
	return i;
}


/* The send/recv rule (flow(7), BOXING).  Source positions with the same
 * coordinates on the S and P axes of src hold the same data; they differ
 * only on the B axes (their replica index).  The destination at position
 * j takes each piece from itself when its rank holds that piece as a
 * source (at position s_index of src_mesh; -1 when it is no source), and
 * otherwise from the replica j mod (number of replicas), so every addend
 * of every element arrives exactly once and receivers spread over the
 * replicas.  Returns whether source position i serves position j. */
static inline bool boxing_serves(const flow_mesh_t *src_mesh,
				 const flow_nd_sbp_t *src, int64_t i,
				 int64_t s_index, int64_t j)
{
	int64_t ci[FLOW_MESH_MAX_AXES], cs[FLOW_MESH_MAX_AXES];
	flow_mesh_coords(src_mesh, i, ci);
	bool same_piece = s_index >= 0;
	if (same_piece)
		flow_mesh_coords(src_mesh, s_index, cs);
	int64_t replica = 0, replicas = 1;
	for (int a = 0; a < src_mesh->ndim; a++) {
		if (src->sbp[a].kind == FLOW_SBP_BROADCAST) {
			replica = replica * src_mesh->dims[a] + ci[a];
			replicas *= src_mesh->dims[a];
		} else if (same_piece && cs[a] != ci[a]) {
			same_piece = false;
		}
	}
	if (same_piece)
		return i == s_index;
	return replica == j % replicas;
}

/* Whether send/recv step st sums what arrives: its source is P on an axis
 * of more than one position, so the sources send addends. */
static inline bool boxing_send_recv_sums(const flow_boxing_step_t *st)
{
	for (int a = 0; a < st->from.ndim; a++)
		if (st->from.sbp[a].kind == FLOW_SBP_PARTIAL && st->mesh.dims[a] > 1)
			return true;
	return false;
}

/* The region source position i of send/recv step st, holding have, sends
 * destination position j of st->to_mesh, needing need: their intersection
 * when boxing_serves pairs them (dst_as_src: j's rank's position on
 * st->mesh, -1 when none).  False when i sends j nothing.  A position
 * that is both ends of a pair sends itself what it keeps, so a receiver
 * gets every piece, and every addend, through this one rule. */
static inline bool boxing_send_recv_cut(const flow_boxing_step_t *st,
					int64_t i, const flow_box_t *have,
					int64_t dst_as_src, int64_t j,
					const flow_box_t *need,
					flow_box_t *cut_out)
{
	return boxing_serves(&st->mesh, &st->from, i, dst_as_src, j) &&
	       flow_box_intersect(have, need, cut_out);
}

#endif
