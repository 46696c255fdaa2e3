/* The graph IR: building (tensors, ops with shape inference, the loss),
 * checking, statistics and the text form.  Autograd is in autograd.c,
 * live ranges and memory planning in memplan.c. */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <flow/graph.h>

#include "graph_internal.h"
#include "ops/ops_internal.h"

const char *flow_role_name(flow_role_t role)
{
	static const char *const names[FLOW_ROLE_COUNT] = {
		[FLOW_ROLE_PARAM] = "param",
		[FLOW_ROLE_INPUT] = "input",
		[FLOW_ROLE_ACTIVATION] = "activation",
		[FLOW_ROLE_GRAD] = "grad",
		[FLOW_ROLE_PARAM_GRAD] = "param_grad",
		[FLOW_ROLE_SAVED] = "saved",
	};

	if ((int)role < 0 || (int)role >= FLOW_ROLE_COUNT)
		return "unknown";
	return names[role];
}

void flow_graph_init(flow_graph_t *g)
{
	memset(g, 0, sizeof(*g));
	g->loss = -1;
}

flow_err_t flow_graph_set_act_dtype(flow_graph_t *g, flow_dtype_t dtype,
				    flow_diag_t *diag)
{
	if (dtype != FLOW_DTYPE_F32 && dtype != FLOW_DTYPE_BF16)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "activations in %s: only f32 and bf16 are "
				     "supported",
				     flow_dtype_name(dtype) ?
					     flow_dtype_name(dtype) : "an unknown dtype");
	if (g->nops > 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "the activations' dtype is set before "
				     "the graph's first op");
	g->act_dtype = dtype;
	return FLOW_OK;
}

void flow_graph_release(flow_graph_t *g)
{
	if (!g)
		return;
	free(g->tensors);
	free(g->ops);
	flow_graph_init(g);
}

/* ---- growth ---------------------------------------------------------------- */

/* Grow *items (of *cap elements of size bytes) to hold at least need. */
static bool grow(void **items, size_t *cap, size_t need, size_t size)
{
	size_t ncap = *cap ? *cap : 16, bytes;
	void *p;

	if (need <= *cap)
		return true;
	while (ncap < need)
		if (!flow_mul_size(ncap, 2, &ncap))
			return false;
	/* Indices are ints, so the arrays never need more than INT_MAX. */
	if (ncap > (size_t)INT32_MAX + 1)
		ncap = (size_t)INT32_MAX + 1;
	if (ncap < need || !flow_mul_size(ncap, size, &bytes))
		return false;
	p = realloc(*items, bytes);
	if (!p)
		return false;
	*items = p;
	*cap = ncap;
	return true;
}

