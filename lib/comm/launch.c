/* The single-node launcher behind `flow-train --nproc N` and
 * `flow-bench --nproc N`.  This process becomes a PMIx server (libpmix's
 * server API), registers one namespace of N ranks on this node and forks N
 * copies of a program, which join the job with the ordinary PMIx client
 * calls, exactly as under srun --mpi=pmix or mpirun.  Where libpmix 4.2
 * needs working around, the comment at that code says what it does and
 * why.
 *
 * Unlike the rest of libflow, flow_launch prints.  For as long as the job
 * runs it *is* the tool, so what happens to the ranks (a rank failed, a
 * signal was passed on, SIGKILL after the grace period) is reported as it
 * happens, one line on stderr prefixed with opts->prog.  Errors that keep
 * the job from starting go into diag as everywhere else.
 *
 * Process-wide state it takes while it runs, and restores before returning:
 * SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 and SIGCHLD are blocked and read
 * through a signalfd, SIGPIPE is ignored, the process is a child subreaper
 * and reaps every child (waitpid(-1)).  So call it from the main thread
 * before any other thread or child exists, as the tools do.  The PMIx
 * server it starts stays up, idle, for the life of the process and serves
 * any later call (see server_up). */
#include <config.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pmix_internal.h"

#include <flow/launch.h>
#include <flow/log.h>
#include <flow/world.h>

/* ---- the rank's command line (every build) ---------------------------- */

/* How many words from arg on are the option: 2 for "OPT VALUE", 1 for
 * "OPT=VALUE", 0 when arg is something else. */
static int option_words(const char *arg, const char *option)
{
	size_t n = strlen(option);
	if (strncmp(arg, option, n) != 0)
		return 0;
	return arg[n] == '\0' ? 2 : arg[n] == '=' ? 1 : 0;
}

/* Walk argv without the option's words (looked for before a "--" only):
 * count the words kept and their bytes, and copy them when out is not
 * NULL. */
static size_t keep_args(int argc, char *const *argv, const char *option,
			char **out, char *strings, size_t *bytes)
{
	size_t n = 0;
	bool done = false;
	*bytes = 0;
	for (int i = 0; i < argc; i++) {
		int drop = i > 0 && !done ? option_words(argv[i], option) : 0;
		if (drop) {
			i += drop - 1;
			continue;
		}
		done = done || (i > 0 && strcmp(argv[i], "--") == 0);
		size_t len = strlen(argv[i]) + 1;
		if (out) {
			out[n] = strings + *bytes;
			memcpy(out[n], argv[i], len);
		}
		*bytes += len; /* cannot overflow: argv is in memory */
		n++;
	}
	return n;
}

/* One block: the pointer array, then the strings. */
char **flow_launch_strip_option(int argc, char *const *argv,
				const char *option)
{
	size_t bytes, ptrs, total;
	size_t n = keep_args(argc, argv, option, NULL, NULL, &bytes);
	if (!flow_mul_size(n + 1, sizeof(char *), &ptrs) ||
	    !flow_add_size(ptrs, bytes, &total))
		return NULL;
	char **out = malloc(total);
	if (!out)
		return NULL;
	keep_args(argc, argv, option, out, (char *)out + ptrs, &bytes);
	out[n] = NULL;
	return out;
}

#ifndef HAVE_PMIX

int flow_launch(const flow_launch_opts_t *opts, flow_diag_t *diag)
{
	(void)opts;
	flow_diag_set(diag, FLOW_ERR_NOTSUP,
		      "this build has no PMIx: --nproc needs libpmix-dev");
	return -1;
}

#else /* HAVE_PMIX */

#define MAX_RANKS 4096
#define DEFAULT_GRACE_S 5.0
/* GNU timeout sends its SIGTERM twice, to us and to our process group: a
 * repeat sooner than this is not a second request. */
#define REPEAT_SIGNAL_S 0.25
#define TEARDOWN_S 5         /* longest wait for libpmix's own shutdown */
/* A rank often aborts because a peer died; the dead peer's exit may reach
 * us a moment after the abort.  This long it may still take the blame. */
#define ABORT_GRACE_S 0.1

struct rank {
	pid_t pid;      /* 0 until forked */
	int exec_fd;    /* read end of the exec-failure pipe, -1 when done */
	bool connected; /* its PMIx_Init reached us */
	bool finalized; /* its PMIx_Finalize reached us */
	bool reaped;    /* waitpid() returned it */
	bool judged;    /* its exit has been looked at */
	int status;     /* wait status */
	bool aborted;   /* it called PMIx_Abort */
	int abort_status;
	char abort_msg[256];
};

/* One flow_launch call; main thread only. */
typedef struct launch {
	const flow_launch_opts_t *opts;
	const char *prog;   /* prefix of our messages */
	char *path;         /* the program, resolved before anything starts */
	int nranks;
	struct rank *ranks;
	pid_t self;
	char host[256];     /* short hostname, the same everywhere (see
			       short_hostname) */
	pmix_nspace_t nspace;
	char dir[PATH_MAX]; /* private directory; "" until made */
	int evfd;           /* read end of the event pipe */
	/* process state taken over, restored at the end */
	int sfd;
	sigset_t sigs, old_mask;
	struct sigaction old_pipe, old_chld;
	bool pipe_ignored;
	int old_subreaper;
	/* the job */
	double grace_s;
	bool failed;      /* a rank failed the job (the first is reported) */
	int exit_code;    /* the first failed rank's status */
	int cancel_sig;   /* the signal that stopped us, if any */
	double cancel_at; /* when it came */
	bool terminating; /* the ranks are being stopped */
	bool killed;      /* SIGKILL was sent */
	double deadline;  /* when SIGKILL follows */
	int first_abort;  /* the first rank to call PMIx_Abort, or -1 */
	double abort_at;  /* when its call reached us */
} launch_t;

static const int forwarded_signals[] = { SIGINT, SIGTERM, SIGHUP, SIGUSR1,
					 SIGUSR2 };

/* ---- what libpmix's progress thread may touch ------------------------ */

/* The server callbacks run on libpmix's progress thread, so they only
 * post an event through a pipe that the main thread reads.  Fixed size,
 * below PIPE_BUF, so each write arrives whole. */
enum { EV_CONNECTED, EV_FINALIZED, EV_ABORT };
struct event {
	int kind;
	pmix_rank_t rank;
	int status;
	char msg[256];
};

/* The running job's namespace and the pipe's write end.  Under a lock, so
 * a late callback never writes into a descriptor closed and reused. */
static pthread_mutex_t cb_lock = PTHREAD_MUTEX_INITIALIZER;
static pmix_nspace_t cb_nspace;
static int cb_fd = -1;

