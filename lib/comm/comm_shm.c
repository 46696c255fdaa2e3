/* Shared-memory backend of the CPU communicator: the transport when every
 * member lives on one node.  Member 0 creates one POSIX shared memory
 * segment per communicator; the others find it under a name derived from
 * the job and the communicator id, so setup needs no bootstrap exchange,
 * and the name is unlinked as soon as everyone has mapped it, so a crash
 * leaves nothing behind.
 *
 * Collectives run in lockstep steps.  A step begins when every member has
 * arrived at the end of the previous one and ends with this member's
 * arrival; each member owns three staging buffers used in rotation by the
 * global step number, so data written at step g is read at steps g+1 and
 * g+2 and overwritten at g+3 at the earliest, when every reader is done
 * with it.  The last step of an operation only reads the segment and
 * therefore needs no arrival: it merges with the first step of the next
 * operation, which only writes the buffer of its own step.  Point-to-point
 * traffic uses a ring per ordered pair and never touches the step count.
 *
 * Waiting spins briefly, then yields the CPU for a while, then sleeps on a
 * futex in slices, so that a dead peer or a passed deadline ends the
 * wait. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define SHM_HAVE_STREAM 1
#endif

#include "comm_internal.h"

#if ATOMIC_LLONG_LOCK_FREE != 2 || ATOMIC_INT_LOCK_FREE != 2
#error "the shared-memory backend needs lock-free 32- and 64-bit atomics"
#endif

#define SHM_MAGIC UINT64_C(0x316d6873776f6c66) /* "flowshm1" */
#define SHM_VERSION 1u
#define SHM_LINE 64
#define SHM_PAGE 4096
#define SHM_NBUF 3 /* staging buffers per member, used in rotation */

/* Staging buffer per member: large enough that synchronisation is a small
 * part of a step, small enough that every member's buffers stay in cache;
 * all members' buffers together stay within SHM_BUF_BUDGET. */
#define SHM_BUF_MAX ((size_t)512 << 10)
#define SHM_BUF_MIN ((size_t)64 << 10)
#define SHM_BUF_BUDGET ((size_t)48 << 20)
/* Ring per ordered pair of members for send/recv. */
#define SHM_RING_MAX ((size_t)512 << 10)
#define SHM_RING_MIN ((size_t)16 << 10)
#define SHM_RING_BUDGET ((size_t)16 << 20)
#define SHM_PAIR_HDR 256 /* three cache lines, rounded up */
/* All-reduces up to this size are summed whole by every member after one
 * step: one synchronisation instead of two. */
#define SHM_SMALL_BYTES ((size_t)32 << 10)
/* Results at least this large are written with non-temporal stores: they
 * would not stay in the cache anyway. */
#define SHM_STREAM_BYTES ((size_t)8 << 20)

/* A waiter first spins, long enough to catch a peer running on another
 * CPU (briefly when members outnumber CPUs), then yields its CPU to
 * whatever else can run (with more members than CPUs: the members it
 * waits for, which a sleeping waiter would leave waiting for a wake-up
 * across CPUs), and only then sleeps on the futex. */
#define SHM_SPIN_DEDICATED_S 20e-6
#define SHM_SPIN_SHARED_S 1e-6
#define SHM_YIELD_S 200e-6
/* Longest futex sleep between checks of peers and deadline. */
#define SHM_SLICE_S 0.02
/* Interval between liveness checks while sleeping. */
#define SHM_CHECK_S 0.005
/* Pause between polls while the segment is being set up. */
#define SHM_SETUP_POLL_NS 200000L

typedef struct shm_hdr {
	_Alignas(SHM_LINE) _Atomic uint64_t magic; /* SHM_MAGIC once ready */
	uint32_t version;
	uint32_t size;
	uint64_t id;
	uint64_t buf_bytes;
	uint64_t ring_bytes;
	uint64_t total_bytes;
	int64_t creator_pid;
	/* Arrivals of every member together: step t is complete for all
	 * when it reaches size * t. */
	_Alignas(SHM_LINE) _Atomic uint64_t arrivals;
	/* Futex: bumped by the last arrival of each step. */
	_Alignas(SHM_LINE) _Atomic uint32_t gen;
	_Atomic uint32_t sleepers;
} shm_hdr_t;

typedef struct shm_member {
	_Alignas(SHM_LINE) _Atomic uint64_t step; /* arrivals so far */
	_Atomic uint32_t attached;
	/* All-to-all: rounds this member needs, by staging buffer. */
	_Atomic uint64_t rounds[SHM_NBUF];
} shm_member_t;

/* One direction between two members: a byte stream of framed messages. */
typedef struct shm_pair {
	_Alignas(SHM_LINE) _Atomic uint64_t head; /* bytes written */
	_Alignas(SHM_LINE) _Atomic uint64_t tail; /* bytes consumed */
	_Alignas(SHM_LINE) _Atomic uint32_t word; /* futex: bumped on both */
	_Atomic uint32_t sleepers;
} shm_pair_t;

/* Message frame in a ring, one cache line. */
typedef struct shm_frame {
	uint64_t seq; /* 1, 2, ... per direction */
	uint64_t bytes;
	uint8_t pad[SHM_LINE - 2 * sizeof(uint64_t)];
} shm_frame_t;

_Static_assert(sizeof(shm_hdr_t) <= 4 * SHM_LINE, "header too large");
_Static_assert(sizeof(shm_pair_t) <= SHM_PAIR_HDR, "pair header too large");
_Static_assert(sizeof(shm_frame_t) == SHM_LINE, "frame is one line");
_Static_assert(SHM_SMALL_BYTES <= SHM_BUF_MIN, "small all-reduces fit");

