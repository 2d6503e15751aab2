"""What submitting a plan means in every mode (app/modes.py): the result, the errors,
the files root, the plan checks, the id a submit runs under (a plan that ran to its end
runs again under a new one), the sbatch options and time limit every job gets, the
refusal of a job queued under another plan, and interrupt-safe sbatch loops.

The modes' own submission: app/space_submit.py (a hetjob per job or co-location
group), app/pool_submit.py (one hetjob for the pool).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsched import config
from hetsched.app.runnable import unrunnable
from hetsched.core.plan import Plan
from hetsched.core.sbatch import SbatchOptionError, SbatchOptions, time_minutes
from hetsched.core.spec import NAME_RE, Job
from hetsched.errors import HetschedError, InputError
from hetsched.io.jobfiles import batch_of, files_root
from hetsched.slurm.client import ACTIVE_STATES, NodeInfo, SlurmClient, type_names
from hetsched.slurm.templates import Script
from hetsched.state.store import SUBMITTING, Store

#: hetsched's own states that mean "handed to Slurm and possibly still there"
LIVE_STATES = ACTIVE_STATES | {SUBMITTING}


class SubmitError(HetschedError):
    """A submission failed; what this call had submitted was cancelled."""

    exit_code = 3


class Interrupted(HetschedError):
    """A signal held by :func:`deferred_signals` stopped the command after it cleaned up.
    Exit 128 + the signal: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP."""

    exit_code = 130

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.exit_code = 128 + int(signum)


class SubmitInterrupted(Interrupted):
    """SIGINT/SIGTERM/SIGHUP during submit; what this call had submitted was cancelled."""


@dataclass
class SubmitResult:
    plan_id: str
    plan_path: Path | None
    submitted: list[tuple[str, str]] = field(default_factory=list)  # (job, slurm id)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # already submitted
    scripts: dict[str, Script] = field(default_factory=dict)  # job -> script
    order: list[str] = field(default_factory=list)  # submit order (the plan's start order)
    after: dict[str, list[str]] = field(default_factory=dict)  # job -> afterany jobs
    unrunnable: list[tuple[str, str]] = field(default_factory=list)  # (job, why): not sent


def files_dir(store: Store) -> Path:
    """The files root beside the state file: every path of a job is under it
    (io/jobfiles.py)."""
    return files_root(store.path)


def check_plan(plan: Plan, source: str = "plan") -> str:
    """The plan's id, after the checks submission relies on beyond the file contract."""
    pid = plan.plan_id or str(plan.to_dict()["plan_id"])
    if not NAME_RE.match(pid):
        raise InputError(source, f"plan_id {pid!r} is not valid", "plan_id")
    return pid


def run_id(plan: Plan, pid: str, store: Store, client: SlurmClient) -> str:
    """The id a user's submit of ``plan`` (id ``pid``) runs under.

    Submitting is idempotent: a plan whose batch is still in flight (a job queued or
    running under this plan or a replan's, an sbatch not yet answered, or a job not
    yet handed over after a crash) resumes under its own id, and nothing is sent
    twice. A plan whose batch ran to its end (every job handed to Slurm, none left
    in the queue: one squeue) is a new batch of the same jobs: it runs again under
    ``PID.2``, ``PID.3``... (the first such id not in that state), so its jobs
    train afresh instead of resuming the finished checkpoints, and status and
    reports keep the two runs apart.
    """
    names = {j.name for j in plan.jobs if j.segments} - {n for n, _ in unrunnable(plan)}
    live: set[str] | None = None  # one squeue, and only when it is needed
    stored: dict[str, dict[str, Any] | None] = {}

    def batch(plan_id: str, job: str) -> str:
        if plan_id not in stored:
            stored[plan_id] = store.plan(plan_id)
        return batch_of(stored[plan_id] or {"plan_id": plan_id}, job)

    mine = [s for s in store.submissions() if s.job in names]  # one read, every plan
    n, rid = 1, pid
    while True:
        subs = [s for s in mine if s.plan_id == rid]
        handed = {s.job for s in subs if s.slurm_id}
        if not subs or not names <= handed or any(
                s.slurm_id is None and s.state == SUBMITTING for s in subs):
            return rid
        # still in the queue, under this plan or a replan's plan that continues its jobs
        queued = {s.slurm_id for s in mine if s.slurm_id and s.state in LIVE_STATES
                  and batch(s.plan_id, s.job) == rid}
        if queued:
            if live is None:
                live = {j.leader for j in client.jobs() if not j.finished}
            if queued & live:
                return rid
        n += 1
        rid = f"{pid}.{n}"


def base_sbatch(cli: SbatchOptions | None = None) -> SbatchOptions:
    """The options every job starts from: ``hetsched submit``'s over the config's."""
    try:
        site = SbatchOptions.parse(config.sbatch_defaults())
    except SbatchOptionError as e:
        raise InputError("config", str(e), f"sbatch_{e.key}") from None
    return (cli or SbatchOptions()).over(site)


def job_sbatch(spec: Job | None, base: SbatchOptions) -> SbatchOptions:
    """A job's sbatch options: its spec's own ``slurm:`` over ``base``."""
    return (spec.slurm if spec is not None and spec.slurm else SbatchOptions()).over(base)


