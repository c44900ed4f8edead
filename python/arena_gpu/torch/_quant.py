"""Tensor subclasses (torchao's, optimum-quanto's, any that follows PyTorch's
``__tensor_flatten__`` protocol) stored in an image and bound to arena memory.

A quantized weight in PyTorch is a tensor subclass holding plain inner
tensors (``qdata``, ``scale``...), which it names in ``__tensor_flatten__``.
An image holds such a weight as one tensor of scheme ``torch-subclass``: its
components are the inner tensors (an inner tensor that is itself a subclass,
as quanto's packed int4 data, is flattened in turn: ``_data._data``), and the
manifest's ``subclass`` object says what the subclass was (docs/QUANT.md,
"Tensor subclasses"). The engine streams the components like any bytes; when
a block is bound, the subclass's inner tensors are pointed at views of the
block's bytes (``setattr`` on the same subclass object: zero copy, and the
library's own kernels run on them), and at placeholders that take no memory
when the block is let go.

Which subclass object holds them, at attach:

- the module's own, when it holds one of the image's type (the module was
  quantized the same way, on the meta device or not): nothing about the
  library needs to be known, only the protocol;
- else one rebuilt from the image's ``subclass`` object by a registered
  :class:`Binding` (torchao and optimum-quanto are registered; another
  library registers its own with :func:`register_binding`), put in the
  module's place.

``save_image(module, path)`` writes a module quantized in memory as an image.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from .. import Component, Error, TensorInfo, _native, torch_dtype

if TYPE_CHECKING:
    from ._handle import Handle

SCHEME = "torch-subclass"

_ARENA_DTYPES = {
    torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
    torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.complex64: "C64",
}


def is_subclass(t: Any) -> bool:
    """A tensor subclass that declares its inner tensors (PyTorch's protocol)."""
    return isinstance(t, torch.Tensor) and type(t) not in (torch.Tensor, nn.Parameter) and hasattr(
        t, "__tensor_flatten__")


def type_name(t: Any) -> str:
    return f"{type(t).__module__}.{type(t).__qualname__}"


# --- the encoding of a subclass's attributes (its flatten context) --------------------
def _encode(v: Any) -> Any:
    """JSON of a flatten context made of plain values (strings, numbers, lists,
    tuples, dicts of those, torch dtypes and sizes); TypeError otherwise."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.dtype):
        return {"_dtype": str(v).rpartition(".")[2]}
    if isinstance(v, (tuple, torch.Size)):
        return {"_tuple": [_encode(x) for x in v]}
    if isinstance(v, list):
        return [_encode(x) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"_dict": {k: _encode(x) for k, x in v.items()}}
    raise TypeError(f"{type(v).__name__} is not a plain value")


def _decode(v: Any) -> Any:
    if isinstance(v, list):
        return [_decode(x) for x in v]
    if isinstance(v, dict):
        if "_dtype" in v:
            return getattr(torch, v["_dtype"])
        if "_tuple" in v:
            return tuple(_decode(x) for x in v["_tuple"])
        if "_dict" in v:
            return {k: _decode(x) for k, x in v["_dict"].items()}
    return v


class Binding:
    """How arena stores and rebuilds the tensor subclasses of one library.

    A subclass that follows PyTorch's protocol (``__tensor_flatten__`` names its
    inner tensors, ``__tensor_unflatten__`` makes one from them) needs no
    binding when the module given to ``attach`` holds one already: arena
    repoints its inner tensors. A binding is needed to rebuild the subclass
    from the image alone (the module holds a plain tensor, or another type),
    and for a library whose flatten context is not made of plain values
    (strings, numbers, lists, dtypes): subclass :class:`Binding`, override
    :meth:`encode` and :meth:`rebuild`, and :func:`register_binding` it.

    ``modules``: the module prefixes of the classes it covers ("torchao.");
    only classes under a registered prefix are imported when an image is read.
    """

    library = "torch"
    modules: Tuple[str, ...] = ()

    def covers(self, type_path: str) -> bool:
        return any(type_path.startswith(m) for m in self.modules)

    def encode(self, t: torch.Tensor) -> Dict[str, Any]:
        """The ``attributes`` of the image's subclass object: what, beside the
        inner tensors, rebuilds ``t``. Default: its flatten context as JSON."""
        _, ctx = t.__tensor_flatten__()  # type: ignore[attr-defined]
        return {"encoding": "json", "attributes": _encode(ctx)}

    def rebuild(self, cls: type, meta: Dict[str, Any], inner: Dict[str, torch.Tensor], size: Tuple[int, ...],
                stride: Tuple[int, ...]) -> torch.Tensor:
        """A new ``cls`` from the image's subclass object and its inner tensors
        (the top level's: a nested subclass is rebuilt first, by its own type's
        binding). Default: ``cls.__tensor_unflatten__`` with the decoded context."""
        if meta.get("encoding") != "json":
            raise TypeError(f"attributes encoded '{meta.get('encoding')}', not 'json'")
        return cls.__tensor_unflatten__(inner, _decode(meta["attributes"]), size, stride)  # type: ignore[attr-defined]


class _TorchaoBinding(Binding):
    """torchao: its flatten context holds enums and configs; torchao's own JSON
    encoding (torchao.prototype.safetensors, the one its safetensors files use)
    writes and reads them, for the classes it allows."""

    library = "torchao"
    modules = ("torchao.",)

    def encode(self, t: torch.Tensor) -> Dict[str, Any]:
        enc = importlib.import_module("torchao.prototype.safetensors.safetensors_utils").TensorSubclassAttributeJSONEncoder
        return {"encoding": "torchao", "attributes": json.loads(json.dumps(t, cls=enc))["_data"]}

    def rebuild(self, cls: type, meta: Dict[str, Any], inner: Dict[str, torch.Tensor], size: Tuple[int, ...],
                stride: Tuple[int, ...]) -> torch.Tensor:
        if meta.get("encoding") != "torchao":
            return super().rebuild(cls, meta, inner, size, stride)
        object_from_dict = importlib.import_module("torchao.prototype.safetensors.safetensors_utils").object_from_dict
        out: torch.Tensor = object_from_dict({"_type": cls.__name__, "_data": {**meta["attributes"], **inner}})
        return out


class _QuantoBinding(Binding):
    """optimum-quanto: its flatten contexts are strings (made to be serialized)."""

    library = "optimum.quanto"
    modules = ("optimum.quanto.",)


class _ArenaBinding(Binding):
    """arena's own subclasses (native FP8 weights, _fp8.py)."""

    library = "arena"
    modules = (__name__.rpartition(".")[0] + ".",)  # this package's: "arena_gpu.torch."


