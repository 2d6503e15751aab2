"""Hare's scheduler (HPDC'22, section 5.2): a relaxation gives an order, Algorithm 1 lists tasks.

Step 1, the relaxation (a valid lower bound and each round's relaxed start), is in
``relaxation.py``; its module docstring says why it is not the paper's MIQP.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetsched.errors import InputError
from hetsched.planning.pool.evaluator import TaskSchedule
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.pool.relaxation import Relaxation, job_consts

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
    _, d, _, _ = job_consts(pp)
    if size == "work":  # GPU-seconds per iteration on the fastest allowed type
        d = pp.P * np.where(pp.ok, pp.t_it, np.inf).min(axis=1)
    T = pp.T
    heaps: list[list[float]] = [[] for _ in range(T)]
    for t in pp.gpu_type.tolist():
        heaps[t].append(0.0)
    for h in heaps:
        heapq.heapify(h)
    ok = [[t for t in range(T) if pp.ok[i, t] and heaps[t]] for i in range(pp.S)]
    t_it, s_task = pp.t_it.tolist(), pp.s_task.tolist()
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
            done = max(done, best_v + s_task[i][best_t])
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
    s_task = pp.s_task.tolist()
    arrival = pp.arrival.tolist()
    P = pp.P.tolist()
    N = pp.N.tolist()
    R = pp.R.tolist()
    last = pp.last.tolist()
    ready = list(arrival)
    n_tasks = pp.n_tasks
    # each task's (job, round, task, GPU, start), a list each
    out: list[list[Any]] = [[], [], [], [], []]
    add_j, add_r, add_k, add_g, add_s = (col.append for col in out)
    by_finish = pick == "finish"
    gtype = pp.gpu_type.tolist()
    phi_of = [0.0] * pp.K  # current available time of each GPU; heap entries may be stale
    home: list[list[int]] = [[-1] * p for p in P]  # GPU that ran task k of the previous round

    heappop, heappush = heapq.heappop, heapq.heappush
    for i, r in zip(jobs, rounds, strict=True):
        n = last[i] if r == R[i] - 1 else N[i]
        rdy = ready[i]
        ti = t_it[i]
        si = s_task[i]
        cost = [n * ti[t] for t in range(T)]
        done = rdy
        hm = home[i]
        for k in range(P[i]):
            best_t = -1
            best_v = math.inf
            best_c = math.inf
            for t in ok[i]:
                h = heaps[t]
                top = h[0]
                while top[0] != phi_of[top[1]]:  # drop stale entries (GPU taken via affinity)
                    heappop(h)
                    top = h[0]
                phi = top[0]
                tc = cost[t]
                v = (phi if phi > rdy else rdy) + tc if by_finish else phi
                if v < best_v or (v == best_v and tc < best_c):
                    best_t, best_v, best_c = t, v, tc
            g = -1
            gh = hm[k]
            if gh >= 0:  # affinity: the task's previous GPU when it is no worse (warm model)
                th = gtype[gh]
                ph = phi_of[gh]
                vh = (ph if ph > rdy else rdy) + cost[th] if by_finish else ph
                if vh <= best_v:
                    g, best_t, best_c = gh, th, cost[th]
            if g < 0:
                _, g = heappop(heaps[best_t])
            phi = phi_of[g]
            x = phi if phi > rdy else rdy
            e = x + best_c
            phi_of[g] = e
            heappush(heaps[best_t], (e, g))
            hm[k] = g
            se = e + si[best_t]
            if se > done:
                done = se
            add_j(i), add_r(r), add_k(k), add_g(g), add_s(x)
        ready[i] = done
    if len(out[0]) != n_tasks:
        raise AssertionError("list scheduling missed tasks (rounds out of order?)")
    cj, cr, ck, cg = (np.array(c, dtype=np.int64) for c in out[:4])
    return TaskSchedule(cj, cr, ck, cg, np.array(out[4], dtype=float), policy=policy)


PICKS = ("finish", "available")
ORDERS = ("relaxation", "priority", "work")


@dataclass
class HareResult:
    schedule: TaskSchedule
    relaxation: Relaxation
    objectives: dict[str, float]  # "order/pick" -> total weighted JCT


def hare_from(pp: PoolProblem, rel: Relaxation, pick: str = "best",
              order: str = "best", seeds: dict[str, TaskSchedule] | None = None,
              late_seeds: Callable[[], dict[str, TaskSchedule]] | None = None) -> HareResult:
    """Algorithm 1 for each requested order x GPU rule; keeps the lowest objective.

    ``seeds``: schedules whose round order is tried (``seeded``; default: allox's and
    srtf's); ``late_seeds()``: more, asked for after every other order has run (the
    space plan's, computed meanwhile), tried last."""
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

    def passes() -> Iterator[tuple[str, Any]]:
        yield from todo
        if order in ("best", "seeded") and late_seeds is not None:
            yield from ((f"seeded:{k}", v) for k, v in late_seeds().items())

    for o, seed in passes():
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
