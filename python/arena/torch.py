"""Bind a PyTorch module to an arena: the module's weights live in arena memory.

``attach(module, path)`` matches the module's repeated blocks (children of a
``ModuleList``: ``transformer_blocks.N``, ``single_transformer_blocks.N``,
``model.layers.N``) to the image's blocks by name and every parameter to the
image's tensor of the same name (peft's ``...base_layer.weight`` maps to
``...weight``), checking shape and dtype; all mismatches are reported in one
error before anything changes. Then:

- the globals (tensors outside the blocks) are bound once, as views of their
  device memory;
- each block's parameters are views of the block's bytes where the engine
  has them: when the block is called, it is acquired on torch's current
  stream (prefetched ahead by the engine, resident or streamed through the
  ring), its parameters are pointed at those bytes (``param.data = view``:
  the same ``Parameter`` objects, so optimizer references, hooks and
  ``torch.compile`` guards stay valid, no copy), the block runs, and the
  block is released on the same stream;
- a step is one call of the module's forward up to the next one (backward
  and its recompute included): the engine learns the order of a step and
  prefetches by it.

Training: the bound weights are frozen (``requires_grad=False``); trainable
parameters (peft LoRA layers, or those ``trainable`` names) stay ordinary
torch parameters. A streamed block must run under gradient checkpointing
(non-reentrant, as diffusers' ``enable_gradient_checkpointing``): its
forward then saves no weights, and its recompute in backward acquires the
block again and holds it until the next block's recompute (the backward
kernels of a block are queued by then). Refused early, with a message
saying what to do: a streamed block running with autograd outside
checkpointing, training the bound weights themselves, merging adapters
into them (``merge_adapter``), and converting them with ``module.to(dtype)``
or moving them to another device (``module.to("cuda")`` onto the device
they are on is fine, and moves the other parameters as usual).

``torch.compile``: compile blocks regionally (diffusers'
``compile_repeated_blocks()``, ``block.compile()``), or replace a block by
``torch.compile(block)`` before attaching. The binding is outside the
compiled code; parameters keep their identity, shape and dtype, so steps
after the first recompile nothing.

``offload_saved``: what a training step's forward saves for its backward
(with checkpointing, each block's inputs) waits in pinned host memory, copied
out beside the forward and back ahead of the backward: less device memory for
torch, the same gradients (docs/PYTHON.md, "Saved tensors in host memory").

Blocks in pieces (``piece_size``): each module inside a block that owns bound
tensors acquires the piece holding them when it is called; the block's call
holds a piece from its first use to its last (docs/PYTHON.md, "Blocks in
pieces"), so the ring holds pieces, not blocks. Training in pieces needs a
ring that holds one block and a piece: the default depth does; a smaller
``depth`` given is refused with the value that is enough.

Between calls, a streamed block's parameters view ring memory that other
blocks reuse: read weights through ``handle.arena.tensors()``, not through
the module, outside a forward.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Union

import torch
from torch import nn

from . import Arena, Component, Error, Size, TensorInfo, _view, parse_size, torch_dtype
from . import open as _open

__all__ = ["attach", "Handle", "Trace"]

_STRIP = ("base_model.model.",)  # a peft PeftModel's prefix
_cls_cache: Dict[type, type] = {}


def _image_name(name: str) -> str:
    for p in _STRIP:
        if name.startswith(p):
            name = name[len(p) :]
    return name.replace(".base_layer.", ".").replace("._orig_mod.", ".").replace("_orig_mod.", "")


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _under_checkpoint() -> bool:
    """Inside the forward of a non-reentrant torch.utils.checkpoint (its saved-tensor hooks are on top)."""
    try:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    except Exception:  # pragma: no cover - a torch without it
        return False
    return bool(hooks) and "_checkpoint_hook" in getattr(hooks[0], "__qualname__", "")


def _bound_cls(cls: type) -> type:
    """A subclass of a block's class whose __call__ goes through its binding."""
    if cls in _cls_cache:
        return _cls_cache[cls]
    base_call = cls.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        b = self.__dict__.get("_arena_binding")
        if b is None:
            return base_call(self, *args, **kwargs)
        return b.run(base_call, self, args, kwargs)

    new = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__, "_arena_base": cls})
    _cls_cache[cls] = new
    return new


# every scheme of docs/QUANT.md: arena_tensor_dequantize writes their values
_DEQUANT = ("bf16", "fp8-e4m3", "fp8-e5m2", "fp8-e4m3-tensor", "fp8-e4m3-row", "int8-row")


