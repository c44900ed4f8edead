"""A call that runs out of device memory, run again.

torch's out of memory (or arena's own DEV_OOM) inside an attached module's
forward, or inside the recompute of a checkpointed block in a backward, makes
arena give torch what it can and run the call again: at most ``RETRIES``
times, each only when the room torch has grew since the failure; then the
error is raised as ``arena.Error`` DEV_OOM with its numbers, the module still
usable. Each retry starts from the random number generators' states of the
call's start (CPU, and the arena's CUDA device), so dropout and any other
randomness replay as they ran: the outputs and gradients are those of a run
that never ran out. One ``arena.OomRetryWarning`` a retry, and a record
(``Handle.retries()``, and each step's in ``Handle.stats()``).

What arena gives:
- in either: torch's cache is emptied (CUDA: after a garbage collection, for
  the failed run's tensors that reference cycles hold);
- in a forward: the step in progress is ended (every block it holds
  released, the hooks of its partial backward removed, saved tensors kept in
  host memory dropped), torch's need reported (what it held and asked for:
  its allocator's out-of-memory observer) so that the engine plans the
  weights around it at once, demoting what no longer fits; the step begins
  again;
- in a recompute (inside a backward, whose blocks and graph must stay as they
  are): nothing more; the need is kept for the next step's plan;
- in either, under a vram cap, when that left torch no more room: the half
  of the headroom that the plan keeps from torch is lent to it until the
  step ends (the process then stays within the cap, without its slack).
"""

from __future__ import annotations

import gc
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Union

import torch

from .. import _native
from .._errors import Error, OomRetryWarning
from ._blocks import _in_backward, _top_hooks

if TYPE_CHECKING:
    from ._handle import Handle

RETRIES = 2  # runs again at most, a call
_KEEP = 1024  # records kept (the latest)


class _Failure:
    """What ran out at one attempt: torch (its allocator's numbers: asked, held) or
    arena's own device allocation (its message). The exception is kept without its
    traceback: the failed attempt's frames, and the tensors they held, go at once."""

    def __init__(self, h: "Handle", exc: BaseException, step: int):
        self.exc = exc.with_traceback(None)
        self.what = "arena" if isinstance(exc, Error) else "torch"
        self.step = step
        self.asked = h._oom_asked
        self.held = h._rest_memory() or 0
        self.need = max(h._oom_need, self.held + self.asked)
        h._oom_asked = 0


