/* Thread-count invariance of the CPU kernels (the promise in kernels.h):
 * every forward and backward kernel is run on the same pseudo-random inputs
 * with 1, 2 and 3 OpenMP threads, and the outputs must be
 * bitwise identical.  Sizes are moderate but large enough that every
 * parallel loop splits differently across teams (several column blocks,
 * several 64K sum-of-squares chunks, ragged tails). */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#ifdef _OPENMP
#include <omp.h>

#include <flow/kernels.h>
#include <flow/mem.h>

#include "testutil.h"

/* Only the OpenMP team changes.  The BLAS keeps its own thread count: the
 * GEMMs inside matmul are OpenBLAS's, and OpenBLAS 0.3.21 itself gives
 * different bits for 1 and 2 (or 3) of its threads on some shapes and core
 * types (measured: K between GEMM_Q and 2*GEMM_Q, ragged M partitions, and
 * nearly every shape with the Haswell kernels), which no caller can fix;
 * kernels.h states the promise as "whatever the number of OpenMP threads,
 * for a fixed BLAS configuration". */
static void threads_set(int n)
{
	omp_set_num_threads(n);
}

/* Deterministic inputs in [-scale, scale): a 64-bit LCG, so the data do not
 * depend on the C library's rand(). */
static void fill_random(float *x, size_t n, uint64_t seed, float scale)
{
	uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;

	for (size_t i = 0; i < n; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		x[i] = scale * ((float)(s >> 40) / 8388608.0f - 1.0f);
	}
}

static float *buf_random(size_t n, uint64_t seed, float scale)
{
	float *p = flow_alloc(n * sizeof(float));

	assert_non_null(p);
	fill_random(p, n, seed, scale);
	return p;
}

/* A kernel run: fills out[0..nout) with everything the kernel wrote. */
typedef void (*threads_run_fn)(float *out);

static void threads_check(const char *what, threads_run_fn run, size_t nout)
{
	static const int teams[] = { 1, 2, 3 };
	float *ref = flow_alloc(nout * sizeof(float));
	float *got = flow_alloc(nout * sizeof(float));

	assert_non_null(ref);
	assert_non_null(got);
	threads_set(teams[0]);
	run(ref);
	for (size_t k = 1; k < sizeof(teams) / sizeof(teams[0]); k++) {
		threads_set(teams[k]);
		assert_int_equal(omp_get_max_threads(), teams[k]);
		memset(got, 0xA5, nout * sizeof(float));
		run(got);
		if (memcmp(ref, got, nout * sizeof(float)) != 0) {
			size_t i = 0;
			while (memcmp(&ref[i], &got[i], sizeof(float)) == 0)
				i++;
			fail_msg("%s: %d threads differ from 1 at [%zu]: "
				 "%.9g vs %.9g", what, teams[k], i,
				 (double)got[i], (double)ref[i]);
		}
	}
	threads_set(1);
	flow_free(ref);
	flow_free(got);
}

/* ---- matmul ------------------------------------------------------------ */
#define MM_N 300
#define MM_I 200
#define MM_O 190

static void matmul_forward_run(float *out)
{
	float *x = buf_random(MM_N * MM_I, 1, 1.0f);
	float *w = buf_random(MM_O * MM_I, 2, 0.1f);
	float *b = buf_random(MM_O, 3, 1.0f);

	flow_cpu_matmul_forward(out, x, w, b, MM_N, MM_I, MM_O);
	flow_free(x);
	flow_free(w);
	flow_free(b);
}

static void matmul_backward_run(float *out)
{
	float *x = buf_random(MM_N * MM_I, 1, 1.0f);
	float *w = buf_random(MM_O * MM_I, 2, 0.1f);
	float *dout = buf_random(MM_N * MM_O, 4, 1.0f);
	float *dinp = out, *dw = out + MM_N * MM_I;
	float *db = dw + MM_O * MM_I;

	/* Start from nonzero gradients: the accumulate path is the one used. */
	fill_random(out, MM_N * MM_I + MM_O * MM_I + MM_O, 5, 0.5f);
	flow_cpu_matmul_backward(dinp, dw, db, dout, x, w, MM_N, MM_I, MM_O);
	flow_free(x);
	flow_free(w);
	flow_free(dout);
}

