/* test_cuda_kernels: run every CUDA kernel (flow/kernels_cuda.h) and its CPU
 * reference (flow/kernels.h) on the same random inputs and compare.
 *
 * Output (stdout): a '#' preamble naming the device, then one TSV row per
 * kernel:
 *
 *   kernel  pass  max_abs_err  max_rel_err  wrong  time_us
 *
 * An element is wrong when |gpu - cpu| > atol + rtol * |cpu| (STYLE.md item
 * 20).  max_rel_err is the largest |gpu - cpu| / |cpu| over elements with
 * cpu != 0 (informative only: tiny references within atol can have large
 * relative errors).  time_us is the mean GPU time of one call, cudaEvent
 * timed over TIME_ITERS calls after the checked call.  '#' lines among the
 * rows say how many elements of each bf16 output were one rounding apart
 * (below) and how the GEMM epilogues ran; '#' lines after the table give
 * flow_cuda_matmul_forward's GFLOP/s against a raw cublasSgemm of the same
 * shape, and a PASS/FAIL footer.  Mismatches are itemised on stderr.
 *
 * Every device buffer starts poisoned (all bytes 0xff, a NaN in every
 * float and every bf16): an output element a kernel does not write fails.
 *
 * The bf16 twins (flow/kernels.h, "bf16 activations") are checked against
 * the CPU's twins on bf16 inputs (random floats rounded to bf16), each
 * output compared widened.  Both sides compute in fp32 and round once, so
 * where their fp32 results differ (sums in another order) a bf16 output
 * is either the same or, where the two straddle a rounding boundary, one
 * bf16 value apart.  A bf16 output is therefore right within atol (the
 * fp32 results' difference, which near zero may span several bf16
 * values), a flip within one rounding more (2^-7 |cpu|: bf16 values are
 * at most that far apart near cpu), and wrong beyond; the flips may be at
 * most a stated fraction of the elements (and one more), about the fp32
 * difference over the bf16 spacing, as tests/unit/test_kernels.c's
 * check_close_bf16 allows 1%.  An operand left unrounded or rounded twice
 * moves far more elements, and an indexing error is wrong outright.
 * Where a path rounds differently by design (cuDNN, the fused GELU) the
 * bound widens and the fraction is not limited, said there.
 *
 * Exit status: 0 all kernels agree; 1 a wrong element or a CUDA error; 77
 * (automake's "skipped") when this machine has no CUDA driver or device.
 *
 * Tolerances (inputs U(-1,1) unless noted).  Where the GPU and CPU do the
 * same float operations in the same order the tolerance is 0 or a few ulp;
 * where the order of a sum differs (GEMMs, reductions) it is about ten times
 * the expected rounding difference, still far below what any indexing or
 * formula error produces (errors of order 1):
 * - residual fwd/bwd, embedding fwd, scale: one float operation per
 *   element, identical on both sides: atol 0, rtol 0.
 * - embedding bwd: the same sequential per-token order on both sides
 *   (equal in practice); atol 1e-6, rtol 1e-6.
 * - matmul: cuBLAS and OpenBLAS sum K <= 1024 products in different orders;
 *   expected difference ~sqrt(K) * eps * |partial sums| ~ 1e-5:
 *   atol 1e-4, rtol 1e-4 (out, dinp, dweight, dbias).
 * - matmul with its GELU (cuBLASLt's GELU_AUX_BIAS epilogue, GPT-2's fc
 *   shape, weights U(-0.1,0.1)): pre as matmul; out that plus the GELUs'
 *   difference, gelu' <= 1.13: atol 2e-4, rtol 1e-4.
 * - layernorm: double statistics on both sides, float element-wise steps
 *   in the same order: atol 1e-5, rtol 1e-5 (out, mean, rstd, dinp); fused
 *   with the residual add, the same, and res (one float addition) exact;
 *   its backward fused with the add's, the same for dres, da and db;
 *   dweight/dbias double sums over rows: atol 1e-5, rtol 1e-5.
 * - gelu (inputs U(-4,4)): tanhf differs by <= 2 ulp and nvcc contracts
 *   into FMAs: atol 1e-6, rtol 1e-5.
 * - attention: cuBLAS dot products vs the CPU's simd dot products of
 *   hs = 64 terms, softmax in float: lse (a max plus the log of a sum
 *   >= 1) atol 1e-5 rtol 1e-5; out atol 1e-5 rtol 1e-4; dqkv (sums over T
 *   of products) atol 5e-5 rtol 1e-3.
 * - cross-entropy (logits U(-4,4), V = 50257 of Vp = 50304, a quarter of
 *   the targets negative): both sum exp in double; expf differs by <= 2 ulp:
 *   losses atol 1e-5 rtol 1e-5, dlogits atol 1e-9 rtol 1e-4 (the padding
 *   and ignored rows must be 0 within 1e-9).
 * - cross-entropy over a column shard (the split steps, each from the
 *   same inputs): max exact; exp in double on both sides, the sums
 *   rounded once to float: sums and losses atol 1e-6 rtol 1e-6, dlogits
 *   atol 1e-9 rtol 1e-5.
 * - box_move (copy and add of a strided region; f32, i32, bf16): the
 *   same one operation per element, so the bytes must be equal.
 * - adamw, and its one-launch form over several tensors: the same float
 *   operations in the same order (IEEE sqrt and division on both sides):
 *   atol 1e-7, rtol 1e-6 (param, m, v).
 * - sum_squares: squares and sums in double, different order: rtol 1e-9;
 *   clip_grad_norm: norm rtol 1e-6, clipped gradients atol 1e-7 rtol 1e-6.
 *
 * The bf16 twins (atol, and the fraction that may flip; fp32 outputs as
 * their fp32 kernels'):
 * - matmul_bf16 (inp and dout bf16 U(-1,1), the fp32 weight rounded by
 *   each side): products of bf16 values are exact in fp32, so only the
 *   order of the fp32 sums differs.  Tensor cores are measured to add
 *   with truncation, not to nearest (Fasi et al. 2021, V100 to A100): a
 *   bias of about 2^-24 of the partial sum per 16-term step, which over
 *   K/16 steps of partial sums ~sqrt(K/9) grows as K^1.5 (emulated to
 *   0.027 at most per element at K = 50304, the logits' dinp; 0.053 with
 *   8-term steps).  The share of elements that then flip, estimated
 *   with the difference drawn uniformly up to twice its bound for every
 *   element and the outputs normal (a pessimistic model: PyTorch on the
 *   host), is the fraction's basis.  out (K = 768, difference up to
 *   ~3e-5 near |out| ~ 9): atol 1e-4, 0.3% estimated, 1% allowed.  dinp
 *   at the fc shape (K = 3072, ~4e-4 near 18): atol 1e-3, 0.7%
 *   estimated, 2% allowed; at the logits' shape (K = 50304, 0.027 near
 *   75): atol 6e-2, 6% estimated, 15% allowed.  A second rounding of the
 *   sum flips about half the elements; a weight left unrounded moves the
 *   sums by ~0.1, beyond one rounding of most; a wrong index is off by 10
 *   to 75.
 *   dweight fp32 (K = n): atol 1e-3 rtol 1e-3; dbias, fp32 column sums
 *   of the same bf16 values: 1e-4.  The same with the bias under-aligned
 *   (rounded into the GPU's aligned scratch: still the epilogue), and
 *   with the epilogue off (flow_cuda_matmul_use_epilogue), the separate
 *   passes: fp32 sums in panels of scratch, then the epilogue pass, four
 *   panels at the logits' shape.
 * - matmul_gelu_bf16 (fc shape, weights U(-0.1,0.1)): pre as matmul_bf16
 *   out.  out: the CPU takes the GELU of the rounded pre, the GPU's
 *   epilogue of the fp32 sum (flow/kernels.h), which moves it by up to
 *   gelu' <= 1.13 times pre's rounding, 2^-9 |pre|, often more than
 *   out's own spacing where gelu(pre) is small: atol 2e-4 (the GELUs'
 *   difference, as fp32) + 1.13 * 2^-8 |pre| (the slope times the worst
 *   case of pre's rounding, half a bf16 ulp at the bottom of a binade;
 *   the slope is at most 1.09 where that case occurs), flips unlimited.
 * - layernorm_bf16, residual_layernorm_bf16: out atol 1e-5 (the fp32
 *   kernels' tolerance), 1% (fp32 results a few ulp apart: ~1e-4 flip);
 *   mean, rstd, res and the backward's fp32 dinp, dres, da, dweight,
 *   dbias as fp32; db of the fused backward, bf16(db + dres): atol 1e-5,
 *   1%.
 * - gelu_bf16 (inputs U(-4,4)): out atol 1e-6, dinp atol 3e-6 (the fp32
 *   tolerances), 1%.
 * - residual_bf16: the same one addition and one rounding on both sides:
 *   exact, no flips.
 * - attention_bf16, own kernel: lse as fp32 (products of bf16 values,
 *   fp32 sums of hs = 64); out and dqkv = bf16(dqkv + grad): atol 1e-3, 2%
 *   (a probability within fp32 rounding of a bf16 boundary rounds to its
 *   neighbour on one side and moves its terms by 2^-8 relative; rare,
 *   and large only in the first rows, where a row has few terms).
 *   Through cuDNN: flash attention rounds its probabilities unnormalised
 *   and tile by tile, and its backward takes rowsum(dout * out) from the
 *   bf16 out and writes a bf16 gradient that is then added and rounded
 *   again, so many elements legitimately differ by a rounding or more.
 *   tests/ref/cudnn_attention_tolerance.py emulates all three on these
 *   shapes; beside two roundings (2^-6 |cpu|) the worst over 32 seeds
 *   needed atol 2.5e-3 for out (rows with few keys, outputs near zero)
 *   and 3.8e-3 for dqkv: out atol 5e-3, dqkv atol 8e-3, each plus two
 *   roundings, flips unlimited; a dropped accumulation or a wrong index
 *   is off by ~0.5.
 * - cross_entropy_bf16 and its split steps (logits bf16 U(-4,4)): the fp32
 *   tolerances for losses, max and sums; dlogits atol 1e-9, 1% (expf
 *   within 2 ulp: ~1e-4 flip).
 */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <flow/boxing.h>
#include <flow/error.h>
#include <flow/kernels.h>
#include <flow/kernels_cuda.h>
#include <flow/mem.h>
#include <flow/rng.h>

#define PROG "test_cuda_kernels"
#define SEED 20240601u
#define TIME_ITERS 20
#define MAX_ALLOCS 96
#define MAX_REPORTED 5 /* mismatches itemised per output */

static cudaStream_t g_stream;
static cudaEvent_t g_ev0, g_ev1;
static flow_diag_t g_diag = FLOW_DIAG_INIT;
static uint64_t g_rng_stream; /* a fresh Philox stream per tensor */
static int g_failed_kernels;
static int g_kernels;

/* Device and host allocations of the current test, freed by free_all(). */
static void *g_dev[MAX_ALLOCS];
static int g_ndev;
static void *g_host[MAX_ALLOCS];
static int g_nhost;

static void die(const char *what)
{
	fflush(stdout);
	fprintf(stderr, PROG ": %s failed: %s\n", what,
		flow_diag_message(&g_diag));
	exit(1);
}

