/* The TCP transport of the CPU communicator, used when a communicator spans
 * nodes (and for any CPU communicator under FLOW_COMM_TRANSPORT=tcp).
 *
 * Connections belong to pairs of world ranks and are shared by every TCP
 * communicator of a world: a per-world table in this file holds them, and a
 * pair is closed when the last communicator on this rank that contains both
 * ranks goes.  The higher world rank connects to the lower one, trying each
 * address the lower one published; each side checks the other's hello
 * (magic, version, ranks, job), so a connection that lands on the wrong
 * process is dropped.  Every communicator setup then exchanges a request
 * and an acknowledgement on each of its pairs: that proves the connection
 * is live on both sides (a pair the peer closed earlier, when its last
 * communicator with us went, is replaced by a fresh one) and that both
 * sides build the same communicator.
 *
 * Each stream of an operation starts with a 32-byte header (magic, op,
 * communicator id, sequence number, bytes) that the receiver checks
 * against what it expects.  A rank that frees its last communicator with a
 * peer sends a goodbye header before closing, so the peer can tell that
 * close from a crash.
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
 * call on every rank within milliseconds, never at the deadline.
 *
 * Integers in headers are little-endian; payloads are raw host memory
 * (every node of a job has the same byte order). */
#include <config.h>

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <flow/log.h>

#include "comm_internal.h"

#define HDR_SIZE 32
#define DATA_MAGIC 0x54574c46u  /* "FLWT" little-endian */
#define HELLO_MAGIC 0x48574c46u /* "FLWH" */
#define TCP_VERSION 1u
#define HELLO_REQUEST 0u
#define HELLO_REPLY 1u
#define SETUP_REQUEST 0u /* seq field of the setup header */
#define SETUP_ACK 1u

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
#define CONNECT_S 2.0      /* one connect attempt to one address */
#define HELLO_WAIT_S 5.0   /* the hello reply after connecting */
#define RETRY_S 0.1        /* pause after every address failed */
#define PENDING_MAX_S 30.0 /* an accepted socket that never says hello */
#define MAX_ADDRS 32

/* ---- the per-world table of pair connections ----------------------------- */

typedef struct tcp_pending {
	int fd;
	size_t got;
	double since;
	uint8_t buf[HDR_SIZE];
} tcp_pending_t;

typedef struct tcp_world {
	struct tcp_world *next;
	flow_world_t *world;
	int size, me;
	uint64_t job_hash;
	int ncomms;  /* live TCP communicators of this world */
	int *fd;     /* [size]: connection to each world rank, or -1 */
	int *refs;   /* [size]: live communicators containing that rank */
	tcp_pending_t *pending; /* accepted, hello not yet read */
	int npending, cap_pending;
} tcp_world_t;

/* Communicators of one world are used from one thread; the lock only
 * keeps the registry itself consistent. */
static tcp_world_t *worlds;
static pthread_mutex_t worlds_lock = PTHREAD_MUTEX_INITIALIZER;

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

/* ---- small helpers ------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return le32toh(v);
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

typedef struct hdr {
	uint32_t magic, op;
	uint64_t id, seq, bytes;
} hdr_t;

static void hdr_pack(uint8_t *p, uint32_t op, uint64_t id, uint64_t seq,
		     uint64_t bytes)
{
	put32(p, DATA_MAGIC);
	put32(p + 4, op);
	put64(p + 8, id);
	put64(p + 16, seq);
	put64(p + 24, bytes);
}

static hdr_t hdr_unpack(const uint8_t *p)
{
	hdr_t h = { get32(p), get32(p + 4), get64(p + 8), get64(p + 16),
		    get64(p + 24) };
	return h;
}

static bool hdr_is_bye(const uint8_t *p)
{
	hdr_t h = hdr_unpack(p);
	return h.magic == DATA_MAGIC && h.op == FLOW_OP_NONE;
}

/* Hello: magic, version, from, to (world ranks), job hash, world size,
 * kind (request or reply). */
static void hello_pack(uint8_t *p, const tcp_world_t *tw, int to,
		       uint32_t kind)
{
	put32(p, HELLO_MAGIC);
	put32(p + 4, TCP_VERSION);
	put32(p + 8, (uint32_t)tw->me);
	put32(p + 12, (uint32_t)to);
	put64(p + 16, tw->job_hash);
	put32(p + 24, (uint32_t)tw->size);
	put32(p + 28, kind);
}

/* NULL when the hello is one this rank accepts from world rank `from`
 * (-1: any higher rank), else why not. */
