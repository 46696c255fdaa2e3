/* The training loop of one rank (flow/train.h): the configuration and
 * the plan it follows, building the graph, executor, optimizer and data,
 * then the stream of steps and evaluations.  Checkpoints and resume are
 * in lib/runtime/train_ckpt.c. */
#include <config.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/grad_sync.h>
#include <flow/shard.h>

#include "runtime/train_internal.h"

void flow_train_config_init(flow_train_config_t *cfg)
{
	*cfg = (flow_train_config_t){
		.batch = 4,
		.grad_accum = 1,
		.steps = 10,
		.lr = { .lr = 6e-4, .min_lr = -1.0 },
		.adamw = { .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
			   .weight_decay = 0.1f },
		.clip = 1.0f,
		.seed = 1337,
		.eval_batches = 8,
		.kernels = FLOW_KERNELS_CPU,
		.bucket_bytes = FLOW_GRAD_BUCKET_DEFAULT_BYTES,
	};
}

/* ---- the plan and the data-parallel group ------------------------------------- */

flow_err_t flow_train_config_set_plan(flow_train_config_t *cfg,
				      const flow_plan_t *plan,
				      flow_diag_t *diag)
{
	int world = cfg->world ? flow_comm_size(cfg->world) : 1;
	flow_err_t err = flow_plan_check(plan, world, NULL, NULL, diag);
	if (err != FLOW_OK)
		return err;
	cfg->model = plan->cfg;
	cfg->batch = plan->batch;
	cfg->seq_len = plan->seq_len;
	cfg->grad_accum = plan->grad_accum;
	/* The parser took only these words. */
	if (plan->device[0])
		cfg->device = strcmp(plan->device, "cuda") == 0 ? FLOW_DEVICE_CUDA
							      : FLOW_DEVICE_CPU;
	if (plan->precision[0])
		cfg->precision = strcmp(plan->precision, "bf16") == 0
					 ? FLOW_PRECISION_BF16
					 : FLOW_PRECISION_FP32;
	cfg->plan = plan;
	return FLOW_OK;
}

/* This rank's data-parallel group: the world without a plan; with one,
 * the ranks that differ from this one only along the plan's dp axis
 * (this rank alone without that axis). */
static flow_err_t trainer_join_dp(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	if (!c->plan) {
		t->dp = c->world;
		return FLOW_OK;
	}
	int dp = flow_mesh_axis(&c->plan->mesh, "dp");
	if (!c->world || dp < 0)
		return FLOW_OK;
	flow_err_t err = flow_comm_mesh_axes(c->world, &c->plan->mesh,
					     1u << dp, &t->dp_owned, diag);
	t->dp = t->dp_owned;
	return err;
}

/* The communicators device memory moves on: on GPUs without --comm cpu,
 * an NCCL twin of the world (for the boxing of a tensor-parallel plan)
 * and of the dp group, which gradients and parameters move on (the CPU
 * communicators stay for the host's scalars: losses, norms). */
static flow_err_t trainer_join_dp_device(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	flow_err_t err = FLOW_OK;
	t->dp_data = t->dp;
	if (c->device != FLOW_DEVICE_CUDA || c->host_comm || !c->world ||
	    flow_comm_size(c->world) == 1)
		return FLOW_OK;
	err = flow_comm_world(flow_comm_world_of(c->world), FLOW_COMM_NCCL,
			      &t->world_nccl, diag);
	if (err != FLOW_OK || !t->dp || flow_comm_size(t->dp) == 1)
		return err;
	int dp = c->plan ? flow_mesh_axis(&c->plan->mesh, "dp") : -1;
	if (dp >= 0)
		err = flow_comm_mesh_axes(t->world_nccl, &c->plan->mesh, 1u << dp,
					  &t->dp_nccl, diag);
	if (err == FLOW_OK)
		t->dp_data = t->dp_nccl ? t->dp_nccl : t->world_nccl;
	return err;
}

/* The communicators of the boxing and split ops: in place on the
 * executor's memory (host memory over the CPU backend, a GPU's over
 * NCCL, the staged storage's over the CPU backend, as a GPU's would be),
 * or, with --comm cpu on a device, over the CPU backend on host copies. */
