/* Sharded checkpoints: per-rank data files of raw little-endian shards,
 * per-rank text indexes, and a manifest that commits the step.  Writers go
 * through atomic files; the manifest and the indexes are parsed strictly
 * (fixed record order, single-space fields, one spelling per number, a
 * closing XXH3-64) with every error naming "FILE:LINE"; reads assemble any
 * box of a tensor from the shards that intersect it.  flow-ckpt(5) is the
 * specification. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/checksum.h>
#include <flow/ckpt.h>
#include <flow/file.h>
#include <flow/mem.h>

#include "core/textrec_internal.h"

#define CKPT_MAGIC "flow-checkpoint"
#define INDEX_MAGIC "flow-checkpoint-index"
/* Shards start at multiples of this in a data file. */
#define SHARD_ALIGN 64u
/* "start:end" per dimension, comma separated: 8 * (19 + 1 + 19 + 1). */
#define BOX_TEXT_MAX 352
/* "(d,d,...)": 8 * 20 + 3. */
#define SHAPE_TEXT_MAX 168
/* "DTYPE SHAPE MESH SBP". */
#define DESC_TEXT_MAX (8 + SHAPE_TEXT_MAX + 2 * FLOW_CKPT_TEXT_MAX)
/* Chunk size of flow_ckpt_verify's streaming reads. */
#define VERIFY_CHUNK (1u << 20)

/* The data files hold the host's bytes, which the format fixes as
 * little-endian. */
static bool host_is_little_endian(void)
{
	const uint16_t one = 1;
	unsigned char first;
	memcpy(&first, &one, 1);
	return first == 1;
}

/* ---- small helpers -------------------------------------------------------- */

/* "<dir>/<name>" with dir's trailing slashes dropped; NULL when out of
 * memory. */
static char *path_join(const char *dir, const char *name)
{
	size_t dlen = strlen(dir);
	while (dlen > 1 && dir[dlen - 1] == '/')
		dlen--;
	bool slash = !(dlen == 1 && dir[0] == '/');
	size_t nlen = strlen(name), total;
	if (!flow_add_size(dlen, nlen, &total) ||
	    !flow_add_size(total, 2, &total))
		return NULL;
	char *p = malloc(total);
	if (!p)
		return NULL;
	memcpy(p, dir, dlen);
	size_t at = dlen;
	if (slash)
		p[at++] = '/';
	memcpy(p + at, name, nlen + 1);
	return p;
}

static void rank_file_name(char *buf, size_t cap, uint32_t rank,
			   const char *ext)
{
	snprintf(buf, cap, "rank-%05" PRIu32 ".%s", rank, ext);
}

static char *rank_path(const char *dir, uint32_t rank, const char *ext)
{
	char name[32];
	rank_file_name(name, sizeof(name), rank, ext);
	return path_join(dir, name);
}

/* Printable ASCII without spaces: names, dtypes, meshes, SBPs. */
static bool valid_token(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if ((unsigned char)*s <= ' ' || (unsigned char)*s >= 0x7f)
			return false;
	return true;
}

static bool valid_key(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++) {
		char c = *s;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '.' ||
		      c == '-'))
			return false;
	}
	return true;
}

/* Printable ASCII, spaces allowed. */
static bool valid_value(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < ' ' || (unsigned char)*s >= 0x7f)
			return false;
	return true;
}

/* ---- boxes ------------------------------------------------------------------ */

static void box_format(const flow_box_t *box, char *buf, size_t cap)
{
	if (box->ndim == 0) {
		snprintf(buf, cap, "-");
		return;
	}
	size_t at = 0;
	buf[0] = '\0';
	for (int d = 0; d < box->ndim && at < cap; d++) {
		int n = snprintf(buf + at, cap - at, "%s%" PRId64 ":%" PRId64,
				 d ? "," : "", box->start[d],
				 box->start[d] + box->extent[d]);
		if (n < 0)
			break;
		at += (size_t)n;
	}
}

/* "-" or "s:e,s:e,...": syntax only (start <= end). */
static bool box_parse(const char *text, flow_box_t *box_out)
{
	flow_box_t box;
	memset(&box, 0, sizeof(box));
	if (strcmp(text, "-") == 0) {
		*box_out = box;
		return true;
	}
	const char *s = text;
	for (;;) {
		if (box.ndim == FLOW_MAX_DIMS)
			return false;
		const char *colon = strchr(s, ':');
		const char *comma = strchr(s, ',');
		if (!comma)
			comma = s + strlen(s);
		if (!colon || colon > comma)
			return false;
		uint64_t a, b;
		if (!flow_textrec_parse_u64(s, (size_t)(colon - s), INT64_MAX,
					    &a) ||
		    !flow_textrec_parse_u64(colon + 1,
					    (size_t)(comma - colon - 1),
					    INT64_MAX, &b) ||
		    a > b)
			return false;
		box.start[box.ndim] = (int64_t)a;
		box.extent[box.ndim] = (int64_t)(b - a);
		box.ndim++;
		if (!*comma)
			break;
		s = comma + 1;
	}
	*box_out = box;
	return true;
}

/* ---- descriptions ------------------------------------------------------------ */

static bool desc_equal(const flow_ckpt_tensor_desc_t *a,
		       const flow_ckpt_tensor_desc_t *b)
{
	return strcmp(a->name, b->name) == 0 && a->dtype == b->dtype &&
	       flow_shape_equal(&a->shape, &b->shape) &&
	       strcmp(a->mesh, b->mesh) == 0 && strcmp(a->sbp, b->sbp) == 0;
}

/* "f32 (320,128) 1 (B)": the description as the tensor line spells it. */
static void desc_format(const flow_ckpt_tensor_desc_t *desc, char *buf,
			size_t cap)
{
	char shape[SHAPE_TEXT_MAX];
	flow_shape_format(&desc->shape, shape, sizeof(shape));
	const char *dtype = flow_dtype_name(desc->dtype);
	snprintf(buf, cap, "%s %s %s %s", dtype ? dtype : "?", shape,
		 desc->mesh, desc->sbp);
}

/* The bytes of the whole tensor, when they fit in a size_t. */
static bool desc_bytes(const flow_ckpt_tensor_desc_t *desc, size_t *out)
{
	size_t n = flow_dtype_size(desc->dtype);
	if (n == 0)
		return false;
	for (int d = 0; d < desc->shape.ndim; d++)
		if (desc->shape.dims[d] < 0 ||
		    !flow_mul_size(n, (size_t)desc->shape.dims[d], &n))
			return false;
	if ((uint64_t)n > INT64_MAX)
		return false;
	*out = n;
	return true;
}

/* Check a caller's description (FLOW_ERR_USAGE). */
static flow_err_t desc_check(const flow_ckpt_tensor_desc_t *desc,
			     flow_diag_t *diag)
{
	size_t nlen = strnlen(desc->name, FLOW_CKPT_NAME_MAX);
	if (nlen == FLOW_CKPT_NAME_MAX)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor name '%.*s...' is longer than %d bytes",
				     32, desc->name, FLOW_CKPT_NAME_MAX - 1);
	if (!valid_token(desc->name))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid tensor name '%s' (expected printable ASCII without spaces)",
				     desc->name);
	if (strnlen(desc->mesh, FLOW_CKPT_TEXT_MAX) == FLOW_CKPT_TEXT_MAX ||
	    !valid_token(desc->mesh))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': invalid mesh '%.*s' (expected printable ASCII without spaces, at most %d bytes)",
				     desc->name, FLOW_CKPT_TEXT_MAX, desc->mesh,
				     FLOW_CKPT_TEXT_MAX - 1);
	if (strnlen(desc->sbp, FLOW_CKPT_TEXT_MAX) == FLOW_CKPT_TEXT_MAX ||
	    !valid_token(desc->sbp))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': invalid SBP '%.*s' (expected printable ASCII without spaces, at most %d bytes)",
				     desc->name, FLOW_CKPT_TEXT_MAX, desc->sbp,
				     FLOW_CKPT_TEXT_MAX - 1);
	if (!flow_dtype_name(desc->dtype))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': unknown dtype %d", desc->name,
				     (int)desc->dtype);
	if (desc->shape.ndim < 0 || desc->shape.ndim > FLOW_MAX_DIMS)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': %d dimensions (expected 0 to %d)",
				     desc->name, desc->shape.ndim, FLOW_MAX_DIMS);
	size_t bytes;
	if (!desc_bytes(desc, &bytes))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': invalid or too large shape",
				     desc->name);
	return FLOW_OK;
}

