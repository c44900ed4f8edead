#!/bin/sh
# session 14, call 3: the refused attach with the package as it was (a ctypes DLPack deleter), the library
# found this time; arena at diffusers' device memory again (call 2's run died in the bench's rate probe);
# training at 8 and 4 GiB from the hb4 image on this code (DLPack tensors made by the library), gradients
O=/tmp/w/o3 IMAGES="plain hb4" LATE=480 TO=100 . bench/gpu_call.sh
log "refused attach, package as it was"
PYTHONPATH=/tmp/site:$PWD/gpu-libs/oldpy/python ARENA_LIBRARY=$PWD/build/libarena.so timeout 60 python3 -X faulthandler \
	bench/torch_flux.py arena-train --steps 2 --vram 4G --reserve 2560M --piece-size auto --depth 1 --image $W/f.arena \
	>/dev/null 2>$O/refused-old.err
echo "rc=$?"; grep -v "kept in float32" $O/refused-old.err | tail -12
t a28 arena-sample --steps 10 --image $W/f.arena --vram 2816M --reserve 900M --piece-size 128M
TR="--steps 12 --gc-freeze"
t tr arena-train $TR --image $W/f.arena --grads $W/grads-plain-train-all.pt
t tc8 arena-train $TR --vram 8G --reserve 3G --piece-size auto --keep-last 0 --image $W/fc.arena --grads $W/grads-arena-c8.pt
t tc4 arena-train $TR --vram 4G --reserve 2560M --piece-size auto --image $W/fc.arena --grads $W/grads-arena-c4.pt
python3 bench/train_bound.py $O/tr.jsonl $O/tc8.jsonl $O/tc4.jsonl
python3 bench/torch_summary.py /dev/null $W
log done
cd $O && tar czf $OUT/res.tgz .
