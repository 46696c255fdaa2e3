/* The TCP transport of the CPU communicator, used when a communicator spans
 * nodes (and for any CPU communicator under FLOW_COMM_TRANSPORT=tcp): the
 * streams and the collectives, over the pair connections that
 * comm_tcp_conn.c makes and keeps (see there for the connections, the
 * hello and the setup of a communicator, and comm_tcp_internal.h for the
 * header of a message).
 *
 * Each stream of an operation starts with a header (magic, op,
 * communicator id, sequence number, bytes) that the receiver checks
 * against what it expects.
 *
 * All-reduce, reduce-scatter, all-gather and broadcast run as pipelined
 * rings or chains: one stream to the next rank and one from the previous,
 * progressed together with poll, where what is forwarded is what has
 * arrived (and been reduced) so far.  Small all-reduces and broadcasts
 * take log2(n) steps instead; all-to-all is n-1 pairwise exchanges; the
 * barrier a dissemination of empty messages.  Waits are cut into slices
 * of at most SLICE_S, after each of which the deadline, the liveness of
 * peers on this node and the hang-ups of every member's connection are
 * checked; a hang-up also ends a wait at once.  So a dead peer fails the
 * call on every rank within milliseconds, never at the deadline. */
#include <config.h>

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "comm_tcp_internal.h"

/* Reduction granularity: a received piece this big is summed while it is
 * still in cache, and forwarded once summed. */
#define CHUNK ((size_t)256 << 10)
/* Up to this, all-reduce and broadcast take log2(n) steps (recursive
 * doubling, a binomial tree) instead of the ring's 2(n-1) or the chain's
 * n-1: latency matters more than bandwidth there.  At most CHUNK (the
 * scratch buffer holds a whole message). */
#define SMALL_BYTES ((size_t)64 << 10)
#define SLICE_S 0.05
#define WATCH_MAX 64 /* see xfer_wait */

typedef struct tcp_comm {
	tcp_world_t *tw;
	char *scratch;      /* CHUNK bytes: in-place reduction input */
	char *work;         /* reduce-scatter partial sums */
	size_t work_cap;
	size_t *off;        /* [size+1]: block offsets, bytes */
	struct pollfd *pfd; /* [size]: hang-up sweep */
	int *pfd_rank;      /* [size] */
	struct pollfd *wpfd; /* [size+1]: waits */
	bool *quiet;        /* [size]: hung up with bytes queued, seen */
	struct sspan *ss;   /* [2*size]: send segments */
	struct rspan *rs;   /* [2*size]: receive segments */
} tcp_comm_t;

/* ---- streams ----------------------------------------------------------------
 * An operation on this rank is at most one outgoing and one incoming
 * stream at a time.  Each is a header and then a list of memory segments.
 * The outgoing stream may be gated on the incoming one: byte x of it may
 * go only once byte x - ungated of the incoming stream has arrived and been
 * reduced, which is how rings and chains forward what they received. */

typedef enum {
	RECV_COPY,       /* into dst */
	RECV_SUM_DIRECT, /* into dst, then dst += mine */
	RECV_SUM_SCRATCH /* into scratch, then dst += scratch */
} recv_mode_t;

typedef struct sspan {
	const char *ptr;
	size_t len;
} sspan_t;

typedef struct rspan {
	char *dst;
	const char *mine;
	size_t len;
	recv_mode_t mode;
} rspan_t;

typedef struct xfer {
	flow_comm_t *c;
	tcp_comm_t *tc;
	flow_dtype_t dtype;
	size_t elem;
	/* outgoing */
	int to, sfd;
	uint8_t shdr[TCP_HDR_SIZE];
	size_t shdr_done;
	const sspan_t *ss;
	int nss, si;
	size_t soff, sdone, stotal, ungated;
	/* incoming */
	int from, rfd;
	uint8_t rhdr[TCP_HDR_SIZE];
	size_t rhdr_got;
	tcp_hdr_t want;
	const rspan_t *rs;
	int nrs, ri;
	size_t roff, rproc, rdone, rtotal;
} xfer_t;

static void xfer_init(xfer_t *x, flow_comm_t *c, flow_dtype_t dtype)
{
	memset(x, 0, sizeof *x);
	x->c = c;
	x->tc = c->impl;
	x->dtype = dtype;
	x->elem = flow_dtype_size(dtype);
	x->to = x->from = -1;
	x->sfd = x->rfd = -1;
}

