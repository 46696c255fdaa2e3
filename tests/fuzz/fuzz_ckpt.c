/* Checkpoint directories (flow/ckpt.h, flow-ckpt(5)): the manifest, the
 * rank indexes rank-NNNNN.idx and the data files rank-NNNNN.bin.  The
 * input is up to five parts cut at FUZZ_SEPARATOR: manifest, index and
 * data of rank 0, index and data of rank 1, after one harness byte:
 *   bit 0 clear: every shard line's XXH3-64 is recomputed from the data
 *                file it names (when the range lies inside it);
 *   bit 1 clear: the closing "end" line of each text is recomputed;
 *   bit 2 set, or no manifest part: the ranks' indexes are committed with
 *                flow_ckpt_commit first, which writes the manifest: the
 *                writer's manifest must then open and verify (its round
 *                trip).
 * An opened checkpoint is verified and every tensor of a sane size read
 * whole. */
#include <config.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <flow/checksum.h>
#include <flow/ckpt.h>

#include "fuzz_util.h"

#define PARTS 5
#define READ_MAX (1u << 22)

static const char *const names[PARTS] = {
	"manifest", "rank-00000.idx", "rank-00000.bin", "rank-00001.idx",
	"rank-00001.bin",
};

typedef struct input {
	char *part[PARTS];
	size_t len[PARTS];
	size_t nparts;
} input_t;

/* Field i (from 0) of the space-separated line at s (len bytes). */
static bool field(const char *s, size_t len, int i, const char **f_out,
		  size_t *flen_out)
{
	size_t at = 0;
	for (int k = 0; k < i; k++) {
		const char *sp = memchr(s + at, ' ', len - at);
		if (!sp)
			return false;
		at = (size_t)(sp - s) + 1;
	}
	const char *end = memchr(s + at, ' ', len - at);
	*f_out = s + at;
	*flen_out = end ? (size_t)(end - (s + at)) : len - at;
	return true;
}

static bool number(const char *s, size_t len, uint64_t *out)
{
	uint64_t v = 0;
	if (len == 0 || len > 18)
		return false;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*out = v;
	return true;
}

/* Rewrite the checksum of every "shard NAME RANK BOX FILE OFFSET LENGTH
 * SUM" line of text whose range lies in one of the data parts. */
static void fix_shard_sums(input_t *in, int t)
{
	char *text = in->part[t];
	size_t len = in->len[t];
	for (size_t at = 0; at < len;) {
		char *nl = memchr(text + at, '\n', len - at);
		size_t llen = nl ? (size_t)(nl - (text + at)) : len - at;
		char *line = text + at;
		at += llen + 1;
		const char *f, *o, *l, *s;
		size_t fl, ol, ll, sl;
		uint64_t off, n;
		if (llen < 6 || memcmp(line, "shard ", 6) != 0 ||
		    !field(line, llen, 4, &f, &fl) ||
		    !field(line, llen, 5, &o, &ol) ||
		    !field(line, llen, 6, &l, &ll) ||
		    !field(line, llen, 7, &s, &sl) || sl != 16 ||
		    !number(o, ol, &off) || !number(l, ll, &n))
			continue;
		for (int d = 2; d < PARTS; d += 2) {
			if (fl != strlen(names[d]) || memcmp(f, names[d], fl) != 0 ||
			    off > in->len[d] || n > in->len[d] - off)
				continue;
			char hex[17];
			flow_checksum_format(flow_checksum(in->part[d] + off, n),
					     hex);
			memcpy((char *)s, hex, 16);
		}
	}
}

