"""One writer of a batch at a time: ``replan``, ``submit`` and ``cancel`` take turns.

Each changes the batch in the state file and in Slurm, and decides on what it read
first. A cron replan that ran in the middle of a submit saw the batch half submitted
(its first jobs queued, the rest not yet recorded) and decided on that; a user's cancel
that landed while a replan planned was undone when the replan moved that job (it
submitted the job again on the GPUs it had chosen); a ``cancel --all`` in the middle of
a submit missed the jobs not yet submitted. So all three hold the same lock, an
``flock`` on ``STATE.files/replan.lock`` (filelock; the kernel drops it when its holder
dies, so a crash never leaves it stuck):

* a replan that finds it held exits 75 at once (``--wait`` seconds first), and cron
  runs it again next time;
* a user's submit or cancel that finds it held says who holds it and waits for it to
  end, up to :data:`SUBMIT_WAIT_S`, then exits 75 having changed nothing.

The holder's pid and command are written beside the lock, for those messages.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hetsched.errors import EXIT_LOCKED, HetschedError
from hetsched.io.files import private_dir
from hetsched.io.jobfiles import files_root
from hetsched.io.jobfiles import replan_lock as replan_lock_path
from hetsched.state.guard import StateAccessError, StateReadOnly
from hetsched.state.store import Store, no_locks

#: how long a submit or cancel waits for the command that holds the lock (a replan pass
#: plans: seconds to a minute on large batches)
SUBMIT_WAIT_S = 300.0


class ReplanLocked(HetschedError):
    """Another replan, submit or cancel holds the batch's lock."""

    exit_code = EXIT_LOCKED


def lock_path(state: Store | Path) -> Path:
    """The batch's lock file, beside the state file (a store, or the state file's path)."""
    return replan_lock_path(files_root(state.path if isinstance(state, Store) else state))


def _holder(path: Path) -> str:
    """Who holds the lock, from the file beside it: "a replan (pid 12)"."""
    try:
        pid, _, role = path.with_name(path.name + ".pid").read_text().strip().partition(" ")
    except OSError:
        pid, role = "", ""
    return f"{'a ' + role if role else 'another hetsched command'} (pid {pid or '?'})"


def _cannot_write(path: Path, e: OSError) -> StateAccessError:
    """One line for a lock file that cannot be made (a read-only mount, no permission,
    a full disk): nothing was changed."""
    if e.errno == errno.EROFS:
        return StateReadOnly(f"cannot write the batch's lock {path}: it is on a read-only "
                             "file system; nothing was changed: point HETSCHED_STATE at a "
                             "writable copy of the state file")
    return StateAccessError(f"cannot write the batch's lock {path} ({e.strerror or e}); "
                            "nothing was changed: free space there, make its folder "
                            "writable, or point HETSCHED_STATE elsewhere")


def _acquire(path: Path, wait_s: float, role: str) -> Any:
    """The held FileLock, or ReplanLocked after ``wait_s`` seconds."""
    from filelock import FileLock, Timeout

    try:
        private_dir(path.parent)
    except OSError as e:
        raise _cannot_write(path, e) from None
    lock = FileLock(str(path), mode=0o600)
    try:
        lock.acquire(timeout=wait_s, poll_interval=0.2)
    except Timeout:
        raise ReplanLocked(f"another replan, submit or cancel is running: "
                           f"{_holder(path)} holds the batch's lock {path}; skipped") from None
    except OSError as e:  # ENOLCK and the like: the file system has no working flock
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT):
            raise _cannot_write(path, e) from None
        raise no_locks(path, e.strerror or str(e)) from None
    try:
        path.with_name(path.name + ".pid").write_text(f"{os.getpid()} {role}\n")
    except OSError as e:  # not held by anyone who will release it
        lock.release()
        raise _cannot_write(path.with_name(path.name + ".pid"), e) from None
    except BaseException:
        lock.release()
        raise
    return lock


@contextlib.contextmanager
def replan_lock(path: str | Path, wait_s: float = 0.0, role: str = "replan"
                ) -> Iterator[None]:
    """Hold the lock on ``path`` (created 0600) or raise ReplanLocked after ``wait_s``
    seconds. The holder's pid and ``role`` are kept beside it for the messages."""
    lock = _acquire(Path(path), wait_s, role)
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def batch_turn(state: Store | Path, role: str, say: Callable[[str], None] | None = None
               ) -> Iterator[None]:
    """Hold the batch's lock for a user's ``role`` ("submit", "cancel", "restore"): at
    once, or after the command holding it ends (saying so first), for at most
    :data:`SUBMIT_WAIT_S` seconds; past that ReplanLocked, and nothing was done."""
    path = lock_path(state)
    try:
        lock = _acquire(path, 0.0, role)
    except ReplanLocked:
        if say is not None:
            say(f"waiting for {_holder(path)}, which holds the batch's lock, to finish")
        try:
            lock = _acquire(path, SUBMIT_WAIT_S, role)
        except ReplanLocked:
            done = {"submit": "submitted", "cancel": "cancelled",
                    "restore": "restored"}.get(role, "done")
            raise ReplanLocked(
                f"{_holder(path)} has held the batch's lock {path} for {SUBMIT_WAIT_S:g} s; "
                f"nothing was {done}: {role} again when it has finished") from None
    try:
        yield
    finally:
        lock.release()


__all__ = ["ReplanLocked", "replan_lock", "batch_turn", "lock_path", "SUBMIT_WAIT_S"]
