/* safetensors files (flow/safetensors.h): the header parsed and written
 * with Jansson, validated against the file; a streaming atomic writer. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include <flow/file.h>
#include <flow/safetensors.h>

#include "foreign_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this host is not"
#endif

static const struct {
	const char *name;
	flow_dtype_t dtype;
} st_dtypes[] = {
	{ "F32", FLOW_DTYPE_F32 }, { "BF16", FLOW_DTYPE_BF16 },
	{ "F16", FLOW_DTYPE_F16 }, { "I32", FLOW_DTYPE_I32 },
	{ "I64", FLOW_DTYPE_I64 }, { "U16", FLOW_DTYPE_U16 },
	{ "U8", FLOW_DTYPE_U8 },   { "U32", FLOW_DTYPE_U32 },
};

/* safetensors dtypes flow has no type for. */
static const char *const st_foreign[] = {
	"BOOL", "F4", "F6_E2M3", "F6_E3M2", "I8", "F8_E5M2", "F8_E4M3",
	"F8_E8M0", "I16", "F64", "C64", "U64",
};

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char *st_dtype_name(flow_dtype_t d)
{
	for (size_t i = 0; i < ARRAY_LEN(st_dtypes); i++)
		if (st_dtypes[i].dtype == d)
			return st_dtypes[i].name;
	return NULL;
}

struct flow_st {
	char *path;
	int fd;
	uint64_t data_start; /* 8 + N */
	flow_st_tensor_t *tensors;
	size_t n;
	char **meta_keys, **meta_values;
	size_t nmeta;
};

void flow_st_free(flow_st_t *st)
{
	if (!st)
		return;
	if (st->fd >= 0)
		close(st->fd);
	for (size_t i = 0; i < st->n; i++)
		free((char *)st->tensors[i].name);
	for (size_t i = 0; i < st->nmeta; i++) {
		free(st->meta_keys[i]);
		free(st->meta_values[i]);
	}
	free(st->meta_keys);
	free(st->meta_values);
	free(st->tensors);
	free(st->path);
	free(st);
}

flow_err_t foreign_pread(int fd, const char *path, void *buf, size_t len,
			 uint64_t off, flow_diag_t *diag)
{
	size_t got;
	int e = flow_pread_full(fd, buf, len, off, &got);
	if (e)
		return flow_diag_errno(diag, FLOW_ERR_IO, e, "cannot read '%s'",
				       path);
	if (got < len)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: truncated at byte %" PRIu64, path,
				     off + got);
	return FLOW_OK;
}

static int cmp_offsets(const void *a, const void *b)
{
	const flow_st_tensor_t *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

static flow_err_t st_parse_metadata(flow_st_t *st, json_t *meta,
				    flow_diag_t *diag)
{
	if (!json_is_object(meta))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: __metadata__ is not an object",
				     st->path);
	size_t n = json_object_size(meta);
	st->meta_keys = calloc(n ? n : 1, sizeof(char *));
	st->meta_values = calloc(n ? n : 1, sizeof(char *));
	if (!st->meta_keys || !st->meta_values)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "%s: out of memory", st->path);
	const char *key;
	json_t *v;
	json_object_foreach(meta, key, v) {
		if (!json_is_string(v))
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: __metadata__ '%s' is not a "
					     "string", st->path, key);
		st->meta_keys[st->nmeta] = strdup(key);
		st->meta_values[st->nmeta] = strdup(json_string_value(v));
		if (!st->meta_keys[st->nmeta] || !st->meta_values[st->nmeta]) {
			st->nmeta++;
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "%s: out of memory", st->path);
		}
		st->nmeta++;
	}
	return FLOW_OK;
}

