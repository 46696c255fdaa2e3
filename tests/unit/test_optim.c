/* The optimizer: the learning-rate schedule's formula, AdamW over a graph
 * (decay only where the parameter says so, moments per parameter) and
 * global-norm clipping over every parameter gradient. */
#include <config.h>

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <flow/model.h>
#include <flow/optim.h>

static void test_optim_schedule_warms_up_then_decays_by_cosine(void **state)
{
	(void)state;
	flow_lr_schedule_t s = { .lr = 1e-3, .min_lr = 1e-4, .warmup = 4,
				 .total = 10 };
	assert_true(flow_lr_at(&s, 1) == (float)(1e-3 / 4));
	assert_true(flow_lr_at(&s, 4) == (float)1e-3);
	/* Half way through the decay: the mean of lr and min_lr. */
	assert_true(flow_lr_at(&s, 7) ==
		    (float)(1e-4 + (1e-3 - 1e-4) * (1 + cos(M_PI / 2)) / 2));
	assert_true(flow_lr_at(&s, 10) == (float)1e-4);
	assert_true(flow_lr_at(&s, 5) ==
		    (float)(1e-4 + (1e-3 - 1e-4) * (1 + cos(M_PI / 6)) / 2));
	/* Past the end it stays at min_lr. */
	assert_true(flow_lr_at(&s, 12) == (float)1e-4);
	/* Monotone after warmup. */
	for (uint64_t i = 5; i <= 10; i++)
		assert_true(flow_lr_at(&s, i) <= flow_lr_at(&s, i - 1));

	flow_lr_schedule_t constant = { .lr = 3e-4, .min_lr = 3e-4,
					.total = 5 };
	for (uint64_t i = 1; i <= 5; i++)
		assert_true(flow_lr_at(&constant, i) == (float)3e-4);
	/* No decay phase at all: warmup covers every step. */
	flow_lr_schedule_t warm = { .lr = 1e-3, .min_lr = 0, .warmup = 3,
				    .total = 3 };
	assert_true(flow_lr_at(&warm, 3) == (float)1e-3);
}

typedef struct fixture {
	flow_graph_t g;
	flow_exec_t *x;
	flow_adamw_t *opt;
} fixture_t;

static int setup(void **state)
{
	fixture_t *f = calloc(1, sizeof *f);
	flow_gpt_config_t c;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_adamw_params_t hp = { .beta1 = 0.9f, .beta2 = 0.95f,
				   .eps = 1e-8f, .weight_decay = 0.1f };
	if (!f || flow_gpt_parse("gpt:layers=1,heads=2,dim=8,vocab=20,seq=4",
				 &c, &diag) != FLOW_OK)
		return -1;
	flow_graph_init(&f->g);
	if (flow_gpt_build(&c, 2, 4, &f->g, &diag) != FLOW_OK ||
	    flow_graph_backward(&f->g, &diag) != FLOW_OK ||
	    flow_exec_new(&f->g, FLOW_KERNELS_CPU, &f->x, &diag) != FLOW_OK ||
	    flow_adamw_new(f->x, &hp, &f->opt, &diag) != FLOW_OK)
		return -1;
	assert_int_equal(flow_exec_init_params(f->x, 7, NULL), FLOW_OK);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fixture_t *f = *state;
	flow_adamw_free(f->opt);
	flow_exec_free(f->x);
	flow_graph_release(&f->g);
	free(f);
	return 0;
}

/* Set every gradient to a pattern and return the sum of squares. */
static double fill_grads(fixture_t *f, float value)
{
	double ss = 0.0;
	const int *params;
	size_t n = flow_adamw_params(f->opt, &params);
	for (size_t i = 0; i < n; i++) {
		const flow_graph_tensor_t *p = &f->g.tensors[params[i]];
		float *g = flow_exec_tensor(f->x, p->grad);
		size_t numel = flow_graph_tensor_numel(&f->g, params[i]);
		for (size_t j = 0; j < numel; j++) {
			g[j] = value * (float)((j % 7) + 1);
			ss += (double)g[j] * g[j];
		}
	}
	return ss;
}

static void test_optim_lists_every_parameter_with_its_moments(void **state)
{
	fixture_t *f = *state;
	const int *params;
	size_t n = flow_adamw_params(f->opt, &params);
	size_t expect = 0;
	for (size_t t = 0; t < f->g.ntensors; t++)
		expect += f->g.tensors[t].role == FLOW_ROLE_PARAM;
	assert_int_equal(n, expect);
	for (size_t i = 0; i < n; i++) {
		assert_non_null(flow_adamw_m(f->opt, params[i]));
		assert_non_null(flow_adamw_v(f->opt, params[i]));
	}
	/* Not a parameter: no moments. */
	assert_null(flow_adamw_m(f->opt, flow_graph_find(&f->g, "tokens")));
}

