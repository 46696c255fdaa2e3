/* The world: identity from PMIx and the bootstrap exchange between ranks.
 *
 * Every launcher flow supports (srun --mpi=pmix, mpirun, flow's --nproc) is
 * a PMIx server, so one client path serves them all.  The facts the others
 * need about a rank (host, pid, TCP address, the world size it was told)
 * travel in one put/commit/fence/get round at start-up; later exchanges
 * (NCCL ids) use the same round through flow_world_allgather.  Node numbers
 * and local ranks are derived from the launcher's host names, never from
 * gethostname(): simulated nodes share a kernel hostname. */
#include <config.h>

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <flow/log.h>
#include <flow/world.h>

#include "comm_internal.h"

#include "pmix_internal.h"

#define ADDR_MAX 256

/* What each rank publishes at start-up: fixed size, so the exchange is a
 * plain all-gather of bytes. */
typedef struct peer {
	uint32_t told_size; /* the world size its launcher gave it */
	int32_t pid;
	uint64_t nonce;     /* random: rank 0's makes the job id */
	char host[FLOW_HOST_MAX];
	char addr[ADDR_MAX];
} peer_t;

struct flow_world {
	flow_world_info_t info;
	double timeout_s;
	int listen_fd;
	peer_t *peers; /* [size] */
	int *nodes;    /* [size]: dense node number of each rank */
	bool pmix;     /* joined through PMIx (false: no-PMIx singleton) */
	uint64_t comms; /* world communicators made (their ids) */
#ifdef HAVE_PMIX
	pmix_proc_t me;
#endif
};

/* ---- separate singletons -------------------------------------------------- */

long flow_launcher_tasks(const char **var_out, const char **value_out)
{
	static const char *const vars[] = { "SLURM_STEP_NUM_TASKS",
					    "OMPI_COMM_WORLD_SIZE",
					    "PMI_SIZE" };

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);
		char *end;
		long n = v ? strtol(v, &end, 10) : 0;

		if (v && end != v && n > 1) {
			*var_out = vars[i];
			*value_out = v;
			return n;
		}
	}
	*var_out = *value_out = NULL;
	return 1;
}

/* A launcher without PMIx starts every task as its own one-rank job; each
 * would then train alone. */
static flow_err_t refuse_separate_singletons(flow_diag_t *diag)
{
	const char *var, *value;

	if (flow_launcher_tasks(&var, &value) > 1)
		return flow_diag_set(
			diag, FLOW_ERR_USAGE,
			"this process is one of %s tasks (%s) but no PMIx server answered: launch with 'srun --mpi=pmix', 'mpirun' or '--nproc', not as separate singletons",
			value, var);
	return FLOW_OK;
}

/* ---- the listening socket ------------------------------------------------- */

/* Listen on every interface, ephemeral port, non-blocking (the TCP
 * backend accepts under its deadlines); describe it as
 * "ip,ip,...,127.0.0.1:port" with loopback last, so a peer in another
 * network namespace or host finds a route first. */
static flow_err_t open_listener(flow_world_t *w, char *desc, size_t cap,
				flow_diag_t *diag)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_ANY) };
	socklen_t sl = sizeof sa;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
	    listen(fd, 1024) != 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return flow_diag_errno(diag, FLOW_ERR_IO, e,
				       "cannot open a listening TCP socket");
	}
	w->listen_fd = fd;
	struct ifaddrs *ifs = NULL;
	size_t n = 0;
	desc[0] = '\0';
	if (getifaddrs(&ifs) == 0) {
		for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
			if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
				continue;
			struct in_addr a =
				((struct sockaddr_in *)i->ifa_addr)->sin_addr;
			char ip[INET_ADDRSTRLEN];
			if ((ntohl(a.s_addr) >> 24) == 127 ||
			    !inet_ntop(AF_INET, &a, ip, sizeof ip))
				continue;
			int len = snprintf(desc + n, cap - n, "%s%s",
					   n ? "," : "", ip);
			if (len < 0 || (size_t)len + 24 >= cap - n)
				break; /* keep room for loopback and port */
			n += (size_t)len;
		}
		freeifaddrs(ifs);
	}
	snprintf(desc + n, cap - n, "%s127.0.0.1:%u", n ? "," : "",
		 (unsigned)ntohs(sa.sin_port));
	return FLOW_OK;
}

