"""``offload``: a pipeline or module already loaded (its weights real tensors,
on the CPU as ``from_pretrained`` loads them) written once into arena's cache,
keyed by its weights' content, and attached: its parameters become arena's and
the copies it held are released.

The key is a SHA-256 over what the image is made of: each tensor's name, dtype,
shape and bytes (the bytes hashed on a few threads, a tensor each, hashlib
releasing the GIL), and each component's class and config, so that the same
weights loaded again in another process find the image made before, and any
changed weight makes another. The image is written from the tensors as they
are (the library's streaming writer, a block at a time, each chunk read back
as written); then the tensors are let go before the attach, which
replaces every parameter and buffer the image holds, and the allocator gives
the freed memory back to the system (glibc's ``malloc_trim``).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import gc
import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from .. import _cache
from .._errors import Error
from .._files import Progress
from ._handle import _fmt_size
from ._pretrained import PathLike, _say, cached_attach
from ._quant import flatten, write_image

# The key's format: a new one when what goes into it changes.
_KEY_VERSION = "arena.offload.1"


def _roots(target: Any) -> List[Tuple[str, nn.Module]]:
    """The modules to write: the module itself (prefix ""), or a pipeline's (or a
    dict's) components that hold tensors, each with the prefix of its names in
    the image ("text_encoder.", ...), as attach binds them."""
    if isinstance(target, nn.Module):
        return [("", target)]
    comps = getattr(target, "components", target)
    if not isinstance(comps, dict):
        raise Error("USAGE", f"offload: a {type(target).__name__} is neither an nn.Module nor a pipeline (an object "
                             f"with .components, or a dict of modules)")
    roots = [(name + ".", m) for name, m in sorted(comps.items())
             if isinstance(m, nn.Module) and next(itertools.chain(m.parameters(), m.buffers()), None) is not None]
    if not roots:
        raise Error("USAGE", f"offload: the {type(target).__name__} has no module with weights")
    return roots


def _flat(roots: List[Tuple[str, nn.Module]]) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """Every root's tensors as the image stores them (``_quant.flatten``), by image name."""
    flat: Dict[str, torch.Tensor] = {}
    groups: Dict[str, Any] = {}
    for prefix, m in roots:
        f, g = flatten(m, prefix, what="offload",
                       meta_hint="offload takes a model loaded with its weights (from_pretrained on the CPU, not "
                                 "after enable_model_cpu_offload or with a device_map); a model built on the meta "
                                 "device is arena.torch.from_pretrained's (or attach's, with an image)")
        flat.update(f)
        groups.update(g)
    return flat, groups


def _config(m: nn.Module) -> Any:
    """What a component is built from: a diffusers model's config, a transformers
    model's (its JSON), else nothing."""
    cfg = getattr(m, "config", None)
    if cfg is None:
        return None
    to_json = getattr(cfg, "to_json_string", None)
    if callable(to_json):
        try:
            return json.loads(to_json(use_diff=False))
        except (TypeError, ValueError):
            pass
    try:
        return dict(cfg)
    except (TypeError, ValueError):
        return repr(cfg)


def _bytes(t: torch.Tensor) -> memoryview:
    """A CPU tensor's bytes, without a copy where it is contiguous."""
    flat = t.contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    if not flat.numel():
        return memoryview(b"")
    arr: Any = flat.view(torch.uint8).numpy()  # (numpy arrays are buffers; its stubs do not say so)
    return memoryview(arr)


def _digest(t: torch.Tensor) -> bytes:
    return hashlib.sha256(_bytes(t)).digest()


