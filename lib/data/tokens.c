/* Token sources: text (byte-level tokenizer), llm.c token files, raw
 * little-endian uint16/uint32 and NumPy .npy arrays, read as one stream of
 * uint32 token ids through a fixed chunk buffer, so a file of any size is
 * never held in memory whole.  Every input, standard input included, is
 * read front to back without seeking: the first bytes are peeked through
 * the same buffer to detect the format.  Sizes the header promises are
 * checked against the file size at open (regular files) and again when the
 * stream ends (pipes, or a file that changed under us). */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <flow/tokens.h>

/* Bytes read from the input per fread. */
#define CHUNK_BYTES ((size_t)64 * 1024)

#define LLMC_MAGIC 20240520
#define LLMC_HEADER_BYTES 1024

/* Longest .npy header dictionary accepted: numpy writes well under 1 KiB,
 * so anything this long is not a header. */
#define NPY_HEADER_MAX ((uint32_t)1 << 20)
/* NumPy's own limit on the number of dimensions. */
#define NPY_MAX_DIMS 64

/* Name used in messages for path "-". */
#define STDIN_NAME "(stdin)"

struct flow_token_source {
	FILE *stream;
	bool own_stream; /* false for stdin */
	char *name;      /* path, or STDIN_NAME */
	flow_input_format_t format;
	const char *kind; /* "llm.c", "npy" or "raw": for size messages */
	size_t width;     /* bytes per token */
	bool is_signed;   /* npy '<i…' dtypes */
	flow_dtype_t dtype; /* raw: FLOW_DTYPE_U16 or FLOW_DTYPE_U32 */
	uint64_t vocab;   /* from options: every id must be below it; 0: none */
	int64_t count;    /* tokens the header or the size promises; -1 */
	uint64_t left;    /* tokens still to read when count >= 0 */
	uint64_t data_offset; /* byte offset of the first token */
	bool size_known;  /* a regular file: file_size is its size */
	uint64_t file_size;

	unsigned char *buf; /* CHUNK_BYTES */
	size_t pos, len;    /* unread bytes are buf[pos, len) */
	uint64_t buf_offset; /* input offset of buf[0] */
	bool eof;

	bool finished;   /* the clean end was reached and checked */
	flow_diag_t fail; /* sticky: once read fails, it keeps failing */
};

const char *flow_input_format_name(flow_input_format_t format)
{
	switch (format) {
	case FLOW_INPUT_AUTO: return "auto";
	case FLOW_INPUT_TEXT: return "text";
	case FLOW_INPUT_LLMC: return "llmc";
	case FLOW_INPUT_RAW: return "raw";
	case FLOW_INPUT_NPY: return "npy";
	}
	return NULL;
}

flow_err_t flow_input_format_parse(const char *text,
				   flow_input_format_t *format_out,
				   flow_diag_t *diag)
{
	static const flow_input_format_t all[] = {
		FLOW_INPUT_AUTO, FLOW_INPUT_TEXT, FLOW_INPUT_LLMC,
		FLOW_INPUT_RAW, FLOW_INPUT_NPY,
	};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		if (strcmp(text, flow_input_format_name(all[i])) == 0) {
			*format_out = all[i];
			return FLOW_OK;
		}
	}
	return flow_diag_set(diag, FLOW_ERR_USAGE,
			     "unknown input format '%s' (expected auto, text, "
			     "llmc, raw or npy)", text);
}

/* ---- buffered input ------------------------------------------------------ */

static uint64_t src_offset(const flow_token_source_t *s)
{
	return s->buf_offset + s->pos;
}

static size_t src_avail(const flow_token_source_t *s)
{
	return s->len - s->pos;
}

