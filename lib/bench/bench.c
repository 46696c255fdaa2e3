/* Kernel benchmarks (flow/bench.h): inputs from Philox, a check against the
 * reference kernels, timing with CLOCK_MONOTONIC, and the records flow-bench
 * prints.  Every FLOP and byte count here is the formula documented in
 * man/flow-bench.1; change both together. */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <flow/bench.h>
#include <flow/blas.h>
#include <flow/device.h>
#include <flow/json.h>
#include <flow/kernels.h>
#include <flow/kernels_ref.h>
#include <flow/log.h>
#include <flow/mem.h>
#include <flow/parse.h>
#include <flow/rng.h>
#include <flow/version.h>

#include "bench_internal.h"
#include "device/cuda_module_internal.h"

/* Rows of a large GEMM result the reference recomputes: the naive reference
 * runs at about 1e9 multiply-adds per second, so a full check of a
 * 256 x 768 x 50304 matmul would take longer than the benchmark. */
#define BENCH_CHECK_ROWS 8
/* Rows of dweight (cheap: N*IN multiply-adds each). */
#define BENCH_CHECK_WROWS 64

/* ---- statistics and checking ----------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

void flow_bench_median_min(double *samples, size_t n, double *median_out,
			   double *min_out)
{
	if (n == 0) {
		*median_out = NAN;
		*min_out = NAN;
		return;
	}
	qsort(samples, n, sizeof(*samples), cmp_double);
	*min_out = samples[0];
	*median_out = n % 2 ? samples[n / 2]
			    : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

uint64_t flow_bench_count_wrong(const float *got, const float *ref, size_t n,
				double rtol, double atol)
{
	uint64_t wrong = 0;
	for (size_t i = 0; i < n; i++) {
		double g = got[i], r = ref[i];
		if (g == r)
			continue; /* also equal infinities */
		/* NaN in either fails this test too. */
		if (!(fabs(g - r) <= atol + rtol * fabs(r)))
			wrong++;
	}
	return wrong;
}

/* ---- buffers ------------------------------------------------------------------ */

static void bench_bufs_release(bench_bufs_t *bufs)
{
	for (size_t i = 0; i < bufs->count; i++)
		flow_free(bufs->ptr[i]);
	bufs->count = 0;
}

/* A zeroed buffer of count elements of size bytes, owned by bufs. */
static void *bench_alloc(bench_bufs_t *bufs, size_t count, size_t size,
			 const char *what, flow_diag_t *diag)
{
	size_t bytes;
	void *p = NULL;

	if (bufs->count == BENCH_MAX_BUFS) {
		flow_diag_set(diag, FLOW_ERR_NOMEM,
			      "cannot allocate '%s': too many buffers", what);
		return NULL;
	}
	if (flow_mul_size(count, size, &bytes))
		p = flow_calloc(count, size);
	if (!p) {
		flow_diag_errno(diag, FLOW_ERR_NOMEM, ENOMEM,
				"cannot allocate '%s' (%zu x %zu bytes)", what,
				count, size);
		return NULL;
	}
	bufs->ptr[bufs->count++] = p;
	return p;
}

/* In a bench function: var = a zeroed buffer of count elements of size
 * bytes, owned by c->bufs; on failure the function returns (c->diag says
 * why) and flow_bench_kernel_run() frees what it had allocated. */
#define ALLOC(var, count, size, what)                                      \
	do {                                                               \
		if (!((var) = bench_alloc(&c->bufs, (count), (size), (what), \
					  c->diag)))                       \
			return FLOW_ERR_NOMEM;                             \
	} while (0)

#define ALLOC_F(var, count, what) ALLOC(var, count, sizeof(float), what)

/* Inputs: stream ids are fixed per role so a buffer's values depend only on
 * the seed, the role and the element index, never on the shape order. */
enum {
	STREAM_A = 1,
	STREAM_B,
	STREAM_C,
	STREAM_D,
	STREAM_E,
	STREAM_F,
	STREAM_TOKENS,
};

static void fill_normal(float *x, size_t n, const flow_bench_config_t *cfg,
			uint64_t stream, float mean, float std)
{
	flow_rng_fill_normal(x, n, cfg->seed, stream, 0, mean, std);
}

static void fill_uniform(float *x, size_t n, const flow_bench_config_t *cfg,
			 uint64_t stream, float lo, float hi)
{
	flow_rng_fill_uniform(x, n, cfg->seed, stream, 0, lo, hi);
}

/* Integers uniform in [0, range). */
static void fill_tokens(int32_t *x, size_t n, const flow_bench_config_t *cfg,
			uint64_t stream, uint64_t range)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t w[4];
		flow_rng_block(cfg->seed, stream, i, w);
		x[i] = (int32_t)((((uint64_t)w[1] << 32) | w[0]) % range);
	}
}

/* The k-th of R row indices spread evenly over [0, n), first and last
 * included; all rows when R == n. */
static size_t sample_row(size_t k, size_t R, size_t n)
{
	return R <= 1 ? 0 : k * (n - 1) / (R - 1);
}

/* R sampled rows of width elements of esize bytes. */
static void gather_elems(void *dst, const void *src, size_t R, size_t n,
			 size_t width, size_t esize)
{
	for (size_t k = 0; k < R; k++)
		memcpy((char *)dst + k * width * esize,
		       (const char *)src + sample_row(k, R, n) * width * esize,
		       width * esize);
}

static void gather_rows(float *dst, const float *src, size_t R, size_t n,
			size_t width)
{
	gather_elems(dst, src, R, n, width, sizeof(float));
}

/* ---- activations of the bf16 benchmarks ------------------------------------ */
/* The *_bf16 benchmarks run the kernels' bf16 twins (flow/kernels.h), whose
 * activations are bf16: filled as the fp32 benchmark's and rounded, and
 * widened to floats where they are checked. */

/* n elements of float x, or of x rounded into bf16 buf. */
static const void *act_from(float *x, flow_bf16_t *buf, size_t n, bool bf16)
{
	if (!bf16)
		return x;
	for (size_t i = 0; i < n; i++)
		buf[i] = flow_f32_to_bf16(x[i]);
	return buf;
}

/* n activations at x as floats in out. */
static void act_widen(float *out, const void *x, size_t n, bool bf16)
{
	for (size_t i = 0; i < n; i++)
		out[i] = bf16 ? flow_bf16_to_f32(((const flow_bf16_t *)x)[i]) :
				((const float *)x)[i];
}

/* R sampled rows of width activations as floats, in out. */
static void gather_act(float *out, const void *x, size_t R, size_t n,
		       size_t width, bool bf16)
{
	size_t esize = bf16 ? sizeof(flow_bf16_t) : sizeof(float);

	for (size_t k = 0; k < R; k++)
		act_widen(out + k * width,
			  (const char *)x + sample_row(k, R, n) * width * esize,
			  width, bf16);
}

/* ---- records -------------------------------------------------------------------- */

/* Everything one kernel's bench function gets.  The buffers it allocates
 * (ALLOC) belong to bufs, which flow_bench_kernel_run() releases after the
 * run whatever it returned: a bench function has no cleanup of its own. */
typedef struct bench_ctx {
	flow_bench_kernel_t k;
	const flow_bench_shape_t *shape;
	const flow_bench_config_t *cfg;
	double rtol, atol;
	double *samples; /* cfg->iters */
	double *peer_samples; /* cfg->iters: the peer timed alongside */
	flow_bench_record_t *rec;
	size_t nrec;
	bench_bufs_t bufs;
	flow_diag_t *diag;
} bench_ctx_t;

/* The run's next record, for pass, with all but the measured columns set. */
static flow_bench_record_t *record_new(bench_ctx_t *c, const char *pass)
{
	flow_bench_record_t *rec = &c->rec[c->nrec++];

	memset(rec, 0, sizeof(*rec));
	snprintf(rec->kernel, sizeof(rec->kernel), "%s",
		 flow_bench_kernel_name(c->k));
	snprintf(rec->pass, sizeof(rec->pass), "%s", pass);
	flow_bench_shape_format(c->shape, rec->shape, sizeof(rec->shape));
	rec->iters = c->cfg->iters;
	rec->rtol = c->rtol;
	rec->atol = c->atol;
	rec->frac_peak = NAN;
	rec->blas_gflops = NAN;
	rec->blas_ratio = NAN;
	return rec;
}

/* Fill the timing columns from c->samples (sorted in place). */
static void record_time(bench_ctx_t *c, flow_bench_record_t *rec,
			double flops, double bytes)
{
	flow_bench_median_min(c->samples, c->cfg->iters, &rec->time_us,
			      &rec->min_us);
	rec->flops = flops;
	rec->bytes = bytes;
	rec->gflops = flops / rec->time_us / 1e3;
	rec->gbps = bytes / rec->time_us / 1e3;
	if (c->cfg->peak_gflops > 0)
		rec->frac_peak = rec->gflops / c->cfg->peak_gflops;
}

/* Fill the BLAS columns from c->peer_samples (sorted in place): the bare
 * BLAS calls timed alongside, doing the same rec->flops. */
static void record_blas(bench_ctx_t *c, flow_bench_record_t *rec)
{
	double median, min;

	flow_bench_median_min(c->peer_samples, c->cfg->iters, &median, &min);
	rec->blas_gflops = rec->flops / median / 1e3;
	rec->blas_ratio = rec->gflops / rec->blas_gflops;
}

static void record_check(flow_bench_record_t *rec, const float *got,
			 const float *ref, size_t n)
{
	rec->checked += n;
	rec->wrong += flow_bench_count_wrong(got, ref, n, rec->rtol, rec->atol);
}

#define D(i) ((size_t)c->shape->dims[i])