static flow_err_t trainer_boxing_comms(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	const flow_exec_storage_t *st = flow_exec_storage(t->exec);
	if (c->host_comm && !st->host_addressable)
		return flow_boxing_comms_new(c->world, &c->plan->mesh, NULL,
					     NULL, &t->comms, diag);
	return flow_boxing_comms_new(t->world_nccl ? t->world_nccl : c->world,
				     &c->plan->mesh, flow_exec_kernels(t->exec),
				     st, &t->comms, diag);
}

/* ---- setup ------------------------------------------------------------------ */

static flow_err_t trainer_open_data(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	flow_manifest_t manifest;
	flow_err_t err = flow_manifest_read(c->data_dir, &manifest, diag);
	if (err != FLOW_OK)
		return err;
	t->data_checksum = manifest.checksum;
	t->data_vocab = manifest.vocab;
	flow_manifest_release(&manifest);
	if (t->data_vocab > c->model.vocab)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: the data's vocabulary (%" PRIu64
				     ") is larger than the model's (%" PRIu32
				     ")",
				     c->data_dir, t->data_vocab,
				     c->model.vocab);

	flow_loader_options_t o = {
		.dir = c->data_dir,
		.split = FLOW_SPLIT_TRAIN,
		.seq_len = c->seq_len,
		.global_batch = c->batch,
		.seed = c->seed,
		.dp_rank = (uint32_t)t->dp_rank,
		.dp_size = (uint32_t)t->dp_size,
		.prefetch = true,
	};
	err = flow_loader_open(&o, &t->train, diag);
	if (err != FLOW_OK || c->eval_every == 0)
		return err;
	o.split = FLOW_SPLIT_VAL;
	o.prefetch = false;
	return flow_loader_open(&o, &t->val, diag);
}

/* AdamW over this rank's shard of each parameter. */
static flow_err_t trainer_new_optimizer(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_zero_t *z = t->zero;
	size_t n = z->nparams ? z->nparams : 1;
	size_t *begin = calloc(n, sizeof *begin), *count = calloc(n, sizeof *count);
	flow_err_t err;
	if (!begin || !count) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	} else {
		for (size_t i = 0; i < z->nparams; i++) {
			begin[i] = z->params[i].begin;
			count[i] = z->params[i].count;
		}
		err = flow_adamw_new_sharded(t->exec, &t->cfg.adamw, begin,
					     count, &t->opt, diag);
	}
	free(begin);
	free(count);
	return err;
}

bool plan_localized(const flow_plan_t *p)
{
	for (int a = 0; p && a < p->mesh.ndim; a++)
		if (p->mesh.dims[a] > 1 && strcmp(p->mesh.names[a], "dp") != 0)
			return true;
	return false;
}

/* This rank's graph of the plan: the global training graph at the global
 * batch, localized (flow/localize.h), run with the mesh's communicators. */
static flow_err_t trainer_build_local(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	flow_graph_t global;
	flow_graph_init(&global);
	flow_err_t err = flow_graph_set_act_dtype(
		&global, flow_precision_act_dtype(c->precision), diag);
	if (err == FLOW_OK)
		err = flow_gpt_build(&c->model, c->batch, c->seq_len, &global,
				     diag);
	if (err == FLOW_OK)
		err = flow_graph_backward(&global, diag);
	int64_t index = flow_mesh_index_of(
		&c->plan->mesh, c->world ? flow_comm_rank(c->world) : 0);
	if (err == FLOW_OK)
		err = flow_local_build(c->plan, &global, index, &t->local, diag);
	flow_graph_release(&global);
	if (err != FLOW_OK)
		return err;
	t->localized = true;
	t->graph = t->local.graph; /* moved: the trainer's from here on */
	flow_graph_init(&t->local.graph);
	err = flow_exec_new(&t->graph, trainer_kernel_set(t), &t->exec, diag);
	if (err == FLOW_OK && c->world)
		err = trainer_boxing_comms(t, diag);
	/* The losses are host values: summed over a CPU group, whatever
	 * the boxing moves on. */
	if (err == FLOW_OK && c->world && t->local.loss_partial_axes)
		err = flow_comm_mesh_axes(c->world, &c->plan->mesh,
					  t->local.loss_partial_axes,
					  &t->loss_group, diag);
	if (err == FLOW_OK)
		flow_exec_set_dist(t->exec, t->local.boxings,
				   t->local.nboxings, t->comms);
	return err;
}

/* Whole gradients summed over a CPU group in host memory, or over NCCL on
 * a GPU: their sums can overlap the backward pass (flow/grad_sync.h). */
