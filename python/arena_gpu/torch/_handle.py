"""The handle ``attach`` returns (steps, sampling inside training, traces,
statistics, ``detach``) and the trace it records."""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import torch
from torch import nn

from .. import Arena, Error
from ._blocks import _BlockBinding, _in_backward
from ._guards import _guard_merge, _peft_tuners
from ._offload import _SavedOffload
from ._pieces import _PiecedBinding
from . import _fp8


class Handle:
    """What ``attach`` returns: the binding of a module to an arena."""

    def __init__(self) -> None:
        self.arena: Arena
        self.module: Any  # the module, or the pipeline (its components bound)
        self._device: torch.device  # the arena's device (set when bound)
        self._owns_arena = False
        self._step_open = False
        # Units held for a backward (whole blocks; blocks in pieces with loose pieces),
        # released when their block's backward has run, or at the step's end.
        self._bw_units: Dict[int, _BlockBinding] = {}
        self._bw_groups: Set[_PiecedBinding] = set()
        self._active = 0  # block calls in progress
        # The modules bound, each with the prefix of its names in the image (a
        # pipeline's components: "text_encoder.", ...; one module: ""). A step is
        # the calls of one of them: a call of another (its forward, or a block of
        # it, as a VAE's decode) ends the step and begins the next.
        self._roots: List[Tuple[str, nn.Module]] = []
        self._step_comp = ""
        # The order each component's blocks run in: from the module at attach
        # (_orders), then as the engine learned it from the component's steps
        # (_scheds, by component and mode); set as the engine's schedule before a
        # step of another component than the last (arena_schedule_set).
        self._orders: Dict[str, List[int]] = {}
        self._scheds: Dict[Tuple[str, str], List[int]] = {}
        self._sched_key: Optional[Tuple[str, str]] = None
        self._hooks: List[Any] = []
        self._whole: Dict[int, _BlockBinding] = {}  # whole blocks, by arena block
        self._pieced: List[_PiecedBinding] = []  # blocks in pieces
        self._module_of: Dict[int, nn.Module] = {}
        self._restore: List[Callable[[], None]] = []
        self._names: Dict[int, str] = {}
        self._zeros: Dict[torch.dtype, torch.Tensor] = {}
        self._all_resident = False
        self._resident_at: Dict[int, int] = {}
        self._guarded: Set[int] = set()
        # A module was registered somewhere since the last look (torch's global
        # registration hook, from attach to detach: peft adding adapters): the
        # roots are walked for new tuners then, not at every step (FLUX.1-dev
        # with LoRA has some 3,000 modules, a few ms of the host's time a walk).
        self._modules_changed = True
        # Each block module's parameters (adapters' included), listed once: walking
        # a Flux block's modules at every call took ~0.25 ms of the host's time a
        # block. Listed again when modules were registered (_guard_new_tuners).
        self._param_lists: Dict[int, List[nn.Parameter]] = {}
        self._attached = False
        self._tracing = False
        self._trace_left: Optional[int] = None
        # The device memory the rest of the process holds (torch's allocator on
        # CUDA; None: nothing to say, as on sim, whose tensors are host memory).
        self._rest_memory: Callable[[], Optional[int]] = self._torch_reserved
        # ... and the most it held since the last report (its peak statistics are
        # reset at each report).
        self._rest_peak: Callable[[], Optional[int]] = self._torch_peak
        self._rest_reset: Callable[[], None] = self._torch_reset
        self._offload: Optional[_SavedOffload] = None
        # vram given on CUDA: torch's allocator is held to what arena's plan leaves it
        # in a step (its per-process memory fraction), as on a card of that size; the
        # fraction it had before attach comes back at detach.
        self._cap = 0
        self._fraction0: Optional[float] = None
        self._work = 0  # the work key of the step in progress
        self._oom_asked = 0
        self._compile_probe: List[nn.Module] = []  # the root and whole blocks: compiled or not
        self._oom_need = 0  # torch ran out in this step: what it held and asked for
        # A call that ran out, run again (_retry): the forwards and recomputes being
        # run so (the outermost runs again), the headroom lent torch until the step
        # ends, and a record of each retry (retries()).
        self._fwd_depth = 0
        self._rc_depth = 0
        self._lent = 0
        self._retries: List[Dict[str, Any]] = []
        self._fp8_compute: Any = "auto"  # attach's fp8_compute (_quant.fp8_native)
        self._copy_bytes = 0  # the largest block's dequantized copies (bytes): _copy_floor
        # from_pretrained and offload: the cache's entry the image is (arena_gpu._cache.CacheEntry:
        # its image, whether this call made it, its size); None when attach was given the image.
        self.cache_entry: Any = None

    def _torch_reserved(self) -> Optional[int]:
        if self._device.type != "cuda":
            return None
        return int(torch.cuda.memory_reserved(self._device))

    def _torch_peak(self) -> Optional[int]:
        if self._device.type != "cuda":
            return None
        return int(torch.cuda.max_memory_reserved(self._device))

    def _torch_reset(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._device)

    # --- the process's device memory -------------------------------------------------
    def _work_key(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> int:
        """A key for what a step of the module needs beside the weights: the mode,
        autograd, training, compiled blocks and the inputs' shapes and dtypes.
        Steps with the same key need the same memory (the engine learns each key's)."""
        parts: List[Any] = [self.arena.mode, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                            module.training, self._offload is not None, id(module)]
        for m in self._compile_probe:
            parts.append(m.__dict__.get("_compiled_call_impl") is not None)

        def add(k: Any, v: Any) -> None:
            if isinstance(v, torch.Tensor):
                parts.append((k, tuple(v.shape), v.dtype, v.requires_grad))
            elif isinstance(v, (list, tuple)):
                for i, x in enumerate(v):
                    if isinstance(x, torch.Tensor):
                        parts.append((k, i, tuple(x.shape), x.dtype, x.requires_grad))

        for i, a in enumerate(args):
            add(i, a)
        for k, v in kwargs.items():
            add(k, v)
        return (hash(tuple(parts)) & 0xFFFFFFFFFFFFFFFF) or 1

    def _report(self, work: int) -> None:
        """Tell the engine what torch held (now, and its peak since the last report)
        and the next step's work; then start torch's peak anew."""
        _fp8.forget_rows()  # (the native products' last input's rows: not torch's memory to keep)
        now = self._rest_memory()
        if now is None:
            return
        # The dequantized copies of the blocks being run are torch's memory in every
        # step: said from the first step of a work on, before their peak is learned
        # (the first step of a work not seen yet leaves torch only what is past the
        # weights' smallest plan, which knows nothing of them).
        now = max(now, self._copy_floor())
        peak = max(self._rest_peak() or now, now, self._oom_need)
        self.arena.rest_report(now, peak, work, oom=self._oom_need > 0)
        self._oom_need = 0
        self._rest_reset()

    def _copy_floor(self) -> int:
        """What torch holds at least in a step for the dequantized copies: the largest
        block's (sampling), two blocks' (training: a recomputed block is held until its
        backward, past the next one's recompute)."""
        return self._copy_bytes * (2 if self.arena.mode == "train" else 1)

    def _limit_torch(self) -> None:
        """vram given: torch's allocator may hold what the plan leaves it in a step
        (the engine's rest_limit: vram less the context, arena's memory and half the
        headroom), so the process stays within vram as on a card of that size."""
        if not self._cap or self._device.type != "cuda":
            return
        lim = self.arena.memory()["rest_limit"] + self._lent
        total = torch.cuda.mem_get_info(self._device)[1]
        torch.cuda.set_per_process_memory_fraction(min(1.0, max(0.0, lim / total)), self._device)

    def _oom(self, asked: int) -> None:
        """torch ran out of device memory (its allocator's observer): the step needed
        what it held and what it asked for; the next step of this work plans for it."""
        held = self._rest_memory() or 0
        self._oom_need = max(self._oom_need, held + asked)
        self._oom_asked = asked

    def _lend(self) -> int:
        """Under a cap, torch may hold the half of the headroom that the plan keeps
        from it, until the step ends (a retry's last room): the bytes lent."""
        self._lent = self.arena.memory()["headroom"] // 2
        self._limit_torch()
        return self._lent

    def _oom_error(self, e: BaseException, asked: Optional[int] = None, held: Optional[int] = None,
                   need: Optional[int] = None, retried: Optional[int] = None, why: Optional[str] = None) -> Error:
        """torch's out of memory inside a step of the module, said in arena's terms
        (its numbers as they were when it ran out, where given; and, ``retried`` given,
        how arena's retries went: _retry)."""
        from ._retry import _retried

        mi = self.arena.memory()
        asked = self._oom_asked if asked is None else asked
        held = (self._rest_memory() or 0) if held is None else held
        need = max(self._oom_need, held + asked) if need is None else need
        if mi["cap"]:
            where = (f"under vram={_fmt_size(mi['cap'])} torch may hold {_fmt_size(mi['rest_limit'])} in a step "
                     f"(arena holds {_fmt_size(mi['arena'])}, the process's context {_fmt_size(mi['other'])})")
        else:
            free, total = self.arena.device_memory()
            where = (f"the device ({_fmt_size(total)}) had {_fmt_size(free)} free, arena holding "
                     f"{_fmt_size(mi['arena'])}")
        if retried is not None:
            where += f"; {_retried(retried, why)}"
        return Error("DEV_OOM",
                     f"{self.arena.path}: torch ran out of device memory in a step: it held {_fmt_size(held)} and "
                     f"asked for {_fmt_size(asked)} more; {where}. The next step of this work leaves torch "
                     f"{_fmt_size(need)}: run it again (the arena and the module are as they were), or give more "
                     f"vram, a smaller batch or resolution, or offload_saved=True when training",
                     error_class="system")

    # --- steps ---------------------------------------------------------------------
    def _stream(self) -> Optional[int]:
        if self.arena.backend == "sim":
            return None
        return torch.cuda.current_stream(self._device).cuda_stream

    def _release_deferred(self) -> None:
        for u in list(self._bw_units.values()):
            u.release_bw(at_step_end=True)
        self._bw_groups.clear()
        for pb in self._pieced:
            pb.release_all()
        for hk in self._hooks:
            hk.remove()
        self._hooks.clear()

    def _watch(self, grads: List[torch.Tensor], done: Callable[[], None]) -> None:
        # When every gradient in grads is made (a block's parameters'), the backward
        # kernels that needed its weights are queued: its holds can go.
        hk = torch.autograd.graph.register_multi_grad_hook(grads, lambda _g: done(), mode="all")
        self._hooks.append(hk)

    def _enter(self, comp: str, backward: bool) -> None:
        """A block of component ``comp`` is about to run: begin a step if none is open;
        a block of another component than the step's, in a forward with nothing held,
        ends it and begins the next (a pipeline's VAE decode after denoising)."""
        if not self._step_open:
            self._use_order(comp)
            self._begin_step()
            self._step_comp = comp
        elif comp != self._step_comp and not backward and not self._active and not self._bw_units \
                and not self._bw_groups:
            self._end_step(self._comp_work(comp))
            self._use_order(comp)
            self._begin_step()
            self._step_comp = comp

    def _use_order(self, comp: str) -> None:
        """Between steps, before a step of ``comp``: the engine's schedule is the order
        its blocks ran in the last time (or, never run, the module's order) when the
        step before was another component's or mode's; the schedule the engine has
        now (learned from the steps that ended) is kept for those."""
        key = (comp, self.arena.mode)
        if key == self._sched_key:
            return
        if self._sched_key is not None:
            self._scheds[self._sched_key] = self.arena.schedule()
        self._sched_key = key
        want = self._scheds.get(key)
        if want is None:
            order = self._orders.get(comp)
            if not order:
                return
            want = order + order[::-1] if key[1] == "train" else list(order)
        self.arena.set_schedule(want)

    def _comp_work(self, comp: str) -> int:
        """The work key of a step begun by a block of ``comp`` (no forward call to key it by)."""
        return (hash(("component", comp, self.arena.mode, torch.is_grad_enabled())) & 0xFFFFFFFFFFFFFFFF) or 1

    def _begin_step(self) -> None:
        self.arena.step_begin()
        self._step_open = True
        # When the plan streams nothing (everything fits), blocks need no
        # acquire: their device addresses hold until a step end changes the plan.
        was = self._resident_at if self._all_resident else None
        self._all_resident = self.arena.plan()["n_streamed"] == 0
        if self._all_resident:
            idx = list(self._whole) + [i for pb in self._pieced for i in pb.pieces]
            self._resident_at = {i: self.arena.block_state(i)[1] for i in idx}
        if was is not None and (not self._all_resident or self._resident_at != was):
            # Bound where they were resident, and never released since: their weights
            # read nothing until each is bound again (the plan moved them).
            for u in list(self._whole.values()) + [b for pb in self._pieced for b in pb.pieces.values()]:
                u.drop()
        if self._all_resident:
            if self._resident_at != was:
                # The plan changed at the last step end: blocks promoted then are
                # being copied to the device still. An acquire makes torch's stream
                # wait for each block's copy (the host, on sim) before the bound
                # addresses are used.
                st = self._stream()
                for i in idx:
                    self.arena.acquire(i, st)
                    self.arena.release(i, st)

    def _end_step(self, work: int = 0) -> None:
        """End the step in progress (telling the engine what torch held in it and
        the next step's work), or, between steps, tell it the next step's work."""
        if self._offload is not None:
            self._offload.end()
        if self._step_open:
            self._release_deferred()
            self._step_open = False
            self._report(work)
            try:
                self.arena.step_end()
            except Error as e:
                # The engine could not place its ring (the device has not the memory
                # now): the step ended, and the next step's begin places it or says so.
                if e.code != "DEV_OOM":
                    raise
            self._lent = 0
            self._limit_torch()
            if self._tracing and self._trace_left is not None:
                self._trace_left -= 1
                if self._trace_left <= 0:
                    self._trace_stop()
        elif work and work != self._work:
            self._report(work)
            self._limit_torch()
        if work:
            self._work = work

    def _trace_stop(self) -> None:
        if self._tracing:
            self._tracing = False
            self.arena.trace_end()

    def _root_pre_hook(self, module: nn.Module, args: Any, kwargs: Dict[str, Any]) -> None:
        if _in_backward() or self._active:
            return
        self._guard_new_tuners()
        self._end_step(self._work_key(module, args, kwargs))
        comp = next((p for p, m in self._roots if m is module), "")
        self._use_order(comp)
        self._begin_step()
        self._step_comp = comp
        if self._offload is not None:
            self._offload.begin(torch.is_grad_enabled())

    def _root_post_hook(self, module: nn.Module, args: Any, out: Any) -> None:
        if self._offload is not None and not _in_backward():
            self._offload.end()

    def _params_of(self, index: int) -> List[nn.Parameter]:
        ps = self._param_lists.get(index)
        if ps is None:
            ps = self._param_lists[index] = list(self._module_of[index].parameters())
        return ps

    def _guard_new_tuners(self) -> None:
        # Adapters added after attach get the same guard against merges.
        if not self._modules_changed:
            return
        self._modules_changed = False
        self._param_lists.clear()
        for prefix, r in self._roots:
            for name, tuner in _peft_tuners(r).items():
                if id(tuner) not in self._guarded:
                    _guard_merge(self, prefix + name, tuner)

    def _watch_registrations(self) -> None:
        """From now until detach, a module registered anywhere in the process (torch
        calls the hook for every submodule set or added) marks the roots for
        _guard_new_tuners' walk. The hook holds the handle weakly: torch's global
        table does not keep one let go without detach alive."""
        ref = weakref.ref(self)

        def registered(_parent: nn.Module, _name: str, _sub: Any) -> None:
            h = ref()
            if h is not None:
                h._modules_changed = True

        hk = nn.modules.module.register_module_module_registration_hook(registered)
        self._restore.append(hk.remove)

    def end_step(self) -> None:
        """End the step in progress now (the next forward would otherwise do it)."""
        self._end_step()

    # --- public ----------------------------------------------------------------------
    @contextlib.contextmanager
    def sampling(self) -> Iterator["Handle"]:
        """Run sample steps inside training (previews) and go back: ``with h.sampling(): pipe(...)``."""
        self._end_step()
        prev = self.arena.mode
        self._set_mode("sample")
        try:
            yield self
        finally:
            self._end_step()
            self._set_mode(prev)

    def _set_mode(self, mode: str) -> None:
        # The other mode's steps need their own memory: what torch cached for this
        # one goes back to the device first (else it holds on to it, and arena
        # cannot have it), and torch's limit follows the new plan.
        if self._device.type == "cuda" and self.arena.mode != mode:
            torch.cuda.empty_cache()
            self._report(0)
        self.arena.set_mode(mode)
        self._limit_torch()

    def trace(self, path: str, steps: Optional[int] = None, max_events: int = 0) -> "Trace":
        """Record what the device does, step by step, into ``path``: a Chrome trace-event
        JSON file (open it in https://ui.perfetto.dev; tracks in docs/CLI.md): every
        block's copy and its work on torch's stream, stalls, step boundaries.

        The trace starts between steps (a step in progress is ended first) and is
        written when ``steps`` steps have ended (a step ends when the next forward
        starts, or at ``end_step()``), when ``stop()`` is called, or at the end of a
        ``with h.trace(path):`` block. ``max_events``: records kept (0: 65536).
        When the whole model is resident the adapter acquires no blocks, so the
        trace holds the steps only."""
        if self._tracing:
            raise Error("USAGE", f"{path}: a trace is being recorded already: stop() it first")
        if steps is not None and steps < 1:
            raise ValueError(f"steps: {steps}: at least 1")
        self._end_step()
        self.arena.trace_begin(path, max_events)
        self._tracing = True
        self._trace_left = steps
        return Trace(self, path)

    def stats(self) -> List[Dict[str, Any]]:
        """The engine's per-step records: resident/streamed bytes, misses, stalls, ...;
        and ``oom_retries``: the records of ``retries()`` of calls that ran out in that
        step (a forward's: the step its failed run ended; empty for most steps)."""
        recs = self.arena.stats()
        by: Dict[int, List[Dict[str, Any]]] = {}
        for r in self._retries:
            by.setdefault(r["step"], []).append(dict(r))
        for s in recs:
            s["oom_retries"] = by.get(s["step"], [])
        return recs

    def retries(self) -> List[Dict[str, Any]]:
        """A record of each time a call of the module ran out of device memory and arena
        gave torch what it could to run it again (the latest 1024, oldest first):
        ``step`` (the engine's step the failed run was in), ``where`` ("forward", or
        "recompute": a checkpointed block in a backward), ``ran_out`` ("torch", or
        "arena": its own device allocation), ``asked`` and ``held`` (torch's bytes when
        it ran out; 0 where unknown), ``room_before``/``room_after`` (the bytes torch
        may have in the step before and after arena gave: under vram the limit the
        plan leaves it, else the device's free memory and torch's cache unused),
        ``gave`` (bytes of weights arena demoted), ``lent`` (headroom lent torch until
        the step's end), ``attempt`` (1, 2, ...) and ``outcome``: "ok" (run again and
        it completed), "ran out again" (the next record follows), "retried" (run
        again, in progress) or "raised" (arena could give no more room, or the
        retries were spent: DEV_OOM raised)."""
        return [dict(r) for r in self._retries]

    def decisions(self) -> List[Dict[str, Any]]:
        """Each change of the plan so far, oldest first (:meth:`arena.Arena.decisions`):
        the step, why (``"learned"``, ``"pressure"``, ``"yield"``, ``"need"``, ``"oom"``,
        ``"mode"``, ``"schedule"``, ``"profile"``, ``"replan"``), the blocks and bytes
        promoted and demoted, and the step predicted before and after."""
        return self.arena.decisions()

    def plan(self) -> Dict[str, Any]:
        return self.arena.plan()

    def offload_stats(self) -> Dict[str, int]:
        """The last forward's saved tensors kept in host memory (``offload_saved``):
        ``tensors`` and ``bytes`` copied to the host, and how many came back
        ``fetched_ahead`` (before the backward needed them) or ``fetched_late``
        (when it did: on torch's stream, the compute waiting). All 0 without
        ``offload_saved``."""
        if self._offload is None:
            return _SavedOffload._zero()
        return self._offload.stats()

    def detach(self) -> nn.Module:
        """Return the module to a plain state: its classes, hooks and methods as they
        were; its bound parameters become empty meta tensors of the same shape and
        dtype (the weights were arena's); closes the arena if attach opened it."""
        if not self._attached:
            return self.module
        try:
            self._end_step()
            self._trace_stop()
        finally:
            if self._fraction0 is not None:
                torch.cuda.set_per_process_memory_fraction(self._fraction0, self._device)
                self._fraction0 = None
            for undo in reversed(self._restore):
                undo()
            self._restore.clear()
            self._attached = False
            if self._owns_arena:
                self.arena.close()
        return self.module

    def __repr__(self) -> str:
        """What is attached to which image, and how: the mode, vram, the device, the
        blocks streamed (``<arena.torch.Handle FluxTransformer2DModel to 'flux.arena':
        sample, vram 8.00 GiB, cuda:0, 57 blocks, 31 streamed>``)."""
        module = self.__dict__.get("module")
        what = type(module).__name__
        comps = sorted(p[:-1] for p, _ in self._roots if p)
        if comps:
            what += f" ({', '.join(comps)})"
        arena = self.__dict__.get("arena")
        head = f"<arena.torch.Handle {what} to {arena.path if arena is not None else None!r}"
        if not self._attached or arena is None or arena.closed:
            return head + ": detached>"
        try:
            cap = arena.memory()["cap"]
            p = arena.plan()
            vram = f"vram {_fmt_size(cap)}" if cap else "vram: what the device has free"
            where = "sim" if arena.backend == "sim" else arena.device
            return (f"{head}: {arena.mode}, {vram}, {where}, {p['n_resident'] + p['n_streamed']} blocks, "
                    f"{p['n_streamed']} streamed>")
        except Error as e:  # (a repr says what it can)
            return f"{head}: {e.message}>"

    def _pname(self, p: torch.Tensor) -> str:
        return self._names.get(id(p), "?")

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()


class Trace:
    """A trace being recorded (``Handle.trace``): ``stop()`` writes it; as a context
    manager, the end of the block ends the step in progress and writes it."""

    def __init__(self, handle: Handle, path: str):
        self.handle = handle
        self.path = path

    @property
    def active(self) -> bool:
        return self.handle._tracing

    def stop(self) -> None:
        """End the step in progress and write the trace (nothing when it was written already)."""
        if self.handle._tracing:
            self.handle._end_step()
            self.handle._trace_stop()

    def __enter__(self) -> "Trace":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# torch's allocator tells its out-of-memory observers before it raises: the
# handles attached on that device hear of it (one observer for the process).
_live: "weakref.WeakSet[Handle]" = weakref.WeakSet()
_observing = False


def _observe_oom(h: Handle) -> None:
    global _observing
    _live.add(h)
    if _observing or h._device.type != "cuda":
        return
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:  # pragma: no cover - a torch without it: the error still comes, unlearned
        return

    def observer(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        for hh in list(_live):
            if hh._attached and hh._device.index == device:
                hh._oom(int(alloc))

    attach(observer)
    _observing = True


def _fmt_size(n: int) -> str:
    """Bytes as the library writes them: 8.00 GiB, 512.00 MiB."""
    for unit, k in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.2f} {unit}"
    return f"{n} bytes"
