"""Pool mode's joint LP: space mode's time-indexed LP over rates every pool plan obeys.

The bounds of ``union_bound.py`` see each job alone and the cluster as one pool
of priced capacity. Neither sees *which* GPUs the jobs contend for, nor that a
job spread over many GPUs at once runs each at a small, inefficient local
batch. Space mode's joint LP (``planning/lp_bound.py``) sees both, but its
configurations charge every iteration's synchronisation, which a task plan pays
once per task, so it does not bound task plans. Here the same LP runs on
configurations whose speeds hold for every plan pool mode may keep:

- **What a job can do at once.** Its tasks that run at the same time belong to
  one round (the evaluator's barrier: a round starts only when the last has
  finished and synchronised), so their local batches add up to at most the global
  batch ``B`` (a ceiling slice counts only its share of ``B`` as progress). A
  GPU of type t holding a task of local batch ``b`` (an integer, ``1..min(cap,
  B)``) progresses at most ``b / c_t(b)`` samples a second, ``c_t`` the pool
  iteration (the step less the optimizer's share, no synchronisation, no
  start-up). So on ``x`` GPUs at once (``x_t`` of type t, any number from 1 to
  the job's cap: tasks of a round may run in turn on fewer GPUs) the job
  progresses at most ``R(x) = max sum_g b_g / c_g(b_g)`` subject to
  ``sum_g b_g <= B``. Where tasks may run fused passes (``fusion.py``: a pass
  holds several steps' slices, up to the cap), a GPU's progress is bounded by
  its peak ``max_b b / c_t(b)`` over every batch up to its cap instead, and
  ``R(x)`` by the sum of those peaks.
- **An upper bound on R(x) without solving it** (weak duality): for every
  ``lambda >= 0``, ``R(x) <= lambda B + sum_t x_t h_t(lambda)`` with
  ``h_t(lambda) = max(0, max_b b (1 / c_t(b) - lambda))`` (the share a task
  counts toward ``B`` enters linearly, so 0 or its whole batch is its best).
  The least over a grid of ``lambda`` is still an upper bound, and exact
  for the concave rates of an affine step.
- **The configurations.** Job i on ``x`` takes at least ``iters B / R(x)`` seconds
  of ``x`` GPUs; these, with its arrival and weight, are the columns of space
  mode's LP (the same grid, windows, cuts and merging). A task plan maps onto
  it: at each instant a job's busy GPUs form some ``x`` and progress at most
  ``R(x)``, so running ``x`` for the fraction ``progress / R(x)`` of the time
  uses no more GPU time, does the same work, and never faster than ``R``'s
  best (what the LP's mean-busy-time cuts assume). A space plan's iteration on
  ``x`` (shares adding up to ``B``, the whole step, plus its exchange) is slower.
- **The pooled machine's inequalities** (``lp_pooled_cuts.py``, from the pooled
  bound's inputs) join as cuts, so the LP is never below the pooled speed: with
  fused passes its configurations scale almost linearly and, without them, it had
  fallen below it on every instance measured.

Not run (``None``) with an elastic job (a space plan may change its batch, and so
its samples), or above ``bounds.LP_MAX_JOBS`` jobs, or where the LP would be too
large; the other bounds then stand alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.lp_pooled_cuts import PooledInputs
from hetsched.planning.pool.problem import PoolProblem

#: lambda values tried for each job's rate bound (any one gives a valid bound)
LAMBDAS = 96
#: boxes of count vectors per job at most (coarser boxes beyond: still valid, weaker)
MAX_BOXES = 5_000


def rate_bound(problem: PlanningProblem, pp: PoolProblem, i: int, X: np.ndarray) -> np.ndarray:
    """(len(X),) an upper bound on job i's samples per second on each count vector of
    ``X`` at once (module docstring); 0 where a vector holds no GPU."""
    from hetsched.planning.pool.union_bound import fused, iteration_grid, seconds_per_sample

    p = problem
    B = int(p.B[i])
    if fused(pp):  # a GPU's pass may hold several steps' slices: its peak rate alone
        peak = np.where(p.allowed[i], 1.0 / seconds_per_sample(p, pp, i), 0.0)
        return np.where(X.sum(axis=1) > 0, X.astype(float) @ peak, 0.0)
    cap = np.where(p.allowed[i], np.minimum(p.cap[i], B), 0).astype(int)
    if cap.max() < 1:
        return np.zeros(len(X))
    b, per, fit = iteration_grid(p, pp, i, cap)
    fit &= per > 0
    inv = np.where(fit, 1.0 / np.where(per > 0, per, 1.0), 0.0)  # 1 / c_t(b)
    top = float(inv.max())
    if top <= 0:
        return np.zeros(len(X))
    lam = np.concatenate([[0.0], np.geomspace(top * 1e-4, top, LAMBDAS - 1)])
    # h[t, l] = max(0, max_b b (1/c_t(b) - lambda_l)), where the type may run
    gain = b[:, None, None] * (inv[:, :, None] - lam[None, None, :])
    h = np.maximum(0.0, np.where(fit[:, :, None], gain, -np.inf).max(axis=0))  # (T, L)
    h[~p.allowed[i]] = 0.0
    rate = (lam[None, :] * B + X.astype(float) @ h).min(axis=1)
    return np.where(X.sum(axis=1) > 0, rate, 0.0)


def _counts(n: int, fine: int, ratio: float) -> np.ndarray:
    """Box starts for one type's count 0..n: every count up to ``fine``, then steps of
    about ``ratio`` (the last box ends at n)."""
    out = list(range(min(n, fine) + 1))
    while out[-1] < n:
        out.append(min(n, max(out[-1] + 1, int(out[-1] * ratio))))
    return np.array(out)


def _boxes(problem: PlanningProblem, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Job i's columns as boxes of count vectors: (lower corners, upper corners, grid
    indices), every vector its tasks can occupy at once (1 GPU up to its cap: tasks of a round may run in
    turn) in exactly one box. A box's column charges its lower corner's GPUs at its upper
    corner's rate (the rate grows with every GPU added), so it is optimistic for every
    vector in it; with few enough vectors each box is one vector. A box's lower corner
    grows with its index on the grid, type by type, so one box's corner is at most
    another's exactly where its index is (Pareto sets found on indices stay small)."""
    p = problem
    hi = int(p.hi[i])
    tops = [int(min(p.n_type[t], hi)) if p.allowed[i, t] else 0 for t in range(p.T)]
    fine, ratio = max(tops, default=0), 1.3
    while True:  # every count while they fit; then coarser boxes, then wider steps
        starts = [_counts(n, fine, ratio) for n in tops]
        if int(np.prod([len(c) for c in starts])) <= MAX_BOXES:
            break
        if fine > 1:
            fine //= 2
        else:
            ratio *= 1.25
    ends = [np.append(c[1:] - 1, n) for c, n in zip(starts, tops, strict=True)]
    idx = np.array(np.unravel_index(np.arange(int(np.prod([len(c) for c in starts]))),
                                    [len(c) for c in starts])).T
    lo = np.stack([starts[t][idx[:, t]] for t in range(p.T)], axis=1)
    up = np.stack([ends[t][idx[:, t]] for t in range(p.T)], axis=1)
    # the boxes holding some vector of 1..hi GPUs
    keep = (up.sum(axis=1) >= 1) & (lo.sum(axis=1) <= hi)
    return lo[keep], up[keep], idx[keep]


