#!/bin/sh
# session 11, call 2: the host memory a first process pays for (THP), training without the learned profile's moves, whole blocks, the cap counting torch; the sampling RSS baseline
set -u
T0=$(date +%s)
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/python || exit 1
A=build/arena; W=/tmp/w; O=$W/o2; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
log synth; [ -f $W/f.arena ] && [ -f $W/fc.arena ] || { [ -f $ST ] || $A synth --layout flux-dev -o $ST -q || exit 1; }
log convert
[ -f $W/f.arena ] || $A convert -q $ST -o $W/f.arena || exit 1
[ -f $W/fc.arena ] || $A convert -q --codec hb4 $ST -o $W/fc.arena || exit 1
rm -f $ST
t() { n=$1; r=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt ${LATE:-470} ] && { log "skip $n"; return; }
 log "torch $n"; cat $W/f.arena $W/fc.arena >/dev/null; timeout 110 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); s=d["steps_s"]; print("setup", d.get("setup_s"), "open", d.get("open_s"), "steps", [round(x,4) for x in s])
print("  phases", d.get("phases_s"))
print("  gc", [round(h.get("gc_s",0),3) for h in d.get("host_steps",[])], "full %.3f s objects %d h2d %.2f GB/s" % (d["gc_full_s"], d["gc_objects"], d["h2d_bytes_per_s"]/1e9))
print("  rss", {k: round(v/2**30,2) for k,v in d.get("rss_after_setup",{}).items()}, {k: round(v/2**30,2) for k,v in d.get("rss_after_steps",{}).items()})
r=d.get("records",[]); print("  plans", [round(x.get("plan_s",0),2) for x in r], "moves", [x.get("demotions",0) for x in r], "moved GB", [round(x["moved_bytes"]/1e9,2) for x in r][-4:], "stall", [round(x["stall_s"],3) for x in r][-4:])' $O/$n.jsonl; }
cat $W/f.arena $W/fc.arena >/dev/null
for i in 1 2; do log "probe $i"; python3 bench/host_probe.py 15 | tee -a $O/probe.jsonl; done
log "probe no hugepage"; python3 bench/host_probe.py 15 --no-hugepage | tee -a $O/probe.jsonl
TR="--steps 16 --host-timing --gc-freeze"
t sr arena-sample --steps 8 --host-timing --image $W/f.arena
t tr arena-train $TR --image $W/f.arena
t tc8-nl arena-train $TR --vram 8G --reserve 3G --piece-size 128M --keep-last 0 --no-learn --image $W/fc.arena
t tc8-w arena-train $TR --vram 8G --reserve 3G --keep-last 0 --no-learn --image $W/fc.arena
t tc4-cap arena-train $TR --vram 4G --reserve 2560M --piece-size 128M --keep-last 0 --no-learn --image $W/fc.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tc8-nl.jsonl $O/tc8-w.jsonl $O/tc4-cap.jsonl
for n in tc8-nl tc8-w tc4-cap; do python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); print(sys.argv[1], "device peak %.2f GiB, steady %.2f GiB" % (d["device_peak_bytes"]/2**30, d["device_peak_steady_bytes"]/2**30), "budget GiB", [round(r.get("budget",0)/2**30,2) for r in d["records"]][:4], "over", [r.get("over_budget") for r in d["records"]][:4])' $O/$n.jsonl; done
log done
cd $O && tar czf $OUT/res.tgz .