/* The box a caller names (NULL: the whole tensor), when it lies inside
 * desc's shape (FLOW_ERR_USAGE). */
static flow_err_t caller_box(const flow_ckpt_tensor_desc_t *desc,
			     const flow_box_t *box,
			     flow_box_t *box_out, flow_diag_t *diag)
{
	if (!box) {
		flow_box_whole(&desc->shape, box_out);
		return FLOW_OK;
	}
	if (!flow_box_inside(box, &desc->shape)) {
		char shape[SHAPE_TEXT_MAX], text[BOX_TEXT_MAX];
		flow_shape_format(&desc->shape, shape, sizeof(shape));
		if (box->ndim != desc->shape.ndim)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "tensor '%s': box has %d dimensions, the shape %s has %d",
					     desc->name, box->ndim, shape,
					     desc->shape.ndim);
		box_format(box, text, sizeof(text));
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': box %s is outside its shape %s",
				     desc->name, text, shape);
	}
	*box_out = *box;
	return FLOW_OK;
}

/* ---- the catalog: tensors and their shards ---------------------------------- */

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

typedef struct catalog {
	ckpt_tensor_t *tensors;
	size_t ntensors, tcap;
	ckpt_shard_t *shards;
	size_t nshards, scap;
	size_t *slots; /* open addressing by name: tensor index + 1, 0 empty */
	size_t nslots;
} catalog_t;

static void cat_release(catalog_t *c)
{
	free(c->tensors);
	free(c->shards);
	free(c->slots);
	memset(c, 0, sizeof(*c));
}

static bool grow(void **ptr, size_t *cap, size_t need, size_t elsize)
{
	if (need <= *cap)
		return true;
	size_t ncap = *cap ? *cap : 16, bytes;
	while (ncap < need)
		if (!flow_mul_size(ncap, 2, &ncap))
			return false;
	if (!flow_mul_size(ncap, elsize, &bytes))
		return false;
	void *n = realloc(*ptr, bytes);
	if (!n)
		return false;
	*ptr = n;
	*cap = ncap;
	return true;
}

static uint64_t name_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return h;
}

static long cat_find(const catalog_t *c, const char *name)
{
	if (!c->nslots)
		return -1;
	size_t mask = c->nslots - 1;
	for (size_t i = (size_t)name_hash(name) & mask;; i = (i + 1) & mask) {
		size_t v = c->slots[i];
		if (!v)
			return -1;
		if (strcmp(c->tensors[v - 1].desc.name, name) == 0)
			return (long)(v - 1);
	}
}

static void slot_insert(size_t *slots, size_t nslots, const char *name,
			size_t index)
{
	size_t mask = nslots - 1;
	size_t i = (size_t)name_hash(name) & mask;
	while (slots[i])
		i = (i + 1) & mask;
	slots[i] = index + 1;
}

