#!/usr/bin/env bats
# flow-ckpt: help, version and usage errors; info and verify of a
# flow-train checkpoint (TSV and --json); verify naming the file, tensor
# and offset of a flipped byte and a missing shard file; diff of equal,
# different and mismatched checkpoints; reshard 1 rank -> 2x2 (dp,tp) ->
# dp=4 ZeRO-3 -> 1 rank back to the same bits, the layouts flow-train
# itself writes under those plans, resuming from a resharded checkpoint
# as from the original, and every refusal leaving nothing under OUT.

bats_require_minimum_version 1.5.0
load common

MODEL=gpt:layers=2,heads=2,dim=32,vocab=256,seq=32
TRAIN=(--model "$MODEL" --batch 4 --seq-len 32 --peak-gflops 0)

setup_file() {
	cd "$BATS_FILE_TMPDIR"
	fox_corpus 3000 corpus.txt
	flow-shard -q -o data --val-tokens 8K corpus.txt
	# Steps 8, so that a run resuming from step 4 has steps to take.
	flow-train "${TRAIN[@]}" --steps 8 --ckpt-every 4 --ckpt-dir ck \
		--data data >train.out
	flow-plan --model "$MODEL" --mesh 2x2 --axes dp,tp --batch 4 \
		--seq-len 32 -o tp.plan
	flow-plan --model "$MODEL" --mesh 4 --axes dp --batch 4 \
		--seq-len 32 --zero 3 -o z3.plan
	flow-plan --model "$MODEL" --mesh 1 --axes dp --batch 4 \
		--seq-len 32 -o one.plan
	flow-plan --model gpt:layers=1,heads=2,dim=32,vocab=256,seq=32 \
		--mesh 1 --axes dp --batch 4 --seq-len 32 -o other.plan
}

setup() {
	cd "$BATS_TEST_TMPDIR"
	F=$BATS_FILE_TMPDIR
	CK=$F/ck/step-00000004
	DATA=$F/data
}

# ---- help, version, usage errors ----------------------------------------------

@test "flow-ckpt --help prints the usage on stdout and exits 0" {
	run -0 --separate-stderr flow-ckpt --help
	[ -z "$stderr" ]
	[ "${lines[0]}" = "Usage: flow-ckpt info CKPT [--json]" ]
	[[ "$output" == *"--max-memory SIZE"* ]]
}

@test "flow-ckpt --version prints the version and the build features" {
	run -0 --separate-stderr flow-ckpt --version
	[[ "${lines[0]}" =~ ^flow-ckpt\ [0-9]+\.[0-9]+\.[0-9]+$ ]]
	[[ "${lines[1]}" == *"cuda: "* ]]
}

@test "flow-ckpt without a command is a usage error" {
	run -2 --separate-stderr flow-ckpt
	assert_usage_error flow-ckpt "a command is required"
}

@test "flow-ckpt with an unknown command is a usage error" {
	run -2 --separate-stderr flow-ckpt show "$CK"
	assert_usage_error flow-ckpt "unknown command 'show'"
}

@test "flow-ckpt commands take their number of checkpoints" {
	run -2 --separate-stderr flow-ckpt info
	assert_usage_error flow-ckpt "'info' takes 1 checkpoint, got 0"
	run -2 --separate-stderr flow-ckpt diff "$CK"
	assert_usage_error flow-ckpt "'diff' takes 2 checkpoints, got 1"
	run -2 --separate-stderr flow-ckpt verify "$CK" "$CK"
	assert_usage_error flow-ckpt "'verify' takes 1 checkpoint, got 2"
}

@test "flow-ckpt refuses options of other commands" {
	run -2 --separate-stderr flow-ckpt info --quick "$CK"
	assert_usage_error flow-ckpt "--quick does not apply to 'info'"
	run -2 --separate-stderr flow-ckpt verify --tol 1 "$CK"
	assert_usage_error flow-ckpt "--tol does not apply to 'verify'"
	run -2 --separate-stderr flow-ckpt diff --plan x "$CK" "$CK"
	assert_usage_error flow-ckpt "--plan does not apply to 'diff'"
	run -2 --separate-stderr flow-ckpt info -o x "$CK"
	assert_usage_error flow-ckpt "--output does not apply to 'info'"
	run -2 --separate-stderr flow-ckpt info --max-memory 1M "$CK"
	assert_usage_error flow-ckpt "--max-memory does not apply to 'info'"
}

