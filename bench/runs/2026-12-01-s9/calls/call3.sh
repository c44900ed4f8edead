#!/bin/sh
# session 9, call 3: the adapter after learning costs to the next acquire (8G sample plain/coded, train 8G plain/coded)
set -u
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/python || exit 1
A=build/arena; W=/tmp/w; O=$W/o5; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
log synth; [ -f $ST ] || $A synth --layout flux-dev -o $ST -q || exit 1
log convert; [ -f $W/f.arena ] || $A convert -q $ST -o $W/f.arena || exit 1
[ -f $W/fc.arena ] || $A convert -q --codec hb4 $ST -o $W/fc.arena || exit 1
cat $W/f.arena $W/fc.arena >/dev/null
t() { n=$1; r=$2; shift 2; log "torch $n"; timeout 240 python3 bench/torch_flux.py $r "$@" 2>$O/$n.err | tail -n 1 >$O/$n.jsonl; python3 bench/torch_summary.py $O/$n.jsonl || tail -3 $O/$n.err; python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read()); print("first step", d.get("first_step_s"), "setup", d.get("setup_s"), "steps", [round(x,4) for x in d["steps_s"]])' $O/$n.jsonl; }
S="--vram 8G --reserve 1300M --piece-size 128M"
t plain arena-sample $S --image $W/f.arena
t coded arena-sample $S --image $W/fc.arena --trace $O/trace-coded.json
cat $W/f.arena >/dev/null
TR="--vram 8G --reserve 3G --piece-size 128M --keep-last 0"
t train-res plain-train --image $W/f.arena --safetensors $ST --grads $W/g-res.pt
t train-plain arena-train $TR --image $W/f.arena --grads $W/g-f.pt
t train-coded arena-train $TR --image $W/fc.arena --grads $W/g-fc.pt
python3 -c '
import torch,sys
a=torch.load(sys.argv[1])
for f in sys.argv[2:]:
    b=torch.load(f); print(f, len(a), "largest difference %.3g, largest gradient %.3g" % (max((a[k]-b[k]).abs().max().item() for k in a), max(a[k].abs().max().item() for k in a)))
' $W/g-res.pt $W/g-f.pt $W/g-fc.pt
log done
cd $O && tar czf $OUT/res.tgz .
