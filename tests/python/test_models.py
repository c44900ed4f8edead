"""Any model: families of diffusers and transformers, each at a tiny random
config, saved the way each library saves it (save_pretrained), converted with
the default `arena convert` (blocks found from the checkpoint's structure, no
--block-pattern), attached built on the meta device and materialized, with
blocks streamed on the simulator: outputs and LoRA gradients equal the plain
model's bit for bit, training with each model's own checkpointing (around the
block, inside it, inside the layer's forward; non-reentrant and reentrant).
Wan and Qwen-Image also train with offload_saved. Then a tiny FluxPipeline
(T5, CLIP, transformer, VAE) from its folder, one image, one arena under one
budget smaller than the pipeline: the plain pipeline's image bit for bit; and a
tiny Wan 2.2 pipeline (UMT5, two experts switched at a boundary step, its VAE)
attached, from from_pretrained and from offload: its videos bit for bit, the
experts' resident sets trading places at the switch.

Runs on CPU (the simulated device's memory is host memory): usage as
tests/python/test_torch.py (tests/python/run_torch.sh runs both).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import io
import os

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # (save_pretrained's shards bar)
import functools
import json
import logging
import shutil
import subprocess
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import diffusers
import transformers as tf
from peft import LoraConfig, inject_adapter_in_model

import arena_gpu as arena
import arena_gpu.torch as at
from tiers import slow

for name in ("diffusers", "transformers"):
    logging.getLogger(name).setLevel(logging.ERROR)
tf.logging.set_verbosity_error()
tf.utils.logging.disable_progress_bar()
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
    offload_saved = False  # training is also run with attach(offload_saved=...)

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
    offload_saved = True

    def build(self):
        return diffusers.WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                                               in_channels=4, out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32,
                                               num_layers=5, rope_max_seq_len=32)

    def inputs(self, s):
        return dict(hidden_states=rn(s, 1, 4, 2, 8, 8), timestep=torch.tensor([500]),
                    encoder_hidden_states=rn(s + 1, 1, 6, 16))


class QwenImage(Family):
    """Two streams (image and text) through every block; its rotary frequencies: complex
    tensors in plain attributes, which the model computes."""

    offload_saved = True

    def build(self):
        return diffusers.QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=5,
                                                     attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                                                     axes_dims_rope=(2, 2, 4))

    def inputs(self, s):
        return dict(hidden_states=rn(s, 1, 16, 16), encoder_hidden_states=rn(s + 1, 1, 6, 16),
                    encoder_hidden_states_mask=torch.ones(1, 6, dtype=torch.bool), timestep=torch.tensor([0.5]),
                    img_shapes=[[(1, 4, 4)]])


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


class Lumina2(Family):
    """Its rotary frequencies: a list of tensors in a plain attribute, which the model computes."""

    def build(self):
        return diffusers.Lumina2Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, hidden_size=32,
                                                   num_layers=3, num_refiner_layers=1, num_attention_heads=4,
                                                   num_kv_heads=2, multiple_of=16, axes_dim_rope=(4, 2, 2),
                                                   axes_lens=(32, 32, 32), cap_feat_dim=16)

    def inputs(self, s):
        return dict(hidden_states=rn(s, 1, 4, 8, 8), timestep=torch.tensor([0.5]),
                    encoder_hidden_states=rn(s + 1, 1, 6, 16), encoder_attention_mask=torch.ones(1, 6, dtype=torch.bool))


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


ZOO: Dict[str, Family] = dict(flux=Flux(), sd3=SD3(), unet=UNet(), wan=Wan(), qwenimage=QwenImage(), hunyuan=HunyuanVideo(), ltx=LTX(),
                              cogvideox=CogVideoX(), pixart=PixArt(), lumina2=Lumina2(), vae=AutoencoderKL(), t5=T5Encoder(),
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


def add_lora(m: torch.nn.Module, targets: Any, library: bool = False) -> None:
    """LoRA adapters on ``targets`` (peft's target_modules), seeded: the same in every model.
    ``library``: through the model's own ``add_adapter`` (diffusers' or transformers', which
    check peft's version), not peft's ``inject_adapter_in_model``."""
    torch.manual_seed(LORA_SEED)
    config = LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights="gaussian")
    if library:
        m.add_adapter(config)
    else:
        inject_adapter_in_model(config, m)
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
        x = fam.inputs(s)
        if reentrant:  # (a reentrant checkpoint's output needs a gradient only if an input does)
            for k in ("hidden_states", "sample"):
                if k in x:
                    x[k].requires_grad_(True)
        loss = fam.out(m(**x)).float().square().mean()
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
        runs: List[Tuple[bool, Optional[str], Optional[int]]] = [(True, None, None), (False, "4K", None)]
        if fam.offload_saved:  # what the forward saves for the backward kept in host memory
            runs += [(True, None, 1), (True, "4K", 1)]
        for meta, piece, offload in runs:
            with self.subTest(meta=meta, piece=piece, offload_saved=offload):
                m = make(name, meta=meta, seed=7)
                if not meta:
                    add_lora(m, fam.lora)  # before attach: peft's base_layer names map to the image's
                # (at the floor, with the ring the rule sizes: in pieces, a block's pieces and one
                # more, what a recompute holds; a ring of more slots hid the last Qwen-Image
                # block's pieces held to the step's end, its text stream's output unused)
                extra = {} if offload is None else dict(offload_saved=offload)
                h = at.attach(m, path, mode="train", **extra,
                              **streaming(path, "train", piece, **({} if piece else dict(depth=2))))
                if meta:
                    add_lora(m, fam.lora)
                got = train_steps(name, m)
                self.assertEqual(got[0], want[0], "losses")
                self.assertEqual(differ(got[1], want[1]), [], f"gradients ({fam.checkpointing})")
                self.assertEqual(differ(got[2], want[2]), [], "adapters after the steps")
                if offload is not None:
                    st = h.offload_stats()  # the last step's: each block's inputs at least
                    nblocks = len({b.name.partition("#")[0] for b in h.arena.blocks if b.container})
                    self.assertGreater(st["tensors"], nblocks, st)
                    self.assertGreaterEqual(st["fetched_ahead"] + st["fetched_late"], st["tensors"],
                                            "every saved tensor came back")
                streamed(self, h)
                h.detach()


# The families' tests that take seconds on a two-core machine (@slow: make test runs
# them, make check does not): the UNet, the VAE, SD3 and Wan, and the training of
# the others where it does.
_SLOW = {"unet_sampling", "unet_training", "vae_sampling", "vae_training", "sd3_sampling", "sd3_training",
         "wan_sampling", "wan_training", "qwenimage_training", "pixart_training", "qwen2_training", "t5_training",
         "ltx_training", "clip_training"}


def _add(name: str) -> None:
    def s(self: Models) -> None:
        self.sampling(name)

    def t(self: Models) -> None:
        self.training(name)

    s.__doc__ = f"{type(ZOO[name]).__name__}: sampling, meta-built and materialized, streamed."
    t.__doc__ = f"{type(ZOO[name]).__name__}: LoRA training with its checkpointing, whole blocks and pieces."
    for kind, test in (("sampling", s), ("training", t)):
        setattr(Models, f"test_{name}_{kind}", slow(test) if f"{name}_{kind}" in _SLOW else test)


for _n in ZOO:
    _add(_n)
assert _SLOW <= {f"{n}_{k}" for n in ZOO for k in ("sampling", "training")}, "_SLOW names a test that is not made"


class Checkpointing(unittest.TestCase):
    """Reentrant checkpointing: around the block (diffusers' Flux with a reentrant
    function), inside the blocks (the UNet's resnets and transformers), inside the
    layer's forward (transformers' Llama, T5): LoRA gradients bit for bit, streamed."""

    def reentrant(self, name: str) -> None:
        fam, path = ZOO[name], image(name)
        plain = make(name, meta=False)
        add_lora(plain, fam.lora)
        want = train_steps(name, plain, reentrant=True)
        for piece in (None, "4K"):
            with self.subTest(piece=piece):
                m = make(name, meta=True)
                ring = {} if piece else dict(depth=2)  # in pieces: the rule's ring
                h = at.attach(m, path, mode="train", **streaming(path, "train", piece, **ring))
                add_lora(m, fam.lora)
                got = train_steps(name, m, reentrant=True)
                self.assertEqual(got[0], want[0])
                self.assertEqual(differ(got[1], want[1]), [])
                streamed(self, h)
                h.detach()

    def test_flux_around_the_block(self):
        self.reentrant("flux")

    @slow
    def test_unet_inside_the_blocks(self):
        self.reentrant("unet")

    @slow
    def test_llama_inside_the_layers(self):
        self.reentrant("llama")

    def test_t5_inside_the_layers(self):
        self.reentrant("t5")

    @slow
    def test_without_checkpointing(self):
        """No checkpointing: the weights each block's forward saves come back in its backward."""
        for name in ("unet", "llama"):
            fam, path = ZOO[name], image(name)
            plain = make(name, meta=False)
            add_lora(plain, fam.lora)
            want = train_steps(name, plain, checkpointing=False)
            with self.subTest(name=name):
                m = make(name, meta=True)
                h = at.attach(m, path, mode="train", **streaming(path, "train", None, depth=2))
                add_lora(m, fam.lora)
                got = train_steps(name, m, checkpointing=False)
                self.assertEqual(differ(got[1], want[1]), [])
                streamed(self, h)
                h.detach()


class Modes(unittest.TestCase):
    """attach(mode="sample") puts the module and its submodules in eval mode, as
    from_pretrained returns a model: a model built by its constructor (train mode,
    T5's dropout active) samples as the plain model in eval mode, bit for bit.
    mode="train" leaves the modules' modes as they are."""

    @staticmethod
    def t5(dropout: float) -> torch.nn.Module:
        with torch.device("meta"):
            m = tf.T5EncoderModel(tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=5, num_heads=4,
                                              relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                              dropout_rate=dropout))
        return m.to(BF16).requires_grad_(False)

    def test_sample_mode_is_eval_mode(self):
        fam, path = ZOO["t5"], image("t5")
        plain = make("t5", meta=False)  # eval, the image's weights
        with torch.no_grad():
            want = fam.out(plain(**fam.inputs(0)))
        m = self.t5(0.1)
        self.assertTrue(all(x.training for x in m.modules()), "a constructor's model is in train mode")
        h = at.attach(m, path, **streaming(path))
        self.assertFalse(any(x.training for x in m.modules()), "eval mode, every submodule")
        with torch.no_grad():
            for _ in range(2):
                self.assertTrue(torch.equal(fam.out(m(**fam.inputs(0))), want), "dropout inactive")
        streamed(self, h)
        h.detach()
        self.assertFalse(m.training, "detach leaves the mode as it is")

    def test_train_mode_is_left_alone(self):
        path = image("t5")
        for training in (True, False):
            with self.subTest(training=training):
                m = self.t5(0.1).train(training)
                h = at.attach(m, path, mode="train", **streaming(path, "train", None, depth=2))
                self.assertTrue(all(x.training == training for x in m.modules()))
                h.detach()


