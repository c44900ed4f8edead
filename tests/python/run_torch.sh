#!/bin/sh
# The Python package and the PyTorch adapter (tests/python/test_torch.py),
# in BUILD/venv-torch: torch, diffusers and peft from PyPI (pinned; pip's
# cache and the venv are kept between runs), and the package installed the
# way a user does, `pip install ./python` (it builds libarena.so).
# usage: sh tests/python/run_torch.sh BUILD
# Exit status: 0 passed, 1 a failure, 77 skipped (the packages cannot be
# installed: no PyPI; BUILD/python-tests.skipped then says so, and under
# CI=true it is a failure instead).
set -u
B=${1:-build}
V=$B/venv-torch
PKGS="torch==2.11.0 diffusers==0.42.1 peft==0.21.2 transformers==5.24.0 safetensors numpy ml_dtypes"
SKIPPED=$B/python-tests.skipped
fail() {
	echo "python adapter tests: $*"
	exit 1
}
if ! [ -x "$V/bin/python" ] || ! "$V/bin/python" -c "import torch, diffusers, peft, safetensors, numpy, ml_dtypes" 2>/dev/null; then
	echo "python adapter tests: installing $PKGS into $V (once; a few minutes)"
	# shellcheck disable=SC2086
	if ! { python3 -m venv "$V" && "$V/bin/pip" install -q --disable-pip-version-check $PKGS; }; then
		[ "${CI:-}" = true ] && fail "cannot install $PKGS (PyPI unreachable?)"
		mkdir -p "$B" && echo "torch, diffusers and peft unavailable" >>"$SKIPPED"
		echo "python adapter tests: SKIPPED (cannot install $PKGS; run with network access)"
		exit 77
	fi
fi
"$V/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall ./python || fail "pip install ./python"
# The package as installed, not the source tree: run from elsewhere.
R=$(pwd)
PY=$(cd "$V" && pwd)/bin/python
cd "$B" || exit 1
ARENA_FIXTURES_DIR=${ARENA_FIXTURES_DIR:-$R/fixtures} ARENA_BIN=$R/$B/arena PYTHONWARNINGS=ignore \
	"$PY" "$R/tests/python/test_torch.py" -v 2>&1 | grep -v 'kept in float32' >"$R/$B/python-torch.log"
rc=$?
tail -n 30 "$R/$B/python-torch.log"
grep -q '^OK' "$R/$B/python-torch.log" || fail "failures (log: $B/python-torch.log)"
echo "python adapter tests: passed ($(sed -n 's/^Ran \([0-9]*\) tests.*/\1/p' "$R/$B/python-torch.log") tests)"
