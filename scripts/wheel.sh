#!/bin/sh
# wheel.sh - build the self-contained wheel: usage: sh scripts/wheel.sh BUILD
#
# The wheel (BUILD/wheel/dist/arena_gpu-VERSION-py3-none-manylinux_2_28_ARCH.whl: the distribution arena-gpu)
# holds the Python package, libarena.so and the `arena` command, both linked
# with everything they use but the C runtime: jansson, xxHash and zstd
# statically (built here from Debian's source packages of the versions
# Debian 12 ships), the CUDA runtime statically (libcudart_static.a, as the
# Makefile links it: the machine needs the NVIDIA driver only, or nothing
# for the simulator), and the kernels' C++ runtime statically (zig's
# libc++abi). Everything is compiled and linked by zig's clang for glibc
# 2.28 (`zig cc -target ARCH-linux-gnu.2.28`), so the result runs on any
# Linux with glibc 2.28 or later (manylinux_2_28); the CUDA kernels' host
# code is compiled by nvcc with the system's compiler and linked by zig.
#
# Where things come from (what CI reaches: Debian's archive and PyPI):
#   - zig, auditwheel, setuptools: PyPI, into BUILD/wheel/tools (a venv;
#     pip's cache keeps the downloads);
#   - jansson, xxhash, libzstd: `apt-get source` from Debian 12 (bookworm)
#     with a configuration of its own under BUILD/wheel/apt (the machine's
#     apt setup is not touched; apt checks the files against the archive's
#     signed index), kept in BUILD/wheel/dl.
# Each stage is skipped when its output is there; remove BUILD/wheel to
# start again.
#
# Checked before the wheel is written: both binaries need nothing past
# GLIBC_2.28 (objdump -T) and no library but the C runtime's (libc, libm,
# libpthread, libdl, librt, ld-linux), libarena.so exports arena.h's
# functions only; and after: `auditwheel show` accepts the wheel's tag.
#
# Environment: WERROR=1 (warnings are errors), CUDA=0 (no CUDA backend),
# CUDA_HOME, WHEEL_ARCH=x86_64|aarch64 (aarch64: the simulator only; the
# CUDA toolkit here has no aarch64 target libraries), DEBIAN_MIRROR
# (default http://deb.debian.org/debian), PYTHON (default python3).
set -eu
B=${1:-build}
ROOT=$(pwd)
ARCH=${WHEEL_ARCH:-x86_64}
GLIBC=2.28
PLAT=manylinux_2_28_$ARCH
PY=${PYTHON:-python3}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
case $ARCH in
x86_64) W=$B/wheel ;;
aarch64) W=$B/wheel-aarch64 CUDA=0 ;;
*) echo "wheel: WHEEL_ARCH '$ARCH': use x86_64 or aarch64" >&2; exit 2 ;;
esac
mkdir -p "$W"
W=$(cd "$W" && pwd)
say() { echo "wheel: $*"; }
die() { echo "wheel: error: $*" >&2; exit 1; }
# What cannot be fetched (no PyPI, no Debian archive): exit 77, which
# tests/wheel/run.sh reports as skipped (a failure under CI=true).
unavailable() {
	echo "wheel: error: $*" >&2
	[ "${CI:-}" = true ] && exit 1
	exit 77
}

# --- tools: zig (the compiler and linker), auditwheel, setuptools -----------
# Pinned: the versions this was tested with.
TOOLS="ziglang==0.17.1 auditwheel==6.8.2 setuptools==80.9.0 wheel==0.45.1"
if ! [ -x "$W/tools/bin/python" ] || ! "$W/tools/bin/python" -c "import ziglang, auditwheel, setuptools, wheel" 2>/dev/null; then
	say "installing $TOOLS into $W/tools"
	"$PY" -m venv "$W/tools" || die "cannot make a venv with $PY (Debian: apt-get install python3-venv)"
	# shellcheck disable=SC2086
	"$W/tools/bin/pip" install -q --disable-pip-version-check $TOOLS || unavailable "cannot install $TOOLS from PyPI"
fi
ZIG=$("$W/tools/bin/python" -c "import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), 'zig'))")
[ -x "$ZIG" ] || die "no zig binary in the ziglang package ($ZIG)"
# zig's cache (the C++ runtime it builds for the target, compiled objects)
# stays in the build folder.
export ZIG_GLOBAL_CACHE_DIR="$W/zig-cache" ZIG_LOCAL_CACHE_DIR="$W/zig-cache"
mkdir -p "$W/bin"
for t in cc ar ranlib; do
	case $t in
	cc) cmd="\"$ZIG\" cc -target $ARCH-linux-gnu.$GLIBC" ;;
	*) cmd="\"$ZIG\" $t" ;;
	esac
	printf '#!/bin/sh\nexport ZIG_GLOBAL_CACHE_DIR="%s" ZIG_LOCAL_CACHE_DIR="%s"\nexec %s "$@"\n' \
		"$W/zig-cache" "$W/zig-cache" "$cmd" >"$W/bin/$t"
	chmod +x "$W/bin/$t"
