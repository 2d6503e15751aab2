"""Pool mode's bound of task plans (equal slices or uneven) and space plans alike.

Pool mode keeps the best of its task plans and, with ``space=keep``, the space
plan. The pool relaxation (relaxation.py) bounds only equal-slice plans: it is
that model's LP. Space mode's bounds charge a job's GPUs through every
iteration's synchronisation, which a task plan pays once per task. What bounds
every plan pool mode may keep is computed here, on compute alone (no
communication, the optimizer's share taken off, as a pool iteration is timed):

1. **Each job alone** (:func:`alone_bound`): its fastest conceivable step on
   its allowed GPUs up to its cap, less the largest optimizer share of its
   types, times its iterations. Where tasks may run fused passes (several
   steps' slices at once, ``fusion.py``), a step is no longer a job's least
   unit: its samples over its best ``min(hi, B)`` GPUs at their peak samples a
   second instead.
2. **The pooled speed** (:func:`pooled_task_bound`): the cluster as one
   machine of priced GPU capacity (``pooled_bound.py``'s argument). A GPU of
   type t processes a sample in at least ``u_t`` seconds, the least pool
   iteration per sample over the local batches it may hold; so job i needs at
   least ``iters_i B_i min_t pi_t u_t`` priced GPU-seconds, and it never
   processes samples faster than its best ``hi_i`` GPUs at their peak rates
   together, which gives its least time ``P_i``. Both hold for any task,
   whatever its batch and iterations, and for a space plan's iterations (whose
   steps include what a pool iteration leaves out). Far stronger than (1)
   when many jobs contend for the GPUs.

Every plan of the union is above both, so the union's bound is the larger;
an equal-slice plan is also above the relaxation, which the plan reports
beside it. Elastic jobs (a space plan may change their batch) count in (1)
as before and not in (2).
"""

from __future__ import annotations

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.lp_pooled_cuts import PooledInputs
from hetsched.planning.pool.problem import PoolProblem, pool_iteration_times


def alone_bound(problem: PlanningProblem, pp: PoolProblem, u: np.ndarray | None = None
                ) -> float:
    """Each job alone on the cluster, computing only (module docstring, 1). Jobs of one
    model, GPU range and optimizer share have one step: computed once. ``u``: the jobs'
    :func:`peak_seconds_per_sample`, where the caller has them."""
    from hetsched.planning.bounds import best_iteration_time

    if fused(pp):
        u = peak_seconds_per_sample(problem, pp) if u is None else u
        k = np.minimum(problem.hi, problem.B).astype(int)  # a round has at most B tasks
        return float(sum(float(problem.weight[i]) * float(problem.iters[i] * problem.B[i])
                         / fastest_rate(problem, 1.0 / u[i], int(k[i]))
                         for i in range(problem.S)))
    best: dict[tuple, float] = {}
    total = 0.0
    for i in range(problem.S):
        ok = pp.ok[i]
        opt = float(pp.optimizer_s[i][ok].max()) if ok.any() else 0.0
        key = (problem.model_key(i), int(problem.hi[i]), opt)
        if key not in best:
            best[key] = max(0.0, best_iteration_time(problem, i) - opt)
        total += float(problem.weight[i]) * float(problem.iters[i]) * best[key]
    return total


def fused(pp: PoolProblem) -> bool:
    """Whether some task may train several steps' slices a pass (pool/fusion.py): then a
    GPU's progress is bounded by its best samples a second at any batch up to its cap,
    not by a step's share of the global batch."""
    return bool((pp.chunk > 1).any())


def fastest_rate(problem: PlanningProblem, rate: np.ndarray, k: int) -> float:
    """Samples a second of a job's ``k`` fastest GPUs together, each at ``rate`` (T,) of
    its type (never 0: a floor keeps the quotients finite)."""
    return max(float(np.sort(np.repeat(rate, problem.n_type))[::-1][:k].sum()), 1e-300)