/* Read more bytes after the unread ones; sets eof at the end of input. */
static flow_err_t src_fill(flow_token_source_t *s, flow_diag_t *diag)
{
	if (s->eof)
		return FLOW_OK;
	if (s->pos > 0) {
		memmove(s->buf, s->buf + s->pos, s->len - s->pos);
		s->buf_offset += s->pos;
		s->len -= s->pos;
		s->pos = 0;
	}
	if (s->len == CHUNK_BYTES)
		return FLOW_OK;
	size_t n = fread(s->buf + s->len, 1, CHUNK_BYTES - s->len, s->stream);
	if (n == 0) {
		if (ferror(s->stream))
			return flow_diag_errno(diag, FLOW_ERR_IO, errno,
					       "cannot read '%s'", s->name);
		s->eof = true;
	}
	s->len += n;
	return FLOW_OK;
}

/* Make at least need (<= CHUNK_BYTES) bytes available unless the input
 * ends first; *avail_out is what is available afterwards. */
static flow_err_t src_peek(flow_token_source_t *s, size_t need,
			   size_t *avail_out, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	while (src_avail(s) < need && !s->eof) {
		err = src_fill(s, diag);
		if (err != FLOW_OK)
			return err;
	}
	*avail_out = src_avail(s);
	return FLOW_OK;
}

/* Copy up to n bytes to dst; *got_out < n only at the end of input. */
static flow_err_t src_read(flow_token_source_t *s, void *dst, size_t n,
			   size_t *got_out, flow_diag_t *diag)
{
	size_t got = 0;
	while (got < n) {
		if (src_avail(s) == 0) {
			flow_err_t err = src_fill(s, diag);
			if (err != FLOW_OK)
				return err;
			if (src_avail(s) == 0)
				break;
		}
		size_t take = src_avail(s);
		if (take > n - got)
			take = n - got;
		memcpy((unsigned char *)dst + got, s->buf + s->pos, take);
		s->pos += take;
		got += take;
	}
	*got_out = got;
	return FLOW_OK;
}

/* Consume and count the rest of the input (for the message about trailing
 * bytes on a stream whose size was not known). */
static flow_err_t src_drain(flow_token_source_t *s, uint64_t *end_out,
			    flow_diag_t *diag)
{
	for (;;) {
		s->pos = s->len;
		flow_err_t err = src_fill(s, diag);
		if (err != FLOW_OK)
			return err;
		if (src_avail(s) == 0)
			break;
	}
	*end_out = src_offset(s);
	return FLOW_OK;
}

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* ---- header checks ------------------------------------------------------- */

/* The header promised count tokens ending at byte expected; the input has
 * actual bytes.  One message for both directions.  Headerless input whose
 * count came from the file size only gets here when the file changed while
 * it was read. */
static flow_err_t size_mismatch(const flow_token_source_t *s,
				uint64_t expected, uint64_t actual,
				flow_diag_t *diag)
{
	if (s->format == FLOW_INPUT_TEXT || s->format == FLOW_INPUT_RAW)
		return flow_diag_set(diag, FLOW_ERR_IO,
				     "%s: the file changed while it was read "
				     "(%" PRIu64 " bytes at open, %s%" PRIu64
				     " now)", s->name, expected,
				     actual > expected ? "at least " : "",
				     actual);
	return flow_diag_set(diag, FLOW_ERR_FORMAT,
			     "%s: %s %s file: the header declares %" PRId64
			     " token%s (%" PRIu64 " bytes) but the file has %"
			     PRIu64 " bytes", s->name,
			     actual < expected ? "truncated" : "trailing bytes in",
			     s->kind, s->count, s->count == 1 ? "" : "s",
			     expected, actual);
}

/* With count known: check the file size (when known), then emptiness.
 * File sizes are uint64_t whatever size_t is, hence the builtins rather
 * than flow_mul_size. */
static flow_err_t check_counted_size(flow_token_source_t *s,
				     flow_diag_t *diag)
{
	uint64_t payload, expected;
	if (__builtin_mul_overflow((uint64_t)s->count, (uint64_t)s->width,
				   &payload) ||
	    __builtin_add_overflow(payload, s->data_offset, &expected))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: the %s header declares %" PRId64
				     " tokens, more than any file can hold",
				     s->name, s->kind, s->count);
	if (s->size_known && s->file_size != expected)
		return size_mismatch(s, expected, s->file_size, diag);
	if (s->count == 0)
		return flow_diag_set(diag, FLOW_ERR_FORMAT, "%s: empty input",
				     s->name);
	s->left = (uint64_t)s->count;
	return FLOW_OK;
}

