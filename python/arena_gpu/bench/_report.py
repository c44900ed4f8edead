"""The README's table from the runs' records: each row's figure, its comparison,
its limit and the ratio between them; a row whose runs failed says why."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

GB = 1e9
GIB = float(1 << 30)


def _med(v: List[float]) -> float:
    s = sorted(v)
    return s[len(s) // 2]


def _num(x: float, fmt: str) -> str:
    """x by fmt, or to 3 significant digits where fmt would show it as 0.0."""
    return fmt % x if abs(x) >= 1 or x == 0 else "%.3g" % x


def _span(v: List[float], fmt: str) -> str:
    """'a–b' (the least and the most), or one figure."""
    lo, hi = _num(min(v), fmt), _num(max(v), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def size(n: float) -> str:
    """Bytes as GiB (2 decimals), or MiB / KiB below 0.1 GiB (the simulator's)."""
    if n >= GIB / 10:
        return f"{n / GIB:.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.0f} KiB"


def _gib(r: Dict[str, Any]) -> str:
    p = r.get("peak_bytes")
    return f" at {size(p)}" if p is not None else ""


class RowFailed(Exception):
    """A run a row needs failed or did not run: the one line the row shows."""


def _run(runs: Dict[str, Dict[str, Any]], name: str) -> Dict[str, Any]:
    r = runs.get(name)
    if r is None:
        raise RowFailed(f"{name} did not run")
    if not r.get("ok"):
        raise RowFailed(f"{name} failed: {r.get('error') or 'no record'}")
    return r


def _opt(runs: Dict[str, Dict[str, Any]], name: str) -> Optional[Dict[str, Any]]:
    r = runs.get(name)
    return r if r is not None and r.get("ok") else None


def _why_not(runs: Dict[str, Dict[str, Any]], name: str, skipped: Dict[str, str]) -> str:
    if name in skipped:
        return f"not run ({skipped[name]})"
    r = runs.get(name)
    if r is None:
        return "not run"
    return f"failed: {r.get('error') or 'no record'}"


def compute_of(runs: Dict[str, Dict[str, Any]], train: bool, per_block: bool) -> Tuple[Dict[str, Any], str, str]:
    """The compute a step is held to: the resident run's, or per-block compute's
    where the model does not fit (or --per-block asked for it). Returns its
    record, its name in the table and what the limit is said to be."""
    kind = "train" if train else "sample"
    if per_block:
        r = _run(runs, f"blocks-{kind}")
        return r, "per-block compute", "per-block compute"
    return _run(runs, f"{kind}-resident"), "resident", "resident compute"


def _train_limit(res_phases: List[List[float]], run: Dict[str, Any]) -> float:
    """bench/train_bound.py's per-phase limit: max(F, moved/2/rate) +
    max(B, moved/2/rate) + rest, F, B and rest the compute's phases (medians)."""
    F, B, rest = (_med([p[i] for p in res_phases]) for i in range(3))
    half = run["moved_bytes"] / 2 / run["link_bytes_per_s"]
    return max(F, half) + max(B, half) + rest


def build_rows(R: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The five rows (dicts: key, label, figure, comparison, limit_s or limit_gbps,
    limit_text, ratio, ratio_text, ok, error) from the results R (see __main__)."""
    runs: Dict[str, Dict[str, Any]] = R["runs"]
    skipped: Dict[str, str] = R.get("skipped", {})
    per_block = {"sample": R["per_block"]["sample"], "train": R["per_block"]["train"]}
    not_fit = R.get("per_block_why", "")
    caps = R["caps"]
    rows: List[Dict[str, Any]] = []

    def row(key: str, label: str, f: Any) -> None:
        d: Dict[str, Any] = {"key": key, "label": label, "ok": True, "error": None}
        try:
            f(d)
        except RowFailed as e:
            d.update(ok=False, error=str(e), figure=f"failed: {e}", comparison=d.get("comparison", ""))
        rows.append(d)

    # 1. load
    def load(d: Dict[str, Any]) -> None:
        ld = R.get("load")
        if not ld or not ld.get("runs"):
            raise RowFailed((ld or {}).get("error") or "arena load did not run")
        g = [x["gbps"] for x in ld["runs"]]
        bound = [x["limits"]["payload_bound_gbps"] for x in ld["runs"]]
        h2d = [x["limits"]["h2d_gbps"] for x in ld["runs"]]
        d["figure"] = _span(g, "%.1f") + " GB/s"
        st = _opt(runs, "st-load")
        cmp = (f"safetensors {_span([b / GB for b in st['bytes_per_s']], '%.1f')} GB/s" if st
               else f"safetensors {_why_not(runs, 'st-load', skipped)}")
        d["comparison"] = f"{cmp}; PCIe {_med(h2d):.1f}"
        d["limit_gbps"] = _med(bound)
        d["limit_text"] = (f"{d['limit_gbps']:.1f} GB/s (pinned host-to-device "
                           f"× the weights a stored byte carries, or the file's read rate)")
        d["ratio"] = _med(g) / d["limit_gbps"]
        d["ratio_text"] = f"{d['ratio']:.2f} of its bound"

    row("load", "load, warm page cache (hb4 image)", load)

    def streamed(d: Dict[str, Any], name: str, cmp_first: bool) -> None:
        r = _run(runs, name)
        d["figure"] = f"{r['step_s']:.3f} s{_gib(r)}"
        copy = r["moved_bytes"] / r["link_bytes_per_s"]
        comp = None
        comp_name, comp_what = "", ""
        try:
            c, comp_name, comp_what = compute_of(runs, False, per_block["sample"])
            comp = c["step_s"]
        except RowFailed as e:
            d["comparison"] = f"its copy limit {copy:.3f} s; the compute it is held to: {e}"
        d["limit_s"] = max(copy, comp or 0.0)
        d["limit_text"] = (f"{d['limit_s']:.3f} s: " + (f"its copy limit ({r['moved_bytes'] / GB:.2f} GB moved at "
                           f"{r['link_bytes_per_s'] / GB:.1f} GB/s)" if comp is None or copy >= comp
                           else f"{comp_what} ({comp_name})") + (f"; {not_fit}" if not_fit and comp is not None
                                                               and per_block["sample"] else ""))
        d["ratio"] = r["step_s"] / d["limit_s"]
        d["ratio_text"] = f"{d['ratio']:.3f} × its limit"
        if comp is None:
            return
        if cmp_first:
            if comp is not None and copy < comp:
                lim = f"its limit {d['limit_s']:.3f} s ({comp_what})"
            else:
                lim = f"its copy limit {copy:.3f} s"
            df = _opt(runs, "diffusers")
            dtxt = (f"diffusers group offloading {df['step_s']:.3f} s{_gib(df)}" if df
                    else f"diffusers group offloading {_why_not(runs, 'diffusers', skipped)}")
            d["comparison"] = f"{lim}; {dtxt}"
        else:
            c2, _, _ = compute_of(runs, False, per_block["sample"])
            if per_block["sample"]:
                d["comparison"] = (f"per-block compute {c2['step_s']:.3f} s (limit: per-block compute, "
                                   f"{not_fit or 'asked for'}); its limit {d['limit_s']:.3f} s")
            else:
                d["comparison"] = f"resident {c2['step_s']:.3f} s{_gib(c2)}"

    meter = "simulated" if R["backend"] == "sim" else "NVML"
    row("sample", f'sampling step, `vram="{caps["sample"]}"` (all the process holds, {meter})',
        lambda d: streamed(d, "sample-a", True))
    row("floor", f'sampling step, `vram="{caps["floor"]}"`', lambda d: streamed(d, "sample-b", False))

    # 4. training
    def train(d: Dict[str, Any]) -> None:
        names = [f"train-{i}" for i in range(len(caps["train"]))]
        rs = [_run(runs, n) for n in names]
        c, cname, cwhat = compute_of(runs, True, per_block["train"])
        lims = [_train_limit(c["phases_s"], r) for r in rs]
        ratios = [r["step_s"] / lim for r, lim in zip(rs, lims)]
        peaks = [r.get("peak_bytes") for r in rs]
        pk = (" at " + " / ".join(size(p) for p in peaks if p is not None)) \
            if all(p is not None for p in peaks) else ""
        their = "their limits" if len(rs) > 1 else "its limit"
        d["figure"] = (" / ".join(f"{r['step_s']:.3f}" for r in rs) + f" s{pk} ("
                       + " / ".join(f"{x:.3f}" for x in ratios) + f" × {their})")
        if per_block["train"]:
            d["comparison"] = f"per-block compute {c['step_s']:.3f} s (limit: per-block compute, {not_fit or 'asked for'})"
        else:
            d["comparison"] = f"resident {c['step_s']:.3f} s{_gib(c)}"
        d["limit_s"] = lims if len(lims) > 1 else lims[0]
        d["limit_text"] = ("; ".join(f"{lim:.3f} s" for lim in lims) + f": each phase (forward, backward) the longer "
                           f"of its {cwhat} and half the moved bytes at the link's rate, plus the optimizer")
        d["ratio"] = ratios if len(ratios) > 1 else ratios[0]
        d["ratio_text"] = " / ".join(f"{x:.3f}" for x in ratios) + f" × {their}"

    tv = " / ".join(f'"{v}"' for v in caps["train"])
    row("train", f"LoRA training step, `vram={tv}`", train)

    # 5. set-up
    def setup(d: Dict[str, Any]) -> None:
        ss = [r["setup_s"] for r in (_opt(runs, "sample-a"), _opt(runs, "sample-b")) if r]
        if not ss:
            raise RowFailed("the streamed sampling runs failed (above)")
        d["figure"] = _span(ss, "%.1f") + " s"
        df = _opt(runs, "diffusers")
        d["comparison"] = (f"diffusers group offloading {df['setup_s']:.1f} s" if df
                           else f"diffusers group offloading {_why_not(runs, 'diffusers', skipped)}")
        if not R.get("read_gbps") or not R.get("plain_bytes"):
            raise RowFailed("arena load did not run: no read rate to hold the set-up to")
        rate = R["read_gbps"] * GB
        d["limit_s"] = R["plain_bytes"] / rate
        d["limit_text"] = (f"{d['limit_s']:.2f} s: the image read once ({R['plain_bytes'] / GB:.2f} GB at "
                           f"{rate / GB:.1f} GB/s from the page cache, arena load's limit)")
        d["ratio"] = _med(ss) / d["limit_s"]
        d["ratio_text"] = f"{d['ratio']:.2f} × one read of the image"

    row("setup", "set-up (attach from a warm image)", setup)
    return rows


def table(R: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    head = R["title"]
    out = [f"| {head} | arena | for comparison |", "|---|---|---|"]
    for r in rows:
        cell = r["figure"] if r["ok"] else f"failed: {r['error']}"
        out.append(f"| {r['label']} | {cell.replace('|', '/')} | {r.get('comparison', '').replace('|', '/')} |")
    return "\n".join(out)


def summary(R: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    c = R["card"]
    link = R.get("link_gbps")
    parts = [f"{c['name']} ({c['total_bytes'] / GIB:.1f} GiB, driver {c['driver']})",
             f"pinned host-to-device {link:.1f} GB/s" if link else "pinned host-to-device rate not measured"]
    if R.get("read_gbps"):
        parts.append(f"the image read from the page cache at {R['read_gbps']:.1f} GB/s")
    if R.get("disk_gbps"):
        parts.append(f"from the disk (O_DIRECT) at {R['disk_gbps']:.2f} GB/s")
    parts.append(R["date"])
    ratios = [f"{r['key']} {r['ratio_text']}" if r["ok"] else f"{r['key']} failed" for r in rows]
    return "Measured by `python -m arena_gpu.bench" + (" --quick" if R["quick"] else "") + "` on " + \
        ", ".join(parts) + "; ratios to the limits measured in the same run: " + "; ".join(ratios) + "."
