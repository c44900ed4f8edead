"""Whole blocks: a block module's parameters bound to its arena block's bytes
at each call (views; quantized tensors dequantized into torch memory), and the
checks a block's forward with autograd on must pass (what training cannot do
with arena's weights)."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from .. import Component, Error, TensorInfo, _view, torch_dtype

if TYPE_CHECKING:
    from ._handle import Handle


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _under_checkpoint() -> bool:
    """Inside the forward of a non-reentrant torch.utils.checkpoint (its saved-tensor hooks are on top)."""
    try:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    except Exception:  # pragma: no cover - a torch without it
        return False
    return bool(hooks) and "_checkpoint_hook" in getattr(hooks[0], "__qualname__", "")


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
