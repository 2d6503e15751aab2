"""Hare's relaxation (HPDC'22, section 5.2): a lower bound and each round's relaxed start.

Step 1 — the relaxation, and why not the paper's
-------------------------------------------------
The paper relaxes the non-overlap constraint (8) into Queyranne's per-machine
inequality (9) and solves the resulting mixed-integer *quadratic* program
(Hare_Sched_RL) with CPLEX/Gurobi. That program keeps one binary per task and
GPU (millions for real jobs), is not linear (pulp cannot state it), and is
itself NP-hard, so it is neither solvable here nor a bound one can certify
without solving it to optimality. We use instead a **time-indexed linear
relaxation with the mean-busy-time inequality** (Schulz & Skutella's LP for
unrelated machines, aggregated per job and per GPU type), which is provably
a lower bound on every feasible Hare_Sched schedule and is an LP:

* ``z[i,t,k]`` = fraction of job i's work (task-iterations, ``W_i = iters_i * P_i``)
  done on GPU type t during time interval k; ``sum_{t,k} z = 1``.
* capacity: type t offers ``n_t * |k|`` GPU-seconds in interval k;
  concurrency: at most ``min(P_i, allowed GPUs)`` GPUs work on job i at once
  (relaxed scale-fixed sync: only one round's P tasks are ever runnable);
  round rate: a window of length L holds at most ``L / d_i + 2 N_i``
  iterations of job i (``d_i`` = per-iteration critical path below).
* ``d_i = P_i / rho_i + s_min``: per iteration, the P slices need at least
  ``P_i / rho_i`` on the job's fastest GPUs (``rho_i`` their summed rate) and
  the last one then synchronises; ``L_i = iters_i * d_i`` is job i's critical
  path, so ``C_i >= a_i + L_i``.
* mean busy time: with ``tau(f)`` the time fraction f of the job is done,
  the rest needs at least ``(1-f) L_i`` more, so
  ``C_i >= M_i + L_i / 2`` with ``M_i = int_0^1 tau(f) df >= sum z * left(k)``
  (left end of interval k, clipped to the arrival). A last interval
  ``[horizon, inf)`` has no capacity limit, so the LP is feasible and valid
  whatever the horizon.

Minimising ``sum w_i C_i`` subject to these gives a value no feasible schedule
beats; minus ``sum w_i a_i`` it bounds the total weighted JCT. It is solved
with pulp + HiGHS (CBC as fallback) while it has at most ``LP_MAX_VARS``
variables (the grid of intervals is coarsened to fit first).

Fast surrogate beyond that size: a fluid relaxation. Every schedule induces a
preemptive schedule of "machine units" ``p_i = W_i / sum_g r_i(g)`` on one
machine of speed ``kappa = sum_g max_i r_i(g) / sum_g' r_i(g')`` (as in the
space-mode bound, lower_bound.py) with release dates; preemptive WSPT
minimises the total weighted mean busy time there (Goemans 1996), so
``max(sum w_i L_i, sum w_i (M_i^WSPT + L_i/2 - a_i))`` is again a valid bound.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetsched.errors import InputError
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.solver import lp_solver

#: largest LP handed to pulp; above it the grid is coarsened, then the fluid surrogate is used
LP_MAX_VARS = 40_000
#: intervals of the time grid (before coarsening)
LP_INTERVALS = 48
#: coarsest grid still worth an LP
LP_MIN_INTERVALS = 12


@dataclass
class Relaxation:
    """A lower bound on total weighted JCT and the relaxed start time of every round."""

    value: float  # lower bound on sum w_i (C_i - a_i)
    method: str  # "lp" or "fluid"
    x_hat: list[np.ndarray]  # per job: relaxed start of each round
    solve_s: float = 0.0
    intervals: int = 0


def alpha(pp: PoolProblem) -> float:
    """The paper's alpha: largest ratio of a task's slowest to fastest compute (or sync) time."""
    a = 1.0
    for i in range(pp.S):
        tc = pp.t_it[i][pp.ok[i]]
        a = max(a, float(tc.max() / tc.min()))
        ts = pp.s_it[i][pp.ok[i]]
        if ts.min() > 1e-12:
            a = max(a, float(ts.max() / ts.min()))
    return a


def job_consts(pp: PoolProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per job: work W (task-iterations), per-iteration critical path d, L = iters*d, concurrency."""
    W = pp.total_iters.astype(float) * pp.P
    d = np.array([pp.critical_path(i) / float(pp.total_iters[i]) for i in range(pp.S)])
    L = pp.total_iters.astype(float) * d
    conc = np.array([min(int(pp.P[i]), pp.allowed_gpus(i)) for i in range(pp.S)], dtype=float)
    return W, d, L, conc


