#!/bin/sh
# session 11, call 4: the cap counting torch's allocator as the adapter reports it (4 GiB, reserve 2560M), and the 8 GiB whole-block training step again
set -u
T0=$(date +%s)
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/python || exit 1
A=build/arena; W=/tmp/w; O=$W/o4; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
log synth; [ -f $W/f.arena ] && [ -f $W/fc.arena ] || { [ -f $ST ] || $A synth --layout flux-dev -o $ST -q || exit 1; }
log convert
[ -f $W/f.arena ] || $A convert -q $ST -o $W/f.arena || exit 1
[ -f $W/fc.arena ] || $A convert -q --codec hb4 $ST -o $W/fc.arena || exit 1
rm -f $ST
t() { n=$1; r=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt ${LATE:-330} ] && { log "skip $n"; return; }
 log "torch $n"; cat $W/f.arena $W/fc.arena >/dev/null; timeout 110 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); s=d["steps_s"]; print("setup", d.get("setup_s"), "open", d.get("open_s"), "steps", [round(x,4) for x in s])
print("  phases", d.get("phases_s"))
print("  gc", [round(h.get("gc_s",0),3) for h in d.get("host_steps",[])], "full %.3f s objects %d h2d %.2f GB/s" % (d["gc_full_s"], d["gc_objects"], d["h2d_bytes_per_s"]/1e9))
print("  rss", {k: round(v/2**30,2) for k,v in d.get("rss_after_setup",{}).items()}, {k: round(v/2**30,2) for k,v in d.get("rss_after_steps",{}).items()})
r=d.get("records",[]); print("  plans", [round(x.get("plan_s",0),2) for x in r], "moves", [x.get("demotions",0) for x in r], "moved GB", [round(x["moved_bytes"]/1e9,2) for x in r][-4:], "stall", [round(x["stall_s"],3) for x in r][-4:])' $O/$n.jsonl; }
TR="--steps 16 --host-timing --gc-freeze"
t tr arena-train $TR --image $W/f.arena
t tc4r arena-train $TR --vram 4G --reserve 2560M --piece-size auto --image $W/fc.arena
t tc8b arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tc4r.jsonl $O/tc8b.jsonl
for n in tc4r tc8b; do python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); p=d["plan"]; print(sys.argv[1], "piece", p.get("piece_size"), "slots", p.get("slots"), "device peak %.2f GiB, steady %.2f GiB" % (d["device_peak_bytes"]/2**30, d["device_peak_steady_bytes"]/2**30), "torch reserved max %.2f GiB" % (d["torch_max_reserved"]/2**30), "budget GiB", [round(r.get("budget",0)/2**30,3) for r in d["records"]][:3], "over", [r.get("over_budget") for r in d["records"]][:3])' $O/$n.jsonl; done
log done
cd $O && tar czf $OUT/res.tgz .
