/* flow-train: train a GPT from a flow-shard dataset, on one rank or data
 * parallel over the ranks of a PMIx job (srun, mpirun, --nproc), writing
 * one TSV row per step, checkpoints, and resuming exactly from them.  The
 * work lives in lib/runtime/train.c (the plan and the loop) and
 * lib/runtime/train_ckpt.c (checkpoints and resume), lib/models/gpt.c (the
 * model), lib/graph/graph.c, lib/graph/autograd.c and lib/runtime/exec.c
 * (the step), lib/ckpt/ (the checkpoint format); this file parses,
 * validates, calls and reports. */
#include <config.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <flow/bench.h>
#include <flow/comm.h>
#include <flow/log.h>
#include <flow/plan.h>
#include <flow/train.h>
#include <flow/world.h>

#include "tool.h"

static const char help_text[] =
	"Usage: flow-train --model SPEC --data DIR [options]\n"
	"       flow-train --plan PLAN --data DIR [options]\n"
	"       flow-train --model SPEC --emit-graph [--batch B] [--seq-len T]\n"
	"Train a GPT on this machine's CPU from a flow-shard(5) dataset, one\n"
	"TSV row per step on standard output (step, phase, loss, lr, grad_norm,\n"
	"ms, tokens_per_s, mfu) after '#' lines describing the run.\n"
	"\n"
	"Model and data:\n"
	"      --model SPEC       gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, or\n"
	"                         gpt:layers=L,heads=H,dim=C,vocab=V,seq=S[,pad=P];\n"
	"                         a preset takes overrides: gpt2-124m:seq=256\n"
	"      --plan PLAN        a flow-plan(5) file: the model, batch, seq-len,\n"
	"                         grad-accum, mesh and ZeRO shards come from it\n"
	"                         (data-parallel plans: only dp above size 1)\n"
	"      --data DIR         dataset directory written by flow-shard\n"
	"  -b, --batch B          sequences per micro-batch [4]\n"
	"  -t, --seq-len T        tokens per sequence [the model's seq]\n"
	"  -n, --steps N          optimizer steps [10]\n"
	"      --grad-accum K     micro-batches per step [1]\n"
	"      --seed S           initialisation and data order [1337]\n"
	"\n"
	"Optimizer (AdamW, linear warmup then cosine decay):\n"
	"      --lr X             peak learning rate [6e-4]\n"
	"      --min-lr X         learning rate at the last step [lr/10]\n"
	"      --warmup N         warmup steps [0]\n"
	"      --weight-decay X   on weights and embeddings [0.1]\n"
	"      --beta1 X, --beta2 X, --eps X   [0.9, 0.95, 1e-8]\n"
	"      --clip X           clip the global gradient norm to X; 0: off [1]\n"
	"\n"
	"Evaluation and checkpoints:\n"
	"      --eval-every N     every N steps, the mean loss over the val split [0: off]\n"
	"      --eval-batches M   val micro-batches per evaluation [8]\n"
	"      --ckpt-dir DIR     write checkpoints (flow-ckpt(5)) under DIR\n"
	"      --ckpt-every N     every N steps, and after the last [0: last only]\n"
	"      --resume CKPT      continue from a checkpoint directory, or 'latest'\n"
	"                         in --ckpt-dir\n"
	"      --init CKPT        start from the weights of a checkpoint (any\n"
	"                         layout; flow-ckpt import makes one): step 0,\n"
	"                         fresh optimizer state\n"
	"\n"
	"Device (see flow-train(1), GPUS):\n"
	"      --device D         cpu, or cuda: each rank takes the GPU of its local\n"
	"                         rank [cpu]\n"
	"      --precision P      fp32, or bf16: activations stored in bf16, GEMMs\n"
	"                         on bf16 operands with fp32 accumulation, weights,\n"
	"                         gradients and optimizer state fp32 (on the CPU\n"
	"                         slower than fp32, for checking) [fp32]\n"
	"      --comm C           nccl, or cpu: collectives staged through host\n"
	"                         memory, so several ranks may share a GPU [nccl for\n"
	"                         cuda; cpu for cpu]\n"
	"\n"
	"Ranks (see flow(7), LAUNCHING):\n"
	"      --nproc N          start N data-parallel ranks on this machine\n"
	"                         (flow's own launcher); under srun --mpi=pmix or\n"
	"                         mpirun the ranks come from the launcher\n"
	"      --comm-timeout S   deadline of each collective, seconds [60]\n"
	"      --bucket-mb X      sum data-parallel gradients in buckets of X MiB\n"
	"                         as backward completes them; 0: after it [25]\n"
	"\n"
	"Inspection:\n"
	"      --emit-graph       print the training graph (flow-train(1), GRAPH)\n"
	"                         with its memory plan, and exit\n"
	"      --profile          time every op; print the profile on stderr at the end\n"
	"      --peak-gflops X    the MFU ceiling [measured: sgemm 1024^3 at start];\n"
	"                         0: no MFU\n"
	"      --kernels K        cpu; ref: the naive reference kernels; staged:\n"
	"                         the CPU's through the GPU's copies (testing) [cpu]\n"
	"      --dump-batches F   write every micro-batch's tokens to F (int32)\n"
	"      --dump-grads DIR   write the first step's gradients (before\n"
	"                         clipping) as a checkpoint directory DIR\n"
	"\n"
	"Common options:\n"
	"  -v, --verbose          more messages on stderr (repeatable)\n"
	"  -q, --quiet            fewer messages on stderr\n"
	"  -h, --help             show this help and exit\n"
	"      --version          show the version and build features and exit\n"
	"\n"
	"Exit status: 0 success, 1 a run-time failure (bad data, a damaged\n"
	"checkpoint), 2 a usage error.  See flow-train(1).\n";

