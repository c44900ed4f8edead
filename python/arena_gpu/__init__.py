"""arena: model weights into device memory fast, and kept there as VRAM allows.

The module is ``arena_gpu`` (the distribution arena-gpu: ``arena`` on PyPI is
another project's, whose module is ``arena`` too); code names it ``arena``
(``import arena_gpu as arena``), as the documentation does. ``arena.torch``
is imported at its first use.

Open an arena image (``arena convert``), a safetensors file or a sharded
folder; the library puts what fits on the device and streams the rest
through a ring of device memory when it is used (the residency engine)::

    import arena_gpu as arena
    with arena.open("flux-dev.arena", vram="8G") as a:
        sd = a.tensors()          # name -> torch.Tensor, zero copy
        print(a.plan()["n_streamed"], "blocks streamed")

Make an image once with ``arena.convert("model.safetensors", "model.arena")``
(``arena.verify`` checks one, ``arena.inspect`` says what a file holds; the
``arena`` command does the same from a shell). Images converted for you
(``arena.torch.from_pretrained``, ``offload``) are kept in a cache,
``$ARENA_CACHE`` or ``~/.cache/arena``: ``arena.cache_info()`` lists it,
``arena cache list|verify|prune`` looks after it. Load a diffusers or
transformers pipeline or model in one call with ``arena.torch.from_pretrained``
(or move one loaded already with ``arena.torch.offload``), or bind any PyTorch
module to an arena with ``arena.torch.attach`` (torch: the package's ``[torch]``
extra). Errors from
the C library are raised as :class:`arena.Error` with its one-line message
and error name (``e.code``, e.g. ``"IMG_CHUNK_CHECKSUM"``).

On a machine without a usable GPU the simulated device (``backend="sim"``)
stands in: its "device" memory is host memory and tensors are CPU tensors.
"""

from __future__ import annotations

# Optional and Tuple: names the records' annotations use ("Optional[str]"), which
# typing.get_type_hints looks up in the module a class is named for: this one (below).
from typing import Any, List, Optional, Tuple  # noqa: F401

from ._arena import Arena, library_version, open
from ._cache import cache_info
from ._dtypes import torch_dtype
from ._errors import Error, OomRetryWarning, ShareWarning
from ._files import ImageWriter, convert, inspect, verify
from ._records import Block, Component, TensorInfo
from ._units import Size, parse_size

__all__ = [
    "Error",
    "ShareWarning",
    "OomRetryWarning",
    "Arena",
    "Block",
    "Component",
    "TensorInfo",
    "open",
    "convert",
    "ImageWriter",
    "verify",
    "inspect",
    "cache_info",
    "parse_size",
    "library_version",
    "__version__",
]

__version__ = "0.2.0"

# Named as this module's own (arena_gpu.Error, not the private module that defines
# it): their reprs, tracebacks and pickles name the module users import, whatever
# file holds the code. (convert, verify, inspect, cache_info and parse_size keep their modules'.)
for _public in (Error, ShareWarning, OomRetryWarning, Arena, Block, Component, TensorInfo, ImageWriter, open,
                library_version,
                torch_dtype):
    _public.__module__ = __name__
del _public


def __getattr__(name: str) -> Any:
    """``arena.torch`` imported at its first use: ``import arena_gpu as arena`` is
    enough for ``arena.torch.attach`` (without torch, the ImportError that says
    what to install)."""
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    """The public API (``dir(arena)``, completion): ``__all__``, and the subpackage
    ``arena.torch`` where torch is installed; not the modules and typing names the
    package uses."""
    import importlib.util

    return sorted(__all__ + (["torch"] if importlib.util.find_spec("torch") is not None else []))
