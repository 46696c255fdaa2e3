/* The reference kernels (flow/kernels_ref.h): the fp32 kernels on tiny
 * cases computed by hand, since they are the yardstick flow-bench checks
 * the optimised kernels against, so they are checked against arithmetic,
 * not against other code; then the rounding to bf16 every bf16 twin
 * stores with, and each twin against its fp32 kernel on random shapes by
 * the rule that relates them (bf16_of, below), with a few cases by hand
 * where what the twin rounds shows.
 * Tolerance: 1e-6 absolute unless a case says otherwise (every expected
 * value is exact or given to 7+ significant digits). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <flow/kernels_ref.h>
#include <flow/tensor.h>

#include "sbputil.h"

#define TOL 1e-6

static void assert_close(double got, double want, double tol)
{
	if (fabs(got - want) > tol)
		fail_msg("got %.9g, want %.9g (tolerance %g)", got, want, tol);
}

static void test_ref_matmul_forward_2x3_by_hand(void **state)
{
	const float inp[6] = { 1, 2, 3, 4, 5, 6 };      /* 2 x 3 */
	const float weight[6] = { 1, 0, -1, 2, 1, 0 };  /* 2 (out) x 3 (in) */
	const float bias[2] = { 0.5f, -1.0f };
	float out[4];

	flow_ref_matmul_forward(out, inp, weight, bias, 2, 3, 2);
	/* row 0: 1-3+0.5, 2+2-1; row 1: 4-6+0.5, 8+5-1 */
	assert_close(out[0], -1.5, TOL);
	assert_close(out[1], 3.0, TOL);
	assert_close(out[2], -1.5, TOL);
	assert_close(out[3], 12.0, TOL);

	flow_ref_matmul_forward(out, inp, weight, NULL, 2, 3, 2);
	assert_close(out[0], -2.0, TOL);
	assert_close(out[3], 13.0, TOL);
}

static void test_ref_matmul_backward_accumulates_by_hand(void **state)
{
	const float inp[6] = { 1, 2, 3, 4, 5, 6 };
	const float weight[6] = { 1, 0, -1, 2, 1, 0 };
	const float dout[4] = { 1, 0, 0, 1 }; /* identity */
	float dinp[6] = { 1, 1, 1, 1, 1, 1 };  /* accumulated into */
	float dweight[6] = { 0 };
	float dbias[2] = { 10, 20 };

	flow_ref_matmul_backward(dinp, dweight, dbias, dout, inp, weight, 2, 3,
				 2);
	/* dinp = 1 + dout.W = 1 + W; dweight = dout^T.inp = inp; dbias += 1 */
	for (int i = 0; i < 6; i++) {
		assert_close(dinp[i], 1.0 + weight[i], TOL);
		assert_close(dweight[i], inp[i], TOL);
	}
	assert_close(dbias[0], 11.0, TOL);
	assert_close(dbias[1], 21.0, TOL);

	/* Optional gradients may be NULL. */
	flow_ref_matmul_backward(NULL, dweight, NULL, dout, inp, weight, 2, 3,
				 2);
	assert_close(dweight[5], 12.0, TOL);
}

static void test_ref_embedding_sums_repeated_tokens(void **state)
{
	const int32_t tokens[2] = { 1, 1 }; /* B 1, T 2, the same token */
	const float wte[4] = { 1, 2, 3, 4 }; /* V 2, C 2 */
	const float wpe[4] = { 10, 20, 30, 40 };
	const float dout[4] = { 1, 2, 3, 4 };
	float out[4], dwte[4] = { 0 }, dwpe[4] = { 0 };

	flow_ref_embedding_forward(out, tokens, wte, wpe, 0, 2, 1, 2, 2);
	assert_close(out[0], 13.0, TOL);
	assert_close(out[1], 24.0, TOL);
	assert_close(out[2], 33.0, TOL);
	assert_close(out[3], 44.0, TOL);

	flow_ref_embedding_backward(dwte, dwpe, dout, tokens, 0, 2, 1, 2, 2);
	assert_close(dwte[0], 0.0, TOL); /* token 0 unused */
	assert_close(dwte[1], 0.0, TOL);
	assert_close(dwte[2], 4.0, TOL); /* 1 + 3 */
	assert_close(dwte[3], 6.0, TOL); /* 2 + 4 */
	for (int i = 0; i < 4; i++)
		assert_close(dwpe[i], dout[i], TOL);
}

static void test_ref_layernorm_of_a_known_row(void **state)
{
	const float inp[4] = { 1, 2, 3, 4 };
	const float weight[4] = { 1, 1, 1, 1 };
	const float bias[4] = { 0, 0, 0, 0 };
	const float dout[4] = { 1, 1, 1, 1 };
	float out[4], mean, rstd, dinp[4] = { 0 }, dw[4] = { 0 }, db[4] = { 0 };
	/* mean 2.5, biased variance 1.25 */
	double rs = 1.0 / sqrt(1.25 + (double)FLOW_LAYERNORM_EPS);

	flow_ref_layernorm_forward(out, &mean, &rstd, inp, weight, bias, 1, 4);
	assert_close(mean, 2.5, TOL);
	assert_close(rstd, 0.894423613312618, TOL);
	assert_close(out[0], -1.5 * rs, TOL);
	assert_close(out[1], -0.5 * rs, TOL);
	assert_close(out[2], 0.5 * rs, TOL);
	assert_close(out[3], 1.5 * rs, TOL);

	/* A constant upstream gradient is removed by the mean subtraction:
	 * dinp = 0; dweight = xhat; dbias = 1. */
	flow_ref_layernorm_backward(dinp, dw, db, dout, inp, weight, &mean,
				    &rstd, 1, 4);
	for (int c = 0; c < 4; c++) {
		assert_close(dinp[c], 0.0, TOL);
		assert_close(dw[c], out[c], TOL);
		assert_close(db[c], 1.0, TOL);
	}
}

static void test_ref_gelu_known_values(void **state)
{
	const float x[3] = { 0.0f, 1.0f, -1.0f };
	const float dout[3] = { 1.0f, 0.0f, 0.0f };
	float y[3], dx[3] = { 2.0f, 2.0f, 2.0f };

	flow_ref_gelu_forward(y, x, 3);
	assert_close(y[0], 0.0, TOL);
	assert_close(y[1], 0.8411919906082768, TOL);
	assert_close(y[2], -0.15880800939172324, TOL);

	/* gelu'(0) = 1/2, added to what dx held; dout 0 adds nothing. */
	flow_ref_gelu_backward(dx, x, dout, 3);
	assert_close(dx[0], 2.5, TOL);
	assert_close(dx[1], 2.0, TOL);
	assert_close(dx[2], 2.0, TOL);
}

/* B 1, T 2, C = NH = 1 (head size 1, scale 1).  qkv per position: q, k, v.
 * Position 1 attends with scores q1*k0 = 0 and q1*k1 = ln 3, so the
 * probabilities are 1/4 and 3/4 and out1 = 2/4 + 18/4 = 5. */
static const float attn_qkv[6] = { 1.0f, 0.0f, 2.0f,
				   1.0f, 1.0986122886681098f, 6.0f };

static void test_ref_attention_causal_t2_by_hand(void **state)
{
	float out[2], lse[2];
	double scratch[16];

	assert_true(flow_ref_attention_scratch_bound(1, 2, 1, 1, false) <=
		    sizeof(scratch));
	flow_ref_attention_forward(out, lse, scratch, attn_qkv, 1, 2, 1, 1);
	assert_close(lse[0], 0.0, TOL); /* row 0 sees only itself: log e^0 */
	assert_close(lse[1], 1.3862943611198906, TOL); /* log(1 + 3) */
	assert_close(out[0], 2.0, TOL);
	assert_close(out[1], 5.0, 2e-6);
}

