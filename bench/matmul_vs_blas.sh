#!/bin/sh
# matmul_vs_blas.sh: flow's matmul against the BLAS's own sgemm on the GPT-2
# 124M layer GEMMs, measured in the same flow-bench run (same inputs, same
# threads), as the evidence for the done-criterion
#     flow matmul GFLOP/s >= 0.90 x cblas_sgemm GFLOP/s.
#
# Usage: bench/matmul_vs_blas.sh [--check] [--rows N] [--iters N] [--warmup N]
#   --rows N    N = B*T rows of every GEMM [2048, i.e. B 8 x T 256]
#   --check     exit 1 when any ratio is below 0.90 (off by default:
#               benchmarks on a shared machine are noisy)
# Shapes (N,IN,OUT): c_attn N,768,2304; attn proj N,768,768; fc N,768,3072;
# mlp proj N,3072,768; classifier N,768,50304.  FLOW_BENCH names the
# program (default: flow-bench on PATH).  Exit status: 0 done (or all ratios
# >= 0.90 with --check), 1 flow-bench failed or a ratio is low with --check,
# 2 usage error.
set -eu

prog=matmul_vs_blas.sh
check=0 rows=2048 iters=3 warmup=1
synopsis="[--check] [--rows N] [--iters N] [--warmup N]"
. "$(dirname "$0")/common.sh"
while [ $# -gt 0 ]; do
	case $1 in
	--check) check=1 ;;
	--rows | --iters | --warmup)
		option_value "$1" $# "${2-}"
		case $1 in
		--rows) rows=$2 ;;
		--iters) iters=$2 ;;
		--warmup) warmup=$2 ;;
		esac
		shift
		;;
	-h | --help) print_help ;;
	*) usage "unknown argument '$1'" ;;
	esac
	shift
done

bench=${FLOW_BENCH:-flow-bench}
tsv=$(mktemp "${TMPDIR:-/tmp}/matmul_vs_blas.XXXXXX")
trap 'rm -f "$tsv"' EXIT

status=0
"$bench" kernel matmul --iters "$iters" --warmup "$warmup" \
	--shape "$rows,768,2304" --shape "$rows,768,768" \
	--shape "$rows,768,3072" --shape "$rows,3072,768" \
	--shape "$rows,768,50304" >"$tsv" || status=$?

grep '^#' "$tsv" | grep -E '^# (flow|cpu|openmp|blas|warning|config|peak)'
grep -v '^#' "$tsv" | awk -F'\t' -v check="$check" -v bench_status="$status" '
	NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
	$(col["kernel"]) != "matmul" { next }
	{
		r = $(col["blas_ratio"]) + 0
		printf "%-18s %-4s %10s %10s %7.3f%s\n", $(col["shape"]),
			$(col["pass"]), $(col["gflops"]), $(col["blas_gflops"]),
			r, (r < 0.90 ? "  < 0.90" : "")
		if (n == 0 || r < min) min = r
		n++
		# Time-weighted total: sum of BLAS time over sum of flow time.
		split($(col["shape"]), d, "x")
		f = ($(col["pass"]) == "bwd" ? 4 : 2) * d[1] * d[2] * d[3]
		tflow += f / $(col["gflops"])
		tblas += f / $(col["blas_gflops"])
	}
	BEGIN {
		printf "%-18s %-4s %10s %10s %7s\n", "shape", "pass",
			"flow_gf/s", "blas_gf/s", "ratio"
	}
	END {
		if (n == 0) { print "no matmul rows" > "/dev/stderr"; exit 1 }
		printf "overall ratio %.3f (sum of sgemm times / sum of flow times)\n",
			tblas / tflow
		printf "min ratio %.3f over %d GEMM passes (criterion >= 0.90): %s\n",
			min, n, (min >= 0.90 ? "met" : "not met")
		if (bench_status != 0) exit 1
		if (check && min < 0.90) exit 1
	}'
