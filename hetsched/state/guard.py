"""Checks before the state file is opened, and its backups.

The state file remembers which Slurm jobs hetsched submitted; losing it
silently means forgetting jobs that are still queued. So every way the file
can be unusable gets its own message and exit code (hetsched/errors.py's
table), and nothing is written to a file that failed a check:

* empty (0 bytes, e.g. truncated by a full disk or ``> state.db``): refused,
  never silently re-created as an empty store;
* read-only (no owner write bit, or not writable by this user): refused as
  read-only, which is not corruption: the message says ``chmod u+w``;
* unreadable (permission denied), or a directory where SQLite cannot create
  its ``-wal``/``-shm`` files: refused naming the permission problem;
* a table missing (dropped by hand): refused, naming the table.

Backups: whenever a command changed the store, :func:`write_backup` copies it
with SQLite's online backup API into ``<state>.bak`` (written to a temporary
file and renamed, so a crash mid-backup keeps the previous backup).
``hetsched state restore`` puts a backup back, keeping the damaged file aside.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from hetsched.errors import (
    EXIT_STATE_EMPTY,
    EXIT_STATE_INCOMPLETE,
    EXIT_STATE_PERMISSION,
    EXIT_STATE_READONLY,
    HetschedError,
)
from hetsched.io.files import private_dir

BACKUP_SUFFIX = ".bak"


class StateAccessError(HetschedError):
    """The state file is fine but this process may not read or write it."""

    exit_code = EXIT_STATE_PERMISSION


class StateReadOnly(StateAccessError):
    """The state file is read-only; it is not corrupted."""

    exit_code = EXIT_STATE_READONLY


class StateEmpty(HetschedError):
    """The state file exists but holds nothing (truncated)."""

    exit_code = EXIT_STATE_EMPTY


class StateIncomplete(HetschedError):
    """The state file lacks tables its schema version has (damaged by hand)."""

    exit_code = EXIT_STATE_INCOMPLETE


def backup_path(state: Path) -> Path:
    return state.with_name(state.name + BACKUP_SUFFIX)


def restore_hint(state: Path) -> str:
    """What to do with a state file that cannot be read: the backup, if one exists."""
    bak = backup_path(state)
    if bak.exists():
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(bak.stat().st_mtime))
        return f"restore the backup of {when} with `hetsched state restore`"
    return "no backup exists; move the file away to start afresh"


def sqlite_uri(p: Path, query: str) -> str:
    """``file:`` URI of ``p`` with ``query``: the path percent-encoded, so a folder named
    ``#1`` or ``a?b`` is not read as the URI's fragment or query (which opened another
    file, or none)."""
    from urllib.parse import quote

    return f"file:{quote(str(p.absolute()))}?{query}"


def read_only_mount(p: Path) -> bool:
    """Whether ``p`` is on a file system mounted read-only (nothing there can change
    while it is: SQLite may then read it without locks or a WAL index)."""
    try:
        return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def preflight(p: Path) -> None:
    """Refuse an existing state file that cannot be used, before SQLite touches it."""
    try:
        st = p.stat()
    except FileNotFoundError:
        if p.is_symlink():  # a link to nothing: creating "it" would write wherever it points
            raise StateAccessError(
                f"state file {p} is a symbolic link to {os.readlink(p)!r}, which does not "
                "exist; restore its target or point HETSCHED_STATE at the real file") from None
        return
    except PermissionError as e:
        raise StateAccessError(f"cannot reach state file {p}: {e.strerror}; check the "
                               "permissions of its directory") from None
    if stat.S_ISDIR(st.st_mode):
        raise StateAccessError(f"state file {p} is a directory")
    if not st.st_mode & stat.S_IRUSR or not os.access(p, os.R_OK):
        raise StateAccessError(
            f"cannot read state file {p}: permission denied (mode "
            f"{stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}); run hetsched as its "
            "owner or fix its permissions; the file was left untouched")
    if st.st_size == 0:
        raise StateEmpty(
            f"state file {p} is empty (0 bytes): it was truncated or made by something else, "
            "and jobs hetsched submitted may still be queued in Slurm. It was left "
            f"untouched: {restore_hint(p)}")
    if read_only_mount(p):
        raise StateReadOnly(
            f"state file {p} is on a read-only file system; it is not corrupted, but every "
            "hetsched command records what it does there: point HETSCHED_STATE at a writable "
            "copy (`hetsched status` still reads it)")
    if not st.st_mode & stat.S_IWUSR or not os.access(p, os.W_OK):
        raise StateReadOnly(
            f"state file {p} is read-only (mode {stat.S_IMODE(st.st_mode):04o}); it is not "
            "corrupted, but every hetsched command records what it does there: make it "
            f"writable (chmod u+w {p}) or point HETSCHED_STATE at a writable copy")
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise StateAccessError(
            f"cannot write in {p.parent}, where SQLite keeps the state file's journal "
            f"({p.name}-wal); make the directory writable or point HETSCHED_STATE elsewhere")


def expected_tables(schema: str, migrations: Iterable[str]) -> set[str]:
    """The tables a schema script plus its migrations create."""
    text = schema + "\n".join(migrations)
    return set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", text))


def check_tables(p: Path, present: set[str], expected: set[str], version: int) -> None:
    missing = sorted(expected - present)
    if missing:
        raise StateIncomplete(
            f"state file {p} lacks table(s) {', '.join(map(repr, missing))} of schema version "
            f"{version} (damaged or edited by hand); it was left untouched: {restore_hint(p)}")


def create_atomically(p: Path) -> Path:
    """A fresh empty file in ``p``'s directory, 0600, for the caller to fill and link."""
    try:
        private_dir(p.parent)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.new.")
    except OSError as e:
        raise StateAccessError(f"cannot create state file {p}: {e.strerror}; make "
                               f"{p.parent} writable or point HETSCHED_STATE elsewhere") from None
    os.close(fd)
    os.chmod(tmp, 0o600)
    return Path(tmp)


