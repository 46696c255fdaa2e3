/* Boxing plans: the cheapest sequence of collectives, local operations and
 * send/recv that turns one layout of a tensor into another, and what each
 * step costs on a cluster profile (flow(7), BOXING and COSTS). */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/mem.h>

#include "boxing_internal.h"

/* ---- steps and their traffic -------------------------------------------------- */

const char *flow_boxing_kind_name(flow_boxing_kind_t kind)
{
	static const char *const names[FLOW_BOXING_KIND_COUNT] = {
		[FLOW_BOXING_ALL_REDUCE] = "all-reduce",
		[FLOW_BOXING_REDUCE_SCATTER] = "reduce-scatter",
		[FLOW_BOXING_ALL_GATHER] = "all-gather",
		[FLOW_BOXING_ALL_TO_ALL] = "all-to-all",
		[FLOW_BOXING_BROADCAST] = "broadcast",
		[FLOW_BOXING_SLICE] = "slice",
		[FLOW_BOXING_ZERO_FILL] = "zero-fill",
		[FLOW_BOXING_PAD_ZERO] = "pad-zero",
		[FLOW_BOXING_SEND_RECV] = "send-recv",
	};
	if ((int)kind < 0 || (int)kind >= FLOW_BOXING_KIND_COUNT)
		return "unknown";
	return names[kind];
}

/* One step with what is needed to count its traffic.  The boxes of the
 * positions before (on st->mesh) and after (on st->to_mesh) come from the
 * caches when given, else they are computed. */
typedef struct step_view {
	const flow_shape_t *shape;
	uint64_t esize;
	const flow_boxing_step_t *st;
	const flow_box_t *from_boxes, *to_boxes;
	const flow_cluster_t *cluster; /* NULL: no time */
	uint64_t *scratch; /* 2 per source position, for a send/recv of all ranks */
} step_view_t;

/* What a step moves.  With rank >= 0 only that rank's bytes are counted,
 * in rank_send and rank_recv; else the busiest ranks, the sum and the
 * time. */
typedef struct traffic {
	int64_t rank;
	uint64_t rank_send, rank_recv;
	uint64_t max_send, max_recv, total;
	double time_s;
} traffic_t;

static const flow_box_t *from_box(const step_view_t *v, int64_t i,
				  flow_box_t *scratch)
{
	if (v->from_boxes)
		return &v->from_boxes[i];
	flow_nd_sbp_local_box(v->shape, &v->st->from, &v->st->mesh, i, scratch);
	return scratch;
}

static const flow_box_t *to_box(const step_view_t *v, int64_t j,
				flow_box_t *scratch)
{
	if (v->to_boxes)
		return &v->to_boxes[j];
	flow_nd_sbp_local_box(v->shape, &v->st->to, &v->st->to_mesh, j, scratch);
	return scratch;
}

static void count_send(traffic_t *t, int64_t rank, uint64_t bytes)
{
	if (bytes > t->max_send)
		t->max_send = bytes;
	t->total += bytes;
	if (rank == t->rank)
		t->rank_send += bytes;
}

static void count_recv(traffic_t *t, int64_t rank, uint64_t bytes)
{
	if (bytes > t->max_recv)
		t->max_recv = bytes;
	if (rank == t->rank)
		t->rank_recv += bytes;
}

static int64_t node_of(const flow_cluster_t *c, int64_t rank)
{
	return rank / c->ranks_per_node;
}

/* Elements of member q's piece of a ring collective (indices mod p). */
static int64_t ring_piece(const step_view_t *v, int64_t leader, int64_t p,
			  int64_t q)
{
	const flow_boxing_step_t *st = v->st;
	flow_box_t b;
	int64_t i = boxing_group_member(&st->mesh, st->axes, leader, (q + p) % p);
	switch (st->kind) {
	case FLOW_BOXING_ALL_GATHER:
		return flow_box_numel(from_box(v, i, &b));
	case FLOW_BOXING_ALL_REDUCE: {
		int64_t start, size;
		flow_split_part(flow_box_numel(from_box(v, leader, &b)), p,
				(q + p) % p, &start, &size);
		return size;
	}
	default: /* reduce-scatter, broadcast */
		return flow_box_numel(to_box(v, i, &b));
	}
}

/* A collective on one group: every member's bytes by the ring rules, and
 * the group's time. */