/* Append a tensor whose name is not in the catalog yet. */
static flow_err_t cat_add_tensor(catalog_t *c, const ckpt_tensor_t *t,
				 flow_diag_t *diag)
{
	if (!grow((void **)&c->tensors, &c->tcap, c->ntensors + 1,
		  sizeof(*c->tensors)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	/* Keep the table at most half full. */
	if (2 * (c->ntensors + 1) > c->nslots) {
		size_t n = c->nslots ? 2 * c->nslots : 64;
		size_t *slots = calloc(n, sizeof(*slots));
		if (!slots)
			return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		for (size_t i = 0; i < c->ntensors; i++)
			slot_insert(slots, n, c->tensors[i].desc.name, i);
		free(c->slots);
		c->slots = slots;
		c->nslots = n;
	}
	c->tensors[c->ntensors] = *t;
	slot_insert(c->slots, c->nslots, t->desc.name, c->ntensors);
	c->ntensors++;
	return FLOW_OK;
}

static flow_err_t cat_add_shard(catalog_t *c, const ckpt_shard_t *s,
				flow_diag_t *diag)
{
	if (!grow((void **)&c->shards, &c->scap, c->nshards + 1,
		  sizeof(*c->shards)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	c->shards[c->nshards++] = *s;
	return FLOW_OK;
}

/* ---- where a record is: for messages ------------------------------------------ */

/* Records come from the manifest (manifest != NULL) or, when committing,
 * from the index of the rank that holds them. */
typedef struct where {
	const char *manifest;
	const char *dir;
} where_t;

static void where_at(const where_t *w, uint32_t rank, size_t line, char *buf,
		     size_t cap)
{
	if (w->manifest) {
		snprintf(buf, cap, "%s:%zu", w->manifest, line);
	} else {
		char name[32];
		rank_file_name(name, sizeof(name), rank, "idx");
		size_t dlen = strlen(w->dir);
		while (dlen > 1 && w->dir[dlen - 1] == '/')
			dlen--;
		snprintf(buf, cap, "%.*s/%s:%zu", (int)dlen, w->dir, name, line);
	}
}

/* A second location, short when it is in the same file. */
static void where_ref(const where_t *w, uint32_t rank, size_t line,
		      char *buf, size_t cap)
{
	if (w->manifest)
		snprintf(buf, cap, "line %zu", line);
	else
		where_at(w, rank, line, buf, cap);
}

/* ---- tiling ------------------------------------------------------------------- */

typedef struct tile_entry {
	ckpt_shard_t *s;
	size_t order; /* position in the tensor's shard list */
	int64_t key;  /* start along the sweep dimension */
} tile_entry_t;

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/* Sweep key first, then the whole box, then list order: equal boxes end
 * up adjacent with the first-listed one leading. */
static int cmp_tile(const void *a, const void *b)
{
	const tile_entry_t *x = a, *y = b;
	if (x->key != y->key)
		return (x->key > y->key) - (x->key < y->key);
	for (int d = 0; d < x->s->box.ndim; d++) {
		if (x->s->box.start[d] != y->s->box.start[d])
			return (x->s->box.start[d] > y->s->box.start[d]) -
			       (x->s->box.start[d] < y->s->box.start[d]);
		if (x->s->box.extent[d] != y->s->box.extent[d])
			return (x->s->box.extent[d] > y->s->box.extent[d]) -
			       (x->s->box.extent[d] < y->s->box.extent[d]);
	}
	return (x->order > y->order) - (x->order < y->order);
}

/* Check that tensor t's shards (boxes already inside its shape) tile it:
 * marks exact replicas on other ranks, then refuses a box listed twice
 * by one rank, two boxes that share elements, and gaps.  Boxes are
 * sorted along the dimension with the most distinct starts, so only
 * boxes whose ranges meet along it are compared. */
static flow_err_t check_tiling(catalog_t *c, size_t t, const where_t *w,
			       flow_err_t code, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	ckpt_tensor_t *tensor = &c->tensors[t];
	size_t n = tensor->count;
	char here[FLOW_DIAG_MAX / 2], there[FLOW_DIAG_MAX / 2];
	char abox[BOX_TEXT_MAX], bbox[BOX_TEXT_MAX];
	if (n == 0) {
		where_at(w, tensor->src_rank, tensor->line, here, sizeof(here));
		return flow_diag_set(diag, code, "%s: tensor '%s' has no shards",
				     here, tensor->desc.name);
	}
	int nd = tensor->desc.shape.ndim;
	tile_entry_t *e = NULL;
	int64_t *keys = NULL;
	size_t bytes;
	if (!flow_mul_size(n, sizeof(*e), &bytes) || !(e = malloc(bytes)) ||
	    !flow_mul_size(n, sizeof(*keys), &bytes) ||
	    !(keys = malloc(bytes))) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	int sweep = -1;
	size_t best = 0;
	for (int d = 0; d < nd; d++) {
		for (size_t i = 0; i < n; i++)
			keys[i] = c->shards[tensor->first + i].box.start[d];
		qsort(keys, n, sizeof(*keys), cmp_i64);
		size_t distinct = 1;
		for (size_t i = 1; i < n; i++)
			distinct += keys[i] != keys[i - 1];
		if (sweep < 0 || distinct > best) {
			sweep = d;
			best = distinct;
		}
	}
	for (size_t i = 0; i < n; i++) {
		e[i].s = &c->shards[tensor->first + i];
		e[i].s->replica = false;
		e[i].order = i;
		e[i].key = sweep < 0 ? 0 : e[i].s->box.start[sweep];
	}
	qsort(e, n, sizeof(*e), cmp_tile);

	/* Replicas: the first-listed box of each run of equal boxes is read. */
	for (size_t g = 0; g < n;) {
		size_t end = g + 1;
		while (end < n && flow_box_equal(&e[end].s->box, &e[g].s->box))
			end++;
		/* One rank twice in the run?  Sorting its ranks finds out in
		 * O(g log g); only then are pairs searched for the message. */
		bool twice = false;
		for (size_t i = g; i < end; i++)
			keys[i - g] = e[i].s->rank;
		qsort(keys, end - g, sizeof(*keys), cmp_i64);
		for (size_t i = 1; i < end - g && !twice; i++)
			twice = keys[i] == keys[i - 1];
		for (size_t i = g + 1; i < end; i++) {
			for (size_t j = g; twice && j < i; j++) {
				if (e[j].s->rank != e[i].s->rank)
					continue;
				const tile_entry_t *late = e[i].order > e[j].order ?
							   &e[i] : &e[j];
				const tile_entry_t *early = late == &e[i] ?
							    &e[j] : &e[i];
				where_at(w, late->s->rank, late->s->line, here,
					 sizeof(here));
				where_ref(w, early->s->rank, early->s->line,
					  there, sizeof(there));
				box_format(&late->s->box, abox, sizeof(abox));
				err = flow_diag_set(diag, code,
						    "%s: shard box %s of tensor '%s' is listed twice for rank %" PRIu32 " (also %s)",
						    here, abox, tensor->desc.name,
						    late->s->rank, there);
				goto out_free;
			}
			e[i].s->replica = true;
		}
		g = end;
	}

	/* Overlaps between the boxes that are read. */
	for (size_t i = 0; i < n; i++) {
		if (e[i].s->replica)
			continue;
		int64_t hi = sweep < 0 ? 0 :
			     e[i].s->box.start[sweep] + e[i].s->box.extent[sweep];
		for (size_t j = i + 1; j < n; j++) {
			flow_box_t cut;
			if (sweep >= 0 && e[j].key >= hi)
				break;
			if (e[j].s->replica ||
			    !flow_box_intersect(&e[i].s->box, &e[j].s->box, &cut))
				continue;
			const tile_entry_t *late = e[i].order > e[j].order ?
						   &e[i] : &e[j];
			const tile_entry_t *early = late == &e[i] ? &e[j] : &e[i];
			where_at(w, late->s->rank, late->s->line, here,
				 sizeof(here));
			where_ref(w, early->s->rank, early->s->line, there,
				  sizeof(there));
			box_format(&late->s->box, abox, sizeof(abox));
			box_format(&early->s->box, bbox, sizeof(bbox));
			err = flow_diag_set(diag, code,
					    "%s: shard box %s of tensor '%s' overlaps box %s (%s)",
					    here, abox, tensor->desc.name, bbox,
					    there);
			goto out_free;
		}
	}

	/* Disjoint boxes inside the shape tile it when their volumes add up. */
	uint64_t covered = 0, numel = 1;
	for (size_t i = 0; i < n; i++)
		if (!e[i].s->replica)
			covered += (uint64_t)flow_box_numel(&e[i].s->box);
	for (int d = 0; d < nd; d++)
		numel *= (uint64_t)tensor->desc.shape.dims[d];
	if (covered != numel) {
		where_at(w, tensor->src_rank, tensor->line, here, sizeof(here));
		err = flow_diag_set(diag, code,
				    "%s: the shards of tensor '%s' cover %" PRIu64 " of its %" PRIu64 " elements (gaps between the boxes)",
				    here, tensor->desc.name, covered, numel);
	}

out_free:
	free(keys);
	free(e);
	return err;
}

/* ---- data files: present and long enough ------------------------------------------ */

static int cmp_shard_rank(const void *a, const void *b)
{
	const ckpt_shard_t *x = *(ckpt_shard_t *const *)a;
	const ckpt_shard_t *y = *(ckpt_shard_t *const *)b;
	if (x->rank != y->rank)
		return (x->rank > y->rank) - (x->rank < y->rank);
	return (x > y) - (x < y);
}

/* Each rank's data file exists and holds the end of its last shard.  One
 * stat per file: the shards are grouped by rank first. */
static flow_err_t check_files(const catalog_t *c, const char *dir,
			      const where_t *w, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	const ckpt_shard_t **order = NULL;
	char *path = NULL;
	char here[FLOW_DIAG_MAX / 2];
	size_t bytes;
	if (!c->nshards)
		return FLOW_OK;
	if (!flow_mul_size(c->nshards, sizeof(*order), &bytes) ||
	    !(order = malloc(bytes)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < c->nshards; i++)
		order[i] = &c->shards[i];
	qsort(order, c->nshards, sizeof(*order), cmp_shard_rank);
	for (size_t g = 0; g < c->nshards;) {
		const ckpt_shard_t *first = order[g], *last = order[g];
		size_t end = g;
		for (; end < c->nshards && order[end]->rank == first->rank;
		     end++) {
			if (order[end]->offset + order[end]->length >
			    last->offset + last->length)
				last = order[end];
			if (order[end]->line < first->line)
				first = order[end];
		}
		free(path);
		if (!(path = rank_path(dir, first->rank, "bin"))) {
			err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
			goto out_free;
		}
		struct stat st;
		if (stat(path, &st) != 0) {
			where_at(w, first->rank, first->line, here, sizeof(here));
			if (errno == ENOENT)
				err = flow_diag_set(diag, FLOW_ERR_FORMAT,
						    "%s: shard file '%s' is missing",
						    here, path);
			else
				err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
						      "%s: cannot stat shard file '%s'",
						      here, path);
			goto out_free;
		}
		if (!S_ISREG(st.st_mode)) {
			where_at(w, first->rank, first->line, here, sizeof(here));
			err = flow_diag_set(diag, FLOW_ERR_FORMAT,
					    "%s: shard file '%s' is not a regular file",
					    here, path);
			goto out_free;
		}
		uint64_t need = last->offset + last->length;
		if ((uint64_t)st.st_size < need) {
			where_at(w, last->rank, last->line, here, sizeof(here));
			err = flow_diag_set(diag, FLOW_ERR_FORMAT,
					    "%s: shard file '%s' is shorter than offset+length: %" PRIu64 " bytes, the shard ends at byte %" PRIu64,
					    here, path, (uint64_t)st.st_size,
					    need);
			goto out_free;
		}
		g = end;
	}
out_free:
	free(path);
	free(order);
	return err;
}

/* ---- parsing the manifest and the indexes ------------------------------------------ */

typedef enum { DOC_MANIFEST, DOC_INDEX } doc_kind_t;

typedef struct doc {
	doc_kind_t kind;
	const char *path;
	const char *dir;
	uint32_t rank;          /* DOC_INDEX: the rank the file must be for */
	uint64_t step;          /* DOC_MANIFEST */
	flow_ckpt_kv_t *kv;     /* DOC_MANIFEST: pointers into the text */
	size_t nkv, kvcap;
	catalog_t cat;
} doc_t;

static const flow_textrec_format_t ckpt_format = {
	.sep = FLOW_TEXTREC_SEP_SPACE,
	.end_key = "end",
	.lowercase_sums = true,
	.hint_causes = true,
};

enum { S_MAGIC, S_HEAD, S_BODY, S_END };

/* "tensor NAME DTYPE SHAPE MESH SBP" */
static flow_err_t parse_tensor(flow_textrec_t *p, doc_t *doc, long *cur,
			       flow_diag_t *diag)
{
	flow_err_t err;
	if ((err = flow_textrec_expect_fields(p, 6,
					      "tensor NAME DTYPE SHAPE MESH SBP")) != FLOW_OK)
		return err;
	ckpt_tensor_t t;
	memset(&t, 0, sizeof(t));
	const char *name = p->fields[1];
	if (strlen(name) >= FLOW_CKPT_NAME_MAX)
		return flow_textrec_error(p, "tensor name '%.32s...' is longer than %d bytes",
					  name, FLOW_CKPT_NAME_MAX - 1);
	if (!valid_token(name))
		return flow_textrec_error(p, "invalid tensor name '%s'", name);
	long prev = cat_find(&doc->cat, name);
	if (prev >= 0)
		return flow_textrec_error(p, "duplicate tensor '%s' (first on line %zu)",
					  name, doc->cat.tensors[prev].line);
	memcpy(t.desc.name, name, strlen(name) + 1);
	flow_diag_t inner = FLOW_DIAG_INIT;
	const char *dname;
	if (flow_dtype_parse(p->fields[2], &t.desc.dtype, &inner) != FLOW_OK ||
	    !(dname = flow_dtype_name(t.desc.dtype)) ||
	    strcmp(dname, p->fields[2]) != 0)
		return flow_textrec_error(p, "unknown dtype '%s' (expected f32, bf16, f16, i32, i64, u16, u8 or u32)",
					  p->fields[2]);
	char shape[SHAPE_TEXT_MAX];
	if (flow_shape_parse(p->fields[3], &t.desc.shape, &inner) != FLOW_OK ||
	    flow_shape_format(&t.desc.shape, shape, sizeof(shape)) >= sizeof(shape) ||
	    strcmp(shape, p->fields[3]) != 0)
		return flow_textrec_error(p, "invalid shape '%s' (expected '(D,D,...)' or '()')",
					  p->fields[3]);
	size_t bytes;
	if (!desc_bytes(&t.desc, &bytes))
		return flow_textrec_error(p, "shape %s of tensor '%s' is too large",
					  p->fields[3], name);
	if (strlen(p->fields[4]) >= FLOW_CKPT_TEXT_MAX)
		return flow_textrec_error(p, "mesh '%.32s...' is longer than %d bytes",
					  p->fields[4], FLOW_CKPT_TEXT_MAX - 1);
	if (strlen(p->fields[5]) >= FLOW_CKPT_TEXT_MAX)
		return flow_textrec_error(p, "SBP '%.32s...' is longer than %d bytes",
					  p->fields[5], FLOW_CKPT_TEXT_MAX - 1);
	if (!valid_token(p->fields[4]))
		return flow_textrec_error(p, "invalid mesh '%s'",
					  p->fields[4]);
	if (!valid_token(p->fields[5]))
		return flow_textrec_error(p, "invalid SBP '%s'",
					  p->fields[5]);
	memcpy(t.desc.mesh, p->fields[4], strlen(p->fields[4]) + 1);
	memcpy(t.desc.sbp, p->fields[5], strlen(p->fields[5]) + 1);
	t.line = p->line;
	t.src_rank = doc->rank;
	t.first = doc->cat.nshards;
	t.count = 0;
	if ((err = cat_add_tensor(&doc->cat, &t, diag)) != FLOW_OK)
		return err;
	*cur = (long)doc->cat.ntensors - 1;
	return FLOW_OK;
}

/* "shard NAME RANK BOX FILE OFFSET LENGTH XXH3" */
static flow_err_t parse_shard(flow_textrec_t *p, doc_t *doc, long cur,
			      flow_diag_t *diag)
{
	flow_err_t err;
	if ((err = flow_textrec_expect_fields(p, 8,
					      "shard NAME RANK BOX FILE OFFSET LENGTH XXH3")) != FLOW_OK)
		return err;
	const char *name = p->fields[1];
	if (cur < 0 || strcmp(doc->cat.tensors[cur].desc.name, name) != 0) {
		long t = cat_find(&doc->cat, name);
		if (t >= 0)
			return flow_textrec_error(p, "shard of tensor '%s' does not follow its tensor line (line %zu)",
						  name, doc->cat.tensors[t].line);
		return flow_textrec_error(p, "shard of tensor '%s' before its tensor line",
					  name);
	}
	ckpt_tensor_t *t = &doc->cat.tensors[cur];
	ckpt_shard_t s;
	memset(&s, 0, sizeof(s));
	uint64_t v = 0;
	if ((err = flow_textrec_field_u64(p, 2, "rank", 0, UINT32_MAX, &v)) != FLOW_OK)
		return err;
	s.rank = (uint32_t)v;
	if (doc->kind == DOC_INDEX && s.rank != doc->rank)
		return flow_textrec_error(p, "shard of rank %" PRIu32 " in the index of rank %" PRIu32,
					  s.rank, doc->rank);
	if (!box_parse(p->fields[3], &s.box))
		return flow_textrec_error(p, "invalid shard box '%s' (expected START:END per dimension, comma separated, or '-')",
					  p->fields[3]);
	char shape[SHAPE_TEXT_MAX];
	flow_shape_format(&t->desc.shape, shape, sizeof(shape));
	if (s.box.ndim != t->desc.shape.ndim)
		return flow_textrec_error(p, "shard box %s has %d dimensions, tensor '%s' has %d %s",
					  p->fields[3], s.box.ndim, name,
					  t->desc.shape.ndim, shape);
	if (!flow_box_inside(&s.box, &t->desc.shape))
		return flow_textrec_error(p, "shard box %s exceeds %s",
					  p->fields[3], shape);
	char want[32];
	rank_file_name(want, sizeof(want), s.rank, "bin");
	if (strcmp(p->fields[4], want) != 0)
		return flow_textrec_error(p, "expected shard file '%s', got '%s'",
					  want, p->fields[4]);
	if ((err = flow_textrec_field_u64(p, 5, "shard offset", 0, INT64_MAX, &s.offset)) != FLOW_OK ||
	    (err = flow_textrec_field_u64(p, 6, "shard length", 0, INT64_MAX, &s.length)) != FLOW_OK)
		return err;
	if (s.offset % SHARD_ALIGN)
		return flow_textrec_error(p, "shard offset %" PRIu64 " is not a multiple of %u",
					  s.offset, SHARD_ALIGN);
	uint64_t expect = (uint64_t)flow_box_numel(&s.box) * flow_dtype_size(t->desc.dtype);
	if (s.length != expect)
		return flow_textrec_error(p, "shard length %" PRIu64 " does not match box %s (%" PRIu64 " bytes of %s)",
					  s.length, p->fields[3], expect,
					  flow_dtype_name(t->desc.dtype));
	if (s.offset > (uint64_t)INT64_MAX - s.length)
		return flow_textrec_error(p, "shard offset %" PRIu64 " + length %" PRIu64 " overflows",
					  s.offset, s.length);
	if ((err = flow_textrec_field_sum(p, 7, &s.sum)) != FLOW_OK)
		return err;
	s.line = p->line;
	if ((err = cat_add_shard(&doc->cat, &s, diag)) != FLOW_OK)
		return err;
	t->count++;
	return FLOW_OK;
}

/* "state KEY VALUE": VALUE is the rest of the line (empty: "state KEY"). */
static flow_err_t parse_state(flow_textrec_t *p, doc_t *doc, char *line,
			      flow_diag_t *diag)
{
	char *key = line + strlen("state ");
	char *sp = strchr(key, ' ');
	char *value = "";
	if (sp) {
		*sp = '\0';
		value = sp + 1;
	}
	if (!valid_key(key))
		return flow_textrec_error(p, "invalid state key '%s' (expected [A-Za-z0-9_.-]+)",
					  key);
	if (!valid_value(value))
		return flow_textrec_error(p, "state '%s': the value holds a control character",
					  key);
	for (size_t i = 0; i < doc->nkv; i++)
		if (strcmp(doc->kv[i].key, key) == 0)
			return flow_textrec_error(p, "duplicate state key '%s'",
						  key);
	if (!grow((void **)&doc->kv, &doc->kvcap, doc->nkv + 1,
		  sizeof(*doc->kv)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	doc->kv[doc->nkv].key = key;
	doc->kv[doc->nkv].value = value;
	doc->nkv++;
	return FLOW_OK;
}

/* The tensor being listed is complete: it has shards and, in a manifest,
 * they tile it. */
static flow_err_t close_tensor(flow_textrec_t *p, doc_t *doc, long cur,
			       flow_diag_t *diag)
{
	if (cur < 0)
		return FLOW_OK;
	const ckpt_tensor_t *t = &doc->cat.tensors[cur];
	if (t->count == 0) {
		p->line = t->line;
		return flow_textrec_error(p, "tensor '%s' has no shard lines",
					  t->desc.name);
	}
	if (doc->kind != DOC_MANIFEST)
		return FLOW_OK;
	where_t w = { .manifest = doc->path, .dir = doc->dir };
	return check_tiling(&doc->cat, (size_t)cur, &w, FLOW_ERR_FORMAT, diag);
}

/* Parse a manifest or an index (text is cut into fields in place). */
static flow_err_t parse_doc(doc_t *doc, char *text, size_t len,
			    flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	flow_textrec_t p;
	const bool manifest = doc->kind == DOC_MANIFEST;
	const char *magic = manifest ? CKPT_MAGIC : INDEX_MAGIC;
	if ((err = flow_textrec_init(&p, &ckpt_format, doc->path, text, len,
				     diag)) != FLOW_OK)
		goto out_release_reader;
	int state = S_MAGIC;
	long cur = -1;
	char *line;
	size_t n;
	int got;
	while ((got = flow_textrec_next(&p, &line, &n)) > 0) {
		if (state == S_END) {
			err = flow_textrec_error(&p, "unexpected line after 'end'");
			goto out_release_reader;
		}
		/* Every record is printable ASCII, so messages quoting a
		 * field never carry control or stray bytes. */
		for (size_t i = 0; i < n; i++) {
			unsigned char ch = (unsigned char)line[i];
			if (ch < ' ' || ch >= 0x7f) {
				err = flow_textrec_error(&p, "byte 0x%02x in column %zu is not printable ASCII",
							 ch, i + 1);
				goto out_release_reader;
			}
		}
		if (manifest && state == S_BODY && strncmp(line, "state ", 6) == 0) {
			if (cur >= 0) {
				err = flow_textrec_error(&p, "state line after the first tensor line");
				goto out_release_reader;
			}
			if ((err = parse_state(&p, doc, line, diag)) != FLOW_OK)
				goto out_release_reader;
			continue;
		}
		if ((err = flow_textrec_split(&p, line)) != FLOW_OK)
			goto out_release_reader;
		const char *rec = p.fields[0];
		uint64_t v = 0;
		switch (state) {
		case S_MAGIC:
			if (strcmp(rec, magic) != 0 || p.nfields != 2) {
				err = flow_textrec_error(&p, "expected '%s %d', got '%.40s'",
							 magic, FLOW_CKPT_FORMAT_VERSION,
							 rec);
				goto out_release_reader;
			}
			if ((err = flow_textrec_field_u64(&p, 1, "format version", 0, UINT64_MAX,
					     &v)) != FLOW_OK)
				goto out_release_reader;
			if (v != FLOW_CKPT_FORMAT_VERSION) {
				err = flow_textrec_error(&p, "unsupported checkpoint format version %" PRIu64 " (expected %d)",
							 v, FLOW_CKPT_FORMAT_VERSION);
				goto out_release_reader;
			}
			state = S_HEAD;
			break;
		case S_HEAD:
			if (manifest) {
				if (strcmp(rec, "step") != 0) {
					err = flow_textrec_error(&p, "expected 'step N', got '%.40s'",
								 rec);
					goto out_release_reader;
				}
				if ((err = flow_textrec_expect_fields(&p, 2,
								      "step N")) != FLOW_OK ||
				    (err = flow_textrec_field_u64(&p, 1, "step", 0, UINT64_MAX,
						     &doc->step)) != FLOW_OK)
					goto out_release_reader;
			} else {
				if (strcmp(rec, "rank") != 0) {
					err = flow_textrec_error(&p, "expected 'rank R', got '%.40s'",
								 rec);
					goto out_release_reader;
				}
				if ((err = flow_textrec_expect_fields(&p, 2,
								      "rank R")) != FLOW_OK ||
				    (err = flow_textrec_field_u64(&p, 1, "rank", 0, UINT32_MAX,
						     &v)) != FLOW_OK)
					goto out_release_reader;
				if (v != doc->rank) {
					err = flow_textrec_error(&p, "index of rank %" PRIu64 ", expected rank %" PRIu32,
								 v, doc->rank);
					goto out_release_reader;
				}
			}
			state = S_BODY;
			break;
		case S_BODY:
			if (strcmp(rec, "tensor") == 0) {
				if ((err = close_tensor(&p, doc, cur, diag)) != FLOW_OK ||
				    (err = parse_tensor(&p, doc, &cur, diag)) != FLOW_OK)
					goto out_release_reader;
			} else if (strcmp(rec, "shard") == 0) {
				if ((err = parse_shard(&p, doc, cur, diag)) != FLOW_OK)
					goto out_release_reader;
			} else if (strcmp(rec, "end") == 0) {
				uint64_t stored;
				if ((err = flow_textrec_expect_fields(&p, 2,
								      "end XXH3")) != FLOW_OK ||
				    (err = flow_textrec_field_sum(&p, 1, &stored)) != FLOW_OK ||
				    (err = flow_textrec_verify_end(&p, stored)) != FLOW_OK)
					goto out_release_reader;
				size_t end_line = p.line;
				if ((err = close_tensor(&p, doc, cur, diag)) != FLOW_OK)
					goto out_release_reader;
				p.line = end_line;
				state = S_END;
			} else if (strcmp(rec, "state") == 0 && manifest) {
				err = flow_textrec_error(&p, "expected 'state KEY VALUE', got a bare 'state'");
				goto out_release_reader;
			} else {
				err = flow_textrec_error(&p, "unknown record '%.40s' (expected %s)",
							 rec,
							 manifest ? "state, tensor, shard or end" :
								    "tensor, shard or end");
				goto out_release_reader;
			}
			break;
		}
	}
	if (got < 0) {
		err = (flow_err_t)got;
		goto out_release_reader;
	}
	if (state != S_END) {
		static const char *const want_manifest[] = {
			"flow-checkpoint 1", "step N", "end XXH3",
		};
		static const char *const want_index[] = {
			"flow-checkpoint-index 1", "rank R", "end XXH3",
		};
		err = flow_textrec_error_eof(&p, manifest ? want_manifest[state] :
							    want_index[state]);
	}
out_release_reader:
	flow_textrec_release(&p);
	return err;
}

static void doc_release(doc_t *doc)
{
	cat_release(&doc->cat);
	free(doc->kv);
	doc->kv = NULL;
	doc->nkv = doc->kvcap = 0;
}

/* ---- writing text ------------------------------------------------------------------ */

static void sb_tensor(flow_textrec_buf_t *sb,
		      const flow_ckpt_tensor_desc_t *desc)
{
	char rest[DESC_TEXT_MAX];
	desc_format(desc, rest, sizeof(rest));
	flow_textrec_printf(sb, "tensor %s %s\n", desc->name, rest);
}

static void sb_shard(flow_textrec_buf_t *sb, const char *name,
		     const ckpt_shard_t *s)
{
	char box[BOX_TEXT_MAX], hex[17], file[32];
	box_format(&s->box, box, sizeof(box));
	flow_checksum_format(s->sum, hex);
	rank_file_name(file, sizeof(file), s->rank, "bin");
	flow_textrec_printf(sb, "shard %s %" PRIu32 " %s %s %" PRIu64 " %" PRIu64 " %s\n",
			    name, s->rank, box, file, s->offset, s->length,
			    hex);
}

/* ---- paths ---------------------------------------------------------------------- */

char *flow_ckpt_step_path(const char *ckpt_dir, uint64_t step)
{
	char name[32];
	snprintf(name, sizeof(name), "step-%08" PRIu64, step);
	return path_join(ckpt_dir, name);
}

/* mkdir -p. */
static flow_err_t make_dirs(const char *path, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	char *p = strdup(path);
	if (!p)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	for (char *s = p + 1;; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char c = *s;
		*s = '\0';
		if (mkdir(p, 0755) != 0 && errno != EEXIST) {
			err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
					      "cannot create directory '%s'", p);
			goto out_free;
		}
		*s = c;
		if (!c)
			break;
	}
	struct stat st;
	if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
		err = flow_diag_set(diag, FLOW_ERR_IO,
				    "cannot create directory '%s': not a directory",
				    path);
out_free:
	free(p);
	return err;
}

/* fsync the directory that holds dir (dir itself is a directory). */
static flow_err_t fsync_parent(const char *dir, flow_diag_t *diag)
{
	char *p = strdup(dir);
	if (!p)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	size_t n = strlen(p);
	while (n > 1 && p[n - 1] == '/')
		p[--n] = '\0';
	char *slash = strrchr(p, '/');
	const char *parent = p;
	if (!slash)
		parent = ".";
	else if (slash == p)
		p[1] = '\0';
	else
		*slash = '\0';
	flow_err_t err = flow_fsync_dir(parent, diag);
	free(p);
	return err;
}

/* unlink path; *removed set when it existed. */
static flow_err_t remove_file(const char *path, bool *removed,
			      flow_diag_t *diag)
{
	if (unlink(path) == 0) {
		*removed = true;
		return FLOW_OK;
	}
	if (errno == ENOENT)
		return FLOW_OK;
	return flow_diag_errno(diag, FLOW_ERR_IO, errno, "cannot remove '%s'",
			       path);
}

/* ---- the writer -------------------------------------------------------------------- */

struct flow_ckpt_writer {
	char *dir;
	char *bin_path;
	char *idx_path;
	uint32_t rank;
	flow_atomic_file_t *bin;
	uint64_t pos;   /* bytes written to the data file */
	bool failed;    /* a write failed: the data file is unusable */
	catalog_t cat;  /* tensors in order of their first shard; shards in
			 * order of writing, each with its tensor index */
};

static void writer_destroy(flow_ckpt_writer_t *w)
{
	cat_release(&w->cat);
	free(w->idx_path);
	free(w->bin_path);
	free(w->dir);
	free(w);
}

flow_err_t flow_ckpt_writer_new(const char *step_dir, uint32_t rank,
				flow_ckpt_writer_t **writer_out,
				flow_diag_t *diag)
{
	flow_err_t err;
	char *manifest = NULL;
	if (!host_is_little_endian())
		return flow_diag_set(diag, FLOW_ERR_NOTSUP,
				     "checkpoints need a little-endian host");
	flow_ckpt_writer_t *w = calloc(1, sizeof(*w));
	if (!w)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	w->rank = rank;
	if (!(w->dir = strdup(step_dir)) ||
	    !(w->bin_path = rank_path(step_dir, rank, "bin")) ||
	    !(w->idx_path = rank_path(step_dir, rank, "idx")) ||
	    !(manifest = path_join(step_dir, "manifest"))) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	if ((err = make_dirs(step_dir, diag)) != FLOW_OK)
		goto out_free;
	/* Uncommit first: from here on, no manifest names data that is
	 * being replaced.  This rank's old index goes too, so an index
	 * never describes a data file other than the one written with it. */
	bool removed = false;
	if ((err = remove_file(manifest, &removed, diag)) != FLOW_OK ||
	    (err = remove_file(w->idx_path, &removed, diag)) != FLOW_OK)
		goto out_free;
	if (removed && (err = flow_fsync_dir(step_dir, diag)) != FLOW_OK)
		goto out_free;
	if ((err = flow_atomic_file_open(w->bin_path, &w->bin, diag)) != FLOW_OK)
		goto out_free;
	free(manifest);
	*writer_out = w;
	return FLOW_OK;

out_free:
	free(manifest);
	writer_destroy(w);
	return err;
}

flow_err_t flow_ckpt_writer_add(flow_ckpt_writer_t *w,
				const flow_ckpt_tensor_desc_t *desc,
				const flow_box_t *box, const void *data,
				flow_diag_t *diag)
{
	static const unsigned char zeros[SHARD_ALIGN];
	flow_err_t err;
	if (w->failed)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot add to '%s': an earlier write to it failed",
				     w->bin_path);
	if ((err = desc_check(desc, diag)) != FLOW_OK)
		return err;
	flow_box_t want;
	if ((err = caller_box(desc, box, &want, diag)) != FLOW_OK)
		return err;
	box = &want;
	long t = cat_find(&w->cat, desc->name);
	if (t >= 0 && !desc_equal(&w->cat.tensors[t].desc, desc)) {
		char a[DESC_TEXT_MAX], b[DESC_TEXT_MAX];
		desc_format(&w->cat.tensors[t].desc, a, sizeof(a));
		desc_format(desc, b, sizeof(b));
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s' added as '%s' and as '%s'",
				     desc->name, a, b);
	}
	/* Inside a shape whose bytes fit, so this cannot overflow. */
	size_t len = (size_t)(uint64_t)flow_box_numel(box) * flow_dtype_size(desc->dtype);
	if (len && !data)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': no data for %zu bytes",
				     desc->name, len);
	if (!data)
		data = zeros;
	uint64_t offset = (w->pos + SHARD_ALIGN - 1) / SHARD_ALIGN * SHARD_ALIGN;
	/* From here on a failure leaves the catalog or the data file out of
	 * step with each other: the writer can only be aborted. */
	if (t < 0) {
		ckpt_tensor_t nt;
		memset(&nt, 0, sizeof(nt));
		nt.desc = *desc;
		if ((err = cat_add_tensor(&w->cat, &nt, diag)) != FLOW_OK)
			goto out_mark_failed;
		t = (long)w->cat.ntensors - 1;
	}
	ckpt_shard_t s;
	memset(&s, 0, sizeof(s));
	s.box = *box;
	s.offset = offset;
	s.length = len;
	s.sum = flow_checksum(data, len);
	s.rank = w->rank;
	s.tensor = (size_t)t;
	if ((err = cat_add_shard(&w->cat, &s, diag)) != FLOW_OK)
		goto out_mark_failed;
	w->cat.tensors[t].count++;
	if ((err = flow_atomic_file_write(w->bin, zeros,
					  (size_t)(offset - w->pos), diag)) != FLOW_OK ||
	    (err = flow_atomic_file_write(w->bin, data, len, diag)) != FLOW_OK)
		goto out_mark_failed;
	w->pos = offset + len;
	return FLOW_OK;

out_mark_failed:
	w->failed = true;
	return err;
}

/* The index text: each tensor once, followed by its shards in the order
 * they were written. */
static flow_err_t writer_index(flow_ckpt_writer_t *w, flow_textrec_buf_t *sb,
			       flow_diag_t *diag)
{
	catalog_t *c = &w->cat;
	size_t *at = NULL, bytes;
	const ckpt_shard_t **order = NULL;
	if ((c->ntensors &&
	     (!flow_mul_size(c->ntensors, sizeof(*at), &bytes) ||
	      !(at = malloc(bytes)))) ||
	    (c->nshards &&
	     (!flow_mul_size(c->nshards, sizeof(*order), &bytes) ||
	      !(order = malloc(bytes))))) {
		free(at);
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	}
	size_t pos = 0;
	for (size_t t = 0; t < c->ntensors; t++) {
		at[t] = pos;
		pos += c->tensors[t].count;
	}
	for (size_t i = 0; i < c->nshards; i++)
		order[at[c->shards[i].tensor]++] = &c->shards[i];
	flow_textrec_printf(sb, "%s %d\nrank %" PRIu32 "\n", INDEX_MAGIC,
			    FLOW_CKPT_FORMAT_VERSION, w->rank);
	pos = 0;
	for (size_t t = 0; t < c->ntensors; t++) {
		sb_tensor(sb, &c->tensors[t].desc);
		for (size_t i = 0; i < c->tensors[t].count; i++)
			sb_shard(sb, c->tensors[t].desc.name, order[pos++]);
	}
	flow_textrec_seal(sb, &ckpt_format);
	free(order);
	free(at);
	if (sb->failed)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	return FLOW_OK;
}

flow_err_t flow_ckpt_writer_finish(flow_ckpt_writer_t *w, flow_diag_t *diag)
{
	flow_err_t err;
	flow_textrec_buf_t sb = FLOW_TEXTREC_BUF_INIT;
	if (w->failed) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "cannot finish '%s': an earlier write to it failed",
				    w->bin_path);
		goto out_abort;
	}
	if ((err = writer_index(w, &sb, diag)) != FLOW_OK)
		goto out_abort;
	flow_atomic_file_t *bin = w->bin;
	w->bin = NULL;
	if ((err = flow_atomic_file_commit(bin, diag)) != FLOW_OK)
		goto out_free;
	/* The index goes last: its presence says the data file is whole.
	 * Without it the data file belongs to no checkpoint: remove it. */
	if ((err = flow_file_write_atomic(w->idx_path, sb.buf, sb.len,
					  diag)) != FLOW_OK)
		unlink(w->bin_path);
	goto out_free;

out_abort:
	flow_atomic_file_abort(w->bin);
out_free:
	flow_textrec_buf_release(&sb);
	writer_destroy(w);
	return err;
}