static void test_kernels_threads_matmul_forward(void **state)
{
	(void)state;
	threads_check("matmul forward", matmul_forward_run, MM_N * MM_O);
}

static void test_kernels_threads_matmul_backward(void **state)
{
	(void)state;
	threads_check("matmul backward", matmul_backward_run,
		      MM_N * MM_I + MM_O * MM_I + MM_O);
}

/* ---- embedding ------------------------------------------------------------ */
#define EM_B 4
#define EM_T 64
#define EM_C 200
#define EM_V 50

static int32_t *embedding_tokens(void)
{
	int32_t *tok = malloc(EM_B * EM_T * sizeof(*tok));

	assert_non_null(tok);
	/* Few distinct tokens: many rows of dwte get many addends. */
	for (size_t i = 0; i < EM_B * EM_T; i++)
		tok[i] = (int32_t)((i * 7919u) % EM_V);
	return tok;
}

static void embedding_forward_run(float *out)
{
	int32_t *tok = embedding_tokens();
	float *wte = buf_random(EM_V * EM_C, 6, 1.0f);
	float *wpe = buf_random(EM_T * EM_C, 7, 1.0f);

	flow_cpu_embedding_forward(out, tok, wte, wpe, 0, EM_V, EM_B, EM_T,
				   EM_C);
	free(tok);
	flow_free(wte);
	flow_free(wpe);
}

static void embedding_backward_run(float *out)
{
	int32_t *tok = embedding_tokens();
	float *dout = buf_random(EM_B * EM_T * EM_C, 8, 1.0f);

	fill_random(out, EM_V * EM_C + EM_T * EM_C, 9, 0.5f);
	flow_cpu_embedding_backward(out, out + EM_V * EM_C, dout, tok, 0, EM_V,
				    EM_B, EM_T, EM_C);
	free(tok);
	flow_free(dout);
}

static void test_kernels_threads_embedding_forward(void **state)
{
	(void)state;
	threads_check("embedding forward", embedding_forward_run,
		      EM_B * EM_T * EM_C);
}

static void test_kernels_threads_embedding_backward(void **state)
{
	(void)state;
	threads_check("embedding backward", embedding_backward_run,
		      EM_V * EM_C + EM_T * EM_C);
}

/* ---- layernorm ------------------------------------------------------------ */
#define LN_N 300
#define LN_C 200

static void layernorm_forward_run(float *out)
{
	float *x = buf_random(LN_N * LN_C, 10, 2.0f);
	float *w = buf_random(LN_C, 11, 1.0f);
	float *b = buf_random(LN_C, 12, 1.0f);

	flow_cpu_layernorm_forward(out, out + LN_N * LN_C,
				   out + LN_N * LN_C + LN_N, x, w, b, LN_N,
				   LN_C);
	flow_free(x);
	flow_free(w);
	flow_free(b);
}

/* What a layernorm backward run reads: the input x, weight, dout, and
 * the statistics of x's forward pass.  Free with ln_grad_inputs_free. */
typedef struct {
	float *x, *w, *dout, *mean, *rstd;
} ln_grad_inputs_t;

static ln_grad_inputs_t ln_grad_inputs(void)
{
	ln_grad_inputs_t in = {
		.x = buf_random(LN_N * LN_C, 10, 2.0f),
		.w = buf_random(LN_C, 11, 1.0f),
		.dout = buf_random(LN_N * LN_C, 13, 1.0f),
		.mean = flow_alloc(LN_N * sizeof(float)),
		.rstd = flow_alloc(LN_N * sizeof(float)),
	};
	float *b = buf_random(LN_C, 12, 1.0f);
	float *y = flow_alloc(LN_N * LN_C * sizeof(float));

	assert_true(y && in.mean && in.rstd);
	flow_cpu_layernorm_forward(y, in.mean, in.rstd, in.x, in.w, b, LN_N,
				   LN_C);
	flow_free(b);
	flow_free(y);
	return in;
}

