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

#include "core/textrec_internal.h"

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

static const flow_textrec_format_t manifest_format = {
	.sep = FLOW_TEXTREC_SEP_BLANKS,
	.end_key = "checksum",
	.lowercase_sums = false,
	.hint_causes = false,
};

static flow_err_t expect_key(flow_textrec_t *p, const char *key, int nfields,
			     const char *syntax)
{
	if (p->nfields == 0 || strcmp(p->fields[0], key) != 0)
		return flow_textrec_error(p, "expected '%s', got '%s'", key,
					  p->nfields ? p->fields[0] : "");
	return flow_textrec_expect_fields(p, nfields, syntax);
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

static flow_err_t parse_line(flow_textrec_t *p, int *state, flow_manifest_t *m,
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
		if ((err = flow_textrec_field_u64(p, 1, "version", 0, INT64_MAX, &v)) != FLOW_OK)
			return err;
		if (v != FLOW_MANIFEST_VERSION)
			return flow_textrec_error(p, "unsupported manifest version %" PRIu64 " (expected %d)",
						  v, FLOW_MANIFEST_VERSION);
		m->version = (uint32_t)v;
		*state = S_VOCAB;
		return FLOW_OK;
	case S_VOCAB:
		if ((err = expect_key(p, "vocab", 2, "vocab N")) != FLOW_OK ||
		    (err = flow_textrec_field_u64(p, 1, "vocabulary size", 1, INT64_MAX, &v)) != FLOW_OK)
			return err;
		if (v > 4294967296ull)
			return flow_textrec_error(p, "vocabulary size %" PRIu64 " is above 4294967296",
						  v);
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
			return flow_textrec_error(p, "unknown token dtype '%s' (expected u16 or u32)",
						  p->fields[1]);
		if (m->token_dtype == FLOW_DTYPE_U16 && m->vocab > 65536)
			return flow_textrec_error(p, "token dtype u16 cannot hold the vocabulary size %" PRIu64,
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
				return flow_textrec_error(p, "unknown compression '%s' (expected zstd or none)",
							  p->fields[1]);
			int64_t level;
			flow_diag_t inner = FLOW_DIAG_INIT;
			if (flow_parse_int(p->fields[2], -131072, 22, &level,
					   &inner) != FLOW_OK || level == 0)
				return flow_textrec_error(p, "invalid zstd level '%s'",
							  p->fields[2]);
			if ((err = flow_textrec_field_u64(p, 3, "tokens per frame", 1, INT64_MAX, &v)) != FLOW_OK)
				return err;
			if (v > UINT32_MAX)
				return flow_textrec_error(p, "tokens per frame %" PRIu64 " is above %" PRIu32,
							  v, UINT32_MAX);
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
			return flow_textrec_error(p, "expected split '%s', got '%s'",
						  flow_split_name(split),
						  p->fields[1]);
		if (strcmp(p->fields[3], "tokens") != 0)
			return flow_textrec_error(p, "expected 'tokens', got '%s'",
						  p->fields[3]);
		if (strcmp(p->fields[5], "shards") != 0)
			return flow_textrec_error(p, "expected 'shards', got '%s'",
						  p->fields[5]);
		if ((err = flow_textrec_field_u64(p, 2, "token count", 0, INT64_MAX, &m->split_tokens[split])) != FLOW_OK ||
		    (err = flow_textrec_field_u64(p, 4, "shard count", 0, INT64_MAX, &split_shards[split])) != FLOW_OK)
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
			return flow_textrec_error(p, "invalid shard file name '%s'",
						  file);
		if (!split_of_file(file, &sh.split))
			return flow_textrec_error(p, "shard file name '%s' does not start with 'train-' or 'val-'",
						  file);
		for (size_t i = 0; i < m->nshards; i++)
			if (strcmp(m->shards[i].file, file) == 0)
				return flow_textrec_error(p, "shard '%s' is listed twice",
							  file);
		if ((err = flow_textrec_field_u64(p, 2, "token count", 0, INT64_MAX, &sh.info.tokens)) != FLOW_OK ||
		    (err = flow_textrec_field_u64(p, 3, "byte size", 72, INT64_MAX, &sh.info.bytes)) != FLOW_OK)
			return err;
		if ((err = flow_textrec_field_sum(p, 4, &sh.info.checksum)) != FLOW_OK)
			return err;
		if (m->nshards == *cap) {
			size_t ncap = *cap ? 2 * *cap : 16, bytes;
			if (!flow_mul_size(ncap, sizeof(*m->shards), &bytes))
				return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory listing shard %s", p->path, file);
			void *n = realloc(m->shards, bytes);
			if (!n)
				return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory listing shard %s", p->path, file);
			m->shards = n;
			*cap = ncap;
		}
		if (!(sh.file = strdup(file)))
			return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory listing shard %s", p->path, file);
		m->shards[m->nshards++] = sh;
		return FLOW_OK;
	}
	}
	return flow_textrec_error(p, "unexpected line after the checksum");
}