/* ---- peak: square cblas_sgemm ------------------------------------------------- */

static flow_err_t bench_peak(bench_ctx_t *c)
{
	size_t N = D(0), NN = N * N, R = N < BENCH_CHECK_ROWS ? N : BENCH_CHECK_ROWS;
	float *a, *b, *out, *a_rows, *got, *ref;
	flow_bench_record_t *rec = record_new(c, "sgemm");

	ALLOC_F(a, NN, "a");
	ALLOC_F(b, NN, "b");
	ALLOC_F(out, NN, "c");
	ALLOC_F(a_rows, R * N, "a rows");
	ALLOC_F(got, R * N, "c rows");
	ALLOC_F(ref, R * N, "reference c rows");
	fill_normal(a, NN, c->cfg, STREAM_A, 0.0f, 1.0f);
	fill_normal(b, NN, c->cfg, STREAM_B, 0.0f, 1.0f / sqrtf((float)N));

	BENCH_TIME_CALLS(c->cfg, c->samples, (void)0,
			 cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
				     (int)N, (int)N, (int)N, 1.0f, a, (int)N,
				     b, (int)N, 0.0f, out, (int)N));
	record_time(c, rec, 2.0 * N * N * N, 4.0 * 3 * NN);
	rec->frac_peak = rec->min_us / rec->time_us;

	/* C = A . B^T is the matmul forward without bias. */
	gather_rows(a_rows, a, R, N, N);
	gather_rows(got, out, R, N, N);
	flow_ref_matmul_forward(ref, a_rows, b, NULL, R, N, N);
	record_check(rec, got, ref, R * N);

	return FLOW_OK;
}

double flow_bench_peak_gflops(const flow_bench_record_t *rec)
{
	return rec->flops / rec->min_us / 1e3;
}

/* ---- matmul ------------------------------------------------------------------------ */

/* The matmul benchmarks' inputs, on every device the same: an
 * nn.Linear-like scale, so outputs and gradients stay O(1). */
/* Scaled so that out, dweight and dbias are of order 1 whatever the
 * shape: each is a sum over IN or N products, and a tolerance of order
 * 1e-4 must hold for fp32 sums of any length (a GPU's one long chain per
 * output over N = 8192 rows of unscaled dout drifts by 1e-3). */
static void matmul_inputs(const flow_bench_config_t *cfg, size_t N, size_t IN,
			  size_t OUT, float *inp, float *weight, float *bias,
			  float *dout)
{
	fill_normal(inp, N * IN, cfg, STREAM_A, 0.0f, 1.0f);
	fill_normal(weight, OUT * IN, cfg, STREAM_B, 0.0f, 1.0f / sqrtf((float)IN));
	fill_uniform(bias, OUT, cfg, STREAM_C, -1.0f, 1.0f);
	fill_normal(dout, N * OUT, cfg, STREAM_D, 0.0f, 1.0f / sqrtf((float)N));
}

/* The matmul of set k, fp32 or its bf16 twin (scratch given): the one
 * call the matmul benchmarks make of either. */
static void mm_forward(const flow_kernels_t *k, void *bf16_scratch, void *out,
		       const void *inp, const float *weight, const float *bias,
		       size_t n, size_t in, size_t out_dim)
{
	if (bf16_scratch)
		k->matmul_bf16_forward(out, bf16_scratch, inp, weight, bias, n,
				       in, out_dim);
	else
		k->matmul_forward(out, inp, weight, bias, n, in, out_dim);
}

static void mm_backward(const flow_kernels_t *k, void *bf16_scratch,
			void *dinp, float *dweight, float *dbias,
			const void *dout, const void *inp, const float *weight,
			size_t n, size_t in, size_t out_dim)
{
	if (bf16_scratch)
		k->matmul_bf16_backward(dinp, dweight, dbias, bf16_scratch,
					dout, inp, weight, n, in, out_dim);
	else
		k->matmul_backward(dinp, dweight, dbias, dout, inp, weight, n,
				   in, out_dim);
}

/* matmul, or matmul_bf16: the CPU set's matmul or its bf16 twin (bf16
 * activations), checked against the reference set's and timed against
 * the same sgemms on fp32 operands (for the twin: what widening and
 * rounding cost here). */
static flow_err_t bench_matmul(bench_ctx_t *c)
{
	const flow_bench_config_t *cfg = c->cfg;
	const bool bf16 = c->k == FLOW_BENCH_MATMUL_BF16;
	const size_t es = bf16 ? sizeof(flow_bf16_t) : sizeof(float);
	size_t N = D(0), IN = D(1), OUT = D(2); /* not I: <complex.h> */
	size_t R = N < BENCH_CHECK_ROWS ? N : BENCH_CHECK_ROWS;
	size_t RO = OUT < BENCH_CHECK_WROWS ? OUT : BENCH_CHECK_WROWS;
	size_t W = IN > OUT ? IN : OUT;
	double gemm_flops = 2.0 * N * IN * OUT;
	float *inp_f, *dout_f, *weight, *bias, *out_f, *dinp_f, *dweight, *dbias;
	float *rows_got, *rows_ref, *wrows, *wref, *bref;
	void *inp16, *dout16, *out, *dinp, *rows_in, *rows_dout, *rows_res;
	void *cols_dout;
	const void *inp, *dout;
	void *scratch = NULL, *ref_scratch = NULL; /* bf16 only */
	const flow_kernels_t *cpu = &flow_cpu_kernels, *ref = &flow_ref_kernels;
	flow_bench_record_t *fwd = record_new(c, "fwd");
	flow_bench_record_t *bwd = record_new(c, "bwd");

	if (bf16) {
		size_t r1 = ref->matmul_bf16_scratch_bound(R, IN, OUT);
		size_t r2 = ref->matmul_bf16_scratch_bound(N, IN, RO);
		ALLOC(scratch, cpu->matmul_bf16_scratch_bound(N, IN, OUT), 1,
		      "bf16 operands");
		ALLOC(ref_scratch, r1 > r2 ? r1 : r2, 1,
		      "reference bf16 operands");
	}

	ALLOC_F(inp_f, N * IN, "inp");
	ALLOC_F(weight, OUT * IN, "weight");
	ALLOC_F(bias, OUT, "bias");
	ALLOC_F(out_f, N * OUT, "fp32 out");
	ALLOC_F(dout_f, N * OUT, "dout");
	ALLOC_F(dinp_f, N * IN, "fp32 dinp");
	ALLOC_F(dweight, OUT * IN, "dweight");
	ALLOC_F(dbias, OUT, "dbias");
	ALLOC(inp16, N * IN, es, "inp");
	ALLOC(dout16, N * OUT, es, "dout");
	ALLOC(out, N * OUT, es, "out");
	ALLOC(dinp, N * IN, es, "dinp");
	ALLOC(rows_in, R * IN, es, "sampled rows");
	ALLOC(rows_dout, R * OUT, es, "sampled dout rows");
	ALLOC(rows_res, R * W, es, "reference rows");
	ALLOC(cols_dout, N * RO, es, "sampled dout columns");
	ALLOC_F(rows_got, R * W, "sampled result rows");
	ALLOC_F(rows_ref, R * W, "reference result rows");
	ALLOC_F(wrows, RO * IN, "sampled weight rows");
	ALLOC_F(wref, RO * IN, "reference dweight rows");
	ALLOC_F(bref, RO, "reference dbias");
	matmul_inputs(cfg, N, IN, OUT, inp_f, weight, bias, dout_f);
	inp = act_from(inp_f, inp16, N * IN, bf16);
	dout = act_from(dout_f, dout16, N * OUT, bf16);

	/* Forward: check sampled rows of out. */
	mm_forward(cpu, scratch, out, inp, weight, bias, N, IN, OUT);
	gather_elems(rows_in, inp, R, N, IN, es);
	mm_forward(ref, ref_scratch, rows_res, rows_in, weight, bias, R, IN,
		   OUT);
	gather_act(rows_got, out, R, N, OUT, bf16);
	act_widen(rows_ref, rows_res, R * OUT, bf16);
	record_check(fwd, rows_got, rows_ref, R * OUT);

	/* flow and the bare sgemm alternate call by call, so load from other
	 * processes on a shared machine slows both alike. */
	BENCH_TIME_PAIR(cfg, c->samples, c->peer_samples,
			mm_forward(cpu, scratch, out, inp, weight, bias, N, IN,
				   OUT),
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
				    (int)N, (int)OUT, (int)IN, 1.0f, inp_f,
				    (int)IN, weight, (int)IN, 0.0f, out_f,
				    (int)OUT));
	record_time(c, fwd, gemm_flops,
		    (double)es * ((double)N * IN + (double)N * OUT) +
			    4.0 * ((double)OUT * IN + OUT));
	record_blas(c, fwd);

	/* Backward from zeroed gradients: sampled rows of dinp, sampled
	 * rows of dweight and the matching dbias entries. */
	mm_backward(cpu, scratch, dinp, dweight, dbias, dout, inp, weight, N,
		    IN, OUT);
	gather_elems(rows_dout, dout, R, N, OUT, es);
	memset(rows_res, 0, R * IN * es);
	mm_backward(ref, ref_scratch, rows_res, NULL, NULL, rows_dout, rows_in,
		    weight, R, IN, OUT);
	gather_act(rows_got, dinp, R, N, IN, bf16);
	act_widen(rows_ref, rows_res, R * IN, bf16);
	record_check(bwd, rows_got, rows_ref, R * IN);
	for (size_t r = 0; r < N; r++)
		for (size_t k = 0; k < RO; k++)
			memcpy((char *)cols_dout + (r * RO + k) * es,
			       (const char *)dout +
				       (r * OUT + sample_row(k, RO, OUT)) * es,
			       es);
	gather_rows(wrows, weight, RO, OUT, IN);
	mm_backward(ref, ref_scratch, NULL, wref, bref, cols_dout, inp, wrows,
		    N, IN, RO);
	gather_rows(wrows, dweight, RO, OUT, IN);
	record_check(bwd, wrows, wref, RO * IN);
	for (size_t k = 0; k < RO; k++)
		wrows[k] = dbias[sample_row(k, RO, OUT)];
	record_check(bwd, wrows, bref, RO);

	BENCH_TIME_PAIR(cfg, c->samples, c->peer_samples,
			mm_backward(cpu, scratch, dinp, dweight, dbias, dout,
				    inp, weight, N, IN, OUT),
			{
				cblas_sgemm(CblasRowMajor, CblasNoTrans,
					    CblasNoTrans, (int)N, (int)IN,
					    (int)OUT, 1.0f, dout_f, (int)OUT,
					    weight, (int)IN, 1.0f, dinp_f,
					    (int)IN);
				cblas_sgemm(CblasRowMajor, CblasTrans,
					    CblasNoTrans, (int)OUT, (int)IN,
					    (int)N, 1.0f, dout_f, (int)OUT,
					    inp_f, (int)IN, 1.0f, dweight,
					    (int)IN);
			});
	record_time(c, bwd, 2.0 * gemm_flops,
		    (double)es * ((double)N * OUT + 3.0 * N * IN) +
			    4.0 * (3.0 * OUT * IN + 2.0 * OUT));
	record_blas(c, bwd);

	return FLOW_OK;
}

