#!/usr/bin/env bats
# flow-train data parallel on several ranks: the same losses as one rank to
# float rounding, the same bits from run to run and from a resume, one line
# naming the rank when one dies, under flow's own launcher and mpirun.

bats_require_minimum_version 1.5.0
load common

MODEL=gpt:layers=2,heads=2,dim=32,vocab=256,seq=32
# Warmup, clipping that clips and two micro-batches per step: every part of
# the step that crosses ranks is exercised.
TRAIN=(--model "$MODEL" --batch 4 --seq-len 32 --grad-accum 2 --steps 20
	--warmup 5 --lr 3e-3 --clip 0.5 --peak-gflops 0 --comm-timeout 20)

setup_file() {
	FLOW_SLURM_SUBNET=10.79.67 slurm_up SLURM2 7167 -n 2
	cd "$BATS_FILE_TMPDIR"
	for i in $(seq 1 3000); do
		printf 'the %s fox jumps over the %s dog, line %d.\n' \
			quick lazy "$i"
	done >corpus.txt
	flow-shard -q -o data --val-tokens 8K corpus.txt
	# The one-rank reference every multi-rank run is held to.
	flow-train "${TRAIN[@]}" --data data >one.tsv
}

teardown_file() {
	slurm_down SLURM2
}

setup() {
	need_pmix_build
	cd "$BATS_TEST_TMPDIR"
	DATA=$BATS_FILE_TMPDIR/data
	ONE=$BATS_FILE_TMPDIR/one.tsv
	# Each rank gets a share of the cores: 2 ranks on 2 cores.
	export OMP_NUM_THREADS=1
}

# step, phase, loss, lr, grad_norm of the table in file $1.
numbers() {
	grep -v '^#' "$1" | tail -n +2 | cut -f1-5
}

# The rows in files $1 and $2 (numbers() output) agree: same steps, phases
# and lr, losses within relative $3.
rows_close() {
	[ "$(wc -l <"$1")" -eq "$(wc -l <"$2")" ] && [ -s "$1" ]
	paste "$1" "$2" | awk -F'\t' -v tol="$3" '
		$1 != $6 || $2 != $7 || $4 != $9 { print "row " NR ": " $0; bad = 1 }
		{ d = $3 - $8; if (d < 0) d = -d; r = d / ($8 < 0 ? -$8 : $8)
		  if (r > tol) { print "step " $1 ": loss " $3 " vs " $8 " (rel " r ")"; bad = 1 }
		  if (r > worst) worst = r }
		END { print "worst relative loss difference " worst; exit bad }'
}

# The 20 steps of table $1 against the one-rank run, within relative $2.
assert_losses_close() {
	numbers "$1" >got.rows
	numbers "$ONE" >want.rows
	[ "$(wc -l <got.rows)" -eq 20 ]
	rows_close got.rows want.rows "$2"
}

@test "flow-train --nproc 2 follows the one-rank losses within 1e-5" {
	run -0 --separate-stderr flow-train --nproc 2 "${TRAIN[@]}" --data "$DATA"
	printf '%s\n' "$output" >two.tsv
	grep -q '^# data parallel over 2 ranks (shm): 2 sequences per rank' two.tsv
	assert_losses_close two.tsv 1e-5
}

@test "flow-train --nproc 4 with grad-accum follows the one-rank losses" {
	run -0 --separate-stderr flow-train --nproc 4 "${TRAIN[@]}" --data "$DATA"
	printf '%s\n' "$output" >four.tsv
	assert_losses_close four.tsv 1e-5
}

@test "flow-train on 2 ranks gives the same bits twice" {
	flow-train --nproc 2 "${TRAIN[@]}" --data "$DATA" >a.tsv
	flow-train --nproc 2 "${TRAIN[@]}" --data "$DATA" >b.tsv
	diff <(numbers a.tsv) <(numbers b.tsv)
}

@test "flow-train on 2 ranks over TCP follows the one-rank losses" {
	FLOW_COMM_TRANSPORT=tcp flow-train --nproc 2 "${TRAIN[@]}" --data "$DATA" >tcp.tsv
	grep -q '^# data parallel over 2 ranks (tcp)' tcp.tsv
	assert_losses_close tcp.tsv 1e-5
}

@test "flow-train on 2 ranks resumes bit for bit, also on one rank" {
	flow-train --nproc 2 "${TRAIN[@]}" --data "$DATA" --ckpt-dir ck --ckpt-every 10 >full.tsv
	flow-train --nproc 2 "${TRAIN[@]}" --data "$DATA" --ckpt-dir ck2 \
		--resume ck/step-00000010 >resumed.tsv
	diff <(numbers full.tsv | tail -n 10) <(numbers resumed.tsv)
	flow-train "${TRAIN[@]}" --data "$DATA" --resume ck/step-00000010 >one-rank.tsv
	numbers one-rank.tsv >got.rows
	numbers "$ONE" | tail -n 10 >want.rows
	rows_close got.rows want.rows 1e-5
}

