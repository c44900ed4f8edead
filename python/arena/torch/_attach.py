"""Binding a module to an arena (``attach``'s work): every parameter and buffer
matched to the image's tensors, all problems reported at once; the globals
bound once; each block module wrapped so that its calls go through its
binding (whole, or in pieces); the guards set; all of it undone by
``Handle.detach``."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, cast

import torch
from torch import nn

from .. import Component, Error, TensorInfo, _view, torch_dtype
from ._blocks import _DEQUANT, _BlockBinding, _as_component, _dequantize, _placeholder
from ._guards import _guard_apply, _guard_merge, _is_adapter_param, _peft_tuners, _reorder
from ._handle import Handle, _observe_oom
from ._offload import _SavedOffload
from ._pieces import _LeafRef, _PiecedBinding
from . import _quant


_STRIP = ("base_model.model.",)  # a peft PeftModel's prefix
_cls_cache: Dict[type, type] = {}


def _image_name(name: str) -> str:
    for p in _STRIP:
        if name.startswith(p):
            name = name[len(p) :]
    return name.replace(".base_layer.", ".").replace("._orig_mod.", ".").replace("_orig_mod.", "")


def _bound_cls(cls: type) -> type:
    """A subclass of a block's class whose __call__ goes through its binding."""
    if cls in _cls_cache:
        return _cls_cache[cls]
    base_call = cls.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        b = self.__dict__.get("_arena_binding")
        if b is None:
            return base_call(self, *args, **kwargs)
        return b.run(base_call, self, args, kwargs)

    new = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__, "_arena_base": cls})
    _cls_cache[cls] = new
    return new


