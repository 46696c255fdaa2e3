#!/usr/bin/env bats
# flow-bench: every exit path (0, 1, 2), the output format, and a small run
# of every kernel.  Runs use tiny shapes, --iters 2 and a given
# --peak-gflops so the suite takes seconds; -q keeps the OpenBLAS-core
# warning (a property of the test machine) off stderr where stderr is
# asserted empty.

bats_require_minimum_version 1.5.0
load common

FAST=(--iters 2 --warmup 0 --peak-gflops 100 -q)

@test "flow-bench --help prints the usage on stdout and exits 0" {
	run --separate-stderr flow-bench --help
	[ "$status" -eq 0 ]
	[ -z "$stderr" ]
	[[ "${lines[0]}" == "Usage: flow-bench kernel NAME [options]" ]]
	[[ "$output" == *"--peak-gflops X"* ]]
	[[ "$output" == *"crossentropy  N,V,VP"* ]]
}

@test "flow-bench -h is --help" {
	run --separate-stderr flow-bench -h
	[ "$status" -eq 0 ]
	[[ "${lines[0]}" == "Usage: flow-bench"* ]]
}

@test "flow-bench --version prints the version and the build features" {
	run --separate-stderr flow-bench --version
	[ "$status" -eq 0 ]
	[ -z "$stderr" ]
	[[ "${lines[0]}" =~ ^flow-bench\ [0-9]+\.[0-9]+\.[0-9]+$ ]]
	[[ "${lines[1]}" == *"blas: "* ]]
}

@test "flow-bench without a mode is a usage error" {
	run -2 --separate-stderr flow-bench
	assert_usage_error flow-bench "missing mode"
}

@test "flow-bench rejects an unknown mode" {
	run -2 --separate-stderr flow-bench kernels matmul
	assert_usage_error flow-bench "unknown mode 'kernels'"
}

@test "flow-bench kernel without a kernel name is a usage error" {
	run -2 --separate-stderr flow-bench kernel
	assert_usage_error flow-bench "missing kernel name"
}

@test "flow-bench rejects an unknown kernel" {
	run -2 --separate-stderr flow-bench kernel matmull
	assert_usage_error flow-bench "unknown kernel 'matmull'"
}

@test "flow-bench rejects a second kernel name" {
	run -2 --separate-stderr flow-bench kernel gelu residual
	assert_usage_error flow-bench "unexpected argument 'residual'"
}

@test "flow-bench rejects an unknown long option" {
	run -2 --separate-stderr flow-bench kernel gelu --itters 3
	assert_usage_error flow-bench "unknown option '--itters'"
}

@test "flow-bench rejects an unknown short option" {
	run -2 --separate-stderr flow-bench kernel gelu -x
	assert_usage_error flow-bench "unknown option '-x'"
}

@test "flow-bench rejects an option without its value" {
	run -2 --separate-stderr flow-bench kernel gelu --iters
	assert_usage_error flow-bench "'--iters' needs a value"
}

@test "flow-bench rejects an iteration count with trailing garbage" {
	run -2 --separate-stderr flow-bench kernel gelu --iters 5x
	assert_usage_error flow-bench "--iters"
	[[ "${stderr_lines[0]}" == *"5x"* ]]
}

@test "flow-bench rejects zero and negative iteration counts" {
	run -2 --separate-stderr flow-bench kernel gelu --iters 0
	assert_usage_error flow-bench "--iters"
	run -2 --separate-stderr flow-bench kernel gelu --iters -3
	assert_usage_error flow-bench "--iters"
}

@test "flow-bench rejects a negative warmup count" {
	run -2 --separate-stderr flow-bench kernel gelu --warmup -1
	assert_usage_error flow-bench "--warmup"
}

@test "flow-bench rejects a negative or non-numeric tolerance" {
	run -2 --separate-stderr flow-bench kernel gelu --rtol -1e-3
	assert_usage_error flow-bench "--rtol"
	run -2 --separate-stderr flow-bench kernel gelu --atol abc
	assert_usage_error flow-bench "--atol"
}

@test "flow-bench rejects a zero or garbage peak" {
	run -2 --separate-stderr flow-bench kernel gelu --peak-gflops 0
	assert_usage_error flow-bench "--peak-gflops"
	run -2 --separate-stderr flow-bench kernel gelu --peak-gflops 1e3z
	assert_usage_error flow-bench "--peak-gflops"
}

@test "flow-bench rejects a shape with the wrong number of sizes" {
	run -2 --separate-stderr flow-bench kernel matmul --shape 256,768
	assert_usage_error flow-bench "invalid shape '256,768' for matmul: expected N,IN,OUT"
}