static void group_traffic(const step_view_t *v, int64_t leader, traffic_t *t)
{
	const flow_boxing_step_t *st = v->st;
	const flow_mesh_t *mesh = &st->mesh;
	int64_t p = boxing_group_size(mesh, st->axes);
	int64_t total = 0, piece = 0, lo_node = INT64_MAX, hi_node = -1;
	for (int64_t q = 0; q < p; q++) {
		int64_t s = st->kind == FLOW_BOXING_ALL_TO_ALL ? 0 :
			    ring_piece(v, leader, p, q);
		total += s;
		piece = s > piece ? s : piece;
	}
	if (st->kind == FLOW_BOXING_BROADCAST)
		total = piece; /* every member holds the same T */
	for (int64_t q = 0; q < p; q++) {
		int64_t rank = flow_mesh_rank(mesh, boxing_group_member(mesh, st->axes, leader, q));
		int64_t send = 0, recv = 0;
		switch (st->kind) {
		case FLOW_BOXING_ALL_GATHER:
			send = total - ring_piece(v, leader, p, q + 1);
			recv = total - ring_piece(v, leader, p, q);
			break;
		case FLOW_BOXING_REDUCE_SCATTER:
			send = total - ring_piece(v, leader, p, q);
			recv = total - ring_piece(v, leader, p, q - 1);
			break;
		case FLOW_BOXING_ALL_REDUCE:
			send = 2 * total - ring_piece(v, leader, p, q) -
			       ring_piece(v, leader, p, q + 1);
			recv = 2 * total - ring_piece(v, leader, p, q - 1) -
			       ring_piece(v, leader, p, q);
			break;
		case FLOW_BOXING_BROADCAST:
			send = q < p - 1 ? total : 0;
			recv = q > 0 ? total : 0;
			break;
		default: { /* all-to-all: exact intersections */
			flow_box_t b1, b2, cut;
			int64_t i = boxing_group_member(mesh, st->axes, leader, q);
			for (int64_t r = 0; r < p; r++) {
				if (r == q)
					continue;
				int64_t k = boxing_group_member(mesh, st->axes, leader, r);
				if (flow_box_intersect(from_box(v, i, &b1), to_box(v, k, &b2), &cut)) {
					int64_t n = flow_box_numel(&cut);
					send += n;
					piece = n > piece ? n : piece;
				}
				if (flow_box_intersect(from_box(v, k, &b1), to_box(v, i, &b2), &cut))
					recv += flow_box_numel(&cut);
			}
			break;
		}
		}
		count_send(t, rank, (uint64_t)send * v->esize);
		count_recv(t, rank, (uint64_t)recv * v->esize);
		if (v->cluster) {
			int64_t node = node_of(v->cluster, rank);
			lo_node = node < lo_node ? node : lo_node;
			hi_node = node > hi_node ? node : hi_node;
		}
	}
	if (!v->cluster)
		return;
	const flow_link_t *link = lo_node == hi_node ? &v->cluster->intra :
						       &v->cluster->inter;
	double steps = (double)(st->kind == FLOW_BOXING_ALL_REDUCE ? 2 * (p - 1) : p - 1);
	double time = steps * (link->alpha_s +
			       (double)((uint64_t)piece * v->esize) / link->beta_bps);
	if (time > t->time_s)
		t->time_s = time;
}

/* The elements source position i sends to destination position j in a
 * send/recv: the intersection of what one holds and the other needs, when
 * the rule of boxing_serves pairs them on different ranks; dst_as_src is
 * j's position in the source mesh. */
static int64_t pair_elems(const step_view_t *v, int64_t i, int64_t j,
			  int64_t dst_as_src)
{
	const flow_boxing_step_t *st = v->st;
	flow_box_t b1, b2, cut;
	if (i == dst_as_src || !boxing_serves(&st->mesh, &st->from, i, dst_as_src, j) ||
	    !flow_box_intersect(from_box(v, i, &b1), to_box(v, j, &b2), &cut))
		return 0;
	return flow_box_numel(&cut);
}

/* Send/recv for one rank: its messages as a receiver and as a sender. */
static void send_recv_rank(const step_view_t *v, traffic_t *t)
{
	const flow_boxing_step_t *st = v->st;
	int64_t na = flow_mesh_size(&st->mesh), nb = flow_mesh_size(&st->to_mesh);
	int64_t j = flow_mesh_index_of(&st->to_mesh, t->rank);
	int64_t i = flow_mesh_index_of(&st->mesh, t->rank);
	for (int64_t k = 0; j >= 0 && k < na; k++)
		t->rank_recv += (uint64_t)pair_elems(v, k, j, i) * v->esize;
	for (int64_t k = 0; i >= 0 && k < nb; k++) {
		int64_t as_src = flow_mesh_index_of(&st->mesh, flow_mesh_rank(&st->to_mesh, k));
		t->rank_send += (uint64_t)pair_elems(v, i, k, as_src) * v->esize;
	}
}

/* Send/recv for all ranks, destination by destination, with the senders'
 * sums in v->scratch. */
static void send_recv_traffic(const step_view_t *v, traffic_t *t)
{
	const flow_boxing_step_t *st = v->st;
	int64_t na = flow_mesh_size(&st->mesh), nb = flow_mesh_size(&st->to_mesh);
	uint64_t *sent = v->scratch, *sends = v->scratch + na, msgs = 0;
	bool inter = false;
	memset(v->scratch, 0, 2 * (size_t)na * sizeof(*v->scratch));
	for (int64_t j = 0; j < nb; j++) {
		int64_t s = flow_mesh_rank(&st->to_mesh, j);
		int64_t as_src = flow_mesh_index_of(&st->mesh, s);
		uint64_t recv = 0, n = 0;
		for (int64_t i = 0; i < na; i++) {
			uint64_t bytes = (uint64_t)pair_elems(v, i, j, as_src) * v->esize;
			if (bytes == 0)
				continue;
			recv += bytes;
			n++;
			sent[i] += bytes;
			sends[i]++;
			if (v->cluster && node_of(v->cluster, flow_mesh_rank(&st->mesh, i)) !=
						  node_of(v->cluster, s))
				inter = true;
		}
		count_recv(t, s, recv);
		msgs = n > msgs ? n : msgs;
	}
	for (int64_t i = 0; i < na; i++) {
		count_send(t, flow_mesh_rank(&st->mesh, i), sent[i]);
		msgs = sends[i] > msgs ? sends[i] : msgs;
	}
	if (!v->cluster || msgs == 0)
		return;
	const flow_link_t *link = inter ? &v->cluster->inter : &v->cluster->intra;
	uint64_t busiest = t->max_send > t->max_recv ? t->max_send : t->max_recv;
	t->time_s = (double)msgs * link->alpha_s + (double)busiest / link->beta_bps;
}

