/* flow-ckpt: inspect, check, compare, reshard and convert checkpoints
 * (flow-ckpt(5)).  Six commands: info (what a checkpoint holds), verify
 * (every size, checksum and tiling), diff (two checkpoints element by
 * element, whatever their layouts), reshard (write the checkpoint another
 * plan's ranks would write, from box intersections of the source's
 * shards), export (to Hugging Face GPT-2 safetensors or an llm.c model
 * file) and import (the reverse, then resharded onto a plan).  The work
 * lives in lib/ckpt (reading any box, verifying, writing and committing;
 * the foreign formats) and lib/runtime/train_ckpt.c (the layout a plan's
 * ranks write, flow_train_ckpt_layout); this file parses, validates,
 * calls and reports. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <flow/ckpt.h>
#include <flow/file.h>
#include <flow/json.h>
#include <flow/log.h>
#include <flow/model.h>
#include <flow/plan.h>
#include <flow/safetensors.h>
#include <flow/tensor.h>
#include <flow/train.h>

#include "tool.h"

/* diff compares at most this many elements of a tensor at a time (rows
 * of its first dimension; at least one row), reading the shards through
 * a buffer of DIFF_SCRATCH_BYTES (or one logical row, when larger). */
#define DIFF_CHUNK_ELEMENTS ((int64_t)1 << 24)
#define DIFF_SCRATCH_BYTES ((size_t)4 << 20)

static const char help_text[] =
	"Usage: flow-ckpt info CKPT [--json]\n"
	"       flow-ckpt verify CKPT [--quick] [--json]\n"
	"       flow-ckpt diff A B [--tol X] [--json]\n"
	"       flow-ckpt reshard CKPT --plan PLAN -o OUT [--max-memory SIZE]\n"
	"       flow-ckpt export CKPT [--to FORMAT] -o OUT [--dtype D]\n"
	"                        [--max-shard-size SIZE]\n"
	"       flow-ckpt import SRC [--from FORMAT] --plan PLAN -o OUT\n"
	"                        [--max-memory SIZE]\n"
	"Inspect, check, compare, reshard and convert the checkpoints flow-train\n"
	"writes (flow-ckpt(5)).  CKPT is a step directory (ckpt/step-00000100).\n"
	"Tables are TSV after '#' lines, or --json.\n"
	"\n"
	"Commands:\n"
	"  info CKPT          the step, the run state and, per tensor, its dtype,\n"
	"                     logical shape, mesh, nd-SBP, shards and bytes\n"
	"  verify CKPT        read every shard: sizes, checksums, and that the\n"
	"                     shards of every tensor tile it; the first problem is\n"
	"                     named (file, tensor, byte offset)\n"
	"  diff A B           per tensor the largest absolute and relative\n"
	"                     difference and the count of unequal elements;\n"
	"                     exit 1 when they differ\n"
	"  reshard CKPT       write the checkpoint the ranks of --plan would write\n"
	"                     (parameters, AdamW moments, data position), into\n"
	"                     OUT, committed atomically\n"
	"  export CKPT        write the model's weights as a Hugging Face GPT-2\n"
	"                     directory (safetensors, config.json) or an llm.c\n"
	"                     model file, at OUT, committed atomically\n"
	"  import SRC         read such a directory (or a .safetensors file with\n"
	"                     config.json beside it) or llm.c file into the\n"
	"                     weights checkpoint the ranks of --plan would load\n"
	"                     (flow-train --init OUT)\n"
	"\n"
	"Options:\n"
	"      --quick            (verify) check the structure only, read no data\n"
	"      --tol X            (diff) elements within X of each other are equal\n"
	"                         [0: bit for bit]\n"
	"      --plan PLAN        (reshard, import) the plan to write for\n"
	"                         (flow-plan(5))\n"
	"  -o, --output OUT       (reshard, export, import) what to create: a step\n"
	"                         directory, an export directory or llm.c file;\n"
	"                         it must not exist\n"
	"      --to FORMAT        (export) safetensors or llmc [safetensors]\n"
	"      --from FORMAT      (import) safetensors or llmc [safetensors]\n"
	"      --dtype D          (export) f32, bf16 or f16 (llmc: f32 or bf16)\n"
	"                         [f32]\n"
	"      --max-shard-size SIZE\n"
	"                         (export to safetensors) split the tensors into\n"
	"                         files of at most SIZE bytes each, K/M/G\n"
	"                         suffixes, with model.safetensors.index.json\n"
	"                         [one file]\n"
	"      --threads N        (reshard, import) target ranks written at once\n"
	"                         [the cores, as far as --max-memory allows]\n"
	"      --max-memory SIZE  (reshard, import) the most bytes of tensor data\n"
	"                         held at once, with K/M/G suffixes [2x the\n"
	"                         largest shard written]; a shard that does not\n"
	"                         fit is refused\n"
	"  -v, --verbose          more messages on stderr (repeatable)\n"
	"  -q, --quiet            errors only\n"
	"      --json             the same records as JSON\n"
	"  -h, --help             this help\n"
	"      --version          version and build features\n"
	"\n"
	"Exit status: 0 success (diff: no difference; verify: no problem),\n"
	"1 a failure or a difference, 2 a usage error.\n";

