"""The one pool-mode evaluator: validates a task schedule and computes its objective.

Every pool policy returns only *where* (GPU) and *when* (start) each task
runs. This module recomputes everything else from the model of
:mod:`hetsched.planning.pool.problem` — each task's compute end and synchronisation
end, every round's barrier, every job's completion, the total weighted JCT —
and rejects any schedule that breaks a constraint of Hare_Sched (4)-(8):
a task missing or duplicated, a task on a GPU type it may not use, a task
before its job's arrival, two tasks overlapping on one GPU, a round starting
before every task of the previous round has finished and synchronised. So
all pool policies are measured by the same code, and the numbers compare.

:func:`to_plan` turns an evaluated schedule into a :class:`~hetsched.core.plan.Plan`
(foundation keys plus the compact ``tasks`` section); :func:`evaluate_tasks_section`
re-reads that section and evaluates it again (tests, scripts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetsched.core.plan import JobPlan, Plan, Segment, Worker
from hetsched.core.pool_tasks import (
    COLUMNS,
    UNEVEN_COLUMNS,
    GpuTasks,
    PoolJobTasks,
    PoolMemory,
    PoolTasks,
)
from hetsched.planning.pool.compact import compress_rows, count_rows, expand_runs
from hetsched.planning.pool.memory import plan_gpu_memory
from hetsched.planning.pool.problem import PoolProblem


class InvalidSchedule(ValueError):
    """A pool schedule breaks a constraint of Hare_Sched (a policy bug, never user input)."""


@dataclass
class TaskSchedule:
    """What a pool policy decides: for every task (job, round, task) its GPU and start time
    (and, for uneven tasks, its local batch and iterations)."""

    job: np.ndarray
    rnd: np.ndarray
    task: np.ndarray
    gpu: np.ndarray
    start: np.ndarray
    policy: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    #: uneven tasks (:mod:`.uneven`): each task's own local batch and iterations; None:
    #: the pool model's equal slices and round sizes
    batch: np.ndarray | None = None
    iters: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.job)


@dataclass
class Evaluation:
    """Model times of every task and the resulting job completions and objective."""

    end: np.ndarray  # compute end of each task (GPU free)
    sync_end: np.ndarray  # end of its synchronisation
    completion: np.ndarray  # (S,) job completion (last round's barrier)
    objective: float  # total weighted JCT: sum w_i (C_i - a_i)

    def jct(self, pp: PoolProblem) -> np.ndarray:
        return self.completion - pp.arrival


def task_times(pp: PoolProblem, job: np.ndarray, rnd: np.ndarray,
               gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compute and sync durations of tasks on the given GPUs (inf where not allowed): a
    task's iterations at the executor's step, then one exchange of its gradients."""
    typ = pp.gpu_type[gpu]
    n = pp.round_iters_array(job, rnd)
    return n * pp.t_it[job, typ], pp.s_task[job, typ]


