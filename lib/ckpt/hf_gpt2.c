/* flow checkpoints to and from Hugging Face GPT-2 directories
 * (flow/safetensors.h): the name and layout mapping, config.json, the
 * sharded safetensors files and their index. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include <flow/file.h>
#include <flow/kernels.h>
#include <flow/safetensors.h>

#include "foreign_internal.h"

#define HF_PREFIX "transformer."
#define HF_INDEX "model.safetensors.index.json"
#define HF_SINGLE "model.safetensors"
#define HF_CONFIG "config.json"

/* ---- shared with llmc_model.c ------------------------------------------- */

static void set_shape(flow_shape_t *s, int ndim, int64_t d0, int64_t d1)
{
	memset(s, 0, sizeof *s);
	s->ndim = ndim;
	s->dims[0] = d0;
	s->dims[1] = d1;
}

flow_err_t gpt2_params(const flow_gpt_config_t *cfg,
		       gpt2_param_t **params_out, size_t *n_out,
		       flow_diag_t *diag)
{
	static const struct {
		const char *name;
		int out, in; /* multiples of C; in == 0: a vector */
		bool transpose;
	} layer[GPT2_LAYER_PARAMS] = {
		{ "ln_1.weight", 1, 0, false },
		{ "ln_1.bias", 1, 0, false },
		{ "attn.c_attn.weight", 3, 1, true },
		{ "attn.c_attn.bias", 3, 0, false },
		{ "attn.c_proj.weight", 1, 1, true },
		{ "attn.c_proj.bias", 1, 0, false },
		{ "ln_2.weight", 1, 0, false },
		{ "ln_2.bias", 1, 0, false },
		{ "mlp.c_fc.weight", 4, 1, true },
		{ "mlp.c_fc.bias", 4, 0, false },
		{ "mlp.c_proj.weight", 1, 4, true },
		{ "mlp.c_proj.bias", 1, 0, false },
	};
	const int64_t C = cfg->dim;
	size_t n = 4 + (size_t)GPT2_LAYER_PARAMS * cfg->layers;
	gpt2_param_t *p = calloc(n, sizeof *p);
	if (!p)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory for %zu parameters", n);
	size_t k = 0;
	snprintf(p[k].flow, sizeof p[k].flow, "wte");
	snprintf(p[k].hf, sizeof p[k].hf, "wte.weight");
	set_shape(&p[k++].shape, 2, flow_gpt_padded_vocab(cfg), C);
	snprintf(p[k].flow, sizeof p[k].flow, "wpe");
	snprintf(p[k].hf, sizeof p[k].hf, "wpe.weight");
	set_shape(&p[k++].shape, 2, cfg->seq, C);
	for (uint32_t l = 0; l < cfg->layers; l++)
		for (int j = 0; j < GPT2_LAYER_PARAMS; j++, k++) {
			snprintf(p[k].flow, sizeof p[k].flow, "h.%u.%s", l,
				 layer[j].name);
			memcpy(p[k].hf, p[k].flow, sizeof p[k].hf);
			if (layer[j].in)
				set_shape(&p[k].shape, 2, layer[j].out * C,
					  layer[j].in * C);
			else
				set_shape(&p[k].shape, 1, layer[j].out * C, 0);
			p[k].transpose = layer[j].transpose;
		}
	snprintf(p[k].flow, sizeof p[k].flow, "ln_f.weight");
	memcpy(p[k].hf, p[k].flow, sizeof p[k].hf);
	set_shape(&p[k++].shape, 1, C, 0);
	snprintf(p[k].flow, sizeof p[k].flow, "ln_f.bias");
	memcpy(p[k].hf, p[k].flow, sizeof p[k].hf);
	set_shape(&p[k++].shape, 1, C, 0);
	*params_out = p;
	*n_out = n;
	return FLOW_OK;
}

void gpt2_transpose(const float *src, size_t rows, size_t cols, float *dst)
{
	/* In 32x32 tiles, 4 KiB each way, so that neither side's stride
	 * walks the cache. */
	enum { TILE = 32 };
	for (size_t r0 = 0; r0 < rows; r0 += TILE)
		for (size_t c0 = 0; c0 < cols; c0 += TILE) {
			size_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
			size_t c1 = c0 + TILE < cols ? c0 + TILE : cols;
			for (size_t r = r0; r < r1; r++)
				for (size_t c = c0; c < c1; c++)
					dst[c * rows + r] = src[r * cols + c];
		}
}

