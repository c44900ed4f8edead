"""Test-facing (private): torch running out of device memory at chosen allocations
of an attached module's steps, on any device. The sim backend's tests run torch
on the CPU, whose allocator never runs out; this makes it, the way torch on CUDA
does: its out-of-memory observer tells the handle what was asked
(``Handle._oom``), then ``torch.OutOfMemoryError`` is raised where the tensor
would have been allocated.

    with _inject.oom(h, step=2, at=5):       # the 5th allocation of step 2's forward
        out = m(**x)                          # runs out once; arena runs it again

Arena's own device allocations fail on sim with ``Arena.sim_fail_alloc``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _native
from ._blocks import _in_backward

if TYPE_CHECKING:
    from ._handle import Handle

WHERE = ("forward", "recompute", "any")


def _allocates(func: Any) -> bool:
    """An op that makes a new tensor (a return that is a tensor and aliases no input:
    not a view, not an in-place op)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    return any(r.alias_info is None and str(r.type).startswith("Tensor") for r in schema.returns)


class OomInjection(TorchDispatchMode):
    """Counts the ops that make new tensors inside an attached module's calls and
    raises torch.OutOfMemoryError at the ``at``-th of a step: of step ``step`` (the
    engine's step number; None: any) first, then of each run after it (a retry's
    run counts anew), ``times`` times in all (None: every time). ``where``:
    "forward" (the module's forward), "recompute" (a checkpointed block's recompute
    in a backward) or "any". ``asked``: the bytes torch's observer says it asked for.
    ``fired``: the failures raised so far."""

    def __init__(self, h: "Handle", step: Optional[int] = None, at: int = 1, times: Optional[int] = 1,
                 where: str = "forward", asked: int = 1 << 20):
        super().__init__()
        if where not in WHERE:
            raise ValueError(f"where: {where!r}: one of {WHERE}")
        if at < 1 or (times is not None and times < 0):
            raise ValueError(f"at: {at}, times: {times}: at 1 or more, times 0 or more (None: always)")
        self.h = h
        self.step = step
        self.at = at
        self.times = times
        self.where = where
        self.asked = asked
        self.fired = 0
        self.count = 0
        self.cur = -1  # the step whose allocations are counted

    def _counting(self) -> bool:
        h = self.h
        if self.times is not None and self.fired >= self.times:
            return False
        if _in_backward():
            return self.where != "forward" and h._rc_depth > 0
        return self.where != "recompute" and h._fwd_depth > 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        if self._counting() and _allocates(func):
            step = int(_native.lib.arena_step_count(self.h.arena._handle()))
            if self.fired or self.step is None or step == self.step:
                if step != self.cur:
                    self.cur, self.count = step, 0
                self.count += 1
                if self.count == self.at:
                    self.count = 0
                    self.fired += 1
                    self.h._oom(self.asked)
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate {self.asked} bytes (injected: allocation {self.at} "
                        f"of step {step}, {func})")
        return func(*args, **kwargs)


def oom(h: "Handle", step: Optional[int] = None, at: int = 1, times: Optional[int] = 1, where: str = "forward",
        asked: int = 1 << 20) -> OomInjection:
    """An OomInjection over ``h``'s calls: a context manager (``with oom(h, ...) as inj``)."""
    return OomInjection(h, step, at, times, where, asked)
