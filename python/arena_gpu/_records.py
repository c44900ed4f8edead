"""What an opened arena describes: its blocks, its tensors and their stored parts.

Private: the public names are ``arena.Block``, ``arena.TensorInfo`` and
``arena.Component`` (the package's front door names them as its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class Component:
    """One stored part of a tensor: ``data``, or ``qdata`` and ``scale`` of a quantized one."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    nbytes: int
    offset: int  # in its block's slab


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # the original dtype, e.g. "BF16"
    shape: Tuple[int, ...]
    scheme: str  # "none" or a storage scheme such as "fp8-e4m3-row"
    block: int
    components: Tuple[Component, ...]
    # scheme "torch-subclass": the manifest's "subclass" object (JSON text), how the
    # library rebuilds the tensor from its components (docs/QUANT.md); else None
    subclass: Optional[str] = None


@dataclass(frozen=True)
class Block:
    index: int
    name: str
    container: Optional[str]  # None for globals
    container_index: int  # -1 for globals
    nbytes: int
