"""A pool plan as the executor needs it: jobs, GPUs (with ids) and each GPU's task sequence.

Torch-free. A GPU's id is ``<node>-g<index>`` (e.g. ``v100-1-g0``): unique in a
plan, safe in file names, and parsed unambiguously by ``rsplit("-g", 1)``.
Task ``t`` of a round trains slice ``t`` of each global batch of the round:
the job's global batch ``B`` split into ``P`` contiguous slices of sizes
``split_counts(B, [b]*P)`` (``b = ceil(B/P)`` is the plan's ``local_batch``,
so the last slices may be one sample smaller); an epoch's last, partial batch
is split in proportion (:func:`hetsched.runtime.sampler.split_counts`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsched.core.plan import Plan
from hetsched.core.pool_tasks import TASKS_FORMAT
from hetsched.core.spec import Job
from hetsched.errors import InputError
from hetsched.runtime.sampler import split_counts

__all__ = ["TASKS_FORMAT", "ExecGpu", "ExecJob", "ExecPlan", "ExecTask", "exec_plan", "gpu_id"]


def gpu_id(node: str, index: int) -> str:
    return f"{node}-g{int(index)}"


@dataclass(frozen=True)
class ExecJob:
    """One job of the pool plan: its spec (validated when the plan was loaded) and round
    structure."""

    name: str
    spec: Job
    tasks_per_round: int
    rounds: int
    iterations: int  # per full round
    last_iterations: int
    slice_batch: int
    memory_gb: float

    @property
    def global_batch(self) -> int:
        return self.spec.global_batch

    @property
    def dataset_size(self) -> int:
        return self.spec.dataset_size

    def round_iterations(self, r: int) -> int:
        return self.last_iterations if r == self.rounds - 1 else self.iterations

    def slices(self) -> list[int]:
        """Sizes of the P slices of one full global batch (task order)."""
        return split_counts(self.global_batch, [self.slice_batch] * self.tasks_per_round)

    def steps_per_epoch(self) -> int:
        return -(-self.dataset_size // self.global_batch)

    def step_samples(self, step: int) -> tuple[int, int]:
        """(offset in the epoch's permutation, samples) of global step ``step``."""
        within = step % self.steps_per_epoch()
        off = within * self.global_batch
        return off, min(self.global_batch, self.dataset_size - off)

    def task_counts(self, r: int, task: int) -> list[int]:
        """Samples task ``task`` of round ``r`` trains in each of its iterations."""
        out = []
        for k in range(self.round_iterations(r)):
            _, n = self.step_samples(r * self.iterations + k)
            out.append(split_counts(n, self.slices())[task])
        return out

    def round_samples(self, r: int) -> int:
        return sum(self.step_samples(r * self.iterations + k)[1]
                   for k in range(self.round_iterations(r)))


@dataclass(frozen=True)
class ExecTask:
    """One row of a GPU's sequence (plan times in seconds from the plan's start)."""

    job: str
    round: int
    task: int
    start_s: float
    end_s: float
    keep: bool
    evict: tuple[str, ...]


@dataclass(frozen=True)
class ExecGpu:
    id: str
    node: str
    index: int
    gpu_type: str
    memory_gb: float
    tasks: tuple[ExecTask, ...]


@dataclass(frozen=True)
class ExecPlan:
    plan_id: str
    jobs: dict[str, ExecJob]
    gpus: dict[str, ExecGpu]  # in the plan's order

    def gpu_ids(self) -> list[str]:
        return list(self.gpus)


def exec_plan(plan: Plan, source: str = "plan") -> ExecPlan:
    """The executor's view of a pool plan; one clear line (InputError) for anything else."""
    tasks = plan.tasks
    if plan.mode != "pool" or tasks is None:
        raise InputError(source, f"is a {plan.mode}-mode plan; `hetsched exec` runs pool plans "
                         "(make one with `hetsched plan --mode pool`); use `hetsched run`",
                         "mode")
    if tasks.format != TASKS_FORMAT:
        raise InputError(source, f"tasks format {tasks.format!r} is not "
                         f"{TASKS_FORMAT!r}", "tasks.format")
    specs = {j.name: j.spec for j in plan.jobs}
    jobs: dict[str, ExecJob] = {}
    for name, d in tasks.jobs.items():
        spec = specs.get(name)
        if spec is None:
            raise InputError(source, "the plan has no spec for this job", f"job {name!r}")
        jobs[name] = ExecJob(name, spec, d.tasks_per_round, d.rounds, d.iterations_per_task,
                             d.last_round_iterations, d.local_batch,
                             float(d.model_memory_gb or 0.0))
    gpus: dict[str, ExecGpu] = {}
    for g in tasks.gpus:
        rows = [ExecTask(r.job, r.round, r.task, float(r.start_s), float(r.end_s), r.keep,
                         r.evict) for r in g.rows()]
        for t in rows:
            if t.job not in jobs:
                raise InputError(source, f"task of unknown job {t.job!r}", "tasks.gpus")
        gid = gpu_id(g.node, g.gpu)
        gpus[gid] = ExecGpu(gid, g.node, int(g.gpu), g.gpu_type.lower(),
                            float(g.memory_gb or 0.0), tuple(rows))
    return ExecPlan(str(plan.plan_id or plan.to_dict()["plan_id"]), jobs, gpus)
