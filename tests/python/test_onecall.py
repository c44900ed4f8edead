"""arena.torch.from_pretrained and arena.torch.offload: a pipeline or model in
one call, its weights converted once into arena's cache.

Tiny pipelines saved with save_pretrained (FLUX.1: CLIP, T5, transformer, VAE;
Stable Diffusion 3: two CLIPs with projection, T5, transformer, VAE) and a tiny
transformers causal LM (Llama): from_pretrained of their folders and offload of
the plain pipeline or model loaded on the CPU give the plain one's outputs bit
for bit (a fixed generator), with blocks streamed on the simulated device; the
second call finds the cache's entry (the entry's record: made or not, never a
time); a changed source file or weight makes a new entry; a truncated or
flipped cached image is made again; a conversion stopped by an exception of
its progress callback (as Ctrl-C stops it) leaves no entry; a Hugging Face id
is read from the local cache only, and one not there says what to download;
host memory: from_pretrained of a model larger than its device holds no
weight in host memory beyond what the plan streams from there (peak RSS),
where the plain from_pretrained holds them all, and offload lets the loaded
copies go (RSS drops). compile=True: a second process loads the compiled
artifacts the first kept in the entry (torch's FX graph cache counters).

Runs on CPU (tests/python/run_torch.sh runs it, as test_torch.py); the cache
is a temporary folder ($ARENA_CACHE), never the user's.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path
from typing import Any, Dict, List, Tuple
from unittest import mock

TMP = tempfile.mkdtemp(prefix="arena-onecall-")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)
os.environ["ARENA_CACHE"] = os.path.join(TMP, "default-cache")  # (a call given no cache: never ~/.cache)

import torch
import diffusers
import transformers as tf

import arena_gpu as arena
import arena_gpu.torch as at
from test_models import BF16, clip_tokenizer, flux_pipeline, generate, streaming, t5_tokenizer
from tiers import slow


def sd3_pipeline(seed: int = 0) -> Any:
    """A tiny StableDiffusion3Pipeline: two CLIPs with projection (16 wide: 32 together,
    the T5's width), T5 (2 blocks), the transformer (3 layers), a VAE of 4 latent
    channels; in bf16, eval mode."""
    torch.manual_seed(seed)

    def clip(seed: int) -> Any:
        torch.manual_seed(seed)
        return tf.CLIPTextModelWithProjection(tf.CLIPTextConfig(
            vocab_size=1000, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=77, projection_dim=16, hidden_act="gelu"))

    transformer = diffusers.SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=3,
                                                  attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                                                  caption_projection_dim=16, pooled_projection_dim=32, out_channels=4,
                                                  pos_embed_max_size=16)
    vae = diffusers.AutoencoderKL(block_out_channels=(16, 32), down_block_types=("DownEncoderBlock2D",) * 2,
                                  up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8,
                                  layers_per_block=1, shift_factor=0.0609, scaling_factor=1.5035)
    t5 = tf.T5EncoderModel(tf.T5Config(vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                       relative_attention_num_buckets=8, relative_attention_max_distance=16))
    parts = dict(transformer=transformer, vae=vae, text_encoder=clip(seed + 1), text_encoder_2=clip(seed + 2),
                 text_encoder_3=t5)
    for m in parts.values():
        m.to(BF16).requires_grad_(False).eval()
    pipe = diffusers.StableDiffusion3Pipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
                                              tokenizer=clip_tokenizer(), tokenizer_2=clip_tokenizer(),
                                              tokenizer_3=t5_tokenizer(), **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sd3_generate(pipe: Any, prompt: str, seed: int) -> torch.Tensor:
    with torch.no_grad():
        return pipe(prompt, height=32, width=32, num_inference_steps=2, max_sequence_length=16, output_type="pt",
                    guidance_scale=2.0, generator=torch.Generator().manual_seed(seed)).images


def llama(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                           tie_word_embeddings=True))
    return m.to(BF16).requires_grad_(False).eval()


IDS = torch.tensor([[1, 5, 9, 2, 33, 7, 60, 3]])


def logits(m: Any) -> torch.Tensor:
    with torch.no_grad():
        return m(IDS).logits


_saved: Dict[str, str] = {}


def folder(name: str) -> str:
    """The tiny model ``name`` saved by its library (save_pretrained), once."""
    if name not in _saved:
        d = os.path.join(TMP, name)
        {"flux": lambda: flux_pipeline(meta=False), "sd3": sd3_pipeline, "llama": llama}[name]().save_pretrained(d)
        _saved[name] = d
    return _saved[name]


def plain_flux() -> Any:
    pipe = diffusers.FluxPipeline.from_pretrained(folder("flux"), dtype=BF16)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def fresh_cache() -> str:
    return tempfile.mkdtemp(dir=TMP, prefix="cache-")


def entries(cache: str) -> List[str]:
    """The cache's entries: folders holding an image."""
    return sorted(str(p.parent.relative_to(cache)) for p in Path(cache).rglob("image.arena"))


def streamed(tc: unittest.TestCase, obj: Any) -> None:
    h = at.handle(obj)
    h.end_step()
    tc.assertGreater(h.plan()["n_streamed"], 0, "blocks streamed")
    tc.assertGreater(sum(r["streamed_bytes"] for r in h.stats()), 0)


def two_calls(tc: unittest.TestCase, call: Any) -> Tuple[Any, Any]:
    """``call(**options)`` twice on one cache: the first (converting) with the device as
    large as the model, the second with a device as small as the smallest plan allows
    (found on the first call's image), which streams; the second finds the entry."""
    cache = fresh_cache()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        first = call(cache=cache, device="sim")
    h1 = at.handle(first)
    e1 = h1.cache_entry
    tc.assertTrue(e1.made, "the first call converts")
    said = err.getvalue().splitlines()
    tc.assertEqual(len(said), 2, said)
    tc.assertRegex(said[0], r"^arena: (converting .* into the cache|writing the .*'s weights into the cache) \(.*\)$")
    tc.assertRegex(said[1], rf"^arena: cached .* as {re.escape(str(e1.image))} \(.*\)$")
    opts = streaming(str(e1.image))
    h1.detach()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        second = call(cache=cache, **opts)
    e2 = at.handle(second).cache_entry
    tc.assertFalse(e2.made, "the second call finds the entry")
    tc.assertEqual((e2.key, e2.image), (e1.key, e1.image))
    tc.assertEqual(err.getvalue(), "", "nothing converted, nothing said")
    tc.assertEqual(len(entries(cache)), 1, entries(cache))
    return first, second


class Quiet(unittest.TestCase):
    """The lines on stderr (the conversion's, the cache's) kept from the test's line."""

    def setUp(self) -> None:
        self.enterContext(contextlib.redirect_stderr(io.StringIO()))


class FromPretrained(Quiet):
    def test_flux_pipeline(self):
        want = [generate(plain_flux(), "a photo of a cat", 0), generate(plain_flux(), "a red dog on the mat", 1)]
        _, pipe = two_calls(self, lambda **kw: at.from_pretrained(diffusers.FluxPipeline, folder("flux"), **kw))
        pipe.set_progress_bar_config(disable=True)
        self.assertIsInstance(pipe, diffusers.FluxPipeline)
        for name in ("text_encoder", "text_encoder_2", "transformer", "vae"):
            m = getattr(pipe, name)
            self.assertFalse(any(x.training for x in m.modules()), f"{name}: eval mode")
            self.assertEqual({p.dtype for p in m.parameters()}, {BF16}, name)
        self.assertIsInstance(pipe.tokenizer, tf.PreTrainedTokenizerBase, "loaded the usual way")
        got = [generate(pipe, "a photo of a cat", 0), generate(pipe, "a red dog on the mat", 1)]
        for g, w in zip(got, want):
            self.assertTrue(torch.equal(g, w), (g.float() - w.float()).abs().max())
        streamed(self, pipe)
        h = at.handle(pipe)
        self.assertIs(at.handle(pipe.transformer), h, "a component's handle is the pipeline's")
        h.detach()
        with self.assertRaises(arena.Error) as cm:
            at.handle(pipe)
        self.assertEqual(cm.exception.code, "USAGE")

    def test_sd3_pipeline_of_three_text_encoders(self):
        ref = diffusers.StableDiffusion3Pipeline.from_pretrained(folder("sd3"), dtype=BF16)
        ref.set_progress_bar_config(disable=True)
        want = sd3_generate(ref, "a photo of a cat", 3)
        # DiffusionPipeline: the class model_index.json names
        _, pipe = two_calls(self, lambda **kw: at.from_pretrained(diffusers.DiffusionPipeline, folder("sd3"), **kw))
        self.assertIsInstance(pipe, diffusers.StableDiffusion3Pipeline)
        pipe.set_progress_bar_config(disable=True)
        got = sd3_generate(pipe, "a photo of a cat", 3)
        self.assertTrue(torch.equal(got, want), (got.float() - want.float()).abs().max())
        comps = {p[:-1] for p, _ in at.handle(pipe)._roots}
        self.assertEqual(comps, {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"})
        streamed(self, pipe)
        at.handle(pipe).detach()

    def test_causal_lm(self):
        d = folder("llama")
        want = logits(tf.LlamaForCausalLM.from_pretrained(d, dtype=BF16))
        _, m = two_calls(self, lambda **kw: at.from_pretrained(tf.LlamaForCausalLM, d, **kw))
        self.assertIsInstance(m, tf.LlamaForCausalLM)
        self.assertIs(m.lm_head.weight, m.model.embed_tokens.weight, "tied")
        self.assertTrue(torch.equal(logits(m), want))
        streamed(self, m)
        cache = str(at.handle(m).cache_entry.dir.parent)
        opts = streaming(str(at.handle(m).cache_entry.image))
        at.handle(m).detach()
        # an Auto class, and the one weights file with its config beside: the same entry
        for cls, src in ((tf.AutoModelForCausalLM, d), (tf.LlamaForCausalLM, os.path.join(d, "model.safetensors"))):
            with self.subTest(cls=cls.__name__, src=os.path.basename(src)):
                m2 = at.from_pretrained(cls, src, cache=cache, progress=False, **opts)
                self.assertIsInstance(m2, tf.LlamaForCausalLM)
                self.assertFalse(at.handle(m2).cache_entry.made)
                self.assertTrue(torch.equal(logits(m2), want))
                at.handle(m2).detach()

    def test_a_component_of_a_pipeline_folder(self):
        d = folder("flux")
        ref = diffusers.FluxTransformer2DModel.from_pretrained(d, subfolder="transformer", dtype=BF16)
        g = torch.Generator().manual_seed(0)
        x = dict(hidden_states=torch.randn(1, 16, 16, generator=g).to(BF16),
                 encoder_hidden_states=torch.randn(1, 8, 32, generator=g).to(BF16),
                 pooled_projections=torch.randn(1, 16, generator=g).to(BF16), timestep=torch.tensor([0.5]),
                 img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(8, 3), guidance=torch.tensor([3.5]))
        with torch.no_grad():
            want = ref(**x).sample
        m = at.from_pretrained(diffusers.FluxTransformer2DModel, d, subfolder="transformer", cache=fresh_cache(),
                               device="sim", progress=False)
        with torch.no_grad():
            self.assertTrue(torch.equal(m(**x).sample, want))
        at.handle(m).detach()
        with self.assertRaises(arena.Error) as cm:
            at.from_pretrained(diffusers.FluxTransformer2DModel, d, cache=fresh_cache(), device="sim")
        self.assertEqual(cm.exception.code, "USAGE")
        self.assertIn("is a diffusers pipeline's folder: give FluxTransformer2DModel its subfolder (one of "
                      "scheduler, text_encoder, text_encoder_2, tokenizer, tokenizer_2, transformer, vae)",
                      cm.exception.message)

    def test_a_changed_source_file_makes_a_new_entry(self):
        d = os.path.join(TMP, "llama-changed")
        shutil.copytree(folder("llama"), d)
        cache = fresh_cache()
        m = at.from_pretrained(tf.LlamaForCausalLM, d, cache=cache, device="sim", progress=False)
        k1 = at.handle(m).cache_entry.key
        at.handle(m).detach()
        other = llama(seed=5)
        other.save_pretrained(d)  # the same names and sizes, other values
        m = at.from_pretrained(tf.LlamaForCausalLM, d, cache=cache, device="sim", progress=False)
        e = at.handle(m).cache_entry
        self.assertTrue(e.made)
        self.assertNotEqual(e.key, k1)
        self.assertTrue(torch.equal(logits(m), logits(other)), "the new file's weights")
        at.handle(m).detach()
        self.assertEqual(len(entries(cache)), 2)
        # another quant or codec: an entry of its own
        m = at.from_pretrained(tf.LlamaForCausalLM, d, cache=cache, device="sim", codec="hb4", progress=False)
        self.assertTrue(at.handle(m).cache_entry.made)
        self.assertTrue(torch.equal(logits(m), logits(other)))
        at.handle(m).detach()
        m = at.from_pretrained(tf.LlamaForCausalLM, d, cache=cache, device="sim", quant="int8-row", progress=False)
        h = at.handle(m)
        self.assertTrue(h.cache_entry.made)
        self.assertEqual({p.dtype for p in m.parameters()}, {BF16}, "built in the original dtype")
        self.assertIn("int8-row", {t["scheme"] for t in arena.inspect(h.cache_entry.image)["tensors"]})
        got, plain = logits(m), logits(other)
        self.assertFalse(torch.equal(got, plain), "the quantized weights")
        self.assertLess((got.float() - plain.float()).abs().max().item(), 0.5)
        h.detach()
        self.assertEqual(len(entries(cache)), 4)

    def test_a_corrupt_entry_is_made_again(self):
        d = folder("llama")
        want = logits(tf.LlamaForCausalLM.from_pretrained(d, dtype=BF16))
        cache = fresh_cache()
        m = at.from_pretrained(tf.LlamaForCausalLM, d, cache=cache, device="sim", progress=False)
        image = at.handle(m).cache_entry.image
        at.handle(m).detach()
        t = next(t for t in arena.inspect(image)["tensors"] if t["block"] != "globals")
        flip_at = t["components"][0]["offset"] + 5

        def flip(p: Path) -> None:
            with open(p, "r+b") as f:
                f.seek(flip_at)
                b = f.read(1)
                f.seek(flip_at)
                f.write(bytes([b[0] ^ 0x10]))

        def rot(p: Path) -> None:  # a bit flipped on the disk: the file's time as it was
            st = p.stat()
            flip(p)
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))

        def truncate(p: Path) -> None:
            os.truncate(p, p.stat().st_size - 4096)

        # found by the open's checksums (the cache's checks pass: size, header, time),
        # by the cache's own verify (the file's time moved), by the cache's checks (size)
        said = {"rot": "arena: {}: ", "flip": "arena: the cache entry {} is damaged (image.arena changed since it "
                "was verified, and does not verify", "truncate": "arena: the cache entry {} is damaged"}
        for spoil in (rot, flip, truncate):
            with self.subTest(spoil=spoil.__name__):
                spoil(image)
                with self.assertRaises(arena.Error):
                    arena.verify(image, progress=False)
                err = io.StringIO()
                with contextlib.redirect_stderr(err):
                    m = at.from_pretrained(tf.LlamaForCausalLM, d, cache=cache, device="sim", progress=False)
                e = at.handle(m).cache_entry
                self.assertTrue(e.made, "made again")
                where = image if spoil is rot else image.parent
                self.assertIn(said[spoil.__name__].format(where), err.getvalue())
                self.assertIn("making it again", err.getvalue())
                self.assertTrue(torch.equal(logits(m), want))
                at.handle(m).detach()
                arena.verify(e.image, progress=False)
                image = e.image

    def test_stopped_conversion_leaves_no_entry(self):
        cache = fresh_cache()

        def interrupt(done: int, total: int) -> None:
            raise KeyboardInterrupt

        err = io.StringIO()
        with self.assertRaises(KeyboardInterrupt), contextlib.redirect_stderr(err):
            at.from_pretrained(diffusers.FluxPipeline, folder("flux"), cache=cache, device="sim", progress=interrupt)
        self.assertIn(f"arena: converting {folder('flux')} into the cache (1.75 MiB)", err.getvalue())
        self.assertEqual(entries(cache), [])
        left = [p for p in Path(cache).rglob("*") if p.is_file() and p.stat().st_size > 4096]
        self.assertEqual(left, [], "no partial image")
        pipe = at.from_pretrained(diffusers.FluxPipeline, folder("flux"), cache=cache, device="sim", progress=False)
        self.assertTrue(at.handle(pipe).cache_entry.made)
        at.handle(pipe).detach()

    def test_hugging_face_cache(self):
        """A hub id read from huggingface_hub's local cache (a snapshot of symlinks into
        blobs, as the hub client lays it out), a repo's cache folder, and an id not there."""
        import huggingface_hub

        hub = os.path.join(TMP, "hub")
        repo = os.path.join(hub, "models--tiny--llama")
        rev = "0123456789abcdef0123456789abcdef01234567"
        snap = os.path.join(repo, "snapshots", rev)
        os.makedirs(snap)
        os.makedirs(os.path.join(repo, "blobs"))
        for n in os.listdir(folder("llama")):
            blob = os.path.join(repo, "blobs", "b-" + n)
            shutil.copy(os.path.join(folder("llama"), n), blob)
            os.symlink(os.path.relpath(blob, snap), os.path.join(snap, n))
        os.makedirs(os.path.join(repo, "refs"))
        Path(repo, "refs", "main").write_text(rev)
        want = logits(tf.LlamaForCausalLM.from_pretrained(folder("llama"), dtype=BF16))
        cache = fresh_cache()
        with mock.patch.object(huggingface_hub.constants, "HF_HUB_CACHE", hub):
            for src in ("tiny/llama", repo, snap):
                with self.subTest(src=src):
                    m = at.from_pretrained(tf.AutoModelForCausalLM, src, cache=cache, device="sim", progress=False)
                    self.assertTrue(torch.equal(logits(m), want))
                    at.handle(m).detach()
            self.assertEqual(len(entries(cache)), 1, "one source, one entry")
            with self.assertRaises(arena.Error) as cm:
                at.from_pretrained(diffusers.FluxTransformer2DModel, "tiny/absent", subfolder="transformer",
                                   cache=cache, device="sim")
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        self.assertIn("tiny/absent: not a local file or folder, and not in the Hugging Face cache",
                      cm.exception.message)
        self.assertIn('download it first: hf download tiny/absent --include "transformer/*" "*.json"',
                      cm.exception.message)

    def test_refusals(self):
        cache = fresh_cache()
        cases = [
            (dict(cls=torch.nn.Linear, source=folder("llama")), "USAGE", "Linear is not a diffusers pipeline class"),
            (dict(cls=tf.LlamaForCausalLM, source=folder("llama"), torch_dtype=torch.float16), "USAGE",
             "holds its weights in bfloat16, not float16: arena keeps the checkpoint's dtypes"),
            (dict(cls=diffusers.FluxPipeline, source=folder("llama")), "NO_CHECKPOINT", "no model_index.json"),
            (dict(cls=diffusers.FluxPipeline, source=folder("flux"), subfolder="vae"), "USAGE",
             "a pipeline is its whole folder"),
            (dict(cls=tf.LlamaForCausalLM, source=os.path.join(TMP, "nowhere", "x")), "NOT_FOUND",
             "no such file or folder"),
        ]
        for kw, code, text in cases:
            with self.subTest(**{k: str(v) for k, v in kw.items()}):
                with self.assertRaises(arena.Error) as cm:
                    at.from_pretrained(kw.pop("cls"), kw.pop("source"), cache=cache, device="sim", progress=False,
                                       **kw)
                self.assertEqual(cm.exception.code, code, cm.exception.message)
                self.assertIn(text, cm.exception.message)
        pickled = os.path.join(TMP, "pickled")
        os.makedirs(pickled)
        shutil.copy(os.path.join(folder("llama"), "config.json"), pickled)
        torch.save(llama().state_dict(), os.path.join(pickled, "pytorch_model.bin"))
        with self.assertRaises(arena.Error) as cm:
            at.from_pretrained(tf.LlamaForCausalLM, pickled, cache=cache, device="sim")
        self.assertEqual(cm.exception.code, "NO_CHECKPOINT")
        self.assertIn("only pickled weights", cm.exception.message)


class Offload(Quiet):
    def test_flux_pipeline(self):
        want = [generate(plain_flux(), "a photo of a cat", 0), generate(plain_flux(), "a red dog on the mat", 1)]
        first, pipe = two_calls(self, lambda **kw: at.offload(plain_flux(), **kw))
        self.assertEqual({p.device.type for p in first.transformer.parameters()}, {"meta"}, "detached: meta")
        got = [generate(pipe, "a photo of a cat", 0), generate(pipe, "a red dog on the mat", 1)]
        for g, w in zip(got, want):
            self.assertTrue(torch.equal(g, w), (g.float() - w.float()).abs().max())
        streamed(self, pipe)
        self.assertEqual({p[:-1] for p, _ in at.handle(pipe)._roots},
                         {"text_encoder", "text_encoder_2", "transformer", "vae"})
        cache = str(at.handle(pipe).cache_entry.dir.parent)
        at.handle(pipe).detach()
        # a weight changed: another entry
        other = plain_flux()
        with torch.no_grad():
            other.vae.decoder.conv_out.bias[0] += 1
        at.offload(other, cache=cache, device="sim", progress=False)
        self.assertTrue(at.handle(other).cache_entry.made)
        self.assertEqual(len(entries(cache)), 2)
        at.handle(other).detach()

    def test_sd3_pipeline(self):
        def plain() -> Any:
            p = diffusers.StableDiffusion3Pipeline.from_pretrained(folder("sd3"), dtype=BF16)
            p.set_progress_bar_config(disable=True)
            return p

        want = sd3_generate(plain(), "a dog", 2)
        _, pipe = two_calls(self, lambda **kw: at.offload(plain(), **kw))
        self.assertTrue(torch.equal(sd3_generate(pipe, "a dog", 2), want))
        streamed(self, pipe)
        at.handle(pipe).detach()

    def test_causal_lm(self):
        d = folder("llama")
        want = logits(tf.LlamaForCausalLM.from_pretrained(d, dtype=BF16))
        _, m = two_calls(self, lambda **kw: at.offload(tf.LlamaForCausalLM.from_pretrained(d, dtype=BF16), **kw))
        self.assertTrue(torch.equal(logits(m), want))
        streamed(self, m)
        at.handle(m).detach()

    def test_refusals(self):
        with torch.device("meta"):
            m = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                   num_hidden_layers=2, num_attention_heads=4))
        with self.assertRaises(arena.Error) as cm:
            at.offload(m, cache=fresh_cache(), device="sim")
        self.assertEqual(cm.exception.code, "USAGE")
        self.assertIn("offload: 'model.embed_tokens.weight' is on the meta device: offload takes a model loaded with "
                      "its weights", cm.exception.message)
        m = tf.LlamaForCausalLM.from_pretrained(folder("llama"), dtype=BF16)
        at.offload(m, cache=fresh_cache(), device="sim", progress=False)
        with self.assertRaises(arena.Error) as cm:
            at.offload(m, cache=fresh_cache(), device="sim")
        self.assertIn("attached to an arena already", cm.exception.message)
        at.handle(m).detach()
        with self.assertRaises(arena.Error) as cm:
            at.offload(object(), device="sim")
        self.assertIn("neither an nn.Module nor a pipeline", cm.exception.message)


