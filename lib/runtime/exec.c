/* The executor's single-graph part (flow/exec.h): the storage of every
 * tensor of a graph, from the storage of the chosen kernel set; a forward
 * and a backward pass that call one kernel per op through that set's table
 * (flow/kernels.h); parameter initialisation; and the profile.  The ops of
 * a localized graph that talk to other ranks (boxing, the split
 * cross-entropy) are in exec_dist.c, which exec_kernel hands them to.
 *
 * Everything a step needs is worked out in flow_exec_new: each op's
 * tensor pointers and kernel sizes, and which activation gradients to clear
 * before it, so a step allocates nothing and costs, per op, a switch and
 * (when profiling) two clock reads. */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flow/kernels.h>
#include <flow/device.h>
#include <flow/kernels_ref.h>
#include <flow/mem.h>
#include <flow/rng.h>

#include "device/cuda_module_internal.h"
#include "exec_internal.h"

/* What a kernel set flow_exec_new can name stands for: the table of its
 * kernels, and the storage whose memory they address.  The CUDA set's come
 * from the CUDA module, loaded now if it was not. */
static flow_err_t exec_device(flow_exec_t *x, flow_kernel_set_t set,
			      flow_diag_t *diag)
{
	const flow_cuda_module_t *cuda = NULL;
	flow_err_t err;

	switch (set) {
	case FLOW_KERNELS_CPU:
		x->kernels = &flow_cpu_kernels;
		x->storage = &flow_exec_storage_host;
		return FLOW_OK;
	case FLOW_KERNELS_REF:
		x->kernels = &flow_ref_kernels;
		x->storage = &flow_exec_storage_host;
		return FLOW_OK;
	case FLOW_KERNELS_STAGED:
		x->kernels = &flow_cpu_kernels;
		x->storage = &flow_exec_storage_staged;
		return FLOW_OK;
	case FLOW_KERNELS_CUDA:
		if ((err = flow_cuda_open(diag)) != FLOW_OK ||
		    (err = flow_cuda_module_get(&cuda, diag)) != FLOW_OK)
			return err;
		x->kernels = cuda->kernels;
		x->storage = cuda->storage;
		return FLOW_OK;
	}
	return flow_diag_set(diag, FLOW_ERR_USAGE, "unknown kernel set %d",
			     (int)set);
}

/* Wait for what the kernels and storage have in flight and take their
 * first failure (a device's: host kernels cannot fail).  A failure is
 * final: it is kept in x and every later pass returns it again. */
static flow_err_t exec_finish(flow_exec_t *x, flow_diag_t *diag)
{
	if (x->err == FLOW_OK)
		x->err = flow_kernels_wait(x->kernels, &x->diag);
	if (x->err != FLOW_OK)
		return flow_diag_set(diag, x->err, "%s",
				     flow_diag_message(&x->diag));
	return FLOW_OK;
}


/* ---- setup ------------------------------------------------------------------ */

/* Lay out the persistent tensors: params and inputs each in their block in
 * graph order; a param's gradient at the same offset of the gradient
 * block as the param in the param block, so the two blocks match. */
static flow_err_t exec_layout_persistent(flow_exec_t *x, size_t *offset,
					 size_t *input_bytes, flow_diag_t *diag)
{
	const flow_graph_t *g = x->g;
	size_t params = 0, inputs = 0;
	bool grads = false;

	for (size_t t = 0; t < g->ntensors; t++) {
		const flow_graph_tensor_t *p = &g->tensors[t];
		size_t bytes = flow_graph_align(flow_graph_tensor_bytes(g, (int)t));
		size_t *end = p->role == FLOW_ROLE_PARAM ? &params :
			      p->role == FLOW_ROLE_INPUT ? &inputs : NULL;

		if (p->role == FLOW_ROLE_PARAM_GRAD) {
			if (p->grad_of < 0 ||
			    g->tensors[p->grad_of].role != FLOW_ROLE_PARAM)
				return flow_diag_set(diag, FLOW_ERR_FORMAT,
						     "param_grad '%s' is not "
						     "the gradient of a param",
						     p->name);
			grads = true;
		}
		if (!end)
			continue;
		offset[t] = *end;
		if (!flow_add_size(*end, bytes, end))
			return flow_diag_set(diag, FLOW_ERR_RANGE,
					     "the parameters and inputs take "
					     "more bytes than memory can "
					     "address");
	}
	x->param_bytes = params;
	x->grad_bytes = grads ? params : 0;
	*input_bytes = inputs;
	return FLOW_OK;
}

