/* Hand-built graphs for the unit tests (see graphutil.h). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>

#include "graphutil.h"

void (*graphutil_fail)(const char *msg);

int graphutil_must(int r, const flow_diag_t *diag)
{
	if (r >= 0)
		return r;
	if (graphutil_fail)
		graphutil_fail(flow_diag_message(diag));
	fprintf(stderr, "graphutil: %s\n", flow_diag_message(diag));
	abort();
}

int graphutil_tensor(flow_graph_t *g, const char *name, flow_role_t role,
		     flow_dtype_t dtype, int ndim, const int64_t *dims)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	return graphutil_must(flow_graph_add_tensor(g, name, role, dtype, ndim,
						    dims, &diag),
			      &diag);
}

int graphutil_param(flow_graph_t *g, const char *name, flow_init_t init,
		    int ndim, const int64_t *dims)
{
	int t = graphutil_tensor(g, name, FLOW_ROLE_PARAM, FLOW_DTYPE_F32, ndim,
				 dims);

	g->tensors[t].init = init;
	return t;
}

int graphutil_op(flow_graph_t *g, flow_op_kind_t kind, const char *name,
		 const int *in, int nin, uint32_t heads, uint32_t vocab)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_op_attrs_t attrs = { .heads = heads, .vocab = vocab };
	int i = graphutil_must(flow_graph_add_op(g, kind, name, in, nin, &attrs,
						 &diag),
			       &diag);

	return g->ops[i].out[0];
}

/* ---- GPT-2 ------------------------------------------------------------------ */

static const flow_init_t ZEROS = { FLOW_INIT_ZEROS, 0, 0 };
static const flow_init_t ONES = { FLOW_INIT_ONES, 0, 0 };
static const flow_init_t NORMAL = { FLOW_INIT_NORMAL, 0.1f, 0 };

/* "<scope>.weight" (out,in) and "<scope>.bias" (out), then x @ w^T + b. */
static int gpt_linear(flow_graph_t *g, const char *scope, int x, int out,
		      int in)
{
	char w[64], b[64];

	snprintf(w, sizeof(w), "%s.weight", scope);
	snprintf(b, sizeof(b), "%s.bias", scope);
	int wi = INIT_PARAM(g, w, NORMAL, out, in);
	int bi = INIT_PARAM(g, b, NORMAL, out);
	return OP(g, FLOW_OP_MATMUL, scope, x, wi, bi);
}

static int gpt_ln(flow_graph_t *g, const char *scope, int x, int C)
{
	char w[64], b[64];

	snprintf(w, sizeof(w), "%s.weight", scope);
	snprintf(b, sizeof(b), "%s.bias", scope);
	int wi = INIT_PARAM(g, w, ONES, C), bi = INIT_PARAM(g, b, ZEROS, C);
	return OP(g, FLOW_OP_LAYERNORM, scope, x, wi, bi);
}

void graphutil_gpt_build(flow_graph_t *g, const graphutil_gpt_t *d,
			 bool backward)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	char s[64];

	flow_graph_init(g);
	graphutil_must(flow_graph_set_act_dtype(g, d->act, &diag), &diag);
	int tok = IDS(g, "tokens", d->B, d->T);
	int tgt = IDS(g, "targets", d->B, d->T);
	flow_init_t wte_init = { FLOW_INIT_NORMAL, 0.1f, d->V };
	int wte = INIT_PARAM(g, "wte", wte_init, d->Vp, d->C);
	int wpe = INIT_PARAM(g, "wpe", NORMAL, d->T, d->C);
	int x = OP(g, FLOW_OP_EMBEDDING, "embed", tok, wte, wpe);
	for (int l = 0; l < d->layers; l++) {
		char prefix[16] = "";
		if (d->layers > 1)
			snprintf(prefix, sizeof(prefix), "h.%d.", l);
		snprintf(s, sizeof(s), "%sln_1", prefix);
		int h = gpt_ln(g, s, x, d->C);
		snprintf(s, sizeof(s), "%sc_attn", prefix);
		h = gpt_linear(g, s, h, 3 * d->C, d->C);
		snprintf(s, sizeof(s), "%sattn", prefix);
		h = graphutil_op(g, FLOW_OP_ATTENTION, s, &h, 1,
				 (uint32_t)d->heads, 0);
		snprintf(s, sizeof(s), "%sattn.c_proj", prefix);
		h = gpt_linear(g, s, h, d->C, d->C);
		snprintf(s, sizeof(s), "%sresidual_1", prefix);
		x = OP(g, FLOW_OP_ADD, s, x, h);
		snprintf(s, sizeof(s), "%sln_2", prefix);
		h = gpt_ln(g, s, x, d->C);
		snprintf(s, sizeof(s), "%sc_fc", prefix);
		h = gpt_linear(g, s, h, 4 * d->C, d->C);
		snprintf(s, sizeof(s), "%sgelu", prefix);
		h = OP(g, FLOW_OP_GELU, s, h);
		snprintf(s, sizeof(s), "%smlp.c_proj", prefix);
		h = gpt_linear(g, s, h, d->C, 4 * d->C);
		snprintf(s, sizeof(s), "%sresidual_2", prefix);
		x = OP(g, FLOW_OP_ADD, s, x, h);
	}
	x = gpt_ln(g, "ln_f", x, d->C);
	int logits = OP(g, FLOW_OP_MATMUL, "lm_head", x, wte, -1);
	int losses = graphutil_op(g, FLOW_OP_CROSS_ENTROPY, "loss",
				  (const int[]){ logits, tgt }, 2, 0,
				  (uint32_t)d->V);
	graphutil_must(flow_graph_set_loss(g, losses, &diag), &diag);
	if (backward)
		graphutil_must(flow_graph_backward(g, &diag), &diag);
}

double graphutil_forward(flow_exec_t *x)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	double loss = 0.0;

	graphutil_must(flow_exec_forward(x, &loss, &diag), &diag);
	return loss;
}

void graphutil_backward(flow_exec_t *x)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	graphutil_must(flow_exec_backward(x, &diag), &diag);
}
