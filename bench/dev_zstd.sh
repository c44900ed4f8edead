#!/bin/sh
# dev_zstd.sh - the storage forms side by side on a machine without a GPU:
# ratios only, measured in one run (the loads run on the simulator).
#
# Measures: the codecs on the image's own data, one thread
#   (bench/codec_bench: levels 1..5 on 512 MiB, 9 and 19 on 64 MiB); convert
#   of flux-dev --blocks 2 to plain, hb4 and zstd at levels 1..5, REPS
#   rounds alternated (fsync included); warm and cold loads of each form
#   on sim (`arena load --backend sim --json`).
# Limit, same run: `cp` + `sync` of the checkpoint in the same rounds (for
#   convert); each cold load's --json `limits` (the O_DIRECT rate of the
#   same file).
# Prints: a log (OUT/log.txt) with the convert times (OUT/convert.txt:
#   round, form, wall, user, sys) and sizes; codec_bench's JSON; a JSON file
#   a load under OUT.
# Run: OUT=dir A=build/arena B=build sh bench/dev_zstd.sh [WORKDIR]
#   on any Linux machine; `make bench-cpu` first (B: its build folder),
#   ~8 GB free in WORKDIR, root for the cold loads (drop_caches; skipped
#   otherwise).
set -u
A=${A:-build/arena}
B=${B:-build}
OUT=${OUT:-/tmp/arena-dev-zstd}
W=${1:-/tmp/arena-dev-zstd-work}
REPS=${REPS:-3}
mkdir -p "$W" "$OUT"
log() { echo "== $*" | tee -a "$OUT/log.txt"; }
log "$(date -u) $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
ST=$W/flux2.safetensors
[ -f "$ST" ] || "$A" synth --layout flux-dev --blocks 2 --seed 7 -o "$ST" | tee -a "$OUT/log.txt"
"$A" convert -q --force "$ST" -o "$W/p.arena"

log "codecs on the image's data, one thread (levels 1..5: 512 MiB; 9 and 19: 64 MiB)"
"$B/bench/codec_bench" "$W/p.arena" --levels 1,2,3,4,5 --max-bytes 512 --repeat 3 | tee "$OUT/codec_bench.json"
"$B/bench/codec_bench" "$W/p.arena" --levels 1,9,19 --max-bytes 64 --repeat 1 | tee "$OUT/codec_bench_high.json"

log "convert (fsync included) and cp + sync, $REPS rounds, alternated"
cat "$ST" >/dev/null
for r in $(seq "$REPS"); do
	for c in none hb4 zstd:1 zstd:2 zstd:3 zstd:4 zstd:5; do
		codec=${c%%:*}
		lv=
		[ "$codec" = zstd ] && lv="--zstd-level ${c#*:}"
		rm -f "$W/o.arena"
		sync
		# shellcheck disable=SC2086
		/usr/bin/time -f "$r $c %e %U %S" -a -o "$OUT/convert.txt" "$A" convert -q --force "$ST" -o "$W/o.arena" --codec "$codec" $lv
		echo "$r $c size $(stat -c %s "$W/o.arena")" >>"$OUT/convert_size.txt"
	done
	rm -f "$W/c.st"
	sync
	/usr/bin/time -f "$r cp %e %U %S" -a -o "$OUT/convert.txt" sh -c "cp '$ST' '$W/c.st' && sync"
	rm -f "$W/c.st"
done
cat "$OUT/convert.txt" "$OUT/convert_size.txt" >>"$OUT/log.txt"

"$A" convert -q --force "$ST" -o "$W/h.arena" --codec hb4
"$A" convert -q --force "$ST" -o "$W/z.arena" --codec zstd
rm -f "$W/o.arena"
log "loads on sim, warm then cold"
for r in $(seq "$REPS"); do
	for f in p h z; do
		cat "$W/$f.arena" >/dev/null
		"$A" load "$W/$f.arena" --backend sim --json >"$OUT/load_warm_${f}_$r.json" 2>>"$OUT/log.txt"
		if sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
			"$A" load "$W/$f.arena" --backend sim --json >"$OUT/load_cold_${f}_$r.json" 2>>"$OUT/log.txt"
		fi
	done
done
log "done $(date -u); load $(cut -d' ' -f1-3 /proc/loadavg)"
