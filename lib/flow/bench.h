/* Benchmarks of the CPU kernels (the library half of flow-bench(1)).
 *
 * A benchmark runs one kernel of flow/kernels.h on one shape: it fills the
 * inputs with Philox random numbers (flow/rng.h), checks the kernel's result
 * against the reference path (flow/kernels_ref.h) and counts the elements
 * outside |got - ref| <= atol + rtol * |ref|, then times warmup + iters
 * calls with CLOCK_MONOTONIC and keeps the median and the minimum.  Each
 * pass of the kernel (fwd, bwd, ...) gives one record; the tool prints the
 * records as TSV or JSON.  Nothing here prints: errors go into a flow_diag_t.
 *
 * The FLOP and byte counts behind every derived column are defined, kernel by
 * kernel, in flow-bench(1), section OUTPUT.  Not thread-safe: a benchmark
 * uses the calling thread's OpenMP team and the BLAS thread pool. */
#ifndef FLOW_BENCH_H
#define FLOW_BENCH_H

#include <stdio.h>

#include <flow/device.h>
#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- statistics and checking ------------------------------------------------ */

/* Sort samples[0..n) in place and return their median (the mean of the two
 * middle values when n is even) in *median_out and the smallest in *min_out.
 * n == 0 gives NaN for both. */
FLOW_EXPORT void flow_bench_median_min(double *samples, size_t n,
				       double *median_out, double *min_out);

/* Number of i < n with |got[i] - ref[i]| > atol + rtol * |ref[i]|; a NaN or
 * infinity in got where ref is finite counts as wrong.  rtol = atol = 0
 * demands bitwise-equal values (with -0 == +0). */
FLOW_EXPORT uint64_t flow_bench_count_wrong(const float *got, const float *ref,
					    size_t n, double rtol, double atol);

/* ---- kernels and shapes -------------------------------------------------------- */

typedef enum {
	FLOW_BENCH_PEAK = 0,   /* cblas_sgemm N x N x N: the machine's ceiling */
	FLOW_BENCH_MATMUL,
	FLOW_BENCH_EMBEDDING,
	FLOW_BENCH_LAYERNORM,
	FLOW_BENCH_GELU,
	FLOW_BENCH_ATTENTION,
	FLOW_BENCH_RESIDUAL,
	FLOW_BENCH_CROSSENTROPY,
	FLOW_BENCH_ADAMW,
	FLOW_BENCH_GRADNORM,
	FLOW_BENCH_RESLN, /* the residual add and layernorm fused, against
			   * the two kernels in turn */
	FLOW_BENCH_MATMUL_BF16, /* the matmul's bf16 twin (bf16 activations,
				 * flow/kernels.h), against the fp32 sgemms */
	FLOW_BENCH_ATTENTION_BF16, /* the attention's bf16 twin */
	FLOW_BENCH_NKERNELS
} flow_bench_kernel_t;

/* "peak", "matmul", ..., "crossentropy", "adamw", "gradnorm"; NULL for a
 * value out of range.  Static. */
FLOW_EXPORT const char *flow_bench_kernel_name(flow_bench_kernel_t k);
/* The --shape syntax of a kernel, e.g. "N,IN,OUT"; static. */
FLOW_EXPORT const char *flow_bench_kernel_shape_syntax(flow_bench_kernel_t k);
/* Look a kernel up by name.  FLOW_OK and *k_out, or FLOW_ERR_USAGE with
 * "unknown kernel 'NAME'" in diag. */
FLOW_EXPORT flow_err_t flow_bench_kernel_lookup(const char *name,
						flow_bench_kernel_t *k_out,
						flow_diag_t *diag)
	FLOW_MUST_CHECK;

#define FLOW_BENCH_MAX_DIMS 4

/* A shape: the kernel's sizes in the order of its --shape syntax. */
typedef struct flow_bench_shape {
	size_t ndims;
	uint64_t dims[FLOW_BENCH_MAX_DIMS];
} flow_bench_shape_t;

/* Parse a --shape value for kernel k: sizes separated by ',' or 'x' (see
 * flow_parse_dims), as many as the kernel's syntax says (gradnorm: N or
 * N,K), each >= 1, with the kernel's constraints (attention: NH divides C;
 * crossentropy: V <= VP; embedding: V <= 2^31; gradnorm: K <= N) and every
 * buffer's byte size representable.  FLOW_OK and *shape_out, or
 * FLOW_ERR_USAGE with e.g. "invalid shape '768,64' for attention: expected
 * B,T,C,NH" in diag. */
