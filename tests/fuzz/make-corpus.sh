#!/usr/bin/env bash
# make-corpus.sh BUILD_DIR: (re)write the seed corpus tests/fuzz/corpus/NAME/
# of every fuzz target from the project's own artifacts: the token inputs
# of tests/data, datasets, plans and checkpoints written by the built
# tools, the examples of the man pages.  Run it from anywhere after a
# build; commit what changes.  Files are named by what they hold; inputs
# of targets that take a harness byte first (tests/fuzz/README) get \0
# (every checksum repaired) and a copy with \1 or \7 where it matters.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:?usage: make-corpus.sh BUILD_DIR}" && pwd)
corpus=$top/tests/fuzz/corpus
sep=$'\n--8<--\n'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1

rm -rf "$corpus"
mkdir -p "$corpus"
seed() { # seed TARGET NAME: stdin becomes corpus/TARGET/NAME
	mkdir -p "$corpus/$1"
	cat > "$corpus/$1/$2"
}
with_byte() { # with_byte BYTE FILE...: the harness byte, then the files cut at the separator
	local byte=$1 first=1
	shift
	printf "\\x$byte"
	for f in "$@"; do
		[ $first -eq 1 ] || printf '%s' "$sep"
		first=0
		cat "$f"
	done
}

# ---- strings: the examples of flow(7), flow-plan(1) and the model presets
i=0
for s in 8 2x4 2x4:dp,tp 2x4@8 2@1/4 1 '4x2:a,b@3/1,8'; do
	i=$((i + 1))
	printf \'%s\' "$s" | seed mesh_round_trip "$i"
done
i=0
for s in 'S(0)' B P '(S(0),B)' '(B,S(1))' '(S(1), P)' '(S(0),S(0),B,P)'; do
	i=$((i + 1))
	printf \'%s\' "$s" | seed nd_sbp_round_trip "$i"
done
i=0
for s in '(2,3,4)' 6x8 '()' 256,768,2304 '8,1024->8,1024,768' \
	'4,768;768,2304;-->4,2304' '(0)'; do
	i=$((i + 1))
	printf \'%s\' "$s" | seed shape_round_trip "$i"
done
i=0
for s in gpt2-124m gpt2-1.5b gpt2-124m:seq=256 \
	'gpt:layers=4,heads=4,dim=256,vocab=50257,seq=256' \
	'gpt:layers=1,heads=2,dim=16,vocab=256,seq=16,pad=64'; do
	i=$((i + 1))
	printf \'%s\' "$s" | seed gpt_round_trip "$i"
done
i=0
for s in 64 4K 16M 1G 2TiB 1.5M -3 0x10 1e9 2x4 256,768 0123456789abcdef \
	u16 bf16 train npy cuda matmul debug; do
	i=$((i + 1))
	printf \'%s\' "$s" | seed size_round_trip "$i"
done
i=0
for s in 'h.0.attn.c_attn.weight' 'data/manifest:7: a "quoted" \ path' \
	$'tab\there' $'\x01\x7f\xc3\xa9'; do
	i=$((i + 1))
	printf \'%s\' "$s" | seed json_round_trip "$i"
done

# ---- cluster profiles: flow(7)'s example and the unit tests' lines
sed -n '/^# 4 GPUs per node/,/^memory 80/p' "$top/man/flow.7" |
	sed 's/\\-/-/g' | seed cluster example.prof
printf 'memory 0.5\nlink intra 1 200\nlink inter 3 50\nranks_per_node 2\n' |
	seed cluster small.prof
printf '\n# x\nlink intra 5\n' | seed cluster bad-line.prof

# ---- token inputs: tests/data, each under its own extension (fuzz_tokens'
# byte: bits 0-2 the name, 3-5 the format, 6 a vocabulary check)
for f in "$top"/tests/data/good/* "$top"/tests/data/bad/*; do
	b=$(basename "$f")
	case $b in
	*.npy) byte=00 ;; *.llmc.bin) byte=05 ;; *.bin) byte=01 ;;
	*.u16) byte=02 ;; *.u32) byte=03 ;; *) byte=04 ;;
	esac
	with_byte "$byte" "$f" | seed tokens "$(basename "$(dirname "$f")")-$b"
done

# ---- datasets: flow-shard on the text and token inputs, plain and zstd
shard=$build/bin/flow-shard
"$shard" -q -o "$tmp/text" "$top/tests/data/good/hello.txt"
"$shard" -q -o "$tmp/zstd" --compress=3 --frame-tokens 4 --val-tokens 3 \
	--shard-tokens 5 "$top/tests/data/good/hello.txt"
"$shard" -q -o "$tmp/u32" --vocab 128001 "$top/tests/data/good/tiny32.llmc.bin"
for d in text zstd u32; do
	with_byte 00 "$tmp/$d/manifest" | seed manifest_round_trip "$d"
	with_byte 00 "$tmp/$d/manifest" | seed textrec_round_trip "manifest-$d"
	for f in "$tmp/$d"/*.bin; do
		with_byte 00 "$f" | seed shard "$d-$(basename "$f")"
	done
done
with_byte 01 "$tmp/text/manifest" | seed manifest_round_trip text-stored-sum
with_byte 09 "$tmp/zstd/train-000000.bin" | seed shard zstd-stored-sum-chunks

# fuzz_train: the manifest, then its shards in the order it lists them.
for d in text zstd; do
	files=("$tmp/$d/manifest")
	for f in $(awk '$1 == "shard" { print $2 }' "$tmp/$d/manifest"); do
		files+=("$tmp/$d/$f")
	done
	with_byte 00 "${files[@]}" | seed train "$d"
done
with_byte 08 "$tmp/text/manifest" "$tmp/text/train-000000.bin" |
	seed train text-prefetch

# ---- plans: flow-plan's standard layouts of small models
plan=$build/bin/flow-plan
m='gpt:layers=1,heads=2,dim=16,vocab=256,seq=16'
"$plan" --model "$m" --mesh 2 --axes dp --batch 4 | seed plan_round_trip dp2
"$plan" --model "$m" --mesh 2x2 --axes dp,tp --batch 4 --zero 1 \
	--device cpu --precision fp32 | seed plan_round_trip dp2-tp2-zero1
"$plan" --model "$m" --mesh 1 --axes dp --batch 1 --seq-len 8 --grad-accum 2 |
	seed plan_round_trip one-rank

# ---- checkpoints: flow-train's, one step of a tiny model on the text data
"$build/bin/flow-train" -q --model 'gpt:layers=1,heads=1,dim=8,vocab=256,seq=8' \
	--data "$tmp/text" --batch 1 --seq-len 4 --steps 1 \
	--ckpt-dir "$tmp/ckpt" > /dev/null
step=$(ls -d "$tmp"/ckpt/step-* | head -n 1)
with_byte 00 "$step/manifest" "$step/rank-00000.idx" "$step/rank-00000.bin" |
	seed ckpt trained
# The same indexes committed by the harness, without the manifest.
printf '\x04' | cat - <(with_byte 00 /dev/null "$step/rank-00000.idx" \
	"$step/rank-00000.bin" | tail -c +2) | seed ckpt commit
with_byte 00 "$step/manifest" | seed textrec_round_trip ckpt-manifest
printf '\x01' | cat - "$step/rank-00000.idx" | seed textrec_round_trip ckpt-index

# ---- foreign model files: safetensors, llm.c, Hugging Face directories
python3 "$top/tests/fuzz/foreign_seeds.py" "$corpus/safetensors"

du -sh "$corpus" | cut -f1 | sed 's/^/make-corpus: corpus size /' >&2
