/* The NCCL backend: device buffers, one NCCL communicator per flow
 * communicator (split from the parent's for mesh axes), one stream each.
 *
 * NCCL runs non-blocking (config.blocking = 0) and every call is waited on
 * here, polling the stream and ncclCommGetAsyncError until the flow
 * deadline: a dead or stalled peer then becomes the same one-line error as
 * on the CPU, after ncclCommAbort, never a hang inside NCCL.  Bootstrap
 * exchanges (unique id, PCI bus ids, split colors) go through a CPU twin
 * communicator of the same members (c->host). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
/* nccl.h declares a few functions without prototypes: f(). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include <flow/gpu_binding.h>

#include "comm_internal.h"

typedef struct nccl_state {
	ncclComm_t comm;
	cudaStream_t stream;
	int *scratch; /* one device int, for the barrier */
} nccl_state_t;

/* One macro per foreign library (STYLE 10): an ncclResult_t that is not
 * success or in-progress becomes FLOW_ERR_DEVICE naming NCCL's reason. */
#define FLOW_NCCL_TRY(c, expr, label)                                        \
	do {                                                                 \
		ncclResult_t flow_nccl_r_ = (expr);                          \
		if (flow_nccl_r_ != ncclSuccess &&                           \
		    flow_nccl_r_ != ncclInProgress) {                        \
			err = flow_comm_fail(c, diag, FLOW_ERR_DEVICE,       \
					     "NCCL: %s (%s)",                \
					     ncclGetErrorString(flow_nccl_r_), \
					     ncclGetLastError(NULL));       \
			goto label;                                          \
		}                                                            \
	} while (0)

#define FLOW_CUDA_TRY_C(c, expr, label)                                      \
	do {                                                                 \
		cudaError_t flow_cuda_e_ = (expr);                           \
		if (flow_cuda_e_ != cudaSuccess) {                           \
			err = flow_comm_fail(c, diag, FLOW_ERR_DEVICE,       \
					     "CUDA: %s",                     \
					     cudaGetErrorString(flow_cuda_e_)); \
			goto label;                                          \
		}                                                            \
	} while (0)

static ncclDataType_t nccl_type(flow_dtype_t dtype)
{
	switch (dtype) {
	case FLOW_DTYPE_F32: return ncclFloat32;
	case FLOW_DTYPE_BF16: return ncclBfloat16;
	case FLOW_DTYPE_F16: return ncclFloat16;
	case FLOW_DTYPE_I32: return ncclInt32;
	case FLOW_DTYPE_I64: return ncclInt64;
	case FLOW_DTYPE_U32: return ncclUint32;
	default: return ncclUint8; /* movement only: bytes */
	}
}

/* Element count in NCCL's type for a movement of count elements. */
static size_t nccl_count(size_t count, flow_dtype_t dtype)
{
	return nccl_type(dtype) == ncclUint8 ? count * flow_dtype_size(dtype)
					     : count;
}

static void nap(void)
{
	struct timespec ts = { 0, 20000 };
	nanosleep(&ts, NULL);
}

/* Wait for NCCL's asynchronous work: the communicator's own state (during
 * init and split) or the stream, under the deadline. */
static flow_err_t wait_done(flow_comm_t *c, nccl_state_t *s, bool stream,
			    flow_diag_t *diag)
{
	for (;;) {
		ncclResult_t state = ncclSuccess;
		if (ncclCommGetAsyncError(s->comm, &state) != ncclSuccess)
			state = ncclInternalError;
		if (state != ncclSuccess && state != ncclInProgress) {
			int dead = flow_comm_first_dead_peer(c);
			ncclCommAbort(s->comm);
			s->comm = NULL;
			if (dead >= 0)
				return flow_comm_peer_fail(c, diag, dead,
							   "died");
			/* Only these two come from another rank or the network. */
			bool peer = state == ncclRemoteError ||
				    state == ncclSystemError;
			return flow_comm_fail(c, diag,
					      peer ? FLOW_ERR_PEER : FLOW_ERR_DEVICE,
					      "NCCL: %s (%s)",
					      ncclGetErrorString(state),
					      ncclGetLastError(NULL));
		}
		/* A non-blocking communicator may not have queued its kernels
		 * yet while in progress: the stream only counts after that. */
		if (state == ncclSuccess && !stream)
			return FLOW_OK;
		if (state == ncclSuccess) {
			cudaError_t q = cudaStreamQuery(s->stream);
			if (q == cudaSuccess)
				return FLOW_OK;
			if (q != cudaErrorNotReady)
				return flow_comm_fail(c, diag, FLOW_ERR_DEVICE,
						      "CUDA: %s",
						      cudaGetErrorString(q));
		}
		if (flow_comm_now() > flow_comm_deadline(c)) {
			int dead = flow_comm_first_dead_peer(c);
			ncclCommAbort(s->comm);
			s->comm = NULL;
			return dead >= 0 ? flow_comm_peer_fail(c, diag, dead,
							       "died")
					 : flow_comm_timed_out(c, diag, -1);
		}
		nap();
	}
}

