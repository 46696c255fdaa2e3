/* The executor: runs a differentiated graph (flow/graph.h) on a kernel
 * set's device (the CPU, or a GPU through the CUDA module).
 *
 * It owns the storage of every tensor: parameters and their gradients (one
 * block each, tensors in graph order, each on a 64-byte boundary), inputs,
 * and one arena for the transient tensors laid out by the memory plan, all
 * taken from the storage that goes with the chosen kernel set
 * (flow_exec_storage_t).  It maps each op kind to a kernel of that set's
 * table (flow/kernels.h, flow_kernels_t), or to the kernel's bf16 twin
 * where the graph stores the op's activations in bf16 (a graph whose
 * act_dtype is bf16: mixed precision), and keeps, when asked, a
 * per-op-kind profile.
 *
 * A step is: write the inputs (flow_exec_tensor), flow_exec_forward,
 * flow_exec_backward, once per micro-batch; the caller (the trainer) zeroes
 * the parameter gradients before the first micro-batch and runs the
 * optimizer after the last. */
#ifndef FLOW_EXEC_H
#define FLOW_EXEC_H

#include <stdio.h>

#include <flow/box.h>
#include <flow/graph.h>
#include <flow/kernels.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
	FLOW_KERNELS_CPU = 0, /* flow/kernels.h: OpenMP + BLAS */
	FLOW_KERNELS_REF = 1, /* flow/kernels_ref.h: naive, computed in double
			       * and rounded once (gradient checks) */
	FLOW_KERNELS_CUDA = 2, /* the CUDA module's set (flow/device.h), on the
				* calling thread's current device */
	FLOW_KERNELS_STAGED = 3, /* the CPU set over flow_exec_storage_staged:
				  * the device paths, tested without a GPU */
} flow_kernel_set_t;

typedef struct flow_exec flow_exec_t;

/* Where an executor keeps its tensors.  Every buffer it owns that kernels
 * read or write (parameters, their gradients, inputs, the arena, kernel
 * scratch) is allocated, cleared and freed through one of these, chosen
 * with the kernel set, so a device whose memory the host cannot address
 * (CUDA) plugs in here and in flow/kernels.h without touching the graph
 * walk.  When the host cannot address it (host_addressable false), what
 * the host gives or takes (parameter values, inputs, the losses) goes
 * through copy_in and copy_out; flow_exec_tensor's pointers are then the
 * device's, for kernels only.  The functions are called on the thread
 * that calls the executor, in the order of its kernels. */
typedef struct flow_exec_storage {
	const char *name; /* "host", "cuda" */
	bool host_addressable; /* the host may dereference its pointers */
	bool host_memory;      /* its memory is host memory, which a CPU
				* communicator moves (true of the staged
				* storage too, which says it is not
				* addressable) */
	/* bytes of zeroed memory aligned to 64 bytes (0 bytes gives a valid,
	 * unique pointer), or NULL when out of memory.  Released with this
	 * storage's free. */
	void *(*alloc)(size_t bytes);
	/* Give back memory from alloc; NULL is ignored. */
	void (*free)(void *ptr);
	/* Set the bytes [ptr, ptr + bytes) of one allocation to zero. */
	void (*zero)(void *ptr, size_t bytes);
	/* bytes from host memory src into this storage at dst, and from this
	 * storage at src into host memory dst, in order with the kernels
	 * enqueued before; copy_out returns when dst holds them.  copy_in
	 * may still be reading a src from host_alloc when it returns (the
	 * copy runs asynchronously from page-locked memory); from any other
	 * host memory src is free again on return.  flow_exec_copy_in waits
	 * in either case.  A failure is kept, as a kernel's, for the kernel
	 * set's last(). */
	void (*copy_in)(void *dst, const void *src, size_t bytes);
	void (*copy_out)(void *dst, const void *src, size_t bytes);
	/* bytes from src to dst, both in this storage, in order with the
	 * kernels; a failure kept as copy_in's. */
	void (*copy)(void *dst, const void *src, size_t bytes);
	/* Host memory this storage copies to and from fastest (page-locked
	 * for a GPU, so that its copies run at the link's speed), or NULL
	 * when out of memory; given back with host_free (NULL is ignored). */
	void *(*host_alloc)(size_t bytes);
	void (*host_free)(void *ptr);
	/* Events, for a storage whose kernels run asynchronously (NULL in
	 * the host's, whose kernels have finished when they return; the
	 * staged storage's do nothing, for the same reason): a new
	 * one (NULL when none can be made); record it after the work the
	 * calling thread has enqueued so far; wait on the host, from any
	 * thread, until that work is done; free it. */
	void *(*event_new)(void);
	void (*event_record)(void *event);
	void (*event_wait)(void *event);
	void (*event_free)(void *event);
	/* A copy beside the kernels, for a storage with events and a copy
	 * stream (NULL in the host's; every storage the host cannot address
	 * has one, since the trainer brings its batches up with it; the
	 * staged storage's copies at once): bytes from src, host_alloc
	 * memory, to dst, queued behind the work recorded in event after
	 * (NULL: nothing) but not behind the kernels enqueued since, so it
	 * overlaps them; then event done (NULL: none) is recorded.  src must
	 * stay as it is until done's work is done.  kernels_wait makes the
	 * kernels enqueued from now on wait for event's work, on the device:
	 * the host goes on.  A failure is kept as copy_in's. */
	void (*copy_in_ahead)(void *dst, const void *src, size_t bytes,
			      void *after, void *done);
	void (*kernels_wait)(void *event);
} flow_exec_storage_t;

