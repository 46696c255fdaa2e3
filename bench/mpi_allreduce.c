/* mpi_allreduce.c: MPI_Allreduce (sum, f32) timed over a range of message
 * sizes, printed in the TSV of `flow-bench comm all_reduce` so that
 * bench/comm-vs-openmpi.sh can set OpenMPI's figures beside flow's.
 *
 * Built by that script with the MPI compiler wrapper (mpicc), not by the
 * project's Makefile: it is a peer's program, so it includes no flow header
 * and no config.h, and defines _GNU_SOURCE itself for getopt_long.
 *
 * Usage: mpirun -n N mpi_allreduce [-b MIN] [-e MAX] [-f FACTOR]
 *                                  [--iters N] [--warmup N]
 * Sizes are bytes with optional binary suffixes (K, M, G).  Every size is
 * run out of place (separate send and receive buffers), warmup untimed
 * calls then iters timed ones after a barrier.  time_us is the largest
 * over ranks of each rank's mean time per call; algbw = size / time;
 * busbw = algbw * 2(n-1)/n (the nccl-tests definition for all-reduce).
 * Inputs are small integers, so the sums are exact and the check is
 * bitwise: `wrong` counts wrong elements over all ranks.  Only rank 0
 * writes.  Exit status: 0 all correct, 1 wrong results or a run-time
 * failure, 2 a usage error.
 */
#define _GNU_SOURCE 1

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define PROG "mpi_allreduce"

struct config {
	uint64_t min_bytes, max_bytes, factor;
	long iters, warmup;
};

static const char usage_text[] =
	"Usage: " PROG " [-b MIN] [-e MAX] [-f FACTOR] [--iters N] "
	"[--warmup N]\n";

static void print_help(void)
{
	fputs(usage_text, stdout);
	fputs("Time MPI_Allreduce (sum, f32, out of place) from MIN to MAX "
	      "bytes.\n\n"
	      "  -b, --minbytes MIN   smallest message [1K]\n"
	      "  -e, --maxbytes MAX   largest message [256M]\n"
	      "  -f, --stepfactor F   multiply the size by F each step [4]\n"
	      "      --iters N        timed calls per size [20]\n"
	      "      --warmup N       untimed calls before them [5]\n"
	      "  -h, --help           show this help and exit\n\n"
	      "Sizes take binary suffixes K, M, G.  Exit status: 0 all "
	      "results correct,\n1 wrong results or a run-time failure, 2 a "
	      "usage error.\n",
	      stdout);
}

/* A byte count with an optional binary suffix; trailing garbage is an
 * error, as in flow's own flow_parse_size(). */
static int parse_size(const char *text, uint64_t *value_out)
{
	static const struct {
		const char *suffix;
		unsigned shift;
	} suffixes[] = {
		{ "", 0 },     { "k", 10 },  { "kib", 10 }, { "m", 20 },
		{ "mib", 20 }, { "g", 30 },  { "gib", 30 },
	};
	char *end;

	if (text[0] < '0' || text[0] > '9')
		return -1;
	errno = 0;
	unsigned long long v = strtoull(text, &end, 10);
	if (errno == ERANGE)
		return -1;
	for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
		if (strcasecmp(end, suffixes[i].suffix) != 0)
			continue;
		if (v > (UINT64_MAX >> suffixes[i].shift))
			return -1;
		*value_out = (uint64_t)v << suffixes[i].shift;
		return 0;
	}
	return -1;
}

static int parse_count(const char *text, long min, long *value_out)
{
	char *end;

	if (text[0] < '0' || text[0] > '9')
		return -1;
	errno = 0;
	long v = strtol(text, &end, 10);
	if (errno == ERANGE || *end != '\0' || v < min)
		return -1;
	*value_out = v;
	return 0;
}

/* Returns 0 to run, 1 after --help, 2 on a usage error (rank 0 has
 * printed it).  Every rank parses the same argv, so all agree. */
