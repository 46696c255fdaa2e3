/* The caching device allocator over test backends: one that hands out host
 * memory (so the tests can write into blocks), or fake addresses with no
 * memory behind them (so a test can reserve gigabytes), each with an
 * optional byte budget, and able to fail on purpose.  The backend records
 * every segment it has out, so a test can check that each block lies in
 * one and that everything came back.  Releases that abort run in a child. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <flow/caching_alloc.h>

#include "sbputil.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* ---- the test backend --------------------------------------------------- */

#define TB_MAX_LIVE 1024
#define TB_MAX_ASKED 64

typedef struct {
	void *raw; /* what aligned_alloc gave; NULL for a fake segment */
	uintptr_t base;
	size_t bytes;
} tb_segment_t;

typedef struct {
	bool fake;           /* addresses without memory behind them */
	bool descending;     /* fake addresses, each below the one before */
	size_t budget;       /* the most bytes out at once; 0: no limit */
	flow_err_t fail_err; /* when not FLOW_OK, the next alloc fails so */
	tb_segment_t live[TB_MAX_LIVE];
	size_t n_live;
	size_t live_bytes;
	unsigned calls, allocs, frees, refusals;
	size_t asked[TB_MAX_ASKED]; /* sizes of the first calls, in order */
	uintptr_t next_fake;
} tb_t;

static flow_err_t tb_alloc(void *ctx, size_t bytes, void **ptr_out,
			   flow_diag_t *diag)
{
	tb_t *tb = ctx;
	if (tb->calls < TB_MAX_ASKED)
		tb->asked[tb->calls] = bytes;
	tb->calls++;
	assert_int_equal(bytes % FLOW_CACHING_ALLOC_SEGMENT, 0);
	if (tb->fail_err != FLOW_OK) {
		flow_err_t err = tb->fail_err;
		tb->fail_err = FLOW_OK;
		tb->refusals++;
		return flow_diag_set(diag, err, "test backend: failed on purpose");
	}
	if (tb->budget && bytes > tb->budget - tb->live_bytes) {
		tb->refusals++;
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "test backend: over budget");
	}
	assert_true(tb->n_live < TB_MAX_LIVE);
	tb_segment_t *s = &tb->live[tb->n_live];
	s->bytes = bytes;
	/* Bases are 256 bytes past a multiple of 512, as cudaMalloc's may
	 * be: blocks are aligned relative to their segment. */
	if (tb->fake) {
		if (!tb->next_fake)
			tb->next_fake = (uintptr_t)1 << 44 | 256;
		s->raw = NULL;
		if (tb->descending) {
			tb->next_fake -= bytes + FLOW_CACHING_ALLOC_SEGMENT;
			s->base = tb->next_fake;
		} else {
			s->base = tb->next_fake;
			tb->next_fake += bytes + FLOW_CACHING_ALLOC_SEGMENT;
		}
	} else {
		s->raw = aligned_alloc(512, bytes + 512);
		if (!s->raw)
			return flow_diag_set(diag, FLOW_ERR_NOMEM,
					     "test backend: out of host memory");
		s->base = (uintptr_t)s->raw + 256;
	}
	tb->n_live++;
	tb->live_bytes += bytes;
	tb->allocs++;
	*ptr_out = (void *)s->base;
	return FLOW_OK;
}

static void tb_free(void *ctx, void *ptr)
{
	tb_t *tb = ctx;
	for (size_t i = 0; i < tb->n_live; i++) {
		if (tb->live[i].base != (uintptr_t)ptr)
			continue;
		free(tb->live[i].raw);
		tb->live_bytes -= tb->live[i].bytes;
		tb->live[i] = tb->live[--tb->n_live];
		tb->frees++;
		return;
	}
	fail_msg("test backend: free of %p, which it did not hand out", ptr);
}

/* The backend segment holding [addr, addr + bytes), or NULL. */
static const tb_segment_t *tb_find(const tb_t *tb, uintptr_t addr,
				   size_t bytes)
{
	for (size_t i = 0; i < tb->n_live; i++) {
		const tb_segment_t *s = &tb->live[i];
		if (addr >= s->base && addr - s->base <= s->bytes &&
		    bytes <= s->bytes - (addr - s->base))
			return s;
	}
	return NULL;
}

static flow_caching_alloc_t *new_alloc(tb_t *tb)
{
	flow_alloc_backend_t backend = { "test", tb, tb_alloc, tb_free };
	flow_caching_alloc_t *a = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_caching_alloc_new(&backend, &a, &diag), FLOW_OK);
	assert_non_null(a);
	return a;
}

