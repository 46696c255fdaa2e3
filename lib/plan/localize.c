/* One rank's graph of a plan (flow/localize.h): local shapes, the plan's
 * signatures, and boxing wherever a layout changes. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/localize.h>
#include <flow/ops.h>

#include "graph/graph_internal.h"

typedef struct builder {
	const flow_plan_t *plan;
	const flow_graph_t *global;
	flow_local_t *l;
	size_t cap;           /* tensors l->sbp and l->box can hold */
	int *local_op;        /* global op -> local op */
	int dp;               /* the dp axis, or -1 */
	flow_diag_t *diag;
} builder_t;

static const flow_plan_tensor_t *plan_tensor(const flow_plan_t *p, size_t i,
					     const char *name)
{
	if (i < p->ntensors && strcmp(p->tensors[i].name, name) == 0)
		return &p->tensors[i];
	for (size_t k = 0; k < p->ntensors; k++)
		if (strcmp(p->tensors[k].name, name) == 0)
			return &p->tensors[k];
	return NULL;
}

/* Append a local tensor holding global tensor gt in layout sbp; returns
 * its index or <0. */
static int add_tensor(builder_t *b, const char *name, int gt,
		      flow_role_t role, const flow_nd_sbp_t *sbp)
{
	const flow_graph_tensor_t *src = &b->global->tensors[gt];
	flow_local_t *l = b->l;
	flow_shape_t shape = src->shape;
	flow_box_t box;

	if (l->graph.ntensors >= b->cap)
		return flow_diag_set(b->diag, FLOW_ERR_RANGE,
				     "%s: too many tensors", name);
	flow_nd_sbp_local_box(&src->shape, sbp, &b->plan->mesh, l->index,
			      &box);
	for (int d = 0; d < shape.ndim; d++)
		shape.dims[d] = box.extent[d];
	int t = flow_graph_push_tensor(&l->graph, name, role, src->dtype,
				       &shape, b->diag);
	if (t < 0)
		return t;
	l->sbp[t] = *sbp;
	l->box[t] = box;
	l->logical[t] = src->shape;
	return t;
}

/* Append a boxing op named name converting local tensor from (holding
 * global tensor gt) into layout to: into tensor `into`, or when it is <0
 * into a new tensor of that name and role.  Returns the tensor written. */
static int add_boxing(builder_t *b, const char *name, int gt, int from,
		      const flow_nd_sbp_t *to, int into, flow_role_t role)
{
	flow_local_t *l = b->l;
	const flow_graph_tensor_t *src = &b->global->tensors[gt];
	flow_graph_op_t o;

	int t = into >= 0 ? into : add_tensor(b, name, gt, role, to);
	if (t < 0)
		return t;
	flow_boxing_plan_t *bp = &l->boxings[l->nboxings];
	flow_err_t err = flow_boxing_plan(&src->shape, src->dtype,
					  &b->plan->mesh, &l->sbp[from],
					  &b->plan->mesh, to, NULL, bp, b->diag);
	if (err != FLOW_OK)
		return err;
	for (size_t s = 0; s < bp->nsteps; s++) /* flow_boxing_run's limit */
		if (bp->steps[s].kind == FLOW_BOXING_BROADCAST)
			return flow_diag_set(b->diag, FLOW_ERR_NOTSUP,
					     "%s: %s: its boxing needs a broadcast step, which this runtime does not run",
					     b->plan->path, name);
	memset(&o, 0, sizeof o);
	o.kind = FLOW_OP_BOXING;
	snprintf(o.name, sizeof o.name, "%s", name);
	o.nin = o.nout = 1;
	for (int i = 0; i < FLOW_OP_MAX_IO; i++)
		o.in[i] = o.out[i] = -1;
	o.in[0] = from;
	o.out[0] = t;
	o.forward = -1;
	o.attrs.boxing = (uint32_t)l->nboxings++;
	int op = flow_graph_append_op(&l->graph, &o, b->diag);
	return op < 0 ? op : t;
}

