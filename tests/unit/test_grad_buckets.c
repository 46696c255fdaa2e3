/* Gradient buckets (flow/grad_buckets.h): exact plans of hand-built graphs
 * (two linears, a tied weight, a parameter that reaches no loss), GPT-2
 * from the model builder (the tied embedding's ready point, one bucket per
 * gradient, one bucket for all), the selection, the refusals, the
 * --verbose lines, and a property over random capacities and selections
 * checking every invariant the header promises, including that the
 * packing is greedy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/grad_buckets.h>
#include <flow/model.h>

#include "graphutil.h"
#include "sbputil.h"

static void fail_with(const char *msg)
{
	fail_msg("%s", msg);
}

/* ---- graphs ----------------------------------------------------------------- */

/* x (4,8) -> l1 (16,8) -> gelu -> l2 (8,16) -> cross-entropy over 8
 * classes.  Tensors: x 0, l1.weight 1, l1.bias 2, l2.weight 3, l2.bias 4;
 * forward ops l1 0, gelu 1, l2 2, loss 3; backward ops l2.backward 4,
 * gelu.backward 5, l1.backward 6 (cross-entropy's rule appends none). */
static void two_linears(flow_graph_t *g)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	flow_graph_init(g);
	int x = graphutil_tensor(g, "x", FLOW_ROLE_INPUT, FLOW_DTYPE_F32, 2,
				 DIMS(4, 8));
	int w1 = PARAM(g, "l1.weight", 16, 8);
	int b1 = PARAM(g, "l1.bias", 16);
	int w2 = PARAM(g, "l2.weight", 8, 16);
	int b2 = PARAM(g, "l2.bias", 8);
	int t = IDS(g, "targets", 4);
	int h = OP(g, FLOW_OP_MATMUL, "l1", x, w1, b1);
	h = OP(g, FLOW_OP_GELU, "gelu", h);
	h = OP(g, FLOW_OP_MATMUL, "l2", h, w2, b2);
	int losses = graphutil_op(g, FLOW_OP_CROSS_ENTROPY, "loss",
				  (const int[]){ h, t }, 2, 0, 8);
	graphutil_must(flow_graph_set_loss(g, losses, &diag), &diag);
	graphutil_must(flow_graph_backward(g, &diag), &diag);
	assert_int_equal(g->nforward, 4);
	assert_int_equal(g->nops, 7);
}

/* GPT's tying in small: wte (6,4) is the embedding's table and the head's
 * weight.  Backward ops: head.backward 3, ln.backward 4, embed.backward 5. */
static void tied(flow_graph_t *g)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	flow_graph_init(g);
	int wte = PARAM(g, "wte", 6, 4);
	int wpe = PARAM(g, "wpe", 3, 4);
	int lw = PARAM(g, "ln.weight", 4);
	int lb = PARAM(g, "ln.bias", 4);
	int tok = IDS(g, "tokens", 2, 3);
	int t = IDS(g, "targets", 2, 3);
	int h = OP(g, FLOW_OP_EMBEDDING, "embed", tok, wte, wpe);
	h = OP(g, FLOW_OP_LAYERNORM, "ln", h, lw, lb);
	h = OP(g, FLOW_OP_MATMUL, "head", h, wte, -1);
	int losses = graphutil_op(g, FLOW_OP_CROSS_ENTROPY, "loss",
				  (const int[]){ h, t }, 2, 0, 6);
	graphutil_must(flow_graph_set_loss(g, losses, &diag), &diag);
	graphutil_must(flow_graph_backward(g, &diag), &diag);
	assert_int_equal(g->nforward, 4);
	assert_int_equal(g->nops, 7);
}

#define SMALL_GPT "gpt:layers=2,heads=2,dim=16,vocab=50,seq=8,pad=16"

/* The model builder's GPT-2 of spec, B = 2 sequences of T = seq,
 * differentiated. */
static void gpt(flow_graph_t *g, const char *spec)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_gpt_config_t cfg;

	flow_graph_init(g);
	if (flow_gpt_parse(spec, &cfg, &diag) != FLOW_OK ||
	    flow_gpt_build(&cfg, 2, cfg.seq, g, &diag) != FLOW_OK ||
	    flow_graph_backward(g, &diag) != FLOW_OK)
		fail_msg("%s: %s", spec, diag.msg);
}