_bindings: List[Binding] = [_TorchaoBinding(), _QuantoBinding(), _ArenaBinding()]


def register_binding(binding: Binding) -> None:
    """Register ``binding`` (a :class:`Binding`) for the classes under its ``modules``
    prefixes; it comes before the bindings registered earlier."""
    if not isinstance(binding, Binding) or not binding.modules:
        raise Error("USAGE", "register_binding: a Binding with the module prefixes of its classes (modules)")
    _bindings.insert(0, binding)


def _binding_for(type_path: str) -> Optional[Binding]:
    return next((b for b in _bindings if b.covers(type_path)), None)


# --- flattening: a subclass's inner plain tensors ------------------------------------
def _inner(t: torch.Tensor, prefix: str = "") -> List[Tuple[str, torch.Tensor]]:
    """The plain tensors inside ``t``, by path ("qdata"; "_data._data" inside a nested subclass)."""
    names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
    out: List[Tuple[str, torch.Tensor]] = []
    for n in names:
        v = getattr(t, n)
        if is_subclass(v):
            out += _inner(v, prefix + n + ".")
        else:
            out.append((prefix + n, v))
    return out


def _structure(t: torch.Tensor) -> Dict[str, Any]:
    """The subclass object of the manifest for ``t``: its type, library, encoded
    attributes, outer size and stride, and its nested subclasses' own objects."""
    tp = type_name(t)
    b = _binding_for(tp) or Binding()
    try:
        enc = b.encode(t)
    except Exception as e:  # not plain values: the module must hold the subclass at attach
        enc = {"encoding": None, "attributes": None, "why": f"{type(e).__name__}: {e}"}
    names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
    nested = {n: _structure(getattr(t, n)) for n in names if is_subclass(getattr(t, n))}
    out = {"library": b.library if b.modules else tp.partition(".")[0], "type": tp, **enc,
           "size": list(t.shape), "stride": list(t.stride())}
    if nested:
        out["nested"] = nested
    return out


