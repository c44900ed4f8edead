"""Any model: families of diffusers and transformers, each at a tiny random
config, saved the way each library saves it (save_pretrained), converted with
the default `arena convert` (blocks found from the checkpoint's structure, no
--block-pattern), attached built on the meta device and materialized, with
blocks streamed on the simulator: outputs and LoRA gradients equal the plain
model's bit for bit, training with each model's own checkpointing (around the
block, inside it, inside the layer's forward; non-reentrant and reentrant).
Then a tiny FluxPipeline (T5, CLIP, transformer, VAE) from its folder, one
image, one arena under one budget smaller than the pipeline: the plain
pipeline's image bit for bit.

Runs on CPU (the simulated device's memory is host memory): usage as
tests/python/test_torch.py (tests/python/run_torch.sh runs both).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import unittest
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import diffusers
import transformers as tf
from peft import LoraConfig, inject_adapter_in_model

import arena
import arena.torch as at

for name in ("diffusers", "transformers"):
    logging.getLogger(name).setLevel(logging.ERROR)
tf.logging.set_verbosity_error()
diffusers.utils.logging.set_verbosity_error()
diffusers.utils.logging.disable_progress_bar()

FIX = os.environ.get("ARENA_FIXTURES_DIR", "fixtures")
ARENA_BIN = os.environ.get("ARENA_BIN", "build/arena")
TMP = tempfile.mkdtemp(prefix="arena-models-")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)
BF16 = torch.bfloat16


def rn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


# --- the families ------------------------------------------------------------------------

class Family:
    """A model family at a tiny config: build() (random weights), inputs(seed), out(result)."""

    lora = ["to_q", "to_k", "to_v", "to_out.0"]  # diffusers' attention
    checkpointing = "around the block"

    def build(self) -> torch.nn.Module:
        raise NotImplementedError

    def inputs(self, seed: int) -> Dict[str, Any]:
        raise NotImplementedError

    def out(self, o: Any) -> torch.Tensor:
        return o.sample

    def enable_checkpointing(self, m: torch.nn.Module, reentrant: bool = False) -> None:
        if reentrant:
            def func(module: Any, *args: Any) -> Any:
                return torch.utils.checkpoint.checkpoint(module.__call__, *args, use_reentrant=True)

            m.enable_gradient_checkpointing(func)
        else:
            m.enable_gradient_checkpointing()


class Flux(Family):
    def build(self):
        cfg = json.load(open(os.path.join(FIX, "tiny_flux.json")))["config"]
        return diffusers.FluxTransformer2DModel(**cfg)

    def inputs(self, s):
        return dict(hidden_states=rn(s, 1, 16, 16), encoder_hidden_states=rn(s + 1, 1, 8, 32),
                    pooled_projections=rn(s + 2, 1, 16), timestep=torch.tensor([0.5]), img_ids=torch.zeros(16, 3),
                    txt_ids=torch.zeros(8, 3), guidance=torch.tensor([3.5]))


class SD3(Family):
    def build(self):
        return diffusers.SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=5,
                                               attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                                               caption_projection_dim=16, pooled_projection_dim=16, out_channels=4,
                                               pos_embed_max_size=8)

    def inputs(self, s):
        return dict(hidden_states=rn(s, 1, 4, 8, 8), encoder_hidden_states=rn(s + 1, 1, 6, 16),
                    pooled_projections=rn(s + 2, 1, 16), timestep=torch.tensor([500.0]))


class UNet(Family):
    checkpointing = "inside the blocks (their resnets and transformers)"

    def build(self):
        return diffusers.UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4, block_out_channels=(32, 32, 64), layers_per_block=2,
            down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
            attention_head_dim=8, norm_num_groups=8)

    def inputs(self, s):
        return dict(sample=rn(s, 1, 4, 16, 16), timestep=torch.tensor([500.0]),
                    encoder_hidden_states=rn(s + 1, 1, 6, 16))


class Wan(Family):
    def build(self):
        return diffusers.WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                                               in_channels=4, out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32,
                                               num_layers=5, rope_max_seq_len=32)

    def inputs(self, s):
        return dict(hidden_states=rn(s, 1, 4, 2, 8, 8), timestep=torch.tensor([500]),
                    encoder_hidden_states=rn(s + 1, 1, 6, 16))


class HunyuanVideo(Family):
    """Its token refiner's blocks run before the transformer blocks; the image orders them after."""

    def build(self):
        return diffusers.HunyuanVideoTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
            num_single_layers=2, num_refiner_layers=2, patch_size=1, patch_size_t=1, text_embed_dim=16,
            pooled_projection_dim=8, rope_axes_dim=(2, 2, 4), guidance_embeds=True)

    def inputs(self, s):
        return dict(hidden_states=rn(s, 1, 4, 1, 8, 8), timestep=torch.tensor([500]),
                    encoder_hidden_states=rn(s + 1, 1, 6, 16), encoder_attention_mask=torch.ones(1, 6, dtype=torch.bool),
                    pooled_projections=rn(s + 2, 1, 8), guidance=torch.tensor([3500.0]))


