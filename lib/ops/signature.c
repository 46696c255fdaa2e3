/* Op SBP signatures (flow/signature.h): the lookup of an op's rule by name
 * in the op registry (the rule lives with the op in lib/ops/<op>.c), the
 * 1-D lists (deduplicated, all-broadcast last), their n-D products on a
 * mesh, the check of one n-D signature, the query of a graph op, and the
 * helpers the rules share (the adjoint that derives a backward op's
 * signatures from its forward op's). */
#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <flow/mem.h>

#include "ops_internal.h"

/* The signatures of the op named name (flow_sig_query_t.op); NULL for an
 * unknown op and for boxing, which has none. */
static const flow_sig_op_t *sig_op_find(const char *name)
{
	const flow_op_info_t *info = flow_op_info_find(name,
						       FLOW_OP_ALL_KIND_COUNT);

	return info ? info->sig : NULL;
}

/* ---- helpers for the rules ---------------------------------------------- */

flow_sig_t *flow_sig_push(flow_sig_builder_t *b, const char *name)
{
	flow_sig_t *s;

	if (b->n < FLOW_SIG_MAX - 1) {
		s = &b->sigs[b->n++];
	} else {
		b->overflow = true;
		s = &b->sink;
	}
	for (int i = 0; i < FLOW_SIG_MAX_IO; i++)
		s->in[i] = s->out[i] = FLOW_SIG_B;
	s->gather_bytes = 0;
	s->name = name;
	return s;
}

