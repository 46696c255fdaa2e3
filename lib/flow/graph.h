/* The graph IR of one training step: tensors and ops, its text form,
 * reverse-mode autograd and liveness-based memory planning.
 *
 * A graph is built by a model builder (flow/model.h) as a list of forward
 * ops in program order; flow_graph_backward() then appends the backward ops
 * derived from each op's gradient rule (flow/ops.h), in reverse order.  Op
 * indices are program order: the executor runs ops [0, nforward) for the
 * forward pass and [nforward, nops) for the backward pass.
 *
 * Gradient semantics: an op output marked "accumulates" in its op
 * definition (every gradient a backward op writes) is added to, never
 * overwritten, so a tensor consumed several times (the residual stream, the
 * tied token embedding) simply sums its gradients.  A gradient of an
 * activation is zero before the first op that accumulates into it (the
 * executor clears it there); a parameter gradient is cleared once per
 * optimizer step by the trainer, so micro-batches accumulate into it.
 *
 * Tensor and op indices are ints (< 2^31); names are unique. */
#ifndef FLOW_GRAPH_H
#define FLOW_GRAPH_H

#include <stdio.h>

#include <flow/error.h>
#include <flow/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
	FLOW_ROLE_PARAM = 0,      /* trained weight: persistent */
	FLOW_ROLE_INPUT = 1,      /* fed per micro-batch (tokens, targets) */
	FLOW_ROLE_ACTIVATION = 2, /* written by a forward op */
	FLOW_ROLE_GRAD = 3,       /* gradient of an activation */
	FLOW_ROLE_PARAM_GRAD = 4, /* gradient of a parameter: persistent */
	FLOW_ROLE_SAVED = 5,      /* forward by-product kept for backward
				   * (layernorm mean/rstd, attention probs) */
} flow_role_t;

#define FLOW_ROLE_COUNT 6

/* "param", "input", "activation", "grad", "param_grad", "saved". */
FLOW_EXPORT const char *flow_role_name(flow_role_t role);

/* How a parameter starts (the executor fills it, flow/exec.h). */
typedef enum {
	FLOW_INIT_NONE = 0,   /* not a parameter */
	FLOW_INIT_ZEROS = 1,
	FLOW_INIT_ONES = 2,
	FLOW_INIT_NORMAL = 3, /* N(0, std^2) from the Philox stream of the
			       * tensor's name: element i (row-major logical
			       * index) is flow_rng_normal(seed,
			       * flow_rng_stream_id(name), i) * std, so any
			       * shard can be initialised on its own */
} flow_init_kind_t;

typedef struct flow_init {
	flow_init_kind_t kind;
	float std;       /* FLOW_INIT_NORMAL */
	int64_t rows;    /* only the first `rows` rows (dimension 0) are drawn,
			  * the rest are zero (padded vocabulary rows); 0: all */
} flow_init_t;

#define FLOW_GRAPH_NAME_MAX 64

typedef struct flow_graph_tensor {
	char name[FLOW_GRAPH_NAME_MAX]; /* "h.0.attn.c_attn.weight" */
	flow_role_t role;
	flow_dtype_t dtype;             /* f32, i32 for token ids, or the
					 * graph's act_dtype */
	flow_shape_t shape;
	int producer;  /* op that first writes it; -1 for params and inputs */
	int grad;      /* its gradient tensor, -1 when none (yet) */
	int grad_of;   /* for GRAD/PARAM_GRAD: the tensor it is the gradient
			* of; else -1 */
	int alias_of;  /* shares the storage of this tensor (an op writing in
			* place, e.g. cross-entropy's logits gradient); -1 */
	bool requires_grad; /* params and every activation that depends on one */
	bool decay;    /* params: AdamW weight decay applies (weights and
			* embeddings, not biases nor layernorm parameters) */
	flow_init_t init;
} flow_graph_tensor_t;

/* Inputs or outputs of one op, at most (layernorm_backward reads five:
 * dout, x, weight, mean, rstd). */
#define FLOW_OP_MAX_IO 5

