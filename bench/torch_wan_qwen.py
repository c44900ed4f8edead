"""torch_wan_qwen.py - the PyTorch adapter on Wan 2.1 T2V 14B and Qwen-Image (GPU).

One run per process (peak host RSS and device memory are the process's own):

  python bench/torch_wan_qwen.py RUN --model wan14b|qwen-image --image IMAGE [--tiny]
      [--device cuda|cpu] [--vram V] [--steps N] [--warmup N] [--resolution WxH[xF]]
      [--fp8-compute on|off|auto] [--offload-saved on|SIZE] [--piece-size S]
      [--host-budget S] [--depth N] [--trace T.json]
      [--record-stream] [--low-cpu-mem-usage] [--non-blocking]   (diffusers-sample)
      [--text-tokens N] [--neg-tokens N] [--guidance G] [--sim-capacity S]

RUN is one of
  plain-sample     the plain model, every weight read from IMAGE into torch tensors on the
                   device, no hooks: the resident step
  arena-sample     arena.torch.attach(model, IMAGE, vram=V) (no --vram: attach's default,
                   the device's free memory)
  diffusers-sample diffusers' apply_group_offloading, block_level, num_blocks_per_group=1,
                   use_stream=True (--record-stream, --low-cpu-mem-usage, --non-blocking:
                   its options of those names), the weights in host memory
  plain-train      LoRA r16 (alpha 16) on the attention projections to_q, to_k, to_v,
                   to_out.0 (both of Wan's attentions; Qwen-Image's joint attention's
                   image side, not its text side's add_*_proj), AdamW (lr 1e-4), the
                   model's own gradient checkpointing, all resident
  arena-train      the same through attach(mode="train", vram=V[, offload_saved=...])

The models: diffusers' WanTransformer3DModel at Wan 2.1 T2V 14B's config (40 layers, 40
heads x 128, ffn 13824, 16 channels in and out, text_dim 4096, freq_dim 256, patch
(1, 2, 2), cross_attn_norm, qk_norm rms_norm_across_heads, eps 1e-6, rope_max_seq_len
1024) and QwenImageTransformer2DModel at Qwen-Image's (60 layers, 24 heads x 128,
joint_attention_dim 3584, 64 channels in, 16 out, patch 2, axes_dims_rope (16, 56, 56)),
built on the meta device (buffers computed by their code), each parameter in the dtype
IMAGE holds it in; --tiny: WAN_TINY and QWEN_TINY (2 heads, 5 layers; the CPU tests).
IMAGE holds the one model (names as its save_pretrained writes them): made by another
tool at full size with random weights (`arena convert` of a model's folder,
`arena.torch.save_image`).

A sampling step is one denoising step with classifier-free guidance as the diffusers
pipeline runs it: the conditional and the unconditional pass, each a call of the model,
then the guidance (Wan: uncond + g (cond - uncond), g 5.0; Qwen-Image: the same with
true_cfg_scale 4.0 and the result rescaled to the conditional's norm) and the flow-match
Euler update of the latents. Wan at 832x480, 81 frames: latents 16 x 21 x 60 x 104
(32,760 tokens), both passes on 512 text tokens of 4096 (the pipeline pads both prompts
to 512). Qwen-Image at 1328x1328: latents packed 2x2, (1328/16)^2 = 6889 tokens of 64,
img_shapes [[(1, 83, 83)]], the prompt's --text-tokens (default 256) and the negative
prompt's --neg-tokens (default 6: a negative prompt as short as " ") of 3584, no text
mask (the pipeline passes none at batch 1), timestep t/1000. A training step: the
conditional pass, the mean square of its output against a fixed target, backward, the
optimizer. Every step has the same inputs (seeded): every sampling step's output is the same.

Steps are timed on the device (CUDA events on torch's stream, the host never waiting
between steps; --device cpu: the host's clock): --warmup untimed steps (default 2), then
--steps timed ones (default 5); the median is of the timed steps after the first.

Prints one JSON line: each timed step's seconds and their median, the warm-up's, the
set-up seconds (model built and weights bound or loaded; plain and diffusers runs: read_s,
the image read in place of from_pretrained's load, and diffusers' offload_setup_s, its
apply_group_offloading with the pinned copies it makes), the process's peak device
memory after its CUDA context (torch's and arena's; the peak as the driver counts it is
measured from outside: run it under bench/vram_peak.py), torch's peak reserved, the host's
peak RSS (VmHWM) and its RSS after set-up and after the steps, for arena runs the plan,
each step's engine records and the bytes moved and streamed per denoising step (both
passes), and the limit, measured in the same process after the steps with arena's memory
given back first: h2d_bytes_per_s, the pinned host-to-device copy rate (a streamed step's
copies take its moved bytes over it; --device cpu: the simulated device's modelled rate).
out_hash: SHA-256 of the first step's output (sampling: the guided prediction and the
updated latents; training: the LoRA gradients), out_hash_last the last timed step's
(training: the LoRA weights after every step), so that a run can be compared bit for bit
with the resident one.

Plain and diffusers runs read IMAGE a block at a time (arena on its simulated device,
the blocks not resident read from the image through a few blocks of host memory) into
tensors of their own, on the device (plain) or in host memory (diffusers); a quantized
image is refused there (the resident baseline is the BF16 image). --device cpu runs
arena on its simulated device (--sim-capacity, default 16G) and diffusers' offloading
without a stream (use_stream needs an accelerator; CPU to CPU). Needs torch, diffusers,
peft, accelerate and the arena package; at full size a GPU (bench/gpu_wan_qwen.sh runs
the sets of runs, bench/wan_qwen_summary.py prints their tables). A run that fails prints
its record with "ok": false and the error (a cap the model does not fit: the least that
does), exit status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

# the device, its clock and the link probe of `python -m arena_gpu.bench`
from arena_gpu.bench._flux import Device, Mark, link_rate, median, time_steps

WAN_14B: Dict[str, Any] = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                               out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                               cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
WAN_TINY: Dict[str, Any] = dict(WAN_14B, num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
                                text_dim=16, freq_dim=16, ffn_dim=32, num_layers=5, rope_max_seq_len=32)
QWEN_IMAGE: Dict[str, Any] = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                                  num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56))
QWEN_TINY: Dict[str, Any] = dict(QWEN_IMAGE, in_channels=16, out_channels=4, num_layers=5, attention_head_dim=16,
                                 num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(4, 6, 6))

# per model: (full config, tiny config, resolution, tiny resolution, text tokens cond/uncond
# (full, tiny), guidance scale)
MODELS: Dict[str, Dict[str, Any]] = {
    "wan14b": dict(config=WAN_14B, tiny=WAN_TINY, resolution="832x480x81", tiny_resolution="64x64x5",
                   text=(512, 512), tiny_text=(6, 6), guidance=5.0),
    "qwen-image": dict(config=QWEN_IMAGE, tiny=QWEN_TINY, resolution="1328x1328", tiny_resolution="128x128",
                       text=(256, 6), tiny_text=(8, 3), guidance=4.0),
}
LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
SIM_LINK = 2e9  # the simulated device's copy rate (--device cpu), bytes/s


# This process's resident memory by kind: torch_flux.py's (one process a run, as there).
from torch_flux import rss_parts  # noqa: E402

class DevPeak:
    """The process's peak device memory after its CUDA context: total - the least free seen."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.total = self.base = self.min_free = 0
        if cuda:
            free, self.total = torch.cuda.mem_get_info()
            self.base, self.min_free = self.total - free, self.total

    def read(self) -> None:
        if self.cuda:
            self.min_free = min(self.min_free, torch.cuda.mem_get_info()[0])

    def used(self) -> int:
        return self.total - self.min_free - self.base if self.cuda else 0


