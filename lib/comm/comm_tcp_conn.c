/* The connections of the TCP transport (comm_tcp.c runs the streams and
 * collectives over them).
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
 * sides build the same communicator.  A rank that frees its last
 * communicator with a peer sends a goodbye header before closing, so the
 * peer can tell that close from a crash. */
#include <config.h>

#include <arpa/inet.h>
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
#include <unistd.h>

#include <flow/log.h>

#include "comm_tcp_internal.h"

#define HELLO_MAGIC 0x48574c46u /* "FLWH" */
#define TCP_VERSION 1u
#define HELLO_REQUEST 0u
#define HELLO_REPLY 1u
#define SETUP_REQUEST 0u /* seq field of the setup header */
#define SETUP_ACK 1u
#define CONNECT_S 2.0      /* one connect attempt to one address */
#define HELLO_WAIT_S 5.0   /* the hello reply after connecting */
#define RETRY_S 0.1        /* pause after every address failed */
#define PENDING_MAX_S 30.0 /* an accepted socket that never says hello */
#define MAX_ADDRS 32

/* Every world's table of pair connections.  Communicators of one world
 * are used from one thread; the lock only keeps the registry itself
 * consistent. */
static tcp_world_t *worlds;
static pthread_mutex_t worlds_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- small helpers ------------------------------------------------------- */

static bool hdr_is_bye(const uint8_t *p)
{
	tcp_hdr_t h = tcp_hdr_unpack(p);
	return h.magic == TCP_DATA_MAGIC && h.op == FLOW_OP_NONE;
}

/* Hello: magic, version, from, to (world ranks), job hash, world size,
 * kind (request or reply). */
static void hello_pack(uint8_t *p, const tcp_world_t *tw, int to,
		       uint32_t kind)
{
	tcp_put32(p, HELLO_MAGIC);
	tcp_put32(p + 4, TCP_VERSION);
	tcp_put32(p + 8, (uint32_t)tw->me);
	tcp_put32(p + 12, (uint32_t)to);
	tcp_put64(p + 16, tw->job_hash);
	tcp_put32(p + 24, (uint32_t)tw->size);
	tcp_put32(p + 28, kind);
}

/* NULL when the hello is one this rank accepts from world rank `from`
 * (-1: any higher rank), else why not. */
static const char *hello_check(const uint8_t *p, const tcp_world_t *tw,
			       int from, uint32_t kind)
{
	uint32_t sender = tcp_get32(p + 8);
	if (tcp_get32(p) != HELLO_MAGIC)
		return "not a flow hello";
	if (tcp_get32(p + 4) != TCP_VERSION)
		return "another protocol version";
	if (tcp_get64(p + 16) != tw->job_hash ||
	    tcp_get32(p + 24) != (uint32_t)tw->size)
		return "another job";
	if (tcp_get32(p + 12) != (uint32_t)tw->me || tcp_get32(p + 28) != kind)
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
		return tcp_io_failure(errno);
	}
	return TCP_IO_DONE;
}

/* ---- the registry ----------------------------------------------------------
 * Called with worlds_lock held. */

