"""Binding a module to an arena (``attach``'s work): every parameter and buffer
matched to the image's tensors, all problems reported at once; the globals
bound once; each block module wrapped so that its calls go through its
binding (whole, or in pieces); the guards set; all of it undone by
``Handle.detach``."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, cast

import torch
from torch import nn

from .._dtypes import _view, torch_dtype
from .._errors import Error
from .._records import Component, TensorInfo
from ._blocks import _DEQUANT, _BlockBinding, _as_component, _dequantize, _in_backward, _Member, _placeholder
from ._buffers import Rebuilt, computed_attributes, computed_buffers, set_attributes
from ._guards import _guard_apply, _guard_merge, _is_adapter_param, _peft_tuners, _reorder
from ._handle import Handle, _observe_oom
from ._offload import _SavedOffload
from ._pieces import _LeafRef, _PiecedBinding
from . import _fp8, _quant, _retry


_STRIP = ("base_model.model.",)  # a peft PeftModel's prefix
_cls_cache: Dict[type, type] = {}


def _image_name(name: str) -> str:
    for p in _STRIP:
        if name.startswith(p):
            name = name[len(p) :]
    return name.replace(".base_layer.", ".").replace("._orig_mod.", ".").replace("_orig_mod.", "")


def _checkpoints_forward(cls: type) -> bool:
    """transformers' layers checkpoint their own forward (GradientCheckpointingLayer):
    the recompute calls it directly, not through the module's call."""
    return any(c.__name__ == "GradientCheckpointingLayer" for c in cls.__mro__)


def _bound_cls(cls: type) -> type:
    """A subclass of a block's (or a module's inside one) class whose __call__ goes
    through its binding; where the class checkpoints its own forward, the forward
    too, so that the recompute in the backward finds the module's tensors. A call in
    a backward (a recompute) that runs out of device memory is run again (_retry)."""
    if cls in _cls_cache:
        return _cls_cache[cls]
    base_call = cls.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        b = self.__dict__.get("_arena_binding")
        if b is None:
            return base_call(self, *args, **kwargs)
        if _in_backward():
            return _retry.recompute(b.handle, lambda: b.run(base_call, self, args, kwargs))
        return b.run(base_call, self, args, kwargs)

    ns: Dict[str, Any] = {"__call__": __call__, "__module__": cls.__module__, "_arena_base": cls}
    if _checkpoints_forward(cls):
        base_forward = cls.forward  # type: ignore[attr-defined]

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            b = self.__dict__.get("_arena_binding")
            if b is not None and _in_backward():
                b.recomputed()
                return _retry.recompute(b.handle, lambda: base_forward(self, *args, **kwargs))
            return base_forward(self, *args, **kwargs)

        ns["forward"] = forward
    new = type(cls.__name__, (cls,), ns)
    _cls_cache[cls] = new
    return new


def _roots_of(target: Any, image: Dict[str, TensorInfo]) -> List[Tuple[str, nn.Module]]:
    """The modules to bind and the prefix of each one's names in the image: a module
    (""), or the components of a pipeline (``pipe.components``) or of a dict of
    modules whose names are the image's first components ("text_encoder.", ...)."""
    if isinstance(target, nn.Module):
        return [("", target)]
    comps = getattr(target, "components", target)
    if not isinstance(comps, dict):
        raise Error("USAGE", f"attach: a {type(target).__name__} is neither an nn.Module nor a pipeline "
                             f"(an object with .components, or a dict of modules)")
    firsts = {n.split(".", 1)[0] for n in image}
    roots = [(name + ".", m) for name, m in comps.items() if isinstance(m, nn.Module) and name in firsts]
    if not roots:
        raise Error("USAGE", f"attach: none of the components {sorted(k for k, v in comps.items() if v is not None)} "
                             f"has tensors in the image (its names start with {sorted(firsts)[:8]}): convert the "
                             f"pipeline's folder (arena convert PIPELINE_DIR)")
    return roots


def _needs_members(m: nn.Module) -> bool:
    """A whole block whose modules must be bound at their own calls too: one that
    checkpoints inside itself (a module in it with gradient checkpointing: diffusers'
    UNet blocks, transformers' layers), whose recompute in the backward calls the
    modules inside, not the block; or a container that is never called."""
    if isinstance(m, (nn.ModuleList, nn.ModuleDict)):
        return True
    return any(hasattr(sub, "gradient_checkpointing") or _checkpoints_forward(type(sub)) for sub in m.modules())


