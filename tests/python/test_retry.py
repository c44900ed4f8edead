"""A step that runs out of device memory is run again by arena (arena.torch's
_retry), on the simulated device.

torch runs on the CPU here, whose allocator never runs out: the adapter's
test-facing injection (arena_gpu.torch._inject) makes it run out at a chosen
allocation of a chosen step, the way torch on CUDA does (its out-of-memory
observer says what was asked, then torch.OutOfMemoryError), and the sim
backend fails arena's own device allocations on request (Arena.sim_fail_alloc).
torch's memory is modelled in the simulated process (40 KiB held from the
first block on, learned by the engine as on CUDA), and each injected failure
asks for 16 KiB past the limit the plan leaves torch: a real one. Every
output and gradient is compared bit for bit with the plain model's.

usage: python -m unittest tests/python/test_retry.py (as test_torch.py)
"""

from __future__ import annotations

import contextlib
import unittest
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from peft import LoraConfig

import arena_gpu as arena
import arena_gpu.torch as at
from arena_gpu.torch import _inject
from arena_gpu.torch._handle import _fmt_size
from test_torch import IMG, LORA, add_lora, inputs, inputs_t, lora_params, model, same, same_step, train_steps
from tiers import slow

HELD = 40 << 10  # what the modelled torch holds in a step
PAST = 16 << 10  # how far past its limit an injected failure asks


def attach(m: torch.nn.Module, cap: int, mode: str = "sample", **kw: Any) -> Tuple[at.Handle, Dict[str, int]]:
    """m attached on sim under vram=cap with torch's memory modelled: it takes HELD
    at the first single block's call (in the simulated process), and the engine
    learns it as it does on CUDA."""
    h = at.attach(m, IMG, mode=mode, device="sim", sim_capacity="16G", sim_context="24K", vram=cap,
                  learn_rest=True, **kw)
    mem = {"held": 0, "peak": 0}

    def demand(mod: Any, args: Any, kwargs: Any) -> None:
        if mem["held"] < HELD:
            h.arena.sim_rest(HELD)
            mem["held"] = HELD
        mem["peak"] = max(mem["peak"], mem["held"])

    hook = m.single_transformer_blocks[0].register_forward_pre_hook(demand, with_kwargs=True)
    h._restore.append(hook.remove)
    h._rest_memory = lambda: mem["held"]
    h._rest_peak = lambda: mem["peak"]
    h._rest_reset = lambda: mem.update(peak=mem["held"])
    return h, mem


def past_limit(h: at.Handle) -> int:
    """What an allocation asks for that goes 16 KiB past what torch may hold now."""
    return h.arena.memory()["rest_limit"] - HELD + PAST


@contextlib.contextmanager
def retry_warnings() -> Iterator[List[str]]:
    """The OomRetryWarning lines given inside (others are not collected)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        lines: List[str] = []
        yield lines
    lines += [str(w.message) for w in got if issubclass(w.category, arena.OomRetryWarning)]


def grads_of(m: torch.nn.Module, seed: int) -> Dict[str, torch.Tensor]:
    """One forward and backward of a LoRA model (no optimizer): its adapters' gradients."""
    ps = lora_params(m)
    for p in ps.values():
        p.grad = None
    m(**inputs(seed)).sample.float().square().mean().backward()
    return {n: p.grad.clone() for n, p in ps.items()}