/* Outgoing stream to comm rank `to`, headed {op, comm id, seq, bytes}. */
static void xfer_send(xfer_t *x, int to, flow_comm_op_t op, uint64_t seq,
		      const sspan_t *ss, int nss, size_t ungated)
{
	x->to = to;
	x->ss = ss;
	x->nss = nss;
	x->si = 0;
	x->soff = x->sdone = x->shdr_done = 0;
	x->stotal = 0;
	for (int i = 0; i < nss; i++)
		x->stotal += ss[i].len;
	x->ungated = ungated;
	tcp_hdr_pack(x->shdr, op, x->c->id, seq, x->stotal);
}

static void xfer_recv(xfer_t *x, int from, flow_comm_op_t op, uint64_t seq,
		      const rspan_t *rs, int nrs)
{
	x->from = from;
	x->rs = rs;
	x->nrs = nrs;
	x->ri = 0;
	x->roff = x->rproc = x->rdone = x->rhdr_got = 0;
	x->rtotal = 0;
	for (int i = 0; i < nrs; i++)
		x->rtotal += rs[i].len;
	x->want = (tcp_hdr_t){ TCP_DATA_MAGIC, op, x->c->id, seq, x->rtotal };
}

static bool send_done(const xfer_t *x)
{
	return x->to < 0 ||
	       (x->shdr_done == TCP_HDR_SIZE && x->sdone == x->stotal);
}

static bool recv_done(const xfer_t *x)
{
	return x->from < 0 ||
	       (x->rhdr_got == TCP_HDR_SIZE && x->rdone == x->rtotal);
}

static size_t send_limit(const xfer_t *x)
{
	if (x->ungated >= x->stotal || x->from < 0)
		return x->stotal;
	/* No holding back for bigger pieces: what this rank holds back may
	 * be what the rank it waits on waits for.  Sums are forwarded a
	 * chunk at a time anyway. */
	size_t lim = x->ungated + x->rdone;
	return lim > x->stotal ? x->stotal : lim;
}

static flow_err_t peer_closed(flow_comm_t *c, int r, flow_diag_t *diag)
{
	/* A process's sockets close while it exits, a moment before its
	 * pidfd says so: give a peer on this node that moment, to tell a
	 * death from a close. */
	if (c->pidfds[r] >= 0) {
		struct pollfd p = { c->pidfds[r], POLLIN, 0 };
		(void)poll(&p, 1, 200);
	}
	if (!flow_comm_peer_alive(c, r))
		return flow_comm_peer_fail(c, diag, r, "died");
	return flow_comm_peer_fail(c, diag, r, "closed the connection");
}

static flow_err_t io_failed(flow_comm_t *c, int r, int st, bool sending,
			    flow_diag_t *diag)
{
	if (st == TCP_IO_CLOSED)
		return peer_closed(c, r, diag);
	return flow_comm_fail(c, diag, FLOW_ERR_IO,
			      "cannot %s peer rank %d (%s): %s",
			      sending ? "send to" : "receive from",
			      tcp_wrank(c, r), tcp_host_of(c, r),
			      strerror(errno));
}

/* Advance over what was written: header first, then the segments. */
static void send_advance(xfer_t *x, size_t n)
{
	size_t h = TCP_HDR_SIZE - x->shdr_done;
	h = h > n ? n : h;
	x->shdr_done += h;
	n -= h;
	x->sdone += n;
	while (n > 0 || (x->si < x->nss && x->soff == x->ss[x->si].len)) {
		size_t left = x->ss[x->si].len - x->soff;
		size_t take = left > n ? n : left;
		x->soff += take;
		n -= take;
		if (x->soff == x->ss[x->si].len) {
			x->si++;
			x->soff = 0;
			if (x->si == x->nss)
				break;
		}
	}
}

/* Write as much as the socket and the gate allow.  Sets *progress. */
static int send_some(xfer_t *x, bool *progress)
{
	while (!send_done(x)) {
		size_t lim = send_limit(x);
		struct iovec iov[4];
		int k = 0;
		if (x->shdr_done < TCP_HDR_SIZE)
			iov[k++] = (struct iovec){
				x->shdr + x->shdr_done,
				TCP_HDR_SIZE - x->shdr_done };
		size_t avail = lim - x->sdone, off = x->soff;
		for (int j = x->si; j < x->nss && k < 4 && avail > 0; j++) {
			size_t take = x->ss[j].len - off;
			take = take > avail ? avail : take;
			if (take)
				iov[k++] = (struct iovec){
					(void *)(x->ss[j].ptr + off), take };
			avail -= take;
			off = 0;
		}
		if (k == 0)
			return TCP_IO_WAIT; /* gated */
		struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)k };
		ssize_t n = sendmsg(x->sfd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return tcp_io_failure(errno);
		}
		*progress = true;
		send_advance(x, (size_t)n);
	}
	return TCP_IO_DONE;
}

