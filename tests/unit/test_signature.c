/* Op SBP signatures: every op's exact 1-D list (order included), the
 * shape-dependent rules (reshape's groups, the flattened rows of layernorm
 * and cross-entropy), the backward lists derived by the adjoint, n-D
 * candidates on 2-D and 3-D meshes with their validity filter, the check
 * of one n-D signature and its messages, the queries of a GPT graph, and
 * a property test that proves the rules: for random shapes and every 1-D
 * signature, running the op on each simulated rank's local pieces and
 * combining the outputs by their SBP gives the logical result. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/graph.h>
#include <flow/model.h>
#include <flow/ops.h>
#include <flow/sbp.h>
#include <flow/signature.h>

#include "sbputil.h"

#define DIMS(...) ((const int64_t[]){ __VA_ARGS__ })
#define NDIM(...) ((int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)))
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- building queries ----------------------------------------------------- */

static flow_sig_query_t query(const char *op)
{
	flow_sig_query_t q;

	memset(&q, 0, sizeof(q));
	q.op = op;
	return q;
}

static flow_shape_t shape_of(int ndim, const int64_t *dims)
{
	flow_shape_t s = { .ndim = ndim };

	for (int i = 0; i < ndim; i++)
		s.dims[i] = dims[i];
	return s;
}

static void add_in_dims(flow_sig_query_t *q, int ndim, const int64_t *dims)
{
	q->in[q->nin] = shape_of(ndim, dims);
	q->in_present[q->nin++] = true;
}

static void add_out_dims(flow_sig_query_t *q, int ndim, const int64_t *dims)
{
	q->out[q->nout++] = shape_of(ndim, dims);
}

/* IN(&q, 4, 6) adds an input of shape (4,6); SCALAR_IN(&q) a 0-d one. */
#define IN(q, ...) add_in_dims(q, NDIM(__VA_ARGS__), DIMS(__VA_ARGS__))
#define OUT(q, ...) add_out_dims(q, NDIM(__VA_ARGS__), DIMS(__VA_ARGS__))
#define SCALAR_OUT(q) add_out_dims(q, 0, NULL)

static void absent_in(flow_sig_query_t *q)
{
	q->in_present[q->nin++] = false;
}

/* ---- printing signatures ----------------------------------------------------- */

static void sbp_text(flow_sbp_t s, char *buf, size_t cap)
{
	if (s.kind == FLOW_SBP_SPLIT)
		snprintf(buf, cap, "S(%d)", s.axis);
	else
		snprintf(buf, cap, "%s", s.kind == FLOW_SBP_PARTIAL ? "P" : "B");
}

/* "data: S(0),B,- -> S(0)" ('-' an absent input), with " gather=N" when
 * the op moves bytes itself. */
static void sig_text(const flow_sig_query_t *q, const flow_sig_t *s,
		     char *buf, size_t cap)
{
	size_t len = (size_t)snprintf(buf, cap, "%s: ", s->name);
	char t[24];

	for (int i = 0; i < q->nin; i++) {
		if (q->in_present[i])
			sbp_text(s->in[i], t, sizeof(t));
		else
			snprintf(t, sizeof(t), "-");
		len += (size_t)snprintf(buf + len, cap - len, "%s%s",
					i ? "," : "", t);
	}
	len += (size_t)snprintf(buf + len, cap - len, " ->");
	for (int i = 0; i < q->nout; i++) {
		sbp_text(s->out[i], t, sizeof(t));
		len += (size_t)snprintf(buf + len, cap - len, "%s%s",
					i ? "," : " ", t);
	}
	if (s->gather_bytes)
		snprintf(buf + len, cap - len, " gather=%llu",
			 (unsigned long long)s->gather_bytes);
}

static int list_or_fail(const flow_sig_query_t *q, flow_sig_t *sigs)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	int n = flow_sig_list(q, sigs, &diag);

	if (n < 0)
		fail_msg("%s: %s", q->op, flow_diag_message(&diag));
	return n;
}

/* The list of q must be exactly want[0..nwant), in order. */
static void list_is(const flow_sig_query_t *q, const char *const *want,
		    int nwant)
{
	flow_sig_t sigs[FLOW_SIG_MAX];
	int n = list_or_fail(q, sigs);
	bool same = n == nwant;
	char got[FLOW_SIG_MAX][160];

	for (int i = 0; i < n; i++) {
		sig_text(q, &sigs[i], got[i], sizeof(got[i]));
		if (same && strcmp(got[i], want[i]) != 0)
			same = false;
	}
	if (!same) {
		for (int i = 0; i < n; i++)
			print_error("  got  %d: %s\n", i, got[i]);
		for (int i = 0; i < nwant; i++)
			print_error("  want %d: %s\n", i, want[i]);
		fail_msg("%s: list differs", q->op);
	}
}

#define LIST_IS(q, ...)                                                      \
	do {                                                                 \
		static const char *const want_[] = { __VA_ARGS__ };          \
		list_is(q, want_, COUNT(want_));                             \
	} while (0)

static void list_fails(const flow_sig_query_t *q, const char *want)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_sig_t sigs[FLOW_SIG_MAX];
	int n = flow_sig_list(q, sigs, &diag);

	assert_int_equal(n, FLOW_ERR_USAGE);
	assert_string_equal(flow_diag_message(&diag), want);
}

/* ---- 1-D lists, one op at a time ------------------------------------------------ */

static flow_sig_query_t matmul_query(bool bias)
{
	flow_sig_query_t q = query("matmul");

	IN(&q, 4, 6, 8);
	IN(&q, 10, 8);
	if (bias)
		IN(&q, 10);
	else
		absent_in(&q);
	OUT(&q, 4, 6, 10);
	return q;
}

static void test_signature_matmul_list(void **state)
{
	(void)state;
	flow_sig_query_t q = matmul_query(true);

	LIST_IS(&q,
		"data: S(0),B,B -> S(0)",
		"data: S(1),B,B -> S(1)",
		"column: B,S(0),S(0) -> S(2)",
		"row: S(2),S(1),P -> P",
		"partial: P,B,P -> P",
		"partial: B,P,P -> P",
		"broadcast: B,B,B -> B");
	q = matmul_query(false);
	LIST_IS(&q,
		"data: S(0),B,- -> S(0)",
		"data: S(1),B,- -> S(1)",
		"column: B,S(0),- -> S(2)",
		"row: S(2),S(1),- -> P",
		"partial: P,B,- -> P",
		"partial: B,P,- -> P",
		"broadcast: B,B,- -> B");
	/* The bias left out by count is the same as absent. */
	q.nin = 2;
	LIST_IS(&q,
		"data: S(0),B -> S(0)",
		"data: S(1),B -> S(1)",
		"column: B,S(0) -> S(2)",
		"row: S(2),S(1) -> P",
		"partial: P,B -> P",
		"partial: B,P -> P",
		"broadcast: B,B -> B");
}

static void test_signature_matmul_rejects_shapes(void **state)
{
	(void)state;
	flow_sig_query_t q = query("matmul");

	IN(&q, 4, 8);
	IN(&q, 10, 7);
	OUT(&q, 4, 10);
	list_fails(&q, "matmul: weight (10,7) does not match x (4,8): "
		       "expected (O,8)");
	q = query("matmul");
	IN(&q, 4, 8);
	IN(&q, 10, 8);
	IN(&q, 9);
	OUT(&q, 4, 10);
	list_fails(&q, "matmul: bias (9) does not match weight (10,8): "
		       "expected (10)");
	q = query("matmul");
	IN(&q, 4, 8);
	IN(&q, 10, 8);
	OUT(&q, 4, 11);
	list_fails(&q, "matmul: out (4,11) does not match x (4,8): "
		       "expected (4,10)");
	q = query("matmul");
	absent_in(&q);
	IN(&q, 10, 8);
	OUT(&q, 4, 10);
	list_fails(&q, "matmul: input x is required");
	q = query("matmul");
	IN(&q, 4, 8);
	OUT(&q, 4, 10);
	list_fails(&q, "matmul: takes 2 to 3 inputs, not 1");
}

static void test_signature_unknown_op(void **state)
{
	(void)state;
	flow_sig_query_t q = query("matmull");

	IN(&q, 4);
	OUT(&q, 4);
	list_fails(&q, "no signatures for unknown op 'matmull'");
}

/* Every op with signatures, graph op or signature-only, is found by its
 * name in the op registry: an empty query fails the counts check of the
 * definition that answered, which names the op and its input counts.
 * Boxing, whose layouts the localizer chooses, has none. */
static void test_signature_every_op_resolves_through_the_registry(void **state)
{
	static const struct {
		const char *op, *msg;
	} want[] = {
		{ "embedding", "embedding: takes 3 inputs, not 0" },
		{ "layernorm", "layernorm: takes 3 inputs, not 0" },
		{ "matmul", "matmul: takes 2 to 3 inputs, not 0" },
		{ "attention", "attention: takes 1 inputs, not 0" },
		{ "gelu", "gelu: takes 1 inputs, not 0" },
		{ "add", "add: takes 2 inputs, not 0" },
		{ "cross_entropy", "cross_entropy: takes 2 inputs, not 0" },
		{ "embedding_backward",
		  "embedding_backward: takes 2 inputs, not 0" },
		{ "layernorm_backward",
		  "layernorm_backward: takes 5 inputs, not 0" },
		{ "matmul_backward", "matmul_backward: takes 3 inputs, not 0" },
		{ "attention_backward",
		  "attention_backward: takes 4 inputs, not 0" },
		{ "gelu_backward", "gelu_backward: takes 2 inputs, not 0" },
		{ "add_backward", "add_backward: takes 1 inputs, not 0" },
		{ "boxing", "no signatures for unknown op 'boxing'" },
		/* The signature-only ops. */
		{ "layernorm_param_grad",
		  "layernorm_param_grad: takes 4 inputs, not 0" },
		{ "reshape", "reshape: takes 1 inputs, not 0" },
		{ "transpose", "transpose: takes 1 inputs, not 0" },
		{ "reduce_sum", "reduce_sum: takes 1 inputs, not 0" },
		{ "reduce_mean", "reduce_mean: takes 1 inputs, not 0" },
		{ "bias_add", "bias_add: takes 2 inputs, not 0" },
		{ "broadcast_add", "broadcast_add: takes 2 inputs, not 0" },
	};
	flow_sig_query_t q;

	(void)state;
	assert_int_equal(COUNT(want), FLOW_OP_ALL_KIND_COUNT);
	for (int i = 0; i < COUNT(want); i++) {
		q = query(want[i].op);
		list_fails(&q, want[i].msg);
	}
	/* In kind order: the graph kinds first, under their definitions'
	 * names. */
	for (int k = 0; k < FLOW_OP_KIND_COUNT; k++)
		assert_string_equal(flow_op_def((flow_op_kind_t)k)->name,
				    want[k].op);
	q = query(NULL);
	list_fails(&q, "no signatures for unknown op ''");
}

