#!/bin/sh
# gpu_vram.sh - the PyTorch adapter with nothing to tune, on a real card:
# attach(module, image[, vram=V]) and nothing else, the process's device
# memory read from the driver.
#
# Measures (FLUX.1-dev diffusers transformer, 1024x1024, synthesized weights,
# a plain image; bench/torch_flux.py runs, one process each, every one under
# bench/vram_peak.py: NVML's device-wide used memory polled every 2 ms from
# before the process's CUDA context):
#   sample    the resident step (no vram: the H200 holds it all), then
#             sampling at each V of SAMPLE_V (default 12G 8G 4G 3G)
#   floor     sampling at each V of FLOOR_V (default 2G 1792M): the smallest
#             that runs
#   train     LoRA (r16 on to_q/to_k/to_v/to_out.0, AdamW, checkpointing)
#             resident, then at each V of TRAIN_V (default 12G 8G 6G), and
#             at each V again with each piece size of TRAIN_PIECES (default
#             none: attach's "auto" only); TRAIN_STEPS steps a run (default
#             6; the quiet steps train_bound.py takes are those the plan
#             did not change before: 12 or more give several)
#   plain     the resident steps of torch alone (plain-sample, plain-train:
#             the safetensors loaded to the device), preferred as the
#             resident step by vram_summary.py
#   quant     quantized images made from the same weights (fp8-e4m3-row,
#             int4-g64; attach's defaults: FP8 products native on a card
#             with FP8 matmuls): FP8 sampling resident and at 8G, FP8
#             LoRA training at 8G (against the bf16 resident step), int4
#             sampling resident, at 8G and at 4G (INT4_V)
#   pressure  a card with FREE (default 16G) free (a filler process holds the
#             rest), vram None, 200 sampling steps; another process takes
#             PRESSURE (default 4G, in chunks of 64M, each tried until
#             the device has it) from T0 s and gives it back at T1 s
#             (PRESSURE_AT, default 25-45)
# Limit, same run: each run's pinned host-to-device rate (torch_flux.py
#   measures it after its steps): a sampling step's limit is max(the resident
#   step, its moved bytes / that rate); a training step's is bench/
#   train_bound.py's (each phase's copies against the resident run's phase;
#   and, where the runs recorded the backward's two parts, that plan's limit
#   with the ring counted).
# Prints: one JSON line a run appended to OUT/vram.jsonl (torch_flux.py's
#   record with "name" and vram_peak.py's "nvml" beside it); read it with
#   python3 bench/vram_summary.py OUT/vram.jsonl (a line a run: step, limit,
#   ratio, NVML peak against V, first step, set-up); each run's last stderr
#   lines in OUT/vram-errors.txt (two files in OUT, whatever the runs).
# Run: A=build/arena OUT=dir sh bench/gpu_vram.sh WORKDIR [SET...]
#   (default SETs: sample floor train pressure) on a machine with an NVIDIA
#   GPU, a CUDA build, torch and diffusers, the arena package importable
#   (PYTHONPATH=python ARENA_LIBRARY=build/libarena.so beside a build);
#   ~50 GB free in WORKDIR. DEADLINE: seconds after which no run starts
#   (default none).
set -u
A=${A:-build/arena}
OUT=${OUT:-.}
W=$1
shift
mkdir -p "$W" "$OUT"
T0=$(date +%s)
log() { echo "== $(date +%T) $*" >&2; }
SETS=${*:-sample floor train pressure}
IMG=$W/f.arena
# image NAME [--quant SCHEME]: W/NAME.arena from the synthesized weights
image() {
	n=$1
	shift
	[ -f "$W/$n.arena" ] && return
	if [ ! -f "$W/f.safetensors" ]; then
		log synth
		"$A" synth --layout flux-dev -q -o "$W/f.safetensors" || exit 1
	fi
	log "convert $n $*"
	"$A" convert -q --force "$@" "$W/f.safetensors" -o "$W/$n.arena" || exit 1
}
# every image the sets need, then the safetensors go (the plain set runs
# them first); at most the safetensors, the plain image and the quantized
# images at once (~66 GB)
for set in $SETS; do
	case $set in
	plain) ;;
	quant)
		image f8 --quant fp8-e4m3-row
		image i4 --quant int4-g64
		;;
	*) image f ;;
	esac
done
case " $SETS " in
*" plain "*) ;;
*) rm -f "$W/f.safetensors" ;;
esac
[ -f "$IMG" ] && cat "$IMG" >/dev/null # the page cache warm, as a second start would find it

