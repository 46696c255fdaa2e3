/* The device a run trains on (flow/train.h: device, precision,
 * host_comm): checked before anything is built, so a run that cannot have
 * its GPU fails at once, with one line naming the rank and what is
 * missing. */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include <flow/caching_alloc.h>
#include <flow/device.h>
#include <flow/world.h>

#include "runtime/train_internal.h"

const char *flow_precision_name(flow_precision_t p)
{
	return p == FLOW_PRECISION_BF16 ? "bf16" : "fp32";
}

flow_dtype_t flow_precision_act_dtype(flow_precision_t p)
{
	return p == FLOW_PRECISION_BF16 ? FLOW_DTYPE_BF16 : FLOW_DTYPE_F32;
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

/* This rank's GPU by the binding rule (flow/gpu_binding.h), from its
 * place on its node and what CUDA shows it. */
static flow_err_t bind_gpu(flow_trainer_t *t, int visible, flow_diag_t *diag)
{
	flow_gpu_binding_input_t in;
	char host[FLOW_HOST_MAX] = "this node";

	memset(&in, 0, sizeof in);
	flow_gpu_binding_input_from_env(&in);
	in.rank = 0;
	in.local_rank = 0;
	in.local_size = 1;
	if (t->cfg.world) {
		const flow_world_info_t *info =
			flow_world_info(flow_comm_world_of(t->cfg.world));
		in.rank = info->rank;
		in.local_rank = info->local_rank;
		in.local_size = info->local_size;
		snprintf(host, sizeof host, "%s", info->host);
	}
	in.node = host;
	in.visible_count = visible;
	in.shared_ok = t->cfg.host_comm;
	return flow_gpu_binding_pick(&in, &t->gpu, diag);
}

flow_err_t trainer_open_device(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	char who[FLOW_HOST_MAX + 32];
	flow_diag_t local = FLOW_DIAG_INIT;
	int visible = 0;
	flow_err_t err;

	if (c->device == FLOW_DEVICE_CPU)
		return FLOW_OK;
	rank_prefix(t, who, sizeof who);
	if ((err = flow_cuda_count(&visible, &local)) != FLOW_OK)
		return flow_diag_set(diag, err, "%s%s", who,
				     flow_diag_message(&local));
	if ((err = bind_gpu(t, visible, diag)) != FLOW_OK)
		return err;
	if ((err = flow_cuda_select(t->gpu.device, &local)) != FLOW_OK ||
	    (err = flow_cuda_info(t->gpu.device, &t->gpu_info, &local)) !=
		    FLOW_OK)
		return flow_diag_set(diag, err, "%s%s", who,
				     flow_diag_message(&local));
	if (c->peak_gflops < 0) /* the datasheet's, for MFU */
		t->cfg.peak_gflops = flow_cuda_peak_gflops(
			t->gpu_info.name, c->precision == FLOW_PRECISION_BF16,
			&t->peak_source);
	return FLOW_OK;
}

void trainer_describe_device(const flow_trainer_t *t, FILE *out)
{
	const flow_train_config_t *c = &t->cfg;
	flow_alloc_stats_t mem;
	flow_diag_t ignored = FLOW_DIAG_INIT;

	if (c->device == FLOW_DEVICE_CPU)
		return;
	const flow_cuda_device_info_t *g = &t->gpu_info;
	fprintf(out, "# device cuda:%d %s (sm_%d%d, %d SMs, %.1f GiB, PCI %s), "
		     "precision %s, collectives %s\n",
		t->gpu.device, g->name, g->cc_major, g->cc_minor, g->sm_count,
		(double)g->global_mem / (1024.0 * 1024.0 * 1024.0),
		g->pci_bus_id, flow_precision_name(c->precision),
		c->host_comm ? "cpu (staged through host memory)" : "nccl");
	fprintf(out, "# binding %s\n", t->gpu.desc);
	if (flow_cuda_memory_stats(t->gpu.device, &mem, &ignored) == FLOW_OK)
		fprintf(out, "# device memory %.1f MiB in use, %.1f MiB "
			     "reserved (parameters, gradients, optimizer "
			     "state, activations)\n",
			(double)mem.peak_in_use_bytes / (1024.0 * 1024.0),
			(double)mem.peak_reserved_bytes / (1024.0 * 1024.0));
}

void flow_trainer_describe_end(const flow_trainer_t *t, FILE *out)
{
	flow_alloc_stats_t mem;
	flow_diag_t ignored = FLOW_DIAG_INIT;
	uint64_t cudnn = 0, own = 0;
	const char *why = "";

	if (t->cfg.device == FLOW_DEVICE_CPU ||
	    flow_cuda_memory_stats(t->gpu.device, &mem, &ignored) != FLOW_OK)
		return;
	fprintf(out, "# device memory peak %.1f MiB in use, %.1f MiB reserved "
		     "over the run\n",
		(double)mem.peak_in_use_bytes / (1024.0 * 1024.0),
		(double)mem.peak_reserved_bytes / (1024.0 * 1024.0));
	if (t->cfg.precision == FLOW_PRECISION_BF16 &&
	    flow_cuda_attention_paths(&cudnn, &own, &why, &ignored) == FLOW_OK)
		fprintf(out, "# attention in bf16: %llu passes through cuDNN's "
			     "fused attention, %llu through flow's own "
			     "kernel%s%s\n",
			(unsigned long long)cudnn, (unsigned long long)own,
			why[0] ? "; cuDNN declined: " : "", why);
}

flow_kernel_set_t trainer_kernel_set(const flow_trainer_t *t)
{
	return t->cfg.device == FLOW_DEVICE_CUDA ? FLOW_KERNELS_CUDA
						 : t->cfg.kernels;
}