static flow_err_t st_parse_tensor(flow_st_t *st, const char *name, json_t *o,
				  flow_st_tensor_t *t, flow_diag_t *diag)
{
	const char *path = st->path;
	if (!json_is_object(o))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: tensor '%s' is not an object", path,
				     name);
	json_t *jd = json_object_get(o, "dtype");
	json_t *js = json_object_get(o, "shape");
	json_t *jo = json_object_get(o, "data_offsets");
	if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
	    json_array_size(jo) != 2 || json_object_size(o) != 3)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: tensor '%s' needs exactly dtype "
				     "(string), shape (array) and data_offsets "
				     "(two integers)", path, name);
	const char *dt = json_string_value(jd);
	size_t i;
	for (i = 0; i < ARRAY_LEN(st_dtypes); i++)
		if (strcmp(dt, st_dtypes[i].name) == 0)
			break;
	if (i == ARRAY_LEN(st_dtypes)) {
		for (size_t j = 0; j < ARRAY_LEN(st_foreign); j++)
			if (strcmp(dt, st_foreign[j]) == 0)
				return flow_diag_set(diag, FLOW_ERR_NOTSUP,
						     "%s: tensor '%s': dtype "
						     "'%s' is not supported",
						     path, name, dt);
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: tensor '%s': unknown dtype '%s'",
				     path, name, dt);
	}
	t->dtype = st_dtypes[i].dtype;
	size_t ndim = json_array_size(js);
	if (ndim > FLOW_MAX_DIMS)
		return flow_diag_set(diag, FLOW_ERR_NOTSUP,
				     "%s: tensor '%s': %zu dimensions, at most "
				     "%d are supported", path, name, ndim,
				     FLOW_MAX_DIMS);
	t->shape.ndim = (int)ndim;
	size_t bytes = flow_dtype_size(t->dtype);
	bool overflow = false;
	for (size_t d = 0; d < ndim; d++) {
		json_t *x = json_array_get(js, d);
		if (!json_is_integer(x) || json_integer_value(x) < 0)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: tensor '%s': shape holds a "
					     "value that is not a non-negative "
					     "integer", path, name);
		t->shape.dims[d] = json_integer_value(x);
		if (!flow_mul_size(bytes, (size_t)t->shape.dims[d], &bytes))
			overflow = true;
	}
	json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
	if (!json_is_integer(b) || !json_is_integer(e) ||
	    json_integer_value(b) < 0 ||
	    json_integer_value(e) < json_integer_value(b))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: tensor '%s': data_offsets are not "
				     "two integers 0 <= BEGIN <= END", path,
				     name);
	t->begin = (uint64_t)json_integer_value(b);
	t->end = (uint64_t)json_integer_value(e);
	if (overflow || t->end - t->begin != (uint64_t)bytes)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: tensor '%s': data_offsets [%" PRIu64
				     ", %" PRIu64 "] hold %" PRIu64
				     " bytes, its dtype and shape need %s",
				     path, name, t->begin, t->end,
				     t->end - t->begin,
				     overflow ? "more than fit in memory" :
				     "a different count");
	return FLOW_OK;
}

/* Check the tensors (sorted by offset) tile [0, data_len) exactly. */
static flow_err_t st_check_layout(const flow_st_t *st, uint64_t data_len,
				  flow_diag_t *diag)
{
	uint64_t at = 0;
	for (size_t i = 0; i < st->n; i++) {
		const flow_st_tensor_t *t = &st->tensors[i];
		if (t->begin < at)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: tensor '%s' at bytes [%" PRIu64
					     ", %" PRIu64 ") overlaps tensor "
					     "'%s'", st->path, t->name,
					     t->begin, t->end,
					     st->tensors[i - 1].name);
		if (t->begin > at)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: gap of %" PRIu64 " bytes "
					     "before tensor '%s'", st->path,
					     t->begin - at, t->name);
		at = t->end;
	}
	if (at != data_len) {
		const char *last = st->n ? st->tensors[st->n - 1].name : "";
		if (at > data_len)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: truncated: tensor '%s' ends at "
					     "data byte %" PRIu64 ", the file "
					     "holds %" PRIu64, st->path, last,
					     at, data_len);
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: %" PRIu64 " bytes after the last "
				     "tensor%s%s%s", st->path, data_len - at,
				     st->n ? " '" : "", last, st->n ? "'" : "");
	}
	return FLOW_OK;
}

