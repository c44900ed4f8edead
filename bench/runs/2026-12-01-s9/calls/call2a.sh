#!/bin/sh
# session 9, call 2a: coded streaming (engine p8, adapter 8G with trace and pool sizes), set-up A/B
set -u
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/python || exit 1
A=build/arena; W=/tmp/w; O=$W/o2; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
log synth; [ -f $ST ] || $A synth --layout flux-dev -o $ST -q || exit 1
log convert; [ -f $W/f.arena ] || $A convert -q $ST -o $W/f.arena || exit 1
[ -f $W/fc.arena ] || $A convert -q --codec hb4 $ST -o $W/fc.arena || exit 1
cat $W/f.arena $W/fc.arena >/dev/null
for r in 1 2; do for t in 1 8; do
  log "setup pin threads $t"; ARENA_PIN_THREADS=$t $A load $W/f.arena --vram-cap 8G --piece-size 128M --reserve 1300M --no-probe --json >$O/setup_t${t}_$r.json 2>&1
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("pin threads", sys.argv[2], round(d["seconds"],3), {k: round(v,3) for k,v in d["phases"].items()}, d["pinned_bytes"])' $O/setup_t${t}_$r.json $t
done; done
for img in f fc; do
  log "engine p8 $img"; IMG=$W/$img.arena OUT=$O/$img A=$A RUNS="p8" STEPS=8 sh bench/gpu_engine.sh $W
done
t() { n=$1; shift; log "torch $n"; timeout 200 python3 bench/torch_flux.py arena-sample --vram 8G --reserve 1300M --piece-size 128M "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read()); print("first step", d.get("first_step_s"), "setup", d.get("setup_s"))' $O/$n.jsonl; }
t plain --image $W/f.arena
t coded --image $W/fc.arena --trace $O/trace-coded.json
ARENA_WIRE_POOL=256M t coded256 --image $W/fc.arena
log done
cd $O && tar czf $OUT/res.tgz .
