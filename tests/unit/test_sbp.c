/* Meshes, placements, SBP text forms, validity and local boxes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <flow/sbp.h>

#include "sbputil.h"

static flow_shape_t shape_of(const char *text)
{
	flow_shape_t s;
	assert_int_equal(flow_shape_parse(text, &s, NULL), FLOW_OK);
	return s;
}

/* ---- meshes ------------------------------------------------------------------ */

static void test_sbp_mesh_text_round_trips(void **state)
{
	(void)state;
	static const char *texts[] = {
		"8", "2x4", "2x4:dp,tp", "2x4@8", "2@1/4", "1x1x1x1",
		"2x3@0/1x2", "2x2x2:pp,dp,tp@16", "4:_x9@3/5",
	};
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		flow_mesh_t m = mesh_of(texts[i]), back;
		char buf[FLOW_MESH_TEXT_MAX];
		assert_int_equal(flow_mesh_format(&m, buf, sizeof(buf)), strlen(texts[i]));
		assert_string_equal(buf, texts[i]);
		back = mesh_of(buf);
		assert_true(flow_mesh_equal(&m, &back));
	}
	/* Row-major strides and base 0 are left out; other forms come back
	 * in the short one. */
	flow_mesh_t m = mesh_of("2x4@0/4x1");
	char buf[FLOW_MESH_TEXT_MAX], tiny[4];
	flow_mesh_format(&m, buf, sizeof(buf));
	assert_string_equal(buf, "2x4");
	/* A short buffer gets a truncated, terminated prefix and the length
	 * needed. */
	m = mesh_of("2x4:dp,tp");
	assert_int_equal(flow_mesh_format(&m, tiny, sizeof(tiny)), 9);
	assert_string_equal(tiny, "2x4");
}

