"""The Python package and the PyTorch adapter against the plain PyTorch model.

Runs on CPU: the simulated device's memory is host memory, so an attached
model's tensors are CPU tensors and every comparison is bit for bit. The
model is diffusers' FluxTransformer2DModel at the tiny config of
fixtures/tiny_flux.json, with the weights of fixtures/tiny_flux.safetensors
(converted to an image once per run). Caps below its size make the engine
stream blocks (the smallest plan needs 280.5 KiB for a 306 KiB model with no
headroom and no reserve).

usage: python -m unittest tests/python/test_torch.py   (from the repository
root, in an environment with torch, diffusers, peft and the arena package;
tests/python/run_torch.sh makes one)
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import ctypes
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
import warnings

# Warnings that would split unittest's "test_x (...) ... ok" line in two, each
# silenced alone: diffusers warns at every model.to(dtype) of a model that
# lists modules to keep in float32, even none (Flux lists none; the tests cast
# on purpose); torch.compile imports torch's flop counter, which warns that
# triton is missing (tests/python/run_torch.sh installs torch without it where
# it can: the tests run torch on the CPU).
logging.getLogger("diffusers.models.modeling_utils").addFilter(
    lambda r: "should be kept in float32" not in r.getMessage())
logging.getLogger("torch.utils.flop_counter").addFilter(lambda r: "triton not found" not in r.getMessage())
# torchao 0.18 on a machine without CUDA: torch's extension loader says so, and
# diffusers' torchao quantizer (unused here) misses a layout class it renamed.
logging.getLogger("torch.utils.cpp_extension").addFilter(lambda r: "No CUDA runtime is found" not in r.getMessage())
logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer").addFilter(
    lambda r: "Unable to import `torchao` Tensor objects" not in r.getMessage())

import torch
from diffusers import FluxTransformer2DModel
from peft import LoraConfig
from safetensors.torch import load_file

import arena_gpu as arena
import arena_gpu._dlpack
import arena_gpu.torch as at
from tiers import slow


FIX = os.environ.get("ARENA_FIXTURES_DIR", "fixtures")
ARENA_BIN = os.environ.get("ARENA_BIN", "build/arena")
CFG = json.load(open(os.path.join(FIX, "tiny_flux.json")))["config"]
SD = load_file(os.path.join(FIX, "tiny_flux.safetensors"))
TMP = tempfile.mkdtemp(prefix="arena-pytest-")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)  # (every run left its images in /tmp)
IMG = os.path.join(TMP, "tiny_flux.arena")
subprocess.run([ARENA_BIN, "convert", "-q", os.path.join(FIX, "tiny_flux.safetensors"), "-o", IMG], check=True)

# Streaming on the simulator: a device smaller than the model.
STREAM = dict(device="sim", sim_capacity="295K", headroom=0, reserve=0, keep_last=0, piece_size=0)  # whole blocks
RESIDENT = dict(device="sim", sim_capacity="16G")


def inputs(seed: int = 0, batch: int = 1):
    g = torch.Generator().manual_seed(seed)
    T, Tt = 16, 8
    return dict(
        hidden_states=torch.randn(batch, T, 16, generator=g).to(torch.bfloat16),
        encoder_hidden_states=torch.randn(batch, Tt, 32, generator=g).to(torch.bfloat16),
        pooled_projections=torch.randn(batch, 16, generator=g).to(torch.bfloat16),
        timestep=torch.tensor([0.5] * batch),
        img_ids=torch.zeros(T, 3),
        txt_ids=torch.zeros(Tt, 3),
        guidance=torch.tensor([3.5] * batch),
    )


def model(meta: bool = True) -> FluxTransformer2DModel:
    if meta:
        with torch.device("meta"):
            m = FluxTransformer2DModel(**CFG).to(torch.bfloat16)
    else:
        m = FluxTransformer2DModel(**CFG).to(torch.bfloat16)
        m.load_state_dict(SD)
    m.requires_grad_(False)
    return m


LORA = LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"], init_lora_weights="gaussian")


def add_lora(m: FluxTransformer2DModel, config: LoraConfig = LORA) -> None:
    torch.manual_seed(1)
    m.add_adapter(config)
    torch.manual_seed(2)
    for n, p in m.named_parameters():
        if "lora_" in n:
            p.data = p.data.to(torch.bfloat16)
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02)


def lora_params(m):
    return {n: p for n, p in m.named_parameters() if "lora_" in n}


def train_steps(m, steps: int = 2, each=None, checkpointing: bool = True):
    """Checkpointed LoRA steps with AdamW; returns (losses, grads of the last step, lora params after).
    each: called after every step. checkpointing=False: the blocks' forward saves what it saves."""
    if checkpointing:
        m.enable_gradient_checkpointing()
    m.train()
    ps = lora_params(m)
    opt = torch.optim.AdamW(ps.values(), lr=1e-3)
    losses, grads = [], {}
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        out = m(**inputs(s)).sample
        loss = out.float().square().mean()
        loss.backward()
        losses.append(loss.item())
        grads = {n: p.grad.clone() for n, p in ps.items()}
        opt.step()
        if each is not None:
            each()
    return losses, grads, {n: p.detach().clone() for n, p in ps.items()}


def _saved_hooks() -> list:
    """The saved-tensor hooks in force on this thread (empty outside any)."""
    return list(torch._C._autograd._top_saved_tensors_default_hooks(False) or [])


def same(a: dict, b: dict) -> list:
    assert a.keys() == b.keys(), (sorted(a)[:3], sorted(b)[:3])
    return [k for k in a if not torch.equal(a[k], b[k])]


def same_step(tc: unittest.TestCase, got, want, msg: str = "gradients equal the plain model's bit for bit") -> None:
    """train_steps' (losses, grads, lora params after) against the plain model's, bit for bit."""
    tc.assertEqual(got[0], want[0])
    tc.assertEqual(same(got[1], want[1]), [], msg)
    tc.assertEqual(same(got[2], want[2]), [])


@contextlib.contextmanager
def fp8_matmul_stood_in(calls: list | None = None):
    """The device's FP8 matmuls stood in for on any device: device_has_fp8 true, and
    torch._scaled_mm by f32 arithmetic on the FP8 operands it is given (counted in
    calls[0] where calls is given)."""
    from arena_gpu.torch import _fp8

    def mm(a, b, scale_a, scale_b, bias=None, out_dtype=None):
        if calls is not None:
            calls[0] += 1
        if (a.dtype, b.dtype) != (torch.float8_e4m3fn, torch.float8_e4m3fn):
            raise AssertionError(f"_scaled_mm given {a.dtype} and {b.dtype}, not FP8")
        out = (a.float() * scale_a) @ (b.float() * scale_b)
        return (out if bias is None else out + bias.float()).to(out_dtype)

    real_has, real_mm = _fp8.device_has_fp8, torch._scaled_mm
    _fp8.device_has_fp8 = lambda d: True
    torch._scaled_mm = mm
    try:
        yield
    finally:
        _fp8.device_has_fp8, torch._scaled_mm = real_has, real_mm


@contextlib.contextmanager
def grad_fp8(on: bool):
    """The native backward's input gradient as an FP8 product (on, the default) or
    with the weight dequantized for it (off), for the block; restored after."""
    from arena_gpu.torch import _fp8

    was = _fp8.GRAD_FP8
    _fp8.GRAD_FP8 = on
    try:
        yield
    finally:
        _fp8.GRAD_FP8 = was


def compiled_steps(tc: unittest.TestCase, m, h, want) -> None:
    """Compile every block (fullgraph, aot_eager), run four sampling steps: each equals
    want, nothing recompiles after the first, blocks were streamed; detaches h."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("aot_eager")
    for blocks in (m.transformer_blocks, m.single_transformer_blocks):
        for b in blocks:
            b.compile(backend=cnt, fullgraph=True)
    with torch.no_grad():
        tc.assertTrue(torch.equal(m(**inputs()).sample, want))
        first = cnt.frame_count
        tc.assertGreater(first, 0)
        for _ in range(3):
            tc.assertTrue(torch.equal(m(**inputs()).sample, want))
    tc.assertEqual(cnt.frame_count, first, "no recompiles after the first step")
    h.end_step()
    tc.assertGreater(h.stats()[-1]["streamed_bytes"], 0)
    h.detach()
    torch._dynamo.reset()


class Package(unittest.TestCase):
    def test_structs_match_arena_h(self):
        """The ctypes mirrors of arena.h's structs have its layout: every field's offset
        and each struct's size, as a C compiler lays them out (a field added to one
        side only would shift the rest and be read as garbage)."""
        import arena_gpu._native as nat

        structs = {"arena_open_options": nat.OpenOptions, "arena_block_info": nat.BlockInfo,
                   "arena_tensor_info": nat.TensorInfo, "arena_step_info": nat.StepInfo,
                   "arena_plan_info": nat.PlanInfo, "arena_convert_options": nat.ConvertOptions,
                   "arena_convert_info": nat.ConvertInfo, "arena_bad_chunk": nat.BadChunk,
                   "arena_verify_options": nat.VerifyOptions, "arena_verify_info": nat.VerifyInfo,
                   "arena_rest_info": nat.RestInfo, "arena_memory_info": nat.MemoryInfo,
                   "arena_decision_info": nat.DecisionInfo}
        lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "arena.h"', "int main(void) {"]
        for c, py in structs.items():
            lines.append(f'printf("{c} %zu\\n", sizeof({c}));')
            lines += [f'printf("{c}.{f} %zu\\n", offsetof({c}, {f}));' for f, _ in py._fields_]
        lines.append("return 0; }")
        src, exe = os.path.join(TMP, "layout.c"), os.path.join(TMP, "layout")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        inc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include")
        subprocess.run([os.environ.get("CC", "cc"), "-I", inc, "-o", exe, src], check=True)
        got = dict(line.split() for line in subprocess.run([exe], check=True, capture_output=True,
                                                           text=True).stdout.splitlines())
        want = {}
        for c, py in structs.items():
            want[c] = str(ctypes.sizeof(py))
            want.update({f"{c}.{f}": str(getattr(py, f).offset) for f, _ in py._fields_})
        self.assertEqual({k: v for k, v in want.items() if got.get(k) != v},
                         {k: got[k] for k, v in want.items() if got.get(k) != v})
        self.assertEqual(len(got), len(want))

    def test_payback_steps(self):
        for bad in (0, -1, True, 2.5, "16", 2**32):
            with self.assertRaisesRegex(ValueError, "payback_steps: .*a whole number of steps, 1 or more"):
                arena.open(IMG, device="sim", payback_steps=bad)
        with arena.open(IMG, payback_steps=1000, **STREAM) as a:
            self.assertGreater(a.plan()["n_streamed"], 0)

    def test_open_tensors_equal_the_file(self):
        with arena.open(IMG, **STREAM) as a:
            self.assertEqual(a.backend, "sim")
            self.assertGreater(a.plan()["n_streamed"], 0)
            t = a.tensors()
            self.assertEqual(same(t, SD), [])
            arr = a.arrays()
            self.assertEqual(len(arr), len(SD))
            k = "transformer_blocks.0.attn.to_q.weight"
            self.assertTrue(torch.equal(torch.from_numpy(arr[k].view("uint16").copy()).view(torch.bfloat16), SD[k]))
            self.assertFalse(arr[k].flags.writeable)

    def test_tensor_outlives_arena(self):
        a = arena.open(IMG, **RESIDENT)
        raw = a._handle()
        t = a.tensors()["x_embedder.weight"]
        want = SD["x_embedder.weight"].clone()
        a.close()
        a.close()  # twice: harmless
        gc.collect()
        self.assertTrue(torch.equal(t, want), "a tensor keeps its arena's memory after close")
        with self.assertRaises(arena.Error) as cm:
            a.tensors()
        self.assertEqual(cm.exception.code, "USAGE")
        self.assertTrue(arena._dlpack.arena_alive(raw), "a live tensor keeps its arena")
        del t
        gc.collect()
        self.assertFalse(arena._dlpack.arena_alive(raw), "the last tensor gone, the arena is freed")

    def test_a_capsule_that_cannot_be_made_keeps_no_reference(self):
        a = arena.open(IMG, **RESIDENT)
        raw = a._handle()
        real = arena._dlpack._PyCapsule_New

        def fail(*args):
            raise MemoryError("injected")

        arena._dlpack._PyCapsule_New = fail
        try:
            with self.assertRaises(MemoryError):
                a.tensors()
        finally:
            arena._dlpack._PyCapsule_New = real
        a.close()
        gc.collect()
        self.assertFalse(arena._dlpack.arena_alive(raw), "the tensor made for the capsule gave its reference back")

    def test_errors_carry_name_and_message(self):
        with self.assertRaises(arena.Error) as cm:
            arena.open(os.path.join(TMP, "missing.arena"))
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        self.assertIn("missing.arena", cm.exception.message)
        with self.assertRaises(arena.Error) as cm:
            arena.open(IMG, device="sim", vram="100K")
        self.assertEqual(cm.exception.code, "BUDGET")
        self.assertIn("it needs", cm.exception.message)
        bad = os.path.join(TMP, "bad.arena")
        with open(IMG, "rb") as f:
            data = bytearray(f.read())
        data[-5000] ^= 0xFF
        with open(bad, "wb") as f:
            f.write(data)
        with self.assertRaises(arena.Error) as cm:
            arena.open(bad, device="sim")
        self.assertEqual(cm.exception.code, "IMG_CHUNK_CHECKSUM")
        self.assertEqual(cm.exception.error_class, "invalid")
        with self.assertRaises(ValueError):
            arena.open(IMG, device="tpu")

    def test_parse_size(self):
        self.assertEqual(arena.parse_size("8G"), 8 << 30)
        self.assertEqual(arena.parse_size("1.5GiB"), 3 << 29)
        self.assertEqual(arena.parse_size(4096), 4096)
        self.assertIsNone(arena.parse_size(None))
        for bad in ("nan", "-1G", " 8G", "0x10", "8 G", "", "1e9", "GiB"):
            with self.assertRaises(ValueError, msg=bad):
                arena.parse_size(bad)

    def test_steps_from_python(self):
        with arena.open(IMG, **STREAM) as a:
            for _ in range(2):
                a.step_begin()
                for b in a.blocks:
                    a.acquire(b.index)
                    a.release(b.index)
                a.step_end()
            st = a.stats()
            self.assertEqual(len(st), 2)
            self.assertEqual(st[1]["misses"], 0)
            with self.assertRaises(arena.Error) as cm:
                a.release(1)
            self.assertEqual(cm.exception.code, "USAGE")
            self.assertIn("outside a step", cm.exception.message)

    def test_pieces_from_python(self):
        """piece_size: the blocks are pieces, each tensor's bytes as in the whole-block open."""
        with arena.open(IMG, device="sim") as w, arena.open(IMG, device="sim", piece_size="16K") as a:
            self.assertGreater(len(a.blocks), len(w.blocks))
            self.assertTrue(any("#" in b.name for b in a.blocks))
            want = w.tensors()
            got = a.tensors()
            self.assertEqual(set(got), set(want))
            for n, t in got.items():
                self.assertTrue(torch.equal(t, want[n]), n)


    def test_dir_lists_the_public_names(self):
        """dir(arena.torch) is its public API (__all__), not what it imports."""
        self.assertEqual(sorted(dir(at)), sorted(at.__all__))
        for n in at.__all__:
            self.assertTrue(hasattr(at, n), n)
        self.assertIn("torch", dir(arena), "the subpackage, once imported")