size_t gpt2_numel(const flow_shape_t *s)
{
	size_t n = 1;
	for (int i = 0; i < s->ndim; i++)
		n *= (size_t)s->dims[i];
	return n;
}

flow_err_t gpt2_config_check(const char *path, const flow_gpt_config_t *c,
			     flow_gpt_config_t *cfg, flow_diag_t *diag)
{
	/* Through the spec parser, for its limits and checks. */
	char spec[FLOW_GPT_SPEC_MAX];
	flow_gpt_format(c, spec, sizeof spec);
	flow_diag_t tmp = FLOW_DIAG_INIT;
	if (flow_gpt_parse(spec, cfg, &tmp) != FLOW_OK)
		return flow_diag_set(diag, FLOW_ERR_FORMAT, "%s: %s", path,
				     flow_diag_message(&tmp));
	return FLOW_OK;
}

static flow_err_t gpt2_ckpt_config(const flow_ckpt_t *ckpt,
				   flow_gpt_config_t *cfg,
				   flow_diag_t *diag)
{
	const char *spec = flow_ckpt_get(ckpt, "model");
	if (!spec)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "checkpoint of step %" PRIu64 " has no "
				     "'model' state: not a GPT-2 model",
				     flow_ckpt_step(ckpt));
	flow_diag_t tmp = FLOW_DIAG_INIT;
	if (flow_gpt_parse(spec, cfg, &tmp) != FLOW_OK)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "checkpoint model '%s': %s", spec,
				     flow_diag_message(&tmp));
	return FLOW_OK;
}

flow_err_t gpt2_ckpt_params(const flow_ckpt_t *ckpt, flow_gpt_config_t *cfg,
			    gpt2_param_t **params_out, size_t *n_out,
			    flow_diag_t *diag)
{
	flow_err_t err = gpt2_ckpt_config(ckpt, cfg, diag);
	if (err == FLOW_OK)
		err = gpt2_params(cfg, params_out, n_out, diag);
	return err;
}

void gpt2_from_f32(const float *src, size_t n, flow_dtype_t dtype, void *dst)
{
	if (dtype == FLOW_DTYPE_F32) {
		memcpy(dst, src, n * sizeof(float));
		return;
	}
	uint16_t *d = dst;
	for (size_t i = 0; i < n; i++)
		d[i] = dtype == FLOW_DTYPE_BF16 ? flow_f32_to_bf16(src[i]) :
						  flow_f32_to_f16(src[i]);
}

void gpt2_to_f32(const void *src, size_t n, flow_dtype_t dtype, float *dst)
{
	if (dtype == FLOW_DTYPE_F32) {
		memmove(dst, src, n * sizeof(float));
		return;
	}
	/* backwards, so that src may be the front of dst */
	const uint16_t *s = src;
	for (size_t i = n; i-- > 0;)
		dst[i] = dtype == FLOW_DTYPE_BF16 ? flow_bf16_to_f32(s[i]) :
						    flow_f16_to_f32(s[i]);
}

static bool is_float(flow_dtype_t d)
{
	return d == FLOW_DTYPE_F32 || d == FLOW_DTYPE_BF16 ||
	       d == FLOW_DTYPE_F16;
}

/* The read buffer of an export: a few MiB of slabs, or one row. */
#define GPT2_READ_BUFFER ((size_t)4 << 20)

