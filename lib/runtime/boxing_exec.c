/* The distributed boxing executor (flow/boxing.h): every rank runs each
 * step of a plan on its own piece, through the collectives of the
 * communicator of the step's mesh axes.  It does to each piece what the
 * reference executor (boxing_sim.c) does, with the same member boxes
 * (boxing_internal.h), so the tests can take that one as the oracle.
 * A send/recv within the mesh is one all-to-all over all its axes, each
 * block the slice intersection the send/recv rule assigns to that pair,
 * with zero-element blocks between the pairs it leaves out.
 *
 * A collective moves blocks that are contiguous in rank order; the
 * pieces of a split along dimension k > 0 are strided, so they are packed
 * into blocks before a reduce-scatter or all-to-all and unpacked after an
 * all-gather or all-to-all.  When the blocks already lie back to back in
 * the piece (a split of the outermost dimension that is not 1) the
 * buffers go to the collective as they are.
 *
 * The pieces may be in a device's memory (flow-train --device cuda over
 * NCCL): every byte the executor touches then goes through the storage
 * and the kernel set it was made with (scratch, zeroing, copies, and
 * box_move for packing and slicing), and the kernels that wrote a buffer
 * are waited for before a collective reads it, as a collective runs on
 * its own stream. */
#include <config.h>

#include <inttypes.h>
#include <string.h>

#include <flow/boxing_exec.h>
#include <flow/comm.h>
#include <flow/exec.h>
#include <flow/kernels.h>
#include <flow/mem.h>

#include "sbp/boxing_internal.h"

/* Grow-only scratch: two for the pieces between steps, one for packed
 * blocks to send, one for blocks received before unpacking. */
enum { SCRATCH_PING, SCRATCH_PONG, SCRATCH_PACK, SCRATCH_UNPACK, SCRATCH_COUNT };

#define AXES_MASKS (1u << FLOW_MESH_MAX_AXES)

struct flow_boxing_comms {
	flow_comm_t *world;         /* borrowed */
	const flow_kernels_t *kernels;      /* box_move and last, on */
	const flow_exec_storage_t *storage; /* the pieces' memory */
	flow_mesh_t mesh;           /* positions -> world ranks */
	flow_mesh_t comm_mesh;      /* positions -> ranks of `world` */
	int64_t index;              /* this rank's position */
	flow_comm_t *group[AXES_MASKS]; /* by axes mask, made on first use */
	void *scratch[SCRATCH_COUNT];
	size_t scratch_bytes[SCRATCH_COUNT];
	/* Per group member, sized for the whole mesh. */
	flow_box_t *from, *to, *send_cut, *recv_cut;
	size_t *send_counts, *recv_counts;
};

/* One step on this rank. */
typedef struct step_run {
	flow_boxing_comms_t *c;
	const flow_shape_t *shape;
	const flow_boxing_step_t *st;
	size_t k;           /* step number, from 1, for messages */
	flow_dtype_t dtype;
	size_t esize;
	unsigned axes;      /* of the group: the step's, or for a send/recv
			     * all the mesh's, so member q is position q */
	int64_t p, q;       /* group size, this rank's member number */
	flow_comm_t *comm;  /* the group's, for a collective */
	const void *in;     /* laid out as from[q] */
	void *out;          /* laid out as to[q] */
	flow_diag_t *diag;
} step_run_t;

/* ---- the communicators ---------------------------------------------------- */

/* The position of each rank of world on mesh, as a mesh of world's own
 * ranks (what flow_comm_mesh_axes splits by): the same dims, with base
 * and strides read from where the axes' first steps land. */