static uintptr_t must_malloc(flow_caching_alloc_t *a, size_t bytes)
{
	void *p = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	flow_err_t err = flow_caching_alloc_malloc(a, bytes, &p, &diag);
	if (err != FLOW_OK)
		fail_msg("malloc of %zu bytes: %s", bytes,
			 flow_diag_message(&diag));
	assert_int_equal(diag.err, FLOW_OK);
	assert_non_null(p);
	return (uintptr_t)p;
}

static void release(flow_caching_alloc_t *a, uintptr_t p)
{
	flow_caching_alloc_release(a, (void *)p);
}

static size_t round512(size_t n)
{
	return (n ? n + 511 : 512) / 512 * 512;
}

static void check_stats(const flow_caching_alloc_t *a,
			const flow_alloc_stats_t *want)
{
	flow_alloc_stats_t got;
	flow_caching_alloc_stats(a, &got);
	assert_int_equal(got.in_use_bytes, want->in_use_bytes);
	assert_int_equal(got.peak_in_use_bytes, want->peak_in_use_bytes);
	assert_int_equal(got.reserved_bytes, want->reserved_bytes);
	assert_int_equal(got.peak_reserved_bytes, want->peak_reserved_bytes);
	assert_int_equal(got.backend_allocs, want->backend_allocs);
	assert_int_equal(got.backend_frees, want->backend_frees);
	assert_int_equal(got.cache_hits, want->cache_hits);
	assert_int_equal(got.oom_retries, want->oom_retries);
}

/* ---- reuse, splitting, merging ------------------------------------------ */

static void test_caching_alloc_reuses_released_block(void **state)
{
	(void)state;
	tb_t tb = { 0 };
	flow_caching_alloc_t *a = new_alloc(&tb);
	uintptr_t p = must_malloc(a, 1000);
	release(a, p);
	assert_int_equal(must_malloc(a, 1000), p);
	assert_int_equal(tb.calls, 1);
	release(a, p);
	/* 600 bytes round to the same 1024. */
	assert_int_equal(must_malloc(a, 600), p);
	assert_int_equal(tb.calls, 1);
	flow_alloc_stats_t st;
	flow_caching_alloc_stats(a, &st);
	assert_int_equal(st.backend_allocs, 1);
	assert_int_equal(st.cache_hits, 2);
	assert_int_equal(st.backend_frees, 0);
	assert_int_equal(st.in_use_bytes, 1024);
	flow_caching_alloc_release(a, NULL); /* ignored */
	flow_caching_alloc_free(a);
	assert_int_equal(tb.n_live, 0);
}

static void test_caching_alloc_splits_and_merges_neighbours(void **state)
{
	(void)state;
	tb_t tb = { 0 };
	flow_caching_alloc_t *a = new_alloc(&tb);
	/* Four blocks cut one after the other from one 2 MiB segment; the
	 * rest of it (1048 KiB) stays free after w. */
	uintptr_t x = must_malloc(a, 100 * KiB);
	uintptr_t y = must_malloc(a, 200 * KiB);
	uintptr_t z = must_malloc(a, 300 * KiB);
	uintptr_t w = must_malloc(a, 400 * KiB);
	assert_int_equal(tb.calls, 1);
	assert_int_equal(x, tb.live[0].base);
	assert_int_equal(y, x + 100 * KiB);
	assert_int_equal(z, x + 300 * KiB);
	assert_int_equal(w, x + 600 * KiB);

	/* Best fit: y's 200 KiB, not the bigger rest of the segment. */
	release(a, y);
	assert_int_equal(must_malloc(a, 200 * KiB), y);

	/* The middle, then its neighbours: one free block of 600 KiB at x,
	 * which a 600 KiB request fits exactly (without merging it would get
	 * the rest of the segment, at x + 1000 KiB). */
	release(a, y);
	release(a, x);
	release(a, z);
	assert_int_equal(must_malloc(a, 600 * KiB), x);
	assert_int_equal(tb.calls, 1);

	/* Everything back: the segment is one free block again, which is
	 * what trim gives back. */
	release(a, x);
	release(a, w);
	flow_caching_alloc_trim(a);
	assert_int_equal(tb.frees, 1);
	assert_int_equal(tb.n_live, 0);
	flow_caching_alloc_free(a);
}

static void test_caching_alloc_aligns_every_block_to_512(void **state)
{
	(void)state;
	tb_t tb = { 0 };
	flow_caching_alloc_t *a = new_alloc(&tb);
	/* Small blocks are packed, each at the previous one plus its rounded
	 * size, and 512-aligned relative to the segment (whose base is 256
	 * past a multiple of 512). */
	uintptr_t prev = 0;
	size_t prev_bytes = 0;
	for (size_t n = 1; n < 3000; n += 37) {
		uintptr_t p = must_malloc(a, n);
		const tb_segment_t *s = tb_find(&tb, p, round512(n));
		assert_non_null(s);
		assert_int_equal((p - s->base) % 512, 0);
		assert_int_equal(p % 512, 256);
		if (prev)
			assert_int_equal(p, prev + round512(prev_bytes));
		prev = p;
		prev_bytes = n;
	}
	assert_int_equal(tb.calls, 1);
	size_t large[] = { MiB, MiB + 1, 3 * MiB + 7, 5 * MiB - 511 };
	for (size_t i = 0; i < sizeof(large) / sizeof(large[0]); i++) {
		uintptr_t p = must_malloc(a, large[i]);
		const tb_segment_t *s = tb_find(&tb, p, round512(large[i]));
		assert_non_null(s);
		assert_int_equal((p - s->base) % 512, 0);
	}
	flow_caching_alloc_free(a);
	assert_int_equal(tb.n_live, 0);
}