/* ---- on a CUDA device: matmul against cuBLAS's own, and its peak -------- */
/* The inputs are the CPU benchmark's, copied up; every output is copied
 * back and compared whole with the CPU kernel's (true fp32 on both sides,
 * so the matmul tolerance holds).  Each timed call ends with the kernel
 * set's last(), a stream synchronisation, on both sides alike. */

/* Device buffers of the run, and the module's kernels. */
typedef struct bench_cuda {
	const flow_cuda_module_t *m;
	void *ptr[8];
	size_t n;
} bench_cuda_t;

static float *cuda_buf(bench_ctx_t *c, bench_cuda_t *d, const float *host,
		       size_t count, flow_err_t *err)
{
	void *p = NULL;
	if (*err == FLOW_OK)
		*err = flow_cuda_alloc(&p, count * sizeof(float), c->diag);
	if (*err == FLOW_OK && host)
		*err = flow_cuda_upload(p, host, count * sizeof(float), c->diag);
	if (p)
		d->ptr[d->n++] = p;
	return p;
}

static void cuda_bufs_release(bench_cuda_t *d)
{
	for (size_t i = 0; i < d->n; i++)
		flow_cuda_release(d->ptr[i]);
}

/* Every element of n device floats at dev against ref, into rec. */
static flow_err_t cuda_check(bench_ctx_t *c, flow_bench_record_t *rec,
			     const float *dev, const float *ref, size_t n,
			     float *host)
{
	flow_err_t err = flow_cuda_download(host, dev, n * sizeof(float), c->diag);
	if (err == FLOW_OK)
		record_check(rec, host, ref, n);
	return err;
}

/* The timing loop's calls end in the set's last(); its first failure
 * stops the run after the loop. */
#define CUDA_CALL(CALL)                                                     	do {                                                                		CALL;                                                       		if (err == FLOW_OK)                                         			err = k->last(c->diag);                             	} while (0)

static flow_err_t bench_cuda_peak(bench_ctx_t *c, bench_cuda_t *d)
{
	size_t N = D(0), NN = N * N;
	const flow_kernels_t *k = d->m->kernels;
	flow_err_t err = FLOW_OK;
	float *a, *b, *ref, *host;
	flow_bench_record_t *rec = record_new(c, "sgemm");

	ALLOC_F(a, NN, "a");
	ALLOC_F(b, NN, "b");
	ALLOC_F(ref, NN, "reference c");
	ALLOC_F(host, NN, "c from the device");
	fill_normal(a, NN, c->cfg, STREAM_A, 0.0f, 1.0f);
	fill_normal(b, NN, c->cfg, STREAM_B, 0.0f, 1.0f / sqrtf((float)N));
	float *da = cuda_buf(c, d, a, NN, &err), *db = cuda_buf(c, d, b, NN, &err);
	float *dc = cuda_buf(c, d, NULL, NN, &err);
	if (err != FLOW_OK)
		return err;
	BENCH_TIME_CALLS(c->cfg, c->samples, (void)0,
			 CUDA_CALL(d->m->gemm(false, true, N, N, N, da, db, 0.0f,
					      dc)));
	if (err != FLOW_OK)
		return err;
	record_time(c, rec, 2.0 * N * N * N, 4.0 * 3 * NN);
	rec->frac_peak = rec->min_us / rec->time_us;
	flow_cpu_matmul_forward(ref, a, b, NULL, N, N, N);
	return cuda_check(c, rec, dc, ref, NN, host);
}

static flow_err_t bench_cuda_matmul(bench_ctx_t *c, bench_cuda_t *d)
{
	const flow_bench_config_t *cfg = c->cfg;
	size_t N = D(0), IN = D(1), OUT = D(2);
	double gemm_flops = 2.0 * N * IN * OUT;
	const flow_kernels_t *k = d->m->kernels;
	flow_err_t err = FLOW_OK;
	float *inp, *weight, *bias, *dout, *out, *dinp, *dweight, *dbias, *host;
	flow_bench_record_t *fwd = record_new(c, "fwd");
	flow_bench_record_t *bwd = record_new(c, "bwd");
	size_t big = N * (IN > OUT ? IN : OUT);

	if (OUT * IN > big)
		big = OUT * IN;
	ALLOC_F(inp, N * IN, "inp");
	ALLOC_F(weight, OUT * IN, "weight");
	ALLOC_F(bias, OUT, "bias");
	ALLOC_F(dout, N * OUT, "dout");
	ALLOC_F(out, N * OUT, "out");
	ALLOC_F(dinp, N * IN, "dinp");
	ALLOC_F(dweight, OUT * IN, "dweight");
	ALLOC_F(dbias, OUT, "dbias");
	ALLOC_F(host, big, "results from the device");
	matmul_inputs(cfg, N, IN, OUT, inp, weight, bias, dout);
	float *d_inp = cuda_buf(c, d, inp, N * IN, &err);
	float *d_w = cuda_buf(c, d, weight, OUT * IN, &err);
	float *d_b = cuda_buf(c, d, bias, OUT, &err);
	float *d_dout = cuda_buf(c, d, dout, N * OUT, &err);
	float *d_out = cuda_buf(c, d, NULL, N * OUT, &err);
	float *d_dinp = cuda_buf(c, d, dinp, N * IN, &err);   /* zeroed: */
	float *d_dw = cuda_buf(c, d, dweight, OUT * IN, &err); /* ALLOC */
	float *d_db = cuda_buf(c, d, dbias, OUT, &err);        /* zeroes */
	if (err != FLOW_OK)
		return err;

	/* One forward and one backward from zero, checked whole. */
	flow_cpu_matmul_forward(out, inp, weight, bias, N, IN, OUT);
	CUDA_CALL(k->matmul_forward(d_out, d_inp, d_w, d_b, N, IN, OUT));
	if (err == FLOW_OK)
		err = cuda_check(c, fwd, d_out, out, N * OUT, host);
	flow_cpu_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IN,
				 OUT);
	CUDA_CALL(k->matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N,
				     IN, OUT));
	if (err == FLOW_OK)
		err = cuda_check(c, bwd, d_dinp, dinp, N * IN, host);
	if (err == FLOW_OK)
		err = cuda_check(c, bwd, d_dw, dweight, OUT * IN, host);
	if (err == FLOW_OK)
		err = cuda_check(c, bwd, d_db, dbias, OUT, host);
	if (err != FLOW_OK)
		return err;

	BENCH_TIME_PAIR(cfg, c->samples, c->peer_samples,
			CUDA_CALL(k->matmul_forward(d_out, d_inp, d_w, d_b, N,
						    IN, OUT)),
			CUDA_CALL(d->m->gemm(false, true, N, OUT, IN, d_inp,
					     d_w, 0.0f, d_out)));
	if (err != FLOW_OK)
		return err;
	record_time(c, fwd, gemm_flops,
		    4.0 * ((double)N * IN + (double)OUT * IN + OUT + (double)N * OUT));
	record_blas(c, fwd);
	/* Backward's GEMMs alone: dinp = dout . W and dW = dout^T . inp. */
	BENCH_TIME_PAIR(cfg, c->samples, c->peer_samples,
			CUDA_CALL(k->matmul_backward(d_dinp, d_dw, d_db, d_dout,
						     d_inp, d_w, N, IN, OUT)),
			CUDA_CALL({
				d->m->gemm(false, false, N, IN, OUT, d_dout, d_w,
					   1.0f, d_dinp);
				d->m->gemm(true, false, OUT, IN, N, d_dout,
					   d_inp, 1.0f, d_dw);
			}));
	if (err != FLOW_OK)
		return err;
	record_time(c, bwd, 2.0 * gemm_flops,
		    4.0 * ((double)N * OUT + 3.0 * N * IN + 3.0 * OUT * IN + 2.0 * OUT));
	record_blas(c, bwd);
	return FLOW_OK;
}