class LTX(Family):
    def build(self):
        return diffusers.LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=2,
                                                    attention_head_dim=8, cross_attention_dim=16, num_layers=5,
                                                    caption_channels=16)

    def inputs(self, s):
        return dict(hidden_states=rn(s, 1, 32, 8), encoder_hidden_states=rn(s + 1, 1, 6, 16), timestep=torch.tensor([500]),
                    encoder_attention_mask=torch.ones(1, 6, dtype=torch.bool), num_frames=2, height=4, width=4)


class CogVideoX(Family):
    def build(self):
        return diffusers.CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                                     out_channels=4, time_embed_dim=8, text_embed_dim=16, num_layers=5,
                                                     sample_width=8, sample_height=8, sample_frames=9, patch_size=2,
                                                     max_text_seq_length=6)

    def inputs(self, s):
        return dict(hidden_states=rn(s, 1, 3, 4, 8, 8), encoder_hidden_states=rn(s + 1, 1, 6, 16),
                    timestep=torch.tensor([500]))


class PixArt(Family):
    def build(self):
        return diffusers.PixArtTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                                  out_channels=8, num_layers=5, cross_attention_dim=16, sample_size=8,
                                                  patch_size=2, caption_channels=16)

    def inputs(self, s):
        return dict(hidden_states=rn(s, 1, 4, 8, 8), encoder_hidden_states=rn(s + 1, 1, 6, 16),
                    timestep=torch.tensor([500]), added_cond_kwargs={"resolution": None, "aspect_ratio": None})


class AutoencoderKL(Family):
    lora = ["to_q", "to_k", "to_v", "conv1"]

    def build(self):
        return diffusers.AutoencoderKL(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                                       up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4,
                                       norm_num_groups=8, layers_per_block=1)

    def inputs(self, s):
        return dict(sample=rn(s, 1, 3, 16, 16))


class T5Encoder(Family):
    """Its tied shared/encoder.embed_tokens; block 0 alone holds the relative attention bias."""

    lora = ["q", "k", "v", "o"]
    checkpointing = "inside the layer's forward (transformers)"

    def build(self):
        return tf.T5EncoderModel(tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=5, num_heads=4,
                                             relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                             dropout_rate=0.0))

    def inputs(self, s):
        return dict(input_ids=torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(s)))

    def out(self, o):
        return o.last_hidden_state

    def enable_checkpointing(self, m, reentrant=False):
        m.activation_checkpointing_enable({"use_reentrant": reentrant})


class CLIPText(T5Encoder):
    """Its position ids: a buffer the model computes."""

    lora = ["q_proj", "k_proj", "v_proj", "out_proj"]

    def build(self):
        return tf.CLIPTextModel(tf.CLIPTextConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=5, num_attention_heads=4, max_position_embeddings=16,
                                                  projection_dim=16, bos_token_id=0, eos_token_id=1, pad_token_id=1))


class Llama(T5Encoder):
    """Its rotary inv_freq: a buffer the model computes."""

    lora = ["q_proj", "k_proj", "v_proj", "o_proj"]

    def build(self):
        return tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=64))

    def out(self, o):
        return o.logits


class Qwen2(Llama):
    """Its LM head tied to the embeddings."""

    def build(self):
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=64, tie_word_embeddings=True))


ZOO: Dict[str, Family] = dict(flux=Flux(), sd3=SD3(), unet=UNet(), wan=Wan(), hunyuan=HunyuanVideo(), ltx=LTX(),
                              cogvideox=CogVideoX(), pixart=PixArt(), vae=AutoencoderKL(), t5=T5Encoder(),
                              clip=CLIPText(), llama=Llama(), qwen2=Qwen2())


def make(name: str, meta: bool, seed: int = 0) -> torch.nn.Module:
    """The family's model in bf16, frozen, in eval mode: on meta, or materialized with
    the random weights of ``seed`` (0: those of the image)."""
    fam = ZOO[name]
    if meta:
        with torch.device("meta"):
            m = fam.build()
    else:
        torch.manual_seed(seed)
        m = fam.build()
    m = m.to(BF16)
    m.requires_grad_(False)
    return m.eval()


_images: Dict[str, str] = {}


def image(name: str) -> str:
    """The family's model (seed 0) saved by its library and converted, once."""
    if name not in _images:
        d = os.path.join(TMP, name)
        make(name, meta=False).save_pretrained(d)
        path = d + ".arena"
        subprocess.run([ARENA_BIN, "convert", "-q", d, "-o", path], check=True)
        _images[name] = path
    return _images[name]


