"""ctypes declarations of libarena's public C API (include/arena.h).

Private: the public Python surface is in ``arena`` and ``arena.torch``.
Every struct's size is checked against the library's own ``arena_sizeof`` at
import, so a binding and a library that disagree fail at once, not later.
"""

from __future__ import annotations

import ctypes
import operator
import os
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any, Optional

ZERO_BYTES = (1 << 64) - 1  # ARENA_ZERO_BYTES: headroom / reserve explicitly none
ZERO_COUNT = (1 << 32) - 1  # ARENA_ZERO_COUNT: keep_last explicitly none
MODE_SAMPLE = 0
MODE_TRAIN = 1
PIECE_AUTO = (1 << 64) - 1  # ARENA_PIECE_AUTO
OPEN_STRICT = 1
OPEN_NO_LEARN = 2
OPEN_FIXED_SCHEDULE = 4
OPEN_PLAIN_STREAM = 8
OPEN_RELEASE_HOST = 16
OPEN_LEARN_REST = 32
OPEN_SHARE_HOST = 64
SHARE_STATES = ("off", "loaded", "mapped", "private")  # ARENA_SHARE_OFF .. ARENA_SHARE_PRIVATE
SHARE_CARD_DEFAULT = (1 << 64) - 1  # ARENA_SHARE_CARD_DEFAULT
REST_OOM = 1  # ARENA_REST_OOM


class OpenOptions(Structure):
    _fields_ = [
        ("backend", c_char_p),
        ("device", c_int),
        ("vram_cap", c_uint64),
        ("pin_budget", c_uint64),
        ("threads", c_uint),
        ("quant", c_char_p),
        ("mode", c_int),
        ("headroom", c_uint64),
        ("reserve", c_uint64),
        ("depth", c_uint),
        ("keep_last", c_uint),
        ("hysteresis", c_uint),
        ("flags", c_uint),
        ("profile", c_char_p),
        ("sim_capacity", c_uint64),
        ("sim_bandwidth", c_double),
        ("piece_size", c_uint64),
        ("host_budget", c_uint64),
        ("payback_steps", c_uint),
        ("sim_context", c_uint64),
        ("share_card", c_uint64),
        ("share_card_fraction", c_double),
    ]


class RestInfo(Structure):
    _fields_ = [("now", c_uint64), ("peak", c_uint64), ("work", c_uint64), ("flags", c_uint)]


class MemoryInfo(Structure):
    _fields_ = [
        ("cap", c_uint64),
        ("process", c_uint64),
        ("other", c_uint64),
        ("arena", c_uint64),
        ("rest", c_uint64),
        ("rest_need", c_uint64),
        ("rest_limit", c_uint64),
        ("headroom", c_uint64),
        ("learned", c_int),
        ("other_measured", c_int),
        ("works", c_uint),
        ("share_card", c_uint64),
    ]


class BlockInfo(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("container", c_char_p),
        ("index", c_int64),
        ("bytes", c_uint64),
        ("resident", c_int),
        ("device", c_void_p),
        ("host", c_void_p),
        ("coded", c_int),
    ]


class _Component(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_char_p),
        ("rank", c_uint32),
        ("shape", POINTER(c_uint64)),
        ("bytes", c_uint64),
        ("offset", c_uint64),
        ("device", c_void_p),
        ("host", c_void_p),
    ]


class TensorInfo(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_char_p),
        ("rank", c_uint32),
        ("shape", POINTER(c_uint64)),
        ("scheme", c_char_p),
        ("block", c_uint32),
        ("n_components", c_uint32),
        ("component", _Component * 4),
    ]


class StepInfo(Structure):
    _fields_ = [
        ("step", c_uint64),
        ("mode", c_int),
        ("budget", c_uint64),
        ("free_bytes", c_uint64),
        ("resident_bytes", c_uint64),
        ("ring_bytes", c_uint64),
        ("streamed_bytes", c_uint64),
        ("copies", c_uint64),
        ("promoted_bytes", c_uint64),
        ("acquires", c_uint64),
        ("misses", c_uint),
        ("demotions", c_uint),
        ("promotions", c_uint),
        ("over_budget", c_int),
        ("schedule_learned", c_int),
        ("stopped_early", c_int),
        ("profile_learned", c_int),
        ("gpu_timed", c_int),
        ("stalls", c_uint),
        ("stall_s", c_double),
        ("compute_s", c_double),
        ("end_s", c_double),
        ("plan_s", c_double),
        ("move_s", c_double),
        ("disk_bytes", c_uint64),
        ("moved_bytes", c_uint64),
        ("disk_wait_s", c_double),
        ("looked", c_int),
        ("look_s", c_double),
        ("look_now_s", c_double),
        ("look_plan_s", c_double),
        ("move_est_s", c_double),
        ("move_gain_s", c_double),
        ("move_held", c_int),
        ("host_read_bytes", c_uint64),
        ("prepared_bytes", c_uint64),
    ]