flow_err_t flow_graph_reserve(flow_graph_t *g, size_t more_tensors,
			      size_t more_ops, flow_diag_t *diag)
{
	size_t nt, no;

	if (!flow_add_size(g->ntensors, more_tensors, &nt) ||
	    !flow_add_size(g->nops, more_ops, &no) ||
	    !grow((void **)&g->tensors, &g->tensors_cap, nt,
		  sizeof(*g->tensors)) ||
	    !grow((void **)&g->ops, &g->ops_cap, no, sizeof(*g->ops)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory for a graph of %zu "
				     "tensors and %zu ops",
				     g->ntensors + more_tensors,
				     g->nops + more_ops);
	return FLOW_OK;
}

/* ---- tensors ----------------------------------------------------------------- */

static bool name_fits(const char *name)
{
	return name[0] != '\0' && strlen(name) < FLOW_GRAPH_NAME_MAX;
}

int flow_graph_find(const flow_graph_t *g, const char *name)
{
	for (size_t t = 0; t < g->ntensors; t++)
		if (strcmp(g->tensors[t].name, name) == 0)
			return (int)t;
	return -1;
}

/* Element count and bytes of a shape of dtype; false when they do not fit
 * (the arena offsets need headroom, so the bound is FLOW_GRAPH_BYTES_MAX). */
static bool shape_bytes(const flow_shape_t *shape, flow_dtype_t dtype,
			size_t *bytes_out)
{
	size_t n;

	if (flow_shape_numel(shape, &n, NULL) != FLOW_OK ||
	    !flow_mul_size(n, flow_dtype_size(dtype), &n) ||
	    n > FLOW_GRAPH_BYTES_MAX)
		return false;
	*bytes_out = n;
	return true;
}

int flow_graph_push_tensor(flow_graph_t *g, const char *name,
			   flow_role_t role, flow_dtype_t dtype,
			   const flow_shape_t *shape, flow_diag_t *diag)
{
	size_t bytes;
	flow_err_t err;

	if (!name_fits(name))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid tensor name '%s': must be 1 to "
				     "%d characters",
				     name, FLOW_GRAPH_NAME_MAX - 1);
	if (flow_graph_find(g, name) >= 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "duplicate tensor name '%s'", name);
	if (!shape_bytes(shape, dtype, &bytes))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s' %s is too large", name,
				     flow_shape_text(shape).s);
	if ((err = flow_graph_reserve(g, 1, 0, diag)) != FLOW_OK)
		return err;

	flow_graph_tensor_t *t = &g->tensors[g->ntensors];
	memset(t, 0, sizeof(*t));
	memcpy(t->name, name, strlen(name) + 1);
	t->role = role;
	t->dtype = dtype;
	t->shape = *shape;
	t->producer = t->grad = t->grad_of = t->alias_of = -1;
	return (int)g->ntensors++;
}

int flow_graph_add_tensor(flow_graph_t *g, const char *name, flow_role_t role,
			  flow_dtype_t dtype, int ndim, const int64_t *dims,
			  flow_diag_t *diag)
{
	flow_shape_t shape;
	flow_diag_t local = FLOW_DIAG_INIT;

	if (role != FLOW_ROLE_PARAM && role != FLOW_ROLE_INPUT)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': role %s cannot be added, "
				     "only param or input",
				     name, flow_role_name(role));
	/* Parameters are trained in f32; inputs are f32 or token ids. */
	if (dtype != FLOW_DTYPE_F32 &&
	    (role == FLOW_ROLE_PARAM || dtype != FLOW_DTYPE_I32))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': dtype %s is not supported "
				     "for a %s",
				     name, flow_dtype_name(dtype) ?
						   flow_dtype_name(dtype) :
						   "unknown",
				     flow_role_name(role));
	if (flow_shape_init(&shape, ndim, dims, &local) != FLOW_OK)
		return flow_diag_set(diag, FLOW_ERR_USAGE, "tensor '%s': %s",
				     name, flow_diag_message(&local));
	if (flow_graph_is_differentiated(g))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': the graph is already "
				     "differentiated",
				     name);

	int t = flow_graph_push_tensor(g, name, role, dtype, &shape, diag);
	if (t < 0)
		return t;
	if (role == FLOW_ROLE_PARAM) {
		g->tensors[t].requires_grad = true;
		g->tensors[t].init.kind = FLOW_INIT_ZEROS;
	}
	return t;
}

size_t flow_graph_tensor_numel(const flow_graph_t *g, int t)
{
	const flow_shape_t *s = &g->tensors[t].shape;
	size_t n = 1;

	for (int i = 0; i < s->ndim; i++)
		n *= (size_t)s->dims[i];
	return n;
}

size_t flow_graph_tensor_bytes(const flow_graph_t *g, int t)
{
	return flow_graph_tensor_numel(g, t) *
	       flow_dtype_size(g->tensors[t].dtype);
}

/* ---- ops ---------------------------------------------------------------------- */

bool flow_graph_is_differentiated(const flow_graph_t *g)
{
	if (g->nops > g->nforward)
		return true;
	for (size_t t = 0; t < g->ntensors; t++)
		if (g->tensors[t].grad >= 0)
			return true;
	return false;
}

/* Role of output i of a forward op. */
static flow_role_t output_role(const flow_op_info_t *info, int i)
{
	if (info->inplace_grad_out >> i & 1)
		return FLOW_ROLE_GRAD;
	if (info->saved_out >> i & 1)
		return FLOW_ROLE_SAVED;
	return FLOW_ROLE_ACTIVATION;
}

