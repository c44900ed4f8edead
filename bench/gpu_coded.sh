#!/bin/sh
# gpu_coded.sh - coded streaming: the same flux-dev weights as a plain image
# (f.arena) and as an hb4 image (fc.arena, `convert --codec hb4`), whose
# streamed blocks the engine keeps coded in host memory and copies coded
# (the device decodes), side by side in one run.
#
# Measures: convert to each image (once, the times on stdout); the engine
#   (bench/gpu_engine.sh's runs ENGINE, default "cap8 pfloor": an 8G sample
#   run, and 128M pieces under a 1G cap at depth PDEPTH, default 3) on each
#   image; the adapter (bench/torch_flux.py's runs TORCH, each
#   RUN:VRAM:RESERVE:PIECE, default "arena-sample:8G:1300M:128M") on each.
# Limit, same run: the engine's bound (max of the compute and the moved
#   bytes, coded bytes for the hb4 image, over the host-to-device rate it
#   measured); the adapter's moved bytes a step over the pinned rate
#   torch_flux.py measures after its steps (`h2d_bytes_per_s`).
# Prints: gpu_engine.sh's summary lines a run; the adapter's JSON lines
#   go to OUT/torch-f.jsonl and OUT/torch-fc.jsonl (bench/torch_summary.py
#   reads them); engine JSON under OUT/f/ and OUT/fc/.
# Run: A=build/arena OUT=dir sh bench/gpu_coded.sh WORKDIR
#   on a machine with an NVIDIA GPU, a CUDA build of arena, and torch +
#   diffusers + the arena package importable
#   (installed, or PYTHONPATH=python beside a CUDA build in build/); ~45 GB
#   free in WORKDIR. bench/gpu_coded_check.py checks the coded bytes on the
#   device.
set -u
A=${A:-build/arena}
OUT=${OUT:-.}
W=$1
mkdir -p "$W" "$OUT"
ST=$W/f.safetensors
now() { date +%s.%N; }
if [ ! -f "$W/f.arena" ] || [ ! -f "$W/fc.arena" ]; then
	[ -f "$ST" ] || "$A" synth --layout flux-dev -o "$ST" >/dev/null || exit 1
	cat "$ST" >/dev/null
	t0=$(now)
	[ -f "$W/f.arena" ] || "$A" convert -q "$ST" -o "$W/f.arena" || exit 1
	t1=$(now)
	[ -f "$W/fc.arena" ] || "$A" convert -q --codec hb4 "$ST" -o "$W/fc.arena" || exit 1
	t2=$(now)
	python3 -c "import sys; a, b, c = map(float, sys.argv[1:]); print(\"convert: plain %.1f s, hb4 %.1f s\" % (b - a, c - b))" "$t0" "$t1" "$t2"
	rm -f "$ST"
fi
ls -l "$W"/f.arena "$W"/fc.arena
ENGINE=${ENGINE-"cap8 pfloor"}
for img in f fc; do
	[ -n "$ENGINE" ] || break
	echo "== engine, $img.arena"
	IMG=$W/$img.arena OUT=$OUT/$img A=$A RUNS="$ENGINE" PDEPTH=${PDEPTH:-3} sh bench/gpu_engine.sh "$W"
done
TORCH=${TORCH-"arena-sample:8G:1300M:128M"}
for r in $TORCH; do
	IFS=: read -r name v res piece <<EOR
$r
EOR
	for img in f fc; do
		set -- --image "$W/$img.arena"
		[ -n "$v" ] && set -- "$@" --vram "$v"
		[ -n "$res" ] && set -- "$@" --reserve "$res"
		[ -n "$piece" ] && set -- "$@" --piece-size "$piece"
		case $name in *-train) [ -n "$piece" ] && set -- "$@" --keep-last 0 ;; esac
		case $name in *-train) set -- "$@" --grads "$W/grads-$name-$img-${v:-all}.pt" ;; esac
		echo "== torch $name $img.arena $*" >&2
		timeout 300 python3 bench/torch_flux.py "$name" "$@" 2>"$W/last.err" | tail -n 1 >>"$OUT/torch-$img.jsonl" ||
			{ echo "failed: $name $img" >&2; tail -n 3 "$W/last.err" >&2; }
	done
done
