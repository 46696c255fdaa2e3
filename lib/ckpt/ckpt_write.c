/* Writing checkpoints: each rank's writer appends its shards to its data
 * file and, when finished, writes its index (each atomically); the commit
 * reads every rank's index, checks that the shards tile every tensor,
 * and writes the manifest last, which makes the step a checkpoint. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/checksum.h>
#include <flow/file.h>
#include <flow/mem.h>

#include "ckpt/ckpt_internal.h"

/* "DTYPE SHAPE MESH SBP". */
#define DESC_TEXT_MAX (8 + CKPT_SHAPE_TEXT_MAX + 2 * FLOW_CKPT_TEXT_MAX)

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
	char shape[CKPT_SHAPE_TEXT_MAX];
	flow_shape_format(&desc->shape, shape, sizeof(shape));
	const char *dtype = flow_dtype_name(desc->dtype);
	snprintf(buf, cap, "%s %s %s %s", dtype ? dtype : "?", shape,
		 desc->mesh, desc->sbp);
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
	if (!ckpt_valid_token(desc->name))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "invalid tensor name '%s' (expected printable ASCII without spaces)",
				     desc->name);
	if (strnlen(desc->mesh, FLOW_CKPT_TEXT_MAX) == FLOW_CKPT_TEXT_MAX ||
	    !ckpt_valid_token(desc->mesh))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': invalid mesh '%.*s' (expected printable ASCII without spaces, at most %d bytes)",
				     desc->name, FLOW_CKPT_TEXT_MAX, desc->mesh,
				     FLOW_CKPT_TEXT_MAX - 1);
	if (strnlen(desc->sbp, FLOW_CKPT_TEXT_MAX) == FLOW_CKPT_TEXT_MAX ||
	    !ckpt_valid_token(desc->sbp))
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
	if (!ckpt_desc_bytes(desc, &bytes))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tensor '%s': invalid or too large shape",
				     desc->name);
	return FLOW_OK;
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
	char box[CKPT_BOX_TEXT_MAX], hex[17], file[32];
	ckpt_box_format(&s->box, box, sizeof(box));
	flow_checksum_format(s->sum, hex);
	ckpt_rank_file_name(file, sizeof(file), s->rank, "bin");
	flow_textrec_printf(sb, "shard %s %" PRIu32 " %s %s %" PRIu64 " %" PRIu64 " %s\n",
			    name, s->rank, box, file, s->offset, s->length,
			    hex);
}

/* ---- files and directories ------------------------------------------------------ */

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
	bool made_dir;  /* dir did not exist before this writer */
	ckpt_catalog_t cat;  /* tensors in order of their first shard; shards in
			 * order of writing, each with its tensor index */
};

/* A step directory this writer created and that nothing else has written
 * into goes with a failed write, so a full disk or a bad tensor leaves no
 * empty step behind.  rmdir removes only an empty directory: one holding
 * another rank's files, or an older checkpoint's, stays. */
static void writer_drop_dir(const flow_ckpt_writer_t *w)
{
	if (w->made_dir)
		rmdir(w->dir);
}