def _memory_order(t: torch.Tensor) -> Tuple[torch.Tensor, Optional[List[int]]]:
    """``t``'s bytes in memory order, and the permutation that gives ``t`` back from
    a contiguous tensor of them (None: t is contiguous). A tensor whose elements
    overlap or leave gaps has no such bytes: ValueError."""
    if t.is_contiguous():
        return t, None
    st = t.stride()
    perm = sorted(range(t.dim()), key=lambda d: (-st[d], -t.shape[d]))
    p = t.permute(perm)
    if not p.is_contiguous():
        raise ValueError(f"strides {tuple(t.stride())} of shape {tuple(t.shape)} are not a permutation of a "
                         f"contiguous layout")
    inv = [0] * len(perm)
    for i, d in enumerate(perm):
        inv[d] = i
    return p, inv


def describe(name: str, t: torch.Tensor) -> Tuple[Dict[str, Any], List[Tuple[str, torch.Tensor]]]:
    """The arena.subclass entry of ``t`` (a subclass) and its components (name, tensor in memory order)."""
    comps: List[Tuple[str, torch.Tensor]] = []
    perms: Dict[str, List[int]] = {}
    for path, v in _inner(t):
        if v.dtype not in _ARENA_DTYPES:
            raise Error("USAGE", f"'{name}': inner tensor '{path}' is {v.dtype}, which an image cannot hold")
        if len(path) > 15:
            raise Error("USAGE", f"'{name}': inner tensor name '{path}' is over 15 characters")
        try:
            mem, inv = _memory_order(v)
        except ValueError as e:
            raise Error("USAGE", f"'{name}': inner tensor '{path}': {e}") from None
        if inv is not None:
            perms[path] = inv
        comps.append((path, mem))
    if len(comps) > 4:
        raise Error("USAGE", f"'{name}': {type(t).__name__} holds {len(comps)} inner tensors; an image tensor "
                             f"holds 1 to 4")
    meta = _structure(t)
    if perms:
        meta["permute"] = perms
    dt = _ARENA_DTYPES.get(t.dtype)
    if dt is None:
        raise Error("USAGE", f"'{name}': a {type(t).__name__} of dtype {t.dtype}, which an image cannot hold")
    return {"dtype": dt, "shape": list(t.shape), "subclass": meta}, comps


# --- binding --------------------------------------------------------------------------
class InnerRef:
    """One inner tensor of a bound subclass, as the block bindings see a parameter:
    setting ``data`` points the subclass's attribute (``qdata``...) at the tensor
    (a view of arena memory, or a placeholder), permuted back to its strides."""

    @property
    def requires_grad(self) -> bool:  # the weights' checks: the subclass's own
        return bool(self.owner.requires_grad)

    def __init__(self, owner: torch.Tensor, path: str, perm: Optional[List[int]]):
        self.owner = owner  # the subclass parameter (the weights checks look at it)
        obj: Any = owner
        *up, self.attr = path.split(".")
        for a in up:
            obj = getattr(obj, a)
        self.obj = obj
        self.perm = perm

    @property
    def data(self) -> torch.Tensor:
        v: torch.Tensor = getattr(self.obj, self.attr)
        return v

    @data.setter
    def data(self, v: torch.Tensor) -> None:
        setattr(self.obj, self.attr, v if self.perm is None else v.permute(self.perm))


_FP8_SCHEMES = ("fp8-e4m3", "fp8-e4m3-tensor", "fp8-e4m3-row")


def fp8_auto_native(h: "Handle") -> bool:
    """What ``fp8_compute="auto"`` chooses: FP8 products on a GPU with FP8 matmuls, in
    sampling and training alike (the input's rows quantized and, for the backward,
    the weight's bytes transposed in one pass by arena's kernels: on the H200 0.89 x
    the BF16 model's resident step sampling at 8 GiB, 0.93 x training, where the
    dequantized path trains at 1.05 x), the dequantized path elsewhere.
    docs/QUANT.md "Native FP8"."""
    from . import _fp8

    return _fp8.device_has_fp8(h._device)