static void test_ref_attention_backward_t2_by_hand(void **state)
{
	/* The probabilities (1, 0; 1/4, 3/4) as the forward pass keeps them. */
	const float lse[2] = { 0.0f, 1.3862943611198906f };
	const float dout[2] = { 0.0f, 1.0f };
	float dqkv[6] = { 0 };
	double scratch[16];

	assert_true(flow_ref_attention_scratch_bound(1, 2, 1, 1, false) <=
		    sizeof(scratch));
	/* out (= P v) is not read by the reference set. */
	flow_ref_attention_backward(dqkv, scratch, dout, attn_qkv, lse, NULL,
				    1, 2, 1, 1);
	/* datt[1,:] = v = (2, 6); sum att*datt = 5;
	 * dpre[1,:] = (0.25 * (2 - 5), 0.75 * (6 - 5)) = (-0.75, 0.75).
	 * dq1 = dpre.k = 0.75 ln 3; dk0 = -0.75 q1; dk1 = 0.75 q1;
	 * dv0 = att[1,0] = 0.25; dv1 = 0.75; row 0 has dout 0. */
	assert_close(dqkv[0], 0.0, TOL);                /* dq0 */
	assert_close(dqkv[1], -0.75, TOL);              /* dk0 */
	assert_close(dqkv[2], 0.25, TOL);               /* dv0 */
	assert_close(dqkv[3], 0.8239592165010823, TOL); /* dq1 */
	assert_close(dqkv[4], 0.75, TOL);               /* dk1 */
	assert_close(dqkv[5], 0.75, TOL);               /* dv1 */
}

static void test_ref_residual_adds_and_accumulates(void **state)
{
	const float a[2] = { 1, 2 }, b[2] = { 10, 20 }, dout[2] = { 3, 4 };
	float out[2], da[2] = { 1, 1 };

	flow_ref_residual_forward(out, a, b, 2);
	assert_close(out[0], 11.0, TOL);
	assert_close(out[1], 22.0, TOL);
	flow_ref_residual_backward(da, NULL, dout, 2);
	assert_close(da[0], 4.0, TOL);
	assert_close(da[1], 5.0, TOL);
}

static void test_ref_cross_entropy_of_uniform_logits_is_log_v(void **state)
{
	/* 2 rows, V 4 real columns of Vp 6; row 1 is ignored (target -1). */
	float logits[12];
	const int32_t targets[2] = { 2, -1 };
	float losses[2] = { -1, -1 };

	for (int i = 0; i < 12; i++)
		logits[i] = i % 6 < 4 ? 0.0f : 100.0f; /* padding is masked */
	flow_ref_cross_entropy_forward_backward(losses, logits, targets, 2, 4,
						6, 0.5f);
	assert_close(losses[0], log(4.0), TOL);
	/* dloss * (1/4 - onehot): 0.125 and 0.125 - 0.5 at the target. */
	assert_close(logits[0], 0.125, TOL);
	assert_close(logits[1], 0.125, TOL);
	assert_close(logits[2], -0.375, TOL);
	assert_close(logits[3], 0.125, TOL);
	assert_close(logits[4], 0.0, TOL);
	assert_close(logits[5], 0.0, TOL);
	assert_close(losses[1], 0.0, TOL);
	for (int j = 6; j < 12; j++)
		assert_close(logits[j], 0.0, TOL);
}

static void test_ref_adamw_one_step_by_hand(void **state)
{
	const flow_adamw_params_t hp = { .lr = 0.1f, .beta1 = 0.9f,
					 .beta2 = 0.999f, .eps = 1e-8f,
					 .weight_decay = 0.01f };
	float p[2] = { 1.0f, 1.0f }, m[2] = { 0, 0 }, v[2] = { 0, 0 };
	const float g[2] = { 0.5f, 0.5f };

	flow_ref_adamw_update(p, g, m, v, 1, &hp, 1, true);
	/* decay: 1 * (1 - 0.1*0.01) = 0.999; m = 0.05, v = 0.00025;
	 * m_hat = 0.5, sqrt(v_hat) = 0.5, so the step is lr = 0.1.  (The
	 * hyperparameters are floats: 1 - 0.999f is 0.00099999, hence the
	 * looser bound on v.) */
	assert_close(m[0], 0.05, TOL);
	assert_close(v[0], 0.00025, 1e-8);
	assert_close(p[0], 0.899, TOL);
	assert_close(p[1], 1.0, TOL); /* n = 1: untouched */

	p[0] = 1.0f;
	m[0] = v[0] = 0.0f;
	flow_ref_adamw_update(p, g, m, v, 1, &hp, 1, false);
	assert_close(p[0], 0.9, TOL); /* no decay */
}

static void test_ref_clip_grad_norm_3_4_5(void **state)
{
	float a[1] = { 3.0f }, b[1] = { 4.0f };
	float *grads[2] = { a, b };
	const size_t counts[2] = { 1, 1 };

	assert_close(flow_ref_sum_squares(b, 1), 16.0, TOL);
	/* max_norm <= 0 measures only. */
	assert_close(flow_ref_clip_grad_norm(grads, counts, 2, 0.0f), 5.0, TOL);
	assert_close(a[0], 3.0, TOL);
	/* Below the limit: unchanged. */
	assert_close(flow_ref_clip_grad_norm(grads, counts, 2, 10.0f), 5.0, TOL);
	assert_close(b[0], 4.0, TOL);
	/* Above: scaled by 1 / (5 + 1e-6). */
	assert_close(flow_ref_clip_grad_norm(grads, counts, 2, 1.0f), 5.0, TOL);
	assert_close(a[0], 0.6, TOL);
	assert_close(b[0], 0.8, TOL);

	flow_ref_scale(a, 1, 2.0f);
	assert_close(a[0], 1.2, TOL);
}

/* ---- rounding to bf16 ---------------------------------------------------------- */

