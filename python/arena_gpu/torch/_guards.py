"""Guards on a bound module: conversions and moves of arena's weights
(``module.to``), adapter merges into them; and peft's tuner layers, found by
type."""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Set

import torch
from torch import nn

from .. import Error

if TYPE_CHECKING:
    from ._handle import Handle


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


def _reorder(table: Dict[str, Any], keys: List[str]) -> None:
    items = [(k, table[k]) for k in keys if k in table] + [(k, v) for k, v in table.items() if k not in keys]
    table.clear()
    table.update(items)


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
