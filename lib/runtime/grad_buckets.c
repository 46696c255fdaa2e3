/* Gradient buckets (flow/grad_buckets.h): each selected parameter
 * gradient's ready point from the backward ops' outputs, then a greedy
 * packing in ready order. */
#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include <flow/grad_buckets.h>

/* flow_graph_backward has run: it appends backward ops and gives every
 * parameter a gradient (one that no op writes when the parameter does not
 * reach the loss), so either shows. */
static bool differentiated(const flow_graph_t *g)
{
	if (g->nops > g->nforward)
		return true;
	for (size_t t = 0; t < g->ntensors; t++)
		if (g->tensors[t].grad >= 0)
			return true;
	return false;
}

static bool selected(const flow_graph_t *g, const bool *select, size_t t)
{
	if (select)
		return select[t];
	return g->tensors[t].role == FLOW_ROLE_PARAM &&
	       g->tensors[t].grad >= 0;
}

/* The selection's refusals, in tensor order so the first is reported. */
static flow_err_t check_selection(const flow_graph_t *g, const bool *select,
				  flow_diag_t *diag)
{
	if (!select)
		return FLOW_OK;
	for (size_t t = 0; t < g->ntensors; t++) {
		const flow_graph_tensor_t *gt = &g->tensors[t];
		if (!select[t])
			continue;
		if (gt->role != FLOW_ROLE_PARAM)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "cannot bucket the gradient of '%s': not a parameter (role %s)",
					     gt->name, flow_role_name(gt->role));
		if (gt->grad < 0 || (size_t)gt->grad >= g->ntensors ||
		    g->tensors[gt->grad].role != FLOW_ROLE_PARAM_GRAD)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "cannot bucket the gradient of parameter '%s': it has none",
					     gt->name);
	}
	return FLOW_OK;
}

/* Ready order: ready point ascending, then the parameter's index
 * descending.  Parameters are distinct, so the order is total and qsort's
 * instability cannot make two ranks disagree. */
static int cmp_ready(const void *pa, const void *pb)
{
	const flow_grad_bucket_member_t *a = pa, *b = pb;

	if (a->ready_op != b->ready_op)
		return a->ready_op < b->ready_op ? -1 : 1;
	return (a->param < b->param) - (a->param > b->param);
}

static bool align_up(size_t n, size_t *out)
{
	size_t r;

	if (!flow_add_size(n, FLOW_GRAD_BUCKET_ALIGN - 1, &r))
		return false;
	*out = r & ~(FLOW_GRAD_BUCKET_ALIGN - 1);
	return true;
}

/* Pack b->members (in ready order) into b->buckets, which has room for
 * one bucket per member: sets the offsets, nbuckets and every bucket.  A
 * sum that overflows size_t is past any capacity, so it only starts a new
 * bucket, and a bucket's first member ends at its own size. */
static void pack(flow_grad_buckets_t *b)
{
	flow_grad_bucket_t *cur = NULL;

	for (size_t i = 0; i < b->nmembers; i++) {
		flow_grad_bucket_member_t *m = &b->members[i];
		size_t start = 0, end = 0;
		if (!cur || !align_up(cur->bytes, &start) ||
		    !flow_add_size(start, m->bytes, &end) ||
		    end > b->capacity) {
			cur = &b->buckets[b->nbuckets++];
			cur->first = i;
			cur->count = 0;
			start = 0;
			end = m->bytes;
		}
		m->offset = start;
		cur->bytes = end;
		cur->count++;
		cur->launch_op = m->ready_op; /* members are in ready order */
	}
}

