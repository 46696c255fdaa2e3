/* The loader: its order is a bijection per epoch that depends only on
 * (data, seed, epoch); every world size reads the same stream; a run
 * resumed with another world size continues it; the tokens are the
 * corpus's bytes; prefetching changes nothing but timing.
 *
 * The datasets are built once per run (group setup) with
 * flow_dataset_build from pseudo-random text, so token = byte and every
 * sample can be checked against the text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <flow/checksum.h>
#include <flow/loader.h>
#include <flow/shard.h>

#include "data/loader_internal.h"
#include "testutil.h"

/* The corpus: TEXT_LEN pseudo-random bytes; VAL_TOKENS go to the val
 * split, the rest to train in shards of SHARD_TOKENS. */
enum { TEXT_LEN = 20000, VAL_TOKENS = 1000, SHARD_TOKENS = 3000 };

static char tmpdir[256];
static unsigned char text[TEXT_LEN];
static unsigned char other_text[TEXT_LEN];
static char plain_dir[512];  /* uncompressed */
static char zstd_dir[512];   /* zstd level 3, 256-token frames */
static char other_dir[512];  /* same shape as plain, other bytes */

static void fill_text(unsigned char *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed;
	for (size_t i = 0; i < len; i++) {
		x = x * 6364136223846793005u + 1442695040888963407u;
		buf[i] = (unsigned char)(x >> 56);
	}
}

/* Write buf to tmpdir/name.txt and build tmpdir/name from it. */
static int build(const char *name, const unsigned char *buf, size_t len,
		 uint64_t shard_tokens, uint64_t val_tokens, int zstd_level,
		 uint32_t frame_tokens, char *dir_out, size_t dir_cap)
{
	char input[512];
	snprintf(input, sizeof(input), "%s/%s.txt", tmpdir, name);
	snprintf(dir_out, dir_cap, "%s/%s", tmpdir, name);
	if (testutil_write_file(input, buf, len) != 0)
		return -1;
	flow_dataset_options_t o;
	memset(&o, 0, sizeof(o));
	o.input.format = FLOW_INPUT_TEXT;
	o.shard_tokens = shard_tokens;
	o.val_tokens = val_tokens;
	o.zstd_level = zstd_level;
	o.frame_tokens = frame_tokens;
	const char *inputs[] = { input };
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	if (flow_dataset_build(dir_out, inputs, 1, &o, &m, &diag) != FLOW_OK) {
		print_error("building %s: %s\n", dir_out,
			    flow_diag_message(&diag));
		return -1;
	}
	flow_manifest_release(&m);
	return 0;
}

static int group_setup(void **state)
{
	(void)state;
	if (testutil_mkdtemp(tmpdir, sizeof(tmpdir), "loader") != 0)
		return -1;
	fill_text(text, TEXT_LEN, 1);
	fill_text(other_text, TEXT_LEN, 2);
	if (build("plain", text, TEXT_LEN, SHARD_TOKENS, VAL_TOKENS, 0, 0,
		  plain_dir, sizeof(plain_dir)) != 0 ||
	    build("zstd", text, TEXT_LEN, SHARD_TOKENS, VAL_TOKENS, 3, 256,
		  zstd_dir, sizeof(zstd_dir)) != 0 ||
	    build("other", other_text, TEXT_LEN, SHARD_TOKENS, VAL_TOKENS, 0,
		  0, other_dir, sizeof(other_dir)) != 0)
		return -1;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	return testutil_rmtree(tmpdir);
}

static flow_loader_options_t options(const char *dir, uint32_t seq_len,
				     uint64_t global_batch, uint32_t rank,
				     uint32_t world, bool prefetch)
{
	flow_loader_options_t o;
	memset(&o, 0, sizeof(o));
	o.dir = dir;
	o.split = FLOW_SPLIT_TRAIN;
	o.seq_len = seq_len;
	o.global_batch = global_batch;
	o.seed = 42;
	o.dp_rank = rank;
	o.dp_size = world;
	o.prefetch = prefetch;
	return o;
}

static flow_loader_t *open_ok(const flow_loader_options_t *o)
{
	flow_loader_t *loader = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_loader_open(o, &loader, &diag);
	if (err != FLOW_OK)
		print_error("%s\n", flow_diag_message(&diag));
	assert_int_equal(err, FLOW_OK);
	assert_non_null(loader);
	return loader;
}

/* Read steps batches of one loader into in/tg (steps x local x T each). */
static void read_steps(flow_loader_t *loader, uint64_t steps, int32_t *in,
		       int32_t *tg, size_t per_step)
{
	for (uint64_t s = 0; s < steps; s++) {
		flow_diag_t diag = FLOW_DIAG_INIT;
		int rc = flow_loader_next(loader, in + s * per_step,
					  tg + s * per_step, &diag);
		if (rc != 1)
			print_error("%s\n", flow_diag_message(&diag));
		assert_int_equal(rc, 1);
	}
}

/* ---- the permutation ---------------------------------------------------- */

static void check_bijection(uint64_t n, uint64_t checksum, uint64_t seed,
			    uint64_t epoch)
{
	flow_loader_perm_t perm;
	flow_loader_perm_init(&perm, n, checksum, seed, epoch);
	unsigned char *seen = calloc(n, 1);
	assert_non_null(seen);
	uint64_t fixed = 0;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t v = flow_loader_perm_apply(&perm, i);
		assert_true(v < n);
		assert_int_equal(seen[v], 0);
		seen[v] = 1;
		fixed += v == i;
	}
	free(seen);
	/* A shuffle, not the identity: the fixed points of a random
	 * permutation are about Poisson(1), so 10 or more has odds near
	 * 1e-7 per permutation. */
	if (n >= 16)
		assert_true(fixed < 10);
}

