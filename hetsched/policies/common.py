"""Pieces several policies share: admission, initial sizes, exact matching, objectives."""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from hetsched.policies.base import Snapshot
from hetsched.problem import PlanningProblem

INF = float("inf")


def min_feasible(p: PlanningProblem, i: int, free: np.ndarray, order: np.ndarray,
                 at_least: int | None = None) -> np.ndarray:
    """Fewest GPUs (taking types in ``order``) that meet min_gpus and hold the global batch.

    ``at_least`` raises the GPU count to reach (default: the job's min_gpus).
    Returns zeros if the free GPUs cannot do it.
    """
    lo = int(p.lo[i]) if at_least is None else max(int(p.lo[i]), int(at_least))
    n = np.zeros(p.T, dtype=int)
    room = free.copy()
    held = 0
    k = 0
    for t in order:
        if not p.allowed[i, t]:
            continue
        while room[t] > 0 and (k < lo or held < p.B[i]) and k < p.hi[i]:
            n[t] += 1
            room[t] -= 1
            held += int(p.cap[i, t])
            k += 1
        if k >= lo and held >= p.B[i]:
            return n
    by_memory = largest_memory_types(p, i)
    if [int(t) for t in order] != by_memory:
        # Taking types in ``order`` (e.g. fastest first) can reach max_gpus
        # before the GPUs taken hold the global batch (fast GPUs with little
        # memory); such a job was never admitted, even alone on an idle
        # cluster, and the plan failed. Largest memory first holds the batch
        # on the fewest GPUs whenever any free set can (the check
        # PlanningProblem makes on the whole cluster).
        return min_feasible(p, i, free, by_memory, at_least)
    return np.zeros(p.T, dtype=int)


def largest_memory_types(p: PlanningProblem, i: int) -> list[int]:
    """GPU types by decreasing local-batch cap for job i, cached."""
    cache = p.__dict__.setdefault("_by_memory", {})
    if i not in cache:
        cache[i] = [int(t) for t in np.argsort(-p.cap[i], kind="stable")]
    return cache[i]


def fastest_types(p: PlanningProblem, i: int) -> np.ndarray:
    """GPU types from fastest to slowest for job i (peak per-GPU throughput)."""
    return np.argsort(-p.per_gpu_rate(i), kind="stable")


def objective_rows(p: PlanningProblem, snap: Snapshot, X: np.ndarray) -> np.ndarray:
    """Per-job predicted weighted remaining time ``w_i * rem_i * iter_i`` of allocation X.

    Jobs with no GPUs contribute 0 here; callers handle waiting jobs.
    """
    out = np.zeros(len(snap.jobs))
    for r, i in enumerate(snap.jobs):
        if X[r].sum():
            out[r] = p.weight[i] * snap.remaining[r] * p.iter_time(int(i), X[r][None, :])[0]
    return out


def smith_priority(p: PlanningProblem, snap: Snapshot) -> np.ndarray:
    """Smith's rule key (higher first): weight over remaining time on the job's minimal set."""
    key = np.zeros(len(snap.jobs))
    order_all = np.arange(p.T)
    for r, i in enumerate(snap.jobs):
        n = min_feasible(p, int(i), p.n_type.copy(), fastest_types(p, int(i)))
        if n.sum() == 0:
            n = min_feasible(p, int(i), p.n_type.copy(), order_all)
        t = p.iter_time(int(i), n[None, :])[0] * snap.remaining[r]
        key[r] = p.weight[i] / t if t > 0 else INF
    return key