static flow_grad_buckets_t *plan(const flow_graph_t *g, size_t capacity,
				 const bool *select)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_grad_buckets_t *b = NULL;

	if (flow_grad_buckets_new(g, capacity, select, &b, &diag) != FLOW_OK)
		fail_msg("capacity %zu: %s", capacity, diag.msg);
	assert_non_null(b);
	assert_int_equal(b->capacity, capacity);
	return b;
}

/* The last backward op with t among its outputs, found walking back from
 * the end (the other direction from the library's walk); -1 for none. */
static int last_writer(const flow_graph_t *g, int t)
{
	for (size_t i = g->nops; i-- > g->nforward;)
		for (int k = 0; k < g->ops[i].nout; k++)
			if (g->ops[i].out[k] == t)
				return (int)i;
	return -1;
}

static int writers(const flow_graph_t *g, int t)
{
	int n = 0;

	for (size_t i = 0; i < g->nops; i++)
		for (int k = 0; k < g->ops[i].nout; k++)
			n += g->ops[i].out[k] == t;
	return n;
}

static int find(const flow_graph_t *g, const char *name)
{
	int t = flow_graph_find(g, name);

	if (t < 0)
		fail_msg("no tensor '%s'", name);
	return t;
}

static int find_op(const flow_graph_t *g, const char *name)
{
	for (size_t i = 0; i < g->nops; i++)
		if (strcmp(g->ops[i].name, name) == 0)
			return (int)i;
	fail_msg("no op '%s'", name);
	return -1;
}

static size_t align256(size_t n)
{
	return (n + 255) / 256 * 256;
}

/* Member m is tensor name at offset, in a bucket. */
static void expect_member(const flow_graph_t *g, const flow_grad_buckets_t *b,
			  size_t m, const char *name, size_t offset)
{
	assert_true(m < b->nmembers);
	assert_string_equal(g->tensors[b->members[m].grad].name, name);
	assert_int_equal(b->members[m].offset, offset);
}

static void expect_bucket(const flow_grad_buckets_t *b, size_t k,
			  size_t first, size_t count, size_t bytes,
			  int launch_op)
{
	assert_true(k < b->nbuckets);
	assert_int_equal(b->buckets[k].first, first);
	assert_int_equal(b->buckets[k].count, count);
	assert_int_equal(b->buckets[k].bytes, bytes);
	assert_int_equal(b->buckets[k].launch_op, launch_op);
}

/* ---- invariants -------------------------------------------------------------- */

/* What a NULL selection takes: every parameter with a gradient. */
static bool every_param(const flow_graph_t *g, size_t t)
{
	return g->tensors[t].role == FLOW_ROLE_PARAM && g->tensors[t].grad >= 0;
}

/* Every promise of flow/grad_buckets.h about b, planned from g with
 * select (NULL: every parameter), as one message naming the broken one
 * ("" when all hold). */
