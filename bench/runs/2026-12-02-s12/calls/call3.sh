#!/bin/sh
# session 12, call 3: offload_saved in stream order against none at 8, 4 and 3 GiB, side by side
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
t() { n=$1; r=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt ${LATE:-470} ] && { log "skip $n"; return; }
 log "torch $n"; cat $W/f.arena $W/fc.arena >/dev/null; timeout 110 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); s=d["steps_s"]; print("setup", d.get("setup_s"), "open", d.get("open_s"), "steps", [round(x,4) for x in s])
print("  phases", d.get("phases_s"))
print("  offload", d.get("offload"), "torch max reserved %.2f allocated %.2f GiB" % (d["torch_max_reserved"]/2**30, d.get("torch_max_allocated",0)/2**30), "device peak %.2f steady %.2f GiB" % (d["device_peak_bytes"]/2**30, d.get("device_peak_steady_bytes",0)/2**30))
print("  rss", {k: round(v/2**30,2) for k,v in d.get("rss_after_setup",{}).items()}, {k: round(v/2**30,2) for k,v in d.get("rss_after_steps",{}).items()})
print("  rest_trace", d.get("rest_trace"))
r=d.get("records",[]); print("  budget GiB", [round(x.get("budget",0)/2**30,2) for x in r], "over", [x.get("over_budget") for x in r][:4])
print("  moves", [x.get("demotions",0) for x in r], [x.get("promotions",0) for x in r], "moved GB", [round(x["moved_bytes"]/1e9,2) for x in r][-4:], "stall", [round(x["stall_s"],3) for x in r][-4:])' $O/$n.jsonl; }
python3 bench/runs/2026-12-02-s12/calls/offload_smoke.py || exit 1
TR="--steps 16 --host-timing --gc-freeze"
t tr arena-train $TR --image $W/f.arena --grads $W/grads-plain-train-all.pt
t tc8n arena-train $TR --vram 8G --reserve 1536M --piece-size auto --keep-last 0 --offload-saved on --image $W/fc.arena --grads $W/grads-arena-train-c8n.pt
t tc8b arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena
t tc4n arena-train $TR --vram 4G --reserve 1536M --piece-size auto --offload-saved on --image $W/fc.arena --grads $W/grads-arena-train-c4n.pt
t tc4b arena-train $TR --vram 4G --reserve 2560M --piece-size auto --image $W/fc.arena
t tc3n arena-train $TR --vram 3G --reserve 1536M --piece-size auto --offload-saved on --image $W/fc.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tc8n.jsonl $O/tc8b.jsonl $O/tc4n.jsonl $O/tc4b.jsonl $O/tc3n.jsonl
python3 bench/torch_summary.py /dev/null $W
log done
cd $O && tar czf $OUT/res.tgz .