/* The kernel sizes of op, read from the shapes of its forward op. */
static void exec_op_dims(const flow_graph_t *g, const flow_graph_op_t *op,
			 size_t dim[DIM_COUNT])
{
	const flow_graph_op_t *f = op->forward >= 0 ? flow_op_forward_of(g, op) :
						      op;
	const flow_shape_t *x = &g->tensors[f->in[0]].shape;

	switch (f->kind) {
	case FLOW_OP_EMBEDDING:
		dim[DIM_B] = (size_t)x->dims[0];
		dim[DIM_T] = (size_t)x->dims[1];
		dim[DIM_C] = (size_t)g->tensors[f->in[1]].shape.dims[1];
		dim[DIM_ROWS] = (size_t)g->tensors[f->in[1]].shape.dims[0];
		break;
	case FLOW_OP_ATTENTION:
		dim[DIM_B] = (size_t)x->dims[0];
		dim[DIM_T] = (size_t)x->dims[1];
		dim[DIM_C] = (size_t)x->dims[2] / 3;
		dim[DIM_NH] = f->attrs.heads;
		break;
	case FLOW_OP_LAYERNORM:
		dim[DIM_N] = flow_shape_rows(x);
		dim[DIM_C] = flow_shape_last(x);
		break;
	case FLOW_OP_MATMUL:
		dim[DIM_N] = flow_shape_rows(x);
		dim[DIM_IN] = flow_shape_last(x);
		dim[DIM_OUT] = (size_t)g->tensors[f->in[1]].shape.dims[0];
		break;
	case FLOW_OP_CROSS_ENTROPY:
		dim[DIM_N] = flow_shape_rows(x);
		dim[DIM_V] = f->attrs.vocab;
		dim[DIM_VP] = flow_shape_last(x);
		break;
	default: /* gelu, add: elementwise */
		dim[DIM_N] = flow_graph_tensor_numel(g, f->in[0]);
		break;
	}
}

bool flow_exec_op_bf16(const flow_graph_t *g, const flow_graph_op_t *op)
{
	const flow_graph_op_t *f = op->forward >= 0 ? flow_op_forward_of(g, op) :
						      op;

	for (int k = 0; k < f->nin + f->nout; k++) {
		int t = k < f->nin ? f->in[k] : f->out[k - f->nin];
		if (t >= 0 && g->tensors[t].dtype == FLOW_DTYPE_BF16)
			return true;
	}
	return false;
}

/* Bytes of scratch op needs from this kernel set: attention, forward and
 * backward, for a batch row's probabilities, and every bf16 matmul, for
 * its rounded weight (and on the host, its widened rows); each set says
 * how much (the reference attention keeps doubles), so not the op
 * definition's f32 figure. */
static size_t exec_op_scratch(const flow_exec_t *x, const flow_graph_op_t *op)
{
	size_t d[DIM_COUNT];
	bool bf16 = flow_exec_op_bf16(x->g, op);

	switch (op->kind) {
	case FLOW_OP_ATTENTION:
	case FLOW_OP_ATTENTION_BACKWARD:
		exec_op_dims(x->g, op, d);
		return x->kernels->attention_scratch_bound(
			d[DIM_B], d[DIM_T], d[DIM_C], d[DIM_NH], bf16);
	case FLOW_OP_MATMUL:
	case FLOW_OP_MATMUL_BACKWARD:
		if (!bf16)
			return 0;
		exec_op_dims(x->g, op, d);
		return x->kernels->matmul_bf16_scratch_bound(d[DIM_N], d[DIM_IN],
							     d[DIM_OUT]);
	default:
		return 0;
	}
}

/* The scratch the largest op needs. */
static size_t exec_scratch_bytes(const flow_exec_t *x)
{
	size_t scratch = 0;

	for (size_t i = 0; i < x->g->nops; i++) {
		size_t s = exec_op_scratch(x, &x->g->ops[i]);
		if (s > scratch)
			scratch = s;
	}
	return scratch;
}

