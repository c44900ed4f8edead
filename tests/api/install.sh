#!/bin/sh
# install.sh - `make install` into a folder of its own (no system path): the
# installed arena runs without LD_LIBRARY_PATH; then examples/stream.c
# built as a user builds against an installed arena, with pkg-config's flags:
# linked to libarena.so, it runs without LD_LIBRARY_PATH (the rpath in
# arena.pc's Libs); linked statically (pkg-config --static: Libs.private,
# the CUDA runtime included in a CUDA build), it needs no libarena.so.
# Which variant ran, a CUDA build or one without, is printed: a CUDA build
# must link the CUDA runtime statically through pkg-config, one without must
# not name it.
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
# The installed command runs from anywhere without LD_LIBRARY_PATH: it holds
# the library (libarena.a), and needs nothing from PREFIX/lib.
(cd / && env -u LD_LIBRARY_PATH "$P/bin/arena" --version) >"$T/version" 2>&1 ||
	fail "the installed arena does not run without LD_LIBRARY_PATH: $(cat "$T/version")"
env -u LD_LIBRARY_PATH ldd "$P/bin/arena" >"$T/ldd" 2>&1 || fail "ldd $P/bin/arena: $(cat "$T/ldd")"
grep -q -e libarena -e 'not found' "$T/ldd" && fail "the installed arena needs libraries it does not find by itself: $(cat "$T/ldd")"
# Which variant this build is, as the installed command says: with CUDA, the
# static link below needs the CUDA runtime from Libs.private; without, none.
if grep -q '^cuda backend: built' "$T/version"; then
	cuda=1
	variant="a CUDA build"
else
	cuda=0
	variant="a build without CUDA"
fi
echo "install tests: $variant ($(grep -m 1 '^cuda backend' "$T/version")): make install PREFIX=$P"
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
cp fixtures/tiny_flux.safetensors "$T/m.safetensors"
# Dynamic: the rpath finds libarena.so.
# shellcheck disable=SC2046
$CC -std=c11 -o "$T/stream" examples/stream.c $(pkg-config --cflags --libs arena) ||
	fail "examples/stream.c does not build with pkg-config --cflags --libs arena"
ldd "$T/stream" | grep -q "$P/lib/libarena.so" || fail "the program does not find $P/lib/libarena.so: $(ldd "$T/stream")"
env -u LD_LIBRARY_PATH "$T/stream" "$T/m.safetensors" 290K 2 >"$T/out" 2>&1 || fail "stream (dynamic): $(cat "$T/out")"
grep -q '^ok: 2 steps' "$T/out" || fail "stream (dynamic): $(cat "$T/out")"
# Static: libarena.a and what Libs.private names (the CUDA runtime in a CUDA build).
static=$(pkg-config --static --libs arena | sed 's/ -larena / -Wl,-Bstatic -larena -Wl,-Bdynamic /')
case " $static " in
*" -lcudart_static "* | *" -lcudart "*) [ $cuda = 1 ] || fail "pkg-config --static --libs arena names the CUDA runtime in $variant: $static" ;;
*) [ $cuda = 0 ] || fail "pkg-config --static --libs arena does not name the CUDA runtime in $variant: $static" ;;
esac
# shellcheck disable=SC2086
$CC -std=c11 -o "$T/stream-static" examples/stream.c $(pkg-config --cflags arena) $static ||
	fail "examples/stream.c does not link statically with pkg-config --static --libs arena: $static"
ldd "$T/stream-static" | grep -q libarena && fail "the static program still needs libarena.so"
# The CUDA backend came along (its calls into the CUDA runtime resolved), or there is none.
if nm "$T/stream-static" | grep -q ' [Tt] cudaGetLastError$'; then
	[ $cuda = 1 ] || fail "the static program holds the CUDA runtime in $variant"
else
	[ $cuda = 0 ] || fail "the static program does not hold the CUDA runtime (cudaGetLastError) in $variant"
fi
rm -f "$T/m.safetensors.arena"
"$T/stream-static" "$T/m.safetensors" 290K 2 >"$T/out" 2>&1 || fail "stream (static): $(cat "$T/out")"
grep -q '^ok: 2 steps' "$T/out" || fail "stream (static): $(cat "$T/out")"
# make test's summary (tests/summary.sh): the API section's line says this passed too.
S=$B/test-summary
[ -s "$S/api" ] && echo "$(cat "$S/api") + make install" >"$S/api.new" && mv "$S/api.new" "$S/api"
echo "install tests: passed, $variant (pkg-config: $(pkg-config --libs arena); --static: $(pkg-config --static --libs arena | cut -c 1-200))"