typedef struct shm {
	char name[64];
	bool owns_name; /* created and not yet unlinked */
	unsigned char *base;
	size_t map_bytes;
	shm_hdr_t *hdr;
	shm_member_t *members;
	unsigned char *bufs; /* [size][SHM_NBUF][buf_bytes] */
	unsigned char *pairs;
	size_t hdr_bytes, bufs_bytes; /* where the buffers and rings begin */
	size_t buf_bytes, ring_bytes, pair_stride;
	int n, me;
	uint64_t step; /* this member's arrivals */
	double spin_s; /* how long a waiter spins before it yields */
	const void **srcs; /* [n]: scratch for the sum kernel */
} shm_t;

/* ---- layout ------------------------------------------------------------ */

static size_t round_down(size_t x, size_t a)
{
	return x - x % a;
}

static size_t clamp_size(size_t x, size_t lo, size_t hi)
{
	return x < lo ? lo : x > hi ? hi : x;
}

static flow_err_t shm_layout(shm_t *s)
{
	size_t n = (size_t)s->n, hdr, bufs, pairs, members, npairs, total;

	s->buf_bytes = clamp_size(
		round_down(SHM_BUF_BUDGET / (SHM_NBUF * n), SHM_PAGE),
		SHM_BUF_MIN, SHM_BUF_MAX);
	/* All-to-all needs a line per member in every buffer. */
	if (s->buf_bytes < n * SHM_LINE)
		s->buf_bytes = round_down(n * SHM_LINE + SHM_PAGE - 1,
					  SHM_PAGE);
	npairs = n * (n - 1);
	s->ring_bytes = clamp_size(round_down(SHM_RING_BUDGET / npairs,
					      SHM_PAGE),
				   SHM_RING_MIN, SHM_RING_MAX);
	s->pair_stride = SHM_PAIR_HDR + s->ring_bytes;
	if (!flow_mul_size(n, sizeof(shm_member_t), &members) ||
	    !flow_add_size(members, 4 * SHM_LINE + SHM_PAGE - 1, &hdr) ||
	    !flow_mul_size(n * SHM_NBUF, s->buf_bytes, &bufs) ||
	    !flow_mul_size(npairs, s->pair_stride, &pairs) ||
	    !flow_add_size(round_down(hdr, SHM_PAGE), bufs, &total) ||
	    !flow_add_size(total, pairs, &total))
		return FLOW_ERR_RANGE;
	s->hdr_bytes = round_down(hdr, SHM_PAGE);
	s->bufs_bytes = bufs;
	s->map_bytes = total;
	return FLOW_OK;
}

static void shm_bind(shm_t *s)
{
	s->hdr = (shm_hdr_t *)s->base;
	s->members = (shm_member_t *)(s->base + 4 * SHM_LINE);
	s->bufs = s->base + s->hdr_bytes;
	s->pairs = s->bufs + s->bufs_bytes;
}

static unsigned char *shm_buf(const shm_t *s, int member, uint64_t step)
{
	size_t slot = (size_t)member * SHM_NBUF + (size_t)(step % SHM_NBUF);
	return s->bufs + slot * s->buf_bytes;
}

static shm_pair_t *shm_pair(const shm_t *s, int from, int to)
{
	size_t idx = (size_t)from * (size_t)(s->n - 1) +
		     (size_t)(to < from ? to : to - 1);
	return (shm_pair_t *)(s->pairs + idx * s->pair_stride);
}

static unsigned char *shm_ring(shm_pair_t *p)
{
	return (unsigned char *)p + SHM_PAIR_HDR;
}

/* ---- waiting ----------------------------------------------------------- */

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expected,
		       double seconds)
{
	struct timespec ts;

	ts.tv_sec = (time_t)seconds;
	ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
	/* EAGAIN, EINTR and ETIMEDOUT all mean: look again. */
	(void)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts,
		      NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word)
{
	(void)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL,
		      NULL, 0);
}

/* Bump a futex word after publishing progress and wake its sleepers.  The
 * sequentially consistent order of (progress, bump, read sleepers) here and
 * (count sleeper, read word, read progress) in shm_wait means a sleeper is
 * either seen or sees the progress. */
static void shm_signal(_Atomic uint32_t *word, _Atomic uint32_t *sleepers)
{
	atomic_fetch_add(word, 1);
	if (atomic_load(sleepers) != 0)
		futex_wake_all(word);
}

/* What a wait is for: *var >= target, published by peer (a communicator
 * rank) or by every member when peer is -1 (then target is a step and var
 * the total arrivals). */
typedef struct shm_cond {
	const _Atomic uint64_t *var;
	uint64_t target;
	_Atomic uint32_t *word, *sleepers;
	int peer;
	uint64_t step; /* peer -1: the step every member must reach */
} shm_cond_t;

static bool shm_ready(const shm_cond_t *w)
{
	return atomic_load_explicit(w->var, memory_order_acquire) >=
	       w->target;
}

/* The first member the wait still needs, or -1. */
static int shm_behind(const shm_t *s, const shm_cond_t *w)
{
	if (w->peer >= 0)
		return shm_ready(w) ? -1 : w->peer;
	for (int j = 0; j < s->n; j++)
		if (atomic_load_explicit(&s->members[j].step,
					 memory_order_relaxed) < w->step)
			return j;
	return -1;
}

/* A member the wait needs that is no longer running, or -1.  A member that
 * already did its part and then exited is no reason to fail. */