@test "flow-bench rejects zero, negative and trailing-garbage shapes" {
	run -2 --separate-stderr flow-bench kernel layernorm --shape 0,768
	assert_usage_error flow-bench "invalid shape '0,768' for layernorm"
	run -2 --separate-stderr flow-bench kernel layernorm --shape=-4,768
	assert_usage_error flow-bench "invalid shape '-4,768'"
	run -2 --separate-stderr flow-bench kernel gelu --shape 1000k
	assert_usage_error flow-bench "invalid shape '1000k' for gelu: expected N"
}

@test "flow-bench rejects attention heads that do not divide the channels" {
	run -2 --separate-stderr flow-bench kernel attention --shape 1,8,64,5
	assert_usage_error flow-bench "NH must divide C"
}

@test "flow-bench rejects a shape too large to allocate" {
	run -2 --separate-stderr flow-bench kernel matmul --shape 4294967296,4294967296,4294967296
	assert_usage_error flow-bench "too large"
}

@test "flow-bench rejects --shape with kernel all" {
	run -2 --separate-stderr flow-bench kernel all --shape 10
	assert_usage_error flow-bench "'--shape' cannot be used with kernel 'all'"
}

@test "flow-bench rejects --peak-gflops with kernel peak" {
	run -2 --separate-stderr flow-bench kernel peak --peak-gflops 100
	assert_usage_error flow-bench "'--peak-gflops' cannot be used with kernel 'peak'"
}

@test "flow-bench rejects an invalid FLOW_LOG_LEVEL" {
	FLOW_LOG_LEVEL=loud run -2 --separate-stderr flow-bench kernel gelu
	assert_usage_error flow-bench "FLOW_LOG_LEVEL"
}

# One passing run of kernel $1 on the shapes that follow.
run_kernel() {
	local kernel=$1
	shift
	local shapes=()
	for s in "$@"; do
		shapes+=(--shape "$s")
	done
	run --separate-stderr flow-bench kernel "$kernel" "${shapes[@]}" "${FAST[@]}"
	[ "$status" -eq 0 ] || { echo "exit $status: $stderr" >&2; return 1; }
	[ -z "$stderr" ]
	[ "${lines[-1]}" = "# PASS" ]
	# Every row is this kernel, checked, with no wrong element.
	local rows
	rows=$(tsv_rows "$output")
	[ -n "$rows" ]
	printf '%s\n' "$rows" | awk -F'\t' -v k="$kernel" '
		$1 != k || $12 <= 0 || $13 != 0 { bad = 1 }
		END { exit bad }'
}

@test "flow-bench kernel matmul passes on small shapes, forward and backward" {
	run_kernel matmul 16,48,40 7x33x65
	[ "$(tsv_rows "$output" | cut -f2 | tr '\n' ' ')" = "fwd bwd fwd bwd " ]
}

@test "flow-bench kernel embedding passes on a small shape" {
	run_kernel embedding 2,9,40,17
}

@test "flow-bench kernel layernorm passes on a small shape" {
	run_kernel layernorm 9,77
}

@test "flow-bench kernel gelu passes on a small shape" {
	run_kernel gelu 4097
}

@test "flow-bench kernel attention passes on a small shape" {
	run_kernel attention 2,11,48,4
}

@test "flow-bench kernel attention_bf16 checks the bf16 attention" {
	run_kernel attention_bf16 2,11,48,4
	tsv_rows "$output" | awk -F'\t' '
		$1 != "attention_bf16" { next }
		$12 == 0 || $13 != 0 { bad = 1 }
		{ n++ }
		END { exit bad || n != 2 }'
}

@test "flow-bench kernel residual passes bit for bit" {
	run_kernel residual 4097
	[[ "$output" == *"# kernel residual: rtol 0, atol 0,"* ]]
}

@test "flow-bench kernel crossentropy passes on a small shape" {
	run_kernel crossentropy 10,100,128
	[ "$(tsv_rows "$output" | cut -f2)" = "fused" ]
}

@test "flow-bench kernel adamw passes on a small shape" {
	run_kernel adamw 10007
}

@test "flow-bench kernel gradnorm passes with several tensors" {
	run_kernel gradnorm 10007,5 999
}

@test "flow-bench kernel peak measures the sgemm ceiling on a small GEMM" {
	run --separate-stderr flow-bench kernel peak --shape 128 --iters 2 -q
	[ "$status" -eq 0 ]
	[ "${lines[-1]}" = "# PASS" ]
	[[ "$output" == *$'\n'"# peak_gflops: "* ]]
	[ "$(tsv_rows "$output" | cut -f1,2,3)" = $'peak\tsgemm\t128' ]
}

