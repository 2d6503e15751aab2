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
* each job's last interval ``[end of its window, inf)`` has no capacity or
  length limit (its work there counts at the window's end), so the LP is
  feasible and valid whatever the horizon and the windows (lp_grid.py: the
  grid is placed where the jobs are in the system, a job's window reaches
  ``WINDOW`` times its estimated stay when the whole horizon does not fit).

Every schedule the evaluator can produce (integer batches, real placements,
restart costs, one configuration per segment) induces a feasible point of
this LP with ``C_i`` its completion times, so ``sum w_i (C_i - a_i)`` at the
LP optimum bounds the total weighted JCT from below. HiGHS's tolerances are
covered by shaving 1e-6 off the value.

Jobs the LP cannot tell apart share one set of columns (:func:`job_classes`: exact,
by symmetry). Each solve is the dual simplex warm from the last round's basis, under
``ITERATION_LIMIT``; past it the interior point method solves it and the later
rounds too (a degenerate LP: many jobs that look alike).

Its size is capped (``MAX_VARS`` columns, ``VARS_PER_JOB`` per job above
``MIN_VARS``): the grid is coarsened and each job's configurations merged
into fewer optimistic ones (lp_configs.py) until it fits. Where a job's
lattice is too large (``bounds.LATTICE_MAX``) or even the coarsest grid
does not fit, :func:`lp_lower_bound` returns ``None`` and the other bounds
stand alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.lp_configs import class_of, job_classes, merge_configs, pareto_configs
from hetsched.planning.lp_grid import activity_grid, columns, windows
from hetsched.planning.lp_pooled_cuts import PooledCuts, PooledInputs
from hetsched.planning.solver import SparseRows, add_rows, highs_lp

MAX_VARS = 45_000  # LP columns; the time grid is coarsened to fit, else no LP bound
#: and at most this many per job (few jobs: a finer grid no longer pays for its cuts)
VARS_PER_JOB = 1_000
MIN_VARS = 20_000  # ... but this many whatever the jobs
MAX_CONFIGS = 400  # Pareto configurations per job
MIN_CONFIGS = 4  # ... and at least this many (merged) where the LP would not fit otherwise
INTERVALS = 192  # bounded time intervals at most (placed where the jobs run)
#: a job's bounded intervals reach this many times its estimated stay past its arrival;
#: after that its tail (a relaxation: no capacity or length limit there)
WINDOW = 4.0
TIME_LIMIT_S = 60.0  # per LP solve, a safety net only: the iteration limit ends a solve first
#: simplex iterations per LP solve (the dual simplex, warm from the last round's basis):
#: a solve that hits it is solved again by the interior point method, which the rounds
#: then keep. Gavel's traces take at most about 5,000 per solve; a sweep of 30 jobs of
#: one workload on 16 GPUs, a degenerate LP the simplex pivots around in, took 60,000
#: and 99,000 (60 s) where the interior point method takes 50 iterations (1 s).
#: Counted, not timed, so the same inputs give the same bound on any machine's load
ITERATION_LIMIT = 15_000
#: interior point iterations per LP solve: a solve that hits it ends the rounds
IPM_ITERATION_LIMIT = 1_000
#: lattice points (count vectors over distinct workloads and batches) above which the LP is
#: not tried: every one is a Pareto candidate
MAX_LATTICE_POINTS = 400_000
SAFETY = 1e-6  # relative shave for solver tolerances
MAX_ROUNDS = 4  # cutting-plane rounds for the tail inequality
MIN_INTERVALS = 8  # a coarser grid is not worth an LP
GRID_TARGET = 4  # intervals per job the per-job configuration cap leaves room for


def lp_lower_bound(p: PlanningProblem, lattices: list[np.ndarray | None],
                   n_intervals: int = INTERVALS,
                   time_limit_s: float | None = None,
                   confs: list[tuple[np.ndarray, np.ndarray] | None] | None = None,
                   hint: np.ndarray | None = None,
                   pooled: PooledInputs | None = None) -> dict[str, Any] | None:
    """The LP bound (module docstring) or ``None`` when the LP would be too large or fails.

    ``lattices[i]`` holds job i's count vectors (``bounds._lattice``), ``None`` when too many;
    ``confs[i]``, if given, job i's Pareto configurations (:func:`pareto_configs`);
    ``hint``, if given, estimated completion times where the grid should be fine;
    ``pooled``, if given, the pooled bound's inputs: its inequalities join as cuts.
    Returns ``{"weighted_jct_s", "intervals", "configs", "columns", "rounds", "time_s",
    "completion_s"}`` (``completion_s``: each job's completion time at the last solve).
    """
    t_start = time.perf_counter()
    if time_limit_s is None:
        time_limit_s = TIME_LIMIT_S
    if any(X is None or not len(X) for X in lattices):
        return None
    if confs is None:
        if sum(len(X) for X in lattices if X is not None) > MAX_LATTICE_POINTS:
            return None
        confs = [pareto_configs(p, i, X) for i, X in enumerate(lattices) if X is not None]
    if any(c is None or len(c[0]) == 0 for c in confs):
        return None
    # identical jobs (a sweep of one workload) share one set of columns: exact (below)
    cls = job_classes(p, [c for c in confs if c is not None])
    reps = np.array([c[0] for c in cls])
    mult = np.array([len(c) for c in cls], dtype=float)
    # many jobs or configurations: merge each job's into fewer, optimistic ones (valid),
    # fewer still where even the coarsest grid's windows would not fit
    max_vars = min(MAX_VARS, max(VARS_PER_JOB * p.S, MIN_VARS))
    cap = int(min(MAX_CONFIGS, max(4, max_vars // (GRID_TARGET * len(cls)))))
    a_all = p.arrival.astype(float)
    t0 = float(a_all.min())
    of = class_of(cls, p.S)  # each job's class
    a = a_all[reps]
    while True:
        merged = [merge_configs(confs[i][0], confs[i][1], cap) for i in reps]
        Pmin = np.array([float(pt.min()) for _, pt in merged])
        t1 = float(a_all.max() + (mult * Pmin).sum())
        span_all = np.maximum(Pmin[of], (hint - a_all) if hint is not None else Pmin[of])
        span = np.array([span_all[c].max() for c in cls])  # the class's longest: any is valid
        n_conf = np.array([len(X) for X, _ in merged])
        fit = _fitting_grid(a_all, span_all, t0, t1, a, span, n_conf, n_intervals, max_vars)
        if fit is not None:
            bnd, first, last = fit
            break
        if cap <= MIN_CONFIGS:
            return None
        cap = max(MIN_CONFIGS, cap // 2)
    scale = max(t1 - t0, 1e-9)  # solve in units of the span for conditioning
    w = p.weight.astype(float)[reps] * mult
    lp = _build(p.n_type, merged, Pmin, (bnd - t0) / scale, (a - t0) / scale, scale, first,
                last, w, mult)
    cuts = None if pooled is None else PooledCuts.of(pooled, p.n_type, reps, mult, a,
                                                     p.weight[reps], t0, scale)
    for terms, lower in cuts.chains() if cuts is not None else []:  # before the first solve
        _add_row(lp, [(lp.C[c], v) for c, v in terms], lower)
    value, rounds = _solve_rounds(lp, w, (a - t0) / scale, merged, scale, time_limit_s, cuts)
    if not math.isfinite(value):
        return None
    return {"weighted_jct_s": max(0.0, value * (1.0 - SAFETY)), "intervals": len(bnd),
            "configs": int(n_conf.sum()), "columns": columns(n_conf, first, last),
            "rounds": rounds, "time_s": time.perf_counter() - t_start,
            # each job's completion at the last solve (where the bound's slack is: benches)
            "classes": len(cls),
            "completion_s": [float(lp.x[lp.C[k]]) * scale + t0 for k in of]}


def _fitting_grid(a_all: np.ndarray, span_all: np.ndarray, t0: float, t1: float, a: np.ndarray,
                  span: np.ndarray, n_conf: np.ndarray, n_intervals: int, max_vars: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The finest activity grid whose windowed LP fits ``max_vars`` columns: its interval
    bounds and each class's first and last interval; None when not even the coarsest."""
    n = n_intervals
    while True:
        bnd = activity_grid(a_all, span_all, t0, t1, n)
        first, last = windows(bnd, a, np.full(len(a), t1))  # whole horizon while it fits
        if columns(n_conf, first, last) > max_vars:
            first, last = windows(bnd, a, a + WINDOW * span)
        if columns(n_conf, first, last) <= max_vars:
            return bnd, first, last
        if n <= MIN_INTERVALS:
            return None
        n = max(MIN_INTERVALS, int(n * 0.7))


@dataclass
class _LP:
    """The LP in HiGHS (columns by index) and where each job's pieces are."""

    h: Any
    C: list[int]
    #: per job: the mean busy time as (column, coefficient) pairs
    MB: list[list[tuple[int, float]]]
    #: per job, per configuration: its y columns over all intervals
    U: list[list[list[int]]]
    #: per job: per bounded interval it may run in, (z column, that interval's y columns)
    Z: list[list[tuple[int, list[int]]]] = field(default_factory=list)
    x: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: per job: its tail's y columns (the unbounded last interval)
    tail: list[list[int]] = field(default_factory=list)
    #: cuts found this round, added together
    pending: SparseRows = field(default_factory=lambda: SparseRows())


def _build(n_type: np.ndarray, confs: list[tuple[np.ndarray, np.ndarray]], Pmin: np.ndarray,
           left: np.ndarray, au: np.ndarray, scale: float, first: np.ndarray, last: np.ndarray,
           w: np.ndarray, mult: np.ndarray) -> _LP:
    """The time-indexed LP over each job's configurations (module docstring), in HiGHS.

    Job (class) i has pieces in intervals ``first[i]`` .. ``last[i] - 1`` and an
    unbounded tail from ``left[last[i]]`` on (no capacity or length limit there: a
    relaxation); its objective weight is ``w[i]`` and it uses capacity ``mult[i]``
    times (:func:`job_classes`).
    """
    import highspy

    inf = highspy.kHighsInf
    col_lo: list[float] = []
    cost: list[float] = []

    def col(lower: float = 0.0, c: float = 0.0) -> int:
        col_lo.append(lower)
        cost.append(c)
        return len(col_lo) - 1

    rows = SparseRows()
    cap: dict[tuple[int, int], list[tuple[int, float]]] = {}
    lp = _LP(None, [], [], [])
    for i, (X, pt) in enumerate(confs):
        ptu = pt / scale
        work: list[tuple[int, float]] = []
        run: list[tuple[int, float]] = []
        mbt: list[tuple[int, float]] = []
        per_conf: list[list[int]] = [[] for _ in range(len(X))]
        zs: list[tuple[int, list[int]]] = []
        K = int(last[i])
        for k in range(int(first[i]), K + 1):
            hi = left[k + 1] if k < K else math.inf
            if hi <= au[i] + 1e-12:
                continue
            lo = max(float(left[k]), float(au[i]))
            row = []
            for r in range(len(X)):
                v = col()
                row.append((v, float(ptu[r])))
                per_conf[r].append(v)
                work.append((v, 1.0))
                mbt.append((v, lo))
                if k < K:
                    for t in np.nonzero(X[r])[0]:
                        cap.setdefault((int(t), k), []).append(
                            (v, float(ptu[r] * X[r, t] * mult[i])))
            run += row
            if k < K:
                rows.add(row, -inf, float(hi - lo))
                # the work done in this interval has its mean at least Q(y_k) after ``lo``
                zs.append((col(), [v for v, _ in row]))
            else:
                lp.tail.append([v for v, _ in row])
        rows.add(work, 1.0, 1.0)
        c = col(float(au[i] + Pmin[i] / scale), float(w[i]))
        rows.add([(c, 1.0)] + [(v, -q) for v, q in run], float(au[i]), inf)
        lp.MB.append(mbt + [(z, 1.0) for z, _ in zs])
        lp.Z.append(zs)
        lp.U.append(per_conf)
        # the tail cut at "everything on the fastest configuration": C >= M + P/2
        rows.add([(c, 1.0)] + [(v, -q) for v, q in lp.MB[i]], float(Pmin[i] / scale / 2.0), inf)
        lp.C.append(c)
    for (ty, k), terms in cap.items():
        rows.add(terms, -inf, float(n_type[ty]) * float(left[k + 1] - left[k]))
    lp.h = highs_lp(rows, col_lo, cost)
    return lp


def _solve_rounds(lp: _LP, w: np.ndarray, au: np.ndarray,
                  confs: list[tuple[np.ndarray, np.ndarray]], scale: float,
                  time_limit_s: float, cuts: PooledCuts | None = None) -> tuple[float, int]:
    """Solve, add violated cuts, re-solve from the last basis: a fixed number of rounds
    (deterministic). A solve past ``ITERATION_LIMIT`` simplex iterations is done again
    by the interior point method, which the later rounds keep."""
    import highspy

    h = lp.h
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("simplex_iteration_limit", ITERATION_LIMIT)
    h.setOptionValue("ipm_iteration_limit", IPM_ITERATION_LIMIT)
    value = -math.inf
    rounds = 0
    ipm = False
    while rounds < MAX_ROUNDS:
        rounds += 1
        _flush_rows(lp)  # the cuts found since the last solve
        h.run()
        if h.getModelStatus() == highspy.HighsModelStatus.kIterationLimit and not ipm:
            ipm = True
            h.setOptionValue("solver", "ipm")
            h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            break
        lp.x = np.asarray(h.getSolution().col_value)
        value = max(value, sum(float(w[i]) * (float(lp.x[lp.C[i]]) - float(au[i]))
                               for i in range(len(lp.C))) * scale)
        if rounds == MAX_ROUNDS:
            break  # no cuts that no round would use
        if not any([_add_tail_cuts(lp, confs, scale), _add_pooled(lp, cuts, lp.x[lp.C]),
                    _add_interval_cuts(lp, confs, scale)]):  # every family, every round
            break
    return value, rounds


def tail(u: np.ndarray, pt: np.ndarray) -> float:
    """``Q(u) = 1/2 sum_rl u_r u_l min(p_r, p_l)``: the least ``C - M`` for work split ``u``."""
    return 0.5 * float(u @ np.minimum.outer(pt, pt) @ u)


def _add_row(lp: _LP, terms: list[tuple[int, float]], lower: float) -> None:
    """Queue the cut ``sum coef * x[col] >= lower`` (:func:`_flush_rows` adds them)."""
    lp.pending.add(terms, lower, math.inf)


def _flush_rows(lp: _LP) -> None:
    """Add the queued cuts to the live model in one call."""
    if lp.pending.lo:
        add_rows(lp.h, lp.pending)
        lp.pending = SparseRows()


def _add_tail_cuts(lp: _LP, confs: list[tuple[np.ndarray, np.ndarray]], scale: float) -> bool:
    """Add ``C >= M + Q(u*) + grad Q(u*).(u - u*)`` where the LP point violates ``C >= M + Q(u)``.

    Q is convex (the min kernel is positive semidefinite), so every tangent
    plane lies below it and the cut is valid for every schedule. Returns True
    if a cut was added.
    """
    x = lp.x
    added = False
    for i, (_X, pt) in enumerate(confs):
        ptu = pt / scale
        u = np.array([float(x[cols].sum()) for cols in lp.U[i]])
        q = tail(u, ptu)
        mb = sum(float(x[c]) * v for c, v in lp.MB[i])
        have = float(x[lp.C[i]]) - mb
        if q <= have * (1.0 + 1e-6) + 1e-9:
            continue
        g = np.minimum.outer(ptu, ptu) @ u  # gradient; the cut is g.u' - Q(u*)
        # C - M - sum_r g_r u_r >= -Q(u*)
        terms = [(lp.C[i], 1.0)] + [(c, -v) for c, v in lp.MB[i]]
        terms += [(c, -float(g[r])) for r in range(len(g)) if g[r] > 0 for c in lp.U[i][r]]
        _add_row(lp, _merge(terms), -q)
        added = True
    return added


def _add_pooled(lp: _LP, cuts: PooledCuts | None, C: np.ndarray) -> bool:
    """Queue the pooled machine's inequalities violated at completions ``C`` (scaled)."""
    found = cuts.violated(C) if cuts is not None else []
    for terms, lower in found:
        _add_row(lp, [(lp.C[c], v) for c, v in terms], lower)
    return bool(found)


def _merge(terms: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Sum the coefficients of repeated columns (HiGHS wants each column once per row)."""
    out: dict[int, float] = {}
    for c, v in terms:
        out[c] = out.get(c, 0.0) + v
    return list(out.items())


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
    x = lp.x
    added = False
    for i, (_X, pt) in enumerate(confs):
        ptu = pt / scale
        ker = np.minimum.outer(ptu, ptu)
        for z, ys in lp.Z[i]:
            y = x[ys]
            q = 0.5 * float(y @ ker @ y)
            if q <= float(x[z]) * (1.0 + 1e-6) + 1e-9:
                continue
            g = ker @ y
            # z - sum_r g_r y_r >= -Q(y*)
            _add_row(lp, [(z, 1.0)] + [(ys[r], -float(g[r])) for r in range(len(g)) if g[r] > 0],
                     -q)
            added = True
    return added
