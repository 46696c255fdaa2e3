/* Reverse-mode autograd over the graph IR: walk the forward ops from the
 * last to the first and let each op's gradient rule (lib/ops/) append its
 * backward op, creating gradient tensors on first need. */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include <flow/graph.h>

#include "graph_internal.h"
#include "ops/ops_internal.h"

flow_err_t flow_graph_grad_for(flow_graph_t *g, int t, int *grad_out,
			       flow_diag_t *diag)
{
	char name[FLOW_GRAPH_NAME_MAX + 8];

	if (t < 0 || (size_t)t >= g->ntensors || !g->tensors[t].requires_grad) {
		*grad_out = -1;
		return FLOW_OK;
	}
	if (g->tensors[t].grad >= 0) {
		*grad_out = g->tensors[t].grad;
		return FLOW_OK;
	}

	/* Copies: pushing a tensor may move g->tensors. */
	const flow_shape_t shape = g->tensors[t].shape;
	const flow_dtype_t dtype = g->tensors[t].dtype;
	const flow_role_t role = g->tensors[t].role == FLOW_ROLE_PARAM ?
					 FLOW_ROLE_PARAM_GRAD :
					 FLOW_ROLE_GRAD;

	snprintf(name, sizeof(name), "%s.grad", g->tensors[t].name);
	int grad = flow_graph_push_tensor(g, name, role, dtype, &shape, diag);
	if (grad < 0)
		return (flow_err_t)grad;
	g->tensors[grad].grad_of = t;
	g->tensors[t].grad = grad;
	*grad_out = grad;
	return FLOW_OK;
}

int flow_graph_append_backward_op(flow_graph_t *g, flow_op_kind_t kind,
				  int forward, const int *in, int nin,
				  const int *out, int nout, flow_diag_t *diag)
{
	const flow_op_info_t *info = flow_op_info(kind);
	flow_graph_op_t op;
	flow_err_t err;

	if (!info || !flow_op_kind_is_backward(kind) || forward < 0 ||
	    (size_t)forward >= g->nforward ||
	    flow_op_def(g->ops[forward].kind)->backward_kind != kind)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "backward op of kind %d does not "
				     "differentiate op %d",
				     (int)kind, forward);
	const char *fwd = g->ops[forward].name;
	if (nin != info->def.nin || nout != info->def.nout)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s.backward: %s takes %d inputs and %d "
				     "outputs, got %d and %d",
				     fwd, info->def.name, info->def.nin,
				     info->def.nout, nin, nout);
	if (strlen(fwd) + sizeof(".backward") > FLOW_GRAPH_NAME_MAX)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s.backward: op name is longer than %d "
				     "characters",
				     fwd, FLOW_GRAPH_NAME_MAX - 1);
	for (int i = 0; i < nin; i++)
		if (in[i] < 0 || (size_t)in[i] >= g->ntensors)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s.backward: input %d is not a "
					     "tensor of the graph",
					     fwd, in[i]);
	for (int i = 0; i < nout; i++) {
		if (out[i] == -1)
			continue;
		if (out[i] < 0 || (size_t)out[i] >= g->ntensors)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s.backward: output %d is not a "
					     "tensor of the graph",
					     fwd, out[i]);
		flow_role_t role = g->tensors[out[i]].role;
		if (role != FLOW_ROLE_GRAD && role != FLOW_ROLE_PARAM_GRAD)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s.backward: output '%s' is a "
					     "%s, not a gradient",
					     fwd, g->tensors[out[i]].name,
					     flow_role_name(role));
	}
	if ((err = flow_graph_reserve(g, 0, 1, diag)) != FLOW_OK)
		return err == FLOW_ERR_NOMEM ? FLOW_ERR_RANGE : err;

	memset(&op, 0, sizeof(op));
	op.kind = kind;
	/* The name fits: checked above. */
	memcpy(op.name, fwd, strlen(fwd));
	memcpy(op.name + strlen(fwd), ".backward", sizeof(".backward"));
	op.nin = nin;
	op.nout = nout;
	for (int i = 0; i < FLOW_OP_MAX_IO; i++) {
		op.in[i] = i < nin ? in[i] : -1;
		op.out[i] = i < nout ? out[i] : -1;
	}
	op.attrs = g->ops[forward].attrs;
	op.forward = forward;
	for (int i = 0; i < nout; i++)
		if (out[i] >= 0 && g->tensors[out[i]].producer < 0)
			g->tensors[out[i]].producer = (int)g->nops;
	g->ops[g->nops] = op;
	return (int)g->nops++;
}

