"""arena.torch.synth_image and arena.ImageWriter: images of models with random
weights written a block at a time, without a checkpoint on disk.

Tiny configs of Wan 2.1 and Qwen-Image written by synth_image attach to the model
it returns (built on the meta device), streamed on the simulator, and their
forward equals the plain model's (built on the CPU, loaded with the image's
values read back by `arena export`) bit for bit. The same arguments give the
same bytes whatever the threads; a tensor's values do not depend on the config.
Host memory during a write stays within one block plus buffers, measured in a
process of its own on a model many blocks large. An error, an exception from
progress or a kill -9 leaves nothing at the output. quant="fp8-e4m3-row" gives
the image `arena convert --quant fp8-e4m3-row` makes of the same bf16 values,
byte for byte but for the manifest's "source" (which names the input). The
writer's misuse: blocks out of order, a tensor twice, a wrong size, an
incomplete finish.

Runs on CPU: usage as tests/python/test_torch.py (tests/python/run_torch.sh runs it).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
import logging
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from typing import Any, Dict, Tuple

import torch
import diffusers
from safetensors.torch import load_file

import arena_gpu as arena
import arena_gpu.torch as at
from tiers import slow

logging.getLogger("diffusers").setLevel(logging.ERROR)
diffusers.utils.logging.set_verbosity_error()

ARENA_BIN = os.environ.get("ARENA_BIN", "build/arena")
BF16 = torch.bfloat16

WAN = dict(patch_size=[1, 2, 2], num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
           text_dim=16, freq_dim=16, ffn_dim=32, num_layers=3, rope_max_seq_len=32)
QWEN = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=3, attention_head_dim=8, num_attention_heads=2,
            joint_attention_dim=16, axes_dims_rope=[2, 2, 4])


def rn(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


def wan_inputs(s: int) -> Dict[str, Any]:
    return dict(hidden_states=rn(s, 1, 4, 2, 8, 8), timestep=torch.tensor([500]),
                encoder_hidden_states=rn(s + 1, 1, 6, 16))


def qwen_inputs(s: int) -> Dict[str, Any]:
    # 1 frame of 4 x 4 patches (latents 8 x 8 at patch 2), 5 text tokens
    return dict(hidden_states=rn(s, 1, 16, 16), encoder_hidden_states=rn(s + 1, 1, 5, 16),
                encoder_hidden_states_mask=torch.ones(1, 5, dtype=torch.bool),
                timestep=torch.tensor([0.5], dtype=BF16), img_shapes=[[(1, 4, 4)]])


def exported(image: str, tmp: str) -> Dict[str, torch.Tensor]:
    """The image's tensors, as `arena export` writes them back."""
    out = os.path.join(tmp, os.path.basename(image) + ".safetensors")
    subprocess.run([ARENA_BIN, "export", "-q", "--force", image, "-o", out], check=True)
    return load_file(out)


def header(path: str) -> Tuple[bytes, Dict[str, Any], int]:
    """An image's header page, its manifest (JSON) and where the manifest ends."""
    with open(path, "rb") as f:
        page = f.read(4096)
        off, length = struct.unpack_from("<QQ", page, 24)
        f.seek(off)
        manifest = json.loads(f.read(length).rstrip(b" \0"))
    return page, manifest, off + length