static void test_loader_permutation_is_a_bijection(void **state)
{
	(void)state;
	static const uint64_t sizes[] = { 100, 255, 256, 257, 1000, 1023, 1024,
					  1025, 4097, 65535, 65536, 65537,
					  100003 };
	static const uint64_t seeds[] = { 0, 1, 42, UINT64_MAX };
	for (uint64_t n = 1; n <= 70; n++)
		for (size_t s = 0; s < 4; s++)
			for (uint64_t e = 0; e < 3; e++)
				check_bijection(n, 0x0123456789abcdefu,
						seeds[s], e);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (size_t s = 0; s < 2; s++)
			check_bijection(sizes[i], 0xfedcba9876543210u,
					seeds[s], 7);
}

/* Domains too big to enumerate: outputs stay in range and a sample of
 * them is injective. */
static void test_loader_permutation_handles_huge_domains(void **state)
{
	(void)state;
	static const uint64_t sizes[] = { (UINT64_C(1) << 32) + 1,
					  (UINT64_C(1) << 40) + 3,
					  (UINT64_C(1) << 63) + 1, UINT64_MAX };
	enum { K = 2000 };
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		flow_loader_perm_t perm;
		flow_loader_perm_init(&perm, sizes[i], 5, 6, 7);
		static uint64_t out[K];
		for (uint64_t k = 0; k < K; k++) {
			/* Low and high indices both. */
			uint64_t x = k % 2 ? sizes[i] - 1 - k : k * 977;
			out[k] = flow_loader_perm_apply(&perm, x);
			assert_true(out[k] < sizes[i]);
			for (uint64_t j = 0; j < k; j++)
				assert_true(out[j] != out[k]);
		}
	}
}

/* (checksum, seed, epoch) each change the permutation. */
static void test_loader_permutation_depends_on_every_key(void **state)
{
	(void)state;
	enum { N = 1000 };
	flow_loader_perm_t a, b;
	const uint64_t keys[][3] = { { 1, 2, 3 }, { 9, 2, 3 }, { 1, 9, 3 },
				     { 1, 2, 9 }, { 1ull << 32, 2, 3 },
				     { 1, 1ull << 32, 3 },
				     { 1, 2, 1ull << 32 | 3 } };
	flow_loader_perm_init(&a, N, keys[0][0], keys[0][1], keys[0][2]);
	for (size_t k = 1; k < sizeof(keys) / sizeof(keys[0]); k++) {
		flow_loader_perm_init(&b, N, keys[k][0], keys[k][1],
				      keys[k][2]);
		uint64_t same = 0;
		for (uint64_t i = 0; i < N; i++)
			same += flow_loader_perm_apply(&a, i) ==
				flow_loader_perm_apply(&b, i);
		assert_true(same < N / 10);
	}
}

/* ---- the order over real datasets --------------------------------------- */

/* One shard of n + 1 bytes holds n samples of 1 + 1 tokens: each epoch
 * (through flow_loader_sample_at, in global batches of 3) covers every
 * sample once, and consecutive epochs are ordered differently. */
static void test_loader_epochs_cover_every_sample_once(void **state)
{
	(void)state;
	static const uint64_t sizes[] = { 1, 2, 3, 7, 1000, 4097 };
	static unsigned char buf[4098];
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint64_t n = sizes[i];
		char name[32], dir[512];
		snprintf(name, sizeof(name), "n%" PRIu64, n);
		fill_text(buf, n + 1, 100 + n);
		assert_int_equal(build(name, buf, n + 1, n + 1, 0, 0, 0, dir,
				       sizeof(dir)),
				 0);
		flow_loader_options_t o = options(dir, 1, 3, 0, 1, false);
		flow_loader_t *loader = open_ok(&o);
		assert_int_equal(flow_loader_samples_per_epoch(loader), n);
		unsigned char *seen = calloc(n, 1);
		uint64_t *first = calloc(n, sizeof(uint64_t));
		assert_non_null(seen);
		assert_non_null(first);
		uint64_t differ = 0;
		for (uint64_t e = 0; e < 3; e++) {
			memset(seen, 0, n);
			for (uint64_t k = 0; k < n; k++) {
				uint64_t pos = e * n + k;
				flow_sample_ref_t ref;
				flow_loader_sample_at(loader, pos / 3, pos % 3,
						      &ref);
				assert_int_equal(ref.position, pos);
				assert_int_equal(ref.epoch, e);
				assert_true(ref.sample < n);
				assert_int_equal(seen[ref.sample], 0);
				seen[ref.sample] = 1;
				assert_int_equal(ref.shard, 0);
				assert_int_equal(ref.offset, ref.sample);
				if (e == 0)
					first[k] = ref.sample;
				else
					differ += first[k] != ref.sample;
			}
		}
		if (n >= 7)
			assert_true(differ > 0);
		free(first);
		free(seen);
		flow_loader_free(loader);
	}
}

/* Samples are numbered shard by shard: each shard of the plain dataset
 * holds (tokens - 1) / T windows starting at multiples of T. */
static void test_loader_samples_are_windows_of_each_shard(void **state)
{
	(void)state;
	enum { T = 64 };
	flow_loader_options_t o = options(plain_dir, T, 1, 0, 1, false);
	flow_loader_t *loader = open_ok(&o);
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_manifest_read(plain_dir, &m, &diag), FLOW_OK);
	uint64_t n = 0;
	for (size_t i = 0; i < m.nshards; i++)
		if (m.shards[i].split == FLOW_SPLIT_TRAIN)
			n += (m.shards[i].info.tokens - 1) / T;
	assert_int_equal(flow_loader_samples_per_epoch(loader), n);
	assert_int_equal(n, 6 * ((SHARD_TOKENS - 1) / T) +
				    (TEXT_LEN - VAL_TOKENS - 6 * SHARD_TOKENS -
				     1) / T);
	for (uint64_t p = 0; p < n; p++) {
		flow_sample_ref_t ref;
		flow_loader_sample_at(loader, p, 0, &ref);
		assert_true(ref.shard < m.nshards);
		assert_int_equal(m.shards[ref.shard].split, FLOW_SPLIT_TRAIN);
		assert_int_equal(ref.offset % T, 0);
		assert_true(ref.offset + T + 1 <=
			    m.shards[ref.shard].info.tokens);
	}
	flow_manifest_release(&m);
	flow_loader_free(loader);
}

