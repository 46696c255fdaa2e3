/* The communicator core: building communicators (world, split, mesh axes),
 * the argument checks and trivial cases every backend would otherwise
 * repeat, sequence numbers and deadlines, liveness of peers on this node,
 * and the wording of every failure. */
#include <config.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <flow/device.h>

#include "comm_internal.h"
#include "device/cuda_module_internal.h"

const char *flow_comm_op_name(flow_comm_op_t op)
{
	static const char *const names[] = {
		[FLOW_OP_NONE] = "setup",
		[FLOW_OP_ALL_REDUCE] = "all-reduce",
		[FLOW_OP_REDUCE_SCATTER] = "reduce-scatter",
		[FLOW_OP_ALL_GATHER] = "all-gather",
		[FLOW_OP_ALL_TO_ALL] = "all-to-all",
		[FLOW_OP_BROADCAST] = "broadcast",
		[FLOW_OP_SEND] = "send",
		[FLOW_OP_RECV] = "recv",
		[FLOW_OP_BARRIER] = "barrier",
		[FLOW_OP_SETUP] = "setup",
	};
	if ((unsigned)op >= sizeof(names) / sizeof(names[0]))
		return "operation";
	return names[op];
}

/* ---- deadlines and failures ------------------------------------------- */

double flow_comm_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double flow_comm_deadline(const flow_comm_t *c)
{
	return c->deadline;
}

static void begin(flow_comm_t *c, flow_comm_op_t op)
{
	c->op = op;
	if (op != FLOW_OP_SEND && op != FLOW_OP_RECV)
		c->seq++;
	c->deadline = flow_comm_now() + c->timeout_s;
}

/* "rank 3 (node2)" for communicator rank r. */
static void name_rank(const flow_comm_t *c, int r, char *buf, size_t cap)
{
	int wr = c->world_ranks[r];
	snprintf(buf, cap, "rank %d (%s)", wr,
		 flow_world_host_of(c->world, wr));
}

/* " during all-reduce #12", " during send #3 to rank 5", " during setup". */
static void name_op(const flow_comm_t *c, char *buf, size_t cap)
{
	int r = c->peer;
	if (c->op == FLOW_OP_SETUP || c->op == FLOW_OP_NONE)
		snprintf(buf, cap, " while setting up a communicator");
	else if (c->op == FLOW_OP_SEND || c->op == FLOW_OP_RECV)
		snprintf(buf, cap, " during %s #%llu %s rank %d",
			 flow_comm_op_name(c->op),
			 (unsigned long long)(c->op == FLOW_OP_SEND
						      ? c->p2p_sent[r]
						      : c->p2p_recvd[r]) +
				 1,
			 c->op == FLOW_OP_SEND ? "to" : "from",
			 c->world_ranks[r]);
	else
		snprintf(buf, cap, " during %s #%llu", flow_comm_op_name(c->op),
			 (unsigned long long)c->seq);
}

flow_err_t flow_comm_peer_fail(flow_comm_t *c, flow_diag_t *diag, int r,
			       const char *what_fmt, ...)
{
	char me[96], peer[96], what[160], during[96];
	va_list ap;
	va_start(ap, what_fmt);
	vsnprintf(what, sizeof what, what_fmt, ap);
	va_end(ap);
	name_rank(c, c->rank, me, sizeof me);
	name_rank(c, r, peer, sizeof peer);
	name_op(c, during, sizeof during);
	c->failed = true;
	return flow_diag_set(diag, FLOW_ERR_PEER, "%s: peer %s %s%s", me, peer,
			     what, during);
}

flow_err_t flow_comm_timed_out(flow_comm_t *c, flow_diag_t *diag, int r)
{
	char me[96], peer[96] = "the other ranks", during[96];
	name_rank(c, c->rank, me, sizeof me);
	if (r >= 0)
		name_rank(c, r, peer, sizeof peer);
	name_op(c, during, sizeof during);
	c->failed = true;
	return flow_diag_set(diag, FLOW_ERR_TIMEOUT,
			     "%s: timed out after %g s waiting for %s%s", me,
			     c->timeout_s, peer, during);
}

