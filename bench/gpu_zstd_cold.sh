#!/bin/sh
# gpu_zstd_cold.sh - cold loads of a zstd image, builds or settings
# alternated so that the disk's drift is shared: each load after
# drop_caches, its --json `limits` holding the O_DIRECT rate of the same file
# read right after it (the limit: weights/s over that rate is the ratio).
# usage: OUT=dir ROUNDS=3 sh bench/gpu_zstd_cold.sh IMAGE 'label=command prefix' ...
#   e.g. 'new=build/arena' 'old=build/arena-old' 'p64=env ARENA_LOAD_PIECE=64M build/arena'
# Needs root (drop_caches) and a CUDA device.
set -u
IMG=$1
shift
OUT=${OUT:-.}
mkdir -p "$OUT"
for r in $(seq 1 "${ROUNDS:-3}"); do
	for spec in "$@"; do
		label=${spec%%=*}
		cmd=${spec#*=}
		sync
		echo 3 >/proc/sys/vm/drop_caches || exit 1
		# shellcheck disable=SC2086
		$cmd load "$IMG" --backend "${BACKEND:-cuda}" --json >"$OUT/cold_${label}_$r.json" 2>"$OUT/cold_${label}_$r.err"
		python3 - "$OUT/cold_${label}_$r.json" "$label" "$r" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
lim = d["limits"]
dec = d.get("decoded") or {}
print("%-6s round %s: %.3f GB/s of weights in %.2f s, file read at %.3f GB/s; O_DIRECT %.3f GB/s -> ratio %.3f; decode %s"
      % (sys.argv[2], sys.argv[3], d["gbps"], d["seconds"], d["file_bytes"] / d["seconds"] / 1e9, lim["read_gbps"],
         d["gbps"] / lim["read_gbps"], json.dumps(dec)))
PY
	done
done
