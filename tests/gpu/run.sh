#!/bin/bash
# tests/gpu/run.sh: the GPU suite, for a machine with an NVIDIA GPU.
#
#   tests/gpu/run.sh            (from anywhere; finds the source tree itself)
#
# Builds libflow with CUDA out of tree, runs tests/gpu/test_cuda_kernels (every
# CUDA kernel against its CPU kernel, with timings; its attention_cudnn row
# fails when cuDNN is there but bf16 attention did not run through it), every NCCL collective
# (flow-bench comm), tests/gpu/train.sh (flow-train --device cuda against the
# CPU, resume, GPT-2 124M throughput), the CPU suite (make check) and a short
# CPU benchmark, in under 8 minutes on 16 cores, on a
# machine without network access, without the autotools and without some of
# the build dependencies:
#
# - Dependencies: zstd, xxHash, OpenBLAS, cmocka, Jansson, PMIx, bats and
#   pkg-config are each taken from the system when it has them; each one
#   it lacks is unpacked
#   (dpkg -x, or ar+tar, or python3) from the .debs in .gpu-deps/ into a
#   private prefix ($FLOW_DEPS_PREFIX), and PKG_CONFIG_PATH, CPPFLAGS,
#   LDFLAGS (-L, -rpath), PATH and, for running tests, LD_LIBRARY_PATH point
#   there.  Nothing is installed into the system; no network is used.
# - Autotools: the configure, Makefile.in, config.h.in, aclocal.m4, build-aux/
#   and m4/ made by tests/gpu/fetch-deps.sh are used as they are (their
#   timestamps are put in order so that make never wants automake); autoreconf
#   runs only when they are missing or out of date and autoreconf exists.
# - CUDA: $CUDA_HOME, /usr/local/cuda or nvcc's folder; when none has the
#   layout configure wants (include/, lib64/ with unversioned libcudart.so
#   and libcublas.so), a folder of symbolic links (/tmp/flow-cuda) made from
#   nvcc's folder and PyTorch's CUDA wheels.
#
# Prepare on a networked Debian/Ubuntu machine with tests/gpu/fetch-deps.sh,
# then carry: configure Makefile.in config.h.in aclocal.m4 build-aux m4 .gpu-deps
#
# On the device tool, call it with a timeout_s of 600: over the budget
# below, so that the script's own limits end it and it prints its summary.
#
# Order: setup, configure, build (make all, then the check programs), the GPU
# test (the one thing only this machine can do, so it runs before make check),
# make check, benchmark.  Every phase is timed and has a timeout; the whole
# run stays within GPU_SUITE_BUDGET seconds.
#
# Environment:
#   BUILD_DIR          out-of-tree build directory (default /tmp/flow-build-gpu;
#                      emptied first)
#   OUT                logs go there (otherwise $BUILD_DIR/gpu-logs): setup.log,
#                      configure.log, build.log, gpu.log, check.log, bench.log,
#                      summary.txt (7 files)
#   GPU_SUITE_BUDGET   seconds for the whole run (default 470, under the 8
#                      minutes a GPU check may take; the build and the CPU
#                      suite need about 90 on 16 cores, train.sh up to 240);
#                      a phase gets what is left, and
#                      one that would get under 5 s is not run (a failure)
#   FLOW_GPU_DEPS      auto: use .gpu-deps for what the system lacks (default);
#                      all: use .gpu-deps for everything and hide the system's
#                      .pc files (to test this script on a machine that has
#                      them all); none: never use .gpu-deps
#   FLOW_DEPS_PREFIX   where the .debs are unpacked (default /tmp/flow-deps)
#   FLOW_GPU_WERROR    yes: keep -Werror (default no: a newer compiler's new
#                      warnings must not stop the GPU run; CI checks warnings)
#   REQUIRE_GPU        auto (default): test_cuda_kernels skipping (exit 77)
#                      counts as a failure only when this machine has a GPU
#                      (nvidia-smi lists one, or /dev/nvidia0 exists);
#                      yes: always a failure; no: never
#   CONFIGURE_ARGS     extra configure arguments
#   GPU_SUITE_SKIP     phases to leave out, for a rerun that must fit the
#                      device time a first run left (a full run does not
#                      fit twice): any of check (make check), gpt2
#                      (train.sh's GPT-2 124M row), bench; said in the
#                      summary, not counted
#
# Counting: the test cases of make check (scripts/count-tests.sh: cmocka cases
# and bats cases), plus one per kernel row of test_cuda_kernels, one per
# NCCL collective and one per row of tests/gpu/train.sh, plus one
# failure for each phase that broke without a test result (setup, configure,
# build, a crash or timeout).  The benchmark is informational and not counted.
# Ends with the line 'N passed, N failed'; exits 0 only when nothing failed.
set -eu
set -o pipefail

srcdir=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-/tmp/flow-build-gpu}
logs=${OUT:-$build/gpu-logs}
budget=${GPU_SUITE_BUDGET:-470}
deps_mode=${FLOW_GPU_DEPS:-auto}
P=${FLOW_DEPS_PREFIX:-/tmp/flow-deps}
L=$P/usr/lib/x86_64-linux-gnu
werror=${FLOW_GPU_WERROR:-no}
require_gpu=${REQUIRE_GPU:-auto}
start=$(date +%s)
passed=0
failed=0
jobs=$(nproc 2>/dev/null || echo 4)

case $deps_mode in auto | all | none) ;; *)
	echo "gpu-suite: FLOW_GPU_DEPS must be auto, all or none" >&2
	echo "0 passed, 1 failed"
	exit 1
	;;
esac