static void test_caching_alloc_zero_bytes_gives_distinct_blocks(void **state)
{
	(void)state;
	tb_t tb = { 0 };
	flow_caching_alloc_t *a = new_alloc(&tb);
	uintptr_t p = must_malloc(a, 0);
	uintptr_t q = must_malloc(a, 0);
	assert_int_equal(q, p + 512);
	flow_alloc_stats_t st;
	flow_caching_alloc_stats(a, &st);
	assert_int_equal(st.in_use_bytes, 1024);
	flow_caching_alloc_free(a);
	assert_int_equal(tb.n_live, 0);
}

static void test_caching_alloc_large_request_gets_own_segment(void **state)
{
	(void)state;
	tb_t tb = { .fake = true };
	flow_caching_alloc_t *a = new_alloc(&tb);
	uintptr_t s = must_malloc(a, MiB); /* the largest small request */
	assert_int_equal(tb.asked[0], 2 * MiB);
	assert_int_equal(s, tb.live[0].base);
	/* One byte more is large: a segment of its own, although the small
	 * segment has 1 MiB free. */
	uintptr_t l1 = must_malloc(a, MiB + 1);
	assert_int_equal(tb.asked[1], 2 * MiB);
	assert_int_equal(l1, tb.live[1].base);
	uintptr_t l2 = must_malloc(a, 3 * MiB);
	assert_int_equal(tb.asked[2], 4 * MiB);
	assert_int_equal(l2, tb.live[2].base);
	uintptr_t l3 = must_malloc(a, 5 * MiB + 100);
	assert_int_equal(tb.asked[3], 6 * MiB);
	assert_int_equal(l3, tb.live[3].base);
	assert_int_equal(tb.calls, 4);

	/* A small request comes from the small segment, never from the free
	 * MiB left in l2's. */
	uintptr_t s2 = must_malloc(a, 512 * KiB);
	assert_int_equal(s2, s + MiB);
	assert_int_equal(tb.calls, 4);

	/* l2's whole 4 MiB, once released, serves 2 MiB (split: 2 MiB are
	 * left), then 1.5 MiB takes the 2 MiB left whole (512 KiB is less
	 * than the large pool's 1 MiB split). */
	release(a, l2);
	assert_int_equal(must_malloc(a, 2 * MiB), l2);
	assert_int_equal(must_malloc(a, 3 * MiB / 2), l2 + 2 * MiB);
	assert_int_equal(tb.calls, 4);
	flow_alloc_stats_t st;
	flow_caching_alloc_stats(a, &st);
	size_t in_use = MiB + (MiB + 512) + 2 * MiB + 3 * MiB / 2 +
			(5 * MiB + 512) + 512 * KiB;
	assert_int_equal(st.in_use_bytes, in_use);
	assert_int_equal(st.reserved_bytes, 14 * MiB);
	assert_int_equal(st.cache_hits, 3);

	/* Nothing left in the large pool that fits 1 MiB + 512 bytes: l1's
	 * segment kept its 1 MiB - 512 whole. */
	uintptr_t l4 = must_malloc(a, MiB + 512);
	assert_int_equal(tb.calls, 5);
	assert_int_equal(tb.asked[4], 2 * MiB);
	assert_int_equal(l4, tb.live[4].base);
	flow_caching_alloc_free(a);
	assert_int_equal(tb.n_live, 0);
}