def _dequantize(h: "Handle", info: TensorInfo, index: int, addr: int) -> torch.Tensor:
    """A quantized tensor's values (tensor ``index`` of the C API) in its original
    dtype, in new torch memory on the arena's device, from its block's bytes at
    ``addr``: one kernel (arena's) queued on torch's current stream, so the memory
    is torch's in stream order."""
    out = torch.empty(info.shape, dtype=torch_dtype(info.dtype), device=h._device)
    h.arena._dequantize(index, addr, out.data_ptr(), h._stream())
    return out


class _BlockBinding:
    """A block module bound to an arena block: its parameters, the views at each address.

    Tensors stored quantized (``quant``) are dequantized into torch memory at
    each bind and let go at ``drop()`` (the block's release): the module always
    sees its original dtype, and only the blocks being run hold a dequantized
    copy."""

    def __init__(self, handle: "Handle", index: int, name: str, params: List[Tuple[torch.Tensor, Component]],
                 quant: Optional[List[Tuple[torch.Tensor, TensorInfo, int]]] = None):
        self.handle = handle
        self.index = index
        self.name = name
        self.params = params  # stored as they are: views
        self.quant = quant or []  # stored quantized (parameter, its tensor, its C index): dequantized at bind
        self.weights = [p for p, _ in self.params] + [q[0] for q in self.quant]
        self.live = False  # the quantized parameters hold their values (bound and not dropped)
        self.addr = -1
        self.cache: "OrderedDict[int, List[torch.Tensor]]" = OrderedDict()

    def bind(self, addr: int, where: str = "device") -> None:
        if addr == self.addr and (self.live or not self.quant):
            return
        views = self.cache.get(addr)
        if views is None:
            slab = self.handle.arena.slab(self.index, addr, where)
            with torch.inference_mode(False):
                views = [_view(slab, c) for _, c in self.params]
            self.cache[addr] = views
            if len(self.cache) > 8:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(addr)
        with torch.no_grad():
            for (p, _), v in zip(self.params, views):
                p.data = v
        if self.quant:  # (new tensors: not inference tensors under the caller's inference_mode)
            self.live = True  # from the first one: drop() lets go of them all, even after a failure here
            with torch.no_grad(), torch.inference_mode(False):
                for p, info, i in self.quant:
                    p.data = _dequantize(self.handle, info, i, addr)
        self.addr = addr

    def drop(self) -> None:
        """Let the dequantized values go (the block is released): placeholders again."""
        if not self.live:
            return
        with torch.no_grad():
            for p, info, _ in self.quant:
                p.data = _placeholder(self.handle, _as_component(info))
        self.live = False

    def run(self, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        h = self.handle
        a = h.arena
        backward = _in_backward()
        if not h._step_open:
            h._begin_step()
        if h._all_resident and not self.quant:  # nothing streams this step: the blocks stay where they are
            self.bind(h._resident_at[self.index])
            if torch.is_grad_enabled() and not backward:
                self._check_training(args, kwargs)
            return call(mod, *args, **kwargs)
        stream = h._stream()
        addr = a.acquire(self.index, stream)
        grads: List[torch.Tensor] = []
        try:
            self.bind(addr)
            if torch.is_grad_enabled() and not backward:
                grads = self._check_training(args, kwargs)
            out = call(mod, *args, **kwargs)
        except BaseException:
            # A recompute may stop early on purpose (checkpoint raises once it has
            # the tensors it needs): what it saved views the block until the
            # block's backward has run, so the hold stays for the hook.
            if backward:
                h._deferred.append((self.index, stream))
            else:
                a.release(self.index, stream)
                self.drop()
            raise
        if backward:
            # A recompute (checkpointing): its saved tensors view the block until
            # the block's backward has run; the hook set at its forward releases it.
            h._deferred.append((self.index, stream))
        else:
            a.release(self.index, stream)
            self.drop()
            if grads:
                h._watch_backward(self.index, grads)
        return out

    def _check_training(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[torch.Tensor]:
        """Refuse what training cannot do with this block; return the tensors whose
        gradients end its backward (inputs and its own parameters that need one)."""
        resident = self.handle.arena.block_state(self.index)[0]
        return _check_training(self.handle, self.name, self.weights, self.index, resident,
                               self.quant[0][1].scheme if self.quant else None, args, kwargs)


def _check_training(h: "Handle", name: str, weights: List[torch.Tensor], index: int, resident: bool,
                    scheme: Optional[str], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[torch.Tensor]:
    """A block's forward with autograd on: refuse training its bound weights, and a
    streamed or quantized (``scheme``) block outside checkpointing; return the
    tensors whose gradients end its backward (its inputs and its module's
    parameters that need one)."""
    for p in weights:
        if p.requires_grad:
            raise Error(
                "USAGE",
                f"{name}: the weights arena holds are frozen; training them (full fine-tuning, "
                f"requires_grad on '{h._pname(p)}') is not supported: train adapters "
                f"(peft LoRA) or parameters of your own instead",
            )
    grads = [x for x in list(args) + list(kwargs.values()) if isinstance(x, torch.Tensor) and x.requires_grad]
    grads += [p for p in h._params_of(index) if p.requires_grad]
    if (resident and scheme is None) or _under_checkpoint() or not grads:
        return grads
    if resident:
        raise Error(
            "USAGE",
            f"{name} is stored quantized ({scheme}) and runs with autograd outside gradient checkpointing: "
            f"its weights are dequantized for each call and let go after it, so its backward would not "
            f"find them; enable non-reentrant checkpointing of every block (diffusers: "
            f"module.enable_gradient_checkpointing()), or use an image without --quant",
        )
    raise Error(
        "USAGE",
        f"{name} is streamed and runs with autograd outside gradient checkpointing: the "
        f"weights its backward needs would be overwritten in the ring; enable non-reentrant "
        f"checkpointing of every block (diffusers: module.enable_gradient_checkpointing()), or "
        f"give arena more vram so that the block stays resident",
    )


class _LeafRef:
    """A module inside a pieced block that owns bound tensors: its calls go to the block's binding."""

    def __init__(self, block: "_PiecedBinding", key: int):
        self.block = block
        self.key = key

    # Inside a compiled block: a graph break here (the acquire and the binding
    # run eagerly, the module with them), not a trace of the binding, whose
    # addresses change from call to call and would recompile.
    @torch.compiler.disable
    def run(self, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        return self.block.leaf(self.key, call, mod, args, kwargs)


class _PiecedBinding:
    """A block module whose image block is streamed in pieces (``piece_size``).

    Each module inside it that owns bound tensors (a Linear, a norm) acquires
    the pieces holding its tensors when it is called (one piece: pieces are
    never cut inside a module) and the block's call holds each piece from its
    first use to its last, learned from the block's previous call (on a first
    call, or when the calls change, a piece is held until a module needs
    another), so the ring holds a few pieces, not the block. A recompute in
    backward (checkpointing) holds each piece until the backward of every
    module that used it has run (its input's gradient is made), so a train
    step holds at most one block's pieces at a time."""

    def __init__(self, handle: "Handle", name: str, pieces: Dict[int, "_BlockBinding"], need: List[Tuple[int, ...]]):
        self.handle = handle
        self.name = name
        self.pieces = pieces  # arena block index -> the piece's binding (its views)
        self.need = need  # per leaf key: the pieces it needs
        self.index = min(pieces)  # for the handle's bookkeeping
        self.weights = [p for b in pieces.values() for p in b.weights]
        self.scheme = next((b.quant[0][1].scheme for b in pieces.values() if b.quant), None)
        self.held: Set[int] = set()  # pieces acquired and not released
        self.active = False
        self.backward = False
        self.pos = 0
        self.rec: List[int] = []
        self.seq: Optional[List[int]] = None
        self.rel_after: Dict[int, List[int]] = {}
        self.follow = False
        self.watched: Set[int] = set()  # forward positions whose backward releases recompute holds
        self.bw: Dict[int, Tuple[int, ...]] = {}  # recompute: position -> pieces it holds for backward
        self.bw_ref: Dict[int, int] = {}
        self.keep: Tuple[int, ...] = ()  # pieces of the block module's own tensors: held for its whole call
        # forward: positions waiting for the gradient of each input tensor, one hook
        # on each (by id, with a weak reference that tells a tensor gone, whose id
        # a new one may take, from the same one)
        self.waiting: Dict[int, Tuple[Any, List[int]]] = {}

    # --- pieces ---
    def _acquire(self, idx: int) -> None:
        h = self.handle
        addr = h.arena.acquire(idx, h._stream())
        self.held.add(idx)
        self.pieces[idx].bind(addr)

    def _hold(self, need: Tuple[int, ...]) -> None:
        for idx in need:
            if idx not in self.held:
                self._acquire(idx)

    def _release(self, idx: int) -> None:
        self.held.discard(idx)
        self.handle.arena.release(idx, self.handle._stream())
        self.pieces[idx].drop()

    def release_all(self) -> None:
        """Step end: whatever is still held goes."""
        self.bw.clear()
        self.bw_ref.clear()
        self.watched.clear()
        for idx in list(self.held):
            self._release(idx)

    def _bw_done(self, pos: int) -> None:
        for idx in self.bw.pop(pos, ()):
            self.bw_ref[idx] -= 1
            if not self.bw_ref[idx]:
                del self.bw_ref[idx]
                if idx in self.held:
                    self._release(idx)

    def _learn(self) -> None:
        if self.rec == self.seq:
            return
        self.seq = list(self.rec)
        last: Dict[int, int] = {}
        for pos, key in enumerate(self.seq):
            for idx in self.need[key]:
                last[idx] = pos
        self.rel_after = {}
        for idx, pos in last.items():
            self.rel_after.setdefault(pos, []).append(idx)

    # --- calls ---
    def run(self, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        h = self.handle
        backward = _in_backward()
        if not h._step_open:
            h._begin_step()
        if torch.is_grad_enabled() and not backward:
            self._check_training(args, kwargs)
        if h._all_resident and self.scheme is None:
            for idx, b in self.pieces.items():
                b.bind(h._resident_at[idx])
            return call(mod, *args, **kwargs)
        if self.active:  # a block calling itself: its pieces stay as they are
            return call(mod, *args, **kwargs)
        self.active, self.backward, self.pos = True, backward, 0
        self.rec = []
        self.follow = self.seq is not None and not backward
        if not backward:
            self.watched = set()
        keep = self.keep
        done = False
        try:
            self._hold(keep)
            out = call(mod, *args, **kwargs)
            done = True
        finally:
            self.active = False
            self.waiting = {}
            for idx in list(self.held):
                if not (backward and (self.bw_ref.get(idx) or idx in keep)):
                    self._release(idx)
        if done and not backward:
            self._learn()
        return out

    def leaf(self, key: int, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...],
             kwargs: Dict[str, Any]) -> Any:
        h = self.handle
        need = self.need[key]
        if not h._step_open:
            h._begin_step()
        if h._all_resident and self.scheme is None:
            for idx in need:
                self.pieces[idx].bind(h._resident_at[idx])
            return call(mod, *args, **kwargs)
        if not self.active:  # called on its own, outside its block: its pieces for this call
            self._hold(need)
            try:
                return call(mod, *args, **kwargs)
            finally:
                for idx in need:
                    if idx in self.held and not self.bw_ref.get(idx):
                        self._release(idx)
        pos = self.pos
        self.pos += 1
        if self.backward:  # a recompute: held until this module's backward has run
            self._hold(need)
            out = call(mod, *args, **kwargs)
            if pos in self.watched and pos not in self.bw:
                self.bw[pos] = need
                for idx in need:
                    self.bw_ref[idx] = self.bw_ref.get(idx, 0) + 1
            return out
        self.rec.append(key)
        seq = self.seq or []
        if self.follow and (pos >= len(seq) or seq[pos] != key):
            self.follow = False  # the calls changed: hold only what each module needs
        if not self.follow:
            for idx in list(self.held):
                if idx not in need and idx not in self.keep:
                    self._release(idx)
        self._hold(need)
        if torch.is_grad_enabled():
            grads = [x for x in list(args) + list(kwargs.values()) if isinstance(x, torch.Tensor) and x.requires_grad]
            if grads:
                self.watched.add(pos)
                self._watch(grads, pos)
        out = call(mod, *args, **kwargs)
        if self.follow:
            for idx in self.rel_after.get(pos, ()):
                if idx in self.held and idx not in self.keep:
                    self._release(idx)
        return out

    def _watch(self, grads: List[torch.Tensor], pos: int) -> None:
        """The backward of the module at ``pos`` has run once the gradients of its
        inputs are made. Modules of one input (a block's q, k and v) share one hook
        on it: a hook costs ~0.1 ms of the host's time, and a block in pieces has
        dozens of modules. Several inputs: one hook for all of them."""
        if len(grads) > 1:
            hk = torch.autograd.graph.register_multi_grad_hook(grads, lambda _g, p=pos: self._bw_done(p), mode="all")
            self.handle._hooks.append(hk)
            return
        t = grads[0]
        got = self.waiting.get(id(t))
        if got is not None and got[0]() is t:
            got[1].append(pos)
            return
        w = [pos]
        self.waiting[id(t)] = (weakref.ref(t), w)

        def done(_g: Any, w: List[int] = w) -> None:
            for p in w:
                self._bw_done(p)

        self.handle._hooks.append(t.register_hook(done))

    def _check_training(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        resident = all(self.handle.arena.block_state(i)[0] for i in self.pieces)
        _check_training(self.handle, self.name, self.weights, self.index, resident, self.scheme, args, kwargs)


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


def _is_adapter_param(name: str, tuners: Set[str]) -> bool:
    for t in tuners:
        if name.startswith(t + ".") and not name[len(t) + 1 :].startswith("base_layer."):
            return True
    return False


def _peft_tuners(module: nn.Module) -> Dict[str, nn.Module]:
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except Exception:
        return {}
    return {n: m for n, m in module.named_modules() if issubclass(type(m), BaseTunerLayer)}


def attach(
    module: nn.Module,
    path: Union[str, Arena],
    mode: str = "sample",
    vram: Size = None,
    *,
    device: Union[str, int, None] = None,
    reserve: Size = None,
    headroom: Size = None,
    depth: Optional[int] = None,
    keep_last: Optional[int] = None,
    trainable: Union[Iterable[str], Callable[[str], bool], None] = None,
    offload_saved: Union[bool, Size] = False,
    **open_kwargs: Any,
) -> Handle:
    """Bind ``module``'s weights to the arena at ``path`` (or an open :class:`arena.Arena`).

    module: built on the meta device (``with torch.device("meta"): M(config)``:
      torch allocates nothing) or already materialized (its weights are
      released once bound); peft adapters may be added before or after.
    mode: "sample" or "train" (checkpointed training: forward, backward in reverse).
    vram: all device memory the process may use, arena's and torch's: arena
      takes ``vram`` less ``reserve`` (torch's working memory: default 1 GiB
      sample, 4 GiB train) and ``headroom``; what torch's allocator holds past
      ``reserve`` (read before each step end) leaves arena's share at that step's
      end, and returns once torch holds less.
    trainable: names (or a predicate on names) of parameters of your own that
      stay torch parameters; peft adapter parameters are recognized.
    offload_saved: training: the tensors autograd saves in a step's forward for
      its backward (with checkpointing: each block's inputs, 1.64 GB on Flux at
      1024x1024) wait in pinned host memory instead of device memory, copied
      out beside the forward and back ahead of the backward; bit for bit the
      same gradients. True: tensors of 1 MiB or more; a size: of at least that
      size. Lowers what torch needs, so give a smaller ``reserve`` with it.
      ``Handle.offload_stats()`` says what moved.
    Other keywords go to :func:`arena.open` (``piece_size``: stream blocks in pieces
      of at most this size, or "auto", each module acquiring its own; ``host_budget``:
      host memory for streamed blocks, the rest read from the image when streamed;
      ``plain_stream``: an hb4 image's streamed blocks are copied coded and
      decoded by the device unless True; ``sim_capacity``, ``profile``...).

    Raises :class:`arena.Error`: ``BUDGET`` when the model cannot run in
    ``vram``, ``USAGE`` listing every mismatch between module and image.
    """
    min_saved = None
    if offload_saved is not False and offload_saved is not None:
        min_saved = 1 << 20 if offload_saved is True else parse_size(offload_saved, "offload_saved")
    h = Handle()
    h.module = module
    if isinstance(path, Arena):
        h.arena = path
    else:
        h.arena = _open(path, mode=mode, vram=vram, device=device, reserve=reserve, headroom=headroom,
                        depth=depth, keep_last=keep_last, **open_kwargs)
        h._owns_arena = True
    try:
        _bind(h, module, mode, trainable, min_saved)
    except BaseException:
        for undo in reversed(h._restore):
            undo()
        h._restore.clear()
        if h._owns_arena:
            h.arena.close()
        raise
    h._attached = True
    return h


def _bind(h: Handle, module: nn.Module, mode: str, trainable: Any, min_saved: Optional[int] = None) -> None:
    a = h.arena
    if h.arena.mode != mode:
        a.set_mode(mode)
    h._device = torch.device(a.device)
    ref = getattr(module, "_arena_handle", None)
    if ref is not None and ref() is not None:
        raise Error("USAGE", f"{type(module).__name__} is attached to an arena already: detach() it first")
    is_trainable: Callable[[str], bool]
    if trainable is None:
        is_trainable = lambda n: False  # noqa: E731
    elif callable(trainable):
        is_trainable = trainable
    else:
        names = set(trainable)
        is_trainable = names.__contains__
    tuners = _peft_tuners(module)
    image = {n: a.tensor_info(n) for n in a.tensor_names()}

    # 1. Every parameter and persistent buffer against the image, all problems at once.
    problems: List[str] = []
    bound: Dict[str, Tuple[nn.Module, str, torch.Tensor, Any]] = {}  # image name -> (owner, leaf, tensor, info)
    seen_ids: Set[int] = set()
    for full, t in list(module.named_parameters(remove_duplicate=False)) + [
        (n, b) for n, b in module.named_buffers(remove_duplicate=False) if _persistent(module, n)
    ]:
        if id(t) in seen_ids:
            problems.append(f"'{full}' shares its tensor with another name (tied weights are not supported)")
            continue
        seen_ids.add(id(t))
        iname = _image_name(full)
        info = image.get(iname)
        if info is None:
            if _is_adapter_param(full, set(tuners)) or is_trainable(full):
                if t.device.type == "meta":
                    problems.append(f"'{full}' is on the meta device and arena holds no tensor for it: add "
                                    f"adapters after attach (or to a module with real tensors), or materialize it")
                continue
            problems.append(f"'{full}' has no tensor '{iname}' in the image")
            continue
        if iname in bound:
            problems.append(f"'{full}' and another parameter both map to '{iname}'")
            continue
        if info.scheme not in ("none",) + _DEQUANT or (info.scheme == "none" and len(info.components) != 1):
            problems.append(f"'{iname}' is stored {info.scheme} ({len(info.components)} components), "
                            f"which this adapter cannot bind")
            continue
        if info.scheme != "none" and info.dtype not in ("BF16", "F16", "F32"):
            problems.append(f"'{iname}' is stored {info.scheme} from {info.dtype}: its values are not "
                            f"{info.dtype} values (arena dequantizes to BF16, F16 or F32)")
            continue
        try:
            want = torch_dtype(info.dtype)
        except Error as e:
            problems.append(f"'{iname}': {e.message}")
            continue
        if tuple(t.shape) != info.shape or t.dtype != want:
            problems.append(
                f"'{full}' is {tuple(t.shape)} {t.dtype}, the image's '{iname}' is {info.shape} {info.dtype}"
            )
            continue
        owner_name, _, leaf = full.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        bound[iname] = (owner, leaf, t, info)
    missing = sorted(set(image) - set(bound))
    for n in missing:
        problems.append(f"the image's '{n}' has no parameter in the module")
    # 2. The image's blocks are ModuleList children of the module.
    prefix = next((p for p in _STRIP if any(n.startswith(p) for n, _ in module.named_modules())), "")
    block_mod: Dict[int, nn.Module] = {}  # arena block (or piece) -> the block module
    parent_of: Dict[int, str] = {}  # arena block (or piece) -> the image block's name
    for b in a.blocks:
        if b.container is None:
            continue
        parent = b.name.partition("#")[0]  # a piece ("transformer_blocks.3#1") is part of its block
        parent_of[b.index] = parent
        try:
            m = module.get_submodule(prefix + parent)
        except AttributeError:
            if b.name == parent or b.name.endswith("#0"):
                problems.append(f"the image's block '{parent}' is not a submodule of the module")
            continue
        container = module.get_submodule((prefix + b.container).rstrip("."))
        if not isinstance(container, nn.ModuleList):
            problems.append(f"'{b.container}' is a {type(container).__name__}, not a ModuleList of blocks")
            continue
        block_mod[b.index] = m
    for iname, (owner, leaf, t, info) in bound.items():
        if info.block in block_mod:
            blk = a.blocks[info.block]
            if not _is_within(module, owner, block_mod[info.block]):
                problems.append(f"'{iname}' is in image block '{parent_of[info.block]}' but not inside that submodule")
    if problems:
        head = f"cannot attach {type(module).__name__} to {a.path}: {len(problems)} problem(s): "
        shown = "; ".join(problems[:40]) + ("; ..." if len(problems) > 40 else "")
        raise Error("USAGE", head + shown)

    # 3. Bind. Parameters become new frozen Parameters viewing arena memory;
    # the module's own tensors are released.
    # Tensors stored quantized are dequantized: globals once, here; block tensors at
    # each call of their block (placeholders until then).
    per_block: Dict[int, List[Tuple[torch.Tensor, Component]]] = {}
    per_block_q: Dict[int, List[Tuple[torch.Tensor, TensorInfo, int]]] = {}
    owners: Dict[int, nn.Module] = {}
    for iname, (owner, leaf, t, info) in bound.items():
        resident, dev, host = a.block_state(info.block)
        c = info.components[0]
        quant = info.scheme != "none"
        is_buf = leaf in owner._buffers
        if info.block not in block_mod:  # globals: resident for good
            if quant:
                with torch.no_grad():
                    view = _dequantize(h, info, a.tensor_index(iname), dev)
            else:
                view = _view(a.slab(info.block, dev, "device"), c)
            _swap(h, owner, leaf, is_buf, view, t)
            continue
        if resident and not quant:
            view = _view(a.slab(info.block, dev, "device"), c)
        else:  # no memory until the block is acquired: a placeholder of the right shape on the device
            view = _placeholder(h, _as_component(info))
        p = _swap(h, owner, leaf, is_buf, view, t)
        if quant:
            per_block_q.setdefault(info.block, []).append((p, info, a.tensor_index(iname)))
        else:
            per_block.setdefault(info.block, []).append((p, c))
        owners[id(owner)] = owner
    groups: Dict[str, List[int]] = {}
    for idx in block_mod:
        groups.setdefault(parent_of[idx], []).append(idx)
    for parent, idxs in groups.items():
        m = block_mod[idxs[0]]
        bs: Dict[int, _BlockBinding] = {}
        for idx in idxs:
            bb = _BlockBinding(h, idx, a.blocks[idx].name, per_block.get(idx, []), per_block_q.get(idx))
            resident, dev, host = a.block_state(idx)
            bb.addr = dev if resident else -1  # host views are placeholders: bind at the first call
            bs[idx] = bb
            h._module_of[idx] = m
        if len(idxs) == 1 and a.blocks[idxs[0]].name == parent:  # a whole block
            h._whole[idxs[0]] = bs[idxs[0]]
            _wrap_block(h, m, bs[idxs[0]])
            continue
        # In pieces: the modules owning its tensors acquire the pieces they need.
        leaf_need: Dict[int, Set[int]] = {}
        leaf_mod: Dict[int, nn.Module] = {}
        for idx in idxs:
            for iname in [n for n, (o, _, _, info) in bound.items() if info.block == idx]:
                owner = bound[iname][0]
                leaf_need.setdefault(id(owner), set()).add(idx)
                leaf_mod[id(owner)] = owner
        keys = list(leaf_mod)
        pb = _PiecedBinding(h, parent, bs, [tuple(sorted(leaf_need[k])) for k in keys])
        h._pieced.append(pb)
        for key, oid in enumerate(keys):
            leaf_m = leaf_mod[oid]
            if leaf_m is m:  # the block's own tensors: the block's call acquires them
                pb.keep = pb.need[key]
                continue
            _wrap_block(h, leaf_m, _LeafRef(pb, key))  # type: ignore[arg-type]
        _wrap_block(h, m, pb)  # type: ignore[arg-type]
    if mode == "train":
        _check_train_ring(h)
    # 4. Guards: moves and conversions of bound weights, adapter merges, a second attach.
    for owner in {id(o): o for o, _, _, _ in bound.values()}.values():
        _guard_apply(h, owner, [leaf for o, leaf, _, _ in bound.values() if o is owner])
    for name, tuner in _peft_tuners(module).items():
        _guard_merge(h, name, tuner)
    hook = module.register_forward_pre_hook(h._root_pre_hook)
    h._restore.append(hook.remove)
    if min_saved is not None:
        h._offload = _SavedOffload(h._device, min_saved)
        post = module.register_forward_hook(h._root_post_hook, always_call=True)
        h._restore.append(post.remove)
    setattr(module, "_arena_handle", weakref.ref(h))  # (a plain attribute: nn.Module keeps it in __dict__)
    h._restore.append(lambda: module.__dict__.pop("_arena_handle", None))


def _check_train_ring(h: Handle) -> None:
    """Training: a block's recompute holds it until its backward has run (its
    input's and its adapters' gradients are made), which may come after the
    next block's recompute has started: whole blocks need a ring of three slots
    (the ring fills in order, so one held slot of two stops it). In pieces the
    ring must hold a whole block beside the next piece."""
    a = h.arena
    pl = a.plan()
    if not pl["n_streamed"]:
        return
    if not h._pieced:
        if pl["slots"] >= 3:
            return
        raise Error(
            "BUDGET",
            f"{a.path}: training holds a streamed block from its recompute until its backward has run, past "
            f"the next block's recompute: the ring needs 3 slots and has {pl['slots']}; attach with depth=2 "
            f"(or keep_last=1), or more vram",
        )
    slot = pl["slot_bytes"] or max(a.blocks[i].nbytes for pb in h._pieced for i in pb.pieces)
    block = max(sum(a.blocks[i].nbytes for i in pb.pieces) for pb in h._pieced)
    ring = pl["slots"] * slot
    if ring >= block + slot:
        return
    depth = -(-block // slot)  # the ring holds depth + 1 pieces: a whole block and one more
    raise Error(
        "BUDGET",
        f"{a.path}: training in pieces holds a block's pieces from its recompute to its backward: the ring "
        f"({pl['slots']} x {slot} bytes) must hold the largest block ({block} bytes) and one piece more; "
        f"attach with depth={depth} (keep_last=0), or larger pieces",
    )


def _placeholder(h: Handle, c: Component) -> torch.Tensor:
    """A tensor of c's shape and dtype on the arena's device that takes no memory
    (one element, broadcast): what a streamed block's parameters are until it is
    first acquired, so that code looking at their device and dtype (peft adding
    adapters) sees the right ones."""
    dt = torch_dtype(c.dtype)
    one = h._zeros.get(dt)
    if one is None:
        one = h._zeros[dt] = torch.zeros(1, dtype=dt, device=h._device)
    return one.expand(c.shape) if c.shape else one.view(())


def _as_component(info: TensorInfo) -> Component:
    """A quantized tensor as the module sees it: its original dtype and shape."""
    return Component(info.name, info.dtype, info.shape, 0, 0)


def _persistent(module: nn.Module, name: str) -> bool:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    return leaf not in owner._non_persistent_buffers_set


def _is_within(root: nn.Module, inner: nn.Module, outer: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def _swap(h: Handle, owner: nn.Module, leaf: str, is_buf: bool, view: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    table: Dict[str, Any] = owner._buffers if is_buf else owner._parameters
    if is_buf:
        new: torch.Tensor = view
    else:
        new = nn.Parameter(view, requires_grad=False)
    keys = list(table.keys())
    table[leaf] = new
    h._names[id(new)] = leaf
    shape, dtype, rg = tuple(old.shape), old.dtype, bool(getattr(old, "requires_grad", False))

    def undo() -> None:
        ph = torch.empty(shape, dtype=dtype, device="meta")
        table[leaf] = ph if is_buf else nn.Parameter(ph, requires_grad=rg)
        _reorder(table, keys)

    h._restore.append(undo)
    return new


def _reorder(table: Dict[str, Any], keys: List[str]) -> None:
    items = [(k, table[k]) for k in keys if k in table] + [(k, v) for k, v in table.items() if k not in keys]
    table.clear()
    table.update(items)


def _wrap_block(h: Handle, m: nn.Module, b: _BlockBinding) -> None:
    cls = type(m)
    m.__class__ = _bound_cls(cls)
    m.__dict__["_arena_binding"] = b

    def undo() -> None:
        m.__dict__.pop("_arena_binding", None)
        m.__class__ = cls

    h._restore.append(undo)


def _guard_apply(h: Handle, owner: nn.Module, leaves: List[str]) -> None:
    """owner._apply (module.to, .cuda, .half, ...) leaves bound weights where arena put
    them when the conversion would not change them, and refuses when it would."""
    dev = h._device
    base = type(owner)._apply
    held: Dict[str, Any] = {**owner._buffers, **owner._parameters}
    dtypes: Dict[str, torch.dtype] = {leaf: held[leaf].dtype for leaf in leaves}

    def _apply(self: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], *args: Any, **kwargs: Any) -> nn.Module:
        for leaf, dt in dtypes.items():
            probe = torch.empty(0, dtype=dt, device=dev)
            out = fn(probe)
            if out.dtype != dt or out.device != probe.device:
                raise Error(
                    "USAGE",
                    f"'{leaf}' of {type(self).__name__} is held by arena on {dev} as {dt}; converting or "
                    f"moving it (to {out.device}, {out.dtype}) is refused: detach() first, or convert only "
                    f"the parameters of your own",
                )
        saved: Dict[str, Any] = {}
        keys_p, keys_b = list(self._parameters.keys()), list(self._buffers.keys())
        for leaf in dtypes:
            saved[leaf] = self._parameters.pop(leaf) if leaf in self._parameters else self._buffers.pop(leaf)
        try:
            return base(self, fn, *args, **kwargs)
        finally:
            for leaf, t in saved.items():
                table: Dict[str, Any] = self._parameters if leaf in keys_p else self._buffers
                table[leaf] = t
            _reorder(self._parameters, keys_p)
            _reorder(self._buffers, keys_b)

    owner.__dict__["_apply"] = types.MethodType(_apply, owner)
    h._restore.append(lambda: owner.__dict__.pop("_apply", None))


def _guard_merge(h: Handle, name: str, tuner: nn.Module) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise Error(
            "USAGE",
            f"{name}: merging an adapter into the base weights writes into arena's weights, which are "
            f"frozen and shared; keep adapters unmerged (they run as they are), or detach() and merge "
            f"into a copy",
        )

    tuner.__dict__["merge"] = refuse
    h._guarded.add(id(tuner))

    def undo() -> None:
        tuner.__dict__.pop("merge", None)
        h._guarded.discard(id(tuner))

    h._restore.append(undo)
