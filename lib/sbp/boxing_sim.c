/* The reference executor for boxing plans: one buffer per simulated rank,
 * and every step carried out as the real thing would, message by message
 * (the rings of the collectives, the slice intersections of send/recv),
 * counting the bytes each message carries.  It shares no byte formula with
 * the planner, so comparing its counts with flow_boxing_step_rank_bytes
 * checks one computation against another. */
#include <config.h>

#include <inttypes.h>
#include <string.h>

#include <flow/mem.h>

#include "boxing_internal.h"

typedef struct sim {
	flow_dtype_t dtype;
	size_t esize;
	const flow_shape_t *shape;
	const flow_boxing_step_t *st;
	void **local;           /* buffers before the step, by global rank */
	void **next;            /* buffers after it */
	uint64_t *sent, *recvd; /* may be NULL */
	flow_diag_t *diag;
} sim_t;

static void add_elems(flow_dtype_t dtype, void *dst, const void *src, size_t n)
{
	switch (dtype) {
	case FLOW_DTYPE_F32: {
		float *d = dst;
		const float *s = src;
		for (size_t i = 0; i < n; i++)
			d[i] += s[i];
		break;
	}
	case FLOW_DTYPE_BF16:
	case FLOW_DTYPE_F16: {
		uint16_t *d = dst;
		const uint16_t *s = src;
		bool bf = dtype == FLOW_DTYPE_BF16;
		for (size_t i = 0; i < n; i++) {
			float sum = bf ? flow_bf16_to_f32(d[i]) + flow_bf16_to_f32(s[i]) :
					 flow_f16_to_f32(d[i]) + flow_f16_to_f32(s[i]);
			d[i] = bf ? flow_f32_to_bf16(sum) : flow_f32_to_f16(sum);
		}
		break;
	}
	/* Integers wrap, as two's complement hardware adds them. */
	case FLOW_DTYPE_I32:
	case FLOW_DTYPE_U32: {
		uint32_t *d = dst;
		const uint32_t *s = src;
		for (size_t i = 0; i < n; i++)
			d[i] += s[i];
		break;
	}
	case FLOW_DTYPE_I64: {
		uint64_t *d = dst;
		const uint64_t *s = src;
		for (size_t i = 0; i < n; i++)
			d[i] += s[i];
		break;
	}
	case FLOW_DTYPE_U16: {
		uint16_t *d = dst;
		const uint16_t *s = src;
		for (size_t i = 0; i < n; i++)
			d[i] = (uint16_t)(d[i] + s[i]);
		break;
	}
	case FLOW_DTYPE_U8: {
		uint8_t *d = dst;
		const uint8_t *s = src;
		for (size_t i = 0; i < n; i++)
			d[i] = (uint8_t)(d[i] + s[i]);
		break;
	}
	}
}

/* The run function of flow_boxing_move_region's add: ctx is the dtype. */
static void add_run(void *dst, const void *src, size_t n, void *ctx)
{
	add_elems(*(const flow_dtype_t *)ctx, dst, src, n);
}

void flow_boxing_move_region(flow_dtype_t dtype, const void *src,
			     const flow_box_t *sbox, void *dst,
			     const flow_box_t *dbox, const flow_box_t *region,
			     bool add)
{
	size_t esize = flow_dtype_size(dtype);

	if (add)
		flow_box_apply(dst, dbox, src, sbox, region, esize, add_run,
			       &dtype);
	else
		flow_box_copy(dst, dbox, src, sbox, region, esize);
}

static void move_region(const sim_t *s, const void *src, const flow_box_t *sbox,
			void *dst, const flow_box_t *dbox,
			const flow_box_t *region, bool add)
{
	flow_boxing_move_region(s->dtype, src, sbox, dst, dbox, region, add);
}

static flow_err_t alloc_box(const sim_t *s, const flow_box_t *box, void **out)
{
	*out = flow_calloc((size_t)flow_box_numel(box), s->esize);
	if (!*out)
		return flow_diag_set(s->diag, FLOW_ERR_NOMEM,
				     "boxing simulation: out of memory");
	return FLOW_OK;
}

/* One message: region travels from src (on rank from) to dst (on rank to)
 * through a buffer of its own, as it would over a wire, and is counted
 * unless it stays on one rank. */
