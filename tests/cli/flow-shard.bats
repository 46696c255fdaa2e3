#!/usr/bin/env bats
# flow-shard: every option and every exit path (0, 1, 2, and 143 after
# SIGTERM), the dataset it writes, --verify on damaged copies, --info and
# --order.  Inputs are the committed files in tests/data/good and
# tests/data/bad (tests/data/README lists each bad file's message).

bats_require_minimum_version 1.5.0
load common

GOOD=$top_srcdir/tests/data/good
BAD=$top_srcdir/tests/data/bad

setup() {
	cd "$BATS_TEST_TMPDIR"
	# A text corpus of 40000 bytes (tokens), the same on every machine.
	for i in $(seq 1 2000); do printf 'line %05d of the corpus\n' "$i"; done |
		head -c 40000 >corpus.txt
}

# ---- help, version, usage errors ----------------------------------------------

@test "flow-shard --help prints the usage on stdout and exits 0" {
	run -0 --separate-stderr flow-shard --help
	[ -z "$stderr" ]
	[ "${lines[0]}" = "Usage: flow-shard [options] -o DIR INPUT..." ]
	[[ "$output" == *"--compress[=L]"* ]]
	[[ "$output" == *"--order DIR"* ]]
}

@test "flow-shard -h is --help" {
	run -0 --separate-stderr flow-shard -h
	[[ "${lines[0]}" == "Usage: flow-shard"* ]]
}

@test "flow-shard --version prints the version and the build features" {
	run -0 --separate-stderr flow-shard --version
	[ -z "$stderr" ]
	[[ "${lines[0]}" =~ ^flow-shard\ [0-9]+\.[0-9]+\.[0-9]+$ ]]
}

@test "flow-shard without input is a usage error" {
	run -2 --separate-stderr flow-shard -o out
	assert_usage_error flow-shard "missing input (give files, or '-' for standard input)"
	assert_no_artefact out
}

@test "flow-shard without -o is a usage error" {
	run -2 --separate-stderr flow-shard corpus.txt
	assert_usage_error flow-shard "missing output directory (-o DIR)"
}

@test "flow-shard rejects an unknown option" {
	run -2 --separate-stderr flow-shard --shards 4 -o out corpus.txt
	assert_usage_error flow-shard "unknown option '--shards'"
	assert_no_artefact out
}

@test "flow-shard rejects an option without its value" {
	run -2 --separate-stderr flow-shard corpus.txt -o
	assert_usage_error flow-shard "option '-o' needs a value"
}

@test "flow-shard rejects conflicting modes" {
	run -2 --separate-stderr flow-shard --verify a --info b
	assert_usage_error flow-shard "conflicting modes '--verify' and '--info'"
	run -2 --separate-stderr flow-shard --order a --verify b
	assert_usage_error flow-shard "conflicting modes '--order' and '--verify'"
}

@test "flow-shard rejects build options in another mode" {
	run -2 --separate-stderr flow-shard --info a --compress
	assert_usage_error flow-shard "'--compress' cannot be used with '--info'"
	run -2 --separate-stderr flow-shard -o out --verify a
	assert_usage_error flow-shard "'-o' cannot be used with '--verify'"
	run -2 --separate-stderr flow-shard --verify a extra
	assert_usage_error flow-shard "unexpected argument 'extra'"
}

@test "flow-shard rejects order options without --order" {
	run -2 --separate-stderr flow-shard --info a --seq-len 4
	assert_usage_error flow-shard "'--seq-len' needs '--order'"
}

@test "flow-shard rejects --json when building or verifying" {
	run -2 --separate-stderr flow-shard --json -o out corpus.txt
	assert_usage_error flow-shard "'--json' needs '--info' or '--order'"
	assert_no_artefact out
}

