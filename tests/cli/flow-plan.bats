#!/usr/bin/env bats
# flow-plan: help, version and every usage error; --slices rows for the
# documented examples and for uneven shapes and placements; invalid
# layouts; --boxing plans (the kinds of steps of each 1-D rule, a nested
# conversion through middle layouts, placement changes), --verify in the
# reference executor, cluster profiles and their errors; --signatures; and
# --json in every mode.

bats_require_minimum_version 1.5.0
load common

setup() {
	cd "$BATS_TEST_TMPDIR"
}

# Evaluate the Python expression $2 over the JSON document $1 (as d) and
# print the result as compact JSON.
json_eval() {
	printf '%s\n' "$1" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
print(json.dumps(eval(sys.argv[1]), separators=(",", ":")))' "$2"
}

# The "kind" column of the step rows (no total row) of a --boxing output.
step_kinds() {
	tsv_rows "$1" | awk -F'\t' '$1 != "total" { printf "%s%s", sep, $2; sep = " " } END { print "" }'
}

# Field $2 (by header name) of the total row of a --boxing output.
total_field() {
	printf '%s\n' "$1" | grep -v '^#' | awk -F'\t' -v name="$2" '
		NR == 1 { for (i = 1; i <= NF; i++) if ($i == name) col = i; next }
		$1 == "total" { print $col }'
}

# ---- help, version, usage errors ----------------------------------------------

@test "flow-plan --help prints the usage on stdout and exits 0" {
	run -0 --separate-stderr flow-plan --help
	[ -z "$stderr" ]
	[ "${lines[0]}" = "Usage: flow-plan --slices SHAPE --mesh MESH --sbp NDSBP [--dtype T]" ]
	[[ "$output" == *"--boxing SHAPE"* ]]
	[[ "$output" == *"--signatures OP"* ]]
	[[ "$output" == *"--verify"* ]]
}

@test "flow-plan -h is --help" {
	run -0 --separate-stderr flow-plan -h
	[[ "${lines[0]}" == "Usage: flow-plan"* ]]
}

@test "flow-plan --version prints the version and the build features" {
	run -0 --separate-stderr flow-plan --version
	[ -z "$stderr" ]
	[[ "${lines[0]}" =~ ^flow-plan\ [0-9]+\.[0-9]+\.[0-9]+$ ]]
	[[ "${lines[1]}" == *"cuda: "* ]]
}

@test "flow-plan without a mode is a usage error" {
	run -2 --separate-stderr flow-plan
	assert_usage_error flow-plan "missing mode (--slices, --boxing, --signatures, --model or --check)"
	run -2 --separate-stderr flow-plan --mesh 2x2
	assert_usage_error flow-plan "missing mode (--slices, --boxing, --signatures, --model or --check)"
}

@test "flow-plan rejects an unknown option" {
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2x2 --spb B
	[ "${stderr_lines[0]}" = "flow-plan: unknown option '--spb'" ]
	assert_usage_error flow-plan "unknown option '--spb'"
	run -2 --separate-stderr flow-plan -x
	assert_usage_error flow-plan "unknown option '-x'"
}

@test "flow-plan rejects an option without its value" {
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh
	[ "${stderr_lines[0]}" = "flow-plan: option '--mesh' needs a value" ]
	assert_usage_error flow-plan "option '--mesh' needs a value"
}

@test "flow-plan rejects an unexpected argument" {
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2x2 --sbp B extra
	[ "${stderr_lines[0]}" = "flow-plan: unexpected argument 'extra'" ]
	assert_usage_error flow-plan "unexpected argument 'extra'"
}

@test "flow-plan rejects conflicting modes" {
	run -2 --separate-stderr flow-plan --slices 6x8 --boxing 6x8 --mesh 2
	[ "${stderr_lines[0]}" = "flow-plan: conflicting modes '--slices' and '--boxing'" ]
	assert_usage_error flow-plan "conflicting modes '--slices' and '--boxing'"
	run -2 --separate-stderr flow-plan --signatures matmul --slices 6x8
	assert_usage_error flow-plan "conflicting modes '--signatures' and '--slices'"
}

@test "flow-plan rejects the options of another mode" {
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2 --sbp B --from B
	[ "${stderr_lines[0]}" = "flow-plan: '--from' needs '--boxing'" ]
	assert_usage_error flow-plan "'--from' needs '--boxing'"
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2 --sbp B --verify
	assert_usage_error flow-plan "'--verify' needs '--boxing'"
	run -2 --separate-stderr flow-plan --boxing 6x8 --mesh 2 --from B --to B --sbp B
	assert_usage_error flow-plan "'--sbp' needs '--slices'"
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2 --sbp B --heads 4
	assert_usage_error flow-plan "'--heads' needs '--signatures'"
	run -2 --separate-stderr flow-plan --signatures gelu --shapes '4->4' --dtype bf16
	assert_usage_error flow-plan "'--dtype' needs '--slices' or '--boxing'"
	run -2 --separate-stderr flow-plan --signatures gelu --shapes '4->4' --limit 3
	assert_usage_error flow-plan "'--limit' needs '--mesh'"
}

