/* flow-shard: turn text or token files into a dataset directory of
 * checksummed token shards and a manifest, verify one, list it, or print
 * the order in which the loader would read it.  Four modes, chosen by
 * option: build (the default, -o DIR INPUT...), --verify DIR, --info DIR
 * and --order DIR.  The work lives in lib/data/dataset.c, lib/data/shard.c,
 * lib/data/manifest.c and lib/data/loader.c; this file parses, validates, calls and
 * reports. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <flow/compress.h>
#include <flow/loader.h>
#include <flow/log.h>
#include <flow/shard.h>

#include "tool.h"

#define DEFAULT_SHARD_TOKENS (16ull << 20)
#define DEFAULT_FRAME_TOKENS 16384u
#define DEFAULT_ZSTD_LEVEL 3

static const char help_text[] =
	"Usage: flow-shard [options] -o DIR INPUT...\n"
	"       flow-shard --verify DIR\n"
	"       flow-shard --info DIR [--json]\n"
	"       flow-shard --order DIR --seq-len L --batch B --steps N [options]\n"
	"Turn text or token files into a dataset directory DIR of checksummed\n"
	"token shards and a manifest (flow-shard(5)), written atomically: DIR\n"
	"appears only when complete.  INPUT '-' is standard input.\n"
	"\n"
	"Building:\n"
	"  -o, --output DIR       the dataset directory to create (must not exist)\n"
	"      --shard-tokens N   tokens per shard, suffixes K, M, G [16M]\n"
	"      --val-tokens N     the first N tokens form the val split [0]\n"
	"      --format F         input format: auto, text, llmc, raw, npy [auto]\n"
	"      --dtype T          token type of raw input: u16 or u32\n"
	"      --vocab N          vocabulary size; every id must be below it\n"
	"                         [text: 256; token formats: required]\n"
	"      --compress[=L]     zstd-compress shards at level L (1-%d) [3]\n"
	"      --frame-tokens N   tokens per independently decodable zstd\n"
	"                         frame (with --compress) [16K]\n"
	"\n"
	"Other modes:\n"
	"      --verify DIR       check every shard against the manifest: sizes,\n"
	"                         checksums, frames, ids below the vocabulary\n"
	"      --info DIR         print the manifest's shards as TSV (or --json)\n"
	"      --order DIR        print which samples a rank reads, as TSV (or\n"
	"                         --json): step, rank, slot, position, epoch,\n"
	"                         sample, file, offset\n"
	"      --seq-len L        (--order) tokens per sample input\n"
	"      --batch B          (--order) global batch: samples per step\n"
	"      --steps N          (--order) number of steps to print\n"
	"      --rank R           (--order) data-parallel rank [0]\n"
	"      --world W          (--order) data-parallel ranks, dividing B [1]\n"
	"      --seed S           (--order) shuffling seed [0]\n"
	"      --start-step K     (--order) first step to print [0]\n"
	"      --split S          (--order) train or val [train]\n"
	"\n"
	"Common options:\n"
	"  -v, --verbose          more messages on stderr (repeatable)\n"
	"  -q, --quiet            fewer messages on stderr\n"
	"      --json             JSON instead of TSV (--info, --order)\n"
	"  -h, --help             show this help and exit\n"
	"      --version          show the version and build features and exit\n"
	"\n"
	"A progress line with tokens/s is shown while building when standard\n"
	"error is a terminal.  Exit status: 0 success, 1 a run-time failure\n"
	"(bad input, a damaged dataset), 2 a usage error.  See flow-shard(1).\n";

enum {
	OPT_SHARD_TOKENS = FLOW_OPT_TOOL,
	OPT_VAL_TOKENS,
	OPT_FORMAT,
	OPT_DTYPE,
	OPT_VOCAB,
	OPT_COMPRESS,
	OPT_FRAME_TOKENS,
	OPT_VERIFY,
	OPT_INFO,
	OPT_ORDER,
	OPT_SEQ_LEN,
	OPT_BATCH,
	OPT_STEPS,
	OPT_RANK,
	OPT_WORLD,
	OPT_SEED,
	OPT_START_STEP,
	OPT_SPLIT,
};

static const struct option long_options[] = {
	FLOW_COMMON_OPTIONS,
	{ "output", required_argument, NULL, 'o' },
	{ "shard-tokens", required_argument, NULL, OPT_SHARD_TOKENS },
	{ "val-tokens", required_argument, NULL, OPT_VAL_TOKENS },
	{ "format", required_argument, NULL, OPT_FORMAT },
	{ "dtype", required_argument, NULL, OPT_DTYPE },
	{ "vocab", required_argument, NULL, OPT_VOCAB },
	{ "compress", optional_argument, NULL, OPT_COMPRESS },
	{ "frame-tokens", required_argument, NULL, OPT_FRAME_TOKENS },
	{ "verify", required_argument, NULL, OPT_VERIFY },
	{ "info", required_argument, NULL, OPT_INFO },
	{ "order", required_argument, NULL, OPT_ORDER },
	{ "seq-len", required_argument, NULL, OPT_SEQ_LEN },
	{ "batch", required_argument, NULL, OPT_BATCH },
	{ "steps", required_argument, NULL, OPT_STEPS },
	{ "rank", required_argument, NULL, OPT_RANK },
	{ "world", required_argument, NULL, OPT_WORLD },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "start-step", required_argument, NULL, OPT_START_STEP },
	{ "split", required_argument, NULL, OPT_SPLIT },
	{ NULL, 0, NULL, 0 },
};

typedef enum { MODE_BUILD, MODE_VERIFY, MODE_INFO, MODE_ORDER } mode_t_;

typedef struct shard_opts {
	mode_t_ mode;
	const char *mode_option; /* "--verify", ...; NULL for build */
	const char *dir;         /* -o DIR, or the mode's DIR */
	flow_dataset_options_t build;
	flow_loader_options_t order;
	uint64_t steps, start_step;
	/* The first option seen of each group, for "applies only" errors. */
	const char *build_only, *order_only, *frame_option;
	bool have_seq_len, have_batch, have_steps;
	char **inputs;
	int ninputs;
} shard_opts_t;

