"""Saved tensors in host memory (``attach(offload_saved=...)``): what a training
step's forward saves for its backward waits in pinned host memory."""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn


class _Saved:
    """A tensor autograd saved for the backward, kept in host memory (``offload_saved``)."""

    __slots__ = ("host", "ready", "dev", "fetched", "pending", "uses", "pos")

    def __init__(self, host: torch.Tensor, ready: Any, pos: int):
        self.host = host
        self.ready = ready  # the copy to host is done (an event; None on the CPU)
        self.dev: Optional[torch.Tensor] = None  # back on the device (fetched ahead, or used again)
        self.fetched: Any = None  # the event of the copy that made ``dev``
        self.pending = False  # fetched ahead and not used yet
        self.uses = 1  # how often autograd saved it: ``dev`` is kept until as many uses
        self.pos = pos  # its place in the step's order of saving


class _SavedOffload:
    """Saved-tensor hooks around a training step's forward (``attach(offload_saved=...)``).

    With every block checkpointed, what autograd keeps from a step's forward for
    its backward is each block's inputs (the checkpoint saves them) and the
    activations of the layers outside the blocks: on Flux at 1024x1024, 1.64 GB
    of device memory at the forward's end. Those of at least ``min_bytes`` are
    copied to pinned host memory as they are saved, on a stream of their own
    beside the compute, and copied back on another stream in the backward,
    ``ahead`` tensors before the backward reaches them: a block's inputs come
    back while the block after it runs its backward. Device memory stays in
    the order of torch's stream (no ``record_stream``, which keeps a block from
    reuse until the device has caught up with a host running ahead of it: torch
    then reserves memory it does not use): a tensor copied out is let go once
    torch's stream has been told to wait for its copy, ``lag`` tensors later;
    a tensor fetched back is allocated on torch's stream and the copy waits
    for the stream's work queued before it. The forward's copies go the other
    way on the link from the weights arena streams in, yet slow them a little
    (an H200: 55 GB/s in alone, 51-54 GB/s beside copies out); the backward's
    fit in what its compute leaves.
    Parameters and views of them (arena's weights, adapters) stay where they
    are. Values are copied, never converted: the gradients are the same.

    On the simulated device (CPU tensors) the copies are CPU copies: the same
    path, tested, with nothing to gain."""

    ahead = 4
    lag = 4

    def __init__(self, device: torch.device, min_bytes: int):
        self.device = device
        self.min_bytes = min_bytes
        self.cuda = device.type == "cuda"
        self.saved: List[_Saved] = []  # this step's, in the order saved
        self.seen: Dict[int, Tuple[Any, int, _Saved]] = {}  # id(tensor) -> (weakref, version, entry)
        self.hooks: Optional[Any] = None
        self.to_host: Any = None
        self.to_dev: Any = None
        # Tensors being copied out and their copies' events: held here, their memory
        # is not torch's to reuse until its stream has been told to wait (_let_go).
        self.copying: List[Tuple[torch.Tensor, Any]] = []
        self.count = self._zero()

    @staticmethod
    def _zero() -> Dict[str, int]:
        return {"tensors": 0, "bytes": 0, "fetched_ahead": 0, "fetched_late": 0}

    # --- a step ---
    def begin(self, grad: bool) -> None:
        """A step's forward starts; with autograd on (``grad``), saved tensors go to the host."""
        self.end()
        self._drop_fetched()
        self.saved = []
        self.seen.clear()
        self.count = self._zero()
        if not grad:
            return
        if self.cuda and self.to_host is None:
            self.to_host = torch.cuda.Stream(self.device)
            self.to_dev = torch.cuda.Stream(self.device)
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self.hooks.__enter__()

    def end(self) -> None:
        """The forward ends: saving stops; the last saved come back for the backward's start."""
        if self.hooks is None:
            return
        hooks, self.hooks = self.hooks, None
        hooks.__exit__(None, None, None)
        self.seen.clear()
        self._let_go(0)
        self._prefetch(len(self.saved))

    def discard(self) -> None:
        """The forward ran out of memory and is run again: saving stops, and what it
        saved is let go (nothing fetched back for a backward that will not come)."""
        if self.hooks is not None:
            hooks, self.hooks = self.hooks, None
            hooks.__exit__(None, None, None)
        self.seen.clear()
        self._let_go(0)
        self._drop_fetched()
        self.saved = []

    # --- the hooks ---
    def pack(self, t: torch.Tensor) -> Any:
        if (t.device != self.device or t.layout != torch.strided or isinstance(t, nn.Parameter)
                or isinstance(t._base, nn.Parameter)):
            return t
        nbytes = t.numel() * t.element_size()
        if nbytes < self.min_bytes:
            return t
        got = self.seen.get(id(t))
        if got is not None and got[0]() is t and got[1] == t._version:
            got[2].uses += 1  # the same tensor saved again (by another block)
            return got[2]
        if self.cuda:
            host = torch.empty_like(t, device="cpu", pin_memory=True)  # its strides, where dense
            self.to_host.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.to_host):
                host.copy_(t, non_blocking=True)
                ready = self.to_host.record_event()
            self.copying.append((t, ready))
            self._let_go(self.lag)
        else:
            host, ready = t.detach().clone(), None
        e = _Saved(host, ready, len(self.saved))
        self.saved.append(e)
        self.seen[id(t)] = (weakref.ref(t), t._version, e)
        self.count["tensors"] += 1
        self.count["bytes"] += nbytes
        return e

    def unpack(self, e: Any) -> torch.Tensor:
        if not isinstance(e, _Saved):
            return e
        dev = e.dev
        if dev is None:
            dev = self._fetch(e, None)
            self.count["fetched_late"] += 1
        else:
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(e.fetched)
            if e.pending:
                self.count["fetched_ahead"] += 1
        e.pending = False
        e.uses -= 1
        e.dev = dev if e.uses > 0 else None
        self._prefetch(e.pos)
        return dev

    def _fetch(self, e: _Saved, stream: Any) -> torch.Tensor:
        """``e`` back on the device: on ``stream`` (ahead), or on torch's stream (None)."""
        if not self.cuda:
            return e.host.clone()
        cur = torch.cuda.current_stream(self.device)
        dev = torch.empty_like(e.host, device=self.device)  # from torch's stream's memory
        s = cur
        if stream is not None:
            s = stream
            s.wait_stream(cur)  # the memory is free in the order of torch's stream
        s.wait_event(e.ready)
        with torch.cuda.stream(s):
            dev.copy_(e.host, non_blocking=True)
            e.fetched = s.record_event()
        return dev

    def _let_go(self, keep: int) -> None:
        """Torch's stream waits for the copies out but the last ``keep`` (long done by
        the time the stream gets there); their tensors' memory is torch's again."""
        if len(self.copying) <= keep:
            return
        cur = torch.cuda.current_stream(self.device)
        while len(self.copying) > keep:
            _, ready = self.copying.pop(0)
            cur.wait_event(ready)

    def _drop_fetched(self) -> None:
        """Tensors fetched ahead and never used (the step ended): torch's stream waits
        for their copies before their memory goes back."""
        if not self.cuda:
            return
        cur = torch.cuda.current_stream(self.device)
        for e in self.saved:
            if e.dev is not None:
                cur.wait_event(e.fetched)
                e.dev = None

    def _prefetch(self, below: int) -> None:
        """Keep ``ahead`` tensors saved before position ``below`` fetched (the backward
        uses them in about the reverse order of saving)."""
        if self.hooks is not None:
            return  # in the forward: nothing to fetch yet
        n, i = 0, below - 1
        while i >= 0 and n < self.ahead:
            e = self.saved[i]
            if e.pending:
                n += 1
            elif e.dev is None and e.uses > 0:
                e.dev = self._fetch(e, self.to_dev)
                e.pending = True
                n += 1
            i -= 1

    def stats(self) -> Dict[str, int]:
        return dict(self.count)