flow_err_t flow_comm_fail(flow_comm_t *c, flow_diag_t *diag, flow_err_t err,
			  const char *fmt, ...)
{
	char me[96], msg[256], during[96];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	name_rank(c, c->rank, me, sizeof me);
	name_op(c, during, sizeof during);
	c->failed = true;
	return flow_diag_set(diag, err, "%s: %s%s", me, msg, during);
}

/* ---- liveness ------------------------------------------------------------ */

/* A pidfd turns readable when its process exits (zombies included);
 * kill(pid, 0) is the fallback on kernels without pidfd_open. */
static void open_pidfds(flow_comm_t *c)
{
	const flow_world_info_t *me = flow_world_info(c->world);
	for (int r = 0; r < c->size; r++) {
		int wr = c->world_ranks[r];
		c->pidfds[r] = -1;
		if (r == c->rank || flow_world_node_of(c->world, wr) != me->node)
			continue;
#ifdef SYS_pidfd_open
		c->pidfds[r] = (int)syscall(SYS_pidfd_open,
					    flow_world_pid_of(c->world, wr), 0);
		if (c->pidfds[r] < 0 && errno == ESRCH)
			c->pidfds[r] = -2; /* already gone */
		else if (c->pidfds[r] < 0)
			c->pidfds[r] = -1; /* no fd to spare: kill(pid, 0) */
#endif
	}
}

bool flow_comm_peer_alive(flow_comm_t *c, int r)
{
	int wr = c->world_ranks[r];
	if (r == c->rank ||
	    flow_world_node_of(c->world, wr) !=
		    flow_world_info(c->world)->node)
		return true;
	if (c->pidfds[r] == -2)
		return false;
	if (c->pidfds[r] >= 0) {
		struct pollfd p = { .fd = c->pidfds[r], .events = POLLIN };
		return poll(&p, 1, 0) == 0;
	}
	return kill(flow_world_pid_of(c->world, wr), 0) == 0 || errno == EPERM;
}

int flow_comm_first_dead_peer(flow_comm_t *c)
{
	for (int r = 0; r < c->size; r++)
		if (!flow_comm_peer_alive(c, r))
			return r;
	return -1;
}

/* ---- building communicators ------------------------------------------ */

static flow_comm_t *comm_alloc(flow_world_t *w, flow_comm_backend_t backend,
			       int size)
{
	flow_comm_t *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->world = w;
	c->backend = backend;
	c->size = size;
	c->timeout_s = flow_world_timeout(w);
	c->device = -1;
	c->world_ranks = calloc((size_t)size, sizeof *c->world_ranks);
	c->pidfds = calloc((size_t)size, sizeof *c->pidfds);
	c->p2p_sent = calloc((size_t)size, sizeof *c->p2p_sent);
	c->p2p_recvd = calloc((size_t)size, sizeof *c->p2p_recvd);
	if (!c->world_ranks || !c->pidfds || !c->p2p_sent || !c->p2p_recvd) {
		flow_comm_free(c);
		return NULL;
	}
	for (int r = 0; r < size; r++)
		c->pidfds[r] = -1;
	return c;
}

/* Shared memory when every member is on this node, TCP otherwise;
 * FLOW_COMM_TRANSPORT=tcp forces TCP (to test it on one machine). */
static flow_err_t cpu_backend_init(flow_comm_t *c, flow_diag_t *diag)
{
	if (c->size == 1)
		return FLOW_OK;
	int node = flow_world_node_of(c->world, c->world_ranks[0]);
	bool one_node = true;
	for (int r = 1; r < c->size; r++)
		one_node &= flow_world_node_of(c->world, c->world_ranks[r]) ==
			    node;
	const char *force = getenv("FLOW_COMM_TRANSPORT");
	bool tcp = !one_node || (force && strcmp(force, "tcp") == 0);
	c->op = FLOW_OP_SETUP;
	c->deadline = flow_comm_now() + c->timeout_s;
	flow_err_t err = tcp ? flow_comm_tcp_init(c, diag)
			     : flow_comm_shm_init(c, diag);
	c->op = FLOW_OP_NONE;
	return err;
}

