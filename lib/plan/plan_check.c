/* The plan checker (flow_plan_check): holds a plan against the training
 * graph it describes (every op and tensor once, each layout valid for its
 * shape, each op's SBPs a signature of it), plans the boxing wherever an
 * op reads or writes a tensor in another layout than the tensor's line,
 * and sums what the plan moves and holds per rank.  Errors name the plan
 * line, or the line after the last for something missing. */
#include <config.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/mem.h>
#include <flow/plan.h>
#include <flow/signature.h>

#include "plan_internal.h"

/* The graph op named name, or -1. */
static int op_find(const flow_graph_t *g, const char *name)
{
	for (size_t i = 0; i < g->nops; i++)
		if (strcmp(g->ops[i].name, name) == 0)
			return (int)i;
	return -1;
}

typedef struct checker {
	const flow_plan_t *p;
	flow_graph_t g;
	const flow_cluster_t *cluster;
	flow_diag_t *diag;
	/* Per graph tensor: its plan line (index into p->tensors), -1;
	 * per parameter the same for adamw.m and adamw.v; per graph op. */
	int *tensor_of, *adamw_of[2], *op_of;
	flow_nd_sig_t *cands;
	size_t cap;
	flow_plan_summary_t sum;
} checker_t;

static flow_err_t at(const checker_t *c, size_t line, const char *fmt, ...)
	FLOW_PRINTF(3, 4);

