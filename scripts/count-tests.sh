#!/usr/bin/env bash
# count-tests.sh BUILD_DIR: count test cases from the logs of the last
# 'make check' (cmocka summaries and bats TAP lines, not test programs) and
# print 'N passed, N failed'.  A test program that crashed or produced no
# summary counts as one failure.  The failures themselves are shown first:
# each bats 'not ok' with its diagnostics, or the end of a cmocka log.
set -uo pipefail
build=${1:?usage: count-tests.sh BUILD_DIR}
passed=0 failed=0
while IFS= read -r -d '' trs; do
	log=${trs%.trs}.log
	result=$(sed -n 's/^:test-result: //p' "$trs" | head -n 1)
	if grep -q '^1\.\.[0-9]' "$log"; then # TAP, from bats
		p=$(grep '^ok ' "$log" | grep -vc ' # skip')
		f=$(grep -c '^not ok ' "$log")
	else # cmocka summaries
		p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
		f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
	fi
	if [ "$result" = SKIP ]; then
		continue
	fi
	if [ "$result" != PASS ] && [ "$f" -eq 0 ]; then
		f=1 # crashed, or failed before its summary
	fi
	if [ "$f" -gt 0 ]; then
		echo "---- failed: $log"
		if grep -q '^not ok ' "$log"; then
			awk '/^not ok /{on=1; n=0; print; next}
			     /^(ok|not ok) /{on=0} on && /^#/ && n++ < 40' "$log"
		else
			tail -n 30 "$log"
		fi
	fi
	passed=$((passed + p))
	failed=$((failed + f))
done < <(find "$build" -name '*.trs' -print0)
echo "$passed passed, $failed failed"
