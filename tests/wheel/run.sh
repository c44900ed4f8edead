#!/bin/sh
# run.sh - the wheel as a user gets it: build it (scripts/wheel.sh), install it
# into a venv of its own, and run it where there is no compiler and no
# library but the C runtime:
#   - ldd of the installed libarena.so and arena binary: only the C runtime;
#   - with PATH the venv's bin alone (no cc, gcc, make, ld; checked) and an
#     empty LD_LIBRARY_PATH: `arena convert`, `arena verify`, `arena inspect`
#     (the console script), tests/python/test_files.py (arena.convert,
#     verify, inspect; Ctrl-C) and examples/sample_flux.py --tiny.
# The venv gets the wheel (reinstalled every run) and the example's packages,
# pinned as tests/python/requirements-torch.txt has them (pip's cache keeps
# them); it is kept in BUILD/wheel/venv-test between runs, and brought to the
# file's pins when they change.
# usage: sh tests/wheel/run.sh BUILD
# Exit status: 0 passed (BUILD/test-summary/wheel says what), 1 a failure,
# 77 skipped: zig, the sources or the packages cannot be fetched (no PyPI or
# Debian archive; the reason goes to BUILD/test-summary/wheel.skipped); under
# CI=true that is a failure instead.
set -u
B=${1:-build}
R=$(pwd)
S=$B/test-summary
SKIPPED=$S/wheel.skipped
REQ=tests/python/requirements-torch.txt
mkdir -p "$S" || exit 1
rm -f "$S/wheel" "$SKIPPED"
fail() {
	echo "wheel tests: FAIL: $*"
	echo "0 passed, 1 failed"
	exit 1
}
skip() {
	[ "${CI:-}" = true ] && fail "$1"
	echo "wheel: $1" >"$SKIPPED"
	echo "wheel tests: SKIPPED ($1)"
	exit 77
}
t0=$(date +%s)
sh scripts/wheel.sh "$B"
rc=$?
[ $rc = 77 ] && skip "zig or the sources of jansson, xxHash, zstd cannot be fetched"
[ $rc = 0 ] || fail "make wheel (scripts/wheel.sh) failed"
W=$(cd "$B/wheel" && pwd)
WHL=$(ls "$W"/dist/arena_gpu-*-py3-none-manylinux_2_28_*.whl 2>/dev/null | head -n 1)
[ -n "$WHL" ] || fail "no wheel in $W/dist"
t1=$(date +%s)

# --- the venv: the example's packages (kept), the wheel (always anew) -----------
V=$W/venv-test
TOOLKIT_LIBS="libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libcufft.so.12 libcurand.so.10 libcusparse.so.12"
lean=1
for l in $TOOLKIT_LIBS; do
	/sbin/ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$l " || lean=0
done
# The pins the venv holds (a copy of $REQ as installed): a venv kept with
# other pins gets the changed ones installed over it, as run_torch.sh does.
STAMP=$V/arena-requirements.txt
if ! [ -x "$V/bin/python" ] || ! "$V/bin/python" -c "import torch, diffusers, transformers, safetensors, PIL" 2>/dev/null; then
	rm -rf "$V"
	python3 -m venv "$V" || fail "python3 -m venv"
fi
if ! cmp -s "$REQ" "$STAMP"; then
	rm -f "$STAMP"
	echo "wheel tests: installing the example's packages ($REQ) into $V"
	if [ $lean = 1 ]; then # torch's CUDA libraries from this machine's toolkit, as tests/python/run_torch.sh does
		"$V/bin/pip" install -q --disable-pip-version-check --no-deps -r "$REQ" \
			nvidia-cufile==1.15.1.6 nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 &&
			"$V/bin/python" -c "import torch" >"$W/imports.log" 2>&1 || lean=0
	fi
	[ $lean = 1 ] || "$V/bin/pip" install -q --disable-pip-version-check -r "$REQ" ||
		skip "the packages of $REQ cannot be installed (no PyPI?)"
	cp "$REQ" "$STAMP" || fail "cp $REQ $STAMP"
