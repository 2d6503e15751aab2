"""Re-place one job's tasks into the time other jobs leave free (ruin and recreate).

A space plan with fixed GPU counts leaves GPUs idle while a job waits: the job
needs more GPUs than are free, so the free ones idle until enough are. In pool
mode a round's tasks need not run at once: free GPUs can run them in turn (two
tasks on one GPU run back to back; the round's barrier comes after the last
task and the round's synchronisation). This move takes one job out of the plan
and puts its rounds back in order, each round's tasks (longest first) on the
allowed GPU that finishes them first *in the gaps the other jobs leave*: a GPU
idle before another job's task starts, another job's synchronisation, a GPU no
one uses. No other task moves, so only this job's completion can change, and
the move is kept when the evaluator's weighted JCT falls. Each task keeps its
local batch and iterations: the job trains exactly the same samples.

:func:`reinsert_jobs` tries jobs in order of weighted waiting (weight times the
time their rounds wait, ready but not started) and repeats while a pass keeps
a move. Its work is counted (:data:`MAX_WORK`), never timed, so the same input
gives the same plan.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

import numpy as np

from hetsched.planning.pool.evaluator import Evaluation, TaskSchedule, by_gpu, evaluate
from hetsched.planning.pool.problem import PoolProblem

#: the work the search may spend, in all: gaps looked at, tasks placed, and per job
#: tried the plan's task count (its gaps are sorted and the result evaluated)
MAX_WORK = 10_000_000
#: a task fits a gap it overruns by this share of its length (float rounding)
_EPS = 1e-9


@dataclass
class Reinserted:
    schedule: TaskSchedule
    objective: float
    tries: int
    accepted: int
    work: int = 0


class _Gaps:
    """Per GPU, the free time between the tasks of every job but one."""

    def __init__(self, pp: PoolProblem, s: TaskSchedule, ev: Evaluation, j: int,
                 shortest: float) -> None:
        keep = np.asarray(s.job) != j
        self.lo: list[list[float]] = []  # gap k of a GPU: [lo[k], hi[k])
        self.hi: list[list[float]] = []
        for st, en in by_gpu(pp.K, np.asarray(s.start, dtype=float)[keep], ev.end[keep],
                             np.asarray(s.gpu, dtype=np.int64)[keep]):
            lo = np.concatenate([[-np.inf], en])
            hi = np.concatenate([st, [np.inf]])
            wide = hi - lo >= shortest * (1 - 1e-9)  # no task of the job fits the others
            self.lo.append(lo[wide].tolist())
            self.hi.append(hi[wide].tolist())
        # the last query and answer per GPU: fit is non-decreasing in x, so a query at x
        # between the last query's x and its answer, for the same d, has the same answer
        self.last_x = np.full(pp.K, np.inf)
        self.last_d = np.full(pp.K, np.nan)
        self.last_a = np.full(pp.K, np.inf)
        self.lookups = 0

    def fit_all(self, x: float, d: np.ndarray, limit: float) -> np.ndarray:
        """:meth:`fit` on every GPU where d is finite (inf elsewhere)."""
        hit = (self.last_d == d) & (self.last_x <= x) & (x <= self.last_a)
        out = np.where(hit, self.last_a, np.inf)
        for g in np.flatnonzero(~hit & np.isfinite(d)).tolist():
            out[g] = self.fit(g, x, float(d[g]), limit)
        return out

    def fit(self, g: int, x: float, d: float, limit: float) -> float:
        """Earliest start >= x of a task of d seconds on GPU g (inf: none before limit)."""
        lo, hi = self.lo[g], self.hi[g]
        k = k0 = bisect.bisect_right(hi, x)
        slack = _EPS * max(1.0, d)
        while True:
            a = max(lo[k], x)
            if a > limit:
                a = np.inf
                break
            if a + d <= hi[k] + slack:
                break
            k += 1
        self.last_x[g], self.last_d[g], self.last_a[g] = x, d, a
        self.lookups += k - k0 + 1
        return a


def _job_rows(s: TaskSchedule, j: int) -> list[list[int]]:
    """Job j's task rows, round by round (tasks in order)."""
    idx = np.nonzero(np.asarray(s.job) == j)[0]
    rnd, task = np.asarray(s.rnd)[idx], np.asarray(s.task)[idx]
    idx = idx[np.lexsort((task, rnd))]
    r = np.asarray(s.rnd)[idx]
    cuts = np.nonzero(np.diff(r))[0] + 1
    return [c.tolist() for c in np.split(idx, cuts)]


def _durations(pp: PoolProblem, s: TaskSchedule, j: int, rows: list[int]) -> np.ndarray:
    """(tasks, GPUs) compute seconds of job j's ``rows`` on every GPU (inf: not allowed)."""
    from hetsched.planning.pool.uneven import task_compute_s

    assert s.batch is not None and s.iters is not None
    p = pp.base
    T = p.T
    typ = np.tile(np.arange(T), len(rows))
    jj = np.full(len(typ), j)
    bb = np.repeat(np.asarray(s.batch, dtype=np.int64)[rows], T)
    secs = task_compute_s(pp, jj, typ, bb, np.repeat(np.asarray(s.iters)[rows], T))
    secs = np.where(p.allowed[jj, typ] & (bb <= p.cap[jj, typ]), secs, np.inf)
    return secs.reshape(len(rows), T)[:, pp.gpu_type]


