/* The benchmark module (flow/bench.h): statistics, the wrong-element count,
 * kernel and shape parsing, tiny benchmark runs of every kernel that must
 * pass their check, the wrong-count path, and the output writers. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <flow/bench.h>

static void test_bench_median_min_odd_even_and_empty(void **state)
{
	double odd[5] = { 5, 1, 4, 2, 3 }, even[4] = { 8, 2, 6, 4 };
	double med, min;

	flow_bench_median_min(odd, 5, &med, &min);
	assert_true(med == 3.0 && min == 1.0);
	flow_bench_median_min(even, 4, &med, &min);
	assert_true(med == 5.0 && min == 2.0);
	flow_bench_median_min(even, 0, &med, &min);
	assert_true(isnan(med) && isnan(min));
}

static void test_bench_count_wrong_applies_atol_plus_rtol(void **state)
{
	const float ref[4] = { 1.0f, 100.0f, 0.0f, -2.0f };
	const float got[4] = { 1.05f, 104.0f, 0.01f, -2.0f };

	/* tolerance atol + rtol*|ref|: 0.02 + 0.05*|ref| */
	assert_int_equal(flow_bench_count_wrong(got, ref, 4, 0.05, 0.02), 0);
	assert_int_equal(flow_bench_count_wrong(got, ref, 4, 0.02, 0.02), 2);
	/* Zero tolerance: only bitwise-equal values pass. */
	assert_int_equal(flow_bench_count_wrong(got, ref, 4, 0.0, 0.0), 3);
	assert_int_equal(flow_bench_count_wrong(ref, ref, 4, 0.0, 0.0), 0);
}

static void test_bench_count_wrong_counts_nan_and_inf(void **state)
{
	const float ref[3] = { 1.0f, 1.0f, INFINITY };
	const float got[3] = { NAN, INFINITY, INFINITY };

	assert_int_equal(flow_bench_count_wrong(got, ref, 3, 1.0, 1.0), 2);
}

static void test_bench_kernel_lookup_knows_every_name(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_bench_kernel_t k;

	for (int i = 0; i < FLOW_BENCH_NKERNELS; i++) {
		const char *name = flow_bench_kernel_name((flow_bench_kernel_t)i);
		assert_non_null(name);
		assert_int_equal(flow_bench_kernel_lookup(name, &k, &diag),
				 FLOW_OK);
		assert_int_equal(k, i);
	}
	assert_int_equal(flow_bench_kernel_lookup("crossentropy", &k, &diag),
			 FLOW_OK);
	assert_int_equal(k, FLOW_BENCH_CROSSENTROPY);
	assert_int_equal(flow_bench_kernel_lookup("matmull", &k, &diag),
			 FLOW_ERR_USAGE);
	assert_string_equal(diag.msg, "unknown kernel 'matmull'");
	assert_null(flow_bench_kernel_name(FLOW_BENCH_NKERNELS));
}

static void test_bench_shape_parse_accepts_commas_and_x(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_bench_shape_t s;
	char buf[64];

	assert_int_equal(flow_bench_shape_parse(FLOW_BENCH_MATMUL, "256,768,2304",
						&s, &diag), FLOW_OK);
	assert_int_equal(s.ndims, 3);
	assert_true(s.dims[0] == 256 && s.dims[1] == 768 && s.dims[2] == 2304);
	flow_bench_shape_format(&s, buf, sizeof(buf));
	assert_string_equal(buf, "256x768x2304");
	assert_int_equal(flow_bench_shape_parse(FLOW_BENCH_ATTENTION, "2x8x64x4",
						&s, &diag), FLOW_OK);
	assert_int_equal(flow_bench_shape_parse(FLOW_BENCH_GRADNORM, "100",
						&s, &diag), FLOW_OK);
	assert_int_equal(s.ndims, 1);
	assert_int_equal(flow_bench_shape_parse(FLOW_BENCH_GRADNORM, "100,7",
						&s, &diag), FLOW_OK);
	assert_int_equal(s.ndims, 2);
}

static void expect_bad_shape(flow_bench_kernel_t k, const char *text,
			     const char *msg)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_bench_shape_t s;

	assert_int_equal(flow_bench_shape_parse(k, text, &s, &diag),
			 FLOW_ERR_USAGE);
	if (msg)
		assert_string_equal(diag.msg, msg);
}

static void test_bench_shape_parse_rejects_bad_shapes(void **state)
{
	expect_bad_shape(FLOW_BENCH_MATMUL, "256,768",
			 "invalid shape '256,768' for matmul: expected N,IN,OUT");
	expect_bad_shape(FLOW_BENCH_MATMUL, "256,768,2304,1", NULL);
	expect_bad_shape(FLOW_BENCH_MATMUL, "256,768,23x", NULL);
	expect_bad_shape(FLOW_BENCH_MATMUL, "0,768,2304", NULL);
	expect_bad_shape(FLOW_BENCH_MATMUL, "-1,768,2304", NULL);
	expect_bad_shape(FLOW_BENCH_MATMUL, "", NULL);
	expect_bad_shape(FLOW_BENCH_ATTENTION, "1,8,64,5",
			 "invalid shape '1,8,64,5' for attention: NH must divide C");
	expect_bad_shape(FLOW_BENCH_CROSSENTROPY, "4,10,8", NULL);
	expect_bad_shape(FLOW_BENCH_GRADNORM, "4,5", NULL);
	expect_bad_shape(FLOW_BENCH_MATMUL, "4294967296,4294967296,4294967296",
			 NULL);
}