flow_err_t gpt2_reader_init(gpt2_reader_t *r, const flow_ckpt_t *ckpt,
			    const gpt2_param_t *params, size_t n, bool spare,
			    flow_diag_t *diag)
{
	memset(r, 0, sizeof *r);
	r->ckpt = ckpt;
	size_t largest = 1, row = 1;
	for (size_t i = 0; i < n; i++) {
		size_t k = gpt2_numel(&params[i].shape);
		if (k > largest)
			largest = k;
		if (k / (size_t)params[i].shape.dims[0] > row)
			row = k / (size_t)params[i].shape.dims[0];
	}
	/* Rows of the widest stored dtype: f32. */
	r->scap = row * sizeof(float) > GPT2_READ_BUFFER ? row * sizeof(float)
							 : GPT2_READ_BUFFER;
	r->vals = malloc(largest * sizeof(float));
	r->spare = spare ? malloc(largest * sizeof(float)) : NULL;
	r->scratch = malloc(r->scap);
	if (!r->vals || (spare && !r->spare) || !r->scratch)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory for tensors of %zu "
				     "elements",
				     largest);
	return FLOW_OK;
}

void gpt2_reader_release(gpt2_reader_t *r)
{
	free(r->vals);
	free(r->spare);
	free(r->scratch);
	memset(r, 0, sizeof *r);
}

flow_err_t gpt2_reader_read(gpt2_reader_t *r, const gpt2_param_t *p,
			    int64_t rows, flow_diag_t *diag)
{
	const flow_ckpt_t *ckpt = r->ckpt;
	int i = flow_ckpt_tensor_find(ckpt, p->flow);
	if (i < 0)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "checkpoint of step %" PRIu64 " has no "
				     "tensor '%s'", flow_ckpt_step(ckpt),
				     p->flow);
	const flow_ckpt_tensor_desc_t *d = flow_ckpt_tensor_at(ckpt, (size_t)i);
	if (!is_float(d->dtype) || !flow_shape_equal(&d->shape, &p->shape)) {
		char want[64], got[64];
		flow_shape_format(&p->shape, want, sizeof want);
		flow_shape_format(&d->shape, got, sizeof got);
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "checkpoint tensor '%s' is %s %s, the "
				     "model needs a float %s", p->flow,
				     flow_dtype_name(d->dtype), got, want);
	}
	flow_box_t box;
	memset(&box, 0, sizeof box);
	box.ndim = p->shape.ndim;
	for (int k = 0; k < box.ndim; k++)
		box.extent[k] = p->shape.dims[k];
	box.extent[0] = rows;
	/* a bf16/f16 tensor is read into the front of vals and widened */
	flow_err_t err = flow_ckpt_read_bounded(ckpt, (size_t)i, &box, r->vals,
						r->scratch, r->scap, diag);
	if (err != FLOW_OK)
		return err;
	size_t n = gpt2_numel(&p->shape) / (size_t)p->shape.dims[0] *
		   (size_t)rows;
	gpt2_to_f32(r->vals, n, d->dtype, r->vals);
	return FLOW_OK;
}

flow_err_t gpt2_write_param(flow_ckpt_writer_t *w, const gpt2_param_t *p,
			    const float *data, flow_diag_t *diag)
{
	flow_ckpt_tensor_desc_t d;
	memset(&d, 0, sizeof d);
	memcpy(d.name, p->flow, sizeof d.name);
	d.dtype = FLOW_DTYPE_F32;
	d.shape = p->shape;
	memcpy(d.mesh, "1", 2);
	memcpy(d.sbp, "(B)", 4);
	return flow_ckpt_writer_add(w, &d, NULL, data, diag);
}

flow_err_t gpt2_commit_weights(flow_ckpt_writer_t *w, const char *step_dir,
			       const flow_gpt_config_t *cfg,
			       flow_diag_t *diag)
{
	char spec[FLOW_GPT_SPEC_MAX];
	flow_gpt_format(cfg, spec, sizeof spec);
	flow_err_t err = flow_ckpt_writer_finish(w, diag);
	if (err != FLOW_OK)
		return err;
	const flow_ckpt_kv_t kv[] = { { "model", spec },
				      { "contents", "weights" } };
	return flow_ckpt_commit(step_dir, 0, 1, kv, 2, diag);
}

/* ---- export ------------------------------------------------------------- */

/* The HF shape of p: Conv1D weights transposed, wte without padding. */
static flow_shape_t hf_shape(const gpt2_param_t *p, const flow_gpt_config_t *cfg)
{
	flow_shape_t s = p->shape;
	if (strcmp(p->flow, "wte") == 0)
		s.dims[0] = cfg->vocab;
	if (p->transpose) {
		s.dims[0] = p->shape.dims[1];
		s.dims[1] = p->shape.dims[0];
	}
	return s;
}