/* Sum or copy what arrived of the current segment, a chunk at a time. */
static void recv_process(xfer_t *x)
{
	const rspan_t *s = &x->rs[x->ri];
	for (;;) {
		size_t ready = x->roff - x->rproc;
		bool end = x->roff == s->len;
		size_t k = ready > CHUNK ? CHUNK : ready;
		if (k == 0 || (s->mode != RECV_COPY && k < CHUNK && !end))
			break;
		if (s->mode == RECV_SUM_DIRECT)
			flow_comm_sum_into(s->dst + x->rproc,
					   s->mine + x->rproc, k / x->elem,
					   x->dtype);
		else if (s->mode == RECV_SUM_SCRATCH)
			flow_comm_sum_into(s->dst + x->rproc, x->tc->scratch,
					   k / x->elem, x->dtype);
		if (s->mode == RECV_COPY)
			k = ready;
		x->rproc += k;
		x->rdone += k;
	}
	if (x->rproc == s->len) {
		x->ri++;
		x->roff = x->rproc = 0;
	}
}

/* Where the next received bytes go, and how many may go there now. */
static char *recv_target(const xfer_t *x, size_t *len)
{
	const rspan_t *s = &x->rs[x->ri];
	size_t left = s->len - x->roff;
	size_t pend = x->roff - x->rproc;
	if (s->mode == RECV_COPY) {
		*len = left;
		return s->dst + x->roff;
	}
	/* Summing: stop at the chunk boundary so the chunk is summed while
	 * it is in cache (and the scratch holds one chunk). */
	*len = CHUNK - pend < left ? CHUNK - pend : left;
	if (s->mode == RECV_SUM_SCRATCH)
		return x->tc->scratch + pend;
	return s->dst + x->roff;
}

static flow_err_t header_mismatch(xfer_t *x, flow_diag_t *diag);

static int recv_some(xfer_t *x, bool *progress, flow_err_t *err,
		     flow_diag_t *diag)
{
	/* A few chunks at most, then let the outgoing stream move. */
	for (int rounds = 0; rounds < 4 && !recv_done(x); rounds++) {
		if (x->rhdr_got < TCP_HDR_SIZE) {
			int st = tcp_io_read(x->rfd, x->rhdr, TCP_HDR_SIZE,
					 &x->rhdr_got);
			if (st != TCP_IO_DONE)
				return st;
			*progress = true;
			tcp_hdr_t h = tcp_hdr_unpack(x->rhdr);
			if (memcmp(&h, &x->want, sizeof h) != 0) {
				*err = header_mismatch(x, diag);
				return TCP_IO_ERROR;
			}
			continue;
		}
		while (x->ri < x->nrs && x->rs[x->ri].len == 0)
			x->ri++;
		size_t len;
		char *dst = recv_target(x, &len);
		ssize_t n = recv(x->rfd, dst, len, MSG_DONTWAIT);
		if (n == 0)
			return TCP_IO_CLOSED;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return tcp_io_failure(errno);
		}
		*progress = true;
		x->roff += (size_t)n;
		recv_process(x);
	}
	return recv_done(x) ? TCP_IO_DONE : TCP_IO_WAIT;
}

static const char *op_name(uint32_t op)
{
	return op <= FLOW_OP_SETUP ? flow_comm_op_name((flow_comm_op_t)op)
				   : "an unknown operation";
}

static flow_err_t header_mismatch(xfer_t *x, flow_diag_t *diag)
{
	flow_comm_t *c = x->c;
	int r = x->from, w = tcp_wrank(c, r);
	tcp_hdr_t h = tcp_hdr_unpack(x->rhdr), *e = &x->want;
	if (h.magic != TCP_DATA_MAGIC)
		return flow_comm_fail(c, diag, FLOW_ERR_PEER,
				      "peer rank %d (%s) sent bytes that are "
				      "not a flow header (magic 0x%08x): the "
				      "streams are out of step",
				      w, tcp_host_of(c, r), h.magic);
	if (h.op == FLOW_OP_NONE)
		return flow_comm_peer_fail(c, diag, r,
					   "freed its communicators and "
					   "closed the connection");
	if (h.id != e->id)
		return flow_comm_fail(c, diag, FLOW_ERR_PEER,
				      "peer rank %d (%s) is in %s #%llu of "
				      "another communicator (ranks must use "
				      "communicators in the same order)",
				      w, tcp_host_of(c, r), op_name(h.op),
				      (unsigned long long)h.seq);
	if (h.op != e->op || h.seq != e->seq)
		return flow_comm_fail(c, diag, FLOW_ERR_PEER,
				      "peer rank %d (%s) is in %s #%llu "
				      "instead (ranks must call collectives "
				      "in the same order)",
				      w, tcp_host_of(c, r), op_name(h.op),
				      (unsigned long long)h.seq);
	return flow_comm_fail(c, diag, FLOW_ERR_USAGE,
			      "peer rank %d (%s) sends a %llu-byte stream "
			      "where this rank expects %llu: the ranks passed "
			      "different counts",
			      w, tcp_host_of(c, r), (unsigned long long)h.bytes,
			      (unsigned long long)e->bytes);
}

