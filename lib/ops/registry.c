/* The op registry, the one table of ops keyed by kind: the graph ops and,
 * after them, the signature-only ops (one file per op under lib/ops/
 * defines its entries); and the helpers the shape and gradient rules of
 * those files share. */
#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops_internal.h"

static const flow_op_info_t *const op_infos[FLOW_OP_ALL_KIND_COUNT] = {
	[FLOW_OP_EMBEDDING] = &flow_op_embedding_info,
	[FLOW_OP_LAYERNORM] = &flow_op_layernorm_info,
	[FLOW_OP_MATMUL] = &flow_op_matmul_info,
	[FLOW_OP_ATTENTION] = &flow_op_attention_info,
	[FLOW_OP_GELU] = &flow_op_gelu_info,
	[FLOW_OP_ADD] = &flow_op_add_info,
	[FLOW_OP_CROSS_ENTROPY] = &flow_op_cross_entropy_info,
	[FLOW_OP_EMBEDDING_BACKWARD] = &flow_op_embedding_backward_info,
	[FLOW_OP_LAYERNORM_BACKWARD] = &flow_op_layernorm_backward_info,
	[FLOW_OP_MATMUL_BACKWARD] = &flow_op_matmul_backward_info,
	[FLOW_OP_ATTENTION_BACKWARD] = &flow_op_attention_backward_info,
	[FLOW_OP_GELU_BACKWARD] = &flow_op_gelu_backward_info,
	[FLOW_OP_ADD_BACKWARD] = &flow_op_add_backward_info,
	[FLOW_OP_BOXING] = &flow_op_boxing_info,
	[FLOW_OP_LAYERNORM_PARAM_GRAD] = &flow_op_layernorm_param_grad_info,
	[FLOW_OP_RESHAPE] = &flow_op_reshape_info,
	[FLOW_OP_TRANSPOSE] = &flow_op_transpose_info,
	[FLOW_OP_REDUCE_SUM] = &flow_op_reduce_sum_info,
	[FLOW_OP_REDUCE_MEAN] = &flow_op_reduce_mean_info,
	[FLOW_OP_BIAS_ADD] = &flow_op_bias_add_info,
	[FLOW_OP_BROADCAST_ADD] = &flow_op_broadcast_add_info,
};

const flow_op_info_t *flow_op_info(flow_op_kind_t kind)
{
	if ((int)kind < 0 || (int)kind >= FLOW_OP_KIND_COUNT)
		return NULL;
	return op_infos[kind];
}

const flow_op_info_t *flow_op_info_find(const char *name, int kind_end)
{
	for (int k = 0; name && k < kind_end; k++)
		if (strcmp(name, op_infos[k]->def.name) == 0)
			return op_infos[k];
	return NULL;
}

const flow_op_def_t *flow_op_def(flow_op_kind_t kind)
{
	const flow_op_info_t *info = flow_op_info(kind);

	return info ? &info->def : NULL;
}

bool flow_op_kind_is_backward(flow_op_kind_t kind)
{
	return kind >= FLOW_OP_EMBEDDING_BACKWARD &&
	       kind <= FLOW_OP_ADD_BACKWARD;
}

bool flow_op_kind_is_neutral(flow_op_kind_t kind)
{
	return kind == FLOW_OP_BOXING;
}

flow_err_t flow_op_kind_parse(const char *name, flow_op_kind_t *kind_out,
			      flow_diag_t *diag)
{
	const flow_op_info_t *info = flow_op_info_find(name,
						       FLOW_OP_KIND_COUNT);

	if (!info)
		return flow_diag_set(diag, FLOW_ERR_USAGE, "unknown op '%s'",
				     name);
	*kind_out = info->def.kind;
	return FLOW_OK;
}

/* ---- shapes ---------------------------------------------------------------- */

flow_shape_text_t flow_shape_text(const flow_shape_t *shape)
{
	flow_shape_text_t t;

	flow_shape_format(shape, t.s, sizeof(t.s));
	return t;
}

size_t flow_shape_rows(const flow_shape_t *shape)
{
	size_t n = 1;

	for (int i = 0; i + 1 < shape->ndim; i++)
		n *= (size_t)shape->dims[i];
	return n;
}

size_t flow_shape_last(const flow_shape_t *shape)
{
	return shape->ndim ? (size_t)shape->dims[shape->ndim - 1] : 1;
}

double flow_shape_elems(const flow_shape_t *shape)
{
	double n = 1.0;

	for (int i = 0; i < shape->ndim; i++)
		n *= (double)shape->dims[i];
	return n;
}

const flow_shape_t *flow_op_in_shape(const flow_graph_t *g,
				     const flow_graph_op_t *op, int i)
{
	return &g->tensors[op->in[i]].shape;
}

flow_err_t flow_op_check_inputs(const flow_graph_t *g,
				const flow_graph_op_t *op, flow_diag_t *diag)
{
	const flow_op_info_t *info = flow_op_info(op->kind);

	for (int i = 0; i < info->def.nin; i++) {
		const char *what = info->def.in_names[i];
		int t = op->in[i];

		if (t == -1 && (info->def.optional_in >> i & 1))
			continue;
		if (t == -1)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: input '%s' is missing",
					     op->name, what);
		if (t < 0 || (size_t)t >= g->ntensors)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: input '%s' is %d, not a "
					     "tensor of the graph",
					     op->name, what, t);
		flow_dtype_t want = (info->i32_in >> i & 1) ? FLOW_DTYPE_I32 :
				    (info->act_in >> i & 1) ? g->act_dtype :
							      FLOW_DTYPE_F32;
		if (g->tensors[t].dtype != want)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: %s '%s' is %s, expected %s",
					     op->name, what,
					     g->tensors[t].name,
					     flow_dtype_name(g->tensors[t].dtype),
					     flow_dtype_name(want));
	}
	return FLOW_OK;
}