done
CC="$W/bin/cc"

# --- sources: Debian 12's source packages ---------------------------------------
SRCPKGS="jansson xxhash libzstd"
have_sources() {
	for p in $SRCPKGS; do
		ls "$W/dl/${p}_"*.orig.tar.* >/dev/null 2>&1 || return 1
	done
}
if ! have_sources; then
	command -v apt-get >/dev/null 2>&1 || unavailable "no apt-get: the sources come from Debian's archive (put the orig tarballs of $SRCPKGS in $W/dl)"
	say "fetching the sources of $SRCPKGS from $MIRROR (bookworm)"
	A=$W/apt
	mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$W/dl"
	key=/usr/share/keyrings/debian-archive-keyring.gpg
	opt=""
	[ -f $key ] && opt=" [signed-by=$key]"
	echo "deb-src$opt $MIRROR bookworm main" >"$A/sources.list"
	set -- -o Dir::Etc::SourceList="$A/sources.list" -o Dir::Etc::SourceParts=/dev/null \
		-o Dir::State::Lists="$A/lists" -o Dir::Cache="$A/cache" -o APT::Sandbox::User=root
	apt-get "$@" -qq update || unavailable "apt-get update of Debian's source index failed ($MIRROR)"
	(cd "$W/dl" && apt-get "$@" -qq source --download-only $SRCPKGS) || unavailable "apt-get source $SRCPKGS failed"
	have_sources || die "apt-get source gave no orig tarballs of $SRCPKGS"
fi

