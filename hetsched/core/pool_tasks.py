"""A pool plan's ``tasks`` section, typed: each job's rounds, each GPU's task sequence.

The planner builds a :class:`PoolTasks` (``planning.pool.evaluator.tasks_section``),
:meth:`PoolTasks.to_dict` writes it into the plan file (docs/formats.md, "Pool
plans"), and :func:`hetsched.io.pool_tasks.parse_pool_tasks` reads it back,
checked and bounded, once, when the plan is loaded. Every reader after that
(submit, status, replan, the executor, the renderers) gets attributes, never
positional rows.

A GPU's sequence is stored as *runs*: a pattern of rows and a repeat count;
repetition ``k`` (0-based) is the pattern with ``round + k * round_step`` and
every time shifted by ``k * period_s`` (``planning.pool.compact`` finds them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

#: the format tag of the section (``tasks.format``)
TASKS_FORMAT = "hetsched-pool-runs/1"
#: the columns of a stored task row, in order (``tasks.columns``)
COLUMNS = ("job", "round", "task", "start_s", "end_s", "sync_end_s", "memory", "evict")
#: the columns of a row that carries its own share of the job's global batch (an *uneven*
#: task: a space plan's worker, or any task whose round splits the batch unequally) and
#: its iterations; a row of :data:`COLUMNS` alone trains the job's equal slice
UNEVEN_COLUMNS = COLUMNS + ("local_batch", "iterations")


def fused_steps(chunk: int | None, slice_batch: int, steps: int) -> int:
    """How many of a task's steps one executor iteration trains at once.

    A pool task trains its slice of each of its round's ``steps`` global batches and
    sums their gradients for the round's one optimizer step. Training ``m`` of those
    slices in one forward and backward pass (``m * slice_batch`` samples) gives the
    same sum with one pass's fixed cost instead of ``m``; ``chunk`` is the most
    samples one pass may hold on the task's GPU type (the planner's choice, within the
    profile's largest batch; None: one slice per pass). The planner times a task and
    the executor runs it with this one rule.
    """
    if not chunk or slice_batch < 1 or steps < 1:
        return 1
    return max(1, min(int(steps), int(chunk) // int(slice_batch)))


def step_groups(steps: int, m: int) -> list[range]:
    """A task's steps ``0..steps-1`` in passes of ``m`` consecutive steps (the last may
    hold fewer)."""
    m = max(1, int(m))
    return [range(k, min(k + m, steps)) for k in range(0, steps, m)]


class TaskRow(NamedTuple):
    """One task on one GPU: task ``task`` of round ``round`` of ``job``.

    Times are seconds from the plan's start; ``keep`` says whether the task's
    own model stays on the GPU after it (``memory: "keep"``, else ``"evict"``),
    ``evict`` names the other jobs' models to drop after it. ``local_batch`` and
    ``iterations``: the task's own share of the job's global batch and its iterations
    (None: the job's equal slice ``local_batch`` and its round's iterations).
    """

    job: str
    round: int
    task: int
    start_s: float
    end_s: float
    sync_end_s: float
    keep: bool = True
    evict: tuple[str, ...] = ()
    local_batch: int | None = None
    iterations: int | None = None

    @property
    def memory(self) -> str:
        return "keep" if self.keep else "evict"

    def to_list(self) -> list[Any]:
        """The row as the plan file stores it (:data:`COLUMNS`)."""
        job, rnd, task, start, end, sync_end, keep, evict, batch, iters = self
        out = [job, rnd, task, start, end, sync_end, "keep" if keep else "evict", list(evict)]
        return out if batch is None else out + [batch, iters]

    def repeated(self, rep: int, round_step: int, period_s: float) -> TaskRow:
        """Repetition ``rep`` of this row in its run."""
        if rep == 0:
            return self
        job, rnd, task, start, end, sync_end, keep, evict, batch, iters = self
        sh = rep * period_s
        return TaskRow(job, rnd + rep * round_step, task, start + sh, end + sh, sync_end + sh,
                       keep, evict, batch, iters)


@dataclass(frozen=True)
class TaskRun:
    """A pattern of rows repeated ``repeat`` times (``period_s``/``round_step``: None
    when the file leaves them out, as it does for a run that repeats nothing)."""

    rows: tuple[TaskRow, ...]
    repeat: int = 1
    period_s: float | None = None
    round_step: int | None = None

    def __len__(self) -> int:
        """The tasks the run stands for."""
        return self.repeat * len(self.rows)

    def expand(self) -> Iterator[TaskRow]:
        period, step = self.period_s or 0.0, self.round_step or 0
        for rep in range(self.repeat):
            for row in self.rows:
                yield row.repeated(rep, step, period)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"repeat": self.repeat, "tasks": [r.to_list() for r in self.rows]}
        if self.period_s is not None:
            d["period_s"] = self.period_s
        if self.round_step is not None:
            d["round_step"] = self.round_step
        return d


@dataclass(frozen=True)
class PoolJobTasks:
    """A job's round structure: ``rounds`` rounds of ``tasks_per_round`` tasks, each
    ``iterations_per_task`` iterations (the last round ``last_round_iterations``)
    at ``local_batch`` samples. In a plan whose rows carry their own batch and
    iterations (:data:`UNEVEN_COLUMNS`) these are the largest of any round (tasks,
    iterations, batch) and the last round's iterations; the rows say the rest."""

    tasks_per_round: int
    rounds: int
    iterations_per_task: int
    last_round_iterations: int
    local_batch: int
    model_memory_gb: float | None = None
    #: per GPU type, the most samples one executor iteration trains (:func:`fused_steps`);
    #: None (a plan without it): one step's slice per iteration
    chunk: dict[str, int] | None = None

    @property
    def iterations(self) -> int:
        """The job's iterations over all its rounds (equal rounds; for uneven tasks
        :meth:`PoolTasks.iterations_before` sums the rows)."""
        return (self.rounds - 1) * self.iterations_per_task + self.last_round_iterations

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"tasks_per_round": self.tasks_per_round, "rounds": self.rounds,
                             "iterations_per_task": self.iterations_per_task,
                             "last_round_iterations": self.last_round_iterations,
                             "local_batch": self.local_batch}
        if self.model_memory_gb is not None:
            d["model_memory_gb"] = self.model_memory_gb
        if self.chunk:
            d["chunk"] = dict(self.chunk)
        return d