void flow_ckpt_writer_abort(flow_ckpt_writer_t *w)
{
	if (!w)
		return;
	flow_atomic_file_abort(w->bin);
	writer_destroy(w);
}

/* ---- commit ----------------------------------------------------------------------- */

static flow_err_t check_state(const flow_ckpt_kv_t *kv, size_t nkv,
			      flow_diag_t *diag)
{
	for (size_t i = 0; i < nkv; i++) {
		if (!kv[i].key || !valid_key(kv[i].key))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "invalid state key '%s' (expected [A-Za-z0-9_.-]+)",
					     kv[i].key ? kv[i].key : "(null)");
		if (!kv[i].value || !valid_value(kv[i].value))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "state '%s': the value must be printable ASCII without newlines",
					     kv[i].key);
		for (size_t j = 0; j < i; j++)
			if (strcmp(kv[j].key, kv[i].key) == 0)
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "duplicate state key '%s'",
						     kv[i].key);
	}
	return FLOW_OK;
}

/* Merge the ranks' indexes: tensors in order of first appearance (rank 0
 * first), each tensor's shards in rank order. */
static flow_err_t merge_indexes(doc_t *docs, uint32_t nranks,
				const where_t *w, catalog_t *m,
				flow_diag_t *diag)
{
	flow_err_t err;
	size_t total = 0;
	for (uint32_t r = 0; r < nranks; r++) {
		const catalog_t *c = &docs[r].cat;
		total += c->nshards;
		for (size_t t = 0; t < c->ntensors; t++) {
			const ckpt_tensor_t *ct = &c->tensors[t];
			long i = cat_find(m, ct->desc.name);
			if (i < 0) {
				ckpt_tensor_t nt = *ct;
				nt.count = ct->count;
				if ((err = cat_add_tensor(m, &nt, diag)) != FLOW_OK)
					return err;
				continue;
			}
			ckpt_tensor_t *mt = &m->tensors[i];
			if (!desc_equal(&mt->desc, &ct->desc)) {
				char here[FLOW_DIAG_MAX / 2], there[FLOW_DIAG_MAX / 2];
				char a[DESC_TEXT_MAX], b[DESC_TEXT_MAX];
				where_at(w, r, ct->line, here, sizeof(here));
				where_at(w, mt->src_rank, mt->line, there,
					 sizeof(there));
				desc_format(&ct->desc, a, sizeof(a));
				desc_format(&mt->desc, b, sizeof(b));
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "%s: tensor '%s' is '%s' here but '%s' in %s",
						     here, ct->desc.name, a, b, there);
			}
			mt->count += ct->count;
		}
	}
	if (!grow((void **)&m->shards, &m->scap, total, sizeof(*m->shards)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	size_t pos = 0;
	for (size_t t = 0; t < m->ntensors; t++) {
		m->tensors[t].first = pos;
		pos += m->tensors[t].count;
		m->tensors[t].count = 0;
	}
	for (uint32_t r = 0; r < nranks; r++) {
		const catalog_t *c = &docs[r].cat;
		for (size_t t = 0; t < c->ntensors; t++) {
			const ckpt_tensor_t *ct = &c->tensors[t];
			ckpt_tensor_t *mt = &m->tensors[cat_find(m, ct->desc.name)];
			memcpy(&m->shards[mt->first + mt->count],
			       &c->shards[ct->first],
			       ct->count * sizeof(*m->shards));
			mt->count += ct->count;
		}
	}
	m->nshards = total;
	return FLOW_OK;
}

flow_err_t flow_ckpt_commit(const char *step_dir, uint64_t step,
			    uint32_t nranks, const flow_ckpt_kv_t *kv,
			    size_t nkv, flow_diag_t *diag)
{
	flow_err_t err;
	doc_t *docs = NULL;
	char *path = NULL, *text = NULL;
	catalog_t merged;
	flow_textrec_buf_t sb = FLOW_TEXTREC_BUF_INIT;
	memset(&merged, 0, sizeof(merged));
	where_t w = { .manifest = NULL, .dir = step_dir };
	if (nranks == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot commit '%s': no ranks", step_dir);
	if (nkv && !kv)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot commit '%s': no state array", step_dir);
	if ((err = check_state(kv, nkv, diag)) != FLOW_OK)
		return err;
	if (!(docs = calloc(nranks, sizeof(*docs))))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	for (uint32_t r = 0; r < nranks; r++) {
		size_t len;
		free(path);
		if (!(path = rank_path(step_dir, r, "idx"))) {
			err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
			goto out_free;
		}
		if ((err = flow_file_read_all(path, &text, &len, diag)) != FLOW_OK)
			goto out_free;
		docs[r].kind = DOC_INDEX;
		docs[r].path = path;
		docs[r].dir = step_dir;
		docs[r].rank = r;
		err = parse_doc(&docs[r], text, len, diag);
		docs[r].path = NULL;
		free(text);
		text = NULL;
		if (err != FLOW_OK)
			goto out_free;
		if ((err = check_files(&docs[r].cat, step_dir, &w, diag)) != FLOW_OK)
			goto out_free;
	}
	if ((err = merge_indexes(docs, nranks, &w, &merged, diag)) != FLOW_OK)
		goto out_free;
	for (size_t t = 0; t < merged.ntensors; t++)
		if ((err = check_tiling(&merged, t, &w, FLOW_ERR_USAGE,
					diag)) != FLOW_OK)
			goto out_free;

	flow_textrec_printf(&sb, "%s %d\nstep %" PRIu64 "\n", CKPT_MAGIC,
			    FLOW_CKPT_FORMAT_VERSION, step);
	for (size_t i = 0; i < nkv; i++) {
		if (kv[i].value[0])
			flow_textrec_printf(&sb, "state %s %s\n", kv[i].key,
					    kv[i].value);
		else
			flow_textrec_printf(&sb, "state %s\n", kv[i].key);
	}
	for (size_t t = 0; t < merged.ntensors; t++) {
		const ckpt_tensor_t *mt = &merged.tensors[t];
		sb_tensor(&sb, &mt->desc);
		for (size_t i = 0; i < mt->count; i++)
			sb_shard(&sb, mt->desc.name, &merged.shards[mt->first + i]);
	}
	flow_textrec_seal(&sb, &ckpt_format);
	if (sb.failed) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	free(path);
	if (!(path = path_join(step_dir, "manifest"))) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	/* Temp, fsync, rename, fsync the step directory; then make the step
	 * directory's own entry durable. */
	if ((err = flow_file_write_atomic(path, sb.buf, sb.len, diag)) != FLOW_OK)
		goto out_free;
	err = fsync_parent(step_dir, diag);

out_free:
	flow_textrec_buf_release(&sb);
	cat_release(&merged);
	for (uint32_t r = 0; r < nranks; r++)
		doc_release(&docs[r]);
	free(docs);
	free(text);
	free(path);
	return err;
}

/* ---- reading --------------------------------------------------------------------- */

struct flow_ckpt {
	char *dir;
	char *manifest_path;
	char *text; /* the manifest, cut up: the state lines point into it */
	uint64_t step;
	flow_ckpt_kv_t *kv;
	size_t nkv;
	catalog_t cat;
};

void flow_ckpt_free(flow_ckpt_t *ckpt)
{
	if (!ckpt)
		return;
	cat_release(&ckpt->cat);
	free(ckpt->kv);
	free(ckpt->text);
	free(ckpt->manifest_path);
	free(ckpt->dir);
	free(ckpt);
}

flow_err_t flow_ckpt_open(const char *step_dir, flow_ckpt_t **ckpt_out,
			  flow_diag_t *diag)
{
	flow_err_t err;
	size_t len;
	doc_t doc;
	memset(&doc, 0, sizeof(doc));
	if (!host_is_little_endian())
		return flow_diag_set(diag, FLOW_ERR_NOTSUP,
				     "checkpoints need a little-endian host");
	flow_ckpt_t *c = calloc(1, sizeof(*c));
	if (!c)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	if (!(c->dir = strdup(step_dir)) ||
	    !(c->manifest_path = path_join(step_dir, "manifest"))) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	struct stat st;
	if (stat(step_dir, &st) != 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot open checkpoint '%s'", step_dir);
		goto out_free;
	}
	if (!S_ISDIR(st.st_mode)) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "cannot open checkpoint '%s': not a directory",
				    step_dir);
		goto out_free;
	}
	if (stat(c->manifest_path, &st) != 0 && errno == ENOENT) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s is not a committed checkpoint (no manifest)",
				    step_dir);
		goto out_free;
	}
	if ((err = flow_file_read_all(c->manifest_path, &c->text, &len,
				      diag)) != FLOW_OK)
		goto out_free;
	doc.kind = DOC_MANIFEST;
	doc.path = c->manifest_path;
	doc.dir = step_dir;
	if ((err = parse_doc(&doc, c->text, len, diag)) != FLOW_OK)
		goto out_release;
	where_t w = { .manifest = c->manifest_path, .dir = step_dir };
	if ((err = check_files(&doc.cat, step_dir, &w, diag)) != FLOW_OK)
		goto out_release;
	c->step = doc.step;
	c->kv = doc.kv;
	c->nkv = doc.nkv;
	c->cat = doc.cat;
	*ckpt_out = c;
	return FLOW_OK;

