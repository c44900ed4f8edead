#!/bin/sh
# gpu_zstd.sh - the three storage forms (plain, hb4, zstd) of flux-dev side
# by side on a machine with an NVIDIA GPU.
#
# Measures: convert to each form (fsync included, warm source) and the
#   image's size; 3 warm loads of each and a cold one (caches dropped), then
#   a second cold load of zstd and hb4; the codecs on one core
#   (bench/codec_bench, 1 GiB of the image's data); cuda against sim bytes
#   of a small zstd image (`--check`).
# Limit, same run: `cp` + `sync` of the checkpoint (twice) for convert; each
#   load's --json `limits` (the pinned host-to-device rate, and the read rate
#   of the same file: buffered when warm, O_DIRECT right after a cold load).
# Prints: a log (OUT/log.txt) and a summary line a load: GB/s of weights,
#   seconds, the read limit, decode CPU seconds; JSON files under OUT.
# Run: OUT=dir A=build/arena B=build sh bench/gpu_zstd.sh [WORKDIR]
#   on a machine with an NVIDIA GPU and a CUDA build of arena; `make
#   bench-cpu` first (B: its build folder), ~60 GB free in WORKDIR (the
#   plain image is removed before the coded ones are made), root for
#   drop_caches (the cold loads are skipped without it).
set -u
A=${A:-build/arena}
B=${B:-build}
OUT=${OUT:-/tmp/arena-zstd-out}
W=${1:-/tmp/arena-bench}
mkdir -p "$W" "$OUT"
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
run() { log "$*"; "$@" 2>&1 | tee -a "$OUT/log.txt"; }
cold() { sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; }
log "$(date -u) $(nproc) cores; $(free -g | awk '/Mem/{print $2" GiB RAM"}'); $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null)"
df -h "$W" | tee -a "$OUT/log.txt"
ST=$W/flux-dev.safetensors
[ -f "$ST" ] || run "$A" synth --layout flux-dev -o "$ST"

log "cp + sync of the checkpoint, twice"
cat "$ST" >/dev/null
for i in 1 2; do
	rm -f "$W/copy.st"
	sync
	/usr/bin/time -f "cp+sync %e s" sh -c "cp '$ST' '$W/copy.st' && sync" 2>&1 | tee -a "$OUT/log.txt"
done
rm -f "$W/copy.st"

# convert FORM EXTRA...: timed (fsync included), warm source.
convert() {
	f=$1
	shift
	rm -f "$W/$f.arena"
	cat "$ST" >/dev/null
	sync
	/usr/bin/time -f "convert $f %e s (user %U s, sys %S s)" "$A" convert --force "$ST" -o "$W/$f.arena" "$@" 2>&1 |
		tee -a "$OUT/log.txt"
	ls -l "$W/$f.arena" | tee -a "$OUT/log.txt"
}

# loads FORM: 3 warm, then 1 cold.
loads() {
	cat "$W/$1.arena" >/dev/null
	for i in 1 2 3; do
		log "warm load $1 $i"
		"$A" load "$W/$1.arena" --backend cuda --json >"$OUT/load_$1_warm_$i.json" 2>>"$OUT/log.txt"
	done
	if cold; then
		log "cold load $1"
		"$A" load "$W/$1.arena" --backend cuda --json >"$OUT/load_$1_cold.json" 2>>"$OUT/log.txt"
	else
		log "cannot drop caches: no cold load"
	fi
}

convert plain
loads plain
rm -f "$W/plain.arena"
convert hb4 --codec hb4
convert zstd --codec zstd
"$A" inspect "$W/zstd.arena" | sed -n 1,5p | tee -a "$OUT/log.txt"
loads hb4
loads zstd
log "second cold loads, zstd then hb4"
for f in zstd hb4; do
	cold && "$A" load "$W/$f.arena" --backend cuda --json >"$OUT/load_${f}_cold_2.json" 2>>"$OUT/log.txt"
done

log "the codecs, one core (1 GiB of the image's data)"
"$B/bench/codec_bench" "$W/zstd.arena" --levels 1,3 --max-bytes 1024 | tee "$OUT/codec_bench.json"

# Differential: cuda and sim give the image's bytes.
"$A" synth --force --layout flux-dev --blocks 2 -o "$W/flux-small.safetensors" >/dev/null 2>&1
"$A" convert -q --force "$W/flux-small.safetensors" -o "$W/flux-small-zstd.arena" --chunk-size 1M --codec zstd
run "$A" load "$W/flux-small-zstd.arena" --backend cuda --check --no-probe
run "$A" load "$W/flux-small-zstd.arena" --backend sim --vram-cap 8G --check --no-probe
run "$A" load "$W/flux-small-zstd.arena" --backend cuda --check --no-probe --pin-budget 16M
log "summary"
for j in "$OUT"/load_*.json; do
	python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
lim = d.get("limits") or {}
dec = d.get("decoded") or {}
print("%-28s %7.2f GB/s of weights  %6.3f s  read %s %.2f GB/s  decode %.1f CPU s" % (sys.argv[1].split("/")[-1],
      d["gbps"], d["seconds"], lim.get("read_mode"), lim.get("read_gbps", 0), dec.get("cpu_seconds", 0)))' "$j" |
		tee -a "$OUT/log.txt"
done
log "done"
