/* The standard layouts (flow_plan_standard, flow-plan(5) STANDARD
 * LAYOUTS): rules that give each tensor of the training graph its nd-SBP
 * (data parallel on the mesh axis named "dp", Megatron tensor parallel on
 * "tp", ZeRO on dp), and a chooser that gives each op, in graph order, the
 * candidate signature that converts least from the layouts so far. */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/mem.h>
#include <flow/plan.h>
#include <flow/signature.h>

#include "plan_internal.h"

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);

	return n >= k && strcmp(s + n - k, suffix) == 0;
}

static flow_sbp_t sbp_split(int axis)
{
	return (flow_sbp_t){ FLOW_SBP_SPLIT, axis };
}

static const flow_sbp_t sbp_b = { FLOW_SBP_BROADCAST, 0 };
static const flow_sbp_t sbp_p = { FLOW_SBP_PARTIAL, 0 };

/* Which layout of a tensor a rule gives: the plan's tensor line; how ops
 * read it (parameters all-gathered under ZeRO 3); what its writer should
 * produce (parameter gradients before their sync: P on dp). */
typedef enum { LAYOUT_LINE, LAYOUT_USE, LAYOUT_WRITE } layout_t;

typedef struct rules {
	const flow_graph_t *g;
	const flow_mesh_t *mesh;
	int dp, tp;   /* mesh axes, -1 when absent */
	int zero;
} rules_t;

/* Megatron on tp, for a tensor that is not a gradient. */
static flow_sbp_t tp_forward(const flow_graph_t *g, int t)
{
	const flow_graph_tensor_t *x = &g->tensors[t];
	const char *n = x->name;
	int last = x->shape.ndim - 1;

	if (x->role == FLOW_ROLE_PARAM) {
		if (strcmp(n, "wte") == 0 || ends_with(n, "attn.c_attn.weight") ||
		    ends_with(n, "attn.c_attn.bias") ||
		    ends_with(n, "mlp.c_fc.weight") ||
		    ends_with(n, "mlp.c_fc.bias"))
			return sbp_split(0);
		if (ends_with(n, "c_proj.weight"))
			return sbp_split(1);
		return sbp_b;
	}
	if (x->role != FLOW_ROLE_ACTIVATION)
		return sbp_b;
	if (ends_with(n, "attn.c_attn.out") || ends_with(n, "mlp.c_fc.out") ||
	    ends_with(n, "mlp.gelu.out") || strcmp(n, "lm_head.out") == 0)
		return sbp_split(last);
	if (ends_with(n, "c_proj.out") || strcmp(n, "embed.out") == 0 ||
	    t == g->loss)
		return sbp_p;
	return sbp_b;
}

static flow_sbp_t tp_rule(const flow_graph_t *g, int t)
{
	const flow_graph_tensor_t *x = &g->tensors[t];
	flow_sbp_t s;

	if (x->role != FLOW_ROLE_GRAD && x->role != FLOW_ROLE_PARAM_GRAD)
		return tp_forward(g, t);
	if (x->grad_of < 0)
		return sbp_b;
	if (x->role == FLOW_ROLE_PARAM_GRAD)
		return tp_forward(g, x->grad_of);
	/* Activation gradients are the adjoints: a tensor held whole gets
	 * partial gradients (a column-parallel matmul's dx, all-reduced
	 * where read), a partial sum's gradient is read whole, a split
	 * stays split.  The attention output is read split by the
	 * row-parallel projection, so its gradient comes back split. */
	if (ends_with(g->tensors[x->grad_of].name, ".attn.out"))
		return sbp_split(x->shape.ndim - 1);
	s = tp_forward(g, x->grad_of);
	if (s.kind == FLOW_SBP_SPLIT)
		return s;
	return s.kind == FLOW_SBP_PARTIAL ? sbp_b : sbp_p;
}

static flow_sbp_t dp_rule(const rules_t *r, int t, layout_t which)
{
	switch (r->g->tensors[t].role) {
	case FLOW_ROLE_PARAM:
		return which == LAYOUT_LINE && r->zero >= 3 ? sbp_split(0)
							    : sbp_b;
	case FLOW_ROLE_PARAM_GRAD:
		if (which == LAYOUT_WRITE)
			return sbp_p;
		return r->zero >= 2 ? sbp_split(0) : sbp_b;
	default:
		return sbp_split(0);
	}
}

