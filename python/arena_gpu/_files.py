"""convert, verify and inspect: the library's arena_convert, arena_verify and
arena_inspect; ImageWriter: its arena_writer (an image from tensors in memory).

The C call runs on a thread of its own while the calling thread waits for it,
so that Ctrl-C reaches Python at once: the wait raises KeyboardInterrupt, the
next progress report from the library asks it to stop (a convert's output
does not appear), and once the call has returned the KeyboardInterrupt goes
on. A progress function of the caller's that raises cancels the call the same
way, and its exception is raised after it.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _native
from ._errors import Error
from ._units import parse_size

PathLike = Union[str, "os.PathLike[str]"]
Progress = Union[None, bool, Callable[[int, int], Any]]


def _error(rc: int) -> Error:
    return Error.from_code(rc)


class _Bar:
    """A progress display: the caller's function, or a tqdm bar (when installed)."""

    def __init__(self, progress: Progress, label: str):
        self.fn: Optional[Callable[[int, int], Any]] = None
        self.bar: Any = None
        self.label = label
        self.seen = 0
        if callable(progress):
            self.fn = progress
        elif progress is None or progress is True:
            try:
                self.tqdm: Any = importlib.import_module("tqdm").tqdm
            except ImportError:
                return
            # True: always shown; None: where stderr is a terminal (tqdm's disable=None).
            self.disable = None if progress is None else False
            self.fn = self._tqdm

    def _tqdm(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = self.tqdm(total=total, desc=self.label, unit="B", unit_scale=True, unit_divisor=1024,
                                 disable=self.disable, leave=True)
        self.bar.update(done - self.seen)
        self.seen = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _run(call: Callable[[Any], int], bar: _Bar) -> Tuple[int, Optional[Error]]:
    """Run ``call(progress_fn)`` on a thread; returns (rc, its Error or None)."""
    stop = threading.Event()
    raised: List[BaseException] = []

    def report(_ctx: Any, done: int, total: int) -> int:
        if stop.is_set():
            return 1
        if bar.fn is not None:
            try:
                bar.fn(int(done), int(total))
            except BaseException as e:  # the caller's function: cancel, and raise it after
                raised.append(e)
                stop.set()
                return 1
        return 0

    cfn = _native.PROGRESS_FN(report)
    out: Dict[str, Any] = {}

    def work() -> None:
        rc = call(cfn)
        out["rc"] = rc
        out["err"] = _error(rc) if rc else None  # the message is this thread's

    t = threading.Thread(target=work, name="arena-call", daemon=True)
    t.start()
    interrupted: Optional[BaseException] = None
    while t.is_alive():
        try:
            t.join(0.1)
        except KeyboardInterrupt as e:  # Ctrl-C: ask the library to stop, wait for it
            interrupted = interrupted or e
            stop.set()
    bar.close()
    if interrupted is not None:
        raise interrupted
    if raised:
        raise raised[0]
    return out["rc"], out["err"]


def _strings(v: Iterable[str], what: str) -> Tuple[Any, int]:
    items = [v] if isinstance(v, str) else list(v)
    for s in items:
        if not isinstance(s, str):
            raise TypeError(f"{what}: expected strings, got {type(s).__name__}")
    if not items:
        return None, 0
    arr = (ctypes.c_char_p * len(items))(*[s.encode() for s in items])
    return arr, len(items)


def convert(
    src: Union[PathLike, Sequence[PathLike]],
    out: PathLike,
    *,
    codec: Optional[str] = None,
    quant: Optional[str] = None,
    quant_include: Iterable[str] = (),
    quant_exclude: Iterable[str] = (),
    block_patterns: Iterable[str] = (),
    block_order: Iterable[str] = (),
    chunk_size: Union[int, str, None] = None,
    zstd_level: Optional[int] = None,
    threads: Optional[int] = None,
    progress: Progress = None,
    force: bool = False,
    read_back: bool = False,
) -> Dict[str, int]:
    """Convert a safetensors checkpoint into an arena image, as ``arena convert`` does.

    src: a ``.safetensors`` file, a sharded checkpoint's ``index.json``, a folder
      holding either, or a list of those (together one model).
    out: the image to write. It appears only when whole: an error, Ctrl-C or a
      kill leaves nothing there. A file there is an ``OUTPUT_EXISTS`` error (before
      any work), unless ``force=True`` (``arena convert --force``): then it is
      replaced when the new image is whole.
    codec: ``"none"`` (default), ``"hb4"`` (the GPU decodes as it loads: the fastest
      load) or ``"zstd"`` (``zstd_level`` 1..19; the CPU decodes: for slow disks).
    quant: store selected weights quantized (``"fp8-e4m3-row"``, ``"int8-row"``...,
      docs/QUANT.md); ``quant_include`` / ``quant_exclude``: globs of names.
    block_patterns, block_order: how tensors group into blocks (docs/CLI.md, "Blocks").
    chunk_size: checksum chunk, a power of two from 64K to 1G (default 4M).
    progress: None (a tqdm bar when tqdm is installed and stderr is a terminal),
      True (a tqdm bar always), False (nothing), or ``f(done, total)`` in bytes,
      called from a thread of the library's; an exception it raises cancels.
    read_back: read each chunk back from the disk after writing it and compare
      (``arena convert --read-back``): the image comes out verified, its reads beside
      the other chunks' writes rather than an :func:`verify` pass after them; bytes the
      disk did not keep are an ``IO`` error, and nothing is written at ``out``.

    Returns ``file_size``, ``data_bytes``, ``stored_bytes``, ``chunk_count``,
    ``coded_chunks``, ``n_blocks``, ``n_tensors``. Raises :class:`arena.Error`
    (``CANCELLED`` does not reach you: Ctrl-C raises KeyboardInterrupt).
    """
    srcs = [src] if isinstance(src, (str, os.PathLike)) else list(src)
    ins = (ctypes.c_char_p * max(1, len(srcs)))(*[os.fsencode(os.fspath(s)) for s in srcs])
    o, keep = _options(codec=codec, quant=quant, quant_include=quant_include, quant_exclude=quant_exclude,
                       block_patterns=block_patterns, block_order=block_order, chunk_size=chunk_size,
                       zstd_level=zstd_level, threads=threads, force=force, read_back=read_back)
    info = _native.ConvertInfo()
    dst = os.fsencode(os.fspath(out))

    def call(cfn: Any) -> int:
        o.progress = cfn
        return int(_native.lib.arena_convert(ins, len(srcs), dst, ctypes.byref(o), ctypes.byref(info)))

    rc, err = _run(call, _Bar(progress, "convert"))
    if err is not None:
        raise err
    return _info(info)


def _info(info: Any) -> Dict[str, int]:
    return {f[0]: int(getattr(info, f[0])) for f in _native.ConvertInfo._fields_}


def _options(*, codec: Optional[str], quant: Optional[str], quant_include: Iterable[str],
             quant_exclude: Iterable[str], block_patterns: Iterable[str], block_order: Iterable[str],
             chunk_size: Union[int, str, None], zstd_level: Optional[int], threads: Optional[int],
             force: bool, read_back: bool = False) -> Tuple[Any, List[Any]]:
    """arena_convert_options of these, and what they point at (to keep alive through the call)."""
    o = _native.ConvertOptions()
    keep: List[Any] = []
    for field, v in (("block_patterns", block_patterns), ("block_order", block_order),
                     ("quant_include", quant_include), ("quant_exclude", quant_exclude)):
        arr, n = _strings(v, field)
        keep.append(arr)
        if n:
            setattr(o, field, ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)))
            setattr(o, "n_" + field, n)
    o.quant = quant.encode() if quant else None
    o.codec = codec.encode() if codec else None
    o.chunk_size = parse_size(chunk_size, "chunk_size") or 0
    o.zstd_level = 0 if zstd_level is None else _native.check_int("zstd_level", zstd_level, ctypes.c_int)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads: {threads!r}: a whole number, 1 or more")
    o.threads = 0 if threads is None else _native.check_int("threads", threads, ctypes.c_uint)
    o.force = 1 if force else 0
    o.read_back = 1 if read_back else 0
    return o, keep