# The build directory is emptied first: only one we made, or an empty one.
if [ -e "$build" ] && [ ! -e "$build/.flow-gpu-build" ] &&
	[ -n "$(ls -A "$build" 2>/dev/null)" ]; then
	echo "gpu-suite: $build exists and was not made by this script; set BUILD_DIR" >&2
	echo "0 passed, 1 failed"
	exit 1
fi
# Keep the logs when OUT points inside the build directory.
case $logs in "$build"/*) find "$build" -mindepth 1 -maxdepth 1 ! -path "${logs%%/}" \
	-exec rm -rf {} + 2>/dev/null || true ;; *) rm -rf "$build" ;; esac
mkdir -p "$build" "$logs"
touch "$build/.flow-gpu-build"
# Exactly the seven log files, and nothing else, go under $logs.
: >"$logs/setup.log"
for f in configure.log build.log gpu.log check.log bench.log summary.txt; do
	rm -f "$logs/$f"
done

notes= # lines for the summary
say() { printf 'gpu-suite [%3ds]: %s\n' "$(($(date +%s) - start))" "$*" | tee -a "$logs/setup.log" >&2; }
note() {
	notes="$notes$*
"
	say "$*"
}

summary() {
	{
		echo "flow GPU suite, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(($(date +%s) - start)) s"
		printf '%s' "$notes"
		printf '%d passed, %d failed\n' "$passed" "$failed"
	} >"$logs/summary.txt"
	echo "---- summary ($logs/summary.txt)"
	cat "$logs/summary.txt"
}

# Killed from outside (the device tool's limit, a ^C): stop the phase
# running, still print what ran, and count the kill as a failure.
# The trap may run inside a redirected call (bg_wait's): it writes to
# the script's own stdout and stderr, kept as fds 8 and 9.
# Every command a phase waits for runs through bg_wait.
exec 8>&1 9>&2
# shellcheck source-path=SCRIPTDIR source=bg-wait.bash
. "$srcdir/tests/gpu/bg-wait.bash"
trap '[ -z "$child" ] || kill -TERM "$child" 2>/dev/null || true
{ note "FAILED: killed by a signal after $(($(date +%s) - start))s"; failed=$((failed + 1)); summary; } >&8 2>&9; exit 1' TERM INT

# Seconds left of the budget (0 or less when it is spent).
left() {
	echo $((budget - ($(date +%s) - start)))
}
# Is phase $1 named in GPU_SUITE_SKIP (words, or commas)?
skipping() {
	local words=${GPU_SUITE_SKIP:-}
	case " ${words//,/ } " in *" $1 "*) return 0 ;; esac
	return 1
}
# A phase's timeout: its own cap or what is left of the budget, the smaller.
cap() {
	local l
	l=$(left)
	[ "$1" -lt "$l" ] && l=$1
	echo "$l"
}

# A setup step failed: count it, print the summary, stop.
fail_setup() {
	note "FAILED: $1"
	failed=$((failed + 1))
	summary
	exit 1
}

# run_phase NAME CAP LOG COMMAND...: run COMMAND under a timeout, output
# appended to LOG; sets phase_rc and phase_s, and notes the phase.
run_phase() {
	local name=$1 t
	t=$(cap "$2")
	local log=$3 t0
	shift 3
	if [ "$t" -lt 5 ]; then
		note "$name: NOT RUN: the ${budget}s budget is spent"
		phase_rc=124 phase_s=0
		return 0
	fi
	t0=$(date +%s)
	say "$name: start (timeout ${t}s): $*"
	phase_rc=0
	bg_wait timeout -k 10 "$t" "$@" >>"$log" 2>&1 || phase_rc=$?
	phase_s=$(($(date +%s) - t0))
	case $phase_rc in
	0) note "$name: ok, ${phase_s}s" ;;
	124 | 137) note "$name: TIMED OUT after ${phase_s}s (limit ${t}s)" ;;
	*) note "$name: exit $phase_rc, ${phase_s}s" ;;
	esac
}

# ---- 0. the machine --------------------------------------------------------------
{
	echo "## machine"
	uname -a
	grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release 2>/dev/null || true
	echo "cores: $jobs"
	free -g 2>/dev/null | head -n 2 || true
	echo "srcdir: $srcdir; build: $build; logs: $logs; budget: ${budget}s"
	echo "FLOW_GPU_DEPS=$deps_mode FLOW_DEPS_PREFIX=$P FLOW_GPU_WERROR=$werror REQUIRE_GPU=$require_gpu"
	for t in gcc cc make nvcc pkg-config pkgconf autoreconf automake libtoolize bats \
		dpkg-deb ar tar python3 nvidia-smi; do
		printf '%-12s %s\n' "$t" "$(command -v "$t" || echo '-')"
	done
	gcc --version 2>/dev/null | head -n 1 || true
} >>"$logs/setup.log" 2>&1

# The GPU: is one there?  (nvidia-smi may live outside PATH.)
gpu_seen=no
nvsmi=$(command -v nvidia-smi 2>/dev/null || true)
if [ -z "$nvsmi" ] && [ -x /usr/local/nvidia/bin/nvidia-smi ]; then
	nvsmi=/usr/local/nvidia/bin/nvidia-smi
	# train.sh sizes the GPT-2 batch by nvidia-smi's memory figure.
	export PATH=$PATH:/usr/local/nvidia/bin
fi
# (No 'cmd | grep -q' under pipefail: grep's early exit can fail cmd.)
gpus=
[ -n "$nvsmi" ] && gpus=$(timeout 30 "$nvsmi" -L 2>&1 || true)
printf '%s\n' "$gpus" >>"$logs/setup.log"
if printf '%s\n' "$gpus" | grep '^GPU ' >/dev/null; then
	gpu_seen=yes
	note "GPU: $(timeout 30 "$nvsmi" --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
elif [ -e /dev/nvidia0 ]; then
	gpu_seen=yes
	note "GPU: /dev/nvidia0 exists (nvidia-smi did not list one)"
else
	note "GPU: none seen (no nvidia-smi listing, no /dev/nvidia0)"
fi
case $require_gpu in
yes) skip_fails=yes ;;
no) skip_fails=no ;;
*) skip_fails=$gpu_seen ;;
esac
# The driver library: NVIDIA's containers mount it under /usr/local/nvidia.
ldcache=$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)
if ! printf '%s\n' "$ldcache" | grep 'libcuda\.so\.1 ' >/dev/null &&
	[ -e /usr/local/nvidia/lib64/libcuda.so.1 ] &&
	case :${LD_LIBRARY_PATH:-}: in *:/usr/local/nvidia/lib64:*) false ;; *) true ;; esac; then
	export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/nvidia/lib64
	note "libcuda.so.1 is not in the loader cache: added /usr/local/nvidia/lib64 to LD_LIBRARY_PATH"
fi

# ---- 1. CUDA toolkit ---------------------------------------------------------------
# configure --with-cuda=DIR wants DIR/include (cuda_runtime.h, cublas_v2.h),
# DIR/lib64 (libcudart, libcublas) and nvcc in DIR/bin or on PATH.
cuda_dir=
cuda_ok() {
	[ -f "$1/include/cuda_runtime.h" ] && [ -f "$1/include/cublas_v2.h" ] &&
		[ -e "$1/lib64/libcudart.so" ] && [ -e "$1/lib64/libcublas.so" ]
}
nvcc_path=$(command -v nvcc 2>/dev/null || true)
for f in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
	[ -z "$nvcc_path" ] && [ -x "$f" ] && nvcc_path=$f
done
nvcc_root=${nvcc_path:+$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")}
for d in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-13* $nvcc_root; do
	if [ -d "$d" ] && cuda_ok "$d"; then
		cuda_dir=$d
		break
	fi
done
if [ -z "$cuda_dir" ] && [ -n "$nvcc_path" ]; then
	# An unusual layout (lib instead of lib64, no unversioned .so, cuBLAS
	# only in the CUDA wheels PyTorch brought): make a folder configure
	# understands out of symbolic links.
	shim=/tmp/flow-cuda
	rm -rf "$shim"
	mkdir -p "$shim/include" "$shim/lib64"
	search="$nvcc_root $nvcc_root/targets/x86_64-linux /usr/include /usr/lib/x86_64-linux-gnu"
	py_nvidia=$(timeout 30 python3 -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null || true)
	search="$search $py_nvidia"
	for h in cuda_runtime.h cublas_v2.h; do
		[ -e "$shim/include/$h" ] && continue
		# shellcheck disable=SC2086 # a list of folders
		f=$(find $search -maxdepth 4 -name "$h" 2>/dev/null | head -n 1 || true)
		[ -n "$f" ] || continue
		for g in "$(dirname "$f")"/*; do
			[ -e "$shim/include/${g##*/}" ] || ln -s "$g" "$shim/include/"
		done
	done
	# NVRTC too: cuDNN's fused attention compiles its kernels with it,
	# and the module opens it through this folder (its run path).
	for lib in cudart cublas cublasLt nvrtc nvrtc-builtins; do
		# shellcheck disable=SC2086
		so=$(find $search -maxdepth 5 -name "lib$lib.so*" 2>/dev/null | head -n 1 || true)
		[ -n "$so" ] || continue
		for g in "$(dirname "$so")/lib$lib".so*; do
			[ -e "$shim/lib64/${g##*/}" ] || ln -s "$g" "$shim/lib64/"
		done
		[ -e "$shim/lib64/lib$lib.so" ] || ln -s "$so" "$shim/lib64/lib$lib.so"
	done
	if cuda_ok "$shim"; then
		cuda_dir=$shim
		# nvcc compiles the .cu files with its own include path, which
		# may lack cublas_v2.h; configure looks for nvcc on PATH.
		export CPPFLAGS="${CPPFLAGS:+$CPPFLAGS }-isystem $shim/include"
		PATH=$(dirname "$nvcc_path"):$PATH
		export PATH
		note "CUDA: made $shim (nvcc in $nvcc_root; searched $search)"
		ls -l "$shim/include" "$shim/lib64" >>"$logs/setup.log" 2>&1 || true
	fi