out_release:
	doc_release(&doc);
out_free:
	flow_ckpt_free(c);
	return err;
}

uint64_t flow_ckpt_step(const flow_ckpt_t *ckpt)
{
	return ckpt->step;
}

const char *flow_ckpt_get(const flow_ckpt_t *ckpt, const char *key)
{
	for (size_t i = 0; i < ckpt->nkv; i++)
		if (strcmp(ckpt->kv[i].key, key) == 0)
			return ckpt->kv[i].value;
	return NULL;
}

size_t flow_ckpt_state(const flow_ckpt_t *ckpt, const flow_ckpt_kv_t **kv_out)
{
	*kv_out = ckpt->kv;
	return ckpt->nkv;
}

size_t flow_ckpt_tensor_count(const flow_ckpt_t *ckpt)
{
	return ckpt->cat.ntensors;
}

const flow_ckpt_tensor_desc_t *flow_ckpt_tensor_at(const flow_ckpt_t *ckpt,
						   size_t index)
{
	if (index >= ckpt->cat.ntensors)
		return NULL;
	return &ckpt->cat.tensors[index].desc;
}

int flow_ckpt_tensor_find(const flow_ckpt_t *ckpt, const char *name)
{
	long i = cat_find(&ckpt->cat, name);
	return i > INT32_MAX ? -1 : (int)i;
}

