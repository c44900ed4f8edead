"""host_probe.py - what host memory for streamed blocks costs on this machine, cold and warm.

usage: python3 bench/host_probe.py GiB [--no-hugepage]

Maps GiB of anonymous memory as arena's host slabs are mapped (MADV_HUGEPAGE
unless --no-hugepage), touches every page (as the load fills them), then
registers it with CUDA (cudaHostRegister, as arena pins it; one thread) and
prints one JSON line: the seconds of each, the transparent hugepage settings
and /proc/meminfo's free, cached and hugepage figures before and after. Run it
twice on a machine just started to see what the first process pays: the
second run is the limit the first is held to. Needs libcudart.so on the
library path for the registration (skipped, with the error, without it)."""

from __future__ import annotations

import ctypes
import json
import mmap
import sys
import time


def meminfo() -> dict:
    keep = ("MemFree", "MemAvailable", "Cached", "Dirty", "AnonHugePages")
    out = {}
    for line in open("/proc/meminfo"):
        k, _, v = line.partition(":")
        if k in keep:
            out[k] = round(int(v.split()[0]) / 2**20, 2)
    return out


def sysfs(p: str) -> str:
    try:
        return open(p).read().strip()
    except OSError:
        return "?"


def main() -> None:
    n = int(float(sys.argv[1]) * 2**30)
    huge = "--no-hugepage" not in sys.argv
    res = {"gib": n / 2**30, "hugepage": huge, "before": meminfo(),
           "thp_enabled": sysfs("/sys/kernel/mm/transparent_hugepage/enabled"),
           "thp_defrag": sysfs("/sys/kernel/mm/transparent_hugepage/defrag")}
    t0 = time.perf_counter()
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    res["map_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ctypes.memset(addr, 1, n)
    res["touch_s"] = time.perf_counter() - t0
    res["after_touch"] = meminfo()
    try:
        cudart = ctypes.CDLL("libcudart.so")  # /usr/local/cuda/lib64 on LD_LIBRARY_PATH
    except OSError as e:
        res["register_error"] = str(e)
        cudart = None
    if cudart is not None:
        cudart.cudaFree(None)  # the context first
        t0 = time.perf_counter()
        rc = cudart.cudaHostRegister(ctypes.c_void_p(addr), ctypes.c_size_t(n), 0)
        res["register_s"] = time.perf_counter() - t0
        res["register_rc"] = rc
        t0 = time.perf_counter()
        cudart.cudaHostUnregister(ctypes.c_void_p(addr))
        res["unregister_s"] = time.perf_counter() - t0
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
