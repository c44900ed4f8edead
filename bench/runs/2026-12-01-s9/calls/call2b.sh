#!/bin/sh
# session 9, call 2b: warm loads of the three forms, cold zstd against hb4, zstd convert
set -u
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
A=build/arena; W=/tmp/w; O=$W/o3; mkdir -p $O
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
cat $ST >/dev/null
rm -f $W/f.arena
log convert zstd; /usr/bin/time -f "convert zstd (source warm) %e s, user %U s" $A convert -q --codec zstd $ST -o $W/fz.arena || exit 1
ls -l $W/*.arena
rm -f $ST
for r in 1 2; do for img in fc fz; do
  cat $W/$img.arena >/dev/null
  $A load $W/$img.arena --json >$O/warm_${img}_$r.json 2>&1
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("warm", sys.argv[2], round(d["gbps"],2), "GB/s of weights,", round(d["seconds"],2), "s; decode", d.get("decoded"), "limits", d["limits"])' $O/warm_${img}_$r.json $img
done; done
log cold; OUT=$O ROUNDS=3 sh bench/gpu_zstd_cold.sh $W/fz.arena "z=$A"
OUT=$O ROUNDS=2 sh bench/gpu_zstd_cold.sh $W/fc.arena "h=$A"
log done
cd $O && tar czf $OUT/res.tgz .
