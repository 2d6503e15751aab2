"""A space plan as a pool task plan, exactly.

A space plan is a pool plan in which each GPU runs one job's work back to back.
With uneven tasks (:mod:`.uneven`) the pool model expresses it as it is: every
segment of a job (its workers, their local batches, ``n`` iterations) becomes
``ceil(n / N_i)`` rounds of one task per worker at that worker's local batch
(``N_i``: the job's task size), the rounds back to back on the segment's GPUs
from the segment's first iteration on (after its restart). The job's GPU set
changes where its segments change. The evaluator times such a round exactly as
the space planner times an iteration of the segment (slowest worker's step plus
the worker set's synchronisation), so the task plan's weighted JCT is the space
plan's, up to whole iterations: a segment runs a fractional number of
iterations in the space plan and a whole number here (rounded to nearest
cumulatively, or each up, or each down, whichever the evaluator times lowest;
the job's last segment takes what is left).

:func:`retime` places a task plan's tasks in a given order at their earliest
times (round barrier, GPU free, release): it keeps every task on its GPU and
every GPU's order, so dropping the releases (the space plan's restart gaps,
which pool mode does not pay: switching tasks costs its measured per-task
overhead) never moves a task later.
"""

from __future__ import annotations

import math

import numpy as np

from hetsched.core.plan import Plan
from hetsched.planning.pool.evaluator import TaskSchedule
from hetsched.planning.pool.problem import PoolProblem

#: how a segment's fractional iterations become whole ones (the job's last segment
#: takes what is left): cumulative nearest, each rounded up, each rounded down
ROUNDINGS = ("nearest", "up", "down")


def _whole_iterations(pp: PoolProblem, i: int, its: list[float], how: str) -> list[int]:
    """Whole iterations per segment, rounded ``how`` (:data:`ROUNDINGS`)."""
    total = int(pp.total_iters[i])
    out, done, cum = [], 0, 0.0
    for k, x in enumerate(its):
        cum += x
        if k == len(its) - 1:
            upto = total
        elif how == "nearest":
            upto = int(round(cum))
        else:
            upto = done + (math.ceil(x - 1e-9) if how == "up" else math.floor(x + 1e-9))
        upto = min(total, max(done, upto))
        out.append(upto - done)
        done = upto
    return out


def space_tasks(pp: PoolProblem, plan: Plan) -> tuple[TaskSchedule, np.ndarray] | None:
    """The task plan of space ``plan`` and each task's release (its segment's first
    iteration); None when the plan is not one the pool model can express (a job
    missing, co-located segments, an elastic batch other than the spec's).

    Of the three ways to make segments' iterations whole (:data:`ROUNDINGS`), the one
    the evaluator times lowest."""
    got = timed_space_tasks(pp, plan)
    return None if got is None else (got[0], got[1])


def timed_space_tasks(pp: PoolProblem, plan: Plan
                      ) -> tuple[TaskSchedule, np.ndarray, float] | None:
    """:func:`space_tasks` with the evaluator's weighted JCT of the task plan (it times
    each rounding to choose one)."""
    from hetsched.planning.pool.evaluator import evaluate

    best: tuple[TaskSchedule, np.ndarray] | None = None
    best_v = math.inf
    for how in ROUNDINGS:
        got = _space_tasks(pp, plan, how)
        if got is None:
            return None
        v = evaluate(pp, got[0]).objective
        if v < best_v:
            best, best_v = got, v
    return None if best is None else (best[0], best[1], best_v)


