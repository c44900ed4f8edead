"""vram_peak.py - a command's peak device memory as the driver counts it (GPU machine).

  python bench/vram_peak.py [--device 0] [--every 0.002] [--pressure SIZE@T0-T1] [--timeline FILE] -- CMD ARGS...

Reads NVML's device-wide used memory (nvmlDeviceGetMemoryInfo().used) before
CMD starts (so before CMD's process has a CUDA context), runs CMD, polls the
figure every 2 ms until CMD exits, and prints one JSON line: CMD's peak
(the most used seen less the figure before it started: its CUDA context,
its frameworks' allocators and everything else it held, at their worst), the
baseline, the number of polls, and the peak's time since CMD started. CMD's
own standard output (a JSON line from bench/torch_flux.py) is passed through
first, unchanged, so a driver can read both.

--pressure SIZE@T0-T1: another process takes SIZE of the device T0 seconds
after CMD starts and gives it back at T1 (plain cudaMallocs through
libcudart, no framework): memory pressure from outside. It takes SIZE in
chunks of --chunk (default 64M), trying each again every 5 ms until the
device has it (as a program whose allocator grows does), until T1. Its bytes are not
CMD's: the peak subtracts them while they are held (the other process's
own context included, measured when it starts); the polls while it takes
or gives them back (a few ms) are skipped and counted.

--timeline FILE: writes "EPOCH_SECONDS BYTES" lines, the command's use (as the
peak counts it) at each poll where it moved 16 MiB or more from the last line
written, and at the peak: when the peak happened, against the times a
harness prints (time.time()).

Nothing is installed: NVML is libnvidia-ml.so.1 through ctypes (it comes with
the driver). Exit status: CMD's.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time


class _Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Nvml:
    def __init__(self, index: int):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise SystemExit("vram_peak: nvmlInit failed")
        self.dev = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.dev)) != 0:
            raise SystemExit(f"vram_peak: no NVML device {index}")
        self.m = _Mem()

    def used(self) -> int:
        self.lib.nvmlDeviceGetMemoryInfo(self.dev, ctypes.byref(self.m))
        return int(self.m.used)


PRESSURE_SRC = r"""
import ctypes, sys, time
rt = None
for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
    try:
        rt = ctypes.CDLL(name); break
    except OSError:
        pass
if rt is None:
    import torch  # its runtime
    rt = ctypes.CDLL(torch.cuda._cudart._name if hasattr(torch.cuda, "_cudart") else "libcudart.so")
size, dev, chunk, deadline = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rt.cudaSetDevice(dev)
rt.cudaFree(None)  # the context
print("ctx", flush=True)
sys.stdin.readline()
# SIZE in chunks of CHUNK, each tried until it succeeds (as a program whose
# allocator grows finds the device full and tries again), for DEADLINE s at
# most; before each try the driver is told ("try") and answers, so that it
# does not count the chunk as the measured command's meanwhile
held, ptrs, t_end = 0, [], time.monotonic() + deadline
while held < size and time.monotonic() < t_end:
    n = min(chunk, size - held)
    print("try", flush=True)
    sys.stdin.readline()
    p = ctypes.c_void_p()
    if rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0:
        rt.cudaMemset(p, 1, ctypes.c_size_t(n))
        rt.cudaDeviceSynchronize()
        ptrs.append(p)
        held += n
        print("held %d" % held, flush=True)
    else:
        rt.cudaGetLastError()
        print("wait", flush=True)
        time.sleep(0.005)
print("done %d" % held, flush=True)
sys.stdin.readline()
for p in ptrs:
    rt.cudaFree(p)