static void check_invariants(const flow_graph_t *g,
			     const flow_grad_buckets_t *b, const bool *select,
			     char *why, size_t cap)
{
	size_t nsel = 0;
	int *seen = calloc(g->ntensors ? g->ntensors : 1, sizeof *seen);

	why[0] = '\0';
	assert_non_null(seen);
	for (size_t t = 0; t < g->ntensors; t++)
		nsel += select ? select[t] : every_param(g, t);
	if (b->nmembers != nsel) {
		snprintf(why, cap, "%zu members for %zu selected parameters",
			 b->nmembers, nsel);
		goto out;
	}
	/* Each selected parameter's gradient exactly once, right ready
	 * point and size, in ready order. */
	for (size_t i = 0; i < b->nmembers; i++) {
		const flow_grad_bucket_member_t *m = &b->members[i];
		if (m->param < 0 || (size_t)m->param >= g->ntensors ||
		    !(select ? select[m->param] : every_param(g, m->param)) ||
		    g->tensors[m->param].grad != m->grad) {
			snprintf(why, cap, "member %zu is not a selected parameter's gradient", i);
			goto out;
		}
		if (seen[m->grad]++) {
			snprintf(why, cap, "'%s' is in two buckets",
				 g->tensors[m->grad].name);
			goto out;
		}
		if (m->ready_op != last_writer(g, m->grad) ||
		    m->bytes != flow_graph_tensor_bytes(g, m->grad)) {
			snprintf(why, cap, "member '%s': ready %d bytes %zu",
				 g->tensors[m->grad].name, m->ready_op,
				 m->bytes);
			goto out;
		}
		if (i > 0) {
			const flow_grad_bucket_member_t *p = m - 1;
			if (p->ready_op > m->ready_op ||
			    (p->ready_op == m->ready_op && p->param < m->param)) {
				snprintf(why, cap, "members %zu, %zu out of ready order", i - 1, i);
				goto out;
			}
		}
	}
	/* Buckets tile the members in order; offsets are aligned, tight and
	 * disjoint; bytes within the capacity unless alone; launch points
	 * are the members' last ready point and never go back; and the
	 * packing is greedy: the next bucket's first member would not have
	 * fitted. */
	size_t next = 0;
	for (size_t k = 0; k < b->nbuckets; k++) {
		const flow_grad_bucket_t *bk = &b->buckets[k];
		if (bk->first != next || bk->count == 0 ||
		    bk->first + bk->count > b->nmembers) {
			snprintf(why, cap, "bucket %zu: members [%zu, +%zu) after %zu",
				 k, bk->first, bk->count, next);
			goto out;
		}
		size_t end = 0;
		int max_ready = -2;
		for (size_t i = bk->first; i < bk->first + bk->count; i++) {
			const flow_grad_bucket_member_t *m = &b->members[i];
			size_t want = i == bk->first ? 0 : align256(end);
			if (m->offset % 256 || m->offset != want ||
			    m->offset < end) {
				snprintf(why, cap, "bucket %zu member %zu at %zu after %zu",
					 k, i, m->offset, end);
				goto out;
			}
			end = m->offset + m->bytes;
			if (m->ready_op > max_ready)
				max_ready = m->ready_op;
		}
		if (bk->bytes != end ||
		    (bk->bytes > b->capacity && bk->count != 1)) {
			snprintf(why, cap, "bucket %zu: %zu bytes, members end at %zu, capacity %zu",
				 k, bk->bytes, end, b->capacity);
			goto out;
		}
		if (bk->launch_op != max_ready ||
		    (k > 0 && bk->launch_op < b->buckets[k - 1].launch_op)) {
			snprintf(why, cap, "bucket %zu launches after %d (members' last ready point %d)",
				 k, bk->launch_op, max_ready);
			goto out;
		}
		if (k > 0) {
			const flow_grad_bucket_t *p = &b->buckets[k - 1];
			if (align256(p->bytes) + b->members[bk->first].bytes <=
			    b->capacity) {
				snprintf(why, cap, "bucket %zu's first member fits in bucket %zu",
					 k, k - 1);
				goto out;
			}
		}
		next += bk->count;
	}
	if (next != b->nmembers) {
		snprintf(why, cap, "buckets hold %zu of %zu members", next,
			 b->nmembers);
		goto out;
	}
	/* Asking after every op, from before the backward pass on, hands out
	 * every bucket exactly once, in bucket order, each after its launch
	 * op. */
	size_t handed = 0;
	for (int op = -1; op < (int)g->nops; op++) {
		size_t first = SIZE_MAX, count = SIZE_MAX;
		flow_grad_buckets_after_op(b, op, &first, &count);
		if (first != handed || (count > 0 && op < (int)g->nforward &&
					op != -1)) {
			snprintf(why, cap, "after op %d: buckets [%zu, +%zu), expected from %zu",
				 op, first, count, handed);
			goto out;
		}
		for (size_t k = first; k < first + count; k++)
			if (b->buckets[k].launch_op != op) {
				snprintf(why, cap, "after op %d: bucket %zu launches after %d",
					 op, k, b->buckets[k].launch_op);
				goto out;
			}
		handed += count;
	}
	if (handed != b->nbuckets)
		snprintf(why, cap, "after_op handed out %zu of %zu buckets",
			 handed, b->nbuckets);
out:
	free(seen);
}

static void assert_invariants(const flow_graph_t *g,
			      const flow_grad_buckets_t *b, const bool *select)
{
	char why[256];

	check_invariants(g, b, select, why, sizeof why);
	if (why[0])
		fail_msg("capacity %zu: %s", b->capacity, why);
}

