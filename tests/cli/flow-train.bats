#!/usr/bin/env bats
# flow-train on one rank: options and usage errors, the TSV it writes, a
# loss that falls, checkpoints, exact resume (also after kill -9), and the
# one-line errors of bad data and damaged checkpoints.

bats_require_minimum_version 1.5.0
load common

# Small enough that a step takes milliseconds on any machine.
MODEL=gpt:layers=2,heads=2,dim=32,vocab=256,seq=32
TRAIN=(--model "$MODEL" --batch 4 --seq-len 32 --peak-gflops 0)

setup_file() {
	cd "$BATS_FILE_TMPDIR"
	# A byte-level corpus with structure to learn, the same everywhere.
	fox_corpus 3000 corpus.txt
	flow-shard -q -o data --val-tokens 8K corpus.txt
}

setup() {
	cd "$BATS_TEST_TMPDIR"
	DATA=$BATS_FILE_TMPDIR/data
}

# The loss column of the train rows of the output in $1.
train_losses() {
	tsv_rows "$1" | awk -F'\t' '$2 == "train" { print $3 }'
}

# ---- help, version, usage errors ----------------------------------------------

@test "flow-train --help prints the usage on stdout and exits 0" {
	run -0 --separate-stderr flow-train --help
	[ -z "$stderr" ]
	[ "${lines[0]}" = "Usage: flow-train --model SPEC --data DIR [options]" ]
	[[ "$output" == *"--resume CKPT"* ]]
	[[ "$output" == *"--grad-accum K"* ]]
}

@test "flow-train --version prints the version" {
	run -0 --separate-stderr flow-train --version
	[[ "${lines[0]}" =~ ^flow-train\ [0-9]+\.[0-9]+\.[0-9]+$ ]]
}

@test "flow-train without --model is a usage error" {
	run -2 --separate-stderr flow-train --data "$DATA"
	assert_usage_error flow-train "missing --model SPEC"
}

@test "flow-train without --data is a usage error" {
	run -2 --separate-stderr flow-train --model "$MODEL"
	assert_usage_error flow-train "missing --data DIR"
}

@test "flow-train rejects a model spec with an unknown key" {
	run -2 --separate-stderr flow-train --model gpt:layers=2,heads=2,dim=32,vocab=256,seq=32,depth=3 --data "$DATA"
	assert_usage_error flow-train "--model: model spec 'gpt:layers=2,heads=2,dim=32,vocab=256,seq=32,depth=3': unknown key 'depth'"
}

@test "flow-train rejects an unknown model" {
	run -2 --separate-stderr flow-train --model bert-base --data "$DATA"
	assert_usage_error flow-train "unknown model 'bert-base'"
}

@test "flow-train rejects heads that do not divide dim" {
	run -2 --separate-stderr flow-train --model gpt:layers=1,heads=3,dim=32,vocab=256,seq=32 --data "$DATA"
	assert_usage_error flow-train "dim 32 is not a multiple of heads 3"
}

@test "flow-train rejects a spec missing a size" {
	run -2 --separate-stderr flow-train --model gpt:layers=1,heads=2,dim=32,seq=32 --data "$DATA"
	assert_usage_error flow-train "missing vocab"
}

@test "flow-train rejects a bad number" {
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --lr fast
	assert_usage_error flow-train "--lr"
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --batch 0
	assert_usage_error flow-train "--batch"
}

@test "flow-train rejects a sequence longer than the model's context" {
	run -2 --separate-stderr flow-train --model "$MODEL" --data "$DATA" --seq-len 64
	assert_usage_error flow-train "--seq-len 64 is longer than the model's context (seq=32)"
}

@test "flow-train rejects options that need another" {
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --ckpt-every 5
	assert_usage_error flow-train "--ckpt-every needs --ckpt-dir"
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --resume latest
	assert_usage_error flow-train "--resume latest needs --ckpt-dir"
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --eval-batches 2
	assert_usage_error flow-train "--eval-batches needs --eval-every"
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 5 --warmup 6
	assert_usage_error flow-train "--warmup 6 is longer than --steps 5"
}

@test "flow-train rejects a stray argument" {
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" extra
	assert_usage_error flow-train "unexpected argument 'extra'"
}

# ---- run-time errors ----------------------------------------------------------------

@test "flow-train on a missing dataset fails with one line naming it" {
	run -1 --separate-stderr flow-train "${TRAIN[@]}" --data nowhere
	[ -z "$output" ]
	[ "${#stderr_lines[@]}" -eq 1 ]
	[ "$stderr" = "flow-train: cannot open 'nowhere/manifest': No such file or directory" ]
}

@test "flow-train refuses data whose vocabulary exceeds the model's" {
	run -2 --separate-stderr flow-train --model gpt:layers=1,heads=2,dim=32,vocab=100,seq=32 \
		--batch 2 --seq-len 16 --data "$DATA" --peak-gflops 0
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == *"the data's vocabulary (256) is larger than the model's (100)"* ]]
}

