"""wan_qwen_summary.py - bench/gpu_wan_qwen.sh's records read back as the tables of the
Wan 14B and Qwen-Image runs (Markdown).

usage: python3 bench/wan_qwen_summary.py OUT/wan_qwen.jsonl
       python3 bench/wan_qwen_summary.py --wan22 OUT/wan22.jsonl

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

--wan22: bench/gpu_wan22.sh's records (bench/torch_wan22.py: the Wan 2.2 A14B pipeline) as
the table of its videos, a row a run in the file's order: the weights it computed with
(bf16; an fp8 image's native FP8 products, or dequantized), vram, seconds a video (the
last video of the run: the text encoder, every denoising step, the decode) and its ratio to
resident's and to model offload's, each expert's median steady step, the switch step
(where boundary_ratio put it) and its extra seconds over the low-noise expert's steady
step, the switch's copies (its moved bytes over the pinned rate the same process measured:
the limit the switch's extra time is held to), the peak device memory (as above) against
vram, set-up seconds, host peak RSS, and whether the final latents are the resident run's
bit for bit (where the record says they should be: "no" there is a failure; native FP8 is
"differs (native FP8)"). A failed run's row says why; a resident run that did not fit says
so. The image's make record gives the line above the table.
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


WAN22_HEAD = ["run", "weights", "vram", "video s", "x resident", "x model offload", "steps (high/low)",
              "high step s", "low step s", "switch step (boundary)", "switch extra s", "switch copies s (moved at the link)",
              "peak", "peak <= vram", "set-up s", "host peak RSS", "latents = resident"]


def wan22_weights(r: Dict[str, Any]) -> str:
    w = weights(r)
    if w == "bf16":
        return "bf16"
    if r.get("run") == "arena":
        return f"{w}, native FP8" if r.get("fp8_native") else f"{w}, dequantized"
    return f"{w} dequantized to bf16"


def wan22_row(r: Dict[str, Any], res: Optional[Dict[str, Any]], off: Optional[Dict[str, Any]]) -> List[str]:
    name = r.get("name") or r.get("run", "?")
    head = [name, wan22_weights(r) if r.get("image_schemes") else "-", r.get("vram") or "none"]
    pad = [""] * (len(WAN22_HEAD) - 4)
    if r.get("skipped"):
        return head + [f"not run: {r['skipped']}"] + pad
    if not r.get("ok", "video_s" in r):
        return head + [f"failed: {r.get('error', 'no record')}"] + pad
    s = float(r["video_s"])
    per = r.get("per_expert") or {}
    hi, lo = per.get("transformer") or {}, per.get("transformer_2") or {}

    def sec(v: Any) -> str:
        return "-" if v is None else f"{float(v):.4f}"

    pk, where = peak(r)
    cap = size(r.get("vram"))
    copies = "-"
    if r.get("switch_moved_bytes") is not None and r.get("h2d_bytes_per_s"):
        copies = (f"{float(r['switch_moved_bytes']) / float(r['h2d_bytes_per_s']):.4g} "
                  f"({si(r['switch_moved_bytes'])} at {si(r['h2d_bytes_per_s'])}/s"
                  f"{', simulated' if r.get('link') == 'sim' else ''})")
    same = "-"
    if res is not None and r is not res:
        if r.get("out_hash") == res.get("out_hash"):
            same = "yes"
        elif r.get("bit_for_bit_with_resident") is False:
            same = "differs (native FP8)"
        else:
            same = "NO"
    rss = r.get("host_peak_rss")
    return head + [
        f"{s:.2f}",
        f"{s / float(res['video_s']):.3f}" if res else "-",
        f"{s / float(off['video_s']):.3f}" if off else "-",
        f"{r.get('steps')} ({hi.get('steps')}/{lo.get('steps')})",
        sec(hi.get("steady_median_s")), sec(lo.get("steady_median_s")),
        f"{r.get('switch_step')} ({r.get('boundary_step')})",
        sec(r.get("switch_extra_s")), copies,
        f"{nbytes(pk)} ({where})" if pk is not None else "-",
        ("yes" if pk <= cap else "NO") if (cap and pk is not None) else "-",
        f"{float(r['setup_s']):.2f}" if r.get("setup_s") is not None else "-",
        nbytes(rss) if rss else "-",
        same,
    ]


def wan22_tables(runs: List[Dict[str, Any]]) -> List[str]:
    """The Wan 2.2 pipeline's table: a table per resolution and step count."""
    lines: List[str] = []
    for r in runs:
        if r.get("run") == "make" and r.get("ok"):
            lines += ["", f"Image: {si(r['image_bytes'])} ({', '.join(r.get('image_schemes') or [])}), made in "
                          f"{float(r['make_s']):.1f} s at {nbytes(r['host_peak_rss'])} host peak RSS"]
    videos = [r for r in runs if r.get("run") in ("arena", "model-offload", "resident")]
    order: List[Tuple[Any, ...]] = []
    for r in videos:
        g = (r.get("resolution"), r.get("steps"), r.get("tiny"))
        if g not in order:
            order.append(g)
    for g in order:
        rr = [r for r in videos if (r.get("resolution"), r.get("steps"), r.get("tiny")) == g]
        ok = [r for r in rr if r.get("ok") and "video_s" in r]
        res = next((r for r in ok if r["run"] == "resident"), None)
        off = next((r for r in ok if r["run"] == "model-offload"), None)
        resol, steps, tiny = g
        lines += ["", f"### Wan 2.2 A14B pipeline{' (tiny)' if tiny else ''}, {resol}, {steps} steps a video"
                      + (f"; resident {float(res['video_s']):.2f} s" if res else "; no resident video"), ""]
        lines.append("| " + " | ".join(WAN22_HEAD) + " |")
        lines.append("|" + "---|" * len(WAN22_HEAD))
        for r in rr:
            lines.append("| " + " | ".join(wan22_row(r, res, off)) + " |")
    return lines


def main() -> None:
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--wan22":
        recs = []
        with open(args[1]) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    if r.get("harness") == "torch_wan22":
                        recs.append(r)
        if not recs:
            sys.exit(f"{args[1]}: no torch_wan22.py records")
        print("\n".join(wan22_tables(recs)).lstrip("\n"))
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    runs = []
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if "run" in r and "model" in r and "harness" not in r:  # torch_wan_qwen.py's records only
                    runs.append(r)
    if not runs:
        sys.exit(f"{sys.argv[1]}: no torch_wan_qwen.py records")
    print("\n".join(tables(runs)).lstrip("\n"))


if __name__ == "__main__":
    main()