class Sampling(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with torch.no_grad():
            cls.want = model(meta=False)(**inputs()).sample

    def check(self, m, n_steps: int = 3):
        with torch.no_grad():
            for _ in range(n_steps):
                self.assertTrue(torch.equal(m(**inputs()).sample, self.want))

    def test_streamed_equals_plain(self):
        m = model()
        h = at.attach(m, IMG, **STREAM)
        self.assertGreater(h.plan()["n_streamed"], 0)
        self.check(m)
        h.end_step()
        st = h.stats()
        self.assertEqual(st[-1]["misses"], 0)
        self.assertGreater(st[-1]["streamed_bytes"], 0)
        h.detach()

    def test_partial_disk_tier_equals_plain(self):
        """A host budget for the disk tier's staging and about half the streamed blocks:
        the rest stay in the image (spread through the step), read when streamed;
        outputs are the plain model's, bit for bit, step after step."""
        m = model()
        h = at.attach(m, IMG, **STREAM)
        full = h.plan()["host_bytes"]
        h.detach()
        m = model()
        h = at.attach(m, IMG, host_budget=0, **STREAM)
        least = h.plan()["staging_bytes"]
        h.detach()
        m = model()
        h = at.attach(m, IMG, host_budget=least + full // 2, **STREAM)
        pl = h.plan()
        self.assertGreater(pl["n_disk"], 0)
        self.assertLess(pl["n_disk"], pl["n_streamed"])
        self.assertEqual(pl["host_budget"], least + full // 2)
        self.assertEqual(pl["staging_bytes"], least)
        self.assertLessEqual(pl["host_bytes"], full // 2)
        self.check(m)
        h.end_step()
        self.check(m)  # with the schedule the first step taught
        h.end_step()
        self.assertGreater(h.stats()[-1]["disk_bytes"], 0)
        h.detach()

    def test_disk_tier_equals_plain(self):
        """host_budget=0: every streamed block read from the image when it is streamed,
        through the least staging."""
        m = model()
        h = at.attach(m, IMG, host_budget=0, **STREAM)
        pl = h.plan()
        self.assertGreater(pl["n_disk"], 0)
        self.assertEqual(pl["n_disk"], pl["n_streamed"])
        self.assertEqual(pl["host_bytes"], 0)
        self.assertEqual(pl["host_budget"], pl["staging_bytes"])
        self.assertGreater(pl["staging_bytes"], 0)
        with self.assertRaises(arena.Error) as cm:  # no memory to view for blocks in the image only
            h.arena.tensors()
        self.assertEqual(cm.exception.code, "USAGE")
        self.assertIn("in the image only", cm.exception.message)
        self.check(m)
        h.end_step()
        self.assertGreater(sum(r["disk_bytes"] for r in h.stats()), 0)
        self.assertTrue(all(r["disk_wait_s"] >= 0 for r in h.stats()))
        for r in h.stats():  # the record's fields from arena_step_info, typed
            self.assertIsInstance(r["looked"], bool)
            self.assertIsInstance(r["move_held"], bool)
            self.assertTrue(all(isinstance(r[k], float) and r[k] >= 0
                                for k in ("look_s", "look_now_s", "look_plan_s", "move_est_s", "move_gain_s")))
        h.detach()

    def test_resident_equals_plain(self):
        m = model()
        h = at.attach(m, IMG, **RESIDENT)
        self.assertEqual(h.plan()["n_streamed"], 0)
        self.check(m)
        h.detach()

    @slow
    def test_vram_counts_what_torch_holds(self):
        """Under vram, what the rest of the process holds past reserve (torch's allocator:
        on CUDA arena.torch tells the engine before each step end) leaves arena's budget:
        blocks stream from the next step end on, and return once torch holds less; back
        on the device they give their host copies back (release_host, the default), or
        keep them. Every step equals the plain model's."""
        for release in (True, False):
            with self.subTest(release_host=release):
                self._rest_and_release(release)

    def _rest_and_release(self, release: bool) -> None:
        m = model()
        # learn=False: moves by bytes only (a loaded machine's timings must not decide them)
        h = at.attach(m, IMG, device="sim", sim_capacity="16G", vram="400K", reserve="100K", headroom=0, keep_last=0,
                      release_host=release, learn=False)
        self.assertEqual(h.plan()["n_streamed"], 0)
        held = [100 << 10]
        h._rest_memory = lambda: held[0]
        self.check(m, 2)
        held[0] = 115 << 10  # 15 KiB past the reserve: the whole model (288 KiB) no longer fits
        self.check(m, 3)
        h.end_step()
        st = h.stats()
        self.assertEqual(st[-1]["budget"], (400 - 115) << 10)
        self.assertGreater(h.plan()["n_streamed"], 0)
        self.assertGreater(sum(r["demotions"] for r in st), 0)
        streamed = [b.index for b in h.arena.blocks if not h.arena.block_state(b.index)[0]]
        self.assertTrue(all(h.arena.block_state(i)[2] for i in streamed), "streamed blocks have host copies")
        held[0] = 0
        self.check(m, 6)
        h.end_step()
        self.assertEqual(h.plan()["n_streamed"], 0, "back on the device after the hysteresis")
        hosts = [h.arena.block_state(i)[2] for i in streamed]
        if release:
            self.assertEqual(hosts, [0] * len(streamed), "host copies given back")
        else:
            self.assertTrue(all(hosts), "host copies kept")
        # the engine streams them again: read from the image again, the same outputs
        held[0] = 115 << 10
        self.check(m, 3)
        h.detach()
        with self.assertRaises(ValueError):
            h.arena.set_rest_memory(-1)

    def test_materialized_module_is_accepted(self):
        m = model(meta=False)
        old = m.x_embedder.weight
        h = at.attach(m, IMG, **STREAM)
        self.assertIsNot(m.x_embedder.weight, old, "the module's own tensors are released once bound")
        self.check(m, 2)
        h.detach()

    def test_repr_says_what_is_attached(self):
        m = model()
        h = at.attach(m, IMG, vram="290K", **STREAM)
        r = repr(h)
        p = h.plan()
        n = p["n_streamed"]
        self.assertGreater(n, 0)
        self.assertEqual(r, f"<arena.torch.Handle FluxTransformer2DModel to {IMG!r}: sample, vram 290.00 KiB, "
                            f"sim, {p['n_resident'] + n} blocks, {n} streamed>")
        h.detach()
        self.assertEqual(repr(h), f"<arena.torch.Handle FluxTransformer2DModel to {IMG!r}: detached>")
        # no vram: the device's free memory; train mode
        h = at.attach(model(), IMG, mode="train", device="sim")
        self.assertEqual(repr(h), f"<arena.torch.Handle FluxTransformer2DModel to {IMG!r}: train, vram: what the "
                                  f"device has free, sim, {p['n_resident'] + n} blocks, 0 streamed>")
        h.detach()

    def test_detach_returns_a_plain_module(self):
        m = model()
        cls = type(m.transformer_blocks[0])
        h = at.attach(m, IMG, **STREAM)
        self.assertIsNot(type(m.transformer_blocks[0]), cls)
        self.check(m, 1)
        h.detach()
        self.assertIs(type(m.transformer_blocks[0]), cls)
        self.assertEqual({p.device.type for p in m.parameters()}, {"meta"})
        self.assertEqual(m._forward_pre_hooks, {})
        self.assertNotIn("_apply", m.x_embedder.__dict__)
        # and it can be attached again
        h = at.attach(m, IMG, **STREAM)
        self.check(m, 1)
        h.detach()


def inputs_t(T: int, seed: int = 0) -> dict:
    """inputs() with T image tokens: another resolution, another work."""
    x = inputs(seed)
    g = torch.Generator().manual_seed(seed + 100)
    x["hidden_states"] = torch.randn(1, T, 16, generator=g).to(torch.bfloat16)
    x["img_ids"] = torch.zeros(T, 3)
    return x


class ShareHost(unittest.TestCase):
    """share_host and group outside torch.distributed (the processes' case is
    tests/python/test_examples.py's train_lora_ddp, and tests/unit/test_share.c)."""

    def setUp(self):
        self.shm = tempfile.mkdtemp(dir=TMP)
        os.environ["ARENA_SHARE_DIR"] = self.shm

    def tearDown(self):
        del os.environ["ARENA_SHARE_DIR"]

    @staticmethod
    def regions() -> dict:
        """The arena regions this process maps: {(name, inode): number of mappings}
        (two memory files of one name would be two entries)."""
        seen: dict = {}
        for line in open("/proc/self/maps"):
            if "/memfd:arena-" in line:
                key = (line.split("/memfd:")[1].split()[0], line.split()[4])
                seen[key] = seen.get(key, 0) + 1
        return seen

    def test_two_attaches_share_one_region_and_equal_plain(self):
        with torch.no_grad():
            want = model(meta=False)(**inputs()).sample
        m1, m2 = model(), model()
        h1 = at.attach(m1, IMG, share_host=True, **STREAM)
        h2 = at.attach(m2, IMG, share_host=True, **STREAM)
        self.assertGreater(h2.plan()["n_streamed"], 0)
        r = self.regions()
        self.assertEqual(len(r), 1, f"one region for one layout: {r}")
        self.assertGreaterEqual(list(r.values())[0], 2, "each arena maps the region")
        self.assertEqual(len(os.listdir(self.shm)), 1)
        with torch.no_grad():
            for _ in range(2):
                self.assertTrue(torch.equal(m1(**inputs()).sample, want))
                self.assertTrue(torch.equal(m2(**inputs()).sample, want))
        h1.detach()
        h2.detach()

    def test_share_states_and_an_untrusted_folder_warns_and_equals_plain(self):
        with torch.no_grad():
            want = model(meta=False)(**inputs()).sample
        m1, m2 = model(), model()
        with warnings.catch_warnings():
            warnings.simplefilter("error", arena.ShareWarning)
            h1 = at.attach(m1, IMG, share_host=True, **STREAM)
            h2 = at.attach(m2, IMG, share_host=True, **STREAM)
        self.assertEqual(h1.arena.share_state(), ("loaded", ""))
        self.assertEqual(h2.arena.share_state(), ("mapped", ""))
        h1.detach()
        h2.detach()
        # a share folder other users can write: never used; a private copy, one warning
        os.chmod(self.shm, 0o777)
        m3 = model()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            h3 = at.attach(m3, IMG, share_host=True, **STREAM)
        got = [x for x in w if issubclass(x.category, arena.ShareWarning)]
        self.assertEqual(len(got), 1, [str(x.message) for x in w])
        msg = str(got[0].message)
        self.assertIn("other users can write the share folder", msg)
        self.assertNotIn("\n", msg)
        state, why = h3.arena.share_state()
        self.assertEqual(state, "private")
        self.assertIn(self.shm, why)
        self.assertEqual(os.listdir(self.shm), [], "nothing written into a folder other users can write")
        self.assertEqual(self.regions(), {})
        with torch.no_grad():
            self.assertTrue(torch.equal(m3(**inputs()).sample, want))
        h3.detach()

    def test_share_host_off_by_default_without_distributed(self):
        self.assertEqual(at.local_ranks(), (0, 1))
        h = at.attach(model(), IMG, **STREAM)
        self.assertEqual(self.regions(), {}, "no region without share_host outside torch.distributed")
        h.detach()

    def test_refused_combinations(self):
        with self.assertRaises(arena.Error) as cm:
            at.attach(model(), IMG, group=object(), **STREAM)
        self.assertEqual(cm.exception.code, "USAGE")
        self.assertIn("torch.distributed is not initialized", cm.exception.message)
        with arena.open(IMG, **STREAM) as a:
            with self.assertRaises(arena.Error) as cm:
                at.attach(model(), a, share_host=True)
            self.assertEqual(cm.exception.code, "USAGE")
        ckpt = os.path.join(FIX, "tiny_flux.safetensors")
        with self.assertRaises(arena.Error) as cm:
            arena.open(ckpt, share_host=True, **STREAM)
        self.assertEqual(cm.exception.code, "USAGE")
        self.assertIn("arena convert it", cm.exception.message)


class ZeroSettings(unittest.TestCase):
    """attach(module, image) with nothing else runs, equal to the plain model; under
    vram, torch's need is learned per work and the process stays within it."""

    def test_no_arguments_sampling_equals_plain(self):
        want = model(meta=False)(**inputs()).sample
        for opts in ({}, {"sim_capacity": "200K"}):  # the default card, and one smaller than the model
            with self.subTest(**opts):
                m = model()
                h = at.attach(m, IMG, **opts)
                with torch.no_grad():
                    for _ in range(3):
                        self.assertTrue(torch.equal(m(**inputs()).sample, want))
                h.end_step()
                if opts:
                    self.assertGreater(h.plan()["n_streamed"], 0, "the small card streams")
                    self.assertGreater(h.plan()["piece_size"], 0, "in pieces: piece_size defaults to auto")
                h.detach()

    def test_no_arguments_training_equals_plain(self):
        m0 = model(meta=False)
        add_lora(m0)
        want = train_steps(m0)
        for opts in ({}, {"sim_capacity": "260K"}):
            with self.subTest(**opts):
                m = model()
                h = at.attach(m, IMG, mode="train", **opts)
                add_lora(m)
                same_step(self, train_steps(m), want)
                h.end_step()
                if opts:
                    self.assertGreater(h.plan()["n_streamed"], 0)
                h.detach()

    def test_torch_out_of_memory_in_a_step_is_said_and_nothing_is_lost(self):
        """torch running out inside a step of the module each time it is run (arena runs
        it again once, the headroom lent, and no more: tests/python/test_retry.py) comes
        out as arena.Error DEV_OOM, saying what torch held and asked for; the step's
        blocks are released on the way out, and the next step runs as the plain model
        does."""
        want = model(meta=False)(**inputs()).sample
        m = model()
        h = at.attach(m, IMG, device="sim", sim_capacity="200K", vram="200K")
        fail = [True]

        def boom(mod, args):
            if fail[0]:
                h._oom(3 << 20)  # what torch's allocator observer would say
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 MiB")

        hook = m.single_transformer_blocks[1].register_forward_pre_hook(boom)
        with torch.no_grad():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", arena.OomRetryWarning)
                with self.assertRaises(arena.Error) as cm:
                    m(**inputs())
            self.assertEqual(cm.exception.code, "DEV_OOM")
            self.assertIn("torch ran out of device memory in a step", cm.exception.message)
            self.assertIn("asked for 3.00 MiB more", cm.exception.message)
            self.assertIn("under vram=200.00 KiB", cm.exception.message)
            self.assertIn("arena ran it again 1 time(s)", cm.exception.message)
            self.assertIsInstance(cm.exception.__cause__, torch.OutOfMemoryError)
            fail[0] = False
            for _ in range(2):
                self.assertTrue(torch.equal(m(**inputs()).sample, want))
        h.end_step()
        self.assertGreater(h.stats()[-1]["acquires"], 0)
        hook.remove()
        h.detach()

    def test_all_resident_after_a_move_waits_for_the_copies(self):
        """A step end whose move makes every block resident queues the promoted blocks'
        copies; the next step, which binds resident blocks without acquiring them, waits
        for those copies first (slow simulated copies make the race certain): every
        output equals the plain model's."""
        cap = 420 << 10
        m = model()
        h = at.attach(m, IMG, device="sim", sim_capacity="16G", sim_context="24K", vram=cap, learn_rest=True,
                      sim_bandwidth=2e6)
        torch_ = {"held": 0, "peak": 0}

        def demand(mod, args, kwargs):
            if torch_["held"] < 40 << 10:
                h.arena.sim_rest(40 << 10)
                torch_["held"] = 40 << 10
            torch_["peak"] = torch_["held"]

        hook = m.single_transformer_blocks[0].register_forward_pre_hook(demand, with_kwargs=True)
        h._rest_memory = lambda: torch_["held"]
        h._rest_peak = lambda: torch_["peak"]
        h._rest_reset = lambda: torch_.update(peak=torch_["held"])
        want = model(meta=False)(**inputs_t(16)).sample
        with torch.no_grad():
            for k in range(4):
                self.assertTrue(torch.equal(m(**inputs_t(16)).sample, want), k)
                h.end_step()
        st = h.stats()
        self.assertGreater(st[0]["promotions"], 0, "the first step's end promoted blocks")
        self.assertEqual(h.plan()["n_streamed"], 0, "then everything is resident")
        hook.remove()
        h.detach()

    def test_torch_need_is_learned_per_work_and_vram_holds(self):
        """A modelled torch on the simulator (its allocator's memory in the simulated
        process, held as a cache between steps): 40 KiB at 16 tokens, 120 KiB at 48.
        Each new resolution's first step runs with the weights at their smallest, then
        its need is learned; the simulated process never holds more than vram, torch
        never asks past the limit arena leaves it, every output equals the plain model's."""
        cap = 420 << 10
        m = model()
        h = at.attach(m, IMG, device="sim", sim_capacity="16G", sim_context="24K", vram=cap, learn_rest=True)
        self.assertTrue(h.arena.memory()["cap"] == cap)
        torch_ = {"held": 0, "peak": 0}

        def demand(mod, args, kwargs):  # the first block's input: its tokens say the work
            T = (kwargs.get("hidden_states") if "hidden_states" in kwargs else args[0]).shape[1]
            need = 40 << 10 if T == 16 else 120 << 10
            if need > torch_["held"]:
                lim = h.arena.memory()["rest_limit"]
                self.assertLessEqual(need, lim, f"torch at {T} tokens asked past its limit")
                h.arena.sim_rest(need)
                torch_["held"] = need
            torch_["peak"] = max(torch_["peak"], need)

        hook = m.single_transformer_blocks[0].register_forward_pre_hook(demand, with_kwargs=True)
        h._rest_memory = lambda: torch_["held"]
        h._rest_peak = lambda: torch_["peak"]
        h._rest_reset = lambda: torch_.update(peak=torch_["held"])
        plain = model(meta=False)
        wants = {T: plain(**inputs_t(T)).sample for T in (16, 48)}
        at_open = h.plan()["resident_bytes"]
        with torch.no_grad():
            for k, T in enumerate([16, 16, 16, 48, 48, 48, 16, 16]):
                self.assertTrue(torch.equal(m(**inputs_t(T)).sample, wants[T]), (k, T))
                h.end_step()
                peak = h.arena.sim_peak(reset=True)
                self.assertLessEqual(peak, cap, f"step {k} ({T} tokens): the process held {peak} over vram {cap}")
        mem = h.arena.memory()
        self.assertEqual(mem["works"], 2)
        self.assertTrue(mem["learned"])
        self.assertEqual(mem["other"], 24 << 10, "the context is what the process holds beside arena and torch")
        st = h.stats()
        self.assertGreater(st[0]["resident_bytes"], at_open, "the learned need gave the weights room")
        self.assertLess(st[3]["resident_bytes"], st[2]["resident_bytes"], "the new resolution's need took room back")
        hook.remove()
        h.detach()


class Decisions(unittest.TestCase):
    """``h.decisions()``: a record per change of the plan saying why; ``share_card``."""

    @classmethod
    def setUpClass(cls):
        with torch.no_grad():
            cls.want = model(meta=False)(**inputs()).sample

    def run_steps(self, h, m, n: int) -> None:
        with torch.no_grad():
            for _ in range(n):
                self.assertTrue(torch.equal(m(**inputs()).sample, self.want))
        h.end_step()

    def test_decisions_say_why_the_plan_changed(self):
        """A modelled torch on the simulator (40 KiB in a step) under vram: the first
        step's end learns its need and promotes (why "need"); a step in which torch's
        allocator reports an out-of-memory (its observer: what it held and asked for)
        ends by demoting for that need (why "oom"), leaving torch the room; each record
        is counted in its step's stats. Every output equals the plain model's."""
        m = model()
        h = at.attach(m, IMG, device="sim", sim_capacity="16G", sim_context="24K", vram=480 << 10, learn_rest=True,
                      learn=False, piece_size="16K")
        torch_ = {"held": 0, "peak": 0}
        oom = {"asked": 0}

        def demand(mod, args, kwargs):
            if torch_["held"] < 40 << 10:
                h.arena.sim_rest(40 << 10)
                torch_["held"] = 40 << 10
            torch_["peak"] = torch_["held"]
            if oom["asked"]:
                h._oom(oom["asked"])  # what torch's allocator observer says before it raises
                oom["asked"] = 0

        hook = m.single_transformer_blocks[0].register_forward_pre_hook(demand, with_kwargs=True)
        h._rest_memory = lambda: torch_["held"]
        h._rest_peak = lambda: torch_["peak"]
        h._rest_reset = lambda: torch_.update(peak=torch_["held"])
        self.run_steps(h, m, 3)
        d = h.decisions()
        self.assertEqual([x["why"] for x in d], ["need"], d)
        self.assertEqual(d[0]["step"], 0)
        self.assertFalse(d[0]["between"])
        self.assertGreater(d[0]["promoted"], 0)
        self.assertEqual(h.stats()[0]["promotions"], d[0]["promoted"])
        full = h.plan()["resident_bytes"]
        self.assertEqual(d[0]["resident_after"], full)
        limit = h.arena.memory()["rest_limit"]
        oom["asked"] = limit  # with the 40 KiB held: more than the limit
        self.run_steps(h, m, 1)
        d = h.decisions()
        self.assertEqual([x["why"] for x in d], ["need", "oom"], d)
        r = d[-1]
        self.assertEqual(r["step"], len(h.stats()) - 1, "made at the end of the step that ran out")
        self.assertGreater(r["demoted"], 0)
        self.assertEqual(r["demoted_bytes"], full - r["resident_after"])
        self.assertGreaterEqual(h.arena.memory()["rest_limit"], (40 << 10) + limit, "torch's need has room")
        self.run_steps(h, m, 2)
        self.assertEqual(len(h.decisions()), 2, "the need learned: nothing more moves")
        for x in h.decisions():
            self.assertEqual(set(x), {"step", "between", "why", "promoted", "demoted", "promoted_bytes",
                                      "demoted_bytes", "resident_before", "resident_after", "ring_before",
                                      "ring_after", "budget", "free_bytes", "stream_before", "stream_after",
                                      "step_before_s", "step_after_s"})
        hook.remove()
        h.detach()

    def test_share_card_yields_to_another_program(self):
        """vram=None on a simulated card of 640 KiB: with share_card the plan leaves it
        free at every step end, and when another program takes memory so that less is
        free, the next step end gives memory back (why "yield") until the share is free
        again; without it the same program's memory moves nothing (arena needs no more
        than it has). Every output equals the plain model's."""
        share = 200 << 10
        for with_share in (True, False):
            with self.subTest(share_card=with_share):
                m = model()
                h = at.attach(m, IMG, device="sim", sim_capacity="640K", reserve="100K", headroom=0,
                              piece_size="16K", learn=False, share_card=share if with_share else None)
                self.assertEqual(h.arena.memory()["share_card"], share if with_share else 0)
                self.run_steps(h, m, 2)
                self.assertEqual(h.plan()["n_streamed"], 0)
                if with_share:
                    self.assertGreaterEqual(h.arena.device_memory()[0], share)
                h.arena.sim_pressure("160K")  # what is free past the share, and more
                self.run_steps(h, m, 2)
                d = h.decisions()
                if not with_share:
                    self.assertEqual(d, [])
                    self.assertEqual(h.plan()["n_streamed"], 0)
                else:
                    self.assertEqual([x["why"] for x in d], ["yield"], d)
                    self.assertGreater(d[0]["demoted"], 0)
                    self.assertGreater(d[0]["stream_after"], 0, "what it gave back streams each step")
                    self.assertGreaterEqual(h.arena.device_memory()[0], share)
                h.arena.sim_pressure(0)
                h.detach()

    def test_share_card_arguments(self):
        with arena.open(IMG, device="sim", sim_capacity="640K", share_card=True) as a:
            self.assertEqual(a.memory()["share_card"], 64 << 10, "a tenth of the device")
        with arena.open(IMG, device="sim", sim_capacity="640K", share_card=0.25) as a:
            self.assertEqual(a.memory()["share_card"], 160 << 10)
        with arena.open(IMG, device="sim", sim_capacity="640K", share_card="100K") as a:
            self.assertEqual(a.memory()["share_card"], 100 << 10)
        for off in (None, False, 0):
            with arena.open(IMG, device="sim", sim_capacity="640K", share_card=off) as a:
                self.assertEqual(a.memory()["share_card"], 0)
        for bad in (1.0, 0.0, -0.5):
            with self.assertRaisesRegex(ValueError, "share_card: .*a fraction of the device above 0 and below 1"):
                arena.open(IMG, device="sim", share_card=bad)
        with self.assertRaisesRegex(ValueError, "share_card: 'lots' is not a size"):
            arena.open(IMG, device="sim", share_card="lots")
        with self.assertRaises(arena.Error) as cm:
            at.attach(model(), IMG, device="sim", vram="400K", share_card=True)
        self.assertEqual(cm.exception.code, "USAGE")
        self.assertIn("give vram or share_card, not both", cm.exception.message)
        with arena.open(IMG, device="sim") as a, self.assertRaises(arena.Error) as cm:
            at.attach(model(), a, share_card=True)
        self.assertEqual(cm.exception.code, "USAGE")


class Training(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        m = model(meta=False)
        add_lora(m)
        cls.losses, cls.grads, cls.after = train_steps(m)

    def run_attached(self, opts, lora_first: bool = False):
        m = model(meta=not lora_first)  # adapters added first need a module with real tensors
        if lora_first:
            add_lora(m)
        h = at.attach(m, IMG, mode="train", **opts)
        if not lora_first:
            add_lora(m)
        res = train_steps(m)
        h.end_step()
        return h, res

    @slow
    def test_streamed_lora_equals_plain(self):
        h, (losses, grads, after) = self.run_attached(STREAM)
        self.assertGreater(h.plan()["n_streamed"], 0)
        same_step(self, (losses, grads, after), (self.losses, self.grads, self.after))
        st = h.stats()
        self.assertEqual([r["mode"] for r in st], ["train", "train"])
        self.assertEqual(st[-1]["acquires"], 2 * (len(h.arena.blocks) - 1), "forward and recompute")
        h.detach()

    def test_resident_lora_equals_plain(self):
        h, (losses, grads, after) = self.run_attached(RESIDENT)
        self.assertEqual(same(grads, self.grads), [])
        h.detach()

    def test_lora_added_before_attach(self):
        h, (losses, grads, after) = self.run_attached(STREAM, lora_first=True)
        self.assertEqual(same(grads, self.grads), [], "peft's base_layer names map to the image's")
        h.detach()

    def test_without_checkpointing(self):
        """No checkpointing: what a streamed block's forward saves of its weights is kept
        as references, and the block is acquired again when its backward unpacks them
        (held until its backward has run): the plain model's gradients, whole blocks and
        in pieces."""
        m0 = model(meta=False)
        add_lora(m0)
        want = train_steps(m0, checkpointing=False)
        for opts in (STREAM, dict(STREAM, sim_capacity="200K", piece_size="8K", depth=8)):
            with self.subTest(opts=opts):
                m = model()
                h = at.attach(m, IMG, mode="train", **opts)
                add_lora(m)
                same_step(self, train_steps(m, checkpointing=False), want)
                h.end_step()
                self.assertGreater(h.plan()["n_streamed"], 0)
                st = h.stats()[-1]
                self.assertGreater(st["acquires"], len(h.arena.blocks) - 1, "the backward acquired blocks again")
                h.detach()

    @slow
    def test_saved_tensors_in_host_memory(self):
        """offload_saved: what the forward saves for the backward waits in host memory
        and comes back ahead of its use; the step is the plain model's bit for bit."""
        for opts in (STREAM, dict(Pieces.PIECES, sim_capacity="200K")):
            h, (losses, grads, after) = self.run_attached(dict(opts, offload_saved=1))
            self.assertGreater(h.plan()["n_streamed"], 0)
            same_step(self, (losses, grads, after), (self.losses, self.grads, self.after))
            st = h.offload_stats()
            # each block's inputs at least (hidden states; text states, the shared embedding once)
            nblocks = len({b.name.partition("#")[0] for b in h.arena.blocks if b.container})
            self.assertGreater(st["tensors"], nblocks, st)
            self.assertGreaterEqual(st["fetched_ahead"] + st["fetched_late"], st["tensors"], "every one came back")
            self.assertLessEqual(st["fetched_late"], 2, st)
            self.assertEqual(_saved_hooks(), [], "no saved-tensor hooks left after the forward")
            with h.sampling(), torch.no_grad():
                m = h.module
                m(**inputs(3))
            self.assertEqual(h.offload_stats()["tensors"], 0, "a forward without autograd saves nothing")
            h.detach()
        # only tensors of at least the size given
        h, _ = self.run_attached(dict(STREAM, offload_saved="1K"))
        big = h.offload_stats()
        self.assertGreater(big["tensors"], 0)
        self.assertLess(big["tensors"], st["tensors"])
        self.assertEqual(big["fetched_late"], 0)
        h.detach()
        h, _ = self.run_attached(STREAM)
        self.assertEqual(h.offload_stats(), dict(tensors=0, bytes=0, fetched_ahead=0, fetched_late=0))
        h.detach()

    def test_saved_tensors_after_a_failed_forward(self):
        m = model()
        h = at.attach(m, IMG, mode="train", offload_saved=1, **STREAM)
        add_lora(m)
        m.enable_gradient_checkpointing()
        bad = inputs()
        bad["encoder_hidden_states"] = bad["encoder_hidden_states"][..., :31]
        with self.assertRaises(RuntimeError):
            m(**bad)
        self.assertEqual(_saved_hooks(), [], "the hooks go with the failed forward")
        losses, grads, _ = train_steps(m)
        self.assertEqual(losses, self.losses)
        self.assertEqual(same(grads, self.grads), [])
        h.detach()

    def test_meta_adapters_are_refused(self):
        m = model()
        add_lora(m)  # on a meta module, peft makes meta adapters: nothing to train
        with self.assertRaises(arena.Error) as cm:
            at.attach(m, IMG, mode="train", **STREAM)
        self.assertIn("lora_A.default.weight' is on the meta device", cm.exception.message)

    def test_sampling_inside_training(self):
        m = model()
        h = at.attach(m, IMG, mode="train", **STREAM)
        add_lora(m)
        train_steps(m, 1)
        with h.sampling():
            self.assertEqual(h.arena.mode, "sample")
            with torch.no_grad():
                out = m(**inputs()).sample
            lora_now = {n: p.detach().clone() for n, p in lora_params(m).items()}
        self.assertEqual(h.arena.mode, "train")
        train_steps(m, 1)
        h.end_step()
        self.assertEqual([r["mode"] for r in h.stats()], ["train", "sample", "train"])
        # the preview equals the plain model with the same adapters, bit for bit
        plain = model(meta=False)
        add_lora(plain)
        plain.load_state_dict(lora_now, strict=False)
        with torch.no_grad():
            self.assertTrue(torch.equal(plain(**inputs()).sample, out))
        h.detach()


class Pieces(unittest.TestCase):
    """piece_size: blocks streamed in pieces, each module acquiring the piece its tensors are in."""

    PIECES = dict(device="sim", headroom=0, reserve=0, keep_last=0, piece_size="4K")

    @classmethod
    def setUpClass(cls):
        with torch.no_grad():
            cls.want = model(meta=False)(**inputs()).sample

    @slow
    def test_sampling_below_the_whole_block_floor(self):
        # Whole blocks need 280.5 KiB; in 4 KiB pieces the model runs in 120 KiB.
        with self.assertRaises(arena.Error) as cm:
            at.attach(model(), IMG, device="sim", sim_capacity="120K", headroom=0, reserve=0, keep_last=0, piece_size=0)
        self.assertEqual(cm.exception.code, "BUDGET")
        for cap in ("120K", "200K", "295K", "16G"):
            m = model()
            # learn=False: the plan is then by bytes, and it moves once, when the
            # order the model runs is learned (step 1); a learned profile's moves
            # come as the machine's timings fall (a loaded CI machine kept moving)
            h = at.attach(m, IMG, sim_capacity=cap, learn=False, **self.PIECES)
            self.assertTrue(any("#" in b.name for b in h.arena.blocks))
            with torch.no_grad():
                for i in range(12):
                    self.assertTrue(torch.equal(m(**inputs()).sample, self.want), cap)
                    h.end_step()
                    st = h.stats()
                    # a plan changed at a step's end (a look at the learned profile, taken
                    # a step after it was made, or room) leaves that step's copies made
                    # under the plan before, and the next step's start with nothing
                    # fetched ahead: the check needs a steady step
                    if i >= 3 and not any(r["demotions"] or r["promotions"] or r["profile_learned"] for r in st[-3:]):
                        break
                self.assertLess(i, 11, "no three steady steps")
            if cap != "16G":
                self.assertGreater(h.plan()["n_streamed"], 0, cap)
                self.assertEqual(st[-1]["misses"], 0, cap)
                # each streamed piece is copied at most once a step once the order is learned
                self.assertLessEqual(st[-1]["copies"], h.plan()["n_streamed"], cap)
            with torch.no_grad():  # a module called on its own, outside its block's call
                q = m.transformer_blocks[0].attn.to_q
                x = torch.randn(2, 32).to(torch.bfloat16)
                self.assertTrue(torch.equal(q(x), torch.nn.functional.linear(
                    x, SD["transformer_blocks.0.attn.to_q.weight"], SD["transformer_blocks.0.attn.to_q.bias"])))
            h.detach()
            self.assertEqual({p.device.type for p in m.parameters()}, {"meta"})

    def test_auto(self):
        """piece_size="auto": pieces where whole blocks stream, whole blocks where all fits."""
        opts = dict(self.PIECES, piece_size="auto")
        for cap, want in (("120K", 8192), ("16G", 0)):
            m = model()
            h = at.attach(m, IMG, sim_capacity=cap, **opts)
            self.assertEqual(h.plan()["piece_size"], want, cap)
            with torch.no_grad():
                self.assertTrue(torch.equal(m(**inputs()).sample, self.want), cap)
            h.detach()
        with self.assertRaisesRegex(ValueError, "piece_size: 'autox' is not a size or 'auto'"):
            arena.open(IMG, device="sim", piece_size="autox")

    @slow
    def test_compiled_blocks(self):
        """Blocks in pieces compiled regionally: a graph break at each bound module, the same
        outputs, no recompiles after the first step."""
        from torch._dynamo.testing import CompileCounterWithBackend

        torch._dynamo.reset()
        cnt = CompileCounterWithBackend("aot_eager")
        m = model()
        h = at.attach(m, IMG, sim_capacity="120K", **self.PIECES)
        for blocks in (m.transformer_blocks, m.single_transformer_blocks):
            for b in blocks:
                b.compile(backend=cnt)
        with torch.no_grad():
            self.assertTrue(torch.equal(m(**inputs()).sample, self.want))
            first = cnt.frame_count
            self.assertGreater(first, 0)
            for _ in range(3):
                self.assertTrue(torch.equal(m(**inputs()).sample, self.want))
        self.assertEqual(cnt.frame_count, first, "no recompiles after the first step")
        h.detach()
        torch._dynamo.reset()

    @slow
    def test_training_through_moves(self):
        """Checkpointed steps in 4 KiB pieces while pieces move: device memory taken
        (pieces leave the device at once) and given back (they return a few steps
        later), and the engine's looks at its learned profile; the ring must hold a
        block's pieces from its recompute to its backward whatever streams (cut to
        the largest piece still streamed after the looks made the largest resident,
        11 pieces held filled it: 'no room' at the fourth step, on this machine every
        time; the planner's side: engine_plan/min_slot_in_train). Every step equals
        the plain model's, bit for bit."""
        for learn in (False, True):
            with self.subTest(learn=learn):
                self._train_through_moves(learn)

    def _train_through_moves(self, learn: bool) -> None:
        def run(mm, pressure=None):
            """12 steps in three runs of train_steps (3, 3, 6); `pressure` (when given)
            takes device memory after the first run and gives it back after the second."""
            losses = []
            for n, taken in ((3, "30K"), (3, 0), (6, None)):
                got, grads, after = train_steps(mm, n)
                losses += got
                if pressure and taken is not None:
                    pressure(taken)
            return losses, grads, after

        m0 = model(meta=False)
        add_lora(m0)
        want = run(m0)
        m = model()
        # 40 KiB kept free (headroom): memory taken from the device below that
        # demotes pieces at once, given back it promotes them after a few steps
        h = at.attach(m, IMG, mode="train", sim_capacity="240K" if not learn else "200K", depth=7, learn=learn,
                      **dict(self.PIECES, piece_size="4K", headroom="40K" if not learn else 0))
        add_lora(m)

        def pressure(nbytes) -> None:
            h.end_step()
            h.arena.sim_pressure(nbytes)

        losses, grads, after = run(m, None if learn else pressure)
        same_step(self, (losses, grads, after), want, "")
        st = h.stats()
        if not learn:  # (a learned profile's moves come as the machine's timings fall)
            self.assertGreater(sum(r["demotions"] for r in st), 0, "pieces left the device")
            self.assertGreater(sum(r["promotions"] for r in st), 0, "and came back")
        h.detach()

    @slow
    def test_first_steps_copy_little_more_than_later_ones(self):
        # The engine's first schedule in a mode is the pieces in their numbers'
        # order; modules acquire theirs in call order, so the first step misses
        # nearly every acquire. Prefetch ramps up after a miss instead of
        # refilling the ring (the first step copied 7 x a later one's bytes).
        for mode, cap in (("sample", "150K"), ("train", "200K")):
            m = model()
            h = at.attach(m, IMG, mode=mode, sim_capacity=cap, learn=False, **self.PIECES)
            if mode == "train":
                add_lora(m)
                train_steps(m, 5)
            else:
                with torch.no_grad():
                    for s in range(5):
                        m(**inputs(s))
            h.end_step()
            st = h.stats()
            self.assertGreater(st[0]["misses"], 10, f"{mode}: the first step's order is not the schedule's")
            later = max(r["moved_bytes"] for r in st[2:])
            self.assertEqual([r["misses"] for r in st[2:]], [0] * len(st[2:]), mode)
            self.assertLessEqual(st[0]["moved_bytes"], 2 * later,
                                 f"{mode}: first step {st[0]['moved_bytes']} bytes, later ones at most {later}")
            h.detach()

    def test_training_equals_plain(self):
        m0 = model(meta=False)
        add_lora(m0)
        want = train_steps(m0)
        m = model()
        # A recompute holds a block's pieces until its backward: the ring must hold a
        # block; a depth chosen too small is refused, saying what is enough.
        with self.assertRaises(arena.Error) as cm:
            at.attach(m, IMG, mode="train", sim_capacity="200K", depth=2, **self.PIECES)
        self.assertEqual(cm.exception.code, "USAGE")
        # (the ring's slot is the largest piece: 12800 bytes; 7 + 1 of them hold
        # the 78848-byte block and one piece more)
        self.assertIn("give depth 7 or more", cm.exception.message)
        self.assertNotIn("\n", cm.exception.message)
        h = at.attach(m, IMG, mode="train", sim_capacity="200K", **self.PIECES)  # the depth that holds one
        self.assertGreater(h.plan()["n_streamed"], 0)
        pl = h.plan()
        block = max(sum(b.nbytes for b in h.arena.blocks if b.name.startswith(n + "#")) for n in
                    {b.name.partition("#")[0] for b in h.arena.blocks if "#" in b.name})
        self.assertGreaterEqual(pl["slots"] * pl["slot_bytes"], block + pl["slot_bytes"])
        add_lora(m)
        losses, grads, after = train_steps(m)
        same_step(self, (losses, grads, after), want)
        with h.sampling(), torch.no_grad():
            ref = m0(**inputs(5)).sample
            self.assertTrue(torch.equal(m(**inputs(5)).sample, ref))
        h.detach()

    def test_training_an_output_the_loss_does_not_use(self):
        """Qwen-Image's last block makes a text stream's output that the model drops, so
        the backward runs none of that path's nodes: the block's backward is done without
        them, and the modules there (its text MLP, the text attention's output) never run
        theirs. Their pieces go in the backward all the same: held to the step's end, they
        filled a ring of the rule's size (a block's pieces and one more) at the recompute
        of a block before it ('blocks held fill the ring', USAGE, at caps the plan
        accepted). Checkpointed LoRA steps at such rings equal the plain model's, bit for
        bit, and every piece a backward acquires is released in it."""
        from diffusers import QwenImageTransformer2DModel

        cfg = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=3, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(4, 6, 6))

        def qwen(meta: bool) -> QwenImageTransformer2DModel:
            torch.manual_seed(0)
            with torch.device("meta" if meta else "cpu"):
                m = QwenImageTransformer2DModel(**cfg).to(torch.bfloat16)
            m.requires_grad_(False)
            return m

        def steps(m, during_backward=None):
            m.enable_gradient_checkpointing()
            m.train()
            ps = lora_params(m)
            opt = torch.optim.AdamW(ps.values(), lr=1e-3)
            losses, grads = [], {}
            for s in range(2):
                g = torch.Generator().manual_seed(s)
                x = dict(hidden_states=torch.randn(1, 16, 16, generator=g).to(torch.bfloat16),
                         encoder_hidden_states=torch.randn(1, 5, 16, generator=g).to(torch.bfloat16),
                         timestep=torch.tensor([0.5], dtype=torch.bfloat16), encoder_hidden_states_mask=None,
                         img_shapes=[[(1, 4, 4)]], return_dict=False)
                opt.zero_grad(set_to_none=True)
                loss = m(**x)[0].float().square().mean()
                with during_backward() if during_backward else contextlib.nullcontext():
                    loss.backward()
                losses.append(loss.item())
                grads = {n: p.grad.clone() for n, p in ps.items()}
                opt.step()
            return losses, grads, {n: p.detach().clone() for n, p in ps.items()}

        m0 = qwen(False)
        img = os.path.join(TMP, "tiny_qwen_image.arena")
        at.save_image(m0, img)
        add_lora(m0)
        want = steps(m0)
        for piece, cap in (("8K", "130K"), ("24K", "150K")):
            with self.subTest(piece_size=piece, cap=cap):
                m = qwen(True)
                opts = dict(self.PIECES, piece_size=piece)  # the rule's ring: a block's pieces and one more
                h = at.attach(m, img, mode="train", sim_capacity=cap, learn=False, **opts)
                pl = h.plan()
                self.assertGreater(pl["n_streamed"], 0)
                add_lora(m)
                held: set = set()
                left: list = []
                acq, rel = h.arena._acquire_unchecked, h.arena._release_unchecked

                def acquire(i, stream):
                    held.add(i)
                    return acq(i, stream)

                def release(i, stream):
                    held.discard(i)
                    return rel(i, stream)

                @contextlib.contextmanager
                def counted():
                    held.clear()
                    yield
                    left.append(sorted(h.arena.blocks[i].name for i in held))

                h.arena._acquire_unchecked, h.arena._release_unchecked = acquire, release
                try:
                    got = steps(m, counted)
                finally:
                    h.arena._acquire_unchecked, h.arena._release_unchecked = acq, rel
                same_step(self, got, want)
                self.assertEqual(left, [[], []], "pieces a backward acquired and left held")
                h.detach()


class Coded(unittest.TestCase):
    """Coded streaming: an hb4 image's streamed pieces stay coded in host memory, move
    coded and are decoded by the device; outputs and LoRA gradients equal the plain
    model's bit for bit, with fewer bytes moved than streamed."""

    PIECES = dict(device="sim", headroom=0, reserve=0, keep_last=0, piece_size="16K")

    @classmethod
    def setUpClass(cls):
        cls.img = os.path.join(TMP, "tiny_flux_hb4.arena")
        subprocess.run([ARENA_BIN, "convert", "-q", "--codec", "hb4", "--chunk-size", "64K",
                        os.path.join(FIX, "tiny_flux.safetensors"), "-o", cls.img], check=True)
        # stages and segments sized for a 300 KiB model (the defaults are for real ones)
        os.environ["ARENA_WIRE_POOL"], os.environ["ARENA_WIRE_SEGMENT"] = "16K", "4K"

    @classmethod
    def tearDownClass(cls):
        del os.environ["ARENA_WIRE_POOL"], os.environ["ARENA_WIRE_SEGMENT"]

    def test_sampling_equals_plain(self):
        with torch.no_grad():
            want = model(meta=False)(**inputs()).sample
        m = model()
        h = at.attach(m, self.img, sim_capacity="200K", **self.PIECES)
        self.assertGreater(h.plan()["n_streamed"], 0)
        self.assertLess(h.plan()["host_bytes"], h.plan()["streamed_block_bytes"], "host copies are coded")
        with torch.no_grad():
            for _ in range(3):
                self.assertTrue(torch.equal(m(**inputs()).sample, want))
        h.end_step()
        st = h.stats()[-1]
        self.assertGreater(st["streamed_bytes"], 0)
        self.assertLess(st["moved_bytes"], st["streamed_bytes"] * 0.9)
        h.detach()

    def test_tensors_of_coded_blocks(self):
        """tensors() views raw bytes: a block held coded is refused, saying what to do;
        plain_stream=True keeps raw host copies, and the views hold the weights."""
        opts = dict(self.PIECES, sim_capacity="200K")
        with arena.open(self.img, **opts) as a:
            coded = [b.name for b in a.blocks if a.coded(b.index)]
            self.assertTrue(coded)
            with self.assertRaises(arena.Error) as cm:
                a.tensors()
            self.assertEqual(cm.exception.code, "USAGE")
            self.assertIn("held coded (hb4)", cm.exception.message)
            self.assertIn("plain_stream=True", cm.exception.message)
        with arena.open(self.img, plain_stream=True, **opts) as a:
            self.assertFalse(any(a.coded(b.index) for b in a.blocks))
            sd = a.tensors()
            self.assertEqual(set(sd), set(SD))
            for k, v in SD.items():
                self.assertTrue(torch.equal(sd[k].cpu(), v), k)

    def test_training_equals_plain(self):
        m0 = model(meta=False)
        add_lora(m0)
        want = train_steps(m0)
        m = model()
        h = at.attach(m, self.img, mode="train", sim_capacity="220K", **self.PIECES)
        self.assertGreater(h.plan()["n_streamed"], 0)
        add_lora(m)
        losses, grads, after = train_steps(m)
        same_step(self, (losses, grads, after), want)
        st = h.stats()[-1]
        self.assertLess(st["moved_bytes"], st["streamed_bytes"])
        h.detach()


def int4_values(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, shape, group: int) -> torch.Tensor:
    """An int4-gN tensor's values in f32 from its components, the torch way: codes two
    a byte (even column low nibble), (q - z) x scale per group of `group` columns."""
    rows = shape[0] if len(shape) >= 2 else 1
    cols = 1
    for d in shape:
        cols *= d
    cols //= rows
    codes = torch.stack([q & 15, q >> 4], dim=-1).reshape(rows, -1)[:, :cols].float()
    g = torch.arange(cols) // group
    return ((codes - zero.float()[:, g]) * scale.float()[:, g]).reshape(shape)


class Quantized(unittest.TestCase):
    """Images converted with --quant: each block tensor stored quantized is dequantized
    to its original dtype when its block is bound (qdata x scale in f32, rounded once:
    docs/QUANT.md) and let go when the block is released. Outputs and LoRA gradients
    equal those of the plain model holding the same dequantized weights, bit for bit,
    resident and streamed, in whole blocks and in pieces."""

    SCHEMES = ("fp8-e4m3-row", "fp8-e4m3-tensor", "fp8-e4m3", "fp8-e5m2", "int8-row")
    INT4 = ("int4-g32", "int4-g64", "int4-g128")  # (value = (q - z) x scale: docs/QUANT.md)
    # the images are ~183 KiB: whole blocks stream with a ring of two slots
    STREAM = dict(device="sim", sim_capacity="150K", headroom=0, reserve=0, keep_last=0, depth=1, piece_size=0)
    PIECES = dict(device="sim", sim_capacity="120K", headroom=0, reserve=0, keep_last=0, piece_size="16K")

    @classmethod
    def setUpClass(cls):
        with torch.no_grad():
            cls.unquantized = model(meta=False)(**inputs()).sample

    @staticmethod
    def image(scheme: str, *extra: str) -> str:
        path = os.path.join(TMP, f"tiny_flux_{scheme}{''.join(extra)}.arena")
        if not os.path.exists(path):
            subprocess.run([ARENA_BIN, "convert", "-q", "--quant", scheme, *extra,
                            os.path.join(FIX, "tiny_flux.safetensors"), "-o", path], check=True)
        return path

    @staticmethod
    def plain(path: str) -> FluxTransformer2DModel:
        """The plain model with the image's weights, dequantized the reference way."""
        with arena.open(path, device="sim", sim_capacity="16G") as a:
            sd = {}
            for name in a.tensor_names():
                info = a.tensor_info(name)
                ts = a.tensors()
                q = ts[name].clone()
                if info.scheme == "none":
                    sd[name] = q
                    continue
                dt = arena.torch_dtype(info.dtype)
                scale = ts.get(name + "_scale")
                if info.scheme.startswith("int4-"):
                    sd[name] = int4_values(q, scale, ts[name + "_zero"], info.shape, int(info.scheme[6:])).to(dt)
                    continue
                v = q.float() * scale if scale is not None else q.float()
                sd[name] = v.to(dt)
        with torch.device("meta"):
            m = FluxTransformer2DModel(**CFG).to(torch.bfloat16)
        m.load_state_dict(sd, assign=True)
        m.requires_grad_(False)
        return m

    @slow
    def test_sampling_equals_plain(self):
        for scheme in self.SCHEMES + self.INT4:
            path = self.image(scheme)
            with torch.no_grad():
                want = self.plain(path)(**inputs()).sample
            self.assertFalse(torch.equal(want, self.unquantized), "the scheme changes the weights")
            # int4 images are ~148 KiB, whole blocks stream from 110.5 KiB
            stream = dict(self.STREAM, sim_capacity="120K") if scheme in self.INT4 else self.STREAM
            for opts in (RESIDENT, stream, self.PIECES):
                with self.subTest(scheme=scheme, opts=opts):
                    m = model()
                    h = at.attach(m, path, **opts)
                    with torch.no_grad():
                        for _ in range(2):
                            self.assertTrue(torch.equal(m(**inputs()).sample, want))
                    # between calls, no block holds its dequantized copy
                    w = m.transformer_blocks[0].attn.to_q.weight
                    self.assertEqual((w.dtype, tuple(w.shape)), (torch.bfloat16, (32, 32)))
                    self.assertEqual(w.untyped_storage().nbytes(), 2, "a placeholder, not a copy")
                    if opts is not RESIDENT:
                        self.assertGreater(h.plan()["n_streamed"], 0)
                    h.detach()

    @slow
    def test_inference_mode_and_compiled_blocks(self):
        """Under torch.inference_mode() (the dequantized tensors are made outside it), and
        with every block compiled (fullgraph): the plain model's outputs, no recompiles
        after the first step."""
        path = self.image("fp8-e4m3-row")
        with torch.no_grad():
            want = self.plain(path)(**inputs()).sample
        m = model()
        h = at.attach(m, path, **self.STREAM)
        with torch.inference_mode():
            for _ in range(2):
                self.assertTrue(torch.equal(m(**inputs()).sample, want))
        compiled_steps(self, m, h, want)

    def test_a_failed_dequantization_leaves_no_copies(self):
        """The library refusing the third tensor of a block: the error reaches the caller,
        the block is released and the two tensors already dequantized are let go too."""
        m = model()
        h = at.attach(m, self.image("fp8-e4m3-row"), **self.STREAM)
        real, calls = h.arena._dequantize, [0]

        def third_fails(*args):
            calls[0] += 1
            if calls[0] == 3:
                raise arena.Error("DEV_ERROR", "injected")
            real(*args)

        h.arena._dequantize = third_fails
        with self.assertRaises(arena.Error) as cm, torch.no_grad():
            m(**inputs())
        self.assertEqual(cm.exception.message, "injected")
        held = [n for n, p in m.named_parameters() if p.untyped_storage().nbytes() > 2 and p.dtype == torch.bfloat16
                and h.arena.tensor_info(n).scheme != "none"]
        self.assertEqual(held, [], "no dequantized copy left bound")
        h.arena._dequantize = real
        h.detach()

    def test_quantized_globals(self):
        path = self.image("fp8-e4m3-row", "--quant-include", "x_embedder.weight")
        with arena.open(path, device="sim", sim_capacity="16G") as a:
            self.assertEqual(a.tensor_info("x_embedder.weight").scheme, "fp8-e4m3-row")
        with torch.no_grad():
            want = self.plain(path)(**inputs()).sample
        m = model()
        h = at.attach(m, path, **self.STREAM)
        with torch.no_grad():
            self.assertTrue(torch.equal(m(**inputs()).sample, want))
        h.detach()

    @slow
    def test_training_equals_plain(self):
        """Training holds a recomputed block until its backward: the ring needs three
        slots, which stream nothing with this tiny model's quantized blocks alone; its
        double blocks are quantized here, the single ones stored as they are."""
        for scheme in ("fp8-e4m3-row", "int8-row", "int4-g32"):
            path = self.image(scheme, "--quant-exclude", "single_transformer_blocks.*")
            m0 = self.plain(path)
            add_lora(m0)
            want = train_steps(m0)
            for opts in (RESIDENT, dict(self.STREAM, sim_capacity="200K", depth=2), self.PIECES,
                         dict(self.PIECES, offload_saved=1)):
                with self.subTest(scheme=scheme, opts=opts):
                    m = model()
                    h = at.attach(m, path, mode="train", **opts)
                    if opts is not RESIDENT:
                        self.assertGreater(h.plan()["n_streamed"], 0)
                    add_lora(m)
                    losses, grads, after = train_steps(m)
                    same_step(self, (losses, grads, after), want)
                    h.detach()

    @slow
    def test_fp8_weights_bound_as_fp8(self):
        """fp8_compute=True: an fp8-e4m3 image's Linear weights are bound as FP8 weights
        (arena's Fp8Weight: qdata and scale viewing the block's bytes, no copy at bind);
        without FP8 matmuls (the CPU) each product dequantizes for itself: outputs and
        LoRA gradients are the dequantized path's bit for bit. "auto" on sim and False
        dequantize at each bind as before."""
        from arena_gpu.torch import _fp8
        from arena_gpu.torch._fp8 import Fp8Weight, device_has_fp8

        self.assertFalse(device_has_fp8(torch.device("cpu")))
        for scheme in ("fp8-e4m3-row", "fp8-e4m3-tensor", "fp8-e4m3"):
            path = self.image(scheme)
            with torch.no_grad():
                want = self.plain(path)(**inputs()).sample
            for opts in (self.STREAM, self.PIECES):
                with self.subTest(scheme=scheme, pieces=opts["piece_size"]):
                    m = model()
                    h = at.attach(m, path, fp8_compute=True, **opts)
                    self.assertGreater(h.plan()["n_streamed"], 0)
                    w = m.transformer_blocks[0].attn.to_q.weight
                    self.assertIsInstance(w, Fp8Weight)
                    self.assertEqual((w.dtype, tuple(w.shape), w.native), (torch.bfloat16, (32, 32), False))
                    with torch.no_grad():
                        for _ in range(2):
                            self.assertTrue(torch.equal(m(**inputs()).sample, want))
                    slabs = {b.nbytes for b in h.arena.blocks}
                    self.assertIn(w.qdata.untyped_storage().nbytes(), slabs, "a view of the block, not a copy")
                    # each product dequantizes by arena's kernel from where qdata's block
                    # is bound (src: the tensor's C index and qdata's offset in its unit),
                    # the outputs above bit for bit; an address that is not the block's
                    # is the library's USAGE, not other bytes read
                    self.assertEqual(w.src[1], h.arena.tensor_index("transformer_blocks.0.attn.to_q.weight"))
                    seen: list[bool] = []

                    def probe(mod: object, args: object, w: Fp8Weight = w) -> None:
                        ar, index, off = w.src
                        ok = _fp8.dequantize_bound(w.qdata, w.scale, w.dtype, w.src)
                        seen.append(torch.equal(ok, _fp8.dequantize(w.qdata, w.scale, w.dtype)))
                        with self.assertRaises(arena.Error) as e:
                            _fp8.dequantize_bound(w.qdata, w.scale, w.dtype, (ar, index, off + 16))
                        seen.append(e.exception.code == "USAGE" and "is not the address of block" in str(e.exception))

                    hk = m.transformer_blocks[0].attn.to_q.register_forward_pre_hook(probe)
                    with torch.no_grad():
                        m(**inputs())
                    hk.remove()
                    self.assertEqual(seen, [True, True])
                    self.assertEqual(w.qdata.dtype, torch.float8_e4m3fn)
                    h.detach()
            for mode in (False, "auto"):
                m = model()
                h = at.attach(m, path, fp8_compute=mode, **self.STREAM)
                self.assertNotIsInstance(m.transformer_blocks[0].attn.to_q.weight, Fp8Weight)
                h.detach()
        # training through the FP8 weights: the dequantized path's gradients
        path = self.image("fp8-e4m3-row", "--quant-exclude", "single_transformer_blocks.*")
        m0 = self.plain(path)
        add_lora(m0)
        want = train_steps(m0)
        for opts in (RESIDENT, dict(self.STREAM, sim_capacity="200K", depth=2), self.PIECES):
            with self.subTest(train=opts):
                m = model()
                h = at.attach(m, path, mode="train", fp8_compute=True, **opts)
                add_lora(m)
                same_step(self, train_steps(m), want)
                h.detach()
        with self.assertRaises(ValueError):
            at.attach(model(), path, fp8_compute="yes", **RESIDENT)

    @slow
    def test_native_fp8_training_streamed(self):
        """LoRA training through native FP8 products, checkpointed and not, the input's
        gradient an FP8 product (the default) and with the weight dequantized for it, the
        device's FP8 matmuls stood in for (device_has_fp8 true; torch._scaled_mm by f32
        arithmetic on the operands it is given): streamed and in pieces, where a block's
        address at its backward is not the one its forward saw, the losses, gradients and
        LoRA weights after are the resident attach's bit for bit and every Linear of the
        quantized blocks went through the FP8 product, forward and (the FP8 gradient)
        backward (the backward's weight is the binding current then: arena's kernel
        refuses another address; a stale FP8 operand would change the bits)."""
        from arena_gpu.torch import _fp8

        calls = [0]
        path = self.image("fp8-e4m3-row", "--quant-exclude", "single_transformer_blocks.*")
        by_grad = {}
        with fp8_matmul_stood_in(calls):
            for fp8g in (True, False):
                for ckpt in (True, False):
                    want = None
                    for opts in (RESIDENT, dict(self.STREAM, sim_capacity="200K", depth=2), self.PIECES):
                        with self.subTest(grad_fp8=fp8g, checkpointing=ckpt, opts=opts), grad_fp8(fp8g):
                            m = model()
                            h = at.attach(m, path, mode="train", fp8_compute=True, **opts)
                            if opts is not RESIDENT:
                                self.assertGreater(h.plan()["n_streamed"], 0)
                            self.assertTrue(m.transformer_blocks[0].attn.to_q.weight._native_here)
                            add_lora(m)
                            calls[0] = 0
                            bwd = [0]
                            real = _fp8.scaled_grad_input

                            def counted(*a):
                                bwd[0] += 1
                                return real(*a)

                            _fp8.scaled_grad_input = counted
                            try:
                                got = train_steps(m, checkpointing=ckpt)
                            finally:
                                _fp8.scaled_grad_input = real
                            # 2 steps, a forward (and with checkpointing its recompute) of
                            # every quantized Linear of the double blocks, and with the FP8
                            # gradient one product for each input's gradient
                            n = sum(1 for mod in m.transformer_blocks.modules()
                                    if isinstance(mod, torch.nn.Linear) and isinstance(mod.weight, _fp8.Fp8Weight))
                            if fp8g:
                                self.assertGreater(bwd[0], 0)
                            else:
                                self.assertEqual(bwd[0], 0)
                            self.assertEqual(calls[0], 2 * n * (2 if ckpt else 1) + bwd[0])
                            if want is None:
                                want = got
                                by_grad[fp8g, ckpt] = got
                            else:
                                same_step(self, got, want, "native: the resident attach's, bit for bit")
                            h.detach()
        # the FP8 gradient is another product: the LoRA weights after differ
        self.assertNotEqual(same(by_grad[True, True][2], by_grad[False, True][2]), [])

    def test_native_product_saves_the_bytes_it_needs(self):
        """A native product through a weight bound to an arena's block saves, with the
        input's gradient dequantized, that weight's qdata only (arena's kernel
        dequantizes it for the backward from the block, scales and all); a weight not
        bound to one saves its scale too, for torch's dequantization; the input's
        gradient is then the product with the dequantized weight. With the FP8 gradient
        (the default) every weight saves qdata and scale, and the input's gradient is
        scaled_grad_input's."""
        from arena_gpu.torch import _fp8

        path = self.image("fp8-e4m3-row", "--quant-exclude", "single_transformer_blocks.*")
        with fp8_matmul_stood_in():
            m = model()
            h = at.attach(m, path, mode="train", fp8_compute=True, **RESIDENT)
            with torch.no_grad():  # a step: all resident, the blocks stay bound (read outside their calls)
                m(**inputs())
            bound = m.transformer_blocks[0].attn.to_q.weight
            self.assertIsNotNone(bound.src)
            loose = _fp8.Fp8Weight(bound.qdata.clone(), bound.scale.clone(), torch.bfloat16, True)
            for fp8g in (False, True):
                for w in (bound, loose):
                    want = [w.qdata] if w is bound and not fp8g else [w.qdata, w.scale]
                    with self.subTest(bound=w is bound, grad_fp8=fp8g), grad_fp8(fp8g):
                        x = torch.randn(1, 5, w.shape[1], dtype=torch.bfloat16, requires_grad=True)
                        packed: list = []
                        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
                            y = torch.nn.functional.linear(x, w)
                        self.assertEqual(len(packed), len(want))
                        for got, t in zip(packed, want):
                            self.assertEqual((got.data_ptr(), got.shape, got.dtype), (t.data_ptr(), t.shape, t.dtype))
                        g = torch.randn_like(y)
                        (gx,) = torch.autograd.grad(y, x, g)
                        gw = _fp8.scaled_grad_input(g, w.qdata, w.scale, torch.bfloat16) if fp8g else \
                            g.matmul(_fp8.dequantize(w.qdata, w.scale, torch.bfloat16))
                        self.assertTrue(torch.equal(gx, gw))
            h.detach()

    def test_saved_inner_tensors_are_references(self):
        """A streamed block's saved-tensor hooks (outside checkpointing) keep a saved inner
        tensor of a bound tensor subclass, or a view of one, as a reference to its unit
        (found by its bytes: its addresses inside the inner tensor's), a view in
        another dtype as a copy of its values now, and anything else as it is."""
        from arena_gpu.torch import _blocks, _fp8, _quant

        slab = torch.arange(256, dtype=torch.uint8)  # a unit's bytes: two weights' qdata
        q0 = slab[:96].view(torch.float8_e4m3fn).view(6, 16)
        q1 = slab[96:192].view(torch.float8_e4m3fn).view(6, 16)
        w0 = _fp8.Fp8Weight(q0, None, torch.bfloat16, False)

        class Unit:
            weights = [_quant.InnerRef(w0, "qdata", None)]

        unit = Unit()
        sw = _blocks._SavedWeights([unit], "block")  # type: ignore[list-item]
        for t in (q0, q0[2:4], q0.t()):
            ref = sw.pack(t)
            self.assertIsInstance(ref, _blocks._WeightRef)
            self.assertIs(ref.unit, unit)
            d = ref.param.data
            got = d.as_strided(ref.size, ref.stride, d.storage_offset() + ref.offset)
            self.assertTrue(torch.equal(got.view(torch.uint8), t.view(torch.uint8)))
        v = q0.view(torch.uint8)  # another dtype: its values, in memory of its own
        c = sw.pack(v)
        self.assertNotIsInstance(c, _blocks._WeightRef)
        self.assertTrue(torch.equal(c, v) and c.untyped_storage().data_ptr() != slab.untyped_storage().data_ptr())
        for other in (q1, torch.zeros(3)):  # the slab's other weight (not bound here), another tensor
            self.assertIs(sw.pack(other), other)

    def test_fp8_auto_is_native_on_fp8_gpus(self):
        """fp8_compute="auto" chooses FP8 products on a device with FP8 matmuls, in
        sampling and training alike, and the dequantized path without them (the rule
        _quant.fp8_auto_native; the device's capability stood in for, the CPU has none)."""
        from arena_gpu.torch import _fp8, _quant

        path = self.image("fp8-e4m3-row")
        real = _fp8.device_has_fp8
        for mode in ("sample", "train"):
            m = model()
            h = at.attach(m, path, mode=mode, **dict(self.STREAM, sim_capacity="200K", depth=2))
            self.assertFalse(_quant.fp8_auto_native(h), "the CPU has no FP8 matmuls")
            try:
                _fp8.device_has_fp8 = lambda d: True
                self.assertTrue(_quant.fp8_auto_native(h), mode)
            finally:
                _fp8.device_has_fp8 = real
            h.detach()

    def test_fp8_rows_one_pass(self):
        """arena_fp8_quantize_rows (the native product's input quantization in one pass;
        the CUDA kernel shares its element rules) gives torch's ops' bytes: scales and
        FP8 codes bit for bit, rows of every magnitude, zeros (the 1e-12 floor),
        subnormal results, exact halves, the saturation edge, an infinity and a NaN, odd
        lengths; refusals name what is wrong."""
        from arena_gpu.torch._fp8 import quantize_rows_torch

        g = torch.Generator().manual_seed(5)
        with arena.open(self.image("fp8-e4m3-row"), **self.STREAM) as a:
            for rows, cols in ((16, 64), (5, 40), (3, 7), (1, 1), (0, 8)):
                x = (torch.randn(rows, cols, generator=g) * torch.logspace(-30, 30, max(rows, 1))[:rows, None])
                x = x.to(torch.bfloat16)
                if rows >= 5:
                    x[1] = 0
                    x[2, 0] = float("inf")
                    x[3, cols // 2] = float("nan")
                    x[4, :4] = torch.tensor([448.0, -448.0, 2 ** -9 * 1.5, 3.0])[: min(4, cols)]
                q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
                s = torch.empty(rows, 1, dtype=torch.float32)
                a.fp8_quantize_rows(x, q, s)
                wq, ws = quantize_rows_torch(x)
                self.assertTrue(torch.equal(s.view(torch.int32), ws.view(torch.int32)), (rows, cols))
                self.assertTrue(torch.equal(q.view(torch.uint8), wq.view(torch.uint8)), (rows, cols))
                # with column scales (the FP8 backward's gradient times a weight's row
                # scales): the product in f32, then the same rule
                cs = torch.rand(cols, generator=g) * torch.logspace(-6, 3, max(cols, 1))[:cols]
                if cols > 2:
                    cs[1] = 0
                a.fp8_quantize_rows(x, q, s, col_scale=cs)
                wq, ws = quantize_rows_torch(x, cs)
                self.assertTrue(torch.equal(s.view(torch.int32), ws.view(torch.int32)), ("col", rows, cols))
                self.assertTrue(torch.equal(q.view(torch.uint8), wq.view(torch.uint8)), ("col", rows, cols))
            x = torch.zeros(4, 8, dtype=torch.bfloat16)
            for bad in (dict(x=x.float()), dict(q=torch.empty(4, 8, dtype=torch.uint8)),
                        dict(scale=torch.empty(4, dtype=torch.float32)), dict(x=x.t()),
                        dict(col_scale=torch.ones(4)), dict(col_scale=torch.ones(8, dtype=torch.float64))):
                args = dict(x=x, q=torch.empty(4, 8, dtype=torch.float8_e4m3fn),
                            scale=torch.empty(4, 1, dtype=torch.float32), col_scale=None)
                args.update(bad)
                with self.assertRaisesRegex(arena.Error, "fp8_quantize_rows: x, q, scale and col_scale must be"):
                    a.fp8_quantize_rows(args["x"], args["q"], args["scale"], col_scale=args["col_scale"])

    def test_fp8_transpose_one_pass(self):
        """arena_fp8_transpose (the FP8 input gradient's weight operand, [K, N] rows of
        the weight's [N, K] bytes) gives torch's t().contiguous() byte for byte for every
        shape (odd sides, one row or column, multiples of 16, none), FP8 and uint8 alike;
        refusals name what is wrong."""
        g = torch.Generator().manual_seed(7)
        with arena.open(self.image("fp8-e4m3-row"), **self.STREAM) as a:
            for rows, cols in ((32, 48), (5, 40), (3, 7), (1, 9), (9, 1), (0, 8)):
                x = torch.randint(0, 256, (rows, cols), generator=g, dtype=torch.uint8)
                for dt in (torch.uint8, torch.float8_e4m3fn):
                    t = torch.full((cols, rows), 0xA5, dtype=torch.uint8).view(dt)
                    a.fp8_transpose(x.view(dt), t)
                    self.assertTrue(torch.equal(t.view(torch.uint8), x.t().contiguous()), (rows, cols, dt))
            x = torch.zeros(4, 8, dtype=torch.float8_e4m3fn)
            for bad in (dict(x=x.view(torch.uint8)), dict(t=torch.empty(4, 8, dtype=torch.float8_e4m3fn)),
                        dict(x=torch.zeros(4, 8, dtype=torch.bfloat16), t=torch.empty(8, 4, dtype=torch.bfloat16)),
                        dict(x=torch.zeros(8, 4, dtype=torch.float8_e4m3fn).t()),
                        dict(x=torch.zeros(32, dtype=torch.float8_e4m3fn))):
                args = dict(x=x, t=torch.empty(8, 4, dtype=torch.float8_e4m3fn))
                args.update(bad)
                with self.assertRaisesRegex(arena.Error, "fp8_transpose: x and t must be"):
                    a.fp8_transpose(args["x"], args["t"])

    def test_native_fp8_product(self):
        """The native path's arithmetic, checked where it can run here: the input quantized
        per row as arena's fp8-e4m3-row (amax / 448, floor 1e-12), and the product
        _scaled_mm computes, against f32 arithmetic on the same FP8 values, and the input's
        gradient (W dequantized). torch's _scaled_mm on the CPU takes only scales of one
        element, so here the call runs on one output row and column; the shapes of a model
        run on the GPU only (bench/gpu_fp8_check.py)."""
        from arena_gpu.torch._fp8 import quantize_rows

        g = torch.Generator().manual_seed(3)
        x = (torch.randn(8, 64, generator=g) * torch.logspace(-3, 2, 8)[:, None]).to(torch.bfloat16)
        x[3] = 0
        q, s = quantize_rows(x)
        self.assertEqual((q.dtype, s.shape, s.dtype), (torch.float8_e4m3fn, (8, 1), torch.float32))
        self.assertEqual(s[3].item(), torch.tensor(1e-12).item(), "a row of zeros: the floor")
        want_s = (x.float().abs().amax(1, keepdim=True) / 448).clamp(min=1e-12)
        self.assertTrue(torch.equal(s, want_s))
        self.assertTrue(torch.equal(q, (x.float() / want_s).clamp(-448, 448).to(torch.float8_e4m3fn)))
        err = ((q.float() * s) - x.float()).abs().max() / x.float().abs().max()
        self.assertLess(err.item(), 2 ** -4, "FP8 e4m3 keeps 3 mantissa bits")
        # the call itself where the CPU's _scaled_mm takes it (one output row and column:
        # both scales have one element): operands, scales and bias as the GPU gets them
        from arena_gpu.torch._fp8 import _ScaledLinear, dequantize, native_args, scaled_linear

        w = torch.randn(1, 64, generator=g) * 0.02
        ws = (w.abs().amax(1, keepdim=True) / 448).clamp(min=1e-12)
        wq = (w / ws).clamp(-448, 448).to(torch.float8_e4m3fn)
        b = torch.tensor([0.25]).to(torch.bfloat16)
        for row in range(8):
            xr = x[row:row + 1].clone().requires_grad_(True)
            with grad_fp8(False):  # (the FP8 gradient's product: test_native_fp8_grad)
                y = _ScaledLinear.apply(xr, b, None, None, native_args(wq, ws, torch.bfloat16))
            xq, xs = quantize_rows(x[row:row + 1])
            want = (xq.float() * xs) @ (wq.float() * ws).t() + b.float()
            self.assertEqual(y.dtype, torch.bfloat16)
            self.assertLessEqual((y.float() - want).abs().item(), want.abs().item() * 2 ** -8 + 1e-30, row)
            self.assertTrue(torch.equal(y, scaled_linear(x[row:row + 1], wq, ws, b, torch.bfloat16)))
            go = torch.tensor([[1.5]]).to(torch.bfloat16)
            y.backward(go)
            self.assertTrue(torch.equal(xr.grad, go.matmul(dequantize(wq, ws, torch.bfloat16))), "grad: W dequantized")

    def test_dequantize_fast(self):
        """The native backward's dequantization in fewer passes (_fp8.dequantize_fast):
        bit for bit dequantize's (f32 product, rounded once) for row scales, one scale
        and none, whichever way torch takes here, the way learned once and kept, and
        dequantize's own where torch takes neither."""
        from arena_gpu.torch import _fp8

        g = torch.Generator().manual_seed(5)
        w = torch.randn(40, 24, generator=g) * torch.logspace(-4, 2, 40)[:, None]
        rows = (w.abs().amax(1, keepdim=True) / 448).clamp(min=1e-12)
        one = (w.abs().amax() / 448).reshape(1)
        saved = dict(_fp8._DEQ_WAY)
        try:
            for forced in (None, 2, 1, 0):
                _fp8._DEQ_WAY.clear()
                if forced is not None:
                    _fp8._DEQ_WAY["cpu"] = forced
                for s in (rows, one, None):
                    q = (w / (s if s is not None else 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
                    for dtype in (torch.bfloat16, torch.float16, torch.float32):
                        want = _fp8.dequantize(q, s, dtype)
                        got = _fp8.dequantize_fast(q, s, dtype)  # a way torch does not take: dequantize's
                        self.assertEqual(got.dtype, dtype)
                        self.assertTrue(torch.equal(got.view(torch.uint8), want.view(torch.uint8)),
                                        (forced, s is None, dtype))
                if forced is None:
                    self.assertIn(_fp8._DEQ_WAY.get("cpu"), (1, 2), "learned at the first use")
        finally:
            _fp8._DEQ_WAY.clear()
            _fp8._DEQ_WAY.update(saved)

    def test_rows_once_per_tensor(self):
        """The Linears reading one activation quantize it once (_fp8.rows_of): the same
        tensor unchanged gives the same rows; changed in place (its version), another
        tensor, or an inference tensor (no version) is quantized anew; the rows go
        with the tensor. The product on rows given is the product on x's own."""
        from arena_gpu.torch import _fp8

        g = torch.Generator().manual_seed(7)
        x = torch.randn(6, 32, generator=g).to(torch.bfloat16)
        q1, s1 = _fp8.rows_of(x, 32)
        want = _fp8.quantize_rows(x)
        self.assertTrue(torch.equal(q1.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(s1, want[1]))
        q2, s2 = _fp8.rows_of(x, 32)
        self.assertTrue(q2 is q1 and s2 is s1, "the same tensor, unchanged: quantized once")
        x.mul_(2)
        q3, s3 = _fp8.rows_of(x, 32)
        self.assertIsNot(q3, q1)
        self.assertTrue(torch.equal(s3, want[1] * 2), "changed in place: quantized again")
        y = x.clone()
        self.assertIsNot(_fp8.rows_of(y, 32)[0], q3, "another tensor")
        x3 = torch.randn(2, 3, 32, generator=g).to(torch.bfloat16)  # [..., k]: rows of x3.reshape(-1, k)
        self.assertEqual(tuple(_fp8.rows_of(x3, 32)[0].shape), (6, 32))
        with torch.inference_mode():
            xi = torch.randn(4, 32, generator=g).to(torch.bfloat16)
            self.assertIsNot(_fp8.rows_of(xi, 32)[0], _fp8.rows_of(xi, 32)[0], "inference tensors keep no version")
        del y, x3
        gc.collect()
        z = torch.randn(4, 32, generator=g).to(torch.bfloat16)
        _fp8.rows_of(z, 32)
        del z
        self.assertIsNone(_fp8._LAST, "the rows go with their tensor")
        # one output row and column (the CPU's _scaled_mm takes it): rows given or not, one product
        w = torch.randn(1, 32, generator=g) * 0.02
        ws = (w.abs().amax(1, keepdim=True) / 448).clamp(min=1e-12)
        wq = (w / ws).clamp(-448, 448).to(torch.float8_e4m3fn)
        xr = x[:1].clone()
        xq, xs = _fp8.rows_of(xr, 32)
        a = _fp8._ScaledLinear.apply(xr, None, xq, xs, _fp8.native_args(wq, ws, torch.bfloat16))
        self.assertTrue(torch.equal(a, _fp8.scaled_linear(xr, wq, ws, None, torch.bfloat16)))
        # the native F.linear: through the autograd function where autograd records it,
        # the product alone where not; the same output either way
        fw = _fp8.Fp8Weight(wq, ws, torch.bfloat16, False)
        with torch.no_grad():
            self.assertTrue(torch.equal(_fp8._native_linear(xr, fw, None), a))
        xg = xr.clone().requires_grad_(True)
        with grad_fp8(False):  # (the CPU's _scaled_mm cannot run the FP8 gradient's: test_native_fp8_grad)
            yg = _fp8._native_linear(xg, fw, None)
        self.assertTrue(torch.equal(yg, a) and yg.grad_fn is not None)
        yg.backward(torch.ones_like(yg))
        self.assertTrue(torch.equal(xg.grad, torch.ones_like(yg).matmul(_fp8.dequantize(wq, ws, torch.bfloat16))))
        _fp8.forget_rows()
        self.assertIsNone(_fp8._LAST)

    def test_native_fp8_grad(self):
        """The input's gradient as an FP8 product (_fp8.scaled_grad_input), checked where it
        can run here: _scaled_mm stood in for by f32 arithmetic on the operands it is given
        (the CPU's takes only scales of one element), which must be the output's gradient
        times the weight's row scales quantized per row, and the weight's FP8 bytes
        transposed, column-major; the result against grad @ W within FP8's rounding, for
        row scales, one scale and none."""
        from arena_gpu.torch import _fp8

        g = torch.Generator().manual_seed(4)
        n, k, m = 48, 32, 10
        w = torch.randn(n, k, generator=g) * torch.logspace(-3, 1, n)[:, None]
        grad = (torch.randn(2, m // 2, n, generator=g) * torch.logspace(-2, 2, m // 2)[None, :, None])
        grad = grad.to(torch.bfloat16)
        seen = []

        def mm(a, b, scale_a, scale_b, out_dtype, **kw):
            self.assertEqual((a.dtype, b.dtype), (torch.float8_e4m3fn, torch.float8_e4m3fn))
            self.assertEqual(b.stride(0), 1, "the second operand column-major")
            self.assertEqual((tuple(scale_a.shape), tuple(scale_b.shape)), ((a.shape[0], 1), (1, b.shape[1])))
            seen.append((a, scale_a, b, scale_b))
            return ((a.float() * scale_a) @ (b.float() * scale_b)).to(out_dtype)

        real = torch._scaled_mm
        torch._scaled_mm = mm
        try:
            for kind in ("row", "tensor", "none"):
                if kind == "row":
                    s = (w.abs().amax(1, keepdim=True) / 448).clamp(min=1e-12)
                elif kind == "tensor":
                    s = (w.abs().amax() / 448).reshape(1)
                else:
                    s = None
                q = (w / (s if s is not None else 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
                seen.clear()
                gx = _fp8.scaled_grad_input(grad, q, s, torch.bfloat16)
                self.assertEqual((gx.shape, gx.dtype), ((2, m // 2, k), torch.bfloat16), kind)
                a, sa, b, sb = seen[0]
                g2 = grad.reshape(-1, n)
                cs = s.reshape(n) if kind == "row" else None
                wq, ws = _fp8.quantize_rows_torch(g2, cs)
                self.assertTrue(torch.equal(a.view(torch.uint8), wq.view(torch.uint8)), kind)
                self.assertTrue(torch.equal(sa, ws), kind)
                self.assertTrue(torch.equal(b.view(torch.uint8), q.view(torch.uint8)), kind)
                want_sb = s.reshape(1, 1).expand(1, k) if kind == "tensor" else torch.ones(1, k)
                self.assertTrue(torch.equal(sb, want_sb), kind)
                wd = _fp8.dequantize(q, s, torch.float32)
                exact, bound = g2.float() @ wd, g2.float().abs() @ wd.abs()
                err = (gx.reshape(-1, k).float() - exact).abs()
                self.assertTrue(bool((err <= bound * 2 ** -3).all()), (kind, (err / bound).max().item()))
        finally:
            torch._scaled_mm = real

    def test_dequantized_copies_count_in_vram(self):
        """The dequantized copies are torch's memory: a modelled allocator on the simulator
        (what the copies of the blocks being run take, held as a cache) is what the
        adapter reports; the learned need makes room for it and the process (weights,
        ring, copies) never holds more than vram; outputs are the plain model's."""
        import weakref

        import arena_gpu.torch._blocks as blocks

        path = self.image("fp8-e4m3-row")
        with torch.no_grad():
            want = self.plain(path)(**inputs()).sample
        cap = 270 << 10
        m = model()
        h = at.attach(m, path, device="sim", sim_capacity="16G", vram=cap, headroom=0, piece_size=0,
                      learn_rest=True)
        live, cache = [0], {"held": 0, "peak": 0}
        real = blocks._dequantize

        def counted(hh, info, index, addr):
            out = real(hh, info, index, addr)
            n = out.untyped_storage().nbytes()
            live[0] += n
            weakref.finalize(out.untyped_storage(), lambda n=n: live.__setitem__(0, live[0] - n))
            if live[0] > cache["held"]:
                cache["held"] = live[0]
                self.assertLessEqual(live[0], h.arena.memory()["rest_limit"], "torch asked past its limit")
                h.arena.sim_rest(live[0])
            cache["peak"] = max(cache["peak"], live[0])
            return out

        blocks._dequantize = counted
        try:
            h._rest_memory = lambda: cache["held"]
            h._rest_peak = lambda: cache["peak"]
            h._rest_reset = lambda: cache.update(peak=cache["held"])
            with torch.no_grad():
                for k in range(5):
                    self.assertTrue(torch.equal(m(**inputs()).sample, want), k)
                    h.end_step()
                    peak = h.arena.sim_peak(reset=True)
                    self.assertLessEqual(peak, cap, f"step {k}: the process held {peak} over vram {cap}")
            self.assertGreater(cache["held"], 0)
            self.assertTrue(h.arena.memory()["learned"])
            self.assertGreater(h.plan()["n_streamed"], 0)
        finally:
            blocks._dequantize = real
        h.detach()

    @slow
    def test_training_without_checkpointing(self):
        """A quantized block's dequantized weights are let go at its release; saved as
        references, its backward dequantizes them again: the plain model's gradients."""
        path = self.image("fp8-e4m3-row")
        m0 = self.plain(path)
        add_lora(m0)
        want = train_steps(m0, checkpointing=False)
        for opts in (RESIDENT, self.PIECES):
            with self.subTest(opts=opts):
                m = model()
                h = at.attach(m, path, mode="train", **opts)
                add_lora(m)
                same_step(self, train_steps(m, checkpointing=False), want)
                h.detach()

    def test_dequantize_matches_the_reference(self):
        """arena_tensor_dequantize, every scheme from BF16, F16 and F32 sources (special
        values, rows of 5 elements, 1e-6 to 100 in a row), streamed blocks through
        acquire: bit for bit (qdata.float() x scale).to(dtype); its refusals."""
        from safetensors.torch import save_file

        g = torch.Generator().manual_seed(5)
        sd = {}
        for i, dt in enumerate((torch.bfloat16, torch.float16, torch.float32)):
            for name, shape in (("a", (64, 48)), ("b", (7, 5))):
                x = torch.randn(*shape, generator=g) * torch.logspace(-6, 2, shape[-1])
                x.view(-1)[:6] = torch.tensor([0.0, -0.0, 1e-30, -448.0, 500.0, 3.0e-3])
                sd[f"blocks.{i}.{name}.weight"] = x.to(dt)
        src = os.path.join(TMP, "dq.safetensors")
        save_file(sd, src)
        for scheme in self.SCHEMES + ("bf16",):
            path = os.path.join(TMP, f"dq-{scheme}.arena")
            subprocess.run([ARENA_BIN, "convert", "-q", "--quant", scheme, src, "-o", path], check=True)
            cap = "13K" if scheme == "bf16" else "8K"  # a ring of two blocks: 12.5 KiB, 6.5-7.5 KiB
            with arena.open(path, device="sim", sim_capacity=cap, headroom=0, reserve=0, depth=1) as a:
                ts = {n: t.clone() for n, t in a.tensors().items()}
                a.step_begin()
                for name in sd:
                    info = a.tensor_info(name)
                    with self.subTest(scheme=scheme, name=name, dtype=info.dtype):
                        self.assertEqual(info.scheme, scheme)
                        dt = arena.torch_dtype(info.dtype)
                        scale = ts.get(name + "_scale")
                        want = (ts[name].float() * scale if scale is not None else ts[name].float()).to(dt)
                        addr = a.acquire(info.block)
                        got = a.dequantize(name, addr, torch.full(info.shape, 7, dtype=dt))
                        a.release(info.block)
                        self.assertTrue(torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8)))
                a.step_end()
                self.assertGreater(a.plan()["n_streamed"], 0, scheme)
                # refusals: the wrong out, a tensor stored as is (none here: the arena's own check)
                with self.assertRaises(arena.Error) as cm:
                    a.dequantize("blocks.0.a.weight", 1, torch.empty(64, 47, dtype=torch.bfloat16))
                self.assertIn("out must be a contiguous cpu tensor of (64, 48)", cm.exception.message)
        with arena.open(IMG, device="sim") as a:
            w = "transformer_blocks.0.attn.to_q.weight"
            with self.assertRaises(arena.Error) as cm:
                a.dequantize(w, 1, torch.empty(32, 32, dtype=torch.bfloat16))
            self.assertEqual(cm.exception.code, "USAGE")
            self.assertIn(f"'{w}' is stored none: view its bytes instead", cm.exception.message)


def _in_blocks(fqn: str) -> bool:
    return "transformer_blocks" in fqn


def quantize(m, how: str):
    """The tiny Flux's Linears in its blocks quantized by a library (in place, frozen):
    torchao's float8 weight-only, float8 dynamic activation (per tensor: the CPU's
    _scaled_mm takes only that), int8 weight-only, int4 weight-only (IntxWeightOnly:
    torchao's Int4WeightOnly needs CUDA kernels); optimum-quanto's qint8, qfloat8, qint4."""
    if how.startswith("torchao"):
        from torchao.quantization import (Float8Tensor, Float8WeightOnlyConfig, Int8WeightOnlyConfig,
                                          IntxWeightOnlyConfig, PerGroup, PerTensor, quantize_)

        if how == "torchao-float8-dynamic":  # quantize_'s config asks for a GPU: the same tensor, made directly
            from torchao.quantization.quant_api import Float8MMConfig, QuantizeTensorToFloat8Kwargs
            from torchao.quantization.quantize_.common import KernelPreference

            pref = KernelPreference.TORCH
            for n, mod in m.named_modules():
                if isinstance(mod, torch.nn.Linear) and _in_blocks(n):
                    w = Float8Tensor.from_hp(mod.weight.detach(), float8_dtype=torch.float8_e4m3fn,
                                             granularity=PerTensor(), mm_config=Float8MMConfig(use_fast_accum=False),
                                             act_quant_kwargs=QuantizeTensorToFloat8Kwargs(
                                                 torch.float8_e4m3fn, PerTensor(), kernel_preference=pref),
                                             kernel_preference=pref)
                    mod.weight = torch.nn.Parameter(w, requires_grad=False)
        else:
            cfg = {"torchao-float8": Float8WeightOnlyConfig(), "torchao-int8": Int8WeightOnlyConfig(),
                   "torchao-int4": IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(16))}[how]
            quantize_(m, cfg, filter_fn=lambda mod, fqn: isinstance(mod, torch.nn.Linear) and _in_blocks(fqn))
    else:
        import optimum.quanto as oq

        oq.quantize(m, weights={"quanto-qint8": oq.qint8, "quanto-qfloat8": oq.qfloat8, "quanto-qint4": oq.qint4}[how],
                    include=["*transformer_blocks*"])
        oq.freeze(m)
    m.requires_grad_(False)
    return m


class Subclasses(unittest.TestCase):
    """Models quantized by torchao and optimum-quanto: their weights are tensor subclasses
    whose inner tensors arena stores (scheme torch-subclass) and binds zero copy. Attached
    under forced streaming (whole blocks and pieces), a model quantized the same way gives
    the outputs and LoRA gradients of the quantized model not attached, bit for bit."""

    HOW = ("torchao-float8", "torchao-float8-dynamic", "torchao-int8", "torchao-int4", "quanto-qint8",
           "quanto-qfloat8", "quanto-qint4")
    # the device: the smallest that runs the image (tight())
    STREAM = dict(device="sim", headroom=0, reserve=0, keep_last=0, depth=1, piece_size=0)
    TRAIN = dict(STREAM, depth=2)
    PIECES = dict(device="sim", headroom=0, reserve=0, keep_last=0, piece_size="16K")

    @staticmethod
    def tight(path: str, opts: dict, mode: str = "sample") -> dict:
        """opts with the smallest device (in 4 KiB steps from 100 KiB) that runs the image:
        its plan streams the most it can."""
        for k in range(100, 400, 4):
            o = dict(opts, sim_capacity=f"{k}K")
            try:
                arena.open(path, mode=mode, **{x: v for x, v in o.items()}).close()
                return o
            except arena.Error as e:
                if e.code != "BUDGET":
                    raise
        raise AssertionError(f"{path}: no device up to 400 KiB runs it")

    @staticmethod
    def image(how: str) -> str:
        """save_image of the quantized tiny Flux (once per run)."""
        path = os.path.join(TMP, f"sub-{how}.arena")
        if not os.path.exists(path):
            at.save_image(quantize(model(meta=False), how), path)
        return path

    @slow
    def test_sampling_equals_the_quantized_model(self):
        for how in self.HOW:
            with torch.no_grad():
                want = quantize(model(meta=False), how)(**inputs()).sample
            path = self.image(how)
            with arena.open(path, device="sim") as a:
                info = a.tensor_info("transformer_blocks.0.attn.to_q.weight")
                self.assertEqual(info.scheme, "torch-subclass")
                self.assertEqual((info.dtype, info.shape), ("BF16", (32, 32)))
                self.assertIn(json.loads(info.subclass)["library"], ("torchao", "optimum.quanto"))
            for meta in (True, False):  # quantized on the meta device (no values), or with values of its own
                for opts in (self.STREAM, self.PIECES):
                    with self.subTest(how=how, meta=meta, pieces=opts["piece_size"]):
                        m = quantize(model(meta=meta), how)
                        w = m.transformer_blocks[0].attn.to_q.weight
                        h = at.attach(m, path, **self.tight(path, opts))
                        self.assertGreater(h.plan()["n_streamed"], 0)
                        with torch.no_grad():
                            for _ in range(2):
                                self.assertTrue(torch.equal(m(**inputs()).sample, want))
                        # the module's own subclass object (quantized on the CPU), its inner tensors
                        # views of arena's memory (a slab's storage), not copies
                        w2 = m.transformer_blocks[0].attn.to_q.weight
                        if not meta and type(w2) is type(w):
                            self.assertIs(w2, w)
                        slabs = {b.nbytes for b in h.arena.blocks}
                        for name, v in at._quant._inner(w2):
                            self.assertIn(v.untyped_storage().nbytes(), slabs, name)
                        h.detach()  # the module's weight on the meta device again (its inner tensors too)
                        w3 = m.transformer_blocks[0].attn.to_q.weight
                        self.assertEqual(w3.device.type if type(w3) is not type(w2) else
                                         {v.device.type for _, v in at._quant._inner(w3)}.pop(), "meta")

    @slow
    def test_training_equals_the_quantized_model(self):
        """LoRA through frozen quantized weights: losses, adapters' gradients and values
        after two AdamW steps, bit for bit. (torchao's float8 dynamic activation has no
        backward on the CPU: its _scaled_mm has no derivative there; not trained here.)"""
        for how in self.HOW:
            if how == "torchao-float8-dynamic":
                continue
            m0 = quantize(model(meta=False), how)
            add_lora(m0)
            want = train_steps(m0)
            for opts in (self.TRAIN, self.PIECES):
                with self.subTest(how=how, pieces=opts["piece_size"]):
                    m = quantize(model(), how)
                    path = self.image(how)
                    o = self.tight(path, opts, "train")
                    if opts["piece_size"]:  # (at the very smallest, torchao-int4's pieces once found the
                        # ring's five slots filled by three held pieces: the ring's placement, not the binding)
                        o["sim_capacity"] = f"{int(o['sim_capacity'][:-1]) + 8}K"
                    h = at.attach(m, path, mode="train", **o)
                    self.assertGreater(h.plan()["n_streamed"], 0)
                    add_lora(m)
                    same_step(self, train_steps(m), want)
                    h.detach()

    @slow
    def test_convert_of_saved_state_dicts(self):
        """arena convert of what the libraries save: torchao's safetensors (flatten_tensor_state_dict
        with its metadata), optimum-quanto's state_dict (save_file); attached, the quantized
        model's outputs. A packed quanto weight (qint4) is refused: its state_dict has no shape.
        export then convert gives the same tensors again."""
        from safetensors.torch import save_file
        from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

        for how in ("torchao-float8", "torchao-int8", "torchao-int4", "quanto-qint8", "quanto-qfloat8", "quanto-qint4"):
            with self.subTest(how=how):
                q = quantize(model(meta=False), how)
                with torch.no_grad():
                    want = q(**inputs()).sample
                src = os.path.join(TMP, f"sd-{how}.safetensors")
                if how.startswith("torchao"):
                    data, meta = flatten_tensor_state_dict(q.state_dict())
                    save_file(data, src, metadata=meta)
                else:
                    save_file(q.state_dict(), src)
                path = os.path.join(TMP, f"sd-{how}.arena")
                r = subprocess.run([ARENA_BIN, "convert", "-q", src, "-o", path], capture_output=True, text=True)
                if how == "quanto-qint4":
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertIn("packed optimum-quanto weight (qint4, qint2): its state_dict does not give the "
                                  "weight's shape; write the image from the quantized model with "
                                  "arena.torch.save_image", r.stderr)
                    self.assertFalse(os.path.exists(path))
                    continue
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(subprocess.run([ARENA_BIN, "verify", "-q", path], stdout=subprocess.DEVNULL).returncode, 0)
                m = quantize(model(), how)
                h = at.attach(m, path, **self.tight(path, self.STREAM))
                self.assertGreater(h.plan()["n_streamed"], 0)
                with torch.no_grad():
                    self.assertTrue(torch.equal(m(**inputs()).sample, want))
                h.detach()
                # export -> convert: the same tensors, schemes, subclass objects and bytes
                x = os.path.join(TMP, f"sd-{how}-x.safetensors")
                y = os.path.join(TMP, f"sd-{how}-x.arena")
                subprocess.run([ARENA_BIN, "export", "-q", path, "-o", x], check=True)
                subprocess.run([ARENA_BIN, "convert", "-q", x, "-o", y], check=True)
                with arena.open(path, device="sim") as a, arena.open(y, device="sim") as b:
                    self.assertEqual(a.tensor_names(), b.tensor_names())
                    ta, tb = a.tensors(), b.tensors()
                    self.assertEqual(same(ta, tb), [])
                    for n in a.tensor_names():
                        ia, ib = a.tensor_info(n), b.tensor_info(n)
                        self.assertEqual((ia.scheme, ia.subclass, [c.name for c in ia.components]),
                                         (ib.scheme, ib.subclass, [c.name for c in ib.components]))

    def test_save_image_stores_the_inner_tensors(self):
        """save_image: each subclass's inner tensors as its components, bytes as the module
        held them; plain tensors as they are."""
        q = quantize(model(meta=False), "quanto-qint8")
        a_path = os.path.join(TMP, "save-a.arena")
        at.save_image(q, a_path)
        with arena.open(a_path, device="sim") as a:
            infos = {n: a.tensor_info(n) for n in a.tensor_names()}
            ts = {n: t.clone() for n, t in a.tensors().items()}
        w = q.transformer_blocks[1].ff.net[2].weight
        i = infos["transformer_blocks.1.ff.net.2.weight"]
        self.assertEqual([c.name for c in i.components], ["_data", "_scale"])
        self.assertTrue(torch.equal(ts["transformer_blocks.1.ff.net.2.weight__data"], w._data))
        self.assertTrue(torch.equal(ts["transformer_blocks.1.ff.net.2.weight__scale"], w._scale))
        self.assertTrue(torch.equal(ts["transformer_blocks.1.ff.net.2.bias"], q.transformer_blocks[1].ff.net[2].bias))
        # an existing image is replaced only with force=True (arena convert --force)
        before = os.stat(a_path)
        with self.assertRaises(arena.Error) as e:
            at.save_image(q, a_path)
        self.assertEqual((e.exception.code, e.exception.error_class), ("OUTPUT_EXISTS", "usage"))
        self.assertIn("force=True", str(e.exception))
        self.assertEqual(os.stat(a_path).st_ino, before.st_ino)
        self.assertEqual([f for f in os.listdir(TMP) if f.startswith(".arena-save-")], [])
        at.save_image(q, a_path, force=True)
        self.assertNotEqual(os.stat(a_path).st_ino, before.st_ino)
        with arena.open(a_path, device="sim") as a:
            self.assertEqual(sorted(a.tensor_names()), sorted(infos))

    @slow
    def test_a_subclass_of_the_protocol_needs_no_binding(self):
        """A quantizer of its own (docs/QUANT.md's example): a subclass that declares its inner
        tensors binds with no arena code when the module holds it; from a plain module it
        needs a registered binding, and says so."""
        m0 = model(meta=False)
        for n, mod in m0.named_modules():
            if isinstance(mod, torch.nn.Linear) and _in_blocks(n):
                mod.weight = torch.nn.Parameter(RowInt8.quantize(mod.weight.detach(), Fmt("rows")),
                                                requires_grad=False)
        with torch.no_grad():
            want = m0(**inputs()).sample
        path = os.path.join(TMP, "rowint8.arena")
        at.save_image(m0, path)
        with arena.open(path, device="sim") as a:
            meta = json.loads(a.tensor_info("transformer_blocks.0.attn.to_q.weight").subclass)
            self.assertEqual(meta["type"], f"{RowInt8.__module__}.RowInt8")
            self.assertIsNone(meta["encoding"], "an Fmt object is not a plain value")
        m = model()
        for n, mod in m.named_modules():
            if isinstance(mod, torch.nn.Linear) and _in_blocks(n):  # quantized on the meta device
                mod.weight = torch.nn.Parameter(RowInt8.quantize(mod.weight.detach(), Fmt("rows")),
                                                requires_grad=False)
        h = at.attach(m, path, **Subclasses.tight(path, Subclasses.STREAM))
        self.assertGreater(h.plan()["n_streamed"], 0)
        with torch.no_grad():
            self.assertTrue(torch.equal(m(**inputs()).sample, want))
        h.detach()
        with self.assertRaises(arena.Error) as cm:
            at.attach(model(), path, **Subclasses.tight(path, Subclasses.STREAM))
        self.assertIn("is stored as RowInt8 (torch-subclass) and the module holds a plain tensor, which cannot be "
                      "rebuilt from the image", cm.exception.message)
        self.assertIn("quantize the module the same way before attach", cm.exception.message)

        class RowInt8Binding(at.Binding):  # how the example registers one
            library = "rowint8"
            modules = (RowInt8.__module__ + ".RowInt8",)

            def encode(self, t):
                return {"encoding": "rowint8", "attributes": {"fmt": t.fmt.name}}

            def rebuild(self, cls, meta, inner, size, stride):
                return cls(inner["qdata"], inner["scale"], Fmt(meta["attributes"]["fmt"]))

        at.register_binding(RowInt8Binding())
        try:
            path2 = os.path.join(TMP, "rowint8-2.arena")
            at.save_image(m0, path2)
            m = model()
            h = at.attach(m, path2, **Subclasses.tight(path2, Subclasses.STREAM))
            self.assertIsInstance(m.transformer_blocks[0].attn.to_q.weight, RowInt8)
            with torch.no_grad():
                self.assertTrue(torch.equal(m(**inputs()).sample, want))
            h.detach()
        finally:
            at._quant._bindings.pop(0)

    @slow
    def test_compiled_blocks(self):
        """Every block compiled (fullgraph, aot_eager) over tensor subclasses bound to arena
        memory (torchao's, quanto's, arena's own FP8 weights): the outputs of the model
        not attached, no recompile after the first step while the inner tensors move."""
        for how in ("torchao-float8", "quanto-qint8"):
            with self.subTest(how=how):
                path = self.image(how)
                with torch.no_grad():
                    want = quantize(model(meta=False), how)(**inputs()).sample
                m = quantize(model(), how)
                compiled_steps(self, m, at.attach(m, path, **self.tight(path, self.STREAM)), want)
        path = Quantized.image("fp8-e4m3-row")
        with torch.no_grad():
            want = Quantized.plain(path)(**inputs()).sample
        m = model()
        compiled_steps(self, m, at.attach(m, path, fp8_compute=True, **Quantized.STREAM), want)

    def test_refusals(self):
        # the module quantized otherwise (int4 in groups of 32, the image's of 16): its inner
        # tensors are not the image's
        from torchao.quantization import IntxWeightOnlyConfig, PerGroup, quantize_

        m = model()
        quantize_(m, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
                  filter_fn=lambda mod, fqn: isinstance(mod, torch.nn.Linear) and _in_blocks(fqn))
        with self.assertRaises(arena.Error) as cm:
            at.attach(m, self.image("torchao-int4"), **RESIDENT)
        self.assertIn("'transformer_blocks.0.attn.to_q.weight': inner tensor 'scale' is (32, 1) torch.bfloat16, the "
                      "image's (32, 2) BF16", cm.exception.message)
        # save_image: a meta model has no values
        with self.assertRaises(arena.Error) as cm:
            at.save_image(quantize(model(), "torchao-int8"), os.path.join(TMP, "never.arena"))
        self.assertIn("is on the meta device: it has no values to write", cm.exception.message)
        self.assertFalse(os.path.exists(os.path.join(TMP, "never.arena")))
        # torchao's int4 weight-only needs CUDA kernels: quantize_ itself refuses on this machine
        from torchao.quantization import Int4WeightOnlyConfig, quantize_

        with self.assertRaises(Exception):
            quantize_(torch.nn.Sequential(torch.nn.Linear(64, 32, dtype=torch.bfloat16)),
                      Int4WeightOnlyConfig(group_size=32))

    def test_a_malformed_subclass_object(self):
        """An image whose subclass object of a tensor is malformed (written so on purpose:
        a nesting 900 deep, a type that is a list, a permutation out of range, a size that
        is no list) is refused at attach as a malformed manifest naming the tensor, whether
        the module holds the subclass or a plain tensor; nothing is bound."""
        m0 = model(meta=False)
        for n, mod in m0.named_modules():
            if isinstance(mod, torch.nn.Linear) and _in_blocks(n):
                mod.weight = torch.nn.Parameter(RowInt8.quantize(mod.weight.detach(), "rows"), requires_grad=False)
        name = "transformer_blocks.0.attn.to_q.weight"

        def deep(s: dict) -> None:
            for _ in range(900):
                s["nested"] = {"_data": {"type": s["type"]}}
                s = s["nested"]["_data"]

        def listed(s: dict) -> None:
            s["type"] = ["a", "b"]

        def permuted(s: dict) -> None:
            s["permute"] = {"qdata": [5, 7]}

        def sized(s: dict) -> None:
            s["size"] = "big"

        describe = at._quant.describe
        cases = ((deep, "not JSON that can be read (RecursionError"), (listed, "'type' is a list, not a string"),
                 (permuted, "'permute' of 'qdata' is [5, 7], not a permutation of its 2 dimensions"),
                 (sized, "'size' is not a list of non-negative integers"))
        for spoil, why in cases:
            with self.subTest(spoil.__name__):

                def spoilt(n: str, t: torch.Tensor, spoil=spoil):
                    entry, comps = describe(n, t)
                    if n == name:
                        spoil(entry["subclass"])
                    return entry, comps

                path = os.path.join(TMP, f"spoilt-{spoil.__name__}.arena")
                at._quant.describe = spoilt
                limit = sys.getrecursionlimit()
                sys.setrecursionlimit(20000)  # (json.dumps of the deep one)
                try:
                    at.save_image(m0, path)
                finally:
                    at._quant.describe = describe
                    sys.setrecursionlimit(limit)
                for held in ("the subclass", "a plain tensor"):
                    m = model()
                    if held == "the subclass":
                        for n, mod in m.named_modules():
                            if isinstance(mod, torch.nn.Linear) and _in_blocks(n):
                                mod.weight = torch.nn.Parameter(RowInt8.quantize(mod.weight.detach(), "rows"),
                                                                requires_grad=False)
                    with self.assertRaises(arena.Error) as cm:
                        at.attach(m, path, device="sim")
                    e = cm.exception
                    self.assertEqual((e.code, e.error_class), ("IMG_MANIFEST_BAD", "invalid"), e.message)
                    self.assertIn(f"{path}: tensor '{name}': its subclass object is malformed: {why}", e.message)
                    self.assertFalse(hasattr(m, "_arena_handle"), "nothing bound")


class Fmt:
    """Not a plain value: a subclass's flatten context holding one cannot be written as JSON."""

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, o):
        return isinstance(o, Fmt) and o.name == self.name


class RowInt8(torch.Tensor):
    """A quantizer's weight (docs/QUANT.md's example): int8 codes and one scale a row,
    following PyTorch's protocol; F.linear computes on its dequantized values."""

    @staticmethod
    def __new__(cls, qdata, scale, fmt):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=scale.dtype, device=qdata.device)

    def __init__(self, qdata, scale, fmt):
        self.qdata, self.scale, self.fmt = qdata, scale, fmt

    @classmethod
    def quantize(cls, w, fmt):
        s = (w.float().abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
        return cls((w.float() / s).round().clamp(-127, 127).to(torch.int8), s.to(w.dtype), fmt)

    def __tensor_flatten__(self):
        return ["qdata", "scale"], {"fmt": self.fmt}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return RowInt8(inner["qdata"], inner["scale"], ctx["fmt"])

    def dequantize(self):
        return (self.qdata.float() * self.scale.float()).to(self.dtype)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            x, w = args[0], args[1]
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            return torch.nn.functional.linear(x, w.dequantize(), b)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:
            w = args[0]
            return RowInt8(w.qdata, w.scale, w.fmt)
        raise NotImplementedError(f"RowInt8: {func}")


class Refusals(unittest.TestCase):
    def expect(self, code: str, text: str, fn, *args, **kwargs):
        with self.assertRaises(arena.Error) as cm:
            fn(*args, **kwargs)
        self.assertEqual(cm.exception.code, code, cm.exception.message)
        self.assertIn(text, cm.exception.message)
        return cm.exception

    @slow
    def test_a_refused_attach_left_to_the_interpreter_exits_cleanly(self):
        # A refusal after globals and resident blocks are bound (made here: no
        # refusal of attach comes that late since the ring is checked at open):
        # the traceback Python keeps for an uncaught error holds their tensors
        # until the interpreter shuts down, and torch frees them then. (Their
        # DLPack deleter was a ctypes callback: the process died of SIGSEGV there.)
        script = (
            "import json, os, sys, torch\n"
            "from diffusers import FluxTransformer2DModel\n"
            "import arena_gpu as arena\n"
            "import arena_gpu.torch as at\n"
            "from arena_gpu.torch import _attach\n"
            "def refuse(*args, **kwargs):\n"
            "    print('refused after binding', file=sys.stderr)\n"
            "    raise arena.Error('BUDGET', 'refused after binding')\n"
            "_attach._quant.copy_bytes = refuse\n"
            "with torch.device('meta'):\n"
            "    m = FluxTransformer2DModel(**json.loads(sys.argv[2])).to(torch.bfloat16)\n"
            "at.attach(m, sys.argv[1], mode='train', device='sim', sim_capacity='16G')\n"
        )
        r = subprocess.run([sys.executable, "-c", script, IMG, json.dumps(CFG)], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 1, r.stderr[-2000:])
        self.assertIn("refused after binding", r.stderr)
        self.assertIn("arena_gpu.Error", r.stderr)
        self.assertIn("[BUDGET]", r.stderr)

    def test_training_the_bound_weights(self):
        # plain weights, and FP8 weights bound as a tensor subclass (asked through
        # their inner tensors' references)
        for path, kw in ((IMG, {}), (Quantized.image("fp8-e4m3-row"), dict(fp8_compute=True))):
            with self.subTest(path=os.path.basename(path)):
                m = model()
                h = at.attach(m, path, mode="train", **RESIDENT, **kw)
                m.requires_grad_(True)
                m.enable_gradient_checkpointing()
                e = self.expect("USAGE", "full fine-tuning", m, **inputs())
                self.assertIn("requires_grad on 'weight'", e.message)  # the weight, not an inner tensor
                h.detach()

    def test_merging_an_adapter(self):
        from torch.nn.modules import module as tm

        hooks0 = len(tm._global_module_registration_hooks)
        m = model()
        h = at.attach(m, IMG, **STREAM)
        with torch.no_grad():
            m(**inputs())  # steps before the adapters come: the walk for them is done
        add_lora(m)
        with torch.no_grad():
            m(**inputs())  # adapters added after attach are guarded from the next call on
        self.expect("USAGE", "merging an adapter", m.fuse_lora)
        h.detach()
        # the registrations were watched from attach to detach only
        self.assertEqual(len(tm._global_module_registration_hooks), hooks0)

    def test_converting_or_moving_bound_weights(self):
        m = model()
        h = at.attach(m, IMG, **STREAM)
        self.expect("USAGE", "converting or moving it", m.to, torch.float32)
        self.expect("USAGE", "converting or moving it", m.to, "meta")
        m.to("cpu")  # where they are: fine
        m.to(torch.bfloat16)
        with torch.no_grad():
            m(**inputs())
        h.detach()

    def test_mismatches_in_one_error(self):
        cfg = dict(CFG, num_layers=3, joint_attention_dim=48)
        with torch.device("meta"):
            m = FluxTransformer2DModel(**cfg).to(torch.bfloat16)
        e = self.expect("USAGE", "problem(s)", at.attach, m, IMG, **STREAM)
        self.assertIn("context_embedder.weight' is (32, 48)", e.message)
        self.assertIn("transformer_blocks.2.attn.to_q.weight' has no tensor", e.message)
        self.assertNotIn("\n", e.message)
        # a float32 module
        with torch.device("meta"):
            m = FluxTransformer2DModel(**CFG)
        e = self.expect("USAGE", "torch.float32, the image's", at.attach, m, IMG, **STREAM)
        # ... said first in one line: how many tensors, what the image holds, the fix; then the list
        with arena.open(IMG, device="sim") as a:
            n = sum(1 for t in a.tensor_names() if a.tensor_info(t).dtype == "BF16")
        head = (f"cannot attach FluxTransformer2DModel to {IMG}: {n} tensors are float32, the image holds "
                f"bfloat16: build the model with .to(torch.bfloat16); {n} problem(s): '")
        self.assertTrue(e.message.startswith(head), e.message[:300])
        # two dtypes apart from the image's: each counted
        with torch.device("meta"):
            m = FluxTransformer2DModel(**CFG).to(torch.bfloat16)
            m.x_embedder.to(torch.float16)
            m.proj_out.to(torch.float32)
        e = self.expect("USAGE", "problem(s)", at.attach, m, IMG, **STREAM)
        self.assertIn(": 2 tensors are float16 and 2 float32, the image holds bfloat16: build the model with "
                      ".to(torch.bfloat16); 4 problem(s): ", e.message)
        # nothing of a failed attach stays: the module is as it was
        self.assertEqual({p.device.type for p in m.parameters()}, {"meta"})

    def test_a_train_ring_of_two_slots(self):
        """A recomputed block is held past the next block's recompute: two slots of
        whole blocks would stop in the backward; refused at attach, saying what to do."""
        opts = dict(STREAM, sim_capacity="230K", depth=1)
        e = self.expect("USAGE", "the ring needs 3 slots", at.attach, model(), IMG, mode="train", **opts)
        self.assertIn("give depth 2 or more", e.message)
        h = at.attach(model(), IMG, **opts)  # sampling holds nothing past its forward
        self.assertEqual(h.plan()["slots"], 2)
        h.detach()  # (three slots train: Training.test_streamed_lora_equals_plain)
        # an arena opened for sampling, attached to train: its set_mode refuses the same
        with arena.open(IMG, **opts) as a:
            e = self.expect("USAGE", "give depth 2 or more", at.attach, model(), a, mode="train")
            self.assertEqual(a.mode, "sample")

    def test_a_sampling_ring_of_two_slots_in_pieces(self):
        """Sampling in pieces holds a piece while the block's next one is acquired: a
        ring of two slots (depth=1) is refused at attach, naming the depth that runs,
        not in the middle of a forward; that depth gives the plain model's output."""
        opts = dict(device="sim", sim_capacity="120K", headroom=0, reserve=0, keep_last=0, piece_size="16K")
        e = self.expect("USAGE", "give depth 2 or more", at.attach, model(), IMG, depth=1, **opts)
        self.assertNotIn("\n", e.message)
        with torch.no_grad():
            want = model(meta=False)(**inputs()).sample
        m = model()
        h = at.attach(m, IMG, depth=2, **opts)
        self.assertGreater(h.plan()["n_streamed"], 0)
        with torch.no_grad():
            for _ in range(2):
                self.assertTrue(torch.equal(m(**inputs()).sample, want))
                h.end_step()
        h.detach()

    def test_second_attach(self):
        m = model()
        h = at.attach(m, IMG, **STREAM)
        self.expect("USAGE", "attached to an arena already", at.attach, m, IMG, **STREAM)
        h.detach()

    def test_quantized_from_fp8(self):
        """A tensor stored fp8 from an fp8 source has no wider values to bind: refused at attach."""
        from safetensors.torch import save_file

        sd = dict(SD)
        w = "transformer_blocks.0.attn.to_q.weight"
        sd[w] = sd[w].float().to(torch.float8_e4m3fn)
        src = os.path.join(TMP, "fp8_source.safetensors")
        save_file(sd, src)
        path = os.path.join(TMP, "fp8_source.arena")
        subprocess.run([ARENA_BIN, "convert", "-q", "--quant", "fp8-e4m3", src, "-o", path], check=True)
        self.expect("USAGE", f"'{w}' is stored fp8-e4m3 from F8_E4M3", at.attach, model(), path, **RESIDENT)

    def test_saved_tensor_hooks_disabled(self):
        """Without checkpointing, a streamed block's saved weights are kept as references
        through saved-tensor hooks: where those are disabled, the refusal says why."""
        m = model()
        h = at.attach(m, IMG, mode="train", **STREAM)
        add_lora(m)
        m.train()
        with torch.autograd.graph.disable_saved_tensors_hooks("a framework's own reason"):
            e = self.expect("USAGE", "saved-tensor hooks are disabled", m, **inputs())
        self.assertIn("a framework's own reason", e.message)
        h.detach()


class Traces(unittest.TestCase):
    """h.trace(path): Chrome trace-event JSON of a few steps of the tiny Flux, streamed."""

    def check(self, path: str, steps: int, blocks: list) -> dict:
        with open(path) as f:
            d = json.load(f)
        self.assertEqual(d["displayTimeUnit"], "ms")
        self.assertFalse(d["otherData"]["overflowed"])
        ev = d["traceEvents"]
        last = -1.0
        for e in ev:
            self.assertIsInstance(e["name"], str)
            self.assertIn(e["ph"], ("X", "i", "C", "M"))
            self.assertIsInstance(e["pid"], int)
            self.assertIsInstance(e["tid"], int)
            if e["ph"] != "M":
                self.assertGreaterEqual(e["ts"], last, "in time order")
                last = e["ts"]
            if e["ph"] == "X":
                self.assertGreaterEqual(e["dur"], 0)
        comp = [e["name"] for e in ev if e.get("cat") == "compute"]
        self.assertEqual(comp, blocks * steps, "every block's acquire-release once a step, in the order run")
        self.assertGreater(len([e for e in ev if e.get("cat") == "copy"]), 0)
        self.assertEqual(len([e for e in ev if e.get("cat") == "step" and not e["name"].endswith("end")]), steps)
        return d

    def test_a_few_steps(self):
        m = model()
        h = at.attach(m, IMG, **STREAM)
        blocks = [b.name for b in h.arena.blocks if b.container is not None]
        path = os.path.join(TMP, "steps.trace.json")
        with torch.no_grad():
            m(**inputs(0))  # not traced
            t = h.trace(path, steps=2)
            with self.assertRaises(arena.Error) as cm:
                h.trace(path)
            self.assertEqual(cm.exception.code, "USAGE")
            m(**inputs(1))
            m(**inputs(2))
            self.assertTrue(t.active, "the second traced step ends at the next forward")
            self.assertFalse(os.path.exists(path))
            m(**inputs(3))
        self.assertFalse(t.active)
        self.check(path, 2, blocks)
        h.detach()

    def test_context_manager(self):
        m = model()
        h = at.attach(m, IMG, **STREAM)
        blocks = [b.name for b in h.arena.blocks if b.container is not None]
        path = os.path.join(TMP, "with.trace.json")
        with torch.no_grad(), h.trace(path):
            m(**inputs(0))
            m(**inputs(1))
        self.check(path, 2, blocks)
        h.detach()


class Compile(unittest.TestCase):
    @slow
    def test_regional_compile_no_recompiles(self):
        with torch.no_grad():
            ref = model(meta=False)(**inputs()).sample
        m = model()
        h = at.attach(m, IMG, **STREAM)
        compiled_steps(self, m, h, ref)

    @slow
    def test_training_compiled_blocks_with_saved_tensors_in_host_memory(self):
        """Regional compile, checkpointed LoRA training and offload_saved together: the
        plain model's steps bit for bit, nothing compiled after the first step."""
        from torch._dynamo.testing import CompileCounterWithBackend

        m0 = model(meta=False)
        add_lora(m0)
        want = train_steps(m0, 3)
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend("aot_eager")
        m = model()
        h = at.attach(m, IMG, mode="train", offload_saved=1, **STREAM)
        add_lora(m)
        for blocks in (m.transformer_blocks, m.single_transformer_blocks):
            for b in blocks:
                b.compile(backend=cnt, fullgraph=True)
        frames = []
        losses, grads, after = train_steps(m, 3, each=lambda: frames.append(cnt.frame_count))
        self.assertGreater(frames[0], 0)
        self.assertEqual(frames, [frames[0]] * 3, "no recompiles after the first step")
        self.assertEqual(losses, want[0])
        self.assertEqual(same(grads, want[1]), [], "gradients equal the plain model's bit for bit")
        self.assertGreater(h.offload_stats()["tensors"], 0)
        h.end_step()
        self.assertGreater(h.stats()[-1]["streamed_bytes"], 0)
        h.detach()
        torch._dynamo.reset()


if __name__ == "__main__":
    unittest.main()