static flow_err_t comm_mesh_of(flow_comm_t *world, const flow_mesh_t *mesh,
			       int64_t *crank, flow_mesh_t *out,
			       flow_diag_t *diag)
{
	char text[FLOW_MESH_TEXT_MAX];
	int n = flow_comm_size(world);
	int64_t size = flow_mesh_size(mesh);
	flow_mesh_format(mesh, text, sizeof text);
	if (size != n)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "boxing: mesh '%s' has %" PRId64
				     " ranks, the communicator %d",
				     text, size, n);
	/* Sizes are equal and world ranks distinct: a bijection. */
	for (int r = 0; r < n; r++) {
		int64_t i = flow_mesh_index_of(mesh, flow_comm_world_rank(world, r));
		if (i < 0)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "boxing: mesh '%s' does not cover world rank %d of the communicator",
					     text, flow_comm_world_rank(world, r));
		crank[i] = r;
	}
	flow_mesh_t m = *mesh;
	int64_t c[FLOW_MESH_MAX_AXES] = { 0 };
	m.base = crank[0];
	for (int a = 0; a < m.ndim; a++) {
		if (m.dims[a] == 1)
			continue;
		c[a] = 1;
		m.stride[a] = crank[flow_mesh_index(mesh, c)] - m.base;
		c[a] = 0;
	}
	bool affine = flow_mesh_check(&m, NULL) == FLOW_OK;
	for (int64_t i = 0; affine && i < size; i++)
		affine = flow_mesh_rank(&m, i) == crank[i];
	if (!affine)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "boxing: mesh '%s' does not map to the communicator's ranks affinely",
				     text);
	*out = m;
	return FLOW_OK;
}

/* Whether world's collectives read and write storage's memory: the CPU
 * backend host memory, NCCL a GPU's. */
static bool moves_memory_of(flow_comm_t *world,
			    const flow_exec_storage_t *storage)
{
	return (flow_comm_backend(world) == FLOW_COMM_CPU) == storage->host_memory;
}

flow_err_t flow_boxing_comms_new(flow_comm_t *world, const flow_mesh_t *mesh,
				 const flow_kernels_t *kernels,
				 const flow_exec_storage_t *storage,
				 flow_boxing_comms_t **comms_out,
				 flow_diag_t *diag)
{
	flow_boxing_comms_t *c = NULL;
	int64_t *crank = NULL;
	flow_err_t err = flow_mesh_check(mesh, diag);
	if (err != FLOW_OK)
		goto out;
	if (!kernels != !storage) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "boxing: a storage without its kernel set, or the other way round");
		goto out;
	}
	if (!kernels) {
		kernels = &flow_cpu_kernels;
		storage = &flow_exec_storage_host;
	}
	if (!moves_memory_of(world, storage)) {
		err = flow_diag_set(diag, FLOW_ERR_NOTSUP,
				    "boxing: the '%s' communicator cannot move '%s' memory",
				    flow_comm_transport(world), storage->name);
		goto out;
	}
	size_t n = (size_t)flow_mesh_size(mesh);
	c = flow_calloc(1, sizeof(*c));
	crank = flow_calloc(n, sizeof(*crank));
	if (c) {
		c->from = flow_calloc(n, sizeof(*c->from));
		c->to = flow_calloc(n, sizeof(*c->to));
		c->send_cut = flow_calloc(n, sizeof(*c->send_cut));
		c->recv_cut = flow_calloc(n, sizeof(*c->recv_cut));
		c->send_counts = flow_calloc(n, sizeof(*c->send_counts));
		c->recv_counts = flow_calloc(n, sizeof(*c->recv_counts));
	}
	if (c) {
		c->kernels = kernels;
		c->storage = storage;
	}
	if (!c || !crank || !c->from || !c->to || !c->send_cut ||
	    !c->recv_cut || !c->send_counts || !c->recv_counts) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "boxing: out of memory");
		goto out;
	}
	err = comm_mesh_of(world, mesh, crank, &c->comm_mesh, diag);
	if (err != FLOW_OK)
		goto out;
	c->world = world;
	c->mesh = *mesh;
	c->index = flow_mesh_index_of(mesh, flow_comm_world_rank(world,
								flow_comm_rank(world)));
	*comms_out = c;
	c = NULL;
out:
	flow_free(crank);
	flow_boxing_comms_free(c);
	return err;
}

void flow_boxing_comms_free(flow_boxing_comms_t *c)
{
	if (!c)
		return;
	for (unsigned m = 0; m < AXES_MASKS; m++)
		flow_comm_free(c->group[m]);
	for (int s = 0; s < SCRATCH_COUNT; s++)
		c->storage->free(c->scratch[s]);
	flow_free(c->recv_counts);
	flow_free(c->send_counts);
	flow_free(c->recv_cut);
	flow_free(c->send_cut);
	flow_free(c->to);
	flow_free(c->from);
	flow_free(c);
}