# --- static libraries for the target ------------------------------------------------
D=$W/deps
if ! [ -f "$D/.done" ]; then
	rm -rf "$W/src" "$D"
	mkdir -p "$W/src" "$D/include" "$D/lib" "$D/licenses" "$D/obj"
	for p in $SRCPKGS; do
		tar -C "$W/src" -xf "$(ls "$W/dl/${p}_"*.orig.tar.* | grep -v '\.asc$' | head -n 1)"
	done
	DCFLAGS="-O2 -fPIC -fvisibility=hidden -fno-sanitize=undefined"
	# jansson: its two configuration headers as its CMake build writes them
	# on Linux (the values Debian's libjansson-dev has), then the sources.
	J=$(ls -d "$W/src"/jansson-*)
	say "building $(basename "$J")"
	sed -e 's/@json_inline@/inline/' -e 's/@json_have_long_long@/1/' -e 's/@json_have_localeconv@/1/' \
		-e 's/@json_have_atomic_builtins@/1/' -e 's/@json_have_sync_builtins@/1/' \
		"$J/src/jansson_config.h.in" >"$D/include/jansson_config.h"
	for h in ENDIAN_H FCNTL_H SCHED_H UNISTD_H SYS_PARAM_H SYS_STAT_H SYS_TIME_H SYS_TYPES_H STDINT_H CLOSE GETPID \
		GETTIMEOFDAY OPEN READ SCHED_YIELD SYNC_BUILTINS ATOMIC_BUILTINS LOCALE_H SETLOCALE INT32_T UINT32_T \
		UINT16_T UINT8_T SSIZE_T; do
		echo "#define HAVE_$h 1"
	done >"$D/obj/jansson_private_config.h"
	printf '#define USE_URANDOM 1\n#define INITIAL_HASHTABLE_ORDER 3\n' >>"$D/obj/jansson_private_config.h"
	cp "$J/src/jansson.h" "$D/include/"
	for f in "$J"/src/*.c; do
		"$CC" $DCFLAGS -DHAVE_CONFIG_H -I"$D/obj" -I"$D/include" -c "$f" -o "$D/obj/jansson_$(basename "$f" .c).o" ||
			die "compiling $f"
	done
	"$W/bin/ar" rcs "$D/lib/libjansson.a" "$D"/obj/jansson_*.o
	cp "$J/LICENSE" "$D/licenses/jansson.LICENSE"
	# xxHash: the library is one file.
	X=$(ls -d "$W/src"/xxHash-*)
	say "building $(basename "$X")"
	"$CC" $DCFLAGS -c "$X/xxhash.c" -o "$D/obj/xxhash.o" || die "compiling xxhash.c"
	"$W/bin/ar" rcs "$D/lib/libxxhash.a" "$D/obj/xxhash.o"
	cp "$X/xxhash.h" "$D/include/"
	[ -f "$X/xxh3.h" ] && cp "$X/xxh3.h" "$D/include/"
	cp "$X/LICENSE" "$D/licenses/xxhash.LICENSE"
	# zstd: its own Makefile, the static library only; its API hidden in
	# libarena.so (the headers would export it).
	Z=$(ls -d "$W/src"/zstd-*)
	say "building $(basename "$Z") (a minute)"
	make -s -C "$Z/lib" -j"$JOBS" libzstd.a CC="$CC" AR="$W/bin/ar" \
		MOREFLAGS="$DCFLAGS -DZSTDLIB_VISIBLE= -DZSTDERRORLIB_VISIBLE= -DZDICTLIB_VISIBLE= -DZSTDLIB_VISIBILITY= -DZSTDERRORLIB_VISIBILITY= -DZDICTLIB_VISIBILITY=" >/dev/null ||
		die "building zstd"
	cp "$Z/lib/libzstd.a" "$D/lib/"
	cp "$Z/lib/zstd.h" "$Z/lib/zstd_errors.h" "$Z/lib/zdict.h" "$D/include/"
	cp "$Z/LICENSE" "$D/licenses/zstd.LICENSE"
	(cd "$W/dl" && ls ./*.dsc | sed 's|^\./||') >"$D/licenses/SOURCES"
	touch "$D/.done"
fi

# --- libarena.so and the arena command ----------------------------------------------
say "building libarena.so and arena for $PLAT"
set -- BUILD="$W/build" CC="$CC" DEPS_CHECK=0 DEP_CPPFLAGS="-isystem $D/include" \
	DEP_LIBS="$D/lib/libjansson.a $D/lib/libxxhash.a $D/lib/libzstd.a" CXX_LIBS=-lc++ \
	SO_EXPORTS="-Wl,--version-script=$ROOT/scripts/libarena.ver" CFLAGS="-O2 -fno-sanitize=undefined" \
	LDFLAGS=-s WERROR="${WERROR:-0}"
[ "${CUDA:-}" = 0 ] && set -- "$@" CUDA=0
[ -n "${CUDA_HOME:-}" ] && set -- "$@" CUDA_HOME="$CUDA_HOME"
make --no-print-directory -j"$JOBS" "$@" lib cli
LIB=$W/build/libarena.so
BIN=$W/build/arena

# --- checks ---------------------------------------------------------------------------
for f in "$LIB" "$BIN"; do
	over=$(objdump -T "$f" | grep -o 'GLIBC_[0-9][0-9.]*' | sort -u -V |
		awk -F_ -v max=$GLIBC '{ split($2, v, "."); split(max, m, ".");
			if (v[1] > m[1] || (v[1] == m[1] && v[2] > m[2])) print $0 }')
	[ -z "$over" ] || die "$f needs symbols of $(echo $over) (past GLIBC_$GLIBC)"
	libs=$(objdump -p "$f" | awk '$1 == "NEEDED" {print $2}' |
		grep -v -E '^(libc|libm|libpthread|libdl|librt)\.so\.[0-9]+$|^ld-linux-(x86-64|aarch64)\.so\.[0-9]+$' || true)
	[ -z "$libs" ] || die "$f needs $(echo $libs): only the C runtime's libraries may be"
done
extra=$(nm -D --defined-only "$LIB" | awk '$2 ~ /^[TDBRWVi]$/ && $3 !~ /^arena_/ {print $3}' | head -n 5)
[ -z "$extra" ] || die "libarena.so exports more than arena.h: $(echo $extra)"

# --- the wheel ----------------------------------------------------------------------------
P=$W/pkg
rm -rf "$P" "$W/dist"
mkdir -p "$P" "$W/dist"
cp -R python "$P/python"
rm -rf "$P/python/build" "$P/python"/*.egg-info
mkdir -p "$P/python/arena_gpu/licenses"
cp "$D/licenses"/* "$P/python/arena_gpu/licenses/"
VERSION=$(sed -n 's/^#define ARENA_VERSION_STRING "\(.*\)"/\1/p' include/arena.h)
say "packaging arena $VERSION"
(cd "$P/python" && ARENA_PREBUILT_LIBRARY="$LIB" ARENA_PREBUILT_CLI="$BIN" ARENA_WHEEL_PLAT="$PLAT" \
	"$W/tools/bin/pip" wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$W/dist" .) ||
	die "pip wheel failed"
WHL=$(ls "$W/dist"/arena_gpu-"$VERSION"-py3-none-"$PLAT".whl 2>/dev/null) || die "no wheel tagged $PLAT in $W/dist"
"$W/tools/bin/auditwheel" show "$WHL" >"$W/auditwheel.txt" 2>&1 || { cat "$W/auditwheel.txt"; die "auditwheel show failed"; }
# It names the most widely usable tag the wheel's contents allow: one of
# glibc 2.28 or older accepts the wheel's.
tag=$(tr '\n' ' ' <"$W/auditwheel.txt" | sed -n 's/.*is consistent with the following platform tag: *"manylinux_\([0-9]*\)_\([0-9]*\)_'"$ARCH"'".*/\1 \2/p')
[ -n "$tag" ] && [ "${tag% *}" = 2 ] && [ "${tag#* }" -le 28 ] ||
	{ cat "$W/auditwheel.txt"; die "auditwheel does not accept $PLAT"; }
if [ "$(uname -m)" = "$ARCH" ]; then
	cuda=$("$BIN" version | grep -i cuda || true)
else
	cuda="for $ARCH, the simulator only; not run here"
fi
say "$WHL ($(du -k "$WHL" | cut -f1) KiB; $cuda)"
say "auditwheel show: $(tr '\n' ' ' <"$W/auditwheel.txt" | sed 's/  */ /g')"
