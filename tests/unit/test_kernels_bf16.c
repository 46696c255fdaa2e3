/* The bf16 twins of the kernels (flow/kernels.h, "bf16 activations") of
 * the CPU and the reference sets against PyTorch: every *_bf16 kernel is
 * run on the fixtures that tests/ref/gen_kernels.py wrote (inputs that
 * are bf16 values, expectations computed in float64 from them and rounded
 * once, to bf16 or to fp32), and compared element by element.  Also: the
 * backward contract (a bf16 gradient accumulates as g = bf16(g + dg), an
 * fp32 one as +=, an optional gradient passed as NULL is left alone), the
 * fused pairs giving the unfused kernels' bits, and that the fixtures tell
 * bf16 from fp32, so that a twin that forgets to round fails.
 *
 * Fixtures are found under $top_srcdir/tests/ref/fixtures (make check sets
 * top_srcdir; by hand, run from the source tree or set it). */
#include <config.h>

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <flow/kernels.h>
#include <flow/kernels_ref.h>
#include <flow/mem.h>
#include <flow/rng.h>
#include <flow/tensor.h>

#include "fixture_assert.h"
#include "testutil.h"

/* ---- tolerances ------------------------------------------------------------
 * bf16 results.  A twin computes in fp32 (the reference set in double) and
 * rounds once; the fixture rounds the float64 result once.  The two
 * unrounded values differ by the fp32 computation's error, far below a
 * bf16 ulp (2^-8 relative), so they round to the same bf16 value, except
 * where they straddle a rounding boundary: then to the neighbouring one.
 * That happens to an element with probability about (fp32 error) / (bf16
 * ulp), ~2^-16 sqrt(K) for a sum of K terms, so:
 * - an element passes when it is the expected bf16 value, or within the
 *   fp32 computation's absolute error floor of it (the ATOL_* below, the
 *   same as tests/unit/test_kernels.c's for the fp32 kernels: near zero,
 *   where a bf16 ulp is smaller than what fp32 itself gets right, and in
 *   GELU's tail, where 1 + tanh keeps only fp32's absolute precision);
 * - otherwise it may be the neighbouring bf16 value (one ulp off), for at
 *   most BF16_FLIPS_MAX(n) of the n elements;
 * - anything further off fails.
 * Rounding straddles are rare: measured with FLOW_TEST_VERBOSE=1, which
 * prints each comparison's count, the CPU set flips 1 element of
 * gelu_bf16's out (of 1006), of matmul_gelu_bf16's out (of 520) and of
 * attention_bf16_t64's accumulated dqkv (of 6144), none elsewhere; the
 * reference set none.  A twin that forgets a rounding moves far more: a
 * weight left unrounded moves 33% of matmul_bf16_wide's out, P and dpre
 * unrounded 40% of attention_bf16_t64's out and 39% of its dqkv, a
 * gradient rounded before it is accumulated (bf16(g + bf16(dg))) 30% of
 * dinp_acc, many of them by more than one ulp (the "differs" tests below
 * check it on the kernels).
 *
 * fp32 results (the residual stream's gradient, mean, rstd, lse, losses,
 * the parameters' gradients) are checked as test_kernels.c checks the fp32
 * kernels: |got - ref| <= atol + RTOL |ref|, the bf16 inputs being exact
 * in fp32. */
#define RTOL 1e-5
/* Elementwise results: no cancelling sums. */
#define ATOL_ELEMENTWISE 1e-7
/* GELU's tail (test_kernels.c, ATOL_GELU): 1 + tanhf(u) and 1 - tanhf^2
 * keep only fp32's absolute precision near 1, ~1.7e-6 absolute at worst
 * after scaling.  There gelu(x) is far below 1e-6 (gelu(-5.5) ~ -6e-9),
 * so a bf16 ulp means nothing: without this floor 10 of gelu_bf16's out
 * and 12 of matmul_gelu_bf16's are more than one ulp off on the CPU set
 * (11 of gelu_bf16's with PyTorch's fp32 GELU), all within it. */
#define ATOL_GELU 2e-6
/* Sums of <= 130 terms of size ~1 (matmul K <= 96, layernorm, attention
 * over T <= 64, the parameters' gradients over <= 130 rows). */
#define ATOL_SUM 1e-5
/* Softmax probabilities and their gradient, in [0, 1]. */
#define ATOL_PROB 1e-8
/* Layernorm dinp: three cancelling O(1) terms times rstd, which is 316
 * for the C = 1 case. */
#define ATOL_LN_DINP 1e-4
/* Elements of n that may sit one bf16 ulp from the fixture: 1% and one,
 * five times the most seen (1 of 520) and a thirtieth of what a missing
 * rounding moves (30% to 40%). */
#define BF16_FLIPS_MAX(n) ((n) / 100 + 1)

/* ---- helpers ---------------------------------------------------------------*/

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* The host sets, each checked against every fixture. */
static const flow_kernels_t *const host_sets[] = { &flow_cpu_kernels,
						   &flow_ref_kernels };


static void *mem_new(size_t bytes)
{
	void *p = flow_alloc(bytes ? bytes : 1);

	assert_non_null(p);
	return p;
}

static float *f32_new(size_t n)
{
	return mem_new(n * sizeof(float));
}

static float *f32_copy(const float *src, size_t n)
{
	float *p = f32_new(n);

	memcpy(p, src, n * sizeof(float));
	return p;
}

/* An fp32 gradient's starting content: zeros, or (fill != 0) a fixed
 * nonzero pattern, to prove the kernels add to it. */
static float *f32_start(size_t n, float fill)
{
	float *p = f32_new(n);

	for (size_t i = 0; i < n; i++)
		p[i] = fill * (float)((int)(i % 7) - 3) / 3.0f;
	return p;
}

static flow_bf16_t *bf16_new(size_t n)
{
	return mem_new(n * sizeof(flow_bf16_t));
}

/* n bf16 values from a fixture's floats, which must each be one (the
 * generator's promise: rounding them would hide a wrong fixture). */
static flow_bf16_t *bf16_from(const char *fixture, const char *what,
			      const float *x, size_t n)
{
	flow_bf16_t *p = bf16_new(n);

	for (size_t i = 0; i < n; i++) {
		p[i] = flow_bf16_narrow(x[i]);
		if (flow_bf16_widen(p[i]) != x[i] && !isnan(x[i]))
			fail_msg("%s %s[%zu] = %.9g is not a bf16 value",
				 fixture, what, i, (double)x[i]);
	}
	return p;
}

/* The same from the fixture array `what` of n elements (any shape). */
static flow_bf16_t *bf16_array(const flow_fixture_t *fx, const char *fixture,
			       const char *what, size_t n)
{
	const flow_fixture_array_t *a = flow_fixture_find(fx, what);

	if (!a || a->dtype != FLOW_FIXTURE_F32 || a->count != n)
		fail_msg("%s: no float array '%s' of %zu elements", fixture,
			 what, n);
	return bf16_from(fixture, what, a->data, n);
}

