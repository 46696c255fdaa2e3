/* flow-bench: measure this machine and flow's kernels on it.
 *
 * One program, several modes ("flow-bench MODE ..."); a mode is one entry of
 * the modes[] table: its name, a validation function (usage errors, exit 2)
 * and a run function (calls libflow, writes the records, returns the exit
 * status).  The measuring itself lives in lib/bench/bench.c (flow/bench.h). */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/bench.h>
#include <flow/device.h>
#include <flow/bench_comm.h>
#include <flow/bench_loader.h>
#include <flow/comm.h>
#include <flow/json.h>
#include <flow/log.h>

#include "tool.h"

static const char help_text[] =
	"Usage: flow-bench kernel NAME [options]\n"
	"       flow-bench comm COLLECTIVE [-b MIN] [-e MAX] [-f FACTOR] [options]\n"
	"       flow-bench loader DIR [--seq-len T] [--batch B] [--batches N]\n"
	"Benchmark flow's CPU kernels against the BLAS and check every result\n"
	"against the reference kernels, flow's collectives across the ranks\n"
	"of a job (nccl-tests' columns), or the data loader with its checks\n"
	"against the loader without them.  Writes '#' comment lines and TSV\n"
	"rows (or one JSON document with --json) to standard output.\n"
	"\n"
	"Modes:\n"
	"  kernel NAME        benchmark kernel NAME, each pass (fwd, bwd, ...)\n"
	"  comm COLLECTIVE    all_reduce, reduce_scatter, all_gather, all_to_all or\n"
	"                     broadcast, from MIN to MAX bytes; run it under\n"
	"                     srun --mpi=pmix, mpirun, or with --nproc N\n"
	"  loader DIR         read batches of dataset DIR with every shard's\n"
	"                     checksum verified (as flow-train does) and without,\n"
	"                     alternately, and report tokens/s and their ratio\n"
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
	"  resln         N,C        residual add and layernorm fused, forward and\n"
	"                           backward, against the two kernels in turn\n"
	"  matmul_bf16   N,IN,OUT   matmul on bf16 activations (flow-train\n"
	"                           --precision bf16), against fp32 sgemm\n"
	"  attention_bf16 B,T,C,NH  attention on bf16 activations (--precision\n"
	"                           bf16)\n"
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
	"      --device D         cpu, or cuda: peak and matmul on the GPU, against\n"
	"                         cuBLAS's own sgemm (the blas columns) [cpu]\n"
	"\n"
	"Options of loader (also --iters N, timed passes per variant [5]):\n"
	"      --seq-len T        tokens per sample [1024]\n"
	"      --batch B          samples per batch [8]\n"
	"      --batches N        batches per pass [64]\n"
	"      --split S          train or val [train]\n"
	"\n"
	"Options of comm (also --iters [20] and --warmup [5]):\n"
	"  -b, --minbytes SIZE    smallest size [8], K/M/G suffixes (binary)\n"
	"  -e, --maxbytes SIZE    largest size [32M]\n"
	"  -f, --stepfactor N     multiply the size by N each step [2]\n"
	"      --dtype TYPE       f32, bf16, f16, i32, i64, u8, u32 [f32]\n"
	"      --backend B        cpu (shared memory or TCP) or nccl [cpu]\n"
	"      --comm-timeout S   deadline of each collective, seconds [60]\n"
	"      --nproc N          start N local ranks with flow's own launcher\n"
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
	OPT_DTYPE,
	OPT_BACKEND,
	OPT_COMM_TIMEOUT,
	OPT_NPROC,
	OPT_DEVICE,
	OPT_SEQ_LEN,
	OPT_BATCH,
	OPT_BATCHES,
	OPT_SPLIT,
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
	{ "minbytes", required_argument, NULL, 'b' },
	{ "maxbytes", required_argument, NULL, 'e' },
	{ "stepfactor", required_argument, NULL, 'f' },
	{ "dtype", required_argument, NULL, OPT_DTYPE },
	{ "backend", required_argument, NULL, OPT_BACKEND },
	{ "comm-timeout", required_argument, NULL, OPT_COMM_TIMEOUT },
	{ "nproc", required_argument, NULL, OPT_NPROC },
	{ "device", required_argument, NULL, OPT_DEVICE },
	{ "seq-len", required_argument, NULL, OPT_SEQ_LEN },
	{ "batch", required_argument, NULL, OPT_BATCH },
	{ "batches", required_argument, NULL, OPT_BATCHES },
	{ "split", required_argument, NULL, OPT_SPLIT },
	{ NULL, 0, NULL, 0 },
};