def _bind(h: Handle, target: Any, mode: str, trainable: Any, min_saved: Optional[int] = None) -> None:
    a = h.arena
    if h.arena.mode != mode:
        a.set_mode(mode)
    h._device = torch.device(a.device)
    image = {n: a.tensor_info(n) for n in a.tensor_names()}
    roots = _roots_of(target, image)
    h._roots = roots
    h._watch_registrations()
    for _, module in roots:
        ref = getattr(module, "_arena_handle", None)
        if ref is not None and ref() is not None:
            raise Error("USAGE", f"{type(module).__name__} is attached to an arena already: detach() it first")
    is_trainable: Callable[[str], bool]
    if trainable is None:
        is_trainable = lambda n: False  # noqa: E731
    elif callable(trainable):
        is_trainable = trainable
    else:
        tnames = set(trainable)
        is_trainable = tnames.__contains__

    problems: List[str] = []
    # image name -> (owners (module, leaf), tensor, info, is a buffer)
    bound: Dict[str, Tuple[List[Tuple[nn.Module, str]], torch.Tensor, TensorInfo, bool]] = {}
    spare: Set[str] = set()  # image names of tied weights bound through another name
    subs: Dict[str, torch.Tensor] = {}  # image name -> the tensor subclass that holds its components (_quant)
    buffers: List[Tuple[List[Tuple[nn.Module, str]], torch.Tensor, torch.Tensor]] = []
    attrs: List[Tuple[nn.Module, str, Any, Any]] = []
    peft_of: Dict[int, str] = {}
    claimed: Set[str] = set()  # image names a parameter maps to, bound or not (a problem said)
    # parameters of the image's shapes in another dtype: (theirs, the image's) -> how many; the components
    dtypes: Dict[Tuple[str, str], int] = {}
    dtype_comps: Set[str] = set()
    for prefix, module in roots:
        tuners = set(_peft_tuners(module))
        # 1. Every parameter and buffer against the image, all problems at once. Names
        # sharing one tensor (tied weights: T5's shared and encoder.embed_tokens, an LM
        # head tied to the embeddings) are bound to one copy: the image holds one of
        # the names, as Hugging Face checkpoints store them.
        groups: Dict[int, Tuple[List[str], torch.Tensor, bool]] = {}
        for full, prm in module.named_parameters(remove_duplicate=False):
            groups.setdefault(id(prm), ([], prm, False))[0].append(full)
        for mname, mod in module.named_modules(remove_duplicate=False):
            for leaf, buf in mod._buffers.items():
                if buf is None:
                    continue
                full = f"{mname}.{leaf}" if mname else leaf
                if leaf in mod._non_persistent_buffers_set and prefix + _image_name(full) not in image:
                    continue  # computed by the model: below
                groups.setdefault(id(buf), ([], buf, True))[0].append(full)
        for names, t, is_buf in groups.values():
            full = names[0]
            inames = [prefix + _image_name(n) for n in names]
            present = [i for i in dict.fromkeys(inames) if i in image]
            tied = f" (tied to {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
            if not present:
                if all(_is_adapter_param(n, tuners) or is_trainable(n) for n in names):
                    if t.device.type == "meta":
                        problems.append(f"'{full}' is on the meta device and arena holds no tensor for it: add "
                                        f"adapters after attach (or to a module with real tensors), or materialize it")
                    continue
                problems.append(f"'{full}'{tied} has no tensor '{inames[0]}' in the image")
                continue
            iname = present[0]
            claimed.add(iname)
            spare.update(present[1:])
            info = image[iname]
            if iname in bound:
                problems.append(f"'{full}' and another parameter both map to '{iname}'")
                continue
            owners = []
            for n in names:
                owner_name, _, leaf = n.rpartition(".")
                owners.append((module.get_submodule(owner_name) if owner_name else module, leaf))
            if info.scheme == _quant.SCHEME or _quant.fp8_native(h, info, full, module):
                sub, why = _quant.match(h, full, t, info)
                if why is not None or sub is None:
                    problems.append(why or f"'{full}': no tensor subclass")
                    continue
                if len(owners) > 1:
                    problems.append(f"'{full}'{tied}: a tensor subclass tied to other names is not supported")
                    continue
                if isinstance(sub, _fp8.Fp8Weight):  # the backward dequantizes by arena's kernel
                    sub.src = (h.arena, h.arena.tensor_index(iname),
                               next(c.offset for c in info.components if c.name == "qdata"))
                subs[iname] = sub
                bound[iname] = (owners, t, info, is_buf)
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
                if tuple(t.shape) == info.shape:
                    pair = (str(t.dtype).replace("torch.", ""), str(want).replace("torch.", ""))
                    dtypes[pair] = dtypes.get(pair, 0) + 1
                    dtype_comps.add(prefix[:-1])
                problems.append(
                    f"'{full}' is {tuple(t.shape)} {t.dtype}, the image's '{iname}' is {info.shape} {info.dtype}"
                )
                continue
            bound[iname] = (owners, t, info, is_buf)
        # Buffers the model computes: materialized (built on meta) or moved to the arena's device.
        rebuilt: Rebuilt = {}
        got, bproblems = computed_buffers(module, h._device, lambda n, p=prefix: p + _image_name(n) in image, rebuilt)
        buffers += got
        problems += bproblems
        got_a, aproblems = computed_attributes(module, h._device, rebuilt)  # tensors in plain attributes
        attrs += got_a
        problems += aproblems
        peft_of[id(module)] = next((p for p in _STRIP if any(n.startswith(p) for n, _ in module.named_modules())), "")
    mine = [n for n in image if any(n.startswith(p) for p, _ in roots)]
    for n in sorted(set(mine) - claimed - spare):
        problems.append(f"the image's '{n}' has no parameter in the module")
    if roots[0][0]:  # a pipeline: every component of the image has its module
        have = {p[:-1] for p, _ in roots}
        for comp in sorted({n.split(".", 1)[0] for n in image} - have):
            problems.append(f"the image's component '{comp}' has no module in the pipeline")
        comps = getattr(target, "components", target)
        for name, m in comps.items():  # the others run as they are: not on meta
            if isinstance(m, nn.Module) and name not in have and any(p.is_meta for p in m.parameters()):
                problems.append(f"component '{name}' is on the meta device and the image holds none of it: "
                                f"convert the pipeline's folder with it, or materialize it")
    # 2. The image's blocks are modules of the module (a list's members, a UNet's
    # mid_block, a nested list's: encoder.block.3, text_model.encoder.layers.3).
    block_mod: Dict[int, nn.Module] = {}  # arena block (or piece) -> the block module
    parent_of: Dict[int, str] = {}  # arena block (or piece) -> the image block's name
    comp_of: Dict[int, str] = {}
    for b in a.blocks:
        if b.container is None:
            continue
        parent = b.name.partition("#")[0]  # a piece ("transformer_blocks.3#1") is part of its block
        root = next(((p, m) for p, m in roots if parent.startswith(p)), None)
        if root is None:
            continue
        prefix, module = root
        parent_of[b.index] = parent
        comp_of[b.index] = prefix
        try:
            m = module.get_submodule(peft_of[id(module)] + parent[len(prefix):])
        except AttributeError:
            if b.name == parent or b.name.endswith("#0"):
                problems.append(f"the image's block '{parent}' is not a submodule of the module")
            continue
        block_mod[b.index] = m
    for iname, (owners, t, info, _) in bound.items():
        if info.block in block_mod:
            for owner, leaf in owners:
                if not _is_within(owner, block_mod[info.block]):
                    problems.append(f"'{iname}' is in image block '{parent_of[info.block]}' but "
                                    f"{type(owner).__name__}.{leaf} is not inside that submodule")
    if problems:
        what = type(target).__name__
        head = f"cannot attach {what} to {a.path}: {_dtype_summary(dtypes, dtype_comps)}{len(problems)} problem(s): "
        shown = "; ".join(problems[:40]) + ("; ..." if len(problems) > 40 else "")
        raise Error("USAGE", head + shown)

    # 3. Bind. Parameters become new frozen Parameters viewing arena memory;
    # the module's own tensors are released.
    # Tensors stored quantized are dequantized: globals once, here; block tensors at
    # each call of their block (placeholders until then).
    for owners, old, new in buffers:
        _set_buffer(h, owners, old, new)
    set_attributes(attrs, h._restore)
    per_block: Dict[int, List[Tuple[torch.Tensor, Component]]] = {}
    per_block_q: Dict[int, List[Tuple[torch.Tensor, TensorInfo, int]]] = {}
    for iname, (owners, t, info, is_buf) in bound.items():
        resident, dev, host = a.block_state(info.block)
        if iname in subs:  # inner tensors of a tensor subclass, bound as parameters are
            (owner, leaf), = owners
            refs = _quant.bind(h, owner, leaf, t, subs[iname], info)
            if info.block not in block_mod or resident:
                for r, c in refs:
                    r.data = _view(a.slab(info.block, dev, "device"), c)
            if info.block in block_mod:
                per_block.setdefault(info.block, []).extend(cast(List[Tuple[torch.Tensor, Component]], refs))
            continue
        c = info.components[0]
        quant = info.scheme != "none"
        if info.block not in block_mod:  # globals: resident for good
            if quant:
                with torch.no_grad():
                    view = _dequantize(h, info, a.tensor_index(iname), dev)
            else:
                view = _view(a.slab(info.block, dev, "device"), c)
            _swap(h, owners, is_buf, view, t)
            continue
        if resident and not quant:
            view = _view(a.slab(info.block, dev, "device"), c)
        else:  # no memory until the block is acquired: a placeholder of the right shape on the device
            view = _placeholder(h, _as_component(info))
        p = _swap(h, owners, is_buf, view, t)
        if quant:
            per_block_q.setdefault(info.block, []).append((p, info, a.tensor_index(iname)))
        else:
            per_block.setdefault(info.block, []).append((p, c))
    groups2: Dict[str, List[int]] = {}
    for idx in block_mod:
        groups2.setdefault(parent_of[idx], []).append(idx)
    # Each block's weights as its modules hold them: they read nothing while it is
    # not held (_BlockBinding.guard).
    held: Dict[int, List[Tuple[torch.Tensor, str]]] = {}
    for iname, (owners, _, info, is_buf) in bound.items():
        if info.block in block_mod:
            owner, leaf = owners[0]
            w = (owner._buffers if is_buf else owner._parameters)[leaf]
            held.setdefault(info.block, []).append((cast(torch.Tensor, w), iname))
    h._copy_bytes = _quant.copy_bytes(groups2, per_block_q)
    for parent, idxs in groups2.items():
        m = block_mod[idxs[0]]
        bs: Dict[int, _BlockBinding] = {}
        for idx in idxs:
            bb = _BlockBinding(h, idx, a.blocks[idx].name, per_block.get(idx, []), per_block_q.get(idx),
                               comp=comp_of[idx])
            resident, dev, host = a.block_state(idx)
            bb.addr = dev if resident else -1  # host views are placeholders: bind at the first call
            bb.guard(held.get(idx, []))
            h._restore.append(bb.unguard)
            bs[idx] = bb
            h._module_of[idx] = m
        # The modules inside the block that own its tensors.
        leaf_need: Dict[int, Set[int]] = {}
        leaf_mod: Dict[int, nn.Module] = {}
        for idx in idxs:
            for owners, _, info, _ in bound.values():
                if info.block == idx:
                    for owner, _ in owners:
                        leaf_need.setdefault(id(owner), set()).add(idx)
                        leaf_mod[id(owner)] = owner
        if len(idxs) == 1 and a.blocks[idxs[0]].name == parent:  # a whole block
            bb = bs[idxs[0]]
            h._whole[idxs[0]] = bb
            _wrap_block(h, m, bb)
            if _needs_members(m):
                for oid, leaf_m in leaf_mod.items():
                    if leaf_m is not m:
                        _wrap_block(h, leaf_m, _Member(bb))  # type: ignore[arg-type]
            continue
        # In pieces: the modules owning its tensors acquire the pieces they need, and
        # those of the modules inside them, whose weights they may read without
        # calling them (nn.MultiheadAttention reads its out_proj's).
        own = {k: set(v) for k, v in leaf_need.items()}
        for oid, leaf_m in leaf_mod.items():
            if leaf_m is not m:
                for inner in leaf_m.modules():
                    leaf_need[oid] |= own.get(id(inner), set())
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
    # The order the blocks run in, from the module: its modules' order (the order
    # they are made in, as their forward calls them: HunyuanVideo's token refiner
    # before its transformer blocks, which the image orders after them), each
    # component's apart; the engine prefetches by it from the first step, and
    # learns the order run from then on.
    for prefix, module in roots:
        pos = {id(m): i for i, (_, m) in enumerate(module.named_modules(remove_duplicate=False))}
        units = [i for i in block_mod if comp_of[i] == prefix]
        h._orders[prefix] = sorted(units, key=lambda i: (pos.get(id(block_mod[i]), len(pos)), i))
    if len(roots) == 1 and h._orders[""]:
        h._use_order("")
    # 4. Guards: moves and conversions of bound weights, adapter merges, a second attach.
    owner_leaves: Dict[int, Tuple[nn.Module, List[str]]] = {}
    for owners, _, _, _ in bound.values():
        for o, leaf in owners:
            owner_leaves.setdefault(id(o), (o, []))[1].append(leaf)
    for o, leaves in owner_leaves.values():
        _guard_apply(h, o, leaves)
    for prefix, module in roots:
        for name, tuner in _peft_tuners(module).items():
            _guard_merge(h, prefix + name, tuner)
        hook = module.register_forward_pre_hook(h._root_pre_hook, with_kwargs=True)
        h._restore.append(hook.remove)
        _wrap_forward(h, module)
    h._compile_probe = [m for _, m in roots] + [h._module_of[i] for i in h._whole]
    if h._device.type == "cuda":
        _observe_oom(h)
        h._cap = a.memory()["cap"]
        if h._cap:  # torch's allocator is held to what the plan leaves it, step by step
            h._fraction0 = torch.cuda.get_per_process_memory_fraction(h._device)
            h._limit_torch()
    if min_saved is not None:
        h._offload = _SavedOffload(h._device, min_saved)
        for _, module in roots:
            post = module.register_forward_hook(h._root_post_hook, always_call=True)
            h._restore.append(post.remove)
    for _, module in roots:
        setattr(module, "_arena_handle", weakref.ref(h))  # (a plain attribute: nn.Module keeps it in __dict__)
        h._restore.append(functools.partial(module.__dict__.pop, "_arena_handle", None))