/* ---- hand-built graphs -------------------------------------------------------- */

/* 800 bytes: l2's bias (32 bytes at 0) and weight (512 at 256) end at 768;
 * l1's bias would end at 832, so it opens the second bucket with l1's
 * weight.  Each bucket launches after its linear's backward op. */
static void test_grad_buckets_two_linears_split_by_layer(void **state)
{
	flow_graph_t g;

	(void)state;
	two_linears(&g);
	flow_grad_buckets_t *b = plan(&g, 800, NULL);
	assert_int_equal(b->nbuckets, 2);
	assert_int_equal(b->nmembers, 4);
	expect_bucket(b, 0, 0, 2, 768, 4);
	expect_member(&g, b, 0, "l2.bias.grad", 0);
	expect_member(&g, b, 1, "l2.weight.grad", 256);
	expect_bucket(b, 1, 2, 2, 768, 6);
	expect_member(&g, b, 2, "l1.bias.grad", 0);
	expect_member(&g, b, 3, "l1.weight.grad", 256);
	assert_int_equal(b->members[0].ready_op, find_op(&g, "l2.backward"));
	assert_int_equal(b->members[3].ready_op, find_op(&g, "l1.backward"));
	assert_int_equal(b->members[3].bytes, 16 * 8 * 4);
	assert_int_equal(b->members[3].param, find(&g, "l1.weight"));
	assert_invariants(&g, b, NULL);
	flow_grad_buckets_free(b);
	flow_graph_release(&g);
}

/* 767 bytes: l2's weight no longer fits beside its bias, and takes l1's
 * bias along, so a bucket mixes the layers and launches after the later
 * one; two buckets then launch after op 6. */
static void test_grad_buckets_bucket_launches_after_its_last_member(void **state)
{
	flow_graph_t g;
	size_t first, count;

	(void)state;
	two_linears(&g);
	flow_grad_buckets_t *b = plan(&g, 767, NULL);
	assert_int_equal(b->nbuckets, 3);
	expect_bucket(b, 0, 0, 1, 32, 4);
	expect_bucket(b, 1, 1, 2, 576, 6);
	expect_member(&g, b, 1, "l2.weight.grad", 0);
	expect_member(&g, b, 2, "l1.bias.grad", 512);
	expect_bucket(b, 2, 3, 1, 512, 6);
	flow_grad_buckets_after_op(b, 4, &first, &count);
	assert_int_equal(first, 0);
	assert_int_equal(count, 1);
	flow_grad_buckets_after_op(b, 5, &first, &count);
	assert_int_equal(first, 1);
	assert_int_equal(count, 0);
	flow_grad_buckets_after_op(b, 6, &first, &count);
	assert_int_equal(first, 1);
	assert_int_equal(count, 2);
	flow_grad_buckets_after_op(b, 2, &first, &count); /* a forward op */
	assert_int_equal(first, 0);
	assert_int_equal(count, 0);
	flow_grad_buckets_after_op(b, 7, &first, &count); /* past the end */
	assert_int_equal(first, 3);
	assert_int_equal(count, 0);
	assert_invariants(&g, b, NULL);
	flow_grad_buckets_free(b);
	flow_graph_release(&g);
}

/* A gradient larger than the capacity is a bucket of its own, and 1 byte
 * gives every gradient one, in ready order. */
static void test_grad_buckets_oversized_gradient_gets_its_own_bucket(void **state)
{
	flow_graph_t g;

	(void)state;
	two_linears(&g);
	flow_grad_buckets_t *b = plan(&g, 100, NULL);
	assert_int_equal(b->nbuckets, 4);
	expect_bucket(b, 0, 0, 1, 32, 4);
	expect_bucket(b, 1, 1, 1, 512, 4);
	expect_bucket(b, 2, 2, 1, 64, 6);
	expect_bucket(b, 3, 3, 1, 512, 6);
	assert_invariants(&g, b, NULL);
	flow_grad_buckets_free(b);
	b = plan(&g, 1, NULL);
	assert_int_equal(b->nbuckets, 4);
	for (size_t k = 0; k < 4; k++) {
		assert_int_equal(b->buckets[k].count, 1);
		assert_int_equal(b->members[k].offset, 0);
	}
	assert_invariants(&g, b, NULL);
	flow_grad_buckets_free(b);
	flow_graph_release(&g);
}