static void test_caching_alloc_large_pool_keeps_small_rests(void **state)
{
	(void)state;
	tb_t tb = { .fake = true };
	flow_caching_alloc_t *a = new_alloc(&tb);
	release(a, must_malloc(a, 6 * MiB)); /* one free 6 MiB segment */
	uintptr_t base = tb.live[0].base;
	uintptr_t x = must_malloc(a, 2 * MiB);
	uintptr_t y = must_malloc(a, 4 * MiB);
	assert_int_equal(x, base);
	assert_int_equal(y, base + 2 * MiB);
	/* 1.5 MiB in x's 2 MiB leaves 512 KiB, under the large pool's 1 MiB:
	 * the block stays whole, so when y is released nothing joins it, and
	 * 4.25 MiB needs a new segment (with the 512 KiB split off, it would
	 * have fitted at base + 1.5 MiB). */
	release(a, x);
	assert_int_equal(must_malloc(a, 3 * MiB / 2), base);
	release(a, y);
	assert_int_equal(tb.calls, 1);
	uintptr_t z = must_malloc(a, 4 * MiB + 256 * KiB);
	assert_int_equal(tb.calls, 2);
	assert_int_equal(z, tb.live[1].base);
	flow_caching_alloc_free(a);
	assert_int_equal(tb.n_live, 0);

	/* A rest of exactly 1 MiB is split off: 3 MiB from a 4 MiB block
	 * leaves 1 MiB free, which joins the 2 MiB after it when that is
	 * released, and 3 MiB fits there. */
	tb_t tb2 = { .fake = true };
	a = new_alloc(&tb2);
	release(a, must_malloc(a, 6 * MiB));
	base = tb2.live[0].base;
	uintptr_t p = must_malloc(a, 4 * MiB);
	uintptr_t q = must_malloc(a, 2 * MiB);
	assert_int_equal(q, base + 4 * MiB);
	release(a, p);
	assert_int_equal(must_malloc(a, 3 * MiB), base);
	release(a, q);
	assert_int_equal(must_malloc(a, 3 * MiB), base + 3 * MiB);
	assert_int_equal(tb2.calls, 1);
	flow_caching_alloc_free(a);
	assert_int_equal(tb2.n_live, 0);
}

static void test_caching_alloc_best_fit_ties_are_deterministic(void **state)
{
	(void)state;
	/* The backend's addresses go down, so the older segment is the
	 * higher one: a tie goes to it all the same. */
	tb_t tb = { .fake = true, .descending = true };
	flow_caching_alloc_t *a = new_alloc(&tb);
	uintptr_t a1 = must_malloc(a, MiB);
	must_malloc(a, MiB);
	uintptr_t b1 = must_malloc(a, MiB);
	must_malloc(a, MiB);
	assert_int_equal(tb.calls, 2);
	assert_true(b1 < a1);
	release(a, b1);
	release(a, a1);
	assert_int_equal(must_malloc(a, MiB), a1);
	assert_int_equal(must_malloc(a, MiB), b1);

	/* In one segment, the lower of two equal holes. */
	uintptr_t x[4];
	for (int i = 0; i < 4; i++)
		x[i] = must_malloc(a, 100 * KiB);
	assert_int_equal(tb.calls, 3);
	release(a, x[2]);
	release(a, x[0]);
	assert_int_equal(must_malloc(a, 100 * KiB), x[0]);
	assert_int_equal(must_malloc(a, 100 * KiB), x[2]);
	flow_caching_alloc_free(a);
	assert_int_equal(tb.n_live, 0);
}

/* ---- statistics --------------------------------------------------------- */

static void test_caching_alloc_stats_follow_a_scripted_sequence(void **state)
{
	(void)state;
	tb_t tb = { .fake = true };
	flow_caching_alloc_t *a = new_alloc(&tb);
	flow_alloc_stats_t want = { 0 };
	check_stats(a, &want);

	uintptr_t p1 = must_malloc(a, 1000);
	want.in_use_bytes = want.peak_in_use_bytes = 1024;
	want.reserved_bytes = want.peak_reserved_bytes = 2 * MiB;
	want.backend_allocs = 1;
	check_stats(a, &want);

	uintptr_t p2 = must_malloc(a, 3 * MiB);
	want.in_use_bytes = want.peak_in_use_bytes = 3 * MiB + 1024;
	want.reserved_bytes = want.peak_reserved_bytes = 6 * MiB;
	want.backend_allocs = 2;
	check_stats(a, &want);

	release(a, p1);
	want.in_use_bytes = 3 * MiB;
	check_stats(a, &want);

	uintptr_t p3 = must_malloc(a, 500);
	want.in_use_bytes = 3 * MiB + 512;
	want.cache_hits = 1;
	check_stats(a, &want);

	release(a, p2);
	want.in_use_bytes = 512;
	check_stats(a, &want);

	uintptr_t p4 = must_malloc(a, 2 * MiB); /* from p2's segment */
	want.in_use_bytes = 2 * MiB + 512;
	want.cache_hits = 2;
	check_stats(a, &want);

	flow_caching_alloc_trim(a); /* both segments hold a block */
	check_stats(a, &want);

	release(a, p4);
	flow_caching_alloc_trim(a);
	want.in_use_bytes = 512;
	want.reserved_bytes = 2 * MiB;
	want.backend_frees = 1;
	check_stats(a, &want);

	release(a, p3);
	flow_caching_alloc_trim(a);
	want.in_use_bytes = 0;
	want.reserved_bytes = 0;
	want.backend_frees = 2;
	check_stats(a, &want);
	assert_int_equal(tb.n_live, 0);
	flow_caching_alloc_free(a);
}

