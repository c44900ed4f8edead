"""The handle ``attach`` returns (steps, sampling inside training, traces,
statistics, ``detach``) and the trace it records."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import torch
from torch import nn

from .. import Arena, Error
from ._blocks import _BlockBinding, _in_backward
from ._guards import _guard_merge, _peft_tuners
from ._offload import _SavedOffload
from ._pieces import _PiecedBinding


class Handle:
    """What ``attach`` returns: the binding of a module to an arena."""

    def __init__(self) -> None:
        self.arena: Arena
        self.module: nn.Module
        self._device: torch.device  # the arena's device (set when bound)
        self._owns_arena = False
        self._step_open = False
        self._deferred: List[Tuple[int, Optional[int]]] = []
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
        self._n_modules = 0
        # Each block module's parameters (adapters' included), listed once: walking
        # a Flux block's modules at every call took ~0.25 ms of the host's time a
        # block. Listed again when the module count changes (_guard_new_tuners).
        self._param_lists: Dict[int, List[nn.Parameter]] = {}
        self._attached = False
        self._tracing = False
        self._trace_left: Optional[int] = None
        # The device memory the rest of the process holds (torch's allocator on
        # CUDA; None: nothing to say, as on sim, whose tensors are host memory).
        self._rest_memory: Callable[[], Optional[int]] = self._torch_reserved
        self._offload: Optional[_SavedOffload] = None

    def _torch_reserved(self) -> Optional[int]:
        if self._device.type != "cuda":
            return None
        return int(torch.cuda.memory_reserved(self._device))

    # --- steps ---------------------------------------------------------------------
    def _stream(self) -> Optional[int]:
        if self.arena.backend == "sim":
            return None
        return torch.cuda.current_stream(self._device).cuda_stream

    def _release_deferred(self) -> None:
        while self._deferred:
            i, s = self._deferred.pop(0)
            self.arena.release(i, s)
            self._whole[i].drop()
        for pb in self._pieced:
            pb.release_all()
        for hk in self._hooks:
            hk.remove()
        self._hooks.clear()

    def _release_recomputed(self, block: int) -> None:
        for k, (i, s) in enumerate(self._deferred):
            if i == block:
                del self._deferred[k]
                self.arena.release(i, self._stream())
                self._whole[i].drop()
                return

    def _watch_backward(self, block: int, grads: List[torch.Tensor]) -> None:
        # When every gradient the block's backward makes is made, its backward
        # kernels are queued: a recompute's hold on the block can go.
        hk = torch.autograd.graph.register_multi_grad_hook(grads, lambda _g: self._release_recomputed(block), mode="all")
        self._hooks.append(hk)

    def _begin_step(self) -> None:
        self.arena.step_begin()
        self._step_open = True
        # When the plan streams nothing (everything fits), blocks need no
        # acquire: their device addresses hold until a step end changes the plan.
        self._all_resident = self.arena.plan()["n_streamed"] == 0
        if self._all_resident:
            idx = list(self._whole) + [i for pb in self._pieced for i in pb.pieces]
            self._resident_at = {i: self.arena.block_state(i)[1] for i in idx}

    def _end_step(self) -> None:
        if self._offload is not None:
            self._offload.end()
        if self._step_open:
            self._release_deferred()
            self._step_open = False
            rest = self._rest_memory()
            if rest is not None:  # under a vram cap, torch's past the reserve leaves arena's budget
                self.arena.set_rest_memory(rest)
            self.arena.step_end()
            if self._tracing and self._trace_left is not None:
                self._trace_left -= 1
                if self._trace_left <= 0:
                    self._trace_stop()

    def _trace_stop(self) -> None:
        if self._tracing:
            self._tracing = False
            self.arena.trace_end()

    def _root_pre_hook(self, module: nn.Module, args: Any) -> None:
        if _in_backward():
            return
        self._guard_new_tuners()
        self._end_step()
        self._begin_step()
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
        n = sum(1 for _ in self.module.modules())
        if n != self._n_modules:
            self._n_modules = n
            self._param_lists.clear()
            for name, tuner in _peft_tuners(self.module).items():
                if id(tuner) not in self._guarded:
                    _guard_merge(self, name, tuner)

    def end_step(self) -> None:
        """End the step in progress now (the next forward would otherwise do it)."""
        self._end_step()

    # --- public ----------------------------------------------------------------------
    @contextlib.contextmanager
    def sampling(self) -> Iterator["Handle"]:
        """Run sample steps inside training (previews) and go back: ``with h.sampling(): pipe(...)``."""
        self._end_step()
        prev = self.arena.mode
        self.arena.set_mode("sample")
        try:
            yield self
        finally:
            self._end_step()
            self.arena.set_mode(prev)

    def trace(self, path: str, steps: Optional[int] = None, max_events: int = 0) -> "Trace":
        """Record what the device does, step by step, into ``path``: a Chrome trace-event
        JSON file (open it in https://ui.perfetto.dev; tracks in README.md): every
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
        """The engine's per-step records: resident/streamed bytes, misses, stalls, ..."""
        return self.arena.stats()

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
            for undo in reversed(self._restore):
                undo()
            self._restore.clear()
            self._attached = False
            if self._owns_arena:
                self.arena.close()
        return self.module

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