class AddAdapter(unittest.TestCase):
    """LoRA added the way a user adds it, the model library's ``add_adapter`` (a text
    encoder's in transformers, a transformer's in diffusers), after attach: training
    streamed equals the plain model's with the same call, bit for bit. transformers'
    refuses a peft older than it needs (transformers 5.24 with peft 0.21.2: "use a
    version >= 0.22.0"): tests/python/requirements-torch.txt's pins must agree."""

    def check(self, name: str) -> None:
        fam, path = ZOO[name], image(name)
        plain = make(name, meta=False)
        add_lora(plain, fam.lora, library=True)
        want = train_steps(name, plain)
        m = make(name, meta=True)
        h = at.attach(m, path, mode="train", **streaming(path, "train", None, depth=2))
        add_lora(m, fam.lora, library=True)
        self.assertEqual(sorted(m.peft_config), ["default"])
        got = train_steps(name, m)
        self.assertEqual(got[0], want[0], "losses")
        self.assertEqual(differ(got[1], want[1]), [], "gradients")
        self.assertEqual(differ(got[2], want[2]), [], "adapters after the steps")
        streamed(self, h)
        h.detach()

    @slow
    def test_transformers_clip_text_encoder(self):
        self.check("clip")

    def test_diffusers_flux_transformer(self):
        self.check("flux")