/* Every member's connection: EOF or a reset without a goodbye first means
 * the peer is gone, even one this operation is not waiting on (it would
 * be, soon, through someone else). */
static flow_err_t sweep(flow_comm_t *c, flow_diag_t *diag)
{
	tcp_comm_t *tc = c->impl;
	int dead = flow_comm_first_dead_peer(c);
	if (dead >= 0)
		return flow_comm_peer_fail(c, diag, dead, "died");
	int k = 0;
	for (int r = 0; r < c->size; r++) {
		int fd = tc->tw->fd[tcp_wrank(c, r)];
		if (r == c->rank || fd < 0)
			continue;
		tc->pfd[k] = (struct pollfd){ fd, POLLRDHUP, 0 };
		tc->pfd_rank[k++] = r;
	}
	if (poll(tc->pfd, (nfds_t)k, 0) <= 0)
		return FLOW_OK;
	for (int i = 0; i < k; i++) {
		if (!(tc->pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)))
			continue;
		uint8_t b[TCP_HDR_SIZE];
		ssize_t n = recv(tc->pfd[i].fd, b, sizeof b,
				 MSG_PEEK | MSG_DONTWAIT);
		/* Bytes still queued (data, or a goodbye): not a failure
		 * yet; reading them will tell.  Not watched again in this
		 * step, or every wait would wake at once. */
		if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) {
			tc->quiet[tc->pfd_rank[i]] = true;
			continue;
		}
		return peer_closed(c, tc->pfd_rank[i], diag);
	}
	return FLOW_OK;
}

static flow_err_t xfer_check(xfer_t *x, double now, flow_diag_t *diag)
{
	if (now > flow_comm_deadline(x->c))
		return flow_comm_timed_out(x->c, diag,
					   !recv_done(x) ? x->from : x->to);
	return sweep(x->c, diag);
}

static flow_err_t xfer_fds(xfer_t *x, flow_diag_t *diag)
{
	tcp_world_t *tw = x->tc->tw;
	int ends[2] = { x->to, x->from };
	for (int i = 0; i < 2; i++) {
		if (ends[i] < 0)
			continue;
		int fd = tw->fd[tcp_wrank(x->c, ends[i])];
		if (fd < 0)
			return flow_comm_fail(x->c, diag, FLOW_ERR_PEER,
					      "no connection to peer rank %d "
					      "(%s): it was closed after an "
					      "earlier failure",
					      tcp_wrank(x->c, ends[i]),
					      tcp_host_of(x->c, ends[i]));
		if (i == 0)
			x->sfd = fd;
		else
			x->rfd = fd;
	}
	return FLOW_OK;
}

/* A poll timeout until t: at least 1 ms, at most a slice. */
static int ms_until(double t, double now)
{
	double ms = (t - now) * 1e3;
	if (ms < 1)
		return 1;
	if (ms > SLICE_S * 1e3)
		return (int)(SLICE_S * 1e3);
	return (int)ms;
}

/* Sleep until a stream can move, a slice ends, or (in communicators of
 * up to WATCH_MAX ranks) any member hangs up: then every rank hears of a
 * death at once, before the ranks that saw it first fail and close their
 * own connections, which would make the others blame them. */
static flow_err_t xfer_wait(xfer_t *x, double now, double next_check,
			    flow_diag_t *diag)
{
	flow_comm_t *c = x->c;
	tcp_comm_t *tc = x->tc;
	struct pollfd *p = tc->wpfd;
	int k = 0;
	if (!send_done(x) &&
	    (x->shdr_done < TCP_HDR_SIZE || send_limit(x) > x->sdone))
		p[k++] = (struct pollfd){ x->sfd, POLLOUT, 0 };
	if (!recv_done(x) && k == 1 && x->rfd == x->sfd)
		p[0].events |= POLLIN;
	else if (!recv_done(x))
		p[k++] = (struct pollfd){ x->rfd, POLLIN, 0 };
	int active = k;
	for (int r = 0; c->size <= WATCH_MAX && r < c->size; r++) {
		int fd = tc->tw->fd[tcp_wrank(c, r)];
		/* The incoming stream's EOF shows as POLLIN already. */
		if (r != c->rank && r != x->from && fd >= 0 && !tc->quiet[r])
			p[k++] = (struct pollfd){ fd, POLLRDHUP, 0 };
	}
	if (poll(p, (nfds_t)k, ms_until(next_check, now)) < 0)
		return errno == EINTR ? FLOW_OK
				      : flow_comm_fail(c, diag, FLOW_ERR_IO,
						       "poll failed: %s",
						       strerror(errno));
	for (int i = active; i < k; i++)
		if (p[i].revents)
			return sweep(c, diag);
	return FLOW_OK;
}

