"""The scorer: exact timing of one job on concrete GPUs (integer shares, real node layout).

Every plan's iteration times come from here, so every policy is measured the
same way: integer local batches (balanced, or equal for the baselines that
split evenly), the slowest worker's step, and the synchronisation of the
placement's bottleneck link (:func:`hetsched.core.model.comm_time`, the one
communication formula).

Elastic batches (docs/elastic.md): a job may run at another global batch B
than its spec's B0. Work left is always counted in iterations at B0; one
iteration at B does ``work = B * E(B) / B0`` of them, E being the
statistical efficiency (Pollux; :func:`hetsched.core.efficiency.efficiency`),
1 without the efficiency model or a known noise scale (ONES's assumption).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetsched.core.efficiency import efficiency
from hetsched.core.model import balanced_shares, comm_time, equal_shares, step_time
from hetsched.core.plan import Worker
from hetsched.core.problem import PlanningProblem


@dataclass
class Timing:
    batches: list[int]
    compute_s: float
    comm_s: float
    #: iterations at the spec's batch one iteration here is worth (1 at the spec's batch)
    work: float = 1.0
    #: in a co-located group (Harmony): seconds per own iteration there (eq. (1) or a
    #: measured pair), replacing ``compute_s + comm_s``; None = the job runs alone
    shared_s: float | None = None

    @property
    def iteration_s(self) -> float:
        if self.shared_s is not None:
            return self.shared_s
        return self.compute_s + self.comm_s

    @property
    def per_work_s(self) -> float:
        """Seconds per iteration of work left (which is counted at the spec's batch)."""
        return self.iteration_s / self.work


class Evaluator:
    """Exact per-placement timing (integer shares, real node layout), cached."""

    def __init__(self, problem: PlanningProblem, stat_efficiency: bool = True) -> None:
        self.p = problem
        self.stat_efficiency = stat_efficiency
        gpus = problem.cluster.gpus
        tindex = {t: k for k, t in enumerate(problem.types)}
        self.gpu_type = np.array([tindex[g.gpu_type] for g in gpus], dtype=int)
        self.gpu_type_list = self.gpu_type.tolist()
        nodes = sorted({g.node for g in gpus}, key=[g.node for g in gpus].index)
        nindex = {n: k for k, n in enumerate(nodes)}
        self.gpu_node = np.array([nindex[g.node] for g in gpus], dtype=int)
        self.nodes = nodes
        self.gpu_node_list = self.gpu_node.tolist()
        self._cache: dict[tuple[int, tuple[int, ...], bool, str, int], Timing] = {}
        self._layout: dict[tuple[int, ...], tuple[tuple[int, ...], bool]] = {}

    def timing(self, i: int, gpu_ids: list[int], shares: str, batch: int | None = None
               ) -> Timing:
        p = self.p
        ids = tuple(gpu_ids)
        lay = self._layout.get(ids)
        if lay is None:  # (worker types in order, on one node?) of this GPU set
            lay = self._layout[ids] = (tuple(sorted(self.gpu_type_list[g] for g in ids)),
                                       len({self.gpu_node_list[g] for g in ids}) == 1)
        types, single = lay
        B0 = int(p.B[i])
        B = B0 if batch is None else int(batch)
        key = (i, types, single, shares, B)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        a = [float(p.a[i, t]) for t in types]
        c = [float(p.c[i, t]) for t in types]
        caps = [int(p.cap[i, t]) for t in types]
        # the planner's model: piecewise curves where the affine fit is poor
        pc = p.curves[i]
        cv = None if pc is None else [pc[t] for t in types]
        b = balanced_shares(a, c, caps, B, cv) if shares == "balanced" else equal_shares(caps, B)
        sync = max(float(p.sync[i, t]) for t in types)
        cal = p.calibrated_comm(i, types, len(types)) if len(types) > 1 else None
        comm = cal if cal is not None else comm_time(len(types), float(p.model_mb[i]),
                                                     p.bandwidth(single), sync)
        el = p.jobs[i].elastic
        eff = efficiency(B, B0, el.noise_scale) if el is not None and self.stat_efficiency \
            else 1.0
        tm = Timing(b, step_time(a, c, b, cv), comm, work=B * eff / B0)
        self._cache[key] = tm
        return tm

    def workers(self, i: int, gpu_ids: list[int], shares: str, batch: int | None = None
                ) -> tuple[list[Worker], Timing]:
        """Workers in type order matching the cached batch vector."""
        tm = self.timing(i, gpu_ids, shares, batch)
        order = sorted(gpu_ids, key=lambda g: (int(self.gpu_type[g]), g))
        gpus = self.p.cluster.gpus
        ws = [Worker(gpus[g].node, gpus[g].gpu_type, gpus[g].index, b)
              for g, b in zip(order, tm.batches, strict=True)]
        return ws, tm


__all__ = ["Timing", "Evaluator"]