enum {
	OPT_QUICK = FLOW_OPT_TOOL,
	OPT_TOL,
	OPT_PLAN,
	OPT_MAX_MEMORY,
	OPT_TO,
	OPT_FROM,
	OPT_DTYPE,
	OPT_MAX_SHARD_SIZE,
	OPT_THREADS,
};

static const struct option long_options[] = {
	{ "quick", no_argument, NULL, OPT_QUICK },
	{ "tol", required_argument, NULL, OPT_TOL },
	{ "plan", required_argument, NULL, OPT_PLAN },
	{ "output", required_argument, NULL, 'o' },
	{ "max-memory", required_argument, NULL, OPT_MAX_MEMORY },
	{ "to", required_argument, NULL, OPT_TO },
	{ "from", required_argument, NULL, OPT_FROM },
	{ "dtype", required_argument, NULL, OPT_DTYPE },
	{ "max-shard-size", required_argument, NULL, OPT_MAX_SHARD_SIZE },
	{ "threads", required_argument, NULL, OPT_THREADS },
	FLOW_COMMON_OPTIONS,
	{ NULL, 0, NULL, 0 },
};

typedef enum {
	CMD_INFO,
	CMD_VERIFY,
	CMD_DIFF,
	CMD_RESHARD,
	CMD_EXPORT,
	CMD_IMPORT,
} command_t;

static const char *const command_names[] = { "info",    "verify", "diff",
					     "reshard", "export", "import" };

/* The formats of export and import. */
typedef enum { FORMAT_SAFETENSORS, FORMAT_LLMC } format_t;

typedef struct ckpt_opts {
	command_t cmd;
	const char *args[2];
	bool quick;
	const char *quick_opt, *tol_opt, *plan_opt, *out_opt, *mem_opt;
	const char *to_opt, *from_opt, *dtype_opt, *shard_opt, *threads_opt;
	double tol;
	bool has_tol;
	const char *plan;
	const char *out;
	uint64_t max_memory; /* 0: 2x the largest shard */
	format_t format;     /* --to or --from */
	flow_dtype_t dtype;  /* F32 unless --dtype */
	uint64_t max_shard_size; /* 0: one file */
	int threads;         /* 0: the cores */
} ckpt_opts_t;

static format_t parse_format(const flow_tool_t *tool, const char *opt,
			     const char *text)
{
	if (strcmp(text, "safetensors") == 0)
		return FORMAT_SAFETENSORS;
	if (strcmp(text, "llmc") == 0)
		return FORMAT_LLMC;
	flow_tool_usage_error(tool, "%s: unknown format '%s' (safetensors or "
				    "llmc)",
			      opt, text);
}

