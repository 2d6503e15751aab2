"""A queued job's rank layout: the file ``hetsched run`` reads when the job starts.

The hetjob script does not carry the layout (each rank's GPU type, node and
local batch): it names this file (``--layout``, ``$HETSCHED_LAYOUT``). Submit
writes it before ``sbatch``; a replan that changes the *pending* job in place
(``scontrol update`` of GRES, node list and task count) rewrites it right
after Slurm accepted the update, pointing at the new plan. Groups are in the
Slurm job's component order, which is the rank order of its one step
(component by component, then worker by worker).

Written atomically (temp file + rename), so a starting job reads either the
old layout or the new one, never half of one; the runtime checks that the
layout it read matches the allocation it got (runtime/job.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetsched.core.plan import Plan, worker_groups
from hetsched.errors import InputError
from hetsched.io.files import atomic_write, check_private, read_text
from hetsched.io.jobfiles import JobFiles

VERSION = 1
MAX_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Layout:
    """Where each rank of a queued job runs, and which plan it follows."""

    plan: str  # the plan file
    plan_id: str
    job: str
    segment: int
    groups: tuple[tuple[str, str, tuple[int, ...]], ...]  # (GPU type, node, local batches)
    pinned: bool = True  # nodes are Slurm's (--nodelist), not only the plan's

    def workers(self) -> list[dict[str, Any]]:
        """Every rank's GPU type, node and local batch, in rank order."""
        return [{"gpu_type": t, "node": n, "local_batch": b}
                for t, n, bs in self.groups for b in bs]

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "plan": self.plan, "plan_id": self.plan_id,
                "job": self.job, "segment": self.segment, "pinned": self.pinned,
                "groups": [{"gpu_type": t, "node": n, "local_batches": list(bs)}
                           for t, n, bs in self.groups]}


def groups_of(ordered: Sequence[tuple[str, str, Sequence[int]]]
              ) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    return tuple((str(t), str(n), tuple(int(b) for b in bs)) for t, n, bs in ordered)


def write_layout(path: str | Path, layout: Layout) -> None:
    atomic_write(Path(path), json.dumps(layout.to_dict(), indent=1) + "\n")


def _field(d: Mapping[str, Any], key: str, kind: type, src: str) -> Any:
    v = d.get(key)
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise InputError(src, f"field {key!r} must be a {kind.__name__}", key)
    return v


def read_layout(path: str | Path) -> Layout:
    """The layout in ``path``; one InputError line naming the file and field if bad."""
    src = str(path)
    check_private(path, "job layout")  # it names the plan, and so the command, the job runs
    try:
        d = json.loads(read_text(path, "a job layout", MAX_BYTES))
    except ValueError as e:
        raise InputError(src, f"not JSON: {e}") from None
    if not isinstance(d, dict) or d.get("version") != VERSION:
        raise InputError(src, f"not a version-{VERSION} hetsched layout", "version")
    groups = []
    for k, g in enumerate(_field(d, "groups", list, src)):
        if not isinstance(g, dict):
            raise InputError(src, f"groups[{k}] must be a mapping", "groups")
        bs = _field(g, "local_batches", list, src)
        if not bs or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                             for b in bs):
            raise InputError(src, f"groups[{k}].local_batches must be integers >= 1",
                             "groups")
        groups.append((_field(g, "gpu_type", str, src), _field(g, "node", str, src),
                       tuple(bs)))
    if not groups:
        raise InputError(src, "no groups: a job has at least one GPU", "groups")
    seg = _field(d, "segment", int, src)
    if seg < 0:
        raise InputError(src, "segment must be >= 0", "segment")
    return Layout(_field(d, "plan", str, src), _field(d, "plan_id", str, src),
                  _field(d, "job", str, src), seg, tuple(groups),
                  bool(d.get("pinned", True)))


def job_layout(plan: Plan, pid: str, plan_path: Path, job: str, segment: int,
               pinned: bool = True) -> Layout:
    """The layout of a job's segment as submitted: components in the plan's rank order."""
    workers = plan.job(job).segments[segment].workers
    return Layout(str(plan_path), pid, job, segment, groups_of(worker_groups(workers)), pinned)


def write_job_layout(files: JobFiles, plan: Plan, pinned: bool = True,
                     alone: bool = True) -> None:
    """Submit's layout for a job's segment (the file ``hetsched run --layout`` reads) at
    ``files.layout``, naming the plan copy ``files.plan_copy``; none for a co-location
    group's job (``alone`` false: the group runtime reads the plan, and a group is never
    changed in place)."""
    if not alone:
        return
    write_layout(files.layout, job_layout(plan, files.plan_id, files.plan_copy, files.job,
                                          files.segment, pinned))
