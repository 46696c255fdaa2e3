/* ZeRO on the data-parallel axis (flow/zero.h): shards from a plan, and
 * the gradient sync and parameter gathers between their layouts. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <flow/ckpt.h>
#include <flow/kernels.h>
#include <flow/mem.h>
#include <flow/zero.h>

static const flow_plan_tensor_t *plan_tensor(const flow_plan_t *p,
					     const char *name)
{
	for (size_t i = 0; i < p->ntensors; i++)
		if (strcmp(p->tensors[i].name, name) == 0)
			return &p->tensors[i];
	return NULL;
}

/* Is the nd-SBP of plan tensor t split on the dp axis (true) or
 * replicated (false)?  Anything else is not a ZeRO layout, except splits
 * on other axes of a localized graph, which its shapes already are. */
static flow_err_t dp_split(const flow_plan_t *p, const flow_plan_tensor_t *t,
			   int dp, bool localized, bool *split,
			   flow_diag_t *diag)
{
	*split = false;
	for (int a = 0; a < p->mesh.ndim; a++) {
		flow_sbp_t s = t->sbp.sbp[a];
		if (s.kind == FLOW_SBP_BROADCAST || p->mesh.dims[a] == 1 ||
		    (a != dp && localized))
			continue;
		if (a != dp || s.kind != FLOW_SBP_SPLIT || s.axis != 0) {
			char text[FLOW_SBP_TEXT_MAX];
			flow_nd_sbp_format(&t->sbp, text, sizeof text);
			return flow_diag_set(diag, FLOW_ERR_NOTSUP,
					     "%s:%zu: '%s' is %s: this flow-train shards only dimension 0 on dp (ZeRO) and replicates the rest",
					     p->path, t->line, t->name, text);
		}
		*split = true;
	}
	return FLOW_OK;
}

static flow_err_t layout_from_plan(const flow_plan_t *p, const flow_graph_t *g,
				   bool localized, flow_zero_param_t *zp,
				   flow_diag_t *diag)
{
	const char *name = g->tensors[zp->tensor].name;
	char key[FLOW_PLAN_NAME_MAX];
	const flow_plan_tensor_t *param = plan_tensor(p, name), *grad, *m, *v;
	snprintf(key, sizeof key, "%s.grad", name);
	grad = plan_tensor(p, key);
	snprintf(key, sizeof key, "adamw.m/%s", name);
	m = plan_tensor(p, key);
	snprintf(key, sizeof key, "adamw.v/%s", name);
	v = plan_tensor(p, key);
	if (!param || !grad || !m || !v) /* flow_plan_check found them */
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: no layout for parameter '%s'",
				     p->path, name);
	int dp = flow_mesh_axis(&p->mesh, "dp");
	bool v_split;
	flow_err_t err;
	if ((err = dp_split(p, param, dp, localized, &zp->param_split, diag)) ||
	    (err = dp_split(p, grad, dp, localized, &zp->grad_split, diag)) ||
	    (err = dp_split(p, m, dp, localized, &zp->state_split, diag)) ||
	    (err = dp_split(p, v, dp, localized, &v_split, diag)))
		return err;
	if (localized && zp->state_split)
		return flow_diag_set(diag, FLOW_ERR_NOTSUP,
				     "%s:%zu: '%s' is split on dp: this flow-train runs ZeRO only when dp is the only axis above size 1",
				     p->path, m->line, m->name);
	if (v_split != zp->state_split)
		return flow_diag_set(diag, FLOW_ERR_NOTSUP,
				     "%s:%zu: '%s' and '%s' differ in layout",
				     p->path, v->line, v->name, m->name);
	if ((zp->grad_split || zp->param_split) && !zp->state_split) {
		const flow_plan_tensor_t *t = zp->grad_split ? grad : param;
		return flow_diag_set(diag, FLOW_ERR_NOTSUP,
				     "%s:%zu: '%s' is split on dp but its optimizer state (line %zu) is not",
				     p->path, t->line, t->name, m->line);
	}
	return FLOW_OK;
}

/* counts, begin, count and box of zp for the balanced S(0) split. */
static void place_shards(const flow_graph_t *g, int dp_rank, int dp_size,
			 flow_zero_param_t *zp)
{
	const flow_shape_t *shape = &g->tensors[zp->tensor].shape;
	size_t row = zp->numel / (size_t)shape->dims[0];
	for (int r = 0; r < dp_size; r++) {
		int64_t start, rows;
		flow_split_part(shape->dims[0], dp_size, r, &start, &rows);
		zp->counts[r] = (size_t)rows * row;
		if (r == dp_rank) {
			zp->begin = (size_t)start * row;
			zp->count = (size_t)rows * row;
			zp->box.start[0] = start;
			zp->box.extent[0] = rows;
		}
	}
}