static flow_sig_query_t embedding_query(void)
{
	flow_sig_query_t q = query("embedding");

	IN(&q, 4, 6);
	IN(&q, 16, 8);
	IN(&q, 10, 8);
	OUT(&q, 4, 6, 8);
	return q;
}

static void test_signature_embedding_list(void **state)
{
	(void)state;
	flow_sig_query_t q = embedding_query();

	LIST_IS(&q,
		"data: S(0),B,B -> S(0)",
		"seq: S(1),B,B -> S(1)",
		"hidden: B,S(1),S(1) -> S(2)",
		"vocab: B,S(0),P -> P",
		"broadcast: B,B,B -> B");
	q.in[0].dims[1] = 11;
	q.out[0].dims[1] = 11;
	list_fails(&q, "embedding: tokens (4,11) does not match wpe (10,8): "
		       "expected T <= Tmax 10");
}

/* layernorm as the graph has it: statistics flattened to [N]. */
static flow_sig_query_t layernorm_query(int64_t B, int64_t T, int nout)
{
	flow_sig_query_t q = query("layernorm");

	IN(&q, B, T, 8);
	IN(&q, 8);
	IN(&q, 8);
	OUT(&q, B, T, 8);
	for (int i = 1; i < nout; i++)
		OUT(&q, B * T);
	return q;
}

static void test_signature_layernorm_rows_follow_the_statistics(void **state)
{
	(void)state;
	flow_sig_query_t q = layernorm_query(4, 6, 3);

	/* Rows [4,6] flattened to [24]: only the batch axis splits both
	 * alike, and only when the mesh axis divides 4 and 24. */
	q.axis_size = 2;
	LIST_IS(&q,
		"rows: S(0),B,B -> S(0),S(0),S(0)",
		"broadcast: B,B,B -> B,B,B");
	q.axis_size = 3;
	LIST_IS(&q, "broadcast: B,B,B -> B,B,B");
	q.axis_size = 0; /* unknown: equal extents only */
	LIST_IS(&q, "broadcast: B,B,B -> B,B,B");
	/* 2 x 3 rows: 2 and 6 divide by 2 but not by 3. */
	q = layernorm_query(2, 3, 3);
	q.axis_size = 2;
	LIST_IS(&q,
		"rows: S(0),B,B -> S(0),S(0),S(0)",
		"broadcast: B,B,B -> B,B,B");
	q.axis_size = 3;
	LIST_IS(&q, "broadcast: B,B,B -> B,B,B");
}

static void test_signature_layernorm_list(void **state)
{
	(void)state;
	flow_sig_query_t q = layernorm_query(1, 6, 3);

	LIST_IS(&q,
		"rows: S(1),B,B -> S(1),S(0),S(0)",
		"broadcast: B,B,B -> B,B,B");
	/* Without the statistics every row axis splits. */
	q = layernorm_query(4, 6, 1);
	LIST_IS(&q,
		"rows: S(0),B,B -> S(0)",
		"rows: S(1),B,B -> S(1)",
		"broadcast: B,B,B -> B");
	/* 2-D rows need no divisibility. */
	q = query("layernorm");
	IN(&q, 5, 8);
	IN(&q, 8);
	IN(&q, 8);
	OUT(&q, 5, 8);
	OUT(&q, 5);
	OUT(&q, 5);
	LIST_IS(&q,
		"rows: S(0),B,B -> S(0),S(0),S(0)",
		"broadcast: B,B,B -> B,B,B");
	q.out[1].dims[0] = 6;
	list_fails(&q, "layernorm: mean (6) does not match x (5,8): expected "
		       "one value per row, 5");
}

static void test_signature_layernorm_param_grad_list(void **state)
{
	(void)state;
	flow_sig_query_t q = query("layernorm_param_grad");

	IN(&q, 4, 6, 8);
	IN(&q, 4, 6, 8);
	IN(&q, 24);
	IN(&q, 24);
	OUT(&q, 8);
	OUT(&q, 8);
	q.axis_size = 2;
	LIST_IS(&q,
		"rows: S(0),S(0),S(0),S(0) -> P,P",
		"broadcast: B,B,B,B -> B,B");
}

static void test_signature_attention_list(void **state)
{
	(void)state;
	flow_sig_query_t q = query("attention");

	/* The graph's fused qkv: batch only. */
	IN(&q, 4, 6, 24);
	OUT(&q, 4, 6, 8);
	OUT(&q, 4, 2, 6);
	q.attrs.heads = 2;
	LIST_IS(&q,
		"batch: S(0) -> S(0),S(0)",
		"broadcast: B -> B,B");
	/* The 5-D view splits heads. */
	q = query("attention");
	IN(&q, 4, 6, 3, 2, 4);
	OUT(&q, 4, 6, 2, 4);
	OUT(&q, 4, 2, 6);
	q.attrs.heads = 2;
	LIST_IS(&q,
		"batch: S(0) -> S(0),S(0)",
		"heads: S(3) -> S(2),S(1)",
		"broadcast: B -> B,B");
	q.attrs.heads = 3;
	list_fails(&q, "attention: qkv (4,6,3,2,4) has 2 heads, not 3");
}

static void test_signature_elementwise_lists(void **state)
{
	(void)state;
	flow_sig_query_t q = query("gelu");

	IN(&q, 4, 6);
	OUT(&q, 4, 6);
	LIST_IS(&q, "split: S(0) -> S(0)", "split: S(1) -> S(1)",
		"broadcast: B -> B");
	q = query("add");
	IN(&q, 4, 6);
	IN(&q, 4, 6);
	OUT(&q, 4, 6);
	LIST_IS(&q, "split: S(0),S(0) -> S(0)", "split: S(1),S(1) -> S(1)",
		"partial: P,P -> P", "broadcast: B,B -> B");
	q.in[1].dims[1] = 5;
	list_fails(&q, "add: b (4,5) does not match a (4,6): expected (4,6)");
	/* A scalar has nothing to split. */
	q = query("gelu");
	q.in_present[q.nin++] = true;
	SCALAR_OUT(&q);
	LIST_IS(&q, "broadcast: B -> B");
}

static void test_signature_broadcast_add_list(void **state)
{
	(void)state;
	flow_sig_query_t q = query("broadcast_add");

	IN(&q, 4, 1, 6);
	IN(&q, 5, 1);
	OUT(&q, 4, 5, 6);
	LIST_IS(&q,
		"split: S(0),B -> S(0)",
		"split: B,S(0) -> S(1)",
		"split: S(2),B -> S(2)",
		"partial: P,P -> P",
		"broadcast: B,B -> B");
	/* Equal shapes: both split; an axis of 1 on both: none. */
	q = query("broadcast_add");
	IN(&q, 3, 1);
	IN(&q, 3, 1);
	OUT(&q, 3, 1);
	LIST_IS(&q, "split: S(0),S(0) -> S(0)", "partial: P,P -> P",
		"broadcast: B,B -> B");
	q = query("broadcast_add");
	IN(&q, 4, 3);
	IN(&q, 2);
	OUT(&q, 4, 3);
	list_fails(&q, "broadcast_add: a (4,3) and b (2) do not broadcast: "
		       "3 against 2");
}

static void test_signature_bias_add_list(void **state)
{
	(void)state;
	flow_sig_query_t q = query("bias_add");

	IN(&q, 4, 6, 8);
	IN(&q, 6);
	OUT(&q, 4, 6, 8);
	q.attrs.axis = 1;
	LIST_IS(&q,
		"split: S(0),B -> S(0)",
		"axis: S(1),S(0) -> S(1)",
		"split: S(2),B -> S(2)",
		"partial: P,P -> P",
		"broadcast: B,B -> B");
	q.attrs.axis = -1;
	list_fails(&q, "bias_add: bias (6) does not match x (4,6,8): expected "
		       "(8), axis 2 of x");
}

static void test_signature_cross_entropy_list(void **state)
{
	(void)state;
	flow_sig_query_t q = query("cross_entropy");

	IN(&q, 4, 6, 16);
	IN(&q, 4, 6);
	OUT(&q, 24);
	q.attrs.vocab = 13;
	q.axis_size = 2;
	LIST_IS(&q,
		"rows: S(0),S(0) -> S(0)",
		"vocab: S(2),B -> P gather=192",
		"broadcast: B,B -> B");
	/* The graph's op also names the in-place logits gradient. */
	OUT(&q, 4, 6, 16);
	LIST_IS(&q,
		"rows: S(0),S(0) -> S(0),S(0)",
		"vocab: S(2),B -> P,S(2) gather=192",
		"broadcast: B,B -> B,B");
	q.attrs.vocab = 17;
	list_fails(&q, "cross_entropy: vocab 17 is more than Vp 16");
}

static void test_signature_reduce_lists(void **state)
{
	(void)state;
	flow_sig_query_t q = query("reduce_sum");

	IN(&q, 4, 6, 8);
	OUT(&q, 4, 8);
	q.attrs.axes_mask = 1u << 1;
	LIST_IS(&q,
		"split: S(0) -> S(0)",
		"reduce: S(1) -> P",
		"split: S(2) -> S(1)",
		"partial: P -> P",
		"broadcast: B -> B");
	q.op = "reduce_mean";
	q.attrs.keepdims = true;
	q.out[0] = shape_of(3, DIMS(4, 1, 8));
	LIST_IS(&q,
		"split: S(0) -> S(0)",
		"reduce: S(1) -> P",
		"split: S(2) -> S(2)",
		"partial: P -> P",
		"broadcast: B -> B");
	/* To a scalar. */
	q = query("reduce_sum");
	IN(&q, 4, 6);
	SCALAR_OUT(&q);
	q.attrs.axes_mask = 3;
	LIST_IS(&q, "reduce: S(0) -> P", "reduce: S(1) -> P",
		"partial: P -> P", "broadcast: B -> B");
	q.attrs.axes_mask = 4;
	list_fails(&q, "reduce_sum: axes_mask 0x4 names axes beyond the 2 of "
		       "x (4,6)");
}