/* libpmix's server is started once and then serves every flow_launch of
 * this process: libpmix 4.2.2 aborts the process ("bit out of range 0 -
 * FD_SETSIZE") when PMIx_server_init runs again after
 * PMIx_server_finalize, and after a failed job its teardown may block
 * forever (libpmix 4.2.x frees the record of a rank that died during its
 * PMIx_Init handshake twice, and PMIx_server_deregister_nspace or
 * PMIx_server_finalize then waits on that record's mutex).  So it is
 * never finalized; exiting is enough, since nothing of it outlives the
 * process.  Main thread only. */
static bool server_up;
static char server_dir[PATH_MAX]; /* its PMIX_SERVER_TMPDIR */
static unsigned job_seq;

/* What the teardown watchdog's signal handler writes. */
static char watchdog_msg[160];

static void post(int kind, const pmix_proc_t *proc, int status,
		 const char *msg)
{
	struct event ev = { .kind = kind, .rank = proc->rank,
			    .status = status };
	if (msg)
		snprintf(ev.msg, sizeof(ev.msg), "%s", msg);
	pthread_mutex_lock(&cb_lock);
	if (cb_fd >= 0 && PMIX_CHECK_NSPACE(proc->nspace, cb_nspace)) {
		ssize_t w;
		do
			w = write(cb_fd, &ev, sizeof(ev));
		while (w < 0 && errno == EINTR);
	}
	pthread_mutex_unlock(&cb_lock);
}

/* libpmix 4.2.2 calls this after a rank's handshake with no callback.
 * The launcher needs it to tell a rank that exited before PMIx_Init from
 * one that exited without PMIx_Finalize. */
static pmix_status_t on_connected(const pmix_proc_t *proc, void *obj,
				  pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	post(EV_CONNECTED, proc, 0, NULL);
	if (cbfunc)
		cbfunc(PMIX_SUCCESS, cbdata);
	return PMIX_SUCCESS;
}

/* The client stays blocked in PMIx_Finalize until cbfunc runs, so the main
 * thread hears of the finalize before it can see the exit. */
static pmix_status_t on_finalized(const pmix_proc_t *proc, void *obj,
				  pmix_op_cbfunc_t cbfunc, void *cbdata)
{
	post(EV_FINALIZED, proc, 0, NULL);
	if (cbfunc)
		cbfunc(PMIX_SUCCESS, cbdata);
	return PMIX_SUCCESS;
}

/* Without this callback libpmix answers PMIx_Abort with success and does
 * nothing: the job would run on.  Whatever procs it names, the whole job
 * ends, as mpirun does for MPI_Abort. */
static pmix_status_t on_abort(const pmix_proc_t *proc, void *obj, int status,
			      const char msg[], pmix_proc_t procs[],
			      size_t nprocs, pmix_op_cbfunc_t cbfunc,
			      void *cbdata)
{
	post(EV_ABORT, proc, status, msg);
	if (cbfunc)
		cbfunc(PMIX_SUCCESS, cbdata);
	return PMIX_SUCCESS;
}

/* libpmix 4.2.2 hands the fence blob to the host and never frees it
 * (although its header says the data stays the library's): without this
 * release function every collecting fence would leak it. */
static void release_blob(void *cbdata)
{
	free(cbdata);
}

/* With one node the locally collected blob is the global result: hand it
 * back with the local status.  libpmix completes a fence whose members are
 * all local by itself (pmix_server_fence_localonly_opt, on by default), so
 * this runs only with that option off, and nothing may count on seeing
 * fences here. */
static pmix_status_t on_fence(const pmix_proc_t procs[], size_t nprocs,
			      const pmix_info_t info[], size_t ninfo,
			      char *data, size_t ndata,
			      pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
	pmix_status_t st = PMIX_SUCCESS;
	for (size_t i = 0; i < ninfo; i++)
		if (PMIX_CHECK_KEY(&info[i], PMIX_LOCAL_COLLECTIVE_STATUS) &&
		    info[i].value.type == PMIX_STATUS)
			st = info[i].value.data.status;
	if (!cbfunc) {
		free(data);
		return PMIX_SUCCESS;
	}
	cbfunc(st, data, ndata, cbdata, data ? release_blob : NULL, data);
	return PMIX_SUCCESS;
}

/* Everything else stays NULL: libpmix answers "not supported" to what would
 * need it, and asks direct_modex only for the data of procs on other
 * nodes, which a one-node job has none of. */
static pmix_server_module_t server_module = {
	.client_connected = on_connected,
	.client_finalized = on_finalized,
	.abort = on_abort,
	.fence_nb = on_fence,
};

/* ---- small helpers ---------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One line of the launcher's own on stderr (see the top of the file). */
static void say(const launch_t *l, const char *fmt, ...) FLOW_PRINTF(2, 3);
static void say(const launch_t *l, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	flow_log_say(l->prog, fmt, ap);
	va_end(ap);
}

static const char *plural(int n)
{
	return n == 1 ? "" : "s";
}

static int alive(const launch_t *l)
{
	int n = 0;
	for (int r = 0; r < l->nranks; r++)
		n += l->ranks[r].pid > 0 && !l->ranks[r].reaped;
	return n;
}

static bool is_rank(const launch_t *l, pid_t pid)
{
	for (int r = 0; r < l->nranks; r++)
		if (l->ranks[r].pid == pid)
			return true;
	return false;
}

/* The node name as libpmix forms it: gethostname() up to the first dot,
 * unless it is an address.  The server's PMIX_HOSTNAME and the node map
 * must both carry it: under another name libpmix files the node's keys
 * under a second node. */
static void short_hostname(char *buf, size_t len)
{
	unsigned char addr[sizeof(struct in6_addr)];
	if (gethostname(buf, len) != 0)
		snprintf(buf, len, "localhost");
	buf[len - 1] = '\0';
	char *dot = strchr(buf, '.');
	if (dot && inet_pton(AF_INET, buf, addr) != 1 &&
	    inet_pton(AF_INET6, buf, addr) != 1)
		*dot = '\0';
}

/* Remove name (in dirfd) and, for a directory, what it holds; never
 * follows links.  Bounded depth: libpmix makes one level of directories. */
static void remove_tree_at(int dirfd, const char *name, int depth)
{
	if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT || depth > 8)
		return;
	int fd = openat(dirfd, name,
			O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;
	while (d && (de = readdir(d)))
		if (strcmp(de->d_name, ".") != 0 &&
		    strcmp(de->d_name, "..") != 0)
			remove_tree_at(fd, de->d_name, depth + 1);
	if (d)
		closedir(d);
	else if (fd >= 0)
		close(fd);
	unlinkat(dirfd, name, AT_REMOVEDIR);
}

static void remove_private_dir(const launch_t *l)
{
	if (l->dir[0])
		remove_tree_at(AT_FDCWD, l->dir, 0);
}

/* ---- checks before anything starts ----------------------------------- */

static flow_err_t check_opts(const flow_launch_opts_t *opts,
			     flow_diag_t *diag)
{
	if (opts->nproc < 1 || opts->nproc > MAX_RANKS)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot launch %d ranks: expected 1 to %d",
				     opts->nproc, MAX_RANKS);
	if (!opts->argv || !opts->argv[0])
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "no command line for the ranks");
	return FLOW_OK;
}