static void ln_grad_inputs_free(ln_grad_inputs_t *in)
{
	flow_free(in->x);
	flow_free(in->w);
	flow_free(in->dout);
	flow_free(in->mean);
	flow_free(in->rstd);
}

static void layernorm_backward_run(float *out)
{
	ln_grad_inputs_t in = ln_grad_inputs();

	fill_random(out, LN_N * LN_C + 2 * LN_C, 14, 0.5f);
	flow_cpu_layernorm_backward(out, out + LN_N * LN_C,
				    out + LN_N * LN_C + LN_C, in.dout, in.x,
				    in.w, in.mean, in.rstd, LN_N, LN_C);
	ln_grad_inputs_free(&in);
}

static void test_kernels_threads_layernorm_forward(void **state)
{
	(void)state;
	threads_check("layernorm forward", layernorm_forward_run,
		      LN_N * LN_C + 2 * LN_N);
}

static void test_kernels_threads_layernorm_backward(void **state)
{
	(void)state;
	threads_check("layernorm backward", layernorm_backward_run,
		      LN_N * LN_C + 2 * LN_C);
}

/* The residual add fused with the layernorm, forward: res, out, mean,
 * rstd; backward from nonzero gradients: dres, da, db, dweight, dbias. */
static void residual_layernorm_forward_run(float *out)
{
	float *a = buf_random(LN_N * LN_C, 15, 2.0f);
	float *b = buf_random(LN_N * LN_C, 16, 0.5f);
	float *w = buf_random(LN_C, 11, 1.0f);
	float *bias = buf_random(LN_C, 12, 1.0f);
	size_t nc = LN_N * LN_C;

	flow_cpu_residual_layernorm_forward(out, out + nc, out + 2 * nc,
					    out + 2 * nc + LN_N, a, b, w, bias,
					    LN_N, LN_C);
	flow_free(a);
	flow_free(b);
	flow_free(w);
	flow_free(bias);
}

static void layernorm_residual_backward_run(float *out)
{
	size_t nc = LN_N * LN_C;
	ln_grad_inputs_t in = ln_grad_inputs();

	fill_random(out, 3 * nc + 2 * LN_C, 17, 0.5f);
	flow_cpu_layernorm_residual_backward(out, out + nc, out + 2 * nc,
					     out + 3 * nc, out + 3 * nc + LN_C,
					     in.dout, in.x, in.w, in.mean,
					     in.rstd, LN_N, LN_C);
	ln_grad_inputs_free(&in);
}

static void test_kernels_threads_residual_layernorm(void **state)
{
	(void)state;
	threads_check("residual layernorm forward",
		      residual_layernorm_forward_run,
		      2 * LN_N * LN_C + 2 * LN_N);
	threads_check("layernorm residual backward",
		      layernorm_residual_backward_run,
		      3 * LN_N * LN_C + 2 * LN_C);
}

/* ---- gelu, residual (elementwise) ----------------------------------------- */
#define EW_N 100003

static void gelu_forward_run(float *out)
{
	float *x = buf_random(EW_N, 15, 6.0f);

	flow_cpu_gelu_forward(out, x, EW_N);
	flow_free(x);
}

static void gelu_backward_run(float *out)
{
	float *x = buf_random(EW_N, 15, 6.0f);
	float *dout = buf_random(EW_N, 16, 1.0f);

	fill_random(out, EW_N, 17, 0.5f);
	flow_cpu_gelu_backward(out, x, dout, EW_N);
	flow_free(x);
	flow_free(dout);
}

static void residual_forward_run(float *out)
{
	float *a = buf_random(EW_N, 18, 1.0f);
	float *b = buf_random(EW_N, 19, 1.0f);

	flow_cpu_residual_forward(out, a, b, EW_N);
	flow_free(a);
	flow_free(b);
}