/* ---- failures ----------------------------------------------------------- */

static void test_caching_alloc_retries_after_trim(void **state)
{
	(void)state;
	tb_t tb = { .budget = 4 * MiB };
	flow_caching_alloc_t *a = new_alloc(&tb);
	release(a, must_malloc(a, 3 * MiB)); /* 4 MiB cached, the budget */
	/* A small segment does not fit next to it: the backend refuses, the
	 * allocator gives the 4 MiB back and tries again. */
	void *p = NULL;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_caching_alloc_malloc(a, KiB, &p, &diag),
			 FLOW_OK);
	assert_int_equal(diag.err, FLOW_OK);
	assert_string_equal(diag.msg, "");
	assert_non_null(tb_find(&tb, (uintptr_t)p, KiB));
	assert_int_equal(tb.refusals, 1);
	assert_int_equal(tb.calls, 3);
	flow_alloc_stats_t want = {
		.in_use_bytes = KiB,
		.peak_in_use_bytes = 3 * MiB,
		.reserved_bytes = 2 * MiB,
		.peak_reserved_bytes = 4 * MiB,
		.backend_allocs = 2,
		.backend_frees = 1,
		.cache_hits = 0,
		.oom_retries = 1,
	};
	check_stats(a, &want);
	flow_caching_alloc_free(a);
	assert_int_equal(tb.n_live, 0);
}

static void test_caching_alloc_out_of_memory_names_sizes(void **state)
{
	(void)state;
	tb_t tb = { .fake = true, .budget = 12 * GiB };
	flow_caching_alloc_t *a = new_alloc(&tb);
	/* 12 GiB reserved, 10.2 GiB of it in use, 1.8 GiB free but in the
	 * same segment, so a trim cannot give it back. */
	release(a, must_malloc(a, 12 * GiB));
	uintptr_t big = must_malloc(a, (size_t)10952166605); /* 10.2 GiB */
	assert_int_equal(tb.calls, 1);

	int sentinel;
	void *p = &sentinel;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_caching_alloc_malloc(a, 3 * GiB, &p, &diag),
			 FLOW_ERR_NOMEM);
	assert_ptr_equal(p, &sentinel);
	assert_int_equal(diag.err, FLOW_ERR_NOMEM);
	assert_string_equal(diag.msg,
			    "device out of memory allocating 3.00 GiB (in use 10.2 GiB, reserved 12.0 GiB)");
	/* Nothing to trim, so no second try. */
	assert_int_equal(tb.calls, 2);
	flow_alloc_stats_t st;
	flow_caching_alloc_stats(a, &st);
	assert_int_equal(st.oom_retries, 0);
	assert_int_equal(st.in_use_bytes, round512(10952166605));
	assert_int_equal(st.reserved_bytes, 12 * GiB);

	/* With the segment free, a trim gives it back, and 13 GiB still does
	 * not fit: retried once, then refused. */
	release(a, big);
	flow_diag_clear(&diag);
	assert_int_equal(flow_caching_alloc_malloc(a, 13 * GiB, &p, &diag),
			 FLOW_ERR_NOMEM);
	assert_ptr_equal(p, &sentinel);
	assert_string_equal(diag.msg,
			    "device out of memory allocating 13.0 GiB (in use 0 B, reserved 0 B)");
	assert_int_equal(tb.calls, 4);
	flow_caching_alloc_stats(a, &st);
	assert_int_equal(st.oom_retries, 1);
	assert_int_equal(st.backend_frees, 1);
	assert_int_equal(st.reserved_bytes, 0);
	assert_int_equal(st.peak_reserved_bytes, 12 * GiB);
	assert_int_equal(tb.n_live, 0);
	flow_caching_alloc_free(a);
}

static void test_caching_alloc_refuses_unroundable_sizes(void **state)
{
	(void)state;
	tb_t tb = { .fake = true };
	flow_caching_alloc_t *a = new_alloc(&tb);
	/* SIZE_MAX overflows rounding to 512; SIZE_MAX - 1 MiB rounds to 512
	 * but not to a 2 MiB segment.  Neither reaches the backend. */
	size_t sizes[] = { SIZE_MAX, SIZE_MAX - MiB };
	for (int i = 0; i < 2; i++) {
		int sentinel;
		void *p = &sentinel;
		flow_diag_t diag = FLOW_DIAG_INIT;
		assert_int_equal(flow_caching_alloc_malloc(a, sizes[i], &p,
							   &diag),
				 FLOW_ERR_NOMEM);
		assert_ptr_equal(p, &sentinel);
		assert_string_equal(diag.msg,
				    "device out of memory allocating 16.0 EiB (in use 0 B, reserved 0 B)");
	}
	assert_int_equal(tb.calls, 0);
	flow_caching_alloc_free(a);
}