/* The same seed and data give the same order on two opens; another seed
 * or other data (another manifest checksum) give another. */
static void test_loader_order_depends_on_seed_and_data(void **state)
{
	(void)state;
	enum { T = 16, STEPS = 100 };
	flow_loader_options_t o = options(plain_dir, T, 1, 0, 1, false);
	flow_loader_t *a = open_ok(&o), *b = open_ok(&o);
	o.seed = 43;
	flow_loader_t *c = open_ok(&o);
	o.seed = 42;
	o.dir = other_dir;
	flow_loader_t *d = open_ok(&o);
	assert_int_equal(flow_loader_samples_per_epoch(a),
			 flow_loader_samples_per_epoch(d));
	uint64_t same_seed = 0, same_data = 0;
	for (uint64_t s = 0; s < STEPS; s++) {
		flow_sample_ref_t ra, rb, rc, rd;
		flow_loader_sample_at(a, s, 0, &ra);
		flow_loader_sample_at(b, s, 0, &rb);
		flow_loader_sample_at(c, s, 0, &rc);
		flow_loader_sample_at(d, s, 0, &rd);
		assert_int_equal(ra.sample, rb.sample);
		assert_int_equal(ra.shard, rb.shard);
		assert_int_equal(ra.offset, rb.offset);
		same_seed += ra.sample == rc.sample;
		same_data += ra.sample == rd.sample;
	}
	assert_true(same_seed < STEPS / 10);
	assert_true(same_data < STEPS / 10);
	flow_loader_free(a);
	flow_loader_free(b);
	flow_loader_free(c);
	flow_loader_free(d);
}

/* Where a shard's tokens start in the corpus: val takes the first
 * VAL_TOKENS, train the rest, each split's shards in manifest order. */
static uint64_t text_offset(const flow_manifest_t *m, size_t shard)
{
	uint64_t off = m->shards[shard].split == FLOW_SPLIT_VAL ?
			       0 : m->split_tokens[FLOW_SPLIT_VAL];
	for (size_t i = 0; i < shard; i++)
		if (m->shards[i].split == m->shards[shard].split)
			off += m->shards[i].info.tokens;
	return off;
}

/* inputs are the corpus bytes at the sample's offset, targets the same
 * shifted by one, for both splits, compressed or not. */
static void check_tokens(const char *dir, flow_split_t split, uint32_t rank,
			 uint32_t world, bool prefetch)
{
	enum { T = 50, G = 8, STEPS = 20 };
	flow_loader_options_t o = options(dir, T, G, rank, world, prefetch);
	o.split = split;
	flow_loader_t *loader = open_ok(&o);
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_manifest_read(dir, &m, &diag), FLOW_OK);
	uint64_t local = flow_loader_local_batch(loader);
	assert_int_equal(local, G / world);
	int32_t *in = malloc(local * T * sizeof(int32_t));
	int32_t *tg = malloc(local * T * sizeof(int32_t));
	assert_non_null(in);
	assert_non_null(tg);
	for (uint64_t s = 0; s < STEPS; s++) {
		assert_int_equal(flow_loader_next(loader, in, tg, &diag), 1);
		for (uint64_t row = 0; row < local; row++) {
			flow_sample_ref_t ref;
			flow_loader_sample_at(loader, s, rank * local + row,
					      &ref);
			assert_int_equal(m.shards[ref.shard].split, split);
			uint64_t at = text_offset(&m, ref.shard) + ref.offset;
			assert_true(at + T + 1 <= TEXT_LEN);
			for (size_t j = 0; j < T; j++) {
				assert_int_equal(in[row * T + j], text[at + j]);
				assert_int_equal(tg[row * T + j],
						 text[at + j + 1]);
			}
		}
	}
	free(in);
	free(tg);
	flow_manifest_release(&m);
	flow_loader_free(loader);
}

static void test_loader_tokens_are_the_text_at_each_sample(void **state)
{
	(void)state;
	check_tokens(plain_dir, FLOW_SPLIT_TRAIN, 0, 1, false);
	check_tokens(plain_dir, FLOW_SPLIT_TRAIN, 3, 4, true);
	check_tokens(zstd_dir, FLOW_SPLIT_TRAIN, 1, 2, false);
	check_tokens(zstd_dir, FLOW_SPLIT_TRAIN, 0, 8, true);
	check_tokens(plain_dir, FLOW_SPLIT_VAL, 0, 1, false);
	check_tokens(zstd_dir, FLOW_SPLIT_VAL, 1, 2, true);
}

/* The world-1 stream of steps x per tokens (inputs and targets) and room
 * for one rank's slices of it. */
typedef struct streams {
	int32_t *ref_in, *ref_tg, *in, *tg;
} streams_t;

static streams_t streams_alloc(size_t steps, size_t per)
{
	streams_t b = {
		malloc(steps * per * sizeof(int32_t)),
		malloc(steps * per * sizeof(int32_t)),
		malloc(steps * per * sizeof(int32_t)),
		malloc(steps * per * sizeof(int32_t)),
	};
	assert_non_null(b.ref_in);
	assert_non_null(b.ref_tg);
	assert_non_null(b.in);
	assert_non_null(b.tg);
	return b;
}

static void streams_free(streams_t *b)
{
	free(b->ref_in);
	free(b->ref_tg);
	free(b->in);
	free(b->tg);
}

