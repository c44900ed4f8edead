# gpu_call.sh - sourced by a device call's script (bench/runs/*/calls/callN.sh):
# the GPU machine's set-up for bench/torch_flux.py runs, and a runner that
# prints what each run recorded.
#
#   O=/tmp/w/o1 IMAGES="plain hb4" . bench/gpu_call.sh
#   t NAME RUN [torch_flux.py arguments]   # $O/NAME.jsonl, $O/NAME.err; a summary on stdout
#   bs NAME IMAGE [arena bench stream arguments]   # $O/NAME.json, $O/NAME.err; a summary on stdout
#
# Set-up: LD_LIBRARY_PATH for the carried gpu-libs, the carried wheels (.whl:
# diffusers) into /tmp/site, flux-dev from `arena synth` converted to
# $W/f.arena (IMAGES has plain), $W/fc.arena (hb4) and $W/fq.arena (fp8:
# fp8-e4m3-row), the safetensors removed
# unless KEEP_ST is set (plain-sample and diffusers-sample read it: --safetensors $ST).
# t skips a run once the call has run LATE seconds (default 470: a call has
# 600) and gives each TO seconds (default 110). The images are read once
# before each run (page cache warm, as a trainer's second start: convert
# writes with O_DIRECT, so without this a disk tier reads the disk). bs runs
# `$A bench stream IMAGE --backend cuda --json ...` (BIN=another build to
# compare) under the same rules and prints the median of steps 3 on.
set -u
T0=$(date +%s)
export LD_LIBRARY_PATH=$PWD/gpu-libs:/usr/local/cuda/lib64
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
	export PYTHONPATH=/tmp/site:$PWD/python || exit 1
A=${A:-build/arena}
W=${W:-/tmp/w}
mkdir -p "$O"
log() { echo "== $(date +%T) $*"; }
ST=$W/f.safetensors
IMGS=
log synth
for i in ${IMAGES:-plain hb4}; do
	case $i in plain) f=$W/f.arena c= ;; hb4) f=$W/fc.arena c="--codec hb4" ;; fp8) f=$W/fq.arena c="--quant fp8-e4m3-row" ;;
	*) echo "IMAGES: $i?"; exit 1 ;; esac
	IMGS="$IMGS $f"
	[ -f "$f" ] && continue
	[ -f "$ST" ] || $A synth --layout flux-dev -o "$ST" -q || exit 1
	log "convert $i"
	$A convert -q $c "$ST" -o "$f" || exit 1
done
[ -n "${KEEP_ST:-}" ] || rm -f "$ST"
t() {
	n=$1 r=$2
	shift 2
	[ $(($(date +%s) - T0)) -gt "${LATE:-470}" ] && { log "skip $n"; return; }
	log "torch $n"
	cat $IMGS >/dev/null
	timeout "${TO:-110}" python3 bench/torch_flux.py "$r" "$@" 2>"$O/$n.err" | tail -n 1 >"$O/$n.jsonl"
	python3 bench/torch_summary.py "$O/$n.jsonl" || tail -3 "$O/$n.err"
	python3 - "$O/$n.jsonl" <<'PY'
import json, sys
d = json.loads(open(sys.argv[1]).read())
G = 2**30
print("setup", d.get("setup_s"), "open", d.get("open_s"), "steps", [round(x, 4) for x in d["steps_s"]])
print("  phases", d.get("phases_s"))
print("  offload", d.get("offload"), "torch max reserved %.2f allocated %.2f GiB" % (d["torch_max_reserved"] / G, d.get("torch_max_allocated", 0) / G),
      "device peak %.2f steady %.2f GiB" % (d["device_peak_bytes"] / G, d.get("device_peak_steady_bytes", 0) / G))
print("  rss", {k: round(v / G, 2) for k, v in d.get("rss_after_setup", {}).items()}, {k: round(v / G, 2) for k, v in d.get("rss_after_steps", {}).items()})
print("  rest_trace", d.get("rest_trace"))
r = d.get("records", [])
print("  budget GiB", [round(x.get("budget", 0) / G, 2) for x in r], "over", [x.get("over_budget") for x in r][:4])
print("  moves", [x.get("demotions", 0) for x in r], [x.get("promotions", 0) for x in r], "move_s", [round(x.get("move_s", 0), 3) for x in r],
      "moved GB", [round(x["moved_bytes"] / 1e9, 2) for x in r][-4:], "stall", [round(x["stall_s"], 3) for x in r][-4:])
print("  disk GB", [round(x.get("disk_bytes", 0) / 1e9, 2) for x in r][-4:], "wait", [round(x.get("disk_wait_s", 0), 3) for x in r][-4:])
print("  looks", [(i, round(x["look_s"], 3), x.get("profile_learned")) for i, x in enumerate(r) if x.get("looked")],
      "held", [(i, round(x["move_est_s"], 3), round(x["move_gain_s"], 4)) for i, x in enumerate(r) if x.get("move_held")])
PY
}
bs() {
	n=$1 img=$2
	shift 2
	[ $(($(date +%s) - T0)) -gt "${LATE:-470}" ] && { log "skip $n"; return; }
	log "stream $n"
	cat "$img" >/dev/null
	timeout "${TO:-110}" "${BIN:-$A}" bench stream "$img" --backend cuda --json "$@" >"$O/$n.json" 2>"$O/$n.err" || { tail -3 "$O/$n.err"; return; }
	python3 - "$O/$n.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["steps"][2:]
med = lambda v: sorted(v)[len(v) // 2]
print("  step %.4f bound %.4f eff %.3f disk %.2f GB wait %.3f" % (med([x["time_s"] for x in s]), med([x["bound_s"] for x in s]),
      med([x["efficiency"] for x in s]), med([x["disk_bytes"] for x in s]) / 1e9, med([x["disk_wait_s"] for x in s])))
PY
}
