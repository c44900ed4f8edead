#!/bin/sh
# session 13, call 3 (warm after call 2): training in 128 MiB pieces traced over its timed steps,
# learned and by bytes: where the forward's 0.1 s goes in the steps without stalls
O=/tmp/w/o3 IMAGES="plain hb4" LATE=470 TO=100 . bench/gpu_call.sh
TR="--steps 8 --host-timing --gc-freeze --vram 8G --reserve 3G --piece-size 128M --image $W/fc.arena"
t tp8l arena-train $TR --trace-timed $O/tp8l.trace.json
t tp8b arena-train $TR --no-learn --trace-timed $O/tp8b.trace.json
log done
cd $O && gzip -f *.trace.json; tar czf $OUT/res.tgz .
