/* The training loop of one rank: model, data, optimizer, evaluation,
 * checkpoints and exact resume (flow-train(1)).
 *
 * A trainer is a stream of rows: each call to flow_trainer_next runs one
 * optimizer step (K micro-batches of B sequences of T tokens, clipping,
 * AdamW) or one evaluation, and describes it.  Checkpoints are written
 * inside the stream when due; resuming from one continues the very same
 * computation: the same batches, the same parameters and moments, the same
 * bits. */
#ifndef FLOW_TRAIN_H
#define FLOW_TRAIN_H

#include <stdio.h>

#include <flow/ckpt.h>
#include <flow/comm.h>
#include <flow/device.h>

#include <flow/exec.h>
#include <flow/kernels.h>
#include <flow/model.h>
#include <flow/optim.h>
#include <flow/plan.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The arithmetic of a run.  fp32: every tensor and every GEMM in true
 * fp32 (no TF32 on a GPU), comparable with the CPU to float rounding.
 * bf16 (mixed precision): the activations that GEMMs read and write, and
 * their gradients, stored in bf16 (flow/ops.h says which; the graph's
 * act_dtype), every GEMM on bf16 operands with fp32 accumulation: tensor
 * cores on a GPU, the same sums on the CPU (slower than fp32 there: for
 * checking a GPU run); the residual stream, fp32 master weights,
 * gradients and AdamW state stay fp32, and a checkpoint holds the same
 * either way. */
typedef enum {
	FLOW_PRECISION_FP32 = 0,
	FLOW_PRECISION_BF16 = 1,
} flow_precision_t;

/* "fp32", "bf16". */
FLOW_EXPORT const char *flow_precision_name(flow_precision_t p);
/* The dtype a graph trained in precision p keeps its activations in
 * (flow_graph_set_act_dtype): f32 or bf16. */
FLOW_EXPORT flow_dtype_t flow_precision_act_dtype(flow_precision_t p);
/* "fp32" or "bf16" into *out; FLOW_ERR_USAGE naming the text otherwise. */
FLOW_EXPORT flow_err_t flow_precision_parse(const char *text,
					    flow_precision_t *out,
					    flow_diag_t *diag) FLOW_MUST_CHECK;

typedef struct flow_train_config {
	flow_gpt_config_t model;
	const char *data_dir;
	uint32_t batch;          /* B: sequences per micro-batch */
	uint32_t seq_len;        /* T */
	uint32_t grad_accum;     /* K: micro-batches per step */
	uint64_t steps;          /* N: the run ends after step N */
	flow_lr_schedule_t lr;   /* .total is set to steps */
	flow_adamw_params_t adamw; /* .lr is ignored (the schedule's) */
	float clip;              /* max gradient norm; 0: no clipping */
	uint64_t seed;           /* init and data order */
	uint64_t eval_every;     /* 0: never */
	uint64_t eval_batches;   /* micro-batches of the val split */
	const char *ckpt_dir;    /* NULL: no checkpoints */
	uint64_t ckpt_every;     /* 0: only after the last step */
	const char *resume;      /* a step directory, "latest" (in
				  * ckpt_dir), or NULL */
	/* A step directory whose parameters start the run (any layout, a
	 * training checkpoint or weights alone, of the same model): step 0,
	 * fresh AdamW state, the run's own data order; NULL: from the seed.
	 * Not with resume. */
	const char *init;
	flow_kernel_set_t kernels;
	/* Where parameters, gradients, optimizer state and activations live
	 * [cpu].  cuda: each rank takes the GPU of its local rank
	 * (flow/device.h; flow-train(1), GPU BINDING). */
	flow_device_kind_t device;
	flow_precision_t precision; /* [fp32] */
	/* cuda only: stage every collective through host memory with the
	 * CPU backend instead of NCCL, which lets several ranks share one
	 * GPU (to test parallel plans on one GPU). */
	bool host_comm;
	/* Data parallel over whole gradients in host memory: they are summed
	 * in buckets of at most this many bytes as the backward pass
	 * completes each, overlapping it (flow/grad_sync.h); 0: after the
	 * pass.  Default FLOW_GRAD_BUCKET_DEFAULT_BYTES.  The same bits
	 * either way. */
	size_t bucket_bytes;
	bool profile;
	double peak_gflops;      /* MFU denominator; 0: no MFU; < 0 on
				  * cuda: the GPU's datasheet peak for the
				  * precision (flow_cuda_peak_gflops) */
	const char *dump_batches; /* file of every batch's tokens, or NULL */
	const char *dump_grads;  /* checkpoint dir of the first step's
				  * gradients, or NULL */
	/* Every rank of the job, a CPU communicator (NULL: one rank);
	 * borrowed, it must outlive the trainer.  Without a plan the run is
	 * data parallel over all of it: every rank holds the whole model;
	 * batch is the global micro-batch, split evenly, so each rank reads
	 * its slice of the same global batch; gradients are summed over the
	 * ranks before clipping, so every rank takes the same step.  Only
	 * rank 0 writes checkpoints (the replicas are identical). */
	flow_comm_t *world;
	/* The plan the run follows (NULL: everything replicated on world),
	 * set with flow_train_config_set_plan; borrowed, it must outlive the
	 * trainer.  The data-parallel group is then the plan's dp axis,
	 * which the trainer splits from world.  Its parameter, gradient and
	 * AdamW layouts on dp give each rank its ZeRO shards (flow/zero.h);
	 * with shards every rank writes its own part of each checkpoint and
	 * rank 0 commits it.  A plan with an axis other than dp above size
	 * 1 (tensor parallelism) runs each rank's graph of shards
	 * (flow/localize.h) with boxing through world. */
	const flow_plan_t *plan;
} flow_train_config_t;

