/* The dataset manifest: a versioned line-oriented text file listing the
 * shards of a dataset, closed by the XXH3-64 of every byte before its last
 * line.  Parsing is strict (fixed line order, exact field counts, counts
 * that add up) and every error names "DIR/manifest:LINE".  flow-shard(5)
 * is the specification. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/checksum.h>
#include <flow/file.h>
#include <flow/parse.h>
#include <flow/shard.h>

#define MAX_FIELDS 8

void flow_manifest_release(flow_manifest_t *manifest)
{
	if (!manifest)
		return;
	for (size_t i = 0; i < manifest->nshards; i++)
		free(manifest->shards[i].file);
	free(manifest->shards);
	manifest->shards = NULL;
	manifest->nshards = 0;
}

/* ---- parsing ------------------------------------------------------------- */

typedef struct parser {
	const char *where; /* "DIR/manifest" */
	size_t line;
	char *fields[MAX_FIELDS];
	int nfields;
	flow_diag_t *diag;
} parser_t;

static flow_err_t perr(parser_t *p, const char *fmt, ...) FLOW_PRINTF(2, 3);

static flow_err_t perr(parser_t *p, const char *fmt, ...)
{
	char msg[FLOW_DIAG_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return flow_diag_set(p->diag, FLOW_ERR_FORMAT, "%s:%zu: %s", p->where,
			     p->line, msg);
}

/* Split line (modified in place) at single spaces or tabs. */
static flow_err_t split_fields(parser_t *p, char *line)
{
	p->nfields = 0;
	char *s = line;
	while (*s) {
		while (*s == ' ' || *s == '\t')
			s++;
		if (!*s)
			break;
		if (p->nfields == MAX_FIELDS)
			return perr(p, "too many fields");
		p->fields[p->nfields++] = s;
		while (*s && *s != ' ' && *s != '\t')
			s++;
		if (*s)
			*s++ = '\0';
	}
	return FLOW_OK;
}

static flow_err_t expect_key(parser_t *p, const char *key, int nfields,
			     const char *syntax)
{
	if (p->nfields == 0 || strcmp(p->fields[0], key) != 0)
		return perr(p, "expected '%s', got '%s'", key,
			    p->nfields ? p->fields[0] : "");
	if (p->nfields != nfields)
		return perr(p, "expected '%s', got %d fields", syntax,
			    p->nfields);
	return FLOW_OK;
}

static flow_err_t field_u64(parser_t *p, int i, const char *what,
			    uint64_t min, uint64_t *out)
{
	int64_t v;
	flow_diag_t inner = FLOW_DIAG_INIT;
	const char *t = p->fields[i];
	/* No sign, no leading zeros beyond "0": one spelling per number. */
	if (t[0] == '+' || t[0] == '-' || (t[0] == '0' && t[1] != '\0') ||
	    flow_parse_int(t, (int64_t)min, INT64_MAX, &v, &inner) != FLOW_OK)
		return perr(p, "invalid %s '%s'", what, t);
	*out = (uint64_t)v;
	return FLOW_OK;
}

static bool valid_file_name(const char *name)
{
	if (!name[0] || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
	    strcmp(name, "manifest") == 0)
		return false;
	for (const char *c = name; *c; c++)
		if (*c == '/' || *c == '"' || *c == '\\' ||
		    (unsigned char)*c <= ' ' || (unsigned char)*c >= 0x7f)
			return false;
	return true;
}

/* The split a shard belongs to, from its name "<split>-...". */
static bool split_of_file(const char *name, flow_split_t *split_out)
{
	for (int s = 0; s < FLOW_SPLIT_COUNT; s++) {
		const char *prefix = flow_split_name((flow_split_t)s);
		size_t n = strlen(prefix);
		if (strncmp(name, prefix, n) == 0 && name[n] == '-') {
			*split_out = (flow_split_t)s;
			return true;
		}
	}
	return false;
}

/* The parser walks these states; each line must be what the state
 * expects (comments and blank lines aside). */
enum { S_MAGIC, S_VOCAB, S_DTYPE, S_COMPRESSION, S_SPLIT_TRAIN, S_SPLIT_VAL,
       S_SHARDS, S_END };

static flow_err_t parse_line(parser_t *p, int *state, flow_manifest_t *m,
			     size_t *cap, uint64_t split_shards[],
			     flow_diag_t *diag)
{
	flow_err_t err;
	uint64_t v = 0;
	switch (*state) {
	case S_MAGIC:
		if ((err = expect_key(p, "flow-manifest", 2,
				      "flow-manifest VERSION")) != FLOW_OK)
			return err;
		if ((err = field_u64(p, 1, "version", 0, &v)) != FLOW_OK)
			return err;
		if (v != FLOW_MANIFEST_VERSION)
			return perr(p, "unsupported manifest version %" PRIu64
				    " (expected %d)", v, FLOW_MANIFEST_VERSION);
		m->version = (uint32_t)v;
		*state = S_VOCAB;
		return FLOW_OK;
	case S_VOCAB:
		if ((err = expect_key(p, "vocab", 2, "vocab N")) != FLOW_OK ||
		    (err = field_u64(p, 1, "vocabulary size", 1, &v)) != FLOW_OK)
			return err;
		if (v > 4294967296ull)
			return perr(p, "vocabulary size %" PRIu64
				    " is above 4294967296", v);
		m->vocab = v;
		*state = S_DTYPE;
		return FLOW_OK;
	case S_DTYPE:
		if ((err = expect_key(p, "token_dtype", 2,
				      "token_dtype u16|u32")) != FLOW_OK)
			return err;
		if (strcmp(p->fields[1], "u16") == 0)
			m->token_dtype = FLOW_DTYPE_U16;
		else if (strcmp(p->fields[1], "u32") == 0)
			m->token_dtype = FLOW_DTYPE_U32;
		else
			return perr(p, "unknown token dtype '%s' (expected u16 or u32)",
				    p->fields[1]);
		if (m->token_dtype == FLOW_DTYPE_U16 && m->vocab > 65536)
			return perr(p, "token dtype u16 cannot hold the vocabulary size %" PRIu64,
				    m->vocab);
		*state = S_COMPRESSION;
		return FLOW_OK;
	case S_COMPRESSION:
		if (p->nfields == 2 && strcmp(p->fields[0], "compression") == 0 &&
		    strcmp(p->fields[1], "none") == 0) {
			m->zstd_level = 0;
			m->frame_tokens = 0;
		} else {
			if ((err = expect_key(p, "compression", 4,
					      "compression zstd LEVEL FRAME_TOKENS' or 'compression none")) != FLOW_OK)
				return err;
			if (strcmp(p->fields[1], "zstd") != 0)
				return perr(p, "unknown compression '%s' (expected zstd or none)",
					    p->fields[1]);
			int64_t level;
			flow_diag_t inner = FLOW_DIAG_INIT;
			if (flow_parse_int(p->fields[2], -131072, 22, &level,
					   &inner) != FLOW_OK || level == 0)
				return perr(p, "invalid zstd level '%s'",
					    p->fields[2]);
			if ((err = field_u64(p, 3, "tokens per frame", 1, &v)) != FLOW_OK)
				return err;
			if (v > UINT32_MAX)
				return perr(p, "tokens per frame %" PRIu64
					    " is above %" PRIu32, v, UINT32_MAX);
			m->zstd_level = (int)level;
			m->frame_tokens = (uint32_t)v;
		}
		*state = S_SPLIT_TRAIN;
		return FLOW_OK;
	case S_SPLIT_TRAIN:
	case S_SPLIT_VAL: {
		flow_split_t split = *state == S_SPLIT_TRAIN ? FLOW_SPLIT_TRAIN :
							       FLOW_SPLIT_VAL;
		if ((err = expect_key(p, "split", 6,
				      "split NAME N tokens K shards")) != FLOW_OK)
			return err;
		if (strcmp(p->fields[1], flow_split_name(split)) != 0)
			return perr(p, "expected split '%s', got '%s'",
				    flow_split_name(split), p->fields[1]);
		if (strcmp(p->fields[3], "tokens") != 0)
			return perr(p, "expected 'tokens', got '%s'", p->fields[3]);
		if (strcmp(p->fields[5], "shards") != 0)
			return perr(p, "expected 'shards', got '%s'", p->fields[5]);
		if ((err = field_u64(p, 2, "token count", 0,
				     &m->split_tokens[split])) != FLOW_OK ||
		    (err = field_u64(p, 4, "shard count", 0,
				     &split_shards[split])) != FLOW_OK)
			return err;
		*state = *state == S_SPLIT_TRAIN ? S_SPLIT_VAL : S_SHARDS;
		return FLOW_OK;
	}
	case S_SHARDS: {
		if ((err = expect_key(p, "shard", 5,
				      "shard FILE TOKENS BYTES CHECKSUM")) != FLOW_OK)
			return err;
		flow_manifest_shard_t sh;
		memset(&sh, 0, sizeof(sh));
		const char *file = p->fields[1];
		if (!valid_file_name(file))
			return perr(p, "invalid shard file name '%s'", file);
		if (!split_of_file(file, &sh.split))
			return perr(p, "shard file name '%s' does not start with 'train-' or 'val-'",
				    file);
		for (size_t i = 0; i < m->nshards; i++)
			if (strcmp(m->shards[i].file, file) == 0)
				return perr(p, "shard '%s' is listed twice", file);
		if ((err = field_u64(p, 2, "token count", 0, &sh.info.tokens)) != FLOW_OK ||
		    (err = field_u64(p, 3, "byte size", 72, &sh.info.bytes)) != FLOW_OK)
			return err;
		flow_diag_t inner = FLOW_DIAG_INIT;
		if (flow_checksum_parse(p->fields[4], &sh.info.checksum,
					&inner) != FLOW_OK)
			return perr(p, "invalid checksum '%s' (expected 16 hex digits)",
				    p->fields[4]);
		if (m->nshards == *cap) {
			size_t ncap = *cap ? 2 * *cap : 16, bytes;
			if (!flow_mul_size(ncap, sizeof(*m->shards), &bytes))
				return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
			void *n = realloc(m->shards, bytes);
			if (!n)
				return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
			m->shards = n;
			*cap = ncap;
		}
		if (!(sh.file = strdup(file)))
			return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		m->shards[m->nshards++] = sh;
		return FLOW_OK;
	}
	}
	return perr(p, "unexpected line after the checksum");
}

/* Check the totals once every shard line is read. */
static flow_err_t check_totals(parser_t *p, const flow_manifest_t *m,
			       const uint64_t split_shards[])
{
	for (int s = 0; s < FLOW_SPLIT_COUNT; s++) {
		uint64_t tokens = 0, shards = 0;
		for (size_t i = 0; i < m->nshards; i++) {
			if (m->shards[i].split != (flow_split_t)s)
				continue;
			shards++;
			if (__builtin_add_overflow(tokens, m->shards[i].info.tokens,
						   &tokens))
				return perr(p, "token counts of split '%s' overflow",
					    flow_split_name((flow_split_t)s));
		}
		if (shards != split_shards[s])
			return perr(p, "split '%s' lists %" PRIu64
				    " shards, the manifest has %" PRIu64,
				    flow_split_name((flow_split_t)s),
				    split_shards[s], shards);
		if (tokens != m->split_tokens[s])
			return perr(p, "split '%s' has %" PRIu64
				    " tokens, its shards add up to %" PRIu64,
				    flow_split_name((flow_split_t)s),
				    m->split_tokens[s], tokens);
	}
	return FLOW_OK;
}

flow_err_t flow_manifest_read(const char *dir, flow_manifest_t *manifest_out,
			      flow_diag_t *diag)
{
	flow_err_t err;
	char *path = NULL, *text = NULL;
	flow_checksum_state_t *sum = NULL;
	size_t len, cap = 0;
	uint64_t split_shards[FLOW_SPLIT_COUNT] = { 0 };
	flow_manifest_t m;
	memset(&m, 0, sizeof(m));
	size_t dlen = strlen(dir);
	while (dlen > 1 && dir[dlen - 1] == '/')
		dlen--;
	if (!(path = malloc(dlen + sizeof("/manifest"))))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	memcpy(path, dir, dlen);
	memcpy(path + dlen, "/manifest", sizeof("/manifest"));
	err = flow_file_read_all(path, &text, &len, diag);
	if (err != FLOW_OK)
		goto out_free;
	if (!(sum = flow_checksum_state_new())) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}

	parser_t p = { .where = path, .line = 0, .diag = diag };
	int state = S_MAGIC;
	size_t at = 0;
	bool have_checksum = false;
	while (at < len) {
		char *line = text + at;
		char *nl = memchr(line, '\n', len - at);
		size_t start = at;
		p.line++;
		if (!nl) {
			err = perr(&p, "missing newline at the end of the file");
			goto out_release;
		}
		at = (size_t)(nl - text) + 1;
		/* The checksum covers the text as read: fold the line in
		 * before it is cut up, unless it is the checksum line. */
		if (strncmp(line, "checksum", 8) != 0 || state != S_SHARDS)
			flow_checksum_update(sum, line, at - start);
		*nl = '\0';
		if (strlen(line) != (size_t)(nl - line)) {
			err = perr(&p, "NUL byte in the line");
			goto out_release;
		}
		if (state == S_END) {
			err = perr(&p, "unexpected line after the checksum");
			goto out_release;
		}
		if (line[0] == '#')
			continue;
		if ((err = split_fields(&p, line)) != FLOW_OK)
			goto out_release;
		if (p.nfields == 0)
			continue;
		if (state == S_SHARDS && strcmp(p.fields[0], "checksum") == 0) {
			if (p.nfields != 2) {
				err = perr(&p, "expected 'checksum HEX', got %d fields",
					   p.nfields);
				goto out_release;
			}
			uint64_t stored;
			flow_diag_t inner = FLOW_DIAG_INIT;
			if (flow_checksum_parse(p.fields[1], &stored, &inner) != FLOW_OK) {
				err = perr(&p, "invalid checksum '%s' (expected 16 hex digits)",
					   p.fields[1]);
				goto out_release;
			}
			if ((err = check_totals(&p, &m, split_shards)) != FLOW_OK)
				goto out_release;
			uint64_t computed = flow_checksum_digest(sum);
			if (computed != stored) {
				char a[17];
				flow_checksum_format(computed, a);
				err = flow_diag_set(diag, FLOW_ERR_CHECKSUM,
						    "%s:%zu: checksum mismatch: stored %s, computed %s",
						    path, p.line, p.fields[1], a);
				goto out_release;
			}
			m.checksum = stored;
			have_checksum = true;
			state = S_END;
			continue;
		}
		if ((err = parse_line(&p, &state, &m, &cap, split_shards,
				      diag)) != FLOW_OK)
			goto out_release;
	}
	if (!have_checksum) {
		static const char *const want[] = {
			"flow-manifest", "vocab", "token_dtype", "compression",
			"split", "split", "checksum",
		};
		p.line++;
		err = perr(&p, "unexpected end of file, expected '%s'",
			   want[state]);
		goto out_release;
	}
	*manifest_out = m;
	goto out_free;

out_release:
	flow_manifest_release(&m);
out_free:
	flow_checksum_state_free(sum);
	free(text);
	free(path);
	return err;
}