const flow_exec_storage_t *
flow_boxing_comms_storage(const flow_boxing_comms_t *c)
{
	return c->storage;
}

const flow_kernels_t *flow_boxing_comms_kernels(const flow_boxing_comms_t *c)
{
	return c->kernels;
}

flow_err_t flow_boxing_comms_axes(flow_boxing_comms_t *c, unsigned axes_mask,
				  flow_comm_t **comm_out, flow_diag_t *diag)
{
	if (axes_mask >= (1u << c->mesh.ndim)) {
		char text[FLOW_MESH_TEXT_MAX];
		flow_mesh_format(&c->mesh, text, sizeof text);
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "boxing: axes 0x%x are not axes of mesh '%s'",
				     axes_mask, text);
	}
	if (!c->group[axes_mask]) {
		flow_err_t err = flow_comm_mesh_axes(c->world, &c->comm_mesh,
						     axes_mask,
						     &c->group[axes_mask], diag);
		if (err != FLOW_OK)
			return err;
	}
	*comm_out = c->group[axes_mask];
	return FLOW_OK;
}

/* The communicator of this rank's group of the step's axes.  Its rank
 * order must be the member order of boxing_group_member, or the blocks
 * would reach the wrong members. */
static flow_err_t group_comm(step_run_t *r)
{
	flow_err_t err = flow_boxing_comms_axes(r->c, r->axes, &r->comm,
						r->diag);
	if (err != FLOW_OK)
		return err;
	if (flow_comm_size(r->comm) != r->p || flow_comm_rank(r->comm) != r->q)
		return flow_diag_set(r->diag, FLOW_ERR_USAGE,
				     "boxing step %zu: group communicator has rank %d of %d, expected member %" PRId64
				     " of %" PRId64,
				     r->k, flow_comm_rank(r->comm),
				     flow_comm_size(r->comm), r->q, r->p);
	return FLOW_OK;
}

/* ---- buffers and blocks ------------------------------------------------------ */

static flow_err_t box_bytes(const step_run_t *r, const flow_box_t *box,
			    size_t *bytes_out)
{
	if (!flow_mul_size((size_t)flow_box_numel(box), r->esize, bytes_out))
		return flow_diag_set(r->diag, FLOW_ERR_RANGE,
				     "boxing step %zu: piece size overflows the address space",
				     r->k);
	return FLOW_OK;
}

/* Scratch buffer `which` with at least count elements. */
static flow_err_t scratch(step_run_t *r, int which, size_t count, void **out)
{
	flow_boxing_comms_t *c = r->c;
	size_t bytes;
	if (!flow_mul_size(count, r->esize, &bytes))
		return flow_diag_set(r->diag, FLOW_ERR_RANGE,
				     "boxing step %zu: %zu elements overflow the address space",
				     r->k, count);
	if (bytes > c->scratch_bytes[which] || !c->scratch[which]) {
		c->storage->free(c->scratch[which]);
		c->scratch_bytes[which] = 0;
		c->scratch[which] = c->storage->alloc(bytes);
		if (!c->scratch[which])
			return flow_diag_set(r->diag, FLOW_ERR_NOMEM,
					     "boxing step %zu: out of memory for %zu bytes of scratch",
					     r->k, bytes);
		c->scratch_bytes[which] = bytes;
	}
	*out = c->scratch[which];
	return FLOW_OK;
}

/* Whether box b is one run of elements in whole's row-major layout (outer
 * dimensions of extent 1, then one partial dimension, then whole ones),
 * and where it starts. */
static bool box_run(const flow_box_t *whole, const flow_box_t *b,
		    size_t *offset_out)
{
	int d = 0;
	while (d < b->ndim && b->extent[d] == 1)
		d++;
	for (int e = d + 1; e < b->ndim; e++)
		if (b->extent[e] != whole->extent[e])
			return false;
	int64_t offset = 0;
	for (int e = 0; e < b->ndim; e++)
		offset = offset * whole->extent[e] + (b->start[e] - whole->start[e]);
	*offset_out = (size_t)offset;
	return true;
}

