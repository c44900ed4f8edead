"""gpu_dequant_check.py - arena_tensor_dequantize on the GPU against torch.

usage: python3 bench/gpu_dequant_check.py IMAGE [IMAGE ...]
       python3 bench/gpu_dequant_check.py --make DIR ARENA_BIN [IMAGE ...]

--make DIR ARENA_BIN: first make the int4 images the check needs (sources
of BF16, F16 and F32, two blocks of 2-D weights whose columns are a
multiple of 128, of 32 only, of none, fewer than a group, and one of
flux-dev's 3072 x 3072; each converted with int4-g32, int4-g64 and
int4-g128 by ARENA_BIN), then check them with the IMAGEs given.

For each image (opened on cuda, everything resident), every quantized
tensor is dequantized by arena (one kernel) and by torch
((qdata.float() * scale).to(dtype), on the same device; int4:
((q - z).float() * scale).to(dtype), the codes unpacked and the group's
scale and zero point spread over its columns) and compared bit for bit; then all of them are dequantized again, timed with CUDA events,
by arena and by the two torch kernels the adapter used before
(copy_ to the dtype, then mul_ by the scale; for int4 torch's whole
reference instead, several kernels), against the device's copy
rate (a device-to-device copy of as many bytes as arena moves) measured in
the same run: the limit. Prints one JSON line per image: mismatches, the
seconds of each, arena's GB/s and its fraction of the copy rate. Needs a
machine with an NVIDIA GPU, torch and the arena package; images made with
`arena convert --quant SCHEME` (int4-g32, int4-g64 and int4-g128 too:
make images of BF16, F16 and F32 sources with rows that are not a multiple
of 32 as well as ones that are, so that both of the kernel's paths run)."""

from __future__ import annotations

import json
import os
import sys

import torch

import arena_gpu as arena


def int4_values(ts: dict, n: str, shape: tuple, dtype: torch.dtype, group: int) -> torch.Tensor:
    """((q - z) * scale).to(dtype) of int4 tensor n from its components."""
    codes, scale, zero = ts[n], ts[n + "_scale"], ts[n + "_zero"]
    rows = codes.shape[0]
    cols = 1
    for d in shape:
        cols *= d
    cols //= rows
    q = torch.stack([codes & 15, codes >> 4], dim=2).reshape(rows, -1)[:, :cols].float()
    z = zero.float().repeat_interleave(group, dim=1)[:, :cols]
    s = scale.float().repeat_interleave(group, dim=1)[:, :cols]
    return ((q - z) * s).to(dtype).reshape(shape)


def reference(ts: dict, n: str, info, dt: torch.dtype) -> torch.Tensor:
    if info.scheme.startswith("int4-g"):
        return int4_values(ts, n, info.shape, dt, int(info.scheme[6:]))
    s = ts.get(n + "_scale")
    return (ts[n].float() * s if s is not None else ts[n].float()).to(dt)


# (rows, columns) of the --make sources' weights
SHAPES = ((64, 256), (33, 96), (7, 40), (5, 31), (3, 8), (3072, 3072))


def make(d: str, arena_bin: str) -> list:
    """Write the int4 sources into d and convert them; the images' paths."""
    import subprocess

    from safetensors.torch import save_file

    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    out = []
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        ts = {f"blocks.{b}.w{i}.weight": (torch.randn(r, c, generator=g) * 0.05).to(dt)
              for b in range(2) for i, (r, c) in enumerate(SHAPES)}
        src = os.path.join(d, f"int4-src-{str(dt)[6:]}.safetensors")
        save_file(ts, src)
        for scheme in ("int4-g32", "int4-g64", "int4-g128"):
            img = os.path.join(d, f"{scheme}-{str(dt)[6:]}.arena")
            subprocess.run([arena_bin, "convert", "-q", "--force", "--quant", scheme, src, "-o", img], check=True)
            out.append(img)
    return out


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--make"]:
        args = make(args[1], args[2]) + args[3:]
    for path in args:
        with arena.open(path, device="cuda") as a:
            names = [n for n in a.tensor_names() if a.tensor_info(n).scheme != "none"]
            infos = {n: a.tensor_info(n) for n in names}
            ts = a.tensors()
            dev = {n: a.block_state(a.tensor_info(n).block)[1] for n in names}
            bad, n_el, moved = [], 0, 0
            outs = {}
            for n in names:
                info = a.tensor_info(n)
                dt = arena.torch_dtype(info.dtype)
                want = reference(ts, n, info, dt)
                got = a.dequantize(n, dev[n], torch.empty(info.shape, dtype=dt, device="cuda"),
                                   torch.cuda.current_stream().cuda_stream)
                if not torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8)):
                    bad.append(n)
                outs[n] = got
                n_el += got.numel()
                moved += got.numel() * got.element_size() + sum(
                    t.numel() * t.element_size() for k, t in ts.items() if k == n or k.startswith(n + "_"))
            torch.cuda.synchronize()

            def timed(fn) -> float:
                fn()
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(3):
                    fn()
                e1.record()
                torch.cuda.synchronize()
                return e0.elapsed_time(e1) / 3e3

            stream = torch.cuda.current_stream().cuda_stream

            def by_arena() -> None:
                for n in names:
                    a.dequantize(n, dev[n], outs[n], stream)

            def by_torch() -> None:
                for n in names:
                    o = outs[n]
                    if infos[n].scheme.startswith("int4-g"):
                        o.copy_(reference(ts, n, infos[n], o.dtype))
                        continue
                    o.copy_(ts[n])
                    s = ts.get(n + "_scale")
                    if s is not None:
                        o.mul_(s)

            big = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
            big2 = torch.empty_like(big)
            t_arena, t_torch = timed(by_arena), timed(by_torch)
            t_copy = timed(lambda: big2.copy_(big))  # reads and writes moved bytes in all
            print(json.dumps({"image": path, "tensors": len(names), "elements": n_el, "mismatches": bad[:5],
                              "n_mismatches": len(bad), "arena_s": t_arena, "torch_s": t_torch,
                              "bytes_moved": moved, "arena_GBps": moved / t_arena / 1e9,
                              "d2d_copy_GBps": moved / t_copy / 1e9, "fraction_of_copy": t_copy / t_arena}))


if __name__ == "__main__":
    main()
