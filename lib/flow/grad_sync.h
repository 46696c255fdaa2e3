/* Overlapped data-parallel gradient sums: the buckets of
 * flow/grad_buckets.h, each all-reduced on a communication thread as soon
 * as the backward pass has completed it, while the pass goes on with the
 * layers below.  What the trainer does on the last micro-batch of a step
 * when the data-parallel group sums whole gradients (no ZeRO split, no
 * graph of shards): in host memory over a CPU communicator, or on a GPU
 * over NCCL, where the executor records an event after each bucket's
 * launch op and the thread waits for it before the bucket's all-reduce,
 * which then runs on NCCL's stream while the backward kernels go on on
 * theirs.
 *
 * A bucket is one flow_all_reduce_group over its gradients, buckets in
 * the same order on every rank.  Over a CPU communicator that is
 * flow_all_reduce over each gradient, so the bits are the same as summing
 * after the pass; only when the sums run changes.  Over NCCL it is one
 * grouped launch per bucket, the same run to run (NCCL may pick another
 * algorithm for a group than for its members alone, which over more than
 * two ranks can sum in another order).  The communicator belongs to the
 * communication thread from flow_grad_sync_arm to flow_grad_sync_wait:
 * the caller must not use it in between.
 *
 * Not thread-safe otherwise: one caller thread (the executor's). */
#ifndef FLOW_GRAD_SYNC_H
#define FLOW_GRAD_SYNC_H

#include <flow/comm.h>
#include <flow/exec.h>
#include <flow/grad_buckets.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flow_grad_sync flow_grad_sync_t;

/* The buckets of exec's graph at capacity bytes (> 0), summed over comm
 * (a CPU communicator over the host's storage, or an NCCL one over a
 * device's with events), and the thread that sums them.  FLOW_OK and
 * *sync_out (free with flow_grad_sync_free); flow_grad_buckets_new's
 * errors; FLOW_ERR_USAGE for another pairing (a CPU communicator over a
 * device: the staged sums of flow/zero.h serve it); FLOW_ERR_NOMEM or
 * FLOW_ERR_IO (the thread). */
FLOW_EXPORT flow_err_t flow_grad_sync_new(flow_exec_t *exec, flow_comm_t *comm,
					  size_t capacity,
					  flow_grad_sync_t **sync_out,
					  flow_diag_t *diag) FLOW_MUST_CHECK;
/* Stop the thread (after what it is summing) and free; NULL is ignored. */
FLOW_EXPORT void flow_grad_sync_free(flow_grad_sync_t *sync);

/* The next backward pass of the executor launches each bucket after its
 * launch op (buckets ready before the pass go at once). */
FLOW_EXPORT void flow_grad_sync_arm(flow_grad_sync_t *sync);
/* Wait until every bucket of the armed pass is summed and disarm:
 * FLOW_OK, or the first collective's failure with its line in diag (the
 * buckets after it are not summed).  A pass that stopped early (a failed
 * op) leaves buckets unlaunched: they are skipped, and the error is the
 * pass's. */
FLOW_EXPORT flow_err_t flow_grad_sync_wait(flow_grad_sync_t *sync,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

/* The plan it follows; borrowed for its life. */
FLOW_EXPORT const flow_grad_buckets_t *
flow_grad_sync_buckets(const flow_grad_sync_t *sync);
/* Buckets launched by the armed (or last) pass so far, in order; and the
 * backward op after which bucket i was launched (-1: at arm), for tests
 * of the launch order.  *launched_after_out has nbuckets entries. */
FLOW_EXPORT size_t flow_grad_sync_launched(const flow_grad_sync_t *sync,
					   const int **launched_after_out);

#ifdef __cplusplus
}
#endif

#endif
