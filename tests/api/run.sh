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
# examples/stream.c, the same way: it converts the model (progress on stderr),
# streams it on a device smaller than the model, and checks each block's bytes.
$CC -std=c11 -Wall -Wextra -Werror -Iinclude "$@" -o "$B/tests/stream_example" examples/stream.c \
	-L"$B" -l:libarena.so -Wl,-rpath,"$(cd "$B" && pwd)" -pthread || fail "examples/stream.c does not build against arena.h alone"
cp fixtures/tiny_flux.safetensors "$T/ex.safetensors"
"$B/tests/stream_example" "$T/ex.safetensors" 290K 3 >"$T/ex.out" 2>"$T/ex.err" || fail "examples/stream.c: $(cat "$T/ex.err")"
grep -q 'convert: 100%' "$T/ex.err" || fail "examples/stream.c: no progress: $(cat "$T/ex.err")"
grep -q '^step 2: [1-9][0-9]* bytes streamed' "$T/ex.out" || fail "examples/stream.c: nothing streamed: $(cat "$T/ex.out")"
grep -q '^ok: 3 steps, every block' "$T/ex.out" || fail "examples/stream.c: $(cat "$T/ex.out")"
# Run again: the image is up to date (newer than the model), used as it is.
"$B/tests/stream_example" "$T/ex.safetensors" 290k 1 >"$T/ex.out" 2>"$T/ex.err" || fail "examples/stream.c, again: $(cat "$T/ex.err")"
grep -q 'convert' "$T/ex.err" && fail "examples/stream.c converted an up-to-date image again: $(cat "$T/ex.err")"
grep -q "^using $T/ex.safetensors.arena (newer than $T/ex.safetensors)" "$T/ex.out" || fail "examples/stream.c: $(cat "$T/ex.out")"
grep -q '^ok: 1 step, every block' "$T/ex.out" || fail "examples/stream.c: $(cat "$T/ex.out")"
# The model changed since the image was made: converted again, over it.
touch -d '1 hour ago' "$T/ex.safetensors.arena"
"$B/tests/stream_example" "$T/ex.safetensors" 290K 2 >"$T/ex.out" 2>"$T/ex.err" || fail "examples/stream.c, changed: $(cat "$T/ex.err")"
grep -q 'convert: 100%' "$T/ex.err" || fail "examples/stream.c did not convert a changed model: $(cat "$T/ex.out" "$T/ex.err")"
grep -q '^ok: 2 steps' "$T/ex.out" || fail "examples/stream.c: $(cat "$T/ex.out")"
# Its arguments: a size as arena reads one (8X is not one), STEPS a whole number.
for bad in "8X 3" "8 G" "-1 3" "290K abc" "290K 0" "290K 3x"; do
	# shellcheck disable=SC2086
	"$B/tests/stream_example" "$T/ex.safetensors" $bad >"$T/ex.out" 2>"$T/ex.err"
	rc=$?
	[ $rc = 2 ] && [ "$(wc -l <"$T/ex.err")" = 1 ] && grep -q "^stream: \(VRAM\|STEPS\) '" "$T/ex.err" ||
		fail "examples/stream.c $bad: exit $rc, $(cat "$T/ex.err")"
done
# A device too small even for pieces: one line, the image named once, no
# option of another program suggested. (200K runs, in pieces.)
"$B/tests/stream_example" "$T/ex.safetensors" 200K 2 >"$T/ex.out" 2>"$T/ex.err" || fail "examples/stream.c 200K (in pieces): $(cat "$T/ex.err")"
"$B/tests/stream_example" "$T/ex.safetensors" 20K 2 >"$T/ex.out" 2>"$T/ex.err"
rc=$?
[ $rc = 1 ] && [ "$(wc -l <"$T/ex.err")" = 1 ] && [ "$(grep -o "$T/ex.safetensors.arena" "$T/ex.err" | wc -l)" = 1 ] &&
	! grep -q -- '--' "$T/ex.err" || fail "examples/stream.c 20K: exit $rc, $(cat "$T/ex.err")"
echo "api tests: examples/stream.c: ok"
# Exports: every defined dynamic symbol is declared in arena.h.
nm -D --defined-only "$B/libarena.so" | awk '$2 ~ /^[TDBRW]$/ {print $3}' | sort -u >"$T/exports"
grep -oE '\barena_[a-z0-9_]+\(' include/arena.h | tr -d '(' | sort -u >"$T/declared"
extra=$(comm -23 "$T/exports" "$T/declared")
[ -z "$extra" ] || fail "libarena.so exports symbols arena.h does not declare: $(echo $extra | head -c 400)"
missing=$(comm -13 "$T/exports" "$T/declared")
[ -z "$missing" ] || fail "arena.h declares functions libarena.so does not export: $missing"
n=$(wc -l <"$T/exports")
echo "api tests: passed ($n exported functions, all in arena.h)"
echo "API $checks checks + $n functions + examples/stream.c" >"$S/api"
