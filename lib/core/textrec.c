/* Line-oriented, checksummed text records: the reader and the writer that
 * the dataset manifest and the checkpoint manifest and indexes share.  See
 * textrec_internal.h. */
#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "textrec_internal.h"

flow_err_t flow_textrec_init(flow_textrec_t *r,
			     const flow_textrec_format_t *format,
			     const char *path, char *text, size_t len,
			     flow_diag_t *diag)
{
	memset(r, 0, sizeof(*r));
	r->format = format;
	r->path = path;
	r->diag = diag;
	r->text = text;
	r->len = len;
	if (!(r->sum = flow_checksum_state_new()))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory for a checksum state", path);
	return FLOW_OK;
}

void flow_textrec_release(flow_textrec_t *r)
{
	if (!r)
		return;
	flow_checksum_state_free(r->sum);
	r->sum = NULL;
}

flow_err_t flow_textrec_error(flow_textrec_t *r, const char *fmt, ...)
{
	char msg[FLOW_DIAG_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return flow_diag_set(r->diag, FLOW_ERR_FORMAT, "%s:%zu: %s", r->path,
			     r->line, msg);
}

/* text (" (truncated?)") when the format's messages name the likely
 * cause, else "". */
static const char *hint(const flow_textrec_t *r, const char *text)
{
	return r->format->hint_causes ? text : "";
}

flow_err_t flow_textrec_error_eof(flow_textrec_t *r, const char *want)
{
	r->line++;
	return flow_textrec_error(r, "unexpected end of file, expected '%s'%s",
				  want, hint(r, " (truncated?)"));
}

static bool is_separator(const flow_textrec_t *r, char c)
{
	return c == ' ' ||
	       (c == '\t' && r->format->sep == FLOW_TEXTREC_SEP_BLANKS);
}

int flow_textrec_next(flow_textrec_t *r, char **line_out, size_t *len_out)
{
	if (r->at >= r->len)
		return 0;
	char *line = r->text + r->at;
	char *nl = memchr(line, '\n', r->len - r->at);
	r->line++;
	if (!nl)
		return flow_textrec_error(r, "missing newline at the end of the file%s",
					  hint(r, " (truncated?)"));
	size_t n = (size_t)(nl - line);
	r->at += n + 1;
	/* The closing checksum covers the text as read: fold each line in
	 * before it is cut up, unless it is the closing one. */
	size_t klen = strlen(r->format->end_key);
	bool is_end = n >= klen && memcmp(line, r->format->end_key, klen) == 0 &&
		      (n == klen || is_separator(r, line[klen]));
	if (!is_end)
		flow_checksum_update(r->sum, line, n + 1);
	*nl = '\0';
	*line_out = line;
	*len_out = n;
	return 1;
}

/* Runs of spaces and tabs separate fields. */
static flow_err_t split_blanks(flow_textrec_t *r, char *line)
{
	char *s = line;
	while (*s) {
		while (*s == ' ' || *s == '\t')
			s++;
		if (!*s)
			break;
		if (r->nfields == FLOW_TEXTREC_MAX_FIELDS)
			return flow_textrec_error(r, "too many fields");
		r->fields[r->nfields++] = s;
		while (*s && *s != ' ' && *s != '\t')
			s++;
		if (*s)
			*s++ = '\0';
	}
	return FLOW_OK;
}

/* Exactly one space separates fields; none is empty. */
static flow_err_t split_space(flow_textrec_t *r, char *line)
{
	if (!*line)
		return flow_textrec_error(r, "empty line");
	for (char *s = line;;) {
		if (r->nfields == FLOW_TEXTREC_MAX_FIELDS)
			return flow_textrec_error(r, "too many fields");
		r->fields[r->nfields++] = s;
		char *sp = strchr(s, ' ');
		if (!sp)
			break;
		*sp = '\0';
		s = sp + 1;
	}
	for (int i = 0; i < r->nfields; i++)
		if (!*r->fields[i])
			return flow_textrec_error(r, "empty field %d (fields are separated by single spaces)",
						  i + 1);
	return FLOW_OK;
}

flow_err_t flow_textrec_split(flow_textrec_t *r, char *line)
{
	r->nfields = 0;
	if (r->format->sep == FLOW_TEXTREC_SEP_BLANKS)
		return split_blanks(r, line);
	return split_space(r, line);
}

flow_err_t flow_textrec_expect_fields(flow_textrec_t *r, int n,
				      const char *syntax)
{
	if (r->nfields != n)
		return flow_textrec_error(r, "expected '%s', got %d fields",
					  syntax, r->nfields);
	return FLOW_OK;
}

bool flow_textrec_parse_u64(const char *s, size_t len, uint64_t max,
			    uint64_t *out)
{
	if (len == 0 || (s[0] == '0' && len > 1))
		return false;
	uint64_t v = 0;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		if (__builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, (uint64_t)(s[i] - '0'), &v))
			return false;
	}
	if (v > max)
		return false;
	*out = v;
	return true;
}

