#!/bin/sh
# session 13, call 2: moves that must pay for themselves (payback_steps 16): call 1's runs again,
# and training in 128 MiB pieces with the learned profile (session 11 call 1 moved 28 and 27 pieces there)
O=/tmp/w/o2 IMAGES="plain hb4" LATE=470 TO=100 . bench/gpu_call.sh
S="--steps 16 --vram 8G --reserve 1300M --piece-size 64M --host-timing --image $W/f.arena"
t sr8l arena-sample $S --rest-extra 2G@3-5
t sl arena-sample $S --steps 24
t sr8 arena-sample $S --no-learn --rest-extra 2G@3-5
TR="--steps 16 --host-timing --gc-freeze"
t tr arena-train $TR --image $W/f.arena
t tp8l arena-train $TR --vram 8G --reserve 3G --piece-size 128M --image $W/fc.arena
t tp8b arena-train $TR --vram 8G --reserve 3G --piece-size 128M --no-learn --image $W/fc.arena
python3 bench/train_bound.py $O/tr.jsonl $O/tp8l.jsonl $O/tp8b.jsonl
log done
cd $O && tar czf $OUT/res.tgz .
