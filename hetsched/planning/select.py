"""The one best-of selector: ``auto`` in both modes keeps the best of its candidates.

Each candidate is computed once. A candidate that raises is reported
(``candidate_failed``) and skipped; it never takes ``auto`` down.

The budget is **counted work, never a clock**, so the same input gives the
same plan on a quiet and on a busy machine. The first candidate always runs
to its end (there is always a plan). Each later one is admitted, in order,
while its predicted work (``cost(name)``, reference seconds: what the
planner counts, calibrated on the 2-core bench machine) fits in what is left
of ``budget_s``; an admitted candidate runs with a work limit (its
prediction x ``LIMIT_SLACK``, at most what was left when it was admitted) and
one that passes it raises :class:`~hetsched.planning.base.OverBudget` and is
skipped with the reason (``candidate_skipped``). Predictions, limits and
counts depend only on the input, so which candidates count never depends on
the load. With ``workers > 1`` the later candidates run in forked worker
processes (on Linux), each returning its plan; the results are the same as
in one process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from hetsched.core.report import NULL_REPORTER, BaseReporter
from hetsched.planning.base import OverBudget

T = TypeVar("T")

#: an admitted candidate may count this many times its predicted work before it is stopped
LIMIT_SLACK = 2.0
#: seconds a process that has sent its result gets to end before it is killed
JOIN_S = 10.0


@dataclass
class Selection(Generic[T]):
    """What the selector did: the best result, every score, what it skipped and why."""

    best: T | None = None
    best_name: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    #: each admitted candidate's predicted work (reference seconds; None: not predicted)
    predicted: dict[str, float | None] = field(default_factory=dict)

    def offer(self, name: str, result: T, score: float) -> None:
        self.scores[name] = score
        if self.best is None or score < self.scores[str(self.best_name)] - 1e-9:
            self.best, self.best_name = result, name

    def not_run(self) -> dict[str, str]:
        """Every candidate that did not produce a plan, with the reason."""
        return {**self.skipped, **{k: f"failed: {v}" for k, v in self.failed.items()}}


_WORK: list[Any] = []
OVER = "over budget: "


def _in_worker(name: str, limit: float | None) -> tuple[str, Any, str | None, float]:
    t0 = time.perf_counter()
    try:
        return name, _WORK[0](name, limit), None, time.perf_counter() - t0
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
            work: Callable[[T], float] | None = None,
            workers: int = 1) -> Selection[T]:
    """Run each candidate ``run(name, limit)`` once and keep the lowest ``objective``.

    ``limit`` is the candidate's work limit (None: unlimited; the first
    candidate, and the next ones until one has made a plan, get None). ``cost(name)`` predicts a candidate's work
    (None: cheap, never skipped, counted as nothing); it is called after the
    first candidate ran, so it may use what that one counted. ``work(result)``
    is what a finished candidate counted (default: nothing). A candidate
    predicted to need more than what is left of ``budget_s`` is skipped.
    ``workers > 1`` runs the candidates after the first in parallel processes.
    """
    sel: Selection[T] = Selection()
    if not names:
        return sel
    k = 0
    while k < len(names) and sel.best is None:  # unlimited until one has made a plan
        _one(names[k], run, None, objective, sel, reporter)
        k += 1
    rest = list(names[k:])
    spent = float(work(sel.best)) if work is not None and sel.best is not None else 0.0
    todo: list[tuple[str, float | None]] = []
    for name in rest:
        pred = cost(name) if cost else None
        left = None if budget_s is None else budget_s - spent
        if pred is not None and left is not None and pred > left:
            why = (f"predicted work {pred:.3g} s > {max(left, 0.0):.3g} s left of the "
                   f"budget plan_budget_s={budget_s:g} (counted work, not timed)"
                   ) if pred != float("inf") else (
                "too large for this problem (it would refuse at its size limit)")
            sel.skipped[name] = why
            reporter.candidate_skipped(name, why)
            continue
        limit = None
        if left is not None and pred is not None:
            limit = min(left, max(pred * LIMIT_SLACK, 1e-3))
            spent += pred
        sel.predicted[name] = pred
        todo.append((name, limit))
    if workers > 1 and len(todo) > 1:
        _parallel(todo, run, objective, sel, reporter, workers)
    else:
        for name, limit in todo:
            _one(name, run, limit, objective, sel, reporter)
    return sel


def _die_with_parent(parent: int) -> None:
    """On Linux, end this forked process when the one that started it ends (killed, or
    its terminal closed) rather than compute for no one."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)