int flow_graph_add_op(flow_graph_t *g, flow_op_kind_t kind, const char *name,
		      const int *in, int nin, const flow_op_attrs_t *attrs,
		      flow_diag_t *diag)
{
	const flow_op_info_t *info = flow_op_info(kind);
	flow_shape_t shapes[FLOW_OP_MAX_IO];
	flow_dtype_t dtypes[FLOW_OP_MAX_IO];
	flow_graph_op_t op;
	size_t first_out = g->ntensors;
	flow_err_t err;

	if (!name_fits(name))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid op name '%s': must be 1 to %d "
				     "characters",
				     name, FLOW_GRAPH_NAME_MAX - 1);
	if (!info || flow_op_kind_is_backward(kind))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: op kind %d is not a forward op", name,
				     (int)kind);
	if (nin < 0 || nin > info->def.nin)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: %s takes %d inputs, got %d", name,
				     info->def.name, info->def.nin, nin);
	if (flow_graph_is_differentiated(g))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: the graph is already differentiated",
				     name);

	memset(&op, 0, sizeof(op));
	op.kind = kind;
	memcpy(op.name, name, strlen(name) + 1);
	op.nin = info->def.nin;
	op.nout = info->def.nout;
	for (int i = 0; i < FLOW_OP_MAX_IO; i++)
		op.in[i] = op.out[i] = -1;
	for (int i = 0; i < nin; i++)
		op.in[i] = in[i];
	if (attrs)
		op.attrs = *attrs;
	op.forward = -1;

	if ((err = info->def.infer(g, &op, shapes, dtypes, diag)) != FLOW_OK)
		return err;
	if ((err = flow_graph_reserve(g, (size_t)op.nout, 1, diag)) != FLOW_OK)
		return err;

	bool requires_grad = false;
	for (int i = 0; i < op.nin; i++)
		if (op.in[i] >= 0 && g->tensors[op.in[i]].requires_grad)
			requires_grad = true;
	for (int i = 0; i < op.nout; i++) {
		char tname[FLOW_GRAPH_NAME_MAX + 32];
		flow_role_t role = output_role(info, i);

		snprintf(tname, sizeof(tname), "%s.%s", name,
			 info->def.out_names[i]);
		int t = flow_graph_push_tensor(g, tname, role, dtypes[i],
					       &shapes[i], diag);
		if (t < 0) {
			err = (flow_err_t)t;
			goto out_drop_outputs;
		}
		flow_graph_tensor_t *x = &g->tensors[t];
		x->producer = (int)g->nops;
		x->requires_grad = requires_grad && role == FLOW_ROLE_ACTIVATION;
		if (role == FLOW_ROLE_GRAD)
			x->alias_of = x->grad_of = op.in[0];
		op.out[i] = t;
	}
	g->ops[g->nops] = op;
	g->nforward = ++g->nops;
	return (int)g->nops - 1;

out_drop_outputs:
	g->ntensors = first_out;
	return err;
}

int flow_graph_append_op(flow_graph_t *g, const flow_graph_op_t *op,
			 flow_diag_t *diag)
{
	const flow_op_info_t *info = flow_op_info(op->kind);
	flow_err_t err;

	if (!info || op->nin != info->def.nin || op->nout != info->def.nout ||
	    !memchr(op->name, '\0', sizeof(op->name)))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "op '%.*s' of kind %d: bad kind, name or "
				     "counts",
				     (int)sizeof(op->name) - 1, op->name,
				     (int)op->kind);
	for (int i = 0; i < op->nin + op->nout; i++) {
		int t = i < op->nin ? op->in[i] : op->out[i - op->nin];
		if (t < -1 || t >= (int)g->ntensors)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: tensor %d is not in the "
					     "graph",
					     op->name, t);
	}
	if ((err = flow_graph_reserve(g, 0, 1, diag)) != FLOW_OK)
		return err;
	for (int i = 0; i < op->nout; i++)
		if (op->out[i] >= 0 && g->tensors[op->out[i]].producer < 0)
			g->tensors[op->out[i]].producer = (int)g->nops;
	g->ops[g->nops] = *op;
	return (int)g->nops++;
}