@test "flow-train refuses a batch that does not split over the ranks" {
	run -2 --separate-stderr flow-train --nproc 3 "${TRAIN[@]}" --data "$DATA"
	[[ "$stderr" == *"flow-train: batch 4 does not split evenly over 3 ranks"* ]]
	# Every rank finds it; the first to give up ends the job (the others
	# may be gone by then).
	[[ "$stderr" == *"flow-train: rank "?" called PMIx_Abort(2, batch 4 does not split evenly over 3 ranks)"* ]]
}

@test "flow-train --nproc: kill -9 of one rank ends the job naming it" {
	flow-train --nproc 2 "${TRAIN[@]}" --steps 100000 --warmup 5 --data "$DATA" \
		>kill.tsv 2>kill.err &
	local launcher=$! victim= i
	for i in $(seq 1 200); do
		victim=$(pgrep -P "$launcher" -f 'flow-train' | sort -n | tail -n 1 || true)
		[ -n "$victim" ] && [ "$(grep -vc '^#' kill.tsv || true)" -gt 3 ] && break
		sleep 0.1
	done
	[ -n "$victim" ]
	kill -9 "$victim"
	local status=0 t0=$SECONDS
	wait "$launcher" || status=$?
	[ "$status" -eq 137 ]
	[ $((SECONDS - t0)) -lt 15 ]
	grep -q '^flow-train: rank [01] was killed by signal 9 (Killed); stopping the other 1 rank$' kill.err
}

@test "flow-train under mpirun matches flow-train --nproc bit for bit" {
	command -v mpirun >/dev/null || skip "mpirun is not installed (openmpi-bin)"
	flow-train --nproc 2 "${TRAIN[@]}" --data "$DATA" >nproc.tsv
	run -0 --separate-stderr timeout 120 mpirun --allow-run-as-root --oversubscribe \
		-x OMP_NUM_THREADS -x LSAN_OPTIONS -n 2 \
		"$(command -v flow-train)" "${TRAIN[@]}" --data "$DATA"
	printf '%s\n' "$output" >mpirun.tsv
	diff <(numbers nproc.tsv) <(numbers mpirun.tsv)
}

@test "flow-train under srun across two simulated nodes follows the one-rank losses" {
	use_slurm SLURM2
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" srun -N 2 --ntasks-per-node=1 \
		--mpi=pmix "$(command -v flow-train)" "${TRAIN[@]}" --data "$DATA"
	printf '%s\n' "$output" >srun.tsv
	grep -q '^# data parallel over 2 ranks (tcp)' srun.tsv
	assert_losses_close srun.tsv 1e-5
}

# ---- from a plan ---------------------------------------------------------------------

# The data-parallel plan of TRAIN's model and batch on $1 ranks, in dp.plan.
dp_plan() {
	flow-plan --model "$MODEL" --mesh "$1" --axes dp --batch 4 --seq-len 32 \
		--grad-accum 2 >dp.plan
}

@test "flow-train --plan of 2 data-parallel ranks equals the same run without a plan" {
	dp_plan 2
	PLAN=(--steps 20 --warmup 5 --lr 3e-3 --clip 0.5 --peak-gflops 0 --comm-timeout 20)
	run -0 --separate-stderr flow-train --nproc 2 --plan dp.plan "${PLAN[@]}" --data "$DATA"
	printf '%s\n' "$output" >plan.tsv
	grep -q '^# plan dp.plan (mesh 2:dp)$' plan.tsv
	flow-train --nproc 2 "${TRAIN[@]}" --data "$DATA" >noplan.tsv
	diff <(numbers plan.tsv) <(numbers noplan.tsv)
	assert_losses_close plan.tsv 1e-5
}

@test "flow-train refuses a plan for another world size, naming its line" {
	dp_plan 2
	run -1 --separate-stderr flow-train --nproc 4 --plan dp.plan --data "$DATA" --steps 2
	[[ "$stderr" == *"flow-train: dp.plan:3: mesh '2:dp' has 2 ranks, not the world size 4"* ]]
}

@test "flow-train refuses a tensor-parallel plan it cannot run yet, naming the axis" {
	flow-plan --model "$MODEL" --mesh 2 --axes tp --batch 4 --seq-len 32 >tp.plan
	run -1 --separate-stderr flow-train --nproc 2 --plan tp.plan --data "$DATA" --steps 2
	[[ "$stderr" == *"flow-train: tp.plan:3: axis 'tp' has 2 ranks: this flow-train runs data-parallel plans only"* ]]
}

@test "flow-train --plan takes the model and batch from the plan only" {
	dp_plan 2
	run -2 --separate-stderr flow-train --plan dp.plan --batch 8 --data "$DATA"
	[ "${stderr_lines[0]}" = "flow-train: --batch comes from the plan: give --plan or it, not both" ]
}