static flow_err_t message(const sim_t *s, int64_t from, const void *src,
			  const flow_box_t *sbox, int64_t to, void *dst,
			  const flow_box_t *dbox, const flow_box_t *region,
			  bool add)
{
	void *wire;
	flow_err_t err = alloc_box(s, region, &wire);
	if (err != FLOW_OK)
		return err;
	move_region(s, src, sbox, wire, region, region, false);
	move_region(s, wire, region, dst, dbox, region, add);
	flow_free(wire);
	if (from != to) {
		uint64_t bytes = (uint64_t)flow_box_numel(region) * s->esize;
		if (s->sent)
			s->sent[from] += bytes;
		if (s->recvd)
			s->recvd[to] += bytes;
	}
	return FLOW_OK;
}

/* One group of a collective: its members' ranks and boxes before and
 * after, in group order. */
typedef struct group {
	int64_t p;
	int64_t *rank;
	flow_box_t *from, *to;
} group_t;

static flow_err_t group_load(const sim_t *s, int64_t leader, group_t *g)
{
	const flow_boxing_step_t *st = s->st;
	g->p = boxing_group_size(&st->mesh, st->axes);
	g->rank = flow_calloc((size_t)g->p, sizeof(*g->rank));
	g->from = flow_calloc((size_t)g->p, sizeof(*g->from));
	g->to = flow_calloc((size_t)g->p, sizeof(*g->to));
	if (!g->rank || !g->from || !g->to)
		return flow_diag_set(s->diag, FLOW_ERR_NOMEM,
				     "boxing simulation: out of memory");
	for (int64_t q = 0; q < g->p; q++) {
		int64_t i = boxing_member_boxes(s->shape, st, st->axes, leader,
						q, &g->from[q], &g->to[q]);
		g->rank[q] = flow_mesh_rank(&st->mesh, i);
	}
	return FLOW_OK;
}

static void group_release(group_t *g)
{
	flow_free(g->to);
	flow_free(g->from);
	flow_free(g->rank);
}

/* A ring: in step t every member q sends chunk (q - shift - t) mod p of
 * its buffer (laid out as box) to member q + 1, which copies it in (add:
 * adds it).  All of a step's messages leave before any arrives, as on a
 * real ring.  Reduce-scatter is shift 1 with add (member q ends owning
 * chunk q), all-gather shift 0 with copy. */
static flow_err_t ring(const sim_t *s, const group_t *g, void **buf,
		       const flow_box_t *box, const flow_box_t *chunk,
		       int64_t shift, bool add)
{
	int64_t p = g->p;
	void **wire = flow_calloc((size_t)p, sizeof(*wire));
	if (!wire)
		return flow_diag_set(s->diag, FLOW_ERR_NOMEM,
				     "boxing simulation: out of memory");
	flow_err_t err = FLOW_OK;
	for (int64_t t = 0; t < p - 1 && err == FLOW_OK; t++) {
		for (int64_t q = 0; q < p && err == FLOW_OK; q++) {
			const flow_box_t *c = &chunk[((q - shift - t) % p + p) % p];
			err = alloc_box(s, c, &wire[q]);
			if (err == FLOW_OK)
				move_region(s, buf[q], box, wire[q], c, c, false);
		}
		for (int64_t q = 0; q < p && err == FLOW_OK; q++) {
			const flow_box_t *c = &chunk[((q - shift - t) % p + p) % p];
			int64_t next = (q + 1) % p;
			err = message(s, g->rank[q], wire[q], c, g->rank[next],
				      buf[next], box, c, add);
		}
		for (int64_t q = 0; q < p; q++) {
			flow_free(wire[q]);
			wire[q] = NULL;
		}
	}
	flow_free(wire);
	return err;
}

/* A 1-D view of n elements and its balanced chunks: all-reduce splits the
 * element count, whatever the tensor's shape. */
static void flat_chunks(int64_t n, int64_t p, flow_box_t *whole,
			flow_box_t *chunk)
{
	memset(whole, 0, sizeof(*whole));
	whole->ndim = 1;
	whole->extent[0] = n;
	for (int64_t q = 0; q < p; q++) {
		chunk[q] = *whole;
		flow_split_part(n, p, q, &chunk[q].start[0], &chunk[q].extent[0]);
	}
}