/* A flow_cuda_* call: any error ends the program with the diagnostic. */
#define CU(call)                                                            \
	do {                                                                \
		if ((call) != FLOW_OK)                                      \
			die(#call);                                         \
	} while (0)

/* A raw CUDA runtime call. */
#define RT(call)                                                            \
	do {                                                                \
		cudaError_t rt_e_ = (call);                                 \
		if (rt_e_ != cudaSuccess) {                                 \
			fflush(stdout);                                     \
			fprintf(stderr, PROG ": %s failed: %s: %s\n", #call, \
				cudaGetErrorName(rt_e_),                    \
				cudaGetErrorString(rt_e_));                 \
			exit(1);                                            \
		}                                                           \
	} while (0)

/* Mean GPU microseconds per call of `call`, over TIME_ITERS calls. */
#define TIME_US(out_us, call)                                               \
	do {                                                                \
		float ms_ = 0.0f;                                           \
		RT(cudaEventRecord(g_ev0, g_stream));                       \
		for (int it_ = 0; it_ < TIME_ITERS; it_++)                  \
			CU(call);                                           \
		RT(cudaEventRecord(g_ev1, g_stream));                       \
		RT(cudaEventSynchronize(g_ev1));                            \
		RT(cudaEventElapsedTime(&ms_, g_ev0, g_ev1));               \
		(out_us) = 1000.0 * (double)ms_ / TIME_ITERS;               \
	} while (0)

static void *host_alloc(size_t bytes)
{
	void *p = flow_alloc(bytes);
	if (!p || g_nhost == MAX_ALLOCS) {
		fprintf(stderr, PROG ": out of host memory (%zu bytes)\n", bytes);
		exit(1);
	}
	g_host[g_nhost++] = p;
	return p;
}

static void *dev_alloc(size_t bytes)
{
	void *p = NULL;
	if (g_ndev == MAX_ALLOCS) {
		fprintf(stderr, PROG ": too many device allocations\n");
		exit(1);
	}
	CU(flow_cuda_malloc(&p, bytes, &g_diag));
	/* Poisoned: every byte 0xff, so a float is a NaN until a kernel writes
	 * it, and an element a forward kernel leaves unwritten fails the
	 * comparison (NaN is never within tolerance). */
	RT(cudaMemset(p, 0xff, bytes));
	/* The memset is on the legacy stream, which orders nothing on
	 * g_stream (non-blocking): done before any kernel there reads it. */
	RT(cudaDeviceSynchronize());
	g_dev[g_ndev++] = p;
	return p;
}

static void free_all(void)
{
	for (int i = 0; i < g_ndev; i++)
		flow_cuda_free(g_dev[i]);
	g_ndev = 0;
	for (int i = 0; i < g_nhost; i++)
		flow_free(g_host[i]);
	g_nhost = 0;
}

/* n floats, uniform in [lo, hi), from a stream no other tensor uses. */
static float *host_rand(size_t n, float lo, float hi)
{
	float *p = host_alloc(n * sizeof(float));
	flow_rng_fill_uniform(p, n, SEED, ++g_rng_stream, 0, lo, hi);
	return p;
}

static float *host_copy(const float *src, size_t n)
{
	float *p = host_alloc(n * sizeof(float));
	memcpy(p, src, n * sizeof(float));
	return p;
}

/* n int32 in [0, hi); when neg_every > 0, every neg_every-th is -1. */
static int32_t *host_tokens(size_t n, int32_t hi, size_t neg_every)
{
	int32_t *p = host_alloc(n * sizeof(int32_t));
	float *u = host_rand(n, 0.0f, 1.0f);
	for (size_t i = 0; i < n; i++) {
		int32_t t = (int32_t)(u[i] * (float)hi);
		p[i] = t >= hi ? hi - 1 : t;
		if (neg_every > 0 && i % neg_every == neg_every - 1)
			p[i] = -1;
	}
	return p;
}

static void *dev_from(const void *src, size_t bytes)
{
	void *p = dev_alloc(bytes);
	CU(flow_cuda_copy_to_device(p, src, bytes, &g_diag));
	/* From pageable memory cudaMemcpy may return before the DMA ends. */
	RT(cudaDeviceSynchronize());
	return p;
}

static float *dev_floats(const float *src, size_t n)
{
	return dev_from(src, n * sizeof(float));
}

/* n bf16 values: floats uniform in [lo, hi), rounded (a stream of their
 * own, as host_rand's). */
static flow_bf16_t *host_rand_bf16(size_t n, float lo, float hi)
{
	float *f = host_rand(n, lo, hi);
	flow_bf16_t *h = host_alloc(n * sizeof(flow_bf16_t));
	for (size_t i = 0; i < n; i++)
		h[i] = flow_bf16_narrow(f[i]);
	return h;
}

static flow_bf16_t *host_copy_bf16(const flow_bf16_t *src, size_t n)
{
	flow_bf16_t *p = host_alloc(n * sizeof(flow_bf16_t));
	memcpy(p, src, n * sizeof(flow_bf16_t));
	return p;
}

static flow_bf16_t *dev_bf16(const flow_bf16_t *src, size_t n)
{
	return dev_from(src, n * sizeof(flow_bf16_t));
}

/* ---- comparison ----------------------------------------------------------- */

typedef struct check {
	const char *kernel;
	double max_abs, max_rel;
	size_t wrong;
} check_t;

static void check_init(check_t *c, const char *kernel)
{
	c->kernel = kernel;
	c->max_abs = 0.0;
	c->max_rel = 0.0;
	c->wrong = 0;
}

/* One element: got against the CPU reference ref. */
static void check_value(check_t *c, const char *what, size_t i, double ref,
			double got, double atol, double rtol)
{
	double diff = fabs(got - ref);
	bool bad = !(diff <= atol + rtol * fabs(ref)); /* NaN is wrong */
	if (isnan(diff))
		diff = INFINITY;
	if (diff > c->max_abs)
		c->max_abs = diff;
	if (ref != 0.0 && diff / fabs(ref) > c->max_rel)
		c->max_rel = diff / fabs(ref);
	if (bad) {
		if (c->wrong < MAX_REPORTED)
			fprintf(stderr,
				PROG ": %s: %s[%zu]: gpu %.9g, cpu %.9g, "
				     "|diff| %.3g > %.3g\n",
				c->kernel, what, i, got, ref, diff,
				atol + rtol * fabs(ref));
		c->wrong++;
	}
}

/* Copy n floats of device output back and compare with ref. */
static void check_floats(check_t *c, const char *what, const float *ref,
			 const float *dev, size_t n, double atol, double rtol)
{
	float *got = flow_alloc(n * sizeof(float));
	if (!got) {
		fprintf(stderr, PROG ": out of host memory\n");
		exit(1);
	}
	CU(flow_cuda_sync(g_stream, &g_diag));
	CU(flow_cuda_copy_to_host(got, dev, n * sizeof(float), &g_diag));
	for (size_t i = 0; i < n; i++)
		check_value(c, what, i, ref[i], got[i], atol, rtol);
	flow_free(got);
}

/* Where two bf16 values one rounding apart may be: 2^-7 |ref| is at least
 * the spacing of bf16 values near ref. */
#define BF16_SPACING 0x1p-7

/* Copy n bf16 of device output back and compare with ref, both widened
 * (the header's rule): right within atol + slack * |slack_of[i]| (slack_of
 * NULL: none), a flip within ulps * BF16_SPACING * |ref| more, wrong
 * beyond; more than flip_frac of the elements (and one) flipping are
 * wrong too, all but the allowed ones counted. */
static void check_bf16_slack(check_t *c, const char *what,
			     const flow_bf16_t *ref, const flow_bf16_t *dev,
			     size_t n, double atol, double ulps,
			     double flip_frac, const flow_bf16_t *slack_of,
			     double slack)
{
	flow_bf16_t *got = flow_alloc(n * sizeof(flow_bf16_t));
	const size_t allowed = (size_t)(flip_frac * (double)n) +
			       (flip_frac > 0.0 ? 1 : 0);
	size_t flips = 0;

	if (!got) {
		fprintf(stderr, PROG ": out of host memory\n");
		exit(1);
	}
	CU(flow_cuda_sync(g_stream, &g_diag));
	CU(flow_cuda_copy_to_host(got, dev, n * sizeof(flow_bf16_t), &g_diag));
	for (size_t i = 0; i < n; i++) {
		double r = flow_bf16_widen(ref[i]), g = flow_bf16_widen(got[i]);
		double tol = atol + (slack_of ?
			slack * fabs(flow_bf16_widen(slack_of[i])) : 0.0);
		double d = fabs(g - r);
		/* Within tol: right; check_value then counts it so too. */
		if (d > tol && d <= tol + ulps * BF16_SPACING * fabs(r)) {
			flips++;
			tol = d;
		}
		check_value(c, what, i, r, g, tol, 0.0);
	}
	if (flips > allowed) {
		fprintf(stderr,
			PROG ": %s: %s: %zu of %zu elements a rounding apart, "
			     "more than %zu\n",
			c->kernel, what, flips, n, allowed);
		c->wrong += flips - allowed;
	}
	printf("# %s %s: %zu of %zu elements a rounding apart (%zu "
	       "allowed)\n",
	       c->kernel, what, flips, n, allowed);
	flow_free(got);
}

/* One rounding apart at most, in at most flip_frac of the elements. */
static void check_bf16(check_t *c, const char *what, const flow_bf16_t *ref,
		       const flow_bf16_t *dev, size_t n, double atol,
		       double flip_frac)
{
	check_bf16_slack(c, what, ref, dev, n, atol, 1.0, flip_frac, NULL,
			 0.0);
}

static void report(const check_t *c, double time_us)
{
	bool pass = c->wrong == 0;
	g_kernels++;
	if (!pass)
		g_failed_kernels++;
	printf("%s\t%s\t%.3e\t%.3e\t%zu\t%.2f\n", c->kernel,
	       pass ? "yes" : "no", c->max_abs, c->max_rel, c->wrong, time_us);
	fflush(stdout);
}

/* ---- the kernels --------------------------------------------------------- */

/* GPT-2 small shapes, cut to a batch the CPU reference checks in seconds. */
#define TB 4
#define TT 256
#define TC 768
#define TNH 12
#define TVOCAB 1000 /* embedding vocabulary: tokens repeat */
#define TN (TB * TT)

static void test_matmul(bool with_bias)
{
	const size_t n = TN, in = TC, out = 3 * TC;
	const double tol = 1e-4;
	check_t c;
	double us = 0.0;
	float *inp = host_rand(n * in, -1.0f, 1.0f);
	float *w = host_rand(out * in, -1.0f, 1.0f);
	float *b = host_rand(out, -1.0f, 1.0f);
	float *ref = host_alloc(n * out * sizeof(float));
	float *d_inp = dev_floats(inp, n * in);
	float *d_w = dev_floats(w, out * in);
	float *d_b = with_bias ? dev_floats(b, out) : NULL;
	float *d_out = dev_alloc(n * out * sizeof(float));

	check_init(&c, with_bias ? "matmul_forward" : "matmul_forward_nobias");
	flow_cpu_matmul_forward(ref, inp, w, with_bias ? b : NULL, n, in, out);
	CU(flow_cuda_matmul_forward(d_out, d_inp, d_w, d_b, n, in, out,
				    &g_diag, g_stream));
	check_floats(&c, "out", ref, d_out, n * out, tol, tol);
	TIME_US(us, flow_cuda_matmul_forward(d_out, d_inp, d_w, d_b, n, in,
					     out, &g_diag, g_stream));
	report(&c, us);
	free_all();
}

/* The bias in cuBLASLt's epilogue on buffers one float off the 256-byte
 * alignment cuBLASLt assumes unless told (an arena tensor is only
 * 64-byte aligned): the heuristic must be told, or it may pick a kernel
 * that faults or misreads. */
static void test_matmul_unaligned(void)
{
	const size_t n = 333, in = TC, out = 3 * TC;
	check_t c;
	double us = 0.0;
	float *inp = host_rand(n * in, -1.0f, 1.0f);
	float *w = host_rand(out * in, -1.0f, 1.0f);
	float *b = host_rand(out, -1.0f, 1.0f);
	float *ref = host_alloc(n * out * sizeof(float));
	float *inp1 = host_alloc((n * in + 1) * sizeof(float));
	memcpy(inp1 + 1, inp, n * in * sizeof(float));
	inp1[0] = 0.0f;
	float *d_inp = dev_floats(inp1, n * in + 1) + 1;
	float *d_w = dev_floats(w, out * in);
	float *d_b = dev_floats(b, out);
	float *d_out = (float *)dev_alloc((n * out + 1) * sizeof(float)) + 1;

	check_init(&c, "matmul_forward_unaligned");
	flow_cpu_matmul_forward(ref, inp, w, b, n, in, out);
	CU(flow_cuda_matmul_forward(d_out, d_inp, d_w, d_b, n, in, out,
				    &g_diag, g_stream));
	check_floats(&c, "out", ref, d_out, n * out, 1e-4, 1e-4);
	report(&c, us);
	free_all();
}

/* The MLP's fc matmul and its GELU as one kernel (the GELU_AUX_BIAS
 * epilogue) at GPT-2's fc shape, against the CPU's two kernels: pre as the
 * matmul's tolerance, out that plus cuBLASLt's GELU against the CPU's
 * tanhf (gelu' <= 1.13): atol 2e-4. */
static void test_matmul_gelu(void)
{
	const size_t n = TN, in = TC, out = 4 * TC;
	const double tol = 1e-4;
	check_t c;
	double us = 0.0;
	float *inp = host_rand(n * in, -1.0f, 1.0f);
	float *w = host_rand(out * in, -0.1f, 0.1f);
	float *b = host_rand(out, -1.0f, 1.0f);
	float *pre = host_alloc(n * out * sizeof(float));
	float *act = host_alloc(n * out * sizeof(float));
	float *d_inp = dev_floats(inp, n * in);
	float *d_w = dev_floats(w, out * in);
	float *d_b = dev_floats(b, out);
	float *d_pre = dev_alloc(n * out * sizeof(float));
	float *d_act = dev_alloc(n * out * sizeof(float));

	check_init(&c, "matmul_gelu_forward");
	flow_cpu_matmul_gelu_forward(pre, act, inp, w, b, n, in, out);
	CU(flow_cuda_matmul_gelu_forward(d_pre, d_act, d_inp, d_w, d_b, n, in,
					 out, &g_diag, g_stream));
	check_floats(&c, "pre", pre, d_pre, n * out, tol, tol);
	check_floats(&c, "out", act, d_act, n * out, 2 * tol, tol);
	TIME_US(us, flow_cuda_matmul_gelu_forward(d_pre, d_act, d_inp, d_w,
						  d_b, n, in, out, &g_diag,
						  g_stream));
	report(&c, us);
	free_all();
}

static void test_matmul_backward(void)
{
	const size_t n = TN, in = TC, out = 3 * TC;
	const double tol = 1e-4;
	check_t c;
	double us = 0.0;
	float *inp = host_rand(n * in, -1.0f, 1.0f);
	float *w = host_rand(out * in, -1.0f, 1.0f);
	float *dout = host_rand(n * out, -1.0f, 1.0f);
	/* Non-zero starting gradients check that backward accumulates. */
	float *dinp = host_rand(n * in, -1.0f, 1.0f);
	float *dw = host_rand(out * in, -1.0f, 1.0f);
	float *db = host_rand(out, -1.0f, 1.0f);
	float *d_inp = dev_floats(inp, n * in);
	float *d_w = dev_floats(w, out * in);
	float *d_dout = dev_floats(dout, n * out);
	float *d_dinp = dev_floats(dinp, n * in);
	float *d_dw = dev_floats(dw, out * in);
	float *d_db = dev_floats(db, out);

	check_init(&c, "matmul_backward");
	flow_cpu_matmul_backward(dinp, dw, db, dout, inp, w, n, in, out);
	CU(flow_cuda_matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, n,
				     in, out, &g_diag, g_stream));
	check_floats(&c, "dinp", dinp, d_dinp, n * in, tol, tol);
	check_floats(&c, "dweight", dw, d_dw, out * in, tol, tol);
	check_floats(&c, "dbias", db, d_db, out, tol, tol);
	TIME_US(us, flow_cuda_matmul_backward(d_dinp, d_dw, d_db, d_dout,
					      d_inp, d_w, n, in, out, &g_diag,
					      g_stream));
	report(&c, us);
	free_all();
}