/* A process that is already one of several ranks must not start ranks of
 * its own: every rank of the outer job would start a job of its own, each
 * training alone.  One of one (srun -n 1, mpirun -n 1) may. */
static flow_err_t check_not_in_job(flow_diag_t *diag)
{
	const char *var, *value;
	long n = flow_launcher_tasks(&var, &value);

	if (n > 1)
		return flow_diag_set(diag, FLOW_ERR_USAGE,
				     "cannot launch ranks from inside a job of %ld ranks (%s=%s): drop --nproc and let the job's launcher start the ranks, or give the job one task",
				     n, var, value);
	return FLOW_OK;
}

/* execvp's search, done once before anything starts.  Returns a malloc'd
 * path, or NULL with errno set. */
static char *find_program(const char *prog)
{
	struct stat st;
	if (strchr(prog, '/')) {
		if (stat(prog, &st) != 0)
			return NULL;
		if (!S_ISREG(st.st_mode) || access(prog, X_OK) != 0) {
			errno = EACCES;
			return NULL;
		}
		return strdup(prog);
	}
	const char *path = getenv("PATH");
	if (!path || !*path)
		path = "/usr/local/bin:/usr/bin:/bin";
	int err = ENOENT;
	for (const char *p = path;; p++) {
		const char *end = strchr(p, ':');
		if (!end)
			end = p + strlen(p);
		char buf[PATH_MAX];
		int w = end == p ? snprintf(buf, sizeof(buf), "%s", prog)
				 : snprintf(buf, sizeof(buf), "%.*s/%s",
					    (int)(end - p), p, prog);
		if (w > 0 && (size_t)w < sizeof(buf) && stat(buf, &st) == 0 &&
		    S_ISREG(st.st_mode)) {
			if (access(buf, X_OK) == 0)
				return strdup(buf);
			err = EACCES;
		}
		if (!*end)
			break;
		p = end;
	}
	errno = err;
	return NULL;
}

/* The program the ranks run; this one (as a real path, so a later rename
 * or exec cannot change it) when path is NULL. */
static char *resolve_program(const char *path, flow_diag_t *diag)
{
	const char *what = path ? path : "/proc/self/exe";
	char *found = path ? find_program(path) : realpath(what, NULL);
	if (found)
		return found;
	int e = errno;
	if (e == ENOMEM)
		flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	else if (e == ENOENT && path && !strchr(path, '/'))
		flow_diag_set(diag, FLOW_ERR_IO,
			      "cannot find program '%s' in PATH", path);
	else
		flow_diag_errno(diag, FLOW_ERR_IO, e,
				"cannot execute '%s'", what);
	return NULL;
}

/* ---- set-up ----------------------------------------------------------- */

static void launch_init(launch_t *l, const flow_launch_opts_t *opts)
{
	memset(l, 0, sizeof(*l));
	l->opts = opts;
	l->prog = opts->prog ? opts->prog : "flow";
	l->nranks = opts->nproc;
	l->self = getpid();
	l->evfd = -1;
	l->sfd = -1;
	l->first_abort = -1;
	l->grace_s = opts->grace_s > 0 ? opts->grace_s : DEFAULT_GRACE_S;
	short_hostname(l->host, sizeof(l->host));
	snprintf(l->nspace, sizeof(l->nspace), "flow.%.64s.%d.%u", l->host,
		 (int)l->self, job_seq++);
}

/* Short (socket paths must fit if some libpmix puts one there) and private
 * to this launcher: libpmix keeps its shared-memory data store there when
 * that store is used (clients reach the server over loopback TCP, not
 * through the directory).  The server keeps the directory it was started
 * with, so a later job of this process makes it again under the same name
 * (mkdir fails rather than take over one that someone else made). */
static flow_err_t make_private_dir(launch_t *l, flow_diag_t *diag)
{
	const char *tmp = getenv("TMPDIR");
	if (server_up) {
		snprintf(l->dir, sizeof(l->dir), "%s", server_dir);
		if (mkdir(l->dir, 0700) == 0)
			return FLOW_OK;
		l->dir[0] = '\0';
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot create a directory '%s'",
				       server_dir);
	}
	snprintf(l->dir, sizeof(l->dir), "%s/flowl.XXXXXX",
		 tmp && *tmp == '/' && strlen(tmp) < 64 ? tmp : "/tmp");
	if (!mkdtemp(l->dir)) {
		int e = errno;
		flow_diag_errno(diag, FLOW_ERR_IO, e,
				"cannot create a directory '%s'", l->dir);
		l->dir[0] = '\0';
		return FLOW_ERR_IO;
	}
	snprintf(server_dir, sizeof(server_dir), "%s", l->dir);
	return FLOW_OK;
}

/* Signals are blocked before libpmix starts its threads, so those inherit
 * the mask and only our signalfd sees them.  One we were started with
 * ignored (nohup's SIGHUP, SIGINT of a background job) stays ignored.
 * SIGCHLD must not be ignored (children would reap themselves); SIGPIPE
 * must be: the server writes to clients that may be gone. */
static flow_err_t take_process_state(launch_t *l, flow_diag_t *diag)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	struct sigaction ign = { .sa_handler = SIG_IGN };
	sigemptyset(&l->sigs);
	sigaddset(&l->sigs, SIGCHLD);
	for (size_t i = 0; i < sizeof(forwarded_signals) /
				       sizeof(forwarded_signals[0]); i++) {
		struct sigaction old;
		if (sigaction(forwarded_signals[i], NULL, &old) == 0 &&
		    old.sa_handler == SIG_IGN)
			continue;
		sigaddset(&l->sigs, forwarded_signals[i]);
	}
	sigprocmask(SIG_BLOCK, &l->sigs, &l->old_mask);
	sigaction(SIGCHLD, &dfl, &l->old_chld);
	sigaction(SIGPIPE, &ign, &l->old_pipe);
	l->pipe_ignored = l->old_pipe.sa_handler == SIG_IGN;
	if (prctl(PR_GET_CHILD_SUBREAPER, &l->old_subreaper) != 0)
		l->old_subreaper = 0;
	/* What the ranks leave behind becomes ours, not init's. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	l->sfd = signalfd(-1, &l->sigs, SFD_CLOEXEC | SFD_NONBLOCK);
	if (l->sfd < 0)
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot create a signalfd");
	return FLOW_OK;
}

/* Signals still pending are consumed first: SIGUSR1/2 have no rank left to
 * go to, and an ending one makes this a cancelled job. */