# --- the model ------------------------------------------------------------------------------

def config(model: str, tiny: bool) -> Dict[str, Any]:
    return dict(MODELS[model]["tiny" if tiny else "config"])


def model_class(model: str) -> Any:
    import diffusers

    return diffusers.WanTransformer3DModel if model == "wan14b" else diffusers.QwenImageTransformer2DModel


def meta_model(model: str, tiny: bool, dtypes: Optional[Dict[str, torch.dtype]] = None) -> torch.nn.Module:
    """The model built with its parameters on the meta device and its buffers computed
    (accelerate's init_empty_weights), each parameter in the dtype ``dtypes`` names
    (an image's), else bf16; frozen, in eval mode."""
    from accelerate import init_empty_weights

    from arena_gpu.torch._pretrained import _set_dtypes

    with init_empty_weights():
        m: torch.nn.Module = model_class(model)(**config(model, tiny))
    if dtypes is None:
        dtypes = {n: torch.bfloat16 for n, p in m.named_parameters() if p.is_floating_point()}
    _set_dtypes(m, "", dtypes)
    m.requires_grad_(False)
    return m.eval()


def random_model(model: str, tiny: bool, seed: int = 0) -> torch.nn.Module:
    """The model on the CPU with random weights (normal, std 0.02), in the dtypes its
    from_pretrained(torch_dtype=bfloat16) gives (its _keep_in_fp32_modules in float32,
    the rest bf16): the weights of a tiny image for the tests."""
    torch.manual_seed(seed)
    cls = model_class(model)
    m: torch.nn.Module = cls(**config(model, tiny))
    keep = set(getattr(cls, "_keep_in_fp32_modules", None) or [])
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.normal_(0.0, 0.02)
            if not keep.intersection(n.split(".")):
                p.data = p.data.to(torch.bfloat16)
    m.requires_grad_(False)
    return m.eval()