/* "<op>.<what>", or an error when it does not fit. */
static flow_err_t temp_name(builder_t *b, const char *op, const char *what,
			    char name[FLOW_GRAPH_NAME_MAX])
{
	int n = snprintf(name, FLOW_GRAPH_NAME_MAX, "%s.%s", op, what);
	if (n < 0 || n >= FLOW_GRAPH_NAME_MAX)
		return flow_diag_set(b->diag, FLOW_ERR_USAGE,
				     "%s.%s: name too long", op, what);
	return FLOW_OK;
}

static flow_err_t notsup(const builder_t *b, size_t line, const char *what,
			 const char *why)
{
	return flow_diag_set(b->diag, FLOW_ERR_NOTSUP, "%s:%zu: %s: %s",
			     b->plan->path, line, what, why);
}

/* The axes (bit mask) whose SBP in sbp splits dimension dim. */
static unsigned split_axes(const flow_nd_sbp_t *sbp, int dim)
{
	unsigned mask = 0;
	for (int a = 0; a < sbp->ndim; a++)
		if (sbp->sbp[a].kind == FLOW_SBP_SPLIT && sbp->sbp[a].axis == dim)
			mask |= 1u << a;
	return mask;
}

/* A parameter gradient is written partial on dp (each rank adds its own
 * batch) and synced to the plan's layout by the caller: the two may only
 * differ there. */
static bool grad_sync_ok(const builder_t *b, const flow_nd_sbp_t *written,
			 const flow_nd_sbp_t *synced)
{
	for (int a = 0; a < written->ndim; a++) {
		if (flow_sbp_equal(written->sbp[a], synced->sbp[a]) ||
		    b->plan->mesh.dims[a] == 1)
			continue;
		if (a != b->dp || written->sbp[a].kind != FLOW_SBP_PARTIAL)
			return false;
	}
	return true;
}

/* The shard attrs of embedding, embedding_backward and cross_entropy,
 * from the layout of the tensor they split (wte rows, logits columns). */
static flow_err_t set_shard_attrs(builder_t *b, const flow_plan_op_t *po,
				  const flow_graph_op_t *g, flow_graph_op_t *o)
{
	const flow_graph_t *gg = b->global;
	const flow_nd_sbp_t *sbp = NULL;
	int t = -1, dim = 0;

	switch (g->kind) {
	case FLOW_OP_EMBEDDING: /* wte's rows */
		t = g->in[1];
		sbp = &po->in[1];
		break;
	case FLOW_OP_EMBEDDING_BACKWARD: /* dwte's rows */
		t = g->out[0];
		sbp = &po->out[0];
		break;
	case FLOW_OP_CROSS_ENTROPY: /* the logits' classes */
		t = g->in[0];
		sbp = &po->in[0];
		dim = gg->tensors[t].shape.ndim - 1;
		break;
	case FLOW_OP_ATTENTION:
	case FLOW_OP_ATTENTION_BACKWARD:
		if (split_axes(&po->in[0], 2) || split_axes(&po->in[0], 1))
			return notsup(b, po->line, po->name,
				      "attention over split heads or positions is not supported by this runtime");
		return FLOW_OK;
	default:
		return FLOW_OK;
	}
	if (t < 0)
		return FLOW_OK;
	unsigned axes = split_axes(sbp, dim);
	if (!axes)
		return FLOW_OK;
	flow_box_t box;
	flow_nd_sbp_local_box(&gg->tensors[t].shape, sbp, &b->plan->mesh,
			      b->l->index, &box);
	o->attrs.split_axes = axes;
	o->attrs.row_start = box.start[dim];
	return FLOW_OK;
}

/* Rewrite global op i: its inputs boxed into the plan's signature, its
 * outputs boxed out of it. */
