#!/usr/bin/env bash
# demo.sh: set everything up, then run the demo end to end on a small
# built-in default.  For now the demo is flow-bench's kernel checks: every
# CPU kernel, forward and backward, timed and checked against the reference.
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$top/scripts/setup.sh" "$@"
build=${FLOW_BUILD_DIR:-$top/build}
bench=$build/bin/flow-bench

export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
echo "== flow-bench: the sgemm ceiling of this machine"
"$bench" kernel peak
for k in matmul embedding layernorm gelu attention residual crossentropy adamw gradnorm; do
	echo "== flow-bench: kernel $k"
	"$bench" kernel "$k" --iters 3
done
echo "demo: every kernel matched its reference"
