#!/bin/sh
# session 13, call 1: why the learned profile's plans in 64 MiB pieces ran slower than the plan by bytes
# (session 12 call 4, sr8l: steps 0.45-0.51 s after the swap at the pressure's end, against 0.31 s by bytes)
# the same run traced over its timed steps, with host timing; learned without pressure; by bytes again
O=/tmp/w/o1 IMAGES=plain LATE=420 TO=90 . bench/gpu_call.sh
S="--steps 16 --vram 8G --reserve 1300M --piece-size 64M --host-timing --image $W/f.arena"
t sr8l arena-sample $S --rest-extra 2G@3-5 --trace-timed $O/sr8l.trace.json
t sl arena-sample $S --steps 24
t sr8 arena-sample $S --no-learn --rest-extra 2G@3-5
log done
cd $O && gzip -f *.trace.json; tar czf $OUT/res.tgz .
