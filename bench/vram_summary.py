"""vram_summary.py - bench/gpu_vram.sh's runs read back: a line a run, the step against
its limit and the process's device memory (NVML, at its peak) against vram.

usage: python3 bench/vram_summary.py [-v] OUT/vram.jsonl

Sampling: the median of steps 2 on (the first step after attach is untimed and
shown apart; a work's first step runs the weights at their smallest) against
max(the resident run's step, the step's moved bytes / the run's own pinned
host-to-device rate). Training: bench/train_bound.py's limit (each phase's
copies against the resident run's phase, the optimizer's time added), over
its quiet steps; "x plan", the step against that plan's limit with the
ring counted (train_bound.py's second line), where the runs recorded the
backward's two parts. The peak is the process's whole device memory as the driver
counts it (bench/vram_peak.py), beside the vram it ran under. -v: each step's
time, and arena's view of the process after each step (process, context,
arena's, torch's, torch's need and limit: GiB).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_bound import limits  # noqa: E402

G = 2**30


def med(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def size(s):
    if not s:
        return None
    u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(s[:-1]) * u[s[-1]]) if s[-1] in u else int(s)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "-v"]
    verbose = "-v" in sys.argv[1:]
    if len(args) != 1:
        sys.exit(__doc__)
    runs = [json.loads(line) for line in open(args[0]) if line.strip()]
    res = {}
    for d in runs:
        # the resident step: the plain weights attached with nothing held back, or
        # torch alone (plain-*: the quant set's baseline), the latter preferred
        if d["name"] in ("sample-resident", "train-resident") and d["name"].split("-")[0] not in res:
            res[d["name"].split("-")[0]] = d
        if d["name"] in ("sample-plain", "train-plain"):
            res[d["name"].split("-")[0]] = d
    print("%-18s %8s %9s %9s %6s %6s %6s %9s %9s %6s %8s %7s" % (
        "run", "vram", "step s", "limit s", "x lim", "x plan", "x res", "peak GiB", "vram GiB", "fits", "first s",
        "setup"))
    for d in runs:
        kind = "train" if d["run"].endswith("-train") else "sample"
        r = res.get(kind)
        v = size(d.get("vram"))
        peak = (d.get("nvml") or {}).get("vram_peak_bytes")
        rate = d.get("h2d_bytes_per_s") or float("nan")
        recs = d.get("records", [])[1:]
        steps = d["steps_s"]
        plan_lim = None
        if kind == "sample":
            s = med(steps[1:])
            moved = med([x["moved_bytes"] for x in recs[1:]]) if len(recs) > 1 else 0
            rs = med(r["steps_s"][1:]) if r else float("nan")
            lim = max(rs, moved / rate)
        else:
            busy = [bool(x.get("plan_s") or x.get("demotions") or x.get("promotions")) for x in recs]
            quiet = [i for i in range(1, len(steps)) if i < len(busy) and not busy[i] and not busy[i - 1]]
            quiet = quiet or list(range(1, len(steps)))
            s = med([steps[i] for i in quiet])
            rs = med(r["steps_s"][1:]) if r else float("nan")
            if r and r.get("phases_s") and d.get("phases_s"):
                ph = r["phases_s"][1:]
                F, B, rest = (med([p[i] for p in ph]) for i in range(3))
                moved = med([recs[i]["moved_bytes"] for i in quiet if i < len(recs)]) if recs else 0
                lim, plan_lim, _ = limits(F, B, rest, r.get("backward_parts_s", [])[1:], d, moved, rate)
            else:
                lim = rs
        print("%-18s %8s %9.4f %9.4f %6.3f %6s %6.3f %9s %9s %6s %8.2f %7.2f" % (
            d["name"], d.get("vram") or "none", s, lim, s / lim, "%.3f" % (s / plan_lim) if plan_lim else "-",
            s / rs,
            "%.3f" % (peak / G) if peak is not None else "?", "%.3f" % (v / G) if v else "-",
            ("yes" if peak <= v else "NO") if (v and peak is not None) else "-",
            d.get("first_step_s", float("nan")), d.get("setup_s", float("nan"))))
        if verbose:
            print("   steps", [round(x, 4) for x in steps])
            for k, m in enumerate(d.get("memory_steps", [])[:12]):
                print("   mem %2d" % k, " ".join("%.2f" % (x / G) for x in m[:6]), "learned" if m[6] else "")
            p = d.get("nvml", {}).get("pressure")
            if p:
                print("   pressure", p)
                print("   resident GiB by step", [round(x["resident_bytes"] / G, 2) for x in d.get("records", [])])


if __name__ == "__main__":
    main()