/* Over all of wte (row0 0, rows TVOCAB) or a shard of its rows, as a
 * vocabulary-parallel plan holds it: tokens outside add nothing. */
static void test_embedding(int64_t row0, size_t rows)
{
	const size_t B = TB, T = TT, C = TC;
	const bool shard = rows != TVOCAB;
	check_t c;
	double us = 0.0;
	int32_t *tok = host_tokens(B * T, TVOCAB, 0);
	float *wte = host_rand(rows * C, -1.0f, 1.0f);
	float *wpe = host_rand(T * C, -1.0f, 1.0f);
	float *ref = host_alloc(B * T * C * sizeof(float));
	float *dout = host_rand(B * T * C, -1.0f, 1.0f);
	float *dwte = host_rand(rows * C, -1.0f, 1.0f);
	float *dwpe = host_rand(T * C, -1.0f, 1.0f);
	int32_t *d_tok = dev_from(tok, B * T * sizeof(int32_t));
	float *d_wte = dev_floats(wte, rows * C);
	float *d_wpe = dev_floats(wpe, T * C);
	float *d_out = dev_alloc(B * T * C * sizeof(float));
	float *d_dout = dev_floats(dout, B * T * C);
	float *d_dwte = dev_floats(dwte, rows * C);
	float *d_dwpe = dev_floats(dwpe, T * C);

	check_init(&c, shard ? "embedding_forward_shard" : "embedding_forward");
	flow_cpu_embedding_forward(ref, tok, wte, wpe, row0, rows, B, T, C);
	CU(flow_cuda_embedding_forward(d_out, d_tok, d_wte, d_wpe, row0, rows,
				       B, T, C, &g_diag, g_stream));
	check_floats(&c, "out", ref, d_out, B * T * C, 0.0, 0.0);
	TIME_US(us, flow_cuda_embedding_forward(d_out, d_tok, d_wte, d_wpe,
						row0, rows, B, T, C, &g_diag,
						g_stream));
	report(&c, us);

	check_init(&c, shard ? "embedding_backward_shard" : "embedding_backward");
	flow_cpu_embedding_backward(dwte, dwpe, dout, tok, row0, rows, B, T, C);
	CU(flow_cuda_embedding_backward(d_dwte, d_dwpe, d_dout, d_tok, row0,
					rows, B, T, C, &g_diag, g_stream));
	check_floats(&c, "dwte", dwte, d_dwte, rows * C, 1e-6, 1e-6);
	check_floats(&c, "dwpe", dwpe, d_dwpe, T * C, 1e-6, 1e-6);
	TIME_US(us, flow_cuda_embedding_backward(d_dwte, d_dwpe, d_dout, d_tok,
						 row0, rows, B, T, C, &g_diag,
						 g_stream));
	report(&c, us);
	free_all();
}

static void test_layernorm(void)
{
	const size_t n = TN, C = TC;
	check_t c;
	double us = 0.0;
	/* An offset mean, as a residual stream has. */
	float *inp = host_rand(n * C, 2.0f, 4.0f);
	float *w = host_rand(C, 0.5f, 1.5f);
	float *b = host_rand(C, -1.0f, 1.0f);
	float *out = host_alloc(n * C * sizeof(float));
	float *mean = host_alloc(n * sizeof(float));
	float *rstd = host_alloc(n * sizeof(float));
	float *dout = host_rand(n * C, -1.0f, 1.0f);
	float *dinp = host_rand(n * C, -1.0f, 1.0f);
	float *dw = host_rand(C, -1.0f, 1.0f);
	float *db = host_rand(C, -1.0f, 1.0f);
	float *d_inp = dev_floats(inp, n * C);
	float *d_w = dev_floats(w, C);
	float *d_b = dev_floats(b, C);
	float *d_out = dev_alloc(n * C * sizeof(float));
	float *d_mean = dev_alloc(n * sizeof(float));
	float *d_rstd = dev_alloc(n * sizeof(float));
	float *d_dout = dev_floats(dout, n * C);
	float *d_dinp = dev_floats(dinp, n * C);
	float *d_dw = dev_floats(dw, C);
	float *d_db = dev_floats(db, C);
	float *d_mean_cpu = NULL, *d_rstd_cpu = NULL;

	check_init(&c, "layernorm_forward");
	flow_cpu_layernorm_forward(out, mean, rstd, inp, w, b, n, C);
	CU(flow_cuda_layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b,
				       n, C, &g_diag, g_stream));
	check_floats(&c, "out", out, d_out, n * C, 1e-5, 1e-5);
	check_floats(&c, "mean", mean, d_mean, n, 1e-5, 1e-5);
	check_floats(&c, "rstd", rstd, d_rstd, n, 1e-5, 1e-5);
	TIME_US(us, flow_cuda_layernorm_forward(d_out, d_mean, d_rstd, d_inp,
						d_w, d_b, n, C, &g_diag,
						g_stream));
	report(&c, us);

	/* Fused with the residual add: inp = a + b, the add exact on both
	 * sides, the layernorm as above. */
	check_init(&c, "residual_layernorm_forward");
	{
		float *a = host_rand(n * C, 1.0f, 3.0f);
		float *bb = host_rand(n * C, 0.0f, 2.0f);
		float *res = host_alloc(n * C * sizeof(float));
		float *d_a = dev_floats(a, n * C), *d_bb = dev_floats(bb, n * C);
		float *d_res = dev_alloc(n * C * sizeof(float));
		flow_cpu_residual_layernorm_forward(res, out, mean, rstd, a, bb,
						    w, b, n, C);
		CU(flow_cuda_residual_layernorm_forward(d_res, d_out, d_mean,
							d_rstd, d_a, d_bb, d_w,
							d_b, n, C, &g_diag,
							g_stream));
		check_floats(&c, "res", res, d_res, n * C, 0.0, 0.0);
		check_floats(&c, "out", out, d_out, n * C, 1e-5, 1e-5);
		check_floats(&c, "mean", mean, d_mean, n, 1e-5, 1e-5);
		check_floats(&c, "rstd", rstd, d_rstd, n, 1e-5, 1e-5);
		TIME_US(us, flow_cuda_residual_layernorm_forward(
				    d_res, d_out, d_mean, d_rstd, d_a, d_bb,
				    d_w, d_b, n, C, &g_diag, g_stream));
		/* The statistics of the layernorm's own input, for backward. */
		flow_cpu_layernorm_forward(out, mean, rstd, inp, w, b, n, C);
	}
	report(&c, us);

	/* Backward from the CPU's saved statistics on both sides, so the
	 * comparison isolates the backward kernel. */
	check_init(&c, "layernorm_backward");
	d_mean_cpu = dev_floats(mean, n);
	d_rstd_cpu = dev_floats(rstd, n);
	flow_cpu_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, n,
				    C);
	CU(flow_cuda_layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w,
					d_mean_cpu, d_rstd_cpu, n, C, &g_diag,
					g_stream));
	check_floats(&c, "dinp", dinp, d_dinp, n * C, 1e-5, 1e-5);
	check_floats(&c, "dweight", dw, d_dw, C, 1e-5, 1e-5);
	check_floats(&c, "dbias", db, d_db, C, 1e-5, 1e-5);
	TIME_US(us, flow_cuda_layernorm_backward(d_dinp, d_dw, d_db, d_dout,
						 d_inp, d_w, d_mean_cpu,
						 d_rstd_cpu, n, C, &g_diag,
						 g_stream));
	report(&c, us);

	/* Fused with the residual add's backward: dres as dinp above, then
	 * da += dres and db += dres, one float addition each. */
	check_init(&c, "layernorm_residual_backward");
	{
		float *dres = host_rand(n * C, -1.0f, 1.0f);
		float *da = host_rand(n * C, -1.0f, 1.0f);
		float *dbb = host_rand(n * C, -1.0f, 1.0f);
		float *d_dres = dev_floats(dres, n * C);
		float *d_da = dev_floats(da, n * C), *d_dbb = dev_floats(dbb, n * C);
		float *d_dw2 = dev_floats(dw, C), *d_db2 = dev_floats(db, C);
		float *dw2 = host_copy(dw, C), *db2 = host_copy(db, C);
		flow_cpu_layernorm_residual_backward(dres, da, dbb, dw2, db2,
						     dout, inp, w, mean, rstd,
						     n, C);
		CU(flow_cuda_layernorm_residual_backward(
			d_dres, d_da, d_dbb, d_dw2, d_db2, d_dout, d_inp, d_w,
			d_mean_cpu, d_rstd_cpu, n, C, &g_diag, g_stream));
		check_floats(&c, "dres", dres, d_dres, n * C, 1e-5, 1e-5);
		check_floats(&c, "da", da, d_da, n * C, 1e-5, 1e-5);
		check_floats(&c, "db", dbb, d_dbb, n * C, 1e-5, 1e-5);
		check_floats(&c, "dweight", dw2, d_dw2, C, 1e-5, 1e-5);
		check_floats(&c, "dbias", db2, d_db2, C, 1e-5, 1e-5);
		TIME_US(us, flow_cuda_layernorm_residual_backward(
				    d_dres, d_da, d_dbb, d_dw2, d_db2, d_dout,
				    d_inp, d_w, d_mean_cpu, d_rstd_cpu, n, C,
				    &g_diag, g_stream));
	}
	report(&c, us);
	free_all();
}

