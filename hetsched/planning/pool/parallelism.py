"""Pool mode: choose each job's parallelism (tasks per round) when the job does not say.

Hare's relaxed scale (HPDC'22, section 4) lets a round's P tasks run on any
free GPUs, in turn when fewer than P are free; so P bounds how many GPUs a job
can use at once, and a pool where the running jobs' P add up to less than the
pool leaves GPUs idle while tasks wait. A job without
``requested_gpus`` used to get P = 1.

Rule (greedy, like a water-filling of GPUs over jobs): start every job at its
smallest feasible P (``min_gpus``, or more when one slice would not fit any
GPU's memory cap); then hand out one more task-slot at a time to the job whose
*weighted progress rate* gains the most from it,

    gain_i(P) = w_i / (iters_i * T_i(P + 1)) - w_i / (iters_i * T_i(P)),

where ``T_i(P)`` is job i's iteration time alone on its P fastest pool GPUs
(balanced slices, and pool mode's synchronisation for P workers, once per
task: spread over the iterations a task at that size would run). Stop when the
P's add up to the pool (so nothing need idle while work waits), or when no job
gains any more at a per-GPU efficiency ``T(1) / (P T(P))`` of at least 50%
(every round runs P slices, so an inefficient P wastes GPU time other jobs
need); each job that stopped short says why (``reasons``): its
``max_gpus``, its global batch (one sample per task), the GPUs it may use, or
no speed-up from one more GPU (intercepts and communication eat it).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable

import numpy as np

from hetsched.core.model import comm_time
from hetsched.core.problem import PlanningProblem

#: one more task must speed the job up by at least this factor to be worth it
MIN_SPEEDUP = 1.02
#: and keep at least this per-GPU efficiency, T(1) / (k T(k)): in a shared pool
#: every round runs P slices, so an inefficient P wastes GPU time other jobs need
MIN_EFFICIENCY = 0.5


#: longest look-ahead (GPUs) when a job's speed-up is not concave
MAX_LOOKAHEAD = 512


def sync_s(p: PlanningProblem, i: int, types: Iterable[int], workers: int,
           single_node: bool) -> float:
    """Pool mode's synchronisation seconds per iteration of job i on ``workers`` GPUs of
    ``types`` (one node or several): the calibrated (multi-scale) sync where measured,
    else the ring estimate over the pool's bandwidth or the profiled sync. The one
    formula for task slots (here), equal slices (problem.py) and uneven rounds
    (uneven.py)."""
    if workers <= 1:
        return 0.0
    types = list(types)
    cal = p.calibrated_comm(i, types, workers)
    if cal is not None:
        return float(cal)
    sync = max(float(p.sync[i, t]) for t in types)
    return float(comm_time(workers, float(p.model_mb[i]), p.bandwidth(single_node), sync))


def _fastest_counts(p: PlanningProblem, i: int, kmax: int) -> np.ndarray:
    """Row k-1: per-type counts of job i's k fastest allowed GPUs (peak rate), k = 1..kmax."""
    rate = p.per_gpu_rate(i)
    order = [int(t) for t in np.argsort(-rate, kind="stable") if p.allowed[i, t]]
    seq = np.concatenate([np.full(int(p.n_type[t]), t) for t in order])[:kmax]
    N = np.zeros((len(seq), p.T), dtype=int)
    for k, t in enumerate(seq):
        N[k:, t] += 1
    return N


#: (chunk, optimizer share), each (S, T): tasks run in fused passes (pool/fusion.py)
Fused = tuple[np.ndarray, np.ndarray]


