#!/usr/bin/env bats
# Every collective, checked bit for bit by comm_check, under every launcher
# flow supports: its own --nproc, srun --mpi=pmix on one node and across two
# simulated nodes (TCP between network namespaces), mpirun (also with TCP
# forced on one node), and a batch job.

bats_require_minimum_version 1.5.0
load common

setup_file() {
	slurm_up SLURM1 7127
	FLOW_SLURM_SUBNET=10.79.37 slurm_up SLURM2 7137 -n 2
}

teardown_file() {
	slurm_down SLURM1
	slurm_down SLURM2
}

setup() {
	need_comm_check
	cd "$BATS_TEST_TMPDIR"
}

# ---- flow's own launcher ---------------------------------------------------------

@test "comm_check --nproc 2 finds every result right" {
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$COMM_CHECK" --nproc 2 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 2 1 shm
}

@test "comm_check --nproc 3 finds every result right with an odd number of ranks" {
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$COMM_CHECK" --nproc 3 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 3 1 shm
}

@test "comm_check --nproc 4 finds every result right" {
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$COMM_CHECK" --nproc 4 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 4 1 shm
}

@test "flow-bench comm --nproc 3 measures every collective and checks every result" {
	for coll in all_reduce reduce_scatter all_gather all_to_all broadcast; do
		run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
			flow-bench comm "$coll" -b 1K -e 64K -f 8 --iters 2 \
			--warmup 1 --nproc 3
		[ -z "$stderr" ]
		[[ "${lines[0]}" == "# flow-bench comm $coll: 3 ranks on 1 nodes"* ]]
		[ "${lines[${#lines[@]} - 1]}" = "# PASS" ]
		# Three sizes (1K, 8K, 64K), each with no wrong element.
		rows=$(printf '%s\n' "${lines[@]}" | grep -c '^[0-9]')
		[ "$rows" -eq 3 ]
		printf '%s\n' "${lines[@]}" | awk -F'\t' '/^[0-9]/ && $NF != 0 { bad = 1 } END { exit bad }'
	done
}

# ---- Slurm -----------------------------------------------------------------------

@test "srun --mpi=pmix -n 2 on one node finds every result right" {
	use_slurm SLURM1
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		srun --mpi=pmix -n 2 "$COMM_CHECK" --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 2 1 shm
}

@test "srun --mpi=pmix -n 4 on one node finds every result right" {
	use_slurm SLURM1
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		srun --mpi=pmix -n 4 "$COMM_CHECK" --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 4 1 shm
}

@test "srun across two nodes talks TCP and finds every result right" {
	use_slurm SLURM2
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		srun --mpi=pmix -N 2 --ntasks-per-node=2 "$COMM_CHECK" \
		--timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 4 2 tcp
}

@test "a batch job running srun finds every result right" {
	use_slurm SLURM1
	cat >job.sh <<-EOF
		#!/bin/sh
		#SBATCH -n 2
		#SBATCH -o $PWD/job.out
		#SBATCH -e $PWD/job.err
		exec srun "$COMM_CHECK" --timeout $CHECK_TIMEOUT
	EOF
	run -0 sbatch --parsable job.sh
	local id=${output%%;*}
	run -0 sbatch_wait "$id" "$LAUNCH_TIMEOUT"
	[ "$output" = "COMPLETED 0:0" ]
	[ ! -s job.err ]
	run -0 cat job.out
	assert_summary 2 1 shm
}

# ---- OpenMPI -----------------------------------------------------------------------

@test "mpirun -n 4 finds every result right" {
	need_mpirun
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		mpirun --allow-run-as-root --oversubscribe -n 4 -x LSAN_OPTIONS "$COMM_CHECK" \
		--timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 4 1 shm
}

@test "mpirun -n 4 with FLOW_COMM_TRANSPORT=tcp talks TCP on one node" {
	need_mpirun
	run -0 --separate-stderr env FLOW_COMM_TRANSPORT=tcp \
		timeout "$LAUNCH_TIMEOUT" mpirun --allow-run-as-root --oversubscribe -n 4 -x LSAN_OPTIONS -x FLOW_COMM_TRANSPORT \
		"$COMM_CHECK" --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_summary 4 1 tcp
}