/* The tied table is written by the head's backward op (first) and the
 * embedding's (last): its ready point is the later one, so it comes last,
 * after wpe (same op, lower index: reverse graph order puts wpe first). */
static void test_grad_buckets_tied_weight_is_ready_after_its_last_writer(void **state)
{
	flow_graph_t g;

	(void)state;
	tied(&g);
	int wte_grad = g.tensors[find(&g, "wte")].grad;
	int head = find_op(&g, "head.backward");
	int embed = find_op(&g, "embed.backward");
	assert_true(head < embed);
	assert_int_equal(writers(&g, wte_grad), 2);
	flow_grad_buckets_t *b = plan(&g, FLOW_GRAD_BUCKET_DEFAULT_BYTES, NULL);
	assert_int_equal(b->nbuckets, 1);
	expect_bucket(b, 0, 0, 4, 256 * 3 + 6 * 4 * 4, embed);
	expect_member(&g, b, 0, "ln.bias.grad", 0);
	expect_member(&g, b, 1, "ln.weight.grad", 256);
	expect_member(&g, b, 2, "wpe.grad", 512);
	expect_member(&g, b, 3, "wte.grad", 768);
	assert_int_equal(b->members[0].ready_op, find_op(&g, "ln.backward"));
	assert_int_equal(b->members[3].ready_op, embed);
	assert_invariants(&g, b, NULL);
	flow_grad_buckets_free(b);
	/* One byte: wte's own bucket is the last, after the embedding. */
	b = plan(&g, 1, NULL);
	assert_int_equal(b->nbuckets, 4);
	expect_bucket(b, 3, 3, 1, 6 * 4 * 4, embed);
	expect_member(&g, b, 3, "wte.grad", 0);
	assert_invariants(&g, b, NULL);
	flow_grad_buckets_free(b);
	flow_graph_release(&g);
}

/* A parameter that reaches no loss has a gradient no op writes: it is
 * ready before the backward pass (-1), so it leads, and after_op(-1) hands
 * out its bucket. */
static void test_grad_buckets_unwritten_gradient_is_ready_before_backward(void **state)
{
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	size_t first, count;

	(void)state;
	flow_graph_init(&g);
	int x = graphutil_tensor(&g, "x", FLOW_ROLE_INPUT, FLOW_DTYPE_F32, 2,
				 DIMS(4, 8));
	int w = PARAM(&g, "w", 8, 8);
	PARAM(&g, "unused", 7);
	int t = IDS(&g, "targets", 4);
	int h = OP(&g, FLOW_OP_MATMUL, "mm", x, w, -1);
	int losses = graphutil_op(&g, FLOW_OP_CROSS_ENTROPY, "loss",
				  (const int[]){ h, t }, 2, 0, 8);
	graphutil_must(flow_graph_set_loss(&g, losses, &diag), &diag);
	graphutil_must(flow_graph_backward(&g, &diag), &diag);
	flow_grad_buckets_t *b = plan(&g, 1, NULL);
	assert_int_equal(b->nbuckets, 2);
	expect_bucket(b, 0, 0, 1, 28, -1);
	expect_member(&g, b, 0, "unused.grad", 0);
	expect_bucket(b, 1, 1, 1, 256, find_op(&g, "mm.backward"));
	flow_grad_buckets_after_op(b, -1, &first, &count);
	assert_int_equal(first, 0);
	assert_int_equal(count, 1);
	assert_invariants(&g, b, NULL);
	flow_grad_buckets_free(b);
	/* Together, the bucket waits for the later one. */
	b = plan(&g, 1024, NULL);
	expect_bucket(b, 0, 0, 2, 512, find_op(&g, "mm.backward"));
	assert_invariants(&g, b, NULL);
	flow_grad_buckets_free(b);
	flow_graph_release(&g);
}

/* ---- GPT-2 from the model builder --------------------------------------------- */

/* The embedding's backward op is the last op of the pass, the tied wte's
 * last writer (the head's backward op, the first, wrote it before), so wte
 * is the last member and the last bucket launches after the last op. */