static flow_err_t run_group(const sim_t *s, int64_t leader)
{
	const flow_boxing_step_t *st = s->st;
	group_t g = { 0 };
	flow_err_t err = group_load(s, leader, &g);
	if (err != FLOW_OK)
		goto out_release;
	int64_t p = g.p;
	void **out = s->next;
	/* Every member's result, zeroed, then filled by the collective. */
	for (int64_t q = 0; q < p && err == FLOW_OK; q++)
		err = alloc_box(s, &g.to[q], &out[g.rank[q]]);
	if (err != FLOW_OK)
		goto out_release;
	void **buf = flow_calloc((size_t)p, sizeof(*buf));
	flow_box_t *chunk = flow_calloc((size_t)p, sizeof(*chunk));
	if (!buf || !chunk) {
		err = flow_diag_set(s->diag, FLOW_ERR_NOMEM,
				    "boxing simulation: out of memory");
		goto out_free;
	}
	for (int64_t q = 0; q < p; q++)
		buf[q] = out[g.rank[q]];
	switch (st->kind) {
	case FLOW_BOXING_ALL_GATHER:
		/* Each member starts with its own piece in place. */
		for (int64_t q = 0; q < p; q++)
			move_region(s, s->local[g.rank[q]], &g.from[q], buf[q],
				    &g.to[q], &g.from[q], false);
		err = ring(s, &g, buf, &g.to[0], g.from, 0, false);
		break;
	case FLOW_BOXING_REDUCE_SCATTER: {
		/* Work on copies of the addends; keep one's own chunk. */
		for (int64_t q = 0; q < p; q++)
			buf[q] = NULL;
		for (int64_t q = 0; q < p && err == FLOW_OK; q++) {
			err = alloc_box(s, &g.from[q], &buf[q]);
			if (err == FLOW_OK)
				move_region(s, s->local[g.rank[q]], &g.from[q],
					    buf[q], &g.from[q], &g.from[q], false);
		}
		if (err == FLOW_OK)
			err = ring(s, &g, buf, &g.from[0], g.to, 1, true);
		for (int64_t q = 0; q < p; q++) {
			if (err == FLOW_OK)
				move_region(s, buf[q], &g.from[q], out[g.rank[q]],
					    &g.to[q], &g.to[q], false);
			flow_free(buf[q]);
		}
		break;
	}
	case FLOW_BOXING_ALL_REDUCE: {
		flow_box_t whole;
		flat_chunks(flow_box_numel(&g.from[0]), p, &whole, chunk);
		for (int64_t q = 0; q < p; q++)
			memcpy(buf[q], s->local[g.rank[q]],
			       (size_t)whole.extent[0] * s->esize);
		err = ring(s, &g, buf, &whole, chunk, 1, true);
		if (err == FLOW_OK)
			err = ring(s, &g, buf, &whole, chunk, 0, false);
		break;
	}
	case FLOW_BOXING_ALL_TO_ALL:
		for (int64_t q = 0; q < p && err == FLOW_OK; q++)
			for (int64_t r = 0; r < p && err == FLOW_OK; r++) {
				flow_box_t cut;
				if (flow_box_intersect(&g.from[q], &g.to[r], &cut))
					err = message(s, g.rank[q], s->local[g.rank[q]],
						      &g.from[q], g.rank[r], buf[r],
						      &g.to[r], &cut, false);
			}
		break;
	case FLOW_BOXING_BROADCAST:
		/* A chain from the first member; the others' data is unused. */
		move_region(s, s->local[g.rank[0]], &g.from[0], buf[0], &g.to[0],
			    &g.to[0], false);
		for (int64_t q = 0; q + 1 < p && err == FLOW_OK; q++)
			err = message(s, g.rank[q], buf[q], &g.to[q], g.rank[q + 1],
				      buf[q + 1], &g.to[q + 1], &g.to[q], false);
		break;
	default: /* slice, zero-fill, pad-zero: each member on its own */
		for (int64_t q = 0; q < p; q++) {
			flow_box_t cut;
			if ((st->kind != FLOW_BOXING_ZERO_FILL || q == 0) &&
			    flow_box_intersect(&g.from[q], &g.to[q], &cut))
				move_region(s, s->local[g.rank[q]], &g.from[q],
					    buf[q], &g.to[q], &cut, false);
		}
		break;
	}
out_free:
	flow_free(chunk);
	flow_free(buf);
out_release:
	group_release(&g);
	return err;
}