/* Whether the non-empty blocks box[0..p) of count[] elements lie back to
 * back, in order, in whole's layout and fill it: then a buffer laid out
 * as whole is already their concatenation. */
static bool blocks_fill(const flow_box_t *whole, const flow_box_t *box,
			const size_t *count, int64_t p)
{
	size_t at = 0, offset;
	for (int64_t m = 0; m < p; m++) {
		if (count[m] == 0)
			continue;
		if (!box_run(whole, &box[m], &offset) || offset != at)
			return false;
		at += count[m];
	}
	return at == (size_t)flow_box_numel(whole);
}

/* Copy the blocks box[m] of buf (laid out as whole) into packed, back to
 * back in member order. */
static void blocks_pack(const step_run_t *r, const void *buf,
			const flow_box_t *whole, const flow_box_t *box,
			const size_t *count, void *packed)
{
	char *at = packed;
	for (int64_t m = 0; m < r->p; m++) {
		if (count[m] == 0)
			continue;
		r->c->kernels->box_move(r->dtype, buf, whole, at, &box[m],
					&box[m], false);
		at += count[m] * r->esize;
	}
}

/* The other way: the blocks of packed into buf, in member order (add:
 * added, as box_move adds). */
static void blocks_unpack(const step_run_t *r, const void *packed,
			  const flow_box_t *box, const size_t *count,
			  void *buf, const flow_box_t *whole, bool add)
{
	const char *at = packed;
	for (int64_t m = 0; m < r->p; m++) {
		if (count[m] == 0)
			continue;
		r->c->kernels->box_move(r->dtype, at, &box[m], buf, whole,
					&box[m], add);
		at += count[m] * r->esize;
	}
}

static size_t sum_counts(const size_t *count, int64_t p)
{
	size_t n = 0;
	for (int64_t m = 0; m < p; m++)
		n += count[m]; /* pieces of one tensor: no overflow */
	return n;
}

/* ---- the steps -------------------------------------------------------------------- */

/* Wait for the kernels that wrote what a collective is about to read: it
 * runs on a stream of its own. */
static flow_err_t kernels_done(const step_run_t *r)
{
	return flow_kernels_wait(r->c->kernels, r->diag);
}

static flow_err_t run_all_reduce(step_run_t *r)
{
	const flow_box_t *mine = &r->c->from[r->q];
	flow_err_t err = kernels_done(r);
	if (err != FLOW_OK)
		return err;
	return flow_all_reduce(r->comm, r->in, r->out,
			       (size_t)flow_box_numel(mine), r->dtype, r->diag);
}

/* P -> S(k): block m is member m's part of this rank's addends. */
static flow_err_t run_reduce_scatter(step_run_t *r)
{
	flow_boxing_comms_t *c = r->c;
	const flow_box_t *whole = &c->from[r->q];
	size_t *counts = c->send_counts;
	const void *send = r->in;
	for (int64_t m = 0; m < r->p; m++)
		counts[m] = (size_t)flow_box_numel(&c->to[m]);
	if (!blocks_fill(whole, c->to, counts, r->p)) {
		void *pack;
		flow_err_t err = scratch(r, SCRATCH_PACK, sum_counts(counts, r->p),
					 &pack);
		if (err != FLOW_OK)
			return err;
		blocks_pack(r, r->in, whole, c->to, counts, pack);
		send = pack;
	}
	flow_err_t err = kernels_done(r);
	if (err != FLOW_OK)
		return err;
	return flow_reduce_scatter(r->comm, send, r->out, counts, r->dtype,
				   r->diag);
}

