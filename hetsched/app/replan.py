"""``hetsched replan``: bring Slurm in line with a fresh plan after reset events.

Made for cron (``* * * * * hetsched replan -t profiles.csv``):

* **Lock.** An ``fcntl`` lock file serialises runs; a second run exits at once
  with code 75 (or waits ``--wait`` seconds). The kernel drops the lock when a
  run dies, so a crash never leaves it stuck.
* **Idempotent and quiet.** It polls once (see monitor.py); without unhandled
  reset events it does nothing and prints nothing. Events are marked handled
  only after Slurm was brought in line, so a failed run is retried next time.
* **What changes.** The work not yet done (pending jobs, the remainder of
  running jobs estimated from their elapsed time, new jobs from the spool
  directory) is planned again with ``hetsched.planning.make_plan`` on the
  partition as Slurm reports it now. A pending job whose first-segment workers
  change is resubmitted (the new hetjob first, then the old one cancelled); a
  running job is left alone unless the new plan resizes it (a different GPU
  count), in which case it is resubmitted in its new shape and resumes from
  its checkpoint. A job that failed is resubmitted, at most ``max_failures``
  times. Completed jobs are done.

Exit codes (also in docs/slurm.md): 0 ok (changed or not), 1 unexpected
error, 2 bad input, 3 a Slurm command failed, 4 Slurm unreachable, 6 state
file unusable, 75 another replan holds the lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsched.app.monitor import RESET_KINDS, Monitor
from hetsched.app.submit import files_dir, submit
from hetsched.core.plan import Plan, PlanSettings
from hetsched.core.spec import Job
from hetsched.errors import HetschedError, InputError
from hetsched.io.plan_json import plan_from_dict
from hetsched.io.specs import load_jobs
from hetsched.slurm.client import FINISHED_STATES, SlurmClient
from hetsched.slurm.inventory import load_inventory
from hetsched.state.store import GONE, SUBMIT_FAILED, SUPERSEDED, Store, Submission

EXIT_OK, EXIT_ERROR, EXIT_INPUT, EXIT_SLURM, EXIT_UNREACHABLE, EXIT_STATE = 0, 1, 2, 3, 4, 6
EXIT_LOCKED = 75  # EX_TEMPFAIL: "try again later"

RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"})
FAILED_STATES = (FINISHED_STATES - {"COMPLETED"}) | {GONE}


class ReplanLocked(HetschedError):
    """Another replan holds the lock."""

    exit_code = EXIT_LOCKED


@contextlib.contextmanager
def replan_lock(path: str | Path, wait_s: float = 0.0) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600) or raise ReplanLocked."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise ReplanLocked(f"another replan is running (lock {p}, pid {holder}); "
                                       "skipped") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


@dataclass
class ReplanResult:
    status: str  # "unchanged", "replanned", "dry-run"
    reason: str = ""
    new_plan_id: str | None = None
    submitted: list[tuple[str, str]] = field(default_factory=list)
    cancelled: list[tuple[str, str]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)
    plan: dict[str, Any] | None = None

    @property
    def changed(self) -> bool:
        return bool(self.submitted or self.cancelled)

    def summary(self) -> str:
        if self.status == "unchanged":
            return f"replan: nothing to do ({self.reason})"
        parts = [f"replan ({self.reason}) -> plan {self.new_plan_id}"]
        if self.submitted:
            parts.append("submitted " + ", ".join(f"{j}={i}" for j, i in self.submitted))
        if self.cancelled:
            parts.append("cancelled " + ", ".join(f"{j}={i}" for j, i in self.cancelled))
        if self.kept:
            parts.append("kept " + ", ".join(self.kept))
        if self.given_up:
            parts.append("gave up on " + ", ".join(self.given_up))
        return "; ".join(parts)


def _rescale_in_place(name: str, new: list[dict[str, Any]], old: list[dict[str, Any]],
                      log: Callable[[str], None]) -> None:
    """An elastic job keeps its GPUs: its ranks switch shares at a step (runtime/elastic.py)."""
    from hetsched.core.plan import worker_groups
    from hetsched.runtime.elastic import request_path, write_request
    from hetsched.runtime.job import default_checkpoint

    batches = [b for _, _, bs in worker_groups(new) for b in bs]
    if batches != [b for _, _, bs in worker_groups(old) for b in bs]:
        seq = write_request(request_path(default_checkpoint(name)), batches)
        log(f"job {name}: rescale in place to {batches} (request {seq})")


def _workers_key(workers: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    return sorted((str(w["node"]), str(w["gpu_type"]), int(w["local_batch"])) for w in workers)


def latest_rows(store: Store) -> dict[str, Submission]:
    """Each job's most recent submission that was not superseded by a replan."""
    out: dict[str, Submission] = {}
    for s in store.submissions():
        if s.state not in (SUPERSEDED, SUBMIT_FAILED):
            out[s.job] = s  # rows come in id order: the last one wins
    return out


