"""wan_qwen_summary.py - bench/gpu_wan_qwen.sh's records read back as the tables of the
Wan 14B and Qwen-Image runs (Markdown).

usage: python3 bench/wan_qwen_summary.py OUT/wan_qwen.jsonl

A table per model, kind (sampling, training) and resolution, a row a run in the file's
order: the median step (timed steps after the first), its ratio to the resident step
(the plain run of the same model, kind, resolution and text lengths: the BF16 model, so
an fp8 image's row is against BF16 resident), the step's copies (its moved bytes a
step, both passes, over the pinned host-to-device rate the same process measured: the
limit) and, sampling, the ratio to max(resident, copies); the peak device memory (NVML,
bench/vram_peak.py: the process's all, from before its CUDA context; without it the
process's own reading, or the simulated device's peak, marked so) against the run's
vram; set-up seconds, host peak RSS, and whether the first step's output is the
resident one's bit for bit (sampling: the guided prediction and the latents; training:
the LoRA gradients). A failed run's row says why. Then, for each model, kind and
weights, the smallest vram that ran and its step against resident, beside the next
smaller one that failed.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional, Tuple

G = 2**30


def size(s: Optional[str]) -> Optional[int]:
    """A size string ("8G", "512M", "60K") in bytes; None for none."""
    if not s or s == "none":
        return None
    u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = s.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(t[:-1]) * u[t[-1]]) if t[-1] in u else int(t)


def nbytes(n: float) -> str:
    for unit, k in (("GiB", G), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{int(n)} B"


def si(n: float) -> str:
    """Bytes in decimal units (GB, as the link's rate is given)."""
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{int(n)} B"


def kind(r: Dict[str, Any]) -> str:
    return "train" if str(r.get("run", "")).endswith("-train") else "sample"


def weights(r: Dict[str, Any]) -> str:
    """The image's storage: bf16 (no quantized tensors) or its schemes."""
    q = [s for s in r.get("image_schemes") or [] if s != "none"]
    return ",".join(q) or "bf16"


def group(r: Dict[str, Any]) -> Tuple[Any, ...]:
    return (r.get("model"), kind(r), r.get("resolution"), r.get("text_tokens"), r.get("neg_tokens"), r.get("tiny"))


def peak(r: Dict[str, Any]) -> Tuple[Optional[int], str]:
    """The run's peak device memory and where it was read."""
    nv = r.get("nvml") or {}
    if nv.get("vram_peak_bytes") is not None:
        return int(nv["vram_peak_bytes"]), "NVML"
    if r.get("device") == "cpu" and r.get("sim_peak_bytes") is not None:
        return int(r["sim_peak_bytes"]), "sim"
    if r.get("device_peak_bytes"):
        return int(r["device_peak_bytes"]), "process"
    return None, "-"


def copies_s(r: Dict[str, Any]) -> Optional[float]:
    moved, rate = r.get("moved_bytes_step"), r.get("h2d_bytes_per_s")
    if moved is None or not rate:
        return None
    return float(moved) / float(rate)


def row(r: Dict[str, Any], res: Optional[Dict[str, Any]]) -> List[str]:
    name = r.get("name") or r.get("run", "?")
    w, v = weights(r), r.get("vram") or "none"
    if not r.get("ok", "step_s_median" in r):
        err = str(r.get("error", "no record"))
        return [name, w, v, f"failed: {err}"] + [""] * 8
    s = float(r["step_s_median"])
    rs = float(res["step_s_median"]) if res else None
    cp = copies_s(r)
    pk, where = peak(r)
    cap = size(r.get("vram"))
    lim = max(rs or 0.0, cp or 0.0)
    same = "-"
    if res and r is not res:
        same = "yes" if r.get("out_hash") == res.get("out_hash") else "no"
    rss = r.get("host_peak_rss")
    copies = "-" if cp is None else (f"{cp:.4g} ({si(r['moved_bytes_step'])} at {si(r['h2d_bytes_per_s'])}/s"
                                     f"{', simulated' if r.get('link') == 'sim' else ''})")
    return [
        name, w, v, f"{s:.4f}",
        f"{s / rs:.3f}" if rs else "-",
        copies,
        f"{s / lim:.3f}" if (kind(r) == "sample" and lim > 0 and rs) else "-",
        f"{nbytes(pk)} ({where})" if pk is not None else "-",
        ("yes" if pk <= cap else "NO") if (cap and pk is not None) else "-",
        f"{float(r['setup_s']):.2f}" if r.get("setup_s") is not None else "-",
        nbytes(rss) if rss else "-",
        same,
    ]


HEAD = ["run", "weights", "vram", "step s", "x resident", "copies s (moved a step at the link)",
        "x max(resident, copies)", "peak", "peak <= vram", "set-up s", "host peak RSS", "out = resident"]


def resident_of(runs: List[Dict[str, Any]]) -> Dict[Tuple[Any, ...], Dict[str, Any]]:
    out: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for r in runs:
        if str(r.get("run", "")).startswith("plain-") and r.get("ok", True) and "step_s_median" in r:
            out.setdefault(group(r), r)
    return out


def tables(runs: List[Dict[str, Any]]) -> List[str]:
    lines: List[str] = []
    res = resident_of(runs)
    order: List[Tuple[Any, ...]] = []
    for r in runs:
        if group(r) not in order:
            order.append(group(r))
    for g in order:
        model, k, resol, tt, nt, tiny = g
        rs = res.get(g)
        lines.append("")
        lines.append(f"### {model}{' (tiny)' if tiny else ''}, {'sampling' if k == 'sample' else 'LoRA training'}, "
                     f"{resol}, text {tt}/{nt} tokens" + (f"; resident {rs['step_s_median']:.4f} s" if rs else
                                                          "; no resident run"))
        lines.append("")
        lines.append("| " + " | ".join(HEAD) + " |")
        lines.append("|" + "---|" * len(HEAD))
        for r in runs:
            if group(r) == g:
                lines.append("| " + " | ".join(row(r, rs)) + " |")
    lines.append("")
    lines.append("### The smallest vram that ran")
    lines.append("")
    lines.append("| model, kind, weights | smallest vram that ran | step s | x resident | peak | next smaller, failed |")
    lines.append("|---|---|---|---|---|---|")
    floors: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = {}
    for r in runs:
        if str(r.get("run", "")).startswith("arena-") and size(r.get("vram")):
            floors.setdefault((r.get("model"), kind(r), weights(r), r.get("resolution")), []).append(r)
    for (model, k, w, resol), rr in floors.items():
        ok = [r for r in rr if r.get("ok", True) and "step_s_median" in r]
        if not ok:
            bad = min(rr, key=lambda r: size(r.get("vram")) or 0)
            lines.append(f"| {model} {k} {w} {resol} | none ran | | | | {bad.get('vram')}: {bad.get('error', '')} |")
            continue
        best = min(ok, key=lambda r: size(r.get("vram")) or 0)
        lo = size(best.get("vram")) or 0
        failed = [r for r in rr if r not in ok and (size(r.get("vram")) or 0) < lo]
        nxt = max(failed, key=lambda r: size(r.get("vram")) or 0) if failed else None
        rs = next((v for gg, v in res.items() if gg[:3] == (model, k, resol)), None)
        s = float(best["step_s_median"])
        pk, where = peak(best)
        cells = [f"{model} {k} {w} {resol}", str(best.get("vram")), f"{s:.4f}",
                 f"{s / float(rs['step_s_median']):.3f}" if rs else "-",
                 f"{nbytes(pk)} ({where})" if pk is not None else "-",
                 f"{nxt.get('vram')}: {nxt.get('error', '')}" if nxt else "none tried"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    runs = []
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if "run" in r and "model" in r:  # torch_wan_qwen.py's records only
                    runs.append(r)
    if not runs:
        sys.exit(f"{sys.argv[1]}: no torch_wan_qwen.py records")
    print("\n".join(tables(runs)).lstrip("\n"))


if __name__ == "__main__":
    main()