static flow_err_t backend_init(flow_comm_t *c, flow_comm_t *parent,
			       flow_diag_t *diag)
{
	open_pidfds(c);
	if (c->backend == FLOW_COMM_CPU)
		return cpu_backend_init(c, diag);
	const flow_cuda_module_t *cuda = NULL;
	flow_err_t err = flow_cuda_module_get(&cuda, diag);
	if (err == FLOW_OK && !cuda->comm_nccl_init)
		err = flow_diag_set(diag, FLOW_ERR_NOTSUP,
				    "%s was built without NCCL: use the CPU "
				    "backend",
				    flow_cuda_module_path());
	if (err == FLOW_OK)
		err = flow_cuda_open(diag);
	if (err != FLOW_OK)
		return err;
	c->op = FLOW_OP_SETUP;
	c->deadline = flow_comm_now() + c->timeout_s;
	err = cuda->comm_nccl_init(c, parent, diag);
	c->op = FLOW_OP_NONE;
	return err;
}

/* A child's id: the same on all its members, different from its siblings
 * (color), from the parent's other splits (nsplits) and from every other
 * family (the parent's id).  SplitMix64 keeps collisions unlikely. */
static uint64_t child_id(uint64_t parent, uint64_t nsplit, int color)
{
	uint64_t x = parent ^ (nsplit * 0x9e3779b97f4a7c15ull) ^
		     ((uint64_t)(uint32_t)color << 32) ^ 0x5851f42d4c957f2dull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return (x ^ (x >> 31)) | 1; /* never 0, the world's id */
}

flow_err_t flow_comm_world(flow_world_t *w, flow_comm_backend_t backend,
			   flow_comm_t **out, flow_diag_t *diag)
{
	*out = NULL;
	const flow_world_info_t *info = flow_world_info(w);
	flow_comm_t *c = comm_alloc(w, backend, info->size);
	if (!c)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	c->rank = info->rank;
	/* The first world communicator is 0; later ones (an NCCL
	 * communicator's CPU twin, a second CPU one) must differ. */
	uint64_t n = flow_world_next_comm(w);
	c->id = n ? child_id(0, n, -1) : 0;
	for (int r = 0; r < c->size; r++)
		c->world_ranks[r] = r;
	flow_err_t err = backend_init(c, NULL, diag);
	if (err) {
		flow_comm_free(c);
		return err;
	}
	*out = c;
	return FLOW_OK;
}

typedef struct split_entry {
	int32_t color, key;
} split_entry_t;

/* The members of this rank's color, ordered by key then parent rank. */
static int pick_members(const split_entry_t *all, int n, int me, int *members)
{
	int m = 0;
	for (int r = 0; r < n; r++) {
		if (all[r].color != all[me].color)
			continue;
		int at = m++;
		while (at > 0 && all[members[at - 1]].key > all[r].key) {
			members[at] = members[at - 1];
			at--;
		}
		members[at] = r;
	}
	return m;
}

flow_err_t flow_comm_split(flow_comm_t *parent, int color, int key,
			   flow_comm_t **out, flow_diag_t *diag)
{
	*out = NULL;
	if (color < 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "split color must be >= 0, got %d", color);
	/* NCCL communicators exchange through their CPU twin. */
	flow_comm_t *exch = parent->host ? parent->host : parent;
	int n = parent->size;
	split_entry_t mine = { color, key };
	split_entry_t *all = calloc((size_t)n, sizeof *all);
	size_t *counts = calloc((size_t)n, sizeof *counts);
	int *members = calloc((size_t)n, sizeof *members);
	flow_comm_t *c = NULL;
	flow_err_t err = FLOW_ERR_NOMEM;
	if (!all || !counts || !members) {
		flow_diag_set(diag, err, "out of memory");
		goto out;
	}
	for (int r = 0; r < n; r++)
		counts[r] = 2;
	err = flow_all_gather(exch, &mine, all, counts, FLOW_DTYPE_I32, diag);
	if (err)
		goto out;
	int m = pick_members(all, n, parent->rank, members);
	c = comm_alloc(parent->world, parent->backend, m);
	if (!c) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out;
	}
	c->timeout_s = parent->timeout_s;
	c->id = child_id(parent->id, parent->nsplits, color);
	for (int i = 0; i < m; i++) {
		c->world_ranks[i] = parent->world_ranks[members[i]];
		if (members[i] == parent->rank)
			c->rank = i;
	}
	if (parent->host) { /* the CPU twin splits the same way */
		err = flow_comm_split(parent->host, color, key, &c->host, diag);
		if (err)
			goto out;
	}
	parent->nsplits++;
	err = backend_init(c, parent, diag);
