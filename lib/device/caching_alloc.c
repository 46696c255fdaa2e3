/* The caching device allocator (flow/caching_alloc.h): segments from a
 * backend, cut into blocks that each segment keeps in a list in address
 * order; the free blocks of each pool in one array sorted for best fit,
 * and the blocks handed out in one array sorted by address, for release.
 *
 * Addresses are computed as uintptr_t, never as char *: the memory is the
 * device's, not an object of this program.
 *
 * Every host allocation a request may need (the arrays' room, the record
 * of a split-off block, a new segment's records) is made before the cache
 * changes, so a request that fails leaves it as it was, and release, which
 * cannot fail, never allocates: each pool's free array always has room for
 * every block of that pool. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flow/caching_alloc.h>
#include <flow/log.h>

enum { POOL_SMALL = 0, POOL_LARGE = 1, POOL_COUNT = 2 };

typedef struct segment segment_t;

typedef struct block {
	segment_t *seg;
	struct block *prev, *next; /* neighbours in the segment, by address */
	size_t offset;             /* from the start of the segment */
	size_t size;
	size_t in_use; /* the rounded request while handed out, else 0 */
	bool handed_out;
} block_t;

struct segment {
	segment_t *prev, *next; /* every segment of the allocator */
	uintptr_t base;
	size_t size;
	uint64_t serial; /* creation order: best fit's tie-break */
	int pool;
	block_t *first; /* never merged away: merging keeps the lower block */
};

typedef struct {
	block_t **v;
	size_t n, cap;
} block_array_t;

struct flow_caching_alloc {
	flow_alloc_backend_t backend;
	segment_t *segments;
	uint64_t next_serial;
	/* Free blocks by (size, segment serial, offset). */
	block_array_t free_blocks[POOL_COUNT];
	/* Blocks of each pool, free or handed out: what its free array must
	 * have room for. */
	size_t pool_blocks[POOL_COUNT];
	/* Blocks handed out, by address. */
	block_array_t handed_out;
	flow_alloc_stats_t stats;
};

static uintptr_t block_addr(const block_t *b)
{
	return b->seg->base + b->offset;
}

/* Best fit's order: smaller first, then older segment, then lower
 * address.  Distinct blocks never compare equal. */
static bool free_before(const block_t *x, const block_t *y)
{
	if (x->size != y->size)
		return x->size < y->size;
	if (x->seg->serial != y->seg->serial)
		return x->seg->serial < y->seg->serial;
	return x->offset < y->offset;
}

/* The first index of arr at which below(block, key) is false: arr is
 * sorted so that it holds on a prefix (one binary search for the three
 * orders below). */