/* S(k) -> B: block m is member m's piece. */
static flow_err_t run_all_gather(step_run_t *r)
{
	flow_boxing_comms_t *c = r->c;
	const flow_box_t *whole = &c->to[r->q];
	size_t *counts = c->recv_counts;
	void *recv = r->out;
	for (int64_t m = 0; m < r->p; m++)
		counts[m] = (size_t)flow_box_numel(&c->from[m]);
	bool direct = blocks_fill(whole, c->from, counts, r->p);
	flow_err_t err = FLOW_OK;
	if (!direct)
		err = scratch(r, SCRATCH_UNPACK, sum_counts(counts, r->p), &recv);
	if (err == FLOW_OK)
		err = kernels_done(r);
	if (err == FLOW_OK)
		err = flow_all_gather(r->comm, r->in, recv, counts, r->dtype,
				      r->diag);
	if (err == FLOW_OK && !direct)
		blocks_unpack(r, recv, c->from, counts, r->out, whole, false);
	return err;
}

/* The blocks of an all-to-all: to member m goes the part of this rank's
 * piece that m holds afterwards, from m comes the part of m's piece this
 * rank holds afterwards; in a send/recv, only where the send/recv rule
 * pairs the two positions (member m is position m there, and the source
 * and destination meshes are one). */
static void exchange_cuts(step_run_t *r)
{
	flow_boxing_comms_t *c = r->c;
	const flow_boxing_step_t *st = r->st;
	bool rule = st->kind == FLOW_BOXING_SEND_RECV;
	const flow_box_t *have = &c->from[r->q], *need = &c->to[r->q];
	int64_t q = r->q;
	for (int64_t m = 0; m < r->p; m++) {
		bool to_m = rule ? boxing_send_recv_cut(st, q, have, m, m, &c->to[m],
							&c->send_cut[m]) :
				   flow_box_intersect(have, &c->to[m], &c->send_cut[m]);
		bool from_m = rule ? boxing_send_recv_cut(st, m, &c->from[m], q, q,
							  need, &c->recv_cut[m]) :
				     flow_box_intersect(&c->from[m], need, &c->recv_cut[m]);
		c->send_counts[m] = to_m ? (size_t)flow_box_numel(&c->send_cut[m]) : 0;
		c->recv_counts[m] = from_m ? (size_t)flow_box_numel(&c->recv_cut[m]) : 0;
	}
}

/* S(i) -> S(j), and send/recv within the mesh.  A send/recv from P
 * layouts sums the addends that arrive into zeros in member (position)
 * order, as the reference executor does, so the bits match. */
static flow_err_t run_exchange(step_run_t *r)
{
	flow_boxing_comms_t *c = r->c;
	const flow_box_t *have = &c->from[r->q], *need = &c->to[r->q];
	bool add = r->st->kind == FLOW_BOXING_SEND_RECV &&
		   boxing_send_recv_sums(r->st);
	const void *send = r->in;
	void *recv = r->out;
	exchange_cuts(r);
	size_t nrecv = sum_counts(c->recv_counts, r->p);
	bool direct_send = blocks_fill(have, c->send_cut, c->send_counts, r->p);
	bool direct_recv = !add && blocks_fill(need, c->recv_cut, c->recv_counts,
					       r->p);
	flow_err_t err = FLOW_OK;
	if (!direct_send) {
		void *pack;
		err = scratch(r, SCRATCH_PACK, sum_counts(c->send_counts, r->p),
			      &pack);
		if (err == FLOW_OK)
			blocks_pack(r, r->in, have, c->send_cut, c->send_counts,
				    pack);
		send = pack;
	}
	if (err == FLOW_OK && !direct_recv)
		err = scratch(r, SCRATCH_UNPACK, nrecv, &recv);
	if (err == FLOW_OK)
		err = kernels_done(r);
	if (err == FLOW_OK)
		err = flow_all_to_all(r->comm, send, c->send_counts, recv,
				      c->recv_counts, r->dtype, r->diag);
	if (err != FLOW_OK || direct_recv)
		return err;
	/* What no block covers stays zero, as in the reference executor. */
	if (add || nrecv != (size_t)flow_box_numel(need)) {
		size_t bytes = 0;
		err = box_bytes(r, need, &bytes);
		if (err != FLOW_OK)
			return err;
		r->c->storage->zero(r->out, bytes);
	}
	blocks_unpack(r, recv, c->recv_cut, c->recv_counts, r->out, need, add);
	return FLOW_OK;
}

