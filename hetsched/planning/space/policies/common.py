"""Pieces several policies share: admission, initial sizes, exact matching, objectives."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Snapshot

INF = float("inf")


def min_feasible(p: PlanningProblem, i: int, free: np.ndarray,
                 order: Sequence[int] | np.ndarray,
                 at_least: int | None = None) -> np.ndarray:
    """Fewest GPUs (taking types in ``order``) that meet min_gpus and hold the global batch.

    ``at_least`` raises the GPU count to reach (default: the job's min_gpus).
    Returns zeros if the free GPUs cannot do it.
    """
    n = [0] * p.T
    _, _, cap, allowed = p.estimates.rows[i]
    lo, hi, B = int(p.lo[i]), int(p.hi[i]), p.estimates.batch[i]
    if at_least is not None:
        lo = max(lo, int(at_least))
    held = 0.0
    k = 0
    for t in order:
        if not allowed[t]:
            continue
        room = int(free[t])
        while room > 0 and (k < lo or held < B) and k < hi:
            n[t] += 1
            room -= 1
            held += cap[t]
            k += 1
        if k >= lo and held >= B:
            return np.array(n, dtype=int)
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
    cache = p.estimates.by_memory
    if i not in cache:
        cache[i] = [int(t) for t in np.argsort(-p.cap[i], kind="stable")]
    return cache[i]


def fastest_types(p: PlanningProblem, i: int) -> list[int]:
    """GPU types from fastest to slowest for job i (peak per-GPU throughput), cached."""
    cache = p.estimates.fastest
    if i not in cache:
        cache[i] = [int(t) for t in np.argsort(-p.per_gpu_rate(i), kind="stable")]
    return cache[i]


def smith_priority(p: PlanningProblem, snap: Snapshot) -> np.ndarray:
    """Smith's rule key (higher first): weight over remaining time on the job's minimal set."""
    cache = p.estimates.minimal_time
    base = np.empty(len(snap.jobs))
    for r, i in enumerate(snap.jobs):
        i = int(i)
        if i not in cache:
            n = min_feasible(p, i, p.n_type, fastest_types(p, i))
            if n.sum() == 0:
                n = min_feasible(p, i, p.n_type, list(range(p.T)))
            cache[i] = p.iter_time1(i, tuple(int(v) for v in n)) if n.sum() else INF
        base[r] = cache[i]
    with np.errstate(divide="ignore"):
        return p.weight[snap.jobs] / (base * snap.remaining)


def admit(p: PlanningProblem, snap: Snapshot, priority: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Choose the rows (jobs) that run now when not all fit; their minimal counts.

    Jobs are taken in priority order while their minimal feasible set still
    fits in the free GPUs. Returns the admitted rows and a (rows, T) array of
    the minimal counts reserved for them.
    """
    free = snap.free.copy()
    rows: list[int] = []
    mins: list[np.ndarray] = []
    # A job's minimal set on the whole cluster is also its minimal set whenever
    # it fits in the free GPUs (min_feasible takes the same types in the same
    # order then), which is the common case: compute it once per job.
    whole = p.estimates.minimal_set
    for r in np.argsort(-priority, kind="stable"):
        i = int(snap.jobs[r])
        if i not in whole:
            whole[i] = min_feasible(p, i, p.n_type, fastest_types(p, i))
        n = whole[i]
        if not (n.sum() and (n <= free).all()):
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
    if int(np.sum(sizes)) > int(np.sum(free)):
        return None
    if int(np.sum(sizes)) > TRANSPORT_MIN_SLOTS:
        return transport_counts(values, sizes, free)
    slot_job = np.repeat(np.arange(J), sizes)
    col_type = np.repeat(np.arange(T), free)
    w = values[slot_job][:, col_type]
    big = np.nanmax(np.abs(np.where(np.isfinite(w), w, 0.0))) * 10 + 1.0
    cost = np.where(np.isfinite(w), -w, big)
    r, c = linear_sum_assignment(cost)
    if not np.isfinite(w[r, c]).all():
        return None
    out = np.zeros((J, T), dtype=int)
    np.add.at(out, (slot_job[r], col_type[c]), 1)
    return out


#: job slots above which P3 is solved as a transportation problem (jobs x GPU types)
#: instead of an assignment problem (slots x GPUs): the same optimum, found by an LP
#: of J*T variables rather than a Hungarian method on a matrix of K^2 entries
TRANSPORT_MIN_SLOTS = 128


def transport_counts(values: np.ndarray, sizes: np.ndarray, free: np.ndarray
                     ) -> np.ndarray | None:
    """P3 as a transportation LP: job j takes ``sizes[j]`` GPUs, type t gives ``free[t]``.

    GPUs of one type are interchangeable, so the assignment problem of
    :func:`match_counts` is this transportation problem; its constraint
    matrix is totally unimodular, so HiGHS' simplex returns integral counts.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    J, T = values.shape
    jj, tt = np.nonzero(np.isfinite(values))
    n = len(jj)
    if n == 0:
        return None
    cols = np.arange(n)
    a_eq = coo_matrix((np.ones(n), (jj, cols)), shape=(J, n))
    a_ub = coo_matrix((np.ones(n), (tt, cols)), shape=(T, n))
    res = linprog(-values[jj, tt], A_ub=a_ub, b_ub=np.asarray(free, dtype=float), A_eq=a_eq,
                  b_eq=np.asarray(sizes, dtype=float), bounds=(0, None), method="highs-ds")
    if res.status != 0:
        return None
    out = np.zeros((J, T), dtype=int)
    out[jj, tt] = np.rint(res.x).astype(int)
    if (out.sum(axis=1) != sizes).any() or (out.sum(axis=0) > free).any():
        return None  # not integral (never for a vertex of this polytope)
    return out


class TransportLP:
    """P3 as a transportation LP kept warm across categories (one per snapshot and matching).

    The LP's structure (which job may take which GPU type, the free GPUs) is
    fixed at an event; a category changes only each job's GPU count and the
    per-GPU worths. One HiGHS model is built per snapshot and re-solved from
    the previous basis with new costs and row bounds: a dual simplex warm
    start instead of a new LP (scipy's ``linprog`` spent most of each solve on
    setting it up; it was most of JPS's and HAS's time on 100 jobs x 360 GPUs).
    Returns the same optimum value as :func:`transport_counts` (ties may pick
    another optimal vertex).
    """

    def __init__(self, allowed: np.ndarray, free: np.ndarray) -> None:
        import highspy

        from hetsched.planning.solver import quiet_highs

        J, T = allowed.shape
        self.J, self.T = J, T
        self.jj, self.tt = np.nonzero(allowed)
        n = len(self.jj)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, J + T
        lp.col_cost_ = np.zeros(n)
        lp.col_lower_ = np.zeros(n)
        lp.col_upper_ = np.full(n, highspy.kHighsInf)
        lp.row_lower_ = np.concatenate([np.zeros(J), np.zeros(T)])
        lp.row_upper_ = np.concatenate([np.zeros(J), np.asarray(free, dtype=float)])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.arange(0, 2 * n + 1, 2, dtype=np.int32)
        lp.a_matrix_.index_ = np.column_stack([self.jj, J + self.tt]).reshape(-1).astype(np.int32)
        lp.a_matrix_.value_ = np.ones(2 * n)
        self.h = quiet_highs(lp)
        self.cols = np.arange(n, dtype=np.int32)
        self.rows = np.arange(J, dtype=np.int32)
        self.free = np.asarray(free, dtype=int)
        self.ok = highspy.HighsModelStatus.kOptimal

    def solve(self, values: np.ndarray, sizes: np.ndarray) -> np.ndarray | None:
        sizes = np.asarray(sizes, dtype=int)
        if int(sizes.sum()) > int(self.free.sum()) or len(self.jj) == 0:
            return None
        v = values[self.jj, self.tt]
        if not np.isfinite(v[sizes[self.jj] > 0]).all():
            return None  # a job with GPUs would get a forbidden (size-0 row) type
        cost = -np.where(np.isfinite(v), v, 0.0)
        b = sizes.astype(float)
        h = self.h
        h.changeColsCost(len(self.cols), self.cols, cost)
        h.changeRowsBounds(self.J, self.rows, b, b)
        h.run()
        if h.getModelStatus() != self.ok:
            return None
        x = np.asarray(h.getSolution().col_value)
        out = np.zeros((self.J, self.T), dtype=int)
        out[self.jj, self.tt] = np.rint(x).astype(int)
        if (out.sum(axis=1) != sizes).any() or (out.sum(axis=0) > self.free).any():
            return None  # not integral (never for a vertex of this polytope)
        return out


def equal_iter_time(p: PlanningProblem, i: int, n: np.ndarray) -> float:
    """Iteration time with an equal split of the global batch (no load balancing).

    This is how the baselines' papers run data parallelism: every worker gets
    B/K samples, so the slowest GPU type sets the pace. Memoised per problem
    (``p.estimates.equal_iter_time``): the fixed-size baselines ask for the same
    few counts of each job at every event.
    """
    return _equal_memo(p, i, tuple(int(x) for x in n))


def _equal_memo(p: PlanningProblem, i: int, n: tuple[int, ...]) -> float:
    """:func:`equal_iter_time` of counts ``n`` given as a tuple: the memo's key."""
    cache = p.estimates.equal_iter_time
    key = (i, n)
    v = cache.get(key)
    if v is None:
        v = cache[key] = _equal_iter_time(p, i, np.array(n, dtype=int))
    return v


def _equal_iter_time(p: PlanningProblem, i: int, n: np.ndarray) -> float:
    """:func:`equal_iter_time`, computed."""
    from hetsched.core.model import equal_shares, step_time

    K = int(n.sum())
    if K == 0 or K > p.B[i] or (n[~p.allowed[i]] > 0).any():
        return INF
    types = np.repeat(np.arange(p.T), n)
    caps = p.cap[i, types]
    if caps.sum() < p.B[i]:
        return INF
    b = equal_shares(list(caps), int(p.B[i]))
    pc = p.curves[i]
    cv = None if pc is None else [pc[t] for t in types]
    comp = step_time(p.a[i, types], p.c[i, types], b, cv)
    return comp + float(p.comm_estimate(i, n[None, :])[0])


IterTime = Callable[[int, tuple[int, ...]], float]


def iter_time_fn(p: PlanningProblem, shares: str) -> IterTime:
    """The policy-side iteration-time estimate matching a policy's share mode (scalar, cached)."""
    if shares == "equal":
        return functools.partial(_equal_memo, p)
    return p.iter_time1


def greedy_grow(p: PlanningProblem, snap: Snapshot, rows: list[int], X: np.ndarray,
                free: np.ndarray, it: IterTime, order_of: Callable[[int], list[int]],
                memo_key: str) -> np.ndarray:
    """Optimus' greedy: repeatedly add one GPU to the job with the largest JCT gain.

    ``X`` holds the admitted rows' starting counts (modified in place), ``it(i,
    counts_tuple)`` is the iteration-time estimate, ``order_of(i)`` the GPU
    types job i takes, most preferred first (the next GPU is the first of
    them with a free GPU). Lazy re-evaluation keeps it O(K log S) gain
    updates. The step-time change of adding one GPU of a type to given counts
    does not depend on time, so it is memoised in ``p.estimates.gain`` under
    ``memo_key`` across events; plain lists and tuples because this loop runs
    at every event.
    """
    import heapq

    memo = p.estimates.gain.setdefault(memo_key, {})
    jobs = [int(i) for i in snap.jobs]
    wrem = (p.weight[snap.jobs] * snap.remaining).tolist()
    hi = p.hi.tolist()
    allowed = [row[3] for row in p.estimates.rows]
    cnt = {r: [int(v) for v in X[r]] for r in rows}
    size = {r: sum(cnt[r]) for r in rows}
    # each row's types in preference order, the allowed ones only (looked up once)
    order = {r: [t for t in order_of(jobs[r]) if allowed[jobs[r]][t]] for r in rows}
    fl = [int(v) for v in free]

    def gain(r: int) -> tuple[float, int]:
        i = jobs[r]
        x = cnt[r]
        if size[r] >= hi[i]:
            return 0.0, -1
        for t in order[r]:
            if fl[t] > 0:
                break
        else:
            return 0.0, -1
        key = (i, tuple(x), t)
        d = memo.get(key)
        if d is None:
            cur = it(i, key[1])
            x[t] += 1
            nxt = it(i, tuple(x))
            x[t] -= 1
            d = cur - nxt
            if d != d or d == INF or d == -INF:  # nan or inf: adding cannot be judged
                d = 0.0
            memo[key] = d
        return wrem[r] * d, t

    heap = []
    for r in rows:
        g, t = gain(r)
        if g > 0:
            heap.append((-g, r, t))
    heapq.heapify(heap)
    left = sum(fl)
    while heap and left > 0:
        _, r, t = heapq.heappop(heap)
        g, t2 = gain(r)  # re-evaluate: free GPUs may have changed
        if g <= 0:
            continue
        if heap and g < -heap[0][0] - 1e-12:
            heapq.heappush(heap, (-g, r, t2))
            continue
        cnt[r][t2] += 1
        size[r] += 1
        fl[t2] -= 1
        left -= 1
        g, t3 = gain(r)
        if g > 0:
            heapq.heappush(heap, (-g, r, t3))
    for r in rows:
        X[r] = cnt[r]
    free[:] = fl
    return X