/* An open data file, reused while consecutive shards live in it. */
typedef struct data_file {
	int fd;
	uint32_t rank;
	char *path;
} data_file_t;

static void data_file_close(data_file_t *f)
{
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
	free(f->path);
	f->path = NULL;
}

static flow_err_t data_file_open(const flow_ckpt_t *c, data_file_t *f,
				 uint32_t rank, flow_diag_t *diag)
{
	if (f->fd >= 0 && f->rank == rank)
		return FLOW_OK;
	data_file_close(f);
	if (!(f->path = rank_path(c->dir, rank, "bin")))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
	if (f->fd < 0)
		return flow_diag_errno(diag, FLOW_ERR_IO, errno, "cannot open '%s'",
				       f->path);
	f->rank = rank;
	return FLOW_OK;
}

/* pread exactly len bytes at offset. */
static flow_err_t read_at(const data_file_t *f, void *buf, size_t len,
			  uint64_t offset, const char *tensor,
			  flow_diag_t *diag)
{
	size_t got = 0;
	while (got < len) {
		ssize_t n = pread(f->fd, (char *)buf + got, len - got,
				  (off_t)(offset + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return flow_diag_errno(diag, FLOW_ERR_IO, errno,
					       "%s: cannot read tensor '%s' at offset %" PRIu64,
					       f->path, tensor, offset + got);
		if (n == 0)
			return flow_diag_set(diag, FLOW_ERR_IO,
					     "%s: short read of tensor '%s': the file ends at byte %" PRIu64 ", the shard at %" PRIu64,
					     f->path, tensor, offset + got,
					     offset + len);
		got += (size_t)n;
	}
	return FLOW_OK;
}

static flow_err_t checksum_mismatch(const data_file_t *f, const char *tensor,
				    const ckpt_shard_t *s, uint64_t computed,
				    flow_diag_t *diag)
{
	char a[17], b[17], box[BOX_TEXT_MAX];
	flow_checksum_format(s->sum, a);
	flow_checksum_format(computed, b);
	box_format(&s->box, box, sizeof(box));
	return flow_diag_set(diag, FLOW_ERR_CHECKSUM,
			     "%s: checksum mismatch in tensor '%s' shard %s at offset %" PRIu64 ": stored %s, computed %s",
			     f->path, tensor, box, s->offset, a, b);
}

flow_err_t flow_ckpt_read(const flow_ckpt_t *ckpt, size_t index,
			  const flow_box_t *box, void *dst,
			  flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	if (index >= ckpt->cat.ntensors)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: no tensor %zu (the checkpoint has %zu)",
				     ckpt->dir, index, ckpt->cat.ntensors);
	const ckpt_tensor_t *t = &ckpt->cat.tensors[index];
	const flow_ckpt_tensor_desc_t *desc = &t->desc;
	flow_box_t want;
	if ((err = caller_box(desc, box, &want, diag)) != FLOW_OK)
		return err;
	box = &want;
	size_t elsize = flow_dtype_size(desc->dtype);
	if (flow_box_numel(box) == 0)
		return FLOW_OK;
	if (!dst)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': no destination buffer",
				     desc->name);
	data_file_t f = { .fd = -1 };
	void *buf = NULL;
	size_t cap = 0;
	for (size_t i = 0; i < t->count; i++) {
		const ckpt_shard_t *s = &ckpt->cat.shards[t->first + i];
		flow_box_t cut;
		if (s->replica || !flow_box_intersect(&s->box, box, &cut))
			continue;
		size_t len = (size_t)s->length;
		if (len > cap) {
			flow_free(buf);
			if (!(buf = flow_alloc(len))) {
				cap = 0;
				err = flow_diag_set(diag, FLOW_ERR_NOMEM,
						    "out of memory reading tensor '%s' (%zu bytes)",
						    desc->name, len);
				goto out_close;
			}
			cap = len;
		}
		if ((err = data_file_open(ckpt, &f, s->rank, diag)) != FLOW_OK ||
		    (err = read_at(&f, buf, len, s->offset, desc->name,
				   diag)) != FLOW_OK)
			goto out_close;
		uint64_t sum = flow_checksum(buf, len);
		if (sum != s->sum) {
			err = checksum_mismatch(&f, desc->name, s, sum, diag);
			goto out_close;
		}
		flow_box_copy(dst, box, buf, &s->box, &cut, elsize);
	}
out_close:
	flow_free(buf);
	data_file_close(&f);
	return err;
}

