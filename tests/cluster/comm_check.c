/* comm_check: check every collective of libflow's communicators, bit for
 * bit, under a real launcher.
 *
 * Each rank joins the job through PMIx (srun --mpi=pmix, mpirun, or flow's
 * own launcher with --nproc) and runs the same table of cases on the world
 * communicator and on split ones: every collective, every dtype, counts from
 * 0 to several MiB, even and uneven per-rank blocks.  Inputs are small
 * integers (scaled by a power of two for floats), so every sum is exact
 * whatever the order of the additions and results can be compared with
 * memcmp.  Each rank counts its checks and wrong results; the totals are
 * summed by the communicator under test and rank 0 prints one line.
 *
 * --soak is the fault tests' workload: an endless all-reduce that a test
 * kills a rank in the middle of.  --exit-rank and --stall-rank are test
 * hooks for the launcher's and the communicator's failure paths. */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <flow/comm.h>
#include <flow/parse.h>
#include <flow/sbp.h>
#include <flow/tensor.h>
#include <flow/world.h>

#include <flow/device.h> /* device memory for the NCCL backend */

#include "checkutil.h"

#define PROG "comm_check"
const char check_prog[] = PROG; /* every message starts with it */
/* Largest job whose sums stay exact (see dtype_cases). */
#define MAX_RANKS 32
/* Bytes after every buffer that a collective must leave alone. */
#define GUARD_BYTES 64
#define GUARD_BYTE 0xa5
/* How long a --soak rank stays after it saw a failure (see run_rank). */
#define SOAK_LINGER_S 2
/* What an output element holds before the collective writes it. */
#define POISON_BYTE 0xcd

static const char usage_text[] =
	"Usage: " PROG " [--nproc N] [--timeout S] [--backend cpu|nccl]\n"
	"       " PROG " --soak BYTES --pid-dir DIR [--nproc N] [--timeout S]\n"
	"Check every collective of libflow's communicators bit for bit: every\n"
	"dtype, counts from 0 to several MiB, even and uneven blocks, on the\n"
	"world communicator and on split ones.  Run it under any PMIx launcher\n"
	"(srun --mpi=pmix, mpirun) or start the ranks with --nproc.\n"
	"\n"
	"Options:\n"
	"  --nproc N          start N ranks on this machine and exit with the\n"
	"                     job's status\n"
	"  --timeout S        deadline of start-up and of each collective, in\n"
	"                     seconds (default 60)\n"
	"  --backend B        cpu (host memory; default) or nccl (device memory)\n"
	"  --soak BYTES       instead of the checks, all-reduce BYTES of f32 in a\n"
	"                     loop until something fails (for fault tests)\n"
	"  --pid-dir DIR      with --soak: once started, each rank writes\n"
	"                     DIR/pid.RANK holding \"PID HOST\"\n"
	"  -h, --help         print this help and exit\n"
	"\n"
	"Test hooks:\n"
	"  --exit-rank R:STATUS  rank R exits with STATUS right after it joined\n"
	"                        the job (without leaving it)\n"
	"  --stall-rank R        rank R sleeps forever before its first\n"
	"                        collective\n"
	"\n"
	"Output: rank 0 prints one line on stdout,\n"
	"  " PROG ": N ranks on M nodes, transport T: C checks, W wrong\n"
	"with C and W summed over the ranks; every rank prints its first 10\n"
	"wrong results on stderr.  With --soak, a rank that sees a failure\n"
	"prints it on stderr and exits 1.\n"
	"\n"
	CHECK_EXIT_STATUS_HELP;

/* ---- options ------------------------------------------------------------- */

typedef struct options {
	check_opts_t common; /* --nproc, --timeout */
	flow_comm_backend_t backend;
	uint64_t soak_bytes; /* 0: run the checks */
	const char *pid_dir;
	int exit_rank, exit_status; /* exit_rank -1: no hook */
	int stall_rank;             /* -1: no hook */
} options_t;

enum {
	OPT_BACKEND = CHECK_OPT_OWN,
	OPT_SOAK,
	OPT_PID_DIR,
	OPT_EXIT_RANK,
	OPT_STALL_RANK,
};

static const struct option long_options[] = {
	CHECK_COMMON_OPTIONS,
	{ "backend", required_argument, NULL, OPT_BACKEND },
	{ "soak", required_argument, NULL, OPT_SOAK },
	{ "pid-dir", required_argument, NULL, OPT_PID_DIR },
	{ "exit-rank", required_argument, NULL, OPT_EXIT_RANK },
	{ "stall-rank", required_argument, NULL, OPT_STALL_RANK },
	{ NULL, 0, NULL, 0 },
};

/* "R:STATUS" of --exit-rank. */
static void exit_rank_arg(const char *text, options_t *opt)
{
	char rank[32];
	const char *colon = strchr(text, ':');
	size_t len = colon ? (size_t)(colon - text) : 0;
	if (!colon || len == 0 || len >= sizeof(rank))
		check_usage_error("--exit-rank: expected RANK:STATUS, got '%s'",
				  text);
	memcpy(rank, text, len);
	rank[len] = '\0';
	opt->exit_rank = (int)check_int_arg("--exit-rank", rank, 0, INT32_MAX);
	opt->exit_status = (int)check_int_arg("--exit-rank", colon + 1, 0, 255);
}

