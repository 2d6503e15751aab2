"""A pool plan as the executor needs it: jobs, GPUs (with ids) and each GPU's task sequence.

Torch-free. A GPU's id is ``<node>-g<index>`` (e.g. ``v100-1-g0``): unique in a
plan, safe in file names, and parsed unambiguously by ``rsplit("-g", 1)``.
Task ``t`` of a round trains slice ``t`` of each global batch of the round:
the job's global batch ``B`` split into ``P`` contiguous slices of sizes
``split_counts(B, [b]*P)`` (``b = ceil(B/P)`` is the plan's ``local_batch``,
so the last slices may be one sample smaller); an epoch's last, partial batch
is split in proportion (:func:`hetsched.runtime.sampler.split_counts`).
A plan whose task rows carry their own ``local_batch`` and ``iterations``
(uneven tasks, e.g. a space plan's workers) gives each round its own slices
(its tasks' local batches, in task order) and iterations: ``ExecJob.layout``.
A task trains its steps' slices in passes of several steps where the plan's
``chunk`` allows (:meth:`ExecJob.passes`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hetsched.core.plan import Plan
from hetsched.core.pool_tasks import TASKS_FORMAT, fused_steps, step_groups
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
    #: uneven tasks: per round (iterations, local batch of each task in task order);
    #: None: every round has ``tasks_per_round`` equal slices
    layout: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    #: GPU type -> most samples one pass trains (the plan's ``chunk``); absent: a slice
    chunk: Mapping[str, int] = field(default_factory=dict)

    @property
    def global_batch(self) -> int:
        return self.spec.global_batch

    @property
    def dataset_size(self) -> int:
        return self.spec.dataset_size

    def round_iterations(self, r: int) -> int:
        if self.layout is not None:
            return self.layout[r][0]
        return self.last_iterations if r == self.rounds - 1 else self.iterations

    def round_step(self, r: int) -> int:
        """The job's global step at which round ``r`` starts."""
        if self.layout is None:
            return r * self.iterations
        return self._round_starts[r]

    @functools.cached_property
    def _round_starts(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate((n for n, _ in self.layout or ()), initial=0))

    def tasks_in(self, r: int) -> int:
        """Tasks of round ``r``."""
        return self.tasks_per_round if self.layout is None else len(self.layout[r][1])

    def slices(self, r: int = 0) -> list[int]:
        """Sizes of round ``r``'s slices of one full global batch (task order)."""
        if self.layout is not None:
            return list(self.layout[r][1])
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
        first, slices = self.round_step(r), self.slices(r)
        for k in range(self.round_iterations(r)):
            _, n = self.step_samples(first + k)
            out.append(split_counts(n, slices)[task])
        return out

    def passes(self, r: int, task: int, gpu_type: str) -> list[range]:
        """Round ``r``'s steps as task ``task`` on a GPU of ``gpu_type`` trains them: in
        passes of ``fused_steps`` consecutive steps' slices (``core.pool_tasks``, the
        rule the planner timed the task with)."""
        n = self.round_iterations(r)
        b = self.slice_batch if self.layout is None else self.layout[r][1][task]
        return step_groups(n, fused_steps(self.chunk.get(gpu_type.lower()), b, n))

    def round_samples(self, r: int) -> int:
        first = self.round_step(r)
        return sum(self.step_samples(first + k)[1] for k in range(self.round_iterations(r)))


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


def _layout(source: str, job: ExecJob, shares: dict[tuple[int, int], tuple[int, int]],
            done: int | None = None) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Each round's (iterations, task batches) from rows with their own batch; one clear
    line unless every round has tasks 0..k-1 with one iteration count and batches adding
    up to the job's global batch. Rounds before the first one listed are done (a
    replanned remainder, rounds renumbered to continue): ``iterations_per_task`` each, or
    ``done`` steps in all (the plan's ``resume``), no tasks."""
    first = min(r for r, _ in shares)
    out: list[tuple[int, tuple[int, ...]]] = [(job.iterations if done is None else 0, ())] * first
    out[-1:] = [(done, ())] if done is not None and first else out[-1:]  # done: steps before
    for r in range(first, job.rounds):
        k = 0
        batches, iters = [], set()
        while (r, k) in shares:
            b, n = shares[(r, k)]
            batches.append(b)
            iters.add(n)
            k += 1
        if not batches or len(iters) != 1 or sum(batches) != job.global_batch:
            raise InputError(source, f"round {r}: its tasks must be 0..k-1 with one iteration "
                             f"count and local batches adding up to {job.global_batch}",
                             f"job {job.name!r}")
        out.append((iters.pop(), tuple(batches)))
    if len(shares) != sum(len(b) for _, b in out):
        raise InputError(source, "a task row lies outside the job's rounds", f"job {job.name!r}")
    return tuple(out)


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
                             float(d.model_memory_gb or 0.0),
                             chunk={t.lower(): int(n) for t, n in (d.chunk or {}).items()})
    own: dict[str, dict[tuple[int, int], tuple[int, int]]] = {}
    for g in tasks.gpus:
        for r in g.rows():
            if r.local_batch is not None and r.iterations is not None:
                own.setdefault(r.job, {})[(r.round, r.task)] = (r.local_batch, r.iterations)
    for name, shares in own.items():
        if name in jobs:
            j = jobs[name]
            done = (plan.notes.resume or {}).get(name, {}).get("iterations_done")
            jobs[name] = replace(j, layout=_layout(source, j, shares, done))
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