enum {
	OPT_MODEL = FLOW_OPT_TOOL,
	OPT_DATA,
	OPT_GRAD_ACCUM,
	OPT_SEED,
	OPT_LR,
	OPT_MIN_LR,
	OPT_WARMUP,
	OPT_WEIGHT_DECAY,
	OPT_BETA1,
	OPT_BETA2,
	OPT_EPS,
	OPT_CLIP,
	OPT_EVAL_EVERY,
	OPT_EVAL_BATCHES,
	OPT_CKPT_DIR,
	OPT_CKPT_EVERY,
	OPT_RESUME,
	OPT_INIT,
	OPT_EMIT_GRAPH,
	OPT_PROFILE,
	OPT_PEAK_GFLOPS,
	OPT_KERNELS,
	OPT_DUMP_BATCHES,
	OPT_DUMP_GRADS,
	OPT_COMM_TIMEOUT,
	OPT_NPROC,
	OPT_PLAN,
	OPT_DEVICE,
	OPT_PRECISION,
	OPT_COMM,
	OPT_BUCKET_MB,
};

static const struct option long_options[] = {
	FLOW_COMMON_OPTIONS,
	{ "model", required_argument, NULL, OPT_MODEL },
	{ "data", required_argument, NULL, OPT_DATA },
	{ "batch", required_argument, NULL, 'b' },
	{ "seq-len", required_argument, NULL, 't' },
	{ "steps", required_argument, NULL, 'n' },
	{ "grad-accum", required_argument, NULL, OPT_GRAD_ACCUM },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "lr", required_argument, NULL, OPT_LR },
	{ "min-lr", required_argument, NULL, OPT_MIN_LR },
	{ "warmup", required_argument, NULL, OPT_WARMUP },
	{ "weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY },
	{ "beta1", required_argument, NULL, OPT_BETA1 },
	{ "beta2", required_argument, NULL, OPT_BETA2 },
	{ "eps", required_argument, NULL, OPT_EPS },
	{ "clip", required_argument, NULL, OPT_CLIP },
	{ "eval-every", required_argument, NULL, OPT_EVAL_EVERY },
	{ "eval-batches", required_argument, NULL, OPT_EVAL_BATCHES },
	{ "ckpt-dir", required_argument, NULL, OPT_CKPT_DIR },
	{ "ckpt-every", required_argument, NULL, OPT_CKPT_EVERY },
	{ "resume", required_argument, NULL, OPT_RESUME },
	{ "init", required_argument, NULL, OPT_INIT },
	{ "emit-graph", no_argument, NULL, OPT_EMIT_GRAPH },
	{ "profile", no_argument, NULL, OPT_PROFILE },
	{ "peak-gflops", required_argument, NULL, OPT_PEAK_GFLOPS },
	{ "kernels", required_argument, NULL, OPT_KERNELS },
	{ "dump-batches", required_argument, NULL, OPT_DUMP_BATCHES },
	{ "dump-grads", required_argument, NULL, OPT_DUMP_GRADS },
	{ "comm-timeout", required_argument, NULL, OPT_COMM_TIMEOUT },
	{ "nproc", required_argument, NULL, OPT_NPROC },
	{ "plan", required_argument, NULL, OPT_PLAN },
	{ "device", required_argument, NULL, OPT_DEVICE },
	{ "precision", required_argument, NULL, OPT_PRECISION },
	{ "comm", required_argument, NULL, OPT_COMM },
	{ "bucket-mb", required_argument, NULL, OPT_BUCKET_MB },
	{ NULL, 0, NULL, 0 },
};

