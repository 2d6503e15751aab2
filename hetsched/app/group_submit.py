"""Co-location groups in ``app.submit``: a group is ONE Slurm job, submitted in the plan's order.

``app.submit`` works on *units*: an isolated job is a unit named after it; a
co-location group (``core.groups``) is one unit, ``group=<id>``
(``slurm.group_script.group_unit``), whose one script (``render_group``) runs
every member job. A plan with both submits both, in the plan's order: a
unit comes at the start of its earliest member; a group waits
(``--dependency=afterany``) for what any member waits for, and a job waiting
for a member waits for the group's Slurm job. Each member job keeps its own
submission row (plan, job, segment), all with the group's Slurm id, as a pool
plan's jobs do, so ``status``, the monitor and ``cancel`` see each job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hetsched.app.runnable import UnrunnableError
from hetsched.app.submission import Site
from hetsched.core.groups import GroupView, plan_groups
from hetsched.core.plan import Plan
from hetsched.core.sbatch import SbatchOptions
from hetsched.slurm.group_script import group_comment, group_unit, render_group
from hetsched.slurm.templates import Script, submission_comment


@dataclass(frozen=True)
class Unit:
    """What one sbatch submits: its (job, segment) rows and its tag."""

    name: str
    members: tuple[tuple[str, int], ...]
    comment: str
    group: GroupView | None = None


def units_of(plan: Plan, pid: str, names: set[str], segment_of: Mapping[str, int] | None,
             source: str = "plan") -> tuple[dict[str, Unit], dict[str, str]]:
    """The units of the jobs in ``names`` (job -> its unit's name as the second result).

    A group is submitted whole: its members outside ``names`` join it.
    """
    segs = dict(segment_of or {})
    views = plan_groups(plan, source, segment_of=segs)
    unit_of: dict[str, str] = {}
    units: dict[str, Unit] = {}
    for g, view in views.items():
        if not any(m.job in names for m in view.members):
            continue
        u = Unit(group_unit(g), tuple((m.job, m.segment) for m in view.members),
                 group_comment(pid, g, min(m.segment for m in view.members)), view)
        units[u.name] = u
        for m in view.members:
            unit_of[m.job] = u.name
    for name in sorted(names - set(unit_of)):
        seg = segs.get(name, 0)
        units[name] = Unit(name, ((name, seg),), submission_comment(pid, name, seg))
        unit_of[name] = name
    return units, unit_of


def unit_order(job_order: list[str], unit_of: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    for j in job_order:
        u = unit_of.get(j)
        if u is not None and u not in out:
            out.append(u)
    return out


def unit_preds(preds: Mapping[str, list[str]], units: Mapping[str, Unit]) -> dict[str, list[str]]:
    """A unit waits for its members' predecessors that are not its members (job names:
    the ids map gives a member the group's Slurm id)."""
    out: dict[str, list[str]] = {}
    for name, u in units.items():
        mine = {j for j, _ in u.members}
        before = sorted({p for j in mine for p in preds.get(j, []) if p not in mine})
        if before:
            out[name] = before
    return out


def group_memory_mb(plan: Plan, view: GroupView) -> int:
    """The smallest GPU memory of the group's GPUs in the plan's cluster (MiB), 0 when the
    cluster does not say: the budget the group's jobs' state shares on each GPU."""
    mem: dict[str, float] = {}
    for n in (plan.cluster or {}).get("nodes", []):
        gb = n.get("gpu_memory_gb")
        names = n.get("names", n.get("name"))
        for name in (names if isinstance(names, list) else [names]):
            if gb:
                mem[str(name)] = float(gb)
    known = [mem[s.node] for s in view.slots if s.node in mem]
    if len(known) < len(view.slots):
        return 0
    return int(math.floor(min(known) * 1024))


def render_groups(plan: Plan, pid: str, units: Mapping[str, Unit], *, plan_path: Path,
                  log_dir: Path, partition: str | None, pin_nodes: bool,
                  sbatch: SbatchOptions, site: Site | None = None
                  ) -> dict[str, tuple[int, Script]]:
    """Each group unit's script: the time limit from the group's span (``time_limit``)."""
    out: dict[str, tuple[int, Script]] = {}
    for name, u in units.items():
        view = u.group
        if view is None:
            continue
        for job in view.jobs:
            spec = plan.job(job).spec
            if spec is not None and spec.command and not spec.entrypoint:
                raise UnrunnableError("plan", f"job {job!r} of group {view.group!r} is a "
                                      "command; a co-location group trains built-in "
                                      "workloads and entrypoints only (the group runtime "
                                      "builds each model): plan it alone", f"job {job!r}")
        limit, warn = (site or Site(partition)).limit(view.group, sbatch,
                                                      view.end_s - view.start_s)
        seg = min(m.segment for m in view.members)
        out[name] = (seg, render_group(pid, view, plan_path=plan_path, log_dir=log_dir,
                                       partition=partition, pin_nodes=pin_nodes, sbatch=sbatch,
                                       time_min=limit, signal_s=warn,
                                       memory_mb=group_memory_mb(plan, view),
                                       gres_names=site.gres_names if site else None))
    return out
