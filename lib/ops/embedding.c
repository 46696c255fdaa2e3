/* embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].  Its backward
 * scatters dout into dwte by token and sums it over the batch into dwpe;
 * the tokens get no gradient. */
#include <config.h>

#include "ops_internal.h"

enum { TOKENS, WTE, WPE };

static flow_err_t embedding_infer(const flow_graph_t *g,
				  const flow_graph_op_t *op,
				  flow_shape_t shapes_out[FLOW_OP_MAX_IO],
				  flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
				  flow_diag_t *diag)
{
	flow_err_t err;

	if ((err = flow_op_check_inputs(g, op, diag)) ||
	    (err = flow_op_check_rank(g, op, TOKENS, 2, "(B,T)", diag)) ||
	    (err = flow_op_check_rank(g, op, WTE, 2, "(Vp,C)", diag)) ||
	    (err = flow_op_check_rank(g, op, WPE, 2, "(Tmax,C)", diag)))
		return err;
	const flow_shape_t *tokens = flow_op_in_shape(g, op, TOKENS);
	const flow_shape_t *wte = flow_op_in_shape(g, op, WTE);
	const flow_shape_t *wpe = flow_op_in_shape(g, op, WPE);

	if (wpe->dims[1] != wte->dims[1])
		return flow_op_mismatch(g, op, WPE, WTE, diag, "(Tmax,%lld)",
					(long long)wte->dims[1]);
	if (tokens->dims[1] > wpe->dims[0])
		return flow_op_mismatch(g, op, TOKENS, WPE, diag,
					"T <= Tmax %lld",
					(long long)wpe->dims[0]);
	shapes_out[0] = *tokens;
	shapes_out[0].ndim = 3;
	shapes_out[0].dims[2] = wte->dims[1];
	dtypes_out[0] = FLOW_DTYPE_F32;
	return FLOW_OK;
}

/* One add per output element, forward; one per element and gradient,
 * backward. */
static double embedding_flops(const flow_graph_t *g, const flow_graph_op_t *op)
{
	return flow_shape_elems(&g->tensors[op->out[0]].shape);
}

static double embedding_backward_flops(const flow_graph_t *g,
				       const flow_graph_op_t *op)
{
	double n = flow_shape_elems(flow_op_in_shape(g, op, 0));

	return n * ((op->out[0] >= 0) + (op->out[1] >= 0));
}

const flow_op_info_t flow_op_embedding_info = {
	.def = {
		.kind = FLOW_OP_EMBEDDING,
		.name = "embedding",
		.nin = 3,
		.nout = 1,
		.in_names = { "tokens", "wte", "wpe" },
		.out_names = { "out" },
		.backward_kind = FLOW_OP_EMBEDDING_BACKWARD,
		.infer = embedding_infer,
		.backward = flow_op_backward_rule,
		.flops = embedding_flops,
		.scratch = flow_op_no_scratch,
	},
	.i32_in = 1u << TOKENS,
	.grad_in_first = WTE,
	.nsaved = 1,
	.saved = { FLOW_OP_FWD_IN(TOKENS) },
};

const flow_op_info_t flow_op_embedding_backward_info = {
	.def = {
		.kind = FLOW_OP_EMBEDDING_BACKWARD,
		.name = "embedding_backward",
		.nin = 2,
		.nout = 2,
		.in_names = { "dout", "tokens" },
		.out_names = { "dwte", "dwpe" },
		.accumulates = 3,
		.backward_kind = FLOW_OP_EMBEDDING_BACKWARD,
		.infer = flow_op_backward_infer,
		.flops = embedding_backward_flops,
		.scratch = flow_op_no_scratch,
	},
};
