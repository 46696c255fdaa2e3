/* Checkpoints (flow-ckpt(5)): one directory per step, made of shards.
 *
 *   ckpt/step-00000100/
 *     rank-00000.bin   the shards rank 0 holds, back to back
 *     rank-00000.idx   rank 0's shard index (text, one line per shard)
 *     manifest         written last: commits the checkpoint
 *
 * A tensor is described once (name, dtype, logical shape, mesh, nd-SBP) and
 * stored as shards: each shard is a box of the logical tensor (start and
 * extent per dimension) held by one rank at an offset of that rank's data
 * file, with its length and XXH3-64 checksum.  A single-rank checkpoint
 * has one whole-tensor shard per tensor; a sharded run writes one shard
 * per rank and tensor; readers assemble any box from the shards that
 * cover it, so resharding needs no ranks.
 *
 * Writing: each rank writes its data file and its index atomically
 * (flow/file.h), then, after all ranks have finished (a barrier), one rank
 * commits: it reads every index, checks that each tensor's shards tile its
 * logical shape exactly (replicas of one box across ranks are allowed; the
 * first is used), and renames the manifest into place.  A directory
 * without a manifest is not a checkpoint.  Rewriting a step first removes
 * its manifest, so a crash never leaves a manifest that names data it does
 * not match. */
#ifndef FLOW_CKPT_H
#define FLOW_CKPT_H

#include <flow/error.h>
#include <flow/box.h>
#include <flow/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLOW_CKPT_FORMAT_VERSION 1
#define FLOW_CKPT_NAME_MAX 128
#define FLOW_CKPT_TEXT_MAX 64

typedef struct flow_ckpt_tensor_desc {
	char name[FLOW_CKPT_NAME_MAX]; /* "h.0.attn.c_attn.weight",
					* "adamw.m/h.0.attn.c_attn.weight" */
	flow_dtype_t dtype;
	flow_shape_t shape;            /* logical */
	char mesh[FLOW_CKPT_TEXT_MAX]; /* "1", "2x2" */
	char sbp[FLOW_CKPT_TEXT_MAX];  /* nd-SBP, "(B)", "(S(0),B)" */
} flow_ckpt_tensor_desc_t;

/* "<ckpt_dir>/step-%08llu", caller-owned (free()); NULL when out of
 * memory. */
FLOW_EXPORT char *flow_ckpt_step_path(const char *ckpt_dir, uint64_t step);

/* ---- writing ------------------------------------------------------------ */

typedef struct flow_ckpt_writer flow_ckpt_writer_t;

/* Start rank `rank`'s part of the checkpoint in step_dir (created with its
 * parents when missing; an existing manifest there is removed first).
 * Free with flow_ckpt_writer_finish() or flow_ckpt_writer_abort(). */
FLOW_EXPORT flow_err_t flow_ckpt_writer_new(const char *step_dir,
					    uint32_t rank,
					    flow_ckpt_writer_t **writer_out,
					    flow_diag_t *diag) FLOW_MUST_CHECK;
/* Append one shard: the elements of `box` (NULL: the whole tensor) of the
 * tensor desc, row-major in `data`.  FLOW_ERR_USAGE for a box outside the
 * shape or a bad desc (empty or over-long name, whitespace in a field). */
FLOW_EXPORT flow_err_t flow_ckpt_writer_add(flow_ckpt_writer_t *writer,
					    const flow_ckpt_tensor_desc_t *desc,
					    const flow_box_t *box,
					    const void *data,
					    flow_diag_t *diag) FLOW_MUST_CHECK;
/* Commit this rank's data file and index (each atomically), free the
 * writer (also on error).  On error, as on abort, a step directory the
 * writer created is removed again when it is left empty. */
