#!/bin/sh
# sancheck.sh - run a command; fail when it fails or when its output holds a
# sanitizer report. Criterion forks a process per test and counts a test that
# passed its assertions as passed even when LeakSanitizer reports at its exit,
# so the report itself must fail the run.
# A process whose AddressSanitizer could not reserve its shadow memory at
# start-up ("ReserveShadowMemoryRange failed": the machine refused the
# mapping for a moment; nothing ran under it, so nothing was checked) makes
# the command run once more; reports of any other kind fail at once.
# usage: sh scripts/sancheck.sh COMMAND [ARGS...]
log=$(mktemp "${TMPDIR:-/tmp}/arena-san.XXXXXX") || exit 2
REPORT="ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:"
SHADOW="ERROR: AddressSanitizer failed to allocate .* bytes at address"
run() {
	"$@" >"$log" 2>&1
	rc=$?
	cat "$log"
}
run "$@"
if grep -q "ReserveShadowMemoryRange failed" "$log" &&
	[ "$(grep -cE "$REPORT" "$log")" = "$(grep -cE "$SHADOW" "$log")" ]; then
	echo "sancheck: AddressSanitizer could not reserve its shadow memory at a process's start (nothing ran under it): running again"
	run "$@"
fi
if grep -qE "$REPORT" "$log"; then
	echo "sancheck: sanitizer reports above; failing"
	rm -f "$log"
	exit 1
fi
rm -f "$log"
exit $rc
