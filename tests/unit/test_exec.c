/* The executor: the kernel sets' tables are full and the executor runs the
 * set it is given; the CPU kernel set agrees with the reference set on a
 * small GPT-like graph; activation gradients are cleared before each backward
 * pass while parameter gradients accumulate; the loss and its scale;
 * parameter initialisation (Philox by logical index, padded rows zero);
 * storage, the executor's and the host storage's; the profile.  The ops
 * of a localized graph that talk to other ranks (lib/runtime/exec_dist.c:
 * boxing, the vocabulary-parallel embedding and cross-entropy) need
 * ranks: tests/cluster/train.bats runs them under tensor parallelism
 * against one rank, and tests/unit/test_boxing_exec.c runs boxing plans
 * on one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <flow/boxing.h>
#include <flow/exec.h>
#include <flow/graph.h>
#include <flow/kernels.h>
#include <flow/kernels_ref.h>
#include <flow/ops.h>
#include <flow/rng.h>

#include "graphutil.h"

/* ---- tolerance (CPU against reference) ----------------------------------------
 * The reference kernels round each result once from double; the CPU ones
 * compute in float (BLAS GEMMs, float softmax, tanh and exp to ~1 ulp).
 * Over the dozen ops of one layer, relative float error grows to a few
 * 1e-6 of the terms summed, so RTOL = 1e-4 on values of size ~1; the
 * gradients are sums of terms of size ~1e-3 that cancel (|ref| can be far
 * below its terms), hence an ATOL of 1e-6, ~1e-3 of the largest gradient.
 * Measured with FLOW_TEST_VERBOSE=1: worst 0.05 of the tolerance. */
#define RTOL 1e-4
#define ATOL 1e-6

/* The graph helpers fail the current test. */
static void fail_graph(const char *msg)
{
	fail_msg("%s", msg);
}

/* ---- a one-block GPT ------------------------------------------------------------ */

enum { B = 2, T = 8, C = 32, NH = 4, V = 50, VP = 64 };

/* Embedding (wte tied with the head, padded rows), one pre-LN block,
 * ln_f, head, loss. */
static const graphutil_gpt_t gpt_one_block = { .layers = 1, .B = B, .T = T,
					       .C = C, .heads = NH, .V = V,
					       .Vp = VP };

static flow_exec_t *exec_new(const flow_graph_t *g, flow_kernel_set_t k)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_exec_t *x = NULL;

	if (flow_exec_new(g, k, &x, &diag) != FLOW_OK)
		fail_msg("%s", flow_diag_message(&diag));
	return x;
}

/* Parameters from seed 1234, the same pseudo-random tokens and targets
 * (one target ignored). */
static void exec_feed(flow_exec_t *x)
{
	const flow_graph_t *g = flow_exec_graph(x);
	int32_t *tok = flow_exec_tensor(x, flow_graph_find(g, "tokens"));
	int32_t *tgt = flow_exec_tensor(x, flow_graph_find(g, "targets"));

	assert_int_equal(flow_exec_init_params(x, 1234, NULL), FLOW_OK);
	for (int i = 0; i < B * T; i++) {
		tok[i] = (i * 17 + 3) % V;
		tgt[i] = (i * 29 + 11) % V;
	}
	tgt[5] = -1;
}

static double exec_step(flow_exec_t *x)
{
	double loss = graphutil_forward(x);

	graphutil_backward(x);
	return loss;
}

static bool transient(flow_role_t role)
{
	return role == FLOW_ROLE_ACTIVATION || role == FLOW_ROLE_SAVED ||
	       role == FLOW_ROLE_GRAD;
}

/* ---- kernel sets --------------------------------------------------------------- */

/* Every member of each set's table is that set's function of the kernel:
 * none is NULL, and none is the other set's. */