static const char *hello_check(const uint8_t *p, const tcp_world_t *tw,
			       int from, uint32_t kind)
{
	uint32_t sender = get32(p + 8);
	if (get32(p) != HELLO_MAGIC)
		return "not a flow hello";
	if (get32(p + 4) != TCP_VERSION)
		return "another protocol version";
	if (get64(p + 16) != tw->job_hash ||
	    get32(p + 24) != (uint32_t)tw->size)
		return "another job";
	if (get32(p + 12) != (uint32_t)tw->me || get32(p + 28) != kind)
		return "meant for another rank";
	bool expected = from >= 0 ? sender == (uint32_t)from
				  : sender > (uint32_t)tw->me &&
					    sender < (uint32_t)tw->size;
	if (!expected)
		return "from an unexpected rank";
	return NULL;
}

/* Buffer sizes are left to the kernel's autotuning: a fixed SO_SNDBUF or
 * SO_RCVBUF turns it off, is capped by net.core.[rw]mem_max (208 KiB on
 * many distributions, less than a fast link needs), and 4 MiB measured no
 * faster than autotuning on loopback. */
static void sock_tune(int fd)
{
	int one = 1;
	/* Best effort: a kernel that refuses still works, more slowly. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

enum { IO_DONE = 1, IO_WAIT = 0, IO_CLOSED = -1, IO_ERROR = -2 };

static bool errno_is_closed(int e)
{
	return e == ECONNRESET || e == EPIPE || e == ENOTCONN ||
	       e == ECONNABORTED || e == ETIMEDOUT;
}

/* Read until *got == want.  IO_ERROR leaves errno set. */
static int io_read(int fd, uint8_t *buf, size_t want, size_t *got)
{
	while (*got < want) {
		ssize_t n = recv(fd, buf + *got, want - *got, MSG_DONTWAIT);
		if (n > 0) {
			*got += (size_t)n;
			continue;
		}
		if (n == 0)
			return IO_CLOSED;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return IO_WAIT;
		return errno_is_closed(errno) ? IO_CLOSED : IO_ERROR;
	}
	return IO_DONE;
}

static int io_write(int fd, const uint8_t *buf, size_t len, size_t *done)
{
	while (*done < len) {
		ssize_t n = send(fd, buf + *done, len - *done,
				 MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n >= 0) {
			*done += (size_t)n;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return IO_WAIT;
		return errno_is_closed(errno) ? IO_CLOSED : IO_ERROR;
	}
	return IO_DONE;
}

static int ms_until(double t, double now)
{
	double ms = (t - now) * 1e3;
	if (ms < 1)
		return 1;
	if (ms > SLICE_S * 1e3)
		return (int)(SLICE_S * 1e3);
	return (int)ms;
}

static int wrank(const flow_comm_t *c, int r)
{
	return c->world_ranks[r];
}

static const char *host_of(const flow_comm_t *c, int r)
{
	return flow_world_host_of(c->world, wrank(c, r));
}

/* ---- the registry ----------------------------------------------------------
 * Called with worlds_lock held. */

static void pair_close(tcp_world_t *tw, int w, bool bye)
{
	if (tw->fd[w] < 0)
		return;
	if (bye) {
		uint8_t h[HDR_SIZE];
		hdr_pack(h, FLOW_OP_NONE, 0, 0, 0);
		/* Best effort: with nothing left unread on either side the
		 * goodbye fits in the socket buffer. */
		(void)send(tw->fd[w], h, sizeof h, MSG_DONTWAIT | MSG_NOSIGNAL);
	} else {
		(void)shutdown(tw->fd[w], SHUT_RDWR);
	}
	close(tw->fd[w]);
	tw->fd[w] = -1;
}

/* Keeps the order of arrival: of two connections from one rank, the
 * later one must win. */
static void pending_remove(tcp_world_t *tw, int i, bool close_it)
{
	if (close_it)
		close(tw->pending[i].fd);
	memmove(&tw->pending[i], &tw->pending[i + 1],
		(size_t)(tw->npending - i - 1) * sizeof tw->pending[0]);
	tw->npending--;
}

static void tw_free(tcp_world_t *tw)
{
	for (tcp_world_t **p = &worlds; *p; p = &(*p)->next) {
		if (*p == tw) {
			*p = tw->next;
			break;
		}
	}
	for (int w = 0; w < tw->size; w++)
		pair_close(tw, w, true);
	while (tw->npending > 0)
		pending_remove(tw, tw->npending - 1, true);
	free(tw->pending);
	free(tw->refs);
	free(tw->fd);
	free(tw);
}

static tcp_world_t *tw_get(flow_world_t *w)
{
	for (tcp_world_t *tw = worlds; tw; tw = tw->next)
		if (tw->world == w)
			return tw;
	const flow_world_info_t *info = flow_world_info(w);
	tcp_world_t *tw = calloc(1, sizeof *tw);
	if (!tw)
		return NULL;
	tw->fd = malloc((size_t)info->size * sizeof *tw->fd);
	tw->refs = calloc((size_t)info->size, sizeof *tw->refs);
	if (!tw->fd || !tw->refs) {
		free(tw->refs);
		free(tw->fd);
		free(tw);
		return NULL;
	}
	for (int i = 0; i < info->size; i++)
		tw->fd[i] = -1;
	tw->world = w;
	tw->size = info->size;
	tw->me = info->rank;
	tw->job_hash = info->job_hash ^ info->job_nonce;
	tw->next = worlds;
	worlds = tw;
	return tw;
}

/* ---- accepting ----------------------------------------------------------- */

static int set_nonblock_cloexec(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -1;
	return fcntl(fd, F_SETFD, FD_CLOEXEC);
}

static flow_err_t accept_new(flow_comm_t *c, tcp_world_t *tw, double now,
			     flow_diag_t *diag)
{
	int lfd = flow_world_listen_fd(tw->world);
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return FLOW_OK;
			return flow_comm_fail(c, diag, FLOW_ERR_IO,
					      "cannot accept a connection: %s",
					      strerror(errno));
		}
		if (set_nonblock_cloexec(fd) < 0 ||
		    (tw->npending == tw->cap_pending &&
		     tw->cap_pending >= 1 << 16)) {
			close(fd);
			continue;
		}
		if (tw->npending == tw->cap_pending) {
			int cap = tw->cap_pending ? 2 * tw->cap_pending : 8;
			tcp_pending_t *p = realloc(tw->pending,
						   (size_t)cap * sizeof *p);
			if (!p) {
				close(fd);
				return flow_comm_fail(c, diag, FLOW_ERR_NOMEM,
						      "out of memory");
			}
			tw->pending = p;
			tw->cap_pending = cap;
		}
		sock_tune(fd);
		tw->pending[tw->npending++] =
			(tcp_pending_t){ fd, 0, now, { 0 } };
	}
}