/* ---- setup ----------------------------------------------------------------- */

typedef struct gpu_id {
	char bus[32];
	int32_t node;
	int32_t ok; /* 0: this rank could not take a GPU (its own line says why) */
} gpu_id_t;

/* This rank's GPU by the binding rule: c->device set and made current,
 * its PCI bus id in mine. */
static flow_err_t take_device(flow_comm_t *c, gpu_id_t *mine,
			      flow_diag_t *diag)
{
	const flow_world_info_t *me = flow_world_info(c->world);
	int n = 0;
	flow_err_t err = FLOW_OK;
	flow_gpu_binding_input_t in = { 0 };
	flow_gpu_binding_t bound;

	FLOW_CUDA_TRY_C(c, cudaGetDeviceCount(&n), out);
	if (n < 1) {
		err = flow_comm_fail(c, diag, FLOW_ERR_DEVICE, "no CUDA device");
		goto out;
	}
	flow_gpu_binding_input_from_env(&in);
	in.rank = me->rank;
	in.local_rank = me->local_rank;
	in.local_size = me->local_size;
	in.visible_count = n;
	in.node = me->host;
	if ((err = flow_gpu_binding_pick(&in, &bound, diag)) != FLOW_OK)
		goto out;
	c->device = bound.device;
	FLOW_CUDA_TRY_C(c, cudaSetDevice(c->device), out);
	FLOW_CUDA_TRY_C(c, cudaDeviceGetPCIBusId(mine->bus, sizeof mine->bus,
						 c->device),
			out);
out:
	return err;
}

/* The device by the binding rule every rank follows (flow/gpu_binding.h):
 * the local rank when every rank sees all the node's GPUs, 0 when Slurm
 * gives each rank one of its own, FLOW_CUDA_DEVICE when the user says.
 * Two ranks of one node on the same GPU would reach NCCL as a hang or a
 * crash, so they are refused here, naming both.  Every rank joins the
 * all-gather, a failed one too (with ok 0), so all fail together instead
 * of the rest by timeout. */
static flow_err_t pick_device(flow_comm_t *c, flow_diag_t *diag)
{
	const flow_world_info_t *me = flow_world_info(c->world);
	gpu_id_t mine = { .node = me->node }, *all = NULL;
	size_t *counts = NULL;
	flow_err_t err = take_device(c, &mine, diag);

	mine.ok = err == FLOW_OK;
	all = calloc((size_t)c->size, sizeof *all);
	counts = calloc((size_t)c->size, sizeof *counts);
	if (!all || !counts) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (int r = 0; r < c->size; r++)
		counts[r] = sizeof mine;
	/* A rank that failed joins with ok 0; its own line stands. */
	flow_diag_t ignored = FLOW_DIAG_INIT;
	flow_err_t gathered = flow_all_gather(c->host, &mine, all, counts,
					      FLOW_DTYPE_U8,
					      err ? &ignored : diag);
	if (!err)
		err = gathered;
	for (int r = 0; !err && r < c->size; r++)
		if (!all[r].ok)
			err = flow_comm_fail(c, diag, FLOW_ERR_DEVICE,
					     "rank %d (%s) could not take its GPU",
					     c->world_ranks[r],
					     flow_world_host_of(c->world,
								c->world_ranks[r]));
	/* Every rank sees every pair, so all refuse together (no rank is
	 * left waiting for the unique id). */
	for (int a = 0; !err && a < c->size; a++)
		for (int b = a + 1; !err && b < c->size; b++)
			if (all[a].node == all[b].node &&
			    strcmp(all[a].bus, all[b].bus) == 0)
				err = flow_diag_set(
					diag, FLOW_ERR_USAGE,
					"rank %d and rank %d (%s) both use GPU %s: give each rank its own (srun --gpus-per-task=1)",
					c->world_ranks[a], c->world_ranks[b],
					flow_world_host_of(c->world,
							   c->world_ranks[a]),
					all[a].bus);
out:
	free(all);
	free(counts);
	return err;
}