/* Drop splits (outer axes' last) until the layout fits the shape, so a
 * rule never gives an invalid layout: uneven splits stay, empty pieces
 * do not. */
static void make_valid(const flow_shape_t *shape, const flow_mesh_t *mesh,
		       flow_nd_sbp_t *s)
{
	for (int a = mesh->ndim - 1; a >= 0; a--) {
		if (flow_nd_sbp_check(shape, s, mesh, NULL) == FLOW_OK)
			return;
		if (s->sbp[a].kind == FLOW_SBP_SPLIT)
			s->sbp[a] = sbp_b;
	}
}

static void rule_layout(const rules_t *r, int t, layout_t which,
			flow_nd_sbp_t *out)
{
	flow_nd_sbp_fill(out, r->mesh->ndim, sbp_b);
	if (r->dp >= 0)
		out->sbp[r->dp] = dp_rule(r, t, which);
	if (r->tp >= 0)
		out->sbp[r->tp] = tp_rule(r->g, t);
	make_valid(&r->g->tensors[t].shape, r->mesh, out);
}

/* Optimizer state: the parameter's tensor-parallel layout, split on dp
 * from ZeRO 1. */
static void adamw_layout(const rules_t *r, int param, flow_nd_sbp_t *out)
{
	flow_nd_sbp_fill(out, r->mesh->ndim, sbp_b);
	if (r->dp >= 0 && r->zero >= 1)
		out->sbp[r->dp] = sbp_split(0);
	if (r->tp >= 0)
		out->sbp[r->tp] = tp_rule(r->g, param);
	make_valid(&r->g->tensors[param].shape, r->mesh, out);
}

/* What converting have into need costs, roughly: nothing when equal, a
 * unit for a local step (B to S or P), the elements otherwise. */
static uint64_t mismatch_cost(const flow_nd_sbp_t *have,
			      const flow_nd_sbp_t *need, uint64_t numel)
{
	uint64_t cost = 0;

	for (int a = 0; a < have->ndim; a++) {
		if (flow_sbp_equal(have->sbp[a], need->sbp[a]))
			continue;
		cost += have->sbp[a].kind == FLOW_SBP_BROADCAST ? 1 : 1 + numel;
	}
	return cost;
}

/* An output off its rule costs more than the inputs converted to avoid
 * it: the residual add of two partial sums all-reduces both rather than
 * pass a partial sum on, as Megatron does. */
#define OUT_WEIGHT 3

typedef struct chooser {
	rules_t r;
	flow_nd_sbp_t *cur;   /* per graph tensor: its layout so far */
	flow_nd_sbp_t *want;  /* per graph tensor: what its writer should
			       * produce */
	flow_nd_sig_t *cands;
	size_t cap;
} chooser_t;

static uint64_t candidate_cost(const chooser_t *c, const flow_graph_op_t *o,
			       const flow_sig_query_t *q,
			       const flow_nd_sig_t *s, int op)
{
	const flow_graph_t *g = c->r.g;
	uint64_t cost = 0;

	for (int i = 0; i < o->nin; i++) {
		int t = o->in[i];
		if (t >= 0)
			cost += mismatch_cost(&c->cur[t], &s->in[i],
					      flow_graph_tensor_numel(g, t));
	}
	for (int i = 0; i < q->nout && i < o->nout; i++) {
		int t = o->out[i];
		if (t < 0)
			continue;
		const flow_nd_sbp_t *need =
			g->tensors[t].producer == op ? &c->want[t]
						     : &c->cur[t];
		cost += OUT_WEIGHT * mismatch_cost(&s->out[i], need,
						   flow_graph_tensor_numel(g,
									   t));
	}
	return cost;
}

