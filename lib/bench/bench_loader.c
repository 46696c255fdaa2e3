/* flow-bench loader: the checked loader against the unchecked one, passes
 * alternating so that both see the same machine (flow/bench_loader.h). */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <flow/bench_loader.h>
#include <flow/checksum.h>
#include <flow/mem.h>

#include "bench_internal.h"

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Read n batches, folding every token into sum (both variants pay for
 * that alike). */
static flow_err_t read_batches(flow_loader_t *loader, uint64_t n, int32_t *in,
			       int32_t *tg, size_t elems,
			       flow_checksum_state_t *sum, flow_diag_t *diag)
{
	for (uint64_t b = 0; b < n; b++) {
		int rc = flow_loader_next(loader, in, tg, diag);
		if (rc < 0)
			return (flow_err_t)rc;
		flow_checksum_update(sum, in, elems * sizeof(int32_t));
		flow_checksum_update(sum, tg, elems * sizeof(int32_t));
	}
	return FLOW_OK;
}

/* One pass: open and read cfg->batches batches (seconds[0]), read as many
 * again (seconds[1]), free.  Sets *digest. */
static flow_err_t one_pass(const flow_bench_loader_config_t *cfg,
			   bool unchecked, int32_t *in, int32_t *tg,
			   size_t elems, double seconds[2], uint64_t *digest,
			   flow_diag_t *diag)
{
	flow_loader_options_t o;
	memset(&o, 0, sizeof(o));
	o.dir = cfg->dir;
	o.split = cfg->split;
	o.seq_len = cfg->seq_len;
	o.global_batch = cfg->batch;
	o.seed = 1;
	o.dp_size = 1;
	o.unchecked = unchecked;
	flow_checksum_state_t *sum = flow_checksum_state_new();
	if (!sum)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: out of memory for a checksum state",
				     cfg->dir);
	flow_loader_t *loader = NULL;
	double t0 = bench_now_us();
	flow_err_t err = flow_loader_open(&o, &loader, diag);
	if (err == FLOW_OK)
		err = read_batches(loader, cfg->batches, in, tg, elems, sum,
				   diag);
	double t1 = bench_now_us();
	if (err == FLOW_OK)
		err = read_batches(loader, cfg->batches, in, tg, elems, sum,
				   diag);
	double t2 = bench_now_us();
	flow_loader_free(loader);
	seconds[0] = (t1 - t0) * 1e-6;
	seconds[1] = (t2 - t1) * 1e-6;
	*digest = flow_checksum_digest(sum);
	flow_checksum_state_free(sum);
	return err;
}

flow_err_t flow_bench_loader_run(const flow_bench_loader_config_t *cfg,
				 flow_bench_loader_result_t out[2],
				 flow_diag_t *diag)
{
	size_t elems, bytes;
	if (cfg->batch > SIZE_MAX || cfg->iters < 1 ||
	    !flow_mul_size((size_t)cfg->batch, cfg->seq_len, &elems) ||
	    !flow_mul_size(elems, sizeof(int32_t), &bytes))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: a batch of %llu x %u tokens is too large",
				     cfg->dir, (unsigned long long)cfg->batch,
				     cfg->seq_len);
	flow_err_t err = FLOW_OK;
	int32_t *in = malloc(bytes ? bytes : 1), *tg = malloc(bytes ? bytes : 1);
	/* [variant][half][iteration] */
	double *times = calloc(4 * (size_t)cfg->iters, sizeof(double));
	if (!in || !tg || !times) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM,
				    "%s: out of memory for a batch of %llu x %u tokens",
				    cfg->dir, (unsigned long long)cfg->batch,
				    cfg->seq_len);
		goto out_free;
	}
	static const char *const names[2] = { "checked", "unchecked" };
	uint64_t digest[2] = { 0, 0 };
	for (unsigned it = 0; err == FLOW_OK && it <= cfg->iters; it++)
		for (int v = 0; err == FLOW_OK && v < 2; v++) {
			double s[2] = { 0, 0 };
			err = one_pass(cfg, v == 1, in, tg, elems, s,
				       &digest[v], diag);
			if (it == 0) /* the warm-up */
				continue;
			for (int h = 0; h < 2; h++)
				times[((size_t)v * 2 + h) * cfg->iters + it - 1] = s[h];
		}
	if (err != FLOW_OK)
		goto out_free;
	if (digest[0] != digest[1]) {
		err = flow_diag_set(diag, FLOW_ERR_VERIFY,
				    "%s: the checked and unchecked loaders handed out different tokens",
				    cfg->dir);
		goto out_free;
	}
	for (int v = 0; v < 2; v++) {
		double best[2];
		for (int h = 0; h < 2; h++) {
			double *t = times + ((size_t)v * 2 + h) * cfg->iters;
			qsort(t, cfg->iters, sizeof(double), compare_doubles);
			best[h] = t[0];
		}
		out[v].variant = names[v];
		out[v].tokens = (uint64_t)elems * cfg->batches;
		out[v].first_s = best[0];
		out[v].steady_s = best[1];
		out[v].first_tokens_per_s =
			best[0] > 0 ? (double)out[v].tokens / best[0] : 0;
		out[v].steady_tokens_per_s =
			best[1] > 0 ? (double)out[v].tokens / best[1] : 0;
		out[v].digest = digest[v];
	}
out_free:
	free(times);
	free(tg);
	free(in);
	return err;
}