/* Rank 0's unique id reaches every rank, with a flag, so a failure to make
 * one fails everyone at once instead of by timeout. */
static flow_err_t init_from_id(flow_comm_t *c, nccl_state_t *s,
			       flow_diag_t *diag)
{
	struct {
		int32_t ok;
		ncclUniqueId id;
	} msg = { 0 };
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	flow_err_t err = FLOW_OK;
	config.blocking = 0;
	if (c->rank == 0)
		msg.ok = ncclGetUniqueId(&msg.id) == ncclSuccess;
	err = flow_broadcast(c->host, &msg, sizeof msg, FLOW_DTYPE_U8, 0, diag);
	if (!err && !msg.ok)
		err = flow_comm_fail(c, diag, FLOW_ERR_DEVICE,
				     "rank 0 could not make an NCCL unique id");
	if (err)
		goto out;
	/* NCCL's own set-up gets a whole deadline. */
	c->deadline = flow_comm_now() + c->timeout_s;
	FLOW_NCCL_TRY(c, ncclCommInitRankConfig(&s->comm, c->size, msg.id,
						c->rank, &config),
		      out);
	err = wait_done(c, s, false, diag);
out:
	return err;
}

/* A non-blocking split runs as its parent's job, and NCCL writes the child
 * into s->comm only when it is done (NULL until then): wait on the
 * parent, then on the child.  Should the parent fail, wait_done aborts
 * it, which waits for its split job, so nothing writes into s afterwards;
 * the parent's failure is then its own for good. */
static flow_err_t split_done(flow_comm_t *c, flow_comm_t *parent,
			     flow_diag_t *diag)
{
	nccl_state_t *s = c->impl;
	flow_err_t err = wait_done(c, parent->impl, false, diag);
	if (err) {
		parent->failed = true;
		if (s->comm)
			ncclCommAbort(s->comm);
		s->comm = NULL;
		return err;
	}
	if (!s->comm)
		return flow_comm_fail(c, diag, FLOW_ERR_DEVICE,
				      "NCCL: the split gave no communicator");
	return wait_done(c, s, false, diag);
}

static void nccl_destroy(flow_comm_t *c)
{
	nccl_state_t *s = c->impl;
	if (!s)
		return;
	if (s->comm) {
		/* After a failure (also one seen by the CPU twin) a peer may be
		 * gone: destroy would wait for it, abort does not. */
		if (c->failed || (c->host && c->host->failed))
			ncclCommAbort(s->comm);
		else
			ncclCommDestroy(s->comm);
	}
	if (s->stream)
		cudaStreamDestroy(s->stream);
	cudaFree(s->scratch);
	free(s);
	c->impl = NULL;
}

static const flow_comm_ops_t nccl_ops;

flow_err_t flow_comm_nccl_init(flow_comm_t *c, flow_comm_t *parent,
			       flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	nccl_state_t *s = calloc(1, sizeof *s);
	if (!s)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	c->impl = s;
	c->ops = &nccl_ops;
	if (!parent) { /* the world: a CPU twin, a device, a unique id */
		err = flow_comm_world(c->world, FLOW_COMM_CPU, &c->host, diag);
		if (!err)
			err = pick_device(c, diag);
		if (!err)
			err = init_from_id(c, s, diag);
	} else {
		ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
		nccl_state_t *ps = parent->impl;
		config.blocking = 0;
		c->device = parent->device;
		/* Sibling groups are disjoint, so the first member's world
		 * rank is a color no sibling shares. */
		FLOW_NCCL_TRY(c, ncclCommSplit(ps->comm, c->world_ranks[0],
					       c->rank, &s->comm, &config),
			      out);
		err = split_done(c, parent, diag);
	}
	if (err)
		goto out;
	FLOW_CUDA_TRY_C(c, cudaStreamCreateWithFlags(&s->stream,
						     cudaStreamNonBlocking),
			out);
	FLOW_CUDA_TRY_C(c, cudaMalloc((void **)&s->scratch, sizeof(int)), out);
out:
	return err;
}

