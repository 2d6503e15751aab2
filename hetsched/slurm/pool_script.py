"""Render a pool-mode plan as ONE heterogeneous Slurm job (``job_templates/pool.sbatch.j2``).

A pool plan (Hare's task-level sharing) gives each GPU of the pool an ordered
task sequence (the plan's ``tasks`` section). It runs as one hetjob holding
every GPU that has tasks: one component per (GPU type, node) group, each
asking for its GPUs by type (``--gres=gpu:TYPE:N``), and one step across all
components that starts one ``hetsched exec`` per GPU. Task ``k`` of the step
(Slurm's global ``SLURM_PROCID``, numbered component by component and then
task by task, as for space-mode hetjobs) runs the plan GPU at position ``k``
of ``HETSCHED_POOL_GPUS``. When one executor dies the coordinator fails the
pool job: every other executor exits non-zero with one line naming the lost
GPU (docs/executor.md), so the job ends FAILED and ``hetsched replan`` can act.
(``srun --kill-on-bad-exit`` is not used: it would kill them before they say why.)

Space-mode plans never come here and pool plans never go through
``render_hetjob``: the two scripts differ in shape (one job per planned job
versus one job for the whole pool).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hetsched.core.plan import Plan
from hetsched.core.pool_tasks import PoolTasks
from hetsched.core.sbatch import SbatchOptions
from hetsched.slurm.templates import (
    Component,
    Script,
    TemplateValueError,
    _render,
    component_fields,
    hetsched_executable,
    sbatch_fields,
)

TEMPLATE = "pool.sbatch.j2"


@dataclass(frozen=True)
class PoolGpu:
    """One GPU of a pool plan that has tasks: where it is and its id in the plan."""

    node: str
    index: int
    gpu_type: str
    tasks: int

    @property
    def gpu_id(self) -> str:
        return pool_gpu_id(self.node, self.index)


def pool_gpu_id(node: str, index: int) -> str:
    """A plan GPU's id, ``<node>-g<index>`` (``hetsched exec --gpu``, report file names).

    The executor names GPUs the same way (``runtime.executor.plan.gpu_id``; the
    layers keep this module from importing it, a test checks they agree).
    """
    return f"{node}-g{int(index)}"


def pool_gpus(tasks: PoolTasks | None, source: str = "plan") -> list[PoolGpu]:
    """The plan's GPUs with tasks, in the step's task order (component by component).

    Components are (GPU type, node) groups in first-seen order of the plan's
    ``tasks.gpus``; within one, GPUs in plan order. Raises TemplateValueError
    when the plan has no tasks section or no GPU with tasks.
    """
    if tasks is None:
        raise TemplateValueError(source, "a pool-mode plan needs its 'tasks' section "
                                 "(per-GPU task sequences); plan again with --mode pool",
                                 "tasks")
    groups: dict[tuple[str, str], list[PoolGpu]] = {}
    for g in tasks.gpus:
        if g.tasks <= 0:
            continue
        gpu = PoolGpu(g.node, int(g.gpu), g.gpu_type, g.tasks)
        groups.setdefault((gpu.gpu_type, gpu.node), []).append(gpu)
    out = [g for grp in groups.values() for g in grp]
    if not out:
        raise TemplateValueError(source, "the pool plan has no GPU with tasks", "tasks.gpus")
    return out


def pool_components(gpus: Sequence[PoolGpu]) -> list[Component]:
    """One hetjob component per (GPU type, node) group, in ``pool_gpus`` order."""
    comps: dict[tuple[str, str], int] = {}
    for g in gpus:
        comps[(g.gpu_type, g.node)] = comps.get((g.gpu_type, g.node), 0) + 1
    return [Component(t, n, k, (1,) * k) for (t, n), k in comps.items()]


def key_path(plan_path: str | Path) -> Path:
    """Where a pool job's secret lives: beside the plan copy, ``plans/<plan_id>.key``."""
    return Path(plan_path).with_suffix(".key")


def pool_comment(plan_id: str) -> str:
    """The ``--comment`` tag of a pool plan's hetjob (never matches a space-mode tag)."""
    return f"hetsched-pool:{plan_id}"


def render_pool(plan: Plan, plan_id: str, *, plan_path: str | Path, log_dir: str | Path,
                report_dir: str | Path, checkpoint_dir: str | Path,
                key_file: str | Path | None = None, partition: str | None = None, pin_nodes: bool = True,
                hetsched: str | None = None, directory: Path | None = None,
                job_name: str | None = None, sbatch: SbatchOptions | None = None,
                time_min: int = 0, gres_names: Mapping[str, str] | None = None) -> Script:
    """The one hetjob script of a pool-mode plan.

    ``sbatch`` adds account/QoS/memory/constraint/extra options to every
    component; ``time_min`` is the time limit (``sbatch.time`` wins; 0: none).
    ``key_file`` is the pool job's secret (default: :func:`key_path` of the plan).
    ``gres_names``: each GPU type as Slurm spells it (``--gres=gpu:TYPE:N``).
    """
    if plan.mode != "pool":
        raise TemplateValueError("plan", f"render_pool needs a pool-mode plan, not {plan.mode!r}",
                                 "mode")
    gpus = pool_gpus(plan.tasks)
    comps = pool_components(gpus)
    ctx = {
        "plan_id": plan_id,
        "job_name": job_name or f"hetsched-pool-{plan_id}",
        "components": component_fields(comps, pin_nodes, gres_names),
        "partition": partition or "",
        "comment": pool_comment(plan_id),
        "log_dir": str(log_dir),
        "pool_gpus": ",".join(g.gpu_id for g in gpus),
        "het_groups": ",".join(str(i) for i in range(len(comps))),
        "hetsched": hetsched or hetsched_executable(),
        "plan_path": str(plan_path),
        "report_dir": str(report_dir),
        "checkpoint_dir": str(checkpoint_dir),
        "key_file": str(key_file if key_file is not None else key_path(plan_path)),
        **sbatch_fields(sbatch, time_min),
    }
    return Script(_render(TEMPLATE, directory, ctx), comps)
