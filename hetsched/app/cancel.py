"""``hetsched cancel [JOB...|--all]``: a user's cancel, final and recorded.

A job the user cancels is never resubmitted by ``replan``, whether it was
cancelled here or with ``scancel`` (the monitor sees Slurm's ``CANCELLED``
state for a job hetsched did not cancel itself: hetsched marks its own
cancels ``SUPERSEDED`` *before* calling ``scancel``). Failures are told apart
by their own states: ``FAILED``, ``NODE_FAIL``, ``TIMEOUT``,
``OUT_OF_MEMORY``, ``PREEMPTED``, ``BOOT_FAIL``.

A co-location group's jobs are cancelled together or not at all (one Slurm job).

Cancelling here records why (``--reason``) in a ``job-cancelled`` event, which
is also a reset event: the next replan gives the freed GPUs to the rest.
"""

from __future__ import annotations

import getpass
import json
from dataclasses import dataclass, field

from hetsched.app.replan_pass import latest_rows
from hetsched.errors import InputError
from hetsched.slurm.client import SlurmClient
from hetsched.state.store import CANCELLED, SUBMITTING, Store, Submission

#: hetsched rows a cancel applies to (queued, running, or being submitted)
CANCELLABLE = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
                         "REQUEUED", "REQUEUE_HOLD", "SUBMITTED", SUBMITTING})


@dataclass
class CancelResult:
    cancelled: list[tuple[str, str]] = field(default_factory=list)  # (job, Slurm id)
    not_active: list[tuple[str, str]] = field(default_factory=list)  # (job, its state)


def cancel_jobs(store: Store, client: SlurmClient, jobs: list[str] | None, *,
                reason: str = "", user: str | None = None) -> CancelResult:
    """Cancel ``jobs`` (None = every active job of the batch) and record why."""
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
    _whole_groups(rows, targets)
    who = user or _user()
    with store.tx():  # marked first: a concurrent monitor must not read it as a failure
        for row in targets:
            store.set_state(row.id, CANCELLED)
            store.add_event("job-cancelled", job=row.job, slurm_id=row.slurm_id,
                            detail=json.dumps({"by": who, "via": "hetsched cancel",
                                               "reason": reason}))
    client.cancel([r.slurm_id for r in targets if r.slurm_id])
    res.cancelled = [(r.job, r.slurm_id or "-") for r in targets]
    return res


def _whole_groups(rows: dict[str, Submission], targets: list[Submission]) -> None:
    """A co-location group's jobs share one Slurm job (app/group_submit.py): scancel of
    one would end them all, and they would read as cancelled by the user; refused."""
    chosen = {r.job for r in targets}
    for r in targets:
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
