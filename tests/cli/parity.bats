#!/usr/bin/env bats
# parity: flow-train against PyTorch (tests/ref/gpt_parity.py): 20 steps of
# a small GPT-2 with gradient accumulation, warmup, cosine decay and
# clipping, from the same initial weights on the same batches; losses,
# learning rates, gradient norms, the step-1 gradients and the final
# weights and AdamW moments must agree (tests/ref/README.md gives the
# tolerances), in fp32 and with bf16 activations.  Needs Debian's
# python3-torch for /usr/bin/python3; the tests are skipped without it.
# Also checks that the checker fails when flow's numbers are perturbed.

bats_require_minimum_version 1.5.0
load common

PY=/usr/bin/python3
PARITY=$top_srcdir/tests/ref/gpt_parity.py

# Importing torch takes seconds: once per file.
setup_file() {
	PARITY_TORCH=no
	"$PY" -c 'import torch, numpy' >/dev/null 2>&1 && PARITY_TORCH=yes
	export PARITY_TORCH
}

setup() {
	if [ "$PARITY_TORCH" != yes ]; then
		skip "$PY cannot import torch and numpy (install Debian's python3-torch)"
	fi
	cd "$BATS_TEST_TMPDIR"
}

parity() {
	run "$PY" "$PARITY" --flow-bin "$top_builddir/bin" --work-dir work "$@"
	echo "$output"
}

@test "flow-train matches PyTorch over 20 steps" {
	parity
	[ "$status" -eq 0 ]
	[[ "${lines[-1]}" == "PASS: flow-train matches PyTorch over 20 steps"* ]]
	# The run exercised clipping, and every check passed.
	[[ "$output" == *"ok    clipping at 1.5 was exercised: steps "* ]]
	[[ "$output" != *"FAIL"* ]]
}

@test "flow-train matches PyTorch with a padded vocabulary" {
	# vocab 256 with pad 96: Vp 288, 32 padded logit columns and wte rows.
	parity --model gpt:layers=2,heads=2,dim=64,vocab=256,seq=64,pad=96
	[ "$status" -eq 0 ]
	[[ "$output" == *"parameters with their shapes (Vp 288)"* ]]
	[[ "${lines[-1]}" == "PASS: "* ]]
}

@test "flow-train --precision bf16 matches PyTorch with bf16 activations" {
	# PyTorch rounds the same tensors (torch_gpt.py's bf16 emulation);
	# the tolerances are bf16's (gpt_parity.py, TOLERANCES).
	parity --precision bf16
	[ "$status" -eq 0 ]
	[[ "$output" == *"ok    step-1 gradients: worst "* ]]
	[[ "${lines[-1]}" == "PASS: flow-train matches PyTorch over 20 steps"* ]]
}

@test "the bf16 parity check fails on an fp32 run" {
	# flow-train in fp32, then its outputs against bf16 PyTorch: the bf16
	# tolerances still tell the two precisions apart.
	parity
	[ "$status" -eq 0 ]
	parity --precision bf16 --reuse
	[ "$status" -eq 1 ]
	[[ "$output" == *"FAIL  step-1 gradients: worst "* ]]
}

@test "the parity check fails on a loss off by 1e-4" {
	parity --perturb-loss 1e-4
	[ "$status" -eq 1 ]
	[[ "$output" == *"FAIL  loss: max relative difference"* ]]
	[[ "${lines[-1]}" == "FAIL: 1 parity check(s) failed"* ]]
}

@test "the parity check fails on gradients off by 1%" {
	parity --perturb-grad 1e-2
	[ "$status" -eq 1 ]
	[[ "$output" == *"FAIL  step-1 gradients: worst "* ]]
	[[ "${lines[-1]}" == "FAIL: 1 parity check(s) failed"* ]]
}

@test "gpt_parity.py exits 2 without flow programs" {
	run "$PY" "$PARITY" --flow-bin "$BATS_TEST_TMPDIR/nowhere"
	[ "$status" -eq 2 ]
	[[ "$output" == *"is not an executable program"* ]]
}
