#!/bin/sh
# gpu_engine.sh - the residency engine alone on a machine with an NVIDIA GPU:
# `arena bench stream --backend cuda --tokens 4608` on a flux-dev image, a
# cuBLAS bf16 GEMM per acquired block or piece (2 x T x parameters FLOPs,
# T = 4608 rows: Flux at 1024x1024), no framework.
#
# Measures (RUNS, default "nocap cap8 cap12t cfg8 mixed12 pressure43";
#   STEPS steps each, default 10):
#   nocap      no cap, everything resident
#   cap8       --vram-cap 8G --mode sample (with a trace of its steps,
#              OUT/engine_cap8.trace.json: open it in https://ui.perfetto.dev)
#   cap12t     --vram-cap 12G --mode train
#   cfg8       8G, two passes a sample step (classifier-free guidance)
#   mixed12    12G training that stops for a two-pass preview every 3 steps
#   pressure   --pressure 20G@3 (given back at step 8) with all but
#              PRESSURE_DEVICE_FREE (default 24G) of the device held from the
#              start (--device-free), so the 20G bites: no failure, a
#              demotion within one step, a promotion after
#   pressure43 the same on a 43G card: the model and ~20G free beside it
#   pfloor     pieces of PIECE (default 128M) under --vram-cap PFLOOR_CAP
#              (default 1G; PDEPTH: --depth), with a trace
#   p8         the same pieces under an 8G cap
#   disk       8G cap, --host-budget HOST_BUDGET (default 5G): the streamed
#              blocks past it are read from the image each step (the disk
#              tier; from the page cache when the host holds the file:
#              bench/gpu_disk.sh measures it from a cold disk)
#   ARGS: more `bench stream` options for every run (e.g. "--reserve 1400M
#   --piece-size auto"); IMG: another flux-dev image (default WORKDIR/f.arena,
#   made by synth + convert when missing; bench/gpu_coded.sh passes an hb4 one).
# Limit, same run: the all-resident step (the same steps with every block
#   resident, in the same process) and the bound, max(compute, moved bytes
#   / the host-to-device rate measured in the same process), per step and
#   for the steady steps (after the first and after the last one that
#   changed the plan).
# Prints: two summary lines a run (step, bound, efficiency, the all-resident
#   step and the ratio to it, demotions, promotions, stalls, pressure), one
#   more for a traced run; each run's JSON in OUT/engine_NAME.json.
# Run: A=build/arena OUT=dir sh bench/gpu_engine.sh WORKDIR
#   with a CUDA build of arena; cuBLAS from CUDA's lib64 or from the pip
#   wheel torch uses; ~50 GB free in WORKDIR.
set -u
A=${A:-build/arena}
OUT=${OUT:-.}
W=$1
STEPS=${STEPS:-10}
mkdir -p "$W" "$OUT"
# cuBLAS is loaded at run time: CUDA's lib64, else the pip wheel PyTorch uses.
CB=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${CB:+:$CB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ST=$W/f.safetensors
IMG=${IMG:-$W/f.arena}
[ -f "$IMG" ] || {
	[ -f "$ST" ] || "$A" synth --layout flux-dev -o "$ST" >/dev/null || exit 1
	"$A" convert -q --force "$ST" -o "$IMG" || exit 1
	rm -f "$ST"
}
cat "$IMG" >/dev/null

summary() {
	python3 - "$1" "$2" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
d = json.load(open(path))
s = d["summary"]
st = d["steps"]
dem = [x["step"] for x in st if x["demotions"]]
pro = [x["step"] for x in st if x["promotions"]]
learned = [x["step"] for x in st if x.get("profile_learned")]
gst = sum(x.get("stall_s", 0) for x in st[s.get("steady_from", 1):]) / max(1, len(st) - s.get("steady_from", 1))
print("%-8s steady from %d: learned@%s  gpu stall %.4f s/step  misses %s  eff by step %s" % (name, s.get("steady_from", 1), learned, gst,
      [x.get("misses", 0) for x in st], [round(x["efficiency"], 3) for x in st]))
print("%-8s step %.4f s  bound %.4f s  eff %.3f  all-resident %.4f s (x%.3f)  compute=%s  h2d %.1f GB/s"
      "  stalls %d  demoted@%s promoted@%s  over_budget %d  pressure GiB %s"
      % (name, s["step_s"], s["bound_s"], s["efficiency"], s["all_resident_step_s"], s["vs_all_resident"],
         d["compute"], d["h2d_bytes_per_s"] / 1e9,
         sum(x["stalls"] for x in st), dem, pro, sum(x["over_budget"] for x in st),
         [round(x.get("pressure_bytes", 0) / 2**30, 1) for x in st]))
PY
}

# Per track: events, busy time per step; stalls; copy rates (median).
trace_summary() {
	[ -f "$2" ] || return
	python3 - "$1" "$2" <<'PY'
import json, statistics, sys
name, path = sys.argv[1], sys.argv[2]
d = json.load(open(path))
ev = d["traceEvents"]
steps = max(1, len([e for e in ev if e.get("cat") == "step" and not e["name"].endswith("end")]))
cp = [e for e in ev if e.get("cat") == "copy"]
co = [e for e in ev if e.get("cat") == "compute" and e["name"] != "globals"]
st = [e for e in ev if e.get("cat") == "stall"]
print("%-8s trace: %d steps, %d copies (%.1f ms/step busy, median %.1f GB/s), %d acquire-releases (%.1f ms/step), "
      "%d stalls (%.2f ms/step), dropped %d"
      % (name, steps, len(cp), sum(e["dur"] for e in cp) / 1e3 / steps,
         statistics.median([e["args"]["GB/s"] for e in cp]) if cp else 0, len(co),
         sum(e["dur"] for e in co) / 1e3 / steps, len(st), sum(e["dur"] for e in st) / 1e3 / steps,
         d["otherData"]["dropped_records"]))
PY
}

run() {
	name=$1
	shift
	# shellcheck disable=SC2086
	"$A" bench stream "$IMG" --backend cuda --tokens 4608 --json "$@" ${ARGS:-} >"$OUT/engine_$name.json" \
		2>"$OUT/engine_$name.err"
	rc=$?
	if [ $rc -ne 0 ]; then
		echo "$name: exit $rc: $(cat "$OUT/engine_$name.err")"
		return
	fi
	[ -s "$OUT/engine_$name.err" ] || rm -f "$OUT/engine_$name.err"
	summary "$name" "$OUT/engine_$name.json"
}

RUNS=${RUNS:-"nocap cap8 cap12t cfg8 mixed12 pressure43"}
for r in $RUNS; do
	case $r in
	nocap) run nocap --steps "$STEPS" ;;
	cap8)
		run cap8 --steps "$STEPS" --vram-cap 8G --mode sample --trace "$OUT/engine_cap8.trace.json"
		trace_summary cap8 "$OUT/engine_cap8.trace.json"
		;;
	cap12t) run cap12t --steps "$STEPS" --vram-cap 12G --mode train ;;
	cfg8) run cfg8 --steps "$STEPS" --vram-cap 8G --mode sample --passes 2 ;;
	mixed12) run mixed12 --steps 12 --vram-cap 12G --mode train --sample-every 3 --passes 2 ;;
	pressure) run pressure --steps 14 --device-free "${PRESSURE_DEVICE_FREE:-24G}" --pressure 20G@3 ;;
	pressure43) run pressure43 --steps 14 --device-free 43G --pressure 20G@3 ;;
	pfloor)
		run pfloor --steps "$STEPS" --vram-cap "${PFLOOR_CAP:-1G}" --mode sample --piece-size "${PIECE:-128M}" \
			${PDEPTH:+--depth "$PDEPTH"} --trace "$OUT/engine_pfloor.trace.json"
		trace_summary pfloor "$OUT/engine_pfloor.trace.json"
		;;
	p8) run p8 --steps "$STEPS" --vram-cap 8G --mode sample --piece-size "${PIECE:-128M}" ;;
	disk) run disk --steps "$STEPS" --vram-cap 8G --mode sample --host-budget "${HOST_BUDGET:-5G}" ;;
	esac
done
