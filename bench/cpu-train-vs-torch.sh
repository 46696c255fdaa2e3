#!/bin/sh
# cpu-train-vs-torch.sh: flow-train against PyTorch training the same GPT-2
# on the CPU (same model, batch, sequence length and thread count),
# measured in the same run, as the evidence for flow's CPU training speed.
#
# Usage: bench/cpu-train-vs-torch.sh [--steps N] [--warmup-steps N]
#                                    [--rounds N] [--threads N]
#                                    [--config 'SPEC B T']...
#   --steps N         timed steps per run [4]
#   --warmup-steps N  untimed steps before them in every run [1]
#   --rounds N        runs of each program, alternating flow, torch, flow,
#                     torch, ... so that both see the same machine load [2]
#   --threads N       threads of both (OMP_NUM_THREADS, and
#                     torch.set_num_threads) [all cores]
#   --config 'SPEC B T'  a model spec, batch and sequence length; repeat
#                     for several [gpt2-124m 4 64, and
#                     gpt:layers=4,heads=4,dim=256,vocab=50257,seq=256 8 256]
# Each step is one micro-batch of B sequences of T tokens: forward,
# backward, clip_grad_norm_ (1.0) and AdamW.  The data: random GPT-2 token
# ids (vocabulary 50257) in an llm.c token file (header of 256 int32:
# magic 20240520, version 1, token count; then uint16 ids), sharded by
# flow-shard --vocab 50257; PyTorch (tests/ref/torch_gpt.py bench) draws
# random ids of the same vocabulary.  flow's step time is the ms column of
# flow-train's TSV; PyTorch's is the wall time of its step.  Printed per
# config: the median ms/step of the timed steps of all rounds for each and
# the per-op profile of flow's last round (flow-train --profile, its
# standard error); then a summary table: the medians, the ratio torch/flow
# (above 1: flow is faster), and model FLOP utilisation of each (6N + 12LTC
# FLOPs per token, N without wpe) as a fraction of this machine's sgemm
# ceiling, measured by `flow-bench kernel peak` in the same run before and
# after the training runs (the higher counts: load only lowers it).  A
# full run with the defaults takes about 3 minutes on 2 cores.
# Both run with OMP_WAIT_POLICY=PASSIVE and the OPENBLAS_CORETYPE that
# flow-bench reports (flow's programs pick these themselves; PyTorch loads
# the same OpenBLAS, which without them may fall back to slow kernels);
# values already in the environment are kept.
# FLOW_TRAIN, FLOW_SHARD and FLOW_BENCH name the programs (default: on
# PATH); PYTHON the interpreter with torch (default /usr/bin/python3,
# Debian's python3-torch).  Exit status: 0 done, 1 a program failed or
# torch is missing, 2 usage error.
set -eu

prog=cpu-train-vs-torch.sh
steps=4 warmup=1 rounds=2 threads=
configs=
synopsis="[--steps N] [--warmup-steps N] [--rounds N] [--threads N] [--config 'SPEC B T']..."
. "$(dirname "$0")/common.sh"
nl='
'
while [ $# -gt 0 ]; do
	case $1 in
	--steps | --warmup-steps | --rounds | --threads)
		option_value "$1" $# "${2-}"
		case $1 in
		--steps) steps=$2 ;;
		--warmup-steps) warmup=$2 ;;
		--rounds) rounds=$2 ;;
		--threads) threads=$2 ;;
		esac
		shift
		;;
	--config)
		[ $# -ge 2 ] || usage "option '$1' needs a value"
		printf '%s\n' "$2" | awk 'NR > 1 || NF != 3 || $2 !~ /^[0-9]+$/ ||
			$3 !~ /^[0-9]+$/ { bad = 1 } END { exit bad }' ||
			usage "invalid value '$2' for '--config' (expected 'SPEC B T')"
		configs=$configs$2$nl
		shift
		;;
	-h | --help) print_help ;;
	*) usage "unknown argument '$1'" ;;
	esac
	shift
done
[ "$steps" -ge 1 ] || usage "--steps must be at least 1"
[ "$rounds" -ge 1 ] || usage "--rounds must be at least 1"
[ -n "$threads" ] || threads=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
[ "$threads" -ge 1 ] || usage "--threads must be at least 1"
[ -n "$configs" ] || configs="gpt2-124m 4 64
gpt:layers=4,heads=4,dim=256,vocab=50257,seq=256 8 256
"

flow_train=${FLOW_TRAIN:-flow-train}
flow_shard=${FLOW_SHARD:-flow-shard}
flow_bench=${FLOW_BENCH:-flow-bench}
python=${PYTHON:-/usr/bin/python3}
torch_gpt=$(cd "$(dirname "$0")/../tests/ref" && pwd)/torch_gpt.py
if ! "$python" -c 'import torch, numpy' 2>/dev/null; then
	echo "$prog: $python cannot import torch (install Debian's python3-torch)" >&2
	exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cpu-train-vs-torch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
OMP_NUM_THREADS=$threads
export OMP_NUM_THREADS

# Random GPT-2 token ids as an llm.c token file, then a dataset.
"$python" - "$tmp/tokens.bin" <<'EOF'
import sys
import numpy as np
n = 1 << 20
header = np.zeros(256, dtype="<i4")
header[:3] = (20240520, 1, n)
ids = np.random.default_rng(1234).integers(0, 50257, n).astype("<u2")
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(ids.tobytes())
EOF
"$flow_shard" --vocab 50257 -o "$tmp/data" "$tmp/tokens.bin"

