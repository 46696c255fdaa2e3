/* A caching allocator for device memory: the layer the CUDA executor puts
 * over cudaMalloc/cudaFree, so that a training step reuses the memory of
 * the step before instead of paying for a cudaMalloc (and the device
 * synchronisation of a cudaFree) per tensor.
 *
 * It is host logic only, over a backend table (flow_alloc_backend_t): it
 * never reads or writes the memory it hands out, so any backend works, and
 * the unit tests run it over host memory.
 *
 * Memory is taken from the backend in segments and cut into blocks:
 *   - every request is rounded up to FLOW_CACHING_ALLOC_ROUND (512) bytes,
 *     and every block starts a multiple of 512 bytes after the start of its
 *     segment, so a pointer is aligned as well as the backend's are
 *     (cudaMalloc: 256 bytes), or to 512 bytes, whichever is less;
 *   - requests of at most FLOW_CACHING_ALLOC_SMALL_MAX (1 MiB) come from
 *     the small pool, whose segments are FLOW_CACHING_ALLOC_SEGMENT (2 MiB);
 *     larger ones from the large pool, where a request that finds no free
 *     block gets a segment of its own, rounded up to 2 MiB;
 *   - a request takes the smallest free block of its pool that fits; among
 *     blocks of one size, the one of the oldest segment, then the lowest
 *     address in it, so the same sequence of calls gets the same blocks run
 *     after run even if the backend's addresses differ;
 *   - the block is split when what is left is at least 512 bytes (small
 *     pool) or 1 MiB (large pool); otherwise the request has the whole block;
 *   - a released block goes back to its pool, merged with the free blocks
 *     on either side of it in its segment.  Memory goes back to the backend
 *     only in flow_caching_alloc_trim, flow_caching_alloc_free, and when the
 *     backend is out of memory: then the allocator trims and tries once more.
 * The free blocks of a pool are kept in one sorted array: an executor makes
 * a few hundred allocations, so the O(n) insertions cost nothing next to a
 * kernel launch.
 *
 * Not thread-safe: one allocator per executor, called from its thread.
 *
 * No streams: a released block may be handed out again by the next call,
 * so the caller must not release memory that work still queued on the
 * device may read or write (the executor synchronises before it releases).
 *
 * Releasing a pointer the allocator did not hand out, or one already
 * released, is a bug in the caller, not a condition to report: it logs one
 * line at FLOW_LOG_ERROR ("caching allocator 'cuda': release of 0x... that
 * it did not hand out") and calls abort(), as free(3) does on a double
 * free, because carrying on would hand the same memory to two tensors. */
#ifndef FLOW_CACHING_ALLOC_H
#define FLOW_CACHING_ALLOC_H

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every request is rounded up to this many bytes. */
#define FLOW_CACHING_ALLOC_ROUND ((size_t)512)
/* The largest request served from the small pool. */
#define FLOW_CACHING_ALLOC_SMALL_MAX ((size_t)1 << 20)
/* The size of a small-pool segment, and what large-pool segments are
 * rounded up to. */
#define FLOW_CACHING_ALLOC_SEGMENT ((size_t)2 << 20)

/* Where the memory comes from: cudaMalloc/cudaFree in the CUDA module. */
typedef struct flow_alloc_backend {
	const char *name; /* "cuda": names the allocator in its messages */
	void *ctx;        /* passed to alloc and free */
	/* bytes (a multiple of FLOW_CACHING_ALLOC_SEGMENT) of memory aligned
	 * to at least 256 bytes into *ptr_out.  Returns FLOW_OK; or
	 * FLOW_ERR_NOMEM when out of memory, and the allocator then trims its
	 * cache and tries once more (the message is replaced by the
	 * allocator's own); or another error with a message in diag, which
	 * the allocator forwards. */
	flow_err_t (*alloc)(void *ctx, size_t bytes, void **ptr_out,
			    flow_diag_t *diag);
	/* Give back memory from alloc.  Cannot fail. */
	void (*free)(void *ctx, void *ptr);
} flow_alloc_backend_t;

typedef struct flow_caching_alloc flow_caching_alloc_t;

/* What the allocator holds, in bytes and counts since it was made. */
typedef struct flow_alloc_stats {
	/* Sum of the requests handed out and not released, each rounded up
	 * to FLOW_CACHING_ALLOC_ROUND, and its highest value. */
	size_t in_use_bytes;
	size_t peak_in_use_bytes;
	/* Sum of the segments held from the backend, and its highest value. */
	size_t reserved_bytes;
	size_t peak_reserved_bytes;
	uint64_t backend_allocs; /* successful backend alloc calls */
	uint64_t backend_frees;  /* backend free calls */
	uint64_t cache_hits;     /* requests served from the cache */
	/* Backend alloc calls that ran out of memory and were tried again
	 * after a trim that gave memory back (whether or not the second try
	 * succeeded). */
	uint64_t oom_retries;
} flow_alloc_stats_t;

/* An allocator over backend, holding nothing yet.  *backend is copied;
 * backend->name and backend->ctx are borrowed and must stay valid until
 * flow_caching_alloc_free.  Returns FLOW_OK and sets *out; FLOW_ERR_USAGE
 * when backend, its alloc or its free is NULL; FLOW_ERR_NOMEM.  Free with
 * flow_caching_alloc_free(). */
FLOW_EXPORT flow_err_t flow_caching_alloc_new(
	const flow_alloc_backend_t *backend, flow_caching_alloc_t **out,
	flow_diag_t *diag) FLOW_MUST_CHECK;

/* Give every segment back to the backend, including those with blocks
 * still handed out (whose pointers are then invalid), and free a.  NULL is
 * ignored. */
FLOW_EXPORT void flow_caching_alloc_free(flow_caching_alloc_t *a);

/* bytes of memory into *ptr_out (0 bytes gives a valid, unique block of
 * FLOW_CACHING_ALLOC_ROUND bytes), uninitialised, from the cache when a
 * free block fits, otherwise from a new segment.  Returns FLOW_OK and sets
 * *ptr_out; otherwise *ptr_out and the allocator's blocks are unchanged,
 * and the return is
 *   FLOW_ERR_NOMEM when the backend is out of memory even after a trim (or
 *   bytes is too large to round), with the line
 *     device out of memory allocating 3.00 GiB (in use 10.2 GiB, reserved
 *     12.0 GiB)
 *   (in use and reserved as they are after the trim), or when the host is
 *   out of memory for the allocator's own records;
 *   the backend's error and message for any other backend failure. */
FLOW_EXPORT flow_err_t flow_caching_alloc_malloc(flow_caching_alloc_t *a,
						 size_t bytes, void **ptr_out,
						 flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Put ptr, from flow_caching_alloc_malloc on a, back into the cache (not
 * the backend).  The device must be done with it (see the top of this
 * file).  NULL is ignored; any other pointer a does not hold as handed out
 * aborts (see the top of this file). */
FLOW_EXPORT void flow_caching_alloc_release(flow_caching_alloc_t *a,
					    void *ptr);

/* Give every segment with nothing handed out back to the backend.  Blocks
 * handed out are unaffected. */
FLOW_EXPORT void flow_caching_alloc_trim(flow_caching_alloc_t *a);

/* The allocator's statistics into *stats_out. */
FLOW_EXPORT void flow_caching_alloc_stats(const flow_caching_alloc_t *a,
					  flow_alloc_stats_t *stats_out);

#ifdef __cplusplus
}
#endif

#endif
