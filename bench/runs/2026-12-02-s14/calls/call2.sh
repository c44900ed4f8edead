#!/bin/sh
# session 14, call 2: a refused attach left uncaught, with the DLPack deleter in C (this tree) and as it
# was (a ctypes callback: gpu-libs/oldpy, the package at 4f9cfec); then #14's sampling figures again on
# this code, side by side: resident, no cap, 8 GiB, diffusers' group offloading and arena at its memory
O=/tmp/w/o2 IMAGES=plain KEEP_ST=1 LATE=500 TO=100 . bench/gpu_call.sh
F="--steps 2 --vram 4G --reserve 2560M --piece-size auto --depth 1 --image $W/f.arena"
for v in new old; do
	log "refused attach, package $v"
	[ $v = old ] && PP=/tmp/site:$PWD/gpu-libs/oldpy/python || PP=$PYTHONPATH
	PYTHONPATH=$PP timeout 60 python3 -X faulthandler bench/torch_flux.py arena-train $F >/dev/null 2>$O/refused-$v.err
	echo "rc=$?"; grep -v "kept in float32" $O/refused-$v.err | tail -4
done
S="--steps 10 --safetensors $W/f.safetensors"
cat $W/f.safetensors >/dev/null
t ps plain-sample $S
t an arena-sample $S --image $W/f.arena
t a8 arena-sample $S --image $W/f.arena --vram 8G --reserve 1400M --piece-size auto
t a28 arena-sample $S --image $W/f.arena --vram 2816M --reserve 900M --piece-size 128M
cat $W/f.safetensors >/dev/null
t ds diffusers-sample $S --steps 8
log done
cd $O && tar czf $OUT/res.tgz .
