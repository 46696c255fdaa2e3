#!/bin/sh
# gpu-train-vs-torch.sh: flow-train on one GPU against PyTorch training the
# same GPT-2 on the same GPU, eager and torch.compile, measured in the same
# run: the evidence for flow's GPU training speed (tests/gpu/train.sh runs
# it for GPT-2 124M).
#
# Usage: bench/gpu-train-vs-torch.sh [--model SPEC] [--batch B] [--seq-len T]
#                                    [--steps N] [--warmup-steps N]
#                                    [--precision bf16|fp32]
#   --model SPEC      [gpt2-124m]
#   --batch B         sequences per step [8]
#   --seq-len T       [1024]
#   --steps N         timed steps [5]
#   --warmup-steps N  untimed steps before them (the first launches, the
#                     compilation of torch.compile) [2]
#   --precision P     bf16 (flow --precision bf16; PyTorch under
#                     torch.autocast(bf16) with fp32 weights) or fp32 (true
#                     fp32 in both: no TF32) [bf16]
# Each step is one micro-batch: forward, backward, clip_grad_norm_ (1.0)
# and AdamW, on random GPT-2 token ids (vocabulary 50257).  flow's step
# time is the ms column of flow-train's TSV, PyTorch's the wall time of its
# step after torch.cuda.synchronize (tests/ref/torch_gpt.py bench, the same
# model code as the parity tests, with PyTorch's fastest equivalents where
# they exist: scaled_dot_product_attention and fused AdamW, so the ratio
# is against PyTorch at its best, not against the reference's arithmetic).  Printed: the median ms/step of the
# timed steps of each, tokens/s, MFU (flow-train(1): model FLOPs per step
# over time over the GPU's datasheet peak for the precision, the same
# FLOPs and peak for PyTorch), flow's device memory, and the ratio
# torch/flow (above 1: flow is faster).  PyTorch is skipped, and said so,
# when $PYTHON cannot import torch with CUDA.
# FLOW_TRAIN and FLOW_SHARD name the programs (default: on PATH); PYTHON
# the interpreter with torch (default python3: a CUDA build of PyTorch,
# e.g. a virtual environment with the PyPI wheel, not Debian's CPU one);
# TORCH_TIMEOUT the seconds each PyTorch run may take [150] (torch.compile
# compiles for tens of seconds first; one that takes longer is reported,
# not waited for).
# Exit status: 0 done, 1 flow-train failed, 2 usage error.
set -eu

prog=gpu-train-vs-torch.sh
model=gpt2-124m batch=8 seq=1024 steps=5 warmup=2 precision=bf16
synopsis="[--model SPEC] [--batch B] [--seq-len T] [--steps N] [--warmup-steps N] [--precision bf16|fp32]"
. "$(dirname "$0")/common.sh"
while [ $# -gt 0 ]; do
	case $1 in
	--batch | --seq-len | --steps | --warmup-steps)
		option_value "$1" $# "${2-}"
		case $1 in
		--batch) batch=$2 ;;
		--seq-len) seq=$2 ;;
		--steps) steps=$2 ;;
		--warmup-steps) warmup=$2 ;;
		esac
		shift
		;;
	--model)
		[ $# -ge 2 ] || usage "option '$1' needs a value"
		model=$2
		shift
		;;
	--precision)
		[ $# -ge 2 ] || usage "option '$1' needs a value"
		case $2 in bf16 | fp32) precision=$2 ;; *) usage "invalid value '$2' for '--precision'" ;; esac
		shift
		;;
	-h | --help) print_help ;;
	*) usage "unknown argument '$1'" ;;
	esac
	shift
done
[ "$steps" -ge 1 ] || usage "--steps must be at least 1"

flow_train=${FLOW_TRAIN:-flow-train}
flow_shard=${FLOW_SHARD:-flow-shard}
python=${PYTHON:-python3}
torch_gpt=$(cd "$(dirname "$0")/../tests/ref" && pwd)/torch_gpt.py
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-train-vs-torch.XXXXXX")
# PyTorch runs under timeout(1), in a process group of its own: waited for
# in the background (bg_wait), so that a TERM to this script reaches it.
. "$(dirname "$0")/../tests/gpu/bg-wait.bash"
trap 'rm -rf "$tmp"' EXIT
# Through the EXIT trap, and no further run.
trap '[ -z "$child" ] || kill -TERM "$child" 2>/dev/null; exit 143' INT TERM

