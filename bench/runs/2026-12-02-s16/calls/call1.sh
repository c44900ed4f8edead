#!/bin/sh
# session 16, call 1: (a) how far lending torch's backward-only memory to the forward's blocks could
# move #14's 8 GiB training step: the same run at vram 9.5G (arena holds ~1.5 GiB more through the
# whole step, more than torch could lend to the forward) against 8G and the resident step; (b) the
# disk tier under torch after the stager fix (db5de83): session 15's call 4 tc8h12 (training) and
# call 1 h14 (sampling) again.
O=/tmp/w/o1 IMAGES="hb4 plain" LATE=500 TO=100 . bench/gpu_call.sh
TR="--steps 8 --gc-freeze"
T8="$TR --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena"
t tr arena-train $TR --image $W/fc.arena
t tc8 arena-train $T8 --vram 8G
t tc95 arena-train $T8 --vram 9728M
t tc8h12 arena-train $T8 --vram 8G --host-budget 12G
python3 bench/train_bound.py $O/tr.jsonl $O/tc8.jsonl $O/tc95.jsonl $O/tc8h12.jsonl
S="--steps 12 --vram 8G --reserve 1400M --piece-size auto --image $W/f.arena"
t h14 arena-sample $S --host-budget 14G
t s8 arena-sample $S
log done
cd $O && tar czf $OUT/res.tgz .
