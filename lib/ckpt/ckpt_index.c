/* The text side of checkpoints (flow-ckpt(5)): the names of a step
 * directory's files, the box and token syntax, the catalog of tensors and
 * shards, the strict parser of manifests and rank indexes (fixed record
 * order, single-space fields, one spelling per number, a closing
 * XXH3-64, every error naming "FILE:LINE"), and the checks a committed
 * checkpoint passes: shards tile each tensor, data files hold them. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <flow/mem.h>

#include "ckpt/ckpt_internal.h"

/* ---- names ------------------------------------------------------------------ */

char *ckpt_path_join(const char *dir, const char *name)
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

void ckpt_rank_file_name(char *buf, size_t cap, uint32_t rank,
			 const char *ext)
{
	snprintf(buf, cap, "rank-%05" PRIu32 ".%s", rank, ext);
}

char *ckpt_rank_path(const char *dir, uint32_t rank, const char *ext)
{
	char name[32];
	ckpt_rank_file_name(name, sizeof(name), rank, ext);
	return ckpt_path_join(dir, name);
}

bool ckpt_valid_token(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if ((unsigned char)*s <= ' ' || (unsigned char)*s >= 0x7f)
			return false;
	return true;
}

bool ckpt_valid_key(const char *s)
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

bool ckpt_valid_value(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < ' ' || (unsigned char)*s >= 0x7f)
			return false;
	return true;
}

/* ---- boxes ------------------------------------------------------------------ */

void ckpt_box_format(const flow_box_t *box, char *buf, size_t cap)
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

/* ---- descriptions -------------------------------------------------------------- */

size_t flow_ckpt_row_bytes(const flow_ckpt_tensor_desc_t *desc)
{
	int64_t n = 1;
	for (int k = 1; k < desc->shape.ndim; k++)
		n *= desc->shape.dims[k];
	return (size_t)n * flow_dtype_size(desc->dtype);
}

bool ckpt_desc_bytes(const flow_ckpt_tensor_desc_t *desc, size_t *out)
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

flow_err_t ckpt_caller_box(const flow_ckpt_tensor_desc_t *desc,
			   const flow_box_t *box, flow_box_t *box_out,
			   flow_diag_t *diag)
{
	if (!box) {
		flow_box_whole(&desc->shape, box_out);
		return FLOW_OK;
	}
	if (!flow_box_inside(box, &desc->shape)) {
		char shape[CKPT_SHAPE_TEXT_MAX], text[CKPT_BOX_TEXT_MAX];
		flow_shape_format(&desc->shape, shape, sizeof(shape));
		if (box->ndim != desc->shape.ndim)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "tensor '%s': box has %d dimensions, the shape %s has %d",
					     desc->name, box->ndim, shape,
					     desc->shape.ndim);
		ckpt_box_format(box, text, sizeof(text));
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': box %s is outside its shape %s",
				     desc->name, text, shape);
	}
	*box_out = *box;
	return FLOW_OK;
}

/* ---- the catalog: tensors and their shards ---------------------------------- */

void ckpt_catalog_release(ckpt_catalog_t *c)
{
	free(c->tensors);
	free(c->shards);
	free(c->slots);
	memset(c, 0, sizeof(*c));
}

bool ckpt_grow(void **ptr, size_t *cap, size_t need, size_t elsize)
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

long ckpt_catalog_find(const ckpt_catalog_t *c, const char *name)
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

