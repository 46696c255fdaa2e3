/* Dtypes, half-precision rounding, one element of a raw buffer, shapes and
 * shape lists, tensors and views. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <flow/tensor.h>

static float from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint32_t bits_of(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static void test_tensor_dtype_names_round_trip(void **state)
{
	(void)state;
	for (int i = 0; i < FLOW_DTYPE_COUNT; i++) {
		flow_dtype_t d;
		assert_int_equal(flow_dtype_parse(flow_dtype_name((flow_dtype_t)i), &d, NULL), FLOW_OK);
		assert_int_equal(d, i);
	}
	flow_dtype_t d;
	assert_int_equal(flow_dtype_parse("bfloat16", &d, NULL), FLOW_OK);
	assert_int_equal(d, FLOW_DTYPE_BF16);
	assert_int_equal(flow_dtype_size(FLOW_DTYPE_I64), 8);
	assert_int_equal(flow_dtype_size(FLOW_DTYPE_U8), 1);
	assert_int_equal(flow_dtype_size(FLOW_DTYPE_U32), 4);
	assert_int_equal(flow_dtype_parse("uint32", &d, NULL), FLOW_OK);
	assert_int_equal(d, FLOW_DTYPE_U32);
	assert_int_equal(flow_dtype_size((flow_dtype_t)99), 0);
	assert_null(flow_dtype_name((flow_dtype_t)99));
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_dtype_parse("f8", &d, &diag), FLOW_ERR_FORMAT);
	assert_non_null(strstr(diag.msg, "unknown dtype 'f8'"));
}

/* Every f16 value converts exactly to f32 and back; the midpoint between
 * two neighbours rounds to the one with an even mantissa, and points just
 * off the midpoint round to the nearer one. */
static void test_tensor_f16_rounds_to_nearest_even_exhaustively(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 0x7c00; h++) {
		float f = flow_f16_to_f32((uint16_t)h);
		assert_int_equal(flow_f32_to_f16(f), h);
		assert_int_equal(flow_f32_to_f16(-f), h | 0x8000);
		float next = flow_f16_to_f32((uint16_t)(h + 1)); /* 0x7c00 = inf */
		if (h + 1 == 0x7c00)
			next = 65536.0f; /* where the next step would be */
		double mid = ((double)f + (double)next) / 2;
		float midf = (float)mid; /* exact: f16 has 11 bits */
		uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
		assert_int_equal(flow_f32_to_f16(midf), even);
		assert_int_equal(flow_f32_to_f16(nextafterf(midf, 0)), h);
		assert_int_equal(flow_f32_to_f16(nextafterf(midf, INFINITY)), h + 1);
	}
	assert_int_equal(flow_f32_to_f16(INFINITY), 0x7c00);
	assert_int_equal(flow_f32_to_f16(-INFINITY), 0xfc00);
	assert_int_equal(flow_f32_to_f16(1e6f), 0x7c00);
	assert_int_equal(flow_f32_to_f16(0x1p-26f), 0); /* below half the least subnormal */
	assert_true(isnan(flow_f16_to_f32(flow_f32_to_f16(NAN))));
	assert_true(isinf(flow_f16_to_f32(0x7c00)));
	assert_true(flow_f16_to_f32(0x3c00) == 1.0f);
	assert_true(flow_f16_to_f32(0x0001) == 0x1p-24f);
}

static void test_tensor_bf16_rounds_to_nearest_even(void **state)
{
	(void)state;
	/* For a spread of f32 bit patterns, the bf16 result is the nearer of
	 * the two bf16 neighbours, ties to the even one. */
	for (uint64_t u = 0; u < 0x7f800000u; u += 0x10001u + (u >> 12)) {
		float f = from_bits((uint32_t)u);
		uint16_t b = flow_f32_to_bf16(f);
		uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
		double dlo = fabs((double)f - flow_bf16_to_f32(lo));
		double dhi = fabs((double)flow_bf16_to_f32(hi) - f);
		uint16_t want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
		assert_int_equal(b, want);
		assert_int_equal(flow_f32_to_bf16(-f), want | 0x8000);
	}
	assert_int_equal(flow_f32_to_bf16(1.0f), 0x3f80);
	assert_int_equal(flow_f32_to_bf16(from_bits(0x3f808000)), 0x3f80); /* tie, even */
	assert_int_equal(flow_f32_to_bf16(from_bits(0x3f818000)), 0x3f82); /* tie, to even */
	assert_int_equal(flow_f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80); /* overflow */
	assert_true(isnan(flow_bf16_to_f32(flow_f32_to_bf16(NAN))));
	assert_int_equal(flow_f32_to_bf16(from_bits(0x7f800001)) & 0x7fc0, 0x7fc0);
	assert_int_equal(bits_of(flow_bf16_to_f32(0xc000)), 0xc0000000u);
}