def image_dtypes(image: str) -> Dict[str, torch.dtype]:
    from arena_gpu.torch._pretrained import _image_dtypes

    return _image_dtypes(Path(image))


def read_image(image: str, to: torch.device, dequantize: bool = False) -> Dict[str, torch.Tensor]:
    """Every tensor of ``image`` as a torch tensor of its own on ``to``, read a block at a
    time: arena on its simulated device holding the first blocks and a ring of a few,
    the rest read from the image through host copies of at most a few blocks. A
    quantized image is refused, unless ``dequantize``: each quantized tensor then in its
    original dtype by arena's rule (``Arena.dequantize``: the values arena computes
    with when it dequantizes at a bind)."""
    import arena_gpu as arena
    from arena_gpu._dtypes import torch_dtype

    info = arena.inspect(image)
    if info["totals"].get("quantized_tensors") and not dequantize:
        raise arena.Error("USAGE", f"{image}: a quantized image; plain and diffusers runs take the BF16 image "
                                   f"(the resident baseline): give --image the BF16 one")
    blocks = info["blocks"]
    big = max(b["bytes"] for b in blocks)
    glob = sum(b["bytes"] for b in blocks if b["container"] is None)
    out: Dict[str, torch.Tensor] = {}
    a = arena.open(image, device="sim", sim_capacity=glob + 4 * big, reserve=0, headroom=0, piece_size=0,
                   host_budget=3 * big + (256 << 20), plain_stream=True)
    try:
        by_block: Dict[int, List[Any]] = {}
        for n in a.tensor_names():
            t = a.tensor_info(n)
            by_block.setdefault(t.block, []).append(t)
        a.step_begin()
        for b in a.blocks:
            if not b.nbytes:
                continue
            resident, dev_addr, _ = a.block_state(b.index)
            addr = dev_addr if resident else a.acquire(b.index)
            views = a.views(a.slab(b.index, addr, "device"), b.index)
            for t in by_block.get(b.index, []):
                if t.scheme == "none":
                    out[t.name] = views[t.name].to(to, copy=True)
                else:
                    v = torch.empty(t.shape, dtype=torch_dtype(t.dtype))
                    a.dequantize(t.name, addr, v)
                    out[t.name] = v.to(to)
            if not resident:
                a.release(b.index)
        a.step_end()
    finally:
        a.close()
    return out


