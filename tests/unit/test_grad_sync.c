/* Overlapped gradient sums: every bucket launched once, in order, right
 * after its launch op; waiting reports what a pass left unlaunched; the
 * sums leave one rank's gradients as they were; device storages are
 * refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <flow/exec.h>
#include <flow/grad_sync.h>
#include <flow/model.h>

#include "worldutil.h"

/* A small GPT-2, B = 2 sequences of T = seq, differentiated, and its CPU
 * executor with initialised parameters and token inputs. */
static flow_exec_t *gpt_exec(flow_graph_t *g, flow_kernel_set_t set)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_gpt_config_t cfg;
	flow_exec_t *x = NULL;

	flow_graph_init(g);
	if (flow_gpt_parse("gpt:layers=2,heads=2,dim=32,vocab=64,seq=8", &cfg,
			   &diag) != FLOW_OK ||
	    flow_gpt_build(&cfg, 2, cfg.seq, g, &diag) != FLOW_OK ||
	    flow_graph_backward(g, &diag) != FLOW_OK ||
	    flow_exec_new(g, set, &x, &diag) != FLOW_OK ||
	    flow_exec_init_params(x, 3, &diag) != FLOW_OK)
		fail_msg("%s", diag.msg);
	int32_t *tok = flow_exec_tensor(x, flow_graph_find(g, "tokens"));
	int32_t *tgt = flow_exec_tensor(x, flow_graph_find(g, "targets"));
	for (int i = 0; i < 16; i++) {
		tok[i] = (i * 7) % 64;
		tgt[i] = (i * 5 + 1) % 64;
	}
	return x;
}

/* The op after which bucket k may go, found here from the graph alone: the
 * last op that writes any of its gradients (-1: none does). */
static int last_writer(const flow_graph_t *g, const flow_grad_bucket_t *k,
		       const flow_grad_buckets_t *b)
{
	int last = -1;
	for (size_t m = k->first; m < k->first + k->count; m++)
		for (size_t i = 0; i < g->nops; i++)
			for (int o = 0; o < g->ops[i].nout; o++)
				if (g->ops[i].out[o] == b->members[m].grad &&
				    (int)i > last)
					last = (int)i;
	return last;
}

/* The hook releases every bucket, once, right after the last op that
 * writes its gradients, pass after pass. */
static void test_grad_sync_launches_each_bucket_after_its_op(void **state)
{
	(void)state;
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_exec_t *x = gpt_exec(&g, FLOW_KERNELS_CPU);
	flow_grad_sync_t *s = NULL;
	double loss;

	/* 1 KiB buckets: several, so the order is visible. */
	assert_int_equal(flow_grad_sync_new(x, worldutil_comm, 1024, &s, &diag),
			 FLOW_OK);
	const flow_grad_buckets_t *b = flow_grad_sync_buckets(s);
	assert_true(b->nbuckets > 4);
	for (int pass = 0; pass < 2; pass++) {
		flow_exec_zero_param_grads(x);
		flow_grad_sync_arm(s);
		assert_int_equal(flow_exec_forward(x, &loss, &diag), FLOW_OK);
		assert_int_equal(flow_exec_backward(x, &diag), FLOW_OK);
		assert_int_equal(flow_grad_sync_wait(s, &diag), FLOW_OK);
		const int *after = NULL;
		assert_int_equal(flow_grad_sync_launched(s, &after), b->nbuckets);
		for (size_t k = 0; k < b->nbuckets; k++)
			assert_int_equal(after[k], last_writer(&g, &b->buckets[k], b));
	}
	flow_grad_sync_free(s);
	flow_exec_free(x);
	flow_graph_release(&g);
}

/* One rank's sum is its own gradient: overlapped or not, the same bits. */
static void test_grad_sync_one_rank_leaves_gradients_as_they_are(void **state)
{
	(void)state;
	flow_graph_t g1, g2;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_exec_t *plain = gpt_exec(&g1, FLOW_KERNELS_CPU);
	flow_exec_t *x = gpt_exec(&g2, FLOW_KERNELS_CPU);
	flow_grad_sync_t *s = NULL;
	double l1, l2;

	assert_int_equal(flow_grad_sync_new(x, worldutil_comm, 4096, &s, &diag),
			 FLOW_OK);
	flow_grad_sync_arm(s);
	assert_int_equal(flow_exec_forward(x, &l2, &diag), FLOW_OK);
	assert_int_equal(flow_exec_backward(x, &diag), FLOW_OK);
	assert_int_equal(flow_grad_sync_wait(s, &diag), FLOW_OK);
	assert_int_equal(flow_exec_forward(plain, &l1, &diag), FLOW_OK);
	assert_int_equal(flow_exec_backward(plain, &diag), FLOW_OK);
	assert_true(l1 == l2);
	for (size_t t = 0; t < g1.ntensors; t++)
		if (g1.tensors[t].role == FLOW_ROLE_PARAM_GRAD)
			assert_memory_equal(flow_exec_tensor(plain, (int)t),
					    flow_exec_tensor(x, (int)t),
					    flow_graph_tensor_bytes(&g1, (int)t));
	flow_grad_sync_free(s);
	flow_exec_free(x);
	flow_exec_free(plain);
	flow_graph_release(&g2);
	flow_graph_release(&g1);
}

/* Armed without a backward pass: only the buckets ready before one went. */
static void test_grad_sync_wait_names_buckets_a_pass_left(void **state)
{
	(void)state;
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_exec_t *x = gpt_exec(&g, FLOW_KERNELS_CPU);
	flow_grad_sync_t *s = NULL;

	assert_int_equal(flow_grad_sync_new(x, worldutil_comm, 1024, &s, &diag),
			 FLOW_OK);
	size_t n = flow_grad_sync_buckets(s)->nbuckets;
	flow_grad_sync_arm(s);
	assert_int_equal(flow_grad_sync_wait(s, &diag), FLOW_ERR_USAGE);
	char want[128];
	snprintf(want, sizeof want,
		 "the backward pass released 0 of %zu gradient buckets", n);
	assert_string_equal(diag.msg, want);
	flow_grad_sync_free(s);
	flow_exec_free(x);
	flow_graph_release(&g);
}

static void test_grad_sync_refuses_a_device_storage(void **state)
{
	(void)state;
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_exec_t *x = gpt_exec(&g, FLOW_KERNELS_STAGED);
	flow_grad_sync_t *s = NULL;

	assert_int_equal(flow_grad_sync_new(x, worldutil_comm, 1024, &s, &diag),
			 FLOW_ERR_USAGE);
	assert_null(s);
	assert_string_equal(diag.msg, "overlapped gradient sums need host memory "
				      "and a CPU communicator, or a device's "
				      "memory and NCCL");
	flow_exec_free(x);
	flow_graph_release(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_grad_sync_launches_each_bucket_after_its_op),
		cmocka_unit_test(test_grad_sync_one_rank_leaves_gradients_as_they_are),
		cmocka_unit_test(test_grad_sync_wait_names_buckets_a_pass_left),
		cmocka_unit_test(test_grad_sync_refuses_a_device_storage),
	};
	return cmocka_run_group_tests(tests, worldutil_setup, worldutil_teardown);
}