static void residual_backward_run(float *out)
{
	float *dout = buf_random(EW_N, 20, 1.0f);

	fill_random(out, 2 * EW_N, 21, 0.5f);
	flow_cpu_residual_backward(out, out + EW_N, dout, EW_N);
	flow_free(dout);
}

static void test_kernels_threads_gelu_forward(void **state)
{
	(void)state;
	threads_check("gelu forward", gelu_forward_run, EW_N);
}

static void test_kernels_threads_gelu_backward(void **state)
{
	(void)state;
	threads_check("gelu backward", gelu_backward_run, EW_N);
}

static void test_kernels_threads_residual_forward(void **state)
{
	(void)state;
	threads_check("residual forward", residual_forward_run, EW_N);
}

static void test_kernels_threads_residual_backward(void **state)
{
	(void)state;
	threads_check("residual backward", residual_backward_run, 2 * EW_N);
}

/* ---- attention ------------------------------------------------------------- */
#define AT_B 2
#define AT_T 70
#define AT_C 48
#define AT_NH 4

static void *attention_scratch(void)
{
	void *scratch = flow_alloc(
		flow_cpu_attention_scratch_bound(AT_B, AT_T, AT_C, AT_NH, true));

	assert_non_null(scratch);
	return scratch;
}

static void attention_forward_run(float *out)
{
	float *qkv = buf_random(AT_B * AT_T * 3 * AT_C, 22, 2.0f);
	void *scratch = attention_scratch();

	flow_cpu_attention_forward(out, out + AT_B * AT_T * AT_C, scratch, qkv,
				   AT_B, AT_T, AT_C, AT_NH);
	flow_free(qkv);
	flow_free(scratch);
}

static void attention_backward_run(float *out)
{
	float *qkv = buf_random(AT_B * AT_T * 3 * AT_C, 22, 2.0f);
	float *dout = buf_random(AT_B * AT_T * AT_C, 23, 1.0f);
	float *y = flow_alloc(AT_B * AT_T * AT_C * sizeof(float));
	float *lse = flow_alloc(AT_B * AT_NH * AT_T * sizeof(float));
	void *scratch = attention_scratch();

	assert_true(y && lse);
	flow_cpu_attention_forward(y, lse, scratch, qkv, AT_B, AT_T, AT_C,
				   AT_NH);
	fill_random(out, AT_B * AT_T * 3 * AT_C, 24, 0.5f);
	flow_cpu_attention_backward(out, scratch, dout, qkv, lse, y, AT_B, AT_T,
				    AT_C, AT_NH);
	flow_free(qkv);
	flow_free(dout);
	flow_free(y);
	flow_free(lse);
	flow_free(scratch);
}

static void test_kernels_threads_attention_forward(void **state)
{
	(void)state;
	threads_check("attention forward", attention_forward_run,
		      AT_B * AT_T * AT_C + AT_B * AT_NH * AT_T);
}

static void test_kernels_threads_attention_backward(void **state)
{
	(void)state;
	threads_check("attention backward", attention_backward_run,
		      AT_B * AT_T * 3 * AT_C);
}

/* ---- cross-entropy ---------------------------------------------------------- */
#define CE_N 16
#define CE_V 5000
#define CE_VP 5056

static void cross_entropy_run(float *out)
{
	int32_t tg[CE_N];

	for (size_t r = 0; r < CE_N; r++)
		tg[r] = r == 5 ? -1 : (int32_t)((r * 977u) % CE_V);
	fill_random(out + CE_N, CE_N * CE_VP, 25, 4.0f);
	flow_cpu_cross_entropy_forward_backward(out, out + CE_N, tg, CE_N,
						CE_V, CE_VP, 1.0f / 15.0f);
}

static void test_kernels_threads_cross_entropy(void **state)
{
	(void)state;
	threads_check("cross entropy", cross_entropy_run,
		      CE_N + CE_N * CE_VP);
}

/* ---- bf16 twins --------------------------------------------------------------- */
/* Each twin on the sizes of its fp32 kernel's run above, from nonzero
 * gradients; its bf16 outputs are widened into out, which is exact, so
 * equal floats are equal bf16 bits. */

