#!/usr/bin/env bats
# A rank dies (kill -9) or stalls in the middle of a large all-reduce: the
# others must stop within the communicator's deadline, never hang, and say
# which rank it was.  Under flow's --nproc launcher the launcher names it.
# Under srun, on one node and across two, every survivor must notice by
# itself and say so: there is no -K, and Slurm's mpi/pmix plugin only
# cancels the step about a second after a task is killed.  Under mpirun the
# job must end in time.  The second half does the same to flow-train in the
# middle of training (kill -9, SIGSTOP, a cut link) and requires an exact
# resume, and signals its launcher in the middle of a checkpoint.

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
	cd "$BATS_FILE_TMPDIR"
	fox_corpus 3000 corpus.txt
	flow-shard -q -o data --val-tokens 8K corpus.txt
}

teardown_file() {
	slurm_down SLURM1
	slurm_down SLURM2
}

setup() {
	need_comm_check
	cd "$BATS_TEST_TMPDIR"
	mkdir pids
	RANK_PIDS=()
	CUT_LINK=
}

teardown() {
	local pid
	exec 5<&- 2>/dev/null || true
	if [ -n "$CUT_LINK" ]; then
		ip link set "$CUT_LINK" up 2>/dev/null || true
	fi
	stop_background
	# Ranks of ours a failed test left stopped or running.
	for pid in "${RANK_PIDS[@]}"; do
		[ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$BATS_TEST_TMPDIR" ] || continue
		kill -CONT "$pid" 2>/dev/null || true
		kill -KILL "$pid" 2>/dev/null || true
	done
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

# ---- flow-train: a rank lost in the middle of training ----------------------------------
#
# A tiny GPT on 4 ranks, a checkpoint every 100 steps; once step 300 is
# committed, one rank is killed (-9), stopped (SIGSTOP) or, across two
# simulated nodes, cut off (its node's veth brought down).  Every other rank
# must end within the comm deadline (plus flow-train's 2 s for the others to
# report, plus slack) with a line naming the rank it lost, and --resume
# latest must then give the uninterrupted run's rows bit for bit.

GPT=gpt:layers=2,heads=2,dim=32,vocab=256,seq=32
TRAIN_TIMEOUT=10
STEPS=800
TRAIN=(--model "$GPT" --batch 4 --seq-len 32 --peak-gflops 0 --steps "$STEPS"
	--comm-timeout "$TRAIN_TIMEOUT" --ckpt-dir ck --ckpt-every 100)
TRAIN_SLACK=10

# step, phase, loss, lr, grad_norm of the rows of TSV file $1.
numbers() {
	grep -v '^#' "$1" | tail -n +2 | cut -f1-5
}

# reference NAME CMD...: the uninterrupted run of CMD (a launch of
# flow-train "${TRAIN[@]}"), once per file, in $BATS_FILE_TMPDIR/NAME.tsv;
# prints that path.
reference() {
	local name=$1 ref=$BATS_FILE_TMPDIR/$1.tsv
	shift
	if [ ! -s "$ref" ]; then
		mkdir -p "$BATS_FILE_TMPDIR/$name.run"
		(cd "$BATS_FILE_TMPDIR/$name.run" &&
			timeout "$LAUNCH_TIMEOUT" "$@" >out 2>err) ||
			{ cat "$BATS_FILE_TMPDIR/$name.run/err" >&2; return 1; }
		# Under srun rank 0's rows are in out.0.
		if [ -s "$BATS_FILE_TMPDIR/$name.run/out.0" ]; then
			cp "$BATS_FILE_TMPDIR/$name.run/out.0" "$ref"
		else
			cp "$BATS_FILE_TMPDIR/$name.run/out" "$ref"
		fi
	fi
	[ "$(numbers "$ref" | wc -l)" -eq "$STEPS" ]
	echo "$ref"
}

# train_start CMD...: run CMD (a launch of N ranks of flow-train) in the
# background until step 300 is committed, and find its ranks' pids in
# RANK_PIDS (by PMIX_RANK, among the processes in this test's directory).
train_start() {
	local n=$1 i p r
	shift
	timeout "$LAUNCH_TIMEOUT" "$@" >out 2>err &
	TRAIN_JOB=$!
	background "$TRAIN_JOB"
	for i in $(seq 1 1200); do
		[ -f ck/step-00000300/manifest ] && break
		kill -0 "$TRAIN_JOB" 2>/dev/null || break
		sleep 0.05
	done
	[ -f ck/step-00000300/manifest ]
	for p in $(pgrep -f 'flow-train --model'); do
		[ "$(readlink "/proc/$p/cwd" 2>/dev/null)" = "$PWD" ] || continue
		r=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^PMIX_RANK=//p')
		[ -n "$r" ] && RANK_PIDS[r]=$p
	done
	if [ "${#RANK_PIDS[@]}" -ne "$n" ]; then
		echo "found ${#RANK_PIDS[@]} of $n ranks: ${RANK_PIDS[*]}" >&2
		return 1
	fi
	# Still mid-run, or the fault would come too late.
	[ ! -e "ck/step-$(printf %08d "$STEPS")/manifest" ]
}

# train_end SECONDS: wait for the launch; $status is its exit status.
# Fails when it took SECONDS or more after FAULT_MARK.
train_end() {
	local ended
	wait_pid "$TRAIN_JOB" "$1"
	ended=$(now_ms)
	echo "job ended $((ended - FAULT_MARK)) ms after the fault, status $status"
	[ $((ended - FAULT_MARK)) -lt $(($1 * 1000)) ]
}

# said_by R FILE: rank R's own lines of FILE (not Slurm's, not the
# launcher's).
said_by() {
	grep "^flow-train: rank $1 (" "$2" || true
}

# names_lost N VICTIM WHAT FILE_PREFIX: every rank R of N but VICTIM said
# exactly one line, "flow-train: rank R (host): WHAT" about VICTIM, in
# FILE_PREFIX.R (or in FILE_PREFIX alone, under flow's launcher).
names_lost() {
	local n=$1 victim=$2 what=$3 file r mine
	for ((r = 0; r < n; r++)); do
		[ "$r" -ne "$victim" ] || continue
		file=$4.$r
		[ -e "$file" ] || file=$4
		mine=$(said_by "$r" "$file")
		if [ "$(printf '%s\n' "$mine" | grep -c .)" -ne 1 ]; then
			echo "rank $r: expected one line, got:" >&2
			cat "$file" >&2
			return 1
		fi
		every_line_matches "^flow-train: rank $r \\([^)]*\\): ${what//VICTIM/$victim}" "$mine"
	done
}

# waited_for R FILE: the rank that rank R's time-out line in FILE names.
waited_for() {
	said_by "$1" "$2" | sed -n 's/.*: timed out after [0-9.]* s waiting for rank \([0-9]*\) (.*/\1/p'
}

# resume_exact REF CMD...: CMD --resume latest succeeds, resumes from a
# committed step and prints the rows of REF after it, bit for bit.
resume_exact() {
	local ref=$1 from rows
	shift
	rm -f out out.*
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" "$@" --resume latest
	rows=out
	[ -s out.0 ] && rows=out.0
	[ -s "$rows" ] || { printf '%s\n' "$output" >out && rows=out; }
	from=$(sed -n 's/^# resumed from ck\/step-[0-9]* (step \([0-9]*\))$/\1/p' "$rows")
	echo "resumed from step $from"
	[ -n "$from" ] && [ "$from" -ge 300 ] && [ $((from % 100)) -eq 0 ]
	diff <(numbers "$ref" | tail -n +"$((from + 1))") <(numbers "$rows")
}

@test "flow-train --nproc 4: a rank killed mid-training is named, --resume latest continues exactly" {
	local ref
	ref=$(reference nproc4 flow-train --nproc 4 "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data")
	train_start 4 flow-train --nproc 4 "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
	kill -KILL "${RANK_PIDS[2]}"
	FAULT_MARK=$(now_ms)
	train_end $((TRAIN_TIMEOUT + TRAIN_SLACK))
	[ "$status" -eq 137 ]
	grep -qxE 'flow-train: rank 2 was killed by signal 9 \(Killed\)(; stopping the other [1-3] ranks?)?' err
	# Survivors that spoke before the launcher stopped them named rank 2.
	every_line_matches '^flow-train: (rank 2 was killed by signal 9 .*|rank [013] \([^)]*\): peer rank 2 \(.*\) (died|closed the connection) during .*)$' "$(cat err)"
	# shellcheck disable=SC2086
	assert_gone ${RANK_PIDS[*]}
	assert_no_temporaries_under ck
	resume_exact "$ref" flow-train --nproc 4 "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
}

@test "flow-train --nproc 4: a stopped rank is named by every other rank within the deadline, resume exact" {
	local ref
	ref=$(reference nproc4 flow-train --nproc 4 "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data")
	train_start 4 flow-train --nproc 4 "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
	kill -STOP "${RANK_PIDS[1]}"
	FAULT_MARK=$(now_ms)
	train_end $((TRAIN_TIMEOUT + TRAIN_SLACK))
	[ "$status" -eq 1 ]
	# On one node every waiting rank sees who is behind.
	names_lost 4 1 "timed out after $TRAIN_TIMEOUT s waiting for rank VICTIM \\(" err
	grep -qE "^flow-train: rank [023] called PMIx_Abort\\(1, rank [023] \\([^)]*\\): timed out after $TRAIN_TIMEOUT s waiting for rank 1 " err
	# The launcher's SIGTERM and SIGCONT ended the stopped rank too.
	# shellcheck disable=SC2086
	assert_gone ${RANK_PIDS[*]}
	assert_no_temporaries_under ck
	resume_exact "$ref" flow-train --nproc 4 "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
}

# No temporary of an atomic write (*.tmp.<pid>) anywhere under $1.
assert_no_temporaries_under() {
	local left
	left=$(find "$1" -name '*.tmp.*')
	if [ -n "$left" ]; then
		echo "left behind: $left" >&2
		return 1
	fi
}

SRUN2=(srun --mpi=pmix -N 2 --ntasks-per-node=2 -o out.%t -e err.%t)

@test "srun on two nodes: a rank killed mid-training is named by every other rank, resume exact" {
	use_slurm SLURM2
	local ref
	ref=$(reference srun2 "${SRUN2[@]}" flow-train "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data")
	train_start 4 "${SRUN2[@]}" flow-train "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
	# Rank 2 is node2's first: ranks 0 and 1 lose it over TCP, rank 3 on
	# its own node.
	kill -KILL "${RANK_PIDS[2]}"
	FAULT_MARK=$(now_ms)
	train_end $((TRAIN_TIMEOUT + TRAIN_SLACK))
	[ "$status" -eq 137 ]
	names_lost 4 2 "peer rank VICTIM \\([^)]*\\) (died|closed the connection) during " err
	# shellcheck disable=SC2086
	assert_gone ${RANK_PIDS[*]}
	resume_exact "$ref" "${SRUN2[@]}" flow-train "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
}

# waits_lead_to VICTIMS FILE_PREFIX RANKS...: each of RANKS timed out
# (one line in FILE_PREFIX.R) waiting for a rank of VICTIMS (a regular
# expression of rank numbers), or for a rank that itself waited, through
# any number of such steps, for one of VICTIMS.  Across nodes a rank only
# knows whom it waits for; the chain of waits names the lost rank.
waits_lead_to() {
	local victims=$1 prefix=$2 r w hops
	shift 2
	for r; do
		w=$r
		for hops in 1 2 3 4; do
			w=$(waited_for "$w" "$prefix.$w")
			if [ -z "$w" ]; then
				echo "rank $r: the chain of waits breaks; err files:" >&2
				tail -n 3 "$prefix".* >&2
				return 1
			fi
			[[ $w =~ ^($victims)$ ]] && continue 2
		done
		echo "rank $r: waits lead nowhere near rank $victims" >&2
		return 1
	done
}

@test "srun on two nodes: a stopped rank is found by every other rank within the deadline, resume exact" {
	use_slurm SLURM2
	local ref
	ref=$(reference srun2 "${SRUN2[@]}" flow-train "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data")
	train_start 4 "${SRUN2[@]}" flow-train "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
	kill -STOP "${RANK_PIDS[2]}"
	FAULT_MARK=$(now_ms)
	train_end $((TRAIN_TIMEOUT + TRAIN_SLACK))
	# Slurm kills what is left, the stopped rank included.
	[ "$status" -ne 0 ]
	names_lost 4 2 "timed out after $TRAIN_TIMEOUT s waiting for rank [0-9] \\(" err
	waits_lead_to 2 err 0 1 3
	# shellcheck disable=SC2086
	assert_gone ${RANK_PIDS[*]}
	resume_exact "$ref" "${SRUN2[@]}" flow-train "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
}

@test "srun on two nodes: ranks cut off by a link going down are named in time, resume exact" {
	use_slurm SLURM2
	need_cmd ip
	local link i ref
	link=$(sed -n 's/^link //p' "$SLURM2_STATE/netns" 2>/dev/null)
	[ -n "$link" ] || skip "the two-node cluster runs in ports mode: there is no link to cut"
	# node2's veth on the bridge (slurm-up.sh: fs<PORT>v<i>).
	link=${link%br}v2
	ref=$(reference srun2 "${SRUN2[@]}" flow-train "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data")
	train_start 4 "${SRUN2[@]}" flow-train "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
	CUT_LINK=$link
	ip link set "$link" down
	FAULT_MARK=$(now_ms)
	# The ranks on node1 must be gone within the deadline by themselves;
	# srun cannot reach node2 until the link is back.
	for ((i = 0; i < (TRAIN_TIMEOUT + TRAIN_SLACK) * 20; i++)); do
		assert_gone "${RANK_PIDS[0]}" "${RANK_PIDS[1]}" 2>/dev/null && break
		sleep 0.05
	done
	echo "node1's ranks ended $(($(now_ms) - FAULT_MARK)) ms after the cut"
	assert_gone "${RANK_PIDS[0]}" "${RANK_PIDS[1]}"
	ip link set "$link" up
	CUT_LINK=
	wait_pid "$TRAIN_JOB" "$LAUNCH_TIMEOUT"
	[ "$status" -ne 0 ]
	# node2's ranks end too, once Slurm reaches them again.
	for ((i = 0; i < LAUNCH_TIMEOUT * 20; i++)); do
		assert_gone ${RANK_PIDS[*]} 2>/dev/null && break
		sleep 0.05
	done
	# node1's ranks name ranks on node2, and node2's ranks those on node1.
	names_lost 4 -1 "timed out after $TRAIN_TIMEOUT s waiting for rank [0-9] \\(" err
	waits_lead_to '2|3' err 0 1
	waits_lead_to '0|1' err 2 3
	# shellcheck disable=SC2086
	assert_gone ${RANK_PIDS[*]}
	# A node that missed its pings comes back once the link does.
	for ((i = 0; i < 600; i++)); do
		case $(sinfo -h -n node2 -o %t) in
		idle | mix | alloc) break ;;
		down*) scontrol update NodeName=node2 State=RESUME 2>/dev/null || true ;;
		esac
		sleep 0.1
	done
	resume_exact "$ref" "${SRUN2[@]}" flow-train "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
}