/* Kernel k of c on the CUDA device: matmul and peak only. */
static flow_err_t bench_cuda(bench_ctx_t *c)
{
	bench_cuda_t d = { .n = 0 };
	flow_err_t err = flow_cuda_open(c->diag);
	if (err == FLOW_OK)
		err = flow_cuda_module_get(&d.m, c->diag);
	if (err != FLOW_OK)
		return err;
	if (c->k == FLOW_BENCH_PEAK)
		err = bench_cuda_peak(c, &d);
	else if (c->k == FLOW_BENCH_MATMUL)
		err = bench_cuda_matmul(c, &d);
	else
		err = flow_diag_set(c->diag, FLOW_ERR_NOTSUP,
				    "kernel '%s' has no CUDA benchmark yet "
				    "(--device cuda: peak and matmul)",
				    flow_bench_kernel_name(c->k));
	cuda_bufs_release(&d);
	return err;
}

/* ---- embedding -------------------------------------------------------------------- */

static flow_err_t bench_embedding(bench_ctx_t *c)
{
	const flow_bench_config_t *cfg = c->cfg;
	size_t B = D(0), T = D(1), C = D(2), V = D(3), BTC = B * T * C;
	float *wte, *wpe, *out, *ref, *dout, *dwte, *dwpe, *dwte_ref, *dwpe_ref;
	int32_t *tokens;
	flow_bench_record_t *fwd = record_new(c, "fwd");
	flow_bench_record_t *bwd = record_new(c, "bwd");

	ALLOC(tokens, B * T, sizeof(int32_t), "tokens");
	ALLOC_F(wte, V * C, "wte");
	ALLOC_F(wpe, T * C, "wpe");
	ALLOC_F(out, BTC, "out");
	ALLOC_F(ref, BTC, "reference out");
	ALLOC_F(dout, BTC, "dout");
	ALLOC_F(dwte, V * C, "dwte");
	ALLOC_F(dwpe, T * C, "dwpe");
	ALLOC_F(dwte_ref, V * C, "reference dwte");
	ALLOC_F(dwpe_ref, T * C, "reference dwpe");
	fill_tokens(tokens, B * T, cfg, STREAM_TOKENS, V);
	fill_normal(wte, V * C, cfg, STREAM_A, 0.0f, 1.0f);
	fill_normal(wpe, T * C, cfg, STREAM_B, 0.0f, 1.0f);
	fill_normal(dout, BTC, cfg, STREAM_C, 0.0f, 1.0f);

	flow_cpu_embedding_forward(out, tokens, wte, wpe, 0, V, B, T, C);
	flow_ref_embedding_forward(ref, tokens, wte, wpe, 0, V, B, T, C);
	record_check(fwd, out, ref, BTC);
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 flow_cpu_embedding_forward(out, tokens, wte, wpe, 0, V, B, T, C));
	record_time(c, fwd, (double)BTC,
		    4.0 * (2.0 * BTC + (double)T * C + (double)B * T));

	flow_cpu_embedding_backward(dwte, dwpe, dout, tokens, 0, V, B, T, C);
	flow_ref_embedding_backward(dwte_ref, dwpe_ref, dout, tokens, 0, V, B, T,
				    C);
	record_check(bwd, dwte, dwte_ref, V * C);
	record_check(bwd, dwpe, dwpe_ref, T * C);
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 flow_cpu_embedding_backward(dwte, dwpe, dout, tokens,
						     0, V, B, T, C));
	record_time(c, bwd, 2.0 * BTC,
		    4.0 * (3.0 * BTC + 2.0 * T * C + (double)B * T));

	return FLOW_OK;
}

/* ---- layernorm ------------------------------------------------------------------------ */

static flow_err_t bench_layernorm(bench_ctx_t *c)
{
	const flow_bench_config_t *cfg = c->cfg;
	size_t N = D(0), C = D(1), NC = N * C;
	float *inp, *w, *bias, *out, *mean, *rstd, *out_ref, *mean_ref, *rstd_ref;
	float *dout, *dinp, *dw, *db, *dinp_ref, *dw_ref, *db_ref;
	flow_bench_record_t *fwd = record_new(c, "fwd");
	flow_bench_record_t *bwd = record_new(c, "bwd");

	ALLOC_F(inp, NC, "inp");
	ALLOC_F(w, C, "weight");
	ALLOC_F(bias, C, "bias");
	ALLOC_F(out, NC, "out");
	ALLOC_F(mean, N, "mean");
	ALLOC_F(rstd, N, "rstd");
	ALLOC_F(out_ref, NC, "reference out");
	ALLOC_F(mean_ref, N, "reference mean");
	ALLOC_F(rstd_ref, N, "reference rstd");
	ALLOC_F(dout, NC, "dout");
	ALLOC_F(dinp, NC, "dinp");
	ALLOC_F(dw, C, "dweight");
	ALLOC_F(db, C, "dbias");
	ALLOC_F(dinp_ref, NC, "reference dinp");
	ALLOC_F(dw_ref, C, "reference dweight");
	ALLOC_F(db_ref, C, "reference dbias");
	/* An offset mean, as in a residual stream, tests the variance. */
	fill_normal(inp, NC, cfg, STREAM_A, 0.5f, 2.0f);
	fill_uniform(w, C, cfg, STREAM_B, 0.5f, 1.5f);
	fill_uniform(bias, C, cfg, STREAM_C, -0.5f, 0.5f);
	fill_normal(dout, NC, cfg, STREAM_D, 0.0f, 1.0f);

	flow_cpu_layernorm_forward(out, mean, rstd, inp, w, bias, N, C);
	flow_ref_layernorm_forward(out_ref, mean_ref, rstd_ref, inp, w, bias, N,
				   C);
	record_check(fwd, out, out_ref, NC);
	record_check(fwd, mean, mean_ref, N);
	record_check(fwd, rstd, rstd_ref, N);
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 flow_cpu_layernorm_forward(out, mean, rstd, inp, w,
						    bias, N, C));
	record_time(c, fwd, 8.0 * NC, 4.0 * (2.0 * NC + 2.0 * C + 2.0 * N));

	/* Both backward passes get the reference statistics as input. */
	flow_cpu_layernorm_backward(dinp, dw, db, dout, inp, w, mean_ref,
				    rstd_ref, N, C);
	flow_ref_layernorm_backward(dinp_ref, dw_ref, db_ref, dout, inp, w,
				    mean_ref, rstd_ref, N, C);
	record_check(bwd, dinp, dinp_ref, NC);
	record_check(bwd, dw, dw_ref, C);
	record_check(bwd, db, db_ref, C);
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 flow_cpu_layernorm_backward(dinp, dw, db, dout, inp, w,
						     mean_ref, rstd_ref, N, C));
	record_time(c, bwd, 14.0 * NC, 4.0 * (4.0 * NC + 5.0 * C + 2.0 * N));

	return FLOW_OK;
}

/* ---- GELU --------------------------------------------------------------------------------- */

static flow_err_t bench_gelu(bench_ctx_t *c)
{
	const flow_bench_config_t *cfg = c->cfg;
	size_t N = D(0);
	float *inp, *out, *ref, *dout, *dinp, *dinp_ref;
	flow_bench_record_t *fwd = record_new(c, "fwd");
	flow_bench_record_t *bwd = record_new(c, "bwd");

	ALLOC_F(inp, N, "inp");
	ALLOC_F(out, N, "out");
	ALLOC_F(ref, N, "reference out");
	ALLOC_F(dout, N, "dout");
	ALLOC_F(dinp, N, "dinp");
	ALLOC_F(dinp_ref, N, "reference dinp");
	fill_normal(inp, N, cfg, STREAM_A, 0.0f, 2.0f);
	fill_normal(dout, N, cfg, STREAM_B, 0.0f, 1.0f);

	flow_cpu_gelu_forward(out, inp, N);
	flow_ref_gelu_forward(ref, inp, N);
	record_check(fwd, out, ref, N);
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 flow_cpu_gelu_forward(out, inp, N));
	record_time(c, fwd, 9.0 * N, 8.0 * N);

	flow_cpu_gelu_backward(dinp, inp, dout, N);
	flow_ref_gelu_backward(dinp_ref, inp, dout, N);
	record_check(bwd, dinp, dinp_ref, N);
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 flow_cpu_gelu_backward(dinp, inp, dout, N));
	record_time(c, bwd, 18.0 * N, 16.0 * N);

	return FLOW_OK;
}

/* ---- attention ---------------------------------------------------------------------------- */

/* The attention of set k or its bf16 twin: the calls of bench_attention. */
static void att_forward(const flow_kernels_t *k, bool bf16, void *out,
			float *lse, void *scratch, const void *qkv, size_t B,
			size_t T, size_t C, size_t NH)
{
	if (bf16)
		k->attention_bf16_forward(out, lse, scratch, qkv, B, T, C, NH);
	else
		k->attention_forward(out, lse, scratch, qkv, B, T, C, NH);
}

static void att_backward(const flow_kernels_t *k, bool bf16, void *dqkv,
			 void *scratch, const void *dout, const void *qkv,
			 const float *lse, const void *out, size_t B, size_t T,
			 size_t C, size_t NH)
{
	if (bf16)
		k->attention_bf16_backward(dqkv, scratch, dout, qkv, lse, out,
					   B, T, C, NH);
	else
		k->attention_backward(dqkv, scratch, dout, qkv, lse, out, B, T,
				      C, NH);
}

/* attention, or attention_bf16: its bf16 twin (bf16 activations, products
 * on bf16 operands), against the reference set's. */