class Readme(Quiet):
    """README.md's one-call code as it is written, run on the tiny FLUX.1 folder in
    place of FLUX.1-dev and on the simulated device in place of vram="8G": the plain
    pipeline's image bit for bit. Replaced in the code (each once): the model's id, the
    vram, the prompt's call (tiny sizes, a fixed generator)."""

    def run_block(self, after: str, ns: Dict[str, Any]) -> Any:
        readme = (Path(__file__).resolve().parent.parent.parent / "README.md").read_text()
        code = re.search(r"```python\n(.*?)```", readme[readme.index(after):], re.S)
        assert code, f"no code under README.md's {after!r}"
        text = code[1]
        for old, new in (('"black-forest-labs/FLUX.1-dev"', repr(folder("flux"))), ('vram="8G"', "**OPTS"),
                         ('pipe("a cat")', 'pipe("a cat", height=32, width=32, num_inference_steps=3, '
                                            'max_sequence_length=16, output_type="pt", '
                                            'generator=torch.Generator().manual_seed(0))')):
            self.assertEqual(text.count(old), 1, old)
            text = text.replace(old, new)
        with mock.patch.object(diffusers.FluxPipeline, "_progress_bar_config", {"disable": True}, create=True):
            exec(compile(text, f"README.md ({after})", "exec"), ns)
        return ns["image"]

    def test_one_call_snippets(self):
        want = generate(plain_flux(), "a cat", 0)[0]
        cache = fresh_cache()
        probe = at.from_pretrained(diffusers.FluxPipeline, folder("flux"), cache=cache, device="sim")
        opts = dict(streaming(str(at.handle(probe).cache_entry.image)), cache=cache)
        at.handle(probe).detach()
        for after in ("**One call**", "A pipeline already loaded on the CPU"):
            with self.subTest(after=after):
                ns: Dict[str, Any] = dict(torch=torch, arena=arena, FluxPipeline=diffusers.FluxPipeline, OPTS=opts)
                image = self.run_block(after, ns)
                self.assertTrue(torch.equal(image, want), (image.float() - want.float()).abs().max())
                streamed(self, ns["pipe"])
                at.handle(ns["pipe"]).detach()