/* Move both streams to the end, or fail. */
static flow_err_t xfer_run(xfer_t *x, flow_diag_t *diag)
{
	flow_err_t err = xfer_fds(x, diag);
	double next_check = flow_comm_now() + SLICE_S;
	memset(x->tc->quiet, 0, (size_t)x->c->size * sizeof *x->tc->quiet);
	while (!err) {
		bool progress = false;
		int ss = TCP_IO_DONE, rs = TCP_IO_DONE;
		if (!send_done(x))
			ss = send_some(x, &progress);
		if (ss < 0)
			return io_failed(x->c, x->to, ss, true, diag);
		if (!recv_done(x))
			rs = recv_some(x, &progress, &err, diag);
		if (err)
			return err;
		if (rs < 0)
			return io_failed(x->c, x->from, rs, false, diag);
		if (send_done(x) && recv_done(x))
			return FLOW_OK;
		double now = flow_comm_now();
		if (now >= next_check) {
			err = xfer_check(x, now, diag);
			next_check = now + SLICE_S;
		}
		if (!progress && !err)
			err = xfer_wait(x, now, next_check, diag);
	}
	return err;
}

/* ---- collectives --------------------------------------------------------- */

static int mod(int a, int n)
{
	return ((a % n) + n) % n;
}

/* Offsets of blocks given in elements (counts) or, when counts is NULL,
 * of count elements split as evenly as possible, first blocks larger. */
static void block_offsets(tcp_comm_t *tc, int n, const size_t *counts,
			  size_t count, size_t elem)
{
	size_t un = (size_t)n;
	tc->off[0] = 0;
	for (int i = 0; i < n; i++) {
		size_t b = counts ? counts[i]
				  : count / un + ((size_t)i < count % un);
		tc->off[i + 1] = tc->off[i] + b * elem;
	}
}

static size_t blen(const tcp_comm_t *tc, int b)
{
	return tc->off[b + 1] - tc->off[b];
}

/* The reduce-scatter half of a ring: after it, block `me` of acc holds the
 * sum.  Step s sends block me-s-1 and receives block me-s-2, which is
 * summed with this rank's own block of `mine`.  Appends to the spans. */
static void ring_reduce_scatter_spans(flow_comm_t *c, const char *mine,
				      char *acc, char *last, bool in_place,
				      int *nss, int *nrs)
{
	tcp_comm_t *tc = c->impl;
	int n = c->size, me = c->rank;
	for (int s = 0; s < n - 1; s++) {
		int sb = mod(me - s - 1, n), rb = mod(me - s - 2, n);
		const char *src = s == 0 ? mine : acc;
		char *dst = s == n - 2 ? last : acc + tc->off[rb];
		tc->ss[(*nss)++] = (sspan_t){ src + tc->off[sb], blen(tc, sb) };
		tc->rs[(*nrs)++] = (rspan_t){
			dst, mine + tc->off[rb], blen(tc, rb),
			in_place ? RECV_SUM_SCRATCH : RECV_SUM_DIRECT };
	}
}

/* The all-gather ring: step s sends block me-s and receives me-s-1. */
static void ring_all_gather_spans(flow_comm_t *c, const char *first,
				  char *buf, int *nss, int *nrs)
{
	tcp_comm_t *tc = c->impl;
	int n = c->size, me = c->rank;
	for (int s = 0; s < n - 1; s++) {
		int sb = mod(me - s, n), rb = mod(me - s - 1, n);
		const char *src = s == 0 ? first : buf + tc->off[sb];
		tc->ss[(*nss)++] = (sspan_t){ src, blen(tc, sb) };
		tc->rs[(*nrs)++] = (rspan_t){ buf + tc->off[rb], NULL,
					      blen(tc, rb), RECV_COPY };
	}
}

static flow_err_t ring_run(flow_comm_t *c, flow_dtype_t dtype, int nss,
			   int nrs, flow_diag_t *diag)
{
	tcp_comm_t *tc = c->impl;
	xfer_t x;
	xfer_init(&x, c, dtype);
	xfer_send(&x, (c->rank + 1) % c->size, c->op, c->seq, tc->ss, nss,
		  tc->ss[0].len);
	xfer_recv(&x, mod(c->rank - 1, c->size), c->op, c->seq, tc->rs, nrs);
	return xfer_run(&x, diag);
}