@test "flow-shard rejects bad option values" {
	run -2 --separate-stderr flow-shard --shard-tokens 0 -o out corpus.txt
	assert_usage_error flow-shard "--shard-tokens: must be at least 1"
	run -2 --separate-stderr flow-shard --shard-tokens 1.5M -o out corpus.txt
	assert_usage_error flow-shard "--shard-tokens: "
	run -2 --separate-stderr flow-shard --val-tokens x -o out corpus.txt
	assert_usage_error flow-shard "--val-tokens: "
	run -2 --separate-stderr flow-shard --compress=99 -o out corpus.txt
	assert_usage_error flow-shard "--compress: "
	run -2 --separate-stderr flow-shard --compress=0 -o out corpus.txt
	assert_usage_error flow-shard "--compress: "
	run -2 --separate-stderr flow-shard --format csv -o out corpus.txt
	assert_usage_error flow-shard "--format: unknown format 'csv' (expected auto, text, llmc, raw or npy)"
	run -2 --separate-stderr flow-shard --dtype u8 -o out corpus.txt
	assert_usage_error flow-shard "--dtype: unknown token type 'u8' (expected u16 or u32)"
	run -2 --separate-stderr flow-shard --vocab 0 -o out corpus.txt
	assert_usage_error flow-shard "--vocab: "
	run -2 --separate-stderr flow-shard --frame-tokens 0 --compress -o out corpus.txt
	assert_usage_error flow-shard "--frame-tokens: "
	# Readers allocate a frame: flow-shard(5) limits its length.
	run -2 --separate-stderr flow-shard --frame-tokens 16777217 --compress -o out corpus.txt
	assert_usage_error flow-shard "--frame-tokens: 16777217 tokens outside 1..16777216 (16M)"
	run -2 --separate-stderr flow-shard --frame-tokens 17M --compress -o out corpus.txt
	assert_usage_error flow-shard "--frame-tokens: 17M tokens outside 1..16777216 (16M)"
	assert_no_artefact out
}

@test "flow-shard --frame-tokens needs --compress" {
	run -2 --separate-stderr flow-shard --frame-tokens 100 -o out corpus.txt
	assert_usage_error flow-shard "'--frame-tokens' needs '--compress'"
}

@test "flow-shard refuses standard input twice" {
	run -2 --separate-stderr flow-shard -o out - -
	assert_usage_error flow-shard "standard input '-' given twice"
}

# ---- building ------------------------------------------------------------------

@test "flow-shard builds a dataset silently and --verify accepts it" {
	run -0 --separate-stderr flow-shard --shard-tokens 16K --val-tokens 5000 -o out corpus.txt
	[ -z "$output" ]
	[ -z "$stderr" ]
	[ "$(ls out)" = "$(printf '%s\n' manifest train-000000.bin train-000001.bin train-000002.bin val-000000.bin)" ]
	[ "$(head -6 out/manifest)" = "$(printf '%s\n' 'flow-manifest 1' 'vocab 256' 'token_dtype u16' \
		'compression none' 'split train 35000 tokens 3 shards' 'split val 5000 tokens 1 shards')" ]
	run -0 --separate-stderr flow-shard --verify out
	[ -z "$output" ]
	[ -z "$stderr" ]
	assert_no_temporaries out
}

@test "flow-shard -v reports what it wrote on stderr" {
	run -0 --separate-stderr flow-shard -v --shard-tokens 16K -o out corpus.txt
	[ -z "$output" ]
	[[ "$stderr" == *"out: 3 shards, 40000 train and 0 val tokens"* ]]
}

# 1.2 M tokens: more than one read of the builder (1 Mi tokens), so the
# progress callback runs more than once.
make_big_corpus() {
	for _ in $(seq 1 30); do cat corpus.txt; done >big.txt
}

@test "flow-shard shows progress with tokens/s when stderr is a terminal" {
	make_big_corpus
	run_in_terminal "flow-shard --shard-tokens 256K -o out big.txt"
	[ "$status" -eq 0 ]
	# "\r1200000 / 1200000 tokens (100%)  12.34 Mtok/s " last, then the
	# newline that ends the line ("\r\n" on the terminal; `run` drops
	# the "\n").
	[[ "$output" =~ $'\r'"1200000 / 1200000 tokens (100%)  "[0-9]+\.[0-9]{2}" Mtok/s "$'\r'$ ]]
	grep -qx 'split train 1200000 tokens 5 shards' out/manifest
}