/* n bf16 values of fill_random's (rounded); free with flow_free. */
static flow_bf16_t *bf16_random(size_t n, uint64_t seed, float scale)
{
	float *f = buf_random(n, seed, scale);
	flow_bf16_t *x = flow_alloc(n * sizeof(*x));

	assert_non_null(x);
	for (size_t i = 0; i < n; i++)
		x[i] = flow_f32_to_bf16(f[i]);
	flow_free(f);
	return x;
}

static flow_bf16_t *bf16_new(size_t n)
{
	flow_bf16_t *x = flow_alloc(n * sizeof(*x));

	assert_non_null(x);
	return x;
}

/* out[i] = x[i] widened; returns out + n, where the next output goes. */
static float *bf16_out(float *out, const flow_bf16_t *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		out[i] = flow_bf16_to_f32(x[i]);
	return out + n;
}

static void matmul_bf16_run(float *out)
{
	flow_bf16_t *x = bf16_random(MM_N * MM_I, 1, 1.0f);
	flow_bf16_t *dout = bf16_random(MM_N * MM_O, 4, 1.0f);
	flow_bf16_t *dinp = bf16_random(MM_N * MM_I, 5, 0.5f);
	flow_bf16_t *y = bf16_new(MM_N * MM_O);
	float *w = buf_random(MM_O * MM_I, 2, 0.1f);
	float *b = buf_random(MM_O, 3, 1.0f);
	float *dw = out + MM_N * MM_O + MM_N * MM_I, *db = dw + MM_O * MM_I;
	void *scratch =
		flow_alloc(flow_cpu_matmul_bf16_scratch_bound(MM_N, MM_I, MM_O));

	assert_non_null(scratch);
	flow_cpu_matmul_bf16_forward(y, scratch, x, w, b, MM_N, MM_I, MM_O);
	fill_random(dw, MM_O * MM_I + MM_O, 6, 0.5f);
	flow_cpu_matmul_bf16_backward(dinp, dw, db, scratch, dout, x, w, MM_N,
				      MM_I, MM_O);
	bf16_out(bf16_out(out, y, MM_N * MM_O), dinp, MM_N * MM_I);
	BUFS_FREE(x, dout, dinp, y, w, b, scratch);
}

static void layernorm_bf16_run(float *out)
{
	size_t nc = LN_N * LN_C;
	ln_grad_inputs_t in = ln_grad_inputs();
	float *b = buf_random(LN_C, 12, 1.0f), *stats = out + nc;
	float *dinp = stats + 2 * LN_N, *dw = dinp + nc, *dbias = dw + LN_C;
	flow_bf16_t *y = bf16_new(nc), *dout = bf16_random(nc, 13, 1.0f);

	flow_cpu_layernorm_bf16_forward(y, stats, stats + LN_N, in.x, in.w, b,
					LN_N, LN_C);
	fill_random(dinp, nc + 2 * LN_C, 14, 0.5f);
	flow_cpu_layernorm_bf16_backward(dinp, dw, dbias, dout, in.x, in.w,
					 in.mean, in.rstd, LN_N, LN_C);
	bf16_out(out, y, nc);
	ln_grad_inputs_free(&in);
	BUFS_FREE(b, y, dout);
}

