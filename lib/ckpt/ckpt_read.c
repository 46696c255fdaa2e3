/* Reading checkpoints: open a step directory through its manifest, look
 * up its tensors and state, assemble any box of a tensor from the shards
 * that intersect it (each checked against its XXH3-64), verify every
 * shard, and find the latest committed step of a checkpoint directory. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/checksum.h>
#include <flow/file.h>
#include <flow/mem.h>

#include "ckpt/ckpt_internal.h"

/* Chunk size of flow_ckpt_verify's streaming reads. */
#define VERIFY_CHUNK (1u << 20)

/* ---- opening --------------------------------------------------------------------- */

struct flow_ckpt {
	char *dir;
	char *manifest_path;
	char *text; /* the manifest, cut up: the state lines point into it */
	uint64_t step;
	flow_ckpt_kv_t *kv;
	size_t nkv;
	ckpt_catalog_t cat;
	/* Per shard: its checksum held over the whole of it on an earlier
	 * bounded read, which then trusts it and reads only the rows it
	 * needs (a reshard reads a source shard once per target box).
	 * Atomic: readers of one checkpoint may run on several threads. */
	atomic_bool *verified;
};

void flow_ckpt_free(flow_ckpt_t *ckpt)
{
	if (!ckpt)
		return;
	ckpt_catalog_release(&ckpt->cat);
	free(ckpt->verified);
	free(ckpt->kv);
	free(ckpt->text);
	free(ckpt->manifest_path);
	free(ckpt->dir);
	free(ckpt);
}

/* The index of every rank that holds a shard must still parse: the
 * manifest alone describes the data, but a damaged index is a damaged
 * checkpoint all the same (flow-ckpt(5), READING), and a later commit or
 * reshard would trip on it.  Its closing checksum finds a flipped byte,
 * reported as "PATH:LINE: ...". */
static flow_err_t check_indexes(const ckpt_catalog_t *cat, const char *dir,
				flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	uint32_t done = UINT32_MAX; /* shards come grouped by tensor, then rank */
	for (size_t i = 0; i < cat->nshards && err == FLOW_OK; i++) {
		uint32_t r = cat->shards[i].rank;
		bool seen = r == done;
		for (size_t j = 0; j < i && !seen; j++)
			seen = cat->shards[j].rank == r;
		if (seen)
			continue;
		done = r;
		char *path = ckpt_rank_path(dir, r, "idx"), *text = NULL;
		size_t len;
		if (!path)
			return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		err = flow_file_read_all(path, &text, &len, diag);
		if (err == FLOW_OK) {
			ckpt_doc_t doc;
			memset(&doc, 0, sizeof(doc));
			doc.kind = CKPT_DOC_INDEX;
			doc.path = path;
			doc.dir = dir;
			doc.rank = r;
			err = ckpt_doc_parse(&doc, text, len, diag);
			ckpt_doc_release(&doc);
		}
		free(text);
		free(path);
	}
	return err;
}

flow_err_t flow_ckpt_open(const char *step_dir, flow_ckpt_t **ckpt_out,
			  flow_diag_t *diag)
{
	flow_err_t err;
	size_t len;
	ckpt_doc_t doc;
	memset(&doc, 0, sizeof(doc));
	if (!ckpt_host_is_little_endian())
		return flow_diag_set(diag, FLOW_ERR_NOTSUP,
				     "checkpoints need a little-endian host");
	flow_ckpt_t *c = calloc(1, sizeof(*c));
	if (!c)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory opening the checkpoint", step_dir);
	if (!(c->dir = strdup(step_dir)) ||
	    !(c->manifest_path = ckpt_path_join(step_dir, "manifest"))) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory opening the checkpoint", step_dir);
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
	doc.kind = CKPT_DOC_MANIFEST;
	doc.path = c->manifest_path;
	doc.dir = step_dir;
	if ((err = ckpt_doc_parse(&doc, c->text, len, diag)) != FLOW_OK)
		goto out_release;
	ckpt_where_t w = { .manifest = c->manifest_path, .dir = step_dir };
	if ((err = ckpt_check_files(&doc.cat, step_dir, &w, diag)) != FLOW_OK ||
	    (err = check_indexes(&doc.cat, step_dir, diag)) != FLOW_OK)
		goto out_release;
	c->step = doc.step;
	c->kv = doc.kv;
	c->nkv = doc.nkv;
	c->cat = doc.cat;
	c->verified = calloc(c->cat.nshards ? c->cat.nshards : 1,
			     sizeof *c->verified);
	if (!c->verified) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory opening the checkpoint", step_dir);
		goto out_free;
	}
	for (size_t i = 0; i < c->cat.nshards; i++)
		atomic_init(&c->verified[i], false);
	*ckpt_out = c;
	return FLOW_OK;

out_release:
	ckpt_doc_release(&doc);
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

