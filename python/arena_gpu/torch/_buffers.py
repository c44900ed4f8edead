"""Buffers a model computes rather than stores (``register_buffer(...,
persistent=False)``: rotary frequencies, ``inv_freq``, position ids, position
embeddings): not in a checkpoint, so not in an image. A model built on the
meta device has them on meta; attach computes them by the model's own code
(the model built again from its config, its parameters on meta and its
buffers real) and puts them on the arena's device, in the dtype the module
has them in. A materialized model's are moved to the arena's device.

Tensors a module keeps in plain attributes (not registered: Lumina2's rotary
``freqs_cis``, a list of tensors), alone or in lists, tuples and dicts, are
computed the same way when they are on the meta device, or refused."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

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


Rebuilt = Dict[str, Union[nn.Module, str]]  # modules built again, by path; or why the build failed


def _rebuilt_at(root: nn.Module, parts: List[str], rebuilt: Rebuilt) -> Tuple[Optional[nn.Module], str, str]:
    """For the name ``parts`` (a module's path and an attribute of it): the module at
    that path inside the deepest module above it that is built from its config,
    built again (once: kept in ``rebuilt``), or None; with the type of the module
    built and why its build failed ("" and "": none above it is built from a config)."""
    for k in range(len(parts) - 1, -1, -1):
        path = ".".join(parts[:k])
        anc = root.get_submodule(path) if path else root
        if not _rebuildable(anc):
            continue
        if path not in rebuilt:
            try:
                rebuilt[path] = _rebuild(anc)
            except Exception as e:  # its constructor, as it fails
                rebuilt[path] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        r = rebuilt[path]
        if isinstance(r, str):
            return None, type(anc).__name__, r
        rel = _plain_path(".".join(parts[k:-1]))
        try:
            return (r.get_submodule(rel) if rel else r), type(anc).__name__, ""
        except AttributeError:
            return None, type(anc).__name__, ""
    return None, "", ""


_SKIP = frozenset(("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"))
_DEPTH = 4  # lists in dicts in lists...: as deep as attributes are looked into


def _has_meta(v: Any, depth: int = 0) -> bool:
    if isinstance(v, torch.Tensor):
        return v.device.type == "meta"
    if depth >= _DEPTH:
        return False
    if isinstance(v, (list, tuple)):
        return any(_has_meta(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return any(_has_meta(x, depth + 1) for x in v.values())
    return False


def _fill(v: Any, like: Any, device: torch.device, where: str, depth: int = 0) -> Any:
    """``v`` with each tensor on meta replaced by the one at the same place in ``like``
    (in the dtype ``v``'s has, on ``device``); ValueError saying where they differ."""
    if isinstance(v, torch.Tensor):
        if v.device.type != "meta":
            return v
        if not isinstance(like, torch.Tensor) or like.device.type == "meta" or like.shape != v.shape:
            got = (f"a tensor of shape {tuple(like.shape)}" + (" on meta" if like.device.type == "meta" else "")
                   if isinstance(like, torch.Tensor) else f"a {type(like).__name__}")
            raise ValueError(f"{where} is {got} there, where the module's is of shape {tuple(v.shape)}")
        return like.to(dtype=v.dtype).to(device)
    if depth >= _DEPTH:
        return v
    if isinstance(v, (list, tuple)):
        if type(like) is not type(v) or len(like) != len(v):
            raise ValueError(f"{where} is a {type(like).__name__} of {len(like) if hasattr(like, '__len__') else '?'} "
                             f"there, where the module's is a {type(v).__name__} of {len(v)}")
        out = [_fill(x, y, device, f"{where}[{i}]", depth + 1) for i, (x, y) in enumerate(zip(v, like))]
        if isinstance(v, list):
            return out
        return type(v)(*out) if hasattr(v, "_fields") else type(v)(out)  # (a named tuple takes its fields)
    if isinstance(v, dict):
        if not isinstance(like, dict) or set(like) != set(v):
            raise ValueError(f"{where} has other keys there")
        return {k: _fill(x, like[k], device, f"{where}[{k!r}]", depth + 1) for k, x in v.items()}
    return v


def computed_attributes(root: nn.Module, device: torch.device,
                        rebuilt: Optional[Rebuilt] = None) -> Tuple[List[Tuple[nn.Module, str, Any, Any]], List[str]]:
    """The tensors on the meta device that modules of ``root`` keep in plain
    attributes (not parameters or buffers), alone or in lists, tuples and dicts:
    a list of (module, attribute, its value now, its value with those tensors
    computed by the model's own code, on ``device``), and problems (one line
    each) for those that cannot be computed. ``rebuilt``: the modules built
    again, by path (shared with computed_buffers)."""
    out: List[Tuple[nn.Module, str, Any, Any]] = []
    problems: List[str] = []
    rebuilt = {} if rebuilt is None else rebuilt
    for mname, mod in root.named_modules():
        for attr, v in list(vars(mod).items()):
            if attr in _SKIP or attr.startswith("_arena") or not _has_meta(v):
                continue
            full = f"{mname}.{attr}" if mname else attr
            r, tried, failed = _rebuilt_at(root, full.split("."), rebuilt)
            why = ""
            if r is not None:
                try:
                    out.append((mod, attr, v, _fill(v, vars(r).get(attr), device, f"'{attr}' built again")))
                    continue
                except ValueError as e:
                    why = f"{tried} built again from its config differs: {e}"
            why = why or (f"building {tried} again from its config failed ({failed})" if failed
                          else f"{tried} built again from its config has no such module" if tried
                          else "no module above it is built from a config alone (a diffusers or transformers "
                               "model)")
            problems.append(
                f"'{full}' holds tensors on the meta device in a plain attribute (the model computes them; "
                f"arena holds only parameters and buffers); {why}: build the model with its tensors real "
                f"(accelerate.init_empty_weights(): parameters on meta, the rest computed), or set it before attach")
    return out, problems


def set_attributes(attrs: List[Tuple[nn.Module, str, Any, Any]], restore: List[Callable[[], None]]) -> None:
    """Each module's attribute set to its computed value (computed_attributes); the one it
    had comes back at detach (``restore``)."""
    for mod, attr, old, new in attrs:
        vars(mod)[attr] = new

        def undo(mod: nn.Module = mod, attr: str = attr, old: Any = old) -> None:
            vars(mod)[attr] = old

        restore.append(undo)


def computed_buffers(root: nn.Module, device: torch.device, in_image: Any, rebuilt: Optional[Rebuilt] = None
                     ) -> Tuple[List[Tuple[List[Tuple[nn.Module, str]], torch.Tensor, torch.Tensor]], List[str]]:
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
    rebuilt = {} if rebuilt is None else rebuilt
    for names, owners, b in groups.values():
        if b.device.type != "meta":
            if b.device != device:
                out.append((owners, b, b.to(device)))
            continue
        full = names[0]
        r, tried, failed = _rebuilt_at(root, full.split("."), rebuilt)  # the deepest built from its config
        v = r._buffers.get(full.rpartition(".")[2]) if r is not None else None
        value = v if v is not None and v.device.type != "meta" and tuple(v.shape) == tuple(b.shape) else None
        if value is None:
            why = (f"building {tried} again from its config failed ({failed})" if failed
                   else f"{tried} built again from its config has no such buffer" if tried
                   else "no module above it is built from a config alone (a diffusers or transformers model)")
            problems.append(
                f"'{full}' is a buffer the model computes (not in checkpoints) and is on the meta device; "
                f"{why}: build the model with its buffers real (accelerate.init_empty_weights(): parameters "
                f"on meta, buffers computed), or set it before attach")
            continue
        out.append((owners, b, value.to(dtype=b.dtype).to(device)))
    return out, problems
