/* The trainer's checkpoints (flow/train.h): the run state that names a
 * computation, the part of each parameter and moment this rank writes,
 * writing and committing a step, and resuming from one.
 *
 * What makes resume exact: the data order is a pure function of (data,
 * seed, position) and the checkpoint records the position; parameters and
 * AdamW moments are stored bit for bit; the step number fixes the learning
 * rate and Adam's bias correction; every kernel gives the same bits for the
 * same inputs.  So a resumed run recomputes exactly what the uninterrupted
 * one did. */
#include <config.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/ckpt.h>
#include <flow/mem.h>
#include <flow/parse.h>

#include "runtime/train_internal.h"

#define ADAMW_M_PREFIX "adamw.m/"
#define ADAMW_V_PREFIX "adamw.v/"

/* ---- the run's identity, as checkpoint state ------------------------------ */

/* Every setting that changes the computation, as (key, text).  Doubles are
 * printed with 17 digits so that equal text means equal bits.  On resume
 * the checkpoint's values must equal these. */
typedef struct run_state {
	char text[20][64];
	flow_ckpt_kv_t kv[20];
	size_t n;
} run_state_t;

static void run_state_add(run_state_t *s, const char *key, const char *fmt,
			  ...) FLOW_PRINTF(3, 4);

static void run_state_add(run_state_t *s, const char *key, const char *fmt,
			  ...)
{
	size_t i = s->n++;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->text[i], sizeof s->text[i], fmt, ap);
	va_end(ap);
	s->kv[i].key = key;
	s->kv[i].value = s->text[i];
}

static void run_state_build(const flow_trainer_t *t, run_state_t *s)
{
	const flow_train_config_t *c = &t->cfg;
	s->n = 0;
	run_state_add(s, "model", "%s", t->spec);
	run_state_add(s, "data.checksum", "%016" PRIx64, t->data_checksum);
	run_state_add(s, "batch", "%" PRIu32, c->batch);
	run_state_add(s, "seq_len", "%" PRIu32, c->seq_len);
	run_state_add(s, "grad_accum", "%" PRIu32, c->grad_accum);
	run_state_add(s, "steps", "%" PRIu64, c->steps);
	run_state_add(s, "seed", "%" PRIu64, c->seed);
	run_state_add(s, "lr", "%.17g", c->lr.lr);
	run_state_add(s, "min_lr", "%.17g", c->lr.min_lr);
	run_state_add(s, "warmup", "%" PRIu64, c->lr.warmup);
	run_state_add(s, "weight_decay", "%.9g", (double)c->adamw.weight_decay);
	run_state_add(s, "beta1", "%.9g", (double)c->adamw.beta1);
	run_state_add(s, "beta2", "%.9g", (double)c->adamw.beta2);
	run_state_add(s, "eps", "%.9g", (double)c->adamw.eps);
	run_state_add(s, "clip", "%.9g", (double)c->clip);
	/* "cpu" for a CUDA run too: its kernels compute what the CPU's do to
	 * float rounding, and its checkpoint holds the same fp32 tensors, so
	 * a run resumes on either device. */
	run_state_add(s, "kernels", "%s",
		      c->kernels == FLOW_KERNELS_REF ? "ref" : "cpu");
}

/* ---- this rank's part of each tensor, and writing it ------------------------ */

/* What a rank writes of one tensor (a parameter or a moment) and how
 * the manifest describes it. */
typedef struct ckpt_part {
	bool write;             /* this rank writes it (the owner of a
				 * replicated box, or its shard's holder) */
	const flow_box_t *box;  /* of the logical tensor */
	float *data;            /* the box's elements, row-major */
	char mesh[FLOW_CKPT_TEXT_MAX], sbp[FLOW_CKPT_TEXT_MAX];
} ckpt_part_t;

/* What decides a rank's parts, from a trainer or from a plan alone
 * (flow_train_ckpt_layout): both write the same checkpoint. */
typedef struct ckpt_geometry {
	const flow_plan_t *plan;
	const flow_local_t *local; /* NULL: not localized */
	int dp_size;
} ckpt_geometry_t;

