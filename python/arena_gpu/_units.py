"""The size grammar of the arena command (common/units.h), for the package's size arguments.

Private: the public name is :func:`arena.parse_size`. A string is read exactly as the C
parser reads it (tests/sizes.json holds the cases both are tested with): ASCII digits with
an optional fraction (``"1.5"``, ``".5"``, ``"2."``), then an optional unit K, M, G or T
(powers of 1024), which may be followed by ``iB`` or ``B`` with the same meaning, or ``B``
alone; letters in either case. The fraction's first 18 digits count, and the bytes it
makes are cut to a whole number. Nothing else is a size: no sign, space, exponent, hex,
``nan`` or ``inf``, nor a digit outside ASCII.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Union

from ._native import check_int

# A size argument: bytes, a string in the grammar above, or None (the default).
Size = Union[int, str, None]

_SHIFT = {"k": 10, "m": 20, "g": 30, "t": 40}
_DIGITS = frozenset("0123456789")
_FRACTION_DIGITS = 18  # the C parser's: digits past the 18th change a size by less than 2^-19 bytes
_U64 = 1 << 64


def _bytes_of(s: str) -> Optional[int]:
    """The bytes ``s`` says, 2**64 or more when it says that many; None when it is not a size."""
    i, n = 0, len(s)
    while i < n and s[i] in _DIGITS:
        i += 1
    whole = s[:i]
    frac = ""
    if i < n and s[i] == ".":
        j = i + 1
        while j < n and s[j] in _DIGITS:
            j += 1
        frac, i = s[i + 1 : j], j
    if not whole and not frac:
        return None
    rest = s[i:]
    if not rest.isascii():  # str.lower() maps some letters to ASCII ones (the Kelvin sign to "k")
        return None
    rest = rest.lower()
    shift = _SHIFT.get(rest[:1], 0)
    if shift:
        rest = rest[1:]
        if rest in ("ib", "b"):
            rest = ""
    elif rest == "b":
        rest = ""
    if rest:
        return None
    whole = whole.lstrip("0")  # int() refuses thousands of digits, leading zeros too
    if len(whole) > 20:  # 2^64 has 20 digits
        return _U64
    frac = frac[:_FRACTION_DIGITS]
    return (int(whole or "0") << shift) + (int(frac or "0") << shift) // 10 ** len(frac)


def parse_size(v: Union[int, str, None], what: str = "size") -> Optional[int]:
    """Bytes from an int or a string like ``"8G"``, ``"512M"``, ``"1.5GiB"``, ``"8gb"``,
    ``"4096"`` (K, M, G, T: powers of 1024, optionally followed by ``B`` or ``iB``, in
    either case; the ``arena`` command's SIZE, read the same way). ``None`` stays
    ``None``; anything else is a ``ValueError`` (or ``TypeError``) naming ``what``."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise TypeError(f"{what}: expected an int or a size string like '8G', got {type(v).__name__}")
    if isinstance(v, int):
        if v < 0:
            raise ValueError(f"{what}: {v} is negative")
        return check_int(what, v, ctypes.c_uint64)
    n = _bytes_of(v)
    if n is None:
        raise ValueError(
            f"{what}: '{v}' is not a size: a number of bytes with an optional unit K, M, G or T, e.g. 64K or 1.5G"
        )
    if n >= _U64:
        raise ValueError(f"{what}: '{v}' is 2^64 bytes or more")
    return n