def verify(path: PathLike, *, threads: Optional[int] = None, progress: Progress = None) -> Dict[str, Any]:
    """Check every byte of an arena image, as ``arena verify`` does: header, manifest
    and chunk table, then every chunk's checksum (and a coded chunk's structure).

    Returns ``{"path", "ok": True, "file_size", "chunks", "seconds"}``. Raises
    :class:`arena.Error` when anything does not hold; for bad chunks its ``code``
    is ``"IMG_CHUNK_CHECKSUM"``, its message names the first, and its
    ``bad_chunks`` lists them all as ``arena verify --json`` does (chunk, offset,
    length, expected, actual, blocks, tensors). ``progress`` as for :func:`convert`.
    """
    p = os.fspath(path)
    o = _native.VerifyOptions()
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads: {threads!r}: a whole number, 1 or more")
    o.threads = 0 if threads is None else _native.check_int("threads", threads, ctypes.c_uint)
    bad: List[Dict[str, Any]] = []

    def on_bad(_ctx: Any, b: Any) -> None:
        c = b.contents
        bad.append({
            "chunk": int(c.chunk), "offset": int(c.offset), "length": int(c.length),
            "expected": f"{c.expected:016x}", "actual": f"{c.actual:016x}",
            "blocks": [c.blocks[i].decode() for i in range(c.n_blocks)],
            "tensors": [c.tensors[i].decode() for i in range(c.n_tensors)],
        })

    bad_fn = _native.BAD_CHUNK_FN(on_bad)
    o.bad_chunk = bad_fn
    info = _native.VerifyInfo()
    enc = os.fsencode(p)

    def call(cfn: Any) -> int:
        o.progress = cfn
        return int(_native.lib.arena_verify(enc, ctypes.byref(o), ctypes.byref(info)))

    rc, err = _run(call, _Bar(progress, "verify"))
    if err is not None:
        err.bad_chunks = bad
        raise err
    return {"path": p, "ok": True, "file_size": int(info.file_size), "chunks": int(info.chunk_count),
            "seconds": float(info.seconds)}


