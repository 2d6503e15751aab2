"""Helpers shared by the Slurm tests (imported by basename: tests/ has no package)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_for(cond: Callable[[], object], timeout_s: float, what: str,
             every_s: float = 0.3) -> None:
    """Poll ``cond()`` until true; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(every_s)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
