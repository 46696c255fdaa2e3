/* The executor's distributed part: the ops of a graph of shards
 * (flow/localize.h) that talk to other ranks.  Boxing runs its plan
 * through the communicators (lib/runtime/boxing_exec.c); the
 * cross-entropy over a column shard of the logits gathers the row maxima
 * and sums the exponentials over its group, between the kernel set's
 * three split kernels.  Both run in place when the communicators move the
 * executor's memory (host memory over the CPU backend, a GPU's over
 * NCCL), and on host copies of the op's tensors otherwise (--comm cpu on
 * a GPU).  The embedding over a row shard of wte is an ordinary kernel
 * (flow/kernels.h).  The single-graph part, which calls these, is
 * lib/runtime/exec.c. */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <flow/comm.h>
#include <flow/mem.h>

#include "exec_internal.h"

/* n floats of the split cross-entropy's row statistics, in the memory
 * the communicators move (the comms' storage): grown, never shrunk. */
static float *dist_scratch(flow_exec_t *x, size_t n)
{
	const flow_exec_storage_t *st = flow_boxing_comms_storage(x->comms);
	if (n > x->dist_scratch_n || st != x->dist_storage) {
		float *p = st->alloc(n * sizeof(float));
		if (!p)
			return NULL;
		if (x->dist_scratch)
			x->dist_storage->free(x->dist_scratch);
		x->dist_scratch = p;
		x->dist_scratch_n = n;
		x->dist_storage = st;
	}
	return x->dist_scratch;
}

/* Cross-entropy with the classes split over comm: this rank holds logits
 * columns [c0, c0 + Vl) of the padded Vp, the real ones those below V.
 * The row maxima are gathered and the exponential sums summed over the
 * group between the three split kernels (flow/kernels.h) of the memory
 * the communicators move, with the statistics in that memory too; the
 * losses come out partial (P), the group's sum the loss, and dlogits, in
 * place, are this rank's columns of the whole row's gradient. */
static flow_err_t ce_split(flow_exec_t *x, const exec_op_t *o,
			   flow_comm_t *comm)
{
	const flow_kernels_t *k = flow_boxing_comms_kernels(x->comms);
	float *losses = o->out[0];
	void *logits = o->in[0]; /* of the op's activation dtype */
	const int32_t *targets = o->in[1];
	size_t N = o->dim[DIM_N], Vl = o->dim[DIM_VP];
	int64_t c0 = o->attrs->row_start, V = (int64_t)o->dim[DIM_V];
	int p = flow_comm_size(comm);
	flow_logits_shard_t s = {
		.n = N,
		.cols = Vl,
		.valid = V <= c0 ? 0 : (size_t)(V - c0) < Vl ? (size_t)(V - c0) : Vl,
		.c0 = c0,
		.first = flow_comm_rank(comm) == 0,
	};
	size_t nstats = N * ((size_t)p + 2);
	float *stats = dist_scratch(x, nstats);
	if (!stats)
		return flow_diag_set(&x->diag, FLOW_ERR_NOMEM,
				     "out of memory for the split cross-entropy's "
				     "%zu row statistics", nstats);
	float *gathered = stats, *max = stats + N * (size_t)p, *sums = max + N;
	size_t *counts = calloc((size_t)p, sizeof *counts);
	if (!counts)
		return flow_diag_set(&x->diag, FLOW_ERR_NOMEM, "out of memory");
	for (int r = 0; r < p; r++)
		counts[r] = N;
	TWIN(o->bf16, k->cross_entropy_bf16_split_max,
	     k->cross_entropy_split_max, max, logits, &s);
	/* Each collective runs on a stream of its own: the kernels that
	 * wrote what it reads are waited for. */
	flow_err_t err = flow_kernels_wait(k, &x->diag);
	if (err == FLOW_OK)
		err = flow_all_gather(comm, max, gathered, counts,
				      FLOW_DTYPE_F32, &x->diag);
	free(counts);
	if (err != FLOW_OK)
		return err;
	TWIN(o->bf16, k->cross_entropy_bf16_split_sums,
	     k->cross_entropy_split_sums, sums, max, gathered, (size_t)p,
	     logits, &s);
	if ((err = flow_kernels_wait(k, &x->diag)) != FLOW_OK ||
	    (err = flow_all_reduce(comm, sums, sums, N, FLOW_DTYPE_F32,
				   &x->diag)) != FLOW_OK)
		return err;
	TWIN(o->bf16, k->cross_entropy_bf16_split_finish,
	     k->cross_entropy_split_finish, losses, logits, targets, max, sums,
	     &s, x->loss_scale);
	return FLOW_OK;
}

/* The split cross-entropy of op o, over its group's communicator. */
static flow_err_t dist_cross_entropy(flow_exec_t *x, const exec_op_t *o)
{
	flow_comm_t *comm = NULL;
	if (!x->comms)
		return flow_diag_set(&x->diag, FLOW_ERR_USAGE,
				     "split cross-entropy without communicators");
	flow_err_t err = flow_boxing_comms_axes(x->comms, o->attrs->split_axes,
						&comm, &x->diag);
	return err != FLOW_OK ? err : ce_split(x, o, comm);
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
	if (err == FLOW_OK)
		err = flow_kernels_wait(x->kernels, &x->diag);
	if (err == FLOW_OK)
		err = flow_exec_dist_kernel(x, &h);
	for (int j = 0; j < n && err == FLOW_OK; j++)
		if (written[j])
			x->storage->copy_in((void *)dev[j], host[j], bytes[j]);
	if (err == FLOW_OK)
		err = flow_kernels_wait(x->kernels, &x->diag);
	for (int j = 0; j < n; j++)
		flow_free(host[j]);
	return err;
}

/* Whether the communicators move the executor's own memory: then the ops
 * run on it in place, else (--comm cpu on a GPU: host communicators) on
 * host copies. */
static bool dist_in_place(const flow_exec_t *x)
{
	return !x->comms || flow_boxing_comms_storage(x->comms) == x->storage;
}

flow_err_t flow_exec_dist_op(flow_exec_t *x, const exec_op_t *o,
			     const flow_graph_op_t *op)
{
	return dist_in_place(x) ? flow_exec_dist_kernel(x, o) :
				  dist_staged(x, o, op);
}

flow_err_t flow_exec_dist_kernel(flow_exec_t *x, const exec_op_t *o)
{
	flow_err_t err = FLOW_OK;

	switch (o->kind) {
	case FLOW_OP_BOXING:
		if (!x->comms || o->attrs->boxing >= x->nboxings) {
			err = flow_diag_set(&x->diag, FLOW_ERR_USAGE,
					    "boxing op without its plan");
			break;
		}
		err = flow_boxing_run(&x->boxings[o->attrs->boxing], x->comms,
				      o->in[0], o->out[0], &x->diag);
		break;
	case FLOW_OP_CROSS_ENTROPY:
		err = dist_cross_entropy(x, o);
		break;
	default:
		err = flow_diag_set(&x->diag, FLOW_ERR_USAGE,
				    "op kind %d cannot be split",
				    (int)o->kind);
		break;
	}
	return err;
}
