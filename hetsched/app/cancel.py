"""``hetsched cancel [JOB...|--all]``: a user's cancel, final and recorded.

A job the user cancels is never resubmitted by ``replan``, whether it was
cancelled here or with ``scancel`` (the monitor sees Slurm's ``CANCELLED``
state for a job hetsched did not cancel itself: hetsched marks its own
cancels ``SUPERSEDED`` *before* calling ``scancel``). Failures are told apart
by their own states: ``FAILED``, ``NODE_FAIL``, ``TIMEOUT``,
``OUT_OF_MEMORY``, ``PREEMPTED``, ``BOOT_FAIL``.

A co-location group's jobs are cancelled together or not at all (one Slurm job).
One job of a pool (pool mode: every job's tasks run in one Slurm job) is
*dropped*: it is marked cancelled and the pool's Slurm job goes on; the
``job-cancelled`` event makes the next ``hetsched replan`` restart the pool
from its checkpoints without that job (``app.pool_replan``). Cancelling every
job of a pool cancels its Slurm job.

A job Slurm shows ended (one ``squeue`` first) is left as it is, even when the
state file still has it running: its end stands for the monitor to record.

Cancelling here records why (``--reason``) in a ``job-cancelled`` event, which
is also a reset event: the next replan gives the freed GPUs to the rest. A cancel
waits for a replan or submit acting on the batch to end (app/batch_lock.py).
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from hetsched.app.batch_lock import batch_turn
from hetsched.app.replan_pass import latest_rows
from hetsched.errors import InputError
from hetsched.slurm.client import JobInfo, SlurmClient
from hetsched.slurm.runner import CommandError
from hetsched.state.store import CANCELLED, SUBMITTING, Store, Submission

#: hetsched rows a cancel applies to (queued, running, or being submitted)
CANCELLABLE = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
                         "REQUEUED", "REQUEUE_HOLD", "SUBMITTED", SUBMITTING})


@dataclass
class CancelResult:
    cancelled: list[tuple[str, str]] = field(default_factory=list)  # (job, Slurm id)
    not_active: list[tuple[str, str]] = field(default_factory=list)  # (job, its state)
    #: (job, the pool's Slurm id): dropped from a pool that goes on with its other jobs
    dropped: list[tuple[str, str]] = field(default_factory=list)


def cancel_jobs(store: Store, client: SlurmClient, jobs: list[str] | None, *,
                reason: str = "", user: str | None = None,
                say: Callable[[str], None] | None = None) -> CancelResult:
    """Cancel ``jobs`` (None = every active job of the batch) and record why.

    In the batch's turn (app/batch_lock.py): a replan that is planning would otherwise
    submit a job cancelled meanwhile again, wherever it moved it; a submit in progress
    would go on submitting jobs a ``--all`` had not seen. ``say`` hears that it waits.
    """
    with batch_turn(store, "cancel", say):
        return _cancel(store, client, jobs, reason=reason, user=user)


def _cancel(store: Store, client: SlurmClient, jobs: list[str] | None, *,
            reason: str, user: str | None) -> CancelResult:
    rows = latest_rows(store)
    if jobs is not None:
        unknown = sorted(set(jobs) - set(rows))
        if unknown:
            raise InputError("hetsched cancel", f"no job {unknown[0]!r} in the state file; "
                             f"known: {', '.join(sorted(rows)) or '(none)'}", "JOB")
        names = list(dict.fromkeys(jobs))
    else:
        names = sorted(rows)
    res = CancelResult()
    targets = []
    for name in names:
        row = rows[name]
        if row.state in CANCELLABLE:
            targets.append(row)
        elif jobs is not None:
            res.not_active.append((name, row.state))
    try:
        ended = _ended(client, targets) if targets else {}
    except CommandError as e:  # Slurm did not answer: nothing is cancelled, the try recorded
        _failed(store, targets, e)
        raise
    for row in [r for r in targets if r.slurm_id in ended]:
        # the state file is behind (no monitor poll since it ended): its end stands,
        # for the monitor to record; marking it cancelled would lose it
        targets.remove(row)
        res.not_active.append((row.job, ended[row.slurm_id or ""]))
    pools = _pool_ids(store, rows)
    _whole_groups(rows, targets, pools)
    # a pool's Slurm job is cancelled only when every live job of it is
    chosen = {r.job for r in targets}
    partial = {sid for sid in pools if any(n not in chosen and o.slurm_id == sid
                                           and o.state in CANCELLABLE for n, o in rows.items())}
    who = user or _user()
    events: list[int] = []
    with store.tx():  # marked first: a concurrent monitor must not read it as a failure
        for row in targets:
            store.set_state(row.id, CANCELLED)
            events.append(store.add_event(
                "job-cancelled", job=row.job, slurm_id=row.slurm_id,
                detail=json.dumps({"by": who, "via": "hetsched cancel", "reason": reason})))
    try:
        client.cancel(sorted({r.slurm_id for r in targets
                              if r.slurm_id and r.slurm_id not in partial}))
    except CommandError as e:  # scancel failed or Slurm did not answer: nothing was cancelled
        with store.tx():
            for row in targets:
                store.set_state(row.id, row.state)
            store.mark_handled(events)
        _failed(store, targets, e)
        raise
    res.cancelled = [(r.job, r.slurm_id or "-") for r in targets if r.slurm_id not in partial]
    res.dropped = [(r.job, r.slurm_id or "-") for r in targets if r.slurm_id in partial]
    return res


def _failed(store: Store, targets: list[Submission], e: CommandError) -> None:
    """A cancel that reached no job, on record (handled: it is no reset event)."""
    store.add_event("cancel-failed", detail=json.dumps(
        {"jobs": [r.job for r in targets], "error": str(e)[:300]}), handled=True)


def _ended(client: SlurmClient, targets: list[Submission]) -> dict[str, str]:
    """Slurm ids among ``targets`` whose job has ended (one squeue): their state.

    A job squeue no longer lists ended more than ``MinJobAge`` ago (a job is
    listed from its sbatch on): how is for the monitor to find out.
    """
    from hetsched.app.monitor import combined_state

    ids = {r.slurm_id for r in targets if r.slurm_id}
    comps: dict[str, list[JobInfo]] = {sid: [] for sid in ids}
    for j in client.jobs():
        if j.leader in ids:
            comps[j.leader].append(j)
    return {sid: combined_state(cs) if cs else "ended; Slurm no longer lists it"
            for sid, cs in comps.items() if all(c.finished for c in cs)}


def _pool_ids(store: Store, rows: dict[str, Submission]) -> set[str]:
    """Slurm ids of pool jobs (a pool plan's jobs all run in one Slurm job)."""
    modes: dict[str, str] = {}
    out = set()
    for r in rows.values():
        if r.plan_id not in modes:
            modes[r.plan_id] = str((store.plan(r.plan_id) or {}).get("mode", "space"))
        if modes[r.plan_id] == "pool" and r.slurm_id:
            out.add(r.slurm_id)
    return out


def _whole_groups(rows: dict[str, Submission], targets: list[Submission],
                  pools: frozenset[str] | set[str] = frozenset()) -> None:
    """A co-location group's jobs share one Slurm job (app/group_submit.py): scancel of
    one would end them all, and they would read as cancelled by the user; refused.
    A pool's jobs share one too, but one of them can be dropped (module doc)."""
    chosen = {r.job for r in targets}
    for r in targets:
        if r.slurm_id in pools:
            continue
        others = sorted(n for n, o in rows.items() if r.slurm_id and o.slurm_id == r.slurm_id
                        and n not in chosen and o.state in CANCELLABLE)
        if others:
            raise InputError("hetsched cancel", f"job {r.job!r} shares Slurm job {r.slurm_id} "
                             f"with {', '.join(others)} (a co-location group); cancel them "
                             f"together: hetsched cancel {' '.join(sorted({r.job, *others}))}",
                             "JOB")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