/* The part of parameter zp (state: of its moments) a rank holds, but for
 * its data: localized, the layout of the plan; under ZeRO a shard on the
 * dp ranks; else the whole tensor, written once. */
static void ckpt_part_layout(const ckpt_geometry_t *g,
			     const flow_zero_param_t *zp, bool state,
			     ckpt_part_t *part)
{
	bool split = state ? zp->state_split : zp->param_split;
	part->box = split ? &zp->box : &zp->param_box;
	part->data = NULL;
	part->write = split || zp->owner;
	if (g->local) {
		const flow_mesh_t *m = &g->plan->mesh;
		size_t n = 0;
		for (int a = 0; a < m->ndim; a++)
			n += (size_t)snprintf(part->mesh + n, sizeof part->mesh - n,
					      "%s%lld", a ? "x" : "",
					      (long long)m->dims[a]);
		flow_nd_sbp_format(&g->local->sbp[zp->tensor], part->sbp,
				   sizeof part->sbp);
	} else {
		snprintf(part->mesh, sizeof part->mesh, "%d",
			 split ? g->dp_size : 1);
		snprintf(part->sbp, sizeof part->sbp, split ? "(S(0))" : "(B)");
	}
}

/* ckpt_part_layout for the trainer's rank, with where its data lies. */
static void ckpt_part(const flow_trainer_t *t, const flow_zero_param_t *zp,
		      bool state, float *base, ckpt_part_t *part)
{
	ckpt_geometry_t g = {
		.plan = t->cfg.plan,
		.local = t->localized ? &t->local : NULL,
		.dp_size = t->dp_size,
	};
	ckpt_part_layout(&g, zp, state, part);
	bool split = state ? zp->state_split : zp->param_split;
	part->data = base + (split && !state ? zp->begin : 0);
}

/* The host buffer part's elements pass through when the executor's
 * storage is a device's (*host_out NULL otherwise): checkpoints stream
 * through the trainer's one staging buffer (page-locked on a GPU), grown
 * to the largest part, one tensor at a time, in the same format whatever
 * wrote them. */
static flow_err_t part_staging(flow_trainer_t *t, const ckpt_part_t *part,
			       const char *name, float **host_out,
			       flow_diag_t *diag)
{
	const flow_exec_storage_t *st = flow_exec_storage(t->exec);
	size_t bytes = (size_t)flow_box_numel(part->box) * sizeof(float);
	*host_out = NULL;
	if (st->host_addressable)
		return FLOW_OK;
	if (bytes > t->staging_bytes) {
		float *p = st->host_alloc(bytes);
		if (!p)
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "out of memory for the %zu-byte "
					     "host copy of '%s'",
					     bytes, name);
		st->host_free(t->staging);
		t->staging = p;
		t->staging_bytes = bytes;
	}
	*host_out = t->staging;
	return FLOW_OK;
}

/* Add this rank's part of parameter zp's tensor named prefix + name. */
static flow_err_t add_part(flow_trainer_t *t, flow_ckpt_writer_t *w,
			   const flow_zero_param_t *zp, const char *prefix,
			   bool state, float *base, flow_diag_t *diag)
{
	ckpt_part_t part;
	ckpt_part(t, zp, state, base, &part);
	if (!part.write)
		return FLOW_OK;
	flow_ckpt_tensor_desc_t d;
	memset(&d, 0, sizeof d);
	snprintf(d.name, sizeof d.name, "%s%s", prefix,
		 t->graph.tensors[zp->tensor].name);
	d.dtype = FLOW_DTYPE_F32;
	d.shape = zp->shape;
	memcpy(d.mesh, part.mesh, sizeof d.mesh);
	memcpy(d.sbp, part.sbp, sizeof d.sbp);
	float *host = NULL;
	flow_err_t err = part_staging(t, &part, d.name, &host, diag);
	if (err == FLOW_OK && host)
		err = flow_exec_copy_out(t->exec, host, part.data,
					 (size_t)flow_box_numel(part.box) *
						 sizeof(float),
					 diag);
	if (err == FLOW_OK)
		err = flow_ckpt_writer_add(w, &d, part.box,
					   host ? host : part.data, diag);
	return err;
}