/* One step of a small algorithm: up to `bytes` to `to` and from `from`
 * (-1: none), at the same time. */
static flow_err_t exchange(flow_comm_t *c, int to, const void *sbuf, int from,
			   void *rbuf, size_t bytes, flow_diag_t *diag)
{
	sspan_t ss = { sbuf, bytes };
	rspan_t rs = { rbuf, NULL, bytes, RECV_COPY };
	xfer_t x;
	xfer_init(&x, c, FLOW_DTYPE_U8);
	if (to >= 0)
		xfer_send(&x, to, c->op, c->seq, &ss, 1, SIZE_MAX);
	if (from >= 0)
		xfer_recv(&x, from, c->op, c->seq, &rs, 1);
	return xfer_run(&x, diag);
}

/* Recursive doubling over the largest power of two p2 <= n; ranks from p2
 * on first fold into rank - p2 and get the result back at the end.  The
 * two ranks of an exchange compute a + b and b + a, equal in IEEE
 * arithmetic (and in the once-rounded bf16/f16 sums), so every rank still
 * ends with the same bits. */
static flow_err_t all_reduce_small(flow_comm_t *c, const void *send,
				   void *recv, size_t count,
				   flow_dtype_t dtype, flow_diag_t *diag)
{
	tcp_comm_t *tc = c->impl;
	int n = c->size, me = c->rank, p2 = 1;
	size_t bytes = count * flow_dtype_size(dtype);
	flow_err_t err = FLOW_OK;
	while (p2 * 2 <= n)
		p2 *= 2;
	if (send != recv)
		memcpy(recv, send, bytes);
	if (me >= p2) {
		err = exchange(c, me - p2, recv, -1, NULL, bytes, diag);
		return err ? err
			   : exchange(c, -1, NULL, me - p2, recv, bytes, diag);
	}
	if (me + p2 < n) {
		err = exchange(c, -1, NULL, me + p2, tc->scratch, bytes, diag);
		if (!err)
			flow_comm_sum_into(recv, tc->scratch, count, dtype);
	}
	for (int mask = 1; mask < p2 && !err; mask <<= 1) {
		err = exchange(c, me ^ mask, recv, me ^ mask, tc->scratch,
			       bytes, diag);
		if (!err)
			flow_comm_sum_into(recv, tc->scratch, count, dtype);
	}
	if (!err && me + p2 < n)
		err = exchange(c, me + p2, recv, -1, NULL, bytes, diag);
	return err;
}

/* Ring reduce-scatter then ring all-gather, as one pipelined stream each
 * way.  Every block is summed by one rank and copied to the others, so all
 * ranks get the same bits.  Out of place, received pieces land in recv and
 * this rank's part is added there (a + b == b + a in IEEE arithmetic). */
static flow_err_t tcp_all_reduce(flow_comm_t *c, const void *send, void *recv,
				 size_t count, flow_dtype_t dtype,
				 flow_diag_t *diag)
{
	tcp_comm_t *tc = c->impl;
	size_t elem = flow_dtype_size(dtype);
	int nss = 0, nrs = 0;
	bool in_place = send == recv;
	if (count * elem <= SMALL_BYTES)
		return all_reduce_small(c, send, recv, count, dtype, diag);
	block_offsets(tc, c->size, NULL, count, elem);
	char *owned = (char *)recv + tc->off[c->rank];
	ring_reduce_scatter_spans(c, send, recv, owned, in_place, &nss, &nrs);
	ring_all_gather_spans(c, owned, recv, &nss, &nrs);
	return ring_run(c, dtype, nss, nrs, diag);
}

static flow_err_t work_reserve(flow_comm_t *c, size_t bytes,
			       flow_diag_t *diag)
{
	tcp_comm_t *tc = c->impl;
	if (bytes <= tc->work_cap)
		return FLOW_OK;
	free(tc->work);
	tc->work = malloc(bytes);
	tc->work_cap = tc->work ? bytes : 0;
	if (!tc->work)
		return flow_comm_fail(c, diag, FLOW_ERR_NOMEM,
				      "out of memory for %zu bytes of partial "
				      "sums", bytes);
	return FLOW_OK;
}

/* The reduce-scatter half of the ring; partial sums of other ranks' blocks
 * live in a work buffer (send is read-only), the last one lands in recv. */
