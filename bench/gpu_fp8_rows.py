"""gpu_fp8_rows.py - arena's row quantization kernel (arena_fp8_quantize_rows, the
native FP8 product's input) and its FP8 transpose (arena_fp8_transpose, the FP8
input gradient's weight operand) on the GPU: their bytes against torch's ops, and
their times against the device's copy rate.

usage: python3 bench/gpu_fp8_rows.py ANY.arena [--iters 50]

1. Bits. Every BF16 bit pattern (65,536: zeros, subnormals, every exponent, the
   infinities and NaNs) laid out in rows of each width the kernel treats its own
   way (8 to 4096 columns: 128 threads, each keeping its loads; 4104 to 16384:
   256 threads keeping them; wider: read twice; a width not a multiple of 8: one
   element at a time), each row's maximum set by a multiplier (rows of every
   magnitude: subnormal quotients, the 1e-12 floor), with the rows that hold an
   infinity or a NaN and those that do not; and with column scales
   (arena_fp8_quantize_rows_scaled). Scales and FP8 codes against the rules,
   arena.torch._fp8.quantize_rows_torch on the CPU, bit for bit but for a NaN's
   sign and payload (a NaN for a NaN: the platform's, docs/QUANT.md); against
   the same ops on the GPU; and how many rows' scales differ from torch's
   amax / 448 with 448 a Python scalar (on CUDA a product by its reciprocal).
2. Time. FLUX.1-dev's activations at 1024x1024 (4608 rows of 3072, 12288 and
   15360 columns, and 512 rows of 3072): the kernel's median time (CUDA events)
   against a device-to-device copy that moves as many bytes (the kernel reads 2
   bytes an element and writes 1: a copy of 1.5 bytes an element), the limit in
   the same run.

3. Host. What issuing one product costs the host (µs a call, the GPU kept
   busy by torch.cuda._sleep so that nothing waits; 4608 x 3072 by 3072 x
   3072): a BF16 F.linear with and without autograd, torch._scaled_mm alone,
   the rows' quantization, and F.linear on an arena.torch._fp8.Fp8Weight
   (the native path: dispatch, rows, autograd function, product) with and
   without autograd; and the device time of the BF16 and the native product
   (CUDA events over 50 calls).

4. Transpose. arena_fp8_transpose against torch's t().contiguous() byte for byte
   on FLUX.1-dev's weight shapes, shapes of multiples of 16 whose last tiles are
   partial, odd shapes and an address off the 16-byte grid (a byte a thread);
   its median time on FLUX.1-dev's shapes against torch's transposing copy and
   against a device-to-device copy of as many bytes (the limit, same run).

Prints one JSON line. Needs a CUDA GPU, torch and the arena package; ANY.arena
is any image (its arena gives the kernel)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Tuple

import torch

import arena_gpu as arena
from arena_gpu.torch import _fp8
from gpu_fp8_check import timed  # (bench/ is this script's folder: on sys.path)


def bad_rows(q: torch.Tensor, s: torch.Tensor, tq: torch.Tensor, ts: torch.Tensor) -> int:
    """Rows whose scale or codes differ (a NaN for a NaN: its sign and payload are the
    platform's, docs/QUANT.md)."""
    qb, tb = q.view(torch.uint8), tq.view(torch.uint8)
    q_nan, t_nan = (qb & 0x7F) == 0x7F, (tb & 0x7F) == 0x7F
    bad_q = torch.where(t_nan, ~q_nan, qb != tb)
    bad_s = torch.where(ts.isnan(), ~s.isnan(), s.view(torch.int32) != ts.view(torch.int32))
    return int((bad_q.any(1) | bad_s.any(1)).sum())


def compare(a: arena.Arena, x: torch.Tensor, cs: "torch.Tensor | None") -> Tuple[int, int]:
    """Rows of x whose scale or codes differ from the rules (torch's ops on the CPU),
    from torch's ops on the GPU (quantize_rows_torch), and whose scale differs from
    torch's with 448 as a Python scalar."""
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device)
    a.fp8_quantize_rows(x, q, s, col_scale=cs)
    rq, rs = _fp8.quantize_rows_torch(x.cpu(), None if cs is None else cs.cpu())
    tq, ts = _fp8.quantize_rows_torch(x, cs)
    return bad_rows(q.cpu(), s.cpu(), rq, rs), bad_rows(q, s, tq, ts), scalar_differs(x, cs, s)


