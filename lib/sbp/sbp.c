/* Meshes and their placements, SBP and nd-SBP text forms, and the local
 * boxes a layout gives each mesh position (flow(7), SBP and LOCAL SHAPES). */
#include <config.h>

#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <flow/sbp.h>

/* ---- text helpers ------------------------------------------------------------ */

/* Appends to a bounded buffer while counting the whole length, so format
 * functions can report the size they need (the snprintf convention). */
typedef struct text {
	char *buf;
	size_t cap, len;
} text_t;

static void text_add(text_t *t, const char *fmt, ...) FLOW_PRINTF(2, 3);
static void text_add(text_t *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(t->len < t->cap ? t->buf + t->len : NULL,
			  t->len < t->cap ? t->cap - t->len : 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		t->len += (size_t)n;
}

/* Reads a run of decimal digits at *p into *value_out and advances *p;
 * false when there is no digit or the value overflows int64_t. */
static bool read_digits(const char **p, int64_t *value_out)
{
	const char *s = *p;
	int64_t v = 0;
	if (!isdigit((unsigned char)*s))
		return false;
	while (isdigit((unsigned char)*s)) {
		if (__builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, *s - '0', &v))
			return false;
		s++;
	}
	*p = s;
	*value_out = v;
	return true;
}

/* Length of the token at p: up to the next ',', '(' or ')', or that one
 * character; 3 for the "end" AT prints at the end of the text. */
static int token_len(const char *p)
{
	if (!*p)
		return 3;
	size_t n = strcspn(p, ",()");
	return n ? (int)n : 1;
}

/* Where a parse stopped, for an "at %s%.*s%s" format: 'token' or end. */
#define AT(p) (*(p) ? "'" : ""), token_len(p), (*(p) ? (p) : "end"), \
	(*(p) ? "'" : "")

/* Length of the run of digits at p. */
static int digits_len(const char *p)
{
	return (int)strspn(p, "0123456789");
}

static const char *plural(int64_t n, const char *one, const char *many)
{
	return n == 1 ? one : many;
}

/* ---- meshes ------------------------------------------------------------------- */

static void row_major_strides(int ndim, const int64_t *dims, int64_t *stride)
{
	int64_t s = 1;
	for (int i = ndim - 1; i >= 0; i--) {
		stride[i] = s;
		s *= dims[i];
	}
}

/* The axes of size > 1 in decreasing stride order: index_of peels the
 * coordinates off a rank greedily in that order. */
static int axes_by_stride(const flow_mesh_t *mesh, int order[FLOW_MESH_MAX_AXES])
{
	int n = 0;
	for (int i = 0; i < mesh->ndim; i++) {
		if (mesh->dims[i] == 1)
			continue;
		int j = n++;
		while (j > 0 && mesh->stride[order[j - 1]] < mesh->stride[i]) {
			order[j] = order[j - 1];
			j--;
		}
		order[j] = i;
	}
	return n;
}

/* Checks the axis count and sizes: 1 to FLOW_MESH_MAX_AXES axes of size
 * >= 1 whose product fits int64_t.  what names the mesh in the message. */
static flow_err_t dims_validate(int ndim, const int64_t *dims,
				const char *what, flow_diag_t *diag)
{
	if (ndim < 1 || ndim > FLOW_MESH_MAX_AXES)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: %d axes; expected 1 to %d", what, ndim,
				     FLOW_MESH_MAX_AXES);
	int64_t size = 1;
	for (int i = 0; i < ndim; i++) {
		if (dims[i] < 1)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: size of axis %d must be at least 1",
					     what, i);
		if (__builtin_mul_overflow(size, dims[i], &size))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: too many ranks", what);
	}
	return FLOW_OK;
}

/* Checks the placement of a mesh with valid sizes: a base >= 0, strides
 * >= 1 that nest (each axis' stride exceeds the span of the axes with
 * smaller strides, so ranks never repeat and index_of is exact), and a top
 * rank that fits int64_t. */