def publish(tmp: Path, p: Path) -> None:
    """Put a filled new state file in place unless another process created one first."""
    try:
        os.link(tmp, p)
    except FileExistsError:
        pass  # another process won the race; its file is checked like any other
    finally:
        tmp.unlink(missing_ok=True)


def write_backup(conn: sqlite3.Connection, dest: Path) -> Path:
    """Copy an open store with SQLite's backup API to ``dest`` (atomically, 0600)."""
    private_dir(dest.parent)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    try:
        os.chmod(tmp, 0o600)
        out = sqlite3.connect(tmp)
        try:
            conn.backup(out)
            out.execute("PRAGMA journal_mode = DELETE")  # a self-contained single file
        finally:
            out.close()
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def _aside(p: Path) -> Path | None:
    """Move a damaged state file (and its -wal/-shm) aside, never deleting it."""
    if not p.exists():
        return None
    dest = p.with_name(f"{p.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        for suffix in ("-wal", "-shm"):
            side = p.with_name(p.name + suffix)
            if side.exists():
                os.replace(side, dest.with_name(dest.name + suffix))
        os.replace(p, dest)
    except OSError as e:
        raise StateAccessError(f"cannot move {p} aside before restoring: {e.strerror}; "
                               "nothing was changed") from None
    return dest


def restore_backup(state: Path, source: Path,
                   check: Callable[[sqlite3.Connection, Path], None]) -> Path | None:
    """Put the backup ``source`` in place of ``state``; returns where the old file went.

    The backup is checked (read-only) with ``check`` before anything moves; the
    old file is renamed aside, never deleted.
    """
    if not source.is_file() or source.stat().st_size == 0:
        raise StateEmpty(f"no usable backup at {source}; nothing was changed")
    try:
        src = sqlite3.connect(sqlite_uri(source, "mode=ro"), uri=True)
    except sqlite3.Error as e:
        raise StateAccessError(f"cannot open backup {source}: {e}; nothing was changed"
                               ) from None
    try:
        try:
            check(src, source)
        except sqlite3.DatabaseError as e:
            raise StateIncomplete(f"backup {source} is not usable ({e}); nothing was changed"
                                  ) from None
        aside = _aside(state)
        write_backup(src, state)
    finally:
        src.close()
    return aside
