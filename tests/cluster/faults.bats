#!/usr/bin/env bats
# A rank dies (kill -9) or stalls in the middle of a large all-reduce: the
# others must stop within the communicator's deadline, never hang, and say
# which rank it was.  Under flow's --nproc launcher the launcher names it.
# Under srun, on one node and across two, every survivor must notice by
# itself and say so: there is no -K, and Slurm's mpi/pmix plugin only
# cancels the step about a second after a task is killed.  Under mpirun the
# job must end in time.

bats_require_minimum_version 1.5.0
load common

# comm_check's deadline per collective, and what the test adds for the
# launcher to notice and stop the job.
SOAK_TIMEOUT=10
SLACK=8
SOAK=(--soak 64M --pid-dir pids --timeout "$SOAK_TIMEOUT")

setup_file() {
	slurm_up SLURM1 7147
	FLOW_SLURM_SUBNET=10.79.57 slurm_up SLURM2 7157 -n 2
}

teardown_file() {
	slurm_down SLURM1
	slurm_down SLURM2
}

setup() {
	need_comm_check
	cd "$BATS_TEST_TMPDIR"
	mkdir pids
}

teardown() {
	stop_background
}

# soak_start N CMD...: run CMD (a launch of N ranks of comm_check --soak)
# in the background, its output to out and err, and wait until every rank
# is about to start its all-reduces.
soak_start() {
	local n=$1
	shift
	timeout "$LAUNCH_TIMEOUT" "$@" >out 2>err &
	SOAK_JOB=$!
	background "$SOAK_JOB"
	wait_for_files "$n" pids 60
	SOAK_MARK=$(now_ms)
}

# soak_kill VICTIM: kill -9 rank VICTIM a second into the all-reduces.
soak_kill() {
	sleep 1
	kill -KILL "$(pid_of pids "$1")"
	SOAK_MARK=$(now_ms)
}

# soak_end: wait for the job; $status is its exit status.  Fails when it
# is not over within the deadline plus slack of the kill (or of the start
# of the all-reduces).
soak_end() {
	local ended
	wait_pid "$SOAK_JOB" $((SOAK_TIMEOUT + SLACK))
	ended=$(now_ms)
	echo "job ended $((ended - SOAK_MARK)) ms after the mark, status $status"
	[ $((ended - SOAK_MARK)) -lt $(((SOAK_TIMEOUT + SLACK) * 1000)) ]
}

# soak_and_kill N VICTIM CMD...: the three above.
soak_and_kill() {
	local n=$1 victim=$2
	shift 2
	soak_start "$n" "$@"
	soak_kill "$victim"
	soak_end
}

# survivors_name N VICTIM WHAT: the error file err.R of every rank R but
# VICTIM holds the rank's own line saying WHAT about rank VICTIM, and
# nothing else but slurmstepd's report that it ended the step.
survivors_name() {
	local n=$1 victim=$2 what=$3 r mine
	for ((r = 0; r < n; r++)); do
		[ "$r" -ne "$victim" ] || continue
		mine=$(grep -v '^slurmstepd' "err.$r" || true)
		if [ -z "$mine" ]; then
			echo "rank $r said nothing; err.$r:" >&2
			cat "err.$r" >&2
			return 1
		fi
		every_line_matches "^comm_check: rank $r \\([^)]*\\): $what" "$mine"
	done
}

# ---- flow's own launcher ---------------------------------------------------------

@test "the launcher names a rank killed during an all-reduce and stops the rest" {
	soak_and_kill 4 2 "$COMM_CHECK" --nproc 4 "${SOAK[@]}"
	[ "$status" -eq 137 ]
	[ ! -s out ]
	grep -qxE 'comm_check: rank 2 was killed by signal 9 \(Killed\)(; stopping the other [1-3] ranks?)?' err
}

@test "the launcher names rank 0 killed during an all-reduce" {
	soak_and_kill 4 0 "$COMM_CHECK" --nproc 4 "${SOAK[@]}"
	[ "$status" -eq 137 ]
	grep -qxE 'comm_check: rank 0 was killed by signal 9 \(Killed\)(; stopping the other [1-3] ranks?)?' err
}

@test "ranks waiting for a stalled rank time out and name it" {
	soak_start 4 "$COMM_CHECK" --nproc 4 "${SOAK[@]}" --stall-rank 2
	soak_end
	[ "$status" -eq 1 ]
	[ ! -s out ]
	# The first survivor to give up ends the job; the launcher stops the
	# others, which may or may not have said the same by then.
	grep -qE "^comm_check: rank [013] \\([^)]*\\): timed out after $SOAK_TIMEOUT s waiting for rank 2 \\(" err
	grep -qE '^comm_check: rank [013] exited with status 1(; stopping the other [1-3] ranks?)?$' err
}

# ---- Slurm, where each survivor must notice by itself ----------------------------------

@test "every survivor of a rank killed under srun names it" {
	use_slurm SLURM1
	soak_and_kill 4 1 srun --mpi=pmix -n 4 -o out.%t -e err.%t \
		"$COMM_CHECK" "${SOAK[@]}"
	# srun exits with the killed task's 128+9.
	[ "$status" -eq 137 ]
	survivors_name 4 1 "peer rank 1 \\("
}

@test "every survivor of rank 0 killed under srun names it" {
	use_slurm SLURM1
	soak_and_kill 4 0 srun --mpi=pmix -n 4 -o out.%t -e err.%t \
		"$COMM_CHECK" "${SOAK[@]}"
	[ "$status" -eq 137 ]
	survivors_name 4 0 "peer rank 0 \\("
}

@test "every survivor of a rank killed on the other node names it" {
	use_slurm SLURM2
	# Rank 2 is node2's first: ranks 0 and 1 lose it over TCP between
	# the nodes, rank 3 on its own node.
	soak_and_kill 4 2 srun --mpi=pmix -N 2 --ntasks-per-node=2 \
		-o out.%t -e err.%t "$COMM_CHECK" "${SOAK[@]}"
	[ "$status" -eq 137 ]
	survivors_name 4 2 "peer rank 2 \\("
}

@test "every rank waiting for a stalled rank under srun times out and names it" {
	use_slurm SLURM1
	# -W: the stalled rank never ends by itself; srun kills it (so the
	# step's status is 137) a second after the first survivor has ended.
	soak_start 4 srun --mpi=pmix -n 4 -W 1 -o out.%t -e err.%t \
		"$COMM_CHECK" "${SOAK[@]}" --stall-rank 2
	soak_end
	[ "$status" -eq 137 ]
	survivors_name 4 2 "timed out after $SOAK_TIMEOUT s waiting for rank 2 \\("
}

# ---- OpenMPI ----------------------------------------------------------------------------

@test "a rank killed under mpirun ends the job in time" {
	need_mpirun
	soak_and_kill 4 1 mpirun --allow-run-as-root --oversubscribe -n 4 \
		-x LSAN_OPTIONS "$COMM_CHECK" "${SOAK[@]}"
	# mpirun stops the others itself and exits with the victim's 128+9.
	[ "$status" -eq 137 ]
}
