"""Which file system the state file lives on, and so which SQLite journal it gets.

SQLite's write-ahead log keeps its index in shared memory (the ``-shm`` file,
mapped by every connection), so "all processes using a database must be on
the same host" (sqlite.org/wal.html). A login node's home directory is
usually NFS, Lustre or GPFS, shared by several login nodes: ``replan`` from
cron on one and ``submit`` or ``status`` on another would each see its own
index and could corrupt the file. On a network file system the state file
therefore uses a rollback journal (``journal_mode = DELETE``), which
coordinates through the file system's byte-range locks instead; WAL stays
where it is safe, on local disks, because readers there never wait for a
writer. The ``state_journal`` setting overrides the choice (``wal`` or
``delete``) for a file system this list does not know.

The file system is read from ``/proc/self/mountinfo`` (Linux): the mount
whose mount point is the longest prefix of the file's real path. Where that
cannot be read (another OS), the file system is unknown and WAL is kept, as
before this check existed.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from hetsched.io.files import NO_SPACE

#: file system types whose files other hosts may open too (mountinfo's type field)
NETWORK_FS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph",
    "glusterfs", "afs", "panfs", "wekafs", "9p", "ncpfs", "ocfs2", "gfs2", "pvfs2",
    "orangefs", "cvfs", "quobyte", "vboxsf", "virtiofs"})
MOUNTINFO = Path("/proc/self/mountinfo")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of each line of a mountinfo file.

    A line is ``id parent major:minor root mount-point options [optional...] -
    fstype source super-options``: the type is the first field after ``-``.
    """
    out = []
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:] or len(fields) < 5:
            continue
        dash = fields.index("-", 6)
        if dash + 1 < len(fields):
            out.append((_unescape(fields[4]), fields[dash + 1]))
    return out


def filesystem_type(path: str | Path, mountinfo: str | None = None) -> str | None:
    """The type of the file system ``path`` is on (or would be created on); None when
    it cannot be told. ``mountinfo``: the text of a mountinfo file (tests)."""
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text()
        except OSError:
            return None
    p = Path(os.path.realpath(path))
    while not p.exists() and p != p.parent:  # a file not created yet: its folder's
        p = p.parent
    best, kind = -1, None
    for point, fstype in parse_mountinfo(mountinfo):
        if (point == "/" or p == Path(point) or Path(point) in p.parents) and \
                len(point) >= best:  # the last of equal mount points is the one on top
            best, kind = len(point), fstype
    return kind


def is_network(fstype: str | None) -> bool:
    """A known network file system, or any FUSE one (``fuse``, ``fuse.<name>``,
    ``fuseblk``): sshfs, s3fs and the like may be shared and may not map shared memory
    coherently; a rollback journal is only slower where WAL would have been safe."""
    return fstype is not None and (fstype in NETWORK_FS or fstype.startswith("fuse"))


#: what fcntl says on a file system that has no byte-range locks
NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP})


def _probe(folder: str | Path, act: Callable[[IO[bytes]], object],
           errnos: frozenset[int]) -> str | None:
    """``act`` on a fresh temporary file in ``folder`` (its nearest folder that exists):
    the error's words when it fails with one of ``errnos``, else None."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:  # not created yet: its parent's
        folder = folder.parent
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".hetsched-probe-") as f:
            act(f)
    except OSError as e:  # a folder that is not writable is not this probe's to say
        return (e.strerror or str(e)) if e.errno in errnos else None
    return None


def lock_problem(folder: str | Path) -> str | None:
    """Why the file system of ``folder`` refuses POSIX byte-range locks (which SQLite's
    journals and the replan lock need), or None when it takes them or cannot be tried.

    A lock taken on a fresh temporary file there: an NFS mount without its lock daemon
    answers ENOLCK, which SQLite reads as "busy" and waits out its busy timeout for.
    """
    import fcntl

    return _probe(folder, lambda f: fcntl.lockf(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB),
                  NO_LOCKS)


def space_problem(folder: str | Path) -> str | None:
    """Why nothing can be written in ``folder`` for lack of space (a full disk, a full
    quota: what SQLite calls "disk I/O error" or "database or disk is full"), or None.
    Asked only after SQLite failed: 64 KiB written and synced to a temporary file."""
    def fill(f: IO[bytes]) -> None:
        f.write(b"\0" * 65536)
        f.flush()
        os.fsync(f.fileno())

    return _probe(folder, fill, NO_SPACE)


def journal_mode(path: str | Path, setting: str = "auto",
                 mountinfo: str | None = None) -> tuple[str, str]:
    """The journal the state file at ``path`` gets (``wal`` or ``delete``) and why."""
    if setting in ("wal", "delete"):
        return setting, "the state_journal setting"
    fstype = filesystem_type(path, mountinfo)
    if is_network(fstype):
        return "delete", (f"{fstype}: a network or FUSE file system, where WAL is unsafe "
                          "across hosts")
    return "wal", f"{fstype}: a local file system" if fstype else "file system unknown"


__all__ = ["NETWORK_FS", "filesystem_type", "is_network", "journal_mode", "lock_problem",
           "parse_mountinfo", "space_problem"]
