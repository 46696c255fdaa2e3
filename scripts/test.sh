#!/usr/bin/env bash
# test.sh: set everything up, then run the whole test suite (make check) and
# print the count of test cases: 'N passed, N failed'.  Exit status is make
# check's.
#   scripts/test.sh [configure options...]
set -uo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$top/scripts/setup.sh" "$@" || exit 1
build=${FLOW_BUILD_DIR:-$top/build}
# The interop test's safetensors and transformers (from PyPI): without
# them it skips, unless FLOW_INTEROP_REQUIRED=1 (CI).
if [ -z "${FLOW_INTEROP_PYTHON:-}" ] &&
	FLOW_INTEROP_PYTHON=$("$top/scripts/interop-venv.sh"); then
	export FLOW_INTEROP_PYTHON
fi
cd "$build"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
make -j"$(nproc)" check
status=$?
"$top/scripts/count-tests.sh" "$build"
exit $status
