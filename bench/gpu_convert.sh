#!/bin/sh
# gpu_convert.sh - convert (plain and --quant fp8-e4m3-row, alternated) next to
# cp+sync, and verify next to cat, of flux-dev on a machine with an NVIDIA GPU (measured on one H200).
# usage: A=path/to/arena sh bench/gpu_convert.sh WORKDIR
set -u
A=${A:-build/arena}
W=$1
mkdir -p "$W"
ST=$W/f.safetensors
[ -f "$ST" ] || "$A" synth --layout flux-dev -o "$ST" >/dev/null 2>&1
t() { /usr/bin/time -f "%e" "$@" 2>&1 >/dev/null | tail -1; }
cat "$ST" >/dev/null
echo "cp+sync_s $(t sh -c "cp '$ST' '$W/copy' && sync '$W/copy'")"
rm -f "$W/copy"
for i in 1 2; do
	echo "plain_s $(t "$A" convert -q "$ST" -o "$W/p.arena")"
	echo "fp8row_s $(t "$A" convert -q "$ST" -o "$W/q.arena" --quant fp8-e4m3-row)"
	rm -f "$W/q.arena"
done
cat "$W/p.arena" >/dev/null
for i in 1 2; do
	echo "cat_s $(t cat "$W/p.arena")"
	echo "verify_s $(t "$A" verify "$W/p.arena")"
done
