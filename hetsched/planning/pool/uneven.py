"""Uneven tasks: rounds whose tasks carry their own share of the global batch.

The pool model of :mod:`.problem` gives job ``i`` ``R_i`` rounds of ``P_i``
equal slices. A schedule may instead give every task its own local batch and
iterations (``TaskSchedule.batch``/``iters``); its rounds are then what its rows
say, and this module checks and times them:

- job ``i``'s rounds are ``0..R'_i - 1`` (any number), round ``r`` has tasks
  ``0..k_r - 1`` (any number, on any GPU types the job may use), all running
  the round's ``n_r`` iterations, ``sum_r n_r`` = the job's iterations;
- a round's local batches add up to the job's global batch, each within its
  GPU type's memory cap;
- a task's compute time is ``n_r`` times the job's step time on its GPU type at
  its local batch (the profile's affine line or piecewise curve: the space
  planner's model), plus the executor's measured per-task overhead as in the
  equal model;
- the round synchronises the gradients of its ``k_r`` workers once, as the
  executor does (its tasks accumulate their iterations' gradients): one time
  the communication the space planner charges that worker set per iteration
  (calibrated from multi-GPU measurements of the types used, else the ring
  all-reduce over the bandwidth of its placement: intra-node when all its tasks
  ran on one node), paid after each task's compute as in the equal model.

So a space plan's segment (its workers, their balanced shares, ``n``
iterations) is a chain of rounds here with the space plan's compute per
iteration, ``max_k step_k``, and one synchronisation per round where the space
plan synchronises every iteration (:mod:`.from_space`).
"""

from __future__ import annotations

import math

import numpy as np

from hetsched.planning.pool.fusion import fused_compute
from hetsched.planning.pool.parallelism import sync_s
from hetsched.planning.pool.problem import PoolProblem, pool_iteration_times


class _Invalid(ValueError):
    pass