static void restore_process_state(launch_t *l)
{
	struct signalfd_siginfo si;
	while (l->sfd >= 0 && read(l->sfd, &si, sizeof(si)) == sizeof(si)) {
		int s = (int)si.ssi_signo;
		if (!l->cancel_sig && (s == SIGINT || s == SIGTERM ||
				       s == SIGHUP))
			l->cancel_sig = s;
	}
	if (l->sfd >= 0)
		close(l->sfd);
	l->sfd = -1;
	prctl(PR_SET_CHILD_SUBREAPER, l->old_subreaper);
	sigaction(SIGPIPE, &l->old_pipe, NULL);
	sigaction(SIGCHLD, &l->old_chld, NULL);
	sigprocmask(SIG_SETMASK, &l->old_mask, NULL);
}

/* pipe2 is hidden from us (see the includes); nothing forks between the
 * two calls, since only this thread forks. */
static flow_err_t make_pipe(int fds[2], flow_diag_t *diag)
{
	if (pipe(fds) != 0)
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot create a pipe");
	fcntl(fds[0], F_SETFD, FD_CLOEXEC);
	fcntl(fds[1], F_SETFD, FD_CLOEXEC);
	return FLOW_OK;
}

static flow_err_t open_events(launch_t *l, flow_diag_t *diag)
{
	int fds[2];
	if (make_pipe(fds, diag) != FLOW_OK)
		return FLOW_ERR_IO;
	fcntl(fds[0], F_SETFL, O_NONBLOCK);
	l->evfd = fds[0];
	pthread_mutex_lock(&cb_lock);
	memcpy(cb_nspace, l->nspace, sizeof(cb_nspace));
	cb_fd = fds[1];
	pthread_mutex_unlock(&cb_lock);
	return FLOW_OK;
}

static void close_events(launch_t *l)
{
	pthread_mutex_lock(&cb_lock);
	if (cb_fd >= 0)
		close(cb_fd);
	cb_fd = -1;
	pthread_mutex_unlock(&cb_lock);
	if (l->evfd >= 0)
		close(l->evfd);
	l->evfd = -1;
}

/* ---- PMIx info lists, with a sticky status ---------------------------- */

static void *list_start(pmix_status_t *rc)
{
	void *list = PMIx_Info_list_start();
	if (!list && *rc == PMIX_SUCCESS)
		*rc = PMIX_ERR_NOMEM;
	return list;
}

static void add_info(void *list, pmix_status_t *rc, const char *key,
		     const void *val, pmix_data_type_t type)
{
	if (list && *rc == PMIX_SUCCESS)
		*rc = PMIx_Info_list_add(list, key, val, type);
}

/* Turn list into *da (release with PMIX_DATA_ARRAY_DESTRUCT) and free it. */
static void list_finish(void *list, pmix_data_array_t *da, pmix_status_t *rc)
{
	PMIX_DATA_ARRAY_INIT(da, PMIX_INFO);
	if (list && *rc == PMIX_SUCCESS)
		*rc = PMIx_Info_list_convert(list, da);
	if (list)
		PMIx_Info_list_release(list);
}

/* Store list `inner` under `key` of `outer`, as an array of info. */
static void add_list(void *outer, pmix_status_t *rc, const char *key,
		     void *inner)
{
	pmix_data_array_t da;
	list_finish(inner, &da, rc);
	add_info(outer, rc, key, &da, PMIX_DATA_ARRAY); /* copies */
	PMIX_DATA_ARRAY_DESTRUCT(&da);
}

/* ---- the server and the job ------------------------------------------ */

/* No tool or system support: nothing listens for tools and no rendezvous
 * file is written.  Clients get the server's URI, a loopback TCP port of
 * its own (which keeps launchers running at once apart), from
 * PMIx_server_setup_fork. */
static flow_err_t start_server(launch_t *l, flow_diag_t *diag)
{
	if (server_up)
		return FLOW_OK;
	/* Job data in each client's memory (the hash store), not in
	 * libpmix's default shared-memory files: with those PMIx_Init is
	 * slower, a PMIx_Get before a fence may miss a peer's data, a
	 * killed rank may leave a lock held, and libpmix may still be
	 * writing them while the directory is removed after a failure.  A
	 * user's own choice wins. */
	setenv("PMIX_MCA_gds", "hash", 0);
	pmix_nspace_t srv;
	snprintf(srv, sizeof(srv), "flow-srv.%.64s.%d", l->host, (int)l->self);
	bool no = false;
	uint32_t zero = 0;
	pmix_rank_t srv_rank = 0;
	pmix_status_t rc = PMIX_SUCCESS;
	void *il = list_start(&rc);
	add_info(il, &rc, PMIX_SERVER_TMPDIR, l->dir, PMIX_STRING);
	add_info(il, &rc, PMIX_SYSTEM_TMPDIR, l->dir, PMIX_STRING);
	add_info(il, &rc, PMIX_SERVER_NSPACE, srv, PMIX_STRING);
	add_info(il, &rc, PMIX_SERVER_RANK, &srv_rank, PMIX_PROC_RANK);
	add_info(il, &rc, PMIX_HOSTNAME, l->host, PMIX_STRING);
	add_info(il, &rc, PMIX_NODEID, &zero, PMIX_UINT32);
	add_info(il, &rc, PMIX_SERVER_TOOL_SUPPORT, &no, PMIX_BOOL);
	add_info(il, &rc, PMIX_SERVER_SYSTEM_SUPPORT, &no, PMIX_BOOL);
	add_info(il, &rc, PMIX_SERVER_REMOTE_CONNECTIONS, &no, PMIX_BOOL);
	pmix_data_array_t da;
	list_finish(il, &da, &rc);
	if (rc == PMIX_SUCCESS)
		rc = PMIx_server_init(&server_module, (pmix_info_t *)da.array,
				      da.size);
	PMIX_DATA_ARRAY_DESTRUCT(&da);
	if (rc != PMIX_SUCCESS)
		return flow_diag_set(diag, FLOW_ERR_IO,
				     "cannot start the PMIx server: %s",
				     PMIx_Error_string(rc));
	server_up = true;
	return FLOW_OK;
}

/* Strings the job description needs, malloc'd. */
struct job_text {
	char *peers;   /* "0,1,...,n-1" */
	char *nodemap; /* PMIx_generate_regex(host) */
	char *procmap; /* PMIx_generate_ppn(peers) */
	char *args;    /* argv joined with spaces */
	char cwd[PATH_MAX];
};

static char *rank_list(int n)
{
	size_t len;
	if (!flow_mul_size((size_t)n, 6, &len))
		return NULL;
	char *s = malloc(len + 1), *p = s;
	if (!s)
		return NULL;
	*p = '\0';
	for (int r = 0; r < n; r++)
		p += snprintf(p, len + 1 - (size_t)(p - s), "%s%d",
			      r ? "," : "", r);
	return s;
}

static char *join_args(char *const *argv)
{
	size_t len = 1;
	for (char *const *a = argv; *a; a++)
		if (!flow_add_size(len, strlen(*a) + 1, &len))
			return NULL;
	char *s = malloc(len), *p = s;
	for (char *const *a = argv; s && *a; a++) {
		size_t n = strlen(*a);
		if (a != argv)
			*p++ = ' ';
		memcpy(p, *a, n);
		p += n;
	}
	if (s)
		*p = '\0';
	return s;
}