/* Rank's slices of steps [first, first + steps), local tokens each, read
 * into b->in/b->tg from their start, are the world-1 stream's (per tokens
 * a step) token for token. */
static void expect_rank_slices(const streams_t *b, size_t first,
			       size_t steps, size_t per, uint32_t rank,
			       size_t local)
{
	for (size_t s = 0; s < steps; s++) {
		size_t at = (first + s) * per + rank * local;
		assert_memory_equal(b->in + s * local, b->ref_in + at,
				    local * sizeof(int32_t));
		assert_memory_equal(b->tg + s * local, b->ref_tg + at,
				    local * sizeof(int32_t));
	}
}

/* World sizes 1, 2, 4 and 8 (and prefetch on or off, compressed or not):
 * the ranks' slices of each global batch, concatenated in rank order, are
 * the world-1 batch token for token, over steps that cross epochs. */
static void test_loader_world_sizes_read_the_same_stream(void **state)
{
	(void)state;
	enum { T = 64, G = 8, STEPS = 50, PER = G * T };
	const char *dirs[] = { plain_dir, zstd_dir };
	for (size_t d = 0; d < 2; d++) {
		streams_t b = streams_alloc(STEPS, PER);
		flow_loader_options_t o = options(dirs[d], T, G, 0, 1, false);
		flow_loader_t *loader = open_ok(&o);
		/* The stream really crosses an epoch boundary. */
		assert_true(flow_loader_samples_per_epoch(loader) <
			    (uint64_t)STEPS * G);
		read_steps(loader, STEPS, b.ref_in, b.ref_tg, PER);
		flow_loader_free(loader);
		for (uint32_t w = 2; w <= 8; w *= 2) {
			const size_t local = PER / w;
			for (uint32_t r = 0; r < w; r++) {
				o = options(dirs[d], T, G, r, w, r % 2 == 1);
				loader = open_ok(&o);
				read_steps(loader, STEPS, b.in, b.tg, local);
				expect_rank_slices(&b, 0, STEPS, PER, r, local);
				flow_loader_free(loader);
			}
		}
		streams_free(&b);
	}
}

/* Save the state after K steps on 2 ranks, resume on 4 ranks: the rest
 * is the uninterrupted world-1 stream. */
static void test_loader_resume_with_another_world_size(void **state)
{
	(void)state;
	enum { T = 64, G = 8, K = 17, STEPS = 50, PER = G * T };
	streams_t b = streams_alloc(STEPS, PER);
	flow_loader_options_t o = options(zstd_dir, T, G, 0, 1, false);
	flow_loader_t *loader = open_ok(&o);
	const uint64_t n = flow_loader_samples_per_epoch(loader);
	read_steps(loader, STEPS, b.ref_in, b.ref_tg, PER);
	flow_loader_free(loader);

	/* Both ranks of the first run stop after K steps at the same
	 * state (rank 1 with a batch prefetched that must not count). */
	flow_loader_state_t saved[2];
	for (uint32_t r = 0; r < 2; r++) {
		o = options(zstd_dir, T, G, r, 2, r == 1);
		loader = open_ok(&o);
		read_steps(loader, K, b.in, b.tg, PER / 2);
		saved[r] = flow_loader_get_state(loader);
		flow_loader_free(loader);
	}
	assert_int_equal(saved[0].epoch, saved[1].epoch);
	assert_int_equal(saved[0].index, saved[1].index);
	assert_int_equal(saved[0].epoch, (uint64_t)K * G / n);
	assert_int_equal(saved[0].index, (uint64_t)K * G % n);

	for (uint32_t r = 0; r < 4; r++) {
		const size_t local = PER / 4;
		o = options(zstd_dir, T, G, r, 4, r >= 2);
		loader = open_ok(&o);
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(flow_loader_seek(loader, &saved[0], &diag),
				 FLOW_OK);
		read_steps(loader, STEPS - K, b.in, b.tg, local);
		expect_rank_slices(&b, K, STEPS - K, PER, r, local);
		flow_loader_state_t end = flow_loader_get_state(loader);
		assert_int_equal(end.epoch, (uint64_t)STEPS * G / n);
		assert_int_equal(end.index, (uint64_t)STEPS * G % n);
		flow_loader_free(loader);
	}
	streams_free(&b);
}

/* Prefetching gives the batches of a synchronous loader, also around a
 * seek back and forth (which drops the prefetched batch). */
static void test_loader_prefetch_gives_identical_batches(void **state)
{
	(void)state;
	enum { T = 100, G = 6, W = 3, STEPS = 30, PER = G / W * T };
	const char *dirs[] = { plain_dir, zstd_dir };
	for (size_t d = 0; d < 2; d++) {
		flow_loader_options_t o = options(dirs[d], T, G, 1, W, false);
		flow_loader_t *sync = open_ok(&o);
		o.prefetch = true;
		flow_loader_t *pre = open_ok(&o);
		int32_t a_in[PER], a_tg[PER], b_in[PER], b_tg[PER];
		flow_diag_t diag = FLOW_DIAG_INIT;
		for (int s = 0; s < STEPS; s++) {
			if (s == 10 || s == 20) {
				/* Back to step 3, then on to step 25. */
				uint64_t step = s == 10 ? 3 : 25;
				uint64_t n = flow_loader_samples_per_epoch(sync);
				flow_loader_state_t st = { step * G / n,
							   step * G % n };
				assert_int_equal(flow_loader_seek(sync, &st,
								  &diag),
						 FLOW_OK);
				assert_int_equal(flow_loader_seek(pre, &st,
								  &diag),
						 FLOW_OK);
				flow_loader_state_t got =
					flow_loader_get_state(pre);
				assert_int_equal(got.epoch, st.epoch);
				assert_int_equal(got.index, st.index);
			}
			assert_int_equal(flow_loader_next(sync, a_in, a_tg,
							  &diag),
					 1);
			assert_int_equal(flow_loader_next(pre, b_in, b_tg,
							  &diag),
					 1);
			assert_memory_equal(a_in, b_in, sizeof(a_in));
			assert_memory_equal(a_tg, b_tg, sizeof(a_tg));
			flow_loader_state_t sa = flow_loader_get_state(sync);
			flow_loader_state_t sb = flow_loader_get_state(pre);
			assert_int_equal(sa.epoch, sb.epoch);
			assert_int_equal(sa.index, sb.index);
		}
		flow_loader_free(sync);
		flow_loader_free(pre);
	}
}