def forward(h: "Handle", inner: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """The attached module's forward: run again where it runs out of device memory.
    A forward inside a backward (the whole module checkpointed: its blocks' recomputes
    retry) or inside another of arena's calls runs once, torch's out of memory said
    as DEV_OOM."""
    if h._fwd_depth or h._rc_depth or h._active or not h._step_open or _in_backward():
        try:
            return inner(*args, **kwargs)
        except torch.OutOfMemoryError as e:
            raise h._oom_error(e) from e
    h._fwd_depth += 1
    try:
        return _retrying(h, "forward", lambda: inner(*args, **kwargs))
    finally:
        h._fwd_depth -= 1


def recompute(h: "Handle", call: Callable[[], Any]) -> Any:
    """A bound module's call in a backward (the recompute of a checkpointed block, or
    of a module inside one): run again where it runs out of device memory. Inside
    one being run so, a call runs as it is (the outer one runs again)."""
    if h._rc_depth:
        return call()
    h._rc_depth += 1
    try:
        return _retrying(h, "recompute", call)
    finally:
        h._rc_depth -= 1


def _retrying(h: "Handle", where: str, call: Callable[[], Any]) -> Any:
    rng = _rng_state(h)
    mark = _checkpoint_mark() if where == "recompute" else None
    rec: Optional[Dict[str, Any]] = None
    attempt = 0
    room_last = -1
    while True:
        try:
            out = call()
        except torch.OutOfMemoryError as e:
            fail = _Failure(h, e, _step_index(h))
        except Error as e:
            if e.code != "DEV_OOM":
                _ended(rec, e)
                raise
            fail = _Failure(h, e, _step_index(h))
        except BaseException as e:
            _ended(rec, e)
            raise
        else:
            if rec is not None:
                rec["outcome"] = "ok"
            return out
        # (out of the except: the failed attempt's frames are gone, and its tensors)
        if rec is not None:
            rec["outcome"] = "ran out again"
        attempt += 1
        before = _room(h)
        arena_before = h.arena.memory()["arena"]
        lent = 0
        after = before
        why = None if mark is not False else "the checkpoint's recompute could not be run again"
        if attempt <= RETRIES and why is None:
            try:
                if h._device.type == "cuda":  # (before the report: torch's cache is not its need)
                    gc.collect()  # the failed run's tensors that only reference cycles hold
                    torch.cuda.empty_cache()
                if where == "forward":
                    _end_and_begin(h)
                after = _room(h)
                if after <= max(before, room_last) and not h._lent and h.arena.memory()["cap"]:
                    lent = h._lend()
                    after = _room(h)
            except Error as g:  # the step could not begin again (no room for arena's ring), or the engine failed
                why = g.message
        gave = max(0, arena_before - h.arena.memory()["arena"])
        retry = attempt <= RETRIES and why is None and after > max(before, room_last)
        rec = {"step": fail.step, "where": where, "ran_out": fail.what, "asked": fail.asked, "held": fail.held,
               "room_before": before, "room_after": after, "gave": gave, "lent": lent, "attempt": attempt,
               "outcome": "retried" if retry else "raised"}
        h._retries.append(rec)
        del h._retries[:-_KEEP]
        if not retry:
            raise _final(h, fail, attempt - 1, why) from fail.exc
        room_last = after
        warnings.warn(_line(h, fail, rec), OomRetryWarning)
        _rng_restore(h, rng)
        if isinstance(mark, tuple):
            _rewind(mark)


def _ended(rec: Optional[Dict[str, Any]], e: BaseException) -> None:
    """A call run again ended by raising something else than running out: a
    checkpoint's recompute stopped once it has the tensors it needs (its
    _StopRecomputationError: it completed), or another error."""
    if rec is not None:
        stop = type(e).__name__ == "_StopRecomputationError"
        rec["outcome"] = "ok" if stop else f"raised {type(e).__name__}"


def _end_and_begin(h: "Handle") -> None:
    """A forward ran out: the step ends (its holds released, torch's need told: the
    engine plans the weights around it now) and begins again, as the forward's own
    step."""
    comp = h._step_comp
    if h._offload is not None:
        h._offload.discard()
    h._end_step(h._work)
    h._use_order(comp)
    h._begin_step()
    h._step_comp = comp
    if h._offload is not None:
        h._offload.begin(torch.is_grad_enabled())


def _room(h: "Handle") -> int:
    """The device memory torch may have in the step now: under a cap the limit the
    plan leaves it (and what is lent it); else what the device has free and what
    torch's allocator holds unused."""
    mi = h.arena.memory()
    if mi["cap"]:
        return int(mi["rest_limit"]) + h._lent
    free = h.arena.device_memory()[0]
    if h._device.type == "cuda":
        free += int(torch.cuda.memory_reserved(h._device)) - int(torch.cuda.memory_allocated(h._device))
    return free


def _step_index(h: "Handle") -> int:
    """The step in progress (the engine's number: the steps ended before it)."""
    return int(_native.lib.arena_step_count(h.arena._handle()))


def _rng_state(h: "Handle") -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    dev = torch.cuda.get_rng_state(h._device) if h._device.type == "cuda" else None
    return torch.get_rng_state(), dev


def _rng_restore(h: "Handle", st: Tuple[torch.Tensor, Optional[torch.Tensor]]) -> None:
    torch.set_rng_state(st[0])
    if st[1] is not None:
        torch.cuda.set_rng_state(st[1], h._device)


_Mark = Union[None, bool, Tuple[Any, Any, int]]


def _checkpoint_mark() -> _Mark:
    """Where a non-reentrant checkpoint's recompute stands (its frame, the backward's
    id, the tensors it has saved so far), so that a call run again saves its
    tensors in the same places: None outside one (no saved-tensor hooks: a
    reentrant checkpoint's recompute, which starts anew); False where hooks are in
    force that are not a recompute's, or whose state is not found (torch's
    internals: then the call is not run again)."""
    hooks = _top_hooks()
    if not hooks:
        return None
    pack = hooks[0]
    if "_recomputation_hook" not in getattr(pack, "__qualname__", ""):
        return False
    try:
        cells = dict(zip(pack.__code__.co_freevars, (c.cell_contents for c in pack.__closure__ or ())))
        frame = cells["target_frame_ref"]()
        gid = cells["gid"]
        return frame, gid, int(frame.recomp_counter[gid])
    except Exception:  # pragma: no cover - another torch's checkpoint
        return False


def _rewind(mark: Tuple[Any, Any, int]) -> None:
    """The recompute's tensors saved since ``mark`` are forgotten, its count set back."""
    frame, gid, n = mark
    for i in range(n, int(frame.recomp_counter[gid])):
        holder = frame.weak_holders[i]() if i < len(frame.weak_holders) else None
        if holder is not None:
            handle = holder.handles.pop(gid, None)
            if handle is not None:
                frame.recomputed[gid].pop(handle, None)
    frame.recomp_counter[gid] = n


def _what(fail: _Failure) -> str:
    from ._handle import _fmt_size

    if fail.what == "torch":
        return f"torch ran out of device memory (asked {_fmt_size(fail.asked)}, held {_fmt_size(fail.held)})"
    return f"arena's device allocation failed ({getattr(fail.exc, 'message', str(fail.exc))})"


def _line(h: "Handle", fail: _Failure, rec: Dict[str, Any]) -> str:
    """The warning of a retry, one line."""
    from ._handle import _fmt_size

    gave = []
    if rec["where"] == "forward":
        gave.append(f"gave up {_fmt_size(rec['gave'])} of weights" if rec["gave"] else "ended the step")
    if rec["lent"]:
        gave.append(f"lent torch {_fmt_size(rec['lent'])} of the headroom")
    what = "arena " + " and ".join(gave) if gave else "the device has more free"
    return (f"arena: step {rec['step']}: {_what(fail)} in the {rec['where']}; {what}: torch may have "
            f"{_fmt_size(rec['room_after'])} (had {_fmt_size(rec['room_before'])}); running it again "
            f"({rec['attempt']} of {RETRIES})")


def _final(h: "Handle", fail: _Failure, retried: int, why: Optional[str] = None) -> Error:
    """The error once arena cannot run the call again."""
    if fail.what == "torch":
        return h._oom_error(fail.exc, asked=fail.asked, held=fail.held, need=fail.need, retried=retried, why=why)
    msg = getattr(fail.exc, "message", str(fail.exc))
    return Error("DEV_OOM", f"{msg}; {_retried(retried, why)}: run it again when the device has the memory",
                 error_class="system")


def _retried(n: int, why: Optional[str] = None) -> str:
    """How the retries went, said in a DEV_OOM's message."""
    if why:
        return f"arena did not run it again: {why}" if not n else f"arena ran it again {n} time(s), then: {why}"
    if not n:
        return "arena could give torch no more room to run it again in"
    return (f"arena ran it again {n} time(s), each with more room for torch, until it could give no more "
            f"(Handle.retries() says what it gave)")
