"""The LP solver every planning relaxation uses: pulp's HiGHS interface, silent.

HiGHS prints its banner to the process's stdout (file descriptor 1, from C++)
the first time a solver object is created, whatever ``output_flag`` says, and
only that once per process. ``lp_solver`` creates that first object with
descriptor 1 pointed at /dev/null, so ``--format json`` output stays clean.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

_LOCK = threading.Lock()
_BANNER_DONE = False


def _swallow_banner() -> None:
    global _BANNER_DONE
    with _LOCK:
        if _BANNER_DONE:
            return
        import highspy

        sys.stdout.flush()
        saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(devnull)
        _BANNER_DONE = True


def lp_solver(time_limit_s: float | None = None) -> Any:
    """A silent pulp HiGHS solver (no banner or log on stdout), optionally time-limited."""
    import pulp

    _swallow_banner()
    kw: dict[str, Any] = {"msg": False}
    if time_limit_s is not None:
        kw["timeLimit"] = float(time_limit_s)
    return pulp.HiGHS(**kw)
