/* JSON string literals (flow_json_write_string, flow/json.h), the one
 * writer every --json document goes through.  There is no JSON reader in
 * libflow, so the harness decodes the literal itself: it must be one line,
 * quoted, with no raw control byte, and decode to the input (up to its
 * first NUL). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/json.h>

#include "fuzz_util.h"

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Decode the literal at s (len bytes) into out (room for len bytes). */
static size_t decode(const char *s, size_t len, char *out)
{
	if (len < 2 || s[0] != '"' || s[len - 1] != '"')
		fuzz_fail("json: not a quoted literal: %.*s", (int)len, s);
	size_t n = 0;
	for (size_t i = 1; i < len - 1; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20)
			fuzz_fail("json: raw control byte 0x%02x", c);
		if (c == '"')
			fuzz_fail("json: unescaped quote at byte %zu", i);
		if (c != '\\') {
			out[n++] = (char)c;
			continue;
		}
		if (++i >= len - 1)
			fuzz_fail("json: escape at the end");
		switch (s[i]) {
		case '"': out[n++] = '"'; break;
		case '\\': out[n++] = '\\'; break;
		case '/': out[n++] = '/'; break;
		case 'b': out[n++] = '\b'; break;
		case 'f': out[n++] = '\f'; break;
		case 'n': out[n++] = '\n'; break;
		case 'r': out[n++] = '\r'; break;
		case 't': out[n++] = '\t'; break;
		case 'u': {
			int v = 0;
			for (int k = 1; k <= 4; k++) {
				int h = i + k < len - 1 ? hexval(s[i + k]) : -1;
				if (h < 0)
					fuzz_fail("json: bad \\u escape");
				v = v * 16 + h;
			}
			if (v == 0 || v >= 0x80)
				fuzz_fail("json: \\u%04x for a single byte", v);
			out[n++] = (char)v;
			i += 4;
			break;
		}
		default:
			fuzz_fail("json: unknown escape '\\%c'", s[i]);
		}
	}
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = fuzz_strndup(data, size);
	char *buf = NULL;
	size_t len;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		fuzz_fail("open_memstream failed");
	bool ok = flow_json_write_string(f, text);
	if (fclose(f) != 0 || !ok)
		fuzz_fail("flow_json_write_string failed");
	char *out = malloc(len + 1);
	if (!out)
		fuzz_fail("out of memory");
	size_t n = decode(buf, len, out);
	fuzz_check_same("flow_json_write_string", text, strlen(text), out, n);
	free(out);
	free(buf);
	free(text);
	return 0;
}