flow_err_t flow_zero_new(const flow_plan_t *plan, const flow_graph_t *g,
			 const flow_local_t *local, int dp_rank, int dp_size,
			 flow_zero_t **zero_out, flow_diag_t *diag)
{
	flow_zero_t *z = calloc(1, sizeof *z);
	if (!z)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	z->dp_rank = dp_rank;
	z->dp_size = dp_size;
	for (size_t t = 0; t < g->ntensors; t++)
		z->nparams += g->tensors[t].role == FLOW_ROLE_PARAM;
	z->params = calloc(z->nparams ? z->nparams : 1, sizeof *z->params);
	if (!z->params)
		goto nomem;
	size_t i = 0, largest = 1;
	flow_err_t err = FLOW_OK;
	for (size_t t = 0; t < g->ntensors; t++) {
		const flow_graph_tensor_t *gt = &g->tensors[t];
		if (gt->role != FLOW_ROLE_PARAM)
			continue;
		flow_zero_param_t *zp = &z->params[i++];
		zp->tensor = (int)t;
		zp->numel = flow_graph_tensor_numel(g, (int)t);
		zp->count = zp->numel;
		if (local) {
			zp->box = local->box[t];
			zp->shape = local->logical[t];
			zp->owner = flow_local_owns(local, &plan->mesh, (int)t);
		} else {
			flow_box_whole(&gt->shape, &zp->box);
			zp->shape = gt->shape;
			zp->owner = dp_rank == 0;
		}
		zp->param_box = zp->box;
		zp->counts = calloc((size_t)dp_size, sizeof *zp->counts);
		if (!zp->counts)
			goto nomem;
		if (plan && (err = layout_from_plan(plan, g, local != NULL, zp,
						    diag)))
			goto fail;
		if (zp->state_split) {
			place_shards(g, dp_rank, dp_size, zp);
			z->any_split = true;
		}
		if (zp->numel > largest)
			largest = zp->numel;
	}
	z->largest = largest;
	*zero_out = z;
	return FLOW_OK;
nomem:
	err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
fail:
	flow_zero_free(z);
	return err;
}

void flow_zero_free(flow_zero_t *z)
{
	if (!z)
		return;
	for (size_t i = 0; i < z->nparams; i++)
		free(z->params[i].counts);
	free(z->params);
	if (z->scratch_storage)
		z->scratch_storage->free(z->scratch);
	flow_free(z->staging);
	flow_free(z->host_scratch);
	free(z);
}

const flow_zero_param_t *flow_zero_param(const flow_zero_t *z, int param)
{
	for (size_t i = 0; i < z->nparams; i++)
		if (z->params[i].tensor == param)
			return &z->params[i];
	return NULL;
}

/* ---- host staging ---------------------------------------------------------- */

/* Does comm need host copies of exec's tensors?  When the executor's
 * storage is a device's and comm is a CPU communicator. */
static bool staged(flow_comm_t *comm, flow_exec_t *exec)
{
	return !flow_exec_storage(exec)->host_addressable &&
	       flow_comm_backend(comm) == FLOW_COMM_CPU;
}

/* What comm reads of the n floats at p (first `skip` of them not
 * needed): p itself, or when staged their copy in z->staging, copied out
 * from p + skip.  Read in place, p is read by NCCL on its own stream,
 * which is not ordered after the executor's kernels: every entry point
 * below waits for them first (flow_exec_sync; AdamW's update of a shard
 * about to be gathered), and each copy after a collective waits itself. */
static flow_err_t host_view(flow_zero_t *z, flow_comm_t *comm,
			    flow_exec_t *exec, float *p, size_t skip, size_t n,
			    float **view_out, flow_diag_t *diag)
{
	if (!staged(comm, exec)) {
		*view_out = p;
		return FLOW_OK;
	}
	if (!z->staging &&
	    !(z->staging = flow_alloc(z->largest * sizeof(float))))
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory for a %zu-float host "
				     "staging buffer of the gradients",
				     z->largest);
	*view_out = z->staging;
	return flow_exec_copy_out(exec, z->staging + skip, p + skip,
				  (n - skip) * sizeof(float), diag);
}

/* Where a reduce-scatter or all-gather of comm over exec's tensors lands
 * (the largest parameter's room): host memory when staged, else the
 * storage's own. */
static flow_err_t landing(flow_zero_t *z, flow_comm_t *comm,
			  flow_exec_t *exec, float **out, flow_diag_t *diag)
{
	size_t bytes = z->largest * sizeof(float);
	if (staged(comm, exec)) {
		if (!z->host_scratch && !(z->host_scratch = flow_alloc(bytes)))
			goto nomem;
		*out = z->host_scratch;
		return FLOW_OK;
	}
	if (!z->scratch) {
		const flow_exec_storage_t *st = flow_exec_storage(exec);
		if (!(z->scratch = st->alloc(bytes)))
			goto nomem;
		z->scratch_storage = st;
	}
	*out = z->scratch;
	return FLOW_OK;
nomem:
	return flow_diag_set(diag, FLOW_ERR_NOMEM,
			     "out of memory for the %zu-byte room of ZeRO's "
			     "collectives", bytes);
}

