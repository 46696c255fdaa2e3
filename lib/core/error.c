/* Error names and the diagnostic that carries one message line. */
#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <flow/error.h>

const char *flow_err_name(flow_err_t err)
{
	switch (err) {
	case FLOW_OK: return "FLOW_OK";
	case FLOW_ERR_NOMEM: return "FLOW_ERR_NOMEM";
	case FLOW_ERR_IO: return "FLOW_ERR_IO";
	case FLOW_ERR_FORMAT: return "FLOW_ERR_FORMAT";
	case FLOW_ERR_CHECKSUM: return "FLOW_ERR_CHECKSUM";
	case FLOW_ERR_USAGE: return "FLOW_ERR_USAGE";
	case FLOW_ERR_PEER: return "FLOW_ERR_PEER";
	case FLOW_ERR_TIMEOUT: return "FLOW_ERR_TIMEOUT";
	case FLOW_ERR_DEVICE: return "FLOW_ERR_DEVICE";
	case FLOW_ERR_RANGE: return "FLOW_ERR_RANGE";
	case FLOW_ERR_NOTSUP: return "FLOW_ERR_NOTSUP";
	case FLOW_ERR_VERIFY: return "FLOW_ERR_VERIFY";
	}
	return "FLOW_ERR_UNKNOWN";
}

void flow_diag_clear(flow_diag_t *diag)
{
	if (!diag)
		return;
	diag->err = FLOW_OK;
	diag->msg[0] = '\0';
}

/* Length of the valid UTF-8 character of two or more bytes at p (which
 * is NUL-terminated), or 0.  The C1 controls (U+0080..U+009F) count as
 * invalid: terminals act on them. */
static size_t utf8_length(const unsigned char *p)
{
	unsigned char c = p[0];
	size_t n;
	unsigned char lo = 0x80, hi = 0xbf;
	if (c >= 0xc2 && c <= 0xdf) {
		n = 2;
		if (c == 0xc2)
			lo = 0xa0;
	} else if (c >= 0xe0 && c <= 0xef) {
		n = 3;
		if (c == 0xe0)
			lo = 0xa0;
		else if (c == 0xed)
			hi = 0x9f; /* no UTF-16 surrogates */
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 4;
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f; /* nothing above U+10FFFF */
	} else {
		return 0;
	}
	if (p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < n; i++)
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	return n;
}

char *flow_escape_line(char *dst, size_t cap, const char *src)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *p = (const unsigned char *)src;
	size_t used = 0;
	while (*p) {
		char esc[5];
		const char *piece = (const char *)p;
		size_t len = 1, advance = 1;
		if (*p >= 0x80)
			len = advance = utf8_length(p);
		if (len == 0 || *p < 0x20 || *p == 0x7f) {
			piece = esc;
			esc[0] = '\\';
			if (*p == '\n' || *p == '\r' || *p == '\t') {
				esc[1] = *p == '\n' ? 'n' : *p == '\r' ? 'r' : 't';
				len = 2;
			} else {
				esc[1] = 'x';
				esc[2] = hex[*p >> 4];
				esc[3] = hex[*p & 15];
				len = 4;
			}
			advance = 1;
		}
		if (len >= cap - used)
			break;
		memcpy(dst + used, piece, len);
		used += len;
		p += advance;
	}
	dst[used] = '\0';
	return dst;
}

/* Format into diag unless it already holds an error (the first one wins). */
static flow_err_t diag_vset(flow_diag_t *diag, flow_err_t err, int errnum,
			    const char *fmt, va_list ap)
{
	if (!diag || diag->err != FLOW_OK)
		return err;
	diag->err = err;
	char raw[FLOW_DIAG_MAX];
	int n = vsnprintf(raw, sizeof(raw), fmt, ap);
	if (n < 0)
		raw[0] = '\0';
	if (errnum != 0) {
		size_t used = strlen(raw);
		snprintf(raw + used, sizeof(raw) - used, ": %s",
			 strerror(errnum));
	}
	flow_escape_line(diag->msg, sizeof(diag->msg), raw);
	return err;
}

flow_err_t flow_diag_set(flow_diag_t *diag, flow_err_t err, const char *fmt,
			 ...)
{
	va_list ap;
	va_start(ap, fmt);
	diag_vset(diag, err, 0, fmt, ap);
	va_end(ap);
	return err;
}

flow_err_t flow_diag_errno(flow_diag_t *diag, flow_err_t err, int errnum,
			   const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	diag_vset(diag, err, errnum, fmt, ap);
	va_end(ap);
	return err;
}

const char *flow_diag_message(const flow_diag_t *diag)
{
	if (!diag || diag->err == FLOW_OK)
		return "";
	if (diag->msg[0] == '\0')
		return flow_err_name(diag->err);
	return diag->msg;
}