flow_err_t flow_sig_bad(const flow_sig_query_t *q, flow_diag_t *diag,
			const char *fmt, ...)
{
	char msg[FLOW_DIAG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return flow_diag_set(diag, FLOW_ERR_USAGE, "%s: %s", q->op, msg);
}

flow_err_t flow_sig_check_rank(const flow_sig_query_t *q, const char *name,
			       const flow_shape_t *s, int ndim,
			       const char *form, flow_diag_t *diag)
{
	if (ndim < 0 ? s->ndim >= 1 : s->ndim == ndim)
		return FLOW_OK;
	return flow_sig_bad(q, diag, "%s %s must be %s", name,
			    flow_shape_text(s).s, form);
}

flow_err_t flow_sig_mismatch(const flow_sig_query_t *q, flow_diag_t *diag,
			     const char *bad, const flow_shape_t *bad_shape,
			     const char *ref, const flow_shape_t *ref_shape,
			     const char *expect_fmt, ...)
{
	char expect[FLOW_DIAG_MAX];
	va_list ap;

	va_start(ap, expect_fmt);
	vsnprintf(expect, sizeof(expect), expect_fmt, ap);
	va_end(ap);
	return flow_sig_bad(q, diag, "%s %s does not match %s %s: expected %s",
			    bad, flow_shape_text(bad_shape).s, ref,
			    flow_shape_text(ref_shape).s, expect);
}

bool flow_sig_numel(const flow_shape_t *s, int64_t *numel_out)
{
	int64_t n = 1;

	for (int i = 0; i < s->ndim; i++)
		if (__builtin_mul_overflow(n, s->dims[i], &n))
			return false;
	*numel_out = n;
	return true;
}

/* ---- comparing and normalising 1-D signatures ---------------------------- */

static bool sig_present(const flow_sig_query_t *q, int i)
{
	return q->in_present[i];
}

static bool sig_equal(const flow_sig_query_t *q, const flow_sig_t *a,
		      const flow_sig_t *b)
{
	for (int i = 0; i < q->nin; i++)
		if (sig_present(q, i) && !flow_sbp_equal(a->in[i], b->in[i]))
			return false;
	for (int i = 0; i < q->nout; i++)
		if (!flow_sbp_equal(a->out[i], b->out[i]))
			return false;
	return true;
}

/* The 1-D signature an n-D one uses on axis a, as a 1-D signature. */
static flow_sig_t sig_on_axis(const flow_nd_sig_t *sig, int a)
{
	flow_sig_t s;

	memset(&s, 0, sizeof(s));
	for (int i = 0; i < FLOW_SIG_MAX_IO; i++) {
		s.in[i] = sig->in[i].sbp[a];
		s.out[i] = sig->out[i].sbp[a];
	}
	return s;
}

int flow_sig_axis_index(const flow_sig_query_t *query, const flow_sig_t *sigs,
			int nsigs, const flow_nd_sig_t *sig, int axis)
{
	flow_sig_t want = sig_on_axis(sig, axis);

	for (int i = 0; i < nsigs; i++)
		if (sig_equal(query, &sigs[i], &want))
			return i;
	return -1;
}

static bool sig_all_broadcast(const flow_sig_query_t *q, const flow_sig_t *s)
{
	for (int i = 0; i < q->nin; i++)
		if (sig_present(q, i) &&
		    s->in[i].kind != FLOW_SBP_BROADCAST)
			return false;
	for (int i = 0; i < q->nout; i++)
		if (s->out[i].kind != FLOW_SBP_BROADCAST)
			return false;
	return true;
}

/* Absent inputs and the slots past the counts hold B, so equal lists are
 * equal byte for byte in what a caller reads. */
static void sig_normalise(const flow_sig_query_t *q, flow_sig_t *s)
{
	for (int i = 0; i < FLOW_SIG_MAX_IO; i++) {
		if (i >= q->nin || !sig_present(q, i))
			s->in[i] = FLOW_SIG_B;
		if (i >= q->nout)
			s->out[i] = FLOW_SIG_B;
		/* A split's axis means something; B and P carry 0. */
		if (s->in[i].kind != FLOW_SBP_SPLIT)
			s->in[i].axis = 0;
		if (s->out[i].kind != FLOW_SBP_SPLIT)
			s->out[i].axis = 0;
	}
}

/* The counts, the presence of required inputs and sane shapes, before the
 * op's own rule runs. */
static flow_err_t sig_check_query(const flow_sig_op_t *op,
				  const flow_sig_query_t *q, flow_diag_t *diag)
{
	if (q->nin < op->nin_min || q->nin > op->nin) {
		if (op->nin_min == op->nin)
			return flow_sig_bad(q, diag, "takes %d inputs, not %d",
					    op->nin, q->nin);
		return flow_sig_bad(q, diag, "takes %d to %d inputs, not %d",
				    op->nin_min, op->nin, q->nin);
	}
	if (q->nout < op->nout_min || q->nout > op->nout) {
		if (op->nout_min == op->nout)
			return flow_sig_bad(q, diag, "gives %d outputs, not %d",
					    op->nout, q->nout);
		return flow_sig_bad(q, diag, "gives %d to %d outputs, not %d",
				    op->nout_min, op->nout, q->nout);
	}
	for (int i = 0; i < q->nin; i++) {
		if (!q->in_present[i] && !(op->optional_in & (1u << i)))
			return flow_sig_bad(q, diag, "input %s is required",
					    op->in_names[i]);
	}
	for (int side = 0; side < 2; side++) {
		int n = side ? q->nout : q->nin;

		for (int i = 0; i < n; i++) {
			const flow_shape_t *s = side ? &q->out[i] : &q->in[i];
			const char *name = side ? op->out_names[i] :
						  op->in_names[i];

			if (!side && !q->in_present[i])
				continue;
			if (s->ndim < 0 || s->ndim > FLOW_MAX_DIMS)
				return flow_sig_bad(q, diag,
						    "%s has %d dimensions, "
						    "outside [0, %d]",
						    name, s->ndim,
						    FLOW_MAX_DIMS);
			for (int d = 0; d < s->ndim; d++)
				if (s->dims[d] < 0)
					return flow_sig_bad(
						q, diag,
						"%s %s has a negative "
						"dimension",
						name, flow_shape_text(s).s);
		}
	}
	return FLOW_OK;
}

/* The list of op for q: rule, dedup, all-broadcast last.  sigs has room
 * for FLOW_SIG_MAX. */
static int sig_list_of(const flow_sig_op_t *op, const flow_sig_query_t *q,
		       flow_sig_t sigs[FLOW_SIG_MAX], flow_diag_t *diag)
{
	flow_sig_builder_t b = { .query = q, .op = op, .sigs = sigs };
	flow_err_t err;
	int n = 0;

	if ((err = sig_check_query(op, q, diag)) ||
	    (err = op->rule(q, &b, diag)))
		return err;
	if (b.overflow)
		return flow_sig_bad(q, diag, "more than %d signatures",
				    FLOW_SIG_MAX - 1);
	for (int i = 0; i < b.n; i++) {
		bool dup = sig_all_broadcast(q, &sigs[i]);

		for (int j = 0; j < n && !dup; j++)
			dup = sig_equal(q, &sigs[j], &sigs[i]);
		if (dup)
			continue;
		sigs[n] = sigs[i];
		sig_normalise(q, &sigs[n]);
		n++;
	}
	flow_sig_push(&(flow_sig_builder_t){ .query = q, .sigs = sigs + n },
		      "broadcast");
	return n + 1;
}

int flow_sig_list(const flow_sig_query_t *query,
		  flow_sig_t sigs[FLOW_SIG_MAX], flow_diag_t *diag)
{
	const flow_sig_op_t *op = sig_op_find(query->op);
	flow_sig_t list[FLOW_SIG_MAX];
	int n;

	if (!op)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "no signatures for unknown op '%s'",
				     query->op ? query->op : "");
	/* sigs is written only on success. */
	n = sig_list_of(op, query, list, diag);
	if (n > 0)
		memcpy(sigs, list, (size_t)n * sizeof(list[0]));
	return n;
}