def _dtype_summary(dtypes: Dict[Tuple[str, str], int], comps: Set[str]) -> str:
    """Parameters of the image's shapes in other dtypes, said in one line before the
    list of problems: how many of each dtype, what the image holds, the fix
    ("342 tensors are float32, the image holds bfloat16: build the model with
    .to(torch.bfloat16); "), or "" when there are none."""
    if not dtypes:
        return ""
    have: Dict[str, int] = {}
    held: Dict[str, int] = {}
    for (mine, image), n in dtypes.items():
        have[mine] = have.get(mine, 0) + n
        held[image] = held.get(image, 0) + n
    counts = sorted(have.items(), key=lambda kv: (-kv[1], kv[0]))
    said = f"{counts[0][1]} tensors are {counts[0][0]}" + "".join(f" and {n} {d}" for d, n in counts[1:])
    named = sorted(c for c in comps if c)
    what = "the model" if not named else (named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1])
    if len(held) == 1:
        dt = next(iter(held))
        return f"{said}, the image holds {dt}: build {what} with .to(torch.{dt}); "
    holds = " and ".join(f"{d} ({n})" for d, n in sorted(held.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{said}, the image holds {holds}: build {what} in the image's dtypes, tensor by tensor as listed; "


def _wrap_forward(h: Handle, module: nn.Module) -> None:
    """torch running out of device memory inside a step of the module: arena gives
    torch what it can and runs the forward again, a bounded number of times
    (_retry); then arena.Error DEV_OOM saying what the step needed and what to do
    (the step's blocks are released on the way out; the next step plans for the
    need)."""
    inner = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return _retry.forward(h, inner, args, kwargs)

    module.__dict__["forward"] = forward
    h._restore.append(lambda: module.__dict__.pop("forward", None))


def _is_within(inner: nn.Module, outer: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def _swap(h: Handle, owners: List[Tuple[nn.Module, str]], is_buf: bool, view: torch.Tensor,
          old: torch.Tensor) -> torch.Tensor:
    """The tensor of every owner's name (tied names share it) replaced by ``view``
    (a frozen Parameter viewing it); at detach, one meta tensor for all of them."""
    new: torch.Tensor = view if is_buf else nn.Parameter(view, requires_grad=False)
    shape, dtype, rg = tuple(old.shape), old.dtype, bool(getattr(old, "requires_grad", False))
    made: List[torch.Tensor] = []

    def placeholder() -> torch.Tensor:
        if not made:
            ph = torch.empty(shape, dtype=dtype, device="meta")
            made.append(ph if is_buf else nn.Parameter(ph, requires_grad=rg))
        return made[0]

    for owner, leaf in owners:
        table: Dict[str, Any] = owner._buffers if is_buf else owner._parameters
        keys = list(table.keys())
        table[leaf] = new
        h._names[id(new)] = leaf

        def undo(table: Dict[str, Any] = table, leaf: str = leaf, keys: List[str] = keys) -> None:
            table[leaf] = placeholder()
            _reorder(table, keys)

        h._restore.append(undo)
    return new


def _set_buffer(h: Handle, owners: List[Tuple[nn.Module, str]], old: torch.Tensor, new: torch.Tensor) -> None:
    """A buffer the model computes, on the arena's device (the one it had comes back at detach)."""
    for owner, leaf in owners:
        owner._buffers[leaf] = new

        def undo(owner: nn.Module = owner, leaf: str = leaf) -> None:
            owner._buffers[leaf] = old

        h._restore.append(undo)


def _wrap_block(h: Handle, m: nn.Module, b: _BlockBinding) -> None:
    cls = type(m)
    m.__class__ = _bound_cls(cls)
    m.__dict__["_arena_binding"] = b

    def undo() -> None:
        m.__dict__.pop("_arena_binding", None)
        m.__class__ = cls

    h._restore.append(undo)