flow_err_t flow_st_open(const char *path, flow_st_t **st_out,
			flow_diag_t *diag)
{
	flow_err_t err;
	char *hdr = NULL;
	json_t *root = NULL;
	flow_st_t *st = calloc(1, sizeof *st);
	if (!st)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				     path);
	st->fd = -1;
	st->path = strdup(path);
	if (!st->path) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				    path);
		goto out_free;
	}
	st->fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat sb;
	if (st->fd < 0 || fstat(st->fd, &sb) != 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot open '%s'", path);
		goto out_free;
	}
	if (!S_ISREG(sb.st_mode)) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "'%s' is not a regular file", path);
		goto out_free;
	}
	uint64_t file_len = (uint64_t)sb.st_size;
	unsigned char lenb[8];
	if (file_len < 8) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: truncated: %" PRIu64 " bytes, shorter "
				    "than the 8-byte header length", path,
				    file_len);
		goto out_free;
	}
	err = foreign_pread(st->fd, path, lenb, 8, 0, diag);
	if (err != FLOW_OK)
		goto out_free;
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | lenb[i];
	if (n > FLOW_ST_HEADER_MAX) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: header length %" PRIu64 " exceeds the "
				    "limit of %" PRIu64 " bytes", path, n,
				    FLOW_ST_HEADER_MAX);
		goto out_free;
	}
	if (n > file_len - 8) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: truncated: header length %" PRIu64
				    " exceeds the %" PRIu64 " bytes after it",
				    path, n, file_len - 8);
		goto out_free;
	}
	hdr = malloc(n ? n : 1);
	if (!hdr) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				    path);
		goto out_free;
	}
	err = foreign_pread(st->fd, path, hdr, n, 8, diag);
	if (err != FLOW_OK)
		goto out_free_hdr;
	if (n == 0 || hdr[0] != '{') {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: header does not start with '{'", path);
		goto out_free_hdr;
	}
	json_error_t je;
	root = json_loadb(hdr, n, JSON_REJECT_DUPLICATES, &je);
	if (!root || !json_is_object(root)) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: header byte %d: bad JSON: %s", path,
				    root ? 0 : je.position,
				    root ? "not an object" : je.text);
		goto out_free_hdr;
	}
	size_t count = json_object_size(root);
	st->tensors = calloc(count ? count : 1, sizeof *st->tensors);
	if (!st->tensors) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				    path);
		goto out_free_json;
	}
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		if (strcmp(key, "__metadata__") == 0) {
			err = st_parse_metadata(st, v, diag);
			if (err != FLOW_OK)
				goto out_free_json;
			continue;
		}
		flow_st_tensor_t *t = &st->tensors[st->n];
		err = st_parse_tensor(st, key, v, t, diag);
		if (err != FLOW_OK)
			goto out_free_json;
		t->name = strdup(key);
		if (!t->name) {
			err = flow_diag_set(diag, FLOW_ERR_NOMEM,
					    "%s: out of memory", path);
			goto out_free_json;
		}
		st->n++;
	}
	qsort(st->tensors, st->n, sizeof *st->tensors, cmp_offsets);
	st->data_start = 8 + n;
	err = st_check_layout(st, file_len - st->data_start, diag);
	if (err != FLOW_OK)
		goto out_free_json;
	json_decref(root);
	free(hdr);
	*st_out = st;
	return FLOW_OK;

out_free_json:
	json_decref(root);
out_free_hdr:
	free(hdr);
out_free:
	flow_st_free(st);
	return err;
}

size_t flow_st_tensor_count(const flow_st_t *st)
{
	return st->n;
}

const flow_st_tensor_t *flow_st_tensor_at(const flow_st_t *st, size_t index)
{
	return index < st->n ? &st->tensors[index] : NULL;
}

int flow_st_tensor_find(const flow_st_t *st, const char *name)
{
	for (size_t i = 0; i < st->n; i++)
		if (strcmp(st->tensors[i].name, name) == 0)
			return (int)i;
	return -1;
}

const char *flow_st_metadata(const flow_st_t *st, const char *key)
{
	for (size_t i = 0; i < st->nmeta; i++)
		if (strcmp(st->meta_keys[i], key) == 0)
			return st->meta_values[i];
	return NULL;
}