def content_key(roots: List[Tuple[str, nn.Module]], flat: Dict[str, torch.Tensor], groups: Dict[str, Any],
                codec: Optional[str]) -> str:
    """The SHA-256 of the weights (names, dtypes, shapes, bytes), the components'
    classes and configs and the image's codec: 32 hex digits (the cache's keys)."""
    names = sorted(flat)
    workers = max(1, min(8, os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="arena-hash") as pool:
        digests = list(pool.map(_digest, [flat[n] for n in names]))
    h = hashlib.sha256(_KEY_VERSION.encode())
    head = [[p, f"{type(m).__module__}.{type(m).__qualname__}", _config(m)] for p, m in roots]
    h.update(json.dumps([head, groups, codec or "none"], sort_keys=True, default=str).encode())
    for n, d in zip(names, digests):
        t = flat[n]
        h.update(json.dumps([n, str(t.dtype), list(t.shape)]).encode())
        h.update(d)
    return h.hexdigest()[:32]


def _trim() -> None:
    """Give the memory freed back to the system now (glibc keeps freed chunks of its
    heaps for reuse: the host's RSS would not show the copies gone)."""
    gc.collect()
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        trim = getattr(libc, "malloc_trim", None)
        if trim is not None:
            trim(0)
    except OSError:
        pass


def offload(target: Any, *, vram: Any = None, cache: Optional[PathLike] = None, codec: Optional[str] = None,
            progress: Progress = None, compile: bool = False, **attach_kwargs: Any) -> Any:
    """Run a pipeline or module already loaded from arena memory: the one-line
    replacement for ``pipe.enable_model_cpu_offload()``.

    ::

        pipe = FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-dev", torch_dtype=torch.bfloat16)
        arena.torch.offload(pipe, vram="12G")     # instead of pipe.enable_model_cpu_offload()
        image = pipe("a cat").images[0]

    target: a diffusers pipeline (its components with weights: text encoders,
      transformer or UNet, VAE...), a dict of modules, or one ``nn.Module``, with
      its weights loaded (on the CPU as ``from_pretrained`` loads them; tensor
      subclasses of torchao or optimum-quanto as :func:`save_image` writes them).
    vram, and other keywords: as :func:`attach` takes them (``device``,
      ``piece_size``, ``host_budget``, ``mode``...).
    cache: the cache's folder (default ``$ARENA_CACHE``, else ``$XDG_CACHE_HOME/arena``
      or ``~/.cache/arena``).
    codec: how the image stores the weights (None, "hb4", "zstd").
    progress: as :func:`from_pretrained`'s, for the first call's writing.
    compile: as :func:`from_pretrained`'s: the blocks compiled, torch's artifacts
      kept in the cache's entry and loaded by a later call.

    The weights are written into the cache once, keyed by their content (every
    tensor's name, dtype, shape and bytes, hashed on a few threads, and each
    component's class and config): the same weights loaded again, in this
    process or another, find the image made before; a changed weight makes a new
    one. Then every component is attached to that one image under one budget:
    its parameters and buffers become arena's, and the copies it held are let go
    (host memory after the call is arena's, with what else references the
    tensors). The outputs are the plain pipeline's, bit for bit. Returns
    ``target``, which keeps its :class:`Handle` (``arena.torch.handle(target)``);
    ``detach()`` leaves its weights on the meta device.

    Raises :class:`arena.Error`: USAGE (a tensor on the meta device: build such a
    model with :func:`from_pretrained`, or attach it to an image; a module
    attached already), BUDGET (it cannot run in ``vram``).
    """
    roots = _roots(target)
    for _, m in roots:
        ref = m.__dict__.get("_arena_handle")
        if ref is not None and ref() is not None:
            raise Error("USAGE", f"offload: {type(m).__name__} is attached to an arena already: use it as it is, "
                                 f"or detach() it first")
    what = type(target).__name__
    flat, groups = _flat(roots)
    size = sum(t.numel() * t.element_size() for t in flat.values())
    key = content_key(roots, flat, groups, codec)
    comps = [p[:-1] for p, _ in roots if p]
    record = {"sources": [], "options": {"codec": codec}, "class": what, "components": comps,
              "offload": f"{what} loaded in memory"}
    label = f"{what}'s weights"
    box: Dict[str, Any] = {"tensors": (flat, groups)}
    del flat, groups

    def make(tmp: Path) -> bool:
        _say(f"arena: writing the {what}'s weights into the cache ({_fmt_size(size)})", progress)
        # (made again after a corrupt entry: from the modules, which a failed open left as they were)
        f, g = box.pop("tensors", None) or _flat(roots)
        # read back as written: the entry is verified without a pass of its own after
        write_image(f, g, str(tmp), codec=codec, force=True, progress=progress, read_back=True, label=label)
        return True

    def before(_image: Path) -> None:
        box.clear()  # the tensors referenced by the modules alone now: the attach lets them go

    h = cached_attach(lambda: target, key, make, record, cache, label, dict(attach_kwargs, vram=vram),
                      before=before, compile=compile)
    _trim()
    return h.module