def _fused_compute(p: PlanningProblem, i: int, N: np.ndarray, fused: Fused) -> np.ndarray:
    """Per step, job i's equal slices on the GPUs of each row of N, in fused passes: the
    slowest used type's pass over its slices' steps (inf where a slice exceeds a cap)."""
    from hetsched.planning.pool.fusion import pool_iteration_times

    chunk, opt = fused
    b = np.ceil(float(p.B[i]) / N.sum(axis=1))[:, None]
    m = np.maximum(1, chunk[i][None, :] // b)
    per = pool_iteration_times(p.step_times(i, m * b), opt[i][None, :]) / m
    per = np.where(b > p.cap[i][None, :], np.inf, per)
    return np.where(N > 0, per, 0.0).max(axis=1)


def _compute_and_sync(p: PlanningProblem, i: int, kmax: int, fused: Fused | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(compute, sync) seconds per iteration of job i on its k fastest pool GPUs, row k-1
    for k = 1..kmax (fewer rows when the job may use fewer GPUs): balanced slices (with
    ``fused``: equal slices in fused passes), and one synchronisation of k workers."""
    N = _fastest_counts(p, i, kmax)
    if not len(N):
        return np.zeros(0), np.zeros(0)
    comp = p.compute_time(i, N) if fused is None else _fused_compute(p, i, N, fused)
    single_node = sum(1 for nd in p.cluster.nodes if nd.usable) == 1
    sync = np.array([sync_s(p, i, [t for t in range(p.T) if N[k - 1, t]], k, single_node)
                     for k in range(1, len(N) + 1)])
    return np.asarray(comp, dtype=float), sync


#: TaskIters(i, steps) -> the iterations of job i's task at each iteration time in steps
TaskIters = Callable[[int, np.ndarray], np.ndarray]


def iteration_times(p: PlanningProblem, i: int, kmax: int, task_iters: TaskIters | None = None,
                    memo: dict[tuple, tuple[int, np.ndarray, np.ndarray]] | None = None,
                    fused: Fused | None = None) -> np.ndarray:
    """``T[k]`` = job i's iteration time alone on its k fastest pool GPUs, k = 0..kmax (T[0] = inf).

    Compute with balanced slices (the space-mode water-filling) plus pool
    mode's synchronisation for k workers (pool/problem.py: the ring estimate
    over the pool's bandwidth, or the calibrated / profiled sync), which a task
    pays once for its iterations: ``task_iters(i, step)``, the iterations of a
    task whose iteration takes ``step`` (None: every iteration synchronises).
    ``memo``: compute and sync shared by jobs of one model (``p.model_key``), whose
    GPU order and step times are the same; only their task sizes differ.
    """
    key = p.model_key(i) if fused is None else (p.model_key(i), fused[1][i].tobytes())
    hit = memo.get(key) if memo is not None else None
    if hit is not None and (hit[0] >= kmax or len(hit[1]) < hit[0]):
        comp, sync = hit[1][:kmax], hit[2][:kmax]
    else:
        comp, sync = _compute_and_sync(p, i, kmax, fused)
        if memo is not None:
            memo[key] = (kmax, comp, sync)
    out = np.full(kmax + 1, math.inf)
    if not len(comp):
        return out
    n = np.ones(len(comp)) if task_iters is None else np.maximum(1.0, task_iters(i, comp))
    out[1:len(comp) + 1] = comp + sync / n
    return out


def choose_parallelism(p: PlanningProblem, floor: np.ndarray, fixed: np.ndarray,
                       task_iters: TaskIters | None = None, fused: Fused | None = None
                       ) -> tuple[np.ndarray, dict[str, str]]:
    """Tasks per round for every job (module docstring).

    ``floor[i]``: the least P job i may have; ``fixed[i]``: True when the job
    asked for its size (``requested_gpus``), which is then kept. Returns P and,
    for the jobs left below what the pool could give them, the reason. The
    gain of a job looks ahead past sizes that are slower (crossing to a
    second node or type costs communication before more GPUs pay it back)
    and is counted per GPU added.
    """
    S = p.S
    P = np.asarray(floor, dtype=int).copy()
    pool = int(p.K)
    allowed = (p.allowed * p.n_type[None, :]).sum(axis=1)
    cap = np.minimum(np.minimum(p.hi, p.B), allowed).astype(int)
    reasons: dict[str, str] = {}
    T: dict[int, np.ndarray] = {}
    memo: dict[tuple, tuple[int, np.ndarray, np.ndarray]] = {}

    def best_step(i: int) -> tuple[float, int]:
        """(weighted rate gained per GPU, target size) of growing job i, or (<= 0, -)."""
        cur = int(P[i])
        hi = min(int(cap[i]), cur + MAX_LOOKAHEAD, pool)
        if hi <= cur:
            return -1.0, cur
        if i not in T or len(T[i]) <= hi:
            T[i] = iteration_times(p, i, hi, task_iters, memo, fused)
        Ti = T[i]
        ks = np.arange(cur + 1, hi + 1)
        ok = (Ti[ks] * MIN_SPEEDUP <= Ti[cur]) & (Ti[1] / (ks * Ti[ks]) >= MIN_EFFICIENCY)
        if not ok.any():
            return -1.0, cur
        w = float(p.weight[i]) / float(p.iters[i])
        per = (w / Ti[ks] - w / Ti[cur]) / (ks - cur)
        per = np.where(ok, per, -np.inf)
        j = int(np.argmax(per))
        return float(per[j]), int(ks[j])

    heap: list[tuple[float, int, int]] = []

    def push_or_explain(i: int) -> None:
        if P[i] >= cap[i]:
            reasons[p.jobs[i].name] = _why_capped(p, i, int(cap[i]))
            return
        g, k = best_step(i)
        if g > 0:
            heapq.heappush(heap, (-g, i, k))
        else:
            reasons[p.jobs[i].name] = (
                f"more than {P[i]} GPU(s) would be no faster or below "
                f"{MIN_EFFICIENCY:.0%} per-GPU efficiency (intercepts and communication)")

    for i in range(S):
        if not fixed[i]:
            push_or_explain(i)
    while heap and int(P.sum()) < pool:
        _, i, k = heapq.heappop(heap)
        P[i] = min(k, int(P[i]) + pool - int(P.sum()))
        reasons.pop(p.jobs[i].name, None)
        push_or_explain(i)
    return P, reasons


def _why_capped(p: PlanningProblem, i: int, cap: int) -> str:
    job = p.jobs[i]
    if job.max_gpus is not None and cap >= job.max_gpus:
        return f"at its max_gpus ({job.max_gpus})"
    if cap >= int(p.B[i]):
        return f"one sample per task (global batch {int(p.B[i])})"
    return f"uses every GPU it may ({cap})"