static flow_err_t placement_validate(const flow_mesh_t *mesh, const char *what,
				     flow_diag_t *diag)
{
	if (mesh->base < 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: negative rank %" PRId64, what,
				     mesh->base);
	int64_t top = mesh->base;
	for (int i = 0; i < mesh->ndim; i++) {
		int64_t span;
		if (mesh->stride[i] < 1)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: stride of axis %d must be at least 1",
					     what, i);
		if (__builtin_mul_overflow(mesh->dims[i] - 1, mesh->stride[i],
					   &span) ||
		    __builtin_add_overflow(top, span, &top))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: ranks beyond %" PRId64, what,
					     INT64_MAX);
	}
	int order[FLOW_MESH_MAX_AXES];
	int n = axes_by_stride(mesh, order);
	int64_t span = 0;
	for (int k = n - 1; k >= 0; k--) {
		int a = order[k];
		if (mesh->stride[a] <= span)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: strides overlap: axis %d's stride %" PRId64
					     " repeats ranks of the axes with smaller strides",
					     what, a, mesh->stride[a]);
		span += mesh->stride[a] * (mesh->dims[a] - 1);
	}
	return FLOW_OK;
}

flow_err_t flow_mesh_init(flow_mesh_t *mesh, int ndim, const int64_t *dims,
			  int64_t base, flow_diag_t *diag)
{
	flow_err_t err = dims_validate(ndim, dims, "mesh", diag);
	if (err != FLOW_OK)
		return err;
	flow_mesh_t m;
	memset(&m, 0, sizeof(m));
	m.ndim = ndim;
	m.base = base;
	memcpy(m.dims, dims, (size_t)ndim * sizeof(*dims));
	row_major_strides(ndim, m.dims, m.stride);
	err = placement_validate(&m, "mesh", diag);
	if (err != FLOW_OK)
		return err;
	*mesh = m;
	return FLOW_OK;
}

flow_err_t flow_mesh_check(const flow_mesh_t *mesh, flow_diag_t *diag)
{
	flow_err_t err = dims_validate(mesh->ndim, mesh->dims, "mesh", diag);
	if (err != FLOW_OK)
		return err;
	char text[FLOW_MESH_TEXT_MAX], what[FLOW_MESH_TEXT_MAX + 16];
	flow_mesh_format(mesh, text, sizeof(text));
	snprintf(what, sizeof(what), "mesh '%s'", text);
	return placement_validate(mesh, what, diag);
}

static bool is_identifier(const char *s, size_t len)
{
	if (len == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
		return false;
	for (size_t i = 1; i < len; i++)
		if (!(isalnum((unsigned char)s[i]) || s[i] == '_'))
			return false;
	return true;
}

/* Reads "N[xN...]" into values; count_out is the number read.  what is
 * "size" or "stride" for the message. */
static flow_err_t parse_sizes(const char *text, const char **p,
			      const char *what, int64_t *values,
			      int *count_out, flow_diag_t *diag)
{
	int n = 0;
	for (;;) {
		const char *at = *p;
		int64_t v;
		if (!read_digits(p, &v)) {
			if (isdigit((unsigned char)*at))
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "mesh '%s': %s '%.*s' is too large",
						     text, what, digits_len(at), at);
			if (n > 0)
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "mesh '%s': expected a %s after 'x'",
						     text, what);
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "mesh '%s': expected a %s at %s%.*s%s",
					     text, what, AT(at));
		}
		if (n == FLOW_MESH_MAX_AXES)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "mesh '%s': more than %d axes", text,
					     FLOW_MESH_MAX_AXES);
		values[n++] = v;
		if (**p != 'x')
			break;
		(*p)++;
	}
	*count_out = n;
	return FLOW_OK;
}

static flow_err_t parse_names(const char *text, const char **p,
			      flow_mesh_t *m, flow_diag_t *diag)
{
	int n = 0;
	for (;;) {
		const char *start = *p;
		size_t len = strcspn(start, ",@");
		*p = start + len;
		if (!is_identifier(start, len))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "mesh '%s': invalid axis name '%.*s'",
					     text, (int)len, start);
		if (len >= FLOW_MESH_NAME_MAX)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "mesh '%s': axis name '%.*s' is longer than %d characters",
					     text, (int)len, start,
					     FLOW_MESH_NAME_MAX - 1);
		if (n < FLOW_MESH_MAX_AXES) {
			for (int i = 0; i < n; i++)
				if (strlen(m->names[i]) == len &&
				    memcmp(m->names[i], start, len) == 0)
					return flow_diag_set(diag, FLOW_ERR_USAGE,
							     "mesh '%s': duplicate axis name '%.*s'",
							     text, (int)len, start);
			memcpy(m->names[n], start, len);
			m->names[n][len] = '\0';
		}
		n++;
		if (**p != ',')
			break;
		(*p)++;
	}
	if (n != m->ndim)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "mesh '%s': %d %s for %d %s", text, n,
				     plural(n, "name", "names"), m->ndim,
				     plural(m->ndim, "axis", "axes"));
	return FLOW_OK;
}

