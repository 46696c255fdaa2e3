#!/bin/sh
# fuzz.sh: run one fuzz target (tests/fuzz/README) under libFuzzer for a
# while and report what it did.
#
# Usage: bench/fuzz.sh [--build DIR] [--out DIR] TARGET SECONDS
#   TARGET        a target of tests/fuzz, with or without its "fuzz_"
#                 prefix: plan_round_trip, shard, train, ...
#   SECONDS       how long to fuzz (libFuzzer's -max_total_time)
#   --build DIR   the --enable-fuzzing build to use, configured there with
#                 clang when it has no Makefile [build-fuzz beside the
#                 source]; the target is (re)built with make -j2 first
#   --out DIR     where findings go [fuzz-out/TARGET]
# The target runs on a copy of tests/fuzz/corpus/TARGET and
# tests/fuzz/regressions/TARGET (the committed files are never touched)
# and stops at the first finding, whose input libFuzzer writes to the out
# directory as crash-*, leak-*, timeout-* or oom-*.  Printed, as TSV:
# target, seconds, execs (inputs run), execs_per_s, cov (coverage edges)
# and ft (features) from libFuzzer's last status line, corpus (inputs
# kept at the end) and findings (files this run wrote in the out
# directory); then the
# path of each finding.  libFuzzer's own log is out/TARGET.log.
# Exit status: 0 no finding, 1 a finding or a failed build, 2 usage error.
set -eu

prog=fuzz.sh
synopsis="[--build DIR] [--out DIR] TARGET SECONDS"
. "$(dirname "$0")/common.sh"
top=$(cd "$(dirname "$0")/.." && pwd)
build=$top/build-fuzz out=
while [ $# -gt 0 ]; do
	case $1 in
	--build | --out)
		[ $# -ge 2 ] || usage "option '$1' needs a value"
		case $1 in --build) build=$2 ;; --out) out=$2 ;; esac
		shift
		;;
	-h | --help) print_help ;;
	-*) usage "unknown option '$1'" ;;
	*) break ;;
	esac
	shift
done
[ $# -eq 2 ] || usage "expected TARGET and SECONDS"
target=${1#fuzz_}
option_value SECONDS 2 "$2"
seconds=$2
[ -f "$top/tests/fuzz/fuzz_$target.c" ] ||
	usage "unknown target '$1' (see tests/fuzz/fuzz_*.c)"
out=${out:-fuzz-out/$target}

mkdir -p "$build" "$out"
build=$(cd "$build" && pwd)
if [ ! -f "$build/Makefile" ]; then
	echo "$prog: configuring a fuzzing build in $build" >&2
	(cd "$build" && "$top/configure" -q CC=clang CFLAGS="-g -O2" \
		--without-cuda --enable-fuzzing) >&2 || exit 1
fi
grep -q '^FLOW_FUZZ_LDFLAGS = -fsanitize=fuzzer' "$build/Makefile" || {
	echo "$prog: $build is not configured with --enable-fuzzing" >&2
	exit 1
}
make -s -C "$build" -j2 "tests/fuzz/fuzz_$target" >&2 || exit 1

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
mkdir "$tmp/corpus"
for d in corpus regressions; do
	[ -d "$top/tests/fuzz/$d/$target" ] &&
		cp "$top/tests/fuzz/$d/$target"/* "$tmp/corpus/"
done
log=$out/$target.log
# Findings are the files libFuzzer writes in this run, not earlier ones.
touch "$tmp/start"
# Keep going over slow or memory-hungry inputs only as far as a test
# would: 10 s an input, 2 GiB.
"$build/tests/fuzz/fuzz_$target" -max_total_time="$seconds" \
	-print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
	-artifact_prefix="$out/" "$tmp/corpus" > "$log" 2>&1 || true

findings=$(find "$out" -maxdepth 1 -type f -newer "$tmp/start" \
	\( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
	-o -name 'oom-*' -o -name 'slow-unit-*' \) | sort)
nfind=$(printf '%s' "$findings" | grep -c . || true)
stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -n 1; }
last=$(grep -E '^#[0-9]+' "$log" | grep ' cov: ' | tail -n 1)
cov=$(printf '%s' "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
ft=$(printf '%s' "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
printf 'target\tseconds\texecs\texecs_per_s\tcov\tft\tcorpus\tfindings\n'
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$target" "$seconds" \
	"$(stat number_of_executed_units)" "$(stat average_exec_per_sec)" \
	"${cov:-0}" "${ft:-0}" "$(ls "$tmp/corpus" | wc -l)" "$nfind"
[ -n "$findings" ] || exit 0
printf '%s\n' "$findings" | sed 's/^/# finding: /'
grep -m 1 -E '^(==[0-9]+==ERROR|.*runtime error|fuzz: )' "$log" |
	sed 's/^/# /' || true
exit 1
