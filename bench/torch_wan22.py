"""torch_wan22.py - the Wan 2.2 T2V A14B pipeline (two 14B experts switched at a boundary step)
under one arena budget, against diffusers' model offload and the pipeline resident (GPU).

One run per process (peak host RSS and device memory are the process's own):

  python bench/torch_wan22.py make --image IMAGE [--quant fp8-e4m3-row|none] [--tiny] [--threads N]
  python bench/torch_wan22.py RUN --image IMAGE [--tiny] [--device cuda|cpu] [--vram V]
      [--fp8-compute on|off|auto] [--steps N] [--videos N] [--resolution WxHxF] [--seed S]
      [--guidance G] [--guidance-2 G] [--flow-shift S] [--vae-tiling on|off]
      [--skip-if-no-room] [--sim-capacity S]

The pipeline: diffusers' WanPipeline at Wan 2.2 T2V A14B's configs: ``transformer`` (the
high-noise expert) and ``transformer_2`` (the low-noise one), each a WanTransformer3DModel
of Wan 2.1 T2V 14B's shape (40 layers, dim 5120 = 40 heads x 128, ffn 13824, 16 channels in
and out; bench/torch_wan_qwen.py's WAN_14B), switched at boundary_ratio 0.875 (the steps
whose timestep is at least 875 run ``transformer``, the others ``transformer_2``); UMT5-XXL
as its text encoder (arena_gpu.torch's built-in "umt5-xxl" config, 5.68 B parameters);
AutoencoderKLWan at its default config (Wan 2.1's VAE, which A14B uses);
UniPCMultistepScheduler for flow prediction (use_flow_sigmas, solver order 2, bh2) with
flow_shift 12.0 (A14B's sample_shift; --flow-shift); a word-level tokenizer saved with no
download (the prompts are padded to 512 tokens as the real one pads them, the text encoder
runs on all 512). A video: 832x480, 81 frames (latents 16 x 21 x 60 x 104: 32,760 tokens a
pass), --steps denoising steps (default 40), classifier-free guidance as the pipeline runs
it (both passes a step; guidance 4.0 on the high-noise steps, 3.0 on the low-noise ones),
the VAE's decode (tiled: --vae-tiling, default on), a fixed generator (--seed). Fewer steps
(--steps 8) still switch experts where the boundary puts them (the scheduler's timesteps);
a run whose steps would not reach both experts is refused. --tiny: a pipeline of the same
classes at tiny configs (2 heads, 4 layers; 32x32x5; the CPU tests).

RUN is one of
  make            ONE image of the whole pipeline at IMAGE, its tensors named
                  "<component>.<name>" (text_encoder, transformer, transformer_2, vae: what
                  `arena convert` of the pipeline's folder writes and attach(pipe, image)
                  binds), written by arena_gpu.torch.synth_image from the components built
                  on the meta device, random weights, a block at a time (host memory about
                  one block: no checkpoint on disk). --quant (default fp8-e4m3-row): the
                  experts' block Linears stored so (the text encoder stays bf16: the image
                  about 2 x 14.3 + 11.4 GB, where bf16 experts would be 2 x 28.6); none: bf16.
  arena           the pipeline built on the meta device in the image's dtypes and attached
                  as one pipeline under one budget: attach(pipe, IMAGE, vram=V) (no --vram:
                  attach's default, the device's free memory); fp8_compute attach's default
                  unless --fp8-compute says (an fp8 image: native FP8 products on a GPU that
                  has them; off: each weight dequantized at its bind)
  model-offload   the same pipeline materialized in host memory with the image's weights
                  (an fp8 image's dequantized to bf16 by arena's own rule: the weights arena
                  computes with when it dequantizes; read with arena's reader a block at a
                  time, no safetensors copy), then diffusers' enable_model_cpu_offload()
                  (a component on the device while it runs: the switch moves one expert out
                  and the other in)
  resident        the same weights, every component on the device. --skip-if-no-room: where
                  the weights and a margin for the steps do not fit the device's free
                  memory, a record saying so ("skipped"), exit status 0

What a run records (one JSON line): set-up seconds (the pipeline built and its weights bound
or read), each video's seconds (from the pipeline's call to its frames: the text encoder,
the steps, the VAE's decode), the text encoder's and the decode's part, each denoising
step's seconds (the device synchronized at each step's end) and which expert ran it (the
expert's calls counted in the step: two, guidance's both passes), the switch step (the
first of transformer_2) beside where boundary_ratio puts it, each expert's median steady
step (its steps but its first), the switch step's extra time against transformer_2's steady
steps, the same for the first step against transformer's; the process's device peak after
its CUDA context (the driver's figure from before the context: run it under
bench/vram_peak.py), torch's peak reserved, the host's peak RSS (VmHWM) and its RSS after
set-up; for arena, the plan, the engine's records of each denoising step (summed over its
two passes: moved, streamed, promoted bytes, misses, stalls), the decisions of the switch
step, and the copies the switch needs at the link (its moved bytes over the rate below).
out_hash: SHA-256 of the first video's final latents (before the decode), video_hash its
frames': a run compares with the resident one bit for bit when both dequantize the same
weights (arena with --fp8-compute off); native FP8 products give other values, and the
record says so (bit_for_bit_with_resident: false, and why).

Limit, measured in the same process after the videos (arena's memory given back first):
h2d_bytes_per_s, the pinned host-to-device rate: the copies of a step, or of the switch,
take their moved bytes over it (--device cpu: the simulated device's modelled rate).

--device cpu runs arena on its simulated device (--sim-capacity, default 16G) and the
model offload's hooks onto the CPU itself (the tests). Needs torch, diffusers, transformers,
accelerate, tokenizers and the arena package; at full size a GPU (bench/gpu_wan22.sh runs
the sets of runs under bench/vram_peak.py, bench/wan_qwen_summary.py --wan22 prints their
table). A run that fails prints its record with "ok": false and the error, exit status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

# the device, its clock and the link probe of `python -m arena_gpu.bench`
from arena_gpu.bench._flux import Device, link_rate, median

# Wan 2.1 T2V 14B's transformer config (each expert's), the process's peak device
# memory, the digest of tensors and the process's resident memory by kind: those of
# bench/torch_wan_qwen.py (one process a run, as there).
from torch_wan_qwen import (SIM_LINK, WAN_14B, DevPeak, digest, image_dtypes, read_image, recorded,  # noqa: E402
                            rss_parts)

COMPONENTS = ("text_encoder", "transformer", "transformer_2", "vae")
EXPERTS = ("transformer", "transformer_2")
BOUNDARY_RATIO = 0.875
FLOW_SHIFT = 12.0
GUIDANCE = (4.0, 3.0)  # the high-noise expert's, the low-noise one's
WAN_TINY: Dict[str, Any] = dict(WAN_14B, num_attention_heads=2, attention_head_dim=8, text_dim=32, freq_dim=16,
                                ffn_dim=32, num_layers=4, rope_max_seq_len=32)
UMT5_TINY: Dict[str, Any] = dict(vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_heads=4,
                                 relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                 dropout_rate=0.0)
VAE_TINY: Dict[str, Any] = dict(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                temperal_downsample=[False, True, True])
FULL = dict(resolution="832x480x81", text=512, steps=40)
TINY = dict(resolution="32x32x5", text=16, steps=6)
PROMPT = "a photo of a red cat on the mat"
NEGATIVE = "a blue dog"
# the device memory a resident video needs beside its weights (--skip-if-no-room): the
# activations of a pass at 32,760 tokens and the VAE's tiled decode, with room to spare
RESIDENT_MARGIN = 12 << 30


# --- the pipeline -----------------------------------------------------------------------------

def umt5_config(tiny: bool) -> Dict[str, Any]:
    if tiny:
        return dict(UMT5_TINY)
    from arena_gpu.torch._synth import MODELS

    return {k: v for k, v in MODELS["umt5-xxl"][1].items() if k != "model_type"}


def word_tokenizer(max_length: int) -> Any:
    """A word-level tokenizer of a few words (ids under 16: within any vocabulary), made
    here: no download. The pipeline pads every prompt to ``max_length`` tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for i, w in enumerate("a photo of cat dog red blue on the mat".split()):
        vocab[w] = 3 + i
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()  # type: ignore[assignment]
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", eos_token="</s>",
                                   model_max_length=max_length)


