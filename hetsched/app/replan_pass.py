"""What a replan pass means in every mode (app/modes.py): the Slurm states it reads,
its result, each job's latest submission, and the poll that finds the reset events.

The modes' own passes: app/space_replan.py, app/pool_replan.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsched.app.monitor import RESET_KINDS, Monitor
from hetsched.app.replan_changes import (
    Change,
)
from hetsched.slurm.client import FINISHED_STATES, SlurmClient
from hetsched.state.store import (
    CANCELLED,
    GONE,
    SUBMIT_FAILED,
    SUPERSEDED,
    Store,
    Submission,
)

RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"})


#: states replan resubmits (up to max_failures); a user's CANCELLED is final, never here
FAILED_STATES = (FINISHED_STATES - {"COMPLETED", CANCELLED}) | {GONE}


@dataclass
class ReplanResult:
    status: str  # "unchanged", "replanned", "dry-run"
    reason: str = ""
    new_plan_id: str | None = None
    submitted: list[tuple[str, str]] = field(default_factory=list)
    cancelled: list[tuple[str, str]] = field(default_factory=list)
    updated: list[tuple[str, str]] = field(default_factory=list)  # pending, changed in place
    kept: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)
    user_cancelled: list[str] = field(default_factory=list)
    waiting: list[tuple[str, str]] = field(default_factory=list)  # (job, why it waits)
    changes: list[Change] = field(default_factory=list)  # job, was, now, why
    gave_up_now: list[str] = field(default_factory=list)  # given up in this pass
    #: spooled jobs left out (job, file): one of that name is queued or running
    spool_ignored: list[tuple[str, str]] = field(default_factory=list)
    #: spooled files not taken at all (a pool plan is active: its jobs are one Slurm job)
    spool_untaken: list[str] = field(default_factory=list)
    #: spooled files that did not load (the error, naming the file): moved to rejected/
    spool_rejected: list[str] = field(default_factory=list)
    #: spooled jobs that cannot be placed now (job, where they are kept: SPOOL/waiting/)
    spool_waiting: list[tuple[str, str]] = field(default_factory=list)
    plan: dict[str, Any] | None = None
    #: a --dry-run pass: the spool's files were not moved, only said where they would go
    dry_run: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.submitted or self.cancelled or self.updated or self.changes)

    @property
    def needs_user(self) -> bool:
        """Something the user must hear although nothing changed (cron prints it once):
        a job given up in this pass, a spooled job or file left out, rejected or kept."""
        return bool(self.gave_up_now or self.spool_ignored or self.spool_untaken
                    or self.spool_rejected or self.spool_waiting)

    def notes(self) -> list[str]:
        """What a user must hear even when nothing changed (gave up, waiting, cancelled)."""
        out = []
        if self.given_up:
            out.append("gave up on " + ", ".join(self.given_up) + " (retries exhausted)")
        if self.waiting:
            out.append("waiting: " + "; ".join(f"{j} ({w})" for j, w in self.waiting))
        if self.user_cancelled:
            out.append("cancelled by the user (final): " + ", ".join(self.user_cancelled))
        if self.spool_ignored:
            out.append("spool: left out (a job of that name is queued or running): "
                       + ", ".join(f"{j} ({f})" for j, f in self.spool_ignored))
        moved, kept = (("would be moved to rejected/", "would be kept in") if self.dry_run
                       else ("moved to rejected/", "kept in"))
        if self.spool_rejected:
            out.append(f"spool: rejected ({moved}): " + "; ".join(self.spool_rejected))
        for path in sorted({f for _, f in self.spool_waiting}):
            out.append(f"spool: {kept} {path}, to put back in the spool once it can run: "
                       + ", ".join(j for j, f in self.spool_waiting if f == path))
        if self.spool_untaken:
            out.append("spool: not taken yet: " + ", ".join(self.spool_untaken) + " (the "
                       "active plan is a pool plan, whose jobs run as one Slurm job; the "
                       "file stays in the spool and is taken once the pool has ended)")
        return out

    def summary(self) -> str:
        if self.status == "unchanged":
            return "; ".join([f"replan: nothing to do ({self.reason})", *self.notes()])
        parts = [f"replan ({self.reason}) -> plan {self.new_plan_id}"]
        if self.submitted:
            parts.append("submitted " + ", ".join(f"{j}={i}" for j, i in self.submitted))
        if self.cancelled:
            parts.append("cancelled " + ", ".join(f"{j}={i}" for j, i in self.cancelled))
        if self.updated:
            parts.append("updated in place " + ", ".join(f"{j}={i}" for j, i in self.updated))
        if self.kept:
            parts.append("kept " + ", ".join(self.kept))
        return "; ".join(parts + self.notes())


def loaded(table: Any) -> Any:
    """The planner's throughput table: ``table`` itself, or what a zero-argument loader
    returns, called only now that a plan is made (cron's ``replan`` with nothing to do
    needs no profiles, so an empty history is no error there)."""
    return table() if callable(table) else table


def replanned_from(store: Store, plan_id: str) -> set[str]:
    """``plan_id`` and the plans it was replanned from, back to the one first submitted
    (the store's replan records): one batch's plans. A later batch reusing its job
    names is another chain."""
    ids = {plan_id}
    replans = store.replans()
    grew = True
    while grew:
        grew = False
        for r in replans:
            if r.get("new_plan") in ids and r.get("old_plan") and r["old_plan"] not in ids:
                ids.add(str(r["old_plan"]))
                grew = True
    return ids


def latest_rows(store: Store) -> dict[str, Submission]:
    """Each job's most recent submission that was not superseded by a replan."""
    out: dict[str, Submission] = {}
    for s in store.submissions():
        if s.state not in (SUPERSEDED, SUBMIT_FAILED):
            out[s.job] = s  # rows come in id order: the last one wins
    return out


def poll_reset_events(store: Store, client: SlurmClient, partition: str | None,
                      spool: str | Path | None, log: Callable[[str], None]
                      ) -> tuple[Any, list[dict[str, Any]], str]:
    """Poll Slurm once (recording events); the unhandled reset events and why to replan."""
    cycle = Monitor(store, client, partition=partition, spool=spool).poll()
    for ev in cycle.events:
        log(f"event {ev}")
    events = [e for e in store.events(unhandled_only=True) if e["kind"] in RESET_KINDS]
    return cycle, events, ", ".join(sorted({e["kind"] for e in events})) or "forced"
