"""Co-located groups in the space evaluator (Harmony): GPUs that serve several jobs at once.

A policy with ``colocates = True`` names each job's group (``group_of(i)``,
None = alone) after ``allocate``; every member of a group gets the same
per-type counts. The evaluator places one member per group and gives the
others the same GPUs (:func:`spread`), then times the group here: each
member's COMP and COMM come from the scorer on the group's GPUs (its local
batch shrinks as the group's GPUs grow: eq. (2) through the step-time
model), and its seconds per iteration from :func:`member_iteration_s`
(eq. (1) with subtask coordination, the serial sum without, Gavel's
measured pair where the profile has one). :func:`check_memory` refuses a
group whose members do not fit in a GPU's memory together.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hetsched.core.colocation import job_memory_gb, member_iteration_s
from hetsched.core.memory import gpu_memory_gb, job_state_gb
from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.scorer import Evaluator, Timing

Alloc = dict[int, list[int]]


def leaders(jobs: list[int], group_of: dict[int, str | None]) -> dict[int, list[int]]:
    """The first member of each group -> all its members (a job alone leads itself)."""
    out: dict[int, list[int]] = {}
    first: dict[str, int] = {}
    for i in jobs:
        g = group_of.get(i)
        if g is None:
            out[i] = [i]
        elif g in first:
            out[first[g]].append(i)
        else:
            first[g] = i
            out[i] = [i]
    return out


def spread(placed: Alloc, lead: dict[int, list[int]]) -> Alloc:
    """Every member of a group gets its leader's GPUs."""
    out: Alloc = {}
    for i, gs in placed.items():
        for j in lead.get(i, [i]):
            out[j] = list(gs)
    return out


class GroupTimer:
    """Times co-located groups on their GPUs; checks they fit in GPU memory."""

    def __init__(self, p: PlanningProblem, ev: Evaluator, coordinated: bool) -> None:
        self.p, self.ev, self.coordinated = p, ev, coordinated
        self.gpu_gb = gpu_memory_gb(p.cluster)
        self.state_gb = np.array([job_state_gb(j) for j in p.jobs])

    def measured(self, members: list[int], gpus: list[int], tms: list[Timing]
                 ) -> list[float] | None:
        """Gavel's measured step times of a pair sharing one GPU, if the profile has them."""
        if len(members) != 2 or len(gpus) != 1:
            return None
        p = self.p
        gt = p.cluster.gpus[gpus[0]].gpu_type
        (i, j), (bi, bj) = members, (tms[0].batches[0], tms[1].batches[0])
        ti, tj = p.pair_step_s(i, bi, j, bj, gt), p.pair_step_s(j, bj, i, bi, gt)
        return None if ti is None or tj is None else [ti, tj]

    def timings(self, members: list[int], gpus: list[int], shares: str,
                batches: dict[int, int]) -> list[Timing]:
        """Each member's Timing in the group: own COMP/COMM, shared seconds per iteration."""
        tms = [self.ev.timing(i, gpus, shares, batches.get(i)) for i in members]
        if len(members) == 1:
            return tms
        per = member_iteration_s([t.compute_s for t in tms], [t.comm_s for t in tms],
                                 coordinated=self.coordinated,
                                 measured=self.measured(members, gpus, tms))
        return [replace(t, shared_s=s) for t, s in zip(tms, per, strict=True)]

    def check_memory(self, members: list[int], gpus: list[int], tms: list[Timing],
                     who: str) -> None:
        """Every GPU of the group holds all members' model state and local batches."""
        if len(members) < 2:
            return
        p, ev = self.p, self.ev
        order = sorted(gpus, key=lambda g: (int(ev.gpu_type[g]), g))
        for k, g in enumerate(order):
            t = int(ev.gpu_type[g])
            used = sum(job_memory_gb(self.state_gb[i], tm.batches[k], p.mem_cap[i, t], self.gpu_gb[g])
                       for i, tm in zip(members, tms, strict=True))
            if used > self.gpu_gb[g] * (1 + 1e-9):
                names = ", ".join(p.jobs[i].name for i in members)
                raise AssertionError(f"{who}: group of {names} needs {used:.1f} GB on GPU "
                                     f"{p.cluster.gpus[g].node}:{p.cluster.gpus[g].index} "
                                     f"({self.gpu_gb[g]:.0f} GB)")


__all__ = ["leaders", "spread", "GroupTimer"]