/* n bf16 values filled with a pattern that is no result (garbage the
 * forward kernels must overwrite). */
static flow_bf16_t *bf16_garbage(size_t n)
{
	flow_bf16_t *p = bf16_new(n);

	for (size_t i = 0; i < n; i++)
		p[i] = (flow_bf16_t)(0x4110u + i % 5); /* ~9 */
	return p;
}

static float *widen(const flow_bf16_t *x, size_t n)
{
	float *p = f32_new(n);

	for (size_t i = 0; i < n; i++)
		p[i] = flow_bf16_widen(x[i]);
	return p;
}

static bool verbose(void)
{
	return getenv("FLOW_TEST_VERBOSE") != NULL;
}

/* The position of bf16 value h among all bf16 values in increasing order
 * (+0 and -0 both 0), so that neighbours differ by 1. */
static int32_t bf16_rank(flow_bf16_t h)
{
	return h & 0x8000u ? -(int32_t)(h & 0x7fffu) : (int32_t)h;
}

/* How a bf16 result compares with a bf16 expectation (above, "bf16
 * results"): elements beyond atol that are the neighbouring bf16 value
 * (flips) and those further off (bad, NaN included), the first of either
 * at *first. */
typedef struct {
	size_t flips, bad, first;
} bf16_count_t;

static bf16_count_t bf16_count(const float *got, const float *ref, size_t n,
			       double atol)
{
	bf16_count_t c = { 0, 0, 0 };

	for (size_t i = 0; i < n; i++) {
		double err = fabs((double)got[i] - (double)ref[i]);
		if (err <= atol) /* NaN fails this */
			continue;
		flow_bf16_t g = flow_bf16_narrow(got[i]);
		bool neighbour = !isnan(got[i]) && !isnan(ref[i]) &&
				 flow_bf16_widen(g) == got[i] &&
				 abs(bf16_rank(g) -
				     bf16_rank(flow_bf16_narrow(ref[i]))) == 1;
		if (c.flips + c.bad == 0)
			c.first = i;
		if (neighbour)
			c.flips++;
		else
			c.bad++;
	}
	return c;
}

/* got (n bf16 values) against the fixture's bf16 expectation ref. */
static void check_bf16(const char *set, const char *fixture, const char *what,
		       const flow_bf16_t *got, const float *ref, size_t n,
		       double atol)
{
	float *g = widen(got, n);
	bf16_count_t c = bf16_count(g, ref, n, atol);

	if (verbose())
		print_message("%s %s %s: %zu of %zu elements one bf16 ulp off "
			      "(%zu allowed), %zu further\n", set, fixture,
			      what, c.flips, n, (size_t)BF16_FLIPS_MAX(n),
			      c.bad);
	if (c.bad || c.flips > BF16_FLIPS_MAX(n))
		fail_msg("%s %s %s: %zu of %zu elements one bf16 ulp off (at "
			 "most %zu may be), %zu further; first [%zu] got %.9g "
			 "want %.9g (atol %g)", set, fixture, what, c.flips, n,
			 (size_t)BF16_FLIPS_MAX(n), c.bad, c.first,
			 (double)g[c.first], (double)ref[c.first], atol);
	flow_free(g);
}

/* got (n floats) within atol + rtol |ref| of ref everywhere. */
static void check_f32(const char *set, const char *fixture, const char *what,
		      const float *got, const float *ref, size_t n,
		      double atol, double rtol)
{
	size_t bad = 0, first = 0;
	double worst = 0.0;

	for (size_t i = 0; i < n; i++) {
		double err = fabs((double)got[i] - (double)ref[i]);
		double lim = atol + rtol * fabs((double)ref[i]);
		if (!(err <= lim) && bad++ == 0)
			first = i;
		if (err / lim > worst)
			worst = err / lim;
	}
	if (verbose())
		print_message("%s %s %s: worst error %.3g of the tolerance\n",
			      set, fixture, what, worst);
	if (bad)
		fail_msg("%s %s %s: %zu of %zu elements off; first [%zu] got "
			 "%.9g want %.9g (atol %g rtol %g)", set, fixture, what,
			 bad, n, first, (double)got[first], (double)ref[first],
			 atol, rtol);
}

static void check_same(const char *set, const char *fixture, const char *what,
		       const void *got, const void *want, size_t bytes)
{
	if (memcmp(got, want, bytes) != 0)
		fail_msg("%s %s %s: not the expected bits", set, fixture, what);
}

/* Which optional gradients a backward run asks for. */
enum { WANT_0 = 1, WANT_1 = 2, WANT_2 = 4, WANT_ALL = 7 };

/* How a backward run starts its gradients: from zeros (the fixture's
 * <name>), or accumulating (bf16 gradients from the fixture's
 * <name>_start, expecting <name>_acc; fp32 ones from f32_start's pattern,
 * expecting it plus <name>); and which gradients it asks for. */
typedef struct {
	bool acc;
	unsigned want;
} grad_run_t;

static const grad_run_t grad_runs[] = {
	{ false, WANT_ALL }, { true, WANT_ALL }, { true, WANT_0 },
	{ true, WANT_1 },    { true, WANT_2 },
};

/* An fp32 gradient of n elements for a run: its buffer (NULL when not
 * wanted), and an untouched copy of its start. */
typedef struct {
	const char *what;
	size_t n;
	float fill;
	bool wanted;
	float *buf, *start;
} grad32_t;

static grad32_t grad32_new(const char *what, size_t n, bool acc, bool wanted)
{
	grad32_t g = { what, n, acc ? 0.75f : 0.0f, wanted, NULL, NULL };

	g.buf = f32_start(n, g.fill);
	g.start = f32_copy(g.buf, n);
	return g;
}

static float *grad32_arg(const grad32_t *g)
{
	return g->wanted ? g->buf : NULL;
}

/* Wanted: start + the fixture's gradient, to atol + RTOL |ref|; not
 * wanted: the start, bit for bit. */
static void grad32_check(const char *set, const flow_fixture_t *fx,
			 const char *fixture, const grad32_t *g, double atol)
{
	if (g->wanted) {
		const flow_fixture_array_t *a = flow_fixture_find(fx, g->what);
		if (!a || a->count != g->n)
			fail_msg("%s: no array '%s' of %zu elements", fixture,
				 g->what, g->n);
		float *e = f32_copy(g->start, g->n);
		for (size_t i = 0; i < g->n; i++)
			e[i] += ((const float *)a->data)[i];
		check_f32(set, fixture, g->what, g->buf, e, g->n, atol, RTOL);
		flow_free(e);
	} else {
		check_same(set, fixture, g->what, g->buf, g->start,
			   g->n * sizeof(float));
	}
	BUFS_FREE(g->buf, g->start);
}

/* A bf16 gradient of n elements for a run, started from zeros or from the
 * fixture's <what>_start. */
