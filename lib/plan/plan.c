/* Plans (flow/plan.h, flow-plan(5)): the text form and its parser, the
 * standard layouts by rule, and the checker that holds a plan against the
 * training graph it describes, with the boxings and per-rank memory it
 * implies.  The graph is rebuilt from the plan's model spec each time: a
 * plan names ops and tensors, the graph gives their shapes. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <flow/common.h>
#include <flow/file.h>
#include <flow/mem.h>
#include <flow/plan.h>
#include <flow/signature.h>

#include "core/textrec_internal.h"

/* Plans close with no checksum: they are written by hand as often as by
 * flow-plan, and diffed.  Only the reader's line and field handling is
 * used. */
static const flow_textrec_format_t plan_format = {
	.sep = FLOW_TEXTREC_SEP_BLANKS,
	.end_key = "end",
	.lowercase_sums = true,
	.hint_causes = false,
};

static const char *const adamw_prefix[2] = { "adamw.m/", "adamw.v/" };

const char *flow_plan_role_name(int role)
{
	if (role >= 0 && role < FLOW_ROLE_COUNT)
		return flow_role_name((flow_role_t)role);
	if (role == FLOW_PLAN_ROLE_ADAMW_M)
		return "adamw.m";
	if (role == FLOW_PLAN_ROLE_ADAMW_V)
		return "adamw.v";
	return NULL;
}

static int role_parse(const char *s)
{
	for (int r = 0; r < FLOW_PLAN_ROLE_COUNT; r++)
		if (strcmp(flow_plan_role_name(r), s) == 0)
			return r;
	return -1;
}

/* ---- lifecycle ------------------------------------------------------------ */

void flow_plan_init(flow_plan_t *plan)
{
	memset(plan, 0, sizeof(*plan));
	snprintf(plan->recompute, sizeof(plan->recompute), "none");
	plan->grad_accum = 1;
}

void flow_plan_release(flow_plan_t *plan)
{
	if (!plan)
		return;
	free(plan->stages);
	free(plan->ops);
	free(plan->tensors);
	plan->stages = NULL;
	plan->ops = NULL;
	plan->tensors = NULL;
	plan->nstages = plan->nops = plan->ntensors = 0;
}

void flow_plan_free(flow_plan_t *plan)
{
	flow_plan_release(plan);
	free(plan);
}

/* Grow *arr (of *n elements, capacity *cap) by one zeroed element. */
static void *push(void **arr, size_t *n, size_t *cap, size_t size)
{
	if (*n == *cap) {
		size_t ncap = *cap ? *cap * 2 : 64, bytes;
		void *p;

		if (!flow_mul_size(ncap, size, &bytes))
			return NULL;
		p = realloc(*arr, bytes);
		if (!p)
			return NULL;
		*arr = p;
		*cap = ncap;
	}
	char *e = (char *)*arr + (*n)++ * size;
	memset(e, 0, size);
	return e;
}

typedef struct plan_caps {
	size_t stages, ops, tensors;
} plan_caps_t;

static flow_plan_stage_t *push_stage(flow_plan_t *p, plan_caps_t *c)
{
	return push((void **)&p->stages, &p->nstages, &c->stages,
		    sizeof(*p->stages));
}

static flow_plan_op_t *push_op(flow_plan_t *p, plan_caps_t *c)
{
	return push((void **)&p->ops, &p->nops, &c->ops, sizeof(*p->ops));
}

static flow_plan_tensor_t *push_tensor(flow_plan_t *p, plan_caps_t *c)
{
	return push((void **)&p->tensors, &p->ntensors, &c->tensors,
		    sizeof(*p->tensors));
}

/* ---- parsing -------------------------------------------------------------- */

/* The header records, in the order they must come. */
enum { H_MODEL, H_MESH, H_BATCH, H_SEQ_LEN, H_GRAD_ACCUM, H_ZERO,
       H_RECOMPUTE, H_COUNT };
static const char *const header_keys[H_COUNT] = {
	"model", "mesh", "batch", "seq-len", "grad-accum", "zero", "recompute",
};

static int header_index(const char *key)
{
	for (int i = 0; i < H_COUNT; i++)
		if (strcmp(header_keys[i], key) == 0)
			return i;
	return -1;
}

static bool copy_name(char *dst, size_t cap, const char *src)
{
	size_t n = strlen(src);

	if (n == 0 || n >= cap)
		return false;
	memcpy(dst, src, n + 1);
	return true;
}