flow_err_t flow_graph_set_loss(flow_graph_t *g, int losses, flow_diag_t *diag)
{
	if (losses < 0 || (size_t)losses >= g->ntensors)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "loss %d is not a tensor of the graph",
				     losses);
	const flow_graph_tensor_t *t = &g->tensors[losses];
	if (t->producer < 0 ||
	    g->ops[t->producer].kind != FLOW_OP_CROSS_ENTROPY ||
	    g->ops[t->producer].out[0] != losses)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "loss '%s' is not the losses of a "
				     "cross_entropy op",
				     t->name);
	if (flow_graph_is_differentiated(g))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "loss '%s': the graph is already "
				     "differentiated",
				     t->name);
	g->loss = losses;
	return FLOW_OK;
}

/* ---- validation ------------------------------------------------------------ */

static int cmp_name_ptr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Tensor names are unique: sorted, no two neighbours are equal. */
static flow_err_t validate_names(const flow_graph_t *g, flow_diag_t *diag)
{
	const char **names = malloc((g->ntensors ? g->ntensors : 1) *
				    sizeof(*names));
	flow_err_t err = FLOW_OK;

	if (!names)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory checking the graph");
	for (size_t t = 0; t < g->ntensors; t++)
		names[t] = g->tensors[t].name;
	qsort(names, g->ntensors, sizeof(*names), cmp_name_ptr);
	for (size_t t = 1; t < g->ntensors; t++) {
		if (strcmp(names[t - 1], names[t]) == 0) {
			err = flow_diag_set(diag, FLOW_ERR_FORMAT,
					    "duplicate tensor name '%s'",
					    names[t]);
			break;
		}
	}
	free(names);
	return err;
}

static bool index_ok(const flow_graph_t *g, int t)
{
	return t >= 0 && (size_t)t < g->ntensors;
}

static flow_err_t validate_tensor(const flow_graph_t *g, int i,
				  flow_diag_t *diag)
{
	const flow_graph_tensor_t *t = &g->tensors[i];
	size_t bytes;

	if (memchr(t->name, '\0', sizeof(t->name)) == NULL || !t->name[0])
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "tensor %d: invalid name", i);
	if ((int)t->role < 0 || (int)t->role >= FLOW_ROLE_COUNT ||
	    !flow_dtype_name(t->dtype) || t->shape.ndim < 0 ||
	    t->shape.ndim > FLOW_MAX_DIMS)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "tensor '%s': invalid role, dtype or rank",
				     t->name);
	for (int d = 0; d < t->shape.ndim; d++)
		if (t->shape.dims[d] < 0)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "tensor '%s': negative dimension",
					     t->name);
	if (!shape_bytes(&t->shape, t->dtype, &bytes))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "tensor '%s' is too large", t->name);
	if ((t->grad != -1 && !index_ok(g, t->grad)) ||
	    (t->grad_of != -1 && !index_ok(g, t->grad_of)) ||
	    (t->alias_of != -1 && !index_ok(g, t->alias_of)) ||
	    (t->producer != -1 &&
	     (t->producer < 0 || (size_t)t->producer >= g->nops)))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "tensor '%s': index out of range",
				     t->name);
	if (t->grad >= 0 && g->tensors[t->grad].grad_of != i)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "tensor '%s': its gradient '%s' is not "
				     "marked as its gradient",
				     t->name, g->tensors[t->grad].name);
	if (t->alias_of >= 0 &&
	    flow_graph_tensor_bytes(g, t->alias_of) <
		    flow_graph_tensor_bytes(g, i))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "tensor '%s' is larger than '%s', which "
				     "it aliases",
				     t->name, g->tensors[t->alias_of].name);
	return FLOW_OK;
}

/* The op's kind fits its place, its indices are in range, every input is
 * written before (or persistent), and the outputs have the shapes its
 * shape rule gives. */