/* The state is the first position not yet returned. */
static void test_loader_state_counts_returned_batches(void **state)
{
	(void)state;
	enum { T = 64, G = 4 };
	flow_loader_options_t o = options(plain_dir, T, G, 0, 2, true);
	flow_loader_t *loader = open_ok(&o);
	const uint64_t n = flow_loader_samples_per_epoch(loader);
	flow_loader_state_t st = flow_loader_get_state(loader);
	assert_int_equal(st.epoch, 0);
	assert_int_equal(st.index, 0);
	int32_t in[2 * T], tg[2 * T];
	flow_diag_t diag = FLOW_DIAG_INIT;
	for (uint64_t s = 1; s <= 200; s++) {
		assert_int_equal(flow_loader_next(loader, in, tg, &diag), 1);
		st = flow_loader_get_state(loader);
		assert_int_equal(st.epoch, s * G / n);
		assert_int_equal(st.index, s * G % n);
	}
	flow_loader_free(loader);
}

/* TSV and JSON forms of the order list this rank's slots, as
 * flow_loader_sample_at gives them. */
static void test_loader_print_order_lists_this_ranks_slots(void **state)
{
	(void)state;
	enum { T = 64, G = 8, W = 4, R = 2, FIRST = 30, STEPS = 5 };
	flow_loader_options_t o = options(plain_dir, T, G, R, W, false);
	flow_loader_t *loader = open_ok(&o);
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_manifest_read(plain_dir, &m, &diag), FLOW_OK);

	char *buf = NULL;
	size_t len = 0;
	FILE *out = open_memstream(&buf, &len);
	assert_non_null(out);
	assert_int_equal(flow_loader_print_order(loader, FIRST, STEPS, out,
						 false, &diag),
			 FLOW_OK);
	assert_int_equal(fclose(out), 0);
	char expect[256];
	const char *line = buf;
	const char *header = "step\trank\tslot\tposition\tepoch\tsample\tfile"
			     "\toffset\n";
	assert_memory_equal(line, header, strlen(header));
	line += strlen(header);
	for (uint64_t s = FIRST; s < FIRST + STEPS; s++)
		for (uint64_t j = 0; j < G / W; j++) {
			flow_sample_ref_t ref;
			uint64_t slot = R * (G / W) + j;
			flow_loader_sample_at(loader, s, slot, &ref);
			snprintf(expect, sizeof(expect),
				 "%" PRIu64 "\t%d\t%" PRIu64 "\t%" PRIu64
				 "\t%" PRIu64 "\t%" PRIu64 "\t%s\t%" PRIu64
				 "\n",
				 s, R, slot, ref.position, ref.epoch,
				 ref.sample, m.shards[ref.shard].file,
				 ref.offset);
			assert_memory_equal(line, expect, strlen(expect));
			line += strlen(expect);
		}
	assert_string_equal(line, "");
	free(buf);

	out = open_memstream(&buf, &len);
	assert_non_null(out);
	assert_int_equal(flow_loader_print_order(loader, FIRST, STEPS, out,
						 true, &diag),
			 FLOW_OK);
	assert_int_equal(fclose(out), 0);
	assert_int_equal(buf[0], '[');
	assert_true(len > 4);
	assert_string_equal(buf + len - 4, "}\n]\n");
	flow_sample_ref_t ref;
	flow_loader_sample_at(loader, FIRST, R * (G / W), &ref);
	snprintf(expect, sizeof(expect),
		 "[\n{\"step\": %d, \"rank\": %d, \"slot\": %d, "
		 "\"position\": %" PRIu64 ", \"epoch\": %" PRIu64
		 ", \"sample\": %" PRIu64 ", \"file\": \"%s\", "
		 "\"offset\": %" PRIu64 "},\n",
		 FIRST, R, R * (G / W), ref.position, ref.epoch, ref.sample,
		 m.shards[ref.shard].file, ref.offset);
	assert_memory_equal(buf, expect, strlen(expect));
	size_t rows = 0;
	for (const char *p = buf; (p = strchr(p, '{')); p++)
		rows++;
	assert_int_equal(rows, STEPS * (G / W));
	free(buf);

	/* No steps: a header only, an empty array. */
	out = open_memstream(&buf, &len);
	assert_non_null(out);
	assert_int_equal(flow_loader_print_order(loader, 0, 0, out, true,
						 &diag),
			 FLOW_OK);
	assert_int_equal(fclose(out), 0);
	assert_string_equal(buf, "[]\n");
	free(buf);

	flow_manifest_release(&m);
	flow_loader_free(loader);
}

/* ---- errors ------------------------------------------------------------- */

static void expect_open_error(const flow_loader_options_t *o,
			      flow_err_t expected, const char *fragment)
{
	flow_loader_t *loader = (flow_loader_t *)(uintptr_t)0x1;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_loader_open(o, &loader, &diag), expected);
	assert_ptr_equal(loader, (flow_loader_t *)(uintptr_t)0x1);
	assert_int_equal(diag.err, expected);
	if (!strstr(diag.msg, fragment))
		print_error("message '%s' lacks '%s'\n", diag.msg, fragment);
	assert_non_null(strstr(diag.msg, fragment));
}