@test "flow-shard prints no progress when stderr is not a terminal" {
	make_big_corpus
	# Standard output a terminal, standard error a file.
	run_in_terminal "flow-shard --shard-tokens 256K -o tty big.txt 2>err"
	[ "$status" -eq 0 ]
	[ -z "$output" ]
	[ -f err ] && [ ! -s err ]
	# Neither of them a terminal.
	run -0 --separate-stderr flow-shard --shard-tokens 256K -o file big.txt
	[ -z "$output" ]
	[ -z "$stderr" ]
	grep -qx 'split train 1200000 tokens 5 shards' tty/manifest
}

@test "flow-shard --info prints the manifest as TSV" {
	flow-shard --shard-tokens 30000 --val-tokens 1000 -o out corpus.txt
	run -0 --separate-stderr flow-shard --info out
	[ -z "$stderr" ]
	[[ "${lines[0]}" == "# flow-manifest 1" ]]
	header=$(printf '%s\n' "$output" | grep -v '^#' | head -1)
	[ "$header" = "$(printf 'file\tsplit\ttokens\tbytes\tchecksum')" ]
	rows=$(tsv_rows "$output")
	[ "$(printf '%s\n' "$rows" | wc -l)" -eq 3 ]
	[ "$(printf '%s\n' "$rows" | cut -f1-4 | head -1)" = "$(printf 'val-000000.bin\tval\t1000\t2072')" ]
	[ "$(printf '%s\n' "$rows" | awk -F'\t' '{ s += $3 } END { print s }')" -eq 40000 ]
}

@test "flow-shard --info --json prints the same records as JSON" {
	flow-shard --shard-tokens 30000 -o out corpus.txt
	run -0 --separate-stderr flow-shard --info out --json
	[ -z "$stderr" ]
	assert_json "$output"
	[[ "$output" == *'"file": "train-000001.bin", "split": "train", "tokens": 10000'* ]]
}

@test "flow-shard --compress writes frames that verify and list the level" {
	run -0 --separate-stderr flow-shard --compress --shard-tokens 16K -o out corpus.txt
	grep -qx 'compression zstd 3 16384' out/manifest
	run -0 --separate-stderr flow-shard --compress=19 --frame-tokens 1000 -o out19 corpus.txt
	grep -qx 'compression zstd 19 1000' out19/manifest
	run -0 flow-shard --verify out19
	# Compressed and plain datasets hold the same tokens: same order.
	flow-shard -o plain corpus.txt
	a=$(flow-shard --order out19 --seq-len 32 --batch 4 --steps 3 | cut -f4-6,8)
	b=$(flow-shard --order plain --seq-len 32 --batch 4 --steps 3 | cut -f4-6,8)
	[ -n "$a" ]
}

@test "flow-shard reads standard input" {
	run -0 --separate-stderr flow-shard -o out - <corpus.txt
	grep -qx 'split train 40000 tokens 1 shards' out/manifest
}

@test "flow-shard concatenates several inputs in order" {
	run -0 --separate-stderr flow-shard -o out "$GOOD/hello.txt" corpus.txt - <"$GOOD/hello.txt"
	n=$(( $(wc -c <"$GOOD/hello.txt") * 2 + 40000 ))
	grep -qx "split train $n tokens 1 shards" out/manifest
}

@test "flow-shard reads llm.c, raw and npy token files with --vocab" {
	run -0 --separate-stderr flow-shard --vocab 50257 -o a "$GOOD/tiny.llmc.bin"
	grep -qx 'token_dtype u16' a/manifest
	run -0 --separate-stderr flow-shard --vocab 200000 -o b "$GOOD/tiny32.llmc.bin"
	grep -qx 'token_dtype u32' b/manifest
	run -0 --separate-stderr flow-shard --vocab 50257 -o c "$GOOD/tiny.u16"
	run -0 --separate-stderr flow-shard --vocab 200000 -o d "$GOOD/tiny.u32"
	run -0 --separate-stderr flow-shard --vocab 50257 -o e "$GOOD/tiny.npy"
	run -0 --separate-stderr flow-shard --vocab 50257 --format raw --dtype u16 -o f - <"$GOOD/tiny.u16"
	for d in a b c d e f; do flow-shard --verify $d; done
}

