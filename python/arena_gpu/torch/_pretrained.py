"""``from_pretrained``: a diffusers pipeline, a diffusers model or a transformers
model from its folder (or a Hugging Face id in the local cache), converted once
into arena's cache, built on the meta device in the image's dtypes, attached.

What the steps are and why:

- the source: a local folder or file, a Hugging Face cache snapshot (a repo's
  cache folder resolves to its ``refs/main``), or a hub id looked up in
  huggingface_hub's local cache only (``local_files_only=True``): nothing is
  downloaded; a missing id is an ``arena.Error`` giving the download command;
- the image: the weights the library's ``arena_convert`` reads (a pipeline's
  folder: every component into one image, its tensors named
  ``<component>.<name>``; a model's folder: its index or its one weights file),
  made once into the cache (``arena_gpu._cache``: keyed by those files'
  identity and the options; written whole or not at all, verified once), the
  first call saying so in one line and a progress bar; an image found corrupt
  when it is opened is made again, once;
- the modules: each built from its config on the meta device (no weight is
  ever allocated in host memory) in the dtypes the image holds, tensor by
  tensor (``arena.inspect`` of the image), then attached (``attach``, which
  puts them in eval mode for sampling and computes the buffers a model
  computes); what is not weights (tokenizers, the scheduler, feature
  extractors) is loaded by the pipeline class's own ``from_pretrained`` with
  the built modules passed in;
- the handle: kept by the object returned (``arena.torch.handle(obj)``).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .. import _cache
from .._errors import Error
from .._files import Progress, convert, inspect
from ._attach import _image_name
from ._handle import Handle, _fmt_size

PathLike = Union[str, "os.PathLike[str]"]

# The weights' file names diffusers and transformers save without a variant
# (formats/checkpoint.c takes these over variants in a pipeline's folder).
_PLAIN = ("model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json",
          "model.safetensors", "diffusion_pytorch_model.safetensors")
# A Hugging Face repository id: "name" or "owner/name" (letters, digits, "-", "_", ".").
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


# --- the source ----------------------------------------------------------------------------

def _hub_snapshot(repo: str, subfolder: Optional[str]) -> Path:
    """The folder of ``repo``'s snapshot in huggingface_hub's local cache; nothing is
    downloaded. Not there: an error with the command that downloads it."""
    try:
        import huggingface_hub
    except ImportError:
        raise Error("NOT_FOUND", f"{repo}: no such file or folder; read as a Hugging Face id it needs "
                                 f"huggingface_hub (pip install huggingface_hub), or give the model's local folder")
    try:
        return Path(huggingface_hub.snapshot_download(repo, local_files_only=True))
    except Exception as e:  # LocalEntryNotFoundError, an OSError; a malformed id: a ValueError
        where = getattr(getattr(huggingface_hub, "constants", None), "HF_HUB_CACHE", "the Hugging Face cache")
        only = f' --include "{subfolder}/*" "*.json"' if subfolder else ""
        raise Error("NOT_FOUND", f"{repo}: not a local file or folder, and not in the Hugging Face cache ({where}): "
                                 f"arena reads local files only; download it first: hf download {repo}{only} "
                                 f"(or huggingface-cli download {repo}{only}), or give its folder "
                                 f"({type(e).__name__})") from None


def _resolve(source: PathLike, subfolder: Optional[str]) -> Path:
    """The local file or folder ``source`` names (a repo's Hugging Face cache folder:
    its snapshot of refs/main; a hub id: its snapshot in the local cache)."""
    s = os.fspath(source)
    p = Path(s).expanduser()
    if p.exists():
        if p.is_dir() and (p / "snapshots").is_dir() and (p / "refs" / "main").is_file():
            snap = p / "snapshots" / (p / "refs" / "main").read_text().strip()
            if not snap.is_dir():
                raise Error("NOT_FOUND", f"{p}: refs/main names snapshot {snap.name}, which is not there: give "
                                         f"the snapshot's folder (snapshots/<revision>) or download it again")
            return snap
        return p
    if _HUB_ID.fullmatch(s) and not s.startswith((".", "~")):
        return _hub_snapshot(s, subfolder)
    raise Error("NOT_FOUND", f"{s}: no such file or folder")


def _index_files(index: Path) -> List[Path]:
    """A sharded checkpoint's index and the shards its weight_map names."""
    try:
        wm = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(wm.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [index]  # (arena convert says what is wrong with it)
    return [index] + [index.parent / n for n in shards]


def _weights_in(folder: Path) -> Tuple[Path, List[Path]]:
    """What ``arena convert`` reads of a model's folder: the path to give it (the
    index, or the one weights file; among variants, the file saved without one)
    and every file the image is made of."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise Error("NOT_FOUND", f"{folder}: cannot list the folder: {e.strerror}") from None
    idx = [n for n in names if n.endswith(".safetensors.index.json")]
    st = [n for n in names if n.endswith(".safetensors")]
    for group in (idx, st):
        plain = [n for n in _PLAIN if n in group]
        pick = plain[0] if plain else group[0] if len(group) == 1 else None
        if pick is not None:
            p = folder / pick
            return p, _index_files(p) if pick.endswith(".json") else [p]
        if group:
            raise Error("USAGE", f"{folder}: {len(group)} weight files and none named as diffusers or transformers "
                                 f"save one ({', '.join(group[:4])}): give the one to load as the source")
    pickled = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
    if pickled:
        raise Error("NO_CHECKPOINT", f"{folder}: only pickled weights ({pickled[0]}): arena reads safetensors; "
                                     f"save the model with save_pretrained(..., safe_serialization=True)")
    raise Error("NO_CHECKPOINT", f"{folder}: no .safetensors weights in this folder")


def _pipeline_index(root: Path) -> Dict[str, Any]:
    try:
        mi = json.loads((root / "model_index.json").read_text())
    except (OSError, ValueError) as e:
        raise Error("IDX_JSON", f"{root / 'model_index.json'}: cannot be read as JSON: {e}") from None
    if not isinstance(mi, dict):
        raise Error("IDX_BAD", f"{root / 'model_index.json'}: not a JSON object")
    return mi


def _components(mi: Dict[str, Any]) -> Dict[str, Tuple[str, str]]:
    """model_index.json's components: name -> (library, class name)."""
    return {k: (v[0], v[1]) for k, v in mi.items()
            if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)}


