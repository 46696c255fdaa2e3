#!/usr/bin/env bats
# Faults around the artefact writers and readers on one process: a disk that
# fills up (a small tmpfs), SIGINT/SIGTERM in the middle of a write, kill -9
# in the middle of a checkpoint, and one flipped byte anywhere in a shard or
# a checkpoint.  In every case: exit 1 (128+N after a signal) with one line
# that names the file, earlier artefacts byte for byte as they were, no
# temporary left behind, and a resume that continues exactly.
#
# Mid-write is made certain, not hoped for: the temporary a writer will
# open ("<name>.tmp.<pid>", see lib/core/file.c) is created beforehand as a
# FIFO by a shell that then execs the tool (so the pid is known), and the
# test holds the FIFO open read-write without reading: the tool blocks in
# write(2) once the pipe is full, with some of its bytes written.
#
# Signals during flow-shard's build are in flow-shard.bats ("an interrupted
# run leaves nothing under the final name"); under the --nproc launcher in
# tests/cluster/faults.bats; SIGTERM during flow-ckpt reshard in
# flow-ckpt.bats.

bats_require_minimum_version 1.5.0
load common

MODEL=gpt:layers=2,heads=2,dim=32,vocab=256,seq=32
TRAIN=(--model "$MODEL" --batch 4 --seq-len 32 --peak-gflops 0)
PLAN=(--model gpt2-1.5b --mesh 4 --axes dp --batch 4)

setup_file() {
	cd "$BATS_FILE_TMPDIR"
	fox_corpus 3000 corpus.txt
	flow-shard -q -o data --val-tokens 8K corpus.txt
	flow-shard -q -o zdata --val-tokens 8K --compress --frame-tokens 4096 corpus.txt
	# The uninterrupted runs every resume is held to.
	flow-train "${TRAIN[@]}" --data data --steps 20 >full20.tsv
	flow-train "${TRAIN[@]}" --data data --steps 200 >full200.tsv
	flow-train "${TRAIN[@]}" --data data --steps 2 --ckpt-dir ck >/dev/null
	flow-train "${TRAIN[@]}" --data data --steps 4 --ckpt-dir ck4 --ckpt-every 2 >ck4.tsv
}

setup() {
	cd "$BATS_TEST_TMPDIR"
	DATA=$BATS_FILE_TMPDIR/data
	ZDATA=$BATS_FILE_TMPDIR/zdata
	MNT=
}

teardown() {
	exec 5<&- 2>/dev/null || true
	if [ -n "$MNT" ]; then
		umount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
	fi
}

# step, phase, loss, lr, grad_norm of the rows of TSV file $1.
numbers() {
	grep -v '^#' "$1" | tail -n +2 | cut -f1-5
}

# The last `run --separate-stderr` failed with exit $1 and exactly one
# line on stderr, nothing else.
assert_one_line_failure() {
	if [ "$status" -ne "$1" ]; then
		echo "expected exit $1, got $status; stderr: $stderr" >&2
		return 1
	fi
	if [ "${#stderr_lines[@]}" -ne 1 ]; then
		echo "expected one line on stderr, got:" >&2
		printf '%s\n' "$stderr" >&2
		return 1
	fi
}

# assert_match TEXT ERE: TEXT matches the extended regular expression.
assert_match() {
	if ! [[ $1 =~ $2 ]]; then
		echo "expected '$2', got: $1" >&2
		return 1
	fi
}

