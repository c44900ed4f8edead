"""``synth_image``: an arena image of any diffusers or transformers model with
random weights, made a block at a time, with no checkpoint on disk.

The model is built on the meta device (from its class and config, or given so);
its tensors (the names ``attach`` matches, tied ones once) are written through
:class:`arena.ImageWriter` in the image's block order: a block's tensors are made
in host memory, handed to the writer (which quantizes, codes, checksums and
writes them), and let go before the next block's are made. Host memory is one
block's tensors, the writer's chunk buffers and the generator's pieces.

Values: a floating tensor is normal(0, ``std``) in float32 cast to its dtype,
made in pieces of ``PIECE`` elements, each piece from a generator seeded by the
seed, the tensor's name and the piece's index (so a tensor's values depend on
nothing else: not the threads, the order, the other tensors or the config);
the weight of a norm (a module whose class name holds "Norm") is ones and its
bias zeros, as the layers start; tensors of other dtypes are zeros.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from .. import Error, ImageWriter
from .._files import _Bar

PathLike = Union[str, "os.PathLike[str]"]
Progress = Union[None, bool, Callable[[int, int], Any]]

PIECE = 1 << 20  # elements a generator makes: the unit of the values' seeds and of the threads' work

# The models the built-in names stand for: (class, config, what it is). Their
# configs are those of the published checkpoints' config.json (the keys their
# classes take).
MODELS: Dict[str, Tuple[str, Dict[str, Any], str]] = {
    "wan2.1-t2v-14b": (
        "diffusers.WanTransformer3DModel",
        dict(patch_size=[1, 2, 2], num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
             text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
             qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None,
             rope_max_seq_len=1024),
        "Wan 2.1 T2V 14B transformer: 40 blocks, dim 5120 (40 heads x 128), ffn 13824, 14.29 B parameters"),
    "qwen-image": (
        "diffusers.QwenImageTransformer2DModel",
        dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
             num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=[16, 56, 56]),
        "Qwen-Image transformer: 60 blocks, dim 3072 (24 heads x 128), text 3584, 20.43 B parameters"),
    "flux.1-dev": (
        "diffusers.FluxTransformer2DModel",
        dict(patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38,
             attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
             guidance_embeds=True, axes_dims_rope=[16, 56, 56]),
        "FLUX.1-dev transformer: 19 double + 38 single blocks, dim 3072, 11.90 B parameters"),
    "umt5-xxl": (
        "transformers.UMT5EncoderModel",
        dict(model_type="umt5", vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
             num_decoder_layers=24, num_heads=64, relative_attention_num_buckets=32,
             relative_attention_max_distance=128, dropout_rate=0.1, layer_norm_epsilon=1e-6,
             initializer_factor=1.0, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
             scalable_attention=True),
        "UMT5-XXL encoder (Wan's text encoder): 24 blocks, d_model 4096, d_ff 10240, 64 heads, vocab 256384, "
        "5.68 B parameters"),
}


# --- the model on the meta device ------------------------------------------------------------

def _class_of(spec: str) -> Any:
    """``"diffusers.WanTransformer3DModel"`` (or ``transformers.X``, or any
    ``module.Class``) imported."""
    mod, _, name = spec.rpartition(".")
    if not mod:
        raise Error("USAGE", f"synth_image: '{spec}' is neither a built-in model ({', '.join(MODELS)}) nor a class "
                             f"named with its module (diffusers.WanTransformer3DModel)")
    try:
        cls = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise Error("USAGE", f"synth_image: cannot import {spec}: {type(e).__name__}: {e}") from None
    return cls


def _read_config(config: Union[None, Mapping[str, Any], PathLike]) -> Dict[str, Any]:
    """A config as a dict: given as one, or a config.json (or a folder holding one)."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    p = Path(os.fspath(config))
    if p.is_dir():
        p = p / "config.json"
    try:
        with open(p, encoding="utf-8") as f:
            d = json.load(f)
    except OSError as e:
        raise Error("NOT_FOUND", f"synth_image: config {p}: {e.strerror}") from None
    except ValueError as e:
        raise Error("USAGE", f"synth_image: config {p} is not JSON: {e}") from None
    if not isinstance(d, dict):
        raise Error("USAGE", f"synth_image: config {p} is a JSON {type(d).__name__}, not an object")
    return d


