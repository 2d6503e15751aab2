"""A plan's co-location groups as the submit path and the runtime see them (Harmony).

Segments of different jobs with the same ``Segment.group`` share the same GPUs
at the same time (``core.plan.Segment.group``). A group runs as one Slurm job
with one task per shared GPU; every task trains all the group's jobs
(``runtime.group``). Both sides need the same rank order and each job's local
batch per rank; it is defined here once, torch-free.

Rank order: the shared GPUs grouped by (GPU type, node) in the first member's
order (``core.plan.worker_groups``, so a group's hetjob components are numbered
as a plain job's), GPU by GPU within a component. Members are in plan order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetsched.core.plan import Plan
from hetsched.core.spec import GPU
from hetsched.errors import InputError


@dataclass(frozen=True)
class GroupMember:
    """One job of a group: which of its segments, and its local batch on each slot."""

    job: str
    segment: int
    local_batches: tuple[int, ...]  # in the group's rank order
    compute_s: float = 0.0
    comm_s: float = 0.0
    iteration_s: float = 0.0


@dataclass(frozen=True)
class GroupView:
    group: str
    slots: tuple[GPU, ...]  # the GPUs the group's jobs share, in rank order
    members: tuple[GroupMember, ...]
    start_s: float = 0.0
    end_s: float = 0.0

    @property
    def jobs(self) -> list[str]:
        return [m.job for m in self.members]

    def components(self) -> list[tuple[str, str, int]]:
        """(GPU type, node, GPU count) per hetjob component, in rank order."""
        out: dict[tuple[str, str], int] = {}
        for s in self.slots:
            out[(s.gpu_type, s.node)] = out.get((s.gpu_type, s.node), 0) + 1
        return [(t, n, k) for (t, n), k in out.items()]

    def member(self, job: str) -> GroupMember:
        for m in self.members:
            if m.job == job:
                return m
        raise KeyError(job)


def _slot_key(w: Any) -> tuple[str, str, int]:
    return (str(w.node), str(w.gpu_type), int(w.gpu))


def plan_groups(plan: Plan, source: str = "plan",
                segment_of: dict[str, int] | None = None) -> dict[str, GroupView]:
    """Every group of the plan: each job's segment ``segment_of[job]`` where given, else
    each job's first segment in each group. Raises InputError when members do not share
    GPUs."""
    found: dict[str, list[tuple[str, int, Any]]] = {}
    for j in plan.jobs:
        for k, s in enumerate(j.segments):
            if s.group is None or (segment_of is not None and segment_of.get(j.name, 0) != k):
                continue
            rows = found.setdefault(s.group, [])
            if any(n == j.name for n, _, _ in rows):
                continue  # a job's first segment in this group
            rows.append((j.name, k, s))
    return {g: _view(g, rows, source) for g, rows in found.items()}


def _view(group: str, rows: list[tuple[str, int, Any]], source: str) -> GroupView:
    first = rows[0][2]
    order: dict[tuple[str, str], list[tuple[str, str, int]]] = {}
    for w in first.workers:
        order.setdefault((str(w.gpu_type), str(w.node)), []).append(_slot_key(w))
    keys = [key for comp in order.values() for key in comp]
    slots = [GPU(*key) for key in keys]
    if len(set(keys)) != len(keys):
        raise InputError(source, f"group {group!r}: job {rows[0][0]!r} names a GPU twice",
                         f"jobs[{rows[0][0]}].segments")
    members = []
    for name, k, seg in rows:
        by_slot = {_slot_key(w): int(w.local_batch) for w in seg.workers}
        if set(by_slot) != set(keys) or len(seg.workers) != len(keys):
            raise InputError(source, f"group {group!r}: job {name!r} (segment {k}) does not "
                             f"run on the same GPUs as job {rows[0][0]!r}; a group's jobs "
                             "share every GPU", f"jobs[{name}].segments[{k}].workers")
        members.append(GroupMember(name, k, tuple(by_slot[x] for x in keys),
                                   float(seg.compute_s), float(seg.comm_s),
                                   float(seg.iteration_s)))
    starts = [r[2].start_s for r in rows]
    ends = [r[2].end_s for r in rows]
    return GroupView(group, tuple(slots), tuple(members), min(starts), max(ends))


def group_of(plan: Plan, group: str, source: str = "plan") -> GroupView:
    groups = plan_groups(plan, source)
    if group not in groups:
        raise InputError(source, f"no group {group!r} in the plan (groups: "
                         f"{', '.join(sorted(groups)) or 'none'})", "--group")
    return groups[group]