@test "flow-train refuses a shard with a flipped payload byte before training on it" {
	cp -r "$DATA" data
	shard=data/train-000000.bin
	# A byte of a token in the middle of the payload: still an id below
	# 256, so only the checksum can tell.
	at=$(($(stat -c %s "$shard") / 2))
	printf '\\x%02x' $(($(od -An -tu1 -j "$at" -N1 "$shard") ^ 1)) |
		xargs -0 printf | dd of="$shard" bs=1 seek="$at" conv=notrunc status=none
	run -1 --separate-stderr flow-train "${TRAIN[@]}" --data data --steps 2
	# The preamble and the header, and not one step.
	[ "${lines[-1]}" = "$(printf 'step\tphase\tloss\tlr\tgrad_norm\tms\ttokens_per_s\tmfu')" ]
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == "flow-train: data/train-000000.bin: checksum mismatch at byte "*": stored "*", computed "* ]]
}

@test "flow-train --eval-every needs a val split" {
	flow-shard -q -o noval "$BATS_FILE_TMPDIR/corpus.txt"
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data noval --eval-every 2
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == *"split 'val'"* ]]
}

# ---- output and training ----------------------------------------------------------------

@test "flow-train writes a preamble, a header and one row per step" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 5
	[[ "$output" == *"# model gpt:layers=2,heads=2,dim=32,vocab=256,seq=32,pad=128"* ]]
	[[ "$output" == *"# memory params"*"activations"*"peak"* ]]
	printf '%s\n' "$output" | grep -qx $'step\tphase\tloss\tlr\tgrad_norm\tms\ttokens_per_s\tmfu'
	[ "$(tsv_rows "$output" | wc -l)" -eq 5 ]
	tsv_rows "$output" | awk -F'\t' 'NF != 8 || $2 != "train" || $1 != NR { exit 1 }'
	# No MFU without a peak.
	tsv_rows "$output" | awk -F'\t' '$8 != "-" { exit 1 }'
}

@test "flow-train: the loss falls well below its start in 60 steps" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 60 --lr 3e-3 --warmup 5
	first=$(train_losses "$output" | head -1)
	last=$(train_losses "$output" | tail -5 | awk '{ s += $1 } END { print s / NR }')
	# Byte-level: ln(256) = 5.55 at the start.
	awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > 5.3 && f < 5.8 && l < f - 2.0) }'
}

@test "flow-train is deterministic: two runs give the same bits" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 6 --grad-accum 2
	a=$(tsv_rows "$output" | cut -f1-5)
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 6 --grad-accum 2
	[ "$a" = "$(tsv_rows "$output" | cut -f1-5)" ]
}

@test "flow-train: the lr column follows warmup then cosine decay" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 10 --lr 1e-3 --min-lr 1e-4 --warmup 4
	tsv_rows "$output" | awk -F'\t' '
		function expect(s) {
			if (s <= 4) return 1e-3 * s / 4
			return 1e-4 + 0.9e-3 * (1 + cos(3.141592653589793 * (s - 4) / 6)) / 2
		}
		{ d = $4 - expect($1); if (d < 0) d = -d; if (d > 1e-9) exit 1 }'
}

@test "flow-train --eval-every writes val rows" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 4 --eval-every 2 --eval-batches 3
	[[ "$output" == *"# eval every 2 steps on 3 val batches"* ]]
	[ "$(tsv_rows "$output" | awk -F'\t' '$2 == "val"' | wc -l)" -eq 2 ]
	tsv_rows "$output" | awk -F'\t' '$2 == "val" && ($1 % 2 != 0 || $4 != "-") { exit 1 }'
}

@test "flow-train --profile prints a per-op profile on stderr" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 3 --profile
	[[ "${stderr_lines[0]}" == $'op\tcalls\tms\tms_per_step\tpercent\tgflops' ]]
	[[ "$stderr" == *$'\nmatmul_backward\t'* ]]
	[[ "$stderr" == *$'\noptimizer\t3\t'* ]]
}

@test "flow-train --emit-graph prints the graph with its memory plan" {
	run -0 --separate-stderr flow-train --model "$MODEL" --batch 2 --seq-len 16 --emit-graph
	[[ "${lines[0]}" == "# flow graph"* ]]
	[[ "$output" == *"h.1.mlp.c_fc.weight"* ]]
	[[ "$output" == *"matmul_backward"* ]]
	[[ "$output" == *"cross_entropy"* ]]
}

@test "flow-train --dump-batches writes every micro-batch's tokens" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 3 --grad-accum 2 --dump-batches b.bin
	# 3 steps x 2 micro-batches x (inputs + targets) x 4 x 32 int32.
	[ "$(stat -c %s b.bin)" -eq $((3 * 2 * 2 * 4 * 32 * 4)) ]
	assert_no_temporaries b.bin
}

