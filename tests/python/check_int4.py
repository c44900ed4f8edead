"""check_int4.py - the int4 schemes (docs/QUANT.md) against torch.

For BF16, F16 and F32 sources of several shapes (columns a multiple of the
group and not, fewer than a group, odd; rank 1, 2 and 3; a group of zeros,
all-positive and all-negative groups, exact ties of x / d), under int4-g32,
int4-g64 and int4-g128:
  - the image's components (codes two a byte, scales, zero points) equal what
    torch ops make of the source by the rule, byte for byte;
  - Arena.dequantize (arena_tensor_dequantize on sim) equals torch's
    ((q - z) * scale).to(dtype) of those components, bit for bit;
  - `arena export` writes the same components as <name>, <name>_scale and
    <name>_zero;
and a NaN or an infinity in a selected weight makes convert fail with a
message naming the tensor, and write nothing.

usage: check_int4.py ARENA_BIN WORKDIR
(the arena package importable; ARENA_LIBRARY names libarena.so when the
package is not installed). Prints a line per failure and "N passed, N failed";
exits 1 on failure.
"""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

import arena_gpu as arena

GROUPS = (32, 64, 128)


def int4_reference(x: torch.Tensor, n: int):
    """codes (packed, U8 [rows, ceil(cols / 2)]), scale ([rows, groups], x's
    dtype), zero points (U8 [rows, groups]) of x under int4 with groups of n."""
    rows = x.shape[0] if x.dim() >= 2 else 1
    xf = x.float().reshape(rows, -1)
    cols = xf.shape[1]
    ng = -(-cols // n)
    g = torch.nn.functional.pad(xf, (0, ng * n - cols)).reshape(rows, ng, n)  # zeros change neither lo nor hi
    lo = torch.clamp(g.amin(dim=2), max=0.0)
    hi = torch.clamp(g.amax(dim=2), min=0.0)
    scale = ((hi - lo) / 15).to(x.dtype)
    d = torch.where(scale == 0, torch.ones_like(lo), scale.float())
    zero = torch.clamp(torch.round(-lo / d), 0, 15)
    q = torch.clamp(torch.round(g / d[:, :, None]) + zero[:, :, None], 0, 15)
    q = q.reshape(rows, ng * n)[:, :cols].to(torch.uint8)
    if cols % 2:
        q = torch.cat([q, torch.zeros(rows, 1, dtype=torch.uint8)], dim=1)
    return q[:, 0::2] | (q[:, 1::2] << 4), scale, zero.to(torch.uint8)


def int4_values(codes, scale, zero, n, shape, dtype):
    """((q - z) * scale).to(dtype) from the components, with torch ops."""
    rows = codes.shape[0]
    q = torch.stack([codes & 15, codes >> 4], dim=2).reshape(rows, -1)
    cols = q.shape[1] if len(shape) == 0 else int(torch.tensor(shape).prod()) // rows
    q = q[:, :cols].float()
    z = zero.float().repeat_interleave(n, dim=1)[:, :cols]
    s = scale.float().repeat_interleave(n, dim=1)[:, :cols]
    return ((q - z) * s).to(dtype).reshape(shape)


def sources():
    g = torch.Generator().manual_seed(7)
    sd = {}
    for i, dt in enumerate((torch.bfloat16, torch.float16, torch.float32)):
        a = torch.randn(64, 200, generator=g) * torch.logspace(-4, 1, 200)  # magnitudes across the row
        a[0, :8] = torch.tensor([-7.0, -3.5, -0.5, 0.0, 0.5, 1.5, 2.5, 8.0])  # ties of x / d (scale 1, z 7)
        a[1, :128] = 0  # groups of zeros: scale 0
        a[2] = a[2].abs()  # zero point 0
        a[3] = -a[3].abs()  # zero point 15
        a[4, 3] = -0.0
        sd[f"blocks.{i}.a.weight"] = a.to(dt)
        sd[f"blocks.{i}.b.weight"] = torch.randn(7, 5, generator=g).to(dt)  # fewer columns than a group, odd
        sd[f"blocks.{i}.c.weight"] = torch.randn(3, 5, 27, generator=g).to(dt)  # rank 3: rows of 135
        sd[f"blocks.{i}.d.bias"] = (torch.randn(77, generator=g) * 1e-3).to(dt)  # rank 1: one row of 77
    return sd


def main(arena_bin: str, work: str) -> int:
    passed = failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
            print("FAIL " + what)

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return (a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
                and torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))

    sd = sources()
    src = os.path.join(work, "int4-src.safetensors")
    save_file(sd, src)
    for n in GROUPS:
        scheme = f"int4-g{n}"
        img = os.path.join(work, f"int4-{n}.arena")
        exp = os.path.join(work, f"int4-{n}.safetensors")
        subprocess.run([arena_bin, "convert", "-q", "--quant", scheme, "--quant-include", "*.bias",
                        "--quant-include", "*.c.weight", src, "-o", img], check=True)
        subprocess.run([arena_bin, "export", "-q", img, "-o", exp], check=True)
        out = load_file(exp)
        with arena.open(img, device="sim") as a:
            ts = a.tensors()
            a.step_begin()
            for name, x in sd.items():
                info = a.tensor_info(name)
                check(info.scheme == scheme, f"{scheme} {name}: stored {info.scheme}")
                want = int4_reference(x, n)
                got = (ts[name], ts[name + "_scale"], ts[name + "_zero"])
                for part, w, gt in zip(("codes", "scale", "zero"), want, got):
                    check(same(gt, w), f"{scheme} {name} {x.dtype}: {part} differ from torch's")
                for part, w, key in zip(("codes", "scale", "zero"), want, (name, name + "_scale", name + "_zero")):
                    check(key in out and same(out[key], w), f"{scheme} {name}: exported {part} differ")
                values = int4_values(*want, n, tuple(x.shape), x.dtype)
                addr = a.acquire(info.block)
                deq = a.dequantize(name, addr, torch.full(tuple(x.shape), 7, dtype=x.dtype))
                a.release(info.block)
                check(same(deq, values), f"{scheme} {name} {x.dtype}: dequantized values differ from torch's")
                # and they are the source's within half a step of its group
                err = (deq.float() - x.float()).abs().reshape(want[1].shape[0], -1)
                step = want[1].float().repeat_interleave(n, dim=1)[:, :err.shape[1]]
                check(bool((err <= step * 0.5 + step * 2**-7 + x.float().abs().reshape(err.shape) * 2**-7).all()),
                      f"{scheme} {name}: error past half a step ({float((err - step / 2).max())})")
            a.step_end()
    # refusals: NaN and infinity, named, nothing written
    for bad in (float("nan"), float("inf")):
        w = torch.randn(8, 100).to(torch.bfloat16)
        w[5, 70] = bad
        path = os.path.join(work, "int4-bad.safetensors")
        save_file({"blocks.0.a.weight": w}, path)
        img = os.path.join(work, "int4-bad.arena")
        r = subprocess.run([arena_bin, "convert", "-q", "--quant", "int4-g64", path, "-o", img],
                           capture_output=True, text=True)
        msg = r.stderr.strip()
        check(r.returncode != 0 and "tensor 'blocks.0.a.weight': int4-g64: row 5, columns 64 to 99 (group 1)" in msg
              and "NaN or an infinity" in msg, f"{bad}: convert gave {r.returncode}: {msg}")
        check(not os.path.exists(img), f"{bad}: a refused convert left {img}")
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
