"""JPS: Job Prioritizing for Sampling (Zhou et al., TPDS 2024, Algorithm 3, eqs. 33-34).

Jobs are sorted by their computation latency with every GPU,
``T_i |Pi_i| / sum_k rho_ik``, ascending, so the rear part of the category
list (Algorithm 1's order) gives the heavier jobs more GPUs. ``samples``
categories are drawn uniformly without replacement from the rear fraction
``[alpha |Psi|, |Psi|)`` -- by unranking, so |Psi| in the millions costs
nothing -- each is solved like HAS, and the winner maximises
``beta * min_n(L_n) / L_n + (1 - beta) * F_n`` (eq. 34) where F_n is Jain's
fairness of JCT relative to an equal share (eq. 33).
"""

from __future__ import annotations

import numpy as np

from hetsched.core.plan import jain
from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import admit, smith_priority
from hetsched.planning.space.policies.has import (
    MATCHINGS,
    CategorySolver,
    predicted_search_s,
)
from hetsched.planning.space.policies.has_trim import TrimTables
from hetsched.planning.space.policies.sampling import latency_order, sample_categories


@register
class JPS(Policy):
    name = "jps"
    paper = "Zhou et al., TPDS 2024 (HAS/JPS), Algorithm 3, eqs. (33)-(34)"
    summary = "HAS on N sampled categories from the rear of the job-prioritised category list"
    param_docs = {
        "alpha": "sample from the rear fraction [alpha*|Psi|, |Psi|) of the categories",
        "beta": "1 = lowest JCT only, 0 = fairness only (eq. 34)",
        "samples": "number of categories N to evaluate",
        "seed": "random seed of the sampler (plans are reproducible)",
        "matching": "P3 objective: 'raw', 'normalized' or 'both' (see has)",
        "trim": "drop workers that slow their job down (see has)",
        "refill": "after the trim, hand idle GPUs to the jobs they speed up most (see has)",
    }

    def __init__(self, *, alpha: float = 0.7, beta: float = 1.0, samples: int = 40,
                 seed: int = 0, matching: str = "both", trim: bool = True,
                 refill: bool = False) -> None:
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if matching not in MATCHINGS:
            raise ValueError(f"matching must be one of {', '.join(MATCHINGS)}, got {matching!r}")
        self.alpha, self.beta, self.samples, self.seed = float(alpha), float(beta), int(samples), int(seed)
        self.matching = matching
        self.trim = bool(trim)
        self.refill = bool(refill)
        #: this run's trim tables, kept across its events (has_trim.sub_table)
        self._tables = TrimTables()

    @classmethod
    def predict_work(cls, problem: PlanningProblem, active: list[int],
                     horizon_s: float = 0.0) -> float:
        """Per event: the default 40 samples matched twice and scored, plus the re-matching."""
        return float(sum(cls.EVENT_S + cls.JOB_S * n + predicted_search_s(int(problem.K), n, 40)
                         for n in active))

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        rows, mins = admit(p, snap, smith_priority(p, snap))
        minimal = np.zeros((len(snap.jobs), p.T), dtype=int)
        if not rows:
            return minimal
        minimal[rows] = mins  # the fallback: every admitted job on its minimal set
        rows = latency_order(p, snap, rows)  # job prioritising
        solver = CategorySolver(p, snap, rows, self.matching, self.trim, self.refill,
                                self._tables)
        S = len(rows)
        cats = list(dict.fromkeys(solver.repair(c) for c in sample_categories(
            solver.total, S, self.alpha, self.samples, self.seed)))
        A, obj = solver.solve(cats)
        self.work_s += solver.work_s()
        ok = np.isfinite(obj)
        if not ok.any():  # no sampled category can hold the batches: minimal sets
            return minimal
        if self.beta >= 1.0:
            best = int(np.argmin(obj))
        else:
            ref = np.array([snap.remaining[r] * p.equal_share_time(int(snap.jobs[r]), S)
                            for r in rows])
            score = np.full(len(cats), -np.inf)
            for k in np.nonzero(ok)[0]:
                lam = np.array([snap.remaining[r] * p.iter_time(int(snap.jobs[r]), A[k, j][None])[0]
                                for j, r in enumerate(rows)])
                F = jain(list(lam / ref))
                score[k] = self.beta * obj[ok].min() / obj[k] + (1 - self.beta) * F
            best = int(np.argmax(score))
        return solver.expand(A[best])

