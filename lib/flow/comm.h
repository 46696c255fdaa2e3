/* Communicators and collectives: one API, two backends.
 *
 * The CPU backend moves host memory: shared memory between the ranks of a
 * communicator that all live on one node, TCP between every pair when a
 * communicator spans nodes.  The NCCL backend moves device memory (built
 * when NCCL is found).  A communicator covers the whole world or a group of
 * it (flow_comm_split, flow_comm_mesh_axes for the groups of mesh axes).
 *
 * Every collective is blocking, has a sequence number per communicator and
 * a deadline: a peer that dies, closes its connection or stalls makes the
 * call fail on every other rank within the deadline with one line such as
 *   rank 3 (node2): peer rank 5 (node1) closed the connection during
 *   all-reduce #4812
 * (ranks are world ranks), never a hang.  After such a failure the
 * communicator is unusable: free it and leave the job (flow_world_abort).
 *
 * Counts are in elements.  Buffers of different ranks' blocks are laid out
 * in rank order.  Reductions are sums; every rank of a communicator gets
 * bit-identical results.  Not thread-safe: one thread per communicator. */
#ifndef FLOW_COMM_H
#define FLOW_COMM_H

#include <flow/sbp.h>
#include <flow/tensor.h>
#include <flow/world.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
	FLOW_COMM_CPU = 0,  /* host buffers: shared memory or TCP */
	FLOW_COMM_NCCL = 1, /* device buffers (cudaMalloc'd) */
} flow_comm_backend_t;

typedef struct flow_comm flow_comm_t;

/* The communicator of every rank of the world.  Collective over the world.
 * For NCCL the device is the rank's by the GPU binding rule
 * (flow/gpu_binding.h: FLOW_CUDA_DEVICE, Slurm's binding, else the local
 * rank), set with cudaSetDevice before the call returns; two ranks of one
 * node on the same GPU (host and PCI bus id exchanged) are refused with
 * FLOW_ERR_USAGE.
 * FLOW_ERR_NOTSUP for NCCL in a build without it. */
