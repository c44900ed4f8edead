#!/usr/bin/env python3
"""Sample an image with FLUX.1 whose transformer runs from an arena image.

    pip install './python[examples]'     # from the repository's root (arena-gpu is not on PyPI yet)
    python sample_flux.py --tiny         # tiny random models: seconds on a CPU, no download; writes flux.png
    python sample_flux.py --model ~/models/FLUX.1-dev --prompt "a cat on a windowsill" --out cat.png

--model is a diffusers FLUX.1 folder (or a Hugging Face id): the scheduler, the
VAE, the text encoders and the tokenizers come from it, and the transformer
comes from arena (``arena.torch.from_pretrained`` of <model>/transformer): its
weights converted into arena's cache on the first run (--cache, default
$ARENA_CACHE, else $XDG_CACHE_HOME/arena or ~/.cache/arena), built on the meta
device, what fits the GPU (or --vram, all the device memory the process may
hold) kept there, the rest streamed as each block runs.

--tiny builds tiny random models instead (nothing downloaded) and samples 4
steps. Without a GPU it runs on the CPU, its transformer on arena's simulated
device under --vram (default 160K), which streams most of its blocks.
--random dev builds FLUX.1-dev's transformer and VAE with random weights: a
GPU's time per image, without a download. --random writes its models (and,
without --cache, the cache) into --workdir, or a temporary folder removed when
the run ends. --plain runs the transformer from its safetensors weights without
arena, to compare.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

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


def model_parts(model: str) -> Tuple[Dict[str, Any], Dict[str, Any], str]:
    """A FLUX.1 pipeline's components but the transformer, its config, its weights' folder."""
    if not os.path.isdir(model):
        from huggingface_hub import snapshot_download

        model = snapshot_download(model)
    pipe = FluxPipeline.from_pretrained(model, transformer=None, torch_dtype=torch.bfloat16)
    parts = {k: v for k, v in pipe.components.items() if k != "transformer" and v is not None}
    config = dict(FluxTransformer2DModel.load_config(model, subfolder="transformer"))
    return parts, config, os.path.join(model, "transformer")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a diffusers FLUX.1 folder or Hugging Face id")
    ap.add_argument("--cache", help="the cache of converted images (default: $ARENA_CACHE, else "
                                    "$XDG_CACHE_HOME/arena or ~/.cache/arena; --random: a folder in --workdir)")
    ap.add_argument("--prompt", default="a photo of a cat")
    ap.add_argument("--out", default="flux.png", help="the PNG to write (default: ./flux.png)")
    ap.add_argument("--steps", type=int, help="denoising steps (default 28; --tiny: 4)")
    ap.add_argument("--guidance", type=float, default=3.5)
    ap.add_argument("--size", type=int, default=1024, help="height and width in pixels")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vram", help="all the device memory the process may hold, e.g. 8G (default: what the GPU has "
                                   f"free; --tiny without a GPU: a simulated device, {TINY_VRAM})")
    ap.add_argument("--tiny", action="store_true", help="tiny random models: seconds on a CPU, nothing downloaded")
    ap.add_argument("--random", choices=["tiny", "dev"],
                    help="random weights, nothing downloaded: tiny models (as --tiny), or FLUX.1-dev's transformer "
                         "and VAE (about 45 GB of files in --workdir) to measure a GPU")
    ap.add_argument("--workdir", help="where --random writes its files, kept (default: a temporary folder, removed "
                                      "at the end)")
    ap.add_argument("--plain", action="store_true", help="the transformer without arena, to compare")
    args = ap.parse_args()
    args.random = args.random or ("tiny" if args.tiny else None)
    if args.steps is None:
        args.steps = 4 if args.random == "tiny" else 28
    if not args.random and not args.model:
        ap.error("give --model (a FLUX.1 folder or id), or --tiny")
    if args.random and not args.workdir:
        with tempfile.TemporaryDirectory(prefix="sample-flux-") as tmp:  # removed at the end, or at an error
            sample(args, tmp)
    else:
        sample(args, args.workdir)


def sample(args: argparse.Namespace, workdir: Optional[str]) -> None:
    if args.random:
        assert workdir is not None
        os.makedirs(workdir, exist_ok=True)
        parts, config, weights = random_models(workdir, args.random)
        cache = args.cache or os.path.join(workdir, "cache")
        if args.random == "tiny":
            args.size = min(args.size, 32)
    else:
        parts, config, weights = model_parts(args.model)
        cache = args.cache  # None: $ARENA_CACHE, else $XDG_CACHE_HOME/arena or ~/.cache/arena

    if args.plain:
        from safetensors.torch import load_file

        transformer = FluxTransformer2DModel.from_config(config).to(torch.bfloat16)
        if os.path.isdir(weights):
            transformer = FluxTransformer2DModel.from_pretrained(weights, torch_dtype=torch.bfloat16)
        else:
            transformer.load_state_dict(load_file(weights))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        transformer.to(device)
    else:
        # Converted into the cache on the first run (a line and a tqdm bar say so), built
        # on the meta device (no memory for weights: they are the image's), attached.
        transformer = arena.torch.from_pretrained(FluxTransformer2DModel, os.path.dirname(weights) if args.random
                                                  else weights, cache=cache,
                                                  **attach_options(args.random == "tiny", args.vram))
        handle = arena.torch.handle(transformer)
        device = handle.arena.device  # "cuda:0", or "cpu" on the simulated device
        plan = handle.plan()
        print(f"transformer ({handle.cache_entry.image}): {plan['n_resident']} blocks resident, "
              f"{plan['n_streamed']} streamed ({where(handle)})")

    pipe = FluxPipeline(transformer=transformer, **parts)
    for name in ("vae", "text_encoder", "text_encoder_2"):
        getattr(pipe, name).to(device)
    t0 = time.perf_counter()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        out = pipe(args.prompt, height=args.size, width=args.size, num_inference_steps=args.steps,
                   guidance_scale=args.guidance, max_sequence_length=32 if args.random else 512,
                   generator=torch.Generator(device).manual_seed(args.seed), output_type="np").images
    seconds = time.perf_counter() - t0
    if not np.isfinite(out).all():
        raise SystemExit("sample_flux: the image has values that are not finite")
    img = pipe.numpy_to_pil(out)[0]
    img.save(args.out)
    peak = f", torch's peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if device.startswith("cuda") else ""
    if not args.plain:
        p = handle.plan()
        peak += f", arena's {(p['resident_bytes'] + p['slots'] * p['slot_bytes']) / 2**30:.2f} GiB"
    print(f"wrote {args.out}: {img.size[0]}x{img.size[1]}, {args.steps} steps in {seconds:.2f} s{peak}")
    if not args.plain:
        handle.detach()  # (the image closed before a temporary folder holding it is removed)


if __name__ == "__main__":
    main()