def admit(p: PlanningProblem, snap: Snapshot, priority: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Choose the rows (jobs) that run now when not all fit; their minimal counts.

    Jobs are taken in priority order while their minimal feasible set still
    fits in the free GPUs. Returns the admitted rows and a (rows, T) array of
    the minimal counts reserved for them.
    """
    free = snap.free.copy()
    rows: list[int] = []
    mins: list[np.ndarray] = []
    for r in np.argsort(-priority, kind="stable"):
        i = int(snap.jobs[r])
        n = min_feasible(p, i, free, fastest_types(p, i))
        if n.sum() == 0:
            continue
        rows.append(int(r))
        mins.append(n)
        free -= n
        if free.sum() == 0:
            break
    return rows, (np.array(mins) if mins else np.zeros((0, p.T), dtype=int))


def match_counts(values: np.ndarray, sizes: np.ndarray, free: np.ndarray) -> np.ndarray | None:
    """Exact throughput-maximising assignment for one category (HAS problem P3).

    ``values[j, t]`` is the worth of one GPU of type t to job j (``-inf`` if not
    allowed), ``sizes[j]`` how many GPUs job j gets, ``free[t]`` the GPUs of
    each type. P3 is an assignment problem (job slots x GPUs), solved exactly
    by the Hungarian method in polynomial time; the paper's auction reaches
    the same optimum. Returns counts (J, T) or None if infeasible.
    """
    J, T = values.shape
    slot_job = np.repeat(np.arange(J), sizes)
    col_type = np.repeat(np.arange(T), free)
    if len(slot_job) > len(col_type):
        return None
    w = values[slot_job][:, col_type]
    big = np.nanmax(np.abs(np.where(np.isfinite(w), w, 0.0))) * 10 + 1.0
    cost = np.where(np.isfinite(w), -w, big)
    r, c = linear_sum_assignment(cost)
    if not np.isfinite(w[r, c]).all():
        return None
    out = np.zeros((J, T), dtype=int)
    np.add.at(out, (slot_job[r], col_type[c]), 1)
    return out


def equal_iter_time(p: PlanningProblem, i: int, n: np.ndarray) -> float:
    """Iteration time with an equal split of the global batch (no load balancing).

    This is how the baselines' papers run data parallelism: every worker gets
    B/K samples, so the slowest GPU type sets the pace.
    """
    from hetsched.model import equal_shares, step_time

    K = int(n.sum())
    if K == 0 or K > p.B[i] or (n[~p.allowed[i]] > 0).any():
        return INF
    types = np.repeat(np.arange(p.T), n)
    caps = p.cap[i, types]
    if caps.sum() < p.B[i]:
        return INF
    b = equal_shares(list(caps), int(p.B[i]))
    comp = step_time(p.a[i, types], p.c[i, types], b)
    return comp + float(p.comm_estimate(i, n[None, :])[0])


def iter_time_fn(p: PlanningProblem, shares: str):  # type: ignore[no-untyped-def]
    """The policy-side iteration-time estimate matching a policy's share mode."""
    if shares == "equal":
        return lambda i, n: equal_iter_time(p, i, n)
    return lambda i, n: float(p.iter_time(i, n[None, :])[0])


def greedy_grow(p: PlanningProblem, snap: Snapshot, rows: list[int], X: np.ndarray,
                free: np.ndarray, it, type_pick) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Optimus' greedy: repeatedly add one GPU to the job with the largest JCT gain.

    ``X`` holds the admitted rows' starting counts (modified in place), ``it``
    is the iteration-time estimate, ``type_pick(i, free)`` the type a job
    would get next. Lazy re-evaluation keeps it O(K log S) gain updates.
    """
    import heapq

    def gain(r: int) -> tuple[float, int]:
        i = int(snap.jobs[r])
        if X[r].sum() >= p.hi[i]:
            return 0.0, -1
        t = type_pick(i, free)
        if t < 0:
            return 0.0, -1
        cur = it(i, X[r])
        nxt = X[r].copy()
        nxt[t] += 1
        g = p.weight[i] * snap.remaining[r] * (cur - it(i, nxt))
        return (g if np.isfinite(g) else 0.0), t

    heap = []
    for r in rows:
        g, t = gain(r)
        if g > 0:
            heap.append((-g, r, t))
    heapq.heapify(heap)
    while heap and free.sum() > 0:
        _, r, t = heapq.heappop(heap)
        g, t2 = gain(r)  # re-evaluate: free GPUs may have changed
        if g <= 0:
            continue
        if heap and g < -heap[0][0] - 1e-12:
            heapq.heappush(heap, (-g, r, t2))
            continue
        X[r, t2] += 1
        free[t2] -= 1
        g, t3 = gain(r)
        if g > 0:
            heapq.heappush(heap, (-g, r, t3))
    return X


def best_free_type(p: PlanningProblem, i: int, free: np.ndarray) -> int:
    """The free GPU type with the highest throughput for job i, or -1."""
    rate = np.where((free > 0) & p.allowed[i], p.per_gpu_rate(i), -1.0)
    t = int(np.argmax(rate))
    return t if rate[t] > 0 else -1
