/* What the communicator core (comm.c) shares with its backends (comm_shm.c,
 * comm_tcp.c, comm_nccl.c): the communicator record, the backend table, the
 * sum kernels, deadlines and the one place that words a peer's failure. */
#ifndef FLOW_COMM_INTERNAL_H
#define FLOW_COMM_INTERNAL_H

#include <flow/comm.h>

/* Which collective is running, for messages ("all-reduce #12") and for the
 * TCP message headers. */
typedef enum {
	FLOW_OP_NONE = 0,
	FLOW_OP_ALL_REDUCE,
	FLOW_OP_REDUCE_SCATTER,
	FLOW_OP_ALL_GATHER,
	FLOW_OP_ALL_TO_ALL,
	FLOW_OP_BROADCAST,
	FLOW_OP_SEND,
	FLOW_OP_RECV,
	FLOW_OP_BARRIER,
	FLOW_OP_SETUP, /* building the communicator */
} flow_comm_op_t;

/* "all-reduce", "reduce-scatter", ..., "send", "recv", "barrier", "setup". */
const char *flow_comm_op_name(flow_comm_op_t op);

/* A backend.  The core has checked the arguments, handled size-1
 * communicators and zero-byte transfers where the result is trivial, set
 * c->op and advanced c->seq before calling; counts are element counts,
 * elem the dtype size.  Each returns FLOW_OK or an error with diag set
 * (through flow_comm_peer_fail / flow_comm_timed_out for peer problems). */
typedef struct flow_comm_ops {
	const char *transport; /* "shm", "tcp", "nccl" */
	flow_err_t (*all_reduce)(flow_comm_t *c, const void *send, void *recv,
				 size_t count, flow_dtype_t dtype,
				 flow_diag_t *diag);
	/* In-place sums of n buffers as one collective; NULL: the core
	 * calls all_reduce once per buffer. */
	flow_err_t (*all_reduce_group)(flow_comm_t *c, void *const *bufs,
				       const size_t *counts, size_t n,
				       flow_dtype_t dtype, flow_diag_t *diag);
	flow_err_t (*reduce_scatter)(flow_comm_t *c, const void *send,
				     void *recv, const size_t *counts,
				     flow_dtype_t dtype, flow_diag_t *diag);
	flow_err_t (*all_gather)(flow_comm_t *c, const void *send, void *recv,
				 const size_t *counts, flow_dtype_t dtype,
				 flow_diag_t *diag);
	flow_err_t (*all_to_all)(flow_comm_t *c, const void *send,
				 const size_t *send_counts, void *recv,
				 const size_t *recv_counts, flow_dtype_t dtype,
				 flow_diag_t *diag);
	flow_err_t (*broadcast)(flow_comm_t *c, void *buf, size_t count,
				flow_dtype_t dtype, int root,
				flow_diag_t *diag);
	/* Point to point; bytes, not elements. */
	flow_err_t (*send)(flow_comm_t *c, const void *buf, size_t bytes,
			   int peer, flow_diag_t *diag);
	flow_err_t (*recv)(flow_comm_t *c, void *buf, size_t bytes, int peer,
			   flow_diag_t *diag);
	flow_err_t (*barrier)(flow_comm_t *c, flow_diag_t *diag);
	/* Release c->impl (not collective; may run after a failure). */
	void (*destroy)(flow_comm_t *c);
} flow_comm_ops_t;

struct flow_comm {
	flow_world_t *world;
	flow_comm_backend_t backend;
	const flow_comm_ops_t *ops; /* NULL for a one-rank communicator */
	void *impl;                 /* the backend's state */
	int rank, size;
	int *world_ranks;  /* [size]: communicator rank -> world rank */
	/* Same on every member and different for every communicator of the
	 * job: the world is 0, a split child mixes its parent's id, its
	 * parent's split count and its color. */
	uint64_t id;
	uint64_t nsplits;  /* children made so far (for their ids) */
	uint64_t seq;      /* collectives started; the running one's number */
	uint64_t *p2p_sent, *p2p_recvd; /* [size]: point-to-point counts */
	flow_comm_op_t op; /* the running operation */
	int peer;          /* its peer, for send and recv */
	double timeout_s;
	double deadline;   /* when the running operation must be over */
	bool failed;       /* a peer failed: every later call is refused */
	int *pidfds;       /* [size]: pidfd of each member on this node, else
			      -1 (liveness checks) */
	int device;        /* NCCL: CUDA device; CPU: -1 */
	/* NCCL: a CPU communicator of the same members, for the exchanges
	 * that set up splits and unique ids.  NULL for CPU communicators. */
	flow_comm_t *host;
};