typedef struct train_opts {
	flow_train_config_t cfg;
	const char *model;
	bool emit_graph;
	bool peak_given;
	const char *eval_batches; /* for "needs --eval-every" */
	const char *ckpt_every;   /* for "needs --ckpt-dir" */
	double comm_timeout;
	const char *plan;         /* --plan */
	const char *shape_option; /* --batch, --seq-len or --grad-accum given */
	const char *comm;         /* --comm, NULL: the device's default */
	const char *device;       /* --device, NULL: the plan's or cpu */
	const char *precision;    /* --precision, NULL: the plan's or fp32 */
} train_opts_t;

#define MAX_COUNT ((int64_t)1 << 40)

/* --device, --precision and --comm into the configuration, over what a
 * plan said; each checked, and the three checked together. */
static void apply_device(flow_tool_t *tool, train_opts_t *o)
{
	flow_train_config_t *c = &o->cfg;
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (o->device && flow_device_kind_parse(o->device, &c->device, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "--device: %s", flow_diag_message(&diag));
	if (o->precision && flow_precision_parse(o->precision, &c->precision, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "--precision: %s", flow_diag_message(&diag));
}

static void check_device(flow_tool_t *tool, train_opts_t *o)
{
	flow_train_config_t *c = &o->cfg;
	if (c->device == FLOW_DEVICE_CPU && o->comm && strcmp(o->comm, "nccl") == 0)
		flow_tool_usage_error(tool, "--comm nccl needs --device cuda");
	if (c->device == FLOW_DEVICE_CUDA && c->kernels != FLOW_KERNELS_CPU)
		flow_tool_usage_error(tool, "--kernels %s runs on the CPU: it cannot go with --device cuda",
				      c->kernels == FLOW_KERNELS_REF ? "ref" : "staged");
	/* --kernels staged plays a GPU, its --comm cpu too. */
	c->host_comm = (c->device == FLOW_DEVICE_CUDA ||
			c->kernels == FLOW_KERNELS_STAGED) &&
		       o->comm && strcmp(o->comm, "cpu") == 0;
}

static void parse_options(flow_tool_t *tool, train_opts_t *o, int argc,
			  char **argv)
{
	flow_train_config_t *c = &o->cfg;
	int opt;
	while ((opt = getopt_long(argc, argv,
				  ":b:t:n:" FLOW_COMMON_SHORT_OPTIONS,
				  long_options, NULL)) != -1) {
		if (flow_tool_common_option(tool, opt, argv))
			continue;
		switch (opt) {
		case OPT_MODEL:
			o->model = optarg;
			break;
		case OPT_DATA:
			c->data_dir = optarg;
			break;
		case OPT_PLAN:
			o->plan = optarg;
			break;
		case 'b':
			o->shape_option = "--batch";
			c->batch = (uint32_t)flow_tool_int(tool, "--batch", optarg, 1, 1 << 20);
			break;
		case 't':
			o->shape_option = "--seq-len";
			c->seq_len = (uint32_t)flow_tool_int(tool, "--seq-len", optarg, 1, 1 << 20);
			break;
		case 'n':
			c->steps = (uint64_t)flow_tool_int(tool, "--steps", optarg, 0, MAX_COUNT);
			break;
		case OPT_GRAD_ACCUM:
			o->shape_option = "--grad-accum";
			c->grad_accum = (uint32_t)flow_tool_int(tool, "--grad-accum", optarg, 1, 1 << 20);
			break;
		case OPT_SEED:
			c->seed = (uint64_t)flow_tool_int(tool, "--seed", optarg, 0, INT64_MAX);
			break;
		case OPT_LR:
			c->lr.lr = flow_tool_double(tool, "--lr", optarg, 0, 10);
			break;
		case OPT_MIN_LR:
			c->lr.min_lr = flow_tool_double(tool, "--min-lr", optarg, 0, 10);
			break;
		case OPT_WARMUP:
			c->lr.warmup = (uint64_t)flow_tool_int(tool, "--warmup", optarg, 0, MAX_COUNT);
			break;
		case OPT_WEIGHT_DECAY:
			c->adamw.weight_decay = (float)flow_tool_double(tool, "--weight-decay", optarg, 0, 1);
			break;
		case OPT_BETA1:
			c->adamw.beta1 = (float)flow_tool_double(tool, "--beta1", optarg, 0, 0.999999);
			break;
		case OPT_BETA2:
			c->adamw.beta2 = (float)flow_tool_double(tool, "--beta2", optarg, 0, 0.999999);
			break;
		case OPT_EPS:
			c->adamw.eps = (float)flow_tool_double(tool, "--eps", optarg, 1e-30, 1);
			break;
		case OPT_CLIP:
			c->clip = (float)flow_tool_double(tool, "--clip", optarg, 0, 1e30);
			break;
		case OPT_EVAL_EVERY:
			c->eval_every = (uint64_t)flow_tool_int(tool, "--eval-every", optarg, 0, MAX_COUNT);
			break;
		case OPT_EVAL_BATCHES:
			c->eval_batches = (uint64_t)flow_tool_int(tool, "--eval-batches", optarg, 1, MAX_COUNT);
			o->eval_batches = "--eval-batches";
			break;
		case OPT_CKPT_DIR:
			c->ckpt_dir = optarg;
			break;
		case OPT_CKPT_EVERY:
			c->ckpt_every = (uint64_t)flow_tool_int(tool, "--ckpt-every", optarg, 0, MAX_COUNT);
			o->ckpt_every = "--ckpt-every";
			break;
		case OPT_RESUME:
			c->resume = optarg;
			break;
		case OPT_INIT:
			c->init = optarg;
			break;
		case OPT_EMIT_GRAPH:
			o->emit_graph = true;
			break;
		case OPT_PROFILE:
			c->profile = true;
			break;
		case OPT_PEAK_GFLOPS:
			c->peak_gflops = flow_tool_double(tool, "--peak-gflops", optarg, 0, 1e9);
			o->peak_given = true;
			break;
		case OPT_KERNELS:
			if (strcmp(optarg, "cpu") == 0)
				c->kernels = FLOW_KERNELS_CPU;
			else if (strcmp(optarg, "ref") == 0)
				c->kernels = FLOW_KERNELS_REF;
			else if (strcmp(optarg, "staged") == 0)
				c->kernels = FLOW_KERNELS_STAGED;
			else
				flow_tool_usage_error(tool, "--kernels: unknown kernel set '%s' (expected cpu, ref or staged)",
						      optarg);
			break;
		case OPT_DEVICE:
			o->device = optarg;
			apply_device(tool, o);
			break;
		case OPT_PRECISION:
			o->precision = optarg;
			apply_device(tool, o);
			break;
		case OPT_BUCKET_MB:
			c->bucket_bytes = (size_t)(flow_tool_double(tool, "--bucket-mb", optarg, 0, 1 << 20) *
						   1024.0 * 1024.0);
			break;
		case OPT_COMM:
			if (strcmp(optarg, "nccl") != 0 && strcmp(optarg, "cpu") != 0)
				flow_tool_usage_error(tool, "--comm: unknown backend '%s' (expected nccl or cpu)",
						      optarg);
			o->comm = optarg;
			break;
		case OPT_DUMP_BATCHES:
			c->dump_batches = optarg;
			break;
		case OPT_DUMP_GRADS:
			c->dump_grads = optarg;
			break;
		case OPT_NPROC:
			/* Handled by flow_tool_launch_if_asked, which lets
			 * --help and --version through to here. */
			break;
		case OPT_COMM_TIMEOUT:
			o->comm_timeout = flow_tool_double(tool, "--comm-timeout",
							   optarg, 0.001, 1e6);
			break;
		default:
			flow_tool_usage_error(tool, "unhandled option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		flow_tool_usage_error(tool, "unexpected argument '%s'", argv[optind]);
}

static void validate_run(flow_tool_t *tool, train_opts_t *o);

static void validate(flow_tool_t *tool, train_opts_t *o)
{
	flow_train_config_t *c = &o->cfg;
	if (tool->json)
		flow_tool_usage_error(tool, "--json is not supported: the output is TSV");
	if (o->plan && (o->model || o->shape_option || o->emit_graph))
		flow_tool_usage_error(tool, "%s comes from the plan: give --plan or it, not both",
				      o->model ? "--model" : o->emit_graph ? "--emit-graph" : o->shape_option);
	if (o->plan) {
		validate_run(tool, o);
		return;
	}
	if (!o->model)
		flow_tool_usage_error(tool, "missing --model SPEC");
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_gpt_parse(o->model, &c->model, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "--model: %s", flow_diag_message(&diag));
	if (c->seq_len > c->model.seq)
		flow_tool_usage_error(tool, "--seq-len %" PRIu32 " is longer than the model's context (seq=%" PRIu32 ")",
				      c->seq_len, c->model.seq);
	if (o->emit_graph)
		return;
	validate_run(tool, o);
}

/* The checks of a training run, with or without a plan. */
static void validate_run(flow_tool_t *tool, train_opts_t *o)
{
	flow_train_config_t *c = &o->cfg;
	if (!c->data_dir)
		flow_tool_usage_error(tool, "missing --data DIR");
	if (o->eval_batches && !c->eval_every)
		flow_tool_usage_error(tool, "--eval-batches needs --eval-every");
	if (o->ckpt_every && !c->ckpt_dir)
		flow_tool_usage_error(tool, "--ckpt-every needs --ckpt-dir");
	if (c->resume && c->init)
		flow_tool_usage_error(tool, "--init and --resume exclude each "
					    "other");
	if (c->resume && strcmp(c->resume, "latest") == 0 && !c->ckpt_dir)
		flow_tool_usage_error(tool, "--resume latest needs --ckpt-dir");
	if (c->lr.min_lr > c->lr.lr)
		flow_tool_usage_error(tool, "--min-lr %g is above --lr %g", c->lr.min_lr, c->lr.lr);
	if (!o->plan) /* else once the plan has said its device */
		check_device(tool, o);
	if (c->lr.warmup > c->steps)
		flow_tool_usage_error(tool, "--warmup %" PRIu64 " is longer than --steps %" PRIu64,
				      c->lr.warmup, c->steps);
}

/* The machine's sgemm ceiling, for MFU: one 1024^3 GEMM shape, which takes
 * a fraction of a second and lands within a few percent of flow-bench's
 * default peak on the machines we measured. */
static double measure_peak(void)
{
	flow_bench_config_t bc;
	flow_bench_shape_t shape;
	flow_bench_record_t recs[FLOW_BENCH_MAX_PASSES];
	size_t n;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_bench_config_init(&bc);
	bc.iters = 3;
	if (flow_bench_shape_parse(FLOW_BENCH_PEAK, "1024", &shape, &diag) != FLOW_OK ||
	    flow_bench_kernel_run(FLOW_BENCH_PEAK, &shape, &bc, recs, &n, &diag) != FLOW_OK)
		return 0.0; /* no MFU column rather than no training */
	return flow_bench_peak_gflops(&recs[0]);
}

static int emit_graph(flow_tool_t *tool, train_opts_t *o)
{
	flow_train_config_t *c = &o->cfg;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_graph_t g;
	flow_memplan_t plan;
	uint32_t T = c->seq_len ? c->seq_len : c->model.seq;
	int status = 0;

	flow_graph_init(&g);
	if (flow_graph_set_act_dtype(&g, flow_precision_act_dtype(c->precision),
				     &diag) != FLOW_OK ||
	    flow_gpt_build(&c->model, c->batch, T, &g, &diag) != FLOW_OK ||
	    flow_graph_backward(&g, &diag) != FLOW_OK ||
	    flow_memplan_build(&g, &plan, &diag) != FLOW_OK) {
		status = flow_tool_fail(tool, &diag);
		goto out_release_graph;
	}
	if (flow_graph_print(&g, &plan, stdout, &diag) != FLOW_OK)
		status = flow_tool_fail(tool, &diag);
	flow_memplan_release(&plan);
out_release_graph:
	flow_graph_release(&g);
	return status;
}

static void print_value(double v, const char *fmt)
{
	if (isnan(v))
		fputs("-", stdout);
	else
		printf(fmt, v);
}

static void write_row(const flow_train_row_t *r)
{
	printf("%" PRIu64 "\t%s\t%.9g\t", r->step, r->val ? "val" : "train", r->loss);
	if (r->val)
		fputs("-\t-\t", stdout);
	else
		printf("%.9g\t%.9g\t", (double)r->lr, (double)r->grad_norm);
	printf("%.2f\t%.0f\t", r->ms, r->tokens_per_s);
	print_value(r->mfu, "%.4f");
	putchar('\n');
}

/* How long a rank that lost a peer waits before ending the job: the others
 * see a death or a hang-up within milliseconds, and a stalled peer at
 * about the same deadline, and should say so themselves.  An abort at
 * once would kill them first (srun cancels the step, the launcher stops
 * the rest), and a survivor would then name a rank the abort killed. */
#define PEER_FAILURE_GRACE_S 2

static void let_the_others_report(const flow_world_t *w, flow_err_t err)
{
	if (w && flow_world_info(w)->size > 1 &&
	    (err == FLOW_ERR_PEER || err == FLOW_ERR_TIMEOUT))
		sleep(PEER_FAILURE_GRACE_S);
}

/* Train on this rank; only rank 0 writes the table.  A failure on any rank
 * prints its line here and ends the job through the launcher, so no rank
 * waits for a dead one. */
static int run_train(flow_tool_t *tool, train_opts_t *o)
{
	flow_train_config_t *c = &o->cfg;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *plan = NULL;
	flow_world_t *w = NULL;
	flow_comm_t *world_comm = NULL;
	flow_trainer_t *t = NULL;
	int status = 0;

	if (o->plan && flow_plan_read(o->plan, &plan, &diag) != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	if (flow_world_init(&w, o->comm_timeout, &diag) != FLOW_OK) {
		flow_plan_free(plan);
		return flow_tool_fail(tool, &diag);
	}
	bool speaks = flow_world_info(w)->rank == 0;
	if (flow_world_info(w)->size > 1 &&
	    flow_comm_world(w, FLOW_COMM_CPU, &world_comm, &diag) != FLOW_OK)
		goto fail;
	c->world = world_comm;
	if (plan && flow_train_config_set_plan(c, plan, &diag) != FLOW_OK)
		goto fail;
	if (plan) { /* the command line over the plan */
		apply_device(tool, o);
		check_device(tool, o);
	}
	if (!o->peak_given) /* a GPU's comes from its datasheet */
		c->peak_gflops = c->device == FLOW_DEVICE_CPU ? measure_peak() : -1.0;
	if (flow_trainer_new(c, &t, &diag) != FLOW_OK)
		goto fail;
	if (speaks) {
		if (plan) {
			char mesh[128];
			flow_mesh_format(&plan->mesh, mesh, sizeof mesh);
			printf("# plan %s (mesh %s)\n", plan->path, mesh);
		}
		flow_trainer_describe(t, stdout);
		printf("step\tphase\tloss\tlr\tgrad_norm\tms\ttokens_per_s\tmfu\n");
	}

	flow_train_row_t row;
	int rc;
	while ((rc = flow_trainer_next(t, &row, &diag)) > 0) {
		if (speaks)
			write_row(&row);
		if (row.checkpointed)
			flow_log(FLOW_LOG_INFO, "checkpoint of step %" PRIu64 " committed", row.step);
	}
	if (rc < 0)
		goto fail;
	if (speaks)
		flow_trainer_describe_end(t, stdout);
	if (c->profile && speaks) { /* rank 0's: N interleaved tables help no one */
		fflush(stdout);
		flow_trainer_print_profile(t, stderr);
	}
	flow_trainer_free(t);
	flow_comm_free(world_comm);
	flow_plan_free(plan);
	if (flow_world_free(w, &diag) != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	return status;
fail:
	status = flow_tool_fail(tool, &diag);
	let_the_others_report(w, diag.err);
	flow_trainer_free(t);
	flow_comm_free(world_comm);
	flow_plan_free(plan);
	flow_world_abort(w, status, flow_diag_message(&diag));
	return status;
}

int main(int argc, char **argv)
{
	flow_tool_t tool;
	train_opts_t o;

	/* 1. Options. */
	flow_tool_init(&tool, "flow-train", help_text,
		       FLOW_TOOL_LINE_BUFFERED | FLOW_TOOL_COMPUTE);
	int launched = flow_tool_launch_if_asked(&tool, argc, argv);
	if (launched >= 0)
		return launched;
	flow_tool_install_signal_cleanup();
	memset(&o, 0, sizeof o);
	flow_train_config_init(&o.cfg);
	o.comm_timeout = FLOW_COMM_TIMEOUT_DEFAULT;
	parse_options(&tool, &o, argc, argv);

	/* 2. Validation. */
	validate(&tool, &o);

	/* 3 and 4. Call libflow and write the results. */
	int status = o.emit_graph ? emit_graph(&tool, &o) : run_train(&tool, &o);

	/* 5. Check standard output. */
	return flow_tool_finish(&tool, status);
}