flow_err_t flow_textrec_field_u64(flow_textrec_t *r, int i, const char *what,
				  uint64_t min, uint64_t max, uint64_t *out)
{
	const char *t = r->fields[i];
	uint64_t v;
	if (!flow_textrec_parse_u64(t, strlen(t), max, &v) || v < min)
		return flow_textrec_error(r, "invalid %s '%s'", what, t);
	*out = v;
	return FLOW_OK;
}

/* Exactly 16 hex digits, lowercase ones when the format says so. */
static bool parse_sum(const flow_textrec_t *r, const char *t, uint64_t *out)
{
	if (r->format->lowercase_sums)
		for (const char *c = t; *c; c++)
			if (*c >= 'A' && *c <= 'F')
				return false;
	flow_diag_t inner = FLOW_DIAG_INIT;
	return flow_checksum_parse(t, out, &inner) == FLOW_OK;
}

flow_err_t flow_textrec_field_sum(flow_textrec_t *r, int i, uint64_t *out)
{
	if (!parse_sum(r, r->fields[i], out))
		return flow_textrec_error(r, "invalid checksum '%s' (expected 16 %shex digits)",
					  r->fields[i],
					  r->format->lowercase_sums ? "lowercase " : "");
	return FLOW_OK;
}

flow_err_t flow_textrec_verify_end(flow_textrec_t *r, uint64_t stored)
{
	uint64_t computed = flow_checksum_digest(r->sum);
	if (computed == stored)
		return FLOW_OK;
	char hex[17];
	flow_checksum_format(computed, hex);
	return flow_diag_set(r->diag, FLOW_ERR_CHECKSUM,
			     "%s:%zu: checksum mismatch: stored %s, computed %s%s",
			     r->path, r->line, r->fields[1], hex,
			     hint(r, " (damaged file)"));
}

/* ---- writing ---------------------------------------------------------------- */

void flow_textrec_printf(flow_textrec_buf_t *b, const char *fmt, ...)
{
	if (b->failed)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	size_t need;
	if (n < 0 || !flow_add_size(b->len, (size_t)n + 1, &need)) {
		b->failed = true;
		return;
	}
	if (need > b->cap) {
		size_t ncap = b->cap ? b->cap : 4096;
		while (ncap < need)
			if (!flow_mul_size(ncap, 2, &ncap)) {
				b->failed = true;
				return;
			}
		char *nb = realloc(b->buf, ncap);
		if (!nb) {
			b->failed = true;
			return;
		}
		b->buf = nb;
		b->cap = ncap;
	}
	va_start(ap, fmt);
	vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

uint64_t flow_textrec_seal(flow_textrec_buf_t *b,
			   const flow_textrec_format_t *format)
{
	if (b->failed)
		return 0;
	uint64_t sum = flow_checksum(b->buf, b->len);
	char hex[17];
	flow_checksum_format(sum, hex);
	flow_textrec_printf(b, "%s %s\n", format->end_key, hex);
	return sum;
}

void flow_textrec_buf_release(flow_textrec_buf_t *b)
{
	if (!b)
		return;
	free(b->buf);
	b->buf = NULL;
	b->len = b->cap = 0;
	b->failed = false;
}
