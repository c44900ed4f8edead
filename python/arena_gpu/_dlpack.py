"""DLPack capsules over arena memory (private).

A capsule describes ``nbytes`` raw bytes at an address as a 1-D uint8
tensor; the consumer (torch, numpy) views them as it needs. The managed
tensor inside is the library's (``arena_dlpack``): it holds one reference to
its arena and its deleter, C code, drops it, so memory handed to another
runtime keeps the arena alive after ``close()``, and a consumer that frees
its tensor late (while the interpreter shuts down, on a thread of its own)
runs no Python. A capsule never consumed calls that deleter when it is
collected.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p
from typing import Any, Tuple

from . import _native
from ._errors import Error

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

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]

_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, c_void_p)
# The same two calls on a raw PyObject * (a capsule being destroyed must not
# be turned back into a Python reference).
_IsValidRaw = ctypes.PYFUNCTYPE(ctypes.c_int, c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_GetPointerRaw = ctypes.PYFUNCTYPE(c_void_p, c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))


def _delete(address: int) -> None:
    """Call a managed tensor's own deleter (the library's)."""
    mt = ctypes.cast(address, POINTER(_DLManagedTensor))
    mt.contents.deleter(mt)


def _capsule_destructor(cap_ptr: int) -> None:
    # Called for every capsule when it is collected; one a consumer took is
    # renamed "used_dltensor" and its consumer calls the deleter instead.
    try:
        if _IsValidRaw(cap_ptr, b"dltensor"):
            _delete(_GetPointerRaw(cap_ptr, b"dltensor"))
    except Exception:  # pragma: no cover - interpreter shutdown
        pass


_destructor = _CAPSULE_DESTRUCTOR(_capsule_destructor)
# Never freed: a capsule collected while the interpreter shuts down, after
# this module's globals are gone, still finds its destructor's code.
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_destructor))


def capsule(handle: int, address: int, nbytes: int, device_type: int, device_id: int) -> Any:
    """A DLPack capsule for ``nbytes`` bytes at ``address`` holding a reference to arena ``handle``."""
    out = c_void_p()
    rc = _native.lib.arena_dlpack(handle, address, nbytes, c_int(device_type), c_int(device_id), ctypes.byref(out))
    if rc:
        raise Error.from_code(rc)
    if not out.value:  # (arena_dlpack gives a tensor whenever it returns 0)
        raise Error("INTERNAL", "arena_dlpack succeeded without a tensor")
    try:
        return _PyCapsule_New(out.value, b"dltensor", ctypes.cast(_destructor, c_void_p))
    except BaseException:  # no capsule owns it: its reference would keep the arena forever
        _delete(out.value)
        raise


class Exporter:
    """An object with ``__dlpack__`` (numpy's from_dlpack wants one, not a capsule)."""

    def __init__(self, handle: int, address: int, nbytes: int, device_type: int, device_id: int):
        self._args = (handle, address, nbytes, device_type, device_id)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return capsule(*self._args)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (self._args[3], self._args[4])


def arena_alive(handle: int) -> bool:
    """Whether ``handle`` is a live arena: one whose last reference (the
    opener's, a tensor's) is not yet gone (tests)."""
    if _native.lib.arena_retain(handle):
        return False
    _native.lib.arena_release(handle)
    return True