static flow_err_t at(const checker_t *c, size_t line, const char *fmt, ...)
{
	char msg[FLOW_DIAG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return flow_diag_set(c->diag, FLOW_ERR_FORMAT, "%s:%zu: %s",
			     c->p->path, line, msg);
}

static flow_err_t check_header(checker_t *c, int64_t world)
{
	const flow_plan_t *p = c->p;
	flow_diag_t local = FLOW_DIAG_INIT;
	char mesh[FLOW_MESH_TEXT_MAX];
	int dp = flow_mesh_axis(&p->mesh, "dp");
	int64_t dp_size = dp >= 0 ? p->mesh.dims[dp] : 1;

	flow_mesh_format(&p->mesh, mesh, sizeof(mesh));
	if (world > 0 && flow_mesh_size(&p->mesh) != world)
		return at(c, p->line_mesh, "mesh '%s' has %" PRId64 " ranks, "
			  "not the world size %" PRId64, mesh,
			  flow_mesh_size(&p->mesh), world);
	if (p->batch % dp_size != 0)
		return at(c, p->line_batch, "batch %" PRIu32 " is not "
			  "divisible by the %" PRId64 " ranks of axis 'dp'",
			  p->batch, dp_size);
	if (p->zero > 0 && dp < 0)
		return at(c, p->line_zero, "zero %d needs a mesh axis named "
			  "'dp', mesh '%s' has none", p->zero, mesh);
	if (p->seq_len > p->cfg.seq)
		return at(c, p->line_seq_len, "seq-len %" PRIu32 " is more "
			  "than the model's %" PRIu32, p->seq_len, p->cfg.seq);
	if (plan_graph_build(&p->cfg, p->batch, p->seq_len, p->precision,
			     &c->g, &local))
		return at(c, p->line_model, "%s", local.msg);
	return FLOW_OK;
}

static flow_err_t check_stages(checker_t *c)
{
	const flow_plan_t *p = c->p;
	size_t n = plan_scope_count(&p->cfg);
	char name[FLOW_GRAPH_NAME_MAX];
	flow_err_t err = FLOW_OK;
	size_t *seen = calloc(n, sizeof(*seen));

	if (!seen)
		return flow_diag_set(c->diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", p->path);
	for (size_t i = 0; i < p->nstages && !err; i++) {
		const flow_plan_stage_t *s = &p->stages[i];
		size_t k;

		for (k = 0; k < n; k++) {
			plan_scope_name(&p->cfg, k, name, sizeof(name));
			if (strcmp(name, s->name) == 0)
				break;
		}
		if (k == n)
			err = at(c, s->line, "unknown stage '%s'", s->name);
		else if (seen[k])
			err = at(c, s->line, "duplicate stage '%s' (first on "
				 "line %zu)", s->name, seen[k]);
		else if (s->stage != 0)
			err = at(c, s->line, "stage '%s' is %d: every layer is "
				 "in stage 0 until pipeline parallelism",
				 s->name, s->stage);
		else
			seen[k] = s->line;
	}
	for (size_t k = 0; k < n && !err; k++)
		if (!seen[k]) {
			plan_scope_name(&p->cfg, k, name, sizeof(name));
			err = at(c, p->last_line + 1, "missing stage '%s'",
				 name);
		}
	free(seen);
	return err;
}

/* The graph tensor and the adamw slot (-1: none) a plan name refers to. */
static int tensor_lookup(const flow_graph_t *g, const char *name, int *m_out)
{
	*m_out = -1;
	for (int m = 0; m < 2; m++) {
		size_t k = strlen(plan_adamw_prefix[m]);
		if (strncmp(name, plan_adamw_prefix[m], k) == 0) {
			int t = flow_graph_find(g, name + k);
			if (t < 0 || g->tensors[t].role != FLOW_ROLE_PARAM)
				return -1;
			*m_out = m;
			return t;
		}
	}
	return flow_graph_find(g, name);
}

static flow_err_t check_tensor(checker_t *c, size_t i)
{
	const flow_plan_tensor_t *pt = &c->p->tensors[i];
	flow_diag_t local = FLOW_DIAG_INIT;
	int m, t = tensor_lookup(&c->g, pt->name, &m);
	int role, *slot;

	if (t < 0)
		return at(c, pt->line, "unknown tensor '%s'", pt->name);
	role = m < 0 ? (int)c->g.tensors[t].role : plan_adamw_role(m);
	slot = m < 0 ? &c->tensor_of[t] : &c->adamw_of[m][t];
	if (*slot >= 0)
		return at(c, pt->line, "duplicate tensor '%s' (first on line "
			  "%zu)", pt->name, c->p->tensors[*slot].line);
	if (pt->role != role)
		return at(c, pt->line, "tensor '%s' has role '%s', not '%s'",
			  pt->name, flow_plan_role_name(role),
			  flow_plan_role_name(pt->role));
	if (flow_nd_sbp_check(&c->g.tensors[t].shape, &pt->sbp, &c->p->mesh,
			      &local))
		return at(c, pt->line, "tensor '%s': %s", pt->name, local.msg);
	*slot = (int)i;
	return FLOW_OK;
}

static flow_err_t check_tensors(checker_t *c)
{
	const flow_graph_t *g = &c->g;
	flow_err_t err;

	for (size_t i = 0; i < c->p->ntensors; i++)
		if ((err = check_tensor(c, i)))
			return err;
	for (size_t t = 0; t < g->ntensors; t++) {
		if (c->tensor_of[t] < 0)
			return at(c, c->p->last_line + 1, "missing tensor '%s'",
				  g->tensors[t].name);
		if (g->tensors[t].role != FLOW_ROLE_PARAM)
			continue;
		for (int m = 0; m < 2; m++)
			if (c->adamw_of[m][t] < 0)
				return at(c, c->p->last_line + 1,
					  "missing tensor '%s%s'",
					  plan_adamw_prefix[m], g->tensors[t].name);
	}
	return FLOW_OK;
}

/* The plan op's signature, with '-' outputs the query still lists filled
 * from the first candidate that agrees with the rest. */
static flow_err_t op_signature(checker_t *c, const flow_plan_op_t *po,
			       const flow_sig_query_t *q, flow_nd_sig_t *sig)
{
	bool gap = false;
	int n;

	memset(sig, 0, sizeof(*sig));
	for (int i = 0; i < q->nin; i++)
		sig->in[i] = po->in[i];
	for (int i = 0; i < q->nout; i++) {
		sig->out[i] = po->out[i];
		if (!po->out_present[i]) {
			flow_nd_sbp_fill(&sig->out[i], c->p->mesh.ndim,
					 (flow_sbp_t){ FLOW_SBP_BROADCAST, 0 });
			gap = true;
		}
	}
	if (!gap)
		return FLOW_OK;
	n = flow_sig_candidates(q, &c->p->mesh, c->cands, c->cap, NULL, NULL);
	for (int k = 0; k < n; k++) {
		bool ok = true;
		for (int i = 0; i < q->nin && ok; i++)
			ok = !q->in_present[i] ||
			     flow_nd_sbp_equal(&sig->in[i], &c->cands[k].in[i]);
		for (int i = 0; i < q->nout && ok; i++)
			ok = !po->out_present[i] ||
			     flow_nd_sbp_equal(&sig->out[i],
					       &c->cands[k].out[i]);
		if (ok) {
			for (int i = 0; i < q->nout; i++)
				sig->out[i] = c->cands[k].out[i];
			break;
		}
	}
	return FLOW_OK;
}

static flow_err_t check_op_shape(checker_t *c, const flow_plan_op_t *po,
				 const flow_graph_op_t *o)
{
	if (po->nin != o->nin || po->nout != o->nout)
		return at(c, po->line, "op '%s' has %d inputs and %d outputs, "
			  "not %d and %d", po->name, o->nin, o->nout, po->nin,
			  po->nout);
	for (int i = 0; i < o->nin; i++)
		if (po->in_present[i] != (o->in[i] >= 0))
			return at(c, po->line, "op '%s': input %d must %sbe "
				  "'-'", po->name, i + 1,
				  o->in[i] >= 0 ? "not " : "");
	for (int i = 0; i < o->nout; i++)
		if (!po->out_present[i] && o->out[i] >= 0)
			return at(c, po->line, "op '%s': output %d writes "
				  "'%s' and must not be '-'", po->name, i + 1,
				  c->g.tensors[o->out[i]].name);
	return FLOW_OK;
}

static flow_err_t check_op(checker_t *c, size_t i)
{
	const flow_plan_op_t *po = &c->p->ops[i];
	flow_diag_t local = FLOW_DIAG_INIT;
	int op = op_find(&c->g, po->name);
	flow_sig_query_t q;
	flow_nd_sig_t sig;
	flow_err_t err;

	if (op < 0)
		return at(c, po->line, "unknown op '%s'", po->name);
	if (c->op_of[op] >= 0)
		return at(c, po->line, "duplicate op '%s' (first on line %zu)",
			  po->name, c->p->ops[c->op_of[op]].line);
	if ((err = check_op_shape(c, po, &c->g.ops[op])))
		return err;
	flow_sig_query_of_op(&c->g, op, 0, &q);
	for (int k = 0; k < q.nin; k++)
		if (po->in_present[k] && po->in[k].ndim != c->p->mesh.ndim)
			return at(c, po->line, "op '%s': input %d has %d SBPs "
				  "for a mesh of %d axes", po->name, k + 1,
				  po->in[k].ndim, c->p->mesh.ndim);
	for (int k = 0; k < q.nout; k++)
		if (po->out_present[k] && po->out[k].ndim != c->p->mesh.ndim)
			return at(c, po->line, "op '%s': output %d has %d SBPs "
				  "for a mesh of %d axes", po->name, k + 1,
				  po->out[k].ndim, c->p->mesh.ndim);
	if ((err = op_signature(c, po, &q, &sig)))
		return err;
	if (flow_sig_check(&q, &c->p->mesh, &sig, &local))
		return at(c, po->line, "op '%s': not a valid signature: %s",
			  po->name, local.msg);
	c->op_of[op] = (int)i;
	return FLOW_OK;
}

static flow_err_t check_ops(checker_t *c)
{
	flow_err_t err;

	for (size_t i = 0; i < c->p->nops; i++)
		if ((err = check_op(c, i)))
			return err;
	for (size_t op = 0; op < c->g.nops; op++)
		if (c->op_of[op] < 0)
			return at(c, c->p->last_line + 1, "missing op '%s'",
				  c->g.ops[op].name);
	return FLOW_OK;
}

/* Plan and count the conversion of tensor t from have to need, mult
 * times per step. */
static flow_err_t count_boxing(checker_t *c, const flow_plan_op_t *po,
			       int t, const flow_nd_sbp_t *have,
			       const flow_nd_sbp_t *need, uint64_t mult)
{
	const flow_graph_tensor_t *x = &c->g.tensors[t];
	flow_diag_t local = FLOW_DIAG_INIT;
	flow_boxing_plan_t bp;

	if (flow_nd_sbp_equal(have, need))
		return FLOW_OK;
	if (flow_boxing_plan(&x->shape, x->dtype, &c->p->mesh, have,
			     &c->p->mesh, need, c->cluster, &bp, &local))
		return at(c, po->line, "op '%s': no boxing for '%s': %s",
			  po->name, x->name, local.msg);
	c->sum.boxings += mult;
	for (size_t s = 0; s < bp.nsteps; s++) {
		c->sum.boxing_count[bp.steps[s].kind] += mult;
		c->sum.boxing_bytes[bp.steps[s].kind] +=
			bp.steps[s].total_bytes * mult;
		c->sum.boxing_total_bytes += bp.steps[s].total_bytes * mult;
	}
	return FLOW_OK;
}

static flow_err_t check_consistency(checker_t *c)
{
	const flow_plan_t *p = c->p;
	uint64_t K = p->grad_accum;
	flow_err_t err;

	for (size_t op = 0; op < c->g.nops; op++) {
		const flow_graph_op_t *o = &c->g.ops[op];
		const flow_plan_op_t *po = &p->ops[c->op_of[op]];

		for (int i = 0; i < o->nin; i++) {
			int t = o->in[i];
			if (t >= 0 &&
			    (err = count_boxing(c, po, t,
						&p->tensors[c->tensor_of[t]].sbp,
						&po->in[i], K)))
				return err;
		}
		for (int i = 0; i < o->nout; i++) {
			int t = o->out[i];
			if (t < 0)
				continue;
			bool sync = c->g.tensors[t].role ==
				    FLOW_ROLE_PARAM_GRAD;
			if ((err = count_boxing(
				     c, po, t, &po->out[i],
				     &p->tensors[c->tensor_of[t]].sbp,
				     sync ? 1 : K)))
				return err;
		}
	}
	return FLOW_OK;
}

static uint64_t local_bytes(const checker_t *c, int t, const flow_nd_sbp_t *s)
{
	const flow_graph_tensor_t *x = &c->g.tensors[t];

	return (uint64_t)flow_nd_sbp_max_local_numel(&x->shape, s,
						     &c->p->mesh) *
	       flow_dtype_size(x->dtype);
}

static void count_memory(checker_t *c)
{
	const flow_plan_t *p = c->p;
	flow_plan_summary_t *s = &c->sum;
	uint64_t grad_max = 0;

	for (size_t t = 0; t < c->g.ntensors; t++) {
		const flow_nd_sbp_t *sbp = &p->tensors[c->tensor_of[t]].sbp;
		uint64_t b = local_bytes(c, (int)t, sbp);

		switch (c->g.tensors[t].role) {
		case FLOW_ROLE_PARAM:
			s->param_bytes += b;
			for (int m = 0; m < 2; m++)
				s->optim_bytes += local_bytes(
					c, (int)t,
					&p->tensors[c->adamw_of[m][t]].sbp);
			break;
		case FLOW_ROLE_PARAM_GRAD:
			s->grad_bytes += b;
			break;
		case FLOW_ROLE_GRAD:
			if (b > grad_max)
				grad_max = b;
			break;
		default:
			s->activation_bytes += b;
			break;
		}
	}
	s->activation_bytes += grad_max;
	s->rank_bytes = s->param_bytes + s->grad_bytes + s->optim_bytes +
			s->activation_bytes;
}

static flow_err_t checker_alloc(checker_t *c)
{
	size_t nt = c->g.ntensors, n;

	c->tensor_of = malloc(nt * sizeof(int));
	c->adamw_of[0] = malloc(nt * sizeof(int));
	c->adamw_of[1] = malloc(nt * sizeof(int));
	c->op_of = malloc((c->g.nops ? c->g.nops : 1) * sizeof(int));
	c->cap = FLOW_SIG_MAX * FLOW_SIG_MAX;
	c->cands = flow_mul_size(c->cap, sizeof(*c->cands), &n) ? malloc(n)
							       : NULL;
	if (!c->tensor_of || !c->adamw_of[0] || !c->adamw_of[1] ||
	    !c->op_of || !c->cands)
		return flow_diag_set(c->diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", c->p->path);
	for (size_t i = 0; i < nt; i++)
		c->tensor_of[i] = c->adamw_of[0][i] = c->adamw_of[1][i] = -1;
	for (size_t i = 0; i < c->g.nops; i++)
		c->op_of[i] = -1;
	return FLOW_OK;
}

static double gib(uint64_t bytes)
{
	return (double)bytes / 1073741824.0;
}

flow_err_t flow_plan_check(const flow_plan_t *plan, int64_t world,
			   const flow_cluster_t *cluster,
			   flow_plan_summary_t *summary_out, flow_diag_t *diag)
{
	checker_t c;
	flow_err_t err;

	memset(&c, 0, sizeof(c));
	c.p = plan;
	c.cluster = cluster;
	c.diag = diag;
	if ((err = check_header(&c, world)))
		return err;
	if ((err = checker_alloc(&c)) || (err = check_stages(&c)) ||
	    (err = check_tensors(&c)) || (err = check_ops(&c)) ||
	    (err = check_consistency(&c)))
		goto out_release;
	count_memory(&c);
	if (cluster && cluster->memory_bytes &&
	    c.sum.rank_bytes > cluster->memory_bytes) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: a rank needs %.2f GiB (params %.2f, grads %.2f, optimizer %.2f, activations %.2f), more than the cluster's %.2f GiB",
				    plan->path, gib(c.sum.rank_bytes),
				    gib(c.sum.param_bytes), gib(c.sum.grad_bytes),
				    gib(c.sum.optim_bytes),
				    gib(c.sum.activation_bytes),
				    gib(cluster->memory_bytes));
		goto out_release;
	}
	c.sum.tensors = plan->ntensors;
	c.sum.ops = plan->nops;
	if (summary_out)
		*summary_out = c.sum;
out_release:
	free(c.cands);
	free(c.op_of);
	free(c.adamw_of[1]);
	free(c.adamw_of[0]);
	free(c.tensor_of);
	flow_graph_release(&c.g);
	return err;
}
