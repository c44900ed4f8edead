"""train_bound.py - a streamed training step against its limit, from bench/torch_flux.py runs.

usage: python3 bench/train_bound.py RESIDENT.jsonl RUN.jsonl [RUN.jsonl ...]

A checkpointed training step is two phases with a boundary between them
(the loss): the forward, and the backward (each block's recompute and
backward, in reverse). A streamed run copies its streamed blocks once in
each phase (the ring carries a few pieces across the turns), and no phase
can finish before its copies or its compute, so its limit is

    max(F, moved_f / rate) + max(B, moved_b / rate) + rest

F, B and rest (the optimizer) are the resident run's phase times (run
beside it, on the same machine), rate the pinned host-to-device rate the
run measured after its steps, moved_f = moved_b = half the bytes the engine
moved a step. Quiet
steps: neither that step's record nor the one before it planned or moved
blocks. Prints one line per run: its quiet steps (median and range) and
phases, the limit, and both ratios (to the limit, to the resident step).
The runs: bench/torch_flux.py plain-train or arena-train (no --vram) for
RESIDENT, arena-train --vram ... for each RUN, on the same machine, each
JSON line saved to its own file."""

from __future__ import annotations

import json
import sys


def med(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def load(p):
    return json.loads(open(p).read())


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    r = load(sys.argv[1])
    ph = r["phases_s"][1:]
    F, B, rest = (med([p[i] for p in ph]) for i in range(3))
    res_step = med(r["steps_s"][1:])
    print("resident: step %.4f s, forward %.4f, backward %.4f, rest %.4f" % (res_step, F, B, rest))
    for path in sys.argv[2:]:
        d = load(path)
        recs = d["records"][1:]  # records[0] is the untimed first step
        busy = [bool(x.get("plan_s") or x.get("demotions") or x.get("promotions")) for x in recs]
        quiet = [i for i in range(1, len(d["steps_s"])) if not busy[i] and not busy[i - 1]]
        if not quiet:
            print("%s: no quiet steps" % path)
            continue
        st = [d["steps_s"][i] for i in quiet]
        f = med([d["phases_s"][i][0] for i in quiet])
        b = med([d["phases_s"][i][1] for i in quiet])
        moved = med([recs[i]["moved_bytes"] for i in quiet])
        rate = d["h2d_bytes_per_s"]
        lim = max(F, moved / 2 / rate) + max(B, moved / 2 / rate) + rest
        s = med(st)
        print("%s: %d quiet steps %.4f s (%.4f-%.4f), forward %.4f, backward %.4f; moved %.2f GB at %.2f GB/s: "
              "limit %.4f s; %.3f x the limit, %.3f x resident; device %.2f GiB, RSS %.2f GiB" % (
                  path, len(st), s, min(st), max(st), f, b, moved / 1e9, rate / 1e9, lim, s / lim, s / res_step,
                  d["device_peak_bytes"] / 2**30, d["host_peak_rss"] / 2**30))


if __name__ == "__main__":
    main()
