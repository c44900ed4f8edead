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

Where the runs recorded the backward in its two parts (torch_flux.py's
backward_parts_s: the single blocks, then the double blocks from the last
one's recompute on) and the arena run its blocks (which are resident, each
one's bytes) and its ring, a second line gives the limit of that plan with
the ring counted. The backward's copies cannot all run beside its compute
as the per-phase limit assumes: FLUX's single blocks come first and their
copies fit under their compute, the double blocks' (2.4 times the bytes for
about the same compute) do not, and what the single blocks' idle copy
time can fetch ahead for the double blocks is what the ring holds beside
the last single block (held until its backward ends). So

    B_plan = max(B_s, c_s) + max(B_d, c_d - carry / rate)

B_s, B_d the resident backward's two parts, c_s and c_d the streamed
bytes of each kind's blocks in the backward (moved_b shared between them by
their streamed bytes) over the rate, carry = min(ring - the last single
block's streamed bytes, the single part's idle copy time x rate, the
double blocks' bytes); that plan's limit is max(F, moved_f / rate) + B_plan
+ rest (a little under the per-phase one where copies bound both parts:
the ring's carry counted).
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


def plan_backward(parts, d, moved_b, rate):
    """The backward's limit with the ring counted (the module's docstring), or None
    without the records it needs."""
    if not parts or not d.get("blocks") or not d.get("plan_after"):
        return None
    bs, bd = (med([p[i] for p in parts]) for i in range(2))
    streamed = {"single": 0, "double": 0}
    last_single = 0
    for name, nbytes, resident in d["blocks"]:
        if resident:
            continue
        if name.startswith("single_transformer_blocks."):
            streamed["single"] += nbytes
            if name.split("#")[0] == "single_transformer_blocks.0":
                last_single += nbytes
        elif name.startswith("transformer_blocks."):
            streamed["double"] += nbytes
    total = streamed["single"] + streamed["double"]
    if not total:
        return None
    share = moved_b / total  # the bytes a streamed byte moves in the backward
    cs, cd = streamed["single"] * share / rate, streamed["double"] * share / rate
    pl = d["plan_after"]
    room = max(0, pl["slots"] * pl["slot_bytes"] - last_single * share)
    carry = min(room, max(0.0, bs - cs) * rate, streamed["double"] * share)
    return max(bs, cs) + max(bd, cd - carry / rate), bs, bd, cs, cd, carry


def limits(F, B, rest, parts, d, moved, rate):
    """A training run's limits: (per phase, that plan's with the ring counted or
    None, plan_backward's figures or None); moved: the bytes a step moved."""
    half = moved / 2 / rate
    pb = plan_backward(parts, d, moved / 2, rate)
    return max(F, half) + max(B, half) + rest, (max(F, half) + pb[0] + rest) if pb else None, pb


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    r = load(sys.argv[1])
    ph = r["phases_s"][1:]
    F, B, rest = (med([p[i] for p in ph]) for i in range(3))
    res_step = med(r["steps_s"][1:])
    parts = r.get("backward_parts_s", [])[1:]
    print("resident: step %.4f s, forward %.4f, backward %.4f%s, rest %.4f" % (
        res_step, F, B, " (single blocks %.4f, double %.4f)" % (med([p[0] for p in parts]), med([p[1] for p in parts]))
        if parts else "", rest))
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
        lim, lim_p, pb = limits(F, B, rest, parts, d, moved, rate)
        s = med(st)
        print("%s: %d quiet steps %.4f s (%.4f-%.4f), forward %.4f, backward %.4f; moved %.2f GB at %.2f GB/s: "
              "limit %.4f s; %.3f x the limit, %.3f x resident; device %.2f GiB, RSS %.2f GiB" % (
                  path, len(st), s, min(st), max(st), f, b, moved / 1e9, rate / 1e9, lim, s / lim, s / res_step,
                  d["device_peak_bytes"] / 2**30, d["host_peak_rss"] / 2**30))
        if pb is not None:
            bp, bs, bd, cs, cd, carry = pb
            got = d.get("backward_parts_s")
            mine = " (its backward: single %.4f, double %.4f)" % (
                med([got[i][0] for i in quiet]), med([got[i][1] for i in quiet])) if got else ""
            print("  with the ring counted: backward %.4f s (single blocks: compute %.4f, copies %.4f; double: "
                  "compute %.4f, copies %.4f less %.2f GB fetched ahead)%s: limit %.4f s; %.3f x the limit" % (
                      bp, bs, cs, bd, cd, carry / 1e9, mine, lim_p, s / lim_p))


if __name__ == "__main__":
    main()