static void step_traffic(const step_view_t *v, traffic_t *t)
{
	const flow_boxing_step_t *st = v->st;
	t->rank_send = t->rank_recv = 0;
	t->max_send = t->max_recv = t->total = 0;
	t->time_s = 0;
	switch (st->kind) {
	case FLOW_BOXING_SLICE:
	case FLOW_BOXING_ZERO_FILL:
	case FLOW_BOXING_PAD_ZERO:
		return;
	case FLOW_BOXING_SEND_RECV:
		if (t->rank >= 0)
			send_recv_rank(v, t);
		else
			send_recv_traffic(v, t);
		return;
	default:
		break;
	}
	if (t->rank >= 0) { /* the rank's own group */
		int64_t i = flow_mesh_index_of(&st->mesh, t->rank);
		if (i < 0)
			return;
		int64_t c[FLOW_MESH_MAX_AXES];
		flow_mesh_coords(&st->mesh, i, c);
		for (int a = 0; a < st->mesh.ndim; a++)
			if (st->axes & (1u << a))
				c[a] = 0;
		group_traffic(v, flow_mesh_index(&st->mesh, c), t);
		return;
	}
	int64_t n = flow_mesh_size(&st->mesh);
	for (int64_t i = 0; i < n; i++)
		if (boxing_group_leader(&st->mesh, st->axes, i))
			group_traffic(v, i, t);
}

void flow_boxing_step_rank_bytes(const flow_boxing_plan_t *plan, size_t step,
				 int64_t rank, uint64_t *send_out,
				 uint64_t *recv_out)
{
	*send_out = *recv_out = 0;
	if (step >= plan->nsteps)
		return;
	step_view_t v = { &plan->shape, flow_dtype_size(plan->dtype),
			  &plan->steps[step], NULL, NULL, NULL, NULL };
	traffic_t t = { .rank = rank };
	step_traffic(&v, &t);
	*send_out = t.rank_send;
	*recv_out = t.rank_recv;
}

void flow_boxing_plan_rank_bytes(const flow_boxing_plan_t *plan, int64_t rank,
				 uint64_t *send_out, uint64_t *recv_out)
{
	uint64_t send = 0, recv = 0;
	for (size_t k = 0; k < plan->nsteps; k++) {
		uint64_t a, b;
		flow_boxing_step_rank_bytes(plan, k, rank, &a, &b);
		send += a;
		recv += b;
	}
	*send_out = send;
	*recv_out = recv;
}

/* Every rank of both placements: a rank in both is met twice, with the
 * same sums. */
void flow_boxing_plan_busiest(const flow_boxing_plan_t *plan,
			      uint64_t *send_out, uint64_t *recv_out)
{
	*send_out = *recv_out = 0;
	const flow_mesh_t *meshes[2] = { &plan->src_mesh, &plan->dst_mesh };
	for (int m = 0; m < 2; m++) {
		for (int64_t i = 0; i < flow_mesh_size(meshes[m]); i++) {
			uint64_t send, recv;
			flow_boxing_plan_rank_bytes(plan, flow_mesh_rank(meshes[m], i),
						    &send, &recv);
			*send_out = send > *send_out ? send : *send_out;
			*recv_out = recv > *recv_out ? recv : *recv_out;
		}
	}
}

/* ---- the route search --------------------------------------------------------- */

/* Search states are the nd-SBPs of one placement (a side: the source
 * placement, and the destination one when it differs) over its
 * normalised axes, coded as digits base K = shape.ndim + 2 (0 B, 1 P, 2+k
 * S(k)), digit t for normalised axis t.  Normalising drops the axes of
 * size 1 (they hold one copy whatever their SBP; steps show them as the
 * side's own layout has them) and merges adjacent axes that hold equal
 * SBPs in the layouts the side starts or ends at and split exactly as one
 * axis of their product would: those stay one axis throughout, so
 * (P,P) -> (B,B) is one all-reduce over all ranks. */
enum { DIGIT_B = 0, DIGIT_P = 1, DIGIT_S0 = 2 };

typedef struct side {
	const flow_mesh_t *mesh;
	flow_nd_sbp_t decor; /* the layout whose size-1 axes steps show */
	int naxes;
	unsigned axes[FLOW_MESH_MAX_AXES]; /* mesh axes of each normalised one */
	int64_t npos;
	int64_t first; /* node id of state 0 */
} side_t;

typedef struct node {
	double time_s;
	uint64_t bytes;
	int64_t key_ps; /* time in picoseconds: equal routes compare equal */
	int steps;
	int64_t prev;
	flow_boxing_kind_t kind;
	unsigned axes;
	signed char valid; /* 0 not yet known, 1 valid, -1 invalid */
	bool reached, done;
} node_t;

typedef struct heap_item {
	int64_t key_ps;
	uint64_t bytes;
	int steps;
	int64_t id;
} heap_item_t;