static void test_signature_transpose_list(void **state)
{
	(void)state;
	flow_sig_query_t q = query("transpose");

	IN(&q, 4, 6, 8);
	OUT(&q, 8, 4, 6);
	q.attrs.perm[0] = 2;
	q.attrs.perm[1] = 0;
	q.attrs.perm[2] = 1;
	LIST_IS(&q,
		"split: S(2) -> S(0)",
		"split: S(0) -> S(1)",
		"split: S(1) -> S(2)",
		"partial: P -> P",
		"broadcast: B -> B");
	q.attrs.perm[2] = 0;
	list_fails(&q, "transpose: perm is not a permutation of the 3 axes of "
		       "x (4,6,8): perm[2] = 0");
}

static flow_sig_query_t reshape_query(int nx, const int64_t *x, int ny,
				      const int64_t *y, int64_t axis_size)
{
	flow_sig_query_t q = query("reshape");

	add_in_dims(&q, nx, x);
	add_out_dims(&q, ny, y);
	q.axis_size = axis_size;
	return q;
}

#define RESHAPE(axis_size, x, y) \
	reshape_query(NDIM x, DIMS x, NDIM y, DIMS y, axis_size)

static void test_signature_reshape_groups(void **state)
{
	(void)state;
	/* OneFlow's documented reshape example, [B,S,H] -> [B,S,heads,hd]. */
	flow_sig_query_t q = RESHAPE(2, (4, 6, 8), (4, 6, 2, 4));

	LIST_IS(&q,
		"split: S(0) -> S(0)",
		"split: S(1) -> S(1)",
		"split: S(2) -> S(2)",
		"partial: P -> P",
		"broadcast: B -> B");
	/* H = 8 divides by 4 but heads = 2 does not: no S(2). */
	q = RESHAPE(4, (4, 6, 8), (4, 6, 2, 4));
	LIST_IS(&q, "split: S(0) -> S(0)", "split: S(1) -> S(1)",
		"partial: P -> P", "broadcast: B -> B");
	q = RESHAPE(3, (4, 6, 8), (4, 6, 2, 4));
	LIST_IS(&q, "split: S(0) -> S(0)", "split: S(1) -> S(1)",
		"partial: P -> P", "broadcast: B -> B");
	/* And back. */
	q = RESHAPE(2, (4, 6, 2, 4), (4, 6, 8));
	LIST_IS(&q, "split: S(0) -> S(0)", "split: S(1) -> S(1)",
		"split: S(2) -> S(2)", "partial: P -> P",
		"broadcast: B -> B");
	/* Flattening rows: the group's outer axes. */
	q = RESHAPE(2, (4, 6, 8), (24, 8));
	LIST_IS(&q, "split: S(0) -> S(0)", "split: S(2) -> S(1)",
		"partial: P -> P", "broadcast: B -> B");
	q = RESHAPE(0, (4, 6, 8), (24, 8));
	LIST_IS(&q, "split: S(2) -> S(1)", "partial: P -> P",
		"broadcast: B -> B");
	/* Size-1 axes are dropped and put back. */
	q = RESHAPE(0, (4, 1, 6), (4, 6, 1));
	LIST_IS(&q, "split: S(0) -> S(0)", "split: S(2) -> S(1)",
		"partial: P -> P", "broadcast: B -> B");
}

static void test_signature_reshape_without_groups(void **state)
{
	(void)state;
	/* [2,3] -> [3,2]: one group whose outer axes are 2 and 3. */
	flow_sig_query_t q = RESHAPE(2, (2, 3), (3, 2));

	LIST_IS(&q, "partial: P -> P", "broadcast: B -> B");
	/* [6,4] -> [4,6]: one group, outer axes 6 and 4, both even. */
	q = RESHAPE(2, (6, 4), (4, 6));
	LIST_IS(&q, "split: S(0) -> S(0)", "partial: P -> P",
		"broadcast: B -> B");
	q = RESHAPE(3, (6, 4), (4, 6));
	LIST_IS(&q, "partial: P -> P", "broadcast: B -> B");
	q = RESHAPE(2, (6, 4), (4, 5));
	list_fails(&q, "reshape: y (4,5) does not hold the elements of x (6,4)");
}

/* ---- backward lists -------------------------------------------------------------- */

static void test_signature_matmul_backward_list(void **state)
{
	(void)state;
	flow_sig_query_t q = query("matmul_backward");

	IN(&q, 4, 6, 10);
	IN(&q, 4, 6, 8);
	IN(&q, 10, 8);
	OUT(&q, 4, 6, 8);
	OUT(&q, 10, 8);
	OUT(&q, 10);
	LIST_IS(&q,
		"data: S(0),S(0),B -> S(0),P,P",
		"data: S(1),S(1),B -> S(1),P,P",
		"column: S(2),B,S(0) -> P,S(0),S(0)",
		"row: B,S(2),S(1) -> S(2),S(1),B",
		"partial: B,P,B -> B,P,B",
		"partial: B,B,P -> P,B,B",
		"broadcast: B,B,B -> B,B,B");
	q.nout = 2; /* no bias */
	LIST_IS(&q,
		"data: S(0),S(0),B -> S(0),P",
		"data: S(1),S(1),B -> S(1),P",
		"column: S(2),B,S(0) -> P,S(0)",
		"row: B,S(2),S(1) -> S(2),S(1)",
		"partial: B,P,B -> B,P",
		"partial: B,B,P -> P,B",
		"broadcast: B,B,B -> B,B");
}

static void test_signature_other_backward_lists(void **state)
{
	(void)state;
	flow_sig_query_t q = query("embedding_backward");

	IN(&q, 4, 6, 8);
	IN(&q, 4, 6);
	OUT(&q, 16, 8);
	OUT(&q, 10, 8);
	LIST_IS(&q,
		"data: S(0),S(0) -> P,P",
		"seq: S(1),S(1) -> P,P",
		"hidden: S(2),B -> S(1),S(1)",
		"vocab: B,B -> S(0),B",
		"broadcast: B,B -> B,B");

	q = query("layernorm_backward");
	IN(&q, 4, 6, 8);
	IN(&q, 4, 6, 8);
	IN(&q, 8);
	IN(&q, 24);
	IN(&q, 24);
	OUT(&q, 4, 6, 8);
	OUT(&q, 8);
	OUT(&q, 8);
	q.axis_size = 2;
	LIST_IS(&q,
		"rows: S(0),S(0),B,S(0),S(0) -> S(0),P,P",
		"broadcast: B,B,B,B,B -> B,B,B");

	q = query("attention_backward");
	IN(&q, 4, 6, 8);
	IN(&q, 4, 6, 24);
	IN(&q, 4, 2, 6);
	IN(&q, 4, 6, 8);
	OUT(&q, 4, 6, 24);
	q.attrs.heads = 2;
	LIST_IS(&q, "batch: S(0),S(0),S(0),S(0) -> S(0)",
		"broadcast: B,B,B,B -> B");

	q = query("gelu_backward");
	IN(&q, 4, 6);
	IN(&q, 4, 6);
	OUT(&q, 4, 6);
	LIST_IS(&q, "split: S(0),S(0) -> S(0)", "split: S(1),S(1) -> S(1)",
		"broadcast: B,B -> B");

	/* add's partial form reads dout B and gives da, db B: the same as
	 * all-broadcast, so it is dropped as a duplicate. */
	q = query("add_backward");
	IN(&q, 4, 6);
	OUT(&q, 4, 6);
	OUT(&q, 4, 6);
	LIST_IS(&q, "split: S(0) -> S(0),S(0)", "split: S(1) -> S(1),S(1)",
		"broadcast: B -> B,B");

	q = query("matmul_backward");
	IN(&q, 4, 10);
	IN(&q, 4, 8);
	IN(&q, 10, 7);
	OUT(&q, 4, 8);
	OUT(&q, 10, 7);
	list_fails(&q, "matmul_backward: weight (10,7) does not match x (4,8): "
		       "expected (O,8)");

	q = query("gelu_backward");
	IN(&q, 4, 6);
	IN(&q, 4, 6);
	OUT(&q, 4, 7);
	list_fails(&q, "gelu_backward: the gradient of x (4,6) must have its "
		       "shape, not (4,7)");
}

/* ---- n-D candidates ---------------------------------------------------------------- */

/* The candidates of q on mesh (at most cap written); *total_out all. */
static int candidates(const flow_sig_query_t *q, const flow_mesh_t *mesh,
		      flow_nd_sig_t *sigs, size_t cap, size_t *total_out)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	int n = flow_sig_candidates(q, mesh, sigs, cap, total_out, &diag);

	if (n < 0)
		fail_msg("%s: %s", q->op, flow_diag_message(&diag));
	return n;
}

/* Every candidate on 2x2 names, on each axis, a 1-D signature with its
 * SBPs there; an n-D signature no product gives names none. */
static void test_signature_axis_index_finds_each_axis_rule(void **state)
{
	(void)state;
	flow_sig_query_t q = matmul_query(true);
	flow_mesh_t m = mesh_of("2x2");
	flow_sig_t sigs[FLOW_SIG_MAX];
	flow_nd_sig_t nd[64];
	flow_diag_t diag = FLOW_DIAG_INIT;
	int nsigs = flow_sig_list(&q, sigs, &diag);
	int n = candidates(&q, &m, nd, 64, NULL);

	assert_true(nsigs > 1);
	assert_true(n > 1);
	for (int c = 0; c < n; c++)
		for (int a = 0; a < m.ndim; a++) {
			int i = flow_sig_axis_index(&q, sigs, nsigs, &nd[c], a);
			assert_true(i >= 0 && i < nsigs);
			for (int t = 0; t < q.nin; t++)
				assert_true(flow_sbp_equal(sigs[i].in[t],
							   nd[c].in[t].sbp[a]));
			assert_true(flow_sbp_equal(sigs[i].out[0],
						   nd[c].out[0].sbp[a]));
		}
	/* x and weight split on their contracted dimension, the output
	 * broadcast: no 1-D rule (row parallel gives P). */
	flow_nd_sig_t bad = nd[0];
	bad.in[0].sbp[1] = (flow_sbp_t){ .kind = FLOW_SBP_SPLIT, .axis = 2 };
	bad.in[1].sbp[1] = (flow_sbp_t){ .kind = FLOW_SBP_SPLIT, .axis = 1 };
	bad.in[2].sbp[1] = (flow_sbp_t){ .kind = FLOW_SBP_BROADCAST };
	bad.out[0].sbp[1] = (flow_sbp_t){ .kind = FLOW_SBP_BROADCAST };
	assert_int_equal(flow_sig_axis_index(&q, sigs, nsigs, &bad, 1), -1);
}