static void parse_options(flow_tool_t *tool, ckpt_opts_t *o, int argc,
			  char **argv)
{
	int opt;
	while ((opt = getopt_long(argc, argv, ":" FLOW_COMMON_SHORT_OPTIONS "o:",
				  long_options, NULL)) != -1) {
		if (flow_tool_common_option(tool, opt, argv))
			continue;
		switch (opt) {
		case OPT_QUICK:
			o->quick = true;
			o->quick_opt = "--quick";
			break;
		case OPT_TOL:
			o->tol = flow_tool_double(tool, "--tol", optarg, 0,
						  INFINITY);
			o->has_tol = true;
			o->tol_opt = "--tol";
			break;
		case OPT_PLAN:
			o->plan = optarg;
			o->plan_opt = "--plan";
			break;
		case 'o':
			o->out = optarg;
			o->out_opt = "--output";
			break;
		case OPT_MAX_MEMORY:
			o->max_memory = flow_tool_size(tool, "--max-memory",
						       optarg);
			if (o->max_memory == 0)
				flow_tool_usage_error(tool, "--max-memory must "
							    "be positive");
			o->mem_opt = "--max-memory";
			break;
		case OPT_TO:
		case OPT_FROM:
			o->format = parse_format(tool, opt == OPT_TO ? "--to"
								     : "--from",
						 optarg);
			if (opt == OPT_TO)
				o->to_opt = "--to";
			else
				o->from_opt = "--from";
			break;
		case OPT_DTYPE: {
			flow_diag_t diag = FLOW_DIAG_INIT;
			if (flow_dtype_parse(optarg, &o->dtype, &diag) != FLOW_OK ||
			    (o->dtype != FLOW_DTYPE_F32 &&
			     o->dtype != FLOW_DTYPE_BF16 &&
			     o->dtype != FLOW_DTYPE_F16))
				flow_tool_usage_error(tool, "--dtype: '%s' is not "
							    "f32, bf16 or f16",
						      optarg);
			o->dtype_opt = "--dtype";
			break;
		}
		case OPT_THREADS:
			o->threads = (int)flow_tool_int(tool, "--threads", optarg,
							1, 64);
			o->threads_opt = "--threads";
			break;
		case OPT_MAX_SHARD_SIZE:
			o->max_shard_size = flow_tool_size(tool, "--max-shard-size",
							   optarg);
			if (o->max_shard_size == 0)
				flow_tool_usage_error(tool, "--max-shard-size "
							    "must be positive");
			o->shard_opt = "--max-shard-size";
			break;
		}
	}
	int n = argc - optind;
	if (n < 1)
		flow_tool_usage_error(tool, "a command is required: info, "
					    "verify, diff, reshard, export or "
					    "import");
	const char *cmd = argv[optind];
	size_t c = 0;
	while (c < sizeof command_names / sizeof *command_names &&
	       strcmp(cmd, command_names[c]) != 0)
		c++;
	if (c == sizeof command_names / sizeof *command_names)
		flow_tool_usage_error(tool, "unknown command '%s'", cmd);
	o->cmd = (command_t)c;
	int want = o->cmd == CMD_DIFF ? 2 : 1;
	if (n - 1 != want)
		flow_tool_usage_error(tool, "'%s' takes %d %s%s, got %d", cmd,
				      want,
				      o->cmd == CMD_IMPORT ? "source"
							   : "checkpoint",
				      want == 1 ? "" : "s", n - 1);
	for (int i = 0; i < want; i++)
		o->args[i] = argv[optind + 1 + i];
}

/* An option given to a command that does not take it. */
static void refuse_option(const flow_tool_t *tool, const char *opt,
			  const char *cmd)
{
	if (opt)
		flow_tool_usage_error(tool, "%s does not apply to '%s'", opt,
				      cmd);
}

static void validate(const flow_tool_t *tool, const ckpt_opts_t *o)
{
	const char *cmd = command_names[o->cmd];
	bool writes = o->cmd == CMD_RESHARD || o->cmd == CMD_EXPORT ||
		      o->cmd == CMD_IMPORT;
	bool to_plan = o->cmd == CMD_RESHARD || o->cmd == CMD_IMPORT;
	if (o->cmd != CMD_VERIFY)
		refuse_option(tool, o->quick_opt, cmd);
	if (o->cmd != CMD_DIFF)
		refuse_option(tool, o->tol_opt, cmd);
	if (!to_plan) {
		refuse_option(tool, o->plan_opt, cmd);
		refuse_option(tool, o->mem_opt, cmd);
		refuse_option(tool, o->threads_opt, cmd);
	}
	if (o->cmd != CMD_EXPORT) {
		refuse_option(tool, o->to_opt, cmd);
		refuse_option(tool, o->dtype_opt, cmd);
		refuse_option(tool, o->shard_opt, cmd);
	}
	if (o->cmd != CMD_IMPORT)
		refuse_option(tool, o->from_opt, cmd);
	if (!writes) {
		refuse_option(tool, o->out_opt, cmd);
		return;
	}
	if (to_plan && !o->plan)
		flow_tool_usage_error(tool, "%s needs --plan", cmd);
	if (!o->out)
		flow_tool_usage_error(tool, "%s needs -o OUT", cmd);
	if (tool->json)
		flow_tool_usage_error(tool, "--json does not apply to '%s'", cmd);
	if (o->cmd == CMD_EXPORT && o->format == FORMAT_LLMC) {
		refuse_option(tool, o->shard_opt, "export --to llmc");
		if (o->dtype == FLOW_DTYPE_F16)
			flow_tool_usage_error(tool, "--dtype f16: an llm.c model "
						    "file is f32 or bf16");
	}
}

