"""The Plan: what crosses from the planner to Slurm, the renderers and scripts.

A plan is a timeline. Each job has segments; within a segment its worker set
and local batches are fixed. The plan also says how it was made (mode,
policy, parameters, static, restart cost, task iterations) so that a replan
makes the next plan the same way. ``to_dict`` produces the JSON contract
(version 1, docs/formats.md, docs/plan.schema.json); reading it back is
:func:`hetsched.io.plan_json.load_plan`'s job.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from hetsched.config import DEFAULT_RESTART_COST_S
from hetsched.core.pool_tasks import PoolTasks
from hetsched.core.spec import Job

PLAN_VERSION = 1


@dataclass(frozen=True)
class Worker:
    node: str
    gpu_type: str
    gpu: int
    local_batch: int

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "gpu_type": self.gpu_type, "gpu": self.gpu,
                "local_batch": self.local_batch}


@dataclass
class Segment:
    """A period with a fixed worker set. ``restart_s`` of it is spent restarting."""

    start_s: float
    end_s: float
    workers: list[Worker]
    iteration_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    iterations: float = field(default=0.0, metadata={"description": (
        "iterations run in this segment, after its restart: iterations * iteration_s "
        "= max(0, end_s - start_s - restart_s)")})
    restart_s: float = field(default=0.0, metadata={"description": (
        "seconds of the segment spent restarting (checkpoint, requeue, reload) before "
        "its first iteration; 0 for a job's first segment")})
    global_batch: int | None = field(default=None, metadata={"description": (
        "the segment's global batch, chosen by the planner for an elastic job (ONES); "
        "absent: the spec's global_batch")})
    group: str | None = field(default=None, metadata={"description": (
        "co-location group (Harmony): segments of different jobs with the same group "
        "share their GPUs at the same time; absent: the GPUs serve this job alone")})

    def to_dict(self) -> dict[str, Any]:
        d = {
            "start_s": round(self.start_s, 6), "end_s": round(self.end_s, 6),
            "workers": [w.to_dict() for w in self.workers],
            "iteration_s": self.iteration_s, "compute_s": self.compute_s,
            "comm_s": self.comm_s, "iterations": self.iterations,
            "restart_s": self.restart_s,
        }
        if self.global_batch is not None:
            d["global_batch"] = self.global_batch
        if self.group is not None:
            d["group"] = self.group
        return d


@dataclass(frozen=True)
class PlanSettings:
    """How a plan was asked for: what ``replan`` needs to make the next one the same way.

    ``Plan.policy`` and ``Plan.params`` say what ran (``auto:has``, the
    chosen candidate, a pool plan's bound); these are the request.
    """

    mode: str = "space"
    policy: str = "auto"
    params: Mapping[str, Any] = field(default_factory=dict)
    static: bool = False
    restart_cost_s: float = DEFAULT_RESTART_COST_S
    task_iterations: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "policy": self.policy, "params": dict(self.params),
                "static": self.static, "restart_cost_s": self.restart_cost_s,
                "task_iterations": self.task_iterations}

    def make_plan_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`hetsched.planning.planner.make_plan`."""
        return {"mode": self.mode, "policy": self.policy, "params": dict(self.params),
                "static": self.static, "restart_cost_s": self.restart_cost_s,
                "task_iterations": self.task_iterations}


@dataclass
class JobPlan:
    name: str
    weight: float
    arrival_s: float
    segments: list[Segment] = field(default_factory=list)
    spec: Job | None = field(default=None, metadata={
        "description": "the job spec (docs/formats.md, jobs file)"})
    epochs_done: float = field(default=0.0, metadata={"description": (
        "epochs the job ran before this plan (replan: measured from its epoch reports, "
        "else estimated; it accumulates across replans); the spec's epochs are the rest. "
        "Absent: 0")})

    @property
    def start_s(self) -> float:
        return self.segments[0].start_s if self.segments else float("nan")

    @property
    def end_s(self) -> float:
        return self.segments[-1].end_s if self.segments else float("nan")

    @property
    def jct_s(self) -> float:
        return self.end_s - self.arrival_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "weight": self.weight, "arrival_s": self.arrival_s,
            "start_s": round(self.start_s, 6), "end_s": round(self.end_s, 6),
            "jct_s": round(self.jct_s, 6),
            "spec": self.spec.to_dict() if self.spec is not None else {},
            "segments": [s.to_dict() for s in self.segments],
            **({"epochs_done": round(self.epochs_done, 6)} if self.epochs_done > 0 else {}),
        }


