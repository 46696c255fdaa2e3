/* safetensors files, Hugging Face GPT-2 export/import and llm.c model
 * files (flow/safetensors.h): writer/reader round trips, every rejection
 * of a damaged header with its one-line message, bf16/f16 rounding
 * against a reference, checkpoint -> foreign -> checkpoint round trips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/model.h>
#include <flow/safetensors.h>

#include "testutil.h"

static char root[256];

static int setup(void **state)
{
	(void)state;
	return testutil_mkdtemp(root, sizeof(root), "safetensors");
}

static int teardown(void **state)
{
	(void)state;
	return testutil_rmtree(root);
}

/* root/name, valid for the next 31 calls. */
static const char *path_in(const char *name)
{
	static char buf[32][512];
	static int k;
	k = (k + 1) % 32;
	int n = snprintf(buf[k], sizeof buf[k], "%s/%s", root, name);
	assert_true(n > 0 && (size_t)n < sizeof buf[k]);
	return buf[k];
}

static flow_st_tensor_t tensor(const char *name, flow_dtype_t dtype, int ndim,
			       int64_t d0, int64_t d1)
{
	flow_st_tensor_t t;
	memset(&t, 0, sizeof t);
	t.name = name;
	t.dtype = dtype;
	t.shape.ndim = ndim;
	t.shape.dims[0] = d0;
	t.shape.dims[1] = d1;
	return t;
}

/* A file "<header JSON>" + data_len bytes, the JSON as given. */
static const char *write_raw(const char *name, const char *json,
			     size_t data_len)
{
	size_t n = strlen(json);
	unsigned char *buf = calloc(1, 8 + n + data_len + 1);
	assert_non_null(buf);
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
	memcpy(buf + 8, json, n);
	const char *p = path_in(name);
	assert_int_equal(testutil_write_file(p, buf, 8 + n + data_len), 0);
	free(buf);
	return p;
}

static void expect_open_error(const char *path, flow_err_t want,
			      const char *needle)
{
	flow_st_t *st = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_st_open(path, &st, &diag);
	if (err != want || !strstr(diag.msg, needle))
		fail_msg("want %s '%s', got %s '%s'", flow_err_name(want),
			 needle, flow_err_name(err), diag.msg);
	assert_null(st);
	assert_null(strchr(diag.msg, '\n'));
	assert_non_null(strstr(diag.msg, path));
}

/* ---- safetensors files -------------------------------------------------- */

static void test_write_read(void **state)
{
	(void)state;
	flow_st_tensor_t t[3] = {
		tensor("a", FLOW_DTYPE_F32, 2, 2, 3),
		tensor("b.bias", FLOW_DTYPE_BF16, 1, 5, 0),
		tensor("empty", FLOW_DTYPE_F16, 2, 0, 4),
	};
	const flow_ckpt_kv_t meta[] = { { "format", "pt" } };
	float a[6] = { 1, 2, 3, 4, 5, -6.5f };
	uint16_t b[5] = { 1, 2, 3, 0x7f80, 0xffff };
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_st_writer_t *w = NULL;
	const char *p = path_in("rt.safetensors");
	assert_int_equal(flow_st_writer_new(p, t, 3, meta, 1, &w, &diag),
			 FLOW_OK);
	assert_int_equal(flow_st_writer_put(w, a, &diag), FLOW_OK);
	assert_int_equal(flow_st_writer_put(w, b, &diag), FLOW_OK);
	assert_int_equal(flow_st_writer_put(w, NULL, &diag), FLOW_OK);
	assert_int_equal(flow_st_writer_finish(w, &diag), FLOW_OK);

	/* the data starts 8-byte aligned */
	FILE *f = fopen(p, "rb");
	assert_non_null(f);
	unsigned char lenb[8];
	assert_int_equal(fread(lenb, 1, 8, f), 8);
	fclose(f);
	assert_int_equal(lenb[0] % 8, 0);

	flow_st_t *st = NULL;
	assert_int_equal(flow_st_open(p, &st, &diag), FLOW_OK);
	assert_int_equal(flow_st_tensor_count(st), 3);
	assert_string_equal(flow_st_metadata(st, "format"), "pt");
	assert_null(flow_st_metadata(st, "nope"));
	int ia = flow_st_tensor_find(st, "a"), ib = flow_st_tensor_find(st,
								       "b.bias");
	assert_true(ia >= 0 && ib >= 0);
	assert_int_equal(flow_st_tensor_find(st, "zz"), -1);
	const flow_st_tensor_t *ta = flow_st_tensor_at(st, (size_t)ia);
	assert_int_equal(ta->dtype, FLOW_DTYPE_F32);
	assert_int_equal(ta->shape.ndim, 2);
	assert_int_equal(ta->shape.dims[1], 3);
	assert_int_equal(ta->end - ta->begin, 24);
	float ga[6];
	uint16_t gb[5];
	assert_int_equal(flow_st_read(st, (size_t)ia, ga, &diag), FLOW_OK);
	assert_int_equal(flow_st_read(st, (size_t)ib, gb, &diag), FLOW_OK);
	assert_memory_equal(ga, a, sizeof a);
	assert_memory_equal(gb, b, sizeof b);
	flow_st_free(st);
	flow_st_free(NULL);
}

