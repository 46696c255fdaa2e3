/* The graph IR: adding tensors and ops (outputs named "<op>.<output>",
 * roles, shapes from each op's shape rule), the exact one-line errors of
 * the shape rules, the loss, validation of hand-corrupted graphs, the
 * statistics, the text form (golden output) and the op table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/exec.h>
#include <flow/graph.h>
#include <flow/ops.h>

#define DIMS(...) ((const int64_t[]){ __VA_ARGS__ })
#define NDIM(...) ((int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)))
#define INS(...) ((const int[]){ __VA_ARGS__ }), \
	((int)(sizeof((int[]){ __VA_ARGS__ }) / sizeof(int)))

/* A tensor that must be added: PARAM(g, "w", 3, 4). */
static int add_tensor(flow_graph_t *g, const char *name, flow_role_t role,
		      flow_dtype_t dtype, int ndim, const int64_t *dims)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	int t = flow_graph_add_tensor(g, name, role, dtype, ndim, dims, &diag);

	if (t < 0)
		fail_msg("adding '%s': %s", name, flow_diag_message(&diag));
	return t;
}

#define PARAM(g, name, ...)                                                \
	add_tensor(g, name, FLOW_ROLE_PARAM, FLOW_DTYPE_F32,               \
		   NDIM(__VA_ARGS__), DIMS(__VA_ARGS__))
#define INPUT(g, name, dtype, ...)                                         \
	add_tensor(g, name, FLOW_ROLE_INPUT, dtype, NDIM(__VA_ARGS__),     \
		   DIMS(__VA_ARGS__))

/* An op that must be added; returns its index. */
static int add_op(flow_graph_t *g, flow_op_kind_t kind, const char *name,
		  const int *in, int nin, const flow_op_attrs_t *attrs)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	int op = flow_graph_add_op(g, kind, name, in, nin, attrs, &diag);

	if (op < 0)
		fail_msg("adding op '%s': %s", name, flow_diag_message(&diag));
	return op;
}

/* An op that must be refused with exactly this message, leaving the graph
 * as it was. */
static void add_op_fails(flow_graph_t *g, flow_op_kind_t kind,
			 const char *name, const int *in, int nin,
			 const flow_op_attrs_t *attrs, const char *want)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	size_t ntensors = g->ntensors, nops = g->nops;
	int op = flow_graph_add_op(g, kind, name, in, nin, attrs, &diag);

	if (op != FLOW_ERR_USAGE)
		fail_msg("op '%s' gave %d, want the error \"%s\"", name, op,
			 want);
	assert_int_equal(diag.err, FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, want);
	assert_int_equal(g->ntensors, ntensors);
	assert_int_equal(g->nops, nops);
}

static void shape_is(const flow_graph_t *g, int t, int ndim,
		     const int64_t *dims)
{
	assert_int_equal(g->tensors[t].shape.ndim, ndim);
	for (int i = 0; i < ndim; i++)
		assert_int_equal(g->tensors[t].shape.dims[i], dims[i]);
}

#define SHAPE_IS(g, t, ...) shape_is(g, t, NDIM(__VA_ARGS__), DIMS(__VA_ARGS__))

/* ---- tensors --------------------------------------------------------------- */

static void test_graph_add_tensor_sets_every_field(void **state)
{
	flow_graph_t g;

	(void)state;
	flow_graph_init(&g);
	assert_int_equal(g.loss, -1);
	int w = PARAM(&g, "h.0.attn.c_attn.weight", 6, 4);
	int tok = INPUT(&g, "tokens", FLOW_DTYPE_I32, 2, 3);
	assert_int_equal(w, 0);
	assert_int_equal(tok, 1);

	const flow_graph_tensor_t *p = &g.tensors[w];
	assert_string_equal(p->name, "h.0.attn.c_attn.weight");
	assert_int_equal(p->role, FLOW_ROLE_PARAM);
	assert_int_equal(p->dtype, FLOW_DTYPE_F32);
	SHAPE_IS(&g, w, 6, 4);
	assert_int_equal(p->producer, -1);
	assert_int_equal(p->grad, -1);
	assert_int_equal(p->grad_of, -1);
	assert_int_equal(p->alias_of, -1);
	assert_true(p->requires_grad);
	assert_false(p->decay);
	assert_int_equal(p->init.kind, FLOW_INIT_ZEROS);

	assert_false(g.tensors[tok].requires_grad);
	assert_int_equal(g.tensors[tok].init.kind, FLOW_INIT_NONE);
	assert_int_equal(g.tensors[tok].dtype, FLOW_DTYPE_I32);

	assert_int_equal(flow_graph_find(&g, "tokens"), tok);
	assert_int_equal(flow_graph_find(&g, "h.0.attn.c_attn.weight"), w);
	assert_int_equal(flow_graph_find(&g, "token"), -1);
	assert_int_equal(flow_graph_tensor_numel(&g, w), 24);
	assert_int_equal(flow_graph_tensor_bytes(&g, w), 96);
	assert_int_equal(flow_graph_tensor_bytes(&g, tok), 24);
	flow_graph_release(&g);
	flow_graph_release(&g); /* released twice is fine */
}

static void add_tensor_fails(flow_graph_t *g, const char *name,
			     flow_role_t role, flow_dtype_t dtype, int ndim,
			     const int64_t *dims, const char *want)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	size_t n = g->ntensors;

	assert_int_equal(flow_graph_add_tensor(g, name, role, dtype, ndim,
					       dims, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, want);
	assert_int_equal(g->ntensors, n);
}

