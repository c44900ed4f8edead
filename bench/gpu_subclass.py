"""gpu_subclass.py - FLUX.1-dev quantized by torchao or optimum-quanto, resident and attached (GPU).

One run per process, so that a wrapper (bench/vram_peak.py) measures each
process's device memory alone:

  python3 bench/gpu_subclass.py resident LIB IMAGE [--steps 10]
  python3 bench/gpu_subclass.py arena LIB IMAGE [--vram 8G] [--steps 10]

LIB is how the transformer's Linear layers in its blocks (the modules named
*transformer_blocks*, as tests/python/test_torch.py quantizes the tiny Flux)
are quantized:

  torchao-f8  torchao.quantization.quantize_(m, Float8WeightOnlyConfig(), filter_fn=...)
  quanto-f8   optimum.quanto.quantize(m, weights=qfloat8, include=["*transformer_blocks*"]), freeze(m)

resident: the diffusers Flux transformer built on the GPU (each module's own
init under `with torch.device("cuda")`, seeded, then bf16), quantized with LIB,
sampling steps timed (torch.no_grad), then arena.torch.save_image(model, IMAGE)
writes the image the arena run attaches.
arena: the same model built on the meta device and quantized the same way (no
values: the weights' subclass types only), arena.torch.attach(m, IMAGE,
vram=V) (only vram given: every other option the product's default), the
same steps timed.

Prints one JSON line: run, lib, step_s (seconds of each timed step: CUDA
events on torch's stream between steps, the host not waiting between them;
the first step runs before them, untimed by events, and is first_step_s,
wall seconds to a synchronize), step_s_median, first_step_s, setup_s (all
before the first step) and its parts build_s, quantize_s (and attach_s),
torch_max_reserved (torch's allocator; arena resets the peak statistics at
every step end, so for arena runs it is the last step's), h2d_bytes_per_s
(pinned host-to-device copies, measured last: bench/torch_flux.py h2d_rate).
epoch_first_step and epoch_steps_end (time.time() when the first step starts and
the timed steps end: against bench/vram_peak.py --timeline), and for arena
runs memory_steps (h.arena.memory() after each step: process, other, arena,
rest, rest_need, rest_limit, learned).
resident adds save_image_s and image_bytes; arena adds plan (h.plan() after
attach) and records (h.stats(), one per step: streamed_bytes, moved_bytes,
misses...). quanto runs record quanto_marlin: false (see no_marlin).

The model is the FLUX.1-dev config (bench/torch_flux.py FLUX_DEV); 1024x1024:
4096 image tokens and 512 text tokens, batch 1, bf16. Needs a machine with an
NVIDIA GPU, torch, diffusers, torchao or optimum-quanto, and the arena
package; disk beside
IMAGE for save_image's temporary safetensors and the image (about 12 GB each
for FLUX.1-dev in FP8).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from torch_flux import FLUX_DEV, h2d_rate, inputs, with_memory_steps

LIBS = ("torchao-f8", "quanto-f8")


def in_blocks(fqn: str) -> bool:
    return "transformer_blocks" in fqn


def no_marlin() -> None:
    """optimum-quanto makes a qfloat8 weight on a CUDA device of capability >= 8 a
    MarlinF8QBytesTensor when its quanto_cuda extension is registered, and that
    extension is compiled on first use (minutes, with nvcc). A weight made on the meta
    device is never one (its device is not CUDA), so the arena run's model would hold
    WeightQBytesTensor while the resident one held Marlin's: the resident run would
    write an image of another type and time other kernels. Both runs therefore keep
    quanto's plain WeightQBytesTensor (its matmul: the weight scaled to bf16, then
    torch.matmul)."""
    import optimum.quanto.tensor.weights.qbytes as qbytes

    available = qbytes.is_extension_available

    def without_cuda(name: str) -> bool:
        return False if name == "quanto_cuda" else available(name)

    qbytes.is_extension_available = without_cuda


def quantize(m: torch.nn.Module, lib: str) -> None:
    """m's Linear layers in its blocks quantized in place by lib (as the adapter's tests do)."""
    if lib == "torchao-f8":
        from torchao.quantization import Float8WeightOnlyConfig, quantize_

        quantize_(m, Float8WeightOnlyConfig(), filter_fn=lambda mod, fqn: isinstance(mod, torch.nn.Linear) and in_blocks(fqn))
    elif lib == "quanto-f8":
        import optimum.quanto as oq

        no_marlin()
        oq.quantize(m, weights=oq.qfloat8, include=["*transformer_blocks*"])
        oq.freeze(m)
    else:
        sys.exit(f"unknown LIB {lib}: one of {', '.join(LIBS)}")
    m.requires_grad_(False)


def build(device: str) -> torch.nn.Module:
    """The FLUX.1-dev transformer in bf16: on "cuda" with each module's own init
    (seeded), on "meta" with no values."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    with torch.device(device):
        m = FluxTransformer2DModel(**FLUX_DEV).to(torch.bfloat16)
    m.requires_grad_(False)
    return m


