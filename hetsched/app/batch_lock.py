"""One writer of a batch at a time: ``hetsched replan`` and ``hetsched submit`` take turns.

Both change the batch in the state file and in Slurm. A cron replan that ran in the
middle of a submit saw the batch half submitted (its first jobs queued, the rest not
yet recorded) and decided on that. So both hold the same lock, an ``flock`` on
``STATE.files/replan.lock`` (filelock; the kernel drops it when its holder dies, so a
crash never leaves it stuck):

* a replan that finds it held exits 75 at once (``--wait`` seconds first), and cron
  runs it again next time;
* a submit that finds it held says so and waits for the replan to end, up to
  :data:`SUBMIT_WAIT_S`, then exits 75.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hetsched.errors import EXIT_LOCKED, HetschedError
from hetsched.io.files import private_dir
from hetsched.io.jobfiles import files_root
from hetsched.io.jobfiles import replan_lock as replan_lock_path
from hetsched.state.store import Store, no_locks

#: how long a submit waits for a replan that holds the lock (a replan pass plans: seconds
#: to a minute on large batches)
SUBMIT_WAIT_S = 300.0


class ReplanLocked(HetschedError):
    """Another replan, or a submit, holds the batch's lock."""

    exit_code = EXIT_LOCKED


def lock_path(store: Store) -> Path:
    """The batch's lock file, beside the state file."""
    return replan_lock_path(files_root(store.path))


def _holder(path: Path) -> str:
    try:
        return path.with_name(path.name + ".pid").read_text().strip() or "?"
    except OSError:
        return "?"


def _acquire(path: Path, wait_s: float) -> Any:
    """The held FileLock, or ReplanLocked after ``wait_s`` seconds."""
    from filelock import FileLock, Timeout

    private_dir(path.parent)
    lock = FileLock(str(path), mode=0o600)
    try:
        lock.acquire(timeout=wait_s, poll_interval=0.2)
    except Timeout:
        raise ReplanLocked(f"another replan or submit is running (lock {path}, pid "
                           f"{_holder(path)}); skipped") from None
    except OSError as e:  # ENOLCK and the like: the file system has no working flock
        raise no_locks(path, e.strerror or str(e)) from None
    try:
        path.with_name(path.name + ".pid").write_text(f"{os.getpid()}\n")
    except BaseException:  # not held by anyone who will release it
        lock.release()
        raise
    return lock


@contextlib.contextmanager
def replan_lock(path: str | Path, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the lock on ``path`` (created 0600) or raise ReplanLocked after ``wait_s``
    seconds. The holder's pid is kept beside it for the message."""
    lock = _acquire(Path(path), wait_s)
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def submit_lock(store: Store, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the batch's lock for a submit: at once, or after the replan holding it ends
    (saying so first), for at most :data:`SUBMIT_WAIT_S` seconds."""
    path = lock_path(store)
    try:
        lock = _acquire(path, 0.0)
    except ReplanLocked:
        if say is not None:
            say(f"waiting for the replan running now (pid {_holder(path)}) to finish")
        try:
            lock = _acquire(path, SUBMIT_WAIT_S)
        except ReplanLocked:
            raise ReplanLocked(
                f"a replan (pid {_holder(path)}) has held the batch's lock {path} for "
                f"{SUBMIT_WAIT_S:g} s; nothing was submitted: submit again when it has "
                "finished") from None
    try:
        yield
    finally:
        lock.release()


__all__ = ["ReplanLocked", "replan_lock", "submit_lock", "lock_path", "SUBMIT_WAIT_S"]
