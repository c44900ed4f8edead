#!/bin/sh
# Python interop tests: files arena writes are read by the reference
# safetensors library (installed from PyPI into BUILD/venv).
# usage: sh tests/python/run.sh BUILD
# Without PyPI access the tests are skipped, except under CI (CI=true), where
# that is a failure.
set -u
B=${1:-build}
A=$B/arena
REF=${ARENA_REFERENCE_DIR:-../shared/fixtures/reference}
V=$B/venv
if ! [ -x "$V/bin/python" ] || ! "$V/bin/python" -c "import safetensors, numpy, ml_dtypes" 2>/dev/null; then
	echo "python tests: installing safetensors, numpy, ml_dtypes into $V"
	if ! { python3 -m venv "$V" && "$V/bin/pip" install -q --disable-pip-version-check safetensors numpy ml_dtypes; }; then
		if [ "${CI:-}" = true ]; then
			echo "python tests: cannot install the reference library (PyPI unreachable?)"
			echo "0 passed, 1 failed"
			exit 1
		fi
		echo "python tests: SKIPPED (cannot install the reference library; run with network access)"
		exit 0
	fi
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/arena-py.XXXXXX")
trap 'rm -rf "$T"' EXIT
set -e
"$A" convert -q "$REF/tiny_flux.safetensors" -o "$T/flux.arena"
"$A" export -q "$T/flux.arena" -o "$T/flux.safetensors"
"$A" convert -q "$REF/tiny_llama_sharded" -o "$T/llama.arena"
"$A" export -q "$T/llama.arena" -o "$T/llama.safetensors"
"$A" convert -q "$REF/dtypes.safetensors" -o "$T/dtypes.arena"
"$A" export -q "$T/dtypes.arena" -o "$T/dtypes.safetensors"
"$A" convert -q "$REF/tiny_flux.safetensors" --codec hb4 --chunk-size 64K -o "$T/flux-hb4.arena"
"$A" export -q "$T/flux-hb4.arena" -o "$T/flux-hb4.safetensors"
"$A" convert -q "$REF/tiny_llama_sharded" --codec hb4 --chunk-size 64K -o "$T/llama-hb4.arena"
"$A" export -q "$T/llama-hb4.arena" -o "$T/llama-hb4.safetensors"
"$A" convert -q "$REF/tiny_flux.safetensors" --quant fp8-e4m3-row -o "$T/flux-q.arena"
"$A" verify "$T/flux-q.arena" >/dev/null
"$A" export -q "$T/flux-q.arena" -o "$T/flux-q.safetensors"
set +e
"$V/bin/python" tests/python/check_quant.py "$REF/tiny_flux.safetensors" "$T/flux-q.safetensors" 40
q=$?
"$V/bin/python" tests/python/check_export.py \
	"$REF/tiny_flux.safetensors" "$T/flux.safetensors" \
	"$REF/tiny_llama_sharded" "$T/llama.safetensors" \
	"$REF/dtypes.safetensors" "$T/dtypes.safetensors" \
	"$REF/tiny_flux.safetensors" "$T/flux-hb4.safetensors" \
	"$REF/tiny_llama_sharded" "$T/llama-hb4.safetensors"
[ $? = 0 ] && [ $q = 0 ]
