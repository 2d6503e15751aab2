"""A valid lower bound on total weighted JCT for space sharing.

The bounds below are relaxations, so no plan can beat them; the reported bound
is the largest. They use the planner's model with two optimistic twists that
make them bounds on what the evaluator can produce: continuous (not integer)
batch shares, and the all-reduce at intra-node bandwidth whenever a job's GPUs
could fit in one node.

1. *Alone on the cluster.* Job i cannot finish before ``a_i + iters_i *
   min_x iter_i(x)``: its best iteration time over every allocation ``x`` of
   GPU counts per type (communication included) that it may use.

2. *Priced capacity (a fluid single machine).* Give each GPU type a price
   ``pi_t >= 0``. At any moment the running jobs hold at most
   ``Cap = sum_t pi_t n_t`` worth of GPUs. Running on ``x``, job i finishes
   ``1 / (iter_i(x) * pi.x)`` iterations per unit of priced GPU time, so it
   needs at least ``E_i = iters_i * min_x iter_i(x) * pi.x`` of it in total.
   The cluster is thus at most one machine of speed ``Cap`` on which job i
   needs ``E_i``; Smith's rule (WSPT) on ``E_i / Cap`` bounds ``sum w_i C_i``
   for any schedule (release dates only make it worse), and subtracting
   ``sum w_i a_i`` bounds the weighted JCT. Every price vector gives a valid
   bound; we take the best of a few (one per GPU, and each type's speed).

3. *Pooled speed with release dates* (pooled_bound.py): the same priced pool,
   arrivals kept, preemptive WSPT's mean busy times plus half of each job's
   least time; never below 2.

4. *The joint LP* (lp_bound.py): a time-indexed relaxation over every job's
   configurations that sees jobs competing for the same GPU types; solved
   up to ``LP_MAX_JOBS`` jobs within its size limit, and usually by far the
   tightest. The pooled machine's inequalities join it as cuts
   (lp_pooled_cuts.py), so where it runs it is never below 3.

The reported bound is the largest valid one; ``lower_bound_info`` says which
(``alone``, ``fluid``, ``pooled`` or ``lp``), and the plan carries it as
``lower_bound.kind``.

*Elastic jobs* may run at any batch in their range, and a larger batch runs a
GPU faster, so their iteration times here are every GPU at its peak rate, no
communication, at the best statistical efficiency of the range
(:func:`_elastic_gain`), on up to ``min(max_batch, max_gpus)`` GPUs: valid for
any batch the planner picks.

The minima over ``x`` are taken over the lattice of count vectors when it is
small enough (``LATTICE_MAX`` points per job); above it, a cruder relaxation
(no communication, no one-sample minimum, peak per-GPU rates) replaces them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hetsched.core.efficiency import efficiency
from hetsched.core.estimates import Bound
from hetsched.core.problem import PlanningProblem
from hetsched.planning.lp_bound import MAX_LATTICE_POINTS, lp_lower_bound
from hetsched.planning.lp_configs import pareto_configs
from hetsched.planning.lp_pooled_cuts import PooledInputs
from hetsched.planning.pooled_bound import pooled_bound, price_family

LATTICE_MAX = 60_000  # count vectors per job for the exact minima
TOTAL_LATTICE_MAX = 600_000  # and over all distinct (workload, batch) pairs
#: the joint LP bound is tried up to this many jobs (about 2 s of CPU at 100 jobs on 36
#: GPUs; its size is also capped by lp_bound.MAX_VARS and MAX_LATTICE_POINTS)
LP_MAX_JOBS = 200


def _hi(p: PlanningProblem, i: int) -> int:
    """The most GPUs job i may use: an elastic job's batch may grow to its ``max_batch``."""
    el = p.jobs[i].elastic
    if el is None:
        return int(p.hi[i])
    hi = min(int((p.allowed[i] * p.n_type).sum()), int(el.max_batch))
    cap = p.jobs[i].max_gpus
    return hi if cap is None else min(hi, int(cap))


def _elastic_gain(p: PlanningProblem, i: int) -> float:
    """The most spec-batch iterations one sample can be worth for an elastic job: its
    statistical efficiency at ``min_batch`` (1 with no known noise scale), at least 1."""
    el = p.jobs[i].elastic
    if el is None:
        return 1.0
    return max(1.0, efficiency(float(el.min_batch), float(p.B[i]), el.noise_scale))