def _build(cls: Any, config: Dict[str, Any]) -> Tuple[nn.Module, str]:
    """``cls`` built from ``config`` on the meta device, as it is built before its
    weights are loaded; and its library ("diffusers" or "transformers")."""
    from ._pretrained import _kind

    kind = _kind(cls)
    try:
        if kind == "diffusers":
            with torch.device("meta"):
                m = cls.from_config({k: v for k, v in config.items() if not k.startswith("_")})
        else:
            import transformers

            kw = {k: v for k, v in config.items() if k not in ("_name_or_path", "architectures", "transformers_version")}
            if kind == "transformers":
                cfg = cls.config_class(**{k: v for k, v in kw.items() if k != "model_type"})
            else:
                cfg = transformers.AutoConfig.for_model(**kw)
            with torch.device("meta"):
                m = cls._from_config(cfg) if kind == "transformers" else cls.from_config(cfg)
    except Error:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, OSError) as e:
        raise Error("USAGE", f"synth_image: cannot build {cls.__name__} from its config: {type(e).__name__}: "
                             f"{e}") from None
    if not isinstance(m, nn.Module):
        raise Error("USAGE", f"synth_image: {cls.__name__} built a {type(m).__name__}, not an nn.Module")
    return m, kind.partition("-")[0]


def _config_of(m: nn.Module) -> Dict[str, Any]:
    """A built model's config as plain JSON values, for the image's metadata."""
    cfg: Any = getattr(m, "config", None)
    if cfg is None:
        return {}
    d = {k: v for k, v in (cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)).items() if not k.startswith("_")}
    out: Dict[str, Any] = json.loads(json.dumps(d, default=str))
    return out


def _fp32_names(m: nn.Module, kind: str, dtype: torch.dtype) -> Tuple[str, ...]:
    """The module names the library's ``from_pretrained(torch_dtype=dtype)`` keeps in
    float32: diffusers' ``_keep_in_fp32_modules`` at any dtype; transformers'
    ``_keep_in_fp32_modules`` at float16 and ``_keep_in_fp32_modules_strict`` at
    float16 and bfloat16."""
    names: List[str] = []
    if kind == "diffusers":
        names += list(getattr(m, "_keep_in_fp32_modules", None) or [])
    else:
        if dtype == torch.float16:
            names += list(getattr(m, "_keep_in_fp32_modules", None) or [])
        if dtype in (torch.float16, torch.bfloat16):
            names += list(getattr(m, "_keep_in_fp32_modules_strict", None) or [])
    return tuple(names)


def _is_norm(m: nn.Module, name: str) -> Optional[str]:
    """"weight" or "bias" when ``name`` is a norm's own (its module's class name holds
    "Norm"), else None."""
    owner_name, _, leaf = name.rpartition(".")
    try:
        owner = m.get_submodule(owner_name) if owner_name else m
    except AttributeError:  # (a name the image stores differently from the module's)
        return None
    if "Norm" in type(owner).__name__ and leaf in ("weight", "bias"):
        return leaf
    return None


# --- the values --------------------------------------------------------------------------------