def _bind(h: Handle, module: nn.Module, mode: str, trainable: Any, min_saved: Optional[int] = None) -> None:
    a = h.arena
    if h.arena.mode != mode:
        a.set_mode(mode)
    h._device = torch.device(a.device)
    ref = getattr(module, "_arena_handle", None)
    if ref is not None and ref() is not None:
        raise Error("USAGE", f"{type(module).__name__} is attached to an arena already: detach() it first")
    is_trainable: Callable[[str], bool]
    if trainable is None:
        is_trainable = lambda n: False  # noqa: E731
    elif callable(trainable):
        is_trainable = trainable
    else:
        names = set(trainable)
        is_trainable = names.__contains__
    tuners = _peft_tuners(module)
    image = {n: a.tensor_info(n) for n in a.tensor_names()}

    # 1. Every parameter and persistent buffer against the image, all problems at once.
    problems: List[str] = []
    bound: Dict[str, Tuple[nn.Module, str, torch.Tensor, Any]] = {}  # image name -> (owner, leaf, tensor, info)
    subs: Dict[str, torch.Tensor] = {}  # image name -> the tensor subclass that holds its components (_quant)
    seen_ids: Set[int] = set()
    for full, t in list(module.named_parameters(remove_duplicate=False)) + [
        (n, b) for n, b in module.named_buffers(remove_duplicate=False) if _persistent(module, n)
    ]:
        if id(t) in seen_ids:
            problems.append(f"'{full}' shares its tensor with another name (tied weights are not supported)")
            continue
        seen_ids.add(id(t))
        iname = _image_name(full)
        info = image.get(iname)
        if info is None:
            if _is_adapter_param(full, set(tuners)) or is_trainable(full):
                if t.device.type == "meta":
                    problems.append(f"'{full}' is on the meta device and arena holds no tensor for it: add "
                                    f"adapters after attach (or to a module with real tensors), or materialize it")
                continue
            problems.append(f"'{full}' has no tensor '{iname}' in the image")
            continue
        if iname in bound:
            problems.append(f"'{full}' and another parameter both map to '{iname}'")
            continue
        if info.scheme == _quant.SCHEME or _quant.fp8_native(h, info, full, module):
            sub, why = _quant.match(h, full, t, info)
            if why is not None or sub is None:
                problems.append(why or f"'{full}': no tensor subclass")
                continue
            subs[iname] = sub
            owner_name, _, leaf = full.rpartition(".")
            bound[iname] = (module.get_submodule(owner_name) if owner_name else module, leaf, t, info)
            continue
        if info.scheme not in ("none",) + _DEQUANT or (info.scheme == "none" and len(info.components) != 1):
            problems.append(f"'{iname}' is stored {info.scheme} ({len(info.components)} components), "
                            f"which this adapter cannot bind")
            continue
        if info.scheme != "none" and info.dtype not in ("BF16", "F16", "F32"):
            problems.append(f"'{iname}' is stored {info.scheme} from {info.dtype}: its values are not "
                            f"{info.dtype} values (arena dequantizes to BF16, F16 or F32)")
            continue
        try:
            want = torch_dtype(info.dtype)
        except Error as e:
            problems.append(f"'{iname}': {e.message}")
            continue
        if tuple(t.shape) != info.shape or t.dtype != want:
            problems.append(
                f"'{full}' is {tuple(t.shape)} {t.dtype}, the image's '{iname}' is {info.shape} {info.dtype}"
            )
            continue
        owner_name, _, leaf = full.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        bound[iname] = (owner, leaf, t, info)
    missing = sorted(set(image) - set(bound))
    for n in missing:
        problems.append(f"the image's '{n}' has no parameter in the module")
    # 2. The image's blocks are ModuleList children of the module.
    prefix = next((p for p in _STRIP if any(n.startswith(p) for n, _ in module.named_modules())), "")
    block_mod: Dict[int, nn.Module] = {}  # arena block (or piece) -> the block module
    parent_of: Dict[int, str] = {}  # arena block (or piece) -> the image block's name
    for b in a.blocks:
        if b.container is None:
            continue
        parent = b.name.partition("#")[0]  # a piece ("transformer_blocks.3#1") is part of its block
        parent_of[b.index] = parent
        try:
            m = module.get_submodule(prefix + parent)
        except AttributeError:
            if b.name == parent or b.name.endswith("#0"):
                problems.append(f"the image's block '{parent}' is not a submodule of the module")
            continue
        container = module.get_submodule((prefix + b.container).rstrip("."))
        if not isinstance(container, nn.ModuleList):
            problems.append(f"'{b.container}' is a {type(container).__name__}, not a ModuleList of blocks")
            continue
        block_mod[b.index] = m
    for iname, (owner, leaf, t, info) in bound.items():
        if info.block in block_mod:
            blk = a.blocks[info.block]
            if not _is_within(module, owner, block_mod[info.block]):
                problems.append(f"'{iname}' is in image block '{parent_of[info.block]}' but not inside that submodule")
    if problems:
        head = f"cannot attach {type(module).__name__} to {a.path}: {len(problems)} problem(s): "
        shown = "; ".join(problems[:40]) + ("; ..." if len(problems) > 40 else "")
        raise Error("USAGE", head + shown)

    # 3. Bind. Parameters become new frozen Parameters viewing arena memory;
    # the module's own tensors are released.
    # Tensors stored quantized are dequantized: globals once, here; block tensors at
    # each call of their block (placeholders until then).
    per_block: Dict[int, List[Tuple[torch.Tensor, Component]]] = {}
    per_block_q: Dict[int, List[Tuple[torch.Tensor, TensorInfo, int]]] = {}
    owners: Dict[int, nn.Module] = {}
    for iname, (owner, leaf, t, info) in bound.items():
        resident, dev, host = a.block_state(info.block)
        if iname in subs:  # inner tensors of a tensor subclass, bound as parameters are
            refs = _quant.bind(h, owner, leaf, t, subs[iname], info)
            if info.block not in block_mod or resident:
                for r, c in refs:
                    r.data = _view(a.slab(info.block, dev, "device"), c)
            if info.block in block_mod:
                per_block.setdefault(info.block, []).extend(cast(List[Tuple[torch.Tensor, Component]], refs))
                owners[id(owner)] = owner
            continue
        c = info.components[0]
        quant = info.scheme != "none"
        is_buf = leaf in owner._buffers
        if info.block not in block_mod:  # globals: resident for good
            if quant:
                with torch.no_grad():
                    view = _dequantize(h, info, a.tensor_index(iname), dev)
            else:
                view = _view(a.slab(info.block, dev, "device"), c)
            _swap(h, owner, leaf, is_buf, view, t)
            continue
        if resident and not quant:
            view = _view(a.slab(info.block, dev, "device"), c)
        else:  # no memory until the block is acquired: a placeholder of the right shape on the device
            view = _placeholder(h, _as_component(info))
        p = _swap(h, owner, leaf, is_buf, view, t)
        if quant:
            per_block_q.setdefault(info.block, []).append((p, info, a.tensor_index(iname)))
        else:
            per_block.setdefault(info.block, []).append((p, c))
        owners[id(owner)] = owner
    groups: Dict[str, List[int]] = {}
    for idx in block_mod:
        groups.setdefault(parent_of[idx], []).append(idx)
    h._copy_bytes = _quant.copy_bytes(groups, per_block_q)
    for parent, idxs in groups.items():
        m = block_mod[idxs[0]]
        bs: Dict[int, _BlockBinding] = {}
        for idx in idxs:
            bb = _BlockBinding(h, idx, a.blocks[idx].name, per_block.get(idx, []), per_block_q.get(idx))
            resident, dev, host = a.block_state(idx)
            bb.addr = dev if resident else -1  # host views are placeholders: bind at the first call
            bs[idx] = bb
            h._module_of[idx] = m
        if len(idxs) == 1 and a.blocks[idxs[0]].name == parent:  # a whole block
            h._whole[idxs[0]] = bs[idxs[0]]
            _wrap_block(h, m, bs[idxs[0]])
            continue
        # In pieces: the modules owning its tensors acquire the pieces they need.
        leaf_need: Dict[int, Set[int]] = {}
        leaf_mod: Dict[int, nn.Module] = {}
        for idx in idxs:
            for iname in [n for n, (o, _, _, info) in bound.items() if info.block == idx]:
                owner = bound[iname][0]
                leaf_need.setdefault(id(owner), set()).add(idx)
                leaf_mod[id(owner)] = owner
        keys = list(leaf_mod)
        pb = _PiecedBinding(h, parent, bs, [tuple(sorted(leaf_need[k])) for k in keys])
        h._pieced.append(pb)
        for key, oid in enumerate(keys):
            leaf_m = leaf_mod[oid]
            if leaf_m is m:  # the block's own tensors: the block's call acquires them
                pb.keep = pb.need[key]
                continue
            _wrap_block(h, leaf_m, _LeafRef(pb, key))  # type: ignore[arg-type]
        _wrap_block(h, m, pb)  # type: ignore[arg-type]
    if mode == "train":
        _check_train_ring(h)
    # 4. Guards: moves and conversions of bound weights, adapter merges, a second attach.
    for owner in {id(o): o for o, _, _, _ in bound.values()}.values():
        _guard_apply(h, owner, [leaf for o, leaf, _, _ in bound.values() if o is owner])
    for name, tuner in _peft_tuners(module).items():
        _guard_merge(h, name, tuner)
    hook = module.register_forward_pre_hook(h._root_pre_hook, with_kwargs=True)
    h._restore.append(hook.remove)
    _wrap_forward(h, module)
    h._compile_probe = [module] + [h._module_of[i] for i in h._whole]
    if h._device.type == "cuda":
        _observe_oom(h)
        h._cap = a.memory()["cap"]
        if h._cap:  # torch's allocator is held to what the plan leaves it, step by step
            h._fraction0 = torch.cuda.get_per_process_memory_fraction(h._device)
            h._limit_torch()
    if min_saved is not None:
        h._offload = _SavedOffload(h._device, min_saved)
        post = module.register_forward_hook(h._root_post_hook, always_call=True)
        h._restore.append(post.remove)
    setattr(module, "_arena_handle", weakref.ref(h))  # (a plain attribute: nn.Module keeps it in __dict__)
    h._restore.append(lambda: module.__dict__.pop("_arena_handle", None))