static void test_loader_open_rejects_bad_options(void **state)
{
	(void)state;
	char msg[600];
	flow_loader_options_t o = options(plain_dir, 64, 6, 0, 4, false);
	snprintf(msg, sizeof(msg),
		 "%s: data-parallel size 4 does not divide the global batch "
		 "size 6", plain_dir);
	expect_open_error(&o, FLOW_ERR_USAGE, msg);

	o = options(plain_dir, 64, 8, 4, 4, false);
	snprintf(msg, sizeof(msg),
		 "%s: data-parallel rank 4 is not below the data-parallel "
		 "size 4", plain_dir);
	expect_open_error(&o, FLOW_ERR_USAGE, msg);

	o = options(plain_dir, 64, 8, 0, 0, false);
	expect_open_error(&o, FLOW_ERR_USAGE, "data-parallel size must be");
	o = options(plain_dir, 64, 0, 0, 1, false);
	expect_open_error(&o, FLOW_ERR_USAGE, "global batch size must be");
	o = options(plain_dir, 0, 8, 0, 1, false);
	expect_open_error(&o, FLOW_ERR_USAGE, "sequence length must be");

	/* Shards of 3000 tokens: a window of 3000 + 1 fits none. */
	o = options(plain_dir, SHARD_TOKENS, 8, 0, 1, true);
	snprintf(msg, sizeof(msg),
		 "%s: split 'train' has no sample of %d tokens", plain_dir,
		 SHARD_TOKENS + 1);
	expect_open_error(&o, FLOW_ERR_USAGE, msg);
	o = options(plain_dir, VAL_TOKENS, 8, 0, 1, false);
	o.split = FLOW_SPLIT_VAL;
	snprintf(msg, sizeof(msg), "%s: split 'val' has no sample of %d tokens",
		 plain_dir, VAL_TOKENS + 1);
	expect_open_error(&o, FLOW_ERR_USAGE, msg);
	/* The longest that fits. */
	o.seq_len = VAL_TOKENS - 1;
	flow_loader_t *loader = open_ok(&o);
	assert_int_equal(flow_loader_samples_per_epoch(loader), 1);
	flow_loader_free(loader);

	/* No dataset: the manifest reader's error, forwarded. */
	char missing[600];
	snprintf(missing, sizeof(missing), "%s/missing", tmpdir);
	o = options(missing, 64, 8, 0, 1, false);
	loader = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_true(flow_loader_open(&o, &loader, &diag) < 0);
	assert_null(loader);
	assert_true(strlen(diag.msg) > 0);
}

static void test_loader_seek_rejects_states_off_a_batch_boundary(void **state)
{
	(void)state;
	enum { T = 64, G = 8 };
	const bool prefetch[] = { false, true };
	for (int p = 0; p < 2; p++) {
		flow_loader_options_t o = options(plain_dir, T, G, 1, 2,
						  prefetch[p]);
		flow_loader_t *loader = open_ok(&o);
		const uint64_t n = flow_loader_samples_per_epoch(loader);
		int32_t in[4 * T], tg[4 * T];
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(flow_loader_next(loader, in, tg, &diag), 1);

		flow_loader_state_t bad = { 0, 4 };
		assert_int_equal(flow_loader_seek(loader, &bad, &diag),
				 FLOW_ERR_USAGE);
		assert_non_null(strstr(diag.msg, "not on a boundary"));
		assert_non_null(strstr(diag.msg, plain_dir));
		/* Epoch 1, index 0 is position n, not a multiple of G. */
		assert_true(n % G != 0);
		flow_loader_state_t epoch1 = { 1, 0 };
		flow_diag_clear(&diag);
		assert_int_equal(flow_loader_seek(loader, &epoch1, &diag),
				 FLOW_ERR_USAGE);
		flow_loader_state_t past = { 0, n };
		flow_diag_clear(&diag);
		assert_int_equal(flow_loader_seek(loader, &past, &diag),
				 FLOW_ERR_USAGE);
		assert_non_null(strstr(diag.msg, "is not below"));
		flow_loader_state_t huge = { UINT64_MAX, 0 };
		flow_diag_clear(&diag);
		assert_int_equal(flow_loader_seek(loader, &huge, &diag),
				 FLOW_ERR_RANGE);

		/* Failed seeks leave the loader where it was. */
		flow_loader_state_t st = flow_loader_get_state(loader);
		assert_int_equal(st.epoch, 0);
		assert_int_equal(st.index, G);
		/* A boundary in a later epoch: position G * n. */
		flow_loader_state_t good = { G, 0 };
		flow_diag_clear(&diag);
		assert_int_equal(flow_loader_seek(loader, &good, &diag),
				 FLOW_OK);
		assert_int_equal(flow_loader_next(loader, in, tg, &diag), 1);
		st = flow_loader_get_state(loader);
		assert_int_equal(st.epoch, G);
		assert_int_equal(st.index, G);
		flow_loader_free(loader);
	}
}

/* Call damage(fd, header) on every shard of dataset dir, open for
 * writing, with its first 64 bytes. */
static void damage_each_shard(const char *dir,
			      void (*damage)(int fd, const unsigned char *h))
{
	flow_manifest_t m;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_manifest_read(dir, &m, &diag), FLOW_OK);
	for (size_t i = 0; i < m.nshards; i++) {
		char path[600];
		snprintf(path, sizeof(path), "%s/%s", dir, m.shards[i].file);
		int fd = open(path, O_RDWR);
		assert_true(fd >= 0);
		unsigned char h[64];
		assert_int_equal(pread(fd, h, sizeof(h), 0), sizeof(h));
		damage(fd, h);
		close(fd);
	}
	flow_manifest_release(&m);
}

static uint32_t header_u32(const unsigned char *h, int at)
{
	return h[at] | h[at + 1] << 8 | h[at + 2] << 16 |
	       (uint32_t)h[at + 3] << 24;
}