static void test_caching_alloc_forwards_other_backend_errors(void **state)
{
	(void)state;
	tb_t tb = { .fake = true };
	flow_caching_alloc_t *a = new_alloc(&tb);
	release(a, must_malloc(a, 3 * MiB)); /* 4 MiB cached */
	tb.fail_err = FLOW_ERR_DEVICE;
	int sentinel;
	void *p = &sentinel;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_caching_alloc_malloc(a, 8 * MiB, &p, &diag),
			 FLOW_ERR_DEVICE);
	assert_ptr_equal(p, &sentinel);
	assert_string_equal(diag.msg, "test backend: failed on purpose");
	/* Not out of memory: no trim, no second try. */
	assert_int_equal(tb.calls, 2);
	flow_alloc_stats_t st;
	flow_caching_alloc_stats(a, &st);
	assert_int_equal(st.oom_retries, 0);
	assert_int_equal(st.backend_frees, 0);
	assert_int_equal(st.reserved_bytes, 4 * MiB);
	/* And the cache still works. */
	assert_int_equal(must_malloc(a, 3 * MiB), tb.live[0].base);
	flow_caching_alloc_free(a);
	assert_int_equal(tb.n_live, 0);
}

static void test_caching_alloc_new_rejects_incomplete_backend(void **state)
{
	(void)state;
	tb_t tb = { 0 };
	flow_alloc_backend_t no_free = { "test", &tb, tb_alloc, NULL };
	flow_caching_alloc_t *sentinel = (flow_caching_alloc_t *)&tb;
	flow_caching_alloc_t *a = sentinel;
	flow_diag_t diag = FLOW_DIAG_INIT;
	assert_int_equal(flow_caching_alloc_new(&no_free, &a, &diag),
			 FLOW_ERR_USAGE);
	assert_ptr_equal(a, sentinel);
	assert_string_equal(diag.msg,
			    "caching allocator 'test': the backend needs an alloc and a free");
	flow_diag_clear(&diag);
	assert_int_equal(flow_caching_alloc_new(NULL, &a, &diag),
			 FLOW_ERR_USAGE);
	assert_ptr_equal(a, sentinel);
}

static void test_caching_alloc_free_returns_every_segment(void **state)
{
	(void)state;
	tb_t tb = { 0 };
	flow_caching_alloc_t *a = new_alloc(&tb);
	uintptr_t kept[8];
	for (int i = 0; i < 8; i++) {
		uintptr_t p = must_malloc(a, (size_t)(i + 1) * 700 * KiB);
		kept[i] = must_malloc(a, (size_t)(i + 1) * 300 * KiB);
		if (i % 2)
			release(a, p);
	}
	release(a, kept[3]);
	assert_true(tb.n_live > 0);
	/* Free with blocks still handed out, segments partly and wholly
	 * free: every segment goes back. */
	flow_caching_alloc_free(a);
	assert_int_equal(tb.n_live, 0);
	assert_int_equal(tb.frees, tb.allocs);
	assert_int_equal(tb.live_bytes, 0);
	flow_caching_alloc_free(NULL);
}

/* ---- releases that abort ------------------------------------------------ */

static flow_caching_alloc_t *child_alloc;
static int child_expect_fd;

/* In the child: send the parent the line the next release must log. */
static void child_expect(const char *what, uintptr_t p)
{
	char line[256];
	int n = snprintf(line, sizeof(line),
			 "caching allocator 'test': release of %p, %s\n",
			 (void *)p, what);
	if (n < 0 || write(child_expect_fd, line, (size_t)n) != n)
		_exit(97);
	close(child_expect_fd);
}

static void child_foreign(void)
{
	static int not_a_block;
	release(child_alloc, must_malloc(child_alloc, 100));
	child_expect("which it did not hand out", (uintptr_t)&not_a_block);
	flow_caching_alloc_release(child_alloc, &not_a_block);
}

static void child_inside_block(void)
{
	uintptr_t p = must_malloc(child_alloc, 4096);
	child_expect("which it did not hand out", p + 512);
	release(child_alloc, p + 512);
}

static void child_twice(void)
{
	uintptr_t p = must_malloc(child_alloc, 4096);
	must_malloc(child_alloc, 4096); /* so p stays a block of its own */
	release(child_alloc, p);
	child_expect("which is free already", p);
	release(child_alloc, p);
}

static void read_all(int fd, char *buf, size_t cap)
{
	size_t used = 0;
	ssize_t n;
	while (used + 1 < cap &&
	       (n = read(fd, buf + used, cap - 1 - used)) > 0)
		used += (size_t)n;
	buf[used] = '\0';
	close(fd);
}