static void set_mode(flow_tool_t *tool, shard_opts_t *o, mode_t_ mode,
		     const char *option, const char *dir)
{
	if (o->mode_option)
		flow_tool_usage_error(tool, "conflicting modes '%s' and '%s'",
				      o->mode_option, option);
	o->mode = mode;
	o->mode_option = option;
	o->dir = dir;
}

/* Keep option as the first seen of its group (for validate's messages). */
static void note_first(const char **first, const char *option)
{
	if (!*first)
		*first = option;
}

static void parse_options(flow_tool_t *tool, shard_opts_t *o, int argc,
			  char **argv)
{
	const char *output = NULL;
	int opt;
	while ((opt = getopt_long(argc, argv, ":o:" FLOW_COMMON_SHORT_OPTIONS,
				  long_options, NULL)) != -1) {
		if (flow_tool_common_option(tool, opt, argv))
			continue;
		const char *name = argv[optind - 1];
		switch (opt) {
		case 'o':
			output = optarg;
			note_first(&o->build_only, "-o");
			break;
		case OPT_SHARD_TOKENS:
			o->build.shard_tokens = flow_tool_size(tool, "--shard-tokens", optarg);
			if (o->build.shard_tokens == 0)
				flow_tool_usage_error(tool, "--shard-tokens: must be at least 1");
			note_first(&o->build_only, "--shard-tokens");
			break;
		case OPT_VAL_TOKENS:
			o->build.val_tokens = flow_tool_size(tool, "--val-tokens", optarg);
			note_first(&o->build_only, "--val-tokens");
			break;
		case OPT_FORMAT: {
			flow_diag_t diag = FLOW_DIAG_INIT;
			if (flow_input_format_parse(optarg, &o->build.input.format,
						    &diag) != FLOW_OK)
				flow_tool_usage_error(tool, "--format: unknown format '%s' (expected auto, text, llmc, raw or npy)",
						      optarg);
			note_first(&o->build_only, "--format");
			break;
		}
		case OPT_DTYPE:
			if (strcmp(optarg, "u16") == 0)
				o->build.input.raw_dtype = FLOW_DTYPE_U16;
			else if (strcmp(optarg, "u32") == 0)
				o->build.input.raw_dtype = FLOW_DTYPE_U32;
			else
				flow_tool_usage_error(tool, "--dtype: unknown token type '%s' (expected u16 or u32)",
						      optarg);
			note_first(&o->build_only, "--dtype");
			break;
		case OPT_VOCAB:
			o->build.vocab = (uint64_t)flow_tool_int(tool, "--vocab", optarg,
								 1, 4294967296ll);
			note_first(&o->build_only, "--vocab");
			break;
		case OPT_COMPRESS:
			o->build.zstd_level = optarg ?
				(int)flow_tool_int(tool, "--compress", optarg, 1,
						   flow_zstd_max_level()) :
				DEFAULT_ZSTD_LEVEL;
			note_first(&o->build_only, "--compress");
			break;
		case OPT_FRAME_TOKENS: {
			/* K/M suffixes like --shard-tokens; readers allocate
			 * a frame, so flow-shard(5) limits its length. */
			uint64_t n = flow_tool_size(tool, "--frame-tokens", optarg);
			if (n < 1 || n > FLOW_SHARD_MAX_FRAME_TOKENS)
				flow_tool_usage_error(tool, "--frame-tokens: %s tokens outside 1..%u (16M)",
						      optarg, FLOW_SHARD_MAX_FRAME_TOKENS);
			o->build.frame_tokens = (uint32_t)n;
			o->frame_option = "--frame-tokens";
			note_first(&o->build_only, "--frame-tokens");
			break;
		}
		case OPT_VERIFY:
			set_mode(tool, o, MODE_VERIFY, "--verify", optarg);
			break;
		case OPT_INFO:
			set_mode(tool, o, MODE_INFO, "--info", optarg);
			break;
		case OPT_ORDER:
			set_mode(tool, o, MODE_ORDER, "--order", optarg);
			break;
		case OPT_SEQ_LEN:
			o->order.seq_len = (uint32_t)flow_tool_int(tool, "--seq-len",
								   optarg, 1, UINT32_MAX);
			o->have_seq_len = true;
			note_first(&o->order_only, "--seq-len");
			break;
		case OPT_BATCH:
			o->order.global_batch = (uint64_t)flow_tool_int(
				tool, "--batch", optarg, 1, INT64_MAX);
			o->have_batch = true;
			note_first(&o->order_only, "--batch");
			break;
		case OPT_STEPS:
			o->steps = (uint64_t)flow_tool_int(tool, "--steps", optarg,
							   1, INT64_MAX);
			o->have_steps = true;
			note_first(&o->order_only, "--steps");
			break;
		case OPT_RANK:
			o->order.dp_rank = (uint32_t)flow_tool_int(tool, "--rank",
								   optarg, 0, UINT32_MAX - 1);
			note_first(&o->order_only, "--rank");
			break;
		case OPT_WORLD:
			o->order.dp_size = (uint32_t)flow_tool_int(tool, "--world",
								   optarg, 1, UINT32_MAX);
			note_first(&o->order_only, "--world");
			break;
		case OPT_SEED:
			o->order.seed = (uint64_t)flow_tool_int(tool, "--seed", optarg,
								0, INT64_MAX);
			note_first(&o->order_only, "--seed");
			break;
		case OPT_START_STEP:
			o->start_step = (uint64_t)flow_tool_int(tool, "--start-step",
								optarg, 0, INT64_MAX);
			note_first(&o->order_only, "--start-step");
			break;
		case OPT_SPLIT: {
			flow_diag_t diag = FLOW_DIAG_INIT;
			if (flow_split_parse(optarg, &o->order.split, &diag) != FLOW_OK)
				flow_tool_usage_error(tool, "--split: %s",
						      flow_diag_message(&diag));
			note_first(&o->order_only, "--split");
			break;
		}
		default:
			flow_tool_usage_error(tool, "unknown option '%s'", name);
		}
	}
	if (o->mode == MODE_BUILD)
		o->dir = output;
	o->inputs = argv + optind;
	o->ninputs = argc - optind;
}