/* Read the hellos that arrived; answer and keep the good ones.  A newer
 * connection from a rank replaces the one held: that rank dropped the old
 * one (it gave up waiting, or it closed its last communicator with us). */
static void read_hellos(tcp_world_t *tw, double now)
{
	for (int i = 0; i < tw->npending;) {
		tcp_pending_t *p = &tw->pending[i];
		int st = io_read(p->fd, p->buf, HDR_SIZE, &p->got);
		if (st == IO_WAIT && now - p->since < PENDING_MAX_S) {
			i++;
			continue;
		}
		const char *why = st == IO_DONE ? hello_check(p->buf, tw, -1,
							      HELLO_REQUEST)
			      : st == IO_WAIT ? "no hello in time"
					      : "closed before its hello";
		uint8_t reply[HDR_SIZE];
		size_t done = 0;
		if (!why) {
			hello_pack(reply, tw, (int)get32(p->buf + 8),
				   HELLO_REPLY);
			if (io_write(p->fd, reply, sizeof reply, &done) !=
			    IO_DONE)
				why = "could not answer its hello";
		}
		if (why) {
			flow_log(FLOW_LOG_DEBUG,
				 "tcp: dropping an accepted connection: %s",
				 why);
			pending_remove(tw, i, true);
			continue;
		}
		int w = (int)get32(p->buf + 8);
		if (tw->fd[w] >= 0)
			flow_log(FLOW_LOG_DEBUG,
				 "tcp: rank %d reconnected; replacing its "
				 "connection", w);
		pair_close(tw, w, false);
		tw->fd[w] = p->fd;
		pending_remove(tw, i, false);
	}
}

/* ---- communicator setup ----------------------------------------------------
 * Each member pair is a small state machine; one loop advances them all
 * together with the accepting, so no order of arrival can deadlock. */

enum {
	ST_DONE = 0,
	ST_CONNECT,    /* higher side: start an attempt (after retry_at) */
	ST_CONNECTING, /* waiting for the connect to finish */
	ST_HELLO,      /* hello sent, waiting for the reply */
	ST_REQUEST,    /* setup request being sent */
	ST_ACK_WAIT,   /* waiting for the acknowledgement */
	ST_REQ_WAIT,   /* lower side: waiting for the request */
	ST_ACK_SEND,   /* sending the acknowledgement */
};

typedef struct setup_peer {
	int state;
	int fd;        /* the socket of a connect attempt, until it is kept */
	int rfd;       /* the pair connection the partial input came from */
	int naddr, addr_i;
	double attempt_end, retry_at;
	struct sockaddr_in addr[MAX_ADDRS];
	uint8_t in[HDR_SIZE], out[HDR_SIZE];
	size_t in_got, out_done;
} setup_peer_t;

