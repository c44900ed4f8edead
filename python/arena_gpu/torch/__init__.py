"""Bind a PyTorch module to an arena: the module's weights live in arena memory.

In one call, as diffusers and transformers are used:

- ``from_pretrained(cls, source, vram=...)``: a diffusers pipeline, a diffusers
  model or a transformers model from its folder (or a Hugging Face id in the
  local cache), its weights converted once into arena's cache, every model
  built on the meta device in the checkpoint's dtypes and attached, the rest
  (tokenizers, scheduler) loaded as usual: ready to run (``compile=True``: the
  blocks compiled, torch's compiled artifacts kept beside the image);
- ``offload(pipe, vram=...)``: in place of ``pipe.enable_model_cpu_offload()``,
  a pipeline or module already loaded, its weights written into the cache
  (keyed by their content) and attached, the loaded copies let go;
- ``handle(obj)``: the :class:`Handle` of what they return (statistics,
  traces, ``detach()``);
- ``synth_image(cls, path, config=...)``: an image of any diffusers or
  transformers model with random weights, written a block at a time without a
  checkpoint (``python -m arena_gpu synth-image``); it returns the model built
  on the meta device, ready for ``attach``.

For full control, ``attach(module, path)`` binds any module whose parameter names are the
image's (diffusers, transformers, plain torch): each of the image's blocks
(found by ``arena convert`` from the checkpoint's structure) to the module at
its path (``transformer_blocks.N``, ``encoder.block.N``, a UNet's
``mid_block``), and every parameter and buffer to the image's tensor of the
same name (peft's ``...base_layer.weight`` maps to ``...weight``; tied names
share one copy), checking shape and dtype; buffers the model computes rather
than stores are computed by its own code when it was built on meta; all
problems are reported in one error before anything changes. A diffusers
pipeline (or a dict of modules) binds all its components to one arena, made
by ``arena convert PIPELINE_DIR`` (docs/PYTHON.md, "Any model"). Then:

- the globals (tensors outside the blocks) are bound once, as views of their
  device memory;
- each block's parameters are views of the block's bytes where the engine
  has them: when the block is called, it is acquired on torch's current
  stream (prefetched ahead by the engine, resident or streamed through the
  ring), its parameters are pointed at those bytes (``param.data = view``:
  the same ``Parameter`` objects, so optimizer references, hooks and
  ``torch.compile`` guards stay valid, no copy), the block runs, and the
  block is released on the same stream;
- a step is one call of the module's forward up to the next one (backward
  and its recompute included): the engine learns the order of a step and
  prefetches by it.

Training: the bound weights are frozen (``requires_grad=False``); trainable
parameters (peft LoRA layers, or those ``trainable`` names) stay ordinary
torch parameters. Any checkpointing of the model's own (around a block,
inside it, inside a layer's forward; reentrant or not) or none: a recompute
in the backward acquires the block again, and the weights a forward outside
checkpointing saves are kept as references and bound again when its
backward needs them; a block held for its backward is released once its
backward has run (docs/PYTHON.md, "Training"). Refused early, with a message
saying what to do: training the bound weights themselves, merging adapters
into them (``merge_adapter``), and converting them with ``module.to(dtype)``
or moving them to another device (``module.to("cuda")`` onto the device
they are on is fine, and moves the other parameters as usual).

``torch.compile``: compile blocks regionally (diffusers'
``compile_repeated_blocks()``, ``block.compile()``), or replace a block by
``torch.compile(block)`` before attaching. The binding is outside the
compiled code; parameters keep their identity, shape and dtype, so steps
after the first recompile nothing.

``offload_saved``: what a training step's forward saves for its backward
(with checkpointing, each block's inputs) waits in pinned host memory, copied
out beside the forward and back ahead of the backward: less device memory for
torch, the same gradients (docs/PYTHON.md, "Saved tensors in host memory").

Blocks in pieces (``piece_size``): each module inside a block that owns bound
tensors acquires the piece holding them when it is called; the block's call
holds a piece from its first use to its last (docs/PYTHON.md, "Blocks in
pieces"), so the ring holds pieces, not blocks. Sampling in pieces needs a
ring of three slots (a piece held while the next is acquired), training in
pieces one that holds a block and a piece, training in whole blocks three
slots: the default depth does; a smaller ``depth`` given is refused at
attach (``arena.open``'s USAGE, the library's one rule), with the value that
is enough.

Quantized weights: an image's own schemes are dequantized at each bind (fp8
weights computed with natively on GPUs with FP8: ``fp8_compute``); a model
quantized by torchao or optimum-quanto (tensor subclasses) is written with
``save_image(module, path)`` and bound with its inner tensors pointed at
arena memory, the library's kernels running on them (docs/QUANT.md, "Tensor
subclasses"; ``register_binding`` for a library of your own).

Between calls, a streamed block's parameters view ring memory that other
blocks reuse: read weights through ``handle.arena.tensors()``, not through
the module, outside a forward.
"""