@test "flow-plan names the option each mode is missing" {
	run -2 --separate-stderr flow-plan --slices 6x8 --sbp B
	[ "${stderr_lines[0]}" = "flow-plan: '--slices' needs '--mesh'" ]
	assert_usage_error flow-plan "'--slices' needs '--mesh'"
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2
	assert_usage_error flow-plan "'--slices' needs '--sbp'"
	run -2 --separate-stderr flow-plan --boxing 6x8 --from B --to B
	assert_usage_error flow-plan "'--boxing' needs '--mesh'"
	run -2 --separate-stderr flow-plan --boxing 6x8 --mesh 2 --to B
	assert_usage_error flow-plan "'--boxing' needs '--from'"
	run -2 --separate-stderr flow-plan --boxing 6x8 --mesh 2 --from B
	assert_usage_error flow-plan "'--boxing' needs '--to'"
	run -2 --separate-stderr flow-plan --signatures matmul
	assert_usage_error flow-plan "'--signatures' needs '--shapes'"
}

@test "flow-plan rejects bad shapes, dtypes and numbers" {
	run -2 --separate-stderr flow-plan --slices 6y8 --mesh 2 --sbp B
	[ "${stderr_lines[0]}" = "flow-plan: --slices: invalid shape '6y8': expected dimensions like 2,3,4" ]
	assert_usage_error flow-plan "--slices: invalid shape '6y8'"
	run -2 --separate-stderr flow-plan --boxing 6x --mesh 2 --from B --to B
	assert_usage_error flow-plan "--boxing: invalid shape '6x': expected dimensions like 2,3,4"
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2 --sbp B --dtype f8
	[ "${stderr_lines[0]}" = "flow-plan: --dtype: unknown dtype 'f8' (expected f32, bf16, f16, i32, i64, u16, u8 or u32)" ]
	assert_usage_error flow-plan "--dtype: unknown dtype 'f8'"
	run -2 --separate-stderr flow-plan --signatures reshape --shapes '4x4->16' --mesh 2 --limit x
	assert_usage_error flow-plan "--limit: "
	run -2 --separate-stderr flow-plan --signatures attention --shapes '2x4x96->2x4x32' --heads 0
	assert_usage_error flow-plan "--heads: "
	run -2 --separate-stderr flow-plan --signatures transpose --shapes '4x8->8x4' --perm 1,,0
	[ "${stderr_lines[0]}" = "flow-plan: --perm: expected dimensions like 0,2 in '1,,0'" ]
	assert_usage_error flow-plan "--perm: expected dimensions like 0,2 in '1,,0'"
	run -2 --separate-stderr flow-plan --slices 4000000000x4000000000x4000000000 --mesh 2 --sbp B
	assert_usage_error flow-plan "--slices: shape '4000000000x4000000000x4000000000' has too many elements"
}

@test "flow-plan rejects meshes and nd-SBPs that do not parse" {
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2x --sbp B
	assert_usage_error flow-plan "--mesh: "
	[[ "${stderr_lines[0]}" == *"'2x'"* ]]
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2x2 --sbp '(S(0),Q)'
	assert_usage_error flow-plan "--sbp: "
	[[ "${stderr_lines[0]}" == *"'(S(0),Q)'"* ]]
	run -2 --separate-stderr flow-plan --boxing 6x8 --mesh 2 --from B --to 'S(x)'
	assert_usage_error flow-plan "--to: "
	run -2 --separate-stderr flow-plan --boxing 6x8 --mesh 2 --from B --to B --to-mesh 0
	assert_usage_error flow-plan "--to-mesh: "
}

@test "flow-plan rejects malformed --shapes" {
	run -2 --separate-stderr flow-plan --signatures gelu --shapes '4x4'
	[ "${stderr_lines[0]}" = "flow-plan: --shapes: expected IN;...->OUT;... in '4x4'" ]
	assert_usage_error flow-plan "--shapes: expected IN;...->OUT;... in '4x4'"
	run -2 --separate-stderr flow-plan --signatures gelu --shapes '4x4->'
	assert_usage_error flow-plan "--shapes: missing output shape in '4x4->'"
	run -2 --separate-stderr flow-plan --signatures gelu --shapes '4x4->4y4'
	assert_usage_error flow-plan "--shapes: invalid shape '4y4': expected dimensions like 2,3,4"
	run -2 --separate-stderr flow-plan --signatures add --shapes '1;2;3;4;5;6->1'
	assert_usage_error flow-plan "--shapes: more than 5 inputs in '1;2;3;4;5;6->1'"
}

# ---- --slices -------------------------------------------------------------------

@test "flow-plan --slices gives (S(0),S(0)) on 2x2 over 6 rows as 2, 1, 2 and 1 rows" {
	run -0 --separate-stderr flow-plan --slices 6x8 --mesh 2x2 --sbp '(S(0),S(0))'
	[ -z "$stderr" ]
	[ "${lines[0]}" = "# slices of (6,8) on mesh 2x2 as (S(0),S(0)): 1 copy of each element, at most 64 bytes (f32) per rank" ]
	[ "${lines[1]}" = "$(printf 'rank\tcoords\tbox\tshape\telements')" ]
	[ "$(tsv_rows "$output")" = "$(printf '%s\t%s\t%s\t%s\t%s\n' \
		0 0,0 0:2,0:8 '(2,8)' 16 \
		1 0,1 2:3,0:8 '(1,8)' 8 \
		2 1,0 3:5,0:8 '(2,8)' 16 \
		3 1,1 5:6,0:8 '(1,8)' 8)" ]
	[ "${#lines[@]}" -eq 6 ]
}

