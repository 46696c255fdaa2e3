#!/bin/sh
# comm-vs-openmpi.sh: flow's CPU all-reduce against OpenMPI's MPI_Allreduce
# on the ranks of this one machine, measured in the same run, as the
# evidence for flow's collective speed.
#
# Usage: bench/comm-vs-openmpi.sh [--ranks 'N...'] [--rounds N]
#                                 [--iters N] [--warmup N] [--max-bytes SIZE]
#   --ranks 'N...'    local rank counts to compare, each >= 2 ['2 4']
#   --rounds N        runs of each program per rank count, alternating
#                     flow, OpenMPI, flow, OpenMPI, ... so that both see the
#                     same machine load [2]
#   --iters N         timed calls per size, the same for both [20]
#   --warmup N        untimed calls before them, the same for both [5]
#   --max-bytes SIZE  the largest message (K, M, G suffixes) [256M]
# Sizes: 1K to the largest, times 4 each step, f32 sum, every result
# checked by both programs.  flow: `flow-bench comm all_reduce --nproc N`
# (flow's own launcher).  OpenMPI: bench/mpi_allreduce.c, compiled here
# with MPICC and run with `MPIRUN --allow-run-as-root --oversubscribe -n N`
# (its default transports and binding).  Both print time_us as the slowest
# rank's mean time per call and busbw = size / time * 2(n-1)/n (nccl-tests'
# bus bandwidth for all-reduce).  Per rank count and size the table keeps
# the BEST busbw of the rounds of each program (the highest: load on a
# shared machine only lowers bandwidth), and prints it as TSV: ranks,
# size_B, flow_busbw_GBps, mpi_busbw_GBps, ratio (flow/mpi; above 1: flow
# is faster).  The reference is the machine's single-process memcpy
# bandwidth (bytes copied per second of memcpy on 256 MiB buffers, the
# best of 10 copies, measured before and after the runs: the higher
# counts).  A '#' verdict line per rank count states the goal:
# flow >= OpenMPI at every size from 64 KiB up, and flow's busbw at the
# largest size >= memcpy / 2.  A run with the defaults takes about 3
# minutes on 2 cores.
# Environment: FLOW_BENCH (default: build/bin/flow-bench of this source
# tree), MPICC (default mpicc), MPIRUN (default mpirun).
# Exit status: 0 done, whether or not the goal is met (this is a
# benchmark, not a test); 1 a build or a run failed or a result was wrong;
# 2 usage error.
set -eu

prog=comm-vs-openmpi.sh
ranks='2 4' rounds=2 iters=20 warmup=5 max_bytes=256M
synopsis="[--ranks 'N...'] [--rounds N] [--iters N] [--warmup N] [--max-bytes SIZE]"
. "$(dirname "$0")/common.sh"
while [ $# -gt 0 ]; do
	case $1 in
	--rounds | --iters | --warmup)
		option_value "$1" $# "${2-}"
		case $1 in
		--rounds) rounds=$2 ;;
		--iters) iters=$2 ;;
		--warmup) warmup=$2 ;;
		esac
		shift
		;;
	--ranks)
		[ $# -ge 2 ] || usage "option '$1' needs a value"
		for n in $2; do
			case $n in '' | *[!0-9]*) usage "invalid value '$2' for '$1'" ;; esac
			[ "$n" -ge 2 ] || usage "invalid value '$2' for '$1' (each >= 2)"
		done
		[ -n "$2" ] || usage "invalid value '' for '$1'"
		ranks=$2
		shift
		;;
	--max-bytes)
		[ $# -ge 2 ] || usage "option '$1' needs a value"
		case $2 in
		[0-9]*[!0-9KMG]* | [0-9]*[KMG]?* | '' | [!0-9]*)
			usage "invalid value '$2' for '$1'" ;;
		esac
		max_bytes=$2
		shift
		;;
	-h | --help) print_help ;;
	*) usage "unknown argument '$1'" ;;
	esac
	shift
done
[ "$rounds" -ge 1 ] || usage "--rounds must be at least 1"
[ "$iters" -ge 1 ] || usage "--iters must be at least 1"