def time_steps(step, n: int) -> list:
    """Device seconds of each of n steps: CUDA events recorded on torch's stream after
    each step, the host never waiting in between (bench/torch_flux.py time_steps)."""
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    ev[0].record()
    for i in range(n):
        step()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description="FLUX.1-dev quantized by torchao / optimum-quanto: resident or arena.torch.attach")
    ap.add_argument("run", choices=("resident", "arena"))
    ap.add_argument("lib", choices=LIBS)
    ap.add_argument("image", help="resident: the image save_image writes; arena: the image attached")
    ap.add_argument("--vram", default="8G", help="arena runs: attach(vram=...)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps after the first")
    a = ap.parse_args()
    torch.backends.cuda.enable_cudnn_sdp(False)  # as bench/torch_flux.py: flash attention
    torch.cuda.init()
    res: dict = {"run": a.run, "lib": a.lib}
    if a.lib == "quanto-f8":
        res["quanto_marlin"] = False  # no_marlin(): quanto's plain WeightQBytesTensor in both runs
    h = None
    t_setup = time.perf_counter()
    t0 = time.perf_counter()
    m = build("cuda" if a.run == "resident" else "meta")
    res["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    quantize(m, a.lib)
    if a.run == "resident":
        torch.cuda.synchronize()
    res["quantize_s"] = time.perf_counter() - t0
    if a.run == "arena":
        import arena_gpu.torch as at

        res["vram"] = a.vram
        t0 = time.perf_counter()
        h = at.attach(m, a.image, vram=a.vram)
        res["attach_s"] = time.perf_counter() - t0
        res["plan"] = h.plan()
    res["setup_s"] = time.perf_counter() - t_setup
    x = inputs()

    def step():
        with torch.no_grad():
            m(**x)

    if h is not None:  # arena's view of the process's memory after every step
        step = with_memory_steps(step, h, res)

    res["epoch_first_step"] = time.time()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    res["first_step_s"] = time.perf_counter() - t0
    res["step_s"] = time_steps(step, a.steps)
    res["epoch_steps_end"] = time.time()
    ss = sorted(res["step_s"])
    res["step_s_median"] = ss[len(ss) // 2]
    res["torch_max_reserved"] = torch.cuda.max_memory_reserved()
    res["torch_max_allocated"] = torch.cuda.max_memory_allocated()
    if h is not None:
        h.end_step()
        h.arena.sync()
        res["records"] = [{k: r[k] for k in ("mode", "streamed_bytes", "moved_bytes", "misses", "stalls", "stall_s", "resident_bytes")}
                          for r in h.stats()]
        # detach closes the arena: its memory given back before the rate probe, so that
        # a peak read from outside (bench/vram_peak.py) is the steps'
        h.detach()
    else:
        import arena_gpu.torch as at

        t0 = time.perf_counter()
        at.save_image(m, a.image, force=True)
        res["save_image_s"] = time.perf_counter() - t0
        res["image_bytes"] = os.path.getsize(a.image)
    del m, x
    torch.cuda.empty_cache()
    res["h2d_bytes_per_s"] = h2d_rate(256 << 20)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