typedef struct {
	const char *what;
	size_t n;
	bool acc, wanted;
	flow_bf16_t *buf, *start;
} grad16_t;

static grad16_t grad16_new(const flow_fixture_t *fx, const char *fixture,
			   const char *what, size_t n, bool acc, bool wanted)
{
	grad16_t g = { what, n, acc, wanted, NULL, NULL };
	char name[64];

	if (acc) {
		snprintf(name, sizeof(name), "%s_start", what);
		g.buf = bf16_array(fx, fixture, name, n);
	} else {
		g.buf = bf16_new(n);
		memset(g.buf, 0, n * sizeof(flow_bf16_t));
	}
	g.start = bf16_new(n);
	memcpy(g.start, g.buf, n * sizeof(flow_bf16_t));
	return g;
}

static flow_bf16_t *grad16_arg(const grad16_t *g)
{
	return g->wanted ? g->buf : NULL;
}

static void grad16_check(const char *set, const flow_fixture_t *fx,
			 const char *fixture, const grad16_t *g, double atol)
{
	char name[64];

	if (g->wanted) {
		snprintf(name, sizeof(name), "%s%s", g->what,
			 g->acc ? "_acc" : "");
		const flow_fixture_array_t *a = flow_fixture_find(fx, name);
		if (!a || a->count != g->n)
			fail_msg("%s: no array '%s' of %zu elements", fixture,
				 name, g->n);
		check_bf16(set, fixture, name, g->buf, a->data, g->n, atol);
	} else {
		check_same(set, fixture, g->what, g->buf, g->start,
			   g->n * sizeof(flow_bf16_t));
	}
	BUFS_FREE(g->buf, g->start);
}

/* ---- matmul ------------------------------------------------------------------*/

static const char *const matmul_fixtures[] = {
	"matmul_bf16_small", "matmul_bf16_row1", "matmul_bf16_nobias",
	"matmul_bf16_wide"
};

static void *matmul_scratch(const flow_kernels_t *k, size_t n, size_t i,
			    size_t o)
{
	size_t bytes = k->matmul_bf16_scratch_bound(n, i, o);
	void *p = mem_new(bytes);

	memset(p, 0xA5, bytes); /* garbage that must not matter */
	return p;
}

static void test_kernels_bf16_matmul_forward_matches_torch(void **state)
{
	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		const flow_kernels_t *k = host_sets[s];
		for (size_t c = 0; c < ARRAY_SIZE(matmul_fixtures); c++) {
			const char *name = matmul_fixtures[c];
			flow_fixture_t fx = { 0 };
			fixture_load(&fx, name);
			const int32_t *d = fixture_dims(&fx, 3);
			size_t n = (size_t)d[0], i = (size_t)d[1],
			       o = (size_t)d[2];
			const float *bias = flow_fixture_find(&fx, "bias") ?
						    F32(&fx, "bias", o) : NULL;
			flow_bf16_t *inp = bf16_from(name, "inp",
						     F32(&fx, "inp", n, i),
						     n * i);
			flow_bf16_t *out = bf16_garbage(n * o);
			void *scratch = matmul_scratch(k, n, i, o);

			k->matmul_bf16_forward(out, scratch, inp,
					       F32(&fx, "weight", o, i), bias,
					       n, i, o);
			check_bf16(k->name, name, "out", out,
				   F32(&fx, "out", n, o), n * o, ATOL_SUM);
			BUFS_FREE(inp, out, scratch);
			flow_fixture_release(&fx);
		}
	}
}

static void matmul_backward_run(const flow_kernels_t *k, const char *name,
				grad_run_t r)
{
	flow_fixture_t fx = { 0 };
	fixture_load(&fx, name);
	const int32_t *d = fixture_dims(&fx, 3);
	size_t n = (size_t)d[0], i = (size_t)d[1], o = (size_t)d[2];
	bool has_bias = flow_fixture_find(&fx, "bias") != NULL;
	flow_bf16_t *dout = bf16_from(name, "dout", F32(&fx, "dout", n, o),
				      n * o);
	flow_bf16_t *inp = bf16_from(name, "inp", F32(&fx, "inp", n, i), n * i);
	grad16_t dinp = grad16_new(&fx, name, "dinp", n * i, r.acc,
				   r.want & WANT_0);
	grad32_t dw = grad32_new("dweight", o * i, r.acc, r.want & WANT_1);
	grad32_t db = grad32_new("dbias", o, r.acc,
				 has_bias && (r.want & WANT_2));
	void *scratch = matmul_scratch(k, n, i, o);

	k->matmul_bf16_backward(grad16_arg(&dinp), grad32_arg(&dw),
				grad32_arg(&db), scratch, dout, inp,
				F32(&fx, "weight", o, i), n, i, o);
	grad16_check(k->name, &fx, name, &dinp, ATOL_SUM);
	grad32_check(k->name, &fx, name, &dw, ATOL_SUM);
	grad32_check(k->name, &fx, name, &db, ATOL_SUM);
	BUFS_FREE(dout, inp, scratch);
	flow_fixture_release(&fx);
}

/* From zeros, accumulating, and with each gradient alone. */
static void test_kernels_bf16_matmul_backward_matches_torch(void **state)
{
	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++)
		for (size_t c = 0; c < ARRAY_SIZE(matmul_fixtures); c++)
			for (size_t r = 0; r < ARRAY_SIZE(grad_runs); r++)
				matmul_backward_run(host_sets[s],
						    matmul_fixtures[c],
						    grad_runs[r]);
}

/* ---- matmul with GELU ------------------------------------------------------*/

static const char *const matmul_gelu_fixtures[] = {
	"matmul_gelu_bf16", "matmul_gelu_bf16_nobias"
};

/* pre against the fixture; out against it where pre is the fixture's (a
 * flipped pre moves out by gelu' times a pre ulp, many of out's ulps in
 * the tail; there the fused test below holds out to gelu of the pre the
 * kernel stored, bit for bit). */
static void test_kernels_bf16_matmul_gelu_matches_torch(void **state)
{
	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		const flow_kernels_t *k = host_sets[s];
		for (size_t c = 0; c < ARRAY_SIZE(matmul_gelu_fixtures); c++) {
			const char *name = matmul_gelu_fixtures[c];
			flow_fixture_t fx = { 0 };
			fixture_load(&fx, name);
			const int32_t *d = fixture_dims(&fx, 3);
			size_t n = (size_t)d[0], i = (size_t)d[1],
			       o = (size_t)d[2], m = 0;
			const float *bias = flow_fixture_find(&fx, "bias") ?
						    F32(&fx, "bias", o) : NULL;
			const float *rpre = F32(&fx, "pre", n, o);
			const float *rout = F32(&fx, "out", n, o);
			flow_bf16_t *inp = bf16_from(name, "inp",
						     F32(&fx, "inp", n, i),
						     n * i);
			flow_bf16_t *pre = bf16_garbage(n * o);
			flow_bf16_t *out = bf16_garbage(n * o);
			flow_bf16_t *got = bf16_new(n * o);
			float *want = f32_new(n * o);
			void *scratch = matmul_scratch(k, n, i, o);

			k->matmul_gelu_bf16_forward(pre, out, scratch, inp,
						    F32(&fx, "weight", o, i),
						    bias, n, i, o);
			check_bf16(k->name, name, "pre", pre, rpre, n * o,
				   ATOL_SUM);
			for (size_t e = 0; e < n * o; e++) {
				if (flow_bf16_widen(pre[e]) != rpre[e])
					continue;
				got[m] = out[e];
				want[m++] = rout[e];
			}
			check_bf16(k->name, name, "out", got, want, m,
				   ATOL_GELU);
			BUFS_FREE(inp, pre, out, got, want, scratch);
			flow_fixture_release(&fx);
		}
	}
}

