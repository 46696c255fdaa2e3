/* The CPU kernels (lib/kernels/cpu/) against PyTorch: every forward and
 * backward kernel is run on the fixtures that tests/ref/gen_kernels.py
 * wrote, and compared element by element with |got - ref| <= atol +
 * rtol*|ref|.  Also checks the backward contract of kernels.h: gradients
 * accumulate (+=) into what the buffer already holds, and an optional
 * gradient passed as NULL is skipped without touching the others. */
#include <config.h>

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <flow/kernels.h>
#include <flow/kernels_ref.h>
#include <flow/mem.h>
#include <flow/rng.h>
#include <flow/tensor.h>

#include "fixture_assert.h"
#include "testutil.h"

/* ---- tolerances ------------------------------------------------------------
 * The references are float64 results rounded to float32 (AdamW and clipping:
 * PyTorch's own float32 arithmetic), so the error measured is the kernel's
 * own float32 rounding.  RTOL is the house default; an ATOL is needed
 * wherever a result is a sum whose terms cancel (a dot product, a gradient
 * summed over rows), because then |ref| can be far smaller than the terms and
 * no relative bound holds.  Each ATOL below is sized from the magnitude of
 * the terms of the longest sum in these fixtures.  FLOW_TEST_VERBOSE=1
 * prints each comparison's worst error as a fraction of its tolerance:
 * <= 0.3 except AdamW m (0.67, see adamw_run) and GELU dinp (0.4). */
#define RTOL 1e-5
/* Elementwise ops (residual, embedding forward, clipping): no cancelling
 * sums; only results within a few ulps of 0 need this floor. */
#define ATOL_ELEMENTWISE 1e-7
/* GELU: where tanh(u) -> -1 (x in -6..-3), 1 + tanhf(u) and
 * 1 - tanhf(u)^2 keep only the absolute precision of float near 1 (~1e-7);
 * the forward scales that by 0.5|x| <= 3, the derivative by
 * 0.5|x| * sqrt(2/pi)(1 + 3*0.044715 x^2) <= ~14, so results of 1e-5..1e-7
 * are good to ~1.7e-6 absolute at worst -- in PyTorch's float32 kernel,
 * which uses the same formula, as much as here. */
#define ATOL_GELU 2e-6
/* Sums of <= 130 terms of size ~1 (matmul K <= 96, embedding and layernorm
 * parameter gradients over <= 130 rows, attention over T <= 64 positions):
 * float rounding accumulates to ~sqrt(K)*eps*|terms|, i.e. a few 1e-6 at
 * worst. */
#define ATOL_SUM 1e-5
/* Softmax probabilities and their gradient: values are in [0, 1], tiny
 * probabilities exp(-30) are fine to 1e-9 absolute, and the row sums of the
 * loss are O(10). */
#define ATOL_PROB 1e-8

/* ---- helpers ---------------------------------------------------------------*/

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
static float *buf_new(size_t n)
{
	float *p = flow_alloc(n * sizeof(float));

	assert_non_null(p);
	return p;
}

static float *buf_copy(const float *src, size_t n)
{
	float *p = buf_new(n);

	memcpy(p, src, n * sizeof(float));
	return p;
}

/* A gradient buffer's starting content: zeros, or (fill != 0) a fixed
 * nonzero pattern, to prove the kernels add to it. */
static float *buf_start(size_t n, float fill)
{
	float *p = buf_new(n);

	for (size_t i = 0; i < n; i++)
		p[i] = fill * (float)((int)(i % 7) - 3) / 3.0f;
	return p;
}

/* What a gradient buffer started with buf_start(n, fill) must hold after
 * the kernel added ref to it. */
static float *buf_expect(const float *ref, size_t n, float fill)
{
	float *p = buf_start(n, fill);

	for (size_t i = 0; i < n; i++)
		p[i] += ref[i];
	return p;
}

/* Elements of got off ref by more than atol + rtol*|ref| (NaN too), the
 * first of them at *first; FLOW_TEST_VERBOSE=1 prints the worst. */
static size_t count_off(const char *fixture, const char *what,
			const float *got, const float *ref, size_t n,
			double atol, double rtol, size_t *first)
{
	size_t bad = 0, wi = 0;
	double worst = 0.0; /* max of |err| / (atol + rtol*|ref|) */

	for (size_t i = 0; i < n; i++) {
		double err = fabs((double)got[i] - (double)ref[i]);
		double lim = atol + rtol * fabs((double)ref[i]);
		if (!(err <= lim)) { /* also catches NaN */
			if (bad++ == 0)
				*first = i;
		}
		if (err / lim > worst) {
			worst = err / lim;
			wi = i;
		}
	}
	if (getenv("FLOW_TEST_VERBOSE"))
		print_message("%s %s: worst error %.3g of the tolerance "
			      "([%zu] got %.9g want %.9g)\n", fixture, what,
			      worst, wi, n ? (double)got[wi] : 0.0,
			      n ? (double)ref[wi] : 0.0);
	return bad;
}

static void check_close(const char *fixture, const char *what,
			const float *got, const float *ref, size_t n,
			double atol, double rtol)
{
	size_t first = 0, bad = count_off(fixture, what, got, ref, n, atol,
					  rtol, &first);
	if (bad)
		fail_msg("%s %s: %zu of %zu elements off; first [%zu] got "
			 "%.9g want %.9g (atol %g rtol %g)", fixture, what,
			 bad, n, first, (double)got[first],
			 (double)ref[first], atol, rtol);
}

/* Where a bf16 rounding may flip: within atol, rtol everywhere but at
 * most 1% of the elements (and one), which may be off by a flipped
 * operand's 2^-8 of their terms (BF16_FLIP_ATOL, BF16_FLIP_RTOL).  An
 * operand left unrounded or rounded twice moves nearly every element. */
#define BF16_FLIP_ATOL 1e-3
#define BF16_FLIP_RTOL 1e-2
static void check_close_bf16(const char *fixture, const char *what,
			     const float *got, const float *ref, size_t n,
			     double atol, double rtol)
{
	size_t first = 0, wild = count_off(fixture, what, got, ref, n,
					   BF16_FLIP_ATOL, BF16_FLIP_RTOL,
					   &first);
	size_t bad = count_off(fixture, what, got, ref, n, atol, rtol, &first);

	if (wild || bad > n / 100 + 1)
		fail_msg("%s %s: %zu of %zu elements off, %zu past a bf16 "
			 "flip; first [%zu] got %.9g want %.9g (atol %g rtol "
			 "%g)", fixture, what, bad, n, wild, first,
			 (double)got[first], (double)ref[first], atol, rtol);
}

static void check_same(const char *fixture, const char *what,
		       const float *got, const float *want, size_t n)
{
	if (memcmp(got, want, n * sizeof(float)) != 0)
		fail_msg("%s %s: changed but must not", fixture, what);
}

/* Which optional gradients a backward run asks for. */
enum { WANT_0 = 1, WANT_1 = 2, WANT_2 = 4, WANT_ALL = 7 };