static flow_err_t bench_attention(bench_ctx_t *c)
{
	const flow_bench_config_t *cfg = c->cfg;
	const bool bf16 = c->k == FLOW_BENCH_ATTENTION_BF16;
	const size_t es = bf16 ? sizeof(flow_bf16_t) : sizeof(float);
	const flow_kernels_t *cpu = &flow_cpu_kernels, *ref = &flow_ref_kernels;
	size_t B = D(0), T = D(1), C = D(2), NH = D(3), hs = C / NH;
	size_t BTC = B * T * C, LSE = B * NH * T;
	/* The probabilities, written to scratch and read back. */
	double att = (double)B * NH * T * T;
	double pairs = (double)B * NH * T * (T + 1) / 2.0;
	float *qkv_f, *dout_f, *lse, *lse_ref, *got, *want;
	void *qkv16, *dout16, *out, *out_ref, *dqkv, *dqkv_ref;
	const void *qkv, *dout;
	void *scratch, *scratch_ref;
	flow_bench_record_t *fwd = record_new(c, "fwd");
	flow_bench_record_t *bwd = record_new(c, "bwd");

	ALLOC_F(qkv_f, 3 * BTC, "qkv");
	ALLOC_F(dout_f, BTC, "dout");
	ALLOC_F(lse, LSE, "lse");
	ALLOC_F(lse_ref, LSE, "reference lse");
	ALLOC_F(got, 3 * BTC, "result");
	ALLOC_F(want, 3 * BTC, "reference result");
	ALLOC(qkv16, 3 * BTC, es, "qkv");
	ALLOC(dout16, BTC, es, "dout");
	ALLOC(out, BTC, es, "out");
	ALLOC(out_ref, BTC, es, "reference out");
	ALLOC(dqkv, 3 * BTC, es, "dqkv");
	ALLOC(dqkv_ref, 3 * BTC, es, "reference dqkv");
	ALLOC(scratch, cpu->attention_scratch_bound(B, T, C, NH, bf16), 1,
	      "attention scratch");
	ALLOC(scratch_ref, ref->attention_scratch_bound(B, T, C, NH, bf16), 1,
	      "reference attention scratch");
	fill_normal(qkv_f, 3 * BTC, cfg, STREAM_A, 0.0f, 1.0f);
	fill_normal(dout_f, BTC, cfg, STREAM_B, 0.0f, 1.0f);
	qkv = act_from(qkv_f, qkv16, 3 * BTC, bf16);
	dout = act_from(dout_f, dout16, BTC, bf16);

	att_forward(cpu, bf16, out, lse, scratch, qkv, B, T, C, NH);
	att_forward(ref, bf16, out_ref, lse_ref, scratch_ref, qkv, B, T, C, NH);
	act_widen(got, out, BTC, bf16);
	act_widen(want, out_ref, BTC, bf16);
	record_check(fwd, got, want, BTC);
	record_check(fwd, lse, lse_ref, LSE);
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 att_forward(cpu, bf16, out, lse, scratch, qkv, B, T,
				     C, NH));
	record_time(c, fwd, pairs * (4.0 * hs + 4.0),
		    (double)es * 4.0 * BTC + 4.0 * (2.0 * att + (double)LSE));

	/* Both backward passes read the reference lse and out. */
	att_backward(cpu, bf16, dqkv, scratch, dout, qkv, lse_ref, out_ref, B,
		     T, C, NH);
	att_backward(ref, bf16, dqkv_ref, scratch_ref, dout, qkv, lse_ref,
		     out_ref, B, T, C, NH);
	act_widen(got, dqkv, 3 * BTC, bf16);
	act_widen(want, dqkv_ref, 3 * BTC, bf16);
	record_check(bwd, got, want, 3 * BTC);
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 att_backward(cpu, bf16, dqkv, scratch, dout, qkv,
				      lse_ref, out_ref, B, T, C, NH));
	/* Five products, the recomputed q.k^T among them. */
	record_time(c, bwd, pairs * (10.0 * hs + 6.0),
		    (double)es * 10.0 * BTC +
			    4.0 * (6.0 * att + (double)LSE));

	return FLOW_OK;
}

/* ---- residual ------------------------------------------------------------------------------- */

static flow_err_t bench_residual(bench_ctx_t *c)
{
	const flow_bench_config_t *cfg = c->cfg;
	size_t N = D(0);
	float *a, *b, *out, *ref, *dout, *da, *db, *da_ref, *db_ref;
	flow_bench_record_t *fwd = record_new(c, "fwd");
	flow_bench_record_t *bwd = record_new(c, "bwd");

	ALLOC_F(a, N, "a");
	ALLOC_F(b, N, "b");
	ALLOC_F(out, N, "out");
	ALLOC_F(ref, N, "reference out");
	ALLOC_F(dout, N, "dout");
	ALLOC_F(da, N, "da");
	ALLOC_F(db, N, "db");
	ALLOC_F(da_ref, N, "reference da");
	ALLOC_F(db_ref, N, "reference db");
	fill_normal(a, N, cfg, STREAM_A, 0.0f, 1.0f);
	fill_normal(b, N, cfg, STREAM_B, 0.0f, 1.0f);
	fill_normal(dout, N, cfg, STREAM_C, 0.0f, 1.0f);
	/* Non-zero gradients on entry check that backward accumulates. */
	fill_normal(da, N, cfg, STREAM_D, 0.0f, 1.0f);
	fill_normal(db, N, cfg, STREAM_E, 0.0f, 1.0f);
	memcpy(da_ref, da, N * sizeof(float));
	memcpy(db_ref, db, N * sizeof(float));

	flow_cpu_residual_forward(out, a, b, N);
	flow_ref_residual_forward(ref, a, b, N);
	record_check(fwd, out, ref, N);
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 flow_cpu_residual_forward(out, a, b, N));
	record_time(c, fwd, (double)N, 12.0 * N);

	flow_cpu_residual_backward(da, db, dout, N);
	flow_ref_residual_backward(da_ref, db_ref, dout, N);
	record_check(bwd, da, da_ref, N);
	record_check(bwd, db, db_ref, N);
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 flow_cpu_residual_backward(da, db, dout, N));
	record_time(c, bwd, 2.0 * N, 20.0 * N);

	return FLOW_OK;
}

/* ---- residual add fused with layernorm ------------------------------------------------ */

/* The fused kernels against the two they replace, called in turn and timed
 * alongside (the peer columns): res = a + b and layernorm(res), then the
 * layernorm's backward into dres and the add's of dres into da and db. */
static flow_err_t bench_resln(bench_ctx_t *c)
{
	const flow_bench_config_t *cfg = c->cfg;
	size_t N = D(0), C = D(1), NC = N * C;
	float *a, *b, *w, *bias, *res, *out, *mean, *rstd, *ref_res, *ref_out;
	float *ref_mean, *ref_rstd, *dout, *dres, *da, *db, *dw, *dbias;
	float *ref_dres, *ref_da, *ref_db, *ref_dw, *ref_dbias;
	flow_bench_record_t *fwd = record_new(c, "fwd");
	flow_bench_record_t *bwd = record_new(c, "bwd");

	ALLOC_F(a, NC, "a");
	ALLOC_F(b, NC, "b");
	ALLOC_F(w, C, "weight");
	ALLOC_F(bias, C, "bias");
	ALLOC_F(res, NC, "res");
	ALLOC_F(out, NC, "out");
	ALLOC_F(mean, N, "mean");
	ALLOC_F(rstd, N, "rstd");
	ALLOC_F(ref_res, NC, "reference res");
	ALLOC_F(ref_out, NC, "reference out");
	ALLOC_F(ref_mean, N, "reference mean");
	ALLOC_F(ref_rstd, N, "reference rstd");
	ALLOC_F(dout, NC, "dout");
	ALLOC_F(dres, NC, "dres");
	ALLOC_F(da, NC, "da");
	ALLOC_F(db, NC, "db");
	ALLOC_F(dw, C, "dweight");
	ALLOC_F(dbias, C, "dbias");
	ALLOC_F(ref_dres, NC, "reference dres");
	ALLOC_F(ref_da, NC, "reference da");
	ALLOC_F(ref_db, NC, "reference db");
	ALLOC_F(ref_dw, C, "reference dweight");
	ALLOC_F(ref_dbias, C, "reference dbias");
	/* A residual stream with an offset mean, and a branch beside it. */
	fill_normal(a, NC, cfg, STREAM_A, 0.5f, 2.0f);
	fill_normal(b, NC, cfg, STREAM_B, 0.0f, 0.5f);
	fill_uniform(w, C, cfg, STREAM_C, 0.5f, 1.5f);
	fill_uniform(bias, C, cfg, STREAM_D, -0.5f, 0.5f);
	fill_normal(dout, NC, cfg, STREAM_E, 0.0f, 1.0f);

	flow_cpu_residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias,
					    N, C);
	flow_ref_residual_layernorm_forward(ref_res, ref_out, ref_mean,
					    ref_rstd, a, b, w, bias, N, C);
	record_check(fwd, res, ref_res, NC);
	record_check(fwd, out, ref_out, NC);
	record_check(fwd, mean, ref_mean, N);
	record_check(fwd, rstd, ref_rstd, N);
	BENCH_TIME_PAIR(cfg, c->samples, c->peer_samples,
			flow_cpu_residual_layernorm_forward(res, out, mean, rstd,
							    a, b, w, bias, N, C),
			{
				flow_cpu_residual_forward(res, a, b, NC);
				flow_cpu_layernorm_forward(out, mean, rstd, res,
							   w, bias, N, C);
			});
	record_time(c, fwd, 9.0 * NC, 4.0 * (4.0 * NC + 2.0 * C + 2.0 * N));
	record_blas(c, fwd);

	/* Backward from zeroed gradients, with the reference statistics. */
	flow_cpu_layernorm_residual_backward(dres, da, db, dw, dbias, dout,
					     ref_res, w, ref_mean, ref_rstd, N,
					     C);
	flow_ref_layernorm_residual_backward(ref_dres, ref_da, ref_db, ref_dw,
					     ref_dbias, dout, ref_res, w,
					     ref_mean, ref_rstd, N, C);
	record_check(bwd, dres, ref_dres, NC);
	record_check(bwd, da, ref_da, NC);
	record_check(bwd, db, ref_db, NC);
	record_check(bwd, dw, ref_dw, C);
	record_check(bwd, dbias, ref_dbias, C);
	BENCH_TIME_PAIR(cfg, c->samples, c->peer_samples,
			flow_cpu_layernorm_residual_backward(
				dres, da, db, dw, dbias, dout, ref_res, w,
				ref_mean, ref_rstd, N, C),
			{
				flow_cpu_layernorm_backward(dres, dw, dbias,
							    dout, ref_res, w,
							    ref_mean, ref_rstd,
							    N, C);
				flow_cpu_residual_backward(da, db, dres, NC);
			});
	record_time(c, bwd, 16.0 * NC, 4.0 * (7.0 * NC + 5.0 * C + 2.0 * N));
	record_blas(c, bwd);

	return FLOW_OK;
}

