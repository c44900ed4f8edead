#!/bin/sh
# session 14, call 4: call 1's sampling with a 15 GiB host budget again, the engine now taking the disk
# tier's reads off a move's predicted saving (call 1: a look's swap at step 7 put 3.3 GB more in the disk
# tier, 0.55 s steps became 0.73 s); 16 steps, so looks come at steps 2, 4, 7 and 15
O=/tmp/w/o4 IMAGES=plain LATE=480 TO=100 . bench/gpu_call.sh
S="--steps 16 --vram 8G --reserve 1300M --image $W/f.arena"
t s8h15 arena-sample $S --host-budget 15G
t s8h15n arena-sample $S --host-budget 15G --no-learn
log done
cd $O && tar czf $OUT/res.tgz .
