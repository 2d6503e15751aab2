"""HAS: the Heterogeneity-Aware Scheduler (Zhou et al., TPDS 2024, Algorithms 1-2).

Feasible-solution categories: every way ``(K_1..K_S)`` to split the GPUs
among the jobs (Algorithm 1's systematic enumeration, stars and bars). Per
category the paper solves P3 -- maximise total throughput with job i getting
exactly K_i workers -- by a matching-market auction. P3 is an assignment
problem, so we solve it exactly with the Hungarian method
(:func:`scipy.optimize.linear_sum_assignment`), the same optimum (Theorem 2)
in polynomial time. The category with the lowest predicted weighted JCT wins.

Two refinements over the paper, both measured in docs/benchmarks.md:

* worker throughput in P3 is the affine model's at the category's batch
  ``B/K_i`` rather than one constant per worker;
* ``matching="both"`` also solves P3 with each job's throughput normalised
  by its own best GPU (so a job with large raw samples/s does not take every
  fast GPU) and keeps whichever matching predicts the lower JCT.
  ``matching="raw"`` is the paper's P3 alone.

With ``trim`` (docs/policies.md) each matching is cut to its best
sub-allocation, and GPUs then held by no job are handed to the jobs they
speed up most (:meth:`CategorySolver._refill`) with ``refill=True``.
"""

from __future__ import annotations

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.errors import PlanningError
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import (
    TRANSPORT_MIN_SLOTS,
    TransportLP,
    admit,
    match_counts,
    smith_priority,
)
from hetsched.planning.space.policies.sampling import (
    bounded_compositions,
    compositions,
    count_bounded,
    count_compositions,
    latency_order,
    sample_categories,
    unrank_composition,
)

MATCHINGS = ("both", "raw", "normalized")
TRIM_TABLE_MAX = 250_000  # lattice points per job for the exact trim table
#: (job, counts) iteration times kept across events for the greedy trim (then cleared)
ITER_CACHE_MAX = 2_000_000
#: best (category, matching) rows whose idle GPUs are handed out after the trim
REFILL_ROWS = 16


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


#: reference seconds per job row matched or scored by a CategorySolver (auto's work count)
ROW_S = 2e-5
#: reference seconds per transportation LP (P3 above TRANSPORT_MIN_SLOTS job slots)
LP_S = 6e-3


def predicted_search_s(gpus: int, jobs: float, categories: int) -> float:
    """Predicted counted work of one event's CategorySolver: every category matched twice
    (raw and normalised) and scored, plus the 64 re-matched; matchings on more than
    TRANSPORT_MIN_SLOTS GPUs are transportation LPs."""
    matches = 2 * categories + 64
    rows = (2 * matches) * jobs
    return rows * ROW_S + (matches * LP_S if gpus > TRANSPORT_MIN_SLOTS else 0.0)


def _categories_at_most(gpus: int, jobs: int, cap: int) -> int:
    """Compositions of ``gpus`` into ``jobs`` positive parts, saturating just above ``cap``."""
    if jobs <= 0 or gpus < jobs:
        return 0
    c = 1
    for k in range(1, jobs):  # C(gpus - 1, jobs - 1), stopped once it passes cap
        c = c * (gpus - k) // k
        if c > cap:
            return cap + 1
    return c