def _pipeline_weights(root: Path, comps: Dict[str, Tuple[str, str]]) -> List[Path]:
    """The files a pipeline's image is made of: model_index.json and each component
    folder's weights (as arena convert picks them)."""
    files = [root / "model_index.json"]
    for name in sorted(comps):
        d = root / name
        if d.is_dir() and any(n.endswith((".safetensors", ".safetensors.index.json")) for n in os.listdir(d)):
            files += _weights_in(d)[1]
    return files


# --- the classes ---------------------------------------------------------------------------

def _in_mro(cls: type, name: str, library: str) -> bool:
    return any(c.__name__ == name and c.__module__.split(".")[0] == library for c in getattr(cls, "__mro__", ()))


def _is_pipeline(cls: Any) -> bool:
    return isinstance(cls, type) and _in_mro(cls, "DiffusionPipeline", "diffusers")


def _kind(cls: Any) -> str:
    """"diffusers" (a ModelMixin, or diffusers' AutoModel), "transformers" (a
    PreTrainedModel), "transformers-auto" (an AutoModel... class); else USAGE."""
    if isinstance(cls, type):
        if _in_mro(cls, "ModelMixin", "diffusers") or (cls.__name__ == "AutoModel"
                                                        and cls.__module__.split(".")[0] == "diffusers"):
            return "diffusers"
        if _in_mro(cls, "PreTrainedModel", "transformers"):
            return "transformers"
        if _in_mro(cls, "_BaseAutoModelClass", "transformers"):
            return "transformers-auto"
    name = getattr(cls, "__name__", type(cls).__name__)
    raise Error("USAGE", f"from_pretrained: {name} is not a diffusers pipeline class, a diffusers model class or "
                         f"a transformers model class (or Auto class): build another module on the meta device and "
                         f"use arena.torch.attach, or offload() it once loaded")


def _component_class(library: str, name: str) -> Any:
    """A pipeline component's class as model_index.json names it (a library, or a
    diffusers pipeline's module: ["stable_diffusion", "StableDiffusionSafetyChecker"])."""
    for mod in (library, f"diffusers.pipelines.{library}"):
        try:
            return getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError):
            continue
    return None


# --- building on meta ----------------------------------------------------------------------

