"""The scorer: exact timing of one job on concrete GPUs (integer shares, real node layout).

Every plan's iteration times come from here, so every policy is measured the
same way: integer local batches (balanced, or equal for the baselines that
split evenly), the slowest worker's step, and the synchronisation of the
placement's bottleneck link (:func:`hetsched.core.model.comm_time`, the one
communication formula).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetsched.core.model import balanced_shares, comm_time, equal_shares, step_time
from hetsched.core.plan import Worker
from hetsched.core.problem import PlanningProblem


@dataclass
class Timing:
    batches: list[int]
    compute_s: float
    comm_s: float

    @property
    def iteration_s(self) -> float:
        return self.compute_s + self.comm_s


class Evaluator:
    """Exact per-placement timing (integer shares, real node layout), cached."""

    def __init__(self, problem: PlanningProblem) -> None:
        self.p = problem
        gpus = problem.cluster.gpus
        tindex = {t: k for k, t in enumerate(problem.types)}
        self.gpu_type = np.array([tindex[g.gpu_type] for g in gpus], dtype=int)
        self.gpu_type_list = self.gpu_type.tolist()
        nodes = sorted({g.node for g in gpus}, key=[g.node for g in gpus].index)
        nindex = {n: k for k, n in enumerate(nodes)}
        self.gpu_node = np.array([nindex[g.node] for g in gpus], dtype=int)
        self.nodes = nodes
        self._cache: dict[tuple[int, tuple[int, ...], bool, str], Timing] = {}

    def timing(self, i: int, gpu_ids: list[int], shares: str) -> Timing:
        p = self.p
        types = tuple(sorted(int(self.gpu_type[g]) for g in gpu_ids))
        single = len({int(self.gpu_node[g]) for g in gpu_ids}) == 1
        key = (i, types, single, shares)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        a = [float(p.a[i, t]) for t in types]
        c = [float(p.c[i, t]) for t in types]
        caps = [int(p.cap[i, t]) for t in types]
        B = int(p.B[i])
        b = balanced_shares(a, c, caps, B) if shares == "balanced" else equal_shares(caps, B)
        sync = max(float(p.sync[i, t]) for t in types)
        cal = p.calibrated_comm(i, types, len(types)) if len(types) > 1 else None
        comm = cal if cal is not None else comm_time(len(types), float(p.model_mb[i]),
                                                     p.bandwidth(single), sync)
        tm = Timing(b, step_time(a, c, b), comm)
        self._cache[key] = tm
        return tm

    def workers(self, i: int, gpu_ids: list[int], shares: str) -> tuple[list[Worker], Timing]:
        """Workers in type order matching the cached batch vector."""
        tm = self.timing(i, gpu_ids, shares)
        order = sorted(gpu_ids, key=lambda g: (int(self.gpu_type[g]), g))
        gpus = self.p.cluster.gpus
        ws = [Worker(gpus[g].node, gpus[g].gpu_type, gpus[g].index, b)
              for g, b in zip(order, tm.batches, strict=True)]
        return ws, tm


__all__ = ["Timing", "Evaluator"]