static size_t candidate_count(const flow_sig_query_t *q, const char *mesh)
{
	flow_mesh_t m = mesh_of(mesh);
	size_t total = 0;

	assert_int_equal(candidates(q, &m, NULL, 0, &total), 0);
	return total;
}

static void nd_text(const flow_nd_sbp_t *s, char *buf, size_t cap)
{
	flow_nd_sbp_format(s, buf, cap);
}

static bool nd_sig_equal(const flow_sig_query_t *q, const flow_nd_sig_t *a,
			 const flow_nd_sig_t *b)
{
	for (int i = 0; i < q->nin; i++)
		if (q->in_present[i] &&
		    !flow_nd_sbp_equal(&a->in[i], &b->in[i]))
			return false;
	for (int i = 0; i < q->nout; i++)
		if (!flow_nd_sbp_equal(&a->out[i], &b->out[i]))
			return false;
	return true;
}

static flow_sig_query_t gelu_query(int64_t r, int64_t c)
{
	flow_sig_query_t q = query("gelu");

	IN(&q, r, c);
	OUT(&q, r, c);
	return q;
}

static void test_signature_candidates_count_and_filter(void **state)
{
	(void)state;
	flow_sig_query_t q = gelu_query(4, 6);

	/* 3 x 3 products, all valid. */
	assert_int_equal(candidate_count(&q, "2x2"), 9);
	/* 2 rows cannot split twice: (S(0),S(0)) goes. */
	q = gelu_query(2, 6);
	assert_int_equal(candidate_count(&q, "2x2"), 8);
	/* 3-D: 27 products; 4 rows cannot split three times. */
	q = gelu_query(4, 8);
	assert_int_equal(candidate_count(&q, "2x2x2"), 26);
	/* 1 row and 1 column: only all-broadcast. */
	q = gelu_query(1, 1);
	assert_int_equal(candidate_count(&q, "2x2x2"), 1);

	/* matmul: 7 x 7 on 2x2, and small weights drop column twice. */
	q = matmul_query(true);
	assert_int_equal(candidate_count(&q, "2x2"), 49);
	/* 2x2x2: 343, less x's 4 rows or 6 positions split three times
	 * (4 -> 2 -> 1, 6 -> 3 -> 1, nothing left for the third axis). */
	assert_int_equal(candidate_count(&q, "2x2x2"), 341);
	q.in[1].dims[0] = 2;
	q.in[2].dims[0] = 2;
	q.out[0].dims[2] = 2;
	assert_int_equal(candidate_count(&q, "2x2"), 48);
	/* 3 ranks: column needs O >= 3. */
	assert_int_equal(candidate_count(&q, "3"), 6);
	/* 2x3: the size-dependent reshape lists differ per axis. */
	q = RESHAPE(0, (4, 6, 8), (4, 6, 2, 4));
	/* axis 0 (2): S0,S1,S2,P,B; axis 1 (3): S0,S1,P,B = 20, less
	 * (S(0),S(0)): 4 rows split by 2 then 3. */
	assert_int_equal(candidate_count(&q, "2x3"), 19);
}

static void test_signature_candidates_order_first_axis_slowest(void **state)
{
	(void)state;
	flow_sig_query_t q = gelu_query(4, 8);
	flow_mesh_t m = mesh_of("2x2x2");
	flow_nd_sig_t sigs[32];
	size_t total = 0;
	char buf[64];
	int n = candidates(&q, &m, sigs, 32, &total);
	static const char *const want_x[] = {
		/* (S(0),S(0),S(0)) is invalid */
		"(S(0),S(0),S(1))", "(S(0),S(0),B)", "(S(0),S(1),S(0))",
		"(S(0),S(1),S(1))", "(S(0),S(1),B)", "(S(0),B,S(0))",
	};

	assert_int_equal(n, 26);
	assert_int_equal(total, 26);
	for (int i = 0; i < COUNT(want_x); i++) {
		nd_text(&sigs[i].in[0], buf, sizeof(buf));
		assert_string_equal(buf, want_x[i]);
		assert_true(flow_nd_sbp_equal(&sigs[i].in[0],
					      &sigs[i].out[0]));
	}
	nd_text(&sigs[25].in[0], buf, sizeof(buf));
	assert_string_equal(buf, "(B,B,B)");
	/* No duplicates. */
	for (int i = 0; i < n; i++)
		for (int j = 0; j < i; j++)
			assert_false(nd_sig_equal(&q, &sigs[i], &sigs[j]));
	/* A short buffer gets the first ones and the total. */
	flow_nd_sig_t few[4];

	assert_int_equal(candidates(&q, &m, few, 4, &total), 4);
	assert_int_equal(total, 26);
	for (int i = 0; i < 4; i++)
		assert_true(nd_sig_equal(&q, &few[i], &sigs[i]));
}

static void test_signature_candidates_have_no_duplicates(void **state)
{
	(void)state;
	flow_sig_query_t q = matmul_query(false);
	flow_mesh_t m = mesh_of("2x2");
	flow_nd_sig_t sigs[64];
	size_t total = 0;
	int n = candidates(&q, &m, sigs, 64, &total);

	assert_int_equal(n, 49);
	for (int i = 0; i < n; i++) {
		/* the absent bias reads all-broadcast */
		assert_int_equal(sigs[i].in[2].ndim, 2);
		assert_int_equal(sigs[i].in[2].sbp[0].kind,
				 FLOW_SBP_BROADCAST);
		for (int j = 0; j < i; j++)
			assert_false(nd_sig_equal(&q, &sigs[i], &sigs[j]));
	}
	/* add_backward's list has its duplicate removed before the product:
	 * 3 x 3. */
	q = query("add_backward");
	IN(&q, 4, 6);
	OUT(&q, 4, 6);
	OUT(&q, 4, 6);
	assert_int_equal(candidate_count(&q, "2x2"), 9);
}

/* Splitting the same group on two mesh axes needs the product of their
 * sizes to divide it: [6,2] -> [12] splits on 2 ranks (6 and 12 even),
 * but on 2x2 the rows go 6 -> 3 -> 2,1 while the elements go 12 -> 6 ->
 * 3,3, and rank 0 would hold 4 elements of x for 3 of y. */
static void test_signature_candidates_joint_divisibility(void **state)
{
	(void)state;
	flow_sig_query_t q = RESHAPE(0, (6, 2), (12));

	assert_int_equal(candidate_count(&q, "2"), 3);
	assert_int_equal(candidate_count(&q, "2x2"), 8);
	/* [4,3] -> [12]: 4 and 12 divide by 4, so the pair stays. */
	q = RESHAPE(0, (4, 3), (12));
	assert_int_equal(candidate_count(&q, "2x2"), 9);
	/* layernorm on [6,2,8] with stats [12]: the same. */
	q = query("layernorm");
	IN(&q, 6, 2, 8);
	IN(&q, 8);
	IN(&q, 8);
	OUT(&q, 6, 2, 8);
	OUT(&q, 12);
	OUT(&q, 12);
	assert_int_equal(candidate_count(&q, "2x2"), 3);
}

/* ---- checking one n-D signature ---------------------------------------------------- */

static flow_nd_sbp_t nd(const char *text)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_nd_sbp_t s;

	if (flow_nd_sbp_parse(text, &s, &diag) != FLOW_OK)
		fail_msg("nd-SBP '%s': %s", text, flow_diag_message(&diag));
	return s;
}

static void check_fails(const flow_sig_query_t *q, const flow_mesh_t *m,
			const flow_nd_sig_t *s, const char *want)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	assert_int_equal(flow_sig_check(q, m, s, &diag), FLOW_ERR_USAGE);
	assert_string_equal(flow_diag_message(&diag), want);
}

static void test_signature_check_accepts_products(void **state)
{
	(void)state;
	flow_sig_query_t q = matmul_query(true);
	flow_mesh_t m = mesh_of("2x2:dp,tp");
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_nd_sig_t s;

	/* Data parallel on dp, column parallel on tp. */
	memset(&s, 0, sizeof(s));
	s.in[0] = nd("(S(0),B)");
	s.in[1] = nd("(B,S(0))");
	s.in[2] = nd("(B,S(0))");
	s.out[0] = nd("(S(0),S(2))");
	assert_int_equal(flow_sig_check(&q, &m, &s, &diag), FLOW_OK);
	/* Every candidate checks. */
	flow_nd_sig_t sigs[64];
	size_t total = 0;
	int n = candidates(&q, &m, sigs, 64, &total);

	for (int i = 0; i < n; i++)
		assert_int_equal(flow_sig_check(&q, &m, &sigs[i], &diag),
				 FLOW_OK);
}

static void test_signature_check_rejects_non_products(void **state)
{
	(void)state;
	flow_sig_query_t q = matmul_query(true);
	flow_mesh_t m = mesh_of("2x2:dp,tp");
	flow_nd_sig_t s;

	memset(&s, 0, sizeof(s));
	s.in[0] = nd("(S(0),S(1))");
	s.in[1] = nd("(B,S(0))");
	s.in[2] = nd("(B,S(0))");
	s.out[0] = nd("(S(0),S(2))");
	check_fails(&q, &m, &s,
		    "matmul: mesh axis 'tp': no signature has weight S(0) "
		    "with x S(1)");
	/* Row parallel with a whole bias: the bias must be P. */
	s.in[0] = nd("(S(0),S(2))");
	s.in[1] = nd("(B,S(1))");
	s.in[2] = nd("(B,B)");
	s.out[0] = nd("(S(0),P)");
	check_fails(&q, &m, &s,
		    "matmul: mesh axis 'tp': no signature has bias B with "
		    "x S(2), weight S(1)");
	s.in[2] = nd("(B,P)");
	flow_diag_t diag = FLOW_DIAG_INIT;

	assert_int_equal(flow_sig_check(&q, &m, &s, &diag), FLOW_OK);
	/* The output must follow. */
	s.out[0] = nd("(S(0),S(2))");
	check_fails(&q, &m, &s,
		    "matmul: mesh axis 'tp': no signature has out S(2) with "
		    "x S(2), weight S(1), bias P");
	/* An unsupported SBP of the first tensor alone. */
	q = gelu_query(4, 6);
	m = mesh_of("2x2");
	memset(&s, 0, sizeof(s));
	s.in[0] = nd("(S(0),P)");
	s.out[0] = nd("(S(0),P)");
	check_fails(&q, &m, &s, "gelu: mesh axis 1: no signature has x P");
	/* Too few SBPs. */
	s.in[0] = nd("(S(0))");
	check_fails(&q, &m, &s, "gelu: x has 1 SBPs for a mesh of 2 axes");
}