/* ---- layernorm -------------------------------------------------------------*/

static const char *const layernorm_fixtures[] = {
	"layernorm_bf16_small", "layernorm_bf16_c768", "layernorm_bf16_c1"
};

static void test_kernels_bf16_layernorm_forward_matches_torch(void **state)
{
	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		const flow_kernels_t *k = host_sets[s];
		for (size_t c = 0; c < ARRAY_SIZE(layernorm_fixtures); c++) {
			const char *name = layernorm_fixtures[c];
			flow_fixture_t fx = { 0 };
			fixture_load(&fx, name);
			const int32_t *d = fixture_dims(&fx, 2);
			size_t n = (size_t)d[0], C = (size_t)d[1];
			flow_bf16_t *out = bf16_garbage(n * C);
			float *mean = f32_start(n, 9.0f);
			float *rstd = f32_start(n, 9.0f);

			k->layernorm_bf16_forward(out, mean, rstd,
						  F32(&fx, "inp", n, C),
						  F32(&fx, "weight", C),
						  F32(&fx, "bias", C), n, C);
			/* out = xhat*w + b: a cancelling sum of 2 terms. */
			check_bf16(k->name, name, "out", out,
				   F32(&fx, "out", n, C), n * C, ATOL_SUM);
			check_f32(k->name, name, "mean", mean,
				  F32(&fx, "mean", n), n, ATOL_SUM, RTOL);
			check_f32(k->name, name, "rstd", rstd,
				  F32(&fx, "rstd", n), n, 0.0, RTOL);
			BUFS_FREE(out, mean, rstd);
			flow_fixture_release(&fx);
		}
	}
}

/* mean and rstd from the set's own forward, as in training. */
static void layernorm_backward_run(const flow_kernels_t *k, const char *name,
				   grad_run_t r)
{
	flow_fixture_t fx = { 0 };
	fixture_load(&fx, name);
	const int32_t *d = fixture_dims(&fx, 2);
	size_t n = (size_t)d[0], C = (size_t)d[1];
	const float *inp = F32(&fx, "inp", n, C);
	const float *w = F32(&fx, "weight", C);
	flow_bf16_t *out = bf16_new(n * C);
	flow_bf16_t *dout = bf16_from(name, "dout", F32(&fx, "dout", n, C),
				      n * C);
	float *mean = f32_new(n), *rstd = f32_new(n);
	grad32_t dinp = grad32_new("dinp", n * C, r.acc, r.want & WANT_0);
	grad32_t dw = grad32_new("dweight", C, r.acc, r.want & WANT_1);
	grad32_t db = grad32_new("dbias", C, r.acc, r.want & WANT_2);

	k->layernorm_bf16_forward(out, mean, rstd, inp, w,
				  F32(&fx, "bias", C), n, C);
	k->layernorm_bf16_backward(grad32_arg(&dinp), grad32_arg(&dw),
				   grad32_arg(&db), dout, inp, w, mean, rstd,
				   n, C);
	grad32_check(k->name, &fx, name, &dinp, ATOL_LN_DINP);
	grad32_check(k->name, &fx, name, &dw, ATOL_SUM);
	grad32_check(k->name, &fx, name, &db, ATOL_SUM);
	BUFS_FREE(out, dout, mean, rstd);
	flow_fixture_release(&fx);
}

static void test_kernels_bf16_layernorm_backward_matches_torch(void **state)
{
	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++)
		for (size_t c = 0; c < ARRAY_SIZE(layernorm_fixtures); c++)
			for (size_t r = 0; r < ARRAY_SIZE(grad_runs); r++)
				layernorm_backward_run(host_sets[s],
						       layernorm_fixtures[c],
						       grad_runs[r]);
}

/* ---- gelu ------------------------------------------------------------------*/

static void test_kernels_bf16_gelu_matches_torch(void **state)
{
	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		const flow_kernels_t *k = host_sets[s];
		const char *name = "gelu_bf16";
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		size_t n = (size_t)fixture_dims(&fx, 1)[0];
		flow_bf16_t *inp = bf16_from(name, "inp", F32(&fx, "inp", n),
					     n);
		flow_bf16_t *dout = bf16_from(name, "dout",
					      F32(&fx, "dout", n), n);
		flow_bf16_t *out = bf16_garbage(n);

		k->gelu_bf16_forward(out, inp, n);
		check_bf16(k->name, name, "out", out, F32(&fx, "out", n), n,
			   ATOL_GELU);
		for (int acc = 0; acc < 2; acc++) {
			grad16_t dinp = grad16_new(&fx, name, "dinp", n, acc,
						   true);
			k->gelu_bf16_backward(dinp.buf, inp, dout, n);
			grad16_check(k->name, &fx, name, &dinp, ATOL_GELU);
		}
		BUFS_FREE(inp, dout, out);
		flow_fixture_release(&fx);
	}
}

/* ---- residual --------------------------------------------------------------*/

/* out = a + b is one fp32 addition of exact operands, so out is the
 * fixture's bits; da += dout too.  db = bf16(db + dout) rounds once. */
static void test_kernels_bf16_residual_matches_torch(void **state)
{
	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		const flow_kernels_t *k = host_sets[s];
		const char *name = "residual_bf16";
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		size_t n = (size_t)fixture_dims(&fx, 1)[0];
		const float *dout = F32(&fx, "dout", n);
		flow_bf16_t *b = bf16_from(name, "b", F32(&fx, "b", n), n);
		float *out = f32_start(n, 9.0f);

		k->residual_bf16_forward(out, F32(&fx, "a", n), b, n);
		check_same(k->name, name, "out", out, F32(&fx, "out", n),
			   n * sizeof(float));
		for (size_t r = 0; r < ARRAY_SIZE(grad_runs); r++) {
			grad_run_t run = grad_runs[r];
			grad32_t da = grad32_new("da", n, run.acc,
						 run.want & WANT_0);
			grad16_t db = grad16_new(&fx, name, "db", n, run.acc,
						 run.want & WANT_1);
			float *e = f32_copy(da.start, n);

			k->residual_bf16_backward(grad32_arg(&da),
						  grad16_arg(&db), dout, n);
			for (size_t i = 0; i < n; i++)
				e[i] += dout[i];
			check_same(k->name, name, "da", da.buf,
				   da.wanted ? e : da.start,
				   n * sizeof(float));
			grad16_check(k->name, &fx, name, &db,
				     ATOL_ELEMENTWISE);
			BUFS_FREE(da.buf, da.start, e);
		}
		BUFS_FREE(b, out);
		flow_fixture_release(&fx);
	}
}