static void test_gelu(void)
{
	const size_t n = (size_t)TN * 4 * TC;
	check_t c;
	double us = 0.0;
	float *inp = host_rand(n, -4.0f, 4.0f);
	float *out = host_alloc(n * sizeof(float));
	float *dout = host_rand(n, -1.0f, 1.0f);
	float *dinp = host_rand(n, -1.0f, 1.0f);
	float *d_inp = dev_floats(inp, n);
	float *d_out = dev_alloc(n * sizeof(float));
	float *d_dout = dev_floats(dout, n);
	float *d_dinp = dev_floats(dinp, n);

	check_init(&c, "gelu_forward");
	flow_cpu_gelu_forward(out, inp, n);
	CU(flow_cuda_gelu_forward(d_out, d_inp, n, &g_diag, g_stream));
	check_floats(&c, "out", out, d_out, n, 1e-6, 1e-5);
	TIME_US(us, flow_cuda_gelu_forward(d_out, d_inp, n, &g_diag, g_stream));
	report(&c, us);

	check_init(&c, "gelu_backward");
	flow_cpu_gelu_backward(dinp, inp, dout, n);
	CU(flow_cuda_gelu_backward(d_dinp, d_inp, d_dout, n, &g_diag,
				   g_stream));
	/* atol 3e-6, not 1e-6: CUDA's tanhf may be 2 ulp from the CPU's
	 * tanh, and near |x| = 4, where 1 - tanh^2 cancels, that moves the
	 * gradient by up to 1.5e-6 on values of 3e-4 (emulated over 3.1M
	 * inputs of these distributions; a wrong index is off by O(1)). */
	check_floats(&c, "dinp", dinp, d_dinp, n, 3e-6, 1e-5);
	TIME_US(us, flow_cuda_gelu_backward(d_dinp, d_inp, d_dout, n, &g_diag,
					    g_stream));
	report(&c, us);
	free_all();
}

/* The own kernel in fp32 against the CPU's. */
static void test_attention(void)
{
	const size_t B = TB, T = TT, C = TC, NH = TNH;
	const size_t nqkv = B * T * 3 * C, nout = B * T * C;
	const size_t nlse = B * NH * T;
	check_t c;
	double us = 0.0;
	float *qkv = host_rand(nqkv, -1.0f, 1.0f);
	float *out = host_alloc(nout * sizeof(float));
	float *lse = host_alloc(nlse * sizeof(float));
	float *dout = host_rand(nout, -1.0f, 1.0f);
	float *dqkv = host_rand(nqkv, -1.0f, 1.0f);
	void *scratch = host_alloc(
		flow_cpu_attention_scratch_bound(B, T, C, NH, false));
	float *d_qkv = dev_floats(qkv, nqkv);
	float *d_out = dev_alloc(nout * sizeof(float));
	float *d_lse = dev_alloc(nlse * sizeof(float));
	float *d_dout = dev_floats(dout, nout);
	float *d_dqkv = dev_floats(dqkv, nqkv);
	void *d_scratch = dev_alloc(
		flow_cuda_attention_scratch_bound(B, T, C, NH, false));
	float *d_lse_cpu = NULL, *d_out_cpu = NULL;

	check_init(&c, "attention_forward");
	flow_cpu_attention_forward(out, lse, scratch, qkv, B, T, C, NH);
	CU(flow_cuda_attention_forward(d_out, d_lse, d_scratch, d_qkv, B, T, C,
				       NH, &g_diag, g_stream));
	check_floats(&c, "lse", lse, d_lse, nlse, 1e-5, 1e-5);
	check_floats(&c, "out", out, d_out, nout, 1e-5, 1e-4);
	TIME_US(us, flow_cuda_attention_forward(d_out, d_lse, d_scratch, d_qkv,
						B, T, C, NH, &g_diag,
						g_stream));
	report(&c, us);

	/* Backward from the CPU's lse and out on both sides. */
	check_init(&c, "attention_backward");
	d_lse_cpu = dev_floats(lse, nlse);
	d_out_cpu = dev_floats(out, nout);
	flow_cpu_attention_backward(dqkv, scratch, dout, qkv, lse, out, B, T,
				    C, NH);
	CU(flow_cuda_attention_backward(d_dqkv, d_scratch, d_dout, d_qkv,
					d_lse_cpu, d_out_cpu, B, T, C, NH,
					&g_diag, g_stream));
	check_floats(&c, "dqkv", dqkv, d_dqkv, nqkv, 5e-5, 1e-3);
	TIME_US(us, flow_cuda_attention_backward(d_dqkv, d_scratch, d_dout,
						 d_qkv, d_lse_cpu, d_out_cpu,
						 B, T, C, NH, &g_diag,
						 g_stream));
	report(&c, us);
	free_all();
}

static void test_residual(void)
{
	const size_t n = (size_t)TN * TC;
	check_t c;
	double us = 0.0;
	float *a = host_rand(n, -1.0f, 1.0f);
	float *b = host_rand(n, -1.0f, 1.0f);
	float *out = host_alloc(n * sizeof(float));
	float *dout = host_rand(n, -1.0f, 1.0f);
	float *da = host_rand(n, -1.0f, 1.0f);
	float *db = host_rand(n, -1.0f, 1.0f);
	float *d_a = dev_floats(a, n);
	float *d_b = dev_floats(b, n);
	float *d_out = dev_alloc(n * sizeof(float));
	float *d_dout = dev_floats(dout, n);
	float *d_da = dev_floats(da, n);
	float *d_db = dev_floats(db, n);

	check_init(&c, "residual_forward");
	flow_cpu_residual_forward(out, a, b, n);
	CU(flow_cuda_residual_forward(d_out, d_a, d_b, n, &g_diag, g_stream));
	check_floats(&c, "out", out, d_out, n, 0.0, 0.0);
	TIME_US(us, flow_cuda_residual_forward(d_out, d_a, d_b, n, &g_diag,
					       g_stream));
	report(&c, us);

	check_init(&c, "residual_backward");
	flow_cpu_residual_backward(da, db, dout, n);
	CU(flow_cuda_residual_backward(d_da, d_db, d_dout, n, &g_diag,
				       g_stream));
	check_floats(&c, "da", da, d_da, n, 0.0, 0.0);
	check_floats(&c, "db", db, d_db, n, 0.0, 0.0);
	TIME_US(us, flow_cuda_residual_backward(d_da, d_db, d_dout, n, &g_diag,
						g_stream));
	report(&c, us);
	free_all();
}

static void test_cross_entropy(void)
{
	const size_t n = TN / 4, V = 50257, Vp = 50304;
	const float dloss = 1.0f / (float)(TN / 4);
	check_t c;
	double us = 0.0;
	float *logits = host_rand(n * Vp, -4.0f, 4.0f);
	float *d_logits = dev_floats(logits, n * Vp); /* before the CPU's
						       * in-place update */
	int32_t *tgt = host_tokens(n, (int32_t)V, 4);
	float *losses = host_alloc(n * sizeof(float));
	int32_t *d_tgt = dev_from(tgt, n * sizeof(int32_t));
	float *d_losses = dev_alloc(n * sizeof(float));

	check_init(&c, "cross_entropy_forward_backward");
	flow_cpu_cross_entropy_forward_backward(losses, logits, tgt, n, V, Vp,
						dloss);
	CU(flow_cuda_cross_entropy_forward_backward(d_losses, d_logits, d_tgt,
						    n, V, Vp, dloss, &g_diag,
						    g_stream));
	check_floats(&c, "losses", losses, d_losses, n, 1e-5, 1e-5);
	check_floats(&c, "dlogits", logits, d_logits, n * Vp, 1e-9, 1e-4);
	TIME_US(us, flow_cuda_cross_entropy_forward_backward(
			    d_losses, d_logits, d_tgt, n, V, Vp, dloss,
			    &g_diag, g_stream));
	report(&c, us);
	free_all();
}

/* The three split steps over the last of four column shards of the
 * logits (12576 columns, 12529 of them real), each against the CPU's on
 * the same inputs; the other members' maxima are made up, above and
 * below this shard's. */
static void test_cross_entropy_split(void)
{
	const size_t n = TN / 4, V = 50257, Vp = 50304, p = 4;
	const flow_logits_shard_t s = { .n = n, .cols = Vp / p,
					.valid = V - 3 * (Vp / p),
					.c0 = (int64_t)(3 * (Vp / p)),
					.first = true };
	const float dloss = 1.0f / (float)n;
	check_t c;
	double us = 0.0;
	float *logits = host_rand(n * s.cols, -4.0f, 4.0f);
	float *d_logits = dev_floats(logits, n * s.cols);
	float *gathered = host_rand(p * n, 3.5f, 4.5f);
	float *max = host_alloc(n * sizeof(float));
	float *sums = host_alloc(n * sizeof(float));
	float *losses = host_alloc(n * sizeof(float));
	/* Targets anywhere in the row: a quarter here, some ignored. */
	int32_t *tgt = host_tokens(n, (int32_t)V, 4);
	int32_t *d_tgt = dev_from(tgt, n * sizeof(int32_t));
	float *d_max = dev_alloc(n * sizeof(float));
	float *d_sums = dev_alloc(n * sizeof(float));
	float *d_losses = dev_alloc(n * sizeof(float));

	check_init(&c, "cross_entropy_split_max");
	flow_cpu_cross_entropy_split_max(max, logits, &s);
	CU(flow_cuda_cross_entropy_split_max(d_max, d_logits, &s, &g_diag,
					     g_stream));
	check_floats(&c, "max", max, d_max, n, 0.0, 0.0);
	report(&c, us);

	check_init(&c, "cross_entropy_split_sums");
	memcpy(gathered + 3 * n, max, n * sizeof(float)); /* this member's */
	float *d_gathered = dev_floats(gathered, p * n);
	flow_cpu_cross_entropy_split_sums(sums, max, gathered, p, logits, &s);
	CU(flow_cuda_cross_entropy_split_sums(d_sums, d_max, d_gathered, p,
					      d_logits, &s, &g_diag,
					      g_stream));
	check_floats(&c, "max", max, d_max, n, 0.0, 0.0);
	check_floats(&c, "sums", sums, d_sums, n, 1e-6, 1e-6);
	TIME_US(us, flow_cuda_cross_entropy_split_sums(d_sums, d_max,
						       d_gathered, p, d_logits,
						       &s, &g_diag, g_stream));
	report(&c, us);

	check_init(&c, "cross_entropy_split_finish");
	float *d_max_cpu = dev_floats(max, n);
	float *d_sums_cpu = dev_floats(sums, n);
	flow_cpu_cross_entropy_split_finish(losses, logits, tgt, max, sums, &s,
					    dloss);
	CU(flow_cuda_cross_entropy_split_finish(d_losses, d_logits, d_tgt,
						d_max_cpu, d_sums_cpu, &s,
						dloss, &g_diag, g_stream));
	check_floats(&c, "losses", losses, d_losses, n, 1e-6, 1e-6);
	check_floats(&c, "dlogits", logits, d_logits, n * s.cols, 1e-9, 1e-5);
	report(&c, us);
	free_all();
}

