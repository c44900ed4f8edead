"""gpu_pipeline.py - a whole FluxPipeline (T5-XXL, CLIP-L, the transformer, the VAE) on the GPU.

  python3 bench/gpu_pipeline.py make DIR IMAGE --arena BIN
  python3 bench/gpu_pipeline.py RUN DIR IMAGE [--vram V] [--images N] [--steps S]

make: the pipeline at FLUX.1-dev's configs of every component (T5-XXL
  4.76 B parameters, CLIP-L, the transformer, the VAE; bf16, each module's
  own random initialization, built on the GPU), saved with save_pretrained
  to DIR (model_index.json and a folder per component, as a diffusers
  pipeline's folder is: put DIR on a tmpfs such as /dev/shm, ~34 GB) and
  converted into IMAGE by `BIN convert DIR -o IMAGE` (its seconds printed;
  IMAGE "-": not converted).
RUN, one process each (run it under bench/vram_peak.py for the process's
  peak as the driver counts it):
  resident    FluxPipeline.from_pretrained(DIR).to("cuda")
  model       diffusers' enable_model_cpu_offload() (a component on the
              device while it runs)
  sequential  diffusers' enable_sequential_cpu_offload() (each module's
              weights copied in as it runs)
  arena       every component built on the meta device from DIR's configs,
              the pipeline attached to IMAGE under one budget
              (arena.torch.attach(pipe, IMAGE[, vram=V]))
  pretrained  arena.torch.from_pretrained(FluxPipeline, DIR[, vram=V,
              quant=Q], cache=C): converted into the cache on its first
              call (cold; "converted": true in the record), found there
              on the next (warm); the cache's entries after it
  Prints one JSON line: first_image_from_start_s (from before diffusers'
  import to the first image's end: set-up, a conversion, the first image),
  the seconds of each image (1024x1024, S denoising
  steps, default 28, guidance 3.5, the prompt through both text encoders,
  the VAE decode; wall clock, the device synchronized after each denoising
  step, whose end goes to stderr as it happens), the set-up seconds,
  torch's peak, the host's peak RSS; for arena, the plan, per-component
  step records (what each step end moved, read and prepared) and the plan's
  decisions.
Needs a GPU, torch, diffusers and transformers, the arena package. The
tokenizers are word-level ones saved with the pipeline (no downloads): the
text encoders run on every position of 77 and 512 tokens as with the real
ones.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

FLUX_DEV = dict(in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128, num_attention_heads=24,
                joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
VAE = dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
           up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[128, 256, 512, 512], layers_per_block=2,
           act_fn="silu", latent_channels=16, norm_num_groups=32, sample_size=1024, scaling_factor=0.3611,
           shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True)
CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768, num_hidden_layers=12,
              num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu", bos_token_id=0,
              eos_token_id=2)
T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.0,
              feed_forward_proj="gated-gelu", tie_word_embeddings=False, layer_norm_epsilon=1e-6)
SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                 base_image_seq_len=256, max_image_seq_len=4096)
PROMPT = "a photo of a red cat on the mat"
BF16 = torch.bfloat16


def word_tokenizer(max_length: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "</s>": 2}
    for i, w in enumerate("a photo of cat dog red blue on the mat".split()):
        vocab[w] = 3 + i
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]", eos_token="</s>",
                                   model_max_length=max_length)


def build(device: str):
    """The four models at FLUX.1-dev's configs, bf16, frozen, on device ('cuda':
    their own initialization; 'meta': no values)."""
    import transformers as tf
    from diffusers import AutoencoderKL, FluxTransformer2DModel

    torch.manual_seed(0)
    out = {}
    with torch.device(device):
        out["transformer"] = FluxTransformer2DModel(**FLUX_DEV).to(BF16)
        out["vae"] = AutoencoderKL(**VAE).to(BF16)
        out["text_encoder"] = tf.CLIPTextModel(tf.CLIPTextConfig(**CLIP_L)).to(BF16)
        out["text_encoder_2"] = tf.T5EncoderModel(tf.T5Config(**T5_XXL)).to(BF16)
    for m in out.values():
        m.requires_grad_(False).eval()
    return out


def pipeline(models: dict):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), tokenizer=word_tokenizer(77),
                        tokenizer_2=word_tokenizer(512), **models)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def make(d: str, image: str, arena_bin: str) -> dict:
    t0 = time.perf_counter()
    pipe = pipeline(build("cuda"))
    res: dict = {"build_s": time.perf_counter() - t0}
    res["parameters"] = {k: sum(p.numel() for p in m.parameters()) for k, m in pipe.components.items()
                         if isinstance(m, torch.nn.Module)}
    t0 = time.perf_counter()
    pipe.save_pretrained(d)
    res["save_s"] = time.perf_counter() - t0
    del pipe
    torch.cuda.empty_cache()
    if image == "-":  # no image: the one-call runs make theirs in the cache
        return res
    t0 = time.perf_counter()
    subprocess.run([arena_bin, "convert", "-q", "--force", d, "-o", image], check=True)
    res["convert_s"] = time.perf_counter() - t0
    res["image_bytes"] = os.path.getsize(image)
    return res


def run(kind: str, d: str, image: str, vram, n_images: int, steps: int, cache=None, quant=None) -> dict:
    t_begin = time.perf_counter()
    from diffusers import FluxPipeline

    torch.backends.cuda.enable_cudnn_sdp(False)
    res: dict = {"run": kind, "vram": vram, "steps": steps}
    t0 = time.perf_counter()
    h = None
    if kind == "pretrained":
        import arena_gpu as arena
        import arena_gpu.torch as at

        before = {e["key"] for e in arena.cache_info(cache)}
        pipe = at.from_pretrained(FluxPipeline, d, cache=cache, **({"vram": vram} if vram else {}),
                                  **({"quant": quant} if quant else {}))
        pipe.set_progress_bar_config(disable=True)
        h = at.handle(pipe)
        info = arena.cache_info(cache)
        res["cache_entries"] = [{k: e.get(k) for k in ("key", "size", "path", "made")} for e in info]
        res["converted"] = any(e["key"] not in before for e in info)
        res["plan"] = h.plan()
    elif kind == "arena":
        import arena_gpu.torch as at

        pipe = pipeline(build("meta"))
        h = at.attach(pipe, image, **({"vram": vram} if vram else {}))
        res["plan"] = h.plan()
    else:
        pipe = FluxPipeline.from_pretrained(d, torch_dtype=BF16)
        pipe.set_progress_bar_config(disable=True)
        if kind == "resident":
            pipe.to("cuda")
        elif kind == "model":
            pipe.enable_model_cpu_offload()
        elif kind == "sequential":
            pipe.enable_sequential_cpu_offload()
        else:
            sys.exit(f"gpu_pipeline.py: unknown run {kind}")
    torch.cuda.synchronize()
    res["setup_s"] = time.perf_counter() - t0
    res["execution_device"] = str(pipe._execution_device)
    if h is not None and not res["execution_device"].startswith("cuda"):
        # diffusers takes the device from the first module's first parameter; an
        # attached module's may be a streamed block's, placed on no device yet
        type(pipe)._execution_device = property(lambda self: torch.device(h.arena.device))
        res["execution_device_set"] = res["execution_device"] = str(pipe._execution_device)
    if not res["execution_device"].startswith("cuda"):
        sys.exit(f"gpu_pipeline.py: the pipeline would run on {res['execution_device']}")
    times = []
    marks: list = []

    def step_end(p, i, t, kw):  # each denoising step's end, on stderr as it happens
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        print(f"image {len(times)} step {i} {marks[-1] - marks[0]:.3f}", file=sys.stderr, flush=True)
        return kw

    for i in range(n_images):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            img = pipe(PROMPT, height=1024, width=1024, num_inference_steps=steps, guidance_scale=3.5,
                       max_sequence_length=512, output_type="pt", callback_on_step_end=step_end,
                       generator=torch.Generator("cuda").manual_seed(i)).images
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if i == 0:  # from the start of run(): imports, set-up (a conversion too), the first image
            res["first_image_from_start_s"] = time.perf_counter() - t_begin
        res.setdefault("denoise_s", []).append(marks[-1] - marks[0] if marks else None)
        marks.clear()
        res["image_shape"] = list(img.shape)
    res["image_s"] = times
    res["torch_max_reserved"] = torch.cuda.max_memory_reserved()
    res["host_peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if h is not None:
        h.end_step()
        st = h.stats()
        res["records"] = [{k: r.get(k) for k in ("mode", "streamed_bytes", "moved_bytes", "misses", "stalls",
                                                   "resident_bytes", "end_s", "move_s", "promotions", "demotions",
                                                   "promoted_bytes", "host_read_bytes", "prepared_bytes",
                                                   "disk_bytes")} for r in st]
        res["decisions"] = h.decisions()
        res["memory"] = h.arena.memory()
        h.detach()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", help="make | resident | model | sequential | arena | pretrained")
    ap.add_argument("dir")
    ap.add_argument("image")
    ap.add_argument("--arena", default="build/arena", help="make: the arena command")
    ap.add_argument("--vram", default=None)
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--cache", default=None, help="pretrained: the cache's folder (default arena's: $ARENA_CACHE...)")
    ap.add_argument("--quant", default=None, help="pretrained: from_pretrained(quant=...)")
    a = ap.parse_args()
    if a.what == "make":
        res = make(a.dir, a.image, a.arena)
    else:
        res = run(a.what, a.dir, a.image, a.vram, a.images, a.steps, a.cache, a.quant)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
