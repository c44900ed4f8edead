#!/bin/sh
# session 12, call 1: training with the saved tensors in host memory (offload_saved) at 8 and 4 GiB against the resident step and the same runs without; release_host in a sampling run under pressure
# (rewritten after the run over bench/gpu_call.sh: the same commands)
O=/tmp/w/o1 IMAGES="plain hb4" . bench/gpu_call.sh
python3 bench/runs/2026-12-02-s12/calls/offload_smoke.py || exit 1
TR="--steps 16 --host-timing --gc-freeze"
t tr arena-train $TR --image $W/f.arena --grads $W/grads-plain-train-all.pt
t tc8o arena-train $TR --vram 8G --reserve 1792M --piece-size auto --keep-last 0 --offload-saved on --image $W/fc.arena --grads $W/grads-arena-train-c8o.pt
t tc4o arena-train $TR --vram 4G --reserve 1536M --piece-size auto --offload-saved on --image $W/fc.arena
t tc8b arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena
t sr8 arena-sample --steps 16 --vram 8G --reserve 1300M --piece-size 64M --no-learn --rest-extra 2G@3-5 --image $W/f.arena
t tc3o arena-train $TR --vram 3G --reserve 1280M --piece-size auto --offload-saved on --image $W/fc.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tc8o.jsonl $O/tc4o.jsonl $O/tc8b.jsonl $O/tc3o.jsonl
python3 bench/torch_summary.py /dev/null $W
log done
cd $O && tar czf $OUT/res.tgz .