def _lattice(p: PlanningProblem, i: int) -> np.ndarray | None:
    """All per-type count vectors job i may use (0..min(n_t, hi) of allowed types)."""
    hi_i = _hi(p, i)
    dims = [int(min(p.n_type[t], hi_i)) + 1 if p.allowed[i, t] else 1 for t in range(p.T)]
    size = int(np.prod(dims))
    if size > LATTICE_MAX:
        return None
    X = np.array(np.unravel_index(np.arange(size), dims)).T
    k = X.sum(axis=1)
    return X[(k >= p.lo[i]) & (k <= hi_i)]


def best_iteration_time(p: PlanningProblem, i: int) -> float:
    """Fastest conceivable step of job i: all its allowed GPUs, b in [0, cap], no comm."""
    types = np.nonzero(p.allowed[i])[0]
    a = np.repeat(p.a[i, types], p.n_type[types])
    c = np.repeat(p.c[i, types], p.n_type[types])
    cap = np.repeat(p.cap[i, types], p.n_type[types]).astype(float)
    m = int(min(p.hi[i], len(a)))
    B = float(p.B[i])

    bent = []  # piecewise types: their curve's inverse, from 0 samples at T = 0
    for t, cv in enumerate(p.curves[i] or ()):
        if cv is not None and p.allowed[i, t]:
            at = np.repeat(types == t, p.n_type[types])
            bent.append((at, np.concatenate([[0.0], cv[1]]), np.concatenate([[0.0], cv[0]])))

    def samples(T: float) -> float:
        per = np.clip((T - a) / c, 0.0, cap)
        for at, ts, bs in bent:
            per[at] = min(float(np.interp(T, ts, bs)), float(cap[at][0]))
        return float(np.sort(per)[::-1][:m].sum())  # best m GPUs at this T

    lo, hi = 0.0, max(float((a + c * B).min()), 1e-9)
    while samples(hi) < B:
        hi *= 2.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if samples(mid) >= B:
            hi = mid
        else:
            lo = mid
    return lo


def _wspt(w: np.ndarray, ptime: np.ndarray) -> float:
    """Smith's rule: the least sum of weighted completion times on one machine."""
    order = np.argsort(-(w / np.maximum(ptime, 1e-300)), kind="stable")
    return float((w[order] * np.cumsum(ptime[order])).sum())


def lower_bound(p: PlanningProblem) -> float:
    """The best valid lower bound on total weighted JCT (see the module docstring).

    Computes every bound afresh; the values per kind are left in
    ``p.estimates.extra["lower_bounds"]``. :func:`lower_bound_info` memoises.
    """
    sb = _simple_bounds(p)
    vals = {"alone": sb.alone, "fluid": sb.fluid}
    pooled, completion = pooled_bound(p.weight.astype(float), p.arrival.astype(float), sb.P,
                                      sb.E_pool, p.n_type.astype(float), sb.pool_prices)
    vals["pooled"] = pooled
    if p.S <= LP_MAX_JOBS and p.estimates.joint_lp:
        lp = lp_lower_bound(p, sb.lattices, confs=sb.confs, hint=completion,
                            pooled=PooledInputs(sb.P, sb.E_pool, sb.pool_prices))
        if lp is not None:
            vals["lp"] = float(lp["weighted_jct_s"])
    p.estimates.extra["lower_bounds"] = vals
    return max(vals.values())


def lower_bound_info(p: PlanningProblem) -> dict[str, Any]:
    """``{"weighted_jct_s", "kind", "bounds": {kind: value}}``, computed once per problem."""
    if p.estimates.bound is None:
        value = lower_bound(p)
        vals = p.estimates.extra.get("lower_bounds") or {}
        kind = max(vals, key=lambda k: vals[k]) if vals else "unknown"
        p.estimates.bound = Bound(value, kind)
    b = p.estimates.bound
    return {"weighted_jct_s": b.value, "kind": b.method,
            "bounds": dict(p.estimates.extra.get("lower_bounds") or {})}


@dataclass
class _Simple:
    """The per-job bounds and what the pooled and LP bounds reuse."""

    alone: float
    fluid: float
    lattices: list[np.ndarray | None]
    #: per job, its Pareto configurations and their times (None where not computed)
    confs: list[tuple[np.ndarray, np.ndarray] | None]
    P: np.ndarray  # (S,) least time of each job on any configuration
    E_pool: np.ndarray  # (len(pool_prices), S) least priced GPU-seconds
    pool_prices: list[np.ndarray]