static void test_bench_default_shapes_are_valid(void **state)
{
	for (int k = 0; k < FLOW_BENCH_NKERNELS; k++) {
		const flow_bench_shape_t *shapes = NULL;
		size_t n = flow_bench_default_shapes((flow_bench_kernel_t)k,
						     &shapes);
		assert_true(n >= 1);
		for (size_t i = 0; i < n; i++) {
			flow_diag_t diag = FLOW_DIAG_INIT;
			flow_bench_shape_t s;
			char text[64];
			flow_bench_shape_format(&shapes[i], text, sizeof(text));
			assert_int_equal(flow_bench_shape_parse((flow_bench_kernel_t)k,
								text, &s, &diag),
					 FLOW_OK);
		}
	}
}

/* A tiny shape for each kernel: small enough to run in milliseconds, with
 * sizes that are not multiples of any vector width. */
static const char *const tiny_shapes[FLOW_BENCH_NKERNELS] = {
	[FLOW_BENCH_PEAK] = "33",
	[FLOW_BENCH_MATMUL] = "13,37,29",
	[FLOW_BENCH_EMBEDDING] = "2,5,24,11",
	[FLOW_BENCH_LAYERNORM] = "7,33",
	[FLOW_BENCH_GELU] = "1001",
	[FLOW_BENCH_ATTENTION] = "2,7,24,3",
	[FLOW_BENCH_RESIDUAL] = "1001",
	[FLOW_BENCH_CROSSENTROPY] = "9,37,40",
	[FLOW_BENCH_ADAMW] = "1001",
	[FLOW_BENCH_GRADNORM] = "1001,3",
	[FLOW_BENCH_RESLN] = "7,33",
	[FLOW_BENCH_MATMUL_BF16] = "13,37,29",
	[FLOW_BENCH_ATTENTION_BF16] = "2,7,24,3",
};

static void test_bench_every_kernel_passes_on_a_tiny_shape(void **state)
{
	flow_bench_config_t cfg;

	flow_bench_config_init(&cfg);
	cfg.iters = 3;
	cfg.warmup = 1;
	cfg.peak_gflops = 100.0;
	for (int k = 0; k < FLOW_BENCH_NKERNELS; k++) {
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_bench_record_t recs[FLOW_BENCH_MAX_PASSES];
		flow_bench_shape_t s;
		size_t n = 0;

		assert_int_equal(flow_bench_shape_parse((flow_bench_kernel_t)k,
							tiny_shapes[k], &s,
							&diag), FLOW_OK);
		assert_int_equal(flow_bench_kernel_run((flow_bench_kernel_t)k,
						       &s, &cfg, recs, &n, &diag),
				 FLOW_OK);
		assert_true(n >= 1 && n <= FLOW_BENCH_MAX_PASSES);
		for (size_t r = 0; r < n; r++) {
			if (recs[r].wrong)
				fail_msg("%s %s %s: %llu of %llu wrong",
					 recs[r].kernel, recs[r].pass,
					 recs[r].shape,
					 (unsigned long long)recs[r].wrong,
					 (unsigned long long)recs[r].checked);
			assert_string_equal(recs[r].kernel,
					    flow_bench_kernel_name((flow_bench_kernel_t)k));
			assert_true(recs[r].checked > 0);
			assert_int_equal(recs[r].iters, 3);
			assert_true(recs[r].min_us <= recs[r].time_us);
			assert_true(recs[r].flops > 0 && recs[r].bytes > 0);
			assert_false(isnan(recs[r].frac_peak));
		}
	}
}

static void test_bench_matmul_reports_blas_rate_and_ratio(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_bench_config_t cfg;
	flow_bench_record_t recs[FLOW_BENCH_MAX_PASSES];
	flow_bench_shape_t s;
	size_t n = 0;

	flow_bench_config_init(&cfg);
	cfg.iters = 2;
	assert_int_equal(flow_bench_shape_parse(FLOW_BENCH_MATMUL, "16x32x24",
						&s, &diag), FLOW_OK);
	assert_int_equal(flow_bench_kernel_run(FLOW_BENCH_MATMUL, &s, &cfg,
					       recs, &n, &diag), FLOW_OK);
	assert_int_equal(n, 2);
	assert_string_equal(recs[0].pass, "fwd");
	assert_string_equal(recs[1].pass, "bwd");
	for (int r = 0; r < 2; r++) {
		assert_true(recs[r].blas_gflops > 0);
		assert_true(fabs(recs[r].blas_ratio -
				 recs[r].gflops / recs[r].blas_gflops) < 1e-9);
		assert_true(isnan(recs[r].frac_peak)); /* no peak given */
	}
	assert_true(recs[0].flops == 2.0 * 16 * 32 * 24);
	assert_true(recs[1].flops == 4.0 * 16 * 32 * 24);
}

