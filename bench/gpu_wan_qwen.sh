#!/bin/sh
# gpu_wan_qwen.sh - Wan 2.1 T2V 14B and Qwen-Image sampling and LoRA training on a
# real card: arena's attach under several caps against the resident model and
# diffusers' group offloading (bench/torch_wan_qwen.py runs, one process each,
# every one under bench/vram_peak.py: NVML's device-wide used memory polled every
# 2 ms from before the process's CUDA context).
#
# Images (given: full-size random weights made by another tool, each one model,
# names as its save_pretrained writes them):
#   WAN        Wan 2.1 T2V 14B, bf16
#   QWEN       Qwen-Image, bf16
#   QWEN_FP8   Qwen-Image, fp8-e4m3-row (arena convert --quant fp8-e4m3-row)
# Sets (in the order given):
#   wan-sample       832x480x81 (32,760 tokens; CFG: both passes a step):
#                    resident; arena at each V of WAN_V (default 8G 12G 24G
#                    none); diffusers' block-level group offloading with a
#                    stream (diffusers), and with record_stream (diffusers-rs),
#                    and with record_stream and low_cpu_mem_usage
#                    (diffusers-low); DIFFUSERS: which (default stream rs low)
#   wan-train        LoRA r16, AdamW, the model's checkpointing, 832x480x81:
#                    resident; arena at each of WAN_TRAIN (default 24G
#                    16G:saved; V:saved adds --offload-saved SAVED, default on:
#                    offload_saved=True, the saved tensors of 1 MiB or more)
#   qwen-sample      1328x1328 (6,889 tokens), bf16: resident; arena at each
#                    V of QWEN_V (default 8G 12G 24G); the three diffusers runs
#   qwen-fp8-sample  1328x1328, the fp8 image, native FP8 products
#                    (--fp8-compute on): arena at each V of QWEN_FP8_V
#                    (default 8G 12G); against qwen-sample's resident
#   qwen-train       QWEN_TRAIN_RES (default 1024x1024): the bf16 model
#                    resident; arena on the fp8 image (native FP8) at each V of
#                    QWEN_TRAIN_V (default 12G 16G)
#   floor            the smallest vram each of wan-sample, wan-train,
#                    qwen-sample, qwen-fp8-sample and qwen-train runs at (Wan's
#                    training with --offload-saved SAVED): each V
#                    of FLOOR_V (default 6G 4G 3G 2G; largest first), stopping
#                    at the first that fails (its record says why)
# Limit, same run: each run's pinned host-to-device rate, measured by
#   torch_wan_qwen.py after its steps (arena's memory given back first): a
#   streamed step's copies take its moved bytes over it.
# Prints: one JSON line a run appended to OUT/wan_qwen.jsonl (torch_wan_qwen.py's
#   record, "name" and vram_peak.py's "nvml" beside it; a failed run's record
#   has "ok": false and its error); each run's last stderr lines in
#   OUT/wan_qwen-errors.txt. Read them with
#   python3 bench/wan_qwen_summary.py OUT/wan_qwen.jsonl (the tables).
# Run: WAN=... QWEN=... QWEN_FP8=... OUT=dir sh bench/gpu_wan_qwen.sh SET...
#   on a machine with an NVIDIA GPU, torch, diffusers, peft and accelerate, the
#   arena package importable (PYTHONPATH=python ARENA_LIBRARY=build/libarena.so
#   beside a build). STEPS: timed steps a run (default 5; the median is of
#   those after the first); TO: seconds a run may take (default 600); PY: the
#   Python (default python3); DEADLINE: seconds after which no run starts
#   (default none); ARGS: more torch_wan_qwen.py options for every run
#   ("--tiny --device cpu": the tiny configs on the CPU, as the tests run
#   it); METER=none: the runs without vram_peak.py (no NVML; "nvml": null).
set -u
OUT=${OUT:-.}
PY=${PY:-python3}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "== $(date +%T) $*" >&2; }

# run NAME ARGS...: one torch_wan_qwen.py run under the NVML meter, its record
# appended; status 1 when it ran and failed or left no record
run() {
	n=$1
	shift
	if [ -n "${DEADLINE:-}" ] && [ $(($(date +%s) - T0)) -ge "$DEADLINE" ]; then
		log "$n: not run (DEADLINE)"
		return 1
	fi
	log "$n"
	e=$OUT/wan_qwen-$n.err
	if [ "${METER:-nvml}" = none ]; then
		set -- "$PY" bench/torch_wan_qwen.py "$@"
	else
		set -- "$PY" bench/vram_peak.py -- "$PY" bench/torch_wan_qwen.py "$@"
	fi
	# shellcheck disable=SC2086 # ARGS: words added to every run
	timeout "${TO:-600}" "$@" --steps "${STEPS:-5}" ${ARGS:-} >"$OUT/run.out" 2>"$e"
	rc=$?
	{ echo "== $n (exit $rc)"; grep -v -e 'kept in float32' -e 'Unable to import' "$e" | tail -n 12; } \
		>>"$OUT/wan_qwen-errors.txt"
	rm -f "$e"
	"$PY" bench/peak_record.py "$n" "$OUT/run.out" >>"$OUT/wan_qwen.jsonl" || { log "failed: $n (no record)"; rc=1; }
	rm -f "$OUT/run.out"
	[ $rc = 0 ] || log "failed: $n"
	return $rc
}

