/* Token shards and datasets: the binary shard file, the text manifest that
 * lists a dataset's shards, and building and verifying a dataset directory.
 * flow-shard(5) documents both formats byte by byte.
 *
 * Shard file (little-endian throughout):
 *   offset  size  field
 *   0       8     magic "FLOWSHRD"
 *   8       4     format version (1)
 *   12      4     header length: bytes before the payload
 *   16      4     bytes per token: 2 (uint16) or 4 (uint32)
 *   20      4     flags: bit 0 set when the payload is zstd frames
 *   24      8     token count
 *   32      8     vocabulary size (every token is below it)
 *   40      4     tokens per frame (compressed; the last frame may hold
 *                 fewer), 0 when uncompressed
 *   44      4     frame count (0 when uncompressed)
 *   48      8     payload length in bytes
 *   56      8     reserved, 0
 *   64      16*F  frame index: per frame, the u64 offset of the frame from
 *                 the payload start and its u64 length
 *   H       P     payload: the tokens, or F independently decodable zstd
 *                 frames of them
 *   H+P     8     XXH3-64 of every byte before it
 *
 * Dataset directory: shard files named "<split>-NNNNNN.bin" and a text file
 * "manifest":
 *   flow-manifest 1
 *   vocab 50257
 *   token_dtype u16
 *   compression zstd 3 65536        (or: compression none)
 *   split train 1000000 tokens 10 shards
 *   split val 10000 tokens 1 shards
 *   shard val-000000.bin 10000 20080 0123456789abcdef
 *   shard train-000000.bin 100000 200080 fedcba9876543210
 *   ...
 *   checksum 00112233445566778899aabb...   (XXH3-64 of every byte before
 *                                           this line; 16 hex digits)
 * "shard" lines give file, token count, byte size and the file's checksum
 * (its last 8 bytes); the file name's prefix ("train-" or "val-") gives
 * the shard's split.  Lines come in the order shown; blank lines are
 * ignored.  '#' starts a comment line.  The manifest checksum
 * identifies the dataset: the loader's sample order is derived from it. */
#ifndef FLOW_SHARD_H
#define FLOW_SHARD_H

#include <stdio.h>

#include <flow/error.h>
#include <flow/tensor.h>
#include <flow/tokens.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLOW_SHARD_VERSION 1
/* The most tokens a zstd frame may hold (64 MiB of u32 tokens decoded):
 * readers allocate one frame, so a header cannot make them allocate more;
 * writers refuse more. */
#define FLOW_SHARD_MAX_FRAME_TOKENS (1u << 24)
#define FLOW_MANIFEST_VERSION 1

typedef enum {
	FLOW_SPLIT_TRAIN = 0,
	FLOW_SPLIT_VAL = 1,
} flow_split_t;

#define FLOW_SPLIT_COUNT 2