def scheduler(flow_shift: float) -> Any:
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True,
                                   flow_shift=flow_shift, solver_order=2, solver_type="bh2", predict_x0=True,
                                   lower_order_final=True, final_sigmas_type="zero", timestep_spacing="linspace")


def meta_components(tiny: bool) -> Dict[str, torch.nn.Module]:
    """The four models built with their parameters on the meta device and their buffers
    computed (accelerate's init_empty_weights), tied weights tied, frozen, in eval mode."""
    import diffusers
    import transformers as tf
    from accelerate import init_empty_weights

    with init_empty_weights():
        out: Dict[str, torch.nn.Module] = {
            "text_encoder": tf.UMT5EncoderModel(tf.UMT5Config(**umt5_config(tiny))),
            "transformer": diffusers.WanTransformer3DModel(**(WAN_TINY if tiny else WAN_14B)),
            "transformer_2": diffusers.WanTransformer3DModel(**(WAN_TINY if tiny else WAN_14B)),
            "vae": diffusers.AutoencoderKLWan(**(VAE_TINY if tiny else {})),
        }
    # UMT5's embed_tokens is its shared embedding, as from_pretrained ties them: stored
    # once in the image (under shared.weight), bound to both
    out["text_encoder"].tie_weights()  # type: ignore[operator]
    for m in out.values():
        m.requires_grad_(False).eval()
    return out


