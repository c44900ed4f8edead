"""The opened model (:class:`Arena`), :func:`open` that makes one, and :func:`library_version`.

Private: the public names are ``arena.Arena``, ``arena.open`` and
``arena.library_version`` (the package's front door names them as its own).
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _dlpack, _native
from ._dtypes import _import, _numpy_dtype, _torch, _view, torch_dtype
from ._errors import Error, ShareWarning, _check
from ._native import check_int as _check_int
from ._records import Block, Component, TensorInfo
from ._units import Size, parse_size


def library_version() -> str:
    """The version of the libarena the package runs on."""
    return _native.lib.arena_version().decode()


class Arena:
    """An opened model: its blocks on the device as far as they fit, the rest streamed.

    Use :func:`open`. Closing (``close()``, or leaving a ``with`` block) ends
    the engine; tensors handed out before keep the memory they view alive
    until they are freed. Every method may be called from any thread.
    """

    def __init__(self, handle: int, path: str):
        self._h: Optional[int] = handle
        self.path = path
        self._lock = threading.Lock()
        self.backend: str = _native.lib.arena_backend_name(handle).decode()
        n = _native.lib.arena_block_count(handle)
        self.blocks: List[Block] = []
        for i in range(n):
            bi = _native.BlockInfo()
            _check(_native.lib.arena_block_get(handle, i, ctypes.byref(bi)))
            self.blocks.append(Block(i, bi.name.decode(), bi.container.decode() if bi.container else None,
                                     int(bi.index), int(bi.bytes)))
        self._block_index = {b.name: b.index for b in self.blocks}
        self._tensors: Dict[str, TensorInfo] = {}
        self._tensor_index: Dict[str, int] = {}
        for i in range(_native.lib.arena_tensor_count(handle)):
            ti = _native.TensorInfo()
            _check(_native.lib.arena_tensor_get(handle, i, ctypes.byref(ti)))
            comps = tuple(
                Component(c.name.decode(), c.dtype.decode(), tuple(c.shape[k] for k in range(c.rank)), int(c.bytes),
                          int(c.offset))
                for c in ti.component[: ti.n_components]
            )
            sub = _native.lib.arena_tensor_subclass(handle, i)
            self._tensors[ti.name.decode()] = TensorInfo(ti.name.decode(), ti.dtype.decode(),
                                                         tuple(ti.shape[k] for k in range(ti.rank)),
                                                         ti.scheme.decode(), int(ti.block), comps,
                                                         sub.decode() if sub else None)
            self._tensor_index[ti.name.decode()] = i

    # --- life -------------------------------------------------------------------
    def _handle(self) -> int:
        h = self._h
        if h is None:
            raise Error("USAGE", f"{self.path}: the arena is closed")
        return h

    @property
    def closed(self) -> bool:
        return self._h is None

    def close(self) -> None:
        """End the engine and drop this handle's reference. Idempotent. Tensors
        made before stay valid (they hold references of their own)."""
        with self._lock:
            h, self._h = self._h, None
        if h is not None:
            _native.lib.arena_close(h)

    def __enter__(self) -> "Arena":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.backend
        return f"<arena.Arena {self.path!r} ({state}, {len(self.blocks)} blocks, {len(self._tensors)} tensors)>"

    # --- where things are ---------------------------------------------------------
    @property
    def device(self) -> str:
        """Where device tensors live, as torch names it: ``"cuda:N"`` or ``"cpu"`` (sim)."""
        return "cpu" if self.backend == "sim" else f"cuda:{self._device_id}"

    _device_id = 0

    def _dl_device(self) -> Tuple[int, int]:
        return (_dlpack.KDL_CPU, 0) if self.backend == "sim" else (_dlpack.KDL_CUDA, self._device_id)

    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self._tensors[name]
        except KeyError:
            raise Error("NOT_FOUND", f"{self.path}: no tensor '{name}'") from None

    def tensor_names(self) -> List[str]:
        return sorted(self._tensors)

    def block_index(self, name: str) -> int:
        try:
            return self._block_index[name]
        except KeyError:
            raise Error("NOT_FOUND", f"{self.path}: no block '{name}'") from None

    def block_state(self, block: int) -> Tuple[bool, int, int]:
        """(resident, device address or 0, host address or 0) of a block now. A
        streamed block held coded (see :meth:`coded`) has no host address. Opened with
        ``release_host`` (the default), a host address holds while its block is
        streamed: :meth:`keep_host` the block to use it longer."""
        bi = _native.BlockInfo()
        i = _check_int("block_state(block)", block, ctypes.c_size_t)
        _check(_native.lib.arena_block_get(self._handle(), i, ctypes.byref(bi)))
        return bool(bi.resident), int(bi.device or 0), int(bi.host or 0)

    def keep_host(self, block: int) -> None:
        """Keep block ``block``'s host copy for the arena's life (an arena opened with
        ``release_host``, the default, gives it back once the block is on the device for
        good): before using a host address from :meth:`block_state` beyond the next step."""
        _check(_native.lib.arena_block_keep_host(self._handle(), _check_int("keep_host(block)", block, ctypes.c_size_t)))

    def coded(self, block: int) -> bool:
        """Whether the block's host copy holds its image's hb4 chunks rather than its
        bytes (coded streaming: an hb4 image's streamed blocks, whose copies move
        about 3/4 of the bytes and are decoded by the device)."""
        bi = _native.BlockInfo()
        i = _check_int("coded(block)", block, ctypes.c_size_t)
        _check(_native.lib.arena_block_get(self._handle(), i, ctypes.byref(bi)))
        return bool(bi.coded)

    # --- tensors -------------------------------------------------------------------
    def slab(self, block: int, address: int, where: str = "device") -> Any:
        """A torch uint8 tensor over block ``block``'s slab at ``address`` (zero copy;
        it holds a reference to the arena). ``where``: "device" or "host"."""
        block = _check_int("slab(block)", block, ctypes.c_size_t)
        address = _check_int("slab(address)", address, ctypes.c_void_p)
        torch = _torch()

        nbytes = self.blocks[block].nbytes
        if where == "host":
            self.keep_host(block)  # the view outlives the step: the copy must too
        dev = self._dl_device() if where == "device" else (_dlpack.KDL_CPU, 0)
        with torch.inference_mode(False):
            return torch.from_dlpack(_dlpack.capsule(self._handle(), address, nbytes, *dev))

    def views(self, slab: Any, block: int) -> Dict[str, Any]:
        """Typed views of every tensor of ``block`` in a slab tensor (see :meth:`slab`):
        name -> tensor for single-component tensors; quantized ones as their
        components, ``name`` (qdata) and ``name + "_scale"``."""
        out: Dict[str, Any] = {}
        for t in self._tensors.values():
            if t.block != block:
                continue
            for c in t.components:
                key = t.name if c.name in ("data", "qdata") else f"{t.name}_{c.name}"
                out[key] = _view(slab, c)
        return out

    def tensors(self) -> Dict[str, Any]:
        """Every tensor as a torch tensor, zero copy: resident blocks' on the device,
        streamed blocks' as (read-only) CPU views of their canonical host copy.
        Quantized tensors appear as ``name`` (qdata) and ``name + "_scale"``.
        Raises :class:`Error` (USAGE) when a block has no raw copy in memory (the
        disk tier: beyond ``host_budget``; or held coded: an hb4 image's streamed
        blocks unless opened with ``plain_stream=True``)."""
        out: Dict[str, Any] = {}
        for b in self.blocks:
            resident, dev, host = self.block_state(b.index)
            if not b.nbytes:
                continue
            if not resident and not host and self.coded(b.index):
                raise Error("USAGE", f"{self.path}: block '{b.name}' is streamed and held coded (hb4): "
                            f"tensors() views raw bytes; acquire the block, or open the image with "
                            f"plain_stream=True for raw host copies")
            if not resident and not host:
                raise Error("USAGE", f"{self.path}: block '{b.name}' is in the image only (beyond host_budget): "
                            f"tensors() views memory; open with a larger host_budget, or acquire the block")
            slab = self.slab(b.index, dev, "device") if resident else self.slab(b.index, host, "host")
            out.update(self.views(slab, b.index))
        return out

    state_dict = tensors

    def arrays(self) -> Dict[str, Any]:
        """Numpy arrays over the host copies of streamed blocks (read-only; on sim,
        over every block; blocks in the image only, beyond ``host_budget``, have
        none). BF16/FP8 need ml_dtypes."""
        np = _import("numpy", "Arena.arrays", "numpy")

        out: Dict[str, Any] = {}
        for b in self.blocks:
            resident, dev, host = self.block_state(b.index)
            addr = host or (dev if self.backend == "sim" else 0)
            if not addr or not b.nbytes:
                continue
            if host:
                self.keep_host(b.index)
            raw = np.from_dlpack(_dlpack.Exporter(self._handle(), addr, b.nbytes, _dlpack.KDL_CPU, 0))
            raw.flags.writeable = False
            for t in self._tensors.values():
                if t.block != b.index:
                    continue
                for c in t.components:
                    key = t.name if c.name in ("data", "qdata") else f"{t.name}_{c.name}"
                    out[key] = raw[c.offset : c.offset + c.nbytes].view(_numpy_dtype(c.dtype)).reshape(c.shape)
        return out

    # --- steps ------------------------------------------------------------------------
    def step_begin(self) -> None:
        _check(_native.lib.arena_step_begin(self._handle()))

    def step_end(self) -> None:
        _check(_native.lib.arena_step_end(self._handle()))

    def set_rest_memory(self, nbytes: int) -> None:
        """The bytes the rest of the process holds on the device now (its peak too; the
        same work): :meth:`rest_report` with ``now = peak = nbytes``."""
        self.rest_report(_check_int("set_rest_memory(nbytes)", nbytes, ctypes.c_uint64))

    def rest_report(self, now: int, peak: Optional[int] = None, work: int = 0, oom: bool = False) -> None:
        """What the rest of the process (torch's allocator) held on the device, told at a
        step's end before :meth:`step_end`: ``now`` what it holds at this moment
        (``torch.cuda.memory_reserved()``), ``peak`` the most it held in the step that ends
        (``torch.cuda.max_memory_reserved()`` since the last report; None: ``now``) and
        ``work`` a key of the next step's work (steps with the same key need the same
        memory; 0: the same as the step that ends; an int from -2**63 to 2**64 - 1, a
        negative one, as ``hash()`` gives, taken modulo 2**64). Told between steps, ``work`` names
        the step about to begin. With ``learn_rest`` the engine learns each work's peak
        and plans the weights around it (include/arena.h, "The process's device
        memory"); ``arena.torch`` does all this itself. ``oom``: ``peak`` is what the rest
        needed when it ran out of device memory (what it held and asked for): the plan's
        changes for it are :meth:`decisions` with why ``"oom"``, and told between steps
        it is planned for at once (blocks demoted now), so that the step can run again."""
        now = _check_int("rest_report(now)", now, ctypes.c_uint64)
        peak = now if peak is None else _check_int("rest_report(peak)", peak, ctypes.c_uint64)
        # work is a key, not a quantity: a negative one (a hash()) is taken modulo 2**64
        neg = isinstance(work, int) and work < 0
        w = _check_int("rest_report(work)", work, ctypes.c_int64 if neg else ctypes.c_uint64) & (2**64 - 1)
        r = _native.RestInfo(now, peak, w, _native.REST_OOM if oom else 0)
        _check(_native.lib.arena_rest_report(self._handle(), ctypes.byref(r)))

    def memory(self) -> Dict[str, int]:
        """The process's device memory as the engine sees it now: ``cap`` (0: none),
        ``process`` (the driver's figure for the process; 0: unknown), ``other`` (what
        it holds beside arena and the rest: its CUDA context), ``arena`` (arena's own
        bytes), ``rest`` (the rest's, as last told), ``rest_need`` (what the plan leaves
        it at its peak), ``rest_limit`` (the most it may hold in a step for the process
        to stay within the cap; 0: no cap), ``headroom``, ``learned`` (the need of the
        next step's work is learned), ``other_measured``, ``works`` (learned so far),
        ``share_card`` (the bytes the plan leaves other programs free; 0: none)."""
        m = _native.MemoryInfo()
        _check(_native.lib.arena_memory_get(self._handle(), ctypes.byref(m)))
        return {f[0]: int(getattr(m, f[0])) for f in _native.MemoryInfo._fields_}

    def acquire(self, block: Union[int, str], stream: Optional[int] = None) -> int:
        """Make ``stream`` (a native stream handle; None: the default stream, and on
        sim the host) wait for the block's bytes; returns their address."""
        i = self.block_index(block) if isinstance(block, str) else _check_int("acquire(block)", block, ctypes.c_size_t)
        s = None if stream is None else _check_int("acquire(stream)", stream, ctypes.c_void_p)
        p = ctypes.c_void_p()
        _check(_native.lib.arena_block_acquire(self._handle(), i, s, ctypes.byref(p)))
        return int(p.value or 0)

    def dequantize(self, name: str, block_address: int, out: Any, stream: Optional[int] = None) -> Any:
        """Write the values of tensor ``name``, stored quantized (docs/QUANT.md), into
        ``out``: a contiguous torch tensor of the tensor's original dtype and shape on
        the arena's device (a CPU tensor on sim). ``block_address``: the address of the
        tensor's block, exactly (what :meth:`acquire` returned, until the release; or a
        resident block's address; another, one inside the block too, is USAGE). qdata x scale in f32, rounded once: bit for bit
        ``(qdata.float() * scale).to(dtype)``. On CUDA the work is queued on
        ``stream`` (None: the default stream) after what is queued there; on sim it
        is done when this returns. Returns ``out``."""
        info = self.tensor_info(name)
        want = torch_dtype(info.dtype)
        dev = self.device  # the device index too: the kernel writes where the pointer says
        if (out.dtype != want or tuple(out.shape) != info.shape or not out.is_contiguous()
                or str(out.device) != dev):
            raise Error("USAGE", f"dequantize '{name}': out must be a contiguous {dev} tensor of {info.shape} "
                                 f"{want}; got {tuple(out.shape)} {out.dtype} on {out.device}"
                                 + ("" if out.is_contiguous() else ", not contiguous"))
        self._dequantize(self._tensor_index[name], block_address, out.data_ptr(), stream)
        return out

    def _dequantize(self, index: int, block_address: int, dst: int, stream: Optional[int]) -> None:
        """dequantize without its checks of ``out`` (arena.torch: the caller made dst right)."""
        args = (_check_int("dequantize(index)", index, ctypes.c_size_t),
                _check_int("dequantize(block_address)", block_address, ctypes.c_void_p),
                _check_int("dequantize(dst)", dst, ctypes.c_void_p),
                None if stream is None else _check_int("dequantize(stream)", stream, ctypes.c_void_p))
        _check(_native.lib.arena_tensor_dequantize(self._handle(), *args))

    def fp8_quantize_rows(self, x: Any, q: Any, scale: Any, stream: Optional[int] = None,
                          col_scale: Any = None) -> None:
        """``x`` (a contiguous BF16 torch tensor [rows, cols] on the arena's device; a
        CPU tensor on sim) to FP8 e4m3 a row, in one pass: ``q`` (float8_e4m3fn, x's
        shape) and ``scale`` (float32, [rows, 1]) get what ``arena.torch``'s native
        FP8 product takes, bit for bit torch's ``s = (amax(|row|) / 448).clamp(min=
        1e-12)``, ``q = (x.float() / s).clamp(-448, 448).to(float8_e4m3fn)``
        (``arena_fp8_quantize_rows``), a true division by 448 (on CUDA torch divides
        by a Python number as a product by its reciprocal: hold 448 as a tensor).
        With ``col_scale`` (float32 [cols], contiguous, on x's device) each element
        is first multiplied by its column's scale, in f32:
        the same rule on ``x.float() * col_scale`` (``arena_fp8_quantize_rows_scaled``:
        the FP8 backward's gradient times a weight's row scales). On CUDA queued on
        ``stream`` (None: the default stream); on sim done when this returns. Raises
        arena.Error USAGE for tensors that are not so."""
        import torch

        dev = self.device
        rows, cols = (x.shape[0], x.shape[1]) if x.dim() == 2 else (0, 0)
        want: List[Tuple[Any, Any, Tuple[int, ...]]] = [
            (x, torch.bfloat16, (rows, cols)), (q, torch.float8_e4m3fn, (rows, cols)), (scale, torch.float32, (rows, 1))]
        if col_scale is not None:
            want.append((col_scale, torch.float32, (cols,)))
        for t, dt, shape in want:
            if (x.dim() != 2 or t.dtype != dt or tuple(t.shape) != shape or not t.is_contiguous()
                    or str(t.device) != dev):
                raise Error("USAGE", f"fp8_quantize_rows: x, q, scale and col_scale must be contiguous {dev} "
                                     f"tensors: x [rows, cols] bfloat16, q of its shape float8_e4m3fn, scale "
                                     f"[rows, 1] float32, col_scale [cols] float32; got {t.dtype} "
                                     f"{tuple(t.shape)} on {t.device}")
        self._fp8_quantize_rows(x.data_ptr(), rows, cols, q.data_ptr(), scale.data_ptr(), stream,
                                0 if col_scale is None else col_scale.data_ptr())

    def _fp8_quantize_rows(self, x: int, rows: int, cols: int, q: int, scale: int, stream: Optional[int],
                           col_scale: int = 0) -> None:
        """fp8_quantize_rows without its checks of the tensors (arena.torch: the caller made
        them right); col_scale 0: none."""
        P, U = ctypes.c_void_p, ctypes.c_uint64
        args = (_check_int("fp8_quantize_rows(x)", x, P), _check_int("fp8_quantize_rows(rows)", rows, U),
                _check_int("fp8_quantize_rows(cols)", cols, U), _check_int("fp8_quantize_rows(q)", q, P),
                _check_int("fp8_quantize_rows(scale)", scale, P),
                None if stream is None else _check_int("fp8_quantize_rows(stream)", stream, P))
        if col_scale:
            cs = _check_int("fp8_quantize_rows(col_scale)", col_scale, P)
            _check(_native.lib.arena_fp8_quantize_rows_scaled(self._handle(), *args[:3], cs, *args[3:]))
        else:
            _check(_native.lib.arena_fp8_quantize_rows(self._handle(), *args))

    def fp8_transpose(self, x: Any, t: Any, stream: Optional[int] = None) -> None:
        """``x`` (a contiguous torch tensor [rows, cols] of one-byte elements,
        float8_e4m3fn or uint8, on the arena's device; a CPU tensor on sim)
        transposed into ``t`` (contiguous [cols, rows], x's dtype, another
        tensor's memory): ``t`` equals ``x.t().contiguous()`` byte for byte, in
        one pass (``arena_fp8_transpose``: the weight's bytes as the FP8 input
        gradient's product takes them). On CUDA queued on ``stream`` (None: the
        default stream); on sim done when this returns. Raises arena.Error USAGE
        for tensors that are not so."""
        dev = self.device
        rows, cols = (x.shape[0], x.shape[1]) if x.dim() == 2 else (0, 0)
        for v, shape in ((x, (rows, cols)), (t, (cols, rows))):
            if (x.dim() != 2 or v.element_size() != 1 or v.dtype != x.dtype or tuple(v.shape) != shape
                    or not v.is_contiguous() or str(v.device) != dev):
                raise Error("USAGE", f"fp8_transpose: x and t must be contiguous {dev} tensors of one-byte "
                                     f"elements, x [rows, cols] and t [cols, rows] of its dtype; got {v.dtype} "
                                     f"{tuple(v.shape)} on {v.device}")
        self._fp8_transpose(x.data_ptr(), rows, cols, t.data_ptr(), stream)

    def _fp8_transpose(self, x: int, rows: int, cols: int, t: int, stream: Optional[int]) -> None:
        """fp8_transpose without its checks of the tensors (arena.torch: the caller made
        them right)."""
        P, U = ctypes.c_void_p, ctypes.c_uint64
        _check(_native.lib.arena_fp8_transpose(
            self._handle(), _check_int("fp8_transpose(x)", x, P), _check_int("fp8_transpose(rows)", rows, U),
            _check_int("fp8_transpose(cols)", cols, U), _check_int("fp8_transpose(t)", t, P),
            None if stream is None else _check_int("fp8_transpose(stream)", stream, P)))

    def _acquire_unchecked(self, block: int, stream: Optional[int]) -> int:
        """acquire() for the PyTorch adapter, once a step for each block or piece it
        runs: a block index and a stream handle of its own making, in range (the
        public method's checks of its arguments cost as much as the call)."""
        p = ctypes.c_void_p()
        _check(_native.lib.arena_block_acquire(self._handle(), block, stream, ctypes.byref(p)))
        return int(p.value or 0)

    def _release_unchecked(self, block: int, stream: Optional[int]) -> None:
        """release() for the PyTorch adapter (as _acquire_unchecked)."""
        _check(_native.lib.arena_block_release(self._handle(), block, stream))

    def tensor_index(self, name: str) -> int:
        """The C API's index of tensor ``name`` (its place in name order)."""
        self.tensor_info(name)
        return self._tensor_index[name]

    def release(self, block: Union[int, str], stream: Optional[int] = None) -> None:
        i = self.block_index(block) if isinstance(block, str) else _check_int("release(block)", block, ctypes.c_size_t)
        s = None if stream is None else _check_int("release(stream)", stream, ctypes.c_void_p)
        _check(_native.lib.arena_block_release(self._handle(), i, s))

    def set_mode(self, mode: str) -> None:
        """"sample" or "train", between steps."""
        _check(_native.lib.arena_set_mode(self._handle(), _mode(mode)))

    @property
    def mode(self) -> str:
        m = _native.lib.arena_mode(self._handle())
        if m < 0:
            raise Error("USAGE", _native.last_error() or f"{self.path}: the arena is closed")
        return "train" if m == _native.MODE_TRAIN else "sample"

    def sync(self) -> None:
        """Wait for the engine's copies and read the device's timing of the steps run."""
        _check(_native.lib.arena_sync(self._handle()))

    def stats(self) -> List[Dict[str, Any]]:
        """The engine's per-step records (the last 256), oldest first: dicts with the
        fields of ``arena_step_info`` in arena.h, among them ``streamed_bytes`` and
        ``moved_bytes`` (what went over the bus: fewer when held coded),
        ``resident_bytes``, ``stalls``/``stall_s`` (device-timed waits for copies),
        ``misses``, ``demotions``/``promotions``, ``disk_bytes`` and ``disk_wait_s``
        (the disk tier: read from the image, and how long copies waited for it),
        ``end_s``/``plan_s``/``move_s`` (host seconds at the step's end),
        ``looked``/``look_s`` (a look at the learned profile taken at its end, and
        the seconds it planned on its own thread), ``look_now_s``/``look_plan_s``
        (the steady step that look's profile predicts for the plan in force and for
        its own plan; 0 where not predicted), ``move_est_s``/``move_gain_s``/
        ``move_held`` (a move a prediction asked for: its estimated cost, the
        seconds a step it was to save, held back when it would not pay for itself
        within ``payback_steps`` steps), ``host_read_bytes``/``prepared_bytes`` (host
        copies of the blocks its end's moves demoted: read from the image in the step
        end, or read ahead by a look on its own thread during the step before)."""
        h = self._handle()
        n = _native.lib.arena_step_count(h)
        out = []
        for s in range(max(0, n - 256), n):
            r = _native.StepInfo()
            if _native.lib.arena_step_get(h, s, ctypes.byref(r)):
                continue
            d = {f[0]: getattr(r, f[0]) for f in _native.StepInfo._fields_}
            d["mode"] = "train" if r.mode == _native.MODE_TRAIN else "sample"
            for k in ("over_budget", "schedule_learned", "stopped_early", "profile_learned", "gpu_timed", "looked",
                      "move_held"):
                d[k] = bool(d[k])
            out.append(d)
        return out

    def decisions(self) -> List[Dict[str, Any]]:
        """Each change of the plan so far (the last 256), oldest first: dicts with
        ``step`` (the step at whose end it was made, or, made ``between`` steps, the step
        about to begin: the :meth:`stats` record that counts its moves), ``between``,
        ``why`` (``"learned"``: the compute profile or the order learned from the steps;
        ``"pressure"``: the device's free memory changed, another program took or gave
        back memory; ``"yield"``: ``share_card``, memory given back to another program;
        ``"need"``: what torch needs changed; ``"oom"``: the same, told after it ran out;
        ``"mode"``, ``"schedule"``, ``"profile"``: set by the caller; ``"replan"``: the
        plan made anew), ``promoted``/``demoted`` (blocks), ``promoted_bytes``/
        ``demoted_bytes``, ``resident_before``/``resident_after``, ``ring_before``/
        ``ring_after`` (the ring's device bytes), ``budget`` and ``free_bytes`` (what it
        was made for), ``stream_before``/``stream_after`` (the bytes a steady step
        streams, predicted) and ``step_before_s``/``step_after_s`` (a steady step
        predicted by the compute profile in force; 0 without one)."""
        h = self._handle()
        n = _native.lib.arena_decision_count(h)
        out = []
        for i in range(max(0, n - 256), n):
            r = _native.DecisionInfo()
            if _native.lib.arena_decision_get(h, i, ctypes.byref(r)):
                continue
            d: Dict[str, Any] = {f[0]: getattr(r, f[0]) for f in _native.DecisionInfo._fields_ if f[0] != "why_name"}
            d["why"] = (r.why_name or b"?").decode()
            d["between"] = bool(r.between)
            out.append(d)
        return out

    def plan(self) -> Dict[str, Any]:
        """The residency plan in force: budget, resident and streamed bytes and blocks, the ring."""
        p = _native.PlanInfo()
        _check(_native.lib.arena_plan_get(self._handle(), ctypes.byref(p)))
        d = {f[0]: getattr(p, f[0]) for f in _native.PlanInfo._fields_}
        d["mode"] = "train" if p.mode == _native.MODE_TRAIN else "sample"
        return d

    def share_state(self) -> Tuple[str, str]:
        """How this arena holds its host copies under ``share_host``: ("off", "") when
        sharing was not asked for or nothing has a host copy; ("loaded", "") when this
        process loaded the copies the host's other processes of this user map;
        ("mapped", "") when it maps copies another process loaded (checked against the
        image first: :meth:`share_info`); ("private", why) when sharing was asked for
        and was not possible (why: one line, e.g. the share folder belongs to another
        user): the process holds its own copy, as without ``share_host``."""
        i = self.share_info()
        return i["state"], i["why"]

    def share_info(self) -> Dict[str, Any]:
        """:meth:`share_state` and, for a region mapped (or given up on after its
        check), the check against the image: ``check_s`` seconds, ``checked_bytes``
        of the region hashed against chunk checksums or compared, and
        ``check_read_bytes`` read from the image for it."""
        i = _native.ShareInfo()
        _check(_native.lib.arena_share_get(self._handle(), ctypes.byref(i)))
        return {"state": _native.SHARE_STATES[i.state], "why": i.why.decode(errors="replace"),
                "check_s": i.check_s, "checked_bytes": i.checked_bytes, "check_read_bytes": i.check_read_bytes}

    def schedule(self) -> List[int]:
        """The order the engine prefetches by: block indices, as the steps run them."""
        h = self._handle()
        n = ctypes.c_size_t()
        _check(_native.lib.arena_schedule_get(h, None, 0, ctypes.byref(n)))
        buf = (ctypes.c_uint32 * max(1, n.value))()
        _check(_native.lib.arena_schedule_get(h, buf, n.value, ctypes.byref(n)))
        return list(buf[: n.value])

    def set_schedule(self, blocks: Sequence[int]) -> None:
        """Between steps: the order the next steps acquire blocks in (block indices,
        repeats allowed, not the globals block), in the mode in force; the engine
        prefetches and plans by it and goes on learning the order run."""
        arr = (ctypes.c_uint32 * max(1, len(blocks)))(
            *[_check_int("set_schedule(blocks)", b, ctypes.c_uint32) for b in blocks])
        _check(_native.lib.arena_schedule_set(self._handle(), arr, len(blocks)))

    def device_memory(self) -> Tuple[int, int]:
        """(free, total) bytes of the device now."""
        f, t = ctypes.c_uint64(), ctypes.c_uint64()
        _check(_native.lib.arena_device_memory(self._handle(), ctypes.byref(f), ctypes.byref(t)))
        return int(f.value), int(t.value)

    def save_profile(self, path: str) -> None:
        """Write the compute profile the engine learned (for ``arena plan --profile``)."""
        _check(_native.lib.arena_profile_save(self._handle(), os.fsencode(path)))

    def trace_begin(self, path: Union[str, "os.PathLike[str]"], max_events: int = 0) -> None:
        """Start recording a trace of the engine's work (between steps), written to ``path``
        by :meth:`trace_end`: Chrome trace-event JSON, for https://ui.perfetto.dev.
        ``max_events``: records kept (0: 65536); what does not fit is dropped and counted."""
        n = _check_int("trace_begin(max_events)", max_events, ctypes.c_size_t)
        _check(_native.lib.arena_trace_begin(self._handle(), os.fsencode(os.fspath(path)), n))

    def trace_end(self) -> None:
        """Wait for the device's times of the work traced and write the trace (whole or not at all)."""
        _check(_native.lib.arena_trace_end(self._handle()))

    def sim_pressure(self, nbytes: Size) -> None:
        """sim only: hold ``nbytes`` of the simulated device as another program would (0 frees)."""
        _check(_native.lib.arena_sim_pressure(self._handle(), parse_size(nbytes, "sim_pressure") or 0))

    def sim_rest(self, nbytes: Size) -> None:
        """sim only: the rest of this process (a modelled framework allocator) holds
        ``nbytes`` of the simulated device from now on (DEV_OOM when it is not free)."""
        _check(_native.lib.arena_sim_rest(self._handle(), parse_size(nbytes, "sim_rest") or 0))

    def sim_fail_alloc(self, after: int = 0, count: int = 1) -> None:
        """sim only: of arena's device allocations from now on (promotions, the ring),
        the first ``after`` go on as memory allows and the ``count`` after them fail
        with DEV_OOM, as when another program took the memory (``count=0`` clears it).
        The engine meets them as real failures: a promotion left streamed, the ring
        fitted by demoting more."""
        n = _check_int("sim_fail_alloc(after)", after, ctypes.c_uint64)
        k = _check_int("sim_fail_alloc(count)", count, ctypes.c_uint64)
        _check(_native.lib.arena_sim_fail_alloc(self._handle(), n, k))

    def sim_peak(self, reset: bool = False) -> int:
        """sim only: the most device memory the simulated process held (context, rest and
        arena's) since the arena was opened or the last call with ``reset``."""
        v = ctypes.c_uint64()
        _check(_native.lib.arena_sim_peak(self._handle(), int(bool(reset)), ctypes.byref(v)))
        return int(v.value)


def _mode(mode: str) -> int:
    if mode == "sample":
        return _native.MODE_SAMPLE
    if mode == "train":
        return _native.MODE_TRAIN
    raise Error("USAGE", f"mode '{mode}': use 'sample' or 'train'")


def open(
    path: Union[str, "os.PathLike[str]"],
    *,
    device: Union[str, int, None] = None,
    vram: Size = None,
    quant: Optional[str] = None,
    mode: str = "sample",
    headroom: Size = None,
    reserve: Size = None,
    depth: Optional[int] = None,
    keep_last: Optional[int] = None,
    pin_budget: Size = None,
    threads: Optional[int] = None,
    profile: Optional[str] = None,
    strict: bool = False,
    learn: bool = True,
    sim_capacity: Size = None,
    sim_bandwidth: Optional[float] = None,
    sim_context: Size = None,
    learn_rest: bool = False,
    piece_size: Size = None,
    host_budget: Size = None,
    plain_stream: bool = False,
    release_host: bool = True,
    payback_steps: Optional[int] = None,
    share_host: bool = False,
    share_card: Union[bool, float, Size] = None,
) -> Arena:
    """Open an arena image, a safetensors file or a sharded checkpoint folder.

    device: ``"cuda"``, ``"cuda:N"``, ``N``, ``"sim"`` (the simulator) or None (the
      GPU when one is usable, else the simulator).
    vram: all the device memory the process may hold, as the driver counts it (its
      CUDA context, torch's allocator and arena's own; bytes or "8G"); None = what
      the device has free, following other programs as they take and give back
      memory. When the model does not fit, what fits stays resident and the rest
      is streamed.
    quant: safetensors inputs only: store block weights quantized
      ("fp8-e4m3-row", "int8-row", ...; see docs/QUANT.md).
    mode: "sample" (forward) or "train" (forward, then backward with recompute).
    headroom, reserve: device slack, and the memory the rest of the process
      (torch) needs at its peak in a step, kept out of the weights budget (None:
      the library's defaults, or with ``learn_rest`` the reserve learned; 0: none).
    depth, keep_last: the ring's depth and train's extra slots (None: defaults).
    profile: a compute profile file to plan by; learn: learn one on the device.
    sim_capacity, sim_bandwidth: the simulated device's size and copy rate (bytes
      a second, from 1e3 to 1e15; None: as fast as memcpy);
      sim_context: its modelled CUDA context, counted in the process's memory.
    learn_rest: the caller tells the engine what the rest of the process (torch)
      holds at each step's end (:meth:`Arena.rest_report`): the reserve is learned
      per mode and work instead of ``reserve`` (a reserve given turns it off).
      ``arena.torch.attach`` sets it on CUDA.
    piece_size: images only: stream blocks larger than this in pieces (the
      arena's blocks are then the pieces, "transformer_blocks.3#0", ...): the
      model runs in less memory, and more of it stays resident beside a
      smaller ring. "auto": whole blocks when they all fit (train mode: when
      they fit at all, streamed or not; with ``learn_rest``, when their floor
      fits a third of what there is), else pieces of an eighth of the largest
      block in sample mode (64 MiB for Flux), a third in whole eighths in
      train mode (192 MiB), or smaller ones when those do not fit;
      ``plan()["piece_size"]`` says what was chosen.
      ``arena.torch.attach`` binds an arena in pieces module by module.
    host_budget: images only: all the host memory the weights take: the
      copies of streamed blocks, and the staging that those beyond it are
      read through from the image each time they are streamed, checked,
      ahead of use on a thread of arena's (a quarter of the budget, up to
      384 MiB; at least two read slots of up to 64 MiB and the readers'
      chunk buffers, below which the budget is refused) (the disk tier:
      models larger than host memory run; ``stats()``' ``disk_wait_s`` is the
      time a step waited for the disk). The tier's blocks are spread through
      the step, each read while the blocks before it are copied: a tier the
      reads can keep up with (from the page cache, 9 GB/s or more on the
      H200) costs the step nothing and lowers peak RSS by its size. None =
      what MemAvailable allows less a reserve; 0 = that least: no copies,
      every streamed block read. ``plan()`` says ``host_budget``,
      ``host_bytes`` held, ``staging_bytes`` and ``n_disk`` blocks left in
      the image.
    plain_stream: an image with hb4 chunks (``arena convert --codec hb4``) keeps
      its streamed blocks coded in host memory unless this is True: every copy
      then moves about 3/4 of the bytes and the device decodes them (coded
      streaming: faster where copies are the limit, and a quarter less host
      memory); ``stats()``' ``moved_bytes`` against ``streamed_bytes`` says
      what it saved. True keeps raw host copies (``tensors()`` can view them).
    release_host: a block that moves to the device for good (promoted when there
      is room) gives its host copy back to the OS at the next step end and reads
      it again from its image if it is streamed later, so host memory stays the
      streamed blocks'. ``tensors()``, ``arrays()`` and ``slab(where="host")``
      keep the copies they view (:meth:`Arena.keep_host`); a host address from
      ``block_state`` is otherwise valid while its block is streamed.
    payback_steps: a move between resident sets that only a prediction asks for
      (the learned profile's plan, or a plan made anew at another budget) is made
      when the time it is predicted to save a step, this many times over, is more
      than the move's own (its copies and re-reads, estimated, then as timed);
      ``stats()``' ``move_held`` marks one held back. None = 16.
    share_host: images only: one host copy of the streamed blocks for every
      process of the host that opens this image with the same host layout (the
      same caps and options): the first loads them into memory shared by the
      host's processes, the others map those pages (one that opens while the
      first loads waits for it). Each process keeps its own plan, engine and
      device blocks. Only processes of this user share, through a folder of its
      own (``$ARENA_SHARE_DIR``, else ``/dev/shm/arena-<uid>``), and a process
      checks the bytes it maps against its own image first. Where sharing is not
      possible the open still succeeds with a private copy, and a
      :class:`ShareWarning` says why (:meth:`Arena.share_state`).
      ``arena.torch.attach`` sets it under torch.distributed
      (docs/PYTHON.md, "Several processes: share_host"; docs/SHARING.md).
    share_card: other programs on the card, with ``vram=None``: the plan leaves this
      much of the device free at every step end (the larger of it and the headroom),
      and when another program takes memory so that less is free, the next step end
      gives memory back (blocks demoted until it is free again, or as far as the
      smallest plan goes: a :meth:`Arena.decisions` record with why ``"yield"``).
      True: the lesser of a tenth of the device and 2 GiB; a size (``"4G"``, bytes);
      a float above 0 and below 1: that fraction of the device. None, False or 0:
      none (arena follows the device's free memory, giving way only to memory
      others have taken). Its cost: what the share keeps off the device is streamed
      each step (docs/TUNING.md). With ``vram``: ``Error`` USAGE (a cap leaves the
      rest of the card to other programs already).

    Raises :class:`Error` (``code`` "BUDGET" when the model cannot run within
    ``vram`` at all; the message says what it needs).
    """
    o = _native.OpenOptions()
    backend: Optional[str] = None
    dev_id = 0
    if device is not None:
        if isinstance(device, int) and not isinstance(device, bool):
            backend, dev_id = "cuda", _check_int("device", device, ctypes.c_int)
        elif isinstance(device, str) and device == "sim":
            backend = "sim"
        elif isinstance(device, str) and (device == "cuda" or device.startswith("cuda:")):
            backend = "cuda"
            if ":" in device:
                try:
                    dev_id = int(device.split(":", 1)[1])
                except ValueError:
                    raise ValueError(f"device '{device}': expected cuda:N") from None
                dev_id = _check_int("device", dev_id, ctypes.c_int)
        else:
            raise ValueError(f"device {device!r}: use 'cuda', 'cuda:N', N, 'sim' or None")
    o.backend = backend.encode() if backend else None
    o.device = dev_id
    o.vram_cap = parse_size(vram, "vram") or 0
    o.pin_budget = parse_size(pin_budget, "pin_budget") or 0
    o.threads = 0 if threads is None else _check_int("threads", threads, ctypes.c_uint)
    o.quant = quant.encode() if quant else None
    o.mode = _mode(mode)
    # (2**64 - 1 is ARENA_ZERO_BYTES, "none": what 0 says here)
    h = parse_size(headroom, "headroom")
    h = None if h is None else _check_int("headroom", h, ctypes.c_uint64, top=_native.ZERO_BYTES)
    r = parse_size(reserve, "reserve")
    r = None if r is None else _check_int("reserve", r, ctypes.c_uint64, top=_native.ZERO_BYTES)
    o.headroom = 0 if h is None else (h or _native.ZERO_BYTES)
    o.reserve = 0 if r is None else (r or _native.ZERO_BYTES)
    o.depth = 0 if depth is None else _check_int("depth", depth, ctypes.c_uint)
    o.keep_last = 0 if keep_last is None else (
        _check_int("keep_last", keep_last, ctypes.c_uint, top=_native.ZERO_COUNT) or _native.ZERO_COUNT)
    o.flags = ((_native.OPEN_STRICT if strict else 0) | (0 if learn else _native.OPEN_NO_LEARN)
               | (_native.OPEN_PLAIN_STREAM if plain_stream else 0)
               | (_native.OPEN_RELEASE_HOST if release_host else 0)
               | (_native.OPEN_LEARN_REST if learn_rest else 0)
               | (_native.OPEN_SHARE_HOST if share_host else 0))
    o.profile = os.fsencode(profile) if profile else None
    o.sim_capacity = parse_size(sim_capacity, "sim_capacity") or 0
    o.sim_bandwidth = float(sim_bandwidth or 0)
    o.sim_context = parse_size(sim_context, "sim_context") or 0
    if isinstance(piece_size, str) and piece_size.strip().lower() == "auto":
        o.piece_size = _native.PIECE_AUTO
    else:
        try:
            ps = parse_size(piece_size, "piece_size") or 0
        except ValueError as e:
            raise ValueError(str(e).replace("is not a size", "is not a size or 'auto'", 1)) from None
        o.piece_size = _check_int("piece_size", ps, ctypes.c_uint64, top=_native.PIECE_AUTO)
    hb = parse_size(host_budget, "host_budget")
    hb = None if hb is None else _check_int("host_budget", hb, ctypes.c_uint64, top=_native.ZERO_BYTES)
    o.host_budget = 0 if hb is None else (hb or _native.ZERO_BYTES)
    if payback_steps is not None and (isinstance(payback_steps, bool) or not isinstance(payback_steps, int)
                                      or not 1 <= payback_steps < 2**32):
        raise ValueError(f"payback_steps: {payback_steps!r}: a whole number of steps, 1 or more")
    o.payback_steps = payback_steps or 0
    if share_card is True:
        o.share_card = _native.SHARE_CARD_DEFAULT
    elif isinstance(share_card, float):
        if not 0 < share_card < 1:
            raise ValueError(f"share_card: {share_card!r}: a fraction of the device above 0 and below 1, a size "
                             f"('4G'), or True")
        o.share_card_fraction = share_card
    elif share_card is not None and share_card is not False:
        sc = parse_size(share_card, "share_card") or 0
        o.share_card = _check_int("share_card", sc, ctypes.c_uint64, top=_native.SHARE_CARD_DEFAULT)
    out = ctypes.c_void_p()
    p = os.fspath(path)
    _check(_native.lib.arena_open(os.fsencode(p), ctypes.byref(o), ctypes.byref(out)))
    if not out.value:  # (arena_open gives a handle whenever it returns 0; never wrap NULL)
        raise Error("INTERNAL", f"{p}: arena_open succeeded without a handle")
    a = Arena(out.value, p)
    a._device_id = dev_id
    if share_host:
        state, why = a.share_state()
        if state == "private":
            warnings.warn(f"arena: {p}: {why}; this process holds a host copy of its own", ShareWarning,
                          stacklevel=2)
    return a