typedef struct planner {
	const flow_shape_t *shape;
	uint64_t esize;
	const flow_cluster_t *cluster;
	int base; /* K */
	int64_t pow[FLOW_MESH_MAX_AXES + 1];
	int nsides;
	side_t side[2];
	node_t *nodes;
	int64_t nnodes;
	int64_t start, target;
	bool one_rule; /* a single 1-D rule turns start into target */
	heap_item_t *heap;
	size_t heap_len, heap_cap;
	flow_box_t *from_boxes, *to_boxes; /* scratch, one per position */
	uint64_t *pair_scratch;            /* two per position */
} planner_t;

static int digit_of(const planner_t *pl, int64_t code, int t)
{
	return (int)(code / pl->pow[t] % pl->base);
}

static flow_sbp_t digit_sbp(int digit)
{
	flow_sbp_t s = { FLOW_SBP_BROADCAST, 0 };
	if (digit == DIGIT_P)
		s.kind = FLOW_SBP_PARTIAL;
	else if (digit >= DIGIT_S0)
		s = (flow_sbp_t){ FLOW_SBP_SPLIT, digit - DIGIT_S0 };
	return s;
}

static int sbp_digit(flow_sbp_t s)
{
	if (s.kind == FLOW_SBP_SPLIT)
		return DIGIT_S0 + s.axis;
	return s.kind == FLOW_SBP_PARTIAL ? DIGIT_P : DIGIT_B;
}

static const side_t *side_of(const planner_t *pl, int64_t id)
{
	return id >= pl->side[1].first && pl->nsides == 2 ? &pl->side[1] : &pl->side[0];
}

static void node_layout(const planner_t *pl, int64_t id, flow_nd_sbp_t *out)
{
	const side_t *sd = side_of(pl, id);
	int64_t code = id - sd->first;
	*out = sd->decor;
	for (int t = 0; t < sd->naxes; t++)
		for (int i = 0; i < sd->mesh->ndim; i++)
			if (sd->axes[t] & (1u << i))
				out->sbp[i] = digit_sbp(digit_of(pl, code, t));
}

static int64_t layout_node(const planner_t *pl, int sidx,
			   const flow_nd_sbp_t *sbp)
{
	const side_t *sd = &pl->side[sidx];
	int64_t code = 0;
	for (int t = 0; t < sd->naxes; t++)
		code += sbp_digit(sbp->sbp[__builtin_ctz(sd->axes[t])]) * pl->pow[t];
	return sd->first + code;
}

/* Whether splitting n over the mesh axes dims[0..r) outer to inner, each
 * on the extent the outer ones left, gives every position the same part
 * as one balanced split of n over their product (OneFlow's CanMergeSplit,
 * computed rather than assumed). */
static bool split_merges(int64_t n, const int64_t *dims, int r)
{
	int64_t total = 1;
	for (int t = 0; t < r; t++)
		total *= dims[t];
	for (int64_t q = 0; q < total; q++) {
		int64_t start = 0, extent = n, rest = q, stride = total;
		for (int t = 0; t < r; t++) {
			int64_t s;
			stride /= dims[t];
			flow_split_part(extent, dims[t], rest / stride, &s, &extent);
			start += s;
			rest %= stride;
		}
		int64_t fs, fe;
		flow_split_part(n, total, q, &fs, &fe);
		if (fs != start || fe != extent)
			return false;
	}
	return true;
}

/* Whether the mesh axes in mask, all holding sbp's SBP there, act as one
 * axis of their product: always for B and P, and for S(k) when the split
 * merges for every extent the outer axes leave. */
static bool axes_merge(const flow_shape_t *shape, const flow_mesh_t *mesh,
		       const flow_nd_sbp_t *sbp, unsigned mask)
{
	int first = __builtin_ctz(mask);
	if (__builtin_popcount(mask) < 2 || sbp->sbp[first].kind != FLOW_SBP_SPLIT)
		return true;
	int k = sbp->sbp[first].axis, r = 0;
	int64_t dims[FLOW_MESH_MAX_AXES];
	for (int i = 0; i < mesh->ndim; i++)
		if (mask & (1u << i))
			dims[r++] = mesh->dims[i];
	flow_nd_sbp_t outer = *sbp;
	outer.ndim = first;
	for (int64_t i = 0; i < flow_mesh_size(mesh); i++) {
		if (!boxing_group_leader(mesh, ~0u << first, i))
			continue; /* the same outer coordinates as one seen */
		flow_box_t box;
		flow_nd_sbp_local_box(shape, &outer, mesh, i, &box);
		if (!split_merges(box.extent[k], dims, r))
			return false;
	}
	return true;
}

/* The mesh axes of the normalised axes a..b of id's side. */
static unsigned run_axes(const planner_t *pl, int64_t id, int a, int b)
{
	unsigned mask = 0;
	for (int t = a; t <= b; t++)
		mask |= side_of(pl, id)->axes[t];
	return mask;
}

/* A state is valid when its nd-SBP is, and each merged axis splits as one
 * axis would. */
static bool node_valid(planner_t *pl, int64_t id)
{
	node_t *n = &pl->nodes[id];
	if (n->valid == 0) {
		const side_t *sd = side_of(pl, id);
		flow_nd_sbp_t s;
		node_layout(pl, id, &s);
		bool ok = flow_nd_sbp_check(pl->shape, &s, sd->mesh, NULL) == FLOW_OK;
		for (int t = 0; ok && t < sd->naxes; t++)
			ok = axes_merge(pl->shape, sd->mesh, &s, sd->axes[t]);
		n->valid = ok ? 1 : -1;
	}
	return n->valid > 0;
}

