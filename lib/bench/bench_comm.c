/* Collective benchmarks for `flow-bench comm`: nccl-tests' sizes, times
 * and bus bandwidths, with every result checked bit for bit. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <flow/bench_comm.h>
#include <flow/device.h>
#include <flow/mem.h>

#include "comm/comm_internal.h"

static const char *const coll_names[FLOW_BENCH_NCOLLS] = {
	"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
};

const char *flow_bench_coll_name(flow_bench_coll_t op)
{
	return (unsigned)op < FLOW_BENCH_NCOLLS ? coll_names[op] : NULL;
}

flow_err_t flow_bench_coll_lookup(const char *name, flow_bench_coll_t *op_out,
				  flow_diag_t *diag)
{
	for (int i = 0; i < FLOW_BENCH_NCOLLS; i++)
		if (strcmp(name, coll_names[i]) == 0) {
			*op_out = (flow_bench_coll_t)i;
			return FLOW_OK;
		}
	return flow_diag_set(diag, FLOW_ERR_USAGE,
			     "unknown collective '%s' (all_reduce, reduce_scatter, all_gather, all_to_all, broadcast)",
			     name);
}

double flow_bench_coll_busbw_factor(flow_bench_coll_t op, int n)
{
	if (n <= 1)
		return op == FLOW_BENCH_BROADCAST ? 1.0 : 0.0;
	switch (op) {
	case FLOW_BENCH_ALL_REDUCE: return 2.0 * (n - 1) / n;
	case FLOW_BENCH_BROADCAST: return 1.0;
	default: return (double)(n - 1) / n;
	}
}

/* ---- exact values --------------------------------------------------------- */

/* Rank r's input element i of an n-rank job: 1 .. m with m * n <= 256
 * (m at most 11), so every sum is exact in bf16 (integers to 256) and u8
 * wraps the same way on every side. */
static int64_t value_of(int n, int r, size_t i)
{
	size_t m = n >= 256 ? 1 : 256 / (size_t)n < 11 ? 256 / (size_t)n : 11;
	return (int64_t)((i * 7 + (size_t)r * 3) % m) + 1;
}

static bool same(const void *buf, size_t i, flow_dtype_t dtype, int64_t v)
{
	size_t elem = flow_dtype_size(dtype);
	unsigned char want[8];
	flow_dtype_store(want, 0, dtype, (double)v);
	return memcmp((const unsigned char *)buf + i * elem, want, elem) == 0;
}

/* ---- buffers: host memory, or device memory for NCCL ------------------ */

typedef struct buffers {
	void *send, *recv;          /* what the collective is given */
	void *host_send, *host_recv; /* staging for NCCL, or == send/recv */
	size_t send_bytes, recv_bytes;
	bool device;
} buffers_t;

static void buffers_free(buffers_t *b)
{
	if (b->device) {
		flow_cuda_release(b->send);
		flow_cuda_release(b->recv);
	}
	flow_free(b->host_send);
	flow_free(b->host_recv);
}

static flow_err_t buffers_alloc(flow_comm_t *c, buffers_t *b,
				flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	b->host_send = flow_alloc(b->send_bytes);
	b->host_recv = flow_alloc(b->recv_bytes);
	if (!b->host_send || !b->host_recv)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory for %zu + %zu bytes",
				     b->send_bytes, b->recv_bytes);
	memset(b->host_recv, 0, b->recv_bytes);
	b->send = b->host_send;
	b->recv = b->host_recv;
	b->device = c->backend == FLOW_COMM_NCCL;
	if (b->device) {
		b->send = b->recv = NULL;
		err = flow_cuda_alloc(&b->send, b->send_bytes ? b->send_bytes : 1,
				      diag);
		if (err == FLOW_OK)
			err = flow_cuda_alloc(&b->recv,
					      b->recv_bytes ? b->recv_bytes : 1,
					      diag);
	}
	return err;
}

/* Host -> what the collective reads (to_device) or back. */
static flow_err_t buffers_sync(buffers_t *b, bool to_device, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	if (!b->device)
		return FLOW_OK;
	if (to_device) {
		err = flow_cuda_upload(b->send, b->host_send, b->send_bytes, diag);
		if (err == FLOW_OK)
			err = flow_cuda_upload(b->recv, b->host_recv,
					       b->recv_bytes, diag);
	} else {
		err = flow_cuda_download(b->host_recv, b->recv, b->recv_bytes,
					 diag);
	}
	return err;
}

/* ---- one size ------------------------------------------------------------ */

typedef struct plan {
	flow_bench_coll_t op;
	flow_dtype_t dtype;
	int n, me;
	size_t per;      /* elements per rank block */
	size_t *counts;  /* [n], all per */
} plan_t;

static flow_err_t call(flow_comm_t *c, const plan_t *p, buffers_t *b,
		       flow_diag_t *diag)
{
	switch (p->op) {
	case FLOW_BENCH_ALL_REDUCE:
		return flow_all_reduce(c, b->send, b->recv, p->per, p->dtype,
				       diag);
	case FLOW_BENCH_REDUCE_SCATTER:
		return flow_reduce_scatter(c, b->send, b->recv, p->counts,
					   p->dtype, diag);
	case FLOW_BENCH_ALL_GATHER:
		return flow_all_gather(c, b->send, b->recv, p->counts, p->dtype,
				       diag);
	case FLOW_BENCH_ALL_TO_ALL:
		return flow_all_to_all(c, b->send, p->counts, b->recv,
				       p->counts, p->dtype, diag);
	default:
		return flow_broadcast(c, b->recv, p->per, p->dtype, 0, diag);
	}
}