class DecisionInfo(Structure):
    _fields_ = [
        ("step", c_uint64),
        ("between", c_int),
        ("why", c_int),
        ("why_name", c_char_p),
        ("promoted", c_uint),
        ("demoted", c_uint),
        ("promoted_bytes", c_uint64),
        ("demoted_bytes", c_uint64),
        ("resident_before", c_uint64),
        ("resident_after", c_uint64),
        ("ring_before", c_uint64),
        ("ring_after", c_uint64),
        ("budget", c_uint64),
        ("free_bytes", c_uint64),
        ("stream_before", c_uint64),
        ("stream_after", c_uint64),
        ("step_before_s", c_double),
        ("step_after_s", c_double),
    ]


class ShareInfo(Structure):
    _fields_ = [
        ("state", c_int),
        ("why", ctypes.c_char * 320),
        ("check_s", c_double),
        ("checked_bytes", c_uint64),
        ("check_read_bytes", c_uint64),
    ]


class PlanInfo(Structure):
    _fields_ = [
        ("mode", c_int),
        ("budget", c_uint64),
        ("headroom", c_uint64),
        ("reserve", c_uint64),
        ("globals_bytes", c_uint64),
        ("resident_bytes", c_uint64),
        ("streamed_block_bytes", c_uint64),
        ("slot_bytes", c_uint64),
        ("slots", c_uint),
        ("depth", c_uint),
        ("need_bytes", c_uint64),
        ("min_need_bytes", c_uint64),
        ("stream_bytes_per_step", c_uint64),
        ("copies_per_step", c_uint64),
        ("n_resident", c_size_t),
        ("n_streamed", c_size_t),
        ("schedule_length", c_size_t),
        ("predicted_step_s", c_double),
        ("piece_size", c_uint64),
        ("host_bytes", c_uint64),
        ("n_disk", c_size_t),
        ("host_budget", c_uint64),
        ("staging_bytes", c_uint64),
    ]


# arena_progress_fn: int (*)(void *ctx, uint64_t done, uint64_t total)
PROGRESS_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_uint64, c_uint64)


class ConvertOptions(Structure):
    _fields_ = [
        ("block_patterns", POINTER(c_char_p)),
        ("n_block_patterns", c_size_t),
        ("block_order", POINTER(c_char_p)),
        ("n_block_order", c_size_t),
        ("quant", c_char_p),
        ("quant_include", POINTER(c_char_p)),
        ("n_quant_include", c_size_t),
        ("quant_exclude", POINTER(c_char_p)),
        ("n_quant_exclude", c_size_t),
        ("chunk_size", c_uint64),
        ("codec", c_char_p),
        ("zstd_level", c_int),
        ("threads", c_uint),
        ("progress", PROGRESS_FN),
        ("progress_ctx", c_void_p),
        ("force", c_int),
        ("read_back", c_int),
    ]


class ConvertInfo(Structure):
    _fields_ = [
        ("file_size", c_uint64),
        ("data_bytes", c_uint64),
        ("stored_bytes", c_uint64),
        ("chunk_count", c_uint64),
        ("coded_chunks", c_uint64),
        ("n_blocks", c_uint64),
        ("n_tensors", c_uint64),
    ]


class BadChunk(Structure):
    _fields_ = [
        ("chunk", c_uint64),
        ("offset", c_uint64),
        ("length", c_uint64),
        ("expected", c_uint64),
        ("actual", c_uint64),
        ("blocks", POINTER(c_char_p)),
        ("n_blocks", c_size_t),
        ("tensors", POINTER(c_char_p)),
        ("n_tensors", c_size_t),
    ]


BAD_CHUNK_FN = ctypes.CFUNCTYPE(None, c_void_p, POINTER(BadChunk))


