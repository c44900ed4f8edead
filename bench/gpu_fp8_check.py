"""gpu_fp8_check.py - native FP8 (attach's fp8_compute) against the dequantized path, on the GPU.

usage: python3 bench/gpu_fp8_check.py [--image FLUX-FP8.arena [--bf16 FLUX.arena]] [--iters 20]
                                      [--rows-image ANY.arena] [--model-vram none,8G]

1. FLUX.1-dev-shaped Linears (4608 tokens: 4096 image + 512 text; each of
   flux-dev's weight shapes), weights bf16 (normal, std 0.02) quantized
   fp8-e4m3-row and fp8-e4m3-tensor the way arena converts them: the native
   product (arena.torch._fp8.scaled_linear: the input quantized per row,
   torch._scaled_mm on the FP8 bytes with both scales) against F.linear on the
   dequantized weight, and both against the bf16 weight: the largest absolute
   difference and the cosine of the outputs, the input's gradient the same
   way (dequantized for it, and as an FP8 product: _fp8.scaled_grad_input),
   and the median time of each product and of each gradient (CUDA events,
   --iters runs).
2. With --image (flux-dev converted with --quant fp8-e4m3-row or
   fp8-e4m3-tensor): the whole transformer, 1024x1024, one sampling step and
   one checkpointed LoRA training step (r16, as bench/torch_flux.py), attached
   resident with fp8_compute=True and with fp8_compute=False, and at
   vram="8G" with each (--model-vram: which), training natively also with
   the input's gradient as an FP8 product (_fp8.GRAD_FP8): step times, how
   many products ran natively, and the outputs' and LoRA gradients'
   differences (native against dequantized; with --bf16, each against the
   bf16 image's).

Prints a JSON line for 1 and, with --image, one for 2. Needs a GPU with FP8 matmuls (compute capability 8.9
or more: Ada, Hopper and later), torch, diffusers, peft and the arena package
(bench/torch_flux.py's model and inputs)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import arena_gpu.torch as at  # noqa: E402
from arena_gpu.torch import _fp8  # noqa: E402

# flux-dev's Linear shapes (in, out): attention q/k/v/out and the context's, the
# feed-forward up and down, a single block's MLP and output, the modulations.
SHAPES = [(3072, 3072), (3072, 12288), (12288, 3072), (15360, 3072), (3072, 18432), (3072, 9216)]
TOKENS = 4608


def quantize(w: torch.Tensor, rows: bool):
    """arena's fp8-e4m3-row / fp8-e4m3-tensor (docs/QUANT.md): scale = max(amax / 448, 1e-12)."""
    wf = w.float()
    a = wf.abs().amax(dim=1, keepdim=True) if rows else wf.abs().amax().reshape(1)
    s = (a / 448.0).clamp(min=1e-12)
    return (wf / s).clamp(-448, 448).to(torch.float8_e4m3fn), s


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float().flatten(), b.float().flatten()
    return {"max_abs": (a - b).abs().max().item(), "cosine": F.cosine_similarity(a, b, dim=0).item(),
            "ref_max_abs": b.abs().max().item()}


