/* flow-plan: show what a distributed layout means before training with it.
 * Five modes, chosen by option: --slices (the box of a tensor each rank
 * holds under an nd-SBP), --boxing (the steps and costs of converting one
 * layout into another, and with --verify a run of them in the reference
 * executor), --signatures (the SBP signatures of an op), --model (write
 * the standard plan of a model on a mesh, flow-plan(5)) and --check
 * (validate a plan and summarise its boxings and memory).  The work lives
 * in lib/sbp (layouts, boxing plans, the cluster profile, --verify's
 * check), lib/ops/signature.c and lib/plan (the plan format, the standard
 * layouts, the checker); this file parses, validates, calls and reports. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/boxing.h>
#include <flow/cluster.h>
#include <flow/file.h>
#include <flow/json.h>
#include <flow/log.h>
#include <flow/mem.h>
#include <flow/plan.h>
#include <flow/sbp.h>
#include <flow/signature.h>
#include <flow/tensor.h>

#include "tool.h"

#define DEFAULT_LIMIT 10
/* --verify keeps every simulated rank's pieces in this process. */
#define VERIFY_MAX_RANKS 65536

static const char help_text[] =
	"Usage: flow-plan --slices SHAPE --mesh MESH --sbp NDSBP [--dtype T]\n"
	"       flow-plan --boxing SHAPE --mesh MESH --from NDSBP --to NDSBP [options]\n"
	"       flow-plan --signatures OP --shapes 'IN;...->OUT;...' [options]\n"
	"       flow-plan --model SPEC --mesh DIMS --axes dp,tp --batch B [options]\n"
	"       flow-plan --check PLAN [--world N] [--cluster FILE]\n"
	"Show what a distributed layout means before training with it: the part\n"
	"of a tensor each rank holds, the steps and costs of converting one\n"
	"layout into another, and the layouts an op accepts.  Output is TSV\n"
	"after '#' lines describing the query, or --json.\n"
	"\n"
	"Slices:\n"
	"      --slices SHAPE     the logical shape: 6x8 or (6,8)\n"
	"      --mesh MESH        the mesh: 2x2, 2x4:dp,tp, 2x4@8 (ranks 8-15)\n"
	"      --sbp NDSBP        one SBP per mesh axis: (S(0),B); S(k) split along\n"
	"                         dimension k, B broadcast, P partial sum\n"
	"      --dtype T          element type for byte counts [f32]\n"
	"\n"
	"Boxing:\n"
	"      --boxing SHAPE     the logical shape of the tensor to convert\n"
	"      --mesh MESH        the placement it starts on\n"
	"      --from NDSBP       its nd-SBP there\n"
	"      --to NDSBP         the nd-SBP wanted\n"
	"      --to-mesh MESH     the placement wanted [--mesh]\n"
	"      --dtype T          element type [f32]\n"
	"      --cluster FILE     cluster profile: ranks per node, link latency and\n"
	"                         bandwidth [8 ranks per node; 5 us, 100 GB/s within\n"
	"                         a node; 10 us, 12.5 GB/s across nodes]\n"
	"      --verify           run the plan in the reference executor on integer\n"
	"                         data; check every rank's slice and the bytes moved\n"
	"\n"
	"Signatures:\n"
	"      --signatures OP    the op: matmul, attention, layernorm, gelu, ...\n"
	"      --shapes S         input and output shapes, IN1;IN2;...->OUT1;...\n"
	"                         ('-' or nothing for an absent optional input)\n"
	"      --mesh MESH        also count and list the n-D candidates on MESH\n"
	"      --limit N          n-D candidates to list [10]\n"
	"      --heads N          (attention) number of heads\n"
	"      --vocab N          (cross_entropy) real classes\n"
	"      --axis K           (bias_add) the dimension the bias runs along\n"
	"      --perm P           (transpose) output dimension i is input P[i]: 1,0\n"
	"      --reduce-axes L    (reduce_sum, reduce_mean) dimensions reduced: 0,2\n"
	"      --keepdims         (reduce_sum, reduce_mean) keep them, as extent 1\n"
	"\n"
	"Plans (flow-plan(5)):\n"
	"      --model SPEC       write the standard plan of model SPEC (gpt2-124m,\n"
	"                         gpt:layers=4,heads=4,dim=256,vocab=50257,seq=256)\n"
	"      --mesh DIMS        its mesh: 8, 2x4 (or 2x4:dp,tp without --axes)\n"
	"      --axes NAMES       the mesh axes' names, each dp or tp: dp,tp\n"
	"      --batch B          sequences per micro-batch over all dp ranks\n"
	"      --seq-len T        tokens per sequence [the model's]\n"
	"      --grad-accum K     micro-batches per optimizer step [1]\n"
	"      --zero Z           ZeRO stage on dp: 0, 1 (optimizer state),\n"
	"                         2 (and gradients), 3 (and parameters) [0]\n"
	"      --device D         the plan says: train on cpu or cuda [unsaid: cpu]\n"
	"      --precision P      the plan says: fp32 or bf16 [unsaid: fp32]\n"
	"  -o, --output FILE      write the plan to FILE, atomically [stdout]\n"
	"      --check PLAN       validate PLAN ('-': stdin), print a summary\n"
	"      --world N          (--check) the world size the mesh must have\n"
	"      --cluster FILE     (--check) prices the boxings, and holds the\n"
	"                         memory against its 'memory GIB' line\n"
	"\n"
	"Common options:\n"
	"  -v, --verbose          more messages on stderr (repeatable)\n"
	"  -q, --quiet            fewer messages on stderr\n"
	"      --json             a JSON array of the rows instead of TSV\n"
	"  -h, --help             show this help and exit\n"
	"      --version          show the version and build features and exit\n"
	"\n"
	"Exit status: 0 success, 1 a run-time failure (an unreadable cluster\n"
	"profile, a failed --verify), 2 a usage error, including a layout that\n"
	"is invalid for the shape.  See flow-plan(1) and flow(7).\n";

