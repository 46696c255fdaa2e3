# shellcheck shell=bash
# fox_corpus LINES FILE: the byte-level training text of the program tests
# (tests/cli, tests/cluster, tests/gpu/train.sh, tests/valgrind.sh): LINES
# numbered lines with structure to learn, the same everywhere, into FILE.
fox_corpus() {
	local i
	for i in $(seq 1 "$1"); do
		printf 'the %s fox jumps over the %s dog, line %d.\n' \
			quick lazy "$i"
	done >"$2"
}
