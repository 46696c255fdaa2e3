/* The optimizer: AdamW over a graph's parameters and the learning-rate
 * schedule.
 *
 * AdamW is torch.optim.AdamW (decoupled weight decay, bias-corrected
 * moments) applied per parameter tensor with the tensor's decay flag
 * (flow/graph.h): weights and embeddings decay, biases and layernorm
 * parameters do not, as in GPT-2/nanoGPT's two parameter groups.  Moments
 * m and v are f32 tensors shaped like their parameter. */
#ifndef FLOW_OPTIM_H
#define FLOW_OPTIM_H

#include <flow/exec.h>
#include <flow/kernels.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Linear warmup then cosine decay, for steps s = 1 .. total (1-based):
 *   s <= warmup:  lr * s / warmup
 *   otherwise:    min_lr + (lr - min_lr) * (1 + cos(pi * r)) / 2,
 *                 r = (s - warmup) / (total - warmup)
 * computed in double and rounded to float once.  warmup 0 and
 * min_lr == lr give a constant rate. */
typedef struct flow_lr_schedule {
	double lr;
	double min_lr;
	uint64_t warmup;
	uint64_t total;
} flow_lr_schedule_t;

FLOW_EXPORT float flow_lr_at(const flow_lr_schedule_t *schedule,
			     uint64_t step);

typedef struct flow_adamw flow_adamw_t;

/* Moments for every parameter of exec's graph, zero.  Free with
 * flow_adamw_free(). */
FLOW_EXPORT flow_err_t flow_adamw_new(flow_exec_t *exec,
				      const flow_adamw_params_t *hp,
				      flow_adamw_t **opt_out,
				      flow_diag_t *diag) FLOW_MUST_CHECK;
/* The same, each parameter updated only on its elements [begin[i],
 * begin[i] + count[i]) (i in graph order of the parameters): a ZeRO shard
 * (flow/zero.h), whose moments alone are held (count[i] floats each).
 * begin and count NULL: every parameter whole. */
FLOW_EXPORT flow_err_t flow_adamw_new_sharded(flow_exec_t *exec,
					      const flow_adamw_params_t *hp,
					      const size_t *begin,
					      const size_t *count,
					      flow_adamw_t **opt_out,
					      flow_diag_t *diag)
	FLOW_MUST_CHECK;
FLOW_EXPORT void flow_adamw_free(flow_adamw_t *opt);

/* One update at step t (1-based) with learning rate lr, from the
 * parameter gradients in exec. */
FLOW_EXPORT void flow_adamw_step(flow_adamw_t *opt, uint64_t t, float lr);

/* The moments of graph tensor param (a PARAM): m and v, numel floats each
 * (the shard's count when sharded); NULL when param is not a parameter. */
FLOW_EXPORT float *flow_adamw_m(flow_adamw_t *opt, int param);
FLOW_EXPORT float *flow_adamw_v(flow_adamw_t *opt, int param);

/* The global L2 norm of the gradients of the parameters opt trains, and
 * clipping to max_norm as torch.nn.utils.clip_grad_norm_ (max_norm <= 0:
 * measure only).  Returns the norm before clipping. */
FLOW_EXPORT float flow_adamw_clip_grad_norm(flow_adamw_t *opt,
					    float max_norm);
/* Clipping given the global norm (summed over ranks, flow/zero.h): the
 * gradients (shards) are scaled as flow_adamw_clip_grad_norm would. */
FLOW_EXPORT void flow_adamw_clip_to_norm(flow_adamw_t *opt, float norm,
					 float max_norm);

/* The graph's parameters in order (tensor indices) and their count; the
 * array is borrowed for opt's life. */
FLOW_EXPORT size_t flow_adamw_params(const flow_adamw_t *opt,
				     const int **params_out);

#ifdef __cplusplus
}
#endif

#endif
