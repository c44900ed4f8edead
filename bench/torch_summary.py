"""One line per run of bench/gpu_torch.sh's torch.jsonl, and the LoRA gradients
of arena's train runs against the plain model's (largest difference).

usage: python3 bench/torch_summary.py OUT/torch.jsonl [WORKDIR]"""

import glob
import json
import os
import sys

G = 2**30
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip().startswith("{")]
for r in rows:
    pl = r.get("plan") or {}
    print("%-16s vram %-6s res %-6s depth %-4s piece %-5s  step %.4f s  device %.2f GiB  rss %.2f GiB  setup %.2f s"
          "  streamed %.2f GB  moved %.2f GB  resident %.2f GiB" % (
              r["run"], r.get("vram"), r.get("reserve"), r.get("depth"), r.get("piece_size"), r["step_s_median"],
              r["device_peak_bytes"] / G, r["host_peak_rss"] / G, r.get("setup_s", 0),
              r.get("streamed_bytes_median", 0) / 1e9, r.get("moved_bytes_median", 0) / 1e9,
              pl.get("resident_bytes", 0) / G))
if len(sys.argv) > 2:
    import torch

    w = sys.argv[2]
    ref = os.path.join(w, "grads-plain-train-all.pt")
    if os.path.exists(ref):
        a = torch.load(ref)
        for f in sorted(glob.glob(os.path.join(w, "grads-arena-train-*.pt"))):
            b = torch.load(f)
            d = max((a[k] - b[k]).abs().max().item() for k in a)
            m = max(a[k].abs().max().item() for k in a)
            print("%s: %d LoRA gradients, largest difference %.3g (largest gradient %.3g)" % (
                os.path.basename(f), len(a), d, m))