static void test_sbp_mesh_parse_errors_quote_the_text(void **state)
{
	(void)state;
	static const struct {
		const char *text, *msg;
	} cases[] = {
		{ "", "mesh '': expected a size at end" },
		{ "2x", "mesh '2x': expected a size after 'x'" },
		{ "x2", "mesh 'x2': expected a size at 'x2'" },
		{ "2x0", "mesh '2x0': size of axis 1 must be at least 1" },
		{ "2x2x2x2x2", "mesh '2x2x2x2x2': more than 4 axes" },
		{ "99999999999999999999", "mesh '99999999999999999999': size '99999999999999999999' is too large" },
		{ "4611686018427387904x4", "mesh '4611686018427387904x4': too many ranks" },
		{ "2x4:dp", "mesh '2x4:dp': 1 name for 2 axes" },
		{ "2:a,b", "mesh '2:a,b': 2 names for 1 axis" },
		{ "2x4:dp,dp", "mesh '2x4:dp,dp': duplicate axis name 'dp'" },
		{ "2x4:dp,1t", "mesh '2x4:dp,1t': invalid axis name '1t'" },
		{ "2x4:dp,", "mesh '2x4:dp,': invalid axis name ''" },
		{ "2:abcdefghijklmnop", "mesh '2:abcdefghijklmnop': axis name 'abcdefghijklmnop' is longer than 15 characters" },
		{ "2@-1", "mesh '2@-1': negative rank '-1'" },
		{ "2@", "mesh '2@': expected a rank at end" },
		{ "2@x", "mesh '2@x': expected a rank at 'x'" },
		{ "2@99999999999999999999", "mesh '2@99999999999999999999': rank '99999999999999999999' is too large" },
		{ "2x4@9223372036854775807", "mesh '2x4@9223372036854775807': ranks beyond 9223372036854775807" },
		{ "2x4@0/1", "mesh '2x4@0/1': 1 stride for 2 axes" },
		{ "2@1/0", "mesh '2@1/0': stride of axis 0 must be at least 1" },
		{ "2x2@0/1x1", "mesh '2x2@0/1x1': strides overlap: axis 0's stride 1 repeats ranks of the axes with smaller strides" },
		{ "3x2@0/2x3", "mesh '3x2@0/2x3': strides overlap: axis 1's stride 3 repeats ranks of the axes with smaller strides" },
		{ "2x4?", "mesh '2x4?': unexpected text at '?'" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_mesh_t m;
		memset(&m, 0x5a, sizeof(m));
		flow_mesh_t before = m;
		assert_int_equal(flow_mesh_parse(cases[i].text, &m, &diag), FLOW_ERR_USAGE);
		assert_string_equal(diag.msg, cases[i].msg);
		assert_memory_equal(&m, &before, sizeof(m)); /* untouched */
	}
}

static void test_sbp_mesh_init_and_check(void **state)
{
	(void)state;
	int64_t dims[5] = { 2, 4, 1, 3, 2 }, bad[2] = { 2, 0 };
	flow_mesh_t m, p = mesh_of("2x4@8");
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_mesh_init(&m, 2, dims, 8, NULL), FLOW_OK);
	assert_true(flow_mesh_equal(&m, &p));
	assert_int_equal(m.stride[0], 4);
	assert_int_equal(m.stride[1], 1);
	assert_int_equal(flow_mesh_init(&m, 2, bad, 0, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "mesh: size of axis 1 must be at least 1");
	flow_diag_clear(&diag);
	assert_int_equal(flow_mesh_init(&m, 5, dims, 0, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "mesh: 5 axes; expected 1 to 4");
	flow_diag_clear(&diag);
	assert_int_equal(flow_mesh_init(&m, 1, dims, -3, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "mesh: negative rank -3");

	/* A mesh built field by field is checked like a parsed one. */
	m = mesh_of("2x2");
	assert_int_equal(flow_mesh_check(&m, NULL), FLOW_OK);
	m.stride[0] = 1;
	flow_diag_clear(&diag);
	assert_int_equal(flow_mesh_check(&m, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "mesh '2x2@0/1x1': strides overlap: axis 0's stride 1 repeats ranks of the axes with smaller strides");
	m.ndim = 0;
	assert_int_equal(flow_mesh_check(&m, NULL), FLOW_ERR_USAGE);
}

static void test_sbp_mesh_ranks_coords_and_inverse(void **state)
{
	(void)state;
	flow_mesh_t m = mesh_of("2x4@8");
	assert_int_equal(flow_mesh_size(&m), 8);
	int64_t c[FLOW_MESH_MAX_AXES];
	flow_mesh_coords(&m, 6, c);
	assert_int_equal(c[0], 1);
	assert_int_equal(c[1], 2);
	assert_int_equal(flow_mesh_index(&m, c), 6);
	assert_int_equal(flow_mesh_rank(&m, 6), 14);
	assert_int_equal(flow_mesh_rank(&m, 8), -1);
	assert_int_equal(flow_mesh_index_of(&m, 14), 6);
	assert_int_equal(flow_mesh_index_of(&m, 7), -1);
	assert_int_equal(flow_mesh_index_of(&m, 16), -1);

	/* "2@1/4": ranks 1 and 5. */
	m = mesh_of("2@1/4");
	assert_int_equal(flow_mesh_rank(&m, 0), 1);
	assert_int_equal(flow_mesh_rank(&m, 1), 5);
	assert_int_equal(flow_mesh_index_of(&m, 5), 1);
	assert_int_equal(flow_mesh_index_of(&m, 3), -1);

	/* Column-major over 0..5, and every rank maps back. */
	m = mesh_of("2x3@0/1x2");
	static const int64_t want[6] = { 0, 2, 4, 1, 3, 5 };
	for (int64_t i = 0; i < 6; i++) {
		assert_int_equal(flow_mesh_rank(&m, i), want[i]);
		assert_int_equal(flow_mesh_index_of(&m, want[i]), i);
	}

	/* Size-1 axes have no say in the rank. */
	m = mesh_of("2x1x3@4");
	for (int64_t i = 0; i < 6; i++)
		assert_int_equal(flow_mesh_index_of(&m, flow_mesh_rank(&m, i)), i);
}

static void test_sbp_mesh_axis_names(void **state)
{
	(void)state;
	flow_mesh_t m = mesh_of("2x2x2:pp,dp,tp");
	assert_int_equal(flow_mesh_axis(&m, "pp"), 0);
	assert_int_equal(flow_mesh_axis(&m, "tp"), 2);
	assert_int_equal(flow_mesh_axis(&m, "ep"), -1);
	m = mesh_of("2x2");
	assert_int_equal(flow_mesh_axis(&m, ""), -1);
}

static void test_sbp_mesh_groups_are_affine_sub_meshes(void **state)
{
	(void)state;
	flow_mesh_t m = mesh_of("2x4:dp,tp@8"), g, gg;
	char buf[FLOW_MESH_TEXT_MAX];
	/* The tp group of position 5 (rank 13): ranks 12..15. */
	flow_mesh_group(&m, 1u << 1, 5, &g);
	flow_mesh_format(&g, buf, sizeof(buf));
	assert_string_equal(buf, "4:tp@12");
	/* Its dp group: ranks 9 and 13. */
	flow_mesh_group(&m, 1u << 0, 5, &g);
	flow_mesh_format(&g, buf, sizeof(buf));
	assert_string_equal(buf, "2:dp@9/4");
	assert_int_equal(flow_mesh_rank(&g, 1), 13);
	assert_int_equal(flow_mesh_index_of(&g, 9), 0);
	/* Both axes: the mesh itself; none: the position alone. */
	flow_mesh_group(&m, 3u, 5, &g);
	assert_true(flow_mesh_equal(&g, &m));
	flow_mesh_group(&m, 0u, 5, &g);
	flow_mesh_format(&g, buf, sizeof(buf));
	assert_string_equal(buf, "1@13");

	/* A pipeline stage of a 3-D mesh, and a group within it: groups of
	 * groups stay affine. */
	m = mesh_of("2x2x3:pp,dp,tp");
	flow_mesh_group(&m, 6u, 7, &g); /* position 7 = (1,0,1) */
	flow_mesh_format(&g, buf, sizeof(buf));
	assert_string_equal(buf, "2x3:dp,tp@6");
	flow_mesh_group(&g, 1u, 4, &gg); /* dp group of stage 1's (1,1) */
	flow_mesh_format(&gg, buf, sizeof(buf));
	assert_string_equal(buf, "2:dp@7/3");
	for (int64_t i = 0; i < 2; i++) {
		int64_t r = flow_mesh_rank(&gg, i);
		int64_t c[FLOW_MESH_MAX_AXES];
		flow_mesh_coords(&m, flow_mesh_index_of(&m, r), c);
		assert_int_equal(c[0], 1);
		assert_int_equal(c[1], i);
		assert_int_equal(c[2], 1);
	}
	/* Non-adjacent axes: pp and tp of position 4 = (0,1,1). */
	flow_mesh_group(&m, 5u, 4, &g);
	flow_mesh_format(&g, buf, sizeof(buf));
	assert_string_equal(buf, "2x3:pp,tp@3/6x1");
}

/* The top rank is the largest rank of any position, for random meshes
 * with any base and strides (row-major, column-major, gapped). */
static void test_sbp_mesh_top_rank_is_the_largest_rank(void **state)
{
	(void)state;
	uint64_t seed = 0x7095u;

	for (int c = 0; c < 2000; c++) {
		flow_mesh_t m;
		int ndim = (int)splitmix64_range(&seed, 1, 4);
		int64_t dims[FLOW_MESH_MAX_AXES], step = 1;
		for (int a = 0; a < ndim; a++)
			dims[a] = splitmix64_range(&seed, 1, 4);
		assert_int_equal(flow_mesh_init(&m, ndim, dims,
						splitmix64_range(&seed, 0, 9), NULL),
				 FLOW_OK);
		/* Strides in a random axis order, each past the last axis'
		 * span plus a gap, so no rank repeats. */
		int order[FLOW_MESH_MAX_AXES];
		for (int a = 0; a < ndim; a++)
			order[a] = a;
		for (int a = ndim - 1; a > 0; a--) {
			int b = (int)splitmix64_range(&seed, 0, a), t = order[a];
			order[a] = order[b];
			order[b] = t;
		}
		for (int a = 0; a < ndim; a++) {
			m.stride[order[a]] = step;
			step *= dims[order[a]] + splitmix64_range(&seed, 0, 2);
		}
		assert_int_equal(flow_mesh_check(&m, NULL), FLOW_OK);
		int64_t top = -1;
		for (int64_t i = 0; i < flow_mesh_size(&m); i++)
			if (flow_mesh_rank(&m, i) > top)
				top = flow_mesh_rank(&m, i);
		assert_int_equal(flow_mesh_top_rank(&m), top);
	}
}

/* ---- SBP text -------------------------------------------------------------------- */

static void test_sbp_nd_sbp_text_round_trips(void **state)
{
	(void)state;
	static const struct {
		const char *in, *out;
	} cases[] = {
		{ "S(0)", "(S(0))" },         { "B", "(B)" },
		{ "P", "(P)" },               { "(S(0),B)", "(S(0),B)" },
		{ "(S(1), B,  P)", "(S(1),B,P)" }, { "(S(7),S(7),S(7),S(7))", "(S(7),S(7),S(7),S(7))" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		flow_nd_sbp_t s = sbp_of(cases[i].in), back;
		char buf[FLOW_SBP_TEXT_MAX];
		assert_int_equal(flow_nd_sbp_format(&s, buf, sizeof(buf)), strlen(cases[i].out));
		assert_string_equal(buf, cases[i].out);
		back = sbp_of(buf);
		assert_true(flow_nd_sbp_equal(&s, &back));
	}
	flow_nd_sbp_t a = sbp_of("(S(0),B)"), b = sbp_of("(S(1),B)"), c = sbp_of("S(0)");
	assert_false(flow_nd_sbp_equal(&a, &b));
	assert_false(flow_nd_sbp_equal(&a, &c));
	/* B and P compare by kind alone. */
	flow_sbp_t b0 = { FLOW_SBP_BROADCAST, 0 }, b3 = { FLOW_SBP_BROADCAST, 3 };
	assert_true(flow_sbp_equal(b0, b3));
	flow_nd_sbp_fill(&a, 3, b0);
	b = sbp_of("(B,B,B)");
	assert_true(flow_nd_sbp_equal(&a, &b));
}

static void test_sbp_nd_sbp_parse_errors_point_at_the_problem(void **state)
{
	(void)state;
	static const struct {
		const char *text, *msg;
	} cases[] = {
		{ "", "nd-SBP '': expected S(k), B or P at end" },
		{ "Q", "nd-SBP 'Q': expected S(k), B or P at 'Q'" },
		{ "(S(0),Q)", "nd-SBP '(S(0),Q)': expected S(k), B or P at 'Q'" },
		{ "( S(0))", "nd-SBP '( S(0))': expected S(k), B or P at ' S'" },
		{ "()", "nd-SBP '()': expected S(k), B or P at ')'" },
		{ "(S(0),", "nd-SBP '(S(0),': expected S(k), B or P at end" },
		{ "S(", "nd-SBP 'S(': expected a dimension at end" },
		{ "S()", "nd-SBP 'S()': expected a dimension at ')'" },
		{ "S(0", "nd-SBP 'S(0': expected ')' at end" },
		{ "S(8)", "nd-SBP 'S(8)': split dimension '8' is not below 8" },
		{ "S(99999999999999999999)", "nd-SBP 'S(99999999999999999999)': split dimension '99999999999999999999' is not below 8" },
		{ "(S(0)B)", "nd-SBP '(S(0)B)': expected ',' or ')' at 'B'" },
		{ "(B", "nd-SBP '(B': expected ',' or ')' at end" },
		{ "(B,B,B,B,B)", "nd-SBP '(B,B,B,B,B)': more than 4 axes" },
		{ "S(0))", "nd-SBP 'S(0))': unexpected text at ')'" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_nd_sbp_t s = { .ndim = 42 };
		assert_int_equal(flow_nd_sbp_parse(cases[i].text, &s, &diag), FLOW_ERR_USAGE);
		assert_string_equal(diag.msg, cases[i].msg);
		assert_int_equal(s.ndim, 42);
	}
}

/* ---- local shapes ------------------------------------------------------------ */

static void assert_parts(int64_t n, int64_t k, const int64_t *sizes)
{
	int64_t next = 0;
	for (int64_t i = 0; i < k; i++) {
		int64_t start, size;
		flow_split_part(n, k, i, &start, &size);
		assert_int_equal(start, next);
		assert_int_equal(size, sizes[i]);
		next += size;
	}
	assert_int_equal(next, n);
}

static void test_sbp_split_uneven_gives_first_ranks_extra(void **state)
{
	(void)state;
	assert_parts(10, 4, (const int64_t[]){ 3, 3, 2, 2 });
	assert_parts(5, 4, (const int64_t[]){ 2, 1, 1, 1 });
	assert_parts(13, 8, (const int64_t[]){ 2, 2, 2, 2, 2, 1, 1, 1 });
	assert_parts(8, 4, (const int64_t[]){ 2, 2, 2, 2 });
	assert_parts(3, 1, (const int64_t[]){ 3 });
}

/* Rows [start, start+extent) of dimension 0 at every position. */
static void assert_rows(const char *shape, const char *sbp, const char *mesh,
			const int64_t *starts, const int64_t *extents)
{
	flow_shape_t s = shape_of(shape);
	flow_nd_sbp_t x = sbp_of(sbp);
	flow_mesh_t m = mesh_of(mesh);
	assert_int_equal(flow_nd_sbp_check(&s, &x, &m, NULL), FLOW_OK);
	for (int64_t i = 0; i < flow_mesh_size(&m); i++) {
		flow_box_t box;
		flow_nd_sbp_local_box(&s, &x, &m, i, &box);
		assert_int_equal(box.ndim, s.ndim);
		assert_int_equal(box.start[0], starts[i]);
		assert_int_equal(box.extent[0], extents[i]);
	}
}

static void test_sbp_nested_split_applies_outer_axis_first(void **state)
{
	(void)state;
	/* OneFlow's examples: the same 6 rows split differently over 2x2
	 * and over 4. */
	assert_rows("6", "(S(0),S(0))", "2x2", (const int64_t[]){ 0, 2, 3, 5 },
		    (const int64_t[]){ 2, 1, 2, 1 });
	assert_rows("6", "S(0)", "4", (const int64_t[]){ 0, 2, 4, 5 },
		    (const int64_t[]){ 2, 2, 1, 1 });
	assert_rows("10,3", "S(0)", "4", (const int64_t[]){ 0, 3, 6, 8 },
		    (const int64_t[]){ 3, 3, 2, 2 });
	assert_rows("5", "S(0)", "4", (const int64_t[]){ 0, 2, 3, 4 },
		    (const int64_t[]){ 2, 1, 1, 1 });
	/* B and P keep the extent; the split axis is inner. */
	assert_rows("7,2", "(P,S(0))", "2x2", (const int64_t[]){ 0, 4, 0, 4 },
		    (const int64_t[]){ 4, 3, 4, 3 });

	/* Two dimensions split by two axes: each position a block. */
	flow_shape_t s = shape_of("5,3");
	flow_nd_sbp_t x = sbp_of("(S(1),S(0))");
	flow_mesh_t m = mesh_of("2x2");
	static const int64_t want[4][4] = {
		/* start0 extent0 start1 extent1 */
		{ 0, 3, 0, 2 }, { 3, 2, 0, 2 }, { 0, 3, 2, 1 }, { 3, 2, 2, 1 },
	};
	for (int64_t i = 0; i < 4; i++) {
		flow_box_t box;
		flow_nd_sbp_local_box(&s, &x, &m, i, &box);
		assert_int_equal(box.start[0], want[i][0]);
		assert_int_equal(box.extent[0], want[i][1]);
		assert_int_equal(box.start[1], want[i][2]);
		assert_int_equal(box.extent[1], want[i][3]);
	}
	assert_int_equal(flow_nd_sbp_max_local_numel(&s, &x, &m), 6);
	assert_int_equal(flow_nd_sbp_copies(&x, &m), 1);
	x = sbp_of("(P,B)");
	assert_int_equal(flow_nd_sbp_copies(&x, &m), 4);
	assert_int_equal(flow_nd_sbp_max_local_numel(&s, &x, &m), 15);
	/* A scalar. */
	s = shape_of("()");
	assert_int_equal(flow_nd_sbp_max_local_numel(&s, &x, &m), 1);
}

static void test_sbp_check_names_the_first_problem(void **state)
{
	(void)state;
	static const struct {
		const char *shape, *mesh, *sbp, *msg;
	} cases[] = {
		{ "6,8", "2x4", "(S(0),S(0))", "(S(0),S(0)) on 2x4: dimension 0 of (6,8) has 3 rows left for 4 ranks of axis 1" },
		{ "7,8", "2x4", "(S(0),S(0))", "(S(0),S(0)) on 2x4: dimension 0 of (7,8) has 3 rows left for 4 ranks of axis 1" },
		{ "6,3", "2x4:dp,tp", "(B,S(1))", "(B,S(1)) on 2x4:dp,tp: dimension 1 of (6,3) has 3 elements left for 4 ranks of axis 'tp'" },
		{ "6,1", "2x2", "(B,S(1))", "(B,S(1)) on 2x2: dimension 1 of (6,1) has 1 element left for 2 ranks of axis 1" },
		{ "0,3", "1", "S(0)", "(S(0)) on 1: dimension 0 of (0,3) has 0 rows left for 1 rank of axis 0" },
		{ "6,8", "2x4", "(S(0))", "(S(0)) on 2x4: 1 SBP for 2 mesh axes" },
		{ "6,8", "8", "(S(0),B)", "(S(0),B) on 8: 2 SBPs for 1 mesh axis" },
		{ "6,8", "2x4", "(S(2),B)", "(S(2),B) on 2x4: split dimension 2 but (6,8) has 2 dimensions" },
		{ "()", "2", "S(0)", "(S(0)) on 2: split dimension 0 but () has 0 dimensions" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		flow_shape_t s = shape_of(cases[i].shape);
		flow_mesh_t m = mesh_of(cases[i].mesh);
		flow_nd_sbp_t x = sbp_of(cases[i].sbp);
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(flow_nd_sbp_check(&s, &x, &m, &diag), FLOW_ERR_USAGE);
		assert_string_equal(diag.msg, cases[i].msg);
		assert_int_equal(flow_nd_sbp_check(&s, &x, &m, NULL), FLOW_ERR_USAGE);
	}
	/* Valid: exactly enough rows, splits that nest, B and P on empty
	 * dimensions, scalars. */
	static const struct {
		const char *shape, *mesh, *sbp;
	} good[] = {
		{ "8,8", "2x4", "(S(0),S(0))" }, { "4", "4", "S(0)" },
		{ "0,3", "2x2", "(P,S(1))" },      { "()", "2x2", "(B,P)" },
		{ "5", "2x2", "(S(0),S(0))" },
	};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		flow_shape_t s = shape_of(good[i].shape);
		flow_mesh_t m = mesh_of(good[i].mesh);
		flow_nd_sbp_t x = sbp_of(good[i].sbp);
		assert_int_equal(flow_nd_sbp_check(&s, &x, &m, NULL), FLOW_OK);
	}
	/* An SBP kind outside the enum. */
	flow_shape_t s = shape_of("4");
	flow_mesh_t m = mesh_of("2");
	flow_nd_sbp_t x = { 1, { { (flow_sbp_kind_t)7, 0 } } };
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_nd_sbp_check(&s, &x, &m, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "(?) on 2: invalid SBP for axis 0");
}

/* ---- property -------------------------------------------------------------------- */

/* For random shapes, meshes and nd-SBPs: a valid layout gives every
 * position a non-empty box, and the positions of each copy (the same
 * coordinates on the B and P axes) tile the tensor exactly once; an
 * invalid one with its dimensions in range leaves some position empty. */
static void test_sbp_property_split_boxes_tile_each_copy(void **state)
{
	(void)state;
	const uint64_t seed = 7;
	uint64_t s = seed;
	int valid = 0, invalid = 0;
	for (int c = 0; c < 3000; c++) {
		flow_shape_t shape = { .ndim = (int)splitmix64_range(&s, 1, 3) };
		for (int d = 0; d < shape.ndim; d++)
			shape.dims[d] = splitmix64_range(&s, 0, 12);
		int64_t dims[3];
		int ndim = (int)splitmix64_range(&s, 1, 3);
		for (int i = 0; i < ndim; i++)
			dims[i] = splitmix64_range(&s, 1, 4);
		flow_mesh_t m;
		assert_int_equal(flow_mesh_init(&m, ndim, dims, 0, NULL), FLOW_OK);
		flow_nd_sbp_t x = { .ndim = ndim };
		for (int i = 0; i < ndim; i++) {
			int64_t k = splitmix64_range(&s, -2, shape.ndim - 1);
			x.sbp[i] = k == -2 ? (flow_sbp_t){ FLOW_SBP_BROADCAST, 0 } :
				   k == -1 ? (flow_sbp_t){ FLOW_SBP_PARTIAL, 0 } :
					     (flow_sbp_t){ FLOW_SBP_SPLIT, (int)k };
		}
		bool ok = flow_nd_sbp_check(&shape, &x, &m, NULL) == FLOW_OK;
		int64_t numel = 1;
		for (int d = 0; d < shape.ndim; d++)
			numel *= shape.dims[d];
		int64_t copies = flow_nd_sbp_copies(&x, &m), n = flow_mesh_size(&m);
		static unsigned char hits[64][12 * 12 * 12];
		memset(hits, 0, sizeof(hits));
		bool empty = false;
		for (int64_t i = 0; i < n; i++) {
			flow_box_t b;
			flow_nd_sbp_local_box(&shape, &x, &m, i, &b);
			int64_t cc[FLOW_MESH_MAX_AXES], copy = 0, bn = 1;
			flow_mesh_coords(&m, i, cc);
			for (int a = 0; a < ndim; a++)
				if (x.sbp[a].kind != FLOW_SBP_SPLIT)
					copy = copy * m.dims[a] + cc[a];
			for (int d = 0; d < shape.ndim; d++)
				bn *= b.extent[d];
			empty = empty || bn == 0;
			for (int64_t e = 0; e < bn; e++) {
				int64_t idx = 0, rest = e;
				for (int d = shape.ndim - 1, inner = 1; d >= 0; d--) {
					idx += (b.start[d] + rest % b.extent[d]) * inner;
					rest /= b.extent[d];
					inner *= (int)shape.dims[d];
				}
				hits[copy][idx]++;
			}
		}
		char text[FLOW_SBP_TEXT_MAX];
		flow_nd_sbp_format(&x, text, sizeof(text));
		if (!ok) {
			invalid++;
			if (!empty && numel > 0)
				fail_msg("seed %llu case %d: invalid %s leaves no box empty",
					 (unsigned long long)seed, c, text);
			continue;
		}
		valid++;
		if (empty && numel > 0)
			fail_msg("seed %llu case %d: valid %s leaves a box empty",
				 (unsigned long long)seed, c, text);
		for (int64_t copy = 0; copy < copies; copy++)
			for (int64_t e = 0; e < numel; e++)
				if (hits[copy][e] != 1)
					fail_msg("seed %llu case %d: copy %lld of %s covers element %lld %d times",
						 (unsigned long long)seed, c, (long long)copy, text,
						 (long long)e, hits[copy][e]);
	}
	assert_true(valid > 500 && invalid > 500);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sbp_mesh_text_round_trips),
		cmocka_unit_test(test_sbp_mesh_parse_errors_quote_the_text),
		cmocka_unit_test(test_sbp_mesh_init_and_check),
		cmocka_unit_test(test_sbp_mesh_ranks_coords_and_inverse),
		cmocka_unit_test(test_sbp_mesh_axis_names),
		cmocka_unit_test(test_sbp_mesh_groups_are_affine_sub_meshes),
		cmocka_unit_test(test_sbp_mesh_top_rank_is_the_largest_rank),
		cmocka_unit_test(test_sbp_nd_sbp_text_round_trips),
		cmocka_unit_test(test_sbp_nd_sbp_parse_errors_point_at_the_problem),
		cmocka_unit_test(test_sbp_split_uneven_gives_first_ranks_extra),
		cmocka_unit_test(test_sbp_nested_split_applies_outer_axis_first),
		cmocka_unit_test(test_sbp_check_names_the_first_problem),
		cmocka_unit_test(test_sbp_property_split_boxes_tile_each_copy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
