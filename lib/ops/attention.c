/* attention: causal multi-head self-attention over a fused qkv[B,T,3C]
 * (q, k, v concatenated, each split into attrs.heads heads), saving the
 * softmax probabilities [B,NH,T,T] for the backward op, which writes
 * dqkv and needs scratch. */
#include <config.h>

#include <flow/kernels.h>

#include "ops_internal.h"

enum { OUT, PROBS };

static flow_err_t attention_infer(const flow_graph_t *g,
				  const flow_graph_op_t *op,
				  flow_shape_t shapes_out[FLOW_OP_MAX_IO],
				  flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
				  flow_diag_t *diag)
{
	flow_err_t err;

	if ((err = flow_op_check_inputs(g, op, diag)) ||
	    (err = flow_op_check_rank(g, op, 0, 3, "(B,T,3C)", diag)))
		return err;
	const flow_shape_t *qkv = flow_op_in_shape(g, op, 0);
	int64_t B = qkv->dims[0], T = qkv->dims[1], C = qkv->dims[2] / 3;
	uint32_t NH = op->attrs.heads;

	if (qkv->dims[2] % 3 != 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: qkv %s must be (B,T,3C): %lld is "
				     "not a multiple of 3",
				     op->name, flow_shape_text(qkv).s,
				     (long long)qkv->dims[2]);
	if (NH == 0 || C % NH != 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: %u heads do not divide C %lld",
				     op->name, NH, (long long)C);
	shapes_out[OUT] = (flow_shape_t){ .ndim = 3, .dims = { B, T, C } };
	shapes_out[PROBS] =
		(flow_shape_t){ .ndim = 4, .dims = { B, NH, T, T } };
	dtypes_out[OUT] = dtypes_out[PROBS] = FLOW_DTYPE_F32;
	return FLOW_OK;
}

/* The two products q.k^T and probs.v, counted over the full T x T square
 * as the 12 L T C of the PaLM MFU convention does: 2 * 2 B T T C forward,
 * twice that backward.  The softmax is left out. */
static double attention_macs(const flow_graph_t *g, const flow_graph_op_t *fwd)
{
	const flow_shape_t *qkv = flow_op_in_shape(g, fwd, 0);

	return 2.0 * flow_shape_elems(qkv) / 3.0 * (double)qkv->dims[1];
}

static double attention_flops(const flow_graph_t *g, const flow_graph_op_t *op)
{
	return 2.0 * attention_macs(g, op);
}

static double attention_backward_flops(const flow_graph_t *g,
				       const flow_graph_op_t *op)
{
	return 4.0 * attention_macs(g, flow_op_forward_of(g, op));
}

static size_t attention_backward_scratch(const flow_graph_t *g,
					 const flow_graph_op_t *op)
{
	const flow_graph_op_t *f = flow_op_forward_of(g, op);
	const flow_shape_t *qkv = flow_op_in_shape(g, f, 0);

	return flow_cpu_attention_scratch_bound((size_t)qkv->dims[0],
						(size_t)qkv->dims[1],
						(size_t)qkv->dims[2] / 3,
						f->attrs.heads);
}

const flow_op_info_t flow_op_attention_info = {
	.def = {
		.kind = FLOW_OP_ATTENTION,
		.name = "attention",
		.nin = 1,
		.nout = 2,
		.in_names = { "qkv" },
		.out_names = { "out", "probs" },
		.backward_kind = FLOW_OP_ATTENTION_BACKWARD,
		.infer = attention_infer,
		.backward = flow_op_backward_rule,
		.flops = attention_flops,
		.scratch = flow_op_no_scratch,
	},
	.saved_out = 1u << PROBS,
	.nsaved = 2,
	.saved = { FLOW_OP_FWD_IN(0), FLOW_OP_FWD_OUT(PROBS) },
};

const flow_op_info_t flow_op_attention_backward_info = {
	.def = {
		.kind = FLOW_OP_ATTENTION_BACKWARD,
		.name = "attention_backward",
		.nin = 3,
		.nout = 1,
		.in_names = { "dout", "qkv", "probs" },
		.out_names = { "dqkv" },
		.accumulates = 1,
		.backward_kind = FLOW_OP_ATTENTION_BACKWARD,
		.infer = flow_op_backward_infer,
		.flops = attention_backward_flops,
		.scratch = attention_backward_scratch,
	},
};