/* ---- writing --------------------------------------------------------------- */

typedef struct strbuf {
	char *buf;
	size_t len, cap;
	bool failed;
} strbuf_t;

static void sb_printf(strbuf_t *sb, const char *fmt, ...) FLOW_PRINTF(2, 3);

static void sb_printf(strbuf_t *sb, const char *fmt, ...)
{
	va_list ap;
	if (sb->failed)
		return;
	for (;;) {
		va_start(ap, fmt);
		int n = vsnprintf(sb->buf ? sb->buf + sb->len : NULL,
				  sb->buf ? sb->cap - sb->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			sb->failed = true;
			return;
		}
		if (sb->buf && (size_t)n < sb->cap - sb->len) {
			sb->len += (size_t)n;
			return;
		}
		size_t ncap = (sb->cap ? sb->cap * 2 : 4096) + (size_t)n;
		char *nb = realloc(sb->buf, ncap);
		if (!nb) {
			sb->failed = true;
			return;
		}
		sb->buf = nb;
		sb->cap = ncap;
	}
}

static flow_err_t check_manifest(const flow_manifest_t *m, flow_diag_t *diag)
{
	if (m->token_dtype != FLOW_DTYPE_U16 && m->token_dtype != FLOW_DTYPE_U32)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "manifest token dtype must be u16 or u32");
	if (m->vocab == 0 ||
	    m->vocab > (m->token_dtype == FLOW_DTYPE_U16 ? 65536ull : 4294967296ull))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "manifest vocabulary size %" PRIu64
				     " does not fit its token dtype", m->vocab);
	if (m->zstd_level != 0 && m->frame_tokens == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "manifest: compressed shards need tokens per frame");
	uint64_t tokens[FLOW_SPLIT_COUNT] = { 0 };
	for (size_t i = 0; i < m->nshards; i++) {
		const flow_manifest_shard_t *sh = &m->shards[i];
		flow_split_t split;
		if (!sh->file || !valid_file_name(sh->file) ||
		    !split_of_file(sh->file, &split) || split != sh->split)
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "manifest: invalid shard file name '%s' (expected '<split>-...')",
					     sh->file ? sh->file : "");
		tokens[split] += sh->info.tokens;
	}
	for (int s = 0; s < FLOW_SPLIT_COUNT; s++)
		if (tokens[s] != m->split_tokens[s])
			return flow_diag_set(diag, FLOW_ERR_USAGE,
					     "manifest: split '%s' has %" PRIu64
					     " tokens, its shards add up to %" PRIu64,
					     flow_split_name((flow_split_t)s),
					     m->split_tokens[s], tokens[s]);
	return FLOW_OK;
}