static flow_err_t open_llmc(flow_token_source_t *s, flow_diag_t *diag)
{
	unsigned char *h = NULL;
	size_t avail;
	flow_err_t err = src_peek(s, LLMC_HEADER_BYTES, &avail, diag);
	if (err != FLOW_OK)
		return err;
	h = s->buf + s->pos;
	if (avail < 4)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: not an llm.c token file (%zu bytes, "
				     "shorter than the %d-byte header)",
				     s->name, avail, LLMC_HEADER_BYTES);
	int32_t magic = (int32_t)le32(h);
	if (magic != LLMC_MAGIC)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: not an llm.c token file (magic %" PRId32
				     ", expected %d)", s->name, magic,
				     LLMC_MAGIC);
	if (avail < LLMC_HEADER_BYTES)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: truncated llm.c header: the file has "
				     "%zu bytes, the header alone needs %d",
				     s->name, avail, LLMC_HEADER_BYTES);
	int32_t version = (int32_t)le32(h + 4);
	if (version == 1) {
		s->width = 2;
	} else if (version == 2) {
		s->width = 4;
	} else {
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: unsupported llm.c version %" PRId32
				     " at byte 4 (expected 1 for uint16 or 2 "
				     "for uint32 tokens)", s->name, version);
	}
	int32_t count = (int32_t)le32(h + 8);
	if (count < 0)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: negative llm.c token count %" PRId32
				     " at byte 8", s->name, count);
	s->pos += LLMC_HEADER_BYTES;
	s->data_offset = LLMC_HEADER_BYTES;
	s->count = count;
	return check_counted_size(s, diag);
}

/* ---- .npy ------------------------------------------------------------------ */

typedef struct npy_cursor {
	const char *p, *end;
	const char *start;
	uint64_t base; /* file offset of start */
	const flow_token_source_t *s;
	flow_diag_t *diag;
} npy_cursor_t;

static flow_err_t npy_bad(npy_cursor_t *c, const char *what)
{
	return flow_diag_set(c->diag, FLOW_ERR_FORMAT,
			     "%s: bad npy header at byte %" PRIu64 ": %s",
			     c->s->name, c->base + (uint64_t)(c->p - c->start),
			     what);
}

static void npy_skip_space(npy_cursor_t *c)
{
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' ||
				 *c->p == '\n' || *c->p == '\r'))
		c->p++;
}

static bool npy_accept(npy_cursor_t *c, char ch)
{
	npy_skip_space(c);
	if (c->p < c->end && *c->p == ch) {
		c->p++;
		return true;
	}
	return false;
}

/* A quoted Python string without escapes, copied into out[size]. */
static flow_err_t npy_string(npy_cursor_t *c, char *out, size_t size)
{
	npy_skip_space(c);
	if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
		return npy_bad(c, "expected a quoted string");
	char quote = *c->p++;
	size_t n = 0;
	while (c->p < c->end && *c->p != quote) {
		if (*c->p == '\\' || *c->p == '\n')
			return npy_bad(c, "unexpected character in string");
		if (n + 1 >= size)
			return npy_bad(c, "string too long");
		out[n++] = *c->p++;
	}
	if (c->p >= c->end)
		return npy_bad(c, "unterminated string");
	c->p++;
	out[n] = '\0';
	return FLOW_OK;
}

static bool npy_word(npy_cursor_t *c, const char *word)
{
	size_t n = strlen(word);
	npy_skip_space(c);
	if ((size_t)(c->end - c->p) >= n && memcmp(c->p, word, n) == 0) {
		c->p += n;
		return true;
	}
	return false;
}