@test "flow-shard asks for --vocab for token files that do not say it" {
	run -2 --separate-stderr flow-shard -o out "$GOOD/tiny.llmc.bin"
	[ -z "$output" ]
	[ "$stderr" = "flow-shard: $GOOD/tiny.llmc.bin: llmc input does not say its vocabulary size (pass --vocab)" ]
	assert_no_artefact out
}

@test "flow-shard refuses an existing output directory and leaves it alone" {
	mkdir out
	echo keep >out/keep
	run -1 --separate-stderr flow-shard -o out corpus.txt
	[ -z "$output" ]
	[ "$stderr" = "flow-shard: output directory 'out' already exists" ]
	[ "$(ls out)" = keep ]
	assert_no_temporaries out
}

@test "flow-shard names a missing input" {
	run -1 --separate-stderr flow-shard -o out corpus.txt nosuch.txt
	[ -z "$output" ]
	[[ "$stderr" == "flow-shard: "*"nosuch.txt"* ]]
	[ "${#stderr_lines[@]}" -eq 1 ]
	assert_no_artefact out
}

@test "flow-shard refuses --val-tokens that leave nothing to train on" {
	run -2 --separate-stderr flow-shard --val-tokens 40000 -o out corpus.txt
	[ "$stderr" = "flow-shard: the inputs hold 40000 tokens, no more than the 40000 validation tokens: none left to train on" ]
	assert_no_artefact out
}

# ---- bad input: one line naming the file, exit 1, no output -------------------

bad_input() {
	local expected=$1
	shift
	run -1 --separate-stderr flow-shard -o out "$@"
	[ -z "$output" ]
	if [ "$stderr" != "flow-shard: $expected" ]; then
		echo "got:  $stderr" >&2
		echo "want: flow-shard: $expected" >&2
		return 1
	fi
	assert_no_artefact out
}

@test "flow-shard rejects a truncated llm.c file" {
	bad_input "$BAD/truncated.llmc.bin: truncated llm.c file: the header declares 10 tokens (1044 bytes) but the file has 1036 bytes" \
		--vocab 50257 "$BAD/truncated.llmc.bin"
}

@test "flow-shard rejects trailing bytes after an llm.c file" {
	bad_input "$BAD/trailing.llmc.bin: trailing bytes in llm.c file: the header declares 4 tokens (1032 bytes) but the file has 1036 bytes" \
		--vocab 50257 "$BAD/trailing.llmc.bin"
}

@test "flow-shard rejects an unknown llm.c version" {
	bad_input "$BAD/badversion.llmc.bin: unsupported llm.c version 3 at byte 4 (expected 1 for uint16 or 2 for uint32 tokens)" \
		--vocab 50257 "$BAD/badversion.llmc.bin"
}

@test "flow-shard rejects a wrong magic with --format llmc" {
	run -1 --separate-stderr flow-shard -o out --vocab 50257 --format llmc "$BAD/badmagic.llmc.bin"
	[ -z "$output" ]
	[[ "$stderr" == "flow-shard: $BAD/badmagic.llmc.bin: not an llm.c token file (magic "*", expected 20240520)" ]]
	assert_no_artefact out
}

@test "flow-shard rejects a token id at or above the vocabulary" {
	bad_input "$BAD/bigtoken.u16: token 60000 at byte 4 is not below the vocabulary size 50257" \
		--vocab 50257 "$BAD/bigtoken.u16"
	bad_input "$BAD/bigtoken.npy: token 70000 at byte 136 is not below the vocabulary size 50257" \
		--vocab 50257 "$BAD/bigtoken.npy"
}

@test "flow-shard rejects an npy file of float dtype" {
	bad_input "$BAD/float32.npy: npy dtype '<f4' is not an integer type" \
		--vocab 50257 "$BAD/float32.npy"
}

@test "flow-shard rejects negative ids, Fortran order and broken npy headers" {
	bad_input "$BAD/negative.npy: token -1 at byte 132 is negative" --vocab 50257 "$BAD/negative.npy"
	bad_input "$BAD/fortran.npy: npy array is in Fortran order; only C order is supported" \
		--vocab 50257 "$BAD/fortran.npy"
	bad_input "$BAD/badheader.npy: bad npy header: missing 'shape'" --vocab 50257 "$BAD/badheader.npy"
	bad_input "$BAD/truncated.npy: truncated npy file: the header declares 10 tokens (168 bytes) but the file has 144 bytes" \
		--vocab 50257 "$BAD/truncated.npy"
}