top=$(cd "$(dirname "$0")/.." && pwd)
flow_bench=${FLOW_BENCH:-$top/build/bin/flow-bench}
mpicc=${MPICC:-mpicc}
mpirun=${MPIRUN:-mpirun}
if [ ! -x "$flow_bench" ] && ! command -v "$flow_bench" >/dev/null 2>&1; then
	echo "$prog: cannot run '$flow_bench' (build flow, or set FLOW_BENCH)" >&2
	exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/comm-vs-openmpi.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

# The peer, and the memcpy probe, built with the same compiler wrapper.
if ! "$mpicc" -std=c11 -O2 -Wall -Wextra -Werror -o "$tmp/mpi_allreduce" \
	"$top/bench/mpi_allreduce.c" 2>"$tmp/cc.err"; then
	echo "$prog: $mpicc failed on bench/mpi_allreduce.c:" >&2
	cat "$tmp/cc.err" >&2
	exit 1
fi
cat >"$tmp/memcpy_bw.c" <<'EOF'
/* memcpy_bw.c: the best of 10 single-threaded memcpy calls on 256 MiB
 * buffers, in GB/s of bytes copied. */
#define _GNU_SOURCE 1
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(void)
{
	size_t n = (size_t)256 << 20;
	char *a = malloc(n), *b = malloc(n);
	double best = 0.0;

	if (!a || !b) {
		perror("memcpy_bw: malloc");
		return 1;
	}
	memset(a, 1, n);
	memset(b, 2, n);
	for (int i = 0; i < 10; i++) {
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		memcpy(i % 2 ? a : b, i % 2 ? b : a, n);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		double s = (double)(t1.tv_sec - t0.tv_sec) +
			   (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
		if (s > 0 && (double)n / s / 1e9 > best)
			best = (double)n / s / 1e9;
	}
	printf("%.3f\n", best);
	/* The copies must be observable, or they could be optimised away. */
	int sum = a[n / 2] + b[n / 3];
	free(b);
	free(a);
	return sum == 2 ? 0 : 1;
}
EOF
if ! "$mpicc" -std=c11 -O2 -Wall -Wextra -Werror -o "$tmp/memcpy_bw" \
	"$tmp/memcpy_bw.c" 2>"$tmp/cc.err"; then
	echo "$prog: $mpicc failed on memcpy_bw.c:" >&2
	cat "$tmp/cc.err" >&2
	exit 1
fi
memcpy1=$("$tmp/memcpy_bw") || { echo "$prog: memcpy_bw failed" >&2; exit 1; }

echo "# $prog: flow-bench comm all_reduce vs OpenMPI MPI_Allreduce, f32 sum"
echo "# flow-bench: $flow_bench"
echo "# mpirun: $("$mpirun" --version 2>/dev/null | head -n 1)"
echo "# host: $(uname -n), $(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN) cpus"
echo "# config: ranks $ranks, sizes 1K..$max_bytes x4, iters $iters, warmup $warmup, rounds $rounds (flow, mpi alternating); table: best busbw of the rounds"

# run_one WHO N ROUND: one run of flow (WHO=flow) or OpenMPI (WHO=mpi) on N
# ranks; its TSV in $tmp/WHO.N.ROUND.tsv, its rows (N, size_B, busbw)
# appended to $tmp/WHO.N.dat.  A failed run or a wrong result ends the
# script.
sizes="-b 1K -e $max_bytes -f 4 --iters $iters --warmup $warmup"
run_one() {
	out=$tmp/$1.$2.$3.tsv
	echo "# $2 ranks, round $3/$rounds: $1" >&2
	status=0
	# $sizes is split on purpose: every word was checked above.
	# shellcheck disable=SC2086
	case $1 in
	flow) "$flow_bench" comm all_reduce $sizes --nproc "$2" \
		>"$out" 2>"$tmp/err" || status=$? ;;
	mpi) "$mpirun" --allow-run-as-root --oversubscribe -n "$2" \
		"$tmp/mpi_allreduce" $sizes >"$out" 2>"$tmp/err" || status=$? ;;
	esac
	if [ "$status" -ne 0 ] || ! grep -q '^# PASS' "$out"; then
		echo "$prog: the $1 run on $2 ranks failed (exit $status):" >&2
		grep -v '^#' "$out" >&2 || :
		grep '^# FAIL' "$out" >&2 || :
		cat "$tmp/err" >&2
		exit 1
	fi
	grep -v '^#' "$out" | awk -F'\t' -v who="$1" -v n="$2" '
		NR == 1 {
			for (i = 1; i <= NF; i++) col[$i] = i
			if (!("size_B" in col) || !("busbw_GBps" in col) ||
			    !("wrong" in col)) { bad = "no header row"; exit }
			next
		}
		$(col["wrong"]) != 0 { bad = "wrong results at " $(col["size_B"]) " B"; exit }
		{ print n "\t" $(col["size_B"]) "\t" $(col["busbw_GBps"]); rows++ }
		END {
			if (bad == "" && rows == 0) bad = "no rows"
			if (bad != "") { print who ": " bad > "/dev/stderr"; exit 1 }
		}
	' >>"$tmp/$1.$2.dat" || {
		echo "$prog: the $1 run on $2 ranks: unusable output" >&2
		exit 1
	}
}

