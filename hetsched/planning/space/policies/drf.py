"""``drf``: Dominant Resource Fairness (Ghodsi et al., NSDI 2011), the paper's YARN/Mesos baseline.

The resources are the GPU types. Progressive filling: every waiting or
running job first gets its minimal GPU set (arrival order while it fits), then
GPUs go one at a time to the job with the smallest dominant share (its
largest fraction of any type's GPUs), each to that job's fastest type with a
free GPU, until no job can grow (max_gpus, batch size) or the GPUs run out.
Re-decided at every reset event; the evaluator charges restarts for moves.
"""

from __future__ import annotations

import heapq

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import fastest_types, min_feasible


@register
class DRF(Policy):
    name = "drf"
    paper = "Ghodsi et al., Dominant Resource Fairness (NSDI 2011); YARN/Mesos default"
    summary = "Max-min fair dominant shares over GPU types, progressive filling"
    shares = "equal"
    auto = False  # an online scheduler / baseline: `hetsched simulate` compares it

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        X = np.zeros((len(snap.jobs), p.T), dtype=int)
        free = snap.free.copy()
        cap = np.maximum(p.n_type, 1).astype(float)
        for r in np.lexsort((snap.jobs, p.arrival[snap.jobs])):
            n = min_feasible(p, int(snap.jobs[r]), free, fastest_types(p, int(snap.jobs[r])))
            if n.sum():
                X[r] = n
                free -= n
        heap = [(float((X[r] / cap).max()), int(snap.jobs[r]), r)
                for r in range(len(snap.jobs)) if X[r].sum()]
        heapq.heapify(heap)
        while heap and free.sum():
            _, _, r = heapq.heappop(heap)
            i = int(snap.jobs[r])
            if X[r].sum() >= min(p.hi[i], p.B[i]):
                continue
            t = next((t for t in fastest_types(p, i) if free[t] and p.allowed[i, t]), None)
            if t is None:
                continue
            X[r, t] += 1
            free[t] -= 1
            heapq.heappush(heap, (float((X[r] / cap).max()), i, r))
        return X