def _image_dtypes(image: Path) -> Dict[str, torch.dtype]:
    """Each tensor's dtype in the image (a quantized tensor's original one)."""
    out: Dict[str, torch.dtype] = {}
    for t in inspect(image)["tensors"]:
        dt = _DTYPES.get(t["dtype"])
        if dt is not None:
            out[t["name"]] = dt
    return out


def _major(dtypes: Mapping[str, torch.dtype], prefix: str) -> Optional[torch.dtype]:
    """The floating dtype most of a component's tensors have in the image."""
    count: Dict[torch.dtype, int] = {}
    for n, dt in dtypes.items():
        if n.startswith(prefix):
            count[dt] = count.get(dt, 0) + 1
    return max(count, key=lambda d: count[d]) if count else None


def _set_dtypes(module: nn.Module, prefix: str, dtypes: Mapping[str, torch.dtype]) -> None:
    """Each floating parameter and persistent buffer in the dtype the image holds it
    in (a model that keeps some modules in float32 beside bfloat16 ones has them so
    in its checkpoint): tied names share the one tensor made."""
    groups: Dict[int, Tuple[torch.Tensor, bool, List[str]]] = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), (p, False, []))[2].append(n)
    for n, b in module.named_buffers(remove_duplicate=False):
        groups.setdefault(id(b), (b, True, []))[2].append(n)
    for t, is_buf, names in groups.values():
        want = next((dtypes[prefix + _image_name(n)] for n in names if prefix + _image_name(n) in dtypes), None)
        if want is None or t.dtype == want or not t.is_floating_point():
            continue
        new: torch.Tensor = torch.empty(t.shape, dtype=want, device="meta") if t.is_meta else t.detach().to(want)
        if not is_buf:
            new = nn.Parameter(new, requires_grad=t.requires_grad)
        for n in names:
            owner_name, _, leaf = n.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            table: Dict[str, Any] = owner._buffers if is_buf else owner._parameters
            table[leaf] = new


def _build(cls: Any, kind: str, config_dir: Path, dtypes: Mapping[str, torch.dtype], prefix: str) -> nn.Module:
    """``cls`` built from the config in ``config_dir`` on the meta device, in the
    image's dtypes (its major one as the library's from_pretrained would build it
    with that ``torch_dtype``, then tensor by tensor)."""
    major = _major(dtypes, prefix)
    try:
        if kind == "diffusers":
            if cls.__name__ == "AutoModel":  # diffusers' AutoModel: the class the config names
                import diffusers

                name = cls.load_config(str(config_dir)).get("_class_name")
                real = getattr(diffusers, str(name), None)
                if real is None:
                    raise Error("USAGE", f"{config_dir}: its config names class {name!r}, which diffusers has not")
                cls = real
            config = cls.load_config(str(config_dir))
            with torch.device("meta"):
                m = cls.from_config(config)
            if major is not None:
                m = m.to(major)
        else:
            import transformers

            cfg_cls = getattr(cls, "config_class", None) if kind == "transformers" else None
            cfg = (cfg_cls or transformers.AutoConfig).from_pretrained(str(config_dir))
            # (transformers 5 names it dtype, 4 torch_dtype)
            dt_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
            kw: Dict[str, Any] = {dt_kw: major} if major is not None else {}
            with torch.device("meta"):
                m = cls._from_config(cfg, **kw) if kind == "transformers" else cls.from_config(cfg, **kw)
    except Error:
        raise
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise Error("USAGE", f"from_pretrained: cannot build {getattr(cls, '__name__', cls)} from the config in "
                             f"{config_dir}: {type(e).__name__}: {e}") from None
    if not isinstance(m, nn.Module):
        raise Error("USAGE", f"from_pretrained: {getattr(cls, '__name__', cls)} built a {type(m).__name__}, "
                             f"not an nn.Module")
    _set_dtypes(m, prefix, dtypes)
    return m


def _check_dtype(torch_dtype: Any, dtypes: Mapping[str, torch.dtype], what: str) -> None:
    """``torch_dtype`` given: the image must hold the weights in it (arena stores them
    as the checkpoint has them; it converts no dtype)."""
    if torch_dtype is None or torch_dtype == "auto":
        return
    if not isinstance(torch_dtype, torch.dtype):
        raise Error("USAGE", f"from_pretrained: torch_dtype={torch_dtype!r}: a torch.dtype, \"auto\" or None")
    major = _major(dtypes, "")
    if major is not None and major != torch_dtype:
        raise Error("USAGE", f"from_pretrained: {what} holds its weights in {str(major).replace('torch.', '')}, not "
                             f"{str(torch_dtype).replace('torch.', '')}: arena keeps the checkpoint's dtypes; leave "
                             f"torch_dtype out (or None), or save the model in {torch_dtype} first "
                             f"(.to({torch_dtype}).save_pretrained(...))")