static void layout_boxes(const planner_t *pl, int64_t id, flow_box_t *boxes)
{
	const side_t *sd = side_of(pl, id);
	flow_nd_sbp_t s;
	node_layout(pl, id, &s);
	for (int64_t i = 0; i < sd->npos; i++)
		flow_nd_sbp_local_box(pl->shape, &s, sd->mesh, i, &boxes[i]);
}

/* Whether the normalised axes a..b act as one in state id. */
static bool run_merges(const planner_t *pl, int64_t id, int a, int b)
{
	if (a == b)
		return true; /* node_valid checked it */
	flow_nd_sbp_t s;
	node_layout(pl, id, &s);
	return axes_merge(pl->shape, side_of(pl, id)->mesh, &s, run_axes(pl, id, a, b));
}

static bool item_before(const heap_item_t *x, const heap_item_t *y)
{
	if (x->key_ps != y->key_ps)
		return x->key_ps < y->key_ps;
	if (x->bytes != y->bytes)
		return x->bytes < y->bytes;
	if (x->steps != y->steps)
		return x->steps < y->steps;
	return x->id < y->id;
}

static flow_err_t heap_push(planner_t *pl, heap_item_t item, flow_diag_t *diag)
{
	if (pl->heap_len == pl->heap_cap) {
		size_t cap = pl->heap_cap ? 2 * pl->heap_cap : 256, bytes;
		if (!flow_mul_size(cap, sizeof(*pl->heap), &bytes))
			return flow_diag_set(diag, FLOW_ERR_NOMEM, "boxing search: out of memory");
		heap_item_t *h = realloc(pl->heap, bytes);
		if (!h)
			return flow_diag_set(diag, FLOW_ERR_NOMEM, "boxing search: out of memory");
		pl->heap = h;
		pl->heap_cap = cap;
	}
	size_t i = pl->heap_len++;
	while (i > 0 && item_before(&item, &pl->heap[(i - 1) / 2])) {
		pl->heap[i] = pl->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	pl->heap[i] = item;
	return FLOW_OK;
}

static heap_item_t heap_pop(planner_t *pl)
{
	heap_item_t top = pl->heap[0], last = pl->heap[--pl->heap_len];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= pl->heap_len)
			break;
		if (c + 1 < pl->heap_len && item_before(&pl->heap[c + 1], &pl->heap[c]))
			c++;
		if (!item_before(&pl->heap[c], &last))
			break;
		pl->heap[i] = pl->heap[c];
		i = c;
	}
	if (pl->heap_len > 0)
		pl->heap[i] = last;
	return top;
}

/* The traffic of step st, which ends at node v, with the boxes of its
 * start in pl->from_boxes. */
static void step_cost(planner_t *pl, const flow_boxing_step_t *st, int64_t v,
		      traffic_t *t)
{
	*t = (traffic_t){ .rank = -1 };
	if (st->kind == FLOW_BOXING_SLICE || st->kind == FLOW_BOXING_ZERO_FILL ||
	    st->kind == FLOW_BOXING_PAD_ZERO)
		return;
	layout_boxes(pl, v, pl->to_boxes);
	step_view_t view = { pl->shape, pl->esize, st, pl->from_boxes,
			     pl->to_boxes, pl->cluster, pl->pair_scratch };
	step_traffic(&view, t);
}

/* Costs the step u -> v and keeps it when it improves v's route.  The
 * boxes of u are in pl->from_boxes. */
static flow_err_t relax(planner_t *pl, int64_t u, int64_t v,
			flow_boxing_kind_t kind, unsigned axes,
			flow_diag_t *diag)
{
	node_t *nu = &pl->nodes[u], *nv = &pl->nodes[v];
	if (nu->steps >= FLOW_BOXING_MAX_STEPS || nv->done)
		return FLOW_OK;
	flow_boxing_step_t st = { .kind = kind, .axes = axes };
	st.mesh = *side_of(pl, u)->mesh;
	st.to_mesh = *side_of(pl, v)->mesh;
	node_layout(pl, u, &st.from);
	node_layout(pl, v, &st.to);
	traffic_t t;
	step_cost(pl, &st, v, &t);
	double time = nu->time_s + t.time_s;
	heap_item_t item = { (int64_t)llround(time * 1e12), nu->bytes + t.total,
			     nu->steps + 1, v };
	heap_item_t cur = { nv->key_ps, nv->bytes, nv->steps, v };
	if (nv->reached && !item_before(&item, &cur))
		return FLOW_OK;
	nv->reached = true;
	nv->time_s = time;
	nv->key_ps = item.key_ps;
	nv->bytes = item.bytes;
	nv->steps = item.steps;
	nv->prev = u;
	nv->kind = kind;
	nv->axes = axes;
	return heap_push(pl, item, diag);
}

static flow_boxing_kind_t change_kind(int x, int y)
{
	if (x == DIGIT_P)
		return y == DIGIT_B ? FLOW_BOXING_ALL_REDUCE : FLOW_BOXING_REDUCE_SCATTER;
	if (x == DIGIT_B)
		return y == DIGIT_P ? FLOW_BOXING_ZERO_FILL : FLOW_BOXING_SLICE;
	if (y == DIGIT_B)
		return FLOW_BOXING_ALL_GATHER;
	return y == DIGIT_P ? FLOW_BOXING_PAD_ZERO : FLOW_BOXING_ALL_TO_ALL;
}