static int shm_dead_needed(flow_comm_t *c, const shm_t *s,
			   const shm_cond_t *w)
{
	if (w->peer >= 0)
		return flow_comm_peer_alive(c, w->peer) ? -1 : w->peer;
	for (int j = 0; j < s->n; j++) {
		const _Atomic uint64_t *step = &s->members[j].step;

		if (j == s->me || atomic_load(step) >= w->step)
			continue;
		/* Read again: it may have arrived just before it died. */
		if (!flow_comm_peer_alive(c, j) && atomic_load(step) < w->step)
			return j;
	}
	return -1;
}

static flow_err_t shm_wait(flow_comm_t *c, shm_t *s, const shm_cond_t *w,
			   flow_diag_t *diag)
{
	double start, now, deadline, last_check;

	if (shm_ready(w))
		return FLOW_OK;
	start = flow_comm_now();
	do {
		for (int i = 0; i < 16; i++) {
			cpu_relax();
			if (shm_ready(w))
				return FLOW_OK;
		}
	} while (flow_comm_now() - start < s->spin_s);
	while (flow_comm_now() - start < SHM_YIELD_S) {
		sched_yield();
		if (shm_ready(w))
			return FLOW_OK;
	}

	deadline = flow_comm_deadline(c);
	last_check = start;
	for (;;) {
		uint32_t gen;
		double slice;
		int r;

		atomic_fetch_add(w->sleepers, 1);
		gen = atomic_load(w->word);
		if (shm_ready(w)) {
			atomic_fetch_sub(w->sleepers, 1);
			return FLOW_OK;
		}
		now = flow_comm_now();
		slice = deadline - now;
		if (slice > SHM_SLICE_S)
			slice = SHM_SLICE_S;
		if (slice > 0)
			futex_wait(w->word, gen, slice);
		atomic_fetch_sub(w->sleepers, 1);
		if (shm_ready(w))
			return FLOW_OK;
		now = flow_comm_now();
		if (now - last_check >= SHM_CHECK_S || now >= deadline) {
			last_check = now;
			r = shm_dead_needed(c, s, w);
			if (r >= 0)
				return flow_comm_peer_fail(c, diag, r, "died");
		}
		if (now >= deadline) {
			if (shm_ready(w))
				return FLOW_OK;
			return flow_comm_timed_out(c, diag, shm_behind(s, w));
		}
	}
}

/* ---- steps ------------------------------------------------------------- */

/* Begin a step: every member has arrived at the end of the previous one,
 * so nobody still reads what this step overwrites. */
static flow_err_t shm_step_begin(flow_comm_t *c, shm_t *s, flow_diag_t *diag)
{
	shm_cond_t w = {
		.var = &s->hdr->arrivals,
		.target = (uint64_t)s->n * s->step,
		.word = &s->hdr->gen,
		.sleepers = &s->hdr->sleepers,
		.peer = -1,
		.step = s->step,
	};
	return shm_wait(c, s, &w, diag);
}

/* End a step: publish this member's writes.  Arrivals of step t+1 start
 * only after all of step t, so the arrival that makes the total a multiple
 * of n is the last of its step and wakes the sleepers. */
static void shm_arrive(shm_t *s)
{
	uint64_t step = ++s->step, before;

	atomic_store_explicit(&s->members[s->me].step, step,
			      memory_order_relaxed);
	before = atomic_fetch_add(&s->hdr->arrivals, 1);
	if (before + 1 == (uint64_t)s->n * step)
		shm_signal(&s->hdr->gen, &s->hdr->sleepers);
}

/* ---- collectives --------------------------------------------------------- */

static size_t min_size(size_t a, size_t b)
{
	return a < b ? a : b;
}

/* First element of member j's part of a chunk of ce elements, aligned to a
 * cache line where possible. */
static size_t part_lo(size_t ce, int j, int n, size_t align)
{
	size_t x;

	if (j >= n)
		return ce;
	x = ce * (size_t)j / (size_t)n;
	return x - x % align;
}

/* A small vector: every member stages all of it and sums every member's
 * copy itself, in member order, after a single synchronisation. */
static flow_err_t shm_all_reduce_small(flow_comm_t *c, shm_t *s,
				       const void *send, void *recv,
				       size_t count, flow_dtype_t dtype,
				       flow_diag_t *diag)
{
	size_t bytes = count * flow_dtype_size(dtype);
	flow_err_t err;

	err = shm_step_begin(c, s, diag);
	if (err != FLOW_OK)
		return err;
	memcpy(shm_buf(s, s->me, s->step), send, bytes);
	shm_arrive(s);
	err = shm_step_begin(c, s, diag);
	if (err != FLOW_OK)
		return err;
	for (int j = 0; j < s->n; j++)
		s->srcs[j] = j == s->me ? send : shm_buf(s, j, s->step - 1);
	flow_comm_sum_n(recv, s->srcs, s->n, count, dtype);
	return FLOW_OK;
}

/* memcpy into memory this process will not read back soon: non-temporal
 * stores skip reading the destination lines and leave the cache (and the
 * staging buffers in it) alone. */
