/* Benchmark of the data loader (the library half of `flow-bench loader`):
 * what checking every token costs.  A pass opens a loader on a dataset and
 * reads `batches` batches of batch x seq_len tokens twice over on the
 * caller's thread (no prefetch, so the reading is timed rather than
 * hidden):
 *
 *   first    the open and the first `batches` batches: with checks, this
 *            is where each shard the batches touch has its checksum
 *            verified, once
 *   steady   the next `batches` batches, every shard they touch already
 *            verified or not: what a long run pays per token
 *
 * for two variants, run alternately, iters times each after one untimed
 * warm-up pass each (which also brings the files into the page cache):
 *
 *   checked    the loader as flow-train uses it: each shard's checksum
 *              verified before its first token is used, every token
 *              checked against the vocabulary
 *   unchecked  the loader told not to check (the `unchecked` option), as
 *              it read before it checked anything
 *
 * Both variants must hand out the same tokens (compared by checksum): the
 * benchmark is also a check. */
#ifndef FLOW_BENCH_LOADER_H
#define FLOW_BENCH_LOADER_H

#include <flow/error.h>
#include <flow/loader.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flow_bench_loader_config {
	const char *dir;
	flow_split_t split;
	uint32_t seq_len;
	uint64_t batch;    /* global batch, one rank */
	uint64_t batches;  /* per half pass */
	unsigned iters;    /* timed passes per variant */
} flow_bench_loader_config_t;

typedef struct flow_bench_loader_result {
	const char *variant;     /* "checked", "unchecked"; static */
	uint64_t tokens;         /* input tokens per half pass */
	double first_s;          /* fastest first half (open included) */
	double steady_s;         /* fastest second half */
	double first_tokens_per_s;
	double steady_tokens_per_s;
	uint64_t digest;         /* XXH3-64 of every input and target token */
} flow_bench_loader_result_t;

/* Run both variants: out[0] checked, out[1] unchecked.  FLOW_ERR_VERIFY
 * when they handed out different tokens; the loader's errors otherwise. */
FLOW_EXPORT flow_err_t flow_bench_loader_run(
	const flow_bench_loader_config_t *cfg,
	flow_bench_loader_result_t out[2], flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