/* Four bytes of junk at the start of every zstd frame. */
static void junk_every_frame(int fd, const unsigned char *h)
{
	uint32_t hlen = header_u32(h, 12), frames = header_u32(h, 44);
	assert_true(frames > 0);
	for (uint32_t f = 0; f < frames; f++) {
		unsigned char e[8];
		assert_int_equal(pread(fd, e, 8, 64 + 16 * (off_t)f), 8);
		uint64_t off = 0;
		for (int b = 7; b >= 0; b--)
			off = off << 8 | e[b];
		const unsigned char junk[4] = { 0xde, 0xad, 0xbe, 0xef };
		assert_int_equal(pwrite(fd, junk, 4, (off_t)(hlen + off)), 4);
	}
}

static void flip_bit_at(int fd, off_t at)
{
	unsigned char b;
	assert_int_equal(pread(fd, &b, 1, at), 1);
	b ^= 1;
	assert_int_equal(pwrite(fd, &b, 1, at), 1);
}

/* Bit 0 of the low byte of token 700 (uncompressed u16 text: still an
 * id below 256). */
static void flip_a_token(int fd, const unsigned char *h)
{
	flip_bit_at(fd, (off_t)header_u32(h, 12) + 2 * 700);
}

/* A bit of the first zstd frame. */
static void flip_in_first_frame(int fd, const unsigned char *h)
{
	flip_bit_at(fd, (off_t)header_u32(h, 12) + 3);
}

/* Corrupt every zstd frame of a dataset: the read error (from the
 * prefetch thread or not) reaches flow_loader_next with the shard's
 * message, the same both ways, and the loader frees cleanly. */
static void test_loader_reports_read_errors(void **state)
{
	(void)state;
	enum { T = 32, G = 2 };
	char dir[512];
	assert_int_equal(build("bad", text, 4000, 2000, 0, 3, 128, dir,
			       sizeof(dir)),
			 0);
	flow_diag_t diag = FLOW_DIAG_INIT;
	damage_each_shard(dir, junk_every_frame);

	char msgs[2][FLOW_DIAG_MAX];
	for (int p = 0; p < 2; p++) {
		flow_loader_options_t o = options(dir, T, G, 0, 1, p == 1);
		flow_loader_t *loader = open_ok(&o);
		int32_t in[G * T], tg[G * T];
		for (int attempt = 0; attempt < 2; attempt++) {
			flow_diag_clear(&diag);
			int rc = flow_loader_next(loader, in, tg, &diag);
			assert_true(rc < 0);
			assert_int_equal(diag.err, rc);
			assert_true(strlen(diag.msg) > 0);
			/* Nothing was returned: the state stays at 0. */
			flow_loader_state_t st = flow_loader_get_state(loader);
			assert_int_equal(st.index, 0);
		}
		memcpy(msgs[p], diag.msg, sizeof(diag.msg));
		flow_loader_free(loader);
	}
	assert_string_equal(msgs[0], msgs[1]);
}

/* The first batch of a loader over dir, which must fail: returns the
 * error and leaves the message in msg_out. */
static flow_err_t first_batch_error(const char *dir, bool prefetch,
				    bool unchecked,
				    char msg_out[FLOW_DIAG_MAX])
{
	enum { T = 32, G = 2 };
	flow_loader_options_t o = options(dir, T, G, 0, 1, prefetch);
	o.unchecked = unchecked;
	flow_loader_t *loader = open_ok(&o);
	int32_t in[G * T], tg[G * T];
	flow_diag_t diag = FLOW_DIAG_INIT;
	int rc = flow_loader_next(loader, in, tg, &diag);
	snprintf(msg_out, FLOW_DIAG_MAX, "%s", flow_diag_message(&diag));
	flow_loader_free(loader);
	return rc < 0 ? (flow_err_t)rc : FLOW_OK;
}

/* A bit flipped in the payload of every shard keeps every id below the
 * vocabulary (text: ids < 256 in u16 tokens, bit 0 of the low byte), so
 * only the checksum can tell: the loader verifies it before the shard's
 * first token is used, with or without prefetch, and without the check
 * the damaged tokens would be handed out. */
static void test_loader_verifies_checksums_before_use(void **state)
{
	(void)state;
	for (int z = 0; z < 2; z++) {
		char dir[512];
		assert_int_equal(build(z ? "flipz" : "flip", text, 4000, 2000,
				       0, z ? 3 : 0, z ? 128 : 0, dir,
				       sizeof(dir)),
				 0);
		damage_each_shard(dir, z ? flip_in_first_frame : flip_a_token);
		for (int p = 0; p < 2; p++) {
			char msg[FLOW_DIAG_MAX];
			assert_int_equal(first_batch_error(dir, p, false, msg),
					 FLOW_ERR_CHECKSUM);
			assert_non_null(strstr(msg, ": checksum mismatch at byte "));
			assert_non_null(strstr(msg, "/train-00000"));
		}
		if (!z) {
			/* The flip is harmless to the raw reader: without
			 * the checksum it would train. */
			char msg[FLOW_DIAG_MAX];
			assert_int_equal(first_batch_error(dir, false, true, msg),
					 FLOW_OK);
		}
	}
}

/* A shard written with the vocabulary 65536, then its header's vocabulary
 * set to 256 and its trailer recomputed, listed by a manifest of
 * vocabulary manifest_vocab with the right checksums: every 16th token is
 * 300, so every window of 33 tokens holds one. */
