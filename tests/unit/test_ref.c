/* The reference kernels (flow/kernels_ref.h) on tiny cases computed by hand:
 * they are the yardstick flow-bench checks the optimised kernels against,
 * so they are checked against arithmetic, not against other code.
 * Tolerance: 1e-6 absolute unless a case says otherwise (every expected
 * value is exact or given to 7+ significant digits). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <flow/kernels_ref.h>

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

/* bf16 keeps 8 significant bits: 1 + 2^-9 rounds down to 1, 1 + 3*2^-9
 * up to 1 + 2^-7, and 3 + 2^-8 down to 3; the bias is not rounded.  dout
 * rounds as the operands do. */
static void test_ref_matmul_bf16_rounds_operands_by_hand(void **state)
{
	const float inp[2] = { 1.0f + 0x1p-9f, 1.0f + 3 * 0x1p-9f }; /* 1x2 */
	const float weight[2] = { 3.0f + 0x1p-8f, 1.0f };             /* 1x2 */
	const float bias[1] = { 0x1p-12f };
	float out[1], dinp[2] = { 0, 0 }, dw[2] = { 0, 0 }, db[1] = { 0 };
	const float dout[1] = { 1.0f + 0x1p-9f };
	float scratch[64];

	(void)state;
	assert_true(flow_ref_matmul_bf16_scratch_bound(1, 2, 1) <= sizeof(scratch));
	flow_ref_matmul_bf16_forward(out, scratch, inp, weight, bias, 1, 2, 1);
	/* 1 * 3 + (1 + 2^-7) * 1 + 2^-12 */
	assert_true(out[0] == 4.0f + 0x1p-7f + 0x1p-12f);
	flow_ref_matmul_bf16_backward(dinp, dw, db, scratch, dout, inp, weight,
				      1, 2, 1);
	/* dout rounds to 1: dinp = weight rounded, dw = inp rounded; dbias
	 * sums the unrounded dout. */
	assert_true(dinp[0] == 3.0f && dinp[1] == 1.0f);
	assert_true(dw[0] == 1.0f && dw[1] == 1.0f + 0x1p-7f);
	assert_true(db[0] == 1.0f + 0x1p-9f);
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
	flow_ref_attention_forward(out, lse, scratch, false, attn_qkv, 1, 2, 1,
				   1);
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
	flow_ref_attention_backward(dqkv, scratch, false, dout, attn_qkv, lse,
				    NULL, 1, 2, 1, 1);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ref_matmul_forward_2x3_by_hand),
		cmocka_unit_test(test_ref_matmul_bf16_rounds_operands_by_hand),
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
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