flow_err_t flow_op_check_rank(const flow_graph_t *g, const flow_graph_op_t *op,
			      int i, int ndim, const char *form,
			      flow_diag_t *diag)
{
	const flow_shape_t *s = flow_op_in_shape(g, op, i);

	if (ndim < 0 ? s->ndim >= 1 : s->ndim == ndim)
		return FLOW_OK;
	return flow_diag_set(diag, FLOW_ERR_USAGE, "%s: %s %s must be %s",
			     op->name, flow_op_def(op->kind)->in_names[i],
			     flow_shape_text(s).s, form);
}

flow_err_t flow_op_mismatch(const flow_graph_t *g, const flow_graph_op_t *op,
			    int bad, int ref, flow_diag_t *diag,
			    const char *expect_fmt, ...)
{
	const flow_op_def_t *def = flow_op_def(op->kind);
	char expect[128];
	va_list ap;

	va_start(ap, expect_fmt);
	vsnprintf(expect, sizeof(expect), expect_fmt, ap);
	va_end(ap);
	return flow_diag_set(diag, FLOW_ERR_USAGE,
			     "%s: %s %s does not match %s %s: expected %s",
			     op->name, def->in_names[bad],
			     flow_shape_text(flow_op_in_shape(g, op, bad)).s,
			     def->in_names[ref],
			     flow_shape_text(flow_op_in_shape(g, op, ref)).s,
			     expect);
}

size_t flow_op_no_scratch(const flow_graph_t *g, const flow_graph_op_t *op)
{
	return 0;
}

/* ---- the generic gradient rule ---------------------------------------------- */

static int forward_ref(const flow_graph_op_t *f, int ref)
{
	return ref < FLOW_OP_MAX_IO ? f->in[ref] : f->out[ref - FLOW_OP_MAX_IO];
}

flow_err_t flow_op_backward_rule(flow_graph_t *g, int op, flow_diag_t *diag)
{
	/* A copy: creating gradients and appending the op move g's arrays. */
	const flow_graph_op_t f = g->ops[op];
	const flow_op_info_t *info = flow_op_info(f.kind);
	int in[FLOW_OP_MAX_IO], out[FLOW_OP_MAX_IO];
	int nin = 0, nout = 0;
	bool any = false;

	in[nin++] = g->tensors[f.out[0]].grad;
	if (in[0] < 0)
		return FLOW_OK; /* the output does not reach the root */
	for (int s = 0; s < info->nsaved; s++)
		in[nin++] = forward_ref(&f, info->saved[s]);
	for (int i = info->grad_in_first; i < f.nin; i++) {
		int grad = -1;
		flow_err_t err;
		if (f.in[i] >= 0 &&
		    (err = flow_graph_grad_for(g, f.in[i], &grad, diag)) != FLOW_OK)
			return err;
		/* The backward kernels take their gradients as non-aliasing
		 * buffers, so one op cannot read a tensor twice and have both
		 * gradients accumulate into it. */
		for (int j = 0; j < nout; j++)
			if (grad >= 0 && out[j] == grad)
				return flow_diag_set(diag, FLOW_ERR_NOTSUP,
						     "%s: reads '%s' twice, "
						     "which its backward op "
						     "cannot differentiate",
						     f.name,
						     g->tensors[f.in[i]].name);
		out[nout++] = grad;
		any = any || grad >= 0;
	}
	if (!any)
		return FLOW_OK;
	int b = flow_graph_append_backward_op(g, info->def.backward_kind, op,
					      in, nin, out, nout, diag);
	return b < 0 ? (flow_err_t)b : FLOW_OK;
}

flow_err_t flow_op_backward_infer(const flow_graph_t *g,
				  const flow_graph_op_t *op,
				  flow_shape_t shapes_out[FLOW_OP_MAX_IO],
				  flow_dtype_t dtypes_out[FLOW_OP_MAX_IO],
				  flow_diag_t *diag)
{
	const flow_op_def_t *def = flow_op_def(op->kind);

	if (op->forward < 0 || (size_t)op->forward >= g->nops ||
	    flow_op_kind_is_backward(g->ops[op->forward].kind) ||
	    flow_op_def(g->ops[op->forward].kind)->backward_kind != op->kind)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: op %d is not a forward op that %s "
				     "differentiates",
				     op->name, op->forward, def->name);
	const flow_graph_op_t *f = flow_op_forward_of(g, op);
	const flow_op_info_t *finfo = flow_op_info(f->kind);

	for (int i = 0; i < def->nin; i++)
		if (op->in[i] < 0 || (size_t)op->in[i] >= g->ntensors)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: input '%s' is %d, not a "
					     "tensor of the graph",
					     op->name, def->in_names[i],
					     op->in[i]);
	const flow_graph_tensor_t *dout = &g->tensors[op->in[0]];
	const flow_graph_tensor_t *y = &g->tensors[f->out[0]];
	if (!flow_shape_equal(&dout->shape, &y->shape) ||
	    dout->dtype != y->dtype)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: dout %s %s does not match the "
				     "output %s %s of %s",
				     op->name, flow_dtype_name(dout->dtype),
				     flow_shape_text(&dout->shape).s,
				     flow_dtype_name(y->dtype),
				     flow_shape_text(&y->shape).s, f->name);
	for (int i = 0; i < def->nout; i++) {
		int x = f->in[finfo->grad_in_first + i];
		flow_shape_t none = { 0 };

		shapes_out[i] = x >= 0 ? g->tensors[x].shape : none;
		dtypes_out[i] = x >= 0 ? g->tensors[x].dtype : FLOW_DTYPE_F32;
	}
	return FLOW_OK;
}