static void copy_stream(void *dst, const void *src, size_t len)
{
#ifdef SHM_HAVE_STREAM
	unsigned char *d = dst;
	const unsigned char *s = src;
	size_t head = (size_t)(-(uintptr_t)d & (SHM_LINE - 1));

	if (len < 4 * SHM_LINE) {
		memcpy(dst, src, len);
		return;
	}
	memcpy(d, s, head);
	d += head;
	s += head;
	len -= head;
	for (; len >= SHM_LINE; d += SHM_LINE, s += SHM_LINE, len -= SHM_LINE) {
		__m128i a = _mm_loadu_si128((const __m128i *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i x = _mm_loadu_si128((const __m128i *)(s + 32));
		__m128i y = _mm_loadu_si128((const __m128i *)(s + 48));

		_mm_stream_si128((__m128i *)d, a);
		_mm_stream_si128((__m128i *)(d + 16), b);
		_mm_stream_si128((__m128i *)(d + 32), x);
		_mm_stream_si128((__m128i *)(d + 48), y);
	}
	memcpy(d, s, len);
	_mm_sfence();
#else
	memcpy(dst, src, len);
#endif
}

static void copy_out(void *dst, const void *src, size_t len, bool stream)
{
	if (stream)
		copy_stream(dst, src, len);
	else
		memcpy(dst, src, len);
}

/* One all-reduce: the vector in chunks of a staging buffer, each split
 * into one part per member. */
typedef struct ar_job {
	const unsigned char *in;
	unsigned char *out;
	size_t count, chunk, elem, align;
	flow_dtype_t dtype;
	bool stream;
} ar_job_t;

static void ar_chunk(const ar_job_t *a, size_t k, size_t *off, size_t *ce)
{
	*off = k * a->chunk;
	*ce = min_size(a->chunk, a->count - *off);
}

/* Stage chunk k, except my own part, which is summed straight from send. */
static void ar_stage(shm_t *s, const ar_job_t *a, size_t k)
{
	size_t off, ce, lo, hi, e = a->elem;
	unsigned char *b = shm_buf(s, s->me, s->step);

	ar_chunk(a, k, &off, &ce);
	lo = part_lo(ce, s->me, s->n, a->align);
	hi = part_lo(ce, s->me + 1, s->n, a->align);
	memcpy(b, a->in + off * e, lo * e);
	memcpy(b + hi * e, a->in + (off + hi) * e, (ce - hi) * e);
}

/* Sum my part of chunk k, staged a step ago, into my own buffer. */
static void ar_sum(shm_t *s, const ar_job_t *a, size_t k)
{
	size_t off, ce, lo, hi, e = a->elem;

	ar_chunk(a, k, &off, &ce);
	lo = part_lo(ce, s->me, s->n, a->align);
	hi = part_lo(ce, s->me + 1, s->n, a->align);
	if (hi == lo)
		return;
	for (int j = 0; j < s->n; j++)
		s->srcs[j] = j == s->me ? a->in + (off + lo) * e
					: shm_buf(s, j, s->step - 1) + lo * e;
	flow_comm_sum_n(shm_buf(s, s->me, s->step - 1) + lo * e, s->srcs,
			s->n, hi - lo, a->dtype);
}

/* Copy chunk k, summed a step ago, from the owners of its parts. */
static void ar_collect(shm_t *s, const ar_job_t *a, size_t k)
{
	size_t off, ce, e = a->elem;

	ar_chunk(a, k, &off, &ce);
	for (int j = 0; j < s->n; j++) {
		size_t lo = part_lo(ce, j, s->n, a->align);
		size_t hi = part_lo(ce, j + 1, s->n, a->align);

		copy_out(a->out + (off + lo) * e,
			 shm_buf(s, j, s->step - 2) + lo * e, (hi - lo) * e,
			 a->stream);
	}
}

/* Chunk k of the vector moves through three steps: staged in every
 * member's buffer, summed part by part (member j sums part j of every
 * buffer into its own), and copied out from the owners of the parts.  Each
 * step works on three chunks at once.  Every element is summed once, by
 * one member, in member order, so all members get the same bits. */
static flow_err_t shm_all_reduce(flow_comm_t *c, const void *send, void *recv,
				 size_t count, flow_dtype_t dtype,
				 flow_diag_t *diag)
{
	shm_t *s = c->impl;
	size_t elem = flow_dtype_size(dtype), nchunks;
	ar_job_t a = {
		.in = send,
		.out = recv,
		.count = count,
		.chunk = s->buf_bytes / elem,
		.elem = elem,
		.align = elem < SHM_LINE ? SHM_LINE / elem : 1,
		.dtype = dtype,
		.stream = count * elem >= SHM_STREAM_BYTES,
	};

	if (count * elem <= SHM_SMALL_BYTES)
		return shm_all_reduce_small(c, s, send, recv, count, dtype,
					    diag);
	nchunks = (count + a.chunk - 1) / a.chunk;
	for (size_t k = 0; k <= nchunks + 1; k++) {
		flow_err_t err = shm_step_begin(c, s, diag);

		if (err != FLOW_OK)
			return err;
		if (k < nchunks)
			ar_stage(s, &a, k);
		if (k >= 1 && k <= nchunks)
			ar_sum(s, &a, k - 1);
		if (k >= 2)
			ar_collect(s, &a, k - 2);
		if (k <= nchunks)
			shm_arrive(s);
	}
	return FLOW_OK;
}

/* One reduce-scatter: byte offsets into the whole send vector. */
typedef struct rs_job {
	const unsigned char *in;
	unsigned char *out;
	size_t total, mine_lo, mine_hi, chunk, elem;
	flow_dtype_t dtype;
} rs_job_t;

/* Stage chunk k, except the part in my own block, summed from send. */
static void rs_stage(shm_t *s, const rs_job_t *j, size_t k)
{
	size_t lo = k * j->chunk, hi = min_size(lo + j->chunk, j->total);
	size_t a = clamp_size(j->mine_lo, lo, hi);
	size_t b = clamp_size(j->mine_hi, a, hi);
	unsigned char *buf = shm_buf(s, s->me, s->step);

	memcpy(buf, j->in + lo, a - lo);
	memcpy(buf + (b - lo), j->in + b, hi - b);
}

/* Sum the part of chunk k, staged a step ago, that is in my block. */
static void rs_sum(shm_t *s, const rs_job_t *j, size_t k)
{
	size_t lo = k * j->chunk, hi = min_size(lo + j->chunk, j->total);
	size_t a = clamp_size(j->mine_lo, lo, hi);
	size_t b = clamp_size(j->mine_hi, a, hi);

	if (a == b)
		return;
	for (int m = 0; m < s->n; m++)
		s->srcs[m] = m == s->me ? j->in + a
					: shm_buf(s, m, s->step - 1) + (a - lo);
	flow_comm_sum_n(j->out + (a - j->mine_lo), s->srcs, s->n,
			(b - a) / j->elem, j->dtype);
}

/* The whole send vector moves through the buffers chunk by chunk; each
 * member sums the part of a chunk that falls in its own block straight
 * into recv. */
static flow_err_t shm_reduce_scatter(flow_comm_t *c, const void *send,
				     void *recv, const size_t *counts,
				     flow_dtype_t dtype, flow_diag_t *diag)
{
	shm_t *s = c->impl;
	size_t elem = flow_dtype_size(dtype), nchunks;
	rs_job_t j = {
		.in = send,
		.out = recv,
		.chunk = s->buf_bytes,
		.elem = elem,
		.dtype = dtype,
	};

	for (int m = 0; m < s->n; m++) {
		if (m == s->me)
			j.mine_lo = j.total;
		j.total += counts[m] * elem;
	}
	j.mine_hi = j.mine_lo + counts[s->me] * elem;
	nchunks = (j.total + j.chunk - 1) / j.chunk;
	for (size_t k = 0; nchunks > 0 && k <= nchunks; k++) {
		flow_err_t err = shm_step_begin(c, s, diag);

		if (err != FLOW_OK)
			return err;
		if (k < nchunks)
			rs_stage(s, &j, k);
		if (k >= 1)
			rs_sum(s, &j, k - 1);
		if (k < nchunks)
			shm_arrive(s);
	}
	return FLOW_OK;
}

/* Round r: every member stages piece r of its block; everyone copies the
 * pieces of round r-1 out. */
static flow_err_t shm_all_gather(flow_comm_t *c, const void *send, void *recv,
				 const size_t *counts, flow_dtype_t dtype,
				 flow_diag_t *diag)
{
	shm_t *s = c->impl;
	size_t elem = flow_dtype_size(dtype), piece = s->buf_bytes;
	size_t most = 0, rounds, mine = counts[s->me] * elem, off_me = 0;
	size_t total = 0;
	unsigned char *out = recv;
	bool stream;

	for (int j = 0; j < s->n; j++) {
		if (j < s->me)
			off_me += counts[j] * elem;
		if (counts[j] * elem > most)
			most = counts[j] * elem;
		total += counts[j] * elem;
	}
	stream = total >= SHM_STREAM_BYTES;
	rounds = (most + piece - 1) / piece;
	for (size_t r = 0; rounds > 0 && r <= rounds; r++) {
		flow_err_t err = shm_step_begin(c, s, diag);

		if (err != FLOW_OK)
			return err;
		if (r < rounds && r * piece < mine)
			memcpy(shm_buf(s, s->me, s->step),
			       (const unsigned char *)send + r * piece,
			       min_size(piece, mine - r * piece));
		if (r >= 1) {
			size_t off = 0, at = (r - 1) * piece;

			for (int j = 0; j < s->n; j++) {
				size_t len = counts[j] * elem;

				if (j != s->me && at < len)
					copy_out(out + off + at,
						 shm_buf(s, j, s->step - 1),
						 min_size(piece, len - at),
						 stream);
				off += len;
			}
		}
		if (r < rounds)
			shm_arrive(s);
	}
	if (mine > 0)
		memcpy(out + off_me, send, mine);
	return FLOW_OK;
}

/* All-to-all round r on this member: stage piece r of every block it sends
 * to another member in that member's region of its buffer. */
static void a2a_stage(shm_t *s, const unsigned char *in,
		      const size_t *send_counts, size_t elem, size_t region,
		      size_t r)
{
	unsigned char *buf = shm_buf(s, s->me, s->step);
	size_t off = 0, at = r * region;

	for (int j = 0; j < s->n; j++) {
		size_t len = send_counts[j] * elem;

		if (j != s->me && at < len)
			memcpy(buf + (size_t)j * region, in + off + at,
			       min_size(region, len - at));
		off += len;
	}
}

/* ... and copy out what the others staged for it in round r. */
static void a2a_collect(shm_t *s, unsigned char *out,
			const size_t *recv_counts, size_t elem, size_t region,
			size_t r)
{
	size_t off = 0, at = r * region;

	for (int j = 0; j < s->n; j++) {
		size_t len = recv_counts[j] * elem;

		if (j != s->me && at < len)
			memcpy(out + off + at,
			       shm_buf(s, j, s->step - 1) +
				       (size_t)s->me * region,
			       min_size(region, len - at));
		off += len;
	}
}

/* Each buffer holds one region per destination.  The number of rounds
 * depends on counts no member sees in full, so every member publishes what
 * it needs in the first step, next to the buffer of that step. */
static flow_err_t shm_all_to_all(flow_comm_t *c, const void *send,
				 const size_t *send_counts, void *recv,
				 const size_t *recv_counts, flow_dtype_t dtype,
				 flow_diag_t *diag)
{
	shm_t *s = c->impl;
	size_t elem = flow_dtype_size(dtype);
	size_t region = round_down(s->buf_bytes / (size_t)s->n, SHM_LINE);
	size_t mine = 0, rounds = 0, soff = 0, roff = 0;
	const unsigned char *in = send;
	unsigned char *out = recv;

	for (int j = 0; j < s->n; j++) {
		size_t need = (send_counts[j] * elem + region - 1) / region;

		if (j != s->me && need > mine)
			mine = need;
		if (j < s->me) {
			soff += send_counts[j] * elem;
			roff += recv_counts[j] * elem;
		}
	}
	for (size_t r = 0;; r++) {
		flow_err_t err = shm_step_begin(c, s, diag);

		if (err != FLOW_OK)
			return err;
		if (r == 0)
			atomic_store_explicit(
				&s->members[s->me].rounds[s->step % SHM_NBUF],
				mine, memory_order_relaxed);
		for (int j = 0; r == 1 && j < s->n; j++) {
			uint64_t x = atomic_load_explicit(
				&s->members[j].rounds[(s->step - 1) % SHM_NBUF],
				memory_order_relaxed);

			if (x > rounds)
				rounds = (size_t)x;
		}
		if (r == 0 || r < rounds)
			a2a_stage(s, in, send_counts, elem, region, r);
		if (r >= 1 && r - 1 < rounds)
			a2a_collect(s, out, recv_counts, elem, region, r - 1);
		if (r >= 1 && r >= rounds)
			break;
		shm_arrive(s);
	}
	if (recv_counts[s->me] > 0)
		memcpy(out + roff, in + soff, recv_counts[s->me] * elem);
	return FLOW_OK;
}

static flow_err_t shm_broadcast(flow_comm_t *c, void *buf, size_t count,
				flow_dtype_t dtype, int root,
				flow_diag_t *diag)
{
	shm_t *s = c->impl;
	size_t bytes = count * flow_dtype_size(dtype), chunk = s->buf_bytes;
	size_t nchunks = (bytes + chunk - 1) / chunk;
	unsigned char *data = buf;
	bool stream = bytes >= SHM_STREAM_BYTES;

	for (size_t k = 0; nchunks > 0 && k <= nchunks; k++) {
		flow_err_t err = shm_step_begin(c, s, diag);

		if (err != FLOW_OK)
			return err;
		if (s->me == root && k < nchunks)
			memcpy(shm_buf(s, root, s->step), data + k * chunk,
			       min_size(chunk, bytes - k * chunk));
		if (s->me != root && k >= 1)
			copy_out(data + (k - 1) * chunk,
				 shm_buf(s, root, s->step - 1),
				 min_size(chunk, bytes - (k - 1) * chunk),
				 stream);
		if (k < nchunks)
			shm_arrive(s);
	}
	return FLOW_OK;
}

static flow_err_t shm_barrier(flow_comm_t *c, flow_diag_t *diag)
{
	shm_t *s = c->impl;
	flow_err_t err = shm_step_begin(c, s, diag);

	if (err != FLOW_OK)
		return err;
	shm_arrive(s);
	return shm_step_begin(c, s, diag);
}

/* ---- point to point ------------------------------------------------------ */

static void ring_put(unsigned char *ring, size_t cap, uint64_t pos,
		     const void *src, size_t len)
{
	size_t at = (size_t)(pos % cap), first = min_size(len, cap - at);

	memcpy(ring + at, src, first);
	memcpy(ring, (const unsigned char *)src + first, len - first);
}

static void ring_get(void *dst, const unsigned char *ring, size_t cap,
		     uint64_t pos, size_t len)
{
	size_t at = (size_t)(pos % cap), first = min_size(len, cap - at);

	memcpy(dst, ring + at, first);
	memcpy((unsigned char *)dst + first, ring, len - first);
}

static size_t round_up_line(size_t x)
{
	return (x + SHM_LINE - 1) / SHM_LINE * SHM_LINE;
}

/* Wait until the ring has room for len more bytes after head. */
static flow_err_t ring_wait_room(flow_comm_t *c, shm_t *s, shm_pair_t *p,
				 uint64_t head, size_t len, int peer,
				 flow_diag_t *diag)
{
	uint64_t end = head + len;
	shm_cond_t w = {
		.var = &p->tail,
		.target = end > s->ring_bytes ? end - s->ring_bytes : 0,
		.word = &p->word,
		.sleepers = &p->sleepers,
		.peer = peer,
	};
	return shm_wait(c, s, &w, diag);
}

/* Wait until the ring holds len bytes after tail. */
static flow_err_t ring_wait_data(flow_comm_t *c, shm_t *s, shm_pair_t *p,
				 uint64_t tail, size_t len, int peer,
				 flow_diag_t *diag)
{
	shm_cond_t w = {
		.var = &p->head,
		.target = tail + len,
		.word = &p->word,
		.sleepers = &p->sleepers,
		.peer = peer,
	};
	return shm_wait(c, s, &w, diag);
}

/* A frame, then the payload padded to a line, streamed in quarters of the
 * ring so that the receiver copies out while the sender copies in. */
static flow_err_t shm_send(flow_comm_t *c, const void *buf, size_t bytes,
			   int peer, flow_diag_t *diag)
{
	shm_t *s = c->impl;
	shm_pair_t *p = shm_pair(s, s->me, peer);
	unsigned char *ring = shm_ring(p);
	size_t cap = s->ring_bytes, step = cap / 4, padded, pos = 0;
	uint64_t head = atomic_load_explicit(&p->head, memory_order_relaxed);
	shm_frame_t f = { .seq = c->p2p_sent[peer] + 1, .bytes = bytes };
	flow_err_t err;

	padded = round_up_line(bytes);
	err = ring_wait_room(c, s, p, head, sizeof(f), peer, diag);
	if (err != FLOW_OK)
		return err;
	ring_put(ring, cap, head, &f, sizeof(f));
	head += sizeof(f);
	atomic_store_explicit(&p->head, head, memory_order_release);
	shm_signal(&p->word, &p->sleepers);
	while (pos < padded) {
		size_t len = min_size(step, padded - pos);

		err = ring_wait_room(c, s, p, head, len, peer, diag);
		if (err != FLOW_OK)
			return err;
		if (pos < bytes)
			ring_put(ring, cap, head,
				 (const unsigned char *)buf + pos,
				 min_size(len, bytes - pos));
		pos += len;
		head += len;
		atomic_store_explicit(&p->head, head, memory_order_release);
		shm_signal(&p->word, &p->sleepers);
	}
	c->p2p_sent[peer]++;
	return FLOW_OK;
}

static flow_err_t shm_recv(flow_comm_t *c, void *buf, size_t bytes, int peer,
			   flow_diag_t *diag)
{
	shm_t *s = c->impl;
	shm_pair_t *p = shm_pair(s, peer, s->me);
	const unsigned char *ring = shm_ring(p);
	size_t cap = s->ring_bytes, padded, pos = 0;
	uint64_t tail = atomic_load_explicit(&p->tail, memory_order_relaxed);
	uint64_t expect = c->p2p_recvd[peer] + 1;
	shm_frame_t f;
	flow_err_t err;

	err = ring_wait_data(c, s, p, tail, sizeof(f), peer, diag);
	if (err != FLOW_OK)
		return err;
	ring_get(&f, ring, cap, tail, sizeof(f));
	if (f.seq != expect)
		return flow_comm_peer_fail(c, diag, peer,
					   "sent message #%" PRIu64
					   " where #%" PRIu64 " was expected",
					   f.seq, expect);
	if (f.bytes != bytes)
		return flow_comm_peer_fail(c, diag, peer,
					   "sent %" PRIu64
					   " bytes where %zu were expected",
					   f.bytes, bytes);
	tail += sizeof(f);
	atomic_store_explicit(&p->tail, tail, memory_order_release);
	shm_signal(&p->word, &p->sleepers);
	padded = round_up_line(bytes);
	while (pos < padded) {
		uint64_t head;
		size_t len;

		err = ring_wait_data(c, s, p, tail, SHM_LINE, peer, diag);
		if (err != FLOW_OK)
			return err;
		head = atomic_load_explicit(&p->head, memory_order_acquire);
		len = min_size((size_t)(head - tail), padded - pos);
		if (pos < bytes)
			ring_get((unsigned char *)buf + pos, ring, cap, tail,
				 min_size(len, bytes - pos));
		pos += len;
		tail += len;
		atomic_store_explicit(&p->tail, tail, memory_order_release);
		shm_signal(&p->word, &p->sleepers);
	}
	c->p2p_recvd[peer]++;
	return FLOW_OK;
}

/* ---- setup and teardown -------------------------------------------------- */

static void shm_release(shm_t *s)
{
	if (s->base != NULL)
		munmap(s->base, s->map_bytes);
	if (s->owns_name)
		shm_unlink(s->name);
	free(s->srcs);
	free(s);
}

static void shm_destroy(flow_comm_t *c)
{
	if (c->impl != NULL)
		shm_release(c->impl);
	c->impl = NULL;
}

static void setup_pause(void)
{
	struct timespec ts = { 0, SHM_SETUP_POLL_NS };

	nanosleep(&ts, NULL);
}

static flow_err_t shm_map(flow_comm_t *c, shm_t *s, int fd, int flags,
			  flow_diag_t *diag)
{
	void *p = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE,
		       MAP_SHARED | flags, fd, 0);

	if (p == MAP_FAILED)
		return flow_comm_fail(c, diag, FLOW_ERR_IO,
				      "cannot map shared memory segment '%s': %s",
				      s->name, strerror(errno));
	s->base = p;
	shm_bind(s);
	return FLOW_OK;
}

/* Member 0: create, size and fill the segment, publish it, and unlink the
 * name once every member has mapped it. */
static flow_err_t shm_create(flow_comm_t *c, shm_t *s, flow_diag_t *diag)
{
	double deadline = flow_comm_deadline(c);
	shm_hdr_t *h;
	flow_err_t err;
	int fd, rc;

	fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0 && errno == EEXIST)
		return flow_comm_fail(c, diag, FLOW_ERR_IO,
				      "shared memory segment '%s' already exists",
				      s->name);
	if (fd < 0)
		return flow_comm_fail(c, diag, FLOW_ERR_IO,
				      "cannot create shared memory segment '%s': %s",
				      s->name, strerror(errno));
	s->owns_name = true;
	/* Allocate every page now: a full tmpfs would otherwise kill a
	 * member with SIGBUS in the middle of a collective. */
	if (ftruncate(fd, (off_t)s->map_bytes) != 0)
		rc = errno;
	else
		rc = posix_fallocate(fd, 0, (off_t)s->map_bytes);
	if (rc != 0) {
		close(fd);
		return flow_comm_fail(c, diag, FLOW_ERR_IO,
				      "cannot allocate %zu bytes for shared memory segment '%s': %s",
				      s->map_bytes, s->name, strerror(rc));
	}
	err = shm_map(c, s, fd, MAP_POPULATE, diag);
	close(fd);
	if (err != FLOW_OK)
		return err;
	h = (shm_hdr_t *)s->base;
	h->version = SHM_VERSION;
	h->size = (uint32_t)s->n;
	h->id = c->id;
	h->buf_bytes = s->buf_bytes;
	h->ring_bytes = s->ring_bytes;
	h->total_bytes = s->map_bytes;
	h->creator_pid = (int64_t)getpid();
	atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);

	for (int j = 1; j < s->n;) {
		if (atomic_load_explicit(&s->members[j].attached,
					 memory_order_acquire) != 0) {
			j++;
			continue;
		}
		if (!flow_comm_peer_alive(c, j))
			return flow_comm_peer_fail(c, diag, j, "died");
		if (flow_comm_now() >= deadline)
			return flow_comm_timed_out(c, diag, j);
		setup_pause();
	}
	shm_unlink(s->name);
	s->owns_name = false;
	return FLOW_OK;
}