@test "flow-plan --slices accepts the shape as (6,8) and a 1-D nd-SBP without parentheses" {
	run -0 --separate-stderr flow-plan --slices '(6,8)' --mesh 4 --sbp 'S(1)'
	[ "${lines[0]}" = "# slices of (6,8) on mesh 4 as (S(1)): 1 copy of each element, at most 48 bytes (f32) per rank" ]
	[ "$(tsv_rows "$output" | cut -f3)" = "$(printf '%s\n' 0:6,0:2 0:6,2:4 0:6,4:6 0:6,6:8)" ]
}

@test "flow-plan --slices gives the first ranks the extra rows of an uneven split" {
	run -0 --separate-stderr flow-plan --slices 7x3 --mesh 4 --sbp 'S(0)'
	[ "$(tsv_rows "$output")" = "$(printf '%s\t%s\t%s\t%s\t%s\n' \
		0 0 0:2,0:3 '(2,3)' 6 \
		1 1 2:4,0:3 '(2,3)' 6 \
		2 2 4:6,0:3 '(2,3)' 6 \
		3 3 6:7,0:3 '(1,3)' 3)" ]
	[ "${lines[0]}" = "# slices of (7,3) on mesh 4 as (S(0)): 1 copy of each element, at most 24 bytes (f32) per rank" ]
}

@test "flow-plan --slices counts copies of broadcast and partial axes, and bytes of --dtype" {
	run -0 --separate-stderr flow-plan --slices 6x8 --mesh 2x4:dp,tp --sbp '(B,S(1))' --dtype bf16
	[ "${lines[0]}" = "# slices of (6,8) on mesh 2x4:dp,tp as (B,S(1)): 2 copies of each element, at most 24 bytes (bf16) per rank" ]
	[ "$(tsv_rows "$output" | wc -l)" -eq 8 ]
	[ "$(tsv_rows "$output" | sed -n 5p)" = "$(printf '4\t1,0\t0:6,0:2\t(6,2)\t12')" ]
	run -0 --separate-stderr flow-plan --slices 6x8 --mesh 2x2 --sbp '(P,S(1))' --dtype i64
	[ "${lines[0]}" = "# slices of (6,8) on mesh 2x2 as (P,S(1)): 2 copies of each element, at most 192 bytes (i64) per rank" ]
	[ "$(tsv_rows "$output" | cut -f3 | sort -u | tr '\n' ' ')" = "0:6,0:4 0:6,4:8 " ]
}

@test "flow-plan --slices names the global ranks of a placement" {
	run -0 --separate-stderr flow-plan --slices 6x8 --mesh 2x2@4 --sbp '(S(0),B)'
	[ "$(tsv_rows "$output" | cut -f1,2 | tr '\t\n' '  ')" = "4 0,0 5 0,1 6 1,0 7 1,1 " ]
	run -0 --separate-stderr flow-plan --slices 6 --mesh 2@1/4 --sbp 'S(0)'
	[ "$(tsv_rows "$output")" = "$(printf '1\t0\t0:3\t(3)\t3\n5\t1\t3:6\t(3)\t3')" ]
}

@test "flow-plan --slices shows a scalar and an empty tensor broadcast" {
	run -0 --separate-stderr flow-plan --slices '()' --mesh 2 --sbp B
	[ "$(tsv_rows "$output")" = "$(printf '0\t0\t-\t()\t1\n1\t1\t-\t()\t1')" ]
	run -0 --separate-stderr flow-plan --slices 0x8 --mesh 2 --sbp B
	[ "$(tsv_rows "$output" | head -1)" = "$(printf '0\t0\t0:0,0:8\t(0,8)\t0')" ]
}

@test "flow-plan rejects a layout that leaves a rank without elements" {
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2x4 --sbp '(S(0),S(0))'
	[ "${stderr_lines[0]}" = "flow-plan: (S(0),S(0)) on 2x4: dimension 0 of (6,8) has 3 rows left for 4 ranks of axis 1" ]
	assert_usage_error flow-plan "(S(0),S(0)) on 2x4: dimension 0 of (6,8) has 3 rows left for 4 ranks of axis 1"
	run -2 --separate-stderr flow-plan --slices 0x8 --mesh 2 --sbp 'S(0)'
	assert_usage_error flow-plan "(S(0)) on 2: dimension 0 of (0,8) has 0 rows left for 2 ranks of axis 0"
}

@test "flow-plan rejects a layout that does not fit the shape or the mesh" {
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2x2 --sbp '(S(0),S(2))'
	assert_usage_error flow-plan "(S(0),S(2)) on 2x2: split dimension 2 but (6,8) has 2 dimensions"
	run -2 --separate-stderr flow-plan --slices 6x8 --mesh 2x2 --sbp 'S(0)'
	assert_usage_error flow-plan "(S(0)) on 2x2: 1 SBP for 2 mesh axes"
	run -2 --separate-stderr flow-plan --slices '()' --mesh 2 --sbp 'S(0)'
	assert_usage_error flow-plan "(S(0)) on 2: split dimension 0 but () has 0 dimensions"
}

@test "flow-plan --slices --json prints the same rows as JSON" {
	run -0 --separate-stderr flow-plan --slices 6x8 --mesh 2x2 --sbp '(S(0),S(0))' --json
	[ -z "$stderr" ]
	assert_json "$output"
	[[ "$output" != *"#"* ]]
	[ "$(json_eval "$output" 'd[1]')" = '{"rank":1,"coords":[0,1],"box":[[2,3],[0,8]],"shape":[1,8],"elements":8}' ]
	[ "$(json_eval "$output" 'sum(r["elements"] for r in d)')" -eq 48 ]
	run -0 --separate-stderr flow-plan --slices '()' --mesh 2 --sbp B --json
	assert_json "$output"
	[ "$(json_eval "$output" 'd[0]')" = '{"rank":0,"coords":[0],"box":[],"shape":[],"elements":1}' ]
}