def load_plain(m: torch.nn.Module, image: str, to: torch.device) -> None:
    """``m``'s parameters (on meta) assigned the image's tensors on ``to``; its buffers moved there."""
    sd = read_image(image, to)
    missing, unexpected = m.load_state_dict(sd, strict=False, assign=True)
    if missing or unexpected:
        raise RuntimeError(f"{image}: not this model's weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
    m.to(to)


def add_lora(m: torch.nn.Module, dev: torch.device) -> List[Tuple[str, torch.nn.Parameter]]:
    """LoRA r16 (peft) on the attention projections, its weights bf16 on ``dev``, the same
    values in every run (drawn on the CPU by name; B not zero, so both get gradients)."""
    from peft import LoraConfig

    m.add_adapter(LoraConfig(r=16, lora_alpha=16, target_modules=LORA_TARGETS,  # type: ignore[operator]
                             init_lora_weights="gaussian"))
    g = torch.Generator().manual_seed(1)
    ps = sorted((n, p) for n, p in m.named_parameters() if "lora_" in n)
    for n, p in ps:
        p.data = (torch.randn(p.shape, generator=g) * (0.01 if "lora_B" in n else 0.02)).to(dev, torch.bfloat16)
        p.requires_grad_(True)
    return ps


# --- inputs ---------------------------------------------------------------------------------

def resolution(model: str, text: str) -> Tuple[int, ...]:
    """WxH (Qwen-Image) or WxHxF (Wan), checked against the VAE's and the patches' factors."""
    try:
        v = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        v = ()
    want = 3 if model == "wan14b" else 2
    if len(v) != want or min(v) <= 0:
        raise SystemExit(f"--resolution {text}: {'WxHxF' if want == 3 else 'WxH'} for {model}")
    if v[0] % 16 or v[1] % 16:
        raise SystemExit(f"--resolution {text}: width and height multiples of 16 (the VAE's 8 x the patch's 2)")
    if want == 3 and (v[2] - 1) % 4:
        raise SystemExit(f"--resolution {text}: frames 4k + 1 (the VAE's time factor 4)")
    return v


def make_inputs(model: str, cfg: Dict[str, Any], res: Tuple[int, ...], text: Tuple[int, int],
                dev: torch.device) -> Dict[str, Any]:
    """The step's inputs, seeded: ``cond`` and ``uncond`` (the model's keyword arguments
    of each pass), ``latents`` (what the update is applied to, in the pipeline's dtype),
    ``target`` (training's), and the counts of tokens."""
    g = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16

    def rnd(*shape: int, dtype: torch.dtype = bf) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev, dtype=dtype)

    if model == "wan14b":
        w, h, f = res
        lat = rnd(1, cfg["in_channels"], (f - 1) // 4 + 1, h // 8, w // 8, dtype=torch.float32)
        t = torch.tensor([500.0], device=dev)
        pe, ne = rnd(1, text[0], cfg["text_dim"]), rnd(1, text[1], cfg["text_dim"])
        x = lat.to(bf)
        cond = dict(hidden_states=x, timestep=t, encoder_hidden_states=pe, return_dict=False)
        uncond = dict(hidden_states=x, timestep=t, encoder_hidden_states=ne, return_dict=False)
        p = cfg["patch_size"]
        tokens = lat.shape[2] // p[0] * (lat.shape[3] // p[1]) * (lat.shape[4] // p[2])
    else:
        w, h = res
        hh, ww = h // 16, w // 16
        lat = rnd(1, hh * ww, cfg["in_channels"])  # packed 2x2, bf16 as the pipeline's
        t = torch.tensor([0.5], device=dev, dtype=bf)  # t / 1000
        pe, ne = rnd(1, text[0], cfg["joint_attention_dim"]), rnd(1, text[1], cfg["joint_attention_dim"])
        shapes = [[(1, hh, ww)]]
        cond = dict(hidden_states=lat, timestep=t, encoder_hidden_states=pe, encoder_hidden_states_mask=None,
                    img_shapes=shapes, return_dict=False)
        uncond = dict(cond, encoder_hidden_states=ne)
        tokens = hh * ww
    out_shape = lat.shape if model == "wan14b" else (1, lat.shape[1], cfg["out_channels"] * 4)
    target = rnd(*out_shape)
    return dict(cond=cond, uncond=uncond, latents=lat, target=target, image_tokens=tokens)


def sample_step(m: torch.nn.Module, x: Dict[str, Any], model: str, g: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """One denoising step as the pipeline runs it: both passes, the guidance, the update
    (flow-match Euler from sigma 1.0 to 0.96). Returns the guided prediction and the
    updated latents."""
    with torch.no_grad():
        cond = m(**x["cond"])[0]
        unc = m(**x["uncond"])[0]
        pred = unc + g * (cond - unc)
        if model == "qwen-image":
            pred = pred * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(pred, dim=-1, keepdim=True))
        lat = x["latents"]
        return pred, (lat.float() + (0.96 - 1.0) * pred.float()).to(lat.dtype)


def digest(ts: List[Tuple[str, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for n, t in ts:
        h.update(n.encode())
        h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# --- a run ----------------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    """A run (the module's docstring): its JSON line on stdout, exit status 0; a run that
    fails prints {"ok": false, "error": ...} with its options (the message says why: a
    cap the model does not fit names the least that works), exit status 1."""
    ap = argparse.ArgumentParser(prog="torch_wan_qwen.py", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("run", choices=["plain-sample", "arena-sample", "diffusers-sample", "plain-train", "arena-train"])
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--image", required=True)
    ap.add_argument("--tiny", action="store_true", help="the tiny config (CPU tests)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--vram", default=None, help="arena runs: attach(vram=...); none or absent: attach's default")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (arena learns the step's order "
                                                            "and each pass's memory in them)")
    ap.add_argument("--resolution", default=None, help="WxHxF (Wan; 832x480x81) or WxH (Qwen-Image; 1328x1328)")
    ap.add_argument("--fp8-compute", default=None, choices=["on", "off", "auto"],
                    help="arena runs on an fp8 image: attach(fp8_compute=True|False|'auto'); default attach's")
    ap.add_argument("--offload-saved", default=None, metavar="on|SIZE", help="arena-train: attach(offload_saved=...)")
    ap.add_argument("--piece-size", default=None, help="arena runs: attach(piece_size=...)")
    ap.add_argument("--host-budget", default=None, help="arena runs: attach(host_budget=...)")
    ap.add_argument("--depth", type=int, default=None, help="arena runs: attach(depth=...)")
    ap.add_argument("--trace", default=None, metavar="T.json", help="arena runs: 2 more steps traced into this file")
    ap.add_argument("--record-stream", action="store_true", help="diffusers-sample: record_stream=True")
    ap.add_argument("--low-cpu-mem-usage", action="store_true", help="diffusers-sample: low_cpu_mem_usage=True")
    ap.add_argument("--non-blocking", action="store_true", help="diffusers-sample: non_blocking=True")
    ap.add_argument("--text-tokens", type=int, default=None, help="the prompt's text tokens (cond pass)")
    ap.add_argument("--neg-tokens", type=int, default=None, help="the negative prompt's text tokens (uncond pass)")
    ap.add_argument("--guidance", type=float, default=None, help="the guidance scale (Wan 5.0, Qwen-Image 4.0)")
    ap.add_argument("--sim-capacity", default="16G", help="--device cpu: the simulated device's size")
    a = ap.parse_args(argv)
    rec: Dict[str, Any] = {"run": a.run, "model": a.model, "tiny": a.tiny, "device": a.device, "pid": os.getpid(),
                           "vram": None if a.vram in (None, "none") else a.vram, "fp8_compute": a.fp8_compute,
                           "offload_saved": a.offload_saved, "piece_size": a.piece_size, "ok": False}
    return recorded(lambda: run(a, rec), rec)


def recorded(work: Callable[[], None], rec: Dict[str, Any]) -> int:
    """``work()`` and then ``rec`` printed as the run's JSON line: ``ok`` unless it raised
    (the error in the record, exit status 1) or said it was ``skipped``."""
    try:
        work()
    except Exception as e:  # noqa: BLE001 - any failure is the run's result, said in its record
        import traceback

        traceback.print_exc()
        rec["error"] = " ".join(f"{type(e).__name__}: {e}".split())
        print(json.dumps(rec), flush=True)
        return 1
    rec["ok"] = "skipped" not in rec
    print(json.dumps(rec), flush=True)
    return 0


def run(a: argparse.Namespace, rec: Dict[str, Any]) -> None:
    if a.steps < 1 or a.warmup < 1:
        raise SystemExit("--steps and --warmup: at least 1 each")
    spec = MODELS[a.model]
    cfg = config(a.model, a.tiny)
    res = resolution(a.model, a.resolution or spec["tiny_resolution" if a.tiny else "resolution"])
    t_cond, t_uncond = spec["tiny_text" if a.tiny else "text"]
    text = (a.text_tokens or t_cond, a.neg_tokens or t_uncond)
    guidance = a.guidance if a.guidance is not None else spec["guidance"]
    vram = None if a.vram in (None, "none") else a.vram
    train = a.run.endswith("-train")
    dev = Device("cuda" if a.device == "cuda" else "sim")
    tdev = dev.torch_device
    t_start = time.perf_counter()
    if dev.cuda:
        torch.cuda.init()
        # flash attention, as bench/torch_flux.py (cuDNN's SDPA backward crashed on this torch)
        torch.backends.cuda.enable_cudnn_sdp(False)
    peak = DevPeak(dev.cuda)
    rec.update({"resolution": "x".join(map(str, res)), "steps": a.steps, "warmup": a.warmup,
                "image": os.path.abspath(a.image), "image_bytes": os.path.getsize(a.image), "text_tokens": text[0],
                "neg_tokens": text[1], "guidance": guidance, "context_bytes": peak.base})
    import arena_gpu as arena

    model_class(a.model)  # diffusers imported before the set-up's clock
    info = arena.inspect(a.image)
    rec["image_schemes"] = sorted({t["scheme"] for t in info["tensors"]})
    t0 = time.perf_counter()
    dtypes = image_dtypes(a.image)
    m = meta_model(a.model, a.tiny, dtypes)
    rec["model_build_s"] = time.perf_counter() - t0
    h: Any = None
    if a.run.startswith("plain-"):
        load_plain(m, a.image, tdev)
        rec["read_s"] = time.perf_counter() - t0
    elif a.run.startswith("arena-"):
        import arena_gpu.torch as at

        kw: Dict[str, Any] = {k: v for k, v in dict(vram=vram, piece_size=a.piece_size, host_budget=a.host_budget,
                                                    depth=a.depth).items() if v is not None}
        if dev.cuda:
            kw["device"] = "cuda"
        else:
            kw.update(device="sim", sim_capacity=a.sim_capacity, sim_bandwidth=SIM_LINK)
        if a.fp8_compute is not None:
            kw["fp8_compute"] = {"on": True, "off": False, "auto": "auto"}[a.fp8_compute]
        if a.offload_saved:
            kw["offload_saved"] = True if a.offload_saved == "on" else a.offload_saved
        h = at.attach(m, a.image, mode="train" if train else "sample", **kw)
        rec["plan"] = h.plan()
    else:
        from diffusers.hooks import apply_group_offloading

        stream = dev.cuda  # use_stream needs an accelerator's streams
        rec["diffusers"] = dict(use_stream=stream, record_stream=a.record_stream and stream,
                                low_cpu_mem_usage=a.low_cpu_mem_usage, non_blocking=a.non_blocking)
        load_plain(m, a.image, torch.device("cpu"))
        rec["read_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        apply_group_offloading(m, onload_device=tdev, offload_device=torch.device("cpu"), offload_type="block_level",
                               num_blocks_per_group=1, **rec["diffusers"])
        rec["offload_setup_s"] = time.perf_counter() - t1
    dev.sync()
    rec["setup_s"] = time.perf_counter() - t0
    rec["rss_after_setup"] = rss_parts()
    peak.read()
    x = make_inputs(a.model, cfg, res, text, tdev)
    rec["image_tokens"] = x["image_tokens"]
    outs: List[Tuple[torch.Tensor, torch.Tensor]] = []
    step: Callable[[], None]
    phases: List[Tuple[Mark, Mark]] = []
    if train:
        lora = add_lora(m, tdev)
        m.enable_gradient_checkpointing()  # type: ignore[operator]
        m.train()
        rec["lora_params"] = sum(p.numel() for _, p in lora)
        opt = torch.optim.AdamW([p for _, p in lora], lr=1e-4)
        first: Dict[str, Any] = {}

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            pred = m(**x["cond"])[0]
            loss = (pred.float() - x["target"].float()).square().mean()
            f = dev.mark()
            loss.backward()
            b = dev.mark()
            if not first:  # the first step's gradients and loss (untimed: warm-up)
                grads = []
                for n, p in lora:
                    if p.grad is None:
                        raise RuntimeError(f"LoRA weight {n} got no gradient in the backward")
                    grads.append((n, p.grad.detach().cpu()))
                first.update(grads=grads, loss=float(loss.detach()))
            opt.step()
            phases.append((f, b))
    else:

        def step() -> None:
            out = sample_step(m, x, a.model, guidance)
            if len(outs) < 2:
                outs.append(out)
            else:
                outs[1] = out

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
        if h is not None:
            h.end_step()  # the warm-up's last pass ends before the timed steps (its record)
    dev.sync()
    rec["first_step_s"] = time.perf_counter() - t0
    rec["start_to_first_step_end_s"] = time.perf_counter() - t_start
    peak.read()
    n0 = len(h.stats()) if h is not None else 0
    if dev.cuda:
        torch.cuda.reset_peak_memory_stats()
    phases.clear()
    marks = time_steps(step, a.steps, dev, after=peak.read)
    rec["steps_s"] = [marks[i].to(marks[i + 1]) for i in range(a.steps)]
    rec["step_s_median"] = median(rec["steps_s"][1:] or rec["steps_s"])
    if train:
        rec["phases_s"] = [[s.to(f), f.to(b), b.to(e)] for (f, b), s, e in zip(phases, marks[:-1], marks[1:])]
    rec["device_peak_bytes"] = peak.used()
    if dev.cuda:
        rec["torch_max_reserved"] = torch.cuda.max_memory_reserved()
        rec["torch_max_allocated"] = torch.cuda.max_memory_allocated()
    if h is not None:
        h.end_step()
        recs = h.stats()[n0:]
        keys = ("step", "mode", "streamed_bytes", "moved_bytes", "misses", "stalls", "stall_s", "resident_bytes",
                "demotions", "promotions", "plan_s", "budget", "over_budget", "disk_bytes", "disk_wait_s")
        rec["records"] = [{k: r.get(k) for k in keys} for r in recs]
        passes = 1 if train else 2  # the model's calls a step: arena's steps
        per = [recs[i:i + passes] for i in range(0, len(recs) - passes + 1, passes)]
        rec["moved_bytes_step"] = int(median([float(sum(r["moved_bytes"] for r in p)) for p in per])) if per else 0
        rec["streamed_bytes_step"] = int(median([float(sum(r["streamed_bytes"] for r in p)) for p in per])) if per else 0
        rec["offload"] = h.offload_stats()
        if a.trace:
            with h.trace(a.trace):
                tm = time_steps(step, 2, dev)
            rec["traced_steps_s"] = [tm[i].to(tm[i + 1]) for i in range(2)]
        rec["plan_after"] = h.plan()
        if not dev.cuda:
            rec["sim_peak_bytes"] = h.arena.sim_peak()
    if train:
        rec["loss"] = first["loss"]
        rec["out_hash"] = digest(first["grads"])
        rec["out_hash_last"] = digest([(n, p) for n, p in lora])
        rec["out_abs_mean"] = float(sum(g.float().abs().mean() for _, g in first["grads"]) / len(first["grads"]))
    else:
        rec["out_hash"] = digest(list(zip(("pred", "latents"), outs[0])))
        rec["out_hash_last"] = digest(list(zip(("pred", "latents"), outs[-1])))
        rec["out_abs_mean"] = float(outs[0][0].float().abs().mean())
    rec["host_peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rec["rss_after_steps"] = rss_parts()
    # The limit last, arena's memory given back first (detach closes its arena): the
    # process then holds less than in its steps, so the peak measured from outside
    # (bench/vram_peak.py) is the steps'.
    if h is not None:
        h.detach()
    if dev.cuda:
        torch.cuda.empty_cache()
        rec["h2d_bytes_per_s"] = link_rate(dev)
        rec["link"] = "pinned"
    else:
        rec["h2d_bytes_per_s"] = SIM_LINK
        rec["link"] = "sim"


if __name__ == "__main__":
    sys.exit(main())
