#!/bin/sh
# session 12, call 4: a budget that moves moves only what it must (near_set): the sampling run of call 1 under 2 GiB of pressure again, by bytes and learned
set -u
T0=$(date +%s)
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/python || exit 1
A=build/arena; W=/tmp/w; O=$W/o4; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
log synth; [ -f $W/f.arena ] || { [ -f $ST ] || $A synth --layout flux-dev -o $ST -q || exit 1; }
log convert
[ -f $W/f.arena ] || $A convert -q $ST -o $W/f.arena || exit 1
rm -f $ST
t() { n=$1; r=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt ${LATE:-150} ] && { log "skip $n"; return; }
 log "torch $n"; cat $W/f.arena >/dev/null; timeout 80 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); s=d["steps_s"]; print("setup", d.get("setup_s"), "steps", [round(x,4) for x in s])
print("  rest_trace", d.get("rest_trace"))
r=d.get("records",[]); print("  budget GiB", [round(x.get("budget",0)/2**30,2) for x in r])
print("  moves", [x.get("demotions",0) for x in r], [x.get("promotions",0) for x in r], "resident GiB", [round(x["resident_bytes"]/2**30,2) for x in r], "move_s", [round(x.get("move_s",0),3) for x in r])' $O/$n.jsonl; }
t sr8 arena-sample --steps 16 --vram 8G --reserve 1300M --piece-size 64M --no-learn --rest-extra 2G@3-5 --image $W/f.arena
t sr8l arena-sample --steps 16 --vram 8G --reserve 1300M --piece-size 64M --rest-extra 2G@3-5 --image $W/f.arena
log done
cd $O && tar czf $OUT/res.tgz .
