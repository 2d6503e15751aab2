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
"""

from __future__ import annotations

from collections.abc import Iterator
from math import comb

import numpy as np

from hetsched.errors import PlanningError
from hetsched.policies.base import Policy, Snapshot, register
from hetsched.policies.common import admit, match_counts, smith_priority
from hetsched.problem import PlanningProblem

MATCHINGS = ("both", "raw", "normalized")


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """All compositions of ``total`` into ``parts`` positive parts, in Algorithm 1's order.

    The order varies K_2 fastest, then K_3, ..., with K_1 taking the rest:
    for K=5, S=3 it yields (3,1,1), (2,2,1), (1,3,1), (2,1,2), (1,2,2), (1,1,3).
    """
    if parts == 1:
        yield (total,)
        return
    for last in range(1, total - parts + 2):
        for head in compositions(total - last, parts - 1):
            yield (*head, last)


def count_compositions(total: int, parts: int) -> int:
    return comb(total - 1, parts - 1) if total >= parts >= 1 else 0


def unrank_composition(rank: int, total: int, parts: int) -> tuple[int, ...]:
    """The composition at position ``rank`` of :func:`compositions` without enumerating."""
    out = [0] * parts
    n = total
    for i in range(parts - 1, 0, -1):
        v = 1
        while True:
            cnt = comb(n - v - 1, i - 1)
            if rank < cnt:
                break
            rank -= cnt
            v += 1
        out[i] = v
        n -= v
    out[0] = n
    return tuple(out)


class CategorySolver:
    """Evaluates categories (per-job GPU counts) for the admitted jobs of one snapshot."""

    def __init__(self, p: PlanningProblem, snap: Snapshot, rows: list[int], matching: str) -> None:
        self.p, self.snap, self.rows, self.matching = p, snap, rows, matching
        self.jobs = [int(snap.jobs[r]) for r in rows]
        free = snap.free
        usable = np.array([int((free * p.allowed[i]).sum()) for i in self.jobs])
        self.lo = np.array([int(p.lo[i]) for i in self.jobs])
        self.hi = np.minimum(np.array([int(p.hi[i]) for i in self.jobs]), usable)
        self.total = int(min(free.sum(), self.hi.sum()))

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

    def values(self, sizes: tuple[int, ...], normalized: bool) -> np.ndarray:
        p = self.p
        v = np.empty((len(self.jobs), p.T))
        for j, i in enumerate(self.jobs):
            rate = p.per_gpu_rate(i, p.B[i] / sizes[j])
            if normalized:
                rate = rate / rate.max()
            v[j] = np.where(p.allowed[i], rate, -np.inf)
        return v

    def solve(self, categories: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """Match every category; return allocations (C, J, T) and objectives (C,)."""
        p = self.p
        modes = {"both": (False, True), "raw": (False,), "normalized": (True,)}[self.matching]
        allocs: list[np.ndarray] = []
        for sizes in categories:
            for norm in modes:
                X = match_counts(self.values(sizes, norm), np.asarray(sizes), self.snap.free)
                allocs.append(X if X is not None else np.zeros((len(self.jobs), p.T), dtype=int))
        A = np.array(allocs).reshape(len(categories) * len(modes), len(self.jobs), p.T)
        obj = np.zeros(len(A))
        for j, i in enumerate(self.jobs):
            it = p.iter_time(i, A[:, j, :])
            obj += p.weight[i] * self.snap.remaining[self.rows[j]] * it
        obj[A.sum(axis=(1, 2)) == 0] = np.inf
        # keep the better matching of each category
        obj = obj.reshape(len(categories), len(modes))
        best = obj.argmin(axis=1)
        A = A.reshape(len(categories), len(modes), len(self.jobs), p.T)
        return A[np.arange(len(categories)), best], obj[np.arange(len(categories)), best]

    def expand(self, X: np.ndarray) -> np.ndarray:
        out = np.zeros((len(self.snap.jobs), self.p.T), dtype=int)
        out[self.rows] = X
        return out


@register
class HAS(Policy):
    name = "has"
    paper = "Zhou et al., TPDS 2024 (HAS/JPS), Algorithms 1 and 2"
    summary = ("All feasible-solution categories, exact throughput-maximising matching per "
               "category, best category by predicted weighted JCT")
    param_docs = {
        "matching": "P3 objective: 'raw' samples/s (paper), 'normalized' per job, or 'both'",
        "max_categories": "refuse above this many categories (use jps)",
    }

    def __init__(self, *, matching: str = "both", max_categories: int = 20000) -> None:
        if matching not in MATCHINGS:
            raise ValueError(f"matching must be one of {', '.join(MATCHINGS)}, got {matching!r}")
        self.matching = matching
        self.max_categories = int(max_categories)

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        rows, mins = admit(problem, snap, smith_priority(problem, snap))
        if not rows:
            return np.zeros((len(snap.jobs), problem.T), dtype=int)
        solver = CategorySolver(problem, snap, rows, self.matching)
        n = count_compositions(solver.total, len(rows))
        if n > self.max_categories:
            raise PlanningError(
                f"has: {n:,} feasible-solution categories for {len(rows)} jobs on "
                f"{solver.total} GPUs exceeds max_categories={self.max_categories:,}; "
                "use --policy jps (sampling) or raise --param max_categories=N")
        cats = [c for c in compositions(solver.total, len(rows)) if solver.feasible(c)]
        if not cats:
            cats = [solver.repair(tuple(int(v) for v in solver.lo))]
        A, obj = solver.solve(cats)
        best = int(np.argmin(obj))
        return solver.expand(A[best] if np.isfinite(obj[best]) else mins)