# --- the cache, the attach, the handle kept -------------------------------------------------

def _say(line: str, progress: Progress) -> None:
    """One line on stderr, unless ``progress`` is False."""
    if progress is not False:
        print(line, file=sys.stderr, flush=True)


def _corrupt(e: Error) -> bool:
    """An error that says the image's bytes are not what was written (a truncated or
    flipped file): the cache entry is made again rather than trusted."""
    return e.code.startswith("IMG_")


def cached_attach(target: Callable[[], Any], key: str, make: Callable[[Path], Optional[bool]],
                  record: Mapping[str, Any], cache: Optional[PathLike], label: str, attach_kwargs: Dict[str, Any],
                  before: Optional[Callable[[Path], None]] = None, compile: bool = False) -> Handle:
    """The cache's entry for ``key`` (made by ``make`` when missing), ``before(image)``
    (building the modules), then ``target()`` attached to it; an image found corrupt
    when it is opened is made again, once. The handle is kept by ``target``. With
    ``compile``, its blocks are compiled, torch's artifacts kept in the entry
    (``_compiled``)."""
    from . import attach

    e = _cache.entry(key, make, record=record, cache=cache, label=label)
    for again in (False, True):
        try:
            if before is not None:
                before(e.image)
            h = attach(target(), str(e.image), **attach_kwargs)
            break
        except BaseException as err:
            if again or e.made or not isinstance(err, Error) or not _corrupt(err):
                e.release()  # (no longer in use: arena cache prune may remove it)
                raise
            print(f"arena: {e.image}: {err.message}; making it again", file=sys.stderr, flush=True)
            _cache.invalidate(e)
            e = _cache.entry(key, make, record=record, cache=cache, label=label)
    h.cache_entry = e
    _keep(h)
    if compile:
        from . import _compiled

        try:
            _compiled.load(e.dir)
            _compiled.compile_blocks(h)
            _compiled.save_after_forwards(h, e.dir)
        except BaseException:
            h.detach()
            raise
    return h


def _keep(h: Handle) -> None:
    """The object attached keeps its handle (``handle(obj)``): a pipeline or a module
    returned by from_pretrained or offload stays bound while it is referenced, and
    detach() drops the reference."""
    obj = h.module
    obj.__dict__["_arena_owner"] = h
    h._restore.insert(0, lambda: obj.__dict__.pop("_arena_owner", None))
    e = h.cache_entry
    if e is not None:  # in use while attached: arena cache prune leaves it
        h._restore.insert(0, e.release)


def handle(obj: Any) -> Handle:
    """The :class:`Handle` that binds ``obj`` (a module or pipeline returned by
    :func:`from_pretrained` or :func:`offload`, a module given to :func:`attach`, or
    a component of an attached pipeline): its ``stats()``, ``plan()``, ``trace()``,
    ``sampling()``, ``detach()`` and ``cache_entry`` (the cache's entry the weights
    were read from: ``image``, ``made``, ``size``; None after attach). Raises
    ``arena.Error`` USAGE when nothing binds it."""
    d = getattr(obj, "__dict__", {})
    h = d.get("_arena_owner")
    if isinstance(h, Handle) and h._attached:
        return h
    ref = d.get("_arena_handle")
    h = ref() if ref is not None else None
    if isinstance(h, Handle) and h._attached:
        return h
    comps = getattr(obj, "components", None)
    if isinstance(comps, dict):
        for m in comps.values():
            ref = getattr(m, "__dict__", {}).get("_arena_handle")
            h = ref() if ref is not None else None
            if isinstance(h, Handle) and h._attached:
                return h
    raise Error("USAGE", f"arena.torch.handle: this {type(obj).__name__} is not attached to an arena "
                         f"(from_pretrained, offload or attach binds one)")


# --- from_pretrained -----------------------------------------------------------------------