/* '(' [int (',' int)* [',']] ')': the element count, overflow-checked. */
static flow_err_t npy_shape(npy_cursor_t *c, int *ndim_out,
			    uint64_t *count_out)
{
	uint64_t count = 1;
	int ndim = 0;
	if (!npy_accept(c, '('))
		return npy_bad(c, "expected '(' to start 'shape'");
	while (!npy_accept(c, ')')) {
		if (ndim > 0 && !npy_accept(c, ','))
			return npy_bad(c, "expected ',' or ')' in 'shape'");
		if (ndim > 0 && npy_accept(c, ')'))
			break;
		npy_skip_space(c);
		if (c->p >= c->end || *c->p < '0' || *c->p > '9')
			return npy_bad(c, "expected a dimension in 'shape'");
		/* Errors point at the start of the dimension. */
		const char *dim_start = c->p;
		uint64_t dim = 0;
		while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
			if (__builtin_mul_overflow(dim, 10, &dim) ||
			    __builtin_add_overflow(dim, (uint64_t)(*c->p - '0'),
						   &dim) ||
			    dim > INT64_MAX) {
				c->p = dim_start;
				return npy_bad(c, "dimension too large");
			}
			c->p++;
		}
		if (++ndim > NPY_MAX_DIMS) {
			c->p = dim_start;
			return npy_bad(c, "too many dimensions");
		}
		if (__builtin_mul_overflow(count, dim, &count) ||
		    count > INT64_MAX) {
			c->p = dim_start;
			return npy_bad(c, "shape has too many elements");
		}
	}
	*ndim_out = ndim;
	*count_out = count;
	return FLOW_OK;
}

/* Map an integer descr to width and signedness. */
static flow_err_t npy_descr(flow_token_source_t *s, const char *descr,
			    flow_diag_t *diag)
{
	static const struct {
		const char *descr;
		size_t width;
		bool is_signed;
	} known[] = {
		{ "|u1", 1, false }, { "|i1", 1, true },
		{ "<u2", 2, false }, { "<i2", 2, true },
		{ "<u4", 4, false }, { "<i4", 4, true },
		{ "<u8", 8, false }, { "<i8", 8, true },
	};
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		if (strcmp(descr, known[i].descr) == 0) {
			s->width = known[i].width;
			s->is_signed = known[i].is_signed;
			return FLOW_OK;
		}
	}
	char kind = descr[0] ? descr[1] : '\0';
	if (descr[0] == '>' && (kind == 'u' || kind == 'i'))
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: npy dtype '%s' is big-endian; only "
				     "little-endian integers are supported",
				     s->name, descr);
	if (kind == 'u' || kind == 'i')
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: unsupported npy dtype '%s' (expected "
				     "'|u1', '<u2', '<i4', '<u4' or '<i8')",
				     s->name, descr);
	return flow_diag_set(diag, FLOW_ERR_FORMAT,
			     "%s: npy dtype '%s' is not an integer type",
			     s->name, descr);
}

/* The header dictionary: {'descr': '<u2', 'fortran_order': False,
 * 'shape': (3,), } padded with spaces and a newline.  Each key exactly once,
 * no others. */