/* Open a checkpoint, printing the error: NULL on failure. */
static flow_ckpt_t *open_ckpt(const flow_tool_t *tool, const char *path)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_ckpt_t *ck = NULL;
	if (flow_ckpt_open(path, &ck, &diag) != FLOW_OK) {
		flow_tool_error(tool, "%s", flow_diag_message(&diag));
		return NULL;
	}
	return ck;
}

static void json_key(const char *key)
{
	flow_json_write_string(stdout, key);
	fputc(':', stdout);
}

/* The meshes the tensors are on, comma-separated, in first-seen order. */
static void format_meshes(const flow_ckpt_t *ck, char *buf, size_t cap)
{
	size_t n = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < flow_ckpt_tensor_count(ck); i++) {
		const char *m = flow_ckpt_tensor_at(ck, i)->mesh;
		bool seen = false;
		for (size_t j = 0; j < i && !seen; j++)
			seen = strcmp(flow_ckpt_tensor_at(ck, j)->mesh, m) == 0;
		if (!seen && n < cap)
			n += (size_t)snprintf(buf + n, cap - n, "%s%s",
					      n ? "," : "", m);
	}
}

/* ---- info ---------------------------------------------------------------- */

static void print_info_json(const char *path, const flow_ckpt_t *ck)
{
	const flow_ckpt_kv_t *kv;
	size_t nkv = flow_ckpt_state(ck, &kv);
	fputc('{', stdout);
	json_key("checkpoint");
	flow_json_write_string(stdout, path);
	printf(",\"step\":%" PRIu64 ",\"ranks\":%zu,", flow_ckpt_step(ck),
	       flow_ckpt_ranks(ck));
	json_key("state");
	fputc('{', stdout);
	for (size_t i = 0; i < nkv; i++) {
		if (i)
			fputc(',', stdout);
		json_key(kv[i].key);
		flow_json_write_string(stdout, kv[i].value);
	}
	fputs("},", stdout);
	json_key("tensors");
	fputc('[', stdout);
	for (size_t i = 0; i < flow_ckpt_tensor_count(ck); i++) {
		const flow_ckpt_tensor_desc_t *d = flow_ckpt_tensor_at(ck, i);
		uint64_t bytes;
		size_t shards = flow_ckpt_tensor_shards(ck, i, &bytes);
		printf("%s{", i ? "," : "");
		json_key("name");
		flow_json_write_string(stdout, d->name);
		fputc(',', stdout);
		json_key("dtype");
		flow_json_write_string(stdout, flow_dtype_name(d->dtype));
		fputs(",\"shape\":[", stdout);
		for (int k = 0; k < d->shape.ndim; k++)
			printf("%s%" PRId64, k ? "," : "", d->shape.dims[k]);
		fputs("],", stdout);
		json_key("mesh");
		flow_json_write_string(stdout, d->mesh);
		fputc(',', stdout);
		json_key("sbp");
		flow_json_write_string(stdout, d->sbp);
		printf(",\"shards\":%zu,\"bytes\":%" PRIu64 "}", shards, bytes);
	}
	fputs("]}\n", stdout);
}

