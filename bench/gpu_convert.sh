#!/bin/sh
# gpu_convert.sh - convert and verify of flux-dev against the disk's and the
# page cache's own rates.
#
# Measures: `arena convert` of the checkpoint to a plain image and to an FP8
#   image (--quant fp8-e4m3-row), alternated, twice each (fsync included,
#   the source in the page cache); `arena verify` of the plain image, twice
#   (the image in the page cache).
# Limit, same run: `cp` + `sync` of the checkpoint (for convert) and `cat`
#   of the image to /dev/null (for verify).
# Prints: one line a figure, `NAME WALL s wall, USER s user, SYS s sys`,
#   and the images' sizes in bytes.
# Run: A=build/arena sh bench/gpu_convert.sh WORKDIR
#   on any Linux machine (convert and verify are host work; no GPU needed),
#   ~60 GB free in WORKDIR (the checkpoint, made by `arena synth --layout
#   flux-dev` unless WORKDIR/f.safetensors exists, and both images).
set -u
A=${A:-build/arena}
W=$1
mkdir -p "$W"
ST=$W/f.safetensors
[ -f "$ST" ] || "$A" synth --layout flux-dev -o "$ST" >/dev/null || exit 1
t() {
	name=$1
	shift
	echo "$name $(/usr/bin/time -f "%e s wall, %U s user, %S s sys" "$@" 2>&1 >/dev/null | tail -1)"
}
cat "$ST" >/dev/null
rm -f "$W/copy"
sync
t cp+sync sh -c "cp '$ST' '$W/copy' && sync '$W/copy'"
rm -f "$W/copy"
for _ in 1 2; do
	rm -f "$W/p.arena"
	sync
	t convert_plain "$A" convert -q --force "$ST" -o "$W/p.arena"
	rm -f "$W/q.arena"
	sync
	t convert_fp8-e4m3-row "$A" convert -q --force "$ST" -o "$W/q.arena" --quant fp8-e4m3-row
done
ls -l "$W/p.arena" "$W/q.arena" | awk '{print "size", $5, $9}'
rm -f "$W/q.arena"
cat "$W/p.arena" >/dev/null
for _ in 1 2; do
	t cat cat "$W/p.arena"
	t verify "$A" verify "$W/p.arena"
done