/* One gradient a backward kernel may be asked for: its buffer, started with
 * buf_start(n, fill), an untouched copy of that start, and the fixture
 * array (of the same name) that holds what the kernel must add. */
typedef struct {
	const char *what;
	size_t ndim, dims[4], n;
	float fill;
	bool wanted;
	float *buf, *start;
} grad_t;

static grad_t grad_new(const char *what, float fill, bool wanted,
		       size_t ndim, const size_t *dims)
{
	grad_t g = { .what = what, .ndim = ndim, .n = 1, .fill = fill,
		     .wanted = wanted };

	assert_true(ndim <= sizeof(g.dims) / sizeof(g.dims[0]));
	for (size_t k = 0; k < ndim; k++) {
		g.dims[k] = dims[k];
		g.n *= dims[k];
	}
	g.buf = buf_start(g.n, fill);
	g.start = buf_copy(g.buf, g.n);
	return g;
}

/* GRAD("dweight", fill, wanted, d0, d1, ...): a gradient of that shape. */
#define GRAD(what, fill, wanted, ...)                                      \
	grad_new(what, fill, wanted, NDIMS(__VA_ARGS__),                   \
		 (size_t[]){ __VA_ARGS__ })

/* The kernel's argument: the buffer, or NULL when it is not wanted. */
static float *grad_arg(const grad_t *g)
{
	return g->wanted ? g->buf : NULL;
}

/* A wanted gradient must hold its start plus the fixture's gradient, to
 * atol + rtol*|ref|; one not wanted must still hold its start, bit for
 * bit. */
static void grad_check(const flow_fixture_t *fx, const char *fixture,
		       const grad_t *g, double atol, double rtol)
{
	if (g->wanted) {
		const float *ref = fixture_need(fx, g->what, FLOW_FIXTURE_F32,
						g->ndim, g->dims);
		float *e = buf_expect(ref, g->n, g->fill);

		check_close(fixture, g->what, g->buf, e, g->n, atol, rtol);
		flow_free(e);
	} else {
		check_same(fixture, g->what, g->buf, g->start, g->n);
	}
}

static void grad_release(grad_t *g)
{
	BUFS_FREE(g->buf, g->start);
	g->buf = g->start = NULL;
}

/* ---- fixture reader ----------------------------------------------------------*/

static void write_bytes(const char *path, const unsigned char *p, size_t n)
{
	FILE *f = fopen(path, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(p, 1, n, f), n);
	assert_int_equal(fclose(f), 0);
}

static void test_kernels_fixture_rejects_corrupt_files(void **state)
{
	const char *top = getenv("top_srcdir");
	char src[4096], tmp[] = "/tmp/flow-fixture-XXXXXX";
	unsigned char buf[4096];
	size_t n;
	flow_fixture_t fx = { 0 };
	flow_diag_t diag = FLOW_DIAG_INIT;
	FILE *f;
	int fd;

	(void)state;
	snprintf(src, sizeof(src), "%s/tests/ref/fixtures/residual.bin",
		 top && *top ? top : ".");
	f = fopen(src, "rb");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	assert_true(n > 32 && n < sizeof(buf));
	fd = mkstemp(tmp);
	assert_true(fd >= 0);

	/* Intact: reads, finds arrays, checks shapes. */
	write_bytes(tmp, buf, n);
	assert_int_equal(flow_fixture_read(&fx, tmp, &diag), FLOW_OK);
	assert_non_null(flow_fixture_find(&fx, "dout"));
	assert_null(flow_fixture_find(&fx, "nonesuch"));
	assert_null(flow_fixture_get(&fx, "dout", FLOW_FIXTURE_F32, 1,
				     (size_t[]){ 36 }, &diag));
	assert_null(flow_fixture_get(&fx, "dout", FLOW_FIXTURE_I32, 1,
				     (size_t[]){ 37 }, &diag));
	flow_fixture_release(&fx);
	flow_fixture_release(&fx);

	/* One flipped payload bit: the CRC catches it. */
	buf[n / 2] ^= 0x10;
	write_bytes(tmp, buf, n);
	flow_diag_clear(&diag);
	assert_int_equal(flow_fixture_read(&fx, tmp, &diag),
			 FLOW_ERR_CHECKSUM);
	buf[n / 2] ^= 0x10;

	/* Truncated: the CRC is now read from the payload. */
	write_bytes(tmp, buf, n - 9);
	flow_diag_clear(&diag);
	assert_true(flow_fixture_read(&fx, tmp, &diag) < 0);

	/* Wrong magic. */
	buf[0] = 'X';
	write_bytes(tmp, buf, n);
	flow_diag_clear(&diag);
	assert_int_equal(flow_fixture_read(&fx, tmp, &diag), FLOW_ERR_FORMAT);
	assert_non_null(strstr(flow_diag_message(&diag), "offset 0"));

	close(fd);
	unlink(tmp);
	flow_diag_clear(&diag);
	assert_int_equal(flow_fixture_read(&fx, tmp, &diag), FLOW_ERR_IO);
}

/* ---- matmul ------------------------------------------------------------------*/

static const char *const matmul_fixtures[] = { "matmul_small", "matmul_row1",
					       "matmul_nobias",
					       "matmul_wide" };
/* Which matmul fixtures a run checks against which kernel set. */
typedef struct {
	const flow_kernels_t *set;
	const char *const *fixtures;
	size_t nfixtures;
} matmul_variant_t;

static const matmul_variant_t matmul_fp32 = {
	&flow_cpu_kernels, matmul_fixtures, ARRAY_SIZE(matmul_fixtures)
};

static void matmul_forward_run(const matmul_variant_t *v)
{
	for (size_t c = 0; c < v->nfixtures; c++) {
		const char *name = v->fixtures[c];
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		const int32_t *d = fixture_dims(&fx, 3);
		size_t n = (size_t)d[0], i = (size_t)d[1], o = (size_t)d[2];
		const float *bias = flow_fixture_find(&fx, "bias") ?
					    F32(&fx, "bias", o) : NULL;
		float *out = buf_start(n * o, 9.0f); /* overwritten */

		v->set->matmul_forward(out, F32(&fx, "inp", n, i),
				       F32(&fx, "weight", o, i), bias, n, i, o);
		check_close(name, "out", out, F32(&fx, "out", n, o), n * o,
			    ATOL_SUM, RTOL);
		flow_free(out);
		flow_fixture_release(&fx);
	}
}

static void test_kernels_matmul_forward_matches_torch(void **state)
{
	(void)state;
	matmul_forward_run(&matmul_fp32);
}