static void validate(flow_tool_t *tool, shard_opts_t *o)
{
	if (o->mode != MODE_BUILD) {
		if (o->build_only)
			flow_tool_usage_error(tool, "'%s' cannot be used with '%s'",
					      o->build_only, o->mode_option);
		if (o->ninputs > 0)
			flow_tool_usage_error(tool, "unexpected argument '%s'",
					      o->inputs[0]);
	}
	if (o->mode != MODE_ORDER && o->order_only)
		flow_tool_usage_error(tool, "'%s' needs '--order'", o->order_only);
	if (tool->json && o->mode != MODE_INFO && o->mode != MODE_ORDER)
		flow_tool_usage_error(tool, "'--json' needs '--info' or '--order'");
	switch (o->mode) {
	case MODE_BUILD:
		if (!o->dir)
			flow_tool_usage_error(tool, "missing output directory (-o DIR)");
		if (o->ninputs == 0)
			flow_tool_usage_error(tool, "missing input (give files, or '-' for standard input)");
		for (int i = 0; i < o->ninputs; i++)
			for (int j = 0; j < i; j++)
				if (strcmp(o->inputs[i], "-") == 0 &&
				    strcmp(o->inputs[j], "-") == 0)
					flow_tool_usage_error(tool, "standard input '-' given twice");
		if (o->frame_option && !o->build.zstd_level)
			flow_tool_usage_error(tool, "'--frame-tokens' needs '--compress'");
		if (!o->build.shard_tokens)
			o->build.shard_tokens = DEFAULT_SHARD_TOKENS;
		if (o->build.zstd_level && !o->build.frame_tokens)
			o->build.frame_tokens = DEFAULT_FRAME_TOKENS;
		break;
	case MODE_ORDER:
		if (!o->have_seq_len)
			flow_tool_usage_error(tool, "'--order' needs '--seq-len'");
		if (!o->have_batch)
			flow_tool_usage_error(tool, "'--order' needs '--batch'");
		if (!o->have_steps)
			flow_tool_usage_error(tool, "'--order' needs '--steps'");
		if (!o->order.dp_size)
			o->order.dp_size = 1;
		if (o->order.dp_rank >= o->order.dp_size)
			flow_tool_usage_error(tool, "--rank %" PRIu32 " is not below --world %" PRIu32,
					      o->order.dp_rank, o->order.dp_size);
		if (o->order.global_batch % o->order.dp_size)
			flow_tool_usage_error(tool, "--world %" PRIu32 " does not divide --batch %" PRIu64,
					      o->order.dp_size, o->order.global_batch);
		if (o->start_step > UINT64_MAX - o->steps)
			flow_tool_usage_error(tool, "--start-step plus --steps is too large");
		o->order.dir = o->dir;
		break;
	case MODE_VERIFY:
	case MODE_INFO:
		break;
	}
}

