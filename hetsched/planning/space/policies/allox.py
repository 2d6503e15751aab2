"""AlloX (Le et al., EuroSys 2020) as Hare's Sched_Allox: one GPU per job, min-cost matching.

Jobs are matched to (GPU, position-from-last) slots; putting job j k-th from
last on a GPU of type t costs ``k * p_jt`` (its processing time there counts
once for itself and once for every job behind it), and the min-cost bipartite
matching minimises total completion time (Bruno-Coffman-Sethi). At each reset
event the jobs matched to the last... first slot of a free GPU start; running
jobs are never moved. A job whose global batch does not fit one GPU of a type
gets the fewest GPUs of that type that hold it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linear_sum_assignment

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import equal_iter_time, fastest_types, min_feasible


@register
class AlloX(Policy):
    name = "allox"
    paper = "Le et al., EuroSys 2020 (AlloX); Sched_Allox baseline of Hare"
    summary = "One GPU type per job, min-cost bipartite matching of jobs to GPU slots"
    shares = "equal"
    preemptive = False
    EVENT_S, JOB_S = 3e-4, 3e-6

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        J = len(snap.jobs)
        X = np.zeros((J, p.T), dtype=int)
        size = np.zeros((J, p.T), dtype=int)
        ptime = np.full((J, p.T), np.inf)
        for r, i in enumerate(snap.jobs):
            for t in range(p.T):
                if not p.allowed[i, t]:
                    continue
                need = max(int(p.lo[i]), math.ceil(p.B[i] / p.cap[i, t]))
                if need > p.hi[i] or need > p.n_type[t]:
                    continue
                n = np.zeros(p.T, dtype=int)
                n[t] = need
                size[r, t] = need
                # GPU-seconds so that a bundle of `need` GPUs costs like `need` slots
                ptime[r, t] = snap.remaining[r] * equal_iter_time(p, int(i), n)
        machines = np.repeat(np.arange(p.T), snap.free)
        if len(machines) == 0:
            return X
        P = min(J, math.ceil(J / len(machines)) + 2)
        cols_t = np.tile(machines, P)
        cols_k = np.repeat(np.arange(1, P + 1), len(machines))
        cost = ptime[:, cols_t] * cols_k[None, :] * p.weight[snap.jobs][:, None]
        finite = np.isfinite(cost)
        big = (cost[finite].max() if finite.any() else 1.0) * 10 + 1.0
        r_idx, c_idx = linear_sum_assignment(np.where(finite, cost, big))
        # Jobs in the last position (k = deepest) of a machine run last; the job
        # with the largest k on each machine runs first. Start that one now.
        free = snap.free.copy()
        firsts: dict[int, tuple[int, int]] = {}
        for r, c in zip(r_idx, c_idx, strict=True):
            if not finite[r, c]:
                continue
            m = c % len(machines)
            k = int(cols_k[c])
            if m not in firsts or k > firsts[m][1]:
                firsts[m] = (int(r), k)
        for m, (r, _) in sorted(firsts.items(), key=lambda kv: -kv[1][1]):
            t = int(machines[m])
            need = int(size[r, t])
            if X[r].sum() == 0 and need <= free[t]:
                X[r, t] = need
                free[t] -= need
        # A job that no single GPU type can hold (its batch needs more memory
        # than one type's GPUs have, or more than max_gpus of them) has no
        # finite slot and was never started: the plan got stuck. It runs
        # across types on the fewest GPUs that hold it, when they are free.
        for r, i in enumerate(snap.jobs):
            if X[r].sum() == 0 and not np.isfinite(ptime[r]).any():
                n = min_feasible(p, int(i), free, fastest_types(p, int(i)))
                if n.sum():
                    X[r] = n
                    free -= n
        return X