/* Check the totals once every shard line is read. */
static flow_err_t check_totals(flow_textrec_t *p, const flow_manifest_t *m,
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
				return flow_textrec_error(p, "token counts of split '%s' overflow",
							  flow_split_name((flow_split_t)s));
		}
		if (shards != split_shards[s])
			return flow_textrec_error(p, "split '%s' lists %" PRIu64 " shards, the manifest has %" PRIu64,
						  flow_split_name((flow_split_t)s),
						  split_shards[s], shards);
		if (tokens != m->split_tokens[s])
			return flow_textrec_error(p, "split '%s' has %" PRIu64 " tokens, its shards add up to %" PRIu64,
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
	size_t len, cap = 0;
	uint64_t split_shards[FLOW_SPLIT_COUNT] = { 0 };
	flow_manifest_t m;
	memset(&m, 0, sizeof(m));
	size_t dlen = strlen(dir);
	while (dlen > 1 && dir[dlen - 1] == '/')
		dlen--;
	if (!(path = malloc(dlen + sizeof("/manifest"))))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory naming its manifest", dir);
	memcpy(path, dir, dlen);
	memcpy(path + dlen, "/manifest", sizeof("/manifest"));
	err = flow_file_read_all(path, &text, &len, diag);
	if (err != FLOW_OK)
		goto out_free;
	flow_textrec_t p;
	if ((err = flow_textrec_init(&p, &manifest_format, path, text, len,
				     diag)) != FLOW_OK)
		goto out_release_reader;

	int state = S_MAGIC;
	bool have_checksum = false;
	char *line;
	size_t n;
	int got;
	while ((got = flow_textrec_next(&p, &line, &n)) > 0) {
		if (strlen(line) != n) {
			err = flow_textrec_error(&p, "NUL byte in the line");
			goto out_release;
		}
		if (state == S_END) {
			err = flow_textrec_error(&p, "unexpected line after the checksum");
			goto out_release;
		}
		if (line[0] == '#')
			continue;
		if ((err = flow_textrec_split(&p, line)) != FLOW_OK)
			goto out_release;
		if (p.nfields == 0)
			continue;
		if (state == S_SHARDS && strcmp(p.fields[0], "checksum") == 0) {
			uint64_t stored;
			/* Totals before the checksum: a hand-edited manifest
			 * says what is wrong, not only that it was edited. */
			if ((err = flow_textrec_expect_fields(&p, 2,
							      "checksum HEX")) != FLOW_OK ||
			    (err = flow_textrec_field_sum(&p, 1, &stored)) != FLOW_OK ||
			    (err = check_totals(&p, &m, split_shards)) != FLOW_OK ||
			    (err = flow_textrec_verify_end(&p, stored)) != FLOW_OK)
				goto out_release;
			m.checksum = stored;
			have_checksum = true;
			state = S_END;
			continue;
		}
		if ((err = parse_line(&p, &state, &m, &cap, split_shards,
				      diag)) != FLOW_OK)
			goto out_release;
	}
	if (got < 0) {
		err = (flow_err_t)got;
		goto out_release;
	}
	if (!have_checksum) {
		static const char *const want[] = {
			"flow-manifest", "vocab", "token_dtype", "compression",
			"split", "split", "checksum",
		};
		err = flow_textrec_error_eof(&p, want[state]);
		goto out_release;
	}
	*manifest_out = m;
	goto out_release_reader;

out_release:
	flow_manifest_release(&m);
out_release_reader:
	flow_textrec_release(&p);
out_free:
	free(text);
	free(path);
	return err;
}

/* ---- writing --------------------------------------------------------------- */

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
	flow_textrec_buf_t sb = FLOW_TEXTREC_BUF_INIT;
	uint64_t shards[FLOW_SPLIT_COUNT] = { 0 };
	for (size_t i = 0; i < m->nshards; i++)
		shards[m->shards[i].split]++;
	flow_textrec_printf(&sb, "flow-manifest %d\n", FLOW_MANIFEST_VERSION);
	flow_textrec_printf(&sb, "vocab %" PRIu64 "\n", m->vocab);
	flow_textrec_printf(&sb, "token_dtype %s\n",
			    m->token_dtype == FLOW_DTYPE_U16 ? "u16" : "u32");
	if (m->zstd_level)
		flow_textrec_printf(&sb, "compression zstd %d %" PRIu32 "\n",
				    m->zstd_level, m->frame_tokens);
	else
		flow_textrec_printf(&sb, "compression none\n");
	for (int s = 0; s < FLOW_SPLIT_COUNT; s++)
		flow_textrec_printf(&sb, "split %s %" PRIu64 " tokens %" PRIu64 " shards\n",
				    flow_split_name((flow_split_t)s),
				    m->split_tokens[s], shards[s]);
	for (size_t i = 0; i < m->nshards; i++) {
		char hex[17];
		flow_checksum_format(m->shards[i].info.checksum, hex);
		flow_textrec_printf(&sb, "shard %s %" PRIu64 " %" PRIu64 " %s\n",
				    m->shards[i].file, m->shards[i].info.tokens,
				    m->shards[i].info.bytes, hex);
	}
	uint64_t sum = flow_textrec_seal(&sb, &manifest_format);
	if (sb.failed) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory formatting a manifest of %zu shards", m->nshards);
		goto out_release;
	}
	errno = 0;
	if (fwrite(sb.buf, 1, sb.len, out) != sb.len)
		err = flow_diag_errno(diag, FLOW_ERR_IO, errno,
				      "cannot write the manifest");
	else
		manifest->checksum = sum;
out_release:
	flow_textrec_buf_release(&sb);
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
