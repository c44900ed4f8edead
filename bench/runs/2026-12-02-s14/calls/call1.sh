#!/bin/sh
# session 14, call 1: sampling's peak RSS from the plain image with the disk tier holding part of the
# streamed blocks (host_budget below the streamed bytes, the rest read from the page cache each step);
# training at 8 and 4 GiB with a ring one slot smaller (depth 1) against the default, same call
O=/tmp/w/o1 IMAGES="plain hb4" LATE=480 TO=90 . bench/gpu_call.sh
S="--steps 12 --vram 8G --reserve 1300M --image $W/f.arena"
t s8 arena-sample $S
t s8h15 arena-sample $S --host-budget 15G
t s8h14 arena-sample $S --host-budget 14G
TR="--steps 12 --gc-freeze"
t tr arena-train $TR --image $W/f.arena --grads $W/grads-plain-train-all.pt
t tc8 arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena
t td8 arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --depth 1 --image $W/fc.arena --grads $W/grads-arena-d8.pt
t td4 arena-train $TR --vram 4G --reserve 2560M --piece-size auto --depth 1 --image $W/fc.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tc8.jsonl $O/td8.jsonl $O/td4.jsonl
python3 bench/torch_summary.py /dev/null $W
log done
cd $O && tar czf $OUT/res.tgz .