static bool trainer_overlaps_grad_sync(const flow_trainer_t *t)
{
	const flow_exec_storage_t *st = flow_exec_storage(t->exec);
	if (t->cfg.bucket_bytes == 0 || t->dp_size == 1 || t->localized ||
	    t->zero->any_split)
		return false;
	flow_comm_backend_t b = flow_comm_backend(t->dp_data);
	return (st->host_addressable && b == FLOW_COMM_CPU) ||
	       (!st->host_addressable && st->event_new && b == FLOW_COMM_NCCL);
}

static flow_err_t trainer_build(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	flow_err_t err;
	flow_graph_init(&t->graph);
	if (plan_localized(c->plan)) {
		err = trainer_build_local(t, diag);
	} else {
		err = flow_graph_set_act_dtype(
			&t->graph, flow_precision_act_dtype(c->precision), diag);
		if (err == FLOW_OK)
			err = flow_gpt_build(&c->model, t->local_batch,
					     c->seq_len, &t->graph, diag);
		if (err == FLOW_OK)
			err = flow_graph_backward(&t->graph, diag);
		if (err == FLOW_OK)
			err = flow_exec_new(&t->graph, trainer_kernel_set(t),
					    &t->exec, diag);
	}
	if (err == FLOW_OK)
		err = flow_zero_new(c->plan, &t->graph,
				    t->localized ? &t->local : NULL,
				    t->dp_rank, t->dp_size, &t->zero, diag);
	if (err == FLOW_OK)
		err = trainer_new_optimizer(t, diag);
	if (err == FLOW_OK && trainer_overlaps_grad_sync(t))
		err = flow_grad_sync_new(t->exec, t->dp_data, c->bucket_bytes,
					 &t->grad_sync, diag);
	if (err != FLOW_OK)
		return err;
	t->tokens = flow_graph_find(&t->graph, "tokens");
	t->targets = flow_graph_find(&t->graph, "targets");
	if (!flow_exec_storage(t->exec)->host_addressable) {
		/* The loader fills host memory; a device's batch is copied up. */
		const flow_exec_storage_t *st = flow_exec_storage(t->exec);
		size_t bytes = flow_graph_tensor_bytes(&t->graph, t->tokens);
		t->tokens_host = st->host_alloc(bytes);
		t->targets_host = st->host_alloc(bytes);
		if (!t->tokens_host || !t->targets_host)
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "out of memory for the batch's "
					     "host buffers");
		t->inputs_read = st->event_new();
		t->inputs_copied = st->event_new();
		if (!t->inputs_read || !t->inputs_copied)
			return flow_diag_set(diag, FLOW_ERR_DEVICE,
					     "cannot make the events of the "
					     "batch's copies");
	}
	/* The gradient of the mean loss over the whole step of all ranks:
	 * the ranks' gradients then only need summing. */
	flow_exec_set_loss_scale(t->exec,
				 (float)(1.0 / ((double)c->batch * c->seq_len *
						c->grad_accum)));
	flow_exec_profile_enable(t->exec, c->profile);
	/* This rank's share: MFU compares it with this rank's ceiling. */
	int ranks = c->world ? flow_comm_size(c->world) : t->dp_size;
	t->flops_per_step = flow_gpt_flops_per_token(&c->model, c->seq_len) *
			    (double)c->batch * c->seq_len * c->grad_accum /
			    ranks;
	return FLOW_OK;
}

/* Parameters are initialised by logical index: the shards of all ranks
 * are the one-rank parameters. */
static flow_err_t trainer_init_params(flow_trainer_t *t, flow_diag_t *diag)
{
	if (t->localized)
		return flow_exec_init_params_boxes(t->exec, t->cfg.seed,
						   t->local.box,
						   t->local.logical, diag);
	return flow_exec_init_params(t->exec, t->cfg.seed, diag);
}

/* Each data-parallel rank takes an equal slice of the global micro-batch. */
static flow_err_t trainer_split_batch(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	t->dp_rank = t->dp ? flow_comm_rank(t->dp) : 0;
	t->dp_size = t->dp ? flow_comm_size(t->dp) : 1;
	if (c->batch == 0 || c->grad_accum == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "batch and grad-accum must be positive");
	if (c->batch % (uint32_t)t->dp_size)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "batch %" PRIu32 " does not split evenly over %d ranks",
				     c->batch, t->dp_size);
	int ranks = c->world ? flow_comm_size(c->world) : t->dp_size;
	if (ranks > 1 && (c->dump_batches || c->dump_grads))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "--dump-batches and --dump-grads need one rank");
	t->local_batch = c->batch / (uint32_t)t->dp_size;
	return FLOW_OK;
}

