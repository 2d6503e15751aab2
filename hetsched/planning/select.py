"""The one best-of selector: ``auto`` in both modes keeps the best of its candidates.

Each candidate is computed once. A candidate that raises is reported
(``candidate_failed``) and skipped; it never takes ``auto`` down. A candidate
whose predicted planning time exceeds what is left of the time budget is
skipped with the reason (``candidate_skipped``), and so is one that raises
:class:`~hetsched.planning.base.OverBudget` (it ran past the budget), so ``auto`` never loses to a
policy it could afford and says which ones it did not run. With
``workers > 1`` the candidates run in forked worker processes (on Linux),
each returning its plan; the results are the same as in one process.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from hetsched.core.report import NULL_REPORTER, BaseReporter
from hetsched.planning.base import OverBudget

T = TypeVar("T")


@dataclass
class Selection(Generic[T]):
    """What the selector did: the best result, every score, what it skipped and why."""

    best: T | None = None
    best_name: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def offer(self, name: str, result: T, score: float) -> None:
        self.scores[name] = score
        if self.best is None or score < self.scores[str(self.best_name)] - 1e-9:
            self.best, self.best_name = result, name

    def not_run(self) -> dict[str, str]:
        """Every candidate that did not produce a plan, with the reason."""
        return {**self.skipped, **{k: f"failed: {v}" for k, v in self.failed.items()}}


_WORK: list[Any] = []
OVER = "over budget: "


def _in_worker(name: str, deadline: float | None) -> tuple[str, Any, str | None, float]:
    t0 = time.perf_counter()
    try:
        return name, _WORK[0](name, deadline), None, time.perf_counter() - t0
    except OverBudget as e:
        return name, None, f"{OVER}{e}", time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported by the parent, never fatal
        return name, None, f"{type(e).__name__}: {e}", time.perf_counter() - t0


def _describe(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ")


Run = Callable[[str, "float | None"], T]


def best_of(names: Sequence[str], run: Run[T], objective: Callable[[T], float], *,
            reporter: BaseReporter = NULL_REPORTER, budget_s: float | None = None,
            cost: Callable[[str], float | None] | None = None,
            workers: int = 1) -> Selection[T]:
    """Run each candidate ``run(name, deadline)`` once and keep the lowest ``objective``.

    ``cost(name)`` predicts a candidate's planning seconds (None: cheap, always
    run); a candidate predicted to need more than what is left of ``budget_s``
    is skipped. ``deadline`` is when the budget ends (a ``time.perf_counter()``
    value; None for the first candidate, so that there is always a plan): a
    candidate past it raises OverBudget and is skipped. ``workers > 1`` runs
    candidates in parallel processes.
    """
    sel: Selection[T] = Selection()
    t0 = time.perf_counter()
    end = None if budget_s is None else t0 + budget_s
    todo: list[str] = []
    for name in names:
        pred = cost(name) if cost else None
        left = None if budget_s is None else budget_s - (time.perf_counter() - t0)
        if pred is not None and left is not None and pred > left:
            why = (f"predicted {pred:,.1f} s > {max(left, 0.0):,.1f} s left of the "
                   f"time budget plan_budget_s={budget_s:g}") if pred != float("inf") else (
                "too large for this problem (it would refuse at its size limit)")
            sel.skipped[name] = why
            reporter.candidate_skipped(name, why)
            continue
        if workers > 1:
            todo.append(name)
            continue
        # no deadline until some candidate has produced a plan: auto always has one
        _one(name, run, end if sel.scores else None, objective, sel, reporter)
    if todo:
        _parallel(todo, run, end, objective, sel, reporter, workers)
    return sel


def _child(name: str, deadline: float | None, conn: Any) -> None:
    """A candidate's process: run it and send (name, result, error, seconds) back."""
    try:
        out = _in_worker(name, deadline)
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        out = (name, None, _describe(e), 0.0)
    try:
        conn.send(out)
    except Exception as e:  # noqa: BLE001 - e.g. a result that cannot be pickled
        conn.send((name, None, f"could not return its result: {_describe(e)}", out[3]))
    conn.close()