flow_err_t flow_mesh_parse(const char *text, flow_mesh_t *mesh_out,
			   flow_diag_t *diag)
{
	flow_mesh_t m;
	memset(&m, 0, sizeof(m));
	const char *p = text;
	char what[FLOW_MESH_TEXT_MAX + 16];
	snprintf(what, sizeof(what), "mesh '%s'", text);
	flow_err_t err = parse_sizes(text, &p, "size", m.dims, &m.ndim, diag);
	if (err == FLOW_OK)
		err = dims_validate(m.ndim, m.dims, what, diag);
	if (err != FLOW_OK)
		return err;
	row_major_strides(m.ndim, m.dims, m.stride);
	if (*p == ':') {
		p++;
		err = parse_names(text, &p, &m, diag);
		if (err != FLOW_OK)
			return err;
	}
	if (*p == '@') {
		p++;
		const char *at = p;
		bool negative = *p == '-';
		if (negative)
			p++;
		if (!read_digits(&p, &m.base)) {
			if (isdigit((unsigned char)*p))
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "mesh '%s': rank '%.*s' is too large",
						     text, digits_len(p), p);
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "mesh '%s': expected a rank at %s%.*s%s",
					     text, AT(at));
		}
		if (negative)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "mesh '%s': negative rank '-%" PRId64 "'",
					     text, m.base);
		if (*p == '/') {
			p++;
			int n;
			err = parse_sizes(text, &p, "stride", m.stride, &n, diag);
			if (err != FLOW_OK)
				return err;
			if (n != m.ndim)
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "mesh '%s': %d %s for %d %s",
						     text, n,
						     plural(n, "stride", "strides"),
						     m.ndim,
						     plural(m.ndim, "axis", "axes"));
		}
	}
	if (*p)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "mesh '%s': unexpected text at '%s'", text,
				     p);
	err = placement_validate(&m, what, diag);
	if (err != FLOW_OK)
		return err;
	*mesh_out = m;
	return FLOW_OK;
}

static bool mesh_row_major(const flow_mesh_t *mesh)
{
	int64_t rm[FLOW_MESH_MAX_AXES];
	row_major_strides(mesh->ndim, mesh->dims, rm);
	for (int i = 0; i < mesh->ndim; i++)
		if (rm[i] != mesh->stride[i])
			return false;
	return true;
}

size_t flow_mesh_format(const flow_mesh_t *mesh, char *buf, size_t cap)
{
	text_t t = { buf, cap, 0 };
	if (cap > 0)
		buf[0] = '\0';
	for (int i = 0; i < mesh->ndim; i++)
		text_add(&t, "%s%" PRId64, i ? "x" : "", mesh->dims[i]);
	bool named = false;
	for (int i = 0; i < mesh->ndim; i++)
		named = named || mesh->names[i][0];
	for (int i = 0; named && i < mesh->ndim; i++)
		text_add(&t, "%s%s", i ? "," : ":", mesh->names[i]);
	bool row_major = mesh_row_major(mesh);
	if (mesh->base != 0 || !row_major)
		text_add(&t, "@%" PRId64, mesh->base);
	for (int i = 0; !row_major && i < mesh->ndim; i++)
		text_add(&t, "%s%" PRId64, i ? "x" : "/", mesh->stride[i]);
	return t.len;
}

bool flow_mesh_equal(const flow_mesh_t *a, const flow_mesh_t *b)
{
	if (a->ndim != b->ndim || a->base != b->base)
		return false;
	for (int i = 0; i < a->ndim; i++)
		if (a->dims[i] != b->dims[i] || a->stride[i] != b->stride[i] ||
		    strcmp(a->names[i], b->names[i]) != 0)
			return false;
	return true;
}

int64_t flow_mesh_size(const flow_mesh_t *mesh)
{
	int64_t n = 1;
	for (int i = 0; i < mesh->ndim; i++)
		n *= mesh->dims[i];
	return n;
}

int flow_mesh_axis(const flow_mesh_t *mesh, const char *name)
{
	for (int i = 0; i < mesh->ndim; i++)
		if (mesh->names[i][0] && strcmp(mesh->names[i], name) == 0)
			return i;
	return -1;
}