def from_pretrained(cls: Any, source: PathLike, *, subfolder: Optional[str] = None, vram: Any = None,
                    mode: str = "sample", quant: Optional[str] = None, codec: Optional[str] = None,
                    torch_dtype: Any = None, cache: Optional[PathLike] = None, progress: Progress = None,
                    compile: bool = False, dtype: Any = None, **attach_kwargs: Any) -> Any:
    """A diffusers pipeline or model, or a transformers model, ready to run with its
    weights in arena memory: ``cls.from_pretrained(source)`` in one call, on any card.

    ::

        pipe = arena.torch.from_pretrained(FluxPipeline, "black-forest-labs/FLUX.1-dev", vram="12G")
        image = pipe("a cat").images[0]
        arena.torch.handle(pipe).stats()          # the engine's record of each step

    cls: a diffusers pipeline class (``FluxPipeline``, ``StableDiffusion3Pipeline``,
      or ``DiffusionPipeline``: the class model_index.json names), a diffusers model
      class (``FluxTransformer2DModel``, ``AutoModel``), or a transformers model class
      or Auto class (``T5EncoderModel``, ``AutoModelForCausalLM``).
    source: a local folder (a pipeline's, with model_index.json; a model's, with
      config.json and its safetensors weights, sharded or not), one ``.safetensors``
      file with config.json beside it, a Hugging Face cache snapshot (or a repo's
      cache folder, ``models--org--name``: its ``refs/main``), or a Hugging Face id,
      looked up in huggingface_hub's local cache only: nothing is downloaded, and an
      id not there is an ``arena.Error`` (NOT_FOUND) giving the ``hf download``
      command. Weights must be safetensors (pickled ``.bin`` files are refused).
    subfolder: with a model class, the component of a pipeline's folder to load
      (``subfolder="transformer"``).
    vram: all the device memory the process may hold, as :func:`attach` takes it
      (None: what the device has free).
    mode: "sample" (the modules in eval mode, as ``from_pretrained`` returns them)
      or "train" (modes left as built: train mode; see :func:`attach`).
    quant, codec: how the image stores the weights (:func:`arena.convert`:
      ``quant="fp8-e4m3-row"``, ``codec="hb4"``...); each choice is an entry of
      its own in the cache.
    torch_dtype (or ``dtype``): None (the default) builds each tensor in the dtype
      the checkpoint holds it in, as ``from_pretrained(torch_dtype=...)`` of that
      dtype would; arena converts no dtype, so another than the checkpoint's is
      refused (USAGE) saying so.
    cache: the cache's folder (default ``$ARENA_CACHE``, else ``$XDG_CACHE_HOME/arena``
      or ``~/.cache/arena``).
    compile: True compiles every block with ``torch.compile`` (regionally: a whole
      block with ``fullgraph=True``, a block in pieces or whose layers checkpoint
      their own forward with a graph break at each bound module), and keeps
      torch's compiled artifacts (``torch.compiler.save_cache_artifacts()``,
      written after a forward that compiled something) in the cache's entry
      beside the image; a later call, in any process, loads them
      (``load_cache_artifacts``) before its first forward, and torch finds
      what it compiled before in its caches.
    progress: the first call's conversion: None (a line on stderr, "arena:
      converting SOURCE into the cache (SIZE)", then a tqdm bar where stderr is a
      terminal and tqdm is installed), True (the bar always), False (nothing), or
      ``f(done, total)`` in bytes; an exception it raises (as Ctrl-C does)
      cancels the conversion and leaves no entry in the cache.
    Other keywords go to :func:`attach` (``device``, ``piece_size``,
    ``host_budget``, ``share_host``...).

    The first call converts the weights into the cache, once: an entry is named
    by the source files' identity and the options, written whole or not at all,
    verified once; later calls (another process too) open it at once, and a
    changed source file makes a new one. An entry found corrupt when opened is
    made again, once. Then every model is built on the meta device from its
    config (no weight is allocated in host memory: the host holds what arena
    streams from it), in the image's dtypes, attached, and in eval mode for
    sampling; what is not weights (tokenizers, scheduler, configs, feature
    extractors) is loaded by ``cls.from_pretrained`` as usual, the models passed
    in built. Returns the pipeline or model; it keeps its :class:`Handle`
    (``arena.torch.handle(obj)``: stats, plan, trace, ``sampling()``,
    ``detach()``, ``cache_entry``) as long as it lives.

    Raises :class:`arena.Error`: NOT_FOUND (no such source, a hub id not in the
    local cache), NO_CHECKPOINT (no safetensors weights), USAGE (a class it cannot
    build, a pipeline's folder given to a model class without ``subfolder``, a
    ``torch_dtype`` the checkpoint does not hold), BUDGET (the model cannot run in
    ``vram``), and the conversion's errors naming the file.
    """
    torch_dtype = torch_dtype if torch_dtype is not None else dtype
    root = _resolve(source, subfolder)
    options: Dict[str, Any] = {"quant": quant or "", "codec": codec or ""}
    if _is_pipeline(cls):
        if subfolder is not None:
            raise Error("USAGE", f"from_pretrained: subfolder={subfolder!r} with the pipeline class {cls.__name__}: "
                                 f"a pipeline is its whole folder; give a model class to load one component")
        if not (root / "model_index.json").is_file():
            raise Error("NO_CHECKPOINT", f"{root}: no model_index.json: not a diffusers pipeline's folder (give "
                                         f"{cls.__name__} the folder save_pretrained wrote, or a model class for a "
                                         f"model's folder)")
        comps = _components(_pipeline_index(root))
        files = _pipeline_weights(root, comps)
        convert_src: PathLike = root
        options["what"] = "pipeline"
    else:
        kind = _kind(cls)
        folder = root / subfolder if subfolder else root
        if folder.is_file():
            if not folder.name.endswith((".safetensors", ".safetensors.index.json")):
                raise Error("NO_CHECKPOINT", f"{folder}: not a .safetensors file nor a sharded checkpoint's index")
            config_dir = folder.parent
            convert_src, files = folder, (_index_files(folder) if folder.name.endswith(".json") else [folder])
        elif folder.is_dir():
            if (folder / "model_index.json").is_file():
                names = sorted(n for n in _components(_pipeline_index(folder)) if (folder / n).is_dir())
                raise Error("USAGE", f"{folder} is a diffusers pipeline's folder: give {cls.__name__} its "
                                     f"subfolder (one of {', '.join(names)}), or load the pipeline with its class")
            config_dir = folder
            convert_src, files = _weights_in(folder)
        else:
            raise Error("NOT_FOUND", f"{folder}: no such file or folder")
        if not (config_dir / "config.json").is_file():
            raise Error("NOT_FOUND", f"{config_dir / 'config.json'}: missing: {cls.__name__} is built from the "
                                     f"config beside its weights")
        options["what"] = "model"
    size = sum(f.stat().st_size for f in files if f.name.endswith(".safetensors"))
    key = _cache.source_key(files, options)
    record = {"sources": [str(p) for p in files], "options": {"quant": quant, "codec": codec},
              "class": cls.__name__, "source": str(source), "subfolder": subfolder}
    label = str(source) + (f" ({subfolder})" if subfolder else "")

    def make(tmp: Path) -> bool:
        _say(f"arena: converting {label} into the cache ({_fmt_size(size)})", progress)
        # read back as written: the entry is verified without a pass of its own after
        convert(convert_src, tmp, quant=quant, codec=codec, progress=progress, force=True, read_back=True)
        return True

    built: Dict[str, Any] = {}

    def build(image: Path) -> None:
        built.clear()
        dtypes = _image_dtypes(image)
        _check_dtype(torch_dtype, dtypes, label)
        if _is_pipeline(cls):
            held = {n.split(".", 1)[0] for n in dtypes}
            mods: Dict[str, nn.Module] = {}
            for name, (lib, cname) in sorted(comps.items()):
                c = _component_class(lib, cname)
                if name not in held or not isinstance(c, type) or not issubclass(c, nn.Module):
                    continue
                mods[name] = _build(c, _kind(c), root / name, dtypes, name + ".")
            try:
                built["target"] = cls.from_pretrained(str(root), **mods)
            except (OSError, ValueError, TypeError) as e:
                raise Error("USAGE", f"from_pretrained: {cls.__name__}.from_pretrained({str(root)!r}) with the "
                                     f"models built on meta: {type(e).__name__}: {e}") from None
        else:
            built["target"] = _build(cls, kind, config_dir, dtypes, "")

    h = cached_attach(lambda: built["target"], key, make, record, cache, label,
                      dict(attach_kwargs, mode=mode, vram=vram), before=build, compile=compile)
    return h.module