/* "A,B,C:PORT" from flow_world_addr_of. */
static bool parse_addrs(const char *s, setup_peer_t *sp)
{
	const char *colon = strrchr(s, ':');
	char *end;
	if (!colon)
		return false;
	errno = 0;
	long port = strtol(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || port <= 0 || port > 65535)
		return false;
	sp->naddr = 0;
	for (const char *p = s; p < colon;) {
		const char *comma = memchr(p, ',', (size_t)(colon - p));
		const char *stop = comma ? comma : colon;
		char ip[INET_ADDRSTRLEN];
		size_t len = (size_t)(stop - p);
		if (len == 0 || len >= sizeof ip || sp->naddr == MAX_ADDRS)
			return false;
		memcpy(ip, p, len);
		ip[len] = '\0';
		struct sockaddr_in *a = &sp->addr[sp->naddr++];
		memset(a, 0, sizeof *a);
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		if (inet_pton(AF_INET, ip, &a->sin_addr) != 1)
			return false;
		p = stop + 1;
	}
	return sp->naddr > 0;
}

static void request_prepare(flow_comm_t *c, setup_peer_t *sp, int state)
{
	hdr_pack(sp->out, FLOW_OP_SETUP, c->id,
		 state == ST_REQUEST ? SETUP_REQUEST : SETUP_ACK,
		 (uint64_t)c->size);
	sp->out_done = 0;
	sp->in_got = 0;
	sp->state = state;
}

/* The current connect attempt failed: next address, or a pause after the
 * last one.  The peer may simply not be in this setup yet. */
static void attempt_failed(setup_peer_t *sp, int w, double now,
			   const char *why)
{
	char ip[INET_ADDRSTRLEN] = "?";
	inet_ntop(AF_INET, &sp->addr[sp->addr_i].sin_addr, ip, sizeof ip);
	flow_log(FLOW_LOG_DEBUG, "tcp: connecting to rank %d at %s: %s", w,
		 ip, why);
	if (sp->fd >= 0)
		close(sp->fd);
	sp->fd = -1;
	sp->state = ST_CONNECT;
	if (++sp->addr_i == sp->naddr) {
		sp->addr_i = 0;
		sp->retry_at = now + RETRY_S;
	}
}

/* The pair connection turned out closed by the peer (goodbye, EOF or
 * reset): drop it; the higher side reconnects, the lower one waits. */
static void stale_pair(tcp_world_t *tw, setup_peer_t *sp, int w, bool higher)
{
	flow_log(FLOW_LOG_DEBUG,
		 "tcp: connection to rank %d was closed by it; %s", w,
		 higher ? "reconnecting" : "waiting for a new one");
	pair_close(tw, w, false);
	sp->in_got = 0;
	sp->rfd = -1;
	if (higher) {
		sp->state = ST_CONNECT;
		sp->addr_i = 0;
		sp->retry_at = 0;
	} else {
		sp->state = ST_REQ_WAIT;
	}
}

static void connect_start(setup_peer_t *sp, int w, double now)
{
	sp->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (sp->fd < 0) {
		attempt_failed(sp, w, now, strerror(errno));
		return;
	}
	sock_tune(sp->fd);
	sp->attempt_end = now + CONNECT_S;
	sp->state = ST_CONNECTING;
	if (connect(sp->fd, (struct sockaddr *)&sp->addr[sp->addr_i],
		    sizeof sp->addr[0]) < 0 &&
	    errno != EINPROGRESS)
		attempt_failed(sp, w, now, strerror(errno));
}

