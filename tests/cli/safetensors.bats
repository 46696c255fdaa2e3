#!/usr/bin/env bats
# safetensors: flow's Hugging Face GPT-2 export checked by code that shares
# nothing with it (tests/ref/safetensors_check.py: a plain-Python parser of
# the files, PyTorch's bf16/f16 rounding, a Conv1D-layout forward against
# flow's logits, and the import back).  Runs in about two seconds.  Needs
# Debian's python3-torch for /usr/bin/python3; skipped without it.

bats_require_minimum_version 1.5.0
load common

PY=/usr/bin/python3

setup() {
	if ! "$PY" -c 'import torch, numpy' >/dev/null 2>&1; then
		skip "$PY cannot import torch and numpy (install Debian's python3-torch)"
	fi
	LIB=$top_builddir/lib/.libs/libflow.so
	[ -f "$LIB" ] || skip "no shared libflow at $LIB (--disable-shared build)"
	# ctypes loads libflow into python3, which an ASan runtime must come
	# first in; the programs' own tests (interop.bats) cover that build.
	if ldd "$LIB" 2>/dev/null | grep -q 'libasan'; then
		skip "libflow is built with ASan, which python3 cannot load"
	fi
	cd "$BATS_TEST_TMPDIR"
}

@test "the exported GPT-2 directory loads as transformers' layout" {
	run "$PY" "$top_srcdir/tests/ref/safetensors_check.py" --lib "$LIB" \
		--work-dir work
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "${lines[-1]}" == "PASS" ]]
	[[ "$output" != *"FAIL"* ]]
}