def fp8_native(h: "Handle", info: TensorInfo, full: str, module: nn.Module) -> bool:
    """Bind this fp8-e4m3 image tensor as an FP8 weight (_fp8.py) rather than
    dequantize it at each bind: a Linear's weight of a floating dtype, and
    ``fp8_compute`` True, or "auto" where fp8_auto_native says so."""
    mode = getattr(h, "_fp8_compute", "auto")
    if info.scheme not in _FP8_SCHEMES or mode is False or info.dtype not in ("BF16", "F16", "F32"):
        return False
    if len(info.shape) != 2:
        return False
    owner_name, _, leaf = full.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if leaf != "weight" or not isinstance(owner, nn.Linear):
        return False
    return mode is True or fp8_auto_native(h)


def _meta_of(info: TensorInfo, h: Optional["Handle"] = None) -> Dict[str, Any]:
    if info.scheme in _FP8_SCHEMES:  # arena's own scheme, bound as an Fp8Weight
        from ._fp8 import Fp8Weight, device_has_fp8

        native = h is not None and device_has_fp8(h._device)
        rows, cols = info.shape
        return {"type": f"{Fp8Weight.__module__}.{Fp8Weight.__qualname__}", "encoding": "json",
                "attributes": _encode({"dtype": torch_dtype(info.dtype), "native": native}),
                "size": [rows, cols], "stride": [cols, 1]}
    try:
        meta = json.loads(info.subclass or "{}")
    except (ValueError, RecursionError) as e:  # (json's decoder recurses: a deep nesting is RecursionError)
        raise _bad_meta(info, h, f"not JSON that can be read ({type(e).__name__}: {str(e)[:120]})") from None
    why = _meta_problem(meta, info, 0)
    if why is not None:
        raise _bad_meta(info, h, why)
    checked: Dict[str, Any] = meta
    return checked


_MAX_NESTING = 8  # subclasses inside subclasses (quanto's packed int4: 1)


def _bad_meta(info: TensorInfo, h: Optional["Handle"], why: str) -> Error:
    where = f"{h.arena.path}: " if h is not None else ""
    return Error("IMG_MANIFEST_BAD", f"{where}tensor '{info.name}': its subclass object is malformed: {why}",
                 error_class="invalid")


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


def _meta_problem(meta: Any, info: TensorInfo, depth: int) -> Optional[str]:
    """What is wrong with an image's subclass object (docs/QUANT.md, "Tensor
    subclasses") as this reader uses it, or None: its keys of the wrong kinds, a
    nesting deeper than any library's, a ``permute`` that is no permutation of
    its inner tensor's dimensions."""
    where = "" if depth == 0 else f" (nested {depth} deep)"
    if not isinstance(meta, dict):
        return f"a {type(meta).__name__}, not an object{where}"
    for k in ("type", "library", "why"):
        if k in meta and not isinstance(meta[k], str):
            return f"'{k}' is a {type(meta[k]).__name__}, not a string{where}"
    if meta.get("encoding") is not None and not isinstance(meta["encoding"], str):
        return f"'encoding' is a {type(meta['encoding']).__name__}, not a string{where}"
    for k in ("size", "stride"):
        if k in meta and not _ints(meta[k]):
            return f"'{k}' is not a list of non-negative integers{where}"
    nested = meta.get("nested", {})
    if not isinstance(nested, dict):
        return f"'nested' is a {type(nested).__name__}, not an object{where}"
    if nested and depth + 1 > _MAX_NESTING:
        return f"subclasses nested over {_MAX_NESTING} deep"
    for sub in nested.values():
        why = _meta_problem(sub, info, depth + 1)
        if why is not None:
            return why
    if depth == 0:
        perms = meta.get("permute", {})
        if not isinstance(perms, dict):
            return f"'permute' is a {type(perms).__name__}, not an object"
        dims = {c.name: len(c.shape) for c in info.components}
        for name, perm in perms.items():
            if name not in dims:
                return f"'permute' names '{name}', which is none of its inner tensors {sorted(dims)}"
            if not _ints(perm) or sorted(perm) != list(range(dims[name])):
                return (f"'permute' of '{name}' is {str(perm)[:60]}, not a permutation of its "
                        f"{dims[name]} dimensions")
    return None