out:
	if (err) {
		flow_comm_free(c);
		c = NULL;
	}
	free(all);
	free(counts);
	free(members);
	*out = c;
	return err;
}

flow_err_t flow_comm_mesh_axes(flow_comm_t *parent, const flow_mesh_t *mesh,
			       unsigned axes_mask, flow_comm_t **out,
			       flow_diag_t *diag)
{
	*out = NULL;
	char text[128];
	flow_mesh_format(mesh, text, sizeof text);
	int64_t index = flow_mesh_index_of(mesh, parent->rank);
	if (flow_mesh_size(mesh) != parent->size || index < 0)
		return flow_diag_set(
			diag, FLOW_ERR_USAGE,
			"mesh '%s' does not cover exactly the %d ranks of the communicator",
			text, parent->size);
	flow_mesh_t group;
	flow_mesh_group(mesh, axes_mask, index, &group);
	int color = (int)flow_mesh_rank(&group, 0);
	int key = (int)flow_mesh_index_of(&group, parent->rank);
	return flow_comm_split(parent, color, key, out, diag);
}

void flow_comm_free(flow_comm_t *c)
{
	if (!c)
		return;
	if (c->ops && c->ops->destroy)
		c->ops->destroy(c);
	if (c->pidfds)
		for (int r = 0; r < c->size; r++)
			if (c->pidfds[r] >= 0)
				close(c->pidfds[r]);
	flow_comm_free(c->host);
	free(c->pidfds);
	free(c->world_ranks);
	free(c->p2p_sent);
	free(c->p2p_recvd);
	free(c);
}

int flow_comm_rank(const flow_comm_t *c)
{
	return c->rank;
}

int flow_comm_size(const flow_comm_t *c)
{
	return c->size;
}

int flow_comm_world_rank(const flow_comm_t *c, int r)
{
	return c->world_ranks[r];
}

flow_comm_backend_t flow_comm_backend(const flow_comm_t *c)
{
	return c->backend;
}

const char *flow_comm_transport(const flow_comm_t *c)
{
	return c->ops ? c->ops->transport : "self";
}

void flow_comm_set_timeout(flow_comm_t *c, double seconds)
{
	if (seconds > 0)
		c->timeout_s = seconds;
}

uint64_t flow_comm_seq(const flow_comm_t *c)
{
	return c->seq;
}

int flow_comm_device(const flow_comm_t *c)
{
	return c->device;
}

flow_world_t *flow_comm_world_of(const flow_comm_t *c)
{
	return c->world;
}

/* ---- argument checks --------------------------------------------------- */

static flow_err_t check_usable(flow_comm_t *c, flow_dtype_t dtype,
			       bool reduces, flow_diag_t *diag)
{
	if (c->failed)
		return flow_diag_set(
			diag, FLOW_ERR_PEER,
			"the communicator is unusable after an earlier failure");
	if (flow_dtype_size(dtype) == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "unknown dtype %d", (int)dtype);
	if (reduces && !flow_comm_can_reduce(c->backend, dtype))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot sum dtype '%s'",
				     flow_dtype_name(dtype));
	return FLOW_OK;
}