/* The steps within one placement: change the SBP of one run of adjacent
 * axes that hold the same SBP (and merge exactly, when more than one) by
 * the 1-D rule for the change.  The change is the same operation in every
 * group of the run only when no inner axis splits a dimension the old or
 * new SBP splits: an inner split of that dimension would make each
 * member's piece a strided part of it. */
static flow_err_t expand_collectives(planner_t *pl, int64_t u, flow_diag_t *diag)
{
	const side_t *sd = side_of(pl, u);
	int64_t code = u - sd->first;
	for (int a = 0; a < sd->naxes; a++) {
		int x = digit_of(pl, code, a);
		for (int b = a; b < sd->naxes && digit_of(pl, code, b) == x; b++) {
			unsigned axes = run_axes(pl, u, a, b);
			if (!run_merges(pl, u, a, b))
				continue;
			for (int y = 0; y < pl->base; y++) {
				bool legal = y != x;
				for (int t = b + 1; legal && t < sd->naxes; t++) {
					int d = digit_of(pl, code, t);
					legal = !(d >= DIGIT_S0 && (d == x || d == y));
				}
				if (!legal)
					continue;
				int64_t v = u;
				for (int t = a; t <= b; t++)
					v += (int64_t)(y - x) * pl->pow[t];
				if (!node_valid(pl, v) || !run_merges(pl, v, a, b))
					continue;
				pl->one_rule |= u == pl->start && v == pl->target;
				flow_err_t err = relax(pl, u, v, change_kind(x, y), axes, diag);
				if (err != FLOW_OK)
					return err;
			}
		}
	}
	return FLOW_OK;
}

/* Send/recv delivers any layout without P; a destination P axis is then
 * reached locally, from B by zero-fill or from S(k) by pad-zero.  The
 * targets are the destination with each P axis replaced by B or S(k).
 * Within one placement it starts only from the source, and only when no
 * single 1-D rule does the conversion: the alpha-beta model cannot see
 * what a ring saves over a fan-out of messages, and would otherwise pick
 * send/recv for nearly every all-gather of uneven pieces. */
static flow_err_t expand_send_recv(planner_t *pl, int64_t u, flow_diag_t *diag)
{
	int64_t dst = pl->target;
	const side_t *sd = side_of(pl, dst);
	int64_t partial = 0; /* search digits of the P axes */
	int np = 0;
	for (int t = 0; t < sd->naxes; t++)
		if (digit_of(pl, dst - sd->first, t) == DIGIT_P) {
			partial |= (int64_t)1 << t;
			np++;
		}
	int64_t choices = 1;
	for (int t = 0; t < np; t++)
		choices *= pl->base - 1;
	for (int64_t c = 0; c < choices; c++) {
		int64_t v = dst, rest = c;
		for (int t = 0; t < sd->naxes; t++) {
			if (!(partial & ((int64_t)1 << t)))
				continue;
			int d = (int)(rest % (pl->base - 1));
			rest /= pl->base - 1;
			v += (int64_t)((d == 0 ? DIGIT_B : d + 1) - DIGIT_P) * pl->pow[t];
		}
		if (!node_valid(pl, v))
			continue;
		flow_err_t err = relax(pl, u, v, FLOW_BOXING_SEND_RECV, 0, diag);
		if (err != FLOW_OK)
			return err;
	}
	return FLOW_OK;
}

/* Sets up a side: its normalised axes are the mesh axes of size > 1,
 * adjacent ones joined while they hold equal SBPs in every layout of ends
 * and merge exactly there. */
static void side_init(side_t *sd, const flow_shape_t *shape,
		      const flow_mesh_t *mesh, const flow_nd_sbp_t *decor,
		      const flow_nd_sbp_t *const *ends, int nends, int64_t first)
{
	sd->mesh = mesh;
	sd->decor = *decor;
	sd->naxes = 0;
	for (int i = 0; i < mesh->ndim; i++) {
		if (mesh->dims[i] == 1)
			continue;
		bool join = sd->naxes > 0;
		if (join) {
			unsigned mask = sd->axes[sd->naxes - 1] | 1u << i;
			int prev = __builtin_ctz(mask);
			for (int e = 0; join && e < nends; e++)
				join = flow_sbp_equal(ends[e]->sbp[prev], ends[e]->sbp[i]) &&
				       axes_merge(shape, mesh, ends[e], mask);
		}
		if (join)
			sd->axes[sd->naxes - 1] |= 1u << i;
		else
			sd->axes[sd->naxes++] = 1u << i;
	}
	sd->npos = flow_mesh_size(mesh);
	sd->first = first;
}

static bool same_placement(const flow_mesh_t *a, const flow_mesh_t *b)
{
	if (a->ndim != b->ndim || a->base != b->base)
		return false;
	for (int i = 0; i < a->ndim; i++)
		if (a->dims[i] != b->dims[i] || a->stride[i] != b->stride[i])
			return false;
	return true;
}

/* Meshes larger than this are refused: the search costs each step by
 * visiting every position. */
#define BOXING_MAX_RANKS ((int64_t)1 << 16)