static float float_of_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t bits_of_float(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

/* At the midpoint m of every two neighbouring finite bf16 values b < b'
 * in magnitude (the float b's bits | 0x8000, the last one the midpoint
 * to infinity), of both signs and subnormals included: m itself ties to
 * the even one, m nudged toward b' by |m| 2^-30 (far below half a float
 * ulp) rounds to b', nudged toward b rounds to b.  Rounding the nudged
 * values to float first lands on m, so flow_bf16_narrow((float)x) would
 * tie instead: the case the helper exists for, and the test checks that
 * it meets it. */
static void test_ref_bf16_narrow_rounds_once_at_every_midpoint(void **state)
{
	size_t twice_wrong = 0;

	(void)state;
	for (uint32_t sign = 0; sign <= 0x8000u; sign += 0x8000u) {
		for (uint32_t b = 0; b <= 0x7f7fu; b++) {
			float m = float_of_bits((sign | b) << 16 | 0x8000u);
			double nudge = fabs((double)m) * 0x1p-30;
			double away = m < 0 ? -nudge : nudge;
			flow_bf16_t lo = (flow_bf16_t)(sign | b);
			flow_bf16_t hi = (flow_bf16_t)(lo + 1);
			flow_bf16_t even = (b & 1u) ? hi : lo;

			if (flow_ref_bf16_narrow(m) != even ||
			    flow_ref_bf16_narrow((double)m + away) != hi ||
			    flow_ref_bf16_narrow((double)m - away) != lo)
				fail_msg("bf16 midpoint 0x%08x: got 0x%04x "
					 "0x%04x 0x%04x, want 0x%04x 0x%04x "
					 "0x%04x",
					 (unsigned)bits_of_float(m),
					 flow_ref_bf16_narrow(m),
					 flow_ref_bf16_narrow((double)m + away),
					 flow_ref_bf16_narrow((double)m - away),
					 even, hi, lo);
			assert_int_equal(flow_ref_bf16_narrow(m),
					 flow_f32_to_bf16(m));
			twice_wrong += flow_bf16_narrow((float)((double)m +
								away)) != hi;
		}
	}
	/* Rounding twice goes wrong above the midpoints whose lower
	 * neighbour is even: half of them. */
	assert_int_equal(twice_wrong, 0x7f80);
}

/* On a float, one rounding from double is the float's own rounding
 * (flow_f32_to_bf16): every bf16 value with the low halves that sit at,
 * beside and between its rounding boundaries, and random floats. */
static void test_ref_bf16_narrow_of_a_float_is_f32_to_bf16(void **state)
{
	static const uint32_t lows[] = { 0x0000, 0x0001, 0x3fff, 0x7fff,
					 0x8000, 0x8001, 0xfffe, 0xffff };
	uint64_t seed = 0x5eed0001;

	(void)state;
	for (uint32_t hi = 0; hi <= 0xffffu; hi++) {
		for (size_t l = 0; l < sizeof lows / sizeof *lows; l++) {
			float f = float_of_bits(hi << 16 | lows[l]);
			if (isnan(f)) {
				assert_true(isnan(flow_bf16_widen(
					flow_ref_bf16_narrow(f))));
				continue;
			}
			if (flow_ref_bf16_narrow(f) != flow_f32_to_bf16(f))
				fail_msg("0x%08x: got 0x%04x, want 0x%04x",
					 (unsigned)bits_of_float(f),
					 flow_ref_bf16_narrow(f),
					 flow_f32_to_bf16(f));
		}
	}
	for (int i = 0; i < 1 << 20; i++) {
		float f = float_of_bits((uint32_t)splitmix64(&seed));
		if (!isnan(f))
			assert_int_equal(flow_ref_bf16_narrow(f),
					 flow_f32_to_bf16(f));
	}
}

/* Against a rounding written on the bits of the double itself, for
 * doubles in bf16's normal range (exponents -126..127): keep 7 of the 52
 * fraction bits and round the other 45 to nearest even, a carry stepping
 * into the exponent (at the top, to 2^128: infinity).  The fractions are
 * random, or random within a few units of the midpoint of the 45 bits. */
static void test_ref_bf16_narrow_matches_the_double_bits(void **state)
{
	const uint64_t half = (uint64_t)1 << 44, low = ((uint64_t)1 << 45) - 1;
	uint64_t seed = 0x5eed0002;

	(void)state;
	for (int i = 0; i < 1 << 20; i++) {
		uint64_t r = splitmix64(&seed);
		uint64_t exp = (uint64_t)(1023 - 126 + (int)(r % 254));
		uint64_t frac = splitmix64(&seed) >> 12;
		if (i & 1) /* near the midpoint */
			frac = (frac & ~low) | (half + (r >> 40) % 9 - 4);
		uint64_t u = (r >> 63) << 63 | exp << 52 | frac;
		double x;
		memcpy(&x, &u, sizeof(x));

		uint64_t kept = u >> 45, rest = u & low;
		if (rest > half || (rest == half && (kept & 1)))
			kept++;
		uint64_t w = kept << 45;
		double want;
		memcpy(&want, &w, sizeof(want));
		/* want is a bf16 value, or 2^128 (a float's infinity). */
		if (flow_ref_bf16_narrow(x) != flow_f32_to_bf16((float)want))
			fail_msg("%a: got 0x%04x, want %a", x,
				 flow_ref_bf16_narrow(x), want);
	}
}

/* ---- the bf16 twins against their fp32 kernels ------------------------------- */

/* The rule: on the same values a twin computes its fp32 kernel's double D
 * and rounds it once to bf16, H, where the kernel rounds it to float, F.
 * So H is F rounded to bf16, except where F is a midpoint of two bf16
 * values (low half 0x8000): D may have been on either side of it, and H
 * is one of the two.  A twin's fp32 results are the kernel's bits. */
static bool bf16_of(flow_bf16_t h, float f)
{
	uint32_t u = bits_of_float(f);

	if ((u & 0xffffu) == 0x8000u)
		return h == u >> 16 || h == (u >> 16) + 1;
	return h == flow_f32_to_bf16(f);
}

static void check_bf16_of(const flow_bf16_t *h, const float *f, size_t n,
			  const char *what, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		if (!bf16_of(h[i], f[i]))
			fail_msg("seed %#llx: %s[%zu] is 0x%04x (%g), the fp32 "
				 "kernel's %.9g",
				 (unsigned long long)seed, what, i, h[i],
				 flow_bf16_widen(h[i]), f[i]);
}

static void check_same(const float *got, const float *want, size_t n,
		       const char *what, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		if (bits_of_float(got[i]) != bits_of_float(want[i]))
			fail_msg("seed %#llx: %s[%zu] is %.9g, the fp32 "
				 "kernel's %.9g",
				 (unsigned long long)seed, what, i, got[i],
				 want[i]);
}

static void *zalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	assert_non_null(p);
	return p;
}

/* Uniform in [-scale, scale). */
static float uniform(uint64_t *st, float scale)
{
	return (float)(((double)(splitmix64(st) >> 11) * 0x1p-52 - 1.0) *
		       scale);
}

static void fill(float *x, size_t n, uint64_t *st, float scale)
{
	for (size_t i = 0; i < n; i++)
		x[i] = uniform(st, scale);
}

/* Random bf16 values into h, and the same values widened into f. */
static void fill_bf16(flow_bf16_t *h, float *f, size_t n, uint64_t *st,
		      float scale)
{
	for (size_t i = 0; i < n; i++) {
		h[i] = flow_f32_to_bf16(uniform(st, scale));
		f[i] = flow_bf16_widen(h[i]);
	}
}

static void widen(float *f, const flow_bf16_t *h, size_t n)
{
	for (size_t i = 0; i < n; i++)
		f[i] = flow_bf16_widen(h[i]);
}

#define CASES 40

/* A bf16 activation with its fp32 copy, of n elements. */
typedef struct {
	flow_bf16_t *h;
	float *f;
} act_t;

static act_t act_new(size_t n, uint64_t *st, float scale)
{
	act_t a = { zalloc(n, sizeof(flow_bf16_t)), zalloc(n, sizeof(float)) };
	fill_bf16(a.h, a.f, n, st, scale);
	return a;
}

static void act_free(act_t *a)
{
	free(a->h);
	free(a->f);
}

