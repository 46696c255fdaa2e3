/* The world: who this process is among the ranks of a job, learned from
 * PMIx, and a small key-value exchange between the ranks for bootstrap.
 *
 * flow_world_init works under any PMIx launcher (Slurm's srun --mpi=pmix,
 * OpenMPI's mpirun, flow's own --nproc launcher).  Without a PMIx server the
 * process is a one-rank singleton, as PMIx itself makes it; a launcher that
 * started several singletons (srun --mpi=none, --mpi=pmi2) is detected and
 * refused, since every copy would otherwise train alone.
 *
 * Not thread-safe: one thread calls these functions. */
#ifndef FLOW_WORLD_H
#define FLOW_WORLD_H

#include <flow/error.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLOW_HOST_MAX 64

/* What every rank knows about itself and the others after init. */
typedef struct flow_world_info {
	int rank;       /* 0 .. size-1 */
	int size;       /* ranks in the job */
	int local_rank; /* 0 .. local_size-1: position among this node's ranks */
	int local_size; /* ranks on this node */
	int node;       /* 0 .. num_nodes-1, numbered in order of lowest rank */
	int num_nodes;
	char host[FLOW_HOST_MAX]; /* node name from the launcher, never
				     gethostname(): simulated nodes share it */
	char launcher[16];        /* "pmix" or "singleton" */
	char job[128];            /* PMIx namespace (for messages only) */
	uint64_t job_hash;        /* of the namespace (flow_job_hash) */
	uint64_t job_nonce;       /* rank 0's random number: with job_hash,
				     this run of the job, the same on every
				     rank and different from any other run's
				     (namespaces repeat: a fresh Slurm numbers
				     its jobs from 1 again, launcher pids are
				     reused); it names the job's shared memory
				     and checks its connections */
} flow_world_info_t;

typedef struct flow_world flow_world_t;

/* Default deadline of every collective and bootstrap exchange, seconds. */
#define FLOW_COMM_TIMEOUT_DEFAULT 60.0

/* Join the job: PMIx_Init, identity, one exchange of every rank's host,
 * pid and TCP address (a listening socket is opened when size > 1), and a
 * check that all ranks agree on the world size.  timeout_s (> 0) is the
 * deadline of that exchange and the default of every communicator made
 * from this world.  Returns FLOW_OK and *out (free with flow_world_free);
 * FLOW_ERR_USAGE when separate singletons were launched or a stale PMIx
 * environment has no server; FLOW_ERR_PEER or FLOW_ERR_TIMEOUT when the
 * exchange fails; FLOW_ERR_NOMEM. */
FLOW_EXPORT flow_err_t flow_world_init(flow_world_t **out, double timeout_s,
				       flow_diag_t *diag) FLOW_MUST_CHECK;

/* FNV-1a of a PMIx namespace: the start of the names of the job's shared
 * memory segments, "/flow-<16 hex digits>-", which its launcher removes
 * when the job fails (a rank killed while setting up a communicator
 * cannot). */
FLOW_EXPORT uint64_t flow_job_hash(const char *nspace);

/* Borrowed; valid while w is. */
FLOW_EXPORT const flow_world_info_t *flow_world_info(const flow_world_t *w);
/* The deadline given to flow_world_init, seconds. */
FLOW_EXPORT double flow_world_timeout(const flow_world_t *w);

/* Facts about any rank, from the start-up exchange.  rank must be in
 * 0 .. size-1. */
FLOW_EXPORT const char *flow_world_host_of(const flow_world_t *w, int rank);
FLOW_EXPORT int flow_world_node_of(const flow_world_t *w, int rank);
FLOW_EXPORT int flow_world_pid_of(const flow_world_t *w, int rank);
/* "ADDR,ADDR,...:PORT" where rank listens (every up IPv4 address of its
 * node, loopback last); "" for a singleton. */
FLOW_EXPORT const char *flow_world_addr_of(const flow_world_t *w, int rank);
/* The listening socket opened by init (-1 for a singleton).  The TCP
 * backend accepts its peers on it; the world closes it. */
FLOW_EXPORT int flow_world_listen_fd(const flow_world_t *w);

/* Every rank gives len bytes under key (a fresh key per exchange); all_out
 * receives size*len bytes in rank order.  Collective over the world: each
 * rank calls it with the same key and len.  One PMIx put, commit, fence
 * and get per peer, under the world deadline.  FLOW_ERR_PEER or
 * FLOW_ERR_TIMEOUT naming the rank when it fails. */
FLOW_EXPORT flow_err_t flow_world_allgather(flow_world_t *w, const char *key,
					    const void *mine, size_t len,
					    void *all_out, flow_diag_t *diag)
	FLOW_MUST_CHECK;

/* Leave the job: a final fence (so no rank exits while another still
 * reads its data), PMIx_Finalize, and free.  After a failure call
 * flow_world_abort instead.  NULL is a no-op. */
FLOW_EXPORT flow_err_t flow_world_free(flow_world_t *w, flow_diag_t *diag);

/* Ask the launcher to end the whole job with status (PMIx_Abort), after the
 * caller has printed its own one-line error (launchers do not print msg),
 * and free w without the final fence (the other ranks may be gone).
 * Returns; the caller should then exit with status.  NULL is a no-op. */
FLOW_EXPORT void flow_world_abort(flow_world_t *w, int status,
				  const char *msg);

#ifdef __cplusplus
}
#endif

#endif
