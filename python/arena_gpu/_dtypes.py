"""Arena dtype names in torch's and numpy's terms, typed views of a slab, and the
optional imports (torch, numpy) with an ImportError that says what to install.

Private: the public name is ``arena.torch_dtype``.
"""

from __future__ import annotations

from typing import Any

from ._errors import Error
from ._records import Component


_TORCH_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "I8": "int8",
    "U8": "uint8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
}


# Bits of an element of each dtype an image or a safetensors file names (formats/dtype.h).
_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "U32": 32, "I32": 32, "U64": 64, "I64": 64,
         "F16": 16, "BF16": 16, "F32": 32, "F64": 64, "C64": 64, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
         "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def element_bits(dtype: str) -> int:
    """Bits of one element of arena dtype ``dtype`` ("BF16": 16); USAGE for another name."""
    bits = _BITS.get(dtype)
    if bits is None:
        raise Error("USAGE", f"dtype '{dtype}' is none of an image's: {', '.join(_BITS)}")
    return bits


# What each optional import needs, as python/pyproject.toml's extras name it
# (tests/python/test_files.py checks that they agree).
_EXTRAS = {"torch": "'torch>=2.4'", "numpy": "numpy ml_dtypes"}


def _import(module: str, what: str, extra: str) -> Any:
    """``module``, or an ImportError that says what to install: the packages of
    the package's ``extra``, by pip's name, and the extra itself (``pip install
    ./python`` from a checkout installs no extra)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise ModuleNotFoundError(f"arena: {what} needs {module}, which is not installed: pip install "
                                  f"{_EXTRAS[extra]} (what arena's [{extra}] extra installs: pip install "
                                  f"'./python[{extra}]' from a checkout, 'arena_gpu-*.whl[{extra}]' for the wheel)",
                                  name=module) from None


def _torch() -> Any:
    return _import("torch", "Arena.tensors, Arena.slab and arena.torch", "torch")


def torch_dtype(name: str) -> Any:
    """The torch dtype of an arena dtype name ("BF16" -> torch.bfloat16)."""
    torch = _torch()

    try:
        return getattr(torch, _TORCH_DTYPES[name])
    except (KeyError, AttributeError):
        raise Error("USAGE", f"dtype {name} has no torch equivalent in this torch") from None


def _numpy_dtype(name: str) -> Any:
    np = _import("numpy", "Arena.arrays", "numpy")

    plain = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "U8": np.uint8,
             "I16": np.int16, "U16": np.uint16, "I32": np.int32, "U32": np.uint32, "I64": np.int64,
             "U64": np.uint64, "BOOL": np.bool_, "C64": np.complex64}
    if name in plain:
        return np.dtype(plain[name])
    try:
        import ml_dtypes

        return np.dtype({"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
                         "F8_E5M2": ml_dtypes.float8_e5m2}[name])
    except ImportError:
        raise Error("USAGE", f"dtype {name} needs the ml_dtypes package for numpy") from None


def _view(slab: Any, c: Component) -> Any:
    torch = _torch()

    t = slab[c.offset : c.offset + c.nbytes]
    dt = torch_dtype(c.dtype)
    if dt is not torch.uint8:
        t = t.view(dt)
    return t.view(c.shape)