@test "flow-shard rejects empty inputs" {
	bad_input "$BAD/empty.txt: empty input" "$BAD/empty.txt"
	bad_input "$BAD/empty.llmc.bin: empty input" --vocab 50257 "$BAD/empty.llmc.bin"
}

@test "flow-shard rejects a raw file with a partial token" {
	bad_input "$BAD/odd.u16: raw u16 input has 5 bytes, not a multiple of 2 (partial token at byte 4)" \
		--vocab 50257 "$BAD/odd.u16"
}

@test "flow-shard removes everything when a later input is bad" {
	bad_input "$BAD/bigtoken.u16: token 60000 at byte 4 is not below the vocabulary size 50257" \
		--vocab 50257 --shard-tokens 2 "$GOOD/tiny.u16" "$BAD/bigtoken.u16"
}

# ---- interruption -----------------------------------------------------------------

@test "an interrupted run leaves nothing under the final name" {
	for sig in TERM INT; do
		rm -f fifo
		mkfifo fifo
		flow-shard --format text --shard-tokens 1K -o out fifo 2>err 3>&- &
		pid=$!
		# fd 3 is bats' own output channel: use 5.
		exec 5>fifo
		# More than the reader's 64 KiB buffer, so shards get written;
		# the open fifo then keeps the run waiting for more.
		cat corpus.txt corpus.txt corpus.txt corpus.txt >&5
		# Wait until shards are being written into the temporary directory.
		for _ in $(seq 1 100); do
			[ -n "$(ls out.tmp.*/ 2>/dev/null | grep train || true)" ] && break
			sleep 0.05
		done
		[ -n "$(ls out.tmp.*/ 2>/dev/null | grep train || true)" ]
		kill -"$sig" "$pid"
		status=0
		wait "$pid" || status=$?
		exec 5>&-
		if [ "$sig" = TERM ]; then [ "$status" -eq 143 ]; else [ "$status" -eq 130 ]; fi
		assert_no_artefact out
	done
}

# ---- verify ------------------------------------------------------------------------

@test "flow-shard --verify names the first bad file and byte offset" {
	flow-shard --shard-tokens 16K -o out corpus.txt
	cp -r out copy
	printf '\x41' | dd of=copy/train-000001.bin bs=1 seek=1000 conv=notrunc status=none
	run -1 --separate-stderr flow-shard --verify copy
	[ -z "$output" ]
	[[ "$stderr" == "flow-shard: copy/train-000001.bin: checksum mismatch at byte 32832: stored "*", computed "* ]]
	run -0 flow-shard --verify out
}

@test "flow-shard --verify finds a truncated shard and a bad magic" {
	flow-shard --compress --frame-tokens 4096 --shard-tokens 16K -o out corpus.txt
	cp -r out t
	truncate -s -1 t/train-000002.bin
	run -1 --separate-stderr flow-shard --verify t
	[[ "$stderr" == "flow-shard: t/train-000002.bin: truncated at byte "*": the header says the file has "*" bytes" ]]
	cp -r out m
	printf 'X' | dd of=m/train-000000.bin bs=1 seek=0 conv=notrunc status=none
	run -1 --separate-stderr flow-shard --verify m
	[ "$stderr" = "flow-shard: m/train-000000.bin: bad magic at byte 0: not a flow shard" ]
}

@test "flow-shard --verify finds a damaged manifest and a missing shard" {
	flow-shard --shard-tokens 16K -o out corpus.txt
	cp -r out a
	sed -i 's/^vocab 256$/vocab 257/' a/manifest
	run -1 --separate-stderr flow-shard --verify a
	[[ "$stderr" == "flow-shard: a/manifest:10: checksum mismatch: stored "* ]]
	cp -r out b
	rm b/train-000001.bin
	run -1 --separate-stderr flow-shard --verify b
	[ "$stderr" = "flow-shard: cannot open 'b/train-000001.bin': No such file or directory" ]
	run -1 --separate-stderr flow-shard --verify nosuch
	[ "$stderr" = "flow-shard: cannot open 'nosuch/manifest': No such file or directory" ]
	run -1 --separate-stderr flow-shard --info nosuch
	[ "$stderr" = "flow-shard: cannot open 'nosuch/manifest': No such file or directory" ]
}

