#!/bin/sh
# session 11, call 1: training phases (forward / backward / optimizer) resident and streamed at 8 and 4 GiB, with session 10's look on a thread and per-block backward costs; sampling's host RSS by kind
set -u
T0=$(date +%s)
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/python || exit 1
A=build/arena; W=/tmp/w; O=$W/o1; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
log synth; [ -f $W/f.arena ] && [ -f $W/fc.arena ] || { [ -f $ST ] || $A synth --layout flux-dev -o $ST -q || exit 1; }
log convert
[ -f $W/f.arena ] || $A convert -q $ST -o $W/f.arena || exit 1
[ -f $W/fc.arena ] || $A convert -q --codec hb4 $ST -o $W/fc.arena || exit 1
rm -f $ST
t() { n=$1; r=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt ${LATE:-430} ] && { log "skip $n"; return; }
 log "torch $n"; cat $W/f.arena $W/fc.arena >/dev/null; timeout 110 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); s=d["steps_s"]; print("setup", d.get("setup_s"), "open", d.get("open_s"), "steps", [round(x,4) for x in s])
print("  phases", d.get("phases_s"))
print("  gc", [round(h.get("gc_s",0),3) for h in d.get("host_steps",[])], "full %.3f s objects %d h2d %.2f GB/s" % (d["gc_full_s"], d["gc_objects"], d["h2d_bytes_per_s"]/1e9))
print("  rss", {k: round(v/2**30,2) for k,v in d.get("rss_after_setup",{}).items()}, {k: round(v/2**30,2) for k,v in d.get("rss_after_steps",{}).items()})
r=d.get("records",[]); print("  plans", [round(x.get("plan_s",0),2) for x in r], "moves", [x.get("demotions",0) for x in r], "moved GB", [round(x["moved_bytes"]/1e9,2) for x in r][-4:], "stall", [round(x["stall_s"],3) for x in r][-4:])' $O/$n.jsonl; }
TR="--steps 16 --host-timing --gc-freeze"
t tr arena-train $TR --image $W/f.arena --grads $W/grads-plain-train-all.pt
t tc8 arena-train $TR --vram 8G --reserve 3G --piece-size 128M --keep-last 0 --image $W/fc.arena --grads $W/grads-arena-train-c8.pt
t tp8 arena-train $TR --vram 8G --reserve 3G --piece-size 128M --keep-last 0 --image $W/f.arena --grads $W/grads-arena-train-p8.pt
t tc4 arena-train $TR --vram 4G --reserve 2560M --piece-size 128M --keep-last 0 --image $W/fc.arena
t p64 arena-sample --vram 8G --reserve 1300M --steps 12 --host-timing --piece-size 64M --image $W/f.arena
python3 bench/torch_summary.py /dev/null $W
log done
cd $O && tar czf $OUT/res.tgz .