static flow_err_t shm_check_header(flow_comm_t *c, shm_t *s,
				   flow_diag_t *diag)
{
	const shm_hdr_t *h = s->hdr;
	int creator = flow_world_pid_of(c->world, c->world_ranks[0]);

	if (h->version != SHM_VERSION || h->size != (uint32_t)s->n ||
	    h->id != c->id || h->buf_bytes != s->buf_bytes ||
	    h->ring_bytes != s->ring_bytes ||
	    h->total_bytes != s->map_bytes || h->creator_pid != creator)
		return flow_comm_fail(c, diag, FLOW_ERR_IO,
				      "shared memory segment '%s' was not made for this communicator (creator pid %" PRId64 ", expected %d)",
				      s->name, h->creator_pid, creator);
	return FLOW_OK;
}

/* Member 0 died while setting up: remove the name it can no longer
 * remove (the segment's memory goes with the last mapping). */
static flow_err_t shm_creator_died(flow_comm_t *c, shm_t *s,
				   flow_diag_t *diag)
{
	shm_unlink(s->name);
	return flow_comm_peer_fail(c, diag, 0, "died");
}

/* Other members: wait for the segment to appear with its full size, map
 * it, wait for the header, and report the attachment. */
static flow_err_t shm_attach(flow_comm_t *c, shm_t *s, flow_diag_t *diag)
{
	double deadline = flow_comm_deadline(c);
	struct stat st;
	flow_err_t err;
	int fd;

	for (;;) {
		fd = shm_open(s->name, O_RDWR, 0);
		if (fd < 0 && errno != ENOENT)
			return flow_comm_fail(c, diag, FLOW_ERR_IO,
					      "cannot open shared memory segment '%s': %s",
					      s->name, strerror(errno));
		if (fd >= 0) {
			if (fstat(fd, &st) != 0) {
				err = flow_comm_fail(c, diag, FLOW_ERR_IO,
						     "cannot stat shared memory segment '%s': %s",
						     s->name, strerror(errno));
				close(fd);
				return err;
			}
			if ((size_t)st.st_size == s->map_bytes)
				break;
			close(fd);
			if (st.st_size != 0)
				return flow_comm_fail(c, diag, FLOW_ERR_IO,
						      "shared memory segment '%s' has %jd bytes, expected %zu",
						      s->name,
						      (intmax_t)st.st_size,
						      s->map_bytes);
		}
		if (!flow_comm_peer_alive(c, 0))
			return shm_creator_died(c, s, diag);
		if (flow_comm_now() >= deadline)
			return flow_comm_timed_out(c, diag, 0);
		setup_pause();
	}
	err = shm_map(c, s, fd, 0, diag);
	close(fd);
	if (err != FLOW_OK)
		return err;
	while (atomic_load_explicit(&s->hdr->magic, memory_order_acquire) !=
	       SHM_MAGIC) {
		if (!flow_comm_peer_alive(c, 0))
			return shm_creator_died(c, s, diag);
		if (flow_comm_now() >= deadline)
			return flow_comm_timed_out(c, diag, 0);
		setup_pause();
	}
	err = shm_check_header(c, s, diag);
	if (err != FLOW_OK)
		return err;
#ifdef MADV_POPULATE_WRITE
	/* Fault the pages in now rather than in the first collectives. */
	(void)madvise(s->base, s->map_bytes, MADV_POPULATE_WRITE);
#endif
	atomic_store_explicit(&s->members[s->me].attached, 1,
			      memory_order_release);
	if (!flow_comm_peer_alive(c, 0))
		return shm_creator_died(c, s, diag);
	return FLOW_OK;
}