def inspect(path: PathLike) -> Dict[str, Any]:
    """What a checkpoint or image holds, as ``arena inspect --json`` prints it (schema in
    docs/CLI.md): ``kind`` ("safetensors" or "arena-image"), tensors, metadata, totals;
    for a checkpoint also ``discovery`` (the blocks convert will make and why: its
    ``line``, and each container judged under ``found``); for an image its blocks,
    layout and coding. Raises :class:`arena.Error`."""
    s = ctypes.c_void_p()
    rc = _native.lib.arena_inspect(os.fsencode(os.fspath(path)), ctypes.byref(s))
    if rc:
        raise _error(rc)
    if not s.value:  # (the library gives a string whenever it returns 0)
        raise Error("INTERNAL", f"{os.fspath(path)}: arena_inspect succeeded without a document")
    try:
        text = ctypes.string_at(s.value).decode("utf-8")
    finally:
        _native.lib.arena_string_free(s)
    d: Dict[str, Any] = json.loads(text)
    return d


class ImageWriter:
    """An arena image written from tensors in memory, a block at a time: the image
    :func:`convert` makes of a safetensors file holding the same tensors, with the
    same options (the manifest's ``source`` names ``label`` instead of the file),
    without the file. For weights a program makes (``arena.torch.synth_image``) or
    holds a block at a time.

    ``tensors``: every tensor's name and ``(dtype, shape)``, dtype an image's name
    ("BF16", "F32", "F8_E4M3"...); ``metadata``: the manifest's (as a safetensors
    file's ``__metadata__``); ``label``: the source's name in messages and in the
    manifest. The other arguments are :func:`convert`'s. Everything is checked here,
    before a byte is written (``OUTPUT_EXISTS`` without ``force``; the output's room
    is reserved: a full disk is an error now).

    :attr:`blocks` lists the image's blocks in order, each ``(name, [tensor names])``;
    :meth:`put` hands over one tensor's bytes, blocks in that order, a block's
    tensors in any order. The put that completes a block writes it (quantized,
    coded, checksummed, on ``threads`` threads) before it returns: after it, none of
    that block's bytes is read again. :meth:`finish` links the image in at ``out``
    whole; :meth:`abort` (or an exception leaving a ``with`` block) leaves nothing
    there. Errors are :class:`arena.Error`; after one, only :meth:`abort` is left.
    """

    def __init__(self, out: PathLike, tensors: Dict[str, Tuple[str, Sequence[int]]], *, label: str,
                 metadata: Optional[Dict[str, str]] = None, codec: Optional[str] = None,
                 quant: Optional[str] = None, quant_include: Iterable[str] = (), quant_exclude: Iterable[str] = (),
                 block_patterns: Iterable[str] = (), block_order: Iterable[str] = (),
                 chunk_size: Union[int, str, None] = None, zstd_level: Optional[int] = None,
                 threads: Optional[int] = None, force: bool = False, read_back: bool = False):
        from ._dtypes import element_bits

        self._w: Optional[int] = None
        header: Dict[str, Any] = {}
        if metadata:
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
                raise TypeError("metadata: a dict of strings to strings (a safetensors file's __metadata__)")
            header["__metadata__"] = dict(metadata)
        pos = 0
        self._size: Dict[str, int] = {}
        for name in sorted(tensors):
            dtype, shape = tensors[name]
            bits = element_bits(dtype)
            n = 1
            for d in shape:
                n *= int(d)
            nbytes = n * bits // 8
            header[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [pos, pos + nbytes]}
            self._size[name] = nbytes
            pos += nbytes
        o, keep = _options(codec=codec, quant=quant, quant_include=quant_include, quant_exclude=quant_exclude,
                           block_patterns=block_patterns, block_order=block_order, chunk_size=chunk_size,
                           zstd_level=zstd_level, threads=threads, force=force, read_back=read_back)
        self.path = os.fspath(out)
        w = ctypes.c_void_p()
        rc = _native.lib.arena_writer_open(os.fsencode(self.path), json.dumps(header).encode(), label.encode(),
                                           ctypes.byref(o), ctypes.byref(w))
        del keep
        if rc:
            raise _error(rc)
        self._w = w.value
        lib = _native.lib
        self.blocks: List[Tuple[str, List[str]]] = []
        for i in range(int(lib.arena_writer_block_count(w))):
            names = [lib.arena_writer_tensor_name(w, i, k).decode() for k in range(lib.arena_writer_block_tensors(w, i))]
            self.blocks.append((lib.arena_writer_block_name(w, i).decode(), names))
        self.total_bytes = pos  # the tensors' bytes, as given

    def nbytes(self, name: str) -> int:
        """The bytes :meth:`put` takes for tensor ``name``."""
        return self._size[name]

    def _live(self) -> int:
        if self._w is None:
            raise Error("USAGE", f"{self.path}: the writer is finished or aborted")
        return self._w

    def put(self, name: str, address: int, nbytes: int) -> None:
        """Tensor ``name``'s ``nbytes`` bytes at ``address`` (a contiguous buffer, e.g. a
        CPU tensor's ``data_ptr()``), borrowed: they must stay as they are until the
        put that completes its block has returned."""
        w = self._live()
        rc = _native.lib.arena_writer_put(w, name.encode(), _native.check_int("address", address, ctypes.c_void_p),
                                          _native.check_int("nbytes", nbytes, ctypes.c_uint64))
        if rc:
            raise _error(rc)

    def finish(self) -> Dict[str, int]:
        """The image linked in at ``out``; returns what :func:`convert` returns."""
        w = self._live()
        self._w = None
        info = _native.ConvertInfo()
        rc = _native.lib.arena_writer_finish(w, ctypes.byref(info))
        if rc:
            raise _error(rc)
        return _info(info)

    def abort(self) -> None:
        """Stop: nothing is left at ``out`` (a no-op once finished or aborted)."""
        w, self._w = self._w, None
        if w is not None:
            _native.lib.arena_writer_abort(w)

    def __enter__(self) -> "ImageWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.abort()

    def __del__(self) -> None:
        self.abort()