flow_err_t flow_trainer_new(const flow_train_config_t *cfg,
			    flow_trainer_t **trainer_out, flow_diag_t *diag)
{
	flow_trainer_t *t = calloc(1, sizeof *t);
	if (!t)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	t->cfg = *cfg;
	flow_train_config_t *c = &t->cfg;
	if (c->seq_len == 0)
		c->seq_len = c->model.seq;
	if (c->lr.min_lr < 0)
		c->lr.min_lr = c->lr.lr / 10.0;
	c->lr.total = c->steps;
	flow_gpt_format(&c->model, t->spec, sizeof t->spec);

	flow_err_t err = trainer_open_device(t, diag);
	if (err == FLOW_OK)
		err = trainer_join_dp(t, diag);
	if (err == FLOW_OK)
		err = trainer_join_dp_device(t, diag);
	if (err == FLOW_OK)
		err = trainer_split_batch(t, diag);
	if (err == FLOW_OK)
		err = trainer_build(t, diag);
	if (err == FLOW_OK)
		err = trainer_open_data(t, diag);
	if (err == FLOW_OK && c->resume && c->init)
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "a run resumes or starts from --init, not "
				    "both");
	if (err == FLOW_OK && c->resume)
		err = trainer_resume(t, diag);
	else if (err == FLOW_OK && c->init)
		err = trainer_init_from(t, diag);
	else if (err == FLOW_OK)
		err = trainer_init_params(t, diag);
	if (err == FLOW_OK && t->step > c->steps)
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "%s: step %" PRIu64 " is past --steps %"
				    PRIu64,
				    t->resumed_path, t->step, c->steps);
	if (err == FLOW_OK && c->dump_batches)
		err = flow_atomic_file_open(c->dump_batches, &t->batches, diag);
	if (err != FLOW_OK) {
		flow_trainer_free(t);
		return err;
	}
	*trainer_out = t;
	return FLOW_OK;
}

void flow_trainer_free(flow_trainer_t *t)
{
	if (!t)
		return;
	flow_atomic_file_abort(t->batches);
	flow_loader_free(t->val);
	flow_loader_free(t->train);
	if (t->exec) { /* host buffers of the executor's storage */
		const flow_exec_storage_t *st = flow_exec_storage(t->exec);
		if (t->inputs_copied) { /* a copy may still read the buffers */
			st->event_wait(t->inputs_copied);
			st->event_free(t->inputs_copied);
		}
		if (t->inputs_read)
			st->event_free(t->inputs_read);
		st->host_free(t->tokens_host);
		st->host_free(t->targets_host);
		st->host_free(t->staging);
	}
	flow_grad_sync_free(t->grad_sync);
	flow_adamw_free(t->opt);
	flow_zero_free(t->zero);
	flow_boxing_comms_free(t->comms);
	flow_exec_free(t->exec);
	flow_local_release(&t->local);
	flow_graph_release(&t->graph);
	flow_comm_free(t->dp_nccl);
	flow_comm_free(t->world_nccl);
	flow_comm_free(t->loss_group);
	flow_comm_free(t->dp_owned);
	free(t->resumed_path);
	free(t->init_path);
	free(t);
}

const flow_graph_t *flow_trainer_graph(const flow_trainer_t *t)
{
	return &t->graph;
}

flow_exec_t *flow_trainer_exec(flow_trainer_t *t)
{
	return t->exec;
}

flow_comm_t *flow_trainer_dp_comm(const flow_trainer_t *t)
{
	return t->dp;
}

uint64_t flow_trainer_step(const flow_trainer_t *t)
{
	return t->step;
}

/* ---- describing the run -------------------------------------------------------- */

static double mib(size_t bytes)
{
	return (double)bytes / (1024.0 * 1024.0);
}

