"""The card as NVML sees it, and a process's peak device memory as the driver counts it.

NVML is ``libnvidia-ml.so.1`` (it comes with the driver) through ctypes:
nothing is installed. :class:`Meter` reads the device-wide used memory
before a child process starts (before it has a CUDA context) and polls it
every 2 ms until the child exits: the child's peak is the most seen less
the figure before it, its CUDA context, its frameworks' allocators and
everything else it held at their worst (another process that takes memory
meanwhile would count too: run the benchmark on an otherwise idle card).
"""

from __future__ import annotations

import ctypes
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional


class _Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlError(Exception):
    pass


class Nvml:
    """Device ``index`` through NVML."""

    def __init__(self, index: int = 0) -> None:
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            raise NvmlError(f"NVML is not on this machine (libnvidia-ml.so.1: {e}): an NVIDIA driver is needed") from None
        r = self.lib.nvmlInit_v2()
        if r != 0:
            raise NvmlError(f"nvmlInit failed (NVML error {r}): is the NVIDIA driver loaded (nvidia-smi)?")
        self.dev = ctypes.c_void_p()
        r = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self.dev))
        if r != 0:
            raise NvmlError(f"no NVML device {index} (NVML error {r}): nvidia-smi lists the devices")
        self.m = _Mem()

    def memory(self) -> _Mem:
        r = self.lib.nvmlDeviceGetMemoryInfo(self.dev, ctypes.byref(self.m))
        if r != 0:
            raise NvmlError(f"nvmlDeviceGetMemoryInfo failed (NVML error {r})")
        return self.m

    def used(self) -> int:
        return int(self.memory().used)

    def process_used(self, pid: int) -> Optional[int]:
        """The device memory the driver counts for process ``pid`` (NVML's running
        compute processes), or None where NVML does not list it (another PID
        namespace, or no context yet)."""

        class Info(ctypes.Structure):
            _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                        ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

        n = ctypes.c_uint(64)
        arr = (Info * 64)()
        if self.lib.nvmlDeviceGetComputeRunningProcesses_v3(self.dev, ctypes.byref(n), arr) != 0:
            return None
        for i in range(min(n.value, 64)):
            if arr[i].pid == pid:
                return int(arr[i].usedGpuMemory)
        return None

    def _string(self, fn: Any, *args: Any) -> str:
        buf = ctypes.create_string_buffer(96)
        r = fn(*args, buf, ctypes.c_uint(len(buf)))
        return buf.value.decode(errors="replace") if r == 0 else "unknown"

    def card(self) -> Dict[str, Any]:
        """The card's name, its total memory and the driver's version."""
        m = self.memory()
        return {"name": self._string(self.lib.nvmlDeviceGetName, self.dev),
                "total_bytes": int(m.total), "free_bytes": int(m.free),
                "driver": self._string(self.lib.nvmlSystemGetDriverVersion)}


class Meter:
    """Runs a command under the meter: its peak device memory (NVML, device-wide,
    every ``every`` seconds from before it started); without NVML (the simulated
    device) it only runs it."""

    def __init__(self, nvml: Optional[Nvml], every: float = 0.002) -> None:
        self.nvml, self.every = nvml, every

    def run(self, cmd: List[str], timeout: float, env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """Runs cmd; returns rc, stdout, stderr (text), wall_s, and with NVML
        peak_bytes, baseline_bytes, polls and failed_polls (NVML read nothing). rc is None when it ran past timeout
        (it is killed)."""
        base = self.nvml.used() if self.nvml else 0
        peak = [base]
        polls, failed = [0], [0]
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        done = threading.Event()

        def poll() -> None:
            assert self.nvml is not None
            while not done.is_set():
                try:
                    u = self.nvml.used()
                except NvmlError:  # a poll that read nothing: counted, not a figure
                    failed[0] += 1
                    time.sleep(self.every)
                    continue
                polls[0] += 1
                if u > peak[0]:
                    peak[0] = u
                time.sleep(self.every)

        th = threading.Thread(target=poll, daemon=True) if self.nvml else None
        if th:
            th.start()
        rc: Optional[int]
        try:
            out, err = child.communicate(timeout=timeout)
            rc = child.returncode
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            rc = None
        done.set()
        if th:
            th.join()
        res: Dict[str, Any] = {"rc": rc, "stdout": out, "stderr": err, "wall_s": time.perf_counter() - t0}
        if self.nvml:
            res.update(peak_bytes=peak[0] - base, baseline_bytes=base, polls=polls[0], failed_polls=failed[0])
        return res