static void test_writer_misuse(void **state)
{
	(void)state;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_st_writer_t *w = NULL;
	flow_st_tensor_t t[2] = { tensor("x", FLOW_DTYPE_F32, 1, 2, 0),
				  tensor("x", FLOW_DTYPE_F32, 1, 2, 0) };
	assert_int_equal(mkdir(path_in("misuse"), 0755), 0);
	const char *p = path_in("misuse/bad.safetensors");
	assert_int_equal(flow_st_writer_new(p, t, 2, NULL, 0, &w, &diag),
			 FLOW_ERR_USAGE);
	assert_non_null(strstr(diag.msg, "'x' given twice"));
	flow_diag_clear(&diag);
	t[1].name = "__metadata__";
	assert_int_equal(flow_st_writer_new(p, t, 2, NULL, 0, &w, &diag),
			 FLOW_ERR_USAGE);
	flow_diag_clear(&diag);
	t[1].name = "y";
	assert_int_equal(flow_st_writer_new(p, t, 2, NULL, 0, &w, &diag),
			 FLOW_OK);
	float x[2] = { 0 };
	assert_int_equal(flow_st_writer_put(w, x, &diag), FLOW_OK);
	assert_int_equal(flow_st_writer_finish(w, &diag), FLOW_ERR_USAGE);
	assert_non_null(strstr(diag.msg, "tensor 'y' was not written"));
	assert_int_equal(access(p, F_OK), -1); /* nothing under the name */
	assert_int_equal(testutil_count_entries(path_in("misuse")), 0);
	flow_st_writer_abort(NULL);
}

