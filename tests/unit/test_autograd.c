/* Autograd against finite differences, for every op, a chain of ops and a
 * tied weight; and the structure autograd builds (which gradients exist,
 * what is refused).
 *
 * Each check builds a tiny graph whose trained inputs are PARAM tensors,
 * differentiates it (flow_graph_backward_from on the op's output with
 * L = sum(w * out), w random; or the loss path for cross-entropy, where
 * L = loss_scale * sum(losses)), runs it with the reference kernels
 * (FLOW_KERNELS_REF: computed in double, rounded to float once) and
 * compares every element of every parameter gradient with a central
 * difference of L, accumulated in double.
 *
 * ---- step and tolerance ------------------------------------------------------
 * The difference is the five-point central stencil
 *   dL/dp ~ (8 (L(p+h) - L(p-h)) - (L(p+2h) - L(p-2h))) / 12h,
 * whose truncation error is h^4/30 |L'''''| (the plain two-point one has
 * h^2/6 |L'''|, which at a step large enough to beat rounding is ~1e-5
 * for these ops).  h = 2^-7, and every parameter value is a multiple of
 * 2^-10 of magnitude <= 4, so p +- h and p +- 2h are exact floats: the
 * stencil's points are exactly where it assumes.
 *
 * What remains is rounding.  Each output the kernels store is the exact
 * value rounded to float, relative error <= 2^-24, so one evaluation of L
 * is off by at most S = 2^-24 sum |w_i out_i|, and the stencil multiplies
 * that by (8 + 8 + 1 + 1) / 12h = 192.  For the largest output here (48
 * values of size <= 2) that worst case, every rounding error of every
 * output aligned, is ~1e-3; errors of random sign give ~1e-5, and the
 * largest measured is 2.2e-5.  The analytic gradients are floats rounded
 * once (relative 2^-24), and exact for the linear ops (the values are
 * multiples of 2^-10, so products and sums are exact).  ATOL = 5e-4 sits
 * 20x above every measured error and 20x below the smallest error a wrong
 * gradient rule or a mis-wired kernel argument makes here (a missing or
 * swapped term is off by >= 1e-2); RTOL = 1e-4 covers the few-ulp float
 * error of gradients of size ~4.  FLOW_TEST_VERBOSE=1 prints the largest
 * error of each check as a fraction of its tolerance (measured: at most
 * 0.044, cross-entropy with loss scale 0.75). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/exec.h>
#include <flow/graph.h>
#include <flow/mem.h>
#include <flow/ops.h>

#include "graphutil.h"

#define STEP 0x1p-7
#define ATOL 5e-4
#define RTOL 1e-4

/* The graph helpers fail the current test. */
static void fail_graph(const char *msg)
{
	fail_msg("%s", msg);
}

/* ---- the checker ------------------------------------------------------------- */

typedef struct check {
	const char *what;
	flow_graph_t g;
	flow_exec_t *x;
	int root, w;   /* L = sum(w * root); root -1: the loss path */
	double scale;  /* the loss path: L = scale * sum(losses) */
	uint64_t rng;
	double worst;  /* largest |error| / tolerance seen */
	double worst_abs; /* largest |error| */
} check_t;

static void check_init(check_t *c, const char *what)
{
	memset(c, 0, sizeof(*c));
	c->what = what;
	c->root = c->w = -1;
	c->rng = 0x9e3779b97f4a7c15u;
	flow_graph_init(&c->g);
}

/* A multiple of 2^-10 in [-range, range] (range a power of two <= 4). */
static float check_value(check_t *c, float range)
{
	c->rng = c->rng * 6364136223846793005u + 1442695040888963407u;
	int k = (int)((c->rng >> 33) % 2049) - 1024; /* [-1024, 1024] */
	return (float)k * 0x1p-10f * range;
}

static void check_exec(check_t *c)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	if (flow_exec_new(&c->g, FLOW_KERNELS_REF, &c->x, &diag) != FLOW_OK)
		fail_msg("%s: %s", c->what, flow_diag_message(&diag));
}

/* Differentiate from root (L = sum(w * root), w random) and build the
 * executor. */
static void check_from(check_t *c, int root)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	c->root = root;
	c->w = graphutil_must(flow_graph_backward_from(&c->g, root, &diag),
			      &diag);
	check_exec(c);
	float *w = flow_exec_tensor(c->x, c->w);
	for (size_t i = 0; i < flow_graph_tensor_numel(&c->g, c->w); i++)
		w[i] = check_value(c, 1.0f);
}

