#!/bin/sh
# The Python package and the PyTorch adapter (tests/python/test_torch.py,
# test_retry.py, test_args.py, test_models.py, test_bench.py, test_onecall.py
# and test_synth.py), in BUILD/venv-torch: torch, diffusers and peft from PyPI
# (pinned in tests/python/requirements-torch.txt; pip's cache and the venv
# are kept between runs, the venv brought to the file's pins when they
# change), and the package installed the way a user does, `pip install
# ./python` (it builds libarena.so).
# usage: sh tests/python/run_torch.sh BUILD
# Prints one line per test (unittest -v). Exit status: 0 passed (then
# BUILD/test-summary/torch says how many), 1 a failure, 77 skipped (the
# packages cannot be installed: no PyPI; BUILD/test-summary/torch.skipped
# then says so, and under CI=true it is a failure instead).
# With ARENA_TEST_QUICK set to anything but "" or "0" (make check) the tests
# marked @slow (tests/python/tiers.py) are skipped; the counts say how many
# ran, and BUILD/test-summary/torch.skipped how many were left to make test.
set -u
B=${1:-build}
V=$B/venv-torch
REQ=tests/python/requirements-torch.txt
S=$B/test-summary
R0=$(pwd)
SKIPPED=$S/torch.skipped
mkdir -p "$S" || exit 1
rm -f "$S/torch" "$SKIPPED"
FAILED=$S/torch.failed
rm -f "$FAILED"
# fail MESSAGE [LOG]: the message, and in $FAILED the message and LOG's
# failure reports (unittest's blocks from the first ====== line, 80 lines at
# most), which make test-python prints again as its last lines: a CI that
# keeps only the end of the output still shows what failed and where.
fail() {
	echo "python adapter tests: $1"
	{
		echo "python adapter tests: $1"
		[ -n "${2:-}" ] && sed -n '/^======/,$p' "$2" | head -n 80
	} >"$R0/$FAILED" 2>/dev/null
	exit 1
}
# Every Python test file runs under a watchdog: one that has not ended after
# LIMIT seconds (the whole suite takes 2-4 minutes on a 2-core machine) gets
# SIGABRT, which Python's faulthandler (on) answers with each thread's stack in
# its log, and the run fails saying so, where a hang would have run until CI
# cut it off with nothing shown.
LIMIT=${ARENA_TEST_TIMEOUT:-1800}
export PYTHONFAULTHANDLER=1
guarded() {
	timeout -s ABRT -k 30 "$LIMIT" "$@"
	r=$?
	[ $r = 124 ] && echo "(stopped: still running after $LIMIT s; the stacks above say where)"
	return $r
}
# A BUG() report of the library (common/err.c: "BUG: file:line: ...") is never
# expected: one in a log fails the run, whatever the tests said.
no_bug() {
	! grep -q '^BUG: ' "$1" || fail "a BUG() report in $1: $(grep -m 1 '^BUG: ' "$1")"
}
# The CUDA libraries torch's wheel links to, by soname: where ldconfig finds all
# of them (a CUDA 13 toolkit), torch goes in without its nvidia-* and triton
# dependencies (3 GB less on disk; these tests run torch on the CPU only).
TOOLKIT_LIBS="libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libcufft.so.12 libcurand.so.10 libcusparse.so.12"
lean=1
for l in $TOOLKIT_LIBS; do
	/sbin/ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$l " || lean=0
done
IMPORTS="import torch, diffusers, transformers, tokenizers, peft, safetensors, numpy, ml_dtypes, mypy, torchao, optimum.quanto"
# The pins the venv holds: a copy of $REQ as it was installed. A venv kept
# from an earlier run (a cached build folder) with other pins imports all the
# same: a changed pin is installed over it (pip replaces what differs).
STAMP=$V/arena-requirements.txt
install() {
	python3 -m venv "$V" || return 1
	if [ $lean = 1 ]; then
		echo "python adapter tests: installing $REQ into $V, torch's CUDA libraries from this machine's toolkit (once, and when its pins change; a few minutes, 2 GB)"
		"$V/bin/pip" install -q --disable-pip-version-check --no-deps -r "$REQ" \
			nvidia-cufile==1.15.1.6 nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 || return 1
		"$V/bin/python" -c "$IMPORTS" >"$B/python-imports.log" 2>&1 && return 0
		tail -n 5 "$B/python-imports.log"
		echo "python adapter tests: torch does not load with this machine's CUDA libraries; installing its own"
	else
		echo "python adapter tests: installing $REQ into $V with torch's CUDA libraries (once, and when its pins change; a few minutes, 5 GB)"
	fi
	"$V/bin/pip" install -q --disable-pip-version-check -r "$REQ"
}
if ! [ -x "$V/bin/python" ] || ! "$V/bin/python" -c "$IMPORTS" 2>/dev/null || ! cmp -s "$REQ" "$STAMP"; then
	rm -f "$STAMP"
	if ! install; then
		[ "${CI:-}" = true ] && fail "cannot install the packages of $REQ (PyPI unreachable? disk full? pip's message is above)"
		echo "python adapter (torch, diffusers and peft unavailable)" >"$SKIPPED"
		echo "python adapter tests: SKIPPED (cannot install the packages of $REQ; run with network access)"
		exit 77
	fi
	cp "$REQ" "$STAMP" || exit 1