static flow_err_t check_rank(const flow_comm_t *c, int r, const char *what,
			     flow_diag_t *diag)
{
	if (r < 0 || r >= c->size)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s %d is not a rank of a %d-rank communicator",
				     what, r, c->size);
	return FLOW_OK;
}

/* Sum of counts, and whether any is non-zero; FLOW_ERR_RANGE on overflow
 * of the byte size. */
static flow_err_t total_of(const flow_comm_t *c, const size_t *counts,
			   flow_dtype_t dtype, size_t *total,
			   flow_diag_t *diag)
{
	size_t sum = 0, bytes;
	bool fits = true;
	for (int r = 0; r < c->size && fits; r++)
		fits = flow_add_size(sum, counts[r], &sum);
	if (!fits || !flow_mul_size(sum, flow_dtype_size(dtype), &bytes))
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "counts overflow the address space");
	*total = sum;
	return FLOW_OK;
}

static flow_err_t check_bytes(size_t count, flow_dtype_t dtype,
			      size_t *bytes, flow_diag_t *diag)
{
	if (!flow_mul_size(count, flow_dtype_size(dtype), bytes))
		return flow_diag_set(diag, FLOW_ERR_RANGE,
				     "count %zu overflows the address space",
				     count);
	return FLOW_OK;
}

/* ---- collectives --------------------------------------------------------- */

flow_err_t flow_all_reduce(flow_comm_t *c, const void *send, void *recv,
			   size_t count, flow_dtype_t dtype, flow_diag_t *diag)
{
	size_t bytes = 0;
	flow_err_t err = check_usable(c, dtype, true, diag);
	if (!err)
		err = check_bytes(count, dtype, &bytes, diag);
	if (err)
		return err;
	begin(c, FLOW_OP_ALL_REDUCE);
	if (!c->ops || bytes == 0) {
		if (send != recv && bytes)
			memmove(recv, send, bytes);
		return FLOW_OK;
	}
	return c->ops->all_reduce(c, send, recv, count, dtype, diag);
}

flow_err_t flow_all_reduce_group(flow_comm_t *c, void *const *bufs,
				 const size_t *counts, size_t n,
				 flow_dtype_t dtype, flow_diag_t *diag)
{
	size_t bytes = 0;
	flow_err_t err = check_usable(c, dtype, true, diag);
	for (size_t i = 0; i < n && !err; i++)
		err = check_bytes(counts[i], dtype, &bytes, diag);
	if (err)
		return err;
	if (!c->ops || !c->ops->all_reduce_group) {
		for (size_t i = 0; i < n && !err; i++)
			err = flow_all_reduce(c, bufs[i], bufs[i], counts[i],
					      dtype, diag);
		return err;
	}
	begin(c, FLOW_OP_ALL_REDUCE);
	return c->ops->all_reduce_group(c, bufs, counts, n, dtype, diag);
}

/* Reduce-scatter and all-gather share their checks and their one-rank
 * case (a copy of the single block); the backend does the rest. */
static flow_err_t blocks_op(flow_comm_t *c, flow_comm_op_t op,
			    const void *send, void *recv, const size_t *counts,
			    flow_dtype_t dtype, flow_diag_t *diag)
{
	size_t total = 0;
	bool reduce = op == FLOW_OP_REDUCE_SCATTER;
	flow_err_t err = check_usable(c, dtype, reduce, diag);
	if (!err)
		err = total_of(c, counts, dtype, &total, diag);
	if (err)
		return err;
	begin(c, op);
	if (!c->ops || total == 0) {
		if (total)
			memcpy(recv, send, total * flow_dtype_size(dtype));
		return FLOW_OK;
	}
	return reduce ? c->ops->reduce_scatter(c, send, recv, counts, dtype,
					       diag)
		      : c->ops->all_gather(c, send, recv, counts, dtype, diag);
}

flow_err_t flow_reduce_scatter(flow_comm_t *c, const void *send, void *recv,
			       const size_t *counts, flow_dtype_t dtype,
			       flow_diag_t *diag)
{
	return blocks_op(c, FLOW_OP_REDUCE_SCATTER, send, recv, counts, dtype,
			 diag);
}