static int parse_args(int argc, char **argv, int rank, struct config *cfg)
{
	enum { OPT_ITERS = 256, OPT_WARMUP };
	static const struct option options[] = {
		{ "minbytes", required_argument, NULL, 'b' },
		{ "maxbytes", required_argument, NULL, 'e' },
		{ "stepfactor", required_argument, NULL, 'f' },
		{ "iters", required_argument, NULL, OPT_ITERS },
		{ "warmup", required_argument, NULL, OPT_WARMUP },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *bad = NULL;
	int opt;

	*cfg = (struct config){ 1024, 256u << 20, 4, 20, 5 };
	opterr = 0;
	while ((opt = getopt_long(argc, argv, "b:e:f:h", options, NULL)) != -1) {
		int rc = 0;
		switch (opt) {
		case 'b': rc = parse_size(optarg, &cfg->min_bytes); break;
		case 'e': rc = parse_size(optarg, &cfg->max_bytes); break;
		case 'f': rc = parse_size(optarg, &cfg->factor); break;
		case OPT_ITERS: rc = parse_count(optarg, 1, &cfg->iters); break;
		case OPT_WARMUP: rc = parse_count(optarg, 0, &cfg->warmup); break;
		case 'h':
			if (rank == 0)
				print_help();
			return 1;
		default:
			if (rank == 0)
				fprintf(stderr, PROG ": unknown option or missing "
						"value '%s'\n",
					argv[optind - 1]);
			goto usage;
		}
		if (rc != 0) {
			bad = optarg;
			break;
		}
	}
	if (bad) {
		if (rank == 0)
			fprintf(stderr, PROG ": invalid value '%s'\n", bad);
		goto usage;
	}
	if (optind < argc) {
		if (rank == 0)
			fprintf(stderr, PROG ": unexpected argument '%s'\n",
				argv[optind]);
		goto usage;
	}
	if (cfg->factor < 2 || cfg->min_bytes < 4 ||
	    cfg->max_bytes < cfg->min_bytes ||
	    cfg->max_bytes > (uint64_t)INT_MAX * sizeof(float)) {
		if (rank == 0)
			fprintf(stderr, PROG ": need 4 <= MIN <= MAX <= 8G and "
					"FACTOR >= 2\n");
		goto usage;
	}
	return 0;
usage:
	if (rank == 0)
		fputs(usage_text, stderr);
	return 2;
}

/* Rank r's input: small integers, so any sum over ranks is exact in f32. */
static float input_value(int rank, size_t i)
{
	return (float)((i * 3 + (size_t)rank * 5) % 31 + 1);
}

static void fill_input(float *buf, size_t count, int rank)
{
	for (size_t i = 0; i < count; i++)
		buf[i] = input_value(rank, i);
}

static uint64_t count_wrong(const float *buf, size_t count, int nranks)
{
	uint64_t wrong = 0;

	for (size_t i = 0; i < count; i++) {
		float want = 0.0f;
		for (int r = 0; r < nranks; r++)
			want += input_value(r, i);
		wrong += buf[i] != want;
	}
	return wrong;
}

/* "host H, pid P" of one rank, gathered to rank 0 for the rank map. */
#define ENTRY_MAX (MPI_MAX_PROCESSOR_NAME + 32)

static void print_preamble(const struct config *cfg, int rank, int nranks)
{
	char version[MPI_MAX_LIBRARY_VERSION_STRING];
	char host[MPI_MAX_PROCESSOR_NAME] = "";
	char entry[ENTRY_MAX];
	char *entries = NULL;
	int len = 0, have_map = 0;

	MPI_Get_library_version(version, &len);
	MPI_Get_processor_name(host, &len);
	snprintf(entry, sizeof(entry), "host %s, pid %ld", host,
		 (long)getpid());
	if (rank == 0) {
		entries = malloc((size_t)nranks * ENTRY_MAX);
		have_map = entries != NULL;
	}
	/* A failed malloc on rank 0 only loses the rank map, not the run:
	 * the others must learn to skip the gather. */
	MPI_Bcast(&have_map, 1, MPI_INT, 0, MPI_COMM_WORLD);
	if (have_map)
		MPI_Gather(entry, ENTRY_MAX, MPI_CHAR, entries, ENTRY_MAX,
			   MPI_CHAR, 0, MPI_COMM_WORLD);
	if (rank != 0)
		return;
	version[strcspn(version, "\n")] = '\0';
	printf("# " PROG " all_reduce: %d ranks, dtype f32, redop sum, out of "
	       "place, sizes %llu..%llu x%llu, iters %ld, warmup %ld\n",
	       nranks, (unsigned long long)cfg->min_bytes,
	       (unsigned long long)cfg->max_bytes,
	       (unsigned long long)cfg->factor, cfg->iters, cfg->warmup);
	printf("# library: %s\n", version);
	for (int r = 0; entries && r < nranks; r++)
		printf("# rank %d: %s\n", r, entries + (size_t)r * ENTRY_MAX);
	printf("size_B\tcount\ttype\tredop\troot\ttime_us\talgbw_GBps\t"
	       "busbw_GBps\twrong\n");
	free(entries);
}

/* One size: returns the number of wrong elements over all ranks and sets
 * *time_out to the largest mean seconds per call over ranks. */
static uint64_t run_size(const float *send, float *recv, size_t count,
			 const struct config *cfg, int nranks, double *time_out)
{
	uint64_t wrong, total;
	double mean, slowest;

	for (size_t i = 0; i < count; i++)
		recv[i] = -1.0f;
	for (long i = 0; i < cfg->warmup; i++)
		MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM,
			      MPI_COMM_WORLD);
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (long i = 0; i < cfg->iters; i++)
		MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM,
			      MPI_COMM_WORLD);
	mean = (MPI_Wtime() - t0) / (double)cfg->iters;
	MPI_Allreduce(&mean, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	wrong = count_wrong(recv, count, nranks);
	MPI_Allreduce(&wrong, &total, 1, MPI_UINT64_T, MPI_SUM,
		      MPI_COMM_WORLD);
	*time_out = slowest;
	return total;
}