static void residual_layernorm_bf16_run(float *out)
{
	size_t nc = LN_N * LN_C;
	ln_grad_inputs_t in = ln_grad_inputs();
	float *a = buf_random(nc, 15, 2.0f), *bias = buf_random(LN_C, 12, 1.0f);
	flow_bf16_t *b = bf16_random(nc, 16, 0.5f), *y = bf16_new(nc);
	flow_bf16_t *dout = bf16_random(nc, 13, 1.0f);
	flow_bf16_t *db = bf16_random(nc, 17, 0.5f);
	float *res = out + 2 * nc, *stats = res + nc, *dres = stats + 2 * LN_N;
	float *da = dres + nc, *dw = da + nc, *dbias = dw + LN_C;

	flow_cpu_residual_layernorm_bf16_forward(res, y, stats, stats + LN_N,
						 a, b, in.w, bias, LN_N, LN_C);
	fill_random(dres, 2 * nc + 2 * LN_C, 18, 0.5f);
	flow_cpu_layernorm_residual_bf16_backward(dres, da, db, dw, dbias, dout,
						  in.x, in.w, in.mean, in.rstd,
						  LN_N, LN_C);
	bf16_out(bf16_out(out, y, nc), db, nc);
	ln_grad_inputs_free(&in);
	BUFS_FREE(a, bias, b, y, dout, db);
}

static void elementwise_bf16_run(float *out)
{
	flow_bf16_t *x = bf16_random(EW_N, 15, 6.0f);
	flow_bf16_t *dout = bf16_random(EW_N, 16, 1.0f);
	flow_bf16_t *y = bf16_new(EW_N), *dx = bf16_random(EW_N, 17, 0.5f);
	flow_bf16_t *db = bf16_random(EW_N, 21, 0.5f);
	float *a = buf_random(EW_N, 18, 1.0f), *d = buf_random(EW_N, 20, 1.0f);
	float *res = out + 3 * EW_N, *da = res + EW_N;

	flow_cpu_gelu_bf16_forward(y, x, EW_N);
	flow_cpu_gelu_bf16_backward(dx, x, dout, EW_N);
	flow_cpu_residual_bf16_forward(res, a, x, EW_N);
	fill_random(da, EW_N, 19, 0.5f);
	flow_cpu_residual_bf16_backward(da, db, d, EW_N);
	bf16_out(bf16_out(bf16_out(out, y, EW_N), dx, EW_N), db, EW_N);
	BUFS_FREE(x, dout, y, dx, db, a, d);
}

static void attention_bf16_run(float *out)
{
	size_t nqkv = AT_B * AT_T * 3 * AT_C, ny = AT_B * AT_T * AT_C;
	flow_bf16_t *qkv = bf16_random(nqkv, 22, 2.0f);
	flow_bf16_t *dout = bf16_random(ny, 23, 1.0f), *y = bf16_new(ny);
	flow_bf16_t *dqkv = bf16_random(nqkv, 24, 0.5f);
	float *lse = out + ny + nqkv;
	void *scratch = attention_scratch();

	flow_cpu_attention_bf16_forward(y, lse, scratch, qkv, AT_B, AT_T, AT_C,
					AT_NH);
	flow_cpu_attention_bf16_backward(dqkv, scratch, dout, qkv, lse, y,
					 AT_B, AT_T, AT_C, AT_NH);
	bf16_out(bf16_out(out, y, ny), dqkv, nqkv);
	BUFS_FREE(qkv, dout, y, dqkv, scratch);
}

static void cross_entropy_bf16_run(float *out)
{
	int32_t tg[CE_N];
	flow_bf16_t *logits = bf16_random(CE_N * CE_VP, 25, 4.0f);

	for (size_t r = 0; r < CE_N; r++)
		tg[r] = r == 5 ? -1 : (int32_t)((r * 977u) % CE_V);
	flow_cpu_cross_entropy_bf16_forward_backward(out, logits, tg, CE_N,
						     CE_V, CE_VP, 1.0f / 15.0f);
	bf16_out(out + CE_N, logits, CE_N * CE_VP);
	flow_free(logits);
}

static void test_kernels_threads_bf16(void **state)
{
	size_t nc = LN_N * LN_C;

	(void)state;
	threads_check("matmul bf16", matmul_bf16_run,
		      MM_N * MM_O + MM_N * MM_I + MM_O * MM_I + MM_O);
	threads_check("layernorm bf16", layernorm_bf16_run,
		      2 * nc + 2 * LN_N + 2 * LN_C);
	threads_check("residual layernorm bf16", residual_layernorm_bf16_run,
		      5 * nc + 2 * LN_N + 2 * LN_C);
	threads_check("gelu and residual bf16", elementwise_bf16_run,
		      5 * EW_N);
	threads_check("attention bf16", attention_bf16_run,
		      AT_B * AT_T * 4 * AT_C + AT_B * AT_NH * AT_T);
	threads_check("cross entropy bf16", cross_entropy_bf16_run,
		      CE_N + CE_N * CE_VP);
}

