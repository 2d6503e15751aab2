"""``las``: Tiresias' discretised two-dimensional least-attained-service (Gu et al., NSDI 2019).

A job's attained service is GPUs x time it has run (estimated from the
iterations done at its requested size). Jobs sit in priority queues by
attained service (thresholds ``queue_gpu_s``, GPU-seconds); the lower queue
goes first, first-come first-served inside a queue, each job at its requested
GPU count on the fastest free type (as fifo/srtf). Preemptive: re-decided at
every reset event, so a job that crosses a threshold can be overtaken. A job
waiting longer than ``starve_factor`` x its run time goes back to the top
queue (Tiresias' starvation guard).
"""

from __future__ import annotations

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import equal_iter_time
from hetsched.planning.space.policies.fifo import fixed_request


@register
class LAS(Policy):
    name = "las"
    paper = "Gu et al., Tiresias (NSDI 2019): discretised 2D-LAS"
    summary = "Least attained GPU-time first in discrete queues, requested GPU count, preemptive"
    shares = "equal"
    auto = False  # an online scheduler / baseline: `hetsched simulate` compares it
    param_docs = {
        "queue_gpu_s": "queue threshold in GPU-seconds of attained service (two queues)",
        "starve_factor": "waited > factor x run time promotes a job to the top queue (0: off)",
    }

    def __init__(self, *, queue_gpu_s: float = 3600.0, starve_factor: float = 0.0) -> None:
        if queue_gpu_s <= 0 or starve_factor < 0:
            raise ValueError("queue_gpu_s must be > 0 and starve_factor >= 0")
        self.queue_gpu_s, self.starve_factor = float(queue_gpu_s), float(starve_factor)

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        X = np.zeros((len(snap.jobs), p.T), dtype=int)
        queue = np.zeros(len(snap.jobs), dtype=int)
        for r, i in enumerate(snap.jobs):
            i = int(i)
            n = fixed_request(p, i, p.n_type)
            if not n.sum():
                continue
            ran_s = (p.iters[i] - snap.remaining[r]) * equal_iter_time(p, i, n)
            attained = ran_s * int(n.sum())
            queue[r] = 1 if attained >= self.queue_gpu_s else 0
            if self.starve_factor and snap.waited.size and queue[r] and \
                    snap.waited[r] - ran_s > self.starve_factor * ran_s:
                queue[r] = 0
        free = snap.free.copy()
        for r in np.lexsort((snap.jobs, p.arrival[snap.jobs], queue)):
            n = fixed_request(p, int(snap.jobs[r]), free)
            if n.sum():
                X[r] = n
                free -= n
        return X
