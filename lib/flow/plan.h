/* Plans (flow-plan(5)): how one training step of a GPT model is laid out
 * over a mesh of ranks.  A plan holds the model spec, the mesh with its
 * axis names, the global batch, sequence length, gradient accumulation,
 * ZeRO stage and recompute policy, the pipeline stage of every layer
 * scope, the nd-SBP signature of every op of the training graph
 * (flow_gpt_build + flow_graph_backward) and the nd-SBP of every tensor
 * the runtime materialises, optimizer state included.
 *
 * flow_plan_standard() derives the standard layouts by rule (data
 * parallel on the axis named "dp", Megatron tensor parallel on "tp", ZeRO
 * on dp); flow_plan_check() validates any plan against the graph it
 * describes.  Printing a plan and parsing it back gives the same plan, and
 * the same bytes when printed again.  Not thread-safe per plan; distinct
 * plans may be used from different threads. */
#ifndef FLOW_PLAN_H
#define FLOW_PLAN_H

#include <stdio.h>

#include <flow/boxing.h>
#include <flow/cluster.h>
#include <flow/graph.h>
#include <flow/model.h>
#include <flow/sbp.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the plan format ---------------------------------------------------- */

#define FLOW_PLAN_VERSION 1
/* Tensor names: a graph name, or "adamw.m/" or "adamw.v/" and one. */
#define FLOW_PLAN_NAME_MAX (FLOW_GRAPH_NAME_MAX + 16)
#define FLOW_PLAN_PATH_MAX 256

/* Tensor roles: flow_role_t, and the two AdamW moments. */
#define FLOW_PLAN_ROLE_ADAMW_M FLOW_ROLE_COUNT
#define FLOW_PLAN_ROLE_ADAMW_V (FLOW_ROLE_COUNT + 1)
#define FLOW_PLAN_ROLE_COUNT (FLOW_ROLE_COUNT + 2)

/* flow_role_name(), or "adamw.m", "adamw.v"; NULL when out of range. */
FLOW_EXPORT const char *flow_plan_role_name(int role);

typedef struct flow_plan_stage {
	char name[FLOW_GRAPH_NAME_MAX]; /* "embed", "h.0", ..., "head" */
	int stage;
	size_t line;                    /* in the text it came from; 0: none */
} flow_plan_stage_t;

typedef struct flow_plan_op {
	char name[FLOW_GRAPH_NAME_MAX]; /* the graph op's name */
	int nin, nout;
	bool in_present[FLOW_OP_MAX_IO];  /* false: written "-" */
	bool out_present[FLOW_OP_MAX_IO];
	flow_nd_sbp_t in[FLOW_OP_MAX_IO];
	flow_nd_sbp_t out[FLOW_OP_MAX_IO];
	size_t line;
} flow_plan_op_t;

typedef struct flow_plan_tensor {
	char name[FLOW_PLAN_NAME_MAX];
	int role;                       /* FLOW_ROLE_* or FLOW_PLAN_ROLE_* */
	flow_nd_sbp_t sbp;              /* parameter gradients: after sync */
	size_t line;
} flow_plan_tensor_t;

typedef struct flow_plan {
	char path[FLOW_PLAN_PATH_MAX];  /* names the plan in messages */
	char model[FLOW_GPT_SPEC_MAX];  /* canonical (flow_gpt_format) */
	flow_gpt_config_t cfg;
	flow_mesh_t mesh;               /* axes named */
	uint32_t batch;       /* sequences per micro-batch, all dp ranks */
	uint32_t seq_len;     /* T */
	uint32_t grad_accum;  /* micro-batches per optimizer step, K */
	int zero;             /* ZeRO stage 0-3, on the axis named "dp" */
	char recompute[16];   /* "none" */
	/* Optional records: where the plan trains and in what precision,
	 * flow-train's defaults for --device and --precision; "" when the
	 * plan does not say. */
	char device[8];       /* "cpu", "cuda" */
	char precision[8];    /* "fp32", "bf16" */
	size_t nstages, nops, ntensors;
	flow_plan_stage_t *stages;
	flow_plan_op_t *ops;            /* training graph order */
	flow_plan_tensor_t *tensors;    /* graph order, then adamw.m, adamw.v */
	size_t line_model, line_mesh, line_batch, line_seq_len,
	       line_grad_accum, line_zero, line_recompute, line_device,
	       line_precision; /* 0: absent */
	size_t last_line;               /* lines in the text */
} flow_plan_t;

