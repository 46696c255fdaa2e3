/* Op SBP signatures: for an op and the shapes of its inputs and outputs,
 * the valid SBP combinations on one mesh axis, and the n-D candidates on a
 * mesh (flow(7), OP SIGNATURES).
 *
 * A 1-D signature gives one SBP per input and per output.  Every op's list
 * ends with all-broadcast, which is always valid.  n-D candidates are the
 * products of the 1-D lists over the mesh axes, kept when every tensor's
 * nd-SBP is valid for its shape (flow_nd_sbp_check), in a deterministic
 * order (first axis slowest) without duplicates.
 *
 * The rules live with their op, in lib/ops/<op>.c; ops outside the
 * training graph's fused op set (reshape, transpose, reductions, bias add,
 * broadcasting add, layernorm's parameter gradients) have signature-only
 * definitions there too, so plans can reason about models written with
 * them.  Each op is found by its name in the one op registry, where the
 * signature-only ops have kinds of their own after the graph ops'
 * (flow/graph.h, flow_op_kind_t).
 *
 * The ops and their attributes (shapes in query.in / query.out):
 *   embedding        in (tokens, wte, wpe) out (out)
 *   layernorm        in (x, weight, bias) out (out, mean, rstd)
 *   layernorm_param_grad  in (dout, x, mean, rstd) out (dweight, dbias):
 *                    S(i) on a row axis gives P parameter gradients
 *   matmul           in (x, weight[O,I], bias?) out (out) -- nn.Linear
 *   attention        in (qkv) out (out, probs); heads = attrs.heads; a
 *                    head split needs the 5-D view qkv [B,T,3,NH,hs] and
 *                    out [B,T,NH,hs]
 *   gelu, add        elementwise (add: same shapes)
 *   broadcast_add    in (a, b) out (out): numpy broadcasting
 *   bias_add         in (x, bias) out (out): bias along attrs.axis
 *   cross_entropy    in (logits, targets) out (losses): with the class
 *                    axis split, the model-parallel form (losses P); its
 *                    max is realised by gathering the per-rank maxima
 *                    (gather_bytes > 0), as OneFlow's split softmax does
 *   reshape          in (x) out (y): S propagates through groups of axes
 *                    whose products match (the group's first axes, when
 *                    their extents are equal or both divisible by the mesh
 *                    axis), P -> P
 *   transpose        in (x) out (y) with attrs.perm
 *   reduce_sum, reduce_mean  in (x) out (y) over attrs.axes_mask, with
 *                    attrs.keepdims: S on a reduced axis gives P */
#ifndef FLOW_SIGNATURE_H
#define FLOW_SIGNATURE_H

#include <flow/graph.h>
#include <flow/sbp.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLOW_SIG_MAX_IO 5

typedef struct flow_sig_attrs {
	uint32_t heads;       /* attention */
	uint32_t vocab;       /* cross_entropy: real classes */
	int axis;             /* bias_add */
	unsigned axes_mask;   /* reduce_*: bit i reduces axis i */
	bool keepdims;        /* reduce_* */
	int perm[FLOW_MAX_DIMS]; /* transpose: out axis i is in axis perm[i] */
} flow_sig_attrs_t;

typedef struct flow_sig_query {
	const char *op;       /* "matmul", "reshape", ... (list above) */
	int nin, nout;
	flow_shape_t in[FLOW_SIG_MAX_IO];   /* ndim 0 with absent: see present */
	flow_shape_t out[FLOW_SIG_MAX_IO];
	bool in_present[FLOW_SIG_MAX_IO];   /* false: optional input absent */
	flow_sig_attrs_t attrs;
	int64_t axis_size;    /* the mesh axis' size, for rules that need
			       * divisibility (reshape); 0: unknown */
} flow_sig_query_t;

typedef struct flow_sig {
	flow_sbp_t in[FLOW_SIG_MAX_IO];
	flow_sbp_t out[FLOW_SIG_MAX_IO];
	uint64_t gather_bytes; /* extra communication the op does itself on
				* this axis (cross_entropy's maxima), per rank */
	const char *name;      /* "data", "column", "row", "vocab", ... */
} flow_sig_t;

typedef struct flow_nd_sig {
	flow_nd_sbp_t in[FLOW_SIG_MAX_IO];
	flow_nd_sbp_t out[FLOW_SIG_MAX_IO];
} flow_nd_sig_t;

#define FLOW_SIG_MAX 64

/* The 1-D signatures of the op (all-broadcast last): returns the count
 * (<= FLOW_SIG_MAX), written to sigs.  FLOW_ERR_USAGE (as a negative
 * return) for an unknown op or shapes that do not fit it. */
FLOW_EXPORT int flow_sig_list(const flow_sig_query_t *query,
			      flow_sig_t sigs[FLOW_SIG_MAX],
			      flow_diag_t *diag) FLOW_MUST_CHECK;

/* The n-D candidates on mesh, filtered by validity: returns the count
 * written (at most cap), or the negative error.  *total_out (may be NULL)
 * receives how many exist. */
FLOW_EXPORT int flow_sig_candidates(const flow_sig_query_t *query,
				    const flow_mesh_t *mesh,
				    flow_nd_sig_t *sigs, size_t cap,
				    size_t *total_out,
				    flow_diag_t *diag) FLOW_MUST_CHECK;

/* Does the nd signature hold on mesh: is it a product of 1-D signatures
 * and valid for the shapes?  FLOW_ERR_USAGE naming the mesh axis and
 * tensor otherwise. */
FLOW_EXPORT flow_err_t flow_sig_check(const flow_sig_query_t *query,
				      const flow_mesh_t *mesh,
				      const flow_nd_sig_t *sig,
				      flow_diag_t *diag) FLOW_MUST_CHECK;

/* Which 1-D signature the n-D signature sig uses on mesh axis `axis`:
 * the index in sigs[0..nsigs) (flow_sig_list's answer for query) of the
 * first whose SBPs equal sig's on that axis (absent optional inputs
 * aside), or -1 when none does. */
FLOW_EXPORT int flow_sig_axis_index(const flow_sig_query_t *query,
				    const flow_sig_t *sigs, int nsigs,
				    const flow_nd_sig_t *sig, int axis);

/* The query of graph op `op` (its kind's name, its tensors' shapes and
 * attributes). */
FLOW_EXPORT void flow_sig_query_of_op(const flow_graph_t *g, int op,
				      int64_t axis_size,
				      flow_sig_query_t *query_out);

#ifdef __cplusplus
}
#endif

#endif