/* ---- PMIx ------------------------------------------------------------------- */

#ifdef HAVE_PMIX
/* Servers disagree on integer types (Slurm's APPNUM is INT), so accept
 * any of them. */
static bool value_to_u64(const pmix_value_t *v, uint64_t *out)
{
	switch (v->type) {
	case PMIX_UINT8: *out = v->data.uint8; return true;
	case PMIX_UINT16: *out = v->data.uint16; return true;
	case PMIX_UINT32: *out = v->data.uint32; return true;
	case PMIX_UINT64: *out = v->data.uint64; return true;
	case PMIX_SIZE: *out = v->data.size; return true;
	case PMIX_PROC_RANK: *out = v->data.rank; return true;
	case PMIX_INT16: *out = (uint64_t)v->data.int16; return true;
	case PMIX_INT32: *out = (uint64_t)v->data.int32; return true;
	case PMIX_INT64: *out = (uint64_t)v->data.int64; return true;
	case PMIX_INT: *out = (uint64_t)v->data.integer; return true;
	case PMIX_UINT: *out = v->data.uint; return true;
	default: return false;
	}
}

static bool pmix_get_u64(const flow_world_t *w, pmix_rank_t rank,
			 const char *key, uint64_t *out)
{
	pmix_proc_t p;
	pmix_value_t *v = NULL;
	PMIX_PROC_CONSTRUCT(&p);
	PMIX_LOAD_PROCID(&p, w->me.nspace, rank);
	if (PMIx_Get(&p, key, NULL, 0, &v) != PMIX_SUCCESS)
		return false;
	bool ok = value_to_u64(v, out);
	PMIX_VALUE_RELEASE(v);
	return ok;
}

static void pmix_get_host(const flow_world_t *w, char *host, size_t cap)
{
	pmix_proc_t p;
	pmix_value_t *v = NULL;
	PMIX_PROC_CONSTRUCT(&p);
	PMIX_LOAD_PROCID(&p, w->me.nspace, w->me.rank);
	host[0] = '\0';
	if (PMIx_Get(&p, PMIX_HOSTNAME, NULL, 0, &v) == PMIX_SUCCESS) {
		if (v->type == PMIX_STRING && v->data.string)
			snprintf(host, cap, "%s", v->data.string);
		PMIX_VALUE_RELEASE(v);
	}
}

/* The state of one non-blocking fence.  On the heap: after a timeout the
 * callback may still come, so a timed-out fence's record is never freed
 * (the process is about to leave the job). */
typedef struct fence_wait {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	pmix_status_t status;
} fence_wait_t;

static void fence_done(pmix_status_t status, void *arg)
{
	fence_wait_t *f = arg;
	pthread_mutex_lock(&f->lock);
	f->status = status;
	f->done = true;
	pthread_cond_signal(&f->cond);
	pthread_mutex_unlock(&f->lock);
}

/* A fence over the whole namespace under the world deadline: Slurm's own
 * timeout is minutes and PMIX_TIMEOUT is ignored, so flow keeps its own. */