static void matmul_backward_run(const matmul_variant_t *v, float fill,
				unsigned want)
{
	for (size_t c = 0; c < v->nfixtures; c++) {
		const char *name = v->fixtures[c];
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		const int32_t *d = fixture_dims(&fx, 3);
		size_t n = (size_t)d[0], i = (size_t)d[1], o = (size_t)d[2];
		bool has_bias = flow_fixture_find(&fx, "bias") != NULL;
		grad_t dinp = GRAD("dinp", fill, want & WANT_0, n, i);
		grad_t dw = GRAD("dweight", fill, want & WANT_1, o, i);
		grad_t db = GRAD("dbias", fill, has_bias && (want & WANT_2), o);
		const float *dout = F32(&fx, "dout", n, o);
		const float *inp = F32(&fx, "inp", n, i);
		const float *w = F32(&fx, "weight", o, i);

		v->set->matmul_backward(grad_arg(&dinp), grad_arg(&dw),
					grad_arg(&db), dout, inp, w, n, i, o);
		grad_check(&fx, name, &dinp, ATOL_SUM, RTOL);
		grad_check(&fx, name, &dw, ATOL_SUM, RTOL);
		grad_check(&fx, name, &db, ATOL_SUM, RTOL);
		grad_release(&dinp);
		grad_release(&dw);
		grad_release(&db);
		flow_fixture_release(&fx);
	}
}

static void test_kernels_matmul_backward_matches_torch(void **state)
{
	(void)state;
	matmul_backward_run(&matmul_fp32, 0.0f, WANT_ALL);
}

static void test_kernels_matmul_backward_accumulates(void **state)
{
	(void)state;
	matmul_backward_run(&matmul_fp32, 0.75f, WANT_ALL);
}

static void test_kernels_matmul_backward_null_grads(void **state)
{
	(void)state;
	matmul_backward_run(&matmul_fp32, 0.5f, WANT_0);
	matmul_backward_run(&matmul_fp32, 0.5f, WANT_1);
	matmul_backward_run(&matmul_fp32, 0.5f, WANT_2);
}

/* No inputs (in_dim 0): the output is the bias, so the bias still has a
 * gradient, the column sums of dout, in both sets (as in the CUDA set). */
static void test_kernels_matmul_backward_without_inputs(void **state)
{
	const float dout[2 * 3] = { 1, 2, 3, 4, 5, 6 };
	const flow_kernels_t *sets[] = { &flow_cpu_kernels, &flow_ref_kernels };

	(void)state;
	for (size_t s = 0; s < 2; s++) {
		float dbias[3] = { 0.5f, 0.5f, 0.5f }, nothing[1] = { 7.0f };
		sets[s]->matmul_backward(nothing, nothing, dbias, dout, nothing,
					 nothing, 2, 0, 3);
		assert_true(dbias[0] == 5.5f && dbias[1] == 7.5f &&
			    dbias[2] == 9.5f);
		assert_true(nothing[0] == 7.0f); /* no dinp nor dweight */
	}
}

/* The bf16 twin with rows in more than one panel
 * (flow_matmul_bf16_panel_rows) against the fp32 kernel in one pass on the
 * same values (the bf16 activations widened, the weight rounded to bf16),
 * its bf16 outputs rounded here.  The panels change only how the BLAS may
 * block the fp32 sums, so a bf16 output may round the other way where its
 * sum straddles a rounding boundary (check_close_bf16), and dweight's fp32
 * sums are grouped by panel. */
static void test_kernels_matmul_bf16_panels(void **state)
{
	(void)state;
	/* 2 in + out = 60032 wide: the CPU set's 2^24-element panels hold
	 * 279 rows, so its scratch (the weight and one panel) is for 2
	 * panels. */
	const size_t n = 300, i = 16, o = 60000;
	assert_int_equal(flow_cpu_matmul_bf16_scratch_bound(n, i, o),
			 ((i + 1) * o + 279 * (2 * i + o)) * sizeof(float));
	float *xf = buf_new(n * i), *w = buf_new(o * i), *df = buf_new(n * o);
	float *rw = buf_new(o * i);
	flow_bf16_t *x = flow_alloc(n * i * sizeof(*x));
	flow_bf16_t *dout = flow_alloc(n * o * sizeof(*dout));
	flow_bf16_t *out = flow_alloc(n * o * sizeof(*out));
	flow_bf16_t *dinp = flow_calloc(n * i, sizeof(*dinp));
	assert_true(x && dout && out && dinp);
	flow_rng_fill_normal(xf, n * i, 42, 1, 0, 0.0f, 1.0f);
	flow_rng_fill_normal(w, o * i, 42, 2, 0, 0.0f, 0.25f);
	flow_rng_fill_normal(df, n * o, 42, 3, 0, 0.0f, 1.0f);
	for (size_t k = 0; k < n * i; k++) { /* the values the twin sees */
		x[k] = flow_f32_to_bf16(xf[k]);
		xf[k] = flow_bf16_to_f32(x[k]);
	}
	for (size_t k = 0; k < n * o; k++) {
		dout[k] = flow_f32_to_bf16(df[k]);
		df[k] = flow_bf16_to_f32(dout[k]);
	}
	for (size_t k = 0; k < o * i; k++)
		rw[k] = flow_round_bf16(w[k]);
	float *got = buf_new(n * o), *want = buf_new(n * o);
	float *dinp_w = buf_start(n * i, 0.0f);
	float *dw = buf_start(o * i, 0.0f), *dw_w = buf_start(o * i, 0.0f);
	void *scratch = flow_alloc(flow_cpu_matmul_bf16_scratch_bound(n, i, o));
	assert_non_null(scratch);

	flow_cpu_matmul_bf16_forward(out, scratch, x, w, NULL, n, i, o);
	flow_cpu_matmul_forward(want, xf, rw, NULL, n, i, o);
	for (size_t k = 0; k < n * o; k++) {
		got[k] = flow_bf16_to_f32(out[k]);
		want[k] = flow_round_bf16(want[k]);
	}
	check_close_bf16("panels", "out", got, want, n * o, ATOL_SUM, RTOL);
	flow_cpu_matmul_bf16_backward(dinp, dw, NULL, scratch, dout, x, w, n,
				      i, o);
	flow_cpu_matmul_backward(dinp_w, dw_w, NULL, df, xf, rw, n, i, o);
	for (size_t k = 0; k < n * i; k++) {
		got[k] = flow_bf16_to_f32(dinp[k]);
		dinp_w[k] = flow_round_bf16(dinp_w[k]);
	}
	/* dinp sums o = 60000 products (|sum| up to ~240) in one pass on
	 * both sides, but OpenBLAS may block that sum by the rows it is
	 * given (seen on AMD EPYC: 1.5e-5 apart at 0.41): within a bf16
	 * rounding of each other. */
	check_close_bf16("panels", "dinp", got, dinp_w, n * i, 1e-3, RTOL);
	check_close("panels", "dweight", dw, dw_w, o * i, ATOL_SUM, RTOL);
	BUFS_FREE(xf, w, df, rw, x, dout, out, dinp, got, want, dinp_w, dw,
		  dw_w, scratch);
}

/* ---- residual add fused with layernorm --------------------------------------*/

/* The backward pair: layernorm_backward into dres (holding the rest of
 * the stream's gradient), then residual_backward of dres into da and db
 * (each accumulating, each optional). */