static void test_graph_add_tensor_rejects_bad_tensors(void **state)
{
	flow_graph_t g;
	char long_name[FLOW_GRAPH_NAME_MAX + 1];

	(void)state;
	flow_graph_init(&g);
	PARAM(&g, "w", 2);
	add_tensor_fails(&g, "w", FLOW_ROLE_INPUT, FLOW_DTYPE_F32, 1, DIMS(2),
			 "duplicate tensor name 'w'");
	add_tensor_fails(&g, "", FLOW_ROLE_PARAM, FLOW_DTYPE_F32, 1, DIMS(2),
			 "invalid tensor name '': must be 1 to 63 characters");
	memset(long_name, 'x', FLOW_GRAPH_NAME_MAX);
	long_name[FLOW_GRAPH_NAME_MAX] = '\0';
	add_tensor_fails(&g, long_name, FLOW_ROLE_PARAM, FLOW_DTYPE_F32, 1,
			 DIMS(2),
			 "invalid tensor name 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
			 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx': must be 1 to 63 "
			 "characters");
	add_tensor_fails(&g, "a", FLOW_ROLE_ACTIVATION, FLOW_DTYPE_F32, 1,
			 DIMS(2),
			 "tensor 'a': role activation cannot be added, only "
			 "param or input");
	add_tensor_fails(&g, "a", FLOW_ROLE_PARAM, FLOW_DTYPE_I32, 1, DIMS(2),
			 "tensor 'a': dtype i32 is not supported for a param");
	add_tensor_fails(&g, "a", FLOW_ROLE_INPUT, FLOW_DTYPE_F16, 1, DIMS(2),
			 "tensor 'a': dtype f16 is not supported for a input");
	add_tensor_fails(&g, "a", FLOW_ROLE_PARAM, FLOW_DTYPE_F32, 2,
			 DIMS(2, -3), "tensor 'a': invalid dimension -3");
	add_tensor_fails(&g, "a", FLOW_ROLE_PARAM, FLOW_DTYPE_F32, 9,
			 DIMS(1, 1, 1, 1, 1, 1, 1, 1, 1),
			 "tensor 'a': invalid rank 9 (at most 8 dimensions)");
	add_tensor_fails(&g, "a", FLOW_ROLE_PARAM, FLOW_DTYPE_F32, 4,
			 DIMS(1 << 30, 1 << 30, 1 << 30, 1 << 30),
			 "tensor 'a' (1073741824,1073741824,1073741824,"
			 "1073741824) is too large");
	/* A name of exactly 63 characters fits. */
	long_name[FLOW_GRAPH_NAME_MAX - 1] = '\0';
	PARAM(&g, long_name, 1);
	flow_graph_release(&g);
}

/* ---- ops -------------------------------------------------------------------- */

static void test_graph_add_op_names_outputs_and_infers_shapes(void **state)
{
	flow_graph_t g;
	flow_op_attrs_t heads = { .heads = 2 };
	flow_op_attrs_t vocab = { .vocab = 10 };

	(void)state;
	flow_graph_init(&g);
	int tok = INPUT(&g, "tokens", FLOW_DTYPE_I32, 2, 3);
	int tgt = INPUT(&g, "targets", FLOW_DTYPE_I32, 2, 3);
	int wte = PARAM(&g, "wte", 12, 8);
	int wpe = PARAM(&g, "wpe", 5, 8);
	int lw = PARAM(&g, "ln.weight", 8);
	int lb = PARAM(&g, "ln.bias", 8);
	int qw = PARAM(&g, "qkv.weight", 24, 8);

	int e = add_op(&g, FLOW_OP_EMBEDDING, "embed", INS(tok, wte, wpe), NULL);
	int x = g.ops[e].out[0];
	assert_string_equal(g.tensors[x].name, "embed.out");
	SHAPE_IS(&g, x, 2, 3, 8);
	assert_int_equal(g.tensors[x].role, FLOW_ROLE_ACTIVATION);
	assert_int_equal(g.tensors[x].producer, e);
	assert_true(g.tensors[x].requires_grad);

	int ln = add_op(&g, FLOW_OP_LAYERNORM, "ln", INS(x, lw, lb), NULL);
	const flow_graph_op_t *op = &g.ops[ln];
	assert_int_equal(op->nin, 3);
	assert_int_equal(op->nout, 3);
	assert_int_equal(op->forward, -1);
	assert_string_equal(g.tensors[op->out[0]].name, "ln.out");
	assert_string_equal(g.tensors[op->out[1]].name, "ln.mean");
	assert_string_equal(g.tensors[op->out[2]].name, "ln.rstd");
	assert_int_equal(g.tensors[op->out[1]].role, FLOW_ROLE_SAVED);
	assert_int_equal(g.tensors[op->out[2]].role, FLOW_ROLE_SAVED);
	assert_false(g.tensors[op->out[1]].requires_grad);
	SHAPE_IS(&g, op->out[0], 2, 3, 8);
	SHAPE_IS(&g, op->out[1], 6);

	/* Matmul without bias: two inputs given, the third is absent. */
	int mm = add_op(&g, FLOW_OP_MATMUL, "qkv", INS(g.ops[ln].out[0], qw),
			NULL);
	assert_int_equal(g.ops[mm].in[2], -1);
	int qkv = g.ops[mm].out[0];
	SHAPE_IS(&g, qkv, 2, 3, 24);

	int at = add_op(&g, FLOW_OP_ATTENTION, "attn", INS(qkv), &heads);
	assert_int_equal(g.ops[at].attrs.heads, 2);
	SHAPE_IS(&g, g.ops[at].out[0], 2, 3, 8);
	SHAPE_IS(&g, g.ops[at].out[1], 2, 2, 3);
	assert_string_equal(g.tensors[g.ops[at].out[1]].name, "attn.lse");
	assert_int_equal(g.tensors[g.ops[at].out[1]].role, FLOW_ROLE_SAVED);

	int ge = add_op(&g, FLOW_OP_GELU, "gelu", INS(g.ops[at].out[0]), NULL);
	int ad = add_op(&g, FLOW_OP_ADD, "res", INS(x, g.ops[ge].out[0]), NULL);
	int head = add_op(&g, FLOW_OP_MATMUL, "head",
			  INS(g.ops[ad].out[0], wte, -1), NULL);
	int ce = add_op(&g, FLOW_OP_CROSS_ENTROPY, "loss",
			INS(g.ops[head].out[0], tgt), &vocab);
	int losses = g.ops[ce].out[0], dlogits = g.ops[ce].out[1];
	SHAPE_IS(&g, losses, 6);
	SHAPE_IS(&g, dlogits, 2, 3, 12);
	assert_string_equal(g.tensors[dlogits].name, "loss.dlogits");
	assert_int_equal(g.tensors[dlogits].role, FLOW_ROLE_GRAD);
	assert_int_equal(g.tensors[dlogits].alias_of, g.ops[head].out[0]);
	assert_int_equal(g.tensors[dlogits].grad_of, g.ops[head].out[0]);
	assert_true(g.tensors[losses].requires_grad);
	assert_int_equal(g.nops, 8);
	assert_int_equal(g.nforward, 8);

	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_graph_validate(&g, &diag), FLOW_OK);
	flow_graph_release(&g);
}