/* Run fn in a child, on a fresh allocator over fake memory, with stderr
 * captured: it must die of SIGABRT having logged exactly the line it
 * announced. */
static void expect_abort(void (*fn)(void))
{
	int pe[2], px[2];
	assert_int_equal(pipe(pe), 0);
	assert_int_equal(pipe(px), 0);
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct rlimit no_core = { 0, 0 };
		setrlimit(RLIMIT_CORE, &no_core);
		dup2(pe[1], 2);
		close(pe[0]);
		close(px[0]);
		child_expect_fd = px[1];
		static tb_t tb = { .fake = true };
		child_alloc = new_alloc(&tb);
		fn();
		_exit(0); /* the release came back */
	}
	close(pe[1]);
	close(px[1]);
	char expected[256], logged[1024];
	read_all(px[0], expected, sizeof(expected));
	read_all(pe[0], logged, sizeof(logged));
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
		fail_msg("the child %s %d, not of SIGABRT; it logged '%s'",
			 WIFSIGNALED(status) ? "died of signal" : "exited with",
			 WIFSIGNALED(status) ? WTERMSIG(status)
					     : WEXITSTATUS(status),
			 logged);
	assert_string_not_equal(expected, "");
	assert_string_equal(logged, expected);
}

static void test_caching_alloc_release_of_foreign_pointer_aborts(void **state)
{
	(void)state;
	expect_abort(child_foreign);
	expect_abort(child_inside_block);
	expect_abort(child_twice);
}

/* ---- the property test -------------------------------------------------- */

typedef struct {
	uintptr_t p;
	size_t bytes;
	unsigned char tag;
} live_t;

static int live_by_addr(const void *x, const void *y)
{
	const live_t *a = x, *b = y;
	return a->p < b->p ? -1 : a->p > b->p;
}

static void check_pattern(uint64_t seed, int op, const live_t *l)
{
	const unsigned char *m = (const unsigned char *)l->p;
	if (m[0] != l->tag || (l->bytes > 1 && memcmp(m, m + 1, l->bytes - 1)))
		fail_msg("seed %#llx op %d: block %p of %zu bytes was overwritten",
			 (unsigned long long)seed, op, (void *)l->p, l->bytes);
}

/* Every live block lies in one backend segment at a multiple of 512 from
 * its start, no two overlap (rounded sizes), and the statistics agree
 * with the live blocks and the backend. */
static void check_invariants(uint64_t seed, int op, flow_caching_alloc_t *a,
			     const tb_t *tb, live_t *live, size_t n_live)
{
	live_t sorted[64];
	memcpy(sorted, live, n_live * sizeof(*live));
	qsort(sorted, n_live, sizeof(*sorted), live_by_addr);
	size_t in_use = 0;
	for (size_t i = 0; i < n_live; i++) {
		size_t r = round512(sorted[i].bytes);
		in_use += r;
		const tb_segment_t *s = tb_find(tb, sorted[i].p, r);
		if (!s || (sorted[i].p - s->base) % 512)
			fail_msg("seed %#llx op %d: block %p of %zu bytes is not 512-aligned in a segment",
				 (unsigned long long)seed, op,
				 (void *)sorted[i].p, sorted[i].bytes);
		if (i + 1 < n_live && sorted[i].p + r > sorted[i + 1].p)
			fail_msg("seed %#llx op %d: blocks %p and %p overlap",
				 (unsigned long long)seed, op,
				 (void *)sorted[i].p, (void *)sorted[i + 1].p);
	}
	flow_alloc_stats_t st;
	flow_caching_alloc_stats(a, &st);
	if (st.in_use_bytes != in_use || st.reserved_bytes != tb->live_bytes ||
	    st.backend_allocs != tb->allocs || st.backend_frees != tb->frees ||
	    st.peak_in_use_bytes < in_use ||
	    st.peak_reserved_bytes < st.reserved_bytes)
		fail_msg("seed %#llx op %d: stats in use %zu (live %zu), reserved %zu (backend %zu), allocs %llu (%u), frees %llu (%u)",
			 (unsigned long long)seed, op, st.in_use_bytes, in_use,
			 st.reserved_bytes, tb->live_bytes,
			 (unsigned long long)st.backend_allocs, tb->allocs,
			 (unsigned long long)st.backend_frees, tb->frees);
}

/* ops random mallocs (1 B - 8 MiB, log-uniform, so most are small) and
 * releases, at most 48 blocks live, now and then a trim, over a backend
 * of budget bytes (0: no limit), where running out of memory is allowed
 * but must change nothing. */