need() { # need VAR: the image it names exists
	eval "v=\${$1:-}"
	if [ -z "$v" ] || [ ! -f "$v" ]; then
		echo "gpu_wan_qwen.sh: $1 must name an image (got '$v')" >&2
		exit 2
	fi
}

diffusers_runs() { # diffusers_runs SET MODEL IMAGE: those of DIFFUSERS
	for d in ${DIFFUSERS:-stream rs low}; do
		case $d in
		stream) run "$1-diffusers" diffusers-sample --model "$2" --image "$3" ;;
		rs) run "$1-diffusers-rs" diffusers-sample --model "$2" --image "$3" --record-stream ;;
		low) run "$1-diffusers-low" diffusers-sample --model "$2" --image "$3" --record-stream --low-cpu-mem-usage ;;
		*) log "unknown diffusers run $d (stream rs low)" ;;
		esac
	done
}

# floor NAME ARGS...: each V of FLOOR_V until one fails
floor() {
	what=$1
	shift
	for cap in ${FLOOR_V:-6G 4G 3G 2G}; do
		run "floor-$what-$cap" "$@" --vram "$cap" || break
	done
}

QWEN_TRAIN_RES=${QWEN_TRAIN_RES:-1024x1024}
for set in "$@"; do
	case $set in
	wan-sample)
		need WAN
		run wan-sample-plain plain-sample --model wan14b --image "$WAN"
		for v in ${WAN_V:-8G 12G 24G none}; do
			run "wan-sample-arena-$v" arena-sample --model wan14b --image "$WAN" --vram "$v"
		done
		diffusers_runs wan-sample wan14b "$WAN"
		;;
	wan-train)
		need WAN
		run wan-train-plain plain-train --model wan14b --image "$WAN"
		for v in ${WAN_TRAIN:-24G 16G:saved}; do
			case $v in
			*:saved) run "wan-train-arena-${v%:saved}-saved" arena-train --model wan14b --image "$WAN" \
				--vram "${v%:saved}" --offload-saved "${SAVED:-on}" ;;
			*) run "wan-train-arena-$v" arena-train --model wan14b --image "$WAN" --vram "$v" ;;
			esac
		done
		;;
	qwen-sample)
		need QWEN
		run qwen-sample-plain plain-sample --model qwen-image --image "$QWEN"
		for v in ${QWEN_V:-8G 12G 24G}; do
			run "qwen-sample-arena-$v" arena-sample --model qwen-image --image "$QWEN" --vram "$v"
		done
		diffusers_runs qwen-sample qwen-image "$QWEN"
		;;
	qwen-fp8-sample)
		need QWEN_FP8
		for v in ${QWEN_FP8_V:-8G 12G}; do
			run "qwen-fp8-sample-arena-$v" arena-sample --model qwen-image --image "$QWEN_FP8" --vram "$v" \
				--fp8-compute on
		done
		;;
	qwen-train)
		need QWEN
		need QWEN_FP8
		run qwen-train-plain plain-train --model qwen-image --image "$QWEN" --resolution "$QWEN_TRAIN_RES"
		for v in ${QWEN_TRAIN_V:-12G 16G}; do
			run "qwen-train-fp8-arena-$v" arena-train --model qwen-image --image "$QWEN_FP8" --vram "$v" \
				--fp8-compute on --resolution "$QWEN_TRAIN_RES"
		done
		;;
	floor)
		need WAN
		need QWEN
		need QWEN_FP8
		floor wan-sample arena-sample --model wan14b --image "$WAN"
		floor wan-train arena-train --model wan14b --image "$WAN" --offload-saved "${SAVED:-on}"
		floor qwen-sample arena-sample --model qwen-image --image "$QWEN"
		floor qwen-fp8-sample arena-sample --model qwen-image --image "$QWEN_FP8" --fp8-compute on
		floor qwen-train arena-train --model qwen-image --image "$QWEN_FP8" --fp8-compute on \
			--resolution "$QWEN_TRAIN_RES"
		;;
	*)
		echo "gpu_wan_qwen.sh: unknown set $set (wan-sample wan-train qwen-sample qwen-fp8-sample qwen-train floor)" >&2
		exit 2
		;;
	esac
done