fi
[ -n "$cuda_dir" ] ||
	fail_setup "no CUDA toolkit with cuda_runtime.h, cublas_v2.h, libcudart and libcublas (tried \$CUDA_HOME, /usr/local/cuda, nvcc's folder)"
[ -x "$cuda_dir/bin/nvcc" ] || [ -n "$nvcc_path" ] || fail_setup "nvcc not found in $cuda_dir/bin or on PATH"
note "CUDA: $cuda_dir, $("${cuda_dir}/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' ||
	nvcc --version | grep -o 'release [0-9.]*')"

# NCCL and cuDNN: configure looks in the CUDA folder; where that lacks
# them, the wheels PyTorch brought (nvidia/nccl, nvidia/cudnn) may have
# them, with only versioned libraries: a folder of links (include/, lib/
# with the unversioned .so that -lnccl wants) for --with-nccl=DIR or
# --with-cudnn=DIR.  Without either, configure builds without it (and the
# NCCL phase below counts that as a failure).
extra_cfg=()
for lib in nccl cudnn; do
	[ -f "$cuda_dir/include/$lib.h" ] && continue
	py_nvidia=${py_nvidia-$(timeout 30 python3 -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null || true)}
	hdr=
	for d in $py_nvidia; do
		[ -f "$d/$lib/include/$lib.h" ] && hdr=$d/$lib && break
	done
	if [ -z "$hdr" ]; then
		note "$lib: not in $cuda_dir, nor in PyTorch's nvidia wheels (${py_nvidia:-none found})"
		continue
	fi
	so=$(find "$hdr/lib" -maxdepth 1 -name "lib$lib.so*" 2>/dev/null | sort | head -n 1 || true)
	[ -n "$so" ] || { note "$lib: $hdr has $lib.h but no lib$lib.so*"; continue; }
	shim=/tmp/flow-$lib
	rm -rf "$shim"
	mkdir -p "$shim/lib"
	ln -s "$hdr/include" "$shim/include"
	for g in "$hdr"/lib/lib*.so*; do ln -s "$g" "$shim/lib/"; done
	[ -e "$shim/lib/lib$lib.so" ] || ln -s "$so" "$shim/lib/lib$lib.so"
	extra_cfg+=("--with-$lib=$shim")
	note "$lib: from $hdr (links in $shim)"