static int run_info(const flow_tool_t *tool, const ckpt_opts_t *o)
{
	flow_ckpt_t *ck = open_ckpt(tool, o->args[0]);
	if (!ck)
		return 1;
	if (tool->json) {
		print_info_json(o->args[0], ck);
		flow_ckpt_free(ck);
		return 0;
	}
	const flow_ckpt_kv_t *kv;
	size_t nkv = flow_ckpt_state(ck, &kv);
	const char *model = flow_ckpt_get(ck, "model");
	char meshes[256];
	format_meshes(ck, meshes, sizeof meshes);
	printf("# checkpoint\t%s\n", o->args[0]);
	printf("# step\t%" PRIu64 "\n", flow_ckpt_step(ck));
	printf("# model\t%s\n", model ? model : "-");
	printf("# ranks\t%zu\n", flow_ckpt_ranks(ck));
	printf("# mesh\t%s\n", meshes[0] ? meshes : "-");
	for (size_t i = 0; i < nkv; i++)
		printf("# state\t%s\t%s\n", kv[i].key, kv[i].value);
	puts("tensor\tdtype\tshape\tmesh\tsbp\tshards\tbytes");
	for (size_t i = 0; i < flow_ckpt_tensor_count(ck); i++) {
		const flow_ckpt_tensor_desc_t *d = flow_ckpt_tensor_at(ck, i);
		char shape[FLOW_CKPT_TEXT_MAX * 3];
		uint64_t bytes;
		size_t shards = flow_ckpt_tensor_shards(ck, i, &bytes);
		flow_shape_format(&d->shape, shape, sizeof shape);
		printf("%s\t%s\t%s\t%s\t%s\t%zu\t%" PRIu64 "\n", d->name,
		       flow_dtype_name(d->dtype), shape, d->mesh, d->sbp, shards,
		       bytes);
	}
	flow_ckpt_free(ck);
	return 0;
}

/* ---- verify -------------------------------------------------------------- */

static int run_verify(const flow_tool_t *tool, const ckpt_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_ckpt_t *ck = open_ckpt(tool, o->args[0]);
	if (!ck)
		return 1;
	if (!o->quick && flow_ckpt_verify(ck, &diag) != FLOW_OK) {
		flow_tool_error(tool, "%s", flow_diag_message(&diag));
		flow_ckpt_free(ck);
		return 1;
	}
	uint64_t bytes = 0;
	size_t shards = 0;
	for (size_t i = 0; i < flow_ckpt_tensor_count(ck); i++) {
		uint64_t b;
		shards += flow_ckpt_tensor_shards(ck, i, &b);
		bytes += b;
	}
	const char *checked = o->quick ? "structure" : "data";
	if (tool->json) {
		fputc('{', stdout);
		json_key("checkpoint");
		flow_json_write_string(stdout, o->args[0]);
		printf(",\"step\":%" PRIu64 ",\"tensors\":%zu,\"shards\":%zu,"
		       "\"bytes\":%" PRIu64 ",\"checked\":\"%s\",\"ok\":true}\n",
		       flow_ckpt_step(ck), flow_ckpt_tensor_count(ck), shards,
		       bytes, checked);
	} else {
		puts("checkpoint\tstep\ttensors\tshards\tbytes\tchecked");
		printf("%s\t%" PRIu64 "\t%zu\t%zu\t%" PRIu64 "\t%s\n",
		       o->args[0], flow_ckpt_step(ck),
		       flow_ckpt_tensor_count(ck), shards, bytes, checked);
	}
	flow_ckpt_free(ck);
	return 0;
}

/* ---- diff ---------------------------------------------------------------- */

static double half_to_double(uint16_t h)
{
	int e = (h >> 10) & 0x1f;
	double m = h & 0x3ff;
	double v = e == 0    ? ldexp(m, -24)
		   : e == 31 ? (m ? NAN : INFINITY)
			     : ldexp(m + 1024, e - 25);
	return (h & 0x8000) ? -v : v;
}

/* Element k of buf, of dtype, as a double. */
static double element_value(flow_dtype_t dtype, const unsigned char *buf,
			    int64_t k)
{
	size_t es = flow_dtype_size(dtype);
	const unsigned char *p = buf + (size_t)k * es;
	switch (dtype) {
	case FLOW_DTYPE_F32: {
		float f;
		memcpy(&f, p, 4);
		return f;
	}
	case FLOW_DTYPE_BF16: {
		uint16_t b;
		uint32_t u;
		float f;
		memcpy(&b, p, 2);
		u = (uint32_t)b << 16;
		memcpy(&f, &u, 4);
		return f;
	}
	case FLOW_DTYPE_F16: {
		uint16_t h;
		memcpy(&h, p, 2);
		return half_to_double(h);
	}
	case FLOW_DTYPE_I32: {
		int32_t x;
		memcpy(&x, p, 4);
		return x;
	}
	case FLOW_DTYPE_I64: {
		int64_t x;
		memcpy(&x, p, 8);
		return (double)x;
	}
	case FLOW_DTYPE_U16: {
		uint16_t x;
		memcpy(&x, p, 2);
		return x;
	}
	case FLOW_DTYPE_U8:
		return *p;
	case FLOW_DTYPE_U32: {
		uint32_t x;
		memcpy(&x, p, 4);
		return x;
	}
	}
	return NAN;
}