class EncoderLayer(torch.nn.TransformerEncoderLayer):
    """A layer of plain torch (its attention an nn.MultiheadAttention, which reads its
    out_proj's weights without calling it) that checkpoints where its ``where`` says:
    "layer" its own forward, "module" a method of it (the attention's) and a module in
    it (linear2); "direct" reads linear2's weights without calling it; "" none."""

    where = ""
    reentrant = False

    def forward(self, src: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        ck = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=self.reentrant)
        if self.where == "layer":
            return ck(super().forward, src)
        if self.where == "module":
            x = src + ck(self._sa_block, self.norm1(src), None, None)
            return x + ck(self.linear2, self.activation(self.linear1(self.norm2(x))))
        if self.where == "direct":
            x = src + self._sa_block(self.norm1(src), None, None)
            y = self.activation(self.linear1(self.norm2(x)))
            return x + torch.nn.functional.linear(y, self.linear2.weight, self.linear2.bias)
        return super().forward(src)


class Stack(torch.nn.Module):
    """Layers of EncoderLayer; ``around``: the model checkpoints each layer's call."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(16, 32)
        self.layers = torch.nn.ModuleList([EncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
                                           for _ in range(4)])
        self.head = torch.nn.Linear(32, 16)
        self.around = False
        self.reentrant = False
        self.peek = False  # reads a layer's weight outside its call

    def set(self, where: str = "", around: bool = False, reentrant: bool = False) -> "Stack":
        self.around, self.reentrant = around, reentrant
        for layer in self.layers:
            layer.where, layer.reentrant = where, reentrant
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        if self.peek:
            x = x + self.layers[1].linear2.bias
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=self.reentrant) if self.around else layer(x)
        return self.head(x)


class Unheld(unittest.TestCase):
    """A weight used while its block is not held is never read: a checkpoint's recompute
    that reads it (calling modules of the block, or its forward, not the block) holds
    the block for the backward and reads it bound again; a forward that reads it
    outside the block's call is refused, naming it. Plain torch layers (EncoderLayer)
    checkpointed in every place a model can put it (around each layer by the model,
    inside the layer's own forward, around a module and a method inside it; reentrant
    or not), trained with LoRA in whole blocks and in pieces: the plain model's losses
    and gradients bit for bit, where the recompute used to run on released weights
    (their places still viewing the ring) and gave other gradients. diffusers' and
    transformers' own checkpointing: Models, Checkpointing."""

    LORA = r"layers\.\d\.linear[12]"

    @classmethod
    def setUpClass(cls):
        from safetensors.torch import save_model

        plain = cls.make(meta=False)
        src = os.path.join(TMP, "stack.safetensors")
        save_model(plain, src)
        cls.path = os.path.join(TMP, "stack.arena")
        subprocess.run([ARENA_BIN, "convert", "-q", src, "-o", cls.path], check=True)

    @staticmethod
    def make(meta: bool, seed: int = 0) -> Stack:
        torch.manual_seed(seed)
        with torch.device("meta" if meta else "cpu"):
            m = Stack()
        return m.to(BF16).requires_grad_(False)

    @staticmethod
    def steps(m: torch.nn.Module, reentrant: bool) -> Tuple[List[float], Dict[str, torch.Tensor]]:
        m.train()
        ps = lora_params(m)
        opt = torch.optim.AdamW(ps.values(), lr=1e-3)
        losses = []
        for s in range(2):
            opt.zero_grad(set_to_none=True)
            x = rn(s, 2, 8, 16).requires_grad_(reentrant)  # (a reentrant checkpoint's output needs an input that does)
            loss = m(x).float().square().mean()
            loss.backward()
            losses.append(loss.item())
            grads = {n: p.grad.clone() for n, p in ps.items()}
            opt.step()
        return losses, grads

    @slow
    def test_checkpointing_anywhere(self):
        places = [("around each layer", dict(around=True)), ("inside the layer's forward", dict(where="layer")),
                  ("around a module and a method inside the layer", dict(where="module"))]
        for what, kw in places:
            for reentrant in (False, True):
                plain = self.make(meta=False).set(reentrant=reentrant, **kw)
                add_lora(plain, self.LORA)
                want = self.steps(plain, reentrant)
                for piece in (None, "4K"):
                    with self.subTest(what, reentrant=reentrant, piece=piece):
                        m = self.make(meta=True).set(reentrant=reentrant, **kw)
                        h = at.attach(m, self.path, mode="train",
                                      **streaming(self.path, "train", piece, depth=10 if piece else 2))
                        add_lora(m, self.LORA)
                        got = self.steps(m, reentrant)
                        self.assertEqual(got[0], want[0], "losses")
                        self.assertEqual(differ(got[1], want[1]), [], "gradients")
                        streamed(self, h)
                        h.detach()

    def test_read_outside_the_block(self):
        x = rn(0, 2, 8, 16)
        plain = self.make(meta=False).set(where="direct").eval()  # as attach(mode="sample") puts the model
        with torch.no_grad():
            want = plain(x)
        m = self.make(meta=True).set(where="direct")
        h = at.attach(m, self.path, **streaming(self.path))
        with torch.no_grad():
            self.assertTrue(torch.equal(m(x), want), "whole blocks: a layer reads its module's weights in its call")
            # between calls the layers' weights are not held: a read of one is refused
            w = m.layers[2].linear1.weight
            self.assertEqual((w.shape, w.dtype, w.device.type), (torch.Size([64, 32]), BF16, "cpu"))
            self.assertIsInstance(w, torch.nn.Parameter)
            self.assertIn("'layers.2.linear1.weight' (64, 32) torch.bfloat16 on cpu, of 'layers.2', not held now",
                          repr(w))
            c = copy.deepcopy(w)  # a copy reads nothing either: its shape and dtype on meta
            self.assertEqual(((c + 1).device.type, c.shape), ("meta", w.shape))
            with self.assertRaises(arena.Error) as cm:
                w.sum()
            self.assertEqual(cm.exception.code, "USAGE")
            self.assertIn("layers.2: 'layers.2.linear1.weight' was read while the block was not held (outside the "
                          "block's call and its backward)", cm.exception.message)
            sd = m.state_dict()  # reads nothing of them: their shapes and dtypes on meta, the globals' values
            self.assertEqual((sd["layers.2.linear1.weight"].device.type, sd["layers.2.linear1.weight"].shape),
                             ("meta", torch.Size([64, 32])))
            self.assertTrue(torch.equal(sd["embed.weight"], plain.embed.weight))
            m.peek = True  # a forward that reads a layer's weight outside the layer's call
            with self.assertRaises(arena.Error) as cm:
                m(x)
            self.assertIn("'layers.1.linear2.bias' was read while the block was not held", cm.exception.message)
            m.peek = False
            self.assertTrue(torch.equal(m(x), want), "and it goes on")
        streamed(self, h)
        h.detach()
        self.assertEqual(m.layers[2].linear1.weight.device.type, "meta", "detached: the module's own again")
        # in pieces, a module's weights are acquired for the calls of the modules that
        # own them or hold them (nn.MultiheadAttention reading out_proj's); a layer's
        # forward reading linear2's without calling it is refused
        m = self.make(meta=True).set()
        h = at.attach(m, self.path, **streaming(self.path, "sample", "4K"))
        with torch.no_grad():
            self.assertTrue(torch.equal(m(x), plain.set()(x)), "in pieces, attention's out_proj read by it")
            m.set(where="direct")
            with self.assertRaises(arena.Error) as cm:
                m(x)
        self.assertIn("'layers.0.linear2.weight' was read while its piece 'layers.0#", cm.exception.message)
        self.assertIn("stream the block whole (piece_size=0)", cm.exception.message)
        h.detach()