static flow_err_t npy_dict(npy_cursor_t *c, flow_token_source_t *s)
{
	flow_err_t err = FLOW_OK;
	char key[32], descr[32];
	bool have_descr = false, have_fortran = false, have_shape = false;
	bool fortran = false;
	int ndim = 0;
	uint64_t count = 0;
	if (!npy_accept(c, '{'))
		return npy_bad(c, "expected '{'");
	while (!npy_accept(c, '}')) {
		if ((have_descr || have_fortran || have_shape) &&
		    !npy_accept(c, ','))
			return npy_bad(c, "expected ',' or '}'");
		if (npy_accept(c, '}'))
			break;
		err = npy_string(c, key, sizeof(key));
		if (err != FLOW_OK)
			return err;
		if (!npy_accept(c, ':'))
			return npy_bad(c, "expected ':'");
		if (strcmp(key, "descr") == 0 && !have_descr) {
			npy_skip_space(c);
			if (c->p < c->end && *c->p == '[')
				return npy_bad(c, "structured dtypes are not "
						  "supported");
			err = npy_string(c, descr, sizeof(descr));
			if (err != FLOW_OK)
				return err;
			have_descr = true;
		} else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
			if (npy_word(c, "True"))
				fortran = true;
			else if (!npy_word(c, "False"))
				return npy_bad(c, "expected True or False");
			have_fortran = true;
		} else if (strcmp(key, "shape") == 0 && !have_shape) {
			err = npy_shape(c, &ndim, &count);
			if (err != FLOW_OK)
				return err;
			have_shape = true;
		} else {
			return flow_diag_set(c->diag, FLOW_ERR_FORMAT,
					     "%s: bad npy header: unexpected "
					     "or repeated key '%s'",
					     c->s->name, key);
		}
	}
	npy_skip_space(c);
	if (c->p != c->end)
		return npy_bad(c, "unexpected text after '}'");
	if (!have_descr || !have_fortran || !have_shape)
		return flow_diag_set(c->diag, FLOW_ERR_FORMAT,
				     "%s: bad npy header: missing '%s'",
				     c->s->name,
				     !have_descr     ? "descr"
				     : !have_fortran ? "fortran_order"
						     : "shape");
	err = npy_descr(s, descr, c->diag);
	if (err != FLOW_OK)
		return err;
	/* One dimension reads the same in either order. */
	if (fortran && ndim > 1)
		return flow_diag_set(c->diag, FLOW_ERR_FORMAT,
				     "%s: npy array is in Fortran order; only "
				     "C order is supported", c->s->name);
	s->count = (int64_t)count;
	return FLOW_OK;
}

static flow_err_t open_npy(flow_token_source_t *s, flow_diag_t *diag)
{
	unsigned char pre[12];
	char *header = NULL;
	size_t got;
	flow_err_t err = src_read(s, pre, 8, &got, diag);
	if (err != FLOW_OK)
		return err;
	if (got < 6 || memcmp(pre, "\x93NUMPY", 6) != 0)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: not a NumPy .npy file (no \\x93NUMPY "
				     "magic at byte 0)", s->name);
	if (got < 8)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: truncated npy header: the file has "
				     "%zu bytes", s->name, got);
	unsigned major = pre[6], minor = pre[7];
	if ((major != 1 && major != 2 && major != 3) || minor != 0)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: unsupported npy version %u.%u at byte "
				     "6 (expected 1.0, 2.0 or 3.0)",
				     s->name, major, minor);
	size_t len_bytes = major == 1 ? 2 : 4;
	err = src_read(s, pre + 8, len_bytes, &got, diag);
	if (err != FLOW_OK)
		return err;
	if (got < len_bytes)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: truncated npy header: the file has "
				     "%zu bytes", s->name, 8 + got);
	uint32_t header_len = major == 1 ? (uint32_t)pre[8] |
						   (uint32_t)pre[9] << 8
					 : le32(pre + 8);
	uint64_t header_start = 8 + len_bytes;
	if (header_len > NPY_HEADER_MAX)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: npy header length %" PRIu32 " at byte 8 "
				     "is larger than %" PRIu32 " bytes",
				     s->name, header_len, NPY_HEADER_MAX);
	size_t header_alloc;
	if (!flow_add_size(header_len, 1, &header_alloc))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory for an npy header of %" PRIu32 " bytes", s->name, header_len);
	header = malloc(header_alloc);
	if (!header)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory for an npy header of %" PRIu32 " bytes", s->name, header_len);
	err = src_read(s, header, header_len, &got, diag);
	if (err != FLOW_OK)
		goto out_free_header;
	if (got < header_len) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT,
				    "%s: truncated npy header: it declares %"
				    PRIu32 " bytes after byte %" PRIu64
				    ", the file has %" PRIu64 " bytes",
				    s->name, header_len, header_start,
				    header_start + got);
		goto out_free_header;
	}
	header[header_len] = '\0';
	npy_cursor_t c = {
		.p = header, .end = header + header_len, .start = header,
		.base = header_start, .s = s, .diag = diag,
	};
	err = npy_dict(&c, s);
	if (err != FLOW_OK)
		goto out_free_header;
	s->data_offset = header_start + header_len;
	err = check_counted_size(s, diag);

out_free_header:
	free(header);
	return err;
}

