/* The GPT-2 model builder: spec parsing and the forward graph
 * (flow/model.h). */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/model.h>
#include <flow/parse.h>

/* GPT-2's published sizes. */
static const struct {
	const char *name;
	flow_gpt_config_t cfg;
} gpt_presets[] = {
	{ "gpt2-124m", { 12, 12, 768, 50257, 128, 1024 } },
	{ "gpt2-350m", { 24, 16, 1024, 50257, 128, 1024 } },
	{ "gpt2-774m", { 36, 20, 1280, 50257, 128, 1024 } },
	{ "gpt2-1.5b", { 48, 25, 1600, 50257, 128, 1024 } },
};

#define GPT_PRESETS (sizeof gpt_presets / sizeof gpt_presets[0])

/* Bounds that keep every size of the graph far from overflow and every
 * token id inside int32. */
#define GPT_MAX_LAYERS 4096
#define GPT_MAX_DIM 65536
#define GPT_MAX_VOCAB 1000000000
#define GPT_MAX_SEQ 1048576
#define GPT_MAX_PAD 65536

static flow_err_t gpt_set_key(flow_gpt_config_t *cfg, const char *spec,
			      const char *key, size_t keylen,
			      const char *value, flow_diag_t *diag)
{
	static const struct {
		const char *key;
		size_t offset;
		int64_t max;
	} keys[] = {
		{ "layers", offsetof(flow_gpt_config_t, layers), GPT_MAX_LAYERS },
		{ "heads", offsetof(flow_gpt_config_t, heads), GPT_MAX_DIM },
		{ "dim", offsetof(flow_gpt_config_t, dim), GPT_MAX_DIM },
		{ "vocab", offsetof(flow_gpt_config_t, vocab), GPT_MAX_VOCAB },
		{ "pad", offsetof(flow_gpt_config_t, pad), GPT_MAX_PAD },
		{ "seq", offsetof(flow_gpt_config_t, seq), GPT_MAX_SEQ },
	};
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		if (strlen(keys[i].key) != keylen ||
		    memcmp(keys[i].key, key, keylen) != 0)
			continue;
		int64_t v;
		flow_diag_t sub = FLOW_DIAG_INIT;
		if (flow_parse_int(value, 1, keys[i].max, &v, &sub) != FLOW_OK)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "model spec '%s': %s: %s", spec,
					     keys[i].key,
					     flow_diag_message(&sub));
		*(uint32_t *)((char *)cfg + keys[i].offset) = (uint32_t)v;
		return FLOW_OK;
	}
	return flow_diag_set(diag, FLOW_ERR_USAGE,
			     "model spec '%s': unknown key '%.*s' (expected "
			     "layers, heads, dim, vocab, seq or pad)",
			     spec, (int)keylen, key);
}

/* "k=v,k=v" onto cfg. */
static flow_err_t gpt_parse_keys(flow_gpt_config_t *cfg, const char *spec,
				 const char *list, flow_diag_t *diag)
{
	char value[32];
	while (*list) {
		const char *end = strchr(list, ',');
		size_t len = end ? (size_t)(end - list) : strlen(list);
		const char *eq = memchr(list, '=', len);
		if (!eq || eq == list)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "model spec '%s': expected "
					     "key=value, got '%.*s'",
					     spec, (int)len, list);
		size_t vlen = len - (size_t)(eq + 1 - list);
		if (vlen >= sizeof value)
			vlen = sizeof value - 1;
		memcpy(value, eq + 1, vlen);
		value[vlen] = '\0';
		flow_err_t err = gpt_set_key(cfg, spec, list,
					     (size_t)(eq - list), value, diag);
		if (err != FLOW_OK)
			return err;
		if (!end)
			break;
		list = end + 1;
		if (!*list)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "model spec '%s': trailing ','",
					     spec);
	}
	return FLOW_OK;
}

flow_err_t flow_gpt_parse(const char *spec, flow_gpt_config_t *cfg_out,
			  flow_diag_t *diag)
{
	flow_gpt_config_t cfg = { 0, 0, 0, 0, 128, 0 };
	const char *colon = strchr(spec, ':');
	size_t head = colon ? (size_t)(colon - spec) : strlen(spec);
	bool found = false;
	if (head == 3 && memcmp(spec, "gpt", 3) == 0) {
		found = true;
	} else {
		for (size_t i = 0; i < GPT_PRESETS; i++) {
			if (strlen(gpt_presets[i].name) == head &&
			    memcmp(gpt_presets[i].name, spec, head) == 0) {
				cfg = gpt_presets[i].cfg;
				found = true;
			}
		}
	}
	if (!found)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "model spec '%s': unknown model '%.*s' "
				     "(expected gpt2-124m, gpt2-350m, "
				     "gpt2-774m, gpt2-1.5b or gpt:KEY=VALUE,...)",
				     spec, (int)head, spec);
	if (colon) {
		flow_err_t err = gpt_parse_keys(&cfg, spec, colon + 1, diag);
		if (err != FLOW_OK)
			return err;
	}
	static const char *const names[] = { "layers", "heads", "dim",
					     "vocab" };
	const uint32_t values[] = { cfg.layers, cfg.heads, cfg.dim, cfg.vocab };
	for (size_t i = 0; i < 4; i++)
		if (values[i] == 0)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "model spec '%s': missing %s",
					     spec, names[i]);
	if (cfg.seq == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "model spec '%s': missing seq", spec);
	if (cfg.dim % cfg.heads != 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "model spec '%s': dim %u is not a "
				     "multiple of heads %u",
				     spec, cfg.dim, cfg.heads);
	*cfg_out = cfg;
	return FLOW_OK;
}