static void connect_check(tcp_world_t *tw, setup_peer_t *sp, int w,
			  double now)
{
	struct pollfd p = { sp->fd, POLLOUT, 0 };
	int err = 0;
	socklen_t len = sizeof err;
	if (poll(&p, 1, 0) <= 0) {
		if (now > sp->attempt_end)
			attempt_failed(sp, w, now, "connect timed out");
		return;
	}
	if (getsockopt(sp->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	if (err) {
		attempt_failed(sp, w, now, strerror(err));
		return;
	}
	hello_pack(sp->out, tw, w, HELLO_REQUEST);
	sp->out_done = 0;
	/* A fresh socket's buffer takes 32 bytes at once. */
	if (io_write(sp->fd, sp->out, HDR_SIZE, &sp->out_done) != IO_DONE) {
		attempt_failed(sp, w, now, "cannot send the hello");
		return;
	}
	sp->in_got = 0;
	sp->attempt_end = now + HELLO_WAIT_S;
	sp->state = ST_HELLO;
}

static void hello_wait(flow_comm_t *c, tcp_world_t *tw, setup_peer_t *sp,
		       int w, double now)
{
	int st = io_read(sp->fd, sp->in, HDR_SIZE, &sp->in_got);
	if (st == IO_WAIT) {
		if (now > sp->attempt_end)
			attempt_failed(sp, w, now, "no hello reply in time");
		return;
	}
	const char *why = st == IO_DONE ? hello_check(sp->in, tw, w,
						      HELLO_REPLY)
					: "closed before replying";
	if (why) {
		attempt_failed(sp, w, now, why);
		return;
	}
	pair_close(tw, w, false);
	tw->fd[w] = sp->fd;
	sp->fd = -1;
	request_prepare(c, sp, ST_REQUEST);
}

/* What the peer sent instead of the expected setup header. */
static flow_err_t setup_mismatch(flow_comm_t *c, int r, const uint8_t *in,
				 flow_diag_t *diag)
{
	hdr_t h = hdr_unpack(in);
	if (h.magic == DATA_MAGIC && h.op == FLOW_OP_SETUP)
		return flow_comm_fail(c, diag, FLOW_ERR_PEER,
				      "peer rank %d (%s) is setting up another "
				      "communicator (id %016llx, %llu ranks) "
				      "than this one (id %016llx, %d ranks)",
				      wrank(c, r), host_of(c, r),
				      (unsigned long long)h.id,
				      (unsigned long long)h.bytes,
				      (unsigned long long)c->id, c->size);
	if (h.magic == DATA_MAGIC)
		return flow_comm_fail(c, diag, FLOW_ERR_PEER,
				      "peer rank %d (%s) sent %s #%llu while "
				      "this rank sets up a communicator",
				      wrank(c, r), host_of(c, r),
				      flow_comm_op_name((flow_comm_op_t)h.op),
				      (unsigned long long)h.seq);
	return flow_comm_fail(c, diag, FLOW_ERR_PEER,
			      "peer rank %d (%s) sent bytes that are not a "
			      "flow header (magic 0x%08x)",
			      wrank(c, r), host_of(c, r), h.magic);
}

static bool setup_hdr_ok(const flow_comm_t *c, const uint8_t *in,
			 uint64_t kind)
{
	hdr_t h = hdr_unpack(in);
	return h.magic == DATA_MAGIC && h.op == FLOW_OP_SETUP &&
	       h.id == c->id && h.seq == kind && h.bytes == (uint64_t)c->size;
}

/* Exchange of the request and its acknowledgement on a pair connection. */
static flow_err_t exchange_step(flow_comm_t *c, tcp_world_t *tw,
				setup_peer_t *sp, int r, flow_diag_t *diag)
{
	int w = wrank(c, r);
	bool higher = tw->me > w;
	int fd = tw->fd[w];
	int st;
	if (fd < 0)
		return FLOW_OK; /* lower side: wait for a connection */
	if (sp->rfd != fd) {
		/* A new connection replaced the one a partial read was on. */
		sp->rfd = fd;
		sp->in_got = 0;
		if (!higher)
			sp->state = ST_REQ_WAIT;
	}
	if (sp->state == ST_REQUEST || sp->state == ST_ACK_SEND) {
		st = io_write(fd, sp->out, HDR_SIZE, &sp->out_done);
		if (st == IO_DONE)
			sp->state = sp->state == ST_REQUEST ? ST_ACK_WAIT
							     : ST_DONE;
	} else {
		st = io_read(fd, sp->in, HDR_SIZE, &sp->in_got);
		if (st == IO_DONE && hdr_is_bye(sp->in))
			st = IO_CLOSED;
		else if (st == IO_DONE &&
			 !setup_hdr_ok(c, sp->in,
				       higher ? SETUP_ACK : SETUP_REQUEST))
			return setup_mismatch(c, r, sp->in, diag);
		else if (st == IO_DONE && higher)
			sp->state = ST_DONE;
		else if (st == IO_DONE)
			request_prepare(c, sp, ST_ACK_SEND);
	}
	if (st == IO_CLOSED)
		stale_pair(tw, sp, w, higher);
	else if (st == IO_ERROR)
		return flow_comm_fail(c, diag, FLOW_ERR_IO,
				      "connection to peer rank %d (%s) failed: "
				      "%s", w, host_of(c, r), strerror(errno));
	return FLOW_OK;
}

static flow_err_t peer_step(flow_comm_t *c, tcp_world_t *tw,
			    setup_peer_t *sp, int r, double now,
			    flow_diag_t *diag)
{
	int w = wrank(c, r);
	switch (sp->state) {
	case ST_CONNECT:
		if (now >= sp->retry_at)
			connect_start(sp, w, now);
		return FLOW_OK;
	case ST_CONNECTING:
		connect_check(tw, sp, w, now);
		return FLOW_OK;
	case ST_HELLO:
		hello_wait(c, tw, sp, w, now);
		return FLOW_OK;
	case ST_DONE:
		return FLOW_OK;
	default:
		return exchange_step(c, tw, sp, r, diag);
	}
}

static flow_err_t peers_init(flow_comm_t *c, tcp_world_t *tw,
			     setup_peer_t *sp, flow_diag_t *diag)
{
	/* All first: setup_failed closes them after an early return. */
	for (int r = 0; r < c->size; r++)
		sp[r].fd = -1;
	for (int r = 0; r < c->size; r++) {
		int w = wrank(c, r);
		sp[r].rfd = tw->fd[w];
		if (r == c->rank) {
			sp[r].state = ST_DONE;
		} else if (w > tw->me) {
			sp[r].state = ST_REQ_WAIT;
		} else {
			/* Parsed even with a connection in hand: it may turn
			 * out stale and need replacing. */
			const char *a = flow_world_addr_of(c->world, w);
			if (!parse_addrs(a, &sp[r]))
				return flow_comm_fail(
					c, diag, FLOW_ERR_FORMAT,
					"cannot parse the address '%s' of peer "
					"rank %d (%s)", a, w, host_of(c, r));
			if (tw->fd[w] >= 0)
				request_prepare(c, &sp[r], ST_REQUEST);
			else
				sp[r].state = ST_CONNECT;
		}
	}
	return FLOW_OK;
}

/* Wake up on anything the state machines wait for. */
static int setup_pollset(const flow_comm_t *c, const tcp_world_t *tw,
			 const setup_peer_t *sp, struct pollfd *pfd)
{
	int k = 0;
	int lfd = flow_world_listen_fd(tw->world);
	pfd[k++] = (struct pollfd){ lfd, POLLIN, 0 };
	for (int i = 0; i < tw->npending; i++)
		pfd[k++] = (struct pollfd){ tw->pending[i].fd, POLLIN, 0 };
	for (int r = 0; r < c->size; r++) {
		int fd = -1;
		short ev = POLLIN;
		switch (sp[r].state) {
		case ST_CONNECTING:
			fd = sp[r].fd;
			ev = POLLOUT;
			break;
		case ST_HELLO:
			fd = sp[r].fd;
			break;
		case ST_REQUEST:
		case ST_ACK_SEND:
			ev = POLLOUT;
			/* fall through */
		case ST_ACK_WAIT:
		case ST_REQ_WAIT:
			fd = tw->fd[wrank(c, r)];
			break;
		default:
			break;
		}
		if (fd >= 0)
			pfd[k++] = (struct pollfd){ fd, ev, 0 };
	}
	return k;
}

static int first_pending_peer(const flow_comm_t *c, const setup_peer_t *sp)
{
	for (int r = 0; r < c->size; r++)
		if (sp[r].state != ST_DONE)
			return r;
	return -1;
}

static flow_err_t setup_loop(flow_comm_t *c, tcp_world_t *tw,
			     setup_peer_t *sp, flow_diag_t *diag)
{
	struct pollfd *pfd = NULL;
	int cap = 0;
	flow_err_t err = FLOW_OK;
	for (;;) {
		double now = flow_comm_now();
		err = accept_new(c, tw, now, diag);
		if (err)
			break;
		read_hellos(tw, now);
		for (int r = 0; r < c->size && !err; r++)
			err = peer_step(c, tw, &sp[r], r, now, diag);
		int waiting = first_pending_peer(c, sp);
		if (err || waiting < 0)
			break;
		int dead = flow_comm_first_dead_peer(c);
		if (dead >= 0) {
			err = flow_comm_peer_fail(c, diag, dead, "died");
			break;
		}
		if (now > flow_comm_deadline(c)) {
			err = flow_comm_timed_out(c, diag, waiting);
			break;
		}
		int need = 1 + tw->npending + c->size;
		if (need > cap) {
			struct pollfd *p =
				realloc(pfd, (size_t)need * sizeof *p);
			if (!p) {
				err = flow_comm_fail(c, diag, FLOW_ERR_NOMEM,
						     "out of memory");
				break;
			}
			pfd = p;
			cap = need;
		}
		int k = setup_pollset(c, tw, sp, pfd);
		/* Attempt deadlines and retry pauses are short; wake often. */
		(void)poll(pfd, (nfds_t)k, 10);
	}
	free(pfd);
	return err;
}

/* Make sure the listening socket never blocks accept: a connection can be
 * reset between poll and accept. */
static flow_err_t listen_prepare(flow_comm_t *c, flow_diag_t *diag)
{
	int lfd = flow_world_listen_fd(c->world);
	int fl = -1;
	errno = EBADF;
	if (lfd >= 0)
		fl = fcntl(lfd, F_GETFL);
	if (fl < 0 || (!(fl & O_NONBLOCK) &&
		       fcntl(lfd, F_SETFL, fl | O_NONBLOCK) < 0))
		return flow_comm_fail(c, diag, FLOW_ERR_IO,
				      "the world has no usable listening "
				      "socket: %s", strerror(errno));
	return FLOW_OK;
}

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
	uint8_t shdr[HDR_SIZE];
	size_t shdr_done;
	const sspan_t *ss;
	int nss, si;
	size_t soff, sdone, stotal, ungated;
	/* incoming */
	int from, rfd;
	uint8_t rhdr[HDR_SIZE];
	size_t rhdr_got;
	hdr_t want;
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
	hdr_pack(x->shdr, op, x->c->id, seq, x->stotal);
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
	x->want = (hdr_t){ DATA_MAGIC, op, x->c->id, seq, x->rtotal };
}

static bool send_done(const xfer_t *x)
{
	return x->to < 0 || (x->shdr_done == HDR_SIZE && x->sdone == x->stotal);
}

static bool recv_done(const xfer_t *x)
{
	return x->from < 0 ||
	       (x->rhdr_got == HDR_SIZE && x->rdone == x->rtotal);
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
	if (st == IO_CLOSED)
		return peer_closed(c, r, diag);
	return flow_comm_fail(c, diag, FLOW_ERR_IO,
			      "cannot %s peer rank %d (%s): %s",
			      sending ? "send to" : "receive from",
			      wrank(c, r), host_of(c, r), strerror(errno));
}

/* Advance over what was written: header first, then the segments. */
static void send_advance(xfer_t *x, size_t n)
{
	size_t h = HDR_SIZE - x->shdr_done;
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
		if (x->shdr_done < HDR_SIZE)
			iov[k++] = (struct iovec){ x->shdr + x->shdr_done,
						   HDR_SIZE - x->shdr_done };
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
			return IO_WAIT; /* gated */
		struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)k };
		ssize_t n = sendmsg(x->sfd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return IO_WAIT;
			return errno_is_closed(errno) ? IO_CLOSED : IO_ERROR;
		}
		*progress = true;
		send_advance(x, (size_t)n);
	}
	return IO_DONE;
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
		if (x->rhdr_got < HDR_SIZE) {
			int st = io_read(x->rfd, x->rhdr, HDR_SIZE,
					 &x->rhdr_got);
			if (st != IO_DONE)
				return st;
			*progress = true;
			hdr_t h = hdr_unpack(x->rhdr);
			if (memcmp(&h, &x->want, sizeof h) != 0) {
				*err = header_mismatch(x, diag);
				return IO_ERROR;
			}
			continue;
		}
		while (x->ri < x->nrs && x->rs[x->ri].len == 0)
			x->ri++;
		size_t len;
		char *dst = recv_target(x, &len);
		ssize_t n = recv(x->rfd, dst, len, MSG_DONTWAIT);
		if (n == 0)
			return IO_CLOSED;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return IO_WAIT;
			return errno_is_closed(errno) ? IO_CLOSED : IO_ERROR;
		}
		*progress = true;
		x->roff += (size_t)n;
		recv_process(x);
	}
	return recv_done(x) ? IO_DONE : IO_WAIT;
}