static void test_header_errors(void **state)
{
	(void)state;
	const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
			 "\"data_offsets\":[0,8]},"
			 "\"b\":{\"dtype\":\"U8\",\"shape\":[4],"
			 "\"data_offsets\":[8,12]}}";
	flow_st_t *st = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_st_open(write_raw("ok", ok, 12), &st, &diag),
			 FLOW_OK);
	flow_st_free(st);

	/* lying size */
	expect_open_error(
		write_raw("size", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],"
				  "\"data_offsets\":[0,8]}}", 8),
		FLOW_ERR_FORMAT, "tensor 'a': data_offsets [0, 8] hold 8 bytes");
	/* overlap */
	expect_open_error(
		write_raw("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
				     "\"data_offsets\":[0,8]},"
				     "\"b\":{\"dtype\":\"U8\",\"shape\":[4],"
				     "\"data_offsets\":[4,8]}}", 8),
		FLOW_ERR_FORMAT, "tensor 'b' at bytes [4, 8) overlaps tensor 'a'");
	/* gap */
	expect_open_error(
		write_raw("gap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
				 "\"data_offsets\":[0,8]},"
				 "\"b\":{\"dtype\":\"U8\",\"shape\":[4],"
				 "\"data_offsets\":[10,14]}}", 14),
		FLOW_ERR_FORMAT, "gap of 2 bytes before tensor 'b'");
	/* truncated data, trailing bytes */
	expect_open_error(write_raw("trunc", ok, 11), FLOW_ERR_FORMAT,
			  "truncated: tensor 'b' ends at data byte 12, the file "
			  "holds 11");
	expect_open_error(write_raw("trail", ok, 13), FLOW_ERR_FORMAT,
			  "1 bytes after the last tensor 'b'");
	/* header length beyond the file, beyond the limit, short file */
	unsigned char big[16] = { 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{' };
	const char *p = path_in("big");
	assert_int_equal(testutil_write_file(p, big, sizeof big), 0);
	expect_open_error(p, FLOW_ERR_FORMAT, "exceeds the limit of 100000000");
	big[0] = 9, big[1] = big[2] = big[3] = 0;
	assert_int_equal(testutil_write_file(p, big, sizeof big), 0);
	expect_open_error(p, FLOW_ERR_FORMAT, "truncated: header length 9");
	assert_int_equal(testutil_write_file(p, big, 5), 0);
	expect_open_error(p, FLOW_ERR_FORMAT, "truncated: 5 bytes");
	/* bad JSON, not an object, duplicates, wrong fields, dtypes */
	expect_open_error(write_raw("json", "{\"a\":", 0), FLOW_ERR_FORMAT,
			  "bad JSON");
	expect_open_error(write_raw("arr", "[1]", 0), FLOW_ERR_FORMAT,
			  "does not start with '{'");
	expect_open_error(
		write_raw("dup", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],"
				 "\"data_offsets\":[0,0]},"
				 "\"a\":{\"dtype\":\"U8\",\"shape\":[0],"
				 "\"data_offsets\":[0,0]}}", 0),
		FLOW_ERR_FORMAT, "bad JSON");
	expect_open_error(
		write_raw("field", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1),
		FLOW_ERR_FORMAT, "tensor 'w' needs exactly");
	expect_open_error(
		write_raw("f64", "{\"w\":{\"dtype\":\"F64\",\"shape\":[1],"
				 "\"data_offsets\":[0,8]}}", 8),
		FLOW_ERR_NOTSUP, "tensor 'w': dtype 'F64' is not supported");
	expect_open_error(
		write_raw("dt", "{\"w\":{\"dtype\":\"Q7\",\"shape\":[1],"
				"\"data_offsets\":[0,8]}}", 8),
		FLOW_ERR_FORMAT, "tensor 'w': unknown dtype 'Q7'");
	expect_open_error(
		write_raw("neg", "{\"w\":{\"dtype\":\"U8\",\"shape\":[-1],"
				 "\"data_offsets\":[0,8]}}", 8),
		FLOW_ERR_FORMAT, "tensor 'w': shape holds");
	expect_open_error(
		write_raw("offs", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],"
				  "\"data_offsets\":[2,1]}}", 8),
		FLOW_ERR_FORMAT, "tensor 'w': data_offsets are not");
	expect_open_error(
		write_raw("meta", "{\"__metadata__\":{\"k\":1}}", 0),
		FLOW_ERR_FORMAT, "__metadata__ 'k' is not a string");
	expect_open_error(path_in("missing"), FLOW_ERR_IO, "cannot open");
}


/* ---- GPT-2 checkpoints -------------------------------------------------- */

#define SPEC "gpt:layers=2,heads=2,dim=8,vocab=50,seq=16,pad=128"

typedef struct param {
	char name[64];
	int ndim;
	int64_t d0, d1;
} param_t;

static size_t model_params(param_t *p)
{
	static const struct {
		const char *name;
		int out, in;
	} layer[] = {
		{ "ln_1.weight", 1, 0 },	{ "ln_1.bias", 1, 0 },
		{ "attn.c_attn.weight", 3, 1 }, { "attn.c_attn.bias", 3, 0 },
		{ "attn.c_proj.weight", 1, 1 }, { "attn.c_proj.bias", 1, 0 },
		{ "ln_2.weight", 1, 0 },	{ "ln_2.bias", 1, 0 },
		{ "mlp.c_fc.weight", 4, 1 },	{ "mlp.c_fc.bias", 4, 0 },
		{ "mlp.c_proj.weight", 1, 4 },  { "mlp.c_proj.bias", 1, 0 },
	};
	const int64_t C = 8;
	size_t n = 0;
	p[n++] = (param_t){ "wte", 2, 128, C };
	p[n++] = (param_t){ "wpe", 2, 16, C };
	for (int l = 0; l < 2; l++)
		for (size_t j = 0; j < sizeof layer / sizeof layer[0]; j++) {
			snprintf(p[n].name, sizeof p[n].name, "h.%d.%s", l,
				 layer[j].name);
			p[n].ndim = layer[j].in ? 2 : 1;
			p[n].d0 = layer[j].out * C;
			p[n].d1 = layer[j].in * C;
			n++;
		}
	p[n++] = (param_t){ "ln_f.weight", 1, C, 0 };
	p[n++] = (param_t){ "ln_f.bias", 1, C, 0 };
	return n;
}

