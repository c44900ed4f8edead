"""gpu_quant_check.py - a quantized image in a streamed training step, on the GPU.

usage: python3 bench/gpu_quant_check.py IMAGE

flux-dev from IMAGE (an image converted with --quant), LoRA r16 as in
bench/torch_flux.py, one checkpointed training step each: resident twice
(how far two identical runs differ), then at 8 GiB (whole blocks) and at
4 GiB (pieces, saved tensors in host memory). In the streamed runs every
quantized weight is compared, each time its block is bound (forward and
recompute), with (qdata.float() * scale).to(dtype) from an arena that
holds the image resident. The reference for the gradients is the two
resident runs' own difference, in the same process. Prints the mismatches
and the largest LoRA gradient differences against the first resident run
as one JSON line. Needs what bench/torch_flux.py needs (a machine with an
NVIDIA GPU, torch, diffusers, the arena package)."""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_flux as tf  # noqa: E402

import arena_gpu as arena  # noqa: E402
import arena_gpu.torch as at  # noqa: E402


def main() -> None:
    img = sys.argv[1]
    torch.backends.cuda.enable_cudnn_sdp(False)
    ref_arena = arena.open(img, device="cuda")
    ts = ref_arena.tensors()
    checks = {"forward": [0, 0], "recompute": [0, 0]}
    bad: list = []
    on = [False]
    orig = at._BlockBinding.bind

    def bind(self, addr, where="device"):
        orig(self, addr, where)
        if not on[0]:
            return
        c = checks["recompute" if at._in_backward() else "forward"]
        for p, info, _ in self.quant:
            s = ts.get(info.name + "_scale")
            want = (ts[info.name].float() * s if s is not None else ts[info.name].float()).to(p.dtype)
            c[0] += 1
            if not torch.equal(p.data.view(torch.int16), want.view(torch.int16)):
                c[1] += 1
                if len(bad) < 5:
                    bad.append(info.name)

    at._BlockBinding.bind = bind

    def one(check: bool, **opts) -> dict:
        m = tf.meta_model()
        h = at.attach(m, img, mode="train", device="cuda", **opts)
        tf.add_lora(m)
        m.enable_gradient_checkpointing()
        m.train()
        ps = {n: p for n, p in m.named_parameters() if p.requires_grad}
        on[0] = check
        loss = m(**tf.inputs()).sample.float().square().mean()
        loss.backward()
        on[0] = False
        g = {n: p.grad.detach().float().cpu() for n, p in ps.items()}
        streamed = h.plan()["n_streamed"]
        h.detach()
        del m, ps, h
        torch.cuda.empty_cache()
        return {"grads": g, "streamed": streamed}

    r1, r2 = one(False), one(False)
    s8 = one(True, vram="8G", reserve="3G", piece_size="auto", keep_last=0)
    s4 = one(True, vram="4G", reserve="2300M", piece_size="auto", keep_last=0, offload_saved=True)

    def diff(a: dict, b: dict) -> float:
        return max((a["grads"][k] - b["grads"][k]).abs().max().item() for k in a["grads"])

    print(json.dumps({"image": img, "checks": checks, "mismatched": bad,
                      "largest_gradient": max(v.abs().max().item() for v in r1["grads"].values()),
                      "resident_vs_resident": diff(r2, r1), "8G_vs_resident": diff(s8, r1),
                      "4G_vs_resident": diff(s4, r1), "streamed_blocks": [s8["streamed"], s4["streamed"]]}))


if __name__ == "__main__":
    main()