enum {
	OPT_SLICES = FLOW_OPT_TOOL,
	OPT_BOXING,
	OPT_SIGNATURES,
	OPT_MESH,
	OPT_SBP,
	OPT_DTYPE,
	OPT_FROM,
	OPT_TO,
	OPT_TO_MESH,
	OPT_CLUSTER,
	OPT_VERIFY,
	OPT_SHAPES,
	OPT_LIMIT,
	OPT_HEADS,
	OPT_VOCAB,
	OPT_AXIS,
	OPT_PERM,
	OPT_REDUCE_AXES,
	OPT_KEEPDIMS,
	OPT_MODEL,
	OPT_CHECK,
	OPT_AXES,
	OPT_BATCH,
	OPT_SEQ_LEN,
	OPT_GRAD_ACCUM,
	OPT_ZERO,
	OPT_DEVICE,
	OPT_PRECISION,
	OPT_WORLD,
};

static const struct option long_options[] = {
	FLOW_COMMON_OPTIONS,
	{ "slices", required_argument, NULL, OPT_SLICES },
	{ "boxing", required_argument, NULL, OPT_BOXING },
	{ "signatures", required_argument, NULL, OPT_SIGNATURES },
	{ "mesh", required_argument, NULL, OPT_MESH },
	{ "sbp", required_argument, NULL, OPT_SBP },
	{ "dtype", required_argument, NULL, OPT_DTYPE },
	{ "from", required_argument, NULL, OPT_FROM },
	{ "to", required_argument, NULL, OPT_TO },
	{ "to-mesh", required_argument, NULL, OPT_TO_MESH },
	{ "cluster", required_argument, NULL, OPT_CLUSTER },
	{ "verify", no_argument, NULL, OPT_VERIFY },
	{ "shapes", required_argument, NULL, OPT_SHAPES },
	{ "limit", required_argument, NULL, OPT_LIMIT },
	{ "heads", required_argument, NULL, OPT_HEADS },
	{ "vocab", required_argument, NULL, OPT_VOCAB },
	{ "axis", required_argument, NULL, OPT_AXIS },
	{ "perm", required_argument, NULL, OPT_PERM },
	{ "reduce-axes", required_argument, NULL, OPT_REDUCE_AXES },
	{ "keepdims", no_argument, NULL, OPT_KEEPDIMS },
	{ "model", required_argument, NULL, OPT_MODEL },
	{ "check", required_argument, NULL, OPT_CHECK },
	{ "axes", required_argument, NULL, OPT_AXES },
	{ "batch", required_argument, NULL, OPT_BATCH },
	{ "seq-len", required_argument, NULL, OPT_SEQ_LEN },
	{ "grad-accum", required_argument, NULL, OPT_GRAD_ACCUM },
	{ "zero", required_argument, NULL, OPT_ZERO },
	{ "device", required_argument, NULL, OPT_DEVICE },
	{ "precision", required_argument, NULL, OPT_PRECISION },
	{ "output", required_argument, NULL, 'o' },
	{ "world", required_argument, NULL, OPT_WORLD },
	{ NULL, 0, NULL, 0 },
};

typedef enum {
	MODE_NONE, MODE_SLICES, MODE_BOXING, MODE_SIGNATURES, MODE_MODEL,
	MODE_CHECK
} plan_mode_t;

typedef struct plan_opts {
	plan_mode_t mode;
	const char *mode_option; /* "--slices", "--boxing", "--signatures" */
	const char *mode_arg;    /* its SHAPE or OP */
	const char *mesh_text, *sbp_text, *dtype_text;
	const char *from_text, *to_text, *to_mesh_text, *cluster;
	const char *shapes_text;
	bool verify;
	size_t limit;
	/* The first option seen of each group, for "needs" errors. */
	const char *slices_only, *boxing_only, *sig_only, *mesh_only,
		*dtype_only, *model_only, *check_only;
	/* --model and --check. */
	const char *axes, *output;
	uint32_t batch, seq_len, grad_accum;
	int zero;
	const char *device, *precision; /* what the plan says, or NULL */
	int64_t world;

	/* Filled by validate(). */
	flow_dtype_t dtype;
	flow_shape_t shape;
	bool have_mesh;
	flow_mesh_t mesh, to_mesh;
	flow_nd_sbp_t sbp, from, to; /* sbp: --sbp */
	flow_sig_query_t query;
} plan_opts_t;

static void set_mode(flow_tool_t *tool, plan_opts_t *o, plan_mode_t mode,
		     const char *option, const char *arg)
{
	if (o->mode_option && o->mode != mode)
		flow_tool_usage_error(tool, "conflicting modes '%s' and '%s'",
				      o->mode_option, option);
	o->mode = mode;
	o->mode_option = option;
	o->mode_arg = arg;
}

/* Keep option as the first seen of its group (for validate's messages). */
static void note_first(const char **first, const char *option)
{
	if (!*first)
		*first = option;
}

/* A comma-separated list of tensor dimensions 0..FLOW_MAX_DIMS-1. */
static int parse_dim_list(flow_tool_t *tool, const char *option,
			  const char *text, int dims_out[FLOW_MAX_DIMS])
{
	int n = 0;
	const char *p = text;
	for (;;) {
		char item[32];
		size_t len = strcspn(p, ",");
		if (len == 0 || len >= sizeof(item))
			flow_tool_usage_error(tool, "%s: expected dimensions like 0,2 in '%s'",
					      option, text);
		if (n == FLOW_MAX_DIMS)
			flow_tool_usage_error(tool, "%s: more than %d dimensions in '%s'",
					      option, FLOW_MAX_DIMS, text);
		memcpy(item, p, len);
		item[len] = '\0';
		dims_out[n++] = (int)flow_tool_int(tool, option, item, 0,
						   FLOW_MAX_DIMS - 1);
		if (p[len] == '\0')
			return n;
		p += len + 1;
	}
}