typedef struct diff_row {
	const char *name;
	const char *status; /* equal, within-tol, differ, mismatch, only-a,
			     * only-b */
	double max_abs, max_rel;
	int64_t unequal, numel;
} diff_row_t;

/* Compare tensor ia of a with ib of b (same dtype and shape), in chunks
 * of whole rows. */
static flow_err_t diff_tensor(const flow_ckpt_t *a, size_t ia,
			      const flow_ckpt_t *b, size_t ib, double tol,
			      bool has_tol, diff_row_t *row,
			      flow_diag_t *diag)
{
	const flow_ckpt_tensor_desc_t *d = flow_ckpt_tensor_at(a, ia);
	size_t es = flow_dtype_size(d->dtype);
	flow_box_t whole;
	flow_box_whole(&d->shape, &whole);
	row->numel = flow_box_numel(&whole);
	int64_t rows = d->shape.ndim ? d->shape.dims[0] : 1;
	int64_t row_numel = rows ? row->numel / rows : 0;
	int64_t step = row_numel ? DIFF_CHUNK_ELEMENTS / row_numel : rows;
	if (step < 1)
		step = 1;
	if (row->numel == 0)
		return FLOW_OK;
	size_t cap = (size_t)((step < rows ? step : rows) * row_numel) * es;
	size_t row_len = flow_ckpt_row_bytes(d);
	size_t scap = row_len > DIFF_SCRATCH_BYTES ? row_len : DIFF_SCRATCH_BYTES;
	unsigned char *ba = malloc(cap), *bb = malloc(cap), *sc = malloc(scap);
	flow_err_t err = FLOW_OK;
	if (!ba || !bb || !sc) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM,
				    "out of memory comparing '%s'", d->name);
		goto out_free;
	}
	for (int64_t r = 0; r < rows && err == FLOW_OK; r += step) {
		flow_box_t box = whole;
		if (d->shape.ndim) {
			box.start[0] = r;
			box.extent[0] = rows - r < step ? rows - r : step;
		}
		if ((err = flow_ckpt_read_bounded(a, ia, &box, ba, sc, scap,
						  diag)) != FLOW_OK ||
		    (err = flow_ckpt_read_bounded(b, ib, &box, bb, sc, scap,
						  diag)) != FLOW_OK)
			break;
		int64_t n = flow_box_numel(&box);
		for (int64_t k = 0; k < n; k++) {
			if (memcmp(ba + (size_t)k * es, bb + (size_t)k * es,
				   es) == 0)
				continue;
			double x = element_value(d->dtype, ba, k);
			double y = element_value(d->dtype, bb, k);
			double diff = fabs(x - y);
			double mag = fmax(fabs(x), fabs(y));
			double rel = mag > 0 ? diff / mag : 0;
			if (isnan(x) && isnan(y))
				diff = rel = 0;
			else if (isnan(diff))
				diff = rel = INFINITY;
			if (diff > row->max_abs)
				row->max_abs = diff;
			if (rel > row->max_rel)
				row->max_rel = rel;
			if (!has_tol || diff > tol)
				row->unequal++;
		}
	}
out_free:
	free(sc);
	free(ba);
	free(bb);
	return err;
}

static void print_diff_row(const flow_tool_t *tool, const diff_row_t *r,
			   bool first)
{
	if (!tool->json) {
		printf("%s\t%s\t%.9g\t%.9g\t%" PRId64 "\t%" PRId64 "\n",
		       r->name, r->status, r->max_abs, r->max_rel, r->unequal,
		       r->numel);
		return;
	}
	fputs(first ? "" : ",", stdout);
	fputc('{', stdout);
	json_key("name");
	flow_json_write_string(stdout, r->name);
	fputc(',', stdout);
	json_key("status");
	flow_json_write_string(stdout, r->status);
	/* JSON has no infinity: a NaN against a number is null. */
	if (isinf(r->max_abs))
		fputs(",\"max_abs_diff\":null,\"max_rel_diff\":null", stdout);
	else
		printf(",\"max_abs_diff\":%.9g,\"max_rel_diff\":%.9g",
		       r->max_abs, r->max_rel);
	printf(",\"unequal\":%" PRId64 ",\"numel\":%" PRId64 "}", r->unequal,
	       r->numel);
}