static void test_grad_buckets_gpt_wte_is_last(void **state)
{
	flow_graph_t g;

	(void)state;
	gpt(&g, SMALL_GPT);
	int wte_grad = g.tensors[find(&g, "wte")].grad;
	int embed = find_op(&g, "embed.backward");
	int head = find_op(&g, "lm_head.backward");
	assert_int_equal(g.ops[embed].kind, FLOW_OP_EMBEDDING_BACKWARD);
	assert_int_equal(embed, (int)g.nops - 1);
	assert_int_equal(head, (int)g.nforward); /* cross-entropy adds none */
	assert_int_equal(writers(&g, wte_grad), 2);
	assert_int_equal(last_writer(&g, wte_grad), embed);

	flow_grad_buckets_t *b = plan(&g, 1, NULL);
	flow_graph_stats_t st;
	flow_graph_get_stats(&g, &st);
	assert_int_equal(b->nbuckets, st.params);
	const flow_grad_bucket_member_t *last = &b->members[b->nmembers - 1];
	assert_int_equal(last->grad, wte_grad);
	assert_int_equal(last->ready_op, embed);
	assert_string_equal(g.tensors[b->members[b->nmembers - 2].grad].name,
			    "wpe.grad");
	/* The first gradients final are ln_f's, after the head's
	 * backward and ln_f's: bias first (the higher index). */
	assert_string_equal(g.tensors[b->members[0].grad].name,
			    "ln_f.bias.grad");
	assert_string_equal(g.tensors[b->members[1].grad].name,
			    "ln_f.weight.grad");
	assert_int_equal(b->members[0].ready_op, find_op(&g, "ln_f.backward"));
	assert_invariants(&g, b, NULL);
	flow_grad_buckets_free(b);
	flow_graph_release(&g);
}

/* Capacity above the whole model: one bucket, launched after the last
 * gradient writer, the embedding's backward op; DDP's 25 MiB holds this
 * small model whole too. */
static void test_grad_buckets_gpt_huge_capacity_is_one_bucket(void **state)
{
	flow_graph_t g;
	size_t first, count;

	(void)state;
	gpt(&g, SMALL_GPT);
	const size_t sizes[] = { SIZE_MAX, FLOW_GRAD_BUCKET_DEFAULT_BYTES };
	for (size_t s = 0; s < 2; s++) {
		flow_grad_buckets_t *b = plan(&g, sizes[s], NULL);
		assert_int_equal(b->nbuckets, 1);
		assert_int_equal(b->buckets[0].count, b->nmembers);
		assert_int_equal(b->buckets[0].launch_op,
				 find_op(&g, "embed.backward"));
		for (int op = -1; op < (int)g.nops - 1; op++) {
			flow_grad_buckets_after_op(b, op, &first, &count);
			assert_int_equal(count, 0);
		}
		flow_grad_buckets_after_op(b, (int)g.nops - 1, &first, &count);
		assert_int_equal(first, 0);
		assert_int_equal(count, 1);
		assert_invariants(&g, b, NULL);
		flow_grad_buckets_free(b);
	}
	flow_graph_release(&g);
}

/* A selection (ZeRO or tensor parallelism keeping some parameters out):
 * only the weights with decay, wte among them.  The buckets hold exactly
 * those. */
static void test_grad_buckets_gpt_selection_keeps_only_selected(void **state)
{
	flow_graph_t g;

	(void)state;
	gpt(&g, SMALL_GPT);
	bool *select = calloc(g.ntensors, sizeof *select);
	assert_non_null(select);
	size_t n = 0;
	for (size_t t = 0; t < g.ntensors; t++)
		if (g.tensors[t].role == FLOW_ROLE_PARAM && g.tensors[t].decay &&
		    strcmp(g.tensors[t].name, "wte") != 0)
		{
			select[t] = true;
			n++;
		}
	flow_grad_buckets_t *b = plan(&g, 4096, select);
	assert_int_equal(b->nmembers, n);
	for (size_t i = 0; i < b->nmembers; i++)
		assert_true(g.tensors[b->members[i].param].decay);
	/* Without wte the last gradient is wpe's, the same last op. */
	assert_string_equal(g.tensors[b->members[n - 1].grad].name, "wpe.grad");
	assert_invariants(&g, b, select);
	flow_grad_buckets_free(b);
	/* Nothing selected: no buckets. */
	memset(select, 0, g.ntensors * sizeof *select);
	b = plan(&g, 4096, select);
	assert_int_equal(b->nbuckets, 0);
	assert_int_equal(b->nmembers, 0);
	assert_invariants(&g, b, select);
	flow_grad_buckets_free(b);
	free(select);
	flow_graph_release(&g);
}