/* Every shape rule's refusal, word for word. */
static void test_graph_shape_errors_name_the_op_and_input(void **state)
{
	flow_graph_t g;
	flow_op_attrs_t heads = { .heads = 3 }, no_heads = { 0 };
	flow_op_attrs_t vocab = { .vocab = 10 }, big_vocab = { .vocab = 13 };

	(void)state;
	flow_graph_init(&g);
	int tok = INPUT(&g, "tokens", FLOW_DTYPE_I32, 2, 6);
	int tok3 = INPUT(&g, "tokens3", FLOW_DTYPE_I32, 2, 6, 1);
	int xin = INPUT(&g, "x", FLOW_DTYPE_F32, 4, 64, 768);
	int scalar = INPUT(&g, "s", FLOW_DTYPE_F32);
	int wte = PARAM(&g, "wte", 12, 8);
	int wpe = PARAM(&g, "wpe", 5, 8);
	int wpe7 = PARAM(&g, "wpe7", 16, 7);
	int w = PARAM(&g, "w", 768, 768);
	int w3 = PARAM(&g, "w3", 2304, 768, 1);
	int b = PARAM(&g, "b", 2304);
	int c = PARAM(&g, "c", 768);
	int qkv = PARAM(&g, "qkv", 2, 6, 24);
	int qkv_odd = PARAM(&g, "qkv_odd", 2, 6, 25);

	/* The example of flow/graph.h. */
	add_op_fails(&g, FLOW_OP_MATMUL, "h.0.attn.c_attn", INS(xin, w3, b),
		     NULL,
		     "h.0.attn.c_attn: weight (2304,768,1) must be (O,I)");
	add_op_fails(&g, FLOW_OP_MATMUL, "h.0.attn.c_attn",
		     INS(xin, wte, -1), NULL,
		     "h.0.attn.c_attn: weight (12,8) does not match x "
		     "(4,64,768): expected (O,768)");
	add_op_fails(&g, FLOW_OP_MATMUL, "h.0.attn.c_attn", INS(xin, w, b),
		     NULL,
		     "h.0.attn.c_attn: bias (2304) does not match weight "
		     "(768,768): expected (768)");
	add_op_fails(&g, FLOW_OP_MATMUL, "m", INS(scalar, w), NULL,
		     "m: x () must be (...,I)");
	add_op_fails(&g, FLOW_OP_MATMUL, "m", INS(-1, w), NULL,
		     "m: input 'x' is missing");
	add_op_fails(&g, FLOW_OP_MATMUL, "m", INS(xin, 99), NULL,
		     "m: input 'weight' is 99, not a tensor of the graph");
	add_op_fails(&g, FLOW_OP_MATMUL, "m", INS(tok, w), NULL,
		     "m: x 'tokens' is i32, expected f32");
	add_op_fails(&g, FLOW_OP_MATMUL, "m", INS(xin, w, c, c), NULL,
		     "m: matmul takes 3 inputs, got 4");

	add_op_fails(&g, FLOW_OP_EMBEDDING, "embed", INS(wte, wte, wpe), NULL,
		     "embed: tokens 'wte' is f32, expected i32");
	add_op_fails(&g, FLOW_OP_EMBEDDING, "embed", INS(tok3, wte, wpe), NULL,
		     "embed: tokens (2,6,1) must be (B,T)");
	add_op_fails(&g, FLOW_OP_EMBEDDING, "embed", INS(tok, wte, wpe7), NULL,
		     "embed: wpe (16,7) does not match wte (12,8): expected "
		     "(Tmax,8)");
	add_op_fails(&g, FLOW_OP_EMBEDDING, "embed", INS(tok, wte, wpe), NULL,
		     "embed: tokens (2,6) does not match wpe (5,8): expected "
		     "T <= Tmax 5");

	add_op_fails(&g, FLOW_OP_LAYERNORM, "ln", INS(xin, b, c), NULL,
		     "ln: weight (2304) does not match x (4,64,768): "
		     "expected (768)");
	add_op_fails(&g, FLOW_OP_LAYERNORM, "ln", INS(xin, c, w), NULL,
		     "ln: bias (768,768) must be (C)");
	add_op_fails(&g, FLOW_OP_LAYERNORM, "ln", INS(xin, c), NULL,
		     "ln: input 'bias' is missing");

	add_op_fails(&g, FLOW_OP_ATTENTION, "attn", INS(xin), &no_heads,
		     "attn: 0 heads do not divide C 256");
	add_op_fails(&g, FLOW_OP_ATTENTION, "attn", INS(qkv), &heads,
		     "attn: 3 heads do not divide C 8");
	add_op_fails(&g, FLOW_OP_ATTENTION, "attn", INS(qkv_odd), &heads,
		     "attn: qkv (2,6,25) must be (B,T,3C): 25 is not a "
		     "multiple of 3");
	add_op_fails(&g, FLOW_OP_ATTENTION, "attn", INS(w), &heads,
		     "attn: qkv (768,768) must be (B,T,3C)");

	add_op_fails(&g, FLOW_OP_ADD, "res", INS(xin, qkv), NULL,
		     "res: b (2,6,24) does not match a (4,64,768): expected "
		     "(4,64,768)");

	flow_graph_release(&g);

	/* Cross-entropy, and kinds that are not forward ops. */
	flow_graph_init(&g);
	tok = INPUT(&g, "tokens", FLOW_DTYPE_I32, 2, 6);
	int logits = PARAM(&g, "logits", 2, 6, 12);
	int x = INPUT(&g, "x", FLOW_DTYPE_F32, 2, 6, 8);
	wte = PARAM(&g, "wte", 12, 8);
	int mm = add_op(&g, FLOW_OP_MATMUL, "head", INS(x, wte), NULL);
	int out = g.ops[mm].out[0];
	add_op_fails(&g, FLOW_OP_CROSS_ENTROPY, "loss", INS(out, logits),
		     &vocab, "loss: targets 'logits' is f32, expected i32");
	add_op_fails(&g, FLOW_OP_CROSS_ENTROPY, "loss", INS(out, tok),
		     &big_vocab, "loss: vocab 13 is outside [1, Vp 12]");
	add_op_fails(&g, FLOW_OP_CROSS_ENTROPY, "loss", INS(out, tok), NULL,
		     "loss: vocab 0 is outside [1, Vp 12]");
	add_op_fails(&g, FLOW_OP_CROSS_ENTROPY, "loss", INS(logits, tok),
		     &vocab,
		     "loss: logits 'logits' must be an op's output, not a "
		     "param: the loss gradient overwrites them in place");
	int tok_t = INPUT(&g, "tokens_t", FLOW_DTYPE_I32, 6, 2);
	add_op_fails(&g, FLOW_OP_CROSS_ENTROPY, "loss", INS(out, tok_t),
		     &vocab,
		     "loss: targets (6,2) does not match logits (2,6,12): "
		     "expected (2,6)");
	add_op_fails(&g, FLOW_OP_MATMUL_BACKWARD, "mb", INS(out, x, wte), NULL,
		     "mb: op kind 9 is not a forward op");
	add_op_fails(&g, (flow_op_kind_t)77, "zz", INS(out), NULL,
		     "zz: op kind 77 is not a forward op");
	/* An op whose output names would not fit. */
	char name[FLOW_GRAPH_NAME_MAX];
	memset(name, 'n', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	add_op_fails(&g, FLOW_OP_GELU, name, INS(x), NULL,
		     "invalid tensor name 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
		     "nnnnnnnnnnnnnnnnnnnnnnnnnnnn.out': must be 1 to 63 "
		     "characters");
	/* The same output name twice. */
	add_op(&g, FLOW_OP_GELU, "act", INS(x), NULL);
	add_op_fails(&g, FLOW_OP_GELU, "act", INS(x), NULL,
		     "duplicate tensor name 'act.out'");
	flow_graph_release(&g);
}

static void test_graph_set_loss_wants_cross_entropy_losses(void **state)
{
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_op_attrs_t vocab = { .vocab = 4 };

	(void)state;
	flow_graph_init(&g);
	int x = PARAM(&g, "x", 3, 4);
	int t = INPUT(&g, "t", FLOW_DTYPE_I32, 3);
	int ge = add_op(&g, FLOW_OP_GELU, "act", INS(x), NULL);
	int ce = add_op(&g, FLOW_OP_CROSS_ENTROPY, "loss",
			INS(g.ops[ge].out[0], t), &vocab);

	assert_int_equal(flow_graph_set_loss(&g, g.ops[ge].out[0], &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "loss 'act.out' is not the losses of a "
				      "cross_entropy op");
	flow_diag_clear(&diag);
	assert_int_equal(flow_graph_set_loss(&g, g.ops[ce].out[1], &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "loss 'loss.dlogits' is not the losses "
				      "of a cross_entropy op");
	flow_diag_clear(&diag);
	assert_int_equal(flow_graph_set_loss(&g, 42, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "loss 42 is not a tensor of the graph");
	assert_int_equal(g.loss, -1);
	assert_int_equal(flow_graph_set_loss(&g, g.ops[ce].out[0], NULL),
			 FLOW_OK);
	assert_int_equal(g.loss, g.ops[ce].out[0]);
	flow_graph_release(&g);
}

/* ---- the op table ------------------------------------------------------------- */

static void test_graph_op_table_is_consistent(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_op_kind_t kind;

	(void)state;
	for (int k = 0; k < FLOW_OP_KIND_COUNT; k++) {
		const flow_op_def_t *def = flow_op_def((flow_op_kind_t)k);
		assert_non_null(def);
		assert_int_equal(def->kind, k);
		assert_true(def->nin >= 1 && def->nin <= FLOW_OP_MAX_IO);
		assert_true(def->nout >= 1 && def->nout <= FLOW_OP_MAX_IO);
		for (int i = 0; i < def->nin; i++)
			assert_non_null(def->in_names[i]);
		for (int i = 0; i < def->nout; i++)
			assert_non_null(def->out_names[i]);
		assert_non_null(def->infer);
		assert_non_null(def->flops);
		assert_non_null(def->scratch);
		bool backward = strstr(def->name, "_backward") != NULL;
		/* Boxing (a layout change, in either pass) has no rule and
		 * overwrites its output. */
		if (k == FLOW_OP_BOXING) {
			assert_null(def->backward);
			assert_int_equal(def->accumulates, 0);
			assert_int_equal(flow_op_kind_parse(def->name, &kind,
							    &diag),
					 FLOW_OK);
			assert_int_equal(kind, k);
			continue;
		}
		/* Forward ops have a rule, backward ops accumulate into every
		 * output and read dout first. */
		assert_int_equal(def->backward != NULL, !backward);
		if (backward) {
			assert_int_equal(def->accumulates,
					 (1u << def->nout) - 1);
			assert_string_equal(def->in_names[0], "dout");
		} else {
			assert_int_equal(def->accumulates, 0);
			const flow_op_def_t *bw = flow_op_def(def->backward_kind);
			assert_non_null(bw);
		}
		assert_int_equal(flow_op_kind_parse(def->name, &kind, &diag),
				 FLOW_OK);
		assert_int_equal(kind, k);
	}
	assert_string_equal(flow_op_def(FLOW_OP_MATMUL_BACKWARD)->name,
			    "matmul_backward");
	assert_int_equal(flow_op_def(FLOW_OP_CROSS_ENTROPY)->backward_kind,
			 FLOW_OP_CROSS_ENTROPY);
	assert_int_equal(flow_op_def(FLOW_OP_LAYERNORM_BACKWARD)->nin, 5);
	assert_null(flow_op_def((flow_op_kind_t)FLOW_OP_KIND_COUNT));
	assert_null(flow_op_def((flow_op_kind_t)-1));
	kind = FLOW_OP_GELU;
	assert_int_equal(flow_op_kind_parse("matmull", &kind, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "unknown op 'matmull'");
	assert_int_equal(kind, FLOW_OP_GELU);
	assert_string_equal(flow_role_name(FLOW_ROLE_PARAM_GRAD), "param_grad");
	assert_string_equal(flow_role_name(FLOW_ROLE_SAVED), "saved");
}

/* The signature-only kinds come after the graph kinds and are none of
 * them: no definition, no name to parse, no place in a graph. */
static void test_graph_signature_only_kinds_are_not_graph_kinds(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_op_kind_t kind = FLOW_OP_GELU;
	flow_graph_t g;

	(void)state;
	assert_int_equal(FLOW_OP_LAYERNORM_PARAM_GRAD, FLOW_OP_KIND_COUNT);
	assert_int_equal(FLOW_OP_BROADCAST_ADD + 1, FLOW_OP_ALL_KIND_COUNT);
	for (int k = FLOW_OP_KIND_COUNT; k < FLOW_OP_ALL_KIND_COUNT; k++)
		assert_null(flow_op_def((flow_op_kind_t)k));
	assert_int_equal(flow_op_kind_parse("reshape", &kind, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "unknown op 'reshape'");
	assert_int_equal(kind, FLOW_OP_GELU);

	flow_graph_init(&g);
	int x = INPUT(&g, "x", FLOW_DTYPE_F32, 2, 4);
	add_op_fails(&g, FLOW_OP_RESHAPE, "r", INS(x), NULL,
		     "r: op kind 15 is not a forward op");
	add_op(&g, FLOW_OP_GELU, "act", INS(x), NULL);
	flow_diag_clear(&diag);
	assert_int_equal(flow_graph_validate(&g, &diag), FLOW_OK);
	g.ops[0].kind = FLOW_OP_REDUCE_SUM;
	assert_int_equal(flow_graph_validate(&g, &diag), FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg, "op 0 (act): kind 17 does not belong in "
				      "the forward pass");
	flow_graph_release(&g);
}

/* ---- a small model, for validation, statistics and printing ---------------- */

/* tokens -> embedding (wte tied with the head) -> layernorm -> matmul ->
 * gelu -> add residual -> head -> cross-entropy. */
typedef struct small {
	flow_graph_t g;
	int tokens, targets, wte, wpe, lw, lb, fw, fb;
	int embed, ln, fc, gelu, res, head, ce;
} small_t;

static void small_build(small_t *s)
{
	flow_graph_t *g = &s->g;
	flow_op_attrs_t vocab = { .vocab = 10 };

	flow_graph_init(g);
	s->tokens = INPUT(g, "tokens", FLOW_DTYPE_I32, 2, 3);
	s->targets = INPUT(g, "targets", FLOW_DTYPE_I32, 2, 3);
	s->wte = PARAM(g, "wte", 16, 4);
	g->tensors[s->wte].init = (flow_init_t){ FLOW_INIT_NORMAL, 0.02f, 10 };
	g->tensors[s->wte].decay = true;
	s->wpe = PARAM(g, "wpe", 8, 4);
	g->tensors[s->wpe].init = (flow_init_t){ FLOW_INIT_NORMAL, 0.5f, 0 };
	s->lw = PARAM(g, "ln.weight", 4);
	g->tensors[s->lw].init.kind = FLOW_INIT_ONES;
	s->lb = PARAM(g, "ln.bias", 4);
	s->fw = PARAM(g, "fc.weight", 4, 4);
	g->tensors[s->fw].init = (flow_init_t){ FLOW_INIT_NORMAL, 0.125f, 0 };
	g->tensors[s->fw].decay = true;
	s->fb = PARAM(g, "fc.bias", 4);
	s->embed = add_op(g, FLOW_OP_EMBEDDING, "embed",
			  INS(s->tokens, s->wte, s->wpe), NULL);
	int x = g->ops[s->embed].out[0];
	s->ln = add_op(g, FLOW_OP_LAYERNORM, "ln", INS(x, s->lw, s->lb), NULL);
	s->fc = add_op(g, FLOW_OP_MATMUL, "fc",
		       INS(g->ops[s->ln].out[0], s->fw, s->fb), NULL);
	s->gelu = add_op(g, FLOW_OP_GELU, "gelu", INS(g->ops[s->fc].out[0]),
			 NULL);
	s->res = add_op(g, FLOW_OP_ADD, "res", INS(x, g->ops[s->gelu].out[0]),
			NULL);
	s->head = add_op(g, FLOW_OP_MATMUL, "head",
			 INS(g->ops[s->res].out[0], s->wte, -1), NULL);
	s->ce = add_op(g, FLOW_OP_CROSS_ENTROPY, "loss",
		       INS(g->ops[s->head].out[0], s->targets), &vocab);
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_graph_set_loss(g, g->ops[s->ce].out[0], &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
}

static void small_backward(small_t *s)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	if (flow_graph_backward(&s->g, &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
}

static void test_graph_stats_count_roles_and_passes(void **state)
{
	small_t s;
	flow_graph_stats_t st;

	(void)state;
	small_build(&s);
	flow_graph_get_stats(&s.g, &st);
	assert_int_equal(st.params, 6);
	assert_int_equal(st.param_elems, 64 + 32 + 4 + 4 + 16 + 4);
	assert_int_equal(st.inputs, 2);
	assert_int_equal(st.forward_ops, 7);
	assert_int_equal(st.backward_ops, 0);
	/* embed, ln (3), fc, gelu, res, head, losses, dlogits */
	assert_int_equal(st.activation_tensors, 10);

	small_backward(&s);
	flow_graph_get_stats(&s.g, &st);
	assert_int_equal(st.forward_ops, 7);
	/* head, res, gelu, fc, ln, embed: cross-entropy appends none */
	assert_int_equal(st.backward_ops, 6);
	/* + grads of res.out, gelu.out, fc.out, ln.out, embed.out */
	assert_int_equal(st.activation_tensors, 15);
	assert_int_equal(st.params, 6);
	flow_graph_release(&s.g);
}

static void test_graph_backward_names_ops_and_gradients(void **state)
{
	small_t s;
	flow_graph_t *g = &s.g;
	flow_diag_t diag = FLOW_DIAG_INIT;

	(void)state;
	small_build(&s);
	small_backward(&s);
	assert_int_equal(g->nforward, 7);
	assert_int_equal(g->nops, 13);
	/* Reverse order of the forward ops that need one. */
	const char *want[] = { "head.backward", "res.backward",
			       "gelu.backward", "fc.backward", "ln.backward",
			       "embed.backward" };
	const int fwd[] = { s.head, s.res, s.gelu, s.fc, s.ln, s.embed };
	for (size_t i = 0; i < 6; i++) {
		const flow_graph_op_t *op = &g->ops[7 + i];
		assert_string_equal(op->name, want[i]);
		assert_int_equal(op->forward, fwd[i]);
		assert_int_equal(op->kind,
				 flow_op_def(g->ops[fwd[i]].kind)->backward_kind);
	}
	for (size_t t = 0; t < g->ntensors; t++) {
		const flow_graph_tensor_t *x = &g->tensors[t];
		char name[96];
		if (x->grad < 0)
			continue;
		snprintf(name, sizeof(name), "%s.grad", x->name);
		/* The logits' gradient is cross-entropy's in-place one. */
		if (x->grad == g->ops[s.ce].out[1])
			snprintf(name, sizeof(name), "loss.dlogits");
		assert_string_equal(g->tensors[x->grad].name, name);
		assert_int_equal(g->tensors[x->grad].grad_of, (int)t);
		assert_int_equal(g->tensors[x->grad].role,
				 x->role == FLOW_ROLE_PARAM ?
					 FLOW_ROLE_PARAM_GRAD :
					 FLOW_ROLE_GRAD);
	}
	/* The tied wte: written by the head's and the embedding's backward. */
	int dwte = g->tensors[s.wte].grad;
	assert_int_equal(g->ops[7].out[1], dwte);
	assert_int_equal(g->ops[12].out[0], dwte);
	assert_int_equal(g->tensors[dwte].producer, 7);
	/* The head's x requires a gradient: logits grad is dlogits. */
	assert_int_equal(g->ops[7].in[0], g->ops[s.ce].out[1]);
	assert_int_equal(g->ops[7].out[2], -1); /* no bias */
	assert_int_equal(flow_graph_validate(g, &diag), FLOW_OK);

	/* Differentiated: no second pass, no more ops, tensors or loss. */
	assert_int_equal(flow_graph_backward(g, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "the graph is already differentiated");
	flow_diag_clear(&diag);
	assert_int_equal(flow_graph_add_op(g, FLOW_OP_GELU, "more",
					   INS(g->ops[s.fc].out[0]), NULL,
					   &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg,
			    "more: the graph is already differentiated");
	flow_diag_clear(&diag);
	assert_int_equal(flow_graph_add_tensor(g, "p", FLOW_ROLE_PARAM,
					       FLOW_DTYPE_F32, 1, DIMS(1),
					       &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg,
			    "tensor 'p': the graph is already differentiated");
	flow_graph_release(g);
}

static void test_graph_backward_needs_a_loss(void **state)
{
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;

	(void)state;
	flow_graph_init(&g);
	int x = PARAM(&g, "x", 3);
	add_op(&g, FLOW_OP_GELU, "act", INS(x), NULL);
	assert_int_equal(flow_graph_backward(&g, &diag), FLOW_ERR_USAGE);
	assert_string_equal(diag.msg,
			    "cannot differentiate a graph without a loss");
	assert_int_equal(g.nops, 1);
	assert_int_equal(g.ntensors, 2);
	flow_graph_release(&g);
}

/* Mixed precision (flow/ops.h): in a graph whose activations are bf16,
 * the ops write their "act" outputs in bf16, a gradient has its tensor's
 * dtype, an op refuses an activation of the other dtype where it reads
 * one, and the dtype is chosen before the first op. */
static void test_graph_bf16_activations(void **state)
{
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_op_attrs_t heads = { .heads = 2 }, vocab = { .vocab = 10 };

	(void)state;
	flow_graph_init(&g);
	assert_int_equal(g.act_dtype, FLOW_DTYPE_F32);
	assert_int_equal(flow_graph_set_act_dtype(&g, FLOW_DTYPE_F16, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg,
			    "activations in f16: only f32 and bf16 are supported");
	assert_int_equal(flow_graph_set_act_dtype(&g, FLOW_DTYPE_BF16, &diag),
			 FLOW_OK);
	int tok = INPUT(&g, "tokens", FLOW_DTYPE_I32, 2, 3);
	int tgt = INPUT(&g, "targets", FLOW_DTYPE_I32, 2, 3);
	int wte = PARAM(&g, "wte", 12, 8);
	int wpe = PARAM(&g, "wpe", 5, 8);
	int lw = PARAM(&g, "ln.weight", 8);
	int lb = PARAM(&g, "ln.bias", 8);
	int qw = PARAM(&g, "qkv.weight", 24, 8);

	/* An op's index first: adding one may move g.ops. */
	int op = add_op(&g, FLOW_OP_EMBEDDING, "embed", INS(tok, wte, wpe),
			NULL);
	int x = g.ops[op].out[0];
	op = add_op(&g, FLOW_OP_LAYERNORM, "ln", INS(x, lw, lb), NULL);
	int h = g.ops[op].out[0];
	assert_int_equal(g.tensors[x].dtype, FLOW_DTYPE_F32);
	assert_int_equal(g.tensors[h].dtype, FLOW_DTYPE_BF16);
	assert_int_equal(g.tensors[g.ops[op].out[1]].dtype, FLOW_DTYPE_F32);
	add_op_fails(&g, FLOW_OP_MATMUL, "qkv", INS(x, qw), NULL,
		     "qkv: x 'embed.out' is f32, expected bf16");
	op = add_op(&g, FLOW_OP_MATMUL, "qkv", INS(h, qw), NULL);
	int qkv = g.ops[op].out[0];
	op = add_op(&g, FLOW_OP_ATTENTION, "attn", INS(qkv), &heads);
	int a = g.ops[op].out[0];
	assert_int_equal(g.tensors[qkv].dtype, FLOW_DTYPE_BF16);
	assert_int_equal(g.tensors[a].dtype, FLOW_DTYPE_BF16);
	assert_int_equal(g.tensors[g.ops[op].out[1]].dtype, FLOW_DTYPE_F32);
	op = add_op(&g, FLOW_OP_GELU, "gelu", INS(a), NULL);
	int ge = g.ops[op].out[0];
	assert_int_equal(g.tensors[ge].dtype, FLOW_DTYPE_BF16);
	/* The residual stream stays f32; its branch is the bf16 one. */
	add_op_fails(&g, FLOW_OP_ADD, "res", INS(x, x), NULL,
		     "res: b 'embed.out' is f32, expected bf16");
	op = add_op(&g, FLOW_OP_ADD, "res", INS(x, ge), NULL);
	int r = g.ops[op].out[0];
	assert_int_equal(g.tensors[r].dtype, FLOW_DTYPE_F32);
	add_op_fails(&g, FLOW_OP_MATMUL, "head", INS(r, wte, -1), NULL,
		     "head: x 'res.out' is f32, expected bf16");
	op = add_op(&g, FLOW_OP_LAYERNORM, "ln_f", INS(r, lw, lb), NULL);
	int hf = g.ops[op].out[0];
	op = add_op(&g, FLOW_OP_MATMUL, "head", INS(hf, wte, -1), NULL);
	int logits = g.ops[op].out[0];
	op = add_op(&g, FLOW_OP_CROSS_ENTROPY, "loss", INS(logits, tgt),
		    &vocab);
	int losses = g.ops[op].out[0];
	assert_int_equal(g.tensors[losses].dtype, FLOW_DTYPE_F32);
	assert_int_equal(g.tensors[g.ops[op].out[1]].dtype, FLOW_DTYPE_BF16);
	diag = (flow_diag_t)FLOW_DIAG_INIT; /* it keeps its first error */
	assert_int_equal(flow_graph_set_act_dtype(&g, FLOW_DTYPE_F32, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "the activations' dtype is set before "
				      "the graph's first op");

	diag = (flow_diag_t)FLOW_DIAG_INIT;
	assert_int_equal(flow_graph_set_loss(&g, losses, &diag), FLOW_OK);
	assert_int_equal(flow_graph_backward(&g, &diag), FLOW_OK);
	assert_int_equal(flow_graph_validate(&g, &diag), FLOW_OK);
	for (size_t t = 0; t < g.ntensors; t++)
		if (g.tensors[t].grad >= 0)
			assert_int_equal(g.tensors[g.tensors[t].grad].dtype,
					 g.tensors[t].dtype);
	assert_int_equal(g.tensors[g.tensors[qkv].grad].dtype, FLOW_DTYPE_BF16);
	assert_int_equal(g.tensors[g.tensors[r].grad].dtype, FLOW_DTYPE_F32);
	assert_int_equal(g.tensors[g.tensors[wte].grad].dtype, FLOW_DTYPE_F32);
	flow_graph_release(&g);
}

/* ---- validation ----------------------------------------------------------------- */

static void validate_fails(const flow_graph_t *g, const char *want)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	assert_int_equal(flow_graph_validate(g, &diag), FLOW_ERR_FORMAT);
	assert_int_equal(diag.err, FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg, want);
}

static void test_graph_validate_finds_each_broken_invariant(void **state)
{
	small_t s;
	flow_graph_t *g = &s.g;
	flow_diag_t diag = FLOW_DIAG_INIT;

	(void)state;
	small_build(&s);
	small_backward(&s);
	assert_int_equal(flow_graph_validate(g, &diag), FLOW_OK);

	/* Duplicate names. */
	char saved[FLOW_GRAPH_NAME_MAX];
	memcpy(saved, g->tensors[s.wpe].name, sizeof(saved));
	snprintf(g->tensors[s.wpe].name, FLOW_GRAPH_NAME_MAX, "wte");
	validate_fails(g, "duplicate tensor name 'wte'");
	memcpy(g->tensors[s.wpe].name, saved, sizeof(saved));

	/* An input read before it is written: ln before embed. */
	flow_graph_op_t op = g->ops[s.embed];
	g->ops[s.embed] = g->ops[s.ln];
	g->ops[s.ln] = op;
	validate_fails(g, "op 0 (ln): input 'embed.out' is read before it is "
			  "written");
	g->ops[s.ln] = g->ops[s.embed];
	g->ops[s.embed] = op;

	/* A shape that disagrees with the shape rule. */
	int fc_out = g->ops[s.fc].out[0];
	g->tensors[fc_out].shape.dims[2] = 5;
	validate_fails(g, "op 2 (fc): output 'fc.out' is f32 (2,3,5), its "
			  "shape rule gives f32 (2,3,4)");
	g->tensors[fc_out].shape.dims[2] = 4;

	/* A backward op's gradient or dout that disagrees with its forward
	 * op's shapes. */
	int dres = g->ops[8].in[0];
	g->tensors[dres].shape.dims[0] = 3;
	validate_fails(g, "op 7 (head.backward): output 'res.out.grad' is f32 "
			  "(3,3,4), its shape rule gives f32 (2,3,4)");
	g->tensors[dres].shape.dims[0] = 2;
	g->ops[8].in[0] = g->ops[s.ln].out[1];
	validate_fails(g, "op 8: res.backward: dout f32 (6) does not match "
			  "the output f32 (2,3,4) of res");
	g->ops[8].in[0] = dres;

	/* Dtypes: a gradient is its tensor's, and an op reads the
	 * activations of the graph's act_dtype (f32 here). */
	g->tensors[dres].dtype = FLOW_DTYPE_BF16;
	validate_fails(g, "op 7 (head.backward): output 'res.out.grad' is bf16 "
			  "(2,3,4), its shape rule gives f32 (2,3,4)");
	g->tensors[dres].dtype = FLOW_DTYPE_F32;
	int ln_out = g->ops[s.ln].out[0];
	g->tensors[ln_out].dtype = FLOW_DTYPE_BF16;
	validate_fails(g, "op 1 (ln): output 'ln.out' is bf16 (2,3,4), its "
			  "shape rule gives f32 (2,3,4)");
	g->tensors[ln_out].dtype = FLOW_DTYPE_F32;

	/* Index out of range. */
	g->ops[s.gelu].in[0] = 1000;
	validate_fails(g, "op 3 (gelu): input 1000 is out of range");
	g->ops[s.gelu].in[0] = fc_out;

	/* A forward kind among the backward ops. */
	g->ops[9].kind = FLOW_OP_GELU;
	validate_fails(g, "op 9 (gelu.backward): kind 4 does not belong in the "
			  "backward pass");
	g->ops[9].kind = FLOW_OP_GELU_BACKWARD;

	/* Gradient links must agree. */
	int dwte = g->tensors[s.wte].grad;
	g->tensors[dwte].grad_of = s.wpe;
	validate_fails(g, "tensor 'wte': its gradient 'wte.grad' is not marked "
			  "as its gradient");
	g->tensors[dwte].grad_of = s.wte;

	/* Reading the logits after cross-entropy overwrote them. */
	int logits = g->ops[s.head].out[0];
	int res_out = g->ops[7].in[1];
	g->ops[7].in[1] = logits;
	validate_fails(g, "op 7 (head.backward): reads 'head.out' after op 6 "
			  "overwrote it with 'loss.dlogits'");
	g->ops[7].in[1] = res_out;
	assert_int_equal(flow_graph_validate(g, &diag), FLOW_OK);

	/* A loss that is not cross-entropy's. */
	char want[128];
	g->loss = fc_out;
	snprintf(want, sizeof(want),
		 "graph: loss %d is not the losses of a cross_entropy op",
		 fc_out);
	validate_fails(g, want);
	flow_graph_release(g);
}

/* ---- the text form --------------------------------------------------------------- */

/* What flow_graph_print writes, as a string. */
static char *print_to_string(const flow_graph_t *g, const flow_memplan_t *plan)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	flow_diag_t diag = FLOW_DIAG_INIT;

	assert_non_null(f);
	assert_int_equal(flow_graph_print(g, plan, f, &diag), FLOW_OK);
	assert_int_equal(fclose(f), 0);
	return buf;
}

static void test_graph_print_forward_golden(void **state)
{
	small_t s;

	(void)state;
	small_build(&s);
	char *text = print_to_string(&s.g, NULL);
	assert_string_equal(
		text,
		"# flow graph 1: 6 params (124 elements), 2 inputs, 7 forward "
		"ops, 0 backward ops\n"
		"input      tokens                  i32 (2,3)\n"
		"input      targets                 i32 (2,3)\n"
		"param      wte                     f32 (16,4)      "
		"init=normal(0.02,rows=10) decay\n"
		"param      wpe                     f32 (8,4)       "
		"init=normal(0.5)\n"
		"param      ln.weight               f32 (4)         init=ones\n"
		"param      ln.bias                 f32 (4)         init=zeros\n"
		"param      fc.weight               f32 (4,4)       "
		"init=normal(0.125) decay\n"
		"param      fc.bias                 f32 (4)         init=zeros\n"
		"op  0  embedding    embed  (tokens, wte, wpe) -> (embed.out "
		"f32 (2,3,4))\n"
		"op  1  layernorm    ln  (embed.out, ln.weight, ln.bias) -> "
		"(ln.out f32 (2,3,4), ln.mean f32 (6), ln.rstd f32 (6))\n"
		"op  2  matmul       fc  (ln.out, fc.weight, fc.bias) -> (fc.out "
		"f32 (2,3,4))\n"
		"op  3  gelu         gelu  (fc.out) -> (gelu.out f32 (2,3,4))\n"
		"op  4  add          res  (embed.out, gelu.out) -> (res.out f32 "
		"(2,3,4))\n"
		"op  5  matmul       head  (res.out, wte, -) -> (head.out f32 "
		"(2,3,16))\n"
		"op  6  cross_entropy loss  (head.out, targets) -> (loss.losses "
		"f32 (6), loss.dlogits f32 (2,3,16) alias=head.out)\n");
	free(text);
	flow_graph_release(&s.g);
}

static void test_graph_print_planned_golden(void **state)
{
	small_t s;
	flow_memplan_t plan;
	flow_diag_t diag = FLOW_DIAG_INIT;

	(void)state;
	small_build(&s);
	small_backward(&s);
	assert_int_equal(flow_memplan_build(&s.g, &plan, &diag), FLOW_OK);
	char *text = print_to_string(&s.g, &plan);
	const char *want =
		"# flow graph 1: 6 params (124 elements), 2 inputs, 7 forward "
		"ops, 6 backward ops; arena %zu bytes (unshared %zu), "
		"persistent 1408 bytes, scratch 0 bytes\n";
	char head[256];
	snprintf(head, sizeof(head), want, plan.arena_bytes,
		 plan.unshared_bytes);
	assert_memory_equal(text, head, strlen(head));
	/* The parameter gradients are listed with the tensors, in the order
	 * autograd created them (the head's backward first). */
	assert_non_null(strstr(text, "param      fc.bias                 f32 "
				     "(4)         init=zeros\n"
				     "param_grad wte.grad                f32 "
				     "(16,4)\n"
				     "param_grad fc.weight.grad          f32 "
				     "(4,4)\n"));
	/* An activation shows its offset; a gradient is declared where it is
	 * first written, with its offset, and only named afterwards. */
	char line[512];
	snprintf(line, sizeof(line),
		 "op  7  matmul_backward head.backward  (loss.dlogits, res.out, "
		 "wte) -> (res.out.grad f32 (2,3,4) @%zu, wte.grad, -)\n",
		 plan.offset[flow_graph_find(&s.g, "res.out.grad")]);
	assert_non_null(strstr(text, line));
	snprintf(line, sizeof(line),
		 "op  8  add_backward res.backward  (res.out.grad) -> "
		 "(embed.out.grad f32 (2,3,4) @%zu, gelu.out.grad f32 (2,3,4) "
		 "@%zu)\n",
		 plan.offset[flow_graph_find(&s.g, "embed.out.grad")],
		 plan.offset[flow_graph_find(&s.g, "gelu.out.grad")]);
	assert_non_null(strstr(text, line));
	assert_non_null(strstr(text,
			       "op 12  embedding_backward embed.backward  "
			       "(embed.out.grad, tokens) -> (wte.grad, "
			       "wpe.grad)\n"));
	snprintf(line, sizeof(line),
		 "loss.dlogits f32 (2,3,16) @%zu alias=head.out)\n",
		 plan.offset[flow_graph_find(&s.g, "head.out")]);
	assert_non_null(strstr(text, line));
	free(text);
	flow_memplan_release(&plan);
	flow_graph_release(&s.g);
}

static void test_graph_print_reports_write_errors(void **state)
{
	small_t s;
	flow_diag_t diag = FLOW_DIAG_INIT;
	FILE *full = fopen("/dev/full", "w");

	(void)state;
	if (!full)
		skip();
	setvbuf(full, NULL, _IONBF, 0); /* fail at the first write */
	small_build(&s);
	assert_int_equal(flow_graph_print(&s.g, NULL, full, &diag),
			 FLOW_ERR_IO);
	assert_string_equal(diag.msg, "cannot write the graph: No space left "
				      "on device");
	fclose(full);
	flow_graph_release(&s.g);
}

static void test_graph_counts_format_with_suffixes(void **state)
{
	flow_graph_t g;

	(void)state;
	flow_graph_init(&g);
	PARAM(&g, "a", 1000);
	PARAM(&g, "b", 7400, 1000);
	char *text = print_to_string(&g, NULL);
	assert_memory_equal(text,
			    "# flow graph 1: 2 params (7.4M elements), 0 "
			    "inputs, 0 forward ops, 0 backward ops\n",
			    strlen("# flow graph 1: 2 params (7.4M elements), "
				   "0 inputs, 0 forward ops, 0 backward ops\n"));
	free(text);
	flow_graph_release(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_graph_add_tensor_sets_every_field),
		cmocka_unit_test(test_graph_add_tensor_rejects_bad_tensors),
		cmocka_unit_test(test_graph_add_op_names_outputs_and_infers_shapes),
		cmocka_unit_test(test_graph_shape_errors_name_the_op_and_input),
		cmocka_unit_test(test_graph_set_loss_wants_cross_entropy_losses),
		cmocka_unit_test(test_graph_op_table_is_consistent),
		cmocka_unit_test(test_graph_signature_only_kinds_are_not_graph_kinds),
		cmocka_unit_test(test_graph_stats_count_roles_and_passes),
		cmocka_unit_test(test_graph_backward_names_ops_and_gradients),
		cmocka_unit_test(test_graph_backward_needs_a_loss),
		cmocka_unit_test(test_graph_bf16_activations),
		cmocka_unit_test(test_graph_validate_finds_each_broken_invariant),
		cmocka_unit_test(test_graph_print_forward_golden),
		cmocka_unit_test(test_graph_print_planned_golden),
		cmocka_unit_test(test_graph_print_reports_write_errors),
		cmocka_unit_test(test_graph_counts_format_with_suffixes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL) ? EXIT_FAILURE :
							   EXIT_SUCCESS;
}