# run NAME [vram_peak options] -- torch_flux.py arguments
run() {
	n=$1
	shift
	if [ -n "${DEADLINE:-}" ] && [ $(($(date +%s) - T0)) -gt "$DEADLINE" ]; then
		log "skip $n (deadline)"
		return
	fi
	log "$n"
	vp=
	while [ "$1" != -- ]; do
		vp="$vp $1"
		shift
	done
	shift
	timeout "${TO:-240}" python3 bench/vram_peak.py $vp -- python3 bench/torch_flux.py "$@" --image "${RUN_IMG:-$IMG}" \
		>"$W/run.out" 2>"$W/$n.err"
	{ echo "== $n"; grep -v 'kept in float32' "$W/$n.err" | tail -n 20; } >>"$OUT/vram-errors.txt"
	python3 bench/peak_record.py "$n" "$W/run.out" >>"$OUT/vram.jsonl" || { log "failed: $n"; tail -n 3 "$W/$n.err" >&2; }
}

# A process holding all of the device but `free` bytes (plain cudaMalloc),
# until it is killed: the card then looks that small to the others.
filler() {
	python3 - "$1" <<'PY' &
import ctypes, sys, time
rt = None
for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
    try:
        rt = ctypes.CDLL(name)
        break
    except OSError:
        pass
rt.cudaFree(None)
f, t = ctypes.c_size_t(), ctypes.c_size_t()
rt.cudaMemGetInfo(ctypes.byref(f), ctypes.byref(t))
want = f.value - int(float(sys.argv[1]) * 2**30)
p = ctypes.c_void_p()
if want > 0 and rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(want)) != 0:
    sys.exit("filler: cudaMalloc failed")
print("filler holds %.2f GiB" % (max(want, 0) / 2**30), file=sys.stderr, flush=True)
while True:
    time.sleep(3600)
PY
	FILLER=$!
	sleep "${FILLER_WAIT:-8}"
}

gib() { echo "$1" | sed 's/G$//'; }

for set in $SETS; do
	case $set in
	sample)
		run sample-resident -- arena-sample --steps 10
		for v in ${SAMPLE_V:-12G 8G 4G 3G}; do
			run "sample-$v" -- arena-sample --vram "$v" --steps 10
		done
		;;
	floor)
		for v in ${FLOOR_V:-2G 1792M}; do
			run "sample-$v" -- arena-sample --vram "$v" --steps 10
		done
		;;
	train)
		case " $SETS " in
		*" plain "*) ;; # plain-train is the resident step
		*) run train-resident -- arena-train --steps "${TRAIN_STEPS:-6}" ;;
		esac
		for v in ${TRAIN_V:-12G 8G 6G}; do
			run "train-$v" -- arena-train --vram "$v" --steps "${TRAIN_STEPS:-6}"
			for p in ${TRAIN_PIECES:-}; do
				run "train-$v-p$p" -- arena-train --vram "$v" --piece-size "$p" --steps "${TRAIN_STEPS:-6}"
			done
		done
		;;
	plain)
		if [ ! -f "$W/f.safetensors" ]; then
			log synth
			"$A" synth --layout flux-dev -q -o "$W/f.safetensors" || exit 1
		fi
		run sample-plain -- plain-sample --steps 10 --safetensors "$W/f.safetensors"
		run train-plain -- plain-train --steps "${TRAIN_STEPS:-6}" --safetensors "$W/f.safetensors"
		rm -f "$W/f.safetensors"
		;;
	quant)
		RUN_IMG=$W/f8.arena
		cat "$RUN_IMG" >/dev/null
		run sample-f8-resident -- arena-sample --steps 10
		run sample-f8-8G -- arena-sample --vram 8G --steps 10
		run train-f8-8G -- arena-train --vram 8G --steps 6
		RUN_IMG=$W/i4.arena
		cat "$RUN_IMG" >/dev/null
		run sample-i4-resident -- arena-sample --steps 10
		for v in ${INT4_V:-8G 4G}; do
			run "sample-i4-$v" -- arena-sample --vram "$v" --steps 10
		done
		RUN_IMG=
		;;
	pressure)
		filler "$(gib "${FREE:-16G}")"
		run pressure --pressure "${PRESSURE:-4G}@${PRESSURE_AT:-25-45}" -- arena-sample --steps "${PRESSURE_STEPS:-200}"
		kill "$FILLER" 2>/dev/null
		wait "$FILLER" 2>/dev/null
		;;
	*)
		echo "gpu_vram.sh: unknown set $set (sample floor plain train quant pressure)" >&2
		exit 2
		;;
	esac
done
