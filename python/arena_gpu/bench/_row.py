"""One row's run of ``python -m arena_gpu.bench``, in a process of its own.

  python -m arena_gpu.bench._row RUN --layout L --backend cuda|sim [--image I]
                                 [--safetensors S] [--vram V] [--warmup N] [--steps N]

RUN is one of
  sample          arena.torch.attach(model, image, vram=V), sampling steps (no V: resident)
  train           the same with mode="train": LoRA, AdamW, checkpointing on every block
  diffusers       diffusers' group offloading (block_level, use_stream) from CPU weights
  st-load         safetensors' load_file(device="cuda") of S, each of N times
  blocks-sample   per-block compute: each block's weights on the device one at a
                  time, its forward timed, summed, plus the rest of the model
  blocks-train    the same for a checkpointed training step: each block's forward,
                  then its forward and backward again (the recompute and backward)

It prints one line, ``ARENA_BENCH_ROW {json}``: the figures, this process's
pid, and for runs that stream the bytes a step moved and the pinned
host-to-device rate measured in this process after its steps; a failure is
``{"ok": false, "error": one line}`` and exit status 1. The device memory
the row takes is measured from outside (the parent's NVML meter); on the
simulated device the process reports its simulated peak itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any, Dict, List, Tuple

PREFIX = "ARENA_BENCH_ROW "

# The simulated device's link: copies modelled at this rate (bytes/s), the rate a
# streamed step on sim is held to.
SIM_LINK = 2e9


def _emit(rec: Dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(rec) + "\n")
    sys.stdout.flush()


def _device_opts(a: argparse.Namespace) -> Dict[str, Any]:
    if a.backend == "sim":
        return dict(device="sim", sim_capacity=a.sim_capacity, sim_bandwidth=SIM_LINK)
    return dict(device="cuda")


def _attached(a: argparse.Namespace, rec: Dict[str, Any]) -> None:
    import torch

    import arena_gpu.torch as at

    from ._flux import LAYOUTS, Device, TrainStep, add_lora, inputs, link_rate, median, meta_model, time_steps

    lay, dev = LAYOUTS[a.layout], Device(a.backend)
    train = a.run == "train"
    if dev.cuda:
        torch.cuda.init()
    m = meta_model(lay)
    t0 = time.perf_counter()
    kw: Dict[str, Any] = _device_opts(a)
    if a.vram:
        kw["vram"] = a.vram
    h = at.attach(m, a.image, mode="train" if train else "sample", **kw)
    rec["setup_s"] = time.perf_counter() - t0
    x = inputs(lay, dev)
    step: Any
    if train:
        add_lora(m, dev)
        m.enable_gradient_checkpointing()  # type: ignore[operator]
        m.train()
        step = TrainStep(m, x, dev)
    else:

        def step() -> None:
            with torch.no_grad():
                m(**x)

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    dev.sync()
    rec["warmup_s"] = time.perf_counter() - t0
    if dev.cuda:
        torch.cuda.reset_peak_memory_stats()
    marks = time_steps(step, a.steps, dev)
    rec["steps_s"] = [marks[i].to(marks[i + 1]) for i in range(a.steps)]
    rec["step_s"] = median(rec["steps_s"])
    if train:
        ph = step.marks[-a.steps:]
        rec["phases_s"] = [[marks[i].to(f), f.to(b), b.to(marks[i + 1])] for i, (f, b) in enumerate(ph)]
    st = h.stats()[-a.steps:]
    rec["moved_bytes"] = int(median([float(r["moved_bytes"]) for r in st]))
    rec["streamed_bytes"] = int(median([float(r["streamed_bytes"]) for r in st]))
    rec["stalls"] = sum(int(r["stalls"]) for r in st)
    pl = h.plan()
    rec["plan"] = {k: pl[k] for k in ("budget", "n_resident", "n_streamed", "resident_bytes", "streamed_bytes")
                   if k in pl}
    if a.backend == "sim":
        rec["sim_peak_bytes"] = h.arena.sim_peak()
    else:
        rec["torch_max_reserved"] = torch.cuda.max_memory_reserved()
    # the rate last, arena's memory given back first: the process then holds less
    # than in its steps, so the peak measured from outside is the steps'
    h.detach()
    if dev.cuda:
        torch.cuda.empty_cache()
        rec["link_bytes_per_s"] = link_rate(dev)
    else:
        rec["link_bytes_per_s"] = SIM_LINK


def _diffusers(a: argparse.Namespace, rec: Dict[str, Any]) -> None:
    import torch
    from safetensors.torch import load_file

    from ._flux import LAYOUTS, Device, inputs, median, meta_model, time_steps

    if a.backend != "cuda":
        raise RuntimeError("diffusers' group offloading needs a CUDA device (this run is on the simulator)")
    lay, dev = LAYOUTS[a.layout], Device(a.backend)
    torch.cuda.init()
    m = meta_model(lay)
    t0 = time.perf_counter()
    m.load_state_dict(load_file(a.safetensors, device="cpu"), assign=True)
    m.enable_group_offload(onload_device=torch.device("cuda"), offload_device=torch.device("cpu"),  # type: ignore[operator]
                           offload_type="block_level", num_blocks_per_group=1, use_stream=True)
    rec["setup_s"] = time.perf_counter() - t0
    x = inputs(lay, dev)

    def step() -> None:
        with torch.no_grad():
            m(**x)

    for _ in range(a.warmup):
        step()
    marks = time_steps(step, a.steps, dev)
    rec["steps_s"] = [marks[i].to(marks[i + 1]) for i in range(a.steps)]
    rec["step_s"] = median(rec["steps_s"])


def _st_load(a: argparse.Namespace, rec: Dict[str, Any]) -> None:
    import torch
    from safetensors.torch import load_file

    from ._flux import Device

    dev = Device(a.backend)
    if dev.cuda:
        torch.cuda.init()
    rates, secs = [], []
    for _ in range(max(1, a.steps)):
        dev.sync()
        t0 = time.perf_counter()
        sd = load_file(a.safetensors, device="cuda" if dev.cuda else "cpu")
        dev.sync()
        s = time.perf_counter() - t0
        n = sum(t.numel() * t.element_size() for t in sd.values())
        del sd
        if dev.cuda:
            torch.cuda.empty_cache()
        secs.append(s)
        rates.append(n / s)
    rec["bytes"] = n
    rec["seconds"] = secs
    rec["bytes_per_s"] = rates


def _materialize(mod: Any, device: Any) -> None:
    """A meta module's weights on ``device``, random (normal, std 0.02, as ``arena
    synth`` writes; a step's time does not depend on the values)."""
    import torch

    mod.to_empty(device=device)
    with torch.no_grad():
        for p in mod.parameters():
            if p.is_floating_point():
                p.normal_(0.0, 0.02)


