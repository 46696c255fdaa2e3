/* The device a run trains on (flow/train.h: device, precision,
 * host_comm): checked before anything is built, so a run that cannot have
 * its GPU fails at once, with one line naming the rank and what is
 * missing. */
#include <config.h>

#include <string.h>

#include <flow/device.h>
#include <flow/world.h>

#include "runtime/train_internal.h"

const char *flow_precision_name(flow_precision_t p)
{
	return p == FLOW_PRECISION_BF16 ? "bf16" : "fp32";
}

flow_err_t flow_precision_parse(const char *text, flow_precision_t *out,
				flow_diag_t *diag)
{
	if (strcmp(text, "fp32") == 0) {
		*out = FLOW_PRECISION_FP32;
		return FLOW_OK;
	}
	if (strcmp(text, "bf16") == 0) {
		*out = FLOW_PRECISION_BF16;
		return FLOW_OK;
	}
	return flow_diag_set(diag, FLOW_ERR_USAGE,
			     "unknown precision '%.64s' (expected fp32 or bf16)",
			     text);
}

/* "rank 3 (node2): " for messages; "" for a one-rank run. */
static void rank_prefix(const flow_trainer_t *t, char *buf, size_t size)
{
	buf[0] = '\0';
	if (!t->cfg.world)
		return;
	flow_world_t *w = flow_comm_world_of(t->cfg.world);
	const flow_world_info_t *info = flow_world_info(w);
	snprintf(buf, size, "rank %d (%s): ", info->rank, info->host);
}

flow_err_t trainer_open_device(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	char who[FLOW_HOST_MAX + 32];
	flow_diag_t local = FLOW_DIAG_INIT;

	if (c->device == FLOW_DEVICE_CPU) {
		if (c->precision != FLOW_PRECISION_FP32)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "precision %s needs device cuda "
					     "(the CPU trains in fp32)",
					     flow_precision_name(c->precision));
		return FLOW_OK;
	}
	rank_prefix(t, who, sizeof who);
	if (flow_cuda_open(&local) != FLOW_OK)
		return flow_diag_set(diag, local.err, "%s%s", who,
				     flow_diag_message(&local));
	return flow_diag_set(diag, FLOW_ERR_NOTSUP,
			     "%sthis flow-train has no CUDA executor yet "
			     "(the GPU is found, but training on it is not "
			     "built): use --device cpu",
			     who);
}
