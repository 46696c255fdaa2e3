/* Live ranges and memory planning: every transient tensor (activation,
 * saved, gradient) gets an offset in one arena, shared with tensors whose
 * live ranges do not overlap.  Greedy: largest first, each at the lowest
 * 64-byte aligned offset free over its whole range.  The op pairs the
 * executor runs as one kernel count as one op. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <flow/graph.h>
#include <flow/ops.h>

#include "graph_internal.h"

/* Params and inputs live through the whole step; any other tensor from
 * the first op that writes it. */
static void range_start(const flow_graph_t *g, int t, int *first, int *last)
{
	flow_role_t role = g->tensors[t].role;
	bool persistent = role == FLOW_ROLE_PARAM || role == FLOW_ROLE_INPUT;

	*first = persistent && g->nops ? 0 : -1;
	*last = persistent ? (int)g->nops - 1 : -1;
}

bool flow_graph_fused_with_next(const flow_graph_t *g, size_t i)
{
	if (i + 1 >= g->nops)
		return false;
	const flow_graph_op_t *p = &g->ops[i], *q = &g->ops[i + 1];
	if (p->attrs.split_axes || q->attrs.split_axes)
		return false;
	if (i + 1 < g->nforward)
		return ((p->kind == FLOW_OP_ADD && q->kind == FLOW_OP_LAYERNORM) ||
			(p->kind == FLOW_OP_MATMUL && q->kind == FLOW_OP_GELU)) &&
		       q->in[0] == p->out[0];
	return i >= g->nforward && p->kind == FLOW_OP_LAYERNORM_BACKWARD &&
	       q->kind == FLOW_OP_ADD_BACKWARD && p->out[0] >= 0 &&
	       q->in[0] == p->out[0];
}

/* Op i reads the tensor, or writes it when writes.  A fused pair is one
 * op here: touching either op is touching both, so the pair's tensors
 * never share storage and its kernel may write the second op's outputs
 * while it still reads the first op's tensors. */
static void range_touch(const flow_graph_t *g, size_t i, bool writes,
			int *first, int *last)
{
	int begin = i > 0 && flow_graph_fused_with_next(g, i - 1) ? (int)i - 1
								  : (int)i;
	int end = flow_graph_fused_with_next(g, i) ? (int)i + 1 : (int)i;

	if (writes && *first < 0)
		*first = begin;
	if (*last < end)
		*last = end;
}

void flow_graph_live_ranges(const flow_graph_t *g, int *first, int *last)
{
	for (size_t t = 0; t < g->ntensors; t++)
		range_start(g, (int)t, &first[t], &last[t]);
	for (size_t i = 0; i < g->nops; i++) {
		const flow_graph_op_t *op = &g->ops[i];

		for (int k = 0; k < op->nin; k++)
			if (op->in[k] >= 0)
				range_touch(g, i, false, &first[op->in[k]],
					    &last[op->in[k]]);
		for (int k = 0; k < op->nout; k++)
			if (op->out[k] >= 0)
				range_touch(g, i, true, &first[op->out[k]],
					    &last[op->out[k]]);
	}
}

void flow_graph_live_range(const flow_graph_t *g, int t, int *first_out,
			   int *last_out)
{
	int first, last;

	range_start(g, t, &first, &last);
	for (size_t i = 0; i < g->nops; i++) {
		const flow_graph_op_t *op = &g->ops[i];

		for (int k = 0; k < op->nin; k++)
			if (op->in[k] == t)
				range_touch(g, i, false, &first, &last);
		for (int k = 0; k < op->nout; k++)
			if (op->out[k] == t)
				range_touch(g, i, true, &first, &last);
	}
	*first_out = first;
	*last_out = last;
}

static bool planned(const flow_graph_tensor_t *t)
{
	return t->alias_of < 0 && (t->role == FLOW_ROLE_ACTIVATION ||
				   t->role == FLOW_ROLE_SAVED ||
				   t->role == FLOW_ROLE_GRAD);
}

/* Planning order: larger first, then by index, so the plan depends only on
 * the graph. */
typedef struct plan_item {
	int t;
	size_t bytes;
} plan_item_t;

static int cmp_larger_first(const void *pa, const void *pb)
{
	const plan_item_t *a = pa, *b = pb;

	if (a->bytes != b->bytes)
		return a->bytes > b->bytes ? -1 : 1;
	return (a->t > b->t) - (a->t < b->t);
}

/* Byte intervals already taken during the range being placed. */
typedef struct interval {
	size_t start, end;
} interval_t;

static int cmp_start(const void *pa, const void *pb)
{
	const interval_t *a = pa, *b = pb;

	return (a->start > b->start) - (a->start < b->start);
}

