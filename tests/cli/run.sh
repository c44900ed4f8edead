#!/bin/sh
# run.sh - CLI test harness: sh tests/cli/run.sh path/to/arena [SUMMARY]
#
# Sources every tests/cli/t_*.sh (in name order). Each of them defines cases
# as shell functions and lists them with `cases NAME...`, and those that take
# seconds on a two-core machine (inputs cut at many points, memory measured
# over whole runs) with `slow NAME...` too: where $ARENA_TEST_QUICK is set to
# anything but "" or "0" (make check) they are skipped, each said with
# "skip <case> (slow: make test runs it)". A case runs in a
# subshell of its own, in the project root, with:
#   $ARENA   the arena binary (absolute path)
#   $REF     the test fixtures (ARENA_FIXTURES_DIR, or fixtures/ in the project root)
#   $T       an empty temporary folder, removed afterwards
# and these helpers (each failed check prints "FAIL <case>: <why>"):
#   run ARGS...            run "$ARENA" ARGS; sets $rc, stdout in $T/out, stderr in $T/err;
#                          a BUG() report in stderr fails the case
#   expect_rc N            exit status is N
#   expect_out TEXT        stdout contains TEXT (fixed string)
#   expect_err TEXT        stderr contains TEXT
#   expect_no_out          stdout is empty
#   expect_no_err          stderr is empty
#   expect_error_line      stderr is exactly one line, starting "error: "
#   expect_json_tensors N  stdout is JSON (python3) with N tensors (tensors list and totals)
#   make_st FILE HEADER N  write a safetensors file: HEADER (JSON text) then N zero bytes
#   fail WHY               record a failure
# Prints one line per case ("ok   <case>", or its failures), then
# "N passed, N failed" (and ", N slow skipped"); exits 1 if any failed.
# SUMMARY, when given, is a file to hold "CLI N" (the cases passed) for make
# test's last line, and SUMMARY.skipped what was skipped.
set -u

if [ $# -lt 1 ] || [ $# -gt 2 ] || [ ! -x "$1" ]; then
	echo "usage: sh tests/cli/run.sh path/to/arena (an executable) [SUMMARY]" >&2
	exit 2
fi
SUMMARY=${2:-}
[ -z "$SUMMARY" ] || rm -f "$SUMMARY" "$SUMMARY.skipped"
case $1 in
/*) ARENA=$1 ;;
*) ARENA=$(pwd)/$1 ;;
esac
REF=${ARENA_FIXTURES_DIR:-fixtures}
CLI_DIR=$(dirname "$0")
export ARENA REF

ALL_CASES=
cases() {
	ALL_CASES="$ALL_CASES $*"
}

SLOW_CASES=
slow() {
	SLOW_CASES="$SLOW_CASES $*"
}
QUICK=
case ${ARENA_TEST_QUICK:-} in
"" | 0) ;;
*) QUICK=1 ;;
esac

fail() {
	echo "FAIL $CASE: $*"
	if [ -n "${LAST_CMD:-}" ]; then
		echo "  command: $LAST_CMD (exit $rc)"
		if [ -s "$T/err" ]; then
			head -n 5 "$T/err" | sed 's/^/  stderr: /'
		fi
	fi
	FAILED=1
}

run() {
	LAST_CMD="arena $*"
	"$ARENA" "$@" >"$T/out" 2>"$T/err"
	rc=$?
	# arena never reports a BUG() (common/err.c) to its user: one fails the
	# case, whatever exit status or message the case expects.
	! grep -q '^BUG: ' "$T/err" || fail "a BUG() report: $(grep -m 1 '^BUG: ' "$T/err")"
}

expect_rc() {
	[ "$rc" = "$1" ] || fail "exit status $rc, want $1"
}

expect_out() {
	grep -qF -- "$1" "$T/out" || fail "stdout lacks '$1'"
}

expect_err() {
	grep -qF -- "$1" "$T/err" || fail "stderr lacks '$1'"
}

expect_no_out() {
	[ ! -s "$T/out" ] || fail "stdout is not empty"
}

expect_no_err() {
	[ ! -s "$T/err" ] || fail "stderr is not empty"
}

expect_error_line() {
	n=$(wc -l <"$T/err")
	[ "$n" -eq 1 ] || fail "stderr has $n lines, want 1"
	head -n 1 "$T/err" | grep -q '^error: ' || fail "stderr does not start with 'error: '"
}

expect_json_tensors() {
	python3 -c '
import json, sys
d = json.load(sys.stdin)
n = int(sys.argv[1])
got = len(d["tensors"])
if got != n or d["totals"]["tensors"] != n:
    sys.exit("%d tensors listed, totals say %s, want %d" % (got, d["totals"]["tensors"], n))
' "$1" <"$T/out" 2>"$T/json-err" || fail "JSON output: $(tail -n 1 "$T/json-err")"
}

make_st() {
	python3 -c '
import struct, sys
h = sys.argv[2].encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(int(sys.argv[3])))
' "$1" "$2" "$3"
}

for f in "$CLI_DIR"/t_*.sh; do
	[ -f "$f" ] || continue
	# shellcheck disable=SC1090
	. "$f"
done

TMPBASE=$(mktemp -d "${TMPDIR:-/tmp}/arena-cli.XXXXXX") || exit 2
trap 'rm -rf "$TMPBASE"' EXIT INT TERM
for c in $SLOW_CASES; do
	case " $ALL_CASES " in
	*" $c "*) ;;
	*)
		echo "slow $c: not a case (list it with cases)"
		exit 1
		;;
	esac
done
passed=0
failed=0
skipped=0
for c in $ALL_CASES; do
	if [ -n "$QUICK" ]; then
		case " $SLOW_CASES " in
		*" $c "*)
			echo "skip $c (slow: make test runs it)"
			skipped=$((skipped + 1))
			continue
			;;
		esac
	fi
	T=$TMPBASE/$c
	mkdir -p "$T"
	if (
		CASE=$c
		FAILED=0
		LAST_CMD=
		rc=
		"$c"
		[ "$FAILED" = 0 ]
	); then
		echo "ok   $c"
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
	fi
	rm -rf "$T"
done
echo "$passed passed, $failed failed$([ "$skipped" = 0 ] || echo ", $skipped slow skipped")"
[ "$failed" = 0 ] || exit 1
[ -z "$SUMMARY" ] || echo "CLI $passed" >"$SUMMARY"
[ -z "$SUMMARY" ] || [ "$skipped" = 0 ] || echo "CLI $skipped (slow: make test runs them)" >"$SUMMARY.skipped"