/* ---- cross-entropy ---------------------------------------------------------*/

static const char *const ce_fixtures[] = {
	"cross_entropy_bf16_small", "cross_entropy_bf16_wide"
};

/* The padding columns and the ignored rows hold a zero gradient, ignored
 * rows a zero loss. */
static void cross_entropy_zeros(const char *set, const char *name,
				const float *losses, const float *dlogits,
				const int32_t *tg, size_t n, size_t V,
				size_t Vp)
{
	for (size_t r = 0; r < n; r++) {
		for (size_t j = 0; j < Vp; j++)
			if ((j >= V || tg[r] < 0) &&
			    dlogits[r * Vp + j] != 0.0f)
				fail_msg("%s %s: dlogits[%zu,%zu] = %g, not 0",
					 set, name, r, j,
					 (double)dlogits[r * Vp + j]);
		if (tg[r] < 0 && losses[r] != 0.0f)
			fail_msg("%s %s: ignored row %zu has loss %g", set,
				 name, r, (double)losses[r]);
	}
}

static void test_kernels_bf16_cross_entropy_matches_torch(void **state)
{
	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		const flow_kernels_t *k = host_sets[s];
		for (size_t c = 0; c < ARRAY_SIZE(ce_fixtures); c++) {
			const char *name = ce_fixtures[c];
			flow_fixture_t fx = { 0 };
			fixture_load(&fx, name);
			const int32_t *d = fixture_dims(&fx, 3);
			size_t n = (size_t)d[0], V = (size_t)d[1],
			       Vp = (size_t)d[2];
			const int32_t *tg = I32(&fx, "targets", n);
			flow_bf16_t *logits = bf16_from(
				name, "logits", F32(&fx, "logits", n, Vp),
				n * Vp);
			float *losses = f32_start(n, 9.0f);

			k->cross_entropy_bf16_forward_backward(
				losses, logits, tg, n, V, Vp,
				fixture_scalar(&fx, "dloss"));
			/* A loss is log(sum exp) - x_t: O(10) terms. */
			check_f32(k->name, name, "losses", losses,
				  F32(&fx, "losses", n), n, ATOL_SUM, RTOL);
			check_bf16(k->name, name, "dlogits", logits,
				   F32(&fx, "dlogits", n, Vp), n * Vp,
				   ATOL_PROB);
			float *dl = widen(logits, n * Vp);
			cross_entropy_zeros(k->name, name, losses, dl, tg, n, V,
					    Vp);
			BUFS_FREE(logits, losses, dl);
			flow_fixture_release(&fx);
		}
	}
}

/* The three split steps over 3 column shards of the bf16 logits, the
 * group's gather and sum done here in member order (as test_kernels.c
 * does for fp32), meet the whole rows' expectations at the same
 * tolerances. */
static void test_kernels_bf16_cross_entropy_split_matches_torch(void **state)
{
	enum { P = 3 };

	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		const flow_kernels_t *k = host_sets[s];
		for (size_t c = 0; c < ARRAY_SIZE(ce_fixtures); c++) {
			const char *name = ce_fixtures[c];
			flow_fixture_t fx = { 0 };
			fixture_load(&fx, name);
			const int32_t *d = fixture_dims(&fx, 3);
			size_t n = (size_t)d[0], V = (size_t)d[1],
			       Vp = (size_t)d[2];
			const int32_t *tg = I32(&fx, "targets", n);
			flow_bf16_t *logits = bf16_from(
				name, "logits", F32(&fx, "logits", n, Vp),
				n * Vp);
			const float *ref = F32(&fx, "dlogits", n, Vp);
			float dloss = fixture_scalar(&fx, "dloss");
			/* The last shard narrower. */
			size_t w = (Vp + P - 1) / P;
			float *gathered = f32_start(P * n, 9.0f);
			float *max = f32_start(n, 9.0f);
			float *sums = f32_start(n, 0.0f);
			float *part = f32_start(n, 9.0f);
			float *losses = f32_start(n, 0.0f);
			flow_bf16_t *shard[P];
			flow_logits_shard_t sh[P];

			for (size_t q = 0; q < P; q++) {
				size_t c0 = q * w,
				       cols = Vp - c0 < w ? Vp - c0 : w;
				sh[q] = (flow_logits_shard_t){
					.n = n, .cols = cols,
					.c0 = (int64_t)c0,
					.valid = V <= c0 ? 0 :
						 V - c0 < cols ? V - c0 : cols,
					.first = q == 0 };
				shard[q] = bf16_new(n * cols);
				for (size_t r = 0; r < n; r++)
					memcpy(shard[q] + r * cols,
					       logits + r * Vp + c0,
					       cols * sizeof(flow_bf16_t));
				k->cross_entropy_bf16_split_max(
					gathered + q * n, shard[q], &sh[q]);
			}
			for (size_t q = 0; q < P; q++) { /* the all-reduce */
				k->cross_entropy_bf16_split_sums(
					part, max, gathered, P, shard[q],
					&sh[q]);
				for (size_t r = 0; r < n; r++)
					sums[r] += part[r];
			}
			for (size_t q = 0; q < P; q++) {
				size_t cols = sh[q].cols;
				flow_bf16_t *g = bf16_new(n * cols);
				float *want = f32_new(n * cols);
				k->cross_entropy_bf16_split_finish(
					part, shard[q], tg, max, sums, &sh[q],
					dloss);
				for (size_t r = 0; r < n; r++) {
					losses[r] += part[r];
					memcpy(g + r * cols,
					       shard[q] + r * cols,
					       cols * sizeof(flow_bf16_t));
					memcpy(want + r * cols,
					       ref + r * Vp + sh[q].c0,
					       cols * sizeof(float));
				}
				check_bf16(k->name, name, "dlogits shard", g,
					   want, n * cols, ATOL_PROB);
				BUFS_FREE(g, want, shard[q]);
			}
			check_f32(k->name, name, "losses (split)", losses,
				  F32(&fx, "losses", n), n, ATOL_SUM, RTOL);
			BUFS_FREE(logits, gathered, max, sums, part, losses);
			flow_fixture_release(&fx);
		}
	}
}

/* ---- attention -------------------------------------------------------------*/

static const char *const attention_fixtures[] = {
	"attention_bf16_small", "attention_bf16_t1", "attention_bf16_odd",
	"attention_bf16_hs7", "attention_bf16_t64"
};

