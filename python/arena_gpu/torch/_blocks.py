"""Whole blocks: a block module's parameters bound to its arena block's bytes
at each call (views; quantized tensors dequantized into torch memory); what a
block's forward with autograd on saves of its weights (references, bound
again when its backward needs them); when a block's backward has run (the
node at its inputs); and what training cannot do with arena's weights."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from .._dtypes import _view, torch_dtype
from .._errors import Error
from .._records import Component, TensorInfo

if TYPE_CHECKING:
    from ._handle import Handle


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _top_hooks() -> Optional[Tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]]:
    """The saved-tensor hooks in force on this thread (pack, unpack), or None."""
    try:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    except Exception:  # pragma: no cover - a torch without it
        return None
    return hooks or None


def _under_checkpoint() -> bool:
    """Inside a non-reentrant torch.utils.checkpoint's forward or recompute (its
    saved-tensor hooks are on top): autograd saves nothing there that outlives
    the recompute, and hooks of arena's must not come between."""
    hooks = _top_hooks()
    if not hooks:
        return False
    q = getattr(hooks[0], "__qualname__", "")
    return "_checkpoint_hook" in q or "_recomputation_hook" in q


# every scheme of docs/QUANT.md: arena_tensor_dequantize writes their values
_DEQUANT = ("bf16", "fp8-e4m3", "fp8-e5m2", "fp8-e4m3-tensor", "fp8-e4m3-row", "int8-row", "int4-g32", "int4-g64",
            "int4-g128")


def _dequantize(h: "Handle", info: TensorInfo, index: int, addr: int) -> torch.Tensor:
    """A quantized tensor's values (tensor ``index`` of the C API) in its original
    dtype, in new torch memory on the arena's device, from its block's bytes at
    ``addr``: one kernel (arena's) queued on torch's current stream, so the memory
    is torch's in stream order."""
    out = torch.empty(info.shape, dtype=torch_dtype(info.dtype), device=h._device)
    h.arena._dequantize(index, addr, out.data_ptr(), h._stream())
    return out


# --- a bound weight while its unit is not held -------------------------------------------

_unheld_types: Dict[type, type] = {}
_OF = "_arena_unheld_of"  # a guarded weight's attribute: its unit and its name (_BlockBinding.guard)
# what reads nothing of a tensor's values (its metadata, its storage's address)
_METADATA = frozenset(getattr(torch.Tensor, n) for n in (
    "size", "dim", "stride", "numel", "nelement", "element_size", "is_floating_point", "is_complex",
    "is_contiguous", "requires_grad_", "untyped_storage", "storage_offset", "data_ptr", "get_device",
    "__hash__", "__len__"))
# what would give its values to read later: a tensor of its shape and dtype on meta instead
_VALUES = (torch.Tensor.detach, torch.Tensor.data.__get__)  # type: ignore[attr-defined]