flow_err_t flow_all_gather(flow_comm_t *c, const void *send, void *recv,
			   const size_t *counts, flow_dtype_t dtype,
			   flow_diag_t *diag)
{
	return blocks_op(c, FLOW_OP_ALL_GATHER, send, recv, counts, dtype,
			 diag);
}

flow_err_t flow_all_to_all(flow_comm_t *c, const void *send,
			   const size_t *send_counts, void *recv,
			   const size_t *recv_counts, flow_dtype_t dtype,
			   flow_diag_t *diag)
{
	size_t sent = 0, recvd = 0;
	flow_err_t err = check_usable(c, dtype, false, diag);
	if (!err)
		err = total_of(c, send_counts, dtype, &sent, diag);
	if (!err)
		err = total_of(c, recv_counts, dtype, &recvd, diag);
	if (!err && recv_counts[c->rank] != send_counts[c->rank])
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "all-to-all: this rank sends itself %zu elements but expects %zu",
				    send_counts[c->rank], recv_counts[c->rank]);
	if (err)
		return err;
	begin(c, FLOW_OP_ALL_TO_ALL);
	if (!c->ops) {
		if (sent)
			memcpy(recv, send, sent * flow_dtype_size(dtype));
		return FLOW_OK;
	}
	/* No early return for zero totals: other ranks may still send. */
	return c->ops->all_to_all(c, send, send_counts, recv, recv_counts,
				  dtype, diag);
}

flow_err_t flow_broadcast(flow_comm_t *c, void *buf, size_t count,
			  flow_dtype_t dtype, int root, flow_diag_t *diag)
{
	size_t bytes = 0;
	flow_err_t err = check_usable(c, dtype, false, diag);
	if (!err)
		err = check_rank(c, root, "root", diag);
	if (!err)
		err = check_bytes(count, dtype, &bytes, diag);
	if (err)
		return err;
	begin(c, FLOW_OP_BROADCAST);
	if (!c->ops || bytes == 0)
		return FLOW_OK;
	return c->ops->broadcast(c, buf, count, dtype, root, diag);
}

/* Send and recv share their checks; buf is only read for a send. */
static flow_err_t p2p_op(flow_comm_t *c, flow_comm_op_t op, void *buf,
			 size_t count, flow_dtype_t dtype, int peer,
			 flow_diag_t *diag)
{
	size_t bytes = 0;
	bool sending = op == FLOW_OP_SEND;
	flow_err_t err = check_usable(c, dtype, false, diag);
	if (!err)
		err = check_rank(c, peer, "peer", diag);
	if (!err && peer == c->rank)
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "rank %d cannot %s itself", peer,
				    sending ? "send to" : "receive from");
	if (!err)
		err = check_bytes(count, dtype, &bytes, diag);
	if (err)
		return err;
	begin(c, op);
	c->peer = peer;
	if (!bytes)
		return FLOW_OK;
	return sending ? c->ops->send(c, buf, bytes, peer, diag)
		       : c->ops->recv(c, buf, bytes, peer, diag);
}

flow_err_t flow_send(flow_comm_t *c, const void *buf, size_t count,
		     flow_dtype_t dtype, int peer, flow_diag_t *diag)
{
	return p2p_op(c, FLOW_OP_SEND, (void *)buf, count, dtype, peer, diag);
}

flow_err_t flow_recv(flow_comm_t *c, void *buf, size_t count,
		     flow_dtype_t dtype, int peer, flow_diag_t *diag)
{
	return p2p_op(c, FLOW_OP_RECV, buf, count, dtype, peer, diag);
}

flow_err_t flow_barrier(flow_comm_t *c, flow_diag_t *diag)
{
	flow_err_t err = check_usable(c, FLOW_DTYPE_U8, false, diag);
	if (err)
		return err;
	begin(c, FLOW_OP_BARRIER);
	return c->ops ? c->ops->barrier(c, diag) : FLOW_OK;
}