@test "flow-ckpt checks option values" {
	run -2 --separate-stderr flow-ckpt diff --tol abc "$CK" "$CK"
	assert_usage_error flow-ckpt "--tol"
	run -2 --separate-stderr flow-ckpt diff --tol -1 "$CK" "$CK"
	assert_usage_error flow-ckpt "--tol"
	run -2 --separate-stderr flow-ckpt reshard "$CK" --plan "$F/tp.plan" -o out --max-memory 12Q
	assert_usage_error flow-ckpt "--max-memory"
	run -2 --separate-stderr flow-ckpt reshard "$CK" --plan "$F/tp.plan" -o out --max-memory 0
	assert_usage_error flow-ckpt "--max-memory must be positive"
	run -2 --separate-stderr flow-ckpt --bogus info "$CK"
	assert_usage_error flow-ckpt "--bogus"
}

@test "flow-ckpt reshard needs --plan and -o, and has no --json" {
	run -2 --separate-stderr flow-ckpt reshard "$CK" -o out
	assert_usage_error flow-ckpt "reshard needs --plan"
	run -2 --separate-stderr flow-ckpt reshard "$CK" --plan "$F/tp.plan"
	assert_usage_error flow-ckpt "reshard needs -o OUT"
	run -2 --separate-stderr flow-ckpt reshard --json "$CK" --plan "$F/tp.plan" -o out
	assert_usage_error flow-ckpt "--json does not apply to 'reshard'"
	assert_no_artefact out
}

# ---- info -------------------------------------------------------------------------

@test "flow-ckpt info lists the step, the run state and every tensor" {
	run -0 --separate-stderr flow-ckpt info "$CK"
	[ -z "$stderr" ]
	[[ "$output" == *$'# step\t4'* ]]
	[[ "$output" == *$'# model\tgpt:layers=2,heads=2,dim=32,vocab=256,seq=32,pad=128'* ]]
	[[ "$output" == *$'# ranks\t1'* ]]
	[[ "$output" == *$'# state\tloader.index\t16'* ]]
	printf '%s\n' "$output" | grep -qx $'tensor\tdtype\tshape\tmesh\tsbp\tshards\tbytes'
	printf '%s\n' "$output" | grep -qx $'wte\tf32\t(256,32)\t1\t(B)\t1\t32768'
	printf '%s\n' "$output" | grep -qx $'adamw.v/wpe\tf32\t(32,32)\t1\t(B)\t1\t4096'
	# Each parameter with its two moments.
	[ "$(tsv_rows "$output" | wc -l)" -eq 84 ]
}

@test "flow-ckpt info --json gives the same records" {
	run -0 --separate-stderr flow-ckpt info --json "$CK"
	assert_json "$output"
	[[ "$output" == *'"step":4'* ]]
	[[ "$output" == *'"loader.index":"16"'* ]]
	[[ "$output" == *'{"name":"wte","dtype":"f32","shape":[256,32],"mesh":"1","sbp":"(B)","shards":1,"bytes":32768}'* ]]
}

@test "flow-ckpt info of a directory that is not a checkpoint fails naming it" {
	mkdir empty
	run -1 --separate-stderr flow-ckpt info empty
	[ -z "$output" ]
	[[ "$stderr" == "flow-ckpt: empty"*"no manifest"* ]]
	[ "${#stderr_lines[@]}" -eq 1 ]
}

# ---- verify --------------------------------------------------------------------

@test "flow-ckpt verify reads every shard of a good checkpoint" {
	run -0 --separate-stderr flow-ckpt verify "$CK"
	[ -z "$stderr" ]
	[ "${lines[1]}" = "$CK"$'\t4\t84\t84\t416256\tdata' ]
	run -0 --separate-stderr flow-ckpt verify --quick --json "$CK"
	assert_json "$output"
	[[ "$output" == *'"checked":"structure","ok":true'* ]]
}

@test "flow-ckpt verify names the file, tensor and offset of a flipped byte" {
	cp -r "$CK" bad
	# Byte 100 of the data file lies in the first shard, wte's.
	printf '\xff' | dd of=bad/rank-00000.bin bs=1 seek=100 conv=notrunc status=none
	run -1 --separate-stderr flow-ckpt verify bad
	[ -z "$output" ]
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == "flow-ckpt: "*"bad/rank-00000.bin"* ]]
	[[ "$stderr" == *"'wte'"* ]]
	[[ "$stderr" == *"offset 0"* ]]
	# The structure is sound: --quick does not read the data.
	run -0 flow-ckpt verify --quick bad
}

@test "flow-ckpt verify names a missing shard file" {
	cp -r "$CK" gone
	rm gone/rank-00000.bin
	run -1 --separate-stderr flow-ckpt verify --quick gone
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == "flow-ckpt: "*"rank-00000.bin"* ]]
}

# ---- diff -------------------------------------------------------------------------

