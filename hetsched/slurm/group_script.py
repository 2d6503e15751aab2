"""Render a co-location group as ONE Slurm job (``job_templates/group.sbatch.j2``).

A group's jobs share the same GPUs at the same time (``core.groups``). Their
submission is one heterogeneous job holding those GPUs — one component per
(GPU type, node), as a plain job's — and one step with one task per GPU;
every task runs ``hetsched run --group G``, which trains all the group's jobs
on its GPU (runtime/group.py). One step with every job in each task, rather
than one step per job: the jobs' computations must take turns on each GPU
and their communications overlap those turns, which one process per GPU
arranges with a lock-free loop; separate steps (separate processes) would
contend for the GPU, as the naive co-location Harmony improves on.

The ``--comment`` tag is ``hetsched:<plan>:group=<group>:<segment>`` — the
space-mode tag's shape, so the crash recovery and rollback of ``app.submit``
find it, with a "job" part no job name can have (``=``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hetsched.core.groups import GroupView
from hetsched.core.sbatch import SbatchOptions
from hetsched.slurm.templates import (
    Component,
    Script,
    _render,
    component_fields,
    hetsched_executable,
    sbatch_fields,
)

TEMPLATE = "group.sbatch.j2"


def group_unit(group: str) -> str:
    """The group's stand-in for a job name in tags and submission order."""
    return f"group={group}"


def group_comment(plan_id: str, group: str, segment: int = 0) -> str:
    return f"hetsched:{plan_id}:{group_unit(group)}:{segment}"


def render_group(plan_id: str, view: GroupView, *, plan_path: str | Path,
                 log_dir: str | Path, partition: str | None = None, pin_nodes: bool = True,
                 hetsched: str | None = None, directory: Path | None = None,
                 sbatch: SbatchOptions | None = None, time_min: int = 0, signal_s: int = 0,
                 memory_mb: int = 0, gres_names: Mapping[str, str] | None = None) -> Script:
    """The group's one script; ``memory_mb`` > 0 is the device memory its jobs may hold
    together (beyond it idle jobs are spilled and reloaded); ``gres_names``: each GPU
    type as Slurm spells it."""
    comps = [Component(t, n, k, (1,) * k) for t, n, k in view.components()]
    ctx = {
        "plan_id": plan_id,
        "job_name": f"hetsched-{view.group}",
        "group": view.group,
        "components": component_fields(comps, pin_nodes, gres_names),
        "partition": partition or "",
        "comment": group_comment(plan_id, view.group),
        "log_dir": str(log_dir),
        "gpu_types": ",".join(s.gpu_type for s in view.slots),
        "rank_nodes": ",".join(s.node for s in view.slots),
        "het_groups": ",".join(str(i) for i in range(len(comps))),
        "hetsched": hetsched or hetsched_executable(),
        "plan_path": str(plan_path),
        "memory_mb": int(memory_mb),
        **sbatch_fields(sbatch, time_min),
        "signal_s": signal_s,
    }
    return Script(_render(TEMPLATE, directory, ctx), comps)