for n in $ranks; do
	: >"$tmp/flow.$n.dat"
	: >"$tmp/mpi.$n.dat"
	r=1
	while [ "$r" -le "$rounds" ]; do
		run_one flow "$n" "$r"
		run_one mpi "$n" "$r"
		r=$((r + 1))
	done
	# The preambles of the first round: versions, rank maps, settings.
	sed -n '/^#/p; /^size_B/q' "$tmp/flow.$n.1.tsv" | sed 's/^# /# flow: /'
	sed -n '/^#/p; /^size_B/q' "$tmp/mpi.$n.1.tsv" | sed 's/^# /# mpi: /'
done

memcpy2=$("$tmp/memcpy_bw") || { echo "$prog: memcpy_bw failed" >&2; exit 1; }
memcpy=$(printf '%s\n%s\n' "$memcpy1" "$memcpy2" | sort -g | tail -n 1)
echo "# memcpy: $memcpy GB/s (single process, 256 MiB; the higher of $memcpy1 before and $memcpy2 after the runs)"

printf 'ranks\tsize_B\tflow_busbw_GBps\tmpi_busbw_GBps\tratio\n'
for n in $ranks; do
	awk -F'\t' -v n="$n" -v memcpy="$memcpy" -v out="$tmp/verdict" '
		FNR == 1 { file++ }
		file == 1 { if (!($2 in flow) || $3 > flow[$2]) flow[$2] = $3
			    if (!($2 in seen)) { seen[$2] = 1; order[++k] = $2 } }
		file == 2 { if (!($2 in mpi) || $3 > mpi[$2]) mpi[$2] = $3 }
		END {
			ok = 1; minr = -1
			for (i = 1; i <= k; i++) {
				s = order[i]
				if (!(s in mpi)) { printf "%s\t%s\t%s\t-\t-\n", n, s, flow[s]; continue }
				ratio = mpi[s] > 0 ? flow[s] / mpi[s] : 0
				printf "%s\t%s\t%s\t%s\t%.3f\n", n, s, flow[s], mpi[s], ratio
				if (s + 0 >= 65536) {
					if (minr < 0 || ratio < minr) { minr = ratio; mins = s }
					if (ratio < 1) ok = 0
				}
				last = s
			}
			frac = memcpy > 0 ? flow[last] / memcpy : 0
			v1 = ok ? "yes" : "no"
			v2 = (frac >= 0.5) ? "yes" : "no"
			v = (ok && frac >= 0.5) ? "MET" : "NOT MET"
			printf("# ranks %s: flow >= OpenMPI from 64 KiB up: %s (lowest ratio %.3f at %s B); " \
				"flow busbw at %s B: %s GB/s = %.3f x memcpy %s GB/s (goal >= 0.5): %s; goal %s\n",
				n, v1, minr, mins, last, flow[last], frac, memcpy, v2, v) >> out
		}
	' "$tmp/flow.$n.dat" "$tmp/mpi.$n.dat"
done
cat "$tmp/verdict"