/* An empty plan; release with flow_plan_release(). */
FLOW_EXPORT void flow_plan_init(flow_plan_t *plan);
/* Free the arrays; accepts a released plan. */
FLOW_EXPORT void flow_plan_release(flow_plan_t *plan);
/* Free a plan from flow_plan_parse or flow_plan_read; NULL is ignored. */
FLOW_EXPORT void flow_plan_free(flow_plan_t *plan);

/* Parse the len bytes of text (need not be NUL-terminated); path names
 * it in messages.  Syntax only: records, fields, numbers and nd-SBPs (the
 * model spec and mesh are parsed too); flow_plan_check() validates the
 * rest.  On FLOW_OK *plan_out is a new plan (free with flow_plan_free());
 * else FLOW_ERR_FORMAT with "PATH:LINE: message" in diag, or
 * FLOW_ERR_NOMEM. */
FLOW_EXPORT flow_err_t flow_plan_parse(const char *text, size_t len,
				       const char *path,
				       flow_plan_t **plan_out,
				       flow_diag_t *diag) FLOW_MUST_CHECK;
/* The same from a file ("-": standard input); also FLOW_ERR_IO naming the
 * file. */
FLOW_EXPORT flow_err_t flow_plan_read(const char *path,
				      flow_plan_t **plan_out,
				      flow_diag_t *diag) FLOW_MUST_CHECK;

/* Print the plan in its text form.  FLOW_OK or FLOW_ERR_IO. */
FLOW_EXPORT flow_err_t flow_plan_write(const flow_plan_t *plan, FILE *out,
				       flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- the standard layouts ----------------------------------------------- */

/* The standard plan (flow-plan(5), STANDARD LAYOUTS) of model spec on
 * mesh (DIMS as flow_mesh_parse reads it) with the comma-separated axis
 * names axes (each "dp" or "tp"), global batch B, sequence length T (0:
 * the model's), K micro-batches and ZeRO stage zero.  Every op's signature
 * is a candidate of flow_sig_candidates, so the plan passes
 * flow_plan_check.  FLOW_ERR_USAGE for a bad argument (an unknown axis
 * name, B not divisible by the dp size, ZeRO without dp, ...).  On
 * FLOW_OK *plan_out is a new plan (free with flow_plan_free()). */
FLOW_EXPORT flow_err_t flow_plan_standard(const char *model, const char *mesh,
					  const char *axes, uint32_t B,
					  uint32_t T, uint32_t K, int zero,
					  flow_plan_t **plan_out,
					  flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- the checker -------------------------------------------------------- */

/* What flow_plan_check found.  Boxing bytes are per optimizer step: every
 * conversion is counted grad_accum times, except the gradient sync (a
 * conversion into a parameter gradient's layout), which runs once. */
typedef struct flow_plan_summary {
	size_t tensors, ops;
	size_t boxings;                          /* conversions per step */
	uint64_t boxing_count[FLOW_BOXING_KIND_COUNT]; /* steps, per kind */
	uint64_t boxing_bytes[FLOW_BOXING_KIND_COUNT]; /* total bytes */
	uint64_t boxing_total_bytes;             /* the sum over the kinds */
	/* Largest per-rank bytes, local shapes: */
	uint64_t param_bytes, grad_bytes, optim_bytes;
	uint64_t activation_bytes; /* inputs, activations and saved tensors
				    * (all live at the turn of the step
				    * without recompute) plus the largest
				    * activation gradient */
	uint64_t rank_bytes;       /* the sum */
} flow_plan_summary_t;

/* Validate plan: the model builds at its batch and seq-len; the mesh has
 * world ranks (world > 0; 0 skips this); the dp size divides the batch;
 * ZeRO only with a dp axis; one stage line per layer scope; every graph
 * op and tensor (and each parameter's adamw.m and adamw.v) once, no
 * other; each tensor's nd-SBP valid for its shape (flow_nd_sbp_check);
 * each op's SBPs a signature of it (flow_sig_check); every place an op's
 * SBP differs from its tensor's layout converted by a boxing plan; the
 * per-rank memory (rank_bytes) within the cluster's memory_bytes when
 * it gives one.  cluster (NULL: flow_cluster_default) prices the
 * boxings.  Returns FLOW_OK and fills *summary_out (may be NULL), or
 * FLOW_ERR_FORMAT with "PATH:LINE: message" naming the tensor or op
 * (LINE one past the last for something missing), or "PATH: a rank needs
 * N GiB (params, grads, optimizer, activations in GiB), more than the
 * cluster's M GiB"; FLOW_ERR_NOMEM. */
FLOW_EXPORT flow_err_t flow_plan_check(const flow_plan_t *plan, int64_t world,
				       const flow_cluster_t *cluster,
				       flow_plan_summary_t *summary_out,
				       flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