static void pair_close(tcp_world_t *tw, int w, bool bye)
{
	if (tw->fd[w] < 0)
		return;
	if (bye) {
		uint8_t h[TCP_HDR_SIZE];
		tcp_hdr_pack(h, FLOW_OP_NONE, 0, 0, 0);
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
		int st = tcp_io_read(p->fd, p->buf, TCP_HDR_SIZE, &p->got);
		if (st == TCP_IO_WAIT && now - p->since < PENDING_MAX_S) {
			i++;
			continue;
		}
		const char *why =
			st == TCP_IO_DONE ? hello_check(p->buf, tw, -1,
							HELLO_REQUEST)
			: st == TCP_IO_WAIT ? "no hello in time"
					    : "closed before its hello";
		uint8_t reply[TCP_HDR_SIZE];
		size_t done = 0;
		if (!why) {
			hello_pack(reply, tw, (int)tcp_get32(p->buf + 8),
				   HELLO_REPLY);
			if (io_write(p->fd, reply, sizeof reply, &done) !=
			    TCP_IO_DONE)
				why = "could not answer its hello";
		}
		if (why) {
			flow_log(FLOW_LOG_DEBUG,
				 "tcp: dropping an accepted connection: %s",
				 why);
			pending_remove(tw, i, true);
			continue;
		}
		int w = (int)tcp_get32(p->buf + 8);
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
	uint8_t in[TCP_HDR_SIZE], out[TCP_HDR_SIZE];
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
	tcp_hdr_pack(sp->out, FLOW_OP_SETUP, c->id,
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
	if (io_write(sp->fd, sp->out, TCP_HDR_SIZE, &sp->out_done) !=
	    TCP_IO_DONE) {
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
	int st = tcp_io_read(sp->fd, sp->in, TCP_HDR_SIZE, &sp->in_got);
	if (st == TCP_IO_WAIT) {
		if (now > sp->attempt_end)
			attempt_failed(sp, w, now, "no hello reply in time");
		return;
	}
	const char *why = st == TCP_IO_DONE
				  ? hello_check(sp->in, tw, w, HELLO_REPLY)
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
	tcp_hdr_t h = tcp_hdr_unpack(in);
	if (h.magic == TCP_DATA_MAGIC && h.op == FLOW_OP_SETUP)
		return flow_comm_fail(c, diag, FLOW_ERR_PEER,
				      "peer rank %d (%s) is setting up another "
				      "communicator (id %016llx, %llu ranks) "
				      "than this one (id %016llx, %d ranks)",
				      tcp_wrank(c, r), tcp_host_of(c, r),
				      (unsigned long long)h.id,
				      (unsigned long long)h.bytes,
				      (unsigned long long)c->id, c->size);
	if (h.magic == TCP_DATA_MAGIC)
		return flow_comm_fail(c, diag, FLOW_ERR_PEER,
				      "peer rank %d (%s) sent %s #%llu while "
				      "this rank sets up a communicator",
				      tcp_wrank(c, r), tcp_host_of(c, r),
				      flow_comm_op_name((flow_comm_op_t)h.op),
				      (unsigned long long)h.seq);
	return flow_comm_fail(c, diag, FLOW_ERR_PEER,
			      "peer rank %d (%s) sent bytes that are not a "
			      "flow header (magic 0x%08x)",
			      tcp_wrank(c, r), tcp_host_of(c, r), h.magic);
}

static bool setup_hdr_ok(const flow_comm_t *c, const uint8_t *in,
			 uint64_t kind)
{
	tcp_hdr_t h = tcp_hdr_unpack(in);
	return h.magic == TCP_DATA_MAGIC && h.op == FLOW_OP_SETUP &&
	       h.id == c->id && h.seq == kind && h.bytes == (uint64_t)c->size;
}

/* Exchange of the request and its acknowledgement on a pair connection. */
static flow_err_t exchange_step(flow_comm_t *c, tcp_world_t *tw,
				setup_peer_t *sp, int r, flow_diag_t *diag)
{
	int w = tcp_wrank(c, r);
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
		st = io_write(fd, sp->out, TCP_HDR_SIZE, &sp->out_done);
		if (st == TCP_IO_DONE)
			sp->state = sp->state == ST_REQUEST ? ST_ACK_WAIT
							     : ST_DONE;
	} else {
		st = tcp_io_read(fd, sp->in, TCP_HDR_SIZE, &sp->in_got);
		if (st == TCP_IO_DONE && hdr_is_bye(sp->in))
			st = TCP_IO_CLOSED;
		else if (st == TCP_IO_DONE &&
			 !setup_hdr_ok(c, sp->in,
				       higher ? SETUP_ACK : SETUP_REQUEST))
			return setup_mismatch(c, r, sp->in, diag);
		else if (st == TCP_IO_DONE && higher)
			sp->state = ST_DONE;
		else if (st == TCP_IO_DONE)
			request_prepare(c, sp, ST_ACK_SEND);
	}
	if (st == TCP_IO_CLOSED)
		stale_pair(tw, sp, w, higher);
	else if (st == TCP_IO_ERROR)
		return flow_comm_fail(c, diag, FLOW_ERR_IO,
				      "connection to peer rank %d (%s) failed: "
				      "%s", w, tcp_host_of(c, r),
				      strerror(errno));
	return FLOW_OK;
}

static flow_err_t peer_step(flow_comm_t *c, tcp_world_t *tw,
			    setup_peer_t *sp, int r, double now,
			    flow_diag_t *diag)
{
	int w = tcp_wrank(c, r);
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
		int w = tcp_wrank(c, r);
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
					"rank %d (%s)", a, w,
					tcp_host_of(c, r));
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
			fd = tw->fd[tcp_wrank(c, r)];
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

/* ---- opening and closing a communicator's pairs -------------------------- */

/* After a failed setup, connections this setup made and no live
 * communicator uses are closed without a goodbye: their state is unknown. */
static void setup_failed(flow_comm_t *c, tcp_world_t *tw, setup_peer_t *sp)
{
	for (int r = 0; sp && r < c->size; r++) {
		if (sp[r].fd >= 0)
			close(sp[r].fd);
		if (r != c->rank && tw->refs[tcp_wrank(c, r)] == 0)
			pair_close(tw, tcp_wrank(c, r), false);
	}
	if (tw->ncomms == 0)
		tw_free(tw);
}

/* Release this communicator's hold on its pairs.  After a failure the
 * pairs are closed without a goodbye, so peers still waiting on this rank
 * fail at once instead of at their deadline. */
static void release_pairs(flow_comm_t *c, tcp_world_t *tw, bool failed)
{
	for (int r = 0; r < c->size; r++) {
		int w = tcp_wrank(c, r);
		if (r == c->rank)
			continue;
		if (--tw->refs[w] == 0 || failed)
			pair_close(tw, w, !failed);
	}
	if (--tw->ncomms == 0)
		tw_free(tw);
}

flow_err_t flow_comm_tcp_pairs_open(flow_comm_t *c, tcp_world_t **tw_out,
				    flow_diag_t *diag)
{
	tcp_world_t *tw;
	flow_err_t err = listen_prepare(c, diag);
	if (err)
		return err;
	setup_peer_t *sp = calloc((size_t)c->size, sizeof *sp);
	if (!sp)
		return flow_comm_fail(c, diag, FLOW_ERR_NOMEM, "out of memory");
	pthread_mutex_lock(&worlds_lock);
	tw = tw_get(c->world);
	if (!tw) {
		err = flow_comm_fail(c, diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_unlock;
	}
	err = peers_init(c, tw, sp, diag);
	if (!err)
		err = setup_loop(c, tw, sp, diag);
	if (err) {
		setup_failed(c, tw, sp);
		goto out_unlock;
	}
	for (int r = 0; r < c->size; r++)
		if (r != c->rank)
			tw->refs[tcp_wrank(c, r)]++;
	tw->ncomms++;
	*tw_out = tw;
out_unlock:
	pthread_mutex_unlock(&worlds_lock);
	free(sp);
	return err;
}

void flow_comm_tcp_pairs_close(flow_comm_t *c, tcp_world_t *tw, bool failed)
{
	pthread_mutex_lock(&worlds_lock);
	release_pairs(c, tw, failed);
	pthread_mutex_unlock(&worlds_lock);
}