def _note(description: str) -> Any:
    """A :class:`PlanNotes` field: absent (None) unless set; its description is the
    published schema's."""
    return field(default=None, metadata={"description": description})


@dataclass
class PlanNotes:
    """What planning and replan say about a plan beside its jobs: named, typed keys of the
    plan file's top level (docs/formats.md), each left out of the file while None.

    Policy-specific facts (``ones``, ``opd``, ``harmony_jct``, ...) stay in ``Plan.extra``.
    """

    batches: dict[str, str] | None = _note(
        "replan: each job the plan continues -> its batch (the plan it was first submitted "
        "with; its checkpoint and reports are kept under it)")
    replan_of: str | None = _note("replan: the plan this one replaces")
    replanned_at: float | None = _note("replan: when (epoch seconds)")
    resume: dict[str, dict[str, Any]] | None = _note(
        "pool replan: job -> {plan_id, rounds_done, iterations_done}, the rounds carried "
        "over and the global step the job goes on at")
    skipped: dict[str, str] | None = _note("auto: candidate policy -> why it made no plan")
    predicted_work_s: dict[str, float] | None = _note(
        "auto: candidate policy -> its predicted counted work (s)")
    mode_candidates: dict[str, float] | None = _note(
        "--mode auto: mode -> weighted JCT of its plan")
    mode_skipped: dict[str, str] | None = _note("--mode auto: mode -> why it made no plan")
    skipped_unplaceable: list[dict[str, str]] | None = _note(
        "submit --skip-unrunnable: the jobs left out and why")
    no_group: str | None = _note("a co-location policy formed no group: why")
    length_prediction: dict[str, Any] | None = _note(
        "target_loss jobs: the progress predictor's history and predicted lengths")
    fixed_start: dict[str, Any] | None = _note(
        "ones: the plan compared with a fixed start, both values and which was kept")
    fallback: dict[str, Any] | None = _note(
        "the plan compared with its base policy's, both values and which was kept")
    keep_or_move: dict[str, Any] | None = _note(
        "replan (space): the first decision about the running jobs (planning/space/"
        "decide.py): the candidate chosen (keep, fresh, wait, or the policy's own) and "
        "each candidate's predicted weighted completion of the jobs it changes, or why "
        "nothing was compared")
    pool_vs_space: dict[str, Any] | None = _note(
        "pool: the plan compared with the space plan, both values and which was kept")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    def merged_under(self, other: PlanNotes) -> PlanNotes:
        """These notes, with ``other``'s where these have none."""
        return PlanNotes(**{**other.to_dict(), **self.to_dict()})