static flow_err_t json_write(const char *path, json_t *doc, flow_diag_t *diag)
{
	char *text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER)
			 : NULL;
	json_decref(doc);
	if (!text)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", path);
	size_t len = strlen(text);
	char *buf = realloc(text, len + 2);
	if (!buf) {
		free(text);
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", path);
	}
	buf[len] = '\n';
	buf[len + 1] = '\0';
	flow_err_t err = flow_file_write_atomic(path, buf, len + 1, diag);
	free(buf);
	return err;
}

static json_t *hf_config_json(const flow_gpt_config_t *cfg, flow_dtype_t dt)
{
	return json_pack(
		"{s:[s],s:s,s:I,s:I,s:I,s:I,s:I,s:s,s:f,s:f,s:f,s:f,"
		"s:f,s:b,s:I,s:I,s:s}",
		"architectures", "GPT2LMHeadModel", "model_type", "gpt2",
		"vocab_size", (json_int_t)cfg->vocab,
		"n_positions", (json_int_t)cfg->seq,
		"n_ctx", (json_int_t)cfg->seq,
		"n_embd", (json_int_t)cfg->dim,
		"n_layer", (json_int_t)cfg->layers,
		"activation_function", "gelu_new",
		"layer_norm_epsilon", 1e-5, /* FLOW_LAYERNORM_EPS */
		"resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop", 0.0,
		"initializer_range", 0.02, "tie_word_embeddings", 1,
		"bos_token_id", (json_int_t)cfg->vocab - 1,
		"eos_token_id", (json_int_t)cfg->vocab - 1,
		"torch_dtype", dt == FLOW_DTYPE_BF16 ? "bfloat16" :
			       dt == FLOW_DTYPE_F16  ? "float16" :
						       "float32");
}

/* n_head is added apart: json_pack's format is long enough as it is. */
static flow_err_t hf_write_config(const char *path,
				  const flow_gpt_config_t *cfg,
				  flow_dtype_t dt, flow_diag_t *diag)
{
	json_t *doc = hf_config_json(cfg, dt);
	if (doc && json_object_set_new(doc, "n_head",
				       json_integer(cfg->heads)) != 0) {
		json_decref(doc);
		doc = NULL;
	}
	return json_write(path, doc, diag);
}

/* Write the tensors [first, last) of params into the file path, read
 * through r. */
static flow_err_t hf_write_shard(gpt2_reader_t *r, const char *path,
				 const gpt2_param_t *params,
				 const flow_st_tensor_t *st, size_t first,
				 size_t last, flow_dtype_t dt,
				 flow_diag_t *diag)
{
	static const flow_ckpt_kv_t meta[] = { { "format", "pt" } };
	flow_st_writer_t *w = NULL;
	flow_err_t err = flow_st_writer_new(path, st + first, last - first,
					    meta, 1, &w, diag);
	if (err != FLOW_OK)
		return err;
	for (size_t i = first; i < last && err == FLOW_OK; i++) {
		const gpt2_param_t *p = &params[i];
		int64_t rows = st[i].shape.dims[p->transpose ? 1 : 0];
		size_t n = gpt2_numel(&st[i].shape);
		err = gpt2_reader_read(r, p, rows, diag);
		if (err != FLOW_OK)
			break;
		float *vals = r->vals, *spare = r->spare;
		if (p->transpose) {
			/* flow Linear [out, in] -> HF Conv1D [in, out] */
			gpt2_transpose(vals, (size_t)p->shape.dims[0],
				       (size_t)p->shape.dims[1], spare);
			vals = r->spare;
			spare = r->vals;
		}
		const void *data = vals;
		if (dt != FLOW_DTYPE_F32) {
			gpt2_from_f32(vals, n, dt, spare);
			data = spare;
		}
		err = flow_st_writer_put(w, data, diag);
	}
	if (err != FLOW_OK) {
		flow_st_writer_abort(w);
		return err;
	}
	return flow_st_writer_finish(w, diag);
}

