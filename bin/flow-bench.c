/* flow-bench: measure this machine and flow's kernels on it.
 *
 * One program, several modes ("flow-bench MODE ..."); a mode is one entry of
 * the modes[] table: its name, a validation function (usage errors, exit 2)
 * and a run function (calls libflow, writes the records, returns the exit
 * status).  The measuring itself lives in lib/bench.c (flow/bench.h). */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/bench.h>
#include <flow/log.h>

#include "tool.h"

static const char help_text[] =
	"Usage: flow-bench kernel NAME [options]\n"
	"Benchmark flow's CPU kernels against the BLAS and check every result\n"
	"against the reference kernels.  Writes '#' comment lines and TSV rows\n"
	"(or one JSON document with --json) to standard output.\n"
	"\n"
	"Modes:\n"
	"  kernel NAME        benchmark kernel NAME, each pass (fwd, bwd, ...)\n"
	"\n"
	"Kernels (NAME) and their --shape syntax:\n"
	"  peak          N          cblas_sgemm N x N x N, the GFLOP/s ceiling\n"
	"  matmul        N,IN,OUT   out[N,OUT] = inp[N,IN] . weight^T + bias\n"
	"  embedding     B,T,C,V    token + position embedding\n"
	"  layernorm     N,C        layer normalisation of N rows of C\n"
	"  gelu          N          tanh GELU of N elements\n"
	"  attention     B,T,C,NH   causal self-attention, NH heads\n"
	"  residual      N          residual add of N elements\n"
	"  crossentropy  N,V,VP     fused softmax cross-entropy, V of VP columns\n"
	"  adamw         N          AdamW update of N parameters\n"
	"  gradnorm      N[,K]      global norm clipping, N floats in K tensors\n"
	"  all                      every kernel above with its default shapes\n"
	"\n"
	"Options:\n"
	"      --shape SPEC       benchmark this shape instead of the defaults\n"
	"                         (repeatable; sizes separated by ',' or 'x')\n"
	"      --iters N          timed calls per pass [5]\n"
	"      --warmup N         untimed calls before them [1]\n"
	"      --seed N           seed of the random inputs [1234]\n"
	"      --rtol X           relative tolerance of the check [per kernel]\n"
	"      --atol X           absolute tolerance of the check [per kernel];\n"
	"                         --rtol 0 --atol 0 demands bitwise equality\n"
	"      --peak-gflops X    use X GFLOP/s as the ceiling for frac_peak\n"
	"                         instead of measuring it\n"
	"  -v, --verbose          more messages on stderr (repeatable)\n"
	"  -q, --quiet            fewer messages on stderr\n"
	"      --json             write one JSON document instead of TSV\n"
	"  -h, --help             show this help and exit\n"
	"      --version          show the version and build features and exit\n"
	"\n"
	"Exit status: 0 all results correct, 1 a run-time failure or wrong\n"
	"results, 2 a usage error.  See flow-bench(1).\n";

enum {
	OPT_SHAPE = FLOW_OPT_TOOL,
	OPT_ITERS,
	OPT_WARMUP,
	OPT_SEED,
	OPT_RTOL,
	OPT_ATOL,
	OPT_PEAK_GFLOPS,
};

static const struct option long_options[] = {
	FLOW_COMMON_OPTIONS,
	{ "shape", required_argument, NULL, OPT_SHAPE },
	{ "iters", required_argument, NULL, OPT_ITERS },
	{ "warmup", required_argument, NULL, OPT_WARMUP },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "rtol", required_argument, NULL, OPT_RTOL },
	{ "atol", required_argument, NULL, OPT_ATOL },
	{ "peak-gflops", required_argument, NULL, OPT_PEAK_GFLOPS },
	{ NULL, 0, NULL, 0 },
};

#define MAX_SHAPES 64

typedef struct bench_opts {
	flow_bench_config_t cfg;
	const char *shape_text[MAX_SHAPES];
	size_t nshape_text;
	/* Positional arguments after the mode. */
	char **args;
	int nargs;
	/* Filled by the mode's validation. */
	flow_bench_kernel_t kernels[FLOW_BENCH_NKERNELS];
	size_t nkernels;
	flow_bench_shape_t shapes[MAX_SHAPES];
	size_t nshapes;
} bench_opts_t;

typedef struct bench_mode {
	const char *name;
	void (*validate)(const flow_tool_t *tool, bench_opts_t *o);
	int (*run)(const flow_tool_t *tool, bench_opts_t *o);
} bench_mode_t;

/* ---- mode "kernel" ---------------------------------------------------------- */