static flow_err_t parse_header(flow_textrec_t *r, flow_plan_t *p, int h)
{
	static const char *const syntax[H_COUNT] = {
		"model SPEC", "mesh DIMS:NAMES", "batch B", "seq-len T",
		"grad-accum K", "zero Z", "recompute none",
	};
	/* The numeric ones, read the same way before the switch. */
	static const struct {
		const char *what;
		uint64_t min, max;
	} num[H_COUNT] = {
		[H_BATCH] = { "batch", 1, UINT32_MAX },
		[H_SEQ_LEN] = { "seq-len", 1, UINT32_MAX },
		[H_GRAD_ACCUM] = { "grad-accum", 1, UINT32_MAX },
		[H_ZERO] = { "zero stage", 0, 3 },
	};
	flow_diag_t local = FLOW_DIAG_INIT;
	uint64_t n = 0;
	flow_err_t err;

	if ((err = flow_textrec_expect_fields(r, 2, syntax[h])))
		return err;
	if (num[h].what &&
	    (err = flow_textrec_field_u64(r, 1, num[h].what, num[h].min,
					  num[h].max, &n)))
		return err;
	const char *v = r->fields[1];
	switch (h) {
	case H_MODEL:
		if (flow_gpt_parse(v, &p->cfg, &local) != FLOW_OK)
			return flow_textrec_error(r, "%s", local.msg);
		if (!copy_name(p->model, sizeof(p->model), v))
			return flow_textrec_error(r, "model spec '%s' is too long",
						  v);
		p->line_model = r->line;
		return FLOW_OK;
	case H_MESH:
		if (flow_mesh_parse(v, &p->mesh, &local) != FLOW_OK)
			return flow_textrec_error(r, "%s", local.msg);
		for (int a = 0; a < p->mesh.ndim; a++)
			if (!p->mesh.names[a][0])
				return flow_textrec_error(
					r, "mesh '%s' must name its axes "
					"(e.g. 2x2:dp,tp)", v);
		p->line_mesh = r->line;
		return FLOW_OK;
	case H_BATCH:
		p->line_batch = r->line;
		p->batch = (uint32_t)n;
		return FLOW_OK;
	case H_SEQ_LEN:
		p->line_seq_len = r->line;
		p->seq_len = (uint32_t)n;
		return FLOW_OK;
	case H_GRAD_ACCUM:
		p->line_grad_accum = r->line;
		p->grad_accum = (uint32_t)n;
		return FLOW_OK;
	case H_ZERO:
		p->line_zero = r->line;
		p->zero = (int)n;
		return FLOW_OK;
	default:
		if (strcmp(v, "none") != 0)
			return flow_textrec_error(r, "unknown recompute policy "
						  "'%s' (expected 'none')", v);
		p->line_recompute = r->line;
		return FLOW_OK;
	}
}

static flow_err_t parse_sbp(flow_textrec_t *r, const char *text,
			    flow_nd_sbp_t *out)
{
	flow_diag_t local = FLOW_DIAG_INIT;

	if (flow_nd_sbp_parse(text, out, &local) != FLOW_OK)
		return flow_textrec_error(r, "%s", local.msg);
	return FLOW_OK;
}

/* "SBP;SBP;-;..." into sbp[] and present[]; returns the count or <0. */
static int parse_sbp_list(flow_textrec_t *r, char *list, flow_nd_sbp_t *sbp,
			  bool *present)
{
	int n = 0;

	for (char *s = list;; n++) {
		char *semi = strchr(s, ';');

		if (n == FLOW_OP_MAX_IO)
			return flow_textrec_error(r, "more than %d SBPs in '%s'",
						  FLOW_OP_MAX_IO, list);
		if (semi)
			*semi = '\0';
		present[n] = strcmp(s, "-") != 0;
		if (present[n]) {
			flow_err_t err = parse_sbp(r, s, &sbp[n]);
			if (err)
				return err;
		}
		if (semi)
			*semi = ';';
		if (!semi)
			return n + 1;
		s = semi + 1;
	}
}