static flow_err_t check_inputs(const flow_shape_t *shape, flow_dtype_t dtype,
			       const flow_mesh_t *src_mesh,
			       const flow_nd_sbp_t *src,
			       const flow_mesh_t *dst_mesh,
			       const flow_nd_sbp_t *dst,
			       const flow_cluster_t *cluster, flow_diag_t *diag)
{
	size_t numel, bytes;
	flow_err_t err = flow_shape_numel(shape, &numel, diag);
	if (err != FLOW_OK)
		return err;
	if (flow_dtype_size(dtype) == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE, "boxing: unknown dtype %d",
				     (int)dtype);
	if (!flow_mul_size(numel, flow_dtype_size(dtype), &bytes))
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "boxing: tensor of %zu elements is too large", numel);
	const flow_mesh_t *meshes[2] = { src_mesh, dst_mesh };
	for (int m = 0; m < 2; m++) {
		err = flow_mesh_check(meshes[m], diag);
		if (err != FLOW_OK)
			return err;
		if (flow_mesh_size(meshes[m]) > BOXING_MAX_RANKS)
			return flow_diag_set(diag, FLOW_ERR_RANGE,
					     "boxing: a mesh of %" PRId64 " ranks is beyond the %" PRId64 " a plan covers",
					     flow_mesh_size(meshes[m]), BOXING_MAX_RANKS);
	}
	err = flow_nd_sbp_check(shape, src, src_mesh, diag);
	if (err == FLOW_OK)
		err = flow_nd_sbp_check(shape, dst, dst_mesh, diag);
	if (err != FLOW_OK)
		return err;
	const flow_link_t *links[2] = { &cluster->intra, &cluster->inter };
	if (cluster->ranks_per_node < 1)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "boxing: %" PRId64 " ranks per node", cluster->ranks_per_node);
	for (int l = 0; l < 2; l++)
		if (!(links[l]->alpha_s >= 0) || !(links[l]->beta_bps > 0) ||
		    !isfinite(links[l]->alpha_s) || !isfinite(links[l]->beta_bps))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "boxing: link latency %g s, bandwidth %g B/s: expected a latency >= 0 and a bandwidth > 0",
					     links[l]->alpha_s, links[l]->beta_bps);
	return FLOW_OK;
}

/* Turns the route ending at node id into plan steps, each costed again
 * with the cluster. */
static void route_to_plan(planner_t *pl, int64_t id, flow_boxing_plan_t *plan)
{
	int64_t route[FLOW_BOXING_MAX_STEPS + 1];
	int n = 0;
	for (int64_t v = id; ; v = pl->nodes[v].prev) {
		route[n++] = v;
		if (pl->nodes[v].steps == 0)
			break;
	}
	for (int k = n - 1; k > 0; k--) {
		int64_t u = route[k], v = route[k - 1];
		flow_boxing_step_t *st = &plan->steps[plan->nsteps++];
		memset(st, 0, sizeof(*st));
		st->kind = pl->nodes[v].kind;
		st->axes = pl->nodes[v].axes;
		st->mesh = *side_of(pl, u)->mesh;
		st->to_mesh = *side_of(pl, v)->mesh;
		node_layout(pl, u, &st->from);
		node_layout(pl, v, &st->to);
		/* The ends are exactly the caller's layouts, size-1 axes
		 * included (which changes no box). */
		if (k == n - 1)
			st->from = plan->src;
		if (k == 1) {
			st->to = plan->dst;
			st->to_mesh = plan->dst_mesh;
		}
		layout_boxes(pl, u, pl->from_boxes);
		traffic_t t;
		step_cost(pl, st, v, &t);
		st->max_send_bytes = t.max_send;
		st->max_recv_bytes = t.max_recv;
		st->total_bytes = t.total;
		st->time_s = t.time_s;
		plan->total_bytes += t.total;
		plan->time_s += t.time_s;
	}
}

