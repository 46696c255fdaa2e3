# common.sh: sourced by the bench/*.sh scripts after they set prog and
# synopsis: the usage-error and --help conventions of the flow programs
# (help on stdout, exit 0; a usage error and a hint on stderr, exit 2) and
# the check of numeric option values, and the median of a list of times.

usage() {
	echo "$prog: $1" >&2
	echo "Usage: $prog $synopsis" >&2
	exit 2
}

# The script's header comment, from line 2 to 'set -eu'.
print_help() {
	sed -n '2,/^set -eu$/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
}

# option_value OPTION ARGC VALUE: VALUE must be there and be a whole number.
option_value() {
	[ "$2" -ge 2 ] || usage "option '$1' needs a value"
	case $3 in '' | *[!0-9]*) usage "invalid value '$3' for '$1'" ;; esac
}

# median [FILE]: the median of the numbers in FILE (standard input without
# one), one per line; nan when there are none.
median() {
	sort -g "$@" | awk '{ v[NR] = $1 } END {
		if (NR == 0) { print "nan"; exit }
		if (NR % 2) print v[(NR + 1) / 2]
		else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
