/* The executor's distributed part: the ops of a graph of shards
 * (flow/localize.h) that talk to other ranks or know which shard they
 * hold.  Boxing runs its plan through the communicators
 * (lib/runtime/boxing_exec.c); the embedding over a row shard of wte adds
 * only the tokens it holds; the cross-entropy over a column shard of the
 * logits gathers the row maxima and sums the exponentials over its group.
 * The single-graph part, which calls these, is lib/runtime/exec.c. */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <flow/comm.h>
#include <flow/mem.h>

#include "exec_internal.h"

/* Embedding over a shard of wte's rows [r0, r0 + rows): a token outside it
 * adds nothing here (its holder adds it); wpe comes as the localizer laid
 * it out (partial: whole on one rank, zero on the others). */
static void embedding_rows_forward(float *out, const int32_t *tokens,
				   const float *wte, const float *wpe,
				   int64_t r0, size_t rows, size_t B, size_t T,
				   size_t C)
{
#pragma omp parallel for schedule(static)
	for (size_t bt = 0; bt < B * T; bt++) {
		float *o = out + bt * C;
		const float *p = wpe + (bt % T) * C;
		int64_t row = (int64_t)tokens[bt] - r0;
		bool held = row >= 0 && row < (int64_t)rows;
		for (size_t c = 0; c < C; c++)
			o[c] = (held ? wte[(size_t)row * C + c] : 0.0f) + p[c];
	}
}

static void embedding_rows_backward(float *dwte, float *dwpe,
				    const float *dout, const int32_t *tokens,
				    int64_t r0, size_t rows, size_t B,
				    size_t T, size_t C)
{
	for (size_t bt = 0; bt < B * T && dwte; bt++) {
		int64_t row = (int64_t)tokens[bt] - r0;
		if (row < 0 || row >= (int64_t)rows)
			continue;
		for (size_t c = 0; c < C; c++)
			dwte[(size_t)row * C + c] += dout[bt * C + c];
	}
	for (size_t bt = 0; bt < B * T && dwpe; bt++)
		for (size_t c = 0; c < C; c++)
			dwpe[(bt % T) * C + c] += dout[bt * C + c];
}

/* Host memory: these ops run on the host, on a device executor's staged
 * copies too. */
static float *dist_scratch(flow_exec_t *x, size_t n)
{
	if (n > x->dist_scratch_n) {
		float *p = flow_alloc(n * sizeof(float));
		if (!p)
			return NULL;
		flow_free(x->dist_scratch);
		x->dist_scratch = p;
		x->dist_scratch_n = n;
	}
	return x->dist_scratch;
}

/* Cross-entropy with the classes split over comm: this rank holds logits
 * columns [c0, c0 + Vl) of the padded Vp, the real ones those below V.
 * The row maximum is gathered and the exponential sums are summed over
 * the group; the losses come out partial (P), rank 0 adding log-sum-exp
 * and the holder of each target subtracting its logit, so the group's sum
 * is the loss; dlogits, in place, are this rank's columns of the whole
 * row's gradient. */
static flow_err_t ce_split(flow_exec_t *x, const exec_op_t *o,
			   flow_comm_t *comm)
{
	float *losses = o->out[0], *logits = o->in[0];
	const int32_t *targets = o->in[1];
	size_t N = o->dim[DIM_N], Vl = o->dim[DIM_VP];
	int64_t c0 = o->attrs->row_start, V = (int64_t)o->dim[DIM_V];
	size_t valid = V <= c0 ? 0 : (size_t)(V - c0) < Vl ? (size_t)(V - c0) : Vl;
	int p = flow_comm_size(comm), me = flow_comm_rank(comm);
	float *s = dist_scratch(x, N * ((size_t)p + 2));
	if (!s)
		return flow_diag_set(&x->diag, FLOW_ERR_NOMEM,
				     "out of memory for the split cross-entropy's "
				     "%zu row statistics", N * ((size_t)p + 2));
	float *mine = s + N * (size_t)p, *sums = mine + N, *all = s;
	size_t *counts = calloc((size_t)p, sizeof *counts);
	if (!counts)
		return flow_diag_set(&x->diag, FLOW_ERR_NOMEM, "out of memory");
	for (int r = 0; r < p; r++)
		counts[r] = N;
	for (size_t n = 0; n < N; n++) {
		float m = -INFINITY;
		for (size_t j = 0; j < valid; j++)
			m = fmaxf(m, logits[n * Vl + j]);
		mine[n] = m;
	}
	flow_err_t err = flow_all_gather(comm, mine, all, counts,
					 FLOW_DTYPE_F32, &x->diag);
	free(counts);
	if (err != FLOW_OK)
		return err;
	for (size_t n = 0; n < N; n++) {
		float m = all[n];
		for (int r = 1; r < p; r++)
			m = fmaxf(m, all[(size_t)r * N + n]);
		mine[n] = m; /* the row's maximum from here on */
		double sum = 0.0;
		for (size_t j = 0; j < valid; j++)
			sum += exp((double)logits[n * Vl + j] - m);
		sums[n] = (float)sum;
	}
	if ((err = flow_all_reduce(comm, sums, sums, N, FLOW_DTYPE_F32,
				   &x->diag)) != FLOW_OK)
		return err;
	for (size_t n = 0; n < N; n++) {
		float *row = logits + n * Vl;
		int64_t t = targets[n] - c0;
		bool held = targets[n] >= 0 && t >= 0 && t < (int64_t)valid;
		double loss = me == 0 && targets[n] >= 0 ?
				      log((double)sums[n]) + mine[n] : 0.0;
		if (held)
			loss -= row[t];
		losses[n] = (float)loss;
		for (size_t j = 0; j < Vl; j++) {
			float pj = j < valid && targets[n] >= 0 ?
					   (float)(exp((double)row[j] - mine[n]) /
						   sums[n]) :
					   0.0f;
			if (held && (int64_t)j == t)
				pj -= 1.0f;
			row[j] = x->loss_scale * pj;
		}
	}
	return FLOW_OK;
}

