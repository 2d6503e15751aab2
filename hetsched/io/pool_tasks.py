"""The ``tasks`` section of a pool plan, checked, bounded and typed when the plan is loaded.

Every number against :data:`hetsched.core.limits.POOL`, every job name against the
plan, every row's round and task inside its job's, and the tasks the runs stand
for counted (``repeat`` times the run's rows) before anything is expanded, so a
hostile or damaged plan is one line (exit 2) in ``exec``, ``submit`` and
``submit --dry-run`` alike, never a MemoryError or a traceback. What comes out is the typed
:class:`~hetsched.core.pool_tasks.PoolTasks`; nothing after this parses the section again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetsched.core import limits
from hetsched.core.pool_tasks import (
    COLUMNS,
    UNEVEN_COLUMNS,
    GpuTasks,
    PoolJobTasks,
    PoolTasks,
    TaskRun,
    memory_from_dict,
    row_from_list,
)
from hetsched.errors import InputError

#: the columns of a run's rows
ROW_COLUMNS = COLUMNS
JOB_FIELDS = ("tasks_per_round", "rounds", "iterations_per_task", "last_round_iterations",
              "local_batch")


def _num(v: Any, key: str, src: str, where: str) -> Any:
    why = limits.check_number(v, limits.POOL[key])
    if why is not None:
        raise InputError(src, f"{key}: {why}", where)
    return v


def _mapping(v: Any, src: str, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise InputError(src, f"expected a mapping, got {type(v).__name__}", where)
    return v


def _list(v: Any, src: str, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise InputError(src, f"expected a list, got {type(v).__name__}", where)
    return v


#: the section's keys :class:`PoolTasks` models (the others are kept in ``extra``)
_KNOWN = ("format", "columns", "switch_s", "jobs", "total_tasks", "stored_rows", "memory",
          "gpus")


def _chunk(v: Any, src: str, where: str) -> dict[str, int] | None:
    """A job's ``chunk`` (GPU type -> samples per executor iteration), or None."""
    if v is None:
        return None
    out: dict[str, int] = {}
    for t, n in _mapping(v, src, f"{where}.chunk").items():
        if not isinstance(t, str) or not t or len(t) > 64:
            raise InputError(src, "GPU type names must be non-empty strings",
                             f"{where}.chunk")
        _num(n, "local_batch", src, f"{where}.chunk.{t}")
        out[t] = int(n)
    return out