/* ---- cross-entropy ------------------------------------------------------------------------- */

/* Every 8th row (r % 8 == 7) has target -1, the "ignore" case. */
#define BENCH_CE_IGNORE_EVERY 8

static flow_err_t bench_crossentropy(bench_ctx_t *c)
{
	const flow_bench_config_t *cfg = c->cfg;
	size_t N = D(0), V = D(1), Vp = D(2), NV = N * Vp;
	float *logits0, *logits, *logits_ref, *losses, *losses_ref;
	int32_t *targets;
	flow_bench_record_t *rec = record_new(c, "fused");

	ALLOC(targets, N, sizeof(int32_t), "targets");
	ALLOC_F(logits0, NV, "logits");
	ALLOC_F(logits, NV, "logits (in place)");
	ALLOC_F(logits_ref, NV, "reference logits");
	ALLOC_F(losses, N, "losses");
	ALLOC_F(losses_ref, N, "reference losses");
	fill_tokens(targets, N, cfg, STREAM_TOKENS, V);
	for (size_t r = BENCH_CE_IGNORE_EVERY - 1; r < N;
	     r += BENCH_CE_IGNORE_EVERY)
		targets[r] = -1;
	fill_normal(logits0, NV, cfg, STREAM_A, 0.0f, 2.0f);
	memcpy(logits, logits0, NV * sizeof(float));
	memcpy(logits_ref, logits0, NV * sizeof(float));

	flow_cpu_cross_entropy_forward_backward(losses, logits, targets, N, V,
						Vp, 1.0f);
	flow_ref_cross_entropy_forward_backward(losses_ref, logits_ref, targets,
						N, V, Vp, 1.0f);
	record_check(rec, losses, losses_ref, N);
	record_check(rec, logits, logits_ref, NV);
	BENCH_TIME_CALLS(cfg, c->samples,
			 memcpy(logits, logits0, NV * sizeof(float)),
			 flow_cpu_cross_entropy_forward_backward(losses, logits,
								 targets, N, V,
								 Vp, 1.0f));
	record_time(c, rec, 5.0 * N * V, 4.0 * (2.0 * NV + 2.0 * N));

	return FLOW_OK;
}

/* ---- AdamW ------------------------------------------------------------------------------------ */

static flow_err_t bench_adamw(bench_ctx_t *c)
{
	const flow_bench_config_t *cfg = c->cfg;
	size_t N = D(0);
	/* GPT-2 training values (llm.c), a decayed tensor, step 10. */
	const flow_adamw_params_t hp = { .lr = 6e-4f, .beta1 = 0.9f,
					 .beta2 = 0.95f, .eps = 1e-8f,
					 .weight_decay = 0.1f };
	const uint64_t step = 10;
	float *p, *g, *m, *v, *p_ref, *m_ref, *v_ref;
	flow_bench_record_t *rec = record_new(c, "update");

	ALLOC_F(p, N, "param");
	ALLOC_F(g, N, "grad");
	ALLOC_F(m, N, "m");
	ALLOC_F(v, N, "v");
	ALLOC_F(p_ref, N, "reference param");
	ALLOC_F(m_ref, N, "reference m");
	ALLOC_F(v_ref, N, "reference v");
	fill_normal(p, N, cfg, STREAM_A, 0.0f, 0.02f);
	fill_normal(g, N, cfg, STREAM_B, 0.0f, 1e-2f);
	fill_normal(m, N, cfg, STREAM_C, 0.0f, 1e-2f);
	fill_uniform(v, N, cfg, STREAM_D, 1e-6f, 1e-4f);
	memcpy(p_ref, p, N * sizeof(float));
	memcpy(m_ref, m, N * sizeof(float));
	memcpy(v_ref, v, N * sizeof(float));

	flow_cpu_adamw_update(p, g, m, v, N, &hp, step, true);
	flow_ref_adamw_update(p_ref, g, m_ref, v_ref, N, &hp, step, true);
	record_check(rec, p, p_ref, N);
	record_check(rec, m, m_ref, N);
	record_check(rec, v, v_ref, N);
	/* Timed updates keep moving the same state: the cost does not
	 * depend on the values. */
	BENCH_TIME_CALLS(cfg, c->samples, (void)0,
			 flow_cpu_adamw_update(p, g, m, v, N, &hp, step, true));
	record_time(c, rec, 15.0 * N, 28.0 * N);

	return FLOW_OK;
}

/* ---- gradient-norm clipping ------------------------------------------------------------------ */

#define BENCH_CLIP_MAX_NORM 1.0f

static flow_err_t bench_gradnorm(bench_ctx_t *c)
{
	const flow_bench_config_t *cfg = c->cfg;
	size_t N = D(0), K = c->shape->ndims > 1 ? D(1) : 1;
	float *g0, *g, *g_ref, norm[1], norm_ref[1];
	float **ptrs, **ptrs_ref;
	size_t *counts;
	flow_bench_record_t *rec = record_new(c, "clip");

	ALLOC_F(g0, N, "gradients");
	ALLOC_F(g, N, "gradients (clipped)");
	ALLOC_F(g_ref, N, "reference gradients");
	ALLOC(ptrs, K, sizeof(*ptrs), "tensor list");
	ALLOC(ptrs_ref, K, sizeof(*ptrs), "tensor list");
	ALLOC(counts, K, sizeof(*counts), "tensor sizes");
	/* K tensors, the first N % K one element longer. */
	for (size_t k = 0, off = 0; k < K; k++) {
		counts[k] = N / K + (k < N % K);
		ptrs[k] = g + off;
		ptrs_ref[k] = g_ref + off;
		off += counts[k];
	}
	fill_normal(g0, N, cfg, STREAM_A, 0.0f, 1.0f);
	memcpy(g, g0, N * sizeof(float));
	memcpy(g_ref, g0, N * sizeof(float));

	norm[0] = flow_cpu_clip_grad_norm(ptrs, counts, K, BENCH_CLIP_MAX_NORM);
	norm_ref[0] = flow_ref_clip_grad_norm(ptrs_ref, counts, K,
					      BENCH_CLIP_MAX_NORM);
	record_check(rec, norm, norm_ref, 1);
	record_check(rec, g, g_ref, N);
	BENCH_TIME_CALLS(cfg, c->samples, memcpy(g, g0, N * sizeof(float)),
			 (void)flow_cpu_clip_grad_norm(ptrs, counts, K,
						       BENCH_CLIP_MAX_NORM));
	record_time(c, rec, 3.0 * N, 12.0 * N);

	return FLOW_OK;
}

#undef D

/* ---- the kernel table ------------------------------------------------------------------------ */

typedef struct bench_kernel {
	const char *name;
	const char *syntax;
	size_t min_dims, max_dims;
	double rtol, atol;
	flow_err_t (*run)(bench_ctx_t *c);
	size_t ndefault;
	flow_bench_shape_t defaults[5];
} bench_kernel_t;

#define SHAPE(...)                                                            \
	{                                                                     \
		.ndims = sizeof((uint64_t[]){ __VA_ARGS__ }) / sizeof(uint64_t), \
		.dims = { __VA_ARGS__ }                                       \
	}

/* Defaults: GPT-2 124M (C 768, NH 12, V 50257, Vp 50304) at B 4, T 64,
 * so N = B*T = 256 rows; AdamW and gradnorm get one transformer block's
 * 7,087,872 parameters (gradnorm in its 12 tensors).  Tolerances: see
 * flow-bench(1), section CHECKING. */