# The modules, by concern: _attach (a module matched to an image and bound,
# the guards set), _blocks (whole blocks; the training checks), _pieces (blocks
# in pieces), _offload (saved tensors in host memory), _handle (Handle, Trace),
# _retry (a call that runs out of device memory, run again), _inject (tests:
# torch running out at a chosen allocation), _guards (conversions, moves and
# merges of arena's weights refused), _quant (tensor subclasses: matched,
# rebuilt, bound; save_image), _fp8 (native FP8 weights).

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional, Union

from .._dtypes import _torch

_torch()  # without torch: an ImportError that says what to install, not "No module named 'torch'"

from torch import nn  # noqa: E402

from .. import Arena, Error, Size, parse_size
from .. import open as _open  # attach's opener, by this name here (bench/torch_flux.py times it)
from ._attach import _bind
from ._blocks import _BlockBinding, _in_backward  # (bench/gpu_quant_check.py watches the binds)
from ._handle import Handle, Trace
from ._quant import Binding, register_binding, save_image
from ._share import local_ranks, open_shared

from ._pretrained import from_pretrained, handle  # noqa: E402
from ._loaded import offload  # noqa: E402
from ._synth import synth_image  # noqa: E402

__all__ = ["from_pretrained", "offload", "handle", "attach", "Handle", "Trace", "save_image", "synth_image",
           "register_binding", "Binding", "local_ranks"]
# Named as this module's own (arena_gpu.torch.from_pretrained, in reprs and help()).
for _public in (from_pretrained, offload, handle, synth_image):
    _public.__module__ = __name__
del _public


def _on_cuda(device: Union[str, int, None]) -> bool:
    """The arena attach opens will be on a GPU (device None: when one is usable),
    where torch's allocator is the rest of the process whose need is learned."""
    if device is None:
        import torch

        return torch.cuda.is_available()
    return not (isinstance(device, str) and device == "sim")