# Every file under directory $1 (recursively), with its checksum: the
# state that a failed write must leave exactly as it was.
snapshot() {
	(cd "$1" && find . -print0 | LC_ALL=C sort -z |
		xargs -0 -I{} sh -c 'if [ -f "{}" ]; then printf "%s %s\n" "{}" "$(cksum <"{}")"; else printf "%s\n" "{}"; fi')
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

# ---- a disk that fills up ---------------------------------------------------------------

# small_disk SIZE: mount a tmpfs of SIZE on ./disk (skip when that cannot
# be done here: not root, no tmpfs).
small_disk() {
	[ "$(id -u)" = 0 ] || skip "not root: cannot mount a small tmpfs"
	mkdir disk
	mount -t tmpfs -o size="$1" flow-faults disk 2>mount.err ||
		skip "cannot mount a tmpfs: $(cat mount.err)"
	MNT=$PWD/disk
}

# fill_disk: use up the rest of ./disk with one file.
fill_disk() {
	dd if=/dev/zero of=disk/filler bs=4k 2>/dev/null || true
	[ "$(stat -f -c %a disk)" -eq 0 ]
}

@test "disk full: flow-shard fails naming the shard, leaves the other dataset and no temporary" {
	small_disk 1M
	flow-shard -q -o disk/old --shard-tokens 4K --val-tokens 1K "$BATS_FILE_TMPDIR/corpus.txt"
	fill_disk
	snapshot disk >before
	run --separate-stderr flow-shard -q -o disk/new --shard-tokens 4K "$BATS_FILE_TMPDIR/corpus.txt"
	assert_one_line_failure 1
	assert_match "${stderr_lines[0]}" "^flow-shard: cannot write 'disk/new\\.tmp\\.[0-9]+/(train|val)-[0-9]{6}\\.bin(\\.tmp\\.[0-9]+)?': No space left on device\$"
	snapshot disk >after
	diff before after
	[ ! -e disk/new ]
	assert_no_temporaries_under disk
	run -0 flow-shard --verify disk/old
}

@test "disk full: a checkpoint fails naming the file, the previous one stays byte for byte" {
	small_disk 2M
	mkdir disk/ck
	cp -r "$BATS_FILE_TMPDIR/ck4/step-00000002" disk/ck/
	fill_disk
	snapshot disk >before
	# It resumes from step 2, trains steps 3 and 4 and writes step 4.
	run --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 4 --ckpt-dir disk/ck \
		--ckpt-every 2 --resume latest
	assert_one_line_failure 1
	assert_match "${stderr_lines[0]}" "^flow-train: cannot write 'disk/ck/step-00000004/rank-00000\\.bin\\.tmp\\.[0-9]+': No space left on device\$"
	snapshot disk >after
	# Nothing of step 4 is left, not even its directory.
	diff before after
	assert_no_temporaries_under disk
	rm disk/filler
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 4 --ckpt-dir disk/ck \
		--ckpt-every 2 --resume latest
	[[ "$output" == *"# resumed from disk/ck/step-00000002 (step 2)"* ]]
	diff <(numbers "$BATS_FILE_TMPDIR/ck4.tsv" | tail -n 2) <(printf '%s\n' "$output" | grep -v '^#' | tail -n +2 | cut -f1-5)
	[ -f disk/ck/step-00000004/manifest ]
}

@test "disk full: flow-plan -o fails naming the file and keeps the old plan" {
	small_disk 512K
	flow-plan --model "$MODEL" --mesh 2 --axes dp --batch 4 -o disk/p.plan
	fill_disk
	snapshot disk >before
	run --separate-stderr flow-plan "${PLAN[@]}" -o disk/p.plan
	assert_one_line_failure 1
	assert_match "${stderr_lines[0]}" "^flow-plan: cannot write 'disk/p\\.plan\\.tmp\\.[0-9]+': No space left on device\$"
	snapshot disk >after
	diff before after
	assert_no_temporaries_under disk
}

@test "disk full: flow-ckpt reshard fails naming the file, leaves nothing under OUT" {
	small_disk 1M
	cp -r "$BATS_FILE_TMPDIR/ck/step-00000002" disk/src
	flow-plan --model "$MODEL" --mesh 2 --axes dp --batch 4 --zero 3 -o z3.plan
	fill_disk
	snapshot disk >before
	run --separate-stderr flow-ckpt reshard disk/src --plan z3.plan -o disk/out
	assert_one_line_failure 1
	assert_match "${stderr_lines[0]}" "^flow-ckpt: cannot write 'disk/out\\.tmp\\.[0-9]+/rank-0000[01]\\.(bin|idx)(\\.tmp\\.[0-9]+)?': No space left on device\$"
	snapshot disk >after
	diff before after
	[ ! -e disk/out ]
	assert_no_temporaries_under disk
	rm disk/filler
	run -0 flow-ckpt reshard disk/src --plan z3.plan -o disk/out
	run -0 flow-ckpt diff disk/src disk/out
}

# ---- SIGINT and SIGTERM in the middle of a write --------------------------------------

# start_held PREFIX CMD...: create PREFIX<pid> as a FIFO, run CMD in the
# background as that pid, hold the FIFO open on fd 5 and wait until CMD
# has written into it.  Sets HELD_PID and HELD_TEMP.
start_held() {
	local temp i
	# shellcheck disable=SC2016 # $$ is the inner shell's, which execs CMD
	sh -c 'mkdir -p "$(dirname "$1")" && mkfifo "$1$$" && shift && exec "$@"' \
		sh "$@" >held.out 2>held.err 5<&- &
	HELD_PID=$!
	temp=$1$HELD_PID
	for i in $(seq 1 600); do
		[ -p "$temp" ] && break
		sleep 0.05
	done
	[ -p "$temp" ]
	exec 5<>"$temp"
	# Readable once the tool has opened it and written its first bytes.
	for i in $(seq 1 1200); do
		read -r -t 0 -u 5 && break
		kill -0 "$HELD_PID" 2>/dev/null || break
		sleep 0.05
	done
	read -r -t 0 -u 5
	HELD_TEMP=$temp
}

# stop_held SIG: send SIG to the held tool, wait for it, release the FIFO;
# $status is the tool's exit status.
stop_held() {
	kill -"$1" "$HELD_PID"
	status=0
	wait "$HELD_PID" || status=$?
	exec 5<&-
}

@test "SIGINT and SIGTERM while flow-plan writes: no plan, no temporary, 128+N" {
	for sig in INT TERM; do
		rm -f p.plan
		start_held p.plan.tmp. flow-plan "${PLAN[@]}" -o p.plan
		stop_held "$sig"
		if [ "$sig" = TERM ]; then [ "$status" -eq 143 ]; else [ "$status" -eq 130 ]; fi
		[ ! -s held.err ]
		[ ! -e "$HELD_TEMP" ]
		assert_no_artefact p.plan
	done
}

@test "SIGINT and SIGTERM while flow-plan replaces a plan: the old one stays" {
	flow-plan --model "$MODEL" --mesh 2 --axes dp --batch 4 -o p.plan
	cp p.plan old.plan
	for sig in INT TERM; do
		start_held p.plan.tmp. flow-plan "${PLAN[@]}" -o p.plan
		stop_held "$sig"
		if [ "$sig" = TERM ]; then [ "$status" -eq 143 ]; else [ "$status" -eq 130 ]; fi
		cmp p.plan old.plan
		assert_no_temporaries p.plan
	done
}

@test "SIGINT and SIGTERM while flow-train writes a checkpoint: temporaries removed, 128+N" {
	for sig in INT TERM; do
		rm -rf ck
		start_held ck/step-00000010/rank-00000.bin.tmp. \
			flow-train "${TRAIN[@]}" --data "$DATA" --steps 20 --ckpt-dir ck --ckpt-every 5
		stop_held "$sig"
		if [ "$sig" = TERM ]; then [ "$status" -eq 143 ]; else [ "$status" -eq 130 ]; fi
		[ ! -s held.err ]
		assert_no_temporaries_under ck
		[ ! -e ck/step-00000010/manifest ]
		[ -f ck/step-00000005/manifest ]
		# The rows before the signal (step 10's comes after its
		# checkpoint) are those of the full run.
		numbers held.out >got.rows
		[ "$(wc -l <got.rows)" -eq 9 ]
		diff <(numbers "$BATS_FILE_TMPDIR/full20.tsv" | head -n 9) got.rows
		run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 20 --ckpt-dir ck \
			--ckpt-every 5 --resume latest
		[[ "$output" == *"# resumed from ck/step-00000005 (step 5)"* ]]
		diff <(numbers "$BATS_FILE_TMPDIR/full20.tsv" | tail -n 15) <(printf '%s\n' "$output" | grep -v '^#' | tail -n +2 | cut -f1-5)
	done
}

# ---- kill -9 during a checkpoint ------------------------------------------------------

@test "kill -9 mid-checkpoint: --resume latest takes the last committed one, ignoring half-written ones" {
	start_held ck/step-00000010/rank-00000.bin.tmp. \
		flow-train "${TRAIN[@]}" --data "$DATA" --steps 20 --ckpt-dir ck --ckpt-every 5
	stop_held KILL
	[ "$status" -eq 137 ]
	[ ! -e ck/step-00000010/manifest ]
	# A later step directory whose commit never happened: data and index,
	# no manifest.
	cp -r ck/step-00000005 ck/step-00000015
	rm ck/step-00000015/manifest
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 20 --ckpt-dir ck \
		--ckpt-every 5 --resume latest
	printf '%s\n' "$output" >resumed.tsv
	grep -qx '# resumed from ck/step-00000005 (step 5)' resumed.tsv
	diff <(numbers "$BATS_FILE_TMPDIR/full20.tsv" | tail -n 15) <(numbers resumed.tsv)
	[ -f ck/step-00000010/manifest ] && [ -f ck/step-00000015/manifest ] &&
		[ -f ck/step-00000020/manifest ]
}

@test "kill -9 at random moments of a run that checkpoints every step: each resume continues exactly" {
	local full=$BATS_FILE_TMPDIR/full200.tsv resume=() round pid n from st
	for round in 1 2 3 4; do
		n=$(find ck -name manifest 2>/dev/null | wc -l)
		flow-train "${TRAIN[@]}" --data "$DATA" --steps 200 --ckpt-dir ck --ckpt-every 1 \
			"${resume[@]}" >"run$round.tsv" 2>"run$round.err" &
		pid=$!
		# At least one more checkpoint, then anywhere in the next ones.
		for _ in $(seq 1 1200); do
			[ "$(find ck -name manifest 2>/dev/null | wc -l)" -gt "$n" ] && break
			sleep 0.02
		done
		sleep "0.0$((RANDOM % 10))$((RANDOM % 10))"
		kill -9 "$pid"
		st=0
		wait "$pid" || st=$?
		# It died of the kill, in the middle of the run.
		[ "$st" -eq 137 ]
		[ ! -e ck/step-00000200/manifest ]
		# What it printed before it died is the full run's.
		from=$(sed -n 's/^# resumed from .* (step \([0-9]*\))$/\1/p' "run$round.tsv")
		numbers "run$round.tsv" >got.rows
		numbers "$full" | tail -n +"$((${from:-0} + 1))" | head -n "$(wc -l <got.rows)" >want.rows
		diff want.rows got.rows
		echo "round $round: resumed from step ${from:-0}, killed after $(wc -l <got.rows) rows"
		resume=(--resume latest)
	done
	run -0 --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 200 --ckpt-dir ck \
		--ckpt-every 1 --resume latest
	printf '%s\n' "$output" >last.tsv
	from=$(sed -n 's/^# resumed from .* (step \([0-9]*\))$/\1/p' last.tsv)
	[ -n "$from" ] && [ "$from" -gt 0 ]
	diff <(numbers "$full" | tail -n +"$((from + 1))") <(numbers last.tsv)
	[ -f ck/step-00000200/manifest ]
}

# ---- a flipped byte --------------------------------------------------------------------

# flip FILE OFFSET: xor the byte at OFFSET of FILE with 0x5a.
flip() {
	local old
	old=$(od -A n -t u1 -j "$2" -N 1 "$1" | tr -d ' ')
	# shellcheck disable=SC2059 # an octal escape made here
	printf "\\$(printf '%03o' $((old ^ 0x5a)))" |
		dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

# shard_flip_case DATASET OFFSET WANT: train from a copy of DATASET with
# byte OFFSET of train-000000.bin flipped: one line naming the shard and a
# byte offset that WANT (offsets separated by '|') allows, and the same of
# flow-shard --verify.  A field whose damage keeps the header consistent
# may be found by a later check or by the checksum, at the trailer.
shard_flip_case() {
	local ds=$1 off=$2 want=$3
	rm -rf f
	cp -r "$ds" f
	flip f/train-000000.bin "$off"
	run --separate-stderr flow-shard --verify f
	assert_one_line_failure 1
	assert_match "${stderr_lines[0]}" "^flow-shard: f/train-000000\\.bin: .*at byte ($want)[^0-9]"
	run --separate-stderr flow-train "${TRAIN[@]}" --data f --steps 2
	assert_one_line_failure 1
	assert_match "${stderr_lines[0]}" "^flow-train: f/train-000000\\.bin: .*at byte ($want)[^0-9]"
	# No step may have been trained on it.
	[ -z "$(tsv_rows "$output")" ]
}

# The header and payload lengths of shard $1.
shard_hp() {
	local h p
	h=$(od -A n -t u4 -j 12 -N 4 "$1" | tr -d ' ')
	p=$(od -A n -t u8 -j 48 -N 8 "$1" | tr -d ' ')
	echo "$h $p"
}

# Training must find what flow-shard --verify finds, at the same byte: the
# loader checks each shard's checksum once before first use (and every
# token id), so no flipped byte is trained on.
@test "a flipped byte in a shard's header or frame index fails training, naming file and offset" {
	local h p
	read -r h p < <(shard_hp "$ZDATA/train-000000.bin")
	# Header length, token count, reserved; the index entry of frame 3.
	# A compressed shard's token count still fits its frame count: the
	# manifest's count or the checksum finds it.  An uncompressed one's
	# no longer fits the payload length (byte 48).
	shard_flip_case "$ZDATA" 12 12
	shard_flip_case "$ZDATA" 24 "24|$((h + p))"
	shard_flip_case "$ZDATA" 56 56
	shard_flip_case "$ZDATA" 112 112
	shard_flip_case "$DATA" 12 12
	shard_flip_case "$DATA" 24 "24|48"
	shard_flip_case "$DATA" 56 56
}

@test "a flipped byte in a shard's payload or trailer fails training, naming file and offset" {
	local h p
	# The checksum covers header and payload: a mismatch is reported at
	# the trailer.  Low bytes of a u16 id stay below the vocabulary (256),
	# so only the checksum can find them.
	read -r h p < <(shard_hp "$DATA/train-000000.bin")
	shard_flip_case "$DATA" "$h" $((h + p))
	shard_flip_case "$DATA" $((h + p / 2 - (p / 2) % 2)) $((h + p))
	shard_flip_case "$DATA" $((h + p + 3)) $((h + p))
	read -r h p < <(shard_hp "$ZDATA/train-000000.bin")
	shard_flip_case "$ZDATA" $((h + 100)) $((h + p))
	shard_flip_case "$ZDATA" $((h + p / 2)) $((h + p))
	shard_flip_case "$ZDATA" $((h + p + 7)) $((h + p))
}

# ckpt_flip_case FILE OFFSET: resume from a copy of the step 2 checkpoint
# with byte OFFSET of FILE flipped: one line, exit 1, naming the file and
# where (text files: the line; data: the offset of the damaged shard).
ckpt_flip_case() {
	local file=$1 off=$2 shard_at
	rm -rf fl
	cp -r "$BATS_FILE_TMPDIR/ck/step-00000002" fl
	flip "fl/$file" "$off"
	run --separate-stderr flow-train "${TRAIN[@]}" --data "$DATA" --steps 2 --resume fl
	assert_one_line_failure 1
	[ -z "$output" ]
	case $file in
	*.bin)
		# The shard holding the byte: "shard NAME RANK BOX FILE OFFSET LENGTH SUM".
		shard_at=$(awk -v o="$off" '$1 == "shard" && $6 <= o && o < $6 + $7 { print $6 }' \
			"$BATS_FILE_TMPDIR/ck/step-00000002/manifest")
		assert_match "${stderr_lines[0]}" "^flow-train: fl/$file: checksum mismatch in tensor '[^']+' shard [0-9:,]+ at offset $shard_at: "
		;;
	*)
		assert_match "${stderr_lines[0]}" "^flow-train: fl/$file:[1-9][0-9]*: "
		;;
	esac
}

@test "a flipped byte anywhere in a checkpoint fails the resume, naming the file and where" {
	local f size off
	for f in rank-00000.bin rank-00000.idx manifest; do
		size=$(stat -c %s "$BATS_FILE_TMPDIR/ck/step-00000002/$f")
		for off in 0 10 $((size / 3)) $((size / 2)) $((size - 3)); do
			ckpt_flip_case "$f" "$off"
		done
	done
}
