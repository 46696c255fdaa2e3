/* Checkpoints: the exact on-disk text, round trips of every dtype and rank
 * of shape, multi-rank write + commit + read of any box, a seeded property
 * test of box assembly over random tilings, every rejection of a damaged
 * manifest, index or data file with its message, the commit protocol
 * (rewrites uncommit first, abort leaves nothing) and finding the latest
 * step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/checksum.h>
#include <flow/ckpt.h>

#include "testutil.h"

static char root[256];

static int setup(void **state)
{
	(void)state;
	return testutil_mkdtemp(root, sizeof(root), "ckpt");
}

static int teardown(void **state)
{
	(void)state;
	return testutil_rmtree(root);
}

/* ---- helpers ------------------------------------------------------------- */

static char *path_of(char *buf, size_t cap, const char *dir, const char *name)
{
	int n = snprintf(buf, cap, "%s/%s", dir, name);
	assert_true(n > 0 && (size_t)n < cap);
	return buf;
}

static void make_desc(flow_ckpt_tensor_desc_t *d, const char *name,
		      flow_dtype_t dtype, int ndim, const int64_t *dims,
		      const char *mesh, const char *sbp)
{
	memset(d, 0, sizeof(*d));
	assert_true(strlen(name) < sizeof(d->name));
	memcpy(d->name, name, strlen(name) + 1);
	d->dtype = dtype;
	d->shape.ndim = ndim;
	for (int i = 0; i < ndim; i++)
		d->shape.dims[i] = dims[i];
	memcpy(d->mesh, mesh, strlen(mesh) + 1);
	memcpy(d->sbp, sbp, strlen(sbp) + 1);
}

static flow_box_t make_box(int ndim, const int64_t *start,
				const int64_t *end)
{
	flow_box_t b;
	memset(&b, 0, sizeof(b));
	b.ndim = ndim;
	for (int i = 0; i < ndim; i++) {
		b.start[i] = start[i];
		b.extent[i] = end[i] - start[i];
	}
	return b;
}

static size_t shape_numel(const flow_shape_t *s)
{
	size_t n = 1;
	for (int i = 0; i < s->ndim; i++)
		n *= (size_t)s->dims[i];
	return n;
}

/* The elements of box from a row-major logical tensor, one at a time (a
 * deliberately different walk from the library's). */
static void ref_extract(const unsigned char *logical, const flow_shape_t *shape,
			const flow_box_t *box, size_t elsize,
			unsigned char *out)
{
	size_t n = (size_t)flow_box_numel(box);
	for (size_t k = 0; k < n; k++) {
		/* k -> index within the box -> logical flat index */
		size_t rem = k, flat = 0, mul = 1;
		for (int d = box->ndim - 1; d >= 0; d--) {
			size_t ext = (size_t)box->extent[d];
			size_t i = rem % ext;
			rem /= ext;
			flat += ((size_t)box->start[d] + i) * mul;
			mul *= (size_t)shape->dims[d];
		}
		memcpy(out + k * elsize, logical + flat * elsize, elsize);
	}
}

static char *read_text(const char *path, size_t *len_out)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	size_t cap = 1024, len = 0;
	char *buf = malloc(cap);
	assert_non_null(buf);
	size_t n;
	while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
		len += n;
		if (cap - len < 2) {
			cap *= 2;
			buf = realloc(buf, cap);
			assert_non_null(buf);
		}
	}
	fclose(f);
	buf[len] = '\0';
	if (len_out)
		*len_out = len;
	return buf;
}

static void write_text(const char *path, const char *text)
{
	assert_int_equal(testutil_write_file(path, text, strlen(text)), 0);
}

static void copy_dir(const char *src, const char *dst)
{
	char a[512], b[512];
	assert_int_equal(mkdir(dst, 0755), 0);
	DIR *d = opendir(src);
	assert_non_null(d);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		size_t len;
		char *data = read_text(path_of(a, sizeof(a), src, e->d_name), &len);
		assert_int_equal(testutil_write_file(path_of(b, sizeof(b), dst,
							     e->d_name),
						     data, len), 0);
		free(data);
	}
	closedir(d);
}

static bool exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

static void expect_diag(const flow_diag_t *diag, flow_err_t err,
			const char *substr)
{
	if (diag->err != err || !strstr(diag->msg, substr))
		fail_msg("expected %s containing \"%s\", got %s \"%s\"",
			 flow_err_name(err), substr, flow_err_name(diag->err),
			 diag->msg);
}

/* Lines of a text file, for editing records by line number (1-based). */
typedef struct lines {
	char *line[64];
	int n;
} lines_t;

static void lines_load(lines_t *l, const char *path)
{
	char *text = read_text(path, NULL);
	l->n = 0;
	for (char *s = text; *s;) {
		char *nl = strchr(s, '\n');
		assert_non_null(nl);
		assert_true(l->n < 64);
		l->line[l->n++] = strndup(s, (size_t)(nl - s));
		s = nl + 1;
	}
	free(text);
}

static void lines_set(lines_t *l, int lineno, const char *text)
{
	assert_true(lineno >= 1 && lineno <= l->n);
	free(l->line[lineno - 1]);
	l->line[lineno - 1] = strdup(text);
}

/* Replace the first `from` in line lineno by `to`. */
static void lines_sub(lines_t *l, int lineno, const char *from, const char *to)
{
	assert_true(lineno >= 1 && lineno <= l->n);
	char *s = l->line[lineno - 1];
	char *at = strstr(s, from);
	if (!at)
		fail_msg("line %d '%s' lacks '%s'", lineno, s, from);
	size_t n = strlen(s) - strlen(from) + strlen(to) + 1;
	char *r = malloc(n);
	snprintf(r, n, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
	free(s);
	l->line[lineno - 1] = r;
}

static void lines_insert(lines_t *l, int lineno, const char *text)
{
	assert_true(l->n < 64 && lineno >= 1 && lineno <= l->n + 1);
	memmove(&l->line[lineno], &l->line[lineno - 1],
		(size_t)(l->n - lineno + 1) * sizeof(char *));
	l->line[lineno - 1] = strdup(text);
	l->n++;
}

static void lines_delete(lines_t *l, int lineno)
{
	assert_true(lineno >= 1 && lineno <= l->n);
	free(l->line[lineno - 1]);
	memmove(&l->line[lineno - 1], &l->line[lineno],
		(size_t)(l->n - lineno) * sizeof(char *));
	l->n--;
}

static void lines_swap(lines_t *l, int a, int b)
{
	char *t = l->line[a - 1];
	l->line[a - 1] = l->line[b - 1];
	l->line[b - 1] = t;
}

/* Write the lines back; with reseal, the last line becomes a correct
 * "end" line again, so only the edit itself is wrong. */
static void lines_store(lines_t *l, const char *path, bool reseal)
{
	size_t cap = 1;
	for (int i = 0; i < l->n; i++)
		cap += strlen(l->line[i]) + 1;
	cap += 32;
	char *text = malloc(cap);
	size_t len = 0;
	for (int i = 0; i < l->n; i++) {
		if (reseal && i == l->n - 1 && strncmp(l->line[i], "end ", 4) == 0) {
			char hex[17];
			flow_checksum_format(flow_checksum(text, len), hex);
			len += (size_t)snprintf(text + len, cap - len, "end %s\n", hex);
		} else {
			len += (size_t)snprintf(text + len, cap - len, "%s\n",
						l->line[i]);
		}
	}
	assert_int_equal(testutil_write_file(path, text, len), 0);
	free(text);
	for (int i = 0; i < l->n; i++)
		free(l->line[i]);
	l->n = 0;
}

/* splitmix64: the property test's generator. */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int64_t rng_range(uint64_t *s, int64_t lo, int64_t hi) /* [lo, hi] */
{
	return lo + (int64_t)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

static void fill_random(unsigned char *p, size_t n, uint64_t *s)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)rng_next(s);
}

/* ---- the good two-rank checkpoint the damage tests start from ---------------
 *
 * manifest lines:
 *   1 flow-checkpoint 1          9 shard wte 1 6:10,0:4 rank-00001.bin 0 64 ..
 *   2 step 10                   10 tensor bias i32 (5) 2 (B)
 *   3 state model gpt2 tiny     11 shard bias 0 0:5 rank-00000.bin 128 20 ..
 *   4 state seed 1234           12 shard bias 1 0:5 rank-00001.bin 64 20 ..
 *   5 state empty               13 tensor count i64 () 1 (B)
 *   6 state data.pos 3 17       14 shard count 0 - rank-00000.bin 192 8 ..
 *   7 tensor wte f32 (10,4) 2 (S(0))                15 end ..
 *   8 shard wte 0 0:6,0:4 rank-00000.bin 0 96 ..
 * rank-00000.idx: 1 magic, 2 rank, 3 tensor wte, 4 shard, 5 tensor bias,
 *   6 shard, 7 tensor count, 8 shard, 9 end; rank-00001.idx: 1 magic,
 *   2 rank, 3 tensor wte, 4 shard, 5 tensor bias, 6 shard, 7 end. */

static float good_wte[40];
static int32_t good_bias[5] = { 10, -20, 30, -40, 50 };
static int64_t good_count = 123456789012345ll;

static const flow_ckpt_kv_t good_kv[] = {
	{ "model", "gpt2 tiny" },
	{ "seed", "1234" },
	{ "empty", "" },
	{ "data.pos", "3 17" },
};

static void good_descs(flow_ckpt_tensor_desc_t *wte,
		       flow_ckpt_tensor_desc_t *bias,
		       flow_ckpt_tensor_desc_t *count)
{
	make_desc(wte, "wte", FLOW_DTYPE_F32, 2, (int64_t[]){ 10, 4 }, "2",
		  "(S(0))");
	make_desc(bias, "bias", FLOW_DTYPE_I32, 1, (int64_t[]){ 5 }, "2", "(B)");
	make_desc(count, "count", FLOW_DTYPE_I64, 0, NULL, "1", "(B)");
}