/* Destination by destination, each source in position order, so a sum
 * starts from zero and takes the addends in the order the distributed
 * executor adds them. */
static flow_err_t run_send_recv(const sim_t *s)
{
	const flow_boxing_step_t *st = s->st;
	int64_t na = flow_mesh_size(&st->mesh), nb = flow_mesh_size(&st->to_mesh);
	/* Addends are summed where they arrive; other pieces are copied. */
	bool add = boxing_send_recv_sums(st);
	for (int64_t j = 0; j < nb; j++) {
		int64_t dst = flow_mesh_rank(&st->to_mesh, j);
		int64_t dst_as_src = flow_mesh_index_of(&st->mesh, dst);
		flow_box_t need;
		flow_nd_sbp_local_box(s->shape, &st->to, &st->to_mesh, j, &need);
		flow_err_t err = alloc_box(s, &need, &s->next[dst]);
		for (int64_t i = 0; i < na && err == FLOW_OK; i++) {
			int64_t src = flow_mesh_rank(&st->mesh, i);
			flow_box_t have, cut;
			flow_nd_sbp_local_box(s->shape, &st->from, &st->mesh, i, &have);
			if (boxing_send_recv_cut(st, i, &have, dst_as_src, j, &need,
						 &cut))
				err = message(s, src, s->local[src], &have, dst,
					      s->next[dst], &need, &cut, add);
		}
		if (err != FLOW_OK)
			return err;
	}
	return FLOW_OK;
}

flow_err_t flow_boxing_simulate(const flow_boxing_plan_t *plan, void **local,
				size_t nranks, uint64_t *sent_out,
				uint64_t *recvd_out, flow_diag_t *diag)
{
	sim_t s = { plan->dtype, flow_dtype_size(plan->dtype), &plan->shape,
		    NULL, local, NULL, sent_out, recvd_out, diag };
	if (s.esize == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "boxing simulation: unknown dtype %d",
				     (int)plan->dtype);
	for (size_t k = 0; k < plan->nsteps; k++) {
		const flow_mesh_t *m[2] = { &plan->steps[k].mesh,
					    &plan->steps[k].to_mesh };
		for (int e = 0; e < 2; e++)
			if (flow_mesh_top_rank(m[e]) >= (int64_t)nranks)
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "boxing simulation: step %zu reaches rank %" PRId64
						     " of %zu simulated ranks",
						     k + 1, flow_mesh_top_rank(m[e]), nranks);
	}
	for (int64_t i = 0; plan->nsteps > 0 && i < flow_mesh_size(&plan->src_mesh); i++)
		if (!local[flow_mesh_rank(&plan->src_mesh, i)])
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "boxing simulation: rank %" PRId64 " holds no buffer",
					     flow_mesh_rank(&plan->src_mesh, i));
	if (sent_out)
		memset(sent_out, 0, nranks * sizeof(*sent_out));
	if (recvd_out)
		memset(recvd_out, 0, nranks * sizeof(*recvd_out));
	s.next = flow_calloc(nranks, sizeof(*s.next));
	if (!s.next)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "boxing simulation: out of memory");
	flow_err_t err = FLOW_OK;
	for (size_t k = 0; k < plan->nsteps && err == FLOW_OK; k++) {
		const flow_boxing_step_t *st = s.st = &plan->steps[k];
		if (st->kind == FLOW_BOXING_SEND_RECV) {
			err = run_send_recv(&s);
		} else {
			for (int64_t i = 0; i < flow_mesh_size(&st->mesh) && err == FLOW_OK; i++)
				if (boxing_group_leader(&st->mesh, st->axes, i))
					err = run_group(&s, i);
		}
		/* The step's results replace what its ranks held before. */
		if (err == FLOW_OK)
			for (int64_t i = 0; i < flow_mesh_size(&st->mesh); i++) {
				int64_t r = flow_mesh_rank(&st->mesh, i);
				flow_free(local[r]);
				local[r] = NULL;
			}
		for (int64_t j = 0; j < flow_mesh_size(&st->to_mesh); j++) {
			int64_t r = flow_mesh_rank(&st->to_mesh, j);
			if (err == FLOW_OK)
				local[r] = s.next[r];
			else
				flow_free(s.next[r]);
			s.next[r] = NULL;
		}
	}
	flow_free(s.next);
	return err;
}
