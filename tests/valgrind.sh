#!/usr/bin/env bash
# valgrind.sh: flow-shard and a one-rank flow-train of a tiny GPT under
# valgrind's memcheck: build a dataset, train 4 steps with evaluation and a
# checkpoint every 2, then resume from step 2; any memory error or leak
# (tests/valgrind.supp lists what is not ours) fails.  A few seconds on
# two cores; CI runs it (.ci/run).
#   tests/valgrind.sh [BUILD_DIR]    default: $FLOW_BUILD_DIR or build/
# Exit status: 0 clean, 1 valgrind found something (its report is on
# stderr) or a run failed, 2 valgrind or the build is missing.
set -uo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=corpus.bash
. "$top/tests/corpus.bash"
build=$(cd "${1:-${FLOW_BUILD_DIR:-$top/build}}" 2>/dev/null && pwd) || {
	echo "valgrind.sh: no build directory '${1:-${FLOW_BUILD_DIR:-$top/build}}'" >&2
	exit 2
}
command -v valgrind >/dev/null || {
	echo "valgrind.sh: valgrind not found (apt-get install valgrind)" >&2
	exit 2
}
[ -x "$build/bin/flow-train" ] && [ -x "$build/libtool" ] || {
	echo "valgrind.sh: $build has no bin/flow-train: build first" >&2
	exit 2
}

work=$(mktemp -d "${TMPDIR:-/tmp}/flow-valgrind.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 2

# The tools re-execute themselves to tune OpenMP (flow_tool_init), and an
# exec leaves valgrind: set what they would set, so they do not.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
vg=(valgrind --error-exitcode=1 --leak-check=full
	--suppressions="$top/tests/valgrind.supp" -q)
# libtool runs the uninstalled binary itself, not its wrapper script.
under_valgrind() {
	"$build/libtool" --mode=execute "${vg[@]}" "$@"
}

failed=0
check() { # check NAME CMD...: run CMD under valgrind, stderr to NAME.err
	local name=$1 status=0
	shift
	under_valgrind "$@" >"$name.out" 2>"$name.err" || status=$?
	if grep -q 'using OPENBLAS_CORETYPE=' "$name.err"; then
		echo "valgrind.sh: $name: the tool restarted itself outside valgrind; set OPENBLAS_CORETYPE" >&2
		status=1
	fi
	if [ "$status" -ne 0 ]; then
		echo "valgrind.sh: $name failed (status $status):" >&2
		cat "$name.err" >&2
		failed=1
	else
		echo "valgrind.sh: $name: clean"
	fi
}

fox_corpus 600 corpus.txt
model=(--model gpt:layers=2,heads=2,dim=32,vocab=256,seq=32 --batch 4
	--seq-len 32 --peak-gflops 0 --steps 4 --eval-every 2 --eval-batches 1
	--ckpt-dir ck --ckpt-every 2)
check flow-shard "$build/bin/flow-shard" -v -o data --val-tokens 2K corpus.txt
[ "$failed" -eq 0 ] && check train "$build/bin/flow-train" -v "${model[@]}" --data data
[ "$failed" -eq 0 ] && check resume "$build/bin/flow-train" -v "${model[@]}" --data data \
	--resume ck/step-00000002
if [ "$failed" -eq 0 ] &&
	! diff <(grep -v '^#' train.out | tail -n +2 | tail -n 3 | cut -f1-5) \
		<(grep -v '^#' resume.out | tail -n +2 | cut -f1-5) >&2; then
	echo "valgrind.sh: the resumed run's rows differ from the full run's" >&2
	failed=1
fi
exit "$failed"