static void test_ref_matmul_bf16_is_the_fp32_matmul_rounded(void **state)
{
	(void)state;
	for (uint64_t seed = 1; seed <= CASES; seed++) {
		uint64_t st = seed;
		size_t n = (size_t)splitmix64_range(&st, 1, 6);
		size_t in = (size_t)splitmix64_range(&st, 1, 9);
		size_t out = (size_t)splitmix64_range(&st, 1, 7);
		act_t inp = act_new(n * in, &st, 2.0f);
		act_t y = act_new(n * out, &st, 0.0f);
		act_t dout = act_new(n * out, &st, 1.0f);
		act_t dinp = act_new(n * in, &st, 1.0f); /* accumulated into */
		float *w = zalloc(out * in, sizeof(float));
		float *wr = zalloc(out * in, sizeof(float));
		float *bias = zalloc(out, sizeof(float));
		float *br = zalloc(out, sizeof(float));
		float *dw[2], *db[2];
		for (int k = 0; k < 2; k++) {
			dw[k] = zalloc(out * in, sizeof(float));
			db[k] = zalloc(out, sizeof(float));
		}
		fill(w, out * in, &st, 1.0f);
		fill(bias, out, &st, 1.0f);
		/* The fp32 kernel gets the weight and bias a bf16 GEMM reads. */
		for (size_t i = 0; i < out * in; i++)
			wr[i] = flow_round_bf16(w[i]);
		for (size_t i = 0; i < out; i++)
			br[i] = flow_round_bf16(bias[i]);
		fill(dw[0], out * in, &st, 1.0f);
		fill(db[0], out, &st, 1.0f);
		memcpy(dw[1], dw[0], out * in * sizeof(float));
		memcpy(db[1], db[0], out * sizeof(float));
		bool with_bias = splitmix64(&st) & 1;

		flow_ref_matmul_bf16_forward(y.h, NULL, inp.h, w,
					     with_bias ? bias : NULL, n, in, out);
		flow_ref_matmul_forward(y.f, inp.f, wr, with_bias ? br : NULL, n,
					in, out);
		check_bf16_of(y.h, y.f, n * out, "out", seed);

		flow_ref_matmul_bf16_backward(dinp.h, dw[1], db[1], NULL, dout.h,
					      inp.h, w, n, in, out);
		flow_ref_matmul_backward(dinp.f, dw[0], db[0], dout.f, inp.f, wr,
					 n, in, out);
		check_bf16_of(dinp.h, dinp.f, n * in, "dinp", seed);
		check_same(dw[1], dw[0], out * in, "dweight", seed);
		check_same(db[1], db[0], out, "dbias", seed);

		act_free(&inp);
		act_free(&y);
		act_free(&dout);
		act_free(&dinp);
		free(w);
		free(wr);
		free(bias);
		free(br);
		for (int k = 0; k < 2; k++) {
			free(dw[k]);
			free(db[k]);
		}
	}
}

/* Each operand as the contract has it: the weight and the bias rounded
 * to bf16, and the sum rounded once.  out = 1 * bf16(w0) + bf16(bias)
 * with bias 2^-8 + 2^-30: bf16(bias) = 2^-8, so 1 + 2^-8, the midpoint of
 * 1 and 1 + 2^-7, which ties to 1; the unrounded bias would be just
 * above it, 1 + 2^-7.  The second column's weights 1 + 2^-9 + 2^-20 and
 * 1 give 1 - 1 = 0 only when rounded. */
static void test_ref_matmul_bf16_by_hand(void **state)
{
	const flow_bf16_t inp[2] = { flow_f32_to_bf16(1.0f),
				     flow_f32_to_bf16(-1.0f) };
	const float weight[4] = { 1.0f, 0.0f, 1.0f + 0x1p-9f + 0x1p-20f, 1.0f };
	const float bias[2] = { 0x1p-8f + 0x1p-30f, 0.0f };
	flow_bf16_t out[2], dinp[2] = { flow_f32_to_bf16(1.0f), 0 };
	const flow_bf16_t dout[2] = { flow_f32_to_bf16(0x1p-8f), 0 };
	float dw[4] = { 0.5f, 0, 0, 0 }, db[2] = { 0, 0 };

	(void)state;
	flow_ref_matmul_bf16_forward(out, NULL, inp, weight, bias, 1, 2, 2);
	assert_true(flow_bf16_widen(out[0]) == 1.0f);
	assert_true(flow_bf16_widen(out[1]) == 0.0f);

	/* dinp[0] = bf16(1 + 2^-8 * 1) ties to 1; dinp[1] = bf16(0 + 2^-8 *
	 * 0): the rounded weight's second column; dweight, dbias fp32. */
	flow_ref_matmul_bf16_backward(dinp, dw, db, NULL, dout, inp, weight, 1,
				      2, 2);
	assert_true(flow_bf16_widen(dinp[0]) == 1.0f);
	assert_true(flow_bf16_widen(dinp[1]) == 0.0f);
	assert_true(dw[0] == 0.5f + 0x1p-8f && dw[1] == -0x1p-8f);
	assert_true(dw[2] == 0.0f && dw[3] == 0.0f);
	assert_true(db[0] == 0x1p-8f && db[1] == 0.0f);
	assert_int_equal(flow_ref_matmul_bf16_scratch_bound(1, 2, 2), 0);
}

/* pre as matmul_bf16_forward writes it; out GELU's of that rounded pre. */
static void test_ref_matmul_gelu_bf16_is_gelu_of_the_stored_pre(void **state)
{
	(void)state;
	for (uint64_t seed = 1; seed <= CASES; seed++) {
		uint64_t st = seed;
		size_t n = (size_t)splitmix64_range(&st, 1, 5);
		size_t in = (size_t)splitmix64_range(&st, 1, 8);
		size_t out = (size_t)splitmix64_range(&st, 1, 6);
		act_t inp = act_new(n * in, &st, 2.0f);
		act_t pre = act_new(n * out, &st, 0.0f);
		act_t y = act_new(n * out, &st, 0.0f);
		flow_bf16_t *want = zalloc(n * out, sizeof(flow_bf16_t));
		float *w = zalloc(out * in, sizeof(float));
		float *bias = zalloc(out, sizeof(float));
		fill(w, out * in, &st, 1.0f);
		fill(bias, out, &st, 1.0f);

		flow_ref_matmul_gelu_bf16_forward(pre.h, y.h, NULL, inp.h, w,
						  bias, n, in, out);
		flow_ref_matmul_bf16_forward(want, NULL, inp.h, w, bias, n, in,
					     out);
		assert_memory_equal(pre.h, want, n * out * sizeof(flow_bf16_t));
		widen(pre.f, pre.h, n * out);
		flow_ref_gelu_forward(y.f, pre.f, n * out);
		check_bf16_of(y.h, y.f, n * out, "out", seed);

		act_free(&inp);
		act_free(&pre);
		act_free(&y);
		free(want);
		free(w);
		free(bias);
	}
}