@test "flow-train --kernels ref trains to the same losses within float rounding" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 3
	cpu=$(train_losses "$output")
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 3 --kernels ref
	paste <(printf '%s\n' "$cpu") <(train_losses "$output") |
		awk '{ d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > 1e-5) exit 1 }'
}

# ---- checkpoints and resume ------------------------------------------------------------------

@test "flow-train --steps 0 writes the initial checkpoint" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 0 --ckpt-dir ck
	[ -f ck/step-00000000/manifest ]
	grep -q '^tensor wte f32 (256,32) 1 (B)$' ck/step-00000000/manifest
	grep -q '^tensor adamw.m/h.0.attn.c_attn.weight f32 (96,32) 1 (B)$' ck/step-00000000/manifest
	grep -q '^state contents training$' ck/step-00000000/manifest
}

@test "flow-train resumes bit for bit from a checkpoint" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 20 --grad-accum 2
	full=$(tsv_rows "$output" | cut -f1-5)
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 20 --grad-accum 2 \
		--ckpt-dir ck --ckpt-every 10
	[ -f ck/step-00000010/manifest ] && [ -f ck/step-00000020/manifest ]
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 20 --grad-accum 2 \
		--resume ck/step-00000010
	[[ "$output" == *"# resumed from ck/step-00000010 (step 10)"* ]]
	[ "$(tsv_rows "$output" | head -1 | cut -f1)" = 11 ]
	[ "$(printf '%s\n' "$full" | tail -10)" = "$(tsv_rows "$output" | cut -f1-5)" ]
}

@test "flow-train: kill -9 mid-run, --resume latest reproduces the uninterrupted run" {
	# Big enough that 40 steps take a moment, so the kill lands mid-run.
	local model=(--model gpt:layers=2,heads=4,dim=64,vocab=256,seq=64 --batch 8 --seq-len 64 --peak-gflops 0)
	run -0 --separate-stderr flow-train "${model[@]}" --data "$DATA" --steps 40
	full=$(tsv_rows "$output" | cut -f1-5)

	flow-train "${model[@]}" --data "$DATA" --steps 40 --ckpt-dir ck --ckpt-every 10 >killed.tsv 2>/dev/null &
	pid=$!
	# Wait for the first checkpoint, then kill at a pseudo-random moment.
	for _ in $(seq 1 3000); do
		[ -f ck/step-00000010/manifest ] && break
		sleep 0.01
	done
	sleep "0.0$((RANDOM % 10))"
	kill -9 "$pid" 2>/dev/null || true
	wait "$pid" || true
	run -0 --separate-stderr flow-train "${model[@]}" --data "$DATA" --steps 40 --ckpt-dir ck \
		--ckpt-every 10 --resume latest
	first=$(tsv_rows "$output" | head -1 | cut -f1)
	[ -n "$first" ] || [ -f ck/step-00000040/manifest ]
	if [ -n "$first" ]; then
		# Resumed from the last committed checkpoint: a multiple of 10, plus one.
		[ $(((first - 1) % 10)) -eq 0 ]
		[ "$(printf '%s\n' "$full" | tail -n +"$first")" = "$(tsv_rows "$output" | cut -f1-5)" ]
	fi
	[ -f ck/step-00000040/manifest ]
}

@test "flow-train --resume refuses a run with other hyperparameters" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 2 --ckpt-dir ck
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 4 --lr 1e-3 --resume ck/step-00000002
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == *"ck/step-00000002: steps is '2' in the checkpoint but '4' in this run"* ]]
}

@test "flow-train --resume latest without a checkpoint fails with one line" {
	mkdir ck
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --ckpt-dir ck --resume latest
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == *"ck: no committed checkpoint"* ]]
}

@test "flow-train --resume from a damaged checkpoint fails with one line, exit 1" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 2 --ckpt-dir ck
	cp -r ck/step-00000002 flipped
	# Flip one byte in the middle of the data file.
	size=$(stat -c %s flipped/rank-00000.bin)
	printf '\x5a' | dd of=flipped/rank-00000.bin bs=1 seek=$((size / 2)) conv=notrunc status=none
	run -1 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 2 --resume flipped
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == "flow-train: flipped/rank-00000.bin"*"checksum"* ]]

	cp -r ck/step-00000002 truncated
	head -c 200 ck/step-00000002/manifest >truncated/manifest
	run -1 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 2 --resume truncated
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == "flow-train: truncated/manifest"* ]]

	mkdir uncommitted
	run -1 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 2 --resume uncommitted
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == *"not a committed checkpoint"* ]]
}

@test "flow-train --dump-grads writes the first step's gradients as a checkpoint" {
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 1 --dump-grads g
	[ -f g/manifest ]
	grep -q '^state contents gradients$' g/manifest
	grep -q '^tensor wte f32 (256,32) 1 (B)$' g/manifest
	run ! grep -q 'adamw' g/manifest
	# A gradients checkpoint is not something to resume from.
	run -1 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 1 --resume g
	[[ "$stderr" == *"not a training checkpoint"* ]]
}
