/* Past the readers: a fuzzed dataset fed to the loader and to one training
 * step of a tiny GPT, asserting that every token id the kernels see is
 * below the vocabulary.
 *
 * The input is a manifest and up to three shard files cut at
 * FUZZ_SEPARATOR, after one harness byte.  The shard parts are written
 * under the names of the manifest's shard lines, in order.  Unless the
 * byte says otherwise the harness repairs what a mutation breaks first:
 *   bit 0 clear: each shard's trailing XXH3-64 is recomputed;
 *   bit 1 clear: each shard line gets its file's token count (header),
 *                size and checksum, and each split line the totals;
 *   bit 2 clear: the manifest's checksum line is recomputed;
 *   bit 3 set:   the loader prefetches on its thread.
 * Then the train split is opened with the loader (T = 4, G = 2) and one
 * batch checked; when the vocabulary is small, a GPT of that vocabulary
 * runs one step on the data with --dump-batches, and every id of the
 * dump (the very buffers the embedding and the loss read) is checked. */
#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/file.h>
#include <flow/loader.h>
#include <flow/shard.h>
#include <flow/train.h>

#include "fuzz_util.h"

#define PARTS 4
#define T 4
#define B 2
/* Vocabularies up to this train a model (its wte costs vocab x 8). */
#define TRAIN_VOCAB_MAX 4096

typedef struct shard_line {
	char name[64];
	int part;       /* the input part holding the file; 0: none */
	char *fields[5];
} shard_line_t;

static bool plain_name(const char *s, size_t len)
{
	if (len == 0 || len >= 64 || s[0] == '.')
		return false;
	for (size_t i = 0; i < len; i++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
			    "0123456789._-", s[i]) || s[i] == '\0')
			return false;
	return true;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* The manifest with its shard and split lines rewritten from the shard
 * parts (malloc; free()). */
static char *repair(const char *text, size_t len, const uint8_t **parts,
		    const size_t *lens, size_t nparts, size_t *len_out)
{
	size_t cap = len + 4096;
	char *out = malloc(cap);
	if (!out)
		fuzz_fail("out of memory");
	size_t n = 0;
	uint64_t tokens[FLOW_SPLIT_COUNT] = { 0 }, count[FLOW_SPLIT_COUNT] = { 0 };
	size_t next = 1;
	/* Two passes: totals of the shard lines, then the text. */
	for (int pass = 0; pass < 2; pass++) {
		next = 1;
		for (size_t at = 0; at < len;) {
			const char *line = text + at;
			const char *nl = memchr(line, '\n', len - at);
			size_t llen = nl ? (size_t)(nl - line) : len - at;
			at += llen + (nl != NULL);
			if (cap - n < llen + 256) {
				cap = 2 * cap + llen + 256;
				out = realloc(out, cap);
				if (!out)
					fuzz_fail("out of memory");
			}
			char name[64];
			int split = -1;
			bool shard = llen > 6 && memcmp(line, "shard ", 6) == 0;
			if (shard) {
				const char *sp = memchr(line + 6, ' ', llen - 6);
				size_t nlen = sp ? (size_t)(sp - line - 6) : 0;
				if (!plain_name(line + 6, nlen) || next >= nparts)
					shard = false;
				else {
					memcpy(name, line + 6, nlen);
					name[nlen] = '\0';
					split = strncmp(name, "val-", 4) == 0 ? 1 : 0;
				}
			}
			if (shard) {
				const uint8_t *f = parts[next];
				size_t flen = lens[next];
				next++;
				uint64_t ntok = flen >= 32 ? le64(f + 24) : 0;
				uint64_t sum = flen >= 8 ? le64(f + flen - 8) : 0;
				if (pass == 0) {
					tokens[split] += ntok;
					count[split]++;
					continue;
				}
				n += (size_t)snprintf(out + n, cap - n,
						      "shard %s %" PRIu64 " %zu %016" PRIx64 "\n",
						      name, ntok, flen, sum);
				continue;
			}
			if (pass == 0)
				continue;
			bool train = llen > 12 && memcmp(line, "split train ", 12) == 0;
			bool val = llen > 10 && memcmp(line, "split val ", 10) == 0;
			if (train || val) {
				int s = train ? 0 : 1;
				n += (size_t)snprintf(out + n, cap - n,
						      "split %s %" PRIu64 " tokens %" PRIu64 " shards\n",
						      train ? "train" : "val",
						      tokens[s], count[s]);
				continue;
			}
			memcpy(out + n, line, llen);
			n += llen;
			if (nl)
				out[n++] = '\n';
		}
	}
	*len_out = n;
	return out;
}

