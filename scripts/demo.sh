#!/bin/sh
# demo.sh - the main job on a bundled example: synth a small Flux-shaped
# checkpoint, convert it to an arena image, verify it, inspect it, and export
# it back to safetensors (identical bytes), load it into device memory (the
# GPU when one is usable, else the low-VRAM simulator), plain and coded
# (--codec hb4, --codec zstd), and run it streamed
# on a simulated device smaller than the model, with a trace of the run and
# a picture of the plan. Each run starts from an empty BUILD/demo (arena
# replaces no file it has not been asked to: --force).
# usage: sh scripts/demo.sh BUILD
set -eu
B=${1:-build}
A=$B/arena
D=$B/demo
rm -rf "$D"
mkdir -p "$D"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }
step "$A" synth --layout flux-tiny --seed 1 -o "$D/flux-tiny.safetensors"
step "$A" convert "$D/flux-tiny.safetensors" -o "$D/flux-tiny.arena"
step "$A" verify "$D/flux-tiny.arena"
"$A" inspect "$D/flux-tiny.arena" > "$D/inspect.txt"
printf '\n\033[1m$ %s\033[0m\n' "$A inspect $D/flux-tiny.arena | head -22"
head -22 "$D/inspect.txt"
step "$A" load "$D/flux-tiny.arena" --check --no-probe
# The same model coded losslessly (bf16 in 12 bits): fewer bytes to read and
# copy, decoded by the device as it loads; the bytes are the same.
step "$A" convert -q "$D/flux-tiny.safetensors" -o "$D/flux-tiny-hb4.arena" --codec hb4 --chunk-size 64K
step "$A" load "$D/flux-tiny-hb4.arena" --check --no-probe
# Or byte-grouped and zstd-compressed (bf16 weights in about 69% of their
# bytes), decoded by the reader threads: for cold loads and for copying.
step "$A" convert -q "$D/flux-tiny.safetensors" -o "$D/flux-tiny-zstd.arena" --codec zstd --chunk-size 64K
step "$A" load "$D/flux-tiny-zstd.arena" --check --no-probe
# Run it on a device with less memory than the model: the residency engine
# streams blocks through a ring (on the simulator, slowed to a 20 MB/s link
# and a 100 GFLOP/s device so that copies and compute are of a size).
step "$A" plan "$D/flux-tiny.arena" --vram 400K
# The run's timeline as the device timed it (open trace.json in
# https://ui.perfetto.dev), and the compute profile the engine learned.
step "$A" bench stream "$D/flux-tiny.arena" --vram 400K --sim-capacity 1G --sim-bandwidth 2e7 --flops 1e11 --steps 6 \
	--trace "$D/trace.json" --save-profile "$D/profile.json"
# The plan as a picture, with one step's copies and compute as that profile
# predicts them, on a device where some blocks stay resident (the README's
# docs/plan-demo.svg is this picture).
step "$A" plan "$D/flux-tiny.arena" --vram 280K --headroom 0 --reserve 0 --depth 1 --profile "$D/profile.json" \
	--svg "$D/plan.svg"
# Below its floor with whole blocks, the model still runs in pieces: blocks
# cut where tensors start, the ring holding pieces (plan prints both floors).
step "$A" plan "$D/flux-tiny.arena" --vram 200K --headroom 0 --reserve 0 --piece-size 16K
step "$A" bench stream "$D/flux-tiny.arena" --vram 200K --headroom 0 --reserve 0 --piece-size 16K --sim-capacity 1G \
	--sim-bandwidth 2e7 --flops 1e11 --steps 6
step "$A" export "$D/flux-tiny.arena" -o "$D/flux-tiny.roundtrip.safetensors"
step cmp "$D/flux-tiny.safetensors" "$D/flux-tiny.roundtrip.safetensors"
echo "demo: the round trip is byte-identical; files are in $D/"
