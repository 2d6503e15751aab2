"""Pool executors' reports and checkpoint sidecars, read without torch.

Each executor appends JSON lines to ``<report_dir>/<plan_id>/gpu-<gpu_id>.jsonl``
(one ``os.write`` per line on an ``O_APPEND`` descriptor, see
:class:`hetsched.io.reports.ReportWriter`):

* ``{"kind": "task", "job", "round", "task", "gpu", "gpu_type", "iterations",
  "samples", "compute_s", "switch_s", "start", "end"}`` per finished task
  (``start``/``end``: Unix time; ``compute_s``: forward+backward of its
  iterations; ``switch_s``: cleaning after the previous task plus loading this
  one up to its first layer's weights, without waiting for the round
  barrier). Extra keys: ``warm`` (the model was resident at the start),
  ``wait_s`` (round barrier), ``sync_s`` (parameter server traffic), ``bytes_in``;
* ``{"kind": "job_done", "job", "rounds", "end"}`` once per job, by the
  executor whose gradient completed the job's last round.

:func:`read_pool_reports` folds every file of a plan into a
:class:`PoolProgress`; :func:`completed_rounds` reads the checkpoint sidecars
``<checkpoint_dir>/<plan_id>/<job>.json`` (rounds a restart resumes after).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsched.core.plan import Plan
from hetsched.io.reports import read_reports


@dataclass
class JobProgress:
    """What the reports say about one job."""

    job: str
    rounds_done: int = 0  # highest round whose every reported task ended, + 1 (or job_done)
    tasks_done: int = 0
    done: bool = False
    end: float | None = None  # Unix time of job_done
    first_start: float | None = None
    compute_s: float = 0.0
    switch_s: float = 0.0
    samples: int = 0
    per_gpu_type: dict[str, list[float]] = field(default_factory=dict)  # type -> [s/iter ...]
    rounds_seen: dict[int, int] = field(default_factory=dict)  # round -> tasks reported


@dataclass
class PoolProgress:
    plan_id: str
    jobs: dict[str, JobProgress]
    tasks: list[dict[str, Any]]  # every task record, file order per GPU
    files: list[Path]

    @property
    def switch_times(self) -> list[float]:
        return [float(t["switch_s"]) for t in self.tasks]


def report_path(report_dir: str | Path, plan_id: str, gpu: str) -> Path:
    return Path(report_dir) / plan_id / f"gpu-{gpu}.jsonl"


def read_pool_reports(report_dir: str | Path, plan_id: str | None = None,
                      tasks_per_round: dict[str, int] | None = None) -> PoolProgress:
    """Every ``gpu-*.jsonl`` under ``report_dir/plan_id`` (or ``report_dir`` itself when
    ``plan_id`` is None). A task reported twice (re-run after a restart) counts once,
    with its last record. ``tasks_per_round`` (job -> P, from the plan) lets
    ``rounds_done`` count rounds whose P tasks all reported; without it a round
    counts once any task of it reported."""
    d = Path(report_dir) / plan_id if plan_id else Path(report_dir)
    files = sorted(d.glob("gpu-*.jsonl"))
    jobs: dict[str, JobProgress] = {}
    latest: dict[tuple[str, int, int], dict[str, Any]] = {}
    done_recs: list[dict[str, Any]] = []
    for f in files:
        recs, _ = read_reports(f)
        for r in recs:
            if r.get("kind") == "task":  # a task re-run after a restart: its last record
                key = (str(r.get("job", "")), int(r.get("round", 0)), int(r.get("task", 0)))
                latest.pop(key, None)
                latest[key] = r
            elif r.get("kind") == "job_done":
                done_recs.append(r)
    tasks = list(latest.values())
    for r in tasks + done_recs:
        name = str(r.get("job", ""))
        _fold(jobs.setdefault(name, JobProgress(name)), r)
    for jp in jobs.values():
        need = (tasks_per_round or {}).get(jp.job, 1)
        full = 0
        while jp.rounds_seen.get(full, 0) >= need:
            full += 1
        jp.rounds_done = max(jp.rounds_done, full)
    return PoolProgress(plan_id or d.name, jobs, tasks, files)


def _fold(jp: JobProgress, r: dict[str, Any]) -> None:
    if r.get("kind") == "job_done":
        jp.done = True
        jp.end = float(r.get("end", 0.0))
        jp.rounds_done = max(jp.rounds_done, int(r.get("rounds", 0)))
        return
    jp.tasks_done += 1
    jp.compute_s += float(r.get("compute_s", 0.0))
    jp.switch_s += float(r.get("switch_s", 0.0))
    jp.samples += int(r.get("samples", 0))
    rnd = int(r.get("round", 0))
    jp.rounds_seen[rnd] = jp.rounds_seen.get(rnd, 0) + 1
    st = float(r.get("start", 0.0))
    jp.first_start = st if jp.first_start is None else min(jp.first_start, st)
    it = int(r.get("iterations", 0))
    if it:
        jp.per_gpu_type.setdefault(str(r.get("gpu_type", "")), []).append(
            float(r.get("compute_s", 0.0)) / it)


def completed_rounds(plan: Plan, checkpoint_dir: str | Path) -> dict[str, int]:
    """Rounds each job of ``plan`` has checkpointed (0 without a checkpoint): a restart
    resumes after them and a replan keeps only the rest."""
    plan_id = plan.plan_id or str(plan.to_dict()["plan_id"])
    out: dict[str, int] = {}
    for job in (j.name for j in plan.jobs):
        p = Path(checkpoint_dir) / plan_id / f"{job}.json"
        try:
            out[job] = int(json.loads(p.read_text())["rounds_done"])
        except (OSError, ValueError, KeyError, TypeError):
            out[job] = 0
    return out