def attach(
    module: Union[nn.Module, Any],
    path: Union[str, Arena],
    mode: str = "sample",
    vram: Size = None,
    *,
    device: Union[str, int, None] = None,
    reserve: Size = None,
    headroom: Size = None,
    depth: Optional[int] = None,
    keep_last: Optional[int] = None,
    trainable: Union[Iterable[str], Callable[[str], bool], None] = None,
    offload_saved: Union[bool, Size] = False,
    piece_size: Size = "auto",
    fp8_compute: Union[bool, str] = "auto",
    share_host: Optional[bool] = None,
    group: Any = None,
    share_card: Union[bool, float, Size] = None,
    **open_kwargs: Any,
) -> Handle:
    """Bind ``module``'s weights to the arena at ``path`` (or an open :class:`arena.Arena`).

    Nothing needs tuning: ``attach(module, path)`` (``mode="train"`` to train)
    runs on any card. arena learns what torch needs at its peak in a step of
    each kind of work (the mode, autograd, the inputs' shapes; again when they
    change) and gives the weights the rest; a work not seen yet runs with the
    weights at their smallest, so that its first step fits too.

    module: built on the meta device (``with torch.device("meta"): M(config)``:
      torch allocates nothing) or already materialized (its weights are
      released once bound); peft adapters may be added before or after. Or a
      diffusers pipeline (``pipe.components``) or a dict of modules, whose
      components the image holds as ``<component>.<name>`` (``arena convert``
      of the pipeline's folder): all bound to one arena, one budget.
    mode: "sample" or "train" (checkpointed training: forward, backward in reverse).
      "sample" puts the module (a pipeline's attached components) in eval mode,
      every submodule, as ``from_pretrained`` returns a model: a model built by
      its constructor is in train mode, its dropout active, and would not sample
      as the plain model (T5's dropout of 0.1). "train" leaves the modes as they
      are (``module.train()`` as usual); ``detach`` leaves them as they are.
    vram: all the device memory the process may hold, as the driver counts it:
      its CUDA context, torch's allocator (what it reserved, not only what it
      uses) and arena's own. None (the default): what the device has free,
      following other programs as they take and give back memory. A size
      ("8G") is a strict cap on a card of any size: torch's allocator is held
      to what arena's plan leaves it in each step (its per-process memory
      fraction, given back at ``detach()``), as on a card of that size. If
      torch runs out of device memory inside a step anyway (at any vram), arena
      plans the weights for what it asked, gives it the room and runs the
      forward again (a checkpointed block's recompute, in a backward), at most
      twice, with the outputs of a run that never ran out; each retry is an
      ``arena.OomRetryWarning`` and a record in ``Handle.retries()``. What it
      cannot help is ``arena.Error`` ``DEV_OOM`` saying what the step needed;
      the module goes on with the next call (docs/PYTHON.md, "A step that runs
      out of memory").
    reserve: what torch needs at its peak in a step; None (the default):
      learned. A size turns the learning off and is used as it is.
    headroom: device slack kept out of everything (None: min(512 MiB, 2%)).
    trainable: names (or a predicate on names) of parameters of your own that
      stay torch parameters; peft adapter parameters are recognized.
    offload_saved: training: the tensors autograd saves in a step's forward for
      its backward (with checkpointing: each block's inputs, 1.64 GB on Flux at
      1024x1024) wait in pinned host memory instead of device memory, copied
      out beside the forward and back ahead of the backward; bit for bit the
      same gradients. True: tensors of 1 MiB or more; a size: of at least that
      size. Lowers what torch needs. ``Handle.offload_stats()`` says what moved.
    piece_size: "auto" (the default): whole blocks when they all fit (training:
      where their floor fits a third of the device), else pieces, each module
      acquiring its own (for Flux 64 MiB sampling, 192 MiB training); a size
      ("128M"), or 0 for whole blocks always.
    fp8_compute: an image's fp8-e4m3 Linear weights (any of the three fp8-e4m3
      schemes): True binds them as FP8 weights and computes with their FP8
      bytes as they are (``torch._scaled_mm``, the input quantized per row in
      one pass by arena's kernel; no dequantized copy) on a GPU with FP8
      matmuls (compute capability 8.9 or more; elsewhere each call
      dequantizes for its product); False dequantizes them at each bind (bit
      for bit the plain model holding the dequantized weights). "auto" (the
      default): True on a GPU with FP8 matmuls, sampling and training alike
      (the backward's input gradient an FP8 product too, on the weight's bytes
      transposed by arena's kernel: on the H200 at vram="8G" 0.89 x the BF16
      model's resident step sampling and 0.93 x training; docs/QUANT.md
      "Native FP8"), False elsewhere. A host slower than its device's forward
      (some H100s measured) makes a native training step the host's. The FP8
      product is not bit-identical to the dequantized one.
    share_host: one host copy of the streamed blocks for every process of the host
      (data-parallel training: torchrun, accelerate, one process per GPU): the
      first process of the host loads them into memory the host's processes
      share, the others map those pages instead of reading the image again (each
      keeps its own plan, engine and device blocks). None (the default): on when
      torch.distributed is initialized and ``group`` has more than one process on
      this host, else off. Processes share when they open the same image with the
      same caps and options (the same host layout); others hold a copy each.
    group: the torch.distributed process group whose processes attach together
      (None: the default group). Under torch.distributed ``attach`` is then a
      collective of the group: every process of it calls it; one process per
      host opens first (found with the group's ``all_gather_object``), the others
      after the group's ``barrier``. On NCCL, set each process's CUDA device first
      (``torch.cuda.set_device(local_rank)``), as DDP needs.
    share_card: other programs on the card, with ``vram=None``: arena's plan leaves
      this much of the device free at every step end, and gives memory back at the
      next step end when another program has taken it (``h.decisions()`` says
      ``"yield"``). True: the lesser of a tenth of the device and 2 GiB; a size
      ("4G"); a float above 0 and below 1: that fraction of the device. None (the
      default): none. Costs the streamed bytes of what it keeps off the device,
      each step (docs/TUNING.md). With ``vram``: ``arena.Error`` USAGE.
    Other keywords go to :func:`arena.open` (``host_budget``: all the host
      memory the weights take, streamed blocks' copies and the staging the
      rest are read through from the image when streamed;
      ``plain_stream``: an hb4 image's streamed blocks are copied coded and
      decoded by the device unless True; ``sim_capacity``, ``profile``...).

    Raises :class:`arena.Error`: ``BUDGET`` when the model cannot run in
    ``vram`` at all (the message says the least that works), ``USAGE`` listing
    every mismatch between module and image.
    """
    min_saved = None
    if offload_saved is not False and offload_saved is not None:
        min_saved = 1 << 20 if offload_saved is True else parse_size(offload_saved, "offload_saved")
    if fp8_compute not in (True, False, "auto"):
        raise ValueError(f"fp8_compute: {fp8_compute!r}: True, False or 'auto'")
    h = Handle()
    h.module = module
    h._fp8_compute = fp8_compute
    if isinstance(path, Arena):
        if share_host or group is not None:
            raise Error("USAGE", "attach: share_host and group apply when attach opens the image; an arena opened "
                                 "already was opened with its own share_host (arena.open(..., share_host=True))")
        if share_card is not None and share_card is not False:
            raise Error("USAGE", "attach: share_card applies when attach opens the image; an arena opened already "
                                 "was opened with its own (arena.open(..., share_card=True))")
        h.arena = path
    else:
        learn = open_kwargs.pop("learn_rest", reserve is None and _on_cuda(device))

        def opener(share: bool) -> Arena:
            return _open(path, mode=mode, vram=vram, device=device, reserve=reserve, headroom=headroom, depth=depth,
                         keep_last=keep_last, piece_size=piece_size, learn_rest=learn, share_host=share,
                         share_card=share_card, **open_kwargs)

        h.arena = open_shared(opener, share_host, group)
        h._owns_arena = True
    try:
        _bind(h, module, mode, trainable, min_saved)
        if fp8_compute is not False and str(h.arena.device).startswith("cuda"):
            from . import _fp8

            h._restore.append(_fp8.use_arena(h.arena))  # the native products' row quantization
    except BaseException:
        for undo in reversed(h._restore):
            undo()
        h._restore.clear()
        if h._owns_arena:
            h.arena.close()
        raise
    if mode == "sample":  # as from_pretrained returns a model: no dropout while sampling
        for _, m in h._roots:
            m.eval()
    h._attached = True
    return h


def __dir__() -> List[str]:
    """The public API (``dir(arena.torch)``): ``__all__``, not what the module imports."""
    return sorted(__all__)
