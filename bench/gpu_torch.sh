#!/bin/sh
# gpu_torch.sh - the PyTorch adapter on diffusers' Flux (bench/torch_flux.py),
# several runs side by side, one process a run.
#
# Measures: by default the plain model resident (weights loaded with
#   safetensors to the GPU), diffusers' group offloading (block_level,
#   use_stream), arena.torch.attach all resident and at 8G and 4G, and LoRA
#   training resident and through arena at 8G and 6G; or the runs given,
#   each RUN[:VRAM[:RESERVE[:DEPTH[:PIECE]]]] (an empty field: the default;
#   PIECE: --piece-size; a train run in pieces gets --keep-last 0).
#   TORCH_ARGS: more torch_flux.py options for every run (--gc-freeze,
#   --host-timing, --sync, ...). TRACE=1: arena runs also write
#   OUT/trace-RUN-VRAM.json (3 steps after the timed ones).
# Limit, same run: each run's `h2d_bytes_per_s` (the pinned host-to-device
#   rate, measured in the same process after its steps): a streamed sample
#   step's bound is its moved bytes over it; the resident run beside it for
#   the ratio to resident (training: bench/train_bound.py).
# Prints: one JSON line a run appended to OUT/torch.jsonl (read it with
#   bench/torch_summary.py OUT/torch.jsonl WORKDIR: one line a run and the
#   LoRA gradients against the resident run's); failures on stderr.
# Run: A=build/arena OUT=dir sh bench/gpu_torch.sh WORKDIR [RUN...]
#   on a machine with an NVIDIA GPU, a CUDA build of arena, torch and
#   diffusers, the arena package importable
#   (installed, or PYTHONPATH=python beside a CUDA build in build/); ~50 GB free
#   in WORKDIR.
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