/* ---- the adjoint, for backward ops --------------------------------------- */

/* The gradient of an input: S(k) stays, a broadcast input's gradient is a
 * sum of the ranks' parts, a partial input's addends each get it all. */
static flow_sbp_t adjoint_in(flow_sbp_t s)
{
	if (s.kind == FLOW_SBP_BROADCAST)
		return FLOW_SIG_P;
	if (s.kind == FLOW_SBP_PARTIAL)
		return FLOW_SIG_B;
	return s;
}

/* The gradient of the output, as the backward op reads it: a partial
 * output's gradient is needed whole by every rank. */
static flow_sbp_t adjoint_out(flow_sbp_t s)
{
	return s.kind == FLOW_SBP_PARTIAL ? FLOW_SIG_B : s;
}

flow_err_t flow_sig_adjoint(const flow_sig_query_t *fwd_query,
			    const flow_op_info_t *fwd_info,
			    flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_sig_op_t *fwd_op = fwd_info->sig;
	const flow_sig_query_t *q = b->query;
	flow_sig_query_t fq = *fwd_query;
	flow_sig_t fwd[FLOW_SIG_MAX];
	int n;

	/* The forward rule's shape messages name the op the caller asked
	 * about. */
	fq.op = q->op;
	n = sig_list_of(fwd_op, &fq, fwd, diag);

	if (n < 0)
		return (flow_err_t)n;
	for (int j = 0; j < q->nout; j++) {
		int in = fwd_info->grad_in_first + j;

		if (in < fwd_query->nin && fwd_query->in_present[in] &&
		    !flow_shape_equal(&q->out[j], &fwd_query->in[in]))
			return flow_sig_bad(q, diag,
					    "the gradient of %s %s must have "
					    "its shape, not %s",
					    fwd_op->in_names[in],
					    flow_shape_text(&fwd_query->in[in]).s,
					    flow_shape_text(&q->out[j]).s);
	}
	for (int i = 0; i < n; i++) {
		const flow_sig_t *f = &fwd[i];
		flow_sig_t *s;

		/* Replicated work has replicated gradients: the backward
		 * list's own all-broadcast signature. */
		if (sig_all_broadcast(fwd_query, f))
			continue;
		s = flow_sig_push(b, f->name);
		s->in[0] = adjoint_out(f->out[0]);
		for (int k = 0; k < fwd_info->nsaved && 1 + k < q->nin; k++) {
			int ref = fwd_info->saved[k];

			s->in[1 + k] = ref < FLOW_OP_MAX_IO ?
				f->in[ref] : f->out[ref - FLOW_OP_MAX_IO];
		}
		for (int j = 0; j < q->nout; j++) {
			int in = fwd_info->grad_in_first + j;

			s->out[j] = adjoint_in(f->in[in]);
		}
	}
	return FLOW_OK;
}

/* ---- n-D ------------------------------------------------------------------ */

/* The 1-D lists of every mesh axis, each computed with that axis' size. */
typedef struct sig_lists {
	int n[FLOW_MESH_MAX_AXES];
	flow_sig_t sigs[FLOW_MESH_MAX_AXES][FLOW_SIG_MAX];
} sig_lists_t;

static flow_err_t sig_lists_build(const flow_sig_op_t *op,
				  const flow_sig_query_t *query,
				  const flow_mesh_t *mesh, sig_lists_t *l,
				  flow_diag_t *diag)
{
	if (mesh->ndim < 1 || mesh->ndim > FLOW_MESH_MAX_AXES)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: a mesh of %d axes, outside [1, %d]",
				     query->op, mesh->ndim,
				     FLOW_MESH_MAX_AXES);
	for (int a = 0; a < mesh->ndim; a++) {
		flow_sig_query_t qa = *query;

		qa.axis_size = mesh->dims[a];
		l->n[a] = sig_list_of(op, &qa, l->sigs[a], diag);
		if (l->n[a] < 0)
			return (flow_err_t)l->n[a];
	}
	return FLOW_OK;
}