static void test_signature_check_rejects_invalid_layouts(void **state)
{
	(void)state;
	flow_sig_query_t q = gelu_query(2, 6);
	flow_mesh_t m = mesh_of("2x2");
	flow_nd_sig_t s;

	memset(&s, 0, sizeof(s));
	s.in[0] = nd("(S(0),S(0))");
	s.out[0] = nd("(S(0),S(0))");
	check_fails(&q, &m, &s,
		    "gelu: x: (S(0),S(0)) on 2x2: dimension 0 of (2,6) has 1 "
		    "row left for 2 ranks of axis 1");
	/* A product whose repeated split does not divide alike. */
	q = RESHAPE(0, (6, 2), (12));
	s.in[0] = nd("(S(0),S(0))");
	s.out[0] = nd("(S(0),S(0))");
	check_fails(&q, &m, &s,
		    "reshape: mesh axis 1: signature 'split' on 4 ranks of "
		    "the axes applying it splits the shapes into parts that "
		    "do not match");
}

/* ---- graph ops ----------------------------------------------------------------------- */

static void test_signature_query_of_gpt_ops(void **state)
{
	(void)state;
	flow_gpt_config_t cfg = { .layers = 2, .heads = 2, .dim = 16,
				  .vocab = 50, .pad = 16, .seq = 8 };
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_mesh_t m = mesh_of("2x2");
	flow_graph_t g;
	int kinds_seen[FLOW_OP_KIND_COUNT] = { 0 };

	flow_graph_init(&g);
	if (flow_gpt_build(&cfg, 4, 8, &g, &diag) != FLOW_OK ||
	    flow_graph_backward(&g, &diag) != FLOW_OK)
		fail_msg("gpt: %s", flow_diag_message(&diag));
	for (size_t i = 0; i < g.nops; i++) {
		flow_sig_query_t q;
		flow_sig_t sigs[FLOW_SIG_MAX];
		char text[160];
		size_t total = 0;
		int n;

		flow_sig_query_of_op(&g, (int)i, 2, &q);
		assert_string_equal(q.op, flow_op_def(g.ops[i].kind)->name);
		n = flow_sig_list(&q, sigs, &diag);
		if (n < 0)
			fail_msg("op %zu (%s %s): %s", i, q.op, g.ops[i].name,
				 flow_diag_message(&diag));
		assert_true(n >= 2); /* every op splits somehow */
		assert_string_equal(sigs[n - 1].name, "broadcast");
		sig_text(&q, &sigs[n - 1], text, sizeof(text));
		for (const char *p = strchr(text, ' '); *p; p++)
			assert_true(strchr(" B,->", *p) != NULL);
		assert_true(flow_sig_candidates(&q, &m, NULL, 0, &total,
						&diag) == 0);
		assert_true(total >= 4);
		kinds_seen[g.ops[i].kind]++;
	}
	for (int k = 0; k < FLOW_OP_KIND_COUNT; k++) /* boxing: localized */
		assert_true(kinds_seen[k] > 0 || k == FLOW_OP_BOXING);

	/* The first layer's attention projection: matmul with a bias. */
	int op = g.tensors[flow_graph_find(&g, "h.0.attn.c_attn.out")].producer;
	flow_sig_query_t q;
	flow_sig_t sigs[FLOW_SIG_MAX];

	flow_sig_query_of_op(&g, op, 2, &q);
	assert_int_equal(list_or_fail(&q, sigs), 7);
	assert_string_equal(sigs[0].name, "data");
	assert_string_equal(sigs[2].name, "column");
	/* ... and its backward op. */
	for (size_t i = 0; i < g.nops; i++)
		if (g.ops[i].forward == op)
			flow_sig_query_of_op(&g, (int)i, 2, &q);
	assert_string_equal(q.op, "matmul_backward");
	assert_int_equal(q.nout, 3);
	assert_int_equal(list_or_fail(&q, sigs), 7);
	/* The loss: rows [4,8] flattened to [32], and the vocabulary. */
	int ce = g.tensors[g.loss].producer;

	flow_sig_query_of_op(&g, ce, 2, &q);
	assert_int_equal(q.attrs.vocab, 50);
	LIST_IS(&q,
		"rows: S(0),S(0) -> S(0),S(0)",
		"vocab: S(2),B -> P,S(2) gather=256",
		"broadcast: B,B -> B,B");
	flow_graph_release(&g);
}

/* ---- the property test ------------------------------------------------------------------ */

/* Deterministic pseudo-random numbers (64-bit LCG, high bits). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)((rng_state >> 33) % n);
}

static float rnd_value(void)
{
	return (float)rnd(2001) / 1000.0f - 1.0f;
}

static size_t numel(const flow_shape_t *s)
{
	size_t n = 1;

	for (int i = 0; i < s->ndim; i++)
		n *= (size_t)s->dims[i];
	return n;
}

/* Row-major offset of coordinates c in shape s. */
static size_t offset_of(const flow_shape_t *s, const int64_t *c)
{
	size_t off = 0;

	for (int i = 0; i < s->ndim; i++)
		off = off * (size_t)s->dims[i] + (size_t)c[i];
	return off;
}

/* Copy the box `extent` from src at src_start to dst at dst_start. */
static void copy_box(const float *src, const flow_shape_t *src_shape,
		     const int64_t *src_start, float *dst,
		     const flow_shape_t *dst_shape, const int64_t *dst_start,
		     const flow_shape_t *extent)
{
	size_t n = numel(extent);
	int64_t c[FLOW_MAX_DIMS], a[FLOW_MAX_DIMS], b[FLOW_MAX_DIMS];

	for (size_t k = 0; k < n; k++) {
		size_t rest = k;

		for (int i = extent->ndim - 1; i >= 0; i--) {
			c[i] = (int64_t)(rest % (size_t)extent->dims[i]);
			rest /= (size_t)extent->dims[i];
		}
		for (int i = 0; i < extent->ndim; i++) {
			a[i] = src_start[i] + c[i];
			b[i] = dst_start[i] + c[i];
		}
		dst[offset_of(dst_shape, b)] = src[offset_of(src_shape, a)];
	}
}

/* What one rank runs: local shapes and data, where its inputs start in
 * the logical tensors, and the logical query (attributes, shapes). */
typedef struct kctx {
	const flow_sig_query_t *q;
	flow_shape_t in_shape[FLOW_SIG_MAX_IO], out_shape[FLOW_SIG_MAX_IO];
	int64_t in_start[FLOW_SIG_MAX_IO][FLOW_MAX_DIMS];
	int64_t out_start[FLOW_SIG_MAX_IO][FLOW_MAX_DIMS];
	const float *in[FLOW_SIG_MAX_IO];
	float *out[FLOW_SIG_MAX_IO]; /* zeroed */
} kctx_t;

typedef void (*kernel_t)(const kctx_t *k);

/* Rows of a [...,C] shape. */
static size_t rows_of(const flow_shape_t *s)
{
	size_t n = 1;

	for (int i = 0; i + 1 < s->ndim; i++)
		n *= (size_t)s->dims[i];
	return n;
}

static int64_t last_of(const flow_shape_t *s)
{
	return s->ndim ? s->dims[s->ndim - 1] : 1;
}

static void k_matmul(const kctx_t *k)
{
	size_t R = rows_of(&k->in_shape[0]);
	int64_t I = last_of(&k->in_shape[0]), O = k->in_shape[1].dims[0];
	bool bias = k->q->nin > 2 && k->q->in_present[2];

	for (size_t r = 0; r < R; r++)
		for (int64_t o = 0; o < O; o++) {
			double acc = bias ? k->in[2][o] : 0.0;

			for (int64_t i = 0; i < I; i++)
				acc += (double)k->in[0][r * I + i] *
				       k->in[1][o * I + i];
			k->out[0][r * O + o] = (float)acc;
		}
}

/* (dout, x, weight) -> (dx, dweight, dbias). */
static void k_matmul_backward(const kctx_t *k)
{
	size_t R = rows_of(&k->in_shape[1]);
	int64_t I = last_of(&k->in_shape[1]), O = k->in_shape[2].dims[0];
	const float *dout = k->in[0], *x = k->in[1], *w = k->in[2];

	for (size_t r = 0; r < R; r++)
		for (int64_t o = 0; o < O; o++) {
			float d = dout[r * O + o];

			for (int64_t i = 0; i < I; i++) {
				k->out[0][r * I + i] += d * w[o * I + i];
				k->out[1][o * I + i] += d * x[r * I + i];
			}
			if (k->q->nout > 2)
				k->out[2][o] += d;
		}
}

static void k_add(const kctx_t *k)
{
	for (size_t i = 0; i < numel(&k->out_shape[0]); i++)
		k->out[0][i] = k->in[0][i] + k->in[1][i];
}

static void k_gelu(const kctx_t *k)
{
	for (size_t i = 0; i < numel(&k->out_shape[0]); i++) {
		double x = k->in[0][i];

		k->out[0][i] = (float)(0.5 * x *
				       (1.0 + tanh(0.7978845608028654 *
						   (x + 0.044715 * x * x * x))));
	}
}

/* x, weight, bias -> out, mean, rstd (when asked). */
static void k_layernorm(const kctx_t *k)
{
	size_t R = rows_of(&k->in_shape[0]);
	int64_t C = last_of(&k->in_shape[0]);

	/* A rule that splits the statistics unlike the rows fails here,
	 * before writing out of bounds. */
	for (int o = 1; o < k->q->nout; o++)
		assert_int_equal(numel(&k->out_shape[o]), R);
	for (size_t r = 0; r < R; r++) {
		const float *x = k->in[0] + r * (size_t)C;
		double mean = 0.0, var = 0.0;

		for (int64_t c = 0; c < C; c++)
			mean += x[c];
		mean /= (double)C;
		for (int64_t c = 0; c < C; c++)
			var += (x[c] - mean) * (x[c] - mean);
		double rstd = 1.0 / sqrt(var / (double)C + 1e-5);

		for (int64_t c = 0; c < C; c++)
			k->out[0][r * (size_t)C + (size_t)c] =
				(float)((x[c] - mean) * rstd * k->in[1][c] +
					k->in[2][c]);
		if (k->q->nout > 1)
			k->out[1][r] = (float)mean;
		if (k->q->nout > 2)
			k->out[2][r] = (float)rstd;
	}
}

