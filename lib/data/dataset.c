/* Building a dataset directory from token sources and verifying one.
 *
 * The build streams the inputs, in order, through one shard-sized buffer:
 * the first val_tokens tokens become val shards, the rest train shards,
 * each of at most shard_tokens tokens.  Everything is written into a
 * temporary directory beside the output (flow_temp_dir_*), which is renamed
 * into place only after every shard and the manifest are synced, so a
 * failure or a signal never leaves anything under the final name. */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <flow/file.h>
#include <flow/shard.h>

/* Tokens read per flow_token_source_read call at most: bounds the gap
 * between progress reports. */
#define READ_CHUNK (1u << 20)

typedef struct builder {
	const flow_dataset_options_t *o;
	flow_temp_dir_t *tmp;
	flow_manifest_t m;
	size_t cap_shards;
	uint32_t *buf;
	size_t buf_cap, fill;
	uint64_t written; /* tokens in finished shards */
	uint64_t split_count[FLOW_SPLIT_COUNT];
	flow_shard_write_options_t wo;
} builder_t;

static char *join(const char *dir, const char *name)
{
	size_t a = strlen(dir), b = strlen(name);
	char *s = malloc(a + b + 2);
	if (s) {
		memcpy(s, dir, a);
		s[a] = '/';
		memcpy(s + a + 1, name, b + 1);
	}
	return s;
}

/* Write the buffered tokens as the next shard of split. */
static flow_err_t flush_shard(builder_t *b, flow_split_t split,
			      flow_diag_t *diag)
{
	flow_err_t err;
	char name[64];
	if (b->fill == 0)
		return FLOW_OK;
	snprintf(name, sizeof(name), "%s-%06" PRIu64 ".bin",
		 flow_split_name(split), b->split_count[split]);
	if (b->m.nshards == b->cap_shards) {
		size_t ncap = b->cap_shards ? 2 * b->cap_shards : 16, bytes;
		void *n;
		if (!flow_mul_size(ncap, sizeof(*b->m.shards), &bytes) ||
		    !(n = realloc(b->m.shards, bytes)))
			return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory listing shard %s", flow_temp_dir_path(b->tmp), name);
		b->m.shards = n;
		b->cap_shards = ncap;
	}
	flow_manifest_shard_t *sh = &b->m.shards[b->m.nshards];
	memset(sh, 0, sizeof(*sh));
	char *path = join(flow_temp_dir_path(b->tmp), name);
	if (!path || !(sh->file = strdup(name))) {
		free(path);
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory naming shard %s", flow_temp_dir_path(b->tmp), name);
	}
	sh->split = split;
	b->m.nshards++;
	err = flow_shard_write(path, b->buf, b->fill, &b->wo, &sh->info, diag);
	free(path);
	if (err != FLOW_OK)
		return err;
	b->split_count[split]++;
	b->m.split_tokens[split] += b->fill;
	b->written += b->fill;
	b->fill = 0;
	return FLOW_OK;
}

static flow_err_t check_options(const flow_dataset_options_t *o,
				size_t ninputs, flow_diag_t *diag)
{
	if (ninputs == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE, "no input files");
	if (o->shard_tokens == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tokens per shard must be at least 1");
	if (o->shard_tokens > SIZE_MAX / sizeof(uint32_t))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tokens per shard %" PRIu64 " is too large",
				     o->shard_tokens);
	if (o->vocab > 4294967296ull)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "vocabulary size %" PRIu64
				     " is above 4294967296", o->vocab);
	if (o->zstd_level != 0 && o->frame_tokens == 0)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "tokens per frame must be at least 1");
	return FLOW_OK;
}

/* Open every input (headers are validated before anything is written) and
 * settle the vocabulary. */
