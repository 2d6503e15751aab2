"""Progress of a pool-mode plan from its executors' reports (``status``, the monitor).

Each executor appends JSON lines to ``<report_dir>/<plan_id>/gpu-<gpu_id>.jsonl``:
``task`` records (job, round, task, gpu, gpu_type, iterations, samples,
compute_s, switch_s, start, end; times in epoch seconds) and ``job_done``
records (job, rounds, end). From them, per job: rounds done out of the plan's
rounds (a round is done when all of *its* tasks reported: in an uneven plan
rounds have different task counts), tasks done, and the measured JCT beside the
plan's prediction.

Measured times start at the pool's first task (the plan's time 0 is when the
executors are ready: process start and rendezvous are not in its model). A
replanned pool plan (``extra.resume``) adds the rounds its predecessors
completed, so "round r of R" counts the job's whole life.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hetsched.app.pool_submit import pool_dirs
from hetsched.app.submission import files_dir
from hetsched.core.plan import Plan
from hetsched.errors import InputError
from hetsched.io.jobfiles import pool_sidecars
from hetsched.io.plan_json import plan_from_dict
from hetsched.io.pool_reports import JobProgress as ReportedJob
from hetsched.io.pool_reports import PoolProgress as ReportedPool
from hetsched.io.pool_reports import read_pool_reports
from hetsched.state.history import ingest_reports
from hetsched.state.store import Store


@dataclass
class JobProgress:
    job: str
    rounds_done: int
    rounds: int
    tasks_done: int
    tasks: int
    done: bool
    predicted_jct_s: float
    measured_jct_s: float | None  # None until the job is done
    elapsed_s: float | None  # since the pool's first task, while running
    weight: float = 1.0
    #: while running: the rounds the plan has this job finish by the same time from the
    #: pool's first task (rounds of earlier plans included, as ``rounds_done``)
    planned_rounds_done: int | None = None

    def line(self) -> str:
        pred = f"predicted JCT {self.predicted_jct_s:,.1f} s"
        if self.done and self.measured_jct_s is not None:
            meas = f"measured {self.measured_jct_s:,.1f} s from the pool's first task"
        elif self.elapsed_s is not None:
            meas = f"running for {self.elapsed_s:,.1f} s"
        else:
            meas = "not started"
        if self.done:
            state = f"done (round {self.rounds} of {self.rounds})"
        else:
            state = (f"round {min(self.rounds_done + 1, self.rounds)} of {self.rounds} "
                     f"({self.rounds_done} done"
                     + (f"; the plan has {self.planned_rounds_done} done by now)"
                        if self.planned_rounds_done is not None else ")"))
        return f"{self.job}: {state}, tasks {self.tasks_done}/{self.tasks}, {pred}, {meas}"


@dataclass
class PoolProgress:
    plan_id: str
    slurm_id: str | None
    jobs: list[JobProgress]
    predicted_weighted_jct_s: float
    measured_weighted_jct_s: float | None  # once every job is done

    def lines(self) -> list[str]:
        """What ``status`` prints for a pool plan."""
        head = f"pool plan {self.plan_id} (Slurm job {self.slurm_id or '-'}): predicted " \
            f"weighted JCT {self.predicted_weighted_jct_s:,.1f} s"
        if self.measured_weighted_jct_s is not None:
            head += (f", measured {self.measured_weighted_jct_s:,.1f} s from its first task "
                     "(the table's JCTs count from the plan's start: queue and start-up too)")
        return [head] + ["  " + j.line() for j in self.jobs]

    def to_dict(self) -> dict[str, Any]:
        return {"plan_id": self.plan_id, "slurm_id": self.slurm_id,
                "predicted_weighted_jct_s": self.predicted_weighted_jct_s,
                "measured_weighted_jct_s": self.measured_weighted_jct_s,
                "jobs": [asdict(j) for j in self.jobs]}


def progress(plan: Plan, reports: ReportedPool, slurm_id: str | None = None,
             now: float | None = None) -> PoolProgress:
    """Per-job progress of a pool plan from its executors' reports."""
    meta_of = plan.tasks.jobs if plan.tasks is not None else {}
    per_round, ends, first = _rounds(plan)
    resume = plan.notes.resume or {}
    starts = [jp.first_start for jp in reports.jobs.values() if jp.first_start is not None]
    t0 = min(starts) if starts else None
    now = time.time() if now is None else now
    jobs = []
    for j in plan.jobs:
        name = j.name
        meta = meta_of.get(name)
        rounds = meta.rounds if meta is not None else 0
        before = int((resume.get(name) or {}).get("rounds_done", 0))  # renumbered rounds
        per = per_round.get(name, {})
        jp = reports.jobs.get(name, ReportedJob(name))
        full = sum(1 for r, n in jp.rounds_seen.items() if r >= before and n >= per.get(r, 1))
        measured = (jp.end - t0 - j.arrival_s
                    if jp.done and jp.end is not None and t0 is not None else None)
        elapsed = now - t0 if t0 is not None and not jp.done else None  # while running
        planned = (before + sum(1 for r, e in ends.get(name, {}).items()
                                if r >= before and e <= first + elapsed + 1e-9)
                   if elapsed is not None else None)
        jobs.append(JobProgress(
            name, rounds if jp.done else before + full, rounds, jp.tasks_done,
            sum(n for r, n in per.items() if r >= before), jp.done, float(j.jct_s), measured,
            elapsed, j.weight, planned))
    pred = float(plan.objective_read["weighted_jct_s"]) if plan.objective_read \
        else plan.weighted_jct_s
    meas = (sum(p.weight * (p.measured_jct_s or 0.0) for p in jobs)
            if jobs and all(p.done and p.measured_jct_s is not None for p in jobs) else None)
    return PoolProgress(str(plan.plan_id or ""), slurm_id, jobs, pred, meas)