static const bench_kernel_t bench_kernels[FLOW_BENCH_NKERNELS] = {
	[FLOW_BENCH_PEAK] = { "peak", "N", 1, 1, 1e-4, 1e-4, bench_peak,
			      1, { SHAPE(2048) } },
	[FLOW_BENCH_MATMUL] = { "matmul", "N,IN,OUT", 3, 3, 1e-4, 1e-4,
				bench_matmul, 5,
				{ SHAPE(256, 768, 2304), SHAPE(256, 768, 768),
				  SHAPE(256, 768, 3072), SHAPE(256, 3072, 768),
				  SHAPE(256, 768, 50304) } },
	[FLOW_BENCH_EMBEDDING] = { "embedding", "B,T,C,V", 4, 4, 1e-6, 1e-6,
				   bench_embedding, 1,
				   { SHAPE(4, 64, 768, 50304) } },
	[FLOW_BENCH_LAYERNORM] = { "layernorm", "N,C", 2, 2, 1e-4, 1e-5,
				   bench_layernorm, 1, { SHAPE(256, 768) } },
	[FLOW_BENCH_GELU] = { "gelu", "N", 1, 1, 1e-5, 1e-5, bench_gelu, 1,
			      { SHAPE(786432) } },
	[FLOW_BENCH_ATTENTION] = { "attention", "B,T,C,NH", 4, 4, 1e-4, 1e-5,
				   bench_attention, 1,
				   { SHAPE(4, 64, 768, 12) } },
	[FLOW_BENCH_RESIDUAL] = { "residual", "N", 1, 1, 0.0, 0.0,
				  bench_residual, 1, { SHAPE(196608) } },
	[FLOW_BENCH_CROSSENTROPY] = { "crossentropy", "N,V,VP", 3, 3, 1e-4,
				      1e-9, bench_crossentropy, 1,
				      { SHAPE(256, 50257, 50304) } },
	[FLOW_BENCH_ADAMW] = { "adamw", "N", 1, 1, 1e-5, 1e-8, bench_adamw, 1,
			       { SHAPE(7087872) } },
	[FLOW_BENCH_GRADNORM] = { "gradnorm", "N[,K]", 1, 2, 1e-5, 1e-9,
				  bench_gradnorm, 1, { SHAPE(7087872, 12) } },
	[FLOW_BENCH_RESLN] = { "resln", "N,C", 2, 2, 1e-4, 1e-5, bench_resln, 1,
			       { SHAPE(256, 768) } },
	/* The bf16 twins' outputs are rounded to bf16 on both sides, from
	 * fp32 sums that differ in their last bits: one bf16 step (at most
	 * 2^-7 relative) apart where a sum straddles a rounding boundary. */
	[FLOW_BENCH_MATMUL_BF16] = { "matmul_bf16", "N,IN,OUT", 3, 3, 1e-2,
				     1e-3, bench_matmul, 5,
				     { SHAPE(256, 768, 2304),
				       SHAPE(256, 768, 768),
				       SHAPE(256, 768, 3072),
				       SHAPE(256, 3072, 768),
				       SHAPE(256, 768, 50304) } },
	[FLOW_BENCH_ATTENTION_BF16] = { "attention_bf16", "B,T,C,NH", 4, 4,
					1e-2, 1e-3, bench_attention, 1,
					{ SHAPE(4, 64, 768, 12) } },
};

static const bench_kernel_t *kernel_entry(flow_bench_kernel_t k)
{
	return (unsigned)k < FLOW_BENCH_NKERNELS ? &bench_kernels[k] : NULL;
}

const char *flow_bench_kernel_name(flow_bench_kernel_t k)
{
	const bench_kernel_t *e = kernel_entry(k);
	return e ? e->name : NULL;
}

const char *flow_bench_kernel_shape_syntax(flow_bench_kernel_t k)
{
	const bench_kernel_t *e = kernel_entry(k);
	return e ? e->syntax : NULL;
}

flow_err_t flow_bench_kernel_lookup(const char *name, flow_bench_kernel_t *k_out,
				    flow_diag_t *diag)
{
	for (int k = 0; k < FLOW_BENCH_NKERNELS; k++) {
		if (strcmp(name, bench_kernels[k].name) == 0) {
			*k_out = (flow_bench_kernel_t)k;
			return FLOW_OK;
		}
	}
	return flow_diag_set(diag, FLOW_ERR_USAGE, "unknown kernel '%s'", name);
}

size_t flow_bench_default_shapes(flow_bench_kernel_t k,
				 const flow_bench_shape_t **shapes_out)
{
	const bench_kernel_t *e = kernel_entry(k);
	if (!e)
		return 0;
	*shapes_out = e->defaults;
	return e->ndefault;
}

void flow_bench_default_tolerance(flow_bench_kernel_t k, double *rtol_out,
				  double *atol_out)
{
	const bench_kernel_t *e = kernel_entry(k);
	*rtol_out = e ? e->rtol : 0.0;
	*atol_out = e ? e->atol : 0.0;
}

void flow_bench_shape_format(const flow_bench_shape_t *shape, char *buf,
			     size_t len)
{
	size_t used = 0;
	if (len == 0)
		return;
	buf[0] = '\0';
	for (size_t i = 0; i < shape->ndims && used < len; i++) {
		int n = snprintf(buf + used, len - used, "%s%llu", i ? "x" : "",
				 (unsigned long long)shape->dims[i]);
		if (n < 0)
			break;
		used += (size_t)n;
	}
}

/* True when every buffer a kernel allocates for this shape has a byte size
 * that fits in size_t (and the int a BLAS call takes, for GEMMs). */
static bool shape_fits(flow_bench_kernel_t k, const uint64_t *d, size_t nd)
{
	size_t x, y;
	const size_t f = sizeof(float);

	for (size_t i = 0; i < nd; i++)
		if (d[i] > SIZE_MAX / 64)
			return false;
	switch (k) {
	case FLOW_BENCH_PEAK:
		return d[0] <= INT32_MAX && flow_mul_size(d[0], d[0], &x) &&
		       flow_mul_size(x, f, &x);
	case FLOW_BENCH_MATMUL:
	case FLOW_BENCH_MATMUL_BF16:
		for (size_t i = 0; i < 3; i++)
			if (d[i] > INT32_MAX)
				return false;
		return flow_mul_size(d[0], d[1], &x) && flow_mul_size(x, f, &x) &&
		       flow_mul_size(d[0], d[2], &x) && flow_mul_size(x, f, &x) &&
		       flow_mul_size(d[1], d[2], &x) && flow_mul_size(x, f, &x);
	case FLOW_BENCH_EMBEDDING:
		return flow_mul_size(d[0], d[1], &x) && flow_mul_size(x, d[2], &x) &&
		       flow_mul_size(x, f, &x) && flow_mul_size(d[3], d[2], &y) &&
		       flow_mul_size(y, f, &y);
	case FLOW_BENCH_LAYERNORM:
	case FLOW_BENCH_RESLN:
		return flow_mul_size(d[0], d[1], &x) && flow_mul_size(x, f, &x);
	case FLOW_BENCH_ATTENTION:
	case FLOW_BENCH_ATTENTION_BF16:
		return flow_mul_size(d[0], d[1], &x) && flow_mul_size(x, d[2], &x) &&
		       flow_mul_size(x, 3 * f, &x) && flow_mul_size(d[0], d[3], &y) &&
		       flow_mul_size(y, d[1], &y) && flow_mul_size(y, d[1], &y) &&
		       flow_mul_size(y, sizeof(double), &y);
	case FLOW_BENCH_CROSSENTROPY:
		return flow_mul_size(d[0], d[2], &x) && flow_mul_size(x, f, &x);
	default:
		return flow_mul_size(d[0], f, &x);
	}
}

flow_err_t flow_bench_shape_parse(flow_bench_kernel_t k, const char *text,
				  flow_bench_shape_t *shape_out,
				  flow_diag_t *diag)
{
	const bench_kernel_t *e = kernel_entry(k);
	flow_diag_t ignored = FLOW_DIAG_INIT;
	uint64_t d[FLOW_BENCH_MAX_DIMS];
	size_t nd = 0;

	if (!e)
		return flow_diag_set(diag, FLOW_ERR_USAGE, "unknown kernel");
	if (flow_parse_dims(text, FLOW_BENCH_MAX_DIMS, d, &nd, &ignored) != FLOW_OK ||
	    nd < e->min_dims || nd > e->max_dims)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid shape '%s' for %s: expected %s",
				     text, e->name, e->syntax);
	if ((k == FLOW_BENCH_ATTENTION || k == FLOW_BENCH_ATTENTION_BF16) &&
	    d[2] % d[3] != 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid shape '%s' for %s: NH must divide C",
				     text, e->name);
	if (k == FLOW_BENCH_CROSSENTROPY && (d[1] > d[2] || d[1] > INT32_MAX))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid shape '%s' for crossentropy: V must not exceed VP (or 2^31-1)",
				     text);
	if (k == FLOW_BENCH_EMBEDDING && d[3] > INT32_MAX)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid shape '%s' for embedding: V must be below 2^31",
				     text);
	if (k == FLOW_BENCH_GRADNORM && nd == 2 && d[1] > d[0])
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid shape '%s' for gradnorm: K must not exceed N",
				     text);
	if (!shape_fits(k, d, nd))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid shape '%s' for %s: too large",
				     text, e->name);
	shape_out->ndims = nd;
	memcpy(shape_out->dims, d, nd * sizeof(d[0]));
	return FLOW_OK;
}

/* ---- running ----------------------------------------------------------------------------------- */

void flow_bench_config_init(flow_bench_config_t *cfg)
{
	cfg->iters = 5;
	cfg->warmup = 1;
	cfg->seed = 1234;
	cfg->rtol = -1.0;
	cfg->atol = -1.0;
	cfg->peak_gflops = 0.0;
}

flow_err_t flow_bench_kernel_run(flow_bench_kernel_t k,
				 const flow_bench_shape_t *shape,
				 const flow_bench_config_t *cfg,
				 flow_bench_record_t *records_out,
				 size_t *count_out, flow_diag_t *diag)
{
	const bench_kernel_t *e = kernel_entry(k);
	flow_bench_record_t recs[FLOW_BENCH_MAX_PASSES];
	bench_ctx_t c = { .k = k, .shape = shape, .cfg = cfg, .rec = recs,
			  .nrec = 0, .diag = diag };
	flow_err_t err;

	if (!e || shape->ndims < e->min_dims || shape->ndims > e->max_dims ||
	    !shape_fits(k, shape->dims, shape->ndims))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid shape for kernel '%s'",
				     e ? e->name : "?");
	if (cfg->iters == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid iteration count '0'");
	c.rtol = cfg->rtol >= 0 ? cfg->rtol : e->rtol;
	c.atol = cfg->atol >= 0 ? cfg->atol : e->atol;
	c.samples = flow_calloc(cfg->iters, sizeof(double));
	c.peer_samples = flow_calloc(cfg->iters, sizeof(double));
	if (!c.samples || !c.peer_samples) {
		flow_free(c.samples);
		flow_free(c.peer_samples);
		return flow_diag_errno(diag, FLOW_ERR_NOMEM, ENOMEM,
				       "cannot allocate 'timing samples' (%u x %zu bytes)",
				       cfg->iters, sizeof(double));
	}
	if (flow_log_enabled(FLOW_LOG_DEBUG)) {
		char s[64];
		flow_bench_shape_format(shape, s, sizeof(s));
		flow_log(FLOW_LOG_DEBUG, "benchmarking %s %s", e->name, s);
	}
	err = cfg->device == FLOW_DEVICE_CUDA ? bench_cuda(&c) : e->run(&c);
	bench_bufs_release(&c.bufs);
	flow_free(c.samples);
	flow_free(c.peer_samples);
	if (err != FLOW_OK)
		return err;
	memcpy(records_out, recs, c.nrec * sizeof(recs[0]));
	*count_out = c.nrec;
	return FLOW_OK;
}

