"""Submit a plan, any mode: the plan's mode adapter does it (app/modes.py).

Space mode: app/space_submit.py (each job's first segment one hetjob; module doc
there lists the guarantees). Pool mode: app/pool_submit.py (one hetjob for the pool).
What every mode shares: app/submission.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from hetsched.app.batch_lock import batch_turn
from hetsched.app.modes import mode_named
from hetsched.app.submission import (  # noqa: F401 - the names callers use
    SubmitError,
    SubmitInterrupted,
    SubmitResult,
    base_sbatch,
    check_plan,
    files_dir,
    run_id,
    time_limit,
)
from hetsched.core.plan import Plan
from hetsched.core.sbatch import SbatchOptions
from hetsched.slurm.client import SlurmClient
from hetsched.state.store import Store


def submit(plan: Plan, store: Store | None, client: SlurmClient | None, *,
           dry_run: bool = False, partition: str | None = None, pin_nodes: bool = True,
           only: set[str] | None = None, segment_of: Mapping[str, int] | None = None,
           source: str = "plan", allow_active_elsewhere: bool = False,
           progress: Callable[[str], None] | None = None,
           sbatch: SbatchOptions | None = None, check_runnable: bool = True,
           skip_unrunnable: bool = False, files_base: Path | None = None) -> SubmitResult:
    """Submit ``plan`` as its mode does (app/modes.py).

    ``only`` restricts to some jobs (replan), ``segment_of`` picks another
    segment per job (space mode). With ``dry_run`` nothing is written and Slurm
    is not touched: the result carries the scripts (and the jobs that would fail), rendered
    with the real paths of ``files_base`` (the state file's ``.files`` folder) so a dry
    run fails where the submit would.
    Jobs that would fail where they run (app/runnable.py) are refused, or left
    out with ``skip_unrunnable`` (space mode).
    """
    def by_mode(plan: Plan) -> SubmitResult:
        return mode_named(plan.mode).submit(
            plan, store, client, dry_run=dry_run, partition=partition, pin_nodes=pin_nodes,
            only=only, segment_of=segment_of, source=source,
            allow_active_elsewhere=allow_active_elsewhere, progress=progress, sbatch=sbatch,
            check_runnable=check_runnable, skip_unrunnable=skip_unrunnable,
            files_base=files_base)

    if dry_run or store is None or client is None or only is not None \
            or segment_of is not None:
        return by_mode(plan)  # a dry run, no store, or a replan's part (it holds the lock)
    # a user's submit takes its turn on the batch (app/batch_lock.py)
    with batch_turn(store, "submit", progress):
        pid = check_plan(plan, source)
        rid = run_id(plan, pid, store, client)
        if rid != pid and progress is not None:
            progress(f"plan {pid} ran to its end before: submitting its jobs again "
                     f"as plan {rid}")
        return by_mode(dataclasses.replace(plan, plan_id=rid))  # the id named: not hashed