static void residual_layernorm_backward_check(const flow_kernels_t *k,
					      size_t n, size_t C,
					      const float *res, const float *w,
					      const float *m, const float *rs)
{
	size_t nc = n * C;
	float *dout = buf_new(nc), *dres = buf_new(nc), *dres1 = buf_new(nc);
	float *da = buf_new(nc), *db = buf_new(nc), *da1 = buf_new(nc);
	float *db1 = buf_new(nc), *dw = buf_start(C, 0.5f);
	float *dw1 = buf_start(C, 0.5f), *dbias = buf_start(C, -0.5f);
	float *dbias1 = buf_start(C, -0.5f);

	flow_rng_fill_normal(dout, nc, 6, 1, 0, 0.0f, 1.0f);
	flow_rng_fill_normal(dres, nc, 6, 2, 0, 0.0f, 1.0f);
	flow_rng_fill_normal(da, nc, 6, 3, 0, 0.0f, 1.0f);
	flow_rng_fill_normal(db, nc, 6, 4, 0, 0.0f, 1.0f);
	memcpy(dres1, dres, nc * sizeof(float));
	memcpy(da1, da, nc * sizeof(float));
	memcpy(db1, db, nc * sizeof(float));
	for (int skip = 0; skip < 3; skip++) { /* both, no da, no db */
		float *a = skip == 1 ? NULL : da, *b = skip == 2 ? NULL : db;
		k->layernorm_residual_backward(dres, a, b, dw, dbias, dout, res,
					       w, m, rs, n, C);
		k->layernorm_backward(dres1, dw1, dbias1, dout, res, w, m, rs,
				      n, C);
		k->residual_backward(a ? da1 : NULL, b ? db1 : NULL, dres1, nc);
		assert_memory_equal(dres, dres1, nc * sizeof(float));
		assert_memory_equal(da, da1, nc * sizeof(float));
		assert_memory_equal(db, db1, nc * sizeof(float));
		assert_memory_equal(dw, dw1, C * sizeof(float));
		assert_memory_equal(dbias, dbias1, C * sizeof(float));
	}
	BUFS_FREE(dout, dres, dres1, da, db, da1, db1, dw, dw1, dbias, dbias1);
}

/* The fused kernels of each host set give the bits of its residual add
 * then its layernorm, and of their backward kernels in turn, for widths
 * within one simd block, odd ones and GPT-2's, with a residual stream far
 * from zero mean. */
static void test_kernels_residual_layernorm_is_the_unfused_pair(void **state)
{
	static const size_t widths[] = { 1, 37, 768 };
	const flow_kernels_t *sets[] = { &flow_cpu_kernels, &flow_ref_kernels };

	(void)state;
	for (size_t s = 0; s < ARRAY_SIZE(sets); s++) {
		const flow_kernels_t *k = sets[s];
		for (size_t wi = 0; wi < ARRAY_SIZE(widths); wi++) {
			size_t n = 130, C = widths[wi], nc = n * C;
			float *a = buf_new(nc), *b = buf_new(nc);
			float *w = buf_new(C), *bias = buf_new(C);
			float *res = buf_new(nc), *out = buf_new(nc);
			float *res1 = buf_new(nc), *out1 = buf_new(nc);
			float *m = buf_new(n), *rs = buf_new(n);
			float *m1 = buf_new(n), *rs1 = buf_new(n);

			flow_rng_fill_normal(a, nc, 5, 1, 0, 3.0f, 1.0f);
			flow_rng_fill_normal(b, nc, 5, 2, 0, 0.0f, 0.1f);
			flow_rng_fill_normal(w, C, 5, 3, 0, 1.0f, 0.2f);
			flow_rng_fill_normal(bias, C, 5, 4, 0, 0.0f, 0.2f);
			k->residual_layernorm_forward(res, out, m, rs, a, b, w,
						      bias, n, C);
			k->residual_forward(res1, a, b, nc);
			k->layernorm_forward(out1, m1, rs1, res1, w, bias, n, C);
			assert_memory_equal(res, res1, nc * sizeof(float));
			assert_memory_equal(out, out1, nc * sizeof(float));
			assert_memory_equal(m, m1, n * sizeof(float));
			assert_memory_equal(rs, rs1, n * sizeof(float));
			residual_layernorm_backward_check(k, n, C, res, w, m, rs);
			BUFS_FREE(a, b, w, bias, res, out, res1, out1, m, rs,
				  m1, rs1);
		}
	}
}

/* ---- embedding ---------------------------------------------------------------*/

static const char *const embedding_fixtures[] = { "embedding_small",
						  "embedding_t1",
						  "embedding_wide" };

static void test_kernels_embedding_forward_matches_torch(void **state)
{
	(void)state;
	for (size_t c = 0; c < ARRAY_SIZE(embedding_fixtures); c++) {
		const char *name = embedding_fixtures[c];
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		const int32_t *d = fixture_dims(&fx, 4);
		size_t B = (size_t)d[0], T = (size_t)d[1], C = (size_t)d[2],
		       V = (size_t)d[3];
		float *out = buf_start(B * T * C, 9.0f);

		flow_cpu_embedding_forward(out, I32(&fx, "tokens", B, T),
					   F32(&fx, "wte", V, C),
					   F32(&fx, "wpe", T, C), 0, V, B, T,
					   C);
		check_close(name, "out", out, F32(&fx, "out", B, T, C),
			    B * T * C, ATOL_ELEMENTWISE, RTOL);
		flow_free(out);
		flow_fixture_release(&fx);
	}
}

static void embedding_backward_run(float fill, unsigned want)
{
	for (size_t c = 0; c < ARRAY_SIZE(embedding_fixtures); c++) {
		const char *name = embedding_fixtures[c];
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		const int32_t *d = fixture_dims(&fx, 4);
		size_t B = (size_t)d[0], T = (size_t)d[1], C = (size_t)d[2],
		       V = (size_t)d[3];
		grad_t dwte = GRAD("dwte", fill, want & WANT_0, V, C);
		grad_t dwpe = GRAD("dwpe", fill, want & WANT_1, T, C);

		flow_cpu_embedding_backward(grad_arg(&dwte), grad_arg(&dwpe),
					    F32(&fx, "dout", B, T, C),
					    I32(&fx, "tokens", B, T), 0, V, B,
					    T, C);
		grad_check(&fx, name, &dwte, ATOL_SUM, RTOL);
		grad_check(&fx, name, &dwpe, ATOL_SUM, RTOL);
		grad_release(&dwte);
		grad_release(&dwpe);
		flow_fixture_release(&fx);
	}
}

static void test_kernels_embedding_backward_matches_torch(void **state)
{
	(void)state;
	embedding_backward_run(0.0f, WANT_ALL);
}

static void test_kernels_embedding_backward_accumulates(void **state)
{
	(void)state;
	embedding_backward_run(0.75f, WANT_ALL);
}

static void test_kernels_embedding_backward_null_grads(void **state)
{
	(void)state;
	embedding_backward_run(0.5f, WANT_0);
	embedding_backward_run(0.5f, WANT_1);
}