size_t flow_ckpt_tensor_shards(const flow_ckpt_t *ckpt, size_t index,
			       uint64_t *bytes_out)
{
	const ckpt_tensor_t *t = &ckpt->cat.tensors[index];
	uint64_t bytes = 0;
	for (size_t i = 0; i < t->count; i++)
		bytes += ckpt->cat.shards[t->first + i].length;
	if (bytes_out)
		*bytes_out = bytes;
	return t->count;
}

size_t flow_ckpt_ranks(const flow_ckpt_t *ckpt)
{
	uint32_t top = 0;
	bool any = false;
	for (size_t i = 0; i < ckpt->cat.nshards; i++) {
		if (!any || ckpt->cat.shards[i].rank > top)
			top = ckpt->cat.shards[i].rank;
		any = true;
	}
	return any ? (size_t)top + 1 : 0;
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
	long i = ckpt_catalog_find(&ckpt->cat, name);
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
	if (!(f->path = ckpt_rank_path(c->dir, rank, "bin")))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory naming the data file of rank %" PRIu32, c->dir, rank);
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
	size_t got;
	int e = flow_pread_full(f->fd, buf, len, offset, &got);
	if (e)
		return flow_diag_errno(diag, FLOW_ERR_IO, e,
				       "%s: cannot read tensor '%s' at offset %" PRIu64,
				       f->path, tensor, offset + got);
	if (got < len)
		return flow_diag_set(diag, FLOW_ERR_IO,
				     "%s: short read of tensor '%s': the file ends at byte %" PRIu64 ", the shard at %" PRIu64,
				     f->path, tensor, offset + got,
				     offset + len);
	return FLOW_OK;
}

static flow_err_t checksum_mismatch(const data_file_t *f, const char *tensor,
				    const ckpt_shard_t *s, uint64_t computed,
				    flow_diag_t *diag)
{
	char a[17], b[17], box[CKPT_BOX_TEXT_MAX];
	flow_checksum_format(s->sum, a);
	flow_checksum_format(computed, b);
	ckpt_box_format(&s->box, box, sizeof(box));
	return flow_diag_set(diag, FLOW_ERR_CHECKSUM,
			     "%s: checksum mismatch in tensor '%s' shard %s at offset %" PRIu64 ": stored %s, computed %s",
			     f->path, tensor, box, s->offset, a, b);
}

/* Read shard s of tensor t through scratch (cap bytes), a slab of whole
 * rows (of its first dimension) at a time, hashing each and copying its
 * part of box into dst. */
static flow_err_t read_shard_slabs(const flow_ckpt_t *ckpt,
				   const ckpt_tensor_t *t,
				   const ckpt_shard_t *s, const flow_box_t *box,
				   void *dst, unsigned char *scratch, size_t cap,
				   data_file_t *f, flow_checksum_state_t *sum,
				   flow_diag_t *diag)
{
	const char *name = t->desc.name;
	size_t elsize = flow_dtype_size(t->desc.dtype);
	int64_t rows = s->box.ndim ? s->box.extent[0] : 1;
	uint64_t row_bytes = rows ? s->length / (uint64_t)rows : 0;
	char text[CKPT_BOX_TEXT_MAX];
	if (row_bytes * (uint64_t)rows != s->length ||
	    row_bytes != (uint64_t)(flow_box_numel(&s->box) / rows) * elsize) {
		ckpt_box_format(&s->box, text, sizeof text);
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: tensor '%s' shard %s holds %" PRIu64
				     " bytes, not whole rows of its box",
				     ckpt->manifest_path, name, text, s->length);
	}
	if (row_bytes > cap) {
		ckpt_box_format(&s->box, text, sizeof text);
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "a row of tensor '%s' shard %s is %" PRIu64
				     " bytes, more than the %zu-byte read buffer",
				     name, text, row_bytes, cap);
	}
	flow_err_t err = data_file_open(ckpt, f, s->rank, diag);
	if (err != FLOW_OK)
		return err;
	int64_t per = (int64_t)(cap / row_bytes);
	atomic_bool *verified = &ckpt->verified[s - ckpt->cat.shards];
	bool trusted = atomic_load(verified);
	bool direct = flow_box_equal(&s->box, box);
	/* A verified shard: only the rows that meet box. */
	int64_t first = 0, last = rows;
	if (trusted && s->box.ndim) {
		int64_t lo = box->start[0] - s->box.start[0];
		int64_t hi = lo + box->extent[0];
		first = lo > 0 ? lo : 0;
		last = hi < rows ? hi : rows;
	}
	flow_checksum_reset(sum);
	for (int64_t r = first; r < last; r += per) {
		int64_t n = last - r < per ? last - r : per;
		flow_box_t slab = s->box, cut;
		if (slab.ndim) {
			slab.start[0] += r;
			slab.extent[0] = n;
		}
		size_t len = (size_t)((uint64_t)n * row_bytes);
		/* A whole shard asked for lands where it belongs, unstaged. */
		unsigned char *to = direct ? (unsigned char *)dst +
						     (size_t)r * row_bytes
					   : scratch;
		if ((err = read_at(f, to, len,
				   s->offset + (uint64_t)r * row_bytes, name,
				   diag)) != FLOW_OK)
			return err;
		if (!trusted)
			flow_checksum_update(sum, to, len);
		if (!direct && flow_box_intersect(&slab, box, &cut))
			flow_box_copy(dst, box, to, &slab, &cut, elsize);
	}
	if (trusted)
		return FLOW_OK;
	uint64_t got = flow_checksum_digest(sum);
	if (got != s->sum)
		return checksum_mismatch(f, name, s, got, diag);
	atomic_store(verified, true);
	return FLOW_OK;
}

