#!/usr/bin/env bats
# flow-ckpt export and import, and flow-train --init: the usage of every
# option; Hugging Face GPT-2 directories (one file, split with an index,
# bf16 and f16) and llm.c model files (f32 and bf16) written from a
# trained checkpoint and read back onto one rank and onto a 2x2 mesh bit
# for bit; training started from imported weights; each bad input one line
# and exit 1 with nothing under the output name; kill -9 and SIGTERM during
# reshard, export and import.  What the files hold against the Python
# packages is tests/cli/interop.bats and tests/cli/safetensors.bats.

bats_require_minimum_version 1.5.0
load common

# vocab 300 pads to 384 rows: the export drops 84 of them.
MODEL=gpt:layers=2,heads=2,dim=32,vocab=300,seq=32
TRAIN=(--model "$MODEL" --batch 4 --seq-len 32 --peak-gflops 0)
PY=/usr/bin/python3

setup_file() {
	cd "$BATS_FILE_TMPDIR"
	fox_corpus 3000 corpus.txt
	flow-shard -q -o data --val-tokens 8K corpus.txt
	flow-train "${TRAIN[@]}" --steps 2 --ckpt-dir ck --data data >/dev/null
	flow-ckpt export ck/step-00000002 -o hf
	local p
	for p in "one:1:dp" "tp:2x2:dp,tp"; do
		IFS=: read -r name mesh axes <<<"$p"
		flow-plan --model "$MODEL" --mesh "$mesh" --axes "$axes" \
			--batch 4 --seq-len 32 -o "$name.plan"
	done
	flow-plan --model "$MODEL" --mesh 4 --axes dp --batch 4 --seq-len 32 \
		--zero 3 -o z3.plan
	flow-plan --model gpt:layers=1,heads=2,dim=32,vocab=300,seq=32 \
		--mesh 1 --axes dp --batch 4 --seq-len 32 -o layers.plan
	# The same shapes, other heads: only the model spec tells them apart.
	flow-plan --model gpt:layers=2,heads=4,dim=32,vocab=300,seq=32 \
		--mesh 1 --axes dp --batch 4 --seq-len 32 -o heads.plan
}

setup() {
	cd "$BATS_TEST_TMPDIR"
	F=$BATS_FILE_TMPDIR
	CK=$F/ck/step-00000002
	HF=$F/hf
	DATA=$F/data
}

# The JSON header of safetensors file $1.
st_header() {
	"$PY" -c 'import struct,sys
f = open(sys.argv[1], "rb")
n, = struct.unpack("<Q", f.read(8))
sys.stdout.write(f.read(n).decode())' "$1"
}

# dtype and shape of tensor $2 in safetensors file $1, as "F32 [32, 96]".
st_tensor() {
	st_header "$1" | "$PY" -c 'import json,sys
t = json.load(sys.stdin)[sys.argv[1]]
print(t["dtype"], t["shape"])' "$2"
}

# The int32 at index $2 of the header of llm.c file $1.
llmc_header() {
	od -An -t d4 -j $(($2 * 4)) -N 4 "$1" | tr -d ' '
}

# The losses of flow-train's output $2 are those of the run in file $1
# within 1e-5 relative (the distributed-training tests' bound), row for
# row; there are as many, and at least one.
assert_losses_follow() {
	paste <(tsv_rows "$(cat "$1")" | cut -f3) <(tsv_rows "$2" | cut -f3) |
		awk -F'\t' '$1 == "" || $2 == "" { bad = 1 }
			{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = 1 }
			END { exit bad || NR == 0 }'
}

# Nothing under $1, and no temporary of it or of its import.
assert_nothing_left() {
	assert_no_artefact "$1"
	assert_no_temporaries "$1.import"
}

# ---- usage ------------------------------------------------------------------------

@test "flow-ckpt --help shows export and import" {
	run -0 flow-ckpt --help
	[[ "$output" == *"flow-ckpt export CKPT [--to FORMAT] -o OUT [--dtype D]"* ]]
	[[ "$output" == *"flow-ckpt import SRC [--from FORMAT] --plan PLAN -o OUT"* ]]
	[[ "$output" == *"--max-shard-size SIZE"* ]]
}