static flow_err_t exec_alloc(flow_exec_t *x, flow_diag_t *diag)
{
	const flow_graph_t *g = x->g;
	const flow_exec_storage_t *st = x->storage;
	size_t n = g->ntensors ? g->ntensors : 1, input_bytes = 0;
	size_t *offset = calloc(n, sizeof(*offset));
	flow_err_t err;

	x->ptr = calloc(n, sizeof(*x->ptr));
	x->ops = calloc(g->nops ? g->nops : 1, sizeof(*x->ops));
	x->zeros = calloc(n, sizeof(*x->zeros));
	if (!offset || !x->ptr || !x->ops || !x->zeros)
		goto out_nomem;
	err = exec_layout_persistent(x, offset, &input_bytes, diag);
	if (err != FLOW_OK)
		goto out_free_offset;
	x->scratch_bytes = exec_scratch_bytes(x);
	/* All zeroed, so no step can depend on what the allocator left. */
	x->params = st->alloc(x->param_bytes);
	x->param_grads = st->alloc(x->grad_bytes);
	x->inputs = st->alloc(input_bytes);
	x->arena = st->alloc(x->plan.arena_bytes);
	x->scratch = st->alloc(x->scratch_bytes);
	if (!x->params || !x->param_grads || !x->inputs || !x->arena ||
	    !x->scratch)
		goto out_nomem;
	if (!st->host_addressable && g->loss >= 0 &&
	    !(x->losses_host = malloc(flow_graph_tensor_bytes(g, g->loss) + 1)))
		goto out_nomem;
	for (size_t t = 0; t < g->ntensors; t++) {
		const flow_graph_tensor_t *p = &g->tensors[t];
		switch (p->role) {
		case FLOW_ROLE_PARAM:
			x->ptr[t] = (char *)x->params + offset[t];
			break;
		case FLOW_ROLE_PARAM_GRAD:
			x->ptr[t] = (char *)x->param_grads + offset[p->grad_of];
			break;
		case FLOW_ROLE_INPUT:
			x->ptr[t] = (char *)x->inputs + offset[t];
			break;
		default:
			if (x->plan.offset[t] != SIZE_MAX)
				x->ptr[t] = (char *)x->arena + x->plan.offset[t];
			break;
		}
	}
	free(offset);
	return FLOW_OK;

out_nomem:
	err = flow_diag_set(diag, FLOW_ERR_NOMEM,
			    "out of memory for the executor: %zu parameter, "
			    "%zu gradient and %zu arena bytes",
			    x->param_bytes, x->grad_bytes, x->plan.arena_bytes);
out_free_offset:
	free(offset);
	return err;
}

/* Resolve every op's pointers and sizes, and list the activation
 * gradients to clear: a gradient is cleared before the first op that
 * writes it, when that op accumulates (cross-entropy's dlogits is
 * written, not added to, so it is not). */
static flow_err_t exec_prepare_ops(flow_exec_t *x, flow_diag_t *diag)
{
	const flow_graph_t *g = x->g;
	bool *seen = calloc(g->ntensors ? g->ntensors : 1, sizeof(*seen));
	size_t nzero = 0;

	if (!seen)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory preparing the executor");
	for (size_t t = 0; t < g->ntensors; t++)
		if (g->tensors[t].alias_of >= 0)
			x->ptr[t] = x->ptr[g->tensors[t].alias_of];
	for (size_t i = 0; i < g->nops; i++) {
		const flow_graph_op_t *op = &g->ops[i];
		const flow_op_def_t *def = flow_op_def(op->kind);
		exec_op_t *o = &x->ops[i];

		o->kind = op->kind;
		o->attrs = &op->attrs;
		for (int k = 0; k < op->nin; k++)
			o->in[k] = op->in[k] >= 0 ? x->ptr[op->in[k]] : NULL;
		o->zero_first = nzero;
		for (int k = 0; k < op->nout; k++) {
			int t = op->out[k];
			if (t < 0)
				continue;
			o->out[k] = x->ptr[t];
			if (seen[t])
				continue;
			seen[t] = true;
			if (g->tensors[t].role == FLOW_ROLE_GRAD &&
			    (def->accumulates >> k & 1))
				x->zeros[nzero++] = (exec_zero_t){
					x->ptr[t], flow_graph_tensor_bytes(g, t)
				};
		}
		o->nzero = nzero - o->zero_first;
		exec_op_dims(g, op, o->dim);
		o->flops = def->flops(g, op);
		o->fuse_next = flow_graph_fused_with_next(g, i);
		o->bf16 = flow_exec_op_bf16(g, op);
		x->step_flops += o->flops;
	}
	free(seen);
	return FLOW_OK;
}

