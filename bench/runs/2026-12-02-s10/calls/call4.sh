#!/bin/sh
# session 10, call 4: where the train step's collector pauses come from (objects, a full collection, frozen objects), the H2D rate in the same run
set -u
T0=$(date +%s)
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/python || exit 1
A=build/arena; W=/tmp/w; O=$W/o4; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
log synth; [ -f $W/fc.arena ] || { [ -f $ST ] || $A synth --layout flux-dev -o $ST -q || exit 1; }
log convert
[ -f $W/fc.arena ] || $A convert -q --codec hb4 $ST -o $W/fc.arena || exit 1
rm -f $ST
t() { n=$1; r=$2; shift 2; [ $(( $(date +%s) - T0 )) -gt ${LATE:-300} ] && { log "skip $n"; return; }
 log "torch $n"; cat $W/fc.arena >/dev/null; timeout 150 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); s=d["steps_s"]; print("steps", [round(x,4) for x in s])
print("  gc", [round(h.get("gc_s",0),3) for h in d.get("host_steps",[])], "full %.3f s objects %d h2d %.2f GB/s" % (d["gc_full_s"], d["gc_objects"], d["h2d_bytes_per_s"]/1e9))
print("  plans", [round(r.get("plan_s",0),2) for r in d["records"]], "moves", [r.get("demotions",0) for r in d["records"]])' $O/$n.jsonl; }
TR="--vram 8G --reserve 3G --piece-size 128M --keep-last 0 --steps 16 --host-timing"
t tc8 arena-train $TR --image $W/fc.arena
t tc8-freeze arena-train $TR --image $W/fc.arena --gc-freeze
log done
cd $O && tar czf $OUT/res.tgz .