flow_err_t ckpt_catalog_add_tensor(ckpt_catalog_t *c, const ckpt_tensor_t *t,
				   flow_diag_t *diag)
{
	if (!ckpt_grow((void **)&c->tensors, &c->tcap, c->ntensors + 1,
		       sizeof(*c->tensors)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory listing tensor '%s' (after %zu)", t->desc.name, c->ntensors);
	/* Keep the table at most half full. */
	if (2 * (c->ntensors + 1) > c->nslots) {
		size_t n = c->nslots ? 2 * c->nslots : 64;
		size_t *slots = calloc(n, sizeof(*slots));
		if (!slots)
			return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory indexing tensor '%s' (after %zu)", t->desc.name, c->ntensors);
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

flow_err_t ckpt_catalog_add_shard(ckpt_catalog_t *c, const ckpt_shard_t *s,
				  flow_diag_t *diag)
{
	if (!ckpt_grow((void **)&c->shards, &c->scap, c->nshards + 1,
		       sizeof(*c->shards)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory listing a shard (after %zu)", c->nshards);
	c->shards[c->nshards++] = *s;
	return FLOW_OK;
}

/* ---- where a record is: for messages ------------------------------------------ */

void ckpt_where_at(const ckpt_where_t *w, uint32_t rank, size_t line,
		   char *buf, size_t cap)
{
	if (w->manifest) {
		snprintf(buf, cap, "%s:%zu", w->manifest, line);
	} else {
		char name[32];
		ckpt_rank_file_name(name, sizeof(name), rank, "idx");
		size_t dlen = strlen(w->dir);
		while (dlen > 1 && w->dir[dlen - 1] == '/')
			dlen--;
		snprintf(buf, cap, "%.*s/%s:%zu", (int)dlen, w->dir, name, line);
	}
}

/* A second location, short when it is in the same file. */
static void where_ref(const ckpt_where_t *w, uint32_t rank, size_t line,
		      char *buf, size_t cap)
{
	if (w->manifest)
		snprintf(buf, cap, "line %zu", line);
	else
		ckpt_where_at(w, rank, line, buf, cap);
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

/* Boxes are sorted along the dimension with the most distinct starts, so
 * only boxes whose ranges meet along it are compared. */
flow_err_t ckpt_check_tiling(ckpt_catalog_t *c, size_t t,
			     const ckpt_where_t *w, flow_err_t code,
			     flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	ckpt_tensor_t *tensor = &c->tensors[t];
	size_t n = tensor->count;
	char here[FLOW_DIAG_MAX / 2], there[FLOW_DIAG_MAX / 2];
	char abox[CKPT_BOX_TEXT_MAX], bbox[CKPT_BOX_TEXT_MAX];
	if (n == 0) {
		ckpt_where_at(w, tensor->src_rank, tensor->line, here, sizeof(here));
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
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory checking the %zu shards of tensor '%s'", n, tensor->desc.name);
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
				ckpt_where_at(w, late->s->rank, late->s->line, here,
					 sizeof(here));
				where_ref(w, early->s->rank, early->s->line,
					  there, sizeof(there));
				ckpt_box_format(&late->s->box, abox, sizeof(abox));
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
			ckpt_where_at(w, late->s->rank, late->s->line, here,
				 sizeof(here));
			where_ref(w, early->s->rank, early->s->line, there,
				  sizeof(there));
			ckpt_box_format(&late->s->box, abox, sizeof(abox));
			ckpt_box_format(&early->s->box, bbox, sizeof(bbox));
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
		ckpt_where_at(w, tensor->src_rank, tensor->line, here, sizeof(here));
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

/* One stat per file: the shards are grouped by rank first. */
flow_err_t ckpt_check_files(const ckpt_catalog_t *c, const char *dir,
			    const ckpt_where_t *w, flow_diag_t *diag)
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
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory checking %zu shards", dir, c->nshards);
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
		if (!(path = ckpt_rank_path(dir, first->rank, "bin"))) {
			err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory naming the data file of rank %" PRIu32, dir, first->rank);
			goto out_free;
		}
		struct stat st;
		if (stat(path, &st) != 0) {
			ckpt_where_at(w, first->rank, first->line, here, sizeof(here));
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
			ckpt_where_at(w, first->rank, first->line, here, sizeof(here));
			err = flow_diag_set(diag, FLOW_ERR_FORMAT,
					    "%s: shard file '%s' is not a regular file",
					    here, path);
			goto out_free;
		}
		uint64_t need = last->offset + last->length;
		if ((uint64_t)st.st_size < need) {
			ckpt_where_at(w, last->rank, last->line, here, sizeof(here));
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

const flow_textrec_format_t ckpt_textrec_format = {
	.sep = FLOW_TEXTREC_SEP_SPACE,
	.end_key = "end",
	.lowercase_sums = true,
	.hint_causes = true,
};

enum { S_MAGIC, S_HEAD, S_BODY, S_END };

/* "tensor NAME DTYPE SHAPE MESH SBP" */
static flow_err_t parse_tensor(flow_textrec_t *p, ckpt_doc_t *doc, long *cur,
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
	if (!ckpt_valid_token(name))
		return flow_textrec_error(p, "invalid tensor name '%s'", name);
	long prev = ckpt_catalog_find(&doc->cat, name);
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
	char shape[CKPT_SHAPE_TEXT_MAX];
	if (flow_shape_parse(p->fields[3], &t.desc.shape, &inner) != FLOW_OK ||
	    flow_shape_format(&t.desc.shape, shape, sizeof(shape)) >= sizeof(shape) ||
	    strcmp(shape, p->fields[3]) != 0)
		return flow_textrec_error(p, "invalid shape '%s' (expected '(D,D,...)' or '()')",
					  p->fields[3]);
	size_t bytes;
	if (!ckpt_desc_bytes(&t.desc, &bytes))
		return flow_textrec_error(p, "shape %s of tensor '%s' is too large",
					  p->fields[3], name);
	if (strlen(p->fields[4]) >= FLOW_CKPT_TEXT_MAX)
		return flow_textrec_error(p, "mesh '%.32s...' is longer than %d bytes",
					  p->fields[4], FLOW_CKPT_TEXT_MAX - 1);
	if (strlen(p->fields[5]) >= FLOW_CKPT_TEXT_MAX)
		return flow_textrec_error(p, "SBP '%.32s...' is longer than %d bytes",
					  p->fields[5], FLOW_CKPT_TEXT_MAX - 1);
	if (!ckpt_valid_token(p->fields[4]))
		return flow_textrec_error(p, "invalid mesh '%s'",
					  p->fields[4]);
	if (!ckpt_valid_token(p->fields[5]))
		return flow_textrec_error(p, "invalid SBP '%s'",
					  p->fields[5]);
	memcpy(t.desc.mesh, p->fields[4], strlen(p->fields[4]) + 1);
	memcpy(t.desc.sbp, p->fields[5], strlen(p->fields[5]) + 1);
	t.line = p->line;
	t.src_rank = doc->rank;
	t.first = doc->cat.nshards;
	t.count = 0;
	if ((err = ckpt_catalog_add_tensor(&doc->cat, &t, diag)) != FLOW_OK)
		return err;
	*cur = (long)doc->cat.ntensors - 1;
	return FLOW_OK;
}

/* "shard NAME RANK BOX FILE OFFSET LENGTH XXH3" */
static flow_err_t parse_shard(flow_textrec_t *p, ckpt_doc_t *doc, long cur,
			      flow_diag_t *diag)
{
	flow_err_t err;
	if ((err = flow_textrec_expect_fields(p, 8,
					      "shard NAME RANK BOX FILE OFFSET LENGTH XXH3")) != FLOW_OK)
		return err;
	const char *name = p->fields[1];
	if (cur < 0 || strcmp(doc->cat.tensors[cur].desc.name, name) != 0) {
		long t = ckpt_catalog_find(&doc->cat, name);
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
	if (doc->kind == CKPT_DOC_INDEX && s.rank != doc->rank)
		return flow_textrec_error(p, "shard of rank %" PRIu32 " in the index of rank %" PRIu32,
					  s.rank, doc->rank);
	if (!box_parse(p->fields[3], &s.box))
		return flow_textrec_error(p, "invalid shard box '%s' (expected START:END per dimension, comma separated, or '-')",
					  p->fields[3]);
	char shape[CKPT_SHAPE_TEXT_MAX];
	flow_shape_format(&t->desc.shape, shape, sizeof(shape));
	if (s.box.ndim != t->desc.shape.ndim)
		return flow_textrec_error(p, "shard box %s has %d dimensions, tensor '%s' has %d %s",
					  p->fields[3], s.box.ndim, name,
					  t->desc.shape.ndim, shape);
	if (!flow_box_inside(&s.box, &t->desc.shape))
		return flow_textrec_error(p, "shard box %s exceeds %s",
					  p->fields[3], shape);
	char want[32];
	ckpt_rank_file_name(want, sizeof(want), s.rank, "bin");
	if (strcmp(p->fields[4], want) != 0)
		return flow_textrec_error(p, "expected shard file '%s', got '%s'",
					  want, p->fields[4]);
	if ((err = flow_textrec_field_u64(p, 5, "shard offset", 0, INT64_MAX, &s.offset)) != FLOW_OK ||
	    (err = flow_textrec_field_u64(p, 6, "shard length", 0, INT64_MAX, &s.length)) != FLOW_OK)
		return err;
	if (s.offset % CKPT_SHARD_ALIGN)
		return flow_textrec_error(p, "shard offset %" PRIu64 " is not a multiple of %u",
					  s.offset, CKPT_SHARD_ALIGN);
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
	if ((err = ckpt_catalog_add_shard(&doc->cat, &s, diag)) != FLOW_OK)
		return err;
	t->count++;
	return FLOW_OK;
}

/* "state KEY VALUE": VALUE is the rest of the line (empty: "state KEY"). */
static flow_err_t parse_state(flow_textrec_t *p, ckpt_doc_t *doc, char *line,
			      flow_diag_t *diag)
{
	char *key = line + strlen("state ");
	char *sp = strchr(key, ' ');
	char *value = "";
	if (sp) {
		*sp = '\0';
		value = sp + 1;
	}
	if (!ckpt_valid_key(key))
		return flow_textrec_error(p, "invalid state key '%s' (expected [A-Za-z0-9_.-]+)",
					  key);
	if (!ckpt_valid_value(value))
		return flow_textrec_error(p, "state '%s': the value holds a control character",
					  key);
	for (size_t i = 0; i < doc->nkv; i++)
		if (strcmp(doc->kv[i].key, key) == 0)
			return flow_textrec_error(p, "duplicate state key '%s'",
						  key);
	if (!ckpt_grow((void **)&doc->kv, &doc->kvcap, doc->nkv + 1,
		       sizeof(*doc->kv)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory for state key '%s'", p->path, key);
	doc->kv[doc->nkv].key = key;
	doc->kv[doc->nkv].value = value;
	doc->nkv++;
	return FLOW_OK;
}

/* The tensor being listed is complete: it has shards and, in a manifest,
 * they tile it. */
static flow_err_t close_tensor(flow_textrec_t *p, ckpt_doc_t *doc, long cur,
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
	if (doc->kind != CKPT_DOC_MANIFEST)
		return FLOW_OK;
	ckpt_where_t w = { .manifest = doc->path, .dir = doc->dir };
	return ckpt_check_tiling(&doc->cat, (size_t)cur, &w, FLOW_ERR_FORMAT,
				 diag);
}

flow_err_t ckpt_doc_parse(ckpt_doc_t *doc, char *text, size_t len,
			  flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	flow_textrec_t p;
	const bool manifest = doc->kind == CKPT_DOC_MANIFEST;
	const char *magic = manifest ? CKPT_MAGIC : CKPT_INDEX_MAGIC;
	if ((err = flow_textrec_init(&p, &ckpt_textrec_format, doc->path, text,
				     len, diag)) != FLOW_OK)
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

void ckpt_doc_release(ckpt_doc_t *doc)
{
	ckpt_catalog_release(&doc->cat);
	free(doc->kv);
	doc->kv = NULL;
	doc->nkv = doc->kvcap = 0;
}

