#!/usr/bin/env python3
"""share_host on GPUs: N processes (one per GPU, round robin) open one image
with a cap that streams, the first loading the host copies into the shared
region and the others mapping it; every block each acquires on its GPU must
hold the bytes a process without sharing gets.

    python3 bench/gpu_share_check.py IMAGE [--nproc N] [--vram 8G] [--steps 3]
    python3 bench/gpu_share_check.py TINY_FLUX.arena --sim --nproc 3 --vram 295K    (a dry run on the CPU)

Prints one JSON line a process (open seconds, host copies, the region's size
and this process's PSS of it, the share's state, and for a process that mapped
the region its check against the image: seconds, bytes checked and read, the
rate) and a last line: "ok" (every process shared as it should: the first
loaded, the others mapped; every block's bytes equal the reference's in every
process, the PSS of the region summed within 10 % of its size) or what
differed. The limit beside the check is measured in the same run: the
reference process's open without sharing (what a mapper saves by mapping).
Blocks are compared by two 64-bit sums of their bytes taken on the device
(host hashing of a 24 GB model each step would take minutes). Needs torch
with CUDA and the arena package (PYTHONPATH=python beside a CUDA build in
build/).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import re
import sys
import time
from typing import Any, Dict, List, Tuple


def region() -> Tuple[int, int]:
    """The memfd:arena-* mappings' bytes and this process's PSS of them."""
    size = pss = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                inside = "/memfd:arena-" in line
            elif inside and line.startswith("Size:"):
                size += int(line.split()[1]) << 10
            elif inside and line.startswith("Pss:"):
                pss += int(line.split()[1]) << 10
    return size, pss


def digest(t: Any) -> str:
    """A block's bytes, summed where they are: as 64-bit words, and each word
    mixed with itself shifted (the sums wrap; a block whose length is not a
    multiple of 8 has its tail summed byte by byte). The simulator's blocks
    are hashed on the host."""
    import torch

    if not t.is_cuda:
        return hashlib.sha1(t.numpy().tobytes()).hexdigest()
    n = t.numel() // 8 * 8
    w = t[:n].view(torch.int64)
    tail = int(t[n:].to(torch.int64).sum()) if n < t.numel() else 0
    return f"{int(w.sum())}:{int(torch.bitwise_xor(w, w >> 29).sum())}:{tail}"


def digests(a: Any, steps: int) -> List[str]:
    """Each block's bytes as acquired on the device, digested, over `steps` steps."""
    out: List[str] = []
    for _ in range(steps):
        a.step_begin()
        for b in a.blocks:
            addr = a.acquire(b.index)
            t = a.slab(b.index, addr)
            out.append(digest(t))
            del t
            a.release(b.index)
        a.step_end()
    return out


def sim_opts(args: Any) -> Dict[str, Any]:
    """--sim: the simulator with no slack, so that a small vram streams."""
    return dict(headroom=0, reserve=0, keep_last=0, piece_size=0) if args.sim else {}


def worker(i: int, args: Any, turn: Any, done: Any, q: Any) -> None:
    import torch

    import arena_gpu as arena

    dev: Any = "sim"
    if not args.sim:
        dev = i % torch.cuda.device_count()
        torch.cuda.set_device(dev)
    if i:
        turn.wait()  # the first loads; the others map what it loaded
    t0 = time.perf_counter()
    a = arena.open(args.image, device=dev, vram=args.vram, share_host=True, **sim_opts(args))
    t_open = time.perf_counter() - t0
    if not i:
        turn.set()
    share = a.share_info()
    d = digests(a, args.steps)
    p = a.plan()
    st = a.stats()
    done.wait()  # every process has mapped and stepped: PSS splits between them
    size, pss = region()
    row = {"process": i, "gpu": dev, "open_s": round(t_open, 3), "host_bytes": p["host_bytes"],
           "n_streamed": p["n_streamed"], "region_bytes": size, "pss": pss,
           "streamed_bytes": st[-1].get("streamed_bytes") if st else None,
           "share": share["state"], "why": share["why"], "digests": d}
    if share["state"] == "mapped":
        row.update(check_s=round(share["check_s"], 3), checked_bytes=share["checked_bytes"],
                   check_read_bytes=share["check_read_bytes"],
                   check_gb_s=round(share["checked_bytes"] / max(share["check_s"], 1e-9) / 1e9, 1))
    q.put(row)
    done.wait()  # all have measured: now they may let go
    a.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("image")
    ap.add_argument("--nproc", type=int, default=0, help="processes (default: one per GPU)")
    ap.add_argument("--vram", default="8G")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--sim", action="store_true", help="the simulator instead of GPUs (a dry run of this script)")
    args = ap.parse_args()
    import torch

    import arena_gpu as arena

    n = args.nproc or (2 if args.sim else torch.cuda.device_count())
    t0 = time.perf_counter()
    ref = arena.open(args.image, device="sim" if args.sim else 0, vram=args.vram, **sim_opts(args))  # no sharing
    ref_open = time.perf_counter() - t0
    ref_host = ref.plan()["host_bytes"]
    want = digests(ref, args.steps)
    ref.close()
    print(json.dumps({"reference": "one process, no sharing", "open_s": round(ref_open, 3), "host_bytes": ref_host}))
    ctx = mp.get_context("spawn")
    turn, done, q = ctx.Event(), ctx.Barrier(n + 1), ctx.Queue()
    ps = [ctx.Process(target=worker, args=(i, args, turn, done, q)) for i in range(n)]
    for p in ps:
        p.start()
    done.wait()
    rows: List[Dict[str, Any]] = sorted((q.get(timeout=600) for _ in range(n)), key=lambda r: r["process"])
    done.wait()
    for p in ps:
        p.join(timeout=120)
    bad = []
    for r in rows:
        if r["share"] != ("loaded" if r["process"] == 0 else "mapped"):
            bad.append(f"process {r['process']}: share {r['share']} {r['why']}")
        dg = r.pop("digests")
        if dg != want:
            bad.append(f"process {r['process']}: {sum(x != y for x, y in zip(dg, want))} blocks differ")
        print(json.dumps(r))
    size = rows[0]["region_bytes"]
    total = sum(r["pss"] for r in rows)
    if not size or abs(total - size) > size // 10:
        bad.append(f"the region's PSS summed is {total} for a region of {size} bytes")
    print("ok" if not bad else "; ".join(bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