def _rounds(plan: Plan) -> tuple[dict[str, dict[int, int]], dict[str, dict[int, float]], float]:
    """Per job, each of its rounds' task count and end (its last exchange) in ``plan``,
    and the plan's first task start (one pass over the rows)."""
    counts: dict[str, dict[int, int]] = {}
    ends: dict[str, dict[int, float]] = {}
    first = float("inf")
    for g in plan.tasks.gpus if plan.tasks is not None else ():
        for r in g.rows():
            rounds = counts.setdefault(r.job, {})
            rounds[r.round] = rounds.get(r.round, 0) + 1
            end = ends.setdefault(r.job, {})
            end[r.round] = max(end.get(r.round, 0.0), r.sync_end_s)
            first = min(first, r.start_s)
    return counts, ends, (0.0 if first == float("inf") else first)


def active_pool_progress(store: Store) -> PoolProgress | None:
    """Progress of the store's active plan when it is a pool plan, else None."""
    plan = store.active_plan()
    if not plan or plan.get("mode") != "pool":
        return None
    pid = str(plan["plan_id"])
    try:
        typed = plan_from_dict(plan, f"stored plan {pid}")
    except InputError:
        return None  # a stored plan this version cannot read: no pool progress to show
    dirs = pool_dirs(store, pid)
    return progress(typed, _reports(dirs.report_dir, pid), dirs.slurm_id)


#: the last readings of plans' reports, with the files' sizes and times they were read at
_READ: dict[tuple[str, str], tuple[tuple[Any, ...], ReportedPool]] = {}
_READ_KEPT = 2


def _reports(report_dir: Path, pid: str) -> ReportedPool:
    """:func:`read_pool_reports` of a plan, read again only when its files changed: `status`
    asks twice (its table's measured iterations, its pool lines), and a pool's records
    are every task it has run."""
    try:
        sig = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                    for f in sorted((report_dir / pid).glob("gpu-*.jsonl")))
    except OSError:  # a file went away while looking: read whatever is there
        return read_pool_reports(report_dir, pid)
    key = (str(report_dir), pid)
    hit = _READ.pop(key, None)
    got = hit[1] if hit is not None and hit[0] == sig else read_pool_reports(report_dir, pid)
    _READ[key] = (sig, got)  # most recent last
    while len(_READ) > _READ_KEPT:
        del _READ[next(iter(_READ))]
    return got


def ended_jobs(store: Store, plan: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per job of a stored pool plan that has ended by its executors' records (its pool's
    Slurm job may run on for the others): its first task's start and its end (epoch s)."""
    pid = str(plan.get("plan_id") or "")
    reports = _reports(pool_dirs(store, pid).report_dir, pid)
    return {name: (jp.first_start, jp.end) for name, jp in reports.jobs.items()
            if jp.done and jp.end is not None and jp.first_start is not None}


def iteration_s(plan: dict[str, Any], name: str, span: tuple[float, float]) -> float | None:
    """A pool job's measured seconds per iteration: ``span`` (its first task's start, its
    end) over its iterations; the plan's ``iteration_s`` is the same span, predicted, over
    the same iterations (``evaluator.to_plan``). None when the plan gives no iterations."""
    j = next((j for j in plan.get("jobs", []) if j.get("name") == name), None)
    segs = (j or {}).get("segments") or []
    its = float(segs[0].get("iterations") or 0.0) if segs else 0.0
    return max(0.0, span[1] - span[0]) / its if its > 0 else None


def ingest_pool_reports(store: Store) -> None:
    """Fold new task records of every submitted pool plan into the profile history."""
    for side in pool_sidecars(files_dir(store)):
        pid = side.stem
        plan = store.plan(pid)
        if not plan:
            continue
        files = sorted((pool_dirs(store, pid).report_dir / pid).glob("gpu-*.jsonl"))
        if not files:
            continue
        workloads = {str(j["name"]): str((j.get("spec") or {}).get("workload", ""))
                     for j in plan.get("jobs", [])}
        ingest_reports(store, files, workloads={k: v for k, v in workloads.items() if v})