def scalar_differs(x: torch.Tensor, cs: "torch.Tensor | None", s: torch.Tensor) -> int:
    """Rows whose scale differs from torch's (amax / 448) with 448 a Python scalar, on
    x's device (on CUDA: a product by 1/448)."""
    xf = x.float() if cs is None else x.float() * cs
    t = (xf.abs().amax(dim=1, keepdim=True) / 448.0).clamp(min=1e-12)
    return int((torch.where(t.isnan(), ~s.isnan(), s.view(torch.int32) != t.view(torch.int32))).sum())


def host_costs(dev: torch.device) -> Tuple[dict, dict]:
    """Host µs a call of each way to issue a product, and device µs of two."""
    import torch.nn.functional as F

    M, K, N = 4608, 3072, 3072
    x = torch.randn(M, K, dtype=torch.bfloat16, device=dev, requires_grad=True)
    xd = x.detach()
    wb = torch.randn(N, K, dtype=torch.bfloat16, device=dev) * 0.02
    bias = torch.randn(N, dtype=torch.bfloat16, device=dev)
    q, s = _fp8.quantize_rows(wb)
    w8 = _fp8.Fp8Weight(q, s, torch.bfloat16, True)
    xq, xs = _fp8.quantize_rows(xd)

    def host(fn, n: int = 100) -> float:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(int(3e9))  # the GPU busy: no call below waits for it
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        h = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        return round(h, 1)

    def device(fn, n: int = 50) -> float:
        for _ in range(3):
            fn()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return round(e0.elapsed_time(e1) / n * 1e3, 1)

    h = {"bf16_linear_autograd": host(lambda: F.linear(x, wb, bias)),
         "bf16_linear": host(lambda: F.linear(xd, wb, bias)),
         "scaled_mm": host(lambda: torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=s.view(1, N), bias=bias,
                                                    out_dtype=torch.bfloat16)),
         "quantize_rows": host(lambda: _fp8.quantize_rows(xd)),
         # a new input each call (rows not shared): x viewed anew is another tensor
         "fp8_linear_autograd": host(lambda: F.linear(x.view(M, K), w8, bias)),
         "fp8_linear": host(lambda: F.linear(xd.view(M, K), w8, bias))}
    with torch.no_grad():
        d = {"bf16_linear": device(lambda: F.linear(xd, wb, bias)),
             "fp8_linear": device(lambda: F.linear(xd.view(M, K), w8, bias)),
             "quantize_rows": device(lambda: _fp8.quantize_rows(xd))}
    return h, d


FLUX_WEIGHTS = ((3072, 3072), (12288, 3072), (3072, 12288), (3072, 15360), (18432, 3072), (9216, 3072))


