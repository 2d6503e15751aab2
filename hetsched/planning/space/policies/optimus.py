"""Optimus (Peng et al., EuroSys 2018) as the HAS paper runs it, and Optimus-LB.

Every job first gets one worker (its minimal feasible set); then the job
with the largest marginal JCT reduction gets one more worker, repeatedly, while
that helps. Optimus splits the batch equally (no load balancing, as in [8]);
Optimus-LB is the HAS paper's extension with proportional workload
assignment (here: the exact water-filling shares).
"""

from __future__ import annotations

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import (
    admit,
    fastest_types,
    greedy_grow,
    iter_time_fn,
    smith_priority,
)


@register
class Optimus(Policy):
    name = "optimus"
    paper = "Peng et al., EuroSys 2018; baseline of the HAS paper (Sec. VI)"
    summary = "Greedy marginal-gain worker allocation, equal batch shares"
    shares = "equal"
    EVENT_S, JOB_S = 1.5e-3, 1e-5

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        X = np.zeros((len(snap.jobs), p.T), dtype=int)
        rows, mins = admit(p, snap, smith_priority(p, snap))
        if not rows:
            return X
        X[rows] = mins
        free = snap.free - mins.sum(axis=0)
        return greedy_grow(p, snap, rows, X, free, iter_time_fn(p, self.shares),
                           lambda i: fastest_types(p, i), self.shares)


@register
class OptimusLB(Optimus):
    name = "optimus-lb"
    paper = "HAS paper (Zhou et al., TPDS 2024), Sec. VI: Optimus with load balancing"
    summary = "Optimus' greedy with heterogeneity-aware (water-filling) batch shares"
    shares = "balanced"
    EVENT_S, JOB_S = 2e-3, 1.5e-5