/* Scratch of set k for either bf16 pass, filled with garbage that must
 * not matter. */
static void *attention_scratch(const flow_kernels_t *k, size_t B, size_t T,
			       size_t C, size_t NH)
{
	size_t bytes = k->attention_scratch_bound(B, T, C, NH, true);
	void *p = mem_new(bytes);

	memset(p, 0xA5, bytes);
	return p;
}

static void test_kernels_bf16_attention_forward_matches_torch(void **state)
{
	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		const flow_kernels_t *k = host_sets[s];
		for (size_t c = 0; c < ARRAY_SIZE(attention_fixtures); c++) {
			const char *name = attention_fixtures[c];
			flow_fixture_t fx = { 0 };
			fixture_load(&fx, name);
			const int32_t *d = fixture_dims(&fx, 4);
			size_t B = (size_t)d[0], T = (size_t)d[1],
			       C = (size_t)d[2], NH = (size_t)d[3];
			flow_bf16_t *qkv = bf16_from(
				name, "qkv", F32(&fx, "qkv", B, T, 3 * C),
				B * T * 3 * C);
			flow_bf16_t *out = bf16_garbage(B * T * C);
			float *lse = f32_start(B * NH * T, 9.0f);
			void *scratch = attention_scratch(k, B, T, C, NH);

			k->attention_bf16_forward(out, lse, scratch, qkv, B, T,
						  C, NH);
			check_f32(k->name, name, "lse", lse,
				  F32(&fx, "lse", B, NH, T), B * NH * T,
				  ATOL_SUM, RTOL);
			check_bf16(k->name, name, "out", out,
				   F32(&fx, "out", B, T, C), B * T * C,
				   ATOL_SUM);
			BUFS_FREE(qkv, out, lse, scratch);
			flow_fixture_release(&fx);
		}
	}
}

/* own: lse and out from the set's forward pass, else the fixture's. */
static void attention_backward_run(const flow_kernels_t *k, const char *name,
				   bool acc, bool own)
{
	flow_fixture_t fx = { 0 };
	fixture_load(&fx, name);
	const int32_t *d = fixture_dims(&fx, 4);
	size_t B = (size_t)d[0], T = (size_t)d[1], C = (size_t)d[2],
	       NH = (size_t)d[3];
	flow_bf16_t *qkv = bf16_from(name, "qkv", F32(&fx, "qkv", B, T, 3 * C),
				     B * T * 3 * C);
	flow_bf16_t *dout = bf16_from(name, "dout", F32(&fx, "dout", B, T, C),
				      B * T * C);
	flow_bf16_t *out = bf16_from(name, "out", F32(&fx, "out", B, T, C),
				     B * T * C);
	float *lse = f32_copy(F32(&fx, "lse", B, NH, T), B * NH * T);
	grad16_t dqkv = grad16_new(&fx, name, "dqkv", B * T * 3 * C, acc,
				   true);
	void *scratch = attention_scratch(k, B, T, C, NH);

	if (own)
		k->attention_bf16_forward(out, lse, scratch, qkv, B, T, C, NH);
	k->attention_bf16_backward(dqkv.buf, scratch, dout, qkv, lse, out, B,
				   T, C, NH);
	grad16_check(k->name, &fx, name, &dqkv, ATOL_SUM);
	BUFS_FREE(qkv, dout, out, lse, scratch);
	flow_fixture_release(&fx);
}

static void test_kernels_bf16_attention_backward_matches_torch(void **state)
{
	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		for (size_t c = 0; c < ARRAY_SIZE(attention_fixtures); c++) {
			const char *name = attention_fixtures[c];
			const flow_kernels_t *k = host_sets[s];
			attention_backward_run(k, name, false, false);
			attention_backward_run(k, name, true, false);
			attention_backward_run(k, name, true, true);
		}
	}
}

/* ---- the fused pairs are the unfused kernels in turn -----------------------*/

/* n values drawn from N(mean, std) and rounded to bf16. */
static flow_bf16_t *bf16_normal(size_t n, uint64_t seed, uint64_t stream,
				float mean, float std)
{
	float *x = f32_new(n);
	flow_bf16_t *h = bf16_new(n);

	flow_rng_fill_normal(x, n, seed, stream, 0, mean, std);
	for (size_t i = 0; i < n; i++)
		h[i] = flow_bf16_narrow(x[i]);
	flow_free(x);
	return h;
}

static float *f32_normal(size_t n, uint64_t seed, uint64_t stream,
			 float mean, float std)
{
	float *x = f32_new(n);

	flow_rng_fill_normal(x, n, seed, stream, 0, mean, std);
	return x;
}

static void *mem_dup(const void *p, size_t bytes)
{
	void *q = mem_new(bytes);

	memcpy(q, p, bytes);
	return q;
}

#define SAME(set, what, a, b, bytes)                                       \
	check_same(set, "fused", what, a, b, bytes)

/* The backward pair: layernorm_bf16_backward into dres (holding the rest
 * of the stream's gradient), then residual_bf16_backward of dres into da
 * (fp32) and db (bf16), each accumulating from nonzero values and each
 * optional. */
static void layernorm_residual_check(const flow_kernels_t *k, size_t n,
				     size_t C, const float *res,
				     const float *w, const float *m,
				     const float *rs)
{
	size_t nc = n * C;
	flow_bf16_t *dout = bf16_normal(nc, 6, 1, 0.0f, 1.0f);
	flow_bf16_t *db = bf16_normal(nc, 6, 4, 0.0f, 1.0f);
	float *dres = f32_normal(nc, 6, 2, 0.0f, 1.0f);
	float *da = f32_normal(nc, 6, 3, 0.0f, 1.0f);
	float *dw = f32_start(C, 0.5f), *dbias = f32_start(C, -0.5f);
	flow_bf16_t *db1 = mem_dup(db, nc * sizeof(*db));
	float *dres1 = mem_dup(dres, nc * sizeof(float));
	float *da1 = mem_dup(da, nc * sizeof(float));
	float *dw1 = mem_dup(dw, C * sizeof(float));
	float *dbias1 = mem_dup(dbias, C * sizeof(float));

	for (int skip = 0; skip < 3; skip++) { /* both, no da, no db */
		float *a = skip == 1 ? NULL : da;
		flow_bf16_t *b = skip == 2 ? NULL : db;
		k->layernorm_residual_bf16_backward(dres, a, b, dw, dbias, dout,
						    res, w, m, rs, n, C);
		k->layernorm_bf16_backward(dres1, dw1, dbias1, dout, res, w, m,
					   rs, n, C);
		k->residual_bf16_backward(a ? da1 : NULL, b ? db1 : NULL, dres1,
					  nc);
		SAME(k->name, "dres", dres, dres1, nc * sizeof(float));
		SAME(k->name, "da", da, da1, nc * sizeof(float));
		SAME(k->name, "db", db, db1, nc * sizeof(*db));
		SAME(k->name, "dweight", dw, dw1, C * sizeof(float));
		SAME(k->name, "dbias", dbias, dbias1, C * sizeof(float));
	}
	BUFS_FREE(dout, db, dres, da, dw, dbias, db1, dres1, da1, dw1, dbias1);
}

