#!/usr/bin/env bats
# flow-train data parallel on several ranks: the same losses as one rank to
# float rounding, the same bits from run to run and from a resume, one line
# naming the rank when one dies, under flow's own launcher and mpirun.

bats_require_minimum_version 1.5.0
load common

MODEL=gpt:layers=2,heads=2,dim=32,vocab=256,seq=32
# Warmup, clipping that clips and two micro-batches per step: every part of
# the step that crosses ranks is exercised.
# RUN: what a plan leaves to the command line.
RUN=(--steps 20 --warmup 5 --lr 3e-3 --clip 0.5 --peak-gflops 0 --comm-timeout 20)
TRAIN=(--model "$MODEL" --batch 4 --seq-len 32 --grad-accum 2 "${RUN[@]}")

setup_file() {
	FLOW_SLURM_SUBNET=10.79.67 slurm_up SLURM2 7167 -n 2
	cd "$BATS_FILE_TMPDIR"
	fox_corpus 3000 corpus.txt
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

@test "overlapped gradient sums (--bucket-mb) give the bits of summing after the pass" {
	for mb in 0 0.002 25; do
		run -0 --separate-stderr flow-train --nproc 2 "${TRAIN[@]}" --steps 6 \
			--data "$DATA" --bucket-mb "$mb"
		printf '%s\n' "$output" >"bucket-$mb.tsv"
		numbers "bucket-$mb.tsv" >"bucket-$mb.rows"
	done
	run ! grep -q 'overlap' bucket-0.tsv
	grep -Eq '^# gradient sums overlap the backward pass: [0-9]{2,} buckets' bucket-0.002.tsv
	grep -q '^# gradient sums overlap the backward pass: 1 buckets' bucket-25.tsv
	[ "$(wc -l <bucket-0.rows)" -eq 6 ]
	cmp bucket-0.rows bucket-0.002.rows
	cmp bucket-0.rows bucket-25.rows
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
	grep -qE '^flow-train: rank [01] was killed by signal 9 \(Killed\)(; stopping the other 1 rank)?$' kill.err
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
	run -0 --separate-stderr flow-train --nproc 2 --plan dp.plan "${RUN[@]}" --data "$DATA"
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

@test "flow-train refuses ZeRO together with tensor parallelism, naming the line" {
	flow-plan --model "$MODEL" --mesh 2x2 --axes dp,tp --batch 4 --seq-len 32 --zero 1 >zt.plan
	run -1 --separate-stderr flow-train --nproc 4 --plan zt.plan --data "$DATA" --steps 2
	printf '%s\n' "$stderr" | grep -Eq "^flow-train: zt.plan:[0-9]+: 'adamw.m/wte' is split on dp: this flow-train runs ZeRO only when dp is the only axis above size 1\$"
}

@test "flow-train refuses a plan whose mesh cannot split a dimension, naming its line" {
	# 2 heads cannot be split over 3 ranks.
	flow-plan --model "$MODEL" --mesh 3 --axes tp --batch 4 --seq-len 32 |
		sed 's/^tensor h.0.attn.lse saved (B)$/tensor h.0.attn.lse saved (S(1))/' >e.plan
	run -1 --separate-stderr flow-train --nproc 3 --plan e.plan --data "$DATA" --steps 2
	printf '%s\n' "$stderr" | grep -Fxq "flow-train: e.plan:74: tensor 'h.0.attn.lse': (S(1)) on 3:tp: dimension 1 of (4,2,32) has 2 elements left for 3 ranks of axis 'tp'"
}

@test "flow-train --plan takes the model and batch from the plan only" {
	dp_plan 2
	run -2 --separate-stderr flow-train --plan dp.plan --batch 8 --data "$DATA"
	[ "${stderr_lines[0]}" = "flow-train: --batch comes from the plan: give --plan or it, not both" ]
}

# ---- ZeRO: optimizer state, gradients and parameters sharded on dp ------------------

# The attention key bias (elements C..2C of c_attn.bias, C = 32) has a zero
# gradient in exact arithmetic: a bias on every key adds the same amount to
# each logit of a row, which softmax ignores.  Its values are rounding
# noise that Adam turns into full-size steps, so they are left out of the
# parameter comparison, and so are their moments.
KEY_BIAS=()
for i in 0 1; do
	for p in "" adamw.m/ adamw.v/; do
		KEY_BIAS+=("${p}h.$i.attn.c_attn.bias:32:64")
	done
done

# plan_run NAME NPROC BATCH FLOW-PLAN-OPTIONS...: the standard plan of
# MODEL (global batch BATCH, seq-len 32, grad-accum 2) in NAME.plan, then
# its 20 steps on NPROC ranks with a checkpoint every 10 steps in
# ck-NAME; the rows in NAME.tsv.
plan_run() {
	local name=$1 n=$2 batch=$3
	shift 3
	flow-plan --model "$MODEL" --batch "$batch" --seq-len 32 --grad-accum 2 "$@" >"$name.plan"
	run -0 --separate-stderr flow-train --nproc "$n" --plan "$name.plan" "${RUN[@]}" \
		--data "$DATA" --ckpt-dir "ck-$name" --ckpt-every 10
	printf '%s\n' "$output" >"$name.tsv"
}

# The one-rank run with a checkpoint of its step 20, made once.
one_rank_ckpt() {
	if [ ! -f "$BATS_FILE_TMPDIR/ck1/step-00000020/manifest" ]; then
		flow-train "${TRAIN[@]}" --data "$DATA" --ckpt-dir "$BATS_FILE_TMPDIR/ck1" >/dev/null
	fi
	ONE_CKPT=$BATS_FILE_TMPDIR/ck1/step-00000020
}

# The run NAME of plan_run (batch 4) against one rank: the losses, and the
# parameters and moments after 20 steps, within 1e-5.
assert_parity() {
	one_rank_ckpt
	assert_losses_close "$1.tsv" 1e-5
	"$CKPT_CLOSE" "$ONE_CKPT" "ck-$1/step-00000020" 1e-5 "${KEY_BIAS[@]}"
}

# ZeRO stage $1 on 4 ranks, in zero$1: parity, each rank writing its own
# shards.
assert_zero_parity() {
	plan_run "zero$1" 4 4 --mesh 4 --axes dp --zero "$1"
	grep -q "^# zero over 4 ranks: 28 of 28 parameters' moments" "zero$1.tsv"
	assert_parity "zero$1"
	[ "$(ls "ck-zero$1"/step-00000020/*.bin | wc -l)" -eq 4 ]
}

@test "ZeRO 1 on 4 ranks: the one-rank losses and parameters" {
	assert_zero_parity 1
	grep -q "28 of 28 parameters' moments, 0 gradients, 0 parameters sharded" zero1.tsv
	grep -q '^tensor adamw.m/wte f32 (256,32) 4 (S(0))$' ck-zero1/step-00000020/manifest
	grep -q '^tensor wte f32 (256,32) 1 (B)$' ck-zero1/step-00000020/manifest
}

@test "ZeRO 2 on 4 ranks: the one-rank losses and parameters" {
	assert_zero_parity 2
	grep -q "28 of 28 parameters' moments, 28 gradients, 0 parameters sharded" zero2.tsv
}

@test "ZeRO 3 on 4 ranks: the one-rank losses and parameters" {
	assert_zero_parity 3
	grep -q "28 of 28 parameters' moments, 28 gradients, 28 parameters sharded" zero3.tsv
	grep -q '^tensor wte f32 (256,32) 4 (S(0))$' ck-zero3/step-00000020/manifest
	grep -q '^shard wte 3 192:256,0:32 rank-00003.bin ' ck-zero3/step-00000020/manifest
}

@test "ZeRO 3 on 3 ranks: uneven shards follow the one-rank run of the same batch" {
	# Batch 6 over 3 ranks; 256, 128, 96 and 32 rows do not split in 3.
	flow-train "${TRAIN[@]}" --batch 6 --data "$DATA" --ckpt-dir ck6 >one6.tsv
	plan_run uneven 3 6 --mesh 3 --axes dp --zero 3
	grep -q '^shard wte 0 0:86,0:32 rank-00000.bin ' ck-uneven/step-00000020/manifest
	grep -q '^shard wte 2 171:256,0:32 rank-00002.bin ' ck-uneven/step-00000020/manifest
	numbers uneven.tsv >got.rows
	numbers one6.tsv >want.rows
	rows_close got.rows want.rows 1e-5
	"$CKPT_CLOSE" ck6/step-00000020 ck-uneven/step-00000020 1e-5 "${KEY_BIAS[@]}"
}

@test "ZeRO 2 resumes bit for bit on its plan, and on one rank without it" {
	plan_run zero2 4 4 --mesh 4 --axes dp --zero 2
	run -0 --separate-stderr flow-train --nproc 4 --plan zero2.plan "${RUN[@]}" \
		--data "$DATA" --resume ck-zero2/step-00000010
	printf '%s\n' "$output" >resumed.tsv
	diff <(numbers zero2.tsv | tail -n 10) <(numbers resumed.tsv)
	# The shards assemble into whole tensors for a run laid out otherwise.
	flow-train "${TRAIN[@]}" --data "$DATA" --resume ck-zero2/step-00000010 >one-rank.tsv
	numbers one-rank.tsv >got.rows
	numbers "$ONE" | tail -n 10 >want.rows
	rows_close got.rows want.rows 1e-5
}

# Train from plan $1 on $2 ranks with a checkpoint every 2 steps, kill -9
# one rank at an arbitrary moment after the first checkpoint (mid-step,
# mid-write or mid-commit), relaunch with --resume latest: the steps after
# the checkpoint must be those of the uninterrupted run in $3, bit for bit.
kill_and_resume() {
	local plan=(--plan "$1" "${RUN[@]}" --data "$DATA" --ckpt-dir ck --ckpt-every 2)
	rm -rf ck
	flow-train --nproc "$2" "${plan[@]}" >killed.tsv 2>killed.err &
	local launcher=$! victim= killed= i status=0 from
	for i in $(seq 1 300); do
		[ -f ck/step-00000002/manifest ] && break
		sleep 0.02
	done
	sleep "0.0$((RANDOM % 10))"
	# The rank drawn may exit between pgrep and kill (the run ending):
	# draw again from those left.
	for i in 1 2 3 4; do
		victim=$(pgrep -P "$launcher" -f 'flow-train' | shuf -n 1 || true)
		[ -n "$victim" ] || break
		kill -9 "$victim" 2>/dev/null && killed=1 && break
	done
	[ -n "$killed" ] || skip "the run ended before a rank could be killed"
	wait "$launcher" || status=$?
	# kill succeeds on a rank that has already exited and not yet been
	# reaped (pgrep matches it by name): then the run is whole, every
	# row the uninterrupted run's, and there is nothing to resume.  A
	# run cut short must not end well.
	if [ "$status" -eq 0 ]; then
		diff <(numbers "$3") <(numbers killed.tsv)
		skip "the rank killed had already finished"
	fi
	run -0 --separate-stderr flow-train --nproc "$2" "${plan[@]}" --resume latest
	printf '%s\n' "$output" >resumed.tsv
	from=$(sed -n 's/^# resumed from .* (step \([0-9]*\))$/\1/p' resumed.tsv)
	[ -n "$from" ] && [ "$from" -ge 2 ]
	diff <(numbers "$3" | tail -n $((20 - from))) <(numbers resumed.tsv)
}

@test "ZeRO 3: kill -9 of a rank, then --resume latest reproduces the run bit for bit" {
	plan_run zero3 4 4 --mesh 4 --axes dp --zero 3
	kill_and_resume zero3.plan 4 zero3.tsv
}

@test "a ZeRO checkpoint missing a rank's shards is refused in one line" {
	plan_run zero1 4 4 --mesh 4 --axes dp --zero 1
	rm ck-zero1/step-00000010/rank-00002.bin
	run -1 --separate-stderr flow-train --nproc 4 --plan zero1.plan "${RUN[@]}" --data "$DATA" \
		--resume ck-zero1/step-00000010
	# Every rank finds it (their lines may come in any order with the
	# launcher's).
	printf '%s\n' "$stderr" >&2
	printf '%s\n' "$stderr" | grep -Eq "^flow-train: ck-zero1/step-00000010/manifest:[0-9]+: shard file 'ck-zero1/step-00000010/rank-00002.bin' is missing\$"
	# The checkpoint that is whole still resumes.
	flow-train --nproc 4 --plan zero1.plan "${RUN[@]}" --data "$DATA" \
		--resume ck-zero1/step-00000020 >/dev/null
}

# ---- tensor parallelism: Megatron layouts on tp, alone and with dp --------------------

@test "tensor parallel on 2 ranks: the one-rank losses and parameters" {
	plan_run tp2 2 4 --mesh 2 --axes tp
	grep -q '^# sharded over mesh 2:tp (shm): each rank runs its shards, with [0-9]* boxing ops' tp2.tsv
	assert_parity tp2
	# The vocabulary-parallel embedding: wte's rows split over tp.
	grep -q '^tensor wte f32 (256,32) 2 (S(0))$' ck-tp2/step-00000020/manifest
	grep -q '^tensor h.0.mlp.c_proj.weight f32 (32,128) 2 (S(1))$' ck-tp2/step-00000020/manifest
}

@test "2x2 mesh, data and tensor parallel: the one-rank losses and parameters" {
	plan_run mesh22 4 4 --mesh 2x2 --axes dp,tp
	grep -q '^# data parallel over 2 ranks' mesh22.tsv
	grep -q '^# sharded over mesh 2x2:dp,tp' mesh22.tsv
	assert_parity mesh22
	grep -q '^tensor wte f32 (256,32) 2x2 (B,S(0))$' ck-mesh22/step-00000020/manifest
}

# --kernels staged: the CPU kernels through every copy a GPU run makes
# (flow/exec.h, flow_exec_storage_staged): ZeRO's staging, and the boxing
# and split cross-entropy of a 2x2 mesh both ways a GPU runs them, in
# place on the device's memory (its scratch, zeroing, copies and moves
# through the storage and the kernel set, as over NCCL) and, with
# --comm cpu, on host copies; all give the CPU run's bits.
@test "the GPU's staging paths on the CPU: ZeRO 3 on 2 ranks and a 2x2 mesh, in place and with --comm cpu, give --kernels cpu's bits" {
	for mesh in zero3:2:"--mesh 2 --axes dp --zero 3" mesh22:4:"--mesh 2x2 --axes dp,tp" \
		mesh22-bf16:4:"--mesh 2x2 --axes dp,tp --precision bf16"; do
		name=${mesh%%:*} rest=${mesh#*:}
		n=${rest%%:*} args=${rest#*:}
		# shellcheck disable=SC2086
		flow-plan --model "$MODEL" --batch 4 --seq-len 32 --grad-accum 2 $args >"$name.plan"
		for k in cpu staged staged-host; do
			how=(--kernels "${k%-host}")
			[ "$k" != staged-host ] || how+=(--comm cpu)
			run -0 --separate-stderr flow-train --nproc "$n" --plan "$name.plan" "${RUN[@]}" \
				--steps 6 --data "$DATA" "${how[@]}" --ckpt-dir "ck-$name-$k" --ckpt-every 3
			printf '%s\n' "$output" | numbers /dev/stdin >"$name-$k.rows"
		done
		[ "$(wc -l <"$name-cpu.rows")" -eq 6 ]
		for k in staged staged-host; do
			cmp "$name-cpu.rows" "$name-$k.rows"
			cmp "ck-$name-cpu/step-00000006/rank-00000.bin" "ck-$name-$k/step-00000006/rank-00000.bin"
		done
	done
}

# bf16 activations (flow-train --precision bf16): a 2x2 mesh boxes bf16
# activations (the all-reduces of the row-parallel matmuls' partial sums
# among them, which round each partial to bf16) and splits the
# cross-entropy over bf16 logits, so it is not the one-rank run's bits but
# within bf16 rounding noise of its losses: measured 3e-5 relative at
# worst over the 20 steps, held to 3e-4.
@test "bf16 activations on a 2x2 mesh follow the one-rank bf16 losses" {
	flow-train "${TRAIN[@]}" --data "$DATA" --precision bf16 >one-bf16.tsv
	plan_run mesh22-bf16 4 4 --mesh 2x2 --axes dp,tp --precision bf16
	grep -q '^# kernels cpu, precision bf16,' mesh22-bf16.tsv
	numbers mesh22-bf16.tsv >got.rows
	numbers one-bf16.tsv >want.rows
	[ "$(wc -l <got.rows)" -eq 20 ]
	rows_close got.rows want.rows 3e-4
	# And the run was bf16: not the numbers of the fp32 one.
	! numbers "$ONE" | cmp -s - want.rows
}

@test "tensor parallel on 3 ranks: dimensions the mesh does not divide" {
	# 256 vocabulary rows, 128 MLP rows and 32 columns over 3 ranks.
	plan_run tp3 3 4 --mesh 3 --axes tp
	assert_parity tp3
	grep -q '^shard wte 0 0:86,0:32 rank-00000.bin ' ck-tp3/step-00000020/manifest
	grep -q '^shard h.0.mlp.c_fc.weight 2 86:128,0:32 rank-00002.bin ' ck-tp3/step-00000020/manifest
}

@test "2x2 mesh: kill -9 of a rank, then --resume latest reproduces the run bit for bit" {
	plan_run full 4 4 --mesh 2x2 --axes dp,tp
	kill_and_resume full.plan 4 full.tsv
}

@test "a 2x2 checkpoint resumes on one rank without a plan" {
	plan_run m 4 4 --mesh 2x2 --axes dp,tp
	flow-train "${TRAIN[@]}" --data "$DATA" --resume ck-m/step-00000010 >one-rank.tsv
	numbers one-rank.tsv >got.rows
	numbers "$ONE" | tail -n 10 >want.rows
	rows_close got.rows want.rows 1e-5
}

@test "a 2x2 plan under mpirun and under srun across two nodes" {
	flow-plan --model "$MODEL" --mesh 2x2 --axes dp,tp --batch 4 --seq-len 32 --grad-accum 2 >m.plan
	PLAN=(--plan m.plan "${RUN[@]}" --data "$DATA")
	flow-train --nproc 4 "${PLAN[@]}" >nproc.tsv
	if command -v mpirun >/dev/null; then
		run -0 --separate-stderr timeout 120 mpirun --allow-run-as-root --oversubscribe \
			-x OMP_NUM_THREADS -x LSAN_OPTIONS -n 4 "$(command -v flow-train)" "${PLAN[@]}"
		printf '%s\n' "$output" >mpirun.tsv
		diff <(numbers nproc.tsv) <(numbers mpirun.tsv)
	fi
	use_slurm SLURM2
	run -0 --separate-stderr timeout "$LAUNCH_TIMEOUT" srun -N 2 --ntasks-per-node=2 \
		--mpi=pmix "$(command -v flow-train)" "${PLAN[@]}"
	printf '%s\n' "$output" >srun.tsv
	grep -q '^# sharded over mesh 2x2:dp,tp (tcp)' srun.tsv
	assert_losses_close srun.tsv 1e-5
}

@test "examples/train-2d.sbatch trains on a 2x2 mesh across two nodes, and resumes" {
	use_slurm SLURM2
	cp "$BATS_FILE_TMPDIR/corpus.txt" .
	# The settings through the environment (--export=ALL): a model spec
	# has commas, which --export=NAME=VALUE lists cannot hold.
	local env=(FLOW_BIN="$(dirname "$(command -v flow-train)")" CORPUS=corpus.txt
		MODEL="$MODEL" SEQ_LEN=32 BATCH=4 STEPS=4 CKPT_EVERY=2 TP=2 RUN="$PWD/run")
	run -0 env "${env[@]}" sbatch --parsable --export=ALL "$top_srcdir/examples/train-2d.sbatch"
	local id=${output%%;*}
	run -0 sbatch_wait "$id" "$LAUNCH_TIMEOUT"
	[ "$output" = "COMPLETED 0:0" ] || { cat flow-train-2d-*.out; false; }
	grep -q '^mesh 2x2:dp,tp$' run/train.plan
	grep -q '^# sharded over mesh 2x2:dp,tp (tcp)' run/train.tsv
	[ "$(grep -c $'^[0-9]*\ttrain\t' run/train.tsv)" -eq 4 ]
	[ -f run/ckpt/step-00000004/manifest ]
	# Submitted again, it resumes from the latest checkpoint: nothing left.
	run -0 env "${env[@]}" sbatch --parsable --export=ALL "$top_srcdir/examples/train-2d.sbatch"
	id=${output%%;*}
	run -0 sbatch_wait "$id" "$LAUNCH_TIMEOUT"
	[ "$output" = "COMPLETED 0:0" ]
	grep -q '^# resumed from .*step-00000004 (step 4)$' run/train.tsv
}