static bool op_reads_grad(const flow_graph_t *g, const flow_graph_op_t *op)
{
	for (int i = 0; i < op->nin; i++)
		if (op->in[i] >= 0 && g->tensors[op->in[i]].requires_grad)
			return true;
	return false;
}

/* The walk shared by both entry points; seed_loss: let the loss op's rule
 * seed its logits' gradient.  On failure the graph is restored. */
static flow_err_t differentiate(flow_graph_t *g, bool seed_loss,
				size_t ntensors_before, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;

	for (size_t i = g->nforward; i-- > 0;) {
		const flow_graph_op_t *op = &g->ops[i];
		if (op->kind == FLOW_OP_CROSS_ENTROPY && !seed_loss)
			continue;
		if (!op_reads_grad(g, op))
			continue;
		err = flow_op_def(op->kind)->backward(g, (int)i, diag);
		if (err != FLOW_OK)
			goto out_restore;
	}
	/* Every parameter gets its gradient, zero if it does not reach the
	 * root, so the optimizer can treat all of them alike. */
	for (size_t t = 0; t < g->ntensors; t++) {
		if (g->tensors[t].role != FLOW_ROLE_PARAM)
			continue;
		int grad;
		if ((err = flow_graph_grad_for(g, (int)t, &grad, diag)) !=
		    FLOW_OK)
			goto out_restore;
	}
	return FLOW_OK;

out_restore:
	g->ntensors = ntensors_before;
	g->nops = g->nforward;
	for (size_t t = 0; t < g->ntensors; t++)
		g->tensors[t].grad = -1;
	return err;
}

/* Room for every gradient and backward op the walk can create (one per
 * tensor, one per forward op), so it cannot run out half-way. */
static flow_err_t reserve_for_backward(flow_graph_t *g, size_t extra,
				       flow_diag_t *diag)
{
	return flow_graph_reserve(g, g->ntensors + extra, g->nforward, diag);
}

flow_err_t flow_graph_backward(flow_graph_t *g, flow_diag_t *diag)
{
	flow_err_t err;

	if (g->loss < 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot differentiate a graph without a "
				     "loss");
	if (flow_graph_is_differentiated(g))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "the graph is already differentiated");
	if ((err = reserve_for_backward(g, 0, diag)) != FLOW_OK)
		return err;
	return differentiate(g, true, g->ntensors, diag);
}

int flow_graph_backward_from(flow_graph_t *g, int root, flow_diag_t *diag)
{
	char name[FLOW_GRAPH_NAME_MAX + 8];
	size_t before = g->ntensors;
	flow_err_t err;

	if (root < 0 || (size_t)root >= g->ntensors ||
	    g->tensors[root].role != FLOW_ROLE_ACTIVATION)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot differentiate from tensor %d: "
				     "not an activation",
				     root);
	if (flow_graph_is_differentiated(g))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "the graph is already differentiated");
	if ((err = reserve_for_backward(g, 1, diag)) != FLOW_OK)
		return err;

	const flow_shape_t shape = g->tensors[root].shape;
	snprintf(name, sizeof(name), "%s.grad", g->tensors[root].name);
	int grad = flow_graph_push_tensor(g, name, FLOW_ROLE_INPUT,
					  g->tensors[root].dtype, &shape, diag);
	if (grad < 0)
		return grad;
	g->tensors[grad].grad_of = root;
	g->tensors[root].grad = grad;
	if ((err = differentiate(g, false, before, diag)) != FLOW_OK)
		return err;
	return grad;
}