static uint64_t run_sizes(const struct config *cfg, const float *send,
			  float *recv, int rank, int nranks)
{
	double bus_factor = 2.0 * (nranks - 1) / nranks;
	double sum_busbw = 0.0;
	uint64_t wrong_total = 0;
	int rows = 0;

	for (uint64_t size = cfg->min_bytes; size <= cfg->max_bytes;
	     size *= cfg->factor) {
		size_t count = (size_t)(size / sizeof(float));
		double t;
		uint64_t wrong = run_size(send, recv, count, cfg, nranks, &t);
		double bytes = (double)count * sizeof(float);
		double algbw = t > 0 ? bytes / t / 1e9 : 0.0;
		double busbw = algbw * bus_factor;

		wrong_total += wrong;
		sum_busbw += busbw;
		rows++;
		if (rank == 0)
			printf("%llu\t%zu\tf32\tsum\t-1\t%.2f\t%.4f\t%.4f\t%llu\n",
			       (unsigned long long)(count * sizeof(float)),
			       count, t * 1e6, algbw, busbw,
			       (unsigned long long)wrong);
		if (size > UINT64_MAX / cfg->factor)
			break;
	}
	if (rank == 0)
		printf("# avg busbw: %.4f GB/s\n", rows ? sum_busbw / rows : 0.0);
	return wrong_total;
}

int main(int argc, char **argv)
{
	struct config cfg;
	int rank, nranks, status;
	float *send = NULL, *recv = NULL;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	setvbuf(stdout, NULL, _IOLBF, 0);

	status = parse_args(argc, argv, rank, &cfg);
	if (status != 0) {
		status = status == 1 ? 0 : 2;
		goto out_finalize;
	}

	size_t max_count = (size_t)(cfg.max_bytes / sizeof(float));
	send = malloc(max_count * sizeof(float));
	recv = malloc(max_count * sizeof(float));
	int failed = !send || !recv, any_failed;
	MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX,
		      MPI_COMM_WORLD);
	if (any_failed) {
		if (failed)
			fprintf(stderr, PROG ": rank %d: cannot allocate 2 x "
					"%zu bytes: %s\n",
				rank, max_count * sizeof(float),
				strerror(ENOMEM));
		status = 1;
		goto out_free;
	}
	fill_input(send, max_count, rank);

	print_preamble(&cfg, rank, nranks);
	uint64_t wrong = run_sizes(&cfg, send, recv, rank, nranks);
	if (rank == 0) {
		if (wrong)
			printf("# FAIL: %llu wrong elements\n",
			       (unsigned long long)wrong);
		else
			printf("# PASS\n");
	}
	status = wrong ? 1 : 0;
	if (rank == 0 && (fflush(stdout) != 0 || ferror(stdout))) {
		fprintf(stderr, PROG ": cannot write standard output: %s\n",
			strerror(errno));
		status = 1;
	}

out_free:
	free(recv);
	free(send);
out_finalize:
	MPI_Finalize();
	return status;
}
