/* Private to the trainer (lib/runtime/train.c, setup and the step loop,
 * and lib/runtime/train_ckpt.c, checkpoints and resume): the trainer's
 * state and what the two halves call of each other. */
#ifndef FLOW_TRAIN_INTERNAL_H
#define FLOW_TRAIN_INTERNAL_H

#include <time.h>

#include <flow/boxing_exec.h>
#include <flow/device.h>
#include <flow/gpu_binding.h>
#include <flow/grad_sync.h>
#include <flow/file.h>
#include <flow/loader.h>
#include <flow/localize.h>
#include <flow/train.h>
#include <flow/zero.h>

struct flow_trainer {
	flow_train_config_t cfg;
	flow_graph_t graph;
	flow_exec_t *exec;
	flow_adamw_t *opt;
	flow_zero_t *zero;              /* ZeRO shards on dp (or none) */
	bool localized;                 /* a graph of shards (the plan has
					 * an axis other than dp > 1) */
	flow_local_t local;             /* its layouts; graph moved out */
	flow_boxing_comms_t *comms;     /* its mesh's communicators */
	flow_comm_t *dp;                /* the data-parallel group (NULL:
					 * this rank alone): cfg.world, or
					 * dp_owned under a plan */
	flow_comm_t *dp_owned;          /* the plan's dp group, made here */
	flow_comm_t *loss_group;        /* the CPU group over the axes where
					 * a localized plan's losses are
					 * partial (host values) */
	flow_comm_t *dp_data;           /* what gradients and parameters move
					 * on: dp, or dp's NCCL twin */
	flow_comm_t *world_nccl;        /* --device cuda without --comm cpu:
					 * the world on NCCL, and its dp axis */
	flow_comm_t *dp_nccl;
	flow_grad_sync_t *grad_sync;    /* the overlapped sums, or NULL */
	flow_loader_t *train;
	flow_loader_t *val;             /* NULL without evaluation */
	uint64_t data_checksum;         /* the dataset manifest's */
	uint64_t data_vocab;
	int tokens, targets;            /* input tensors */
	int32_t *tokens_host, *targets_host; /* a device's batch, filled on
					 * the host (NULL: the tensors) */
	void *inputs_read;              /* events of a device with a copy
					 * stream (else NULL): after the
					 * kernels that last read the inputs, */
	void *inputs_copied;            /* and after the copy of the next */
	float *staging;                 /* a device's checkpoint tensors pass
					 * through it, one at a time */
	size_t staging_bytes;
	flow_gpu_binding_t gpu;         /* --device cuda: this rank's GPU */
	flow_cuda_device_info_t gpu_info;
	const char *peak_source;        /* the datasheet of the MFU peak */
	uint64_t step;                  /* last completed step */
	uint64_t resumed_from;          /* 0 when started fresh */
	char *resumed_path;
	char *init_path;                /* cfg.init, when it was read */
	bool eval_pending;              /* evaluate before the next step */
	bool finished;
	double flops_per_step;          /* model FLOPs (flow/model.h) */
	uint64_t steps_timed;
	flow_atomic_file_t *batches;    /* --dump-batches, committed at end */
	char spec[FLOW_GPT_SPEC_MAX];
	int dp_rank, dp_size;           /* 0, 1 without a communicator */
	uint32_t local_batch;           /* this rank's share of batch */
};

/* A monotonic clock, seconds: what the profile's phases are timed with. */
static inline double train_now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- lib/runtime/train_ckpt.c -------------------------------------------- */

/* Write the parameters (grads: their gradients instead, and no moments)
 * to step_dir and commit it with the run state, each writing rank its
 * part; rank 0 commits once all have (a barrier).  FLOW_OK or the
 * checkpoint's error; nothing committed before is damaged. */
/* Does plan p put any axis but dp above size 1, so that each rank runs a
 * graph of shards?  (train.c) */
bool plan_localized(const flow_plan_t *p);

/* Check the run's device before anything is built (train_device.c):
 * the CPU, or the CUDA module, a driver and this rank's GPU, made the
 * thread's current device. */
flow_err_t trainer_open_device(flow_trainer_t *t, flow_diag_t *diag);
/* The "# device", "# binding" and "# device memory" lines of the
 * preamble (nothing for a CPU run). */
void trainer_describe_device(const flow_trainer_t *t, FILE *out);
/* The kernel set of the run's executor: the CUDA set on a GPU. */
flow_kernel_set_t trainer_kernel_set(const flow_trainer_t *t);

flow_err_t trainer_write_ckpt(flow_trainer_t *t, const char *step_dir,
			      bool grads, flow_diag_t *diag) FLOW_MUST_CHECK;

/* The checkpoint of the step just completed, under cfg.ckpt_dir, timed in
 * the profile as "checkpoint"; ranks that hold no part of it return
 * FLOW_OK at once. */
flow_err_t trainer_checkpoint(flow_trainer_t *t,
			      flow_diag_t *diag) FLOW_MUST_CHECK;

/* Continue from cfg.resume (a step directory, or "latest" in cfg.ckpt_dir):
 * its run state must equal this run's (FLOW_ERR_USAGE naming the first
 * difference), then this rank's parameters, moments and data position
 * are read from it and step, resumed_from and resumed_path set.
 * FLOW_ERR_FORMAT for a checkpoint that is not a training one or lacks a
 * tensor; the checkpoint's own errors otherwise. */
flow_err_t trainer_resume(flow_trainer_t *t, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Start from the parameters of cfg.init (a training checkpoint or weights
 * alone, in any layout), whose state "model" must equal this run's
 * (FLOW_ERR_USAGE); the step stays 0 and AdamW's moments zero. */
flow_err_t trainer_init_from(flow_trainer_t *t, flow_diag_t *diag)
	FLOW_MUST_CHECK;

#endif