/* Element i of a host buffer of n random dtype values: floats U(-1,1),
 * bf16 roundings of them (finite), and the floats' bits as integers. */
static void *box_values(flow_dtype_t dtype, size_t n)
{
	float *f = host_rand(n, -1.0f, 1.0f);
	if (dtype == FLOW_DTYPE_BF16) {
		uint16_t *h = (uint16_t *)f; /* in place, front to back */
		for (size_t i = 0; i < n; i++)
			h[i] = flow_f32_to_bf16(f[i]);
	}
	return f;
}

/* box_move against the host's flow_boxing_move_region: a strided 3-D
 * region between two pieces, copied and added, in f32, i32 and bf16;
 * exact, as both do the same one operation per element. */
static void test_box_move(void)
{
	const flow_box_t sbox = { 3, { 0, 4, 0 }, { 8, 12, 96 } };
	const flow_box_t dbox = { 3, { 2, 0, 32 }, { 6, 20, 64 } };
	const flow_box_t region = { 3, { 2, 6, 40 }, { 5, 9, 50 } };
	const size_t ns = 8 * 12 * 96, nd = 6 * 20 * 64;
	const flow_dtype_t dtypes[] = { FLOW_DTYPE_F32, FLOW_DTYPE_I32,
					FLOW_DTYPE_BF16 };
	check_t c;
	double us = 0.0;
	void *got = host_alloc(nd * sizeof(float));
	float *d_src = dev_alloc(ns * sizeof(float));
	float *d_dst = dev_alloc(nd * sizeof(float));

	check_init(&c, "box_move");
	for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
		size_t es = flow_dtype_size(dtypes[k]);
		void *src = box_values(dtypes[k], ns);
		void *dst0 = box_values(dtypes[k], nd);
		RT(cudaMemcpy(d_src, src, ns * es, cudaMemcpyHostToDevice));
		for (int add = 0; add < 2; add++) {
			void *dst = host_alloc(nd * es);
			memcpy(dst, dst0, nd * es);
			RT(cudaMemcpy(d_dst, dst, nd * es,
				      cudaMemcpyHostToDevice));
			RT(cudaDeviceSynchronize()); /* as in dev_from */
			flow_boxing_move_region(dtypes[k], src, &sbox, dst,
						&dbox, &region, add);
			CU(flow_cuda_box_move(dtypes[k], d_src, &sbox, d_dst,
					      &dbox, &region, add, &g_diag,
					      g_stream));
			RT(cudaStreamSynchronize(g_stream));
			RT(cudaMemcpy(got, d_dst, nd * es,
				      cudaMemcpyDeviceToHost));
			if (memcmp(got, dst, nd * es) != 0) {
				fprintf(stderr, PROG ": box_move %s%s differs from the host's\n",
					flow_dtype_name(dtypes[k]),
					add ? " add" : "");
				c.wrong++;
			}
		}
	}
	TIME_US(us, flow_cuda_box_move(FLOW_DTYPE_F32, d_src, &sbox, d_dst,
				       &dbox, &region, false, &g_diag,
				       g_stream));
	report(&c, us);
	free_all();
}

static void test_adamw(bool decay, uint64_t t)
{
	const size_t n = (size_t)1 << 20;
	const flow_adamw_params_t hp = { .lr = 6e-4f, .beta1 = 0.9f,
					 .beta2 = 0.95f, .eps = 1e-8f,
					 .weight_decay = 0.1f };
	check_t c;
	double us = 0.0;
	float *p = host_rand(n, -1.0f, 1.0f);
	float *g = host_rand(n, -1.0f, 1.0f);
	/* t == 1 starts from zero moments; a later step from warm ones. */
	float *m = host_rand(n, t == 1 ? 0.0f : -0.1f, t == 1 ? 0.0f : 0.1f);
	float *v = host_rand(n, 0.0f, t == 1 ? 0.0f : 0.01f);
	float *d_p = dev_floats(p, n);
	float *d_g = dev_floats(g, n);
	float *d_m = dev_floats(m, n);
	float *d_v = dev_floats(v, n);

	check_init(&c, decay ? "adamw_update_decay_t1" : "adamw_update_t10");
	flow_cpu_adamw_update(p, g, m, v, n, &hp, t, decay);
	CU(flow_cuda_adamw_update(d_p, d_g, d_m, d_v, n, &hp, t, decay,
				  &g_diag, g_stream));
	check_floats(&c, "param", p, d_p, n, 1e-7, 1e-6);
	check_floats(&c, "m", m, d_m, n, 1e-7, 1e-6);
	check_floats(&c, "v", v, d_v, n, 1e-7, 1e-6);
	TIME_US(us, flow_cuda_adamw_update(d_p, d_g, d_m, d_v, n, &hp, t,
					   decay, &g_diag, g_stream));
	report(&c, us);
	free_all();
}

/* The one-launch update of several tensors, sizes across the 65536-element
 * tile (one partial tile, several, none), decay on and off: each as the
 * CPU's per-tensor update. */
static void test_adamw_all(void)
{
	static const size_t counts[] = { 7, 65536, 65537, 0, 300000 };
	static const bool decay[] = { true, false, true, true, false };
	enum { NT = sizeof(counts) / sizeof(counts[0]) };
	const flow_adamw_params_t hp = { .lr = 6e-4f, .beta1 = 0.9f,
					 .beta2 = 0.95f, .eps = 1e-8f,
					 .weight_decay = 0.1f };
	float *p[NT], *g[NT], *m[NT], *v[NT];
	float *dp[NT], *dg[NT], *dm[NT], *dv[NT];
	check_t c;
	double us = 0.0;

	for (int i = 0; i < NT; i++) {
		size_t n = counts[i] ? counts[i] : 1;
		p[i] = host_rand(n, -1.0f, 1.0f);
		g[i] = host_rand(n, -1.0f, 1.0f);
		m[i] = host_rand(n, -0.1f, 0.1f);
		v[i] = host_rand(n, 0.0f, 0.01f);
		dp[i] = dev_floats(p[i], n);
		dg[i] = dev_floats(g[i], n);
		dm[i] = dev_floats(m[i], n);
		dv[i] = dev_floats(v[i], n);
	}
	check_init(&c, "adamw_update_all_t3");
	for (int i = 0; i < NT; i++)
		flow_cpu_adamw_update(p[i], g[i], m[i], v[i], counts[i], &hp, 3,
				      decay[i]);
	CU(flow_cuda_adamw_update_all(dp, (const float *const *)dg, dm, dv,
				      counts, decay, NT, &hp, 3, &g_diag,
				      g_stream));
	for (int i = 0; i < NT; i++) {
		if (counts[i] == 0) /* nothing to update, nothing to check */
			continue;
		check_floats(&c, "param", p[i], dp[i], counts[i], 1e-7, 1e-6);
		check_floats(&c, "m", m[i], dm[i], counts[i], 1e-7, 1e-6);
		check_floats(&c, "v", v[i], dv[i], counts[i], 1e-7, 1e-6);
	}
	TIME_US(us, flow_cuda_adamw_update_all(dp, (const float *const *)dg,
					       dm, dv, counts, decay, NT, &hp,
					       3, &g_diag, g_stream));
	report(&c, us);
	free_all();
}

static void test_grad_norm(void)
{
	/* Sizes that exercise one partial block, many, and the block cap. */
	static const size_t counts[] = { 7, 50000, (size_t)3 << 20, 1000 };
	enum { NT = sizeof(counts) / sizeof(counts[0]) };
	float *grads[NT], *d_grads[NT];
	check_t c;
	double us = 0.0, ref_ss = 0.0, got_ss = 0.0;
	float ref_norm = 0.0f, got_norm = 0.0f;
	double *d_ss = dev_alloc(sizeof(double));

	for (int i = 0; i < NT; i++) {
		grads[i] = host_rand(counts[i], -1.0f, 1.0f);
		d_grads[i] = dev_floats(grads[i], counts[i]);
	}

	check_init(&c, "sum_squares");
	ref_ss = flow_cpu_sum_squares(grads[2], counts[2]);
	CU(flow_cuda_sum_squares(d_grads[2], counts[2], d_ss, &g_diag,
				 g_stream));
	CU(flow_cuda_sync(g_stream, &g_diag));
	CU(flow_cuda_copy_to_host(&got_ss, d_ss, sizeof(double), &g_diag));
	check_value(&c, "sum", 0, ref_ss, got_ss, 0.0, 1e-9);
	TIME_US(us, flow_cuda_sum_squares(d_grads[2], counts[2], d_ss, &g_diag,
					  g_stream));
	report(&c, us);

	check_init(&c, "scale");
	flow_cpu_scale(grads[1], counts[1], 0.37f);
	CU(flow_cuda_scale(d_grads[1], counts[1], 0.37f, &g_diag, g_stream));
	check_floats(&c, "x", grads[1], d_grads[1], counts[1], 0.0, 0.0);
	TIME_US(us, flow_cuda_scale(d_grads[1], counts[1], 1.0f, &g_diag,
				    g_stream));
	report(&c, us);

	/* The norm is ~1000, so max_norm 1 clips. */
	check_init(&c, "clip_grad_norm");
	ref_norm = flow_cpu_clip_grad_norm(grads, counts, NT, 1.0f);
	CU(flow_cuda_clip_grad_norm(d_grads, counts, NT, 1.0f, &got_norm,
				    &g_diag, g_stream));
	check_value(&c, "norm", 0, ref_norm, got_norm, 0.0, 1e-6);
	for (int i = 0; i < NT; i++)
		check_floats(&c, "grad", grads[i], d_grads[i], counts[i], 1e-7,
			     1e-6);
	/* Now the norm is ~1: max_norm 1e6 must leave gradients untouched. */
	ref_norm = flow_cpu_clip_grad_norm(grads, counts, NT, 1e6f);
	CU(flow_cuda_clip_grad_norm(d_grads, counts, NT, 1e6f, &got_norm,
				    &g_diag, g_stream));
	check_value(&c, "norm_noclip", 0, ref_norm, got_norm, 0.0, 1e-6);
	for (int i = 0; i < NT; i++)
		check_floats(&c, "grad_noclip", grads[i], d_grads[i],
			     counts[i], 1e-7, 1e-6);
	TIME_US(us, flow_cuda_clip_grad_norm(d_grads, counts, NT, 1e6f, NULL,
					     &g_diag, g_stream));
	report(&c, us);
	free_all();
}

/* ---- the bf16 twins ---------------------------------------------------- */

/* The logits' GEMM of a GPT-2 batch (no bias; dinp sums 50304 products;
 * the CPU takes its rows in panels). */
#define LOGITS_N 2048
#define LOGITS_OUT 50304

/* matmul_bf16_forward at n x in x out, with a bias or not; bias_off 1
 * puts the bias one float off 16 bytes (the GPU rounds it into its
 * aligned scratch, so cuBLASLt's epilogue takes it). */