# The sgemm ceiling of this machine: measured now and again after the
# runs; the higher counts (a busy shared machine only lowers it).
"$flow_bench" kernel peak >"$tmp/peak.tsv"
peak1=$(sed -n 's/^# peak_gflops: *//p' "$tmp/peak.tsv")
[ -n "$peak1" ] || { echo "$prog: no peak_gflops in flow-bench's output" >&2; exit 1; }
grep -E '^# (flow|cpu|openmp|blas|warning)' "$tmp/peak.tsv"
# flow's programs re-run themselves with OMP_WAIT_POLICY=PASSIVE and the
# best OPENBLAS_CORETYPE for this CPU when those are unset (README.md,
# Performance); PyTorch loads the same OpenBLAS, so it gets the same
# settings: the core flow-bench reports.
core=$(sed -n 's/^# blas: .*; core \([A-Za-z0-9_]*\).*/\1/p' "$tmp/peak.tsv")
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export OMP_WAIT_POLICY
if [ -z "${OPENBLAS_CORETYPE-}" ] && [ -n "$core" ]; then
	OPENBLAS_CORETYPE=$core
	export OPENBLAS_CORETYPE
fi
echo "# torch: $("$python" -c 'import torch; print(torch.__version__)')"
echo "# env for both: OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=$OMP_WAIT_POLICY OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-}"
echo "# threads $threads, steps $steps timed after $warmup warm-up, rounds $rounds"

total=$((steps + warmup))
results=$tmp/results
: >"$results"
printf '%s\n' "$configs" | while read -r spec B T; do
	[ -n "$spec" ] || continue
	: >"$tmp/flow.ms"
	: >"$tmp/torch.ms"
	r=1
	while [ "$r" -le "$rounds" ]; do
		echo "# $spec B=$B T=$T round $r/$rounds: flow-train" >&2
		if ! "$flow_train" --model "$spec" --data "$tmp/data" --batch "$B" \
			--seq-len "$T" --steps "$total" --profile \
			--peak-gflops "$peak1" \
			>"$tmp/flow.tsv" 2>"$tmp/flow.err"; then
			echo "$prog: flow-train failed on $spec B=$B T=$T:" >&2
			cat "$tmp/flow.err" >&2
			exit 1
		fi
		grep -v '^#' "$tmp/flow.tsv" | awk -F'\t' -v w="$warmup" '
			NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
			$(col["phase"]) == "train" && $(col["step"]) > w { print $(col["ms"]) }
		' >>"$tmp/flow.ms"
		echo "# $spec B=$B T=$T round $r/$rounds: torch" >&2
		if ! "$python" "$torch_gpt" bench --threads "$threads" \
			--model "$spec" --batch "$B" --seq-len "$T" --steps "$steps" \
			--warmup-steps "$warmup" >"$tmp/torch.tsv" 2>"$tmp/torch.err"; then
			echo "$prog: torch failed on $spec B=$B T=$T:" >&2
			cat "$tmp/torch.err" >&2
			exit 1
		fi
		grep -v '^#' "$tmp/torch.tsv" | awk -F'\t' -v w="$warmup" '
			NR > 1 && $1 > w { print $2 }' >>"$tmp/torch.ms"
		r=$((r + 1))
	done
	fms=$(median "$tmp/flow.ms")
	tms=$(median "$tmp/torch.ms")
	flops=$(PYTHONDONTWRITEBYTECODE=1 "$python" -c "
import sys; sys.path.insert(0, sys.argv[4])
import torch_gpt as t
print(t.flops_per_token(t.parse_spec(sys.argv[1]), int(sys.argv[2])) * int(sys.argv[3]) * int(sys.argv[2]))
" "$spec" "$T" "$B" "$(dirname "$torch_gpt")")
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$spec" "$B" "$T" "$fms" "$tms" \
		"$flops" "$(wc -l <"$tmp/flow.ms")" "$(wc -l <"$tmp/torch.ms")" >>"$results"
	echo
	echo "== $spec B=$B T=$T: flow $fms ms/step, torch $tms ms/step (medians)"
	echo "-- flow-train --profile (last round):"
	cat "$tmp/flow.err"
done

"$flow_bench" kernel peak >"$tmp/peak2.tsv"
peak2=$(sed -n 's/^# peak_gflops: *//p' "$tmp/peak2.tsv")
peak=$(printf '%s\n%s\n' "$peak1" "${peak2:-0}" | sort -g | tail -n 1)

echo
echo "== summary (sgemm ceiling $peak GFLOP/s: the higher of $peak1 before and ${peak2:-?} after the runs)"
awk -F'\t' -v peak="$peak" '
	BEGIN {
		printf "%-60s %9s %9s %10s %9s %9s\n", "config", "flow_ms",
			"torch_ms", "torch/flow", "flow_mfu", "torch_mfu"
	}
	{
		printf "%-60s %9.1f %9.1f %10.3f %9.3f %9.3f\n",
			$1 " B=" $2 " T=" $3, $4, $5, $5 / $4,
			$6 / ($4 / 1000) / (peak * 1e9), $6 / ($5 / 1000) / (peak * 1e9)
		notes = notes sprintf("  %s B=%s T=%s: %.4g GFLOP/step, medians of %d flow and %d torch steps\n",
			$1, $2, $3, $6 / 1e9, $7, $8)
	}
	END { printf "mfu: model FLOPs per step / time / sgemm ceiling\n%s", notes }
' "$results"