/* "train", "val"; static. */
FLOW_EXPORT const char *flow_split_name(flow_split_t split);
FLOW_EXPORT flow_err_t flow_split_parse(const char *text,
					flow_split_t *split_out,
					flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- one shard file ------------------------------------------------------ */

typedef struct flow_shard_write_options {
	flow_dtype_t token_dtype; /* FLOW_DTYPE_U16 or FLOW_DTYPE_U32 */
	uint64_t vocab;
	int zstd_level;           /* 0: uncompressed */
	uint32_t frame_tokens;    /* tokens per zstd frame (> 0 if compressed) */
} flow_shard_write_options_t;

typedef struct flow_shard_file_info {
	uint64_t tokens;
	uint64_t bytes;    /* file size */
	uint64_t checksum; /* the file's trailing XXH3-64 */
} flow_shard_file_info_t;

/* Write count tokens (each below options->vocab) as a shard at path, through
 * a temporary name renamed into place. */
FLOW_EXPORT flow_err_t flow_shard_write(const char *path,
					const uint32_t *tokens, size_t count,
					const flow_shard_write_options_t *options,
					flow_shard_file_info_t *info_out,
					flow_diag_t *diag) FLOW_MUST_CHECK;

typedef struct flow_shard flow_shard_t;

/* Map a shard and validate its header against the file size (magic,
 * version, lengths, frame index); the payload checksum is checked by
 * flow_shard_verify_file, not here.  Free with flow_shard_close(). */
FLOW_EXPORT flow_err_t flow_shard_open(const char *path,
				       flow_shard_t **shard_out,
				       flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_shard_close(flow_shard_t *shard);
FLOW_EXPORT uint64_t flow_shard_token_count(const flow_shard_t *shard);
FLOW_EXPORT uint64_t flow_shard_vocab(const flow_shard_t *shard);
FLOW_EXPORT flow_dtype_t flow_shard_token_dtype(const flow_shard_t *shard);

/* Copy tokens [first, first + count) into tokens_out, decoding only the
 * zstd frames that overlap them, and check that each is below the shard's
 * vocabulary (each frame when it is decoded; raw tokens as they are
 * copied): FLOW_ERR_FORMAT naming the file, token and byte otherwise, so
 * no id at or above the vocabulary is ever handed out.  The checksum is
 * not checked here (flow_shard_verify_checksum).  One thread at a time
 * per shard. */
FLOW_EXPORT flow_err_t flow_shard_read(flow_shard_t *shard, uint64_t first,
				       size_t count, uint32_t *tokens_out,
				       flow_diag_t *diag) FLOW_MUST_CHECK;

/* Stop checking this shard's tokens against the vocabulary in
 * flow_shard_read: only to measure what the checks cost (flow-bench
 * loader); a reader of data to train on never calls it. */
FLOW_EXPORT void flow_shard_skip_checks(flow_shard_t *shard);

/* Check an open shard against what the manifest says of it, without
 * reading its payload: byte size and token count (when expected is not
 * NULL), vocabulary (when vocab is not 0), and the checksum in its trailer
 * against expected->checksum.  Errors name the file and byte. */
FLOW_EXPORT flow_err_t flow_shard_check(const flow_shard_t *shard,
					const flow_shard_file_info_t *expected,
					uint64_t vocab, flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Hash every byte of the shard before its trailer and compare with the
 * trailer: FLOW_ERR_CHECKSUM naming the file otherwise.  Reads the whole
 * file once. */
FLOW_EXPORT flow_err_t flow_shard_verify_checksum(const flow_shard_t *shard,
						  flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Check a shard file completely: header, sizes, frame index, every frame
 * decodes to the right length, every token is below the vocabulary, and
 * the trailing checksum.  When expected is not NULL its tokens, bytes and
 * checksum must match too (the manifest's values).  diag names the file
 * and the byte offset of the first problem. */
FLOW_EXPORT flow_err_t flow_shard_verify_file(
	const char *path, const flow_shard_file_info_t *expected,
	flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- the manifest ----------------------------------------------------------- */

typedef struct flow_manifest_shard {
	char *file;        /* name inside the dataset directory */
	flow_split_t split;
	flow_shard_file_info_t info;
} flow_manifest_shard_t;

typedef struct flow_manifest {
	uint32_t version;
	uint64_t vocab;
	flow_dtype_t token_dtype;
	int zstd_level;          /* 0: uncompressed */
	uint32_t frame_tokens;   /* 0 when uncompressed */
	uint64_t split_tokens[FLOW_SPLIT_COUNT];
	size_t nshards;
	flow_manifest_shard_t *shards; /* in file order */
	uint64_t checksum;       /* the manifest's own; identifies the data */
} flow_manifest_t;

/* Read and validate dir/manifest: every line, the version, counts that add
 * up, file names without '/', and the checksum line.  Errors name the
 * line: "data/manifest:7: expected 'shard', got 'shrad'".  Release with
 * flow_manifest_release(). */
FLOW_EXPORT flow_err_t flow_manifest_read(const char *dir,
					  flow_manifest_t *manifest_out,
					  flow_diag_t *diag) FLOW_MUST_CHECK;
/* Write the manifest text (with its checksum line) to out and set
 * manifest->checksum. */
FLOW_EXPORT flow_err_t flow_manifest_write(flow_manifest_t *manifest,
					   FILE *out, flow_diag_t *diag)
	FLOW_MUST_CHECK;
FLOW_EXPORT void flow_manifest_release(flow_manifest_t *manifest);

/* ---- datasets ------------------------------------------------------------------ */

typedef struct flow_dataset_options {
	flow_token_source_options_t input;
	uint64_t vocab;          /* 0: the inputs' own (text: 256) */
	uint64_t shard_tokens;   /* tokens per shard (the last may hold fewer) */
	uint64_t val_tokens;     /* the first val_tokens go to the val split */
	int zstd_level;          /* 0: uncompressed */
	uint32_t frame_tokens;   /* tokens per zstd frame */
	/* Called now and then with the tokens written so far and the total
	 * when known (-1 otherwise); may be NULL. */
	void (*progress)(uint64_t done, int64_t total, void *userdata);
	void *progress_userdata;
} flow_dataset_options_t;

/* Build a dataset directory at out_dir from the inputs, in order, into a
 * temporary directory beside it that is renamed into place only when
 * everything is written and synced: on any error nothing exists under
 * out_dir.  out_dir must not exist.  The temporary directory is removed on
 * error and by flow_atomic_file_cleanup_all() (signals). */
FLOW_EXPORT flow_err_t flow_dataset_build(const char *out_dir,
					  const char *const *inputs,
					  size_t ninputs,
					  const flow_dataset_options_t *options,
					  flow_manifest_t *manifest_out,
					  flow_diag_t *diag) FLOW_MUST_CHECK;

/* Verify every shard of a dataset against its manifest; diag names the
 * first bad file and byte offset. */
FLOW_EXPORT flow_err_t flow_dataset_verify(const char *dir, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* The manifest as TSV (header: file, split, tokens, bytes, checksum), or as
 * JSON. */
FLOW_EXPORT flow_err_t flow_manifest_print(const flow_manifest_t *manifest,
					   FILE *out, bool json,
					   flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