rt.cudaDeviceSynchronize()
print("freed", flush=True)
sys.stdin.readline()
"""


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    opts, cmd = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    index, every, pressure, chunk, timeline = 0, 0.002, None, 64 << 20, None
    i = 0
    while i < len(opts):
        if opts[i] == "--device":
            index = int(opts[i + 1]); i += 2
        elif opts[i] == "--every":
            every = float(opts[i + 1]); i += 2
        elif opts[i] == "--timeline":
            timeline = open(opts[i + 1], "w"); i += 2
        elif opts[i] == "--chunk":
            chunk = parse_size(opts[i + 1]); i += 2
        elif opts[i] == "--pressure":
            size, _, span = opts[i + 1].partition("@")
            t0, _, t1 = span.partition("-")
            pressure = (parse_size(size), float(t0), float(t1)); i += 2
        else:
            print(f"vram_peak: unknown option {opts[i]}", file=sys.stderr)
            return 2
    nv = Nvml(index)
    other = 0  # bytes of the pressure process while it holds them (its context included)
    pp = None
    pinfo: dict = {}
    if pressure:
        b0 = nv.used()
        pp = subprocess.Popen([sys.executable, "-c", PRESSURE_SRC, str(pressure[0]), str(index), str(chunk),
                               str(max(0.0, pressure[2] - pressure[1]))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert pp.stdout and pp.stdin
        pp.stdout.readline()  # its context exists
        time.sleep(0.2)
        pinfo["context_bytes"] = nv.used() - b0
        other = pinfo["context_bytes"]
    base = nv.used() - other
    peak, peak_t, polls = base, 0.0, 0
    t_start = time.perf_counter()
    child = subprocess.Popen(cmd)
    state = {"other": other, "blind": False}
    blind = 0
    last = None  # the last use the timeline wrote

    def drive() -> None:
        if not pp:
            return
        assert pp.stdin and pp.stdout
        time.sleep(max(0.0, pressure[1] - (time.perf_counter() - t_start)))
        if child.poll() is not None:
            return
        pp.stdin.write("go\n"); pp.stdin.flush()
        while True:  # it takes its bytes chunk by chunk: each one known before it exists
            line = pp.stdout.readline().strip()
            if line == "try":
                state["blind"] = True
                pp.stdin.write("ok\n"); pp.stdin.flush()
            elif line.startswith("held "):
                held = int(line.split()[1])
                state["other"] = other + held
                state["blind"] = False
                pinfo.setdefault("first_chunk_at_s", round(time.perf_counter() - t_start, 3))
                pinfo["held_bytes"] = held
            elif line == "wait":
                state["blind"] = False
                pinfo["tries_refused"] = pinfo.get("tries_refused", 0) + 1
            else:  # "done N" (or the process is gone)
                pinfo["took"] = line
                pinfo["took_at_s"] = round(time.perf_counter() - t_start, 3)
                state["blind"] = False
                break
        time.sleep(max(0.0, pressure[2] - (time.perf_counter() - t_start)))
        state["blind"] = True
        pp.stdin.write("go\n"); pp.stdin.flush()
        pinfo["freed"] = pp.stdout.readline().strip()
        state["other"] = other
        state["blind"] = False
        pinfo["freed_at_s"] = round(time.perf_counter() - t_start, 3)

    th = threading.Thread(target=drive, daemon=True)
    th.start()
    while child.poll() is None:
        if state["blind"]:
            blind += 1
            time.sleep(every)
            continue
        u = nv.used() - state["other"]
        polls += 1
        if u > peak:
            peak, peak_t = u, time.perf_counter() - t_start
        if timeline and (last is None or abs(u - last) >= 16 << 20 or u == peak):
            timeline.write(f"{time.time():.3f} {u - base}\n")
            last = u
        time.sleep(every)
    rc = child.returncode
    if timeline:
        timeline.close()
    if pp:  # done with it, whatever it was doing: its memory goes with it
        pp.kill()
        pp.wait(timeout=30)
    out = {"vram_peak_bytes": peak - base, "vram_peak_gib": round((peak - base) / 2**30, 3), "baseline_bytes": base,
           "polls": polls, "peak_at_s": round(peak_t, 3), "wall_s": round(time.perf_counter() - t_start, 3), "rc": rc}
    if pressure:
        out["pressure"] = dict(pinfo, bytes=pressure[0], at_s=[pressure[1], pressure[2]], polls_skipped=blind)
    print("VRAM_PEAK " + json.dumps(out), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
