"""HAS's trim and refill (docs/policies.md): after the matching, per job.

A category's matching gives every GPU to some job (the paper's (8c)); the
trim cuts each job's counts to its best sub-allocation (:func:`sub_table`
exactly, :func:`trim_greedy` above ``TRIM_TABLE_MAX`` lattice points), and
with ``refill=True`` the GPUs then held by no job go to the jobs they speed
up most (:func:`refill`). :class:`.has.CategorySolver` calls them; JPS
shares them through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Snapshot

TRIM_TABLE_MAX = 250_000  # lattice points per job for the exact trim table
#: (job, counts) iteration times kept across events for the greedy trim (then cleared)
ITER_CACHE_MAX = 2_000_000
#: bytes of the exact trim's tables kept across events, all job models together (8 a
#: lattice point for the iteration times while a box can grow, 12 for each table)
TABLE_CACHE_BYTES = 64 * 2**20
#: reference seconds per lattice point whose iteration time a trim table computes (auto's
#: counted work: 0.5-1.8 us of CPU on the 2-core bench machine, more with piecewise
#: curves; the prefix minimum's 0.01-0.03 us a point is in it)
POINT_S = 1.5e-6


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


def sub_table(p: PlanningProblem, i: int, dims: tuple[int, ...], lo: int,
              tables: TrimTables) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Job i's best sub-allocation of every count vector of the lattice ``dims``.

    Returns ``(V, idx, box)``, arrays of shape ``box`` (which covers ``dims``):
    for a count vector x inside ``dims``, ``V[x]`` is the least iteration time
    of any ``y <= x`` with at least ``lo`` GPUs and ``idx[x]`` that y's flat
    index in ``box``. A prefix minimum along each type's axis (:func:`_sweep`).

    The free GPUs change at every event, so each event's lattice differs; but
    the prefix minimum at x reads only the y <= x, so the table of a larger box,
    read inside ``dims``, is the table of ``dims`` (ties broken alike). So the
    tables are kept across events, one box per job model (``p.model_key``:
    jobs of one workload and batch share it) grown to cover every lattice asked
    for while it holds at most ``TRIM_TABLE_MAX`` points; on growth only the new
    points' iteration times are computed (``p.iter_time``'s, row by row). A box
    that covers the whole partition cannot grow, so its iteration times are
    dropped once its table is built. The boxes live in ``tables`` (one policy
    run's, so what a run computes never depends on what another run kept) while
    they fit ``TABLE_CACHE_BYTES``; past it a new or grown box is built and not
    kept (first come, first kept: evicting would rebuild tables in turn), as
    each event's table was before. ``tables.points`` counts the lattice points
    computed: auto's counted work (``POINT_S`` each), which with many job
    models (every job its own model size or batch) is most of a run.
    """
    store = tables.boxes
    key = p.model_key(i)
    ent = store.get(key)
    if ent is not None and all(d <= b for d, b in zip(dims, ent.box, strict=True)):
        if lo in ent.tables:
            V, idx = ent.tables[lo]
            return V, idx, ent.box
        cand = _Box(ent.box, ent.F if ent.F is not None
                    else _times(p, i, ent.box, None, tables), dict(ent.tables))
    else:
        box = dims if ent is None else tuple(max(d, b) for d, b in zip(dims, ent.box,
                                                                           strict=True))
        if int(np.prod(box)) > TRIM_TABLE_MAX:
            box = dims
        cand = _Box(box, _times(p, i, box, ent, tables), {})
    assert cand.F is not None
    f = cand.F.copy()
    f[np.indices(cand.box).sum(axis=0) < lo] = np.inf
    V, idx = _sweep(f)
    cand.tables[lo] = (V, idx.astype(np.int32))
    if cand.box == tuple(int(n) + 1 for n in p.n_type):
        cand.F = None  # it cannot grow: only another lo would need the times again
    others = _kept_bytes(store) - (store[key].nbytes() if key in store else 0)
    if others + cand.nbytes() <= TABLE_CACHE_BYTES:
        store[key] = cand
    return V, idx, cand.box


@dataclass
class _Box:
    """One job model's kept lattice: iteration times ``F`` over ``box`` (None once the
    box covers the partition), and per minimum GPU count its prefix-minimum table
    (values, flat index of the best y)."""

    box: tuple[int, ...]
    F: np.ndarray | None
    tables: dict[int, tuple[np.ndarray, np.ndarray]]

    def nbytes(self) -> int:
        n = 0 if self.F is None else self.F.nbytes
        return n + sum(V.nbytes + idx.nbytes for V, idx in self.tables.values())


@dataclass
class TrimTables:
    """One policy run's trim tables, kept across its events (:func:`sub_table`), and the
    lattice points whose iteration times it computed (its counted work)."""

    boxes: dict[tuple, _Box] = field(default_factory=dict)
    points: int = 0

    def work_s(self) -> float:
        """The points computed so far, in reference seconds (auto's counted work)."""
        return self.points * POINT_S


def _kept_bytes(store: dict[tuple, _Box]) -> int:
    return sum(e.nbytes() for e in store.values())


def _times(p: PlanningProblem, i: int, box: tuple[int, ...], old: _Box | None,
           tables: TrimTables) -> np.ndarray:
    """Job i's iteration times over the lattice ``box``, reusing ``old``'s where it has
    them; the points computed are added to ``tables.points``."""
    states = np.array(np.unravel_index(np.arange(int(np.prod(box))), box)).T
    F = np.empty(len(states))
    if old is None or old.F is None or any(b > c for b, c in zip(old.box, box, strict=True)):
        F[:] = p.iter_time(i, states)
        tables.points += len(states)
    else:
        known = (states < np.asarray(old.box)).all(axis=1)
        F[known] = old.F[tuple(states[known].T)]
        F[~known] = p.iter_time(i, states[~known])
        tables.points += int((~known).sum())
    return F.reshape(box)


def _sweep(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prefix minimum of ``f`` (box-shaped) over every ``y <= x``, and the flat index of the
    y that gives it (the first along each axis's sweep among equal values)."""
    V = f
    idx = np.arange(V.size, dtype=np.int64).reshape(V.shape)
    for ax in range(V.ndim):
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
    return np.ascontiguousarray(V), np.ascontiguousarray(idx)


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