/* Slice, zero-fill and pad-zero: keep what the piece after shares with
 * the piece before (zero-fill: only the group's first member does), and
 * zeros elsewhere. */
static flow_err_t run_local(step_run_t *r)
{
	const flow_box_t *have = &r->c->from[r->q], *need = &r->c->to[r->q];
	bool keep = r->st->kind != FLOW_BOXING_ZERO_FILL || r->q == 0;
	flow_box_t cut;
	size_t bytes = 0;
	flow_err_t err = box_bytes(r, need, &bytes);
	if (err != FLOW_OK)
		return err;
	if (keep)
		keep = flow_box_intersect(have, need, &cut);
	if (!keep || flow_box_numel(&cut) != flow_box_numel(need))
		r->c->storage->zero(r->out, bytes);
	if (keep)
		r->c->kernels->box_move(r->dtype, r->in, have, r->out, need,
					&cut, false);
	return FLOW_OK;
}

/* ---- plans ----------------------------------------------------------------------- */

/* Steps the communicator sums; a send/recv adds on the receiver, with
 * box_move, which knows every dtype. */
static bool step_sums(flow_boxing_kind_t kind)
{
	return kind == FLOW_BOXING_ALL_REDUCE || kind == FLOW_BOXING_REDUCE_SCATTER;
}

/* Everything that would stop a step, found before the first one runs: all
 * ranks hold the same plan, so all of them stop here together instead of
 * leaving the others waiting in a collective. */
static flow_err_t plan_check(const flow_boxing_plan_t *plan,
			     const flow_boxing_comms_t *c, flow_diag_t *diag)
{
	char text[FLOW_MESH_TEXT_MAX];
	if (flow_dtype_size(plan->dtype) == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "boxing: unknown dtype %d", (int)plan->dtype);
	flow_mesh_format(&c->mesh, text, sizeof text);
	if (!flow_mesh_equal(&plan->src_mesh, &c->mesh) ||
	    !flow_mesh_equal(&plan->dst_mesh, &c->mesh))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "boxing: the plan's placements differ from the executor's mesh '%s'",
				     text);
	if (plan->nsteps > FLOW_BOXING_MAX_STEPS)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "boxing: plan has %zu steps, at most %d",
				     plan->nsteps, FLOW_BOXING_MAX_STEPS);
	for (size_t k = 0; k < plan->nsteps; k++) {
		const flow_boxing_step_t *st = &plan->steps[k];
		/* flow_boxing_plan never emits one; a hand-made plan may. */
		if (st->kind == FLOW_BOXING_BROADCAST)
			return flow_diag_set(diag, FLOW_ERR_NOTSUP,
					     "boxing step %zu: the distributed executor does not run '%s' steps",
					     k + 1, flow_boxing_kind_name(st->kind));
		if ((unsigned)st->kind >= FLOW_BOXING_KIND_COUNT)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "boxing step %zu: unknown kind %d",
					     k + 1, (int)st->kind);
		if (!flow_mesh_equal(&st->mesh, &c->mesh) ||
		    !flow_mesh_equal(&st->to_mesh, &c->mesh))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "boxing step %zu: runs on another mesh than '%s'",
					     k + 1, text);
		if (st->kind != FLOW_BOXING_SEND_RECV &&
		    (st->axes == 0 || st->axes >= (1u << c->mesh.ndim)))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "boxing step %zu: axes 0x%x are not axes of mesh '%s'",
					     k + 1, st->axes, text);
		if (step_sums(st->kind) &&
		    !flow_comm_can_reduce(flow_comm_backend(c->world),
					  plan->dtype))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "boxing step %zu: cannot sum dtype '%s' in '%s'",
					     k + 1, flow_dtype_name(plan->dtype),
					     flow_boxing_kind_name(st->kind));
	}
	return FLOW_OK;
}

/* This rank's place in its group of the step's axes, and every member's
 * boxes before and after, as the reference executor computes them.  The
 * group of a send/recv is the whole mesh, so its members are the mesh
 * positions in order. */
