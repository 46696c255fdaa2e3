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

static const char *path_in(const char *name)
{
	static char buf[4][512];
	static int k;
	k = (k + 1) % 4;
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_write_read),
		cmocka_unit_test(test_writer_misuse),
		cmocka_unit_test(test_header_errors),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
