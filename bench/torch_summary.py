"""torch_summary.py - bench/torch_flux.py's JSON lines read back: one line a run, and the
LoRA gradients of arena's train runs against the plain model's.

usage: python3 bench/torch_summary.py [-v] RUNS.jsonl [WORKDIR]

RUNS.jsonl: torch_flux.py's output lines (bench/gpu_coded.sh's OUT/torch-f.jsonl, or one
run's line saved to a file). A line a run: its options, the median step, device memory
(all the process took after its CUDA context), peak host RSS, set-up, the bytes streamed
and moved a step, the resident bytes, and the step's limit for a streamed run: its moved
bytes over the pinned host-to-device rate the same process measured (h2d_bytes_per_s).
-v: a few lines more a run: each step's time, training phases, torch's memory, RSS by
kind, and from arena's records the budget, moves, disk tier reads and learned-profile
looks. WORKDIR: where the train runs saved their first step's gradients (--grads
WORKDIR/grads-plain-train-all.pt and grads-arena-train-*.pt): the largest difference of
each against the plain run's, beside the largest gradient."""

import glob
import json
import os
import sys

G = 2**30


def detail(d: dict) -> None:
    print("  setup", d.get("setup_s"), "open", d.get("open_s"), "steps", [round(x, 4) for x in d["steps_s"]])
    if d.get("phases_s"):
        print("  phases (forward, backward, rest)", [[round(x, 4) for x in p] for p in d["phases_s"]])
    print("  offload", d.get("offload"), "torch max reserved %.2f allocated %.2f GiB" % (
        d["torch_max_reserved"] / G, d.get("torch_max_allocated", 0) / G))
    print("  rss after set-up", {k: round(v / G, 2) for k, v in d.get("rss_after_setup", {}).items()},
          "after the steps", {k: round(v / G, 2) for k, v in d.get("rss_after_steps", {}).items()})
    if d.get("rest_trace"):
        print("  rest_trace", d["rest_trace"])
    r = d.get("records", [])
    if not r:
        return
    print("  budget GiB", [round(x.get("budget", 0) / G, 2) for x in r], "over", [x.get("over_budget") for x in r])
    print("  demotions", [x.get("demotions", 0) for x in r], "promotions", [x.get("promotions", 0) for x in r],
          "move_s", [round(x.get("move_s", 0) or 0, 3) for x in r],
          "promoted GB", [round((x.get("promoted_bytes", 0) or 0) / 1e9, 2) for x in r])
    print("  moved GB", [round(x.get("moved_bytes", 0) / 1e9, 2) for x in r], "stall s", [round(x.get("stall_s", 0) or 0, 3) for x in r])
    print("  disk GB", [round(x.get("disk_bytes", 0) / 1e9, 2) for x in r],
          "disk wait s", [round(x.get("disk_wait_s", 0) or 0, 3) for x in r])
    print("  looks (step, s, learned)", [(i, round(x["look_s"], 3), x.get("profile_learned")) for i, x in enumerate(r) if x.get("looked")],
          "held moves (step, est s, gain s)",
          [(i, round(x["move_est_s"], 3), round(x["move_gain_s"], 4)) for i, x in enumerate(r) if x.get("move_held")])


def main() -> None:
    args = sys.argv[1:]
    verbose = "-v" in args
    args = [a for a in args if a != "-v"]
    if not args:
        sys.exit(__doc__)
    rows = [json.loads(line) for line in open(args[0]) if line.strip().startswith("{")]
    rows = [r for r in rows if "run" in r and "step_s_median" in r]  # torch_flux.py's lines only
    for r in rows:
        pl = r.get("plan") or {}
        moved = r.get("moved_bytes_median", 0)
        rate = r.get("h2d_bytes_per_s")
        lim = " limit %.4f s (%.2f GB/s)" % (moved / rate, rate / 1e9) if moved and rate else ""
        print("%-16s vram %-6s res %-6s depth %-4s piece %-5s  step %.4f s%s  device %.2f GiB  rss %.2f GiB  setup %.2f s"
              "  streamed %.2f GB  moved %.2f GB  resident %.2f GiB" % (
                  r["run"], r.get("vram"), r.get("reserve"), r.get("depth"), r.get("piece_size"), r["step_s_median"], lim,
                  r["device_peak_bytes"] / G, r["host_peak_rss"] / G, r.get("setup_s", 0),
                  r.get("streamed_bytes_median", 0) / 1e9, moved / 1e9, pl.get("resident_bytes", 0) / G))
        if verbose:
            detail(r)
    if len(args) > 1:
        import torch

        w = args[1]
        ref = os.path.join(w, "grads-plain-train-all.pt")
        if os.path.exists(ref):
            a = torch.load(ref)
            for f in sorted(glob.glob(os.path.join(w, "grads-arena-train-*.pt"))):
                b = torch.load(f)
                d = max((a[k] - b[k]).abs().max().item() for k in a)
                m = max(a[k].abs().max().item() for k in a)
                print("%s: %d LoRA gradients, largest difference %.3g (largest gradient %.3g)" % (
                    os.path.basename(f), len(a), d, m))


if __name__ == "__main__":
    main()