static size_t lower_bound(const block_array_t *arr,
			  bool (*below)(const block_t *, const void *),
			  const void *key)
{
	size_t lo = 0, hi = arr->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (below(arr->v[mid], key))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* A free array's block before block key in best fit's order. */
static bool below_block(const block_t *x, const void *key)
{
	return free_before(x, key);
}

/* A free array's block smaller than *key bytes. */
static bool below_size(const block_t *x, const void *key)
{
	return x->size < *(const size_t *)key;
}

/* A handed-out block at an address below *key. */
static bool below_addr(const block_t *x, const void *key)
{
	return block_addr(x) < *(const uintptr_t *)key;
}

/* Room for need blocks in arr; false when the host is out of memory. */
static bool array_reserve(block_array_t *arr, size_t need)
{
	if (need <= arr->cap)
		return true;
	size_t cap = arr->cap < 16 ? 16 : arr->cap;
	while (cap < need)
		if (!flow_mul_size(cap, 2, &cap))
			return false;
	size_t bytes;
	if (!flow_mul_size(cap, sizeof(*arr->v), &bytes))
		return false;
	block_t **v = realloc(arr->v, bytes);
	if (!v)
		return false;
	arr->v = v;
	arr->cap = cap;
	return true;
}

/* Insert at i; the room was reserved. */
static void array_insert(block_array_t *arr, size_t i, block_t *b)
{
	memmove(arr->v + i + 1, arr->v + i, (arr->n - i) * sizeof(*arr->v));
	arr->v[i] = b;
	arr->n++;
}

static void array_remove(block_array_t *arr, size_t i)
{
	memmove(arr->v + i, arr->v + i + 1, (arr->n - i - 1) * sizeof(*arr->v));
	arr->n--;
}

static void free_insert(flow_caching_alloc_t *a, block_t *b)
{
	block_array_t *arr = &a->free_blocks[b->seg->pool];
	array_insert(arr, lower_bound(arr, below_block, b), b);
}

static void free_remove(flow_caching_alloc_t *a, block_t *b)
{
	block_array_t *arr = &a->free_blocks[b->seg->pool];
	array_remove(arr, lower_bound(arr, below_block, b));
}

static bool round_up(size_t n, size_t unit, size_t *out)
{
	size_t r;
	if (!flow_add_size(n, unit - 1, &r))
		return false;
	*out = r / unit * unit;
	return true;
}

/* bytes with three significant digits and a binary unit: "3.00 GiB",
 * "10.2 GiB", "512 B". */
static void format_size(char *buf, size_t cap, size_t bytes)
{
	static const char *const units[] = { "B",   "KiB", "MiB", "GiB",
					     "TiB", "PiB", "EiB" };
	if (bytes < 1024) {
		snprintf(buf, cap, "%zu B", bytes);
		return;
	}
	double v = (double)bytes;
	size_t u = 0;
	while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	if (v < 9.995)
		snprintf(buf, cap, "%.2f %s", v, units[u]);
	else if (v < 99.95)
		snprintf(buf, cap, "%.1f %s", v, units[u]);
	else
		snprintf(buf, cap, "%.0f %s", v, units[u]);
}

static flow_err_t device_oom(const flow_caching_alloc_t *a, size_t bytes,
			     flow_diag_t *diag)
{
	char want[32], in_use[32], reserved[32];
	format_size(want, sizeof(want), bytes);
	format_size(in_use, sizeof(in_use), a->stats.in_use_bytes);
	format_size(reserved, sizeof(reserved), a->stats.reserved_bytes);
	return flow_diag_set(diag, FLOW_ERR_NOMEM,
			     "device out of memory allocating %s (in use %s, reserved %s)",
			     want, in_use, reserved);
}

static flow_err_t host_oom(const flow_caching_alloc_t *a, flow_diag_t *diag)
{
	return flow_diag_set(diag, FLOW_ERR_NOMEM,
			     "out of host memory for the records of caching allocator '%s'",
			     a->backend.name);
}

/* Give seg back to the backend and forget it and its blocks (which must
 * not be in the arrays, or the arrays are about to be freed). */
static void segment_release(flow_caching_alloc_t *a, segment_t *seg)
{
	if (seg->prev)
		seg->prev->next = seg->next;
	else
		a->segments = seg->next;
	if (seg->next)
		seg->next->prev = seg->prev;
	a->backend.free(a->backend.ctx, (void *)seg->base);
	a->stats.reserved_bytes -= seg->size;
	a->stats.backend_frees++;
	for (block_t *b = seg->first, *next; b; b = next) {
		next = b->next;
		a->pool_blocks[seg->pool]--;
		free(b);
	}
	free(seg);
}

/* Give back every segment that is one free block; returns how many. */
static size_t trim_segments(flow_caching_alloc_t *a)
{
	size_t n = 0;
	for (segment_t *seg = a->segments, *next; seg; seg = next) {
		next = seg->next;
		if (seg->first->handed_out || seg->first->next)
			continue;
		free_remove(a, seg->first);
		segment_release(a, seg);
		n++;
	}
	return n;
}

/* A new segment for a request of size bytes (rounded; the caller asked for
 * bytes) in pool, as one free block not in the free array, into *first_out. */
static flow_err_t segment_new(flow_caching_alloc_t *a, int pool, size_t size,
			      size_t bytes, block_t **first_out,
			      flow_diag_t *diag)
{
	flow_err_t err;
	flow_diag_t backend_diag = FLOW_DIAG_INIT;
	size_t seg_size = FLOW_CACHING_ALLOC_SEGMENT;
	void *ptr = NULL;

	if (pool == POOL_LARGE &&
	    !round_up(size, FLOW_CACHING_ALLOC_SEGMENT, &seg_size))
		return device_oom(a, bytes, diag);
	segment_t *seg = calloc(1, sizeof(*seg));
	if (!seg)
		return host_oom(a, diag);
	block_t *first = calloc(1, sizeof(*first));
	if (!first) {
		err = host_oom(a, diag);
		goto out_free_seg;
	}

	err = a->backend.alloc(a->backend.ctx, seg_size, &ptr, &backend_diag);
	/* The cache's free segments are device memory too: giving them back
	 * may make room for this one. */
	if (err == FLOW_ERR_NOMEM && trim_segments(a) > 0) {
		a->stats.oom_retries++;
		flow_diag_clear(&backend_diag);
		err = a->backend.alloc(a->backend.ctx, seg_size, &ptr,
				       &backend_diag);
	}
	if (err == FLOW_ERR_NOMEM) {
		err = device_oom(a, bytes, diag);
		goto out_free_first;
	}
	if (err != FLOW_OK) {
		if (backend_diag.err != FLOW_OK)
			flow_diag_set(diag, err, "%s",
				      flow_diag_message(&backend_diag));
		else
			flow_diag_set(diag, err,
				      "caching allocator '%s': backend failed allocating %zu bytes: %s",
				      a->backend.name, seg_size,
				      flow_err_name(err));
		goto out_free_first;
	}

	seg->base = (uintptr_t)ptr;
	seg->size = seg_size;
	seg->serial = a->next_serial++;
	seg->pool = pool;
	seg->first = first;
	seg->next = a->segments;
	if (a->segments)
		a->segments->prev = seg;
	a->segments = seg;
	first->seg = seg;
	first->size = seg_size;
	a->pool_blocks[pool]++;
	a->stats.backend_allocs++;
	a->stats.reserved_bytes += seg_size;
	if (a->stats.reserved_bytes > a->stats.peak_reserved_bytes)
		a->stats.peak_reserved_bytes = a->stats.reserved_bytes;
	*first_out = first;
	return FLOW_OK;

out_free_first:
	free(first);
out_free_seg:
	free(seg);
	return err;
}

flow_err_t flow_caching_alloc_new(const flow_alloc_backend_t *backend,
				  flow_caching_alloc_t **out,
				  flow_diag_t *diag)
{
	if (!backend || !backend->alloc || !backend->free)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "caching allocator '%s': the backend needs an alloc and a free",
				     backend && backend->name ? backend->name
							      : "");
	flow_caching_alloc_t *a = calloc(1, sizeof(*a));
	if (!a)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "out of host memory for caching allocator '%s'",
				     backend->name ? backend->name : "");
	a->backend = *backend;
	if (!a->backend.name)
		a->backend.name = "";
	*out = a;
	return FLOW_OK;
}

