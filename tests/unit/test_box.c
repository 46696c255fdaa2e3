/* Boxes (flow/box.h): counts, containment, intersection, element indices
 * and the row-major walk behind every copy between boxes, as properties
 * over random shapes and boxes checked against element-by-element brute
 * force. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <flow/box.h>

#include "sbputil.h"

#define CASES 4000

static flow_box_t box_of(int ndim, const int64_t *start, const int64_t *extent)
{
	flow_box_t b;

	memset(&b, 0, sizeof(b));
	b.ndim = ndim;
	for (int d = 0; d < ndim; d++) {
		b.start[d] = start[d];
		b.extent[d] = extent[d];
	}
	return b;
}

/* A shape of 0..4 dimensions, each 1..6. */
static flow_shape_t random_shape(uint64_t *s)
{
	flow_shape_t shape = { .ndim = (int)splitmix64_range(s, 0, 4) };

	for (int d = 0; d < shape.ndim; d++)
		shape.dims[d] = splitmix64_range(s, 1, 6);
	return shape;
}

/* A box inside shape; empty ones (an extent 0) now and then. */
static flow_box_t random_box(uint64_t *s, const flow_shape_t *shape)
{
	flow_box_t b = { .ndim = shape->ndim };

	for (int d = 0; d < shape->ndim; d++) {
		b.start[d] = splitmix64_range(s, 0, shape->dims[d]);
		b.extent[d] = splitmix64_range(s, 0, shape->dims[d] - b.start[d]);
		if (b.extent[d] == 0 && splitmix64_range(s, 0, 3) != 0 &&
		    b.start[d] < shape->dims[d])
			b.extent[d] = 1;
	}
	return b;
}

/* The coordinates of logical element e of shape. */
static void coords_of(const flow_shape_t *shape, int64_t e, int64_t *pos)
{
	for (int d = shape->ndim - 1; d >= 0; d--) {
		pos[d] = e % shape->dims[d];
		e /= shape->dims[d];
	}
}

static bool holds(const flow_box_t *b, const int64_t *pos)
{
	for (int d = 0; d < b->ndim; d++)
		if (pos[d] < b->start[d] || pos[d] >= b->start[d] + b->extent[d])
			return false;
	return true;
}

static int64_t shape_numel(const flow_shape_t *shape)
{
	int64_t n = 1;

	for (int d = 0; d < shape->ndim; d++)
		n *= shape->dims[d];
	return n;
}

static void test_box_whole_numel_equal_inside(void **state)
{
	(void)state;
	flow_shape_t shape = { 3, { 4, 5, 6 } };
	flow_box_t whole, b;

	flow_box_whole(&shape, &whole);
	assert_int_equal(flow_box_numel(&whole), 120);
	assert_true(flow_box_inside(&whole, &shape));
	b = box_of(3, (int64_t[]){ 1, 0, 2 }, (int64_t[]){ 3, 5, 4 });
	assert_int_equal(flow_box_numel(&b), 60);
	assert_true(flow_box_inside(&b, &shape));
	assert_false(flow_box_equal(&b, &whole));
	b.start[2] = 3; /* 3 + 4 > 6 */
	assert_false(flow_box_inside(&b, &shape));
	b = box_of(2, (int64_t[]){ 0, 0 }, (int64_t[]){ 4, 5 });
	assert_false(flow_box_inside(&b, &shape)); /* ndim differs */
	b = box_of(3, (int64_t[]){ -1, 0, 0 }, (int64_t[]){ 1, 1, 1 });
	assert_false(flow_box_inside(&b, &shape));
	b = box_of(3, (int64_t[]){ 4, 0, 0 }, (int64_t[]){ 0, 5, 6 });
	assert_true(flow_box_inside(&b, &shape)); /* empty, at the end */
	assert_int_equal(flow_box_numel(&b), 0);

	flow_shape_t scalar = { 0 };
	flow_box_whole(&scalar, &whole);
	assert_int_equal(whole.ndim, 0);
	assert_int_equal(flow_box_numel(&whole), 1);
	assert_true(flow_box_inside(&whole, &scalar));
}

static void test_box_intersect_is_the_common_elements(void **state)
{
	(void)state;
	uint64_t s = 0x0b0c5u;

	for (int c = 0; c < CASES; c++) {
		flow_shape_t shape = random_shape(&s);
		flow_box_t a = random_box(&s, &shape), b = random_box(&s, &shape);
		flow_box_t cut, before;
		int64_t common = 0, pos[FLOW_MAX_DIMS];

		memset(&before, 0x5a, sizeof(before));
		cut = before;
		bool any = flow_box_intersect(&a, &b, &cut);
		for (int64_t e = 0; e < shape_numel(&shape); e++) {
			coords_of(&shape, e, pos);
			bool both = holds(&a, pos) && holds(&b, pos);
			common += both;
			if (any && holds(&cut, pos) != both)
				fail_msg("case %d: element %lld in both is %d, in the cut %d",
					 c, (long long)e, both, holds(&cut, pos));
		}
		assert_int_equal(any, common > 0);
		if (any) {
			assert_int_equal(flow_box_numel(&cut), common);
			assert_true(flow_box_inside(&cut, &shape));
			flow_box_t again;
			assert_true(flow_box_intersect(&b, &a, &again));
			assert_true(flow_box_equal(&cut, &again));
		} else {
			/* Untouched when empty. */
			assert_memory_equal(&cut, &before, sizeof(cut));
		}
	}
}

