/* What the parts of the checkpoint module share (never installed): the
 * catalog of tensors and their shards, the parsed manifest or rank index,
 * the names of a step directory's files, the text of boxes and the checks
 * every committed checkpoint passes.  ckpt_index.c parses and checks,
 * ckpt_write.c writes and commits, ckpt_read.c opens and reads;
 * flow-ckpt(5) is the format they all follow. */
#ifndef FLOW_CKPT_INTERNAL_H
#define FLOW_CKPT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <flow/ckpt.h>

#include "core/textrec_internal.h"

#define CKPT_MAGIC "flow-checkpoint"
#define CKPT_INDEX_MAGIC "flow-checkpoint-index"
/* Shards start at multiples of this in a data file. */
#define CKPT_SHARD_ALIGN 64u
/* "start:end" per dimension, comma separated: 8 * (19 + 1 + 19 + 1). */
#define CKPT_BOX_TEXT_MAX 352
/* "(d,d,...)": 8 * 20 + 3. */
#define CKPT_SHAPE_TEXT_MAX 168

/* The data files hold the host's bytes, which the format fixes as
 * little-endian: writers and readers refuse any other host. */
static inline bool ckpt_host_is_little_endian(void)
{
	const uint16_t one = 1;
	unsigned char first;
	memcpy(&first, &one, 1);
	return first == 1;
}

/* The record format of manifests and indexes: space-separated fields,
 * closed by "end XXH3" with a lowercase sum. */
extern const flow_textrec_format_t ckpt_textrec_format;

/* ---- names ---------------------------------------------------------------- */

/* "<dir>/<name>" with dir's trailing slashes dropped; caller-owned
 * (free()), NULL when out of memory. */
char *ckpt_path_join(const char *dir, const char *name);
/* "rank-RRRRR.<ext>" into buf (32 bytes are enough). */
void ckpt_rank_file_name(char *buf, size_t cap, uint32_t rank,
			 const char *ext);
/* "<dir>/rank-RRRRR.<ext>"; caller-owned, NULL when out of memory. */
char *ckpt_rank_path(const char *dir, uint32_t rank, const char *ext);

/* Printable ASCII without spaces, not empty: names, dtypes, meshes, SBPs. */
bool ckpt_valid_token(const char *s);
/* A state key: [A-Za-z0-9_.-]+. */
bool ckpt_valid_key(const char *s);
/* A state value: printable ASCII, spaces allowed, may be empty. */
bool ckpt_valid_value(const char *s);

/* ---- boxes and descriptions ------------------------------------------------- */

/* "-" for a 0-d box, else "start:end,start:end,..." (truncated to cap). */
void ckpt_box_format(const flow_box_t *box, char *buf, size_t cap);

/* The bytes of the whole tensor desc describes: true with *out set when
 * the dtype is known and they fit in a size_t and an int64_t. */
bool ckpt_desc_bytes(const flow_ckpt_tensor_desc_t *desc, size_t *out);

/* The box a caller names (NULL: the whole tensor) in *box_out, when it
 * lies inside desc's shape; else FLOW_ERR_USAGE naming the tensor. */