size_t flow_gpt_format(const flow_gpt_config_t *cfg, char *buf, size_t cap)
{
	int n = snprintf(buf, cap,
			 "gpt:layers=%u,heads=%u,dim=%u,vocab=%u,seq=%u,pad=%u",
			 cfg->layers, cfg->heads, cfg->dim, cfg->vocab,
			 cfg->seq, cfg->pad);
	return n < 0 ? 0 : (size_t)n;
}

uint32_t flow_gpt_padded_vocab(const flow_gpt_config_t *cfg)
{
	uint64_t vp = ((uint64_t)cfg->vocab + cfg->pad - 1) / cfg->pad *
		      cfg->pad;
	return (uint32_t)vp;
}

uint64_t flow_gpt_param_count(const flow_gpt_config_t *cfg)
{
	uint64_t C = cfg->dim;
	uint64_t per_layer = 2 * C /* ln_1 */ + 3 * C * C + 3 * C /* c_attn */ +
			     C * C + C /* attn.c_proj */ + 2 * C /* ln_2 */ +
			     4 * C * C + 4 * C /* c_fc */ +
			     4 * C * C + C /* mlp.c_proj */;
	return (uint64_t)flow_gpt_padded_vocab(cfg) * C +
	       (uint64_t)cfg->seq * C + cfg->layers * per_layer + 2 * C;
}

double flow_gpt_flops_per_token(const flow_gpt_config_t *cfg, uint32_t T)
{
	double n = (double)flow_gpt_param_count(cfg) -
		   (double)cfg->seq * cfg->dim;
	return 6.0 * n + 12.0 * cfg->layers * (double)T * cfg->dim;
}

/* ---- the graph ------------------------------------------------------------ */

typedef struct gpt_builder {
	flow_graph_t *g;
	flow_diag_t *diag;
	flow_err_t err; /* first error; later calls do nothing */
} gpt_builder_t;

static int gpt_param(gpt_builder_t *b, const char *name, int ndim,
		     int64_t d0, int64_t d1, flow_init_kind_t init, float std)
{
	if (b->err != FLOW_OK)
		return -1;
	const int64_t dims[2] = { d0, d1 };
	int t = flow_graph_add_tensor(b->g, name, FLOW_ROLE_PARAM,
				      FLOW_DTYPE_F32, ndim, dims, b->diag);
	if (t < 0) {
		b->err = (flow_err_t)t;
		return -1;
	}
	flow_graph_tensor_t *p = &b->g->tensors[t];
	p->init.kind = init;
	p->init.std = std;
	p->decay = ndim == 2; /* weights and embeddings, as GPT-2's groups */
	return t;
}

/* Weight [out, in] and bias [out] of a linear layer "<scope>". */
static void gpt_linear_params(gpt_builder_t *b, const char *scope,
			      int64_t out, int64_t in, float std, int *w_out,
			      int *b_out)
{
	char name[FLOW_GRAPH_NAME_MAX];
	snprintf(name, sizeof name, "%s.weight", scope);
	*w_out = gpt_param(b, name, 2, out, in, FLOW_INIT_NORMAL, std);
	snprintf(name, sizeof name, "%s.bias", scope);
	*b_out = gpt_param(b, name, 1, out, 0, FLOW_INIT_ZEROS, 0);
}

/* Append op `kind` named `name`; returns its first output. */
static int gpt_op(gpt_builder_t *b, flow_op_kind_t kind, const char *name,
		  const int *in, int nin, const flow_op_attrs_t *attrs)
{
	if (b->err != FLOW_OK)
		return -1;
	int op = flow_graph_add_op(b->g, kind, name, in, nin, attrs, b->diag);
	if (op < 0) {
		b->err = (flow_err_t)op;
		return -1;
	}
	return b->g->ops[op].out[0];
}

static int gpt_layernorm(gpt_builder_t *b, const char *scope, int x,
			 int64_t C)
{
	char name[FLOW_GRAPH_NAME_MAX];
	snprintf(name, sizeof name, "%s.weight", scope);
	int w = gpt_param(b, name, 1, C, 0, FLOW_INIT_ONES, 0);
	snprintf(name, sizeof name, "%s.bias", scope);
	int bias = gpt_param(b, name, 1, C, 0, FLOW_INIT_ZEROS, 0);
	const int in[3] = { x, w, bias };
	return gpt_op(b, FLOW_OP_LAYERNORM, scope, in, 3, NULL);
}

