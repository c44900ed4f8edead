#!/bin/sh
# session 12, call 4: a budget that moves moves only what it must (near_set): the sampling run of call 1 under 2 GiB of pressure again, by bytes and learned
# (rewritten after the run over bench/gpu_call.sh: the same commands)
O=/tmp/w/o4 IMAGES=plain LATE=150 TO=80 . bench/gpu_call.sh
t sr8 arena-sample --steps 16 --vram 8G --reserve 1300M --piece-size 64M --no-learn --rest-extra 2G@3-5 --image $W/f.arena
t sr8l arena-sample --steps 16 --vram 8G --reserve 1300M --piece-size 64M --rest-extra 2G@3-5 --image $W/f.arena
log done
cd $O && tar czf $OUT/res.tgz .
