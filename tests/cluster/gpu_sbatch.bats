#!/usr/bin/env bats
# examples/sbatch-gpt2-2x8gpu.sh under a private Slurm, shrunk to one node
# and two tasks and asking for no GPU (the test Slurm has no gres): the job
# starts, both tasks run, the dataset and plan are made, and flow-train
# refuses for lack of a GPU with one line per rank, exit status 1 and no
# crash.  Training on GPUs is for a GPU cluster; which device each rank
# would take is tests/unit/test_gpu_binding.c.

bats_require_minimum_version 1.5.0
load common

MODEL=gpt:layers=2,heads=2,dim=32,vocab=256,seq=32
# The refusal's words belong to flow-train's CUDA check (lib/device/device.c,
# tests/cli/device.bats): no device or driver, a module that does not load,
# or a build without CUDA.
NO_GPU_RE='flow-train: rank [01] \(.*\): (no usable CUDA|cannot load the CUDA module|this build of flow has no CUDA support)'
# What a crash leaves in a job's output.
CRASH_RE='core dumped|Segmentation fault|Aborted|Bus error|Illegal instruction|Floating point exception|Traceback|AddressSanitizer|LeakSanitizer|runtime error:|terminate called'

setup_file() {
	slurm_up SLURM1 7197
}

teardown_file() {
	slurm_down SLURM1
}

setup() {
	need_pmix_build
	cd "$BATS_TEST_TMPDIR"
}

# The job's output, shown when an assertion fails.
show_job() {
	echo "--- job.out" >&2
	cat job.out >&2 || true
}

@test "examples/sbatch-gpt2-2x8gpu.sh on 1 node x 2 tasks without GPUs: both tasks start, flow-train refuses in one line" {
	use_slurm SLURM1
	flow-train --help | grep -q -- '--device' || {
		echo "flow-train has no --device: the script's CUDA options are missing" >&2
		return 1
	}
	fox_corpus 2000 corpus.txt
	# Outside a job the script submits itself with the shape from the
	# environment; GPUS_PER_NODE=0 overrides its --gpus-per-node=8.  On
	# a machine with a GPU, CUDA is shown none.
	local env=(FLOW_BIN="$(dirname "$(command -v flow-train)")"
		NODES=1 TASKS_PER_NODE=2 GPUS_PER_NODE=0
		DATA=corpus.txt OUT="$PWD/run" MODEL="$MODEL" VOCAB=256
		VAL_TOKENS=4K SEQ_LEN=32 BATCH_PER_GPU=2 GRAD_ACCUM=1 STEPS=2
		COMM_TIMEOUT=20)
	if [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ]; then
		env+=(CUDA_VISIBLE_DEVICES=)
	fi
	run -0 --separate-stderr env -u SLURM_JOB_ID "${env[@]}" \
		"$top_srcdir/examples/sbatch-gpt2-2x8gpu.sh" --cpus-per-task=1 \
		--time=00:05:00 --output="$PWD/job.out" --parsable
	local id=${output%%;*}
	[[ $id =~ ^[0-9]+$ ]]
	run -0 sbatch_wait "$id" "$LAUNCH_TIMEOUT"
	local end=$output
	# The batch script exited non-zero (srun's status), not by a signal.
	[[ $end =~ ^FAILED\ [1-9][0-9]*:0$ ]] || { echo "job $id: $end" >&2; show_job; false; }

	# It started, with the shape asked for, and both tasks ran.
	grep -q "^# job $id: 2 ranks" job.out || { show_job; false; }
	grep -q '^# task 0 (local 0) on .*: CUDA_VISIBLE_DEVICES=' job.out || { show_job; false; }
	grep -q '^# task 1 (local 1) on .*: CUDA_VISIBLE_DEVICES=' job.out || { show_job; false; }
	[ -f run/data/manifest ]
	grep -q '^mesh 2:dp$' run/train.plan

	# flow-train refused: at least one rank's line (srun -K may end the
	# other rank before it writes its own), every line of flow-train's is
	# that refusal naming its rank, srun saw a task end, no step was
	# trained.
	grep -Eq "$NO_GPU_RE" job.out || { show_job; false; }
	if grep 'flow-train' job.out | grep -Ev "$NO_GPU_RE"; then
		show_job
		false
	fi
	# srun reports the task that exited 1, or, when -K ended them all at
	# once, all of them killed after it.
	grep -Eq 'tasks? [0-9,-]+: (Exited with exit code 1|Killed)$' job.out || { show_job; false; }
	run -1 grep -c $'^[0-9]*\ttrain\t' run/train.tsv

	# And nothing crashed.
	if grep -E "$CRASH_RE" job.out; then
		show_job
		false
	fi
	run -0 find . -name 'core' -o -name 'core.[0-9]*'
	[ -z "$output" ]
}