/* Who writes a checkpoint, the one rule for the trainer and for
 * flow_train_ckpt_layout: every rank of the job (numbered by its world
 * rank) when the graph is localized, the dp ranks (by dp rank) under
 * ZeRO, else dp rank 0 alone. */
typedef struct ckpt_writer_rule {
	bool writes;
	uint32_t writer, nwriters;
} ckpt_writer_rule_t;

static ckpt_writer_rule_t ckpt_writer_rule(bool localized, bool any_split,
					   int64_t rank, int64_t world,
					   int dp_rank, int dp_size)
{
	if (localized)
		return (ckpt_writer_rule_t){ true, (uint32_t)rank,
					     (uint32_t)world };
	if (any_split)
		return (ckpt_writer_rule_t){ true, (uint32_t)dp_rank,
					     (uint32_t)dp_size };
	return (ckpt_writer_rule_t){ dp_rank == 0, 0, 1 };
}

/* The rule for this trainer, and the communicator its writers meet on
 * (NULL for one writer). */
static ckpt_writer_rule_t ckpt_writers(const flow_trainer_t *t,
				       flow_comm_t **comm_out)
{
	flow_comm_t *w = t->cfg.world;
	*comm_out = t->localized ? w : t->zero->any_split ? t->dp : NULL;
	return ckpt_writer_rule(t->localized, t->zero->any_split,
				w ? flow_comm_rank(w) : 0,
				w ? flow_comm_size(w) : 1, t->dp_rank,
				t->dp_size);
}

flow_err_t trainer_write_ckpt(flow_trainer_t *t, const char *step_dir,
			      bool grads, flow_diag_t *diag)
{
	const flow_zero_t *z = t->zero;
	flow_comm_t *writers;
	ckpt_writer_rule_t rule = ckpt_writers(t, &writers);
	uint32_t me = rule.writer;
	flow_ckpt_writer_t *w;
	flow_err_t err = flow_ckpt_writer_new(step_dir, me, &w, diag);
	if (err != FLOW_OK)
		return err;
	for (size_t i = 0; i < z->nparams && err == FLOW_OK; i++) {
		const flow_zero_param_t *zp = &z->params[i];
		const flow_graph_tensor_t *pt = &t->graph.tensors[zp->tensor];
		if (grads) { /* --dump-grads: one rank, nothing split */
			err = add_part(t, w, zp, "", false,
				       flow_exec_tensor(t->exec, pt->grad), diag);
			continue;
		}
		err = add_part(t, w, zp, "", false,
			       flow_exec_tensor(t->exec, zp->tensor), diag);
		if (err == FLOW_OK)
			err = add_part(t, w, zp, ADAMW_M_PREFIX, true,
				       flow_adamw_m(t->opt, zp->tensor), diag);
		if (err == FLOW_OK)
			err = add_part(t, w, zp, ADAMW_V_PREFIX, true,
				       flow_adamw_v(t->opt, zp->tensor), diag);
	}
	if (err != FLOW_OK) {
		flow_ckpt_writer_abort(w);
		return err;
	}
	err = flow_ckpt_writer_finish(w, diag);
	if (err == FLOW_OK && writers)
		err = flow_barrier(writers, diag);
	if (err != FLOW_OK || me != 0)
		return err;

	run_state_t s;
	run_state_build(t, &s);
	char epoch[24], index[24];
	flow_loader_state_t ls = flow_loader_get_state(t->train);
	snprintf(epoch, sizeof epoch, "%" PRIu64, ls.epoch);
	snprintf(index, sizeof index, "%" PRIu64, ls.index);
	s.kv[s.n++] = (flow_ckpt_kv_t){ "loader.epoch", epoch };
	s.kv[s.n++] = (flow_ckpt_kv_t){ "loader.index", index };
	s.kv[s.n++] = (flow_ckpt_kv_t){ "contents",
					grads ? "gradients" : "training" };
	return flow_ckpt_commit(step_dir, t->step, rule.nwriters, s.kv, s.n,
				diag);
}