flow_err_t flow_ckpt_verify(const flow_ckpt_t *ckpt, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	data_file_t f = { .fd = -1 };
	flow_checksum_state_t *sum = flow_checksum_state_new();
	void *buf = flow_alloc(VERIFY_CHUNK);
	if (!sum || !buf) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	for (size_t t = 0; t < ckpt->cat.ntensors; t++) {
		const ckpt_tensor_t *ct = &ckpt->cat.tensors[t];
		for (size_t i = 0; i < ct->count; i++) {
			const ckpt_shard_t *s = &ckpt->cat.shards[ct->first + i];
			if ((err = data_file_open(ckpt, &f, s->rank, diag)) != FLOW_OK)
				goto out_free;
			flow_checksum_reset(sum);
			for (uint64_t at = 0; at < s->length;) {
				size_t n = s->length - at < VERIFY_CHUNK ?
					   (size_t)(s->length - at) : VERIFY_CHUNK;
				if ((err = read_at(&f, buf, n, s->offset + at,
						   ct->desc.name, diag)) != FLOW_OK)
					goto out_free;
				flow_checksum_update(sum, buf, n);
				at += n;
			}
			uint64_t got = flow_checksum_digest(sum);
			if (got != s->sum) {
				err = checksum_mismatch(&f, ct->desc.name, s, got,
							diag);
				goto out_free;
			}
		}
	}
out_free:
	data_file_close(&f);
	flow_free(buf);
	flow_checksum_state_free(sum);
	return err;
}