typedef struct flow_op_attrs {
	uint32_t heads;    /* attention: number of heads */
	uint32_t vocab;    /* cross-entropy: real vocabulary V (the logits'
			    * last dimension Vp >= V is padded) */
	/* A rank's share of a distributed op (flow/localize.h); 0 in a
	 * one-rank graph: */
	int64_t row_start; /* embedding (and its backward): the first
			    * vocabulary row of the wte shard held; cross-
			    * entropy: the first logits column held */
	uint32_t split_axes; /* cross-entropy: the mesh axes (bit i: axis i)
			      * over which the logits' classes are split,
			      * each rank holding its columns; 0: whole */
	uint32_t boxing;   /* boxing: its plan in the executor's table */
} flow_op_attrs_t;

/* The op kinds: the graph ops (flow/ops.h defines each), then the
 * signature-only ops. */
typedef enum {
	FLOW_OP_EMBEDDING = 0,     /* (tokens i32[B,T], wte[Vp,C], wpe[Tmax,C])
				    * -> out[B,T,C] */
	FLOW_OP_LAYERNORM = 1,     /* (x[...,C], weight[C], bias[C])
				    * -> out[...,C], mean[N], rstd[N] */
	FLOW_OP_MATMUL = 2,        /* (x[...,I], weight[O,I], bias[O]?)
				    * -> out[...,O] */
	FLOW_OP_ATTENTION = 3,     /* (qkv[B,T,3C]) -> out[B,T,C],
				    * probs[B,NH,T,T]; causal */
	FLOW_OP_GELU = 4,          /* (x) -> out, tanh approximation */
	FLOW_OP_ADD = 5,           /* (a, b) -> out, same shapes */
	FLOW_OP_CROSS_ENTROPY = 6, /* (logits[...,Vp], targets i32[...])
				    * -> losses[N], dlogits (in place over
				    * logits; see flow/ops.h) */
	FLOW_OP_EMBEDDING_BACKWARD = 7,
	FLOW_OP_LAYERNORM_BACKWARD = 8,
	FLOW_OP_MATMUL_BACKWARD = 9,
	FLOW_OP_ATTENTION_BACKWARD = 10,
	FLOW_OP_GELU_BACKWARD = 11,
	FLOW_OP_ADD_BACKWARD = 12,
	FLOW_OP_BOXING = 13,       /* (x) -> out: the same logical tensor in
				    * another layout (flow/localize.h);
				    * in either pass, no gradient rule */
	/* Signature-only ops (flow/signature.h): plans can reason about
	 * models written with them, but no graph holds one.  They come after
	 * every graph kind, so [0, FLOW_OP_KIND_COUNT) stays the graph's. */
	FLOW_OP_LAYERNORM_PARAM_GRAD = 14,
	FLOW_OP_RESHAPE = 15,
	FLOW_OP_TRANSPOSE = 16,
	FLOW_OP_REDUCE_SUM = 17,
	FLOW_OP_REDUCE_MEAN = 18,
	FLOW_OP_BIAS_ADD = 19,
	FLOW_OP_BROADCAST_ADD = 20,
} flow_op_kind_t;

/* The kinds a graph may hold, [0, FLOW_OP_KIND_COUNT): the only ones
 * flow_op_def, flow_op_kind_parse, the validator and the executor know. */
#define FLOW_OP_KIND_COUNT 14
/* Every kind, the signature-only ones included. */
#define FLOW_OP_ALL_KIND_COUNT 21

typedef struct flow_graph_op {
	flow_op_kind_t kind;
	char name[FLOW_GRAPH_NAME_MAX]; /* scope, e.g. "h.0.attn.c_attn";
					 * backward ops get "<fwd>.backward" */
	int nin, nout;
	int in[FLOW_OP_MAX_IO];   /* tensor indices; -1: optional input absent */
	int out[FLOW_OP_MAX_IO];  /* tensor indices; -1: output not needed
				   * (e.g. the gradient of a tensor that
				   * needs none) */
	flow_op_attrs_t attrs;
	int forward;              /* backward ops: the forward op they
				   * differentiate; else -1 */
} flow_graph_op_t;

typedef struct flow_graph {
	flow_graph_tensor_t *tensors;
	size_t ntensors, tensors_cap;
	flow_graph_op_t *ops;
	size_t nops, ops_cap;
	size_t nforward; /* ops [0, nforward) are the forward pass; equals
			  * nops until flow_graph_backward() */
	int loss;        /* the per-token losses tensor, -1 until set */
	/* The dtype of the activations that GEMMs read and write, and of
	 * their gradients (flow/ops.h says which tensors those are): f32,
	 * or bf16 for mixed precision.  f32 after flow_graph_init. */
	flow_dtype_t act_dtype;
} flow_graph_t;