def _check_inner(name: str, sub: torch.Tensor, info: TensorInfo, meta: Dict[str, Any]) -> Optional[str]:
    """Why the module's subclass ``sub`` cannot take the image tensor's components, or None."""
    perms = meta.get("permute", {})
    inner = dict(_inner(sub))
    want = [c.name for c in info.components]
    if sorted(inner) != sorted(want):
        return (f"'{name}' holds {type(sub).__name__} with inner tensors {sorted(inner)}, the image's "
                f"{meta.get('type', '?').rpartition('.')[2]} {sorted(want)}")
    for c in info.components:
        v = inner[c.name]
        shape = tuple(v.permute([perms[c.name].index(i) for i in range(v.dim())]).shape) if c.name in perms \
            else tuple(v.shape)
        if _ARENA_DTYPES.get(v.dtype) != c.dtype or shape != c.shape:
            return (f"'{name}': inner tensor '{c.name}' is {tuple(v.shape)} {v.dtype}, the image's {c.shape} "
                    f"{c.dtype}")
    return None


def _unflatten_like(t: torch.Tensor, inner: Dict[str, torch.Tensor], prefix: str = "") -> torch.Tensor:
    """A subclass like ``t`` (its type and flatten context: the protocol alone, no
    binding) holding ``inner`` (by path; nested subclasses made the same way)."""
    names, ctx = t.__tensor_flatten__()  # type: ignore[attr-defined]
    mine: Dict[str, torch.Tensor] = {}
    for n in names:
        v = getattr(t, n)
        mine[n] = _unflatten_like(v, inner, prefix + n + ".") if is_subclass(v) else inner[prefix + n]
    out: torch.Tensor = type(t).__tensor_unflatten__(mine, ctx, t.size(), t.stride())  # type: ignore[attr-defined]
    return out


def _rebuild(meta: Dict[str, Any], inner: Dict[str, torch.Tensor], prefix: str = "") -> torch.Tensor:
    """A subclass made from the image's subclass object (nested ones first)."""
    tp = meta.get("type", "")
    b = _binding_for(tp)
    if b is None:
        raise Error("USAGE", f"no binding covers {tp} (arena.torch.register_binding)")
    if meta.get("encoding") is None:
        raise Error("USAGE", f"{tp} was stored without its attributes ({meta.get('why', 'not plain values')})")
    mod, _, qual = tp.rpartition(".")
    cls = getattr(importlib.import_module(mod), qual)
    mine: Dict[str, torch.Tensor] = {}
    nested = meta.get("nested", {})
    for n, sub in nested.items():
        mine[n] = _rebuild(sub, inner, prefix + n + ".")
    for path, v in inner.items():
        if path.startswith(prefix) and "." not in path[len(prefix):]:
            mine[path[len(prefix):]] = v
    return b.rebuild(cls, meta, mine, tuple(meta["size"]), tuple(meta["stride"]))


def match(h: "Handle", full: str, t: torch.Tensor, info: TensorInfo) -> Tuple[Optional[torch.Tensor], Optional[str]]:
    """The subclass object that will hold image tensor ``info`` for the module's
    ``t``: ``t`` itself when it is one of the image's type and inner tensors, else
    one rebuilt from the image (placeholders inside); or why neither can."""
    meta = _meta_of(info, h)
    want = torch_dtype(info.dtype)
    if tuple(t.shape) != info.shape or t.dtype != want:
        return None, f"'{full}' is {tuple(t.shape)} {t.dtype}, the image's '{info.name}' is {info.shape} {info.dtype}"
    tp = meta.get("type", "?")
    perms = meta.get("permute", {})
    inner = {}
    for c in info.components:
        ph = placeholder(h, c)
        inner[c.name] = ph if c.name not in perms else ph.permute(perms[c.name])
    if is_subclass(t) and type_name(t) == tp:
        why = _check_inner(full, t, info, meta)
        if why:
            return None, why
        if t.device == h._device:
            return t, None
        # quantized on another device (meta): a new one of the module's own, on arena's
        # device (a wrapper subclass's device is its own, whatever its inner tensors')
        with torch.no_grad():
            return _unflatten_like(t, inner), None
    try:
        with torch.no_grad():
            sub = _rebuild(meta, inner)
    except Exception as e:
        held = f"a {type(t).__name__}" if is_subclass(t) else "a plain tensor"
        return None, (f"'{full}' is stored as {tp.rpartition('.')[2]} ({SCHEME}) and the module holds {held}, "
                      f"which cannot be rebuilt from the image ({e}): quantize the module the same way before "
                      f"attach (on the meta device is enough), or register a binding (arena.torch.register_binding)")
    if tuple(sub.shape) != info.shape or sub.dtype != want:
        return None, f"'{full}': the rebuilt {type(sub).__name__} is {tuple(sub.shape)} {sub.dtype}, not {info.shape}"
    return sub, None


