"""Integers the package passes to the C library are checked against the C type's range.

ctypes cuts an int to the bits of its C type without a word: unchecked,
``acquire(2**64 + 5)`` would acquire block 5 and ``open(depth=2**32 + 1)``
run at depth 1. Every public function that passes an int to libarena
refuses one outside its C type (or at a value the library reads as something
else: ``headroom=2**64 - 1`` is ARENA_ZERO_BYTES) with a ValueError naming the
argument, and the call does nothing. Also the simulated bandwidth's bounds.

usage: python tests/python/test_args.py -v   (with the arena package importable;
tests/python/run_torch.sh runs it with torch, which the dequantize cases use)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import arena_gpu as arena

ROOT = Path(__file__).resolve().parent.parent.parent
FIX = Path(os.environ.get("ARENA_FIXTURES_DIR", ROOT / "fixtures"))
MiB = 1 << 20
U64 = 2**64
U32 = 2**32


def sim(path: str, **kw: Any) -> arena.Arena:
    return arena.open(path, device="sim", **kw)


class Args(unittest.TestCase):
    tmp: str
    img: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="arena-args-")
        cls.img = os.path.join(cls.tmp, "f.arena")
        arena.convert(str(FIX / "tiny_flux.safetensors"), cls.img, progress=False)

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def refused(self, name: str, call: Callable[[], Any]) -> None:
        with self.assertRaises(ValueError) as cm:
            call()
        self.assertIn(name, str(cm.exception))
        self.assertNotIsInstance(cm.exception, arena.Error)  # said by the package, before any C call

    # --- the cases of the report, one by one ---------------------------------------
    def test_block_indices_past_the_c_type(self) -> None:
        with sim(self.img, sim_capacity="16G") as a:
            before = a.block_state(3)
            self.refused("block", lambda: a.block_state(U64 + 3))
            self.assertEqual(a.block_state(3), before)
            a.step_begin()
            self.refused("block", lambda: a.acquire(U64 + 5))
            self.refused("block", lambda: a.release(U64 + 5))
            a.step_end()  # nothing held: block 5 was not acquired

    def test_open_options_past_the_c_type(self) -> None:
        self.refused("vram", lambda: sim(self.img, vram=U64 + 2 * MiB))
        self.refused("depth", lambda: sim(self.img, depth=U32 + 1))
        self.refused("threads", lambda: sim(self.img, threads=-1))
        self.refused("host_budget", lambda: sim(self.img, host_budget=U64))
        # depth 2**32 + 1 was depth 1: the same open with depth 1 succeeds
        with sim(self.img, depth=1):
            pass

    def test_memory_calls_past_the_c_type(self) -> None:
        with sim(self.img, sim_capacity="16G") as a:
            free0 = a.device_memory()[0]
            self.refused("sim_pressure", lambda: a.sim_pressure(U64 + 1))
            self.assertEqual(a.device_memory()[0], free0, "no pressure taken")
            self.refused("set_rest_memory", lambda: a.set_rest_memory(U64 + 1))
            self.refused("sim_rest", lambda: a.sim_rest(U64 + 1))
            self.assertEqual(a.memory()["rest"], 0)

    # --- every public function that passes an int to C ------------------------------
    def test_every_int_argument(self) -> None:
        """Below the C type's least, past its most, and in range (accepted) for each."""
        try:
            import torch
        except ImportError:
            torch = None
        a = sim(self.img, sim_capacity="16G")
        self.addCleanup(a.close)
        q = os.path.join(self.tmp, "q.arena")
        if not os.path.exists(q):
            arena.convert(str(FIX / "tiny_flux.safetensors"), q, quant="fp8-e4m3-row", progress=False)
        aq = sim(q, sim_capacity="16G")
        self.addCleanup(aq.close)
        qname = next(n for n in aq.tensor_names() if aq.tensor_info(n).scheme != "none")
        qi = aq.tensor_info(qname)
        qaddr = aq.block_state(qi.block)[1]
        trace = os.path.join(self.tmp, "t.json")
        src = str(FIX / "tiny_flux.safetensors")
        out = os.path.join(self.tmp, "c.arena")
        # (name in the message, call with the value, too low, too high)
        cases: List[Tuple[str, Callable[[int], Any], int, int]] = [
            ("block", lambda v: a.block_state(v), -1, U64),
            ("block", lambda v: a.keep_host(v), -1, U64 + 1),
            ("block", lambda v: a.coded(v), -1, U64 + 2),
            ("block", lambda v: a.acquire(v), -1, U64 + 1),
            ("stream", lambda v: a.acquire(1, v), -1, U64 + 1),
            ("block", lambda v: a.release(v), -1, U64 + 1),
            ("stream", lambda v: a.release(1, v), -1, U64),
            ("nbytes", lambda v: a.set_rest_memory(v), -1, U64 + 1),
            ("now", lambda v: a.rest_report(v), -1, U64 + 1),
            ("peak", lambda v: a.rest_report(0, v), -1, U64 + 1),
            ("max_events", lambda v: a.trace_begin(trace, v), -1, U64 + 1),
            ("sim_pressure", lambda v: a.sim_pressure(v), -1, U64 + 1),
            ("sim_rest", lambda v: a.sim_rest(v), -1, U64 + 1),
            ("sim_fail_alloc(after)", lambda v: a.sim_fail_alloc(v, 0), -1, U64 + 1),
            ("sim_fail_alloc(count)", lambda v: a.sim_fail_alloc(0, v), -1, U64 + 1),
            ("blocks", lambda v: a.set_schedule([1, v]), -1, U32 + 1),
            ("block_address", lambda v: aq._dequantize(aq.tensor_index(qname), v, 1, None), -1, U64 + qaddr),
            ("dst", lambda v: aq._dequantize(aq.tensor_index(qname), qaddr, v, None), -1, U64 + 1),
            ("index", lambda v: aq._dequantize(v, qaddr, 1, None), -1, U64 + aq.tensor_index(qname)),
            ("rows", lambda v: a._fp8_quantize_rows(1, v, 1, 1, 1, None), -1, U64),
            ("cols", lambda v: a._fp8_quantize_rows(1, 1, v, 1, 1, None), -1, U64),
            ("col_scale", lambda v: a._fp8_quantize_rows(1, 1, 1, 1, 1, None, v), -1, U64),
            ("fp8_transpose(rows)", lambda v: a._fp8_transpose(1, v, 1, 1, None), -1, U64),
            ("fp8_transpose(cols)", lambda v: a._fp8_transpose(1, 1, v, 1, None), -1, U64),
            ("device", lambda v: arena.open(self.img, device=v), -(2**31) - 1, 2**31),
            ("vram", lambda v: sim(self.img, vram=v), -1, U64),
            ("pin_budget", lambda v: sim(self.img, pin_budget=v), -1, U64),
            ("threads", lambda v: sim(self.img, threads=v), -1, U32),
            ("headroom", lambda v: sim(self.img, headroom=v), -1, U64 - 1),  # 2**64 - 1: ARENA_ZERO_BYTES
            ("reserve", lambda v: sim(self.img, reserve=v), -1, U64 - 1),
            ("depth", lambda v: sim(self.img, depth=v), -1, U32),
            ("keep_last", lambda v: sim(self.img, keep_last=v), -1, U32 - 1),  # ARENA_ZERO_COUNT
            ("sim_capacity", lambda v: sim(self.img, sim_capacity=v), -1, U64),
            ("sim_context", lambda v: sim(self.img, sim_context=v), -1, U64),
            ("piece_size", lambda v: sim(self.img, piece_size=v), -1, U64 - 1),  # ARENA_PIECE_AUTO
            ("host_budget", lambda v: sim(self.img, host_budget=v), -1, U64 - 1),  # ARENA_ZERO_BYTES
            ("payback_steps", lambda v: sim(self.img, payback_steps=v), 0, U32),
            ("chunk_size", lambda v: arena.convert(src, out, chunk_size=v, progress=False), -1, U64),
            ("zstd_level", lambda v: arena.convert(src, out, codec="zstd", zstd_level=v, progress=False),
             -(2**31) - 1, 2**31),
            ("threads", lambda v: arena.convert(src, out, threads=v, progress=False), -1, U32 + 1),
            ("threads", lambda v: arena.verify(self.img, threads=v, progress=False), -1, U32 + 1),
            ("size", lambda v: arena.parse_size(v), -1, U64),
        ]
        if torch is not None:
            t = torch.zeros(qi.shape, dtype=torch.bfloat16)
            cases += [
                ("block_address", lambda v: aq.dequantize(qname, v, t), -1, U64 + qaddr),
                ("stream", lambda v: aq.dequantize(qname, qaddr, t, v), -1, U64),
                ("block", lambda v: a.slab(v, 0), -1, U64 + 1),
                ("address", lambda v: a.slab(1, v), -1, U64 + a.block_state(1)[1]),
            ]
        for name, call, low, high in cases:
            for v in (low, high, high * 2**70):
                with self.subTest(argument=name, value=v):
                    self.refused(name, lambda: call(v))
            with self.subTest(argument=name, value="not an int"):
                with self.assertRaises((TypeError, ValueError)) as cm:
                    call(1.5)  # type: ignore[arg-type]
                self.assertIn(name, str(cm.exception))
        self.assertFalse(os.path.exists(out), "a refused convert wrote its output")
        self.assertFalse(os.path.exists(trace), "a refused trace_begin started a trace")
        # in range: the library takes them (its own rules then apply)
        a.step_begin()
        self.assertTrue(a.acquire(1))
        a.release(1)
        a.step_end()
        a.set_rest_memory(0)
        a.sim_pressure(0)
        a.sim_fail_alloc(U64 - 1, 0)
        for kw in (dict(depth=U32 - 1), dict(keep_last=U32 - 2)):
            with self.subTest(in_range=kw):  # the library's own rule: at most 64
                with self.assertRaises(arena.Error) as e:
                    sim(self.img, **kw)
                self.assertEqual(e.exception.code, "USAGE")

    # --- the simulated copy rate ----------------------------------------------------
    def test_sim_bandwidth_bounds(self) -> None:
        """A rate so low that a copy's end lies past any clock (1e-300 B/s: 5e304 s for 50 KiB)
        is refused, as is one past the most; the most is accepted."""
        for bw in (1e-300, 1.0, 999.0, 1.01e15, float("inf"), float("nan"), -1.0):
            with self.subTest(sim_bandwidth=bw):
                with self.assertRaises(arena.Error) as cm:
                    sim(self.img, sim_bandwidth=bw)
                self.assertEqual(cm.exception.code, "USAGE")
                self.assertIn("sim_bandwidth", cm.exception.message)
        for bw in (1e7, 1e15):  # (the least, 1e3, is the backend's test: a load at 1 KB/s takes minutes)
            with self.subTest(sim_bandwidth=bw):
                with sim(self.img, sim_bandwidth=bw, sim_capacity="16G") as a:
                    self.assertEqual(a.backend, "sim")


