/* The data loader: deterministic, resumable batches of token windows.
 *
 * A sample is a window of seq_len + 1 tokens inside one shard: sample k of a
 * shard with n tokens starts at token k * seq_len, for k < (n - 1) / seq_len
 * (windows overlap by the one token that is both the last target and the
 * next input).  The N samples of a split are numbered shard by shard in
 * manifest order.
 *
 * Order: the sample stream is epoch 0's order, then epoch 1's, ...; epoch
 * e's order is a pseudo-random permutation of [0, N) keyed by (manifest
 * checksum, seed, e) -- a Feistel network on Philox, walked until it lands
 * in range -- so it is shuffled across and within shards, needs no memory,
 * and any position can be computed directly, on any machine.  The exact
 * construction (key derivation, rounds, cycle walking) is written down in
 * lib/data/loader_internal.h; it is part of the contract: a change would
 * reorder every run's data.
 *
 * Batches: global batch s is stream positions [s*G, (s+1)*G) for global
 * batch size G, whatever the number of data-parallel ranks; DP rank r of W
 * (W divides G) reads the contiguous slice [s*G + r*G/W, s*G + (r+1)*G/W).
 * The resume state is just the next stream position, so a run resumed with
 * another W that divides G continues the very same stream. */
#ifndef FLOW_LOADER_H
#define FLOW_LOADER_H

#include <stdio.h>

#include <flow/error.h>
#include <flow/shard.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flow_loader_options {
	const char *dir;        /* dataset directory (flow-shard output) */
	flow_split_t split;
	uint32_t seq_len;       /* T: tokens per sample input */
	uint64_t global_batch;  /* G: samples per step over all DP ranks */
	uint64_t seed;
	uint32_t dp_rank;       /* r < dp_size */
	uint32_t dp_size;       /* W, dividing global_batch */
	bool prefetch;          /* read the next batch on a background thread */
	/* Hand out tokens unchecked, as the loader did before it checked
	 * them: no checksums, no vocabulary (flow_shard_skip_checks).  Only
	 * to measure what the checks cost (flow-bench loader).  By default
	 * each shard's checksum is verified once, before the first of its
	 * tokens is used, and every token is checked. */
	bool unchecked;
} flow_loader_options_t;

/* Where the stream continues: epoch and index within that epoch's order
 * (position = epoch * N + index).  Portable: two integers. */
typedef struct flow_loader_state {
	uint64_t epoch;
	uint64_t index;
} flow_loader_state_t;

/* What fills one slot of one global batch. */
typedef struct flow_sample_ref {
	uint64_t position; /* in the stream */
	uint64_t epoch;
	uint64_t sample;   /* in [0, N) */
	size_t shard;      /* index in the manifest's shard list */
	uint64_t offset;   /* first token of the window in that shard */
} flow_sample_ref_t;

typedef struct flow_loader flow_loader_t;

/* Read the manifest, map the split's shards that hold a sample (no payload
 * is read yet) and check the options: W divides G, r < W, seq_len >= 1,
 * G >= 1, at least one sample.  The loader starts at step 0; with
 * options->prefetch it starts its thread (which reads nothing before the
 * first flow_loader_next).  options->dir is copied.
 *
 * Returns FLOW_OK and sets *loader_out (free with flow_loader_free()), or:
 * FLOW_ERR_USAGE for bad options or a split with no window of seq_len + 1
 * tokens ("data/: split 'val' has no sample of 1025 tokens"); the errors
 * of flow_manifest_read and flow_shard_open; those of flow_shard_check
 * when a shard's size, token count, vocabulary or trailer checksum is not
 * the manifest's; FLOW_ERR_RANGE for a
 * vocabulary beyond int32 ids; FLOW_ERR_NOMEM.  Every message names the
 * dataset directory or the file. */
FLOW_EXPORT flow_err_t flow_loader_open(const flow_loader_options_t *options,
					flow_loader_t **loader_out,
					flow_diag_t *diag) FLOW_MUST_CHECK;
/* Stop and join the prefetch thread (after the read it may be doing),
 * unmap the shards, free.  NULL is ignored. */
FLOW_EXPORT void flow_loader_free(flow_loader_t *loader);

/* N, the samples of one epoch. */
FLOW_EXPORT uint64_t flow_loader_samples_per_epoch(const flow_loader_t *loader);
/* G / W: the rows of each batch this rank gets. */
FLOW_EXPORT uint64_t flow_loader_local_batch(const flow_loader_t *loader);

/* The pure order function (no I/O, thread-safe, also while another
 * thread calls flow_loader_next): the sample in slot `slot` (< G) of
 * global batch `step`.  Positions step * G + slot are taken modulo 2^64. */
FLOW_EXPORT void flow_loader_sample_at(const flow_loader_t *loader,
				       uint64_t step, uint64_t slot,
				       flow_sample_ref_t *ref_out);

/* The next batch of this rank: inputs and targets (caller-owned, row-major)
 * are local_batch x seq_len int32 each; row j is the window of slot
 * r * local_batch + j, inputs its first seq_len tokens, targets the same
 * shifted by one token.  Returns 1; the stream never ends (epochs follow
 * one another).  Every token handed out has been checked: its shard's
 * checksum was verified before the shard's first token was used
 * (FLOW_ERR_CHECKSUM naming the file), and the token is below the
 * vocabulary (FLOW_ERR_FORMAT naming the file and byte).  On a read
 * error (also one met by the prefetch thread,
 * reported here with its message) returns <0 with diag set, leaves inputs,
 * targets and the state unchanged, and the next call retries that batch;
 * FLOW_ERR_RANGE past 2^64 stream positions.  Not thread-safe: one caller
 * thread per loader (with prefetch, the loader's own thread does the
 * reads). */
FLOW_EXPORT int flow_loader_next(flow_loader_t *loader, int32_t *inputs,
				 int32_t *targets, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* The state to resume from: the first position not yet returned by
 * flow_loader_next (a prefetched batch does not count), as (position / N,
 * position % N). */
FLOW_EXPORT flow_loader_state_t flow_loader_get_state(
	const flow_loader_t *loader);
/* Continue from state (which must fall on a global batch boundary:
 * position divisible by G), dropping any prefetched batch.  Returns
 * FLOW_OK; FLOW_ERR_USAGE when state->index >= N or the position is not a
 * multiple of G; FLOW_ERR_RANGE when the position passes 2^64.  On error
 * the loader is unchanged. */
FLOW_EXPORT flow_err_t flow_loader_seek(flow_loader_t *loader,
					const flow_loader_state_t *state,
					flow_diag_t *diag) FLOW_MUST_CHECK;

/* Print which samples this rank reads for steps [first_step, first_step +
 * steps), one row per slot of this rank in slot order (slot: index in the
 * global batch; file: the shard's name in the manifest; offset: its first
 * token in that shard): TSV with header
 * "step\trank\tslot\tposition\tepoch\tsample\tfile\toffset", or with json
 * a JSON array of objects with the same fields, one object per line
 * ("[]" when there is no row).  Pure (no shard is read).  Returns FLOW_OK,
 * FLOW_ERR_IO when writing to out fails, FLOW_ERR_RANGE when the steps pass
 * 2^64 stream positions. */
FLOW_EXPORT flow_err_t flow_loader_print_order(const flow_loader_t *loader,
					       uint64_t first_step,
					       uint64_t steps, FILE *out,
					       bool json, flow_diag_t *diag)
	FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