/* Inputs, and the number of wrong elements of the output. */
static void fill(const plan_t *p, buffers_t *b)
{
	size_t nsend = b->send_bytes / flow_dtype_size(p->dtype);
	for (size_t i = 0; i < nsend; i++)
		flow_dtype_store(b->host_send, i, p->dtype,
				 (double)value_of(p->n, p->me, i));
	if (p->op == FLOW_BENCH_BROADCAST)
		for (size_t i = 0; i < p->per; i++)
			flow_dtype_store(b->host_recv, i, p->dtype,
					 p->me == 0 ? (double)value_of(p->n, 0, i) :
						      0.0);
}

static int64_t expected(const plan_t *p, size_t i)
{
	int64_t sum = 0;
	switch (p->op) {
	case FLOW_BENCH_ALL_REDUCE:
		for (int r = 0; r < p->n; r++)
			sum += value_of(p->n, r, i);
		return sum;
	case FLOW_BENCH_REDUCE_SCATTER:
		for (int r = 0; r < p->n; r++)
			sum += value_of(p->n, r, (size_t)p->me * p->per + i);
		return sum;
	case FLOW_BENCH_ALL_GATHER:
		return value_of(p->n, (int)(i / p->per), i % p->per);
	case FLOW_BENCH_ALL_TO_ALL:
		return value_of(p->n, (int)(i / p->per),
				(size_t)p->me * p->per + i % p->per);
	default:
		return value_of(p->n, 0, i);
	}
}

static int64_t count_wrong(const plan_t *p, const buffers_t *b)
{
	size_t nrecv = b->recv_bytes / flow_dtype_size(p->dtype);
	int64_t wrong = 0;
	for (size_t i = 0; i < nrecv; i++)
		wrong += !same(b->host_recv, i, p->dtype, expected(p, i));
	return wrong;
}

/* The slowest rank's time and the total of wrong elements, through the
 * CPU communicator (an NCCL one's twin). */
static flow_err_t combine(flow_comm_t *c, double *time_s, int64_t *wrong,
			  flow_diag_t *diag)
{
	flow_comm_t *h = c->host ? c->host : c;
	int n = flow_comm_size(h);
	double *times = calloc((size_t)n, sizeof *times);
	size_t *counts = calloc((size_t)n, sizeof *counts);
	flow_err_t err = FLOW_ERR_NOMEM;
	if (!times || !counts) {
		flow_diag_set(diag, err, "out of memory");
		goto out;
	}
	for (int r = 0; r < n; r++)
		counts[r] = sizeof(double);
	err = flow_all_gather(h, time_s, times, counts, FLOW_DTYPE_U8, diag);
	if (!err)
		err = flow_all_reduce(h, wrong, wrong, 1, FLOW_DTYPE_I64, diag);
	for (int r = 0; !err && r < n; r++)
		if (times[r] > *time_s)
			*time_s = times[r];
out:
	free(times);
	free(counts);
	return err;
}

flow_err_t flow_bench_comm_run(flow_comm_t *c, flow_bench_coll_t op,
			       flow_dtype_t dtype, size_t bytes, unsigned iters,
			       unsigned warmup, flow_bench_comm_result_t *out,
			       flow_diag_t *diag)
{
	size_t elem = flow_dtype_size(dtype);
	int n = flow_comm_size(c);
	bool blocks = op != FLOW_BENCH_ALL_REDUCE && op != FLOW_BENCH_BROADCAST;
	plan_t p = { .op = op, .dtype = dtype, .n = n, .me = flow_comm_rank(c) };
	buffers_t b = { 0 };
	flow_err_t err = FLOW_OK;
	memset(out, 0, sizeof *out);
	if (elem == 0 || iters == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "bad dtype or zero iterations");
	p.per = blocks ? bytes / elem / (size_t)n : bytes / elem;
	p.counts = calloc((size_t)n, sizeof *p.counts);
	if (!p.counts)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	for (int r = 0; r < n; r++)
		p.counts[r] = p.per;
	size_t whole = blocks ? p.per * (size_t)n : p.per;
	b.send_bytes = (op == FLOW_BENCH_ALL_GATHER ? p.per : whole) * elem;
	b.recv_bytes = (op == FLOW_BENCH_REDUCE_SCATTER ? p.per : whole) * elem;
	if (op == FLOW_BENCH_BROADCAST)
		b.send_bytes = 0;
	err = buffers_alloc(c, &b, diag);
	if (err)
		goto out;
	fill(&p, &b);
	err = buffers_sync(&b, true, diag);
	for (unsigned i = 0; !err && i < warmup; i++)
		err = call(c, &p, &b, diag);
	if (!err)
		err = flow_barrier(c, diag);
	double t0 = flow_comm_now(), time_s = 0;
	for (unsigned i = 0; !err && i < iters; i++)
		err = call(c, &p, &b, diag);
	time_s = (flow_comm_now() - t0) / iters;
	/* The checked call starts from fresh inputs (broadcast's buffer was
	 * overwritten in place). */
	if (!err) {
		fill(&p, &b);
		err = buffers_sync(&b, true, diag);
	}
	if (!err)
		err = call(c, &p, &b, diag);
	if (!err)
		err = buffers_sync(&b, false, diag);
	int64_t wrong = err ? 0 : count_wrong(&p, &b);
	if (!err)
		err = combine(c, &time_s, &wrong, diag);
	if (err)
		goto out;
	out->count = whole;
	out->bytes = whole * elem;
	out->time_us = time_s * 1e6;
	out->algbw_GBps = time_s > 0 ? (double)out->bytes / time_s / 1e9 : 0;
	out->busbw_GBps =
		out->algbw_GBps * flow_bench_coll_busbw_factor(op, n);
	out->wrong = (uint64_t)wrong;
out:
	buffers_free(&b);
	free(p.counts);
	return err;
}