static void parse_options(int argc, char **argv, options_t *opt)
{
	flow_diag_t diag = FLOW_DIAG_INIT;
	int c;

	*opt = (options_t){ .backend = FLOW_COMM_CPU,
			    .exit_rank = -1,
			    .stall_rank = -1 };
	check_opts_init(&opt->common, usage_text, MAX_RANKS);
	while ((c = check_getopt(&opt->common, argc, argv, long_options)) != -1) {
		switch (c) {
		case OPT_BACKEND:
			if (strcmp(optarg, "cpu") == 0)
				opt->backend = FLOW_COMM_CPU;
			else if (strcmp(optarg, "nccl") == 0)
				opt->backend = FLOW_COMM_NCCL;
			else
				check_usage_error("--backend: expected cpu or nccl, got '%s'",
						  optarg);
			break;
		case OPT_SOAK:
			if (flow_parse_size(optarg, &opt->soak_bytes, &diag) != FLOW_OK)
				check_usage_error("--soak: %s",
						  flow_diag_message(&diag));
			if (opt->soak_bytes < sizeof(float))
				check_usage_error("--soak: need at least %zu bytes, got '%s'",
						  sizeof(float), optarg);
			break;
		case OPT_PID_DIR:
			opt->pid_dir = optarg;
			break;
		case OPT_EXIT_RANK:
			exit_rank_arg(optarg, opt);
			break;
		case OPT_STALL_RANK:
			opt->stall_rank = (int)check_int_arg("--stall-rank", optarg,
							     0, INT32_MAX);
			break;
		}
	}
	if ((opt->soak_bytes > 0) != (opt->pid_dir != NULL))
		check_usage_error("--soak and --pid-dir go together");
}

/* ---- dtypes and values -------------------------------------------------
 *
 * Every element is made from an integer "raw" value: floats hold it scaled
 * by a power of two, integers hold it as is (unsigned ones modulo 2^bits).
 * Raw values of reductions stay within sum_lim, so that the sum of the
 * values of every subset of up to MAX_RANKS ranks is exact in the dtype;
 * data that is only moved spans move_lim, so that misplaced elements are
 * noticed. */

typedef struct dtype_case {
	flow_dtype_t dtype;
	int64_t sum_lim;  /* raw values in [-sum_lim, sum_lim] when reduced */
	int64_t move_lim; /* and in [-move_lim, move_lim] when moved */
} dtype_case_t;

static const dtype_case_t dtype_cases[] = {
	/* value raw/4: |sum| <= 32 * 64 / 4, far below 2^24 */
	{ FLOW_DTYPE_F32, 64, INT64_C(1) << 22 },
	/* integers up to 256 are exact in bf16's 8-bit significand */
	{ FLOW_DTYPE_BF16, 8, 256 },
	/* value raw/2: halves up to 1024 are exact in f16 */
	{ FLOW_DTYPE_F16, 32, 2000 },
	{ FLOW_DTYPE_I32, INT64_C(1) << 25, INT32_MAX },
	{ FLOW_DTYPE_I64, INT64_C(1) << 57, INT64_C(1) << 61 },
	/* unsigned sums wrap, which is defined: any value will do */
	{ FLOW_DTYPE_U16, UINT16_MAX, UINT16_MAX },
	{ FLOW_DTYPE_U8, UINT8_MAX, UINT8_MAX },
	{ FLOW_DTYPE_U32, UINT32_MAX, UINT32_MAX },
};
#define DTYPE_CASES (sizeof(dtype_cases) / sizeof(dtype_cases[0]))

/* Store raw values v[0..n-1] as elements of dtype dt (floats scaled as
 * the table above says; integers converted modulo 2^bits). */
static void put_elems(flow_dtype_t dt, void *out, const int64_t *v, size_t n)
{
	unsigned char *p = out;
/* One loop per dtype, so that each element is a fixed-size store. */
#define STORE_EACH(type, expr)                                   \
	for (size_t j = 0; j < n; j++) {                         \
		type x = (expr);                                 \
		memcpy(p + j * sizeof(type), &x, sizeof(type));  \
	}                                                        \
	break

	switch (dt) {
	case FLOW_DTYPE_F32: STORE_EACH(float, (float)v[j] * 0.25f);
	case FLOW_DTYPE_BF16: STORE_EACH(uint16_t, flow_f32_to_bf16((float)v[j]));
	case FLOW_DTYPE_F16: STORE_EACH(uint16_t, flow_f32_to_f16((float)v[j] * 0.5f));
	case FLOW_DTYPE_I32: STORE_EACH(int32_t, (int32_t)v[j]);
	case FLOW_DTYPE_I64: STORE_EACH(int64_t, v[j]);
	case FLOW_DTYPE_U16: STORE_EACH(uint16_t, (uint16_t)v[j]);
	case FLOW_DTYPE_U8: STORE_EACH(uint8_t, (uint8_t)v[j]);
	case FLOW_DTYPE_U32: STORE_EACH(uint32_t, (uint32_t)v[j]);
	}
#undef STORE_EACH
}

static uint64_t mix64(uint64_t x)
{
	/* splitmix64's finaliser */
	x ^= x >> 30;
	x *= UINT64_C(0xbf58476d1ce4e5b9);
	x ^= x >> 27;
	x *= UINT64_C(0x94d049bb133111eb);
	return x ^ (x >> 31);
}

/* Values are made and converted this many at a time. */
#define BATCH 1024

/* Raw values of elements first .. first+n-1 (n <= BATCH) of the block that
 * rank src makes for rank dst (-1: the same block for every rank) in the
 * check with this salt. */
static void raw_values(const dtype_case_t *dc, bool reduce, uint64_t salt,
		       int src, int dst, size_t first, size_t n, int64_t *raw)
{
	__extension__ typedef unsigned __int128 u128;
	int64_t lim = reduce ? dc->sum_lim : dc->move_lim;
	uint64_t span = 2 * (uint64_t)lim + 1;
	uint64_t block = mix64(salt ^ ((uint64_t)(uint32_t)src << 32 |
				       (uint32_t)(dst + 1)));

	for (size_t j = 0; j < n; j++) {
		uint64_t h = mix64(block + (first + j) * UINT64_C(0x9e3779b97f4a7c15));
		/* h * span / 2^64: uniform in [0, span) without a division */
		raw[j] = (int64_t)(uint64_t)(((u128)h * span) >> 64) - lim;
	}
}

