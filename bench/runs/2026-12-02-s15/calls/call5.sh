#!/bin/sh
# session 15, call 5: the stager reading into the slot whose copies end first (db5de83) against the
# build before it (gpu-libs/arena-old, 12e9fa6), alternating, `arena bench stream` as call 3 (page
# cache warm), host budgets 10G and 12G. Results straight into $OUT.
mkdir -p /tmp/w; O=$OUT IMAGES=plain LATE=200 . bench/gpu_call.sh
r() {
	n=$1 bin=$2
	shift 2
	[ $(($(date +%s) - T0)) -gt 150 ] && { log "skip $n"; return; }
	log "$n"
	cat $W/f.arena >/dev/null
	$bin bench stream $W/f.arena --backend cuda --vram-cap 8G --reserve 1400M --piece-size auto --steps 8 --json "$@" >"$O/$n.json" 2>"$O/$n.err" || tail -3 "$O/$n.err"
	python3 - "$O/$n.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["steps"][2:]
med = lambda v: sorted(v)[len(v) // 2]
print("  step %.4f bound %.4f eff %.3f disk %.2f GB wait %.3f" % (med([x["time_s"] for x in s]), med([x["bound_s"] for x in s]),
      med([x["efficiency"] for x in s]), med([x["disk_bytes"] for x in s]) / 1e9, med([x["disk_wait_s"] for x in s])))
PY
}
r h10new build/arena --host-budget 10G
r h10old gpu-libs/arena-old --host-budget 10G
r h12new build/arena --host-budget 12G
r h12old gpu-libs/arena-old --host-budget 12G
log done