static void test_exec_kernel_tables_are_filled(void **state)
{
	const flow_kernels_t *cpu = &flow_cpu_kernels, *ref = &flow_ref_kernels;
	int members = 0;

	(void)state;
	assert_string_equal(cpu->name, "cpu");
	assert_string_equal(ref->name, "ref");
#define ASSERT_MEMBER(m)                                                   \
	do {                                                               \
		assert_true(cpu->m != NULL && cpu->m == flow_cpu_##m);     \
		assert_true(ref->m != NULL && ref->m == flow_ref_##m);     \
		assert_true(cpu->m != ref->m);                             \
		members++;                                                 \
	} while (0)
	ASSERT_MEMBER(matmul_forward);
	ASSERT_MEMBER(matmul_backward);
	ASSERT_MEMBER(embedding_forward);
	ASSERT_MEMBER(embedding_backward);
	ASSERT_MEMBER(layernorm_forward);
	ASSERT_MEMBER(layernorm_backward);
	ASSERT_MEMBER(gelu_forward);
	ASSERT_MEMBER(gelu_backward);
	ASSERT_MEMBER(matmul_gelu_forward);
	ASSERT_MEMBER(attention_forward);
	ASSERT_MEMBER(attention_scratch_bound);
	ASSERT_MEMBER(attention_backward);
	ASSERT_MEMBER(residual_forward);
	ASSERT_MEMBER(residual_backward);
	ASSERT_MEMBER(residual_layernorm_forward);
	ASSERT_MEMBER(layernorm_residual_backward);
	ASSERT_MEMBER(cross_entropy_forward_backward);
	ASSERT_MEMBER(matmul_bf16_scratch_bound);
	ASSERT_MEMBER(matmul_bf16_forward);
	ASSERT_MEMBER(matmul_bf16_backward);
	ASSERT_MEMBER(matmul_gelu_bf16_forward);
	ASSERT_MEMBER(layernorm_bf16_forward);
	ASSERT_MEMBER(layernorm_bf16_backward);
	ASSERT_MEMBER(gelu_bf16_forward);
	ASSERT_MEMBER(gelu_bf16_backward);
	ASSERT_MEMBER(residual_bf16_forward);
	ASSERT_MEMBER(residual_bf16_backward);
	ASSERT_MEMBER(residual_layernorm_bf16_forward);
	ASSERT_MEMBER(layernorm_residual_bf16_backward);
	ASSERT_MEMBER(attention_bf16_forward);
	ASSERT_MEMBER(attention_bf16_backward);
	ASSERT_MEMBER(cross_entropy_bf16_forward_backward);
	ASSERT_MEMBER(cross_entropy_bf16_split_max);
	ASSERT_MEMBER(cross_entropy_bf16_split_sums);
	ASSERT_MEMBER(cross_entropy_bf16_split_finish);
	ASSERT_MEMBER(adamw_update);
	ASSERT_MEMBER(sum_squares);
	ASSERT_MEMBER(scale);
	ASSERT_MEMBER(clip_grad_norm);
#undef ASSERT_MEMBER
	/* Shared by both host sets: the split cross-entropy rounds once from
	 * double already, and box moves are exact. */
#define ASSERT_SHARED(m, fn)                                               \
	do {                                                               \
		assert_true(cpu->m == fn && ref->m == fn);                 \
		members++;                                                 \
	} while (0)
	ASSERT_SHARED(cross_entropy_split_max, flow_cpu_cross_entropy_split_max);
	ASSERT_SHARED(cross_entropy_split_sums, flow_cpu_cross_entropy_split_sums);
	ASSERT_SHARED(cross_entropy_split_finish,
		      flow_cpu_cross_entropy_split_finish);
	ASSERT_SHARED(box_move, flow_boxing_move_region);
#undef ASSERT_SHARED
	/* Host kernels run to completion and cannot fail: no last(); their
	 * per-tensor AdamW costs nothing extra: no adamw_update_all. */
	assert_null(cpu->last);
	assert_null(ref->last);
	assert_null(cpu->adamw_update_all);
	assert_null(ref->adamw_update_all);
	/* The name, one pointer per kernel and the two optional members,
	 * nothing else: a member added to the table must be added above. */
	assert_int_equal(sizeof(flow_kernels_t),
			 sizeof(const char *) +
				 (size_t)(members + 2) * sizeof(cpu->scale));
}

/* x -> matmul (fc) -> gelu (act), differentiated from act's output: the
 * executor of each set, which runs fc and act as one kernel
 * (matmul_gelu_forward), computes exactly what that set's kernels give
 * when called in turn by hand, bit for bit; act's output, into y_out. */
enum { DN = 6, DIN = 16, DOUT = 24 };

static void exec_by_hand(flow_kernel_set_t set, const flow_kernels_t *k,
			 float y_out[DN * DOUT])
{
	flow_init_t normal = { FLOW_INIT_NORMAL, 0.5f, 0 };
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_graph_t g;
	float h[DN * DOUT], y[DN * DOUT], dh[DN * DOUT] = { 0 };
	float dw[DOUT * DIN] = { 0 }, db[DOUT] = { 0 };

	flow_graph_init(&g);
	int x = graphutil_tensor(&g, "x", FLOW_ROLE_INPUT, FLOW_DTYPE_F32, 2,
				 DIMS(DN, DIN));
	int w = INIT_PARAM(&g, "w", normal, DOUT, DIN);
	int b = INIT_PARAM(&g, "b", normal, DOUT);
	int fc = OP(&g, FLOW_OP_MATMUL, "fc", x, w, b);
	int act = OP(&g, FLOW_OP_GELU, "act", fc);
	int dy = graphutil_must(flow_graph_backward_from(&g, act, &diag), &diag);
	flow_exec_t *e = exec_new(&g, set);
	float *xv = flow_exec_tensor(e, x), *dyv = flow_exec_tensor(e, dy);

	assert_int_equal(flow_exec_init_params(e, 99, NULL), FLOW_OK);
	for (int i = 0; i < DN * DIN; i++)
		xv[i] = (float)((i * 7) % 13) / 6.0f - 1.0f;
	for (int i = 0; i < DN * DOUT; i++)
		dyv[i] = (float)((i * 5) % 11) / 10.0f - 0.5f;
	graphutil_forward(e);
	/* act's output lives until the backward pass reuses its bytes. */
	memcpy(y_out, flow_exec_tensor(e, act), sizeof(y));
	graphutil_backward(e);

	const float *wv = flow_exec_tensor(e, w), *bv = flow_exec_tensor(e, b);
	k->matmul_forward(h, xv, wv, bv, DN, DIN, DOUT);
	k->gelu_forward(y, h, DN * DOUT);
	k->gelu_backward(dh, h, dyv, DN * DOUT);
	k->matmul_backward(NULL, dw, db, dh, xv, wv, DN, DIN, DOUT);
	assert_memory_equal(y_out, y, sizeof(y));
	assert_memory_equal(flow_exec_tensor(e, g.tensors[w].grad), dw,
			    sizeof(dw));
	assert_memory_equal(flow_exec_tensor(e, g.tensors[b].grad), db,
			    sizeof(db));
	assert_int_equal(flow_exec_fused_pairs(e), 1);
	flow_exec_free(e);
	flow_graph_release(&g);
}

/* A tensor goes up and comes back through the storage's copies, and the
 * host storage says the host may address it. */
/* x -> matmul, forward only, into g; returns x. */
static int one_matmul(flow_graph_t *g)
{
	flow_init_t normal = { FLOW_INIT_NORMAL, 0.5f, 0 };

	flow_graph_init(g);
	int x = graphutil_tensor(g, "x", FLOW_ROLE_INPUT, FLOW_DTYPE_F32, 2,
				 DIMS(DN, DIN));
	int w = INIT_PARAM(g, "w", normal, DOUT, DIN);
	OP(g, FLOW_OP_MATMUL, "fc", x, w, -1);
	return x;
}

static void test_exec_tensor_upload_download_round_trip(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_graph_t g;
	float in[DN * DIN], out[DN * DIN];

	(void)state;
	int x = one_matmul(&g);
	flow_exec_t *e = exec_new(&g, FLOW_KERNELS_CPU);
	assert_true(flow_exec_storage(e)->host_addressable);
	assert_ptr_equal(flow_exec_kernels(e), &flow_cpu_kernels);
	for (int i = 0; i < DN * DIN; i++)
		in[i] = (float)i - 3.5f;
	assert_int_equal(flow_exec_tensor_upload(e, x, in, &diag), FLOW_OK);
	assert_memory_equal(flow_exec_tensor(e, x), in, sizeof(in));
	memset(out, 0xff, sizeof(out));
	assert_int_equal(flow_exec_tensor_download(e, x, out, &diag), FLOW_OK);
	assert_memory_equal(out, in, sizeof(in));
	flow_exec_free(e);
	flow_graph_release(&g);
}

/* Each kernel set names its kernels and its storage: the staged set is the
 * CPU's kernels over a storage the executor must copy through. */
static void test_exec_kernel_sets_name_their_device(void **state)
{
	static const struct {
		flow_kernel_set_t set;
		const flow_kernels_t *kernels;
		const char *storage;
		bool host;
	} sets[] = {
		{ FLOW_KERNELS_CPU, &flow_cpu_kernels, "host", true },
		{ FLOW_KERNELS_REF, &flow_ref_kernels, "host", true },
		{ FLOW_KERNELS_STAGED, &flow_cpu_kernels, "staged", false },
	};
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_graph_t g;
	flow_exec_t *e = NULL;

	(void)state;
	int x = one_matmul(&g);
	for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
		e = exec_new(&g, sets[i].set);
		assert_ptr_equal(flow_exec_kernels(e), sets[i].kernels);
		assert_string_equal(flow_exec_storage(e)->name, sets[i].storage);
		assert_int_equal(flow_exec_storage(e)->host_addressable,
				 sets[i].host);
		float in[DN * DIN], out[DN * DIN];
		for (int k = 0; k < DN * DIN; k++)
			in[k] = (float)k;
		assert_int_equal(flow_exec_tensor_upload(e, x, in, &diag), FLOW_OK);
		assert_int_equal(flow_exec_tensor_download(e, x, out, &diag),
				 FLOW_OK);
		assert_memory_equal(out, in, sizeof in);
		/* A device's copy stream: the host's storage has none, the
		 * staged one copies at once (its events marking work that is
		 * already done). */
		const flow_exec_storage_t *st = flow_exec_storage(e);
		assert_int_equal(st->copy_in_ahead != NULL, !sets[i].host);
		assert_int_equal(st->event_new != NULL, !sets[i].host);
		if (st->copy_in_ahead) {
			void *done = st->event_new();
			assert_non_null(done);
			for (int k = 0; k < DN * DIN; k++)
				in[k] = (float)-k;
			st->copy_in_ahead(flow_exec_tensor(e, x), in, sizeof in,
					  NULL, done);
			st->kernels_wait(done);
			st->event_wait(done);
			assert_int_equal(flow_exec_tensor_download(e, x, out,
								   &diag),
					 FLOW_OK);
			assert_memory_equal(out, in, sizeof in);
			st->event_free(done);
		}
		flow_exec_free(e);
	}
	assert_int_equal(flow_exec_new(&g, (flow_kernel_set_t)99, &e, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "unknown kernel set 99");
	flow_graph_release(&g);
}

/* Without a GPU the CUDA set is one line, from the module or the driver,
 * and no executor. */
static void test_exec_cuda_without_a_gpu_is_one_line(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_graph_t g;
	flow_exec_t *e = NULL;

	(void)state;
	if (access("/dev/nvidia0", F_OK) == 0)
		skip(); /* tests/gpu/run.sh runs the CUDA executor */
	(void)one_matmul(&g);
	assert_int_equal(flow_exec_new(&g, FLOW_KERNELS_CUDA, &e, &diag),
			 FLOW_ERR_NOTSUP);
	assert_null(e);
	assert_null(strchr(diag.msg, '\n'));
	assert_true(strstr(diag.msg, "no usable CUDA driver or device: ") ||
		    strstr(diag.msg, "no CUDA support"));
	flow_graph_release(&g);
}

/* r = x + h, then layernorm(r), and its backward from a seed gradient
 * of the layernorm's output, where h is the input y itself or matmul(y),
 * whose bytes would die at the add but for the pair (the memory plan
 * counts a fused pair as one op).  The executor fuses both pairs and gives
 * exactly what the kernels give called in turn by hand: residual_forward,
 * layernorm_forward, layernorm_backward, residual_backward.  Returns how
 * many pairs it fused. */
static size_t residual_layernorm_by_hand(flow_kernel_set_t set,
					 const flow_kernels_t *k, bool via_matmul)
{
	flow_init_t normal = { FLOW_INIT_NORMAL, 0.5f, 0 };
	flow_init_t ones = { FLOW_INIT_ONES, 0.0f, 0 };
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_graph_t g;
	float h[DN * DOUT], r[DN * DOUT], ln[DN * DOUT], mean[DN], rstd[DN];
	float dr[DN * DOUT] = { 0 }, dh[DN * DOUT] = { 0 };
	float dlw[DOUT] = { 0 }, dlb[DOUT] = { 0 };

	flow_graph_init(&g);
	int x = graphutil_tensor(&g, "x", FLOW_ROLE_INPUT, FLOW_DTYPE_F32, 2,
				 DIMS(DN, DOUT));
	int y = graphutil_tensor(&g, "y", FLOW_ROLE_INPUT, FLOW_DTYPE_F32, 2,
				 DIMS(DN, via_matmul ? DIN : DOUT));
	int w = INIT_PARAM(&g, "w", normal, DOUT, DIN);
	int lw = INIT_PARAM(&g, "ln.weight", ones, DOUT);
	int lb = INIT_PARAM(&g, "ln.bias", normal, DOUT);
	int hv = via_matmul ? OP(&g, FLOW_OP_MATMUL, "fc", y, w, -1) : y;
	int res = OP(&g, FLOW_OP_ADD, "residual", x, hv);
	int out = OP(&g, FLOW_OP_LAYERNORM, "ln", res, lw, lb);
	int dy = graphutil_must(flow_graph_backward_from(&g, out, &diag), &diag);
	flow_exec_t *e = exec_new(&g, set);
	float *xv = flow_exec_tensor(e, x), *yv = flow_exec_tensor(e, y);
	float *dyv = flow_exec_tensor(e, dy);

	assert_int_equal(flow_exec_init_params(e, 7, NULL), FLOW_OK);
	for (int i = 0; i < DN * DOUT; i++) {
		xv[i] = (float)((i * 7) % 13) / 6.0f + 2.0f;
		dyv[i] = (float)((i * 3) % 7) / 4.0f - 0.75f;
	}
	for (size_t i = 0; i < (size_t)DN * (via_matmul ? DIN : DOUT); i++)
		yv[i] = (float)((i * 5) % 11) / 10.0f - 0.5f;
	graphutil_forward(e);
	/* Both die in the backward pass, whose tensors may reuse them. */
	float got_r[DN * DOUT], got_ln[DN * DOUT];
	memcpy(got_r, flow_exec_tensor(e, res), sizeof(got_r));
	memcpy(got_ln, flow_exec_tensor(e, out), sizeof(got_ln));
	graphutil_backward(e);

	const float *wv = flow_exec_tensor(e, w);
	const float *lwv = flow_exec_tensor(e, lw), *lbv = flow_exec_tensor(e, lb);
	if (via_matmul)
		k->matmul_forward(h, yv, wv, NULL, DN, DIN, DOUT);
	else
		memcpy(h, yv, sizeof(h));
	k->residual_forward(r, xv, h, DN * DOUT);
	k->layernorm_forward(ln, mean, rstd, r, lwv, lbv, DN, DOUT);
	k->layernorm_backward(dr, dlw, dlb, dyv, r, lwv, mean, rstd, DN, DOUT);
	k->residual_backward(NULL, dh, dr, DN * DOUT);
	assert_memory_equal(got_r, r, sizeof(r));
	assert_memory_equal(got_ln, ln, sizeof(ln));
	assert_memory_equal(flow_exec_tensor(e, g.tensors[lw].grad), dlw,
			    sizeof(dlw));
	assert_memory_equal(flow_exec_tensor(e, g.tensors[lb].grad), dlb,
			    sizeof(dlb));
	if (via_matmul) /* h's gradient reaches w through the matmul */
		assert_memory_equal(flow_exec_tensor(e, g.tensors[hv].grad), dh,
				    sizeof(dh));
	size_t fused = flow_exec_fused_pairs(e);
	flow_exec_free(e);
	flow_graph_release(&g);
	return fused;
}

static void test_exec_fuses_residual_and_layernorm(void **state)
{
	(void)state;
	assert_int_equal(residual_layernorm_by_hand(FLOW_KERNELS_CPU,
						    &flow_cpu_kernels, false),
			 1);
	assert_int_equal(residual_layernorm_by_hand(FLOW_KERNELS_REF,
						    &flow_ref_kernels, false),
			 1);
	assert_int_equal(residual_layernorm_by_hand(FLOW_KERNELS_CPU,
						    &flow_cpu_kernels, true),
			 2);
	assert_int_equal(residual_layernorm_by_hand(FLOW_KERNELS_REF,
						    &flow_ref_kernels, true),
			 2);
	/* GPT-2: every residual add feeds a layernorm (ln_2, the next
	 * block's ln_1, ln_f): two pairs a block, forward and backward;
	 * and the MLP's fc matmul feeds its GELU. */
	flow_graph_t g;
	graphutil_gpt_build(&g, &gpt_one_block, true);
	flow_exec_t *x = exec_new(&g, FLOW_KERNELS_CPU);
	assert_int_equal(flow_exec_fused_pairs(x), 5);
	flow_exec_free(x);
	flow_graph_release(&g);
}

static void test_exec_runs_the_kernels_of_its_set(void **state)
{
	float cpu[DN * DOUT], ref[DN * DOUT];

	(void)state;
	exec_by_hand(FLOW_KERNELS_CPU, &flow_cpu_kernels, cpu);
	exec_by_hand(FLOW_KERNELS_REF, &flow_ref_kernels, ref);
	/* The sets round differently here, so each executor ran its own. */
	assert_true(memcmp(cpu, ref, sizeof(cpu)) != 0);
}

static float *param_grads_copy(flow_exec_t *x);
static size_t param_grads_count(const flow_graph_t *g);

/* The one-block GPT with activations in act. */
static void gpt_build(flow_graph_t *g, flow_dtype_t act)
{
	graphutil_gpt_t d = gpt_one_block;

	d.act = act;
	graphutil_gpt_build(g, &d, true);
}

/* How far the CPU's tensor a may be from the reference's b, n elements.
 * fp32: every element within ATOL + RTOL |b|.  bf16: the two sets round
 * their bf16 activations from fp32 sums that differ in their last bits,
 * so an activation may round to the neighbouring bf16 value (2^-8
 * relative) on one side, and the flip reaches every gradient downstream,
 * diluted by the many terms each sums: each element within 2^-10 max|b|
 * and the whole within 2^-12 of |b| in the L2 norm (measured,
 * FLOW_TEST_VERBOSE=1: the worst element at 1.1e-4 of it).  Returns the
 * worst element's error in units of its bound. */
static double sets_close(const char *name, const float *a, const float *b,
			 size_t n, bool bf16)
{
	double scale = 0.0, diff = 0.0, norm = 0.0, worst = 0.0;

	for (size_t i = 0; i < n; i++)
		scale = fmax(scale, fabs((double)b[i]));
	for (size_t i = 0; i < n; i++) {
		double err = fabs((double)a[i] - (double)b[i]);
		double lim = bf16 ? 0x1p-10 * scale + ATOL :
				    ATOL + RTOL * fabs((double)b[i]);
		worst = fmax(worst, err / lim);
		if (!(err <= lim))
			fail_msg("%s[%zu]: cpu %.9g, ref %.9g", name, i,
				 (double)a[i], (double)b[i]);
		diff += err * err;
		norm += (double)b[i] * (double)b[i];
	}
	if (bf16 && !(sqrt(diff) <= 0x1p-12 * sqrt(norm) + ATOL))
		fail_msg("%s: cpu and ref %.3g apart in L2, of %.3g", name,
			 sqrt(diff), sqrt(norm));
	return worst;
}

/* One step of the one-block GPT on the CPU and reference sets, fp32 or
 * with bf16 activations: the loss and every parameter gradient agree to
 * sets_close; the reference's gradients, into *grads (free them) and
 * their count into *ngrads. */
static void cpu_matches_reference(bool bf16, float **grads, size_t *ngrads)
{
	flow_graph_t g;
	double worst = 0.0;

	gpt_build(&g, bf16 ? FLOW_DTYPE_BF16 : FLOW_DTYPE_F32);
	flow_exec_t *cpu = exec_new(&g, FLOW_KERNELS_CPU);
	flow_exec_t *ref = exec_new(&g, FLOW_KERNELS_REF);
	exec_feed(cpu);
	exec_feed(ref);
	double lc = exec_step(cpu), lr = exec_step(ref);
	assert_true(fabs(lc - lr) <= (bf16 ? 1e-3 : RTOL) * lr);
	/* Near-uniform logits over V = 50: about ln 50 = 3.9 (one of the 16
	 * targets is ignored and counts 0). */
	assert_true(lr > 3.0 && lr < 5.0);

	for (size_t t = 0; t < g.ntensors; t++) {
		flow_role_t role = g.tensors[t].role;
		/* The param grads, and the losses (live to the end). */
		if (role != FLOW_ROLE_PARAM_GRAD && (int)t != g.loss)
			continue;
		const float *a = flow_exec_tensor(cpu, (int)t);
		const float *b = flow_exec_tensor(ref, (int)t);
		size_t n = flow_graph_tensor_numel(&g, (int)t);
		bool nonzero = false;
		worst = fmax(worst, sets_close(g.tensors[t].name, a, b, n, bf16));
		for (size_t i = 0; i < n; i++)
			nonzero = nonzero || b[i] != 0.0f;
		assert_true(nonzero); /* every parameter gets a gradient */
	}
	if (getenv("FLOW_TEST_VERBOSE"))
		print_message("cpu vs ref (%s): worst error %.3g of the "
			      "tolerance\n", bf16 ? "bf16" : "fp32", worst);
	*grads = param_grads_copy(ref);
	*ngrads = param_grads_count(&g);
	flow_exec_free(cpu);
	flow_exec_free(ref);
	flow_graph_release(&g);
}

static void test_exec_cpu_matches_reference(void **state)
{
	float *grads;
	size_t n;

	(void)state;
	cpu_matches_reference(false, &grads, &n);
	free(grads);
}

/* Mixed precision: the same agreement with bf16 activations, and
 * gradients that are not the fp32 ones (the activations were rounded)
 * but near them: in the L2 norm of the difference, above fp32 rounding
 * and below 2% (bf16 roundings of up to 2^-9 relative each, through a
 * block's dozen; measured 0.0058). */
static void test_exec_bf16_cpu_matches_reference(void **state)
{
	float *fp32, *bf16;
	size_t n, n16;
	double diff = 0.0, norm = 0.0;

	(void)state;
	cpu_matches_reference(false, &fp32, &n);
	cpu_matches_reference(true, &bf16, &n16);
	assert_int_equal(n, n16);
	for (size_t i = 0; i < n; i++) {
		double d = (double)bf16[i] - (double)fp32[i];
		diff += d * d;
		norm += (double)fp32[i] * (double)fp32[i];
	}
	diff = sqrt(diff / norm);
	if (getenv("FLOW_TEST_VERBOSE"))
		print_message("bf16 vs fp32 gradients: relative L2 %.3g\n",
			      diff);
	assert_true(diff > 1e-4 && diff < 2e-2);
	free(fp32);
	free(bf16);
}

/* What bf16 activations are (flow/ops.h): the outputs of the layernorms,
 * matmuls, GELU and attention, and the gradients of all of them, are
 * bf16; the residual stream, statistics, losses and parameters f32.  The
 * arena holding them shrinks accordingly, and every bf16 op runs its
 * kernel's bf16 twin. */
static void test_exec_bf16_activations(void **state)
{
	flow_graph_t g, g32;
	size_t bf16 = 0;

	(void)state;
	gpt_build(&g, FLOW_DTYPE_BF16);
	gpt_build(&g32, FLOW_DTYPE_F32);
	for (size_t t = 0; t < g.ntensors; t++) {
		const flow_graph_tensor_t *x = &g.tensors[t];
		int of = x->grad_of >= 0 ? x->grad_of : (int)t;
		const char *name = g.tensors[of].name;
		size_t len = strlen(name);
		bool act = g.tensors[of].role == FLOW_ROLE_ACTIVATION &&
			   len > 4 && strcmp(name + len - 4, ".out") == 0 &&
			   strncmp(name, "embed", 5) != 0 &&
			   strncmp(name, "residual", 8) != 0;
		if (x->dtype != (act ? FLOW_DTYPE_BF16 : g32.tensors[t].dtype))
			fail_msg("%s is %s", x->name,
				 flow_dtype_name(x->dtype));
		bf16 += act;
	}
	/* ln_1, c_attn, attn, attn.c_proj, ln_2, c_fc, gelu, mlp.c_proj,
	 * ln_f, lm_head: each output and its gradient. */
	assert_int_equal(bf16, 20);

	flow_exec_t *x = exec_new(&g, FLOW_KERNELS_CPU);
	flow_exec_t *x32 = exec_new(&g32, FLOW_KERNELS_CPU);
	size_t arena = flow_exec_memplan(x)->arena_bytes;
	size_t arena32 = flow_exec_memplan(x32)->arena_bytes;
	if (getenv("FLOW_TEST_VERBOSE"))
		print_message("arena: bf16 %zu bytes, fp32 %zu\n", arena,
			      arena32);
	assert_true(arena < arena32 * 3 / 4);
	/* Rounded weights and widened rows. */
	assert_true(flow_exec_scratch_bytes(x) > flow_exec_scratch_bytes(x32));
	flow_exec_free(x);
	flow_exec_free(x32);
	flow_graph_release(&g);
	flow_graph_release(&g32);
}

/* ---- gradients across steps ------------------------------------------------------ */

/* Copies of every parameter gradient, one buffer. */
static float *param_grads_copy(flow_exec_t *x)
{
	const flow_graph_t *g = flow_exec_graph(x);
	size_t total = 0, at = 0;

	for (size_t t = 0; t < g->ntensors; t++)
		if (g->tensors[t].role == FLOW_ROLE_PARAM_GRAD)
			total += flow_graph_tensor_numel(g, (int)t);
	float *copy = malloc(total * sizeof(float));
	assert_non_null(copy);
	for (size_t t = 0; t < g->ntensors; t++) {
		if (g->tensors[t].role != FLOW_ROLE_PARAM_GRAD)
			continue;
		size_t n = flow_graph_tensor_numel(g, (int)t);
		memcpy(copy + at, flow_exec_tensor(x, (int)t), n * sizeof(float));
		at += n;
	}
	return copy;
}

static size_t param_grads_count(const flow_graph_t *g)
{
	size_t total = 0;

	for (size_t t = 0; t < g->ntensors; t++)
		if (g->tensors[t].role == FLOW_ROLE_PARAM_GRAD)
			total += flow_graph_tensor_numel(g, (int)t);
	return total;
}

static void test_exec_backward_clears_activation_gradients(void **state)
{
	flow_graph_t g;

	(void)state;
	graphutil_gpt_build(&g, &gpt_one_block, true);
	flow_exec_t *x = exec_new(&g, FLOW_KERNELS_CPU);
	exec_feed(x);
	/* The embedding's gradient is read by the last op, so it is still
	 * intact when the pass ends. */
	int dx = g.tensors[flow_graph_find(&g, "embed.out")].grad;
	assert_int_equal(g.ops[g.nops - 1].in[0], dx);
	size_t ndx = flow_graph_tensor_numel(&g, dx);

	flow_exec_zero_param_grads(x);
	double l1 = exec_step(x);
	float *g1 = param_grads_copy(x);
	float *dx1 = malloc(ndx * sizeof(float));
	assert_non_null(dx1);
	memcpy(dx1, flow_exec_tensor(x, dx), ndx * sizeof(float));

	/* Garbage in every transient byte: a gradient not cleared before its
	 * first accumulation would carry it into the second pass. */
	for (size_t t = 0; t < g.ntensors; t++) {
		if (!transient(g.tensors[t].role))
			continue;
		float *p = flow_exec_tensor(x, (int)t);
		for (size_t i = 0; i < flow_graph_tensor_numel(&g, (int)t); i++)
			p[i] = 1e30f;
	}
	flow_exec_zero_param_grads(x);
	double l2 = exec_step(x);
	float *g2 = param_grads_copy(x);
	assert_true(l1 == l2);
	assert_memory_equal(g1, g2, param_grads_count(&g) * sizeof(float));
	assert_memory_equal(dx1, flow_exec_tensor(x, dx), ndx * sizeof(float));
	free(g1);
	free(g2);
	free(dx1);
	flow_exec_free(x);
	flow_graph_release(&g);
}

static void test_exec_param_grads_accumulate_across_passes(void **state)
{
	flow_graph_t g;

	(void)state;
	graphutil_gpt_build(&g, &gpt_one_block, true);
	flow_exec_t *x = exec_new(&g, FLOW_KERNELS_REF);
	exec_feed(x);
	flow_exec_zero_param_grads(x);
	(void)exec_step(x);
	float *g1 = param_grads_copy(x);
	(void)exec_step(x); /* no zeroing: micro-batches accumulate */
	float *g2 = param_grads_copy(x);
	size_t n = param_grads_count(&g);
	double big = 0.0;
	for (size_t i = 0; i < n; i++)
		big = fmax(big, fabs((double)g1[i]));
	/* 2 g1 to float rounding: each pass adds its (double) sum to the
	 * buffer and rounds, a few ulps of the largest gradient. */
	for (size_t i = 0; i < n; i++)
		if (!(fabs((double)g2[i] - 2.0 * g1[i]) <=
		      0x1p-20 * big + 0x1p-22 * fabs((double)g1[i])))
			fail_msg("grad %zu: %.9g after two passes, %.9g after "
				 "one",
				 i, (double)g2[i], (double)g1[i]);
	flow_exec_zero_param_grads(x);
	float *g0 = param_grads_copy(x);
	for (size_t i = 0; i < n; i++)
		assert_true(g0[i] == 0.0f);
	free(g0);
	free(g1);
	free(g2);
	flow_exec_free(x);
	flow_graph_release(&g);
}

/* ---- the loss ------------------------------------------------------------------ */

static void test_exec_loss_is_the_mean_and_its_scale_scales_gradients(
	void **state)
{
	flow_graph_t g;

	(void)state;
	graphutil_gpt_build(&g, &gpt_one_block, true);
	flow_exec_t *x = exec_new(&g, FLOW_KERNELS_REF);
	size_t n = param_grads_count(&g);

	/* Parameters all zero (no init): uniform logits, loss ln V. */
	int32_t *tgt = flow_exec_tensor(x, flow_graph_find(&g, "targets"));
	for (int i = 0; i < B * T; i++)
		tgt[i] = i % V;
	assert_true(fabs(graphutil_forward(x) - log((double)V)) <= 1e-6);

	exec_feed(x); /* one target ignored: its loss is 0 */
	double loss = graphutil_forward(x);
	const float *losses = flow_exec_tensor(x, g.loss);
	double sum = 0.0;
	for (int i = 0; i < B * T; i++)
		sum += losses[i];
	assert_true(losses[5] == 0.0f);
	assert_true(loss == sum / (B * T));

	/* Default scale 1 / tokens; doubling it doubles every gradient
	 * exactly (the reference rounds once, and x2 is exact). */
	flow_exec_zero_param_grads(x);
	(void)exec_step(x);
	float *g1 = param_grads_copy(x);
	flow_exec_set_loss_scale(x, 2.0f / (B * T));
	flow_exec_zero_param_grads(x);
	(void)exec_step(x);
	float *g2 = param_grads_copy(x);
	for (size_t i = 0; i < n; i++)
		assert_true(g2[i] == 2.0f * g1[i]);
	free(g1);
	free(g2);
	flow_exec_free(x);
	flow_graph_release(&g);
}

/* ---- initialisation -------------------------------------------------------------- */

static void test_exec_init_draws_philox_by_logical_index(void **state)
{
	flow_graph_t g;
	const uint64_t seed = 77;

	(void)state;
	flow_graph_init(&g);
	flow_init_t normal = { FLOW_INIT_NORMAL, 0.5f, 0 };
	flow_init_t rows = { FLOW_INIT_NORMAL, 0.25f, 5 };
	flow_init_t ones_rows = { FLOW_INIT_ONES, 0, 3 };
	flow_init_t zeros = { FLOW_INIT_ZEROS, 0, 0 };
	flow_init_t none = { FLOW_INIT_NONE, 0, 0 };
	int w = INIT_PARAM(&g, "h.0.attn.c_attn.weight", normal, 5, 6);
	int e = INIT_PARAM(&g, "wte", rows, 8, 3);
	int o = INIT_PARAM(&g, "ln.weight", ones_rows, 4, 2);
	int z = INIT_PARAM(&g, "ln.bias", zeros, 7);
	int n = INIT_PARAM(&g, "other", none, 3);
	flow_exec_t *x = exec_new(&g, FLOW_KERNELS_CPU);

	/* Zero until initialised. */
	const float *pw = flow_exec_tensor(x, w);
	for (int i = 0; i < 30; i++)
		assert_true(pw[i] == 0.0f);
	/* Overwrites whatever was there. */
	float *pz = flow_exec_tensor(x, z), *pn = flow_exec_tensor(x, n);
	for (int i = 0; i < 7; i++)
		pz[i] = 5.0f;
	for (int i = 0; i < 3; i++)
		pn[i] = 5.0f;
	assert_int_equal(flow_exec_init_params(x, seed, NULL), FLOW_OK);

	uint64_t sw = flow_rng_stream_id("h.0.attn.c_attn.weight");
	for (int i = 0; i < 30; i++)
		assert_true(pw[i] == flow_rng_normal(seed, sw, (uint64_t)i) * 0.5f);
	/* Padded rows: the first 5 rows are drawn, element i still from
	 * index i; the rest are zero. */
	const float *pe = flow_exec_tensor(x, e);
	uint64_t se = flow_rng_stream_id("wte");
	for (int i = 0; i < 24; i++)
		assert_true(pe[i] == (i < 15 ? flow_rng_normal(seed, se,
							       (uint64_t)i) *
						       0.25f :
					       0.0f));
	const float *po = flow_exec_tensor(x, o);
	for (int i = 0; i < 8; i++)
		assert_true(po[i] == (i < 6 ? 1.0f : 0.0f));
	for (int i = 0; i < 7; i++)
		assert_true(pz[i] == 0.0f);
	for (int i = 0; i < 3; i++)
		assert_true(pn[i] == 0.0f);
	flow_exec_free(x);
	flow_graph_release(&g);
}

static void test_exec_init_depends_on_names_and_seed_only(void **state)
{
	flow_graph_t g1, g2;
	flow_init_t normal = { FLOW_INIT_NORMAL, 0.02f, 0 };

	(void)state;
	flow_graph_init(&g1);
	flow_graph_init(&g2);
	int a1 = INIT_PARAM(&g1, "a", normal, 10, 10);
	int b1 = INIT_PARAM(&g1, "b", normal, 300);
	int b2 = INIT_PARAM(&g2, "b", normal, 300); /* other order, other set */
	int a2 = INIT_PARAM(&g2, "a", normal, 10, 10);
	flow_exec_t *x1 = exec_new(&g1, FLOW_KERNELS_CPU);
	flow_exec_t *x2 = exec_new(&g2, FLOW_KERNELS_REF);
	assert_int_equal(flow_exec_init_params(x1, 5, NULL), FLOW_OK);
	assert_int_equal(flow_exec_init_params(x2, 5, NULL), FLOW_OK);
	assert_memory_equal(flow_exec_tensor(x1, a1), flow_exec_tensor(x2, a2),
			    100 * sizeof(float));
	assert_memory_equal(flow_exec_tensor(x1, b1), flow_exec_tensor(x2, b2),
			    300 * sizeof(float));
	/* Distinct names, distinct streams; another seed, other values. */
	assert_memory_not_equal(flow_exec_tensor(x1, a1),
				flow_exec_tensor(x1, b1), 100 * sizeof(float));
	assert_int_equal(flow_exec_init_params(x2, 6, NULL), FLOW_OK);
	assert_memory_not_equal(flow_exec_tensor(x1, a1),
				flow_exec_tensor(x2, a2), 100 * sizeof(float));
	flow_exec_free(x1);
	flow_exec_free(x2);
	flow_graph_release(&g1);
	flow_graph_release(&g2);
}

/* ---- storage ----------------------------------------------------------------------- */

/* The host storage: zeroed, 64-byte aligned blocks (a valid, unique one for
 * 0 bytes), a range cleared exactly, NULL freed as nothing. */
static void test_exec_host_storage_gives_zeroed_aligned_blocks(void **state)
{
	const flow_exec_storage_t *st = &flow_exec_storage_host;
	unsigned char *p, *e0, *e1;

	(void)state;
	assert_string_equal(st->name, "host");
	p = st->alloc(100);
	assert_non_null(p);
	assert_int_equal((uintptr_t)p % 64, 0);
	for (int i = 0; i < 100; i++)
		assert_int_equal(p[i], 0);
	memset(p, 0xab, 100);
	st->zero(p + 8, 16);
	for (int i = 0; i < 100; i++)
		assert_int_equal(p[i], i >= 8 && i < 24 ? 0 : 0xab);
	e0 = st->alloc(0);
	e1 = st->alloc(0);
	assert_non_null(e0);
	assert_non_null(e1);
	assert_ptr_not_equal(e0, e1);
	st->free(e1);
	st->free(e0);
	st->free(p);
	st->free(NULL);
}

static void test_exec_storage_is_aligned_and_grads_mirror_params(void **state)
{
	flow_graph_t g;

	(void)state;
	graphutil_gpt_build(&g, &gpt_one_block, true);
	flow_exec_t *x = exec_new(&g, FLOW_KERNELS_CPU);
	const flow_memplan_t *plan = flow_exec_memplan(x);
	char *first_param = NULL, *first_grad = NULL, *prev = NULL;

	assert_ptr_equal(flow_exec_graph(x), &g);
	assert_int_equal(plan->ntensors, g.ntensors);
	assert_true(plan->arena_bytes > 0 &&
		    plan->arena_bytes < plan->unshared_bytes);
	assert_null(flow_exec_tensor(x, -1));
	assert_null(flow_exec_tensor(x, (int)g.ntensors));
	for (size_t t = 0; t < g.ntensors; t++) {
		const flow_graph_tensor_t *p = &g.tensors[t];
		char *ptr = flow_exec_tensor(x, (int)t);
		assert_non_null(ptr);
		assert_int_equal((uintptr_t)ptr % 64, 0);
		if (p->alias_of >= 0)
			assert_ptr_equal(ptr, flow_exec_tensor(x, p->alias_of));
		if (p->role != FLOW_ROLE_PARAM)
			continue;
		/* One block, graph order; the gradient block has the same
		 * layout. */
		char *grad = flow_exec_tensor(x, p->grad);
		if (!first_param) {
			first_param = ptr;
			first_grad = grad;
		}
		assert_true(!prev || ptr > prev);
		prev = ptr;
		assert_int_equal(ptr - first_param, grad - first_grad);
	}
	flow_exec_free(x);
	flow_graph_release(&g);
}

static void test_exec_runs_a_forward_only_graph(void **state)
{
	flow_graph_t g;

	(void)state;
	graphutil_gpt_build(&g, &gpt_one_block, false);
	flow_exec_t *ref = exec_new(&g, FLOW_KERNELS_REF);
	flow_exec_t *cpu = exec_new(&g, FLOW_KERNELS_CPU);
	exec_feed(ref);
	exec_feed(cpu);
	flow_exec_zero_param_grads(cpu); /* nothing to zero */
	double lr = graphutil_forward(ref), lc = graphutil_forward(cpu);
	graphutil_backward(cpu); /* no backward ops: nothing happens */
	assert_true(fabs(lc - lr) <= RTOL * lr);
	/* Same parameters and tokens as the differentiated graph: same loss. */
	flow_graph_t gd;
	graphutil_gpt_build(&gd, &gpt_one_block, true);
	flow_exec_t *d = exec_new(&gd, FLOW_KERNELS_REF);
	exec_feed(d);
	assert_true(graphutil_forward(d) == lr);
	flow_exec_free(d);
	flow_graph_release(&gd);
	flow_exec_free(ref);
	flow_exec_free(cpu);
	flow_graph_release(&g);
}

static void test_exec_new_rejects_bad_graphs_and_kernel_sets(void **state)
{
	flow_graph_t g;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_exec_t *x = (flow_exec_t *)&g; /* must stay untouched */

	(void)state;
	graphutil_gpt_build(&g, &gpt_one_block, true);
	assert_int_equal(flow_exec_new(&g, (flow_kernel_set_t)7, &x, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "unknown kernel set 7");
	assert_ptr_equal(x, &g);
	flow_diag_clear(&diag);
	g.ops[3].in[0] = 9999;
	assert_int_equal(flow_exec_new(&g, FLOW_KERNELS_CPU, &x, &diag),
			 FLOW_ERR_FORMAT);
	assert_string_equal(diag.msg, "op 3 (attn): input 9999 is out of range");
	assert_ptr_equal(x, &g);
	flow_graph_release(&g);
}

/* ---- the profile ------------------------------------------------------------------ */

static void test_exec_profile_counts_every_op_kind(void **state)
{
	flow_graph_t g;
	flow_profile_row_t rows[FLOW_OP_KIND_COUNT + 20];
	uint64_t want_calls[FLOW_OP_KIND_COUNT] = { 0 };
	double want_flops[FLOW_OP_KIND_COUNT] = { 0 }, step = 0.0;

	(void)state;
	graphutil_gpt_build(&g, &gpt_one_block, true);
	for (size_t i = 0; i < g.nops; i++) {
		const flow_op_def_t *def = flow_op_def(g.ops[i].kind);
		double f = def->flops(&g, &g.ops[i]);
		want_calls[g.ops[i].kind] += 2;
		want_flops[g.ops[i].kind] += 2 * f;
		step += f;
	}
	flow_exec_t *x = exec_new(&g, FLOW_KERNELS_CPU);
	exec_feed(x);
	assert_true(flow_exec_step_flops(x) == step);
	assert_true(step > 0.0);

	/* Off by default: running records nothing. */
	(void)exec_step(x);
	assert_int_equal(flow_exec_profile_rows(x, rows, 0), 0);

	flow_exec_profile_enable(x, true);
	(void)exec_step(x);
	(void)exec_step(x);
	flow_exec_profile_enable(x, false);
	(void)exec_step(x); /* not counted */
	size_t n = flow_exec_profile_rows(x, rows, FLOW_OP_KIND_COUNT + 20);
	size_t kinds = 0;
	for (int k = 0; k < FLOW_OP_KIND_COUNT; k++)
		kinds += want_calls[k] > 0;
	assert_int_equal(n, kinds); /* every kind here but none unused */
	for (size_t i = 0; i < n; i++) {
		flow_op_kind_t kind;
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(flow_op_kind_parse(rows[i].name, &kind, &diag),
				 FLOW_OK);
		assert_int_equal(rows[i].calls, want_calls[kind]);
		assert_true(fabs(rows[i].flops - want_flops[kind]) <=
			    1e-12 * want_flops[kind]);
		assert_true(rows[i].seconds >= 0.0);
		if (i > 0)
			assert_true(rows[i - 1].seconds >= rows[i].seconds);
	}

	/* Phases join the rows; a big one comes first. */
	flow_exec_profile_add(x, "optimizer", 50.0, 10.0);
	flow_exec_profile_add(x, "optimizer", 50.0, 10.0);
	flow_exec_profile_add(x, "data", 0.0, 0.0);
	n = flow_exec_profile_rows(x, rows, FLOW_OP_KIND_COUNT + 20);
	assert_int_equal(n, kinds + 2);
	assert_string_equal(rows[0].name, "optimizer");
	assert_int_equal(rows[0].calls, 2);
	assert_true(rows[0].seconds == 100.0 && rows[0].flops == 20.0);
	assert_string_equal(rows[n - 1].name, "data");

	/* cap: only that many written, all counted. */
	memset(rows, 0xab, sizeof(rows));
	assert_int_equal(flow_exec_profile_rows(x, rows, 1), kinds + 2);
	assert_string_equal(rows[0].name, "optimizer");
	assert_int_equal(rows[1].calls, 0xababababababababu);

	/* More distinct phases than the table holds share "other". */
	for (int i = 0; i < 20; i++) {
		char name[32];
		snprintf(name, sizeof(name), "phase%d", i);
		flow_exec_profile_add(x, name, 0.0, 1.0);
	}
	n = flow_exec_profile_rows(x, rows, FLOW_OP_KIND_COUNT + 20);
	double flops = 0.0;
	bool other = false;
	for (size_t i = 0; i < n; i++) {
		if (strncmp(rows[i].name, "phase", 5) == 0 ||
		    strcmp(rows[i].name, "other") == 0)
			flops += rows[i].flops;
		other = other || strcmp(rows[i].name, "other") == 0;
	}
	assert_true(other);
	assert_true(flops == 20.0);
	flow_exec_free(x);
	flow_graph_release(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exec_kernel_tables_are_filled),
		cmocka_unit_test(test_exec_runs_the_kernels_of_its_set),
		cmocka_unit_test(test_exec_fuses_residual_and_layernorm),
		cmocka_unit_test(test_exec_tensor_upload_download_round_trip),
		cmocka_unit_test(test_exec_kernel_sets_name_their_device),
		cmocka_unit_test(test_exec_cuda_without_a_gpu_is_one_line),
		cmocka_unit_test(test_exec_cpu_matches_reference),
		cmocka_unit_test(test_exec_bf16_cpu_matches_reference),
		cmocka_unit_test(test_exec_bf16_activations),
		cmocka_unit_test(test_exec_backward_clears_activation_gradients),
		cmocka_unit_test(test_exec_param_grads_accumulate_across_passes),
		cmocka_unit_test(
			test_exec_loss_is_the_mean_and_its_scale_scales_gradients),
		cmocka_unit_test(test_exec_init_draws_philox_by_logical_index),
		cmocka_unit_test(test_exec_init_depends_on_names_and_seed_only),
		cmocka_unit_test(
			test_exec_storage_is_aligned_and_grads_mirror_params),
		cmocka_unit_test(test_exec_host_storage_gives_zeroed_aligned_blocks),
		cmocka_unit_test(test_exec_runs_a_forward_only_graph),
		cmocka_unit_test(test_exec_new_rejects_bad_graphs_and_kernel_sets),
		cmocka_unit_test(test_exec_profile_counts_every_op_kind),
	};

	graphutil_fail = fail_graph;
	return cmocka_run_group_tests(tests, NULL, NULL) ? EXIT_FAILURE :
							   EXIT_SUCCESS;
}