# ---- --boxing ---------------------------------------------------------------------

@test "flow-plan --boxing P to B is one all-reduce, costed by the ring" {
	run -0 --separate-stderr flow-plan --boxing 1024x768 --mesh 4 --from P --to B
	[ -z "$stderr" ]
	[ "${lines[0]}" = "# boxing (1024,768) f32 from (P) on mesh 4 to (B) on mesh 4: 1 step" ]
	[ "${lines[1]}" = "# cluster default: 8 ranks per node; within a node 5 us, 100 GB/s; across nodes 10 us, 12.5 GB/s" ]
	[ "${lines[2]}" = "$(printf 'step\tkind\taxes\tfrom\tto\tmax_send_bytes\tmax_recv_bytes\ttotal_bytes\ttime_us')" ]
	# 2(p-1)/p of 3 MiB per rank; 6 ring steps of 5 us + 786432 B / 100 GB/s.
	[ "${lines[3]}" = "$(printf '1\tall-reduce\t0\t(P)\t(B)\t4718592\t4718592\t18874368\t77.186')" ]
	[ "${lines[4]}" = "$(printf 'total\t-\t-\t(P)\t(B)\t4718592\t4718592\t18874368\t77.186')" ]
	[ "${#lines[@]}" -eq 5 ]
}

@test "flow-plan --boxing uses the collective of each 1-D rule" {
	run -0 flow-plan --boxing 6x8 --mesh 4 --from 'S(0)' --to B
	[ "$(step_kinds "$output")" = "all-gather" ]
	run -0 flow-plan --boxing 6x8 --mesh 4 --from P --to 'S(1)'
	[ "$(step_kinds "$output")" = "reduce-scatter" ]
	run -0 flow-plan --boxing 6x8 --mesh 4 --from 'S(0)' --to 'S(1)'
	[ "$(step_kinds "$output")" = "all-to-all" ]
	[ "$(total_field "$output" total_bytes)" -gt 0 ]
}

@test "flow-plan --boxing B to S, B to P and S to P are local and free" {
	run -0 flow-plan --boxing 6x8 --mesh 4 --from B --to 'S(0)'
	[ "$(tsv_rows "$output" | head -1)" = "$(printf '1\tslice\t0\t(B)\t(S(0))\t0\t0\t0\t0.000')" ]
	[ "$(total_field "$output" time_us)" = "0.000" ]
	run -0 flow-plan --boxing 6x8 --mesh 4 --from B --to P
	[ "$(step_kinds "$output")" = "zero-fill" ]
	[ "$(total_field "$output" total_bytes)" -eq 0 ]
	run -0 flow-plan --boxing 6x8 --mesh 4 --from 'S(0)' --to P
	[ "$(step_kinds "$output")" = "pad-zero" ]
	[ "$(total_field "$output" total_bytes)" -eq 0 ]
}

@test "flow-plan --boxing between equal layouts has no steps" {
	run -0 --separate-stderr flow-plan --boxing 6x8 --mesh 2x2 --from '(S(0),B)' --to '(S(0),B)'
	[ "${lines[0]}" = "# boxing (6,8) f32 from (S(0),B) on mesh 2x2 to (S(0),B) on mesh 2x2: 0 steps" ]
	[ "$(tsv_rows "$output")" = "$(printf 'total\t-\t-\t(S(0),B)\t(S(0),B)\t0\t0\t0\t0.000')" ]
}

# Every step must start from the layout the one before it ended with, from
# --from to --to.
assert_step_chain() {
	local from=$1 to=$2 rows prev
	rows=$(tsv_rows "$output" | grep -v '^total')
	prev=$from
	while IFS=$'\t' read -r _ _ _ f t _; do
		[ "$f" = "$prev" ] || { echo "step from $f after $prev" >&2; return 1; }
		prev=$t
	done <<<"$rows"
	[ "$prev" = "$to" ] || { echo "ends at $prev, not $to" >&2; return 1; }
}

@test "flow-plan --boxing converts (S(0),S(0)) to (S(1),S(1)) through middle layouts" {
	# 6 rows split 3+3 then 2+1 do not merge into one 4-way split, so
	# the two mesh axes convert separately.
	run -0 --separate-stderr flow-plan --boxing 6x8 --mesh 2x2 --from '(S(0),S(0))' --to '(S(1),S(1))'
	[ "$(tsv_rows "$output" | grep -vc '^total')" -ge 2 ]
	assert_step_chain '(S(0),S(0))' '(S(1),S(1))'
	# Some step runs on one mesh axis only, through a layout that is
	# neither end.
	tsv_rows "$output" | awk -F'\t' '$3 == "0" || $3 == "1"' | grep -q .
	tsv_rows "$output" | cut -f5 | grep -v '^(S(1),S(1))$' | grep -vq '^(S(0),S(0))$'
	run -0 flow-plan --boxing 6x6 --mesh 2x2 --from '(S(0),S(0))' --to '(S(1),S(1))'
	assert_step_chain '(S(0),S(0))' '(S(1),S(1))'
}

@test "flow-plan --boxing names the mesh axes of each step" {
	run -0 flow-plan --boxing 6x8 --mesh 2x2:dp,tp --from '(P,S(1))' --to '(B,B)'
	[ "$(tsv_rows "$output" | grep -v '^total' | cut -f2,3 | tr '\t\n' '  ')" = "all-reduce dp all-gather tp " ]
	assert_step_chain '(P,S(1))' '(B,B)'
}