static void forge_dataset(const char *dir, int zstd_level,
			  uint64_t manifest_vocab)
{
	enum { N = 4000 };
	static uint32_t tokens[N];
	for (size_t i = 0; i < N; i++)
		tokens[i] = i % 16 == 5 ? 300 : (uint32_t)(i % 200);
	assert_int_equal(mkdir(dir, 0755), 0);
	char path[600];
	snprintf(path, sizeof(path), "%s/train-000000.bin", dir);
	flow_shard_write_options_t w = { FLOW_DTYPE_U16, 65536, zstd_level,
					 zstd_level ? 128 : 0 };
	flow_shard_file_info_t info;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_shard_write(path, tokens, N, &w, &info, &diag),
			 FLOW_OK);
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	static unsigned char bytes[3 * N + 4096];
	ssize_t size = pread(fd, bytes, sizeof(bytes), 0);
	assert_true(size > 72 && (size_t)size < sizeof(bytes));
	memset(bytes + 32, 0, 8);
	bytes[33] = 1; /* 256, little-endian */
	uint64_t sum = flow_checksum(bytes, (size_t)size - 8);
	for (int i = 0; i < 8; i++)
		bytes[size - 8 + i] = (unsigned char)(sum >> (8 * i));
	assert_int_equal(pwrite(fd, bytes, (size_t)size, 0), size);
	close(fd);
	info.checksum = sum;
	flow_manifest_shard_t shard = { (char *)"train-000000.bin",
					FLOW_SPLIT_TRAIN, info };
	flow_manifest_t m;
	memset(&m, 0, sizeof(m));
	m.version = FLOW_MANIFEST_VERSION;
	m.vocab = manifest_vocab;
	m.token_dtype = FLOW_DTYPE_U16;
	m.zstd_level = zstd_level;
	m.frame_tokens = w.frame_tokens;
	m.split_tokens[FLOW_SPLIT_TRAIN] = N;
	m.nshards = 1;
	m.shards = &shard;
	snprintf(path, sizeof(path), "%s/manifest", dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(flow_manifest_write(&m, f, &diag), FLOW_OK);
	assert_int_equal(fclose(f), 0);
}

/* Ids at or above the vocabulary under valid checksums (a writer's bug,
 * or a forged file): never handed out, raw or in zstd frames, with or
 * without prefetch; the message names the file, the token and its byte.
 * flow_dataset_verify (flow-shard --verify) rejects the same data. */
static void test_loader_rejects_ids_at_or_above_the_vocabulary(void **state)
{
	(void)state;
	for (int z = 0; z < 2; z++) {
		char dir[512];
		snprintf(dir, sizeof(dir), "%s/forged%d", tmpdir, z);
		forge_dataset(dir, z ? 3 : 0, 256);
		for (int p = 0; p < 2; p++) {
			char msg[FLOW_DIAG_MAX];
			assert_int_equal(first_batch_error(dir, p, false, msg),
					 FLOW_ERR_FORMAT);
			assert_non_null(strstr(msg, "/train-000000.bin: token 300 "));
			assert_non_null(strstr(msg, " is not below the vocabulary size 256"));
			assert_non_null(strstr(msg, z ? " in frame " : " at byte "));
		}
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(flow_dataset_verify(dir, &diag),
				 FLOW_ERR_FORMAT);
		assert_non_null(strstr(diag.msg, "token 300 "));
	}
}

/* A shard whose header has another vocabulary than the manifest is refused
 * when the loader opens it, before any token is read. */
static void test_loader_rejects_a_shard_of_another_vocabulary(void **state)
{
	(void)state;
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/othervocab", tmpdir);
	forge_dataset(dir, 0, 65536);
	flow_loader_options_t o = options(dir, 32, 2, 0, 1, false);
	flow_loader_t *loader = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_loader_open(&o, &loader, &diag),
			 FLOW_ERR_FORMAT);
	assert_null(loader);
	assert_non_null(strstr(diag.msg, "/train-000000.bin: vocabulary size 256 at byte 32, the manifest says 65536"));
}

/* free accepts NULL, a prefetching loader that never read, and one whose
 * read ahead is still in flight. */
static void test_loader_free_stops_prefetching(void **state)
{
	(void)state;
	enum { T = 512, G = 8 };
	flow_loader_free(NULL);
	flow_loader_options_t o = options(zstd_dir, T, G, 0, 1, true);
	flow_loader_free(open_ok(&o));
	int32_t *in = malloc(G * T * sizeof(int32_t));
	int32_t *tg = malloc(G * T * sizeof(int32_t));
	assert_non_null(in);
	assert_non_null(tg);
	for (int k = 0; k < 20; k++) {
		flow_loader_t *loader = open_ok(&o);
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(flow_loader_next(loader, in, tg, &diag), 1);
		flow_loader_free(loader);
	}
	free(in);
	free(tg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_loader_permutation_is_a_bijection),
		cmocka_unit_test(test_loader_permutation_handles_huge_domains),
		cmocka_unit_test(test_loader_permutation_depends_on_every_key),
		cmocka_unit_test(test_loader_epochs_cover_every_sample_once),
		cmocka_unit_test(test_loader_samples_are_windows_of_each_shard),
		cmocka_unit_test(test_loader_order_depends_on_seed_and_data),
		cmocka_unit_test(test_loader_tokens_are_the_text_at_each_sample),
		cmocka_unit_test(test_loader_world_sizes_read_the_same_stream),
		cmocka_unit_test(test_loader_resume_with_another_world_size),
		cmocka_unit_test(test_loader_prefetch_gives_identical_batches),
		cmocka_unit_test(test_loader_state_counts_returned_batches),
		cmocka_unit_test(test_loader_print_order_lists_this_ranks_slots),
		cmocka_unit_test(test_loader_open_rejects_bad_options),
		cmocka_unit_test(test_loader_seek_rejects_states_off_a_batch_boundary),
		cmocka_unit_test(test_loader_reports_read_errors),
		cmocka_unit_test(test_loader_verifies_checksums_before_use),
		cmocka_unit_test(test_loader_rejects_ids_at_or_above_the_vocabulary),
		cmocka_unit_test(test_loader_rejects_a_shard_of_another_vocabulary),
		cmocka_unit_test(test_loader_free_stops_prefetching),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown) ?
		       EXIT_FAILURE : EXIT_SUCCESS;
}
