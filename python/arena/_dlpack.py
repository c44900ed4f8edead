"""DLPack capsules over arena memory (private).

A capsule describes ``nbytes`` raw bytes at an address as a 1-D uint8
tensor; the consumer (torch, numpy) views them as it needs. Each capsule
holds one reference to its arena (``arena_retain``); the consumer's deleter
drops it (``arena_release``), so memory handed to another runtime keeps the
arena alive after ``close()``. A capsule never consumed releases its
reference when it is collected.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from ctypes import POINTER, Structure, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p
from typing import Any, Dict, Tuple

from . import _native

KDL_CPU = 1
KDL_CUDA = 2


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", _DLDevice),
        ("ndim", c_int32),
        ("dtype", _DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class _DLManagedTensor(Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", c_void_p),
    ("deleter", _DELETER),
]

# What keeps each live capsule's C structs and arena reference: ctx id -> objects.
_live: Dict[int, Tuple[Any, ...]] = {}
_lock = threading.Lock()
_ids = itertools.count(1)


def _on_delete(mt: Any) -> None:
    try:
        key = int(mt.contents.manager_ctx or 0)
        with _lock:
            keep = _live.pop(key, None)
        if keep is not None:
            _native.lib.arena_release(keep[0])
    except Exception:  # pragma: no cover - interpreter shutdown
        pass


_deleter = _DELETER(_on_delete)

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]

_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, c_void_p)
# The same two calls on a raw PyObject * (a capsule being destroyed must not
# be turned back into a Python reference).
_IsValidRaw = ctypes.PYFUNCTYPE(ctypes.c_int, c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_GetPointerRaw = ctypes.PYFUNCTYPE(c_void_p, c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))


def _capsule_destructor(cap_ptr: int) -> None:
    # Called for every capsule when it is collected; one a consumer took is
    # renamed "used_dltensor" and its consumer calls the deleter instead.
    try:
        if _IsValidRaw(cap_ptr, b"dltensor"):
            p = _GetPointerRaw(cap_ptr, b"dltensor")
            _on_delete(ctypes.cast(p, POINTER(_DLManagedTensor)))
    except Exception:  # pragma: no cover - interpreter shutdown
        pass


_destructor = _CAPSULE_DESTRUCTOR(_capsule_destructor)


def capsule(handle: int, address: int, nbytes: int, device_type: int, device_id: int) -> Any:
    """A DLPack capsule for ``nbytes`` bytes at ``address`` holding a reference to arena ``handle``."""
    rc = _native.lib.arena_retain(handle)
    if rc:
        from . import Error  # late: the package imports this module

        raise Error.from_code(rc)
    mt = _DLManagedTensor()
    shape = (c_int64 * 1)(nbytes)
    key = next(_ids)
    mt.dl_tensor.data = address
    mt.dl_tensor.device = _DLDevice(device_type, device_id)
    mt.dl_tensor.ndim = 1
    mt.dl_tensor.dtype = _DLDataType(1, 8, 1)  # kDLUInt, 8 bits
    mt.dl_tensor.shape = shape
    mt.dl_tensor.strides = None
    mt.dl_tensor.byte_offset = 0
    mt.manager_ctx = key
    mt.deleter = _deleter
    with _lock:
        _live[key] = (handle, mt, shape)
    return _PyCapsule_New(ctypes.addressof(mt), b"dltensor", ctypes.cast(_destructor, c_void_p))


class Exporter:
    """An object with ``__dlpack__`` (numpy's from_dlpack wants one, not a capsule)."""

    def __init__(self, handle: int, address: int, nbytes: int, device_type: int, device_id: int):
        self._args = (handle, address, nbytes, device_type, device_id)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return capsule(*self._args)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (self._args[3], self._args[4])


def live_capsules() -> int:
    """Capsules whose memory a consumer still holds (tests)."""
    with _lock:
        return len(_live)