def pipeline(comps: Dict[str, torch.nn.Module], text: int, flow_shift: float) -> Any:
    from diffusers import WanPipeline

    pipe = WanPipeline(tokenizer=word_tokenizer(text), scheduler=scheduler(flow_shift), boundary_ratio=BOUNDARY_RATIO,
                       **comps)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def in_image_dtypes(comps: Dict[str, torch.nn.Module], image: str) -> None:
    """Each component's tensors in the dtypes the image holds them in."""
    from arena_gpu.torch._pretrained import _set_dtypes

    dtypes = image_dtypes(image)
    for name, m in comps.items():
        _set_dtypes(m, name + ".", dtypes)


def load_components(comps: Dict[str, torch.nn.Module], image: str, to: torch.device) -> None:
    """Each component's parameters (on meta) assigned the image's tensors on ``to``
    (tied ones bound again), its buffers moved there."""
    sd = read_image(image, to, dequantize=True)
    for name, m in comps.items():
        mine = {k[len(name) + 1:]: v for k, v in sd.items() if k.startswith(name + ".")}
        _, unexpected = m.load_state_dict(mine, strict=False, assign=True)
        if hasattr(m, "tie_weights"):
            m.tie_weights()  # UMT5's embed_tokens is its shared embedding (stored once)
        left = [n for n, p in list(m.named_parameters()) + list(m.named_buffers()) if p.is_meta]
        if left or unexpected:
            raise RuntimeError(f"{image}: not this pipeline's {name}: left on meta {left[:5]}, "
                               f"unexpected {unexpected[:5]}")
        m.to(to)


def image_value_bytes(image: str) -> int:
    """The bytes of the image's tensors in their original dtypes (an fp8 tensor as its
    bf16 values): what the resident pipeline holds on the device."""
    import arena_gpu as arena
    from arena_gpu._dtypes import torch_dtype

    n = 0
    for t in arena.inspect(image)["tensors"]:
        k = 1
        for d in t["shape"]:
            k *= int(d)
        n += k * torch.empty((), dtype=torch_dtype(t["dtype"])).element_size()
    return n


# --- a video ---------------------------------------------------------------------------------

def parse_resolution(text: str) -> Tuple[int, int, int]:
    try:
        v = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        v = ()
    if len(v) != 3 or min(v) <= 0:
        raise SystemExit(f"--resolution {text}: WxHxF (832x480x81)")
    if v[0] % 16 or v[1] % 16:
        raise SystemExit(f"--resolution {text}: width and height multiples of 16 (the VAE's 8 x the patch's 2)")
    if (v[2] - 1) % 4:
        raise SystemExit(f"--resolution {text}: frames 4k + 1 (the VAE's time factor 4)")
    return v[0], v[1], v[2]


def boundary_step(flow_shift: float, steps: int) -> int:
    """The first step the low-noise expert runs: the first of the scheduler's timesteps
    under boundary_ratio x 1000 (the pipeline's rule); ``steps`` when none is."""
    s = scheduler(flow_shift)
    s.set_timesteps(steps, device="cpu")
    b = BOUNDARY_RATIO * s.config.num_train_timesteps
    return next((i for i, t in enumerate(s.timesteps) if float(t) < b), steps)