def by_gpu(K: int, start: np.ndarray, end: np.ndarray, gpu: np.ndarray
           ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per GPU ``0..K-1``, the (starts, ends) of its tasks in start order."""
    order = np.lexsort((start, gpu))
    bounds = np.searchsorted(gpu[order], np.arange(K + 1)).tolist()
    return [(start[order[a:b]], end[order[a:b]])
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def evaluate(pp: PoolProblem, s: TaskSchedule, tol: float | None = None) -> Evaluation:
    """Validate ``s`` against Hare_Sched's constraints and compute its objective."""
    job = np.asarray(s.job, dtype=np.int64)
    rnd = np.asarray(s.rnd, dtype=np.int64)
    task = np.asarray(s.task, dtype=np.int64)
    gpu = np.asarray(s.gpu, dtype=np.int64)
    start = np.asarray(s.start, dtype=float)
    if s.batch is not None:
        return _evaluate_uneven(pp, s, job, rnd, task, gpu, start, tol)
    n = pp.n_tasks
    if not (len(job) == len(rnd) == len(task) == len(gpu) == len(start) == n):
        raise InvalidSchedule(f"{s.policy}: {len(job)} tasks scheduled, the problem has {n}")
    if n == 0:
        return Evaluation(start, start, np.zeros(0), 0.0)
    if ((job < 0) | (job >= pp.S)).any() or ((gpu < 0) | (gpu >= pp.K)).any():
        raise InvalidSchedule(f"{s.policy}: job or GPU index out of range")
    if ((rnd < 0) | (rnd >= pp.R[job]) | (task < 0) | (task >= pp.P[job])).any():
        raise InvalidSchedule(f"{s.policy}: round or task index out of range")
    R = pp.R.astype(np.int64)
    P = pp.P.astype(np.int64)
    off_task = np.concatenate([[0], np.cumsum(R * P)[:-1]])
    tid = off_task[job] + rnd * P[job] + task
    if (np.bincount(tid, minlength=n) != 1).any():
        raise InvalidSchedule(f"{s.policy}: a task is missing or scheduled twice")
    if not np.isfinite(start).all():
        raise InvalidSchedule(f"{s.policy}: a start time is not finite")
    tc, ts = task_times(pp, job, rnd, gpu)
    if not np.isfinite(tc).all():
        k = int(np.nonzero(~np.isfinite(tc))[0][0])
        raise InvalidSchedule(f"{s.policy}: job {pp.base.jobs[job[k]].name} runs a task on "
                              f"GPU type {pp.base.types[pp.gpu_type[gpu[k]]]} it may not use")
    off_round = np.concatenate([[0], np.cumsum(R)[:-1]])
    rj = np.repeat(np.arange(pp.S), R)
    return _finish(pp, s.policy, job, gpu, start, start + tc, start + tc + ts,
                   off_round[job] + rnd, rj, tol)


def _evaluate_uneven(pp: PoolProblem, s: TaskSchedule, job: np.ndarray, rnd: np.ndarray,
                     task: np.ndarray, gpu: np.ndarray, start: np.ndarray,
                     tol: float | None) -> Evaluation:
    """Tasks with their own local batch and iterations (:mod:`.uneven`)."""
    from hetsched.planning.pool.uneven import _Invalid, check_shapes, rounds_of, uneven_times

    batch = np.asarray(s.batch, dtype=np.int64)
    iters = np.asarray(s.iters if s.iters is not None else [], dtype=np.int64)
    n = len(job)
    if not (len(rnd) == len(task) == len(gpu) == len(start) == len(batch) == len(iters) == n):
        raise InvalidSchedule(f"{s.policy}: the task columns differ in length")
    if n == 0:
        if pp.S:
            raise InvalidSchedule(f"{s.policy}: no tasks scheduled")
        return Evaluation(start, start, np.zeros(0), 0.0)
    if ((job < 0) | (job >= pp.S)).any() or ((gpu < 0) | (gpu >= pp.K)).any() or \
            (rnd < 0).any() or (task < 0).any() or (batch < 1).any() or (iters < 1).any():
        raise InvalidSchedule(f"{s.policy}: an index, batch or iteration count out of range")
    if not np.isfinite(start).all():
        raise InvalidSchedule(f"{s.policy}: a start time is not finite")
    try:
        rid, rj, _ = rounds_of(pp, job, rnd, task)
        check_shapes(pp, job, gpu, batch, iters, rid, rj)
    except _Invalid as e:
        raise InvalidSchedule(f"{s.policy}: {e}") from None
    tc, ts = uneven_times(pp, job, gpu, batch, iters, rid, rj)
    return _finish(pp, s.policy, job, gpu, start, start + tc, start + tc + ts, rid, rj, tol)


def _finish(pp: PoolProblem, policy: str, job: np.ndarray, gpu: np.ndarray,
            start: np.ndarray, end: np.ndarray, sync_end: np.ndarray, rid: np.ndarray,
            rj: np.ndarray, tol: float | None) -> Evaluation:
    """Arrivals, no overlap on a GPU, round barriers; completions and the objective.

    ``rid``: each task's round id, numbered job by job with a job's rounds in order;
    ``rj``: the job of each round id.
    """
    if tol is None:
        tol = 1e-6 + 1e-9 * float(np.abs(sync_end).max())
    if (start < pp.arrival[job] - tol).any():
        raise InvalidSchedule(f"{policy}: a task starts before its job's arrival")
    order = np.lexsort((start, gpu))
    g, st, en = gpu[order], start[order], end[order]
    same = g[1:] == g[:-1]
    if (same & (st[1:] < en[:-1] - tol)).any():
        k = int(np.nonzero(same & (st[1:] < en[:-1] - tol))[0][0])
        raise InvalidSchedule(f"{policy}: two tasks overlap on GPU {int(g[k])} at "
                              f"{st[k + 1]:.6f} < {en[k]:.6f}")
    nr = len(rj)
    rstart = np.full(nr, np.inf)
    rdone = np.full(nr, -np.inf)
    np.minimum.at(rstart, rid, start)
    np.maximum.at(rdone, rid, sync_end)
    nxt = np.nonzero(rj[1:] == rj[:-1])[0]
    if (rstart[nxt + 1] < rdone[nxt] - tol).any():
        raise InvalidSchedule(f"{policy}: a round starts before the previous round's "
                              "tasks and synchronisation have ended")
    last = np.nonzero(np.r_[rj[1:] != rj[:-1], True])[0]
    completion = np.zeros(pp.S)
    completion[rj[last]] = rdone[last]
    objective = float((pp.weight * (completion - pp.arrival)).sum())
    return Evaluation(end, sync_end, completion, objective)


# ---------------------------------------------------------------------------
# Plan output


def tasks_section(pp: PoolProblem, s: TaskSchedule, ev: Evaluation) -> PoolTasks:
    """The plan's ``tasks`` section: per GPU the compact ordered task sequence and memory plan."""
    p = pp.base
    names = [j.name for j in p.jobs]
    gpus = p.cluster.gpus
    order = np.lexsort((s.start, s.gpu))
    g_sorted = np.asarray(s.gpu)[order]
    bounds = np.searchsorted(g_sorted, np.arange(pp.K + 1))
    out_gpus: list[GpuTasks] = []
    loads = warm = 0
    for g in range(pp.K):
        idx = order[bounds[g]:bounds[g + 1]]
        if len(idx) == 0:
            continue
        seq = [int(j) for j in np.asarray(s.job)[idx]]
        mp = plan_gpu_memory(seq, pp.mem_gb.tolist(), float(pp.gpu_mem_gb[g]))
        loads += mp.loads
        warm += len(seq) - mp.loads
        runs = compress_rows(
            [names[j] for j in seq], np.asarray(s.rnd)[idx], np.asarray(s.task)[idx],
            np.asarray(s.start)[idx], ev.end[idx], ev.sync_end[idx], mp.keep,
            [[names[o] for o in e] for e in mp.evict_others],
            None if s.batch is None else np.asarray(s.batch)[idx],
            None if s.iters is None else np.asarray(s.iters)[idx])
        gg = gpus[g]
        out_gpus.append(GpuTasks(gg.node, gg.index, gg.gpu_type, tuple(runs), len(idx),
                                 float(pp.gpu_mem_gb[g])))
    return PoolTasks(
        jobs=_job_shapes(pp, s), columns=COLUMNS if s.batch is None else UNEVEN_COLUMNS,
        gpus=out_gpus, switch_s=pp.switch_s, total_tasks=len(s),
        stored_rows=sum(g.stored_rows() for g in out_gpus),
        memory=PoolMemory(loads, warm))


def _job_shapes(pp: PoolProblem, s: TaskSchedule) -> dict[str, PoolJobTasks]:
    """Each job's round structure; for uneven tasks the largest round, iterations and
    batch of any of its rounds and its last round's iterations (the rows say the rest)."""
    names = [j.name for j in pp.base.jobs]
    mem = [round(float(m), 6) for m in pp.mem_gb]
    types = pp.base.types
    chunk = [{types[t]: int(c) for t, c in enumerate(pp.chunk[i].tolist()) if c > 1} or None
             for i in range(pp.S)]
    if s.batch is None or s.iters is None:
        return {names[i]: PoolJobTasks(int(pp.P[i]), int(pp.R[i]), int(pp.N[i]),
                                       int(pp.last[i]), int(pp.slice_b[i]), mem[i], chunk[i])
                for i in range(pp.S)}
    job, rnd, task = (np.asarray(x, dtype=np.int64) for x in (s.job, s.rnd, s.task))
    batch, iters = np.asarray(s.batch, dtype=np.int64), np.asarray(s.iters, dtype=np.int64)
    out: dict[str, PoolJobTasks] = {}
    for i in range(pp.S):
        m = job == i
        r, k, b, it = rnd[m], task[m], batch[m], iters[m]
        last = int(r.max())
        out[names[i]] = PoolJobTasks(int(k.max()) + 1, last + 1, int(it.max()),
                                     int(it[r == last][0]), int(b.max()), mem[i], chunk[i])
    return out


def to_plan(pp: PoolProblem, s: TaskSchedule, ev: Evaluation, lower_bound_s: float,
            planning_time_s: float = 0.0, params: dict[str, Any] | None = None) -> Plan:
    """An evaluated pool schedule as a Plan (mode ``pool``), foundation keys kept.

    Each job gets one segment from its first task's start to its completion,
    listing every GPU its tasks ran on with the task's local batch, so scripts
    reading only the foundation keys still see who used which GPU and when.
    """
    p = pp.base
    gpus = p.cluster.gpus
    jobs: list[JobPlan] = []
    first = np.full(pp.S, np.inf)
    np.minimum.at(first, np.asarray(s.job), np.asarray(s.start, dtype=float))
    # each job's GPUs and, for uneven tasks, its largest local batch on each: one key
    # per (job, GPU) pair, reduced with numpy (a plan may have millions of tasks)
    key = np.asarray(s.job, dtype=np.int64) * pp.K + np.asarray(s.gpu, dtype=np.int64)
    pairs, inv = np.unique(key, return_inverse=True)
    used: list[list[int]] = [[] for _ in range(pp.S)]
    for k in pairs.tolist():
        used[k // pp.K].append(k % pp.K)
    own: dict[tuple[int, int], int] = {}
    if s.batch is not None:
        top = np.zeros(len(pairs), dtype=np.int64)
        np.maximum.at(top, np.asarray(inv).reshape(-1), np.asarray(s.batch, dtype=np.int64))
        own = {(k // pp.K, k % pp.K): b for k, b in zip(pairs.tolist(), top.tolist(),
                                                       strict=True)}
    for i, job in enumerate(p.jobs):
        ws = [Worker(gpus[g].node, gpus[g].gpu_type, gpus[g].index,
                     own.get((i, g), int(pp.slice_b[i]))) for g in sorted(used[i])]
        span = float(ev.completion[i] - first[i])
        it = float(pp.total_iters[i])
        seg = Segment(start_s=float(first[i]), end_s=float(ev.completion[i]), workers=ws,
                      iteration_s=span / it if it else 0.0, iterations=it)
        jobs.append(JobPlan(job.name, job.weight, job.arrival_s, [seg], spec=job))
    ref = {j.name: float(p.iters[i] * p.equal_share_time(i)) for i, j in enumerate(p.jobs)}
    plan = Plan(policy=s.policy, jobs=jobs, lower_bound_s=lower_bound_s,
                params={**s.params, **(params or {})}, mode="pool",
                cluster={"name": p.cluster.name,
                         "gpus": {t: int(n) for t, n in zip(p.types, p.n_type, strict=True)}},
                fairness_ref=ref)
    plan.tasks = tasks_section(pp, s, ev)
    plan.planning_time_s = planning_time_s
    return plan


def schedule_from_tasks(pp: PoolProblem, tasks: PoolTasks) -> tuple[TaskSchedule, np.ndarray,
                                                                     np.ndarray]:
    """Expand a plan's ``tasks`` section back into a schedule (plus its stated end times)."""
    p = pp.base
    jindex = {j.name: i for i, j in enumerate(p.jobs)}
    gindex = {(g.node, g.index): k for k, g in enumerate(p.cluster.gpus)}
    job, rnd, task, gpu, start, end, sync_end = [], [], [], [], [], [], []
    batch: list[int | None] = []
    iters: list[int | None] = []
    for gd in tasks.gpus:
        g = gindex[(gd.node, int(gd.gpu))]
        runs = list(gd.runs)
        rows = expand_runs(runs)
        if len(rows) != gd.tasks or count_rows(runs) != len(rows):
            raise InvalidSchedule(f"GPU {gd.node}/{gd.gpu}: runs expand to {len(rows)} "
                                  f"tasks, the section says {gd.tasks}")
        for r in rows:
            job.append(jindex[r.job])
            rnd.append(r.round)
            task.append(r.task)
            gpu.append(g)
            start.append(r.start_s)
            end.append(r.end_s)
            sync_end.append(r.sync_end_s)
            batch.append(r.local_batch)
            iters.append(r.iterations)
    own = [b is not None for b in batch]
    if any(own) and not all(own):
        raise InvalidSchedule("some task rows carry their own local batch and some do not")
    sched = TaskSchedule(np.array(job, dtype=np.int64), np.array(rnd, dtype=np.int64),
                         np.array(task, dtype=np.int64), np.array(gpu, dtype=np.int64),
                         np.array(start, dtype=float), policy="plan",
                         batch=np.array(batch, dtype=np.int64) if any(own) else None,
                         iters=np.array(iters, dtype=np.int64) if any(own) else None)
    return sched, np.array(end, dtype=float), np.array(sync_end, dtype=float)


def evaluate_tasks_section(pp: PoolProblem, tasks: PoolTasks,
                           tol: float = 1e-4) -> Evaluation:
    """Re-evaluate a plan from its ``tasks`` section alone, checking its stated times.

    ``tol`` absorbs the 1 us rounding of written times and the pattern tolerance.
    """
    sched, end, sync_end = schedule_from_tasks(pp, tasks)
    ev = evaluate(pp, sched, tol=tol)
    if len(end) and (np.abs(ev.end - end).max() > tol or np.abs(ev.sync_end - sync_end).max() > tol):
        raise InvalidSchedule("stated task end times disagree with the model")
    return ev
