"""The plan file: the one contract between planning, Slurm submission and the runtime.

:func:`load_plan` reads a plan file and returns a typed, validated
:class:`~hetsched.core.plan.Plan`; :func:`plan_from_dict` does the same for a
plan already parsed (one stored in the state store). Everything after
planning (``submit``, ``replan``, ``status``, ``hetsched run``) takes a
``Plan`` from here and never parses plan JSON itself.

The structure is described once, by the pydantic models below; the JSON
Schema published in ``docs/plan.schema.json`` is generated from them
(:func:`json_schema`; a test keeps the file current). Errors are one line:
the file, the field path (``jobs[2].segments[0].workers[1].local_batch``) and
what would be valid.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from hetsched.config import DEFAULT_RESTART_COST_S
from hetsched.core import limits
from hetsched.core.plan import (
    PLAN_VERSION,
    JobPlan,
    Plan,
    PlanNotes,
    PlanSettings,
    Segment,
    Worker,
)
from hetsched.core.pool_tasks import GpuTasks, PoolJobTasks, PoolMemory, PoolTasks, TaskRun
from hetsched.core.spec import GPU_TYPE_RE, NAME_RE
from hetsched.errors import InputError
from hetsched.io.files import atomic_write, read_text
from hetsched.io.pool_tasks import parse_pool_tasks
from hetsched.io.specs import parse_job

#: plan files larger than this are refused before parsing (a 10,000-job plan is ~20 MB)
MAX_PLAN_BYTES = limits.MAX_PLAN_BYTES

Name = Annotated[str, Field(pattern=NAME_RE.pattern, max_length=256)]
GpuType = Annotated[str, Field(pattern=GPU_TYPE_RE.pattern, max_length=64)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    """Sections other tools may extend: unknown keys are kept out of the typed plan."""

    model_config = ConfigDict(extra="allow")


def _model_of(cls: type, base: type[BaseModel], written: dict[str, Any] | None = None,
              defaults: dict[str, Any] | None = None, aliases: dict[str, str] | None = None,
              skip: tuple[str, ...] = (), **bounds: Any) -> type[BaseModel]:
    """The pydantic model of a core dataclass: its fields, types, defaults and
    descriptions (field metadata) as the dataclass declares them; ``bounds`` narrows a
    field's type for validation at this edge (``Annotated[int, Field(ge=0)]``);
    ``written``: keys ``to_dict`` writes beside the fields (derived, informative);
    ``defaults``: a file's default where it differs from the dataclass's (``...``: the
    file must give the field); ``aliases``: the file's key where it differs from the
    field's name; ``skip``: fields the file does not have."""
    hints = typing.get_type_hints(cls)
    defs: dict[str, Any] = dict(written or {})
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kw: dict[str, Any] = {}
        if f.name in (aliases or {}):
            kw["alias"] = (aliases or {})[f.name]
        if f.name in (defaults or {}):
            kw["default"] = (defaults or {})[f.name]
        elif f.default is not dataclasses.MISSING:
            kw["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kw["default_factory"] = f.default_factory
        if "description" in f.metadata:
            kw["description"] = f.metadata["description"]
        defs[f.name] = (bounds.get(f.name, hints[f.name]), Field(**kw))
    doc = cls.__doc__ or ""
    model: type[BaseModel] = create_model(
        f"{cls.__name__}Model", __base__=base,
        __doc__=None if doc.startswith(f"{cls.__name__}(") else doc, **defs)
    return model


WorkerModel = _model_of(
    Worker, _Strict, node=Name, gpu_type=GpuType,
    gpu=Annotated[int, Field(ge=0, lt=int(limits.CLUSTER["gpus"].maximum))],
    local_batch=Annotated[int, Field(ge=0, le=int(limits.JOB["global_batch"].maximum))])

SegmentModel = _model_of(
    Segment, _Strict, start_s=Seconds, end_s=Seconds,
    workers=list[WorkerModel],  # type: ignore[valid-type]
    iteration_s=Seconds, compute_s=Seconds, comm_s=Seconds, iterations=Seconds,
    restart_s=Seconds, global_batch=Annotated[int, Field(ge=1)] | None,
    group=Annotated[str, Field(min_length=1, max_length=128,
                               pattern=r"^[A-Za-z0-9._-]+$")] | None)


JobModel = _model_of(
    JobPlan, _Strict,
    # derived from the segments; informative
    written={k: (float | None, Field(default=None)) for k in ("start_s", "end_s", "jct_s")},
    name=Name,
    weight=Annotated[float, Field(gt=0, le=limits.JOB["weight"].maximum, allow_inf_nan=False)],
    defaults={"segments": ..., "spec": {}},
    arrival_s=Seconds, segments=list[SegmentModel],  # type: ignore[valid-type]
    spec=dict[str, Any],  # validated by io.specs.parse_job, as a jobs file is
    epochs_done=Annotated[float, Field(ge=0, le=limits.JOB["epochs"].maximum,
                                       allow_inf_nan=False)])


class LowerBoundModel(_Open):
    weighted_jct_s: Annotated[float, Field(allow_inf_nan=False)]
    gap: float | None = None


SettingsModel = _model_of(
    PlanSettings, _Strict, mode=Literal["space", "pool", "auto"],
    policy=Annotated[str, Field(min_length=1, max_length=64)], params=dict[str, Any],
    restart_cost_s=Seconds, task_iterations=Annotated[int, Field(ge=1)] | None)

#: the plan file's top-level keys that are :class:`PlanNotes` fields
NOTE_KEYS = tuple(f.name for f in dataclasses.fields(PlanNotes))
NotesModel = _model_of(PlanNotes, _Open, batches=dict[str, Name] | None,
                       replan_of=Name | None)


class PlanModel(NotesModel):  # type: ignore[valid-type,misc]
    version: Literal[1]
    policy: Annotated[str, Field(min_length=1, max_length=64)]
    mode: Literal["space", "pool"] = "space"
    params: dict[str, Any] = Field(default_factory=dict)
    static: bool = False
    restart_cost_s: Seconds = DEFAULT_RESTART_COST_S
    settings: SettingsModel | None = None  # type: ignore[valid-type]
    objective: dict[str, Any] = Field(default_factory=dict)
    lower_bound: LowerBoundModel
    cluster: dict[str, Any] = Field(default_factory=dict)
    jobs: Annotated[list[JobModel], Field(min_length=1)]  # type: ignore[valid-type]
    candidates: dict[str, float] | None = None
    tasks: dict[str, Any] | None = None
    plan_id: Name | None = None
    planning_time_s: float | None = None


def _pool(key: str, typ: Any = int) -> Any:
    """``typ`` bounded as :data:`hetsched.core.limits.POOL` bounds ``key``."""
    b = limits.POOL[key]
    return Annotated[typ, Field(ge=b.minimum, le=b.maximum)]


# The pool ``tasks`` section, for the schema only: io.pool_tasks.parse_pool_tasks checks it
# (the same bounds, one-line errors, totals counted before anything expands) and builds
# the core.pool_tasks types these models are derived from.
_Index = Annotated[int, Field(ge=0)]
_Time = _pool("time_s", float)
_Row8: Any = tuple.__class_getitem__(
    (str, _Index, _Index, _Time, _Time, _Time, Literal["keep", "evict"], list[str]))
# an uneven task: the same row plus its own local batch and iterations
_Row10: Any = tuple.__class_getitem__(
    (str, _Index, _Index, _Time, _Time, _Time, Literal["keep", "evict"], list[str],
     _pool("local_batch"), _pool("iterations_per_task")))
_Row: Any = _Row8 | _Row10
_PoolJobModel = _model_of(PoolJobTasks, _Open, **{
    k: _pool(k) for k in ("tasks_per_round", "rounds", "iterations_per_task",
                          "last_round_iterations", "local_batch")},
    model_memory_gb=_pool("model_memory_gb", float) | None,
    chunk=dict[str, _pool("local_batch")] | None)  # type: ignore[misc]
_RunModel = _model_of(TaskRun, _Open, aliases={"rows": "tasks"}, defaults={"rows": ...},
                      rows=list[_Row], repeat=_pool("repeat"),
                      period_s=_pool("period_s", float) | None,
                      round_step=_pool("round_step") | None)
_GpuModel = _model_of(GpuTasks, _Open, node=Name, gpu_type=GpuType, gpu=_pool("gpu"),
                      runs=list[_RunModel], tasks=_pool("tasks"),  # type: ignore[valid-type]
                      memory_gb=_pool("memory_gb", float) | None)
_PoolMemoryModel = _model_of(PoolMemory, _Open)
_PoolTasksModel = _model_of(
    PoolTasks, _Open, skip=("extra",), defaults={"jobs": ..., "gpus": ...},
    jobs=dict[str, _PoolJobModel], gpus=list[_GpuModel],  # type: ignore[valid-type]
    columns=list[str] | None, memory=_PoolMemoryModel | None)


def json_schema() -> dict[str, Any]:
    """The plan file's JSON Schema (published as docs/plan.schema.json)."""
    schema = PlanModel.model_json_schema()
    tasks = _PoolTasksModel.model_json_schema(ref_template="#/$defs/{model}")
    schema["$defs"].update(tasks.pop("$defs", {}))
    schema["$defs"][tasks["title"]] = tasks
    schema["properties"]["tasks"] = {
        "anyOf": [{"$ref": f"#/$defs/{tasks['title']}"}, {"type": "null"}], "default": None,
        "description": "pool mode: each job's rounds and each GPU's task sequence "
                       "(docs/pool.md); a row is [job, round, task, start_s, end_s, "
                       "sync_end_s, memory, evict], plus [local_batch, iterations] for a "
                       "task with its own share of the batch"}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hetsched plan"
    return schema


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "plan"


def plan_from_dict(data: Any, source: str = "plan") -> Plan:
    """Validate a parsed plan and build the typed :class:`Plan` (one-line errors)."""
    if not isinstance(data, dict):
        raise InputError(source, "expected a JSON object (a plan written by `hetsched plan`)")
    if data.get("version") != PLAN_VERSION:
        raise InputError(source, f"unsupported plan version {data.get('version')!r}; this "
                         f"hetsched reads version {PLAN_VERSION}", "version")
    try:
        m = PlanModel.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(source, f"{err['msg']} (got {str(err.get('input'))[:60]!r})",
                         _where(err["loc"])) from None
    seen: set[str] = set()
    jobs: list[JobPlan] = []
    for i, j in enumerate(m.jobs):
        if j.name in seen:
            raise InputError(source, "duplicate job name", f"jobs[{i}].name")
        seen.add(j.name)
        spec = dict(j.spec)
        spec.setdefault("name", j.name)
        job = parse_job(spec, source, i)  # the same validation as a jobs file
        if job.name != j.name:
            raise InputError(source, f"spec name {job.name!r} differs from the job's",
                             f"jobs[{i}].spec.name")
        segs = [Segment(**{**s.model_dump(exclude={"workers"}),
                           "workers": [Worker(**w.model_dump()) for w in s.workers]})
                for s in j.segments]
        jobs.append(JobPlan(j.name, j.weight, j.arrival_s, segs, spec=job,
                            epochs_done=j.epochs_done))
    if m.mode == "pool" and not m.tasks:
        raise InputError(source, "a pool-mode plan needs its 'tasks' section", "tasks")
    # checked, bounded and typed before anything expands it; kept as read for a space plan
    tasks = parse_pool_tasks(m.tasks, source, seen) if m.mode == "pool" else None
    return Plan(policy=m.policy, jobs=jobs, lower_bound_s=m.lower_bound.weighted_jct_s,
                params=dict(m.params), static=m.static, restart_cost_s=m.restart_cost_s,
                planning_time_s=m.planning_time_s or 0.0, cluster=dict(m.cluster),
                candidates=dict(m.candidates or {}), mode=m.mode, tasks=tasks,
                settings=PlanSettings(**m.settings.model_dump()) if m.settings else None,
                plan_id=m.plan_id,
                notes=PlanNotes(**{k: getattr(m, k) for k in NOTE_KEYS}),
                objective_read=dict(m.objective) or None,
                extra={**({"tasks": m.tasks} if tasks is None and m.tasks is not None else {}),
                       **(m.model_extra or {})},
                lower_bound_extra=dict(m.lower_bound.model_extra or {}))


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file written by ``hetsched plan``."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        size = 0
    if size > MAX_PLAN_BYTES:
        raise InputError(str(p), f"plan file is {size / 2**20:.0f} MiB; the limit is "
                         f"{MAX_PLAN_BYTES // 2**20} MiB")
    text = read_text(p, "a plan JSON file")
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        raise InputError(str(p), f"not valid JSON: {e}") from None
    except RecursionError:
        raise InputError(str(p), "not valid JSON: nested too deeply") from None
    return plan_from_dict(data, str(p))


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` to ``path`` atomically (what ``hetsched plan --out`` writes)."""
    atomic_write(Path(path), dump_plan(plan) + "\n")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def dump_plan(plan: Plan) -> str:
    """The plan file's text (no NaN or Infinity can be written)."""
    body = plan.to_dict()
    return json.dumps(body, indent=2, allow_nan=False)




if __name__ == "__main__":  # python -m hetsched.io.plan_json > docs/plan.schema.json
    print(json.dumps(json_schema(), indent=2))