@test "flow-ckpt export and import refuse what does not apply" {
	run -2 --separate-stderr flow-ckpt export "$CK"
	assert_usage_error flow-ckpt "export needs -o OUT"
	run -2 --separate-stderr flow-ckpt export "$CK" -o out --plan "$F/one.plan"
	assert_usage_error flow-ckpt "--plan does not apply to 'export'"
	run -2 --separate-stderr flow-ckpt export "$CK" -o out --from llmc
	assert_usage_error flow-ckpt "--from does not apply to 'export'"
	run -2 --separate-stderr flow-ckpt export "$CK" -o out --max-memory 1M
	assert_usage_error flow-ckpt "--max-memory does not apply to 'export'"
	run -2 --separate-stderr flow-ckpt export --json "$CK" -o out
	assert_usage_error flow-ckpt "--json does not apply to 'export'"
	run -2 --separate-stderr flow-ckpt import "$HF" -o out
	assert_usage_error flow-ckpt "import needs --plan"
	run -2 --separate-stderr flow-ckpt import "$HF" --plan "$F/one.plan"
	assert_usage_error flow-ckpt "import needs -o OUT"
	run -2 --separate-stderr flow-ckpt import "$HF" --plan "$F/one.plan" -o out --to llmc
	assert_usage_error flow-ckpt "--to does not apply to 'import'"
	run -2 --separate-stderr flow-ckpt import "$HF" --plan "$F/one.plan" -o out --dtype bf16
	assert_usage_error flow-ckpt "--dtype does not apply to 'import'"
	run -2 --separate-stderr flow-ckpt import "$HF" --plan "$F/one.plan" -o out --max-shard-size 1M
	assert_usage_error flow-ckpt "--max-shard-size does not apply to 'import'"
	run -2 --separate-stderr flow-ckpt import --plan "$F/one.plan" -o out
	assert_usage_error flow-ckpt "'import' takes 1 source, got 0"
	run -2 --separate-stderr flow-ckpt info --to llmc "$CK"
	assert_usage_error flow-ckpt "--to does not apply to 'info'"
	run -2 --separate-stderr flow-ckpt reshard "$CK" --plan "$F/one.plan" -o out --from llmc
	assert_usage_error flow-ckpt "--from does not apply to 'reshard'"
	assert_nothing_left out
}

@test "flow-ckpt export and import check their values" {
	run -2 --separate-stderr flow-ckpt export "$CK" -o out --to onnx
	assert_usage_error flow-ckpt "--to: unknown format 'onnx' (safetensors or llmc)"
	run -2 --separate-stderr flow-ckpt import "$HF" --from gguf --plan "$F/one.plan" -o out
	assert_usage_error flow-ckpt "--from: unknown format 'gguf'"
	run -2 --separate-stderr flow-ckpt export "$CK" -o out --dtype i32
	assert_usage_error flow-ckpt "--dtype: 'i32' is not f32, bf16 or f16"
	run -2 --separate-stderr flow-ckpt export "$CK" -o out --dtype f64
	assert_usage_error flow-ckpt "--dtype: 'f64'"
	run -2 --separate-stderr flow-ckpt export "$CK" -o out --max-shard-size 0
	assert_usage_error flow-ckpt "--max-shard-size must be positive"
	run -2 --separate-stderr flow-ckpt export "$CK" -o out --max-shard-size 3X
	assert_usage_error flow-ckpt "--max-shard-size"
	run -2 --separate-stderr flow-ckpt export "$CK" -o out --to llmc --dtype f16
	assert_usage_error flow-ckpt "--dtype f16: an llm.c model file is f32 or bf16"
	run -2 --separate-stderr flow-ckpt export "$CK" -o out --to llmc --max-shard-size 1M
	assert_usage_error flow-ckpt "--max-shard-size does not apply to 'export --to llmc'"
	assert_nothing_left out
}

# ---- export -----------------------------------------------------------------------

@test "flow-ckpt export writes a Hugging Face GPT-2 directory" {
	run -0 --separate-stderr flow-ckpt export "$CK" -o out
	[ -z "$output" ] && [ -z "$stderr" ]
	[ "$(ls out)" = "config.json"$'\n'"model.safetensors" ]
	grep -q '"model_type": "gpt2"' out/config.json
	grep -q '"vocab_size": 300' out/config.json
	grep -q '"n_head": 2' out/config.json
	# Conv1D [in, out], the padded rows dropped, no lm_head.
	[ "$(st_tensor out/model.safetensors transformer.h.0.attn.c_attn.weight)" = "F32 [32, 96]" ]
	[ "$(st_tensor out/model.safetensors transformer.wte.weight)" = "F32 [300, 32]" ]
	! st_header out/model.safetensors | grep -q lm_head
	assert_no_temporaries out
}