/* ---- the machine --------------------------------------------------------------------------------- */

static void copy_env(char *dst, size_t len, const char *name)
{
	const char *v = getenv(name);
	snprintf(dst, len, "%s", v ? v : "");
}

/* True when the space-separated list has the word. */
static bool has_word(const char *list, const char *word)
{
	size_t n = strlen(word);
	for (const char *p = list; (p = strstr(p, word)) != NULL; p += n)
		if ((p == list || p[-1] == ' ') &&
		    (p[n] == ' ' || p[n] == '\n' || p[n] == '\0'))
			return true;
	return false;
}

/* The first "model name" and "flags" lines of /proc/cpuinfo (x86; "unknown"
 * and "none" elsewhere). */
static void read_cpuinfo(flow_bench_machine_t *m)
{
	static char line[8192]; /* flags lines are long; not reentrant */
	FILE *f = fopen("/proc/cpuinfo", "r");
	bool model = false, flags = false;

	snprintf(m->cpu_model, sizeof(m->cpu_model), "unknown");
	snprintf(m->simd, sizeof(m->simd), "none");
	if (!f)
		return;
	while ((!model || !flags) && fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');
		if (!colon)
			continue;
		colon++;
		while (*colon == ' ' || *colon == '\t')
			colon++;
		if (!model && strncmp(line, "model name", 10) == 0) {
			colon[strcspn(colon, "\n")] = '\0';
			snprintf(m->cpu_model, sizeof(m->cpu_model), "%s", colon);
			model = true;
		} else if (!flags && strncmp(line, "flags", 5) == 0) {
			if (has_word(colon, "avx512f"))
				snprintf(m->simd, sizeof(m->simd), "avx512f");
			else if (has_word(colon, "avx2"))
				snprintf(m->simd, sizeof(m->simd), "avx2");
			flags = true;
		}
	}
	fclose(f);
}

void flow_bench_machine_describe(flow_bench_machine_t *m)
{
	memset(m, 0, sizeof(*m));
	if (gethostname(m->host, sizeof(m->host) - 1) != 0)
		snprintf(m->host, sizeof(m->host), "unknown");
	read_cpuinfo(m);
	m->cpus = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef _OPENMP
	m->omp_threads = omp_get_max_threads();
#else
	m->omp_threads = 1;
#endif
	flow_blas_info_t blas;
	flow_blas_get_info(&blas);
	snprintf(m->blas, sizeof(m->blas), "%s",
		 blas.config[0] ? blas.config : blas.name);
	snprintf(m->blas_core, sizeof(m->blas_core), "%s", blas.core);
	m->blas_threads = blas.threads;
	/* Tools restart with the better kernels unless the user pinned others. */
	if (flow_blas_preferred_coretype())
		snprintf(m->blas_warning, sizeof(m->blas_warning),
			 "OpenBLAS runs '%s' kernels but this CPU can run '%s': OPENBLAS_CORETYPE=%s (see flow-bench(1))",
			 blas.core, blas.best_core, blas.best_core);
	copy_env(m->env_omp_num_threads, sizeof(m->env_omp_num_threads),
		 "OMP_NUM_THREADS");
	copy_env(m->env_omp_wait_policy, sizeof(m->env_omp_wait_policy),
		 "OMP_WAIT_POLICY");
	copy_env(m->env_openblas_coretype, sizeof(m->env_openblas_coretype),
		 "OPENBLAS_CORETYPE");
	copy_env(m->env_openblas_num_threads,
		 sizeof(m->env_openblas_num_threads), "OPENBLAS_NUM_THREADS");
}

/* ---- output ----------------------------------------------------------------------------------------- */

static const char *or_unset(const char *s)
{
	return s[0] ? s : "unset";
}

void flow_bench_write_machine(FILE *f, const flow_bench_machine_t *m)
{
	fprintf(f, "# flow %s (%s)\n", flow_version(), flow_features());
	fprintf(f, "# host: %s\n", m->host);
	fprintf(f, "# cpu: %s, %ld online, simd %s\n", m->cpu_model, m->cpus,
		m->simd);
	fprintf(f, "# openmp: %d threads (OMP_NUM_THREADS %s, OMP_WAIT_POLICY %s)\n",
		m->omp_threads, or_unset(m->env_omp_num_threads),
		or_unset(m->env_omp_wait_policy));
	fprintf(f, "# blas: %s; core %s; %d threads (OPENBLAS_CORETYPE %s, OPENBLAS_NUM_THREADS %s)\n",
		m->blas, m->blas_core, m->blas_threads,
		or_unset(m->env_openblas_coretype),
		or_unset(m->env_openblas_num_threads));
	if (m->blas_warning[0])
		fprintf(f, "# warning: %s\n", m->blas_warning);
}

void flow_bench_write_tsv_header(FILE *f)
{
	fputs("kernel\tpass\tshape\titers\ttime_us\tmin_us\tgflops\tgbps\t"
	      "frac_peak\tblas_gflops\tblas_ratio\tchecked\twrong\n", f);
}

/* A TSV field: the value with prec decimals, or "-" when NaN. */
static void tsv_num(FILE *f, double x, int prec)
{
	if (isnan(x))
		fputs("\t-", f);
	else
		fprintf(f, "\t%.*f", prec, x);
}

void flow_bench_write_tsv_row(FILE *f, const flow_bench_record_t *rec)
{
	fprintf(f, "%s\t%s\t%s\t%u", rec->kernel, rec->pass, rec->shape,
		rec->iters);
	tsv_num(f, rec->time_us, 1);
	tsv_num(f, rec->min_us, 1);
	tsv_num(f, rec->gflops, 2);
	tsv_num(f, rec->gbps, 2);
	tsv_num(f, rec->frac_peak, 4);
	tsv_num(f, rec->blas_gflops, 2);
	tsv_num(f, rec->blas_ratio, 3);
	fprintf(f, "\t%llu\t%llu\n", (unsigned long long)rec->checked,
		(unsigned long long)rec->wrong);
}

static void json_num(FILE *f, const char *key, double x)
{
	fprintf(f, ",\"%s\":", key);
	if (!isfinite(x))
		fputs("null", f);
	else
		fprintf(f, "%.6g", x);
}

void flow_bench_write_json_record(FILE *f, const flow_bench_record_t *rec)
{
	fputs("{\"kernel\":", f);
	flow_json_write_string(f, rec->kernel);
	fputs(",\"pass\":", f);
	flow_json_write_string(f, rec->pass);
	fputs(",\"shape\":", f);
	flow_json_write_string(f, rec->shape);
	fprintf(f, ",\"iters\":%u", rec->iters);
	json_num(f, "time_us", rec->time_us);
	json_num(f, "min_us", rec->min_us);
	json_num(f, "flop", rec->flops);
	json_num(f, "bytes", rec->bytes);
	json_num(f, "gflops", rec->gflops);
	json_num(f, "gbps", rec->gbps);
	json_num(f, "frac_peak", rec->frac_peak);
	json_num(f, "blas_gflops", rec->blas_gflops);
	json_num(f, "blas_ratio", rec->blas_ratio);
	json_num(f, "rtol", rec->rtol);
	json_num(f, "atol", rec->atol);
	fprintf(f, ",\"checked\":%llu,\"wrong\":%llu}",
		(unsigned long long)rec->checked,
		(unsigned long long)rec->wrong);
}

static void json_str(FILE *f, const char *key, const char *value, bool first)
{
	fprintf(f, "%s\"%s\":", first ? "" : ",", key);
	flow_json_write_string(f, value);
}

void flow_bench_write_json_machine(FILE *f, const flow_bench_machine_t *m)
{
	fputc('{', f);
	json_str(f, "flow_version", flow_version(), true);
	json_str(f, "features", flow_features(), false);
	json_str(f, "host", m->host, false);
	json_str(f, "cpu", m->cpu_model, false);
	fprintf(f, ",\"cpus\":%ld,\"omp_threads\":%d", m->cpus, m->omp_threads);
	json_str(f, "simd", m->simd, false);
	json_str(f, "blas", m->blas, false);
	json_str(f, "blas_core", m->blas_core, false);
	fprintf(f, ",\"blas_threads\":%d", m->blas_threads);
	json_str(f, "blas_warning", m->blas_warning, false);
	json_str(f, "OMP_NUM_THREADS", m->env_omp_num_threads, false);
	json_str(f, "OMP_WAIT_POLICY", m->env_omp_wait_policy, false);
	json_str(f, "OPENBLAS_CORETYPE", m->env_openblas_coretype, false);
	json_str(f, "OPENBLAS_NUM_THREADS", m->env_openblas_num_threads, false);
	fputc('}', f);
}