void flow_trainer_describe(const flow_trainer_t *t, FILE *out)
{
	const flow_train_config_t *c = &t->cfg;
	const flow_memplan_t *mp = flow_exec_memplan(t->exec);
	flow_graph_stats_t st;
	flow_graph_get_stats(&t->graph, &st);
	uint64_t tokens = (uint64_t)c->batch * c->seq_len * c->grad_accum;

	fprintf(out, "# model %s\n", t->spec);
	fprintf(out, "# params %zu tensors, %zu elements (%.2fM); graph %zu "
		     "forward + %zu backward ops\n",
		st.params, st.param_elems, (double)st.param_elems / 1e6,
		st.forward_ops, st.backward_ops);
	fprintf(out, "# data %s (manifest %016" PRIx64 ", vocab %" PRIu64
		     ", %" PRIu64 " train samples of %" PRIu32 "+1 tokens)\n",
		c->data_dir, t->data_checksum, t->data_vocab,
		flow_loader_samples_per_epoch(t->train), c->seq_len);
	fprintf(out, "# batch %" PRIu32 " x %" PRIu32 " tokens, grad-accum %"
		     PRIu32 ": %" PRIu64 " tokens per step, %" PRIu64
		     " steps\n",
		c->batch, c->seq_len, c->grad_accum, tokens, c->steps);
	if (t->dp_size > 1)
		fprintf(out, "# data parallel over %d ranks (%s): %" PRIu32
			     " sequences per rank per micro-batch\n",
			t->dp_size, flow_comm_transport(t->dp),
			t->local_batch);
	if (t->grad_sync)
		fprintf(out, "# gradient sums overlap the backward pass: %zu "
			     "buckets of at most %.3g MiB\n",
			flow_grad_sync_buckets(t->grad_sync)->nbuckets,
			mib(c->bucket_bytes));
	if (t->localized) {
		char mesh[FLOW_MESH_TEXT_MAX];
		flow_mesh_format(&c->plan->mesh, mesh, sizeof mesh);
		fprintf(out, "# sharded over mesh %s (%s): each rank runs its "
			     "shards, with %zu boxing ops per micro-batch\n",
			mesh, c->world ? flow_comm_transport(c->world) : "self",
			t->local.nboxings);
	}
	fprintf(out, "# optimizer adamw lr %g min-lr %g warmup %" PRIu64
		     " cosine, betas (%g, %g), eps %g, weight-decay %g, "
		     "clip %g, seed %" PRIu64 "\n",
		c->lr.lr, c->lr.min_lr, c->lr.warmup, (double)c->adamw.beta1,
		(double)c->adamw.beta2, (double)c->adamw.eps,
		(double)c->adamw.weight_decay, (double)c->clip, c->seed);
	size_t pbytes = st.param_elems * sizeof(float), shard_elems = 0;
	int splits[3] = { 0, 0, 0 }; /* moments, gradients, parameters */
	for (size_t i = 0; i < t->zero->nparams; i++) {
		const flow_zero_param_t *zp = &t->zero->params[i];
		shard_elems += zp->count;
		splits[0] += zp->state_split;
		splits[1] += zp->grad_split;
		splits[2] += zp->param_split;
	}
	if (t->zero->any_split)
		fprintf(out, "# zero over %d ranks: %d of %zu parameters' "
			     "moments, %d gradients, %d parameters sharded\n",
			t->dp_size, splits[0], t->zero->nparams, splits[1],
			splits[2]);
	fprintf(out, "# memory params %.1f MiB, grads %.1f MiB, adamw %.1f "
		     "MiB, activations %.1f MiB peak (%.1f MiB unshared), "
		     "scratch %.1f MiB\n",
		mib(pbytes), mib(pbytes), mib(2 * shard_elems * sizeof(float)),
		mib(mp->arena_bytes),
		mib(mp->unshared_bytes), mib(flow_exec_scratch_bytes(t->exec)));
	trainer_describe_device(t, out);
	fprintf(out, "# kernels %s, precision %s, %zu op pairs fused "
		     "(residual add and layernorm, matmul and GELU); model "
		     "%.3g GFLOP per step",
		flow_exec_kernels(t->exec)->name,
		flow_precision_name(c->precision),
		flow_exec_fused_pairs(t->exec), t->flops_per_step / 1e9);
	if (c->peak_gflops > 0)
		fprintf(out, "; peak %.1f GFLOP/s (%s)", c->peak_gflops,
			t->peak_source ? t->peak_source : "sgemm");
	fputc('\n', out);
	if (c->eval_every)
		fprintf(out, "# eval every %" PRIu64 " steps on %" PRIu64
			     " val batches\n",
			c->eval_every, c->eval_batches);
	if (c->ckpt_dir)
		fprintf(out, "# checkpoints %s every %" PRIu64 " steps\n",
			c->ckpt_dir, c->ckpt_every);
	if (t->resumed_path)
		fprintf(out, "# resumed from %s (step %" PRIu64 ")\n",
			t->resumed_path, t->resumed_from);
	if (t->init_path)
		fprintf(out, "# parameters from %s\n", t->init_path);
}

