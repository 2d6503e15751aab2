"""HAS's trim and refill (docs/policies.md): after the matching, per job.

A category's matching gives every GPU to some job (the paper's (8c)); the
trim cuts each job's counts to its best sub-allocation (:func:`best_sub_table`
exactly, :func:`trim_greedy` above ``TRIM_TABLE_MAX`` lattice points), and
with ``refill=True`` the GPUs then held by no job go to the jobs they speed
up most (:func:`refill`). :class:`.has.CategorySolver` calls them; JPS
shares them through it.
"""

from __future__ import annotations

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Snapshot

TRIM_TABLE_MAX = 250_000  # lattice points per job for the exact trim table
#: (job, counts) iteration times kept across events for the greedy trim (then cleared)
ITER_CACHE_MAX = 2_000_000
#: lattice points of iteration times kept across events for the exact trim (all jobs)
LATTICE_CACHE_POINTS = 4_000_000


def cached_iter_time(p: PlanningProblem, i: int, X: np.ndarray) -> np.ndarray:
    """:meth:`PlanningProblem.iter_time` of count rows ``X``, memoised per (job, counts).

    The greedy trim evaluates the same few thousand count vectors of a job at
    category after category and event after event; a numpy call per batch of
    moves was most of HAS's and JPS's time on 100 jobs x 360 GPUs. The values
    are exactly ``p.iter_time``'s (each row is computed independently).
    """
    cache: dict[tuple[int, ...], float] = p.estimates.extra.setdefault("has_iter_time", {})
    if len(cache) > ITER_CACHE_MAX:
        cache.clear()
    keys = [(i, *row) for row in X.tolist()]
    out = np.empty(len(keys))
    miss = []
    for k, key in enumerate(keys):
        v = cache.get(key)
        if v is None:
            miss.append(k)
        else:
            out[k] = v
    if miss:
        vals = p.iter_time(i, X[miss]).tolist()
        for k, v in zip(miss, vals, strict=True):
            cache[keys[k]] = v
            out[k] = v
    return out


def model_key(p: PlanningProblem, i: int) -> tuple:
    """What :meth:`PlanningProblem.iter_time` of job i depends on: jobs with equal keys
    (one workload at one global batch) have equal iteration times at every count vector."""
    keys: dict[int, tuple] = p.estimates.extra.setdefault("model_key", {})
    if i not in keys:
        curves = p.curves[i]
        keys[i] = (p.a[i].tobytes(), p.c[i].tobytes(), p.cap[i].tobytes(),
                   p.allowed[i].tobytes(), int(p.B[i]), float(p.model_mb[i]),
                   p.sync[i].tobytes(), tuple(sorted(p.calibrated[i].items())),
                   None if curves is None else tuple(
                       None if cv is None else (cv[0].tobytes(), cv[1].tobytes())
                       for cv in curves))
    return keys[i]


def lattice_times(p: PlanningProblem, i: int, dims: tuple[int, ...], states: np.ndarray
                  ) -> np.ndarray:
    """:meth:`PlanningProblem.iter_time` of job i at every count vector of the lattice
    ``dims`` (``states``, in C order), read from a box of them kept across events.

    The free GPUs change at every event, so each event's lattice differs, but
    they overlap, and jobs of one workload and batch share one box
    (:func:`model_key`): a box grows to cover every lattice asked for (while it
    holds at most ``TRIM_TABLE_MAX`` points) and only the new points are
    computed. Each value is ``p.iter_time``'s for that row (rows are computed
    independently), so the table, and the plan, are what they were without it.
    The boxes are kept in ``p.estimates.extra`` up to ``LATTICE_CACHE_POINTS``
    points in all, least recently used dropped first.
    """
    store: dict[tuple, tuple[tuple[int, ...], np.ndarray]] = \
        p.estimates.extra.setdefault("trim_lattice", {})
    key = model_key(p, i)
    old = store.pop(key, None)
    if old is not None and all(d <= b for d, b in zip(dims, old[0], strict=True)):
        store[key] = old  # most recently used last
        return old[1][tuple(slice(0, d) for d in dims)].reshape(-1)
    box = dims if old is None else tuple(max(d, b) for d, b in zip(dims, old[0], strict=True))
    if int(np.prod(box)) > TRIM_TABLE_MAX:
        box, old = dims, None
    if box == dims:
        all_states = states
    else:
        all_states = np.array(np.unravel_index(np.arange(int(np.prod(box))), box)).T
    F = np.empty(len(all_states))
    if old is None:
        F[:] = p.iter_time(i, all_states)
    else:
        known = (all_states < np.asarray(old[0])).all(axis=1)
        F[known] = old[1][tuple(all_states[known].T)]
        F[~known] = p.iter_time(i, all_states[~known])
    Fb = F.reshape(box)
    store[key] = (box, Fb)
    total = sum(v.size for _, v in store.values())
    for k in list(store):
        if total <= LATTICE_CACHE_POINTS or k == key:
            break
        total -= store.pop(k)[1].size
    return Fb[tuple(slice(0, d) for d in dims)].reshape(-1)


