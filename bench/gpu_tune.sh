#!/bin/sh
# gpu_tune.sh - convert/verify/quant speed side by side with cp/cat, and the
# loader's ring shapes, on a machine with an NVIDIA GPU (measured on one H200) (warm cache). One line per figure.
# usage: A=path/to/arena sh bench/gpu_tune.sh [WORKDIR]
set -u
A=${A:-build/arena}
W=${1:-/tmp/arena-tune}
mkdir -p "$W"
t() { /usr/bin/time -f "%e" "$@" 2>&1 >/dev/null | tail -1; }
ST=$W/f.safetensors
"$A" synth --layout flux-dev -o "$ST" >/dev/null 2>&1
cat "$ST" >/dev/null
echo "cp+sync_s $(t sh -c "cp '$ST' '$W/copy' && sync '$W/copy'")"
rm -f "$W/copy"
echo "convert_s $(t "$A" convert -q "$ST" -o "$W/f.arena")"
echo "convert_fp8row_s $(t "$A" convert -q "$ST" -o "$W/q.arena" --quant fp8-e4m3-row)"
ls -l "$W/f.arena" "$W/q.arena" | awk '{print "size", $5, $9}'
rm -f "$W/q.arena"
echo "convert_again_s $(t "$A" convert -q "$ST" -o "$W/f2.arena")"
rm -f "$W/f2.arena"
cat "$W/f.arena" >/dev/null
for i in 1 2; do
	echo "cat_s $(t cat "$W/f.arena")"
	echo "verify_s $(t "$A" verify "$W/f.arena")"
done
for cfg in "16M 2 16" "8M 4 16" "16M 4 16" "32M 2 16" "4M 8 16" "16M 4 12" "16M 2 8"; do
	set -- $cfg
	r=$("$A" load "$W/f.arena" --backend cuda --json --no-probe --slot-size "$1" --slots "$2" --threads "$3" |
		python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['gbps'],2), {k:round(v,3) for k,v in d['phases'].items()})")
	echo "load slot=$1 slots=$2 threads=$3: $r"
done
r=$(ARENA_HASH_ISA=baseline "$A" load "$W/f.arena" --backend cuda --json --no-probe |
	python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['gbps'],2), d['hash_isa'], {k:round(v,3) for k,v in d['phases'].items()})")
echo "load baseline hash: $r"
"$A" load "$W/f.arena" --backend cuda