/* ---- refusals ------------------------------------------------------------------ */

static void expect_refusal(const flow_graph_t *g, size_t capacity,
			   const bool *select, const char *msg)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	static flow_grad_buckets_t sentinel;
	flow_grad_buckets_t *b = &sentinel;

	assert_int_equal(flow_grad_buckets_new(g, capacity, select, &b, &diag),
			 FLOW_ERR_USAGE);
	assert_ptr_equal(b, &sentinel); /* untouched */
	assert_string_equal(diag.msg, msg);
}

static void test_grad_buckets_refuses_with_one_line(void **state)
{
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;

	(void)state;
	two_linears(&g);
	expect_refusal(&g, 0, NULL,
		       "gradient bucket capacity must be at least 1 byte");
	bool *select = calloc(g.ntensors, sizeof *select);
	assert_non_null(select);
	select[find(&g, "x")] = true;
	expect_refusal(&g, 1024, select,
		       "cannot bucket the gradient of 'x': not a parameter (role input)");
	select[find(&g, "x")] = false;
	/* A parameter whose gradient is gone (as a caller's rewrite might
	 * leave it). */
	int w1 = find(&g, "l1.weight");
	select[w1] = true;
	g.tensors[w1].grad = -1;
	expect_refusal(&g, 1024, select,
		       "cannot bucket the gradient of parameter 'l1.weight': it has none");
	/* NULL takes only the parameters that have one. */
	flow_grad_buckets_t *b = plan(&g, 1024, NULL);
	assert_int_equal(b->nmembers, 3);
	flow_grad_buckets_free(b);
	free(select);
	flow_graph_release(&g);

	/* Forward only. */
	flow_graph_init(&g);
	int x = graphutil_tensor(&g, "x", FLOW_ROLE_INPUT, FLOW_DTYPE_F32, 2,
				 DIMS(4, 8));
	int w = PARAM(&g, "w", 8, 8);
	int t = IDS(&g, "targets", 4);
	int h = OP(&g, FLOW_OP_MATMUL, "mm", x, w, -1);
	int losses = graphutil_op(&g, FLOW_OP_CROSS_ENTROPY, "loss",
				  (const int[]){ h, t }, 2, 0, 8);
	graphutil_must(flow_graph_set_loss(&g, losses, &diag), &diag);
	expect_refusal(&g, 1024, NULL,
		       "cannot bucket gradients of a graph that is not differentiated");
	flow_graph_release(&g);
}

/* ---- the --verbose lines ------------------------------------------------------ */