static uint64_t rng_state = 12345;

static float rnd(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (float)(int32_t)(rng_state >> 32) / 2147483648.0f;
}

/* Values that test the rounding: bf16 and f16 ties, f16 overflow and
 * subnormals. */
static const float tricky[] = {
	1.00390625f,	   /* 1 + 2^-8: bf16 tie, to even 1.0 */
	1.01171875f,	   /* 1 + 3 2^-8: bf16 tie, to even 1 + 2^-6 */
	1.00048828125f,	   /* 1 + 2^-11: f16 tie, to even 1.0 */
	65519.0f, 65520.0f, /* f16: the last finite, the first infinity */
	2.98023224e-8f,	   /* 2^-25: f16 tie to zero */
	8.94069672e-8f,	   /* 3 2^-24: an f16 subnormal, exact */
	-3.0e38f,	   /* bf16 stays finite, f16 -inf */
};

static size_t numel(const param_t *p)
{
	return (size_t)p->d0 * (size_t)(p->ndim == 2 ? p->d1 : 1);
}

/* A committed training-like checkpoint of SPEC at step 7 in dir, with
 * AdamW moments beside the weights; the padded wte rows are 0.  With
 * nranks 2 the matrices are split by rows between two ranks (S(0)) and
 * the vectors replicated (B): the same values in another layout. */