class PiecesOutOfOrder(unittest.TestCase):
    """Pieces are cut in the order of the image's names; an SDXL-style UNet's blocks call
    their modules in another (resnets and attentions alternate, the attentions named
    first), so a piece is used again after others. Sampling in small pieces holds at most
    one piece of a block while the next is acquired, the ring's rule (a piece used again
    later is let go when the ring needs its room, and acquired again): the plain model's
    outputs, step after step, where the calls as learned held up to four pieces at once
    and filled the ring."""

    @staticmethod
    def build() -> torch.nn.Module:
        return diffusers.UNet2DConditionModel(
            sample_size=8, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=2,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            transformer_layers_per_block=2, cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
            addition_embed_type="text_time", addition_time_embed_dim=8, projection_class_embeddings_input_dim=40,
            use_linear_projection=True)

    @staticmethod
    def inputs(s: int) -> Dict[str, Any]:
        return dict(sample=rn(s, 1, 4, 8, 8), timestep=torch.tensor([500.0]), encoder_hidden_states=rn(s + 1, 1, 6, 32),
                    added_cond_kwargs=dict(text_embeds=rn(s + 2, 1, 16), time_ids=rn(s + 3, 1, 3)))

    @slow
    def test_sdxl_unet_in_small_pieces(self):
        torch.manual_seed(0)
        plain = self.build().to(BF16).requires_grad_(False).eval()
        d = os.path.join(TMP, "sdxl_unet")
        plain.save_pretrained(d)
        path = d + ".arena"
        subprocess.run([ARENA_BIN, "convert", "-q", d, "-o", path], check=True)
        with torch.no_grad():
            want = [plain(**self.inputs(s)).sample for s in (0, 1)]
        with torch.device("meta"):
            m = self.build()
        m = m.to(BF16).requires_grad_(False).eval()
        h = at.attach(m, path, **streaming(path, "sample", "64K"))
        names = [b.name for b in h.arena.blocks]
        self.assertIn("up_blocks.0#22", names, "blocks in many pieces")
        most = [0]  # the most pieces of a block held while it acquires another
        for pb in h._pieced:
            acquire = pb._acquire

            def counted(idx: int, pb=pb, acquire=acquire) -> None:
                most[0] = max(most[0], len(pb.held))
                acquire(idx)

            pb._acquire = counted
        with torch.no_grad():
            for step in range(4):
                for s, w in zip((0, 1), want):
                    self.assertTrue(torch.equal(m(**self.inputs(s)).sample, w), f"step {step}, input {s}")
        self.assertEqual(most[0], 1, "one piece held while the next is acquired")
        streamed(self, h)
        h.detach()


class Order(unittest.TestCase):
    def test_image_order_is_not_the_call_order(self):
        """HunyuanVideo's token refiner runs before its transformer blocks; the image
        orders its blocks after them. attach takes the order from the module (the
        order its modules are made in): the engine prefetches by it from the first
        step, which misses nothing."""
        fam, path = ZOO["hunyuan"], image("hunyuan")
        with arena.open(path, device="sim") as a:
            names = [b.name for b in a.blocks]
        self.assertLess(names.index("transformer_blocks.0"), names.index("context_embedder.token_refiner.refiner_blocks.0"))
        m = make("hunyuan", meta=True)
        h = at.attach(m, path, learn=False, **streaming(path))
        sched = [names[i] for i in h.arena.schedule()]
        self.assertEqual(sched[:2], ["context_embedder.token_refiner.refiner_blocks.0",
                                     "context_embedder.token_refiner.refiner_blocks.1"])
        self.assertEqual(sorted(sched), sorted(names[1:]))
        plain = make("hunyuan", meta=False)
        with torch.no_grad():
            want = fam.out(plain(**fam.inputs(0)))
            for _ in range(3):
                self.assertTrue(torch.equal(fam.out(m(**fam.inputs(0))), want))
        h.end_step()
        self.assertEqual([r["misses"] for r in h.stats()], [0, 0, 0])
        self.assertEqual([names[i] for i in h.arena.schedule()], sched, "the order run is the module's")
        h.detach()
        # an order given that is not the order run: the first step misses, the
        # order run is learned and later steps prefetch by it
        m = make("hunyuan", meta=True)
        h = at.attach(m, path, learn=False, **streaming(path))
        h.arena.set_schedule(list(range(1, len(names))))  # the image's order
        with torch.no_grad():
            for _ in range(3):
                self.assertTrue(torch.equal(fam.out(m(**fam.inputs(0))), want))
        h.end_step()
        st = h.stats()
        self.assertGreater(st[0]["misses"], 0)
        self.assertTrue(st[0]["schedule_learned"])
        self.assertEqual([r["misses"] for r in st[1:]], [0, 0])
        with self.assertRaises(arena.Error) as cm:
            h.arena.set_schedule([0])
        self.assertIn("the globals block", cm.exception.message)
        h.detach()


