"""Gavel-FIFO and SRTF: fixed-size baselines that take the fastest GPUs they can.

Each job asks for ``requested_gpus`` (default ``min_gpus``; raised to what its
global batch needs in memory). Like Gavel, a job runs on one GPU type at a
time: the fastest type with enough free GPUs. A job whose request no single
type can ever hold takes the fastest free GPUs across types. Batches are
split equally, as in Gavel.

* ``fifo``: arrival order, strictly: the head job waits for its count and
  blocks the queue; jobs are never moved (Gavel_FIFO in the Hare paper).
* ``srtf``: shortest remaining time first, re-decided at every reset event
  (preemptive; the evaluator charges the restart cost of a move).
"""

from __future__ import annotations

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import equal_iter_time, min_feasible


def fixed_request(p: PlanningProblem, i: int, free: np.ndarray) -> np.ndarray:
    """Counts for job i's request on the best single type, or across types; zeros if none fits."""
    req = int(min(max(p.jobs[i].requested, p.lo[i]), p.hi[i]))
    best, best_t = np.zeros(p.T, dtype=int), np.inf
    fits_some_type = False
    for t in range(p.T):
        if not p.allowed[i, t]:
            continue
        need = max(req, int(-(-p.B[i] // p.cap[i, t])))
        if need > min(p.hi[i], p.B[i]):
            continue
        if need <= p.n_type[t]:
            fits_some_type = True
        if need <= free[t]:
            n = np.zeros(p.T, dtype=int)
            n[t] = need
            tt = equal_iter_time(p, i, n)
            if tt < best_t:
                best, best_t = n, tt
    if best.sum() or fits_some_type:
        return best
    # no single type can ever hold it: fastest free GPUs across types. Taking
    # only `req` of them left a job whose batch needs more GPUs' memory than
    # `req` waiting forever (the plan failed); take as many as hold the batch.
    n = min_feasible(p, i, free, np.argsort(-p.per_gpu_rate(i), kind="stable"), at_least=req)
    if n.sum() == 0 or np.isinf(equal_iter_time(p, i, n)):
        return np.zeros(p.T, dtype=int)
    return n


@register
class FIFO(Policy):
    name = "fifo"
    paper = "Gavel (Narayanan et al., OSDI 2020) FIFO; Gavel_FIFO baseline of Hare"
    summary = "Arrival order, requested GPU count of the fastest free type, waits for it"
    shares = "equal"
    preemptive = False
    EVENT_S, JOB_S = 3e-4, 3e-6

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        X = np.zeros((len(snap.jobs), p.T), dtype=int)
        free = snap.free.copy()
        for r in np.lexsort((snap.jobs, p.arrival[snap.jobs])):
            n = fixed_request(p, int(snap.jobs[r]), free)
            if n.sum() == 0:
                break  # strict FIFO: the head of the queue waits, and so does everyone behind
            X[r] = n
            free -= n
        return X


@register
class SRTF(Policy):
    name = "srtf"
    paper = "Shortest remaining time first (Gavel's and Hare's baseline)"
    summary = "Shortest predicted remaining time first, requested GPU count, preemptive"
    shares = "equal"

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        X = np.zeros((len(snap.jobs), p.T), dtype=int)
        rem = np.empty(len(snap.jobs))
        for r, i in enumerate(snap.jobs):
            n = fixed_request(p, int(i), p.n_type)
            rem[r] = snap.remaining[r] * equal_iter_time(p, int(i), n) if n.sum() else np.inf
        free = snap.free.copy()
        for r in np.argsort(rem, kind="stable"):
            n = fixed_request(p, int(snap.jobs[r]), free)
            if n.sum():
                X[r] = n
                free -= n
        return X