static void test_matmul_bf16(const char *name, size_t n, size_t in,
			     size_t out, bool with_bias, size_t bias_off)
{
	check_t c;
	double us = 0.0;
	flow_bf16_t *inp = host_rand_bf16(n * in, -1.0f, 1.0f);
	float *w = host_rand(out * in, -1.0f, 1.0f);
	float *b = host_rand(out + bias_off, -1.0f, 1.0f);
	const float *hb = with_bias ? b + bias_off : NULL;
	flow_bf16_t *ref = host_alloc(n * out * sizeof(flow_bf16_t));
	void *scratch = host_alloc(flow_cpu_matmul_bf16_scratch_bound(n, in,
								      out));
	flow_bf16_t *d_inp = dev_bf16(inp, n * in);
	float *d_w = dev_floats(w, out * in);
	float *d_b = with_bias ? dev_floats(b, out + bias_off) + bias_off
			       : NULL;
	flow_bf16_t *d_out = dev_alloc(n * out * sizeof(flow_bf16_t));
	void *d_scratch = dev_alloc(flow_cuda_matmul_bf16_scratch_bound(n, in,
									out));

	check_init(&c, name);
	flow_cpu_matmul_bf16_forward(ref, scratch, inp, w, hb, n, in, out);
	CU(flow_cuda_matmul_bf16_forward(d_out, d_scratch, d_inp, d_w, d_b, n,
					 in, out, &g_diag, g_stream));
	check_bf16(&c, "out", ref, d_out, n * out, 1e-4, 0.01);
	TIME_US(us, flow_cuda_matmul_bf16_forward(d_out, d_scratch, d_inp, d_w,
						  d_b, n, in, out, &g_diag,
						  g_stream));
	report(&c, us);
	free_all();
}

/* matmul_bf16_backward at n x in x out, from non-zero gradients (it
 * accumulates); dinp's tolerance and flips as the header says. */
static void test_matmul_bf16_backward(const char *name, size_t n, size_t in,
				      size_t out, double dinp_atol,
				      double dinp_flips)
{
	check_t c;
	double us = 0.0;
	flow_bf16_t *inp = host_rand_bf16(n * in, -1.0f, 1.0f);
	float *w = host_rand(out * in, -1.0f, 1.0f);
	flow_bf16_t *dout = host_rand_bf16(n * out, -1.0f, 1.0f);
	flow_bf16_t *dinp = host_rand_bf16(n * in, -1.0f, 1.0f);
	float *dw = host_rand(out * in, -1.0f, 1.0f);
	float *db = host_rand(out, -1.0f, 1.0f);
	void *scratch = host_alloc(flow_cpu_matmul_bf16_scratch_bound(n, in,
								      out));
	flow_bf16_t *d_inp = dev_bf16(inp, n * in);
	float *d_w = dev_floats(w, out * in);
	flow_bf16_t *d_dout = dev_bf16(dout, n * out);
	flow_bf16_t *d_dinp = dev_bf16(dinp, n * in);
	float *d_dw = dev_floats(dw, out * in);
	float *d_db = dev_floats(db, out);
	void *d_scratch = dev_alloc(flow_cuda_matmul_bf16_scratch_bound(n, in,
									out));

	check_init(&c, name);
	flow_cpu_matmul_bf16_backward(dinp, dw, db, scratch, dout, inp, w, n,
				      in, out);
	CU(flow_cuda_matmul_bf16_backward(d_dinp, d_dw, d_db, d_scratch, d_dout,
					  d_inp, d_w, n, in, out, &g_diag,
					  g_stream));
	check_bf16(&c, "dinp", dinp, d_dinp, n * in, dinp_atol, dinp_flips);
	check_floats(&c, "dweight", dw, d_dw, out * in, 1e-3, 1e-3);
	check_floats(&c, "dbias", db, d_db, out, 1e-4, 1e-4);
	TIME_US(us, flow_cuda_matmul_bf16_backward(d_dinp, d_dw, d_db,
						   d_scratch, d_dout, d_inp,
						   d_w, n, in, out, &g_diag,
						   g_stream));
	report(&c, us);
	free_all();
}

/* matmul_gelu_bf16_forward at GPT-2's fc shape, n rows, bias_off as in
 * test_matmul_bf16; out within the GELU of pre's rounding (the header). */
static void test_matmul_gelu_bf16(const char *name, size_t n, size_t bias_off)
{
	const size_t in = TC, out = 4 * TC;
	check_t c;
	double us = 0.0;
	flow_bf16_t *inp = host_rand_bf16(n * in, -1.0f, 1.0f);
	float *w = host_rand(out * in, -0.1f, 0.1f);
	float *b = host_rand(out + bias_off, -1.0f, 1.0f);
	flow_bf16_t *pre = host_alloc(n * out * sizeof(flow_bf16_t));
	flow_bf16_t *act = host_alloc(n * out * sizeof(flow_bf16_t));
	void *scratch = host_alloc(flow_cpu_matmul_bf16_scratch_bound(n, in,
								      out));
	flow_bf16_t *d_inp = dev_bf16(inp, n * in);
	float *d_w = dev_floats(w, out * in);
	float *d_b = dev_floats(b, out + bias_off) + bias_off;
	flow_bf16_t *d_pre = dev_alloc(n * out * sizeof(flow_bf16_t));
	flow_bf16_t *d_act = dev_alloc(n * out * sizeof(flow_bf16_t));
	void *d_scratch = dev_alloc(flow_cuda_matmul_bf16_scratch_bound(n, in,
									out));

	check_init(&c, name);
	flow_cpu_matmul_gelu_bf16_forward(pre, act, scratch, inp, w,
					  b + bias_off, n, in, out);
	CU(flow_cuda_matmul_gelu_bf16_forward(d_pre, d_act, d_scratch, d_inp,
					      d_w, d_b, n, in, out, &g_diag,
					      g_stream));
	check_bf16(&c, "pre", pre, d_pre, n * out, 1e-4, 0.01);
	check_bf16_slack(&c, "out", act, d_act, n * out, 2e-4, 1.0, 1.0, pre,
			 1.13 * 0x1p-8);
	TIME_US(us, flow_cuda_matmul_gelu_bf16_forward(d_pre, d_act, d_scratch,
						       d_inp, d_w, d_b, n, in,
						       out, &g_diag, g_stream));
	report(&c, us);
	free_all();
}

static void test_layernorm_bf16(void)
{
	const size_t n = TN, C = TC;
	check_t c;
	double us = 0.0;
	/* An offset mean, as a residual stream has. */
	float *inp = host_rand(n * C, 2.0f, 4.0f);
	float *w = host_rand(C, 0.5f, 1.5f);
	float *b = host_rand(C, -1.0f, 1.0f);
	flow_bf16_t *out = host_alloc(n * C * sizeof(flow_bf16_t));
	float *mean = host_alloc(n * sizeof(float));
	float *rstd = host_alloc(n * sizeof(float));
	flow_bf16_t *dout = host_rand_bf16(n * C, -1.0f, 1.0f);
	float *dinp = host_rand(n * C, -1.0f, 1.0f);
	float *dw = host_rand(C, -1.0f, 1.0f);
	float *db = host_rand(C, -1.0f, 1.0f);
	float *d_inp = dev_floats(inp, n * C);
	float *d_w = dev_floats(w, C);
	float *d_b = dev_floats(b, C);
	flow_bf16_t *d_out = dev_alloc(n * C * sizeof(flow_bf16_t));
	float *d_mean = dev_alloc(n * sizeof(float));
	float *d_rstd = dev_alloc(n * sizeof(float));
	flow_bf16_t *d_dout = dev_bf16(dout, n * C);
	float *d_dinp = dev_floats(dinp, n * C);
	float *d_dw = dev_floats(dw, C);
	float *d_db = dev_floats(db, C);
	float *d_mean_cpu = NULL, *d_rstd_cpu = NULL;

	check_init(&c, "layernorm_bf16_forward");
	flow_cpu_layernorm_bf16_forward(out, mean, rstd, inp, w, b, n, C);
	CU(flow_cuda_layernorm_bf16_forward(d_out, d_mean, d_rstd, d_inp, d_w,
					    d_b, n, C, &g_diag, g_stream));
	check_bf16(&c, "out", out, d_out, n * C, 1e-5, 0.01);
	check_floats(&c, "mean", mean, d_mean, n, 1e-5, 1e-5);
	check_floats(&c, "rstd", rstd, d_rstd, n, 1e-5, 1e-5);
	TIME_US(us, flow_cuda_layernorm_bf16_forward(d_out, d_mean, d_rstd,
						     d_inp, d_w, d_b, n, C,
						     &g_diag, g_stream));
	report(&c, us);

	/* Fused with the residual add: res = a + b exact on both sides. */
	check_init(&c, "residual_layernorm_bf16_forward");
	{
		float *a = host_rand(n * C, 1.0f, 3.0f);
		flow_bf16_t *bb = host_rand_bf16(n * C, 0.0f, 2.0f);
		float *res = host_alloc(n * C * sizeof(float));
		float *d_a = dev_floats(a, n * C);
		flow_bf16_t *d_bb = dev_bf16(bb, n * C);
		float *d_res = dev_alloc(n * C * sizeof(float));
		flow_cpu_residual_layernorm_bf16_forward(res, out, mean, rstd,
							 a, bb, w, b, n, C);
		CU(flow_cuda_residual_layernorm_bf16_forward(
			d_res, d_out, d_mean, d_rstd, d_a, d_bb, d_w, d_b, n, C,
			&g_diag, g_stream));
		check_floats(&c, "res", res, d_res, n * C, 0.0, 0.0);
		check_bf16(&c, "out", out, d_out, n * C, 1e-5, 0.01);
		check_floats(&c, "mean", mean, d_mean, n, 1e-5, 1e-5);
		check_floats(&c, "rstd", rstd, d_rstd, n, 1e-5, 1e-5);
		TIME_US(us, flow_cuda_residual_layernorm_bf16_forward(
				    d_res, d_out, d_mean, d_rstd, d_a, d_bb,
				    d_w, d_b, n, C, &g_diag, g_stream));
		/* The statistics of the layernorm's own input, for backward. */
		flow_cpu_layernorm_bf16_forward(out, mean, rstd, inp, w, b, n,
						C);
	}
	report(&c, us);

	/* Backward from the CPU's saved statistics on both sides. */
	check_init(&c, "layernorm_bf16_backward");
	d_mean_cpu = dev_floats(mean, n);
	d_rstd_cpu = dev_floats(rstd, n);
	flow_cpu_layernorm_bf16_backward(dinp, dw, db, dout, inp, w, mean, rstd,
					 n, C);
	CU(flow_cuda_layernorm_bf16_backward(d_dinp, d_dw, d_db, d_dout, d_inp,
					     d_w, d_mean_cpu, d_rstd_cpu, n, C,
					     &g_diag, g_stream));
	check_floats(&c, "dinp", dinp, d_dinp, n * C, 1e-5, 1e-5);
	check_floats(&c, "dweight", dw, d_dw, C, 1e-5, 1e-5);
	check_floats(&c, "dbias", db, d_db, C, 1e-5, 1e-5);
	TIME_US(us, flow_cuda_layernorm_bf16_backward(
			    d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean_cpu,
			    d_rstd_cpu, n, C, &g_diag, g_stream));
	report(&c, us);

	/* Fused with the residual add's backward: db = bf16(db + dres). */
	check_init(&c, "layernorm_residual_bf16_backward");
	{
		float *dres = host_rand(n * C, -1.0f, 1.0f);
		float *da = host_rand(n * C, -1.0f, 1.0f);
		flow_bf16_t *dbb = host_rand_bf16(n * C, -1.0f, 1.0f);
		float *d_dres = dev_floats(dres, n * C);
		float *d_da = dev_floats(da, n * C);
		flow_bf16_t *d_dbb = dev_bf16(dbb, n * C);
		float *d_dw2 = dev_floats(dw, C), *d_db2 = dev_floats(db, C);
		float *dw2 = host_copy(dw, C), *db2 = host_copy(db, C);
		flow_cpu_layernorm_residual_bf16_backward(dres, da, dbb, dw2,
							  db2, dout, inp, w,
							  mean, rstd, n, C);
		CU(flow_cuda_layernorm_residual_bf16_backward(
			d_dres, d_da, d_dbb, d_dw2, d_db2, d_dout, d_inp, d_w,
			d_mean_cpu, d_rstd_cpu, n, C, &g_diag, g_stream));
		check_floats(&c, "dres", dres, d_dres, n * C, 1e-5, 1e-5);
		check_floats(&c, "da", da, d_da, n * C, 1e-5, 1e-5);
		check_bf16(&c, "db", dbb, d_dbb, n * C, 1e-5, 0.01);
		check_floats(&c, "dweight", dw2, d_dw2, C, 1e-5, 1e-5);
		check_floats(&c, "dbias", db2, d_db2, C, 1e-5, 1e-5);
		TIME_US(us, flow_cuda_layernorm_residual_bf16_backward(
				    d_dres, d_da, d_dbb, d_dw2, d_db2, d_dout,
				    d_inp, d_w, d_mean_cpu, d_rstd_cpu, n, C,
				    &g_diag, g_stream));
	}
	report(&c, us);
	free_all();
}

