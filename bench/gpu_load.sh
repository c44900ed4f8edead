#!/bin/sh
# gpu_load.sh - loading flux-dev onto an NVIDIA GPU, against the machine's own
# limits and against Python's safetensors.
#
# Measures: `arena load --backend cuda --json` of the plain image (3 warm
#   loads, the image in the page cache; 1 cold, caches dropped) and of an
#   hb4 image (`convert --codec hb4`: 3 warm, 1 cold); `arena load` of the
#   safetensors file itself, destination-first (2 warm);
#   `safetensors.torch.load_file(device="cuda")` (2 warm); the device bytes
#   of cuda against sim for a small plain and hb4 image (`--check`, also
#   with a 16 MiB pin budget). SHAPES="SLOT:SLOTS:THREADS ...": the plain
#   image warm with each ring shape too (e.g. "1M:4:16 512K:8:16 2M:3:16"),
#   and once with the baseline hash (ARENA_HASH_ISA=baseline).
# Limit, same run: each load's --json `limits`: the pinned host-to-device
#   rate and the read rate of the same file with the same threads (buffered
#   when warm, O_DIRECT when cold); Python's rate for the ratio.
# Prints: a log (OUT/log.txt) with every load's JSON; one JSON file a load
#   under OUT (load_*.json, python_warm.json).
# Run: OUT=dir A=build/arena sh bench/gpu_load.sh [WORKDIR]
#   on a machine with an NVIDIA GPU and a CUDA build of arena; python3 with
#   torch and safetensors (for the side by side), ~50 GB free in WORKDIR,
#   root for the cold loads (drop_caches; skipped otherwise).
set -u
A=${A:-build/arena}
OUT=${OUT:-/tmp/arena-bench-out}
W=${1:-/tmp/arena-bench}
mkdir -p "$W" "$OUT"
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
run() { log "$*"; "$@" 2>&1 | tee -a "$OUT/log.txt"; }
log "$(date -u) $(nproc) cores; $(free -g | awk '/Mem/{print $2" GiB RAM"}'); $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null)"
df -h "$W" | tee -a "$OUT/log.txt"
ST=$W/flux-dev.safetensors
IMG=$W/flux-dev.arena
[ -f "$ST" ] || run "$A" synth --layout flux-dev -o "$ST"
[ -f "$IMG" ] || { log convert; /usr/bin/time -f "convert %e s" "$A" convert "$ST" -o "$IMG" 2>&1 | tee -a "$OUT/log.txt"; }

# Warm page cache: both files read once.
cat "$IMG" >/dev/null
for i in 1 2 3; do
	log "warm load $i"
	"$A" load "$IMG" --backend cuda --json >"$OUT/load_warm_$i.json" 2>>"$OUT/log.txt"
	cat "$OUT/load_warm_$i.json" >>"$OUT/log.txt"
done
for sh in ${SHAPES:-}; do
	IFS=: read -r slot slots threads <<EOS
$sh
EOS
	log "warm load, ring $slot x $slots slots x $threads threads"
	"$A" load "$IMG" --backend cuda --json --no-probe --slot-size "$slot" --slots "$slots" --threads "$threads" |
		python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['gbps'],2), 'GB/s', {k:round(v,3) for k,v in d['phases'].items()})" |
		tee -a "$OUT/log.txt"
done
if [ -n "${SHAPES:-}" ]; then
	log "warm load, baseline hash"
	ARENA_HASH_ISA=baseline "$A" load "$IMG" --backend cuda --json --no-probe |
		python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['gbps'],2), 'GB/s', d['hash_isa'], {k:round(v,3) for k,v in d['phases'].items()})" |
		tee -a "$OUT/log.txt"
fi
# The coded image (convert --codec hb4): the plain one makes room for it
# where the disk holds only two of the three files.
CIMG=$W/flux-dev-hb4.arena
if [ ! -f "$CIMG" ]; then
	[ "$(df -k --output=avail "$W" | tail -1)" -gt 30000000 ] || { log "removing the plain image for room"; rm -f "$IMG"; }
	log "convert --codec hb4"
	/usr/bin/time -f "convert hb4 %e s" "$A" convert --force "$ST" -o "$CIMG" --codec hb4 2>&1 | tee -a "$OUT/log.txt"
fi
"$A" inspect "$CIMG" | head -5 | tee -a "$OUT/log.txt"
cat "$CIMG" >/dev/null
for i in 1 2 3; do
	log "warm coded load $i"
	"$A" load "$CIMG" --backend cuda --json >"$OUT/load_hb4_warm_$i.json" 2>>"$OUT/log.txt"
	cat "$OUT/load_hb4_warm_$i.json" >>"$OUT/log.txt"
done
cat "$ST" >/dev/null
log "python safetensors load_file(device=cuda), warm"
python3 - "$ST" >"$OUT/python_warm.json" 2>>"$OUT/log.txt" <<'PY'
import json, sys, time
import torch
from safetensors.torch import load_file
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
times = []
for _ in range(2):
    t = time.perf_counter(); d = load_file(sys.argv[1], device="cuda"); torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
    n = sum(v.numel() * v.element_size() for v in d.values()); del d; torch.cuda.empty_cache()
print(json.dumps({"seconds": times, "bytes": n, "gbps": [n / s / 1e9 for s in times]}))
PY
cat "$OUT/python_warm.json" | tee -a "$OUT/log.txt"
cat "$ST" >/dev/null
for i in 1 2; do
	log "warm safetensors destination-first $i"
	"$A" load "$ST" --backend cuda --json >"$OUT/load_st_warm_$i.json" 2>>"$OUT/log.txt"
	cat "$OUT/load_st_warm_$i.json" >>"$OUT/log.txt"
done

# Cold cache.
sync
if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
	if [ -f "$IMG" ]; then
		log "cold load (caches dropped)"
		"$A" load "$IMG" --backend cuda --json >"$OUT/load_cold.json" 2>>"$OUT/log.txt"
		cat "$OUT/load_cold.json" >>"$OUT/log.txt"
		sync; echo 3 >/proc/sys/vm/drop_caches
	fi
	log "cold coded load (caches dropped)"
	"$A" load "$CIMG" --backend cuda --json >"$OUT/load_hb4_cold.json" 2>>"$OUT/log.txt"
	cat "$OUT/load_hb4_cold.json" >>"$OUT/log.txt"
else
	log "cannot drop caches: no cold run"
fi

# Differential: cuda and sim give the image's bytes.
SM=$W/flux-small.arena
"$A" synth --force --layout flux-dev --blocks 2 -o "$W/flux-small.safetensors" >/dev/null 2>&1
"$A" convert -q --force "$W/flux-small.safetensors" -o "$SM" --chunk-size 1M
run "$A" load "$SM" --backend cuda --check --no-probe
run "$A" load "$SM" --backend sim --vram-cap 8G --check --no-probe
run "$A" load "$SM" --backend cuda --check --no-probe --pin-budget 16M
SC=$W/flux-small-hb4.arena
"$A" convert -q --force "$W/flux-small.safetensors" -o "$SC" --chunk-size 1M --codec hb4
run "$A" load "$SC" --backend cuda --check --no-probe
run "$A" load "$SC" --backend sim --vram-cap 8G --check --no-probe
log "done"
