#!/usr/bin/env bash
# demo.sh: set everything up, then run the demo end to end on a small
# built-in default: the data pipeline on a built-in corpus (this project's
# own documentation, byte-tokenised), then flow-bench's kernel checks (the
# sgemm ceiling, then every CPU kernel forward and backward, timed and checked
# against the reference kernels).  Later stages (plan, train on 2 local ranks,
# checkpoint, export) join as they land.
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
echo "demo: every stage passed"