# --- host memory, each case in a process of its own -----------------------------------------

MEMORY_MODEL = dict(vocab_size=256, hidden_size=1024, intermediate_size=4096, num_hidden_layers=12,
                    num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=64)


def rss_run(code: str) -> Dict[str, Any]:
    """``code`` run in a process of its own, after ``rss()`` and ``hwm()`` (the
    process's resident and peak resident bytes, /proc/self/status) are defined; it
    prints one JSON line, returned."""
    prelude = textwrap.dedent("""
        import json, os, sys
        def _status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
            raise KeyError(key)
        def rss(): return _status("VmRSS")
        def hwm(): return _status("VmHWM")
        def reset_hwm():
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        """)
    p = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    if p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# What arena may hold in host memory over the process's own: the simulated device's
# memory (host memory: 48 MiB), the host budget of the streamed blocks (their copies
# and the reads ahead from the image: 64 MiB), and 128 MiB for the rest (the forward's,
# torch's, the library's threads; 65 MiB measured on the two-core machine).
BOUND = (48 + 64 + 128) << 20


class HostMemory(unittest.TestCase):
    """A Llama of 12 layers of 33.6 MB (0.4 GB of bf16 weights in all, random) on a
    simulated device of 48 MiB, in 8 MiB pieces, with 64 MiB of host memory for the
    streamed blocks: the rest stays in the image (the disk tier)."""

    SIZE = 0

    @classmethod
    def setUpClass(cls) -> None:
        cls.dir = os.path.join(TMP, "memory")
        if not os.path.isdir(cls.dir):
            with torch.device("meta"):
                m = tf.LlamaForCausalLM(tf.LlamaConfig(**MEMORY_MODEL))
            g = torch.Generator().manual_seed(0)
            from safetensors.torch import save_file

            sd = {n: (torch.randn(t.shape, generator=g) * 0.02).to(BF16) for n, t in m.state_dict().items()}
            os.makedirs(cls.dir)
            m.config.save_pretrained(cls.dir)
            save_file(sd, os.path.join(cls.dir, "model.safetensors"), metadata={"format": "pt"})
            del sd
        cls.SIZE = os.path.getsize(os.path.join(cls.dir, "model.safetensors"))

    OPTS = "device='sim', sim_capacity='48M', host_budget='64M', headroom=0, reserve=0, piece_size='8M'"

    @slow
    def test_from_pretrained_holds_no_weights_in_host_memory(self):
        """The first call's peak RSS (the conversion, the build, the attach and a
        forward) over the process's before it is within BOUND, and so is a second
        call's, which finds the cache's entry; the plain from_pretrained's, with a
        forward, is over the weights' size."""
        cache = fresh_cache()
        code = f"""
            import torch, transformers as tf
            import arena_gpu as arena, arena_gpu.torch as at
            base = rss(); reset_hwm()
            m = at.from_pretrained(tf.LlamaForCausalLM, {self.dir!r}, cache={cache!r}, progress=False, {self.OPTS})
            with torch.no_grad():
                m(torch.tensor([[1, 2, 3]]))
            print(json.dumps(dict(base=base, hwm=hwm(), made=at.handle(m).cache_entry.made,
                                  streamed=at.handle(m).plan()["n_streamed"])))
        """
        r = rss_run(code)
        self.assertTrue(r["made"], "the call converted")
        self.assertGreater(r["streamed"], 0)
        arena_peak = r["hwm"] - r["base"]
        self.assertLess(arena_peak, BOUND, f"peak over base {arena_peak >> 20} MiB")
        r2 = rss_run(code)  # the cache found: the same bound
        self.assertFalse(r2["made"])
        self.assertLess(r2["hwm"] - r2["base"], BOUND, f"peak over base {(r2['hwm'] - r2['base']) >> 20} MiB")
        plain = rss_run(f"""
            import torch, transformers as tf
            base = rss(); reset_hwm()
            m = tf.LlamaForCausalLM.from_pretrained({self.dir!r}, dtype=torch.bfloat16)
            with torch.no_grad():  # (the weights, mapped from the file, read once)
                m(torch.tensor([[1, 2, 3]]))
            print(json.dumps(dict(base=base, hwm=hwm())))
        """)
        plain_peak = plain["hwm"] - plain["base"]
        self.assertGreater(plain_peak, 0.9 * self.SIZE, "the plain from_pretrained holds the weights")
        self.assertLess(BOUND, 0.7 * self.SIZE, "(the bound is below the weights)")

    @slow
    def test_offload_lets_the_loaded_copies_go(self):
        cache = fresh_cache()
        r = rss_run(f"""
            import torch, transformers as tf
            import arena_gpu as arena, arena_gpu.torch as at
            m = tf.LlamaForCausalLM.from_pretrained({self.dir!r}, dtype=torch.bfloat16)
            with torch.no_grad():  # the weights in memory (mapped from the file: read once)
                m(torch.tensor([[1, 2, 3]]))
            before = rss()
            at.offload(m, cache={cache!r}, progress=False, {self.OPTS})
            after = rss()
            with torch.no_grad():
                m(torch.tensor([[1, 2, 3]]))
            print(json.dumps(dict(before=before, after=after, streamed=at.handle(m).plan()["n_streamed"])))
        """)
        self.assertGreater(r["streamed"], 0)
        dropped = r["before"] - r["after"]
        self.assertGreater(dropped, self.SIZE - BOUND, f"RSS {r['before'] >> 20} -> {r['after'] >> 20} MiB")


