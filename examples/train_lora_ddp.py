#!/usr/bin/env python3
"""Train a LoRA of FLUX.1 data-parallel, one process per GPU, the transformer's weights from an arena image.

    torchrun --nproc_per_node=8 train_lora_ddp.py --model ~/models/FLUX.1-dev --data ./my-images --out ./my-lora
    torchrun --nproc_per_node=2 train_lora_ddp.py --tiny     (the CPU, gloo: what CI runs; into ./flux-lora)

(On a host whose own name does not resolve, torchrun --standalone waits for
good at its rendezvous: add --local-addr 127.0.0.1 for a run on one host.)

The data-parallel form of train_lora.py (same options and defaults, --tiny's
too, same caches, the same LoRA file at the end): each process (torchrun starts one per GPU; NCCL on
GPUs, gloo on the CPU) attaches the transformer to the image
(``arena.torch.attach``) with its own plan for its GPU, and the processes of a
host hold ONE host copy of the streamed blocks: the first process of each
host loads it into memory they share, the others map it
(``share_host``, on by default under torch.distributed with more than one
process on the host; docs/PYTHON.md, "Several processes"). The LoRA is
wrapped in DistributedDataParallel (the arena's frozen weights are left out of
its broadcasts and reductions); each step takes --grad-accum examples a
process, world_size x --grad-accum in all, example i of the step at
(step x world_size + rank) x grad_accum + k of the cache, its noise seeded by
its index: a run of N processes computes the gradients one process with
--grad-accum N computes, bit for bit.

Rank 0 prepares (the random models of --tiny, the image, the cache of latents
and text embeddings), saves checkpoints and previews and writes the LoRA;
--resume goes on from its checkpoint. The last line says the host memory the
processes hold for the streamed blocks: their PSS (a page shared by k
processes counts 1/k in each) of the shared copy, summed, against one copy.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import re
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from diffusers import FluxPipeline, FluxTransformer2DModel
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

import arena_gpu as arena
from train_lora import (TINY_VRAM, Progress, attach_options, build_cache, model_parts, random_data, random_models,
                        save_lora, where)


def shared_host() -> Tuple[int, int]:
    """The arena regions this process maps (host copies shared with the host's
    other processes): their bytes and this process's PSS of them (a page k
    processes map counts 1/k), from /proc/self/smaps' memfd:arena-* mappings."""
    size = pss = 0
    inside = False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                    inside = "/memfd:arena-" in line
                elif inside and line.startswith("Size:"):
                    size += int(line.split()[1]) << 10
                elif inside and line.startswith("Pss:"):
                    pss += int(line.split()[1]) << 10
    except OSError:
        pass
    return size, pss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a diffusers FLUX.1 folder or Hugging Face id")
    ap.add_argument("--image", help="the transformer's arena image (made from the model when missing)")
    ap.add_argument("--data", help="a folder of images with .txt captions")
    ap.add_argument("--out", default="flux-lora",
                    help="the output folder: cache, checkpoint, previews, the LoRA (default: ./flux-lora)")
    ap.add_argument("--steps", type=int, help="default 1000; --tiny: 8")
    ap.add_argument("--grad-accum", type=int, default=1, help="examples a process takes each step")
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
    ap.add_argument("--vram", help="all the device memory each process may hold, e.g. 8G (default: what its GPU has "
                                   f"free; --tiny without a GPU: a simulated device, {TINY_VRAM})")
    ap.add_argument("--share-host", choices=["auto", "on", "off"], default="auto",
                    help="one host copy of the streamed blocks per host (auto: with more than one process on it)")
    ap.add_argument("--save-grads", help="rank 0 writes the LoRA's gradients of the first step here (torch.save)")
    ap.add_argument("--tiny", action="store_true", help="tiny random models and images, for a test without downloads")
    ap.add_argument("--random", choices=["tiny", "dev"], help="random weights and images, as train_lora.py's")
    ap.add_argument("--workdir", help="where --random writes its files, kept (default: a temporary folder, removed "
                                      "at the end)")
    args = ap.parse_args()
    args.random = args.random or ("tiny" if args.tiny else None)
    for name, default, small in (("steps", 1000, 8), ("checkpoint_every", 250, 4), ("preview_every", 250, 4)):
        if getattr(args, name) is None:
            setattr(args, name, small if args.random == "tiny" else default)
    if not args.random and not (args.model and args.data):
        ap.error("give --model and --data, or --tiny")
    if args.grad_accum < 1:
        ap.error("--grad-accum: 1 or more")

    # One process per GPU under torchrun (NCCL), or processes on the CPU (gloo);
    # run without torchrun: one process.
    cuda = torch.cuda.is_available()
    distributed = "RANK" in os.environ
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    if distributed:
        # --tiny's collectives take milliseconds: one that waits five minutes has
        # lost its peer, and fails saying so (gloo's own limit is 30 minutes).
        limit = datetime.timedelta(minutes=5 if args.random == "tiny" else 30)
        dist.init_process_group("nccl" if cuda else "gloo", timeout=limit)
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.backends.cuda.enable_cudnn_sdp(False)  # as train_lora.py (its note)
    device = f"cuda:{local_rank}" if cuda else "cpu"
    max_seq = 32 if args.random else 512

    # Rank 0 prepares the image and the cache; the others take their paths.
    os.makedirs(args.out, exist_ok=True)
    cache_path = os.path.join(args.out, "cache.pt")
    shared: List[Any] = [None, None]
    parts: Optional[Dict[str, Any]] = None
    tmp: Optional[tempfile.TemporaryDirectory[str]] = None
    if rank == 0:
        if args.random and not args.workdir:  # removed at the end (at an error, when Python exits)
            tmp = tempfile.TemporaryDirectory(prefix="train-lora-ddp-")
        workdir = args.workdir or (tmp.name if tmp else os.curdir)
        os.makedirs(workdir, exist_ok=True)
        if args.random:
            parts, config, weights = random_models(workdir, args.random)
            image = args.image or os.path.join(workdir, "transformer.arena")
            if args.random == "tiny":
                args.resolution = min(args.resolution, 32)
                args.preview_steps = min(args.preview_steps, 2)
            args.data = args.data or os.path.join(workdir, "data")
            random_data(args.data, args.resolution)
        else:
            parts, config, weights = model_parts(args.model)
            image = args.image or weights.rstrip("/") + ".arena"
        if not os.path.exists(image):
            arena.convert(weights, image)
        if not os.path.exists(cache_path):
            prep = FluxPipeline(transformer=None, **parts)
            for name in ("vae", "text_encoder", "text_encoder_2"):
                getattr(prep, name).to(device)
            items = build_cache(prep, args.data, args.resolution, device, max_seq)
            torch.save(items, cache_path + ".tmp")
            os.replace(cache_path + ".tmp", cache_path)
        shared = [config, image]
    if distributed:
        dist.broadcast_object_list(shared, src=0)
    config, image = shared
    cache = torch.load(cache_path)

    # The transformer: its weights the image's, frozen. Every process attaches (a
    # collective): the host's first loads the host copies, the others map them.
    open_kw = attach_options(args.random == "tiny", args.vram)
    share = None if args.share_host == "auto" else args.share_host == "on"
    with torch.device("meta"):
        transformer = FluxTransformer2DModel.from_config(config).to(torch.bfloat16)
    handle = arena.torch.attach(transformer, image, mode="train", share_host=share, **open_kw)
    plan = handle.plan()
    if rank == 0:
        print(f"{image}: {plan['n_resident']} blocks resident, {plan['n_streamed']} streamed ({where(handle)}), "
              f"{world} processes")

    # The LoRA: trainable, in float32, the same initial values in every process.
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
        if rank == 0:
            print(f"resumed at step {step}")
    model: Any = transformer
    if distributed:
        # DDP broadcasts and reduces the LoRA only: the arena's weights are frozen
        # and bound to arena memory (views of the ring between calls).
        frozen = [n for n, p in transformer.named_parameters() if not p.requires_grad]
        frozen += [n for n, _ in transformer.named_buffers()]
        DDP._set_params_and_buffers_to_ignore_for_model(transformer, frozen)
        model = DDP(transformer, device_ids=[local_rank] if cuda else None)

    def save_checkpoint() -> None:
        torch.save({"step": step, "lora": get_peft_model_state_dict(transformer), "optimizer": opt.state_dict()},
                   ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    def preview() -> None:
        assert parts is not None
        pipe = FluxPipeline(transformer=transformer, **parts)
        with handle.sampling(), torch.no_grad():
            emb, pooled, _ = pipe.encode_prompt(args.preview_prompt, prompt_2=None, device=device,
                                                max_sequence_length=max_seq)
            img = pipe(prompt_embeds=emb, pooled_prompt_embeds=pooled, height=args.resolution,
                       width=args.resolution, num_inference_steps=args.preview_steps, guidance_scale=3.5,
                       generator=torch.Generator(device).manual_seed(args.seed)).images[0]
        img.save(os.path.join(args.out, f"preview-{step:06d}.png"))

    guidance = torch.full((1,), args.guidance, device=device) if config.get("guidance_embeds") else None

    def loss_of(i: int) -> torch.Tensor:
        """The flow-matching loss of the cache's example i % len, its noise and time
        from a generator seeded by i (the same in any process count)."""
        item = cache[i % len(cache)]
        g = torch.Generator(device).manual_seed(args.seed * 1_000_003 + i)
        x0 = item["latents"].to(device, torch.bfloat16)
        noise = torch.randn(x0.shape, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
        sigma = torch.sigmoid(torch.randn((1,), generator=g, device=device))
        xt = ((1 - sigma) * x0.float() + sigma * noise.float()).to(torch.bfloat16)
        h, w = int(item["h"]), int(item["w"])
        img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, device, torch.bfloat16)
        emb = item["prompt_embeds"].to(device)
        txt_ids = torch.zeros(emb.shape[1], 3, device=device, dtype=torch.bfloat16)
        pred = model(hidden_states=xt, timestep=sigma.to(torch.bfloat16), guidance=guidance,
                     pooled_projections=item["pooled"].to(device), encoder_hidden_states=emb,
                     txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
        return F.mse_loss(pred.float(), (noise.float() - x0.float()))

    t0, first, loss_v = time.perf_counter(), step, math.nan
    progress = Progress(first, args.steps)
    while step < args.steps:
        total = torch.zeros(())
        for k in range(args.grad_accum):
            i = (step * world + rank) * args.grad_accum + k
            last = k == args.grad_accum - 1
            # DDP reduces the gradients once, after the last example of the step.
            with model.no_sync() if distributed and not last else contextlib.nullcontext():
                loss = loss_of(i) / args.grad_accum
                loss.backward()
            total += loss.detach().float().cpu()
        if args.save_grads and step == first and rank == 0:
            torch.save({n: p.grad.detach().cpu().clone() for n, p in transformer.named_parameters()
                        if p.requires_grad and p.grad is not None}, args.save_grads)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if distributed:
            dist.all_reduce(total)
            total /= world
        loss_v = float(total)
        if not math.isfinite(loss_v):
            raise SystemExit(f"train_lora_ddp: step {step}: the loss is {loss_v}")
        if rank == 0:
            progress(step, loss_v)
        if rank == 0 and args.checkpoint_every and step % args.checkpoint_every == 0:
            save_checkpoint()
        if rank == 0 and args.preview_every and step % args.preview_every == 0 and parts is not None:
            preview()
    seconds = time.perf_counter() - t0
    handle.end_step()

    # Host memory of the streamed blocks: each process's PSS of the shared copy.
    size, pss_mine = shared_host()
    mine = {"host_bytes": int(handle.plan()["host_bytes"]), "size": size, "pss": pss_mine}
    every: List[Any] = [mine] * world
    if distributed:
        every = [None] * world
        dist.all_gather_object(every, mine)
    if rank == 0:
        path = save_lora(args.out, get_peft_model_state_dict(transformer))
        per = f", {seconds / (step - first):.3f} s a step" if step > first else ""
        print(f"wrote {path}: {step} steps, last loss {loss_v:.4f}{per}")
        pss = [e["pss"] for e in every]
        print(f"host copies of the streamed blocks: {mine['host_bytes']} bytes; shared region {size} bytes; "
              f"its PSS in the {world} processes: {' + '.join(str(p) for p in pss)} = {sum(pss)} bytes")
    if distributed:
        dist.barrier()
    handle.detach()
    if distributed:
        dist.barrier()  # every process has closed the image before rank 0 removes its temporary folder
        dist.destroy_process_group()
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