flow_err_t flow_hf_gpt2_export(const flow_ckpt_t *ckpt, const char *out_dir,
			       const flow_hf_export_options_t *opt,
			       flow_diag_t *diag)
{
	flow_hf_export_options_t o = { FLOW_DTYPE_F32, 0 };
	if (opt)
		o = *opt;
	if (!is_float(o.dtype))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "export dtype must be f32, bf16 or f16");
	flow_gpt_config_t cfg;
	gpt2_param_t *params = NULL;
	size_t n = 0;
	flow_err_t err = gpt2_ckpt_params(ckpt, &cfg, &params, &n, diag);
	if (err != FLOW_OK)
		return err;
	/* names and shapes first: the files' headers need them all */
	flow_st_tensor_t *st = calloc(n, sizeof *st);
	char (*names)[FLOW_CKPT_NAME_MAX + 16] = calloc(n, sizeof *names);
	size_t *shard_of = calloc(n + 1, sizeof *shard_of);
	flow_temp_dir_t *dir = NULL;
	json_t *map = NULL;
	gpt2_reader_t reader = { 0 };
	if (!st || !names || !shard_of) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM,
				    "%s: out of memory", out_dir);
		goto out_free;
	}
	size_t nshards = 1;
	uint64_t in_shard = 0, total = 0;
	for (size_t i = 0; i < n; i++) {
		int k = flow_ckpt_tensor_find(ckpt, params[i].flow);
		if (k < 0) {
			err = flow_diag_set(diag, FLOW_ERR_FORMAT,
					    "checkpoint of step %" PRIu64
					    " has no tensor '%s'",
					    flow_ckpt_step(ckpt),
					    params[i].flow);
			goto out_free;
		}
		snprintf(names[i], sizeof names[i], HF_PREFIX "%s",
			 params[i].hf);
		st[i].name = names[i];
		st[i].dtype = o.dtype;
		st[i].shape = hf_shape(&params[i], &cfg);
		uint64_t size;
		err = flow_st_data_size(&st[i], 1, &size, diag);
		if (err != FLOW_OK)
			goto out_free;
		if (o.max_shard_size && in_shard > 0 &&
		    in_shard + size > o.max_shard_size) {
			nshards++;
			in_shard = 0;
		}
		shard_of[i] = nshards - 1;
		in_shard += size;
		total += size;
	}
	err = gpt2_reader_init(&reader, ckpt, params, n, true, diag);
	if (err == FLOW_OK)
		err = flow_temp_dir_create(out_dir, &dir, diag);
	if (err != FLOW_OK)
		goto out_free;
	const char *tmp = flow_temp_dir_path(dir);
	char path[4096], file[64];
	if (strlen(tmp) + sizeof file + 2 > sizeof path) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE, "path too long '%s'",
				    out_dir);
		goto out_abort;
	}
	map = json_object();
	if (!map) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				    out_dir);
		goto out_abort;
	}
	for (size_t s = 0, first = 0; s < nshards; s++) {
		size_t last = first;
		while (last < n && shard_of[last] == s)
			last++;
		if (nshards == 1)
			snprintf(file, sizeof file, HF_SINGLE);
		else
			snprintf(file, sizeof file,
				 "model-%05zu-of-%05zu.safetensors", s + 1,
				 nshards);
		snprintf(path, sizeof path, "%s/%s", tmp, file);
		err = hf_write_shard(&reader, path, params, st, first, last,
				     o.dtype, diag);
		if (err != FLOW_OK)
			goto out_abort;
		for (size_t i = first; i < last; i++)
			if (json_object_set_new(map, st[i].name,
						json_string(file)) != 0) {
				err = flow_diag_set(diag, FLOW_ERR_NOMEM,
						    "%s: out of memory",
						    out_dir);
				goto out_abort;
			}
		first = last;
	}
	if (nshards > 1) {
		snprintf(path, sizeof path, "%s/" HF_INDEX, tmp);
		json_t *idx = json_pack("{s:{s:I},s:O}", "metadata",
					"total_size", (json_int_t)total,
					"weight_map", map);
		err = json_write(path, idx, diag);
		if (err != FLOW_OK)
			goto out_abort;
	}
	snprintf(path, sizeof path, "%s/" HF_CONFIG, tmp);
	err = hf_write_config(path, &cfg, o.dtype, diag);
	if (err != FLOW_OK)
		goto out_abort;
	err = flow_temp_dir_commit(dir, diag);
	dir = NULL;
	goto out_free;

