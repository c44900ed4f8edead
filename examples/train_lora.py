#!/usr/bin/env python3
"""Train a LoRA of FLUX.1 whose transformer runs from an arena image.

    pip install './python[examples]'     # from the repository's root (arena-gpu is not on PyPI yet)
    python train_lora.py --tiny          # tiny random models, a few steps: seconds on a CPU, no download
    python train_lora.py --model ~/models/FLUX.1-dev --data ./my-images --out ./my-lora

--data is a folder of images (.png, .jpg, .jpeg, .webp), each with a caption in
a .txt file of the same name. The images are encoded by the VAE and the
captions by the text encoders once, and cached in --out (cache.pt; default
./flux-lora): the training steps then need the transformer alone, which comes
from arena (``arena.torch.from_pretrained`` of <model>/transformer, in train
mode: its weights converted into arena's cache on the first run, --cache,
default $ARENA_CACHE, else $XDG_CACHE_HOME/arena or ~/.cache/arena) and whose
weights stay frozen; what fits the GPU (or --vram, all the device memory the
process may hold) stays there, the rest is streamed. The LoRA (rank --rank on the attention
projections) is trained with AdamW under gradient checkpointing, saved every
--checkpoint-every steps with the optimizer's state (--resume goes on from
there), previewed every --preview-every steps (a sample of --preview-prompt,
out/preview-STEP.png), and written at the end as out/pytorch_lora_weights.safetensors,
which diffusers' ``FluxPipeline.load_lora_weights`` reads. Each step (every
tenth of a long run) is said with its loss, the seconds a step and the time left.

--tiny builds tiny random models and a few random images instead (nothing
downloaded) and trains 8 steps, previewed and saved every 4: what CI runs.
Without a GPU it runs on the CPU, its transformer on arena's simulated device
under --vram (default 160K), which streams most of its blocks. --random dev
builds FLUX.1-dev's transformer and VAE with random weights: a GPU's time per
step, without a download. --random writes its models and images (and, without
--cache, the cache) into --workdir, or a temporary folder removed when the run
ends.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from PIL import Image

import arena_gpu as arena


def random_models(workdir: str, size: str = "tiny") -> Tuple[Dict[str, Any], Dict[str, Any], str]:
    """FLUX.1's parts with random weights, nothing downloaded: the pipeline's other
    components, the transformer's config, its weights' file (in ``workdir``/transformer,
    with its config.json: a model's folder as diffusers saves one). "tiny": every
    part's structure at a few thousand weights (CI). "dev": the transformer and the
    VAE at FLUX.1-dev's configs (the transformer's 11.9 B weights written by ``arena
    synth``), the text encoders one layer deep at the widths the transformer takes:
    the GPU's work per step as FLUX.1-dev's, for measuring."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import CLIPTextConfig, CLIPTextModel, PreTrainedTokenizerFast, T5Config, T5EncoderModel

    def tokenizer(max_length: int) -> Any:
        words = ["<pad>", "</s>", "<unk>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
        t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        t.pre_tokenizer = pre_tokenizers.Whitespace()
        return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", pad_token="<pad>", eos_token="</s>",
                                       model_max_length=max_length)

    dev = size == "dev"
    torch.manual_seed(0)
    if dev:
        vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                            up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=(128, 256, 512, 512),
                            layers_per_block=2, latent_channels=16, norm_num_groups=32, use_quant_conv=False,
                            use_post_quant_conv=False, shift_factor=0.1159, scaling_factor=0.3611, sample_size=1024)
    else:
        vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
                            up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=(8, 8), layers_per_block=1,
                            latent_channels=4, norm_num_groups=4, use_quant_conv=False, use_post_quant_conv=False,
                            shift_factor=0.0609, scaling_factor=1.5035, sample_size=32)
    clip_w, t5_w = (768, 4096) if dev else (32, 32)
    parts: Dict[str, Any] = {
        "scheduler": FlowMatchEulerDiscreteScheduler(),
        "vae": vae,
        "text_encoder": CLIPTextModel(CLIPTextConfig(vocab_size=32, hidden_size=clip_w, intermediate_size=37,
                                                     num_attention_heads=4, num_hidden_layers=1 if dev else 2,
                                                     projection_dim=clip_w, pad_token_id=0, bos_token_id=0,
                                                     eos_token_id=1)),
        "tokenizer": tokenizer(77),
        "text_encoder_2": T5EncoderModel(T5Config(vocab_size=32, d_model=t5_w, d_kv=8, d_ff=37,
                                                  num_layers=1 if dev else 2, num_heads=4, pad_token_id=0,
                                                  eos_token_id=1)),
        "tokenizer_2": tokenizer(512),
    }
    for k in ("vae", "text_encoder", "text_encoder_2"):
        parts[k].to(torch.bfloat16).eval()  # as from_pretrained leaves them: no dropout
    folder = os.path.join(workdir, "transformer")
    weights = os.path.join(folder, "diffusion_pytorch_model.safetensors")
    if dev:
        config = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                      num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                      guidance_embeds=True, axes_dims_rope=[16, 56, 56])
        import subprocess
        import sys

        if not os.path.exists(weights):  # 22 GiB, written once
            os.makedirs(folder, exist_ok=True)
            subprocess.run([sys.executable, "-m", "arena_gpu", "synth", "--layout", "flux-dev", "-o", weights], check=True)
        with torch.device("meta"):
            FluxTransformer2DModel.from_config(config).save_config(folder)
        return parts, config, weights
    config = dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
                  num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
                  axes_dims_rope=[4, 6, 6])
    FluxTransformer2DModel(**config).to(torch.bfloat16).save_pretrained(folder)
    return parts, config, weights