@test "flow-bench writes a preamble, a header with units and a footer" {
	run --separate-stderr flow-bench kernel gelu --shape 1000 "${FAST[@]}"
	[ "$status" -eq 0 ]
	[[ "${lines[0]}" == "# flow "*"blas: "* ]]
	[[ "$output" == *$'\n'"# cpu: "* ]]
	[[ "$output" == *$'\n'"# openmp: "*" threads"* ]]
	[[ "$output" == *$'\n'"# blas: "*"; core "* ]]
	[[ "$output" == *$'\n'"# config: mode kernel, iters 2, warmup 0, seed 1234, peak given 100.00 GFLOP/s"* ]]
	local header
	header=$(printf '%s\n' "$output" | grep -v '^#' | head -n 1)
	[ "$header" = $'kernel\tpass\tshape\titers\ttime_us\tmin_us\tgflops\tgbps\tfrac_peak\tblas_gflops\tblas_ratio\tchecked\twrong' ]
	# Every row has all 13 columns; gelu has no BLAS columns.
	tsv_rows "$output" | awk -F'\t' 'NF != 13 || $10 != "-" { exit 1 }'
}

@test "flow-bench measures the peak in the same run unless it is given" {
	run --separate-stderr flow-bench kernel residual --shape 1000 --iters 1 --warmup 0 -q
	[ "$status" -eq 0 ]
	[ "$(tsv_rows "$output" | head -n 1 | cut -f1,2)" = $'peak\tsgemm' ]
	tsv_rows "$output" | awk -F'\t' '$1 == "residual" && $9 == "-" { exit 1 }'
}

@test "flow-bench matmul rows carry the BLAS rate and the ratio to it" {
	run --separate-stderr flow-bench kernel matmul --shape 32,64,48 "${FAST[@]}"
	[ "$status" -eq 0 ]
	tsv_rows "$output" | awk -F'\t' '
		$10 == "-" || $11 == "-" { exit 1 }
		{ r = $7 / $10; if (r - $11 > 0.01 || $11 - r > 0.01) exit 1 }'
}

@test "flow-bench kernel matmul_bf16 checks the bf16 matmul and times the fp32 sgemms beside it" {
	run_kernel matmul_bf16 13,37,29 64,96,80
	tsv_rows "$output" | awk -F'\t' '
		$1 != "matmul_bf16" { next }
		$10 == "-" || $11 == "-" || $12 == 0 || $13 != 0 { bad = 1 }
		{ n++ }
		END { exit bad || n != 4 }'
}

@test "flow-bench kernel resln checks the fused kernels and times the unfused pair beside them" {
	run_kernel resln 7,33 64,768
	tsv_rows "$output" | awk -F'\t' '
		$1 != "resln" { next }
		$2 != "fwd" && $2 != "bwd" { bad = 1 }
		$10 == "-" || $11 == "-" || $13 != 0 { bad = 1 }
		{ n++ }
		END { exit bad || n != 4 }'
}

@test "flow-bench --json writes one document with the same records" {
	run --separate-stderr flow-bench kernel matmul --shape 16,32,24 --json "${FAST[@]}"
	[ "$status" -eq 0 ]
	[[ "$output" != "#"* ]]
	assert_json "$output"
	printf '%s\n' "$output" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["tool"] == "flow-bench" and d["result"] == "PASS" and d["wrong"] == 0
assert [r["pass"] for r in d["records"]] == ["fwd", "bwd"]
r = d["records"][0]
assert r["kernel"] == "matmul" and r["shape"] == "16x32x24" and r["iters"] == 2
assert r["flop"] == 2 * 16 * 32 * 24 and r["blas_gflops"] > 0
assert d["machine"]["blas_core"] and d["config"]["peak_gflops"] == 100
'
}

