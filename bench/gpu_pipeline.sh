#!/bin/sh
# gpu_pipeline.sh - a whole FluxPipeline at FLUX.1-dev's configs on a real
# card: arena's one budget for all four models against the pipeline resident
# and diffusers' two offloads (bench/gpu_pipeline.py; every run one process
# under bench/vram_peak.py: its peak device memory as the driver counts it).
#
# Sets (in the order given):
#   make        the pipeline synthesized on the GPU, saved to DIR (a tmpfs:
#               ~34 GB of memory) and converted into IMAGE (~34 GB of disk)
#   arena       attach(pipe, IMAGE, vram=V) for each V of ARENA_V (default
#               8G 12G), IMAGES (default 2) images
#   pretrained  arena.torch.from_pretrained(FluxPipeline, DIR, vram=V) for
#               each V of PRE_V (default 8G 12G), the cache CACHE (default
#               OUT/cache) emptied first: the first V's run converts (cold),
#               then each V runs warm; QUANT: its quant (default none)
#   resident    the plain pipeline on the device, IMAGES images
#   model       enable_model_cpu_offload(), IMAGES images
#   sequential  enable_sequential_cpu_offload(), SEQ_IMAGES (default 1),
#               SEQ_STEPS denoising steps (default STEPS)
#   drop        remove IMAGE (to make room on the disk for other work; DIR
#               stays for the diffusers runs)
# Prints: a JSON line a run appended to OUT/pipeline.jsonl (gpu_pipeline.py's
#   record, "name" and vram_peak.py's "nvml" beside it); each run's stderr
#   tail in OUT/pipeline-errors.txt.
# Run: A=build/arena OUT=dir sh bench/gpu_pipeline.sh DIR IMAGE SET...
#   (the arena package importable, torch, diffusers and transformers; STEPS
#   denoising steps, default 28; TO: seconds a run may take, default 300)
set -u
A=${A:-build/arena}
OUT=${OUT:-.}
D=$1
IMG=$2
shift 2
mkdir -p "$OUT"
log() { echo "== $(date +%T) $*" >&2; }

run() {
	n=$1
	shift
	log "$n"
	e=$OUT/pipeline-$n.err
	timeout "${TO:-300}" python3 bench/vram_peak.py -- python3 bench/gpu_pipeline.py "$@" "$D" "$IMG" \
		--steps "${RUN_STEPS:-${STEPS:-28}}" >"$OUT/run.out" 2>"$e"
	{ echo "== $n"; grep -v -e 'kept in float32' -e 'Unable to import' "$e" | tail -n 12; } >>"$OUT/pipeline-errors.txt"
	rm -f "$e"
	python3 bench/peak_record.py "$n" "$OUT/run.out" >>"$OUT/pipeline.jsonl" || log "failed: $n"
	rm -f "$OUT/run.out"
}

for set in "$@"; do
	case $set in
	make)
		log make
		python3 bench/gpu_pipeline.py make "$D" "$IMG" --arena "$A" >>"$OUT/pipeline.jsonl" || exit 1
		;;
	arena)
		cat "$IMG" >/dev/null
		for v in ${ARENA_V:-8G 12G}; do
			run "arena-$v" arena --vram "$v" --images "${IMAGES:-2}"
		done
		;;
	pretrained)
		C=${CACHE:-$OUT/cache}
		rm -rf "$C"
		first=cold
		for v in ${PRE_V:-8G 12G}; do
			if [ $first = cold ]; then
				run "pretrained-cold-$v" pretrained --vram "$v" --images "${IMAGES:-2}" --cache "$C" ${QUANT:+--quant "$QUANT"}
				first=warm
			fi
			run "pretrained-warm-$v" pretrained --vram "$v" --images "${IMAGES:-2}" --cache "$C" ${QUANT:+--quant "$QUANT"}
		done
		;;
	resident | model)
		run "$set" "$set" --images "${IMAGES:-2}"
		;;
	sequential)
		RUN_STEPS=${SEQ_STEPS:-${STEPS:-28}} run sequential sequential --images "${SEQ_IMAGES:-1}"
		;;
	drop)
		rm -f "$IMG"
		;;
	*)
		echo "gpu_pipeline.sh: unknown set $set (make arena pretrained resident model sequential drop)" >&2
		exit 2
		;;
	esac
done