flow_err_t flow_manifest_write(flow_manifest_t *manifest, FILE *out,
			       flow_diag_t *diag)
{
	const flow_manifest_t *m = manifest;
	flow_err_t err = check_manifest(m, diag);
	if (err != FLOW_OK)
		return err;
	strbuf_t sb = { 0 };
	uint64_t shards[FLOW_SPLIT_COUNT] = { 0 };
	for (size_t i = 0; i < m->nshards; i++)
		shards[m->shards[i].split]++;
	sb_printf(&sb, "flow-manifest %d\n", FLOW_MANIFEST_VERSION);
	sb_printf(&sb, "vocab %" PRIu64 "\n", m->vocab);
	sb_printf(&sb, "token_dtype %s\n",
		  m->token_dtype == FLOW_DTYPE_U16 ? "u16" : "u32");
	if (m->zstd_level)
		sb_printf(&sb, "compression zstd %d %" PRIu32 "\n", m->zstd_level,
			  m->frame_tokens);
	else
		sb_printf(&sb, "compression none\n");
	for (int s = 0; s < FLOW_SPLIT_COUNT; s++)
		sb_printf(&sb, "split %s %" PRIu64 " tokens %" PRIu64 " shards\n",
			  flow_split_name((flow_split_t)s), m->split_tokens[s],
			  shards[s]);
	for (size_t i = 0; i < m->nshards; i++) {
		char hex[17];
		flow_checksum_format(m->shards[i].info.checksum, hex);
		sb_printf(&sb, "shard %s %" PRIu64 " %" PRIu64 " %s\n",
			  m->shards[i].file, m->shards[i].info.tokens,
			  m->shards[i].info.bytes, hex);
	}
	if (sb.failed) {
		free(sb.buf);
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	}
	uint64_t sum = flow_checksum(sb.buf, sb.len);
	char hex[17];
	flow_checksum_format(sum, hex);
	errno = 0;
	if (fwrite(sb.buf, 1, sb.len, out) != sb.len ||
	    fprintf(out, "checksum %s\n", hex) < 0)
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot write the manifest");
	else
		manifest->checksum = sum;
	free(sb.buf);
	return err;
}