/* Differentiate from the loss, with the given loss scale. */
static void check_from_loss(check_t *c, int losses, float scale)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	graphutil_must(flow_graph_set_loss(&c->g, losses, &diag), &diag);
	graphutil_must(flow_graph_backward(&c->g, &diag), &diag);
	check_exec(c);
	flow_exec_set_loss_scale(c->x, scale);
	c->scale = (double)scale *
		   (double)flow_graph_tensor_numel(&c->g, losses);
}

/* Fill param t with random values in [-range, range]. */
static void check_fill(check_t *c, int t, float range)
{
	float *v = flow_exec_tensor(c->x, t);

	for (size_t i = 0; i < flow_graph_tensor_numel(&c->g, t); i++)
		v[i] = check_value(c, range);
}

static void check_ids(check_t *c, int t, const int32_t *ids)
{
	memcpy(flow_exec_tensor(c->x, t), ids,
	       flow_graph_tensor_numel(&c->g, t) * sizeof(int32_t));
}

/* L at the current parameters, in double. */
static double check_loss(check_t *c)
{
	double mean = graphutil_forward(c->x);

	if (c->root < 0)
		return c->scale * mean;
	const float *y = flow_exec_tensor(c->x, c->root);
	const float *w = flow_exec_tensor(c->x, c->w);
	double sum = 0.0;
	for (size_t i = 0; i < flow_graph_tensor_numel(&c->g, c->root); i++)
		sum += (double)w[i] * (double)y[i];
	return sum;
}

/* Set *p to v + k*STEP, which must be exact. */
static void check_nudge(float *p, float v, int k)
{
	double want = (double)v + k * STEP;

	*p = (float)want;
	assert_true((double)*p == want);
}

/* Every parameter gradient against the five-point central difference. */
static void check_gradients(check_t *c)
{
	const flow_graph_t *g = &c->g;

	flow_exec_zero_param_grads(c->x);
	(void)graphutil_forward(c->x);
	graphutil_backward(c->x);
	for (size_t t = 0; t < g->ntensors; t++) {
		if (g->tensors[t].role != FLOW_ROLE_PARAM)
			continue;
		size_t n = flow_graph_tensor_numel(g, (int)t);
		float *p = flow_exec_tensor(c->x, (int)t);
		const float *grad = flow_exec_tensor(c->x, g->tensors[t].grad);
		float *an = malloc(n * sizeof(float));
		assert_non_null(an);
		memcpy(an, grad, n * sizeof(float));
		for (size_t i = 0; i < n; i++) {
			float v = p[i];
			double l[4];
			const int k[4] = { -2, -1, 1, 2 };
			for (int j = 0; j < 4; j++) {
				check_nudge(&p[i], v, k[j]);
				l[j] = check_loss(c);
			}
			p[i] = v;
			double fd = (8.0 * (l[2] - l[1]) - (l[3] - l[0])) /
				    (12.0 * STEP);
			double err = fabs((double)an[i] - fd);
			double lim = ATOL + RTOL * fabs(fd);
			if (err / lim > c->worst)
				c->worst = err / lim;
			if (err > c->worst_abs)
				c->worst_abs = err;
			if (!(err <= lim))
				fail_msg("%s: d/d%s[%zu] = %.9g, finite "
					 "differences %.9g (atol %g rtol %g)",
					 c->what, g->tensors[t].name, i,
					 (double)an[i], fd, ATOL, RTOL);
		}
		free(an);
	}
	if (getenv("FLOW_TEST_VERBOSE"))
		print_message("%s: worst error %.3g of the tolerance "
			      "(%.3g absolute)\n",
			      c->what, c->worst, c->worst_abs);
}

static void check_release(check_t *c)
{
	flow_exec_free(c->x);
	flow_graph_release(&c->g);
}

/* ---- one op at a time ---------------------------------------------------------- */

static void test_autograd_embedding_matches_finite_differences(void **state)
{
	check_t c;
	/* Token 3 repeats: its wte row sums two gradients; rows 0 and 4 and
	 * wpe's last row are not used and get zero. */
	const int32_t ids[] = { 3, 1, 3, 2, 3, 1 };

	(void)state;
	check_init(&c, "embedding");
	int tok = IDS(&c.g, "tokens", 2, 3);
	int wte = PARAM(&c.g, "wte", 5, 4);
	int wpe = PARAM(&c.g, "wpe", 4, 4);
	check_from(&c, OP(&c.g, FLOW_OP_EMBEDDING, "embed", tok, wte, wpe));
	check_ids(&c, tok, ids);
	check_fill(&c, wte, 1.0f);
	check_fill(&c, wpe, 1.0f);
	check_gradients(&c);
	check_release(&c);
}