class VerifyOptions(Structure):
    _fields_ = [
        ("threads", c_uint),
        ("progress", PROGRESS_FN),
        ("progress_ctx", c_void_p),
        ("bad_chunk", BAD_CHUNK_FN),
        ("bad_chunk_ctx", c_void_p),
    ]


class VerifyInfo(Structure):
    _fields_ = [
        ("opened", c_int),
        ("file_size", c_uint64),
        ("chunk_count", c_uint64),
        ("bad_chunks", c_uint64),
        ("seconds", c_double),
    ]


def _find_library() -> str:
    env = os.environ.get("ARENA_LIBRARY")
    if env:
        return env
    here = Path(__file__).resolve().parent
    for cand in (here / "libarena.so", here.parent.parent / "build" / "libarena.so"):
        if cand.exists():
            return str(cand)
    raise ImportError(
        "arena: libarena.so not found: not in the package (pip install builds it) nor in the "
        "repository's build/ (make lib); set ARENA_LIBRARY to its path"
    )


lib = ctypes.CDLL(_find_library())

_P = c_void_p  # arena *
_SIGS = {
    "arena_err_name": (c_char_p, [c_int]),
    "arena_strerror": (c_char_p, [c_int]),
    "arena_err_class": (c_int, [c_int]),
    "arena_last_error": (c_char_p, []),
    "arena_version": (c_char_p, []),
    "arena_sizeof": (c_size_t, [c_char_p]),
    "arena_open": (c_int, [c_char_p, POINTER(OpenOptions), POINTER(c_void_p)]),
    "arena_close": (None, [_P]),
    "arena_retain": (c_int, [_P]),
    "arena_release": (None, [_P]),
    "arena_dlpack": (c_int, [_P, c_void_p, c_uint64, c_int, c_int, POINTER(c_void_p)]),
    "arena_backend_name": (c_char_p, [_P]),
    "arena_block_count": (c_size_t, [_P]),
    "arena_block_get": (c_int, [_P, c_size_t, POINTER(BlockInfo)]),
    "arena_block_find": (c_int, [_P, c_char_p, POINTER(c_size_t)]),
    "arena_tensor_count": (c_size_t, [_P]),
    "arena_tensor_get": (c_int, [_P, c_size_t, POINTER(TensorInfo)]),
    "arena_tensor_find": (c_int, [_P, c_char_p, POINTER(c_size_t)]),
    "arena_tensor_subclass": (c_char_p, [_P, c_size_t]),
    "arena_tensor_dequantize": (c_int, [_P, c_size_t, c_void_p, c_void_p, c_void_p]),
    "arena_fp8_quantize_rows": (c_int, [_P, c_void_p, c_uint64, c_uint64, c_void_p, c_void_p, c_void_p]),
    "arena_fp8_quantize_rows_scaled": (c_int, [_P, c_void_p, c_uint64, c_uint64, c_void_p, c_void_p, c_void_p,
                                               c_void_p]),
    "arena_fp8_transpose": (c_int, [_P, c_void_p, c_uint64, c_uint64, c_void_p, c_void_p]),
    "arena_step_begin": (c_int, [_P]),
    "arena_block_acquire": (c_int, [_P, c_size_t, c_void_p, POINTER(c_void_p)]),
    "arena_block_release": (c_int, [_P, c_size_t, c_void_p]),
    "arena_step_end": (c_int, [_P]),
    "arena_set_mode": (c_int, [_P, c_int]),
    "arena_set_rest_memory": (c_int, [_P, c_uint64]),
    "arena_rest_report": (c_int, [_P, POINTER(RestInfo)]),
    "arena_memory_get": (c_int, [_P, POINTER(MemoryInfo)]),
    "arena_block_keep_host": (c_int, [_P, c_size_t]),
    "arena_mode": (c_int, [_P]),
    "arena_sync": (c_int, [_P]),
    "arena_step_count": (c_uint64, [_P]),
    "arena_step_get": (c_int, [_P, c_uint64, POINTER(StepInfo)]),
    "arena_decision_count": (c_uint64, [_P]),
    "arena_decision_get": (c_int, [_P, c_uint64, POINTER(DecisionInfo)]),
    "arena_plan_get": (c_int, [_P, POINTER(PlanInfo)]),
    "arena_share_get": (c_int, [_P, POINTER(ShareInfo)]),
    "arena_schedule_get": (c_int, [_P, POINTER(c_uint32), c_size_t, POINTER(c_size_t)]),
    "arena_schedule_set": (c_int, [_P, POINTER(c_uint32), c_size_t]),
    "arena_device_memory": (c_int, [_P, POINTER(c_uint64), POINTER(c_uint64)]),
    "arena_profile_save": (c_int, [_P, c_char_p]),
    "arena_trace_begin": (c_int, [_P, c_char_p, c_size_t]),
    "arena_trace_end": (c_int, [_P]),
    "arena_sim_pressure": (c_int, [_P, c_uint64]),
    "arena_convert": (c_int, [POINTER(c_char_p), c_size_t, c_char_p, POINTER(ConvertOptions), POINTER(ConvertInfo)]),
    "arena_verify": (c_int, [c_char_p, POINTER(VerifyOptions), POINTER(VerifyInfo)]),
    "arena_writer_open": (c_int, [c_char_p, c_char_p, c_char_p, POINTER(ConvertOptions), POINTER(c_void_p)]),
    "arena_writer_block_count": (c_size_t, [c_void_p]),
    "arena_writer_block_name": (c_char_p, [c_void_p, c_size_t]),
    "arena_writer_block_tensors": (c_size_t, [c_void_p, c_size_t]),
    "arena_writer_tensor_name": (c_char_p, [c_void_p, c_size_t, c_size_t]),
    "arena_writer_put": (c_int, [c_void_p, c_char_p, c_void_p, c_uint64]),
    "arena_writer_finish": (c_int, [c_void_p, POINTER(ConvertInfo)]),
    "arena_writer_abort": (None, [c_void_p]),
    # the JSON string comes back as a raw pointer: it is freed by arena_string_free
    "arena_inspect": (c_int, [c_char_p, POINTER(c_void_p)]),
    "arena_string_free": (None, [c_void_p]),
    "arena_sim_rest": (c_int, [_P, c_uint64]),
    "arena_sim_peak": (c_int, [_P, c_int, POINTER(c_uint64)]),
    "arena_sim_fail_alloc": (c_int, [_P, c_uint64, c_uint64]),
}
for _name, (_res, _args) in _SIGS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args