/* Defaults: B 4, T = model seq (set by flow_trainer_new when 0), K 1,
 * steps 10, lr 6e-4 with min_lr lr/10 (when negative), warmup 0, AdamW
 * betas (0.9, 0.95), eps 1e-8, weight decay 0.1, clip 1, seed 1337, eval
 * every 0 with 8 batches, CPU kernels. */
FLOW_EXPORT void flow_train_config_init(flow_train_config_t *cfg);

/* Follow plan: check it against the world (cfg->world's size, 1 without
 * one: set cfg->world first) with flow_plan_check, then take the model,
 * batch, seq_len and grad_accum from it, and its device and precision
 * when it names them, and keep it in cfg->plan.
 * FLOW_OK; else flow_plan_check's error, FLOW_ERR_FORMAT
 * "PATH:LINE: ..." naming the plan's line (for a plan of another world
 * size, its mesh line), or FLOW_ERR_NOMEM, and cfg is unchanged.  plan
 * is borrowed: it must outlive every trainer made from cfg.  Not
 * collective.  What the runtime cannot execute of a valid plan
 * flow_trainer_new refuses. */
FLOW_EXPORT flow_err_t flow_train_config_set_plan(flow_train_config_t *cfg,
						  const flow_plan_t *plan,
						  flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* One row of flow-train's output. */
typedef struct flow_train_row {
	uint64_t step;
	bool val;            /* an evaluation row (loss only, lr 0) */
	double loss;         /* mean over the step's tokens */
	float lr;
	float grad_norm;     /* before clipping */
	double ms;           /* wall time of the step */
	double tokens_per_s;
	double mfu;          /* model FLOPs / time / peak; NaN unknown */
	bool checkpointed;   /* a checkpoint of this step was committed */
} flow_train_row_t;

typedef struct flow_trainer flow_trainer_t;

/* Join the data-parallel group (with a plan and a world, a communicator
 * split from cfg->world over the plan's dp axis: collective over the
 * world, owned by the trainer), build the graph, allocate, open the data,
 * and initialise from the seed, from a checkpoint's parameters (cfg->init:
 * the model must equal cfg's) or resume from a checkpoint (whose model
 * and hyperparameters must equal cfg's: FLOW_ERR_USAGE naming the first
 * difference).  FLOW_ERR_NOTSUP naming the plan's line for a layout this
 * runtime cannot execute; the data's, the checkpoint's and the
 * communicator's errors otherwise.  *trainer_out is set only on FLOW_OK;
 * free it with flow_trainer_free(), before cfg->world. */
FLOW_EXPORT flow_err_t flow_trainer_new(const flow_train_config_t *cfg,
					flow_trainer_t **trainer_out,
					flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_trainer_free(flow_trainer_t *trainer);

/* The graph (forward and backward) and its executor; borrowed. */
FLOW_EXPORT const flow_graph_t *flow_trainer_graph(const flow_trainer_t *t);
FLOW_EXPORT flow_exec_t *flow_trainer_exec(flow_trainer_t *t);
/* This rank's data-parallel group, borrowed until flow_trainer_free:
 * cfg->world without a plan; with one, the ranks that differ from this
 * one only along the plan's dp axis (of size 1 on a one-rank world).
 * NULL without a world, or with a plan that has no dp axis. */
FLOW_EXPORT flow_comm_t *flow_trainer_dp_comm(const flow_trainer_t *t);
/* The last completed step (the resumed one before any call). */
FLOW_EXPORT uint64_t flow_trainer_step(const flow_trainer_t *t);

/* '#' lines: the whole configuration, the model size, memory (parameters,
 * gradients, optimizer state, the planned activation arena and its
 * unshared size), the data and where the run starts. */
FLOW_EXPORT void flow_trainer_describe(const flow_trainer_t *t, FILE *out);

/* Run the next step or evaluation: 1 with *row set, 0 when the run is
 * complete (steps reached; a final checkpoint is written before), <0 with
 * diag set (data read errors, checkpoint write errors: nothing already
 * committed is damaged). */
FLOW_EXPORT int flow_trainer_next(flow_trainer_t *t, flow_train_row_t *row,
				  flow_diag_t *diag) FLOW_MUST_CHECK;

/* '#' lines for after the last row: on a GPU, the peak of the device
 * memory the run held (its caching allocator's, over the whole run, ZeRO's
 * first-step room included); nothing on the CPU. */
FLOW_EXPORT void flow_trainer_describe_end(const flow_trainer_t *t,
					   FILE *out);

/* The per-op profile of the steps run so far, TSV with header
 * "op\tcalls\tms\tms_per_step\tpercent\tgflops". */
FLOW_EXPORT void flow_trainer_print_profile(const flow_trainer_t *t,
					    FILE *out);

/* ---- checkpoint layout ----------------------------------------------- */

/* One tensor a rank writes to a flow-train checkpoint: its description
 * (the name, "adamw.m/NAME" or "adamw.v/NAME" for AdamW's moments) and
 * the box of it this rank stores. */
typedef struct flow_train_ckpt_part {
	flow_ckpt_tensor_desc_t desc;
	flow_box_t box;
} flow_train_ckpt_part_t;

/* What a checkpoint holds: a run's whole state (state "contents"
 * "training": parameters, AdamW moments, data position), or the
 * parameters alone ("weights": imported, or for --init). */
typedef enum flow_train_ckpt_contents {
	FLOW_TRAIN_CKPT_TRAINING,
	FLOW_TRAIN_CKPT_WEIGHTS,
} flow_train_ckpt_contents_t;

/* What ck (read at path) holds, from its state "contents"; FLOW_ERR_FORMAT
 * naming path for anything else (a dump of gradients, flow-train
 * --dump-grads, or no contents). */
FLOW_EXPORT flow_err_t flow_train_ckpt_contents(
	const flow_ckpt_t *ck, const char *path,
	flow_train_ckpt_contents_t *contents_out, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* What one rank of a run under a plan writes to each checkpoint. */
typedef struct flow_train_ckpt_layout {
	bool writes;             /* it writes a data file and index */
	uint32_t writer;         /* as rank-NNNNN (when it writes) */
	uint32_t nwriters;       /* the ranks that write, committed together */
	size_t nparts;
	flow_train_ckpt_part_t *parts; /* in the order the trainer adds them */
} flow_train_ckpt_layout_t;

/* The checkpoint layout of world rank `rank` of a run under plan (valid:
 * flow_plan_check), exactly what flow_trainer_new's trainer of that rank
 * writes (the same names, boxes, mesh and nd-SBP text; with contents
 * FLOW_TRAIN_CKPT_WEIGHTS its parts without the moments), computed without
 * running anything: the plan's graph is built and localized for the rank,
 * and its ZeRO partition taken.  FLOW_ERR_USAGE for a rank off the mesh;
 * FLOW_ERR_NOTSUP naming the plan's line for a layout the runtime cannot
 * execute.  *layout_out is set only on FLOW_OK; release with
 * flow_train_ckpt_layout_release(). */
FLOW_EXPORT flow_err_t flow_train_ckpt_layout(
	const flow_plan_t *plan, int64_t rank,
	flow_train_ckpt_contents_t contents,
	flow_train_ckpt_layout_t *layout_out, flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Free the parts; accepts a released layout. */
FLOW_EXPORT void flow_train_ckpt_layout_release(
	flow_train_ckpt_layout_t *layout);

/* How flow_train_ckpt_reshard works. */
typedef struct flow_train_reshard_options {
	/* The most bytes of tensor data held at once: the target shards
	 * being written and the read buffers [0: twice the largest target
	 * shard]. */
	uint64_t max_memory;
	/* Target ranks written at once [0: the online cores, at most 8, as
	 * far as the budget leaves each a read buffer of 1 MiB and 1 MiB
	 * for each thread beyond the first]. */
	int threads;
} flow_train_reshard_options_t;

/* Write into the new step directory out (FLOW_ERR_IO when it exists),
 * committed atomically like a run's checkpoint, the checkpoint that the
 * ranks of plan (valid: flow_plan_check) write, from ck (read at ck_path,
 * which names it in errors) in whatever layout: for a training checkpoint
 * the parameters, AdamW moments and ck's state (step, data position),
 * for weights (state "contents" "weights") the parameters alone.  Each
 * target part is read as a box of the source's shards
 * (flow_ckpt_read_bounded) within opt->max_memory, the ranks' files on
 * several threads.  FLOW_ERR_FORMAT naming the first tensor (or the specs)
 * when plan is for another model or ck holds neither kind; FLOW_ERR_USAGE
 * when one shard and a row of a tensor do not fit the budget (before
 * anything is written); the reader's and writer's errors otherwise.  On
 * any error or a signal nothing is left under out.  opt may be NULL. */
FLOW_EXPORT flow_err_t flow_train_ckpt_reshard(
	const flow_ckpt_t *ck, const char *ck_path, const flow_plan_t *plan,
	const char *out, const flow_train_reshard_options_t *opt,
	flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