/* Backend constructors: fill c->ops and c->impl for the members in
 * c->world_ranks.  Collective over the members; they may wait for each
 * other (under c->timeout_s) but must not use PMIx, so the same code serves
 * the world and split children.  NCCL's also gets the parent to exchange
 * its unique id (NULL for the world: PMIx is used then). */
flow_err_t flow_comm_shm_init(flow_comm_t *c, flow_diag_t *diag);
flow_err_t flow_comm_tcp_init(flow_comm_t *c, flow_diag_t *diag);
/* In libflow-cuda.so, reached through the module's table. */
flow_err_t flow_comm_nccl_init(flow_comm_t *c, flow_comm_t *parent,
			       flow_diag_t *diag);

/* The number of world communicators made so far in w (world.c): collective
 * calls, so the same on every rank; each new world communicator's id comes
 * from it. */
uint64_t flow_world_next_comm(flow_world_t *w);

/* ---- deadlines and failures ------------------------------------------- */
/* FLOW_EXPORT on these six: the NCCL backend lives in libflow-cuda.so
 * (flow/device.h) and words its failures through them.  They are not API:
 * this header is not installed. */

/* Monotonic clock, seconds. */
FLOW_EXPORT double flow_comm_now(void);
/* When the running operation must be over: its start plus c->timeout_s.
 * Set by the core as each operation starts. */
FLOW_EXPORT double flow_comm_deadline(const flow_comm_t *c);

/* Is communicator rank r still running, as far as this node can tell: a
 * peer on this node is checked through a pidfd (or kill(pid, 0)); a peer on
 * another node is reported alive (its sockets tell).  Cheap: call it
 * every few milliseconds while waiting. */
bool flow_comm_peer_alive(flow_comm_t *c, int r);
/* The first member (other than this rank) that is dead, or -1. */
FLOW_EXPORT int flow_comm_first_dead_peer(flow_comm_t *c);

/* Record a peer's failure in diag and mark c failed:
 *   "rank 3 (node2): peer rank 5 (node1) <what> during all-reduce #4812"
 * with world ranks and hosts; what is e.g. "closed the connection" or
 * "died".  r is a communicator rank.  Returns FLOW_ERR_PEER. */
FLOW_EXPORT flow_err_t flow_comm_peer_fail(flow_comm_t *c, flow_diag_t *diag, int r,
			       const char *what_fmt, ...) FLOW_PRINTF(4, 5);
/* The deadline passed while waiting for communicator rank r (-1: for
 * several or unknown ranks):
 *   "rank 3 (node2): timed out after 60 s waiting for rank 5 (node1)
 *    during all-reduce #4812"
 * Marks c failed; returns FLOW_ERR_TIMEOUT. */
FLOW_EXPORT flow_err_t flow_comm_timed_out(flow_comm_t *c, flow_diag_t *diag, int r);
/* Any other failure of the running operation on this rank (a system call,
 * a protocol mismatch): "rank 3 (node2): <message> during all-reduce #4812".
 * Marks c failed; returns err. */
FLOW_EXPORT flow_err_t flow_comm_fail(flow_comm_t *c, flow_diag_t *diag, flow_err_t err,
			  const char *fmt, ...) FLOW_PRINTF(4, 5);

/* ---- reductions ----------------------------------------------------------- */

/* dst[i] += src[i] for count elements of dtype (a dtype flow_comm_can_reduce
 * accepts for the CPU; integers wrap).  bf16 and f16 add in f32 and round
 * once per call. */
void flow_comm_sum_into(void *dst, const void *src, size_t count,
			flow_dtype_t dtype);
/* dst[i] = sum over k < n of srcs[k][i], added in the order k = 0 .. n-1
 * (f32 accumulator for bf16/f16, rounded once); dst may be one of srcs. */
void flow_comm_sum_n(void *dst, const void *const *srcs, int n, size_t count,
		     flow_dtype_t dtype);

#endif