/* ---- opening -------------------------------------------------------------- */

static bool has_suffix(const char *path, const char *suffix)
{
	size_t n = strlen(path), k = strlen(suffix);
	return n >= k && strcmp(path + n - k, suffix) == 0;
}

/* Pick the format for FLOW_INPUT_AUTO from the first bytes, then the name. */
static flow_err_t detect_format(flow_token_source_t *s, const char *path,
				bool is_stdin, flow_input_format_t *format_out,
				flow_diag_t *diag)
{
	size_t avail;
	flow_err_t err = src_peek(s, 8, &avail, diag);
	if (err != FLOW_OK)
		return err;
	const unsigned char *p = s->buf + s->pos;
	if (avail >= 4 && le32(p) == LLMC_MAGIC)
		*format_out = FLOW_INPUT_LLMC;
	else if (avail >= 6 && memcmp(p, "\x93NUMPY", 6) == 0)
		*format_out = FLOW_INPUT_NPY;
	else if (!is_stdin && has_suffix(path, ".npy"))
		*format_out = FLOW_INPUT_NPY; /* fails on the magic */
	else if (!is_stdin &&
		 (has_suffix(path, ".u16") || has_suffix(path, ".u32")))
		*format_out = FLOW_INPUT_RAW;
	else
		*format_out = FLOW_INPUT_TEXT;
	return FLOW_OK;
}

static flow_err_t open_raw(flow_token_source_t *s, const char *path,
			   bool is_stdin, flow_dtype_t given,
			   flow_diag_t *diag)
{
	if (given == FLOW_DTYPE_U16 || given == FLOW_DTYPE_U32)
		s->dtype = given;
	else if (!is_stdin && has_suffix(path, ".u16"))
		s->dtype = FLOW_DTYPE_U16;
	else if (!is_stdin && has_suffix(path, ".u32"))
		s->dtype = FLOW_DTYPE_U32;
	else
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: raw input needs a token dtype: give "
				     "u16 or u32, or name the file .u16 or "
				     ".u32", s->name);
	s->width = s->dtype == FLOW_DTYPE_U16 ? 2 : 4;
	if (s->size_known) {
		if (s->file_size % s->width != 0)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: raw %s input has %" PRIu64
					     " bytes, not a multiple of %zu "
					     "(partial token at byte %" PRIu64
					     ")", s->name,
					     flow_dtype_name(s->dtype),
					     s->file_size, s->width,
					     s->file_size - s->file_size %
								    s->width);
		s->count = (int64_t)(s->file_size / s->width);
		s->left = (uint64_t)s->count;
	}
	return FLOW_OK;
}