/* 1 / (tokens of one micro-batch): the rows of the loss. */
static float default_loss_scale(const flow_graph_t *g)
{
	int losses = g->loss;

	for (size_t i = 0; losses < 0 && i < g->nforward; i++)
		if (g->ops[i].kind == FLOW_OP_CROSS_ENTROPY)
			losses = g->ops[i].out[0];
	if (losses < 0 || flow_graph_tensor_numel(g, losses) == 0)
		return 1.0f;
	return (float)(1.0 / (double)flow_graph_tensor_numel(g, losses));
}

flow_err_t flow_exec_new(const flow_graph_t *g, flow_kernel_set_t kernels,
			 flow_exec_t **exec_out, flow_diag_t *diag)
{
	flow_exec_t *x;
	flow_err_t err;

	if ((err = flow_graph_validate(g, diag)) != FLOW_OK)
		return err;
	x = calloc(1, sizeof(*x));
	if (!x)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory for the executor");
	x->g = g;
	if ((err = exec_device(x, kernels, diag)) != FLOW_OK)
		goto out_free_exec;
	x->loss_scale = default_loss_scale(g);
	for (int k = 0; k < FLOW_OP_KIND_COUNT; k++)
		snprintf(x->profile[k].name, sizeof(x->profile[k].name), "%s",
			 flow_op_def((flow_op_kind_t)k)->name);
	if ((err = flow_memplan_build(g, &x->plan, diag)) != FLOW_OK ||
	    (err = exec_alloc(x, diag)) != FLOW_OK ||
	    (err = exec_prepare_ops(x, diag)) != FLOW_OK ||
	    (err = exec_finish(x, diag)) != FLOW_OK)
		goto out_free_exec;
	*exec_out = x;
	return FLOW_OK;

out_free_exec:
	flow_exec_free(x);
	return err;
}

void flow_exec_free(flow_exec_t *x)
{
	if (!x)
		return;
	if (!x->storage) { /* failed before it had a device */
		free(x);
		return;
	}
	free(x->losses_host);
	x->storage->free(x->scratch);
	x->storage->free(x->arena);
	x->storage->free(x->inputs);
	x->storage->free(x->param_grads);
	x->storage->free(x->params);
	free(x->zeros);
	free(x->ops);
	free(x->ptr);
	flow_memplan_release(&x->plan);
	if (x->dist_scratch)
		x->dist_storage->free(x->dist_scratch);
	free(x);
}

const flow_graph_t *flow_exec_graph(const flow_exec_t *x)
{
	return x->g;
}

const flow_memplan_t *flow_exec_memplan(const flow_exec_t *x)
{
	return &x->plan;
}

void *flow_exec_tensor(flow_exec_t *x, int t)
{
	if (t < 0 || (size_t)t >= x->g->ntensors)
		return NULL;
	return x->ptr[t];
}

size_t flow_exec_fused_pairs(const flow_exec_t *x)
{
	size_t n = 0;

	for (size_t i = 0; i < x->g->nops; i++)
		n += x->ops[i].fuse_next;
	return n;
}

size_t flow_exec_scratch_bytes(const flow_exec_t *x)
{
	return x->scratch_bytes;
}

const flow_exec_storage_t *flow_exec_storage(const flow_exec_t *x)
{
	return x->storage;
}

const flow_kernels_t *flow_exec_kernels(const flow_exec_t *x)
{
	return x->kernels;
}

flow_err_t flow_exec_sync(flow_exec_t *x, flow_diag_t *diag)
{
	return exec_finish(x, diag);
}

flow_err_t flow_exec_copy_in(flow_exec_t *x, void *dst, const void *src,
			     size_t bytes, flow_diag_t *diag)
{
	x->storage->copy_in(dst, src, bytes);
	return exec_finish(x, diag);
}

flow_err_t flow_exec_copy_out(flow_exec_t *x, void *dst, const void *src,
			      size_t bytes, flow_diag_t *diag)
{
	x->storage->copy_out(dst, src, bytes);
	return exec_finish(x, diag);
}

flow_err_t flow_exec_copy(flow_exec_t *x, void *dst, const void *src,
			  size_t bytes, flow_diag_t *diag)
{
	x->storage->copy(dst, src, bytes);
	return exec_finish(x, diag);
}