def transposes(a: arena.Arena, dev: torch.device, g: torch.Generator, iters: int) -> Tuple[list, list]:
    """Section 4: (checks, times)."""
    checks = []
    for rows, cols, off in [(r, c, 0) for r, c in FLUX_WEIGHTS] + [(144, 400, 0), (16, 16, 0), (4096, 16, 0),
                                                                     (33, 77, 0), (1, 3072, 0), (3072, 1, 0),
                                                                     (256, 256, 1)]:
        base = torch.randint(0, 256, (rows * cols + off,), generator=g, dtype=torch.uint8).to(dev)
        x = base[off:].view(rows, cols).view(torch.float8_e4m3fn)  # off: x's address off the 16-byte grid
        t = torch.empty(cols, rows, dtype=torch.float8_e4m3fn, device=dev)
        a.fp8_transpose(x, t)
        want = x.view(torch.uint8).t().contiguous()
        checks.append({"rows": rows, "cols": cols, "offset": off,
                       "bad_bytes": int((t.view(torch.uint8) != want).sum())})
    times = []
    for rows, cols in FLUX_WEIGHTS:
        x = torch.randint(0, 256, (rows, cols), generator=g, dtype=torch.uint8).to(dev).view(torch.float8_e4m3fn)
        t = torch.empty(cols, rows, dtype=torch.float8_e4m3fn, device=dev)
        src = x.view(torch.uint8).view(-1)
        dst = torch.empty_like(src)
        t_k = timed(lambda: a.fp8_transpose(x, t), iters)
        t_t = timed(lambda: x.view(torch.uint8).t().contiguous(), iters)
        t_c = timed(lambda: dst.copy_(src), iters)
        times.append({"rows": rows, "cols": cols, "kernel_us": round(t_k * 1e6, 2), "torch_us": round(t_t * 1e6, 2),
                      "copy_us": round(t_c * 1e6, 2), "copy_over_kernel": round(t_c / t_k, 3),
                      "kernel_GBps": round(rows * cols * 2 / t_k / 1e9, 1)})
    return checks, times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("image")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    out: dict = {"device": torch.cuda.get_device_name(dev), "checks": []}
    g = torch.Generator(device="cpu").manual_seed(3)
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    finite = every[torch.isfinite(every.float())]
    with arena.open(args.image, device="cuda", vram="2G") as a:
        for cols in (8, 40, 3072, 4096, 4104, 12288, 15360, 16384, 20480):
            for name, vals in (("finite", finite), ("all", every)):
                n = vals.numel() // cols * cols or cols
                v = vals[torch.randperm(vals.numel(), generator=g)][:n] if vals.numel() >= n else \
                    vals.repeat(n // vals.numel() + 1)[:n]
                x = v.reshape(-1, cols)
                # rows of every magnitude: each row times 2^e, e from -140 to 120
                e = torch.randint(-140, 121, (x.shape[0], 1), generator=g).float()
                x = (x.float() * torch.exp2(e)).to(torch.bfloat16)
                x = torch.cat([x, v.reshape(-1, cols)]).to(dev)
                cs = (torch.rand(cols, generator=g) * torch.logspace(-6, 3, cols)).to(dev)
                (b, bt, bs), (bc, btc, bsc) = compare(a, x, None), compare(a, x, cs)
                out["checks"].append({"cols": cols, "values": name, "rows": x.shape[0], "bad_rows": b,
                                      "bad_rows_col_scale": bc, "torch_gpu_differs": bt + btc,
                                      "scalar_448_differs": bs + bsc})
        for cols in (3, 41):  # not a multiple of 8: one element at a time
            x = every[: 65536 // cols * cols].reshape(-1, cols).to(dev)
            b, bt, bs = compare(a, x, None)
            out["checks"].append({"cols": cols, "values": "all", "rows": x.shape[0], "bad_rows": b,
                                  "bad_rows_col_scale": None, "torch_gpu_differs": bt, "scalar_448_differs": bs})
        out["mismatched_rows"] = sum(c["bad_rows"] + (c["bad_rows_col_scale"] or 0) for c in out["checks"])
        times = []
        for rows, cols in ((4608, 3072), (4608, 12288), (4608, 15360), (512, 3072), (1, 3072)):
            x = (torch.randn(rows, cols, generator=g) * 0.5).to(torch.bfloat16).to(dev)
            q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn, device=dev)
            s = torch.empty(rows, 1, dtype=torch.float32, device=dev)
            src = torch.empty(rows * cols * 3 // 2, dtype=torch.uint8, device=dev)  # read + written: 3 bytes
            dst = torch.empty_like(src)
            t_k = timed(lambda: a.fp8_quantize_rows(x, q, s), args.iters)
            t_c = timed(lambda: dst.copy_(src), args.iters)
            times.append({"rows": rows, "cols": cols, "kernel_us": round(t_k * 1e6, 2),
                          "copy_us": round(t_c * 1e6, 2), "copy_over_kernel": round(t_c / t_k, 3),
                          "kernel_GBps": round(rows * cols * 3 / t_k / 1e9, 1)})
        out["times"] = times
        out["transpose_checks"], out["transpose_times"] = transposes(a, dev, g, args.iters)
        out["transpose_mismatches"] = sum(c["bad_bytes"] for c in out["transpose_checks"])
        undo = _fp8.use_arena(a)
        try:
            out["host_us"], out["device_us"] = host_costs(dev)
        finally:
            undo()
    print(json.dumps(out))
    return 0 if out["mismatched_rows"] == 0 and out["transpose_mismatches"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