static void random_ops(uint64_t seed, int ops, size_t budget)
{
	tb_t *tb = calloc(1, sizeof(*tb));
	assert_non_null(tb);
	tb->budget = budget;
	flow_caching_alloc_t *a = new_alloc(tb);
	live_t live[48];
	size_t n_live = 0;
	uint64_t rng = seed;
	unsigned next_tag = 0;
	int refused = 0;
	for (int op = 0; op < ops; op++) {
		uint64_t dice = splitmix64(&rng) % 100;
		if (dice == 0) {
			flow_caching_alloc_trim(a);
		} else if (n_live == 48 || (n_live > 0 && dice < 45)) {
			size_t i = splitmix64(&rng) % n_live;
			check_pattern(seed, op, &live[i]);
			release(a, live[i].p);
			live[i] = live[--n_live];
		} else {
			int e = (int)splitmix64_range(&rng, 0, 23);
			int64_t hi = e == 23 ? (int64_t)8 << 20
					     : ((int64_t)2 << e) - 1;
			int64_t lo = (int64_t)1 << e;
			size_t bytes = (size_t)splitmix64_range(&rng, lo, hi);
			flow_alloc_stats_t before, after;
			flow_caching_alloc_stats(a, &before);
			int sentinel;
			void *p = &sentinel;
			flow_diag_t diag = FLOW_DIAG_INIT;
			flow_err_t err =
				flow_caching_alloc_malloc(a, bytes, &p, &diag);
			if (err == FLOW_ERR_NOMEM && budget) {
				flow_caching_alloc_stats(a, &after);
				if (p != &sentinel ||
				    after.in_use_bytes != before.in_use_bytes ||
				    strncmp(diag.msg,
					    "device out of memory allocating ",
					    32))
					fail_msg("seed %#llx op %d: a refused malloc of %zu bytes changed its output or the bytes in use: %s",
						 (unsigned long long)seed, op,
						 bytes, diag.msg);
				refused++;
			} else if (err != FLOW_OK) {
				fail_msg("seed %#llx op %d: malloc of %zu bytes: %s",
					 (unsigned long long)seed, op, bytes,
					 diag.msg);
			} else {
				live_t *l = &live[n_live++];
				l->p = (uintptr_t)p;
				l->bytes = bytes;
				l->tag = (unsigned char)(next_tag++ % 255 + 1);
				memset(p, l->tag, bytes);
			}
		}
		check_invariants(seed, op, a, tb, live, n_live);
	}
	if (budget && refused == 0)
		fail_msg("seed %#llx: a budget of %zu bytes refused nothing: the test tests less than it says",
			 (unsigned long long)seed, budget);
	for (size_t i = 0; i < n_live; i++) {
		check_pattern(seed, ops, &live[i]);
		release(a, live[i].p);
	}
	flow_alloc_stats_t st;
	flow_caching_alloc_stats(a, &st);
	if (budget && st.oom_retries == 0)
		fail_msg("seed %#llx: a budget of %zu bytes never made it trim and retry: the test tests less than it says",
			 (unsigned long long)seed, budget);
	assert_int_equal(st.in_use_bytes, 0);
	flow_caching_alloc_trim(a);
	assert_int_equal(tb->n_live, 0);
	flow_caching_alloc_free(a);
	free(tb);
}

static void test_caching_alloc_random_ops_keep_blocks_apart(void **state)
{
	(void)state;
	random_ops(0xa110c8ed5eedULL, 4000, 0);
}

static void test_caching_alloc_random_ops_under_budget(void **state)
{
	(void)state;
	random_ops(0xb0d6e75eedULL, 4000, 48 * MiB);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_caching_alloc_reuses_released_block),
		cmocka_unit_test(test_caching_alloc_splits_and_merges_neighbours),
		cmocka_unit_test(test_caching_alloc_aligns_every_block_to_512),
		cmocka_unit_test(test_caching_alloc_zero_bytes_gives_distinct_blocks),
		cmocka_unit_test(test_caching_alloc_large_request_gets_own_segment),
		cmocka_unit_test(test_caching_alloc_large_pool_keeps_small_rests),
		cmocka_unit_test(test_caching_alloc_best_fit_ties_are_deterministic),
		cmocka_unit_test(test_caching_alloc_stats_follow_a_scripted_sequence),
		cmocka_unit_test(test_caching_alloc_retries_after_trim),
		cmocka_unit_test(test_caching_alloc_out_of_memory_names_sizes),
		cmocka_unit_test(test_caching_alloc_refuses_unroundable_sizes),
		cmocka_unit_test(test_caching_alloc_forwards_other_backend_errors),
		cmocka_unit_test(test_caching_alloc_new_rejects_incomplete_backend),
		cmocka_unit_test(test_caching_alloc_free_returns_every_segment),
		cmocka_unit_test(test_caching_alloc_release_of_foreign_pointer_aborts),
		cmocka_unit_test(test_caching_alloc_random_ops_keep_blocks_apart),
		cmocka_unit_test(test_caching_alloc_random_ops_under_budget),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