FLOW_EXPORT flow_err_t flow_ckpt_writer_finish(flow_ckpt_writer_t *writer,
					       flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Remove what this writer wrote (and the step directory when the writer
 * created it and it is empty now), free; NULL is ignored. */
FLOW_EXPORT void flow_ckpt_writer_abort(flow_ckpt_writer_t *writer);

/* One "key value" line of run state (model spec, step, data-loader
 * position, RNG seed, ...).  Keys: [A-Za-z0-9_.-]+; values: printable,
 * no newline, may hold spaces. */
typedef struct flow_ckpt_kv {
	const char *key;
	const char *value;
} flow_ckpt_kv_t;

/* Commit the checkpoint of `step` in step_dir written by ranks
 * [0, nranks): read and check their indexes (FLOW_ERR_FORMAT naming the
 * index file and line; FLOW_ERR_USAGE when a tensor's shards do not tile
 * it, or two ranks describe one tensor differently), then write the
 * manifest atomically with the state lines kv[0..nkv). */
FLOW_EXPORT flow_err_t flow_ckpt_commit(const char *step_dir, uint64_t step,
					uint32_t nranks,
					const flow_ckpt_kv_t *kv, size_t nkv,
					flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- reading ------------------------------------------------------------ */

typedef struct flow_ckpt flow_ckpt_t;

/* Read and validate step_dir/manifest (format version, every line, the
 * manifest's own checksum, each shard's file existing and long enough,
 * shards tiling each tensor).  Errors name the file and line:
 * "ckpt/step-00000010/manifest:14: shard box 0:320,0:129 exceeds (320,128)";
 * a directory without a manifest is FLOW_ERR_FORMAT "... is not a committed
 * checkpoint (no manifest)".  No data is read.  Free with
 * flow_ckpt_free(). */
FLOW_EXPORT flow_err_t flow_ckpt_open(const char *step_dir,
				      flow_ckpt_t **ckpt_out,
				      flow_diag_t *diag) FLOW_MUST_CHECK;
FLOW_EXPORT void flow_ckpt_free(flow_ckpt_t *ckpt);

FLOW_EXPORT uint64_t flow_ckpt_step(const flow_ckpt_t *ckpt);
/* The state value of key, borrowed until flow_ckpt_free; NULL when absent. */
FLOW_EXPORT const char *flow_ckpt_get(const flow_ckpt_t *ckpt,
				      const char *key);
/* State lines in manifest order: returns the count; *kv_out borrowed. */
FLOW_EXPORT size_t flow_ckpt_state(const flow_ckpt_t *ckpt,
				   const flow_ckpt_kv_t **kv_out);
FLOW_EXPORT size_t flow_ckpt_tensor_count(const flow_ckpt_t *ckpt);
/* Borrowed until flow_ckpt_free. */
FLOW_EXPORT const flow_ckpt_tensor_desc_t *flow_ckpt_tensor_at(
	const flow_ckpt_t *ckpt, size_t index);
/* The shards of tensor `index` (replicas of one box on several ranks
 * included); *bytes_out (when not NULL) their bytes in the data files. */
FLOW_EXPORT size_t flow_ckpt_tensor_shards(const flow_ckpt_t *ckpt,
					   size_t index, uint64_t *bytes_out);
/* The ranks that wrote the checkpoint: one more than the highest rank
 * holding a shard (0 for a checkpoint without tensors). */
FLOW_EXPORT size_t flow_ckpt_ranks(const flow_ckpt_t *ckpt);
/* The bytes of one row (first dimension) of the tensor desc describes
 * (its element size for a 0-d or 1-d one): no shard of it has a longer
 * row, so a read buffer of this size always suffices. */
FLOW_EXPORT size_t flow_ckpt_row_bytes(const flow_ckpt_tensor_desc_t *desc);
/* Index of the tensor named name, or -1. */
FLOW_EXPORT int flow_ckpt_tensor_find(const flow_ckpt_t *ckpt,
				      const char *name);
/* Copy the elements of `box` (NULL: whole) of tensor `index` to dst
 * (row-major box, dtype as stored), reading each shard that intersects it
 * and checking that shard's checksum: FLOW_ERR_CHECKSUM naming the file,
 * tensor and offset (dst may then hold part of the shard); FLOW_ERR_IO
 * for a short read.  It is flow_ckpt_read_bounded through a read buffer
 * of its own of a few MiB, and trusts verified shards as that does. */
FLOW_EXPORT flow_err_t flow_ckpt_read(const flow_ckpt_t *ckpt, size_t index,
				      const flow_box_t *box, void *dst,
				      flow_diag_t *diag) FLOW_MUST_CHECK;
/* flow_ckpt_read within a bounded working set: each shard that
 * intersects box is read through the caller's scratch buffer
 * (scratch_bytes), a slab of whole rows of its first dimension at a time
 * (straight into dst when box is the whole shard), its checksum computed
 * as it streams.  A shard whose checksum a read of this ckpt has verified
 * is trusted from then on: later reads take only the rows of it they
 * need, unhashed (ckpt may be read from several threads).  FLOW_ERR_USAGE
 * naming the tensor and shard when one row of a shard is larger than
 * scratch_bytes; else as flow_ckpt_read. */
FLOW_EXPORT flow_err_t flow_ckpt_read_bounded(const flow_ckpt_t *ckpt,
					      size_t index,
					      const flow_box_t *box, void *dst,
					      void *scratch,
					      size_t scratch_bytes,
					      flow_diag_t *diag)
	FLOW_MUST_CHECK;
/* Read every shard and check its checksum. */
FLOW_EXPORT flow_err_t flow_ckpt_verify(const flow_ckpt_t *ckpt,
					flow_diag_t *diag) FLOW_MUST_CHECK;

/* The committed checkpoint of ckpt_dir with the highest step: of the
 * directories named step-NNNNNNNN holding a manifest (others, such as a
 * step whose writing was killed before its commit, are ignored), the one
 * named for the highest step, whose manifest must then pass
 * flow_ckpt_open and hold that step (FLOW_ERR_FORMAT naming it otherwise:
 * it is reported, not skipped).  *path_out caller-owned.  FLOW_ERR_USAGE
 * "ckpt/: no committed checkpoint" when there is none; FLOW_ERR_IO when
 * ckpt_dir cannot be read. */
FLOW_EXPORT flow_err_t flow_ckpt_latest(const char *ckpt_dir, char **path_out,
					flow_diag_t *diag) FLOW_MUST_CHECK;

#ifdef __cplusplus
}
#endif

#endif