flow_err_t flow_exec_tensor_upload(flow_exec_t *x, int t, const void *src,
				   flow_diag_t *diag)
{
	return flow_exec_copy_in(x, x->ptr[t], src,
				 flow_graph_tensor_bytes(x->g, t), diag);
}

flow_err_t flow_exec_tensor_download(flow_exec_t *x, int t, void *dst,
				     flow_diag_t *diag)
{
	return flow_exec_copy_out(x, dst, x->ptr[t],
				  flow_graph_tensor_bytes(x->g, t), diag);
}

void flow_exec_set_loss_scale(flow_exec_t *x, float scale)
{
	x->loss_scale = scale;
}

/* ---- parameters ---------------------------------------------------------------- */

/* Fill the run [first, first + n) of logical tensor p's row-major
 * elements, of logical row `row` (rows past init.rows stay zero). */
static void init_run(const flow_graph_tensor_t *p, float *v, size_t n,
		     uint64_t first, int64_t row, uint64_t seed)
{
	bool drawn = p->init.rows <= 0 || row < p->init.rows;

	switch (drawn ? p->init.kind : FLOW_INIT_ZEROS) {
	case FLOW_INIT_NORMAL:
		flow_rng_fill_normal(v, n, seed, flow_rng_stream_id(p->name),
				     first, 0.0f, p->init.std);
		break;
	case FLOW_INIT_ONES:
		for (size_t i = 0; i < n; i++)
			v[i] = 1.0f;
		break;
	default: /* zeros, or none */
		memset(v, 0, n * sizeof(*v));
		break;
	}
}

/* Parameter p holds box of a logical tensor of shape logical: fill it run
 * by run (the box's last dimension is contiguous in both). */
static void init_box(const flow_graph_tensor_t *p, float *v,
		     const flow_box_t *box, const flow_shape_t *logical,
		     uint64_t seed)
{
	int nd = logical->ndim;
	size_t run = nd ? (size_t)box->extent[nd - 1] : 1, runs = 1;

	if (nd == 1) { /* rows are elements: the drawn ones, then zeros */
		int64_t end = box->start[0] + box->extent[0];
		int64_t cut = p->init.rows > 0 && p->init.rows < end ?
				      p->init.rows : end;
		size_t drawn = cut > box->start[0] ?
				       (size_t)(cut - box->start[0]) : 0;
		init_run(p, v, drawn, (uint64_t)box->start[0], 0, seed);
		memset(v + drawn, 0, (run - drawn) * sizeof(*v));
		return;
	}
	if (flow_box_numel(box) == 0)
		return;
	for (int d = 0; d + 1 < nd; d++)
		runs *= (size_t)box->extent[d];
	for (size_t r = 0; r < runs; r++, v += run) {
		int64_t pos[FLOW_MAX_DIMS];
		uint64_t first = (uint64_t)flow_box_element(logical, box,
							    (int64_t)(r * run),
							    pos);
		init_run(p, v, run, first, pos[0], seed);
	}
}

/* Fill every parameter, parameter t holding boxes[t] of a logical tensor
 * of shape logical[t] (NULL, NULL: each its whole self).  Drawn in host
 * memory: in place when the storage is the host's, else one tensor at a
 * time in a buffer the size of the largest, copied in. */
