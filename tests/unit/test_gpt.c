/* The GPT-2 builder: spec parsing, the graph it builds (names, shapes,
 * init, decay), its sizes, and a forward pass at initialisation. */
#include <config.h>

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <flow/exec.h>
#include <flow/model.h>

#include "graphutil.h"

static flow_gpt_config_t parse_ok(const char *spec)
{
	flow_gpt_config_t cfg;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_gpt_parse(spec, &cfg, &diag), FLOW_OK);
	return cfg;
}

static void parse_fails(const char *spec, const char *message)
{
	flow_gpt_config_t cfg;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_gpt_parse(spec, &cfg, &diag), FLOW_ERR_USAGE);
	if (!strstr(diag.msg, message))
		fail_msg("'%s': got '%s', expected '%s'", spec, diag.msg,
			 message);
}

static void test_gpt_presets_match_the_published_sizes(void **state)
{
	(void)state;
	static const struct {
		const char *name;
		uint32_t layers, heads, dim;
		uint64_t params;
	} p[] = {
		/* Parameters with the vocabulary padded to 50304, as llm.c
		 * reports them (124,475,904 for the 124M model). */
		{ "gpt2-124m", 12, 12, 768, 124475904 },
		{ "gpt2-350m", 24, 16, 1024, 354871296 },
		{ "gpt2-774m", 36, 20, 1280, 774090240 },
		{ "gpt2-1.5b", 48, 25, 1600, 1557686400 },
	};
	for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
		flow_gpt_config_t c = parse_ok(p[i].name);
		assert_int_equal(c.layers, p[i].layers);
		assert_int_equal(c.heads, p[i].heads);
		assert_int_equal(c.dim, p[i].dim);
		assert_int_equal(c.vocab, 50257);
		assert_int_equal(c.seq, 1024);
		assert_int_equal(flow_gpt_padded_vocab(&c), 50304);
		assert_int_equal(flow_gpt_param_count(&c), p[i].params);
	}
}

static void test_gpt_spec_and_overrides(void **state)
{
	(void)state;
	flow_gpt_config_t c =
		parse_ok("gpt:layers=4,heads=4,dim=256,vocab=50257,seq=256");
	assert_int_equal(c.layers, 4);
	assert_int_equal(c.dim, 256);
	assert_int_equal(c.pad, 128);
	c = parse_ok("gpt:layers=1,heads=1,dim=8,vocab=65,seq=4,pad=64");
	assert_int_equal(flow_gpt_padded_vocab(&c), 128);
	c = parse_ok("gpt2-124m:seq=256,layers=2");
	assert_int_equal(c.seq, 256);
	assert_int_equal(c.layers, 2);
	assert_int_equal(c.dim, 768);

	/* The canonical form parses back to the same configuration. */
	char buf[FLOW_GPT_SPEC_MAX];
	flow_gpt_format(&c, buf, sizeof buf);
	assert_string_equal(buf, "gpt:layers=2,heads=12,dim=768,vocab=50257,"
				 "seq=256,pad=128");
	flow_gpt_config_t back = parse_ok(buf);
	assert_memory_equal(&back, &c, sizeof c);
}

static void test_gpt_spec_errors(void **state)
{
	(void)state;
	parse_fails("bert", "unknown model 'bert'");
	parse_fails("gpt:layers=2,heads=2,dim=8,vocab=9,seq=4,depth=2",
		    "unknown key 'depth'");
	parse_fails("gpt:layers=2,heads=2,dim=8,seq=4", "missing vocab");
	parse_fails("gpt:layers=2,heads=2,vocab=9,seq=4", "missing dim");
	parse_fails("gpt:layers=2,heads=2,dim=8,vocab=9", "missing seq");
	parse_fails("gpt:layers=2,heads=3,dim=8,vocab=9,seq=4",
		    "dim 8 is not a multiple of heads 3");
	parse_fails("gpt:layers=x,heads=2,dim=8,vocab=9,seq=4", "layers:");
	parse_fails("gpt:layers=0,heads=2,dim=8,vocab=9,seq=4", "layers:");
	parse_fails("gpt:layers=2,heads=2,dim=8,vocab=9,seq=4,", "trailing ','");
	parse_fails("gpt:layers", "expected key=value, got 'layers'");
	parse_fails("gpt2-124m:pad=-1", "pad:");
}

static const flow_graph_tensor_t *tensor(const flow_graph_t *g,
					 const char *name)
{
	int t = flow_graph_find(g, name);
	if (t < 0)
		fail_msg("no tensor '%s'", name);
	return &g->tensors[t];
}

static void assert_shape(const flow_graph_tensor_t *t, int64_t d0, int64_t d1)
{
	assert_int_equal(t->shape.ndim, d1 ? 2 : 1);
	assert_int_equal(t->shape.dims[0], d0);
	if (d1)
		assert_int_equal(t->shape.dims[1], d1);
}