void flow_mesh_coords(const flow_mesh_t *mesh, int64_t index,
		      int64_t coords_out[FLOW_MESH_MAX_AXES])
{
	for (int i = mesh->ndim - 1; i >= 0; i--) {
		coords_out[i] = index % mesh->dims[i];
		index /= mesh->dims[i];
	}
}

int64_t flow_mesh_index(const flow_mesh_t *mesh, const int64_t *coords)
{
	int64_t index = 0;
	for (int i = 0; i < mesh->ndim; i++)
		index = index * mesh->dims[i] + coords[i];
	return index;
}

int64_t flow_mesh_rank(const flow_mesh_t *mesh, int64_t index)
{
	if (index < 0 || index >= flow_mesh_size(mesh))
		return -1;
	int64_t c[FLOW_MESH_MAX_AXES];
	flow_mesh_coords(mesh, index, c);
	int64_t rank = mesh->base;
	for (int i = 0; i < mesh->ndim; i++)
		rank += c[i] * mesh->stride[i];
	return rank;
}

int64_t flow_mesh_top_rank(const flow_mesh_t *mesh)
{
	int64_t top = mesh->base;

	for (int a = 0; a < mesh->ndim; a++)
		top += (mesh->dims[a] - 1) * mesh->stride[a];
	return top;
}

int64_t flow_mesh_index_of(const flow_mesh_t *mesh, int64_t rank)
{
	int order[FLOW_MESH_MAX_AXES];
	int n = axes_by_stride(mesh, order);
	int64_t c[FLOW_MESH_MAX_AXES] = { 0 };
	int64_t r = rank - mesh->base;
	if (r < 0)
		return -1;
	/* Strides nest, so the largest stride's coordinate is r / stride. */
	for (int k = 0; k < n; k++) {
		int a = order[k];
		c[a] = r / mesh->stride[a];
		if (c[a] >= mesh->dims[a])
			return -1;
		r -= c[a] * mesh->stride[a];
	}
	return r == 0 ? flow_mesh_index(mesh, c) : -1;
}

void flow_mesh_group(const flow_mesh_t *mesh, unsigned axes_mask,
		     int64_t index, flow_mesh_t *group_out)
{
	flow_mesh_t g;
	memset(&g, 0, sizeof(g));
	int64_t c[FLOW_MESH_MAX_AXES];
	flow_mesh_coords(mesh, index, c);
	g.base = mesh->base;
	for (int i = 0; i < mesh->ndim; i++) {
		if (!(axes_mask & (1u << i))) {
			g.base += c[i] * mesh->stride[i];
			continue;
		}
		g.dims[g.ndim] = mesh->dims[i];
		g.stride[g.ndim] = mesh->stride[i];
		memcpy(g.names[g.ndim], mesh->names[i], FLOW_MESH_NAME_MAX);
		g.ndim++;
	}
	if (g.ndim == 0) { /* no axis: the position alone */
		g.ndim = 1;
		g.dims[0] = 1;
		g.stride[0] = 1;
	}
	*group_out = g;
}

/* ---- SBP ---------------------------------------------------------------------- */

bool flow_sbp_equal(flow_sbp_t a, flow_sbp_t b)
{
	return a.kind == b.kind &&
	       (a.kind != FLOW_SBP_SPLIT || a.axis == b.axis);
}

bool flow_nd_sbp_equal(const flow_nd_sbp_t *a, const flow_nd_sbp_t *b)
{
	if (a->ndim != b->ndim)
		return false;
	for (int i = 0; i < a->ndim; i++)
		if (!flow_sbp_equal(a->sbp[i], b->sbp[i]))
			return false;
	return true;
}

static flow_err_t parse_one_sbp(const char *text, const char **p,
				flow_sbp_t *sbp, flow_diag_t *diag)
{
	const char *at = *p;
	if (*at == 'B' || *at == 'P') {
		sbp->kind = *at == 'B' ? FLOW_SBP_BROADCAST : FLOW_SBP_PARTIAL;
		sbp->axis = 0;
		(*p)++;
		return FLOW_OK;
	}
	if (at[0] != 'S' || at[1] != '(')
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "nd-SBP '%s': expected S(k), B or P at %s%.*s%s",
				     text, AT(at));
	*p = at + 2;
	const char *dim_at = *p;
	int64_t k;
	if (!read_digits(p, &k) || k >= FLOW_MAX_DIMS) {
		if (isdigit((unsigned char)*dim_at))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "nd-SBP '%s': split dimension '%.*s' is not below %d",
					     text, digits_len(dim_at), dim_at,
					     FLOW_MAX_DIMS);
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "nd-SBP '%s': expected a dimension at %s%.*s%s",
				     text, AT(dim_at));
	}
	if (**p != ')')
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "nd-SBP '%s': expected ')' at %s%.*s%s", text,
				     AT(*p));
	(*p)++;
	sbp->kind = FLOW_SBP_SPLIT;
	sbp->axis = (int)k;
	return FLOW_OK;
}