flow_err_t flow_token_source_open(const char *path,
				  const flow_token_source_options_t *options,
				  flow_token_source_t **source_out,
				  flow_diag_t *diag)
{
	static const flow_token_source_options_t defaults = { 0 };
	flow_err_t err = FLOW_OK;
	bool is_stdin = strcmp(path, "-") == 0;
	if (!options)
		options = &defaults;
	flow_token_source_t *s = calloc(1, sizeof(*s));
	if (!s)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory opening it", path);
	s->count = -1;
	s->vocab = options->vocab;
	s->name = strdup(is_stdin ? STDIN_NAME : path);
	s->buf = malloc(CHUNK_BYTES);
	if (!s->name || !s->buf) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory for a read buffer", path);
		goto out_free;
	}
	if (is_stdin) {
		s->stream = stdin;
	} else {
		s->stream = fopen(path, "rb");
		if (!s->stream) {
			err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
					      "cannot open '%s'", path);
			goto out_free;
		}
		s->own_stream = true;
	}
	struct stat st;
	if (fstat(fileno(s->stream), &st) != 0) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot stat '%s'", s->name);
		goto out_close;
	}
	if (S_ISDIR(st.st_mode)) {
		err = flow_diag_errno(diag, FLOW_ERR_IO, EISDIR,
				      "cannot read '%s'", s->name);
		goto out_close;
	}
	if (S_ISREG(st.st_mode)) {
		/* Standard input redirected from a file may start mid-file. */
		long start = is_stdin ? ftell(s->stream) : 0;
		if (start >= 0 && (uint64_t)start <= (uint64_t)st.st_size) {
			s->size_known = true;
			s->file_size = (uint64_t)st.st_size - (uint64_t)start;
		}
	}
	size_t avail;
	err = src_peek(s, 1, &avail, diag);
	if (err != FLOW_OK)
		goto out_close;
	if (avail == 0) {
		err = flow_diag_set(diag, FLOW_ERR_FORMAT, "%s: empty input",
				    s->name);
		goto out_close;
	}

	flow_input_format_t format = options->format;
	if (format == FLOW_INPUT_AUTO) {
		err = detect_format(s, path, is_stdin, &format, diag);
		if (err != FLOW_OK)
			goto out_close;
	}
	s->format = format;
	switch (format) {
	case FLOW_INPUT_TEXT:
		s->width = 1;
		if (s->size_known) {
			s->count = (int64_t)s->file_size;
			s->left = s->file_size;
		}
		break;
	case FLOW_INPUT_LLMC:
		s->kind = "llm.c";
		err = open_llmc(s, diag);
		break;
	case FLOW_INPUT_RAW:
		s->kind = "raw";
		err = open_raw(s, path, is_stdin, options->raw_dtype, diag);
		break;
	case FLOW_INPUT_NPY:
		s->kind = "npy";
		err = open_npy(s, diag);
		break;
	default:
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "%s: unknown input format %d", s->name,
				    (int)format);
		break;
	}
	if (err != FLOW_OK)
		goto out_close;
	*source_out = s;
	return FLOW_OK;

out_close:
	if (s->own_stream)
		fclose(s->stream);
out_free:
	free(s->buf);
	free(s->name);
	free(s);
	return err;
}

void flow_token_source_free(flow_token_source_t *source)
{
	if (!source)
		return;
	if (source->own_stream && source->stream)
		fclose(source->stream);
	free(source->buf);
	free(source->name);
	free(source);
}

flow_input_format_t flow_token_source_format(const flow_token_source_t *source)
{
	return source->format;
}

uint64_t flow_token_source_vocab(const flow_token_source_t *source)
{
	return source->format == FLOW_INPUT_TEXT ? 256 : 0;
}

int64_t flow_token_source_count(const flow_token_source_t *source)
{
	return source->count;
}

/* ---- reading -------------------------------------------------------------- */

/* Record a failure in the source (so later reads repeat it) and in diag. */
static int64_t source_fail(flow_token_source_t *s, flow_diag_t *diag,
			   flow_err_t err, const char *fmt, ...)
	FLOW_PRINTF(4, 5);

static int64_t source_fail(flow_token_source_t *s, flow_diag_t *diag,
			   flow_err_t err, const char *fmt, ...)
{
	va_list ap;
	s->fail.err = err;
	va_start(ap, fmt);
	if (vsnprintf(s->fail.msg, sizeof(s->fail.msg), fmt, ap) < 0)
		s->fail.msg[0] = '\0';
	va_end(ap);
	return flow_diag_set(diag, err, "%s", s->fail.msg);
}

/* Forward an error some helper put into a private diag. */
static int64_t source_fail_diag(flow_token_source_t *s, flow_diag_t *diag,
				const flow_diag_t *inner)
{
	return source_fail(s, diag, inner->err, "%s",
			   flow_diag_message(inner));
}