/* Elements first .. first+count-1 of src's block for dst, into out[0..]. */
static void fill_block(const dtype_case_t *dc, bool reduce, uint64_t salt,
		       int src, int dst, size_t first, size_t count, void *out)
{
	size_t elem = flow_dtype_size(dc->dtype);
	int64_t raw[BATCH];

	for (size_t j = 0; j < count; j += BATCH) {
		size_t n = count - j < BATCH ? count - j : BATCH;
		raw_values(dc, reduce, salt, src, dst, first + j, n, raw);
		put_elems(dc->dtype, (unsigned char *)out + j * elem, raw, n);
	}
}

/* What a reduction over nranks makes of elements first .. first+count-1. */
static void fill_sum(const dtype_case_t *dc, uint64_t salt, int nranks,
		     size_t first, size_t count, void *out)
{
	size_t elem = flow_dtype_size(dc->dtype);
	int64_t sum[BATCH], raw[BATCH];

	for (size_t j = 0; j < count; j += BATCH) {
		size_t n = count - j < BATCH ? count - j : BATCH;
		memset(sum, 0, sizeof(sum));
		for (int r = 0; r < nranks; r++) {
			raw_values(dc, true, salt, r, -1, first + j, n, raw);
			for (size_t i = 0; i < n; i++)
				sum[i] += raw[i];
		}
		put_elems(dc->dtype, (unsigned char *)out + j * elem, sum, n);
	}
}

/* ---- per-rank block sizes ---------------------------------------------- */

typedef enum {
	SPREAD_EQUAL, /* every block holds base elements */
	SPREAD_RAMP,  /* base + r: all different */
	SPREAD_HOLES, /* every third block empty, the others uneven */
} spread_t;

/* Elements of block k (a rank, or a src+dst pair for all-to-all). */
static size_t block_count(spread_t spread, size_t base, int k)
{
	switch (spread) {
	case SPREAD_EQUAL:
		return base;
	case SPREAD_RAMP:
		return base + (size_t)k;
	case SPREAD_HOLES:
		return k % 3 == 1 ? 0 : base + 2 * (size_t)k;
	}
	return base;
}

/* ---- the job, the communicators, the buffers ---------------------------- */

typedef struct job {
	const options_t *opt;
	flow_world_t *world;
	const flow_world_info_t *info;
	uint64_t checks, wrong;
	int64_t shown; /* wrong results reported (check_show_wrong) */
	flow_diag_t diag;
} job_t;

/* One communicator under test, as this rank sees it. */
typedef struct suite {
	job_t *job;
	flow_comm_t *comm;
	char name[48]; /* "world", "odd ranks", "mesh axis 0" */
	int rank, size;
	uint64_t salt;   /* the same on every member */
	uint64_t serial; /* checks started on it, the same on every member */
	bool large;      /* also run the several-MiB counts */
} suite_t;

/* Host memory, and its device copy for NCCL (the same memory for CPU).
 * Both have GUARD_BYTES more than bytes. */
typedef struct buf {
	unsigned char *host;
	void *dev;
	size_t bytes;
} buf_t;

static bool on_device(const job_t *job)
{
	return job->opt->backend == FLOW_COMM_NCCL;
}

static flow_err_t buf_new(job_t *job, buf_t *b, size_t bytes)
{
	size_t total;
	*b = (buf_t){ .bytes = bytes };
	if (!flow_add_size(bytes, GUARD_BYTES, &total))
		return flow_diag_set(&job->diag, FLOW_ERR_NOMEM,
				     "buffer of %zu bytes is too large", bytes);
	b->host = malloc(total);
	if (!b->host)
		return flow_diag_errno(&job->diag, FLOW_ERR_NOMEM, errno,
				       "cannot allocate %zu bytes", total);
	memset(b->host, POISON_BYTE, bytes);
	memset(b->host + bytes, GUARD_BYTE, GUARD_BYTES);
	b->dev = b->host;
	if (on_device(job)) {
		b->dev = NULL;
		return flow_cuda_alloc(&b->dev, total, &job->diag);
	}
	return FLOW_OK;
}

static void buf_free(job_t *job, buf_t *b)
{
	if (on_device(job) && b->dev)
		flow_cuda_release(b->dev);
	free(b->host);
	*b = (buf_t){ 0 };
}

/* Host to device, guard included (no-op for CPU). */
static flow_err_t buf_push(job_t *job, buf_t *b)
{
	if (on_device(job))
		return flow_cuda_upload(b->dev, b->host, b->bytes + GUARD_BYTES,
					&job->diag);
	return FLOW_OK;
}

/* Device to host, guard included (no-op for CPU). */
static flow_err_t buf_pull(job_t *job, buf_t *b)
{
	if (on_device(job))
		return flow_cuda_download(b->host, b->dev, b->bytes + GUARD_BYTES,
					  &job->diag);
	return FLOW_OK;
}

/* ---- one check: a collective call and the comparison of its buffers ------ */

typedef struct check {
	suite_t *s;
	const dtype_case_t *dc;
	char what[192]; /* "all-gather bf16 counts 0,3,0,5 on world (4 ranks)" */
	uint64_t salt;
	buf_t send, recv;
	unsigned char *want; /* expected recv bytes */
	unsigned char *orig; /* send bytes before the call */
} check_t;

static void check_free(check_t *k)
{
	buf_free(k->s->job, &k->send);
	buf_free(k->s->job, &k->recv);
	free(k->want);
	free(k->orig);
}

/* Buffers of send_count and recv_count elements (recv poisoned), a fresh
 * salt and the description "<op> <dtype> <counts> on <comm>". */