/* ---- operations --------------------------------------------------------- */

static flow_err_t nccl_all_reduce(flow_comm_t *c, const void *send,
				  void *recv, size_t count, flow_dtype_t dtype,
				  flow_diag_t *diag)
{
	nccl_state_t *s = c->impl;
	flow_err_t err = FLOW_OK;
	FLOW_NCCL_TRY(c, ncclAllReduce(send, recv, count, nccl_type(dtype),
				       ncclSum, s->comm, s->stream),
		      out);
	err = wait_done(c, s, true, diag);
out:
	return err;
}

static bool all_equal(const size_t *counts, int n)
{
	for (int r = 1; r < n; r++)
		if (counts[r] != counts[0])
			return false;
	return true;
}

/* Close a group opened with ncclGroupStart, even after a failed call
 * inside it (the first error is kept), and wait for what it launched. */
static flow_err_t group_end_wait(flow_comm_t *c, flow_err_t err,
				 flow_diag_t *diag)
{
	ncclResult_t r = ncclGroupEnd();
	if (!err && r != ncclSuccess && r != ncclInProgress)
		err = flow_comm_fail(c, diag, FLOW_ERR_DEVICE, "NCCL: %s (%s)",
				     ncclGetErrorString(r),
				     ncclGetLastError(NULL));
	return err ? err : wait_done(c, c->impl, true, diag);
}

/* Operations NCCL takes between ncclGroupStart and ncclGroupEnd: the
 * maximum its user guide gave (2.11), kept for every version. */
#define NCCL_GROUP_MAX 2048

/* The n sums in one NCCL group: one launch, one wait (one per
 * NCCL_GROUP_MAX sums). */
static flow_err_t nccl_all_reduce_group(flow_comm_t *c, void *const *bufs,
					const size_t *counts, size_t n,
					flow_dtype_t dtype, flow_diag_t *diag)
{
	nccl_state_t *s = c->impl;
	flow_err_t err = FLOW_OK;
	for (size_t first = 0; first < n && !err; first += NCCL_GROUP_MAX) {
		size_t end = n - first < NCCL_GROUP_MAX ? n : first + NCCL_GROUP_MAX;
		FLOW_NCCL_TRY(c, ncclGroupStart(), out);
		for (size_t i = first; i < end; i++)
			if (counts[i])
				FLOW_NCCL_TRY(c, ncclAllReduce(bufs[i], bufs[i],
							       counts[i],
							       nccl_type(dtype),
							       ncclSum, s->comm,
							       s->stream),
					      group);
group:
		err = group_end_wait(c, err, diag);
	}
out:
	return err;
}

/* Reduce-scatter (reduce) and all-gather (!reduce): NCCL's own collective
 * for equal blocks; uneven blocks as one reduce, or one broadcast, per
 * owner inside one group. */
static flow_err_t nccl_blocks(flow_comm_t *c, bool reduce, const void *send,
			      void *recv, const size_t *counts,
			      flow_dtype_t dtype, flow_diag_t *diag)
{
	nccl_state_t *s = c->impl;
	ncclDataType_t type = nccl_type(dtype);
	size_t elem = flow_dtype_size(dtype), off = 0;
	flow_err_t err = FLOW_OK;
	if (all_equal(counts, c->size)) {
		if (reduce)
			FLOW_NCCL_TRY(c, ncclReduceScatter(send, recv, counts[0],
							   type, ncclSum, s->comm,
							   s->stream),
				      out);
		else
			FLOW_NCCL_TRY(c, ncclAllGather(send, recv,
						       nccl_count(counts[0], dtype),
						       type, s->comm, s->stream),
				      out);
		return wait_done(c, s, true, diag);
	}
	FLOW_NCCL_TRY(c, ncclGroupStart(), out);
	for (int r = 0; r < c->size; r++) {
		if (reduce)
			FLOW_NCCL_TRY(c, ncclReduce((const char *)send + off * elem,
						    recv, counts[r], type, ncclSum,
						    r, s->comm, s->stream),
				      group);
		else
			FLOW_NCCL_TRY(c, ncclBroadcast(send,
						       (char *)recv + off * elem,
						       nccl_count(counts[r], dtype),
						       type, r, s->comm, s->stream),
				      group);
		off += counts[r];
	}
group:
	err = group_end_wait(c, err, diag);
out:
	return err;
}

