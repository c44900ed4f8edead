#!/bin/sh
# gpu_disk.sh - the disk tier from a cold disk on a machine with an NVIDIA
# GPU: flux-dev (BLOCKS: fewer blocks) under an 8 GiB cap (CAP) with a host
# budget of a quarter of the image (HOST_BUDGET), caches dropped before each
# run, so that every streamed block past the budget comes from the disk each
# step (what the page cache does not hold is read with O_DIRECT and stays
# out of it).
#
# Measures: `arena bench stream --vram-cap CAP --host-budget HB` (STEPS,
#   default 4), for each of RUNS: "ra" (the stager reads ahead: the default
#   build) and/or "sync" (ARENA_DISK_READAHEAD=0: reads on the caller's
#   thread), each from a cold cache; its peak RSS (/usr/bin/time -v).
#   --device-free 24G holds all of the device but 24 GiB, so bench stream
#   times the compute with its GEMMs instead of loading the whole model for
#   an all-resident run. PIECE: --piece-size, FLOPS: --flops, CODEC=hb4: an
#   hb4 image (its tier reads and copies coded bytes; the limit is then in
#   coded bytes). KEEP=1 keeps the synthesized checkpoint. BACKEND=sim: a
#   dry run on the simulator (no GPU; the compute is modelled).
# Limit, same run: the disk's O_DIRECT read rate of the same file, read
#   right before by 8 dd readers of 4 MiB pieces (as the tier reads; 4 GiB
#   in all); each step against max(compute, disk bytes / that rate, moved
#   bytes / the host-to-device rate); peak RSS against the host budget +
#   512 MiB.
# Prints: the disk rate, then a line a step (time, disk bytes and their time
#   at the O_DIRECT rate, copies, compute, x the bound, disk wait) and the
#   peak RSS a run (also in OUT/disk_summary.txt; JSON in OUT/disk_RUN.json).
# Run: A=build/arena OUT=dir sh bench/gpu_disk.sh WORKDIR
#   as root (drop_caches) with a CUDA build of arena; ~50 GB free in WORKDIR.
set -u
A=${A:-build/arena}
OUT=${OUT:-.}
W=$1
mkdir -p "$W" "$OUT"
# cuBLAS is loaded at run time: CUDA's lib64, else the pip wheel PyTorch uses.
CB=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${CB:+:$CB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
IMG=$W/f${BLOCKS:+-$BLOCKS}${CODEC:+-$CODEC}.arena
[ -f "$IMG" ] || {
	"$A" synth --force --layout flux-dev ${BLOCKS:+--blocks "$BLOCKS"} -o "$W/f.safetensors" >/dev/null || exit 1
	"$A" convert -q --force ${CODEC:+--codec "$CODEC"} "$W/f.safetensors" -o "$IMG" || exit 1
	[ -n "${KEEP:-}" ] || rm -f "$W/f.safetensors"
}
SIZE=$(stat -c %s "$IMG")
HB=${HOST_BUDGET:-$((SIZE / 4))}
cold() { sync && echo 3 >/proc/sys/vm/drop_caches; }
cold || echo "gpu_disk: cannot drop caches (not root?): the figures are not cold" >&2
# The disk's O_DIRECT rate as the tier reads: 8 readers (the slab reader's
# threads) of 4 MiB pieces (its chunks), 512 MiB each, from the middle of
# the image on: 4 GiB in all (less when the image is smaller).
EACH=$((SIZE / 16 / 4194304))
[ "$EACH" -gt 128 ] && EACH=128
T0=$(date +%s.%N)
for i in 0 1 2 3 4 5 6 7; do
	dd if="$IMG" of=/dev/null bs=4M count="$EACH" skip=$((SIZE / 2 / 4194304 + i * EACH)) iflag=direct 2>>"$OUT/disk_dd.txt" &
done
wait
T1=$(date +%s.%N)
RATE=$(python3 -c 'import sys; print(8 * int(sys.argv[1]) * 4194304 / (float(sys.argv[3]) - float(sys.argv[2])))' "$EACH" "$T0" "$T1")
echo "disk: O_DIRECT read $RATE B/s; image $SIZE bytes, host budget $HB" | tee "$OUT/disk_summary.txt"
FREE="--device-free 24G"
[ "${BACKEND:-cuda}" = sim ] && FREE=   # (a dry run here: sim)
for r in ${RUNS:-ra}; do
	cold
	env=
	[ "$r" = sync ] && env="ARENA_DISK_READAHEAD=0"
	# shellcheck disable=SC2086
	env $env /usr/bin/time -v "$A" bench stream "$IMG" --backend "${BACKEND:-cuda}" --vram-cap "${CAP:-8G}" $FREE \
		--host-budget "$HB" --steps "${STEPS:-4}" ${PIECE:+--piece-size "$PIECE"} ${FLOPS:+--flops "$FLOPS"} --json >"$OUT/disk_$r${CODEC:+-$CODEC}.json" 2>"$OUT/disk_$r${CODEC:+-$CODEC}.err"
	python3 - "$OUT/disk_$r${CODEC:+-$CODEC}.json" "$OUT/disk_$r${CODEC:+-$CODEC}.err" "$RATE" "$r${CODEC:+-$CODEC}" "$HB" <<'PY' | tee -a "$OUT/disk_summary.txt"
import json, re, sys
d = json.load(open(sys.argv[1]))
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(sys.argv[2]).read())
rate, hb = float(sys.argv[3]), int(sys.argv[5])
h2d = d["h2d_bytes_per_s"]
for s in d["steps"]:
    disk = s["disk_bytes"] / rate
    copy = s["moved_bytes"] / h2d
    bound = max(s["compute_s"], disk, copy)
    print("%-4s step %d: %.3f s  disk %.2f GB (%.3f s at O_DIRECT rate)  copies %.2f GB (%.3f s)  compute %.3f s"
          "  -> %.3f x bound; disk wait %.3f s" % (sys.argv[4], s["step"], s["time_s"], s["disk_bytes"] / 1e9, disk,
          s["moved_bytes"] / 1e9, copy, s["compute_s"], s["time_s"] / bound, s.get("disk_wait_s", 0)))
if rss:
    print("%-4s peak RSS %.2f GiB; host budget + 512 MiB = %.2f GiB" % (sys.argv[4], int(rss.group(1)) / 2**20,
          (hb + (512 << 20)) / 2**30))
PY
done