static flow_err_t FLOW_PRINTF(6, 7)
	check_open(check_t *k, suite_t *s, const dtype_case_t *dc,
		   size_t send_count, size_t recv_count, const char *fmt, ...)
{
	job_t *job = s->job;
	size_t elem = flow_dtype_size(dc->dtype), send_bytes, recv_bytes;
	int len;
	va_list ap;
	flow_err_t err;

	*k = (check_t){ .s = s, .dc = dc };
	k->salt = mix64(s->salt ^ mix64(++s->serial));
	va_start(ap, fmt);
	len = vsnprintf(k->what, sizeof(k->what), fmt, ap);
	va_end(ap);
	if (len >= 0 && (size_t)len < sizeof(k->what))
		snprintf(k->what + len, sizeof(k->what) - (size_t)len,
			 " on %s (%d ranks)", s->name, s->size);
	if (!flow_mul_size(send_count, elem, &send_bytes) ||
	    !flow_mul_size(recv_count, elem, &recv_bytes))
		return flow_diag_set(&job->diag, FLOW_ERR_NOMEM,
				     "%s: buffer size overflows", k->what);
	err = buf_new(job, &k->send, send_bytes);
	if (err == FLOW_OK)
		err = buf_new(job, &k->recv, recv_bytes);
	if (err == FLOW_OK) {
		k->want = malloc(recv_bytes ? recv_bytes : 1);
		k->orig = malloc(send_bytes ? send_bytes : 1);
		if (!k->want || !k->orig)
			err = flow_diag_set(&job->diag, FLOW_ERR_NOMEM,
					    "cannot allocate %zu bytes",
					    recv_bytes + send_bytes);
	}
	if (err != FLOW_OK)
		check_free(k);
	return err;
}

/* Remember the send bytes and move both buffers to the device. */
static flow_err_t check_start(check_t *k)
{
	flow_err_t err;
	memcpy(k->orig, k->send.host, k->send.bytes);
	err = buf_push(k->s->job, &k->send);
	return err != FLOW_OK ? err : buf_push(k->s->job, &k->recv);
}

static uint64_t elem_bits(const unsigned char *p, size_t elem)
{
	uint64_t v = 0;
	memcpy(&v, p, elem); /* little-endian hosts only, for messages */
	return v;
}

/* Does buffer `which` (got, bytes long, GUARD_BYTES after it) hold want?
 * Says what differs on stderr when not. */
static bool same_bytes(check_t *k, const char *which,
		       const unsigned char *got, const unsigned char *want,
		       size_t bytes)
{
	job_t *job = k->s->job;
	size_t elem = flow_dtype_size(k->dc->dtype);
	size_t first = SIZE_MAX, nwrong = 0;
	int width = (int)(2 * elem);

	for (size_t g = 0; g < GUARD_BYTES; g++) {
		if (got[bytes + g] != GUARD_BYTE) {
			check_show_wrong(&job->shown, job->info->rank,
					 "%s: wrote past the end of %s",
					 k->what, which);
			return false;
		}
	}
	if (memcmp(got, want, bytes) == 0)
		return true;
	for (size_t i = 0; i < bytes / elem; i++) {
		if (memcmp(got + i * elem, want + i * elem, elem) != 0) {
			if (first == SIZE_MAX)
				first = i;
			nwrong++;
		}
	}
	check_show_wrong(&job->shown, job->info->rank,
			 "%s: %zu of %zu %s elements wrong, the first at %zu: "
			 "got 0x%0*" PRIx64 ", expected 0x%0*" PRIx64,
			 k->what, nwrong, bytes / elem, which, first, width,
			 elem_bits(got + first * elem, elem), width,
			 elem_bits(want + first * elem, elem));
	return false;
}

/* After the call: fetch the buffers, compare recv with want and send with
 * what it held, count the check. */
static flow_err_t check_finish(check_t *k, bool recv_checked,
			       bool send_checked)
{
	job_t *job = k->s->job;
	flow_err_t err = buf_pull(job, &k->send);
	bool ok = true;

	if (err == FLOW_OK)
		err = buf_pull(job, &k->recv);
	if (err != FLOW_OK)
		return err;
	if (recv_checked)
		ok = same_bytes(k, "recv", k->recv.host, k->want, k->recv.bytes);
	if (send_checked)
		ok = same_bytes(k, "send", k->send.host, k->orig,
				k->send.bytes) && ok;
	job->checks++;
	if (!ok)
		job->wrong++;
	return FLOW_OK;
}

/* "3,0,5" into buf. */
static const char *format_counts(char *buf, size_t cap, const size_t *counts,
				 int n)
{
	size_t len = 0;
	buf[0] = '\0';
	for (int r = 0; r < n && len < cap; r++) {
		int w = snprintf(buf + len, cap - len, "%s%zu", r ? "," : "",
				 counts[r]);
		if (w < 0)
			break;
		len += (size_t)w;
	}
	return buf;
}

/* ---- the collectives ------------------------------------------------------
 * Each runs one case (several for broadcast: one per root) and returns
 * FLOW_OK, or the error of a call that failed (with job->diag set). */

typedef flow_err_t (*case_fn)(suite_t *s, const dtype_case_t *dc, size_t base,
			      spread_t spread);

static flow_err_t case_all_reduce(suite_t *s, const dtype_case_t *dc,
				  size_t n, spread_t spread)
{
	check_t k;
	flow_err_t err = check_open(&k, s, dc, n, n, "all-reduce %s count %zu",
				    flow_dtype_name(dc->dtype), n);
	(void)spread;
	if (err != FLOW_OK)
		return err;
	fill_block(dc, true, k.salt, s->rank, -1, 0, n, k.send.host);
	fill_sum(dc, k.salt, s->size, 0, n, k.want);
	err = check_start(&k);
	if (err == FLOW_OK)
		err = flow_all_reduce(s->comm, k.send.dev, k.recv.dev, n,
				      dc->dtype, &s->job->diag);
	if (err == FLOW_OK)
		err = check_finish(&k, true, true);
	check_free(&k);
	return err;
}