/* One step equals the AdamW kernel applied tensor by tensor with each
 * tensor's decay flag. */
static void test_optim_step_matches_the_adamw_kernel(void **state)
{
	fixture_t *f = *state;
	fill_grads(f, 0.01f);
	int w = flow_graph_find(&f->g, "h.0.mlp.c_fc.weight");
	int b = flow_graph_find(&f->g, "h.0.ln_1.weight");
	size_t nw = flow_graph_tensor_numel(&f->g, w);
	size_t nb = flow_graph_tensor_numel(&f->g, b);
	float *pw = malloc(nw * sizeof(float)), *pb = malloc(nb * sizeof(float));
	float *m = calloc(nw, sizeof(float)), *v = calloc(nw, sizeof(float));
	float *mb = calloc(nb, sizeof(float)), *vb = calloc(nb, sizeof(float));
	memcpy(pw, flow_exec_tensor(f->x, w), nw * sizeof(float));
	memcpy(pb, flow_exec_tensor(f->x, b), nb * sizeof(float));
	flow_adamw_params_t hp = { .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f,
				   .eps = 1e-8f, .weight_decay = 0.1f };
	flow_cpu_adamw_update(pw, flow_exec_tensor(f->x, f->g.tensors[w].grad),
			      m, v, nw, &hp, 1, true);
	flow_cpu_adamw_update(pb, flow_exec_tensor(f->x, f->g.tensors[b].grad),
			      mb, vb, nb, &hp, 1, false);

	flow_adamw_step(f->opt, 1, 1e-2f);
	assert_memory_equal(flow_exec_tensor(f->x, w), pw, nw * sizeof(float));
	assert_memory_equal(flow_adamw_m(f->opt, w), m, nw * sizeof(float));
	assert_memory_equal(flow_adamw_v(f->opt, w), v, nw * sizeof(float));
	assert_memory_equal(flow_exec_tensor(f->x, b), pb, nb * sizeof(float));
	free(pw), free(pb), free(m), free(v), free(mb), free(vb);
}

/* A zero gradient moves a decayed weight (by lr * wd * w) and leaves an
 * undecayed layernorm weight alone. */
static void test_optim_decays_only_the_parameters_marked_for_it(void **state)
{
	fixture_t *f = *state;
	fill_grads(f, 0.0f);
	int w = flow_graph_find(&f->g, "h.0.attn.c_attn.weight");
	int ln = flow_graph_find(&f->g, "h.0.ln_2.weight");
	float w0 = ((float *)flow_exec_tensor(f->x, w))[3];
	float ln0 = ((float *)flow_exec_tensor(f->x, ln))[3];
	flow_adamw_step(f->opt, 1, 0.5f);
	assert_true(((float *)flow_exec_tensor(f->x, w))[3] ==
		    w0 * (1.0f - 0.5f * 0.1f));
	assert_true(((float *)flow_exec_tensor(f->x, ln))[3] == ln0);
}

static void test_optim_clip_scales_gradients_to_the_global_norm(void **state)
{
	fixture_t *f = *state;
	double ss = fill_grads(f, 0.5f);
	float norm = (float)sqrt(ss);
	/* Measure only. */
	assert_true(fabsf(flow_adamw_clip_grad_norm(f->opt, 0) - norm) <=
		    1e-6f * norm);
	/* Below the limit: unchanged. */
	assert_true(fabsf(flow_adamw_clip_grad_norm(f->opt, 2 * norm) - norm) <=
		    1e-6f * norm);
	/* Above: every gradient scaled so the norm becomes the limit. */
	float got = flow_adamw_clip_grad_norm(f->opt, 1.0f);
	assert_true(fabsf(got - norm) <= 1e-6f * norm);
	float after = flow_adamw_clip_grad_norm(f->opt, 0);
	assert_true(fabsf(after - 1.0f) < 1e-5f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_optim_schedule_warms_up_then_decays_by_cosine),
		cmocka_unit_test_setup_teardown(test_optim_lists_every_parameter_with_its_moments, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_optim_step_matches_the_adamw_kernel, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_optim_decays_only_the_parameters_marked_for_it, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_optim_clip_scales_gradients_to_the_global_norm, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
