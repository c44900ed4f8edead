#!/bin/sh
# session 10, call 2: a look plans once; ring depth and piece size for the coded 8G sample step; training 8G/4G, 20 steps
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
t() { n=$1; r=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt ${LATE:-520} ] && { log "skip $n"; return; }
 log "torch $n"; cat $W/f.arena $W/fc.arena >/dev/null; timeout 150 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); s=d["steps_s"]; print("first step", d.get("first_step_s"), "setup", d.get("setup_s"), "steps", [round(x,4) for x in s])
l=sorted(s[len(s)//2:]); print("  median of the second half %.4f, min %.4f" % (l[len(l)//2], l[0]))
print("  plans", [round(r.get("plan_s",0),2) for r in d["records"]], "moves", [r.get("demotions",0) for r in d["records"]], "moved GB", [round(r["moved_bytes"]/1e9,2) for r in d["records"]][-4:])' $O/$n.jsonl; }
S="--vram 8G --reserve 1300M --steps 14 --host-timing"
t c-d3 arena-sample $S --piece-size 128M --depth 3 --image $W/fc.arena
t c-d4 arena-sample $S --piece-size 128M --depth 4 --image $W/fc.arena
t c-p64 arena-sample $S --piece-size 64M --image $W/fc.arena
t p-d3 arena-sample $S --piece-size 128M --depth 3 --image $W/f.arena
TR="--vram 8G --reserve 3G --piece-size 128M --keep-last 0 --steps 20 --host-timing"
t tc8 arena-train $TR --image $W/fc.arena
t tp8 arena-train $TR --image $W/f.arena
TR="--vram 4G --reserve 2560M --piece-size 128M --keep-last 0 --steps 20 --host-timing"
LATE=480 t tc4 arena-train $TR --image $W/fc.arena
log done
cd $O && tar czf $OUT/res.tgz .