static void test_gpt_graph(void **state)
{
	(void)state;
	flow_gpt_config_t c = parse_ok("gpt:layers=3,heads=2,dim=16,vocab=100,"
				       "seq=8,pad=64");
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_graph_init(&g);
	assert_int_equal(flow_gpt_build(&c, 2, 8, &g, &diag), FLOW_OK);
	assert_int_equal(flow_graph_validate(&g, &diag), FLOW_OK);

	const flow_graph_tensor_t *wte = tensor(&g, "wte");
	assert_shape(wte, 128, 16);
	assert_int_equal(wte->init.kind, FLOW_INIT_NORMAL);
	assert_true(wte->init.std == 0.02f);
	assert_int_equal(wte->init.rows, 100); /* the padding stays zero */
	assert_true(wte->decay);
	assert_shape(tensor(&g, "wpe"), 8, 16);
	assert_shape(tensor(&g, "h.2.attn.c_attn.weight"), 48, 16);
	assert_shape(tensor(&g, "h.2.attn.c_attn.bias"), 48, 0);
	assert_shape(tensor(&g, "h.0.mlp.c_fc.weight"), 64, 16);
	assert_shape(tensor(&g, "h.0.mlp.c_proj.weight"), 16, 64);
	assert_shape(tensor(&g, "ln_f.weight"), 16, 0);

	/* GPT-2's scaled init of the residual projections. */
	float scaled = (float)(0.02 / sqrt(6.0));
	assert_true(tensor(&g, "h.1.attn.c_proj.weight")->init.std == scaled);
	assert_true(tensor(&g, "h.1.mlp.c_proj.weight")->init.std == scaled);
	assert_true(tensor(&g, "h.1.mlp.c_fc.weight")->init.std == 0.02f);
	assert_int_equal(tensor(&g, "h.1.ln_2.weight")->init.kind,
			 FLOW_INIT_ONES);
	assert_int_equal(tensor(&g, "h.1.ln_2.bias")->init.kind,
			 FLOW_INIT_ZEROS);
	assert_int_equal(tensor(&g, "h.1.mlp.c_fc.bias")->init.kind,
			 FLOW_INIT_ZEROS);
	/* Decay on weights and embeddings only. */
	assert_false(tensor(&g, "h.1.mlp.c_fc.bias")->decay);
	assert_false(tensor(&g, "h.1.ln_1.weight")->decay);
	assert_true(tensor(&g, "h.1.attn.c_proj.weight")->decay);

	/* Every parameter is counted; 16 per layer... */
	flow_graph_stats_t st;
	flow_graph_get_stats(&g, &st);
	assert_int_equal(st.params, 2 + 12 * 3 + 2);
	assert_int_equal(st.param_elems, flow_gpt_param_count(&c));
	assert_int_equal(st.inputs, 2);
	assert_true(g.loss >= 0);
	const flow_graph_tensor_t *losses = &g.tensors[g.loss];
	assert_int_equal(losses->shape.ndim, 1);
	assert_int_equal(losses->shape.dims[0], 16);

	/* ...and each gets a gradient: wte twice (embedding and head). */
	assert_int_equal(flow_graph_backward(&g, &diag), FLOW_OK);
	assert_true(tensor(&g, "wte")->grad >= 0);
	assert_true(tensor(&g, "h.2.ln_1.bias")->grad >= 0);
	int wte_grad = tensor(&g, "wte")->grad, writers = 0;
	for (size_t i = g.nforward; i < g.nops; i++)
		for (int o = 0; o < g.ops[i].nout; o++)
			writers += g.ops[i].out[o] == wte_grad;
	assert_int_equal(writers, 2);
	flow_graph_release(&g);
}

static void test_gpt_build_errors(void **state)
{
	(void)state;
	flow_gpt_config_t c = parse_ok("gpt:layers=1,heads=2,dim=16,vocab=100,"
				       "seq=8");
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_graph_init(&g);
	assert_int_equal(flow_gpt_build(&c, 2, 9, &g, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "sequence length 9 is outside the "
				      "model's context [1, 8]");
	flow_graph_release(&g);
}

static void test_gpt_flops(void **state)
{
	(void)state;
	flow_gpt_config_t c = parse_ok("gpt2-124m");
	/* 6 (N - wpe) + 12 L T C at T = 1024. */
	double n = 124475904.0 - 1024.0 * 768;
	assert_true(flow_gpt_flops_per_token(&c, 1024) ==
		    6 * n + 12.0 * 12 * 1024 * 768);
}

/* At initialisation the logits are near zero, so the loss is near
 * ln(vocab); the padded columns must take no probability. */
static void test_gpt_initial_loss_is_log_vocab(void **state)
{
	(void)state;
	flow_gpt_config_t c = parse_ok("gpt:layers=2,heads=2,dim=32,vocab=200,"
				       "seq=16");
	flow_graph_t g;
	flow_exec_t *x;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_graph_init(&g);
	assert_int_equal(flow_gpt_build(&c, 3, 16, &g, &diag), FLOW_OK);
	assert_int_equal(flow_graph_backward(&g, &diag), FLOW_OK);
	assert_int_equal(flow_exec_new(&g, FLOW_KERNELS_CPU, &x, &diag),
			 FLOW_OK);
	assert_int_equal(flow_exec_init_params(x, 42, NULL), FLOW_OK);
	int32_t *tok = flow_exec_tensor(x, flow_graph_find(&g, "tokens"));
	int32_t *tgt = flow_exec_tensor(x, flow_graph_find(&g, "targets"));
	for (int i = 0; i < 48; i++) {
		tok[i] = (i * 37) % 200;
		tgt[i] = (i * 91 + 5) % 200;
	}
	double loss = graphutil_forward(x);
	assert_true(fabs(loss - log(200.0)) < 0.1);
	/* Deterministic: the same bits again. */
	assert_true(graphutil_forward(x) == loss);
	flow_exec_free(x);
	flow_graph_release(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gpt_presets_match_the_published_sizes),
		cmocka_unit_test(test_gpt_spec_and_overrides),
		cmocka_unit_test(test_gpt_spec_errors),
		cmocka_unit_test(test_gpt_graph),
		cmocka_unit_test(test_gpt_build_errors),
		cmocka_unit_test(test_gpt_flops),
		cmocka_unit_test(test_gpt_initial_loss_is_log_vocab),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