/* ---- printing ---------------------------------------------------------------- */

flow_err_t flow_manifest_print(const flow_manifest_t *manifest, FILE *out,
			       bool json, flow_diag_t *diag)
{
	const flow_manifest_t *m = manifest;
	const char *dtype = m->token_dtype == FLOW_DTYPE_U16 ? "u16" : "u32";
	char sum[17];
	flow_checksum_format(m->checksum, sum);
	if (json) {
		fprintf(out, "{\"version\": %" PRIu32 ", \"vocab\": %" PRIu64
			", \"token_dtype\": \"%s\", ",
			m->version, m->vocab, dtype);
		if (m->zstd_level)
			fprintf(out, "\"compression\": {\"codec\": \"zstd\", \"level\": %d, \"frame_tokens\": %" PRIu32 "}, ",
				m->zstd_level, m->frame_tokens);
		else
			fprintf(out, "\"compression\": null, ");
		fprintf(out, "\"split_tokens\": {\"train\": %" PRIu64
			", \"val\": %" PRIu64 "}, \"checksum\": \"%s\", \"shards\": [",
			m->split_tokens[FLOW_SPLIT_TRAIN],
			m->split_tokens[FLOW_SPLIT_VAL], sum);
		for (size_t i = 0; i < m->nshards; i++) {
			const flow_manifest_shard_t *sh = &m->shards[i];
			char hex[17];
			flow_checksum_format(sh->info.checksum, hex);
			/* Names hold no '"', '\\' or control bytes (the
			 * parser refuses them), so they need no escaping. */
			fprintf(out, "%s\n  {\"file\": \"%s\", \"split\": \"%s\", \"tokens\": %" PRIu64
				", \"bytes\": %" PRIu64 ", \"checksum\": \"%s\"}",
				i ? "," : "", sh->file, flow_split_name(sh->split),
				sh->info.tokens, sh->info.bytes, hex);
		}
		fprintf(out, "%s]}\n", m->nshards ? "\n" : "");
	} else {
		fprintf(out, "# flow-manifest %" PRIu32 "\n", m->version);
		fprintf(out, "# vocab %" PRIu64 "\n", m->vocab);
		fprintf(out, "# token_dtype %s\n", dtype);
		if (m->zstd_level)
			fprintf(out, "# compression zstd %d %" PRIu32 "\n",
				m->zstd_level, m->frame_tokens);
		else
			fprintf(out, "# compression none\n");
		fprintf(out, "# checksum %s\n", sum);
		fprintf(out, "file\tsplit\ttokens\tbytes\tchecksum\n");
		for (size_t i = 0; i < m->nshards; i++) {
			const flow_manifest_shard_t *sh = &m->shards[i];
			char hex[17];
			flow_checksum_format(sh->info.checksum, hex);
			fprintf(out, "%s\t%s\t%" PRIu64 "\t%" PRIu64 "\t%s\n",
				sh->file, flow_split_name(sh->split),
				sh->info.tokens, sh->info.bytes, hex);
		}
	}
	if (ferror(out))
		return flow_diag_set(diag, FLOW_ERR_IO,
				     "cannot write the manifest listing");
	return FLOW_OK;
}