class Clock:
    """Per denoising step: its end (the device synchronized), which expert's calls ran in
    it; the first expert call's start; and, for arena, the engine's record count at each
    mark (its steps between two marks are the denoising step's passes)."""

    def __init__(self, dev: Device, pipe: Any, count: Optional[Callable[[], int]]) -> None:
        self.dev, self.count = dev, count
        self.reset()
        self.hooks = [getattr(pipe, name).register_forward_pre_hook(self._pre(name)) for name in EXPERTS]

    def reset(self) -> None:
        self.start: Optional[float] = None
        self.start_count = 0
        self.ends: List[float] = []
        self.counts: List[int] = []
        self.calls: List[List[str]] = [[]]

    def _pre(self, name: str) -> Callable[..., None]:
        def pre(_m: Any, _args: Any) -> None:
            if self.start is None:  # the text encoder's work done: the denoising starts
                self.dev.sync()
                self.start = time.perf_counter()
                self.start_count = self.count() if self.count else 0
            self.calls[-1].append(name)

        return pre

    def step_end(self, _pipe: Any, i: int, _t: Any, kw: Dict[str, Any]) -> Dict[str, Any]:
        self.dev.sync()
        self.ends.append(time.perf_counter())
        self.counts.append(self.count() if self.count else 0)
        self.calls.append([])
        self.latents = kw["latents"]
        return kw

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


def video(pipe: Any, clock: Clock, res: Tuple[int, int, int], steps: int, text: int, seed: int,
          guidance: Tuple[float, float], gen_device: str) -> Dict[str, Any]:
    """One video; its seconds and their parts, each step's seconds and expert, the final
    latents' and the frames' hashes."""
    w, h, f = res
    clock.reset()
    clock.dev.sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        frames = pipe(PROMPT, negative_prompt=NEGATIVE, height=h, width=w, num_frames=f, num_inference_steps=steps,
                      guidance_scale=guidance[0], guidance_scale_2=guidance[1], max_sequence_length=text,
                      output_type="pt", callback_on_step_end=clock.step_end,
                      generator=torch.Generator(gen_device).manual_seed(seed)).frames
    clock.dev.sync()
    t1 = time.perf_counter()
    if clock.start is None or len(clock.ends) != steps:
        raise RuntimeError(f"the pipeline ran {len(clock.ends)} steps of {steps}")
    marks = [clock.start] + clock.ends
    experts = []
    for i, calls in enumerate(clock.calls[:steps]):
        if len(set(calls)) != 1 or len(calls) != 2:
            raise RuntimeError(f"step {i}: the experts' calls were {calls} (two calls of one expert a step: "
                               f"guidance's both passes)")
        experts.append(calls[0])
    return dict(video_s=t1 - t0, text_s=clock.start - t0, decode_s=t1 - clock.ends[-1],
                denoise_s=clock.ends[-1] - clock.start, steps_s=[marks[i + 1] - marks[i] for i in range(steps)],
                experts=experts, counts=[clock.start_count] + clock.counts,
                out_hash=digest([("latents", clock.latents)]), video_hash=digest([("frames", frames)]),
                frames_shape=list(frames.shape), out_abs_mean=float(clock.latents.float().abs().mean()))


def expert_figures(v: Dict[str, Any]) -> Dict[str, Any]:
    """The switch step, each expert's steady median (its steps but its first), each
    expert's first step's extra time against its steady median."""
    steps, ex = v["steps_s"], v["experts"]
    switch = ex.index("transformer_2") if "transformer_2" in ex else None
    per: Dict[str, Any] = {}
    for name in EXPERTS:
        idx = [i for i, e in enumerate(ex) if e == name]
        steady = [steps[i] for i in idx[1:]]
        med = median(steady) if steady else None
        per[name] = dict(steps=len(idx), first_step=idx[0] if idx else None,
                         first_step_s=steps[idx[0]] if idx else None, steady_median_s=med,
                         first_extra_s=(steps[idx[0]] - med) if (idx and med is not None) else None)
    return dict(switch_step=switch, per_expert=per, switch_step_s=steps[switch] if switch is not None else None,
                switch_extra_s=per["transformer_2"]["first_extra_s"])


