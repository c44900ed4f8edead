#!/bin/sh
# session 15, call 4: training (LoRA r16, AdamW, checkpointing every block) at 8 GiB from the hb4
# image with host budgets that leave part of it in the image (the disk tier spread through the
# step: read in the forward and again in the backward), against no budget and the resident step.
O=/tmp/w/o4 IMAGES=hb4 LATE=470 TO=100 . bench/gpu_call.sh
TR="--steps 8 --gc-freeze"
T8="$TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena"
t tr arena-train $TR --image $W/fc.arena
t tc8 arena-train $T8
t tc8h12 arena-train $T8 --host-budget 12G
t tc8h9 arena-train $T8 --host-budget 9G
python3 bench/train_bound.py $O/tr.jsonl $O/tc8.jsonl $O/tc8h12.jsonl $O/tc8h9.jsonl
log done
cd $O && tar czf $OUT/res.tgz .
