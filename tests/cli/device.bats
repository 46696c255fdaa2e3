#!/usr/bin/env bats
# Devices: the CPU tools never map a CUDA library (CUDA lives in the
# libflow-cuda module, loaded only when a run asks for a GPU), and asking
# for CUDA where it cannot be had is one line naming what is missing.

bats_require_minimum_version 1.5.0
load common

MODEL=gpt:layers=1,heads=2,dim=16,vocab=256,seq=16
TRAIN=(--model "$MODEL" --batch 2 --seq-len 16 --steps 1 --peak-gflops 0)
CUDA_LIBS='libcudart|libcublas|libcudnn|libnccl|libcuda\.so|libflow-cuda'

setup_file() {
	cd "$BATS_FILE_TMPDIR"
	for i in $(seq 1 400); do printf 'the quick fox, line %d.\n' "$i"; done >corpus.txt
	flow-shard -q -o data --val-tokens 1K corpus.txt
}

setup() {
	cd "$BATS_TEST_TMPDIR"
	DATA=$BATS_FILE_TMPDIR/data
}

has_gpu() {
	[ -e /dev/nvidia0 ]
}

# The real executable behind a libtool wrapper in bin/.
real_binary() {
	local b=$top_builddir/bin/.libs/$1
	[ -x "$b" ] || b=$top_builddir/bin/.libs/lt-$1
	[ -x "$b" ] || b=$top_builddir/bin/$1
	echo "$b"
}

@test "libflow and every tool link no CUDA library" {
	run ldd "$top_builddir/lib/.libs/libflow.so"
	[ "$status" -eq 0 ]
	run ! grep -E "$CUDA_LIBS" <<<"$output"
	for tool in flow-shard flow-plan flow-train flow-bench flow-ckpt; do
		run env LD_LIBRARY_PATH="$top_builddir/lib/.libs" ldd "$(real_binary $tool)"
		[ "$status" -eq 0 ]
		run ! grep -E "$CUDA_LIBS" <<<"$output"
	done
}

@test "a running CPU tool maps no CUDA library" {
	mkfifo plan.fifo
	flow-plan --check plan.fifo >out.txt 2>err.txt &
	local pid=$! maps=
	# Wait for the tool itself (past the libtool wrapper) to be running.
	for _ in $(seq 1 200); do
		maps=$(cat "/proc/$pid/maps" 2>/dev/null || true)
		grep -q 'libflow\.so' <<<"$maps" && break
		sleep 0.05
	done
	# Only to let it go: it may read the FIFO as empty and close it before
	# the write, which then fails with EPIPE.
	timeout 10 sh -c 'echo garbage >plan.fifo' 2>/dev/null || true
	wait "$pid" || true
	grep -q 'libflow\.so' <<<"$maps"
	run ! grep -E "$CUDA_LIBS" <<<"$maps"
}

@test "flow-train --device cuda without a GPU fails with one line" {
	has_gpu && skip "this machine has a GPU (tests/gpu/run.sh covers it)"
	run -1 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --device cuda
	[ -z "$output" ]
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ ${stderr_lines[0]} =~ ^flow-train:\ (no\ usable\ CUDA\ driver\ or\ device:|this\ build\ of\ flow\ has\ no\ CUDA\ support) ]]
}

@test "a CUDA module that is not there is named" {
	run -1 --separate-stderr env FLOW_CUDA_MODULE=/nonexistent/libflow-cuda.so \
		flow-train "${TRAIN[@]}" --data "$DATA" --device cuda
	[ "${#stderr_lines[@]}" -eq 1 ]
	if flow-train --version | grep -q 'cuda: yes'; then
		[ "${stderr_lines[0]}" = "flow-train: cannot load the CUDA module: /nonexistent/libflow-cuda.so: cannot open shared object file: No such file or directory" ]
	else
		[ "${stderr_lines[0]}" = "flow-train: this build of flow has no CUDA support (configure found no CUDA toolkit)" ]
	fi
}

@test "a rank of a job that cannot have its GPU names itself" {
	has_gpu && skip "this machine has a GPU"
	run -1 --separate-stderr flow-train --nproc 2 "${TRAIN[@]}" --data "$DATA" --device cuda
	# The first rank to fail ends the job: the other may be stopped before
	# it says anything.
	grep -q '^flow-train: rank [01] (.*): \(no usable CUDA\|this build of flow has no CUDA\)' <<<"$stderr"
	run ! grep '^flow-train: \(no usable\|this build\)' <<<"$stderr"
}

@test "--device, --precision and --comm are checked" {
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --device gpu
	assert_usage_error flow-train "--device: unknown device 'gpu' (expected cpu or cuda)"
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --precision fp16
	assert_usage_error flow-train "--precision: unknown precision 'fp16' (expected fp32 or bf16)"
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --comm mpi
	assert_usage_error flow-train "--comm: unknown backend 'mpi' (expected nccl or cpu)"
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --comm nccl
	assert_usage_error flow-train "--comm nccl needs --device cuda"
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --device cuda --kernels ref
	assert_usage_error flow-train "--kernels ref runs on the CPU: it cannot go with --device cuda"
}

