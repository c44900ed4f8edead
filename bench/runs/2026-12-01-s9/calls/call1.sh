#!/bin/sh
# session 9, call 1: set-up phases of the plain image, disk tier (plain, hb4), cold zstd loads
set -u
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
A=build/arena; W=/tmp/w; O=$W/o; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
df -h /tmp | tail -1
log synth; /usr/bin/time -f "synth %e s" $A synth --layout flux-dev -o $W/f.safetensors -q || exit 1
log convert plain; /usr/bin/time -f "convert %e s" $A convert -q $W/f.safetensors -o $W/f.arena || exit 1
rm -f $W/f.safetensors
cat $W/f.arena >/dev/null
for i in 1 2; do
  log "load 8G 128M ($i)"; $A load $W/f.arena --vram-cap 8G --piece-size 128M --reserve 1300M --json >$O/setup8g_$i.json 2>$O/setup8g_$i.err
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["seconds"], d.get("phases"), d.get("reader_thread_s"), d.get("host_bytes"), d.get("gbps"))' $O/setup8g_$i.json
done
log "load all ($i)"; $A load $W/f.arena --no-probe --json >$O/setupall.json 2>&1
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["seconds"], d.get("phases"), d.get("reader_thread_s"))' $O/setupall.json
log disk plain; A=$A OUT=$O STEPS=3 RUNS="ra sync" sh bench/gpu_disk.sh $W
rm -f $W/f.arena
log disk hb4; KEEP=1 A=$A OUT=$O STEPS=3 CODEC=hb4 RUNS="ra" sh bench/gpu_disk.sh $W
rm -f $W/f-hb4.arena
log convert zstd; /usr/bin/time -f "convert zstd %e s" $A convert -q --codec zstd $W/f.safetensors -o $W/fz.arena || exit 1
rm -f $W/f.safetensors
log cold zstd; OUT=$O ROUNDS=4 sh bench/gpu_zstd_cold.sh $W/fz.arena "z=$A"
log done
cd $W/o && tar czf $OUT/res.tgz . 
