"""Blocks in pieces (``piece_size``): the modules inside a block that own bound
tensors acquire the pieces holding them, and the block's call holds each piece
from its first use to its last."""

from __future__ import annotations

import bisect
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

import torch
from torch import nn

from ._blocks import (_BlockBinding, _check_training, _in_backward, _leaf_inputs, _SavedWeights, _seq_now,
                      _track, _under_checkpoint, _will_run)

if TYPE_CHECKING:
    from ._handle import Handle


class _LeafRef:
    """A module inside a pieced block that owns bound tensors: its calls go to the block's binding."""

    def __init__(self, block: "_PiecedBinding", key: int):
        self.block = block
        self.key = key
        self.handle = block.handle

    # Inside a compiled block: a graph break here (the acquire and the binding
    # run eagerly, the module with them), not a trace of the binding, whose
    # addresses change from call to call and would recompile.
    @torch.compiler.disable
    def run(self, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        return self.block.leaf(self.key, call, mod, args, kwargs)

    def recomputed(self) -> None:
        if not self.block.active:
            self.block.hold_loose(self.block.need[self.key])


class _PiecedBinding:
    """A block module whose image block is streamed in pieces (``piece_size``).

    Each module inside it that owns bound tensors (a Linear, a norm) acquires
    the pieces holding its tensors when it is called (one piece: pieces are
    never cut inside a module) and the block's call holds each piece from its
    first use to its last, learned from the block's previous call (on a first
    call, or when the calls change, a piece is held until a module needs
    another), so the ring holds a few pieces, not the block. A recompute in
    backward (checkpointing) holds each piece until the backward of every
    module that used it has run (its input's gradient is made), so a train
    step holds at most one block's pieces at a time. A module whose backward this
    backward does not run (none of its inputs' gradients is made: it makes an
    output the loss does not use, as Qwen-Image's last block's text stream) holds
    its pieces for its recompute alone.

    A backward that needs pieces outside a recompute of the block (a weight
    its forward saved, unpacked; a checkpoint inside the block recomputing a
    module of it; a reentrant checkpoint's recompute) holds them "loose" until
    the block's backward has run (``_track``) or the step ends."""

    def __init__(self, handle: "Handle", name: str, pieces: Dict[int, "_BlockBinding"], need: List[Tuple[int, ...]]):
        self.handle = handle
        self.name = name
        self.pieces = pieces  # arena block index -> the piece's binding (its views)
        self.need = need  # per leaf key: the pieces it needs
        self.index = min(pieces)  # for the handle's bookkeeping
        self.weights = [p for b in pieces.values() for p in b.weights]
        self.scheme = next((b.quant[0][1].scheme for b in pieces.values() if b.quant), None)
        self.held: Set[int] = set()  # pieces acquired and not released
        self.active = False
        self.backward = False
        self.pos = 0
        self.rec: List[int] = []
        self.seq: Optional[List[int]] = None
        self.rel_before: Dict[int, List[int]] = {}
        self.rel_after: Dict[int, List[int]] = {}
        self.follow = False
        self.watched: Set[int] = set()  # forward positions whose backward releases recompute holds
        # forward: per watched position, the autograd nodes that make its inputs'
        # gradients (its backward runs when one of them does)
        self.grad_nodes: Dict[int, List[Any]] = {}
        self.bw: Dict[int, Tuple[int, ...]] = {}  # recompute: position -> pieces it holds for backward
        self.bw_ref: Dict[int, int] = {}
        self.keep: Tuple[int, ...] = ()  # pieces of the block module's own tensors: held for its whole call
        # forward: positions waiting for the gradient of each input tensor, one hook
        # on each (by id, with a weak reference that tells a tensor gone, whose id
        # a new one may take, from the same one)
        self.waiting: Dict[int, Tuple[Any, List[int]]] = {}
        self.loose: Set[int] = set()  # pieces held for a backward until the block's backward has run
        self.comp = next(iter(pieces.values())).comp
        for b in pieces.values():
            b.group = self

    # --- pieces ---
    def _acquire(self, idx: int) -> None:
        h = self.handle
        addr = h.arena._acquire_unchecked(idx, h._stream())
        self.held.add(idx)
        self.pieces[idx].bind(addr)

    def _hold(self, need: Tuple[int, ...]) -> None:
        for idx in need:
            if idx not in self.held:
                self._acquire(idx)

    def _release(self, idx: int) -> None:
        self.held.discard(idx)
        self.handle.arena._release_unchecked(idx, self.handle._stream())
        self.pieces[idx].drop()

    def release_all(self) -> None:
        """Step end: whatever is still held goes."""
        self.loose.clear()
        self.grad_nodes.clear()
        self.bw.clear()
        self.bw_ref.clear()
        self.watched.clear()
        for idx in list(self.held):
            self._release(idx)

    def _bw_done(self, pos: int) -> None:
        for idx in self.bw.pop(pos, ()):
            self.bw_ref[idx] -= 1
            if not self.bw_ref[idx]:
                del self.bw_ref[idx]
                if idx in self.held and idx not in self.loose:
                    self._release(idx)

    def hold_loose(self, idxs: Tuple[int, ...]) -> None:
        """Pieces for a backward: held until the block's backward has run (or the step ends)."""
        h = self.handle
        h._enter(self.comp, True)
        if h._all_resident and self.scheme is None:
            for idx in idxs:
                self.pieces[idx].bind(h._resident_at[idx])
            return
        for idx in idxs:
            if idx not in self.held:
                self._acquire(idx)
            else:
                self.pieces[idx].bind(self.pieces[idx].addr)
            self.loose.add(idx)
        h._bw_groups.add(self)

    def recomputed(self) -> None:
        """Its forward runs in a backward outside its call (transformers' layers
        checkpoint their forward): the block's own tensors held for it."""
        if not self.active and self.keep:
            self.hold_loose(self.keep)

    def release_loose(self, at_step_end: bool = False) -> None:
        loose, self.loose = self.loose, set()
        for idx in loose:
            if idx in self.held and not self.bw_ref.get(idx) and not self.active:
                self._release(idx)

    def _learn(self) -> None:
        """From the calls of the block's last call (``rec``): which pieces each
        position releases before it acquires (``rel_before``) and after its call
        (``rel_after``, a piece's last use). The ring's rule (engine.h,
        arena_residency_ring) is that a block's call holds one piece while it
        acquires the next: a piece used again after others (pieces are cut in the
        order of the image's names, which need not be the order of the calls: a
        UNet's resnets and attentions alternate) is held across them only while
        it is the one other piece held, the one used again soonest; the others
        are released and acquired again (the ring keeps their bytes until it
        needs the room)."""
        if self.rec == self.seq:
            return
        self.seq = list(self.rec)
        uses: Dict[int, List[int]] = {}
        for pos, key in enumerate(self.seq):
            for idx in self.need[key]:
                if not uses.get(idx) or uses[idx][-1] != pos:
                    uses.setdefault(idx, []).append(pos)
        keep = set(self.keep)
        held = set(keep)
        self.rel_before = {}
        self.rel_after = {}
        for pos, key in enumerate(self.seq):
            need = self.need[key]
            missing = [i for i in need if i not in held]
            if missing:
                # the pieces held while the last missing one is acquired: keep's, the
                # needed ones held, the missing ones before it, and at most one other
                room = 1 - len(keep) - sum(1 for i in need if i in held and i not in keep) - (len(missing) - 1)
                others = sorted((i for i in held if i not in keep and i not in need),
                                key=lambda i: uses[i][bisect.bisect_right(uses[i], pos)])
                out = others[max(0, room):]
                if out:
                    self.rel_before[pos] = out
                    held.difference_update(out)
                held.update(missing)
            for idx in need:
                if uses[idx][-1] == pos and idx not in keep:
                    self.rel_after.setdefault(pos, []).append(idx)
                    held.discard(idx)

    # --- calls ---
    def run(self, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        h = self.handle
        if self.active:  # a block calling itself: its pieces stay as they are
            return call(mod, *args, **kwargs)
        backward = _in_backward()
        grad = torch.is_grad_enabled()
        h._enter(self.comp, backward)
        if grad and not backward:
            _check_training(h, self.name, self.weights)
        # its backward's holds go when its backward has run (a reentrant checkpoint's
        # recompute: its own backward, inside this one)
        start = _seq_now() if grad and not (backward and _under_checkpoint()) else -1
        if h._all_resident and self.scheme is None:
            for idx, b in self.pieces.items():
                b.bind(h._resident_at[idx])
            out = self._call(call, mod, args, kwargs)
            if start >= 0:
                _track(h, start, out, self.release_loose, self.index, _leaf_inputs(args, kwargs))
            return out
        saved = None
        if grad and not backward and not _under_checkpoint() and (
                self.scheme is not None or not all(h.arena.block_state(i)[0] for i in self.pieces)):
            saved = _SavedWeights(list(self.pieces.values()), self.name)
        self.active, self.backward, self.pos = True, backward, 0
        h._active += 1
        self.rec = []
        self.follow = self.seq is not None and not backward
        if not backward:
            self.watched = set()
            self.grad_nodes = {}
        keep = self.keep
        done = False
        try:
            self._hold(keep)
            if saved is not None:
                with saved:
                    out = call(mod, *args, **kwargs)
            else:
                out = call(mod, *args, **kwargs)
            done = True
        finally:
            self.active = False
            h._active -= 1
            self.waiting = {}
            for idx in list(self.held):
                if not (backward and (self.bw_ref.get(idx) or idx in keep)) and idx not in self.loose:
                    self._release(idx)
        if done and not backward:
            self._learn()
        if start >= 0:
            _track(h, start, out, self.release_loose, self.index, _leaf_inputs(args, kwargs))
        return out

    def leaf(self, key: int, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...],
             kwargs: Dict[str, Any]) -> Any:
        h = self.handle
        need = self.need[key]
        h._enter(self.comp, _in_backward())
        if h._all_resident and self.scheme is None:
            for idx in need:
                self.pieces[idx].bind(h._resident_at[idx])
            return call(mod, *args, **kwargs)
        if not self.active:
            if _in_backward():  # a checkpoint inside the block recomputing this module
                self.hold_loose(need)
                return self._call(call, mod, args, kwargs)
            return self._alone(need, call, mod, args, kwargs)
        pos = self.pos
        self.pos += 1
        if self.backward:  # a recompute: held until this module's backward has run
            self._hold(need)
            # (held before the call: a checkpoint stops its recompute by raising from
            # inside the module that saves its last tensor, whose backward needs them)
            nodes = self.grad_nodes.get(pos) if pos in self.watched and pos not in self.bw else None
            if nodes is not None and not _will_run(nodes):
                # its backward does not run: what the recompute saves for it is never
                # used, and held until the step's end its pieces would fill the ring
                out = call(mod, *args, **kwargs)
                for idx in need:
                    if idx in self.held and not self.bw_ref.get(idx) and idx not in self.keep \
                            and idx not in self.loose:
                        self._release(idx)
                return out
            if pos in self.watched and pos not in self.bw:
                self.bw[pos] = need
                for idx in need:
                    self.bw_ref[idx] = self.bw_ref.get(idx, 0) + 1
            elif pos not in self.bw:  # (a reentrant checkpoint's recompute: nothing watched in its forward)
                for idx in need:
                    self.loose.add(idx)
                h._bw_groups.add(self)
            return call(mod, *args, **kwargs)
        self.rec.append(key)
        seq = self.seq or []
        if self.follow and (pos >= len(seq) or seq[pos] != key):
            self.follow = False  # the calls changed: hold only what each module needs
        if not self.follow:
            for idx in list(self.held):
                if idx not in need and idx not in self.keep:
                    self._release(idx)
        else:
            for idx in self.rel_before.get(pos, ()):
                if idx in self.held:
                    self._release(idx)
        self._hold(need)
        if torch.is_grad_enabled():
            grads = [x for x in list(args) + list(kwargs.values()) if isinstance(x, torch.Tensor) and x.requires_grad]
            if grads:
                self.watched.add(pos)
                self._watch(grads, pos)
        out = call(mod, *args, **kwargs)
        if self.follow:
            for idx in self.rel_after.get(pos, ()):
                if idx in self.held and idx not in self.keep:
                    self._release(idx)
        return out

    def _watch(self, grads: List[torch.Tensor], pos: int) -> None:
        """The backward of the module at ``pos`` has run once the gradients of its
        inputs are made. Modules of one input (a block's q, k and v) share one hook
        on it: a hook costs ~0.1 ms of the host's time, and a block in pieces has
        dozens of modules. Several inputs: one hook for all of them."""
        self.grad_nodes[pos] = [torch.autograd.graph.get_gradient_edge(t).node for t in grads]
        if len(grads) > 1:
            hk = torch.autograd.graph.register_multi_grad_hook(grads, lambda _g, p=pos: self._bw_done(p), mode="all")
            self.handle._hooks.append(hk)
            return
        t = grads[0]
        got = self.waiting.get(id(t))
        if got is not None and got[0]() is t:
            got[1].append(pos)
            return
        w = [pos]
        self.waiting[id(t)] = (weakref.ref(t), w)

        def done(_g: Any, w: List[int] = w) -> None:
            for p in w:
                self._bw_done(p)

        self.handle._hooks.append(t.register_hook(done))

    def _call(self, call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        self.handle._active += 1
        try:
            return call(mod, *args, **kwargs)
        finally:
            self.handle._active -= 1

    def _alone(self, need: Tuple[int, ...], call: Callable[..., Any], mod: nn.Module, args: Tuple[Any, ...],
               kwargs: Dict[str, Any]) -> Any:
        """A module of the block called on its own, outside the block's call, in a
        forward: its pieces for the call; what its backward needs of them, as a
        whole block's (saved as references, held until its backward has run)."""
        h = self.handle
        grad = torch.is_grad_enabled()
        start = -1
        if grad:
            _check_training(h, self.name, self.weights)
            start = _seq_now()
        self._hold(need)
        try:
            if grad and not _under_checkpoint() and (
                    self.scheme is not None or not all(h.arena.block_state(i)[0] for i in need)):
                with _SavedWeights([self.pieces[i] for i in need], self.name):
                    out = self._call(call, mod, args, kwargs)
            else:
                out = self._call(call, mod, args, kwargs)
        finally:
            for idx in need:
                if idx in self.held and not self.bw_ref.get(idx) and idx not in self.loose:
                    self._release(idx)
        if start >= 0:
            _track(h, start, out, self.release_loose, self.index, _leaf_inputs(args, kwargs))
        return out