def streaming(path: str, mode: str = "sample", piece: Optional[str] = None, **extra: Any) -> Dict[str, Any]:
    """Options that stream on the simulator: a device as small as the smallest plan
    (in whole blocks, or in pieces of ``piece``) allows."""
    base = dict(device="sim", headroom=0, reserve=0, keep_last=0, piece_size=piece or 0, **extra)
    key = (path, mode, piece, tuple(sorted(extra.items())))
    if key not in _floors:
        lo, hi = 0, os.path.getsize(path)  # opens at hi (everything resident), not at lo
        while hi - lo > 1024:
            mid = (lo + hi) // 2
            try:
                arena.open(path, mode=mode, sim_capacity=mid, **base).close()
                hi = mid
            except arena.Error as e:
                if e.code != "BUDGET":
                    raise
                lo = mid
        _floors[key] = hi
    return dict(base, sim_capacity=_floors[key])


_floors: Dict[Any, int] = {}


LORA_SEED = 1


def add_lora(m: torch.nn.Module, targets: List[str]) -> None:
    torch.manual_seed(LORA_SEED)
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian"), m)
    torch.manual_seed(LORA_SEED + 1)
    for n, p in m.named_parameters():
        if "lora_" in n:
            p.data = p.data.to(BF16)
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02)


def lora_params(m: torch.nn.Module) -> Dict[str, torch.nn.Parameter]:
    return {n: p for n, p in m.named_parameters() if "lora_" in n}


def train_steps(name: str, m: torch.nn.Module, steps: int = 2, reentrant: bool = False,
                checkpointing: bool = True) -> Tuple[List[float], Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """LoRA steps with the model's own checkpointing and AdamW: (losses, the last
    step's gradients, the adapters after)."""
    fam = ZOO[name]
    if checkpointing:
        fam.enable_checkpointing(m, reentrant)
    m.train()
    ps = lora_params(m)
    opt = torch.optim.AdamW(ps.values(), lr=1e-3)
    losses: List[float] = []
    grads: Dict[str, torch.Tensor] = {}
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = fam.out(m(**fam.inputs(s))).float().square().mean()
        loss.backward()
        losses.append(loss.item())
        grads = {n: p.grad.clone() for n, p in ps.items()}
        opt.step()
    return losses, grads, {n: p.detach().clone() for n, p in ps.items()}


def differ(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> List[str]:
    assert a.keys() == b.keys(), (sorted(a)[:3], sorted(b)[:3])
    return [k for k in a if not torch.equal(a[k], b[k])]


def streamed(tc: unittest.TestCase, h: at.Handle) -> None:
    h.end_step()
    tc.assertGreater(h.plan()["n_streamed"], 0, "blocks streamed")
    tc.assertGreater(sum(r["streamed_bytes"] for r in h.stats()), 0)


class Models(unittest.TestCase):
    """Every family, sampling and LoRA training, streamed (tests added below, two per family)."""

    def sampling(self, name: str) -> None:
        fam, path = ZOO[name], image(name)
        plain = make(name, meta=False)
        with torch.no_grad():
            want = [fam.out(plain(**fam.inputs(s))) for s in (0, 1)]
        for meta in (True, False):
            with self.subTest(meta=meta):
                m = make(name, meta=meta, seed=7)  # materialized: other weights, replaced by the image's
                h = at.attach(m, path, **streaming(path))
                with torch.no_grad():
                    for _ in range(2):
                        for s, w in zip((0, 1), want):
                            self.assertTrue(torch.equal(fam.out(m(**fam.inputs(s))), w), f"input {s}")
                streamed(self, h)
                h.detach()

    def training(self, name: str) -> None:
        fam, path = ZOO[name], image(name)
        plain = make(name, meta=False)
        add_lora(plain, fam.lora)
        want = train_steps(name, plain)
        for meta, piece in ((True, None), (False, "4K")):
            with self.subTest(meta=meta, piece=piece):
                m = make(name, meta=meta, seed=7)
                if not meta:
                    add_lora(m, fam.lora)  # before attach: peft's base_layer names map to the image's
                # (in pieces, a ring of more slots than a block's pieces: a recompute holds them
                # all, acquired in the modules' order, which the ring's first-in-first-out places
                # with gaps between them)
                h = at.attach(m, path, mode="train", **streaming(path, "train", piece, depth=10 if piece else 2))
                if meta:
                    add_lora(m, fam.lora)
                got = train_steps(name, m)
                self.assertEqual(got[0], want[0], "losses")
                self.assertEqual(differ(got[1], want[1]), [], f"gradients ({fam.checkpointing})")
                self.assertEqual(differ(got[2], want[2]), [], "adapters after the steps")
                streamed(self, h)
                h.detach()


def _add(name: str) -> None:
    def s(self: Models) -> None:
        self.sampling(name)

    def t(self: Models) -> None:
        self.training(name)

    s.__doc__ = f"{type(ZOO[name]).__name__}: sampling, meta-built and materialized, streamed."
    t.__doc__ = f"{type(ZOO[name]).__name__}: LoRA training with its checkpointing, whole blocks and pieces."
    setattr(Models, f"test_{name}_sampling", s)
    setattr(Models, f"test_{name}_training", t)


for _n in ZOO:
    _add(_n)


if __name__ == "__main__":
    unittest.main()
