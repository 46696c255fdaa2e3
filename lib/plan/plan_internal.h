/* What the plan format (plan.c), the standard layouts (layouts.c) and the
 * plan checker (plan_check.c) share about a plan: growing its arrays, the
 * names of a parameter's AdamW moments, the layer scopes its stage lines
 * name, the line numbers of its printed form, and the training graph it
 * describes.  All defined in plan.c. */
#ifndef FLOW_PLAN_INTERNAL_H
#define FLOW_PLAN_INTERNAL_H

#include <flow/plan.h>

/* "adamw.m/" and "adamw.v/": a moment's tensor name is one of them and
 * its parameter's name.  Index m is the moment of role
 * plan_adamw_role(m). */
extern const char *const plan_adamw_prefix[2];

static inline int plan_adamw_role(int m)
{
	return m ? FLOW_PLAN_ROLE_ADAMW_V : FLOW_PLAN_ROLE_ADAMW_M;
}

/* The capacities of a plan's arrays while it is being filled; all 0 for
 * a plan with empty arrays. */
typedef struct plan_caps {
	size_t stages, ops, tensors;
} plan_caps_t;

/* Append a zeroed stage, op or tensor to p (its arrays grown as c
 * records); returns it, borrowed until the next append, or NULL when out
 * of memory (p unchanged). */
flow_plan_stage_t *plan_push_stage(flow_plan_t *p, plan_caps_t *c);
flow_plan_op_t *plan_push_op(flow_plan_t *p, plan_caps_t *c);
flow_plan_tensor_t *plan_push_tensor(flow_plan_t *p, plan_caps_t *c);

/* The layer scopes, one stage line each: "embed", "h.0" .. "h.(L-1)",
 * "head" for a model of L layers; plan_scope_name writes scope i's name
 * into buf (cap bytes, truncated to fit). */
size_t plan_scope_count(const flow_gpt_config_t *cfg);
void plan_scope_name(const flow_gpt_config_t *cfg, size_t i, char *buf,
		     size_t cap);

/* Set the line numbers of a plan made in memory to those of its records
 * as flow_plan_write prints them, so that check messages point into its
 * printed form. */
void plan_assign_lines(flow_plan_t *p);

/* The training graph of cfg at batch B and sequence length T in a plan's
 * precision record ("bf16": bf16 activations, flow/ops.h; "fp32" or
 * unsaid: f32): the model (flow_gpt_build) and its backward pass
 * (flow_graph_backward).  On FLOW_OK *g is initialised and filled
 * (release with flow_graph_release); on error it is released, and diag
 * has the builder's message. */
flow_err_t plan_graph_build(const flow_gpt_config_t *cfg, uint32_t B,
			    uint32_t T, const char *precision,
			    flow_graph_t *g, flow_diag_t *diag)
	FLOW_MUST_CHECK;

#endif