static void test_autograd_layernorm_matches_finite_differences(void **state)
{
	check_t c;

	(void)state;
	check_init(&c, "layernorm");
	int x = PARAM(&c.g, "x", 2, 3, 5);
	int w = PARAM(&c.g, "w", 5);
	int b = PARAM(&c.g, "b", 5);
	check_from(&c, OP(&c.g, FLOW_OP_LAYERNORM, "ln", x, w, b));
	check_fill(&c, x, 2.0f);
	check_fill(&c, w, 1.0f);
	check_fill(&c, b, 1.0f);
	check_gradients(&c);
	check_release(&c);
}

static void test_autograd_matmul_matches_finite_differences(void **state)
{
	check_t c;

	(void)state;
	check_init(&c, "matmul");
	int x = PARAM(&c.g, "x", 2, 3, 4);
	int w = PARAM(&c.g, "w", 5, 4);
	int b = PARAM(&c.g, "b", 5);
	check_from(&c, OP(&c.g, FLOW_OP_MATMUL, "mm", x, w, b));
	check_fill(&c, x, 1.0f);
	check_fill(&c, w, 1.0f);
	check_fill(&c, b, 1.0f);
	check_gradients(&c);
	check_release(&c);
}

static void test_autograd_matmul_without_bias_matches_finite_differences(
	void **state)
{
	check_t c;

	(void)state;
	check_init(&c, "matmul without bias");
	int x = PARAM(&c.g, "x", 3, 6);
	int w = PARAM(&c.g, "w", 2, 6);
	check_from(&c, OP(&c.g, FLOW_OP_MATMUL, "mm", x, w, -1));
	check_fill(&c, x, 4.0f);
	check_fill(&c, w, 1.0f);
	check_gradients(&c);
	check_release(&c);
}

static void test_autograd_attention_matches_finite_differences(void **state)
{
	check_t c;

	(void)state;
	check_init(&c, "attention");
	int qkv = PARAM(&c.g, "qkv", 2, 4, 18); /* C 6, 2 heads of 3 */
	check_from(&c, graphutil_op(&c.g, FLOW_OP_ATTENTION, "attn", &qkv, 1,
				    2, 0));
	check_fill(&c, qkv, 2.0f);
	check_gradients(&c);
	check_release(&c);
}

static void test_autograd_gelu_matches_finite_differences(void **state)
{
	check_t c;

	(void)state;
	check_init(&c, "gelu");
	int x = PARAM(&c.g, "x", 3, 7);
	check_from(&c, OP(&c.g, FLOW_OP_GELU, "gelu", x));
	check_fill(&c, x, 4.0f); /* both tails and the bend */
	check_gradients(&c);
	check_release(&c);
}

static void test_autograd_add_matches_finite_differences(void **state)
{
	check_t c;

	(void)state;
	check_init(&c, "add");
	int a = PARAM(&c.g, "a", 2, 5);
	int b = PARAM(&c.g, "b", 2, 5);
	check_from(&c, OP(&c.g, FLOW_OP_ADD, "res", a, b));
	check_fill(&c, a, 1.0f);
	check_fill(&c, b, 1.0f);
	check_gradients(&c);
	check_release(&c);
}

/* Cross-entropy through the loss path: logits = a + b (the logits must be
 * an op's output), V = 5 real columns of Vp = 7, one ignored row. */
static void cross_entropy_check(float scale, const char *what)
{
	check_t c;
	const int32_t targets[] = { 0, 4, -1, 2, 2, 1 };

	check_init(&c, what);
	int a = PARAM(&c.g, "a", 2, 3, 7);
	int b = PARAM(&c.g, "b", 2, 3, 7);
	int t = IDS(&c.g, "targets", 2, 3);
	int logits = OP(&c.g, FLOW_OP_ADD, "logits", a, b);
	int losses = graphutil_op(&c.g, FLOW_OP_CROSS_ENTROPY, "loss",
				  (const int[]){ logits, t }, 2, 0, 5);
	check_from_loss(&c, losses, scale);
	check_ids(&c, t, targets);
	check_fill(&c, a, 4.0f);
	check_fill(&c, b, 1.0f);
	check_gradients(&c);
	check_release(&c);
}

