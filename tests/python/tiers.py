"""Helpers the Python tests share: the quick tier (make check), and Ctrl-C.

``@slow`` marks a test that takes seconds on a two-core machine (torch.compile,
quantized and subclass training, whole UNets and VAEs, the training examples):
where $ARENA_TEST_QUICK is set to anything but "" or "0" it is skipped with the
reason ``SLOW``, which tests/python/run_torch.sh counts; make test runs it.

``ctrl_c()`` gives SIGINT Python's own handler for a test of Ctrl-C: a shell's
background job (a CI run started with ``&``) starts with SIGINT ignored, and
then no KeyboardInterrupt comes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import unittest
from typing import Any, Callable, Iterator, TypeVar

QUICK = os.environ.get("ARENA_TEST_QUICK", "") not in ("", "0")
SLOW = "slow: make test runs it"

F = TypeVar("F", bound=Callable[..., Any])


def slow(test: F) -> F:
    """``test``, skipped in the quick tier."""
    marked: F = unittest.skipIf(QUICK, SLOW)(test)
    return marked


@contextlib.contextmanager
def ctrl_c() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt within (as in a terminal's foreground job)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