static void test_ref_layernorm_bf16_is_the_fp32_layernorm_rounded(void **state)
{
	(void)state;
	for (uint64_t seed = 1; seed <= CASES; seed++) {
		uint64_t st = seed;
		size_t n = (size_t)splitmix64_range(&st, 1, 6);
		size_t C = (size_t)splitmix64_range(&st, 1, 12);
		float *inp = zalloc(n * C, sizeof(float));
		float *w = zalloc(C, sizeof(float)), *b = zalloc(C, sizeof(float));
		float stat[2][2][6]; /* [kernel][mean, rstd][row] */
		float *g[2][3];      /* [kernel][dinp, dweight, dbias] */
		act_t y = act_new(n * C, &st, 0.0f);
		act_t dout = act_new(n * C, &st, 1.0f);
		size_t len[3] = { n * C, C, C };
		fill(inp, n * C, &st, 3.0f);
		fill(w, C, &st, 1.0f);
		fill(b, C, &st, 1.0f);
		for (int j = 0; j < 3; j++) {
			g[0][j] = zalloc(len[j], sizeof(float));
			g[1][j] = zalloc(len[j], sizeof(float));
			fill(g[0][j], len[j], &st, 1.0f);
			memcpy(g[1][j], g[0][j], len[j] * sizeof(float));
		}

		flow_ref_layernorm_bf16_forward(y.h, stat[1][0], stat[1][1], inp,
						w, b, n, C);
		flow_ref_layernorm_forward(y.f, stat[0][0], stat[0][1], inp, w, b,
					   n, C);
		check_bf16_of(y.h, y.f, n * C, "out", seed);
		check_same(stat[1][0], stat[0][0], n, "mean", seed);
		check_same(stat[1][1], stat[0][1], n, "rstd", seed);

		flow_ref_layernorm_bf16_backward(g[1][0], g[1][1], g[1][2], dout.h,
						 inp, w, stat[0][0], stat[0][1],
						 n, C);
		flow_ref_layernorm_backward(g[0][0], g[0][1], g[0][2], dout.f, inp,
					    w, stat[0][0], stat[0][1], n, C);
		check_same(g[1][0], g[0][0], n * C, "dinp", seed);
		check_same(g[1][1], g[0][1], C, "dweight", seed);
		check_same(g[1][2], g[0][2], C, "dbias", seed);

		act_free(&y);
		act_free(&dout);
		free(inp);
		free(w);
		free(b);
		for (int j = 0; j < 3; j++) {
			free(g[0][j]);
			free(g[1][j]);
		}
	}
}

static void test_ref_gelu_bf16_is_the_fp32_gelu_rounded(void **state)
{
	(void)state;
	for (uint64_t seed = 1; seed <= CASES; seed++) {
		uint64_t st = seed;
		size_t n = (size_t)splitmix64_range(&st, 1, 64);
		act_t inp = act_new(n, &st, 5.0f), y = act_new(n, &st, 0.0f);
		act_t dout = act_new(n, &st, 1.0f);
		act_t dinp = act_new(n, &st, 1.0f); /* accumulated into */

		flow_ref_gelu_bf16_forward(y.h, inp.h, n);
		flow_ref_gelu_forward(y.f, inp.f, n);
		check_bf16_of(y.h, y.f, n, "out", seed);
		flow_ref_gelu_bf16_backward(dinp.h, inp.h, dout.h, n);
		flow_ref_gelu_backward(dinp.f, inp.f, dout.f, n);
		check_bf16_of(dinp.h, dinp.f, n, "dinp", seed);

		act_free(&inp);
		act_free(&y);
		act_free(&dout);
		act_free(&dinp);
	}
}

/* The residual adds alone and fused with the layernorm: a, res, out of
 * the add, da, dres fp32, b and db bf16 (and the layernorm's out and
 * dout). */
static void test_ref_residual_bf16_is_the_fp32_residual_rounded(void **state)
{
	(void)state;
	for (uint64_t seed = 1; seed <= CASES; seed++) {
		uint64_t st = seed;
		size_t n = (size_t)splitmix64_range(&st, 1, 5);
		size_t C = (size_t)splitmix64_range(&st, 1, 9);
		size_t N = n * C;
		float *a = zalloc(N, sizeof(float));
		float *res[2], *ln[2][4]; /* ln: mean, rstd, dweight, dbias */
		float *dres[2], *da[2];
		float *w = zalloc(C, sizeof(float)), *bias = zalloc(C, sizeof(float));
		act_t b = act_new(N, &st, 2.0f), y = act_new(N, &st, 0.0f);
		act_t dout = act_new(N, &st, 1.0f);
		act_t db = act_new(N, &st, 1.0f); /* accumulated into */
		fill(a, N, &st, 2.0f);
		fill(w, C, &st, 1.0f);
		fill(bias, C, &st, 1.0f);
		for (int k = 0; k < 2; k++) {
			res[k] = zalloc(N, sizeof(float));
			dres[k] = zalloc(N, sizeof(float));
			da[k] = zalloc(N, sizeof(float));
			for (int j = 0; j < 4; j++)
				ln[k][j] = zalloc(j < 2 ? n : C, sizeof(float));
		}
		fill(dres[0], N, &st, 1.0f);
		fill(da[0], N, &st, 1.0f);
		memcpy(dres[1], dres[0], N * sizeof(float));
		memcpy(da[1], da[0], N * sizeof(float));

		flow_ref_residual_bf16_forward(res[1], a, b.h, N);
		flow_ref_residual_forward(res[0], a, b.f, N);
		check_same(res[1], res[0], N, "out", seed);
		flow_ref_residual_bf16_backward(da[1], db.h, dres[0], N);
		flow_ref_residual_backward(da[0], db.f, dres[0], N);
		check_same(da[1], da[0], N, "da", seed);
		check_bf16_of(db.h, db.f, N, "db", seed);
		widen(db.f, db.h, N); /* the same values again */
		memcpy(da[1], da[0], N * sizeof(float));

		flow_ref_residual_layernorm_bf16_forward(res[1], y.h, ln[1][0],
							 ln[1][1], a, b.h, w,
							 bias, n, C);
		flow_ref_residual_layernorm_forward(res[0], y.f, ln[0][0],
						    ln[0][1], a, b.f, w, bias, n,
						    C);
		check_same(res[1], res[0], N, "res", seed);
		check_bf16_of(y.h, y.f, N, "ln out", seed);
		check_same(ln[1][0], ln[0][0], n, "mean", seed);
		check_same(ln[1][1], ln[0][1], n, "rstd", seed);

		flow_ref_layernorm_residual_bf16_backward(
			dres[1], da[1], db.h, ln[1][2], ln[1][3], dout.h, res[0],
			w, ln[0][0], ln[0][1], n, C);
		flow_ref_layernorm_residual_backward(dres[0], da[0], db.f,
						     ln[0][2], ln[0][3], dout.f,
						     res[0], w, ln[0][0],
						     ln[0][1], n, C);
		check_same(dres[1], dres[0], N, "dres", seed);
		check_same(da[1], da[0], N, "fused da", seed);
		check_bf16_of(db.h, db.f, N, "fused db", seed);
		check_same(ln[1][2], ln[0][2], C, "dweight", seed);
		check_same(ln[1][3], ln[0][3], C, "dbias", seed);

		act_free(&b);
		act_free(&y);
		act_free(&dout);
		act_free(&db);
		free(a);
		free(w);
		free(bias);
		for (int k = 0; k < 2; k++) {
			free(res[k]);
			free(dres[k]);
			free(da[k]);
			for (int j = 0; j < 4; j++)
				free(ln[k][j]);
		}
	}
}

/* Accumulating is one rounding of g + dg: 1 + (2^-8 + 2^-31) lies above
 * the midpoint of 1 and 1 + 2^-7 and rounds up, where adding in float
 * first would round to the midpoint and tie down to 1. */
static void test_ref_bf16_gradients_accumulate_with_one_rounding(void **state)
{
	const float dout[2] = { 0x1p-8f + 0x1p-31f, 0x1p-8f };
	flow_bf16_t db[2] = { flow_f32_to_bf16(1.0f), flow_f32_to_bf16(1.0f) };
	float da[2] = { 1.0f, 1.0f };

	(void)state;
	flow_ref_residual_bf16_backward(da, db, dout, 2);
	assert_true(flow_bf16_widen(db[0]) == 1.0f + 0x1p-7f);
	assert_true(flow_bf16_widen(db[1]) == 1.0f); /* a tie: to even */
	assert_true(da[0] == 1.0f + 0x1p-8f && da[1] == 1.0f + 0x1p-8f);
	flow_ref_residual_bf16_backward(NULL, db, dout, 1);
	assert_true(flow_bf16_widen(db[0]) == 1.0f + 0x1p-7f + 0x1p-7f);
}