static void writer_destroy(flow_ckpt_writer_t *w)
{
	ckpt_catalog_release(&w->cat);
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
	if (!ckpt_host_is_little_endian())
		return flow_diag_set(diag, FLOW_ERR_NOTSUP,
				     "checkpoints need a little-endian host");
	flow_ckpt_writer_t *w = calloc(1, sizeof(*w));
	if (!w)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	w->rank = rank;
	if (!(w->dir = strdup(step_dir)) ||
	    !(w->bin_path = ckpt_rank_path(step_dir, rank, "bin")) ||
	    !(w->idx_path = ckpt_rank_path(step_dir, rank, "idx")) ||
	    !(manifest = ckpt_path_join(step_dir, "manifest"))) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	struct stat st;
	w->made_dir = lstat(step_dir, &st) != 0 && errno == ENOENT;
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
		goto out_drop_dir;
	free(manifest);
	*writer_out = w;
	return FLOW_OK;

out_drop_dir:
	writer_drop_dir(w);
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
	static const unsigned char zeros[CKPT_SHARD_ALIGN];
	flow_err_t err;
	if (w->failed)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot add to '%s': an earlier write to it failed",
				     w->bin_path);
	if ((err = desc_check(desc, diag)) != FLOW_OK)
		return err;
	flow_box_t want;
	if ((err = ckpt_caller_box(desc, box, &want, diag)) != FLOW_OK)
		return err;
	box = &want;
	long t = ckpt_catalog_find(&w->cat, desc->name);
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
	uint64_t offset = (w->pos + CKPT_SHARD_ALIGN - 1) / CKPT_SHARD_ALIGN *
			  CKPT_SHARD_ALIGN;
	/* From here on a failure leaves the catalog or the data file out of
	 * step with each other: the writer can only be aborted. */
	if (t < 0) {
		ckpt_tensor_t nt;
		memset(&nt, 0, sizeof(nt));
		nt.desc = *desc;
		if ((err = ckpt_catalog_add_tensor(&w->cat, &nt, diag)) !=
		    FLOW_OK)
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
	if ((err = ckpt_catalog_add_shard(&w->cat, &s, diag)) != FLOW_OK)
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
	ckpt_catalog_t *c = &w->cat;
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
	flow_textrec_printf(sb, "%s %d\nrank %" PRIu32 "\n", CKPT_INDEX_MAGIC,
			    FLOW_CKPT_FORMAT_VERSION, w->rank);
	pos = 0;
	for (size_t t = 0; t < c->ntensors; t++) {
		sb_tensor(sb, &c->tensors[t].desc);
		for (size_t i = 0; i < c->tensors[t].count; i++)
			sb_shard(sb, c->tensors[t].desc.name, order[pos++]);
	}
	flow_textrec_seal(sb, &ckpt_textrec_format);
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
	if ((err = flow_atomic_file_commit(bin, diag)) != FLOW_OK) {
		writer_drop_dir(w);
		goto out_free;
	}
	/* The index goes last: its presence says the data file is whole.
	 * Without it the data file belongs to no checkpoint: remove it. */
	if ((err = flow_file_write_atomic(w->idx_path, sb.buf, sb.len,
					  diag)) != FLOW_OK) {
		unlink(w->bin_path);
		writer_drop_dir(w);
	}
	goto out_free;

out_abort:
	flow_atomic_file_abort(w->bin);
	writer_drop_dir(w);
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
	writer_drop_dir(w);
	writer_destroy(w);
}

/* ---- commit ----------------------------------------------------------------------- */