class Sampling(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        plain = model(meta=False)
        with torch.no_grad():
            cls.want = [plain(**inputs_t(16, k)).sample for k in range(5)]

    def allocations(self, cap: int, **kw: Any) -> int:
        """The allocations torch makes in step 2's forward (the injection counts them)."""
        m = model()
        h, _ = attach(m, cap, **kw)
        with torch.no_grad(), _inject.oom(h, step=2, at=10**9) as inj:
            for k in range(3):
                m(**inputs_t(16, k))
        h.detach()
        return inj.count

    def sample(self, m: torch.nn.Module, h: at.Handle, inj: _inject.OomInjection) -> None:
        """Five steps under inj, each output the plain model's (self.asked: what each
        step's injected failure asks for)."""
        self.asked: Dict[int, int] = {}
        with torch.no_grad():
            for k in range(5):
                inj.asked = past_limit(h)
                self.asked[k] = inj.asked
                with inj:
                    out = m(**inputs_t(16, k)).sample
                self.assertTrue(torch.equal(out, self.want[k]), f"step {k}")
        h.end_step()

    @slow
    def test_runs_out_in_a_forward_and_is_run_again(self) -> None:
        """torch runs out at the first, a middle and the last allocation of step 2's
        forward: arena ends the step (the need learned: weights demoted at once), runs
        the forward again, and every output is the plain model's; one warning, one
        record (in retries() and in that step's stats()). Resident at first (800K),
        streaming already (400K), in pieces or whole blocks."""
        for cap, kw in ((800 << 10, {}), (400 << 10, {}), (800 << 10, {"piece_size": 0})):
            n = self.allocations(cap, **kw)
            self.assertGreater(n, 100)
            for at_ in (1, n // 2, n):
                with self.subTest(cap=cap, at=at_, **kw):
                    m = model()
                    h, _ = attach(m, cap, **kw)
                    inj = _inject.oom(h, step=2, at=at_)
                    with retry_warnings() as lines:
                        self.sample(m, h, inj)
                    self.assertEqual(inj.fired, 1)
                    self.assertEqual(len(lines), 1, lines)
                    self.assertIn("step 2: torch ran out of device memory", lines[0])
                    self.assertIn("running it again (1 of 2)", lines[0])
                    r, = h.retries()
                    self.assertEqual((r["step"], r["where"], r["ran_out"], r["attempt"], r["outcome"]),
                                     (2, "forward", "torch", 1, "ok"))
                    self.assertEqual((r["asked"], r["held"]), (self.asked[2], HELD))
                    self.assertGreater(r["room_after"], r["room_before"])
                    st = h.stats()
                    if cap < 800 << 10:
                        self.assertGreater(st[1]["streamed_bytes"], 0, "streaming before it ran out")
                    self.assertEqual([s["oom_retries"] for s in st if s["step"] != 2], [[]] * (len(st) - 1))
                    self.assertEqual(st[2]["oom_retries"], [r])
                    if r["gave"]:  # weights demoted for the need: from the retried step on
                        self.assertGreater(st[2]["demotions"], 0)
                        self.assertLess(st[3]["resident_bytes"], st[1]["resident_bytes"])
                    h.detach()

    def test_twice_in_a_forward(self) -> None:
        """Running out again in the retried forward: arena gives more (the headroom lent
        until the step ends) and runs it a third time."""
        m = model()
        h, _ = attach(m, 800 << 10)
        inj = _inject.oom(h, step=2, at=30, times=2)
        with retry_warnings() as lines:
            self.sample(m, h, inj)
        self.assertEqual(inj.fired, 2)
        self.assertEqual(len(lines), 2)
        self.assertEqual([(r["attempt"], r["outcome"]) for r in h.retries()], [(1, "ran out again"), (2, "ok")])
        self.assertGreater(h.retries()[1]["lent"], 0)
        h.detach()

    def test_arena_allocation_fails_at_the_retry(self) -> None:
        """arena's own device allocation fails when the retry's new plan places its ring
        (the device had not the memory): the step ends without the ring and the step
        begun again places it; the output is the plain model's. Failing there once more
        too, the retry cannot run: DEV_OOM, saying so, and once the device has the memory
        the module runs as ever."""
        for fails in (1, 2):
            with self.subTest(fails=fails):
                m = model()
                h, _ = attach(m, 800 << 10)
                inj = _inject.oom(h, step=2, at=30)
                with torch.no_grad():
                    for k in range(5):
                        inj.asked = past_limit(h)
                        if k == 2:
                            self.assertEqual(h.plan()["n_streamed"], 0, "resident: the retry's plan makes a ring")
                            h.arena.sim_fail_alloc(0, fails)
                        with retry_warnings(), inj:
                            if k == 2 and fails == 2:
                                with self.assertRaises(arena.Error) as cm:
                                    m(**inputs_t(16, k))
                                self.assertEqual(cm.exception.code, "DEV_OOM")
                                self.assertIn("no room for the ring of streamed blocks", cm.exception.message)
                                self.assertIn("an injected failure", cm.exception.message)
                                continue
                            out = m(**inputs_t(16, k)).sample
                        self.assertTrue(torch.equal(out, self.want[k]), f"step {k}")
                self.assertEqual(inj.fired, 1)
                self.assertEqual(h.retries()[0]["outcome"], "ok" if fails == 1 else "raised")
                h.detach()

    def test_a_failure_that_cannot_be_helped(self) -> None:
        """torch runs out at every run (injected each time), or asks for more than the
        cap: arena runs the forward again twice, no more, then raises DEV_OOM with what
        torch held and asked; the module is as it was and the next steps are the plain
        model's."""
        for asked in (None, 4 << 20):
            with self.subTest(asked=asked):
                m = model()
                h, _ = attach(m, 800 << 10)
                with torch.no_grad():
                    for k in range(2):
                        self.assertTrue(torch.equal(m(**inputs_t(16, k)).sample, self.want[k]))
                    inj = _inject.oom(h, at=30, times=None, asked=asked or past_limit(h))
                    with retry_warnings() as lines, inj, self.assertRaises(arena.Error) as cm:
                        m(**inputs_t(16, 2))
                    self.assertEqual(inj.fired, 3, "the first run and two more")
                    self.assertEqual(len(lines), 2)
                    e = cm.exception
                    self.assertEqual(e.code, "DEV_OOM")
                    self.assertIsInstance(e.__cause__, torch.OutOfMemoryError)
                    self.assertIn("torch ran out of device memory in a step: it held 40.00 KiB", e.message)
                    self.assertIn(f"asked for {_fmt_size(inj.asked)} more", e.message)
                    self.assertIn("arena ran it again 2 time(s)", e.message)
                    self.assertEqual([r["outcome"] for r in h.retries()], ["ran out again"] * 2 + ["raised"])
                    for k in range(2, 5):
                        self.assertTrue(torch.equal(m(**inputs_t(16, k)).sample, self.want[k]), k)
                h.detach()

    def test_nothing_more_to_give(self) -> None:
        """Without a cap and without torch's need learned (no learn_rest), a step end
        frees nothing: arena does not run the forward again (it would run out again),
        and says so."""
        m = model()
        h = at.attach(m, IMG, device="sim", sim_capacity="16G")
        with torch.no_grad(), retry_warnings() as lines, _inject.oom(h, at=30) as inj:
            with self.assertRaises(arena.Error) as cm:
                m(**inputs_t(16))
        self.assertEqual(inj.fired, 1)
        self.assertEqual(lines, [])
        self.assertIn("arena could give torch no more room to run it again in", cm.exception.message)
        self.assertEqual(h.retries()[0]["outcome"], "raised")
        with torch.no_grad():
            self.assertTrue(torch.equal(m(**inputs_t(16)).sample, self.want[0]))
        h.detach()

    def test_randomness_replays(self) -> None:
        """Dropout inside the forward (a module in train mode without autograd), and the
        forward runs out at its last allocation, after the dropout drew: the run again
        draws what the first drew, so the output is the undisturbed one."""
        n = self.allocations(800 << 10)
        outs = []
        for fail in (False, True):
            m = model()
            h, _ = attach(m, 800 << 10)
            m.train()
            m.transformer_blocks[0].ff.net.insert(1, torch.nn.Dropout(0.5))
            torch.manual_seed(7)
            with torch.no_grad():
                for k in range(3):
                    inj = _inject.oom(h, step=2, at=n, times=1 if fail else 0, asked=past_limit(h))
                    with retry_warnings(), inj:
                        out = m(**inputs_t(16, k)).sample
            self.assertEqual(inj.fired, int(fail))
            self.assertFalse(torch.equal(out, self.want[2]), "the dropout drew")
            outs.append(out)
            h.detach()
        self.assertTrue(torch.equal(outs[0], outs[1]))


class Training(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        m = model(meta=False)
        add_lora(m)
        cls.want = train_steps(m, 3)
        m = model(meta=False)
        add_lora(m)
        cls.want_plain = train_steps(m, 3, checkpointing=False)

    def train(self, cap: int, where: str, at_: int, times: Optional[int] = 1, checkpointing: bool = True,
              **kw: Any) -> Tuple[at.Handle, Any, _inject.OomInjection, List[str]]:
        m = model()
        h, _ = attach(m, cap, mode="train", **kw)
        add_lora(m)
        inj = _inject.oom(h, step=1, at=at_, where=where, times=times)

        def each() -> None:
            inj.asked = past_limit(h)

        each()
        with retry_warnings() as lines, inj:
            got = train_steps(m, 3, each=each, checkpointing=checkpointing)
        h.end_step()
        return h, got, inj, lines

    def test_runs_out_in_a_forward(self) -> None:
        """A training step's forward runs out (checkpointed, or not: the weights it saves
        kept as references; its saved tensors in host memory): the partial graph goes
        with the exception, arena's holds and hooks of it with the step, and the forward
        run again gives the plain model's gradients bit for bit."""
        for at_, kw, ckpt in ((1, {}, True), (200, {}, True), (200, {"piece_size": 0}, True),
                              (200, {}, False), (200, {"offload_saved": 1}, True)):
            with self.subTest(at=at_, checkpointing=ckpt, **kw):
                h, got, inj, lines = self.train(800 << 10, "forward", at_, checkpointing=ckpt, **kw)
                same_step(self, got, self.want if ckpt else self.want_plain)
                self.assertEqual(inj.fired, 1)
                self.assertEqual(len(lines), 1)
                r, = h.retries()
                self.assertEqual((r["where"], r["outcome"]), ("forward", "ok"))
                h.detach()

    def test_runs_out_in_a_recompute(self) -> None:
        """The recompute of a checkpointed block runs out inside the backward: arena runs
        that block's call again where it stands (the checkpoint's tensors saved since
        its start forgotten, the random states of its start), and the backward completes
        with the plain model's gradients; in pieces and in whole blocks."""
        for at_, kw in ((1, {}), (40, {}), (40, {"piece_size": 0})):
            with self.subTest(at=at_, **kw):
                h, got, inj, lines = self.train(800 << 10, "recompute", at_, **kw)
                same_step(self, got, self.want)
                self.assertEqual(inj.fired, 1)
                self.assertEqual(len(lines), 1)
                self.assertIn("in the recompute", lines[0])
                r, = h.retries()
                self.assertEqual((r["step"], r["where"], r["outcome"]), (1, "recompute", "ok"))
                self.assertGreater(r["lent"], 0, "inside a backward: the headroom lent")
                h.detach()

    def test_dropout_replays_in_a_recompute(self) -> None:
        """The adapters' dropout draws in the forward and again in the recompute (the
        checkpoint replays the forward's random states); a recompute that runs out after
        its dropouts drew is run again from the states of its start: the plain model's
        gradients."""
        cfg = LoraConfig(**{**LORA.to_dict(), "lora_dropout": 0.5})
        m = model(meta=False)
        add_lora(m, cfg)
        want = train_steps(m, 3)
        m = model()
        h, _ = attach(m, 800 << 10, mode="train")
        add_lora(m, cfg)
        inj = _inject.oom(h, step=1, at=40, where="recompute")

        def each() -> None:
            inj.asked = past_limit(h)

        each()
        with retry_warnings(), inj:
            got = train_steps(m, 3, each=each)
        self.assertEqual(inj.fired, 1)
        same_step(self, got, want)
        self.assertNotEqual(same(got[1], self.want[1]), [], "the dropout drew")
        h.detach()

    def test_a_recompute_that_cannot_be_helped(self) -> None:
        """A recompute that runs out each time: run again once (the headroom lent), then
        DEV_OOM out of the backward; the module goes on: the next step's gradients are
        the plain model's for the same adapter weights."""
        m = model()
        h, _ = attach(m, 800 << 10, mode="train")
        add_lora(m)
        m.enable_gradient_checkpointing()
        m.train()
        ref = model(meta=False)
        add_lora(ref)
        ref.enable_gradient_checkpointing()
        ref.train()
        self.assertEqual(same(grads_of(m, 0), grads_of(ref, 0)), [])
        inj = _inject.oom(h, at=10, where="recompute", times=None, asked=past_limit(h))
        with retry_warnings() as lines, inj, self.assertRaises(arena.Error) as cm:
            grads_of(m, 1)
        self.assertEqual(cm.exception.code, "DEV_OOM")
        self.assertEqual(inj.fired, 2)
        self.assertEqual(len(lines), 1)
        self.assertEqual([r["outcome"] for r in h.retries()], ["ran out again", "raised"])
        self.assertEqual(same(grads_of(m, 2), grads_of(ref, 2)), [])
        h.detach()


if __name__ == "__main__":
    unittest.main()