static void job_text_release(struct job_text *t)
{
	free(t->peers);
	free(t->nodemap);
	free(t->procmap);
	free(t->args);
}

static flow_err_t job_text_init(const launch_t *l, struct job_text *t,
				flow_diag_t *diag)
{
	memset(t, 0, sizeof(*t));
	if (!getcwd(t->cwd, sizeof(t->cwd)))
		return flow_diag_errno(diag, FLOW_ERR_IO, errno,
				       "cannot get the working directory");
	t->peers = rank_list(l->nranks);
	t->args = join_args(l->opts->argv);
	if (!t->peers || !t->args ||
	    PMIx_generate_regex(l->host, &t->nodemap) != PMIX_SUCCESS ||
	    PMIx_generate_ppn(t->peers, &t->procmap) != PMIX_SUCCESS)
		return flow_diag_set(diag, FLOW_ERR_NOMEM,
				     "cannot describe the job: out of memory");
	return FLOW_OK;
}

/* Job level, asked with PMIX_RANK_WILDCARD; the universe is the job, as
 * under Slurm.  libpmix derives PMIX_NODE_LIST and every rank's
 * PMIX_HOSTNAME from the two maps. */
static void describe_job(const launch_t *l, const struct job_text *t,
			 void *job, pmix_status_t *rc)
{
	uint32_t n = (uint32_t)l->nranks, one = 1;
	bool no = false;
	add_info(job, rc, PMIX_JOBID, l->nspace, PMIX_STRING);
	add_info(job, rc, PMIX_SPAWNED, &no, PMIX_BOOL);
	add_info(job, rc, PMIX_JOB_SIZE, &n, PMIX_UINT32);
	add_info(job, rc, PMIX_UNIV_SIZE, &n, PMIX_UINT32);
	add_info(job, rc, PMIX_MAX_PROCS, &n, PMIX_UINT32);
	add_info(job, rc, PMIX_NUM_NODES, &one, PMIX_UINT32);
	add_info(job, rc, PMIX_JOB_NUM_APPS, &one, PMIX_UINT32);
	add_info(job, rc, PMIX_TMPDIR, l->dir, PMIX_STRING);
	add_info(job, rc, PMIX_NSDIR, l->dir, PMIX_STRING);
	add_info(job, rc, PMIX_NODE_MAP, t->nodemap, PMIX_REGEX);
	add_info(job, rc, PMIX_PROC_MAP, t->procmap, PMIX_REGEX);
}

static void describe_node(const launch_t *l, const struct job_text *t,
			  void *job, pmix_status_t *rc)
{
	uint32_t n = (uint32_t)l->nranks, zero = 0;
	pmix_rank_t r0 = 0;
	void *node = list_start(rc);
	add_info(node, rc, PMIX_HOSTNAME, l->host, PMIX_STRING);
	add_info(node, rc, PMIX_NODEID, &zero, PMIX_UINT32);
	add_info(node, rc, PMIX_LOCAL_SIZE, &n, PMIX_UINT32);
	add_info(node, rc, PMIX_NODE_SIZE, &n, PMIX_UINT32);
	add_info(node, rc, PMIX_LOCAL_PEERS, t->peers, PMIX_STRING);
	add_info(node, rc, PMIX_LOCALLDR, &r0, PMIX_PROC_RANK);
	add_list(job, rc, PMIX_NODE_INFO_ARRAY, node);
}

static void describe_app(const launch_t *l, const struct job_text *t,
			 void *job, pmix_status_t *rc)
{
	uint32_t n = (uint32_t)l->nranks, zero = 0;
	pmix_rank_t r0 = 0;
	void *app = list_start(rc);
	add_info(app, rc, PMIX_APPNUM, &zero, PMIX_UINT32);
	add_info(app, rc, PMIX_APP_SIZE, &n, PMIX_UINT32);
	add_info(app, rc, PMIX_APPLDR, &r0, PMIX_PROC_RANK);
	add_info(app, rc, PMIX_WDIR, t->cwd, PMIX_STRING);
	add_info(app, rc, PMIX_APP_ARGV, t->args, PMIX_STRING);
	add_list(job, rc, PMIX_APP_INFO_ARRAY, app);
}

/* One node, one app: local, node, global and app rank all equal the rank.
 * PMIX_RANK must come first, and once PMIX_PROC_DATA is given libpmix no
 * longer derives LOCAL_RANK, NODE_RANK and NODEID itself. */
static void describe_rank(const launch_t *l, int r, void *job,
			  pmix_status_t *rc)
{
	pmix_rank_t rank = (pmix_rank_t)r;
	uint16_t r16 = (uint16_t)r;
	uint32_t zero = 0;
	void *proc = list_start(rc);
	add_info(proc, rc, PMIX_RANK, &rank, PMIX_PROC_RANK);
	add_info(proc, rc, PMIX_LOCAL_RANK, &r16, PMIX_UINT16);
	add_info(proc, rc, PMIX_NODE_RANK, &r16, PMIX_UINT16);
	add_info(proc, rc, PMIX_GLOBAL_RANK, &rank, PMIX_PROC_RANK);
	add_info(proc, rc, PMIX_APP_RANK, &rank, PMIX_PROC_RANK);
	add_info(proc, rc, PMIX_APPNUM, &zero, PMIX_UINT32);
	add_info(proc, rc, PMIX_NODEID, &zero, PMIX_UINT32);
	add_info(proc, rc, PMIX_HOSTNAME, l->host, PMIX_STRING);
	add_info(proc, rc, PMIX_REINCARNATION, &zero, PMIX_UINT32);
	add_list(job, rc, PMIX_PROC_DATA, proc);
}

static bool pmix_ok(pmix_status_t rc)
{
	return rc == PMIX_SUCCESS || rc == PMIX_OPERATION_SUCCEEDED;
}

/* Blocking calls (NULL callbacks) that return once libpmix has stored the
 * namespace and its clients, with PMIX_OPERATION_SUCCEEDED. */