# ---- order -------------------------------------------------------------------------

@test "flow-shard --order prints one row per sample of the rank" {
	flow-shard --shard-tokens 16K -o out corpus.txt
	run -0 --separate-stderr flow-shard --order out --seq-len 64 --batch 8 --steps 3
	[ -z "$stderr" ]
	[ "${lines[0]}" = "$(printf 'step\trank\tslot\tposition\tepoch\tsample\tfile\toffset')" ]
	[ "$(tsv_rows "$output" | wc -l)" -eq 24 ]
	run -0 --separate-stderr flow-shard --order out --seq-len 64 --batch 8 --steps 3 --json
	assert_json "$output"
}

@test "flow-shard --order is the same stream in the union of ranks for world 1 and 2" {
	flow-shard --shard-tokens 16K -o out corpus.txt
	common=(--order out --seq-len 32 --batch 8 --steps 20 --seed 7)
	one=$(flow-shard "${common[@]}" | tail -n +2 | cut -f1,3- | sort)
	two=$( { flow-shard "${common[@]}" --world 2 --rank 0 | tail -n +2
		 flow-shard "${common[@]}" --world 2 --rank 1 | tail -n +2; } | cut -f1,3- | sort)
	[ -n "$one" ]
	[ "$one" = "$two" ]
	# --start-step continues the same stream.
	late=$(flow-shard "${common[@]}" --start-step 10 --steps 10 | tail -n +2 | cut -f1,3-)
	full=$(flow-shard "${common[@]}" | tail -n +2 | cut -f1,3- | awk -F'\t' '$1 >= 10')
	[ "$late" = "$full" ]
	# Another seed, another order.
	other=$(flow-shard --order out --seq-len 32 --batch 8 --steps 20 --seed 8 | tail -n +2 | cut -f1,3- | sort)
	[ "$one" != "$other" ]
}

@test "flow-shard --order checks its options" {
	run -2 --separate-stderr flow-shard --order out --batch 8 --steps 1
	assert_usage_error flow-shard "'--order' needs '--seq-len'"
	run -2 --separate-stderr flow-shard --order out --seq-len 8 --steps 1
	assert_usage_error flow-shard "'--order' needs '--batch'"
	run -2 --separate-stderr flow-shard --order out --seq-len 8 --batch 8
	assert_usage_error flow-shard "'--order' needs '--steps'"
	run -2 --separate-stderr flow-shard --order out --seq-len 8 --batch 8 --steps 1 --world 2 --rank 2
	assert_usage_error flow-shard "--rank 2 is not below --world 2"
	run -2 --separate-stderr flow-shard --order out --seq-len 8 --batch 6 --steps 1 --world 4
	assert_usage_error flow-shard "--world 4 does not divide --batch 6"
	run -2 --separate-stderr flow-shard --order out --seq-len 8 --batch 8 --steps 1 --split test
	assert_usage_error flow-shard "--split: unknown split 'test' (expected train or val)"
	run -1 --separate-stderr flow-shard --order nosuch --seq-len 8 --batch 8 --steps 1
	[ "$stderr" = "flow-shard: cannot open 'nosuch/manifest': No such file or directory" ]
}

@test "flow-shard --order --split val reads the val shards" {
	flow-shard --shard-tokens 16K --val-tokens 8000 -o out corpus.txt
	run -0 --separate-stderr flow-shard --order out --split val --seq-len 64 --batch 4 --steps 2
	[ "$(tsv_rows "$output" | cut -f7 | sort -u)" = "val-000000.bin" ]
}

@test "flow-shard does not fail when the reader of stdout goes away" {
	flow-shard --shard-tokens 16K -o out corpus.txt
	run -0 --separate-stderr bash -c 'flow-shard --order out --seq-len 8 --batch 8 --steps 100000 | head -1'
	[ -z "$stderr" ]
}
