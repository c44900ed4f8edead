#!/bin/sh
# session 11, call 3: training with piece_size auto (whole blocks at 8 GiB, learned profile), keep_last default and 0, plain beside it, 4 GiB under the cap counting torch; LoRA gradients against the resident run
set -u
T0=$(date +%s)
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/python || exit 1
A=build/arena; W=/tmp/w; O=$W/o3; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
log synth; [ -f $W/f.arena ] && [ -f $W/fc.arena ] || { [ -f $ST ] || $A synth --layout flux-dev -o $ST -q || exit 1; }
log convert
[ -f $W/f.arena ] || $A convert -q $ST -o $W/f.arena || exit 1
[ -f $W/fc.arena ] || $A convert -q --codec hb4 $ST -o $W/fc.arena || exit 1
rm -f $ST
t() { n=$1; r=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt ${LATE:-440} ] && { log "skip $n"; return; }
 log "torch $n"; cat $W/f.arena $W/fc.arena >/dev/null; timeout 110 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); s=d["steps_s"]; print("setup", d.get("setup_s"), "open", d.get("open_s"), "steps", [round(x,4) for x in s])
print("  phases", d.get("phases_s"))
print("  gc", [round(h.get("gc_s",0),3) for h in d.get("host_steps",[])], "full %.3f s objects %d h2d %.2f GB/s" % (d["gc_full_s"], d["gc_objects"], d["h2d_bytes_per_s"]/1e9))
print("  rss", {k: round(v/2**30,2) for k,v in d.get("rss_after_setup",{}).items()}, {k: round(v/2**30,2) for k,v in d.get("rss_after_steps",{}).items()})
r=d.get("records",[]); print("  plans", [round(x.get("plan_s",0),2) for x in r], "moves", [x.get("demotions",0) for x in r], "moved GB", [round(x["moved_bytes"]/1e9,2) for x in r][-4:], "stall", [round(x["stall_s"],3) for x in r][-4:])' $O/$n.jsonl; }
TR="--steps 20 --host-timing --gc-freeze"
t tr arena-train $TR --image $W/f.arena --grads $W/grads-plain-train-all.pt
t tc8a arena-train $TR --vram 8G --reserve 3G --piece-size auto --image $W/fc.arena --grads $W/grads-arena-train-c8a.pt
t tp8a arena-train $TR --vram 8G --reserve 3G --piece-size auto --image $W/f.arena --grads $W/grads-arena-train-p8a.pt
t tc4a arena-train $TR --vram 4G --reserve 2560M --piece-size auto --image $W/fc.arena
t tc8b arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tc8a.jsonl $O/tp8a.jsonl $O/tc4a.jsonl $O/tc8b.jsonl
for n in tc8a tp8a tc4a tc8b; do python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); p=d["plan"]; print(sys.argv[1], "piece", p.get("piece_size"), "slots", p.get("slots"), "device peak %.2f GiB, steady %.2f GiB" % (d["device_peak_bytes"]/2**30, d["device_peak_steady_bytes"]/2**30), "budget GiB", [round(r.get("budget",0)/2**30,2) for r in d["records"]][:3], "over", [r.get("over_budget") for r in d["records"]][:3])' $O/$n.jsonl; done
python3 bench/torch_summary.py /dev/null $W
log done
cd $O && tar czf $OUT/res.tgz .
