"""``compile=True`` of ``from_pretrained`` and ``offload``: every block compiled
with torch.compile, and torch's compiled artifacts kept in the cache's entry
beside the image, so that a later process compiles nothing anew.

- Each block module is compiled regionally (``module.compile``: its
  ``_call_impl``, inside arena's binding, which stays outside the compiled
  code): a whole block whose modules are not bound at their own calls with
  ``fullgraph=True`` (nothing of arena's runs inside it); a block in pieces,
  or one whose modules are bound at their calls (layers that checkpoint their
  own forward), without: the binding of each such module is a graph break.
- torch's caches (inductor's FX graphs, AOTAutograd's, autotuning: PyTorch's
  "MegaCache") are written into the entry's folder as
  ``torch-compile-<torch version>.bin`` (``torch.compiler.save_cache_artifacts``)
  after a forward of the model that compiled something new, and loaded
  (``torch.compiler.load_cache_artifacts``) before the first forward of a
  later call: torch then finds every graph it compiled before in its caches.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Set

import torch
from torch import nn

from ._handle import Handle


def artifacts_path(entry_dir: Path) -> Path:
    """Where the entry keeps torch's compiled artifacts (of this torch's version)."""
    return entry_dir / f"torch-compile-{torch.__version__.replace('+', '_')}.bin"


def load(entry_dir: Path) -> int:
    """torch's caches filled from the entry's artifacts, when there are some: the
    number of artifacts loaded (0: none, or unreadable, which is said)."""
    p = artifacts_path(entry_dir)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return 0
    except OSError as e:
        print(f"arena: {p}: cannot read torch's compiled artifacts ({e.strerror}): compiling anew",
              file=sys.stderr, flush=True)
        return 0
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as e:  # another torch's, or damaged: torch compiles anew, as without them
        print(f"arena: {p}: torch does not load these compiled artifacts ({type(e).__name__}: {e}): compiling "
              f"anew", file=sys.stderr, flush=True)
        return 0
    if info is None:
        return 0
    return sum(len(v) for v in vars(info).values() if isinstance(v, list))


def _blocks(h: Handle) -> List[nn.Module]:
    """The block modules the handle binds, each once, in the image's block order."""
    seen: Set[int] = set()
    out: List[nn.Module] = []
    for i in sorted(h._module_of):
        m = h._module_of[i]
        if id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out


def _whole_alone(h: Handle) -> Set[int]:
    """The whole blocks no module of which is bound at its own call: compiled with
    fullgraph=True."""
    out: Set[int] = set()
    for m in (h._module_of[i] for i in h._whole):
        if not any(sub is not m and "_arena_binding" in sub.__dict__ for sub in m.modules()):
            out.add(id(m))
    return out


def compile_blocks(h: Handle, **compile_kwargs: Any) -> int:
    """Every block of ``h`` compiled regionally (fullgraph where nothing of arena's runs
    inside it); the compilations are undone at detach. Returns how many."""
    full = _whole_alone(h)
    blocks = _blocks(h)
    for m in blocks:
        m.compile(**dict({"fullgraph": id(m) in full}, **compile_kwargs))

        def undo(m: nn.Module = m) -> None:
            m.__dict__.pop("_compiled_call_impl", None)

        h._restore.append(undo)
    return len(blocks)


def _need_save() -> Callable[[], bool]:
    """Whether torch recorded artifacts since they were last saved (its MegaCache's own
    flag where this torch has it; else after every forward)."""
    try:
        from torch.compiler._cache import CacheArtifactManager

        return CacheArtifactManager.need_serialize
    except (ImportError, AttributeError):
        return lambda: True


def save_after_forwards(h: Handle, entry_dir: Path) -> None:
    """After a forward of any attached model that compiled something new, torch's
    artifacts are written into the entry (whole: a temporary file renamed over it)."""
    need = _need_save()
    state: Dict[str, Any] = {"failed": False}

    def save(_module: nn.Module, _args: Any, _out: Any) -> None:
        if state["failed"] or not need():
            return
        got = torch.compiler.save_cache_artifacts()
        if got is None:
            return
        p = artifacts_path(entry_dir)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(got[0])
            os.replace(tmp, p)
        except OSError as e:  # (a read-only cache: the next process compiles again)
            state["failed"] = True
            print(f"arena: {p}: cannot write torch's compiled artifacts ({e.strerror})", file=sys.stderr, flush=True)
            try:
                tmp.unlink()
            except OSError:
                pass

    for _, m in h._roots:
        hook = m.register_forward_hook(save)
        h._restore.append(hook.remove)