static flow_err_t fence(flow_world_t *w, bool collect, const char *what,
			flow_diag_t *diag)
{
	fence_wait_t *f = calloc(1, sizeof *f);
	if (!f)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, &ca);
	pthread_condattr_destroy(&ca);

	pmix_proc_t all;
	pmix_info_t info;
	bool flag = collect;
	PMIX_PROC_CONSTRUCT(&all);
	PMIX_LOAD_PROCID(&all, w->me.nspace, PMIX_RANK_WILDCARD);
	PMIX_INFO_CONSTRUCT(&info);
	PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &flag, PMIX_BOOL);
	pmix_status_t rc = PMIx_Fence_nb(&all, 1, &info, 1, fence_done, f);
	PMIX_INFO_DESTRUCT(&info);
	if (rc == PMIX_OPERATION_SUCCEEDED) {
		f->done = true;
		f->status = PMIX_SUCCESS;
	} else if (rc != PMIX_SUCCESS) {
		f->done = true;
		f->status = rc;
	}

	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	double whole = (double)(int64_t)w->timeout_s;
	until.tv_sec += (time_t)whole;
	until.tv_nsec += (long)((w->timeout_s - whole) * 1e9);
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&f->lock);
	int wait_rc = 0;
	while (!f->done && wait_rc != ETIMEDOUT)
		wait_rc = pthread_cond_timedwait(&f->cond, &f->lock, &until);
	bool done = f->done;
	pmix_status_t status = f->status;
	pthread_mutex_unlock(&f->lock);
	if (!done)
		return flow_diag_set(
			diag, FLOW_ERR_TIMEOUT,
			"rank %d (%s): timed out after %g s waiting for the other ranks in %s (PMIx fence)",
			w->info.rank, w->info.host, w->timeout_s, what);
	pthread_cond_destroy(&f->cond);
	pthread_mutex_destroy(&f->lock);
	free(f);
	if (status != PMIX_SUCCESS)
		return flow_diag_set(
			diag, FLOW_ERR_PEER,
			"rank %d (%s): %s failed: %s (a rank exited or was killed)",
			w->info.rank, w->info.host, what,
			PMIx_Error_string(status));
	return FLOW_OK;
}

/* PMIx_Init, telling a real job from a singleton and from a stale
 * environment (PMIX_NAMESPACE without a server, where libpmix 4.2.2 also
 * crashes in PMIx_Finalize). */
static flow_err_t join_pmix(flow_world_t *w, flow_diag_t *diag)
{
	pmix_status_t rc = PMIx_Init(&w->me, NULL, 0);
	/* UNREACH, or NOT-FOUND when PMIX_RANK is missing too. */
	if (rc != PMIX_SUCCESS && getenv("PMIX_NAMESPACE"))
		return flow_diag_set(
			diag, FLOW_ERR_USAGE,
			"PMIX_NAMESPACE is set ('%s') but its PMIx server cannot be reached: a stale launcher environment?",
			getenv("PMIX_NAMESPACE"));
	if (rc != PMIX_SUCCESS && rc != PMIX_ERR_UNREACH)
		return flow_diag_set(diag, FLOW_ERR_PEER,
				     "PMIx_Init failed: %s",
				     PMIx_Error_string(rc));
	w->pmix = true;
	if (rc == PMIX_ERR_UNREACH) { /* libpmix made us a singleton */
		snprintf(w->info.launcher, sizeof w->info.launcher,
			 "singleton");
		w->info.size = 1;
		return refuse_separate_singletons(diag);
	}
	uint64_t size = 0, lrank = 0;
	if (!pmix_get_u64(w, PMIX_RANK_WILDCARD, PMIX_JOB_SIZE, &size) ||
	    size < 1 || size > INT32_MAX || w->me.rank >= size)
		return flow_diag_set(diag, FLOW_ERR_PEER,
				     "the PMIx server gave no usable job size");
	(void)pmix_get_u64(w, w->me.rank, PMIX_LOCAL_RANK, &lrank);
	snprintf(w->info.launcher, sizeof w->info.launcher, "pmix");
	snprintf(w->info.job, sizeof w->info.job, "%s", w->me.nspace);
	w->info.rank = (int)w->me.rank;
	w->info.size = (int)size;
	w->info.local_rank = (int)lrank;
	pmix_get_host(w, w->info.host, sizeof w->info.host);
	if (size == 1)
		return refuse_separate_singletons(diag);
	return FLOW_OK;
}
#endif /* HAVE_PMIX */