static void read_all(const flow_ckpt_t *ckpt, bool must_verify)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_ckpt_verify(ckpt, &diag);
	fuzz_check_diag("flow_ckpt_verify", err, &diag);
	if (must_verify && err != FLOW_OK)
		fuzz_fail("a committed checkpoint does not verify: %s",
			  flow_diag_message(&diag));
	const flow_ckpt_kv_t *kv;
	size_t nkv = flow_ckpt_state(ckpt, &kv);
	for (size_t i = 0; i < nkv; i++)
		if (flow_ckpt_get(ckpt, kv[i].key) == NULL)
			fuzz_fail("state key '%s' is listed but not found",
				  kv[i].key);
	size_t n = flow_ckpt_tensor_count(ckpt);
	for (size_t i = 0; i < n && i < 64; i++) {
		const flow_ckpt_tensor_desc_t *d = flow_ckpt_tensor_at(ckpt, i);
		if (flow_ckpt_tensor_find(ckpt, d->name) != (int)i)
			fuzz_fail("tensor '%s' is not found at its index", d->name);
		size_t numel;
		if (flow_shape_numel(&d->shape, &numel, &diag) != FLOW_OK ||
		    numel > READ_MAX / 8)
			continue;
		size_t bytes = numel * flow_dtype_size(d->dtype);
		void *buf = malloc(bytes ? bytes : 1);
		if (!buf)
			fuzz_fail("out of memory");
		diag = (flow_diag_t)FLOW_DIAG_INIT;
		err = flow_ckpt_read(ckpt, i, NULL, buf, &diag);
		fuzz_check_diag("flow_ckpt_read", err, &diag);
		if (must_verify && err != FLOW_OK)
			fuzz_fail("a committed checkpoint does not read: %s",
				  flow_diag_message(&diag));
		free(buf);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t opt = fuzz_take_byte(&data, &size);
	const uint8_t *parts[PARTS];
	input_t in;
	in.nparts = fuzz_split(data, size, parts, in.len, PARTS);
	for (size_t i = 0; i < PARTS; i++) {
		if (i >= in.nparts)
			in.len[i] = 0;
		in.part[i] = fuzz_strndup(i < in.nparts ? parts[i] : data,
					  in.len[i]);
	}
	bool commit = (opt & 4) || in.len[0] == 0;
	uint32_t nranks = in.nparts > 3 ? 2 : 1;
	fuzz_clean();
	for (int t = 0; t < PARTS; t += t == 0 ? 1 : 2) {
		if (!(opt & 1))
			fix_shard_sums(&in, t);
		if (!(opt & 2))
			fuzz_fix_text_sum(in.part[t], in.len[t], "end");
	}
	char path[1024];
	for (size_t i = commit ? 1 : 0; i < in.nparts && i < PARTS; i++)
		fuzz_write(path, sizeof path, names[i], in.part[i], in.len[i]);

	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = FLOW_OK;
	if (commit) {
		static const flow_ckpt_kv_t kv[] = {
			{ "model", "gpt:layers=1,heads=1,dim=8,vocab=16,seq=8" },
			{ "loader.epoch", "0" },
		};
		err = flow_ckpt_commit(fuzz_dir(), 7, nranks, kv, 2, &diag);
		fuzz_check_diag("flow_ckpt_commit", err, &diag);
	}
	if (err == FLOW_OK) {
		flow_ckpt_t *ckpt = NULL;
		diag = (flow_diag_t)FLOW_DIAG_INIT;
		err = flow_ckpt_open(fuzz_dir(), &ckpt, &diag);
		fuzz_check_diag("flow_ckpt_open", err, &diag);
		if (commit && err != FLOW_OK)
			fuzz_fail("the committed manifest does not open: %s",
				  flow_diag_message(&diag));
		if (err == FLOW_OK) {
			if (commit && flow_ckpt_step(ckpt) != 7)
				fuzz_fail("committed step 7, opened step %" PRIu64,
					  flow_ckpt_step(ckpt));
			/* The commit path only checks what the indexes say
			 * of the data files, not their bytes when bit 0
			 * set. */
			read_all(ckpt, commit && !(opt & 1));
			flow_ckpt_free(ckpt);
		}
	}
	for (size_t i = 0; i < PARTS; i++)
		free(in.part[i]);
	return 0;
}
