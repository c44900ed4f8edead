#!/bin/sh
# install.sh - `make install` into a folder of its own, then examples/stream.c
# built as a user builds against an installed arena, with pkg-config's flags:
# linked to libarena.so, it runs without LD_LIBRARY_PATH (the rpath in
# arena.pc's Libs); linked statically (pkg-config --static: Libs.private,
# the CUDA runtime included in a CUDA build), it needs no libarena.so.
# usage: sh tests/api/install.sh BUILD [make variables...]
set -u
B=$1
shift
CC=${CC:-cc}
T=$(mktemp -d "${TMPDIR:-/tmp}/arena-install.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail() {
	echo "install tests: FAIL: $*"
	exit 1
}
command -v pkg-config >/dev/null 2>&1 || fail "no pkg-config (Debian: apt-get install pkg-config)"
P=$T/prefix
${MAKE:-make} --no-print-directory BUILD="$B" PREFIX="$P" "$@" install >"$T/install.log" 2>&1 ||
	fail "make install PREFIX=$P: $(tail -n 5 "$T/install.log")"
for f in bin/arena lib/libarena.so lib/libarena.so.0 lib/libarena.a include/arena.h lib/pkgconfig/arena.pc; do
	[ -e "$P/$f" ] || fail "make install did not install $f"
done
"$P/bin/arena" version >/dev/null || fail "the installed arena does not run"
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
cp fixtures/tiny_flux.safetensors "$T/m.safetensors"
# Dynamic: the rpath finds libarena.so.
# shellcheck disable=SC2046
$CC -std=c11 -o "$T/stream" examples/stream.c $(pkg-config --cflags --libs arena) ||
	fail "examples/stream.c does not build with pkg-config --cflags --libs arena"
ldd "$T/stream" | grep -q "$P/lib/libarena.so" || fail "the program does not find $P/lib/libarena.so: $(ldd "$T/stream")"
env -u LD_LIBRARY_PATH "$T/stream" "$T/m.safetensors" 290K 2 >"$T/out" 2>&1 || fail "stream (dynamic): $(cat "$T/out")"
grep -q '^ok: 2 steps' "$T/out" || fail "stream (dynamic): $(cat "$T/out")"
# Static: libarena.a and what Libs.private names.
static=$(pkg-config --static --libs arena | sed 's/ -larena / -Wl,-Bstatic -larena -Wl,-Bdynamic /')
# shellcheck disable=SC2086
$CC -std=c11 -o "$T/stream-static" examples/stream.c $(pkg-config --cflags arena) $static ||
	fail "examples/stream.c does not link statically with pkg-config --static --libs arena: $static"
ldd "$T/stream-static" | grep -q libarena && fail "the static program still needs libarena.so"
rm -f "$T/m.safetensors.arena"
"$T/stream-static" "$T/m.safetensors" 290K 2 >"$T/out" 2>&1 || fail "stream (static): $(cat "$T/out")"
grep -q '^ok: 2 steps' "$T/out" || fail "stream (static): $(cat "$T/out")"
# make test's summary (tests/summary.sh): the API section's line says this passed too.
S=$B/test-summary
[ -s "$S/api" ] && echo "$(cat "$S/api") + make install" >"$S/api.new" && mv "$S/api.new" "$S/api"
echo "install tests: passed (pkg-config: $(pkg-config --libs arena); --static: $(pkg-config --static --libs arena | cut -c 1-200))"
