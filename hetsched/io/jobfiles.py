"""Every path of a job, named in one place.

Beside the state file, in ``STATE.files/`` (the *files root*)::

    plans/PLAN.json               the plan as submitted (job steps read it)
    scripts/PLAN/JOB-SEG.sh       one submission's sbatch script
    layouts/PLAN/JOB-SEG.json     its rank layout (io/layout.py; replan rewrites it in place)
    logs/                         Slurm's output of every job (the templates name the files)
    private/PLAN/                 a submission's secrets (0700; the pool executor's key)
    pool/PLAN.json                a pool plan's sidecar: its report and checkpoint folders
    checkpoints/BATCH/JOB.pt      a job's checkpoint ($HETSCHED_CHECKPOINT_DIR for checkpoints/)
    reports/BATCH/JOB.jsonl       a job's reports    ($HETSCHED_REPORT_DIR for reports/)
    probes/                       ``hetsched profile``'s probe scripts and results
    replan.lock, replan.log       ``hetsched replan``'s lock and log

PLAN is the plan a submission belongs to, SEG its segment. BATCH is the id of
the plan the job was first submitted with (:func:`batch_of`): a replan's plan
carries it on (``notes.batches``, the plan file's ``batches``), so a job moved by replan resumes from
its checkpoint and keeps adding to its reports, while a later batch that reuses
the job's name starts afresh and ``status`` shows only its own measurements.

Pool plans keep their per-plan layout under the same two roots
(``checkpoints/PLAN/JOB.json``, ``reports/PLAN/gpu-N.jsonl``; replan carries
the checkpoints over, app/pool_replan.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetsched import config

#: the plan file's key of ``PlanNotes.batches``: job -> its batch, for the jobs a replan's plan continues
BATCHES_KEY = "batches"


def files_root(state_path: str | Path | None = None) -> Path:
    """``<state file>.files`` (default: the configured state file's)."""
    return Path(str(state_path if state_path is not None else config.state_path()) + ".files")


def checkpoint_root(root: Path | None = None) -> Path:
    """Setting ``checkpoint_dir``, else ``ROOT/checkpoints``."""
    v = config.get("checkpoint_dir")
    return Path(v) if v else (root if root is not None else files_root()) / "checkpoints"


def report_root(root: Path | None = None) -> Path:
    """Setting ``report_dir``, else ``ROOT/reports``."""
    v = config.get("report_dir")
    return Path(v) if v else (root if root is not None else files_root()) / "reports"


def batch_of(plan: Any, job: str) -> str:
    """The batch ``job`` of ``plan`` belongs to: the id of the plan it was first submitted
    with. A replan's plan names it for the jobs it continues (``notes.batches``); a job
    first submitted with ``plan`` belongs to ``plan``'s own id."""
    if isinstance(plan, Mapping):  # a stored plan's JSON: its notes are top-level keys
        batches, pid = plan.get(BATCHES_KEY), plan.get("plan_id")
    else:
        notes = getattr(plan, "notes", None)
        batches, pid = getattr(notes, "batches", None), getattr(plan, "plan_id", None)
    return str((batches or {}).get(job) or pid or "")


def files_root_of(plan_path: str | Path) -> Path:
    """A job step's files root: a submitted plan is a :func:`plan_copy` (``ROOT/plans/
    PLAN.json``), so its files are under that ROOT wherever the step runs; any other plan
    file (``hetsched run --local plan.json``): the configured state file's."""
    p = Path(str(plan_path))
    return root_of_plan_copy(p) if p.parent.name == "plans" else files_root()


def plan_copy(root: Path, plan_id: str) -> Path:
    """The plan as submitted: ``ROOT/plans/PLAN.json``."""
    return root / "plans" / f"{plan_id}.json"


def root_of_plan_copy(path: str | Path) -> Path:
    """The files root a :func:`plan_copy` lies in."""
    return Path(str(path)).parent.parent


def pool_sidecar(root: Path, plan_id: str) -> Path:
    """A pool plan's report and checkpoint folders: ``ROOT/pool/PLAN.json``."""
    return root / "pool" / f"{plan_id}.json"


def pool_sidecars(root: Path) -> list[Path]:
    """Every pool plan's sidecar under ``root``, in name order."""
    return sorted((root / "pool").glob("*.json"))


def probes_dir(root: Path) -> Path:
    return root / "probes"


def replan_lock(root: Path) -> Path:
    return root / "replan.lock"


def replan_log(root: Path) -> Path:
    return root / "replan.log"


def logs_dir(root: Path) -> Path:
    return root / "logs"


def log_of(logs: Path, slurm_id: str | None) -> Path | None:
    """The Slurm output file of job SLURM_ID (``%x-%j.out`` in the folder ``logs``)."""
    if not slurm_id or slurm_id == "-":
        return None
    found = sorted(logs.glob(f"*-{slurm_id}.out"))
    return found[0] if found else None


#: a line Slurm writes into a job's log itself (``srun: error: ...``, ``slurmstepd-n1: ...``)
_SLURM_LINE = re.compile(r"^(srun|slurmstepd)[-:]")


def log_cause(path: str | Path, limit: int = 200) -> str:
    """The last line a job's program wrote to its log, usually why it failed (a
    traceback's last line); Slurm's own lines skipped, control characters shown as
    '?', cut at ``limit``; '' when there is none or the log cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    for line in reversed(tail.splitlines()):
        text = "".join(c if c.isprintable() else "?" for c in line.strip())
        if text and not _SLURM_LINE.match(text):
            return text if len(text) <= limit else text[:limit] + "..."
    return ""


@dataclass(frozen=True)
class JobFiles:
    """The paths of one submission of one job (``job`` ``pool`` for a pool plan's hetjob).

    ``batch`` "" (a run outside a submitted plan: ``hetsched run --local`` of a
    hand-written plan) puts checkpoints and reports straight under their roots.
    """

    root: Path
    plan_id: str
    job: str
    segment: int = 0
    batch: str = ""

    @classmethod
    def of(cls, root: Path, plan: Any, job: str, segment: int = 0) -> JobFiles:
        """A job of ``plan`` (its id and the job's batch from the plan)."""
        return cls(root, str(plan.plan_id or ""), job, segment, batch_of(plan, job))

    @classmethod
    def in_step(cls, plan_path: str | Path, plan: Any, job: str, segment: int = 0
                ) -> JobFiles:
        """Inside a job step that read ``plan`` from ``plan_path`` (:func:`files_root_of`)."""
        return cls.of(files_root_of(plan_path), plan, job, segment)

    @property
    def plan_copy(self) -> Path:
        return plan_copy(self.root, self.plan_id)

    @property
    def script(self) -> Path:
        return self.root / "scripts" / self.plan_id / f"{self.job}-{self.segment}.sh"

    @property
    def layout(self) -> Path:
        return self.root / "layouts" / self.plan_id / f"{self.job}-{self.segment}.json"

    @property
    def log_dir(self) -> Path:
        return logs_dir(self.root)

    @property
    def private_dir(self) -> Path:
        """The submission's private folder (create it 0700)."""
        return self.root / "private" / self.plan_id

    @property
    def secret(self) -> Path:
        """The submission's secret file (the pool executor's key), in :attr:`private_dir`."""
        return self.private_dir / f"{self.job}-{self.segment}.secret"

    @property
    def checkpoint_dir(self) -> Path:
        base = checkpoint_root(self.root)
        return base / self.batch if self.batch else base

    @property
    def checkpoint(self) -> Path:
        return self.checkpoint_dir / f"{self.job}.pt"

    @property
    def report_dir(self) -> Path:
        base = report_root(self.root)
        return base / self.batch if self.batch else base

    @property
    def report(self) -> Path:
        return self.report_dir / f"{self.job}.jsonl"


def all_reports(root: Path) -> list[Path]:
    """Every job report under the report root (every batch), in name order."""
    base = report_root(root)
    return sorted(p for p in base.glob("**/*.jsonl") if not p.name.startswith("gpu-"))
