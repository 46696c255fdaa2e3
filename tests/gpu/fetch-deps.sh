#!/bin/bash
# tests/gpu/fetch-deps.sh: prepare, on a networked Debian/Ubuntu machine,
# what tests/gpu/run.sh needs on an offline GPU machine that lacks the
# autotools and some build dependencies.
#
#   tests/gpu/fetch-deps.sh            download the .debs, run autoreconf -fi
#   tests/gpu/fetch-deps.sh --check    only check that both are present and
#                                      up to date (no network, no autoreconf)
#   tests/gpu/fetch-deps.sh --autotools-only
#
# 1. Downloads with 'apt-get download' (no root needed when the package lists
#    are current) the runtime and -dev packages of zstd, xxHash, OpenBLAS
#    (pthread variant, with libgfortran5 and libquadmath0), cmocka, Jansson,
#    PMIx (with libevent, hwloc and munge: flow-train --nproc is a PMIx
#    server), bats and pkgconf into .gpu-deps/ (ignored by git), and writes
#    .gpu-deps/MANIFEST
#    (component, package, file, sha256) for run.sh.  A .deb already there is
#    kept; others are removed.
# 2. Runs autoreconf -fi in the source tree, so that configure, Makefile.in,
#    config.h.in, aclocal.m4, build-aux/ and m4/ exist, and records the
#    checksums of their inputs in build-aux/gpu-inputs.sha256: run.sh warns
#    when the carried configure is older than configure.ac or Makefile.am.
# 3. Prints the paths to name in the device tool's 'carry' and their size.
#
# Run it again (it is quick) right before every device run: Makefile.am and
# configure.ac change often, and a stale Makefile.in builds the wrong thing.
set -eu
set -o pipefail

srcdir=$(cd "$(dirname "$0")/../.." && pwd)
deps=$srcdir/.gpu-deps
mode=all
case ${1:-} in
'') ;;
--check) mode=check ;;
--autotools-only) mode=autotools ;;
-h | --help)
	sed -n '2,/^set -eu$/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
*)
	echo "fetch-deps.sh: unknown option '$1' (--check, --autotools-only, --help)" >&2
	exit 2
	;;
esac

say() { printf 'fetch-deps: %s\n' "$*" >&2; }
die() {
	say "error: $*"
	exit 1
}

# component:package.  The component is what run.sh checks for on the GPU
# machine; it unpacks a component's packages only when that one is missing.
# libopenblas-dev, libopenblas0 and pkg-config are empty metapackages in
# Debian and are not needed; gcc-12-base and libgcc-s1 are always there.
packages='
pkgconf:libpkgconf3
pkgconf:pkgconf-bin
pkgconf:pkgconf
zstd:libzstd1
zstd:libzstd-dev
xxhash:libxxhash0
xxhash:libxxhash-dev
openblas:libopenblas0-pthread
openblas:libopenblas-pthread-dev
openblas:libgfortran5
openblas:libquadmath0
cmocka:libcmocka0
cmocka:libcmocka-dev
jansson:libjansson4
jansson:libjansson-dev
pmix:libpmix2
pmix:libpmix-dev
pmix:libevent-core-2.1-7
pmix:libevent-pthreads-2.1-7
pmix:libhwloc15
pmix:libmunge2
bats:bats
'

# The inputs of the generated autotools files (run.sh checks these sums).
autotools_inputs() {
	(cd "$srcdir" && printf '%s\n' configure.ac Makefile.am build-aux/cuda.am m4/flow_*.m4)
}
generated='configure Makefile.in config.h.in aclocal.m4 build-aux/ltmain.sh
build-aux/config.guess build-aux/config.sub build-aux/install-sh
build-aux/missing build-aux/compile build-aux/depcomp build-aux/test-driver
build-aux/ar-lib m4/libtool.m4 m4/ltoptions.m4 m4/ltsugar.m4 m4/ltversion.m4
m4/lt~obsolete.m4'
carry='configure Makefile.in config.h.in aclocal.m4 build-aux m4 .gpu-deps'

