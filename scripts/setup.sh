#!/usr/bin/env bash
# setup.sh: install what flow needs on Debian/Ubuntu (only what is missing),
# bootstrap autotools, configure and build into build/ (or $FLOW_BUILD_DIR).
# Idempotent: a second run only rebuilds what changed.
#   scripts/setup.sh [configure options...]
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLOW_BUILD_DIR:-$top/build}

packages=(
	build-essential autoconf automake libtool pkg-config
	libzstd-dev libxxhash-dev libopenblas-dev
	# Jansson: the JSON headers of safetensors files (flow/safetensors.h).
	libjansson-dev
	libcmocka-dev bats python3 python3-torch python3-venv zstd clang valgrind
	# PMIx for the launchers; Slurm, munge and OpenMPI for the multi-rank
	# tests (tests/cluster) and the OpenMPI comparison (bench/).
	libpmix-dev slurmctld slurmd slurm-client munge openmpi-bin libopenmpi-dev
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' ||
		missing+=("$p")
done
if ((${#missing[@]})); then
	echo "setup: installing ${missing[*]}" >&2
	sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# nvcc lives outside PATH in a standard CUDA install; configure finds it there.
if [ ! -x "$top/configure" ] || [ "$top/configure.ac" -nt "$top/configure" ] ||
	[ "$top/Makefile.am" -nt "$top/Makefile.in" ]; then
	(cd "$top" && autoreconf -fi >/dev/null 2>&1) || (cd "$top" && autoreconf -fi)
fi

mkdir -p "$build"
cd "$build"
want="$*"
if [ ! -f config.status ] || [ "$(cat .flow-configure-args 2>/dev/null)" != "$want" ]; then
	"$top/configure" -q "$@"
	printf '%s' "$want" > .flow-configure-args
fi
echo "setup: building in $build" >&2
if ! make -j"$(nproc)" > build.log 2>&1; then
	tail -n 40 build.log >&2
	echo "setup: the build failed; the whole log is $build/build.log" >&2
	exit 1
fi
