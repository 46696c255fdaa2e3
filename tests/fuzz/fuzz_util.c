/* Shared helpers of the fuzz targets: see fuzz_util.h. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/checksum.h>

#include "fuzz_util.h"

void fuzz_fail(const char *fmt, ...)
{
	va_list ap;
	fputs("fuzz: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

void fuzz_check_diag(const char *what, flow_err_t err,
		     const flow_diag_t *diag)
{
	if (err == FLOW_OK)
		return;
	if (getenv("FLOW_FUZZ_DEBUG"))
		fprintf(stderr, "fuzz: %s: %s: %s\n", what, flow_err_name(err),
			diag->msg);
	if (err > 0 || err < FLOW_ERR_VERIFY)
		fuzz_fail("%s: returned %d, not a flow_err_t", what, (int)err);
	if (diag->err != err)
		fuzz_fail("%s: returned %s but diag holds %s", what,
			  flow_err_name(err), flow_err_name(diag->err));
	/* Inputs are small: running out of memory means a reader allocated
	 * for what the input claims (the drivers bound memory at 2 GiB). */
	if (err == FLOW_ERR_NOMEM)
		fuzz_fail("%s: out of memory: %s", what, diag->msg);
	if (diag->msg[0] == '\0')
		fuzz_fail("%s: %s with an empty message", what,
			  flow_err_name(err));
	/* Every message escapes the bytes it quotes: one printable line. */
	for (const char *c = diag->msg; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			fuzz_fail("%s: message has control byte 0x%02x: %s",
				  what, (unsigned)(unsigned char)*c,
				  diag->msg);
}

char *fuzz_strndup(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);
	if (!s)
		fuzz_fail("out of memory");
	if (size)
		memcpy(s, data, size);
	s[size] = '\0';
	return s;
}

uint8_t fuzz_take_byte(const uint8_t **data, size_t *size)
{
	if (*size == 0)
		return 0;
	uint8_t b = **data;
	(*data)++;
	(*size)--;
	return b;
}

size_t fuzz_split(const uint8_t *data, size_t size, const uint8_t **parts,
		  size_t *lens, size_t max)
{
	static const char sep[] = FUZZ_SEPARATOR;
	const size_t seplen = sizeof sep - 1;
	size_t n = 0, start = 0;
	for (size_t i = 0; n + 1 < max && i + seplen <= size; i++) {
		if (memcmp(data + i, sep, seplen) != 0)
			continue;
		parts[n] = data + start;
		lens[n] = i - start;
		n++;
		start = i + seplen;
		i = start - 1;
	}
	parts[n] = data + start;
	lens[n] = size - start;
	return n + 1;
}

/* ---- scratch files ------------------------------------------------------ */

static char scratch[512];

static void remove_tree(const char *path, int depth)
{
	DIR *d = opendir(path);
	if (!d)
		return;
	struct dirent *e;
	char child[1024];
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(child, sizeof child, "%s/%s", path, e->d_name);
		if (unlink(child) != 0 && depth > 0) {
			remove_tree(child, depth - 1);
			rmdir(child);
		}
	}
	closedir(d);
}

static void remove_scratch(void)
{
	remove_tree(scratch, 2);
	rmdir(scratch);
}

const char *fuzz_dir(void)
{
	if (scratch[0])
		return scratch;
	const char *base = getenv("TMPDIR");
	struct stat st;
	if (!base || !*base)
		base = stat("/dev/shm", &st) == 0 ? "/dev/shm" : "/tmp";
	snprintf(scratch, sizeof scratch, "%s/flow-fuzz-%ld", base,
		 (long)getpid());
	if (mkdir(scratch, 0700) != 0 && errno != EEXIST)
		fuzz_fail("cannot create '%s': %s", scratch, strerror(errno));
	atexit(remove_scratch);
	return scratch;
}

void fuzz_path(char *buf, size_t cap, const char *name)
{
	int n = snprintf(buf, cap, "%s/%s", fuzz_dir(), name);
	if (n < 0 || (size_t)n >= cap)
		fuzz_fail("path of '%s' too long", name);
}

void fuzz_write(char *buf, size_t cap, const char *name, const void *data,
		size_t len)
{
	fuzz_path(buf, cap, name);
	FILE *f = fopen(buf, "wb");
	if (!f)
		fuzz_fail("cannot create '%s': %s", buf, strerror(errno));
	if ((len && fwrite(data, 1, len, f) != len) || fclose(f) != 0)
		fuzz_fail("cannot write '%s'", buf);
}

void fuzz_clean(void)
{
	remove_tree(fuzz_dir(), 1);
}

/* ---- checksum fix-ups ---------------------------------------------------- */

void fuzz_fix_trailing_sum(uint8_t *buf, size_t len)
{
	if (len < 8)
		return;
	uint64_t sum = flow_checksum(buf, len - 8);
	for (int i = 0; i < 8; i++)
		buf[len - 8 + i] = (uint8_t)(sum >> (8 * i));
}

bool fuzz_fix_text_sum(char *text, size_t len, const char *key)
{
	size_t klen = strlen(key);
	for (size_t i = len; i-- > 0;) {
		bool at_line = i == 0 || text[i - 1] == '\n';
		if (!at_line || len - i < klen + 1 + 16 ||
		    memcmp(text + i, key, klen) != 0 || text[i + klen] != ' ')
			continue;
		char hex[17];
		flow_checksum_format(flow_checksum(text, i), hex);
		memcpy(text + i + klen + 1, hex, 16);
		return true;
	}
	return false;
}

void fuzz_check_same(const char *what, const char *a, size_t alen,
		     const char *b, size_t blen)
{
	if (alen == blen && memcmp(a, b, alen) == 0)
		return;
	size_t i = 0;
	while (i < alen && i < blen && a[i] == b[i])
		i++;
	fprintf(stderr, "fuzz: %s: first print (%zu bytes):\n%.*s\n"
		"fuzz: second print (%zu bytes):\n%.*s\n", what, alen,
		(int)alen, a, blen, (int)blen, b);
	fuzz_fail("%s: printing the parsed print changes it at byte %zu",
		  what, i);
}

bool fuzz_text_round_trip(const fuzz_text_codec_t *codec,
			  const uint8_t *data, size_t size)
{
	char *text = fuzz_strndup(data, size);
	void *v1 = calloc(2, codec->size);
	if (!v1)
		fuzz_fail("out of memory");
	void *v2 = (char *)v1 + codec->size;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = codec->parse(text, v1, &diag);
	fuzz_check_diag(codec->name, err, &diag);
	if (err == FLOW_OK) {
		char a[1024], b[1024];
		size_t alen = codec->format(v1, a, sizeof a);
		if (alen >= sizeof a)
			fuzz_fail("%s: a print of %zu bytes", codec->name, alen);
		err = codec->parse(a, v2, &diag);
		if (err != FLOW_OK)
			fuzz_fail("%s: its own print '%s' does not parse: %s",
				  codec->name, a, flow_diag_message(&diag));
		size_t blen = codec->format(v2, b, sizeof b);
		if (blen >= sizeof b)
			fuzz_fail("%s: a print of %zu bytes", codec->name, blen);
		fuzz_check_same(codec->name, a, alen, b, blen);
	}
	free(v1);
	free(text);
	return err == FLOW_OK;
}