def _job_minima(p: PlanningProblem, i: int, X: np.ndarray | None, prices: list[np.ndarray],
                pareto: bool) -> tuple[float, list[float], tuple[np.ndarray, np.ndarray] | None]:
    """Job i's best iteration time, least priced seconds per iteration under each price,
    and (if ``pareto``) its Pareto configurations with per-iteration times."""
    r = p.per_gpu_rate(i)  # peak samples/s per GPU of each type
    elastic = p.jobs[i].elastic is not None
    if X is not None and len(X):
        if elastic:  # any batch: every GPU at its peak rate, no communication, best efficiency
            it = float(p.B[i]) / (_elastic_gain(p, i) * np.maximum(X @ r, 1e-300))
        else:
            it = p.iter_time(i, X)
        per_it = [float(np.min(it * (X @ pi))) for pi in prices]
        return float(it.min()), per_it, (pareto_configs(p, i, X, iters=1.0, it=it)
                                          if pareto else None)
    if elastic:
        best_rate = float(np.sort(np.repeat(r, p.n_type))[::-1][:_hi(p, i)].sum())
        gain = _elastic_gain(p, i)
        return (float(p.B[i]) / (gain * best_rate),
                [0.0 if (p.allowed[i] & (pi <= 0)).any() else
                 float(p.B[i]) / (gain * np.where(p.allowed[i], r / np.where(pi > 0, pi, 1.0),
                                                  0.0).max()) for pi in prices], None)
    per_it = []
    for pi in prices:
        if (p.allowed[i] & (pi <= 0)).any():
            per_it.append(0.0)  # a free GPU type: no priced work is needed
            continue
        per_price = np.where(p.allowed[i], r / np.where(pi > 0, pi, 1.0), 0.0)
        per_it.append(float(p.B[i] / per_price.max()))
    return best_iteration_time(p, i), per_it, None


def _simple_bounds(p: PlanningProblem) -> _Simple:
    """The alone and priced-capacity bounds, each job's lattice (None where too large),
    Pareto configurations (while the LP may run) and pooled-bound inputs."""
    S = p.S
    w = p.weight
    prices = [np.ones(p.T)]
    speed = np.array([np.mean([p.per_gpu_rate(i)[t] / p.per_gpu_rate(i).max()
                               for i in range(S) if p.allowed[i, t]] or [0.0])
                      for t in range(p.T)])
    if speed.max() > 0:
        prices.append(speed)
    pool_prices = price_family(speed)
    allp = prices + pool_prices
    best_iter = np.empty(S)
    E = np.empty((len(allp), S))
    # Jobs of one workload and batch (and GPU-count range) share the minima (per
    # iteration): compute once.
    memo: dict[tuple, tuple[float, list[float], tuple[np.ndarray, np.ndarray] | None]] = {}
    lat_memo: dict[tuple, np.ndarray | None] = {}
    lattices: list[np.ndarray | None] = []
    confs: list[tuple[np.ndarray, np.ndarray] | None] = []
    budget = TOTAL_LATTICE_MAX
    # Pareto configurations are the joint LP's columns: none where it will not run
    pareto_budget = MAX_LATTICE_POINTS if S <= LP_MAX_JOBS and p.estimates.joint_lp else 0
    for i in range(S):
        key = (p.model_key(i), int(p.lo[i]), int(p.hi[i]), p.jobs[i].elastic)
        if key not in memo:
            X = _lattice(p, i) if budget > 0 else None
            lat_memo[key] = X
            n = len(X) if X is not None else 0
            budget -= n
            memo[key] = _job_minima(p, i, X, allp, 0 < n <= pareto_budget)
            pareto_budget -= n
        lattices.append(lat_memo[key])
        best, per_it, cf = memo[key]
        confs.append(None if cf is None else (cf[0], cf[1] * float(p.iters[i])))
        best_iter[i] = best
        E[:, i] = p.iters[i] * np.array(per_it)
    lb_alone = float((w * p.iters * best_iter).sum())
    lb_fluid = 0.0
    for k, pi in enumerate(prices):
        cap = float(pi @ p.n_type)
        if cap > 0:
            lb_fluid = max(lb_fluid, _wspt(w, E[k] / cap) - float((w * p.arrival).sum()))
    return _Simple(lb_alone, lb_fluid, lattices, confs, p.iters * best_iter,
                   E[len(prices):], pool_prices)