static flow_err_t add_op(builder_t *b, size_t i)
{
	const flow_graph_op_t *g = &b->global->ops[i];
	const flow_plan_op_t *po = &b->plan->ops[i];
	flow_local_t *l = b->l;
	flow_graph_op_t o = *g;
	int later[FLOW_OP_MAX_IO]; /* outputs to box after the op */
	flow_err_t err;

	if (strcmp(po->name, g->name) != 0)
		return notsup(b, po->line, po->name, "op is not the graph's");
	if (g->forward >= 0)
		o.forward = b->local_op[g->forward];
	if ((err = set_shard_attrs(b, po, g, &o)) != FLOW_OK)
		return err;
	flow_role_t temp_role = i < b->global->nforward ? FLOW_ROLE_ACTIVATION
							: FLOW_ROLE_GRAD;
	char name[FLOW_GRAPH_NAME_MAX], what[32];
	for (int k = 0; k < g->nin; k++) {
		int t = g->in[k];
		if (t < 0 || flow_nd_sbp_equal(&po->in[k], &l->sbp[t]))
			continue;
		snprintf(what, sizeof what, "in%d", k);
		if ((err = temp_name(b, g->name, what, name)) != FLOW_OK)
			return err;
		int boxed = add_boxing(b, name, t, t, &po->in[k], -1, temp_role);
		if (boxed < 0)
			return boxed;
		o.in[k] = boxed;
	}
	/* Cross-entropy writes the logits' gradient over its input, which
	 * the gradient tensor aliases: a boxed copy would hide it. */
	if (g->kind == FLOW_OP_CROSS_ENTROPY && o.in[0] != g->in[0])
		return notsup(b, po->line, po->name,
			      "cross-entropy reading its logits in another layout than they are written");
	const flow_op_def_t *def = flow_op_def(g->kind);
	for (int k = 0; k < g->nout; k++) {
		int t = g->out[k];
		later[k] = -1;
		if (t < 0 || flow_nd_sbp_equal(&po->out[k], &l->sbp[t]))
			continue;
		const flow_graph_tensor_t *gt = &b->global->tensors[t];
		if (gt->role == FLOW_ROLE_PARAM_GRAD)
			return notsup(b, po->line, po->name,
				      "a parameter gradient written in another layout than its other writers");
		if (def->accumulates >> k & 1 || gt->alias_of >= 0)
			return notsup(b, po->line, po->name,
				      "a gradient added to in another layout than its own");
		snprintf(what, sizeof what, "out%d", k);
		if ((err = temp_name(b, g->name, what, name)) != FLOW_OK)
			return err;
		int temp = add_tensor(b, name, t, temp_role, &po->out[k]);
		if (temp < 0)
			return temp;
		o.out[k] = later[k] = temp;
	}
	int op_index = flow_graph_append_op(&l->graph, &o, b->diag);
	if (op_index < 0)
		return op_index;
	b->local_op[i] = op_index;
	for (int k = 0; k < g->nout; k++) {
		if (later[k] < 0)
			continue;
		snprintf(what, sizeof what, "out%d.box", k);
		if ((err = temp_name(b, g->name, what, name)) != FLOW_OK)
			return err;
		int boxed = add_boxing(b, name, g->out[k], later[k],
				       &l->sbp[g->out[k]], g->out[k], temp_role);
		if (boxed < 0)
			return boxed;
	}
	return FLOW_OK;
}

/* Every global tensor, in its own layout; a parameter gradient in the
 * layout its writers use. */