out_abort:
	flow_temp_dir_abort(dir);
out_free:
	gpt2_reader_release(&reader);
	json_decref(map);
	free(shard_of);
	free(names);
	free(st);
	free(params);
	return err;
}

/* ---- import ------------------------------------------------------------- */

/* The files of an HF directory, opened. */
typedef struct hf_src {
	char dir[4096];
	flow_st_t **files;
	char **file_names;
	size_t nfiles;
} hf_src_t;

static void hf_src_release(hf_src_t *s)
{
	for (size_t i = 0; i < s->nfiles; i++) {
		flow_st_free(s->files[i]);
		free(s->file_names[i]);
	}
	free(s->files);
	free(s->file_names);
	s->files = NULL;
	s->file_names = NULL;
	s->nfiles = 0;
}

static flow_err_t hf_src_add(hf_src_t *s, const char *path, const char *name,
			     flow_diag_t *diag)
{
	for (size_t i = 0; i < s->nfiles; i++)
		if (strcmp(s->file_names[i], name) == 0)
			return FLOW_OK;
	flow_st_t **f = realloc(s->files, (s->nfiles + 1) * sizeof *f);
	if (f)
		s->files = f;
	char **nm = f ? realloc(s->file_names, (s->nfiles + 1) * sizeof *nm)
		      : NULL;
	if (nm)
		s->file_names = nm;
	char *copy = nm ? strdup(name) : NULL;
	if (!copy)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				     path);
	flow_st_t *st = NULL;
	flow_err_t err = flow_st_open(path, &st, diag);
	if (err != FLOW_OK) {
		free(copy);
		return err;
	}
	s->files[s->nfiles] = st;
	s->file_names[s->nfiles++] = copy;
	return FLOW_OK;
}

static flow_err_t hf_read_json(const char *path, json_t **out,
			       flow_diag_t *diag)
{
	char *text = NULL;
	size_t len = 0;
	flow_err_t err = flow_file_read_all(path, &text, &len, diag);
	if (err != FLOW_OK)
		return err;
	json_error_t je;
	json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	free(text);
	if (!doc || !json_is_object(doc)) {
		json_decref(doc);
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s:%d: bad JSON: %s", path,
				     doc ? 1 : je.line,
				     doc ? "not an object" : je.text);
	}
	*out = doc;
	return FLOW_OK;
}

/* Open src's safetensors files: src itself, or the directory's index's
 * files (each checked to hold the tensors the index names) or its
 * model.safetensors. */
