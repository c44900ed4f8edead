#!/bin/sh
# session 9, call 5: the adapter at 8G, plain and coded, the profile asked again after the first look
set -u
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/python || exit 1
A=build/arena; W=/tmp/w; O=$W/o6; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
log synth; [ -f $ST ] || $A synth --layout flux-dev -o $ST -q || exit 1
log convert
[ -f $W/fc.arena ] || $A convert -q --codec hb4 $ST -o $W/fc.arena || exit 1
cat $W/fc.arena >/dev/null
t() { n=$1; r=$2; shift 2; log "torch $n"; timeout 240 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); print("first step", d.get("first_step_s"), "setup", d.get("setup_s"), "steps", [round(x,4) for x in d["steps_s"]])
print("resident by step", [r["resident_bytes"] for r in d["records"]], "learned", [r.get("demotions",0) for r in d["records"]])' $O/$n.jsonl; }
S="--vram 8G --reserve 1300M --piece-size 128M --steps 14"
t coded arena-sample $S --image $W/fc.arena --trace $O/trace-coded.json

t coded2 arena-sample $S --image $W/fc.arena
log done
cd $O && tar czf $OUT/res.tgz .