static flow_err_t parse_stage(flow_textrec_t *r, flow_plan_t *p,
			      plan_caps_t *c)
{
	flow_plan_stage_t *s;
	uint64_t st;
	flow_err_t err;

	if ((err = flow_textrec_expect_fields(r, 3, "stage NAME S")) ||
	    (err = flow_textrec_field_u64(r, 2, "stage", 0, INT32_MAX, &st)))
		return err;
	if (!(s = push_stage(p, c)))
		return flow_diag_set(r->diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", r->path);
	if (!copy_name(s->name, sizeof(s->name), r->fields[1]))
		return flow_textrec_error(r, "stage name '%s' is too long",
					  r->fields[1]);
	s->stage = (int)st;
	s->line = r->line;
	return FLOW_OK;
}

static flow_err_t parse_op(flow_textrec_t *r, flow_plan_t *p, plan_caps_t *c)
{
	static const char syntax[] = "op NAME in SBP;... out SBP;...";
	flow_plan_op_t *o;
	flow_err_t err;

	if ((err = flow_textrec_expect_fields(r, 6, syntax)))
		return err;
	if (strcmp(r->fields[2], "in") != 0 || strcmp(r->fields[4], "out") != 0)
		return flow_textrec_error(r, "expected '%s'", syntax);
	if (!(o = push_op(p, c)))
		return flow_diag_set(r->diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", r->path);
	if (!copy_name(o->name, sizeof(o->name), r->fields[1]))
		return flow_textrec_error(r, "op name '%s' is too long",
					  r->fields[1]);
	o->line = r->line;
	o->nin = parse_sbp_list(r, r->fields[3], o->in, o->in_present);
	if (o->nin < 0)
		return (flow_err_t)o->nin;
	o->nout = parse_sbp_list(r, r->fields[5], o->out, o->out_present);
	return o->nout < 0 ? (flow_err_t)o->nout : FLOW_OK;
}

static flow_err_t parse_tensor(flow_textrec_t *r, flow_plan_t *p,
			       plan_caps_t *c)
{
	flow_plan_tensor_t *t;
	flow_err_t err;
	int role;

	if ((err = flow_textrec_expect_fields(r, 4, "tensor NAME ROLE SBP")))
		return err;
	if ((role = role_parse(r->fields[2])) < 0)
		return flow_textrec_error(r, "unknown role '%s'", r->fields[2]);
	if (!(t = push_tensor(p, c)))
		return flow_diag_set(r->diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", r->path);
	if (!copy_name(t->name, sizeof(t->name), r->fields[1]))
		return flow_textrec_error(r, "tensor name '%s' is too long",
					  r->fields[1]);
	t->role = role;
	t->line = r->line;
	return parse_sbp(r, r->fields[3], &t->sbp);
}

static flow_err_t parse_version(flow_textrec_t *r)
{
	if (r->nfields != 2 || strcmp(r->fields[0], "flow-plan") != 0)
		return flow_textrec_error(r, "not a plan: expected 'flow-plan "
					  "%d' on line 1", FLOW_PLAN_VERSION);
	if (strcmp(r->fields[1], "1") != 0)
		return flow_textrec_error(r, "unsupported plan version '%s' "
					  "(this flow reads version %d)",
					  r->fields[1], FLOW_PLAN_VERSION);
	return FLOW_OK;
}

static flow_err_t parse_record(flow_textrec_t *r, flow_plan_t *p,
			       plan_caps_t *c, int *next_header)
{
	const char *key = r->fields[0];
	int h = header_index(key);

	if (h >= 0) {
		if (h != *next_header)
			return *next_header < H_COUNT
				? flow_textrec_error(r, "expected '%s', got '%s'",
						     header_keys[*next_header],
						     key)
				: flow_textrec_error(r, "duplicate '%s'", key);
		(*next_header)++;
		return parse_header(r, p, h);
	}
	if (strcmp(key, "stage") != 0 && strcmp(key, "op") != 0 &&
	    strcmp(key, "tensor") != 0)
		return flow_textrec_error(r, "unknown keyword '%s'", key);
	if (*next_header < H_COUNT)
		return flow_textrec_error(r, "expected '%s', got '%s'",
					  header_keys[*next_header], key);
	if (key[0] == 's')
		return parse_stage(r, p, c);
	if (key[0] == 'o')
		return parse_op(r, p, c);
	return parse_tensor(r, p, c);
}

static flow_err_t parse_lines(flow_textrec_t *r, flow_plan_t *p)
{
	plan_caps_t caps = { 0, 0, 0 };
	int next_header = 0;
	flow_err_t err;
	size_t len;
	char *line;
	int got;

	while ((got = flow_textrec_next(r, &line, &len)) == 1) {
		if (strlen(line) != len)
			return flow_textrec_error(r, "NUL byte in line");
		if ((err = flow_textrec_split(r, line)))
			return err;
		if (r->line == 1) {
			if ((err = parse_version(r)))
				return err;
			continue;
		}
		if (r->nfields == 0 || r->fields[0][0] == '#')
			continue;
		if ((err = parse_record(r, p, &caps, &next_header)))
			return err;
	}
	if (got < 0)
		return (flow_err_t)got;
	p->last_line = r->line;
	if (r->line == 0)
		return flow_textrec_error_eof(r, "flow-plan 1");
	if (next_header < H_COUNT)
		return flow_textrec_error_eof(r, header_keys[next_header]);
	return FLOW_OK;
}

flow_err_t flow_plan_parse(const char *text, size_t len, const char *path,
			   flow_plan_t **plan_out, flow_diag_t *diag)
{
	flow_textrec_t r;
	flow_plan_t *p;
	flow_err_t err;
	size_t bytes;
	char *copy;

	if (!flow_add_size(len, 1, &bytes) || !(copy = malloc(bytes)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", path);
	memcpy(copy, text, len);
	copy[len] = '\0';
	if (!(p = malloc(sizeof(*p)))) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				    path);
		goto out_free_copy;
	}
	flow_plan_init(p);
	snprintf(p->path, sizeof(p->path), "%s", path);
	err = flow_textrec_init(&r, &plan_format, p->path, copy, len, diag);
	if (err == FLOW_OK)
		err = parse_lines(&r, p);
	flow_textrec_release(&r);
	if (err != FLOW_OK) {
		flow_plan_free(p);
		goto out_free_copy;
	}
	*plan_out = p;
out_free_copy:
	free(copy);
	return err;
}

static flow_err_t read_stream(FILE *f, char **data_out, size_t *len_out,
			      flow_diag_t *diag)
{
	size_t len = 0, cap = 0;
	char *data = NULL;

	for (;;) {
		if (len == cap) {
			size_t ncap = cap ? cap * 2 : 65536;
			char *p = realloc(data, ncap);
			if (!p) {
				free(data);
				return flow_diag_set(diag, FLOW_ERR_NOMEM,
						     "standard input: out of "
						     "memory");
			}
			data = p;
			cap = ncap;
		}
		size_t n = fread(data + len, 1, cap - len, f);
		len += n;
		if (n == 0)
			break;
	}
	if (ferror(f)) {
		free(data);
		return flow_diag_set(diag, FLOW_ERR_IO,
				     "cannot read standard input");
	}
	*data_out = data;
	*len_out = len;
	return FLOW_OK;
}

flow_err_t flow_plan_read(const char *path, flow_plan_t **plan_out,
			  flow_diag_t *diag)
{
	bool std_in = strcmp(path, "-") == 0;
	char *data = NULL;
	size_t len = 0;
	flow_err_t err;

	err = std_in ? read_stream(stdin, &data, &len, diag)
		     : flow_file_read_all(path, &data, &len, diag);
	if (err != FLOW_OK)
		return err;
	err = flow_plan_parse(data, len, std_in ? "(stdin)" : path, plan_out,
			      diag);
	free(data);
	return err;
}

/* ---- writing -------------------------------------------------------------- */

static void write_sbp_list(FILE *out, const flow_nd_sbp_t *sbp,
			   const bool *present, int n)
{
	char buf[FLOW_SBP_TEXT_MAX];

	for (int i = 0; i < n; i++) {
		if (present[i])
			flow_nd_sbp_format(&sbp[i], buf, sizeof(buf));
		fprintf(out, "%s%s", i ? ";" : "", present[i] ? buf : "-");
	}
}

flow_err_t flow_plan_write(const flow_plan_t *p, FILE *out, flow_diag_t *diag)
{
	char mesh[FLOW_MESH_TEXT_MAX], sbp[FLOW_SBP_TEXT_MAX];

	flow_mesh_format(&p->mesh, mesh, sizeof(mesh));
	fprintf(out, "flow-plan %d\nmodel %s\nmesh %s\nbatch %" PRIu32
		"\nseq-len %" PRIu32 "\ngrad-accum %" PRIu32 "\nzero %d\n"
		"recompute %s\n", FLOW_PLAN_VERSION, p->model, mesh, p->batch,
		p->seq_len, p->grad_accum, p->zero, p->recompute);
	for (size_t i = 0; i < p->nstages; i++)
		fprintf(out, "stage %s %d\n", p->stages[i].name,
			p->stages[i].stage);
	for (size_t i = 0; i < p->nops; i++) {
		const flow_plan_op_t *o = &p->ops[i];

		fprintf(out, "op %s in ", o->name);
		write_sbp_list(out, o->in, o->in_present, o->nin);
		fputs(" out ", out);
		write_sbp_list(out, o->out, o->out_present, o->nout);
		fputc('\n', out);
	}
	for (size_t i = 0; i < p->ntensors; i++) {
		const flow_plan_tensor_t *t = &p->tensors[i];

		flow_nd_sbp_format(&t->sbp, sbp, sizeof(sbp));
		fprintf(out, "tensor %s %s %s\n", t->name,
			flow_plan_role_name(t->role), sbp);
	}
	if (fflush(out) != 0 || ferror(out))
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot write plan");
	return FLOW_OK;
}

/* ---- the graph a plan describes ------------------------------------------ */

static flow_err_t graph_build(const flow_gpt_config_t *cfg, uint32_t B,
			      uint32_t T, flow_graph_t *g, flow_diag_t *diag)
{
	flow_err_t err;

	flow_graph_init(g);
	if ((err = flow_gpt_build(cfg, B, T, g, diag)) ||
	    (err = flow_graph_backward(g, diag)))
		flow_graph_release(g);
	return err;
}

static int op_find(const flow_graph_t *g, const char *name)
{
	for (size_t i = 0; i < g->nops; i++)
		if (strcmp(g->ops[i].name, name) == 0)
			return (int)i;
	return -1;
}

/* The layer scopes: "embed", "h.0" .. "h.(L-1)", "head". */
static size_t scope_count(const flow_gpt_config_t *cfg)
{
	return (size_t)cfg->layers + 2;
}

static void scope_name(const flow_gpt_config_t *cfg, size_t i, char *buf,
		       size_t cap)
{
	if (i == 0)
		snprintf(buf, cap, "embed");
	else if (i == (size_t)cfg->layers + 1)
		snprintf(buf, cap, "head");
	else
		snprintf(buf, cap, "h.%zu", i - 1);
}

/* Line numbers as flow_plan_write prints the records, for a plan made in
 * memory, so that check messages point into its printed form. */
static void assign_lines(flow_plan_t *p)
{
	size_t line = 1;
	size_t *hdr[H_COUNT] = { &p->line_model, &p->line_mesh,
		&p->line_batch, &p->line_seq_len, &p->line_grad_accum,
		&p->line_zero, &p->line_recompute };

	for (int h = 0; h < H_COUNT; h++)
		*hdr[h] = ++line;
	for (size_t i = 0; i < p->nstages; i++)
		p->stages[i].line = ++line;
	for (size_t i = 0; i < p->nops; i++)
		p->ops[i].line = ++line;
	for (size_t i = 0; i < p->ntensors; i++)
		p->tensors[i].line = ++line;
	p->last_line = line;
}

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

/* ---- the standard layouts ------------------------------------------------- */

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
		flow_plan_tensor_t *pt = push_tensor(p, caps);
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
			flow_plan_tensor_t *pt = push_tensor(p, caps);
			if (!pt)
				return flow_diag_set(diag, FLOW_ERR_NOMEM,
						     "out of memory for a plan");
			snprintf(pt->name, sizeof(pt->name), "%s%s",
				 adamw_prefix[m], g->tensors[t].name);
			pt->role = m ? FLOW_PLAN_ROLE_ADAMW_V
				     : FLOW_PLAN_ROLE_ADAMW_M;
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
	for (size_t i = 0; i < scope_count(&p->cfg); i++) {
		flow_plan_stage_t *s = push_stage(p, &caps);
		if (!s)
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "out of memory for a plan");
		scope_name(&p->cfg, i, name, sizeof(name));
		snprintf(s->name, sizeof(s->name), "%s", name);
	}
	for (size_t op = 0; op < g->nops; op++) {
		flow_plan_op_t *po = push_op(p, &caps);
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
	    (err = graph_build(&p->cfg, B, p->seq_len, &g, diag)))
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
	assign_lines(p);
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

/* ---- checking ------------------------------------------------------------- */

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
	if (graph_build(&p->cfg, p->batch, p->seq_len, &c->g, &local))
		return at(c, p->line_model, "%s", local.msg);
	return FLOW_OK;
}

static flow_err_t check_stages(checker_t *c)
{
	const flow_plan_t *p = c->p;
	size_t n = scope_count(&p->cfg);
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
			scope_name(&p->cfg, k, name, sizeof(name));
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
			scope_name(&p->cfg, k, name, sizeof(name));
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
		size_t k = strlen(adamw_prefix[m]);
		if (strncmp(name, adamw_prefix[m], k) == 0) {
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
	role = m < 0 ? (int)c->g.tensors[t].role
		     : (m ? FLOW_PLAN_ROLE_ADAMW_V : FLOW_PLAN_ROLE_ADAMW_M);
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
					  adamw_prefix[m], g->tensors[t].name);
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
			flow_nd_sbp_fill(&sig->out[i], c->p->mesh.ndim, sbp_b);
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