flow_err_t flow_world_allgather(flow_world_t *w, const char *key,
				const void *mine, size_t len, void *all_out,
				flow_diag_t *diag)
{
	if (w->info.size == 1) {
		memcpy(all_out, mine, len);
		return FLOW_OK;
	}
#ifdef HAVE_PMIX
	pmix_value_t v;
	pmix_byte_object_t bo = { .bytes = (char *)mine, .size = len };
	PMIX_VALUE_CONSTRUCT(&v);
	v.type = PMIX_BYTE_OBJECT;
	v.data.bo = bo;
	pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &v);
	if (rc == PMIX_SUCCESS)
		rc = PMIx_Commit();
	if (rc != PMIX_SUCCESS)
		return flow_diag_set(diag, FLOW_ERR_PEER,
				     "rank %d (%s): PMIx put of '%s' failed: %s",
				     w->info.rank, w->info.host, key,
				     PMIx_Error_string(rc));
	char what[96];
	snprintf(what, sizeof what, "the exchange of '%s'", key);
	flow_err_t err = fence(w, true, what, diag);
	if (err)
		return err;
	for (int r = 0; r < w->info.size; r++) {
		pmix_proc_t p;
		pmix_value_t *got = NULL;
		PMIX_PROC_CONSTRUCT(&p);
		PMIX_LOAD_PROCID(&p, w->me.nspace, (pmix_rank_t)r);
		rc = PMIx_Get(&p, key, NULL, 0, &got);
		bool ok = rc == PMIX_SUCCESS && got->type == PMIX_BYTE_OBJECT &&
			  got->data.bo.size == len;
		if (ok)
			memcpy((char *)all_out + (size_t)r * len,
			       got->data.bo.bytes, len);
		if (got)
			PMIX_VALUE_RELEASE(got);
		if (!ok)
			return flow_diag_set(
				diag, FLOW_ERR_PEER,
				"rank %d (%s): no valid '%s' from rank %d: %s",
				w->info.rank, w->info.host, key, r,
				rc == PMIX_SUCCESS ? "wrong type or size"
						   : PMIx_Error_string(rc));
	}
	return FLOW_OK;
#else
	(void)key;
	return flow_diag_set(diag, FLOW_ERR_NOTSUP,
			     "this build has no PMIx");
#endif
}

/* ---- start-up exchange --------------------------------------------------- */

/* Dense node numbers in order of each host's lowest rank, and this rank's
 * place among its node's ranks. */
static void number_nodes(flow_world_t *w)
{
	int n = w->info.size, nodes = 0;
	for (int r = 0; r < n; r++) {
		w->nodes[r] = -1;
		for (int q = 0; q < r && w->nodes[r] < 0; q++)
			if (strcmp(w->peers[q].host, w->peers[r].host) == 0)
				w->nodes[r] = w->nodes[q];
		if (w->nodes[r] < 0)
			w->nodes[r] = nodes++;
	}
	w->info.num_nodes = nodes;
	w->info.node = w->nodes[w->info.rank];
	w->info.local_rank = w->info.local_size = 0;
	for (int r = 0; r < n; r++) {
		if (w->nodes[r] != w->info.node)
			continue;
		if (r < w->info.rank)
			w->info.local_rank++;
		w->info.local_size++;
	}
}

/* 64 random bits; without the kernel's, the clock and the pid differ
 * from run to run too. */
static uint64_t random_u64(void)
{
	uint64_t x;
	if (getrandom(&x, sizeof x, GRND_NONBLOCK) == (ssize_t)sizeof x)
		return x;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^
	       (uint64_t)getpid() << 17;
}

uint64_t flow_job_hash(const char *nspace)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	for (; *nspace; nspace++)
		h = (h ^ (unsigned char)*nspace) * UINT64_C(0x100000001b3);
	return h;
}

static flow_err_t exchange_peers(flow_world_t *w, flow_diag_t *diag)
{
	peer_t mine = { .told_size = (uint32_t)w->info.size,
			.pid = (int32_t)getpid(), .nonce = random_u64() };
	snprintf(mine.host, sizeof mine.host, "%s", w->info.host);
	if (w->info.size > 1) {
		flow_err_t err = open_listener(w, mine.addr, sizeof mine.addr,
					       diag);
		if (err)
			return err;
	}
	flow_err_t err = flow_world_allgather(w, "flow.peer", &mine,
					      sizeof mine, w->peers, diag);
	if (err)
		return err;
	for (int r = 0; r < w->info.size; r++) {
		peer_t *p = &w->peers[r];
		p->host[sizeof p->host - 1] = p->addr[sizeof p->addr - 1] = 0;
		if (p->told_size != (uint32_t)w->info.size)
			return flow_diag_set(
				diag, FLOW_ERR_PEER,
				"rank %d (%s): rank %d (%s) was told the job has %" PRIu32
				" ranks, this rank was told %d",
				w->info.rank, w->info.host, r, p->host,
				p->told_size, w->info.size);
	}
	w->info.job_hash = flow_job_hash(w->info.job);
	w->info.job_nonce = w->peers[0].nonce;
	number_nodes(w);
	return FLOW_OK;
}