# Random GPT-2 token ids as an llm.c token file (header of 256 int32:
# magic 20240520, version 1, count; then uint16 ids), then a dataset.
python3 - "$tmp/tokens.bin" <<'EOF'
import random, struct, sys
random.seed(1234)
n = 1 << 21
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(random.randrange(50257) for _ in range(n))))
EOF
"$flow_shard" -q --vocab 50257 --val-tokens 64K -o "$tmp/data" "$tmp/tokens.bin"

total=$((steps + warmup))
if ! "$flow_train" --model "$model" --batch "$batch" --seq-len "$seq" --steps "$total" \
	--data "$tmp/data" --device cuda --precision "$precision" >"$tmp/flow.tsv" 2>"$tmp/flow.err"; then
	# The first line says what failed; the rest (a retry's reason: out
	# of memory, cuDNN) follows.
	echo "$prog: flow-train failed: $(head -n 1 "$tmp/flow.err")" >&2
	tail -n +2 "$tmp/flow.err" >&2
	exit 1
fi
grep -E '^# (device|binding|kernels|attention)' "$tmp/flow.tsv"
flow_ms=$(awk -F'\t' -v w="$warmup" '$2 == "train" && $1 > w { print $6 }' "$tmp/flow.tsv" | median)
gflop=$(sed -n 's/^# kernels .*; model \([0-9.e+]*\) GFLOP per step.*/\1/p' "$tmp/flow.tsv")
peak=$(sed -n 's/^# kernels .*; peak \([0-9.]*\) GFLOP\/s.*/\1/p' "$tmp/flow.tsv")
tokens=$((batch * seq))

# mfu MS: model FLOPs of a step over MS milliseconds over the peak.
mfu() {
	awk -v g="$gflop" -v p="${peak:-0}" -v ms="$1" 'BEGIN {
		if (p > 0 && ms > 0) printf "%.3f", g / (ms / 1e3) / p; else print "-" }'
}
row() { # NAME MS
	awk -v n="$1" -v ms="$2" -v t="$tokens" -v f="$flow_ms" -v m="$(mfu "$2")" 'BEGIN {
		printf "%s\t%.1f\t%.0f\t%s\t%s\n", n, ms, t / (ms / 1e3), m,
			(ms == f) ? "1.00" : sprintf("%.2f", ms / f) }'
}

echo "# $model, B=$batch, T=$seq, $precision; $steps steps timed after $warmup; peak ${peak:-?} GFLOP/s"
printf 'program\tms_per_step\ttokens_per_s\tmfu\ttime_vs_flow\n'
row flow "$flow_ms"
if "$python" -c 'import torch, numpy; assert torch.cuda.is_available()' 2>/dev/null; then
	for mode in eager compile; do
		flag=
		[ "$mode" = compile ] && flag=--compile
		rc=0
		bg_wait timeout -k 5 "${TORCH_TIMEOUT:-150}" "$python" "$torch_gpt" bench \
			--device cuda --precision "$precision" $flag \
			--model "$model" --batch "$batch" --seq-len "$seq" --steps "$steps" \
			--warmup-steps "$warmup" >"$tmp/torch-$mode.tsv" 2>"$tmp/torch-$mode.err" ||
			rc=$?
		if [ "$rc" -eq 0 ]; then
			ms=$(sed -n 's/^# median_ms //p' "$tmp/torch-$mode.tsv")
			row "torch-$mode" "$ms"
		elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
			echo "# torch $mode stopped after ${TORCH_TIMEOUT:-150} s (TORCH_TIMEOUT)"
		else
			echo "# torch $mode failed (exit $rc): $(tail -n 1 "$tmp/torch-$mode.err")"
		fi
	done
	echo "# $(head -n 1 "$tmp/torch-eager.tsv" 2>/dev/null | sed 's/^# //')"
else
	echo "# PyTorch with CUDA is not importable by $python: no peer measured"
fi