@test "flow-bench exits 1 and names the wrong results when the tolerance is zero" {
	# --rtol 0 --atol 0 demands bitwise equality with the double-precision
	# reference, which an fp32 GEMM over 768 products does not meet.
	run -1 --separate-stderr flow-bench kernel matmul --shape 8,768,64 --rtol 0 --atol 0 "${FAST[@]}"
	[[ "${lines[-1]}" =~ ^#\ FAIL:\ [1-9][0-9]*\ wrong$ ]]
	[[ "${stderr_lines[0]}" =~ ^flow-bench:\ wrong\ results\ \'matmul\ fwd\ 8x768x64\':\ [1-9][0-9]*\ of\ [0-9]+\ elements ]]
	tsv_rows "$output" | awk -F'\t' '$2 == "fwd" && $13 == 0 { exit 1 }'
}

@test "flow-bench --json reports FAIL and exits 1 on wrong results" {
	run -1 --separate-stderr flow-bench kernel matmul --shape 8,768,64 --rtol 0 --atol 0 --json "${FAST[@]}"
	assert_json "$output"
	printf '%s\n' "$output" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["result"] == "FAIL" and d["wrong"] > 0
'
	[[ "$stderr" == *"wrong results 'matmul fwd 8x768x64'"* ]]
}

@test "flow-bench rows appear in a pipeline and the header is awk-friendly" {
	run --separate-stderr bash -c 'flow-bench kernel residual --shape 100 --shape 200 --iters 1 --warmup 0 --peak-gflops 100 -q | grep -v "^#" | awk -F"\t" "NR > 1 { print \$3 }"'
	[ "$status" -eq 0 ]
	[ "$output" = $'100\n100\n200\n200' ]
}

@test "flow-bench runs itself again with passive OpenMP threads and this CPU's best OpenBLAS kernels" {
	run --separate-stderr env -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE \
		flow-bench kernel residual --shape 1000 "${FAST[@]}"
	[ "$status" -eq 0 ]
	[[ "$output" == *"OMP_WAIT_POLICY PASSIVE"* ]]
	# No warning: the kernels in use are the best this CPU can run.
	[[ "$output" != *"# warning"* ]]
}

@test "flow-bench keeps the OpenBLAS kernels the user chose and warns when they are slower" {
	grep -qw avx2 /proc/cpuinfo || skip "this CPU has no AVX2"
	run --separate-stderr env OPENBLAS_CORETYPE=Prescott OMP_WAIT_POLICY=ACTIVE \
		flow-bench kernel residual --shape 1000 "${FAST[@]}"
	[ "$status" -eq 0 ]
	[[ "$output" == *"core Prescott"* ]]
	[[ "$output" == *"OMP_WAIT_POLICY ACTIVE"* ]]
	[[ "$output" == *"# warning: OpenBLAS runs 'Prescott' kernels but this CPU can run"* ]]
}

# ---- loader ------------------------------------------------------------------

# A small dataset in ./data: 4 shards of text.
small_dataset() {
	for i in $(seq 1 2000); do printf 'line %d of the corpus\n' "$i"; done >corpus.txt
	flow-shard -q --shard-tokens 12K -o data corpus.txt
}

@test "flow-bench loader reads with checks and without, the same tokens" {
	cd "$BATS_TEST_TMPDIR"
	small_dataset
	run -0 --separate-stderr flow-bench loader data --seq-len 64 --batch 4 --batches 3 --iters 2 -q
	[ -z "$stderr" ]
	[[ "$output" == *$'\n# config: mode loader, data data, split train, seq-len 64, batch 4, 3 batches per half pass, 2 timed passes per variant\n'* ]]
	[[ "$output" == *$'\nvariant\ttokens\tfirst_s\tfirst_tokens_per_s\tsteady_s\tsteady_tokens_per_s\n'* ]]
	[[ "$output" =~ $'\n'checked$'\t'768$'\t' ]]
	[[ "$output" =~ $'\n'unchecked$'\t'768$'\t' ]]
	[[ "${lines[-1]}" == "# checked/unchecked throughput: first "*" (checksums verified), steady "*" (ids checked); the same tokens ("*")" ]]
	run -0 --separate-stderr flow-bench loader data --seq-len 64 --batches 2 --iters 1 --json -q
	[[ "$output" == '{"tool":"flow-bench","mode":"loader",'*'"records":[{"variant":"checked","tokens":1024,'*'{"variant":"unchecked","tokens":1024,'*'"first_ratio":'*'"steady_ratio":'*'}' ]]
}

@test "flow-bench loader: usage errors" {
	run -2 --separate-stderr flow-bench loader
	assert_usage_error flow-bench "missing dataset directory after 'loader'"
	run -2 --separate-stderr flow-bench loader a b
	assert_usage_error flow-bench "unexpected argument 'b'"
	run -2 --separate-stderr flow-bench kernel gelu --seq-len 64
	assert_usage_error flow-bench "option '--seq-len' needs mode 'loader'"
	run -2 --separate-stderr flow-bench loader data --split test
	assert_usage_error flow-bench "--split: unknown split 'test' (expected train or val)"
}

@test "flow-bench loader on a damaged shard fails with one line naming it" {
	cd "$BATS_TEST_TMPDIR"
	small_dataset
	printf 'x' | dd of=data/train-000001.bin bs=1 seek=200 conv=notrunc status=none
	run -1 --separate-stderr flow-bench loader data --seq-len 64 --batches 8 --iters 1 -q
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == "flow-bench: data/train-000001.bin: checksum mismatch at byte "* ]]
}