/* What init allocated and opened, without leaving the job. */
static void release(flow_world_t *w)
{
	if (w->listen_fd >= 0)
		close(w->listen_fd);
	free(w->peers);
	free(w->nodes);
	free(w);
}

flow_err_t flow_world_init(flow_world_t **out, double timeout_s,
			   flow_diag_t *diag)
{
	*out = NULL;
	if (!(timeout_s > 0))
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "the communication deadline must be positive, got %g s",
				     timeout_s);
	flow_world_t *w = calloc(1, sizeof *w);
	if (!w)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	w->timeout_s = timeout_s;
	w->listen_fd = -1;
	w->info.size = 1;
	snprintf(w->info.launcher, sizeof w->info.launcher, "singleton");
#ifdef HAVE_PMIX
	flow_err_t err = join_pmix(w, diag);
#else
	flow_err_t err = refuse_separate_singletons(diag);
#endif
	if (err)
		goto fail;
	if (!w->info.host[0] && gethostname(w->info.host, sizeof w->info.host))
		snprintf(w->info.host, sizeof w->info.host, "localhost");
	w->info.host[sizeof w->info.host - 1] = '\0';
	w->peers = calloc((size_t)w->info.size, sizeof *w->peers);
	w->nodes = calloc((size_t)w->info.size, sizeof *w->nodes);
	if (!w->peers || !w->nodes) {
		err = flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto fail;
	}
	err = exchange_peers(w, diag);
	if (err)
		goto fail;
	flow_log_set_rank(w->info.size > 1 ? w->info.rank : -1);
	*out = w;
	return FLOW_OK;
fail:
	/* No PMIx_Finalize: after a stale-environment failure it crashes, and
	 * the process is about to exit anyway. */
	release(w);
	return err;
}

const flow_world_info_t *flow_world_info(const flow_world_t *w)
{
	return &w->info;
}

double flow_world_timeout(const flow_world_t *w)
{
	return w->timeout_s;
}

const char *flow_world_host_of(const flow_world_t *w, int rank)
{
	return w->peers[rank].host;
}

int flow_world_node_of(const flow_world_t *w, int rank)
{
	return w->nodes[rank];
}

int flow_world_pid_of(const flow_world_t *w, int rank)
{
	return w->peers[rank].pid;
}

const char *flow_world_addr_of(const flow_world_t *w, int rank)
{
	return w->peers[rank].addr;
}

int flow_world_listen_fd(const flow_world_t *w)
{
	return w->listen_fd;
}

uint64_t flow_world_next_comm(flow_world_t *w)
{
	return w->comms++;
}

flow_err_t flow_world_free(flow_world_t *w, flow_diag_t *diag)
{
	if (!w)
		return FLOW_OK;
	flow_err_t err = FLOW_OK;
#ifdef HAVE_PMIX
	/* No rank leaves while another may still read its published data. */
	if (w->pmix && w->info.size > 1)
		err = fence(w, false, "the final barrier", diag);
	if (w->pmix && !err)
		PMIx_Finalize(NULL, 0);
#else
	(void)diag;
#endif
	release(w);
	return err;
}

void flow_world_abort(flow_world_t *w, int status, const char *msg)
{
	if (!w)
		return;
#ifdef HAVE_PMIX
	if (w->pmix && w->info.size > 1)
		(void)PMIx_Abort(status, msg, NULL, 0);
	else if (w->pmix)
		PMIx_Finalize(NULL, 0); /* a singleton has no one to wait for */
#else
	(void)status;
	(void)msg;
#endif
	release(w);
}
