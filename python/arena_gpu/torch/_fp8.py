"""Native FP8: a Linear's weight stored fp8-e4m3 (no scale, one scale, or one a
row) computed with as its FP8 bytes are, no dequantized copy.

``Fp8Weight`` is a tensor subclass of the weight's dtype and shape holding
``qdata`` (F8_E4M3, the image's bytes) and ``scale`` (F32, [1] or [rows, 1];
none for fp8-e4m3), bound to arena memory as any tensor subclass's inner
tensors are (_quant.py). ``F.linear`` on it:

- native (a GPU with FP8 matmuls: compute capability 8.9 or more): the input
  is quantized to FP8 per row on the fly (scale = max(amax(|row|) / 448,
  1e-12), as arena's fp8-e4m3-row; once for the Linears that read the same
  tensor unchanged, as a block's q, k and v projections do), and
  ``torch._scaled_mm`` multiplies the FP8 bytes with both scales (the
  weight's per row, or its one scale spread to every row), bias added in
  the kernel, the output in the weight's dtype; through an autograd
  function where autograd records the product, alone where not.
  The input's gradient (what LoRA training needs through a frozen weight),
  ``grad_out @ W``, is an FP8 product too (``GRAD_FP8``, the default): the
  output's gradient times the weight's row scales (W = diag(s) Q, so
  grad_out @ W = (grad_out s) @ Q) quantized per row the same way (one
  pass: arena_fp8_quantize_rows_scaled), multiplied with the weight's FP8
  bytes transposed (a transient copy of one weight at a time, which
  _scaled_mm needs column-major: one pass of arena_fp8_transpose where
  attached), a tensor scale as the second operand's. On the H200 it is
  faster than the dequantized weight's BF16 product on all six of
  FLUX.1-dev's shapes (and than the BF16 weight's on three), and the whole
  model's training step is 0.93 x the BF16 model's (docs/QUANT.md). With
  ``GRAD_FP8`` off it takes W dequantized for that product only: by arena's
  kernel (one pass, as at a bind) where the weight is bound to an arena's
  block (``src``), else by torch. Not
  bit-identical to the dequantized path: the input (and with GRAD_FP8 the
  gradient) is rounded to FP8 (3 mantissa bits); bench/gpu_fp8_check.py
  measures the difference.
- otherwise (CPU, the simulated device, a GPU without FP8, a shape
  ``_scaled_mm`` does not take: dimensions not multiples of 16): ``F.linear``
  on the dequantized weight, ``(qdata.float() * scale).to(dtype)`` (arena's
  kernel where bound, as above), made for the call and let go after it
  (autograd keeps it for the backward): bit for bit the dequantized path's
  outputs and gradients.

Any other operation on the weight sees its dequantized values.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from .. import Error, _native

_FP8_MAX = 448.0

# The input's gradient through a native FP8 weight as an FP8 product (True, the
# default: its weight's bytes transposed by arena's kernel, faster than the
# dequantized weight's BF16 product on the H200) or with the weight dequantized
# for it (False: the closer gradient; bench/gpu_fp8_check.py measures both).
GRAD_FP8 = True


_HAS_FP8: Dict[Any, bool] = {}  # by device: asked for every product, answered once


def device_has_fp8(device: torch.device) -> bool:
    """A CUDA device whose tensor cores multiply FP8 (Ada, Hopper and later)."""
    if device.type != "cuda":
        return False
    key = device.index
    have = _HAS_FP8.get(key)
    if have is None:
        have = torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 9)
        _HAS_FP8[key] = have
    return have


def dequantize(qdata: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The weight's values: (qdata x scale) in f32, rounded once to dtype (docs/QUANT.md)."""
    v = qdata.float()
    if scale is not None:
        v = v * scale
    return v.to(dtype)


# How dequantize_fast computes on a kind of device: 2, ``torch.mul(qdata, scale,
# out=<dtype>)`` (one pass: the FP8 bytes read, dtype written); 1, qdata as f32 and
# then that mul (two); 0, dequantize's three. Learned at the first use, each
# way checked against dequantize there.
_DEQ_WAY: Dict[str, int] = {}


def _deq_way(qdata: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, way: int) -> bool:
    """dequantize into out in way 2 or 1; False where torch does not take it."""
    try:
        torch.mul(qdata if way == 2 else qdata.float(), scale, out=out)
    except (RuntimeError, TypeError):
        return False
    return True