/* n elements summed in place: as one buffer, or (grouped) as a group of
 * three, the first third, an empty one and the rest but one element,
 * which must keep this rank's value. */
static flow_err_t all_reduce_in_place(suite_t *s, const dtype_case_t *dc,
				      size_t n, bool grouped)
{
	size_t elem = flow_dtype_size(dc->dtype);
	size_t a = n / 3, gap = grouped && n >= 4;
	check_t k;
	flow_err_t err = check_open(&k, s, dc, 0, n,
				    "%s all-reduce %s count %zu",
				    grouped ? "grouped" : "in-place",
				    flow_dtype_name(dc->dtype), n);
	if (err != FLOW_OK)
		return err;
	fill_block(dc, true, k.salt, s->rank, -1, 0, n, k.recv.host);
	fill_sum(dc, k.salt, s->size, 0, n, k.want);
	if (gap)
		memcpy(k.want + a * elem, (unsigned char *)k.recv.host + a * elem,
		       elem);
	err = check_start(&k);
	unsigned char *dev = k.recv.dev;
	void *bufs[3] = { dev, dev + a * elem, dev + (a + gap) * elem };
	size_t counts[3] = { a, 0, n - a - gap };
	if (err == FLOW_OK && grouped)
		err = flow_all_reduce_group(s->comm, bufs, counts, 3, dc->dtype,
					    &s->job->diag);
	else if (err == FLOW_OK)
		err = flow_all_reduce(s->comm, dev, dev, n, dc->dtype,
				      &s->job->diag);
	if (err == FLOW_OK)
		err = check_finish(&k, true, false);
	check_free(&k);
	return err;
}

static flow_err_t case_all_reduce_in_place(suite_t *s, const dtype_case_t *dc,
					   size_t n, spread_t spread)
{
	(void)spread;
	return all_reduce_in_place(s, dc, n, false);
}

static flow_err_t case_all_reduce_group(suite_t *s, const dtype_case_t *dc,
					size_t n, spread_t spread)
{
	(void)spread;
	return all_reduce_in_place(s, dc, n, true);
}

static flow_err_t case_reduce_scatter(suite_t *s, const dtype_case_t *dc,
				      size_t base, spread_t spread)
{
	size_t counts[s->size], total = 0, first = 0;
	char text[128];
	check_t k;
	flow_err_t err;

	for (int r = 0; r < s->size; r++) {
		counts[r] = block_count(spread, base, r);
		if (r < s->rank)
			first += counts[r];
		total += counts[r];
	}
	err = check_open(&k, s, dc, total, counts[s->rank],
			 "reduce-scatter %s counts %s",
			 flow_dtype_name(dc->dtype),
			 format_counts(text, sizeof(text), counts, s->size));
	if (err != FLOW_OK)
		return err;
	fill_block(dc, true, k.salt, s->rank, -1, 0, total, k.send.host);
	fill_sum(dc, k.salt, s->size, first, counts[s->rank], k.want);
	err = check_start(&k);
	if (err == FLOW_OK)
		err = flow_reduce_scatter(s->comm, k.send.dev, k.recv.dev,
					  counts, dc->dtype, &s->job->diag);
	if (err == FLOW_OK)
		err = check_finish(&k, true, true);
	check_free(&k);
	return err;
}

static flow_err_t case_all_gather(suite_t *s, const dtype_case_t *dc,
				  size_t base, spread_t spread)
{
	size_t counts[s->size], total = 0, first = 0;
	size_t elem = flow_dtype_size(dc->dtype);
	char text[128];
	check_t k;
	flow_err_t err;

	for (int r = 0; r < s->size; r++) {
		counts[r] = block_count(spread, base, r);
		total += counts[r];
	}
	err = check_open(&k, s, dc, counts[s->rank], total,
			 "all-gather %s counts %s", flow_dtype_name(dc->dtype),
			 format_counts(text, sizeof(text), counts, s->size));
	if (err != FLOW_OK)
		return err;
	fill_block(dc, false, k.salt, s->rank, -1, 0, counts[s->rank],
		   k.send.host);
	for (int r = 0; r < s->size; r++) {
		fill_block(dc, false, k.salt, r, -1, 0, counts[r],
			   k.want + first * elem);
		first += counts[r];
	}
	err = check_start(&k);
	if (err == FLOW_OK)
		err = flow_all_gather(s->comm, k.send.dev, k.recv.dev, counts,
				      dc->dtype, &s->job->diag);
	if (err == FLOW_OK)
		err = check_finish(&k, true, true);
	check_free(&k);
	return err;
}

static flow_err_t case_all_to_all(suite_t *s, const dtype_case_t *dc,
				  size_t base, spread_t spread)
{
	size_t sends[s->size], recvs[s->size], send_total = 0, recv_total = 0;
	size_t elem = flow_dtype_size(dc->dtype);
	char text[128];
	check_t k;
	flow_err_t err;

	for (int r = 0; r < s->size; r++) {
		sends[r] = block_count(spread, base, s->rank + 2 * r);
		recvs[r] = block_count(spread, base, r + 2 * s->rank);
		send_total += sends[r];
		recv_total += recvs[r];
	}
	err = check_open(&k, s, dc, send_total, recv_total,
			 "all-to-all %s send counts %s",
			 flow_dtype_name(dc->dtype),
			 format_counts(text, sizeof(text), sends, s->size));
	if (err != FLOW_OK)
		return err;
	for (size_t r = 0, sat = 0, rat = 0; r < (size_t)s->size; r++) {
		fill_block(dc, false, k.salt, s->rank, (int)r, 0, sends[r],
			   k.send.host + sat * elem);
		fill_block(dc, false, k.salt, (int)r, s->rank, 0, recvs[r],
			   k.want + rat * elem);
		sat += sends[r];
		rat += recvs[r];
	}
	err = check_start(&k);
	if (err == FLOW_OK)
		err = flow_all_to_all(s->comm, k.send.dev, sends, k.recv.dev,
				      recvs, dc->dtype, &s->job->diag);
	if (err == FLOW_OK)
		err = check_finish(&k, true, true);
	check_free(&k);
	return err;
}