static void step_load(step_run_t *r)
{
	flow_boxing_comms_t *c = r->c;
	const flow_boxing_step_t *st = r->st;
	int64_t leader;
	r->axes = st->kind == FLOW_BOXING_SEND_RECV ? (1u << st->mesh.ndim) - 1 :
						      st->axes;
	r->q = boxing_group_place(&st->mesh, r->axes, c->index, &leader);
	r->p = boxing_group_size(&st->mesh, r->axes);
	for (int64_t m = 0; m < r->p; m++)
		(void)boxing_member_boxes(r->shape, st, r->axes, leader, m,
					  &c->from[m], &c->to[m]);
}

static flow_err_t run_step(step_run_t *r)
{
	flow_err_t err;
	switch (r->st->kind) {
	case FLOW_BOXING_SLICE:
	case FLOW_BOXING_ZERO_FILL:
	case FLOW_BOXING_PAD_ZERO:
		return run_local(r);
	default:
		break;
	}
	err = group_comm(r);
	if (err != FLOW_OK)
		return err;
	switch (r->st->kind) {
	case FLOW_BOXING_ALL_REDUCE:
		return run_all_reduce(r);
	case FLOW_BOXING_REDUCE_SCATTER:
		return run_reduce_scatter(r);
	case FLOW_BOXING_ALL_GATHER:
		return run_all_gather(r);
	case FLOW_BOXING_ALL_TO_ALL:
	case FLOW_BOXING_SEND_RECV:
		return run_exchange(r);
	default: /* refused by plan_check */
		return flow_diag_set(r->diag, FLOW_ERR_NOTSUP,
				     "boxing step %zu: the distributed executor does not run '%s' steps",
				     r->k, flow_boxing_kind_name(r->st->kind));
	}
}

/* Bytes of this rank's piece in layout sbp. */
static flow_err_t piece_bytes(const flow_boxing_plan_t *plan,
			      const flow_boxing_comms_t *c,
			      const flow_nd_sbp_t *sbp, size_t *bytes_out,
			      flow_diag_t *diag)
{
	flow_box_t box;
	flow_nd_sbp_local_box(&plan->shape, sbp, &c->mesh, c->index, &box);
	if (!flow_mul_size((size_t)flow_box_numel(&box),
			   flow_dtype_size(plan->dtype), bytes_out))
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "boxing: piece size overflows the address space");
	return FLOW_OK;
}

flow_err_t flow_boxing_run(const flow_boxing_plan_t *plan,
			   flow_boxing_comms_t *comms, const void *src,
			   void *dst, flow_diag_t *diag)
{
	size_t src_bytes = 0, dst_bytes = 0;
	flow_err_t err = plan_check(plan, comms, diag);
	if (err == FLOW_OK)
		err = piece_bytes(plan, comms, &plan->src, &src_bytes, diag);
	if (err == FLOW_OK)
		err = piece_bytes(plan, comms, &plan->dst, &dst_bytes, diag);
	if (err != FLOW_OK)
		return err;
	uintptr_t s = (uintptr_t)src, d = (uintptr_t)dst;
	if (src_bytes && dst_bytes && s < d + dst_bytes && d < s + src_bytes)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "boxing: source and destination pieces overlap");
	if (plan->nsteps == 0) {
		comms->storage->copy(dst, src, src_bytes);
		return FLOW_OK;
	}
	const void *in = src;
	for (size_t k = 0; k < plan->nsteps && err == FLOW_OK; k++) {
		step_run_t r = { .c = comms, .shape = &plan->shape,
				 .st = &plan->steps[k], .k = k + 1,
				 .dtype = plan->dtype,
				 .esize = flow_dtype_size(plan->dtype),
				 .in = in, .out = dst, .diag = diag };
		step_load(&r);
		/* Between steps the pieces alternate between two scratch
		 * buffers, so a step never writes what it reads. */
		if (k + 1 < plan->nsteps)
			err = scratch(&r, k % 2 ? SCRATCH_PONG : SCRATCH_PING,
				      (size_t)flow_box_numel(&comms->to[r.q]),
				      &r.out);
		if (err == FLOW_OK)
			err = run_step(&r);
		in = r.out;
	}
	return err;
}