def random_data(folder: str, size: int) -> None:
    """Three random size x size images with captions."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for i, caption in enumerate(["a red cat", "a blue dog", "a green bird"]):
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(os.path.join(folder, f"{i}.png"))
        with open(os.path.join(folder, f"{i}.txt"), "w") as f:
            f.write(caption)


def model_parts(model: str) -> Tuple[Dict[str, Any], Dict[str, Any], str]:
    """A FLUX.1 pipeline's components but the transformer, its config, its weights' folder."""
    if not os.path.isdir(model):
        from huggingface_hub import snapshot_download

        model = snapshot_download(model)
    pipe = FluxPipeline.from_pretrained(model, transformer=None, torch_dtype=torch.bfloat16)
    parts = {k: v for k, v in pipe.components.items() if k != "transformer" and v is not None}
    config = dict(FluxTransformer2DModel.load_config(model, subfolder="transformer"))
    return parts, config, os.path.join(model, "transformer")


def load_image(path: str, size: int) -> torch.Tensor:
    """The image scaled and center-cropped to size x size, as a 1x3xHxW tensor in [-1, 1]."""
    im = Image.open(path).convert("RGB")
    s = size / min(im.size)
    im = im.resize((max(size, round(im.size[0] * s)), max(size, round(im.size[1] * s))), Image.BICUBIC)
    left, top = (im.size[0] - size) // 2, (im.size[1] - size) // 2
    im = im.crop((left, top, left + size, top + size))
    return torch.from_numpy(np.array(im)).permute(2, 0, 1)[None].float() / 127.5 - 1


@torch.no_grad()
def build_cache(pipe: FluxPipeline, data: str, size: int, device: str, max_seq: int) -> List[Dict[str, torch.Tensor]]:
    """Each image's packed latents and its caption's embeddings (on the CPU)."""
    files = sorted(f for f in glob.glob(os.path.join(data, "*"))
                   if os.path.splitext(f)[1].lower() in (".png", ".jpg", ".jpeg", ".webp"))
    if not files:
        raise SystemExit(f"train_lora: no images in {data}")
    vae = pipe.vae
    items = []
    for f in files:
        cap_file = os.path.splitext(f)[0] + ".txt"
        caption = open(cap_file).read().strip() if os.path.exists(cap_file) else ""
        px = load_image(f, size).to(device, vae.dtype)
        lat = vae.encode(px).latent_dist.sample()
        lat = (lat - vae.config.shift_factor) * vae.config.scaling_factor
        b, c, h, w = lat.shape
        packed = FluxPipeline._pack_latents(lat, b, c, h, w)
        emb, pooled, _ = pipe.encode_prompt(caption, prompt_2=None, device=device, max_sequence_length=max_seq)
        items.append({"latents": packed.cpu(), "h": torch.tensor(h), "w": torch.tensor(w),
                      "prompt_embeds": emb.cpu(), "pooled": pooled.cpu()})
    return items


# --tiny without a GPU: the transformer on arena's simulated device, whose
# memory is host memory, smaller than the model (about 300 KB): most blocks
# are streamed, in pieces, as a card smaller than a model streams them.
TINY_SIM = dict(device="sim", piece_size="16K", headroom=0, reserve=0, keep_last=0)
TINY_VRAM = "160K"


def attach_options(tiny: bool, vram: Optional[str]) -> Dict[str, Any]:
    """attach's options: ``vram`` (None: what the GPU has free); --tiny without a
    GPU, the simulated device under ``vram`` (default TINY_VRAM)."""
    if tiny and not torch.cuda.is_available():
        return dict(TINY_SIM, vram=vram or TINY_VRAM)
    return {"vram": vram} if vram else {}


def where(handle: Any) -> str:
    """The device the transformer runs on and its cap, for the first line."""
    cap = handle.arena.memory()["cap"]
    dev = "arena's simulated device" if handle.arena.backend == "sim" else handle.arena.device
    if not cap:
        return dev
    unit, k = next((u, k) for u, k in (("GiB", 30), ("MiB", 20), ("KiB", 10), ("bytes", 0)) if cap >= 1 << k)
    return f"{dev}, vram {cap / (1 << k):.4g} {unit}"


def duration(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """A line every step of a short run, every tenth of a long one (and the last):
    the step of all, the loss, the seconds a step since the last line, the time left
    at that rate."""

    def __init__(self, first: int, steps: int) -> None:
        self.steps = steps
        self.every = max(1, min(10, steps // 10))
        self.step, self.t = first, time.perf_counter()

    def __call__(self, step: int, loss: float) -> None:
        if step % self.every and step != self.steps:
            return
        now = time.perf_counter()
        per = (now - self.t) / max(1, step - self.step)
        self.step, self.t = step, now
        print(f"step {step}/{self.steps}: loss {loss:.4f}, {per:.2f} s a step, "
              f"{duration(per * (self.steps - step))} left", flush=True)


def save_lora(out: str, layers: Dict[str, torch.Tensor]) -> str:
    """The LoRA as diffusers' FluxPipeline.load_lora_weights reads it, written as the
    umask says (safetensors writes its files 0600; the run's other files follow the
    umask)."""
    FluxPipeline.save_lora_weights(out, transformer_lora_layers=layers, safe_serialization=True)
    path = os.path.join(out, "pytorch_lora_weights.safetensors")
    mask = os.umask(0o022)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a diffusers FLUX.1 folder or Hugging Face id")
    ap.add_argument("--cache", help="the cache of converted images (default: $ARENA_CACHE, else "
                                    "$XDG_CACHE_HOME/arena or ~/.cache/arena; --random: a folder in --workdir)")
    ap.add_argument("--data", help="a folder of images with .txt captions")
    ap.add_argument("--out", default="flux-lora",
                    help="the output folder: cache, checkpoint, previews, the LoRA (default: ./flux-lora)")
    ap.add_argument("--steps", type=int, help="default 1000; --tiny: 8")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--resolution", type=int, default=512)
    ap.add_argument("--guidance", type=float, default=1.0, help="the guidance input of a guidance-distilled model")
    ap.add_argument("--checkpoint-every", type=int, help="default 250; --tiny: 4; 0: never")
    ap.add_argument("--preview-every", type=int, help="default 250; --tiny: 4; 0: never")
    ap.add_argument("--preview-prompt", default="a photo of a cat")
    ap.add_argument("--preview-steps", type=int, default=20)
    ap.add_argument("--resume", action="store_true", help="go on from out/checkpoint.pt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vram", help="all the device memory the process may hold, e.g. 8G (default: what the GPU has "
                                   f"free; --tiny without a GPU: a simulated device, {TINY_VRAM})")
    ap.add_argument("--tiny", action="store_true", help="tiny random models and images, a few steps: seconds on a CPU, "
                                                        "nothing downloaded")
    ap.add_argument("--random", choices=["tiny", "dev"],
                    help="random weights and images, nothing downloaded: tiny models (as --tiny), or FLUX.1-dev's "
                         "transformer and VAE (about 45 GB of files in --workdir) to measure a GPU")
    ap.add_argument("--workdir", help="where --random writes its files, kept (default: a temporary folder, removed "
                                      "at the end)")
    args = ap.parse_args()
    args.random = args.random or ("tiny" if args.tiny else None)
    tiny = args.random == "tiny"
    for name, default, small in (("steps", 1000, 8), ("checkpoint_every", 250, 4), ("preview_every", 250, 4)):
        if getattr(args, name) is None:
            setattr(args, name, small if tiny else default)
    # torch 2.11's cuDNN attention failed in the backward at FLUX.1-dev's shapes on
    # an H200 (an illegal memory access; the plain model too, 2026-12-03): the flash
    # and memory-efficient kernels take its place.
    torch.backends.cuda.enable_cudnn_sdp(False)
    if not args.random and not (args.model and args.data):
        ap.error("give --model and --data, or --tiny")
    if args.random and not args.workdir:
        with tempfile.TemporaryDirectory(prefix="train-lora-") as tmp:  # removed at the end, or at an error
            train(args, tmp)
    else:
        train(args, args.workdir)


def train(args: argparse.Namespace, workdir: Optional[str]) -> None:
    os.makedirs(args.out, exist_ok=True)
    max_seq = 32 if args.random else 512
    if args.random:
        assert workdir is not None
        os.makedirs(workdir, exist_ok=True)
        parts, config, weights = random_models(workdir, args.random)
        source, cache = os.path.dirname(weights), args.cache or os.path.join(workdir, "cache")
        if args.random == "tiny":
            args.resolution = min(args.resolution, 32)
            args.preview_steps = min(args.preview_steps, 2)
        args.data = args.data or os.path.join(workdir, "data")
        random_data(args.data, args.resolution)
    else:
        parts, config, weights = model_parts(args.model)
        source, cache = weights, args.cache  # None: $ARENA_CACHE, else $XDG_CACHE_HOME/arena or ~/.cache/arena

    # The transformer: its weights the image's (converted into the cache on the first
    # run, a line and a tqdm bar saying so), frozen, built on the meta device; in train
    # mode the engine plans for a forward and a backward (with the recompute) per step.
    transformer = arena.torch.from_pretrained(FluxTransformer2DModel, source, mode="train", cache=cache,
                                              **attach_options(args.random == "tiny", args.vram))
    handle = arena.torch.handle(transformer)
    device = handle.arena.device
    plan = handle.plan()
    print(f"transformer ({handle.cache_entry.image}): {plan['n_resident']} blocks resident, "
          f"{plan['n_streamed']} streamed ({where(handle)})")
    pipe = FluxPipeline(transformer=transformer, **parts)
    for name in ("vae", "text_encoder", "text_encoder_2"):
        getattr(pipe, name).to(device)

    # Cached latents and text embeddings; the text encoders are not needed after.
    cache_path = os.path.join(args.out, "cache.pt")
    if os.path.exists(cache_path):
        cache = torch.load(cache_path)
    else:
        cache = build_cache(pipe, args.data, args.resolution, device, max_seq)
        torch.save(cache, cache_path + ".tmp")
        os.replace(cache_path + ".tmp", cache_path)
    with torch.no_grad():
        preview_emb, preview_pooled, _ = pipe.encode_prompt(args.preview_prompt, prompt_2=None, device=device,
                                                            max_sequence_length=max_seq)
    pipe.text_encoder.to("cpu")
    pipe.text_encoder_2.to("cpu")

    # The LoRA: trainable, in float32; the base weights stay the image's.
    torch.manual_seed(args.seed)
    transformer.add_adapter(LoraConfig(r=args.rank, lora_alpha=args.rank, init_lora_weights="gaussian",
                                       target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    transformer.enable_gradient_checkpointing()
    params = [p for p in transformer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr)
    step = 0
    ckpt_path = os.path.join(args.out, "checkpoint.pt")
    if args.resume and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location=device)
        set_peft_model_state_dict(transformer, ck["lora"])
        opt.load_state_dict(ck["optimizer"])
        step = int(ck["step"])
        print(f"resumed at step {step}")

    def save_checkpoint() -> None:
        torch.save({"step": step, "lora": get_peft_model_state_dict(transformer), "optimizer": opt.state_dict()},
                   ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    def preview() -> None:
        with handle.sampling(), torch.no_grad():
            img = pipe(prompt_embeds=preview_emb, pooled_prompt_embeds=preview_pooled, height=args.resolution,
                       width=args.resolution, num_inference_steps=args.preview_steps, guidance_scale=3.5,
                       generator=torch.Generator(device).manual_seed(args.seed)).images[0]
        img.save(os.path.join(args.out, f"preview-{step:06d}.png"))

    guidance = torch.full((1,), args.guidance, device=device) if config.get("guidance_embeds") else None
    t0, first, loss_v = time.perf_counter(), step, math.nan
    progress = Progress(first, args.steps)
    while step < args.steps:
        item = cache[step % len(cache)]
        # Each step's noise and time from a generator seeded by the step: a resumed run
        # takes the same steps as one that was not stopped.
        g = torch.Generator(device).manual_seed(args.seed * 1_000_003 + step)
        x0 = item["latents"].to(device, torch.bfloat16)
        noise = torch.randn(x0.shape, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
        sigma = torch.sigmoid(torch.randn((1,), generator=g, device=device))  # logit-normal times
        xt = ((1 - sigma) * x0.float() + sigma * noise.float()).to(torch.bfloat16)
        h, w = int(item["h"]), int(item["w"])
        img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, device, torch.bfloat16)
        emb = item["prompt_embeds"].to(device)
        txt_ids = torch.zeros(emb.shape[1], 3, device=device, dtype=torch.bfloat16)
        pred = transformer(hidden_states=xt, timestep=sigma.to(torch.bfloat16), guidance=guidance,
                           pooled_projections=item["pooled"].to(device), encoder_hidden_states=emb,
                           txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
        loss = F.mse_loss(pred.float(), (noise.float() - x0.float()))  # flow matching: velocity
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        loss_v = float(loss.detach())
        if not math.isfinite(loss_v):
            raise SystemExit(f"train_lora: step {step}: the loss is {loss_v}")
        progress(step, loss_v)
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            save_checkpoint()
        if args.preview_every and step % args.preview_every == 0:
            preview()
    seconds = time.perf_counter() - t0
    handle.end_step()

    path = save_lora(args.out, get_peft_model_state_dict(transformer))
    peak = f", torch's peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if device.startswith("cuda") else ""
    p = handle.plan()
    peak += f", arena's {(p['resident_bytes'] + p['slots'] * p['slot_bytes']) / 2**30:.2f} GiB"
    per = f", {seconds / (step - first):.3f} s a step" if step > first else ""
    print(f"wrote {path}: {step} steps, last loss {loss_v:.4f}{per}{peak}")
    handle.detach()  # (the image closed before a temporary folder holding it is removed)


if __name__ == "__main__":
    main()
