#!/bin/sh
# sancheck.sh - run a command; fail when it fails or when its output holds a
# sanitizer report. Criterion forks a process per test and counts a test that
# passed its assertions as passed even when LeakSanitizer reports at its exit,
# so the report itself must fail the run.
# usage: sh scripts/sancheck.sh COMMAND [ARGS...]
log=$(mktemp "${TMPDIR:-/tmp}/arena-san.XXXXXX") || exit 2
"$@" >"$log" 2>&1
rc=$?
cat "$log"
if grep -qE "ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:" "$log"; then
	echo "sancheck: sanitizer reports above; failing"
	rm -f "$log"
	exit 1
fi
rm -f "$log"
exit $rc
