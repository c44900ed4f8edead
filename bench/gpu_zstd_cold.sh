#!/bin/sh
# gpu_zstd_cold.sh - cold loads of one image by two or more builds or
# settings, alternated so that the disk's drift falls on all of them alike.
#
# Measures: `CMD load IMAGE --backend cuda --json` after drop_caches, for
#   each 'label=command prefix' in turn, ROUNDS rounds (default 3).
# Limit, same run: the O_DIRECT read rate of the same file with the same
#   threads, read right after each load (its --json `limits`); the ratio
#   is weights per second over that rate (a coded image can pass 1).
# Prints: one line a load: GB/s of weights, seconds, the rate the file was
#   read at, the O_DIRECT rate, the ratio, the decode figures; the JSON of
#   each load in OUT/cold_LABEL_ROUND.json.
# Run: OUT=dir ROUNDS=3 sh bench/gpu_zstd_cold.sh IMAGE 'label=command prefix' ...
#   e.g. 'new=build/arena' 'old=build-old/arena'
#   'p64=env ARENA_LOAD_PIECE=64M build/arena'; as root (drop_caches) on a
#   machine with an NVIDIA GPU (BACKEND=sim: no GPU).
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