static void test_bench_zero_tolerance_finds_wrong_gemm_elements(void **state)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_bench_config_t cfg;
	flow_bench_record_t recs[FLOW_BENCH_MAX_PASSES];
	flow_bench_shape_t s;
	size_t n = 0;

	/* fp32 GEMM sums of 768 products are not all bitwise equal to the
	 * double-precision reference rounded once. */
	flow_bench_config_init(&cfg);
	cfg.iters = 1;
	cfg.warmup = 0;
	cfg.rtol = 0.0;
	cfg.atol = 0.0;
	assert_int_equal(flow_bench_shape_parse(FLOW_BENCH_MATMUL, "8,768,64",
						&s, &diag), FLOW_OK);
	assert_int_equal(flow_bench_kernel_run(FLOW_BENCH_MATMUL, &s, &cfg,
					       recs, &n, &diag), FLOW_OK);
	assert_true(recs[0].wrong > 0);
	assert_true(recs[0].wrong <= recs[0].checked);
	assert_true(recs[0].rtol == 0.0 && recs[0].atol == 0.0);
}

static void test_bench_peak_gflops_is_the_best_rate(void **state)
{
	flow_bench_record_t rec;

	memset(&rec, 0, sizeof(rec));
	rec.flops = 2e9;
	rec.min_us = 1e4;  /* 2e9 FLOP in 10 ms */
	rec.time_us = 2e4;
	assert_true(fabs(flow_bench_peak_gflops(&rec) - 200.0) < 1e-9);
}

static void test_bench_machine_describe_fills_every_field(void **state)
{
	flow_bench_machine_t m;

	flow_bench_machine_describe(&m);
	assert_true(m.cpu_model[0] != '\0');
	assert_true(m.blas[0] != '\0');
	assert_true(m.blas_core[0] != '\0');
	assert_true(m.cpus >= 1);
	assert_true(m.omp_threads >= 1);
}

/* Everything a writer produces, as a string (free it). */
static char *capture(void (*write)(FILE *f, const void *arg), const void *arg)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	write(f, arg);
	fclose(f);
	return buf;
}

static void write_row(FILE *f, const void *arg)
{
	flow_bench_write_tsv_row(f, arg);
}

static void write_record(FILE *f, const void *arg)
{
	flow_bench_write_json_record(f, arg);
}

static void test_bench_writers_escape_and_mark_missing_values(void **state)
{
	flow_bench_record_t rec;
	char *s;

	memset(&rec, 0, sizeof(rec));
	snprintf(rec.kernel, sizeof(rec.kernel), "gelu");
	snprintf(rec.pass, sizeof(rec.pass), "fwd");
	snprintf(rec.shape, sizeof(rec.shape), "10");
	rec.iters = 3;
	rec.time_us = 2.0;
	rec.min_us = 1.0;
	rec.gflops = 0.5;
	rec.gbps = 4.0;
	rec.frac_peak = NAN;
	rec.blas_gflops = NAN;
	rec.blas_ratio = NAN;
	rec.checked = 10;
	rec.wrong = 1;
	s = capture(write_row, &rec);
	assert_string_equal(s, "gelu\tfwd\t10\t3\t2.0\t1.0\t0.50\t4.00\t-\t-\t-\t10\t1\n");
	free(s);
	s = capture(write_record, &rec);
	assert_non_null(strstr(s, "\"frac_peak\":null"));
	assert_non_null(strstr(s, "\"wrong\":1}"));
	free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bench_median_min_odd_even_and_empty),
		cmocka_unit_test(test_bench_count_wrong_applies_atol_plus_rtol),
		cmocka_unit_test(test_bench_count_wrong_counts_nan_and_inf),
		cmocka_unit_test(test_bench_kernel_lookup_knows_every_name),
		cmocka_unit_test(test_bench_shape_parse_accepts_commas_and_x),
		cmocka_unit_test(test_bench_shape_parse_rejects_bad_shapes),
		cmocka_unit_test(test_bench_default_shapes_are_valid),
		cmocka_unit_test(test_bench_every_kernel_passes_on_a_tiny_shape),
		cmocka_unit_test(test_bench_matmul_reports_blas_rate_and_ratio),
		cmocka_unit_test(test_bench_zero_tolerance_finds_wrong_gemm_elements),
		cmocka_unit_test(test_bench_peak_gflops_is_the_best_rate),
		cmocka_unit_test(test_bench_machine_describe_fills_every_field),
		cmocka_unit_test(test_bench_writers_escape_and_mark_missing_values),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