flow_err_t ckpt_caller_box(const flow_ckpt_tensor_desc_t *desc,
			   const flow_box_t *box, flow_box_t *box_out,
			   flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- the catalog: tensors and their shards ----------------------------------- */

typedef struct ckpt_shard {
	flow_box_t box;
	uint64_t offset;
	uint64_t length;
	uint64_t sum;
	uint32_t rank;
	size_t line;   /* in the manifest or in the rank's index */
	size_t tensor; /* the writer's tensor index */
	bool replica;  /* an exact copy of an earlier shard's box: not read */
} ckpt_shard_t;

typedef struct ckpt_tensor {
	flow_ckpt_tensor_desc_t desc;
	size_t line;       /* of the tensor line */
	uint32_t src_rank; /* commit: the rank whose index holds that line */
	size_t first;      /* shards [first, first + count) */
	size_t count;
} ckpt_tensor_t;

/* Zero-initialised is empty; release with ckpt_catalog_release(). */
typedef struct ckpt_catalog {
	ckpt_tensor_t *tensors;
	size_t ntensors, tcap;
	ckpt_shard_t *shards;
	size_t nshards, scap;
	size_t *slots; /* open addressing by name: tensor index + 1, 0 empty */
	size_t nslots;
} ckpt_catalog_t;

/* Free what c holds and leave it empty. */
void ckpt_catalog_release(ckpt_catalog_t *c);
/* Make *ptr (of *cap elements of elsize bytes) hold at least need,
 * doubling; false when out of memory or on overflow (*ptr unchanged). */
bool ckpt_grow(void **ptr, size_t *cap, size_t need, size_t elsize);
/* The index of the tensor named name, or -1. */
long ckpt_catalog_find(const ckpt_catalog_t *c, const char *name);
/* Append a tensor whose name is not in the catalog yet (FLOW_ERR_NOMEM). */
flow_err_t ckpt_catalog_add_tensor(ckpt_catalog_t *c, const ckpt_tensor_t *t,
				   flow_diag_t *diag) FLOW_MUST_CHECK;
/* Append a shard (FLOW_ERR_NOMEM); the caller counts it in its tensor. */
flow_err_t ckpt_catalog_add_shard(ckpt_catalog_t *c, const ckpt_shard_t *s,
				  flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- where a record is: for messages ------------------------------------------ */

/* Records come from the manifest (manifest != NULL) or, when committing,
 * from the index of the rank that holds them. */
typedef struct ckpt_where {
	const char *manifest;
	const char *dir;
} ckpt_where_t;

/* "FILE:LINE" of the record at line of rank's index (or of the manifest). */
void ckpt_where_at(const ckpt_where_t *w, uint32_t rank, size_t line,
		   char *buf, size_t cap);

/* ---- the checks of a committed checkpoint ---------------------------------------- */

/* Check that tensor t's shards (boxes already inside its shape) tile it:
 * marks exact replicas on other ranks, then refuses, with code and the
 * record's place, a box listed twice by one rank, two boxes that share
 * elements, and gaps.  FLOW_ERR_NOMEM when out of memory. */
flow_err_t ckpt_check_tiling(ckpt_catalog_t *c, size_t t,
			     const ckpt_where_t *w, flow_err_t code,
			     flow_diag_t *diag) FLOW_MUST_CHECK;

/* Each rank's data file in dir exists, is a regular file and holds the
 * end of its last shard: FLOW_ERR_FORMAT naming the record, FLOW_ERR_IO
 * when it cannot be examined. */
flow_err_t ckpt_check_files(const ckpt_catalog_t *c, const char *dir,
			    const ckpt_where_t *w,
			    flow_diag_t *diag) FLOW_MUST_CHECK;

/* ---- the parsed manifest or rank index --------------------------------------------- */

typedef enum { CKPT_DOC_MANIFEST, CKPT_DOC_INDEX } ckpt_doc_kind_t;

/* The caller sets kind, path, dir and, for an index, rank; the parser
 * fills the rest.  Release with ckpt_doc_release(). */
typedef struct ckpt_doc {
	ckpt_doc_kind_t kind;
	const char *path;
	const char *dir;
	uint32_t rank;          /* CKPT_DOC_INDEX: the rank the file must be for */
	uint64_t step;          /* CKPT_DOC_MANIFEST */
	flow_ckpt_kv_t *kv;     /* CKPT_DOC_MANIFEST: pointers into the text */
	size_t nkv, kvcap;
	ckpt_catalog_t cat;
} ckpt_doc_t;

/* Parse a manifest or an index, strictly: text is cut into fields in
 * place and must outlive doc's state lines.  A manifest's tensors are
 * checked to tile their shapes.  FLOW_ERR_FORMAT "PATH:LINE: ..." on the
 * first problem, FLOW_ERR_NOMEM. */
flow_err_t ckpt_doc_parse(ckpt_doc_t *doc, char *text, size_t len,
			  flow_diag_t *diag) FLOW_MUST_CHECK;
/* Free what the parser allocated; the caller's fields stay. */
void ckpt_doc_release(ckpt_doc_t *doc);

#endif