#define MAX_SHAPES 64

typedef struct bench_mode bench_mode_t;

typedef struct bench_opts {
	flow_bench_config_t cfg;
	const char *shape_text[MAX_SHAPES];
	size_t nshape_text;
	/* Positional arguments: the mode's name and then its own, until
	 * validate() takes the name off and sets mode. */
	char **args;
	int nargs;
	const bench_mode_t *mode;
	/* Filled by the mode's validation. */
	flow_bench_kernel_t kernels[FLOW_BENCH_NKERNELS];
	size_t nkernels;
	flow_bench_shape_t shapes[MAX_SHAPES];
	size_t nshapes;
	/* comm */
	bool iters_given, warmup_given;
	uint64_t min_bytes, max_bytes, factor;
	const char *dtype_text, *backend_text;
	flow_dtype_t dtype;
	flow_comm_backend_t backend;
	double timeout_s;
	flow_bench_coll_t coll;
	/* loader */
	flow_bench_loader_config_t loader;
	const char *loader_only; /* the first loader option given */
} bench_opts_t;

struct bench_mode {
	const char *name;
	void (*validate)(const flow_tool_t *tool, bench_opts_t *o);
	int (*run)(const flow_tool_t *tool, bench_opts_t *o);
};

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
	bool cuda = o->cfg.device == FLOW_DEVICE_CUDA;
	if (strcmp(o->args[0], "all") == 0) {
		if (o->nshape_text)
			flow_tool_usage_error(tool,
					      "option '--shape' cannot be used with kernel 'all'");
		for (int i = 0; i < FLOW_BENCH_NKERNELS; i++)
			if (!cuda || i == FLOW_BENCH_PEAK || i == FLOW_BENCH_MATMUL)
				o->kernels[o->nkernels++] = (flow_bench_kernel_t)i;
		return;
	}
	if (flow_bench_kernel_lookup(o->args[0], &k, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s", flow_diag_message(&diag));
	if (cuda && k != FLOW_BENCH_PEAK && k != FLOW_BENCH_MATMUL)
		flow_tool_usage_error(tool, "--device cuda benchmarks peak and matmul only (so far), not '%s'",
				      o->args[0]);
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
	flow_cuda_device_info_t gpu;
	if (cfg->device == FLOW_DEVICE_CUDA &&
	    (flow_cuda_open(&diag) != FLOW_OK || flow_cuda_info(0, &gpu, &diag) != FLOW_OK))
		return flow_tool_fail(tool, &diag);
	if (tool->json) {
		write_json_head(&machine, o);
	} else {
		flow_bench_write_machine(stdout, &machine);
		if (cfg->device == FLOW_DEVICE_CUDA) {
			const char *source = NULL;
			double sheet = flow_cuda_peak_gflops(gpu.name, false, &source);
			printf("# device: cuda:0 %s (sm_%d%d, %d SMs, %.1f GiB); ",
			       gpu.name, gpu.cc_major, gpu.cc_minor, gpu.sm_count,
			       (double)gpu.global_mem / (1024.0 * 1024.0 * 1024.0));
			if (sheet > 0)
				printf("fp32 peak %.1f TFLOP/s (%s)\n", sheet / 1e3, source);
			else
				printf("no datasheet peak known\n");
		}
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

/* ---- mode "comm" ------------------------------------------------------------ */

static void comm_validate(const flow_tool_t *tool, bench_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;

	if (o->nargs < 1)
		flow_tool_usage_error(tool, "missing collective after 'comm'");
	if (o->nargs > 1)
		flow_tool_usage_error(tool, "unexpected argument '%s'",
				      o->args[1]);
	if (flow_bench_coll_lookup(o->args[0], &o->coll, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s", flow_diag_message(&diag));
	if (o->nshape_text || o->cfg.peak_gflops > 0 || o->cfg.rtol >= 0 ||
	    o->cfg.atol >= 0)
		flow_tool_usage_error(tool,
				      "options '--shape', '--peak-gflops', '--rtol' and '--atol' are for mode 'kernel'");
	if (o->min_bytes > o->max_bytes)
		flow_tool_usage_error(tool,
				      "'--minbytes' (%llu) is larger than '--maxbytes' (%llu)",
				      (unsigned long long)o->min_bytes,
				      (unsigned long long)o->max_bytes);
	if (flow_dtype_parse(o->dtype_text, &o->dtype, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s", flow_diag_message(&diag));
	if (strcmp(o->backend_text, "cpu") == 0)
		o->backend = FLOW_COMM_CPU;
	else if (strcmp(o->backend_text, "nccl") == 0)
		o->backend = FLOW_COMM_NCCL;
	else
		flow_tool_usage_error(tool, "unknown backend '%s' (cpu or nccl)",
				      o->backend_text);
	bool reduces = o->coll == FLOW_BENCH_ALL_REDUCE ||
		       o->coll == FLOW_BENCH_REDUCE_SCATTER;
	if (reduces && !flow_comm_can_reduce(o->backend, o->dtype))
		flow_tool_usage_error(tool, "cannot sum dtype '%s'",
				      o->dtype_text);
	if (!o->iters_given)
		o->cfg.iters = 20;
	if (!o->warmup_given)
		o->cfg.warmup = 5;
}

/* The '#' preamble: the configuration and the rank/host/device map. */
static void comm_write_preamble(const bench_opts_t *o, flow_world_t *w,
				flow_comm_t *c)
{
	const flow_world_info_t *info = flow_world_info(w);
	printf("# flow-bench comm %s: %d ranks on %d nodes, launcher %s, backend %s (%s), dtype %s, iters %u, warmup %u, timeout %g s\n",
	       flow_bench_coll_name(o->coll), info->size, info->num_nodes,
	       info->launcher, o->backend_text, flow_comm_transport(c),
	       flow_dtype_name(o->dtype), o->cfg.iters, o->cfg.warmup,
	       o->timeout_s);
	for (int r = 0; r < info->size; r++)
		printf("# rank %d: host %s, pid %d, node %d, device %s\n", r,
		       flow_world_host_of(w, r), flow_world_pid_of(w, r),
		       flow_world_node_of(w, r),
		       o->backend == FLOW_COMM_NCCL ? "cuda" : "cpu");
	printf("size_B\tcount\ttype\tredop\troot\ttime_us\talgbw_GBps\tbusbw_GBps\twrong\n");
}

static void comm_write_row(const bench_opts_t *o, bool tool_json,
			   const flow_bench_comm_result_t *r, bool first)
{
	bool reduces = o->coll == FLOW_BENCH_ALL_REDUCE ||
		       o->coll == FLOW_BENCH_REDUCE_SCATTER;
	const char *redop = reduces ? "sum" : "none";
	int root = o->coll == FLOW_BENCH_BROADCAST ? 0 : -1;
	if (tool_json)
		printf("%s\n{\"size_B\":%zu,\"count\":%zu,\"type\":\"%s\",\"redop\":\"%s\",\"root\":%d,\"time_us\":%.3f,\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,\"wrong\":%llu}",
		       first ? "" : ",", r->bytes, r->count,
		       flow_dtype_name(o->dtype), redop, root, r->time_us,
		       r->algbw_GBps, r->busbw_GBps,
		       (unsigned long long)r->wrong);
	else
		printf("%zu\t%zu\t%s\t%s\t%d\t%.2f\t%.4f\t%.4f\t%llu\n",
		       r->bytes, r->count, flow_dtype_name(o->dtype), redop,
		       root, r->time_us, r->algbw_GBps, r->busbw_GBps,
		       (unsigned long long)r->wrong);
}

/* Every rank measures; rank 0 writes.  The world is left through abort
 * after a failure, so no rank waits for a dead peer in the final fence. */
static int comm_run(const flow_tool_t *tool, bench_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_world_t *w = NULL;
	flow_comm_t *c = NULL;
	uint64_t wrong = 0;
	double busbw_sum = 0;
	int rows = 0;

	if (flow_world_init(&w, o->timeout_s, &diag) != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	bool speaks = flow_world_info(w)->rank == 0;
	if (flow_comm_world(w, o->backend, &c, &diag) != FLOW_OK)
		goto fail;
	if (speaks) {
		if (tool->json)
			printf("{\"tool\":\"flow-bench\",\"mode\":\"comm\",\"collective\":\"%s\",\"ranks\":%d,\"transport\":\"%s\",\"records\":[",
			       flow_bench_coll_name(o->coll), flow_comm_size(c),
			       flow_comm_transport(c));
		else
			comm_write_preamble(o, w, c);
	}
	for (uint64_t bytes = o->min_bytes; bytes <= o->max_bytes;
	     bytes = bytes * o->factor > bytes ? bytes * o->factor : UINT64_MAX) {
		flow_bench_comm_result_t r;
		if (flow_bench_comm_run(c, o->coll, o->dtype, (size_t)bytes,
					o->cfg.iters, o->cfg.warmup, &r,
					&diag) != FLOW_OK)
			goto fail;
		if (speaks)
			comm_write_row(o, tool->json, &r, rows == 0);
		wrong += r.wrong;
		busbw_sum += r.busbw_GBps;
		rows++;
		if (bytes == UINT64_MAX || o->factor == 1)
			break;
	}
	if (speaks && tool->json)
		printf("\n],\"avg_busbw_GBps\":%.4f,\"wrong\":%llu,\"result\":\"%s\"}\n",
		       rows ? busbw_sum / rows : 0, (unsigned long long)wrong,
		       wrong ? "FAIL" : "PASS");
	else if (speaks) {
		printf("# avg busbw: %.4f GB/s\n", rows ? busbw_sum / rows : 0);
		if (wrong)
			printf("# FAIL: %llu wrong\n", (unsigned long long)wrong);
		else
			printf("# PASS\n");
	}
	if (wrong && speaks)
		flow_tool_error(tool, "%llu wrong results",
				(unsigned long long)wrong);
	flow_comm_free(c);
	if (flow_world_free(w, &diag) != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	return wrong ? 1 : 0;
fail:
	flow_tool_fail(tool, &diag);
	flow_comm_free(c);
	flow_world_abort(w, 1, flow_diag_message(&diag));
	return 1;
}

/* ---- mode "loader" ---------------------------------------------------------- */

static void loader_validate(const flow_tool_t *tool, bench_opts_t *o)
{
	if (o->nargs < 1)
		flow_tool_usage_error(tool, "missing dataset directory after 'loader'");
	if (o->nargs > 1)
		flow_tool_usage_error(tool, "unexpected argument '%s'",
				      o->args[1]);
	if (o->nshape_text)
		flow_tool_usage_error(tool, "option '--shape' cannot be used with mode 'loader'");
	o->loader.dir = o->args[0];
	if (!o->iters_given)
		o->loader.iters = 5;
}

static int loader_run(const flow_tool_t *tool, bench_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_bench_machine_t machine;
	flow_bench_loader_result_t r[2];
	const flow_bench_loader_config_t *cfg = &o->loader;

	flow_bench_machine_describe(&machine);
	if (flow_bench_loader_run(cfg, r, &diag) != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	/* checked / unchecked throughput, first and steady */
	double ratio[2] = {
		r[0].first_s > 0 ? r[1].first_s / r[0].first_s : 0,
		r[0].steady_s > 0 ? r[1].steady_s / r[0].steady_s : 0,
	};
	if (tool->json) {
		fputs("{\"tool\":\"flow-bench\",\"mode\":\"loader\",\"machine\":", stdout);
		flow_bench_write_json_machine(stdout, &machine);
		fputs(",\"config\":{\"data\":", stdout);
		flow_json_write_string(stdout, cfg->dir);
		printf(",\"split\":\"%s\",\"seq_len\":%u,\"batch\":%llu,\"batches\":%llu,\"iters\":%u},\"records\":[",
		       flow_split_name(cfg->split), cfg->seq_len,
		       (unsigned long long)cfg->batch,
		       (unsigned long long)cfg->batches, cfg->iters);
		for (int v = 0; v < 2; v++)
			printf("%s{\"variant\":\"%s\",\"tokens\":%llu,\"first_s\":%.6g,\"first_tokens_per_s\":%.6g,\"steady_s\":%.6g,\"steady_tokens_per_s\":%.6g}",
			       v ? "," : "", r[v].variant,
			       (unsigned long long)r[v].tokens, r[v].first_s,
			       r[v].first_tokens_per_s, r[v].steady_s,
			       r[v].steady_tokens_per_s);
		printf("],\"first_ratio\":%.4f,\"steady_ratio\":%.4f}\n",
		       ratio[0], ratio[1]);
		return 0;
	}
	flow_bench_write_machine(stdout, &machine);
	printf("# config: mode loader, data %s, split %s, seq-len %u, batch %llu, %llu batches per half pass, %u timed passes per variant\n",
	       cfg->dir, flow_split_name(cfg->split), cfg->seq_len,
	       (unsigned long long)cfg->batch,
	       (unsigned long long)cfg->batches, cfg->iters);
	printf("variant\ttokens\tfirst_s\tfirst_tokens_per_s\tsteady_s\tsteady_tokens_per_s\n");
	for (int v = 0; v < 2; v++)
		printf("%s\t%llu\t%.6f\t%.4g\t%.6f\t%.4g\n", r[v].variant,
		       (unsigned long long)r[v].tokens, r[v].first_s,
		       r[v].first_tokens_per_s, r[v].steady_s,
		       r[v].steady_tokens_per_s);
	printf("# checked/unchecked throughput: first %.3f (checksums verified), steady %.3f (ids checked); the same tokens (%016llx)\n",
	       ratio[0], ratio[1], (unsigned long long)r[0].digest);
	return 0;
}

/* ---- modes ------------------------------------------------------------------ */

static const bench_mode_t modes[] = {
	{ "kernel", kernel_validate, kernel_run },
	{ "comm", comm_validate, comm_run },
	{ "loader", loader_validate, loader_run },
};

static const bench_mode_t *find_mode(const char *name)
{
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
		if (strcmp(modes[i].name, name) == 0)
			return &modes[i];
	return NULL;
}

/* ---- options ---------------------------------------------------------------- */

static void opts_init(bench_opts_t *o)
{
	memset(o, 0, sizeof(*o));
	flow_bench_config_init(&o->cfg);
	o->min_bytes = 8;
	o->max_bytes = 32u << 20;
	o->factor = 2;
	o->dtype_text = "f32";
	o->backend_text = "cpu";
	o->timeout_s = FLOW_COMM_TIMEOUT_DEFAULT;
	o->loader.split = FLOW_SPLIT_TRAIN;
	o->loader.seq_len = 1024;
	o->loader.batch = 8;
	o->loader.batches = 64;
}

static void parse_options(flow_tool_t *tool, bench_opts_t *o, int argc,
			  char **argv)
{
	int opt;
	while ((opt = getopt_long(argc, argv, ":" FLOW_COMMON_SHORT_OPTIONS "b:e:f:",
				  long_options, NULL)) != -1) {
		if (flow_tool_common_option(tool, opt, argv))
			continue;
		switch (opt) {
		case OPT_SHAPE:
			if (o->nshape_text == MAX_SHAPES)
				flow_tool_usage_error(tool,
						      "too many '--shape' options (at most %d)",
						      MAX_SHAPES);
			o->shape_text[o->nshape_text++] = optarg;
			break;
		case OPT_ITERS:
			o->cfg.iters = (unsigned)flow_tool_int(tool, "--iters",
							       optarg, 1, 1000000);
			o->loader.iters = o->cfg.iters;
			o->iters_given = true;
			break;
		case OPT_SEQ_LEN:
			o->loader.seq_len = (uint32_t)flow_tool_int(
				tool, "--seq-len", optarg, 1, 1 << 20);
			o->loader_only = o->loader_only ? o->loader_only : "--seq-len";
			break;
		case OPT_BATCH:
			o->loader.batch = (uint64_t)flow_tool_int(
				tool, "--batch", optarg, 1, 1 << 20);
			o->loader_only = o->loader_only ? o->loader_only : "--batch";
			break;
		case OPT_BATCHES:
			o->loader.batches = (uint64_t)flow_tool_int(
				tool, "--batches", optarg, 1, 1 << 30);
			o->loader_only = o->loader_only ? o->loader_only : "--batches";
			break;
		case OPT_SPLIT: {
			flow_diag_t diag = FLOW_DIAG_INIT;
			if (flow_split_parse(optarg, &o->loader.split, &diag) != FLOW_OK)
				flow_tool_usage_error(tool, "--split: %s", flow_diag_message(&diag));
			o->loader_only = o->loader_only ? o->loader_only : "--split";
			break;
		}
		case OPT_WARMUP:
			o->cfg.warmup = (unsigned)flow_tool_int(tool, "--warmup",
								optarg, 0, 1000000);
			o->warmup_given = true;
			break;
		case OPT_SEED:
			o->cfg.seed = (uint64_t)flow_tool_int(tool, "--seed",
							      optarg, 0, INT64_MAX);
			break;
		case OPT_RTOL:
			o->cfg.rtol = flow_tool_double(tool, "--rtol", optarg,
						       0.0, 1e6);
			break;
		case OPT_ATOL:
			o->cfg.atol = flow_tool_double(tool, "--atol", optarg,
						       0.0, 1e6);
			break;
		case OPT_DEVICE: {
			flow_diag_t diag = FLOW_DIAG_INIT;
			if (flow_device_kind_parse(optarg, &o->cfg.device, &diag) != FLOW_OK)
				flow_tool_usage_error(tool, "--device: %s", flow_diag_message(&diag));
			break;
		}
		case OPT_PEAK_GFLOPS:
			o->cfg.peak_gflops = flow_tool_double(tool, "--peak-gflops",
							      optarg, 1e-3, 1e12);
			break;
		case 'b':
			o->min_bytes = flow_tool_size(tool, "--minbytes", optarg);
			break;
		case 'e':
			o->max_bytes = flow_tool_size(tool, "--maxbytes", optarg);
			break;
		case 'f':
			o->factor = (uint64_t)flow_tool_int(tool, "--stepfactor",
							    optarg, 1, 1 << 20);
			break;
		case OPT_DTYPE:
			o->dtype_text = optarg;
			break;
		case OPT_BACKEND:
			o->backend_text = optarg;
			break;
		case OPT_NPROC:
			/* Handled by flow_tool_launch_if_asked, which lets
			 * --help and --version through to here. */
			break;
		case OPT_COMM_TIMEOUT:
			o->timeout_s = flow_tool_double(tool, "--comm-timeout",
							optarg, 0.001, 1e6);
			break;
		default:
			flow_tool_usage_error(tool, "unknown option '%s'",
					      argv[optind - 1]);
		}
	}
	o->args = argv + optind;
	o->nargs = argc - optind;
}

/* The mode, then what the mode itself checks. */
static void validate(flow_tool_t *tool, bench_opts_t *o)
{
	if (o->nargs < 1)
		flow_tool_usage_error(tool, "missing mode (kernel, comm or loader)");
	o->mode = find_mode(o->args[0]);
	if (!o->mode)
		flow_tool_usage_error(tool, "unknown mode '%s'", o->args[0]);
	if (o->loader_only && strcmp(o->mode->name, "loader") != 0)
		flow_tool_usage_error(tool, "option '%s' needs mode 'loader'",
				      o->loader_only);
	o->args++;
	o->nargs--;
	o->mode->validate(tool, o);
}

int main(int argc, char **argv)
{
	flow_tool_t tool;
	bench_opts_t o;

	/* 1. Options. */
	flow_tool_init(&tool, "flow-bench", help_text,
		       FLOW_TOOL_LINE_BUFFERED | FLOW_TOOL_COMPUTE);
	int launched = flow_tool_launch_if_asked(&tool, argc, argv);
	if (launched >= 0)
		return launched;
	opts_init(&o);
	parse_options(&tool, &o, argc, argv);

	/* 2. Validation. */
	validate(&tool, &o);

	/* 3 and 4. Measure, writing each record as it is measured. */
	int status = o.mode->run(&tool, &o);

	/* 5. Check standard output. */
	return flow_tool_finish(&tool, status);
}