flow_err_t flow_nd_sbp_parse(const char *text, flow_nd_sbp_t *sbp_out,
			     flow_diag_t *diag)
{
	flow_nd_sbp_t s;
	memset(&s, 0, sizeof(s));
	const char *p = text;
	flow_err_t err;
	if (*p != '(') {
		s.ndim = 1;
		err = parse_one_sbp(text, &p, &s.sbp[0], diag);
		if (err != FLOW_OK)
			return err;
	} else {
		p++;
		for (;;) {
			if (s.ndim == FLOW_MESH_MAX_AXES)
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "nd-SBP '%s': more than %d axes",
						     text, FLOW_MESH_MAX_AXES);
			err = parse_one_sbp(text, &p, &s.sbp[s.ndim++], diag);
			if (err != FLOW_OK)
				return err;
			if (*p == ')')
				break;
			if (*p != ',')
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "nd-SBP '%s': expected ',' or ')' at %s%.*s%s",
						     text, AT(p));
			p++;
			while (*p == ' ')
				p++;
		}
		p++;
	}
	if (*p)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "nd-SBP '%s': unexpected text at '%s'",
				     text, p);
	*sbp_out = s;
	return FLOW_OK;
}

static void sbp_add(text_t *t, flow_sbp_t s)
{
	switch (s.kind) {
	case FLOW_SBP_SPLIT: text_add(t, "S(%d)", s.axis); break;
	case FLOW_SBP_BROADCAST: text_add(t, "B"); break;
	case FLOW_SBP_PARTIAL: text_add(t, "P"); break;
	default: text_add(t, "?"); break;
	}
}

size_t flow_nd_sbp_format(const flow_nd_sbp_t *sbp, char *buf, size_t cap)
{
	text_t t = { buf, cap, 0 };
	if (cap > 0)
		buf[0] = '\0';
	text_add(&t, "(");
	for (int i = 0; i < sbp->ndim; i++) {
		if (i)
			text_add(&t, ",");
		sbp_add(&t, sbp->sbp[i]);
	}
	text_add(&t, ")");
	return t.len;
}

void flow_nd_sbp_fill(flow_nd_sbp_t *sbp, int ndim, flow_sbp_t one)
{
	memset(sbp, 0, sizeof(*sbp));
	sbp->ndim = ndim;
	for (int i = 0; i < ndim; i++)
		sbp->sbp[i] = one;
}

/* ---- local shapes ------------------------------------------------------------- */

void flow_split_part(int64_t n, int64_t k, int64_t i, int64_t *start_out,
		     int64_t *size_out)
{
	int64_t base = n / k, extra = n % k;
	*start_out = i * base + (i < extra ? i : extra);
	*size_out = base + (i < extra);
}