static flow_err_t hf_src_open(const char *src, hf_src_t *s, flow_diag_t *diag)
{
	struct stat sb;
	char path[8192];
	/* room for the directory and any file name below it */
	if (strlen(src) + 256 > sizeof s->dir)
		return flow_diag_set(diag, FLOW_ERR_USAGE, "path too long '%s'",
				     src);
	if (stat(src, &sb) != 0)
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot open '%s'", src);
	if (!S_ISDIR(sb.st_mode)) {
		const char *slash = strrchr(src, '/');
		size_t dl = slash ? (size_t)(slash - src) : 0;
		if (dl >= sizeof s->dir)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "path too long '%s'", src);
		if (!slash)
			snprintf(s->dir, sizeof s->dir, ".");
		else if (dl == 0)
			snprintf(s->dir, sizeof s->dir, "/");
		else
			snprintf(s->dir, sizeof s->dir, "%.*s", (int)dl, src);
		return hf_src_add(s, src, slash ? slash + 1 : src, diag);
	}
	snprintf(s->dir, sizeof s->dir, "%s", src);
	snprintf(path, sizeof path, "%s/" HF_INDEX, src);
	if (stat(path, &sb) != 0) {
		snprintf(path, sizeof path, "%s/" HF_SINGLE, src);
		return hf_src_add(s, path, HF_SINGLE, diag);
	}
	json_t *idx = NULL;
	flow_err_t err = hf_read_json(path, &idx, diag);
	if (err != FLOW_OK)
		return err;
	json_t *map = json_object_get(idx, "weight_map");
	if (!json_is_object(map)) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: no 'weight_map' object", path);
		goto out;
	}
	const char *name;
	json_t *v;
	json_object_foreach(map, name, v) {
		const char *file = json_string_value(v);
		if (!file || !*file || strchr(file, '/') ||
		    strcmp(file, "..") == 0) {
			err = flow_diag_set(diag, FLOW_ERR_FORMAT,
					    "%s: tensor '%s': bad file name",
					    path, name);
			goto out;
		}
		char fpath[8192];
		snprintf(fpath, sizeof fpath, "%s/%s", src, file);
		err = hf_src_add(s, fpath, file, diag);
		if (err != FLOW_OK)
			goto out;
		size_t k = 0;
		while (strcmp(s->file_names[k], file) != 0)
			k++;
		if (flow_st_tensor_find(s->files[k], name) < 0) {
			err = flow_diag_set(diag, FLOW_ERR_FORMAT,
					    "%s: tensor '%s' is not in '%s'",
					    path, name, file);
			goto out;
		}
	}
	if (s->nfiles == 0)
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: the weight_map is empty", path);
out:
	json_decref(idx);
	return err;
}

static flow_err_t hf_int(const char *path, json_t *cfg, const char *key,
			 const char *alt, uint32_t *out, flow_diag_t *diag)
{
	json_t *v = json_object_get(cfg, key);
	if (!v && alt)
		v = json_object_get(cfg, alt);
	if (!json_is_integer(v) || json_integer_value(v) <= 0 ||
	    json_integer_value(v) > UINT32_MAX)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: '%s' is missing or not a positive "
				     "integer", path, key);
	*out = (uint32_t)json_integer_value(v);
	return FLOW_OK;
}

static flow_err_t hf_read_config(const char *dir, flow_gpt_config_t *cfg,
				 flow_diag_t *diag)
{
	char path[8192];
	snprintf(path, sizeof path, "%s/" HF_CONFIG, dir);
	json_t *doc = NULL;
	flow_err_t err = hf_read_json(path, &doc, diag);
	if (err != FLOW_OK)
		return err;
	flow_gpt_config_t c = { 0 };
	const char *type = json_string_value(json_object_get(doc,
							      "model_type"));
	if (type && strcmp(type, "gpt2") != 0)
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: model_type '%s' is not gpt2", path,
				    type);
	if (err == FLOW_OK)
		err = hf_int(path, doc, "n_layer", NULL, &c.layers, diag);
	if (err == FLOW_OK)
		err = hf_int(path, doc, "n_head", NULL, &c.heads, diag);
	if (err == FLOW_OK)
		err = hf_int(path, doc, "n_embd", NULL, &c.dim, diag);
	if (err == FLOW_OK)
		err = hf_int(path, doc, "vocab_size", NULL, &c.vocab, diag);
	if (err == FLOW_OK)
		err = hf_int(path, doc, "n_positions", "n_ctx", &c.seq, diag);
	json_decref(doc);
	if (err != FLOW_OK)
		return err;
	c.pad = 128;
	return gpt2_config_check(path, &c, cfg, diag);
}

static bool hf_skipped(const char *name)
{
	size_t n = strlen(name);
	if (strcmp(name, "lm_head.weight") == 0)
		return true;
	return (n > 10 && strcmp(name + n - 10, ".attn.bias") == 0) ||
	       (n > 17 && strcmp(name + n - 17, ".attn.masked_bias") == 0);
}

static const char *strip_prefix(const char *name)
{
	size_t k = strlen(HF_PREFIX);
	return strncmp(name, HF_PREFIX, k) == 0 ? name + k : name;
}

