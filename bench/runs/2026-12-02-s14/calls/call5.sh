#!/bin/sh
# session 14, call 5: LoRA gradients after one step against the resident run's, with the DLPack tensors
# now made by the library (call 3 saved its gradients under names torch_summary.py does not read)
O=/tmp/w/o5 IMAGES="plain hb4" LATE=480 TO=100 . bench/gpu_call.sh
TR="--steps 3 --gc-freeze"
t tr arena-train $TR --image $W/f.arena --grads $W/grads-plain-train-all.pt
t tc8 arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena --grads $W/grads-arena-train-hb4-8G.pt
t tc4 arena-train $TR --vram 4G --reserve 2560M --piece-size auto --image $W/fc.arena --grads $W/grads-arena-train-hb4-4G.pt
t tp8 arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/f.arena --grads $W/grads-arena-train-plain-8G.pt
python3 bench/torch_summary.py /dev/null $W
log done
cd $O && tar czf $OUT/res.tgz .