/* The op of query and its per-axis lists, in a buffer to free with
 * flow_free() (the lists of every axis are too large for the stack). */
static flow_err_t sig_lists_new(const flow_sig_query_t *query,
				const flow_mesh_t *mesh,
				const flow_sig_op_t **op_out,
				sig_lists_t **lists_out, flow_diag_t *diag)
{
	const flow_sig_op_t *op = sig_op_find(query->op);
	if (!op)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "no signatures for unknown op '%s'",
				     query->op ? query->op : "");
	sig_lists_t *l = flow_alloc(sizeof(*l));
	if (!l)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: out of memory for signatures",
				     query->op);
	flow_err_t err = sig_lists_build(op, query, mesh, l, diag);
	if (err != FLOW_OK) {
		flow_free(l);
		return err;
	}
	*op_out = op;
	*lists_out = l;
	return FLOW_OK;
}

/* Rules that depend on divisibility (reshape's groups, the flattened rows
 * of layernorm and cross-entropy) hold per axis for that axis' size; when
 * several mesh axes apply the same signature they split the same
 * dimensions one after the other, and the parts agree only when the
 * signature holds for the product of their sizes.  Returns the first
 * axis where it does not, with that product in *ranks_out, or -1. */
static int sig_joint_fail(const flow_sig_op_t *op,
			  const flow_sig_query_t *query,
			  const flow_mesh_t *mesh,
			  const flow_sig_t *const per_axis[FLOW_MESH_MAX_AXES],
			  int64_t *ranks_out)
{
	for (int a = 1; a < mesh->ndim; a++) {
		int64_t k = mesh->dims[a];

		if (sig_all_broadcast(query, per_axis[a]))
			continue;
		for (int b = 0; b < a; b++)
			if (sig_equal(query, per_axis[b], per_axis[a]))
				k *= mesh->dims[b];
		if (k == mesh->dims[a])
			continue;

		flow_sig_query_t qk = *query;
		flow_sig_t sigs[FLOW_SIG_MAX];
		int n;
		bool found = false;

		qk.axis_size = k;
		n = sig_list_of(op, &qk, sigs, NULL);
		for (int i = 0; i < n && !found; i++)
			found = sig_equal(query, &sigs[i], per_axis[a]);
		if (!found) {
			*ranks_out = k;
			return a;
		}
	}
	return -1;
}

/* The nd signature whose axis a follows per_axis[a]; absent inputs are
 * all-broadcast. */
static void sig_compose(const flow_sig_query_t *query, const flow_mesh_t *mesh,
			const flow_sig_t *const per_axis[FLOW_MESH_MAX_AXES],
			flow_nd_sig_t *nd)
{
	memset(nd, 0, sizeof(*nd));
	for (int i = 0; i < FLOW_SIG_MAX_IO; i++) {
		nd->in[i].ndim = nd->out[i].ndim = mesh->ndim;
		for (int a = 0; a < mesh->ndim; a++) {
			nd->in[i].sbp[a] = per_axis[a]->in[i];
			nd->out[i].sbp[a] = per_axis[a]->out[i];
		}
	}
}

/* Every present tensor's nd-SBP is valid for its shape. */
static bool sig_nd_valid(const flow_sig_query_t *query,
			 const flow_mesh_t *mesh, const flow_nd_sig_t *nd)
{
	for (int i = 0; i < query->nin; i++)
		if (sig_present(query, i) &&
		    flow_nd_sbp_check(&query->in[i], &nd->in[i], mesh, NULL))
			return false;
	for (int i = 0; i < query->nout; i++)
		if (flow_nd_sbp_check(&query->out[i], &nd->out[i], mesh, NULL))
			return false;
	return true;
}

