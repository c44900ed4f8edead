#!/bin/sh
# session 12, call 3: offload_saved in stream order against none at 8, 4 and 3 GiB, side by side
# (rewritten after the run over bench/gpu_call.sh: the same commands)
O=/tmp/w/o3 IMAGES="plain hb4" . bench/gpu_call.sh
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