/* Over shards of wte's rows, as a vocabulary-parallel plan holds it, each
 * set gives the whole table's results: a token's row where its shard
 * holds it and 0 + wpe elsewhere, and each shard's dwte the rows of the
 * whole dwte, bit for bit (the same additions in the same order). */
static void test_kernels_embedding_over_row_shards(void **state)
{
	enum { B = 3, T = 5, C = 37, V = 11 };
	static const int64_t cuts[] = { 0, 4, 8, V };
	const flow_kernels_t *sets[] = { &flow_cpu_kernels, &flow_ref_kernels };
	int32_t tokens[B * T];
	float wte[V * C], wpe[T * C], dout[B * T * C];
	(void)state;
	for (size_t i = 0; i < B * T; i++)
		tokens[i] = (int32_t)((i * 7 + 3) % V);
	flow_rng_fill_normal(wte, V * C, 8, 1, 0, 0.0f, 1.0f);
	flow_rng_fill_normal(wpe, T * C, 8, 2, 0, 0.0f, 1.0f);
	flow_rng_fill_normal(dout, B * T * C, 8, 3, 0, 0.0f, 1.0f);
	for (size_t k = 0; k < ARRAY_SIZE(sets); k++) {
		const flow_kernels_t *ks = sets[k];
		float whole[B * T * C], out[B * T * C];
		float dwte[V * C] = { 0 }, dwpe[T * C] = { 0 };
		ks->embedding_forward(whole, tokens, wte, wpe, 0, V, B, T, C);
		ks->embedding_backward(dwte, dwpe, dout, tokens, 0, V, B, T, C);
		for (size_t s = 0; s + 1 < ARRAY_SIZE(cuts); s++) {
			int64_t r0 = cuts[s];
			size_t rows = (size_t)(cuts[s + 1] - r0);
			float sdwte[V * C] = { 0 }, sdwpe[T * C] = { 0 };
			ks->embedding_forward(out, tokens, wte + r0 * C, wpe,
					      r0, rows, B, T, C);
			ks->embedding_backward(sdwte, sdwpe, dout, tokens, r0,
					       rows, B, T, C);
			for (size_t i = 0; i < B * T; i++) {
				bool held = tokens[i] >= r0 &&
					    tokens[i] < r0 + (int64_t)rows;
				const float *want = held ? whole + i * C :
							   wpe + (i % T) * C;
				assert_memory_equal(out + i * C, want,
						    C * sizeof(float));
			}
			assert_memory_equal(sdwte, dwte + r0 * C,
					    rows * C * sizeof(float));
			assert_memory_equal(sdwpe, dwpe, sizeof dwpe);
		}
	}
}

/* ---- layernorm ---------------------------------------------------------------*/

static const char *const layernorm_fixtures[] = { "layernorm_small",
						  "layernorm_c768",
						  "layernorm_c1",
						  "layernorm_rows" };

static void test_kernels_layernorm_forward_matches_torch(void **state)
{
	(void)state;
	for (size_t c = 0; c < ARRAY_SIZE(layernorm_fixtures); c++) {
		const char *name = layernorm_fixtures[c];
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		const int32_t *d = fixture_dims(&fx, 2);
		size_t n = (size_t)d[0], C = (size_t)d[1];
		float *out = buf_start(n * C, 9.0f);
		float *mean = buf_start(n, 9.0f);
		float *rstd = buf_start(n, 9.0f);

		flow_cpu_layernorm_forward(out, mean, rstd,
					   F32(&fx, "inp", n, C),
					   F32(&fx, "weight", C),
					   F32(&fx, "bias", C), n, C);
		/* out = n*w + b with n = O(1): a cancelling sum of 2 terms. */
		check_close(name, "out", out, F32(&fx, "out", n, C), n * C,
			    ATOL_SUM, RTOL);
		check_close(name, "mean", mean, F32(&fx, "mean", n), n,
			    ATOL_SUM, RTOL);
		/* C = 1 has variance 0 and rstd = 1/sqrt(eps) = 316.2:
		 * relative. */
		check_close(name, "rstd", rstd, F32(&fx, "rstd", n), n, 0.0,
			    RTOL);
		BUFS_FREE(out, mean, rstd);
		flow_fixture_release(&fx);
	}
}

static void layernorm_backward_run(float fill, unsigned want)
{
	for (size_t c = 0; c < ARRAY_SIZE(layernorm_fixtures); c++) {
		const char *name = layernorm_fixtures[c];
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		const int32_t *d = fixture_dims(&fx, 2);
		size_t n = (size_t)d[0], C = (size_t)d[1];
		const float *inp = F32(&fx, "inp", n, C);
		const float *w = F32(&fx, "weight", C);
		float *out = buf_new(n * C);
		float *mean = buf_new(n), *rstd = buf_new(n);
		grad_t dinp = GRAD("dinp", fill, want & WANT_0, n, C);
		grad_t dw = GRAD("dweight", fill, want & WANT_1, C);
		grad_t db = GRAD("dbias", fill, want & WANT_2, C);

		/* mean and rstd come from our own forward, as in training. */
		flow_cpu_layernorm_forward(out, mean, rstd, inp, w,
					   F32(&fx, "bias", C), n, C);
		flow_cpu_layernorm_backward(grad_arg(&dinp), grad_arg(&dw),
					    grad_arg(&db),
					    F32(&fx, "dout", n, C), inp, w,
					    mean, rstd, n, C);
		/* dinp is rstd * (dn - mean(dn) - n*mean(dn*n)): three
		 * cancelling O(1) terms times rstd, which is 316 for the
		 * C = 1 case (where dinp is exactly 0 and the terms cancel
		 * to ~eps*316). */
		grad_check(&fx, name, &dinp, 1e-4, RTOL);
		grad_check(&fx, name, &dw, ATOL_SUM, RTOL);
		grad_check(&fx, name, &db, ATOL_SUM, RTOL);
		BUFS_FREE(out, mean, rstd);
		grad_release(&dinp);
		grad_release(&dw);
		grad_release(&db);
		flow_fixture_release(&fx);
	}
}

static void test_kernels_layernorm_backward_matches_torch(void **state)
{
	(void)state;
	layernorm_backward_run(0.0f, WANT_ALL);
}

static void test_kernels_layernorm_backward_accumulates(void **state)
{
	(void)state;
	layernorm_backward_run(0.75f, WANT_ALL);
}

static void test_kernels_layernorm_backward_null_grads(void **state)
{
	(void)state;
	layernorm_backward_run(0.5f, WANT_0);
	layernorm_backward_run(0.5f, WANT_1);
	layernorm_backward_run(0.5f, WANT_2);
}

/* ---- gelu ----------------------------------------------------------------------*/

static void test_kernels_gelu_forward_matches_torch(void **state)
{
	flow_fixture_t fx = { 0 };

	(void)state;
	fixture_load(&fx, "gelu");
	size_t n = (size_t)fixture_dims(&fx, 1)[0];
	float *out = buf_start(n, 9.0f);

	flow_cpu_gelu_forward(out, F32(&fx, "inp", n), n);
	check_close("gelu", "out", out, F32(&fx, "out", n), n, ATOL_GELU,
		    RTOL);
	flow_free(out);
	flow_fixture_release(&fx);
}