def _space_tasks(pp: PoolProblem, plan: Plan, how: str
                 ) -> tuple[TaskSchedule, np.ndarray] | None:
    """:func:`space_tasks` with one rounding."""
    p = pp.base
    gindex = {(g.node, int(g.index)): k for k, g in enumerate(p.cluster.gpus)}
    by_name = {jp.name: jp for jp in plan.jobs}
    parts: list[tuple[np.ndarray, ...]] = []  # job rnd task gpu batch iters release
    for i, spec in enumerate(p.jobs):
        jp = by_name.get(spec.name)
        if jp is None:
            return None
        segs = sorted((s for s in jp.segments if s.workers and s.iterations > 0),
                      key=lambda s: s.start_s)
        if not segs or any(s.group is not None or s.global_batch not in (None, int(p.B[i]))
                           for s in segs):
            return None
        rnd = 0
        N = int(pp.N[i])
        for seg, n in zip(segs, _whole_iterations(pp, i, [s.iterations for s in segs], how),
                          strict=True):
            ws = [(gindex.get((w.node, int(w.gpu)), -1), int(w.local_batch))
                  for w in seg.workers]
            if any(g < 0 for g, _ in ws) or sum(b for _, b in ws) != int(p.B[i]):
                return None
            if n <= 0:
                continue
            nr, k = -(-n // N), len(ws)  # rounds of N iterations, the last one the rest
            per = np.full(nr, N, dtype=np.int64)
            per[-1] = n - (nr - 1) * N
            gs = np.array([g for g, _ in ws], dtype=np.int64)
            bs = np.array([b for _, b in ws], dtype=np.int64)
            parts.append((np.full(nr * k, i), np.repeat(np.arange(rnd, rnd + nr), k),
                          np.tile(np.arange(k), nr), np.tile(gs, nr), np.tile(bs, nr),
                          np.repeat(per, k), np.full(nr * k, seg.start_s + seg.restart_s)))
            rnd += nr
    if not parts:
        return None
    job, rnd_a, task, gpu, batch, iters = (
        np.concatenate([pt[c] for pt in parts]).astype(np.int64) for c in range(6))
    release = np.concatenate([pt[6] for pt in parts]).astype(float)
    s = TaskSchedule(job, rnd_a, task, gpu, np.zeros(len(job)), policy="space",
                     batch=batch, iters=iters)
    s.start = retime(pp, s, release, release)
    return s, release


def retime(pp: PoolProblem, s: TaskSchedule, key: np.ndarray,
           release: np.ndarray | None = None) -> np.ndarray:
    """Start times placing ``s``'s tasks in the order of ``key`` (per round; made
    non-decreasing along each job's rounds), each at its earliest: after its round's
    predecessor's barrier, its GPU's previous task and its release."""
    from hetsched.planning.pool.evaluator import task_times
    from hetsched.planning.pool.uneven import rounds_of, uneven_times

    job = np.asarray(s.job, dtype=np.int64)
    rnd = np.asarray(s.rnd, dtype=np.int64)
    task = np.asarray(s.task, dtype=np.int64)
    gpu = np.asarray(s.gpu, dtype=np.int64)
    if s.batch is not None and s.iters is not None:
        rid, rj, _ = rounds_of(pp, job, rnd, task)
        tc, ts = uneven_times(pp, job, gpu, np.asarray(s.batch, dtype=np.int64),
                              np.asarray(s.iters, dtype=np.int64), rid, rj)
    else:
        tc, ts = task_times(pp, job, rnd, gpu)
        off = np.concatenate([[0], np.cumsum(pp.R)[:-1]])
        rid = off[job] + rnd
    rkey = np.full(int(rid.max()) + 1 if len(rid) else 0, -np.inf)
    np.maximum.at(rkey, rid, np.asarray(key, dtype=float))
    rjob = np.zeros(len(rkey), dtype=np.int64)
    rjob[rid] = job
    bounds = np.searchsorted(rjob, np.arange(pp.S + 1))  # round ids run job by job, in order
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        rkey[a:b] = np.maximum.accumulate(rkey[a:b])  # non-decreasing along a job's rounds
    tkey = rkey[rid]
    order = np.lexsort((task, rnd, job, tkey))
    rel = np.full(len(job), -np.inf) if release is None else np.asarray(release, dtype=float)
    return _place(pp, order, job, rnd, gpu, tc, ts, rel)


def _place(pp: PoolProblem, order: np.ndarray, job: np.ndarray, rnd: np.ndarray,
           gpu: np.ndarray, tc: np.ndarray, ts: np.ndarray, rel: np.ndarray) -> np.ndarray:
    """The list scheduler: tasks in ``order`` at max(round ready, GPU free, release)."""
    job_l, rnd_l, gpu_l = job.tolist(), rnd.tolist(), gpu.tolist()
    tc_l, ts_l, rel_l = tc.tolist(), ts.tolist(), rel.tolist()
    free = [0.0] * pp.K
    cur = [-1] * pp.S
    rdy = pp.arrival.astype(float).tolist()
    bar = list(rdy)
    start = [0.0] * len(job_l)
    for idx in order.tolist():
        j, g = job_l[idx], gpu_l[idx]
        if rnd_l[idx] != cur[j]:
            cur[j] = rnd_l[idx]
            rdy[j] = bar[j]
            bar[j] = -np.inf
        x = max(rdy[j], free[g], rel_l[idx])
        e = x + tc_l[idx]
        free[g] = e
        start[idx] = x
        if e + ts_l[idx] > bar[j]:
            bar[j] = e + ts_l[idx]
    return np.array(start, dtype=float)


__all__ = ["space_tasks", "timed_space_tasks", "retime"]