static int run_diff(const flow_tool_t *tool, const ckpt_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_ckpt_t *a = open_ckpt(tool, o->args[0]), *b = NULL;
	int status = 1;
	if (!a)
		return 1;
	if (!(b = open_ckpt(tool, o->args[1])))
		goto out_free;
	bool differ = false, first = true;
	if (tool->json) {
		fputc('{', stdout);
		json_key("a");
		flow_json_write_string(stdout, o->args[0]);
		fputc(',', stdout);
		json_key("b");
		flow_json_write_string(stdout, o->args[1]);
		fputs(",\"tensors\":[", stdout);
	} else {
		printf("# a\t%s\tstep %" PRIu64 "\n", o->args[0],
		       flow_ckpt_step(a));
		printf("# b\t%s\tstep %" PRIu64 "\n", o->args[1],
		       flow_ckpt_step(b));
		puts("tensor\tstatus\tmax_abs_diff\tmax_rel_diff\tunequal\tnumel");
	}
	for (size_t i = 0; i < flow_ckpt_tensor_count(a); i++) {
		const flow_ckpt_tensor_desc_t *da = flow_ckpt_tensor_at(a, i);
		diff_row_t row = { .name = da->name, .status = "equal" };
		int j = flow_ckpt_tensor_find(b, da->name);
		const flow_ckpt_tensor_desc_t *db =
			j < 0 ? NULL : flow_ckpt_tensor_at(b, (size_t)j);
		if (!db) {
			row.status = "only-a";
		} else if (da->dtype != db->dtype ||
			   !flow_shape_equal(&da->shape, &db->shape)) {
			row.status = "mismatch";
		} else if (diff_tensor(a, i, b, (size_t)j, o->tol, o->has_tol,
				       &row, &diag) != FLOW_OK) {
			if (tool->json)
				fputs("]}\n", stdout);
			flow_tool_error(tool, "%s", flow_diag_message(&diag));
			goto out_free;
		} else if (row.unequal) {
			row.status = "differ";
		} else if (row.max_abs > 0) {
			row.status = "within-tol";
		}
		if (strcmp(row.status, "equal") != 0 &&
		    strcmp(row.status, "within-tol") != 0)
			differ = true;
		print_diff_row(tool, &row, first);
		first = false;
	}
	for (size_t i = 0; i < flow_ckpt_tensor_count(b); i++) {
		const flow_ckpt_tensor_desc_t *db = flow_ckpt_tensor_at(b, i);
		if (flow_ckpt_tensor_find(a, db->name) >= 0)
			continue;
		diff_row_t row = { .name = db->name, .status = "only-b" };
		differ = true;
		print_diff_row(tool, &row, first);
		first = false;
	}
	if (tool->json)
		printf("],\"differ\":%s}\n", differ ? "true" : "false");
	status = differ ? 1 : 0;
out_free:
	flow_ckpt_free(b);
	flow_ckpt_free(a);
	return status;
}

/* ---- reshard, export and import ------------------------------------------ */

/* Read and check the plan, then reshard ck onto it
 * (flow_train_ckpt_reshard). */
static flow_err_t reshard(const ckpt_opts_t *o, const flow_ckpt_t *ck,
			  const char *ck_path, flow_diag_t *diag)
{
	flow_plan_t *plan = NULL;
	flow_err_t err = flow_plan_read(o->plan, &plan, diag);
	if (err == FLOW_OK)
		err = flow_plan_check(plan, flow_mesh_top_rank(&plan->mesh) + 1,
				      NULL, NULL, diag);
	flow_train_reshard_options_t opt = {
		.max_memory = o->max_memory,
		.threads = o->threads,
	};
	if (err == FLOW_OK)
		err = flow_train_ckpt_reshard(ck, ck_path, plan, o->out, &opt,
					      diag);
	flow_plan_free(plan);
	return err;
}

/* Refuse an output that exists before any work: every writer would, but
 * only after reading everything. */
static bool output_free(const flow_tool_t *tool, const char *out)
{
	struct stat st;
	if (lstat(out, &st) == 0) {
		flow_tool_error(tool, "output '%s' already exists", out);
		return false;
	}
	return true;
}