static flow_err_t register_job(const launch_t *l, flow_diag_t *diag)
{
	struct job_text t;
	pmix_status_t rc = PMIX_SUCCESS;
	flow_err_t err = job_text_init(l, &t, diag);
	if (err != FLOW_OK)
		goto out_release_text;
	void *job = list_start(&rc);
	describe_job(l, &t, job, &rc);
	describe_node(l, &t, job, &rc);
	describe_app(l, &t, job, &rc);
	for (int r = 0; r < l->nranks; r++)
		describe_rank(l, r, job, &rc);
	pmix_data_array_t da;
	list_finish(job, &da, &rc);
	if (rc == PMIX_SUCCESS)
		rc = PMIx_server_register_nspace(l->nspace, l->nranks,
						 (pmix_info_t *)da.array,
						 da.size, NULL, NULL);
	PMIX_DATA_ARRAY_DESTRUCT(&da);
	for (int r = 0; pmix_ok(rc) && r < l->nranks; r++) {
		pmix_proc_t p;
		PMIX_LOAD_PROCID(&p, l->nspace, (pmix_rank_t)r);
		rc = PMIx_server_register_client(&p, geteuid(), getegid(),
						 NULL, NULL, NULL);
	}
	if (!pmix_ok(rc))
		err = flow_diag_set(diag, FLOW_ERR_IO,
				    "cannot register the job with the PMIx server: %s",
				    PMIx_Error_string(rc));
out_release_text:
	job_text_release(&t);
	return err;
}

/* ---- starting the ranks ----------------------------------------------- */

static void free_env(char **env)
{
	for (char **e = env; e && *e; e++)
		free(*e);
	free(env);
}

/* Left by an outer launcher (srun, mpirun): the ranks must talk to our
 * server only.  PMIX_MCA_* are the user's settings and stay. */
static bool outer_pmix_var(const char *s)
{
	return strncmp(s, "PMIX_", 5) == 0 && strncmp(s, "PMIX_MCA_", 9) != 0;
}

/* A deep malloc'd copy, since PMIx_server_setup_fork edits it in place and
 * frees what it replaces.  NULL when out of memory. */
static char **copy_env(char *const *src, bool scrub)
{
	size_t n = 0, k = 0, bytes;
	while (src[n])
		n++;
	if (!flow_mul_size(n + 1, sizeof(char *), &bytes))
		return NULL;
	char **env = calloc(1, bytes);
	for (size_t i = 0; env && i < n; i++) {
		if (scrub && outer_pmix_var(src[i]))
			continue;
		if (!(env[k++] = strdup(src[i]))) {
			free_env(env);
			return NULL;
		}
	}
	return env;
}

/* The child side of fork().  libpmix runs threads, so only
 * async-signal-safe calls from here to execve (the environment was built,
 * and isatty checked, in the parent). */
static _Noreturn void exec_rank(const launch_t *l, char **env, int errfd,
				int stdin_fd)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	setpgid(0, 0);                    /* we signal the whole group */
	prctl(PR_SET_PDEATHSIG, SIGKILL); /* die with the launcher */
	if (getppid() != l->self)
		_exit(127); /* it died before prctl */
	/* The caller's handlers must not run here once the mask is gone. */
	for (int s = 1; s < NSIG; s++)
		if (sigismember(&l->sigs, s) == 1)
			sigaction(s, &dfl, NULL);
	sigprocmask(SIG_SETMASK, &l->old_mask, NULL); /* masks survive exec */
	if (!l->pipe_ignored)
		sigaction(SIGPIPE, &dfl, NULL); /* so do ignored signals */
	if (stdin_fd >= 0)
		dup2(stdin_fd, STDIN_FILENO);
	execve(l->path, l->opts->argv, env);
	int e = errno;
	ssize_t w = write(errfd, &e, sizeof(e));
	(void)w;
	_exit(127);
}

static flow_err_t spawn_rank(launch_t *l, int r, char *const *base,
			     int stdin_fd, flow_diag_t *diag)
{
	pmix_proc_t p;
	PMIX_LOAD_PROCID(&p, l->nspace, (pmix_rank_t)r);
	char **env = copy_env(base, false);
	if (!env)
		return flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
	pmix_status_t rc = PMIx_server_setup_fork(&p, &env);
	if (rc != PMIX_SUCCESS) {
		free_env(env);
		return flow_diag_set(diag, FLOW_ERR_IO,
				     "cannot set up rank %d: %s", r,
				     PMIx_Error_string(rc));
	}
	int ep[2];
	if (make_pipe(ep, diag) != FLOW_OK) {
		free_env(env);
		return FLOW_ERR_IO;
	}
	pid_t pid = fork();
	if (pid == 0)
		exec_rank(l, env, ep[1], stdin_fd);
	int e = errno;
	close(ep[1]);
	free_env(env);
	if (pid < 0) {
		close(ep[0]);
		return flow_diag_errno(diag, FLOW_ERR_IO, e,
				       "cannot start rank %d", r);
	}
	setpgid(pid, pid); /* here too, so a signal never misses the group */
	l->ranks[r].pid = pid;
	l->ranks[r].exec_fd = ep[0];
	return FLOW_OK;
}

/* An exec failure comes back through the pipe; a successful exec closes
 * it.  Reads every pipe; the first failure goes into diag. */
static flow_err_t check_execs(launch_t *l, flow_diag_t *diag)
{
	flow_err_t err = FLOW_OK;
	for (int r = 0; r < l->nranks; r++) {
		struct rank *rk = &l->ranks[r];
		if (rk->exec_fd < 0)
			continue;
		int e = 0;
		ssize_t n;
		do
			n = read(rk->exec_fd, &e, sizeof(e));
		while (n < 0 && errno == EINTR);
		close(rk->exec_fd);
		rk->exec_fd = -1;
		if (n == (ssize_t)sizeof(e) && err == FLOW_OK)
			err = flow_diag_errno(diag, FLOW_ERR_IO, e,
					      "cannot execute '%s'", l->path);
	}
	return err;
}

static void drain_events(launch_t *l);
static void signal_all(const launch_t *l, int sig);

/* The job never really started: kill and reap what did. */
static void abandon_ranks(launch_t *l)
{
	signal_all(l, SIGKILL);
	for (int r = 0; r < l->nranks; r++) {
		struct rank *rk = &l->ranks[r];
		if (rk->exec_fd >= 0)
			close(rk->exec_fd);
		rk->exec_fd = -1;
		if (rk->pid > 0 && !rk->reaped)
			while (waitpid(rk->pid, NULL, 0) < 0 && errno == EINTR)
				;
		rk->reaped = true;
	}
}

/* Rank 0 reads our stdin unless it is a terminal (a background process
 * group cannot); the others read /dev/null.  Events are read between
 * forks: the pipe is finite and the server thread must never block on it
 * while we wait in PMIx_server_setup_fork. */
static flow_err_t start_ranks(launch_t *l, flow_diag_t *diag)
{
	flow_err_t err = FLOW_ERR_NOMEM;
	int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	bool tty_in = isatty(STDIN_FILENO);
	char **base = copy_env(environ, true);
	if (!base) {
		flow_diag_set(diag, err, "out of memory");
		goto out_close;
	}
	fflush(NULL); /* nothing buffered shows up twice or out of order */
	err = FLOW_OK;
	for (int r = 0; r < l->nranks && err == FLOW_OK && !l->terminating;
	     r++) {
		int in = r == 0 && !tty_in ? -1 : devnull;
		err = spawn_rank(l, r, base, in, diag);
		drain_events(l);
	}
	if (err == FLOW_OK)
		err = check_execs(l, diag);
	if (err != FLOW_OK)
		abandon_ranks(l);
	free_env(base);
out_close:
	if (devnull >= 0)
		close(devnull);
	return err;
}