static void test_autograd_cross_entropy_matches_finite_differences(
	void **state)
{
	(void)state;
	cross_entropy_check(1.0f / 6.0f, "cross_entropy (mean)");
	cross_entropy_check(0.75f, "cross_entropy (scale 0.75)");
}

/* ---- ops together -------------------------------------------------------------- */

static void test_autograd_chain_matches_finite_differences(void **state)
{
	check_t c;
	const int32_t targets[] = { 1, 0, 4, 3, 3, 2 };

	(void)state;
	check_init(&c, "chain");
	int x = PARAM(&c.g, "x", 2, 3, 4);
	int lw = PARAM(&c.g, "ln.weight", 4);
	int lb = PARAM(&c.g, "ln.bias", 4);
	int w1 = PARAM(&c.g, "fc.weight", 8, 4);
	int b1 = PARAM(&c.g, "fc.bias", 8);
	int w2 = PARAM(&c.g, "proj.weight", 4, 8);
	int b2 = PARAM(&c.g, "proj.bias", 4);
	int wo = PARAM(&c.g, "head.weight", 6, 4);
	int t = IDS(&c.g, "targets", 2, 3);
	int h = OP(&c.g, FLOW_OP_LAYERNORM, "ln", x, lw, lb);
	h = OP(&c.g, FLOW_OP_MATMUL, "fc", h, w1, b1);
	h = OP(&c.g, FLOW_OP_GELU, "gelu", h);
	h = OP(&c.g, FLOW_OP_MATMUL, "proj", h, w2, b2);
	h = OP(&c.g, FLOW_OP_ADD, "residual", x, h);
	h = OP(&c.g, FLOW_OP_MATMUL, "head", h, wo, -1);
	int losses = graphutil_op(&c.g, FLOW_OP_CROSS_ENTROPY, "loss",
				  (const int[]){ h, t }, 2, 0, 5);
	check_from_loss(&c, losses, 1.0f / 6.0f);
	/* x reaches the residual twice: through ln and directly. */
	assert_int_equal(c.g.tensors[x].grad, flow_graph_find(&c.g, "x.grad"));
	check_ids(&c, t, targets);
	check_fill(&c, x, 1.0f);
	check_fill(&c, lw, 1.0f);
	check_fill(&c, lb, 1.0f);
	check_fill(&c, w1, 1.0f);
	check_fill(&c, b1, 1.0f);
	check_fill(&c, w2, 1.0f);
	check_fill(&c, b2, 1.0f);
	check_fill(&c, wo, 1.0f);
	check_gradients(&c);
	check_release(&c);
}

/* GPT's tied embedding: the token table is also the head's weight. */
static void tied_build(check_t *c, bool tied)
{
	int e1 = PARAM(&c->g, "wte", 6, 4);
	int e2 = tied ? e1 : PARAM(&c->g, "head.weight", 6, 4);
	int wpe = PARAM(&c->g, "wpe", 3, 4);
	int lw = PARAM(&c->g, "ln.weight", 4);
	int lb = PARAM(&c->g, "ln.bias", 4);
	int tok = IDS(&c->g, "tokens", 2, 3);
	int t = IDS(&c->g, "targets", 2, 3);
	const int32_t ids[] = { 5, 0, 2, 2, 1, 5 };
	const int32_t targets[] = { 0, 2, 2, 1, 5, 3 };

	int h = OP(&c->g, FLOW_OP_EMBEDDING, "embed", tok, e1, wpe);
	h = OP(&c->g, FLOW_OP_LAYERNORM, "ln", h, lw, lb);
	h = OP(&c->g, FLOW_OP_MATMUL, "head", h, e2, -1);
	int losses = graphutil_op(&c->g, FLOW_OP_CROSS_ENTROPY, "loss",
				  (const int[]){ h, t }, 2, 0, 6);
	check_from_loss(c, losses, 1.0f / 6.0f);
	check_ids(c, tok, ids);
	check_ids(c, t, targets);
	check_fill(c, e1, 1.0f);
	if (!tied) /* the same values in both copies */
		memcpy(flow_exec_tensor(c->x, e2), flow_exec_tensor(c->x, e1),
		       24 * sizeof(float));
	check_fill(c, wpe, 1.0f);
	check_fill(c, lw, 1.0f);
	check_fill(c, lb, 1.0f);
}