static void parse_options(flow_tool_t *tool, plan_opts_t *o, int argc,
			  char **argv)
{
	flow_sig_attrs_t *attrs = &o->query.attrs;
	int opt;
	while ((opt = getopt_long(argc, argv, ":" FLOW_COMMON_SHORT_OPTIONS "o:",
				  long_options, NULL)) != -1) {
		if (flow_tool_common_option(tool, opt, argv))
			continue;
		switch (opt) {
		case OPT_SLICES:
			set_mode(tool, o, MODE_SLICES, "--slices", optarg);
			break;
		case OPT_BOXING:
			set_mode(tool, o, MODE_BOXING, "--boxing", optarg);
			break;
		case OPT_SIGNATURES:
			set_mode(tool, o, MODE_SIGNATURES, "--signatures", optarg);
			break;
		case OPT_MESH:
			o->mesh_text = optarg;
			break;
		case OPT_SBP:
			o->sbp_text = optarg;
			note_first(&o->slices_only, "--sbp");
			break;
		case OPT_DTYPE:
			o->dtype_text = optarg;
			note_first(&o->dtype_only, "--dtype");
			break;
		case OPT_FROM:
			o->from_text = optarg;
			note_first(&o->boxing_only, "--from");
			break;
		case OPT_TO:
			o->to_text = optarg;
			note_first(&o->boxing_only, "--to");
			break;
		case OPT_TO_MESH:
			o->to_mesh_text = optarg;
			note_first(&o->boxing_only, "--to-mesh");
			break;
		case OPT_CLUSTER:
			o->cluster = optarg;
			break;
		case OPT_VERIFY:
			o->verify = true;
			note_first(&o->boxing_only, "--verify");
			break;
		case OPT_SHAPES:
			o->shapes_text = optarg;
			note_first(&o->sig_only, "--shapes");
			break;
		case OPT_LIMIT:
			o->limit = (size_t)flow_tool_int(tool, "--limit", optarg,
							 0, 1 << 20);
			note_first(&o->sig_only, "--limit");
			note_first(&o->mesh_only, "--limit");
			break;
		case OPT_HEADS:
			attrs->heads = (uint32_t)flow_tool_int(tool, "--heads", optarg,
							       1, UINT32_MAX);
			note_first(&o->sig_only, "--heads");
			break;
		case OPT_VOCAB:
			attrs->vocab = (uint32_t)flow_tool_int(tool, "--vocab", optarg,
							       1, UINT32_MAX);
			note_first(&o->sig_only, "--vocab");
			break;
		case OPT_AXIS:
			attrs->axis = (int)flow_tool_int(tool, "--axis", optarg, 0,
							 FLOW_MAX_DIMS - 1);
			note_first(&o->sig_only, "--axis");
			break;
		case OPT_PERM: {
			int n = parse_dim_list(tool, "--perm", optarg, attrs->perm);
			for (int i = n; i < FLOW_MAX_DIMS; i++)
				attrs->perm[i] = i;
			note_first(&o->sig_only, "--perm");
			break;
		}
		case OPT_REDUCE_AXES: {
			int dims[FLOW_MAX_DIMS];
			int n = parse_dim_list(tool, "--reduce-axes", optarg, dims);
			attrs->axes_mask = 0;
			for (int i = 0; i < n; i++)
				attrs->axes_mask |= 1u << dims[i];
			note_first(&o->sig_only, "--reduce-axes");
			break;
		}
		case OPT_KEEPDIMS:
			attrs->keepdims = true;
			note_first(&o->sig_only, "--keepdims");
			break;
		case OPT_MODEL:
			set_mode(tool, o, MODE_MODEL, "--model", optarg);
			break;
		case OPT_CHECK:
			set_mode(tool, o, MODE_CHECK, "--check", optarg);
			break;
		case OPT_AXES:
			o->axes = optarg;
			note_first(&o->model_only, "--axes");
			break;
		case OPT_BATCH:
			o->batch = (uint32_t)flow_tool_int(tool, "--batch", optarg,
							   1, UINT32_MAX);
			note_first(&o->model_only, "--batch");
			break;
		case OPT_SEQ_LEN:
			o->seq_len = (uint32_t)flow_tool_int(tool, "--seq-len",
							     optarg, 1, UINT32_MAX);
			note_first(&o->model_only, "--seq-len");
			break;
		case OPT_GRAD_ACCUM:
			o->grad_accum = (uint32_t)flow_tool_int(
				tool, "--grad-accum", optarg, 1, UINT32_MAX);
			note_first(&o->model_only, "--grad-accum");
			break;
		case OPT_DEVICE:
			if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0)
				flow_tool_usage_error(tool, "--device: unknown device '%s' (expected cpu or cuda)",
						      optarg);
			o->device = optarg;
			note_first(&o->model_only, "--device");
			break;
		case OPT_PRECISION:
			if (strcmp(optarg, "fp32") != 0 && strcmp(optarg, "bf16") != 0)
				flow_tool_usage_error(tool, "--precision: unknown precision '%s' (expected fp32 or bf16)",
						      optarg);
			o->precision = optarg;
			note_first(&o->model_only, "--precision");
			break;
		case OPT_ZERO:
			o->zero = (int)flow_tool_int(tool, "--zero", optarg, 0, 3);
			note_first(&o->model_only, "--zero");
			break;
		case 'o':
			o->output = optarg;
			note_first(&o->model_only, "--output");
			break;
		case OPT_WORLD:
			o->world = flow_tool_int(tool, "--world", optarg, 1,
						 INT32_MAX);
			note_first(&o->check_only, "--world");
			break;
		default:
			flow_tool_usage_error(tool, "unknown option '%s'",
					      argv[optind - 1]);
		}
	}
	if (optind < argc)
		flow_tool_usage_error(tool, "unexpected argument '%s'", argv[optind]);
}

