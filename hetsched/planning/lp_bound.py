"""A joint lower bound for space sharing: a time-indexed LP over configurations.

The alone-on-the-cluster and priced-capacity bounds (bounds.py) look at one
job at a time or at one aggregated machine; neither sees that several jobs
want the same fast GPU type. This LP does (Schulz & Skutella's time-indexed
relaxation with the mean-busy-time inequality, with configurations as modes):

* a *configuration* of job i is a vector ``x`` of GPU counts per type it may
  use; its iteration time ``tau_i(x)`` is the planner's optimistic model
  (continuous batch shares, the all-reduce at intra-node bandwidth when one
  node could hold the GPUs; ``PlanningProblem.iter_time``), so
  ``p_i(x) = iters_i * tau_i(x)`` is a lower bound on the time job i needs on
  ``x``. Only Pareto configurations are kept (no fewer GPUs of every type run
  as fast): the LP never prefers a dominated one.
* ``y[i,x,k]`` = fraction of job i's work done on configuration x during time
  interval k (nothing before the job's arrival); ``sum_{x,k} y = 1``.
* a job runs on one configuration at a time:
  ``sum_x y p_i(x) <= |interval k after a_i|``;
  capacity: ``sum_{i,x} y p_i(x) x_t <= n_t |k|`` for every type t.
* ``C_i >= a_i + sum_{x,k} y p_i(x)`` (the time it runs), ``C_i >= a_i + P_i``
  with ``P_i = min_x p_i(x)``, and the mean busy time inequality
  ``C_i >= M_i + Q_i(u_i)`` with ``M_i >= sum y * left(k)`` (the mean time at
  which the job's work is done) and ``u_ir = sum_k y[i,r,k]``: for a given
  split of the work over configurations, ``C - M = int (C - t) dW`` is least
  when the pieces run back to back, slowest first (an exchange argument), which
  gives ``Q(u) = 1/2 sum_rl u_r u_l min(p_r, p_l)``. Q is convex, so it enters
  as tangent cuts added round by round at the LP's solution (cutting planes;
  every round's value is a valid bound; a fixed number of rounds, so the
  same inputs give the same bound). With all work on the fastest
  configuration this is the classic ``C >= M + P/2``.
* the last interval ``[horizon, inf)`` has no capacity or length limit, so
  the LP is feasible and valid whatever the horizon.

Every schedule the evaluator can produce (integer batches, real placements,
restart costs, one configuration per segment) induces a feasible point of
this LP with ``C_i`` its completion times, so ``sum w_i (C_i - a_i)`` at the
LP optimum bounds the total weighted JCT from below. HiGHS's tolerances are
covered by shaving 1e-6 off the value.

It is solved only while it is small (``MAX_VARS`` variables, a per-job
lattice of at most ``bounds.LATTICE_MAX`` count vectors); above that,
:func:`lp_lower_bound` returns ``None`` and the older bounds stand alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetsched.core.problem import PlanningProblem

MAX_VARS = 40_000  # LP columns; the time grid is coarsened to fit, else no LP bound
MAX_CONFIGS = 400  # Pareto configurations per job
INTERVALS = 32  # bounded time intervals (geometric; arrivals added)
TIME_LIMIT_S = 10.0  # per LP solve, a safety net: a solve that hits it ends the rounds
SAFETY = 1e-6  # relative shave for solver tolerances
MAX_ROUNDS = 6  # cutting-plane rounds for the tail inequality


def pareto_configs(p: PlanningProblem, i: int, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Configurations of job i that no smaller-or-equal one matches in speed; (X, p_i(x))."""
    it = p.iter_time(i, X)
    ok = np.isfinite(it)
    X, it = X[ok], it[ok]
    order = np.lexsort((X.sum(axis=1), it))  # fastest first, fewer GPUs first among ties
    X, it = X[order], it[order]
    keep: list[int] = []
    for r in range(len(X)):
        # dominated if a kept (faster or as fast) configuration uses no more of every type
        if keep and (X[keep] <= X[r]).all(axis=1).any():
            continue
        keep.append(r)
    return X[keep], it[keep] * float(p.iters[i])


def _grid(arrivals: np.ndarray, t0: float, t1: float, first: float, n: int) -> np.ndarray:
    """``n`` interval boundaries from ``t0`` to ``t1``: geometric steps from ``first``, plus arrivals.

    Uniform when ``n`` steps of ``first`` already span the horizon.
    """
    span = max(t1 - t0, first)
    n = max(n, 1)
    if n * first >= span:
        pts: np.ndarray = t0 + span * np.arange(n + 1) / n
    else:  # first * ((1+g)^n - 1) / g = span, solved for the growth g by bisection
        lo, hi = 0.0, 1.0
        while first * ((1 + hi) ** n - 1) / hi < span:
            hi *= 2.0
        for _ in range(60):
            g = 0.5 * (lo + hi)
            if g > 0 and first * ((1 + g) ** n - 1) / g >= span:
                hi = g
            else:
                lo = g
        pts = t0 + first * ((1 + hi) ** np.arange(n + 1) - 1) / hi
    return np.unique(np.concatenate([pts, arrivals[arrivals > t0]]))


