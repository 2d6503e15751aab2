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
speed up most (:func:`.has_trim.refill`) with ``refill=True``.
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
from hetsched.planning.space.policies.has_trim import (
    TRIM_TABLE_MAX,
    TrimTables,
    refill,
    sub_table,
    trim_greedy,
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
#: best (category, matching) rows whose idle GPUs are handed out after the trim
REFILL_ROWS = 16
#: reference seconds per job row matched or scored by a CategorySolver (auto's work count;
#: with the trim tables kept across events, bench/bench_work_calibration.py: 1.3-4.6x CPU)
ROW_S = 6e-6
#: reference seconds per transportation LP (P3 above TRANSPORT_MIN_SLOTS job slots; warm
#: started from the snapshot's last solve)
LP_S = 5e-4


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
                 trim: bool = True, refill: bool = False,
                 tables: TrimTables | None = None) -> None:
        self.p, self.snap, self.rows, self.matching, self.trim = p, snap, rows, matching, trim
        self.refill = refill
        #: the policy run's trim tables (kept across its events; a throwaway set without)
        self.tables = tables if tables is not None else TrimTables()
        self._tables0 = self.tables.work_s()  # what the run's tables had counted before
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
        self._best_sub: dict[int, tuple[np.ndarray, np.ndarray, tuple[int, ...]]] = {}
        self._lp: dict[bool, TransportLP] = {}

    def work_s(self) -> float:
        """What this solver counted, in reference seconds (auto's budget): rows, LPs and
        the trim tables' lattice points it computed."""
        return (self.rows_done * ROW_S + self.lps_done * LP_S
                + self.tables.work_s() - self._tables0)

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
                A[r], gain = refill(self.p, self.snap, self.jobs, self.rows, self.hi, A[r])
                obj[r] += gain
        obj = obj.reshape(len(categories), M)
        best = obj.argmin(axis=1)
        A4 = A.reshape(len(categories), M, len(self.jobs), p.T)
        return A4[np.arange(len(categories)), best], obj[np.arange(len(categories)), best]

    def _trim(self, j: int, X: np.ndarray) -> np.ndarray:
        """Replace each row of X (job j's counts) by its best sub-allocation; return times.

        Constraint (8c) of the paper gives every GPU to some job, which pays
        when adding a worker always speeds a job up. With real intercepts and
        a ring all-reduce over a 10 Gbit/s network it often does not: a slow
        or remote worker can lengthen the iteration. The best ``y <= x`` for
        every count vector x is a prefix minimum over the lattice of count
        vectors, so one table per job (:func:`.has_trim.sub_table`) trims
        every category exactly. Above ``TRIM_TABLE_MAX`` lattice points a
        greedy one-GPU-at-a-time trim (:func:`.has_trim.trim_greedy`) is used instead.
        """
        dims = tuple(int(v) + 1 for v in self.snap.free)
        if int(np.prod(dims)) > TRIM_TABLE_MAX:
            return trim_greedy(self.p, self.jobs[j], int(self.lo[j]), X)
        if j not in self._best_sub:
            self._best_sub[j] = sub_table(self.p, self.jobs[j], dims, int(self.lo[j]),
                                          self.tables)
        val, idx, box = self._best_sub[j]
        at = tuple(X.T)
        X[:] = np.array(np.unravel_index(idx[at], box)).T
        return val[at]

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
        #: this run's trim tables, kept across its events
        self._tables = TrimTables()

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
        solver = CategorySolver(problem, snap, rows, self.matching, self.trim, self.refill,
                                self._tables)
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
            solver = CategorySolver(problem, snap, rows, self.matching, self.trim,
                                    self.refill, self._tables)
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