/* reduce_sum, and reduce_mean by the logical count of reduced elements. */
static void k_reduce(const kctx_t *k)
{
	const flow_shape_t *x = &k->in_shape[0];
	unsigned mask = k->q->attrs.axes_mask;
	double scale = 1.0;
	int64_t c[FLOW_MAX_DIMS], yc[FLOW_MAX_DIMS];

	if (strcmp(k->q->op, "reduce_mean") == 0)
		for (int i = 0; i < k->q->in[0].ndim; i++)
			if (mask & (1u << i))
				scale /= (double)k->q->in[0].dims[i];
	for (size_t e = 0; e < numel(x); e++) {
		size_t rest = e;
		int n = 0;

		for (int i = x->ndim - 1; i >= 0; i--) {
			c[i] = (int64_t)(rest % (size_t)x->dims[i]);
			rest /= (size_t)x->dims[i];
		}
		for (int i = 0; i < x->ndim; i++) {
			if (!(mask & (1u << i)))
				yc[n++] = c[i];
			else if (k->q->attrs.keepdims)
				yc[n++] = 0;
		}
		k->out[0][offset_of(&k->out_shape[0], yc)] +=
			(float)(k->in[0][e] * scale);
	}
}

static void k_transpose(const kctx_t *k)
{
	const flow_shape_t *y = &k->out_shape[0];
	int64_t c[FLOW_MAX_DIMS], xc[FLOW_MAX_DIMS];

	for (size_t e = 0; e < numel(y); e++) {
		size_t rest = e;

		for (int i = y->ndim - 1; i >= 0; i--) {
			c[i] = (int64_t)(rest % (size_t)y->dims[i]);
			rest /= (size_t)y->dims[i];
		}
		for (int i = 0; i < y->ndim; i++)
			xc[k->q->attrs.perm[i]] = c[i];
		k->out[0][e] = k->in[0][offset_of(&k->in_shape[0], xc)];
	}
}

/* The local piece keeps its order; only the shape changes. */
static void k_reshape(const kctx_t *k)
{
	assert_int_equal(numel(&k->in_shape[0]), numel(&k->out_shape[0]));
	memcpy(k->out[0], k->in[0], numel(&k->in_shape[0]) * sizeof(float));
}

/* tokens, wte, wpe -> out: tokens are global ids; a rank's wte rows start
 * at v0 (vocab-parallel lookups miss outside them and add 0), its
 * positions at t0, its wpe rows at p0. */
static void k_embedding(const kctx_t *k)
{
	const flow_shape_t *tok = &k->in_shape[0];
	int64_t V = k->in_shape[1].dims[0], C = k->in_shape[1].dims[1];
	int64_t v0 = k->in_start[1][0], t0 = k->in_start[0][1];
	int64_t p0 = k->in_start[2][0];

	for (int64_t b = 0; b < tok->dims[0]; b++)
		for (int64_t t = 0; t < tok->dims[1]; t++) {
			int64_t id = (int64_t)k->in[0][b * tok->dims[1] + t];
			float *o = k->out[0] + (b * tok->dims[1] + t) * C;

			for (int64_t c = 0; c < C; c++) {
				float e = 0.0f;

				if (id >= v0 && id < v0 + V)
					e = k->in[1][(id - v0) * C + c];
				o[c] = e + k->in[2][(t0 + t - p0) * C + c];
			}
		}
}

/* dout, tokens -> dwte, dwpe, by the same offsets. */
static void k_embedding_backward(const kctx_t *k)
{
	const flow_shape_t *tok = &k->in_shape[1];
	int64_t V = k->out_shape[0].dims[0], C = k->out_shape[0].dims[1];
	int64_t t0 = k->in_start[1][1];
	int64_t v0 = k->out_start[0][0], p0 = k->out_start[1][0];

	for (int64_t b = 0; b < tok->dims[0]; b++)
		for (int64_t t = 0; t < tok->dims[1]; t++) {
			int64_t id = (int64_t)k->in[1][b * tok->dims[1] + t];
			const float *d = k->in[0] + (b * tok->dims[1] + t) * C;

			for (int64_t c = 0; c < C; c++) {
				if (id >= v0 && id < v0 + V)
					k->out[0][(id - v0) * C + c] += d[c];
				k->out[1][(t0 + t - p0) * C + c] += d[c];
			}
		}
}

static void k_bias_add(const kctx_t *k)
{
	const flow_shape_t *x = &k->in_shape[0];
	int axis = k->q->attrs.axis < 0 ? k->q->attrs.axis + x->ndim :
					  k->q->attrs.axis;
	size_t inner = 1;

	for (int i = axis + 1; i < x->ndim; i++)
		inner *= (size_t)x->dims[i];
	for (size_t e = 0; e < numel(x); e++)
		k->out[0][e] = k->in[0][e] +
			       k->in[1][(e / inner) % (size_t)x->dims[axis]];
}

static void k_broadcast_add(const kctx_t *k)
{
	const flow_shape_t *y = &k->out_shape[0];
	int64_t c[FLOW_MAX_DIMS], ac[FLOW_MAX_DIMS], bc[FLOW_MAX_DIMS];

	for (size_t e = 0; e < numel(y); e++) {
		size_t rest = e;

		for (int i = y->ndim - 1; i >= 0; i--) {
			c[i] = (int64_t)(rest % (size_t)y->dims[i]);
			rest /= (size_t)y->dims[i];
		}
		for (int s = 0; s < 2; s++) {
			const flow_shape_t *in = &k->in_shape[s];
			int64_t *ic = s ? bc : ac;

			for (int i = 0; i < in->ndim; i++) {
				int yi = i + y->ndim - in->ndim;

				ic[i] = in->dims[i] == 1 ? 0 : c[yi];
			}
		}
		k->out[0][e] = k->in[0][offset_of(&k->in_shape[0], ac)] +
			       k->in[1][offset_of(&k->in_shape[1], bc)];
	}
}

/* logits, targets -> losses (and dlogits): over the first attrs.vocab
 * columns. */
static void k_cross_entropy(const kctx_t *k)
{
	size_t R = rows_of(&k->in_shape[0]);
	int64_t Vp = last_of(&k->in_shape[0]), V = k->q->attrs.vocab;

	assert_int_equal(numel(&k->out_shape[0]), R);
	for (size_t r = 0; r < R; r++) {
		const float *x = k->in[0] + r * (size_t)Vp;
		int64_t t = (int64_t)k->in[1][r];
		double mx = x[0], sum = 0.0;

		for (int64_t v = 1; v < V; v++)
			mx = x[v] > mx ? x[v] : mx;
		for (int64_t v = 0; v < V; v++)
			sum += exp(x[v] - mx);
		k->out[0][r] = (float)(log(sum) + mx - x[t]);
		if (k->q->nout > 1)
			for (int64_t v = 0; v < Vp; v++)
				k->out[1][r * (size_t)Vp + (size_t)v] =
					v < V ? (float)(exp(x[v] - mx) / sum -
							(v == t)) :
						0.0f;
	}
}

/* One op under test: the query (logical shapes), its kernel, and for
 * integer inputs (ids) the exclusive bound of their values (0: float). */
typedef struct prop_op {
	flow_sig_query_t q;
	kernel_t kernel;
	int64_t int_bound[FLOW_SIG_MAX_IO];
} prop_op_t;

typedef struct prop_stats {
	int checked;   /* (signature, ranks) pairs compared */
	int skipped;   /* invalid for the shapes on that many ranks */
	int gathering; /* left out: the op communicates (gather_bytes) */
	int split;     /* of the checked, those not all-broadcast */
} prop_stats_t;

/* The part of a logical tensor of shape s that rank r of p holds under
 * sbp: its start and extent. */
static void local_box(const flow_shape_t *s, flow_sbp_t sbp, int64_t p,
		      int64_t r, int64_t *start, flow_shape_t *extent)
{
	*extent = *s;
	for (int i = 0; i < s->ndim; i++)
		start[i] = 0;
	if (sbp.kind == FLOW_SBP_SPLIT)
		flow_split_part(s->dims[sbp.axis], p, r, &start[sbp.axis],
				&extent->dims[sbp.axis]);
}

static float *alloc_floats(size_t n)
{
	float *p = calloc(n ? n : 1, sizeof(float));

	assert_non_null(p);
	return p;
}

/* The addends of x over p ranks: random but the last, which makes the
 * sum come out (to float rounding). */
static float **partial_addends(const float *x, size_t n, int64_t p)
{
	float **parts = calloc((size_t)p, sizeof(float *));

	assert_non_null(parts);
	for (int64_t r = 0; r < p; r++)
		parts[r] = alloc_floats(n);
	for (size_t i = 0; i < n; i++) {
		double rest = x[i];

		for (int64_t r = 0; r + 1 < p; r++) {
			parts[r][i] = rnd_value();
			rest -= parts[r][i];
		}
		parts[p - 1][i] = (float)rest;
	}
	return parts;
}

static void free_parts(float **parts, int64_t p)
{
	if (!parts)
		return;
	for (int64_t r = 0; r < p; r++)
		free(parts[r]);
	free(parts);
}

static bool close_enough(float got, float want)
{
	return fabsf(got - want) <= 1e-4f * (1.0f + fabsf(want));
}

/* Run sig on p simulated ranks and compare the combined outputs with the
 * logical ones. */