static const char *op_name(uint32_t op)
{
	return op <= FLOW_OP_SETUP ? flow_comm_op_name((flow_comm_op_t)op)
				   : "an unknown operation";
}

static flow_err_t header_mismatch(xfer_t *x, flow_diag_t *diag)
{
	flow_comm_t *c = x->c;
	int r = x->from, w = wrank(c, r);
	hdr_t h = hdr_unpack(x->rhdr), *e = &x->want;
	if (h.magic != DATA_MAGIC)
		return flow_comm_fail(c, diag, FLOW_ERR_PEER,
				      "peer rank %d (%s) sent bytes that are "
				      "not a flow header (magic 0x%08x): the "
				      "streams are out of step",
				      w, host_of(c, r), h.magic);
	if (h.op == FLOW_OP_NONE)
		return flow_comm_peer_fail(c, diag, r,
					   "freed its communicators and "
					   "closed the connection");
	if (h.id != e->id)
		return flow_comm_fail(c, diag, FLOW_ERR_PEER,
				      "peer rank %d (%s) is in %s #%llu of "
				      "another communicator (ranks must use "
				      "communicators in the same order)",
				      w, host_of(c, r), op_name(h.op),
				      (unsigned long long)h.seq);
	if (h.op != e->op || h.seq != e->seq)
		return flow_comm_fail(c, diag, FLOW_ERR_PEER,
				      "peer rank %d (%s) is in %s #%llu "
				      "instead (ranks must call collectives "
				      "in the same order)",
				      w, host_of(c, r), op_name(h.op),
				      (unsigned long long)h.seq);
	return flow_comm_fail(c, diag, FLOW_ERR_USAGE,
			      "peer rank %d (%s) sends a %llu-byte stream "
			      "where this rank expects %llu: the ranks passed "
			      "different counts",
			      w, host_of(c, r), (unsigned long long)h.bytes,
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
		int fd = tc->tw->fd[wrank(c, r)];
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
		uint8_t b[HDR_SIZE];
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
		int fd = tw->fd[wrank(x->c, ends[i])];
		if (fd < 0)
			return flow_comm_fail(x->c, diag, FLOW_ERR_PEER,
					      "no connection to peer rank %d "
					      "(%s): it was closed after an "
					      "earlier failure",
					      wrank(x->c, ends[i]),
					      host_of(x->c, ends[i]));
		if (i == 0)
			x->sfd = fd;
		else
			x->rfd = fd;
	}
	return FLOW_OK;
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
	    (x->shdr_done < HDR_SIZE || send_limit(x) > x->sdone))
		p[k++] = (struct pollfd){ x->sfd, POLLOUT, 0 };
	if (!recv_done(x) && k == 1 && x->rfd == x->sfd)
		p[0].events |= POLLIN;
	else if (!recv_done(x))
		p[k++] = (struct pollfd){ x->rfd, POLLIN, 0 };
	int active = k;
	for (int r = 0; c->size <= WATCH_MAX && r < c->size; r++) {
		int fd = tc->tw->fd[wrank(c, r)];
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
		int ss = IO_DONE, rs = IO_DONE;
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

/* Release this communicator's hold on its pairs.  After a failure the
 * pairs are closed without a goodbye, so peers still waiting on this rank
 * fail at once instead of at their deadline. */
static void release_pairs(flow_comm_t *c, tcp_world_t *tw, bool failed)
{
	for (int r = 0; r < c->size; r++) {
		int w = wrank(c, r);
		if (r == c->rank)
			continue;
		if (--tw->refs[w] == 0 || failed)
			pair_close(tw, w, !failed);
	}
	if (--tw->ncomms == 0)
		tw_free(tw);
}

static void tcp_destroy(flow_comm_t *c)
{
	tcp_comm_t *tc = c->impl;
	if (!tc)
		return;
	pthread_mutex_lock(&worlds_lock);
	release_pairs(c, tc->tw, c->failed);
	pthread_mutex_unlock(&worlds_lock);
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

/* After a failed setup, connections this setup made and no live
 * communicator uses are closed without a goodbye: their state is unknown. */
static void setup_failed(flow_comm_t *c, tcp_world_t *tw, setup_peer_t *sp)
{
	for (int r = 0; sp && r < c->size; r++) {
		if (sp[r].fd >= 0)
			close(sp[r].fd);
		if (r != c->rank && tw->refs[wrank(c, r)] == 0)
			pair_close(tw, wrank(c, r), false);
	}
	if (tw->ncomms == 0)
		tw_free(tw);
}

flow_err_t flow_comm_tcp_init(flow_comm_t *c, flow_diag_t *diag)
{
	flow_err_t err = listen_prepare(c, diag);
	if (err)
		return err;
	tcp_comm_t *tc = tcp_comm_new(c->size);
	setup_peer_t *sp = calloc((size_t)c->size, sizeof *sp);
	if (!tc || !sp) {
		err = flow_comm_fail(c, diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	pthread_mutex_lock(&worlds_lock);
	tc->tw = tw_get(c->world);
	if (!tc->tw) {
		err = flow_comm_fail(c, diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_unlock;
	}
	err = peers_init(c, tc->tw, sp, diag);
	if (!err)
		err = setup_loop(c, tc->tw, sp, diag);
	if (err) {
		setup_failed(c, tc->tw, sp);
		goto out_unlock;
	}
	for (int r = 0; r < c->size; r++)
		if (r != c->rank)
			tc->tw->refs[wrank(c, r)]++;
	tc->tw->ncomms++;
	c->ops = &tcp_ops;
	c->impl = tc;
	tc = NULL;
out_unlock:
	pthread_mutex_unlock(&worlds_lock);
out_free:
	free(sp);
	tcp_comm_free(tc);
	return err;
}
