#!/bin/sh
# shard_vs_zstd.sh: flow-shard --compress=L against the zstd command-line
# tool at the same level on the same bytes, measured in the same run, as
# the evidence the issue asks for (flow-shard's compressed writing should
# cost about what zstd itself costs).
#
# Usage: bench/shard_vs_zstd.sh [--level L] [--mb N] [--frame-tokens N] [--reps R]
#   --level L         zstd level for both [3]
#   --mb N            megabytes of token payload [64]
#   --frame-tokens N  flow-shard's tokens per frame [16384, flow-shard's default]
#   --reps R          runs of each program; the fastest counts [3]
# The payload: words of the text in /usr/share/common-licenses (or
# /usr/share/dict, or a fixed generated text), drawn by a fixed LCG to N MB
# of uint16 tokens (the byte-level tokenizer: one token per byte), written by
# an uncompressed flow-shard run and cut out of its shard.  Both programs
# then compress exactly those bytes from the same file, and both write
# their output to a file beside it and fsync it (flow-shard syncs its
# shards, manifest and directory itself; zstd's file is synced by sync(1)
# inside its timing): flow-shard reads them as raw u16 tokens and writes
# one compressed shard.  flow-shard compresses its frames on OpenMP threads
# (all cores unless OMP_NUM_THREADS says otherwise), so it runs twice:
# with its default threads and with OMP_NUM_THREADS=1; zstd runs with -T1
# (one thread) and -T0 (all cores).  Printed, as TSV: seconds, MB/s of
# payload and compressed size of each; then the ratios of MB/s
# (flow-shard / zstd) for equal threads (1 thread: flow-shard 1 / zstd -T1;
# all cores: flow-shard / zstd -T0), and flow-shard on all cores against
# zstd -T1.  FLOW_SHARD names the program (default: flow-shard on PATH).
# Exit status: 0 done, 1 a program failed or zstd is missing, 2 usage
# error.
set -eu

prog=shard_vs_zstd.sh
level=3 mb=64 frame=16384 reps=3
synopsis="[--level L] [--mb N] [--frame-tokens N] [--reps R]"
. "$(dirname "$0")/common.sh"
while [ $# -gt 0 ]; do
	case $1 in
	--level | --mb | --frame-tokens | --reps)
		option_value "$1" $# "${2-}"
		case $1 in
		--level) level=$2 ;;
		--mb) mb=$2 ;;
		--frame-tokens) frame=$2 ;;
		--reps) reps=$2 ;;
		esac
		shift
		;;
	-h | --help) print_help ;;
	*) usage "unknown option '$1'" ;;
	esac
	shift