def refs(sub: torch.Tensor, info: TensorInfo) -> List[Tuple[InnerRef, Component]]:
    """The inner tensors of ``sub`` as the block bindings bind them, one a component."""
    perms = _meta_of(info).get("permute", {})
    return [(InnerRef(sub, c.name, perms.get(c.name)), c) for c in info.components]


def bind(h: "Handle", owner: nn.Module, leaf: str, t: torch.Tensor, sub: torch.Tensor,
         info: TensorInfo) -> List[Tuple[InnerRef, Component]]:
    """Put ``sub`` (from :func:`match`) in the module as ``leaf`` of ``owner`` (frozen;
    the module's own subclass stays the same object), its inner tensors at
    placeholders; returns them as the block bindings bind them. Undone at detach:
    the module's own subclass keeps its type with meta inner tensors, a rebuilt
    one gives way to an empty meta tensor, as every bound weight does."""
    from ._guards import _reorder

    is_buf = leaf in owner._buffers
    table: Dict[str, Any] = owner._buffers if is_buf else owner._parameters
    if sub is t:
        p = t
        rg = bool(t.requires_grad)
        t.requires_grad_(False)

        def undo() -> None:
            to_meta(t)
            t.requires_grad_(rg)
    else:
        p = sub if is_buf else nn.Parameter(sub, requires_grad=False)
        keys = list(table.keys())
        table[leaf] = p
        shape, dtype, rg = tuple(t.shape), t.dtype, bool(getattr(t, "requires_grad", False))

        def undo() -> None:
            ph = torch.empty(shape, dtype=dtype, device="meta")
            table[leaf] = ph if is_buf else nn.Parameter(ph, requires_grad=rg)
            _reorder(table, keys)
    h._restore.append(undo)
    h._names[id(p)] = leaf
    out = refs(p, info)
    for r, c in out:
        r.data = placeholder(h, c)
        h._names[id(r)] = f"{leaf}.{c.name}"
    return out


def placeholder(h: "Handle", c: Component) -> torch.Tensor:
    """An inner tensor's placeholder: c's dtype and shape, no memory."""
    dt = torch_dtype(c.dtype)
    one = h._zeros.get(dt)
    if one is None:
        one = h._zeros[dt] = torch.zeros(1, dtype=dt, device=h._device)
    return one.expand(c.shape) if c.shape else one.view(())


def to_meta(sub: torch.Tensor) -> None:
    """Detach: the subclass keeps its shape and inner tensors' dtypes, on the meta device."""
    for path, v in _inner(sub):
        r = InnerRef(sub, path, None)
        r.data = torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device="meta")


def copy_bytes(groups: Dict[str, List[int]], quant: Dict[int, List[Tuple[torch.Tensor, TensorInfo, int]]]) -> int:
    """The largest image block's dequantized copies, in bytes (its pieces together:
    a block's call binds them all)."""
    most = 0
    for idxs in groups.values():
        n = 0
        for i in idxs:
            for _, info, _ in quant.get(i, []):
                k = torch_dtype(info.dtype).itemsize
                for d in info.shape:
                    k *= d
                n += k
        most = max(most, n)
    return most


# --- writing an image from a module quantized in memory --------------------------------
def _tensors_of(module: nn.Module) -> Dict[str, torch.Tensor]:
    """Every parameter and persistent buffer of ``module`` by name (the names attach
    matches: tensor subclasses as they are, not as a library's state_dict flattens them).
    Names that share one tensor (tied weights) are stored once, under the first name,
    as Hugging Face checkpoints store them (attach binds the others to it)."""
    from ._attach import _image_name

    def persistent(name: str) -> bool:
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        return leaf not in owner._non_persistent_buffers_set

    out: Dict[str, torch.Tensor] = {}
    seen: Set[int] = set()
    for full, t in list(module.named_parameters(remove_duplicate=False)) + [
            (n, b) for n, b in module.named_buffers(remove_duplicate=False) if persistent(n)]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        out[_image_name(full)] = t
    return out