class Tmp(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="arena-synth-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def path(self, name: str) -> str:
        return os.path.join(self.tmp, name)


class Forward(Tmp):
    """The image attaches to the model synth_image returns; its forward is the plain model's."""

    def floor(self, path: str, base: Dict[str, Any]) -> int:
        """The smallest simulated device (to 1 KiB) the image opens on: everything streams."""
        lo, hi = 0, os.path.getsize(path)
        while hi - lo > 1024:
            mid = (lo + hi) // 2
            try:
                arena.open(path, sim_capacity=mid, **base).close()
                hi = mid
            except arena.Error as e:
                if e.code != "BUDGET":
                    raise
                lo = mid
        return hi

    def check(self, cls: Any, config: Dict[str, Any], inputs: Any) -> None:
        path = self.path("m.arena")
        m = at.synth_image(cls, path, config=config, seed=3, threads=2, progress=False)
        self.assertTrue(all(t.is_meta for t in m.parameters()))
        values = exported(path, self.tmp)
        # the image holds the model's tensors in its dtypes, random (not all equal)
        named = dict(m.named_parameters())
        self.assertEqual(set(values), set(named))
        for n, t in values.items():
            self.assertEqual((t.dtype, t.shape), (named[n].dtype, named[n].shape), n)
        big = max(values, key=lambda n: values[n].numel())
        self.assertGreater(values[big].float().std().item(), 0.015)
        self.assertLess(values[big].float().std().item(), 0.025)
        norms = [n for n in values if "norm" in n and n.endswith(".weight") and values[n].dim() == 1]
        self.assertTrue(norms and all(bool((values[n] == 1).all()) for n in norms), norms[:3])

        torch.manual_seed(11)
        plain = cls.from_config(config)
        from arena_gpu.torch._pretrained import _set_dtypes

        _set_dtypes(plain, "", {n: t.dtype for n, t in values.items()})
        missing, unexpected = plain.load_state_dict(values, strict=False)
        self.assertEqual((missing, unexpected), ([], []))
        plain.requires_grad_(False).eval()
        with torch.no_grad():
            want = [plain(**inputs(s), return_dict=False)[0] for s in (0, 1)]

        base = dict(device="sim", headroom=0, reserve=0, keep_last=0, piece_size=0)
        h = at.attach(m.eval(), path, sim_capacity=self.floor(path, base), **base)
        with torch.no_grad():
            for _ in range(2):
                for s, w in zip((0, 1), want):
                    self.assertTrue(torch.equal(m(**inputs(s), return_dict=False)[0], w), f"input {s}")
        h.end_step()
        self.assertGreater(h.plan()["n_streamed"], 0, "blocks streamed")
        h.detach()

    # (5 blocks: the smallest device that opens streams some of them)
    def test_wan(self) -> None:
        self.check(diffusers.WanTransformer3DModel, dict(WAN, num_layers=5), wan_inputs)

    def test_qwen_image(self) -> None:
        self.check(diffusers.QwenImageTransformer2DModel, dict(QWEN, num_layers=5), qwen_inputs)


class Values(Tmp):
    def test_same_bytes_whatever_the_threads(self) -> None:
        a, b, c = self.path("a.arena"), self.path("b.arena"), self.path("c.arena")
        at.synth_image(diffusers.QwenImageTransformer2DModel, a, config=QWEN, seed=5, threads=1, progress=False)
        at.synth_image("diffusers.QwenImageTransformer2DModel", b, config=QWEN, seed=5, threads=3, progress=False)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            self.assertEqual(fa.read(), fb.read())
        at.synth_image(diffusers.QwenImageTransformer2DModel, c, config=QWEN, seed=6, threads=1, progress=False)
        with open(a, "rb") as fa, open(c, "rb") as fc:
            self.assertNotEqual(fa.read(), fc.read())

    def test_a_tensor_depends_on_seed_and_name_only(self) -> None:
        a, b = self.path("a.arena"), self.path("b.arena")
        at.synth_image(diffusers.WanTransformer3DModel, a, config=WAN, progress=False)
        at.synth_image(diffusers.WanTransformer3DModel, b, config=dict(WAN, num_layers=5, ffn_dim=64),
                       progress=False)
        va, vb = exported(a, self.tmp), exported(b, self.tmp)
        self.assertTrue(torch.equal(va["blocks.1.attn1.to_q.weight"], vb["blocks.1.attn1.to_q.weight"]))
        self.assertFalse(torch.equal(va["blocks.1.attn1.to_q.weight"], va["blocks.2.attn1.to_q.weight"]))

    @slow
    def test_tensors_over_a_piece(self) -> None:
        """A tensor of several generator pieces: its pieces differ, and it is the same
        whatever the threads."""
        from arena_gpu.torch import _synth

        cfg = dict(WAN, num_attention_heads=12, attention_head_dim=128, num_layers=1)  # 1536 x 1536 weights
        a, b = self.path("a.arena"), self.path("b.arena")
        at.synth_image(diffusers.WanTransformer3DModel, a, config=cfg, threads=1, progress=False)
        at.synth_image(diffusers.WanTransformer3DModel, b, config=cfg, threads=4, progress=False)
        va, vb = exported(a, self.tmp), exported(b, self.tmp)
        w = va["blocks.0.attn1.to_q.weight"].view(-1)
        self.assertGreater(w.numel(), _synth.PIECE)
        self.assertFalse(torch.equal(w[:1000], w[_synth.PIECE:_synth.PIECE + 1000]))
        self.assertTrue(all(torch.equal(va[n], vb[n]) for n in va))

    def test_keep_in_fp32(self) -> None:
        """Wan's _keep_in_fp32_modules are float32, as diffusers loads them in bfloat16."""
        m = at.synth_image(diffusers.WanTransformer3DModel, self.path("a.arena"), config=WAN, progress=False)
        dts = {n: p.dtype for n, p in m.named_parameters()}
        self.assertEqual(dts["scale_shift_table"], torch.float32)
        self.assertEqual(dts["condition_embedder.time_embedder.linear_1.weight"], torch.float32)
        self.assertEqual(dts["blocks.0.attn1.to_q.weight"], BF16)


class Fp8(Tmp):
    def test_the_bytes_arena_convert_makes(self) -> None:
        bf16, st = self.path("bf16.arena"), self.path("bf16.safetensors")
        mine, theirs = self.path("fp8.arena"), self.path("convert.arena")
        cfg = dict(WAN, ffn_dim=96, num_layers=4)
        at.synth_image(diffusers.WanTransformer3DModel, bf16, config=cfg, seed=9, progress=False)
        subprocess.run([ARENA_BIN, "export", "-q", bf16, "-o", st], check=True)
        subprocess.run([ARENA_BIN, "convert", "-q", "--quant", "fp8-e4m3-row", st, "-o", theirs], check=True)
        at.synth_image(diffusers.WanTransformer3DModel, mine, config=cfg, seed=9, quant="fp8-e4m3-row",
                       progress=False)
        pa, ma, end_a = header(mine)
        pb, mb, end_b = header(theirs)
        self.assertTrue(any(t["scheme"] == "fp8-e4m3-row" for t in ma["tensors"]), "quantized")
        self.assertNotEqual(ma["source"], mb["source"])  # synth:..., the safetensors file
        ma.pop("source"), mb.pop("source")
        self.assertEqual(ma, mb)
        # the header: all but the manifest's checksum (40..48) and the header's own (4088..)
        self.assertEqual(pa[:40] + pa[48:4088], pb[:40] + pb[48:4088])
        self.assertEqual(end_a, end_b)
        with open(mine, "rb") as fa, open(theirs, "rb") as fb:
            fa.seek(end_a), fb.seek(end_b)
            self.assertEqual(fa.read(), fb.read())  # chunk table and data
        arena.verify(mine, progress=False)


class Memory(Tmp):
    @slow
    def test_host_memory_is_one_block(self) -> None:
        """16 blocks of 34 MB (537 MB in all): the peak over the write is at most one
        block and the writer's and generator's buffers."""
        path = self.path("big.arena")
        code = textwrap.dedent(f"""
            import json, torch, diffusers, arena_gpu.torch as at
            cfg = dict(num_attention_heads=8, attention_head_dim=128, in_channels=4, out_channels=4, text_dim=64,
                       freq_dim=16, ffn_dim=4096, num_layers=16, rope_max_seq_len=32)
            with torch.device("meta"):
                m = diffusers.WanTransformer3DModel.from_config(cfg)
            block = sum(p.numel() * 2 for p in m.blocks[0].parameters())
            total = sum(p.numel() * 2 for p in m.parameters())
            def status(key):
                for line in open("/proc/self/status"):
                    if line.startswith(key):
                        return int(line.split()[1]) * 1024
            open("/proc/self/clear_refs", "w").write("5")  # the high-water mark from here
            before = status("VmRSS:")
            at.synth_image(m, {path!r}, threads=2, progress=False)
            print(json.dumps(dict(block=block, total=total, peak=status("VmHWM:") - before)))
        """)
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"  block {r['block'] / 2**20:.1f} MiB, all {r['total'] / 2**20:.1f} MiB, peak over the write "
              f"{r['peak'] / 2**20:.1f} MiB", file=sys.stderr)
        self.assertGreater(r["total"], 14 * r["block"])
        buffers = 2 * (4 << 20) + (4 << 20) + 2 * (4 << 20) + (24 << 20)  # chunks, carry, pieces, slack
        self.assertLess(r["peak"], r["block"] + buffers, r)
        self.assertLess(r["peak"], r["total"] / 4, r)