static void test_gelu_bf16(void)
{
	const size_t n = (size_t)TN * 4 * TC;
	check_t c;
	double us = 0.0;
	flow_bf16_t *inp = host_rand_bf16(n, -4.0f, 4.0f);
	flow_bf16_t *out = host_alloc(n * sizeof(flow_bf16_t));
	flow_bf16_t *dout = host_rand_bf16(n, -1.0f, 1.0f);
	flow_bf16_t *dinp = host_rand_bf16(n, -1.0f, 1.0f);
	flow_bf16_t *d_inp = dev_bf16(inp, n);
	flow_bf16_t *d_out = dev_alloc(n * sizeof(flow_bf16_t));
	flow_bf16_t *d_dout = dev_bf16(dout, n);
	flow_bf16_t *d_dinp = dev_bf16(dinp, n);

	check_init(&c, "gelu_bf16_forward");
	flow_cpu_gelu_bf16_forward(out, inp, n);
	CU(flow_cuda_gelu_bf16_forward(d_out, d_inp, n, &g_diag, g_stream));
	check_bf16(&c, "out", out, d_out, n, 1e-6, 0.01);
	TIME_US(us, flow_cuda_gelu_bf16_forward(d_out, d_inp, n, &g_diag,
						g_stream));
	report(&c, us);

	check_init(&c, "gelu_bf16_backward");
	flow_cpu_gelu_bf16_backward(dinp, inp, dout, n);
	CU(flow_cuda_gelu_bf16_backward(d_dinp, d_inp, d_dout, n, &g_diag,
					g_stream));
	check_bf16(&c, "dinp", dinp, d_dinp, n, 3e-6, 0.01);
	TIME_US(us, flow_cuda_gelu_bf16_backward(d_dinp, d_inp, d_dout, n,
						 &g_diag, g_stream));
	report(&c, us);
	free_all();
}

static void test_residual_bf16(void)
{
	const size_t n = (size_t)TN * TC;
	check_t c;
	double us = 0.0;
	float *a = host_rand(n, -1.0f, 1.0f);
	flow_bf16_t *b = host_rand_bf16(n, -1.0f, 1.0f);
	float *out = host_alloc(n * sizeof(float));
	float *dout = host_rand(n, -1.0f, 1.0f);
	float *da = host_rand(n, -1.0f, 1.0f);
	flow_bf16_t *db = host_rand_bf16(n, -1.0f, 1.0f);
	float *d_a = dev_floats(a, n);
	flow_bf16_t *d_b = dev_bf16(b, n);
	float *d_out = dev_alloc(n * sizeof(float));
	float *d_dout = dev_floats(dout, n);
	float *d_da = dev_floats(da, n);
	flow_bf16_t *d_db = dev_bf16(db, n);

	check_init(&c, "residual_bf16_forward");
	flow_cpu_residual_bf16_forward(out, a, b, n);
	CU(flow_cuda_residual_bf16_forward(d_out, d_a, d_b, n, &g_diag,
					   g_stream));
	check_floats(&c, "out", out, d_out, n, 0.0, 0.0);
	TIME_US(us, flow_cuda_residual_bf16_forward(d_out, d_a, d_b, n,
						    &g_diag, g_stream));
	report(&c, us);

	check_init(&c, "residual_bf16_backward");
	flow_cpu_residual_bf16_backward(da, db, dout, n);
	CU(flow_cuda_residual_bf16_backward(d_da, d_db, d_dout, n, &g_diag,
					    g_stream));
	check_floats(&c, "da", da, d_da, n, 0.0, 0.0);
	check_bf16(&c, "db", db, d_db, n, 0.0, 0.0);
	TIME_US(us, flow_cuda_residual_bf16_backward(d_da, d_db, d_dout, n,
						     &g_diag, g_stream));
	report(&c, us);
	free_all();
}

/* The checked (untimed) GPT-shaped bf16 passes that ran through cuDNN. */
static uint64_t g_attention_cudnn;

static uint64_t cudnn_passes(void)
{
	uint64_t cudnn = 0, own = 0;
	const char *why = "";

	flow_cuda_attention_counts(&cudnn, &own, &why);
	return cudnn;
}

/* The bf16 twins against the CPU's: at GPT-2's head size, through cuDNN
 * where it is there; with own, at a head size cuDNN declines (12, no
 * multiple of 8), the own kernel.  Tolerances as the header says, by the
 * way each pass ran. */
static void test_attention_bf16(bool own)
{
	const size_t B = TB, T = TT, C = own ? 96 : TC, NH = own ? 8 : TNH;
	const size_t nqkv = B * T * 3 * C, nout = B * T * C;
	const size_t nlse = B * NH * T;
	check_t c;
	double us = 0.0;
	flow_bf16_t *qkv = host_rand_bf16(nqkv, -1.0f, 1.0f);
	flow_bf16_t *out = host_alloc(nout * sizeof(flow_bf16_t));
	float *lse = host_alloc(nlse * sizeof(float));
	flow_bf16_t *dout = host_rand_bf16(nout, -1.0f, 1.0f);
	flow_bf16_t *dqkv = host_rand_bf16(nqkv, -1.0f, 1.0f);
	void *scratch = host_alloc(
		flow_cpu_attention_scratch_bound(B, T, C, NH, true));
	flow_bf16_t *d_qkv = dev_bf16(qkv, nqkv);
	flow_bf16_t *d_out = dev_alloc(nout * sizeof(flow_bf16_t));
	float *d_lse = dev_alloc(nlse * sizeof(float));
	flow_bf16_t *d_dout = dev_bf16(dout, nout);
	flow_bf16_t *d_dqkv = dev_bf16(dqkv, nqkv);
	void *d_scratch = dev_alloc(
		flow_cuda_attention_scratch_bound(B, T, C, NH, true));
	float *d_lse_cpu = NULL;
	flow_bf16_t *d_out_cpu = NULL;
	uint64_t before = 0, ran_cudnn = 0;

	check_init(&c, own ? "attention_bf16_own_forward"
			   : "attention_bf16_forward");
	flow_cpu_attention_bf16_forward(out, lse, scratch, qkv, B, T, C, NH);
	before = cudnn_passes();
	CU(flow_cuda_attention_bf16_forward(d_out, d_lse, d_scratch, d_qkv, B,
					    T, C, NH, &g_diag, g_stream));
	ran_cudnn = cudnn_passes() - before;
	if (!own)
		g_attention_cudnn += ran_cudnn;
	check_floats(&c, "lse", lse, d_lse, nlse, 1e-5, 1e-5);
	check_bf16_slack(&c, "out", out, d_out, nout, ran_cudnn ? 5e-3 : 1e-3,
			 ran_cudnn ? 2 : 1,
			 ran_cudnn ? 1.0 : 0.02, NULL, 0.0);
	TIME_US(us, flow_cuda_attention_bf16_forward(d_out, d_lse, d_scratch,
						     d_qkv, B, T, C, NH,
						     &g_diag, g_stream));
	report(&c, us);

	/* Backward from the CPU's lse and out on both sides. */
	check_init(&c, own ? "attention_bf16_own_backward"
			   : "attention_bf16_backward");
	d_lse_cpu = dev_floats(lse, nlse);
	d_out_cpu = dev_bf16(out, nout);
	flow_cpu_attention_bf16_backward(dqkv, scratch, dout, qkv, lse, out, B,
					 T, C, NH);
	before = cudnn_passes();
	CU(flow_cuda_attention_bf16_backward(d_dqkv, d_scratch, d_dout, d_qkv,
					     d_lse_cpu, d_out_cpu, B, T, C, NH,
					     &g_diag, g_stream));
	ran_cudnn = cudnn_passes() - before;
	if (!own)
		g_attention_cudnn += ran_cudnn;
	check_bf16_slack(&c, "dqkv", dqkv, d_dqkv, nqkv,
			 ran_cudnn ? 8e-3 : 1e-3, ran_cudnn ? 2 : 1,
			 ran_cudnn ? 1.0 : 0.02, NULL, 0.0);
	TIME_US(us, flow_cuda_attention_bf16_backward(
			    d_dqkv, d_scratch, d_dout, d_qkv, d_lse_cpu,
			    d_out_cpu, B, T, C, NH, &g_diag, g_stream));
	report(&c, us);
	free_all();
}

static void test_cross_entropy_bf16(void)
{
	const size_t n = TN / 4, V = 50257, Vp = 50304;
	const float dloss = 1.0f / (float)(TN / 4);
	check_t c;
	double us = 0.0;
	flow_bf16_t *logits = host_rand_bf16(n * Vp, -4.0f, 4.0f);
	flow_bf16_t *d_logits = dev_bf16(logits, n * Vp); /* before the CPU's
							   * in-place update */
	int32_t *tgt = host_tokens(n, (int32_t)V, 4);
	float *losses = host_alloc(n * sizeof(float));
	int32_t *d_tgt = dev_from(tgt, n * sizeof(int32_t));
	float *d_losses = dev_alloc(n * sizeof(float));

	check_init(&c, "cross_entropy_bf16_forward_backward");
	flow_cpu_cross_entropy_bf16_forward_backward(losses, logits, tgt, n, V,
						     Vp, dloss);
	CU(flow_cuda_cross_entropy_bf16_forward_backward(
		d_losses, d_logits, d_tgt, n, V, Vp, dloss, &g_diag, g_stream));
	check_floats(&c, "losses", losses, d_losses, n, 1e-5, 1e-5);
	check_bf16(&c, "dlogits", logits, d_logits, n * Vp, 1e-9, 0.01);
	TIME_US(us, flow_cuda_cross_entropy_bf16_forward_backward(
			    d_losses, d_logits, d_tgt, n, V, Vp, dloss,
			    &g_diag, g_stream));
	report(&c, us);
	free_all();
}