static flow_err_t validate_op(const flow_graph_t *g, size_t i,
			      const bool *written, flow_diag_t *diag)
{
	const flow_graph_op_t *op = &g->ops[i];
	const flow_op_info_t *info = flow_op_info(op->kind);
	flow_shape_t shapes[FLOW_OP_MAX_IO];
	flow_dtype_t dtypes[FLOW_OP_MAX_IO];
	flow_diag_t local = FLOW_DIAG_INIT;

	if (!memchr(op->name, '\0', sizeof(op->name)))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "op %zu: invalid name", i);
	if (!info || (!flow_op_kind_is_neutral(op->kind) &&
		      flow_op_kind_is_backward(op->kind) != (i >= g->nforward)))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "op %zu (%s): kind %d does not belong in "
				     "the %s pass",
				     i, op->name, (int)op->kind,
				     i >= g->nforward ? "backward" : "forward");
	if (op->nin != info->def.nin || op->nout != info->def.nout)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "op %zu (%s): %d inputs and %d outputs, "
				     "%s has %d and %d",
				     i, op->name, op->nin, op->nout,
				     info->def.name, info->def.nin,
				     info->def.nout);
	if (i >= g->nforward && !flow_op_kind_is_neutral(op->kind) &&
	    (op->forward < 0 || (size_t)op->forward >= i))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "op %zu (%s): forward op %d is not "
				     "before it",
				     i, op->name, op->forward);
	for (int k = 0; k < op->nin; k++) {
		int t = op->in[k];
		if (t == -1)
			continue; /* the shape rule decides */
		if (!index_ok(g, t))
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "op %zu (%s): input %d is out of "
					     "range",
					     i, op->name, t);
		if (!written[t])
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "op %zu (%s): input '%s' is read "
					     "before it is written",
					     i, op->name, g->tensors[t].name);
	}
	for (int k = 0; k < op->nout; k++) {
		if (op->out[k] == -1 && i >= g->nforward)
			continue; /* a gradient nobody needs */
		if (!index_ok(g, op->out[k]))
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "op %zu (%s): output %d is out of "
					     "range",
					     i, op->name, op->out[k]);
	}
	if (info->def.infer(g, op, shapes, dtypes, &local) != FLOW_OK)
		return flow_diag_set(diag, FLOW_ERR_FORMAT, "op %zu: %s", i,
				     flow_diag_message(&local));
	for (int k = 0; k < op->nout; k++) {
		const flow_graph_tensor_t *t;
		if (op->out[k] < 0)
			continue;
		t = &g->tensors[op->out[k]];
		if (!flow_shape_equal(&t->shape, &shapes[k]) ||
		    t->dtype != dtypes[k])
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "op %zu (%s): output '%s' is %s "
					     "%s, its shape rule gives %s %s",
					     i, op->name, t->name,
					     flow_dtype_name(t->dtype),
					     flow_shape_text(&t->shape).s,
					     flow_dtype_name(dtypes[k]),
					     flow_shape_text(&shapes[k]).s);
	}
	return FLOW_OK;
}

/* A tensor overwritten in place through an alias (the logits) must not be
 * read after the op that overwrites it, except through the alias. */
static flow_err_t validate_alias_reads(const flow_graph_t *g,
				       flow_diag_t *diag)
{
	for (size_t a = 0; a < g->ntensors; a++) {
		int target = g->tensors[a].alias_of;
		int writer = g->tensors[a].producer;
		if (target < 0 || writer < 0)
			continue;
		for (size_t i = (size_t)writer + 1; i < g->nops; i++)
			for (int k = 0; k < g->ops[i].nin; k++)
				if (g->ops[i].in[k] == target)
					return flow_diag_set(
						diag, FLOW_ERR_FORMAT,
						"op %zu (%s): reads '%s' after "
						"op %d overwrote it with '%s'",
						i, g->ops[i].name,
						g->tensors[target].name, writer,
						g->tensors[a].name);
	}
	return FLOW_OK;
}

