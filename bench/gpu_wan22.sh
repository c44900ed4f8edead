#!/bin/sh
# gpu_wan22.sh - the Wan 2.2 T2V A14B pipeline (two 14B experts switched at a
# boundary step, UMT5-XXL, the VAE) on a real card: arena's one budget for the
# whole pipeline under several caps against diffusers' model offload and the
# pipeline resident (bench/torch_wan22.py runs, one process each, every one
# under bench/vram_peak.py: NVML's device-wide used memory polled every 2 ms
# from before the process's CUDA context).
#
# IMAGE: the pipeline's image (one image, "<component>.<name>"); made by the
#   make set when it does not exist.
# Sets (in the order given):
#   make       torch_wan22.py make: the image written on this machine by
#              synth_image, a block at a time (QUANT, default fp8-e4m3-row:
#              the experts' block Linears, about 40 GB; none: bf16, about
#              69 GB, more than a 64 GB disk holds); skipped when IMAGE exists
#   arena      attach(pipe, IMAGE, vram=V) for each V of ARENA_V (default 24G
#              16G), fp8_compute attach's default (native FP8 products on an
#              FP8 image); then, where EXACT is not 0, arena at the first V
#              with --fp8-compute off (every weight dequantized at its bind:
#              its output must be resident's bit for bit)
#   offload    diffusers' enable_model_cpu_offload() on the same weights
#              (dequantized to bf16 in host memory)
#   resident   the same weights all on the device, where they fit
#              (--skip-if-no-room: a record saying why where they do not)
# Limit, same run: each run's pinned host-to-device rate, measured by
#   torch_wan22.py after its videos (arena's memory given back first): the
#   switch's copies take its moved bytes over it.
# Prints: one JSON line a run appended to OUT/wan22.jsonl (torch_wan22.py's
#   record, "name" and vram_peak.py's "nvml" beside it; a failed run's record
#   has "ok": false and its error); each run's last stderr lines in
#   OUT/wan22-errors.txt. Read them with
#   python3 bench/wan_qwen_summary.py --wan22 OUT/wan22.jsonl (the table).
# Run: IMAGE=... OUT=dir sh bench/gpu_wan22.sh SET...
#   on a machine with an NVIDIA GPU, torch, diffusers, transformers, accelerate
#   and tokenizers, the arena package importable (PYTHONPATH=python
#   ARENA_LIBRARY=build/libarena.so beside a build). STEPS: denoising steps a
#   video (default 40; fewer still switch experts at the boundary); VIDEOS:
#   videos a run, the figures the last's (default 1); TO: seconds a run may
#   take (default 1800); PY: the Python (default python3); DEADLINE: seconds
#   after which no run starts (default none); ARGS: more torch_wan22.py
#   options for every run ("--tiny --device cpu": the tiny configs on the
#   CPU, as the tests run it); METER=none: the runs without vram_peak.py (no
#   NVML; "nvml": null).
set -u
OUT=${OUT:-.}
PY=${PY:-python3}
IMG=${IMAGE:-}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "== $(date +%T) $*" >&2; }

if [ -z "$IMG" ]; then
	echo "gpu_wan22.sh: IMAGE must name the pipeline's image (the make set writes it)" >&2
	exit 2
fi

# run NAME ARGS...: one torch_wan22.py run under the NVML meter, its record
# appended; status 1 when it ran and failed or left no record
run() {
	n=$1
	shift
	if [ -n "${DEADLINE:-}" ] && [ $(($(date +%s) - T0)) -ge "$DEADLINE" ]; then
		log "$n: not run (DEADLINE)"
		return 1
	fi
	log "$n"
	e=$OUT/wan22-$n.err
	if [ "${METER:-nvml}" = none ]; then
		set -- "$PY" bench/torch_wan22.py "$@"
	else
		set -- "$PY" bench/vram_peak.py -- "$PY" bench/torch_wan22.py "$@"
	fi
	# shellcheck disable=SC2086 # ARGS: words added to every run
	timeout "${TO:-1800}" "$@" --image "$IMG" ${STEPS:+--steps "$STEPS"} --videos "${VIDEOS:-1}" ${ARGS:-} \
		>"$OUT/run.out" 2>"$e"
	rc=$?
	{ echo "== $n (exit $rc)"; grep -v -e 'kept in float32' -e 'Unable to import' "$e" | tail -n 12; } \
		>>"$OUT/wan22-errors.txt"
	rm -f "$e"
	"$PY" bench/peak_record.py "$n" "$OUT/run.out" >>"$OUT/wan22.jsonl" || { log "failed: $n (no record)"; rc=1; }
	rm -f "$OUT/run.out"
	[ $rc = 0 ] || log "failed: $n"
	return $rc
}

need() {
	if [ ! -f "$IMG" ]; then
		echo "gpu_wan22.sh: no image at $IMG (run the make set first)" >&2
		exit 2
	fi
}

for set in "$@"; do
	case $set in
	make)
		if [ -f "$IMG" ]; then
			log "make: $IMG exists"
			continue
		fi
		log make
		# shellcheck disable=SC2086 # ARGS: words added to every run
		"$PY" bench/torch_wan22.py make --image "$IMG" --quant "${QUANT:-fp8-e4m3-row}" ${ARGS:-} \
			>"$OUT/run.out" 2>>"$OUT/wan22-errors.txt"
		rc=$?
		"$PY" bench/peak_record.py make "$OUT/run.out" >>"$OUT/wan22.jsonl"
		rm -f "$OUT/run.out"
		[ $rc = 0 ] || { log "failed: make"; exit 1; }
		;;
	arena)
		need
		first=
		for v in ${ARENA_V:-24G 16G}; do
			run "arena-$v" arena --vram "$v"
			first=${first:-$v}
		done
		if [ "${EXACT:-1}" != 0 ] && [ -n "$first" ]; then
			run "arena-$first-exact" arena --vram "$first" --fp8-compute off
		fi
		;;
	offload)
		need
		run model-offload model-offload
		;;
	resident)
		need
		run resident resident --skip-if-no-room
		;;
	*)
		echo "gpu_wan22.sh: unknown set $set (make arena offload resident)" >&2
		exit 2
		;;
	esac
done
