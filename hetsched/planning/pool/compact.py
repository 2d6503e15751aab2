"""The compact per-GPU task sequence of a pool plan: repeating patterns stored once.

A GPU's sequence is a list of rows ``[job, round, task, start_s, end_s,
sync_end_s, memory, evict]`` (``memory`` is ``"keep"`` or ``"evict"`` for the
task's own model, ``evict`` the other jobs' models to drop after it). Long
jobs make these sequences long but very regular, so the sequence is stored
as *runs*: a pattern of L rows and a repeat count; repetition k (0-based)
is the pattern with ``round + k * round_step`` and every time shifted by
``k * period_s``. Patterns are found greedily (longest coverage first, L up to
``MAX_PATTERN``); a row that repeats nothing is a run with ``repeat: 1``.
Expanding the runs gives back the rows to within ``TIME_TOL`` seconds.
"""

from __future__ import annotations

import numpy as np

from hetsched.core.pool_tasks import COLUMNS, TaskRow, TaskRun

MAX_PATTERN = 8
#: absolute tolerance (s) for "same time shift"; rows are written rounded to 1 us
TIME_TOL = 2e-6
__all__ = ["COLUMNS", "compress_rows", "count_rows", "expand_runs"]


def _r6(x: float) -> float:
    return round(float(x), 6)


def compress_rows(job: list[str], rnd: np.ndarray, task: np.ndarray, start: np.ndarray,
                  end: np.ndarray, sync_end: np.ndarray, keep: list[bool],
                  evict: list[list[str]], batch: np.ndarray | None = None,
                  iters: np.ndarray | None = None) -> list[TaskRun]:
    """Runs for one GPU's rows (already in start order); ``batch``/``iters``: each task's
    own local batch and iterations (uneven tasks), None for the job's equal slices."""
    n = len(job)
    own: list[tuple[int | None, int | None]] = [(None, None)] * n if batch is None or \
        iters is None else [(int(b), int(k)) for b, k in zip(batch, iters, strict=True)]
    rnd_l = [int(x) for x in rnd]
    task_l = [int(x) for x in task]
    st, en, se = (np.asarray(x, dtype=float) for x in (start, end, sync_end))
    st_l, en_l, se_l = st.tolist(), en.tolist(), se.tolist()
    codes: dict[tuple[object, ...], int] = {}
    ident = np.array([codes.setdefault((job[k], task_l[k], keep[k], tuple(evict[k]), own[k]),
                                       len(codes)) for k in range(n)], dtype=np.int64)
    ident_l = ident.tolist()
    rn = np.asarray(rnd_l, dtype=np.int64)

    def reps(i: int, L: int) -> tuple[int, int, float]:
        """How often rows i..i+L-1 repeat back to back (>= 1), with round step and period:
        repetition k of row a is row a + k*L with the same identity, round + k*d and
        every time + k*period (within TIME_TOL + 1e-12 * |time|). Checked a growing
        chunk of repetitions at a time."""
        if i + 2 * L > n:
            return 1, 0, 0.0
        d = rnd_l[i + L] - rnd_l[i]
        period = st_l[i + L] - st_l[i]
        if d < 1 or period <= 0:
            return 1, 0, 0.0
        for a in range(i, i + L):  # the first repetition in Python: most patterns end here
            b = a + L
            if (ident_l[b] != ident_l[a] or rnd_l[b] != rnd_l[a] + d
                    or abs(st_l[b] - st_l[a] - period) > TIME_TOL + 1e-12 * abs(st_l[b])
                    or abs(en_l[b] - en_l[a] - period) > TIME_TOL + 1e-12 * abs(en_l[b])
                    or abs(se_l[b] - se_l[a] - period) > TIME_TOL + 1e-12 * abs(se_l[b])):
                return 1, d, period
        k, chunk = 2, 4
        while i + (k + 1) * L <= n:
            k_end = min(k + chunk, (n - i) // L)  # repetitions k .. k_end-1
            rows = np.arange(i + k * L, i + k_end * L)
            src = i + (rows - i) % L
            kk = (rows - i) // L
            bad = (ident[rows] != ident[src]) | (rn[rows] != rn[src] + kk * d)
            for t in (st, en, se):
                bad |= np.abs(t[rows] - t[src] - kk * period) > TIME_TOL + 1e-12 * np.abs(t[rows])
            if bad.any():
                return int(kk[int(np.argmax(bad))]), d, period
            k, chunk = k_end, chunk * 4
        return k, d, period

    runs: list[TaskRun] = []
    i = 0
    while i < n:
        best = (1, 1, 0, 0.0)  # (repeat, L, round_step, period)
        for L in range(1, MAX_PATTERN + 1):
            if i + 2 * L > n:
                break
            if best[0] * best[1] >= (n - i) // L * L:  # L cannot cover more than the best
                continue
            k, d, period = reps(i, L)
            if k >= 2 and k * L > best[0] * best[1]:
                best = (k, L, d, period)
        k, L, d, period = best
        rows = tuple(TaskRow(job[e], rnd_l[e], task_l[e], _r6(st_l[e]), _r6(en_l[e]),
                             _r6(se_l[e]), bool(keep[e]), tuple(evict[e]), *own[e])
                     for e in range(i, i + L))
        runs.append(TaskRun(rows, k, round(period, 9), d) if k > 1 else TaskRun(rows, 1))
        i += k * L
    return runs


def expand_runs(runs: list[TaskRun]) -> list[TaskRow]:
    """The rows a list of runs stands for, in order."""
    return [r for run in runs for r in run.expand()]


def count_rows(runs: list[TaskRun]) -> int:
    return sum(len(run) for run in runs)