def _stored_plan(store: Store, plan_id: str | None) -> Plan | None:
    """A plan from the store, typed; None if absent or no longer valid."""
    raw = store.plan(plan_id) if plan_id else None
    if raw is None:
        return None
    try:
        return plan_from_dict(raw, f"stored plan {plan_id}")
    except InputError:
        return None


def replan(store: Store, client: SlurmClient, table: Any, *, policy: str | None = None,
           partition: str | None = None, spool: str | Path | None = None,
           force: bool = False, dry_run: bool = False, max_failures: int = 2,
           log: Callable[[str], None] = lambda _m: None) -> ReplanResult:
    """One replan pass (see module doc). The caller holds the lock."""
    from hetsched.planning.planner import make_plan  # the planner core; imported late (heavy)

    monitor = Monitor(store, client, partition=partition, spool=spool)
    cycle = monitor.poll()
    for ev in cycle.events:
        log(f"event {ev}")
    pending_events = [e for e in store.events(unhandled_only=True) if e["kind"] in RESET_KINDS]
    if not pending_events and not force:
        return ReplanResult("unchanged", "no reset events")
    reason = ", ".join(sorted({e["kind"] for e in pending_events})) or "forced"
    rows = latest_rows(store)
    now = time.time()

    jobs: list[Job] = []
    result = ReplanResult("replanned", reason)
    for name, row in rows.items():
        if row.state == "COMPLETED":
            result.done.append(name)
            continue
        if row.state in FAILED_STATES:
            fails = sum(1 for s in store.submissions(job=name) if s.state in FAILED_STATES)
            if fails > max_failures:
                result.given_up.append(name)
                continue
        plan = _stored_plan(store, row.plan_id)
        jp = next((j for j in plan.jobs if j.name == name), None) if plan else None
        if jp is None or jp.spec is None:
            log(f"job {name}: no usable spec in plan {row.plan_id}; left as is")
            continue
        job = jp.spec
        frac = 1.0
        if row.state in RUNNING_STATES:
            starts = [c.start_time for c in cycle.infos.get(name, []) if c.start_time]
            planned = jp.end_s - jp.start_s
            if starts and planned > 0:
                frac = max(0.05, 1.0 - (now - min(starts)) / planned)
        jobs.append(dataclasses.replace(job, arrival_s=0.0, epochs=job.epochs * frac))
    known = {j.name for j in jobs} | set(rows)
    spool_files: list[Path] = []
    for e in pending_events:
        if e["kind"] == "spool-new" and e["detail"]:
            p = Path(e["detail"])
            if not p.exists():
                continue
            for j in load_jobs(p):
                if j.name in known:
                    log(f"spool {p}: job {j.name!r} already known; ignored")
                    continue
                jobs.append(dataclasses.replace(j, arrival_s=0.0))
                known.add(j.name)
            spool_files.append(p)
    if not jobs:
        if not dry_run:
            store.mark_handled([e["id"] for e in pending_events])
        return ReplanResult("unchanged", f"{reason}; no work left", done=result.done,
                            given_up=result.given_up)

    old_raw = store.active_plan()
    old_id = (old_raw or {}).get("plan_id")
    settings = how_planned(_stored_plan(store, old_id), policy)
    cluster = load_inventory(client, partition).cluster
    new_plan = make_plan(jobs, cluster, table, jobs_source="replan",
                         **settings.make_plan_kwargs())
    new_plan.extra.update({"replan_of": old_id, "replanned_at": round(now, 3)})
    new_plan.plan_id = None  # a fresh content hash: unique per replan
    new = new_plan.to_dict()
    new_plan.plan_id = new["plan_id"]
    result.new_plan_id = new["plan_id"]
    result.plan = new

    to_submit: set[str] = set()
    to_cancel: list[Submission] = []
    for jp in new_plan.jobs:
        name = jp.name
        if not jp.segments:
            continue
        ws = [w.to_dict() for w in jp.segments[0].workers]
        cur = rows.get(name)
        if cur is None or cur.state in FAILED_STATES:
            to_submit.add(name)
        elif cur.state in RUNNING_STATES:
            if len(ws) != len(cur.workers):  # resized: restart from its checkpoint
                to_submit.add(name)
                to_cancel.append(cur)
            else:
                result.kept.append(name)
                if jp.spec is not None and jp.spec.elastic is not None and not dry_run:
                    _rescale_in_place(name, ws, cur.workers, log)  # same GPUs: new batch
        elif _workers_key(ws) != _workers_key(cur.workers):
            to_submit.add(name)
            to_cancel.append(cur)
        else:
            result.kept.append(name)
    if dry_run:
        result.status = "dry-run"
        result.submitted = [(n, "(dry-run)") for n in sorted(to_submit)]
        result.cancelled = [(r.job, r.slurm_id or "?") for r in to_cancel]
        return result

    rid = store.begin_replan(reason, old_id)
    try:
        if to_submit:
            # new hetjobs first: if this fails, the old ones are still queued
            res = submit(new_plan, store, client, only=to_submit, partition=partition,
                         source="replan", allow_active_elsewhere=True)
            result.submitted = res.submitted + res.skipped
        else:
            store.add_plan(new, source="replan")
        ids = [r.slurm_id for r in to_cancel if r.slurm_id]
        client.cancel(ids)
        with store.tx():
            for r in to_cancel:
                store.set_state(r.id, SUPERSEDED)
        result.cancelled = [(r.job, r.slurm_id or "") for r in to_cancel]
    except BaseException as e:
        store.finish_replan(rid, f"failed: {e}"[:500], new["plan_id"])
        raise
    store.finish_replan(rid, "ok", new["plan_id"], [i for _, i in result.cancelled],
                        [i for _, i in result.submitted])
    store.mark_handled([e["id"] for e in pending_events])
    for p in spool_files:
        done_dir = p.parent / "done"
        done_dir.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            p.rename(done_dir / p.name)
    if not result.changed:
        result.status = "unchanged"
        result.reason = f"{reason}; plan unchanged for queued jobs"
    return result


def how_planned(old: Plan | None, policy: str | None) -> PlanSettings:
    """The settings for the next plan: the active plan's own, ``policy`` overriding.

    A plan made with ``--static --restart-cost 10 --policy jps --param
    samples=80`` (or ``--mode pool``) is replanned the same way. Plans from
    before settings were recorded fall back to their policy label.
    """
    if old is not None and old.settings is not None:
        s = old.settings
    else:
        label = old.policy if old is not None else "auto"
        s = PlanSettings(mode=old.mode if old is not None else "space",
                         policy="auto" if label.startswith("auto") else label)
    if policy is not None and policy != s.policy:
        s = dataclasses.replace(s, policy=policy, params={})
    return s


def default_lock(store: Store) -> Path:
    return files_dir(store) / "replan.lock"


def default_log(store: Store) -> Path:
    return files_dir(store) / "replan.log"


def file_logger(path: str | Path) -> Callable[[str], None]:
    """A logger appending timestamped lines to ``path`` (created 0600)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [{os.getpid()}] {msg}\n"
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    return log


def result_json(r: ReplanResult) -> str:
    d = dataclasses.asdict(r)
    d.pop("plan", None)
    return json.dumps(d)