/* ---- attention ------------------------------------------------------------------ */

/* The twin rounds the probabilities P where they multiply v and dout, and
 * the score gradients dpre where they multiply k and q, so it is not the
 * fp32 kernel's double rounded once.  Its lse is the kernel's.  Each
 * other result is within 2^-8 |F| plus twice the most that rounding
 * those operands (by 2^-9 relative each) can move the sum:
 *   out[t]: 2^-9 sum_s P[t,s] |v[s]|, the fp32 forward pass on |v|;
 *   dv[s]:  2^-9 sum_t P[t,s] |dout[t]|, the fp32 backward pass's dv for
 *           |dout|;
 *   dq[t]:  2^-9 max_s |k[s]| R[t], and dk[s]: 2^-9 max_t |q[t]|
 *           sum_{t >= s} R[t], where R[t] bounds sum_s |dpre[t,s]|:
 *           2 scale sum_d |dout[t,d]| (sum_s P[t,s] |v[s,d]|), since
 *           |dpre| = scale P |datt - rowsum(P datt)|.
 * (2^-8 |F| covers both roundings of the result, to float and to bf16.) */
static bool attention_close(flow_bf16_t h, float f, double bound)
{
	return fabs((double)flow_bf16_widen(h) - (double)f) <=
	       0x1p-8 * fabs((double)f) + 2.0 * bound;
}

/* An attention case's sizes, and where its elements are. */
typedef struct {
	size_t B, T, C, NH, hs;
} attn_t;

/* Element d of head h's q (part 0), k (1) or v (2) at (b, t). */
static size_t attn_at(const attn_t *a, size_t b, size_t t, size_t part,
		       size_t h, size_t d)
{
	return (b * a->T + t) * 3 * a->C + part * a->C + h * a->hs + d;
}

/* R[t] of head h of batch row b, out_abs being sum_s P[t,s] |v[s]|. */
static double attn_r(const attn_t *a, const float *dout,
		     const float *out_abs, size_t b, size_t h, size_t t)
{
	size_t row = (b * a->T + t) * a->C + h * a->hs;
	double r = 0.0;

	for (size_t e = 0; e < a->hs; e++)
		r += fabs((double)dout[row + e]) * out_abs[row + e];
	return 2.0 / sqrt((double)a->hs) * r;
}

/* The largest |q| (part 0) or |k| (1) of channel d of the head over
 * positions [t0, t1). */
static double attn_max(const attn_t *a, const float *qkv, size_t part,
		       size_t b, size_t h, size_t d, size_t t0, size_t t1)
{
	double m = 0.0;

	for (size_t t = t0; t < t1; t++)
		m = fmax(m, fabs((double)qkv[attn_at(a, b, t, part, h, d)]));
	return m;
}

static void check_attention_grads(const attn_t *a, const act_t *dqkv,
				  const float *qkv, const float *dout,
				  const float *out_abs, const float *dabs,
				  uint64_t seed)
{
	size_t T = a->T, C = a->C;

	/* Each element of out names a (b, t, h, d) of dqkv's three parts. */
	for (size_t i = 0; i < a->B * T * C; i++) {
		size_t b = i / (T * C), t = i / C % T;
		size_t h = i % C / a->hs, d = i % a->hs;
		size_t at = attn_at(a, b, t, 0, h, d);
		double tail = 0.0;
		for (size_t u = t; u < T; u++)
			tail += attn_r(a, dout, out_abs, b, h, u);
		double bound[3] = {
			0x1p-9 * attn_max(a, qkv, 1, b, h, d, 0, t + 1) *
				attn_r(a, dout, out_abs, b, h, t),
			0x1p-9 * attn_max(a, qkv, 0, b, h, d, t, T) * tail,
			0x1p-9 * dabs[at + 2 * C],
		};
		for (size_t part = 0; part < 3; part++) {
			size_t j = at + part * C;
			if (!attention_close(dqkv->h[j], dqkv->f[j], bound[part]))
				fail_msg("seed %#llx: dqkv[%zu] is %g, the fp32 "
					 "kernel's %.9g",
					 (unsigned long long)seed, j,
					 flow_bf16_widen(dqkv->h[j]),
					 dqkv->f[j]);
		}
	}
}

static void test_ref_attention_bf16_is_within_its_rounding(void **state)
{
	(void)state;
	for (uint64_t seed = 1; seed <= CASES; seed++) {
		uint64_t st = seed;
		attn_t a;
		a.B = (size_t)splitmix64_range(&st, 1, 2);
		a.T = (size_t)splitmix64_range(&st, 1, 7);
		a.NH = (size_t)splitmix64_range(&st, 1, 3);
		a.hs = (size_t)splitmix64_range(&st, 1, 4);
		a.C = a.NH * a.hs;
		size_t B = a.B, T = a.T, C = a.C, NH = a.NH;
		size_t N = B * T * C, L = B * NH * T;
		size_t bytes = flow_ref_attention_scratch_bound(B, T, C, NH, true);
		act_t qkv = act_new(3 * N, &st, 2.0f);
		act_t y = act_new(N, &st, 0.0f), dout = act_new(N, &st, 1.0f);
		act_t dqkv = act_new(3 * N, &st, 0.5f); /* accumulated into */
		float *lse[3], *abs_qkv = zalloc(3 * N, sizeof(float));
		float *out_abs = zalloc(N, sizeof(float));
		float *abs_dout = zalloc(N, sizeof(float));
		float *dabs = zalloc(3 * N, sizeof(float));
		void *scratch = zalloc(bytes, 1);
		for (int k = 0; k < 3; k++)
			lse[k] = zalloc(L, sizeof(float));
		assert_int_equal(bytes, flow_ref_attention_scratch_bound(
						B, T, C, NH, false));
		for (size_t i = 0; i < 3 * N; i++) /* v -> |v| */
			abs_qkv[i] = i % (3 * C) >= 2 * C ? fabsf(qkv.f[i]) :
							    qkv.f[i];
		for (size_t i = 0; i < N; i++)
			abs_dout[i] = fabsf(dout.f[i]);

		flow_ref_attention_bf16_forward(y.h, lse[1], scratch, qkv.h, B, T,
						C, NH);
		flow_ref_attention_forward(y.f, lse[0], scratch, qkv.f, B, T, C,
					   NH);
		flow_ref_attention_forward(out_abs, lse[2], scratch, abs_qkv, B,
					   T, C, NH);
		check_same(lse[1], lse[0], L, "lse", seed);
		for (size_t i = 0; i < N; i++)
			if (!attention_close(y.h[i], y.f[i], 0x1p-9 * out_abs[i]))
				fail_msg("seed %#llx: out[%zu] is %g, the fp32 "
					 "kernel's %.9g",
					 (unsigned long long)seed, i,
					 flow_bf16_widen(y.h[i]), y.f[i]);

		flow_ref_attention_bf16_backward(dqkv.h, scratch, dout.h, qkv.h,
						 lse[0], y.h, B, T, C, NH);
		flow_ref_attention_backward(dqkv.f, scratch, dout.f, qkv.f,
					    lse[0], y.f, B, T, C, NH);
		/* Its dv part: sum_t P[t,s] |dout[t]|. */
		flow_ref_attention_backward(dabs, scratch, abs_dout, qkv.f,
					    lse[0], y.f, B, T, C, NH);
		check_attention_grads(&a, &dqkv, qkv.f, dout.f, out_abs, dabs,
				      seed);

		act_free(&qkv);
		act_free(&y);
		act_free(&dout);
		act_free(&dqkv);
		for (int k = 0; k < 3; k++)
			free(lse[k]);
		free(abs_qkv);
		free(out_abs);
		free(abs_dout);
		free(dabs);
		free(scratch);
	}
}