static flow_err_t choose_op(chooser_t *c, int op, flow_plan_op_t *po,
			    flow_diag_t *diag)
{
	const flow_graph_t *g = c->r.g;
	const flow_graph_op_t *o = &g->ops[op];
	flow_sig_query_t q;
	uint64_t best_cost = UINT64_MAX;
	int n, best = 0;

	flow_sig_query_of_op(g, op, 0, &q);
	n = flow_sig_candidates(&q, c->r.mesh, c->cands, c->cap, NULL, diag);
	if (n < 0)
		return (flow_err_t)n;
	if (n == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "op '%s': no valid signature", o->name);
	for (int k = 0; k < n; k++) {
		uint64_t cost = candidate_cost(c, o, &q, &c->cands[k], op);
		if (cost < best_cost) {
			best_cost = cost;
			best = k;
		}
	}
	const flow_nd_sig_t *s = &c->cands[best];

	snprintf(po->name, sizeof(po->name), "%s", o->name);
	po->nin = o->nin;
	po->nout = o->nout;
	for (int i = 0; i < o->nin; i++) {
		po->in_present[i] = o->in[i] >= 0;
		po->in[i] = s->in[i];
	}
	for (int i = 0; i < o->nout; i++) {
		int t = o->out[i];

		po->out_present[i] = t >= 0 && i < q.nout;
		po->out[i] = s->out[i];
		if (t >= 0 && g->tensors[t].producer == op &&
		    g->tensors[t].role != FLOW_ROLE_PARAM_GRAD)
			c->cur[t] = s->out[i];
	}
	return FLOW_OK;
}

static flow_err_t standard_mesh(const char *mesh_text, const char *axes,
				flow_mesh_t *mesh, int *dp, int *tp,
				flow_diag_t *diag)
{
	char text[FLOW_MESH_TEXT_MAX * 2];
	flow_err_t err;

	if (axes && strchr(mesh_text, ':'))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "mesh '%s' names its axes and axes '%s' "
				     "are given too", mesh_text, axes);
	if (axes)
		snprintf(text, sizeof(text), "%s:%s", mesh_text, axes);
	else
		snprintf(text, sizeof(text), "%s", mesh_text);
	if ((err = flow_mesh_parse(text, mesh, diag)))
		return err;
	for (int a = 0; a < mesh->ndim; a++)
		if (!mesh->names[a][0])
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "mesh '%s' must name its axes "
					     "(dp, tp)", text);
		else if (strcmp(mesh->names[a], "dp") != 0 &&
		    strcmp(mesh->names[a], "tp") != 0)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "unknown mesh axis '%s' (the "
					     "standard layouts know dp and "
					     "tp)", mesh->names[a]);
	*dp = flow_mesh_axis(mesh, "dp");
	*tp = flow_mesh_axis(mesh, "tp");
	return FLOW_OK;
}

static flow_err_t standard_tensors(flow_plan_t *p, plan_caps_t *caps,
				   const chooser_t *c, flow_diag_t *diag)
{
	const flow_graph_t *g = c->r.g;

	for (size_t t = 0; t < g->ntensors; t++) {
		flow_plan_tensor_t *pt = plan_push_tensor(p, caps);
		flow_role_t role = g->tensors[t].role;

		if (!pt)
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "out of memory for a plan");
		snprintf(pt->name, sizeof(pt->name), "%s",
			 g->tensors[t].name);
		pt->role = (int)role;
		if (role == FLOW_ROLE_PARAM || role == FLOW_ROLE_PARAM_GRAD ||
		    role == FLOW_ROLE_INPUT)
			rule_layout(&c->r, (int)t, LAYOUT_LINE, &pt->sbp);
		else
			pt->sbp = c->cur[t];
	}
	for (int m = 0; m < 2; m++)
		for (size_t t = 0; t < g->ntensors; t++) {
			if (g->tensors[t].role != FLOW_ROLE_PARAM)
				continue;
			flow_plan_tensor_t *pt = plan_push_tensor(p, caps);
			if (!pt)
				return flow_diag_set(diag, FLOW_ERR_NOMEM,
						     "out of memory for a plan");
			snprintf(pt->name, sizeof(pt->name), "%s%s",
				 plan_adamw_prefix[m], g->tensors[t].name);
			pt->role = plan_adamw_role(m);
			adamw_layout(&c->r, (int)t, &pt->sbp);
		}
	return FLOW_OK;
}

