/* What the two halves of the TCP transport share: the per-world table of
 * pair connections, which comm_tcp_conn.c fills (accepting, connecting,
 * the hello handshake, communicator setup) and comm_tcp.c's streams and
 * collectives run over, and the 32-byte header that starts every message
 * on those connections.
 *
 * A header is magic, op, communicator id, sequence number and bytes, its
 * integers little-endian; payloads are raw host memory (every node of a
 * job has the same byte order).  A header with op FLOW_OP_NONE is a
 * goodbye: the sender freed its last communicator with this peer and
 * closes the connection. */
#ifndef FLOW_COMM_TCP_INTERNAL_H
#define FLOW_COMM_TCP_INTERNAL_H

#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include <flow/world.h>

#include "comm_internal.h"

#define TCP_HDR_SIZE 32
#define TCP_DATA_MAGIC 0x54574c46u /* "FLWT" little-endian */

/* ---- the per-world table of pair connections ----------------------------- */

/* An accepted connection whose hello has not been read yet. */
typedef struct tcp_pending {
	int fd;
	size_t got;
	double since; /* accepted then (flow_comm_now) */
	uint8_t buf[TCP_HDR_SIZE]; /* got bytes of the hello so far */
} tcp_pending_t;

/* One world's connections, shared by all its TCP communicators on this
 * rank; comm_tcp_conn.c owns it, the streams read fd[]. */
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

/* Connect this rank to every other member of c, collectively over the
 * members and under c's deadline: the world's pair connections are made
 * (the higher world rank connects to the lower one) or reused, then a
 * setup request and its acknowledgement cross each of them, which proves
 * the connection live on both sides and that both build the same
 * communicator.  Returns FLOW_OK with *tw_out, the world's table, which
 * holds this communicator's pairs until flow_comm_tcp_pairs_close; else
 * the error with diag set by flow_comm_fail, flow_comm_peer_fail or
 * flow_comm_timed_out (FLOW_ERR_IO, FLOW_ERR_NOMEM, FLOW_ERR_FORMAT,
 * FLOW_ERR_PEER, FLOW_ERR_TIMEOUT).  The communicators of one world are
 * used from one thread; a lock keeps the tables of all worlds consistent. */
flow_err_t flow_comm_tcp_pairs_open(flow_comm_t *c, tcp_world_t **tw_out,
				    flow_diag_t *diag) FLOW_MUST_CHECK;

/* Release c's hold on its pairs in tw; a pair no other communicator holds
 * is closed after a goodbye, and the table goes with the world's last
 * communicator.  failed (c failed): every pair of c is closed at once
 * without a goodbye, so peers still waiting on this rank fail at once
 * instead of at their deadline. */
void flow_comm_tcp_pairs_close(flow_comm_t *c, tcp_world_t *tw, bool failed);

/* ---- message headers ----------------------------------------------------- */

/* Little-endian integers at p. */
static inline void tcp_put32(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

static inline void tcp_put64(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

static inline uint32_t tcp_get32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return le32toh(v);
}

static inline uint64_t tcp_get64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

/* A message header, unpacked. */
typedef struct tcp_hdr {
	uint32_t magic, op;
	uint64_t id, seq, bytes;
} tcp_hdr_t;

static inline void tcp_hdr_pack(uint8_t *p, uint32_t op, uint64_t id,
				uint64_t seq, uint64_t bytes)
{
	tcp_put32(p, TCP_DATA_MAGIC);
	tcp_put32(p + 4, op);
	tcp_put64(p + 8, id);
	tcp_put64(p + 16, seq);
	tcp_put64(p + 24, bytes);
}

static inline tcp_hdr_t tcp_hdr_unpack(const uint8_t *p)
{
	tcp_hdr_t h = { tcp_get32(p), tcp_get32(p + 4), tcp_get64(p + 8),
			tcp_get64(p + 16), tcp_get64(p + 24) };
	return h;
}

/* ---- non-blocking socket I/O --------------------------------------------- */

/* What a non-blocking read or write came to. */
enum {
	TCP_IO_DONE = 1,    /* all of it */
	TCP_IO_WAIT = 0,    /* the socket would block; part may be done */
	TCP_IO_CLOSED = -1, /* the peer closed or reset the connection */
	TCP_IO_ERROR = -2,  /* any other failure, errno set */
};

/* What a send or recv that failed with errno e (not EINTR, which the
 * caller retries) comes to: TCP_IO_WAIT, TCP_IO_CLOSED or TCP_IO_ERROR. */
static inline int tcp_io_failure(int e)
{
	if (e == EAGAIN || e == EWOULDBLOCK)
		return TCP_IO_WAIT;
	if (e == ECONNRESET || e == EPIPE || e == ENOTCONN ||
	    e == ECONNABORTED || e == ETIMEDOUT)
		return TCP_IO_CLOSED;
	return TCP_IO_ERROR;
}

/* Read until *got == want, without blocking: TCP_IO_DONE, TCP_IO_WAIT
 * (call again when the socket is readable), TCP_IO_CLOSED or TCP_IO_ERROR
 * (errno set). */
static inline int tcp_io_read(int fd, uint8_t *buf, size_t want, size_t *got)
{
	while (*got < want) {
		ssize_t n = recv(fd, buf + *got, want - *got, MSG_DONTWAIT);
		if (n > 0) {
			*got += (size_t)n;
			continue;
		}
		if (n == 0)
			return TCP_IO_CLOSED;
		if (errno == EINTR)
			continue;
		return tcp_io_failure(errno);
	}
	return TCP_IO_DONE;
}

/* ---- members ------------------------------------------------------------- */

/* The world rank, and the host, of communicator rank r. */
static inline int tcp_wrank(const flow_comm_t *c, int r)
{
	return c->world_ranks[r];
}

static inline const char *tcp_host_of(const flow_comm_t *c, int r)
{
	return flow_world_host_of(c->world, tcp_wrank(c, r));
}

#endif