static flow_err_t check_state(const flow_ckpt_kv_t *kv, size_t nkv,
			      flow_diag_t *diag)
{
	for (size_t i = 0; i < nkv; i++) {
		if (!kv[i].key || !ckpt_valid_key(kv[i].key))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "invalid state key '%s' (expected [A-Za-z0-9_.-]+)",
					     kv[i].key ? kv[i].key : "(null)");
		if (!kv[i].value || !ckpt_valid_value(kv[i].value))
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
static flow_err_t merge_indexes(ckpt_doc_t *docs, uint32_t nranks,
				const ckpt_where_t *w, ckpt_catalog_t *m,
				flow_diag_t *diag)
{
	flow_err_t err;
	size_t total = 0;
	for (uint32_t r = 0; r < nranks; r++) {
		const ckpt_catalog_t *c = &docs[r].cat;
		total += c->nshards;
		for (size_t t = 0; t < c->ntensors; t++) {
			const ckpt_tensor_t *ct = &c->tensors[t];
			long i = ckpt_catalog_find(m, ct->desc.name);
			if (i < 0) {
				ckpt_tensor_t nt = *ct;
				nt.count = ct->count;
				if ((err = ckpt_catalog_add_tensor(m, &nt,
								   diag)) != FLOW_OK)
					return err;
				continue;
			}
			ckpt_tensor_t *mt = &m->tensors[i];
			if (!desc_equal(&mt->desc, &ct->desc)) {
				char here[FLOW_DIAG_MAX / 2], there[FLOW_DIAG_MAX / 2];
				char a[DESC_TEXT_MAX], b[DESC_TEXT_MAX];
				ckpt_where_at(w, r, ct->line, here, sizeof(here));
				ckpt_where_at(w, mt->src_rank, mt->line, there,
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
	if (!ckpt_grow((void **)&m->shards, &m->scap, total,
		       sizeof(*m->shards)))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	size_t pos = 0;
	for (size_t t = 0; t < m->ntensors; t++) {
		m->tensors[t].first = pos;
		pos += m->tensors[t].count;
		m->tensors[t].count = 0;
	}
	for (uint32_t r = 0; r < nranks; r++) {
		const ckpt_catalog_t *c = &docs[r].cat;
		for (size_t t = 0; t < c->ntensors; t++) {
			const ckpt_tensor_t *ct = &c->tensors[t];
			ckpt_tensor_t *mt =
				&m->tensors[ckpt_catalog_find(m, ct->desc.name)];
			memcpy(&m->shards[mt->first + mt->count],
			       &c->shards[ct->first],
			       ct->count * sizeof(*m->shards));
			mt->count += ct->count;
		}
	}
	m->nshards = total;
	return FLOW_OK;
}

/* The manifest could not be written (a full disk, most likely): the
 * ranks' files are no checkpoint without it, so remove them and the step
 * directory if that leaves it empty, rather than keep the space. */
static void drop_uncommitted(const char *step_dir, uint32_t nranks)
{
	static const char *const exts[] = { "bin", "idx" };
	for (uint32_t r = 0; r < nranks; r++)
		for (int e = 0; e < 2; e++) {
			char *p = ckpt_rank_path(step_dir, r, exts[e]);
			if (p)
				unlink(p);
			free(p);
		}
	rmdir(step_dir);
}

flow_err_t flow_ckpt_commit(const char *step_dir, uint64_t step,
			    uint32_t nranks, const flow_ckpt_kv_t *kv,
			    size_t nkv, flow_diag_t *diag)
{
	flow_err_t err;
	ckpt_doc_t *docs = NULL;
	char *path = NULL, *text = NULL;
	ckpt_catalog_t merged;
	flow_textrec_buf_t sb = FLOW_TEXTREC_BUF_INIT;
	memset(&merged, 0, sizeof(merged));
	ckpt_where_t w = { .manifest = NULL, .dir = step_dir };
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
		if (!(path = ckpt_rank_path(step_dir, r, "idx"))) {
			err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
			goto out_free;
		}
		if ((err = flow_file_read_all(path, &text, &len, diag)) != FLOW_OK)
			goto out_free;
		docs[r].kind = CKPT_DOC_INDEX;
		docs[r].path = path;
		docs[r].dir = step_dir;
		docs[r].rank = r;
		err = ckpt_doc_parse(&docs[r], text, len, diag);
		docs[r].path = NULL;
		free(text);
		text = NULL;
		if (err != FLOW_OK)
			goto out_free;
		if ((err = ckpt_check_files(&docs[r].cat, step_dir, &w,
					    diag)) != FLOW_OK)
			goto out_free;
	}
	if ((err = merge_indexes(docs, nranks, &w, &merged, diag)) != FLOW_OK)
		goto out_free;
	for (size_t t = 0; t < merged.ntensors; t++)
		if ((err = ckpt_check_tiling(&merged, t, &w, FLOW_ERR_USAGE,
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
	flow_textrec_seal(&sb, &ckpt_textrec_format);
	if (sb.failed) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	free(path);
	if (!(path = ckpt_path_join(step_dir, "manifest"))) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	/* Temp, fsync, rename, fsync the step directory; then make the step
	 * directory's own entry durable. */
	if ((err = flow_file_write_atomic(path, sb.buf, sb.len, diag)) != FLOW_OK) {
		drop_uncommitted(step_dir, nranks);
		goto out_free;
	}
	err = fsync_parent(step_dir, diag);

out_free:
	flow_textrec_buf_release(&sb);
	ckpt_catalog_release(&merged);
	for (uint32_t r = 0; r < nranks; r++)
		ckpt_doc_release(&docs[r]);
	free(docs);
	free(text);
	free(path);
	return err;
}