flow_err_t flow_graph_validate(const flow_graph_t *g, flow_diag_t *diag)
{
	bool *written;
	flow_err_t err;

	if (g->nforward > g->nops || g->nops > INT32_MAX ||
	    g->ntensors > INT32_MAX)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "graph: %zu forward ops of %zu, %zu "
				     "tensors: counts out of range",
				     g->nforward, g->nops, g->ntensors);
	for (size_t t = 0; t < g->ntensors; t++)
		if ((err = validate_tensor(g, (int)t, diag)) != FLOW_OK)
			return err;
	if ((err = validate_names(g, diag)) != FLOW_OK)
		return err;
	written = calloc(g->ntensors ? g->ntensors : 1, sizeof(*written));
	if (!written)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory checking the graph");
	for (size_t t = 0; t < g->ntensors; t++)
		written[t] = g->tensors[t].role == FLOW_ROLE_PARAM ||
			     g->tensors[t].role == FLOW_ROLE_INPUT;
	for (size_t i = 0; i < g->nops; i++) {
		if ((err = validate_op(g, i, written, diag)) != FLOW_OK)
			goto out_free_written;
		for (int k = 0; k < g->ops[i].nout; k++)
			if (g->ops[i].out[k] >= 0)
				written[g->ops[i].out[k]] = true;
	}
	if ((err = validate_alias_reads(g, diag)) != FLOW_OK)
		goto out_free_written;
	if (g->loss != -1 &&
	    (!index_ok(g, g->loss) || g->tensors[g->loss].producer < 0 ||
	     g->ops[g->tensors[g->loss].producer].kind !=
		     FLOW_OP_CROSS_ENTROPY))
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "graph: loss %d is not the losses of a "
				    "cross_entropy op",
				    g->loss);
out_free_written:
	free(written);
	return err;
}

/* ---- statistics and the text form -------------------------------------------- */

void flow_graph_get_stats(const flow_graph_t *g, flow_graph_stats_t *stats_out)
{
	flow_graph_stats_t s = { 0 };

	for (size_t t = 0; t < g->ntensors; t++) {
		switch (g->tensors[t].role) {
		case FLOW_ROLE_PARAM:
			s.params++;
			s.param_elems += flow_graph_tensor_numel(g, (int)t);
			break;
		case FLOW_ROLE_INPUT:
			s.inputs++;
			break;
		case FLOW_ROLE_ACTIVATION:
		case FLOW_ROLE_SAVED:
		case FLOW_ROLE_GRAD:
			s.activation_tensors++;
			break;
		case FLOW_ROLE_PARAM_GRAD:
			break;
		}
	}
	s.forward_ops = g->nforward;
	s.backward_ops = g->nops - g->nforward;
	*stats_out = s;
}

/* 7400000 -> "7.4M"; below 1000 the exact count. */
static void format_count(size_t n, char *buf, size_t cap)
{
	static const char suffix[] = "KMGTPE";
	double v = (double)n;
	int k = -1;

	if (n < 1000) {
		snprintf(buf, cap, "%zu", n);
		return;
	}
	while (v >= 1000.0 && k < 5) {
		v /= 1000.0;
		k++;
	}
	snprintf(buf, cap, "%.1f%c", v, suffix[k]);
}

static void format_init(const flow_init_t *init, char *buf, size_t cap)
{
	char rows[40] = "";

	if (init->rows > 0)
		snprintf(rows, sizeof(rows), "rows=%lld", (long long)init->rows);
	switch (init->kind) {
	case FLOW_INIT_NONE:
		snprintf(buf, cap, "init=none");
		break;
	case FLOW_INIT_ZEROS:
		snprintf(buf, cap, "init=zeros");
		break;
	case FLOW_INIT_ONES:
		snprintf(buf, cap, "init=ones%s%s%s", rows[0] ? "(" : "", rows,
			 rows[0] ? ")" : "");
		break;
	case FLOW_INIT_NORMAL:
		snprintf(buf, cap, "init=normal(%g%s%s)", (double)init->std,
			 rows[0] ? "," : "", rows);
		break;
	default:
		snprintf(buf, cap, "init=%d", (int)init->kind);
		break;
	}
}