FLOW_EXPORT flow_err_t flow_bench_shape_parse(flow_bench_kernel_t k,
					      const char *text,
					      flow_bench_shape_t *shape_out,
					      flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* The default shapes of kernel k (GPT-2 124M sizes, see flow-bench(1)):
 * returns their number and points *shapes_out at a static array. */
FLOW_EXPORT size_t flow_bench_default_shapes(flow_bench_kernel_t k,
					     const flow_bench_shape_t **shapes_out);

/* Write "D1xD2x..." into buf (always NUL-terminated when len > 0). */
FLOW_EXPORT void flow_bench_shape_format(const flow_bench_shape_t *shape,
					 char *buf, size_t len);

/* ---- configuration ------------------------------------------------------------- */

typedef struct flow_bench_config {
	unsigned iters;     /* timed calls per pass, >= 1 */
	unsigned warmup;    /* untimed calls before them */
	uint64_t seed;      /* Philox seed of every input */
	double rtol, atol;  /* tolerance; negative: the kernel's default */
	double peak_gflops; /* sgemm ceiling for frac_peak; <= 0: unknown */
	/* Where the kernels run [cpu]; cuda: peak and matmul only, against
	 * cuBLAS's own sgemm (the blas_* columns), on the current device. */
	flow_device_kind_t device;
} flow_bench_config_t;

/* Defaults: iters 5, warmup 1, seed 1234, per-kernel tolerances, peak
 * unknown. */
FLOW_EXPORT void flow_bench_config_init(flow_bench_config_t *cfg);

/* The default tolerance of kernel k (flow-bench(1) lists them). */
FLOW_EXPORT void flow_bench_default_tolerance(flow_bench_kernel_t k,
					      double *rtol_out,
					      double *atol_out);

/* ---- records --------------------------------------------------------------------- */

/* One kernel pass on one shape.  Rates use the median time; a column that
 * does not apply is NaN (printed "-" in TSV and null in JSON). */
typedef struct flow_bench_record {
	char kernel[16];    /* "matmul" */
	char pass[8];       /* "fwd", "bwd", "fused", "update", "clip", "sgemm" */
	char shape[64];     /* "256x768x2304" */
	unsigned iters;
	double time_us;     /* median time of one call, microseconds */
	double min_us;      /* fastest call */
	double flops;       /* FLOP of one call (formula in flow-bench(1)) */
	double bytes;       /* minimum bytes moved by one call */
	double gflops;      /* flops / time_us / 1e3 */
	double gbps;        /* bytes / time_us / 1e3 */
	double frac_peak;   /* gflops / peak GFLOP/s */
	double blas_gflops; /* matmul: cblas_sgemm on the same GEMMs */
	double blas_ratio;  /* matmul: gflops / blas_gflops */
	double rtol, atol;  /* tolerance the check used */
	uint64_t checked;   /* elements compared with the reference */
	uint64_t wrong;     /* elements outside the tolerance */
} flow_bench_record_t;

#define FLOW_BENCH_MAX_PASSES 2

/* Benchmark kernel k on shape: writes one record per pass of the kernel to
 * records_out[0 .. *count_out), at most FLOW_BENCH_MAX_PASSES.  For
 * FLOW_BENCH_PEAK, frac_peak is the ratio of the record's median rate to its
 * own best (min_us) rate, which is the ceiling flow_bench_peak_gflops()
 * returns.  Wrong elements are not an error: they are counted in the
 * records.  Returns FLOW_OK, FLOW_ERR_NOMEM (diag names the buffer), or
 * FLOW_ERR_USAGE for a shape that does not fit the kernel. */
FLOW_EXPORT flow_err_t flow_bench_kernel_run(flow_bench_kernel_t k,
					     const flow_bench_shape_t *shape,
					     const flow_bench_config_t *cfg,
					     flow_bench_record_t *records_out,
					     size_t *count_out,
					     flow_diag_t *diag) FLOW_MUST_CHECK;

/* The sgemm ceiling a FLOW_BENCH_PEAK record measured: flops / min_us /
 * 1e3, GFLOP/s. */
FLOW_EXPORT double flow_bench_peak_gflops(const flow_bench_record_t *rec);

/* ---- the machine ------------------------------------------------------------------ */

typedef struct flow_bench_machine {
	char host[64];
	char cpu_model[128];   /* /proc/cpuinfo "model name", or "unknown" */
	long cpus;             /* online CPUs */
	int omp_threads;       /* omp_get_max_threads(), 1 without OpenMP */
	char blas[256];        /* openblas_get_config(), or "cblas" */
	char blas_core[64];    /* openblas_get_corename(), or "unknown" */
	int blas_threads;      /* openblas_get_num_threads(), or 0: unknown */
	char simd[16];         /* widest of "avx512f", "avx2", "none" in the
				* CPU flags */
	/* Non-empty when the BLAS kernels do not use the CPU's widest SIMD,
	 * e.g. OpenBLAS falling back to 'Prescott' on a CPU it does not know:
	 * one sentence, for a warning. */
	char blas_warning[192];
	/* Environment that changes the numbers; "" when unset. */
	char env_omp_num_threads[32];
	char env_omp_wait_policy[32];
	char env_openblas_coretype[32];
	char env_openblas_num_threads[32];
} flow_bench_machine_t;

/* Describe this machine and process.  Cannot fail: what cannot be read is
 * reported as "unknown". */
FLOW_EXPORT void flow_bench_machine_describe(flow_bench_machine_t *m);

/* ---- output ------------------------------------------------------------------------- */

/* '#' lines: flow version and features, host, CPU, OpenMP, BLAS and the
 * environment variables of flow_bench_machine_t. */
FLOW_EXPORT void flow_bench_write_machine(FILE *f,
					  const flow_bench_machine_t *m);
/* The TSV header line, then one row per record (flow-bench(1), OUTPUT). */
FLOW_EXPORT void flow_bench_write_tsv_header(FILE *f);
FLOW_EXPORT void flow_bench_write_tsv_row(FILE *f,
					  const flow_bench_record_t *rec);
/* One record as a JSON object (no trailing newline). */
FLOW_EXPORT void flow_bench_write_json_record(FILE *f,
					      const flow_bench_record_t *rec);
/* The machine as a JSON object (no trailing newline). */
FLOW_EXPORT void flow_bench_write_json_machine(FILE *f,
					       const flow_bench_machine_t *m);

#ifdef __cplusplus
}
#endif

#endif