static void qkv_bf16(flow_bf16_t *h, const float *f, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h[i] = flow_f32_to_bf16(f[i]);
}

/* The probabilities where they multiply, by hand (B 1, C = NH = 1, scale
 * 1): position 1 scores k0 = 2^-10 and k1 = 0, so P = sigmoid(2^-10) =
 * 1/2 + 2^-12 (less 2^-32 or so) and 1/2 - 2^-12, both 1/2 in bf16.  With
 * v = (1, -1), out1 = P0 - P1 is 0 in the twin and 2^-11 unrounded; with
 * dout = (1, -2), dv0 = 1 * 1 - 2 P0 is 0 in the twin, -2^-11
 * unrounded. */
static void test_ref_attention_bf16_rounds_the_probabilities(void **state)
{
	const float qkv_f[6] = { 0.0f, 0x1p-10f, 1.0f, 1.0f, 0.0f, -1.0f };
	const float dout_f[2] = { 1.0f, -2.0f };
	flow_bf16_t qkv[6], dout[2], out[2], dqkv[6] = { 0 };
	float lse[2], out32[2], dqkv32[6] = { 0 };
	double scratch[8];

	(void)state;
	qkv_bf16(qkv, qkv_f, 6);
	qkv_bf16(dout, dout_f, 2);
	flow_ref_attention_bf16_forward(out, lse, scratch, qkv, 1, 2, 1, 1);
	assert_true(flow_bf16_widen(out[0]) == 1.0f);
	assert_true(flow_bf16_widen(out[1]) == 0.0f);
	flow_ref_attention_forward(out32, lse, scratch, qkv_f, 1, 2, 1, 1);
	assert_close(out32[1], 0x1p-11, 1e-9);

	flow_ref_attention_bf16_backward(dqkv, scratch, dout, qkv, lse, out, 1,
					 2, 1, 1);
	assert_true(flow_bf16_widen(dqkv[2]) == 0.0f); /* dv0 */
	assert_true(flow_bf16_widen(dqkv[5]) == -1.0f); /* dv1 = -2 * 1/2 */
	flow_ref_attention_backward(dqkv32, scratch, dout_f, qkv_f, lse, out32,
				    1, 2, 1, 1);
	/* 1 - 2 P0, P0 off by the float lse's rounding (~2^-25 relative). */
	assert_close(dqkv32[2], -0x1p-11, 1e-7);
}

/* The score gradients where they multiply, by hand (B 1, T 3, C = NH = 1,
 * scale 1; only position 2 has a gradient, dout 1).  With q2 = 1, k = (1.5,
 * 2, 0) and v = (3, 0.25, -1), position 2's dpre = P (v - P.v) is
 * (0.65796, -0.49398, -0.16397), in bf16 (0.65625, -0.494140625,
 * -0.1640625), each well inside its rounding interval.  dq2 = 1.5 dpre0 +
 * 2 dpre1 cancels: -2^-8 exactly in the twin, -0.0010321 unrounded.
 * dk = dpre q2 shows the rounded values themselves. */
static void test_ref_attention_bf16_rounds_the_score_gradients(void **state)
{
	const float qkv_f[9] = { 0.0f, 1.5f, 3.0f,  0.0f, 2.0f,
				 0.25f, 1.0f, 0.0f, -1.0f };
	const float dout_f[3] = { 0.0f, 0.0f, 1.0f };
	flow_bf16_t qkv[9], dout[3], out[3], dqkv[9] = { 0 };
	float lse[3], out32[3], dqkv32[9] = { 0 };
	double scratch[18];

	(void)state;
	assert_true(flow_ref_attention_scratch_bound(1, 3, 1, 1, true) <=
		    sizeof(scratch));
	qkv_bf16(qkv, qkv_f, 9);
	qkv_bf16(dout, dout_f, 3);
	flow_ref_attention_bf16_forward(out, lse, scratch, qkv, 1, 3, 1, 1);
	flow_ref_attention_bf16_backward(dqkv, scratch, dout, qkv, lse, out, 1,
					 3, 1, 1);
	assert_true(flow_bf16_widen(dqkv[6]) == -0x1p-8f);      /* dq2 */
	assert_true(flow_bf16_widen(dqkv[1]) == 0.65625f);      /* dk0 */
	assert_true(flow_bf16_widen(dqkv[4]) == -0.494140625f); /* dk1 */
	assert_true(flow_bf16_widen(dqkv[7]) == -0.1640625f);   /* dk2 */
	assert_true(flow_bf16_widen(dqkv[0]) == 0.0f);          /* dq0 */

	flow_ref_attention_forward(out32, lse, scratch, qkv_f, 1, 3, 1, 1);
	flow_ref_attention_backward(dqkv32, scratch, dout_f, qkv_f, lse, out32,
				    1, 3, 1, 1);
	assert_close(dqkv32[6], -0.001032101064470714, 1e-6);
}

/* ---- cross-entropy -------------------------------------------------------------- */

/* Targets in [-1, V): a row of target -1 is ignored. */
static void fill_targets(int32_t *targets, size_t n, size_t V, uint64_t *st)
{
	for (size_t r = 0; r < n; r++)
		targets[r] = (int32_t)splitmix64_range(st, -1, (int64_t)V - 1);
}

static void test_ref_cross_entropy_bf16_is_the_fp32_one_rounded(void **state)
{
	(void)state;
	for (uint64_t seed = 1; seed <= CASES; seed++) {
		uint64_t st = seed;
		size_t n = (size_t)splitmix64_range(&st, 1, 5);
		size_t V = (size_t)splitmix64_range(&st, 1, 20);
		size_t Vp = V + (size_t)splitmix64_range(&st, 0, 4);
		act_t logits = act_new(n * Vp, &st, 6.0f);
		int32_t *targets = zalloc(n, sizeof(int32_t));
		float *losses[2] = { zalloc(n, sizeof(float)),
				     zalloc(n, sizeof(float)) };
		float dloss = uniform(&st, 1.0f);
		fill_targets(targets, n, V, &st);

		flow_ref_cross_entropy_bf16_forward_backward(
			losses[1], logits.h, targets, n, V, Vp, dloss);
		flow_ref_cross_entropy_forward_backward(losses[0], logits.f,
							targets, n, V, Vp, dloss);
		check_same(losses[1], losses[0], n, "losses", seed);
		check_bf16_of(logits.h, logits.f, n * Vp, "dlogits", seed);

		act_free(&logits);
		free(targets);
		free(losses[0]);
		free(losses[1]);
	}
}

/* Whether a and b are the same or neighbouring bf16 values. */
static bool bf16_neighbours(flow_bf16_t a, flow_bf16_t b)
{
	double x = flow_bf16_widen(a), y = flow_bf16_widen(b);
	return fabs(x - y) <= 0x1p-7 * fmax(fabs(x), fabs(y)) + 0x1p-133;
}