fi
"$V/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall ./python || fail "pip install ./python"
R=$(pwd)
PY=$(cd "$V" && pwd)/bin/python
# Its types, against torch's (python/pyproject.toml [tool.mypy]; the cache in BUILD).
(cd python && "$PY" -m mypy --cache-dir "$R/$B/mypy-cache") >"$B/python-mypy.log" 2>&1 ||
	{ tail -n 20 "$B/python-mypy.log"; fail "mypy: the package's types do not check (log: $B/python-mypy.log)"; }
echo "python adapter tests: $(tail -n 1 "$B/python-mypy.log")"
# The package as installed, not the source tree: run from elsewhere.
cd "$B" || exit 1
# In the quick tier torch computes on one thread, unless OMP_NUM_THREADS says
# otherwise: on a two-core machine that other work shares, torch's two threads
# wait on each other (the quick model tests took 2.6 times as long beside one
# busy core, and 1.1 times on one thread; as fast alone either way).
case ${ARENA_TEST_QUICK:-} in
"" | 0) ;;
*) export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" ;;
esac
# unittest -v, each test on one line: its name, not its docstring's first line
# on a line of its own. The adapter's tests (test_torch.py), its retries of
# steps that run out of device memory (test_retry.py), the package's checks
# of the ints it passes to C (test_args.py), then any model's
# (test_models.py: families of diffusers and transformers, a whole pipeline),
# the README's benchmark command (test_bench.py), the one-call forms
# (test_onecall.py: from_pretrained and offload through the cache), and
# images of models with random weights written a block at a time
# (test_synth.py: synth_image, arena.ImageWriter).
# ran LOG: got, the tests of a unittest log that ran (not skipped as slow); the
# skipped ones are added to k.
k=0
ran() {
	all=$(sed -n 's/^Ran \([0-9]*\) tests.*/\1/p' "$1")
	slow=$(grep -c " \.\.\. skipped 'slow: make test runs it'$" "$1")
	k=$((k + slow))
	got=$((all - slow))
}
n=0
for t in test_torch test_retry test_args test_models test_bench test_onecall test_synth; do
	ARENA_FIXTURES_DIR=${ARENA_FIXTURES_DIR:-$R/fixtures} ARENA_BIN=$R/$B/arena PYTHONWARNINGS=ignore \
		guarded "$PY" -c 'import os, runpy, sys, unittest
unittest.TextTestResult.getDescription = lambda self, test: str(test)
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as when the file is run
runpy.run_path(sys.argv[0], run_name="__main__")' "$R/tests/python/$t.py" -v >"$R/$B/python-$t.log" 2>&1
	rc=$?
	cat "$R/$B/python-$t.log"
	[ $rc = 0 ] && grep -q '^OK' "$R/$B/python-$t.log" || fail "failures in $t.py (log: $B/python-$t.log)" "$R/$B/python-$t.log"
	no_bug "$R/$B/python-$t.log"
	ran "$R/$B/python-$t.log"
	n=$((n + got))
done
echo "python adapter tests: passed ($n tests$([ "$k" = 0 ] || echo "; $k slow ones skipped"))"
# arena.convert, verify, inspect and the package's arena command (tests/python/test_files.py),
# the cache (tests/python/test_cache.py), then examples/sample_flux.py and examples/train_lora.py at their tiny configs
# (tests/python/test_examples.py); one line per test, as above.
one_per_line='import os, runpy, sys, unittest
unittest.TextTestResult.getDescription = lambda self, test: str(test)
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as when the file is run
runpy.run_path(sys.argv[0], run_name="__main__")'
ARENA_FIXTURES_DIR=${ARENA_FIXTURES_DIR:-$R/fixtures} guarded "$PY" -c "$one_per_line" "$R/tests/python/test_files.py" -v \
	>"$R/$B/python-files.log" 2>&1
rc=$?
cat "$R/$B/python-files.log"
[ $rc = 0 ] && grep -q '^OK' "$R/$B/python-files.log" || fail "arena.convert/verify/inspect: failures (log: $B/python-files.log)" "$R/$B/python-files.log"
no_bug "$R/$B/python-files.log"
ran "$R/$B/python-files.log"
nf=$got
# The cache of converted images: arena_gpu._cache, arena.cache_info and the package's
# arena cache command (tests/python/test_cache.py); no torch needed.
ARENA_FIXTURES_DIR=${ARENA_FIXTURES_DIR:-$R/fixtures} guarded "$PY" -c "$one_per_line" "$R/tests/python/test_cache.py" -v \
	>"$R/$B/python-cache.log" 2>&1
rc=$?
cat "$R/$B/python-cache.log"
[ $rc = 0 ] && grep -q '^OK' "$R/$B/python-cache.log" || fail "the cache: failures (log: $B/python-cache.log)"
no_bug "$R/$B/python-cache.log"
ran "$R/$B/python-cache.log"
nc=$got
ARENA_EXAMPLES_DIR=$R/examples PYTHONWARNINGS=ignore guarded "$PY" -c "$one_per_line" "$R/tests/python/test_examples.py" -v \
	>"$R/$B/python-examples.log" 2>&1
rc=$?
cat "$R/$B/python-examples.log"
[ $rc = 0 ] && grep -q '^OK' "$R/$B/python-examples.log" || fail "examples: failures (log: $B/python-examples.log)" "$R/$B/python-examples.log"
no_bug "$R/$B/python-examples.log"
ran "$R/$B/python-examples.log"
ne=$got
echo "python package tests: passed ($nf tests of convert/verify/inspect, $nc of the cache, $ne of the examples)"
echo "python adapter $n tests + mypy, package $nf, cache $nc, examples $ne" >"$R/$S/torch"
[ "$k" = 0 ] || echo "python $k (slow: make test runs them)" >"$R/$SKIPPED"
