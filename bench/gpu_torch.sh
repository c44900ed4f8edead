#!/bin/sh
# gpu_torch.sh - the PyTorch adapter on a machine with an NVIDIA GPU (measured on one H200) (bench/torch_flux.py),
# side by side in one run: the plain diffusers Flux (FLUX.1-dev config, weights
# from `arena synth --layout flux-dev`) resident, diffusers' group offloading
# (block_level, use_stream), and arena.torch.attach at several vram sizes,
# sampling and LoRA training; then the engine alone (`arena bench stream`)
# for the host-to-device rate of the same run. One JSON line a run in
# $OUT/torch.jsonl, the bench stream reports in $OUT/engine_*.json.
# TORCH_ARGS: more arguments for every run (--sync: the old timing, a device-wide
# synchronize after each step). TRACE=1: arena runs also write $OUT/trace-RUN-VRAM.json (3 steps after the timed ones).
# usage: A=build/arena OUT=dir sh bench/gpu_torch.sh WORKDIR [RUN[:VRAM[:RESERVE[:DEPTH[:PIECE]]]]...]
# (PIECE: --piece-size, blocks streamed in pieces; train runs in pieces get --keep-last 0)
set -u
A=${A:-build/arena}
OUT=${OUT:-.}
W=$1
shift
mkdir -p "$W" "$OUT"
ST=$W/f.safetensors
IMG=$W/f.arena
[ -f "$ST" ] || "$A" synth --layout flux-dev -o "$ST" >/dev/null || exit 1
[ -f "$IMG" ] || "$A" convert -q "$ST" -o "$IMG" || exit 1
cat "$IMG" "$ST" >/dev/null
P="python3 bench/torch_flux.py"
one() {
	echo "== $*" >&2
	timeout 300 $P "$@" ${TORCH_ARGS:-} --image "$IMG" --safetensors "$ST" 2>"$W/last.err" | tail -n 1 >>"$OUT/torch.jsonl" ||
		{ echo "failed: $*" >&2; tail -n 3 "$W/last.err" >&2; }
}
# RUN[:VRAM[:RESERVE[:DEPTH[:PIECE]]]] (an empty field: the default)
RUNS=${*:-"plain-sample arena-sample arena-sample:8G diffusers-sample arena-sample:4G plain-train arena-train:8G:3G arena-train:6G:3G"}
for r in $RUNS; do
	IFS=: read -r name v res depth piece <<EOR
$r
EOR
	set --
	[ -n "$v" ] && set -- --vram "$v"
	[ -n "$res" ] && set -- "$@" --reserve "$res"
	[ -n "$depth" ] && set -- "$@" --depth "$depth"
	[ -n "$piece" ] && set -- "$@" --piece-size "$piece"
	[ -n "$piece" ] && case $name in *-train) set -- "$@" --keep-last 0 ;; esac
	case $name in
	*-train) set -- "$@" --grads "$W/grads-$name-${v:-all}${piece:+-$piece}.pt" ;;
	esac
	case $name in
	arena-*) [ -n "${TRACE:-}" ] && set -- "$@" --trace "$OUT/trace-$name-${v:-all}${piece:+-$piece}.json" ;;
	esac
	one "$name" "$@"
done