/* The three split steps over p column shards of bf16 logits (member q's
 * block of n rows of s[q].cols at element q n cols), with the
 * collectives' part done as they would: the maxima gathered in member
 * order, the sums added in float in member order; the members' partial
 * losses added into loss. */
static void split_run(flow_bf16_t *shard, const flow_logits_shard_t *s,
		      size_t p, const int32_t *targets, float dloss,
		      float *max, double *loss)
{
	size_t n = s[0].n, block = n * s[0].cols;
	float *gathered = zalloc(p * n, sizeof(float));
	float *sums = zalloc(p * n, sizeof(float));
	float *total = zalloc(n, sizeof(float));
	float *part = zalloc(n, sizeof(float));

	for (size_t q = 0; q < p; q++)
		flow_ref_cross_entropy_bf16_split_max(gathered + q * n,
						      shard + q * block, &s[q]);
	for (size_t q = 0; q < p; q++)
		flow_ref_cross_entropy_bf16_split_sums(sums + q * n, max + q * n,
						       gathered, p,
						       shard + q * block, &s[q]);
	for (size_t r = 0; r < n; r++) {
		total[r] = sums[r];
		for (size_t q = 1; q < p; q++)
			total[r] += sums[q * n + r];
		loss[r] = 0.0;
	}
	for (size_t q = 0; q < p; q++) {
		flow_ref_cross_entropy_bf16_split_finish(part, shard + q * block,
							 targets, max + q * n,
							 total, &s[q], dloss);
		for (size_t r = 0; r < n; r++)
			loss[r] += part[r];
	}
	free(gathered);
	free(sums);
	free(total);
	free(part);
}

/* The split steps against the whole row.  They round only the sums more
 * than the whole row does (to float, then p - 1 float additions: relative
 * 2^-23 p, at most 2^-21, in all), so:
 * - every member's max is the row's largest real logit, exactly;
 * - the loss is the whole row's to 2^-20 (1 + |loss| + |max|);
 * - a gradient dloss (p - onehot) moves by at most |dloss| 2^-21 before
 *   its one rounding: it is the whole row's bf16 value or a neighbour. */
static void test_ref_cross_entropy_bf16_split_sums_to_the_row(void **state)
{
	(void)state;
	for (uint64_t seed = 1; seed <= CASES; seed++) {
		uint64_t st = seed;
		size_t n = (size_t)splitmix64_range(&st, 1, 5);
		size_t p = (size_t)splitmix64_range(&st, 1, 4);
		size_t cols = (size_t)splitmix64_range(&st, 1, 6);
		size_t Vp = p * cols;
		size_t V = (size_t)splitmix64_range(&st, 1, (int64_t)Vp);
		act_t row = act_new(n * Vp, &st, 6.0f);
		flow_bf16_t *shard = zalloc(n * Vp, sizeof(flow_bf16_t));
		int32_t *targets = zalloc(n, sizeof(int32_t));
		float *whole = zalloc(n, sizeof(float));
		float *max = zalloc(p * n, sizeof(float));
		double *loss = zalloc(n, sizeof(double));
		float dloss = uniform(&st, 1.0f);
		flow_logits_shard_t s[4];
		fill_targets(targets, n, V, &st);

		/* Member q holds columns [q cols, (q + 1) cols) of each row. */
		for (size_t q = 0; q < p; q++) {
			size_t c0 = q * cols;
			s[q] = (flow_logits_shard_t){
				.n = n,
				.cols = cols,
				.valid = V > c0 ? (V - c0 < cols ? V - c0 : cols) : 0,
				.c0 = (int64_t)c0,
				.first = q == 0,
			};
			for (size_t r = 0; r < n; r++)
				memcpy(shard + q * n * cols + r * cols,
				       row.h + r * Vp + c0,
				       cols * sizeof(flow_bf16_t));
		}
		split_run(shard, s, p, targets, dloss, max, loss);
		flow_ref_cross_entropy_bf16_forward_backward(whole, row.h, targets,
							     n, V, Vp, dloss);

		for (size_t r = 0; r < n; r++) {
			float mx = -INFINITY;
			for (size_t j = 0; j < V; j++)
				mx = fmaxf(mx, row.f[r * Vp + j]);
			for (size_t q = 0; q < p; q++)
				assert_true(max[q * n + r] == mx);
			double tol = 0x1p-20 * (1.0 + fabs((double)whole[r]) +
						fabs((double)mx));
			if (fabs(loss[r] - (double)whole[r]) > tol)
				fail_msg("seed %#llx: row %zu's loss is %.9g "
					 "split, %.9g whole",
					 (unsigned long long)seed, r, loss[r],
					 whole[r]);
			for (size_t j = 0; j < Vp; j++) {
				flow_bf16_t got = shard[(j / cols) * n * cols +
							r * cols + j % cols];
				if (!bf16_neighbours(got, row.h[r * Vp + j]))
					fail_msg("seed %#llx: dlogits[%zu][%zu] "
						 "is %g split, %g whole",
						 (unsigned long long)seed, r, j,
						 flow_bf16_widen(got),
						 flow_bf16_widen(row.h[r * Vp + j]));
			}
		}

		act_free(&row);
		free(shard);
		free(targets);
		free(whole);
		free(max);
		free(loss);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ref_matmul_forward_2x3_by_hand),
		cmocka_unit_test(test_ref_matmul_backward_accumulates_by_hand),
		cmocka_unit_test(test_ref_embedding_sums_repeated_tokens),
		cmocka_unit_test(test_ref_layernorm_of_a_known_row),
		cmocka_unit_test(test_ref_gelu_known_values),
		cmocka_unit_test(test_ref_attention_causal_t2_by_hand),
		cmocka_unit_test(test_ref_attention_backward_t2_by_hand),
		cmocka_unit_test(test_ref_residual_adds_and_accumulates),
		cmocka_unit_test(test_ref_cross_entropy_of_uniform_logits_is_log_v),
		cmocka_unit_test(test_ref_adamw_one_step_by_hand),
		cmocka_unit_test(test_ref_clip_grad_norm_3_4_5),
		cmocka_unit_test(test_ref_bf16_narrow_rounds_once_at_every_midpoint),
		cmocka_unit_test(test_ref_bf16_narrow_of_a_float_is_f32_to_bf16),
		cmocka_unit_test(test_ref_bf16_narrow_matches_the_double_bits),
		cmocka_unit_test(test_ref_matmul_bf16_is_the_fp32_matmul_rounded),
		cmocka_unit_test(test_ref_matmul_bf16_by_hand),
		cmocka_unit_test(test_ref_matmul_gelu_bf16_is_gelu_of_the_stored_pre),
		cmocka_unit_test(test_ref_layernorm_bf16_is_the_fp32_layernorm_rounded),
		cmocka_unit_test(test_ref_gelu_bf16_is_the_fp32_gelu_rounded),
		cmocka_unit_test(test_ref_residual_bf16_is_the_fp32_residual_rounded),
		cmocka_unit_test(test_ref_bf16_gradients_accumulate_with_one_rounding),
		cmocka_unit_test(test_ref_attention_bf16_is_within_its_rounding),
		cmocka_unit_test(test_ref_attention_bf16_rounds_the_probabilities),
		cmocka_unit_test(test_ref_attention_bf16_rounds_the_score_gradients),
		cmocka_unit_test(test_ref_cross_entropy_bf16_is_the_fp32_one_rounded),
		cmocka_unit_test(test_ref_cross_entropy_bf16_split_sums_to_the_row),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