/* residual_layernorm_bf16_forward and layernorm_residual_bf16_backward
 * give the bits of their kernels in turn, for widths within one simd
 * block, odd ones and GPT-2's, with a residual stream far from zero
 * mean, in each host set. */
static void test_kernels_bf16_residual_layernorm_is_the_unfused_pair(
	void **state)
{
	static const size_t widths[] = { 1, 37, 768 };

	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		const flow_kernels_t *k = host_sets[s];
		for (size_t wi = 0; wi < ARRAY_SIZE(widths); wi++) {
			size_t n = 130, C = widths[wi], nc = n * C;
			float *a = f32_normal(nc, 5, 1, 3.0f, 1.0f);
			flow_bf16_t *b = bf16_normal(nc, 5, 2, 0.0f, 0.1f);
			float *w = f32_normal(C, 5, 3, 1.0f, 0.2f);
			float *bias = f32_normal(C, 5, 4, 0.0f, 0.2f);
			float *res = f32_new(nc), *res1 = f32_new(nc);
			flow_bf16_t *out = bf16_new(nc), *out1 = bf16_new(nc);
			float *m = f32_new(n), *rs = f32_new(n);
			float *m1 = f32_new(n), *rs1 = f32_new(n);

			k->residual_layernorm_bf16_forward(res, out, m, rs, a,
							   b, w, bias, n, C);
			k->residual_bf16_forward(res1, a, b, nc);
			k->layernorm_bf16_forward(out1, m1, rs1, res1, w, bias,
						  n, C);
			SAME(k->name, "res", res, res1, nc * sizeof(float));
			SAME(k->name, "out", out, out1, nc * sizeof(*out));
			SAME(k->name, "mean", m, m1, n * sizeof(float));
			SAME(k->name, "rstd", rs, rs1, n * sizeof(float));
			layernorm_residual_check(k, n, C, res, w, m, rs);
			BUFS_FREE(a, b, w, bias, res, res1, out, out1, m, rs,
				  m1, rs1);
		}
	}
}

/* matmul_gelu_bf16_forward is matmul_bf16_forward then gelu_bf16_forward
 * of the stored pre, bit for bit, on the host sets (kernels.h); pre spans
 * GELU's tail and its linear part, with and without bias. */
static void test_kernels_bf16_matmul_gelu_is_the_unfused_pair(void **state)
{
	const size_t n = 67, i = 40, o = 96;

	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(host_sets); s++) {
		const flow_kernels_t *k = host_sets[s];
		flow_bf16_t *inp = bf16_normal(n * i, 7, 1, 0.0f, 1.0f);
		float *w = f32_normal(o * i, 7, 2, 0.0f, 0.5f);
		float *bias = f32_normal(o, 7, 3, 0.0f, 1.0f);
		flow_bf16_t *pre = bf16_new(n * o), *out = bf16_new(n * o);
		flow_bf16_t *pre1 = bf16_new(n * o), *out1 = bf16_new(n * o);
		void *scratch = matmul_scratch(k, n, i, o);

		for (int with_bias = 0; with_bias < 2; with_bias++) {
			const float *b = with_bias ? bias : NULL;
			k->matmul_gelu_bf16_forward(pre, out, scratch, inp, w,
						    b, n, i, o);
			k->matmul_bf16_forward(pre1, scratch, inp, w, b, n, i,
					       o);
			k->gelu_bf16_forward(out1, pre1, n * o);
			SAME(k->name, "pre", pre, pre1, n * o * sizeof(*pre));
			SAME(k->name, "out", out, out1, n * o * sizeof(*out));
		}
		BUFS_FREE(inp, w, bias, pre, out, pre1, out1, scratch);
	}
}

/* ---- the fixtures tell bf16 from fp32 ------------------------------------ */

/* Elements of got (floats) that check_bf16 would not accept as equal to
 * the bf16 expectation ref: flipped or further. */
static size_t bf16_misses(const char *what, const float *got,
			  const float *ref, size_t n, double atol)
{
	bf16_count_t c = bf16_count(got, ref, n, atol);

	if (verbose())
		print_message("fp32 kernel, %s: %zu of %zu elements off the "
			      "bf16 expectation (%zu further than one ulp), "
			      "%zu allowed\n", what, c.flips + c.bad, n, c.bad,
			      (size_t)BF16_FLIPS_MAX(n));
	return c.flips + c.bad;
}

/* Off by far more than the tolerance: ten times the flips allowed. */
#define FAR_OFF(misses, n) ((misses) >= 10 * (size_t)BF16_FLIPS_MAX(n))

static float *narrowed(const float *x, size_t n)
{
	float *p = f32_new(n);

	for (size_t i = 0; i < n; i++)
		p[i] = flow_round_bf16(x[i]);
	return p;
}

/* The CPU set's fp32 matmul on the same inputs (bf16 values, exact in
 * fp32) misses the bf16 expectations: as it is (not a bf16 value), and
 * rounded only when stored, its weight unrounded (a twin that forgot to
 * round the weight).  And the accumulate rule: rounding the gradient
 * before adding it to dinp's start (two roundings) misses dinp_acc. */
static void test_kernels_bf16_matmul_differs_from_fp32(void **state)
{
	const char *name = "matmul_bf16_wide";
	flow_fixture_t fx = { 0 };

	(void)state;
	fixture_load(&fx, name);
	const int32_t *d = fixture_dims(&fx, 3);
	size_t n = (size_t)d[0], i = (size_t)d[1], o = (size_t)d[2];
	const float *inp = F32(&fx, "inp", n, i);
	const float *w = F32(&fx, "weight", o, i);
	const float *dout = F32(&fx, "dout", n, o);
	const float *start = F32(&fx, "dinp_start", n, i);
	const float *racc = F32(&fx, "dinp_acc", n, i);
	float *out = f32_new(n * o), *dinp = f32_start(n * i, 0.0f);

	flow_cpu_matmul_forward(out, inp, w, F32(&fx, "bias", o), n, i, o);
	float *out_r = narrowed(out, n * o);
	assert_true(FAR_OFF(bf16_misses("out", out, F32(&fx, "out", n, o),
					n * o, ATOL_SUM), n * o));
	assert_true(FAR_OFF(bf16_misses("out rounded once", out_r,
					F32(&fx, "out", n, o), n * o,
					ATOL_SUM), n * o));
	flow_cpu_matmul_backward(dinp, NULL, NULL, dout, inp, w, n, i, o);
	for (size_t e = 0; e < n * i; e++)
		dinp[e] = flow_round_bf16(start[e] + dinp[e]);
	assert_true(FAR_OFF(bf16_misses("dinp_acc rounded once", dinp, racc,
					n * i, ATOL_SUM), n * i));

	/* The bf16 twin from zeros, then added to the start and rounded:
	 * two roundings where the contract has one. */
	flow_bf16_t *hin = bf16_from(name, "inp", inp, n * i);
	flow_bf16_t *hdout = bf16_from(name, "dout", dout, n * o);
	flow_bf16_t *hdinp = bf16_new(n * i);
	void *scratch = matmul_scratch(&flow_cpu_kernels, n, i, o);
	memset(hdinp, 0, n * i * sizeof(*hdinp));
	flow_cpu_kernels.matmul_bf16_backward(hdinp, NULL, NULL, scratch,
					      hdout, hin, w, n, i, o);
	for (size_t e = 0; e < n * i; e++)
		dinp[e] = flow_round_bf16(start[e] + flow_bf16_widen(hdinp[e]));
	assert_true(FAR_OFF(bf16_misses("dinp_acc rounded twice", dinp, racc,
					n * i, ATOL_SUM), n * i));
	BUFS_FREE(out, out_r, dinp, hin, hdout, hdinp, scratch);
	flow_fixture_release(&fx);
}