static flow_err_t case_broadcast(suite_t *s, const dtype_case_t *dc, size_t n,
				 spread_t spread)
{
	flow_err_t err = FLOW_OK;
	(void)spread;
	for (int root = 0; root < s->size && err == FLOW_OK; root++) {
		check_t k;
		err = check_open(&k, s, dc, 0, n,
				 "broadcast %s count %zu from root %d",
				 flow_dtype_name(dc->dtype), n, root);
		if (err != FLOW_OK)
			break;
		if (s->rank == root)
			fill_block(dc, false, k.salt, root, -1, 0, n,
				   k.recv.host);
		fill_block(dc, false, k.salt, root, -1, 0, n, k.want);
		err = check_start(&k);
		if (err == FLOW_OK)
			err = flow_broadcast(s->comm, k.recv.dev, n, dc->dtype,
					     root, &s->job->diag);
		if (err == FLOW_OK)
			err = check_finish(&k, true, false);
		check_free(&k);
	}
	return err;
}

/* Every rank sends a block to the next and receives one from the previous;
 * even ranks send first, odd ones receive first, so blocking calls pair up
 * whatever the ring's size. */
static flow_err_t case_ring(suite_t *s, const dtype_case_t *dc, size_t base,
			    spread_t spread)
{
	int next = (s->rank + 1) % s->size;
	int prev = (s->rank + s->size - 1) % s->size;
	size_t n_send = block_count(spread, base, s->rank);
	size_t n_recv = block_count(spread, base, prev);
	flow_diag_t *diag = &s->job->diag;
	check_t k;
	flow_err_t err;

	if (s->size < 2)
		return FLOW_OK;
	err = check_open(&k, s, dc, n_send, n_recv,
			 "send/recv %s count %zu to rank %d",
			 flow_dtype_name(dc->dtype), n_send, next);
	if (err != FLOW_OK)
		return err;
	fill_block(dc, false, k.salt, s->rank, next, 0, n_send, k.send.host);
	fill_block(dc, false, k.salt, prev, s->rank, 0, n_recv, k.want);
	err = check_start(&k);
	if (err == FLOW_OK && s->rank % 2 == 0) {
		err = flow_send(s->comm, k.send.dev, n_send, dc->dtype, next,
				diag);
		if (err == FLOW_OK)
			err = flow_recv(s->comm, k.recv.dev, n_recv, dc->dtype,
					prev, diag);
	} else if (err == FLOW_OK) {
		err = flow_recv(s->comm, k.recv.dev, n_recv, dc->dtype, prev,
				diag);
		if (err == FLOW_OK)
			err = flow_send(s->comm, k.send.dev, n_send, dc->dtype,
					next, diag);
	}
	if (err == FLOW_OK)
		err = check_finish(&k, true, true);
	check_free(&k);
	return err;
}

/* ---- the table of cases ------------------------------------------------- */

typedef struct op_case {
	case_fn run;
	bool reduces; /* only dtypes the backend can reduce */
	bool spreads; /* once per spread_t, else with SPREAD_EQUAL */
} op_case_t;

static const op_case_t op_cases[] = {
	{ case_all_reduce, true, false },
	{ case_all_reduce_in_place, true, false },
	{ case_all_reduce_group, true, false },
	{ case_reduce_scatter, true, true },
	{ case_all_gather, false, true },
	{ case_all_to_all, false, true },
	{ case_broadcast, false, false },
	{ case_ring, false, true },
};

/* Element counts of every case: the empty case, single elements, primes
 * and powers of two around them, and a block larger than any chunk. */
static const size_t small_counts[] = { 0, 1, 2, 3, 7, 64, 127, 1021, 65537 };
/* Bytes of the large case, whatever the dtype (spread cases divide it
 * between the ranks). */
#define LARGE_BYTES ((size_t)4 << 20)

/* Every spread of a case, or only the unevenest for the large counts. */
static flow_err_t run_case(suite_t *s, const op_case_t *oc,
			   const dtype_case_t *dc, size_t base, bool all_spreads)
{
	flow_err_t err = FLOW_OK;
	if (!oc->spreads)
		return oc->run(s, dc, base, SPREAD_EQUAL);
	if (!all_spreads)
		return oc->run(s, dc, base, SPREAD_HOLES);
	for (int sp = SPREAD_EQUAL; sp <= SPREAD_HOLES && err == FLOW_OK; sp++)
		err = oc->run(s, dc, base, (spread_t)sp);
	return err;
}

static flow_err_t run_suite(suite_t *s)
{
	flow_comm_backend_t backend = s->job->opt->backend;
	flow_err_t err = FLOW_OK;
	size_t ncounts = sizeof(small_counts) / sizeof(small_counts[0]);

	for (size_t o = 0; o < sizeof(op_cases) / sizeof(op_cases[0]); o++) {
		const op_case_t *oc = &op_cases[o];
		for (size_t d = 0; d < DTYPE_CASES && err == FLOW_OK; d++) {
			const dtype_case_t *dc = &dtype_cases[d];
			size_t large = LARGE_BYTES / flow_dtype_size(dc->dtype);
			if (oc->reduces && !flow_comm_can_reduce(backend, dc->dtype))
				continue;
			for (size_t i = 0; i < ncounts && err == FLOW_OK; i++)
				err = run_case(s, oc, dc, small_counts[i], true);
			/* odd, so that no chunking divides it evenly */
			if (s->large && err == FLOW_OK)
				err = run_case(s, oc, dc,
					       (oc->spreads ? large / (size_t)s->size
							    : large) | 1,
					       false);
		}
		if (err != FLOW_OK)
			return err;
	}
	err = flow_barrier(s->comm, &s->job->diag);
	if (err == FLOW_OK)
		s->job->checks++;
	return err;
}