def iteration_grid(problem: PlanningProblem, pp: PoolProblem, i: int, cap: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Job i's pool iteration on one GPU of each type at every local batch 1..max(cap):
    the batches (B,), the seconds (B, T), and where a batch fits its type's ``cap`` (B, T)
    (``cap`` 0 where the job may not run). Empty when no batch fits anywhere."""
    b = np.arange(1, int(max(cap.max(), 0)) + 1, dtype=float)
    steps = problem.step_times(i, np.repeat(b[:, None], problem.T, axis=1))  # (batches, T)
    per = pool_iteration_times(steps, pp.optimizer_s[i][None, :])
    return b, per, b[:, None] <= cap[None, :]


def seconds_per_sample(problem: PlanningProblem, pp: PoolProblem, i: int) -> np.ndarray:
    """(T,) the least pool-iteration seconds per sample of job i on one GPU of each type,
    over the local batches 1..cap it may hold there (inf where it may not run)."""
    cap = np.where(problem.allowed[i], problem.cap[i], 0).astype(int)
    if cap.max() < 1:
        return np.full(problem.T, np.inf)
    b, per, fit = iteration_grid(problem, pp, i, cap)
    return np.where(fit, per / b[:, None], np.inf).min(axis=0)


def pooled_task_bound(problem: PlanningProblem, pp: PoolProblem) -> float:
    """The pooled-speed bound on compute alone (module docstring, 2)."""
    return _pooled(problem, pp)[0]


def peak_seconds_per_sample(problem: PlanningProblem, pp: PoolProblem) -> np.ndarray:
    """(S, T) :func:`seconds_per_sample` of every job; jobs of one model and optimizer
    share are searched once."""
    u = np.full((problem.S, problem.T), np.inf)
    memo: dict[tuple, np.ndarray] = {}
    for i in range(problem.S):
        key = (problem.model_key(i), pp.optimizer_s[i].tobytes())
        if key not in memo:
            memo[key] = seconds_per_sample(problem, pp, i)
        u[i] = memo[key]
    return u


def _pooled(problem: PlanningProblem, pp: PoolProblem, u: np.ndarray | None = None
            ) -> tuple[float, np.ndarray | None, PooledInputs | None]:
    """:func:`pooled_task_bound` and, where it ran, each job's estimated completion (where
    the joint LP's time grid should be fine) and its inputs (the LP's pooled cuts);
    ``u`` as :func:`alone_bound` takes it."""
    from hetsched.planning.pooled_bound import pooled_bound, price_family

    S, T = problem.S, problem.T
    u = peak_seconds_per_sample(problem, pp) if u is None else u
    counted = np.array([j.elastic is None for j in problem.jobs], dtype=bool)
    rate = 1.0 / u  # samples/s at the peak; 0 where the job may not run (u = inf)
    if not counted.any() or rate.max() <= 0:
        return 0.0, None, None
    rel = rate / np.maximum(rate.max(axis=1, keepdims=True), 1e-300)
    speed = np.array([float(rel[problem.allowed[:, t], t].mean()) if problem.allowed[:, t].any()
                      else 0.0 for t in range(T)])
    prices = price_family(speed)
    work = problem.iters * problem.B  # samples each job processes, in all
    P = np.zeros(S)
    for i in np.flatnonzero(counted).tolist():
        P[i] = float(work[i]) / fastest_rate(problem, rate[i], int(problem.hi[i]))
    e = np.zeros((len(prices), S))
    for k, pi in enumerate(prices):
        priced = np.where(problem.allowed & np.isfinite(u), pi[None, :] * u, np.inf).min(axis=1)
        e[k] = np.where(counted & np.isfinite(priced), work * priced, 0.0)
    value, comp = pooled_bound(problem.weight.astype(float), problem.arrival.astype(float), P,
                               e, problem.n_type.astype(float), prices)
    return float(value), comp, PooledInputs(P, e, prices)


def union_bound(problem: PlanningProblem, pp: PoolProblem) -> tuple[float, dict[str, float]]:
    """The bound of every plan pool mode may keep: the largest of :func:`alone_bound`,
    :func:`pooled_task_bound` and, where it runs, the joint LP on pool rates
    (``lp_union.py``), with each value (``lp`` only where the LP ran)."""
    from hetsched.planning.pool.lp_union import pool_lp_bound

    u = peak_seconds_per_sample(problem, pp)  # both bounds read each job's peaks
    pooled, comp, inputs = _pooled(problem, pp, u)
    parts = {"alone": alone_bound(problem, pp, u), "pooled": pooled}
    lp = pool_lp_bound(problem, pp, hint=comp, pooled=inputs)
    if lp is not None:
        parts["lp"] = float(lp["weighted_jct_s"])
    return max(parts.values()), parts


__all__ = ["alone_bound", "fastest_rate", "fused", "iteration_grid", "peak_seconds_per_sample",
           "pooled_task_bound", "seconds_per_sample", "union_bound"]