# ---- 1. the .debs ------------------------------------------------------------------
fetch_debs() {
	command -v apt-get >/dev/null 2>&1 || die "apt-get not found: run this on Debian or Ubuntu"
	local apt_opts=() arch
	arch=$(dpkg --print-architecture 2>/dev/null || echo unknown)
	if [ "$arch" != amd64 ]; then
		# The GPU machine is x86-64: use amd64 package lists of our own.
		say "this machine is $arch: using amd64 package lists in /tmp/flow-apt-amd64"
		mkdir -p /tmp/flow-apt-amd64/partial
		apt_opts=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64
			-oDir::State::Lists=/tmp/flow-apt-amd64)
		apt-get "${apt_opts[@]}" update -qq || die "apt-get update (amd64) failed"
	fi
	[ "$(id -u)" = 0 ] && apt_opts+=(-oAPT::Sandbox::User=root)
	mkdir -p "$deps"

	local names uris
	# shellcheck disable=SC2086 # one word per entry
	names=$(printf '%s\n' $packages | cut -d: -f2 | tr '\n' ' ')
	# shellcheck disable=SC2086 # one word per package
	if ! uris=$(apt-get "${apt_opts[@]}" download --print-uris $names 2>&1); then
		say "apt-get download --print-uris failed; updating the package lists"
		if [ "$(id -u)" = 0 ]; then
			apt-get "${apt_opts[@]}" update -qq || die "apt-get update failed"
		else
			die "$uris (run 'apt-get update' as root, then this again)"
		fi
		# shellcheck disable=SC2086
		uris=$(apt-get "${apt_opts[@]}" download --print-uris $names) ||
			die "apt-get download --print-uris $names failed"
	fi
	# Lines: 'URI' FILE SIZE SHA256:HEX
	local keep=' ' line file size want=
	while read -r line; do
		file=$(echo "$line" | awk '{print $2}')
		size=$(echo "$line" | awk '{print $3}')
		[ -n "$file" ] || continue
		keep="$keep$file "
		if [ -f "$deps/$file" ] && [ "$(stat -c %s "$deps/$file")" = "$size" ]; then
			continue
		fi
		want="$want ${file%%_*}"
	done < <(printf '%s\n' "$uris" | grep "^'")
	if [ -n "$want" ]; then
		say "downloading$want"
		# shellcheck disable=SC2086
		(cd "$deps" && apt-get "${apt_opts[@]}" download $want) >&2 ||
			die "apt-get download failed"
	else
		say "all .debs already in .gpu-deps/"
	fi
	local f
	for f in "$deps"/*.deb; do
		case $keep in *" ${f##*/} "*) ;; *)
			say "removing stale ${f##*/}"
			rm -f "$f"
			;;
		esac
	done

	# MANIFEST: component package file sha256, for run.sh.
	local entry comp pkg tmp=$deps/MANIFEST.tmp
	{
		echo "# written by tests/gpu/fetch-deps.sh on $(date -u +%Y-%m-%dT%H:%MZ); read by tests/gpu/run.sh"
		for entry in $packages; do
			comp=${entry%%:*} pkg=${entry#*:}
			f=$(cd "$deps" && find . -maxdepth 1 -name "${pkg}_*.deb" | sed 's|^\./||' | head -n 1) || true
			[ -n "$f" ] || die "no .deb for $pkg in .gpu-deps/"
			printf '%s %s %s %s\n' "$comp" "$pkg" "$f" \
				"$(sha256sum "$deps/$f" | cut -d' ' -f1)"
		done
	} >"$tmp"
	mv "$tmp" "$deps/MANIFEST"
}

# ---- 2. autotools --------------------------------------------------------------------
run_autoreconf() {
	command -v autoreconf >/dev/null 2>&1 ||
		die "autoreconf not found: install autoconf, automake, libtool, pkg-config"
	say "autoreconf -fi in $srcdir"
	(cd "$srcdir" && autoreconf -fi) >/tmp/flow-fetch-deps-autoreconf.log 2>&1 || {
		cat /tmp/flow-fetch-deps-autoreconf.log >&2
		die "autoreconf -fi failed"
	}
	# shellcheck disable=SC2046 # file names without spaces
	(cd "$srcdir" && sha256sum $(autotools_inputs)) >"$srcdir/build-aux/gpu-inputs.sha256"
}

# ---- 3. checks -------------------------------------------------------------------------
check_all() {
	local bad=0 f
	for f in $generated; do
		[ -e "$srcdir/$f" ] || {
			say "missing $f (run tests/gpu/fetch-deps.sh)"
			bad=1
		}
	done
	if [ ! -f "$srcdir/build-aux/gpu-inputs.sha256" ]; then
		say "missing build-aux/gpu-inputs.sha256 (run tests/gpu/fetch-deps.sh)"
		bad=1
	elif ! (cd "$srcdir" && sha256sum --quiet -c build-aux/gpu-inputs.sha256) >&2; then
		say "configure/Makefile.in are older than the files above: run tests/gpu/fetch-deps.sh"
		bad=1
	fi
	if [ ! -f "$deps/MANIFEST" ]; then
		say "missing .gpu-deps/MANIFEST (run tests/gpu/fetch-deps.sh)"
		bad=1
	else
		local comp pkg file sum
		while read -r comp pkg file sum; do
			case $comp in '#'* | '') continue ;; esac
			if [ ! -f "$deps/$file" ] ||
				[ "$(sha256sum "$deps/$file" | cut -d' ' -f1)" != "$sum" ]; then
				say "bad or missing .gpu-deps/$file"
				bad=1
			fi
		done <"$deps/MANIFEST"
	fi

	# What travels: tracked and untracked-not-ignored files, plus the carry.
	local tree_bytes carry_bytes total
	tree_bytes=$(cd "$srcdir" && git ls-files -z -co --exclude-standard |
		xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
	# shellcheck disable=SC2086
	carry_bytes=$(cd "$srcdir" && du -cbs $carry | tail -n 1 | cut -f1)
	total=$((tree_bytes + carry_bytes))
	say "size: working tree $((tree_bytes / 1024)) KiB + carry $((carry_bytes / 1024)) KiB = $((total / 1024)) KiB (limit 65536 KiB)"
	if [ "$total" -gt $((60 * 1024 * 1024)) ]; then
		say "that is too close to the device tool's 64 MiB limit"
		bad=1
	fi
	printf 'carry: ["%s"]\n' "${carry// /\", \"}"
	return $bad
}

case $mode in
all)
	fetch_debs
	run_autoreconf
	;;
autotools) run_autoreconf ;;
esac
if check_all; then
	say "ready: device command 'bash tests/gpu/run.sh', with the carry above"
else
	die "not ready (see above)"
fi
