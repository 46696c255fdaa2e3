/* reshape: y holds the elements of x, in the same row-major order, in
 * another shape.  Signature only (no graph op): plans can reason about
 * models written with it.  Its grouping rule, flow_sig_reshape_map, also
 * serves the ops whose per-row outputs are flattened (layernorm's
 * statistics, cross-entropy's losses).
 *
 * Per mesh axis:
 *   split    x S(i) -> y S(j), for each pair the grouping rule gives
 *   partial  x P    -> y P */
#include <config.h>

#include "ops_internal.h"

/* The axes of s with more than one element (size-1 axes carry nothing to
 * split), in order; returns their count. */
static int reshape_squeeze(const flow_shape_t *s, int axes_out[FLOW_MAX_DIMS])
{
	int n = 0;

	for (int i = 0; i < s->ndim; i++)
		if (s->dims[i] != 1)
			axes_out[n++] = i;
	return n;
}

void flow_sig_reshape_map(const flow_shape_t *x, const flow_shape_t *y,
			  int64_t axis_size, int map_out[FLOW_MAX_DIMS])
{
	int xa[FLOW_MAX_DIMS], ya[FLOW_MAX_DIMS];
	int nx = reshape_squeeze(x, xa), ny = reshape_squeeze(y, ya);
	int i = nx - 1, j = ny - 1;

	for (int k = 0; k < FLOW_MAX_DIMS; k++)
		map_out[k] = -1;
	/* An empty tensor has nothing to split (and products of 0 would
	 * close groups anywhere). */
	for (int k = 0; k < nx; k++)
		if (x->dims[xa[k]] == 0)
			return;
	/* Walk from the innermost axes, growing the side with the smaller
	 * running product until both agree: the axes taken since the last
	 * agreement form a group holding the same elements on both sides,
	 * and only its outermost axes split into the same ranges. */
	while (i >= 0 && j >= 0) {
		int64_t px = x->dims[xa[i]], py = y->dims[ya[j]];

		while (px != py) {
			if (px < py) {
				if (--i < 0)
					return;
				if (__builtin_mul_overflow(px, x->dims[xa[i]],
							   &px))
					return;
			} else {
				if (--j < 0)
					return;
				if (__builtin_mul_overflow(py, y->dims[ya[j]],
							   &py))
					return;
			}
		}
		int64_t ex = x->dims[xa[i]], ey = y->dims[ya[j]];

		if (ex == ey || (axis_size > 0 && ex % axis_size == 0 &&
				 ey % axis_size == 0))
			map_out[xa[i]] = ya[j];
		i--;
		j--;
	}
}

enum { RS_X };
enum { RS_Y };

static flow_err_t reshape_sig_rule(const flow_sig_query_t *q,
				   flow_sig_builder_t *b, flow_diag_t *diag)
{
	const flow_shape_t *x = &q->in[RS_X], *y = &q->out[RS_Y];
	int64_t nx, ny;
	int map[FLOW_MAX_DIMS];
	flow_sig_t *s;

	if (!flow_sig_numel(x, &nx) || !flow_sig_numel(y, &ny) || nx != ny)
		return flow_sig_bad(q, diag,
				    "y %s does not hold the elements of x %s",
				    flow_shape_text(y).s, flow_shape_text(x).s);
	flow_sig_reshape_map(x, y, q->axis_size, map);
	for (int i = 0; i < x->ndim; i++) {
		if (map[i] < 0)
			continue;
		s = flow_sig_push(b, "split");
		s->in[RS_X] = FLOW_SIG_S(i);
		s->out[RS_Y] = FLOW_SIG_S(map[i]);
	}
	s = flow_sig_push(b, "partial");
	s->in[RS_X] = s->out[RS_Y] = FLOW_SIG_P;
	return FLOW_OK;
}

static const flow_sig_op_t reshape_sig = {
	.nin = 1,
	.nin_min = 1,
	.nout = 1,
	.nout_min = 1,
	.in_names = { "x" },
	.out_names = { "y" },
	.rule = reshape_sig_rule,
};

/* ---- registry entries (lib/ops/registry.c) ------------------------------- */

const flow_op_info_t flow_op_reshape_info = {
	.def = { .kind = FLOW_OP_RESHAPE, .name = "reshape" },
	.sig = &reshape_sig,
};