def best_sub_table(p: PlanningProblem, i: int, dims: tuple[int, ...], lo: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Job i's best sub-allocation of every count vector of the lattice ``dims``.

    A prefix minimum of the iteration time along each type's axis (counts
    below ``lo`` GPUs excluded). Returns the flat best times, the flat index
    of the best ``y <= x`` for every ``x``, and the lattice's count vectors.
    """
    states = np.array(np.unravel_index(np.arange(int(np.prod(dims))), dims)).T
    f = lattice_times(p, i, dims, states)
    f[states.sum(axis=1) < lo] = np.inf
    V = f.reshape(dims)
    idx = np.arange(V.size).reshape(dims)
    for ax in range(len(dims)):
        V = np.moveaxis(V, ax, 0).copy()
        idx = np.moveaxis(idx, ax, 0).copy()
        for k in range(1, V.shape[0]):
            # V[k, ...] (not V[k]) stays a writable view when there is
            # one GPU type: V is then 1-D and V[k] would be a scalar copy.
            worse = V[k, ...] > V[k - 1, ...]
            np.copyto(V[k, ...], V[k - 1, ...], where=worse)
            np.copyto(idx[k, ...], idx[k - 1, ...], where=worse)
        V = np.moveaxis(V, 0, ax)
        idx = np.moveaxis(idx, 0, ax)
    return V.reshape(-1), idx.reshape(-1), states


def trim_greedy(p: PlanningProblem, i: int, lo: int, X: np.ndarray) -> np.ndarray:
    """Local-search trim of job i's count rows ``X`` (in place) for huge lattices; the times.

    Moves: drop one GPU of a type, drop every GPU of a type (leaving the
    slow type or crossing to one type can switch the all-reduce to a faster
    link), or cut a type down to one node's worth (intra-node bandwidth).
    The best improving move is applied until none improves; no row goes
    below ``lo`` GPUs.
    """
    T = p.T
    cur = cached_iter_time(p, i, X)
    live = np.nonzero(np.isfinite(cur) & (X.sum(axis=1) > lo))[0]
    while len(live):
        Xl = X[live]
        moves = []
        for t in range(T):
            one = Xl.copy()
            one[:, t] -= 1
            none = Xl.copy()
            none[:, t] = 0
            node = Xl.copy()
            node[:, t] = np.minimum(node[:, t], p.node_max[t])
            moves += [one, none, node]
        cand = np.stack(moves, axis=1)  # (L, 3T, T)
        ok = ((cand >= 0).all(axis=2) & (cand.sum(axis=2) >= lo)
              & (cand.sum(axis=2) < Xl.sum(axis=1)[:, None]))
        it = np.full(ok.shape, np.inf)
        if ok.any():
            it[ok] = cached_iter_time(p, i, cand[ok])
        best = it.argmin(axis=1)
        val = it[np.arange(len(live)), best]
        better = val < cur[live] * (1 - 1e-12)
        rows = live[better]
        X[rows] = cand[np.nonzero(better)[0], best[better]]
        cur[rows] = val[better]
        live = rows[X[rows].sum(axis=1) > lo]
    return cur


def refill(p: PlanningProblem, snap: Snapshot, jobs: list[int], rows: list[int],
           hi: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, float]:
    """Hand GPUs that no job holds to the jobs they speed up most, one at a time.

    ``X`` (J, T): the counts of ``jobs`` (snapshot rows ``rows``, at most ``hi``
    GPUs each). Categories split every GPU and the trim only takes GPUs away,
    so a GPU one job gave back stays idle even where another job would gain
    from it (the rematch keeps the trimmed sizes). Greedy: add the one
    (job, type) that lowers the weighted time most until none does.
    Returns the allocation (J, T) and the objective change (<= 0).
    """
    J, T = len(jobs), p.T
    X = X.copy()
    free = snap.free - X.sum(axis=0)
    w = np.array([p.weight[i] * snap.remaining[r] for i, r in zip(jobs, rows, strict=True)])
    cur = np.array([cached_iter_time(p, i, X[j][None])[0] for j, i in enumerate(jobs)])
    gain = np.full((J, T), np.inf)  # objective change of one more GPU of type t for job j

    def score(j: int) -> None:
        gain[j] = np.inf
        i, k = jobs[j], int(X[j].sum())
        ts = np.nonzero(p.allowed[i] & (free > 0))[0]
        if not np.isfinite(cur[j]) or k == 0 or k >= hi[j] or not len(ts):
            return
        C = np.repeat(X[j][None], len(ts), axis=0)
        C[np.arange(len(ts)), ts] += 1
        new = cached_iter_time(p, i, C)
        ok = new < cur[j] * (1 - 1e-12)
        gain[j, ts[ok]] = w[j] * (new[ok] - cur[j])

    for j in range(J):
        score(j)
    total = 0.0
    while True:
        gain[:, free <= 0] = np.inf
        jt = np.unravel_index(int(np.argmin(gain)), gain.shape)
        b, t = int(jt[0]), int(jt[1])
        if not gain[b, t] < 0:
            return X, total
        total += float(gain[b, t])
        X[b, t] += 1
        free[t] -= 1
        cur[b] = cached_iter_time(p, jobs[b], X[b][None])[0]
        score(b)
