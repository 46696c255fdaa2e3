#!/usr/bin/env bash
# demo.sh: set everything up, then run the demo end to end on a small
# built-in default.  For now the demo is flow-bench's kernel checks: the
# sgemm ceiling, then every CPU kernel, forward and backward, timed and
# checked against the reference kernels.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$top/scripts/setup.sh" "$@"
build=${FLOW_BUILD_DIR:-$top/build}
bench=$build/bin/flow-bench

echo "== flow-bench kernel all: every CPU kernel, forward and backward, checked"
"$bench" kernel all --iters 3
echo "demo: every kernel matched its reference"
