"""Buffers a model computes rather than stores (``register_buffer(...,
persistent=False)``: rotary frequencies, ``inv_freq``, position ids, position
embeddings): not in a checkpoint, so not in an image. A model built on the
meta device has them on meta; attach computes them by the model's own code
(the model built again from its config, its parameters on meta and its
buffers real) and puts them on the arena's device, in the dtype the module
has them in. A materialized model's are moved to the arena's device."""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn


@contextlib.contextmanager
def _params_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory, no
    values) and their buffers as their code makes them (as accelerate's
    ``init_empty_weights()``)."""
    orig = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        orig(self, name, param)
        p = self._parameters.get(name)
        if p is not None and p.device.type != "meta":
            kw = dict(p.__dict__)
            kw["requires_grad"] = p.requires_grad
            self._parameters[name] = type(p)(p.to("meta"), **kw)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = orig  # type: ignore[method-assign]


def _mro_names(m: nn.Module) -> List[str]:
    cls = type(m)
    cls = getattr(cls, "_arena_base", cls)
    return [c.__name__ for c in cls.__mro__]


def _rebuildable(m: nn.Module) -> bool:
    """Built from its config alone: a diffusers model (ConfigMixin) or a transformers
    model (PreTrainedModel)."""
    if getattr(m, "config", None) is None:
        return False
    names = _mro_names(m)
    return "PreTrainedModel" in names or ("ConfigMixin" in names and hasattr(type(m), "from_config"))


def _rebuild(m: nn.Module) -> nn.Module:
    cls = type(m)
    cls = getattr(cls, "_arena_base", cls)
    with _params_on_meta(), torch.random.fork_rng(devices=[]), torch.device("cpu"):
        if "PreTrainedModel" in _mro_names(m):
            import copy

            return cls(copy.deepcopy(m.config))
        built: nn.Module = getattr(cls, "from_config")(m.config)
        return built


def _plain_path(path: str) -> str:
    """A module path as the model itself names it (without peft's wrappers)."""
    parts = [p for p in path.split(".") if p and p != "base_layer"]
    return ".".join(parts)


def computed_buffers(root: nn.Module, device: torch.device,
                     in_image: Any) -> Tuple[List[Tuple[List[Tuple[nn.Module, str]], torch.Tensor, torch.Tensor]],
                                             List[str]]:
    """The non-persistent buffers of ``root`` that the image does not hold
    (``in_image(name)`` is False) and are not on ``device``: a list of (owners
    (module, leaf name) sharing the buffer, the buffer now, its value on the
    device), and problems (one line each) for those that cannot be computed."""
    groups: Dict[int, Tuple[List[str], List[Tuple[nn.Module, str]], torch.Tensor]] = {}
    for mname, mod in root.named_modules(remove_duplicate=False):
        for leaf, b in mod._buffers.items():
            if b is None or leaf not in mod._non_persistent_buffers_set:
                continue
            full = f"{mname}.{leaf}" if mname else leaf
            if in_image(full):
                continue
            g = groups.setdefault(id(b), ([], [], b))
            g[0].append(full)
            g[1].append((mod, leaf))
    out: List[Tuple[List[Tuple[nn.Module, str]], torch.Tensor, torch.Tensor]] = []
    problems: List[str] = []
    rebuilt: Dict[str, Optional[nn.Module]] = {}
    errors: Dict[str, str] = {}
    for names, owners, b in groups.values():
        if b.device.type != "meta":
            if b.device != device:
                out.append((owners, b, b.to(device)))
            continue
        full = names[0]
        parts = full.split(".")
        value: Optional[torch.Tensor] = None
        tried = ""
        for k in range(len(parts) - 1, -1, -1):  # the deepest module above it built from its config
            path = ".".join(parts[:k])
            anc = root.get_submodule(path) if path else root
            if not _rebuildable(anc):
                continue
            tried = type(anc).__name__
            if path not in rebuilt:
                try:
                    rebuilt[path] = _rebuild(anc)
                except Exception as e:  # its constructor, as it fails
                    rebuilt[path] = None
                    errors[path] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            r = rebuilt[path]
            if r is None:
                break
            rel = _plain_path(".".join(parts[k:]))
            try:
                v = r.get_buffer(rel)
            except AttributeError:
                break
            if v is None or v.device.type == "meta" or tuple(v.shape) != tuple(b.shape):
                break
            value = v
            break
        if value is None:
            why = (f"building {tried} again from its config failed ({errors[path]})" if tried and path in errors
                   else f"{tried} built again from its config has no such buffer" if tried
                   else "no module above it is built from a config alone (a diffusers or transformers model)")
            problems.append(
                f"'{full}' is a buffer the model computes (not in checkpoints) and is on the meta device; "
                f"{why}: build the model with its buffers real (accelerate.init_empty_weights(): parameters "
                f"on meta, buffers computed), or set it before attach")
            continue
        out.append((owners, b, value.to(dtype=b.dtype).to(device)))
    return out, problems