flow_err_t flow_st_read(const flow_st_t *st, size_t index, void *dst,
			flow_diag_t *diag)
{
	if (index >= st->n)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: no tensor %zu", st->path, index);
	const flow_st_tensor_t *t = &st->tensors[index];
	flow_diag_t tmp = FLOW_DIAG_INIT;
	flow_err_t err = foreign_pread(st->fd, st->path, dst,
				  (size_t)(t->end - t->begin),
				  st->data_start + t->begin, &tmp);
	if (err == FLOW_ERR_FORMAT) /* the file shrank since it was opened */
		return flow_diag_set(diag, FLOW_ERR_IO,
				     "%s: tensor '%s': the file was truncated "
				     "while open", st->path, t->name);
	if (err != FLOW_OK)
		return flow_diag_set(diag, err, "%s", flow_diag_message(&tmp));
	return err;
}

/* ---- writing ------------------------------------------------------------ */

struct flow_st_writer {
	flow_atomic_file_t *file;
	char *path;
	uint64_t *sizes;
	char **names;
	size_t n, next;
};

flow_err_t flow_st_data_size(const flow_st_tensor_t *tensors, size_t n,
			     uint64_t *size_out, flow_diag_t *diag)
{
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		size_t b = flow_dtype_size(tensors[i].dtype);
		for (int d = 0; d < tensors[i].shape.ndim; d++)
			if (tensors[i].shape.dims[d] < 0 ||
			    !flow_mul_size(b, (size_t)tensors[i].shape.dims[d],
					   &b))
				return flow_diag_set(diag, FLOW_ERR_RANGE,
						     "tensor '%s' is too "
						     "large",
						     tensors[i].name);
		if (!flow_add_size(total, b, &total))
			return flow_diag_set(diag, FLOW_ERR_RANGE,
					     "tensors too large at '%s'",
					     tensors[i].name);
	}
	*size_out = total;
	return FLOW_OK;
}

void flow_st_writer_abort(flow_st_writer_t *w)
{
	if (!w)
		return;
	flow_atomic_file_abort(w->file);
	for (size_t i = 0; i < w->n; i++)
		free(w->names ? w->names[i] : NULL);
	free(w->names);
	free(w->sizes);
	free(w->path);
	free(w);
}

/* The header JSON for the tensors, or NULL with diag set. */
static char *st_header_json(const char *path, const flow_st_tensor_t *t,
			    size_t n, const uint64_t *sizes,
			    const flow_ckpt_kv_t *meta, size_t nmeta,
			    flow_diag_t *diag)
{
	json_t *root = json_object();
	char *text = NULL;
	bool ok = root != NULL;
	if (ok && nmeta > 0) {
		json_t *m = json_object();
		ok = m && json_object_set_new(root, "__metadata__", m) == 0;
		for (size_t i = 0; ok && i < nmeta; i++)
			ok = json_object_set_new(m, meta[i].key,
						 json_string(meta[i].value)) ==
			     0;
	}
	uint64_t at = 0;
	for (size_t i = 0; ok && i < n; i++) {
		json_t *o = json_object(), *shape = json_array();
		ok = o && shape &&
		     json_object_set_new(o, "dtype",
					 json_string(st_dtype_name(
						 t[i].dtype))) == 0 &&
		     json_object_set_new(o, "shape", shape) == 0;
		if (!ok) {
			json_decref(o);
			json_decref(shape);
			break;
		}
		for (int d = 0; ok && d < t[i].shape.ndim; d++)
			ok = json_array_append_new(
				     shape, json_integer(t[i].shape.dims[d])) ==
			     0;
		json_t *offs = json_pack("[II]", (json_int_t)at,
					 (json_int_t)(at + sizes[i]));
		ok = ok && offs && json_object_set_new(o, "data_offsets",
							 offs) == 0;
		ok = json_object_set_new(root, t[i].name, o) == 0 && ok;
		at += sizes[i];
	}
	if (ok)
		text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER |
						JSON_ENSURE_ASCII);
	json_decref(root);
	if (!text)
		flow_diag_set(diag, FLOW_ERR_NOMEM,
			      "%s: out of memory writing the header", path);
	return text;
}