/* The CPU set's fp32 attention on the same inputs, its out and dqkv
 * rounded when stored, misses: it multiplies by P and dpre unrounded. */
static void test_kernels_bf16_attention_differs_from_fp32(void **state)
{
	const char *name = "attention_bf16_t64";
	flow_fixture_t fx = { 0 };

	(void)state;
	fixture_load(&fx, name);
	const int32_t *d = fixture_dims(&fx, 4);
	size_t B = (size_t)d[0], T = (size_t)d[1], C = (size_t)d[2],
	       NH = (size_t)d[3], n = B * T * C;
	const float *qkv = F32(&fx, "qkv", B, T, 3 * C);
	float *out = f32_new(n), *lse = f32_new(B * NH * T);
	float *dqkv = f32_start(3 * n, 0.0f);
	void *scratch = mem_new(flow_cpu_attention_scratch_bound(B, T, C, NH,
								 false));

	flow_cpu_attention_forward(out, lse, scratch, qkv, B, T, C, NH);
	float *out_r = narrowed(out, n);
	assert_true(FAR_OFF(bf16_misses("attention out rounded once", out_r,
					F32(&fx, "out", B, T, C), n, ATOL_SUM),
			    n));
	flow_cpu_attention_backward(dqkv, scratch, F32(&fx, "dout", B, T, C),
				    qkv, lse, out, B, T, C, NH);
	float *dqkv_r = narrowed(dqkv, 3 * n);
	assert_true(FAR_OFF(bf16_misses("attention dqkv rounded once", dqkv_r,
					F32(&fx, "dqkv", B, T, 3 * C), 3 * n,
					ATOL_SUM),
			    3 * n));
	BUFS_FREE(out, lse, dqkv, scratch, out_r, dqkv_r);
	flow_fixture_release(&fx);
}

/* The other bf16 outputs have no rounding inside, only the stored one:
 * the fp32 kernels' unrounded results miss those expectations (all but
 * the elements within the fp32 floor of them), so the fixtures hold the
 * rounded values. */
static void test_kernels_bf16_outputs_are_rounded(void **state)
{
	flow_fixture_t fx = { 0 };

	(void)state;
	fixture_load(&fx, "layernorm_bf16_c768");
	size_t n = 4, C = 768;
	float *out = f32_new(n * C), *mean = f32_new(n), *rstd = f32_new(n);
	flow_cpu_layernorm_forward(out, mean, rstd, F32(&fx, "inp", n, C),
				   F32(&fx, "weight", C), F32(&fx, "bias", C),
				   n, C);
	assert_true(FAR_OFF(bf16_misses("layernorm out", out,
					F32(&fx, "out", n, C), n * C,
					ATOL_SUM),
			    n * C));
	BUFS_FREE(out, mean, rstd);
	flow_fixture_release(&fx);

	fixture_load(&fx, "gelu_bf16");
	n = (size_t)fixture_dims(&fx, 1)[0];
	out = f32_new(n);
	flow_cpu_gelu_forward(out, F32(&fx, "inp", n), n);
	assert_true(FAR_OFF(bf16_misses("gelu out", out, F32(&fx, "out", n), n,
					ATOL_GELU),
			    n));
	flow_free(out);
	flow_fixture_release(&fx);

	fixture_load(&fx, "cross_entropy_bf16_wide");
	const int32_t *d = fixture_dims(&fx, 3);
	size_t rows = (size_t)d[0], V = (size_t)d[1], Vp = (size_t)d[2];
	float *logits = f32_copy(F32(&fx, "logits", rows, Vp), rows * Vp);
	float *losses = f32_new(rows);
	flow_cpu_cross_entropy_forward_backward(
		losses, logits, I32(&fx, "targets", rows), rows, V, Vp,
		fixture_scalar(&fx, "dloss"));
	/* Most of the 1000 columns' gradients are within ATOL_PROB of 0;
	 * still more than 10 times the flips allowed miss. */
	assert_true(FAR_OFF(bf16_misses("cross-entropy dlogits", logits,
					F32(&fx, "dlogits", rows, Vp),
					rows * Vp, ATOL_PROB),
			    rows * Vp));
	BUFS_FREE(logits, losses);
	flow_fixture_release(&fx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kernels_bf16_matmul_forward_matches_torch),
		cmocka_unit_test(test_kernels_bf16_matmul_backward_matches_torch),
		cmocka_unit_test(test_kernels_bf16_matmul_gelu_matches_torch),
		cmocka_unit_test(test_kernels_bf16_layernorm_forward_matches_torch),
		cmocka_unit_test(test_kernels_bf16_layernorm_backward_matches_torch),
		cmocka_unit_test(test_kernels_bf16_gelu_matches_torch),
		cmocka_unit_test(test_kernels_bf16_residual_matches_torch),
		cmocka_unit_test(test_kernels_bf16_cross_entropy_matches_torch),
		cmocka_unit_test(test_kernels_bf16_cross_entropy_split_matches_torch),
		cmocka_unit_test(test_kernels_bf16_attention_forward_matches_torch),
		cmocka_unit_test(test_kernels_bf16_attention_backward_matches_torch),
		cmocka_unit_test(test_kernels_bf16_residual_layernorm_is_the_unfused_pair),
		cmocka_unit_test(test_kernels_bf16_matmul_gelu_is_the_unfused_pair),
		cmocka_unit_test(test_kernels_bf16_matmul_differs_from_fp32),
		cmocka_unit_test(test_kernels_bf16_attention_differs_from_fp32),
		cmocka_unit_test(test_kernels_bf16_outputs_are_rounded),
	};

	return cmocka_run_group_tests(tests, NULL, NULL) ? EXIT_FAILURE :
							   EXIT_SUCCESS;
}
