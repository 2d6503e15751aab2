"""Sharing modes as adapters: what ``submit``, ``status``, ``cancel`` and ``replan`` do for
a plan of each mode, behind one interface, chosen in one place (:func:`mode_named`).

* **space** (app/space_submit.py, app/space_replan.py): each job's segment is one
  hetjob; a co-location group's jobs are one job together (app/group_submit.py: a
  group is a unit of space submission, since one plan mixes isolated jobs and groups);
  replan changes pending jobs in place, moves running ones when that pays.
* **pool** (app/pool_submit.py, app/pool_replan.py, app/pool_status.py): the whole
  pool is one hetjob with one executor per GPU; replan plans the rounds left.

The modes never import each other (import-linter ``independence`` contracts in
pyproject.toml); what they share is in app/submission.py and app/replan_pass.py.
``auto`` is a planning request, never a plan's mode: the planner picks space or pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from hetsched.app.cancel import CancelResult
from hetsched.app.replan_pass import ReplanResult
from hetsched.app.submission import SubmitResult
from hetsched.core.plan import Plan
from hetsched.errors import HetschedError
from hetsched.slurm.client import SlurmClient
from hetsched.state.store import CANCELLED, GAVE_UP, SUPERSEDED, Store


class Mode(Protocol):
    """What a sharing mode does for ``submit``, ``status``, ``cancel`` and ``replan``."""

    name: str

    def submit(self, plan: Plan, store: Store | None, client: SlurmClient | None, *,
               dry_run: bool = False, partition: str | None = None, pin_nodes: bool = True,
               only: set[str] | None = None, segment_of: Mapping[str, int] | None = None,
               source: str = "plan", allow_active_elsewhere: bool = False,
               progress: Callable[[str], None] | None = None, sbatch: Any = None,
               check_runnable: bool = True, skip_unrunnable: bool = False,
               files_base: Path | None = None) -> SubmitResult:
        """Submit ``plan`` (``dry_run``: render only; nothing written, Slurm untouched;
        ``files_base``: the files root a dry run without a store names)."""
        ...

    def replan(self, store: Store, client: SlurmClient, table: Any, *,
               policy: str | None = None, partition: str | None = None,
               spool: str | Path | None = None, force: bool = False, dry_run: bool = False,
               max_failures: int = 2, log: Callable[[str], None] = lambda _m: None,
               online: bool | None = None) -> ReplanResult:
        """One replan pass for the active plan of this mode; the caller holds the lock."""
        ...

    def progress(self, store: Store) -> Any | None:
        """What ``status`` shows beyond Slurm's view of each job (None: nothing)."""
        ...

    def cancel(self, store: Store, client: SlurmClient, jobs: list[str] | None, *,
               reason: str = "", user: str | None = None,
               say: Callable[[str], None] | None = None) -> CancelResult:
        """A user's cancel of ``jobs`` (None: every active job), final and recorded."""
        ...


class SpaceMode:
    name = "space"

    def submit(self, plan: Plan, store: Store | None, client: SlurmClient | None,
               **options: Any) -> SubmitResult:
        from hetsched.app.space_submit import submit_space

        return submit_space(plan, store, client, **options)

    def replan(self, store: Store, client: SlurmClient, table: Any,
               **options: Any) -> ReplanResult:
        from hetsched.app.space_replan import replan_space

        return replan_space(store, client, table, **options)

    def progress(self, store: Store) -> Any | None:
        return None  # Slurm's view and the job reports say it all (app/status.py)

    def cancel(self, store: Store, client: SlurmClient, jobs: list[str] | None, *,
               reason: str = "", user: str | None = None,
               say: Callable[[str], None] | None = None) -> CancelResult:
        """Each job is its own Slurm job, but a co-location group's are one (cancelled
        together or not at all: app/cancel.py)."""
        from hetsched.app.cancel import cancel_jobs

        return cancel_jobs(store, client, jobs, reason=reason, user=user, say=say)


class PoolMode:
    name = "pool"

    def submit(self, plan: Plan, store: Store | None, client: SlurmClient | None, *,
               only: set[str] | None = None, segment_of: Mapping[str, int] | None = None,
               check_runnable: bool = True, skip_unrunnable: bool = False,
               **options: Any) -> SubmitResult:
        """The whole pool as one hetjob: a subset of jobs or later segments cannot be
        submitted alone (said, not silently dropped); every job must run under the
        executor (refused, whatever ``skip_unrunnable`` says: one hetjob runs them all)."""
        from hetsched.app.pool_submit import submit_pool

        if only is not None or segment_of:
            raise HetschedError("a pool plan is submitted whole (one hetjob for the pool); "
                                "`hetsched replan` replans its remaining rounds")
        return submit_pool(plan, store, client, **options)

    def replan(self, store: Store, client: SlurmClient, table: Any, *,
               online: bool | None = None, **options: Any) -> ReplanResult:
        """``online`` applies to space plans: a pool plan's tasks are all planned anew."""
        from hetsched.app.pool_replan import pool_replan

        return pool_replan(store, client, table, **options)

    def progress(self, store: Store) -> Any | None:
        from hetsched.app.pool_status import active_pool_progress

        return active_pool_progress(store)

    def cancel(self, store: Store, client: SlurmClient, jobs: list[str] | None, *,
               reason: str = "", user: str | None = None,
               say: Callable[[str], None] | None = None) -> CancelResult:
        """The pool's jobs run in one hetjob: one job is dropped (marked cancelled; the
        pool's Slurm job goes on and the next replan restarts the pool without it), and
        the Slurm job is cancelled once every live job of the pool is (app/cancel.py)."""
        from hetsched.app.cancel import cancel_jobs

        return cancel_jobs(store, client, jobs, reason=reason, user=user, say=say)


MODES: dict[str, Mode] = {m.name: m for m in (SpaceMode(), PoolMode())}


def mode_named(name: str) -> Mode:
    """The adapter of a plan's mode (``Plan.mode``: space or pool)."""
    try:
        return MODES[name]
    except KeyError:
        raise HetschedError(f"unknown plan mode {name!r}; expected "
                            f"{' or '.join(MODES)}") from None


def mode_of(plan: Mapping[str, Any] | None) -> str:
    """A stored plan's mode: space when there is none, or an old plan without the key."""
    return str((plan or {}).get("mode") or "space")


def active_mode(store: Store) -> Mode:
    """The adapter of the store's active plan (space when there is none)."""
    return mode_named(mode_of(store.active_plan()))


def replan_mode(store: Store, active: Mapping[str, Any] | None) -> Mode:
    """The mode whose pass replans now, ``active`` the store's active plan (read once by
    the caller: a pool plan's JSON can be megabytes): its mode, but space once an active
    pool plan has ended (each of its jobs completed, cancelled or given up), so that new
    jobs from the spool start a space plan (a pool takes none, and an ended one never
    will); the ended pool's jobs are done there, never resubmitted."""
    mode = mode_named(mode_of(active))
    if mode.name == "pool" and active is not None:
        rows = [s for s in store.submissions(str(active["plan_id"])) if s.state != SUPERSEDED]
        if rows and all(s.state in ("COMPLETED", CANCELLED, GAVE_UP) for s in rows):
            return mode_named("space")
    return mode