/* "param      wte                     f32 (320,128)   init=... decay" */
static void print_tensor_line(const flow_graph_t *g, int i, FILE *out)
{
	const flow_graph_tensor_t *t = &g->tensors[i];
	flow_shape_text_t shape = flow_shape_text(&t->shape);
	char init[96];

	fprintf(out, "%-10s %-23s %s ", flow_role_name(t->role), t->name,
		flow_dtype_name(t->dtype));
	if (t->role != FLOW_ROLE_PARAM) {
		fprintf(out, "%s\n", shape.s);
		return;
	}
	format_init(&t->init, init, sizeof(init));
	fprintf(out, "%-11s %s%s\n", shape.s, init, t->decay ? " decay" : "");
}

/* An op's output: at its first writer a transient tensor is declared with
 * its dtype, shape and (with a plan) arena offset; elsewhere just named. */
static void print_output(const flow_graph_t *g, const flow_memplan_t *plan,
			 int op, int i, FILE *out)
{
	const flow_graph_tensor_t *t;

	if (i < 0) {
		fputs("-", out);
		return;
	}
	t = &g->tensors[i];
	fputs(t->name, out);
	if (t->producer != op || t->role == FLOW_ROLE_PARAM_GRAD ||
	    t->role == FLOW_ROLE_INPUT)
		return;
	fprintf(out, " %s %s", flow_dtype_name(t->dtype),
		flow_shape_text(&t->shape).s);
	if (plan && (size_t)i < plan->ntensors && plan->offset[i] != SIZE_MAX)
		fprintf(out, " @%zu", plan->offset[i]);
	if (t->alias_of >= 0)
		fprintf(out, " alias=%s", g->tensors[t->alias_of].name);
}

/* "op  3  matmul       h.0.attn.c_attn  (x, w, b) -> (out f32 (8,64,384))" */
static void print_op_line(const flow_graph_t *g, const flow_memplan_t *plan,
			  int i, FILE *out)
{
	const flow_graph_op_t *op = &g->ops[i];

	fprintf(out, "op %2d  %-12s %s  (", i, flow_op_def(op->kind)->name,
		op->name);
	for (int k = 0; k < op->nin; k++)
		fprintf(out, "%s%s", k ? ", " : "",
			op->in[k] >= 0 ? g->tensors[op->in[k]].name : "-");
	fputs(") -> (", out);
	for (int k = 0; k < op->nout; k++) {
		if (k)
			fputs(", ", out);
		print_output(g, plan, i, op->out[k], out);
	}
	fputs(")\n", out);
}

flow_err_t flow_graph_print(const flow_graph_t *g,
			    const struct flow_memplan *plan, FILE *out,
			    flow_diag_t *diag)
{
	flow_graph_stats_t s;
	char elems[32];

	flow_graph_get_stats(g, &s);
	format_count(s.param_elems, elems, sizeof(elems));
	fprintf(out,
		"# flow graph 1: %zu params (%s elements), %zu inputs, %zu "
		"forward ops, %zu backward ops",
		s.params, elems, s.inputs, s.forward_ops, s.backward_ops);
	if (plan)
		fprintf(out,
			"; arena %zu bytes (unshared %zu), persistent %zu "
			"bytes, scratch %zu bytes",
			plan->arena_bytes, plan->unshared_bytes,
			plan->persistent_bytes, plan->scratch_bytes);
	fputc('\n', out);
	for (size_t t = 0; t < g->ntensors; t++) {
		flow_role_t role = g->tensors[t].role;
		if (role == FLOW_ROLE_PARAM || role == FLOW_ROLE_INPUT ||
		    role == FLOW_ROLE_PARAM_GRAD)
			print_tensor_line(g, (int)t, out);
	}
	for (size_t i = 0; i < g->nops; i++)
		print_op_line(g, plan, (int)i, out);
	if (ferror(out))
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot write the graph");
	return FLOW_OK;
}