/* ---- progress ------------------------------------------------------------ */

typedef struct progress {
	struct timespec start, last;
	bool shown;
} progress_t;

static double seconds_between(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) + 1e-9 * (double)(b->tv_nsec - a->tv_nsec);
}

/* One line on the terminal, redrawn at most ten times a second. */
static void show_progress(uint64_t done, int64_t total, void *userdata)
{
	progress_t *p = userdata;
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (p->shown && seconds_between(&p->last, &now) < 0.1 &&
	    (total < 0 || done < (uint64_t)total))
		return;
	p->last = now;
	p->shown = true;
	double secs = seconds_between(&p->start, &now);
	double rate = secs > 0 ? (double)done / secs : 0;
	if (total > 0)
		fprintf(stderr, "\r%" PRIu64 " / %" PRId64 " tokens (%3.0f%%)  %.2f Mtok/s ",
			done, total, 100.0 * (double)done / (double)total, rate / 1e6);
	else
		fprintf(stderr, "\r%" PRIu64 " tokens  %.2f Mtok/s ", done, rate / 1e6);
	fflush(stderr);
}

/* ---- modes ------------------------------------------------------------------ */

static int run_build(flow_tool_t *tool, shard_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_manifest_t m;
	progress_t p;
	memset(&p, 0, sizeof(p));
	if (isatty(STDERR_FILENO)) {
		clock_gettime(CLOCK_MONOTONIC, &p.start);
		o->build.progress = show_progress;
		o->build.progress_userdata = &p;
	}
	flow_err_t err = flow_dataset_build(o->dir, (const char *const *)o->inputs,
					    (size_t)o->ninputs, &o->build, &m,
					    &diag);
	if (p.shown)
		fputc('\n', stderr);
	if (err != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	flow_log(FLOW_LOG_INFO, "%s: %zu shards, %" PRIu64 " train and %" PRIu64 " val tokens",
		 o->dir, m.nshards, m.split_tokens[FLOW_SPLIT_TRAIN],
		 m.split_tokens[FLOW_SPLIT_VAL]);
	flow_manifest_release(&m);
	return 0;
}

static int run_verify(flow_tool_t *tool, shard_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_dataset_verify(o->dir, &diag) != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	flow_log(FLOW_LOG_INFO, "%s: every shard matches the manifest", o->dir);
	return 0;
}

static int run_info(flow_tool_t *tool, shard_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_manifest_t m;
	if (flow_manifest_read(o->dir, &m, &diag) != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	flow_err_t err = flow_manifest_print(&m, stdout, tool->json, &diag);
	flow_manifest_release(&m);
	/* A write error on stdout is reported by flow_tool_finish. */
	(void)err;
	return 0;
}

static int run_order(flow_tool_t *tool, shard_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_loader_t *loader;
	if (flow_loader_open(&o->order, &loader, &diag) != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	flow_err_t err = flow_loader_print_order(loader, o->start_step, o->steps,
						 stdout, tool->json, &diag);
	flow_loader_free(loader);
	if (err == FLOW_ERR_IO && ferror(stdout)) {
		/* Like git, a reader that went away (| head) is no error;
		 * any other write error is reported once, here. */
		clearerr(stdout);
		if (strstr(flow_diag_message(&diag), strerror(EPIPE)))
			return 0;
	}
	if (err != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	return 0;
}

int main(int argc, char **argv)
{
	flow_tool_t tool;
	shard_opts_t o;
	static char help[sizeof(help_text) + 16];

	/* 1. Options. */
	snprintf(help, sizeof(help), help_text, flow_zstd_max_level());
	flow_tool_init(&tool, "flow-shard", help, 0);
	flow_tool_install_signal_cleanup();
	memset(&o, 0, sizeof(o));
	parse_options(&tool, &o, argc, argv);

	/* 2. Validation. */
	validate(&tool, &o);

	/* 3 and 4. Call libflow and write the results. */
	int status = 0;
	switch (o.mode) {
	case MODE_BUILD:
		status = run_build(&tool, &o);
		break;
	case MODE_VERIFY:
		status = run_verify(&tool, &o);
		break;
	case MODE_INFO:
		status = run_info(&tool, &o);
		break;
	case MODE_ORDER:
		status = run_order(&tool, &o);
		break;
	}

	/* 5. Check standard output. */
	return flow_tool_finish(&tool, status);
}