static flow_err_t tcp_reduce_scatter(flow_comm_t *c, const void *send,
				     void *recv, const size_t *counts,
				     flow_dtype_t dtype, flow_diag_t *diag)
{
	tcp_comm_t *tc = c->impl;
	size_t elem = flow_dtype_size(dtype);
	int nss = 0, nrs = 0;
	block_offsets(tc, c->size, counts, 0, elem);
	flow_err_t err = work_reserve(c, tc->off[c->size], diag);
	if (err)
		return err;
	ring_reduce_scatter_spans(c, send, tc->work, recv, false, &nss, &nrs);
	return ring_run(c, dtype, nss, nrs, diag);
}

static flow_err_t tcp_all_gather(flow_comm_t *c, const void *send, void *recv,
				 const size_t *counts, flow_dtype_t dtype,
				 flow_diag_t *diag)
{
	tcp_comm_t *tc = c->impl;
	size_t elem = flow_dtype_size(dtype);
	int nss = 0, nrs = 0;
	block_offsets(tc, c->size, counts, 0, elem);
	memcpy((char *)recv + tc->off[c->rank], send, blen(tc, c->rank));
	ring_all_gather_spans(c, send, recv, &nss, &nrs);
	return ring_run(c, dtype, nss, nrs, diag);
}

/* n-1 pairwise steps: step k sends to me+k and receives from me-k. */
static flow_err_t tcp_all_to_all(flow_comm_t *c, const void *send,
				 const size_t *send_counts, void *recv,
				 const size_t *recv_counts, flow_dtype_t dtype,
				 flow_diag_t *diag)
{
	tcp_comm_t *tc = c->impl;
	size_t elem = flow_dtype_size(dtype);
	int n = c->size, me = c->rank;
	size_t *soff = tc->off;
	size_t roff_me = 0, soff_me;
	block_offsets(tc, n, send_counts, 0, elem);
	soff_me = soff[me];
	for (int j = 0; j < me; j++)
		roff_me += recv_counts[j] * elem;
	memcpy((char *)recv + roff_me, (const char *)send + soff_me,
	       recv_counts[me] * elem);
	for (int k = 1; k < n; k++) {
		int to = (me + k) % n, from = mod(me - k, n);
		size_t ro = 0;
		for (int j = 0; j < from; j++)
			ro += recv_counts[j] * elem;
		sspan_t ss = { (const char *)send + soff[to],
			       soff[to + 1] - soff[to] };
		rspan_t rs = { (char *)recv + ro, NULL,
			       recv_counts[from] * elem, RECV_COPY };
		xfer_t x;
		xfer_init(&x, c, dtype);
		xfer_send(&x, to, c->op, c->seq, &ss, 1, SIZE_MAX);
		xfer_recv(&x, from, c->op, c->seq, &rs, 1);
		flow_err_t err = xfer_run(&x, diag);
		if (err)
			return err;
	}
	return FLOW_OK;
}

/* A binomial tree: receive from the parent (this rank's position relative
 * to the root without its lowest set bit), then send to the children. */
static flow_err_t broadcast_small(flow_comm_t *c, void *buf, size_t bytes,
				  int root, flow_diag_t *diag)
{
	int n = c->size, v = mod(c->rank - root, n), mask = 1;
	flow_err_t err = FLOW_OK;
	for (; mask < n; mask <<= 1) {
		if (v & mask) {
			err = exchange(c, -1, NULL, (v - mask + root) % n, buf,
				       bytes, diag);
			break;
		}
	}
	for (mask >>= 1; mask > 0 && !err; mask >>= 1)
		if (v + mask < n)
			err = exchange(c, (v + mask + root) % n, buf, -1, NULL,
				       bytes, diag);
	return err;
}

/* Larger messages go down a pipelined chain from the root: each rank
 * forwards what it has received to the next while more arrives. */
static flow_err_t tcp_broadcast(flow_comm_t *c, void *buf, size_t count,
				flow_dtype_t dtype, int root,
				flow_diag_t *diag)
{
	int n = c->size, pos = mod(c->rank - root, n);
	size_t bytes = count * flow_dtype_size(dtype);
	if (bytes <= SMALL_BYTES)
		return broadcast_small(c, buf, bytes, root, diag);
	sspan_t ss = { buf, bytes };
	rspan_t rs = { buf, NULL, bytes, RECV_COPY };
	xfer_t x;
	xfer_init(&x, c, dtype);
	if (pos < n - 1)
		xfer_send(&x, (c->rank + 1) % n, c->op, c->seq, &ss, 1,
			  pos == 0 ? SIZE_MAX : 0);
	if (pos > 0)
		xfer_recv(&x, mod(c->rank - 1, n), c->op, c->seq, &rs, 1);
	return xfer_run(&x, diag);
}

/* Dissemination: round k sends a header to me+2^k and waits for one from
 * me-2^k; after ceil(log2 n) rounds every rank has heard from all. */