def step_at(pp: PoolProblem, job: np.ndarray, typ: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """Step time of each (job, GPU type, local batch): the space planner's step model
    (``PlanningProblem.step_times``: line, or curve where profiled so)."""
    p = pp.base
    if len(job) == 0:
        return np.empty(0)
    # each distinct (job, local batch) once, on every type: a plan's tasks repeat a few
    # (one int64 key per pair: np.unique over rows sorts a structured view, 100x slower)
    wide = int(batch.max()) + 1
    ukey, inv = np.unique(job.astype(np.int64) * wide + batch, return_inverse=True)
    ujob, ubatch = ukey // wide, ukey % wide
    table = np.empty((len(ukey), p.T))
    bounds = np.searchsorted(ujob, np.arange(p.S + 1))  # ukey is sorted, so by job
    for i in np.unique(ujob).tolist():
        a, z = int(bounds[i]), int(bounds[i + 1])
        grid = np.repeat(ubatch[a:z].astype(float)[:, None], p.T, axis=1)
        table[a:z] = p.step_times(i, grid)
    return table[np.asarray(inv).reshape(-1), typ]


def iteration_at(pp: PoolProblem, job: np.ndarray, typ: np.ndarray, batch: np.ndarray
                 ) -> np.ndarray:
    """An executor iteration of each (job, GPU type, local batch): the step without the
    optimizer's share, as equal-split tasks are timed (problem.pool_iteration_times)."""
    return pool_iteration_times(step_at(pp, job, typ, batch), pp.optimizer_s[job, typ])


def gpu_nodes(pp: PoolProblem) -> np.ndarray:
    """(K,) node index of each GPU of the pool."""
    names: dict[str, int] = {}
    return np.array([names.setdefault(g.node, len(names)) for g in pp.base.cluster.gpus],
                    dtype=np.int64)


def rounds_of(pp: PoolProblem, job: np.ndarray, rnd: np.ndarray, task: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(round id of each task, job of each round, first round id of each job).

    Round ids are numbered job by job, rounds in order; raises _Invalid unless every
    job has rounds ``0..R'-1`` and every round tasks ``0..k-1``, each once.
    """
    n = len(job)
    maxr = int(rnd.max()) + 1
    key = job * maxr + rnd
    order = np.lexsort((task, key))
    ukey, first, counts = np.unique(key[order], return_index=True, return_counts=True)
    if (task[order] != np.arange(n) - np.repeat(first, counts)).any():
        raise _Invalid("a task is missing or scheduled twice (a round's tasks are 0..k-1)")
    rj, rr = ukey // maxr, ukey % maxr
    per_job = np.bincount(rj, minlength=pp.S)
    if (per_job == 0).any():
        raise _Invalid(f"job {pp.base.jobs[int(np.argmin(per_job))].name} has no task")
    first_round = np.concatenate([[0], np.cumsum(per_job)[:-1]])
    if (rr != np.arange(len(ukey)) - np.repeat(first_round, per_job)).any():
        raise _Invalid("a job's rounds are not 0..R-1")
    rid = np.empty(n, dtype=np.int64)
    rid[order] = np.repeat(np.arange(len(ukey)), counts)
    return rid, rj, first_round


def check_shapes(pp: PoolProblem, job: np.ndarray, gpu: np.ndarray, batch: np.ndarray,
                 iters: np.ndarray, rid: np.ndarray, rj: np.ndarray) -> np.ndarray:
    """Each round's iterations (checked: one count per round, the job's total, batches
    summing to the global batch, within the GPU type's cap)."""
    p = pp.base
    nr = len(rj)
    lo = np.full(nr, np.iinfo(np.int64).max)
    hi = np.zeros(nr, dtype=np.int64)
    np.minimum.at(lo, rid, iters)
    np.maximum.at(hi, rid, iters)
    if (lo != hi).any():
        raise _Invalid("the tasks of a round run different numbers of iterations")
    done = np.bincount(rj, weights=lo.astype(float), minlength=pp.S)
    if (np.abs(done - pp.total_iters) > 0.5).any():
        i = int(np.argmax(np.abs(done - pp.total_iters)))
        raise _Invalid(f"job {p.jobs[i].name} runs {int(done[i])} iterations, "
                       f"not {int(pp.total_iters[i])}")
    bsum = np.bincount(rid, weights=batch.astype(float), minlength=nr)
    if (np.abs(bsum - p.B[rj]) > 0.5).any():
        raise _Invalid("a round's local batches do not add up to the job's global batch")
    typ = pp.gpu_type[gpu]
    if (~p.allowed[job, typ]).any() or (batch > p.cap[job, typ]).any():
        raise _Invalid("a task runs on a GPU type its job may not use, or above its cap")
    return lo


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of the first of each distinct row, each row's distinct-row number) of a
    non-negative int matrix. One mixed-radix int64 key per row where it fits: np.unique
    over rows sorts a structured view, about 100x slower on a large plan."""
    if len(a) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    radix = (a.max(axis=0) + 1).tolist()
    if math.prod(int(r) for r in radix) >= 2 ** 62:
        _, first, inv = np.unique(a, axis=0, return_index=True, return_inverse=True)
        return first, np.asarray(inv).reshape(-1)
    key = np.zeros(len(a), dtype=np.int64)
    for c, r in enumerate(radix):
        key = key * int(r) + a[:, c]
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return first, np.asarray(inv).reshape(-1)


def fused_iterations_s(pp: PoolProblem, job: np.ndarray, typ: np.ndarray, batch: np.ndarray,
                       iters: np.ndarray) -> np.ndarray:
    """Seconds of each task's iterations (job, GPU type, local batch, iterations) run in
    fused passes (:mod:`.fusion`, the job's chunk on that type)."""
    def one(j: np.ndarray, t: np.ndarray, b: np.ndarray) -> np.ndarray:
        return iteration_at(pp, j, t, b)

    return fused_compute(one, job, typ, batch, iters, pp.chunk[job, typ])


def task_compute_s(pp: PoolProblem, job: np.ndarray, typ: np.ndarray, batch: np.ndarray,
                   iters: np.ndarray) -> np.ndarray:
    """Compute seconds of each uneven task (job, GPU type, local batch, iterations): its
    iterations at the executor's step in fused passes, plus the measured per-task
    overhead's share."""
    return fused_iterations_s(pp, job, typ, batch, iters) \
        + iters * pp.task_overhead_s[job, typ] / pp.N[job]


def uneven_times(pp: PoolProblem, job: np.ndarray, gpu: np.ndarray, batch: np.ndarray,
                 iters: np.ndarray, rid: np.ndarray, rj: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(compute, sync) seconds of every task of a checked uneven schedule."""
    typ = pp.gpu_type[gpu]
    tc = task_compute_s(pp, job, typ, batch, iters)
    nodes = gpu_nodes(pp)[gpu]
    nr = len(rj)
    counts = np.zeros((nr, pp.T), dtype=np.int64)  # each round's workers per GPU type
    np.add.at(counts, (rid, typ), 1)
    nlo = np.full(nr, np.iinfo(np.int64).max)
    nhi = np.full(nr, -1)
    np.minimum.at(nlo, rid, nodes)
    np.maximum.at(nhi, rid, nodes)
    sig = np.column_stack([rj, counts, (nlo == nhi).astype(np.int64)])
    first, inv = unique_rows(sig)
    vals = np.array([sync_s(pp.base, int(u[0]), [t for t in range(pp.T) if u[1 + t]],
                            int(u[1:-1].sum()), bool(u[-1])) for u in sig[first]])
    s_round = vals[np.asarray(inv).reshape(-1)]
    # the coordinator's optimizer step, once per round where no overhead was measured
    return tc, s_round[rid] + pp.round_optimizer_s[job, typ]


__all__ = ["step_at", "iteration_at", "gpu_nodes", "rounds_of", "check_shapes",
           "unique_rows", "fused_iterations_s", "task_compute_s", "uneven_times"]