class Interrupted(Tmp):
    def test_an_exception_leaves_nothing(self) -> None:
        path = self.path("m.arena")
        seen = []

        def progress(done: int, total: int) -> None:
            seen.append(done)
            if len(seen) == 2:
                raise KeyboardInterrupt

        with self.assertRaises(KeyboardInterrupt):
            at.synth_image(diffusers.WanTransformer3DModel, path, config=WAN, progress=progress)
        self.assertEqual(os.listdir(self.tmp), [])
        with self.assertRaises(arena.Error) as e:  # the quantization asked cannot be: before anything
            at.synth_image(diffusers.WanTransformer3DModel, path, config=WAN, quant="fp9", progress=False)
        self.assertEqual(e.exception.code, "QUANT_UNKNOWN_SCHEME")
        self.assertEqual(os.listdir(self.tmp), [])

    @slow
    def test_a_kill_leaves_nothing(self) -> None:
        path = self.path("m.arena")
        code = textwrap.dedent(f"""
            import sys, time, diffusers, arena_gpu.torch as at
            def progress(done, total):
                print("block", flush=True)
                time.sleep(30)
            at.synth_image(diffusers.WanTransformer3DModel, {path!r}, config={WAN!r}, progress=progress)
        """)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None
            self.assertEqual(p.stdout.readline().strip(), "block")  # a block written
            os.kill(p.pid, signal.SIGKILL)
        finally:
            p.wait()
        time.sleep(0.1)
        self.assertFalse(os.path.exists(path))
        self.assertEqual([n for n in os.listdir(self.tmp) if not n.startswith(".m.arena.tmp-")], [])

    def test_output_exists(self) -> None:
        path = self.path("m.arena")
        open(path, "wb").close()
        with self.assertRaises(arena.Error) as e:
            at.synth_image(diffusers.WanTransformer3DModel, path, config=WAN, progress=False)
        self.assertEqual(e.exception.code, "OUTPUT_EXISTS")
        at.synth_image(diffusers.WanTransformer3DModel, path, config=WAN, force=True, progress=False)
        arena.verify(path, progress=False)