static void test_tensor_shape_parse_and_format(void **state)
{
	(void)state;
	flow_shape_t s;
	char buf[64];
	assert_int_equal(flow_shape_parse("2,3,4", &s, NULL), FLOW_OK);
	assert_int_equal(s.ndim, 3);
	assert_int_equal(flow_shape_format(&s, buf, sizeof(buf)), 7);
	assert_string_equal(buf, "(2,3,4)");
	assert_int_equal(flow_shape_parse("(5)", &s, NULL), FLOW_OK);
	assert_int_equal(s.dims[0], 5);
	assert_int_equal(flow_shape_parse("()", &s, NULL), FLOW_OK);
	assert_int_equal(s.ndim, 0);
	size_t n;
	assert_int_equal(flow_shape_numel(&s, &n, NULL), FLOW_OK);
	assert_int_equal(n, 1);
	assert_int_equal(flow_shape_parse("8x1024", &s, NULL), FLOW_OK);
	assert_int_equal(s.dims[1], 1024);
	assert_int_equal(flow_shape_format(&s, buf, 4), 8); /* truncated, full length returned */
	assert_string_equal(buf, "(8,");
	assert_int_equal(flow_shape_parse("2,,3", &s, NULL), FLOW_ERR_FORMAT);
	assert_int_equal(flow_shape_parse("2,3,", &s, NULL), FLOW_ERR_FORMAT);
	assert_int_equal(flow_shape_parse("a", &s, NULL), FLOW_ERR_FORMAT);
	assert_int_equal(flow_shape_parse("1,2,3,4,5,6,7,8,9", &s, NULL), FLOW_ERR_FORMAT);
	int64_t big[2] = { INT64_MAX, 4 };
	assert_int_equal(flow_shape_init(&s, 2, big, NULL), FLOW_OK);
	assert_int_equal(flow_shape_numel(&s, &n, NULL), FLOW_ERR_RANGE);
	int64_t neg[1] = { -1 };
	assert_int_equal(flow_shape_init(&s, 1, neg, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_shape_init(&s, FLOW_MAX_DIMS + 1, big, NULL), FLOW_ERR_USAGE);
}

static flow_tensor_t *iota(flow_dtype_t dtype, int ndim, const int64_t *dims)
{
	flow_shape_t s;
	flow_tensor_t *t;
	assert_int_equal(flow_shape_init(&s, ndim, dims, NULL), FLOW_OK);
	assert_int_equal(flow_tensor_new(dtype, &s, &t, NULL), FLOW_OK);
	for (size_t i = 0; i < flow_tensor_numel(t); i++)
		flow_tensor_set(t, i, (double)i);
	return t;
}

static void test_tensor_dtype_load_and_store_one_element(void **state)
{
	(void)state;
	union {
		float f32[3];
		uint16_t u16[3];
		int32_t i32[3];
		int64_t i64[3];
		uint8_t u8[3];
		uint32_t u32[3];
	} buf;
	for (int d = 0; d < FLOW_DTYPE_COUNT; d++) {
		memset(&buf, 0, sizeof(buf));
		flow_dtype_store(&buf, 1, (flow_dtype_t)d, 200);
		assert_true(flow_dtype_load(&buf, 1, (flow_dtype_t)d) == 200);
		/* Only element 1 was written. */
		assert_true(flow_dtype_load(&buf, 0, (flow_dtype_t)d) == 0);
		assert_true(flow_dtype_load(&buf, 2, (flow_dtype_t)d) == 0);
	}
	/* Element i of the dtype's array, in its own encoding. */
	flow_dtype_store(&buf, 2, FLOW_DTYPE_BF16, 1.0);
	assert_int_equal(buf.u16[2], 0x3f80);
	flow_dtype_store(&buf, 2, FLOW_DTYPE_F16, 1.0);
	assert_int_equal(buf.u16[2], 0x3c00);
	flow_dtype_store(&buf, 1, FLOW_DTYPE_I64, -3);
	assert_int_equal(buf.i64[1], -3);
	flow_dtype_store(&buf, 2, FLOW_DTYPE_U32, 4000000000.0);
	assert_int_equal(buf.u32[2], 4000000000u);
	/* Floats round to nearest even: 1 + 2^-8 is a tie for bf16. */
	flow_dtype_store(&buf, 0, FLOW_DTYPE_BF16, 1.00390625);
	assert_true(flow_dtype_load(&buf, 0, FLOW_DTYPE_BF16) == 1.0);
	flow_dtype_store(&buf, 0, FLOW_DTYPE_F32, 0.1);
	assert_true(flow_dtype_load(&buf, 0, FLOW_DTYPE_F32) == (double)0.1f);
	/* An unknown dtype reads 0 and writes nothing. */
	memset(&buf, 0x11, sizeof(buf));
	flow_dtype_store(&buf, 0, (flow_dtype_t)FLOW_DTYPE_COUNT, 5);
	assert_int_equal(buf.u8[0], 0x11);
	assert_true(flow_dtype_load(&buf, 0, (flow_dtype_t)FLOW_DTYPE_COUNT) == 0);
}

static void test_tensor_get_and_set_go_through_the_dtype(void **state)
{
	(void)state;
	int64_t dims[2] = { 2, 3 };
	flow_shape_t shape;
	flow_tensor_t *t, *v;
	assert_int_equal(flow_shape_init(&shape, 2, dims, NULL), FLOW_OK);
	assert_int_equal(flow_tensor_new(FLOW_DTYPE_F16, &shape, &t, NULL), FLOW_OK);
	for (size_t i = 0; i < 6; i++)
		flow_tensor_set(t, i, (double)i + 0.5);
	/* Row-major in the buffer, in the dtype's encoding. */
	for (size_t i = 0; i < 6; i++)
		assert_true(flow_dtype_load(flow_tensor_data(t), i, FLOW_DTYPE_F16) ==
			    (double)i + 0.5);
	/* A transposed view reads through its strides. */
	assert_int_equal(flow_tensor_transpose(t, 0, 1, &v, NULL), FLOW_OK);
	assert_true(flow_tensor_get(v, 1) == 3.5);
	flow_tensor_set(v, 1, 9);
	assert_true(flow_dtype_load(flow_tensor_data(t), 3, FLOW_DTYPE_F16) == 9);
	flow_tensor_free(v);
	flow_tensor_free(t);
}

/* flow_shape_io_parse with room for 3 shapes a side. */
static flow_err_t parse_io(const char *text, flow_shape_t *in, bool *present,
			   int *nin, flow_shape_t *out, int *nout,
			   flow_diag_t *diag)
{
	return flow_shape_io_parse(text, 3, in, present, nin, out, nout, diag);
}

static void assert_shape(const flow_shape_t *s, const char *want)
{
	char text[64];
	flow_shape_format(s, text, sizeof(text));
	assert_string_equal(text, want);
}

static void test_tensor_shape_io_parse_reads_inputs_and_outputs(void **state)
{
	(void)state;
	flow_shape_t in[3], out[3];
	bool present[3];
	int nin = -1, nout = -1;
	flow_diag_t diag = FLOW_DIAG_INIT;

	assert_int_equal(parse_io("4x8;16x8;-->4x16", in, present, &nin, out, &nout, &diag),
			 FLOW_OK);
	assert_int_equal(nin, 3);
	assert_int_equal(nout, 1);
	assert_shape(&in[0], "(4,8)");
	assert_shape(&in[1], "(16,8)");
	assert_true(present[0] && present[1] && !present[2]);
	assert_int_equal(in[2].ndim, 0);
	assert_shape(&out[0], "(4,16)");

	/* An empty item is absent too; scalars and parenthesised shapes. */
	assert_int_equal(parse_io(";();(2,3)->();5", in, present, &nin, out, &nout, &diag),
			 FLOW_OK);
	assert_int_equal(nin, 3);
	assert_int_equal(nout, 2);
	assert_false(present[0]);
	assert_true(present[1] && present[2]);
	assert_shape(&in[1], "()");
	assert_shape(&in[2], "(2,3)");
	assert_shape(&out[0], "()");
	assert_shape(&out[1], "(5)");
}

static void test_tensor_shape_io_parse_errors_are_one_line(void **state)
{
	(void)state;
	static const struct {
		const char *text;
		flow_err_t err;
		const char *msg;
	} cases[] = {
		{ "4x4", FLOW_ERR_FORMAT, "expected IN;...->OUT;... in '4x4'" },
		{ "4x4->", FLOW_ERR_FORMAT, "missing output shape in '4x4->'" },
		{ "4x4->4;-", FLOW_ERR_FORMAT, "missing output shape in '4x4->4;-'" },
		{ "4x4->4y4", FLOW_ERR_FORMAT, "invalid shape '4y4': expected dimensions like 2,3,4" },
		{ "4q->4", FLOW_ERR_FORMAT, "invalid shape '4q': expected dimensions like 2,3,4" },
		{ "1;2;3;4->1", FLOW_ERR_FORMAT, "more than 3 inputs in '1;2;3;4->1'" },
		{ "1->1;2;3;4", FLOW_ERR_FORMAT, "more than 3 outputs in '1->1;2;3;4'" },
		{ "4->4294967296x4294967296", FLOW_ERR_RANGE,
		  "shape '4294967296x4294967296' has too many elements" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		flow_shape_t in[3], out[3];
		bool present[3];
		int nin = -1, nout = -1;
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(parse_io(cases[i].text, in, present, &nin, out, &nout, &diag),
				 cases[i].err);
		assert_string_equal(diag.msg, cases[i].msg);
		/* The counts are outputs: untouched on failure. */
		assert_int_equal(nin, -1);
		assert_int_equal(nout, -1);
	}

	/* A shape of 128 characters or more. */
	char text[300], want[400];
	memset(text, '1', 130);
	snprintf(text + 130, sizeof(text) - 130, "->1");
	snprintf(want, sizeof(want), "shape too long in '%s'", text);
	flow_shape_t in[3], out[3];
	bool present[3];
	int nin, nout;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(parse_io(text, in, present, &nin, out, &nout, &diag), FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg, want);
}

static void test_tensor_new_is_aligned_and_zeroed(void **state)
{
	(void)state;
	int64_t dims[2] = { 3, 5 };
	flow_shape_t s;
	flow_tensor_t *t;
	assert_int_equal(flow_shape_init(&s, 2, dims, NULL), FLOW_OK);
	assert_int_equal(flow_tensor_new(FLOW_DTYPE_BF16, &s, &t, NULL), FLOW_OK);
	assert_int_equal((uintptr_t)flow_tensor_data(t) % 64, 0);
	assert_int_equal(flow_tensor_numel(t), 15);
	assert_int_equal(flow_tensor_nbytes(t), 30);
	assert_true(flow_tensor_is_contiguous(t));
	assert_int_equal(t->strides[0], 5);
	for (size_t i = 0; i < 15; i++)
		assert_true(flow_tensor_get(t, i) == 0.0);
	flow_tensor_free(t);
	flow_tensor_free(NULL);
}

static void test_tensor_views_share_storage_and_outlive_the_base(void **state)
{
	(void)state;
	int64_t dims[3] = { 2, 3, 4 };
	flow_tensor_t *t = iota(FLOW_DTYPE_F32, 3, dims);
	flow_tensor_t *sl, *tr, *rs;
	assert_int_equal(flow_tensor_slice(t, 1, 1, 2, &sl, NULL), FLOW_OK);
	assert_int_equal(sl->shape.dims[1], 2);
	assert_false(flow_tensor_is_contiguous(sl));
	/* sl[1][0][3] = t[1][1][3] = 12 + 4 + 3 */
	assert_true(flow_tensor_get(sl, 1 * 8 + 0 * 4 + 3) == 19.0);
	assert_int_equal(flow_tensor_transpose(t, 0, 2, &tr, NULL), FLOW_OK);
	assert_int_equal(tr->shape.dims[0], 4);
	/* tr[3][2][1] = t[1][2][3] = 23 */
	assert_true(flow_tensor_get(tr, 3 * 6 + 2 * 2 + 1) == 23.0);
	flow_shape_t s2;
	int64_t d2[2] = { 6, 4 };
	assert_int_equal(flow_shape_init(&s2, 2, d2, NULL), FLOW_OK);
	assert_int_equal(flow_tensor_reshape(t, &s2, &rs, NULL), FLOW_OK);
	flow_tensor_free(t); /* the views keep the buffer alive */
	flow_tensor_set(rs, 5, -1.0);
	assert_true(flow_tensor_get(sl, 1) == -1.0); /* sl[0][0][1] = t[0][1][1] = index 5 */
	flow_tensor_t *bad;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_tensor_reshape(sl, &s2, &bad, &diag), FLOW_ERR_USAGE);
	assert_int_equal(flow_tensor_slice(rs, 0, 5, 2, &bad, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_tensor_slice(rs, 2, 0, 1, &bad, NULL), FLOW_ERR_USAGE);
	assert_int_equal(flow_tensor_transpose(rs, 0, 2, &bad, NULL), FLOW_ERR_USAGE);
	flow_tensor_free(sl);
	flow_tensor_free(tr);
	flow_tensor_free(rs);
}

static void test_tensor_copy_converts_dtypes(void **state)
{
	(void)state;
	int64_t dims[2] = { 2, 3 };
	flow_tensor_t *f = iota(FLOW_DTYPE_F32, 2, dims);
	flow_tensor_set(f, 1, 1.00390625); /* 1 + 2^-8: a bf16 tie, rounds to 1 */
	flow_tensor_t *b = iota(FLOW_DTYPE_BF16, 2, dims);
	assert_int_equal(flow_tensor_copy(b, f, NULL), FLOW_OK);
	assert_true(flow_tensor_get(b, 1) == 1.0);
	assert_true(flow_tensor_get(b, 5) == 5.0);
	flow_tensor_t *tr;
	assert_int_equal(flow_tensor_transpose(f, 0, 1, &tr, NULL), FLOW_OK);
	int64_t tdims[2] = { 3, 2 };
	flow_tensor_t *i = iota(FLOW_DTYPE_I32, 2, tdims);
	flow_tensor_set(f, 1, 1.0);
	assert_int_equal(flow_tensor_copy(i, tr, NULL), FLOW_OK);
	/* i[r][c] = f[c][r] */
	assert_true(flow_tensor_get(i, 1) == 3.0);
	assert_true(flow_tensor_get(i, 4) == 2.0);
	flow_tensor_t *u8 = iota(FLOW_DTYPE_U8, 2, tdims);
	flow_tensor_set(f, 0, 300.0);
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_tensor_copy(u8, tr, &diag), FLOW_ERR_RANGE);
	assert_string_equal(diag.msg, "element 0 (300) does not fit in u8");
	flow_tensor_set(f, 0, 0.5);
	assert_int_equal(flow_tensor_copy(i, tr, NULL), FLOW_ERR_RANGE);
	assert_int_equal(flow_tensor_copy(i, f, NULL), FLOW_ERR_USAGE); /* shapes differ */
	int64_t one[1] = { 2 };
	flow_tensor_t *a = iota(FLOW_DTYPE_I64, 1, one), *c = iota(FLOW_DTYPE_I64, 1, one);
	((int64_t *)flow_tensor_data(a))[1] = INT64_MAX - 1; /* not representable in double */
	assert_int_equal(flow_tensor_copy(c, a, NULL), FLOW_OK);
	assert_true(((int64_t *)flow_tensor_data(c))[1] == INT64_MAX - 1);
	flow_tensor_free(f);
	flow_tensor_free(b);
	flow_tensor_free(tr);
	flow_tensor_free(i);
	flow_tensor_free(u8);
	flow_tensor_free(a);
	flow_tensor_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tensor_dtype_names_round_trip),
		cmocka_unit_test(test_tensor_f16_rounds_to_nearest_even_exhaustively),
		cmocka_unit_test(test_tensor_bf16_rounds_to_nearest_even),
		cmocka_unit_test(test_tensor_shape_parse_and_format),
		cmocka_unit_test(test_tensor_dtype_load_and_store_one_element),
		cmocka_unit_test(test_tensor_shape_io_parse_reads_inputs_and_outputs),
		cmocka_unit_test(test_tensor_shape_io_parse_errors_are_one_line),
		cmocka_unit_test(test_tensor_new_is_aligned_and_zeroed),
		cmocka_unit_test(test_tensor_get_and_set_go_through_the_dtype),
		cmocka_unit_test(test_tensor_views_share_storage_and_outlive_the_base),
		cmocka_unit_test(test_tensor_copy_converts_dtypes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