/* ---- validation ------------------------------------------------------------- */

static void parse_shape(flow_tool_t *tool, const char *option,
			const char *text, flow_shape_t *shape_out)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	size_t numel;
	if (flow_shape_parse(text, shape_out, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s: %s", option, flow_diag_message(&diag));
	if (flow_shape_numel(shape_out, &numel, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s: shape '%s' has too many elements",
				      option, text);
}

static void parse_mesh(flow_tool_t *tool, const char *option,
		       const char *text, flow_mesh_t *mesh_out)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_mesh_parse(text, mesh_out, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s: %s", option, flow_diag_message(&diag));
}

static void parse_nd_sbp(flow_tool_t *tool, const char *option,
			 const char *text, flow_nd_sbp_t *sbp_out)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_nd_sbp_parse(text, sbp_out, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s: %s", option, flow_diag_message(&diag));
}

/* The layout must be valid for the shape: the message is the library's
 * one line, which names the nd-SBP, the mesh and the shape. */
static void check_layout(flow_tool_t *tool, const flow_shape_t *shape,
			 const flow_nd_sbp_t *sbp, const flow_mesh_t *mesh)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_nd_sbp_check(shape, sbp, mesh, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "%s", flow_diag_message(&diag));
}

static void validate(flow_tool_t *tool, plan_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (o->mode == MODE_NONE)
		flow_tool_usage_error(tool, "missing mode (--slices, --boxing, --signatures, --model or --check)");
	if (o->mode != MODE_MODEL && o->model_only)
		flow_tool_usage_error(tool, "'%s' needs '--model'", o->model_only);
	if (o->mode != MODE_CHECK && o->check_only)
		flow_tool_usage_error(tool, "'%s' needs '--check'", o->check_only);
	if (o->cluster && o->mode != MODE_BOXING && o->mode != MODE_CHECK)
		flow_tool_usage_error(tool, "'--cluster' needs '--boxing' or '--check'");
	if ((o->mode == MODE_MODEL || o->mode == MODE_CHECK) && o->dtype_only)
		flow_tool_usage_error(tool, "'%s' needs '--slices' or '--boxing'",
				      o->dtype_only);
	if (o->mode == MODE_CHECK && o->mesh_text)
		flow_tool_usage_error(tool, "'--mesh' does not go with '--check': the plan names its mesh");
	if (o->mode != MODE_SLICES && o->slices_only)
		flow_tool_usage_error(tool, "'%s' needs '--slices'", o->slices_only);
	if (o->mode != MODE_BOXING && o->boxing_only)
		flow_tool_usage_error(tool, "'%s' needs '--boxing'", o->boxing_only);
	if (o->mode != MODE_SIGNATURES && o->sig_only)
		flow_tool_usage_error(tool, "'%s' needs '--signatures'", o->sig_only);
	if (o->mode == MODE_SIGNATURES && o->dtype_only)
		flow_tool_usage_error(tool, "'%s' needs '--slices' or '--boxing'",
				      o->dtype_only);
	if (o->mode == MODE_SIGNATURES && o->mesh_only && !o->mesh_text)
		flow_tool_usage_error(tool, "'%s' needs '--mesh'", o->mesh_only);

	o->dtype = FLOW_DTYPE_F32;
	if (o->dtype_text && flow_dtype_parse(o->dtype_text, &o->dtype, &diag) != FLOW_OK)
		flow_tool_usage_error(tool, "--dtype: %s", flow_diag_message(&diag));
	if (o->mesh_text) {
		parse_mesh(tool, "--mesh", o->mesh_text, &o->mesh);
		o->have_mesh = true;
	}

	switch (o->mode) {
	case MODE_SLICES:
		parse_shape(tool, "--slices", o->mode_arg, &o->shape);
		if (!o->mesh_text)
			flow_tool_usage_error(tool, "'--slices' needs '--mesh'");
		if (!o->sbp_text)
			flow_tool_usage_error(tool, "'--slices' needs '--sbp'");
		parse_nd_sbp(tool, "--sbp", o->sbp_text, &o->sbp);
		check_layout(tool, &o->shape, &o->sbp, &o->mesh);
		break;
	case MODE_BOXING:
		parse_shape(tool, "--boxing", o->mode_arg, &o->shape);
		if (!o->mesh_text)
			flow_tool_usage_error(tool, "'--boxing' needs '--mesh'");
		if (!o->from_text)
			flow_tool_usage_error(tool, "'--boxing' needs '--from'");
		if (!o->to_text)
			flow_tool_usage_error(tool, "'--boxing' needs '--to'");
		parse_nd_sbp(tool, "--from", o->from_text, &o->from);
		parse_nd_sbp(tool, "--to", o->to_text, &o->to);
		o->to_mesh = o->mesh;
		if (o->to_mesh_text)
			parse_mesh(tool, "--to-mesh", o->to_mesh_text, &o->to_mesh);
		check_layout(tool, &o->shape, &o->from, &o->mesh);
		check_layout(tool, &o->shape, &o->to, &o->to_mesh);
		if (o->verify) {
			int64_t top = flow_mesh_top_rank(&o->mesh);
			if (flow_mesh_top_rank(&o->to_mesh) > top)
				top = flow_mesh_top_rank(&o->to_mesh);
			if (top >= VERIFY_MAX_RANKS)
				flow_tool_usage_error(tool, "'--verify' simulates ranks 0 to %" PRId64 " in this process; at most %d ranks",
						      top, VERIFY_MAX_RANKS);
		}
		break;
	case MODE_SIGNATURES:
		if (!o->shapes_text)
			flow_tool_usage_error(tool, "'--signatures' needs '--shapes'");
		o->query.op = o->mode_arg;
		if (flow_shape_io_parse(o->shapes_text, FLOW_SIG_MAX_IO,
					o->query.in, o->query.in_present,
					&o->query.nin, o->query.out,
					&o->query.nout, &diag) != FLOW_OK)
			flow_tool_usage_error(tool, "--shapes: %s",
					      flow_diag_message(&diag));
		if (!o->mesh_only)
			o->limit = DEFAULT_LIMIT;
		break;
	case MODE_MODEL:
		if (!o->mesh_text)
			flow_tool_usage_error(tool, "'--model' needs '--mesh'");
		if (!o->batch)
			flow_tool_usage_error(tool, "'--model' needs '--batch'");
		if (tool->json)
			flow_tool_usage_error(tool, "'--json' does not go with '--model': a plan is text");
		break;
	case MODE_CHECK:
	case MODE_NONE:
		break;
	}
}

/* ---- output helpers ------------------------------------------------------- */

static void print_sbp(FILE *f, flow_sbp_t s)
{
	switch (s.kind) {
	case FLOW_SBP_SPLIT:
		fprintf(f, "S(%d)", s.axis);
		break;
	case FLOW_SBP_BROADCAST:
		fputc('B', f);
		break;
	case FLOW_SBP_PARTIAL:
		fputc('P', f);
		break;
	}
}

static const char *plural(int64_t n, const char *one, const char *many)
{
	return n == 1 ? one : many;
}

/* ---- --slices ---------------------------------------------------------------- */

static int run_slices(flow_tool_t *tool, const plan_opts_t *o)
{
	char shape[256], mesh[FLOW_MESH_TEXT_MAX], sbp[FLOW_SBP_TEXT_MAX];
	flow_shape_format(&o->shape, shape, sizeof(shape));
	flow_mesh_format(&o->mesh, mesh, sizeof(mesh));
	flow_nd_sbp_format(&o->sbp, sbp, sizeof(sbp));
	int64_t n = flow_mesh_size(&o->mesh);

	if (tool->json) {
		fputs("[", stdout);
	} else {
		size_t bytes = 0;
		int64_t copies = flow_nd_sbp_copies(&o->sbp, &o->mesh);
		/* numel * dtype size fits: validate() checked the shape's
		 * element count, and a slice is at most all of it. */
		size_t numel = flow_nd_sbp_max_local_numel(&o->shape, &o->sbp, &o->mesh);
		bool fits = flow_mul_size(numel, flow_dtype_size(o->dtype), &bytes);
		printf("# slices of %s on mesh %s as %s: %" PRId64 " %s of each element, ",
		       shape, mesh, sbp, copies, plural(copies, "copy", "copies"));
		if (fits)
			printf("at most %zu bytes (%s) per rank\n", bytes,
			       flow_dtype_name(o->dtype));
		else
			printf("more bytes per rank than this machine can count\n");
		printf("rank\tcoords\tbox\tshape\telements\n");
	}
	for (int64_t i = 0; i < n; i++) {
		int64_t coords[FLOW_MESH_MAX_AXES];
		flow_box_t box;
		flow_mesh_coords(&o->mesh, i, coords);
		flow_nd_sbp_local_box(&o->shape, &o->sbp, &o->mesh, i, &box);
		int64_t elements = flow_box_numel(&box);
		if (tool->json) {
			printf("%s\n  {\"rank\": %" PRId64 ", \"coords\": [", i ? "," : "",
			       flow_mesh_rank(&o->mesh, i));
			for (int a = 0; a < o->mesh.ndim; a++)
				printf("%s%" PRId64, a ? ", " : "", coords[a]);
			fputs("], \"box\": [", stdout);
			for (int d = 0; d < box.ndim; d++)
				printf("%s[%" PRId64 ", %" PRId64 "]", d ? ", " : "",
				       box.start[d], box.start[d] + box.extent[d]);
			fputs("], \"shape\": [", stdout);
			for (int d = 0; d < box.ndim; d++)
				printf("%s%" PRId64, d ? ", " : "", box.extent[d]);
			printf("], \"elements\": %" PRId64 "}", elements);
			continue;
		}
		printf("%" PRId64 "\t", flow_mesh_rank(&o->mesh, i));
		for (int a = 0; a < o->mesh.ndim; a++)
			printf("%s%" PRId64, a ? "," : "", coords[a]);
		putchar('\t');
		if (box.ndim == 0)
			putchar('-'); /* a scalar: nothing to slice */
		for (int d = 0; d < box.ndim; d++)
			printf("%s%" PRId64 ":%" PRId64, d ? "," : "", box.start[d],
			       box.start[d] + box.extent[d]);
		flow_shape_t local = { .ndim = box.ndim };
		memcpy(local.dims, box.extent, sizeof(local.dims));
		char text[256];
		flow_shape_format(&local, text, sizeof(text));
		printf("\t%s\t%" PRId64 "\n", text, elements);
	}
	if (tool->json)
		fputs(n ? "\n]\n" : "]\n", stdout);
	return 0;
}

/* ---- --boxing ------------------------------------------------------------------ */

static void describe_cluster(const plan_opts_t *o, const flow_cluster_t *c)
{
	printf("# cluster %s: %" PRId64 " %s per node; within a node %g us, %g GB/s; across nodes %g us, %g GB/s\n",
	       o->cluster ? o->cluster : "default", c->ranks_per_node,
	       plural(c->ranks_per_node, "rank", "ranks"),
	       c->intra.alpha_s * 1e6, c->intra.beta_bps / 1e9,
	       c->inter.alpha_s * 1e6, c->inter.beta_bps / 1e9);
}

static void print_json_layout(const char *key, const flow_nd_sbp_t *sbp,
			      const char *mesh_key, const flow_mesh_t *mesh)
{
	char text[FLOW_MESH_TEXT_MAX > FLOW_SBP_TEXT_MAX ? FLOW_MESH_TEXT_MAX :
							   FLOW_SBP_TEXT_MAX];
	flow_mesh_format(mesh, text, sizeof(text));
	printf(", \"%s\": ", mesh_key);
	flow_json_write_string(stdout, text);
	flow_nd_sbp_format(sbp, text, sizeof(text));
	printf(", \"%s\": ", key);
	flow_json_write_string(stdout, text);
}

/* The rows of flow_boxing_plan_print as JSON objects: the steps, then the
 * total (step "total"; its send and receive columns are the busiest
 * rank's bytes over the whole plan, from flow_boxing_plan_busiest as in
 * the TSV). */
static void print_boxing_json(const flow_boxing_plan_t *plan)
{
	fputs("[", stdout);
	for (size_t i = 0; i < plan->nsteps; i++) {
		const flow_boxing_step_t *s = &plan->steps[i];
		printf("\n  {\"step\": %zu, \"kind\": ", i + 1);
		flow_json_write_string(stdout, flow_boxing_kind_name(s->kind));
		fputs(", \"axes\": [", stdout);
		for (int a = 0, n = 0; a < FLOW_MESH_MAX_AXES; a++)
			if (s->axes & (1u << a))
				printf("%s%d", n++ ? ", " : "", a);
		putchar(']');
		print_json_layout("from", &s->from, "mesh", &s->mesh);
		print_json_layout("to", &s->to, "to_mesh", &s->to_mesh);
		printf(", \"max_send_bytes\": %" PRIu64 ", \"max_recv_bytes\": %" PRIu64
		       ", \"total_bytes\": %" PRIu64 ", \"time_us\": %.3f},",
		       s->max_send_bytes, s->max_recv_bytes, s->total_bytes,
		       s->time_s * 1e6);
	}
	uint64_t send, recv;
	flow_boxing_plan_busiest(plan, &send, &recv);
	fputs("\n  {\"step\": \"total\", \"kind\": null, \"axes\": null", stdout);
	print_json_layout("from", &plan->src, "mesh", &plan->src_mesh);
	print_json_layout("to", &plan->dst, "to_mesh", &plan->dst_mesh);
	printf(", \"max_send_bytes\": %" PRIu64 ", \"max_recv_bytes\": %" PRIu64
	       ", \"total_bytes\": %" PRIu64 ", \"time_us\": %.3f}\n]\n",
	       send, recv, plan->total_bytes, plan->time_s * 1e6);
}

static int run_boxing(flow_tool_t *tool, const plan_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_cluster_t cluster;
	flow_boxing_plan_t plan;

	if (o->cluster) {
		if (flow_cluster_read(o->cluster, &cluster, &diag) != FLOW_OK)
			return flow_tool_fail(tool, &diag);
	} else {
		flow_cluster_default(&cluster);
	}
	if (flow_boxing_plan(&o->shape, o->dtype, &o->mesh, &o->from,
			     &o->to_mesh, &o->to, &cluster, &plan, &diag) != FLOW_OK)
		return flow_tool_fail(tool, &diag);

	if (tool->json) {
		print_boxing_json(&plan);
	} else {
		char shape[256], from[FLOW_SBP_TEXT_MAX], to[FLOW_SBP_TEXT_MAX];
		char mesh[FLOW_MESH_TEXT_MAX], to_mesh[FLOW_MESH_TEXT_MAX];
		flow_shape_format(&o->shape, shape, sizeof(shape));
		flow_nd_sbp_format(&o->from, from, sizeof(from));
		flow_nd_sbp_format(&o->to, to, sizeof(to));
		flow_mesh_format(&o->mesh, mesh, sizeof(mesh));
		flow_mesh_format(&o->to_mesh, to_mesh, sizeof(to_mesh));
		printf("# boxing %s %s from %s on mesh %s to %s on mesh %s: %zu %s\n",
		       shape, flow_dtype_name(o->dtype), from, mesh, to, to_mesh,
		       plan.nsteps, plural((int64_t)plan.nsteps, "step", "steps"));
		describe_cluster(o, &cluster);
		/* A write error on stdout is reported by flow_tool_finish. */
		if (flow_boxing_plan_print(&plan, stdout, &diag) != FLOW_OK &&
		    !ferror(stdout))
			return flow_tool_fail(tool, &diag);
	}
	if (!o->verify)
		return 0;
	if (flow_boxing_verify(&plan, &diag) != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	if (tool->json)
		flow_log(FLOW_LOG_INFO, "verified: every rank holds its destination slice; bytes moved equal the plan's");
	else
		printf("# verified: every rank holds its destination slice; bytes moved equal the plan's\n");
	return 0;
}

/* ---- --signatures --------------------------------------------------------------- */

/* The name of the 1-D signature an n-D candidate uses on mesh axis a;
 * "?" when none matches. */
static const char *axis_signature_name(const flow_sig_query_t *q,
				       const flow_sig_t *sigs, int nsigs,
				       const flow_nd_sig_t *nd, int a)
{
	int i = flow_sig_axis_index(q, sigs, nsigs, nd, a);

	return i >= 0 && sigs[i].name ? sigs[i].name : "?";
}

static void print_shapes(const flow_shape_t *shapes, const bool *present,
			 int n)
{
	for (int i = 0; i < n; i++) {
		char text[256] = "-";
		if (!present || present[i])
			flow_shape_format(&shapes[i], text, sizeof(text));
		printf("%s%s", i ? " " : "", text);
	}
}

static void print_signature_row(bool json, bool first, const char *name,
				const flow_sig_query_t *q, const flow_sig_t *sig,
				const flow_nd_sig_t *nd)
{
	if (json) {
		printf("%s\n  {\"name\": ", first ? "" : ",");
		flow_json_write_string(stdout, name);
	} else {
		fputs(name, stdout);
	}
	for (int side = 0; side < 2; side++) {
		int n = side ? q->nout : q->nin;
		if (json)
			printf(", \"%s\": [", side ? "out" : "in");
		for (int i = 0; i < n; i++) {
			bool present = side || q->in_present[i];
			fputs(json ? (i ? ", " : "") : "\t", stdout);
			if (!present) {
				fputs(json ? "null" : "-", stdout);
				continue;
			}
			if (json)
				putchar('"');
			if (sig) {
				print_sbp(stdout, side ? sig->out[i] : sig->in[i]);
			} else {
				char text[FLOW_SBP_TEXT_MAX];
				flow_nd_sbp_format(side ? &nd->out[i] : &nd->in[i],
						   text, sizeof(text));
				fputs(text, stdout);
			}
			if (json)
				putchar('"');
		}
		if (json)
			putchar(']');
	}
	fputs(json ? "}" : "\n", stdout);
}

static int run_signatures(flow_tool_t *tool, const plan_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	const flow_sig_query_t *q = &o->query;
	flow_sig_t sigs[FLOW_SIG_MAX];
	flow_nd_sig_t *nd = NULL;
	size_t total = 0;
	int ncand = 0, status = 0;

	int nsigs = flow_sig_list(q, sigs, &diag);
	if (nsigs < 0)
		goto out_fail;
	if (o->have_mesh) {
		nd = calloc(o->limit ? o->limit : 1, sizeof(*nd));
		if (!nd) {
			flow_diag_set(&diag, FLOW_ERR_NOMEM, "cannot allocate %zu candidates",
				      o->limit);
			goto out_fail;
		}
		ncand = flow_sig_candidates(q, &o->mesh, nd, o->limit, &total, &diag);
		if (ncand < 0)
			goto out_fail;
	}

	if (!tool->json) {
		printf("# signatures of %s: inputs ", q->op);
		print_shapes(q->in, q->in_present, q->nin);
		fputs(", outputs ", stdout);
		print_shapes(q->out, NULL, q->nout);
		printf("; %d on one mesh axis\n", nsigs);
		if (o->have_mesh) {
			char mesh[FLOW_MESH_TEXT_MAX];
			flow_mesh_format(&o->mesh, mesh, sizeof(mesh));
			printf("# %zu n-D %s on mesh %s", total,
			       plural((int64_t)total, "candidate", "candidates"), mesh);
			if (ncand > 0)
				printf("; the first %d follow the 1-D signatures", ncand);
			putchar('\n');
		}
		fputs("name", stdout);
		for (int i = 0; i < q->nin; i++)
			printf("\tin%d", i + 1);
		for (int i = 0; i < q->nout; i++)
			printf("\tout%d", i + 1);
		putchar('\n');
	} else {
		putchar('[');
	}
	for (int s = 0; s < nsigs; s++)
		print_signature_row(tool->json, s == 0,
				    sigs[s].name ? sigs[s].name : "?", q,
				    &sigs[s], NULL);
	for (int c = 0; c < ncand; c++) {
		char name[FLOW_MESH_MAX_AXES * 40 + 4];
		size_t len = (size_t)snprintf(name, sizeof(name), "(");
		for (int a = 0; a < o->mesh.ndim && len < sizeof(name); a++)
			len += (size_t)snprintf(name + len, sizeof(name) - len, "%s%.32s",
						a ? "," : "",
						axis_signature_name(q, sigs, nsigs, &nd[c], a));
		if (len < sizeof(name))
			snprintf(name + len, sizeof(name) - len, ")");
		print_signature_row(tool->json, nsigs == 0 && c == 0, name, q,
				    NULL, &nd[c]);
	}
	if (tool->json)
		fputs(nsigs + ncand ? "\n]\n" : "]\n", stdout);
	goto out_free;

out_fail:
	/* An unknown op or shapes that do not fit it are the caller's
	 * mistake, reported like any other usage error. */
	if (diag.err == FLOW_ERR_USAGE) {
		free(nd);
		flow_tool_usage_error(tool, "%s", flow_diag_message(&diag));
	}
	status = flow_tool_fail(tool, &diag);
out_free:
	free(nd);
	return status;
}

/* ---- plans ---------------------------------------------------------------- */

static int write_plan_file(const flow_plan_t *plan, const char *path,
			   flow_diag_t *diag)
{
	flow_atomic_file_t *file;
	flow_err_t err;

	if ((err = flow_atomic_file_open(path, &file, diag)))
		return err;
	/* flow_plan_write cannot name the stream it was given: a write
	 * error (a full disk) is told here, naming the file. */
	flow_diag_t wd = FLOW_DIAG_INIT;
	err = flow_plan_write(plan, flow_atomic_file_stream(file), &wd);
	int saved = errno;
	if (err == FLOW_ERR_IO)
		flow_diag_errno(diag, err, saved ? saved : EIO,
				"cannot write '%s'",
				flow_atomic_file_temp_path(file));
	else if (err != FLOW_OK)
		flow_diag_set(diag, err, "%s", flow_diag_message(&wd));
	if (err != FLOW_OK) {
		flow_atomic_file_abort(file);
		return err;
	}
	return flow_atomic_file_commit(file, diag);
}

static int run_model(flow_tool_t *tool, const plan_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_t *plan;
	flow_err_t err;

	err = flow_plan_standard(o->mode_arg, o->mesh_text, o->axes, o->batch,
				 o->seq_len, o->grad_accum, o->zero, &plan,
				 &diag);
	if (err == FLOW_ERR_USAGE)
		flow_tool_usage_error(tool, "%s", flow_diag_message(&diag));
	if (err != FLOW_OK)
		return flow_tool_fail(tool, &diag);
	if (o->device)
		snprintf(plan->device, sizeof plan->device, "%s", o->device);
	if (o->precision)
		snprintf(plan->precision, sizeof plan->precision, "%s",
			 o->precision);
	if (o->output && strcmp(o->output, "-") != 0) {
		err = write_plan_file(plan, o->output, &diag);
	} else {
		/* A failed write to stdout is judged by flow_tool_finish,
		 * which knows a closed pipe from a full disk. */
		flow_err_t ignored = flow_plan_write(plan, stdout, NULL);
		(void)ignored;
		err = FLOW_OK;
	}
	flow_plan_free(plan);
	return err == FLOW_OK ? 0 : flow_tool_fail(tool, &diag);
}

static void summary_row(bool json, bool *first, const char *item,
			const char *kind, int64_t count, int64_t bytes)
{
	if (json) {
		printf("%s\n  {\"item\": \"%s\", \"kind\": \"%s\"", *first ? "[" : ",",
		       item, kind);
		if (count >= 0)
			printf(", \"count\": %" PRId64, count);
		if (bytes >= 0)
			printf(", \"bytes\": %" PRId64, bytes);
		putchar('}');
	} else {
		printf("%s\t%s\t", item, kind);
		if (count >= 0)
			printf("%" PRId64, count);
		else
			putchar('-');
		if (bytes >= 0)
			printf("\t%" PRId64 "\n", bytes);
		else
			printf("\t-\n");
	}
	*first = false;
}

static void print_summary(const flow_tool_t *tool, const plan_opts_t *o,
			  const flow_plan_t *plan, const flow_cluster_t *cluster,
			  const flow_plan_summary_t *s)
{
	char mesh[FLOW_MESH_TEXT_MAX];
	bool json = tool->json, first = true;

	flow_mesh_format(&plan->mesh, mesh, sizeof(mesh));
	if (!json) {
		printf("# plan %s: model %s, mesh %s, batch %" PRIu32
		       ", seq-len %" PRIu32 ", grad-accum %" PRIu32
		       ", zero %d: valid\n", plan->path, plan->model, mesh,
		       plan->batch, plan->seq_len, plan->grad_accum,
		       plan->zero);
		printf("# boxing bytes are per optimizer step, summed over "
		       "ranks; memory is the largest per-rank bytes\n");
		if (o->cluster && !cluster->memory_bytes)
			printf("# cluster %s has no memory limit: not checked\n",
			       o->cluster);
		else if (o->cluster)
			printf("# cluster %s: %.2f GiB per rank, %.2f GiB needed\n",
			       o->cluster,
			       (double)cluster->memory_bytes / 1073741824.0,
			       (double)s->rank_bytes / 1073741824.0);
		printf("item\tkind\tcount\tbytes\n");
	}
	summary_row(json, &first, "tensors", "-", (int64_t)s->tensors, -1);
	summary_row(json, &first, "ops", "-", (int64_t)s->ops, -1);
	for (int k = 0; k < FLOW_BOXING_KIND_COUNT; k++) {
		if (!s->boxing_count[k])
			continue;
		summary_row(json, &first, "boxing",
			    flow_boxing_kind_name((flow_boxing_kind_t)k),
			    (int64_t)s->boxing_count[k],
			    (int64_t)s->boxing_bytes[k]);
	}
	summary_row(json, &first, "boxing", "total", (int64_t)s->boxings,
		    (int64_t)s->boxing_total_bytes);
	summary_row(json, &first, "memory", "params", -1,
		    (int64_t)s->param_bytes);
	summary_row(json, &first, "memory", "grads", -1,
		    (int64_t)s->grad_bytes);
	summary_row(json, &first, "memory", "optimizer", -1,
		    (int64_t)s->optim_bytes);
	summary_row(json, &first, "memory", "activations", -1,
		    (int64_t)s->activation_bytes);
	summary_row(json, &first, "memory", "rank", -1,
		    (int64_t)s->rank_bytes);
	if (json)
		printf("\n]\n");
}

static int run_check(flow_tool_t *tool, const plan_opts_t *o)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_plan_summary_t summary;
	flow_cluster_t cluster;
	flow_plan_t *plan = NULL;
	int status = 0;

	flow_cluster_default(&cluster);
	if ((o->cluster &&
	     flow_cluster_read(o->cluster, &cluster, &diag) != FLOW_OK) ||
	    flow_plan_read(o->mode_arg, &plan, &diag) != FLOW_OK ||
	    flow_plan_check(plan, o->world, &cluster, &summary, &diag) !=
		    FLOW_OK) {
		/* A plan that does not hold is a failed check (1), even
		 * where the library calls it a usage error. */
		flow_tool_error(tool, "%s", flow_diag_message(&diag));
		status = 1;
		goto out_free_plan;
	}
	print_summary(tool, o, plan, &cluster, &summary);
out_free_plan:
	flow_plan_free(plan);
	return status;
}

int main(int argc, char **argv)
{
	flow_tool_t tool;
	plan_opts_t o;

	/* 1. Options. */
	flow_tool_init(&tool, "flow-plan", help_text, 0);
	flow_tool_install_signal_cleanup();
	memset(&o, 0, sizeof(o));
	for (int i = 0; i < FLOW_MAX_DIMS; i++)
		o.query.attrs.perm[i] = i;
	parse_options(&tool, &o, argc, argv);

	/* 2. Validation. */
	validate(&tool, &o);

	/* 3 and 4. Call libflow and write the results. */
	int status = 0;
	switch (o.mode) {
	case MODE_SLICES:
		status = run_slices(&tool, &o);
		break;
	case MODE_BOXING:
		status = run_boxing(&tool, &o);
		break;
	case MODE_SIGNATURES:
		status = run_signatures(&tool, &o);
		break;
	case MODE_MODEL:
		status = run_model(&tool, &o);
		break;
	case MODE_CHECK:
		status = run_check(&tool, &o);
		break;
	case MODE_NONE:
		break;
	}

	/* 5. Check standard output. */
	return flow_tool_finish(&tool, status);
}