static flow_err_t open_sources(const char *const *inputs, size_t ninputs,
			       const flow_dataset_options_t *o,
			       flow_token_source_t **src, uint64_t *vocab_out,
			       int64_t *total_out, flow_diag_t *diag)
{
	flow_token_source_options_t so = o->input;
	so.vocab = o->vocab;
	uint64_t vocab = o->vocab;
	int64_t total = 0;
	for (size_t i = 0; i < ninputs; i++) {
		flow_err_t err = flow_token_source_open(inputs[i], &so, &src[i],
							diag);
		if (err != FLOW_OK)
			return err;
		uint64_t own = flow_token_source_vocab(src[i]);
		if (o->vocab == 0) {
			if (own == 0)
				return flow_diag_set(diag, FLOW_ERR_USAGE,
						     "%s: %s input does not say its vocabulary size (pass --vocab)",
						     inputs[i],
						     flow_input_format_name(flow_token_source_format(src[i])));
			if (own > vocab)
				vocab = own;
		}
		int64_t n = flow_token_source_count(src[i]);
		total = total < 0 || n < 0 ? -1 : total + n;
	}
	*vocab_out = vocab;
	*total_out = total;
	return FLOW_OK;
}

flow_err_t flow_dataset_build(const char *out_dir, const char *const *inputs,
			      size_t ninputs,
			      const flow_dataset_options_t *options,
			      flow_manifest_t *manifest_out, flow_diag_t *diag)
{
	const flow_dataset_options_t *o = options;
	flow_err_t err = check_options(o, ninputs, diag);
	flow_token_source_t **src = NULL;
	flow_atomic_file_t *mf = NULL;
	char *mpath = NULL;
	builder_t b;
	memset(&b, 0, sizeof(b));
	b.o = o;
	if (err != FLOW_OK)
		return err;
	struct stat st;
	if (lstat(out_dir, &st) == 0)
		return flow_diag_set(diag, FLOW_ERR_IO,
				     "output directory '%s' already exists",
				     out_dir);
	if (!(src = calloc(ninputs, sizeof(*src))))
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory for %zu inputs", out_dir, ninputs);
	uint64_t vocab = 0;
	int64_t total = -1;
	err = open_sources(inputs, ninputs, o, src, &vocab, &total, diag);
	if (err != FLOW_OK)
		goto out_free;
	b.m.version = FLOW_MANIFEST_VERSION;
	b.m.vocab = vocab;
	b.m.token_dtype = vocab <= 65536 ? FLOW_DTYPE_U16 : FLOW_DTYPE_U32;
	b.m.zstd_level = o->zstd_level;
	b.m.frame_tokens = o->zstd_level ? o->frame_tokens : 0;
	b.wo.token_dtype = b.m.token_dtype;
	b.wo.vocab = vocab;
	b.wo.zstd_level = o->zstd_level;
	b.wo.frame_tokens = b.m.frame_tokens;
	if (total >= 0 && (uint64_t)total <= o->val_tokens) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "the inputs hold %" PRId64
				    " tokens, no more than the %" PRIu64
				    " validation tokens: none left to train on",
				    total, o->val_tokens);
		goto out_free;
	}

	err = flow_temp_dir_create(out_dir, &b.tmp, diag);
	if (err != FLOW_OK)
		goto out_free;
	for (size_t i = 0; i < ninputs; i++) {
		for (;;) {
			flow_split_t split = b.written < o->val_tokens ?
						     FLOW_SPLIT_VAL :
						     FLOW_SPLIT_TRAIN;
			/* This shard ends at shard_tokens or where the val
			 * split ends, whichever comes first. */
			uint64_t limit = o->shard_tokens;
			if (split == FLOW_SPLIT_VAL && o->val_tokens - b.written < limit)
				limit = o->val_tokens - b.written;
			if (b.fill == limit) {
				err = flush_shard(&b, split, diag);
				if (err != FLOW_OK)
					goto out_abort;
				continue;
			}
			/* Grow the buffer geometrically up to a shard, so
			 * small inputs do not allocate a whole shard. */
			uint64_t want = b.fill + (limit - b.fill < READ_CHUNK ?
							  limit - b.fill : READ_CHUNK);
			if (want > b.buf_cap) {
				size_t ncap = b.buf_cap ? b.buf_cap : READ_CHUNK;
				while (ncap < want)
					ncap = ncap > o->shard_tokens / 2 ?
						       (size_t)o->shard_tokens :
						       2 * ncap;
				if (ncap > o->shard_tokens)
					ncap = (size_t)o->shard_tokens;
				void *nb = realloc(b.buf, ncap * sizeof(*b.buf));
				if (!nb) {
					err = flow_diag_set(diag, FLOW_ERR_NOMEM,
							    "out of memory for a shard of %" PRIu64 " tokens",
							    o->shard_tokens);
					goto out_abort;
				}
				b.buf = nb;
				b.buf_cap = ncap;
			}
			int64_t n = flow_token_source_read(src[i], b.buf + b.fill,
							   (size_t)(want - b.fill),
							   diag);
			if (n < 0) {
				err = (flow_err_t)n;
				goto out_abort;
			}
			if (n == 0)
				break;
			b.fill += (size_t)n;
			if (o->progress)
				o->progress(b.written + b.fill, total,
					    o->progress_userdata);
		}
		flow_token_source_free(src[i]);
		src[i] = NULL;
	}
	{
		flow_split_t split = b.written < o->val_tokens ? FLOW_SPLIT_VAL :
								 FLOW_SPLIT_TRAIN;
		err = flush_shard(&b, split, diag);
		if (err != FLOW_OK)
			goto out_abort;
	}
	if (b.m.split_tokens[FLOW_SPLIT_TRAIN] == 0) {
		err = flow_diag_set(diag, FLOW_ERR_USAGE,
				    "the inputs hold %" PRIu64
				    " tokens, no more than the %" PRIu64
				    " validation tokens: none left to train on",
				    b.written, o->val_tokens);
		goto out_abort;
	}

	if (!(mpath = join(flow_temp_dir_path(b.tmp), "manifest"))) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory naming its manifest", out_dir);
		goto out_abort;
	}
	err = flow_atomic_file_open(mpath, &mf, diag);
	if (err != FLOW_OK)
		goto out_abort;
	err = flow_manifest_write(&b.m, flow_atomic_file_stream(mf), diag);
	if (err != FLOW_OK) {
		flow_atomic_file_abort(mf);
		goto out_abort;
	}
	err = flow_atomic_file_commit(mf, diag);
	if (err != FLOW_OK)
		goto out_abort;
	err = flow_temp_dir_commit(b.tmp, diag);
	b.tmp = NULL;
	if (err != FLOW_OK)
		goto out_release;
	if (o->progress)
		o->progress(b.written, total, o->progress_userdata);
	if (manifest_out) {
		*manifest_out = b.m;
		memset(&b.m, 0, sizeof(b.m));
	}
	goto out_release;