class Command(Tmp):
    """python -m arena_gpu synth-image: a built-in model cut by --set, its summary, its errors."""

    def run_cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "arena_gpu", "synth-image", *args], capture_output=True,
                              text=True)

    @slow
    def test_command(self) -> None:
        r = self.run_cli("--help")
        self.assertEqual(r.returncode, 0)
        for words in ("Disk:", "Memory:", "Time:", "--set KEY=VALUE", "--quant"):
            self.assertIn(words, r.stdout)
        r = self.run_cli("--list")
        self.assertEqual(r.returncode, 0)
        self.assertEqual([line.split()[0] for line in r.stdout.splitlines()],
                         ["wan2.1-t2v-14b", "qwen-image", "flux.1-dev", "umt5-xxl"])
        path = self.path("q.arena")
        cfg = self.path("config.json")
        with open(cfg, "w") as f:
            json.dump(dict(QWEN, num_layers=4), f)
        r = self.run_cli("diffusers.QwenImageTransformer2DModel", "--config", cfg, "--set", "num_layers=2",
                         "--seed", "4", "-o", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("QwenImageTransformer2DModel", r.stdout)
        self.assertIn("peak RSS", r.stdout)
        blocks = [b["name"] for b in arena.inspect(path)["blocks"]]
        self.assertEqual(blocks[1:], ["transformer_blocks.0", "transformer_blocks.1"])
        meta = json.loads(arena.inspect(path)["metadata"]["arena.synth"])
        self.assertEqual((meta["class"], meta["seed"], meta["config"]["num_layers"]),
                         ("diffusers.QwenImageTransformer2DModel", 4, 2))
        r = self.run_cli("diffusers.QwenImageTransformer2DModel", "--config", cfg, "-o", path)
        self.assertEqual(r.returncode, 2)
        self.assertIn("OUTPUT_EXISTS", r.stderr)
        r = self.run_cli("diffusers.NoSuchModel", "-o", self.path("x.arena"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot import diffusers.NoSuchModel", r.stderr)


class Writer(Tmp):
    """arena.ImageWriter's rules: blocks in order, each tensor once, its size."""

    TENSORS = {f"layers.{i}.w": ("BF16", (64, 64)) for i in range(3)}

    def writer(self) -> arena.ImageWriter:
        return arena.ImageWriter(self.path("w.arena"), dict(self.TENSORS, head=("F32", (8,))), label="test")

    def test_blocks_in_order(self) -> None:
        w = self.writer()
        self.assertEqual(w.blocks, [("globals", ["head"])] + [(f"layers.{i}", [f"layers.{i}.w"]) for i in range(3)])
        x = torch.zeros(64, 64, dtype=BF16)
        with self.assertRaises(arena.Error) as e:
            w.put("layers.0.w", x.data_ptr(), x.numel() * 2)
        self.assertEqual(e.exception.code, "USAGE")
        self.assertIn("'head' is not put yet", str(e.exception))
        with self.assertRaises(arena.Error):  # failed: it stays so
            w.put("head", torch.zeros(8).data_ptr(), 32)
        w.abort()
        self.assertEqual(os.listdir(self.tmp), [])

    def test_twice_size_unknown_incomplete(self) -> None:
        for bad in ("twice", "size", "unknown", "incomplete"):
            with self.subTest(bad), self.writer() as w:
                h = torch.arange(8, dtype=torch.float32)
                w.put("head", h.data_ptr(), 32)
                with self.assertRaises(arena.Error) as e:
                    if bad == "twice":
                        w.put("head", h.data_ptr(), 32)
                    elif bad == "size":
                        w.put("layers.0.w", h.data_ptr(), 32)
                    elif bad == "unknown":
                        w.put("layers.9.w", h.data_ptr(), 32)
                    else:
                        w.finish()
                self.assertEqual(e.exception.code, "USAGE", bad)
            self.assertEqual(os.listdir(self.tmp), [], bad)

    def test_whole(self) -> None:
        w = self.writer()
        h = torch.arange(8, dtype=torch.float32)
        w.put("head", h.data_ptr(), 32)
        xs = [torch.full((64, 64), i, dtype=BF16) for i in range(3)]
        for i, x in enumerate(xs):
            w.put(f"layers.{i}.w", x.data_ptr(), x.numel() * 2)
        info = w.finish()
        self.assertEqual((info["n_blocks"], info["n_tensors"]), (4, 4))
        v = exported(self.path("w.arena"), self.tmp)
        self.assertTrue(torch.equal(v["head"], h) and all(torch.equal(v[f"layers.{i}.w"], xs[i]) for i in range(3)))


if __name__ == "__main__":
    unittest.main()
