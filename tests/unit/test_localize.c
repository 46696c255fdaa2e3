/* Localized graphs: local shapes from the plan's layouts, boxing where an
 * op's signature differs from its tensor's layout, the shard attrs of the
 * split embedding and cross-entropy, ownership of replicated boxes, and
 * the layouts refused with the plan's line.  (The numbers they compute
 * are checked against one rank by tests/cluster/train.bats.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/localize.h>
#include <flow/model.h>

#define SMALL "gpt:layers=1,heads=2,dim=8,vocab=30,seq=8"

static flow_plan_t *standard(const char *mesh, const char *axes, int zero)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *p = NULL;

	if (flow_plan_standard(SMALL, mesh, axes, 4, 0, 1, zero, &p, &diag))
		fail_msg("%s", diag.msg);
	return p;
}

static void build_global(const flow_plan_t *p, flow_graph_t *g)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	flow_graph_init(g);
	if (flow_gpt_build(&p->cfg, p->batch, p->seq_len, g, &diag) ||
	    flow_graph_backward(g, &diag))
		fail_msg("%s", diag.msg);
}

static const flow_graph_op_t *op_named(const flow_graph_t *g,
				       const char *name)
{
	for (size_t i = 0; i < g->nops; i++)
		if (strcmp(g->ops[i].name, name) == 0)
			return &g->ops[i];
	fail_msg("no op '%s'", name);
	return NULL;
}

static int64_t dim(const flow_local_t *l, const char *tensor, int d)
{
	int t = flow_graph_find(&l->graph, tensor);
	assert_true(t >= 0);
	return l->graph.tensors[t].shape.dims[d];
}

/* tp = 2: Megatron shapes, the vocabulary split, boxing between them. */
static void test_localize_tensor_parallel_shapes(void **state)
{
	(void)state;
	flow_plan_t *p = standard("2", "tp", 0);
	flow_graph_t g;
	build_global(p, &g);
	flow_diag_t diag = FLOW_DIAG_INIT;
	for (int64_t r = 0; r < 2; r++) {
		flow_local_t l;
		if (flow_local_build(p, &g, r, &l, &diag))
			fail_msg("%s", diag.msg);
		/* Vp = 128 rows of wte, 64 each; c_fc 32 of 4C; c_proj 16
		 * of its C inputs. */
		assert_int_equal(dim(&l, "wte", 0), 64);
		assert_int_equal(dim(&l, "h.0.mlp.c_fc.weight", 0), 16);
		assert_int_equal(dim(&l, "h.0.mlp.c_proj.weight", 1), 16);
		assert_int_equal(dim(&l, "h.0.ln_1.weight", 0), 8);
		assert_int_equal(dim(&l, "lm_head.out", 2), 64);
		assert_true(l.nboxings > 0);
		assert_true(l.graph.nops == g.nops + l.nboxings);
		assert_int_equal(l.loss_partial_axes, 1);
		const flow_graph_op_t *e = op_named(&l.graph, "embed");
		assert_int_equal(e->attrs.split_axes, 1);
		assert_int_equal(e->attrs.row_start, 64 * r);
		const flow_graph_op_t *ce = op_named(&l.graph, "loss");
		assert_int_equal(ce->attrs.split_axes, 1);
		assert_int_equal(ce->attrs.row_start, 64 * r);
		/* Replicated boxes have one owner, split ones each rank. */
		int ln = flow_graph_find(&l.graph, "h.0.ln_1.weight");
		int wte = flow_graph_find(&l.graph, "wte");
		assert_int_equal(flow_local_owns(&l, &p->mesh, ln), r == 0);
		assert_true(flow_local_owns(&l, &p->mesh, wte));
		assert_int_equal(l.box[wte].start[0], 64 * r);
		assert_int_equal(l.logical[wte].dims[0], 128);
		/* Every boxing op converts a tensor of one logical shape. */
		for (size_t i = 0; i < l.graph.nops; i++) {
			const flow_graph_op_t *o = &l.graph.ops[i];
			if (o->kind != FLOW_OP_BOXING)
				continue;
			assert_true(o->attrs.boxing < l.nboxings);
			assert_true(flow_shape_equal(
				&l.boxings[o->attrs.boxing].shape,
				&l.logical[o->in[0]]));
		}
		flow_local_release(&l);
	}
	flow_graph_release(&g);
	flow_plan_free(p);
}

/* A data-parallel plan needs no boxing: ops and layouts agree, and the
 * gradients are the caller's to sync. */
static void test_localize_data_parallel_has_no_boxing(void **state)
{
	(void)state;
	flow_plan_t *p = standard("2", "dp", 0);
	flow_graph_t g;
	build_global(p, &g);
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_local_t l;
	if (flow_local_build(p, &g, 1, &l, &diag))
		fail_msg("%s", diag.msg);
	assert_int_equal(l.nboxings, 0);
	assert_int_equal(dim(&l, "tokens", 0), 2);
	assert_int_equal(dim(&l, "wte", 0), 128);
	assert_int_equal(l.loss_partial_axes, 0);
	flow_local_release(&l);
	flow_graph_release(&g);
	flow_plan_free(p);
}

/* Attention over split heads is refused with the plan's op line. */
static void test_localize_refuses_split_attention(void **state)
{
	(void)state;
	flow_plan_t *p = standard("2", "tp", 0);
	flow_graph_t g;
	build_global(p, &g);
	for (size_t i = 0; i < p->nops; i++)
		if (strcmp(p->ops[i].name, "h.0.attn") == 0)
			p->ops[i].in[0].sbp[0] =
				(flow_sbp_t){ FLOW_SBP_SPLIT, 2 };
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_local_t l;
	assert_int_equal(flow_local_build(p, &g, 0, &l, &diag),
			 FLOW_ERR_NOTSUP);
	assert_non_null(strstr(diag.msg, ": h.0.attn: attention over split heads"));
	flow_graph_release(&g);
	flow_plan_free(p);
}

/* A cross-entropy whose logits would need boxing is refused: its
 * gradient is written over them in place. */
static void test_localize_refuses_boxed_cross_entropy(void **state)
{
	(void)state;
	flow_plan_t *p = standard("2", "tp", 0);
	flow_graph_t g;
	build_global(p, &g);
	for (size_t i = 0; i < p->nops; i++)
		if (strcmp(p->ops[i].name, "loss") == 0)
			p->ops[i].in[0].sbp[0] =
				(flow_sbp_t){ FLOW_SBP_BROADCAST, 0 };
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_local_t l;
	assert_int_equal(flow_local_build(p, &g, 0, &l, &diag),
			 FLOW_ERR_NOTSUP);
	assert_non_null(strstr(diag.msg, ": loss: cross-entropy reading its logits in another layout"));
	flow_graph_release(&g);
	flow_plan_free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_localize_tensor_parallel_shapes),
		cmocka_unit_test(test_localize_data_parallel_has_no_boxing),
		cmocka_unit_test(test_localize_refuses_split_attention),
		cmocka_unit_test(test_localize_refuses_boxed_cross_entropy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