class SizeGrammar(unittest.TestCase):
    """arena.parse_size reads every size string as the C parser does (common/units.h):
    the cases of tests/sizes.json, which tests/unit/test_units.c checks the C side with."""

    cases: Dict[str, Any]

    @classmethod
    def setUpClass(cls) -> None:
        with open(ROOT / "tests" / "sizes.json", encoding="utf-8") as f:
            cls.cases = json.load(f)

    def test_accepted(self) -> None:
        long = [["0" * 5000 + "1K", "1024"], ["1." + "5" * 5000 + "K", "1592"]]  # past int()'s 4300 digits
        for text, want in self.cases["accepted"] + long:
            with self.subTest(size=text):
                self.assertEqual(arena.parse_size(text), int(want))

    def test_too_large(self) -> None:
        for text in self.cases["too_large"] + ["9" * 5000, "1" + "0" * 5000 + "K"]:
            with self.subTest(size=text):
                with self.assertRaises(ValueError) as cm:
                    arena.parse_size(text, "vram")
                self.assertIn("vram: ", str(cm.exception))
                self.assertIn("2^64 bytes or more", str(cm.exception))

    def test_not_a_size(self) -> None:
        for text in self.cases["not_a_size"]:
            with self.subTest(size=text):
                with self.assertRaises(ValueError) as cm:
                    arena.parse_size(text, "vram")
                self.assertIn("is not a size", str(cm.exception))

    def test_ints_and_none(self) -> None:
        self.assertEqual(arena.parse_size(0), 0)
        self.assertEqual(arena.parse_size(U64 - 1), U64 - 1)
        self.assertIsNone(arena.parse_size(None))
        for bad in (1.5, b"8G", True):
            with self.subTest(value=bad), self.assertRaises(TypeError):
                arena.parse_size(bad)  # type: ignore[arg-type]


if __name__ == "__main__":
    unittest.main()