static flow_err_t add_tensors(builder_t *b)
{
	const flow_graph_t *g = b->global;
	flow_local_t *l = b->l;

	for (size_t t = 0; t < g->ntensors; t++) {
		const flow_graph_tensor_t *gt = &g->tensors[t];
		const flow_plan_tensor_t *pt = plan_tensor(b->plan, t, gt->name);
		if (!pt)
			return flow_diag_set(b->diag, FLOW_ERR_FORMAT,
					     "%s: no layout for tensor '%s'",
					     b->plan->path, gt->name);
		flow_nd_sbp_t sbp = pt->sbp;
		if (gt->role == FLOW_ROLE_PARAM_GRAD) {
			const flow_plan_op_t *w = NULL;
			for (size_t i = g->nforward; i < g->nops && !w; i++)
				for (int k = 0; k < g->ops[i].nout; k++)
					if (g->ops[i].out[k] == (int)t) {
						w = &b->plan->ops[i];
						sbp = w->out[k];
						break;
					}
			if (w && !grad_sync_ok(b, &sbp, &pt->sbp))
				return notsup(b, pt->line, pt->name,
					      "its sync from the layout its backward op writes is not on dp");
		}
		int lt = add_tensor(b, gt->name, (int)t, gt->role, &sbp);
		if (lt < 0)
			return lt;
		flow_graph_tensor_t *x = &l->graph.tensors[lt];
		x->grad = gt->grad;
		x->grad_of = gt->grad_of;
		x->alias_of = gt->alias_of;
		x->requires_grad = gt->requires_grad;
		x->decay = gt->decay;
		x->init = gt->init;
	}
	return FLOW_OK;
}

flow_err_t flow_local_build(const flow_plan_t *plan, const flow_graph_t *global,
			    int64_t index, flow_local_t *l, flow_diag_t *diag)
{
	builder_t b = { .plan = plan, .global = global, .l = l,
			.dp = flow_mesh_axis(&plan->mesh, "dp"), .diag = diag };
	flow_err_t err;

	memset(l, 0, sizeof *l);
	flow_graph_init(&l->graph);
	l->graph.act_dtype = global->act_dtype; /* before any op: no check */
	l->index = index;
	if (plan->nops != global->nops)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: %zu ops for a graph of %zu", plan->path,
				     plan->nops, global->nops);
	/* At most one boxing per op input and output. */
	size_t io = 0;
	for (size_t i = 0; i < global->nops; i++)
		io += (size_t)(global->ops[i].nin + global->ops[i].nout);
	b.cap = global->ntensors + 2 * io;
	l->sbp = calloc(b.cap, sizeof *l->sbp);
	l->box = calloc(b.cap, sizeof *l->box);
	l->logical = calloc(b.cap, sizeof *l->logical);
	l->boxings = calloc(io ? io : 1, sizeof *l->boxings);
	b.local_op = calloc(global->nops ? global->nops : 1, sizeof *b.local_op);
	if (!l->sbp || !l->box || !l->logical || !l->boxings || !b.local_op) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto fail;
	}
	if ((err = add_tensors(&b)) != FLOW_OK)
		goto fail;
	for (size_t i = 0; i < global->nops; i++) {
		if ((err = add_op(&b, i)) != FLOW_OK)
			goto fail;
		if (i + 1 == global->nforward)
			l->graph.nforward = l->graph.nops;
	}
	if (global->nforward == global->nops)
		l->graph.nforward = l->graph.nops;
	l->graph.loss = global->loss;
	if (global->loss >= 0)
		for (int a = 0; a < l->sbp[global->loss].ndim; a++)
			if (l->sbp[global->loss].sbp[a].kind == FLOW_SBP_PARTIAL)
				l->loss_partial_axes |= 1u << a;
	if ((err = flow_graph_validate(&l->graph, diag)) != FLOW_OK)
		goto fail;
	free(b.local_op);
	return FLOW_OK;
fail:
	free(b.local_op);
	flow_local_release(l);
	return err;
}

void flow_local_release(flow_local_t *l)
{
	flow_graph_release(&l->graph);
	free(l->sbp);
	free(l->box);
	free(l->logical);
	free(l->boxings);
	memset(l, 0, sizeof *l);
}

bool flow_local_owns(const flow_local_t *l, const flow_mesh_t *mesh, int t)
{
	int64_t coords[FLOW_MESH_MAX_AXES];
	flow_mesh_coords(mesh, l->index, coords);
	for (int a = 0; a < mesh->ndim; a++)
		if (mesh->dims[a] > 1 && coords[a] != 0 &&
		    l->sbp[t].sbp[a].kind == FLOW_SBP_BROADCAST)
			return false;
	return true;
}