def _horizon(pp: PoolProblem, L: np.ndarray, W: np.ndarray) -> tuple[float, float]:
    """A generous time span for the grid: arrivals, critical paths and total work on the pool."""
    t0 = float(pp.arrival.min())
    best_t = np.where(pp.ok, pp.t_it, np.inf).min(axis=1)
    work = float((W * best_t).sum()) / pp.K
    t1 = max(float((pp.arrival + L).max()), t0 + work) * 1.5
    return t0, max(t1, t0 + 1e-6)


def _grid(pp: PoolProblem, t0: float, t1: float, n: int) -> np.ndarray:
    """Interval boundaries on [t0, t1]: uniform, geometric near t0, and arrival quantiles."""
    span = t1 - t0
    u = np.linspace(0.0, 1.0, max(2, n // 2 + 1))
    g = np.geomspace(1e-3, 1.0, max(2, n // 4))
    q = (np.quantile(pp.arrival, np.linspace(0, 1, max(2, n // 4))) - t0) / span
    pts = np.unique(np.clip(np.concatenate([[0.0, 1.0], u, g, q]), 0.0, 1.0))
    keep = [pts[0]]
    for x in pts[1:]:
        if x - keep[-1] > 1e-4:
            keep.append(x)
    keep[-1] = 1.0
    return t0 + span * np.array(keep)


def _progress_starts(pp: PoolProblem, i: int, times: np.ndarray, fracs: np.ndarray,
                     d: float) -> np.ndarray:
    """Relaxed round starts: when the job's progress curve reaches each round's first iteration."""
    R, N = int(pp.R[i]), int(pp.N[i])
    before = np.arange(R, dtype=float) * N  # iterations done before round r
    target = before / float(pp.total_iters[i])
    x = np.interp(target, fracs, times) if len(times) > 1 else np.full(R, times[0])
    x = np.maximum(x, float(pp.arrival[i]) + before * d)  # the critical path
    return np.maximum.accumulate(x)


def lp_relaxation(pp: PoolProblem, n_intervals: int = LP_INTERVALS,
                  solver: str = "highs") -> Relaxation:
    """Solve the time-indexed LP (module docstring) with pulp; raises RuntimeError if not optimal."""
    import pulp

    t_start = time.perf_counter()
    W, d, L, conc = job_consts(pp)
    t0, t1 = _horizon(pp, L, W)
    bnd = _grid(pp, t0, t1, n_intervals)
    K = len(bnd) - 1  # bounded intervals; index K is [t1, inf)
    scale = t1 - t0  # solve in units of the span for conditioning
    left = (bnd - t0) / scale
    a = (pp.arrival - t0) / scale
    tt = pp.t_it * W[:, None] / scale  # span-units of GPU time for the whole job on type t
    prob = pulp.LpProblem("hare_relaxation", pulp.LpMinimize)
    cap_terms: dict[tuple[int, int], list[tuple[Any, float]]] = {}
    z: dict[tuple[int, int, int], Any] = {}
    C = []
    for i in range(pp.S):
        types = [t for t in range(pp.T) if pp.ok[i, t]]
        work_terms = []
        mbt_terms = []
        for k in range(K + 1):
            hi = left[k + 1] if k < K else math.inf
            if hi <= a[i] + 1e-12:
                continue
            lo = max(left[k], a[i])
            ln = hi - lo
            row = []
            for t in types:
                v = prob.add_variable(f"z_{i}_{t}_{k}", lowBound=0)
                z[(i, t, k)] = v
                row.append((v, t))
                work_terms.append(v)
                mbt_terms.append((v, lo))
                if k < K:
                    cap_terms.setdefault((t, k), []).append((v, float(tt[i, t])))
            if k < K:
                prob += pulp.lpSum(v * float(tt[i, t]) for v, t in row) <= conc[i] * ln
                rate = float(pp.P[i]) * (ln * scale / d[i] + 2.0 * float(pp.N[i])) / W[i]
                if rate < 1.0:
                    prob += pulp.lpSum(v for v, _ in row) <= rate
        prob += pulp.lpSum(work_terms) == 1
        c = prob.add_variable(f"C_{i}", lowBound=float(a[i] + L[i] / scale))
        prob += c >= pulp.lpSum(v * lo for v, lo in mbt_terms) + float(L[i] / scale / 2.0)
        C.append(c)
    for (t, k), terms in cap_terms.items():
        prob += pulp.lpSum(v * c for v, c in terms) <= float(pp.n_type_gpus[t]) * (
            left[k + 1] - left[k])
    prob += pulp.lpSum(float(pp.weight[i]) * C[i] for i in range(pp.S))
    if solver == "highs":
        slv: Any = lp_solver()
    else:
        slv = pulp.PULP_CBC_CMD(msg=False)
    status = prob.solve(slv)
    if pulp.LpStatus[status] != "Optimal":
        raise RuntimeError(f"relaxation LP: {pulp.LpStatus[status]}")
    value = sum(float(pp.weight[i]) * (float(C[i].value()) - float(a[i])) for i in range(pp.S))
    value *= scale
    x_hat = []
    for i in range(pp.S):
        times = [float(pp.arrival[i])]
        fr = [0.0]
        for k in range(K + 1):
            f = sum(float(z[(i, t, k)].value() or 0.0) for t in range(pp.T) if (i, t, k) in z)
            if f <= 1e-12:
                continue
            lo = max(float(bnd[k]), float(pp.arrival[i]))
            hi = float(bnd[k + 1]) if k < K else lo + f * L[i]
            if lo > times[-1]:
                times.append(lo)
                fr.append(fr[-1])
            times.append(max(hi, times[-1] + 1e-9))
            fr.append(fr[-1] + f)
        x_hat.append(_progress_starts(pp, i, np.array(times), np.array(fr), d[i]))
    # numerical safety: never claim more than the LP proves (HiGHS tolerances ~1e-7)
    value = max(0.0, value * (1.0 - 1e-7))
    return Relaxation(value, "lp", x_hat, time.perf_counter() - t_start, K + 1)


def fluid_relaxation(pp: PoolProblem) -> Relaxation:
    """The fast surrogate (module docstring): preemptive WSPT on one fluid machine."""
    t_start = time.perf_counter()
    W, d, L, _ = job_consts(pp)
    r = np.where(pp.ok, 1.0 / pp.t_it, 0.0)  # (S, T) task-iterations/s of one GPU
    cnt = np.bincount(pp.gpu_type, minlength=pp.T).astype(float)
    Rsum = (r * cnt[None, :]).sum(axis=1)
    kappa = float(((r / Rsum[:, None]).max(axis=0) * cnt).sum())
    p = W / Rsum / kappa  # processing time on the fluid machine
    w = pp.weight
    # event simulation of preemptive WSPT with release dates
    order_arr = np.argsort(pp.arrival, kind="stable")
    left = p.copy()
    heap: list[tuple[float, int]] = []
    t = float(pp.arrival[order_arr[0]])
    nxt = 0
    pieces: list[list[tuple[float, float, float]]] = [[] for _ in range(pp.S)]  # (t0, t1, frac)
    done = 0
    while done < pp.S:
        while nxt < pp.S and pp.arrival[order_arr[nxt]] <= t + 1e-12:
            j = int(order_arr[nxt])
            heapq.heappush(heap, (-w[j] / p[j], j))
            nxt += 1
        if not heap:
            t = float(pp.arrival[order_arr[nxt]])
            continue
        _, j = heap[0]
        t_arr = float(pp.arrival[order_arr[nxt]]) if nxt < pp.S else math.inf
        run = min(left[j], t_arr - t)
        pieces[j].append((t, t + run, run / p[j]))
        left[j] -= run
        t += run
        if left[j] <= 1e-12 * p[j]:
            heapq.heappop(heap)
            done += 1
    M = np.array([sum(f * 0.5 * (a0 + a1) for a0, a1, f in pieces[i]) for i in range(pp.S)])
    lb1 = float((w * L).sum())
    lb2 = float((w * (M + L / 2.0 - pp.arrival)).sum())
    x_hat = []
    for i in range(pp.S):
        times, fr = [float(pp.arrival[i])], [0.0]
        for a0, a1, f in pieces[i]:
            if a0 > times[-1]:
                times.append(a0)
                fr.append(fr[-1])
            times.append(max(a1, times[-1] + 1e-9))
            fr.append(fr[-1] + f)
        x_hat.append(_progress_starts(pp, i, np.array(times), np.array(fr), d[i]))
    value = max(0.0, max(lb1, lb2) * (1.0 - 1e-9))
    return Relaxation(value, "fluid", x_hat, time.perf_counter() - t_start, 0)


def relaxation(pp: PoolProblem, method: str = "auto") -> Relaxation:
    """The bound and round order: the LP while it fits ``LP_MAX_VARS``, else the fluid surrogate."""
    if method not in ("auto", "lp", "fluid"):
        raise InputError("--param bound", f"{method!r} is not valid; expected auto, lp or fluid")
    if method == "fluid":
        return fluid_relaxation(pp)
    per_interval = int(pp.ok.sum())
    n = LP_INTERVALS
    while n > LP_MIN_INTERVALS and per_interval * (n + 8) > LP_MAX_VARS:
        n = int(n * 0.75)
    if method == "auto" and per_interval * (n + 8) > LP_MAX_VARS:
        return fluid_relaxation(pp)
    try:
        lp = lp_relaxation(pp, n)
    except RuntimeError:
        if method == "lp":
            raise
        return fluid_relaxation(pp)
    if method == "auto":
        # the fluid bound is cheap; report the larger valid bound (order from the LP)
        fl = fluid_relaxation(pp)
        lp.value = max(lp.value, fl.value)
    return lp