flow_err_t flow_grad_buckets_new(const flow_graph_t *g, size_t capacity,
				 const bool *select,
				 flow_grad_buckets_t **buckets_out,
				 flow_diag_t *diag)
{
	flow_grad_buckets_t *b = NULL;
	int *last_write = NULL;
	size_t n, filled = 0;
	flow_err_t err;

	if (capacity == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "gradient bucket capacity must be at least 1 byte");
	if (!differentiated(g))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot bucket gradients of a graph that is not differentiated");
	if ((err = check_selection(g, select, diag)) != FLOW_OK)
		return err;

	/* The last backward op writing each tensor.  Program order is the
	 * order the executor runs them, so the highest index wins. */
	last_write = calloc(g->ntensors ? g->ntensors : 1, sizeof *last_write);
	b = calloc(1, sizeof *b);
	if (!last_write || !b) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	for (size_t t = 0; t < g->ntensors; t++)
		last_write[t] = -1;
	for (size_t i = g->nforward; i < g->nops; i++) {
		const flow_graph_op_t *op = &g->ops[i];
		for (int k = 0; k < op->nout && k < FLOW_OP_MAX_IO; k++)
			if (op->out[k] >= 0 && (size_t)op->out[k] < g->ntensors)
				last_write[op->out[k]] = (int)i;
	}

	b->capacity = capacity;
	for (size_t t = 0; t < g->ntensors; t++)
		b->nmembers += selected(g, select, t);
	/* At most one bucket per member; calloc checks the products. */
	n = b->nmembers ? b->nmembers : 1;
	b->members = calloc(n, sizeof *b->members);
	b->buckets = calloc(n, sizeof *b->buckets);
	if (!b->members || !b->buckets) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	for (size_t t = 0; t < g->ntensors; t++) {
		if (!selected(g, select, t))
			continue;
		flow_grad_bucket_member_t *m = &b->members[filled++];
		m->param = (int)t;
		m->grad = g->tensors[t].grad;
		m->ready_op = last_write[m->grad];
		m->bytes = flow_graph_tensor_bytes(g, m->grad);
	}
	qsort(b->members, b->nmembers, sizeof *b->members, cmp_ready);
	pack(b);

	free(last_write);
	*buckets_out = b;
	return FLOW_OK;

out_free:
	flow_grad_buckets_free(b);
	free(last_write);
	return err;
}

void flow_grad_buckets_free(flow_grad_buckets_t *b)
{
	if (!b)
		return;
	free(b->members);
	free(b->buckets);
	free(b);
}

/* The first bucket whose launch_op is at least op (nbuckets when none):
 * launch_op is non-decreasing, so a binary search. */
static size_t lower_bound(const flow_grad_buckets_t *b, int op)
{
	size_t lo = 0, hi = b->nbuckets;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (b->buckets[mid].launch_op < op)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

void flow_grad_buckets_after_op(const flow_grad_buckets_t *b, int op,
				size_t *first_out, size_t *count_out)
{
	size_t first = lower_bound(b, op), end = first;

	while (end < b->nbuckets && b->buckets[end].launch_op == op)
		end++;
	*first_out = first;
	*count_out = end - first;
}

flow_err_t flow_grad_buckets_describe(const flow_grad_buckets_t *b,
				      const flow_graph_t *g, FILE *out,
				      flow_diag_t *diag)
{
	for (size_t k = 0; k < b->nbuckets; k++) {
		const flow_grad_bucket_t *bk = &b->buckets[k];
		if (bk->launch_op >= 0 && (size_t)bk->launch_op >= g->nops)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "gradient bucket %zu launches after op %d, but the graph has %zu ops",
					     k, bk->launch_op, g->nops);
		for (size_t i = bk->first; i < bk->first + bk->count; i++)
			if (b->members[i].grad < 0 ||
			    (size_t)b->members[i].grad >= g->ntensors)
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "gradient bucket %zu holds tensor %d, but the graph has %zu tensors",
						     k, b->members[i].grad,
						     g->ntensors);
	}
	for (size_t k = 0; k < b->nbuckets; k++) {
		const flow_grad_bucket_t *bk = &b->buckets[k];
		fprintf(out, "bucket %zu: %zu bytes ", k, bk->bytes);
		if (bk->launch_op >= 0)
			fprintf(out, "after op %d %s:", bk->launch_op,
				g->ops[bk->launch_op].name);
		else
			fprintf(out, "before backward:");
		for (size_t i = bk->first; i < bk->first + bk->count; i++)
			fprintf(out, " %s@%zu",
				g->tensors[b->members[i].grad].name,
				b->members[i].offset);
		fputc('\n', out);
	}
	if (ferror(out))
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot write the gradient buckets");
	return FLOW_OK;
}
