# Shared helpers for the flow-* command-line tests (bats-core >= 1.5).
# Load with `load common` from a .bats file in tests/cli/.  The harness
# (make check) exports top_srcdir and top_builddir and puts
# $top_builddir/bin first on PATH; run by hand, the defaults below assume the
# source tree is the build tree.

: "${top_srcdir:=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
export top_srcdir top_builddir

# fox_corpus LINES FILE: the training text of the program tests.
# shellcheck source=../corpus.bash
source "$BATS_TEST_DIRNAME/../corpus.bash"

# The last `run --separate-stderr` must have failed with a usage error from
# program $1: exit 2, nothing on stdout, stderr exactly two lines: the
# message (which must contain $2) and the hint.
assert_usage_error() {
	local prog=$1 message=$2
	if [ "$status" -ne 2 ]; then
		echo "expected exit 2, got $status; stderr: $stderr" >&2
		return 1
	fi
	if [ -n "$output" ]; then
		echo "expected nothing on stdout, got: $output" >&2
		return 1
	fi
	if [ "${#stderr_lines[@]}" -ne 2 ]; then
		echo "expected 2 lines on stderr, got: $stderr" >&2
		return 1
	fi
	case ${stderr_lines[0]} in
	"$prog: "*"$message"*) ;;
	*)
		echo "expected '$prog: ...$message...', got: ${stderr_lines[0]}" >&2
		return 1
		;;
	esac
	if [ "${stderr_lines[1]}" != "Try '$prog --help' for more information." ]; then
		echo "expected the help hint, got: ${stderr_lines[1]}" >&2
		return 1
	fi
}

# The text in $1 must be one valid JSON document.
assert_json() {
	if command -v jq >/dev/null 2>&1; then
		printf '%s\n' "$1" | jq -e . >/dev/null
	else
		printf '%s\n' "$1" | /usr/bin/python3 -c 'import json,sys; json.load(sys.stdin)'
	fi
}

# Print the TSV rows (no '#' lines, no header) of the output in $1.
tsv_rows() {
	printf '%s\n' "$1" | grep -v '^#' | tail -n +2
}

# No temporary of the artefact $1 ($1.tmp.<pid>, the name flow's atomic
# writes use) may be left in the current directory.
assert_no_temporaries() {
	local t
	for t in "$1".tmp.*; do
		if [ -e "$t" ]; then
			echo "left behind: $t" >&2
			return 1
		fi
	done
}

# Neither the artefact $1 nor a temporary of it may exist.
assert_no_artefact() {
	if [ -e "$1" ]; then
		echo "$1 exists" >&2
		return 1
	fi
	assert_no_temporaries "$1"
}

# Run the shell command line $1 with standard input, output and error on a
# pseudo-terminal, through util-linux script(1): as with `run`, $status is
# its exit status and $output what it wrote to the terminal (line ends as
# the terminal gives them, "\r\n").  Skips the test where script(1) is
# missing or is another implementation (BSD script has no -c).
run_in_terminal() {
	if ! command -v script >/dev/null 2>&1; then
		skip "script(1) not found: cannot run under a pseudo-terminal"
	fi
	if ! script --version 2>&1 | grep -q util-linux; then
		skip "script(1) is not util-linux's: cannot run under a pseudo-terminal"
	fi
	run script -qec "$1" /dev/null </dev/null
}