out_abort:
	flow_temp_dir_abort(b.tmp);
out_release:
	flow_manifest_release(&b.m);
out_free:
	free(mpath);
	free(b.buf);
	for (size_t i = 0; i < ninputs; i++)
		flow_token_source_free(src[i]);
	free(src);
	return err;
}

flow_err_t flow_dataset_verify(const char *dir, flow_diag_t *diag)
{
	flow_manifest_t m;
	flow_err_t err = flow_manifest_read(dir, &m, diag);
	if (err != FLOW_OK)
		return err;
	for (size_t i = 0; i < m.nshards && err == FLOW_OK; i++) {
		char *path = join(dir, m.shards[i].file);
		if (!path) {
			err = flow_diag_set(diag, FLOW_ERR_NOMEM, "%s: out of memory naming shard %s", dir, m.shards[i].file);
			break;
		}
		err = flow_shard_verify_file(path, &m.shards[i].info, diag);
		flow_shard_t *s;
		if (err == FLOW_OK)
			err = flow_shard_open(path, &s, diag);
		if (err == FLOW_OK) {
			if (flow_shard_vocab(s) != m.vocab)
				err = flow_diag_set(diag, FLOW_ERR_FORMAT,
						    "%s: vocabulary size %" PRIu64
						    " at byte 32, the manifest says %" PRIu64,
						    path, flow_shard_vocab(s), m.vocab);
			else if (flow_shard_token_dtype(s) != m.token_dtype)
				err = flow_diag_set(diag, FLOW_ERR_FORMAT,
						    "%s: bytes per token at byte 16 differ from the manifest's token dtype",
						    path);
			flow_shard_close(s);
		}
		free(path);
	}
	flow_manifest_release(&m);
	return err;
}