def lp_lower_bound(p: PlanningProblem, lattices: list[np.ndarray | None],
                   n_intervals: int = INTERVALS,
                   time_limit_s: float | None = None) -> dict[str, Any] | None:
    """The LP bound (module docstring) or ``None`` when the LP would be too large or fails.

    ``lattices[i]`` holds job i's count vectors (``bounds._lattice``), ``None`` when too many.
    Returns ``{"weighted_jct_s", "intervals", "configs", "time_s"}``.
    """
    t_start = time.perf_counter()
    if time_limit_s is None:
        time_limit_s = TIME_LIMIT_S
    if any(X is None or not len(X) for X in lattices):
        return None
    confs = [pareto_configs(p, i, X) for i, X in enumerate(lattices) if X is not None]
    if any(len(X) == 0 or len(X) > MAX_CONFIGS for X, _ in confs):
        return None
    Pmin = np.array([float(pt.min()) for _, pt in confs])
    a = p.arrival.astype(float)
    t0 = float(a.min())
    t1 = float(a.max() + Pmin.sum())
    n_conf = sum(len(X) for X, _ in confs)
    bnd = _fitting_grid(a, t0, t1, max(float(Pmin.min()) / 4.0, (t1 - t0) * 1e-6, 1e-9),
                        n_intervals, n_conf)
    if bnd is None:
        return None
    scale = max(t1 - t0, 1e-9)  # solve in units of the span for conditioning
    lp = _build(p, confs, Pmin, (bnd - t0) / scale, (a - t0) / scale, scale)
    value, rounds = _solve_rounds(lp, p.weight.astype(float), (a - t0) / scale, confs, scale,
                                  time_limit_s)
    if not math.isfinite(value):
        return None
    return {"weighted_jct_s": max(0.0, value * (1.0 - SAFETY)), "intervals": len(bnd),
            "configs": n_conf, "rounds": rounds, "time_s": time.perf_counter() - t_start}


def _fitting_grid(a: np.ndarray, t0: float, t1: float, first: float, n: int,
                  n_conf: int) -> np.ndarray | None:
    """The finest geometric grid (halving ``n``) whose LP stays under MAX_VARS, else None."""
    while True:
        bnd = _grid(a, t0, t1, first, n)
        if n_conf * len(bnd) <= MAX_VARS or n <= 8:
            break
        n //= 2
    return None if n_conf * len(bnd) > MAX_VARS else bnd


@dataclass
class _LP:
    prob: Any
    C: list[Any]
    MB: list[Any]
    U: list[list[Any]]
    #: per job: per interval it may run in, (z, that interval's y per configuration)
    Z: list[list[tuple[Any, list[Any]]]] = field(default_factory=list)


def _build(p: PlanningProblem, confs: list[tuple[np.ndarray, np.ndarray]], Pmin: np.ndarray,
           left: np.ndarray, au: np.ndarray, scale: float) -> _LP:
    """The time-indexed LP over each job's configurations (module docstring)."""
    import pulp

    K = len(left) - 1  # bounded intervals; index K is [t1, inf)
    prob = pulp.LpProblem("space_bound", pulp.LpMinimize)
    cap: dict[tuple[int, int], list[tuple[Any, float]]] = {}
    lp = _LP(prob, [], [], [])
    for i, (X, pt) in enumerate(confs):
        ptu = pt / scale
        work, run, mbt = [], [], []
        per_conf: list[list[Any]] = [[] for _ in range(len(X))]
        zs: list[tuple[Any, list[Any]]] = []
        for k in range(K + 1):
            hi = left[k + 1] if k < K else math.inf
            if hi <= au[i] + 1e-12:
                continue
            lo = max(float(left[k]), float(au[i]))
            row = []
            for r in range(len(X)):
                v = prob.add_variable(f"y_{i}_{r}_{k}", lowBound=0)
                row.append((v, float(ptu[r])))
                per_conf[r].append(v)
                work.append(v)
                mbt.append((v, lo))
                if k < K:
                    for t in np.nonzero(X[r])[0]:
                        cap.setdefault((int(t), k), []).append((v, float(ptu[r] * X[r, t])))
            run += row
            if k < K:
                prob += pulp.lpSum(v * c for v, c in row) <= hi - lo
                # the work done in this interval has its mean at least Q(y_k) after ``lo``
                zs.append((prob.add_variable(f"z_{i}_{k}", lowBound=0), [v for v, _ in row]))
        prob += pulp.lpSum(work) == 1
        c = prob.add_variable(f"C_{i}", lowBound=float(au[i] + Pmin[i] / scale))
        prob += c >= float(au[i]) + pulp.lpSum(v * q for v, q in run)
        lp.MB.append(pulp.lpSum(v * lo for v, lo in mbt) + pulp.lpSum(z for z, _ in zs))
        lp.Z.append(zs)
        lp.U.append([pulp.lpSum(vs) for vs in per_conf])
        # the tail cut at "everything on the fastest configuration": C >= M + P/2
        prob += c >= lp.MB[i] + float(Pmin[i] / scale / 2.0)
        lp.C.append(c)
    for (ty, k), terms in cap.items():
        prob += pulp.lpSum(v * q for v, q in terms) <= float(p.n_type[ty]) * float(
            left[k + 1] - left[k])
    prob += pulp.lpSum(float(p.weight[i]) * lp.C[i] for i in range(p.S))
    return lp