static flow_err_t nccl_reduce_scatter(flow_comm_t *c, const void *send,
				      void *recv, const size_t *counts,
				      flow_dtype_t dtype, flow_diag_t *diag)
{
	return nccl_blocks(c, true, send, recv, counts, dtype, diag);
}

static flow_err_t nccl_all_gather(flow_comm_t *c, const void *send,
				  void *recv, const size_t *counts,
				  flow_dtype_t dtype, flow_diag_t *diag)
{
	return nccl_blocks(c, false, send, recv, counts, dtype, diag);
}

static flow_err_t nccl_all_to_all(flow_comm_t *c, const void *send,
				  const size_t *send_counts, void *recv,
				  const size_t *recv_counts, flow_dtype_t dtype,
				  flow_diag_t *diag)
{
	nccl_state_t *s = c->impl;
	size_t elem = flow_dtype_size(dtype), so = 0, ro = 0;
	flow_err_t err = FLOW_OK;
	FLOW_NCCL_TRY(c, ncclGroupStart(), out);
	for (int r = 0; r < c->size; r++) {
		if (send_counts[r])
			FLOW_NCCL_TRY(c, ncclSend((const char *)send + so * elem,
						  send_counts[r] * elem,
						  ncclUint8, r, s->comm,
						  s->stream),
				      group);
		if (recv_counts[r])
			FLOW_NCCL_TRY(c, ncclRecv((char *)recv + ro * elem,
						  recv_counts[r] * elem,
						  ncclUint8, r, s->comm,
						  s->stream),
				      group);
		so += send_counts[r];
		ro += recv_counts[r];
	}
group:
	err = group_end_wait(c, err, diag);
out:
	return err;
}

static flow_err_t nccl_broadcast(flow_comm_t *c, void *buf, size_t count,
				 flow_dtype_t dtype, int root,
				 flow_diag_t *diag)
{
	nccl_state_t *s = c->impl;
	flow_err_t err = FLOW_OK;
	FLOW_NCCL_TRY(c, ncclBroadcast(buf, buf, nccl_count(count, dtype),
				       nccl_type(dtype), root, s->comm,
				       s->stream),
		      out);
	err = wait_done(c, s, true, diag);
out:
	return err;
}

static flow_err_t nccl_send(flow_comm_t *c, const void *buf, size_t bytes,
			    int peer, flow_diag_t *diag)
{
	nccl_state_t *s = c->impl;
	flow_err_t err = FLOW_OK;
	FLOW_NCCL_TRY(c, ncclSend(buf, bytes, ncclUint8, peer, s->comm,
				  s->stream),
		      out);
	err = wait_done(c, s, true, diag);
	if (!err)
		c->p2p_sent[peer]++;
out:
	return err;
}

static flow_err_t nccl_recv(flow_comm_t *c, void *buf, size_t bytes, int peer,
			    flow_diag_t *diag)
{
	nccl_state_t *s = c->impl;
	flow_err_t err = FLOW_OK;
	FLOW_NCCL_TRY(c, ncclRecv(buf, bytes, ncclUint8, peer, s->comm,
				  s->stream),
		      out);
	err = wait_done(c, s, true, diag);
	if (!err)
		c->p2p_recvd[peer]++;
out:
	return err;
}

static flow_err_t nccl_barrier(flow_comm_t *c, flow_diag_t *diag)
{
	nccl_state_t *s = c->impl;
	return nccl_all_reduce(c, s->scratch, s->scratch, 1, FLOW_DTYPE_I32,
			       diag);
}

static const flow_comm_ops_t nccl_ops = {
	.transport = "nccl",
	.all_reduce = nccl_all_reduce,
	.all_reduce_group = nccl_all_reduce_group,
	.reduce_scatter = nccl_reduce_scatter,
	.all_gather = nccl_all_gather,
	.all_to_all = nccl_all_to_all,
	.broadcast = nccl_broadcast,
	.send = nccl_send,
	.recv = nccl_recv,
	.barrier = nccl_barrier,
	.destroy = nccl_destroy,
};