@dataclass
class Site:
    """What Slurm says about the partition that every script must respect (one
    ``sinfo`` each, before the scripts are rendered; none in a dry run).

    ``gres_names``: each GPU type as Slurm spells it (GRES types are
    case-sensitive; hetsched's are lower case). ``max_time_min``: the
    partition's MaxTime (None: unlimited). A job whose limit would exceed it
    stays pending forever (PartitionTimeLimit), so hetsched's own limit is
    capped there (``capped`` collects ``(unit, minutes wanted)``; the job
    checkpoints and requeues itself at the limit) and a ``time`` the user gave
    above it is refused.
    """

    partition: str | None = None
    gres_names: dict[str, str] = field(default_factory=dict)
    max_time_min: int | None = None
    capped: list[tuple[str, int]] = field(default_factory=list)
    #: the partition gives whole nodes only (OverSubscribe=EXCLUSIVE)
    exclusive: bool = False
    #: node -> its CPU cores (0: not said)
    node_cpus: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, client: SlurmClient, partition: str | None,
           nodes: list[NodeInfo] | None = None) -> Site:
        """The partition as Slurm reports it (``nodes``: sinfo's, when already read)."""
        if nodes is None:
            nodes = client.nodes(partition)
        info = client.partition_info(partition)
        return cls(partition, type_names(nodes), info.max_time_min,
                   exclusive=info.exclusive, node_cpus={n.name: n.cpus for n in nodes})

    @property
    def where(self) -> str:
        return f"partition {self.partition}" if self.partition else "the default partition"

    def limit(self, unit: str, opts: SbatchOptions, duration_s: float) -> tuple[int, int]:
        """(time limit in minutes, seconds of warning before it) for one job or group:
        ``opts.time`` if given, else :func:`time_limit` of its predicted duration,
        within MaxTime (class doc)."""
        top = self.max_time_min
        if opts.time:
            limit = time_minutes(opts.time)
            if top is not None and limit > top:
                raise InputError(f"job {unit!r}", f"{opts.time} is above {self.where}'s "
                                 f"MaxTime of {top} min: Slurm would keep the job pending "
                                 "for ever (PartitionTimeLimit); give at most that, or no "
                                 "time (then hetsched's own limit stays within it and the "
                                 "job checkpoints and requeues itself at the limit)", "time")
            return limit, warning_s(limit)
        limit, warn = time_limit(duration_s)
        if top is not None and limit > top:
            self.capped.append((unit, limit))
            return top, warning_s(top)
        return limit, warn

    def capped_note(self) -> str | None:
        """One line on the jobs whose limit was capped at MaxTime, or None."""
        if not self.capped:
            return None
        shown = ", ".join(f"{u} {m} min" for u, m in self.capped[:5])
        more = f" and {len(self.capped) - 5} more" if len(self.capped) > 5 else ""
        return (f"{len(self.capped)} of the jobs need more than {self.where}'s MaxTime of "
                f"{self.max_time_min} min ({shown}{more}): each gets that limit, checkpoints "
                "and requeues itself at it, and waits in the queue again each time")


def warning_s(limit_min: int) -> int:
    """Seconds of SIGUSR1 warning before a limit: ``signal_s``, at most half the limit."""
    return int(min(float(config.get("signal_s")), limit_min * 30))


def time_limit(duration_s: float) -> tuple[int, int]:
    """(time limit in minutes, seconds of warning before it) for a predicted duration.

    limit = duration x ``time_margin`` + ``time_pad_s`` (defaults 1.5 and 600 s),
    rounded up to whole minutes; the warning (``signal_s``, default 300 s) is at
    most half the limit so a short job is not signalled at its start.
    """
    limit_min = max(1, math.ceil((max(0.0, duration_s) * float(config.get("time_margin"))
                                  + float(config.get("time_pad_s"))) / 60))
    return limit_min, warning_s(limit_min)


#: the signals a submit or a profile holds and then acts on: Ctrl-C, a kill or a
#: scheduler's stop, and the hangup a login session sends when its ssh connection drops
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def deferred_signals() -> Iterator[list[int]]:
    """Hold SIGINT/SIGTERM/SIGHUP until the sbatch in flight is recorded (main thread only).

    The yielded list receives the signals caught; the submit loop checks it
    after each job and rolls the batch back, so an interrupt never leaves a
    partial batch. Outside the main thread (where Python cannot install
    handlers) signals are left alone, and so is a hangup the process was started
    ignoring: ``nohup`` asked that it not stop the command. (SIGINT and SIGTERM are
    held whatever their handler: a shell's ``&`` ignores SIGINT in a script's
    background jobs, and an explicit ``kill -INT`` there still rolls back.)
    """
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    old = {s: signal.getsignal(s) for s in HELD_SIGNALS}
    old = {s: h for s, h in old.items()
           if not (s == signal.SIGHUP and h is signal.SIG_IGN)}
    for s in old:
        signal.signal(s, lambda num, _frame: caught.append(num))
    try:
        yield caught
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def refuse_active_elsewhere(store: Store, client: SlurmClient, pid: str,
                             names: set[str]) -> None:
    """A job queued under another plan must be changed by replan, not submitted twice.

    The store may be stale (no poll since the job ended), so candidates are
    checked against one squeue before refusing.
    """
    cands = [s for s in store.submissions()
             if s.plan_id != pid and s.job in names and s.state in LIVE_STATES]
    if not cands:
        return
    live = {j.leader for j in client.jobs() if not j.finished}
    for sub in cands:
        if sub.slurm_id in live or (sub.slurm_id is None and sub.state == SUBMITTING):
            raise InputError(
                "plan", f"job {sub.job!r} is already queued under plan {sub.plan_id} "
                f"(Slurm job {sub.slurm_id}); use `hetsched replan` to change it",
                f"job {sub.job!r}")
