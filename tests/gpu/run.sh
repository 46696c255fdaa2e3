#!/bin/bash
# tests/gpu/run.sh: the GPU suite, for a machine with an NVIDIA GPU.
#
#   tests/gpu/run.sh            (from anywhere; finds the source tree itself)
#
# In under 8 minutes: installs missing build dependencies (apt-get, only when
# something is missing and we are root), runs autoreconf -fi when configure is
# absent, configures out of tree with --with-cuda, builds with make -j$(nproc),
# runs the CPU unit tests (make check), then tests/gpu/test_cuda_kernels.
#
# Environment:
#   BUILD_DIR    out-of-tree build directory (default /tmp/flow-build-gpu)
#   OUT          when set, logs go there (configure.log, build.log,
#                check.log, test-suite.log, gpu.tsv, gpu.err, summary.txt);
#                otherwise under $BUILD_DIR/gpu-logs
#   GPU_SUITE_BUDGET  seconds for the whole run (default 470)
#
# Ends with the line 'N passed, N failed' (make check's tests plus one per
# GPU kernel row, plus one failure for a setup step that failed) and exits 0
# only when nothing failed.
set -eu
set -o pipefail

srcdir=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-/tmp/flow-build-gpu}
logs=${OUT:-$build/gpu-logs}
budget=${GPU_SUITE_BUDGET:-470}
start=$(date +%s)
passed=0
failed=0

mkdir -p "$build" "$logs"

say() { printf 'gpu-suite: %s\n' "$*" >&2; }

summary() {
	printf '%d passed, %d failed\n' "$passed" "$failed" | tee "$logs/summary.txt"
}

# Seconds left of the budget (at least 10, so a step can report its failure).
left() {
	local l=$((budget - ($(date +%s) - start)))
	[ "$l" -lt 10 ] && l=10
	echo "$l"
}

# A setup step failed: count it, print the summary, stop.
fail_setup() {
	say "$1"
	failed=$((failed + 1))
	summary
	exit 1
}

# ---- 1. build dependencies (only what is missing) ------------------------------
missing=
for cmd in autoreconf:autoconf automake:automake libtoolize:libtool \
	pkg-config:pkg-config make:make gcc:gcc; do
	command -v "${cmd%%:*}" >/dev/null 2>&1 || missing="$missing ${cmd#*:}"
done
if command -v pkg-config >/dev/null 2>&1; then
	pkg-config --exists libzstd || missing="$missing libzstd-dev"
	pkg-config --exists libxxhash || missing="$missing libxxhash-dev"
	pkg-config --exists cmocka || missing="$missing libcmocka-dev"
	{ pkg-config --exists openblas || [ -e /usr/include/cblas.h ] ||
		[ -e /usr/include/x86_64-linux-gnu/cblas.h ]; } ||
		missing="$missing libopenblas-dev"
else
	missing="$missing libzstd-dev libxxhash-dev libcmocka-dev libopenblas-dev"
fi
command -v bats >/dev/null 2>&1 || missing="$missing bats"
if [ -n "$missing" ]; then
	say "missing build dependencies:$missing"
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		# shellcheck disable=SC2086 # word splitting intended
		if timeout "$(left)" apt-get update -qq >"$logs/apt.log" 2>&1 &&
			DEBIAN_FRONTEND=noninteractive timeout "$(left)" \
				apt-get install -y -qq --no-install-recommends \
				$missing >>"$logs/apt.log" 2>&1; then
			say "installed:$missing"
		else
			say "apt-get could not install them (see $logs/apt.log); trying without"
		fi
	else
		say "not root or no apt-get: cannot install them; trying without"
	fi
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
	fail_setup "nvcc not found (PATH or /usr/local/cuda/bin): install the CUDA toolkit"
fi
if command -v nvidia-smi >/dev/null 2>&1; then
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
fi

# ---- 2. configure (out of tree) -----------------------------------------------
if [ ! -x "$srcdir/configure" ]; then
	say "no configure in $srcdir: running autoreconf -fi"
	(cd "$srcdir" && timeout "$(left)" autoreconf -fi) >"$logs/configure.log" 2>&1 ||
		fail_setup "autoreconf -fi failed (see $logs/configure.log)"
fi
say "configuring in $build"
(cd "$build" && timeout "$(left)" "$srcdir/configure" --with-cuda) \
	>>"$logs/configure.log" 2>&1 ||
	fail_setup "configure --with-cuda failed: $(grep -E 'error:' "$logs/configure.log" | tail -1) (see $logs/configure.log)"

# ---- 3. build -----------------------------------------------------------------------
say "building with make -j$(nproc)"
timeout "$(left)" make -C "$build" -j"$(nproc)" >"$logs/build.log" 2>&1 ||
	fail_setup "build failed (see $logs/build.log): $(grep -m1 -E 'error' "$logs/build.log" || tail -1 "$logs/build.log")"

# ---- 4. CPU unit tests ----------------------------------------------------------------
say "running make check"
check_rc=0
timeout "$(left)" make -C "$build" -j"$(nproc)" check >"$logs/check.log" 2>&1 ||
	check_rc=$?
[ -f "$build/test-suite.log" ] && cp "$build/test-suite.log" "$logs/test-suite.log"
# automake's summary: "# PASS:  12", "# FAIL:  1", "# ERROR: 0", ...
n_pass=$(sed -n 's/^# PASS: *\([0-9]*\).*/\1/p' "$logs/check.log" | tail -1)
n_fail=$(sed -n 's/^# \(FAIL\|ERROR\|XPASS\): *\([0-9]*\).*/\2/p' "$logs/check.log" |
	awk '{s += $1} END {print s + 0}')
passed=$((passed + ${n_pass:-0}))
failed=$((failed + n_fail))
if [ "$check_rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then
	say "make check failed (exit $check_rc) without a test failure: see $logs/check.log"
	failed=$((failed + 1))
fi
say "make check: ${n_pass:-0} passed, $n_fail failed"

# ---- 5. GPU kernels ------------------------------------------------------------------
say "running tests/gpu/test_cuda_kernels"
gpu_rc=0
timeout "$(left)" "$build/tests/gpu/test_cuda_kernels" >"$logs/gpu.tsv" \
	2>"$logs/gpu.err" || gpu_rc=$?
cat "$logs/gpu.tsv"
g_pass=$(awk -F '\t' '$2 == "yes"' "$logs/gpu.tsv" | wc -l)
g_fail=$(awk -F '\t' '$2 == "no"' "$logs/gpu.tsv" | wc -l)
passed=$((passed + g_pass))
failed=$((failed + g_fail))
case $gpu_rc in
0) ;;
77)
	say "test_cuda_kernels skipped: $(cat "$logs/gpu.err")"
	say "this runner is for a machine with a GPU: counting the skip as a failure"
	failed=$((failed + 1))
	;;
124) say "test_cuda_kernels ran out of time"; failed=$((failed + 1)) ;;
*)
	say "test_cuda_kernels failed (exit $gpu_rc): $(tail -3 "$logs/gpu.err")"
	[ "$g_fail" -eq 0 ] && failed=$((failed + 1))
	;;
esac

say "done in $(($(date +%s) - start)) s; logs in $logs"
summary
[ "$failed" -eq 0 ]
