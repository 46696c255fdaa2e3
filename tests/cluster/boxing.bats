#!/usr/bin/env bats
# The distributed boxing executor (flow_boxing_run) against the reference
# executor, bit for bit, by boxing_check: random shapes, every pair of
# valid nd-SBPs on every 1-D and 2-D mesh of the job (2-D ones row- and
# column-major), under flow's own launcher with 2, 3 and 4 ranks, under
# mpirun, and over TCP.  The 2-D meshes of 4 ranks bring plans with
# send/recv steps, which must run too: nothing may be skipped.  Trials are
# sized to keep the file near 10 s on two busy cores (35 s under ASan).

bats_require_minimum_version 1.5.0
load common

BOXING_CHECK=$top_builddir/tests/cluster/boxing_check

setup() {
	[ -x "$BOXING_CHECK" ] ||
		skip "boxing_check is not built (make tests/cluster/boxing_check)"
	need_pmix_build
	cd "$BATS_TEST_TMPDIR"
}

# The output of the last `run` must be exactly boxing_check's summary line
# for $1 ranks over transport $2, with plans and steps run, nothing skipped
# and nothing wrong; with $3 = send-recv, some of the plans with send/recv
# steps.
assert_boxing_summary() {
	local sr='[0-9]+'
	if [ "${3-}" = send-recv ]; then
		sr='[1-9][0-9]*'
	fi
	local re="^boxing_check: $1 ranks, transport $2: [1-9][0-9]* plans \\($sr send/recv\\), [1-9][0-9]* steps, 0 skipped, 0 wrong\$"
	if [ "${#lines[@]}" -ne 1 ] || ! [[ ${lines[0]} =~ $re ]]; then
		echo "expected one line matching '$re', got:" >&2
		printf '%s\n' "$output" >&2
		return 1
	fi
}

@test "boxing_check --nproc 2 finds every rank's piece right" {
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$BOXING_CHECK" --nproc 2 --trials 500 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_boxing_summary 2 shm
}

@test "boxing_check --nproc 3 finds every rank's piece right on uneven splits" {
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$BOXING_CHECK" --nproc 3 --trials 500 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_boxing_summary 3 shm
}

@test "boxing_check --nproc 4 finds every rank's piece right on meshes 4 and 2x2, send/recv included" {
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		"$BOXING_CHECK" --nproc 4 --trials 100 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_boxing_summary 4 shm send-recv
}

@test "boxing_check under mpirun -n 4 finds every rank's piece right" {
	need_mpirun
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" \
		mpirun --allow-run-as-root --oversubscribe -n 4 -x LSAN_OPTIONS \
		"$BOXING_CHECK" --trials 20 --seed 7 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_boxing_summary 4 shm send-recv
}

@test "boxing_check with FLOW_COMM_TRANSPORT=tcp finds every rank's piece right" {
	run -0 --separate-stderr env FLOW_COMM_TRANSPORT=tcp \
		timeout "$LAUNCH_TIMEOUT" "$BOXING_CHECK" --nproc 4 --trials 20 \
		--seed 11 --timeout "$CHECK_TIMEOUT"
	[ -z "$stderr" ]
	assert_boxing_summary 4 tcp send-recv
}

@test "boxing_check rejects an unknown option with status 2" {
	run -2 --separate-stderr "$BOXING_CHECK" --no-such-option
	[ -z "$output" ]
	[ "${stderr_lines[0]}" = "boxing_check: unknown option '--no-such-option'" ]
}