@test "--precision bf16 on the CPU stores activations in bf16: near fp32, not equal" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 3 --precision fp32
	local fp32=$output
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 3 --precision bf16
	grep -q '^# kernels cpu, precision bf16,' <<<"$output"
	grep -q '^# kernels cpu, precision fp32,' <<<"$fp32"
	# Losses within 1e-3 relative of fp32's, and not the same numbers.
	paste <(tsv_rows "$fp32" | cut -f3) <(tsv_rows "$output" | cut -f3) |
		awk -F'\t' '{ d = $2 - $1; if (d < 0) d = -d; if (d > 1e-3 * $1) bad = 1;
			if ($1 != $2) differ = 1; n++ }
			END { exit !(n == 3 && !bad && differ) }'
}

@test "--device cpu and --comm cpu are the CPU run as before" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --device cpu --comm cpu --precision fp32
	tsv_rows "$output" | grep -q '^1	train	'
}

@test "a plan can say its device and precision, and the command line overrides them" {
	run -0 flow-plan --model "$MODEL" --mesh 1 --axes dp --batch 2 --seq-len 16 \
		--device cuda --precision bf16 -o cuda.plan
	grep -qx 'device cuda' cuda.plan
	grep -qx 'precision bf16' cuda.plan
	run -2 --separate-stderr flow-plan --model "$MODEL" --mesh 1 --axes dp --batch 2 --device gpu
	assert_usage_error flow-plan "--device: unknown device 'gpu' (expected cpu or cuda)"
	if ! has_gpu; then
		run -1 --separate-stderr flow-train --plan cuda.plan --data "$DATA" --steps 1 --peak-gflops 0
		[ "${#stderr_lines[@]}" -eq 1 ]
		[[ ${stderr_lines[0]} =~ ^flow-train:\ (no\ usable\ CUDA|this\ build\ of\ flow\ has\ no\ CUDA) ]]
	fi
	# bf16 from the plan with the CPU from the command line: bf16 on the CPU.
	run -0 --separate-stderr flow-train --plan cuda.plan --data "$DATA" --steps 1 --device cpu \
		--peak-gflops 0
	grep -q '^# kernels cpu, precision bf16,' <<<"$output"
	run -0 --separate-stderr flow-train --plan cuda.plan --data "$DATA" --steps 1 --peak-gflops 0 \
		--device cpu --precision fp32
	tsv_rows "$output" | grep -q '^1	train	'
}

# --kernels staged: the CPU kernels through every copy a GPU run makes
# (parameter init, batches, losses, the optimizer's moments, checkpoints):
# the same bits as --kernels cpu, and checkpoints either resumes; in fp32
# and with bf16 activations.
@test "the GPU's copy paths on the CPU (--kernels staged) give the CPU's bits, and resume across" {
	local p
	for p in fp32 bf16; do
		local run=("${TRAIN[@]}" --steps 4 --data "$DATA" --eval-every 2 --eval-batches 2
			--ckpt-every 2 --precision "$p")
		run -0 --separate-stderr flow-train "${run[@]}" --kernels cpu --ckpt-dir "ck-cpu-$p"
		tsv_rows "$output" >cpu.rows
		run -0 --separate-stderr flow-train "${run[@]}" --kernels staged --ckpt-dir "ck-staged-$p"
		tsv_rows "$output" | cut -f1-5 >staged.rows
		cut -f1-5 cpu.rows >cpu5.rows
		cmp cpu5.rows staged.rows
		grep -q '^4	train	' staged.rows
		cmp "ck-cpu-$p/step-00000004/rank-00000.bin" "ck-staged-$p/step-00000004/rank-00000.bin"
		run -0 --separate-stderr flow-train "${run[@]}" --kernels staged \
			--resume "ck-cpu-$p/step-00000002" --ckpt-dir "ck-r-$p"
		tsv_rows "$output" | cut -f1-5 | grep '^[34]	' >resumed.rows
		grep '^[34]	' cpu5.rows | cmp - resumed.rows
	done
}

@test "flow-bench --device cuda: peak and matmul only, and one line without a GPU" {
	run -2 --separate-stderr flow-bench kernel gelu --device cuda
	assert_usage_error flow-bench "--device cuda benchmarks peak and matmul only (so far), not 'gelu'"
	has_gpu && skip "this machine has a GPU (tests/gpu/train.sh benchmarks it)"
	run -1 --separate-stderr flow-bench kernel matmul --device cuda --shape 64,64,64
	[ -z "$output" ]
	# One error line; flow-bench's warnings about this CPU (an OpenBLAS
	# core type below the CPU's, seen on AMD EPYC) may come before it.
	errors=()
	for line in "${stderr_lines[@]}"; do
		[[ $line == "flow-bench: warning: "* ]] || errors+=("$line")
	done
	[ "${#errors[@]}" -eq 1 ]
	[[ ${errors[0]} =~ ^flow-bench:\ (no\ usable\ CUDA|this\ build\ of\ flow\ has\ no\ CUDA) ]]
}