static void gelu_backward_run(float fill)
{
	flow_fixture_t fx = { 0 };

	fixture_load(&fx, "gelu");
	size_t n = (size_t)fixture_dims(&fx, 1)[0];
	float *dinp = buf_start(n, fill);
	float *e = buf_expect(F32(&fx, "dinp", n), n, fill);

	flow_cpu_gelu_backward(dinp, F32(&fx, "inp", n), F32(&fx, "dout", n),
			       n);
	check_close("gelu", "dinp", dinp, e, n, ATOL_GELU, RTOL);
	flow_free(dinp);
	flow_free(e);
	flow_fixture_release(&fx);
}

static void test_kernels_gelu_backward_matches_torch(void **state)
{
	(void)state;
	gelu_backward_run(0.0f);
}

static void test_kernels_gelu_backward_accumulates(void **state)
{
	(void)state;
	gelu_backward_run(0.75f);
}

/* ---- attention -----------------------------------------------------------------*/

static const char *const attention_fixtures[] = { "attention_small",
						  "attention_t1",
						  "attention_odd",
						  "attention_t64" };

/* Scratch of set for either fp32 pass, the bound to 64 bytes (ASan sees
 * a pass that needs more), filled with garbage that must not matter. */
static void *attention_scratch(const flow_kernels_t *set, size_t B, size_t T,
			       size_t C, size_t NH)
{
	size_t bytes = set->attention_scratch_bound(B, T, C, NH, false);
	void *scratch = flow_alloc(bytes);

	assert_non_null(scratch);
	memset(scratch, 0xA5, bytes);
	return scratch;
}

/* The fixtures and the kernel set held to them. */
typedef struct {
	const char *const *fixtures;
	size_t nfixtures;
	const flow_kernels_t *set;
} attention_case_t;

static const attention_case_t attention_fp32 = {
	attention_fixtures, ARRAY_SIZE(attention_fixtures), &flow_cpu_kernels
};

static void attention_forward_run(const attention_case_t *k)
{
	for (size_t c = 0; c < k->nfixtures; c++) {
		const char *name = k->fixtures[c];
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		const int32_t *d = fixture_dims(&fx, 4);
		size_t B = (size_t)d[0], T = (size_t)d[1], C = (size_t)d[2],
		       NH = (size_t)d[3];
		float *out = buf_start(B * T * C, 9.0f);
		float *lse = buf_start(B * NH * T, 9.0f);
		void *scratch = attention_scratch(k->set, B, T, C, NH);

		k->set->attention_forward(out, lse, scratch,
					  F32(&fx, "qkv", B, T, 3 * C), B, T,
					  C, NH);
		check_close(name, "lse", lse, F32(&fx, "lse", B, NH, T),
			    B * NH * T, ATOL_SUM, RTOL);
		check_close(name, "out", out, F32(&fx, "out", B, T, C),
			    B * T * C, ATOL_SUM, RTOL);
		BUFS_FREE(scratch, out, lse);
		flow_fixture_release(&fx);
	}
}

/* own_lse: from the forward pass's lse, not PyTorch's. */
static void attention_backward_run(const attention_case_t *k, float fill,
				   bool own_lse)
{
	for (size_t c = 0; c < k->nfixtures; c++) {
		const char *name = k->fixtures[c];
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		const int32_t *d = fixture_dims(&fx, 4);
		size_t B = (size_t)d[0], T = (size_t)d[1], C = (size_t)d[2],
		       NH = (size_t)d[3];
		const float *qkv = F32(&fx, "qkv", B, T, 3 * C);
		float *dqkv = buf_start(B * T * 3 * C, fill);
		float *e = buf_expect(F32(&fx, "dqkv", B, T, 3 * C),
				      B * T * 3 * C, fill);
		void *scratch = attention_scratch(k->set, B, T, C, NH);
		float *out = buf_new(B * T * C), *lse = buf_new(B * NH * T);

		if (own_lse) {
			k->set->attention_forward(out, lse, scratch, qkv, B, T,
						  C, NH);
		} else {
			memcpy(lse, F32(&fx, "lse", B, NH, T),
			       B * NH * T * sizeof(float));
			memcpy(out, F32(&fx, "out", B, T, C),
			       B * T * C * sizeof(float));
		}
		k->set->attention_backward(dqkv, scratch,
					   F32(&fx, "dout", B, T, C), qkv,
					   lse, out, B, T, C, NH);
		check_close(name, "dqkv", dqkv, e, B * T * 3 * C, ATOL_SUM,
			    RTOL);
		BUFS_FREE(scratch, out, lse, dqkv, e);
		flow_fixture_release(&fx);
	}
}

static void test_kernels_attention_forward_matches_torch(void **state)
{
	(void)state;
	attention_forward_run(&attention_fp32);
}

static void test_kernels_attention_backward_matches_torch(void **state)
{
	(void)state;
	attention_backward_run(&attention_fp32, 0.0f, false);
}

static void test_kernels_attention_backward_accumulates(void **state)
{
	(void)state;
	attention_backward_run(&attention_fp32, 0.75f, true);
}

/* ---- residual ------------------------------------------------------------------*/

static void test_kernels_residual_forward_matches_torch(void **state)
{
	flow_fixture_t fx = { 0 };

	(void)state;
	fixture_load(&fx, "residual");
	size_t n = (size_t)fixture_dims(&fx, 1)[0];
	float *out = buf_start(n, 9.0f);

	flow_cpu_residual_forward(out, F32(&fx, "a", n), F32(&fx, "b", n), n);
	check_close("residual", "out", out, F32(&fx, "out", n), n,
		    ATOL_ELEMENTWISE, RTOL);
	flow_free(out);
	flow_fixture_release(&fx);
}

static void residual_backward_run(float fill, unsigned want)
{
	flow_fixture_t fx = { 0 };

	fixture_load(&fx, "residual");
	size_t n = (size_t)fixture_dims(&fx, 1)[0];
	const float *dout = F32(&fx, "dout", n);
	float *da = buf_start(n, fill), *db = buf_start(n, fill);
	float *start = buf_start(n, fill);
	float *e = buf_expect(dout, n, fill);

	flow_cpu_residual_backward(want & WANT_0 ? da : NULL,
				   want & WANT_1 ? db : NULL, dout, n);
	/* fill + dout is one float addition, exactly what the kernel does:
	 * a wanted gradient must be e bit for bit, one not wanted start. */
	check_same("residual", "da", da, want & WANT_0 ? e : start, n);
	check_same("residual", "db", db, want & WANT_1 ? e : start, n);
	BUFS_FREE(da, db, start, e);
	flow_fixture_release(&fx);
}

static void test_kernels_residual_backward_matches_torch(void **state)
{
	(void)state;
	residual_backward_run(0.0f, WANT_0 | WANT_1);
}

static void test_kernels_residual_backward_accumulates(void **state)
{
	(void)state;
	residual_backward_run(0.75f, WANT_0 | WANT_1);
}