/* An empty graph.  Release with flow_graph_release(). */
FLOW_EXPORT void flow_graph_init(flow_graph_t *g);
/* Free the arrays; the graph is empty afterwards (init again to reuse). */
FLOW_EXPORT void flow_graph_release(flow_graph_t *g);

/* Store the graph's activations in dtype (f32 or bf16; see act_dtype),
 * before its first op is added.  FLOW_ERR_USAGE for another dtype, or a
 * graph that already has ops. */
FLOW_EXPORT flow_err_t flow_graph_set_act_dtype(flow_graph_t *g,
						flow_dtype_t dtype,
						flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Add a parameter or an input: returns its index (>= 0), or <0 with diag
 * set (FLOW_ERR_USAGE for a duplicate or over-long name, a bad shape or a
 * role other than PARAM/INPUT; FLOW_ERR_NOMEM).  Parameters get
 * requires_grad; init and decay are set by the caller afterwards through
 * g->tensors[index]. */
FLOW_EXPORT int flow_graph_add_tensor(flow_graph_t *g, const char *name,
				      flow_role_t role, flow_dtype_t dtype,
				      int ndim, const int64_t *dims,
				      flow_diag_t *diag) FLOW_MUST_CHECK;

/* Append a forward op of kind `kind` (not a *_BACKWARD kind) named `name`
 * reading inputs in[0..nin) (-1 for an absent optional input): checks the
 * inputs with the op's shape rule, creates its outputs named
 * "<name>.<output name>" (flow/ops.h lists the output names, e.g.
 * "h.0.ln_1.out", "h.0.ln_1.mean") with roles ACTIVATION or SAVED, and
 * returns the op's index; the outputs are g->ops[index].out[].  Returns <0
 * with diag set: FLOW_ERR_USAGE naming the op and the offending input
 * ("h.0.attn.c_attn: weight (768,768) does not match input (4,64,768) x
 * (2304,768)"), FLOW_ERR_NOMEM.  Must not be called after
 * flow_graph_backward(). */
FLOW_EXPORT int flow_graph_add_op(flow_graph_t *g, flow_op_kind_t kind,
				  const char *name, const int *in, int nin,
				  const flow_op_attrs_t *attrs,
				  flow_diag_t *diag) FLOW_MUST_CHECK;

/* Index of the tensor named `name`, or -1. */
FLOW_EXPORT int flow_graph_find(const flow_graph_t *g, const char *name);

/* Mark `losses` (a tensor written by a FLOW_OP_CROSS_ENTROPY op) as the
 * loss; the step's loss is its mean. */
FLOW_EXPORT flow_err_t flow_graph_set_loss(flow_graph_t *g, int losses,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

/* Reverse-mode autograd: walk the forward ops from the last to the first
 * and append, for each op with an input that requires a gradient, the ops
 * its gradient rule builds (flow_op_def_t.backward), creating gradient
 * tensors ("<tensor>.grad", role GRAD or PARAM_GRAD) on first need.  The
 * seed is the loss op's in-place logits gradient.  Afterwards every
 * parameter has its PARAM_GRAD (a parameter that does not reach the loss
 * gets one that stays zero).  FLOW_ERR_USAGE when no loss is set or the
 * graph was already differentiated. */
FLOW_EXPORT flow_err_t flow_graph_backward(flow_graph_t *g, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* The same with an arbitrary root: differentiate as if some scalar L
 * depended on tensor `root` (an activation) only through a gradient the
 * caller supplies: creates "<root>.grad" with role INPUT, which the caller
 * fills before each backward pass (tests use L = sum(w * root), whose
 * gradient is w).  Returns that tensor's index, or <0 with diag set. */
FLOW_EXPORT int flow_graph_backward_from(flow_graph_t *g, int root,
					 flow_diag_t *diag) FLOW_MUST_CHECK;

/* For gradient rules (flow_op_def_t.backward): in *grad_out, the
 * gradient tensor of tensor t, created when it does not exist yet (same
 * dtype and shape, named "<name>.grad", role PARAM_GRAD for params, else
 * GRAD), or -1 when t requires no gradient (or is not a tensor of g).
 * FLOW_OK, or FLOW_ERR_NOMEM / FLOW_ERR_USAGE with diag set and
 * *grad_out untouched. */
FLOW_EXPORT flow_err_t flow_graph_grad_for(flow_graph_t *g, int t,
					   int *grad_out, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* For gradient rules: append a backward op of kind differentiating op
 * `forward` (no shape rule beyond the counts; the outputs exist already)
 * and return its index, or a negative flow_err_t with diag set. */
FLOW_EXPORT int flow_graph_append_backward_op(flow_graph_t *g,
					      flow_op_kind_t kind, int forward,
					      const int *in, int nin,
					      const int *out, int nout,
					      flow_diag_t *diag) FLOW_MUST_CHECK;

/* Check every invariant: indices in range, every op input written before
 * the op (or a param/input), shapes agree with the op's shape rule, unique
 * names.  FLOW_ERR_FORMAT with the first violation. */
FLOW_EXPORT flow_err_t flow_graph_validate(const flow_graph_t *g,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

/* Element count of tensor t (shapes are validated when added, so this
 * cannot overflow) and its bytes. */
FLOW_EXPORT size_t flow_graph_tensor_numel(const flow_graph_t *g, int t);
FLOW_EXPORT size_t flow_graph_tensor_bytes(const flow_graph_t *g, int t);

/* Summary counts. */
typedef struct flow_graph_stats {
	size_t params, param_elems;  /* parameter tensors and elements */
	size_t inputs;
	size_t forward_ops, backward_ops;
	size_t activation_tensors;   /* ACTIVATION + SAVED + GRAD */
} flow_graph_stats_t;
FLOW_EXPORT void flow_graph_get_stats(const flow_graph_t *g,
				      flow_graph_stats_t *stats_out);

/* The text form (flow-train(1), GRAPH), one line per tensor then one per
 * op, e.g.
 *   # flow graph 1: 16 params (7.4M elements), 2 inputs, 46 forward ops,
 *   #   45 backward ops
 *   param      wte                     f32 (320,128)   init=normal(0.02,rows=256) decay
 *   input      tokens                  i32 (8,64)
 *   op  3  matmul       h.0.attn.c_attn  (h.0.ln_1.out, h.0.attn.c_attn.weight, h.0.attn.c_attn.bias) -> (h.0.attn.c_attn.out)
 * Activations appear as op outputs, with shapes:
 *   ...  -> (h.0.attn.c_attn.out f32 (8,64,384))
 * When plan is non-NULL each activation also shows its arena offset and
 * the header line reports the planned and peak bytes.  Returns FLOW_OK or
 * FLOW_ERR_IO when writing fails. */
struct flow_memplan;
FLOW_EXPORT flow_err_t flow_graph_print(const flow_graph_t *g,
					const struct flow_memplan *plan,
					FILE *out, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* ---- memory planning --------------------------------------------------- */

/* Where every transient tensor (roles ACTIVATION, SAVED, GRAD) lives in one
 * arena: tensors whose live ranges (first writing op .. last reading op,
 * in program order; an alias extends its target's range) do not overlap may
 * share bytes.  Offsets are multiples of 64.  Params, param grads and
 * inputs are persistent and not planned here. */
typedef struct flow_memplan {
	size_t ntensors;
	size_t *offset;        /* per tensor: byte offset in the arena, or
				* SIZE_MAX when not planned */
	size_t arena_bytes;    /* size of the arena: the peak activation
				* bytes of a step */
	size_t unshared_bytes; /* what the same tensors take without sharing */
	size_t persistent_bytes; /* params + param grads + inputs */
	size_t scratch_bytes;  /* largest per-op scratch (attention backward) */
} flow_memplan_t;

/* Plan with greedy best fit (largest tensors first, each at the lowest
 * offset free over its whole live range).  Deterministic.  Free with
 * flow_memplan_release(). */
FLOW_EXPORT flow_err_t flow_memplan_build(const flow_graph_t *g,
					  flow_memplan_t *plan_out,
					  flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_memplan_release(flow_memplan_t *plan);

/* Live range of tensor t in program order: first op writing it, last op
 * reading (or writing) it, both -1 for a tensor no op touches.  Params and
 * inputs report [0, nops - 1].  Exposed for tests and the planner. */
FLOW_EXPORT void flow_graph_live_range(const flow_graph_t *g, int t,
				       int *first_out, int *last_out);

#ifdef __cplusplus
}
#endif

#endif