def _is_unheld(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and "_arena_own" in type(t).__dict__


def _unheld_function(cls: type, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
    """The torch function of a bound weight whose unit is not held (its class is its
    own type's ``_unheld_type`` then): its metadata as ever; ``detach()`` and
    ``.data`` (what ``state_dict()`` gives) a tensor of its shape and dtype on the
    meta device; anything else reads its values, which are not there (the ring
    holds other blocks): in a backward the unit is held for it (and the weight
    bound again: its own class back), and elsewhere that is refused, naming the
    weight."""
    kwargs = kwargs or {}
    if func in _VALUES:  # (state_dict(), a weight's .data)
        if not _in_backward():
            t = args[0]
            return torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
    elif func in _METADATA or getattr(func, "__name__", "") in ("__get__", "__set__"):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    for t in tree_leaves((args, kwargs)):
        if _is_unheld(t) and _OF in t.__dict__:
            unit, what = t.__dict__[_OF]
            unit.released_use(what)
            if _is_unheld(t):  # pragma: no cover - a hold that did not bind
                raise Error("INTERNAL", f"{unit.name}: '{what}' is not bound after its unit was held")
    if any(_is_unheld(t) for t in tree_leaves((args, kwargs))):
        # a copy of one (copy.deepcopy of the module), no weight of arena's: as its own type
        base: Any = type.__getattribute__(cls, "_arena_own")
        return base.__torch_function__(func, types, args, kwargs)
    return func(*args, **kwargs)


def _unheld_repr(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
    unit, what = self.__dict__.get(_OF, (None, "?"))
    return (f"{type(self).__name__} '{what}' {tuple(self.shape)} {self.dtype} on {self.device}, of "
            f"'{unit.name if unit is not None else '?'}', not held now (arena binds it for its block's calls)")


def _unheld_type(cls: type) -> type:
    """A subclass of a bound weight's type (nn.Parameter, a plain tensor's, a tensor
    subclass's) with _unheld_function as its torch function: the weight's class
    while its unit is not held (the same object: isinstance, its attributes and
    its identity stay what they were)."""
    t = _unheld_types.get(cls)
    if t is None:
        t = type(cls)(cls.__name__, (cls,), {"__torch_function__": classmethod(_unheld_function),
                                             "__repr__": _unheld_repr, "_arena_own": cls,
                                             "__module__": cls.__module__})
        _unheld_types[cls] = t
    return t


# --- what a block's forward saves of its weights ----------------------------------------

class _WeightRef:
    """A view of a bound weight that autograd saved for the backward, kept as a
    reference: the unit (block or piece) that holds it, the parameter, and the
    view's geometry against it. The backward gets the view of the unit's bytes
    where they are then (acquired again if they left)."""

    __slots__ = ("unit", "param", "size", "stride", "offset")

    def __init__(self, unit: "_BlockBinding", param: Any, t: torch.Tensor):
        self.unit = unit
        self.param = param  # a Parameter, or a tensor subclass's InnerRef (its .data: the inner tensor)
        self.size = tuple(t.size())
        self.stride = tuple(t.stride())
        self.offset = t.storage_offset() - param.data.storage_offset()


def _span(t: torch.Tensor) -> Tuple[int, int]:
    """The addresses t's elements lie in: [first, last + 1) (its strides are not negative)."""
    lo = t.data_ptr()
    return lo, lo + (sum(int(n - 1) * int(s) for n, s in zip(t.size(), t.stride())) + 1) * t.element_size()


class _SavedWeights:
    """Saved-tensor hooks over a streamed (or quantized) block's forward with
    autograd on, outside checkpointing: a weight (or a view of one) that autograd
    saves is kept as a reference, not as the tensor, whose bytes are the ring's
    and are overwritten by the blocks after it (or, quantized, a copy let go at
    the release). When the backward unpacks it, the unit is acquired again (held
    until the block's backward has run: ``_track``) and the view is made anew on
    its bytes: the same values, so the same gradients. Other tensors go to the
    hooks in force outside (``offload_saved``'s, a user's), or are kept as they are.
    A tensor subclass's inner tensors (a native FP8 product saves its weight's
    qdata and scale) are new tensors at each bind: one saved, or a view of one, is
    found by its bytes (its addresses inside the inner tensor's, on its device) and
    kept as a reference to the InnerRef the same way (a view in another dtype:
    cloned).
    Inside a checkpoint its own hooks are on top and these are not set."""

    def __init__(self, units: Sequence["_BlockBinding"], name: str):
        self.by_id: Dict[int, Tuple["_BlockBinding", torch.Tensor]] = {}
        self.inner: List[Tuple["_BlockBinding", Any]] = []
        for u in units:
            for p in u.weights:
                if isinstance(p, torch.Tensor):
                    self.by_id[id(p)] = (u, p)
                else:
                    self.inner.append((u, p))
        self.outer = _top_hooks()
        self.name = name
        self.ctx = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def __enter__(self) -> "_SavedWeights":
        try:
            self.ctx.__enter__()
        except RuntimeError as e:  # saved-tensor hooks disabled here (torch.autograd.graph.disable_saved_tensors_hooks)
            raise Error(
                "USAGE",
                f"{self.name} is streamed and runs with autograd outside checkpointing where saved-tensor hooks "
                f"are disabled ({e}): its backward would read weights the ring has overwritten; checkpoint the "
                f"block (diffusers: module.enable_gradient_checkpointing()), or give arena the vram to keep it "
                f"resident",
            ) from None
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ctx.__exit__(*exc)

    def pack(self, t: torch.Tensor) -> Any:
        base = t._base if t._base is not None else t
        hit = self.by_id.get(id(base))
        found = (hit[0], base, base) if hit is not None and hit[1] is base else self._inner_of(t)
        if found is not None:
            unit, owner, bound = found
            if t.dtype == bound.dtype:
                return _WeightRef(unit, owner, t)
            t = t.clone()  # a view in another dtype: its values now, in torch memory
        return self.outer[0](t) if self.outer is not None else t

    def _inner_of(self, t: torch.Tensor) -> Optional[Tuple["_BlockBinding", Any, torch.Tensor]]:
        """The unit, InnerRef and bound tensor of the inner tensor whose bytes t views,
        if one does."""
        if not self.inner or t.device.type == "meta" or t.numel() == 0:
            return None
        dev = t.get_device()
        lo, hi = _span(t)
        for u, r in self.inner:
            d = r.data
            if d.numel() == 0 or d.get_device() != dev or d.device.type == "meta":
                continue
            dlo, dhi = _span(d)
            if dlo <= lo and hi <= dhi:
                return u, r, d
        return None

    def unpack(self, x: Any) -> torch.Tensor:
        if isinstance(x, _WeightRef):
            x.unit.hold_bw()
            d = x.param.data
            return d.as_strided(x.size, x.stride, d.storage_offset() + x.offset)
        return self.outer[1](x) if self.outer is not None else x


# --- when a block's backward has run -----------------------------------------------------

_probe: Optional[torch.Tensor] = None


def _will_run(nodes: Sequence[Any]) -> bool:
    """In a backward: whether it runs one of ``nodes`` (autograd nodes). A backward
    runs only the nodes the loss's gradient reaches: a block's output the loss does
    not use (Qwen-Image's last block's text stream) leaves the nodes of its path
    unrun, and a hook on one of them never fires. Where torch cannot say (a leaf's
    node under ``autograd.grad``): that it runs."""
    try:
        return any(torch._C._will_engine_execute_node(n) for n in nodes)
    except RuntimeError:
        return True


def _seq_now() -> int:
    """The autograd sequence number the next node made on this thread gets (a view
    of a leaf makes one): the nodes a block's call makes have this one or later."""
    global _probe
    if _probe is None:
        _probe = torch.zeros((), requires_grad=True)
    with torch.enable_grad():
        return int(_probe.view_as(_probe).grad_fn._sequence_nr())  # type: ignore[union-attr]


def _outputs(v: Any, out: List[torch.Tensor], depth: int = 0) -> List[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        if v.grad_fn is not None:
            out.append(v)
    elif depth < 3:
        if isinstance(v, dict):
            for x in v.values():
                _outputs(x, out, depth + 1)
        elif isinstance(v, (list, tuple)):
            for x in v:
                _outputs(x, out, depth + 1)
        elif hasattr(v, "__dataclass_fields__"):
            for k in v.__dataclass_fields__:
                _outputs(getattr(v, k, None), out, depth + 1)
    return out


def _leaf_inputs(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
    """The gradient nodes of a call's inputs that are leaves needing a gradient (a
    reentrant checkpoint's recompute gets its inputs detached: leaves)."""
    out: List[Any] = []

    def walk(v: Any, depth: int) -> None:
        if isinstance(v, torch.Tensor):
            if v.requires_grad and v.grad_fn is None:
                out.append(torch.autograd.graph.get_gradient_edge(v).node)
        elif depth < 2 and isinstance(v, (list, tuple)):
            for x in v:
                walk(x, depth + 1)

    for v in args:
        walk(v, 0)
    for v in kwargs.values():
        walk(v, 0)
    return out


def _track(h: "Handle", start: int, out: Any, done: Callable[[], None], index: int,
           inputs: Sequence[Any] = ()) -> None:
    """After a block's call with autograd on (its nodes made from sequence number
    ``start`` on): ``done`` runs when its backward has run, that is when every node
    of the block with an edge out of it (to its inputs' nodes, made before it) has
    run: a post hook on each, found by walking the block's nodes from its outputs.
    The graph is not changed (a node between the block and its inputs would change
    the order gradients are summed in, and so their bits). A block none of whose
    nodes leads out of it (no input needs a gradient: the first block, its adapters
    training) has its backward last: when its parameters' gradients are made, or at
    the step's end. Under a reentrant checkpoint the block's node is the
    checkpoint's, whose backward recomputes and backpropagates the block; the
    recompute's own backward leads out of it to its inputs (``inputs``: the nodes of
    inputs that are leaves, made whenever). Only the nodes the backward runs are
    waited for (counted when the first of them runs): an output the loss does not use
    (Qwen-Image's last block's text stream) leaves nodes that never run, and a block
    waiting for them would hold its weights to the step's end, past the ring's room
    for the blocks before it."""
    entries: List[Any] = []
    outside = {id(n) for n in inputs}
    seen: Dict[int, Any] = {}  # the nodes walked by id (held: no id is reused during the walk)
    stack: List[Any] = [t.grad_fn for t in _outputs(out, [])]
    pop, push = stack.pop, stack.append  # (a block's graph is ~130 nodes: once a block call)
    while stack:
        node = pop()
        k = id(node)
        if k in seen:
            continue
        seen[k] = node
        leaves = False
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            j = id(nxt)
            if j in outside or nxt._sequence_nr() < start:
                leaves = True
            elif j not in seen:
                push(nxt)
        if leaves:
            entries.append(node)
    if not entries:
        if torch.is_grad_enabled():
            ps: List[torch.Tensor] = [p for p in h._params_of(index) if p.requires_grad]
            if ps:
                h._watch(ps, done)
        return
    left = [-1]

    def hook(_gi: Any, _go: Any) -> None:
        if left[0] < 0:  # the first to run: those of them this backward runs
            left[0] = sum(1 for n in entries if _will_run((n,)))
            entries.clear()  # (no node kept: the hooks hold this closure)
        left[0] -= 1
        if left[0] == 0:
            done()

    for node in entries:
        h._hooks.append(node.register_hook(hook))


class _BlockBinding:
    """A unit of arena memory bound to a module's parameters: a whole block (its
    module's calls go through ``run``), or a piece of one (``group``, the
    ``_PiecedBinding``, runs it).

    Tensors stored quantized (``quant``) are dequantized into torch memory at
    each bind and let go at ``drop()`` (the unit's release): the module always
    sees its original dtype, and only the units being run hold a dequantized
    copy.

    A unit used by a backward (a checkpoint's recompute of the block or of a
    module inside it, a saved weight unpacked) is acquired once and held until
    the block's backward has run (``hold_bw``; ``_track`` calls ``release_bw``)."""

    def __init__(self, handle: "Handle", index: int, name: str, params: List[Tuple[torch.Tensor, Component]],
                 quant: Optional[List[Tuple[torch.Tensor, TensorInfo, int]]] = None, comp: str = ""):
        self.handle = handle
        self.index = index
        self.name = name
        self.comp = comp  # the component (a pipeline's) it belongs to: a step is one component's calls
        self.params = params  # stored as they are: views
        self.quant = quant or []  # stored quantized (parameter, its tensor, its C index): dequantized at bind
        self.weights = [p for p, _ in self.params] + [q[0] for q in self.quant]
        # Its weights as the modules hold them (parameters, buffers, tensor subclasses),
        # each with its own class and the one it has while the unit is not held
        # (guard); out: they have that one.
        self.guards: List[Tuple[torch.Tensor, type, type]] = []
        self.out = False
        self.live = False  # the quantized parameters hold their values (bound and not dropped)
        self.addr = -1
        self.cache: "OrderedDict[int, List[torch.Tensor]]" = OrderedDict()
        self.group: Any = None  # the _PiecedBinding of a piece
        self.active = 0  # calls of the block in progress: the modules inside it run as they are
        self.bw_held = False  # acquired for a backward
        self.bw_addr = 0
        self.bw_stream: Optional[int] = None

    def guard(self, weights: List[Tuple[torch.Tensor, str]]) -> None:
        """Its weights (the tensors its modules hold, with their names) read nothing
        while it is not held: from now until ``unguard``, their class is their
        type's _unheld_type between its holds."""
        for t, what in weights:
            if _OF in t.__dict__:  # (tied names: one tensor)
                continue
            t.__dict__[_OF] = (self, what)
            self.guards.append((t, type(t), _unheld_type(type(t))))
        self._swap_out()

    def unguard(self) -> None:
        """Detach: the weights' own classes back, for good."""
        self._swap_in()
        for t, _, _ in self.guards:
            t.__dict__.pop(_OF, None)
        self.guards = []

    def _swap_in(self) -> None:
        for t, own, _ in self.guards:
            t.__class__ = own
        self.out = False

    def _swap_out(self) -> None:
        for t, _, unheld in self.guards:
            t.__class__ = unheld
        self.out = True

    def released_use(self, what: str) -> None:
        """A weight of the unit is read while the unit is not held: in a backward (a
        checkpoint's recompute of modules inside the block, or of its forward, not
        of the block) the unit is held for it until the block's backward has run, as
        a recompute's is, and bound; elsewhere that is refused."""
        if _in_backward():
            self.hold_bw()
            return
        if self.group is not None:
            raise Error("USAGE",
                        f"{self.group.name}: '{what}' was read while its piece '{self.name}' was not held: arena "
                        f"acquires a piece for the calls of the modules that own its tensors or contain those that "
                        f"do, and this read came from another (a module reading the weights of one it does not "
                        f"contain): stream the block whole (piece_size=0)")
        raise Error("USAGE",
                    f"{self.name}: '{what}' was read while the block was not held (outside the block's call and "
                    f"its backward): between its calls the ring holds other blocks; call the block module rather "
                    f"than reading its weights, or calling modules inside it, from outside it")

    def bind(self, addr: int, where: str = "device") -> None:
        if self.out:
            self._swap_in()
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
        """The unit is released: its weights read nothing (guard), and the dequantized
        values are let go (placeholders again)."""
        if self.bw_held:
            return
        if not self.out and self.guards:
            self._swap_out()
        if not self.live:
            return
        with torch.no_grad():
            for p, info, _ in self.quant:
                p.data = _placeholder(self.handle, _as_component(info))
        self.live = False

    # --- held for a backward ---
    def hold_bw(self) -> None:
        """The unit's bytes for a backward: acquired the first time, bound each time."""
        if self.group is not None:
            self.group.hold_loose((self.index,))
            return
        h = self.handle
        h._enter(self.comp, True)
        if not self.bw_held:
            if h._all_resident and not self.quant:
                self.bind(h._resident_at[self.index])
                return
            s = h._stream()
            addr = h.arena._acquire_unchecked(self.index, s)
            self.bw_held, self.bw_addr, self.bw_stream = True, addr, s
            h._bw_units[self.index] = self
        self.bind(self.bw_addr)

    def recomputed(self) -> None:
        """Its forward runs in a backward outside its call (transformers' layers
        checkpoint their forward): held for it."""
        if not self.active:
            self.hold_bw()

    def release_bw(self, at_step_end: bool = False) -> None:
        if not self.bw_held:
            return
        h = self.handle
        self.bw_held = False
        h._bw_units.pop(self.index, None)
        h.arena._release_unchecked(self.index, self.bw_stream if at_step_end else h._stream())
        self.drop()

    # --- the block's calls ---
    def _call(self, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        self.active += 1
        self.handle._active += 1
        try:
            return call(mod, *args, **kwargs)
        finally:
            self.active -= 1
            self.handle._active -= 1

    def run(self, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any],
            member: bool = False) -> Any:
        """A call of the block (or, ``member``, of a module inside it outside the block's call)."""
        h = self.handle
        if self.active:  # inside the block's call: as it is
            return call(mod, *args, **kwargs)
        backward = _in_backward()
        grad = torch.is_grad_enabled()
        if backward:
            # A recompute (checkpointing around the block, or around a module inside
            # it): what it saves views the unit until the block's backward has run.
            self.hold_bw()
            if not grad or member or _under_checkpoint():
                return self._call(call, mod, args, kwargs)
            # a reentrant checkpoint's recompute of the block: its own backward follows
            start = _seq_now()
            out = self._call(call, mod, args, kwargs)
            _track(h, start, out, self.release_bw, self.index, _leaf_inputs(args, kwargs))
            return out
        h._enter(self.comp, False)
        start = -1
        if grad:
            _check_training(h, self.name, self.weights)
            start = _seq_now()
        if h._all_resident and not self.quant:  # nothing streams this step: the blocks stay where they are
            self.bind(h._resident_at[self.index])
            out = self._call(call, mod, args, kwargs)
        else:
            stream = h._stream()
            addr = h.arena._acquire_unchecked(self.index, stream)
            try:
                self.bind(addr)
                if grad and not _under_checkpoint() and (self.quant or not h.arena.block_state(self.index)[0]):
                    with _SavedWeights([self], self.name):
                        out = self._call(call, mod, args, kwargs)
                else:
                    out = self._call(call, mod, args, kwargs)
            finally:
                h.arena._release_unchecked(self.index, stream)
                self.drop()
        if start >= 0:
            _track(h, start, out, self.release_bw, self.index, _leaf_inputs(args, kwargs))
        return out


class _Member:
    """A module inside a whole block that owns bound tensors, wrapped where the
    block's own call does not cover its calls: a checkpoint inside the block
    (diffusers' UNet blocks checkpoint their resnets; transformers' layers
    checkpoint their forward) recomputes the module in the backward, and a
    block that is a container (a ModuleList) is never called itself. Inside the
    block's call it runs as it is; outside, it runs through the block's binding
    (acquired for the call, or held for the backward)."""

    def __init__(self, unit: _BlockBinding):
        self.unit = unit
        self.handle = unit.handle

    @torch.compiler.disable
    def run(self, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        return self.unit.run(call, mod, args, kwargs, member=True)

    def recomputed(self) -> None:
        self.unit.recomputed()


def _check_training(h: "Handle", name: str, weights: List[torch.Tensor]) -> None:
    """A block's forward with autograd on: training its bound weights is refused.
    Asked with subclasses' __torch_function__ off: a bound subclass's inner tensors
    (InnerRef) ask their weight, and each question would otherwise go through the
    subclass's Python (two a FLUX.1-dev FP8 weight, ~1,000 a forward)."""
    with torch._C.DisableTorchFunctionSubclass():
        p = next((w for w in weights if w.requires_grad), None)
    if p is not None:
        p = getattr(p, "owner", p)  # an inner tensor's reference: its weight
        raise Error(
            "USAGE",
            f"{name}: the weights arena holds are frozen; training them (full fine-tuning, "
            f"requires_grad on '{h._pname(p)}') is not supported: train adapters "
            f"(peft LoRA) or parameters of your own instead",
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