flow_err_t trainer_checkpoint(flow_trainer_t *t, flow_diag_t *diag)
{
	flow_comm_t *writers;
	if (!ckpt_writers(t, &writers).writes)
		return FLOW_OK; /* dp rank 0 holds the same bits */
	char *dir = flow_ckpt_step_path(t->cfg.ckpt_dir, t->step);
	if (!dir)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	double t0 = train_now_seconds();
	flow_err_t err = trainer_write_ckpt(t, dir, false, diag);
	flow_exec_profile_add(t->exec, "checkpoint", train_now_seconds() - t0,
			      0);
	free(dir);
	return err;
}

/* ---- the layout alone, from a plan ---------------------------------------- */

/* Append prefix + name's part to layout (when it is written). */
static flow_err_t layout_add(flow_train_ckpt_layout_t *layout, size_t *cap,
			     const ckpt_part_t *part, const char *prefix,
			     const char *name, const flow_shape_t *shape,
			     flow_diag_t *diag)
{
	if (!part->write)
		return FLOW_OK;
	if (layout->nparts == *cap) {
		size_t n = *cap ? 2 * *cap : 64;
		flow_train_ckpt_part_t *p =
			realloc(layout->parts, n * sizeof *p);
		if (!p)
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "out of memory");
		layout->parts = p;
		*cap = n;
	}
	flow_train_ckpt_part_t *p = &layout->parts[layout->nparts++];
	memset(p, 0, sizeof *p);
	snprintf(p->desc.name, sizeof p->desc.name, "%s%s", prefix, name);
	p->desc.dtype = FLOW_DTYPE_F32;
	p->desc.shape = *shape;
	memcpy(p->desc.mesh, part->mesh, sizeof p->desc.mesh);
	memcpy(p->desc.sbp, part->sbp, sizeof p->desc.sbp);
	p->box = *part->box;
	return FLOW_OK;
}