static void test_autograd_tied_weight_gets_the_sum(void **state)
{
	check_t tied, untied;

	(void)state;
	check_init(&tied, "tied weight");
	tied_build(&tied, true);
	/* Two backward ops accumulate into the one gradient. */
	int dwte = tied.g.tensors[flow_graph_find(&tied.g, "wte")].grad;
	int writers = 0;
	for (size_t i = tied.g.nforward; i < tied.g.nops; i++)
		for (int k = 0; k < tied.g.ops[i].nout; k++)
			writers += tied.g.ops[i].out[k] == dwte;
	assert_int_equal(writers, 2);
	check_gradients(&tied);

	/* The same model with the table and the head untied: the tied
	 * gradient is the sum of the two (to one float rounding). */
	check_init(&untied, "untied weight");
	tied_build(&untied, false);
	flow_exec_zero_param_grads(untied.x);
	(void)graphutil_forward(untied.x);
	graphutil_backward(untied.x);
	const float *g = flow_exec_tensor(tied.x, dwte);
	const float *g1 = flow_exec_tensor(
		untied.x, untied.g.tensors[flow_graph_find(&untied.g, "wte")].grad);
	const float *g2 = flow_exec_tensor(
		untied.x,
		untied.g.tensors[flow_graph_find(&untied.g, "head.weight")].grad);
	for (int i = 0; i < 24; i++) {
		double sum = (double)g1[i] + (double)g2[i];
		assert_true(fabs((double)g[i] - sum) <=
			    1e-9 + 0x1p-22 * (fabs(g1[i]) + fabs(g2[i])));
	}
	check_release(&untied);
	check_release(&tied);
}

/* ---- structure ------------------------------------------------------------------ */

static void test_autograd_only_required_gradients_exist(void **state)
{
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_exec_t *x;

	(void)state;
	flow_graph_init(&g);
	int in = graphutil_tensor(&g, "x", FLOW_ROLE_INPUT, FLOW_DTYPE_F32, 2,
				  DIMS(3, 4));
	int w = PARAM(&g, "w", 5, 4);
	int b = PARAM(&g, "b", 5);
	int unused = PARAM(&g, "unused", 7);
	int y = OP(&g, FLOW_OP_MATMUL, "mm", in, w, b);
	int z = OP(&g, FLOW_OP_GELU, "gelu", in); /* needs no gradient */
	assert_false(g.tensors[z].requires_grad);
	assert_true(g.tensors[y].requires_grad);
	int grad = 0;
	assert_int_equal(flow_graph_grad_for(&g, in, &grad, &diag), FLOW_OK);
	assert_int_equal(grad, -1);
	grad = 0;
	assert_int_equal(flow_graph_grad_for(&g, z, &grad, &diag), FLOW_OK);
	assert_int_equal(grad, -1);
	grad = 0;
	assert_int_equal(flow_graph_grad_for(&g, 999, &grad, &diag), FLOW_OK);
	assert_int_equal(grad, -1);

	int root = graphutil_must(flow_graph_backward_from(&g, y, &diag),
				  &diag);
	assert_string_equal(g.tensors[root].name, "mm.out.grad");
	assert_int_equal(g.tensors[root].role, FLOW_ROLE_INPUT);
	assert_int_equal(g.tensors[root].grad_of, y);
	assert_int_equal(g.tensors[y].grad, root);
	/* One backward op: the gelu reads nothing that requires a gradient
	 * and the input x gets none. */
	assert_int_equal(g.nops, 3);
	const flow_graph_op_t *mb = &g.ops[2];
	assert_int_equal(mb->kind, FLOW_OP_MATMUL_BACKWARD);
	assert_int_equal(mb->in[0], root);
	assert_int_equal(mb->out[0], -1);
	assert_int_equal(mb->out[1], g.tensors[w].grad);
	assert_int_equal(mb->out[2], g.tensors[b].grad);
	assert_int_equal(g.tensors[in].grad, -1);
	/* A parameter that does not reach the root still has a gradient. */
	int du = g.tensors[unused].grad;
	assert_true(du >= 0);
	assert_int_equal(g.tensors[du].role, FLOW_ROLE_PARAM_GRAD);
	assert_string_equal(g.tensors[du].name, "unused.grad");
	assert_int_equal(flow_graph_validate(&g, &diag), FLOW_OK);

	/* ... which stays zero. */
	assert_int_equal(flow_exec_new(&g, FLOW_KERNELS_CPU, &x, &diag),
			 FLOW_OK);
	float *dw = flow_exec_tensor(x, du);
	for (int i = 0; i < 7; i++)
		dw[i] = 1.0f;
	flow_exec_zero_param_grads(x);
	float *gy = flow_exec_tensor(x, root);
	for (int i = 0; i < 15; i++)
		gy[i] = 1.0f;
	(void)graphutil_forward(x);
	graphutil_backward(x);
	for (int i = 0; i < 7; i++)
		assert_true(dw[i] == 0.0f);
	flow_exec_free(x);
	flow_graph_release(&g);
}

