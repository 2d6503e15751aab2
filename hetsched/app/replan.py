"""``hetsched replan``: the cron-safe pass that brings Slurm in line after reset events.

Made for cron (``* * * * * hetsched replan --throughputs profiles.csv``):

* **Lock.** A lock file (filelock: ``flock``) serialises runs; a second run exits at once
  with code 75 (or waits ``--wait`` seconds). The kernel drops the lock when a
  run dies, so a crash never leaves it stuck.
* **Idempotent and quiet.** It polls once (see monitor.py); without unhandled
  reset events it does nothing and prints nothing. Events are marked handled
  only after Slurm was brought in line, so a failed run is retried next time.
* **One pass per mode.** :func:`replan` runs the pass of the active plan's mode
  (app/modes.py): app/space_replan.py (pending jobs changed in place or
  resubmitted, running jobs moved when that pays, failures retried) or
  app/pool_replan.py (the rounds left of a pool plan, on the GPUs still up).

Exit codes (also in docs/slurm.md): 0 ok (changed or not), 1 unexpected
error, 2 bad input, 3 a Slurm command failed, 4 Slurm unreachable, 6-10 state
file unusable (docs/reliability.md), 75 another replan holds the lock.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetsched.app.batch_lock import ReplanLocked, lock_path, replan_lock  # noqa: F401
from hetsched.app.replan_pass import (  # noqa: F401 - the names callers use
    FAILED_STATES,
    RUNNING_STATES,
    ReplanResult,
    latest_rows,
)
from hetsched.app.submission import files_dir
from hetsched.errors import EXIT_LOCKED  # noqa: F401 - EX_TEMPFAIL: "try again later"
from hetsched.io.files import private_dir
from hetsched.io.jobfiles import replan_log
from hetsched.slurm.client import SlurmClient
from hetsched.state.store import Store

EXIT_OK, EXIT_ERROR, EXIT_INPUT, EXIT_SLURM, EXIT_UNREACHABLE, EXIT_STATE = 0, 1, 2, 3, 4, 6

_log = logging.getLogger("hetsched.replan")


def default_lock(store: Store) -> Path:
    return lock_path(store)


def default_log(store: Store) -> Path:
    return replan_log(files_dir(store))


def file_logger(path: str | Path) -> Callable[[str], None]:
    """A logger appending timestamped lines to ``path`` (created 0600)."""
    p = Path(path)
    private_dir(p.parent)

    def log(msg: str) -> None:
        _log.info("%s", msg)  # also on stderr under `hetsched -v replan`
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


def replan(store: Store, client: SlurmClient, table: Any, *, policy: str | None = None,
           partition: str | None = None, spool: str | Path | None = None,
           force: bool = False, dry_run: bool = False, max_failures: int = 2,
           log: Callable[[str], None] = lambda _m: None,
           online: bool | None = None) -> ReplanResult:
    """One replan pass of the active plan's mode (app/modes.py). The caller holds the lock.

    ``table``: the planner's throughput table, or a zero-argument loader of it, called
    only when the pass makes a plan (app/replan_pass.loaded).

    ``online`` (default: setting ``replan_online``; space mode): started jobs stay on
    their GPUs until they end.
    """
    from hetsched.app.modes import mode_of, replan_mode

    active = store.active_plan()
    mode = replan_mode(store, active)
    if mode.name != mode_of(active) and spool \
            and Path(spool).is_dir():
        # a pool plan has ended: the files it left in the spool are read now
        store.forget_spool_seen(str(p) for p in Path(spool).glob("*.y*ml"))
    return mode.replan(store, client, table, policy=policy, partition=partition,
                       spool=spool, force=force, dry_run=dry_run,
                       max_failures=max_failures, log=log, online=online)