flow_err_t flow_train_ckpt_layout(const flow_plan_t *plan, int64_t rank,
				  flow_train_ckpt_contents_t contents,
				  flow_train_ckpt_layout_t *layout_out,
				  flow_diag_t *diag)
{
	const flow_mesh_t *mesh = &plan->mesh;
	int64_t index = flow_mesh_index_of(mesh, rank);
	if (index < 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: rank %lld is not on the plan's mesh",
				     plan->path, (long long)rank);
	/* The rank's data-parallel position, as the trainer's dp group
	 * numbers it (flow_comm_mesh_axes). */
	int dp_rank = 0, dp_size = 1;
	int dp = flow_mesh_axis(mesh, "dp");
	if (dp >= 0 && mesh->dims[dp] > 1) {
		flow_mesh_t group;
		flow_mesh_group(mesh, 1u << dp, index, &group);
		dp_rank = (int)flow_mesh_index_of(&group, rank);
		dp_size = (int)mesh->dims[dp];
	}
	uint32_t T = plan->seq_len ? plan->seq_len : plan->cfg.seq;
	bool localized = plan_localized(plan);
	flow_local_t local;
	memset(&local, 0, sizeof local);
	flow_graph_t graph, *g = &graph;
	flow_graph_init(&graph);
	flow_zero_t *z = NULL;
	flow_err_t err;
	if (localized) {
		err = flow_gpt_build(&plan->cfg, plan->batch, T, &graph, diag);
		if (err == FLOW_OK)
			err = flow_graph_backward(&graph, diag);
		if (err == FLOW_OK)
			err = flow_local_build(plan, &graph, index, &local,
					       diag);
		g = &local.graph;
	} else if (plan->batch % (uint32_t)dp_size) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "batch %" PRIu32 " does not split evenly "
				    "over %d ranks",
				    plan->batch, dp_size);
	} else {
		err = flow_gpt_build(&plan->cfg, plan->batch / (uint32_t)dp_size,
				     T, &graph, diag);
		if (err == FLOW_OK)
			err = flow_graph_backward(&graph, diag);
	}
	if (err == FLOW_OK)
		err = flow_zero_new(plan, g, localized ? &local : NULL,
				    dp_rank, dp_size, &z, diag);
	if (err != FLOW_OK)
		goto out_release;

	flow_train_ckpt_layout_t layout = { 0 };
	ckpt_writer_rule_t rule = ckpt_writer_rule(
		localized, z->any_split, rank, flow_mesh_top_rank(mesh) + 1,
		dp_rank, dp_size);
	layout.writes = rule.writes;
	layout.writer = rule.writer;
	layout.nwriters = rule.nwriters;
	ckpt_geometry_t geo = {
		.plan = plan,
		.local = localized ? &local : NULL,
		.dp_size = dp_size,
	};
	size_t cap = 0;
	for (size_t i = 0; layout.writes && i < z->nparams && err == FLOW_OK;
	     i++) {
		const flow_zero_param_t *zp = &z->params[i];
		const char *name = g->tensors[zp->tensor].name;
		ckpt_part_t part;
		ckpt_part_layout(&geo, zp, false, &part);
		err = layout_add(&layout, &cap, &part, "", name, &zp->shape,
				 diag);
		if (contents == FLOW_TRAIN_CKPT_WEIGHTS)
			continue;
		ckpt_part_layout(&geo, zp, true, &part);
		if (err == FLOW_OK)
			err = layout_add(&layout, &cap, &part, ADAMW_M_PREFIX,
					 name, &zp->shape, diag);
		if (err == FLOW_OK)
			err = layout_add(&layout, &cap, &part, ADAMW_V_PREFIX,
					 name, &zp->shape, diag);
	}
	if (err == FLOW_OK)
		*layout_out = layout;
	else
		flow_train_ckpt_layout_release(&layout);
	flow_zero_free(z);
out_release:
	if (localized)
		flow_local_release(&local);
	flow_graph_release(&graph);
	return err;
}

void flow_train_ckpt_layout_release(flow_train_ckpt_layout_t *layout)
{
	if (!layout)
		return;
	free(layout->parts);
	layout->parts = NULL;
	layout->nparts = 0;
}

/* ---- resuming ------------------------------------------------------------------ */

/* Read the box (NULL: all) of the tensor name of this shape into dst. */
static flow_err_t read_param(const flow_ckpt_t *ck, const char *path,
			     const char *name, const flow_shape_t *shape,
			     const flow_box_t *box, float *dst,
			     flow_diag_t *diag)
{
	int i = flow_ckpt_tensor_find(ck, name);
	if (i < 0)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: checkpoint has no tensor '%s'", path,
				     name);
	const flow_ckpt_tensor_desc_t *d = flow_ckpt_tensor_at(ck, (size_t)i);
	if (d->dtype != FLOW_DTYPE_F32 || !flow_shape_equal(&d->shape, shape)) {
		char want[64], got[64];
		flow_shape_format(shape, want, sizeof want);
		flow_shape_format(&d->shape, got, sizeof got);
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: tensor '%s' is %s %s, expected f32 %s",
				     path, name, flow_dtype_name(d->dtype), got,
				     want);
	}
	return flow_ckpt_read(ck, (size_t)i, box, dst, diag);
}

/* read_param into this rank's part, through a host copy for a device. */
static flow_err_t read_part(flow_trainer_t *t, const flow_ckpt_t *ck,
			    const char *path, const char *name,
			    const flow_shape_t *shape, const ckpt_part_t *part,
			    flow_diag_t *diag)
{
	float *host = NULL;
	flow_err_t err = part_staging(t, part, name, &host, diag);
	if (err == FLOW_OK)
		err = read_param(ck, path, name, shape, part->box,
				 host ? host : part->data, diag);
	if (err == FLOW_OK && host)
		err = flow_exec_copy_in(t->exec, part->data, host,
					(size_t)flow_box_numel(part->box) *
						sizeof(float),
					diag);
	return err;
}