static void make_good(const char *dir)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_ckpt_tensor_desc_t wte, bias, count;
	good_descs(&wte, &bias, &count);
	for (int i = 0; i < 40; i++)
		good_wte[i] = (float)i * 0.5f - 3.0f;
	flow_ckpt_writer_t *w0, *w1;
	assert_int_equal(flow_ckpt_writer_new(dir, 0, &w0, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_new(dir, 1, &w1, &diag), FLOW_OK);
	flow_box_t top = make_box(2, (int64_t[]){ 0, 0 }, (int64_t[]){ 6, 4 });
	flow_box_t bottom = make_box(2, (int64_t[]){ 6, 0 },
					  (int64_t[]){ 10, 4 });
	assert_int_equal(flow_ckpt_writer_add(w0, &wte, &top, good_wte, &diag),
			 FLOW_OK);
	assert_int_equal(flow_ckpt_writer_add(w0, &bias, NULL, good_bias, &diag),
			 FLOW_OK);
	assert_int_equal(flow_ckpt_writer_add(w0, &count, NULL, &good_count,
					      &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_add(w1, &wte, &bottom, good_wte + 24,
					      &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_add(w1, &bias, NULL, good_bias, &diag),
			 FLOW_OK);
	assert_int_equal(flow_ckpt_writer_finish(w1, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_finish(w0, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_commit(dir, 10, 2, good_kv, 4, &diag),
			 FLOW_OK);
}

/* A fresh copy of the good checkpoint under root/name. */
static char *good_copy(char *buf, size_t cap, const char *name)
{
	char good[512];
	path_of(good, sizeof(good), root, "good");
	if (!exists(good))
		make_good(good);
	path_of(buf, cap, root, name);
	copy_dir(good, buf);
	return buf;
}

static void expect_open_fails(const char *dir, flow_err_t err,
			      const char *substr)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_ckpt_t *c = NULL;
	assert_int_not_equal(flow_ckpt_open(dir, &c, &diag), FLOW_OK);
	assert_null(c);
	expect_diag(&diag, err, substr);
}

/* ---- the exact format ------------------------------------------------------ */

static void test_ckpt_writes_the_documented_text(void **state)
{
	(void)state;
	char dir[512], p[600], expect[2048], hex[17], hex2[17];
	flow_diag_t diag = FLOW_DIAG_INIT;
	path_of(dir, sizeof(dir), root, "exact");
	float w[6] = { 0, 1, 2, 3, 4, 5 };
	uint8_t s = 7;
	flow_ckpt_tensor_desc_t dw, ds;
	make_desc(&dw, "w", FLOW_DTYPE_F32, 2, (int64_t[]){ 2, 3 }, "1", "(B)");
	make_desc(&ds, "adamw.m/s", FLOW_DTYPE_U8, 0, NULL, "1", "(B)");
	flow_ckpt_writer_t *wr;
	assert_int_equal(flow_ckpt_writer_new(dir, 0, &wr, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_add(wr, &dw, NULL, w, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_add(wr, &ds, NULL, &s, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_finish(wr, &diag), FLOW_OK);
	flow_ckpt_kv_t kv[] = { { "k", "v  w " } };
	assert_int_equal(flow_ckpt_commit(dir, 7, 1, kv, 1, &diag), FLOW_OK);

	/* The data file: w at 0, s at 64, zero padding between. */
	size_t len;
	unsigned char *bin = (unsigned char *)read_text(
		path_of(p, sizeof(p), dir, "rank-00000.bin"), &len);
	assert_int_equal(len, 65);
	assert_memory_equal(bin, w, 24);
	for (int i = 24; i < 64; i++)
		assert_int_equal(bin[i], 0);
	assert_int_equal(bin[64], 7);
	free(bin);

	char sw[17], ss[17];
	flow_checksum_format(flow_checksum(w, 24), sw);
	flow_checksum_format(flow_checksum(&s, 1), ss);
	int n = snprintf(expect, sizeof(expect),
			 "flow-checkpoint-index 1\n"
			 "rank 0\n"
			 "tensor w f32 (2,3) 1 (B)\n"
			 "shard w 0 0:2,0:3 rank-00000.bin 0 24 %s\n"
			 "tensor adamw.m/s u8 () 1 (B)\n"
			 "shard adamw.m/s 0 - rank-00000.bin 64 1 %s\n",
			 sw, ss);
	flow_checksum_format(flow_checksum(expect, (size_t)n), hex);
	snprintf(expect + n, sizeof(expect) - (size_t)n, "end %s\n", hex);
	char *idx = read_text(path_of(p, sizeof(p), dir, "rank-00000.idx"), NULL);
	assert_string_equal(idx, expect);
	free(idx);

	n = snprintf(expect, sizeof(expect),
		     "flow-checkpoint 1\n"
		     "step 7\n"
		     "state k v  w \n"
		     "tensor w f32 (2,3) 1 (B)\n"
		     "shard w 0 0:2,0:3 rank-00000.bin 0 24 %s\n"
		     "tensor adamw.m/s u8 () 1 (B)\n"
		     "shard adamw.m/s 0 - rank-00000.bin 64 1 %s\n",
		     sw, ss);
	flow_checksum_format(flow_checksum(expect, (size_t)n), hex2);
	snprintf(expect + n, sizeof(expect) - (size_t)n, "end %s\n", hex2);
	char *man = read_text(path_of(p, sizeof(p), dir, "manifest"), NULL);
	assert_string_equal(man, expect);
	free(man);

	/* Nothing else: no temporaries left behind. */
	assert_int_equal(testutil_count_entries(dir), 3);
}

static void test_ckpt_step_path_and_whole_box(void **state)
{
	(void)state;
	char *p = flow_ckpt_step_path("ckpt", 10);
	assert_string_equal(p, "ckpt/step-00000010");
	free(p);
	p = flow_ckpt_step_path("ckpt/", 123456789);
	assert_string_equal(p, "ckpt/step-123456789");
	free(p);
	flow_shape_t s = { 3, { 4, 5, 6 } };
	flow_box_t b;
	flow_box_whole(&s, &b);
	assert_int_equal(b.ndim, 3);
	assert_int_equal(b.start[1], 0);
	assert_int_equal(b.extent[2], 6);
}

/* ---- round trips ------------------------------------------------------------ */

static void test_ckpt_round_trip_single_rank_every_dtype(void **state)
{
	(void)state;
	char dir[512];
	flow_diag_t diag = FLOW_DIAG_INIT;
	path_of(dir, sizeof(dir), root, "ckpt/step-00000001");
	static const int64_t d1[] = { 7 }, d3[] = { 2, 3, 4 }, d0z[] = { 0, 3 };
	struct {
		int ndim;
		const int64_t *dims;
	} shapes[] = { { 0, NULL }, { 1, d1 }, { 3, d3 }, { 2, d0z } };
	enum { NS = 4 };
	flow_ckpt_tensor_desc_t desc[FLOW_DTYPE_COUNT * NS];
	unsigned char *data[FLOW_DTYPE_COUNT * NS];
	uint64_t seed = 42;
	flow_ckpt_writer_t *w;
	assert_int_equal(flow_ckpt_writer_new(dir, 0, &w, &diag), FLOW_OK);
	int nt = 0;
	for (int dt = 0; dt < FLOW_DTYPE_COUNT; dt++) {
		for (int s = 0; s < NS; s++, nt++) {
			char name[64];
			snprintf(name, sizeof(name), "t.%s.%dd%s",
				 flow_dtype_name((flow_dtype_t)dt), shapes[s].ndim,
				 s == 3 ? ".empty" : "");
			make_desc(&desc[nt], name, (flow_dtype_t)dt, shapes[s].ndim,
				  shapes[s].dims, "1", "(B)");
			size_t bytes = shape_numel(&desc[nt].shape) *
				       flow_dtype_size((flow_dtype_t)dt);
			data[nt] = malloc(bytes + 1);
			fill_random(data[nt], bytes, &seed);
			assert_int_equal(flow_ckpt_writer_add(w, &desc[nt], NULL,
							      data[nt], &diag),
					 FLOW_OK);
		}
	}
	assert_int_equal(flow_ckpt_writer_finish(w, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_commit(dir, 1, 1, good_kv, 4, &diag), FLOW_OK);

	flow_ckpt_t *c;
	assert_int_equal(flow_ckpt_open(dir, &c, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_step(c), 1);
	assert_int_equal(flow_ckpt_tensor_count(c), (size_t)nt);
	const flow_ckpt_kv_t *kv;
	assert_int_equal(flow_ckpt_state(c, &kv), 4);
	for (int i = 0; i < 4; i++) {
		assert_string_equal(kv[i].key, good_kv[i].key);
		assert_string_equal(kv[i].value, good_kv[i].value);
	}
	assert_string_equal(flow_ckpt_get(c, "model"), "gpt2 tiny");
	assert_string_equal(flow_ckpt_get(c, "empty"), "");
	assert_null(flow_ckpt_get(c, "nope"));
	for (int i = 0; i < nt; i++) {
		int at = flow_ckpt_tensor_find(c, desc[i].name);
		assert_int_equal(at, i);
		const flow_ckpt_tensor_desc_t *d = flow_ckpt_tensor_at(c, (size_t)at);
		assert_string_equal(d->name, desc[i].name);
		assert_int_equal(d->dtype, desc[i].dtype);
		assert_true(flow_shape_equal(&d->shape, &desc[i].shape));
		assert_string_equal(d->mesh, "1");
		assert_string_equal(d->sbp, "(B)");
		size_t bytes = shape_numel(&d->shape) * flow_dtype_size(d->dtype);
		unsigned char *back = malloc(bytes + 1);
		memset(back, 0xa5, bytes + 1);
		assert_int_equal(flow_ckpt_read(c, (size_t)at, NULL, back, &diag),
				 FLOW_OK);
		assert_memory_equal(back, data[i], bytes);
		assert_int_equal(back[bytes], 0xa5);
		free(back);
		free(data[i]);
	}
	/* A box of the 3-d f32 tensor. */
	int at = flow_ckpt_tensor_find(c, "t.f32.3d");
	assert_true(at >= 0);
	assert_int_equal(flow_ckpt_tensor_find(c, "t.f32.5d"), -1);
	assert_null(flow_ckpt_tensor_at(c, (size_t)nt));
	assert_int_equal(flow_ckpt_verify(c, &diag), FLOW_OK);
	flow_ckpt_free(c);
	flow_ckpt_free(NULL);
}

/* n elements over k ranks, the first n mod k one longer. */
static void balanced(int64_t n, int k, int r, int64_t *lo, int64_t *hi)
{
	int64_t base = n / k, extra = n % k;
	*lo = r * base + (r < extra ? r : extra);
	*hi = *lo + base + (r < extra ? 1 : 0);
}

static void test_ckpt_multi_rank_write_commit_read_any_box(void **state)
{
	(void)state;
	char dir[512];
	flow_diag_t diag = FLOW_DIAG_INIT;
	path_of(dir, sizeof(dir), root, "multi");
	enum { R = 3 };
	flow_ckpt_tensor_desc_t a, b, rep, tiny;
	make_desc(&a, "a", FLOW_DTYPE_F32, 2, (int64_t[]){ 7, 5 }, "3", "(S(1))");
	make_desc(&b, "b", FLOW_DTYPE_I64, 1, (int64_t[]){ 9 }, "3", "(S(0))");
	make_desc(&rep, "rep", FLOW_DTYPE_BF16, 2, (int64_t[]){ 3, 2 }, "3", "(B)");
	make_desc(&tiny, "tiny", FLOW_DTYPE_U16, 1, (int64_t[]){ 2 }, "3",
		  "(S(0))");
	float av[35];
	int64_t bv[9];
	uint16_t rv[6] = { 1, 2, 3, 4, 5, 6 }, tv[2] = { 77, 88 };
	for (int i = 0; i < 35; i++)
		av[i] = (float)i;
	for (int i = 0; i < 9; i++)
		bv[i] = -1000 * i;
	for (int r = 0; r < R; r++) {
		flow_ckpt_writer_t *w;
		assert_int_equal(flow_ckpt_writer_new(dir, (uint32_t)r, &w, &diag),
				 FLOW_OK);
		int64_t lo, hi;
		/* a: columns split 2,2,1 */
		balanced(5, R, r, &lo, &hi);
		flow_box_t box = make_box(2, (int64_t[]){ 0, lo },
					       (int64_t[]){ 7, hi });
		float part[35];
		ref_extract((unsigned char *)av, &a.shape, &box, 4,
			    (unsigned char *)part);
		assert_int_equal(flow_ckpt_writer_add(w, &a, &box, part, &diag),
				 FLOW_OK);
		/* b: rows split 3,3,3, added after the replica */
		assert_int_equal(flow_ckpt_writer_add(w, &rep, NULL, rv, &diag),
				 FLOW_OK);
		balanced(9, R, r, &lo, &hi);
		box = make_box(1, &lo, &hi);
		assert_int_equal(flow_ckpt_writer_add(w, &b, &box, bv + lo, &diag),
				 FLOW_OK);
		/* tiny: 2 over 3 ranks, rank 2 holds an empty piece */
		balanced(2, R, r, &lo, &hi);
		box = make_box(1, &lo, &hi);
		assert_int_equal(flow_ckpt_writer_add(w, &tiny, &box, tv + lo,
						      &diag), FLOW_OK);
		assert_int_equal(flow_ckpt_writer_finish(w, &diag), FLOW_OK);
	}
	assert_int_equal(flow_ckpt_commit(dir, 99, R, NULL, 0, &diag), FLOW_OK);

	flow_ckpt_t *c;
	assert_int_equal(flow_ckpt_open(dir, &c, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_step(c), 99);
	assert_int_equal(flow_ckpt_tensor_count(c), 4);
	/* Order of first appearance in rank 0's index. */
	assert_string_equal(flow_ckpt_tensor_at(c, 0)->name, "a");
	assert_string_equal(flow_ckpt_tensor_at(c, 1)->name, "rep");
	assert_string_equal(flow_ckpt_tensor_at(c, 2)->name, "b");
	const flow_ckpt_kv_t *kv;
	assert_int_equal(flow_ckpt_state(c, &kv), 0);

	float ab[35];
	assert_int_equal(flow_ckpt_read(c, 0, NULL, ab, &diag), FLOW_OK);
	assert_memory_equal(ab, av, sizeof(av));
	/* Every box of a. */
	for (int64_t r0 = 0; r0 <= 7; r0++)
		for (int64_t r1 = r0; r1 <= 7; r1++)
			for (int64_t c0 = 0; c0 <= 5; c0++)
				for (int64_t c1 = c0; c1 <= 5; c1++) {
					flow_box_t q = make_box(
						2, (int64_t[]){ r0, c0 },
						(int64_t[]){ r1, c1 });
					float got[35], want[35];
					memset(got, 0, sizeof(got));
					ref_extract((unsigned char *)av, &a.shape,
						    &q, 4, (unsigned char *)want);
					assert_int_equal(flow_ckpt_read(c, 0, &q, got,
									&diag),
							 FLOW_OK);
					assert_memory_equal(got, want,
							    (size_t)flow_box_numel(&q) * 4);
				}
	int64_t bb[9];
	assert_int_equal(flow_ckpt_read(c, 2, NULL, bb, &diag), FLOW_OK);
	assert_memory_equal(bb, bv, sizeof(bv));
	flow_box_t q = make_box(1, (int64_t[]){ 2 }, (int64_t[]){ 7 });
	assert_int_equal(flow_ckpt_read(c, 2, &q, bb, &diag), FLOW_OK);
	assert_memory_equal(bb, bv + 2, 5 * sizeof(int64_t));
	uint16_t rb[6];
	assert_int_equal(flow_ckpt_read(c, 1, NULL, rb, &diag), FLOW_OK);
	assert_memory_equal(rb, rv, sizeof(rv));
	uint16_t tb[2];
	assert_int_equal(flow_ckpt_read(c, 3, NULL, tb, &diag), FLOW_OK);
	assert_memory_equal(tb, tv, sizeof(tv));

	/* Bad queries are usage errors. */
	q = make_box(1, (int64_t[]){ 2 }, (int64_t[]){ 10 });
	assert_int_equal(flow_ckpt_read(c, 2, &q, bb, &diag), FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "box 2:10 is outside its shape (9)");
	flow_diag_clear(&diag);
	assert_int_equal(flow_ckpt_read(c, 0, &q, bb, &diag), FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "box has 1 dimensions");
	flow_diag_clear(&diag);
	assert_int_equal(flow_ckpt_read(c, 4, NULL, bb, &diag), FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "no tensor 4");
	flow_diag_clear(&diag);
	assert_int_equal(flow_ckpt_verify(c, &diag), FLOW_OK);
	flow_ckpt_free(c);
}

/* ---- property: any box of any tiling ----------------------------------------- */

typedef struct prop_piece {
	int tensor;
	flow_box_t box;
	uint32_t rank;
} prop_piece_t;

enum { PROP_CKPTS = 24, PROP_TENSORS = 16, PROP_RANKS_MAX = 4,
       PROP_QUERIES = 12, PROP_PIECES_MAX = 4096 };

/* Cut dimension of length n into 1-3 pieces at random points (pieces may
 * be empty); returns the number of pieces, bounds in cuts[0..k]. */
static int random_cuts(uint64_t *rng, int64_t n, int64_t cuts[5])
{
	int k = (int)rng_range(rng, 1, 3);
	cuts[0] = 0;
	cuts[k] = n;
	for (int i = 1; i < k; i++)
		cuts[i] = rng_range(rng, 0, n);
	/* sort the inner cuts */
	for (int i = 1; i < k; i++)
		for (int j = i + 1; j < k; j++)
			if (cuts[j] < cuts[i]) {
				int64_t t = cuts[i];
				cuts[i] = cuts[j];
				cuts[j] = t;
			}
	return k;
}

static void test_ckpt_property_any_box_of_random_tilings(void **state)
{
	(void)state;
	uint64_t rng = 0x5eed0f1e0c4b7ull; /* fixed: failures reproduce */
	static prop_piece_t pieces[PROP_PIECES_MAX];
	int cases = 0, queries = 0;
	for (int ck = 0; ck < PROP_CKPTS; ck++) {
		char dir[512], sub[64];
		flow_diag_t diag = FLOW_DIAG_INIT;
		snprintf(sub, sizeof(sub), "prop/step-%08d", ck);
		path_of(dir, sizeof(dir), root, sub);
		int nranks = (int)rng_range(&rng, 1, PROP_RANKS_MAX);
		flow_ckpt_tensor_desc_t desc[PROP_TENSORS];
		unsigned char *logical[PROP_TENSORS];
		int npieces = 0;
		for (int t = 0; t < PROP_TENSORS; t++) {
			int ndim = (int)rng_range(&rng, 0, 4);
			int64_t dims[4];
			for (int d = 0; d < ndim; d++)
				dims[d] = rng_next(&rng) % 16 == 0 ?
					  0 : rng_range(&rng, 1, 6);
			char name[64];
			snprintf(name, sizeof(name), "adamw.v/p%d.t%d", ck, t);
			flow_dtype_t dt = (flow_dtype_t)rng_range(&rng, 0,
								  FLOW_DTYPE_COUNT - 1);
			make_desc(&desc[t], name, dt, ndim, dims, "4", "(S(0))");
			size_t bytes = shape_numel(&desc[t].shape) *
				       flow_dtype_size(dt);
			logical[t] = malloc(bytes + 1);
			fill_random(logical[t], bytes, &rng);
			/* A grid of pieces, each on a random rank, some also
			 * replicated on another rank. */
			int64_t cuts[4][5];
			int k[4], cell[4] = { 0 };
			for (int d = 0; d < ndim; d++)
				k[d] = random_cuts(&rng, dims[d], cuts[d]);
			int first = npieces;
			for (;;) {
				flow_box_t b;
				memset(&b, 0, sizeof(b));
				b.ndim = ndim;
				for (int d = 0; d < ndim; d++) {
					b.start[d] = cuts[d][cell[d]];
					b.extent[d] = cuts[d][cell[d] + 1] -
						      cuts[d][cell[d]];
				}
				/* Equal empty cells are one box. */
				bool dup = false;
				for (int i = first; i < npieces && !dup; i++)
					dup = flow_box_equal(&pieces[i].box, &b);
				if (!dup) {
					assert_true(npieces + 2 <= PROP_PIECES_MAX);
					uint32_t r = (uint32_t)rng_range(&rng, 0,
									 nranks - 1);
					pieces[npieces++] = (prop_piece_t){ t, b, r };
					if (nranks > 1 && rng_next(&rng) % 4 == 0)
						pieces[npieces++] = (prop_piece_t){
							t, b,
							(r + 1 + (uint32_t)rng_range(&rng, 0, nranks - 2)) %
								(uint32_t)nranks
						};
				}
				int d = ndim - 1;
				for (; d >= 0; d--) {
					if (++cell[d] < k[d])
						break;
					cell[d] = 0;
				}
				if (d < 0)
					break;
			}
		}
		/* Shuffle, so each rank adds its pieces of different tensors
		 * interleaved. */
		for (int i = npieces - 1; i > 0; i--) {
			int j = (int)rng_range(&rng, 0, i);
			prop_piece_t tmp = pieces[i];
			pieces[i] = pieces[j];
			pieces[j] = tmp;
		}
		for (int r = 0; r < nranks; r++) {
			flow_ckpt_writer_t *w;
			assert_int_equal(flow_ckpt_writer_new(dir, (uint32_t)r, &w,
							      &diag), FLOW_OK);
			for (int i = 0; i < npieces; i++) {
				if (pieces[i].rank != (uint32_t)r)
					continue;
				const flow_ckpt_tensor_desc_t *d =
					&desc[pieces[i].tensor];
				size_t es = flow_dtype_size(d->dtype);
				unsigned char *part = malloc((size_t)flow_box_numel(&pieces[i].box) * es + 1);
				ref_extract(logical[pieces[i].tensor], &d->shape,
					    &pieces[i].box, es, part);
				if (flow_ckpt_writer_add(w, d, &pieces[i].box, part,
							 &diag) != FLOW_OK)
					fail_msg("checkpoint %d: %s", ck, diag.msg);
				free(part);
			}
			assert_int_equal(flow_ckpt_writer_finish(w, &diag), FLOW_OK);
		}
		if (flow_ckpt_commit(dir, (uint64_t)ck, (uint32_t)nranks, NULL, 0,
				     &diag) != FLOW_OK)
			fail_msg("checkpoint %d: %s", ck, diag.msg);
		flow_ckpt_t *c;
		if (flow_ckpt_open(dir, &c, &diag) != FLOW_OK)
			fail_msg("checkpoint %d: %s", ck, diag.msg);
		assert_int_equal(flow_ckpt_verify(c, &diag), FLOW_OK);
		for (int t = 0; t < PROP_TENSORS; t++) {
			const flow_ckpt_tensor_desc_t *d = &desc[t];
			int at = flow_ckpt_tensor_find(c, d->name);
			assert_true(at >= 0);
			size_t es = flow_dtype_size(d->dtype);
			for (int qn = 0; qn <= PROP_QUERIES; qn++) {
				flow_box_t q;
				if (qn == 0) {
					flow_box_whole(&d->shape, &q);
				} else {
					memset(&q, 0, sizeof(q));
					q.ndim = d->shape.ndim;
					for (int dd = 0; dd < q.ndim; dd++) {
						int64_t lo = rng_range(&rng, 0,
								       d->shape.dims[dd]);
						int64_t hi = rng_range(&rng, lo,
								       d->shape.dims[dd]);
						q.start[dd] = lo;
						q.extent[dd] = hi - lo;
					}
				}
				size_t bytes = (size_t)flow_box_numel(&q) * es;
				unsigned char *got = malloc(bytes + 8);
				unsigned char *want = malloc(bytes + 1);
				memset(got, 0xee, bytes + 8);
				ref_extract(logical[t], &d->shape, &q, es, want);
				if (flow_ckpt_read(c, (size_t)at, &q, got, &diag) != FLOW_OK)
					fail_msg("checkpoint %d tensor %d query %d: %s",
						 ck, t, qn, diag.msg);
				if (memcmp(got, want, bytes) != 0)
					fail_msg("checkpoint %d tensor %d query %d: wrong elements",
						 ck, t, qn);
				for (int g = 0; g < 8; g++)
					assert_int_equal(got[bytes + (size_t)g], 0xee);
				/* The same through a read buffer of a few
				 * rows: the largest row here is 6*6*6 elements
				 * of 8 bytes. */
				unsigned char scratch[6 * 6 * 6 * 8 + 5];
				size_t cap = (size_t)rng_range(&rng, 6 * 6 * 6 * 8,
							       sizeof scratch);
				memset(got, 0xee, bytes + 8);
				if (flow_ckpt_read_bounded(c, (size_t)at, &q, got,
							   scratch, cap,
							   &diag) != FLOW_OK)
					fail_msg("checkpoint %d tensor %d query %d bounded: %s",
						 ck, t, qn, diag.msg);
				if (memcmp(got, want, bytes) != 0)
					fail_msg("checkpoint %d tensor %d query %d bounded: wrong elements",
						 ck, t, qn);
				for (int g = 0; g < 8; g++)
					assert_int_equal(got[bytes + (size_t)g], 0xee);
				free(got);
				free(want);
				queries++;
			}
			cases++;
			free(logical[t]);
		}
		flow_ckpt_free(c);
	}
	assert_int_equal(cases, PROP_CKPTS * PROP_TENSORS);
	assert_int_equal(queries, cases * (PROP_QUERIES + 1));
}

/* Property: grow one piece of a random tiling by one element along one
 * dimension and the commit finds the overlap; shrink one and it finds the
 * gap, naming the tensor either way. */
static void test_ckpt_property_commit_rejects_broken_tilings(void **state)
{
	(void)state;
	uint64_t rng = 0xb0c5e5ull;
	static flow_box_t boxes[256];
	int overlaps = 0, gaps = 0;
	for (int ck = 0; ck < 64; ck++) {
		char dir[512], sub[64];
		flow_diag_t diag = FLOW_DIAG_INIT;
		snprintf(sub, sizeof(sub), "broken/step-%08d", ck);
		path_of(dir, sizeof(dir), root, sub);
		int ndim = (int)rng_range(&rng, 1, 4), k[4], cell[4] = { 0 };
		int64_t dims[4], cuts[4][5];
		for (int d = 0; d < ndim; d++) {
			dims[d] = rng_range(&rng, 2, 6);
			k[d] = random_cuts(&rng, dims[d], cuts[d]);
		}
		int n = 0;
		for (;;) {
			flow_box_t b;
			memset(&b, 0, sizeof(b));
			b.ndim = ndim;
			for (int d = 0; d < ndim; d++) {
				b.start[d] = cuts[d][cell[d]];
				b.extent[d] = cuts[d][cell[d] + 1] - cuts[d][cell[d]];
			}
			if ((size_t)flow_box_numel(&b) > 0)
				boxes[n++] = b;
			int d = ndim - 1;
			for (; d >= 0; d--) {
				if (++cell[d] < k[d])
					break;
				cell[d] = 0;
			}
			if (d < 0)
				break;
		}
		/* Break one piece. */
		flow_box_t *v = &boxes[rng_range(&rng, 0, n - 1)];
		int d = (int)rng_range(&rng, 0, ndim - 1);
		bool room_above = v->start[d] + v->extent[d] < dims[d];
		bool room_below = v->start[d] > 0;
		bool grow = (room_above || room_below) && rng_next(&rng) % 3 != 0;
		if (!grow) {
			v->extent[d]--; /* leaves a gap */
		} else if (room_above && (!room_below || rng_next(&rng) % 2)) {
			v->extent[d]++; /* into the next piece up */
		} else {
			v->start[d]--; /* into the next piece down */
			v->extent[d]++;
		}
		flow_ckpt_tensor_desc_t desc;
		make_desc(&desc, "broken", FLOW_DTYPE_U8, ndim, dims, "2", "(S(0))");
		unsigned char zero[1296] = { 0 };
		int nranks = (int)rng_range(&rng, 1, 3);
		for (int r = 0; r < nranks; r++) {
			flow_ckpt_writer_t *w;
			assert_int_equal(flow_ckpt_writer_new(dir, (uint32_t)r, &w,
							      &diag), FLOW_OK);
			for (int i = r; i < n; i += nranks)
				assert_int_equal(flow_ckpt_writer_add(w, &desc, &boxes[i],
								      zero, &diag),
						 FLOW_OK);
			assert_int_equal(flow_ckpt_writer_finish(w, &diag), FLOW_OK);
		}
		assert_int_equal(flow_ckpt_commit(dir, 1, (uint32_t)nranks, NULL, 0,
						  &diag), FLOW_ERR_USAGE);
		const char *want = grow ? "overlaps box" : "cover";
		if (!strstr(diag.msg, want) || !strstr(diag.msg, "tensor 'broken'"))
			fail_msg("case %d: expected '%s', got \"%s\"", ck, want,
				 diag.msg);
		overlaps += grow;
		gaps += !grow;
	}
	/* Both kinds were exercised. */
	assert_true(overlaps > 8 && gaps > 8);
}

/* ---- writer and commit usage errors ---------------------------------------------- */

static void test_ckpt_writer_rejects_bad_descs_and_boxes(void **state)
{
	(void)state;
	char dir[512];
	flow_diag_t diag = FLOW_DIAG_INIT;
	path_of(dir, sizeof(dir), root, "usage");
	flow_ckpt_writer_t *w;
	assert_int_equal(flow_ckpt_writer_new(dir, 0, &w, &diag), FLOW_OK);
	float data[12] = { 0 };
	flow_ckpt_tensor_desc_t d;
	make_desc(&d, "w", FLOW_DTYPE_F32, 2, (int64_t[]){ 3, 4 }, "1", "(B)");

	flow_box_t out = make_box(2, (int64_t[]){ 2, 0 }, (int64_t[]){ 4, 4 });
	assert_int_equal(flow_ckpt_writer_add(w, &d, &out, data, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "tensor 'w': box 2:4,0:4 is outside its shape (3,4)");
	flow_diag_clear(&diag);

	flow_box_t flat = make_box(1, (int64_t[]){ 0 }, (int64_t[]){ 3 });
	assert_int_equal(flow_ckpt_writer_add(w, &d, &flat, data, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "box has 1 dimensions, the shape (3,4) has 2");
	flow_diag_clear(&diag);

	flow_ckpt_tensor_desc_t bad = d;
	memcpy(bad.name, "a b", 4);
	assert_int_equal(flow_ckpt_writer_add(w, &bad, NULL, data, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "invalid tensor name 'a b'");
	flow_diag_clear(&diag);

	bad = d;
	bad.name[0] = '\0';
	assert_int_equal(flow_ckpt_writer_add(w, &bad, NULL, data, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "invalid tensor name ''");
	flow_diag_clear(&diag);

	bad = d;
	memset(bad.name, 'x', sizeof(bad.name)); /* no NUL: too long */
	assert_int_equal(flow_ckpt_writer_add(w, &bad, NULL, data, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "is longer than 127 bytes");
	flow_diag_clear(&diag);

	bad = d;
	memcpy(bad.sbp, "(S(0), B)", 10);
	assert_int_equal(flow_ckpt_writer_add(w, &bad, NULL, data, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "invalid SBP '(S(0), B)'");
	flow_diag_clear(&diag);

	bad = d;
	bad.dtype = (flow_dtype_t)99;
	assert_int_equal(flow_ckpt_writer_add(w, &bad, NULL, data, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "unknown dtype 99");
	flow_diag_clear(&diag);

	/* The writer is still usable after usage errors. */
	assert_int_equal(flow_ckpt_writer_add(w, &d, NULL, data, &diag), FLOW_OK);
	bad = d;
	bad.shape.dims[1] = 5;
	assert_int_equal(flow_ckpt_writer_add(w, &bad, NULL, data, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE,
		    "tensor 'w' added as 'f32 (3,4) 1 (B)' and as 'f32 (3,5) 1 (B)'");
	flow_diag_clear(&diag);
	assert_int_equal(flow_ckpt_writer_finish(w, &diag), FLOW_OK);

	/* Commit: state keys and values. */
	flow_ckpt_kv_t kv_space[] = { { "a b", "1" } };
	assert_int_equal(flow_ckpt_commit(dir, 1, 1, kv_space, 1, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "invalid state key 'a b'");
	flow_diag_clear(&diag);
	flow_ckpt_kv_t kv_nl[] = { { "a", "1\n2" } };
	assert_int_equal(flow_ckpt_commit(dir, 1, 1, kv_nl, 1, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "state 'a': the value must be printable");
	flow_diag_clear(&diag);
	flow_ckpt_kv_t kv_dup[] = { { "a", "1" }, { "a", "2" } };
	assert_int_equal(flow_ckpt_commit(dir, 1, 1, kv_dup, 2, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "duplicate state key 'a'");
	flow_diag_clear(&diag);
	assert_int_equal(flow_ckpt_commit(dir, 1, 0, NULL, 0, &diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE, "no ranks");
	flow_diag_clear(&diag);
	/* Rank 1 never wrote its index. */
	assert_int_equal(flow_ckpt_commit(dir, 1, 2, NULL, 0, &diag), FLOW_ERR_IO);
	expect_diag(&diag, FLOW_ERR_IO, "rank-00001.idx");
	flow_diag_clear(&diag);
	char p[600];
	assert_false(exists(path_of(p, sizeof(p), dir, "manifest")));
	assert_int_equal(flow_ckpt_commit(dir, 1, 1, NULL, 0, &diag), FLOW_OK);
	assert_true(exists(p));
}

/* ---- damaged manifests ------------------------------------------------------------- */

typedef void (*edit_fn)(lines_t *l);

/* Rank 1's wte shard 6:10,0:4, on line n of the manifest or of its index,
 * made to start a row late (a gap) or a row early (an overlap), its
 * length following its box. */
static void shard_gap(lines_t *l, int n)
{
	lines_sub(l, n, "6:10,0:4", "7:10,0:4");
	lines_sub(l, n, " 0 64 ", " 0 48 ");
}

static void shard_overlap(lines_t *l, int n)
{
	lines_sub(l, n, "6:10,0:4", "5:10,0:4");
	lines_sub(l, n, " 0 64 ", " 0 80 ");
}

static void e_magic(lines_t *l) { lines_set(l, 1, "flow-chekpoint 1"); }
static void e_version(lines_t *l) { lines_set(l, 1, "flow-checkpoint 2"); }
static void e_step(lines_t *l) { lines_set(l, 2, "step 1x"); }
static void e_step_zero(lines_t *l) { lines_set(l, 2, "step 010"); }
static void e_spaces(lines_t *l) { lines_set(l, 2, "step  10"); }
static void e_unknown(lines_t *l) { lines_insert(l, 10, "bogus 1"); }
static void e_shard_first(lines_t *l) { lines_swap(l, 7, 8); }
static void e_dup_tensor(lines_t *l)
{
	char *t = strdup(l->line[6]), *s1 = strdup(l->line[7]),
	     *s2 = strdup(l->line[8]);
	lines_insert(l, 10, t);
	lines_insert(l, 11, s1);
	lines_insert(l, 12, s2);
	free(t);
	free(s1);
	free(s2);
}
static void e_box_out(lines_t *l) { lines_sub(l, 8, "0:6,0:4", "0:6,0:5"); }
static void e_box_dims(lines_t *l) { lines_sub(l, 8, "0:6,0:4", "0:6"); }
static void e_box_syntax(lines_t *l) { lines_sub(l, 8, "0:6,0:4", "6:0,0:4"); }
static void e_length(lines_t *l) { lines_sub(l, 8, " 0 96 ", " 0 92 "); }
static void e_gap(lines_t *l) { shard_gap(l, 9); }
static void e_overlap(lines_t *l) { shard_overlap(l, 9); }
static void e_same_rank_twice(lines_t *l)
{
	lines_sub(l, 12, "shard bias 1 0:5 rank-00001.bin 64 ",
		  "shard bias 0 0:5 rank-00000.bin 128 ");
}
static void e_file(lines_t *l) { lines_sub(l, 9, "rank-00001", "rank-00002"); }
static void e_offset(lines_t *l) { lines_sub(l, 11, " 128 20 ", " 130 20 "); }
static void e_rank(lines_t *l) { lines_sub(l, 9, "shard wte 1 ", "shard wte -1 "); }
static void e_sum(lines_t *l)
{
	char *s = l->line[7];
	memcpy(s + strlen(s) - 16, "0123456789ABCDEF", 16);
}
static void e_dtype(lines_t *l) { lines_sub(l, 7, " f32 ", " float32 "); }
static void e_shape(lines_t *l) { lines_sub(l, 7, "(10,4)", "10x4"); }
static void e_no_shards(lines_t *l)
{
	lines_delete(l, 8);
	lines_delete(l, 8);
}
static void e_late_state(lines_t *l) { lines_insert(l, 15, "state late 1"); }
static void e_state_key(lines_t *l) { lines_set(l, 4, "state se=ed 1234"); }
static void e_state_dup(lines_t *l) { lines_set(l, 5, "state seed 1"); }
static void e_end_hex(lines_t *l) { lines_set(l, 15, "end zzzz"); }
static void e_no_end(lines_t *l) { lines_delete(l, 15); }
static void e_after_end(lines_t *l) { lines_insert(l, 16, "tensor x f32 () 1 (B)"); }
static void e_value(lines_t *l) { lines_sub(l, 3, "tiny", "tinY"); }
static void e_tab(lines_t *l) { lines_sub(l, 3, "gpt2 tiny", "gpt2\ttiny"); }
static void e_cr(lines_t *l) { lines_sub(l, 2, "10", "10\r"); }
static void e_long_name(lines_t *l)
{
	char t[300];
	memset(t, 0, sizeof(t));
	memcpy(t, "tensor ", 7);
	memset(t + 7, 'n', 128);
	memcpy(t + 135, " f32 () 1 (B)", 13);
	lines_set(l, 13, t);
}

static void test_ckpt_open_rejects_damaged_manifests(void **state)
{
	(void)state;
	static const struct {
		const char *name;
		edit_fn edit;
		bool reseal;
		flow_err_t err;
		const char *msg;
	} cases[] = {
		{ "magic", e_magic, true, FLOW_ERR_FORMAT,
		  "manifest:1: expected 'flow-checkpoint 1', got 'flow-chekpoint'" },
		{ "version", e_version, true, FLOW_ERR_FORMAT,
		  "manifest:1: unsupported checkpoint format version 2 (expected 1)" },
		{ "step", e_step, true, FLOW_ERR_FORMAT, "manifest:2: invalid step '1x'" },
		{ "step0", e_step_zero, true, FLOW_ERR_FORMAT,
		  "manifest:2: invalid step '010'" },
		{ "spaces", e_spaces, true, FLOW_ERR_FORMAT,
		  "manifest:2: empty field 2 (fields are separated by single spaces)" },
		{ "unknown", e_unknown, true, FLOW_ERR_FORMAT,
		  "manifest:10: unknown record 'bogus'" },
		{ "shard-first", e_shard_first, true, FLOW_ERR_FORMAT,
		  "manifest:7: shard of tensor 'wte' before its tensor line" },
		{ "dup-tensor", e_dup_tensor, true, FLOW_ERR_FORMAT,
		  "manifest:10: duplicate tensor 'wte' (first on line 7)" },
		{ "box-out", e_box_out, true, FLOW_ERR_FORMAT,
		  "manifest:8: shard box 0:6,0:5 exceeds (10,4)" },
		{ "box-dims", e_box_dims, true, FLOW_ERR_FORMAT,
		  "manifest:8: shard box 0:6 has 1 dimensions, tensor 'wte' has 2 (10,4)" },
		{ "box-syntax", e_box_syntax, true, FLOW_ERR_FORMAT,
		  "manifest:8: invalid shard box '6:0,0:4'" },
		{ "length", e_length, true, FLOW_ERR_FORMAT,
		  "manifest:8: shard length 92 does not match box 0:6,0:4 (96 bytes of f32)" },
		{ "gap", e_gap, true, FLOW_ERR_FORMAT,
		  "manifest:7: the shards of tensor 'wte' cover 36 of its 40 elements" },
		{ "overlap", e_overlap, true, FLOW_ERR_FORMAT,
		  "manifest:9: shard box 5:10,0:4 of tensor 'wte' overlaps box 0:6,0:4 (line 8)" },
		{ "twice", e_same_rank_twice, true, FLOW_ERR_FORMAT,
		  "manifest:12: shard box 0:5 of tensor 'bias' is listed twice for rank 0 (also line 11)" },
		{ "file", e_file, true, FLOW_ERR_FORMAT,
		  "manifest:9: expected shard file 'rank-00001.bin', got 'rank-00002.bin'" },
		{ "offset", e_offset, true, FLOW_ERR_FORMAT,
		  "manifest:11: shard offset 130 is not a multiple of 64" },
		{ "rank", e_rank, true, FLOW_ERR_FORMAT, "manifest:9: invalid rank '-1'" },
		{ "sum", e_sum, true, FLOW_ERR_FORMAT,
		  "manifest:8: invalid checksum '0123456789ABCDEF' (expected 16 lowercase hex digits)" },
		{ "dtype", e_dtype, true, FLOW_ERR_FORMAT,
		  "manifest:7: unknown dtype 'float32'" },
		{ "shape", e_shape, true, FLOW_ERR_FORMAT,
		  "manifest:7: invalid shape '10x4'" },
		{ "no-shards", e_no_shards, true, FLOW_ERR_FORMAT,
		  "manifest:7: tensor 'wte' has no shard lines" },
		{ "late-state", e_late_state, true, FLOW_ERR_FORMAT,
		  "manifest:15: state line after the first tensor line" },
		{ "state-key", e_state_key, true, FLOW_ERR_FORMAT,
		  "manifest:4: invalid state key 'se=ed'" },
		{ "state-dup", e_state_dup, true, FLOW_ERR_FORMAT,
		  "manifest:5: duplicate state key 'seed'" },
		{ "long-name", e_long_name, true, FLOW_ERR_FORMAT,
		  "manifest:13: tensor name 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn...' is longer than 127 bytes" },
		{ "end-hex", e_end_hex, false, FLOW_ERR_FORMAT,
		  "manifest:15: invalid checksum 'zzzz'" },
		{ "no-end", e_no_end, false, FLOW_ERR_FORMAT,
		  "manifest:15: unexpected end of file, expected 'end XXH3' (truncated?)" },
		{ "after-end", e_after_end, false, FLOW_ERR_FORMAT,
		  "manifest:16: unexpected line after 'end'" },
		{ "tab", e_tab, true, FLOW_ERR_FORMAT,
		  "manifest:3: byte 0x09 in column 17 is not printable ASCII" },
		{ "cr", e_cr, true, FLOW_ERR_FORMAT,
		  "manifest:2: byte 0x0d in column 8 is not printable ASCII" },
		{ "value", e_value, false, FLOW_ERR_CHECKSUM,
		  "manifest:15: checksum mismatch: stored " },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char dir[512], name[64], mp[600];
		snprintf(name, sizeof(name), "bad-%s", cases[i].name);
		good_copy(dir, sizeof(dir), name);
		lines_t l;
		lines_load(&l, path_of(mp, sizeof(mp), dir, "manifest"));
		assert_int_equal(l.n, 15);
		cases[i].edit(&l);
		lines_store(&l, mp, cases[i].reseal);
		flow_diag_t diag = FLOW_DIAG_INIT;
		flow_ckpt_t *c = NULL;
		if (flow_ckpt_open(dir, &c, &diag) == FLOW_OK)
			fail_msg("case %s: opened", cases[i].name);
		if (diag.err != cases[i].err || !strstr(diag.msg, cases[i].msg))
			fail_msg("case %s: expected %s \"%s\", got %s \"%s\"",
				 cases[i].name, flow_err_name(cases[i].err),
				 cases[i].msg, flow_err_name(diag.err), diag.msg);
		/* One complete line that names the file. */
		assert_null(strchr(diag.msg, '\n'));
		assert_non_null(strstr(diag.msg, dir));
	}
}

static void test_ckpt_open_rejects_truncated_and_missing_manifests(void **state)
{
	(void)state;
	char dir[512], mp[600];
	good_copy(dir, sizeof(dir), "trunc");
	path_of(mp, sizeof(mp), dir, "manifest");
	size_t len;
	char *text = read_text(mp, &len);
	/* Cut in the middle of line 9. */
	char *at = text;
	for (int i = 0; i < 8; i++)
		at = strchr(at, '\n') + 1;
	assert_int_equal(testutil_write_file(mp, text, (size_t)(at - text) + 5), 0);
	expect_open_fails(dir, FLOW_ERR_FORMAT,
			  "manifest:9: missing newline at the end of the file (truncated?)");
	/* Cut right after line 14. */
	at = strstr(text, "\nend ") + 1;
	assert_int_equal(testutil_write_file(mp, text, (size_t)(at - text)), 0);
	expect_open_fails(dir, FLOW_ERR_FORMAT,
			  "manifest:15: unexpected end of file, expected 'end XXH3' (truncated?)");
	/* Empty. */
	assert_int_equal(testutil_write_file(mp, text, 0), 0);
	expect_open_fails(dir, FLOW_ERR_FORMAT,
			  "manifest:1: unexpected end of file, expected 'flow-checkpoint 1'");
	/* No manifest at all. */
	assert_int_equal(unlink(mp), 0);
	char expect[700];
	snprintf(expect, sizeof(expect),
		 "%s is not a committed checkpoint (no manifest)", dir);
	expect_open_fails(dir, FLOW_ERR_FORMAT, expect);
	/* No directory. */
	char gone[600];
	expect_open_fails(path_of(gone, sizeof(gone), dir, "nope"), FLOW_ERR_IO,
			  "cannot open checkpoint");
	free(text);
}

/* ---- damaged data files ------------------------------------------------------------ */

static void flip_byte(const char *path, size_t at)
{
	size_t len;
	char *data = read_text(path, &len);
	assert_true(at < len);
	data[at] ^= 0x10;
	assert_int_equal(testutil_write_file(path, data, len), 0);
	free(data);
}

static void test_ckpt_open_rejects_missing_and_short_shard_files(void **state)
{
	(void)state;
	char dir[512], p[600], expect[800];
	good_copy(dir, sizeof(dir), "nofile");
	assert_int_equal(unlink(path_of(p, sizeof(p), dir, "rank-00001.bin")), 0);
	snprintf(expect, sizeof(expect),
		 "manifest:9: shard file '%s' is missing", p);
	expect_open_fails(dir, FLOW_ERR_FORMAT, expect);

	good_copy(dir, sizeof(dir), "shortfile");
	path_of(p, sizeof(p), dir, "rank-00001.bin");
	assert_int_equal(truncate(p, 70), 0);
	snprintf(expect, sizeof(expect),
		 "manifest:12: shard file '%s' is shorter than offset+length: 70 bytes, the shard ends at byte 84",
		 p);
	expect_open_fails(dir, FLOW_ERR_FORMAT, expect);
}

/* A bounded read streams each shard through a buffer of a row or a few:
 * the elements of flow_ckpt_read, the checksum still checked as the
 * slabs go by, and a buffer smaller than one row refused naming the
 * tensor and shard. */
static void test_ckpt_read_bounded_streams_rows(void **state)
{
	(void)state;
	char dir[512], p[600];
	flow_diag_t diag = FLOW_DIAG_INIT;
	good_copy(dir, sizeof(dir), "bounded");
	flow_ckpt_t *c;
	assert_int_equal(flow_ckpt_open(dir, &c, &diag), FLOW_OK);
	/* Rows 3-8, across both shards. */
	flow_box_t mid = make_box(2, (int64_t[]){ 3, 1 }, (int64_t[]){ 9, 3 });
	float got[40], want[40];
	unsigned char scratch[40];
	for (size_t cap = 16; cap <= sizeof scratch; cap += 8) {
		memset(got, 0, sizeof got);
		assert_int_equal(flow_ckpt_read_bounded(c, 0, &mid, got, scratch,
							cap, &diag),
				 FLOW_OK);
		assert_int_equal(flow_ckpt_read(c, 0, &mid, want, &diag),
				 FLOW_OK);
		assert_memory_equal(got, want, 12 * sizeof(float));
	}
	/* Scalars and 1-d tensors: one row each. */
	int64_t count = 0;
	assert_int_equal(flow_ckpt_read_bounded(c, 2, NULL, &count, scratch, 8,
						&diag),
			 FLOW_OK);
	assert_true(count == good_count);
	assert_int_equal(flow_ckpt_read_bounded(c, 0, &mid, got, scratch, 15,
						&diag),
			 FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE,
		    "a row of tensor 'wte' shard 0:6,0:4 is 16 bytes, more than "
		    "the 15-byte read buffer");
	flow_ckpt_free(c);

	good_copy(dir, sizeof(dir), "bounded-flip");
	flip_byte(path_of(p, sizeof(p), dir, "rank-00001.bin"), 3);
	assert_int_equal(flow_ckpt_open(dir, &c, &diag), FLOW_OK);
	flow_diag_clear(&diag);
	assert_int_equal(flow_ckpt_read_bounded(c, 0, NULL, got, scratch, 16,
						&diag),
			 FLOW_ERR_CHECKSUM);
	char expect[800];
	snprintf(expect, sizeof(expect),
		 "%s: checksum mismatch in tensor 'wte' shard 6:10,0:4 at offset 0: stored ",
		 p);
	expect_diag(&diag, FLOW_ERR_CHECKSUM, expect);
	flow_ckpt_free(c);

	/* A shard verified by one bounded read is trusted by the next of the
	 * same reader, which reads only its rows: a byte flipped in between
	 * goes unseen there (the rows asked for hold it) and is found by a
	 * new reader. */
	good_copy(dir, sizeof(dir), "bounded-trust");
	assert_int_equal(flow_ckpt_open(dir, &c, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_read_bounded(c, 0, NULL, want, scratch, 16,
						&diag),
			 FLOW_OK);
	flip_byte(path_of(p, sizeof(p), dir, "rank-00001.bin"), 3);
	assert_int_equal(flow_ckpt_read_bounded(c, 0, &mid, got, scratch, 16,
						&diag),
			 FLOW_OK);
	flow_ckpt_free(c);
	assert_int_equal(flow_ckpt_open(dir, &c, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_read_bounded(c, 0, &mid, got, scratch, 16,
						&diag),
			 FLOW_ERR_CHECKSUM);
	flow_ckpt_free(c);
}

static void test_ckpt_read_finds_flipped_data_bytes(void **state)
{
	(void)state;
	char dir[512], p[600];
	flow_diag_t diag = FLOW_DIAG_INIT;
	good_copy(dir, sizeof(dir), "flip");
	flip_byte(path_of(p, sizeof(p), dir, "rank-00001.bin"), 3);
	flow_ckpt_t *c;
	/* Opening reads no data. */
	assert_int_equal(flow_ckpt_open(dir, &c, &diag), FLOW_OK);
	float buf[40];
	assert_int_equal(flow_ckpt_read(c, 0, NULL, buf, &diag), FLOW_ERR_CHECKSUM);
	char expect[800];
	snprintf(expect, sizeof(expect),
		 "%s: checksum mismatch in tensor 'wte' shard 6:10,0:4 at offset 0: stored ",
		 p);
	expect_diag(&diag, FLOW_ERR_CHECKSUM, expect);
	flow_diag_clear(&diag);
	/* A box that only rank 0's shard covers reads fine. */
	flow_box_t top = make_box(2, (int64_t[]){ 1, 1 }, (int64_t[]){ 6, 3 });
	assert_int_equal(flow_ckpt_read(c, 0, &top, buf, &diag), FLOW_OK);
	float want[40];
	flow_shape_t shape = { 2, { 10, 4 } };
	ref_extract((unsigned char *)good_wte, &shape, &top, 4,
		    (unsigned char *)want);
	assert_memory_equal(buf, want, 10 * sizeof(float));
	assert_int_equal(flow_ckpt_verify(c, &diag), FLOW_ERR_CHECKSUM);
	expect_diag(&diag, FLOW_ERR_CHECKSUM, expect);
	flow_ckpt_free(c);
}

static void test_ckpt_replica_first_wins_and_verify_checks_all(void **state)
{
	(void)state;
	char dir[512], p[600];
	flow_diag_t diag = FLOW_DIAG_INIT;
	good_copy(dir, sizeof(dir), "replica");
	/* Rank 1's copy of bias is at offset 64 of its file. */
	flip_byte(path_of(p, sizeof(p), dir, "rank-00001.bin"), 64 + 2);
	flow_ckpt_t *c;
	assert_int_equal(flow_ckpt_open(dir, &c, &diag), FLOW_OK);
	int32_t bias[5];
	int at = flow_ckpt_tensor_find(c, "bias");
	assert_int_equal(at, 1);
	assert_int_equal(flow_ckpt_read(c, (size_t)at, NULL, bias, &diag), FLOW_OK);
	assert_memory_equal(bias, good_bias, sizeof(bias));
	int64_t count = 0;
	assert_int_equal(flow_ckpt_read(c, 2, NULL, &count, &diag), FLOW_OK);
	assert_int_equal(count, good_count);
	assert_int_equal(flow_ckpt_verify(c, &diag), FLOW_ERR_CHECKSUM);
	expect_diag(&diag, FLOW_ERR_CHECKSUM, "tensor 'bias' shard 0:5 at offset 64");
	expect_diag(&diag, FLOW_ERR_CHECKSUM, "rank-00001.bin");
	flow_ckpt_free(c);
}

/* ---- damaged indexes at commit --------------------------------------------------------- */

static void i_rank(lines_t *l) { lines_set(l, 2, "rank 2"); }
static void i_magic(lines_t *l) { lines_set(l, 1, "flow-checkpoint 1"); }
static void i_mesh(lines_t *l) { lines_sub(l, 5, " 2 (B)", " 4 (B)"); }
static void i_gap(lines_t *l) { shard_gap(l, 4); }
static void i_overlap(lines_t *l) { shard_overlap(l, 4); }
static void i_other_rank(lines_t *l)
{
	lines_sub(l, 4, "shard wte 1 6:10,0:4 rank-00001.bin",
		  "shard wte 0 6:10,0:4 rank-00000.bin");
}
static void i_state(lines_t *l) { lines_insert(l, 3, "state a b"); }
/* A different but well-formed shard checksum: only the seal can tell. */
static void i_bad_sum(lines_t *l)
{
	char *s = l->line[3];
	char *last = s + strlen(s) - 1;
	*last = *last == '0' ? '1' : '0';
}
static void i_long(lines_t *l) { lines_sub(l, 6, " 64 20 ", " 256 20 "); }

static void test_ckpt_commit_rejects_bad_indexes(void **state)
{
	(void)state;
	static const struct {
		const char *name;
		edit_fn edit;
		bool reseal;
		flow_err_t err;
		const char *where;
		const char *msg;
	} cases[] = {
		{ "rank", i_rank, true, FLOW_ERR_FORMAT, "rank-00001.idx:2: ",
		  "index of rank 2, expected rank 1" },
		{ "magic", i_magic, true, FLOW_ERR_FORMAT, "rank-00001.idx:1: ",
		  "expected 'flow-checkpoint-index 1', got 'flow-checkpoint'" },
		{ "mesh", i_mesh, true, FLOW_ERR_USAGE, "rank-00001.idx:5: ",
		  "tensor 'bias' is 'i32 (5) 4 (B)' here but 'i32 (5) 2 (B)' in " },
		{ "gap", i_gap, true, FLOW_ERR_USAGE, "rank-00000.idx:3: ",
		  "the shards of tensor 'wte' cover 36 of its 40 elements" },
		{ "overlap", i_overlap, true, FLOW_ERR_USAGE, "rank-00001.idx:4: ",
		  "shard box 5:10,0:4 of tensor 'wte' overlaps box 0:6,0:4 (" },
		{ "other-rank", i_other_rank, true, FLOW_ERR_FORMAT,
		  "rank-00001.idx:4: ", "shard of rank 0 in the index of rank 1" },
		{ "state", i_state, true, FLOW_ERR_FORMAT, "rank-00001.idx:3: ",
		  "unknown record 'state' (expected tensor, shard or end)" },
		{ "sum", i_bad_sum, false, FLOW_ERR_CHECKSUM, "rank-00001.idx:7: ",
		  "checksum mismatch" },
		{ "long", i_long, true, FLOW_ERR_FORMAT, "rank-00001.idx:6: ",
		  "shorter than offset+length: 84 bytes, the shard ends at byte 276" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char dir[512], name[64], ip[600], mp[600];
		snprintf(name, sizeof(name), "badidx-%s", cases[i].name);
		good_copy(dir, sizeof(dir), name);
		assert_int_equal(unlink(path_of(mp, sizeof(mp), dir, "manifest")), 0);
		lines_t l;
		lines_load(&l, path_of(ip, sizeof(ip), dir, "rank-00001.idx"));
		assert_int_equal(l.n, 7);
		cases[i].edit(&l);
		lines_store(&l, ip, cases[i].reseal);
		flow_diag_t diag = FLOW_DIAG_INIT;
		if (flow_ckpt_commit(dir, 10, 2, NULL, 0, &diag) == FLOW_OK)
			fail_msg("case %s: committed", cases[i].name);
		char expect[800];
		snprintf(expect, sizeof(expect), "%s/%s", dir, cases[i].where);
		if (diag.err != cases[i].err || strstr(diag.msg, expect) != diag.msg ||
		    !strstr(diag.msg, cases[i].msg))
			fail_msg("case %s: expected %s \"%s\", got %s \"%s\"",
				 cases[i].name, flow_err_name(cases[i].err), expect,
				 flow_err_name(diag.err), diag.msg);
		/* Nothing committed. */
		assert_false(exists(mp));
	}
}

/* ---- the commit protocol ----------------------------------------------------------------- */

/* A manifest that cannot be written (here its temporary's name is taken
 * by a directory; in life, a full disk) leaves no checkpoint, so the
 * ranks' files go too rather than hold the space. */
static void test_ckpt_failed_commit_removes_the_ranks_files(void **state)
{
	(void)state;
	char dir[512], p[600], tmp[700];
	flow_diag_t diag = FLOW_DIAG_INIT;
	good_copy(dir, sizeof(dir), "nocommit");
	assert_int_equal(unlink(path_of(p, sizeof(p), dir, "manifest")), 0);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", p, (long)getpid());
	assert_int_equal(mkdir(tmp, 0755), 0);
	assert_int_equal(flow_ckpt_commit(dir, 10, 2, NULL, 0, &diag),
			 FLOW_ERR_IO);
	assert_non_null(strstr(diag.msg, "/manifest"));
	assert_false(exists(p));
	for (int r = 0; r < 2; r++) {
		char name[32];
		snprintf(name, sizeof(name), "rank-%05d.bin", r);
		assert_false(exists(path_of(p, sizeof(p), dir, name)));
		snprintf(name, sizeof(name), "rank-%05d.idx", r);
		assert_false(exists(path_of(p, sizeof(p), dir, name)));
	}
	assert_int_equal(rmdir(tmp), 0);
}

static void test_ckpt_rewrite_removes_the_manifest_first(void **state)
{
	(void)state;
	char dir[512], mp[600], p[600];
	flow_diag_t diag = FLOW_DIAG_INIT;
	good_copy(dir, sizeof(dir), "rewrite");
	path_of(mp, sizeof(mp), dir, "manifest");
	assert_true(exists(mp));
	flow_ckpt_writer_t *w;
	assert_int_equal(flow_ckpt_writer_new(dir, 1, &w, &diag), FLOW_OK);
	/* Uncommitted at once, and this rank's old index is gone. */
	assert_false(exists(mp));
	assert_false(exists(path_of(p, sizeof(p), dir, "rank-00001.idx")));
	assert_true(exists(path_of(p, sizeof(p), dir, "rank-00000.idx")));
	char expect[700];
	snprintf(expect, sizeof(expect),
		 "%s is not a committed checkpoint (no manifest)", dir);
	expect_open_fails(dir, FLOW_ERR_FORMAT, expect);
	/* Commit cannot go ahead without rank 1. */
	assert_int_equal(flow_ckpt_commit(dir, 11, 2, NULL, 0, &diag), FLOW_ERR_IO);
	flow_diag_clear(&diag);

	/* Rank 1 writes new values; the new commit serves them. */
	flow_ckpt_tensor_desc_t wte, bias, count;
	good_descs(&wte, &bias, &count);
	float nw[16];
	for (int i = 0; i < 16; i++)
		nw[i] = 1000.0f + (float)i;
	flow_box_t bottom = make_box(2, (int64_t[]){ 6, 0 },
					  (int64_t[]){ 10, 4 });
	assert_int_equal(flow_ckpt_writer_add(w, &wte, &bottom, nw, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_finish(w, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_commit(dir, 11, 2, NULL, 0, &diag), FLOW_OK);
	flow_ckpt_t *c;
	assert_int_equal(flow_ckpt_open(dir, &c, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_step(c), 11);
	float back[40];
	assert_int_equal(flow_ckpt_read(c, 0, NULL, back, &diag), FLOW_OK);
	assert_memory_equal(back, good_wte, 24 * sizeof(float));
	assert_memory_equal(back + 24, nw, sizeof(nw));
	flow_ckpt_free(c);
}

static void test_ckpt_abort_leaves_nothing_under_final_names(void **state)
{
	(void)state;
	char dir[512];
	flow_diag_t diag = FLOW_DIAG_INIT;
	path_of(dir, sizeof(dir), root, "abort");
	float data[4] = { 1, 2, 3, 4 };
	flow_ckpt_tensor_desc_t d;
	make_desc(&d, "w", FLOW_DTYPE_F32, 1, (int64_t[]){ 4 }, "2", "(S(0))");
	flow_box_t half0 = make_box(1, (int64_t[]){ 0 }, (int64_t[]){ 2 });
	flow_box_t half1 = make_box(1, (int64_t[]){ 2 }, (int64_t[]){ 4 });
	flow_ckpt_writer_t *w0, *w1;
	assert_int_equal(flow_ckpt_writer_new(dir, 0, &w0, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_new(dir, 1, &w1, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_add(w0, &d, &half0, data, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_add(w1, &d, &half1, data + 2, &diag),
			 FLOW_OK);
	/* Only temporaries exist while writing. */
	assert_int_equal(testutil_count_entries(dir), 2);
	flow_ckpt_writer_abort(w1);
	assert_int_equal(testutil_count_entries(dir), 1);
	flow_ckpt_writer_abort(w0);
	/* w0 created the step directory, and it is empty: it goes too. */
	assert_false(exists(dir));
	flow_ckpt_writer_abort(NULL);

	/* A finished rank 0 and an aborted rank 1: no rank-1 names, and the
	 * commit refuses. */
	assert_int_equal(flow_ckpt_writer_new(dir, 0, &w0, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_new(dir, 1, &w1, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_add(w0, &d, &half0, data, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_finish(w0, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_add(w1, &d, &half1, data + 2, &diag),
			 FLOW_OK);
	flow_ckpt_writer_abort(w1);
	assert_int_equal(testutil_count_entries(dir), 2);
	char p[600];
	assert_true(exists(path_of(p, sizeof(p), dir, "rank-00000.bin")));
	assert_true(exists(path_of(p, sizeof(p), dir, "rank-00000.idx")));
	assert_int_not_equal(flow_ckpt_commit(dir, 1, 2, NULL, 0, &diag), FLOW_OK);
	flow_diag_clear(&diag);
	/* Rank 0 alone does not tile w. */
	assert_int_equal(flow_ckpt_commit(dir, 1, 1, NULL, 0, &diag), FLOW_ERR_USAGE);
	expect_diag(&diag, FLOW_ERR_USAGE,
		    "rank-00000.idx:3: the shards of tensor 'w' cover 2 of its 4 elements");
	assert_false(exists(path_of(p, sizeof(p), dir, "manifest")));
}

/* ---- latest ------------------------------------------------------------------------------ */

static void commit_tiny(const char *dir, uint64_t step)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_ckpt_writer_t *w;
	assert_int_equal(flow_ckpt_writer_new(dir, 0, &w, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_finish(w, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_commit(dir, step, 1, NULL, 0, &diag), FLOW_OK);
}

static void test_ckpt_latest_picks_the_highest_committed_step(void **state)
{
	(void)state;
	char ck[512], p[600];
	flow_diag_t diag = FLOW_DIAG_INIT;
	path_of(ck, sizeof(ck), root, "latest");
	assert_int_equal(mkdir(ck, 0755), 0);
	char *got = NULL;
	assert_int_equal(flow_ckpt_latest(ck, &got, &diag), FLOW_ERR_USAGE);
	char expect[600];
	snprintf(expect, sizeof(expect), "%s: no committed checkpoint", ck);
	expect_diag(&diag, FLOW_ERR_USAGE, expect);
	assert_null(got);
	flow_diag_clear(&diag);

	char *s10 = flow_ckpt_step_path(ck, 10), *s20 = flow_ckpt_step_path(ck, 20),
	     *s30 = flow_ckpt_step_path(ck, 30), *s9 = flow_ckpt_step_path(ck, 9);
	commit_tiny(s10, 10);
	commit_tiny(s9, 9);
	commit_tiny(s20, 20);
	/* Step 30 is written but not committed. */
	flow_ckpt_writer_t *w;
	assert_int_equal(flow_ckpt_writer_new(s30, 0, &w, &diag), FLOW_OK);
	assert_int_equal(flow_ckpt_writer_finish(w, &diag), FLOW_OK);
	/* Names that are not step directories, with manifests. */
	static const char *const decoys[] = { "step-9999999", "step-0000004x",
					      "steps-00000050", "step-00000060.tmp.1" };
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(mkdir(path_of(p, sizeof(p), ck, decoys[i]), 0755), 0);
		char mp[700];
		snprintf(mp, sizeof(mp), "%s/manifest", p);
		write_text(mp, "flow-checkpoint 1\n");
	}
	/* A file where a step directory would be. */
	write_text(path_of(p, sizeof(p), ck, "step-00000040"), "x");

	assert_int_equal(flow_ckpt_latest(ck, &got, &diag), FLOW_OK);
	assert_string_equal(got, s20);
	free(got);

	/* Nine digits count: step 100 wins once committed. */
	char nine[600];
	path_of(nine, sizeof(nine), ck, "step-000000100");
	commit_tiny(nine, 100);
	assert_int_equal(flow_ckpt_latest(ck, &got, &diag), FLOW_OK);
	assert_string_equal(got, nine);
	free(got);

	assert_int_equal(flow_ckpt_latest(s9 /* holds no steps */, &got, &diag),
			 FLOW_ERR_USAGE);
	flow_diag_clear(&diag);
	assert_int_equal(flow_ckpt_latest(path_of(p, sizeof(p), ck, "nope"), &got,
					  &diag), FLOW_ERR_IO);
	expect_diag(&diag, FLOW_ERR_IO, "cannot open directory");
	free(s9);
	free(s10);
	free(s20);
	free(s30);
}

int main(void)
{
#define T(f) cmocka_unit_test(f)
	const struct CMUnitTest tests[] = {
		T(test_ckpt_writes_the_documented_text),
		T(test_ckpt_step_path_and_whole_box),
		T(test_ckpt_round_trip_single_rank_every_dtype),
		T(test_ckpt_multi_rank_write_commit_read_any_box),
		T(test_ckpt_property_any_box_of_random_tilings),
		T(test_ckpt_property_commit_rejects_broken_tilings),
		T(test_ckpt_writer_rejects_bad_descs_and_boxes),
		T(test_ckpt_open_rejects_damaged_manifests),
		T(test_ckpt_open_rejects_truncated_and_missing_manifests),
		T(test_ckpt_open_rejects_missing_and_short_shard_files),
		T(test_ckpt_read_bounded_streams_rows),
		T(test_ckpt_read_finds_flipped_data_bytes),
		T(test_ckpt_replica_first_wins_and_verify_checks_all),
		T(test_ckpt_commit_rejects_bad_indexes),
		T(test_ckpt_failed_commit_removes_the_ranks_files),
		T(test_ckpt_rewrite_removes_the_manifest_first),
		T(test_ckpt_abort_leaves_nothing_under_final_names),
		T(test_ckpt_latest_picks_the_highest_committed_step),
	};
#undef T
	return cmocka_run_group_tests(tests, setup, teardown);
}