/* ---- communicators ------------------------------------------------------- */

static void suite_init(suite_t *s, job_t *job, flow_comm_t *comm,
		       uint64_t salt, bool large, const char *name)
{
	*s = (suite_t){ .job = job, .comm = comm, .salt = mix64(salt),
			.large = large };
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->rank = flow_comm_rank(comm);
	s->size = flow_comm_size(comm);
}

/* A structural fact about a communicator: counted as a check. */
static void expect_true(job_t *job, bool ok, const char *what, int got,
			int want)
{
	job->checks++;
	if (!ok) {
		job->wrong++;
		check_show_wrong(&job->shown, job->info->rank,
				 "%s: got %d, expected %d", what, got, want);
	}
}

/* Members in the order split promises: by key (= world rank here), so
 * communicator rank i is world rank 2i + color. */
static void check_parity_comm(job_t *job, flow_comm_t *c, int color)
{
	int n = flow_comm_size(c), world = job->info->size;
	expect_true(job, n == (world - color + 1) / 2, "parity split size", n,
		    (world - color + 1) / 2);
	expect_true(job, flow_comm_rank(c) == job->info->rank / 2,
		    "parity split rank", flow_comm_rank(c), job->info->rank / 2);
	for (int r = 0; r < n; r++)
		expect_true(job, flow_comm_world_rank(c, r) == 2 * r + color,
			    "parity split member", flow_comm_world_rank(c, r),
			    2 * r + color);
}

/* Mesh 2 x h, row-major: world rank a*h + b.  Axis 0 groups the ranks of
 * one column b (comm rank a), axis 1 those of one row a (comm rank b). */
static void check_mesh_comm(job_t *job, flow_comm_t *c, int axis, int h)
{
	int me = job->info->rank, a = me / h, b = me % h;
	int n = axis == 0 ? 2 : h, mine = axis == 0 ? a : b;
	expect_true(job, flow_comm_size(c) == n, "mesh axis size",
		    flow_comm_size(c), n);
	expect_true(job, flow_comm_rank(c) == mine, "mesh axis rank",
		    flow_comm_rank(c), mine);
	for (int r = 0; r < n && r < flow_comm_size(c); r++) {
		int want = axis == 0 ? r * h + b : a * h + r;
		expect_true(job, flow_comm_world_rank(c, r) == want,
			    "mesh axis member", flow_comm_world_rank(c, r), want);
	}
}

static flow_err_t check_split(job_t *job, flow_comm_t *world)
{
	int color = job->info->rank % 2;
	flow_comm_t *half = NULL;
	suite_t s;
	flow_err_t err = flow_comm_split(world, color, job->info->rank, &half,
					 &job->diag);
	if (err != FLOW_OK)
		return err;
	check_parity_comm(job, half, color);
	suite_init(&s, job, half, 0x100 + (uint64_t)color, false,
		   color ? "odd ranks" : "even ranks");
	err = run_suite(&s);
	flow_comm_free(half);
	return err;
}

static flow_err_t check_mesh(job_t *job, flow_comm_t *world)
{
	int h = job->info->size / 2;
	int64_t dims[2] = { 2, h };
	flow_mesh_t mesh;
	flow_err_t err = flow_mesh_init(&mesh, 2, dims, 0, &job->diag);

	for (int axis = 0; axis < 2 && err == FLOW_OK; axis++) {
		flow_comm_t *sub = NULL;
		suite_t s;
		err = flow_comm_mesh_axes(world, &mesh, 1u << axis, &sub,
					  &job->diag);
		if (err != FLOW_OK)
			break;
		check_mesh_comm(job, sub, axis, h);
		suite_init(&s, job, sub, 0x200 + (uint64_t)axis, false,
			   axis ? "mesh axis 1" : "mesh axis 0");
		err = run_suite(&s);
		flow_comm_free(sub);
	}
	return err;
}

/* Sum the ranks' tallies with the communicator under test itself. */
static flow_err_t sum_tallies(job_t *job, flow_comm_t *world,
			      int64_t totals[2])
{
	buf_t b;
	flow_err_t err = buf_new(job, &b, 2 * sizeof(int64_t));
	int64_t mine[2] = { (int64_t)job->checks, (int64_t)job->wrong };

	if (err != FLOW_OK)
		goto out;
	memcpy(b.host, mine, sizeof(mine));
	err = buf_push(job, &b);
	if (err == FLOW_OK)
		err = flow_all_reduce(world, b.dev, b.dev, 2, FLOW_DTYPE_I64,
				      &job->diag);
	if (err == FLOW_OK)
		err = buf_pull(job, &b);
	if (err == FLOW_OK)
		memcpy(totals, b.host, 2 * sizeof(int64_t));
out:
	buf_free(job, &b);
	return err;
}

