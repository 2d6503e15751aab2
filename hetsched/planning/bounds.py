"""A valid lower bound on total weighted JCT for space sharing.

Both bounds below are relaxations, so no plan can beat them; the reported bound
is the larger. They use the planner's model with two optimistic twists that
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

3. *The joint LP* (lp_bound.py): a time-indexed relaxation over every job's
   configurations that sees jobs competing for the same GPU types; solved
   while it is small, and usually by far the tightest.

The reported bound is the largest valid one; ``lower_bound_info`` says which
(``alone``, ``fluid`` or ``lp``), and the plan carries it as
``lower_bound.kind``.

The minima over ``x`` are taken over the lattice of count vectors when it is
small enough (``LATTICE_MAX`` points per job); above it, a cruder relaxation
(no communication, no one-sample minimum, peak per-GPU rates) replaces them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetsched.core.estimates import Bound
from hetsched.core.problem import PlanningProblem
from hetsched.planning.lp_bound import lp_lower_bound

LATTICE_MAX = 60_000  # count vectors per job for the exact minima
TOTAL_LATTICE_MAX = 600_000  # and over all distinct (workload, batch) pairs
#: the joint LP bound is tried up to this many jobs (about 2 s of CPU at 100 jobs on 36
#: GPUs; its size is also capped by lp_bound.MAX_VARS and MAX_LATTICE_POINTS)
LP_MAX_JOBS = 200


def _lattice(p: PlanningProblem, i: int) -> np.ndarray | None:
    """All per-type count vectors job i may use (0..min(n_t, hi) of allowed types)."""
    dims = [int(min(p.n_type[t], p.hi[i])) + 1 if p.allowed[i, t] else 1 for t in range(p.T)]
    size = int(np.prod(dims))
    if size > LATTICE_MAX:
        return None
    X = np.array(np.unravel_index(np.arange(size), dims)).T
    k = X.sum(axis=1)
    return X[(k >= p.lo[i]) & (k <= p.hi[i])]


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
    lb_alone, lb_fluid, lattices = _simple_bounds(p)
    vals = {"alone": lb_alone, "fluid": lb_fluid}
    if p.S <= LP_MAX_JOBS:
        lp = lp_lower_bound(p, lattices)
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


def _simple_bounds(p: PlanningProblem) -> tuple[float, float, list[np.ndarray | None]]:
    """The alone and priced-capacity bounds, and each job's lattice (None where too large)."""
    S = p.S
    w = p.weight
    prices = [np.ones(p.T)]
    speed = np.array([np.mean([p.per_gpu_rate(i)[t] / p.per_gpu_rate(i).max()
                               for i in range(S) if p.allowed[i, t]] or [0.0])
                      for t in range(p.T)])
    if speed.max() > 0:
        prices.append(speed)
    best_iter = np.empty(S)
    E = np.empty((len(prices), S))
    # Jobs of one workload and batch share the minima (per iteration): compute once.
    memo: dict[tuple, tuple[float, list[float]]] = {}
    lat_memo: dict[tuple, np.ndarray | None] = {}
    lattices: list[np.ndarray | None] = []
    budget = TOTAL_LATTICE_MAX
    for i in range(S):
        key = (p.a[i].tobytes(), p.c[i].tobytes(), p.cap[i].tobytes(), p.allowed[i].tobytes(),
               int(p.B[i]), float(p.model_mb[i]), p.sync[i].tobytes(), int(p.lo[i]), int(p.hi[i]))
        if key not in memo:
            X = _lattice(p, i) if budget > 0 else None
            lat_memo[key] = X
            if X is not None and len(X):
                budget -= len(X)
                it = p.iter_time(i, X)
                memo[key] = (float(it.min()), [float(np.min(it * (X @ pi))) for pi in prices])
            else:
                r = p.per_gpu_rate(i)  # peak samples/s per GPU of each type
                per_it = []
                for pi in prices:
                    if (p.allowed[i] & (pi <= 0)).any():
                        per_it.append(0.0)  # a free GPU type: no priced work is needed
                        continue
                    per_price = np.where(p.allowed[i], r / np.where(pi > 0, pi, 1.0), 0.0)
                    per_it.append(float(p.B[i] / per_price.max()))
                memo[key] = (best_iteration_time(p, i), per_it)
        lattices.append(lat_memo[key])
        best, per_it = memo[key]
        best_iter[i] = best
        E[:, i] = p.iters[i] * np.array(per_it)
    lb_alone = float((w * p.iters * best_iter).sum())
    lb_fluid = 0.0
    for k, pi in enumerate(prices):
        cap = float(pi @ p.n_type)
        if cap > 0:
            lb_fluid = max(lb_fluid, _wspt(w, E[k] / cap) - float((w * p.arrival).sum()))
    return lb_alone, lb_fluid, lattices