static void make_ckpt_ranks(const char *dir, uint32_t nranks)
{
	param_t p[32];
	size_t n = model_params(p);
	flow_diag_t diag = FLOW_DIAG_INIT;
	for (uint32_t r = 0; r < nranks; r++) {
		flow_ckpt_writer_t *w = NULL;
		assert_int_equal(flow_ckpt_writer_new(dir, r, &w, &diag),
				 FLOW_OK);
		for (size_t i = 0; i < n; i++) {
			size_t k = numel(&p[i]);
			float *v = calloc(k, sizeof(float));
			assert_non_null(v);
			rng_state = 12345 + i;
			size_t live = strcmp(p[i].name, "wte") == 0 ? 50 * 8 : k;
			for (size_t j = 0; j < live; j++)
				v[j] = rnd();
			if (strcmp(p[i].name, "ln_f.bias") == 0)
				memcpy(v, tricky, sizeof tricky);
			bool split = nranks > 1 && p[i].ndim == 2;
			for (int m = 0; m < 2; m++) {
				flow_ckpt_tensor_desc_t d;
				memset(&d, 0, sizeof d);
				size_t pre = m ? 8 : 0, len = strlen(p[i].name);
				assert_true(pre + len < sizeof d.name);
				memcpy(d.name, "adamw.m/", pre);
				memcpy(d.name + pre, p[i].name, len + 1);
				d.dtype = FLOW_DTYPE_F32;
				d.shape.ndim = p[i].ndim;
				d.shape.dims[0] = p[i].d0;
				d.shape.dims[1] = p[i].d1;
				snprintf(d.mesh, sizeof d.mesh, "%u", nranks);
				snprintf(d.sbp, sizeof d.sbp, "%s",
					 split ? "(S(0))" : "(B)");
				flow_box_t box;
				memset(&box, 0, sizeof box);
				box.ndim = p[i].ndim;
				int64_t rows = p[i].d0 / (int64_t)nranks;
				box.start[0] = split ? rows * r : 0;
				box.extent[0] = split ? rows : p[i].d0;
				box.extent[1] = p[i].d1;
				const float *at = v + (size_t)box.start[0] *
						      (size_t)(split ? p[i].d1 : 0);
				assert_int_equal(flow_ckpt_writer_add(
							 w, &d, &box, at, &diag),
						 FLOW_OK);
			}
			free(v);
		}
		assert_int_equal(flow_ckpt_writer_finish(w, &diag), FLOW_OK);
	}
	const flow_ckpt_kv_t kv[] = { { "model", SPEC },
				      { "contents", "training" } };
	if (flow_ckpt_commit(dir, 7, nranks, kv, 2, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
}

static void make_ckpt(const char *dir)
{
	make_ckpt_ranks(dir, 1);
}

static flow_ckpt_t *open_ckpt(const char *dir)
{
	flow_ckpt_t *c = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_ckpt_open(dir, &c, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	return c;
}

/* Every model parameter of a and b holds the same bits. */
static void expect_same_weights(const char *a_dir, const char *b_dir)
{
	flow_ckpt_t *a = open_ckpt(a_dir), *b = open_ckpt(b_dir);
	param_t p[32];
	size_t n = model_params(p);
	flow_diag_t diag = FLOW_DIAG_INIT;
	for (size_t i = 0; i < n; i++) {
		int ia = flow_ckpt_tensor_find(a, p[i].name);
		int ib = flow_ckpt_tensor_find(b, p[i].name);
		assert_true(ia >= 0 && ib >= 0);
		const flow_ckpt_tensor_desc_t *db =
			flow_ckpt_tensor_at(b, (size_t)ib);
		assert_int_equal(db->dtype, FLOW_DTYPE_F32);
		assert_true(flow_shape_equal(
			&flow_ckpt_tensor_at(a, (size_t)ia)->shape, &db->shape));
		size_t k = numel(&p[i]);
		float *va = malloc(k * 4), *vb = malloc(k * 4);
		assert_true(va && vb);
		assert_int_equal(flow_ckpt_read(a, (size_t)ia, NULL, va, &diag),
				 FLOW_OK);
		assert_int_equal(flow_ckpt_read(b, (size_t)ib, NULL, vb, &diag),
				 FLOW_OK);
		if (memcmp(va, vb, k * 4) != 0)
			fail_msg("tensor '%s' differs", p[i].name);
		free(va);
		free(vb);
	}
	assert_int_equal(flow_ckpt_tensor_count(b), n);
	assert_int_equal(flow_ckpt_step(b), 0);
	assert_string_equal(flow_ckpt_get(b, "contents"), "weights");
	assert_string_equal(flow_ckpt_get(b, "model"), SPEC);
	flow_ckpt_free(a);
	flow_ckpt_free(b);
}

static void test_hf_round_trip(void **state)
{
	(void)state;
	const char *src = path_in("hf/step");
	make_ckpt(src);
	flow_ckpt_t *c = open_ckpt(src);
	flow_diag_t diag = FLOW_DIAG_INIT;
	const char *out = path_in("hf/export");
	if (flow_hf_gpt2_export(c, out, NULL, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	/* exists already */
	assert_int_equal(flow_hf_gpt2_export(c, out, NULL, &diag), FLOW_ERR_IO);
	flow_diag_clear(&diag);

	/* names and HF layouts */
	flow_st_t *st = NULL;
	assert_int_equal(flow_st_open(path_in("hf/export/model.safetensors"),
				      &st, &diag), FLOW_OK);
	assert_int_equal(flow_st_tensor_count(st), 4 + 12 * 2);
	assert_string_equal(flow_st_metadata(st, "format"), "pt");
	const flow_st_tensor_t *t = flow_st_tensor_at(
		st, (size_t)flow_st_tensor_find(st,
						"transformer.h.1.mlp.c_fc.weight"));
	assert_int_equal(t->shape.dims[0], 8);
	assert_int_equal(t->shape.dims[1], 32);
	t = flow_st_tensor_at(st, (size_t)flow_st_tensor_find(
				      st, "transformer.wte.weight"));
	assert_int_equal(t->shape.dims[0], 50);
	assert_int_equal(flow_st_tensor_find(st, "lm_head.weight"), -1);
	/* a transposed element: HF c_attn[in=1][out=2] = flow [2][1] */
	int ic = flow_ckpt_tensor_find(c, "h.0.attn.c_attn.weight");
	float fl[24 * 8], hf[8 * 24];
	assert_int_equal(flow_ckpt_read(c, (size_t)ic, NULL, fl, &diag),
			 FLOW_OK);
	assert_int_equal(flow_st_read(st, (size_t)flow_st_tensor_find(
						  st, "transformer.h.0.attn.c_attn.weight"),
				      hf, &diag), FLOW_OK);
	for (int r = 0; r < 24; r++)
		for (int k = 0; k < 8; k++)
			assert_memory_equal(&fl[r * 8 + k], &hf[k * 24 + r], 4);
	flow_st_free(st);

	const char *back = path_in("hf/back");
	if (flow_hf_gpt2_import(out, back, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	expect_same_weights(src, back);
	/* the file alone, config.json beside it */
	const char *back2 = path_in("hf/back2");
	if (flow_hf_gpt2_import(path_in("hf/export/model.safetensors"), back2,
				&diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	expect_same_weights(src, back2);

	/* sharded: several files and the index */
	const char *sh = path_in("hf/sharded");
	flow_hf_export_options_t o = { FLOW_DTYPE_F32, 4096 };
	if (flow_hf_gpt2_export(c, sh, &o, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	assert_int_equal(access(path_in("hf/sharded/model.safetensors.index.json"),
				R_OK), 0);
	assert_int_equal(testutil_count_entries(sh), 5); /* 3 + index, config */
	const char *back3 = path_in("hf/back3");
	if (flow_hf_gpt2_import(sh, back3, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	expect_same_weights(src, back3);

	/* the index names a file that is gone */
	char gone[512];
	snprintf(gone, sizeof gone, "%s",
		 path_in("hf/sharded/model-00002-of-00003.safetensors"));
	if (access(gone, F_OK) != 0)
		fail_msg("expected 3 shards (%d files)",
			 testutil_count_entries(sh));
	assert_int_equal(unlink(gone), 0);
	assert_int_equal(flow_hf_gpt2_import(sh, path_in("hf/back4"), &diag),
			 FLOW_ERR_IO);
	if (!strstr(diag.msg, gone))
		fail_msg("%s", diag.msg);
	assert_null(strchr(diag.msg, '\n'));
	flow_diag_clear(&diag);
	/* no config.json */
	assert_int_equal(unlink(path_in("hf/export/config.json")), 0);
	assert_int_equal(flow_hf_gpt2_import(out, path_in("hf/back5"), &diag),
			 FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "config.json"));
	flow_ckpt_free(c);
}

/* A checkpoint of two ranks, matrices split: the same export bytes. */
static void test_hf_any_layout(void **state)
{
	(void)state;
	char two[512], one[512];
	snprintf(two, sizeof two, "%s", path_in("sharded/step"));
	make_ckpt_ranks(two, 2);
	flow_ckpt_t *c = open_ckpt(two);
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_hf_gpt2_export(c, path_in("sharded/export"), NULL, &diag) !=
	    FLOW_OK)
		fail_msg("%s", diag.msg);
	flow_ckpt_free(c);
	snprintf(one, sizeof one, "%s", path_in("hf/export/model.safetensors"));
	const char *paths[2] = { one,
				 path_in("sharded/export/model.safetensors") };
	char *bytes[2];
	long len[2];
	for (int i = 0; i < 2; i++) {
		FILE *f = fopen(paths[i], "rb");
		assert_non_null(f);
		fseek(f, 0, SEEK_END);
		len[i] = ftell(f);
		rewind(f);
		bytes[i] = malloc((size_t)len[i]);
		assert_non_null(bytes[i]);
		assert_int_equal(fread(bytes[i], 1, (size_t)len[i], f),
				 (size_t)len[i]);
		fclose(f);
	}
	assert_int_equal(len[0], len[1]);
	assert_memory_equal(bytes[0], bytes[1], (size_t)len[0]);
	free(bytes[0]);
	free(bytes[1]);
	expect_same_weights(two, path_in("hf/back"));
}

/* ---- bf16 / f16 against a reference ------------------------------------ */

static double f16_value(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v = e == 0 ? ldexp(m, -24) :
		   e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
	return (h & 0x8000) ? -v : v;
}

/* Nearest f16 by search over all finite values, ties to the even code. */
static uint16_t ref_f16(float x)
{
	double a = fabs((double)x);
	uint16_t sign = signbit(x) ? 0x8000 : 0;
	if (a >= 65520.0)
		return sign | 0x7c00;
	uint16_t best = 0;
	double bd = INFINITY;
	for (uint16_t h = 0; h < 0x7c00; h++) {
		double d = fabs(f16_value(h) - a);
		if (d < bd || (d == bd && (h & 1) == 0 && (best & 1))) {
			bd = d;
			best = h;
		}
	}
	return sign | best;
}

/* Nearest bf16 of the two that bracket x, ties to the even code. */
static uint16_t ref_bf16(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
	uint32_t ul = (uint32_t)lo << 16, uh = (uint32_t)hi << 16;
	float fl, fh;
	memcpy(&fl, &ul, 4);
	memcpy(&fh, &uh, 4);
	/* past the largest finite value rounds as if to 2^128, which is
	 * infinity */
	double vh = (hi & 0x7fff) == 0x7f80 ? copysign(0x1p128, (double)x) : fh;
	double dl = fabs((double)x - fl), dh = fabs(vh - (double)x);
	return dl < dh || (dl == dh && (lo & 1) == 0) ? lo : hi;
}

static void check_dtype_export(flow_dtype_t dt, const char *name)
{
	flow_ckpt_t *c = open_ckpt(path_in("hf/step"));
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_hf_export_options_t o = { dt, 0 };
	const char *out = path_in(name);
	if (flow_hf_gpt2_export(c, out, &o, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	char file[512];
	snprintf(file, sizeof file, "%s/model.safetensors", out);
	flow_st_t *st = NULL;
	assert_int_equal(flow_st_open(file, &st, &diag), FLOW_OK);
	const char *check[] = { "ln_f.bias", "h.1.attn.c_proj.bias",
				"wpe" };
	for (size_t k = 0; k < 3; k++) {
		char hfn[160];
		snprintf(hfn, sizeof hfn, "transformer.%s%s", check[k],
			 strcmp(check[k], "wpe") == 0 ? ".weight" : "");
		int i = flow_st_tensor_find(st, hfn);
		assert_true(i >= 0);
		const flow_st_tensor_t *t = flow_st_tensor_at(st, (size_t)i);
		assert_int_equal(t->dtype, dt);
		size_t n = (size_t)(t->end - t->begin) / 2;
		uint16_t *got = malloc(n * 2);
		float *want = malloc(n * 4);
		assert_true(got && want);
		assert_int_equal(flow_st_read(st, (size_t)i, got, &diag),
				 FLOW_OK);
		int ic = flow_ckpt_tensor_find(c, check[k]);
		assert_int_equal(flow_ckpt_read(c, (size_t)ic, NULL, want,
						&diag), FLOW_OK);
		for (size_t j = 0; j < n; j++) {
			uint16_t r = dt == FLOW_DTYPE_BF16 ? ref_bf16(want[j]) :
							     ref_f16(want[j]);
			if (got[j] != r)
				fail_msg("%s[%zu] = %a: got 0x%04x, want 0x%04x",
					 hfn, j, (double)want[j], got[j], r);
		}
		free(got);
		free(want);
	}
	flow_st_free(st);
	/* and back: the import widens exactly */
	char back[512];
	snprintf(back, sizeof back, "%s.back", out);
	if (flow_hf_gpt2_import(out, back, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	flow_ckpt_t *b = open_ckpt(back);
	int ib = flow_ckpt_tensor_find(b, "ln_f.bias");
	float v[8];
	assert_int_equal(flow_ckpt_read(b, (size_t)ib, NULL, v, &diag), FLOW_OK);
	for (size_t j = 0; j < 8; j++) {
		uint16_t r = dt == FLOW_DTYPE_BF16 ? ref_bf16(tricky[j]) :
						     ref_f16(tricky[j]);
		float w = dt == FLOW_DTYPE_BF16 ? flow_bf16_to_f32(r) :
						  flow_f16_to_f32(r);
		assert_memory_equal(&v[j], &w, 4);
	}
	flow_ckpt_free(b);
	flow_ckpt_free(c);
}

static void test_hf_bf16(void **state)
{
	(void)state;
	check_dtype_export(FLOW_DTYPE_BF16, "hf/bf16");
}

static void test_hf_f16(void **state)
{
	(void)state;
	check_dtype_export(FLOW_DTYPE_F16, "hf/f16");
}

/* ---- llm.c model files -------------------------------------------------- */

static void test_llmc_round_trip(void **state)
{
	(void)state;
	flow_ckpt_t *c = open_ckpt(path_in("hf/step"));
	flow_diag_t diag = FLOW_DIAG_INIT;
	char bin[512];
	snprintf(bin, sizeof bin, "%s", path_in("model.bin"));
	if (flow_llmc_model_export(c, bin, FLOW_DTYPE_F32, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	/* the header and the length llm.c checks */
	FILE *f = fopen(bin, "rb");
	assert_non_null(f);
	int32_t h[256];
	assert_int_equal(fread(h, 4, 256, f), 256);
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fclose(f);
	const int32_t want[8] = { 20240326, 3, 16, 50, 2, 2, 8, 128 };
	assert_memory_equal(h, want, sizeof want);
	flow_gpt_config_t cfg;
	assert_int_equal(flow_gpt_parse(SPEC, &cfg, &diag), FLOW_OK);
	assert_int_equal(len, 1024 + 4 * (long)flow_gpt_param_count(&cfg));
	/* the first qkvw row of layer 0 follows wte, wpe, ln1w, ln1b */
	f = fopen(bin, "rb");
	assert_non_null(f);
	float row[8], fl[24 * 8];
	long at = 1024 + 4 * (128 * 8 + 16 * 8 + 2 * 8 + 2 * 8);
	assert_int_equal(fseek(f, at, SEEK_SET), 0);
	assert_int_equal(fread(row, 4, 8, f), 8);
	fclose(f);
	int ic = flow_ckpt_tensor_find(c, "h.0.attn.c_attn.weight");
	assert_int_equal(flow_ckpt_read(c, (size_t)ic, NULL, fl, &diag),
			 FLOW_OK);
	assert_memory_equal(row, fl, sizeof row);

	const char *back = path_in("llmc/back");
	if (flow_llmc_model_import(bin, back, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	expect_same_weights(path_in("hf/step"), back);

	/* bf16: version 5, half the payload */
	char bf[512];
	snprintf(bf, sizeof bf, "%s", path_in("model_bf16.bin"));
	assert_int_equal(flow_llmc_model_export(c, bf, FLOW_DTYPE_BF16, &diag),
			 FLOW_OK);
	struct stat sb;
	assert_int_equal(stat(bf, &sb), 0);
	assert_int_equal(sb.st_size, 1024 + 2 * (long)flow_gpt_param_count(&cfg));
	assert_int_equal(flow_llmc_model_import(bf, path_in("llmc/bf"), &diag),
			 FLOW_OK);
	assert_int_equal(flow_llmc_model_export(c, bf, FLOW_DTYPE_F16, &diag),
			 FLOW_ERR_USAGE);
	flow_ckpt_free(c);

	/* damaged files: one line naming the file */
	static const struct {
		int word;
		int32_t value;
		long cut;
		const char *msg;
	} bad[] = {
		{ 0, 1234, 0, "bad magic 1234" },
		{ 1, 4, 0, "unknown version 4" },
		{ 7, 40, 0, "padded vocabulary 40 is below the vocabulary 50" },
		{ 6, 0, 0, "header int 6 is 0" },
		{ -1, 0, 4, "the header's model needs" },
		{ -1, 0, 1000000000, "shorter than the 1024-byte" },
	};
	f = fopen(bin, "rb");
	assert_non_null(f);
	char *data = malloc((size_t)len);
	assert_non_null(data);
	assert_int_equal(fread(data, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *copy = malloc((size_t)len);
		assert_non_null(copy);
		memcpy(copy, data, (size_t)len);
		if (bad[i].word >= 0)
			memcpy(copy + 4 * bad[i].word, &bad[i].value, 4);
		long n = bad[i].cut > len ? 100 : len - bad[i].cut;
		const char *p = path_in("bad.bin");
		assert_int_equal(testutil_write_file(p, copy, (size_t)n), 0);
		free(copy);
		flow_diag_clear(&diag);
		flow_err_t err = flow_llmc_model_import(p, path_in("llmc/bad"),
							&diag);
		if (err != FLOW_ERR_FORMAT || !strstr(diag.msg, bad[i].msg) ||
		    !strstr(diag.msg, p))
			fail_msg("case %zu: %s %s", i, flow_err_name(err),
				 diag.msg);
		assert_int_equal(access(path_in("llmc/bad"), F_OK), -1);
	}
	free(data);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_write_read),
		cmocka_unit_test(test_writer_misuse),
		cmocka_unit_test(test_header_errors),
		cmocka_unit_test(test_hf_round_trip),
		cmocka_unit_test(test_hf_any_layout),
		cmocka_unit_test(test_hf_bf16),
		cmocka_unit_test(test_hf_f16),
		cmocka_unit_test(test_llmc_round_trip),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