done
[ "$mb" -ge 1 ] || usage "--mb must be at least 1"
[ "$reps" -ge 1 ] || usage "--reps must be at least 1"
flow_shard=${FLOW_SHARD:-flow-shard}
command -v zstd >/dev/null 2>&1 || { echo "$prog: zstd not found" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shard_vs_zstd.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

# Seed text, then N/2 MB of it as text: N MB of u16 tokens.
if ls /usr/share/common-licenses/* >/dev/null 2>&1; then
	cat /usr/share/common-licenses/* >"$tmp/seed"
elif [ -r /usr/share/dict/words ]; then
	cat /usr/share/dict/words >"$tmp/seed"
else
	awk 'BEGIN { for (i = 0; i < 20000; i++) printf "line %d of %d: the quick brown fox %d\n", i, i * 7 % 13, i * i % 101 }' >"$tmp/seed"
fi
bytes=$((mb * 1024 * 1024 / 2))
# Words of the seed drawn by a fixed LCG, so the text has the statistics of
# prose but no long repeats (a repeated file would let zstd's window find
# whole copies that independent frames cannot).
awk -v n="$bytes" '
	{ for (i = 1; i <= NF; i++) w[nw++] = $i }
	END {
		x = 12345; out = 0; line = 0
		while (out < n) {
			x = (x * 16807) % 2147483647
			s = w[x % nw]
			line += length(s) + 1
			if (line > 72) { printf "%s\n", s; line = 0 } else printf "%s ", s
			out += length(s) + 1
		}
	}' "$tmp/seed" | head -c "$bytes" >"$tmp/corpus.txt"
"$flow_shard" --shard-tokens "$bytes" -o "$tmp/plain" "$tmp/corpus.txt"
# The payload of the one shard: after the 64-byte header, before the
# 8-byte checksum.
tail -c +65 "$tmp/plain/train-000000.bin" | head -c $((bytes * 2)) >"$tmp/payload.u16"
payload=$(wc -c <"$tmp/payload.u16")

now() { date +%s.%N; }
# best CMD...: run CMD reps times; print the fastest run's seconds.
best() {
	b=
	i=0
	while [ "$i" -lt "$reps" ]; do
		t0=$(now)
		"$@" >&2
		t1=$(now)
		b=$(awk -v a="$t0" -v c="$t1" -v b="$b" 'BEGIN {
			s = c - a; if (b == "" || s < b) b = s; printf "%.6f", b }')
		i=$((i + 1))
	done
	echo "$b"
}
flow_run() {
	rm -rf "$tmp/z"
	"$flow_shard" --format raw --dtype u16 --vocab 256 --shard-tokens "$bytes" \
		--compress="$level" --frame-tokens "$frame" -o "$tmp/z" "$tmp/payload.u16"
}
flow1_run() { OMP_NUM_THREADS=1 flow_run; }
zstd_run() {
	zstd -q -f -T"$1" -"$level" "$tmp/payload.u16" -o "$tmp/payload.zst"
	sync "$tmp/payload.zst"
}
zstd1_run() { zstd_run 1; }
zstd0_run() { zstd_run 0; }

threads=${OMP_NUM_THREADS:-$(nproc 2>/dev/null || echo 1)}
t_flow=$(best flow_run)
flow_bytes=$(wc -c <"$tmp/z/train-000000.bin")
cp "$tmp/z/train-000000.bin" "$tmp/threads.bin"
t_flow1=$(best flow1_run)
# Threads must not change a byte of the shard.
cmp -s "$tmp/threads.bin" "$tmp/z/train-000000.bin" || {
	echo "$prog: flow-shard's shard differs between $threads threads and 1" >&2
	exit 1
}
t_zstd1=$(best zstd1_run)
zstd_bytes=$(wc -c <"$tmp/payload.zst")
t_zstd0=$(best zstd0_run)

printf '# payload %s bytes (%s tokens u16), level %s, flow frames of %s tokens\n' \
	"$payload" "$bytes" "$level" "$frame"
printf '# fastest of %s runs each; flow-shard threads: %s (OMP_NUM_THREADS or cores)\n' \
	"$reps" "$threads"
printf 'tool\tthreads\tseconds\tMB_per_s\tout_bytes\n'
awk -v p="$payload" -v th="$threads" -v f="$t_flow" -v f1="$t_flow1" \
	-v z1="$t_zstd1" -v z0="$t_zstd0" -v fb="$flow_bytes" -v zb="$zstd_bytes" 'BEGIN {
	printf "flow-shard\t%s\t%.3f\t%.1f\t%d\n", th, f, p / f / 1e6, fb
	printf "flow-shard\t1\t%.3f\t%.1f\t%d\n", f1, p / f1 / 1e6, fb
	printf "zstd -T1\t1\t%.3f\t%.1f\t%d\n", z1, p / z1 / 1e6, zb
	printf "zstd -T0\t%s\t%.3f\t%.1f\t%d\n", th, z0, p / z0 / 1e6, zb
	printf "# ratio 1 thread (flow-shard 1 / zstd -T1): %.2f\n", z1 / f1
	printf "# ratio all cores (flow-shard / zstd -T0): %.2f\n", z0 / f
	printf "# ratio flow-shard all cores / zstd -T1: %.2f\n", z1 / f
	printf "# size ratio (flow-shard bytes / zstd bytes): %.3f\n", fb / zb
}'