/* Export ck's weights as o asks. */
static flow_err_t export(const ckpt_opts_t *o, const flow_ckpt_t *ck,
			 const char *ck_path, flow_diag_t *diag)
{
	flow_train_ckpt_contents_t contents;
	flow_err_t err = flow_train_ckpt_contents(ck, ck_path, &contents, diag);
	if (err != FLOW_OK)
		return err;
	if (o->format == FORMAT_LLMC) {
		err = flow_llmc_model_export(ck, o->out, o->dtype, diag);
	} else {
		flow_hf_export_options_t opt = {
			.dtype = o->dtype,
			.max_shard_size = o->max_shard_size,
		};
		err = flow_hf_gpt2_export(ck, o->out, &opt, diag);
	}
	if (err == FLOW_OK)
		flow_log(FLOW_LOG_INFO, "wrote '%s' (%s, %s) from step %" PRIu64,
			 o->out, o->format == FORMAT_LLMC ? "llmc" : "safetensors",
			 flow_dtype_name(o->dtype), flow_ckpt_step(ck));
	return err;
}

/* reshard and export: OUT must not exist, then the checkpoint is opened
 * and written from by fn; every failure is a run-time one (exit 1). */
static int write_from_ckpt(const flow_tool_t *tool, const ckpt_opts_t *o,
			   flow_err_t (*fn)(const ckpt_opts_t *,
					    const flow_ckpt_t *, const char *,
					    flow_diag_t *))
{
	if (!output_free(tool, o->out))
		return 1;
	flow_ckpt_t *ck = open_ckpt(tool, o->args[0]);
	if (!ck)
		return 1;
	flow_diag_t diag = FLOW_DIAG_INIT;
	int status = 0;
	if (fn(o, ck, o->args[0], &diag) != FLOW_OK) {
		flow_tool_error(tool, "%s", flow_diag_message(&diag));
		status = 1;
	}
	flow_ckpt_free(ck);
	return status;
}

/* The weights are read whole into a one-rank checkpoint beside OUT
 * ("OUT.import.tmp.PID", never committed), which is then resharded onto
 * the plan like any other: one path writes every layout. */
static int run_import(const flow_tool_t *tool, const ckpt_opts_t *o)
{
	if (!output_free(tool, o->out))
		return 1;
	flow_diag_t diag = FLOW_DIAG_INIT;
	char whole[4096];
	if ((size_t)snprintf(whole, sizeof whole, "%s.import", o->out) >=
	    sizeof whole) {
		flow_tool_error(tool, "output name '%s' is too long", o->out);
		return 1;
	}
	flow_temp_dir_t *tmp = NULL;
	flow_ckpt_t *ck = NULL;
	flow_err_t err = flow_temp_dir_create(whole, &tmp, &diag);
	if (err == FLOW_OK)
		err = o->format == FORMAT_LLMC
			      ? flow_llmc_model_import(o->args[0],
						       flow_temp_dir_path(tmp),
						       &diag)
			      : flow_hf_gpt2_import(o->args[0],
						    flow_temp_dir_path(tmp),
						    &diag);
	if (err == FLOW_OK)
		err = flow_ckpt_open(flow_temp_dir_path(tmp), &ck, &diag);
	if (err == FLOW_OK)
		err = reshard(o, ck, o->args[0], &diag);
	if (err != FLOW_OK)
		flow_tool_error(tool, "%s", flow_diag_message(&diag));
	flow_ckpt_free(ck);
	flow_temp_dir_abort(tmp);
	return err == FLOW_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
	flow_tool_t tool;
	ckpt_opts_t o;

	/* 1. Options. */
	flow_tool_init(&tool, "flow-ckpt", help_text, 0);
	flow_tool_install_signal_cleanup();
	memset(&o, 0, sizeof o);
	parse_options(&tool, &o, argc, argv);

	/* 2. Validation. */
	validate(&tool, &o);

	/* 3 and 4. Call libflow and write the results. */
	int status = 0;
	switch (o.cmd) {
	case CMD_INFO:
		status = run_info(&tool, &o);
		break;
	case CMD_VERIFY:
		status = run_verify(&tool, &o);
		break;
	case CMD_DIFF:
		status = run_diff(&tool, &o);
		break;
	case CMD_RESHARD:
		status = write_from_ckpt(&tool, &o, reshard);
		break;
	case CMD_EXPORT:
		status = write_from_ckpt(&tool, &o, export);
		break;
	case CMD_IMPORT:
		status = run_import(&tool, &o);
		break;
	}

	/* 5. Check standard output. */
	return flow_tool_finish(&tool, status);
}