@test "flow-plan --boxing to another placement sends and receives" {
	run -0 --separate-stderr flow-plan --boxing 6x8 --mesh 2x2 --from '(S(0),B)' --to-mesh 4@4 --to 'S(0)'
	[ "${lines[0]}" = "# boxing (6,8) f32 from (S(0),B) on mesh 2x2 to (S(0)) on mesh 4@4: 1 step" ]
	[ "$(tsv_rows "$output" | head -1 | cut -f1-5)" = "$(printf '1\tsend-recv\t-\t(S(0),B) on 2x2\t(S(0)) on 4@4')" ]
	# Every element crosses once: 48 f32.
	[ "$(total_field "$output" total_bytes)" -eq 192 ]
}

@test "flow-plan --boxing counts bytes in --dtype" {
	run -0 flow-plan --boxing 1024x768 --mesh 4 --from P --to B --dtype bf16
	[[ "${lines[0]}" == "# boxing (1024,768) bf16 from"* ]]
	[ "$(total_field "$output" total_bytes)" -eq 9437184 ]
}

@test "flow-plan --boxing rejects a layout invalid for the shape" {
	run -2 --separate-stderr flow-plan --boxing 6x8 --mesh 2x4 --from '(S(1),B)' --to '(S(0),S(0))'
	assert_usage_error flow-plan "(S(0),S(0)) on 2x4: dimension 0 of (6,8) has 3 rows left for 4 ranks of axis 1"
	run -2 --separate-stderr flow-plan --boxing 6x8 --mesh 2x2 --from '(S(0),B)' --to 'S(0)' --to-mesh 8
	assert_usage_error flow-plan "(S(0)) on 8: dimension 0 of (6,8) has 6 rows left for 8 ranks of axis 0"
}

@test "flow-plan --boxing --json prints the steps and the total as JSON" {
	run -0 --separate-stderr flow-plan --boxing 6x8 --mesh 2x2:dp,tp --from '(P,S(1))' --to '(B,B)' --json
	[ -z "$stderr" ]
	assert_json "$output"
	[ "$(json_eval "$output" '[r["kind"] for r in d]')" = '["all-reduce","all-gather",null]' ]
	[ "$(json_eval "$output" 'd[0]["axes"]')" = '[0]' ]
	[ "$(json_eval "$output" 'd[-1]["step"]')" = '"total"' ]
	[ "$(json_eval "$output" 'd[-1]["total_bytes"] == sum(r["total_bytes"] for r in d[:-1])')" = true ]
	[ "$(json_eval "$output" 'd[0]["mesh"]')" = '"2x2:dp,tp"' ]
	run -0 flow-plan --boxing 6x8 --mesh 2 --from B --to B --json
	assert_json "$output"
	[ "$(json_eval "$output" 'len(d)')" -eq 1 ]
}

# ---- cluster profiles ------------------------------------------------------------

@test "flow-plan --cluster prices links by the profile and names it" {
	printf '# two ranks a node, slow network\nranks_per_node 2\nlink inter 20 5\n' >slow.prof
	run -0 --separate-stderr flow-plan --boxing 1024x768 --mesh 4 --from 'S(0)' --to B --cluster slow.prof
	[ -z "$stderr" ]
	[ "${lines[1]}" = "# cluster slow.prof: 2 ranks per node; within a node 5 us, 100 GB/s; across nodes 20 us, 5 GB/s" ]
	slow=$(total_field "$output" time_us)
	run -0 flow-plan --boxing 1024x768 --mesh 4 --from 'S(0)' --to B
	fast=$(total_field "$output" time_us)
	awk -v s="$slow" -v f="$fast" 'BEGIN { exit !(s > 2 * f) }'
}

@test "flow-plan reports cluster profile errors with the file and line" {
	printf 'ranks_per_node 2\nlink intra 5\n' >bad.prof
	run -1 --separate-stderr flow-plan --boxing 6x8 --mesh 4 --from P --to B --cluster bad.prof
	[ -z "$output" ]
	[ "$stderr" = "flow-plan: bad.prof:2: expected 'link intra|inter ALPHA_US BETA_GBPS'" ]
	printf '# ok\n\nfoo 1\n' >unknown.prof
	run -1 --separate-stderr flow-plan --boxing 6x8 --mesh 4 --from P --to B --cluster unknown.prof
	[ "$stderr" = "flow-plan: unknown.prof:3: unknown setting 'foo'" ]
	printf 'link inter 10 0\n' >zero.prof
	run -1 --separate-stderr flow-plan --boxing 6x8 --mesh 4 --from P --to B --cluster zero.prof
	[ "$stderr" = "flow-plan: zero.prof:1: bandwidth '0' is not positive" ]
	run -1 --separate-stderr flow-plan --boxing 6x8 --mesh 4 --from P --to B --cluster missing.prof
	[ -z "$output" ]
	[ "$stderr" = "flow-plan: cannot open cluster profile 'missing.prof': No such file or directory" ]
}

# ---- --signatures --------------------------------------------------------------------