flow_err_t flow_nd_sbp_check(const flow_shape_t *shape,
			     const flow_nd_sbp_t *sbp, const flow_mesh_t *mesh,
			     flow_diag_t *diag)
{
	/* The checks run first and the message is composed only for a
	 * caller that wants it: the planner tests thousands of layouts. */
	enum { OK, COUNT, KIND, DIM, SMALL } problem = OK;
	int axis = 0;
	int64_t left = 0;
	int64_t extent[FLOW_MAX_DIMS];
	for (int d = 0; d < shape->ndim; d++)
		extent[d] = shape->dims[d];
	if (sbp->ndim != mesh->ndim)
		problem = COUNT;
	for (int i = 0; problem == OK && i < sbp->ndim; i++) {
		flow_sbp_t s = sbp->sbp[i];
		axis = i;
		if (s.kind == FLOW_SBP_BROADCAST || s.kind == FLOW_SBP_PARTIAL)
			continue;
		if (s.kind != FLOW_SBP_SPLIT || s.axis < 0) {
			problem = KIND;
		} else if (s.axis >= shape->ndim) {
			problem = DIM;
		} else if (extent[s.axis] < mesh->dims[i]) {
			problem = SMALL;
			left = extent[s.axis];
		} else {
			/* The last part is the smallest, so following it
			 * checks what every position has left. */
			int64_t start;
			flow_split_part(extent[s.axis], mesh->dims[i], mesh->dims[i] - 1,
					&start, &extent[s.axis]);
		}
	}
	if (problem == OK)
		return FLOW_OK;
	if (!diag)
		return FLOW_ERR_USAGE;
	char s_text[FLOW_SBP_TEXT_MAX], m_text[FLOW_MESH_TEXT_MAX];
	char shape_text[FLOW_MAX_DIMS * 21 + 3];
	flow_nd_sbp_format(sbp, s_text, sizeof(s_text));
	flow_mesh_format(mesh, m_text, sizeof(m_text));
	flow_shape_format(shape, shape_text, sizeof(shape_text));
	int k = sbp->sbp[axis].axis;
	switch (problem) {
	case COUNT:
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s on %s: %d %s for %d mesh %s", s_text,
				     m_text, sbp->ndim,
				     plural(sbp->ndim, "SBP", "SBPs"),
				     mesh->ndim,
				     plural(mesh->ndim, "axis", "axes"));
	case KIND:
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s on %s: invalid SBP for axis %d",
				     s_text, m_text, axis);
	case DIM:
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s on %s: split dimension %d but %s has %d %s",
				     s_text, m_text, k, shape_text, shape->ndim,
				     plural(shape->ndim, "dimension", "dimensions"));
	default:
		break;
	}
	const char *unit = k == 0 ? plural(left, "row", "rows") :
				    plural(left, "element", "elements");
	char axis_text[FLOW_MESH_NAME_MAX + 8];
	if (mesh->names[axis][0])
		snprintf(axis_text, sizeof(axis_text), "'%s'", mesh->names[axis]);
	else
		snprintf(axis_text, sizeof(axis_text), "%d", axis);
	return flow_diag_set(diag, FLOW_ERR_USAGE,
			     "%s on %s: dimension %d of %s has %" PRId64
			     " %s left for %" PRId64 " %s of axis %s",
			     s_text, m_text, k, shape_text, left, unit,
			     mesh->dims[axis],
			     plural(mesh->dims[axis], "rank", "ranks"),
			     axis_text);
}

void flow_nd_sbp_local_box(const flow_shape_t *shape, const flow_nd_sbp_t *sbp,
			   const flow_mesh_t *mesh, int64_t index,
			   flow_box_t *box_out)
{
	flow_box_t box;
	memset(&box, 0, sizeof(box));
	box.ndim = shape->ndim;
	for (int d = 0; d < shape->ndim; d++)
		box.extent[d] = shape->dims[d];
	int64_t c[FLOW_MESH_MAX_AXES];
	flow_mesh_coords(mesh, index, c);
	for (int i = 0; i < sbp->ndim && i < mesh->ndim; i++) {
		int k = sbp->sbp[i].axis;
		if (sbp->sbp[i].kind != FLOW_SBP_SPLIT || k < 0 || k >= shape->ndim)
			continue;
		int64_t start;
		flow_split_part(box.extent[k], mesh->dims[i], c[i], &start,
				&box.extent[k]);
		box.start[k] += start;
	}
	*box_out = box;
}

size_t flow_nd_sbp_max_local_numel(const flow_shape_t *shape,
				   const flow_nd_sbp_t *sbp,
				   const flow_mesh_t *mesh)
{
	/* Balanced parts put the larger ones first, at every level, so
	 * position 0 holds the most. */
	flow_box_t box;
	flow_nd_sbp_local_box(shape, sbp, mesh, 0, &box);
	size_t n = 1;
	for (int d = 0; d < box.ndim; d++)
		if (!flow_mul_size(n, (size_t)box.extent[d], &n))
			return SIZE_MAX;
	return n;
}

int64_t flow_nd_sbp_copies(const flow_nd_sbp_t *sbp, const flow_mesh_t *mesh)
{
	int64_t copies = 1;
	for (int i = 0; i < sbp->ndim && i < mesh->ndim; i++)
		if (sbp->sbp[i].kind != FLOW_SBP_SPLIT)
			copies *= mesh->dims[i];
	return copies;
}