def _tensors_map(obj: Any, f: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return f(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_tensors_map(o, f) for o in obj)
    if isinstance(obj, dict):
        return {k: _tensors_map(v, f) for k, v in obj.items()}
    return obj


def _blocks(a: argparse.Namespace, rec: Dict[str, Any]) -> None:
    """Per-block compute (the module's docstring): the limit of a card the model does
    not fit. The blocks' inputs are those the model's own forward gives them, each
    block's weights on the device only while it runs."""
    import torch

    from ._flux import LAYOUTS, Device, Mark, add_lora, inputs, median, meta_model

    lay, dev = LAYOUTS[a.layout], Device(a.backend)
    train = a.run == "blocks-train"
    if dev.cuda:
        torch.cuda.init()
    m = meta_model(lay)
    if train:
        add_lora(m, dev)  # on the meta device with its blocks: materialized with them
    containers = ("transformer_blocks", "single_transformer_blocks")
    blocks: List[torch.nn.Module] = [b for c in containers for b in getattr(m, c)]
    for name, child in m.named_children():
        if name not in containers:
            _materialize(child, dev.torch_device)
    x = inputs(lay, dev)
    spans: List[Tuple[Mark, Mark, Mark, Mark]] = []
    captured: List[Tuple[Any, Any]] = []
    capture = [True]
    cur: Dict[str, Mark] = {}

    def pre(mod: torch.nn.Module, args: Any, kwargs: Any) -> None:
        cur["p0"] = dev.mark()
        _materialize(mod, dev.torch_device)
        if capture[0]:
            captured.append((_tensors_map(args, lambda t: t.detach().clone()),
                             _tensors_map(kwargs, lambda t: t.detach().clone())))
        cur["a"] = dev.mark()

    def post(mod: torch.nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        b = dev.mark()
        mod.to_empty(device="meta")
        spans.append((cur["p0"], cur["a"], b, dev.mark()))

    hooks = [b.register_forward_pre_hook(pre, with_kwargs=True) for b in blocks]
    hooks += [b.register_forward_hook(post, with_kwargs=True) for b in blocks]
    fwd_block, fwd_rest = [], []
    for i in range(a.warmup + a.steps):
        spans.clear()
        dev.sync()
        s = dev.mark()
        with torch.no_grad():
            m(**x)
        e = dev.mark()
        dev.sync()
        capture[0] = False
        if i >= a.warmup:
            fwd_block.append(sum(p.to(q) for _, p, q, _ in spans))
            fwd_rest.append(s.to(e) - sum(p0.to(p1) for p0, _, _, p1 in spans))
    for hk in hooks:
        hk.remove()
    rec["n_blocks"] = len(blocks)
    rec["rest_forward_s"] = median(fwd_rest)
    if not train:
        rec["forward_blocks_s"] = median(fwd_block)
        rec["step_s"] = rec["forward_blocks_s"] + rec["rest_forward_s"]
        return
    # training: each block alone on its captured inputs, its weights (and its LoRA)
    # on the device: the step's forward (no graph kept: checkpointing), then the
    # recompute with the graph and the backward of the block's outputs
    f_s, b_s = [], []
    for blk, (args, kwargs) in zip(blocks, captured):
        _materialize(blk, dev.torch_device)
        for n_, p in blk.named_parameters():
            p.requires_grad_("lora_" in n_)

        def grad_in(t: torch.Tensor) -> torch.Tensor:
            return t.requires_grad_(True) if t.is_floating_point() and t.dim() == 3 else t

        fs, bs = [], []
        for i in range(a.warmup + a.steps):
            ar = _tensors_map(args, lambda t: grad_in(t.detach()))
            kw = _tensors_map(kwargs, lambda t: grad_in(t.detach()))
            t0 = dev.mark()
            with torch.no_grad():
                blk(*ar, **kw)
            t1 = dev.mark()
            out = blk(*ar, **kw)
            outs: List[torch.Tensor] = []
            _tensors_map(out, lambda t: outs.append(t))
            loss = sum(o.float().square().mean() for o in outs if o.requires_grad)
            loss.backward()  # type: ignore[union-attr]
            t2 = dev.mark()
            dev.sync()
            if i >= a.warmup:
                fs.append(t0.to(t1))
                bs.append(t1.to(t2))
        f_s.append(median(fs))
        b_s.append(median(bs))
        for p in blk.parameters():
            p.grad = None
        blk.to_empty(device="meta")
    # the optimizer: AdamW over tensors of the LoRA weights' shapes
    shapes = [p.shape for n_, p in m.named_parameters() if "lora_" in n_]
    ps = [torch.zeros(s, device=dev.torch_device, dtype=torch.bfloat16, requires_grad=True) for s in shapes]
    for t in ps:
        t.grad = torch.randn_like(t) * 1e-3
    opt = torch.optim.AdamW(ps, lr=1e-4)
    os_ = []
    for i in range(a.warmup + a.steps):
        t0 = dev.mark()
        opt.step()
        t1 = dev.mark()
        dev.sync()
        if i >= a.warmup:
            os_.append(t0.to(t1))
    rest_f = rec["rest_forward_s"]
    # the rest of the model (embedders, the output's norm and projection, no LoRA):
    # its backward counted as twice its forward
    rec["phases_s"] = [[sum(f_s) + rest_f, sum(b_s) + 2 * rest_f, median(os_)]]
    rec["step_s"] = sum(rec["phases_s"][0])


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m arena_gpu.bench._row")
    ap.add_argument("run", choices=["sample", "train", "diffusers", "st-load", "blocks-sample", "blocks-train"])
    ap.add_argument("--layout", default="flux-dev")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "sim"])
    ap.add_argument("--image")
    ap.add_argument("--safetensors")
    ap.add_argument("--vram")
    ap.add_argument("--sim-capacity", default="16G")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    rec: Dict[str, Any] = {"run": a.run, "vram": a.vram, "pid": os.getpid(), "ok": False}
    t_start = time.perf_counter()
    try:
        import torch

        torch.backends.cuda.enable_cudnn_sdp(False)  # its attention backward crashes on torch 2.11
        if a.run in ("sample", "train"):
            _attached(a, rec)
        elif a.run == "diffusers":
            _diffusers(a, rec)
        elif a.run == "st-load":
            _st_load(a, rec)
        else:
            _blocks(a, rec)
        rec["ok"] = True
    except BaseException as e:  # noqa: B902 - every failure becomes the row's one line
        if isinstance(e, KeyboardInterrupt):
            raise
        traceback.print_exc(file=sys.stderr)
        msg = str(e).strip().splitlines()
        rec["error"] = f"{type(e).__name__}: {msg[0] if msg else ''}".strip()
    rec["wall_s"] = time.perf_counter() - t_start
    _emit(rec)
    sys.exit(0 if rec["ok"] else 1)


if __name__ == "__main__":
    main()
