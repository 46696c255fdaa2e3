/* The plan format (flow/plan.h, flow-plan(5)): a plan's lifecycle, the
 * parser and the writer of its text form, and what the standard layouts
 * (layouts.c) and the checker (plan_check.c) share about a plan
 * (plan_internal.h): growing its arrays, the layer scopes its stage lines
 * name, the line numbers of its printed form, and the training graph it
 * describes, rebuilt from its model spec each time: a plan names ops and
 * tensors, the graph gives their shapes. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/common.h>
#include <flow/file.h>
#include <flow/mem.h>
#include <flow/plan.h>

#include "core/textrec_internal.h"
#include "plan_internal.h"

/* Plans close with no checksum: they are written by hand as often as by
 * flow-plan, and diffed.  Only the reader's line and field handling is
 * used. */
static const flow_textrec_format_t plan_format = {
	.sep = FLOW_TEXTREC_SEP_BLANKS,
	.end_key = "end",
	.lowercase_sums = true,
	.hint_causes = false,
};

const char *const plan_adamw_prefix[2] = { "adamw.m/", "adamw.v/" };

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

flow_plan_stage_t *plan_push_stage(flow_plan_t *p, plan_caps_t *c)
{
	return push((void **)&p->stages, &p->nstages, &c->stages,
		    sizeof(*p->stages));
}

flow_plan_op_t *plan_push_op(flow_plan_t *p, plan_caps_t *c)
{
	return push((void **)&p->ops, &p->nops, &c->ops, sizeof(*p->ops));
}

flow_plan_tensor_t *plan_push_tensor(flow_plan_t *p, plan_caps_t *c)
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
	if (!(s = plan_push_stage(p, c)))
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
	if (!(o = plan_push_op(p, c)))
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

/* Plans written before attention kept its log-sum-exps name its saved
 * output NAME.probs, with the layout the NAME.lse that replaced it has
 * (split as the heads and the batch are): they are read as that. */
static void rename_attention_probs(char *name)
{
	static const char old[] = ".probs", new[] = ".lse";
	size_t n = strlen(name), k = sizeof(old) - 1;

	if (n > k && strcmp(name + n - k, old) == 0)
		memcpy(name + n - k, new, sizeof(new));
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
	if (!(t = plan_push_tensor(p, c)))
		return flow_diag_set(r->diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", r->path);
	if (!copy_name(t->name, sizeof(t->name), r->fields[1]))
		return flow_textrec_error(r, "tensor name '%s' is too long",
					  r->fields[1]);
	rename_attention_probs(t->name);
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

/* The optional "device D" and "precision P" records, after the header
 * and before the stages, each at most once. */
static flow_err_t parse_option(flow_textrec_t *r, flow_plan_t *p,
			       int next_header, bool body_started)
{
	bool device = strcmp(r->fields[0], "device") == 0;
	char *dst = device ? p->device : p->precision;
	size_t *line = device ? &p->line_device : &p->line_precision;
	const char *a = device ? "cpu" : "fp32", *b = device ? "cuda" : "bf16";
	flow_err_t err;

	if (next_header < H_COUNT)
		return flow_textrec_error(r, "expected '%s', got '%s'",
					  header_keys[next_header],
					  r->fields[0]);
	if (body_started)
		return flow_textrec_error(r, "'%s' must come before the "
					  "stages, ops and tensors",
					  r->fields[0]);
	if (*line)
		return flow_textrec_error(r, "duplicate '%s'", r->fields[0]);
	if ((err = flow_textrec_expect_fields(r, 2, device ? "device cpu|cuda"
							   : "precision fp32|bf16")))
		return err;
	if (strcmp(r->fields[1], a) != 0 && strcmp(r->fields[1], b) != 0)
		return flow_textrec_error(r, "unknown %s '%s' (expected %s or %s)",
					  r->fields[0], r->fields[1], a, b);
	snprintf(dst, sizeof p->device, "%s", r->fields[1]);
	*line = r->line;
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
	if (strcmp(key, "device") == 0 || strcmp(key, "precision") == 0)
		return parse_option(r, p, *next_header,
				    p->nstages || p->nops || p->ntensors);
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

flow_err_t flow_plan_read(const char *path, flow_plan_t **plan_out,
			  flow_diag_t *diag)
{
	bool std_in = strcmp(path, "-") == 0;
	char *data = NULL;
	size_t len = 0;
	flow_err_t err;

	err = std_in ? flow_file_read_stream(stdin, "standard input", &data,
					     &len, diag)
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
	if (p->device[0])
		fprintf(out, "device %s\n", p->device);
	if (p->precision[0])
		fprintf(out, "precision %s\n", p->precision);
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

/* The record order of flow_plan_write, line by line. */
void plan_assign_lines(flow_plan_t *p)
{
	size_t line = 1;
	size_t *hdr[H_COUNT] = { &p->line_model, &p->line_mesh,
		&p->line_batch, &p->line_seq_len, &p->line_grad_accum,
		&p->line_zero, &p->line_recompute };

	for (int h = 0; h < H_COUNT; h++)
		*hdr[h] = ++line;
	p->line_device = p->device[0] ? ++line : 0;
	p->line_precision = p->precision[0] ? ++line : 0;
	for (size_t i = 0; i < p->nstages; i++)
		p->stages[i].line = ++line;
	for (size_t i = 0; i < p->nops; i++)
		p->ops[i].line = ++line;
	for (size_t i = 0; i < p->ntensors; i++)
		p->tensors[i].line = ++line;
	p->last_line = line;
}

/* ---- the graph a plan describes ------------------------------------------ */

flow_err_t plan_graph_build(const flow_gpt_config_t *cfg, uint32_t B,
			    uint32_t T, const char *precision,
			    flow_graph_t *g, flow_diag_t *diag)
{
	flow_dtype_t act = strcmp(precision, "bf16") == 0 ? FLOW_DTYPE_BF16 :
							    FLOW_DTYPE_F32;
	flow_err_t err;

	flow_graph_init(g);
	if ((err = flow_graph_set_act_dtype(g, act, diag)) ||
	    (err = flow_gpt_build(cfg, B, T, g, diag)) ||
	    (err = flow_graph_backward(g, diag)))
		flow_graph_release(g);
	return err;
}

size_t plan_scope_count(const flow_gpt_config_t *cfg)
{
	return (size_t)cfg->layers + 2;
}

void plan_scope_name(const flow_gpt_config_t *cfg, size_t i, char *buf,
		     size_t cap)
{
	if (i == 0)
		snprintf(buf, cap, "embed");
	else if (i == (size_t)cfg->layers + 1)
		snprintf(buf, cap, "head");
	else
		snprintf(buf, cap, "h.%zu", i - 1);
}