@test "flow-ckpt export --max-shard-size splits the files under an index" {
	run -0 flow-ckpt export "$CK" -o out --max-shard-size 16K
	[ -f out/model.safetensors.index.json ] && [ ! -e out/model.safetensors ]
	local n files
	files=$(ls out/model-*-of-*.safetensors | wc -l)
	[ "$files" -gt 2 ]
	for f in out/model-*.safetensors; do
		# Each file at most 16K of data (a tensor alone may be larger).
		n=$(st_header "$f" | "$PY" -c 'import json,sys
h = json.load(sys.stdin); h.pop("__metadata__", None)
print(len(h))')
		[ "$n" -eq 1 ] || [ "$(( $(stat -c %s "$f") - 8 - $(st_header "$f" | wc -c) ))" -le 16384 ]
		grep -q "\"$(basename "$f")\"" out/model.safetensors.index.json
	done
	grep -q '"transformer.h.1.mlp.c_proj.bias": "model-' out/model.safetensors.index.json
}

@test "flow-ckpt export --dtype bf16 and f16 halve the data" {
	local full half
	full=$(stat -c %s "$HF/model.safetensors")
	for d in bf16 f16; do
		run -0 flow-ckpt export "$CK" -o "out-$d" --dtype "$d"
		half=$(stat -c %s "out-$d/model.safetensors")
		[ "$half" -lt $((full / 2 + 4096)) ] && [ "$half" -gt $((full / 2 - 4096)) ]
		[ "$(st_tensor "out-$d/model.safetensors" transformer.wpe.weight)" = "${d^^} [32, 32]" ]
	done
	grep -q '"torch_dtype": "bfloat16"' out-bf16/config.json
}

@test "flow-ckpt export --to llmc writes llm.c's model file, f32 and bf16" {
	run -0 flow-ckpt export "$CK" -o m.bin --to llmc
	[ "$(llmc_header m.bin 0)" -eq 20240326 ] && [ "$(llmc_header m.bin 1)" -eq 3 ]
	# maxT, V, L, H, C, Vp
	for i in 2:32 3:300 4:2 5:2 6:32 7:384; do
		[ "$(llmc_header m.bin "${i%:*}")" -eq "${i#*:}" ]
	done
	run -0 flow-ckpt export "$CK" -o m16.bin --to llmc --dtype bf16
	[ "$(llmc_header m16.bin 1)" -eq 5 ]
	[ $(( $(stat -c %s m.bin) - 1024 )) -eq $(( 2 * ($(stat -c %s m16.bin) - 1024) )) ]
}

@test "flow-ckpt export refuses an existing OUT, a dump of gradients and damaged data" {
	mkdir out && touch out/keep
	run -1 --separate-stderr flow-ckpt export "$CK" -o out
	[ "$stderr" = "flow-ckpt: output 'out' already exists" ]
	[ "$(ls out)" = keep ]
	flow-train "${TRAIN[@]}" --steps 1 --data "$DATA" --dump-grads grads >/dev/null
	run -1 --separate-stderr flow-ckpt export grads -o g
	[ "$stderr" = "flow-ckpt: grads: neither a training checkpoint nor weights (contents 'gradients')" ]
	assert_nothing_left g
	# A missing shard file (of a 2x2 checkpoint: the second tensor-parallel
	# rank's).
	flow-ckpt reshard "$CK" --plan "$F/tp.plan" -o part
	rm part/rank-00001.bin
	for to in safetensors llmc; do
		run -1 --separate-stderr flow-ckpt export part -o "p-$to" --to "$to"
		[ "${#stderr_lines[@]}" -eq 1 ]
		[[ "$stderr" == "flow-ckpt: "*"rank-00001.bin"* ]]
		assert_nothing_left "p-$to"
	done
	cp -r "$CK" bad
	printf '\xff' | dd of=bad/rank-00000.bin bs=1 seek=100 conv=notrunc 2>/dev/null
	for to in safetensors llmc; do
		run -1 --separate-stderr flow-ckpt export bad -o "x-$to" --to "$to"
		[ "${#stderr_lines[@]}" -eq 1 ]
		[[ "$stderr" == "flow-ckpt: "*"bad/rank-00000.bin"* ]]
		assert_nothing_left "x-$to"
	done
}

# ---- import -----------------------------------------------------------------------

@test "flow-ckpt import onto one rank and onto 2x2 gives the exported weights back" {
	run -0 --separate-stderr flow-ckpt import "$HF" --plan "$F/one.plan" -o one
	[ -z "$output" ] && [ -z "$stderr" ]
	run -0 flow-ckpt info one
	[[ "$output" == *$'# step\t0'* ]] && [[ "$output" == *$'# state\tcontents\tweights'* ]]
	# Weights only: 2 + 12 per layer + 2 tensors.
	[ "$(tsv_rows "$output" | wc -l)" -eq 28 ]
	flow-ckpt verify one >/dev/null
	flow-ckpt import "$HF" --plan "$F/tp.plan" -o tp
	[ "$(flow-ckpt info tp | grep -c $'\t2x2\t')" -eq 28 ]
	flow-ckpt reshard tp --plan "$F/one.plan" -o back
	run -0 flow-ckpt diff one back
	# And the same bytes out again.
	flow-ckpt export tp -o again
	cmp "$HF/model.safetensors" again/model.safetensors
	cmp "$HF/config.json" again/config.json
	assert_no_temporaries one
	assert_no_temporaries one.import
	assert_no_temporaries tp.import
}

@test "flow-ckpt import takes a .safetensors file with config.json beside it" {
	mkdir file && cp "$HF/model.safetensors" "$HF/config.json" file/
	flow-ckpt import file/model.safetensors --plan "$F/one.plan" -o a
	flow-ckpt import "$HF" --plan "$F/one.plan" -o b
	run -0 flow-ckpt diff a b
}

@test "flow-ckpt import of a split bf16 export equals the f32 one to bf16 rounding" {
	flow-ckpt export "$CK" -o s16 --dtype bf16 --max-shard-size 16K
	flow-ckpt import s16 --plan "$F/one.plan" -o i16
	flow-ckpt import "$HF" --plan "$F/one.plan" -o i32
	run -1 flow-ckpt diff i16 i32
	run -0 flow-ckpt diff i16 i32 --tol 0.01
}

@test "flow-ckpt import --from llmc reads llm.c's files, f32 and bf16" {
	flow-ckpt export "$CK" -o m.bin --to llmc
	flow-ckpt import m.bin --from llmc --plan "$F/tp.plan" -o a
	flow-ckpt import "$HF" --plan "$F/tp.plan" -o b
	run -0 flow-ckpt diff a b
	flow-ckpt export a -o m2.bin --to llmc
	cmp m.bin m2.bin
	flow-ckpt export "$CK" -o m16.bin --to llmc --dtype bf16
	flow-ckpt import m16.bin --from llmc --plan "$F/one.plan" -o c
	run -0 flow-ckpt diff c b --tol 0.01
}

@test "flow-ckpt import refuses a plan for another model, naming the tensor or the model" {
	run -1 --separate-stderr flow-ckpt import "$HF" --plan "$F/layers.plan" -o out
	[ "$stderr" = "flow-ckpt: $F/layers.plan: plan is for another model: it has no tensor 'h.1.ln_1.weight' of '$HF'" ]
	assert_nothing_left out
	run -1 --separate-stderr flow-ckpt import "$HF" --plan "$F/heads.plan" -o out
	[ "$stderr" = "flow-ckpt: $F/heads.plan: plan is for another model: 'gpt:layers=2,heads=4,dim=32,vocab=300,seq=32,pad=128', but '$HF' holds 'gpt:layers=2,heads=2,dim=32,vocab=300,seq=32,pad=128'" ]
	assert_nothing_left out
}

@test "flow-ckpt import of bad files: one line, exit 1, nothing under OUT" {
	local st=$HF/model.safetensors size
	size=$(stat -c %s "$st")
	mkdir trunc lie missing noconf idx
	# A truncated file.
	head -c $((size - 5)) "$st" >trunc/model.safetensors
	cp "$HF/config.json" trunc/
	# A header whose sizes lie: wpe's END moved 4 bytes on.
	"$PY" - "$st" lie/model.safetensors <<'EOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n, = struct.unpack("<Q", b[:8])
h = json.loads(b[8:8 + n])
h["transformer.wpe.weight"]["data_offsets"][1] += 4
t = json.dumps(h, separators=(",", ":")).encode().ljust(n)
assert len(t) == n
open(sys.argv[2], "wb").write(b[:8] + t + b[8 + n:])
EOF
	cp "$HF/config.json" lie/
	# No config.json; an index naming a file that is not there.
	cp "$st" noconf/
	flow-ckpt export "$CK" -o split --max-shard-size 16K
	cp split/* idx/ && rm idx/model-00002-of-*.safetensors
	local d
	for d in trunc lie noconf idx missing; do
		run -1 --separate-stderr flow-ckpt import "$d" --plan "$F/one.plan" -o "out-$d"
		echo "$d: $stderr"
		[ "${#stderr_lines[@]}" -eq 1 ]
		[[ "$stderr" == "flow-ckpt: "*"$d"* ]]
		assert_nothing_left "out-$d"
	done
	run -1 --separate-stderr flow-ckpt import lie --plan "$F/one.plan" -o out
	[[ "$stderr" == *"transformer.wpe.weight"* ]]
	run -1 --separate-stderr flow-ckpt import "$F/corpus.txt" --from llmc --plan "$F/one.plan" -o out
	[ "${#stderr_lines[@]}" -eq 1 ] && [[ "$stderr" == *"corpus.txt"* ]]
	assert_nothing_left out
	mkdir out && touch out/keep
	run -1 --separate-stderr flow-ckpt import "$HF" --plan "$F/one.plan" -o out
	[ "$stderr" = "flow-ckpt: output 'out' already exists" ]
	[ "$(ls out)" = keep ]
}

# ---- flow-train --init ------------------------------------------------------------

@test "flow-train --init starts at step 1 from a checkpoint's weights, any layout" {
	flow-ckpt import "$HF" --plan "$F/tp.plan" -o tp
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --steps 3 --data "$DATA" --init "$CK"
	printf '%s\n' "$output" >from-ck.tsv
	grep -qx "# parameters from $CK" from-ck.tsv
	[ "$(tsv_rows "$output" | cut -f1 | tr '\n' ' ')" = "1 2 3 " ]
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --steps 3 --data "$DATA" --init tp
	# The weights alone, from the export: the same bits as from the
	# training checkpoint (whose moments --init leaves out).
	diff <(tsv_rows "$(cat from-ck.tsv)" | cut -f1-5) <(tsv_rows "$output" | cut -f1-5)
	# And not what the seed would give.
	run -0 flow-train "${TRAIN[@]}" --steps 3 --data "$DATA"
	! diff <(tsv_rows "$(cat from-ck.tsv)" | cut -f1-5) <(tsv_rows "$output" | cut -f1-5) >/dev/null
}

@test "flow-train --init on a 2x2 mesh follows the one-rank run" {
	flow-ckpt import "$HF" --plan "$F/tp.plan" -o tp
	flow-train "${TRAIN[@]}" --steps 3 --data "$DATA" --init "$CK" >one.tsv
	run -0 --separate-stderr flow-train --nproc 4 --plan "$F/tp.plan" --peak-gflops 0 \
		--steps 3 --data "$DATA" --init tp
	assert_losses_follow one.tsv "$output"
}

@test "flow-ckpt import onto ZeRO-3 shards the weights over dp, and --init trains from them" {
	flow-ckpt import "$HF" --plan "$F/z3.plan" -o z3
	flow-ckpt info z3 | grep -qx $'wte\tf32\t(384,32)\t4\t(S(0))\t4\t49152'
	[ "$(flow-ckpt info z3 | grep -c '^adamw')" -eq 0 ]
	flow-train "${TRAIN[@]}" --steps 3 --data "$DATA" --init "$CK" >one.tsv
	run -0 --separate-stderr flow-train --nproc 4 --plan "$F/z3.plan" --peak-gflops 0 \
		--steps 3 --data "$DATA" --init z3
	assert_losses_follow one.tsv "$output"
}

@test "flow-train --init refuses --resume, another model and a dump of gradients" {
	run -2 --separate-stderr flow-train "${TRAIN[@]}" --steps 3 --data "$DATA" --init "$CK" --resume "$CK"
	assert_usage_error flow-train "--init and --resume exclude each other"
	# Like --resume's, a run that does not match its checkpoint: exit 2.
	run -2 --separate-stderr flow-train --model gpt:layers=2,heads=4,dim=32,vocab=300,seq=32 \
		--batch 4 --seq-len 32 --steps 1 --data "$DATA" --init "$CK"
	[ "$stderr" = "flow-train: $CK: model is 'gpt:layers=2,heads=2,dim=32,vocab=300,seq=32,pad=128' in the checkpoint but 'gpt:layers=2,heads=4,dim=32,vocab=300,seq=32,pad=128' in this run" ]
	flow-train "${TRAIN[@]}" --steps 1 --data "$DATA" --dump-grads grads >/dev/null
	run -1 --separate-stderr flow-train "${TRAIN[@]}" --steps 1 --data "$DATA" --init grads
	[ "$stderr" = "flow-train: grads: neither a training checkpoint nor weights (contents 'gradients')" ]
	run -1 --separate-stderr flow-train "${TRAIN[@]}" --steps 1 --data "$DATA" --init nope
	[[ "$stderr" == "flow-train: cannot open checkpoint 'nope'"* ]]
}

# ---- signals ----------------------------------------------------------------------

# interrupt_mid_write SIG OUT CMD...: run CMD, and as soon as a temporary
# of OUT (or of its import) appears, send SIG; $status is CMD's.
interrupt_mid_write() {
	local sig=$1 out=$2 pid
	shift 2
	"$@" >/dev/null 2>held.err &
	pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		compgen -G "$out.tmp.*" >/dev/null && break
		compgen -G "$out.import.tmp.*" >/dev/null && break
	done
	kill -"$sig" "$pid" 2>/dev/null || true
	status=0
	wait "$pid" || status=$?
}

@test "kill -9 during reshard, export and import leaves nothing under the final name" {
	# 56 MB of weights (170 MB with the moments): each command runs for
	# a tenth of a second or more.
	local big=gpt:layers=4,heads=4,dim=512,vocab=4096,seq=64
	flow-train --model "$big" --batch 1 --seq-len 64 --steps 0 --ckpt-dir big \
		--data "$DATA" --peak-gflops 0 >/dev/null
	flow-plan --model "$big" --mesh 2x2 --axes dp,tp --batch 4 --seq-len 64 -o big.plan
	flow-ckpt export big/step-00000000 -o bighf
	interrupt_mid_write KILL r flow-ckpt reshard big/step-00000000 --plan big.plan -o r --max-memory 9M
	[ "$status" -eq 137 ] && [ ! -e r ]
	interrupt_mid_write KILL e flow-ckpt export big/step-00000000 -o e
	[ "$status" -eq 137 ] && [ ! -e e ]
	interrupt_mid_write KILL m.bin flow-ckpt export big/step-00000000 --to llmc -o m.bin
	[ "$status" -eq 137 ] && [ ! -e m.bin ]
	interrupt_mid_write KILL i flow-ckpt import bighf --plan big.plan -o i --max-memory 9M
	[ "$status" -eq 137 ] && [ ! -e i ]
	# What is left is temporaries, which a later run does not mind.
	run -0 flow-ckpt export big/step-00000000 -o e
	run -0 flow-ckpt import bighf --plan big.plan -o i
}

@test "SIGTERM during export and import removes every temporary" {
	local big=gpt:layers=4,heads=4,dim=512,vocab=4096,seq=64
	flow-train --model "$big" --batch 1 --seq-len 64 --steps 0 --ckpt-dir big \
		--data "$DATA" --peak-gflops 0 >/dev/null
	flow-plan --model "$big" --mesh 2x2 --axes dp,tp --batch 4 --seq-len 64 -o big.plan
	flow-ckpt export big/step-00000000 -o bighf
	interrupt_mid_write TERM e flow-ckpt export big/step-00000000 -o e
	[ "$status" -eq 143 ]
	assert_nothing_left e
	interrupt_mid_write TERM i flow-ckpt import bighf --plan big.plan -o i --max-memory 9M
	[ "$status" -eq 143 ]
	assert_nothing_left i
	[ ! -s held.err ]
}