class PlainTorch(unittest.TestCase):
    """A model of plain torch modules: blocks that are lists never called themselves
    (each of their layers called by the model), an output layer tied to the
    embedding, a buffer computed in __init__."""

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(16, 32)
            self.stages = torch.nn.ModuleList(
                [torch.nn.ModuleList([torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 32)])
                 for _ in range(5)])
            self.head = torch.nn.Linear(32, 16, bias=False)
            self.head.weight = self.embed.weight
            self.register_buffer("scale", torch.linspace(0.5, 1.5, 32), persistent=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids) * self.scale
            for up, norm, down in self.stages:
                x = x + down(torch.nn.functional.gelu(up(norm(x))))
            return self.head(x)

    @classmethod
    def make(cls, meta: bool, seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        with torch.device("meta" if meta else "cpu"):
            m = cls.Model()
        return m.to(BF16).requires_grad_(False)

    @classmethod
    def setUpClass(cls):
        from safetensors.torch import save_model

        plain = cls.make(meta=False)
        src = os.path.join(TMP, "plain.safetensors")
        save_model(plain, src)  # one name of the tied pair
        cls.path = os.path.join(TMP, "plain.arena")
        subprocess.run([ARENA_BIN, "convert", "-q", src, "-o", cls.path], check=True)
        cls.ids = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            cls.want = plain(cls.ids)

    def test_sampling_and_training(self):
        m = self.make(meta=False, seed=7)
        h = at.attach(m, self.path, **streaming(self.path))
        self.assertEqual([b.name for b in h.arena.blocks[1:]], [f"stages.{i}" for i in range(5)])
        self.assertIs(m.head.weight, m.embed.weight, "one copy for both names")
        with torch.no_grad():
            for _ in range(2):
                self.assertTrue(torch.equal(m(self.ids), self.want))
        streamed(self, h)
        h.detach()
        # training adapters of the layers, no checkpointing
        plain = self.make(meta=False)
        add_lora(plain, r"stages\.\d\.[02]")
        m = self.make(meta=False, seed=7)
        add_lora(m, r"stages\.\d\.[02]")
        h = at.attach(m, self.path, mode="train", **streaming(self.path, "train", None, depth=2))

        def steps(model: torch.nn.Module) -> Tuple[List[float], Dict[str, torch.Tensor]]:
            ps = lora_params(model)
            losses = []
            for s in range(2):
                for p in ps.values():
                    p.grad = None
                loss = model(self.ids + s).float().square().mean()
                loss.backward()
                losses.append(loss.item())
            return losses, {n: p.grad.clone() for n, p in ps.items()}

        want = steps(plain)
        got = steps(m)
        self.assertEqual(got[0], want[0])
        self.assertEqual(differ(got[1], want[1]), [])
        streamed(self, h)
        h.detach()

    def test_a_buffer_on_meta_it_cannot_compute(self):
        m = self.make(meta=True)
        with self.assertRaises(arena.Error) as cm:
            at.attach(m, self.path, device="sim")
        msg = cm.exception.message
        self.assertIn("'scale' is a buffer the model computes", msg)
        self.assertIn("no module above it is built from a config alone", msg)
        self.assertIn("accelerate.init_empty_weights()", msg)
        m.scale = torch.linspace(0.5, 1.5, 32).to(BF16)  # set before attach: then it runs
        h = at.attach(m, self.path, device="sim")
        with torch.no_grad():
            self.assertTrue(torch.equal(m(self.ids), self.want))
        h.detach()

    def test_tensors_in_a_plain_attribute_on_meta(self):
        """Tensors a module keeps in a plain attribute (in a dict of lists here; Lumina2's
        rotary frequencies are a list): built on meta, a model built from a config alone
        gets them computed (Models.test_lumina2_*); a plain torch model's are refused at
        attach, naming them, where they used to fail in the first forward."""

        class WithTables(self.Model):
            def __init__(self) -> None:
                super().__init__()
                self.tables = {"gain": [torch.linspace(0.5, 1.5, 16).to(BF16)]}

            def forward(self, ids: torch.Tensor) -> torch.Tensor:
                return super().forward(ids) * self.tables["gain"][0]

        torch.manual_seed(0)
        plain = WithTables().to(BF16).requires_grad_(False)  # the image's weights
        with torch.no_grad():
            want = plain(self.ids)
        with torch.device("meta"):
            m = WithTables()
        m = m.to(BF16).requires_grad_(False)
        m.scale = torch.linspace(0.5, 1.5, 32).to(BF16)  # (the buffer: test_a_buffer_on_meta_it_cannot_compute)
        with self.assertRaises(arena.Error) as cm:
            at.attach(m, self.path, device="sim")
        msg = cm.exception.message
        self.assertIn("1 problem(s): 'tables' holds tensors on the meta device in a plain attribute", msg)
        self.assertIn("no module above it is built from a config alone", msg)
        self.assertEqual(m.tables["gain"][0].device.type, "meta", "as it was")
        m.tables = {"gain": [torch.linspace(0.5, 1.5, 16).to(BF16)]}  # set before attach: then it runs
        h = at.attach(m, self.path, **streaming(self.path))
        with torch.no_grad():
            self.assertTrue(torch.equal(m(self.ids), want))
        h.detach()


# --- a whole pipeline under one budget ----------------------------------------------------

def word_tokenizer(max_length: int) -> Any:
    """A tokenizer of a few words (the pipeline calls it as any tokenizer; no files needed)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, "</s>": 2}
    for i, w in enumerate("a photo of cat dog red blue on the mat".split()):
        vocab[w] = 3 + i
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]", eos_token="</s>",
                                      model_max_length=max_length)


def flux_pipeline(meta: bool, seed: int = 0) -> Any:
    """A tiny FluxPipeline: CLIP (4 layers), T5 (4 blocks), the transformer of
    fixtures/tiny_flux.json, a VAE (latents of 4 channels: the transformer's 16 packed
    2 x 2), in bf16, on meta or with the random weights of ``seed``."""
    cfg = json.load(open(os.path.join(FIX, "tiny_flux.json")))["config"]
    ctx = torch.device("meta") if meta else torch.device("cpu")
    torch.manual_seed(seed)
    with ctx:
        transformer = diffusers.FluxTransformer2DModel(**cfg)
        vae = diffusers.AutoencoderKL(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                                      up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8,
                                      layers_per_block=1, shift_factor=0.0)
        clip = tf.CLIPTextModel(tf.CLIPTextConfig(vocab_size=1000, hidden_size=16, intermediate_size=32,
                                                  num_hidden_layers=4, num_attention_heads=2,
                                                  max_position_embeddings=77, projection_dim=16))
        t5 = tf.T5EncoderModel(tf.T5Config(vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=4, num_heads=4,
                                           relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                           dropout_rate=0.0))
    for m in (transformer, vae, clip, t5):
        m.to(BF16).requires_grad_(False).eval()
    pipe = diffusers.FluxPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=clip,
                                  tokenizer=word_tokenizer(77), text_encoder_2=t5, tokenizer_2=word_tokenizer(16),
                                  transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def clip_tokenizer() -> Any:
    """A CLIPTokenizer of letters (CLIPTokenizer.from_pretrained reads it back from its folder)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = {t: i for i, t in enumerate(["<|startoftext|>", "<|endoftext|>"] + letters + [c + "</w>" for c in letters])}
    return tf.CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def t5_tokenizer() -> Any:
    """A T5TokenizerFast of letters and a few words (T5TokenizerFast.from_pretrained reads it back)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [("\u2581" + w, -3.0) for w in "a photo of cat dog".split()] + [(c, -5.0) for c in letters]
    return tf.T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=16)


def generate(pipe: Any, prompt: str, seed: int) -> torch.Tensor:
    with torch.no_grad():
        return pipe(prompt, height=32, width=32, num_inference_steps=3, max_sequence_length=16, output_type="pt",
                    generator=torch.Generator().manual_seed(seed)).images


class Pipeline(unittest.TestCase):
    """A FluxPipeline's folder (save_pretrained: model_index.json, a folder per
    component) converted in one command into one image; its T5, CLIP, transformer
    and VAE attached to one arena whose device holds less than the pipeline: the
    plain pipeline's images bit for bit, each component's call a step."""

    @classmethod
    def setUpClass(cls):
        plain = flux_pipeline(meta=False)
        cls.want = [generate(plain, "a photo of a cat", 0), generate(plain, "a red dog on the mat", 1)]
        d = os.path.join(TMP, "flux_pipeline")
        plain.save_pretrained(d)
        cls.path = d + ".arena"
        subprocess.run([ARENA_BIN, "convert", "-q", d, "-o", cls.path], check=True)

    def test_one_image_of_the_components(self):
        with arena.open(self.path, device="sim") as a:
            firsts = {n.split(".", 1)[0] for n in a.tensor_names()}
            self.assertEqual(firsts, {"text_encoder", "text_encoder_2", "transformer", "vae"})
            containers = [b.container for b in a.blocks if b.container]
            for want in ("text_encoder.encoder.layers", "text_encoder_2.encoder.block",
                         "transformer.transformer_blocks", "transformer.single_transformer_blocks",
                         "vae.decoder.up_blocks", "vae.decoder.mid_block"):
                self.assertIn(want, containers)

    @slow
    def test_under_one_budget(self):
        total = os.path.getsize(self.path)
        for meta in (True, False):
            with self.subTest(meta=meta):
                pipe = flux_pipeline(meta=meta, seed=7)
                opts = streaming(self.path)
                h = at.attach(pipe, self.path, **opts)
                self.assertLess(opts["sim_capacity"], total, "the device holds less than the pipeline")
                self.assertRegex(repr(h), r"^<arena\.torch\.Handle FluxPipeline \(text_encoder, text_encoder_2, "
                                          r"transformer, vae\) to '.*flux_pipeline\.arena': sample, vram: what the "
                                          r"device has free, sim, \d+ blocks, [1-9]\d* streamed>$")
                got = [generate(pipe, "a photo of a cat", 0), generate(pipe, "a red dog on the mat", 1)]
                for g, w in zip(got, self.want):
                    self.assertTrue(torch.equal(g, w))
                h.end_step()
                st = h.stats()
                # a step per component call: CLIP, T5, 3 denoising steps, the VAE decode; twice
                self.assertEqual(len(st), 12, [r["acquires"] for r in st])
                # each component's order is kept and set before its next call: the
                # second image misses nothing (the first VAE decode ran blocks of the
                # decoder only, whose order the VAE module could not say)
                self.assertEqual([r["misses"] for r in st[:5]], [0] * 5)
                self.assertEqual([r["misses"] for r in st[6:]], [0] * 6)
                self.assertGreater(sum(r["streamed_bytes"] for r in st), 0)
                self.assertGreater(h.plan()["n_streamed"], 0)
                for comp, m in pipe.components.items():
                    if isinstance(m, torch.nn.Module):
                        self.assertIs(getattr(m, "_arena_handle")(), h, comp)
                h.detach()
                self.assertFalse(hasattr(pipe.transformer, "_arena_handle"))

    def test_components_in_another_dtype(self):
        """Said first, in one line: how many, the dtype the image holds, which components to build in it."""
        pipe = flux_pipeline(meta=True)
        pipe.vae.to(torch.float32)
        pipe.text_encoder.to(torch.float32)
        n = sum(1 for _ in pipe.vae.parameters()) + sum(1 for _ in pipe.text_encoder.parameters())
        with self.assertRaises(arena.Error) as cm:
            at.attach(pipe, self.path, device="sim")
        self.assertIn(f"FluxPipeline to {self.path}: {n} tensors are float32, the image holds bfloat16: build "
                      f"text_encoder and vae with .to(torch.bfloat16); {n} problem(s): ", cm.exception.message)

    def test_a_component_missing(self):
        pipe = flux_pipeline(meta=True)
        pipe.vae = None
        with self.assertRaises(arena.Error) as cm:
            at.attach(pipe, self.path, device="sim")
        self.assertIn("the image's component 'vae' has no module in the pipeline", cm.exception.message)
        self.assertEqual({p.device.type for p in pipe.transformer.parameters()}, {"meta"}, "nothing bound")
        # a dict of modules; one the image does not hold, on meta, could not run
        comps = dict(flux_pipeline(meta=True).components)
        with torch.device("meta"):
            comps["image_encoder"] = torch.nn.Linear(4, 4)
        with self.assertRaises(arena.Error) as cm:
            at.attach(comps, self.path, device="sim")
        self.assertIn("component 'image_encoder' is on the meta device and the image holds none of it",
                      cm.exception.message)
        comps["image_encoder"] = torch.nn.Linear(4, 4)  # materialized: it runs as it is
        h = at.attach(comps, self.path, device="sim")
        self.assertEqual(len(h._roots), 4)
        h.detach()


def wan22_pipeline(meta: bool, seed: int = 0) -> Any:
    """A tiny Wan 2.2 A14B-style WanPipeline: two experts of the same shape (``transformer``
    for the high-noise steps, ``transformer_2`` for the low-noise ones, switched at
    ``boundary_ratio``), a UMT5 text encoder, an AutoencoderKLWan; in bf16, on meta or
    with the random weights of ``seed``."""
    ctx = torch.device("meta") if meta else torch.device("cpu")
    torch.manual_seed(seed)
    with ctx:
        experts = [diffusers.WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                                                   in_channels=16, out_channels=16, text_dim=32, freq_dim=16, ffn_dim=32,
                                                   num_layers=8, rope_max_seq_len=32) for _ in range(2)]
        vae = diffusers.AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                         temperal_downsample=[False, True, True])
        umt5 = tf.UMT5EncoderModel(tf.UMT5Config(vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_heads=4,
                                                 relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                                 dropout_rate=0.0))
    for m in (*experts, vae, umt5):
        m.to(BF16).requires_grad_(False).eval()
    pipe = diffusers.WanPipeline(tokenizer=t5_tokenizer(), text_encoder=umt5, vae=vae,
                                 scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), transformer=experts[0],
                                 transformer_2=experts[1], boundary_ratio=0.5)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def wan22_video(pipe: Any, seed: int) -> torch.Tensor:
    """5 frames of 32 x 32 in 4 steps with classifier-free guidance (two calls a step):
    the timesteps 1000, 667 (the first expert) and 334, 1 (the second: boundary 500)."""
    with torch.no_grad():
        return pipe("a photo of a cat", negative_prompt="a dog", height=32, width=32, num_frames=5,
                    num_inference_steps=4, guidance_scale=3.0, max_sequence_length=16, output_type="pt",
                    generator=torch.Generator().manual_seed(seed)).frames


class Wan22Pipeline(unittest.TestCase):
    """Wan 2.2's two experts in one pipeline under one budget that holds part of one
    expert beside the ring: attach, from_pretrained and offload give the plain
    pipeline's videos bit for bit, streaming. At the switch (a step of the other
    expert: another schedule), the experts' resident sets trade places: while one
    runs, the budget's room is its blocks, none of the other's, and the switch
    copies no more than the blocks its first step uses; the blocks it moves keep
    their host copies, so the next switch reads nothing from the image."""

    EXPERT_BLOCKS = 5  # blocks of one expert the room beside the smallest plan holds (of 8)

    @classmethod
    def setUpClass(cls):
        plain = wan22_pipeline(meta=False)
        cls.want = [wan22_video(plain, 0), wan22_video(plain, 1)]
        cls.folder = os.path.join(TMP, "wan22_pipeline")
        plain.save_pretrained(cls.folder)
        cls.path = cls.folder + ".arena"
        subprocess.run([ARENA_BIN, "convert", "-q", cls.folder, "-o", cls.path], check=True)
        cls.cache = os.path.join(TMP, "wan22_cache")

    @classmethod
    def options(cls, path: str) -> Dict[str, Any]:
        """Streaming on the simulator: the smallest plan's device and room for EXPERT_BLOCKS
        blocks of an expert (whole experts would need 8 each)."""
        opts = streaming(path)
        with arena.open(path, device="sim") as a:
            block = next(b.nbytes for b in a.blocks if b.name == "transformer.blocks.0")
        opts["sim_capacity"] += cls.EXPERT_BLOCKS * block + block // 2
        return opts

    def check(self, pipe: Any, want: Optional[List[torch.Tensor]] = None) -> None:
        """Two videos: ``want`` (the plain pipeline's) bit for bit; at each expert's call,
        the resident bytes by component."""
        h = at.handle(pipe)
        a = h.arena
        comp = [b.name.split(".", 1)[0] for b in a.blocks]
        size = [b.nbytes for b in a.blocks]
        expert = sum(z for c, z in zip(comp, size) if c == "transformer")
        self.assertEqual(expert, sum(z for c, z in zip(comp, size) if c == "transformer_2"))

        def resident() -> Dict[str, int]:
            out: Dict[str, int] = {"transformer": 0, "transformer_2": 0}
            for i, c in enumerate(comp):
                if a.block_state(i)[0]:
                    out[c] = out.get(c, 0) + size[i]
            return out

        def unhosted() -> List[str]:
            """The experts' resident blocks without a host copy (demoted, each would be read again)."""
            return [a.blocks[i].name for i, c in enumerate(comp)
                    if c in ("transformer", "transformer_2") and a.block_state(i)[0] and not a.block_state(i)[2]]

        calls: List[Tuple[str, int, Dict[str, int]]] = []  # (expert, the engine's step, resident bytes)
        hooks, gone = [], []
        for name in ("transformer", "transformer_2"):
            def pre(_m: Any, _args: Any, name: str = name) -> None:
                calls.append((name, len(a.stats()), resident()))  # (after arena's hook: the step begun)
                gone.extend(unhosted())

            hooks.append(getattr(pipe, name).register_forward_pre_hook(pre))
        got = [wan22_video(pipe, 0), wan22_video(pipe, 1)]
        for hk in hooks:
            hk.remove()
        for g, w in zip(got, want or self.want):
            self.assertTrue(torch.equal(g, w), (g.float() - w.float()).abs().max())
        h.end_step()
        self.assertGreater(h.plan()["n_streamed"], 0)
        self.assertGreater(sum(r["streamed_bytes"] for r in h.stats()), 0)
        names = [c for c, _, _ in calls]
        self.assertEqual(names, (["transformer"] * 4 + ["transformer_2"] * 4) * 2, "both experts run, in turn")
        # while an expert runs, the room is its blocks: none of the other's
        for name, _, res in calls:
            other = "transformer_2" if name == "transformer" else "transformer"
            self.assertEqual(res[other], 0, (name, res))
            self.assertGreater(res[name], 0, (name, res))
            self.assertLess(res[name], expert, "part of an expert is resident: the rest streams")
        # as far as the budget allows: both hold the same room, from their first call on
        firsts = [res[name] for i, (name, _, res) in enumerate(calls) if i % 4 == 0]
        self.assertEqual(len(set(firsts)), 1, firsts)
        self.assertGreaterEqual(firsts[0], self.EXPERT_BLOCKS * size[comp.index("transformer")])
        # the switch copies no more than the blocks its first step uses (each once)
        st = {r["step"]: r for r in h.stats()}
        switches = [calls[i][1] for i in (4, 12)]
        for s in switches:
            self.assertLessEqual(st[s]["promoted_bytes"] + st[s]["streamed_bytes"], expert, st[s])
            self.assertEqual(st[s]["misses"], 0, st[s])
        moved = [d for d in h.decisions() if d["why"] == "schedule" and d["step"] in switches]
        self.assertEqual([d["promoted_bytes"] for d in moved], [firsts[0]] * 2, moved)
        # the blocks a switch moved keep their host copies: the next switch reads nothing
        self.assertEqual(gone, [], "resident blocks of an expert without a host copy")

    def test_attach(self):
        pipe = wan22_pipeline(meta=True, seed=7)
        h = at.attach(pipe, self.path, **self.options(self.path))
        self.assertRegex(repr(h), r"^<arena\.torch\.Handle WanPipeline \(text_encoder, transformer, transformer_2, "
                                  r"vae\) to ")
        self.check(pipe)
        h.detach()

    @slow
    def test_from_pretrained(self):
        with contextlib.redirect_stderr(io.StringIO()):  # (the cache's line)
            first = at.from_pretrained(diffusers.WanPipeline, self.folder, cache=self.cache, device="sim",
                                       progress=False)
        h = at.handle(first)
        image = str(h.cache_entry.image)
        h.detach()
        pipe = at.from_pretrained(diffusers.WanPipeline, self.folder, cache=self.cache, progress=False,
                                  **self.options(image))
        pipe.set_progress_bar_config(disable=True)
        self.assertIsInstance(pipe, diffusers.WanPipeline)
        self.assertEqual(pipe.config.boundary_ratio, 0.5)
        self.check(pipe)
        at.handle(pipe).detach()

    @slow
    def test_offload(self):
        def plain() -> Any:
            p = diffusers.WanPipeline.from_pretrained(self.folder, dtype=BF16)
            p.set_progress_bar_config(disable=True)
            return p

        # (loaded, the experts keep their _keep_in_fp32_modules in float32: the plain
        # pipeline is the loaded one, and the image holds what it holds)
        want = [wan22_video(plain(), 0), wan22_video(plain(), 1)]
        with contextlib.redirect_stderr(io.StringIO()):  # (the cache's line)
            first = at.offload(plain(), cache=self.cache, device="sim", progress=False)
        h = at.handle(first)
        image = str(h.cache_entry.image)
        h.detach()
        pipe = at.offload(plain(), cache=self.cache, progress=False, **self.options(image))
        self.check(pipe, want)
        at.handle(pipe).detach()


class Readme(unittest.TestCase):
    """README.md's "A whole pipeline" code as it is written, run on a tiny FLUX.1
    folder (its CLIP, T5 with dropout 0.1 as FLUX.1's, VAE, tokenizers, scheduler,
    saved by save_pretrained) in place of FLUX.1-dev: its image equals the plain
    pipeline's (from_pretrained in bf16) bit for bit. Replaced in the code: the
    model's id and the image's name by the tiny folder's, and the image's size and
    steps by tiny ones (each replacement made exactly once)."""

    @slow
    def test_the_whole_pipeline_snippet(self):
        import re

        readme = (Path(__file__).resolve().parent.parent.parent / "README.md").read_text()
        at_ = readme.index("**A whole pipeline**")
        code = re.search(r"```python\n(.*?)```", readme[at_:], re.S)
        assert code, "no code under README.md's 'A whole pipeline'"
        src = os.path.join(TMP, "readme_pipeline")
        plain = flux_pipeline(meta=False)
        plain.text_encoder_2.config.dropout_rate = 0.1  # FLUX.1's T5 config
        plain.tokenizer, plain.tokenizer_2 = clip_tokenizer(), t5_tokenizer()
        plain.save_pretrained(src)
        subprocess.run([ARENA_BIN, "convert", "-q", src, "-o", src + ".arena"], check=True)
        text = code[1]
        for old, new in (('"black-forest-labs/FLUX.1-dev"', repr(src)), ('"flux-pipe.arena"', repr(src + ".arena")),
                         ('pipe("a cat")', 'pipe("a cat", height=32, width=32, num_inference_steps=3, '
                                            'max_sequence_length=16, output_type="pt", '
                                            'generator=torch.Generator().manual_seed(0))')):
            self.assertEqual(text.count(old), 1, old)
            text = text.replace(old, new)
        # What the code takes from the README's code before it: torch, arena.torch,
        # FluxPipeline, the transformer built on meta.
        with torch.device("meta"):
            transformer = diffusers.FluxTransformer2DModel.from_config(
                diffusers.FluxTransformer2DModel.load_config(src, subfolder="transformer")).to(BF16)
        ns: Dict[str, Any] = dict(torch=torch, arena=arena, FluxPipeline=diffusers.FluxPipeline,
                                  transformer=transformer)
        from unittest import mock

        with mock.patch.object(diffusers.FluxPipeline, "_progress_bar_config", {"disable": True}, create=True):
            exec(compile(text, "README.md (A whole pipeline)", "exec"), ns)
        ref = diffusers.FluxPipeline.from_pretrained(src, torch_dtype=BF16)
        ref.set_progress_bar_config(disable=True)
        with torch.no_grad():
            want = ref("a cat", height=32, width=32, num_inference_steps=3, max_sequence_length=16, output_type="pt",
                       generator=torch.Generator().manual_seed(0)).images[0]
        self.assertTrue(torch.equal(ns["image"], want), (ns["image"].float() - want.float()).abs().max())
        ns["h"].detach()


if __name__ == "__main__":
    unittest.main()