def _place_round(gaps: _Gaps, dur: np.ndarray, ready: float, limit: float
                 ) -> list[tuple[int, int, float]] | None:
    """(task, GPU, start) of each of a round's tasks (``dur``: tasks x GPUs seconds),
    longest first, each on the GPU that finishes it first from ``ready`` in the gaps
    (None: one does not fit before ``limit``)."""
    own: dict[int, float] = {}
    groups: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}  # one per distinct row

    def at(d: np.ndarray, g: int) -> float:
        return gaps.fit(g, own.get(g, ready), float(d[g]), limit)

    out = []
    for k in np.argsort(-dur.min(axis=1), kind="stable").tolist():
        d = dur[k]
        key = d.tobytes()
        if key not in groups:
            x = gaps.fit_all(ready, d, limit)
            for h in own:  # GPUs this round already uses: after its tasks there
                x[h] = at(d, h) if np.isfinite(d[h]) else np.inf
            groups[key] = (d, x)
        x = groups[key][1]
        g = int(np.argmin(x + d))
        if not np.isfinite(x[g]):
            return None
        out.append((k, g, float(x[g])))
        own[g] = float(x[g]) + float(d[g])
        for d2, x2 in groups.values():
            if np.isfinite(d2[g]):
                x2[g] = at(d2, g)
    return out


def _recreate(pp: PoolProblem, s: TaskSchedule, ev: Evaluation, j: int,
              budget: list[int]) -> TaskSchedule | None:
    """``s`` with job j's rounds re-placed into the other jobs' gaps (None: it does not
    finish earlier, or the work budget ran out)."""
    from hetsched.planning.pool.parallelism import sync_s
    from hetsched.planning.pool.uneven import gpu_nodes

    by_round = _job_rows(s, j)
    cache: dict[tuple[int, ...], np.ndarray] = {}
    durs = []
    for rows in by_round:  # the rounds' tasks repeat a few sizes
        sig = (*np.asarray(s.batch)[rows].tolist(), int(np.asarray(s.iters)[rows[0]]))
        if sig not in cache:
            cache[sig] = _durations(pp, s, j, rows)
        durs.append(cache[sig])
    gaps = _Gaps(pp, s, ev, j, min(float(d.min()) for d in cache.values()))
    nodes = gpu_nodes(pp)
    old_end = float(ev.completion[j])
    start = np.asarray(s.start, dtype=float).copy()
    gpu = np.asarray(s.gpu, dtype=np.int64).copy()
    ready = float(pp.arrival[j])
    for rows, dur in zip(by_round, durs, strict=True):
        placed = _place_round(gaps, dur, ready, old_end)
        if placed is None:
            return None
        own: dict[int, float] = {}
        ends = []
        for k, g, x in placed:
            row = rows[k]
            start[row], gpu[row] = x, g
            own[g] = ends_at = x + float(dur[k, g])
            ends.append((ends_at, row))
        used = sorted(own)
        types = sorted({int(pp.gpu_type[g]) for g in used})
        sync = sync_s(pp.base, j, types, len(rows), len(set(nodes[used].tolist())) == 1)
        ready = max(e + sync + float(pp.round_optimizer_s[j, int(pp.gpu_type[gpu[r]])])
                    for e, r in ends)
        if ready >= old_end - 1e-9 * max(1.0, old_end):
            return None
        budget[0] -= gaps.lookups + len(rows)
        gaps.lookups = 0
        if budget[0] < 0:
            return None
    return replace(s, start=start, gpu=gpu, params=dict(s.params))


def _order(pp: PoolProblem, s: TaskSchedule, ev: Evaluation) -> list[int]:
    """The jobs whose rounds wait (ready, not started), by weighted waiting, most first."""
    from hetsched.planning.pool.uneven import rounds_of

    rid, rj, _ = rounds_of(pp, np.asarray(s.job, dtype=np.int64),
                           np.asarray(s.rnd, dtype=np.int64), np.asarray(s.task, dtype=np.int64))
    first = np.full(len(rj), np.inf)
    bar = np.full(len(rj), -np.inf)
    np.minimum.at(first, rid, np.asarray(s.start, dtype=float))
    np.maximum.at(bar, rid, ev.sync_end)
    same = np.zeros(len(rj), dtype=bool)
    same[1:] = rj[1:] == rj[:-1]
    ready = np.where(same, np.concatenate([[0.0], bar[:-1]]), pp.arrival[rj])
    wait = np.bincount(rj, weights=np.maximum(0.0, first - ready), minlength=pp.S)
    score = pp.weight * wait
    return [int(i) for i in np.lexsort((np.arange(pp.S), -score)) if score[i] > 0]


def reinsert_jobs(pp: PoolProblem, s: TaskSchedule) -> Reinserted:
    """Re-place waiting jobs into the gaps while it lowers the weighted JCT."""
    if s.batch is None or s.iters is None or len(s.job) == 0:
        return Reinserted(s, evaluate(pp, s).objective, 0, 0)
    ev = evaluate(pp, s)
    best, best_v = s, ev.objective
    tries = accepted = 0
    budget = [MAX_WORK]
    while True:
        kept = 0
        for j in _order(pp, best, ev):
            if budget[0] <= 0:
                return Reinserted(best, best_v, tries, accepted, MAX_WORK - budget[0])
            budget[0] -= len(best.job)  # the gaps' sort, and the evaluation
            cand = _recreate(pp, best, ev, j, budget)
            if cand is None:
                continue
            tries += 1
            cev = evaluate(pp, cand)  # checks it: the model's constraints hold
            if cev.objective < best_v - 1e-9 * max(1.0, abs(best_v)):
                best, best_v, ev = cand, cev.objective, cev
                accepted += 1
                kept += 1
        if not kept:
            return Reinserted(best, best_v, tries, accepted, MAX_WORK - budget[0])


__all__ = ["Reinserted", "reinsert_jobs"]