/* ---- stopping ----------------------------------------------------------- */

/* Our children that are not ranks: what ranks started and left behind,
 * handed to us as child subreaper.  They are unreaped children, so their
 * pids cannot have been reused.  Returns how many were signalled. */
static int signal_strays(const launch_t *l, int sig)
{
	int n = 0;
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	while (d && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char file[64];
		snprintf(file, sizeof(file), "/proc/self/task/%.20s/children",
			 de->d_name);
		FILE *f = fopen(file, "r");
		long pid;
		while (f && fscanf(f, "%ld", &pid) == 1) {
			if (is_rank(l, (pid_t)pid))
				continue;
			kill((pid_t)pid, sig);
			n++;
		}
		if (f)
			fclose(f);
	}
	if (d)
		closedir(d);
	return n;
}

/* Every running rank with its process group, and the strays. */
static void signal_all(const launch_t *l, int sig)
{
	for (int r = 0; r < l->nranks; r++) {
		const struct rank *rk = &l->ranks[r];
		if (rk->pid > 0 && !rk->reaped && kill(-rk->pid, sig) != 0)
			kill(rk->pid, sig);
	}
	signal_strays(l, sig);
}

static void send_kill(launch_t *l)
{
	signal_all(l, SIGKILL);
	l->killed = true;
}

/* SIGTERM now, unless a forwarded signal is doing that already; SIGKILL
 * when the grace period is over.  SIGCONT follows either, so that a rank
 * stopped with SIGSTOP (the one whose peers gave up on it) acts on the
 * signal, removing its temporaries, instead of waiting for the SIGKILL. */
static void stop_job(launch_t *l, bool send_term)
{
	if (l->terminating)
		return;
	l->terminating = true;
	l->deadline = now_s() + l->grace_s;
	if (send_term)
		signal_all(l, SIGTERM);
	signal_all(l, SIGCONT);
}

/* Rank r failed the job with exit status `code`.  Only the first failure
 * counts and is reported, and none after the user stopped us. */
static void fail(launch_t *l, int r, int code, const char *what)
{
	if (l->failed)
		return;
	l->failed = true;
	l->exit_code = code & 0xff ? code & 0xff : 1;
	const struct rank *rk = &l->ranks[r];
	int others = alive(l) - (rk->pid > 0 && !rk->reaped);
	if (!l->cancel_sig && others > 0)
		say(l, "rank %d %s; stopping the other %d rank%s", r, what,
		    others, plural(others));
	else if (!l->cancel_sig)
		say(l, "rank %d %s", r, what);
	stop_job(l, true);
}

/* ---- the main loop ------------------------------------------------------ */

/* A message from a client is printed as one line. */
static void flatten(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20)
			*s = ' ';
}

static void handle_event(launch_t *l, struct event *ev)
{
	if (ev->rank >= (pmix_rank_t)l->nranks)
		return;
	struct rank *rk = &l->ranks[ev->rank];
	switch (ev->kind) {
	case EV_CONNECTED:
		rk->connected = true;
		break;
	case EV_FINALIZED:
		rk->finalized = true;
		break;
	case EV_ABORT: /* judged by judge(), with the exits */
		if (rk->aborted)
			break;
		rk->aborted = true;
		rk->abort_status = ev->status;
		ev->msg[sizeof(ev->msg) - 1] = '\0';
		flatten(ev->msg);
		memcpy(rk->abort_msg, ev->msg, sizeof(rk->abort_msg));
		if (l->first_abort < 0) {
			l->first_abort = (int)ev->rank;
			l->abort_at = now_s();
		}
		break;
	}
}

static void drain_events(launch_t *l)
{
	struct event ev;
	while (read(l->evfd, &ev, sizeof(ev)) == (ssize_t)sizeof(ev))
		handle_event(l, &ev);
}

/* Ranks are recorded; strays are just reaped. */
static void reap(launch_t *l)
{
	int st;
	pid_t pid;
	while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
		for (int r = 0; r < l->nranks; r++) {
			if (l->ranks[r].pid != pid)
				continue;
			l->ranks[r].reaped = true;
			l->ranks[r].status = st;
			break;
		}
	}
}

/* The exit status a rank's end gives the job (0: it did its part), with
 * what happened in `what`.  Every rank is a flow program, which joins the
 * job and leaves it: one that leaves before PMIx_Finalize has failed, even
 * with status 0.  (A launcher of any program could not tell a rank that
 * exited 0 before PMIx_Init from a program without PMIx, and its peers
 * would wait in their first fence forever.) */
static int verdict(const struct rank *rk, char *what, size_t len)
{
	if (WIFSIGNALED(rk->status)) {
		int s = WTERMSIG(rk->status);
		snprintf(what, len, "was killed by signal %d (%s)", s,
			 strsignal(s));
		return 128 + s;
	}
	int code = WEXITSTATUS(rk->status);
	if (code != 0)
		snprintf(what, len, "exited with status %d", code);
	else if (!rk->connected)
		snprintf(what, len, "exited with status 0 before PMIx_Init");
	else if (!rk->finalized)
		snprintf(what, len,
			 "exited with status 0 without PMIx_Finalize");
	else
		return 0;
	return code ? code : 1;
}

/* Exits reaped together have no order.  A rank killed by a signal (or a
 * shell's report of one) is taken as the cause, since its peers fail
 * because it is gone; else the lowest rank. */
static bool is_likelier_cause(int code, int best)
{
	return best == 0 || (code > 128 && best <= 128);
}

/* Look at the ranks reaped since last time and at the aborts.  Runs after
 * drain_events(), so a rank's finalize or abort, posted before it could
 * exit, is already known.  A rank that failed on its own (a crash, a
 * non-zero exit without PMIx_Abort) is the cause before any rank that
 * aborted, which is often only reporting it: the first abort is judged
 * once ABORT_GRACE_S has passed without such a failure, or at the end. */
static void judge(launch_t *l, bool at_end)
{
	char what[320], cause_what[320];
	int cause = -1, cause_code = 0;
	for (int r = 0; r < l->nranks; r++) {
		struct rank *rk = &l->ranks[r];
		if (!rk->reaped || rk->judged)
			continue;
		rk->judged = true;
		int code = verdict(rk, what, sizeof(what));
		if (code == 0 || rk->aborted ||
		    !is_likelier_cause(code, cause_code))
			continue;
		cause = r;
		cause_code = code;
		memcpy(cause_what, what, sizeof(what));
	}
	if (l->terminating) /* we are stopping it */
		return;
	if (cause >= 0) {
		fail(l, cause, cause_code, cause_what);
	} else if (l->first_abort >= 0 &&
		   (at_end || now_s() - l->abort_at >= ABORT_GRACE_S)) {
		const struct rank *rk = &l->ranks[l->first_abort];
		snprintf(what, sizeof(what), "called PMIx_Abort(%d%s%s)",
			 rk->abort_status, rk->abort_msg[0] ? ", " : "",
			 rk->abort_msg);
		fail(l, l->first_abort, rk->abort_status, what);
	}
}