def _child(name: str, limit: float | None, conn: Any, parent: int | None = None) -> None:
    """A candidate's process: run it and send (name, result, error, seconds) back."""
    if parent is not None:
        _die_with_parent(parent)
    try:
        out = _in_worker(name, limit)
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        out = (name, None, _describe(e), 0.0)
    try:
        conn.send(out)
    except Exception as e:  # noqa: BLE001 - e.g. a result that cannot be pickled
        with contextlib.suppress(OSError):  # the parent is gone: nothing to tell
            conn.send((name, None, f"could not return its result: {_describe(e)}", out[3]))
    conn.close()
    # end here, without flushing the standard streams at exit: a stream's lock held by
    # another thread of the parent (the progress bar's) at the fork is never released
    # in this copy, and the flush would wait on it forever (and so the parent's join)
    os._exit(0)


def _join(proc: Any) -> None:
    """Join a process that has sent its result; one that does not end is killed."""
    proc.join(JOIN_S)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _parallel(todo: list[tuple[str, float | None]], run: Run[T],
              objective: Callable[[T], float], sel: Selection[T], reporter: BaseReporter,
              workers: int) -> None:
    """Run ``todo`` (name, work limit) in forked processes, ``workers`` at a time;
    results in the candidates' order. Each child stops itself at its work limit."""
    if "fork" not in multiprocessing.get_all_start_methods():  # pragma: no cover - not Linux
        for name, limit in todo:
            _one(name, run, limit, objective, sel, reporter)
        return
    _WORK[:] = [run]
    ctx = multiprocessing.get_context("fork")
    done: dict[str, tuple[Any, str | None, float]] = {}
    pending = list(todo)
    running: dict[str, tuple[Any, Any]] = {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                name, limit = pending.pop(0)
                reporter.candidate_started(name)
                rd, wr = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(name, limit, wr, os.getpid()))
                proc.start()
                wr.close()
                running[name] = (proc, rd)
            ready = multiprocessing.connection.wait([v[1] for v in running.values()])
            for name, (proc, rd) in list(running.items()):
                if rd not in ready:
                    continue
                try:
                    _, res, err, secs = rd.recv()
                except (EOFError, OSError):  # died without a word (memory)
                    res, err, secs = None, f"process died (exit {proc.exitcode})", 0.0
                _join(proc)
                rd.close()
                del running[name]
                done[name] = (res, err, secs)
    finally:
        for proc, rd in running.values():
            proc.kill()
            proc.join()
            rd.close()
        _WORK.clear()
    for name, _ in todo:
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


def _one(name: str, run: Run[T], limit: float | None, objective: Callable[[T], float],
         sel: Selection[T], reporter: BaseReporter) -> None:
    reporter.candidate_started(name)
    c0 = time.perf_counter()
    try:
        res = run(name, limit)
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


def _group_child(conn: Any, parent: int) -> None:
    """A background process in a process group of its own, so that ending it ends the
    processes it starts too."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    _child("background", None, conn, parent)


class Background(Generic[T]):
    """``fn()`` computed beside the caller, in a forked process when ``workers > 1``.

    ``result()`` waits for it. Where no process can be forked, or the child dies or
    cannot send its result back, ``fn()`` runs in the caller instead, so the result
    never depends on how it was computed (``fn`` must be deterministic). ``close()``
    ends a child whose result is no longer wanted.
    """

    def __init__(self, fn: Callable[[], T], workers: int) -> None:
        self._fn = fn
        self._proc: Any = None
        self._conn: Any = None
        self._done: tuple[T] | None = None
        if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
            ctx = multiprocessing.get_context("fork")
            rd, wr = ctx.Pipe(duplex=False)
            _WORK[:] = [lambda _name, _limit: fn()]
            try:
                self._proc = ctx.Process(target=_group_child, args=(wr, os.getpid()))
                self._proc.start()
            finally:
                _WORK.clear()
            with contextlib.suppress(OSError):  # its own group (also set by the child: a race)
                os.setpgid(self._proc.pid, self._proc.pid)
            wr.close()
            self._conn = rd

    def result(self) -> T:
        if self._done is None:
            got: tuple[T] | None = None
            if self._conn is not None:
                try:
                    _, res, err, _ = self._conn.recv()
                    if err is None:
                        got = (res,)
                except (EOFError, OSError):  # died without a word (memory)
                    pass
                self._reap(kill=False)
            self._done = got if got is not None else (self._fn(),)
        return self._done[0]

    def close(self) -> None:
        """End the child, if any, whose result is no longer wanted."""
        self._reap(kill=True)

    def _reap(self, kill: bool) -> None:
        if self._proc is None:
            return
        if kill and self._proc.is_alive():  # with the processes it started (auto's candidates)
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except OSError:
                self._proc.kill()
        _join(self._proc)
        self._conn.close()
        self._proc = self._conn = None


def default_workers() -> int:
    """Worker processes for auto's candidates: setting plan_workers, 0 = one per CPU core."""
    from hetsched import config

    n = int(config.get("plan_workers"))
    return n if n > 0 else (os.cpu_count() or 1)


__all__ = ["best_of", "Background", "Selection", "default_workers"]