static flow_err_t tcp_barrier(flow_comm_t *c, flow_diag_t *diag)
{
	int n = c->size;
	for (int k = 1; k < n; k <<= 1) {
		xfer_t x;
		xfer_init(&x, c, FLOW_DTYPE_U8);
		xfer_send(&x, (c->rank + k) % n, c->op, c->seq, NULL, 0,
			  SIZE_MAX);
		xfer_recv(&x, mod(c->rank - k, n), c->op, c->seq, NULL, 0);
		flow_err_t err = xfer_run(&x, diag);
		if (err)
			return err;
	}
	return FLOW_OK;
}

/* Point to point messages are numbered per ordered pair, so a send and a
 * recv match in program order; both carry op "send".  The counters count
 * completed messages (the core names the running one counter + 1). */
static flow_err_t tcp_send(flow_comm_t *c, const void *buf, size_t bytes,
			   int peer, flow_diag_t *diag)
{
	sspan_t ss = { buf, bytes };
	xfer_t x;
	xfer_init(&x, c, FLOW_DTYPE_U8);
	xfer_send(&x, peer, FLOW_OP_SEND, c->p2p_sent[peer] + 1, &ss, 1,
		  SIZE_MAX);
	flow_err_t err = xfer_run(&x, diag);
	if (!err)
		c->p2p_sent[peer]++;
	return err;
}

static flow_err_t tcp_recv(flow_comm_t *c, void *buf, size_t bytes, int peer,
			   flow_diag_t *diag)
{
	rspan_t rs = { buf, NULL, bytes, RECV_COPY };
	xfer_t x;
	xfer_init(&x, c, FLOW_DTYPE_U8);
	xfer_recv(&x, peer, FLOW_OP_SEND, c->p2p_recvd[peer] + 1, &rs, 1);
	flow_err_t err = xfer_run(&x, diag);
	if (!err)
		c->p2p_recvd[peer]++;
	return err;
}

/* ---- construction and destruction ---------------------------------------- */

static void tcp_comm_free(tcp_comm_t *tc)
{
	if (!tc)
		return;
	free(tc->rs);
	free(tc->ss);
	free(tc->quiet);
	free(tc->wpfd);
	free(tc->pfd_rank);
	free(tc->pfd);
	free(tc->off);
	free(tc->work);
	free(tc->scratch);
	free(tc);
}

static tcp_comm_t *tcp_comm_new(int n)
{
	tcp_comm_t *tc = calloc(1, sizeof *tc);
	if (!tc)
		return NULL;
	size_t un = (size_t)n;
	tc->scratch = malloc(CHUNK);
	tc->off = malloc((un + 1) * sizeof *tc->off);
	tc->pfd = malloc(un * sizeof *tc->pfd);
	tc->pfd_rank = malloc(un * sizeof *tc->pfd_rank);
	tc->wpfd = malloc((un + 1) * sizeof *tc->wpfd);
	tc->quiet = calloc(un, sizeof *tc->quiet);
	tc->ss = malloc(2 * un * sizeof *tc->ss);
	tc->rs = malloc(2 * un * sizeof *tc->rs);
	if (!tc->scratch || !tc->off || !tc->pfd || !tc->pfd_rank ||
	    !tc->wpfd || !tc->quiet || !tc->ss || !tc->rs) {
		tcp_comm_free(tc);
		return NULL;
	}
	return tc;
}

static void tcp_destroy(flow_comm_t *c)
{
	tcp_comm_t *tc = c->impl;
	if (!tc)
		return;
	flow_comm_tcp_pairs_close(c, tc->tw, c->failed);
	tcp_comm_free(tc);
	c->impl = NULL;
}

static const flow_comm_ops_t tcp_ops = {
	.transport = "tcp",
	.all_reduce = tcp_all_reduce,
	.reduce_scatter = tcp_reduce_scatter,
	.all_gather = tcp_all_gather,
	.all_to_all = tcp_all_to_all,
	.broadcast = tcp_broadcast,
	.send = tcp_send,
	.recv = tcp_recv,
	.barrier = tcp_barrier,
	.destroy = tcp_destroy,
};

flow_err_t flow_comm_tcp_init(flow_comm_t *c, flow_diag_t *diag)
{
	tcp_comm_t *tc = tcp_comm_new(c->size);
	if (!tc)
		return flow_comm_fail(c, diag, FLOW_ERR_NOMEM, "out of memory");
	flow_err_t err = flow_comm_tcp_pairs_open(c, &tc->tw, diag);
	if (err) {
		tcp_comm_free(tc);
		return err;
	}
	c->ops = &tcp_ops;
	c->impl = tc;
	return FLOW_OK;
}
