#!/usr/bin/env bats
# Joining a job: flow's own --nproc launcher (1, 2 and 4 ranks, two at once,
# a failing rank, SIGINT), a singleton without any launcher, and the
# refusals: separately started tasks (srun --mpi=none) and a stale PMIx
# environment.

bats_require_minimum_version 1.5.0
load common

setup_file() {
	slurm_up SLURM1 7117
}

teardown_file() {
	slurm_down SLURM1
}

setup() {
	need_comm_check
	cd "$BATS_TEST_TMPDIR"
}

teardown() {
	stop_background
}

# ---- options ---------------------------------------------------------------------

@test "comm_check --help prints the usage on stdout and exits 0" {
	run -0 --separate-stderr "$COMM_CHECK" --help
	[ -z "$stderr" ]
	[ "${lines[0]}" = "Usage: comm_check [--nproc N] [--timeout S] [--backend cpu|nccl]" ]
	[[ $output == *"--exit-rank R:STATUS"* ]]
	[[ $output == *"--stall-rank R"* ]]
}

@test "comm_check --nproc 0 is a usage error" {
	run -2 --separate-stderr "$COMM_CHECK" --nproc 0
	[ -z "$output" ]
	[ "${#stderr_lines[@]}" -eq 2 ]
	[[ ${stderr_lines[0]} == "comm_check: --nproc: "* ]]
	[ "${stderr_lines[1]}" = "Try 'comm_check --help' for more information." ]
}

@test "comm_check --soak without --pid-dir is a usage error" {
	run -2 --separate-stderr "$COMM_CHECK" --soak 1M
	[ "${stderr_lines[0]}" = "comm_check: --soak and --pid-dir go together" ]
}

@test "flow-train --nproc 0 is a usage error" {
	run -2 --separate-stderr timeout "$LAUNCH_TIMEOUT" flow-train --nproc 0 \
		--model gpt:layers=1,heads=2,dim=32,vocab=256,seq=32 --data .
	[ -z "$output" ]
	[ "${#stderr_lines[@]}" -eq 2 ]
	[[ ${stderr_lines[0]} == "flow-train: --nproc: "* ]]
	[ "${stderr_lines[1]}" = "Try 'flow-train --help' for more information." ]
}

# ---- the --nproc launcher ---------------------------------------------------------

@test "comm_check --nproc 1 checks every collective on one rank" {
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$COMM_CHECK" --nproc 1 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 1 1 self
}

@test "comm_check --nproc 2 checks every collective over shared memory" {
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$COMM_CHECK" --nproc 2 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 2 1 shm
}

@test "comm_check --nproc 4 checks every collective over shared memory" {
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$COMM_CHECK" --nproc 4 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 4 1 shm
}

@test "two launchers at once run two separate jobs" {
	timeout "$LAUNCH_TIMEOUT" "$COMM_CHECK" --nproc 2 \
		--timeout "$CHECK_TIMEOUT" >out1 2>err1 &
	local first=$!
	background "$first"
	timeout "$LAUNCH_TIMEOUT" "$COMM_CHECK" --nproc 3 \
		--timeout "$CHECK_TIMEOUT" >out2 2>err2 &
	local second=$!
	background "$second"
	wait_pid "$first" "$LAUNCH_TIMEOUT"
	[ "$status" -eq 0 ]
	wait_pid "$second" "$LAUNCH_TIMEOUT"
	[ "$status" -eq 0 ]
	[ ! -s err1 ] && [ ! -s err2 ]
	run -0 cat out1
	assert_summary 2 1 shm
	run -0 cat out2
	assert_summary 3 1 shm
}

@test "comm_check without a launcher runs as a one-rank singleton" {
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$COMM_CHECK" --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 1 1 self
}

@test "a rank that exits non-zero makes the launcher exit with its status and name the rank" {
	run -3 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$COMM_CHECK" --nproc 3 --exit-rank 1:3 --timeout "$CHECK_TIMEOUT"
	[ -z "$output" ]
	# The survivors may be gone already when the launcher tells.
	local launcher='^comm_check: rank 1 exited with status 3(; stopping the other [12] ranks?)?$'
	[ "$(grep -cE "$launcher" <<<"$stderr")" -eq 1 ] || {
		echo "stderr: $stderr" >&2
		false
	}
	# A survivor may still say what it saw before the launcher stopped it;
	# then it names the same rank.
	every_line_matches "$launcher|^comm_check: rank [02] \([^)]*\): peer rank 1 \(" "$stderr"
}

@test "SIGINT to the launcher stops every rank and ends it with 130" {
	env --default-signal=INT true 2>/dev/null ||
		skip "env has no --default-signal (coreutils < 8.31)"
	mkdir pids
	# A background job of a non-interactive shell starts with SIGINT
	# ignored; the launcher would (rightly) keep ignoring it.
	env --default-signal=INT "$COMM_CHECK" --nproc 2 --soak 1M --pid-dir pids \
		--timeout "$CHECK_TIMEOUT" >out 2>err &
	local launcher=$!
	background "$launcher"
	wait_for_files 2 pids 30
	local ranks
	ranks="$(pid_of pids 0) $(pid_of pids 1)"
	kill -INT "$launcher"
	wait_pid "$launcher" 20
	[ "$status" -eq 130 ]
	# shellcheck disable=SC2086 # two pids
	assert_gone $ranks
	[ ! -s out ]
	[ "$(cat err)" = 'comm_check: got signal 2 (Interrupt); passing it to 2 ranks' ]
}

# ---- refusals -----------------------------------------------------------------------

@test "srun --mpi=none is refused by every task with a one-line hint" {
	use_slurm SLURM1
	run -1 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		srun --mpi=none -n 2 "$COMM_CHECK" --timeout "$CHECK_TIMEOUT"
	[ -z "$output" ]
	# srun's own report of the failed tasks aside, one line per task.
	run -0 grep -v '^srun: ' <<<"$stderr"
	[ "${#lines[@]}" -eq 2 ]
	local hint="comm_check: this process is one of 2 tasks (SLURM_STEP_NUM_TASKS) but no PMIx server answered: launch with 'srun --mpi=pmix', 'mpirun' or '--nproc', not as separate singletons"
	[ "${lines[0]}" = "$hint" ]
	[ "${lines[1]}" = "$hint" ]
}

@test "a stale PMIX_NAMESPACE without a server is refused with one line" {
	run -1 --separate-stderr env PMIX_NAMESPACE=flow-stale-job PMIX_RANK=0 \
		timeout "$LAUNCH_TIMEOUT" "$COMM_CHECK"
	[ -z "$output" ]
	[ "${#stderr_lines[@]}" -eq 1 ]
	[ "$stderr" = "comm_check: PMIX_NAMESPACE is set ('flow-stale-job') but its PMIx server cannot be reached: a stale launcher environment?" ]
}
