#!/bin/sh
# run.sh - the public API on its own: tests/api/stream_api.c built against
# include/arena.h and BUILD/libarena.so only, then run on an image converted
# from the model it writes; and libarena.so exports nothing but arena.h's
# functions. Passed, BUILD/test-summary/api says how many checks and functions.
# usage: sh tests/api/run.sh BUILD [CC flags...]
set -u
B=$1
shift
S=$B/test-summary
mkdir -p "$S" || exit 1
rm -f "$S/api"
CC=${CC:-cc}
T=$(mktemp -d "${TMPDIR:-/tmp}/arena-api.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail() {
	echo "api tests: FAIL: $*"
	exit 1
}
$CC -std=c11 -Wall -Wextra -Werror -Iinclude "$@" -o "$B/tests/stream_api" tests/api/stream_api.c \
	-L"$B" -l:libarena.so -Wl,-rpath,"$(cd "$B" && pwd)" -pthread || fail "stream_api does not build against arena.h alone"
# What the program links: libarena.so, and no other arena code.
ldd "$B/tests/stream_api" | grep -q 'libarena.so' || fail "stream_api does not link libarena.so"
"$B/tests/stream_api" write "$T/m.safetensors" || fail "stream_api write"
"$B/arena" convert -q "$T/m.safetensors" -o "$T/m.arena" --chunk-size 64K || fail "convert"
"$B/tests/stream_api" run "$T/m.arena" >"$T/run.out" 2>&1
rc=$?
cat "$T/run.out"
[ $rc = 0 ] || fail "stream_api run (exit $rc)"
checks=$(sed -n 's/^stream_api: ok, \([0-9]*\) checks$/\1/p' "$T/run.out")
# Exports: every defined dynamic symbol is declared in arena.h.
nm -D --defined-only "$B/libarena.so" | awk '$2 ~ /^[TDBRW]$/ {print $3}' | sort -u >"$T/exports"
grep -oE '\barena_[a-z0-9_]+\(' include/arena.h | tr -d '(' | sort -u >"$T/declared"
extra=$(comm -23 "$T/exports" "$T/declared")
[ -z "$extra" ] || fail "libarena.so exports symbols arena.h does not declare: $(echo $extra | head -c 400)"
missing=$(comm -13 "$T/exports" "$T/declared")
[ -z "$missing" ] || fail "arena.h declares functions libarena.so does not export: $missing"
n=$(wc -l <"$T/exports")
echo "api tests: passed ($n exported functions, all in arena.h)"
echo "API $checks checks + $n functions" >"$S/api"