@test "flow-plan --signatures lists matmul's data, column and row parallel forms" {
	run -0 --separate-stderr flow-plan --signatures matmul --shapes '4x8;16x8->4x16'
	[ -z "$stderr" ]
	[ "${lines[0]}" = "# signatures of matmul: inputs (4,8) (16,8), outputs (4,16); 6 on one mesh axis" ]
	[ "${lines[1]}" = "$(printf 'name\tin1\tin2\tout1')" ]
	rows=$(tsv_rows "$output")
	printf '%s\n' "$rows" | grep -qx "$(printf 'data\tS(0)\tB\tS(0)')"
	printf '%s\n' "$rows" | grep -qx "$(printf 'column\tB\tS(0)\tS(1)')"
	printf '%s\n' "$rows" | grep -qx "$(printf 'row\tS(1)\tS(1)\tP')"
	[ "$(printf '%s\n' "$rows" | tail -1)" = "$(printf 'broadcast\tB\tB\tB')" ]
	[ "$(printf '%s\n' "$rows" | wc -l)" -eq 6 ]
}

@test "flow-plan --signatures shows an absent optional input as '-'" {
	run -0 --separate-stderr flow-plan --signatures matmul --shapes '4x8;16x8;-->4x16'
	[ "${lines[0]}" = "# signatures of matmul: inputs (4,8) (16,8) -, outputs (4,16); 6 on one mesh axis" ]
	[ "$(tsv_rows "$output" | head -1)" = "$(printf 'data\tS(0)\tB\t-\tS(0)')" ]
}

@test "flow-plan --signatures --mesh counts the n-D candidates and lists the first" {
	run -0 --separate-stderr flow-plan --signatures matmul --shapes '4x8;16x8->4x16' --mesh 2x2 --limit 3
	[ "${lines[1]}" = "# 36 n-D candidates on mesh 2x2; the first 3 follow the 1-D signatures" ]
	rows=$(tsv_rows "$output")
	[ "$(printf '%s\n' "$rows" | wc -l)" -eq 9 ]
	[ "$(printf '%s\n' "$rows" | sed -n 7p)" = "$(printf '(data,data)\t(S(0),S(0))\t(B,B)\t(S(0),S(0))')" ]
	run -0 --separate-stderr flow-plan --signatures matmul --shapes '4x8;16x8->4x16' --mesh 2x2 --limit 0
	[ "${lines[1]}" = "# 36 n-D candidates on mesh 2x2" ]
	[ "$(tsv_rows "$output" | wc -l)" -eq 6 ]
}

@test "flow-plan --signatures rejects an unknown op and shapes that do not fit" {
	run -2 --separate-stderr flow-plan --signatures matmull --shapes '4x8->4'
	assert_usage_error flow-plan "no signatures for unknown op 'matmull'"
	run -2 --separate-stderr flow-plan --signatures matmul --shapes '4x8;16x9->4x16'
	assert_usage_error flow-plan "matmul: weight (16,9) does not match x (4,8): expected (O,8)"
}

@test "flow-plan --signatures --json prints the rows as JSON" {
	run -0 --separate-stderr flow-plan --signatures matmul --shapes '4x8;16x8;-->4x16' --mesh 2x2 --json
	[ -z "$stderr" ]
	assert_json "$output"
	[ "$(json_eval "$output" 'd[0]')" = '{"name":"data","in":["S(0)","B",null],"out":["S(0)"]}' ]
	[ "$(json_eval "$output" 'len(d)')" -eq 16 ]
	[ "$(json_eval "$output" 'd[6]["in"][0]')" = '"(S(0),S(0))"' ]
}

# ---- --verify ------------------------------------------------------------------------

VERIFIED="# verified: every rank holds its destination slice; bytes moved equal the plan's"

# Run --boxing "$@" --verify: exit 0, the plan, then the verified line.
assert_verified() {
	run -0 --separate-stderr flow-plan --boxing "$@" --verify
	if [ -n "$stderr" ] || [ "${lines[-1]}" != "$VERIFIED" ]; then
		echo "flow-plan --boxing $* --verify: $stderr${lines[-1]}" >&2
		return 1
	fi
	[ "$(printf '%s\n' "$output" | grep -c '^total')" -eq 1 ]
}

@test "flow-plan --verify runs each 1-D rule in the reference executor" {
	for from in B P 'S(0)' 'S(1)'; do
		for to in B P 'S(0)' 'S(1)'; do
			assert_verified 6x8 --mesh 4 --from "$from" --to "$to"
		done
	done
}

@test "flow-plan --verify checks uneven shapes" {
	assert_verified 7x5 --mesh 3 --from 'S(0)' --to 'S(1)'
	assert_verified 7x5 --mesh 4 --from P --to 'S(0)'
	assert_verified 6x6 --mesh 2x2 --from '(S(0),S(0))' --to '(S(1),S(1))'
	assert_verified 5x3x2 --mesh 2x3 --from '(S(0),P)' --to '(B,S(1))'
	assert_verified 7x5 --mesh 2x2 --from '(P,P)' --to '(S(1),S(0))'
}

@test "flow-plan --verify checks nested conversions and partial-sum destinations" {
	assert_verified 8x8 --mesh 2x2 --from '(S(0),S(0))' --to '(S(1),S(1))'
	assert_verified 6x8 --mesh 2x2:dp,tp --from '(P,S(1))' --to '(S(0),B)'
	assert_verified 6x8 --mesh 2x2 --from '(S(0),B)' --to '(P,P)'
	assert_verified 4x6x8 --mesh 2x2x2 --from '(S(0),S(1),S(2))' --to '(B,P,S(0))'
}