@test "flow-ckpt diff of a checkpoint with itself is equal, exit 0" {
	run -0 --separate-stderr flow-ckpt diff "$CK" "$CK"
	[ -z "$stderr" ]
	[ "$(tsv_rows "$output" | awk -F'\t' '$2 != "equal"' | wc -l)" -eq 0 ]
	printf '%s\n' "$output" | grep -qx $'wte\tequal\t0\t0\t0\t8192'
	run -0 flow-ckpt diff --json "$CK" "$CK"
	assert_json "$output"
	[[ "$output" == *'"differ":false}' ]]
}

@test "flow-ckpt diff of two steps counts unequal elements, exit 1; --tol accepts them" {
	run -1 --separate-stderr flow-ckpt diff "$CK" "$F/ck/step-00000008"
	printf '%s\n' "$output" | awk -F'\t' '$1 == "wte" && $2 == "differ" && $5 > 0 { ok = 1 } END { exit !ok }'
	run -0 flow-ckpt diff --tol 1000 "$CK" "$F/ck/step-00000008"
	printf '%s\n' "$output" | awk -F'\t' '$1 == "wte" && $2 == "within-tol" { ok = 1 } END { exit !ok }'
}

@test "flow-ckpt diff names tensors only on one side" {
	# A model of one layer: the second layer's tensors are only in $CK.
	flow-train --model gpt:layers=1,heads=2,dim=32,vocab=256,seq=32 \
		--batch 4 --seq-len 32 --steps 1 --ckpt-dir small \
		--data "$DATA" --peak-gflops 0 >/dev/null
	run -1 --separate-stderr flow-ckpt diff "$CK" small/step-00000001
	printf '%s\n' "$output" | grep -q $'^h.1.ln_1.weight\tonly-a\t'
	run -1 flow-ckpt diff small/step-00000001 "$CK"
	printf '%s\n' "$output" | grep -q $'^h.1.ln_1.weight\tonly-b\t'
}

# ---- reshard -------------------------------------------------------------------

@test "flow-ckpt reshard 1 -> 2x2 -> dp=4 ZeRO-3 -> 1 gives the same bits" {
	run -0 --separate-stderr flow-ckpt reshard "$CK" --plan "$F/tp.plan" -o tp
	[ -z "$output" ]
	flow-ckpt verify tp >/dev/null
	[ "$(flow-ckpt info tp | grep -c $'\t2x2\t')" -eq 84 ]
	flow-ckpt reshard tp --plan "$F/z3.plan" -o z3
	flow-ckpt info z3 | grep -qx $'wte\tf32\t(256,32)\t4\t(S(0))\t4\t32768'
	flow-ckpt reshard z3 --plan "$F/one.plan" -o one
	run -0 flow-ckpt diff "$CK" one
	# The state lines and step come through unchanged.
	diff <(flow-ckpt info "$CK" | tail -n +2) <(flow-ckpt info one | tail -n +2)
	assert_no_temporaries tp
	assert_no_temporaries one
}

@test "flow-ckpt reshard --threads: the same bytes on one thread and on four" {
	flow-ckpt reshard "$CK" --plan "$F/tp.plan" -o t1 --threads 1
	flow-ckpt reshard "$CK" --plan "$F/tp.plan" -o t4 --threads 4
	diff -r t1 t4
	run -2 --separate-stderr flow-ckpt reshard "$CK" --plan "$F/tp.plan" -o t0 --threads 0
	assert_usage_error flow-ckpt "--threads"
	run -2 --separate-stderr flow-ckpt export "$CK" -o e --threads 2
	assert_usage_error flow-ckpt "--threads does not apply to 'export'"
	assert_no_artefact t0
	assert_no_artefact e
}

@test "flow-ckpt reshard writes what flow-train writes under the plan" {
	for p in tp z3; do
		flow-train --nproc 4 --plan "$F/$p.plan" --steps 4 \
			--ckpt-dir "train_$p" --data "$DATA" --peak-gflops 0 >/dev/null
		flow-ckpt reshard "$CK" --plan "$F/$p.plan" -o "re_$p"
		# Only the 'steps' state (4 against 8) differs.
		diff <(flow-ckpt info "train_$p/step-00000004" | grep -v $'^# checkpoint\|^# state\tsteps\t') \
			<(flow-ckpt info "re_$p" | grep -v $'^# checkpoint\|^# state\tsteps\t')
		for r in 0 1 2 3; do
			diff <(grep -v '^end ' "train_$p/step-00000004/rank-0000$r.idx" | cut -d' ' -f1-6) \
				<(grep -v '^end ' "re_$p/rank-0000$r.idx" | cut -d' ' -f1-6)
		done
	done
}