/* Op o (graph op op) of a device executor, on host copies of every tensor
 * it touches: copied out, run as on the host, and the outputs copied back.
 * Slots naming the same memory share one copy, so an input the op writes
 * in place (the cross-entropy's logits, which its dlogits output aliases)
 * goes back with that output.  What a CPU communicator needs (flow-train
 * --comm cpu on a GPU), at the price of the copies. */
static flow_err_t dist_staged(flow_exec_t *x, const exec_op_t *o,
			      const flow_graph_op_t *op)
{
	enum { SLOTS = 2 * FLOW_OP_MAX_IO };
	exec_op_t h = *o;
	const void *dev[SLOTS];
	void *host[SLOTS];
	size_t bytes[SLOTS];
	bool written[SLOTS] = { false };
	int n = 0;
	flow_err_t err = FLOW_OK;

	for (int k = 0; k < op->nin + op->nout; k++) {
		bool is_in = k < op->nin;
		int t = is_in ? op->in[k] : op->out[k - op->nin];
		void **slot = is_in ? &h.in[k] : &h.out[k - op->nin];
		if (t < 0 || !*slot)
			continue;
		int same = -1;
		for (int j = 0; j < n; j++)
			if (dev[j] == *slot)
				same = j;
		if (same >= 0) {
			*slot = host[same];
			written[same] |= !is_in;
			continue;
		}
		bytes[n] = flow_graph_tensor_bytes(x->g, t);
		written[n] = !is_in;
		dev[n] = *slot;
		if (!(host[n] = flow_alloc(bytes[n]))) {
			err = flow_diag_set(&x->diag, FLOW_ERR_NOMEM,
					    "out of memory for the %zu-byte host "
					    "copy of '%s'",
					    bytes[n], x->g->tensors[t].name);
			break;
		}
		x->storage->copy_out(host[n], dev[n], bytes[n]);
		*slot = host[n++];
	}
	if (err == FLOW_OK && x->kernels->last)
		err = x->kernels->last(&x->diag);
	if (err == FLOW_OK)
		err = flow_exec_dist_kernel(x, &h);
	for (int j = 0; j < n && err == FLOW_OK; j++)
		if (written[j])
			x->storage->copy_in((void *)dev[j], host[j], bytes[j]);
	if (err == FLOW_OK && x->kernels->last)
		err = x->kernels->last(&x->diag);
	for (int j = 0; j < n; j++)
		flow_free(host[j]);
	return err;
}

flow_err_t flow_exec_dist_op(flow_exec_t *x, const exec_op_t *o,
			     const flow_graph_op_t *op)
{
	return x->storage->host_addressable ? flow_exec_dist_kernel(x, o)
					    : dist_staged(x, o, op);
}

flow_err_t flow_exec_dist_kernel(flow_exec_t *x, const exec_op_t *o)
{
	const size_t *d = o->dim;
	void *const *in = o->in, *const *out = o->out;
	flow_comm_t *comm = NULL;
	flow_err_t err = FLOW_OK;

	switch (o->kind) {
	case FLOW_OP_BOXING:
		if (!x->comms || o->attrs->boxing >= x->nboxings) {
			err = flow_diag_set(&x->diag, FLOW_ERR_USAGE,
					    "boxing op without its plan");
			break;
		}
		err = flow_boxing_run(&x->boxings[o->attrs->boxing], x->comms,
				      in[0], out[0], &x->diag);
		break;
	case FLOW_OP_EMBEDDING:
		embedding_rows_forward(out[0], in[0], in[1], in[2],
				       o->attrs->row_start, d[DIM_ROWS],
				       d[DIM_B], d[DIM_T], d[DIM_C]);
		break;
	case FLOW_OP_EMBEDDING_BACKWARD:
		embedding_rows_backward(out[0], out[1], in[0], in[1],
					o->attrs->row_start, d[DIM_ROWS],
					d[DIM_B], d[DIM_T], d[DIM_C]);
		break;
	case FLOW_OP_CROSS_ENTROPY:
		if (!x->comms) {
			err = flow_diag_set(&x->diag, FLOW_ERR_USAGE,
					    "split cross-entropy without "
					    "communicators");
			break;
		}
		err = flow_boxing_comms_axes(x->comms, o->attrs->split_axes,
					     &comm, &x->diag);
		if (err == FLOW_OK)
			err = ce_split(x, o, comm);
		break;
	default:
		err = flow_diag_set(&x->diag, FLOW_ERR_USAGE,
				    "op kind %d cannot be split",
				    (int)o->kind);
		break;
	}
	return err;
}