def timed(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    return sorted(ts)[len(ts) // 2]


ROWS_ARENA = None  # --rows-image: an arena on the GPU whose kernel quantizes the input's rows


def one_pass(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, b: torch.Tensor, iters: int) -> dict:
    """The native product with the input's rows quantized by arena's kernel in one pass
    (arena_fp8_quantize_rows) against torch's ops: the same bytes? and the times."""
    if ROWS_ARENA is None:
        return {}
    undo = _fp8.use_arena(ROWS_ARENA)
    try:
        xq, xs = _fp8.quantize_rows(x)
        tq, ts = _fp8.quantize_rows_torch(x)
        return {"rows_equal": bool(torch.equal(xq.view(torch.uint8), tq.view(torch.uint8))
                                   and torch.equal(xs.view(torch.int32), ts.view(torch.int32))),
                "s_rows_one_pass": timed(lambda: _fp8.quantize_rows(x), iters),
                "s_rows_torch": timed(lambda: _fp8.quantize_rows_torch(x), iters),
                "s_native_one_pass": timed(lambda: _fp8.scaled_linear(x, q, s, b, torch.bfloat16), iters)}
    finally:
        undo()


def linears(iters: int) -> list:
    out = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for k, n in SHAPES:
        for rows in (True, False):
            w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
            b = (torch.randn(n, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
            x = torch.randn(TOKENS, k, generator=g, device="cuda").to(torch.bfloat16)
            q, s = quantize(w, rows)
            wd = _fp8.dequantize(q, s, torch.bfloat16)
            assert _fp8.native_ok(q, x, torch.bfloat16), "no FP8 matmul on this device or shape"
            y_nat = _fp8.scaled_linear(x, q, s, b, torch.bfloat16)
            y_deq = F.linear(x, wd, b)
            y_bf = F.linear(x, w, b)
            # the input's gradient through the frozen weight
            go = torch.randn(TOKENS, n, generator=g, device="cuda").to(torch.bfloat16)
            xn = x.clone().requires_grad_(True)
            _fp8._ScaledLinear.apply(xn, b, None, None, _fp8.native_args(q, s, torch.bfloat16)).backward(go)
            xd = x.clone().requires_grad_(True)
            F.linear(xd, wd, b).backward(go)
            xb = x.clone().requires_grad_(True)
            F.linear(xb, w, b).backward(go)
            undo = _fp8.use_arena(ROWS_ARENA) if ROWS_ARENA is not None else (lambda: None)
            try:
                gx8 = _fp8.scaled_grad_input(go, q, s, torch.bfloat16)
                s_grad_fp8 = timed(lambda: _fp8.scaled_grad_input(go, q, s, torch.bfloat16), iters)
            finally:
                undo()
            out.append({
                "in": k, "out": n, "scale": "row" if rows else "tensor",
                "native_vs_dequantized": compare(y_nat, y_deq),
                "native_vs_bf16": compare(y_nat, y_bf), "dequantized_vs_bf16": compare(y_deq, y_bf),
                "grad_native_vs_dequantized": compare(xn.grad, xd.grad),
                "grad_fp8_vs_bf16": compare(gx8, xb.grad), "grad_dequantized_vs_bf16": compare(xd.grad, xb.grad),
                "s_grad_fp8": s_grad_fp8,
                "s_grad_dequantize_and_matmul": timed(lambda: go.matmul(_fp8.dequantize(q, s, torch.bfloat16)), iters),
                "s_grad_dequantize_fast_and_matmul":
                    timed(lambda: go.matmul(_fp8.dequantize_fast(q, s, torch.bfloat16)), iters),
                "s_grad_bf16": timed(lambda: go.matmul(w), iters),
                "s_native": timed(lambda: _fp8.scaled_linear(x, q, s, b, torch.bfloat16), iters),
                **one_pass(x, q, s, b, iters),
                "s_dequantized_weight": timed(lambda: F.linear(x, wd, b), iters),
                "s_dequantize_and_linear": timed(lambda: F.linear(x, _fp8.dequantize(q, s, torch.bfloat16), b), iters),
                "s_bf16": timed(lambda: F.linear(x, w, b), iters),
            })
            del w, b, x, q, s, wd, y_nat, y_deq, y_bf, go, xn, xd, xb, gx8
            torch.cuda.empty_cache()
    return out


def model_runs(image: str, bf16: str | None, iters: int, vrams: tuple = (None, "8G")) -> dict:
    import torch_flux as tf

    calls = [0]
    real = _fp8.product

    def counted(*a, **k):
        calls[0] += 1
        return real(*a, **k)

    _fp8.product = counted
    torch.backends.cuda.enable_cudnn_sdp(False)

    def run(path: str, train: bool, **opts) -> dict:
        m = tf.meta_model()
        h = at.attach(m, path, mode="train" if train else "sample", device="cuda", **opts)
        calls[0] = 0
        res: dict = {}
        if train:
            tf.add_lora(m)
            m.enable_gradient_checkpointing()
            m.train()
            ps = {n: p for n, p in m.named_parameters() if p.requires_grad}

            def step() -> None:
                for p in ps.values():
                    p.grad = None
                m(**tf.inputs()).sample.float().square().mean().backward()

            step()
            res["grads"] = {n: p.grad.detach().float().cpu() for n, p in ps.items()}
        else:
            def step() -> None:
                with torch.no_grad():
                    res["out"] = m(**tf.inputs()).sample.float().cpu()

            step()
        res["native_calls"] = calls[0]
        res["s_step"] = timed(step, iters)
        res["streamed"] = h.plan()["n_streamed"]
        res["peak_reserved"] = torch.cuda.max_memory_reserved()
        h.detach()
        del m, h, step
        gc.collect()  # the module's cycles: its memory back before the next run's attach counts the process
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return res

    def grads_cmp(a: dict, b: dict) -> dict:
        ks = sorted(a["grads"])
        return compare(torch.cat([a["grads"][k].flatten() for k in ks]), torch.cat([b["grads"][k].flatten() for k in ks]))

    out: dict = {}
    for train in (False, True):
        kind = "train" if train else "sample"
        for vram in vrams:
            nat = run(image, train, vram=vram, fp8_compute=True)
            deq = run(image, train, vram=vram, fp8_compute=False)
            r = {"native": {k: v for k, v in nat.items() if k not in ("out", "grads")},
                 "dequantized": {k: v for k, v in deq.items() if k not in ("out", "grads")}}
            r["native_vs_dequantized"] = grads_cmp(nat, deq) if train else compare(nat["out"], deq["out"])
            if train:  # the input's gradient as an FP8 product (GRAD_FP8 on)
                _fp8.GRAD_FP8 = True
                try:
                    ndg = run(image, train, vram=vram, fp8_compute=True)
                finally:
                    _fp8.GRAD_FP8 = False
                r["native_fp8_grad"] = {k: v for k, v in ndg.items() if k not in ("out", "grads")}
                r["native_fp8_grad_vs_dequantized"] = grads_cmp(ndg, deq)
            if bf16 is not None and vram is None:
                ref = run(bf16, train)
                r["bf16"] = {k: v for k, v in ref.items() if k not in ("out", "grads")}
                r["native_vs_bf16"] = grads_cmp(nat, ref) if train else compare(nat["out"], ref["out"])
                r["dequantized_vs_bf16"] = grads_cmp(deq, ref) if train else compare(deq["out"], ref["out"])
                if train:
                    r["native_fp8_grad_vs_bf16"] = grads_cmp(ndg, ref)
            out[f"{kind}_{vram or 'resident'}"] = r
    _fp8.product = real
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image")
    ap.add_argument("--bf16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rows-image", help="any image: opened on the GPU for arena's one-pass row quantization")
    ap.add_argument("--model-vram", default="none,8G",
                    help="the model runs' vram values, comma-separated (none: resident); default none,8G")
    a = ap.parse_args()
    global ROWS_ARENA
    if a.rows_image:
        import arena_gpu as arena

        ROWS_ARENA = arena.open(a.rows_image, device="cuda")
    dev = torch.device("cuda")
    res: dict = {"device": torch.cuda.get_device_name(dev), "capability": list(torch.cuda.get_device_capability(dev)),
                 "has_fp8": _fp8.device_has_fp8(dev), "torch": torch.__version__}
    res["linears"] = linears(a.iters)
    if ROWS_ARENA is not None:
        ROWS_ARENA.close()  # its resident weights are this process's: closed before the model runs' caps
        ROWS_ARENA = None
    print(json.dumps(res), flush=True)  # the products' line, kept if a model run fails
    if a.image:
        vrams = tuple(None if v == "none" else v for v in a.model_vram.split(","))
        print(json.dumps({"model": model_runs(a.image, a.bf16, max(3, a.iters // 4), vrams)}), flush=True)


if __name__ == "__main__":
    main()