static void test_grad_buckets_describe_prints_one_line_per_bucket(void **state)
{
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	char text[1024];

	(void)state;
	two_linears(&g);
	flow_grad_buckets_t *b = plan(&g, 767, NULL);
	FILE *f = tmpfile();
	assert_non_null(f);
	assert_int_equal(flow_grad_buckets_describe(b, &g, f, &diag), FLOW_OK);
	rewind(f);
	size_t n = fread(text, 1, sizeof text - 1, f);
	text[n] = '\0';
	fclose(f);
	assert_string_equal(text,
			    "bucket 0: 32 bytes after op 4 l2.backward: l2.bias.grad@0\n"
			    "bucket 1: 576 bytes after op 6 l1.backward: l2.weight.grad@0 l1.bias.grad@512\n"
			    "bucket 2: 512 bytes after op 6 l1.backward: l1.weight.grad@0\n");
	/* Against a graph it was not built from. */
	flow_graph_t small;
	flow_graph_init(&small);
	f = tmpfile();
	assert_non_null(f);
	assert_int_equal(flow_grad_buckets_describe(b, &small, f, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg,
			    "gradient bucket 0 launches after op 4, but the graph has 0 ops");
	fclose(f);
	flow_graph_release(&small);
	flow_grad_buckets_free(b);
	flow_grad_buckets_free(NULL);
	flow_graph_release(&g);
}

/* ---- property ------------------------------------------------------------------ */

/* Random GPTs, capacities from 1 byte to past the whole model (around
 * gradient sizes, where the edges are), and random selections: every
 * invariant holds, and the plan is a function of its inputs (built twice,
 * the same). */
static void test_grad_buckets_random_capacities_keep_invariants(void **state)
{
	const uint64_t seed = 0x6b75636b657473u;
	uint64_t rng = seed;

	(void)state;
	for (int trial = 0; trial < 12; trial++) {
		char spec[128];
		int heads = (int)splitmix64_range(&rng, 1, 3);
		snprintf(spec, sizeof spec,
			 "gpt:layers=%d,heads=%d,dim=%d,vocab=%d,seq=%d,pad=8",
			 (int)splitmix64_range(&rng, 1, 3), heads,
			 heads * (int)splitmix64_range(&rng, 2, 6),
			 (int)splitmix64_range(&rng, 10, 60),
			 (int)splitmix64_range(&rng, 2, 8));
		flow_graph_t g;
		gpt(&g, spec);
		size_t total = 0, largest = 0;
		for (size_t t = 0; t < g.ntensors; t++)
			if (g.tensors[t].role == FLOW_ROLE_PARAM_GRAD) {
				size_t n = flow_graph_tensor_bytes(&g, (int)t);
				total += align256(n);
				largest = n > largest ? n : largest;
			}
		bool *select = calloc(g.ntensors, sizeof *select);
		assert_non_null(select);
		for (int c = 0; c < 40; c++) {
			uint64_t case_seed = rng;
			size_t capacity;
			switch (c % 3) {
			case 0:
				capacity = (size_t)splitmix64_range(
					&rng, 1, (int64_t)(total + 512));
				break;
			case 1:
				capacity = (size_t)splitmix64_range(
					&rng, 1, (int64_t)(2 * largest));
				break;
			default:
				capacity = (size_t)splitmix64_range(&rng, 1,
								    1024);
				break;
			}
			bool all = splitmix64(&rng) % 4 == 0;
			for (size_t t = 0; t < g.ntensors; t++)
				select[t] = g.tensors[t].role == FLOW_ROLE_PARAM &&
					    splitmix64(&rng) % 3 != 0;
			flow_grad_buckets_t *b = plan(&g, capacity,
						      all ? NULL : select);
			flow_grad_buckets_t *again = plan(&g, capacity,
							  all ? NULL : select);
			char why[256];
			check_invariants(&g, b, all ? NULL : select, why,
					 sizeof why);
			if (!why[0] &&
			    (b->nbuckets != again->nbuckets ||
			     memcmp(b->buckets, again->buckets,
				    b->nbuckets * sizeof *b->buckets) ||
			     memcmp(b->members, again->members,
				    b->nmembers * sizeof *b->members)))
				snprintf(why, sizeof why, "two plans differ");
			if (why[0])
				fail_msg("seed 0x%" PRIx64 " trial %d case %d (rng state 0x%" PRIx64 "), %s, capacity %zu, %s: %s",
					 seed, trial, c, case_seed, spec,
					 capacity, all ? "all" : "selected",
					 why);
			flow_grad_buckets_free(again);
			flow_grad_buckets_free(b);
		}
		free(select);
		flow_graph_release(&g);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_grad_buckets_two_linears_split_by_layer),
		cmocka_unit_test(test_grad_buckets_bucket_launches_after_its_last_member),
		cmocka_unit_test(test_grad_buckets_oversized_gradient_gets_its_own_bucket),
		cmocka_unit_test(test_grad_buckets_tied_weight_is_ready_after_its_last_writer),
		cmocka_unit_test(test_grad_buckets_unwritten_gradient_is_ready_before_backward),
		cmocka_unit_test(test_grad_buckets_gpt_wte_is_last),
		cmocka_unit_test(test_grad_buckets_gpt_huge_capacity_is_one_bucket),
		cmocka_unit_test(test_grad_buckets_gpt_selection_keeps_only_selected),
		cmocka_unit_test(test_grad_buckets_refuses_with_one_line),
		cmocka_unit_test(test_grad_buckets_describe_prints_one_line_per_bucket),
		cmocka_unit_test(test_grad_buckets_random_capacities_keep_invariants),
	};
	graphutil_fail = fail_with;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