static void test_kernels_residual_backward_null_grads(void **state)
{
	(void)state;
	residual_backward_run(0.5f, WANT_0);
	residual_backward_run(0.5f, WANT_1);
	residual_backward_run(0.5f, 0);
}

/* ---- cross-entropy -------------------------------------------------------------*/

static const char *const cross_entropy_fixtures[] = { "cross_entropy_small",
						      "cross_entropy_gpt2" };

static void test_kernels_cross_entropy_matches_torch(void **state)
{
	const char *const *names = cross_entropy_fixtures;

	(void)state;
	for (size_t c = 0; c < ARRAY_SIZE(cross_entropy_fixtures); c++) {
		const char *name = names[c];
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		const int32_t *d = fixture_dims(&fx, 3);
		size_t n = (size_t)d[0], V = (size_t)d[1], Vp = (size_t)d[2];
		const int32_t *tg = I32(&fx, "targets", n);
		const float *ref = F32(&fx, "dlogits", n, Vp);
		float *logits = buf_copy(F32(&fx, "logits", n, Vp), n * Vp);
		float *losses = buf_start(n, 9.0f);

		flow_cpu_cross_entropy_forward_backward(
			losses, logits, tg, n, V, Vp,
			fixture_scalar(&fx, "dloss"));
		/* A loss is log(sum exp) - x_t: O(10) terms, relative. */
		check_close(name, "losses", losses, F32(&fx, "losses", n), n,
			    ATOL_SUM, RTOL);
		/* dloss * (p - onehot): p down to e^-30 for the 50k-vocab
		 * row, where only an absolute bound is meaningful. */
		check_close(name, "dlogits", logits, ref, n * Vp, ATOL_PROB,
			    RTOL);
		for (size_t r = 0; r < n; r++) {
			for (size_t j = V; j < Vp; j++)
				assert_true(logits[r * Vp + j] == 0.0f);
			if (tg[r] < 0) {
				assert_true(losses[r] == 0.0f);
				for (size_t j = 0; j < Vp; j++)
					assert_true(logits[r * Vp + j] ==
						    0.0f);
			}
		}
		flow_free(logits);
		flow_free(losses);
		flow_fixture_release(&fx);
	}
}

/* The three split steps over 3 column shards of the same fixtures, the
 * group's gather and sum done here in member order, meet PyTorch's whole
 * rows at the same tolerances: the losses summed over the shards, the
 * gradient of each shard's columns. */
static void test_kernels_cross_entropy_split_matches_torch(void **state)
{
	const char *const *names = cross_entropy_fixtures;
	enum { P = 3 };

	(void)state;
	for (size_t c = 0; c < ARRAY_SIZE(cross_entropy_fixtures); c++) {
		const char *name = names[c];
		flow_fixture_t fx = { 0 };
		fixture_load(&fx, name);
		const int32_t *d = fixture_dims(&fx, 3);
		size_t n = (size_t)d[0], V = (size_t)d[1], Vp = (size_t)d[2];
		const int32_t *tg = I32(&fx, "targets", n);
		const float *logits = F32(&fx, "logits", n, Vp);
		const float *ref = F32(&fx, "dlogits", n, Vp);
		float dloss = fixture_scalar(&fx, "dloss");
		size_t w = (Vp + P - 1) / P; /* the last shard narrower */
		float *gathered = buf_start(P * n, 9.0f);
		float *max = buf_start(n, 9.0f), *sums = buf_start(n, 0.0f);
		float *part = buf_start(n, 9.0f), *losses = buf_start(n, 0.0f);
		float *shard[P];
		flow_logits_shard_t s[P];

		for (size_t q = 0; q < P; q++) {
			size_t c0 = q * w, cols = Vp - c0 < w ? Vp - c0 : w;
			s[q] = (flow_logits_shard_t){
				.n = n, .cols = cols, .c0 = (int64_t)c0,
				.valid = V <= c0 ? 0 : V - c0 < cols ? V - c0 : cols,
				.first = q == 0 };
			shard[q] = buf_start(n * cols, 9.0f);
			for (size_t r = 0; r < n; r++)
				memcpy(shard[q] + r * cols, logits + r * Vp + c0,
				       cols * sizeof(float));
			flow_cpu_cross_entropy_split_max(gathered + q * n,
							 shard[q], &s[q]);
		}
		for (size_t q = 0; q < P; q++) { /* the all-reduce of sums */
			flow_cpu_cross_entropy_split_sums(part, max, gathered, P,
							  shard[q], &s[q]);
			for (size_t r = 0; r < n; r++)
				sums[r] += part[r];
		}
		for (size_t q = 0; q < P; q++) {
			flow_cpu_cross_entropy_split_finish(part, shard[q], tg,
							    max, sums, &s[q],
							    dloss);
			for (size_t r = 0; r < n; r++) {
				losses[r] += part[r];
				check_close(name, "dlogits", shard[q] + r * s[q].cols,
					    ref + r * Vp + s[q].c0, s[q].cols,
					    ATOL_PROB, RTOL);
			}
			flow_free(shard[q]);
		}
		check_close(name, "losses", losses, F32(&fx, "losses", n), n,
			    ATOL_SUM, RTOL);
		flow_free(gathered);
		flow_free(max);
		flow_free(sums);
		flow_free(part);
		flow_free(losses);
		flow_fixture_release(&fx);
	}
}

/* ---- AdamW -----------------------------------------------------------------------*/

static void adamw_run(const char *name)
{
	flow_fixture_t fx = { 0 };

	fixture_load(&fx, name);
	const int32_t *d = fixture_dims(&fx, 3);
	size_t n = (size_t)d[0], steps = (size_t)d[1];
	bool decay = d[2] != 0;
	const float *hpa = F32(&fx, "hparams", 5);
	flow_adamw_params_t hp = { .lr = hpa[0], .beta1 = hpa[1],
				   .beta2 = hpa[2], .eps = hpa[3],
				   .weight_decay = hpa[4] };
	const float *grads = F32(&fx, "grads", steps, n);
	const float *rp = F32(&fx, "params", steps, n);
	const float *rm = F32(&fx, "m", steps, n);
	const float *rv = F32(&fx, "v", steps, n);
	float *p = buf_copy(F32(&fx, "param0", n), n);
	float *m = buf_start(n, 0.0f), *v = buf_start(n, 0.0f);

	/* Same arithmetic as PyTorch in the same order: the only freedom
	 * left is PyTorch's vectorised add, which fuses a*b+c (FMA), so
	 * results agree to ~1 ulp, far inside RTOL.  Checked after every
	 * step so an error in the bias correction (t) shows. */
	for (size_t s = 0; s < steps; s++) {
		flow_cpu_adamw_update(p, grads + s * n, m, v, n, &hp,
				      (uint64_t)s + 1, decay);
		/* m = b1*m + (1-b1)*g cancels when g changes sign, which
		 * turns PyTorch's FMA-vs-not ulp into up to ~7e-6 relative
		 * (the tightest check here); 1e-10 absolute only covers m
		 * within ulps of zero. */
		check_close(name, "m", m, rm + s * n, n, 1e-10, RTOL);
		check_close(name, "v", v, rv + s * n, n, 0.0, RTOL);
		check_close(name, "param", p, rp + s * n, n, 0.0, RTOL);
	}
	BUFS_FREE(p, m, v);
	flow_fixture_release(&fx);
}