/* n floats from the landing room into p of exec's storage. */
static flow_err_t land(flow_comm_t *comm, flow_exec_t *exec, float *p,
		       const float *room, size_t n, flow_diag_t *diag)
{
	return staged(comm, exec)
		       ? flow_exec_copy_in(exec, p, room, n * sizeof(float), diag)
		       : flow_exec_copy(exec, p, room, n * sizeof(float), diag);
}

/* n floats of host memory src into p of exec's storage (a memcpy when
 * the host addresses it). */
static flow_err_t store(flow_exec_t *exec, float *p, const float *src,
			size_t n, flow_diag_t *diag)
{
	if (p == src)
		return FLOW_OK;
	return flow_exec_copy_in(exec, p, src, n * sizeof(float), diag);
}

flow_err_t flow_zero_sync_grads(flow_zero_t *z, flow_comm_t *comm,
				flow_exec_t *exec, flow_diag_t *diag)
{
	if (z->dp_size == 1)
		return FLOW_OK;
	const flow_graph_t *g = flow_exec_graph(exec);
	flow_err_t err = flow_exec_sync(exec, diag);
	for (size_t i = 0; i < z->nparams && err == FLOW_OK; i++) {
		const flow_zero_param_t *zp = &z->params[i];
		float *grad = flow_exec_tensor(exec, g->tensors[zp->tensor].grad);
		float *host = NULL;
		err = host_view(z, comm, exec, grad, 0, zp->numel, &host, diag);
		if (err == FLOW_OK && !zp->grad_split) {
			err = flow_all_reduce(comm, host, host, zp->numel,
					      FLOW_DTYPE_F32, diag);
			if (err == FLOW_OK)
				err = store(exec, grad, host, zp->numel, diag);
			continue;
		}
		/* Not in place: through the landing room into the shard. */
		float *room = NULL;
		if (err == FLOW_OK)
			err = landing(z, comm, exec, &room, diag);
		if (err == FLOW_OK)
			err = flow_reduce_scatter(comm, host, room, zp->counts,
						  FLOW_DTYPE_F32, diag);
		if (err == FLOW_OK)
			err = land(comm, exec, grad + zp->begin, room, zp->count,
				   diag);
	}
	return err;
}

double flow_zero_grad_sum_squares(const flow_zero_t *z, flow_exec_t *exec)
{
	const flow_graph_t *g = flow_exec_graph(exec);
	const flow_kernels_t *k = flow_exec_kernels(exec);
	double ss = 0.0;
	for (size_t i = 0; i < z->nparams; i++) {
		const flow_zero_param_t *zp = &z->params[i];
		const float *grad =
			flow_exec_tensor(exec, g->tensors[zp->tensor].grad);
		if (zp->state_split)
			ss += k->sum_squares(grad + zp->begin, zp->count);
		else if (zp->owner)
			ss += k->sum_squares(grad, zp->numel);
	}
	return ss;
}

/* All-gather the shards of parameter zp in place in exec. */
static flow_err_t gather_param(flow_zero_t *z, const flow_zero_param_t *zp,
			       flow_comm_t *comm, flow_exec_t *exec,
			       flow_diag_t *diag)
{
	float *param = flow_exec_tensor(exec, zp->tensor);
	float *host = NULL, *room = NULL;
	flow_err_t err = host_view(z, comm, exec, param, zp->begin,
				   zp->begin + zp->count, &host, diag);
	if (err == FLOW_OK)
		err = landing(z, comm, exec, &room, diag);
	if (err == FLOW_OK)
		err = flow_all_gather(comm, host + zp->begin, room, zp->counts,
				      FLOW_DTYPE_F32, diag);
	if (err == FLOW_OK)
		err = land(comm, exec, param, room, zp->numel, diag);
	return err;
}

flow_err_t flow_zero_after_update(flow_zero_t *z, flow_comm_t *comm,
				  flow_exec_t *exec, flow_diag_t *diag)
{
	flow_err_t err = flow_exec_sync(exec, diag);
	for (size_t i = 0; i < z->nparams && err == FLOW_OK; i++) {
		const flow_zero_param_t *zp = &z->params[i];
		if (zp->param_split)
			z->params_stale = true;
		else if (zp->state_split)
			err = gather_param(z, zp, comm, exec, diag);
	}
	return err;
}

void flow_zero_params_changed(flow_zero_t *z)
{
	for (size_t i = 0; i < z->nparams; i++)
		if (z->params[i].param_split)
			z->params_stale = true;
}

flow_err_t flow_zero_before_forward(flow_zero_t *z, flow_comm_t *comm,
				    flow_exec_t *exec, flow_diag_t *diag)
{
	if (!z->params_stale)
		return FLOW_OK;
	flow_err_t err = flow_exec_sync(exec, diag);
	for (size_t i = 0; i < z->nparams && err == FLOW_OK; i++)
		if (z->params[i].param_split)
			err = gather_param(z, &z->params[i], comm, exec, diag);
	if (err == FLOW_OK)
		z->params_stale = false;
	return err;
}