static flow_err_t standard_fill(flow_plan_t *p, const flow_graph_t *g,
				chooser_t *c, flow_diag_t *diag)
{
	plan_caps_t caps = { 0, 0, 0 };
	flow_err_t err;
	char name[FLOW_GRAPH_NAME_MAX];

	for (size_t t = 0; t < g->ntensors; t++) {
		flow_role_t role = g->tensors[t].role;

		rule_layout(&c->r, (int)t, LAYOUT_WRITE, &c->want[t]);
		if (role == FLOW_ROLE_PARAM)
			rule_layout(&c->r, (int)t, LAYOUT_USE, &c->cur[t]);
		else
			c->cur[t] = c->want[t];
	}
	for (size_t i = 0; i < plan_scope_count(&p->cfg); i++) {
		flow_plan_stage_t *s = plan_push_stage(p, &caps);
		if (!s)
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "out of memory for a plan");
		plan_scope_name(&p->cfg, i, name, sizeof(name));
		snprintf(s->name, sizeof(s->name), "%s", name);
	}
	for (size_t op = 0; op < g->nops; op++) {
		flow_plan_op_t *po = plan_push_op(p, &caps);
		if (!po)
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "out of memory for a plan");
		if ((err = choose_op(c, (int)op, po, diag)))
			return err;
	}
	return standard_tensors(p, &caps, c, diag);
}

static flow_err_t standard_args(flow_plan_t *p, const char *model, int dp,
				uint32_t T, int zero, flow_diag_t *diag)
{
	flow_err_t err;
	int64_t dp_size = dp >= 0 ? p->mesh.dims[dp] : 1;

	if ((err = flow_gpt_parse(model, &p->cfg, diag)))
		return err;
	if (strlen(model) >= sizeof(p->model))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "model spec '%s' is too long", model);
	snprintf(p->model, sizeof(p->model), "%s", model);
	p->seq_len = T ? T : p->cfg.seq;
	if (p->seq_len > p->cfg.seq)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "seq-len %" PRIu32 " is more than the "
				     "model's %" PRIu32, p->seq_len,
				     p->cfg.seq);
	if (p->batch == 0 || p->batch % dp_size != 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "batch %" PRIu32 " is not divisible by "
				     "the %" PRId64 " ranks of axis 'dp'",
				     p->batch, dp_size);
	if (zero < 0 || zero > 3)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "zero stage %d is not 0, 1, 2 or 3", zero);
	if (zero > 0 && dp < 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "zero %d needs a mesh axis named 'dp'",
				     zero);
	return FLOW_OK;
}

flow_err_t flow_plan_standard(const char *model, const char *mesh,
			      const char *axes, uint32_t B, uint32_t T,
			      uint32_t K, int zero, flow_plan_t **plan_out,
			      flow_diag_t *diag)
{
	chooser_t c;
	flow_graph_t g;
	flow_plan_t *p;
	flow_err_t err;
	size_t n;

	if (!(p = malloc(sizeof(*p))))
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory for a plan");
	flow_plan_init(p);
	snprintf(p->path, sizeof(p->path), "(standard plan)");
	p->batch = B;
	p->grad_accum = K ? K : 1;
	p->zero = zero;
	memset(&c, 0, sizeof(c));
	if ((err = standard_mesh(mesh, axes, &p->mesh, &c.r.dp, &c.r.tp,
				 diag)) ||
	    (err = standard_args(p, model, c.r.dp, T, zero, diag)) ||
	    (err = plan_graph_build(&p->cfg, B, p->seq_len, p->precision, &g,
				    diag)))
		goto out_free_plan;
	c.r.g = &g;
	c.r.mesh = &p->mesh;
	c.r.zero = zero;
	c.cap = FLOW_SIG_MAX * FLOW_SIG_MAX;
	c.cur = calloc(g.ntensors, sizeof(*c.cur));
	c.want = calloc(g.ntensors, sizeof(*c.want));
	c.cands = flow_mul_size(c.cap, sizeof(*c.cands), &n) ? malloc(n)
							     : NULL;
	if (!c.cur || !c.want || !c.cands) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM,
				    "out of memory for a plan");
		goto out_free_arrays;
	}
	if ((err = standard_fill(p, &g, &c, diag)))
		goto out_free_arrays;
	plan_assign_lines(p);
	*plan_out = p;
	p = NULL;
out_free_arrays:
	free(c.cands);
	free(c.want);
	free(c.cur);
	flow_graph_release(&g);
out_free_plan:
	flow_plan_free(p);
	return err;
}