void flow_caching_alloc_free(flow_caching_alloc_t *a)
{
	if (!a)
		return;
	while (a->segments)
		segment_release(a, a->segments);
	for (int p = 0; p < POOL_COUNT; p++)
		free(a->free_blocks[p].v);
	free(a->handed_out.v);
	free(a);
}

flow_err_t flow_caching_alloc_malloc(flow_caching_alloc_t *a, size_t bytes,
				     void **ptr_out, flow_diag_t *diag)
{
	flow_err_t err;
	size_t size;

	if (!round_up(bytes ? bytes : 1, FLOW_CACHING_ALLOC_ROUND, &size))
		return device_oom(a, bytes, diag);
	int pool = size <= FLOW_CACHING_ALLOC_SMALL_MAX ? POOL_SMALL
							: POOL_LARGE;
	/* A request adds at most two blocks: a new segment's and a split's. */
	if (!array_reserve(&a->free_blocks[pool], a->pool_blocks[pool] + 2) ||
	    !array_reserve(&a->handed_out, a->handed_out.n + 1))
		return host_oom(a, diag);
	block_t *spare = calloc(1, sizeof(*spare));
	if (!spare)
		return host_oom(a, diag);

	block_t *b = NULL;
	block_array_t *free_arr = &a->free_blocks[pool];
	size_t i = lower_bound(free_arr, below_size, &size);
	if (i < free_arr->n) {
		b = free_arr->v[i];
		array_remove(free_arr, i);
		a->stats.cache_hits++;
	} else if ((err = segment_new(a, pool, size, bytes, &b, diag))) {
		goto out_free_spare;
	}

	size_t rest = b->size - size;
	size_t min_rest = pool == POOL_SMALL ? FLOW_CACHING_ALLOC_ROUND
					     : FLOW_CACHING_ALLOC_SMALL_MAX;
	/* b's neighbours are not free (free neighbours are always merged),
	 * so the rest needs no merging. */
	if (rest >= min_rest) {
		spare->seg = b->seg;
		spare->offset = b->offset + size;
		spare->size = rest;
		spare->prev = b;
		spare->next = b->next;
		if (b->next)
			b->next->prev = spare;
		b->next = spare;
		b->size = size;
		a->pool_blocks[pool]++;
		free_insert(a, spare);
		spare = NULL;
	}
	b->handed_out = true;
	b->in_use = size;
	uintptr_t addr = block_addr(b);
	array_insert(&a->handed_out,
		     lower_bound(&a->handed_out, below_addr, &addr), b);
	a->stats.in_use_bytes += size;
	if (a->stats.in_use_bytes > a->stats.peak_in_use_bytes)
		a->stats.peak_in_use_bytes = a->stats.in_use_bytes;
	*ptr_out = (void *)block_addr(b);
	err = FLOW_OK;

out_free_spare:
	free(spare);
	return err;
}