done

# ---- 2. build dependencies ---------------------------------------------------------
# Which components does the system lack?  (The component names match
# .gpu-deps/MANIFEST, written by tests/gpu/fetch-deps.sh.)
use=
if [ "$deps_mode" = all ]; then
	use='pkgconf zstd xxhash openblas cmocka jansson pmix bats'
elif [ "$deps_mode" = auto ]; then
	if command -v pkg-config >/dev/null 2>&1; then
		syspc="pkg-config"
	else
		use="$use pkgconf"
		syspc=false
	fi
	$syspc --exists 'libzstd >= 1.4' 2>/dev/null || use="$use zstd"
	$syspc --exists 'libxxhash >= 0.8' 2>/dev/null || use="$use xxhash"
	$syspc --exists openblas 2>/dev/null || use="$use openblas"
	$syspc --exists 'cmocka >= 1.1' 2>/dev/null || use="$use cmocka"
	$syspc --exists 'jansson >= 2.10' 2>/dev/null || use="$use jansson"
	$syspc --exists pmix 2>/dev/null || use="$use pmix"
	command -v bats >/dev/null 2>&1 || use="$use bats"
fi
use=${use# }
manifest=$srcdir/.gpu-deps/MANIFEST

extract_deb() { # FILE DIR
	if command -v dpkg-deb >/dev/null 2>&1; then
		dpkg-deb -x "$1" "$2"
	elif command -v ar >/dev/null 2>&1 && command -v tar >/dev/null 2>&1 &&
		command -v xz >/dev/null 2>&1; then
		local m
		m=$(ar t "$1" | grep '^data\.tar') || return 1
		case $m in
		*.xz) ar p "$1" "$m" | tar -xJf - -C "$2" ;;
		*.gz) ar p "$1" "$m" | tar -xzf - -C "$2" ;;
		*.zst) ar p "$1" "$m" | tar --zstd -xf - -C "$2" ;;
		*) ar p "$1" "$m" | tar -xf - -C "$2" ;;
		esac
	else
		python3 - "$1" "$2" <<'EOF'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
with open(deb, 'rb') as f:
    data = f.read()
assert data[:8] == b'!<arch>\n', 'not a .deb'
pos = 8
while pos + 60 <= len(data):
    name = data[pos:pos + 16].decode().strip().rstrip('/')
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    pos += 60 + size + (size & 1)
    if name.startswith('data.tar'):
        with tarfile.open(fileobj=io.BytesIO(body), mode='r:*') as t:
            if hasattr(tarfile, 'fully_trusted_filter'):
                t.extractall(dest, filter='fully_trusted')
            else:
                t.extractall(dest)
        break
else:
    sys.exit('no data.tar member in ' + deb)
EOF
	fi
}

deps_t0=$(date +%s)
if [ -z "$use" ]; then
	note "deps: the system has them all (FLOW_GPU_DEPS=$deps_mode)"
elif [ ! -f "$manifest" ]; then
	note "deps: the system lacks: $use, and there is no .gpu-deps/MANIFEST (run tests/gpu/fetch-deps.sh and carry .gpu-deps); trying without"
	use=
else
	say "deps: unpacking from .gpu-deps for: $use"
	if [ -e "$P" ] && [ ! -e "$P/.flow-deps" ] && [ -n "$(ls -A "$P" 2>/dev/null)" ]; then
		fail_setup "deps: $P exists and was not made by this script; set FLOW_DEPS_PREFIX"
	fi
	rm -rf "$P"
	mkdir -p "$P"
	touch "$P/.flow-deps"
	while read -r comp _pkg file sum; do
		case $comp in '#'* | '') continue ;; esac
		case " $use " in *" $comp "*) ;; *) continue ;; esac
		[ -f "$srcdir/.gpu-deps/$file" ] ||
			fail_setup "deps: .gpu-deps/$file is missing (rerun tests/gpu/fetch-deps.sh)"
		[ "$(sha256sum "$srcdir/.gpu-deps/$file" | cut -d' ' -f1)" = "$sum" ] ||
			fail_setup "deps: .gpu-deps/$file does not match its MANIFEST sum"
		extract_deb "$srcdir/.gpu-deps/$file" "$P" >>"$logs/setup.log" 2>&1 ||
			fail_setup "deps: could not unpack $file (see setup.log)"
		echo "unpacked $comp $file" >>"$logs/setup.log"
	done <"$manifest"
	# The .pc files name /usr: point them at the prefix.
	find "$P" -name '*.pc' -type f -exec sed -i \
		-e "s#^\([A-Za-z_]*=\)/usr#\1$P/usr#" \
		-e "s#-\([IL]\)/usr/#-\1$P/usr/#g" {} +
	# Debian's OpenBLAS lives in openblas-pthread/ and reaches the usual
	# names through update-alternatives, which dpkg -x does not run.
	if [ -d "$L/openblas-pthread" ]; then
		for f in libopenblas.so.0 libopenblas.so libblas.so.3 libblas.so liblapack.so.3 liblapack.so; do
			[ -e "$L/openblas-pthread/$f" ] && ln -sfn "openblas-pthread/$f" "$L/$f"
		done
		mkdir -p "$L/pkgconfig" "$P/usr/include/x86_64-linux-gnu"
		[ -e "$L/openblas-pthread/pkgconfig/openblas.pc" ] &&
			ln -sfn ../openblas-pthread/pkgconfig/openblas.pc "$L/pkgconfig/openblas.pc"
		for f in cblas.h f77blas.h openblas_config.h; do
			[ -e "$P/usr/include/x86_64-linux-gnu/openblas-pthread/$f" ] &&
				ln -sfn "openblas-pthread/$f" "$P/usr/include/x86_64-linux-gnu/$f"
		done
	fi
	mkdir -p "$P/bin"
	if [ -x "$P/usr/bin/pkgconf" ]; then
		# pkgconf needs its libpkgconf; keep that off everyone else's path.
		cat >"$P/bin/pkg-config" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$L\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $P/usr/bin/pkgconf "\$@"
