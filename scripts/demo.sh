#!/usr/bin/env bash
# demo.sh: set everything up, then run the demo end to end on a small
# built-in default: the data pipeline on a built-in corpus (this project's
# own documentation, byte-tokenised), then flow-bench's kernel checks (the
# sgemm ceiling, then every CPU kernel forward and backward, timed and checked
# against the reference kernels), then flow-bench comm: an all-reduce
# across 2 local ranks, checked bit for bit, then flow-plan: a data-parallel
# plan for 2 ranks, checked, then flow-train on 2 local ranks from that
# plan (flow's own launcher): a small GPT on that corpus
# whose loss falls, a checkpoint, and a resume from it that reproduces the
# uninterrupted run bit for bit; then the same checkpoint resumed on a
# tensor-parallel plan, which follows the same curve to float rounding;
# then flow-ckpt: the final checkpoint verified, exported to a Hugging Face
# GPT-2 directory (safetensors) and read back onto the tensor-parallel plan,
# bit for bit, and a run started from those weights.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$top/scripts/setup.sh" "$@"
build=${FLOW_BUILD_DIR:-$top/build}
bin=$build/bin
demo=$build/demo
rm -rf "$demo"
mkdir -p "$demo"

echo "== flow-shard: the built-in corpus into compressed, checksummed shards"
corpus=("$top/README.md" "$top"/man/*.[157])
"$bin/flow-shard" -o "$demo/data" --shard-tokens 16K --val-tokens 4K --compress \
	"${corpus[@]}"
"$bin/flow-shard" --info "$demo/data"
"$bin/flow-shard" --verify "$demo/data"
echo "== flow-shard --order: what 2 data-parallel ranks read in the first 2 steps"
for rank in 0 1; do
	"$bin/flow-shard" --order "$demo/data" --rank "$rank" --world 2 \
		--seq-len 64 --batch 4 --steps 2
done

echo "== flow-bench kernel all: every CPU kernel, forward and backward, checked"
"$bin/flow-bench" kernel all --iters 3

echo "== flow-bench comm: all-reduce across 2 local ranks, every result checked"
"$bin/flow-bench" comm all_reduce -b 4K -e 16M -f 16 --iters 10 --nproc 2

echo "== flow-plan: the data-parallel plan of a 4-layer GPT on 2 ranks, checked"
"$bin/flow-plan" --model gpt:layers=4,heads=4,dim=128,vocab=256,seq=128 --mesh 2 \
	--axes dp --batch 8 --seq-len 128 -o "$demo/gpt.plan"
"$bin/flow-plan" --check "$demo/gpt.plan" --world 2

echo "== flow-train --nproc 2 --plan: the GPT on the corpus, data parallel on 2 ranks"
run=(--data "$demo/data" --steps 120 --lr 2e-3 --warmup 10 --eval-every 60 --eval-batches 4
	--ckpt-every 60)
train=(--nproc 2 --plan "$demo/gpt.plan" "${run[@]}" --ckpt-dir "$demo/ckpt")
"$bin/flow-train" "${train[@]}" | tee "$demo/train.tsv" |
	awk -F'\t' '/^#/ || $1 == "step" || $2 == "val" || $1 % 10 == 0'
awk -F'\t' '$2 == "train" && $1 == 1 { first = $3 } $2 == "train" { last = $3 }
	END { printf "demo: train loss %.3f -> %.3f\n", first, last
	      if (!(last < first - 1.5)) { print "demo: the loss did not fall"; exit 1 } }' \
	"$demo/train.tsv"

echo "== flow-train --resume: continue from step 60, compare with the first run"
"$bin/flow-train" "${train[@]}" --resume "$demo/ckpt/step-00000060" >"$demo/resumed.tsv"
rows() { grep -v '^#' "$1" | awk -F'\t' '$1 > 60 && $2 == "train"' | cut -f1-5; }
if ! cmp -s <(rows "$demo/train.tsv") <(rows "$demo/resumed.tsv"); then
	echo "demo: the resumed run differs from the uninterrupted one" >&2
	exit 1
fi
echo "demo: steps 61-120 after resuming equal the uninterrupted run bit for bit"

echo "== flow-train --plan, tensor parallel: the data-parallel checkpoint resumed on a tp=2 plan"
"$bin/flow-plan" --model gpt:layers=4,heads=4,dim=128,vocab=256,seq=128 --mesh 2 \
	--axes tp --batch 8 --seq-len 128 -o "$demo/tp.plan"
"$bin/flow-train" --nproc 2 --plan "$demo/tp.plan" "${run[@]}" --ckpt-dir "$demo/ckpt-tp" \
	--resume "$demo/ckpt/step-00000060" >"$demo/tp.tsv"
grep '^# sharded over mesh' "$demo/tp.tsv"
if ! paste <(rows "$demo/train.tsv") <(rows "$demo/tp.tsv") | awk -F'\t' '
	{ r = ($3 - $8) / $3; if (r < 0) r = -r; if (r > worst) worst = r }
	END { printf "demo: steps 61-120 on tp=2: worst loss difference %.2g (relative)\n", worst
	      exit !(NR == 60 && worst < 1e-5) }'; then
	echo "demo: the tensor-parallel run left the data-parallel curve" >&2
	exit 1
fi
echo "== flow-ckpt: verify, export to safetensors, import onto the tp=2 plan"
final=$demo/ckpt/step-00000120
"$bin/flow-ckpt" verify "$final"
"$bin/flow-ckpt" export "$final" -o "$demo/gpt-hf"
ls -l "$demo/gpt-hf"
"$bin/flow-ckpt" import "$demo/gpt-hf" --plan "$demo/tp.plan" -o "$demo/gpt-tp"
"$bin/flow-ckpt" info "$demo/gpt-tp" | head -n 8
# The weights back, whatever the layout: the same bytes exported again.
"$bin/flow-ckpt" export "$demo/gpt-tp" -o "$demo/gpt-hf-again"
if ! cmp "$demo/gpt-hf/model.safetensors" "$demo/gpt-hf-again/model.safetensors"; then
	echo "demo: the weights read back differ from those exported" >&2
	exit 1
fi
echo "demo: exported, imported onto tp=2 and exported again: the same bytes"
"$bin/flow-train" --nproc 2 --plan "$demo/tp.plan" --data "$demo/data" --steps 5 --lr 2e-4 \
	--init "$demo/gpt-tp" >"$demo/init.tsv"
last=$(awk -F'\t' '$2 == "train" { l = $3 } END { print l }' "$demo/train.tsv")
if ! awk -F'\t' -v last="$last" '$2 == "train" && $1 == 1 { first = $3 } END {
	printf "demo: a run from the imported weights starts at loss %.3f (the run that trained them ended at %.3f)\n", first, last
	exit !(first < last + 0.5) }' "$demo/init.tsv"; then
	echo "demo: the imported weights did not carry the training over" >&2
	exit 1
fi
echo "demo: every stage passed"