/* Merge hi, the free block after lo in its segment, into lo. */
static void merge(flow_caching_alloc_t *a, block_t *lo, block_t *hi)
{
	lo->size += hi->size;
	lo->next = hi->next;
	if (hi->next)
		hi->next->prev = lo;
	a->pool_blocks[lo->seg->pool]--;
	free(hi);
}

/* ptr is not a block a has handed out: say what it is and stop. */
_Noreturn static void release_foreign(const flow_caching_alloc_t *a,
				      void *ptr)
{
	uintptr_t addr = (uintptr_t)ptr;
	const char *what = "which it did not hand out";
	for (const segment_t *seg = a->segments; seg; seg = seg->next) {
		if (addr < seg->base || addr - seg->base >= seg->size)
			continue;
		for (const block_t *b = seg->first; b; b = b->next)
			if (block_addr(b) == addr && !b->handed_out)
				what = "which is free already";
	}
	flow_log(FLOW_LOG_ERROR, "caching allocator '%s': release of %p, %s",
		 a->backend.name, ptr, what);
	abort();
}

void flow_caching_alloc_release(flow_caching_alloc_t *a, void *ptr)
{
	if (!ptr)
		return;
	uintptr_t addr = (uintptr_t)ptr;
	size_t i = lower_bound(&a->handed_out, below_addr, &addr);
	if (i == a->handed_out.n ||
	    block_addr(a->handed_out.v[i]) != (uintptr_t)ptr)
		release_foreign(a, ptr);
	block_t *b = a->handed_out.v[i];
	array_remove(&a->handed_out, i);
	a->stats.in_use_bytes -= b->in_use;
	b->in_use = 0;
	b->handed_out = false;
	if (b->prev && !b->prev->handed_out) {
		block_t *prev = b->prev;
		free_remove(a, prev);
		merge(a, prev, b);
		b = prev;
	}
	if (b->next && !b->next->handed_out) {
		free_remove(a, b->next);
		merge(a, b, b->next);
	}
	free_insert(a, b);
}

void flow_caching_alloc_trim(flow_caching_alloc_t *a)
{
	trim_segments(a);
}

void flow_caching_alloc_stats(const flow_caching_alloc_t *a,
			      flow_alloc_stats_t *stats_out)
{
	*stats_out = a->stats;
}