@test "flow-plan --verify checks conversions to other placements" {
	assert_verified 6x8 --mesh 2x2 --from '(S(0),B)' --to-mesh 4@4 --to 'S(0)'
	[ "$(tsv_rows "$output" | head -1 | cut -f2)" = "send-recv" ]
	assert_verified 7x5 --mesh 4 --from P --to-mesh 4@4 --to 'S(1)'
	assert_verified 6x8 --mesh 2x2 --from '(S(0),S(1))' --to-mesh 2@1/4 --to B
	assert_verified 6x8 --mesh 4 --from 'S(1)' --to-mesh 2x3@2 --to '(S(0),S(1))'
}

@test "flow-plan --verify sums exactly in every dtype" {
	for dtype in f32 bf16 f16 i32 i64 u16 u8 u32; do
		assert_verified 6x8 --mesh 2x2 --from '(P,P)' --to '(B,S(0))' --dtype "$dtype"
	done
	assert_verified 300x300 --mesh 4 --from P --to B --dtype bf16
}

@test "flow-plan --verify of equal layouts verifies an empty plan" {
	assert_verified 6x8 --mesh 2x2 --from '(S(0),B)' --to '(S(0),B)'
}

@test "flow-plan --verify --json keeps standard output JSON" {
	run -0 --separate-stderr flow-plan --boxing 6x6 --mesh 2x2 --from '(S(0),S(0))' --to '(S(1),S(1))' --verify --json
	[ -z "$stderr" ]
	assert_json "$output"
	run -0 --separate-stderr flow-plan -v --boxing 6x8 --mesh 4 --from P --to B --verify --json
	assert_json "$output"
	[[ "$stderr" == *"verified: every rank holds its destination slice; bytes moved equal the plan's"* ]]
}

@test "flow-plan --verify refuses more ranks than it can simulate" {
	run -2 --separate-stderr flow-plan --boxing 6x8 --mesh 4 --from B --to B --to-mesh 4@100000 --verify
	assert_usage_error flow-plan "'--verify' simulates ranks 0 to 100003 in this process; at most 65536 ranks"
	run -0 flow-plan --boxing 6x8 --mesh 4 --from B --to B --to-mesh 4@100000
}

# ---- plan files: --model and --check (flow-plan(5)) ------------------------------

SMALL=gpt:layers=1,heads=2,dim=8,vocab=30,seq=8

# Write the standard 2x2 plan of SMALL to t.plan, then an edited copy to
# e.plan with the sed script $1.
edited_plan() {
	flow-plan --model "$SMALL" --mesh 2x2 --axes dp,tp --batch 4 -o t.plan
	sed "$1" t.plan > e.plan
}

# --check e.plan fails with exit 1 and exactly the message $1.
assert_check_fails() {
	run -1 --separate-stderr flow-plan --check e.plan "${@:2}"
	[ -z "$output" ]
	[ "$stderr" = "flow-plan: $1" ]
}

@test "flow-plan --model writes a plan that --check accepts through a pipe" {
	run -0 --separate-stderr bash -c "flow-plan --model gpt2-124m --mesh 2x4 --axes dp,tp --batch 32 | flow-plan --check - --world 8"
	[ -z "$stderr" ]
	[ "${lines[0]}" = "# plan (stdin): model gpt2-124m, mesh 2x4:dp,tp, batch 32, seq-len 1024, grad-accum 1, zero 0: valid" ]
	[[ "$output" == *$'\ntensors\t-\t903\t-\n'* ]]
	[[ "$output" == *$'\nboxing\tall-reduce\t'* ]]
	[[ "$output" == *$'\nmemory\trank\t-\t'* ]]
}

@test "flow-plan prints a parsed plan back to the same bytes" {
	flow-plan --model "$SMALL" --mesh 2x2 --axes dp,tp --batch 4 --zero 1 > a.plan
	[ "$(head -1 a.plan)" = "flow-plan 1" ]
	run -0 flow-plan --check a.plan
	# --model writes what the parser reads; a plan edited with comments
	# and blank lines still checks.
	{ echo 'flow-plan 1'; echo '# a comment'; echo; tail -n +2 a.plan; } > b.plan
	run -0 flow-plan --check b.plan
}

@test "flow-plan -o writes the plan atomically and leaves no temporary" {
	run -0 flow-plan --model "$SMALL" --mesh 4 --axes dp --batch 4 -o p.plan
	[ -z "$output" ]
	[ -s p.plan ]
	[ "$(ls)" = "p.plan" ]
}

@test "flow-plan diff of zero 1 and zero 2 shows only the gradient lines" {
	flow-plan --model "$SMALL" --mesh 2 --axes dp --batch 4 --zero 1 > z1.plan
	flow-plan --model "$SMALL" --mesh 2 --axes dp --batch 4 --zero 2 > z2.plan
	run -1 diff z1.plan z2.plan
	changed=$(diff z1.plan z2.plan | grep '^>' | grep -v '^> zero 2$' | grep -vc ' param_grad (S(0))$' || true)
	[ "$changed" = 0 ]
	[ "$(diff z1.plan z2.plan | grep -c '^> tensor .* param_grad ')" = 16 ]
}

@test "flow-plan --check rejects an unknown keyword with its line" {
	edited_plan 's/^zero 0/zero 0\nfoo 1/'
	assert_check_fails "e.plan:8: unknown keyword 'foo'"
}

@test "flow-plan --check rejects a plan version it does not know" {
	edited_plan 's/^flow-plan 1/flow-plan 9/'
	assert_check_fails "e.plan:1: unsupported plan version '9' (this flow reads version 1)"
}