EOF
		chmod +x "$P/bin/pkg-config"
		export PKG_CONFIG=$P/bin/pkg-config
	fi
	[ -x "$P/usr/bin/bats" ] && ln -sfn ../usr/bin/bats "$P/bin/bats"
	export PATH=$P/bin:$PATH
	# PMIx finds its plugins and help files under its install prefix.
	[ -d "$L/pmix2" ] && export PMIX_INSTALL_PREFIX=$L/pmix2
	pcdirs=$L/pkgconfig:$L/openblas-pthread/pkgconfig:$P/usr/share/pkgconfig
	if [ "$deps_mode" = all ]; then
		# Only the prefix's .pc files: proves the build needs nothing else.
		export PKG_CONFIG_LIBDIR=$pcdirs
		unset PKG_CONFIG_PATH
	else
		export PKG_CONFIG_PATH=$pcdirs${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
	fi
	# -isystem, as for /usr/include: no warnings from these headers (gcc
	# searches a directory given by both -I and -isystem as a system one).
	inc="-isystem $P/usr/include"
	[ -d "$P/usr/include/x86_64-linux-gnu/openblas-pthread" ] &&
		inc="$inc -isystem $P/usr/include/x86_64-linux-gnu/openblas-pthread"
	export CPPFLAGS="$inc${CPPFLAGS:+ $CPPFLAGS}"
	export LDFLAGS="-L$L -L$L/openblas-pthread -Wl,-rpath,$L -Wl,-rpath,$L/openblas-pthread -Wl,-rpath-link,$L -Wl,-rpath-link,$L/openblas-pthread${LDFLAGS:+ $LDFLAGS}"
	# For running what was built (libopenblas's own libgfortran is found
	# through this, not through our programs' rpath); not for the compilers.
	test_ldpath=$L:$L/openblas-pthread
	note "deps: from .gpu-deps ($P): $use, in $(($(date +%s) - deps_t0))s"
fi
pc=${PKG_CONFIG:-pkg-config}
{
	echo "## dependencies"
	echo "PATH=$PATH"
	echo "PKG_CONFIG=${PKG_CONFIG:-} PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-} PKG_CONFIG_LIBDIR=${PKG_CONFIG_LIBDIR:-}"
	echo "CPPFLAGS=${CPPFLAGS:-}"
	echo "LDFLAGS=${LDFLAGS:-}"
	echo "test LD_LIBRARY_PATH=${test_ldpath:-}${test_ldpath:+:}${LD_LIBRARY_PATH:-}"
	for m in libzstd libxxhash openblas cmocka jansson pmix; do
		printf '%-10s %s %s\n' "$m" "$($pc --modversion $m 2>&1 | head -n 1)" \
			"$($pc --libs $m 2>/dev/null)"
	done
	echo "bats: $(command -v bats || echo missing) $(bats --version 2>/dev/null || true)"
} >>"$logs/setup.log" 2>&1
command -v "$pc" >/dev/null 2>&1 || note "WARNING: no pkg-config: configure will fail (carry .gpu-deps)"
command -v bats >/dev/null 2>&1 || note "WARNING: no bats: make check skips the CLI tests"
[ -x /usr/bin/python3 ] || note "WARNING: no /usr/bin/python3: two bats tests use it"

# ---- 3. autotools output ------------------------------------------------------------
# The inputs of configure and Makefile.in, oldest first in make's eyes.
at_inputs="configure.ac Makefile.am build-aux/cuda.am $(cd "$srcdir" && echo m4/*.m4)"
have_autotools=no
command -v autoreconf >/dev/null 2>&1 && command -v automake >/dev/null 2>&1 &&
	command -v libtoolize >/dev/null 2>&1 && have_autotools=yes
fresh=unknown
if [ -f "$srcdir/configure" ] && [ -f "$srcdir/build-aux/gpu-inputs.sha256" ]; then
	if (cd "$srcdir" && sha256sum --quiet -c build-aux/gpu-inputs.sha256) >>"$logs/setup.log" 2>&1; then
		fresh=yes
	else
		fresh=no
	fi
fi
if [ ! -f "$srcdir/configure" ] || [ "$fresh" = no ] ||
	{ [ "$fresh" = unknown ] && [ "$have_autotools" = yes ]; }; then
	if [ "$have_autotools" = yes ]; then
		run_phase autoreconf 120 "$logs/configure.log" sh -c "cd '$srcdir' && autoreconf -fi"
		[ "$phase_rc" -eq 0 ] || fail_setup "autoreconf -fi failed (see configure.log)"
		fresh=yes
	elif [ ! -f "$srcdir/configure" ]; then
		fail_setup "no configure in $srcdir and no autotools here: on a machine with them run tests/gpu/fetch-deps.sh and carry configure Makefile.in config.h.in aclocal.m4 build-aux m4"
	else
		note "WARNING: configure.ac/Makefile.am/m4 differ from those configure and Makefile.in were made from (build-aux/gpu-inputs.sha256; rerun tests/gpu/fetch-deps.sh before the device run); building with them anyway"
	fi
fi
for f in Makefile.in config.h.in aclocal.m4 build-aux/ltmain.sh build-aux/install-sh \
	build-aux/missing build-aux/test-driver build-aux/config.guess build-aux/config.sub \
	build-aux/compile build-aux/depcomp build-aux/ar-lib m4/libtool.m4; do
	[ -e "$srcdir/$f" ] ||
		fail_setup "$f is missing (carry configure Makefile.in config.h.in aclocal.m4 build-aux m4 from tests/gpu/fetch-deps.sh)"
done
# A copy may also lose the executable bits.
for f in "$srcdir/configure" "$srcdir"/build-aux/*; do
	if [ -f "$f" ] && [ ! -x "$f" ]; then chmod +x "$f"; fi
done
# Copying the tree scrambles timestamps; without automake here, make must
# never think Makefile.in or configure is older than its inputs.  Inputs get
# at most now-2, aclocal.m4 now-1, the generated files now (never the future:
# configure's sanity check rejects that).
if [ "$have_autotools" = no ] || [ "$fresh" = yes ]; then
	now=$(date +%s)
	(cd "$srcdir" && for f in $at_inputs; do
		[ "$(stat -c %Y "$f")" -lt $((now - 2)) ] || touch -d "@$((now - 2))" "$f"
	done &&
		touch -d "@$((now - 1))" aclocal.m4 &&
		touch -d "@$now" configure config.h.in Makefile.in)
fi

# ---- 4. configure (out of tree) --------------------------------------------------------
cfg_args=(--with-cuda="$cuda_dir" "${extra_cfg[@]}")
[ "$werror" = yes ] || cfg_args+=(--disable-werror)
# Precious variables on the command line, so config.status remembers them.
for v in PKG_CONFIG PKG_CONFIG_PATH PKG_CONFIG_LIBDIR CPPFLAGS LDFLAGS; do
	[ -n "${!v:-}" ] && cfg_args+=("$v=${!v}")
done
# shellcheck disable=SC2206 # CONFIGURE_ARGS is split on purpose
[ -n "${CONFIGURE_ARGS:-}" ] && cfg_args+=(${CONFIGURE_ARGS})
# shellcheck disable=SC2016 # expanded by that sh
run_phase configure 120 "$logs/configure.log" sh -c 'cd "$1" && shift && exec "$@"' sh \
	"$build" "$srcdir/configure" "${cfg_args[@]}"
{
	echo
	echo "######## config.log"
	cat "$build/config.log" 2>/dev/null || true
} >>"$logs/configure.log"
[ "$phase_rc" -eq 0 ] ||
	fail_setup "configure failed: $(grep -E 'error:' "$logs/configure.log" | tail -n 1) (see configure.log)"
grep -q 'HAVE_CUDA 1' "$build/config.h" || fail_setup "configure did not enable CUDA (see configure.log)"
sed -n '/^flow .* configuration$/,$p' "$logs/configure.log" | sed -n '1,15p' >>"$logs/setup.log"

# ---- 5. build -----------------------------------------------------------------------------
# The first real error of a failed build, for the summary.
first_error() {
	case $phase_rc in
	124 | 137) echo "timed out" ;;
	*) grep -v -E '^ *(CC|CCLD|GEN) ' "$logs/build.log" |
		grep -m1 -E '(error|undefined reference|No rule to make|missing on your system)' ||
		tail -n 1 "$logs/build.log" ;;
	esac
}
run_phase build 300 "$logs/build.log" make -C "$build" -j"$jobs"
[ "$phase_rc" -eq 0 ] || fail_setup "build failed: $(first_error) (see build.log)"
# The check programs too (TESTS= builds them and runs nothing), so that the
# test phases below only run tests.
run_phase build-tests 200 "$logs/build.log" make -C "$build" -j"$jobs" check TESTS=
[ "$phase_rc" -eq 0 ] || fail_setup "building the test programs failed: $(first_error) (see build.log)"
n_warn=$(grep -c 'warning:' "$logs/build.log" || true)
[ "$n_warn" -eq 0 ] || note "build: $n_warn compiler warnings (see build.log)"
rm -f "$build/test-suite.log"
find "$build" -name '*.trs' -delete

export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
if [ -n "${test_ldpath:-}" ]; then
	export LD_LIBRARY_PATH=$test_ldpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# Where each library comes from, for the record (and a check of the prefix).
libflow=$(find "$build/lib/.libs" -name "libflow.so.*" -type f 2>/dev/null | head -n 1 || true)
lddout=$(ldd "$libflow" 2>&1 || true)
{
	echo
	echo "######## ldd $libflow (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
	printf '%s\n' "$lddout"
} >>"$logs/build.log"
case $lddout in *'not found'*)
	note "WARNING: ldd libflow: $(printf '%s\n' "$lddout" | grep 'not found' | tr -s ' \t\n' ' ')"
	;;
esac
if [ -n "$use" ]; then
	note "libs: $(printf '%s\n' "$lddout" | grep -E 'libzstd|libxxhash|libopenblas|libgfortran|libcudart|libcublas\.' |
		awk '{print $1 "=" $3}' | tr '\n' ' ')"
fi

# ---- 6. GPU kernels -----------------------------------------------------------------------
gpu_out=$build/gpu.stdout gpu_err=$build/gpu.stderr
t=$(cap 150)
[ "$t" -ge 5 ] || t=5 # the one test only this machine can run gets a chance
say "gpu-test: start (timeout ${t}s): $build/tests/gpu/test_cuda_kernels"
t0=$(date +%s)
gpu_rc=0
bg_wait timeout -k 10 "$t" "$build/tests/gpu/test_cuda_kernels" >"$gpu_out" 2>"$gpu_err" ||
	gpu_rc=$?
gpu_s=$(($(date +%s) - t0))
note "gpu-test: exit $gpu_rc, ${gpu_s}s"
{
	echo "######## tests/gpu/test_cuda_kernels: exit $gpu_rc, ${gpu_s}s; stdout:"
	cat "$gpu_out"
	echo
	echo "######## stderr:"
	cat "$gpu_err"
	echo
	echo "######## ldd (LD_LIBRARY_PATH=$build/lib/.libs:${LD_LIBRARY_PATH:-}, as libtool's wrapper runs it)"
	LD_LIBRARY_PATH=$build/lib/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
		ldd "$build/tests/gpu/.libs/test_cuda_kernels" 2>&1 || true
} >"$logs/gpu.log"
g_pass=$(awk -F '\t' '$2 == "yes" {n++} END {print n + 0}' "$gpu_out" || echo 0)
g_fail=$(awk -F '\t' '$2 == "no" {n++} END {print n + 0}' "$gpu_out" || echo 0)
passed=$((passed + g_pass))
failed=$((failed + g_fail))
case $gpu_rc in
0) ;;
77)
	if [ "$skip_fails" = yes ]; then
		note "FAILED: test_cuda_kernels skipped, but a GPU is expected (GPU seen: $gpu_seen, REQUIRE_GPU=$require_gpu): $(grep -m1 skipped "$gpu_err" || true)"
		failed=$((failed + 1))
	else
		note "test_cuda_kernels skipped (no GPU here; not counted): $(grep -m1 skipped "$gpu_err" || true)"
	fi
	;;
124 | 137)
	note "FAILED: test_cuda_kernels ran out of time"
	failed=$((failed + 1))
	;;
*)
	note "FAILED: test_cuda_kernels exit $gpu_rc: $(tail -n 2 "$gpu_err" | tr '\n' ' ')"
	[ "$g_fail" -eq 0 ] && failed=$((failed + 1))
	;;
esac
note "GPU kernels: $g_pass passed, $g_fail failed"
if [ -s "$gpu_out" ]; then
	notes="$notes$(grep -E '^# (device|matmul|attention|cuDNN|cuBLASLt|PASS|FAIL)|	(yes|no)	' "$gpu_out" | sed 's/^/  /' || true)
"
fi

# run_rows LABEL OUT SECONDS COMMAND...: run a program that prints one
# 'NAME<TAB>yes|no<TAB>...' row per test into OUT (and gpu.log); count its
# rows, and one failure more when it failed without a failed row.  Sets
# rows_pass and rows_fail.
run_rows() {
	local label=$1 out=$2 secs=$3 rc=0
	shift 3
	bg_wait timeout -k 10 "$secs" "$@" >"$out" 2>>"$logs/gpu.log" || rc=$?
	{
		echo "######## $label: exit $rc"
		cat "$out"
	} >>"$logs/gpu.log"
	rows_pass=$(awk -F '\t' '$2 == "yes" {n++} END {print n + 0}' "$out")
	rows_fail=$(awk -F '\t' '$2 == "no" {n++} END {print n + 0}' "$out")
	passed=$((passed + rows_pass))
	failed=$((failed + rows_fail))
	if [ "$rc" -ne 0 ] && [ "$rows_fail" -eq 0 ]; then
		note "FAILED: $label exit $rc without a failed row (see gpu.log)"
		failed=$((failed + 1))
	fi
}

# ---- 6a. the executor on the GPU ---------------------------------------------------------
# tests/gpu/test_cuda_exec: a GPT graph on the CUDA set against the CPU set
# (init, loss, every gradient, one AdamW step); one test per row.
if [ "$skip_fails" = yes ] || [ "$gpu_rc" -eq 0 ]; then
	exec_out=$build/exec.stdout
	t=$(cap 90)
	[ "$t" -ge 5 ] || t=5 # timeout 0 would mean no limit at all
	run_rows test_cuda_exec "$exec_out" "$t" "$build/tests/gpu/test_cuda_exec"
	note "GPU executor: $rows_pass passed, $rows_fail failed ($(grep -E '^# (loss|grad norm|device memory)' "$exec_out" | tr '\n' ' '))"
fi

# ---- 6b. NCCL collectives ------------------------------------------------------------------
# Every collective through the NCCL backend on device buffers, checked bit
# for bit by flow-bench comm (one rank per GPU, flow's own launcher); one
# test per collective.  A GPU machine without NCCL in the build is a failure.
if [ "$skip_fails" = yes ] || [ "$gpu_rc" -eq 0 ]; then
	if grep -q 'HAVE_NCCL 1' "$build/config.h"; then
		ngpu=$(${nvsmi:-nvidia-smi} -L 2>/dev/null | grep -c "^GPU" || true)
		[ "${ngpu:-0}" -ge 1 ] || ngpu=1
		for coll in all_reduce reduce_scatter all_gather all_to_all broadcast; do
			t=$(cap 60)
			if [ "$t" -lt 5 ]; then
				note "nccl $coll: NOT RUN: the budget is spent"
				failed=$((failed + 1))
				continue
			fi
			rc=0
			# One GPU: a world of one rank, which needs no launcher
			# (--nproc needs PMIx).
			ranks=()
			[ "$ngpu" -gt 1 ] && ranks=(--nproc "$ngpu")
			bg_wait timeout -k 5 "$t" "$build/bin/flow-bench" comm "$coll" --backend nccl \
				-b 8 -e 64M -f 8 --iters 5 --warmup 2 --comm-timeout 30 "${ranks[@]}" \
				>>"$logs/gpu.log" 2>&1 || rc=$?
			if [ "$rc" -eq 0 ]; then
				passed=$((passed + 1))
				note "nccl $coll on $ngpu GPU(s): PASS ($(grep -E '^# avg busbw' "$logs/gpu.log" | tail -n 1))"
			else
				failed=$((failed + 1))
				note "FAILED: nccl $coll on $ngpu GPU(s): exit $rc (see gpu.log)"
			fi
		done
	else
		note "FAILED: this build has no NCCL (see configure.log)"
		failed=$((failed + 1))
	fi
fi

# ---- 6c. training on the GPU ---------------------------------------------------------------
# tests/gpu/train.sh: flow-train --device cuda against the CPU (fp32, bf16,
# data and tensor parallel on this one GPU with --comm cpu, resume bit for
# bit, a GPU checkpoint resumed on the CPU) and GPT-2 124M's throughput;
# one test per row.
if [ "$skip_fails" = yes ] || [ "$gpu_rc" -eq 0 ]; then
	t=$(cap 240)
	if [ "$t" -lt 30 ]; then
		note "FAILED: training on the GPU: NOT RUN: the budget is spent"
		failed=$((failed + 1))
	else
		train_out=$build/train.stdout
		run_rows tests/gpu/train.sh "$train_out" "$t" \
			bash "$srcdir/tests/gpu/train.sh" "$build" "$build/gpu-train"
		note "GPU training: $rows_pass passed, $rows_fail failed"
		notes="$notes$(sed 's/^/  /' "$train_out")
"
		# What the programs said, for a failure's cause without a rerun.
		for f in "$build"/gpu-train/*.err "$build"/gpu-train/gpt2.out; do
			[ -s "$f" ] || continue
			echo "######## ${f#"$build"/} (last 20 lines)"
			tail -n 20 "$f"
		done >>"$logs/gpu.log" 2>&1
	fi
fi

# ---- 7. CPU unit tests -----------------------------------------------------------------------
if skipping check; then
	note "make check: skipped (GPU_SUITE_SKIP)"
else
run_phase check 240 "$logs/check.log" make -C "$build" -j"$jobs" check
check_rc=$phase_rc
{
	echo
	echo "######## test-suite.log"
	cat "$build/test-suite.log" 2>/dev/null || echo "(none)"
} >>"$logs/check.log"
if [ -x "$srcdir/scripts/count-tests.sh" ] || [ -f "$srcdir/scripts/count-tests.sh" ]; then
	count=$(bash "$srcdir/scripts/count-tests.sh" "$build" | tail -n 1 || true)
else
	# automake's summary counts programs, not cases: the best there is.
	count="$(sed -n 's/^# PASS: *\([0-9]*\).*/\1/p' "$logs/check.log" | tail -n 1) passed, $(sed -n 's/^# \(FAIL\|ERROR\|XPASS\): *\([0-9]*\).*/\2/p' "$logs/check.log" | awk '{s += $1} END {print s + 0}') failed" || true
fi
c_pass=$(echo "$count" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p')
c_fail=$(echo "$count" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p')
echo "count-tests: $count" >>"$logs/check.log"
passed=$((passed + ${c_pass:-0}))
failed=$((failed + ${c_fail:-0}))
note "make check: ${c_pass:-0} passed, ${c_fail:-0} failed (test cases; $(grep -E '^# (TOTAL|PASS|SKIP|FAIL|ERROR):' "$logs/check.log" | tail -n 5 | tr -s ' \n' ' '))"
if [ "$check_rc" -ne 0 ] && [ "${c_fail:-0}" -eq 0 ]; then
	note "FAILED: make check exit $check_rc without a failed test case (see check.log)"
	failed=$((failed + 1))
fi
for l in $(grep -E '^(FAIL|ERROR|XPASS):' "$logs/check.log" | head -n 20 | tr ' ' '_' || true); do
	note "  ${l//_/ }"
done
fi

# ---- 8. benchmark (informational) ------------------------------------------------------------
: >"$logs/bench.log"
bench=$build/bin/flow-bench
if skipping bench; then
	note "bench: skipped (GPU_SUITE_SKIP)"
elif [ "$(left)" -gt 30 ] && [ -x "$bench" ]; then
	# flow's matmul against the BLAS's own sgemm (and the sgemm ceiling) at
	# two GPT-2 layer shapes; each result is also checked.
	run_phase bench-matmul 60 "$logs/bench.log" "$bench" kernel matmul \
		--shape 2048,768,768 --shape 2048,768,3072 --iters 3 --warmup 1
	notes="$notes$(grep -E '^# (blas|cpu|peak)|^(peak|matmul)	' "$logs/bench.log" | head -n 12 | sed 's/^/  /' || true)
"
else
	note "bench: skipped ($(left)s left)"
fi

say "done in $(($(date +%s) - start))s; logs in $logs"
summary
[ "$failed" -eq 0 ]