flow_err_t flow_hf_gpt2_import(const char *src, const char *step_dir,
			       flow_diag_t *diag)
{
	hf_src_t s;
	memset(&s, 0, sizeof s);
	gpt2_param_t *params = NULL;
	size_t n = 0;
	flow_gpt_config_t cfg;
	flow_ckpt_writer_t *w = NULL;
	flow_err_t err = hf_src_open(src, &s, diag);
	if (err == FLOW_OK)
		err = hf_read_config(s.dir, &cfg, diag);
	if (err == FLOW_OK)
		err = gpt2_params(&cfg, &params, &n, diag);
	if (err != FLOW_OK)
		goto out_release;
	/* every tensor of the files must be one the model has */
	for (size_t f = 0; f < s.nfiles; f++)
		for (size_t i = 0; i < flow_st_tensor_count(s.files[f]); i++) {
			const char *name =
				flow_st_tensor_at(s.files[f], i)->name;
			if (hf_skipped(strip_prefix(name)))
				continue;
			size_t k = 0;
			while (k < n && strcmp(params[k].hf,
					       strip_prefix(name)) != 0)
				k++;
			if (k == n) {
				err = flow_diag_set(diag, FLOW_ERR_FORMAT,
						    "%s/%s: tensor '%s' is not "
						    "a GPT-2 parameter",
						    s.dir, s.file_names[f],
						    name);
				goto out_release;
			}
		}
	err = flow_ckpt_writer_new(step_dir, 0, &w, diag);
	if (err != FLOW_OK)
		goto out_release;
	for (size_t k = 0; k < n; k++) {
		const gpt2_param_t *p = &params[k];
		char full[FLOW_CKPT_NAME_MAX + 16];
		snprintf(full, sizeof full, HF_PREFIX "%s", p->hf);
		size_t f;
		int ti = -1;
		for (f = 0; f < s.nfiles && ti < 0; f++) {
			ti = flow_st_tensor_find(s.files[f], full);
			if (ti < 0)
				ti = flow_st_tensor_find(s.files[f], p->hf);
		}
		if (ti < 0) {
			err = flow_diag_set(diag, FLOW_ERR_FORMAT,
					    "%s: no tensor '%s'", src, full);
			goto out_abort;
		}
		f--;
		const flow_st_tensor_t *t = flow_st_tensor_at(s.files[f],
							      (size_t)ti);
		flow_shape_t want = hf_shape(p, &cfg);
		if (!is_float(t->dtype) || !flow_shape_equal(&t->shape, &want)) {
			char ws[64], gs[64];
			flow_shape_format(&want, ws, sizeof ws);
			flow_shape_format(&t->shape, gs, sizeof gs);
			err = flow_diag_set(diag, FLOW_ERR_FORMAT,
					    "%s/%s: tensor '%s' is %s %s, "
					    "config.json needs a float %s",
					    s.dir, s.file_names[f], t->name,
					    flow_dtype_name(t->dtype), gs, ws);
			goto out_abort;
		}
		size_t total = gpt2_numel(&p->shape), hn = gpt2_numel(&t->shape);
		float *buf = calloc(total, sizeof(float));
		float *raw = malloc(hn * sizeof(float) + 1);
		if (!buf || !raw) {
			free(buf);
			free(raw);
			err = flow_diag_set(diag, FLOW_ERR_NOMEM,
					    "out of memory importing '%s'",
					    t->name);
			goto out_abort;
		}
		err = flow_st_read(s.files[f], (size_t)ti, raw, diag);
		if (err == FLOW_OK) {
			gpt2_to_f32(raw, hn, t->dtype, raw);
			if (p->transpose) {
				/* HF Conv1D [in, out] -> flow Linear
				 * [out, in] */
				gpt2_transpose(raw, (size_t)p->shape.dims[1],
					       (size_t)p->shape.dims[0], buf);
			} else {
				/* wte's padded rows stay zero */
				memcpy(buf, raw, hn * sizeof(float));
			}
			err = gpt2_write_param(w, p, buf, diag);
		}
		free(raw);
		free(buf);
		if (err != FLOW_OK)
			goto out_abort;
	}
	err = gpt2_commit_weights(w, step_dir, &cfg, diag);
	w = NULL;
	goto out_release;

out_abort:
	flow_ckpt_writer_abort(w);
out_release:
	free(params);
	hf_src_release(&s);
	return err;
}