@dataclass(frozen=True)
class GpuTasks:
    """One GPU of the pool and its task sequence (``tasks``: how many tasks it runs)."""

    node: str
    gpu: int
    gpu_type: str
    runs: tuple[TaskRun, ...] = ()
    tasks: int = 0
    memory_gb: float | None = None

    @property
    def id(self) -> str:
        """``<node>-g<index>``: unique in a plan, safe in file names."""
        return f"{self.node}-g{int(self.gpu)}"

    def rows(self) -> list[TaskRow]:
        """The task sequence, expanded, in order."""
        return [r for run in self.runs for r in run.expand()]

    def stored_rows(self) -> int:
        return sum(len(run.rows) for run in self.runs)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"node": self.node, "gpu": self.gpu, "gpu_type": self.gpu_type}
        if self.memory_gb is not None:
            d["memory_gb"] = self.memory_gb
        d["tasks"] = self.tasks
        d["runs"] = [r.to_dict() for r in self.runs]
        return d


@dataclass(frozen=True)
class PoolMemory:
    """The memory plan's counts: tasks that load their model, tasks that find it loaded."""

    model_loads: int = 0
    warm_starts: int = 0


@dataclass
class PoolTasks:
    """The ``tasks`` section of a pool plan. Optional facts (None) are left out of the
    file; ``extra`` keeps keys this version does not model, as read."""

    jobs: dict[str, PoolJobTasks]
    gpus: list[GpuTasks]
    format: str | None = TASKS_FORMAT
    columns: tuple[str, ...] | None = COLUMNS
    switch_s: float | None = None
    total_tasks: int | None = None
    stored_rows: int | None = None
    memory: PoolMemory | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def iterations_before(self, job: str, rounds: int) -> int:
        """Iterations job ``job`` runs in its rounds ``0..rounds-1``: from the rows where
        they carry their own (uneven tasks), else ``rounds * iterations_per_task``."""
        own = {r.round: r.iterations for g in self.gpus for r in g.rows()
               if r.job == job and r.iterations is not None}
        if not own:
            return rounds * self.jobs[job].iterations_per_task
        return sum(own.get(r, 0) for r in range(rounds))

    def gpu(self, node: str, index: int) -> GpuTasks:
        for g in self.gpus:
            if g.node == node and int(g.gpu) == int(index):
                return g
        raise KeyError(f"{node}-g{index}")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {} if self.format is None else {"format": self.format}
        if self.columns is not None:
            d["columns"] = list(self.columns)
        if self.switch_s is not None:
            d["switch_s"] = self.switch_s
        d["jobs"] = {name: j.to_dict() for name, j in self.jobs.items()}
        if self.total_tasks is not None:
            d["total_tasks"] = self.total_tasks
        if self.stored_rows is not None:
            d["stored_rows"] = self.stored_rows
        if self.memory is not None:
            d["memory"] = {"model_loads": self.memory.model_loads,
                           "warm_starts": self.memory.warm_starts}
        d["gpus"] = [g.to_dict() for g in self.gpus]
        d.update({k: v for k, v in self.extra.items() if k not in d})
        return d


def row_from_list(row: Any) -> TaskRow:
    """A stored row (already checked, :func:`hetsched.io.pool_tasks.parse_pool_tasks`)."""
    job, rnd, task, start, end, sync_end, memory, evict, *own = row
    batch, iters = (int(own[0]), int(own[1])) if own else (None, None)
    return TaskRow(job, rnd, task, start, end, sync_end, memory == "keep", tuple(evict),
                   batch, iters)


def memory_from_dict(d: Mapping[str, Any] | None) -> PoolMemory | None:
    if not isinstance(d, Mapping):
        return None
    return PoolMemory(int(d.get("model_loads", 0)), int(d.get("warm_starts", 0)))