def pool_lp_bound(problem: PlanningProblem, pp: PoolProblem,
                  hint: np.ndarray | None = None,
                  pooled: PooledInputs | None = None) -> dict[str, Any] | None:
    """Space mode's LP (``lp_bound.lp_lower_bound``) on pool rates (module docstring):
    its result, or None where it does not run; ``pooled``: the pooled bound's inputs
    (its inequalities join the LP as cuts)."""
    from hetsched.planning.bounds import LP_MAX_JOBS
    from hetsched.planning.lp_bound import MAX_LATTICE_POINTS, lp_lower_bound
    from hetsched.planning.lp_configs import pareto_configs

    p = problem
    if p.S > LP_MAX_JOBS or any(j.elastic is not None for j in p.jobs):
        return None
    memo: dict[tuple, tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]] = {}
    lattices: list[np.ndarray | None] = []
    confs: list[tuple[np.ndarray, np.ndarray] | None] = []
    points = 0
    for i in range(p.S):
        key = (p.model_key(i), int(p.hi[i]), pp.optimizer_s[i].tobytes())
        if key not in memo:
            lo, up, idx = _boxes(p, i)
            points += len(lo)
            if not len(lo) or points > MAX_LATTICE_POINTS:
                return None
            rate = rate_bound(p, pp, i, up)
            it = np.where(rate > 0, float(p.B[i]) / np.where(rate > 0, rate, 1.0), np.inf)
            # the Pareto set on grid indices (its marks span the grid, not the counts)
            order = {tuple(v): r for r, v in enumerate(idx.tolist())}
            kx, kt = pareto_configs(p, i, idx, iters=1.0, it=it)
            rows = np.array([order[tuple(v)] for v in kx.tolist()], dtype=int)
            memo[key] = (lo, (lo[rows], kt))
        X, (cx, ct) = memo[key]
        lattices.append(X)
        confs.append((cx, ct * float(p.iters[i])))
    return lp_lower_bound(p, lattices, confs=confs, hint=hint, pooled=pooled)


__all__ = ["pool_lp_bound", "rate_bound"]