def parse_pool_tasks(tasks: Any, src: str, plan_jobs: set[str]) -> PoolTasks:
    """The typed ``tasks`` section of a plan with jobs ``plan_jobs``; InputError (one
    line: file, field, what is valid) unless it is well-formed and bounded."""
    t = _mapping(tasks, src, "tasks")
    jobs = _mapping(t.get("jobs"), src, "tasks.jobs")
    shape: dict[str, tuple[int, int]] = {}
    typed_jobs: dict[str, PoolJobTasks] = {}
    for name, d in jobs.items():
        where = f"tasks.jobs.{str(name)[:80]}"
        if name not in plan_jobs:
            raise InputError(src, "not a job of the plan's 'jobs'", where)
        d = _mapping(d, src, where)
        for key in JOB_FIELDS:
            if key not in d:
                raise InputError(src, f"missing {key!r} (an integer >= 1)", where)
            _num(d[key], key, src, where)
        if "model_memory_gb" in d:
            _num(d["model_memory_gb"], "model_memory_gb", src, where)
        shape[str(name)] = (int(d["rounds"]), int(d["tasks_per_round"]))
        typed_jobs[str(name)] = PoolJobTasks(
            int(d["tasks_per_round"]), int(d["rounds"]), int(d["iterations_per_task"]),
            int(d["last_round_iterations"]), int(d["local_batch"]), d.get("model_memory_gb"),
            _chunk(d.get("chunk"), src, where))
    gpus = _list(t.get("gpus"), src, "tasks.gpus")
    if len(gpus) > limits.MAX_TOTAL_GPUS:
        raise InputError(src, f"{len(gpus)} GPUs; the limit is {limits.MAX_TOTAL_GPUS}",
                         "tasks.gpus")
    total = 0
    seen: set[tuple[str, int]] = set()
    typed_gpus: list[GpuTasks] = []
    for gi, g in enumerate(gpus):
        where = f"tasks.gpus[{gi}]"
        g = _mapping(g, src, where)
        for key in ("node", "gpu_type"):
            v = g.get(key)
            if not isinstance(v, str) or not v or len(v) > 256:
                raise InputError(src, f"{key!r} must be a non-empty string", where)
        if "gpu" not in g:
            raise InputError(src, "missing 'gpu' (the GPU's index on its node)", where)
        _num(g["gpu"], "gpu", src, where)
        if (g["node"], g["gpu"]) in seen:
            raise InputError(src, f"GPU {g['gpu']} of node {g['node']!r} is listed twice",
                             where)
        seen.add((g["node"], g["gpu"]))
        _num(g.get("tasks", 0), "tasks", src, where)
        if "memory_gb" in g:
            _num(g["memory_gb"], "memory_gb", src, where)
        runs: list[TaskRun] = []
        for ri, run in enumerate(_list(g.get("runs", []), src, f"{where}.runs")):
            rw = f"{where}.runs[{ri}]"
            run = _mapping(run, src, rw)
            repeat = _num(run.get("repeat", 1), "repeat", src, rw)
            step = _num(run.get("round_step", 0), "round_step", src, rw)
            _num(run.get("period_s", 0.0), "period_s", src, rw)
            rows = _list(run.get("tasks"), src, f"{rw}.tasks")
            total += int(repeat) * len(rows)
            if total > limits.MAX_POOL_TASKS:
                raise InputError(src, f"the runs stand for more than {limits.MAX_POOL_TASKS:,}"
                                 " tasks (hetsched's limit)", rw)
            for k, row in enumerate(rows):
                _row(row, src, f"{rw}.tasks[{k}]", shape, int(repeat), int(step))
            runs.append(TaskRun(tuple(row_from_list(r) for r in rows), int(repeat),
                                run.get("period_s"), run.get("round_step")))
        typed_gpus.append(GpuTasks(g["node"], int(g["gpu"]), g["gpu_type"], tuple(runs),
                                   int(g.get("tasks", 0)), g.get("memory_gb")))
    switch = t.get("switch_s")
    columns = t.get("columns")
    return PoolTasks(
        typed_jobs, typed_gpus,
        format=str(t["format"]) if isinstance(t.get("format"), str) else None,
        columns=tuple(str(c) for c in columns) if isinstance(columns, list) else None,
        switch_s=switch if isinstance(switch, (int, float)) else None,
        total_tasks=_opt_int(t.get("total_tasks")), stored_rows=_opt_int(t.get("stored_rows")),
        memory=memory_from_dict(t.get("memory")),
        extra={k: v for k, v in t.items() if k not in _KNOWN})


def _opt_int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _row(row: Any, src: str, where: str, shape: Mapping[str, tuple[int, int]], repeat: int,
         step: int) -> None:
    if not isinstance(row, list) or len(row) not in (len(ROW_COLUMNS), len(UNEVEN_COLUMNS)):
        raise InputError(src, f"a task row is a list of {len(ROW_COLUMNS)} values "
                         f"({', '.join(ROW_COLUMNS)}), or {len(UNEVEN_COLUMNS)} with the "
                         "task's own local_batch and iterations", where)
    job, rnd, task, *times, memory, evict = row[:len(ROW_COLUMNS)]
    if len(row) == len(UNEVEN_COLUMNS):
        _num(row[-2], "local_batch", src, where)
        _num(row[-1], "iterations_per_task", src, where)
    if not isinstance(job, str) or job not in shape:
        raise InputError(src, f"task of unknown job {str(job)[:80]!r} (jobs of "
                         f"tasks.jobs: {', '.join(sorted(shape)[:10])})", where)
    rounds, per_round = shape[job]
    for v, name in ((rnd, "round"), (task, "task")):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(src, f"{name} must be an integer, got {str(v)[:40]!r}", where)
    last = rnd + (repeat - 1) * step
    if not 0 <= rnd or last >= rounds:
        reach = f" (its run's repeats reach round {last})" if last != rnd else ""
        raise InputError(src, f"job {job!r} has rounds 0..{rounds - 1}; this row is round "
                         f"{rnd}{reach}", where)
    if not 0 <= task < per_round:
        raise InputError(src, f"task {task} of job {job!r}, which has tasks "
                         f"0..{per_round - 1} per round", where)
    for v in times:
        _num(v, "time_s", src, where)
    if memory not in ("keep", "evict"):
        raise InputError(src, f"memory must be 'keep' or 'evict', got {str(memory)[:40]!r}",
                         where)
    if not isinstance(evict, list) or not all(isinstance(e, str) for e in evict):
        raise InputError(src, "evict must be a list of job names", where)