static void test_box_element_walks_the_box_in_row_major_order(void **state)
{
	(void)state;
	uint64_t s = 0xe1e3u;

	for (int c = 0; c < CASES; c++) {
		flow_shape_t shape = random_shape(&s);
		flow_box_t b = random_box(&s, &shape);
		int64_t n = flow_box_numel(&b), last = -1;
		int64_t pos[FLOW_MAX_DIMS], at[FLOW_MAX_DIMS];

		for (int64_t k = 0; k < n; k++) {
			int64_t e = flow_box_element(&shape, &b, k, pos);
			coords_of(&shape, e, at);
			assert_memory_equal(pos, at, sizeof(int64_t) * (size_t)shape.ndim);
			assert_true(holds(&b, pos));
			/* Row-major in the box is increasing in the tensor. */
			assert_true(e > last);
			last = e;
			assert_int_equal(flow_box_element(&shape, &b, k, NULL), e);
		}
	}
}

/* Every element of region copied once to its place, nothing else
 * written; the values are the logical indices, so a misplaced element
 * names where it came from. */
static void test_box_copy_moves_exactly_the_region(void **state)
{
	(void)state;
	uint64_t s = 0xc0b1u;

	for (int c = 0; c < CASES; c++) {
		flow_shape_t shape = random_shape(&s);
		flow_box_t sbox = random_box(&s, &shape);
		flow_box_t dbox = random_box(&s, &shape), region;
		if (!flow_box_intersect(&sbox, &dbox, &region))
			continue;
		int64_t ns = flow_box_numel(&sbox), nd = flow_box_numel(&dbox);
		int64_t *src = malloc(sizeof(int64_t) * (size_t)ns);
		int64_t *dst = malloc(sizeof(int64_t) * (size_t)nd);
		int64_t pos[FLOW_MAX_DIMS];
		assert_non_null(src);
		assert_non_null(dst);
		for (int64_t k = 0; k < ns; k++)
			src[k] = flow_box_element(&shape, &sbox, k, NULL);
		for (int64_t k = 0; k < nd; k++)
			dst[k] = -1;
		flow_box_copy(dst, &dbox, src, &sbox, &region, sizeof(int64_t));
		for (int64_t k = 0; k < nd; k++) {
			int64_t e = flow_box_element(&shape, &dbox, k, pos);
			int64_t want = holds(&region, pos) ? e : -1;
			if (dst[k] != want)
				fail_msg("case %d: destination element %lld is %lld, expected %lld",
					 c, (long long)k, (long long)dst[k], (long long)want);
		}
		free(dst);
		free(src);
	}
}

typedef struct {
	int calls;
	size_t elems;
} count_t;

static void count_run(void *dst, const void *src, size_t n, void *ctx)
{
	count_t *k = ctx;
	float *d = dst;
	const float *f = src;

	k->calls++;
	k->elems += n;
	for (size_t i = 0; i < n; i++)
		d[i] += f[i];
}

/* Whole trailing dimensions merge into one run; the run function sees
 * every element of the region once. */
static void test_box_apply_merges_whole_trailing_dimensions(void **state)
{
	(void)state;
	float src[4 * 5 * 6], dst[4 * 5 * 6];
	flow_shape_t shape = { 3, { 4, 5, 6 } };
	flow_box_t whole, rows, cols;
	count_t k = { 0, 0 };

	for (int i = 0; i < 120; i++) {
		src[i] = (float)i;
		dst[i] = 1.0f;
	}
	flow_box_whole(&shape, &whole);
	flow_box_apply(dst, &whole, src, &whole, &whole, sizeof(float),
		       count_run, &k);
	assert_int_equal(k.calls, 1);
	assert_int_equal(k.elems, 120);
	for (int i = 0; i < 120; i++)
		assert_true(dst[i] == (float)i + 1.0f);

	/* Rows 1..2 of every plane: whole last dimension, partial middle
	 * one, so one run per plane. */
	rows = box_of(3, (int64_t[]){ 0, 1, 0 }, (int64_t[]){ 4, 2, 6 });
	k = (count_t){ 0, 0 };
	flow_box_apply(dst, &whole, src, &whole, &rows, sizeof(float),
		       count_run, &k);
	assert_int_equal(k.calls, 4);
	assert_int_equal(k.elems, 48);

	/* A partial last dimension: one run per row. */
	cols = box_of(3, (int64_t[]){ 0, 0, 2 }, (int64_t[]){ 4, 5, 3 });
	k = (count_t){ 0, 0 };
	flow_box_apply(dst, &whole, src, &whole, &cols, sizeof(float),
		       count_run, &k);
	assert_int_equal(k.calls, 20);
	assert_int_equal(k.elems, 60);

	/* A scalar is one element. */
	flow_box_t scalar = { 0 };
	k = (count_t){ 0, 0 };
	flow_box_apply(dst, &scalar, src, &scalar, &scalar, sizeof(float),
		       count_run, &k);
	assert_int_equal(k.calls, 1);
	assert_int_equal(k.elems, 1);

	/* An empty region calls nothing. */
	flow_box_t none = box_of(3, (int64_t[]){ 0, 0, 0 }, (int64_t[]){ 4, 0, 6 });
	k = (count_t){ 0, 0 };
	flow_box_apply(dst, &whole, src, &whole, &none, sizeof(float),
		       count_run, &k);
	assert_int_equal(k.calls, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_box_whole_numel_equal_inside),
		cmocka_unit_test(test_box_intersect_is_the_common_elements),
		cmocka_unit_test(test_box_element_walks_the_box_in_row_major_order),
		cmocka_unit_test(test_box_copy_moves_exactly_the_region),
		cmocka_unit_test(test_box_apply_merges_whole_trailing_dimensions),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