# ---- flow-train: SIGINT and SIGTERM to the launcher during a checkpoint ---------------

@test "flow-train --nproc 2: SIGINT or SIGTERM mid-checkpoint is passed on, 128+N, no temporary, resume exact" {
	env --default-signal=INT true 2>/dev/null ||
		skip "env has no --default-signal (coreutils < 8.31)"
	local ref sig num fifo st
	ref=$(reference nproc2 flow-train --nproc 2 "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data")
	for sig in INT TERM; do
		rm -rf ck
		RANK_PIDS=()
		# A background job of a non-interactive shell starts with SIGINT
		# ignored; the launcher would (rightly) keep ignoring it.
		train_start 2 env --default-signal=INT \
			flow-train --nproc 2 "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
		# Rank 0 writes the checkpoints: make the temporary of its step
		# 500 a FIFO held open unread, and wait until it writes into it.
		fifo=ck/step-00000500/rank-00000.bin.tmp.${RANK_PIDS[0]}
		mkdir -p ck/step-00000500
		mkfifo "$fifo"
		exec 5<>"$fifo"
		for _ in $(seq 1 600); do
			read -r -t 0 -u 5 && break
			sleep 0.05
		done
		read -r -t 0 -u 5
		kill -"$sig" "$TRAIN_JOB"
		FAULT_MARK=$(now_ms)
		train_end $((TRAIN_SLACK))
		exec 5<&-
		num=$(kill -l "$sig")
		[ "$status" -eq $((128 + num)) ]
		[ "$(cat err)" = "flow-train: got signal $num ($([ "$sig" = INT ] && echo Interrupt || echo Terminated)); passing it to 2 ranks" ]
		# shellcheck disable=SC2086
		assert_gone ${RANK_PIDS[*]}
		[ ! -e "$fifo" ]
		assert_no_temporaries_under ck
		[ ! -e ck/step-00000500/manifest ]
		resume_exact "$ref" flow-train --nproc 2 "${TRAIN[@]}" --data "$BATS_FILE_TMPDIR/data"
	done
}
