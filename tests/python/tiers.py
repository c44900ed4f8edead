"""The quick tier (make check) in the Python tests.

``@slow`` marks a test that takes seconds on a two-core machine (torch.compile,
quantized and subclass training, whole UNets and VAEs, the training examples):
where $ARENA_TEST_QUICK is set to anything but "" or "0" it is skipped with the
reason ``SLOW``, which tests/python/run_torch.sh counts; make test runs it.
"""

from __future__ import annotations

import os
import unittest
from typing import Any, Callable, TypeVar

QUICK = os.environ.get("ARENA_TEST_QUICK", "") not in ("", "0")
SLOW = "slow: make test runs it"

F = TypeVar("F", bound=Callable[..., Any])


def slow(test: F) -> F:
    """``test``, skipped in the quick tier."""
    marked: F = unittest.skipIf(QUICK, SLOW)(test)
    return marked