FLOW_EXPORT flow_err_t flow_comm_world(flow_world_t *w,
				       flow_comm_backend_t backend,
				       flow_comm_t **out, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Split parent as MPI_Comm_split does: ranks giving the same color (>= 0)
 * form one communicator, ordered by key then parent rank.  Collective over
 * parent.  The new communicator has the parent's backend and deadline. */
FLOW_EXPORT flow_err_t flow_comm_split(flow_comm_t *parent, int color, int key,
				       flow_comm_t **out, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* The group of the mesh axes in axes_mask (bit i: axis i) that contains
 * this rank: the ranks sharing every other coordinate, ordered by their
 * row-major position.  Collective over parent, whose ranks (parent ranks,
 * 0 .. size-1) must be exactly the mesh's ranks.  FLOW_ERR_USAGE when they
 * are not. */
FLOW_EXPORT flow_err_t flow_comm_mesh_axes(flow_comm_t *parent,
					   const flow_mesh_t *mesh,
					   unsigned axes_mask,
					   flow_comm_t **out,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

/* Not collective; NULL is a no-op. */
FLOW_EXPORT void flow_comm_free(flow_comm_t *c);

FLOW_EXPORT int flow_comm_rank(const flow_comm_t *c);
FLOW_EXPORT int flow_comm_size(const flow_comm_t *c);
/* World rank of communicator rank r. */
FLOW_EXPORT int flow_comm_world_rank(const flow_comm_t *c, int r);
FLOW_EXPORT flow_comm_backend_t flow_comm_backend(const flow_comm_t *c);
/* "shm", "tcp", "nccl" or "self" (one rank): the transport in use. */
FLOW_EXPORT const char *flow_comm_transport(const flow_comm_t *c);
/* Deadline of each following collective, seconds (> 0). */
FLOW_EXPORT void flow_comm_set_timeout(flow_comm_t *c, double seconds);
/* Sequence number of the last collective started (0 before the first). */
FLOW_EXPORT uint64_t flow_comm_seq(const flow_comm_t *c);
/* The CUDA device an NCCL communicator uses, -1 for CPU. */
FLOW_EXPORT int flow_comm_device(const flow_comm_t *c);
/* The world c was made from; borrowed, valid while c is. */
FLOW_EXPORT flow_world_t *flow_comm_world_of(const flow_comm_t *c);

/* Can this backend reduce this dtype: f32, bf16, f16, i32, i64, u8, u32 on
 * the CPU; NCCL's list on NCCL.  Every dtype can be moved. */
FLOW_EXPORT bool flow_comm_can_reduce(flow_comm_backend_t backend,
				      flow_dtype_t dtype);

/* ---- collectives ---------------------------------------------------------
 * Each returns FLOW_OK, FLOW_ERR_USAGE for bad arguments (checked on this
 * rank only: all ranks must pass matching counts), FLOW_ERR_PEER or
 * FLOW_ERR_TIMEOUT when a peer fails, FLOW_ERR_DEVICE for NCCL or CUDA
 * errors.  Unless stated, send and recv may be the same buffer (in place)
 * and zero counts are allowed. */

/* recv[i] = sum over ranks of send[i], for count elements. */
FLOW_EXPORT flow_err_t flow_all_reduce(flow_comm_t *c, const void *send,
				       void *recv, size_t count,
				       flow_dtype_t dtype, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* In place, for each i < n: bufs[i] = sum over ranks of bufs[i], counts[i]
 * elements (buffers must not overlap; every rank passes the same n and
 * counts).  On NCCL the n sums are one grouped launch, waited on once (a
 * bucket of gradients as one collective); the CPU backend sums one buffer
 * after another, each a collective of its own. */
FLOW_EXPORT flow_err_t flow_all_reduce_group(flow_comm_t *c, void *const *bufs,
					     const size_t *counts, size_t n,
					     flow_dtype_t dtype,
					     flow_diag_t *diag) FLOW_MUST_CHECK;

/* send holds sum(counts) elements, block r of counts[r] elements for rank
 * r; recv gets the sum over ranks of this rank's block.  Not in place
 * (recv must not overlap send). */
FLOW_EXPORT flow_err_t flow_reduce_scatter(flow_comm_t *c, const void *send,
					   void *recv, const size_t *counts,
					   flow_dtype_t dtype,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

/* Rank r gives counts[r] elements; recv gets every rank's block in rank
 * order (sum(counts) elements).  Not in place. */
FLOW_EXPORT flow_err_t flow_all_gather(flow_comm_t *c, const void *send,
				       void *recv, const size_t *counts,
				       flow_dtype_t dtype, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* send holds send_counts[j] elements for each rank j in rank order; recv
 * gets recv_counts[j] elements from each rank j in rank order.
 * recv_counts[j] on this rank must equal send_counts[me] on rank j.  Not in
 * place. */
FLOW_EXPORT flow_err_t flow_all_to_all(flow_comm_t *c, const void *send,
				       const size_t *send_counts, void *recv,
				       const size_t *recv_counts,
				       flow_dtype_t dtype, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* root's count elements of buf reach every rank's buf. */
FLOW_EXPORT flow_err_t flow_broadcast(flow_comm_t *c, void *buf, size_t count,
				      flow_dtype_t dtype, int root,
				      flow_diag_t *diag) FLOW_MUST_CHECK;

/* Point to point; the peer must make the matching call.  A send and a recv
 * between the same two ranks are matched in program order. */
FLOW_EXPORT flow_err_t flow_send(flow_comm_t *c, const void *buf, size_t count,
				 flow_dtype_t dtype, int peer,
				 flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_recv(flow_comm_t *c, void *buf, size_t count,
				 flow_dtype_t dtype, int peer,
				 flow_diag_t *diag) FLOW_MUST_CHECK;

FLOW_EXPORT flow_err_t flow_barrier(flow_comm_t *c, flow_diag_t *diag)
	FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
