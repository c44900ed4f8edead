#!/bin/sh
# session 15, call 3: what a disk tier spread through the schedule costs as it grows
# (`arena bench stream`, flux-dev plain, 8 GiB cap, 64 MiB pieces, sampling, no torch): host
# budgets from none to 10G, then the staging (ARENA_DISK_STAGING) and the reader threads
# (ARENA_REREAD_THREADS) varied at 14G; one 14G run traced. The image read before each run (page
# cache warm: call 2 forgot it, and its tier was read from the disk with O_DIRECT, ~1.7 GB/s).
O=/tmp/w/o3 IMAGES=plain LATE=540 . bench/gpu_call.sh
B="build/arena bench stream $W/f.arena --backend cuda --vram-cap 8G --reserve 1400M --piece-size auto --steps 10 --json"
r() {
	n=$1
	shift
	[ $(($(date +%s) - T0)) -gt 520 ] && { log "skip $n"; return; }
	log "$n $*"
	cat $W/f.arena >/dev/null
	env "$@" >"$O/$n.json" 2>"$O/$n.err" || tail -3 "$O/$n.err"
	python3 - "$O/$n.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["steps"][2:]
med = lambda v: sorted(v)[len(v) // 2]
print("  step %.4f bound %.4f eff %.3f streamed %.2f GB disk %.2f GB wait %.3f stall %.3f rate %.1f GB/s" % (
    med([x["time_s"] for x in s]), med([x["bound_s"] for x in s]), med([x["efficiency"] for x in s]),
    med([x["streamed_bytes"] for x in s]) / 1e9, med([x["disk_bytes"] for x in s]) / 1e9,
    med([x["disk_wait_s"] for x in s]), med([x["stall_s"] for x in s]), d["h2d_bytes_per_s"] / 1e9))
PY
}
r h155 $B --host-budget 15872M
r h14 $B --host-budget 14G
r h12 $B --host-budget 12G
r h10 $B --host-budget 10G
r h14t1 ARENA_REREAD_THREADS=1 $B --host-budget 14G
r h14tr $B --host-budget 14G --steps 6 --trace $O/h14.trace.json
log done
cd $O && tar czf $OUT/res.tgz .