static void test_kernels_adamw_decay_matches_torch(void **state)
{
	(void)state;
	adamw_run("adamw_decay");
}

static void test_kernels_adamw_nodecay_matches_torch(void **state)
{
	(void)state;
	adamw_run("adamw_nodecay");
}

/* ---- gradient norm ---------------------------------------------------------------*/

static void grad_norm_run(const char *name, bool measure_only)
{
	flow_fixture_t fx = { 0 };
	float *g[3], *orig[3];
	size_t counts[3];
	char what[32];

	fixture_load(&fx, name);
	const int32_t *d = fixture_dims(&fx, 3);
	for (size_t k = 0; k < 3; k++) {
		counts[k] = (size_t)d[k];
		snprintf(what, sizeof(what), "grad%zu", k);
		g[k] = buf_copy(F32(&fx, what, counts[k]), counts[k]);
		orig[k] = buf_copy(g[k], counts[k]);
	}
	float max_norm = measure_only ? 0.0f :
					fixture_scalar(&fx, "max_norm");
	float norm = flow_cpu_clip_grad_norm(g, counts, 3, max_norm);
	float want = fixture_scalar(&fx, "norm");

	/* PyTorch sums in float, flow in double: both round the same
	 * sum of 142 squares, within a few float ulps. */
	check_close(name, "norm", &norm, &want, 1, 0.0, RTOL);
	for (size_t k = 0; k < 3; k++) {
		snprintf(what, sizeof(what), "clipped%zu", k);
		if (measure_only)
			check_same(name, "grad", g[k], orig[k], counts[k]);
		else
			check_close(name, what, g[k],
				    F32(&fx, what, counts[k]), counts[k],
				    ATOL_ELEMENTWISE, RTOL);
		flow_free(g[k]);
		flow_free(orig[k]);
	}
	flow_fixture_release(&fx);
}

static void test_kernels_grad_norm_clips_as_torch(void **state)
{
	(void)state;
	grad_norm_run("grad_norm_clip", false);
}

static void test_kernels_grad_norm_below_max_is_untouched(void **state)
{
	(void)state;
	grad_norm_run("grad_norm_noclip", false);
	/* Not clipping must leave the bits alone (no multiply by 1.0f
	 * that could flush a denormal): compare with the input exactly. */
	flow_fixture_t fx = { 0 };
	fixture_load(&fx, "grad_norm_noclip");
	const int32_t *d = fixture_dims(&fx, 3);
	for (size_t k = 0; k < 3; k++) {
		char what[32];
		snprintf(what, sizeof(what), "clipped%zu", k);
		const float *c = F32(&fx, what, (size_t)d[k]);
		snprintf(what, sizeof(what), "grad%zu", k);
		check_same("grad_norm_noclip", what, c,
			   F32(&fx, what, (size_t)d[k]), (size_t)d[k]);
	}
	flow_fixture_release(&fx);
}

static void test_kernels_grad_norm_zero_max_only_measures(void **state)
{
	(void)state;
	grad_norm_run("grad_norm_clip", true);
}

static void test_kernels_sum_squares_matches_long_double(void **state)
{
	/* Longer than several FLOW_CPU_SQ_CHUNK chunks, with a ragged end. */
	size_t n = 3 * 65536 + 12345;
	float *x = buf_new(n);
	long double want = 0.0L;

	(void)state;
	for (size_t i = 0; i < n; i++) {
		x[i] = (float)((double)((i * 2654435761u) % 1000003) /
			       1000003.0 - 0.5);
		want += (long double)x[i] * x[i];
	}
	double got = flow_cpu_sum_squares(x, n);
	/* double accumulation of 2e5 positive terms: ~1e-12 relative. */
	assert_true(fabsl((long double)got - want) <= 1e-10L * want);
	assert_true(flow_cpu_sum_squares(x, 0) == 0.0);
	flow_free(x);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kernels_fixture_rejects_corrupt_files),
		cmocka_unit_test(test_kernels_matmul_forward_matches_torch),
		cmocka_unit_test(test_kernels_matmul_backward_matches_torch),
		cmocka_unit_test(test_kernels_matmul_backward_accumulates),
		cmocka_unit_test(test_kernels_matmul_backward_null_grads),
		cmocka_unit_test(test_kernels_matmul_backward_without_inputs),
		cmocka_unit_test(test_kernels_matmul_bf16_panels),
		cmocka_unit_test(test_kernels_residual_layernorm_is_the_unfused_pair),
		cmocka_unit_test(test_kernels_embedding_forward_matches_torch),
		cmocka_unit_test(test_kernels_embedding_backward_matches_torch),
		cmocka_unit_test(test_kernels_embedding_backward_accumulates),
		cmocka_unit_test(test_kernels_embedding_backward_null_grads),
		cmocka_unit_test(test_kernels_embedding_over_row_shards),
		cmocka_unit_test(test_kernels_layernorm_forward_matches_torch),
		cmocka_unit_test(test_kernels_layernorm_backward_matches_torch),
		cmocka_unit_test(test_kernels_layernorm_backward_accumulates),
		cmocka_unit_test(test_kernels_layernorm_backward_null_grads),
		cmocka_unit_test(test_kernels_gelu_forward_matches_torch),
		cmocka_unit_test(test_kernels_gelu_backward_matches_torch),
		cmocka_unit_test(test_kernels_gelu_backward_accumulates),
		cmocka_unit_test(test_kernels_attention_forward_matches_torch),
		cmocka_unit_test(test_kernels_attention_backward_matches_torch),
		cmocka_unit_test(test_kernels_attention_backward_accumulates),
		cmocka_unit_test(test_kernels_residual_forward_matches_torch),
		cmocka_unit_test(test_kernels_residual_backward_matches_torch),
		cmocka_unit_test(test_kernels_residual_backward_accumulates),
		cmocka_unit_test(test_kernels_residual_backward_null_grads),
		cmocka_unit_test(test_kernels_cross_entropy_matches_torch),
		cmocka_unit_test(test_kernels_cross_entropy_split_matches_torch),
		cmocka_unit_test(test_kernels_adamw_decay_matches_torch),
		cmocka_unit_test(test_kernels_adamw_nodecay_matches_torch),
		cmocka_unit_test(test_kernels_grad_norm_clips_as_torch),
		cmocka_unit_test(test_kernels_grad_norm_below_max_is_untouched),
		cmocka_unit_test(test_kernels_grad_norm_zero_max_only_measures),
		cmocka_unit_test(test_kernels_sum_squares_matches_long_double),
	};

	return cmocka_run_group_tests(tests, NULL, NULL) ? EXIT_FAILURE :
							   EXIT_SUCCESS;
}