def jain(xs: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n at worst."""
    if not xs:
        return 1.0
    s, s2 = sum(xs), sum(x * x for x in xs)
    return (s * s) / (len(xs) * s2) if s2 > 0 else 1.0


@dataclass
class Plan:
    policy: str
    jobs: list[JobPlan]
    lower_bound_s: float
    params: dict[str, Any] = field(default_factory=dict)
    static: bool = False
    restart_cost_s: float = DEFAULT_RESTART_COST_S
    planning_time_s: float = 0.0
    cluster: dict[str, Any] = field(default_factory=dict)
    fairness_ref: dict[str, float] = field(default_factory=dict)  # job -> equal-share JCT
    candidates: dict[str, float] = field(default_factory=dict)  # auto: policy -> objective
    mode: str = "space"
    #: pool mode only: each job's rounds and each GPU's task sequence (core.pool_tasks)
    tasks: PoolTasks | None = None
    #: how the plan was asked for (set by make_plan; replan reuses it)
    settings: PlanSettings | None = None
    #: the id of a plan read from a file (None: the content hash of to_dict)
    plan_id: str | None = None
    #: the objective section as read from a file: a loaded plan reports what was planned
    #: (recomputing from rounded times would drift in the last digit; it has no
    #: equal-share references for fairness)
    objective_read: dict[str, Any] | None = None
    #: what planning and replan say about the plan (replan_of, batches, skipped, ...)
    notes: PlanNotes = field(default_factory=lambda: PlanNotes())
    #: policy-specific facts (``Plan.extra["opd"]``) and top-level keys of a plan file this
    #: version does not model, kept as read
    extra: dict[str, Any] = field(default_factory=dict)
    lower_bound_extra: dict[str, Any] = field(default_factory=dict)

    # -- objective -----------------------------------------------------
    @property
    def weighted_jct_s(self) -> float:
        return sum(j.weight * j.jct_s for j in self.jobs)

    @property
    def avg_jct_s(self) -> float:
        return sum(j.jct_s for j in self.jobs) / len(self.jobs)

    @property
    def makespan_s(self) -> float:
        return max(j.end_s for j in self.jobs) - min(j.arrival_s for j in self.jobs)

    @property
    def fairness(self) -> float:
        """Jain's index over JCT / equal-share JCT (HAS paper eq. 33)."""
        if not self.fairness_ref and self.objective_read is not None:
            return float(self.objective_read.get("fairness", 1.0))
        xs = [j.jct_s / self.fairness_ref[j.name] for j in self.jobs
              if self.fairness_ref.get(j.name, 0) > 0]
        return jain(xs)

    @property
    def gap(self) -> float:
        """Relative gap of the objective to the lower bound."""
        lb = self.lower_bound_s
        wj = float(self.objective_read["weighted_jct_s"]) if self.objective_read \
            else self.weighted_jct_s
        return (wj - lb) / lb if lb > 0 else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per job (a ``pandas.DataFrame(plan.rows())`` takes them)."""
        out = []
        for j in self.jobs:
            first = j.segments[0].workers if j.segments else []
            out.append({
                "job": j.name, "weight": j.weight, "arrival_s": j.arrival_s,
                "start_s": float(j.start_s), "end_s": float(j.end_s), "jct_s": float(j.jct_s),
                "queue_s": float(j.start_s - j.arrival_s), "gpus": len(first),
                "gpu_types": ",".join(sorted({w.gpu_type for w in first})),
                "local_batches": ",".join(str(w.local_batch) for w in first),
                "segments": len(j.segments),
                "restart_s": float(sum(s.restart_s for s in j.segments)),
            })
        return out

    def job(self, name: str) -> JobPlan:
        for j in self.jobs:
            if j.name == name:
                return j
        raise KeyError(name)

    # -- serialisation -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "version": PLAN_VERSION,
            "policy": self.policy,
            "mode": self.mode,
            "params": self.params,
            "static": self.static,
            "restart_cost_s": self.restart_cost_s,
            "objective": self.objective_read or {
                "weighted_jct_s": round(self.weighted_jct_s, 6),
                "avg_jct_s": round(self.avg_jct_s, 6),
                "makespan_s": round(self.makespan_s, 6),
                "fairness": round(self.fairness, 6),
            },
            "lower_bound": {"weighted_jct_s": round(self.lower_bound_s, 6),
                            "gap": round(self.gap, 6), **self.lower_bound_extra},
            "cluster": self.cluster,
            "jobs": [j.to_dict() for j in self.jobs],
        }
        if self.candidates:
            body["candidates"] = {k: round(v, 6) for k, v in self.candidates.items()}
        if self.tasks is not None:
            body["tasks"] = self.tasks.to_dict()
        if self.settings is not None:
            body["settings"] = self.settings.to_dict()
        body.update({k: v for k, v in self.notes.to_dict().items() if k not in body})
        body.update({k: v for k, v in self.extra.items() if k not in body})
        body["plan_id"] = self.plan_id or plan_id(body)
        body["planning_time_s"] = round(self.planning_time_s, 6)
        return body

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def worker_groups(workers: Sequence[Worker | Mapping[str, Any]]
                  ) -> list[tuple[str, str, tuple[int, ...]]]:
    """A segment's workers grouped by (GPU type, node), in first-seen order.

    Each group is one hetjob component; ranks are numbered component by
    component, then worker by worker (Slurm's global ``SLURM_PROCID`` across
    ``--het-group``s). Submit and the runtime both derive rank order here. A worker is
    a plan's :class:`Worker` or, as the state store keeps it, its ``to_dict()``.
    """
    groups: dict[tuple[str, str], list[int]] = {}
    for w in workers:
        if isinstance(w, Worker):
            key, batch = (w.gpu_type, w.node), w.local_batch
        else:
            key, batch = (str(w["gpu_type"]), str(w["node"])), int(w["local_batch"])
        groups.setdefault(key, []).append(batch)
    return [(t, n, tuple(b)) for (t, n), b in groups.items()]


def plan_id(body: dict[str, Any]) -> str:
    """Content hash of a plan body (without its id and timing), stable across runs."""
    clean = {k: v for k, v in body.items() if k not in ("plan_id", "planning_time_s")}
    raw = json.dumps(clean, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:16]
