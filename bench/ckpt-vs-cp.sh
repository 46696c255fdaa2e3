#!/bin/sh
# ckpt-vs-cp.sh: flow-ckpt reshard and export against cp(1) of the same
# bytes on the same disk, measured in the same run, and their peak
# resident memory against the bound flow-ckpt(1) promises.
#
# Usage: bench/ckpt-vs-cp.sh [--model SPEC] [--dir DIR] [--reps R]
#   --model SPEC  the model [gpt2-350m: 355M parameters, a 4.3 GB
#                 checkpoint with AdamW's moments]
#   --dir DIR     where the checkpoints are written (the disk measured)
#                 [a new directory under the current one, removed after]
#   --reps R      runs of each command; the median counts [3]
# A one-step flow-train run writes the source checkpoint (one rank, all
# tensors whole).  Then, R times in turn: cp -r --reflink=never of it and
# sync (the peer), flow-ckpt reshard of it onto a 2x2 (dp,tp) plan, and
# flow-ckpt export of it to a Hugging Face directory followed by cp -r of
# that directory and sync (export's peer: the same bytes out).  flow-ckpt
# syncs every file and directory it writes itself.  Reshard's working set
# is flow-ckpt's default (2x the largest target shard); export holds one
# tensor (read, and transposed or converted).  Printed, as TSV: the
# seconds, GB/s and peak RSS of each (/usr/bin/time -v); then the ratios
# of GB/s (flow-ckpt / cp, the goal >= 0.5) and each peak RSS against its
# bound: the working set plus, for export, the RSS of flow-ckpt info on
# the same checkpoint, and for reshard that of a reshard refused before
# reading (the plan's layouts built).  FLOW_BIN names the directory of
# the flow programs (default: on PATH).  Exit status: 0 done, 1 a program
# failed, 2 usage error.
set -eu

prog=ckpt-vs-cp.sh
model=gpt2-350m dir= reps=3
synopsis="[--model SPEC] [--dir DIR] [--reps R]"
. "$(dirname "$0")/common.sh"
while [ $# -gt 0 ]; do
	case $1 in
	--model | --dir)
		[ $# -ge 2 ] || usage "option '$1' needs a value"
		case $1 in --model) model=$2 ;; --dir) dir=$2 ;; esac
		shift 2
		;;
	--reps)
		option_value "$1" $# "${2-}"
		reps=$2
		shift 2
		;;
	-h | --help) print_help ;;
	*) usage "unknown argument '$1'" ;;
	esac
done
[ "$reps" -ge 1 ] || usage "--reps must be at least 1"
bin=${FLOW_BIN:+$FLOW_BIN/}
[ -x /usr/bin/time ] || { echo "$prog: needs GNU time (/usr/bin/time)" >&2; exit 1; }

if [ -z "$dir" ]; then
	dir=$(mktemp -d "$PWD/ckpt-bench.XXXXXX")
	trap 'rm -rf "$dir"' EXIT
else
	mkdir -p "$dir"
fi
cd "$dir"

# timed NAME CMD...: run CMD under /usr/bin/time -v; append its seconds
# and peak RSS (KiB) to NAME.s and NAME.rss.
timed() {
	name=$1
	shift
	/usr/bin/time -v -o "$name.time" "$@" >/dev/null
	awk -F': ' '/Elapsed \(wall clock\)/ {
		n = split($2, p, ":"); s = 0
		for (i = 1; i <= n; i++) s = s * 60 + p[i]
		print s }' "$name.time" >>"$name.s"
	awk -F': ' '/Maximum resident set size/ { print $2 }' "$name.time" >>"$name.rss"
}
copy_sync='cp -r --reflink=never "$1" "$2" && sync'
max() { sort -g | tail -n 1; }

echo "# $prog: $model in $dir, $reps reps; $(uname -m), $(nproc) cores," \
	"$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
i=0
while [ $i -lt 4000 ]; do
	echo "line $i of the text the benchmark trains one step on"
	i=$((i + 1))
done >corpus.txt
"${bin}flow-shard" -q -o data corpus.txt
"${bin}flow-train" --model "$model" --batch 1 --seq-len 64 --steps 1 \
	--ckpt-dir src --data data --peak-gflops 0 >/dev/null
"${bin}flow-plan" --model "$model" --mesh 2x2 --axes dp,tp --batch 4 \
	--seq-len 64 -o tp.plan
src=src/step-00000001
timed info "${bin}flow-ckpt" info "$src"
# Reshard's own baseline: the plan's layouts built, then refused for a
# budget of one byte before any tensor is read.
/usr/bin/time -v -o base.time "${bin}flow-ckpt" reshard "$src" --plan tp.plan \
	-o nothing --max-memory 1 >/dev/null 2>&1 || true
awk -F': ' '/Maximum resident set size/ { print $2 }' base.time >layouts.rss
src_bytes=$(du -sb "$src" | cut -f1)

r=0
while [ $r -lt "$reps" ]; do
	rm -rf copy out hf hfcopy
	timed cp sh -c "$copy_sync" sh "$src" copy
	timed reshard "${bin}flow-ckpt" reshard "$src" --plan tp.plan -o out
	timed export "${bin}flow-ckpt" export "$src" -o hf
	timed cp_export sh -c "$copy_sync" sh hf hfcopy
	r=$((r + 1))
done
out_bytes=$(du -sb out | cut -f1)
hf_bytes=$(du -sb hf | cut -f1)

# The working sets: reshard's target shards from the plan's checkpoint;
# export's largest tensor, twice (read, then transposed or converted).
largest_shard=$("${bin}flow-ckpt" info out | grep -v '^#' | tail -n +2 |
	awk -F'\t' '{ print int(($7 + $6 - 1) / $6) }' | max)
largest_tensor=$("${bin}flow-ckpt" info "$src" | grep -v '^#' | tail -n +2 |
	cut -f7 | max)
base_kib=$(median info.rss | cut -d. -f1)
layouts_kib=$(cut -d. -f1 layouts.rss)
reshard_bound=$((layouts_kib + 2 * largest_shard / 1024))
export_bound=$((base_kib + 2 * largest_tensor / 1024))

row() { # row NAME BYTES
	s=$(median "$1.s")
	printf '%s\t%s\t%.3f\t%.3f\t%.0f\n' "$1" "$2" "$s" \
		"$(echo "$2 $s" | awk '{ print $1 / $2 / 1e9 }')" \
		"$(median "$1.rss")"
}
printf 'run\tbytes\tseconds\tGB_per_s\tpeak_rss_kib\n'
row cp "$src_bytes"
row reshard "$out_bytes"
row export "$hf_bytes"
row cp_export "$hf_bytes"
gbs() { echo "$2 $(median "$1.s")" | awk '{ print $1 / $2 }'; }
printf '# reshard / cp (GB/s): %.2f\n' \
	"$(echo "$(gbs reshard "$out_bytes") $(gbs cp "$src_bytes")" | awk '{ print $1 / $2 }')"
printf '# export / cp of its output (GB/s): %.2f\n' \
	"$(echo "$(gbs export "$hf_bytes") $(gbs cp_export "$hf_bytes")" | awk '{ print $1 / $2 }')"
printf '# reshard peak RSS %.0f KiB, bound %s KiB (%s KiB with the layouts + 2 x the largest target shard, %s bytes)\n' \
	"$(median reshard.rss)" "$reshard_bound" "$layouts_kib" "$largest_shard"
printf '# export peak RSS %.0f KiB, bound %s KiB (%s KiB + 2 x the largest tensor, %s bytes)\n' \
	"$(median export.rss)" "$export_bound" "$base_kib" "$largest_tensor"