class CategorySolver:
    """Evaluates categories (per-job GPU counts) for the admitted jobs of one snapshot."""

    def __init__(self, p: PlanningProblem, snap: Snapshot, rows: list[int], matching: str,
                 trim: bool = True, refill: bool = False) -> None:
        self.p, self.snap, self.rows, self.matching, self.trim = p, snap, rows, matching, trim
        self.refill = refill
        self.jobs = [int(snap.jobs[r]) for r in rows]
        #: job rows matched or scored so far, and transportation LPs solved (auto's counted
        #: work, planning/select.py)
        self.rows_done = 0
        self.lps_done = 0
        free = snap.free
        usable = np.array([int((free * p.allowed[i]).sum()) for i in self.jobs])
        self.lo = np.array([int(p.lo[i]) for i in self.jobs])
        self.hi = np.minimum(np.array([int(p.hi[i]) for i in self.jobs]), usable)
        self.total = int(min(free.sum(), self.hi.sum()))
        self._tab: dict[str, np.ndarray] = {}
        self._best_sub: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._lp: dict[bool, TransportLP] = {}

    def work_s(self) -> float:
        """What this solver counted, in reference seconds (auto's budget)."""
        return self.rows_done * ROW_S + self.lps_done * LP_S

    def feasible(self, sizes: tuple[int, ...]) -> bool:
        s = np.asarray(sizes)
        return bool((s >= self.lo).all() and (s <= self.hi).all())

    def repair(self, sizes: tuple[int, ...]) -> tuple[int, ...]:
        """Clamp a category into the per-job bounds keeping the total (JPS samples)."""
        s = np.clip(np.asarray(sizes), self.lo, self.hi)
        while s.sum() > self.total:
            j = int(np.argmax(s - self.lo))
            s[j] -= 1
        while s.sum() < self.total:
            room = self.hi - s
            if room.max() <= 0:
                break
            s[int(np.argmax(room))] += 1
        return tuple(int(v) for v in s)

    def _rates(self, normalized: bool) -> np.ndarray:
        """Per-GPU worth table (J, K+1, T): job j's samples/s on one GPU of type t when
        it has k workers (batch B/k), -inf where not allowed. Built once per snapshot."""
        key = "norm" if normalized else "raw"
        if key not in self._tab:
            p = self.p
            ks = np.arange(1, int(self.snap.free.sum()) + 1, dtype=float)
            tab = np.full((len(self.jobs), len(ks) + 1, p.T), -np.inf)
            for j, i in enumerate(self.jobs):
                b = np.clip(p.B[i] / ks[:, None], 1.0, p.cap[i][None, :])
                r = b / p.step_times(i, b)
                if normalized:
                    r = r / r.max(axis=1, keepdims=True)
                tab[j, 1:] = np.where(p.allowed[i][None, :], r, -np.inf)
            self._tab[key] = tab
        return self._tab[key]

    def _match(self, sizes: np.ndarray, normalized: bool) -> np.ndarray:
        """P3 for one category (see :func:`match_counts`), with the precomputed tables."""
        tab = self._rates(normalized)
        J = len(self.jobs)
        self.rows_done += J
        V = tab[np.arange(J), np.minimum(sizes, tab.shape[1] - 1)]
        if int(sizes.sum()) > TRANSPORT_MIN_SLOTS:  # large: one warm LP per snapshot
            if normalized not in self._lp:
                self._lp[normalized] = TransportLP(np.isfinite(tab[:, 1, :]), self.snap.free)
            X = self._lp[normalized].solve(V, sizes)
            self.lps_done += 1
        else:
            X = match_counts(V, sizes, self.snap.free)
        return X if X is not None else np.zeros((J, self.p.T), dtype=int)

    def _objective(self, A: np.ndarray) -> np.ndarray:
        """Predicted weighted remaining time of each allocation (trimming A in place)."""
        p = self.p
        obj = np.zeros(len(A))
        self.rows_done += len(A) * len(self.jobs)
        for j, i in enumerate(self.jobs):
            it = self._trim(j, A[:, j, :]) if self.trim else p.iter_time(i, A[:, j, :])
            obj += p.weight[i] * self.snap.remaining[self.rows[j]] * it
        obj[A.sum(axis=(1, 2)) == 0] = np.inf
        return obj

    def solve(self, categories: list[tuple[int, ...]], rematch: int = 64
              ) -> tuple[np.ndarray, np.ndarray]:
        """Match every category; return allocations (C, J, T) and objectives (C,).

        With trimming, the ``rematch`` best (category, matching) rows are matched
        once more with their trimmed sizes: GPUs a big job gave back can then go
        to the jobs that value them most, instead of staying idle.
        """
        p = self.p
        modes = {"both": (False, True), "raw": (False,), "normalized": (True,)}[self.matching]
        M = len(modes)
        A = np.array([self._match(np.asarray(sizes), norm)
                      for sizes in categories for norm in modes]).reshape(
                          len(categories) * M, len(self.jobs), p.T)
        obj = self._objective(A)
        if self.trim:
            top = np.argsort(obj)[:rematch]
            top = top[np.isfinite(obj[top])]
            if len(top):
                A2 = np.array([self._match(A[r].sum(axis=1), modes[r % M]) for r in top])
                obj2 = self._objective(A2)
                better = obj2 < obj[top]
                A[top[better]] = A2[better]
                obj[top[better]] = obj2[better]
            for r in top[:REFILL_ROWS] if self.refill else ():  # idle GPUs, to whom they help
                A[r], gain = self._refill(A[r])
                obj[r] += gain
        obj = obj.reshape(len(categories), M)
        best = obj.argmin(axis=1)
        A4 = A.reshape(len(categories), M, len(self.jobs), p.T)
        return A4[np.arange(len(categories)), best], obj[np.arange(len(categories)), best]

    def _refill(self, X: np.ndarray) -> tuple[np.ndarray, float]:
        """Hand GPUs that no job holds to the jobs they speed up most, one at a time.

        Categories split every GPU and the trim only takes GPUs away, so a
        GPU one job gave back stays idle even where another job would gain
        from it (the rematch keeps the trimmed sizes). Greedy: add the one
        (job, type) that lowers the weighted time most until none does.
        Returns the allocation (J, T) and the objective change (<= 0).
        """
        p, J, T = self.p, len(self.jobs), self.p.T
        X = X.copy()
        free = self.snap.free - X.sum(axis=0)
        w = np.array([p.weight[i] * self.snap.remaining[r] for i, r in zip(self.jobs, self.rows,
                                                                            strict=True)])
        cur = np.array([cached_iter_time(p, i, X[j][None])[0] for j, i in enumerate(self.jobs)])
        gain = np.full((J, T), np.inf)  # objective change of one more GPU of type t for job j

        def score(j: int) -> None:
            gain[j] = np.inf
            i, k = self.jobs[j], int(X[j].sum())
            ts = np.nonzero(p.allowed[i] & (free > 0))[0]
            if not np.isfinite(cur[j]) or k == 0 or k >= self.hi[j] or not len(ts):
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
            cur[b] = cached_iter_time(p, self.jobs[b], X[b][None])[0]
            score(b)

    def _trim(self, j: int, X: np.ndarray) -> np.ndarray:
        """Replace each row of X (job j's counts) by its best sub-allocation; return times.

        Constraint (8c) of the paper gives every GPU to some job, which pays
        when adding a worker always speeds a job up. With real intercepts and
        a ring all-reduce over a 10 Gbit/s network it often does not: a slow
        or remote worker can lengthen the iteration. The best ``y <= x`` for
        every count vector x is a prefix minimum over the lattice of count
        vectors, so one table per job (a cumulative minimum along each type's
        axis) trims every category exactly. Above ``TRIM_TABLE_MAX`` lattice
        points a greedy one-GPU-at-a-time trim is used instead.
        """
        p, i = self.p, self.jobs[j]
        dims = tuple(int(v) + 1 for v in self.snap.free)
        if int(np.prod(dims)) > TRIM_TABLE_MAX:
            return self._trim_greedy(j, X)
        if j not in self._best_sub:
            states = np.array(np.unravel_index(np.arange(int(np.prod(dims))), dims)).T
            f = p.iter_time(i, states)
            f[states.sum(axis=1) < self.lo[j]] = np.inf
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
            self._best_sub[j] = (V.reshape(-1), idx.reshape(-1), states)
        val, idx, states = self._best_sub[j]
        flat = np.ravel_multi_index(X.T, dims)
        X[:] = states[idx[flat]]
        return val[flat].copy()

    def _trim_greedy(self, j: int, X: np.ndarray) -> np.ndarray:
        """Local-search trim for huge lattices.

        Moves: drop one GPU of a type, drop every GPU of a type (leaving the
        slow type or crossing to one type can switch the all-reduce to a faster
        link), or cut a type down to one node's worth (intra-node bandwidth).
        The best improving move is applied until none improves.
        """
        p, i = self.p, self.jobs[j]
        T = p.T
        cur = cached_iter_time(p, i, X)
        live = np.nonzero(np.isfinite(cur) & (X.sum(axis=1) > self.lo[j]))[0]
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
            ok = ((cand >= 0).all(axis=2) & (cand.sum(axis=2) >= self.lo[j])
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
            live = rows[X[rows].sum(axis=1) > self.lo[j]]
        return cur

    def expand(self, X: np.ndarray) -> np.ndarray:
        out = np.zeros((len(self.snap.jobs), self.p.T), dtype=int)
        out[self.rows] = X
        return out


@register
class HAS(Policy):
    name = "has"
    paper = "Zhou et al., TPDS 2024 (HAS/JPS), Algorithms 1 and 2"
    summary = ("All feasible-solution categories, exact throughput-maximising matching per "
               "category, best category by predicted weighted JCT (sampled at events with "
               "more than exact_max categories)")
    param_docs = {
        "matching": "P3 objective: 'raw' samples/s (paper), 'normalized' per job, or 'both'",
        "exact_max": "enumerate every feasible category up to this many at an event; "
                     "above, sample them as jps does",
        "samples": "categories sampled at an event above exact_max",
        "max_categories": "refuse above this many categories (0: never refuse, sample)",
        "trim": "drop workers that slow their job down (False: every GPU used, paper's (8c))",
        "refill": "after the trim, hand idle GPUs to the jobs they speed up most "
                  "(exact at K=30 in scenario A; worse online: docs/policies.md)",
    }

    def __init__(self, *, matching: str = "both", exact_max: int = 20000, samples: int = 64,
                 max_categories: int = 0, trim: bool = True, refill: bool = False) -> None:
        if matching not in MATCHINGS:
            raise ValueError(f"matching must be one of {', '.join(MATCHINGS)}, got {matching!r}")
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        self.matching = matching
        self.exact_max = int(exact_max)
        self.samples = int(samples)
        self.max_categories = int(max_categories)
        self.trim = bool(trim)
        self.refill = bool(refill)

    @classmethod
    def predict_work(cls, problem: PlanningProblem, active: list[int],
                     horizon_s: float = 0.0) -> float:
        """Per event: every feasible category (at most ``exact_max``, else ``samples``)
        matched twice and scored, plus the re-matching, each over the active jobs."""
        out = 0.0
        for n in active:
            cats = _categories_at_most(int(problem.K), int(n), 20000)
            cats = cats if cats <= 20000 else 64
            out += cls.EVENT_S + cls.JOB_S * n + predicted_search_s(int(problem.K), n, cats)
        return out

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        rows, mins = admit(problem, snap, smith_priority(problem, snap))
        if not rows:
            return np.zeros((len(snap.jobs), problem.T), dtype=int)
        admitted = list(rows)
        solver = CategorySolver(problem, snap, rows, self.matching, self.trim, self.refill)
        n = count_compositions(solver.total, len(rows))
        if self.max_categories and n > self.max_categories:
            raise PlanningError(
                f"has: {n:,} feasible-solution categories for {len(rows)} jobs on "
                f"{solver.total} GPUs exceeds max_categories={self.max_categories:,}; "
                "use --policy jps (sampling) or raise --param max_categories=N")
        lo, hi = solver.lo.tolist(), solver.hi.tolist()
        if count_bounded(solver.total, lo, hi, limit=self.exact_max) <= self.exact_max:
            cats = list(bounded_compositions(solver.total, lo, hi))
        else:  # too many to enumerate at this event: sample as JPS does
            rows = latency_order(problem, snap, rows)
            solver = CategorySolver(problem, snap, rows, self.matching, self.trim, self.refill)
            cats = list(dict.fromkeys(solver.repair(c) for c in sample_categories(
                solver.total, len(rows), 0.0, self.samples, 0)))
        if not cats:
            cats = [solver.repair(tuple(int(v) for v in solver.lo))]
        A, obj = solver.solve(cats)
        self.work_s += solver.work_s()
        best = int(np.argmin(obj))
        if np.isfinite(obj[best]):
            return solver.expand(A[best])
        out = np.zeros((len(snap.jobs), problem.T), dtype=int)
        out[admitted] = mins  # no category can hold the batches: minimal sets
        return out


#: Algorithm 1's enumeration and unranking live in .sampling; re-exported here
__all__ = ["HAS", "CategorySolver", "MATCHINGS", "compositions", "count_compositions",
           "unrank_composition"]