/* ---- the latest committed step -------------------------------------------------------- */

/* "step-" and 8 or more digits: the step number. */
static bool step_dir_name(const char *name, uint64_t *step_out)
{
	if (strncmp(name, "step-", 5) != 0)
		return false;
	const char *digits = name + 5;
	size_t n = strlen(digits);
	if (n < 8)
		return false;
	uint64_t v = 0;
	for (size_t i = 0; i < n; i++) {
		if (digits[i] < '0' || digits[i] > '9')
			return false;
		if (__builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, (uint64_t)(digits[i] - '0'), &v))
			return false;
	}
	*step_out = v;
	return true;
}

flow_err_t flow_ckpt_latest(const char *ckpt_dir, char **path_out,
			    flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	char *best = NULL, *probe = NULL;
	uint64_t best_step = 0;
	DIR *d = opendir(ckpt_dir);
	if (!d)
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot open directory '%s'", ckpt_dir);
	for (;;) {
		errno = 0;
		struct dirent *e = readdir(d);
		if (!e) {
			if (errno)
				err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
						      "cannot read directory '%s'",
						      ckpt_dir);
			break;
		}
		uint64_t step;
		if (!step_dir_name(e->d_name, &step))
			continue;
		/* Equal steps spelled with more digits: the shorter name,
		 * whatever order readdir gives. */
		if (best && (step < best_step ||
			     (step == best_step &&
			      strcmp(e->d_name, strrchr(best, '/') + 1) >= 0)))
			continue;
		char *dir = path_join(ckpt_dir, e->d_name);
		free(probe);
		probe = dir ? path_join(dir, "manifest") : NULL;
		if (!probe) {
			free(dir);
			err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
			break;
		}
		struct stat st;
		if (stat(probe, &st) != 0 || !S_ISREG(st.st_mode)) {
			free(dir);
			continue;
		}
		free(best);
		best = dir;
		best_step = step;
	}
	closedir(d);
	free(probe);
	if (err == FLOW_OK && !best)
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "%s: no committed checkpoint", ckpt_dir);
	if (err != FLOW_OK) {
		free(best);
		return err;
	}
	*path_out = best;
	return FLOW_OK;
}