def _wrap_forward(h: Handle, module: nn.Module) -> None:
    """torch running out of device memory inside a step of the module comes out as
    arena.Error DEV_OOM saying what the step needed and what to do (the step's
    blocks are released on the way out; the next step plans for the need)."""
    inner = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        except torch.OutOfMemoryError as e:
            raise h._oom_error(e) from e

    module.__dict__["forward"] = forward
    h._restore.append(lambda: module.__dict__.pop("forward", None))


def _check_train_ring(h: Handle) -> None:
    """Training: a block's recompute holds it until its backward has run (its
    input's and its adapters' gradients are made), which may come after the
    next block's recompute has started: whole blocks need a ring of three slots
    (the ring fills in order, so one held slot of two stops it). In pieces the
    ring must hold a whole block beside the next piece."""
    a = h.arena
    pl = a.plan()
    if not pl["n_streamed"]:
        return
    if not h._pieced:
        if pl["slots"] >= 3:
            return
        raise Error(
            "BUDGET",
            f"{a.path}: training holds a streamed block from its recompute until its backward has run, past "
            f"the next block's recompute: the ring needs 3 slots and has {pl['slots']}; attach with depth=2 "
            f"(or keep_last=1), or more vram",
        )
    slot = pl["slot_bytes"] or max(a.blocks[i].nbytes for pb in h._pieced for i in pb.pieces)
    block = max(sum(a.blocks[i].nbytes for i in pb.pieces) for pb in h._pieced)
    ring = pl["slots"] * slot
    if ring >= block + slot:
        return
    depth = -(-block // slot)  # the ring holds depth + 1 pieces: a whole block and one more
    raise Error(
        "BUDGET",
        f"{a.path}: training in pieces holds a block's pieces from its recompute to its backward: the ring "
        f"({pl['slots']} x {slot} bytes) must hold the largest block ({block} bytes) and one piece more; "
        f"attach with depth={depth} (keep_last=0), or larger pieces",
    )


def _persistent(module: nn.Module, name: str) -> bool:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    return leaf not in owner._non_persistent_buffers_set


def _is_within(root: nn.Module, inner: nn.Module, outer: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def _swap(h: Handle, owner: nn.Module, leaf: str, is_buf: bool, view: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    table: Dict[str, Any] = owner._buffers if is_buf else owner._parameters
    if is_buf:
        new: torch.Tensor = view
    else:
        new = nn.Parameter(view, requires_grad=False)
    keys = list(table.keys())
    table[leaf] = new
    h._names[id(new)] = leaf
    shape, dtype, rg = tuple(old.shape), old.dtype, bool(getattr(old, "requires_grad", False))

    def undo() -> None:
        ph = torch.empty(shape, dtype=dtype, device="meta")
        table[leaf] = ph if is_buf else nn.Parameter(ph, requires_grad=rg)
        _reorder(table, keys)

    h._restore.append(undo)
    return new


def _wrap_block(h: Handle, m: nn.Module, b: _BlockBinding) -> None:
    cls = type(m)
    m.__class__ = _bound_cls(cls)
    m.__dict__["_arena_binding"] = b

    def undo() -> None:
        m.__dict__.pop("_arena_binding", None)
        m.__class__ = cls

    h._restore.append(undo)