static void prop_check_sig(const prop_op_t *op, const flow_sig_t *sig,
			   int64_t p, float *const *in, float *const *ref)
{
	const flow_sig_query_t *q = &op->q;
	float **parts[FLOW_SIG_MAX_IO] = { NULL };
	float *combined[FLOW_SIG_MAX_IO] = { NULL };
	char text[160];

	sig_text(q, sig, text, sizeof(text));
	for (int i = 0; i < q->nin; i++)
		if (q->in_present[i] && sig->in[i].kind == FLOW_SBP_PARTIAL) {
			assert_int_equal(op->int_bound[i], 0);
			parts[i] = partial_addends(in[i], numel(&q->in[i]), p);
		}
	for (int o = 0; o < q->nout; o++)
		combined[o] = alloc_floats(numel(&q->out[o]));

	for (int64_t r = 0; r < p; r++) {
		kctx_t k;
		float *local_in[FLOW_SIG_MAX_IO] = { NULL };
		int64_t zero[FLOW_MAX_DIMS] = { 0 };

		memset(&k, 0, sizeof(k));
		k.q = q;
		for (int i = 0; i < q->nin; i++) {
			if (!q->in_present[i])
				continue;
			local_box(&q->in[i], sig->in[i], p, r, k.in_start[i],
				  &k.in_shape[i]);
			local_in[i] = alloc_floats(numel(&k.in_shape[i]));
			copy_box(parts[i] ? parts[i][r] : in[i], &q->in[i],
				 k.in_start[i], local_in[i], &k.in_shape[i],
				 zero, &k.in_shape[i]);
			k.in[i] = local_in[i];
		}
		for (int o = 0; o < q->nout; o++) {
			local_box(&q->out[o], sig->out[o], p, r,
				  k.out_start[o], &k.out_shape[o]);
			k.out[o] = alloc_floats(numel(&k.out_shape[o]));
		}
		op->kernel(&k);
		for (int o = 0; o < q->nout; o++) {
			size_t n = numel(&q->out[o]);

			switch (sig->out[o].kind) {
			case FLOW_SBP_SPLIT:
				copy_box(k.out[o], &k.out_shape[o], zero,
					 combined[o], &q->out[o],
					 k.out_start[o], &k.out_shape[o]);
				break;
			case FLOW_SBP_PARTIAL:
				for (size_t e = 0; e < n; e++)
					combined[o][e] += k.out[o][e];
				break;
			case FLOW_SBP_BROADCAST:
				for (size_t e = 0; e < n; e++)
					if (!close_enough(k.out[o][e],
							  ref[o][e]))
						fail_msg("%s [%s] on %lld ranks: "
							 "rank %lld's copy of "
							 "output %d differs at "
							 "%zu: %g, not %g",
							 q->op, text,
							 (long long)p,
							 (long long)r, o, e,
							 (double)k.out[o][e],
							 (double)ref[o][e]);
				memcpy(combined[o], k.out[o], n * sizeof(float));
				break;
			}
			free(k.out[o]);
		}
		for (int i = 0; i < q->nin; i++)
			free(local_in[i]);
	}
	for (int o = 0; o < q->nout; o++) {
		for (size_t e = 0; e < numel(&q->out[o]); e++)
			if (!close_enough(combined[o][e], ref[o][e]))
				fail_msg("%s [%s] on %lld ranks: output %d "
					 "differs at %zu: %g, not %g",
					 q->op, text, (long long)p, o, e,
					 (double)combined[o][e],
					 (double)ref[o][e]);
		free(combined[o]);
	}
	for (int i = 0; i < q->nin; i++)
		free_parts(parts[i], p);
}

/* Every 1-D signature of op, on 2 and 3 ranks. */
static void prop_check(prop_op_t *op, prop_stats_t *st)
{

	flow_sig_query_t *q = &op->q;
	float *in[FLOW_SIG_MAX_IO] = { NULL }, *ref[FLOW_SIG_MAX_IO] = { NULL };
	kctx_t k;

	memset(&k, 0, sizeof(k));
	k.q = q;
	for (int i = 0; i < q->nin; i++) {
		if (!q->in_present[i])
			continue;
		in[i] = alloc_floats(numel(&q->in[i]));
		for (size_t e = 0; e < numel(&q->in[i]); e++)
			in[i][e] = op->int_bound[i] ?
				(float)rnd((uint32_t)op->int_bound[i]) :
				rnd_value();
		k.in[i] = in[i];
		k.in_shape[i] = q->in[i];
	}
	for (int o = 0; o < q->nout; o++) {
		ref[o] = alloc_floats(numel(&q->out[o]));
		k.out[o] = ref[o];
		k.out_shape[o] = q->out[o];
	}
	op->kernel(&k);

	for (int64_t p = 2; p <= 3; p++) {
		flow_sig_t sigs[FLOW_SIG_MAX];
		flow_mesh_t mesh;
		flow_diag_t diag = FLOW_DIAG_INIT;
		int n;

		q->axis_size = p;
		n = list_or_fail(q, sigs);
		if (flow_mesh_init(&mesh, 1, &p, 0, &diag) != FLOW_OK)
			fail_msg("mesh: %s", flow_diag_message(&diag));
		for (int s = 0; s < n; s++) {
			bool valid = true;

			for (int t = 0; t < q->nin + q->nout; t++) {
				flow_nd_sbp_t nd1 = { .ndim = 1 };
				bool is_in = t < q->nin;

				if (is_in && !q->in_present[t])
					continue;
				nd1.sbp[0] = is_in ? sigs[s].in[t] :
						     sigs[s].out[t - q->nin];
				if (flow_nd_sbp_check(is_in ? &q->in[t] :
							      &q->out[t - q->nin],
						      &nd1, &mesh, NULL))
					valid = false;
			}
			if (!valid) {
				st->skipped++;
				continue;
			}
			/* A form whose op gathers across ranks inside
			 * (cross-entropy's vocab) is no local computation. */
			if (sigs[s].gather_bytes) {
				st->gathering++;
				continue;
			}
			prop_check_sig(op, &sigs[s], p, in, ref);
			st->checked++;
			st->split += s + 1 < n;
		}
	}
	for (int i = 0; i < FLOW_SIG_MAX_IO; i++) {
		free(in[i]);
		free(ref[i]);
	}
}

/* A random extent in [lo, hi]. */
static int64_t rnd_extent(int64_t lo, int64_t hi)
{
	return lo + (int64_t)rnd((uint32_t)(hi - lo + 1));
}

static flow_shape_t rnd_shape(int ndim, int64_t lo, int64_t hi)
{
	flow_shape_t s = { .ndim = ndim };

	for (int i = 0; i < ndim; i++)
		s.dims[i] = rnd_extent(lo, hi);
	return s;
}

static void set_in(flow_sig_query_t *q, const flow_shape_t *s)
{
	q->in[q->nin] = *s;
	q->in_present[q->nin++] = true;
}

static void set_out(flow_sig_query_t *q, const flow_shape_t *s)
{
	q->out[q->nout++] = *s;
}

#define TRIALS 12

static void test_signature_property_matmul(void **state)
{
	(void)state;
	prop_stats_t st = { 0 };

	for (int trial = 0; trial < TRIALS; trial++) {
		prop_op_t op = { .q = query("matmul"), .kernel = k_matmul };
		flow_shape_t x = rnd_shape(1 + (int)rnd(3), 1, 5);
		int64_t O = rnd_extent(1, 5), I = x.dims[x.ndim - 1];
		flow_shape_t w = { .ndim = 2, .dims = { O, I } };
		flow_shape_t b = { .ndim = 1, .dims = { O } }, y = x;

		y.dims[y.ndim - 1] = O;
		set_in(&op.q, &x);
		set_in(&op.q, &w);
		if (trial % 3)
			set_in(&op.q, &b);
		else
			absent_in(&op.q);
		set_out(&op.q, &y);
		prop_check(&op, &st);
	}
	assert_true(st.checked >= 60);
	assert_true(st.split >= 45);
}

static void test_signature_property_matmul_backward(void **state)
{
	(void)state;
	prop_stats_t st = { 0 };

	for (int trial = 0; trial < TRIALS; trial++) {
		prop_op_t op = { .q = query("matmul_backward"),
				 .kernel = k_matmul_backward };
		flow_shape_t x = rnd_shape(1 + (int)rnd(3), 1, 5);
		int64_t O = rnd_extent(1, 5), I = x.dims[x.ndim - 1];
		flow_shape_t w = { .ndim = 2, .dims = { O, I } };
		flow_shape_t b = { .ndim = 1, .dims = { O } }, y = x;

		y.dims[y.ndim - 1] = O;
		set_in(&op.q, &y);
		set_in(&op.q, &x);
		set_in(&op.q, &w);
		set_out(&op.q, &x);
		set_out(&op.q, &w);
		if (trial % 3)
			set_out(&op.q, &b);
		prop_check(&op, &st);
	}
	assert_true(st.checked >= 60);
	assert_true(st.split >= 50);
}

static void test_signature_property_elementwise(void **state)
{
	(void)state;
	prop_stats_t st = { 0 };

	for (int trial = 0; trial < TRIALS; trial++) {
		flow_shape_t x = rnd_shape((int)rnd(4), 1, 5);
		prop_op_t add = { .q = query("add"), .kernel = k_add };
		prop_op_t gelu = { .q = query("gelu"), .kernel = k_gelu };

		set_in(&add.q, &x);
		set_in(&add.q, &x);
		set_out(&add.q, &x);
		prop_check(&add, &st);
		set_in(&gelu.q, &x);
		set_out(&gelu.q, &x);
		prop_check(&gelu, &st);
	}
	assert_true(st.checked >= 60);
	assert_true(st.split >= 24);
}

static void test_signature_property_layernorm(void **state)
{
	(void)state;
	prop_stats_t st = { 0 };

	static const int64_t extents[] = { 1, 2, 3, 4, 6 };

	for (int trial = 0; trial < 3 * TRIALS; trial++) {
		prop_op_t op = { .q = query("layernorm"),
				 .kernel = k_layernorm };
		flow_shape_t x = { .ndim = 1 + (int)rnd(3) };

		/* Extents that often divide, so the flattened statistics
		 * split too. */
		for (int i = 0; i < x.ndim; i++)
			x.dims[i] = extents[rnd(COUNT(extents))];
		flow_shape_t c = { .ndim = 1, .dims = { x.dims[x.ndim - 1] } };
		flow_shape_t stats = { .ndim = 1,
				       .dims = { (int64_t)rows_of(&x) } };

		set_in(&op.q, &x);
		set_in(&op.q, &c);
		set_in(&op.q, &c);
		set_out(&op.q, &x);
		if (trial % 4) {
			set_out(&op.q, &stats);
			set_out(&op.q, &stats);
		}
		prop_check(&op, &st);
	}
	assert_true(st.checked >= 24);
	assert_true(st.split >= 20);
}