/* ---- steps -------------------------------------------------------------------------- */

/* The sum of a value over the ranks of comm (NULL: one), the same bits on
 * every rank: gathered, then added in rank order. */
static flow_err_t sum_over(flow_comm_t *comm, double *value,
			   flow_diag_t *diag)
{
	if (!comm || flow_comm_size(comm) == 1)
		return FLOW_OK;
	size_t n = (size_t)flow_comm_size(comm);
	double *all = calloc(n, sizeof *all);
	size_t *counts = calloc(n, sizeof *counts);
	flow_err_t err = FLOW_ERR_NOMEM;
	if (!all || !counts) {
		flow_diag_set(diag, err, "out of memory");
		goto out;
	}
	for (size_t r = 0; r < n; r++)
		counts[r] = sizeof(double);
	err = flow_all_gather(comm, value, all, counts, FLOW_DTYPE_U8, diag);
	if (err == FLOW_OK) {
		double sum = 0.0;
		for (size_t r = 0; r < n; r++)
			sum += all[r];
		*value = sum;
	}
out:
	free(all);
	free(counts);
	return err;
}

/* A pass's mean loss over the step's tokens: summed over the axes where
 * the losses are partial (the vocabulary split), then averaged over the
 * data-parallel ranks. */
static flow_err_t loss_over_ranks(flow_trainer_t *t, double *value,
				  flow_diag_t *diag)
{
	flow_err_t err = sum_over(t->loss_group, value, diag);
	if (err == FLOW_OK)
		err = sum_over(t->dp, value, diag);
	*value /= (double)t->dp_size;
	return err;
}

/* The global gradient norm, clipping applied: over the shards (and the
 * parameters this rank owns), summed over the ranks once, when the state
 * is sharded; else on this rank. */
static flow_err_t clip_grad_norm(flow_trainer_t *t, float *norm_out,
				 flow_diag_t *diag)
{
	if (!t->zero->any_split && !t->localized) {
		*norm_out = flow_adamw_clip_grad_norm(t->opt, t->cfg.clip);
		return FLOW_OK;
	}
	double ss = flow_zero_grad_sum_squares(t->zero, t->exec);
	flow_err_t err = sum_over(t->localized ? t->cfg.world : t->dp,
				  &ss, diag);
	*norm_out = (float)sqrt(ss);
	flow_adamw_clip_to_norm(t->opt, *norm_out, t->cfg.clip);
	return err;
}

/* Split parameters are gathered before a forward pass needs them. */
static flow_err_t gather_params(flow_trainer_t *t, flow_diag_t *diag)
{
	if (!t->zero->params_stale)
		return FLOW_OK;
	double t0 = train_now_seconds();
	flow_err_t err = flow_zero_before_forward(t->zero, t->dp_data,
						  t->exec, diag);
	flow_exec_profile_add(t->exec, "param-gather",
			      train_now_seconds() - t0, 0);
	return err;
}

/* The host memory the loader fills: the input tensors themselves, or
 * their host buffers when the executor is a device's. */
static int32_t *host_tokens(flow_trainer_t *t)
{
	return t->tokens_host ? t->tokens_host
			      : flow_exec_tensor(t->exec, t->tokens);
}

static int32_t *host_targets(flow_trainer_t *t)
{
	return t->targets_host ? t->targets_host
			       : flow_exec_tensor(t->exec, t->targets);
}

/* The batch in the host buffers up to a device, on its copy stream: the
 * copies wait only for the kernels that last read the inputs (the
 * previous micro-batch's backward pass), so they overlap the rest of the
 * previous step (its gradient sums, the optimizer), and the host goes on
 * queueing the next pass, whose kernels wait for them on the device.  A
 * failure is kept for the next pass to report. */
