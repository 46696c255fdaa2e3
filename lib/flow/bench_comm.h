/* Benchmarks of the collectives (the library half of `flow-bench comm`),
 * with nccl-tests' definitions:
 *
 *   size    bytes of the buffer the operation is named after: all-reduce
 *           and broadcast the buffer, all-gather the gathered result,
 *           reduce-scatter the input, all-to-all one rank's input
 *   time    the slowest rank's mean time per call, after warm-up calls
 *   algbw   size / time
 *   busbw   algbw * factor: 2(n-1)/n for all-reduce; (n-1)/n for
 *           reduce-scatter, all-gather and all-to-all; 1 for broadcast
 *
 * Inputs are small integers, so every sum is exact and each result is
 * checked bit for bit; the wrong count is the total over all ranks.
 * Collective over the communicator: every rank calls with the same
 * arguments. */
#ifndef FLOW_BENCH_COMM_H
#define FLOW_BENCH_COMM_H

#include <flow/comm.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
	FLOW_BENCH_ALL_REDUCE = 0,
	FLOW_BENCH_REDUCE_SCATTER,
	FLOW_BENCH_ALL_GATHER,
	FLOW_BENCH_ALL_TO_ALL,
	FLOW_BENCH_BROADCAST,
	FLOW_BENCH_NCOLLS
} flow_bench_coll_t;

/* "all_reduce", "reduce_scatter", "all_gather", "all_to_all",
 * "broadcast"; NULL out of range. */
FLOW_EXPORT const char *flow_bench_coll_name(flow_bench_coll_t op);
/* By name; FLOW_ERR_USAGE listing the names when unknown. */
FLOW_EXPORT flow_err_t flow_bench_coll_lookup(const char *name,
					      flow_bench_coll_t *op_out,
					      flow_diag_t *diag) FLOW_MUST_CHECK;
/* busbw / algbw for n ranks (see above). */
FLOW_EXPORT double flow_bench_coll_busbw_factor(flow_bench_coll_t op, int n);

typedef struct flow_bench_comm_result {
	size_t bytes;      /* size, rounded down to whole elements per rank */
	size_t count;      /* bytes / element size */
	double time_us;    /* slowest rank's mean per call */
	double algbw_GBps; /* 1e9 bytes per second */
	double busbw_GBps;
	uint64_t wrong;    /* wrong elements over all ranks */
} flow_bench_comm_result_t;

/* Measure op at (about) bytes: warmup untimed calls, then iters timed
 * ones, then one checked call.  For the NCCL backend the buffers live on
 * the communicator's device.  FLOW_OK and *out on every rank; a failed
 * collective's error otherwise. */
FLOW_EXPORT flow_err_t flow_bench_comm_run(flow_comm_t *c, flow_bench_coll_t op,
					   flow_dtype_t dtype, size_t bytes,
					   unsigned iters, unsigned warmup,
					   flow_bench_comm_result_t *out,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
