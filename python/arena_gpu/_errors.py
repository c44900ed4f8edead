"""The library's errors as Python raises them: :class:`Error`, and its warnings
:class:`ShareWarning` and :class:`OomRetryWarning`.

Private: the public names are ``arena.Error``, ``arena.ShareWarning`` and
``arena.OomRetryWarning`` (the package's front door names them as its own:
``arena_gpu.Error``).
"""

from __future__ import annotations

from typing import Any, Dict, List

from . import _native


class ShareWarning(UserWarning):
    """``share_host`` was asked for and was not possible: the arena holds a private
    host copy (:meth:`Arena.share_state` says why). The open succeeded."""


class OomRetryWarning(UserWarning):
    """A step of a module attached with ``arena.torch.attach`` ran out of device
    memory and arena ran it again after giving torch what it could (one warning a
    retry; ``Handle.retries()`` holds the records). The step's outputs are those of
    a run that never ran out."""


class Error(Exception):
    """An error of the arena library.

    ``code`` is the library's error name (``"BUDGET"``, ``"IMG_CHUNK_CHECKSUM"``,
    ``"USAGE"``...), ``errno`` its negative number, ``message`` the one-line
    message (it names the file and object), ``error_class`` one of
    ``"invalid"``, ``"usage"``, ``"system"``. :func:`verify`'s errors list the bad
    chunks in ``bad_chunks`` (empty elsewhere).
    """

    def __init__(self, code: str, message: str, errno: int = 0, error_class: str = "usage"):
        super().__init__(f"{message} [{code}]" if message else code)
        self.code = code
        self.message = message
        self.errno = errno
        self.error_class = error_class
        self.bad_chunks: List[Dict[str, Any]] = []

    @classmethod
    def from_code(cls, rc: int) -> "Error":
        msg = _native.last_error() or _native.lib.arena_strerror(rc).decode()
        klass = {1: "invalid", 2: "usage", 3: "system"}.get(_native.lib.arena_err_class(rc), "usage")
        return cls(_native.err_name(rc), msg, rc, klass)


def _check(rc: int) -> None:
    if rc:
        raise Error.from_code(rc)