static void test_signature_property_reduce(void **state)
{
	(void)state;
	prop_stats_t st = { 0 };

	for (int trial = 0; trial < 2 * TRIALS; trial++) {
		prop_op_t op = { .q = query(trial % 2 ? "reduce_mean" :
						       "reduce_sum"),
				 .kernel = k_reduce };
		flow_shape_t x = rnd_shape((int)rnd(4), 1, 5), y = { 0 };

		op.q.attrs.axes_mask = rnd(1u << x.ndim);
		op.q.attrs.keepdims = rnd(2);
		for (int i = 0; i < x.ndim; i++) {
			bool reduced = op.q.attrs.axes_mask & (1u << i);

			if (!reduced || op.q.attrs.keepdims)
				y.dims[y.ndim++] = reduced ? 1 : x.dims[i];
		}
		set_in(&op.q, &x);
		set_out(&op.q, &y);
		prop_check(&op, &st);
	}
	assert_true(st.checked >= 60);
	assert_true(st.split >= 45);
}

static void test_signature_property_transpose(void **state)
{
	(void)state;
	prop_stats_t st = { 0 };

	for (int trial = 0; trial < TRIALS; trial++) {
		prop_op_t op = { .q = query("transpose"),
				 .kernel = k_transpose };
		flow_shape_t x = rnd_shape(1 + (int)rnd(4), 1, 4), y = x;
		int *perm = op.q.attrs.perm;

		for (int i = 0; i < x.ndim; i++)
			perm[i] = i;
		for (int i = x.ndim - 1; i > 0; i--) {
			int j = (int)rnd((uint32_t)i + 1), t = perm[i];

			perm[i] = perm[j];
			perm[j] = t;
		}
		for (int i = 0; i < x.ndim; i++)
			y.dims[i] = x.dims[perm[i]];
		set_in(&op.q, &x);
		set_out(&op.q, &y);
		prop_check(&op, &st);
	}
	assert_true(st.checked >= 40);
	assert_true(st.split >= 25);
}

static void test_signature_property_reshape(void **state)
{
	(void)state;
	prop_stats_t st = { 0 };

	for (int trial = 0; trial < 3 * TRIALS; trial++) {
		prop_op_t op = { .q = query("reshape"), .kernel = k_reshape };
		int64_t f[6];
		int nf = 2 + (int)rnd(4);
		flow_shape_t x = { 0 }, y = { 0 };

		/* Factors grouped two ways, with stray size-1 axes. */
		for (int i = 0; i < nf; i++)
			f[i] = rnd_extent(1, 4);
		for (int side = 0; side < 2; side++) {
			flow_shape_t *s = side ? &y : &x;

			for (int i = 0; i < nf; i++) {
				if (s->ndim == 0 || rnd(2))
					s->dims[s->ndim++] = f[i];
				else
					s->dims[s->ndim - 1] *= f[i];
				if (s->ndim < FLOW_MAX_DIMS - 1 && rnd(6) == 0)
					s->dims[s->ndim++] = 1;
			}
		}
		set_in(&op.q, &x);
		set_out(&op.q, &y);
		prop_check(&op, &st);
	}
	assert_true(st.checked >= 100);
	assert_true(st.split >= 80);
}

static void test_signature_property_embedding(void **state)
{
	(void)state;
	prop_stats_t st = { 0 };

	for (int trial = 0; trial < TRIALS; trial++) {
		int64_t B = rnd_extent(1, 4), T = rnd_extent(1, 5);
		int64_t Vp = rnd_extent(2, 7), C = rnd_extent(1, 4);
		int64_t Tmax = T + (int64_t)rnd(3);
		flow_shape_t tok = { .ndim = 2, .dims = { B, T } };
		flow_shape_t wte = { .ndim = 2, .dims = { Vp, C } };
		flow_shape_t wpe = { .ndim = 2, .dims = { Tmax, C } };
		flow_shape_t out = { .ndim = 3, .dims = { B, T, C } };
		prop_op_t fwd = { .q = query("embedding"),
				  .kernel = k_embedding,
				  .int_bound = { Vp } };
		prop_op_t bwd = { .q = query("embedding_backward"),
				  .kernel = k_embedding_backward,
				  .int_bound = { 0, Vp } };

		set_in(&fwd.q, &tok);
		set_in(&fwd.q, &wte);
		set_in(&fwd.q, &wpe);
		set_out(&fwd.q, &out);
		prop_check(&fwd, &st);
		set_in(&bwd.q, &out);
		set_in(&bwd.q, &tok);
		set_out(&bwd.q, &wte);
		set_out(&bwd.q, &wpe);
		prop_check(&bwd, &st);
	}
	assert_true(st.checked >= 60);
	assert_true(st.split >= 70);
}

static void test_signature_property_bias_and_broadcast_add(void **state)
{
	(void)state;
	prop_stats_t st = { 0 };

	for (int trial = 0; trial < TRIALS; trial++) {
		flow_shape_t x = rnd_shape(1 + (int)rnd(3), 1, 5);
		prop_op_t ba = { .q = query("bias_add"), .kernel = k_bias_add };
		int axis = (int)rnd((uint32_t)x.ndim);
		flow_shape_t bias = { .ndim = 1, .dims = { x.dims[axis] } };

		ba.q.attrs.axis = rnd(2) ? axis : axis - x.ndim;
		set_in(&ba.q, &x);
		set_in(&ba.q, &bias);
		set_out(&ba.q, &x);
		prop_check(&ba, &st);

		/* a and b broadcast to y: each axis whole or 1, b maybe
		 * shorter. */
		prop_op_t bc = { .q = query("broadcast_add"),
				 .kernel = k_broadcast_add };
		flow_shape_t y = rnd_shape(1 + (int)rnd(3), 2, 4), a = y, b;
		int drop = (int)rnd((uint32_t)y.ndim + 1);

		b.ndim = y.ndim - drop;
		for (int i = 0; i < y.ndim; i++)
			if (rnd(3) == 0)
				a.dims[i] = 1;
		for (int i = 0; i < b.ndim; i++)
			b.dims[i] = rnd(3) == 0 ? 1 : y.dims[i + drop];
		/* The result is y where a or b is whole. */
		for (int i = 0; i < y.ndim; i++) {
			int bi = i - drop;

			if (a.dims[i] == 1 && (bi < 0 || b.dims[bi] == 1))
				y.dims[i] = 1;
		}
		set_in(&bc.q, &a);
		set_in(&bc.q, &b);
		set_out(&bc.q, &y);
		prop_check(&bc, &st);
	}
	assert_true(st.checked >= 60);
	assert_true(st.split >= 55);
}

/* The rows form of cross-entropy is a local op; the vocab form gathers
 * across ranks inside the op (gather_bytes), which a local kernel cannot
 * show, so it is left out here. */
static void test_signature_property_cross_entropy_rows(void **state)
{
	(void)state;
	prop_stats_t st = { 0 };

	for (int trial = 0; trial < TRIALS; trial++) {
		flow_shape_t x = rnd_shape(2 + (int)rnd(2), 1, 5);
		int64_t Vp = x.dims[x.ndim - 1] + 1;
		uint32_t V = (uint32_t)rnd_extent(1, Vp);
		flow_shape_t rows = x, losses;
		prop_op_t op = { .q = query("cross_entropy"),
				 .kernel = k_cross_entropy };

		x.dims[x.ndim - 1] = Vp;
		rows.ndim--;
		losses = (flow_shape_t){ .ndim = 1,
					 .dims = { (int64_t)rows_of(&x) } };
		op.q.attrs.vocab = V;
		op.int_bound[1] = V;
		set_in(&op.q, &x);
		set_in(&op.q, &rows);
		set_out(&op.q, &losses);
		set_out(&op.q, &x);
		prop_check(&op, &st);
	}
	assert_true(st.gathering >= TRIALS);
	assert_true(st.checked >= 24);
	assert_true(st.split >= 5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_signature_matmul_list),
		cmocka_unit_test(test_signature_matmul_rejects_shapes),
		cmocka_unit_test(test_signature_unknown_op),
		cmocka_unit_test(test_signature_every_op_resolves_through_the_registry),
		cmocka_unit_test(test_signature_embedding_list),
		cmocka_unit_test(test_signature_layernorm_rows_follow_the_statistics),
		cmocka_unit_test(test_signature_layernorm_list),
		cmocka_unit_test(test_signature_layernorm_param_grad_list),
		cmocka_unit_test(test_signature_attention_list),
		cmocka_unit_test(test_signature_elementwise_lists),
		cmocka_unit_test(test_signature_broadcast_add_list),
		cmocka_unit_test(test_signature_bias_add_list),
		cmocka_unit_test(test_signature_cross_entropy_list),
		cmocka_unit_test(test_signature_reduce_lists),
		cmocka_unit_test(test_signature_transpose_list),
		cmocka_unit_test(test_signature_reshape_groups),
		cmocka_unit_test(test_signature_reshape_without_groups),
		cmocka_unit_test(test_signature_matmul_backward_list),
		cmocka_unit_test(test_signature_other_backward_lists),
		cmocka_unit_test(test_signature_candidates_count_and_filter),
		cmocka_unit_test(test_signature_candidates_order_first_axis_slowest),
		cmocka_unit_test(test_signature_candidates_have_no_duplicates),
		cmocka_unit_test(test_signature_candidates_joint_divisibility),
		cmocka_unit_test(test_signature_check_accepts_products),
		cmocka_unit_test(test_signature_check_rejects_non_products),
		cmocka_unit_test(test_signature_check_rejects_invalid_layouts),
		cmocka_unit_test(test_signature_query_of_gpt_ops),
		cmocka_unit_test(test_signature_property_matmul),
		cmocka_unit_test(test_signature_property_matmul_backward),
		cmocka_unit_test(test_signature_property_elementwise),
		cmocka_unit_test(test_signature_property_layernorm),
		cmocka_unit_test(test_signature_property_reduce),
		cmocka_unit_test(test_signature_property_transpose),
		cmocka_unit_test(test_signature_property_reshape),
		cmocka_unit_test(test_signature_property_embedding),
		cmocka_unit_test(test_signature_property_bias_and_broadcast_add),
		cmocka_unit_test(test_signature_property_cross_entropy_rows),
		cmocka_unit_test(test_signature_axis_index_finds_each_axis_rule),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