/* Host memory: flow_calloc, flow_free (flow/mem.h) and memset.  The
 * storage of the CPU and reference sets. */
FLOW_EXPORT extern const flow_exec_storage_t flow_exec_storage_host;
/* The same memory, but saying the host cannot address it
 * (host_addressable false), so that everything the host gives or takes
 * goes through copy_in and copy_out as it does for a GPU: the storage of
 * FLOW_KERNELS_STAGED, which runs every device path of the executor, the
 * optimizer and the trainer on the CPU, and must give the CPU's bits. */
FLOW_EXPORT extern const flow_exec_storage_t flow_exec_storage_staged;

/* Plan memory for g (which must be valid and differentiated, or forward
 * only) and allocate every buffer; parameters are zero until
 * flow_exec_init_params.  FLOW_KERNELS_CUDA loads the CUDA module and
 * runs on the calling thread's current device: FLOW_ERR_NOTSUP with
 * flow_cuda_open's line where that cannot be.  A localized graph's
 * boxing and split cross-entropy run where flow_exec_set_dist's
 * communicators say.  Free with flow_exec_free(). */
FLOW_EXPORT flow_err_t flow_exec_new(const flow_graph_t *g,
				     flow_kernel_set_t kernels,
				     flow_exec_t **exec_out,
				     flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_exec_free(flow_exec_t *exec);

/* The graph and memory plan it runs; borrowed for the executor's life. */
FLOW_EXPORT const flow_graph_t *flow_exec_graph(const flow_exec_t *exec);
FLOW_EXPORT const flow_memplan_t *flow_exec_memplan(const flow_exec_t *exec);
/* Wait until every kernel and copy the executor has enqueued is done, so
 * that work outside its kernels' order (a collective on another stream)
 * may read what they wrote; their first failure (a device's), or
 * FLOW_OK.  Immediate on the host. */
FLOW_EXPORT flow_err_t flow_exec_sync(flow_exec_t *exec,
				      flow_diag_t *diag) FLOW_MUST_CHECK;
/* How many op pairs run as one kernel: a residual add and the layernorm
 * of its output, forward or backward, and a matmul and the GELU of its
 * output (flow/kernels.h, residual_layernorm_forward,
 * layernorm_residual_backward and matmul_gelu_forward). */
FLOW_EXPORT size_t flow_exec_fused_pairs(const flow_exec_t *exec);
/* Bytes of kernel scratch the executor holds (attention's backward pass,
 * the bf16 GEMMs' rounded weights and widened rows): the largest any op
 * needs. */
FLOW_EXPORT size_t flow_exec_scratch_bytes(const flow_exec_t *exec);

/* Storage of tensor t (f32 or i32 as its dtype says), contiguous
 * row-major.  Transient tensors are only meaningful within their live
 * range.  In a storage the host cannot address, a device pointer. */
FLOW_EXPORT void *flow_exec_tensor(flow_exec_t *exec, int t);
/* The storage the executor's buffers come from. */
FLOW_EXPORT const flow_exec_storage_t *flow_exec_storage(const flow_exec_t *exec);
/* The kernel table it runs. */
FLOW_EXPORT const flow_kernels_t *flow_exec_kernels(const flow_exec_t *exec);
/* bytes from host memory src to dst, a pointer into one of the
 * executor's buffers (flow_exec_tensor's, plus an offset) or of its
 * storage (an optimizer moment), or from such a src into host memory dst;
 * waited for.  FLOW_OK, or a device failure with its line in diag. */
FLOW_EXPORT flow_err_t flow_exec_copy_in(flow_exec_t *exec, void *dst,
					 const void *src, size_t bytes,
					 flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_exec_copy_out(flow_exec_t *exec, void *dst,
					  const void *src, size_t bytes,
					  flow_diag_t *diag) FLOW_MUST_CHECK;
/* bytes from src to dst, both in the executor's storage; waited for. */
FLOW_EXPORT flow_err_t flow_exec_copy(flow_exec_t *exec, void *dst,
				      const void *src, size_t bytes,
				      flow_diag_t *diag) FLOW_MUST_CHECK;
/* Copy all of tensor t from host memory src, or into host memory dst,
 * whatever the storage (flow_graph_tensor_bytes(g, t) bytes).  FLOW_OK,
 * or a device failure with its line in diag. */
FLOW_EXPORT flow_err_t flow_exec_tensor_upload(flow_exec_t *exec, int t,
					       const void *src,
					       flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT flow_err_t flow_exec_tensor_download(flow_exec_t *exec, int t,
						 void *dst,
						 flow_diag_t *diag) FLOW_MUST_CHECK;

/* Fill every parameter from its init spec (flow/graph.h, flow_init_t)
 * with the given seed.  FLOW_OK, or FLOW_ERR_NOMEM (a staging buffer) or
 * a device failure, with its line in diag. */
FLOW_EXPORT flow_err_t flow_exec_init_params(flow_exec_t *exec, uint64_t seed,
					     flow_diag_t *diag) FLOW_MUST_CHECK;
/* The same for a graph of shards (flow/localize.h): parameter t holds the
 * box boxes[t] of a logical tensor of shape logical[t], and each element
 * gets the value of its logical index, so the shards of all ranks are the
 * one-rank parameters. */
FLOW_EXPORT flow_err_t flow_exec_init_params_boxes(flow_exec_t *exec,
						   uint64_t seed,
						   const flow_box_t *boxes,
						   const flow_shape_t *logical,
						   flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Gradient scale of the loss: the cross-entropy writes
 * dlogits = scale * (softmax - onehot) per token.  The trainer sets
 * 1 / (tokens per step), so the gradient is that of the mean loss over the
 * whole step (all micro-batches).  Default 1 / (tokens of one
 * micro-batch). */
FLOW_EXPORT void flow_exec_set_loss_scale(flow_exec_t *exec, float scale);

/* Run ops [0, nforward) and write to *loss_out the mean of the losses
 * tensor over its elements, summed in double in index order (plain
 * mean, not scaled; 0 for a graph without losses).  FLOW_OK, or the
 * error of the first op that failed, with its message in diag: only the
 * ops of a localized graph that talk to other ranks can fail (a peer
 * that died or timed out).  A failure is final: every later pass returns
 * it again and runs nothing. */
FLOW_EXPORT flow_err_t flow_exec_forward(flow_exec_t *exec, double *loss_out,
					 flow_diag_t *diag) FLOW_MUST_CHECK;
/* Run ops [nforward, nops), clearing each activation gradient before its
 * first accumulation; parameter gradients accumulate.  Fails as
 * flow_exec_forward does. */
FLOW_EXPORT flow_err_t flow_exec_backward(flow_exec_t *exec,
					  flow_diag_t *diag) FLOW_MUST_CHECK;
/* Set every parameter gradient to zero. */
FLOW_EXPORT void flow_exec_zero_param_grads(flow_exec_t *exec);

/* ---- distributed graphs ------------------------------------------------ */

struct flow_boxing_plan;
struct flow_boxing_comms;

/* For a localized graph (flow/localize.h): its boxing ops' plans (op
 * attrs.boxing indexes plans[0..n)), and the communicators of the mesh
 * they and the split cross-entropy (attrs.split_axes) run on.  Made on
 * this executor's storage and kernel set (flow_boxing_comms_new), they
 * run those ops in place on its memory; made on host memory for a
 * device executor (--comm cpu on a GPU), on host copies of the ops'
 * tensors, with the CPU set.  Borrowed for the executor's life. */
FLOW_EXPORT void flow_exec_set_dist(flow_exec_t *exec,
				    const struct flow_boxing_plan *plans,
				    size_t n,
				    struct flow_boxing_comms *comms);

/* ---- hooks ---------------------------------------------------------------- */

/* Called after every op a pass runs, with the op's index, on the
 * executor's thread; host kernels have finished by then.  For
 * flow/grad_sync.h.  NULL: none. */
typedef void flow_exec_op_hook_fn(void *ctx, int op);
FLOW_EXPORT void flow_exec_set_op_hook(flow_exec_t *exec,
				       flow_exec_op_hook_fn *fn, void *ctx);

/* ---- profile ------------------------------------------------------------ */

/* Time every op (wall clock around each kernel) from now on. */
FLOW_EXPORT void flow_exec_profile_enable(flow_exec_t *exec, bool enable);
/* Add `seconds` under a named non-graph phase ("optimizer", "data",
 * "clip", "checkpoint") so the profile shows where all of a step goes. */
FLOW_EXPORT void flow_exec_profile_add(flow_exec_t *exec, const char *phase,
				       double seconds, double flops);

typedef struct flow_profile_row {
	char name[32];    /* op kind name ("matmul_backward") or phase */
	uint64_t calls;
	double seconds;   /* total */
	double flops;     /* total */
} flow_profile_row_t;

/* Rows with calls > 0, largest time first: at most cap written; returns
 * the number of rows available. */
FLOW_EXPORT size_t flow_exec_profile_rows(const flow_exec_t *exec,
					  flow_profile_row_t *rows, size_t cap);

/* FLOPs of one forward + backward pass of the graph (sum of the op
 * definitions' flops). */
FLOW_EXPORT double flow_exec_step_flops(const flow_exec_t *exec);

#ifdef __cplusplus
}
#endif

#endif
