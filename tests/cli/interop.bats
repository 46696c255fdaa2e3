#!/usr/bin/env bats
# interop: flow-ckpt export and import against the PyPI safetensors package
# and transformers' GPT2LMHeadModel, and flow-train --init from imported
# PyTorch weights against PyTorch's own training steps, on one rank and on
# a 2x2 (dp,tp) mesh (tests/ref/interop_check.py says what is checked).
# Runs in about three seconds.  Its python3 is $FLOW_INTEROP_PYTHON
# (scripts/test.sh makes one with scripts/interop-venv.sh); without one
# the test skips, unless FLOW_INTEROP_REQUIRED=1.

bats_require_minimum_version 1.5.0
load common

setup() {
	PY=${FLOW_INTEROP_PYTHON:-}
	if [ -z "$PY" ] || ! "$PY" -c 'import safetensors, transformers, torch' \
		>/dev/null 2>&1; then
		[ "${FLOW_INTEROP_REQUIRED:-0}" != 1 ] ||
			{ echo "FLOW_INTEROP_PYTHON '$PY' cannot import safetensors, transformers and torch" >&2; return 1; }
		skip "no python3 with safetensors and transformers (scripts/interop-venv.sh)"
	fi
	cd "$BATS_TEST_TMPDIR"
}

@test "exports load in safetensors and transformers; PyTorch weights import and train as in PyTorch" {
	run "$PY" "$top_srcdir/tests/ref/interop_check.py" \
		--flow-bin "$top_builddir/bin" --work-dir work --require-transformers
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "${lines[-1]}" == "PASS" ]]
	[[ "$output" != *"FAIL"* ]]
}