static void test_autograd_refuses_what_it_cannot_differentiate(void **state)
{
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;

	(void)state;
	flow_graph_init(&g);
	int p = PARAM(&g, "p", 4);
	int w = PARAM(&g, "lw", 4);
	int b = PARAM(&g, "lb", 4);
	int twice = OP(&g, FLOW_OP_ADD, "twice", p, p);
	int ln = OP(&g, FLOW_OP_LAYERNORM, "ln", twice, w, b);
	int mean = flow_graph_find(&g, "ln.mean");
	size_t ntensors = g.ntensors;

	/* Not an activation: a saved tensor, a param, no tensor. */
	assert_int_equal(flow_graph_backward_from(&g, mean, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "cannot differentiate from tensor 5: "
				      "not an activation");
	flow_diag_clear(&diag);
	assert_int_equal(flow_graph_backward_from(&g, p, &diag),
			 FLOW_ERR_USAGE);
	flow_diag_clear(&diag);
	assert_int_equal(flow_graph_backward_from(&g, -3, &diag),
			 FLOW_ERR_USAGE);
	flow_diag_clear(&diag);

	/* add(p, p) would give its backward kernel one buffer twice: refused,
	 * and the graph is left as it was. */
	assert_int_equal(flow_graph_backward_from(&g, ln, &diag),
			 FLOW_ERR_NOTSUP);
	assert_string_equal(diag.msg, "twice: reads 'p' twice, which its "
				      "backward op cannot differentiate");
	assert_int_equal(g.ntensors, ntensors);
	assert_int_equal(g.nops, g.nforward);
	for (size_t t = 0; t < g.ntensors; t++)
		assert_int_equal(g.tensors[t].grad, -1);
	flow_diag_clear(&diag);
	assert_int_equal(flow_graph_validate(&g, &diag), FLOW_OK);

	/* Appending a backward op checks it against its forward op. */
	assert_int_equal(flow_graph_append_backward_op(
				 &g, FLOW_OP_GELU_BACKWARD, 0,
				 (const int[]){ twice, p }, 2,
				 (const int[]){ -1 }, 1, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "backward op of kind 11 does not "
				      "differentiate op 0");
	flow_diag_clear(&diag);
	assert_int_equal(flow_graph_append_backward_op(
				 &g, FLOW_OP_ADD_BACKWARD, 0,
				 (const int[]){ twice }, 1,
				 (const int[]){ ln, -1 }, 2, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "twice.backward: output 'ln.out' is a "
				      "activation, not a gradient");
	flow_graph_release(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_autograd_embedding_matches_finite_differences),
		cmocka_unit_test(test_autograd_layernorm_matches_finite_differences),
		cmocka_unit_test(test_autograd_matmul_matches_finite_differences),
		cmocka_unit_test(
			test_autograd_matmul_without_bias_matches_finite_differences),
		cmocka_unit_test(test_autograd_attention_matches_finite_differences),
		cmocka_unit_test(test_autograd_gelu_matches_finite_differences),
		cmocka_unit_test(test_autograd_add_matches_finite_differences),
		cmocka_unit_test(
			test_autograd_cross_entropy_matches_finite_differences),
		cmocka_unit_test(test_autograd_chain_matches_finite_differences),
		cmocka_unit_test(test_autograd_tied_weight_gets_the_sum),
		cmocka_unit_test(test_autograd_only_required_gradients_exist),
		cmocka_unit_test(test_autograd_refuses_what_it_cannot_differentiate),
	};

	graphutil_fail = fail_graph;
	return cmocka_run_group_tests(tests, NULL, NULL) ? EXIT_FAILURE :
							   EXIT_SUCCESS;
}