static void upload_batch(flow_trainer_t *t)
{
	const flow_exec_storage_t *st = flow_exec_storage(t->exec);
	st->copy_in_ahead(flow_exec_tensor(t->exec, t->tokens), t->tokens_host,
			  flow_graph_tensor_bytes(&t->graph, t->tokens),
			  t->inputs_read, NULL);
	st->copy_in_ahead(flow_exec_tensor(t->exec, t->targets),
			  t->targets_host,
			  flow_graph_tensor_bytes(&t->graph, t->targets), NULL,
			  t->inputs_copied);
	st->kernels_wait(t->inputs_copied);
}

/* After a pass that read the inputs: the next batch's copies wait for
 * it, not for what follows. */
static void mark_inputs_read(flow_trainer_t *t)
{
	if (t->inputs_read)
		flow_exec_storage(t->exec)->event_record(t->inputs_read);
}

/* The next micro-batch of l into the input tensors, copied up to a
 * device: flow_loader_next's result. */
static int trainer_load(flow_trainer_t *t, flow_loader_t *l, flow_diag_t *diag)
{
	/* The last copy out of the host buffers must be done before the
	 * loader fills them again (it is, long since, but say so). */
	if (t->inputs_copied)
		flow_exec_storage(t->exec)->event_wait(t->inputs_copied);
	int rc = flow_loader_next(l, host_tokens(t), host_targets(t), diag);
	if (rc > 0 && t->tokens_host)
		upload_batch(t);
	return rc;
}

static int trainer_eval(flow_trainer_t *t, flow_train_row_t *row,
			flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	double t0 = train_now_seconds();
	flow_loader_state_t start = { 0, 0 };
	flow_err_t err = gather_params(t, diag);
	if (err == FLOW_OK)
		err = flow_loader_seek(t->val, &start, diag);
	if (err != FLOW_OK)
		return err;
	double sum = 0.0;
	for (uint64_t i = 0; i < c->eval_batches; i++) {
		int rc = trainer_load(t, t->val, diag);
		if (rc < 0)
			return rc;
		double batch_loss;
		if ((err = flow_exec_forward(t->exec, &batch_loss, diag)) !=
		    FLOW_OK)
			return err;
		mark_inputs_read(t);
		sum += batch_loss;
	}
	double loss = sum / (double)c->eval_batches;
	if ((err = loss_over_ranks(t, &loss, diag)) != FLOW_OK)
		return err;
	double secs = train_now_seconds() - t0;
	flow_exec_profile_add(t->exec, "eval", secs, 0);
	*row = (flow_train_row_t){
		.step = t->step,
		.val = true,
		.loss = loss,
		.ms = secs * 1e3,
		.tokens_per_s = (double)c->eval_batches * c->batch *
				c->seq_len / secs,
		.mfu = NAN,
	};
	return 1;
}

static flow_err_t dump_batch(flow_trainer_t *t, flow_diag_t *diag)
{
	size_t bytes = (size_t)t->cfg.batch * t->cfg.seq_len * sizeof(int32_t);
	flow_err_t err = flow_atomic_file_write(t->batches, host_tokens(t),
						bytes, diag);
	if (err == FLOW_OK)
		err = flow_atomic_file_write(t->batches, host_targets(t), bytes,
					     diag);
	return err;
}