/* ---- AdamW ------------------------------------------------------------------- */
static void adamw_run(float *out)
{
	const flow_adamw_params_t hp = { .lr = 1e-3f, .beta1 = 0.9f,
					 .beta2 = 0.95f, .eps = 1e-8f,
					 .weight_decay = 0.1f };
	float *g = buf_random(EW_N, 26, 1.0f);

	fill_random(out, EW_N, 27, 1.0f);
	fill_random(out + EW_N, EW_N, 28, 0.1f);
	fill_random(out + 2 * EW_N, EW_N, 29, 0.01f);
	for (size_t i = 0; i < EW_N; i++) /* v >= 0 */
		out[2 * EW_N + i] *= out[2 * EW_N + i];
	flow_cpu_adamw_update(out, g, out + EW_N, out + 2 * EW_N, EW_N, &hp,
			      3, true);
	flow_cpu_adamw_update(out, g, out + EW_N, out + 2 * EW_N, EW_N, &hp,
			      4, false);
	flow_free(g);
}

static void test_kernels_threads_adamw(void **state)
{
	(void)state;
	threads_check("adamw", adamw_run, 3 * EW_N);
}

/* ---- gradient norm ------------------------------------------------------------- */
#define GN_N0 300007 /* 4.6 chunks of 64K */
#define GN_N1 77

static void grad_norm_run(float *out)
{
	float *grads[2] = { out + 2, out + 2 + GN_N0 };
	size_t counts[2] = { GN_N0, GN_N1 };
	double ss;

	fill_random(out + 2, GN_N0 + GN_N1, 30, 1.0f);
	ss = flow_cpu_sum_squares(out + 2, GN_N0);
	memcpy(out, &ss, sizeof(ss)); /* the double's bits, in out[0..1] */
	/* Clips: the norm is ~316, far above 1. */
	out[2 + GN_N0 + GN_N1] = flow_cpu_clip_grad_norm(grads, counts, 2,
							 1.0f);
}

static void test_kernels_threads_grad_norm(void **state)
{
	(void)state;
	threads_check("sum squares and clip", grad_norm_run,
		      2 + GN_N0 + GN_N1 + 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kernels_threads_matmul_forward),
		cmocka_unit_test(test_kernels_threads_matmul_backward),
		cmocka_unit_test(test_kernels_threads_embedding_forward),
		cmocka_unit_test(test_kernels_threads_embedding_backward),
		cmocka_unit_test(test_kernels_threads_layernorm_forward),
		cmocka_unit_test(test_kernels_threads_layernorm_backward),
		cmocka_unit_test(test_kernels_threads_residual_layernorm),
		cmocka_unit_test(test_kernels_threads_gelu_forward),
		cmocka_unit_test(test_kernels_threads_gelu_backward),
		cmocka_unit_test(test_kernels_threads_residual_forward),
		cmocka_unit_test(test_kernels_threads_residual_backward),
		cmocka_unit_test(test_kernels_threads_attention_forward),
		cmocka_unit_test(test_kernels_threads_attention_backward),
		cmocka_unit_test(test_kernels_threads_cross_entropy),
		cmocka_unit_test(test_kernels_threads_adamw),
		cmocka_unit_test(test_kernels_threads_grad_norm),
		cmocka_unit_test(test_kernels_threads_bf16),
	};

	return cmocka_run_group_tests(tests, NULL, NULL) ? EXIT_FAILURE :
							   EXIT_SUCCESS;
}

#else /* built without OpenMP: one thread, nothing to compare */
int main(void)
{
	puts("test_kernels_threads: skipped: built without OpenMP");
	return 77;
}
#endif