def dequantize_fast(qdata: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """dequantize's bits in fewer passes over memory where torch can (the f32
    product rounded once to dtype on the store; dequantize writes and reads an f32
    copy twice more): the input's gradient through a native FP8 weight takes one
    such copy per product."""
    if scale is None or scale.dtype != torch.float32:
        return dequantize(qdata, scale, dtype)
    kind = qdata.device.type
    way = _DEQ_WAY.get(kind)
    if way == 0:
        return dequantize(qdata, scale, dtype)
    out = torch.empty(qdata.shape, dtype=dtype, device=qdata.device)
    if way is not None:
        if _deq_way(qdata, scale, out, way):
            return out
        _DEQ_WAY[kind] = 0  # (not for this dtype or layout: dequantize's from now on)
        return dequantize(qdata, scale, dtype)
    want = dequantize(qdata, scale, dtype)
    for way in (2, 1):
        if _deq_way(qdata, scale, out, way) and torch.equal(out, want):
            _DEQ_WAY[kind] = way
            return out
    _DEQ_WAY[kind] = 0
    return want


# Arenas open on a GPU whose library quantizes rows and transposes FP8 bytes in
# one kernel each (arena_fp8_quantize_rows, arena_fp8_transpose), by CUDA device
# index (quantize_rows' and transposed's lookup: x.get_device()): attach(...,
# fp8_compute=True) adds its arena while attached. Without one, they take
# torch's ops.
_ROWS_CUDA: Dict[int, List[Any]] = {}


def use_arena(arena: Any) -> Callable[[], None]:
    """Let quantize_rows use ``arena``'s kernel for tensors on its GPU; returns the
    undo (attach's detach runs it). An arena elsewhere (the simulated device) has no
    kernel to lend: nothing to undo."""
    dev = torch.device(str(arena.device))
    if dev.type != "cuda":
        return lambda: None
    idx = dev.index if dev.index is not None else 0
    _ROWS_CUDA.setdefault(idx, []).append(arena)

    def undo() -> None:
        by_index = _ROWS_CUDA.get(idx, [])
        if arena in by_index:
            by_index.remove(arena)
        if not by_index:
            _ROWS_CUDA.pop(idx, None)

    return undo


def _raw_stream(index: int) -> int:
    """The current CUDA stream of device ``index``, as a pointer."""
    return torch.cuda.current_stream(index).cuda_stream


_raw_stream_fast: Callable[[int], int] = getattr(torch._C, "_cuda_getCurrentRawStream", _raw_stream)


def quantize_rows(x: torch.Tensor, col_scale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (times col_scale [K], f32, column by column, where given) to FP8 e4m3
    with one f32 scale a row, [M, 1] (arena's fp8-e4m3-row rule): one pass of arena's
    kernel where an arena on x's GPU can (BF16, contiguous), else torch's ops; the
    same bytes either way."""
    idx = x.get_device()  # -1 on the CPU
    arenas = _ROWS_CUDA.get(idx) if idx >= 0 and x.is_cuda else None
    if (arenas and x.dtype == torch.bfloat16 and x.dim() == 2 and x.is_contiguous()
            and (col_scale is None or (col_scale.dtype == torch.float32 and col_scale.is_contiguous()
                                       and col_scale.get_device() == idx and col_scale.shape == (x.shape[1],)))):
        rows, cols = x.shape
        q = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
        a = arenas[-1]
        st = _raw_stream_fast(idx)
        # torch's pointers and sizes, in range: the library's entries without the
        # Python binding's argument checks (one call per product)
        if col_scale is None:
            rc = _native.lib.arena_fp8_quantize_rows(a._handle(), x.data_ptr(), rows, cols, q.data_ptr(),
                                                     s.data_ptr(), st)
        else:
            rc = _native.lib.arena_fp8_quantize_rows_scaled(a._handle(), x.data_ptr(), rows, cols,
                                                            col_scale.data_ptr(), q.data_ptr(), s.data_ptr(), st)
        if rc:
            raise Error.from_code(rc)
        return q, s
    return quantize_rows_torch(x, col_scale)


_MAX_ON: Dict[torch.device, torch.Tensor] = {}  # 448 on each device (quantize_rows_torch)


def quantize_rows_torch(x: torch.Tensor, col_scale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows by torch's ops (several passes over x). The 448 is a tensor on
    x's device: torch's CUDA kernels divide by a CPU scalar as a product by its
    reciprocal, which is not the rule's division (another scale for some rows)."""
    xf = x.float()
    if col_scale is not None:
        xf = xf * col_scale.float()
    d = _MAX_ON.get(x.device)
    if d is None:
        d = _MAX_ON[x.device] = torch.tensor(_FP8_MAX, device=x.device)
    s = (xf.abs().amax(dim=1, keepdim=True) / d).clamp(min=1e-12)
    q = (xf / s).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    return q, s


# The last input a native product quantized: (a weak reference to it, its version,
# the stream its rows were made on, its FP8 rows and their scales). The Linears
# that read one activation (a block's q, k and v projections) quantize it once; a
# tensor changed in place since (its version), another tensor, or a product on
# another stream (the rows would be read unordered with their making) quantizes
# anew. Weak: the activation's life is its own; the rows go with it.
_LAST: Optional[Tuple[Any, int, int, torch.Tensor, torch.Tensor]] = None


def _forget(ref: Any) -> None:
    global _LAST
    last = _LAST
    if last is not None and last[0] is ref:
        _LAST = None


def forget_rows() -> None:
    """Let the last input's rows go (a step's end: its activations are not the next
    step's)."""
    global _LAST
    _LAST = None


def rows_of(x: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows of x as [-1, k], or what the last call gave for this very tensor
    unchanged on the same stream (not for inference tensors, which keep no version)."""
    global _LAST
    last = _LAST
    idx = x.get_device()
    st = _raw_stream_fast(idx) if idx >= 0 and x.is_cuda else 0
    if (last is not None and last[0]() is x and not x.is_inference() and last[1] == x._version
            and last[2] == st):
        return last[3], last[4]
    # (detached: the rows are not differentiated, and torch's ops where arena's
    # kernel does not take x would otherwise record them and keep what they save,
    # an f32 copy of x among it, until the backward)
    xq, xs = quantize_rows(x.detach().reshape(-1, k))
    if not x.is_inference():
        _LAST = (weakref.ref(x, _forget), x._version, st, xq, xs)
    return xq, xs


# What a native product needs of its weight, made once a binding (Fp8Weight.bound_native):
# (qdata [N, K], scale, qdata.t() (the column-major [K, N] _scaled_mm wants: the same
# bytes), the weight's scales as _scaled_mm's [1, N] row operand, the output dtype, the
# weight's src (dequantize_bound)).
Native = Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor, torch.Tensor, torch.dtype,
               Optional[Tuple[Any, int, int]]]


def native_args(qdata: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype,
                src: Optional[Tuple[Any, int, int]] = None) -> Native:
    """A weight's Native: its FP8 bytes transposed as a view and its scales as _scaled_mm's
    row operand (one a row: the same bytes; one scale or none: spread to every row)."""
    n = qdata.shape[0]
    if scale is not None and scale.dtype == torch.float32 and scale.numel() == n and scale.is_contiguous():
        ws = scale.view(1, n)  # one a row: [n, 1] and [1, n] are the same bytes
    else:
        ws = _spread_scale(scale, n, qdata.device)
    return (qdata, scale, qdata.t(), ws, dtype, src)


def product(x: torch.Tensor, b: Optional[torch.Tensor], xq: torch.Tensor, xs: torch.Tensor,
            nat: Native) -> torch.Tensor:
    """x @ W.T (+ b) by torch._scaled_mm from x's FP8 rows (xq, xs: quantize_rows of x as
    [-1, K]) and the weight's ``nat``: bias added in the kernel, the output in the
    weight's dtype, shaped as x with N last."""
    qt, ws, dtype = nat[2], nat[3], nat[4]
    if b is not None and b.dtype != dtype:
        b = b.to(dtype)
    out = torch._scaled_mm(xq, qt, scale_a=xs, scale_b=ws, bias=b, out_dtype=dtype)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[1])


def scaled_linear(x: torch.Tensor, qdata: torch.Tensor, scale: Optional[torch.Tensor],
                  bias: Optional[torch.Tensor], dtype: torch.dtype,
                  xqs: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """x @ W.T (+ bias) with torch._scaled_mm: x quantized per row (or ``xqs``, its
    quantize_rows already made), W's FP8 bytes as they are (product on the weight's
    native_args)."""
    xq, xs = xqs if xqs is not None else quantize_rows(x.reshape(-1, qdata.shape[1]))
    return product(x, bias, xq, xs, native_args(qdata, scale, dtype))


def _spread_scale(scale: Optional[torch.Tensor], n: int, device: torch.device) -> torch.Tensor:
    """A weight's one scale (or none: 1) as _scaled_mm's [1, n] row-wise operand."""
    if scale is None:
        return torch.ones(1, n, dtype=torch.float32, device=device)
    return scale.reshape(-1, 1).float().expand(n, 1).reshape(1, n).contiguous()


_ONES: Dict[Tuple[int, int], torch.Tensor] = {}  # (device index, k): [1, k] f32 ones (scaled_grad_input)


def transposed(qdata: torch.Tensor) -> torch.Tensor:
    """Q [n, k] (FP8) as [k, n] rows, Q.T made contiguous: arena's kernel in one pass
    where an arena on its GPU can (arena_fp8_transpose), else torch's copy; the same
    bytes either way."""
    idx = qdata.get_device()
    arenas = _ROWS_CUDA.get(idx) if idx >= 0 and qdata.is_cuda else None
    if arenas and qdata.dim() == 2 and qdata.is_contiguous():
        n, k = qdata.shape
        t = torch.empty((k, n), dtype=qdata.dtype, device=qdata.device)
        rc = _native.lib.arena_fp8_transpose(arenas[-1]._handle(), qdata.data_ptr(), n, k, t.data_ptr(),
                                             _raw_stream_fast(idx))
        if rc:
            raise Error.from_code(rc)
        return t
    return qdata.view(torch.uint8).t().contiguous().view(qdata.dtype)


def scaled_grad_input(grad: torch.Tensor, qdata: torch.Tensor, scale: Optional[torch.Tensor],
                      dtype: torch.dtype) -> torch.Tensor:
    """grad @ W (the input's gradient through W = diag(scale) Q) as an FP8 product:
    grad times the weight's row scales, quantized per row, against Q's bytes
    transposed (_scaled_mm's second operand is column-major: Q.T's rows; Hopper's FP8
    products read both operands along the reduced dimension, here N); a weight with
    one scale gives it as the second operand's, spread to every column."""
    n, k = qdata.shape
    lead = grad.shape[:-1]
    g2 = grad.reshape(-1, n)
    if g2.dtype != torch.bfloat16:
        g2 = g2.to(torch.bfloat16)
    g2 = g2.contiguous()
    if scale is not None and scale.numel() == n and n > 1:
        cs = scale.view(n) if scale.dtype == torch.float32 and scale.is_contiguous() else \
            scale.reshape(n).float().contiguous()
        gq, gs = quantize_rows(g2, cs)
        key = (qdata.get_device(), k)
        sb = _ONES.get(key)
        if sb is None:
            sb = _ONES[key] = torch.ones(1, k, dtype=torch.float32, device=qdata.device)
    else:
        gq, gs = quantize_rows(g2)
        one = scale.reshape(1, 1).float() if scale is not None else torch.ones(1, 1, device=qdata.device)
        sb = one.expand(1, k).contiguous()
    out = torch._scaled_mm(gq, transposed(qdata).t(), scale_a=gs, scale_b=sb, out_dtype=dtype)
    return out.view(*lead, k)


def dequantize_bound(qdata: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype,
                     src: Optional[Tuple[Any, int, int]]) -> torch.Tensor:
    """The weight's values for the input's gradient: by arena's kernel in one pass
    where ``src`` (the arena, the C index of the image tensor, qdata's offset in its
    block or piece) says where qdata's block starts, on torch's current stream (the
    same bits as dequantize: docs/QUANT.md); else dequantize_fast."""
    if src is None:
        return dequantize_fast(qdata, scale, dtype)
    arena, index, offset = src
    out = torch.empty(qdata.shape, dtype=dtype, device=qdata.device)
    idx = qdata.get_device()  # -1: the simulated device's host memory, no stream
    # the block's address is what the bind gave (checked by the library: USAGE if not)
    rc = _native.lib.arena_tensor_dequantize(arena._handle(), index, qdata.data_ptr() - offset, out.data_ptr(),
                                            _raw_stream_fast(idx) if idx >= 0 else None)
    if rc:
        raise Error.from_code(rc)
    return out


class _ScaledLinear(torch.autograd.Function):
    """Native FP8 linear through a frozen weight (its ``nat``): x's gradient (an FP8
    product too when GRAD_FP8 was on at the forward, else with W dequantized for it: by
    arena's kernel where the weight's src is given, see dequantize_bound) and the
    bias's. ``xq``/``xs``: x's rows, or None to quantize x here."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, b: Optional[torch.Tensor], xq: Optional[torch.Tensor],
                xs: Optional[torch.Tensor], nat: Native) -> torch.Tensor:
        # the weight's tensors through save_for_backward: checkpointing and arena's
        # saved-tensor hooks give the backward the binding current then (a streamed
        # block's forward-time address may hold another block by its backward). A
        # weight bound to an arena's block (src) is dequantized by arena's kernel
        # from its bytes' address alone (the scales are read from the block): its
        # qdata only, one saved tensor a product fewer (each one a pack and an
        # unpack through checkpointing's hooks, and their objects).
        if nat[5] is not None and not GRAD_FP8:
            ctx.save_for_backward(nat[0])
        else:
            ctx.save_for_backward(nat[0], nat[1])
        ctx.dtype_src = (nat[4], nat[5])
        ctx.fp8_grad = GRAD_FP8
        if xq is None or xs is None:
            xq, xs = quantize_rows(x.reshape(-1, nat[0].shape[1]))
        return product(x, b, xq, xs, nat)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        saved = ctx.saved_tensors
        qdata, scale = saved[0], saved[1] if len(saved) > 1 else None
        dtype, src = ctx.dtype_src
        gx = gb = None
        if ctx.needs_input_grad[0]:
            if ctx.fp8_grad:
                gx = scaled_grad_input(grad, qdata, scale, dtype)
            else:
                gx = grad.to(dtype).matmul(dequantize_bound(qdata, scale, dtype, src))
        if ctx.needs_input_grad[1]:
            gb = grad.reshape(-1, grad.shape[-1]).sum(0)
        return gx, gb, None, None, None


# _ScaledLinear.apply without autograd.Function.apply's Python part (default arguments
# bound, functorch's wrappers unwrapped: nothing to do for this function's arguments
# outside functorch's transforms, which take the documented apply); about 5 µs of host
# a product, hundreds of products a step.
def _bare_apply() -> Callable[..., Any]:
    """_ScaledLinear's apply from torch's C base class, or the documented one where a
    torch has none to give."""
    raw = getattr(getattr(torch._C, "_FunctionBase", None), "__dict__", {}).get("apply")
    get = getattr(raw, "__get__", None)
    return get(None, _ScaledLinear) if get is not None else _ScaledLinear.apply


_apply_base: Callable[..., Any] = _bare_apply()
_functorch_active: Callable[[], bool] = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)


def native_ok(qdata: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> bool:
    """_scaled_mm takes it: FP8 device, K and N multiples of 16, a bf16 output
    (row-wise scaling gives bf16), the input on the weight's device."""
    return _weight_native(qdata, dtype) and _input_ok(qdata.shape[1], qdata.get_device(), x)


def _weight_native(qdata: torch.Tensor, dtype: torch.dtype) -> bool:
    """native_ok's part that is the weight's own (its shape, dtype and device)."""
    n, k = qdata.shape
    return dtype == torch.bfloat16 and n % 16 == 0 and k % 16 == 0 and device_has_fp8(qdata.device)


def _input_ok(k: int, device: int, x: torch.Tensor) -> bool:
    """native_ok's part that is the input's: a float on the weight's device (its
    index), as wide as the weight (k)."""
    return x.shape[-1] == k and x.get_device() == device and x.is_floating_point()


class Fp8Weight(torch.Tensor):
    """A frozen FP8 weight (arena's fp8-e4m3 schemes) that a Linear computes with natively."""

    # qdata, scale and src are properties: setting one (a binding repoints qdata and
    # scale at other bytes of the same shape, dtype and device) drops the products'
    # Native made from them. A tensor subclass's own properties (dtype...) go through
    # __torch_function__, a microsecond each: the hot path reads plain attributes.
    _q: torch.Tensor
    _s: Optional[torch.Tensor]
    _src: Optional[Tuple[Any, int, int]]
    _nat: Optional[Native]
    _dt: torch.dtype
    _native_here: bool
    _k: int
    _dev: int
    native: bool

    @staticmethod
    def __new__(cls, qdata: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype,
                native: bool) -> "Fp8Weight":
        return torch.Tensor._make_wrapper_subclass(
            cls, qdata.shape, dtype=dtype, device=qdata.device, requires_grad=False)

    def __init__(self, qdata: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype, native: bool):
        self._q = qdata
        self._s = scale
        self._src = None
        self._nat = None
        self._dt = dtype
        self.native = native
        # the weight's part of native_ok (and its width and device for the input's
        # part), asked once: a binding keeps shape, dtype and device
        self._native_here = native and _weight_native(qdata, dtype)
        self._k, self._dev = qdata.shape[1], qdata.get_device()

    @property
    def qdata(self) -> torch.Tensor:
        """The FP8 bytes, [N, K] (F8_E4M3)."""
        return self._q

    @qdata.setter
    def qdata(self, v: torch.Tensor) -> None:
        self._q = v
        self._nat = None

    @property
    def scale(self) -> Optional[torch.Tensor]:
        """F32 scales: [1], [N, 1], or None (fp8-e4m3: 1)."""
        return self._s

    @scale.setter
    def scale(self, v: Optional[torch.Tensor]) -> None:
        self._s = v
        self._nat = None

    @property
    def src(self) -> Optional[Tuple[Any, int, int]]:
        """(arena, C index of the image tensor, qdata's offset in its block or piece):
        set by attach, for the backward's dequantization by arena's kernel."""
        return self._src

    @src.setter
    def src(self, v: Optional[Tuple[Any, int, int]]) -> None:
        self._src = v
        self._nat = None

    def bound_native(self) -> Native:
        """native_args of the bytes bound now (made once a binding)."""
        nat = self._nat
        if nat is None:
            nat = self._nat = native_args(self._q, self._s, self._dt, self._src)
        return nat

    def __repr__(self) -> str:  # type: ignore[override]
        return f"Fp8Weight({tuple(self.shape)}, {self.dtype}, native={self.native})"

    def __tensor_flatten__(self) -> Tuple[list, Dict[str, Any]]:
        names = ["qdata"] if self._s is None else ["qdata", "scale"]
        return names, {"dtype": self._dt, "native": self.native}

    @staticmethod
    def __tensor_unflatten__(inner: Dict[str, torch.Tensor], ctx: Dict[str, Any], size: Any,
                             stride: Any) -> "Fp8Weight":
        return Fp8Weight(inner["qdata"], inner.get("scale"), ctx["dtype"], ctx["native"])

    def dequantize(self) -> torch.Tensor:
        return dequantize(self._q, self._s, self._dt)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is F.linear:
            x, w = args[0], args[1]
            b = args[2] if len(args) > 2 else (kwargs.get("bias") if kwargs else None)
            if isinstance(w, Fp8Weight) and not isinstance(x, Fp8Weight) and not isinstance(b, Fp8Weight):
                if w._native_here and _input_ok(w._k, w._dev, x):
                    return _native_linear(x, w, b)
                return F.linear(x, dequantize_bound(w._q, w._s, w._dt, w._src), b)
        # anything else goes down to __torch_dispatch__ (detach keeps the type there)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        kwargs = kwargs or {}
        if func is torch.ops.aten.detach.default:  # nn.Parameter(w) and .detach(): the same bytes
            w = args[0]
            out = Fp8Weight(w._q, w._s, w._dt, w.native)
            out.src = w._src
            return out
        return func(*_plain(args), **_plain(kwargs))


def _native_linear(x: torch.Tensor, w: Fp8Weight, b: Optional[torch.Tensor]) -> torch.Tensor:
    """F.linear(x, w, b) natively (native_ok holds): through _ScaledLinear where autograd
    records it, else the product alone (sampling: no autograd function's cost)."""
    nat = w.bound_native()
    xq, xs = rows_of(x, w._k)
    if torch.is_grad_enabled() and (x.requires_grad or (b is not None and b.requires_grad)):
        if _functorch_active():
            out: torch.Tensor = _ScaledLinear.apply(x, b, xq, xs, nat)
        else:
            out = _apply_base(x, b, xq, xs, nat)
        return out
    return product(x, b, xq, xs, nat)


def _plain(tree: Any) -> Any:
    return tree_map(lambda a: a.dequantize() if isinstance(a, Fp8Weight) else a, tree)
