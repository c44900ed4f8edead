#!/bin/sh
# gpu_quant.sh - quantized vs plain convert of flux-dev, alternated, warm cache.
# usage: A=path/to/arena sh bench/gpu_quant.sh SAFETENSORS WORKDIR
set -u
A=${A:-build/arena}
ST=$1
W=$2
t() { /usr/bin/time -f "%e" "$@" 2>&1 >/dev/null | tail -1; }
cat "$ST" >/dev/null
for i in 1 2; do
	echo "plain_s $(t "$A" convert -q "$ST" -o "$W/p.arena")"
	rm -f "$W/p.arena"
	sync
	echo "fp8row_s $(t "$A" convert -q "$ST" -o "$W/q.arena" --quant fp8-e4m3-row)"
	rm -f "$W/q.arena"
	sync
done