def _parallel(names: list[str], run: Run[T], end: float | None,
              objective: Callable[[T], float], sel: Selection[T], reporter: BaseReporter,
              workers: int) -> None:
    """Run ``names`` in forked processes, ``workers`` at a time; results in the candidates' order.

    The budget is enforced from outside: at ``end`` every candidate still
    running, except the first (there is always a plan), is killed and listed
    as stopped at the time budget, so one long step inside a policy (an event
    of HAS on thousands of GPUs) cannot hold ``auto`` past its budget.
    Candidates not started by then are skipped.
    """
    if "fork" not in multiprocessing.get_all_start_methods():  # pragma: no cover - not Linux
        for name in names:
            _one(name, run, end if sel.scores else None, objective, sel, reporter)
        return
    _WORK[:] = [run]
    ctx = multiprocessing.get_context("fork")
    done: dict[str, tuple[Any, str | None, float]] = {}
    pending = list(enumerate(names))
    running: dict[str, tuple[Any, Any, int, float]] = {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                k, name = pending.pop(0)
                if k and end is not None and time.perf_counter() >= end:
                    done[name] = (None, f"{OVER}not started: the time budget (plan_budget_s) "
                                  "was spent by the candidates before it", 0.0)
                    continue
                reporter.candidate_started(name)
                rd, wr = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(name, end if k else None, wr))
                proc.start()
                wr.close()
                running[name] = (proc, rd, k, time.perf_counter())
            if not running:
                continue
            limited = end is not None and any(v[2] for v in running.values())
            timeout = max(0.0, end - time.perf_counter()) if limited and end is not None else None
            ready = multiprocessing.connection.wait([v[1] for v in running.values()], timeout)
            for name, (proc, rd, k, t0) in list(running.items()):
                if rd in ready:
                    try:
                        _, res, err, secs = rd.recv()
                    except (EOFError, OSError):  # died without a word (memory)
                        res, err, secs = None, f"process died (exit {proc.exitcode})", 0.0
                elif k and end is not None and time.perf_counter() >= end:
                    proc.kill()
                    secs = time.perf_counter() - t0
                    res, err = None, (f"{OVER}stopped at the time budget (plan_budget_s) "
                                      f"after {secs:,.1f} s (its process was ended)")
                else:
                    continue
                proc.join()
                rd.close()
                del running[name]
                done[name] = (res, err, secs)
    finally:
        for proc, rd, _, _ in running.values():
            proc.kill()
            proc.join()
            rd.close()
        _WORK.clear()
    for name in names:
        res, err, secs = done[name]
        if err is not None and err.startswith(OVER):
            sel.skipped[name] = err[len(OVER):]
            reporter.candidate_skipped(name, sel.skipped[name])
            continue
        if err is not None:
            sel.failed[name] = err
            reporter.candidate_failed(name, err)
            continue
        score = float(objective(res))
        sel.seconds[name] = secs
        sel.offer(name, res, score)
        reporter.candidate_done(name, score, secs)


def _one(name: str, run: Run[T], deadline: float | None, objective: Callable[[T], float],
         sel: Selection[T], reporter: BaseReporter) -> None:
    reporter.candidate_started(name)
    c0 = time.perf_counter()
    try:
        res = run(name, deadline)
        score = float(objective(res))
    except OverBudget as e:
        sel.skipped[name] = str(e)
        reporter.candidate_skipped(name, str(e))
        return
    except Exception as e:  # noqa: BLE001 - one candidate never takes auto down
        sel.failed[name] = _describe(e)
        reporter.candidate_failed(name, sel.failed[name])
        return
    sel.seconds[name] = time.perf_counter() - c0
    sel.offer(name, res, score)
    reporter.candidate_done(name, score, sel.seconds[name])


def default_workers() -> int:
    """Worker processes for auto's candidates: setting plan_workers, 0 = one per CPU core."""
    from hetsched import config

    n = int(config.get("plan_workers"))
    return n if n > 0 else (os.cpu_count() or 1)


__all__ = ["best_of", "Selection", "default_workers"]