@test "flow-train resumes from a resharded checkpoint as from the original" {
	flow-ckpt reshard "$CK" --plan "$F/tp.plan" -o tp
	flow-train --nproc 4 --plan "$F/tp.plan" --steps 8 --resume tp \
		--data "$DATA" --peak-gflops 0 >resharded.out
	flow-train --nproc 4 --plan "$F/tp.plan" --steps 8 --resume "$CK" \
		--data "$DATA" --peak-gflops 0 >original.out
	# step, phase, loss, lr, grad_norm: bit for bit (the time columns vary).
	diff <(grep -v '^#' resharded.out | cut -f1-5) <(grep -v '^#' original.out | cut -f1-5)
	[ "$(grep -v '^#' resharded.out | awk -F'\t' '$2 == "train"' | wc -l)" -eq 4 ]
}

@test "flow-ckpt reshard refuses an existing OUT and leaves it alone" {
	mkdir out
	touch out/keep
	run -1 --separate-stderr flow-ckpt reshard "$CK" --plan "$F/tp.plan" -o out
	[ "$stderr" = "flow-ckpt: output 'out' already exists" ]
	[ "$(ls out)" = keep ]
	assert_no_temporaries out
}

@test "flow-ckpt reshard refuses a plan for another model naming the tensor" {
	run -1 --separate-stderr flow-ckpt reshard "$CK" --plan "$F/other.plan" -o out
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == "flow-ckpt: $F/other.plan: plan is for another model"*"'h.1.ln_1.weight'"* ]]
	assert_no_artefact out
}

@test "flow-ckpt reshard refuses a shard larger than --max-memory" {
	run -1 --separate-stderr flow-ckpt reshard "$CK" --plan "$F/one.plan" -o out --max-memory 1K
	[[ "$stderr" == "flow-ckpt: a shard of 'wte' needs 32768 bytes, more than --max-memory 1024" ]]
	assert_no_artefact out
	# The shard itself fits, but nothing is left to stream the longest
	# rows (512 bytes, of the MLP's output projection) through.
	run -1 --separate-stderr flow-ckpt reshard "$CK" --plan "$F/one.plan" -o out --max-memory 32K
	[[ "$stderr" == "flow-ckpt: reading 'h.0.mlp.c_proj.weight' needs 512 bytes besides the 32768-byte largest shard, more than --max-memory 32768" ]]
	assert_no_artefact out
	run -0 flow-ckpt reshard "$CK" --plan "$F/one.plan" -o out --max-memory 33K
	run -0 flow-ckpt diff "$CK" out
}

@test "flow-ckpt reshard of damaged data leaves nothing under OUT" {
	cp -r "$CK" bad
	printf '\xff' | dd of=bad/rank-00000.bin bs=1 seek=100 conv=notrunc status=none
	run -1 --separate-stderr flow-ckpt reshard bad --plan "$F/tp.plan" -o out
	[ "${#stderr_lines[@]}" -eq 1 ]
	[[ "$stderr" == *"bad/rank-00000.bin"*"'wte'"* ]]
	assert_no_artefact out
}

@test "flow-ckpt reshard killed by SIGTERM leaves nothing under OUT" {
	# A model large enough (74 MB of checkpoint) that the reshard, through
	# a small read buffer, is still running when the signal comes.
	local big=gpt:layers=2,heads=4,dim=512,vocab=256,seq=32
	flow-train --model "$big" --batch 4 --seq-len 32 --steps 1 \
		--ckpt-dir big --data "$DATA" --peak-gflops 0 >/dev/null
	flow-plan --model "$big" --mesh 2x2 --axes dp,tp --batch 4 \
		--seq-len 32 -o big.plan
	flow-ckpt reshard big/step-00000001 --plan big.plan -o out \
		--max-memory 2060K &
	local pid=$!
	sleep 0.02
	kill -TERM "$pid"
	local st=0
	wait "$pid" || st=$?
	if [ "$st" -eq 0 ]; then
		# It finished first: then it is whole.
		flow-ckpt verify out >/dev/null
	else
		[ "$st" -eq 143 ]
		assert_no_artefact out
	fi
}

@test "flow-ckpt reshard refuses a dump of gradients" {
	flow-train "${TRAIN[@]}" --steps 1 --data "$DATA" --dump-grads grads >/dev/null
	run -1 --separate-stderr flow-ckpt reshard grads --plan "$F/tp.plan" -o out
	[ "$stderr" = "flow-ckpt: grads: neither a training checkpoint nor weights (contents 'gradients')" ]
	assert_no_artefact out
}

@test "flow-ckpt reshard of a missing plan or checkpoint fails naming it" {
	run -1 --separate-stderr flow-ckpt reshard "$CK" --plan nope.plan -o out
	[[ "$stderr" == "flow-ckpt: "*"nope.plan"* ]]
	assert_no_artefact out
	run -1 --separate-stderr flow-ckpt reshard nope --plan "$F/tp.plan" -o out
	[[ "$stderr" == "flow-ckpt: cannot open checkpoint 'nope'"* ]]
	assert_no_artefact out
}