@test "flow-plan --check quotes control bytes escaped: a CRLF plan stays one line" {
	edited_plan 's/$/\r/'
	assert_check_fails "e.plan:1: unsupported plan version '1\\r' (this flow reads version 1)"
	edited_plan 's/^flow-plan 1/flow-plan 1\x1b[2J/'
	assert_check_fails "e.plan:1: unsupported plan version '1\\x1b[2J' (this flow reads version 1)"
}

@test "flow-plan --check rejects a bad SBP" {
	edited_plan 's/^tensor wpe param (B,B)/tensor wpe param (B,X)/'
	assert_check_fails "e.plan:42: nd-SBP '(B,X)': expected S(k), B or P at 'X'"
}

@test "flow-plan --check rejects an SBP invalid for the tensor's shape" {
	edited_plan 's/^tensor wpe param (B,B)/tensor wpe param (S(2),B)/'
	assert_check_fails "e.plan:42: tensor 'wpe': (S(2),B) on 2x2:dp,tp: split dimension 2 but (8,8) has 2 dimensions"
}

@test "flow-plan --check rejects an invalid op signature" {
	edited_plan 's/^op h.0.mlp.gelu in (S(0),S(2))/op h.0.mlp.gelu in (S(0),S(1))/'
	assert_check_fails "e.plan:20: op 'h.0.mlp.gelu': not a valid signature: gelu: mesh axis 'tp': no signature has out S(2) with x S(1)"
}

@test "flow-plan --check rejects a mesh that does not match --world" {
	edited_plan 's/x/x/'
	assert_check_fails "e.plan:3: mesh '2x2:dp,tp' has 4 ranks, not the world size 8" --world 8
	run -0 flow-plan --check e.plan --world 4
}

@test "flow-plan --check rejects a batch not divisible by the dp ranks" {
	edited_plan 's/^batch 4/batch 3/'
	assert_check_fails "e.plan:4: batch 3 is not divisible by the 2 ranks of axis 'dp'"
}

@test "flow-plan --check rejects ZeRO without a dp axis" {
	edited_plan 's/^zero 0/zero 1/;s/2x2:dp,tp/2x2:xp,tp/'
	assert_check_fails "e.plan:7: zero 1 needs a mesh axis named 'dp', mesh '2x2:xp,tp' has none"
}

@test "flow-plan --check rejects a missing tensor and a missing op" {
	edited_plan '/^tensor wpe /d'
	assert_check_fails "e.plan:138: missing tensor 'wpe'"
	edited_plan '/^op ln_f /d'
	assert_check_fails "e.plan:138: missing op 'ln_f'"
}

@test "flow-plan --check rejects a duplicate tensor" {
	edited_plan 's/^\(tensor wte .*\)$/\1\n\1/'
	assert_check_fails "e.plan:42: duplicate tensor 'wte' (first on line 41)"
}

@test "flow-plan --model reports usage errors with exit 2" {
	run -2 --separate-stderr flow-plan --model "$SMALL" --mesh 4 --axes dp --batch 6
	assert_usage_error flow-plan "batch 6 is not divisible by the 4 ranks of axis 'dp'"
	run -2 --separate-stderr flow-plan --model "$SMALL" --mesh 2 --axes tp --batch 4 --zero 1
	assert_usage_error flow-plan "zero 1 needs a mesh axis named 'dp'"
	run -2 --separate-stderr flow-plan --model "$SMALL" --mesh 2x2 --axes dp,pp --batch 4
	assert_usage_error flow-plan "unknown mesh axis 'pp' (the standard layouts know dp and tp)"
	run -2 --separate-stderr flow-plan --model "$SMALL" --mesh 2 --axes dp
	assert_usage_error flow-plan "'--model' needs '--batch'"
	run -2 --separate-stderr flow-plan --check x.plan --zero 1
	assert_usage_error flow-plan "'--zero' needs '--model'"
	run -2 --separate-stderr flow-plan --boxing 6x8 --mesh 4 --from P --to B --world 4
	assert_usage_error flow-plan "'--world' needs '--check'"
}

@test "flow-plan --check holds the per-rank memory against the cluster's" {
	flow-plan --model gpt2-124m --mesh 2x4 --axes dp,tp --batch 32 --seq-len 1024 >big.plan
	printf 'memory 1\n' >small.prof
	run -1 --separate-stderr flow-plan --check big.plan --cluster small.prof
	[ "$stderr" = "flow-plan: big.plan: a rank needs 7.60 GiB (params 0.12, grads 0.12, optimizer 0.24, activations 7.13), more than the cluster's 1.00 GiB" ]
	printf '# H100\nmemory 80\n' >big.prof
	run -0 --separate-stderr flow-plan --check big.plan --cluster big.prof
	[ "${lines[2]}" = "# cluster big.prof: 80.00 GiB per rank, 7.60 GiB needed" ]
	# ZeRO 1 takes the optimizer state down by the dp size.
	flow-plan --model gpt2-124m --mesh 2x4 --axes dp,tp --batch 32 --seq-len 1024 --zero 1 >z1.plan
	run -1 --separate-stderr flow-plan --check z1.plan --cluster small.prof
	[[ "$stderr" == *"optimizer 0.12, "* ]]
	printf 'memory 1\nmemory 2\n' >twice.prof
	run -1 --separate-stderr flow-plan --check big.plan --cluster twice.prof
	[ "$stderr" = "flow-plan: twice.prof:2: 'memory' given twice" ]
}