def _solve_rounds(lp: _LP, w: np.ndarray, au: np.ndarray,
                  confs: list[tuple[np.ndarray, np.ndarray]], scale: float,
                  time_limit_s: float) -> tuple[float, int]:
    """Solve, add violated tail cuts, re-solve: a fixed number of rounds (deterministic)."""
    import pulp

    from hetsched.planning.solver import lp_solver

    value = -math.inf
    rounds = 0
    while rounds < MAX_ROUNDS:
        rounds += 1
        try:
            status = lp.prob.solve(lp_solver(time_limit_s))
        except pulp.PulpSolverError:
            break
        if pulp.LpStatus[status] != "Optimal":
            break
        value = max(value, sum(float(w[i]) * (float(lp.C[i].value()) - float(au[i]))
                               for i in range(len(lp.C))) * scale)
        tails = _add_tail_cuts(lp.prob, confs, scale, lp.C, lp.MB, lp.U)
        if not (_add_interval_cuts(lp, confs, scale) or tails):
            break
    return value, rounds


def tail(u: np.ndarray, pt: np.ndarray) -> float:
    """``Q(u) = 1/2 sum_rl u_r u_l min(p_r, p_l)``: the least ``C - M`` for work split ``u``."""
    return 0.5 * float(u @ np.minimum.outer(pt, pt) @ u)


def _add_tail_cuts(prob: Any, confs: list[tuple[np.ndarray, np.ndarray]], scale: float,
                   C: list[Any], MB: list[Any], U: list[list[Any]]) -> bool:
    """Add ``C >= M + Q(u*) + grad Q(u*).(u - u*)`` where the LP point violates ``C >= M + Q(u)``.

    Q is convex (the min kernel is positive semidefinite), so every tangent
    plane lies below it and the cut is valid for every schedule. Returns True
    if a cut was added.
    """
    import pulp

    added = False
    for i, (_X, pt) in enumerate(confs):
        ptu = pt / scale
        u = np.array([float(pulp.value(e) or 0.0) for e in U[i]])
        q = tail(u, ptu)
        have = float(C[i].value()) - float(pulp.value(MB[i]) or 0.0)
        if q <= have * (1.0 + 1e-6) + 1e-9:
            continue
        g = np.minimum.outer(ptu, ptu) @ u  # gradient; the cut is g.u' - Q(u*)
        prob += C[i] >= MB[i] + pulp.lpSum(float(g[r]) * U[i][r] for r in range(len(g))
                                           if g[r] > 0) - q
        added = True
    return added


def _add_interval_cuts(lp: _LP, confs: list[tuple[np.ndarray, np.ndarray]], scale: float
                       ) -> bool:
    """Add ``z_ik >= grad Q(y*).y - Q(y*)`` where the LP point has ``z_ik < Q(y_ik)``.

    Inside interval k the fractions ``y_ik`` of job i's work take
    ``y p_r`` seconds each; their contribution to the mean busy time
    ``int t dW`` is least when they run back to back from the interval's start,
    fastest configuration first (Smith's rule, weights y, times y p), which is
    ``lo y + Q(y)`` with the same kernel as the tail. So ``M_i >= sum_k (lo_k
    y_ik + Q(y_ik))`` for every schedule; Q is convex, tangents lie below it.
    Returns True if a cut was added.
    """
    import pulp

    added = False
    for i, (_X, pt) in enumerate(confs):
        ptu = pt / scale
        ker = np.minimum.outer(ptu, ptu)
        for z, ys in lp.Z[i]:
            y = np.array([float(v.value() or 0.0) for v in ys])
            q = 0.5 * float(y @ ker @ y)
            if q <= float(z.value() or 0.0) * (1.0 + 1e-6) + 1e-9:
                continue
            g = ker @ y
            lp.prob += z >= pulp.lpSum(float(g[r]) * ys[r] for r in range(len(g))
                                       if g[r] > 0) - q
            added = True
    return added