int flow_sig_candidates(const flow_sig_query_t *query,
			const flow_mesh_t *mesh, flow_nd_sig_t *sigs,
			size_t cap, size_t *total_out, flow_diag_t *diag)
{
	const flow_sig_op_t *op;
	const flow_sig_t *per_axis[FLOW_MESH_MAX_AXES];
	int idx[FLOW_MESH_MAX_AXES] = { 0 };
	size_t total = 0, written = 0;
	sig_lists_t *l;
	flow_err_t err;

	if ((err = sig_lists_new(query, mesh, &op, &l, diag)) != FLOW_OK)
		return err;

	/* An odometer over the axes, the last fastest.  The 1-D lists hold
	 * no duplicates, so neither do their products. */
	for (;;) {
		flow_nd_sig_t nd;
		int64_t ranks;
		int a;

		for (a = 0; a < mesh->ndim; a++)
			per_axis[a] = &l->sigs[a][idx[a]];
		sig_compose(query, mesh, per_axis, &nd);
		if (sig_nd_valid(query, mesh, &nd) &&
		    sig_joint_fail(op, query, mesh, per_axis, &ranks) < 0) {
			if (written < cap)
				sigs[written++] = nd;
			total++;
		}
		for (a = mesh->ndim - 1; a >= 0; a--) {
			if (++idx[a] < l->n[a])
				break;
			idx[a] = 0;
		}
		if (a < 0)
			break;
	}
	if (total_out)
		*total_out = total;
	flow_free(l);
	return (int)written;
}

/* "S(1)", "B", "P". */
static const char *sbp_text(flow_sbp_t s, char buf[24])
{
	if (s.kind == FLOW_SBP_SPLIT)
		snprintf(buf, 24, "S(%d)", s.axis);
	else
		snprintf(buf, 24, "%s",
			 s.kind == FLOW_SBP_PARTIAL ? "P" : "B");
	return buf;
}

/* "'tp'" for a named axis, "1" otherwise (as flow_nd_sbp_check names
 * mesh axes). */
static const char *axis_label(const flow_mesh_t *mesh, int a,
			      char buf[FLOW_MESH_NAME_MAX + 4])
{
	if (mesh->names[a][0])
		snprintf(buf, FLOW_MESH_NAME_MAX + 4, "'%.*s'",
			 FLOW_MESH_NAME_MAX - 1, mesh->names[a]);
	else
		snprintf(buf, FLOW_MESH_NAME_MAX + 4, "%d", a);
	return buf;
}

/* Tensor t of the query in order: inputs, then outputs. */
static flow_sbp_t sig_tensor_sbp(const flow_sig_t *s, int nin, int t)
{
	return t < nin ? s->in[t] : s->out[t - nin];
}

/* Why axis a of nd matches no 1-D signature: the first tensor (inputs,
 * then outputs) at which no signature agrees with it and the tensors
 * before it. */
static flow_err_t sig_explain(const flow_sig_op_t *op,
			      const flow_sig_query_t *q,
			      const flow_mesh_t *mesh, int a,
			      const flow_sig_t *want, const flow_sig_t *list,
			      int n, flow_diag_t *diag)
{
	bool alive[FLOW_SIG_MAX];
	char with[FLOW_DIAG_MAX] = "", label[FLOW_MESH_NAME_MAX + 4];
	size_t len = 0;

	for (int i = 0; i < n; i++)
		alive[i] = true;
	for (int t = 0; t < q->nin + q->nout; t++) {
		bool any = false;
		char sbp[24];
		const char *name = t < q->nin ? op->in_names[t] :
				   op->out_names[t - q->nin];
		flow_sbp_t s = sig_tensor_sbp(want, q->nin, t);

		if (t < q->nin && !sig_present(q, t))
			continue;
		for (int i = 0; i < n; i++) {
			alive[i] = alive[i] &&
				   flow_sbp_equal(sig_tensor_sbp(&list[i],
								 q->nin, t),
						  s);
			any = any || alive[i];
		}
		if (!any)
			return flow_sig_bad(q, diag,
					    "mesh axis %s: no signature has "
					    "%s %s%s%s",
					    axis_label(mesh, a, label),
					    name, sbp_text(s, sbp),
					    len ? " with " : "", with);
		if (len < sizeof(with))
			len += (size_t)snprintf(with + len, sizeof(with) - len,
						"%s%s %s", len ? ", " : "",
						name, sbp_text(s, sbp));
	}
	/* Unreachable when the caller found no match; say so plainly. */
	return flow_sig_bad(q, diag, "mesh axis %s: no matching signature",
			    axis_label(mesh, a, label));
}