static flow_err_t exec_init(flow_exec_t *x, uint64_t seed,
			    const flow_box_t *boxes,
			    const flow_shape_t *logical, flow_diag_t *diag)
{
	const flow_graph_t *g = x->g;
	bool staged = !x->storage->host_addressable;
	float *host = NULL;
	size_t largest = 0;

	for (size_t t = 0; staged && t < g->ntensors; t++)
		if (g->tensors[t].role == FLOW_ROLE_PARAM &&
		    flow_graph_tensor_bytes(g, (int)t) > largest)
			largest = flow_graph_tensor_bytes(g, (int)t);
	if (staged && !(host = flow_alloc(largest)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory for a %zu-byte staging "
				     "buffer of the parameters", largest);
	for (size_t t = 0; t < g->ntensors; t++) {
		const flow_graph_tensor_t *p = &g->tensors[t];
		flow_box_t whole;

		if (p->role != FLOW_ROLE_PARAM)
			continue;
		flow_box_whole(&p->shape, &whole);
		init_box(p, staged ? host : x->ptr[t], boxes ? &boxes[t] : &whole,
			 logical ? &logical[t] : &p->shape, seed);
		if (staged)
			x->storage->copy_in(x->ptr[t], host,
					    flow_graph_tensor_bytes(g, (int)t));
	}
	flow_free(host);
	return exec_finish(x, diag);
}

flow_err_t flow_exec_init_params_boxes(flow_exec_t *x, uint64_t seed,
				       const flow_box_t *boxes,
				       const flow_shape_t *logical,
				       flow_diag_t *diag)
{
	return exec_init(x, seed, boxes, logical, diag);
}

flow_err_t flow_exec_init_params(flow_exec_t *x, uint64_t seed,
				 flow_diag_t *diag)
{
	return exec_init(x, seed, NULL, NULL, diag);
}

void flow_exec_zero_param_grads(flow_exec_t *x)
{
	x->storage->zero(x->param_grads, x->grad_bytes);
}

/* ---- running ---------------------------------------------------------------------- */

/* Op o's kernel, its bf16 twin when its activations are bf16 (o->bf16). */
static flow_err_t exec_kernel(flow_exec_t *x, const exec_op_t *o,
			      const flow_graph_op_t *op)
{
	const flow_kernels_t *k = x->kernels;
	const size_t *d = o->dim;
	void *const *in = o->in, *const *out = o->out;
	const bool bf16 = o->bf16;

	if (o->kind == FLOW_OP_BOXING ||
	    (o->kind == FLOW_OP_CROSS_ENTROPY && o->attrs->split_axes))
		return flow_exec_dist_op(x, o, op);
	switch (o->kind) {
	case FLOW_OP_EMBEDDING: /* all of wte, or a shard of its rows */
		k->embedding_forward(out[0], in[0], in[1], in[2],
				     o->attrs->row_start, d[DIM_ROWS],
				     d[DIM_B], d[DIM_T], d[DIM_C]);
		break;
	case FLOW_OP_EMBEDDING_BACKWARD:
		k->embedding_backward(out[0], out[1], in[0], in[1],
				      o->attrs->row_start, d[DIM_ROWS],
				      d[DIM_B], d[DIM_T], d[DIM_C]);
		break;
	case FLOW_OP_LAYERNORM:
		TWIN(bf16, k->layernorm_bf16_forward, k->layernorm_forward,
			out[0], out[1], out[2], in[0], in[1], in[2], d[DIM_N],
			d[DIM_C]);
		break;
	case FLOW_OP_LAYERNORM_BACKWARD:
		TWIN(bf16, k->layernorm_bf16_backward, k->layernorm_backward,
			out[0], out[1], out[2], in[0], in[1], in[2], in[3],
			in[4], d[DIM_N], d[DIM_C]);
		break;
	case FLOW_OP_MATMUL:
		if (bf16)
			k->matmul_bf16_forward(out[0], x->scratch, in[0], in[1],
					       in[2], d[DIM_N], d[DIM_IN],
					       d[DIM_OUT]);
		else
			k->matmul_forward(out[0], in[0], in[1], in[2], d[DIM_N],
					  d[DIM_IN], d[DIM_OUT]);
		break;
	case FLOW_OP_MATMUL_BACKWARD:
		if (bf16)
			k->matmul_bf16_backward(out[0], out[1], out[2],
						x->scratch, in[0], in[1], in[2],
						d[DIM_N], d[DIM_IN],
						d[DIM_OUT]);
		else
			k->matmul_backward(out[0], out[1], out[2], in[0], in[1],
					   in[2], d[DIM_N], d[DIM_IN],
					   d[DIM_OUT]);
		break;
	case FLOW_OP_ATTENTION:
		TWIN(bf16, k->attention_bf16_forward, k->attention_forward,
			out[0], out[1], x->scratch, in[0], d[DIM_B], d[DIM_T],
			d[DIM_C], d[DIM_NH]);
		break;
	case FLOW_OP_ATTENTION_BACKWARD:
		TWIN(bf16, k->attention_bf16_backward, k->attention_backward,
			out[0], x->scratch, in[0], in[1], in[2], in[3],
			d[DIM_B], d[DIM_T], d[DIM_C], d[DIM_NH]);
		break;
	case FLOW_OP_GELU:
		TWIN(bf16, k->gelu_bf16_forward, k->gelu_forward, out[0], in[0],
			d[DIM_N]);
		break;
	case FLOW_OP_GELU_BACKWARD: /* (dinp, inp, dout): x is in[1] */
		TWIN(bf16, k->gelu_bf16_backward, k->gelu_backward, out[0],
			in[1], in[0], d[DIM_N]);
		break;
	case FLOW_OP_ADD:
		TWIN(bf16, k->residual_bf16_forward, k->residual_forward,
			out[0], in[0], in[1], d[DIM_N]);
		break;
	case FLOW_OP_ADD_BACKWARD:
		TWIN(bf16, k->residual_bf16_backward, k->residual_backward,
			out[0], out[1], in[0], d[DIM_N]);
		break;
	case FLOW_OP_CROSS_ENTROPY: /* losses, and dlogits over the logits */
		TWIN(bf16, k->cross_entropy_bf16_forward_backward,
			k->cross_entropy_forward_backward, out[0], in[0], in[1],
			d[DIM_N], d[DIM_V], d[DIM_VP], x->loss_scale);
		break;
	case FLOW_OP_BOXING: /* handled above */
		break;
	/* Signature-only kinds do not pass flow_graph_validate.  Listed
	 * rather than a default, so that -Wswitch names a new graph kind
	 * this switch forgets. */
	case FLOW_OP_LAYERNORM_PARAM_GRAD:
	case FLOW_OP_RESHAPE:
	case FLOW_OP_TRANSPOSE:
	case FLOW_OP_REDUCE_SUM:
	case FLOW_OP_REDUCE_MEAN:
	case FLOW_OP_BIAS_ADD:
	case FLOW_OP_BROADCAST_ADD:
		break;
	}
	return FLOW_OK;
}

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Ops o and next, which flow_graph_fused_with_next pairs, as one kernel:
 * the two's arithmetic (on the host sets their bits), one pass over the
 * residual stream (or its gradient, or the MLP's activations) fewer.  The
 * memory plan counted the pair as one op, so the kernel may write next's
 * outputs while it still reads o's tensors. */
static void exec_fused(flow_exec_t *x, const exec_op_t *o, const exec_op_t *next)
{
	const flow_kernels_t *k = x->kernels;
	const bool bf16 = o->bf16;

	if (o->kind == FLOW_OP_MATMUL && bf16) /* next: the GELU of its out */
		k->matmul_gelu_bf16_forward(o->out[0], next->out[0],
					    x->scratch, o->in[0], o->in[1],
					    o->in[2], o->dim[DIM_N],
					    o->dim[DIM_IN], o->dim[DIM_OUT]);
	else if (o->kind == FLOW_OP_MATMUL)
		k->matmul_gelu_forward(o->out[0], next->out[0], o->in[0],
				       o->in[1], o->in[2], o->dim[DIM_N],
				       o->dim[DIM_IN], o->dim[DIM_OUT]);
	else if (o->kind == FLOW_OP_ADD) /* next: the layernorm of its output */
		TWIN(bf16, k->residual_layernorm_bf16_forward,
			k->residual_layernorm_forward, next->in[0],
			next->out[0], next->out[1], next->out[2], o->in[0],
			o->in[1], next->in[1], next->in[2], next->dim[DIM_N],
			next->dim[DIM_C]);
	else /* o: layernorm backward; next: the add's, of o's dinp */
		TWIN(bf16, k->layernorm_residual_bf16_backward,
			k->layernorm_residual_backward, o->out[0], next->out[0],
			next->out[1], o->out[1], o->out[2], o->in[0], o->in[1],
			o->in[2], o->in[3], o->in[4], o->dim[DIM_N],
			o->dim[DIM_C]);
}

/* Run ops [begin, end), leaving the last of them in flight on a device
 * whose kernels are enqueued (exec_finish waits).  The first failure (a
 * collective of a localized graph, a device error) stops the pass and
 * every later one: a half-run pass leaves tensors no later pass could
 * trust.  A fused pair runs as one kernel unless end cuts it; in the
 * profile it counts as its two ops, its time under its layernorm's kind
 * or its matmul's. */
static void exec_run(flow_exec_t *x, size_t begin, size_t end)
{
	for (size_t i = begin; i < end && x->err == FLOW_OK; i++) {
		const exec_op_t *o = &x->ops[i];
		size_t last = o->fuse_next && i + 1 < end ? i + 1 : i;
		double t0 = x->profiling ? now_seconds() : 0.0;

		for (size_t k = i; k <= last; k++)
			for (size_t z = x->ops[k].zero_first;
			     z < x->ops[k].zero_first + x->ops[k].nzero; z++)
				x->storage->zero(x->zeros[z].ptr,
						 x->zeros[z].bytes);
		if (last > i)
			exec_fused(x, o, &x->ops[last]);
		else
			x->err = exec_kernel(x, o, &x->g->ops[i]);
		for (size_t k = i; k <= last && x->hook && x->err == FLOW_OK; k++)
			x->hook(x->hook_ctx, (int)k);
		if (x->profiling) {
			for (size_t k = i; k <= last; k++) {
				x->profile[x->ops[k].kind].calls++;
				x->profile[x->ops[k].kind].flops +=
					x->ops[k].flops;
			}
			size_t ln = x->ops[i].kind == FLOW_OP_ADD ? last : i;
			x->profile[x->ops[ln].kind].seconds += now_seconds() - t0;
		}
		i = last;
	}
}

flow_err_t flow_exec_forward(flow_exec_t *x, double *loss_out,
			     flow_diag_t *diag)
{
	const flow_graph_t *g = x->g;
	double sum = 0.0;
	const float *losses = g->loss >= 0 ? x->ptr[g->loss] : NULL;
	flow_err_t err;

	exec_run(x, 0, g->nforward);
	if (losses && !x->storage->host_addressable) {
		x->storage->copy_out(x->losses_host, losses,
				     flow_graph_tensor_bytes(g, g->loss));
		losses = x->losses_host;
	}
	if ((err = exec_finish(x, diag)) != FLOW_OK)
		return err;
	if (losses) {
		size_t n = flow_graph_tensor_numel(g, g->loss);
		for (size_t i = 0; i < n; i++)
			sum += losses[i];
		sum = n ? sum / (double)n : 0.0;
	}
	*loss_out = sum;
	return FLOW_OK;
}

flow_err_t flow_exec_backward(flow_exec_t *x, flow_diag_t *diag)
{
	exec_run(x, x->g->nforward, x->g->nops);
	return exec_finish(x, diag);
}

void flow_exec_set_op_hook(flow_exec_t *x, flow_exec_op_hook_fn *fn,
			   void *ctx)
{
	x->hook = fn;
	x->hook_ctx = ctx;
}

void flow_exec_set_dist(flow_exec_t *x, const flow_boxing_plan_t *plans,
			size_t n, flow_boxing_comms_t *comms)
{
	x->boxings = plans;
	x->nboxings = n;
	x->comms = comms;
}

/* ---- profile --------------------------------------------------------------------- */

void flow_exec_profile_enable(flow_exec_t *x, bool enable)
{
	x->profiling = enable;
}

void flow_exec_profile_add(flow_exec_t *x, const char *phase, double seconds,
			   double flops)
{
	flow_profile_row_t *phases = x->profile + FLOW_OP_KIND_COUNT;
	flow_profile_row_t *row = NULL;

	for (size_t i = 0; i < x->nphases && !row; i++)
		if (strncmp(phases[i].name, phase, sizeof(phases[i].name) - 1) ==
		    0)
			row = &phases[i];
	if (!row && x->nphases < EXEC_PHASES - 1) {
		row = &phases[x->nphases++];
		snprintf(row->name, sizeof(row->name), "%s", phase);
	} else if (!row) {
		row = &phases[EXEC_PHASES - 1];
		snprintf(row->name, sizeof(row->name), "other");
	}
	row->calls++;
	row->seconds += seconds;
	row->flops += flops;
}

size_t flow_exec_profile_rows(const flow_exec_t *x, flow_profile_row_t *rows,
			      size_t cap)
{
	const flow_profile_row_t *sorted[FLOW_OP_KIND_COUNT + EXEC_PHASES];
	size_t n = 0;

	/* Insertion sort, stable: equal times keep kind order, then phases
	 * in the order they were first added. */
	for (size_t i = 0; i < FLOW_OP_KIND_COUNT + EXEC_PHASES; i++) {
		const flow_profile_row_t *r = &x->profile[i];
		size_t j = n;

		if (r->calls == 0)
			continue;
		while (j > 0 && sorted[j - 1]->seconds < r->seconds) {
			sorted[j] = sorted[j - 1];
			j--;
		}
		sorted[j] = r;
		n++;
	}
	for (size_t i = 0; i < n && i < cap; i++)
		rows[i] = *sorted[i];
	return n;
}

double flow_exec_step_flops(const flow_exec_t *x)
{
	return x->step_flops;
}
