"""The one LP solver factory: every pulp LP hetsched solves goes through :func:`lp_solver`.

Two hot LPs talk to HiGHS directly (``highspy``, re-solved warm): the joint
lower bound (``lp_bound``, built by :func:`highs_lp` from :class:`SparseRows`) and
HAS's P3 on large categories (``policies.common.TransportLP``); both create their
``Highs`` inside :func:`quiet_stdout` with ``output_flag`` off, for the same reason.

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

class SparseRows:
    """Sparse rows ``lower <= sum coef * x[col] <= upper`` collected for one passModel."""

    def __init__(self) -> None:
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.idx: list[list[int]] = []
        self.val: list[list[float]] = []

    def add(self, terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        self.lo.append(lo)
        self.hi.append(hi)
        self.idx.append([c for c, _ in terms])
        self.val.append([v for _, v in terms])


def add_rows(h: Any, rows: SparseRows) -> None:
    """Add ``rows`` to the live HiGHS model ``h`` in one call (its basis kept: warm)."""
    import numpy as np

    n = len(rows.lo)
    starts = np.concatenate([[0], np.cumsum([len(r) for r in rows.idx])[:-1]]).astype(np.int32)
    idx = np.array([c for r in rows.idx for c in r], dtype=np.int32)
    val = np.array([v for r in rows.val for v in r], dtype=float)
    h.addRows(n, np.array(rows.lo, dtype=float), np.array(rows.hi, dtype=float), len(idx),
              starts, idx, val)


def highs_lp(rows: SparseRows, col_lo: list[float], cost: list[float]) -> Any:
    """A quiet HiGHS instance holding ``min cost.x`` over ``rows``, ``x >= col_lo``."""
    import highspy
    import numpy as np

    model = highspy.HighsLp()
    n = len(col_lo)
    model.num_col_, model.num_row_ = n, len(rows.lo)
    model.col_cost_ = np.array(cost)
    model.col_lower_ = np.array(col_lo)
    model.col_upper_ = np.full(n, highspy.kHighsInf)
    model.row_lower_ = np.array(rows.lo)
    model.row_upper_ = np.array(rows.hi)
    model.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    model.a_matrix_.start_ = np.concatenate([[0], np.cumsum([len(r) for r in rows.idx])]
                                            ).astype(np.int32)
    model.a_matrix_.index_ = np.array([c for r in rows.idx for c in r], dtype=np.int32)
    model.a_matrix_.value_ = np.array([v for r in rows.val for v in r], dtype=float)
    return quiet_highs(model)


def quiet_highs(model: Any) -> Any:
    """A HiGHS instance holding ``model`` (a ``highspy.HighsLp``), created and loaded
    with its banner and log kept off stdout."""
    import highspy

    with quiet_stdout():
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.passModel(model)
    return h


__all__ = ["lp_solver", "quiet_stdout", "quiet_highs", "SparseRows", "highs_lp"]
