"""Hare's scheduler (HPDC'22, section 5.2): a relaxation gives an order, Algorithm 1 lists tasks.

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

Step 2 — order and list scheduling
----------------------------------
Each job's LP (or fluid) progress curve gives the relaxed start time of each
of its rounds, ``x_hat``; the paper's maximum middle completion time is
``H = x_hat + max_m T^c / 2``. Tasks are listed in non-decreasing H
(Algorithm 1, line 4) and each is placed on a GPU (line 12), starting at
``max(round ready, GPU free)`` (line 13); the GPU is free again when the task's
*compute* ends — its synchronisation overlaps the next task (line 16) and
only delays the job's next round (line 10).

Line 12 takes "the GPU with the earliest available time". That is blind to
how fast the GPU is for the task; ``pick=finish`` takes instead the GPU on which
the task *finishes* first (same time when all GPUs are alike). A task keeps
the GPU its predecessor in the job used when that is no worse (warm model,
compact plan). The paper's alpha(2+alpha) guarantee is proven for
``available`` with the paper's MIQP order, which we do not solve.

Orders. On these workloads the relaxation is often degenerate — when the
pool has room, every job can run at full speed in it, so its H says nothing
about priorities — and Algorithm 1 is only as good as its order. ``order=best``
(default) therefore runs Algorithm 1 over several orders and keeps the
lowest objective: ``relaxation`` (the H above, with both GPU rules),
``priority`` / ``work`` (a time-driven list simulation that always places the
ready round of the job with the largest weight per remaining critical path /
per remaining GPU-work), and ``seeded:allox`` / ``seeded:srtf`` (rounds in
the start order of those job-level schedules, i.e. their left shift under
relaxed sync). The plan's params say which order won; docs/pool.md reports
every variant.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetsched.errors import InputError
from hetsched.planning.pool.evaluator import TaskSchedule
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


def _job_consts(pp: PoolProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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
    W, d, L, conc = _job_consts(pp)
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
    W, d, L, _ = _job_consts(pp)
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


# ---------------------------------------------------------------------------
# Algorithm 1


def relaxation_order(pp: PoolProblem, x_hat: list[np.ndarray]) -> tuple[list[int], list[int]]:
    """Rounds (job, round) by non-decreasing H = x_hat + max_m T^c / 2 (Algorithm 1, line 4)."""
    S = pp.S
    # round-level H (all P tasks of a round share it); kept non-decreasing along each job
    rj, rr, rh = [], [], []
    for i in range(S):
        R = int(pp.R[i])
        n = np.full(R, float(pp.N[i]))
        n[-1] = float(pp.last[i])
        tmax = float(pp.t_it[i][pp.ok[i]].max())
        H = np.maximum.accumulate(x_hat[i] + 0.5 * n * tmax)
        rj.append(np.full(R, i))
        rr.append(np.arange(R))
        rh.append(H)
    J = np.concatenate(rj)
    Rr = np.concatenate(rr)
    Hh = np.concatenate(rh)
    order = np.lexsort((J, Rr, Hh))
    return J[order].tolist(), Rr[order].tolist()


def priority_order(pp: PoolProblem, size: str = "path") -> tuple[list[int], list[int]]:
    """A second order for Algorithm 1: weighted shortest remaining job first.

    ``size="path"`` measures what is left of a job by its critical path (right
    when the pool has room: a job's wait is its own length), ``size="work"`` by
    its GPU-seconds on its fastest type (Smith's rule, right when the pool is
    congested: a job's cost to the others is the capacity it takes).

    Simulates the list scheduler in time: whenever a GPU can take work, the
    ready round (previous round synchronised, job arrived) of the job with the
    largest ``w_i / remaining critical path`` is placed next (earliest-finish
    GPU). The resulting placement sequence is the order pi. On lightly loaded
    pools the relaxation is degenerate (every job could run at full speed in
    it), so its H carries no priority information; this order does.
    """
    _, d, _, _ = _job_consts(pp)
    if size == "work":  # GPU-seconds per iteration on the fastest allowed type
        d = pp.P * np.where(pp.ok, pp.t_it, np.inf).min(axis=1)
    T = pp.T
    heaps: list[list[float]] = [[] for _ in range(T)]
    for t in pp.gpu_type.tolist():
        heaps[t].append(0.0)
    for h in heaps:
        heapq.heapify(h)
    ok = [[t for t in range(T) if pp.ok[i, t] and heaps[t]] for i in range(pp.S)]
    t_it, s_it = pp.t_it.tolist(), pp.s_it.tolist()
    P, N, R, last = pp.P.tolist(), pp.N.tolist(), pp.R.tolist(), pp.last.tolist()
    w = pp.weight.tolist()
    total = pp.total_iters.tolist()
    nxt_round = [0] * pp.S
    pending: list[tuple[float, int]] = [(float(a), i) for i, a in enumerate(pp.arrival.tolist())]
    heapq.heapify(pending)
    ready: list[tuple[float, int]] = []  # (-priority, job)
    out_j: list[int] = []
    out_r: list[int] = []
    now = 0.0
    while pending or ready:
        now = max(now, min(h[0] for h in heaps if h))
        if not ready or (pending and pending[0][0] <= now):
            if not ready:
                now = max(now, pending[0][0])
            while pending and pending[0][0] <= now:
                _, i = heapq.heappop(pending)
                rem = total[i] - nxt_round[i] * N[i]
                heapq.heappush(ready, (-w[i] / (rem * d[i]), i))
        _, i = heapq.heappop(ready)
        r = nxt_round[i]
        n = last[i] if r == R[i] - 1 else N[i]
        rdy = now
        done = rdy
        for _ in range(P[i]):
            best_t, best_v = -1, math.inf
            for t in ok[i]:
                phi = heaps[t][0]
                v = (phi if phi > rdy else rdy) + n * t_it[i][t]
                if v < best_v:
                    best_t, best_v = t, v
            heapq.heapreplace(heaps[best_t], best_v)
            done = max(done, best_v + n * s_it[i][best_t])
        out_j.append(i)
        out_r.append(r)
        nxt_round[i] = r + 1
        if r + 1 < R[i]:
            heapq.heappush(pending, (done, i))
    return out_j, out_r


def seeded_order(pp: PoolProblem, seed: TaskSchedule) -> tuple[list[int], list[int]]:
    """Rounds in the start order of a feasible schedule (its round starts act as x_hat).

    Algorithm 1 over this order is a left shift of ``seed`` under relaxed
    scale-fixed sync: GPUs are no longer held through a round's barrier, and
    a GPU idles where the seed let a later round wait for it (the reservation
    a work-conserving priority order cannot make).
    """
    key = np.concatenate([[0], np.cumsum(pp.R)[:-1]])[seed.job] + seed.rnd
    first = np.full(int(pp.R.sum()), np.inf)
    np.minimum.at(first, key, np.asarray(seed.start, dtype=float))
    J = np.repeat(np.arange(pp.S), pp.R)
    Rr = np.concatenate([np.arange(int(r)) for r in pp.R])
    order = np.lexsort((J, Rr, first))
    return J[order].tolist(), Rr[order].tolist()


def _run_rounds(pp: PoolProblem, jobs: list[int], rounds: list[int], pick: str,
                policy: str) -> TaskSchedule:
    """Place the tasks of rounds in the given order (each job's rounds must be in order)."""
    T = pp.T
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(T)]
    for g, t in enumerate(pp.gpu_type.tolist()):
        heaps[t].append((0.0, g))
    for h in heaps:
        heapq.heapify(h)
    ok = [[t for t in range(T) if pp.ok[i, t] and heaps[t]] for i in range(pp.S)]
    t_it = pp.t_it.tolist()
    s_it = pp.s_it.tolist()
    arrival = pp.arrival.tolist()
    P = pp.P.tolist()
    N = pp.N.tolist()
    R = pp.R.tolist()
    last = pp.last.tolist()
    ready = list(arrival)
    n_tasks = pp.n_tasks
    out_j = np.empty(n_tasks, dtype=np.int64)
    out_r = np.empty(n_tasks, dtype=np.int64)
    out_k = np.empty(n_tasks, dtype=np.int64)
    out_g = np.empty(n_tasks, dtype=np.int64)
    out_s = np.empty(n_tasks, dtype=float)
    pos = 0
    by_finish = pick == "finish"
    gtype = pp.gpu_type.tolist()
    phi_of = [0.0] * pp.K  # current available time of each GPU; heap entries may be stale
    home: list[list[int]] = [[-1] * p for p in P]  # GPU that ran task k of the previous round

    def top(t: int) -> float:
        h = heaps[t]
        while h[0][0] != phi_of[h[0][1]]:  # drop stale entries (GPU taken via affinity)
            heapq.heappop(h)
        return h[0][0]

    for i, r in zip(jobs, rounds, strict=True):
        n = last[i] if r == R[i] - 1 else N[i]
        rdy = ready[i]
        types = ok[i]
        ti = t_it[i]
        si = s_it[i]
        done = rdy
        hm = home[i]
        for k in range(P[i]):
            best_t = -1
            best_v = math.inf
            best_c = math.inf
            for t in types:
                phi = top(t)
                tc = n * ti[t]
                v = (phi if phi > rdy else rdy) + tc if by_finish else phi
                if v < best_v or (v == best_v and tc < best_c):
                    best_t, best_v, best_c = t, v, tc
            g = -1
            gh = hm[k]
            if gh >= 0:  # affinity: the task's previous GPU when it is no worse (warm model)
                th = gtype[gh]
                ph = phi_of[gh]
                vh = (ph if ph > rdy else rdy) + n * ti[th] if by_finish else ph
                if vh <= best_v:
                    g, best_t, best_c = gh, th, n * ti[th]
            if g < 0:
                _, g = heapq.heappop(heaps[best_t])
            phi = phi_of[g]
            x = phi if phi > rdy else rdy
            e = x + best_c
            phi_of[g] = e
            heapq.heappush(heaps[best_t], (e, g))
            hm[k] = g
            se = e + n * si[best_t]
            if se > done:
                done = se
            out_j[pos], out_r[pos], out_k[pos], out_g[pos], out_s[pos] = i, r, k, g, x
            pos += 1
        ready[i] = done
    if pos != n_tasks:
        raise AssertionError("list scheduling missed tasks (rounds out of order?)")
    return TaskSchedule(out_j, out_r, out_k, out_g, out_s, policy=policy)


PICKS = ("finish", "available")
ORDERS = ("relaxation", "priority", "work")


@dataclass
class HareResult:
    schedule: TaskSchedule
    relaxation: Relaxation
    objectives: dict[str, float]  # "order/pick" -> total weighted JCT


def hare_from(pp: PoolProblem, rel: Relaxation, pick: str = "best",
              order: str = "best", seeds: dict[str, TaskSchedule] | None = None) -> HareResult:
    """Algorithm 1 for each requested order x GPU rule; keeps the lowest objective."""
    from hetsched.planning.pool.evaluator import evaluate

    if pick not in PICKS + ("best",):
        raise InputError("--param pick", f"{pick!r} is not valid; expected finish, available "
                         "or best")
    if order not in ORDERS + ("seeded", "best"):
        raise InputError("--param order", f"{order!r} is not valid; expected relaxation, "
                         "priority, work, seeded or best")
    best: TaskSchedule | None = None
    best_v = math.inf
    objectives: dict[str, float] = {}
    if order in ("best", "seeded") and seeds is None:
        from hetsched.planning.pool.baselines import allox, srtf

        seeds = {"allox": allox(pp), "srtf": srtf(pp)}
    todo: list[tuple[str, Any]] = [(o, None) for o in ORDERS] if order == "best" else (
        [] if order == "seeded" else [(order, None)])
    if order in ("best", "seeded"):
        todo += [(f"seeded:{k}", v) for k, v in (seeds or {}).items()]
    for o, seed in todo:
        if seed is not None:
            J, Rr = seeded_order(pp, seed)
        elif o == "relaxation":
            J, Rr = relaxation_order(pp, rel.x_hat)
        else:
            J, Rr = priority_order(pp, "path" if o == "priority" else "work")
        # the paper's "earliest available GPU" is tried with the paper's order only: with
        # the priority orders it is dominated by "earliest finish" on heterogeneous pools
        rules = PICKS if pick == "best" and o == "relaxation" else (
            ("finish",) if pick == "best" else (pick,))
        for rule in rules:
            s = _run_rounds(pp, J, Rr, rule, "hare")
            v = evaluate(pp, s).objective
            objectives[f"{o}/{rule}"] = v
            if v < best_v - 1e-9:
                best, best_v = s, v
                best.params = {"order": o, "pick": rule}
    assert best is not None
    return HareResult(best, rel, objectives)


def hare_schedule(pp: PoolProblem, pick: str = "best", order: str = "best",
                  bound: str = "auto") -> HareResult:
    """Hare's schedule for ``pp``: relaxation (``bound`` auto|lp|fluid), then Algorithm 1."""
    if bound not in ("auto", "lp", "fluid"):
        raise InputError("--param bound", f"{bound!r} is not valid; expected auto, lp or fluid")
    return hare_from(pp, relaxation(pp, bound), pick, order)
