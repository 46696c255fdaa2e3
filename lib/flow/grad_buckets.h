/* Gradient buckets: which parameter gradients a data-parallel trainer
 * sums together, and after which backward op each group can be sent, so
 * that the gradient collectives overlap the rest of the backward pass (the
 * buckets of PyTorch's DistributedDataParallel, computed from the graph
 * instead of observed at run time).
 *
 * The plan is a function of the graph, the capacity and the selection
 * alone, so every rank that builds the same graph gets the same buckets in
 * the same order, which collectives require: rank r's k-th all-reduce must
 * meet every other rank's k-th.
 *
 * A gradient's ready point is the last backward op (program order, see
 * flow/graph.h) that writes it.  Backward ops accumulate (flow/ops.h), so
 * a gradient written by several ops (GPT's wte, by the head's
 * matmul_backward and by embedding_backward) is final for the micro-batch
 * only after the last of them.  Backward ops never read a parameter
 * gradient (flow/ops.h lists what they read), so once its ready point has
 * run nothing in the pass touches it again.  A parameter gradient that no
 * op writes (a parameter that does not reach the loss: autograd gives it a
 * gradient that stays zero) is ready before the backward pass, ready point
 * -1.
 *
 * Buckets take the selected gradients in ready order, ties broken by the
 * parameter's tensor index from the highest down (reverse graph order, the
 * order in which backward visits them), and pack consecutive gradients
 * while the bucket's bytes stay within the capacity; a gradient larger
 * than the capacity is a bucket of its own.  Inside a bucket each gradient
 * starts at a multiple of FLOW_GRAD_BUCKET_ALIGN, so one flat staging
 * buffer per bucket holds every member at an address NCCL and vectorised
 * copies like. */
#ifndef FLOW_GRAD_BUCKETS_H
#define FLOW_GRAD_BUCKETS_H

#include <stdio.h>

#include <flow/graph.h>

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch DDP's default bucket_cap_mb, 25 MiB. */
#define FLOW_GRAD_BUCKET_DEFAULT_BYTES ((size_t)25 << 20)
/* Alignment of each gradient inside its bucket, in bytes (cudaMalloc's). */
#define FLOW_GRAD_BUCKET_ALIGN ((size_t)256)

typedef struct flow_grad_bucket_member {
	int grad;       /* the gradient tensor (role PARAM_GRAD) */
	int param;      /* the parameter it is the gradient of */
	int ready_op;   /* the last backward op writing grad; -1 when none
			 * does (ready before the backward pass) */
	size_t offset;  /* bytes from the start of the bucket: a multiple of
			 * FLOW_GRAD_BUCKET_ALIGN */
	size_t bytes;   /* the gradient's bytes (flow_graph_tensor_bytes) */
} flow_grad_bucket_member_t;

typedef struct flow_grad_bucket {
	size_t first;   /* its members are members[first, first + count) */
	size_t count;   /* >= 1 */
	size_t bytes;   /* staging buffer: last member's offset + bytes; at
			 * most the capacity unless count is 1 */
	int launch_op;  /* the highest ready_op of its members (the last
			 * one's): the bucket can be sent once this op has
			 * run; -1: before the backward pass */
} flow_grad_bucket_t;

/* The plan.  Members are in bucket order, and within a bucket in
 * non-decreasing ready_op; launch_op is non-decreasing over the buckets.
 * Read-only for callers. */
typedef struct flow_grad_buckets {
	size_t capacity;               /* bytes, as asked */
	size_t nbuckets;
	flow_grad_bucket_t *buckets;
	size_t nmembers;               /* the selected gradients */
	flow_grad_bucket_member_t *members;
} flow_grad_buckets_t;

/* The buckets of the gradients of g (differentiated by
 * flow_graph_backward) of at most capacity bytes each
 * (FLOW_GRAD_BUCKET_DEFAULT_BYTES is DDP's).  select: NULL for every
 * parameter that has a gradient, or g->ntensors flags, select[t] true for
 * each parameter t whose gradient takes part (ZeRO and tensor-parallel
 * callers leave some out); it must be false for every tensor that is not
 * a parameter.  No selected gradient gives zero buckets.
 *
 * Returns FLOW_OK and sets *buckets_out (free with flow_grad_buckets_free),
 * or, with diag set and *buckets_out untouched: FLOW_ERR_USAGE for a
 * capacity of 0, a graph that is not differentiated, a selected tensor
 * that is not a parameter or a selected parameter without a gradient;
 * FLOW_ERR_NOMEM.
 * Reads g only; g may be freed afterwards (tensor and op indices are kept,
 * not pointers).  Thread-safe for distinct outputs. */
FLOW_EXPORT flow_err_t flow_grad_buckets_new(const flow_graph_t *g,
					     size_t capacity,
					     const bool *select,
					     flow_grad_buckets_t **buckets_out,
					     flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Free b; NULL is ignored. */
FLOW_EXPORT void flow_grad_buckets_free(flow_grad_buckets_t *b);

/* The buckets that become launchable right after op `op` has run (op -1:
 * before the first backward op): buckets[*first_out, *first_out +
 * *count_out), those whose launch_op is op.  An executor that calls this
 * with -1 and then after each backward op, in program order, and launches
 * what it gets in index order, launches every bucket exactly once, in
 * bucket order.  With none, *count_out is 0 and *first_out the index of
 * the first bucket launched later (nbuckets when none is).  Cannot fail. */
FLOW_EXPORT void flow_grad_buckets_after_op(const flow_grad_buckets_t *b,
					    int op, size_t *first_out,
					    size_t *count_out);

/* One line per bucket (flow-train --verbose): its index, bytes, launch
 * point and members with their offsets, e.g.
 *   bucket 0: 1280 bytes after op 61 h.1.mlp.c_proj.backward: h.1.mlp.c_proj.bias.grad@0 h.1.mlp.c_proj.weight.grad@256
 * ("before backward" for launch_op -1).
 * g is the graph b was built from, for names.  FLOW_OK; FLOW_ERR_USAGE when
 * b names a tensor or op g does not have; FLOW_ERR_IO when writing to out
 * fails. */
FLOW_EXPORT flow_err_t flow_grad_buckets_describe(const flow_grad_buckets_t *b,
						  const flow_graph_t *g,
						  FILE *out, flow_diag_t *diag)
	FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