def flatten(module: nn.Module, prefix: str = "", what: str = "save_image",
            meta_hint: str = "it has no values to write") -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """``module``'s tensors as an image stores them: plain tensors by name (``prefix``
    before each), a tensor subclass as its inner tensors (``<name>_<attribute>``) and
    its entry of the ``arena.subclass`` metadata (the second dict). The tensors are
    the module's own where they are contiguous CPU tensors (no copy). Raises
    arena.Error USAGE naming a tensor on the meta device (``what`` says whose,
    ``meta_hint`` what to do)."""
    flat: Dict[str, torch.Tensor] = {}
    groups: Dict[str, Any] = {}
    for name, t in _tensors_of(module).items():
        name = prefix + name
        if t.device.type == "meta" or (is_subclass(t) and any(v.device.type == "meta" for _, v in _inner(t))):
            raise Error("USAGE", f"{what}: '{name}' is on the meta device: {meta_hint}")
        if is_subclass(t):
            entry, comps = describe(name, t)
            entry["components"] = [[c, f"{name}_{c}"] for c, _ in comps]
            groups[name] = entry
            for c, v in comps:
                flat[f"{name}_{c}"] = v.detach().to("cpu").contiguous()
        else:
            flat[name] = t.detach().to("cpu").contiguous()
    clash = sorted(set(flat) & set(groups))
    if clash:
        raise Error("DUPLICATE_TENSOR", f"{what}: '{clash[0]}' is a tensor and a subclass's name")
    return flat, groups


def write_image(flat: Dict[str, torch.Tensor], groups: Dict[str, Any], path: str, *, label: str,
                codec: Optional[str] = None, threads: int = 0, force: bool = False, progress: Any = False,
                read_back: bool = False) -> None:
    """What :func:`flatten` gave, as an arena image at ``path``, written by the library's
    streaming writer (:class:`arena.ImageWriter`) from the tensors where they are, a
    block at a time: no safetensors file on the way, nothing copied but each chunk. The
    image is what ``arena convert`` makes of the same tensors saved to safetensors
    (the ``arena.subclass`` metadata with them); its manifest names ``label`` as the
    source. ``read_back``: :func:`arena.convert`'s."""
    from .. import ImageWriter
    from .._files import _Bar

    spec: Dict[str, Tuple[str, Sequence[int]]] = {n: (_ARENA_DTYPES[t.dtype], tuple(t.shape))
                                                  for n, t in flat.items()}
    meta = {"arena.subclass": json.dumps(groups)} if groups else None
    w = ImageWriter(path, spec, label=label, metadata=meta, codec=codec, threads=threads or None, force=force,
                    read_back=read_back)
    bar = _Bar(progress, "write")
    try:
        done = 0
        for _block, names in w.blocks:
            for name in names:
                t = flat[name]
                n = w.nbytes(name)
                w.put(name, t.data_ptr() if n else 0, n)
                done += n
            if bar.fn is not None:
                bar.fn(done, w.total_bytes)
        w.finish()
    finally:
        w.abort()
        bar.close()


def save_image(module: nn.Module, path: str, *, codec: Optional[str] = None, threads: int = 0,
               force: bool = False) -> None:
    """Write ``module``'s weights as an arena image at ``path``: plain tensors as they
    are, tensor subclasses (a model quantized with torchao's ``quantize_``, or
    optimum-quanto's ``quantize`` and ``freeze``) as ``torch-subclass`` tensors of
    their inner tensors. The image is what ``arena convert`` makes of the same
    weights saved to safetensors in arena's convention, written by the library's
    streaming writer from the tensors where they are (no file on the way).
    codec: None, "hb4" or "zstd" (``arena convert --codec``). A file at ``path`` is
    replaced only with ``force=True`` (as :func:`arena.convert`). Raises arena.Error:
    OUTPUT_EXISTS (a file at ``path``, before anything is written); USAGE naming a
    tensor that cannot be stored (a meta tensor, a subclass of more than 4 inner
    tensors or of a dtype an image has not)."""
    if not force and os.path.lexists(path):  # said before the tensors are copied and written
        raise Error("OUTPUT_EXISTS", f"{path}: exists; force=True replaces it")
    flat, groups = flatten(module)
    write_image(flat, groups, path, codec=codec, threads=threads, force=force,
                label=f"{type(module).__name__}'s weights")