for _cls, _cname in (
    (OpenOptions, b"arena_open_options"),
    (TensorInfo, b"arena_tensor_info"),
    (BlockInfo, b"arena_block_info"),
    (StepInfo, b"arena_step_info"),
    (PlanInfo, b"arena_plan_info"),
    (ShareInfo, b"arena_share_info"),
    (ConvertOptions, b"arena_convert_options"),
    (ConvertInfo, b"arena_convert_info"),
    (BadChunk, b"arena_bad_chunk"),
    (VerifyOptions, b"arena_verify_options"),
    (VerifyInfo, b"arena_verify_info"),
    (RestInfo, b"arena_rest_info"),
    (MemoryInfo, b"arena_memory_info"),
    (DecisionInfo, b"arena_decision_info"),
):
    _want = lib.arena_sizeof(_cname)
    if _want != ctypes.sizeof(_cls):
        raise ImportError(
            f"arena: the binding's {_cname.decode()} is {ctypes.sizeof(_cls)} bytes, "
            f"libarena's {_want}: the library and the package are from different versions"
        )


def check_int(name: str, value: Any, ctype: Any, top: Optional[int] = None) -> int:
    """``value`` as an argument of C type ``ctype`` (``c_uint64``, ``c_size_t``, ``c_uint``,
    ``c_int``, ``c_void_p``...) takes it: an int (or an object with ``__index__``, not a
    bool) within the type's range, and below ``top`` where given (the values from it on
    mean something else to the library: ARENA_ZERO_BYTES, ARENA_PIECE_AUTO). ctypes
    would cut one outside to the type's low bits without a word (block ``2**64 + 5``
    would be block 5): TypeError, or ValueError naming the argument, instead."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None
    bits = 8 * ctypes.sizeof(ctype)
    signed = ctype(-1).value == -1
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if top is not None and top - 1 < hi:
        hi = top - 1
    if not lo <= v <= hi:
        raise ValueError(f"{name}: {v} is out of range (from {lo} to {hi})")
    return v


def last_error() -> str:
    return (lib.arena_last_error() or b"").decode("utf-8", "replace")


def err_name(code: int) -> str:
    return lib.arena_err_name(code).decode()