/* SIGINT, SIGTERM or SIGHUP: passed on, and the job stops.  The same
 * request again 0.25 s or more later means "now". */
static void handle_cancel(launch_t *l, int sig)
{
	if (!l->terminating) {
		l->cancel_sig = sig;
		l->cancel_at = now_s();
		int n = alive(l);
		say(l, "got signal %d (%s); passing it to %d rank%s", sig,
		    strsignal(sig), n, plural(n));
		signal_all(l, sig);
		stop_job(l, false);
	} else if (!l->killed && now_s() - l->cancel_at >= REPEAT_SIGNAL_S) {
		if (!l->cancel_sig)
			l->cancel_sig = sig;
		say(l, "got signal %d (%s) while stopping; killing the ranks",
		    sig, strsignal(sig));
		send_kill(l);
	}
}

static void handle_signals(launch_t *l)
{
	struct signalfd_siginfo si;
	while (read(l->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		int sig = (int)si.ssi_signo;
		if (sig == SIGUSR1 || sig == SIGUSR2)
			signal_all(l, sig);
		else if (sig != SIGCHLD) /* reap() runs after every wake-up */
			handle_cancel(l, sig);
	}
}

static int ms_until(double t)
{
	double left = t - now_s();
	return left <= 0 ? 0 : (int)(left * 1e3) + 1;
}

static int poll_timeout_ms(const launch_t *l)
{
	if (!l->terminating && l->first_abort >= 0)
		return ms_until(l->abort_at + ABORT_GRACE_S);
	if (!l->terminating || l->killed)
		return -1;
	return ms_until(l->deadline);
}

/* Until every rank has been reaped: signals, server events, exits, the
 * SIGKILL deadline.  The order matters: exits are collected first and
 * judged only after the events that came before them. */
static void run(launch_t *l)
{
	while (alive(l) > 0) {
		struct pollfd pfd[2] = { { .fd = l->sfd, .events = POLLIN },
					 { .fd = l->evfd, .events = POLLIN } };
		if (poll(pfd, 2, poll_timeout_ms(l)) < 0 && errno != EINTR) {
			/* only ENOMEM is possible: wait a little, retry */
			struct timespec ts = { 0, 10 * 1000 * 1000 };
			nanosleep(&ts, NULL);
		}
		handle_signals(l);
		reap(l);
		drain_events(l);
		judge(l, false);
		int n = alive(l);
		if (l->terminating && !l->killed && n > 0 &&
		    now_s() >= l->deadline) {
			say(l, "%d rank%s still running %.1f s after SIGTERM; sending SIGKILL",
			    n, plural(n), l->grace_s);
			send_kill(l);
		}
	}
	drain_events(l);
	judge(l, true);
}

/* After a failure or a cancel nothing a rank started may stay: kill and
 * reap the strays (their own orphans come to us in turn). */
static void kill_strays(launch_t *l)
{
	for (int k = 0; k < 100 && signal_strays(l, SIGKILL) > 0; k++) {
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
	}
}

/* ---- the end ------------------------------------------------------------ */

static void on_watchdog(int sig)
{
	ssize_t w = write(STDERR_FILENO, watchdog_msg, strlen(watchdog_msg));
	(void)w;
	_exit(0); /* only a clean job is torn down */
}

/* Only after a clean job: after a failure libpmix 4.2 may block forever
 * in its own teardown (see server_up), and the namespace can simply stay.
 * Even so, a watchdog. */
static void deregister_job(const launch_t *l)
{
	struct sigaction sa = { .sa_handler = on_watchdog }, old;
	snprintf(watchdog_msg, sizeof(watchdog_msg),
		 "%s: libpmix did not let the job go within %d s; exiting without it\n",
		 l->prog, TEARDOWN_S);
	fflush(NULL);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, &old);
	unsigned before = alarm(TEARDOWN_S);
	PMIx_server_deregister_nspace(l->nspace, NULL, NULL);
	alarm(0);
	sigaction(SIGALRM, &old, NULL);
	if (before)
		alarm(before);
}

/* A rank killed while setting up a shared-memory communicator leaves its
 * segment's name behind (the others unlink it once all have mapped it):
 * after a failure, remove every name of this job (flow_job_hash). */
static void remove_job_segments(const launch_t *l)
{
	char prefix[32];
	snprintf(prefix, sizeof prefix, "flow-%016" PRIx64 "-",
		 flow_job_hash(l->nspace));
	DIR *d = opendir("/dev/shm");
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
			(void)unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
}

/* The status to return once every rank is gone.  Stopped by a signal, we
 * end by it, so a calling shell sees it (the caller's own handler, restored
 * by now, runs first). */
static int finish(launch_t *l)
{
	int status = l->cancel_sig ? 128 + l->cancel_sig
		     : l->failed ? l->exit_code : 0;
	if (status == 0)
		deregister_job(l);
	else
		remove_job_segments(l);
	remove_private_dir(l); /* again: a late libpmix write may re-make it */
	if (l->cancel_sig)
		raise(l->cancel_sig);
	return status;
}

int flow_launch(const flow_launch_opts_t *opts, flow_diag_t *diag)
{
	launch_t l;
	bool ran = false;
	if (check_opts(opts, diag) != FLOW_OK ||
	    check_not_in_job(diag) != FLOW_OK)
		return -1;
	launch_init(&l, opts);
	l.path = resolve_program(opts->path, diag);
	if (!l.path)
		return -1;
	l.ranks = calloc((size_t)l.nranks, sizeof(*l.ranks));
	if (!l.ranks) {
		flow_diag_set(diag, FLOW_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	for (int r = 0; r < l.nranks; r++)
		l.ranks[r].exec_fd = -1;
	if (make_private_dir(&l, diag) != FLOW_OK)
		goto out_free;
	if (take_process_state(&l, diag) != FLOW_OK ||
	    open_events(&l, diag) != FLOW_OK)
		goto out_restore_state;
	if (start_server(&l, diag) != FLOW_OK ||
	    register_job(&l, diag) != FLOW_OK ||
	    start_ranks(&l, diag) != FLOW_OK)
		goto out_close_events;
	run(&l);
	if (l.failed || l.cancel_sig)
		kill_strays(&l);
	ran = true;
out_close_events:
	close_events(&l);
out_restore_state:
	restore_process_state(&l);
	remove_private_dir(&l);
out_free:
	free(l.ranks);
	free(l.path);
	if (ran)
		return finish(&l);
	if (l.cancel_sig) /* consumed while we held it: let it act now */
		raise(l.cancel_sig);
	return -1;
}

#endif /* HAVE_PMIX */