/* This rank's parts of the parameters (and, for a training checkpoint,
 * of their AdamW moments) from ck: any layout it was written in will do. */
static flow_err_t read_parts(flow_trainer_t *t, const flow_ckpt_t *ck,
			     const char *path,
			     flow_train_ckpt_contents_t contents,
			     flow_diag_t *diag)
{
	const flow_zero_t *z = t->zero;
	char name[FLOW_CKPT_NAME_MAX];
	flow_err_t err = FLOW_OK;
	for (size_t i = 0; i < z->nparams && err == FLOW_OK; i++) {
		const flow_zero_param_t *zp = &z->params[i];
		const char *pname = t->graph.tensors[zp->tensor].name;
		ckpt_part_t part;
		ckpt_part(t, zp, false, flow_exec_tensor(t->exec, zp->tensor),
			  &part);
		err = read_part(t, ck, path, pname, &zp->shape, &part, diag);
		if (contents == FLOW_TRAIN_CKPT_WEIGHTS)
			continue;
		ckpt_part(t, zp, true, flow_adamw_m(t->opt, zp->tensor), &part);
		snprintf(name, sizeof name, ADAMW_M_PREFIX "%s", pname);
		if (err == FLOW_OK)
			err = read_part(t, ck, path, name, &zp->shape, &part,
					diag);
		ckpt_part(t, zp, true, flow_adamw_v(t->opt, zp->tensor), &part);
		snprintf(name, sizeof name, ADAMW_V_PREFIX "%s", pname);
		if (err == FLOW_OK)
			err = read_part(t, ck, path, name, &zp->shape, &part,
					diag);
	}
	/* Of split parameters only the shards were read. */
	if (err == FLOW_OK)
		flow_zero_params_changed(t->zero);
	return err;
}

static flow_err_t state_u64(const flow_ckpt_t *ck, const char *path,
			    const char *key, uint64_t *out, flow_diag_t *diag)
{
	const char *v = flow_ckpt_get(ck, key);
	int64_t x;
	if (!v || flow_parse_int(v, 0, INT64_MAX, &x, NULL) != FLOW_OK)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: state '%s' is %s", path, key,
				     v ? "not a count" : "missing");
	*out = (uint64_t)x;
	return FLOW_OK;
}

/* Each step reads grad_accum global batches, so the loader of a
 * checkpoint of step S stands at sample S * batch * grad_accum of its
 * stream: a checkpoint whose two disagree (edited, or pieced together
 * from two runs) would resume on other data than the run it claims to
 * continue. */
static flow_err_t check_loader_position(const flow_trainer_t *t,
					const flow_ckpt_t *ck,
					const char *path,
					const flow_loader_state_t *ls,
					flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	uint64_t n = flow_loader_samples_per_epoch(t->train);
	uint64_t step = flow_ckpt_step(ck), have, want;
	bool bad = ls->index >= n ||
		   __builtin_mul_overflow(ls->epoch, n, &have) ||
		   __builtin_add_overflow(have, ls->index, &have) ||
		   __builtin_mul_overflow(step, (uint64_t)c->batch * c->grad_accum,
					  &want) ||
		   have != want;
	if (!bad)
		return FLOW_OK;
	return flow_diag_set(diag, FLOW_ERR_FORMAT,
			     "%s: the loader stands at epoch %" PRIu64
			     " sample %" PRIu64 " (of %" PRIu64
			     "), which is not where step %" PRIu64
			     " of batch %" PRIu32 " x grad-accum %" PRIu32
			     " leaves it",
			     path, ls->epoch, ls->index, n, step, c->batch,
			     c->grad_accum);
}