fi
"$V/bin/pip" uninstall -q -y arena arena-gpu >/dev/null 2>&1 # (arena: the distribution's name before)
"$V/bin/pip" install -q --disable-pip-version-check --no-deps "$WHL" || fail "pip install $WHL"
"$V/bin/python" -c "
import importlib.metadata as m
d = m.packages_distributions()
assert m.metadata('arena-gpu')['Name'] == 'arena-gpu' and d.get('arena_gpu') == ['arena-gpu'], d.get('arena_gpu')
assert 'arena-gpu' not in d.get('arena', []), 'the wheel installs a module arena'
" || fail "the wheel's distribution is not arena-gpu, its module arena_gpu alone"
SITE=$("$V/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
[ -f "$SITE/arena_gpu/libarena.so" ] && [ -x "$SITE/arena_gpu/bin/arena" ] && [ -x "$V/bin/arena" ] ||
	fail "the wheel did not install libarena.so, arena/bin/arena and the arena command"
t2=$(date +%s)

# --- what the binaries need: the C runtime only ------------------------------------
for f in "$SITE/arena_gpu/libarena.so" "$SITE/arena_gpu/bin/arena"; do
	ldd "$f" >"$W/ldd.txt" 2>&1 || fail "ldd $f: $(cat "$W/ldd.txt")"
	other=$(awk '{print $1}' "$W/ldd.txt" | grep -v -E '^(linux-vdso\.so\.1|/lib64/ld-linux-x86-64\.so\.2|/lib/ld-linux-aarch64\.so\.1|ld-linux-(x86-64|aarch64)\.so\.2|lib(c|m|pthread|dl|rt)\.so\.[0-9]+)$' || true)
	[ -z "$other" ] || fail "$f needs $(echo $other), not only the C runtime: $(cat "$W/ldd.txt")"
	grep -q 'not found' "$W/ldd.txt" && fail "ldd $f: $(cat "$W/ldd.txt")"
done
echo "wheel tests: ldd of libarena.so and arena: $(awk '{print $1}' "$W/ldd.txt" | tr '\n' ' ')"

# --- run it with no build tools and no library path -------------------------------------
T=$(mktemp -d "${TMPDIR:-/tmp}/arena-wheel.XXXXXX") || fail "mktemp"
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/home"
cp fixtures/tiny_flux.safetensors "$T/"
# Only the venv's commands: env -i drops the rest of the environment (LD_LIBRARY_PATH too).
bare() {
	env -i HOME="$T/home" PATH="$V/bin" LANG=C.UTF-8 HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore \
		ARENA_FIXTURES_DIR="$R/fixtures" "$@"
}
bare "$V/bin/python" -c "
import shutil, sys, os
found = [t for t in ('cc', 'gcc', 'c++', 'g++', 'clang', 'make', 'ld', 'nvcc') if shutil.which(t)]
assert not found, f'build tools on PATH: {found}'
assert not os.environ.get('LD_LIBRARY_PATH')
import arena_gpu as arena, arena_gpu._native as n
assert n.lib._name.startswith('$SITE/arena_gpu/'), n.lib._name
print('wheel tests: arena', arena.library_version(), 'from', n.lib._name)
" || fail "the venv is not bare, or arena is not the wheel's"
cd "$T" || fail "cd $T"
bare arena convert tiny_flux.safetensors -o f.arena --codec hb4 >out.txt 2>&1 || fail "arena convert: $(cat out.txt)"
grep -q '^wrote f.arena: 6 blocks, 126 tensors' out.txt || fail "arena convert: $(cat out.txt)"
bare arena verify f.arena >out.txt 2>&1 || fail "arena verify: $(cat out.txt)"
grep -q '^ok: f.arena' out.txt || fail "arena verify: $(cat out.txt)"
bare "$V/bin/python" -m arena_gpu inspect --json f.arena >out.txt 2>&1 || fail "python -m arena_gpu inspect: $(cat out.txt)"
grep -q '"coded_image": true' out.txt || fail "python -m arena_gpu inspect: $(head -c 500 out.txt)"
# the benchmark command: its --help without torch; without a GPU it says what to do
bare "$V/bin/python" -m arena_gpu.bench --help >out.txt 2>&1 || fail "python -m arena_gpu.bench --help: $(cat out.txt)"
grep -q 'README' out.txt || fail "python -m arena_gpu.bench --help: $(head -c 500 out.txt)"
if ! [ -e /dev/nvidiactl ]; then
	bare "$V/bin/python" -m arena_gpu.bench --quick >out.txt 2>&1
	rc=$?
	[ $rc = 2 ] && grep -q 'backend sim' out.txt || fail "python -m arena_gpu.bench without a GPU (exit $rc): $(cat out.txt)"
fi
printf 'x' | dd of=f.arena bs=1 seek=70000 conv=notrunc 2>/dev/null
bare arena verify f.arena >out.txt 2>&1
[ $? = 1 ] && grep -q 'IMG_\|checksum' out.txt || fail "arena verify of a changed image: $(cat out.txt)"
bare "$V/bin/python" "$R/tests/python/test_files.py" -v >"$R/$B/wheel-files.log" 2>&1 ||
	{ tail -n 30 "$R/$B/wheel-files.log"; fail "tests/python/test_files.py (log: $B/wheel-files.log)"; }
bare "$V/bin/python" "$R/examples/sample_flux.py" --tiny --steps 2 --out s.png >out.txt 2>&1 ||
	fail "examples/sample_flux.py --tiny: $(tail -n 20 out.txt)"
grep -q '^wrote s.png: 32x32, 2 steps' out.txt || fail "examples/sample_flux.py --tiny: $(tail -n 5 out.txt)"
bare "$V/bin/python" -c "from PIL import Image; assert Image.open('s.png').size == (32, 32)" || fail "s.png"
t3=$(date +%s)
echo "wheel tests: passed: $(basename "$WHL") ($(du -k "$WHL" | cut -f1) KiB) in a venv without build tools:" \
	"convert, verify, inspect, test_files.py ($(sed -n 's/^Ran \([0-9]*\) tests.*/\1/p' "$R/$B/wheel-files.log") tests)," \
	"sample_flux.py --tiny; wheel $((t1 - t0)) s, venv $((t2 - t1)) s, runs $((t3 - t2)) s"
echo "wheel ($(basename "$WHL")): ldd, convert, verify, inspect, package $(sed -n 's/^Ran \([0-9]*\) tests.*/\1/p' "$R/$B/wheel-files.log"), sample_flux --tiny" >"$R/$S/wheel"