static int trainer_step(flow_trainer_t *t, flow_train_row_t *row,
			flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	uint64_t step = t->step + 1;
	double t0 = train_now_seconds();
	double loss = 0.0;
	flow_err_t err;

	if ((err = gather_params(t, diag)) != FLOW_OK)
		return err;
	flow_exec_zero_param_grads(t->exec);
	for (uint32_t k = 0; k < c->grad_accum; k++) {
		double td = train_now_seconds();
		int rc = trainer_load(t, t->train, diag);
		if (rc < 0)
			return rc;
		flow_exec_profile_add(t->exec, "data",
				      train_now_seconds() - td, 0);
		if (t->batches && (err = dump_batch(t, diag)) != FLOW_OK)
			return err;
		if (t->grad_sync && k + 1 == c->grad_accum)
			flow_grad_sync_arm(t->grad_sync);
		double mb_loss;
		if ((err = flow_exec_forward(t->exec, &mb_loss, diag)) == FLOW_OK)
			err = flow_exec_backward(t->exec, diag);
		mark_inputs_read(t);
		if (err != FLOW_OK) {
			/* The thread lets the group go; the pass's error is
			 * the one to report. */
			flow_diag_t ignored = FLOW_DIAG_INIT;
			flow_err_t also = t->grad_sync ? flow_grad_sync_wait(
						t->grad_sync, &ignored)
					      : FLOW_OK;
			(void)also;
			return err;
		}
		loss += mb_loss;
	}
	loss /= c->grad_accum;
	double ts = train_now_seconds();
	/* The gradients first: with overlap their sums are under way and own
	 * the group until they are done. */
	err = t->grad_sync
		      ? flow_grad_sync_wait(t->grad_sync, diag)
		      : flow_zero_sync_grads(t->zero, t->dp_data, t->exec, diag);
	if (err == FLOW_OK)
		err = loss_over_ranks(t, &loss, diag);
	if (err != FLOW_OK)
		return err;
	if (t->dp_size > 1)
		flow_exec_profile_add(t->exec, "grad-sync",
				      train_now_seconds() - ts, 0);
	if (c->dump_grads && step == t->resumed_from + 1) {
		err = trainer_write_ckpt(t, c->dump_grads, true, diag);
		if (err != FLOW_OK)
			return err;
	}
	double to = train_now_seconds();
	float norm;
	if ((err = clip_grad_norm(t, &norm, diag)) != FLOW_OK)
		return err;
	float lr = flow_lr_at(&c->lr, step);
	flow_adamw_step(t->opt, step, lr);
	flow_exec_profile_add(t->exec, "optimizer",
			      train_now_seconds() - to, 0);
	double tg = train_now_seconds();
	if ((err = flow_zero_after_update(t->zero, t->dp_data, t->exec, diag)))
		return err;
	if (t->zero->any_split)
		flow_exec_profile_add(t->exec, "param-gather",
				      train_now_seconds() - tg, 0);
	double secs = train_now_seconds() - t0;
	t->step = step;
	t->steps_timed++;

	*row = (flow_train_row_t){
		.step = step,
		.loss = loss,
		.lr = lr,
		.grad_norm = norm,
		.ms = secs * 1e3,
		.tokens_per_s = (double)c->batch * c->seq_len * c->grad_accum /
				secs,
		.mfu = c->peak_gflops > 0 ? t->flops_per_step / secs /
						    (c->peak_gflops * 1e9)
					  : NAN,
	};
	bool due = c->ckpt_dir &&
		   ((c->ckpt_every && step % c->ckpt_every == 0) ||
		    step == c->steps);
	if (due) {
		if ((err = trainer_checkpoint(t, diag)) != FLOW_OK)
			return err;
		row->checkpointed = true;
	}
	t->eval_pending = c->eval_every &&
			  (step % c->eval_every == 0 || step == c->steps);
	return 1;
}

int flow_trainer_next(flow_trainer_t *t, flow_train_row_t *row,
		      flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	if (t->finished)
		return 0;
	if (t->eval_pending) {
		t->eval_pending = false;
		return trainer_eval(t, row, diag);
	}
	if (t->step < c->steps)
		return trainer_step(t, row, diag);

	/* The end: a run of zero steps still leaves its initial state. */
	flow_err_t err = FLOW_OK;
	if (c->ckpt_dir && c->steps == 0)
		err = trainer_checkpoint(t, diag);
	if (err == FLOW_OK && t->batches) {
		err = flow_atomic_file_commit(t->batches, diag);
		t->batches = NULL;
	}
	if (err != FLOW_OK)
		return err;
	t->finished = true;
	return 0;
}

void flow_trainer_print_profile(const flow_trainer_t *t, FILE *out)
{
	flow_profile_row_t rows[64];
	size_t n = flow_exec_profile_rows(t->exec, rows, 64);
	if (n > 64)
		n = 64;
	double total = 0.0;
	for (size_t i = 0; i < n; i++)
		total += rows[i].seconds;
	double steps = t->steps_timed ? (double)t->steps_timed : 1.0;
	fprintf(out, "op\tcalls\tms\tms_per_step\tpercent\tgflops\n");
	for (size_t i = 0; i < n; i++) {
		const flow_profile_row_t *r = &rows[i];
		fprintf(out, "%s\t%" PRIu64 "\t%.3f\t%.3f\t%.1f\t", r->name,
			r->calls, r->seconds * 1e3, r->seconds * 1e3 / steps,
			total > 0 ? 100.0 * r->seconds / total : 0.0);
		if (r->flops > 0 && r->seconds > 0)
			fprintf(out, "%.1f\n", r->flops / r->seconds / 1e9);
		else
			fprintf(out, "-\n");
	}
}
