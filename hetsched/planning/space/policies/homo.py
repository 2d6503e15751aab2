"""Sched_Homo (Zhang et al., the homogeneous scheduler Hare compares against).

Heterogeneity-oblivious: it believes every GPU is the same average GPU. With
that model it orders jobs by Smith's rule and sizes them with the same greedy
as Optimus, then takes GPUs in the order the cluster lists them, whatever
their type, and splits batches equally. No job preemption: running jobs are
never moved.
"""

from __future__ import annotations

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import greedy_grow, min_feasible


def _oblivious_counts(p: PlanningProblem, i: int, k: int, free: np.ndarray) -> np.ndarray:
    """k GPUs taken in cluster order (types as the node list has them), allowed types only.

    The homogeneous model sizes jobs with the smallest memory cap; when the
    first k GPUs in cluster order still cannot hold the global batch (or the
    model's k is out of reach), more GPUs are taken until they do. Without
    that a job the model deems too big never started and the plan failed.
    """
    return min_feasible(p, i, free, np.array(p.type_order(), dtype=int), at_least=k)


@register
class Homo(Policy):
    name = "homo"
    paper = "Zhang et al. (Sched_Homo), heterogeneity-oblivious baseline of Hare"
    summary = "Treats all GPUs as one average type; greedy sizes, cluster-order GPUs, equal shares"
    shares = "equal"
    preemptive = False
    EVENT_S, JOB_S = 2e-4, 2e-6
    placement = "oblivious"

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        J = len(snap.jobs)
        X = np.zeros((J, p.T), dtype=int)
        # the homogeneous model: per job, the mean step-time line over its allowed types
        a = np.array([p.a[i][p.allowed[i]].mean() for i in snap.jobs])
        c = np.array([p.c[i][p.allowed[i]].mean() for i in snap.jobs])
        capmin = np.array([p.cap[i][p.allowed[i]].min() for i in snap.jobs])
        B = p.B[snap.jobs]

        def it_homo(r: int, k: int) -> float:
            if k <= 0 or B[r] / k > capmin[r] or k > B[r]:
                return np.inf
            return float(a[r] + c[r] * np.ceil(B[r] / k))

        def kmin(r: int) -> int:
            # never above max_gpus (hi): the policy must stay within the job's bounds
            i = snap.jobs[r]
            return int(min(max(p.lo[i], np.ceil(B[r] / capmin[r])), p.hi[i]))

        key = np.array([p.weight[i] / (snap.remaining[r] * it_homo(r, kmin(r)))
                        for r, i in enumerate(snap.jobs)])
        free = snap.free.copy()
        rows = []
        for r in np.argsort(-key, kind="stable"):
            i = int(snap.jobs[r])
            n = _oblivious_counts(p, i, kmin(int(r)), free)
            if n.sum() == 0:
                continue
            X[r] = n
            free -= n
            rows.append(int(r))
        if not rows:
            return X
        # greedy growth on the homogeneous model, GPUs in cluster order
        row_of = {int(i): r for r, i in enumerate(snap.jobs)}

        def it(i: int, n: tuple[int, ...]) -> float:
            return it_homo(row_of[i], sum(n))

        cluster_order = p.type_order()

        # the homogeneous model is a function of the job alone, so its gains
        # can be memoised across events like Optimus'
        return greedy_grow(p, snap, rows, X, free, it, lambda i: cluster_order, "homo")
