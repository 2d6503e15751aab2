"""The one LP solver factory: every pulp LP hetsched solves goes through :func:`lp_solver`.

Two hot LPs talk to HiGHS directly (``highspy``, re-solved warm): the joint
lower bound (``lp_bound``) and HAS's P3 on large categories
(``policies.common.TransportLP``); both create their ``Highs`` inside
:func:`quiet_stdout` with ``output_flag`` off, for the same reason.

pulp's HiGHS interface lets HiGHS print its banner on stdout when it creates
the solver, before ``output_flag`` can be switched off, which corrupted
``--format json`` output. The solver returned here is silent:
``msg=False``, and the creation and the solve run with file descriptor 1
pointed at /dev/null. CBC, bundled with pulp, is the fallback when HiGHS is not importable.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_FD_LOCK = threading.RLock()


@contextmanager
def quiet_stdout() -> Iterator[None]:
    """Discard whatever C code writes on fd 1 for the duration (process-wide)."""
    with _FD_LOCK:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        try:
            saved = os.dup(1)
        except OSError:  # no fd 1 at all: nothing to protect
            yield
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 1)
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(null)


def lp_solver(time_limit_s: float | None = None) -> Any:
    """A silent pulp solver (HiGHS, else CBC), with an optional wall-clock limit in seconds."""
    import pulp

    kw: dict[str, Any] = {"msg": False}
    if time_limit_s is not None:
        kw["timeLimit"] = float(time_limit_s)
    highs = pulp.HiGHS(**kw)
    if not highs.available():
        return pulp.PULP_CBC_CMD(**kw)
    return _SilentHiGHS(**kw)


def _silent_class() -> Any:
    import pulp

    class SilentHiGHS(pulp.HiGHS):
        """pulp.HiGHS whose solver creation prints nothing on stdout."""

        def createAndConfigureSolver(self, lp: Any) -> Any:  # noqa: N802 - pulp's name
            with quiet_stdout():
                return super().createAndConfigureSolver(lp)

        def callSolver(self, lp: Any) -> Any:  # noqa: N802 - pulp's name
            with quiet_stdout():
                return super().callSolver(lp)

    return SilentHiGHS


class _Lazy:
    """Build the pulp subclass on first use (importing pulp is slow: keep CLI start-up fast)."""

    cls: Any = None

    def __call__(self, **kw: Any) -> Any:
        if _Lazy.cls is None:
            _Lazy.cls = _silent_class()
        return _Lazy.cls(**kw)


_SilentHiGHS = _Lazy()

__all__ = ["lp_solver", "quiet_stdout"]