/* The split steps on bf16 logits, as test_cross_entropy_split. */
static void test_cross_entropy_split_bf16(void)
{
	const size_t n = TN / 4, V = 50257, Vp = 50304, p = 4;
	const flow_logits_shard_t s = { .n = n, .cols = Vp / p,
					.valid = V - 3 * (Vp / p),
					.c0 = (int64_t)(3 * (Vp / p)),
					.first = true };
	const float dloss = 1.0f / (float)n;
	check_t c;
	double us = 0.0;
	flow_bf16_t *logits = host_rand_bf16(n * s.cols, -4.0f, 4.0f);
	flow_bf16_t *d_logits = dev_bf16(logits, n * s.cols);
	float *gathered = host_rand(p * n, 3.5f, 4.5f);
	float *max = host_alloc(n * sizeof(float));
	float *sums = host_alloc(n * sizeof(float));
	float *losses = host_alloc(n * sizeof(float));
	int32_t *tgt = host_tokens(n, (int32_t)V, 4);
	int32_t *d_tgt = dev_from(tgt, n * sizeof(int32_t));
	float *d_max = dev_alloc(n * sizeof(float));
	float *d_sums = dev_alloc(n * sizeof(float));
	float *d_losses = dev_alloc(n * sizeof(float));

	check_init(&c, "cross_entropy_bf16_split_max");
	flow_cpu_cross_entropy_bf16_split_max(max, logits, &s);
	CU(flow_cuda_cross_entropy_bf16_split_max(d_max, d_logits, &s, &g_diag,
						  g_stream));
	check_floats(&c, "max", max, d_max, n, 0.0, 0.0);
	report(&c, us);

	check_init(&c, "cross_entropy_bf16_split_sums");
	memcpy(gathered + 3 * n, max, n * sizeof(float)); /* this member's */
	float *d_gathered = dev_floats(gathered, p * n);
	flow_cpu_cross_entropy_bf16_split_sums(sums, max, gathered, p, logits,
					       &s);
	CU(flow_cuda_cross_entropy_bf16_split_sums(d_sums, d_max, d_gathered, p,
						   d_logits, &s, &g_diag,
						   g_stream));
	check_floats(&c, "max", max, d_max, n, 0.0, 0.0);
	check_floats(&c, "sums", sums, d_sums, n, 1e-6, 1e-6);
	TIME_US(us, flow_cuda_cross_entropy_bf16_split_sums(
			    d_sums, d_max, d_gathered, p, d_logits, &s, &g_diag,
			    g_stream));
	report(&c, us);

	check_init(&c, "cross_entropy_bf16_split_finish");
	float *d_max_cpu = dev_floats(max, n);
	float *d_sums_cpu = dev_floats(sums, n);
	flow_cpu_cross_entropy_bf16_split_finish(losses, logits, tgt, max, sums,
						 &s, dloss);
	CU(flow_cuda_cross_entropy_bf16_split_finish(d_losses, d_logits, d_tgt,
						     d_max_cpu, d_sums_cpu, &s,
						     dloss, &g_diag, g_stream));
	check_floats(&c, "losses", losses, d_losses, n, 1e-6, 1e-6);
	check_bf16(&c, "dlogits", logits, d_logits, n * s.cols, 1e-9, 0.01);
	report(&c, us);
	free_all();
}

/* flow_cuda_matmul_forward against a bare cublasSgemm (no bias) on a GPT-2
 * MLP shape: GFLOP/s = 2 n in out / time. */
static void bench_matmul(void)
{
	const size_t n = 8192, in = 768, out = 3072;
	const double flop = 2.0 * (double)n * (double)in * (double)out;
	const float one = 1.0f, zero = 0.0f;
	double us_flow = 0.0, us_blas = 0.0;
	float ms = 0.0f;
	cublasHandle_t h = NULL;
	cublasStatus_t s;
	float *inp = host_rand(n * in, -1.0f, 1.0f);
	float *w = host_rand(out * in, -1.0f, 1.0f);
	float *b = host_rand(out, -1.0f, 1.0f);
	float *d_inp = dev_floats(inp, n * in);
	float *d_w = dev_floats(w, out * in);
	float *d_b = dev_floats(b, out);
	float *d_out = dev_alloc(n * out * sizeof(float));

	s = cublasCreate(&h);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasSetStream(h, g_stream);
	if (s != CUBLAS_STATUS_SUCCESS) {
		fprintf(stderr, PROG ": cublas setup failed: %s\n",
			cublasGetStatusString(s));
		exit(1);
	}
	/* Warm-up of both paths. */
	CU(flow_cuda_matmul_forward(d_out, d_inp, d_w, d_b, n, in, out,
				    &g_diag, g_stream));
	s = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)n, (int)in,
			&one, d_w, (int)in, d_inp, (int)in, &zero, d_out,
			(int)out);
	TIME_US(us_flow, flow_cuda_matmul_forward(d_out, d_inp, d_w, d_b, n,
						  in, out, &g_diag, g_stream));
	RT(cudaEventRecord(g_ev0, g_stream));
	for (int it = 0; it < TIME_ITERS && s == CUBLAS_STATUS_SUCCESS; it++)
		s = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)n,
				(int)in, &one, d_w, (int)in, d_inp, (int)in,
				&zero, d_out, (int)out);
	RT(cudaEventRecord(g_ev1, g_stream));
	RT(cudaEventSynchronize(g_ev1));
	RT(cudaEventElapsedTime(&ms, g_ev0, g_ev1));
	if (s != CUBLAS_STATUS_SUCCESS) {
		fprintf(stderr, PROG ": cublasSgemm failed: %s\n",
			cublasGetStatusString(s));
		exit(1);
	}
	us_blas = 1000.0 * (double)ms / TIME_ITERS;
	printf("# matmul_forward n=%zu in=%zu out=%zu: flow %.1f GFLOP/s "
	       "(%.1f us, with bias), cublasSgemm %.1f GFLOP/s (%.1f us), "
	       "ratio %.3f\n",
	       n, in, out, flop / (us_flow * 1e3), us_flow,
	       flop / (us_blas * 1e3), us_blas, us_blas / us_flow);
	cublasDestroy(h);
	free_all();
}

/* Which way the bf16 attention passes ran.  Where cuDNN can be opened
 * the GPT-shaped passes (test_attention_bf16(false)) must have run
 * through it: the fused attention, not a silent fallback; without
 * cuDNN the own kernel is the documented path, said in the note. */
static void report_attention_paths(void)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	uint64_t cudnn = 0, own = 0;
	const char *why = "";
	/* NOTSUP: no cuDNN to open; any other answer means it is there. */
	const bool present = flow_cuda_attention_cudnn_check(TB, TT, TC, TNH,
							     NULL, &diag) !=
			     FLOW_ERR_NOTSUP;

	flow_cuda_attention_counts(&cudnn, &own, &why);
	printf("# attention in bf16 (timed calls too): %llu passes through "
	       "cuDNN's fused attention, %llu through the own kernel%s%s\n",
	       (unsigned long long)cudnn, (unsigned long long)own,
	       why[0] ? "; cuDNN declined: " : "", why);
	if (!present) {
		printf("# cuDNN absent, not counted: %s\n",
		       flow_diag_message(&diag));
		fflush(stdout);
		return;
	}
	/* A row: the two checked GPT-shaped passes through cuDNN (the
	 * odd-headed ones never are); wrong counts those that were not. */
	g_kernels++;
	if (g_attention_cudnn != 2)
		g_failed_kernels++;
	printf("attention_cudnn\t%s\t0\t0\t%llu\t0\n",
	       g_attention_cudnn == 2 ? "yes" : "no",
	       (unsigned long long)(2 - (g_attention_cudnn < 2
						 ? g_attention_cudnn
						 : 2)));
	fflush(stdout);
}

/* How the forward GEMMs with a bias or a GELU ran since the last call:
 * the fp32 unaligned biases and the bf16 rows run with the epilogue off
 * take two passes by design; the rest should fuse on a GPU cuBLASLt
 * serves (in bf16 the bias is rounded to the output's type, which
 * cublasLt.h documents for the epilogue). */
static void report_epilogues(const char *what)
{
	static uint64_t fused0, two_pass0;
	uint64_t fused = 0, two_pass = 0;

	flow_cuda_matmul_epilogue_counts(&fused, &two_pass);
	printf("# cuBLASLt epilogue, %s: %llu forward GEMMs with a bias or "
	       "GELU fused, %llu in two passes\n",
	       what, (unsigned long long)(fused - fused0),
	       (unsigned long long)(two_pass - two_pass0));
	fflush(stdout);
	fused0 = fused;
	two_pass0 = two_pass;
}

int main(void)
{
	int ndev = 0;
	flow_cuda_device_info_t info;
	flow_err_t err = flow_cuda_device_count(&ndev, &g_diag);

	if (err == FLOW_ERR_NOTSUP || (err == FLOW_OK && ndev == 0)) {
		fprintf(stderr, PROG ": skipped: %s\n",
			err == FLOW_OK ? "no CUDA device found"
				       : flow_diag_message(&g_diag));
		return 77;
	}
	if (err != FLOW_OK)
		die("flow_cuda_device_count");
	CU(flow_cuda_set_device(0, &g_diag));
	CU(flow_cuda_device_info(0, &info, &g_diag));
	RT(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
	RT(cudaEventCreate(&g_ev0));
	RT(cudaEventCreate(&g_ev1));

	printf("# device 0: %s, compute capability %d.%d, %d SMs, %.1f GiB, "
	       "CUDA runtime %d, driver %d\n",
	       info.name, info.cc_major, info.cc_minor, info.sm_count,
	       (double)info.global_mem / (1024.0 * 1024.0 * 1024.0),
	       info.runtime_version, info.driver_version);
	printf("# shapes: B=%d T=%d C=%d NH=%d; pass: |gpu-cpu| <= atol + "
	       "rtol*|cpu| for every element; time_us: mean of %d calls\n",
	       TB, TT, TC, TNH, TIME_ITERS);
	printf("kernel\tpass\tmax_abs_err\tmax_rel_err\twrong\ttime_us\n");
	fflush(stdout);

	test_matmul(true);
	test_matmul(false);
	test_matmul_unaligned();
	test_matmul_backward();
	test_matmul_gelu();
	report_epilogues("fp32");
	test_matmul_bf16("matmul_bf16_forward", TN, TC, 4 * TC, true, 0);
	test_matmul_bf16("matmul_bf16_forward_logits", LOGITS_N, TC,
			 LOGITS_OUT, false, 0);
	test_matmul_bf16("matmul_bf16_forward_unaligned", 1024, TC, LOGITS_OUT,
			 true, 1);
	test_matmul_gelu_bf16("matmul_gelu_bf16_forward", TN, 0);
	/* The separate passes a GPU takes where cuBLASLt has no algorithm:
	 * fp32 sums in panels of scratch (four at the logits' shape), then
	 * one pass adding the bias, taking the GELU and rounding. */
	flow_cuda_matmul_use_epilogue(false);
	test_matmul_bf16("matmul_bf16_forward_two_pass", 1024, TC, LOGITS_OUT,
			 true, 0);
	test_matmul_bf16_backward("matmul_bf16_backward", TN, TC, 4 * TC, 1e-3,
				  0.02);
	test_matmul_bf16_backward("matmul_bf16_backward_logits", LOGITS_N, TC,
				  LOGITS_OUT, 6e-2, 0.15);
	test_matmul_gelu_bf16("matmul_gelu_bf16_forward_two_pass", 4096, 0);
	flow_cuda_matmul_use_epilogue(true);
	test_matmul_gelu_bf16("matmul_gelu_bf16_forward_unaligned", 4096, 1);
	report_epilogues("bf16");
	test_embedding(0, TVOCAB);
	test_embedding(300, 400);
	test_layernorm();
	test_layernorm_bf16();
	test_gelu();
	test_gelu_bf16();
	test_attention();
	test_attention_bf16(true);
	test_residual();
	test_residual_bf16();
	test_cross_entropy();
	test_cross_entropy_bf16();
	test_cross_entropy_split();
	test_cross_entropy_split_bf16();
	test_box_move();
	test_adamw(true, 1);
	test_adamw(false, 10);
	test_adamw_all();
	test_grad_norm();
	bench_matmul();
	/* Last: cuDNN's plans are the newest code, and a failure ends the
	 * program; every other kernel has reported by then. */
	test_attention_bf16(false);
	report_attention_paths();

	RT(cudaEventDestroy(g_ev0));
	RT(cudaEventDestroy(g_ev1));
	RT(cudaStreamDestroy(g_stream));
	flow_cuda_release_thread();

	if (g_failed_kernels > 0) {
		printf("# FAIL: %d of %d kernels wrong\n", g_failed_kernels,
		       g_kernels);
		return 1;
	}
	printf("# PASS: %d kernels\n", g_kernels);
	return 0;
}