/* Decode one token at p (input offset off), check it, store it. */
static flow_err_t decode(flow_token_source_t *s, const unsigned char *p,
			 uint64_t off, uint32_t *token_out, flow_diag_t *diag)
{
	uint64_t u;
	switch (s->width) {
	case 1: u = p[0]; break;
	case 2: u = (uint64_t)p[0] | (uint64_t)p[1] << 8; break;
	case 4: u = le32(p); break;
	default: u = le64(p); break;
	}
	if (s->is_signed) {
		int64_t v;
		switch (s->width) {
		case 1: v = (int8_t)u; break;
		case 2: v = (int16_t)u; break;
		case 4: v = (int32_t)u; break;
		default: v = (int64_t)u; break;
		}
		if (v < 0)
			return flow_diag_set(diag, FLOW_ERR_FORMAT,
					     "%s: token %" PRId64 " at byte %"
					     PRIu64 " is negative",
					     s->name, v, off);
	}
	if (s->vocab > 0 && u >= s->vocab)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: token %" PRIu64 " at byte %" PRIu64
				     " is not below the vocabulary size %"
				     PRIu64, s->name, u, off, s->vocab);
	if (u > UINT32_MAX)
		return flow_diag_set(diag, FLOW_ERR_FORMAT,
				     "%s: token %" PRIu64 " at byte %" PRIu64
				     " does not fit a 32-bit token id",
				     s->name, u, off);
	*token_out = (uint32_t)u;
	return FLOW_OK;
}

/* At the end of the tokens: anything left over is an error. */
static int64_t finish(flow_token_source_t *s, flow_diag_t *diag)
{
	flow_diag_t inner = FLOW_DIAG_INIT;
	size_t avail;
	uint64_t end;
	if (src_peek(s, 1, &avail, &inner) != FLOW_OK)
		return source_fail_diag(s, diag, &inner);
	if (avail > 0 && s->count >= 0) {
		uint64_t expected = src_offset(s);
		if (src_drain(s, &end, &inner) != FLOW_OK)
			return source_fail_diag(s, diag, &inner);
		size_mismatch(s, expected, end, &inner);
		return source_fail_diag(s, diag, &inner);
	}
	s->finished = true;
	return 0;
}

int64_t flow_token_source_read(flow_token_source_t *source, uint32_t *tokens,
			       size_t cap, flow_diag_t *diag)
{
	flow_token_source_t *s = source;
	flow_diag_t inner = FLOW_DIAG_INIT;
	if (s->fail.err != FLOW_OK)
		return flow_diag_set(diag, s->fail.err, "%s", s->fail.msg);
	if (s->finished)
		return 0;
	if (cap == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "%s: token read with no room (cap 0)",
				     s->name);
	if (cap > INT64_MAX)
		cap = INT64_MAX;
	/* Known counts (headers, or a regular file's size) bound the read,
	 * so a file that grows while we read is still caught as trailing. */
	bool counted = s->count >= 0;
	size_t n = cap;
	if (counted && s->left < n)
		n = (size_t)s->left;
	if (n == 0)
		return finish(s, diag);

	size_t done = 0;
	while (done < n) {
		if (src_avail(s) < s->width) {
			if (src_fill(s, &inner) != FLOW_OK)
				return source_fail_diag(s, diag, &inner);
			if (src_avail(s) < s->width && s->eof)
				break;
			continue;
		}
		size_t whole = src_avail(s) / s->width;
		if (whole > n - done)
			whole = n - done;
		for (size_t i = 0; i < whole; i++) {
			if (decode(s, s->buf + s->pos, src_offset(s),
				   &tokens[done + i], &inner) != FLOW_OK)
				return source_fail_diag(s, diag, &inner);
			s->pos += s->width;
		}
		done += whole;
	}
	if (counted)
		s->left -= done;
	if (done == n)
		return (int64_t)done;

	/* The input ended early. */
	uint64_t end = src_offset(s) + src_avail(s);
	if (counted) {
		uint64_t expected = s->data_offset +
				    (uint64_t)s->count * s->width;
		size_mismatch(s, expected, end, &inner);
		return source_fail_diag(s, diag, &inner);
	}
	if (src_avail(s) > 0)
		return source_fail(s, diag, FLOW_ERR_FORMAT,
				   "%s: raw %s input has %" PRIu64 " bytes, not "
				   "a multiple of %zu (partial token at byte %"
				   PRIu64 ")", s->name,
				   flow_dtype_name(s->dtype), end, s->width,
				   src_offset(s));
	/* Tokens returned before the end count; the next call returns 0. */
	if (done > 0)
		return (int64_t)done;
	s->finished = true;
	return 0;
}
