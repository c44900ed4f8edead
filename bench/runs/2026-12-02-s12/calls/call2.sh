#!/bin/sh
# session 12, call 2: offload_saved against none at 4 GiB side by side; 8 GiB with the reserve covering torch and CUDA (device within the cap); expandable segments
# (rewritten after the run over bench/gpu_call.sh: the same commands)
O=/tmp/w/o2 IMAGES="plain hb4" . bench/gpu_call.sh
python3 bench/runs/2026-12-02-s12/calls/offload_smoke.py || exit 1
TR="--steps 16 --host-timing --gc-freeze"
t tr arena-train $TR --image $W/f.arena --grads $W/grads-plain-train-all.pt
t tc4b arena-train $TR --vram 4G --reserve 2560M --piece-size auto --image $W/fc.arena
t tc4o arena-train $TR --vram 4G --reserve 1900M --piece-size auto --offload-saved on --image $W/fc.arena --grads $W/grads-arena-train-c4o.pt
t tc8o arena-train $TR --vram 8G --reserve 2300M --piece-size auto --keep-last 0 --offload-saved on --image $W/fc.arena
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
t tc8e arena-train $TR --vram 8G --reserve 2300M --piece-size auto --keep-last 0 --offload-saved on --image $W/fc.arena
t tc4e arena-train $TR --vram 4G --reserve 1900M --piece-size auto --offload-saved on --image $W/fc.arena
unset PYTORCH_CUDA_ALLOC_CONF
t tc4on arena-train $TR --vram 4G --reserve 1900M --piece-size auto --offload-saved on --no-learn --image $W/fc.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tc4b.jsonl $O/tc4o.jsonl $O/tc8o.jsonl $O/tc8e.jsonl $O/tc4e.jsonl $O/tc4on.jsonl
python3 bench/torch_summary.py /dev/null $W
log done
cd $O && tar czf $OUT/res.tgz .