flow_err_t flow_ckpt_read_bounded(const flow_ckpt_t *ckpt, size_t index,
				  const flow_box_t *box, void *dst,
				  void *scratch, size_t scratch_bytes,
				  flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	if (index >= ckpt->cat.ntensors)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: no tensor %zu (the checkpoint has %zu)",
				     ckpt->dir, index, ckpt->cat.ntensors);
	const ckpt_tensor_t *t = &ckpt->cat.tensors[index];
	flow_box_t want;
	if ((err = ckpt_caller_box(&t->desc, box, &want, diag)) != FLOW_OK)
		return err;
	if (flow_box_numel(&want) == 0)
		return FLOW_OK;
	if (!dst || !scratch)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': no destination or read "
				     "buffer",
				     t->desc.name);
	flow_checksum_state_t *sum = flow_checksum_state_new();
	if (!sum)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory reading tensor '%s'",
				     t->desc.name);
	data_file_t f = { .fd = -1 };
	for (size_t i = 0; i < t->count && err == FLOW_OK; i++) {
		const ckpt_shard_t *s = &ckpt->cat.shards[t->first + i];
		flow_box_t cut;
		if (s->replica || !flow_box_intersect(&s->box, &want, &cut))
			continue;
		err = read_shard_slabs(ckpt, t, s, &want, dst, scratch,
				       scratch_bytes, &f, sum, diag);
	}
	data_file_close(&f);
	flow_checksum_state_free(sum);
	return err;
}

/* flow_ckpt_read is a bounded read through a buffer of its own: a few
 * MiB (or the largest shard of the tensor, when smaller; or one row, when
 * larger). */
#define READ_BUFFER ((size_t)4 << 20)

flow_err_t flow_ckpt_read(const flow_ckpt_t *ckpt, size_t index,
			  const flow_box_t *box, void *dst,
			  flow_diag_t *diag)
{
	if (index >= ckpt->cat.ntensors)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: no tensor %zu (the checkpoint has %zu)",
				     ckpt->dir, index, ckpt->cat.ntensors);
	const ckpt_tensor_t *t = &ckpt->cat.tensors[index];
	size_t cap = 0;
	for (size_t i = 0; i < t->count; i++)
		if (ckpt->cat.shards[t->first + i].length > cap)
			cap = (size_t)ckpt->cat.shards[t->first + i].length;
	if (cap > READ_BUFFER)
		cap = READ_BUFFER;
	if (cap < flow_ckpt_row_bytes(&t->desc))
		cap = flow_ckpt_row_bytes(&t->desc);
	void *scratch = flow_alloc(cap ? cap : 1);
	if (!scratch)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of memory reading tensor '%s' (%zu bytes)",
				     t->desc.name, cap);
	flow_err_t err = flow_ckpt_read_bounded(ckpt, index, box, dst, scratch,
						cap, diag);
	flow_free(scratch);
	return err;
}

flow_err_t flow_ckpt_verify(const flow_ckpt_t *ckpt, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	data_file_t f = { .fd = -1 };
	flow_checksum_state_t *sum = flow_checksum_state_new();
	void *buf = flow_alloc(VERIFY_CHUNK);
	if (!sum || !buf) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory for verifying buffers", ckpt->dir);
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

/* ---- step directories: their names, the latest committed one ------------------------- */

char *flow_ckpt_step_path(const char *ckpt_dir, uint64_t step)
{
	char name[32];
	snprintf(name, sizeof(name), "step-%08" PRIu64, step);
	return ckpt_path_join(ckpt_dir, name);
}

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
		char *dir = ckpt_path_join(ckpt_dir, e->d_name);
		free(probe);
		probe = dir ? ckpt_path_join(dir, "manifest") : NULL;
		if (!probe) {
			free(dir);
			err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory naming %s", ckpt_dir, e->d_name);
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
	/* The name only proposes: the manifest, read and checked, must be
	 * of that step, or a directory renamed or copied over another would
	 * be resumed as a step it is not. */
	flow_ckpt_t *ck = NULL;
	if (err == FLOW_OK)
		err = flow_ckpt_open(best, &ck, diag);
	if (err == FLOW_OK && flow_ckpt_step(ck) != best_step)
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s/manifest: holds step %" PRIu64
				    ", not the %" PRIu64 " its directory is named for",
				    best, flow_ckpt_step(ck), best_step);
	flow_ckpt_free(ck);
	if (err != FLOW_OK) {
		free(best);
		return err;
	}
	*path_out = best;
	return FLOW_OK;
}