flow_err_t flow_sig_check(const flow_sig_query_t *query,
			  const flow_mesh_t *mesh, const flow_nd_sig_t *sig,
			  flow_diag_t *diag)
{
	const flow_sig_op_t *op;
	const flow_sig_t *per_axis[FLOW_MESH_MAX_AXES];
	char label[FLOW_MESH_NAME_MAX + 4];
	int64_t ranks;
	sig_lists_t *l;
	flow_err_t err;
	int joint;

	if ((err = sig_lists_new(query, mesh, &op, &l, diag)) != FLOW_OK)
		return err;

	for (int t = 0; t < query->nin + query->nout; t++) {
		const flow_nd_sbp_t *s = t < query->nin ?
			&sig->in[t] : &sig->out[t - query->nin];
		const char *name = t < query->nin ? op->in_names[t] :
				   op->out_names[t - query->nin];

		if (t < query->nin && !sig_present(query, t))
			continue;
		if (s->ndim != mesh->ndim) {
			err = flow_sig_bad(query, diag,
					   "%s has %d SBPs for a mesh of %d "
					   "axes",
					   name, s->ndim, mesh->ndim);
			goto out_free_lists;
		}
	}
	for (int a = 0; a < mesh->ndim; a++) {
		int found = flow_sig_axis_index(query, l->sigs[a], l->n[a], sig,
						a);

		if (found < 0) {
			flow_sig_t want = sig_on_axis(sig, a);
			err = sig_explain(op, query, mesh, a, &want,
					  l->sigs[a], l->n[a], diag);
			goto out_free_lists;
		}
		per_axis[a] = &l->sigs[a][found];
	}
	if ((joint = sig_joint_fail(op, query, mesh, per_axis, &ranks)) >= 0) {
		err = flow_sig_bad(query, diag,
				   "mesh axis %s: signature '%s' on %lld "
				   "ranks of the axes applying it splits the "
				   "shapes into parts that do not match",
				   axis_label(mesh, joint, label),
				   per_axis[joint]->name, (long long)ranks);
		goto out_free_lists;
	}
	for (int t = 0; t < query->nin + query->nout; t++) {
		const flow_shape_t *shape = t < query->nin ?
			&query->in[t] : &query->out[t - query->nin];
		const flow_nd_sbp_t *s = t < query->nin ?
			&sig->in[t] : &sig->out[t - query->nin];
		const char *name = t < query->nin ? op->in_names[t] :
				   op->out_names[t - query->nin];
		flow_diag_t inner = FLOW_DIAG_INIT;

		if (t < query->nin && !sig_present(query, t))
			continue;
		if (flow_nd_sbp_check(shape, s, mesh, &inner) != FLOW_OK) {
			err = flow_sig_bad(query, diag, "%s: %s", name,
					   flow_diag_message(&inner));
			goto out_free_lists;
		}
	}
out_free_lists:
	flow_free(l);
	return err;
}

/* ---- graph ops ------------------------------------------------------------ */

void flow_sig_query_of_op(const flow_graph_t *g, int op, int64_t axis_size,
			  flow_sig_query_t *query_out)
{
	const flow_graph_op_t *o = &g->ops[op];
	const flow_op_def_t *def = flow_op_def(o->kind);
	flow_sig_query_t q;

	memset(&q, 0, sizeof(q));
	q.op = def->name;
	q.nin = o->nin;
	q.nout = o->nout;
	q.axis_size = axis_size;
	q.attrs.heads = o->attrs.heads;
	q.attrs.vocab = o->attrs.vocab;
	for (int i = 0; i < o->nin; i++) {
		q.in_present[i] = o->in[i] >= 0;
		if (o->in[i] >= 0)
			q.in[i] = g->tensors[o->in[i]].shape;
	}
	for (int i = 0; i < o->nout; i++)
		if (o->out[i] >= 0)
			q.out[i] = g->tensors[o->out[i]].shape;
	if (flow_op_kind_is_backward(o->kind) && o->forward >= 0) {
		/* A gradient nobody needs still has a shape, its forward
		 * input's; gradients of absent optional inputs (matmul
		 * without bias) are dropped from the end. */
		const flow_graph_op_t *f = &g->ops[o->forward];
		const flow_op_info_t *fi = flow_op_info(f->kind);
		int last = -1;

		for (int i = 0; i < o->nout; i++) {
			int in = fi->grad_in_first + i;

			if (in < f->nin && f->in[in] >= 0) {
				last = i;
				if (o->out[i] < 0)
					q.out[i] = g->tensors[f->in[in]].shape;
			}
		}
		q.nout = last + 1;
	}
	*query_out = q;
}