static bool ranges_overlap(const int *first, const int *last, int a, int b)
{
	return first[a] >= 0 && first[b] >= 0 && first[a] <= last[b] &&
	       first[b] <= last[a];
}

/* The lowest offset where bytes fit between the taken intervals. */
static size_t lowest_fit(interval_t *taken, size_t ntaken, size_t bytes)
{
	size_t at = 0;

	qsort(taken, ntaken, sizeof(*taken), cmp_start);
	for (size_t i = 0; i < ntaken; i++) {
		if (taken[i].start >= at + bytes)
			break;
		if (taken[i].end > at)
			at = taken[i].end;
	}
	return at;
}

flow_err_t flow_memplan_build(const flow_graph_t *g, flow_memplan_t *plan_out,
			      flow_diag_t *diag)
{
	size_t n = g->ntensors, nitems = 0, persistent = 0, unshared = 0;
	size_t arena = 0, scratch = 0;
	size_t *offset = malloc((n ? n : 1) * sizeof(*offset));
	int *first = malloc((n ? n : 1) * sizeof(*first));
	int *last = malloc((n ? n : 1) * sizeof(*last));
	plan_item_t *items = malloc((n ? n : 1) * sizeof(*items));
	interval_t *taken = malloc((n ? n : 1) * sizeof(*taken));
	flow_err_t err = FLOW_OK;

	if (!offset || !first || !last || !items || !taken) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM,
				    "out of memory planning %zu tensors", n);
		goto out_free;
	}
	flow_graph_live_ranges(g, first, last);
	for (size_t t = 0; t < n; t++) {
		const flow_graph_tensor_t *x = &g->tensors[t];
		size_t bytes = flow_graph_align(flow_graph_tensor_bytes(g, (int)t));
		int a = x->alias_of;

		offset[t] = SIZE_MAX;
		/* Storage shared in place lives as long as its last user. */
		if (a >= 0 && first[t] >= 0) {
			if (first[a] < 0 || first[t] < first[a])
				first[a] = first[t];
			if (last[t] > last[a])
				last[a] = last[t];
		}
		if (x->role == FLOW_ROLE_PARAM || x->role == FLOW_ROLE_INPUT ||
		    x->role == FLOW_ROLE_PARAM_GRAD) {
			if (!flow_add_size(persistent, bytes, &persistent))
				goto out_too_large;
		} else if (planned(x)) {
			if (!flow_add_size(unshared, bytes, &unshared))
				goto out_too_large;
			items[nitems++] = (plan_item_t){ (int)t, bytes };
		}
	}
	/* The per-token losses are read after the pass (the step's loss). */
	if (g->loss >= 0 && first[g->loss] >= 0)
		last[g->loss] = (int)g->nops - 1;

	/* Every offset is below the sum of the sizes placed before it, so
	 * with unshared checked above nothing below can overflow. */
	qsort(items, nitems, sizeof(*items), cmp_larger_first);
	for (size_t i = 0; i < nitems; i++) {
		int t = items[i].t;
		size_t ntaken = 0;

		for (size_t j = 0; j < i; j++) {
			int u = items[j].t;
			if (items[j].bytes && ranges_overlap(first, last, t, u))
				taken[ntaken++] = (interval_t){
					offset[u], offset[u] + items[j].bytes
				};
		}
		offset[t] = lowest_fit(taken, ntaken, items[i].bytes);
		if (offset[t] + items[i].bytes > arena)
			arena = offset[t] + items[i].bytes;
	}
	for (size_t t = 0; t < n; t++)
		if (g->tensors[t].alias_of >= 0)
			offset[t] = offset[g->tensors[t].alias_of];
	for (size_t i = 0; i < g->nops; i++) {
		size_t s = flow_op_def(g->ops[i].kind)->scratch(g, &g->ops[i]);
		if (s > scratch)
			scratch = s;
	}

	*plan_out = (flow_memplan_t){
		.ntensors = n,
		.offset = offset,
		.arena_bytes = arena,
		.unshared_bytes = unshared,
		.persistent_bytes = persistent,
		.scratch_bytes = scratch,
	};
	offset = NULL;
	goto out_free;

out_too_large:
	err = flow_diag_set(diag, FLOW_ERR_RANGE,
			    "the graph's tensors take more bytes than memory "
			    "can address");
out_free:
	free(taken);
	free(items);
	free(last);
	free(first);
	free(offset);
	return err;
}

void flow_memplan_release(flow_memplan_t *plan)
{
	if (!plan)
		return;
	free(plan->offset);
	memset(plan, 0, sizeof(*plan));
}