/* Every suite; rank 0 prints the summary.  Returns the exit status. */
static flow_err_t check_everything(job_t *job, flow_comm_t *world,
				   int *status_out)
{
	const flow_world_info_t *info = job->info;
	int64_t totals[2];
	suite_t s;
	flow_err_t err;

	suite_init(&s, job, world, 1, true, "world");
	err = run_suite(&s);
	if (err == FLOW_OK)
		err = check_split(job, world);
	if (err == FLOW_OK && info->size % 2 == 0)
		err = check_mesh(job, world);
	if (err == FLOW_OK)
		err = sum_tallies(job, world, totals);
	if (err != FLOW_OK)
		return err;
	if (info->rank == 0)
		printf(PROG ": %d ranks on %d nodes, transport %s: %" PRId64
			    " checks, %" PRId64 " wrong\n",
		       info->size, info->num_nodes, flow_comm_transport(world),
		       totals[0], totals[1]);
	*status_out = totals[1] == 0 && job->wrong == 0 ? 0 : 1;
	return FLOW_OK;
}

/* ---- soak ---------------------------------------------------------------- */

/* DIR/pid.RANK = "PID HOST", written whole or not at all. */
static flow_err_t write_pid_file(job_t *job)
{
	char path[4096], tmp[4200];
	FILE *f;
	int n = snprintf(path, sizeof(path), "%s/pid.%d", job->opt->pid_dir,
			 job->info->rank);

	if (n < 0 || (size_t)n >= sizeof(path))
		return flow_diag_set(&job->diag, FLOW_ERR_USAGE,
				     "pid directory name is too long '%s'",
				     job->opt->pid_dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	f = fopen(tmp, "w");
	if (!f)
		return flow_diag_errno(&job->diag, FLOW_ERR_IO, errno,
				       "cannot create '%s'", tmp);
	fprintf(f, "%ld %s\n", (long)getpid(), job->info->host);
	if (fclose(f) != 0) {
		int e = errno;
		unlink(tmp);
		return flow_diag_errno(&job->diag, FLOW_ERR_IO, e,
				       "cannot write '%s'", tmp);
	}
	if (rename(tmp, path) != 0) {
		int e = errno;
		unlink(tmp);
		return flow_diag_errno(&job->diag, FLOW_ERR_IO, e,
				       "cannot rename '%s' to '%s'", tmp, path);
	}
	return FLOW_OK;
}

static void stall_if_asked(const job_t *job)
{
	if (job->opt->stall_rank != job->info->rank)
		return;
	for (;;)
		pause();
}

/* All-reduce soak_bytes of f32 until a call fails or a result is wrong:
 * only returns with an error. */
static flow_err_t soak(job_t *job, flow_comm_t *world)
{
	const dtype_case_t *dc = &dtype_cases[0];
	size_t n = job->opt->soak_bytes / sizeof(float);
	suite_t s;
	check_t k;
	flow_err_t err;

	suite_init(&s, job, world, 3, false, "world");
	err = check_open(&k, &s, dc, n, n, "soak all-reduce f32 count %zu", n);
	if (err != FLOW_OK)
		return err;
	fill_block(dc, true, k.salt, s.rank, -1, 0, n, k.send.host);
	fill_sum(dc, k.salt, s.size, 0, n, k.want);
	err = check_start(&k);
	if (err == FLOW_OK)
		err = write_pid_file(job);
	if (err == FLOW_OK)
		stall_if_asked(job);
	while (err == FLOW_OK) {
		err = flow_all_reduce(world, k.send.dev, k.recv.dev, n,
				      dc->dtype, &job->diag);
		if (err == FLOW_OK)
			err = check_finish(&k, true, true);
		if (err == FLOW_OK && job->wrong > 0)
			err = flow_diag_set(&job->diag, FLOW_ERR_VERIFY,
					    "rank %d: wrong all-reduce result",
					    job->info->rank);
	}
	check_free(&k);
	return err;
}

/* ---- main ---------------------------------------------------------------- */

/* The world of a soak rank that failed and, to let the others report for
 * themselves, does not abort the job.  There is no freeing it then:
 * flow_world_free fences with every rank, and some are gone or stuck.
 * Kept reachable, so that LeakSanitizer does not count it as a leak. */
static flow_world_t *volatile abandoned_world;

static int run_rank(const options_t *opt)
{
	job_t job = { .opt = opt, .diag = FLOW_DIAG_INIT };
	flow_comm_t *world = NULL;
	int status = 1;

	if (check_join(opt->common.timeout_s, &job.world, &job.info,
		       &job.diag) != FLOW_OK)
		return check_fail(&job.diag);
	if (opt->exit_rank == job.info->rank)
		exit(opt->exit_status); /* a rank that dies without leaving */
	if (job.info->size > MAX_RANKS) {
		flow_diag_set(&job.diag, FLOW_ERR_USAGE,
			      "sums are exact for up to %d ranks, this job has %d",
			      MAX_RANKS, job.info->size);
		goto out_abort;
	}
	if (flow_comm_world(job.world, opt->backend, &world, &job.diag) != FLOW_OK)
		goto out_abort;
	if (opt->soak_bytes > 0) {
		/* soak only returns on failure.  The fault tests read every
		 * survivor's own account, so no flow_world_abort (under srun
		 * it would end the ranks that have not yet seen the failure),
		 * and the communicator stays open a moment: a rank that is
		 * gone would be the first dead peer some slower survivor
		 * finds, and be blamed instead of the rank that died. */
		(void)soak(&job, world);
		status = check_fail(&job.diag);
		sleep(SOAK_LINGER_S);
		flow_comm_free(world);
		abandoned_world = job.world;
		return status;
	}
	stall_if_asked(&job);
	if (check_everything(&job, world, &status) != FLOW_OK)
		goto out_abort;
	flow_comm_free(world);
	return check_leave(job.world, &job.diag, status);

out_abort:
	return check_abort(job.world, world, &job.diag);
}

int main(int argc, char **argv)
{
	options_t opt;
	parse_options(argc, argv, &opt);
	if (opt.common.nproc > 0)
		return check_launch(argc, argv, opt.common.nproc);
	return run_rank(&opt);
}