flow_err_t flow_st_writer_new(const char *path,
			      const flow_st_tensor_t *tensors, size_t n,
			      const flow_ckpt_kv_t *meta, size_t nmeta,
			      flow_st_writer_t **writer_out, flow_diag_t *diag)
{
	flow_err_t err;
	for (size_t i = 0; i < n; i++) {
		const char *name = tensors[i].name;
		if (!name || !*name || strncmp(name, "__", 2) == 0)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: bad tensor name '%s'", path,
					     name ? name : "");
		if (!st_dtype_name(tensors[i].dtype))
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "%s: tensor '%s': unsupported "
					     "dtype", path, name);
		for (size_t j = 0; j < i; j++)
			if (strcmp(tensors[j].name, name) == 0)
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "%s: tensor '%s' given "
						     "twice", path, name);
	}
	flow_st_writer_t *w = calloc(1, sizeof *w);
	if (!w)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				     path);
	w->path = strdup(path);
	w->sizes = calloc(n ? n : 1, sizeof *w->sizes);
	w->names = calloc(n ? n : 1, sizeof *w->names);
	if (!w->path || !w->sizes || !w->names) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory",
				    path);
		goto out_abort;
	}
	w->n = n;
	for (size_t i = 0; i < n; i++) {
		uint64_t s;
		err = flow_st_data_size(&tensors[i], 1, &s, diag);
		if (err != FLOW_OK)
			goto out_abort;
		w->sizes[i] = s;
		w->names[i] = strdup(tensors[i].name);
		if (!w->names[i]) {
			err = flow_diag_set(diag, FLOW_ERR_NOMEM,
					    "%s: out of memory", path);
			goto out_abort;
		}
	}
	uint64_t total;
	err = flow_st_data_size(tensors, n, &total, diag);
	if (err != FLOW_OK)
		goto out_abort;
	char *json = st_header_json(path, tensors, n, w->sizes, meta, nmeta,
				    diag);
	if (!json) {
		err = FLOW_ERR_NOMEM;
		goto out_abort;
	}
	size_t len = strlen(json), padded = (len + 7) / 8 * 8;
	if (padded > FLOW_ST_HEADER_MAX) {
		free(json);
		err = flow_diag_set(diag, FLOW_ERR_RANGE,
				    "%s: header of %zu bytes exceeds the limit "
				    "of %" PRIu64, path, padded,
				    FLOW_ST_HEADER_MAX);
		goto out_abort;
	}
	err = flow_atomic_file_open(path, &w->file, diag);
	if (err != FLOW_OK) {
		free(json);
		goto out_abort;
	}
	unsigned char lenb[8];
	for (int i = 0; i < 8; i++)
		lenb[i] = (unsigned char)((uint64_t)padded >> (8 * i));
	static const char spaces[8] = "        ";
	err = flow_atomic_file_write(w->file, lenb, 8, diag);
	if (err == FLOW_OK)
		err = flow_atomic_file_write(w->file, json, len, diag);
	if (err == FLOW_OK)
		err = flow_atomic_file_write(w->file, spaces, padded - len,
					     diag);
	free(json);
	if (err != FLOW_OK)
		goto out_abort;
	*writer_out = w;
	return FLOW_OK;

out_abort:
	flow_st_writer_abort(w);
	return err;
}

flow_err_t flow_st_writer_put(flow_st_writer_t *w, const void *data,
			      flow_diag_t *diag)
{
	if (w->next >= w->n)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: all %zu tensors are written already",
				     w->path, w->n);
	flow_err_t err = flow_atomic_file_write(
		w->file, data, (size_t)w->sizes[w->next], diag);
	if (err == FLOW_OK)
		w->next++;
	return err;
}

flow_err_t flow_st_writer_finish(flow_st_writer_t *w, flow_diag_t *diag)
{
	flow_err_t err;
	if (w->next < w->n) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "%s: tensor '%s' was not written", w->path,
				    w->names[w->next]);
		flow_st_writer_abort(w);
		return err;
	}
	err = flow_atomic_file_commit(w->file, diag);
	w->file = NULL;
	flow_st_writer_abort(w);
	return err;
}
