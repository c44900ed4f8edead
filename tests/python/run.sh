#!/bin/sh
# Python interop tests: files arena writes are read by the reference
# safetensors library (installed from PyPI into BUILD/venv), with the inputs in
# fixtures/ (or $ARENA_FIXTURES_DIR).
# usage: sh tests/python/run.sh BUILD
# Exit status: 0 all passed, 1 a failure, 77 skipped. The tests are skipped only
# when the reference packages cannot be installed (no PyPI access); the last
# line then says "python tests: SKIPPED (...)", and
# BUILD/test-summary/python.skipped holds the reason, for make test's last
# line. Under CI (CI=true) that is a failure instead. Passed, they leave
# BUILD/test-summary/python saying what they checked.
set -u
B=${1:-build}
A=$B/arena
REF=${ARENA_FIXTURES_DIR:-fixtures}
V=$B/venv
PKGS="safetensors numpy ml_dtypes"
S=$B/test-summary
SKIPPED=$S/python.skipped
mkdir -p "$S" || exit 1
rm -f "$SKIPPED" "$S/python"
fail() {
	echo "python tests: $*"
	echo "0 passed, 1 failed"
	exit 1
}
arena() {
	"$A" "$@" || fail "arena $* (exit $?)"
}
if ! [ -x "$V/bin/python" ] || ! "$V/bin/python" -c "import safetensors, numpy, ml_dtypes" 2>/dev/null; then
	echo "python tests: installing $PKGS into $V"
	# shellcheck disable=SC2086
	if ! { python3 -m venv "$V" && "$V/bin/pip" install -q --disable-pip-version-check $PKGS; }; then
		if [ "${CI:-}" = true ]; then
			fail "cannot install the reference packages ($PKGS; PyPI unreachable?)"
		fi
		echo "python interop (reference packages unavailable)" >"$SKIPPED"
		echo "python tests: SKIPPED (cannot install the reference packages $PKGS; run with network access)"
		exit 77
	fi
fi
[ -f "$REF/tiny_flux.safetensors" ] || fail "no fixtures in '$REF' (run from the project root, or set ARENA_FIXTURES_DIR)"
T=$(mktemp -d "${TMPDIR:-/tmp}/arena-py.XXXXXX") || fail "mktemp"
trap 'rm -rf "$T"' EXIT
arena convert -q "$REF/tiny_flux.safetensors" -o "$T/flux.arena"
arena export -q "$T/flux.arena" -o "$T/flux.safetensors"
arena convert -q "$REF/tiny_llama_sharded" -o "$T/llama.arena"
arena export -q "$T/llama.arena" -o "$T/llama.safetensors"
arena convert -q "$REF/dtypes.safetensors" -o "$T/dtypes.arena"
arena export -q "$T/dtypes.arena" -o "$T/dtypes.safetensors"
arena convert -q "$REF/tiny_flux.safetensors" --codec hb4 --chunk-size 64K -o "$T/flux-hb4.arena"
arena export -q "$T/flux-hb4.arena" -o "$T/flux-hb4.safetensors"
arena convert -q "$REF/tiny_llama_sharded" --codec hb4 --chunk-size 64K -o "$T/llama-hb4.arena"
arena export -q "$T/llama-hb4.arena" -o "$T/llama-hb4.safetensors"
arena convert -q "$REF/tiny_flux.safetensors" --codec zstd --chunk-size 64K -o "$T/flux-zstd.arena"
arena export -q "$T/flux-zstd.arena" -o "$T/flux-zstd.safetensors"
arena convert -q "$REF/dtypes.safetensors" --codec zstd --zstd-level 3 --chunk-size 64K -o "$T/dtypes-zstd.arena"
arena export -q "$T/dtypes-zstd.arena" -o "$T/dtypes-zstd.safetensors"
arena convert -q "$REF/tiny_flux.safetensors" --quant fp8-e4m3-row -o "$T/flux-q.arena"
arena verify "$T/flux-q.arena" >/dev/null
arena export -q "$T/flux-q.arena" -o "$T/flux-q.safetensors"
arena convert -q "$REF/tiny_flux.safetensors" --quant int4-g64 -o "$T/flux-q4.arena"
arena verify "$T/flux-q4.arena" >/dev/null
arena export -q "$T/flux-q4.arena" -o "$T/flux-q4.safetensors"
# The quantized exports against their source, tensor by tensor (40 quantized at least).
"$V/bin/python" tests/python/check_quant.py "$REF/tiny_flux.safetensors" "$T/flux-q.safetensors" 40 >"$T/quant.out" 2>&1
q=$?
sed 's/^/quantized export of tiny_flux: /' "$T/quant.out"
"$V/bin/python" tests/python/check_quant.py "$REF/tiny_flux.safetensors" "$T/flux-q4.safetensors" 40 >"$T/quant4.out" 2>&1
q4=$?
sed 's/^/int4 export of tiny_flux: /' "$T/quant4.out"
# The int4 schemes against torch ops (images, exports, Arena.dequantize on
# sim): with the torch of BUILD/venv-torch (run_torch.sh makes it), the
# package from python/ and BUILD's libarena.so.
TV=$B/venv-torch
i4=0
if [ -x "$TV/bin/python" ] && "$TV/bin/python" -c "import torch, safetensors" 2>/dev/null && [ -f "$B/libarena.so" ]; then
	ARENA_LIBRARY=$(pwd)/$B/libarena.so PYTHONPATH=$(pwd)/python "$TV/bin/python" tests/python/check_int4.py "$A" "$T" >"$T/int4.out" 2>&1
	i4=$?
	sed 's/^/int4 against torch: /' "$T/int4.out"
	i4n="$(sed -n 's/^\([0-9]*\) passed, 0 failed$/\1/p' "$T/int4.out") int4 checks against torch"
else
	echo "int4 against torch: SKIPPED (no torch in $TV yet, or no $B/libarena.so: run_torch.sh makes the one, make lib the other)"
	echo "python int4 against torch (no torch in $TV, or no $B/libarena.so)" >"$SKIPPED"
	i4n=
fi
"$V/bin/python" tests/python/check_export.py \
	"$REF/tiny_flux.safetensors" "$T/flux.safetensors" \
	"$REF/tiny_llama_sharded" "$T/llama.safetensors" \
	"$REF/dtypes.safetensors" "$T/dtypes.safetensors" \
	"$REF/tiny_flux.safetensors" "$T/flux-hb4.safetensors" \
	"$REF/tiny_llama_sharded" "$T/llama-hb4.safetensors" \
	"$REF/tiny_flux.safetensors" "$T/flux-zstd.safetensors" \
	"$REF/dtypes.safetensors" "$T/dtypes-zstd.safetensors" | tee "$T/export.out"
e=$(sed -n 's/^\([0-9]*\) passed, 0 failed$/\1/p' "$T/export.out")
[ -n "$e" ] && [ $q = 0 ] && [ $q4 = 0 ] && [ $i4 = 0 ] || exit 1
echo "python interop $(sed -n 's/^\([0-9]*\) passed, 0 failed$/\1/p' "$T/quant.out") + $(sed -n 's/^\([0-9]*\) passed, 0 failed$/\1/p' "$T/quant4.out") tensors + $e files${i4n:+ + $i4n}" >"$S/python"