flow_err_t trainer_resume(flow_trainer_t *t, flow_diag_t *diag)
{
	const flow_train_config_t *c = &t->cfg;
	char *path = NULL;
	flow_err_t err;
	if (strcmp(c->resume, "latest") == 0) {
		if (!c->ckpt_dir)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "--resume latest needs "
					     "--ckpt-dir");
		err = flow_ckpt_latest(c->ckpt_dir, &path, diag);
	} else {
		path = strdup(c->resume);
		err = path ? FLOW_OK
			   : flow_diag_set(diag, FLOW_ERR_NOMEM,
					   "out of memory");
	}
	if (err != FLOW_OK)
		return err;
	flow_ckpt_t *ck = NULL;
	err = flow_ckpt_open(path, &ck, diag);
	if (err != FLOW_OK)
		goto out_free_path;

	const char *contents = flow_ckpt_get(ck, "contents");
	if (!contents || strcmp(contents, "training") != 0) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: not a training checkpoint (contents "
				    "'%s')",
				    path, contents ? contents : "missing");
		goto out_close;
	}
	run_state_t s;
	run_state_build(t, &s);
	for (size_t i = 0; i < s.n; i++) {
		const char *have = flow_ckpt_get(ck, s.kv[i].key);
		if (!have || strcmp(have, s.kv[i].value) != 0) {
			err = flow_diag_set(diag, FLOW_ERR_USAGE,
					    "%s: %s is '%s' in the checkpoint "
					    "but '%s' in this run",
					    path, s.kv[i].key,
					    have ? have : "(missing)",
					    s.kv[i].value);
			goto out_close;
		}
	}
	flow_loader_state_t ls;
	if ((err = state_u64(ck, path, "loader.epoch", &ls.epoch, diag)) ||
	    (err = state_u64(ck, path, "loader.index", &ls.index, diag)) ||
	    (err = check_loader_position(t, ck, path, &ls, diag)))
		goto out_close;

	err = read_parts(t, ck, path, FLOW_TRAIN_CKPT_TRAINING, diag);
	if (err == FLOW_OK)
		err = flow_loader_seek(t->train, &ls, diag);
	if (err == FLOW_OK) {
		t->step = flow_ckpt_step(ck);
		t->resumed_from = t->step;
		t->resumed_path = path;
		path = NULL;
	}
out_close:
	flow_ckpt_free(ck);
out_free_path:
	free(path);
	return err;
}

flow_err_t flow_train_ckpt_contents(const flow_ckpt_t *ck, const char *path,
				    flow_train_ckpt_contents_t *contents_out,
				    flow_diag_t *diag)
{
	const char *what = flow_ckpt_get(ck, "contents");
	if (what && strcmp(what, "training") == 0)
		*contents_out = FLOW_TRAIN_CKPT_TRAINING;
	else if (what && strcmp(what, "weights") == 0)
		*contents_out = FLOW_TRAIN_CKPT_WEIGHTS;
	else
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: neither a training checkpoint nor "
				     "weights (contents '%s')",
				     path, what ? what : "missing");
	return FLOW_OK;
}

flow_err_t trainer_init_from(flow_trainer_t *t, flow_diag_t *diag)
{
	const char *path = t->cfg.init;
	flow_ckpt_t *ck = NULL;
	flow_err_t err = flow_ckpt_open(path, &ck, diag);
	if (err != FLOW_OK)
		return err;
	/* Either kind will do: only the parameters are read. */
	flow_train_ckpt_contents_t contents;
	const char *model = flow_ckpt_get(ck, "model");
	err = flow_train_ckpt_contents(ck, path, &contents, diag);
	if (err == FLOW_OK && (!model || strcmp(model, t->spec) != 0))
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "%s: model is '%s' in the checkpoint but "
				    "'%s' in this run",
				    path, model ? model : "(missing)", t->spec);
	if (err == FLOW_OK)
		err = read_parts(t, ck, path, FLOW_TRAIN_CKPT_WEIGHTS, diag);
	if (err == FLOW_OK) {
		t->init_path = strdup(path);
		if (!t->init_path)
			err = flow_diag_set(diag, FLOW_ERR_NOMEM,
					    "out of memory");
	}
	flow_ckpt_free(ck);
	return err;
}