# --- a run -------------------------------------------------------------------------------------

def make(a: argparse.Namespace, rec: Dict[str, Any]) -> None:
    from arena_gpu.torch import synth_image

    comps = meta_components(a.tiny)
    quant = None if a.quant == "none" else a.quant
    rec["quant"] = quant
    rec["parameters"] = {k: sum(p.numel() for p in m.parameters()) for k, m in comps.items()}
    t0 = time.perf_counter()
    synth_image(torch.nn.ModuleDict(comps), a.image, quant=quant, quant_exclude=["text_encoder.*"] if quant else (),
                threads=a.threads, force=a.force, progress=False)
    rec["make_s"] = time.perf_counter() - t0
    rec["image_bytes"] = os.path.getsize(a.image)
    import arena_gpu as arena

    info = arena.inspect(a.image)
    rec["image_schemes"] = sorted({t["scheme"] for t in info["tensors"]})
    rec["blocks"] = len(info["blocks"])
    rec["host_peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(a: argparse.Namespace, rec: Dict[str, Any]) -> None:
    if a.steps is not None and a.steps < 2:
        raise SystemExit("--steps: at least 2 (both experts)")
    if a.videos < 1:
        raise SystemExit("--videos: at least 1")
    spec = TINY if a.tiny else FULL
    res = parse_resolution(a.resolution or str(spec["resolution"]))
    steps = int(a.steps or spec["steps"])
    text = int(spec["text"])
    guidance = (a.guidance if a.guidance is not None else GUIDANCE[0],
                a.guidance_2 if a.guidance_2 is not None else GUIDANCE[1])
    switch_at = boundary_step(a.flow_shift, steps)
    if not 0 < switch_at < steps:
        raise SystemExit(f"--steps {steps} with flow shift {a.flow_shift}: the boundary ({BOUNDARY_RATIO}) puts "
                         f"{'every' if switch_at == steps else 'no'} step on the high-noise expert; more steps, "
                         f"or another --flow-shift, so that both experts run")
    vram = None if a.vram in (None, "none") else a.vram
    dev = Device("cuda" if a.device == "cuda" else "sim")
    tdev = dev.torch_device
    t_start = time.perf_counter()
    if dev.cuda:
        torch.cuda.init()
        torch.backends.cuda.enable_cudnn_sdp(False)  # flash attention, as bench/torch_wan_qwen.py
    peak = DevPeak(dev.cuda)
    import arena_gpu as arena

    info = arena.inspect(a.image)
    schemes = sorted({t["scheme"] for t in info["tensors"]})
    rec.update({"resolution": "x".join(map(str, res)), "steps": steps, "videos": a.videos, "text_tokens": text,
                "guidance": list(guidance), "flow_shift": a.flow_shift, "boundary_ratio": BOUNDARY_RATIO,
                "boundary_step": switch_at, "seed": a.seed, "vae_tiling": a.vae_tiling == "on",
                "image": os.path.abspath(a.image), "image_bytes": os.path.getsize(a.image),
                "image_schemes": schemes, "context_bytes": peak.base})
    quantized = any(s != "none" for s in schemes)
    if a.run == "resident" and a.skip_if_no_room and dev.cuda:
        need = image_value_bytes(a.image) + RESIDENT_MARGIN
        free = torch.cuda.mem_get_info()[0]
        if need > free:
            rec["skipped"] = (f"the resident pipeline needs about {need / 2**30:.1f} GiB (its weights in their "
                              f"dtypes, bf16 where the image is fp8, and {RESIDENT_MARGIN >> 30} GiB for a step "
                              f"and the decode); the device has {free / 2**30:.1f} GiB free")
            return
    t0 = time.perf_counter()
    comps = meta_components(a.tiny)
    in_image_dtypes(comps, a.image)
    rec["model_build_s"] = time.perf_counter() - t0
    h: Any = None
    if a.run == "arena":
        import arena_gpu.torch as at

        pipe = pipeline(comps, text, a.flow_shift)
        kw: Dict[str, Any] = {"vram": vram} if vram else {}
        if dev.cuda:
            kw["device"] = "cuda"
        else:
            kw.update(device="sim", sim_capacity=a.sim_capacity, sim_bandwidth=SIM_LINK)
        if a.fp8_compute is not None:
            kw["fp8_compute"] = {"on": True, "off": False, "auto": "auto"}[a.fp8_compute]
        h = at.attach(pipe, a.image, **kw)
        rec["plan"] = h.plan()
        rec["fp8_native"] = fp8_native(h, quantized)
        if dev.cuda and not str(pipe._execution_device).startswith("cuda"):
            # diffusers takes the device from a component's first parameter (as
            # bench/gpu_pipeline.py): the arena's device is where the pipeline runs
            type(pipe)._execution_device = property(lambda self: torch.device(h.arena.device))
            rec["execution_device_set"] = True
    else:
        load_components(comps, a.image, torch.device("cpu") if a.run == "model-offload" else tdev)
        rec["read_s"] = time.perf_counter() - t0
        pipe = pipeline(comps, text, a.flow_shift)
        if a.run == "model-offload":
            t1 = time.perf_counter()
            pipe.enable_model_cpu_offload(device="cuda" if dev.cuda else "cpu")
            rec["offload_setup_s"] = time.perf_counter() - t1
    if a.vae_tiling == "on":
        pipe.vae.enable_tiling()
    dev.sync()
    rec["setup_s"] = time.perf_counter() - t0
    rec["execution_device"] = str(pipe._execution_device)
    rec["rss_after_setup"] = rss_parts()
    peak.read()
    clock = Clock(dev, pipe, (lambda: len(h.stats())) if h is not None else None)
    vids = []
    try:
        for k in range(a.videos):
            v = video(pipe, clock, res, steps, text, a.seed, guidance, "cuda" if dev.cuda else "cpu")
            peak.read()
            if h is not None:
                h.end_step()  # the decode's record closed before the next video's
                st = h.stats()
                v["records"] = step_records(st, v["counts"])
            vids.append(v)
            if k == 0:
                rec["first_video_from_start_s"] = time.perf_counter() - t_start
    finally:
        clock.remove()
    last = vids[-1]
    rec["videos_s"] = [v["video_s"] for v in vids]
    rec["video_s"] = last["video_s"]
    for k in ("text_s", "decode_s", "denoise_s", "steps_s", "experts", "frames_shape"):
        rec[k] = last[k]
    rec.update(expert_figures(last))
    rec["out_hash"], rec["video_hash"], rec["out_abs_mean"] = vids[0]["out_hash"], vids[0]["video_hash"], \
        vids[0]["out_abs_mean"]
    rec["same_every_video"] = len({(v["out_hash"], v["video_hash"]) for v in vids}) == 1
    rec["device_peak_bytes"] = peak.used()
    if dev.cuda:
        rec["torch_max_reserved"] = torch.cuda.max_memory_reserved()
        rec["torch_max_allocated"] = torch.cuda.max_memory_allocated()
    if a.run == "arena":
        rec["bit_for_bit_with_resident"] = not rec["fp8_native"]
        if rec["fp8_native"]:
            rec["why_not_bit_for_bit"] = ("native FP8 products (fp8_compute): the experts compute with the FP8 "
                                          "bytes, resident with their dequantized bf16 values")
    if h is not None:
        recs = last["records"]
        rec["step_records"] = recs
        sw = rec["switch_step"]
        rec["moved_bytes_steady"] = int(median([float(r["moved_bytes"]) for i, r in enumerate(recs)
                                                if i not in (0, sw)])) if len(recs) > 2 else None
        if sw is not None:
            rec["switch_moved_bytes"] = recs[sw]["moved_bytes"]
            lo, hi = last["counts"][sw], last["counts"][sw + 1]
            rec["switch_decisions"] = [d for d in h.decisions() if lo <= int(d.get("step", -1)) < hi
                                       ] if hasattr(h, "decisions") else []
        rec["offload"] = h.offload_stats()
        rec["plan_after"] = h.plan()
        if not dev.cuda:
            rec["sim_peak_bytes"] = h.arena.sim_peak()
    rec["host_peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rec["rss_after_videos"] = rss_parts()
    # The limit last, arena's memory given back first (detach closes its arena); the
    # other runs' pipelines let go first too.
    if h is not None:
        h.detach()
    del pipe, comps
    if dev.cuda:
        import gc

        gc.collect()
        torch.cuda.empty_cache()
        rec["h2d_bytes_per_s"] = link_rate(dev)
        rec["link"] = "pinned"
    else:
        rec["h2d_bytes_per_s"] = SIM_LINK
        rec["link"] = "sim"
    if h is not None and rec.get("switch_moved_bytes") is not None:
        rec["switch_copies_s"] = rec["switch_moved_bytes"] / rec["h2d_bytes_per_s"]


def fp8_native(h: Any, quantized: bool) -> bool:
    """Whether the experts' fp8 weights compute as FP8 products (attach's fp8_compute on
    a device with FP8 matmuls): their outputs then differ from the dequantized weights'."""
    if not quantized or h._fp8_compute is False:
        return False
    from arena_gpu.torch._fp8 import device_has_fp8
    from arena_gpu.torch._quant import fp8_auto_native

    return bool(device_has_fp8(h._device)) and (h._fp8_compute is True or bool(fp8_auto_native(h)))


STEP_KEYS = ("moved_bytes", "streamed_bytes", "promoted_bytes", "misses", "stalls", "stall_s", "disk_bytes")


def step_records(st: List[Dict[str, Any]], counts: List[int]) -> List[Dict[str, Any]]:
    """The engine's records of each denoising step (its two passes: the records between
    its marks), summed; with the steps they are."""
    out = []
    for i in range(len(counts) - 1):
        rs = st[counts[i]:counts[i + 1]]
        d: Dict[str, Any] = {"engine_steps": [r.get("step") for r in rs]}
        for k in STEP_KEYS:
            d[k] = sum((r.get(k) or 0) for r in rs)
        out.append(d)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """A run (the module's docstring): its JSON line on stdout, exit status 0; a run that
    fails prints {"ok": false, "error": ...} with its options, exit status 1."""
    ap = argparse.ArgumentParser(prog="torch_wan22.py", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("run", choices=["make", "arena", "model-offload", "resident"])
    ap.add_argument("--image", required=True)
    ap.add_argument("--tiny", action="store_true", help="the tiny configs (CPU tests)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quant", default="fp8-e4m3-row", help="make: the experts' block Linears (none: bf16)")
    ap.add_argument("--threads", type=int, default=None, help="make: synth_image's threads (default one per CPU)")
    ap.add_argument("--force", action="store_true", help="make: replace IMAGE")
    ap.add_argument("--vram", default=None, help="arena: attach(vram=...); none or absent: attach's default")
    ap.add_argument("--fp8-compute", default=None, choices=["on", "off", "auto"],
                    help="arena on an fp8 image: attach(fp8_compute=True|False|'auto'); default attach's")
    ap.add_argument("--steps", type=int, default=None, help="denoising steps (default 40; tiny 6)")
    ap.add_argument("--videos", type=int, default=1, help="videos one after the other (the figures: the last's)")
    ap.add_argument("--resolution", default=None, help="WxHxF (default 832x480x81; tiny 32x32x5)")
    ap.add_argument("--seed", type=int, default=0, help="the generator's seed")
    ap.add_argument("--guidance", type=float, default=None, help="the high-noise steps' guidance (default 4.0)")
    ap.add_argument("--guidance-2", type=float, default=None, help="the low-noise steps' guidance (default 3.0)")
    ap.add_argument("--flow-shift", type=float, default=FLOW_SHIFT, help="the scheduler's flow_shift (default 12)")
    ap.add_argument("--vae-tiling", default="on", choices=["on", "off"], help="the VAE's tiled decode (default on)")
    ap.add_argument("--skip-if-no-room", action="store_true",
                    help="resident: a record saying so, exit 0, where the pipeline does not fit the device")
    ap.add_argument("--sim-capacity", default="16G", help="--device cpu: the simulated device's size")
    a = ap.parse_args(argv)
    rec: Dict[str, Any] = {"harness": "torch_wan22", "run": a.run, "tiny": a.tiny, "device": a.device,
                           "pid": os.getpid(), "vram": None if a.vram in (None, "none") else a.vram,
                           "fp8_compute": a.fp8_compute, "ok": False}
    return recorded(lambda: (make if a.run == "make" else run)(a, rec), rec)


if __name__ == "__main__":
    sys.exit(main())