flow_err_t flow_boxing_plan(const flow_shape_t *shape, flow_dtype_t dtype,
			    const flow_mesh_t *src_mesh,
			    const flow_nd_sbp_t *src,
			    const flow_mesh_t *dst_mesh,
			    const flow_nd_sbp_t *dst,
			    const flow_cluster_t *cluster,
			    flow_boxing_plan_t *plan_out, flow_diag_t *diag)
{
	flow_cluster_t default_cluster;
	if (!cluster) {
		flow_cluster_default(&default_cluster);
		cluster = &default_cluster;
	}
	flow_err_t err = check_inputs(shape, dtype, src_mesh, src, dst_mesh,
				      dst, cluster, diag);
	if (err != FLOW_OK)
		return err;
	flow_boxing_plan_t plan;
	memset(&plan, 0, sizeof(plan));
	plan.shape = *shape;
	plan.dtype = dtype;
	plan.src_mesh = *src_mesh;
	plan.dst_mesh = *dst_mesh;
	plan.src = *src;
	plan.dst = *dst;

	planner_t pl;
	memset(&pl, 0, sizeof(pl));
	pl.shape = shape;
	pl.esize = flow_dtype_size(dtype);
	pl.cluster = cluster;
	pl.base = shape->ndim + 2;
	pl.pow[0] = 1;
	for (int t = 1; t <= FLOW_MESH_MAX_AXES; t++)
		pl.pow[t] = pl.pow[t - 1] * pl.base;
	pl.nsides = same_placement(src_mesh, dst_mesh) ? 1 : 2;
	/* One placement normalises by both ends; two, each by its own. */
	const flow_nd_sbp_t *ends[2] = { src, dst };
	side_init(&pl.side[0], shape, src_mesh, src, ends, 3 - pl.nsides, 0);
	pl.nnodes = pl.pow[pl.side[0].naxes];
	if (pl.nsides == 2) {
		side_init(&pl.side[1], shape, dst_mesh, dst, ends + 1, 1, pl.nnodes);
		pl.nnodes += pl.pow[pl.side[1].naxes];
	}
	int64_t npos = pl.side[0].npos > pl.side[1].npos ? pl.side[0].npos : pl.side[1].npos;
	pl.nodes = flow_calloc((size_t)pl.nnodes, sizeof(*pl.nodes));
	pl.from_boxes = flow_calloc((size_t)npos, sizeof(flow_box_t));
	pl.to_boxes = flow_calloc((size_t)npos, sizeof(flow_box_t));
	pl.pair_scratch = flow_calloc(2 * (size_t)npos, sizeof(uint64_t));
	if (!pl.nodes || !pl.from_boxes || !pl.to_boxes || !pl.pair_scratch) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "boxing plan: out of memory");
		goto out_free;
	}
	int64_t start = pl.start = layout_node(&pl, 0, src);
	int64_t target = pl.target = layout_node(&pl, pl.nsides - 1, dst);
	if (start != target) {
		pl.nodes[start].reached = true;
		err = heap_push(&pl, (heap_item_t){ 0, 0, 0, start }, diag);
		while (err == FLOW_OK && pl.heap_len > 0 && !pl.nodes[target].done) {
			heap_item_t it = heap_pop(&pl);
			node_t *n = &pl.nodes[it.id];
			if (n->done || it.key_ps != n->key_ps || it.bytes != n->bytes ||
			    it.steps != n->steps)
				continue; /* superseded */
			n->done = true;
			layout_boxes(&pl, it.id, pl.from_boxes);
			err = expand_collectives(&pl, it.id, diag);
			if (err == FLOW_OK && (pl.nsides == 2 ? side_of(&pl, it.id) == &pl.side[0] :
						it.id == start && !pl.one_rule))
				err = expand_send_recv(&pl, it.id, diag);
		}
		if (err != FLOW_OK)
			goto out_free;
		if (!pl.nodes[target].done) {
			err = flow_diag_set(diag, FLOW_ERR_RANGE,
					    "boxing: no route within %d steps",
					    FLOW_BOXING_MAX_STEPS);
			goto out_free;
		}
		route_to_plan(&pl, target, &plan);
	}
	*plan_out = plan;
out_free:
	free(pl.heap);
	flow_free(pl.pair_scratch);
	flow_free(pl.to_boxes);
	flow_free(pl.from_boxes);
	flow_free(pl.nodes);
	return err;
}

/* ---- printing ------------------------------------------------------------------- */

static void print_axes(FILE *out, const flow_boxing_step_t *st)
{
	if (!st->axes) {
		fputs("-", out);
		return;
	}
	const char *sep = "";
	for (int i = 0; i < st->mesh.ndim; i++) {
		if (!(st->axes & (1u << i)))
			continue;
		if (st->mesh.names[i][0])
			fprintf(out, "%s%s", sep, st->mesh.names[i]);
		else
			fprintf(out, "%s%d", sep, i);
		sep = ",";
	}
}

/* A layout column: the nd-SBP, with its mesh when the step changes
 * placement. */
static void print_layout(FILE *out, const flow_nd_sbp_t *sbp,
			 const flow_mesh_t *mesh, bool with_mesh)
{
	char s[FLOW_SBP_TEXT_MAX], m[FLOW_MESH_TEXT_MAX];
	flow_nd_sbp_format(sbp, s, sizeof(s));
	fputs(s, out);
	if (with_mesh) {
		flow_mesh_format(mesh, m, sizeof(m));
		fprintf(out, " on %s", m);
	}
}

flow_err_t flow_boxing_plan_print(const flow_boxing_plan_t *plan, FILE *out,
				  flow_diag_t *diag)
{
	fputs("step\tkind\taxes\tfrom\tto\tmax_send_bytes\tmax_recv_bytes\ttotal_bytes\ttime_us\n",
	      out);
	bool moves = !same_placement(&plan->src_mesh, &plan->dst_mesh);
	for (size_t k = 0; k < plan->nsteps; k++) {
		const flow_boxing_step_t *st = &plan->steps[k];
		bool with_mesh = st->kind == FLOW_BOXING_SEND_RECV && moves;
		fprintf(out, "%zu\t%s\t", k + 1, flow_boxing_kind_name(st->kind));
		print_axes(out, st);
		fputs("\t", out);
		print_layout(out, &st->from, &st->mesh, with_mesh);
		fputs("\t", out);
		print_layout(out, &st->to, &st->to_mesh, with_mesh);
		fprintf(out, "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%.3f\n",
			st->max_send_bytes, st->max_recv_bytes, st->total_bytes,
			st->time_s * 1e6);
	}
	uint64_t send, recv;
	flow_boxing_plan_busiest(plan, &send, &recv);
	fputs("total\t-\t-\t", out);
	print_layout(out, &plan->src, &plan->src_mesh, moves);
	fputs("\t", out);
	print_layout(out, &plan->dst, &plan->dst_mesh, moves);
	fprintf(out, "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%.3f\n", send,
		recv, plan->total_bytes, plan->time_s * 1e6);
	if (ferror(out))
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot write boxing plan");
	return FLOW_OK;
}