def _seed(seed: int, name: str, piece: int) -> int:
    h = hashlib.blake2b(f"{seed}\0{name}\0{piece}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1


class _Maker:
    """Fills tensors with their values, a piece per task, on ``threads`` threads."""

    def __init__(self, seed: int, std: float, threads: int):
        self.seed, self.std = seed, std
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="arena-synth")
        self.local = threading.local()

    def _piece(self, dst: torch.Tensor, name: str, k: int) -> None:
        a = k * PIECE
        part = dst[a:a + PIECE]
        n = part.numel()
        g = torch.Generator().manual_seed(_seed(self.seed, name, k))
        if part.dtype == torch.float32:
            torch.randn(n, generator=g, out=part)
            part.mul_(self.std)
            return
        buf = getattr(self.local, "buf", None)
        if buf is None:
            buf = self.local.buf = torch.empty(PIECE, dtype=torch.float32)
        torch.randn(n, generator=g, out=buf[:n])
        buf[:n].mul_(self.std)
        part.copy_(buf[:n])

    def fill(self, t: torch.Tensor, name: str, norm: Optional[str]) -> List["concurrent.futures.Future[None]"]:
        flat = t.view(-1)
        if not t.is_floating_point() or norm == "bias":
            flat.zero_()
            return []
        if norm == "weight":
            flat.fill_(1)
            return []
        return [self.pool.submit(self._piece, flat, name, k) for k in range((flat.numel() + PIECE - 1) // PIECE)]

    def close(self) -> None:
        self.pool.shutdown(wait=True)


# --- the image -----------------------------------------------------------------------------------

def _dtype_name(dt: torch.dtype) -> str:
    from ._quant import _ARENA_DTYPES

    name = _ARENA_DTYPES.get(dt)
    if name is None:
        raise Error("USAGE", f"synth_image: a tensor of {dt}, which an image cannot hold")
    return name


def synth_image(model: Any, path: PathLike, *, config: Union[None, Mapping[str, Any], PathLike] = None,
                seed: int = 0, std: float = 0.02, dtype: torch.dtype = torch.bfloat16, quant: Optional[str] = None,
                quant_include: Iterable[str] = (), quant_exclude: Iterable[str] = (), codec: Optional[str] = None,
                threads: Optional[int] = None, force: bool = False, progress: Progress = None) -> nn.Module:
    """Write an arena image at ``path`` of ``model`` with random weights, a block at a
    time (no checkpoint on disk; host memory about one block), and return the model
    built on the meta device in the image's dtypes, ready for :func:`attach`.

    model: a diffusers or transformers model class (``diffusers.WanTransformer3DModel``),
      the same as a string (``"diffusers.WanTransformer3DModel"``), a built-in name
      (``MODELS``: ``"wan2.1-t2v-14b"``, ``"qwen-image"``, ``"flux.1-dev"``,
      ``"umt5-xxl"``, each with its published config), or a module already built
      (on the meta device: its names, shapes and config are what is used; it is
      returned with its tensors in the image's dtypes).
    config: the class's config: a dict, a config.json or a folder holding one; over a
      built-in name's, key by key. None: the class's defaults (a built-in's own).
    seed, std: the values (the module's docstring: normal(0, std) per piece of
      ``PIECE`` elements, seeded by seed, name and piece; norm weights 1, norm biases
      0; non-floating tensors 0). The same arguments give the same bytes, whatever
      ``threads``.
    dtype: of the floating tensors, but those the library's ``from_pretrained(
      torch_dtype=dtype)`` keeps in float32 (``_keep_in_fp32_modules``).
    quant, quant_include, quant_exclude, codec: as :func:`arena.convert`
      (``"fp8-e4m3-row"``: the image ``arena convert --quant fp8-e4m3-row`` makes of
      the same values; ``quant_exclude=["text_encoder.*"]``: a pipeline's text
      encoder left in ``dtype``).
    threads: for the values and the writer (default: one per CPU).
    force: replace a file at ``path`` (else OUTPUT_EXISTS, before any work).
    progress: None (a tqdm bar when installed and stderr is a terminal), True, False,
      or ``f(done, total)`` in bytes of the tensors, after each block; an exception it
      raises stops the write (nothing is left at ``path``).

    The image's metadata ``arena.synth`` says what made it (class, config, seed, std,
    dtype). Raises :class:`arena.Error` (USAGE for a class or config that cannot be
    built, OUTPUT_EXISTS, IO for a disk without room, before a byte is written).
    """
    from ._pretrained import _set_dtypes
    from ._quant import _tensors_of, is_subclass

    if isinstance(dtype, bool) or not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise Error("USAGE", f"synth_image: dtype={dtype!r}: a floating torch.dtype (torch.bfloat16)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise Error("USAGE", f"synth_image: seed={seed!r}: a whole number, 0 or more")
    if not isinstance(std, (int, float)) or isinstance(std, bool) or not std >= 0 or std == float("inf"):
        raise Error("USAGE", f"synth_image: std={std!r}: a finite number, 0 or more")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise Error("USAGE", f"synth_image: threads={threads!r}: a whole number, 1 or more")
    if not force and os.path.lexists(os.fspath(path)):  # said before the model is built
        raise Error("OUTPUT_EXISTS", f"{os.fspath(path)}: exists; force=True replaces it")
    nthreads = threads or os.cpu_count() or 1

    if isinstance(model, nn.Module):
        m, kind = model, "transformers" if type(model).__module__.startswith("transformers") else "diffusers"
        what = f"{type(model).__module__.split('.')[0]}.{type(model).__name__}"
    else:
        base: Dict[str, Any] = {}
        if isinstance(model, str) and model in MODELS:
            spec, base, _ = MODELS[model]
            model = _class_of(spec)
        elif isinstance(model, str):
            model = _class_of(model)
        what = f"{model.__module__.split('.')[0]}.{model.__name__}"
        m, kind = _build(model, {**base, **_read_config(config)})

    names = _tensors_of(m)
    fp32 = _fp32_names(m, kind, dtype)
    spec_of: Dict[str, Tuple[torch.dtype, Tuple[int, ...]]] = {}
    for name, t in names.items():
        if is_subclass(t):
            raise Error("USAGE", f"synth_image: '{name}' is a {type(t).__name__} (a tensor subclass): build the model "
                                 f"unquantized (quantize=... makes the image quantized)")
        want = t.dtype
        if t.is_floating_point():
            want = torch.float32 if any(c in name.split(".") for c in fp32) else dtype
        spec_of[name] = (want, tuple(t.shape))
    meta = {"arena.synth": json.dumps({"class": what, "config": _config_of(m), "seed": seed, "std": std,
                                       "dtype": str(dtype).replace("torch.", ""), "piece": PIECE,
                                       "values": "normal(0, std); norm weights 1, norm biases 0; others 0"})}
    w = ImageWriter(path, {n: (_dtype_name(dt), shape) for n, (dt, shape) in spec_of.items()}, label=f"synth:{what}",
                    metadata=meta, quant=quant, quant_include=quant_include, quant_exclude=quant_exclude, codec=codec,
                    threads=nthreads, force=force)
    bar = _Bar(progress, "synth")
    maker = _Maker(seed, float(std), nthreads)
    try:
        done = 0
        for _block, block_names in w.blocks:
            held: List[torch.Tensor] = []
            pending: List["concurrent.futures.Future[None]"] = []
            for name in block_names:
                dt, shape = spec_of[name]
                t = torch.empty(shape, dtype=dt)
                pending += maker.fill(t, name, _is_norm(m, name))
                held.append(t)
            for f in pending:
                f.result()
            for name, t in zip(block_names, held):
                w.put(name, t.data_ptr(), w.nbytes(name))
                done += w.nbytes(name)
            del held
            if bar.fn is not None:
                bar.fn(done, w.total_bytes)
        w.finish()
    finally:
        maker.close()
        w.abort()
        bar.close()
    _set_dtypes(m, "", {n: dt for n, (dt, _) in spec_of.items()})
    return m


def parameters(model: nn.Module) -> int:
    """The parameters of ``model``, tied ones once."""
    return sum(p.numel() for p in model.parameters())


def describe(name: str) -> str:
    """A built-in model's line for ``--list``."""
    spec, _, text = MODELS[name]
    return f"{name:16s}{spec}: {text}"


# --- the command: python -m arena_gpu synth-image ------------------------------------------------

_HELP = """\
Write an arena image of a diffusers or transformers model with random weights,
a block at a time: no checkpoint on disk, no GPU, host memory about one block.

MODEL is a built-in name (--list) or a class with its module
(diffusers.WanTransformer3DModel, transformers.UMT5EncoderModel); --config
gives its config (a config.json, or a folder holding one) over a built-in's
own, --set KEY=VALUE one key (VALUE as JSON, else a string): --set
num_layers=4 writes a model of 4 blocks, real-shaped.

Values: normal(0, --std) in float32 cast to --dtype, norm weights 1 and norm
biases 0; a tensor's values depend on --seed and its name only (pieces of
1 Mi elements, each seeded by seed, name and index): the same arguments give
the same bytes, whatever --threads. Tensors the library keeps in float32 when
loading in --dtype (diffusers' _keep_in_fp32_modules) are float32.
--quant fp8-e4m3-row stores the blocks' Linear weights as arena convert
--quant does (the same bytes); the image is what arena convert makes of a
safetensors file of the same values.

Disk: the image, no more (bf16: 2 bytes a parameter, fp8-e4m3-row about 1,
e.g. Wan 2.1 14B 26.6 GiB in bf16, 13.4 GiB in fp8); its room is reserved
before anything is written, and a failure, Ctrl-C or a kill leaves nothing.
Memory: the largest block's tensors (Wan 14B: 0.66 GiB; UMT5-XXL's
embedding, in globals: 1.96 GiB), 16 MiB a thread, the writer's chunks, and
torch, diffusers and the model built on the meta device (about 0.6 GiB).
Time: making the values takes most of it, about 10 ns a parameter on one
core, the writer's work on the same threads: Wan 14B takes about a minute
and a half on two cores, less with more (--threads), down to the disk's
write rate.
"""


def cli(argv: List[str]) -> int:
    """``python -m arena_gpu synth-image ...`` (``arena synth-image``): the exit status."""
    import argparse
    import resource
    import sys

    ap = argparse.ArgumentParser(prog="arena synth-image", description=_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="a built-in name (--list) or diffusers.Class / transformers.Class")
    ap.add_argument("-o", "--output", help="the image to write")
    ap.add_argument("--config", help="the class's config: a config.json or a folder holding one")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one config key (VALUE as JSON, else a string); repeatable")
    ap.add_argument("--seed", type=int, default=0, help="seed of the values (default 0)")
    ap.add_argument("--std", type=float, default=0.02, help="standard deviation of the values (default 0.02)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"), help="floating dtype (default bf16)")
    ap.add_argument("--quant", help="store the blocks' weights quantized: fp8-e4m3-row, int8-row... (docs/QUANT.md)")
    ap.add_argument("--codec", choices=("none", "hb4", "zstd"), help="chunk codec (default none)")
    ap.add_argument("--threads", type=int, help="threads for the values and the writer (default: one per CPU)")
    ap.add_argument("--force", action="store_true", help="replace the output if it exists (when the new one is whole)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    ap.add_argument("--list", action="store_true", help="the built-in models, and exit")
    a = ap.parse_args(argv)
    if a.list:
        for name in MODELS:
            print(describe(name))
        return 0
    if not a.model or not a.output:
        ap.error("MODEL and -o OUTPUT are required (--list names the built-in models)")
    config: Dict[str, Any] = _read_config(a.config) if a.config else {}
    for kv in a.set:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            ap.error(f"--set {kv}: KEY=VALUE")
        try:
            config[key] = json.loads(value)
        except ValueError:
            config[key] = value
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    t0 = time.monotonic()
    try:
        m = synth_image(a.model, a.output, config=config or None, seed=a.seed, std=a.std, dtype=dtype,
                        quant=a.quant, codec=None if a.codec in (None, "none") else a.codec, threads=a.threads,
                        force=a.force, progress=False if a.quiet else None)
    except Error as e:
        print(f"arena synth-image: {e}", file=sys.stderr)
        return 2 if e.code in ("USAGE", "OUTPUT_EXISTS", "NOT_FOUND") else 1
    except KeyboardInterrupt:
        print("arena synth-image: interrupted; nothing was written", file=sys.stderr)
        return 130
    if not a.quiet:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"{a.output}: {type(m).__name__}, {parameters(m) / 1e9:.3f} B parameters, "
              f"{os.path.getsize(a.output) / 2**30:.2f} GiB, {time.monotonic() - t0:.1f} s, peak RSS {peak:.2f} GiB")
    return 0