static const flow_comm_ops_t shm_ops = {
	.transport = "shm",
	.all_reduce = shm_all_reduce,
	.reduce_scatter = shm_reduce_scatter,
	.all_gather = shm_all_gather,
	.all_to_all = shm_all_to_all,
	.broadcast = shm_broadcast,
	.send = shm_send,
	.recv = shm_recv,
	.barrier = shm_barrier,
	.destroy = shm_destroy,
};

flow_err_t flow_comm_shm_init(flow_comm_t *c, flow_diag_t *diag)
{
	const flow_world_info_t *info = flow_world_info(c->world);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	flow_err_t err;
	shm_t *s;

	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return flow_comm_fail(c, diag, FLOW_ERR_NOMEM,
				      "cannot allocate the shared-memory state");
	s->n = c->size;
	s->me = c->rank;
	s->spin_s = ncpu >= s->n ? SHM_SPIN_DEDICATED_S : SHM_SPIN_SHARED_S;
	snprintf(s->name, sizeof(s->name),
		 "/flow-%016" PRIx64 "-%016" PRIx64 "-%016" PRIx64,
		 info->job_hash, info->job_nonce, c->id);
	s->srcs = calloc((size_t)s->n, sizeof(*s->srcs));
	if (s->srcs == NULL) {
		err = flow_comm_fail(c, diag, FLOW_ERR_NOMEM,
				     "cannot allocate the shared-memory state");
		goto out_release;
	}
	if (shm_layout(s) != FLOW_OK) {
		err = flow_comm_fail(c, diag, FLOW_ERR_RANGE,
				     "shared memory for %d members is too large",
				     s->n);
		goto out_release;
	}
	err = s->me == 0 ? shm_create(c, s, diag) : shm_attach(c, s, diag);
	if (err != FLOW_OK)
		goto out_release;
	c->impl = s;
	c->ops = &shm_ops;
	return FLOW_OK;

out_release:
	shm_release(s);
	return err;
}