static int gpt_linear(gpt_builder_t *b, const char *scope, int x,
		      int64_t out, int64_t in_dim, float std)
{
	int w, bias;
	gpt_linear_params(b, scope, out, in_dim, std, &w, &bias);
	const int in[3] = { x, w, bias };
	return gpt_op(b, FLOW_OP_MATMUL, scope, in, 3, NULL);
}

/* One pre-LayerNorm block on the residual stream x; returns the new
 * stream. */
static int gpt_block(gpt_builder_t *b, const flow_gpt_config_t *cfg,
		     uint32_t layer, int x)
{
	const int64_t C = cfg->dim;
	/* GPT-2 scales the init of the projections that add into the
	 * residual stream, two per layer, by 1/sqrt(2 n_layer). */
	const float std = 0.02f;
	const float proj_std = (float)(0.02 / sqrt(2.0 * cfg->layers));
	char s[FLOW_GRAPH_NAME_MAX];
	flow_op_attrs_t heads = { .heads = cfg->heads };

	snprintf(s, sizeof s, "h.%u.ln_1", layer);
	int h = gpt_layernorm(b, s, x, C);
	snprintf(s, sizeof s, "h.%u.attn.c_attn", layer);
	h = gpt_linear(b, s, h, 3 * C, C, std);
	snprintf(s, sizeof s, "h.%u.attn", layer);
	h = gpt_op(b, FLOW_OP_ATTENTION, s, &h, 1, &heads);
	snprintf(s, sizeof s, "h.%u.attn.c_proj", layer);
	h = gpt_linear(b, s, h, C, C, proj_std);
	snprintf(s, sizeof s, "h.%u.residual_1", layer);
	x = gpt_op(b, FLOW_OP_ADD, s, (const int[]){ x, h }, 2, NULL);

	snprintf(s, sizeof s, "h.%u.ln_2", layer);
	h = gpt_layernorm(b, s, x, C);
	snprintf(s, sizeof s, "h.%u.mlp.c_fc", layer);
	h = gpt_linear(b, s, h, 4 * C, C, std);
	snprintf(s, sizeof s, "h.%u.mlp.gelu", layer);
	h = gpt_op(b, FLOW_OP_GELU, s, &h, 1, NULL);
	snprintf(s, sizeof s, "h.%u.mlp.c_proj", layer);
	h = gpt_linear(b, s, h, C, 4 * C, proj_std);
	snprintf(s, sizeof s, "h.%u.residual_2", layer);
	return gpt_op(b, FLOW_OP_ADD, s, (const int[]){ x, h }, 2, NULL);
}

flow_err_t flow_gpt_build(const flow_gpt_config_t *cfg, uint32_t B,
			  uint32_t T, flow_graph_t *g, flow_diag_t *diag)
{
	if (T == 0 || T > cfg->seq)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "sequence length %u is outside the "
				     "model's context [1, %u]",
				     T, cfg->seq);
	if (B == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "batch size must be positive");
	gpt_builder_t b = { g, diag, FLOW_OK };
	const int64_t C = cfg->dim, Vp = flow_gpt_padded_vocab(cfg);
	const int64_t bt[2] = { B, T };

	int tokens = flow_graph_add_tensor(g, "tokens", FLOW_ROLE_INPUT,
					   FLOW_DTYPE_I32, 2, bt, diag);
	int targets = flow_graph_add_tensor(g, "targets", FLOW_ROLE_INPUT,
					    FLOW_DTYPE_I32, 2, bt, diag);
	if (tokens < 0 || targets < 0)
		return diag->err;
	int wte = gpt_param(&b, "wte", 2, Vp, C, FLOW_INIT_NORMAL, 0.02f);
	if (wte >= 0)
		g->tensors[wte].init.rows = cfg->vocab; /* padding stays 0 */
	int wpe = gpt_param(&b, "wpe", 2, cfg->seq, C, FLOW_INIT_NORMAL, 0.02f);

	int x = gpt_op(&b, FLOW_OP_EMBEDDING, "embed",
		       (const int[]){ tokens, wte, wpe }, 3, NULL);
	for (uint32_t l = 0; l < cfg->layers; l++)
		x = gpt_block(&b, cfg, l, x);
	x = gpt_layernorm(&b, "ln_f", x, C);
	/* The LM head is the token embedding, transposed (tied weights). */
	int logits = gpt_op(&b, FLOW_OP_MATMUL, "lm_head",
			    (const int[]){ x, wte, -1 }, 3, NULL);
	flow_op_attrs_t vocab = { .vocab = cfg->vocab };
	int losses = gpt_op(&b, FLOW_OP_CROSS_ENTROPY, "loss",
			    (const int[]){ logits, targets }, 2, &vocab);
	if (b.err != FLOW_OK)
		return b.err;
	return flow_graph_set_loss(g, losses, diag);
}
