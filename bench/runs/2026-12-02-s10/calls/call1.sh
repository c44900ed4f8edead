#!/bin/sh
# session 10, call 1: the adapter at 8G coded after demoted blocks keep coded host copies; plain beside it; training 8G plain/coded with host timing
set -u
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
t() { n=$1; r=$2; shift 2; log "torch $n"; cat $W/f.arena $W/fc.arena >/dev/null; timeout 240 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read()); print("first step", d.get("first_step_s"), "setup", d.get("setup_s"), "steps", [round(x,4) for x in d["steps_s"]])
for r in d["records"]: print("  moved %.2f GB stall %.4f s plan %.3f move %.3f dem %d pro %d res %.2f GiB" % (r["moved_bytes"]/1e9, r.get("stall_s",0), r.get("plan_s",0), r.get("move_s",0), r.get("demotions",0), r.get("promotions",0), r["resident_bytes"]/2**30))' $O/$n.jsonl; }
S="--vram 8G --reserve 1300M --piece-size 128M --steps 14 --host-timing"
t coded arena-sample $S --image $W/fc.arena --trace $O/trace-coded.json
t plain arena-sample $S --image $W/f.arena
t coded2 arena-sample $S --image $W/fc.arena
TR="--vram 8G --reserve 3G --piece-size 128M --keep-last 0 --steps 10 --host-timing"
t train-plain arena-train $TR --image $W/f.arena --trace $O/trace-train-plain.json
t train-coded arena-train $TR --image $W/fc.arena --trace $O/trace-train-coded.json
log done
cd $O && gzip -f *.json; tar czf $OUT/res.tgz .