class Compiled(Quiet):
    """compile=True: every block compiled (a whole block with fullgraph), torch's
    compiled artifacts kept in the cache's entry. A first process compiles (inductor's
    FX graph cache misses) and saves them; a second, with an inductor cache folder of
    its own, empty, loads them and finds every graph there (hits, no miss: counted by
    torch's compile counters, not by time). Blocks streamed, nothing compiled again
    after the first step, both processes' outputs equal, and close to the plain
    model's (compiled code rounds as it fuses)."""

    @slow
    def test_a_second_process_loads_the_compiled_artifacts(self):
        d = os.path.join(TMP, "flux-compile")
        if not os.path.isdir(d):
            cfg = json.load(open(os.path.join(os.environ.get("ARENA_FIXTURES_DIR", "fixtures"),
                                              "tiny_flux.json")))["config"]
            torch.manual_seed(0)  # four double blocks, no single ones: one graph to compile
            diffusers.FluxTransformer2DModel(**dict(cfg, num_layers=4, num_single_layers=0)).to(BF16).save_pretrained(d)
        cache = fresh_cache()
        m = at.from_pretrained(diffusers.FluxTransformer2DModel, d, cache=cache, device="sim", depth=1)
        opts = streaming(str(at.handle(m).cache_entry.image), depth=1)
        x = dict(hidden_states=torch.randn(1, 16, 16, generator=torch.Generator().manual_seed(0)).to(BF16),
                 encoder_hidden_states=torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1)).to(BF16),
                 pooled_projections=torch.randn(1, 16, generator=torch.Generator().manual_seed(2)).to(BF16),
                 timestep=torch.tensor([0.5]), img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(8, 3),
                 guidance=torch.tensor([3.5]))
        with torch.no_grad():
            want = m(**x).sample
        entry_dir = at.handle(m).cache_entry.dir
        at.handle(m).detach()
        inputs = os.path.join(TMP, "compile-inputs.pt")
        torch.save(x, inputs)
        code = f"""
            import torch, diffusers
            from torch._dynamo.utils import counters
            import arena_gpu.torch as at
            x = torch.load({inputs!r})
            m = at.from_pretrained(diffusers.FluxTransformer2DModel, {d!r}, cache={cache!r}, compile=True,
                                   progress=False, **{opts!r})
            graphs = []
            with torch.no_grad():
                for _ in range(3):
                    out = m(**x).sample
                    graphs.append(counters["stats"]["unique_graphs"])
            h = at.handle(m)
            h.end_step()
            torch.save(out, {os.path.join(TMP, "compiled-")!r} + str(os.getpid()) + ".pt")
            print(json.dumps(dict(graphs=graphs, hit=counters["inductor"]["fxgraph_cache_hit"],
                                  miss=counters["inductor"]["fxgraph_cache_miss"], pid=os.getpid(),
                                  streamed=sum(r["streamed_bytes"] for r in h.stats()))))
        """
        runs = []
        for n in range(2):
            env = dict(TORCHINDUCTOR_CACHE_DIR=os.path.join(TMP, f"inductor-{n}"))
            with mock.patch.dict(os.environ, env):
                runs.append(rss_run(code))
            if n == 0:
                arts = [f for f in os.listdir(entry_dir) if f.startswith("torch-compile-")]
                self.assertEqual(len(arts), 1, os.listdir(entry_dir))
        first, second = runs
        for r in runs:
            self.assertGreater(r["streamed"], 0, "blocks streamed")
            self.assertGreater(r["graphs"][0], 0)
            self.assertEqual(r["graphs"], [r["graphs"][0]] * 3, "nothing compiled again after the first step")
        self.assertGreater(first["miss"], 0, "the first process compiled")
        self.assertEqual((second["miss"], second["hit"]), (0, first["miss"]),
                         "the second found every graph in the artifacts it loaded")
        outs = [torch.load(os.path.join(TMP, f"compiled-{r['pid']}.pt")) for r in runs]
        self.assertTrue(torch.equal(outs[0], outs[1]))
        self.assertTrue(torch.allclose(outs[0].float(), want.float(), atol=0.05, rtol=0.05),
                        (outs[0].float() - want.float()).abs().max())


if __name__ == "__main__":
    unittest.main()