/* Write the shard parts under the manifest's names, in order. */
static void write_shards(const char *text, size_t len, const uint8_t **parts,
			 const size_t *lens, size_t nparts, bool fix_sums)
{
	size_t next = 1;
	for (size_t at = 0; at < len && next < nparts;) {
		const char *line = text + at;
		const char *nl = memchr(line, '\n', len - at);
		size_t llen = nl ? (size_t)(nl - line) : len - at;
		at += llen + 1;
		if (llen <= 6 || memcmp(line, "shard ", 6) != 0)
			continue;
		const char *sp = memchr(line + 6, ' ', llen - 6);
		size_t nlen = sp ? (size_t)(sp - line - 6) : 0;
		if (!plain_name(line + 6, nlen))
			continue;
		char name[64], path[1024];
		memcpy(name, line + 6, nlen);
		name[nlen] = '\0';
		uint8_t *buf = malloc(lens[next] + 1);
		if (!buf)
			fuzz_fail("out of memory");
		memcpy(buf, parts[next], lens[next]);
		if (fix_sums)
			fuzz_fix_trailing_sum(buf, lens[next]);
		fuzz_write(path, sizeof path, name, buf, lens[next]);
		/* The repair reads the checksum from the part. */
		memcpy((uint8_t *)parts[next], buf, lens[next]);
		free(buf);
		next++;
	}
}

static void check_ids(const int32_t *ids, size_t n, uint64_t vocab,
		      const char *where)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || (uint64_t)ids[i] >= vocab)
			fuzz_fail("%s: token id %" PRId32 " at %zu is not below "
				  "the vocabulary %" PRIu64, where, ids[i], i,
				  vocab);
}

static void train_one_step(uint64_t vocab)
{
	char spec[128], dump[1024];
	snprintf(spec, sizeof spec,
		 "gpt:layers=1,heads=1,dim=8,vocab=%" PRIu64 ",seq=%d,pad=8",
		 vocab, T);
	fuzz_path(dump, sizeof dump, "batches.i32");
	flow_train_config_t c;
	flow_train_config_init(&c);
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_gpt_parse(spec, &c.model, &diag) != FLOW_OK)
		fuzz_fail("%s: %s", spec, flow_diag_message(&diag));
	c.data_dir = fuzz_dir();
	c.batch = B;
	c.seq_len = T;
	c.grad_accum = 1;
	c.steps = 1;
	c.peak_gflops = 0;
	c.dump_batches = dump;
	flow_trainer_t *t = NULL;
	flow_err_t err = flow_trainer_new(&c, &t, &diag);
	fuzz_check_diag("flow_trainer_new", err, &diag);
	if (err != FLOW_OK)
		return;
	flow_train_row_t row;
	int rc;
	while ((rc = flow_trainer_next(t, &row, &diag)) > 0)
		;
	fuzz_check_diag("flow_trainer_next", (flow_err_t)rc, &diag);
	flow_trainer_free(t);
	if (rc < 0)
		return;
	char *ids;
	size_t len;
	err = flow_file_read_all(dump, &ids, &len, &diag);
	if (err != FLOW_OK)
		fuzz_fail("the batch dump: %s", flow_diag_message(&diag));
	check_ids((const int32_t *)(void *)ids, len / sizeof(int32_t), vocab,
		  "the trainer's batch");
	free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t opt = fuzz_take_byte(&data, &size);
	const uint8_t *parts[PARTS];
	size_t lens[PARTS];
	size_t nparts = fuzz_split(data, size, parts, lens, PARTS);
	/* The shard parts are repaired in a copy of the input. */
	uint8_t *copy = malloc(size + 1);
	if (!copy)
		fuzz_fail("out of memory");
	if (size)
		memcpy(copy, data, size);
	for (size_t i = 0; i < nparts; i++)
		parts[i] = copy + (parts[i] - data);
	fuzz_clean();

	const char *text = (const char *)parts[0];
	write_shards(text, lens[0], parts, lens, nparts, !(opt & 1));
	size_t mlen = lens[0];
	char *manifest = (opt & 2) ? fuzz_strndup(parts[0], lens[0])
				   : repair(text, lens[0], parts, lens, nparts,
					    &mlen);
	if (!(opt & 4))
		fuzz_fix_text_sum(manifest, mlen, "checksum");
	char path[1024];
	fuzz_write(path, sizeof path, "manifest", manifest, mlen);
	free(manifest);
	free(copy);

	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_manifest_read(fuzz_dir(), &m, &diag);
	fuzz_check_diag("flow_manifest_read", err, &diag);
	if (err != FLOW_OK)
		return 0;
	uint64_t vocab = m.vocab;
	flow_manifest_release(&m);

	flow_loader_options_t o = {
		.dir = fuzz_dir(),
		.split = FLOW_SPLIT_TRAIN,
		.seq_len = T,
		.global_batch = B,
		.seed = opt >> 4,
		.dp_rank = 0,
		.dp_size = 1,
		.prefetch = (opt & 8) != 0,
	};
	flow_loader_t *loader = NULL;
	err = flow_loader_open(&o, &loader, &diag);
	fuzz_check_diag("flow_loader_open", err, &diag);
	if (err != FLOW_OK)
		return 0;
	int32_t inputs[B * T], targets[B * T];
	int rc = flow_loader_next(loader, inputs, targets, &diag);
	fuzz_check_diag("flow_loader_next", (flow_err_t)(rc < 0 ? rc : 0),
			&diag);
	flow_loader_free(loader);
	if (rc < 0)
		return 0;
	check_ids(inputs, B * T, vocab, "the loader's inputs");
	check_ids(targets, B * T, vocab, "the loader's targets");
	if (vocab <= TRAIN_VOCAB_MAX)
		train_one_step(vocab);
	return 0;
}