static void kernel_validate(const flow_tool_t *tool, bench_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_bench_kernel_t k;

	if (o->nargs < 1)
		flow_tool_usage_error(tool, "missing kernel name after 'kernel'");
	if (o->nargs > 1)
		flow_tool_usage_error(tool, "unexpected argument '%s'",
				      o->args[1]);
	if (strcmp(o->args[0], "all") == 0) {
		if (o->nshape_text)
			flow_tool_usage_error(tool,
					      "option '--shape' cannot be used with kernel 'all'");
		for (int i = 0; i < FLOW_BENCH_NKERNELS; i++)
			o->kernels[o->nkernels++] = (flow_bench_kernel_t)i;
		return;
	}
	if (flow_bench_kernel_lookup(o->args[0], &k, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s", flow_diag_message(&diag));
	if (k == FLOW_BENCH_PEAK && o->cfg.peak_gflops > 0)
		flow_tool_usage_error(tool,
				      "option '--peak-gflops' cannot be used with kernel 'peak'");
	o->kernels[o->nkernels++] = k;
	for (size_t i = 0; i < o->nshape_text; i++)
		if (flow_bench_shape_parse(k, o->shape_text[i],
					   &o->shapes[o->nshapes++],
					   &diag) != FLOW_OK)
			flow_tool_usage_error(tool, "%s",
					      flow_diag_message(&diag));
}

/* Writes records as they are measured: TSV rows, or the members of the
 * "records" array of the JSON document. */
typedef struct bench_out {
	const flow_tool_t *tool;
	size_t nrecords;
	uint64_t wrong;
} bench_out_t;

static void emit_record(bench_out_t *out, const flow_bench_record_t *rec)
{
	if (out->tool->json) {
		fputs(out->nrecords ? ",\n" : "\n", stdout);
		flow_bench_write_json_record(stdout, rec);
	} else {
		flow_bench_write_tsv_row(stdout, rec);
	}
	out->nrecords++;
	out->wrong += rec->wrong;
	if (rec->wrong)
		flow_tool_error(out->tool,
				"wrong results '%s %s %s': %llu of %llu elements outside atol %g + rtol %g * |ref|",
				rec->kernel, rec->pass, rec->shape,
				(unsigned long long)rec->wrong,
				(unsigned long long)rec->checked, rec->atol,
				rec->rtol);
}

static void write_config(const bench_opts_t *o, bool peak_measured)
{
	const flow_bench_config_t *cfg = &o->cfg;

	printf("# config: mode kernel, iters %u, warmup %u, seed %llu, ",
	       cfg->iters, cfg->warmup, (unsigned long long)cfg->seed);
	if (peak_measured)
		printf("peak measured\n");
	else
		printf("peak given %.2f GFLOP/s\n", cfg->peak_gflops);
	for (size_t i = 0; i < o->nkernels; i++) {
		flow_bench_kernel_t k = o->kernels[i];
		const flow_bench_shape_t *shapes = o->shapes;
		size_t n = o->nshapes;
		double rtol, atol;
		char s[64];

		if (n == 0)
			n = flow_bench_default_shapes(k, &shapes);
		flow_bench_default_tolerance(k, &rtol, &atol);
		if (cfg->rtol >= 0)
			rtol = cfg->rtol;
		if (cfg->atol >= 0)
			atol = cfg->atol;
		printf("# kernel %s: rtol %g, atol %g, shapes (%s)%s",
		       flow_bench_kernel_name(k), rtol, atol,
		       flow_bench_kernel_shape_syntax(k),
		       o->nshapes ? "" : " default");
		for (size_t j = 0; j < n; j++) {
			flow_bench_shape_format(&shapes[j], s, sizeof(s));
			printf(" %s", s);
		}
		putchar('\n');
	}
}

static void write_json_head(const flow_bench_machine_t *m,
			    const bench_opts_t *o)
{
	fputs("{\"tool\":\"flow-bench\",\"mode\":\"kernel\",\"machine\":", stdout);
	flow_bench_write_json_machine(stdout, m);
	printf(",\"config\":{\"iters\":%u,\"warmup\":%u,\"seed\":%llu",
	       o->cfg.iters, o->cfg.warmup, (unsigned long long)o->cfg.seed);
	if (o->cfg.peak_gflops > 0)
		printf(",\"peak_gflops\":%.6g}", o->cfg.peak_gflops);
	else
		fputs(",\"peak_gflops\":null}", stdout);
	fputs(",\"records\":[", stdout);
}

static int kernel_run(const flow_tool_t *tool, bench_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_bench_machine_t machine;
	flow_bench_record_t recs[FLOW_BENCH_MAX_PASSES];
	bench_out_t out = { .tool = tool, .nrecords = 0, .wrong = 0 };
	flow_bench_config_t *cfg = &o->cfg;
	size_t nrec;
	/* The ceiling comes from a peak run first, unless given or unused. */
	bool peak_given = cfg->peak_gflops > 0;
	bool peak_first = !peak_given && o->kernels[0] != FLOW_BENCH_PEAK;
	double peak = 0.0;

	flow_bench_machine_describe(&machine);
	if (machine.blas_warning[0])
		flow_log(FLOW_LOG_WARN, "%s", machine.blas_warning);
	if (tool->json) {
		write_json_head(&machine, o);
	} else {
		flow_bench_write_machine(stdout, &machine);
		write_config(o, !peak_given);
		flow_bench_write_tsv_header(stdout);
	}
	if (peak_first) {
		const flow_bench_shape_t *ps;
		flow_bench_default_shapes(FLOW_BENCH_PEAK, &ps);
		if (flow_bench_kernel_run(FLOW_BENCH_PEAK, ps, cfg, recs, &nrec,
					  &diag) != FLOW_OK)
			return flow_tool_fail(tool, &diag);
		emit_record(&out, &recs[0]);
		cfg->peak_gflops = flow_bench_peak_gflops(&recs[0]);
	}
	for (size_t i = 0; i < o->nkernels; i++) {
		flow_bench_kernel_t k = o->kernels[i];
		const flow_bench_shape_t *shapes = o->shapes;
		size_t nshapes = o->nshapes;

		if (nshapes == 0)
			nshapes = flow_bench_default_shapes(k, &shapes);
		for (size_t j = 0; j < nshapes; j++) {
			if (flow_bench_kernel_run(k, &shapes[j], cfg, recs,
						  &nrec, &diag) != FLOW_OK)
				return flow_tool_fail(tool, &diag);
			for (size_t r = 0; r < nrec; r++) {
				emit_record(&out, &recs[r]);
				if (k == FLOW_BENCH_PEAK)
					peak = fmax(peak, flow_bench_peak_gflops(&recs[r]));
			}
		}
		/* 'all' measures the peak first and uses it for the rest,
		 * unless --peak-gflops gave the ceiling. */
		if (k == FLOW_BENCH_PEAK && !peak_given)
			cfg->peak_gflops = peak;
	}
	if (tool->json) {
		fputs("\n],\"peak_gflops\":", stdout);
		if (cfg->peak_gflops > 0)
			printf("%.6g", cfg->peak_gflops);
		else
			fputs("null", stdout);
		printf(",\"wrong\":%llu,\"result\":\"%s\"}\n",
		       (unsigned long long)out.wrong, out.wrong ? "FAIL" : "PASS");
	} else {
		if (cfg->peak_gflops > 0)
			printf("# peak_gflops: %.2f\n", cfg->peak_gflops);
		if (out.wrong)
			printf("# FAIL: %llu wrong\n",
			       (unsigned long long)out.wrong);
		else
			printf("# PASS\n");
	}
	return out.wrong ? 1 : 0;
}

/* ---- modes ------------------------------------------------------------------ */

static const bench_mode_t modes[] = {
	{ "kernel", kernel_validate, kernel_run },
};

static const bench_mode_t *find_mode(const char *name)
{
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
		if (strcmp(modes[i].name, name) == 0)
			return &modes[i];
	return NULL;
}

int main(int argc, char **argv)
{
	flow_tool_t tool;
	bench_opts_t o;
	const bench_mode_t *mode;
	int opt;

	/* 1. Options. */
	flow_tool_init(&tool, "flow-bench", help_text,
		       FLOW_TOOL_LINE_BUFFERED | FLOW_TOOL_COMPUTE);
	memset(&o, 0, sizeof(o));
	flow_bench_config_init(&o.cfg);
	while ((opt = getopt_long(argc, argv, ":" FLOW_COMMON_SHORT_OPTIONS,
				  long_options, NULL)) != -1) {
		if (flow_tool_common_option(&tool, opt, argv))
			continue;
		switch (opt) {
		case OPT_SHAPE:
			if (o.nshape_text == MAX_SHAPES)
				flow_tool_usage_error(&tool,
						      "too many '--shape' options (at most %d)",
						      MAX_SHAPES);
			o.shape_text[o.nshape_text++] = optarg;
			break;
		case OPT_ITERS:
			o.cfg.iters = (unsigned)flow_tool_int(&tool, "--iters",
							      optarg, 1, 1000000);
			break;
		case OPT_WARMUP:
			o.cfg.warmup = (unsigned)flow_tool_int(&tool, "--warmup",
							       optarg, 0, 1000000);
			break;
		case OPT_SEED:
			o.cfg.seed = (uint64_t)flow_tool_int(&tool, "--seed",
							     optarg, 0, INT64_MAX);
			break;
		case OPT_RTOL:
			o.cfg.rtol = flow_tool_double(&tool, "--rtol", optarg,
						      0.0, 1e6);
			break;
		case OPT_ATOL:
			o.cfg.atol = flow_tool_double(&tool, "--atol", optarg,
						      0.0, 1e6);
			break;
		case OPT_PEAK_GFLOPS:
			o.cfg.peak_gflops = flow_tool_double(&tool, "--peak-gflops",
							     optarg, 1e-3, 1e12);
			break;
		default:
			flow_tool_usage_error(&tool, "unknown option '%s'",
					      argv[optind - 1]);
		}
	}

	/* 2. Validation. */
	if (optind >= argc)
		flow_tool_usage_error(&tool, "missing mode (try 'kernel')");
	mode = find_mode(argv[optind]);
	if (!mode)
		flow_tool_usage_error(&tool, "unknown mode '%s'", argv[optind]);
	o.args = argv + optind + 1;
	o.nargs = argc - optind - 1;
	mode->validate(&tool, &o);

	/* 3 and 4. Measure, writing each record as it is measured. */
	int status = mode->run(&tool, &o);

	/* 5. Check standard output. */
	return flow_tool_finish(&tool, status);
}
