#!/bin/sh
# run.sh - the unit tests (Criterion): BUILD/tests/unit, two jobs, one line per
# test ("[PASS] suite::name: (0.01s)", "[FAIL] ...", "[SKIP] ...: why") with
# the details of a failure, then Criterion's synthesis. WRAPPER (e.g.
# scripts/sancheck.sh under the sanitizers) runs the program.
# Leaves BUILD/test-summary/unit ("unit N": the tests that passed) and, when
# tests were skipped, BUILD/test-summary/unit.skipped (how many, and why), for
# make test's last line.
# usage: sh tests/unit/run.sh BUILD [WRAPPER...]
# Exit status: the program's (0: every test that ran passed), or 1 when the
# output holds a BUG() report.
set -u
B=$1
shift
S=$B/test-summary
mkdir -p "$S" "$B/tests" || exit 1
rm -f "$S/unit" "$S/unit.skipped"
log=$B/tests/unit.log
# --verbose=0: Criterion's most detailed level, the level that names each test.
"$@" "$B/tests/unit" --jobs 2 --verbose=0 >"$log" 2>&1
rc=$?
# Each test's start ("[RUN ]"), each suite's heading and the version line say
# nothing the result lines do not.
grep -v -e '^\[RUN \] ' -e '^\[====\] Running ' -e '^\[----\] Criterion v' "$log"
syn=$(grep '^\[====\] Synthesis: ' "$log" | tail -n 1)
[ -n "$syn" ] || {
	echo "unit tests: no synthesis from $B/tests/unit (log: $log)"
	exit 1
}
# A BUG() report (common/err.c: "BUG: file:line: ...", then abort) is never
# expected in the output: the tests of a BUG() take its message off stderr
# (cr_redirect_stderr); one printed here came from code that hit it where a
# test did not ask for it (a child process, a test that tolerates a crash).
if grep -q '^BUG: ' "$log"; then
	echo "unit tests: FAIL: unexpected BUG() reports in the output (a test of a BUG() takes it off stderr with cr_redirect_stderr):"
	grep '^BUG: ' "$log" | sort | uniq -c | head -n 10
	exit 1
fi
passing=$(echo "$syn" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
echo "unit ${passing:-0}" >"$S/unit"
# Skipped tests of the last run (a wrapper may run the program twice): how
# many, with their reasons, each once.
awk '/^\[----\] Criterion v/ { n = 0; split("", why); k = 0 }
/^\[SKIP\] / { n++; r = $0; sub(/^\[SKIP\] [^:]*::[^:]*: /, "", r); if (!(r in why)) { why[r] = 1; w[++k] = r } }
END { if (n) { s = w[1]; for (i = 2; i <= k; i++) s = s "; " w[i]; print "unit " n " (" s ")" } }' "$log" >"$S/unit.skipped"
[ -s "$S/unit.skipped" ] || rm -f "$S/unit.skipped"
exit $rc
