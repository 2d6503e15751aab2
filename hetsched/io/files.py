"""Reading users' files and writing our own, with the project's error and crash rules."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from hetsched.errors import InputError, UnsafeFileError

#: the mode of every folder hetsched creates for its state, layouts, plans, scripts,
#: checkpoints and reports: the user's own, whatever the umask
PRIVATE_DIR_MODE = 0o700


def private_dir(path: str | Path) -> Path:
    """Create ``path`` and any missing parents 0700 (whatever the umask); returns it.

    Folders that already exist are left as they are (a user's own ``--report-dir``
    keeps its mode); :func:`check_private` refuses to read from one that another
    user can write.
    """
    p = Path(path)
    missing = []
    q = p
    while not q.exists() and q != q.parent:
        missing.append(q)
        q = q.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, PRIVATE_DIR_MODE)
        except FileExistsError:
            continue  # created meanwhile by another process: not ours to chmod
        os.chmod(d, PRIVATE_DIR_MODE)  # the umask may have removed bits, never added any
    if not p.is_dir():
        raise NotADirectoryError(str(p))
    return p


def _foreign(st: os.stat_result, what: str, is_dir: bool) -> str | None:
    me = os.getuid()
    if st.st_uid != me and not (is_dir and st.st_uid == 0):  # root's folders are safe
        return f"{what} is owned by uid {st.st_uid}, not by you (uid {me})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        if not (is_dir and st.st_mode & stat.S_ISVTX):
            # a sticky folder (/tmp) lets nobody replace another user's file
            who = "others" if st.st_mode & stat.S_IWOTH else "its group"
            return f"{what} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_private(path: str | Path, what: str = "file") -> None:
    """Refuse (UnsafeFileError, one line) a file hetsched would act on that another user
    could have written: the file, or the folder holding it, group- or other-writable
    (a sticky folder such as /tmp excepted), or either owned by someone else.

    A file that does not exist passes (the caller reports it as missing).
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError:
        return
    why = _foreign(st, "the file", False)
    if why is None:
        parent = p.resolve().parent
        try:
            pst = os.stat(parent)
        except OSError:
            return
        why = _foreign(pst, f"its folder {parent}", True)
    if why is not None:
        raise UnsafeFileError(str(p), f"refused as a {what}: {why}; another user could have "
                              "replaced it (chmod go-w, or move it to a folder of your own)")


def read_text(path: str | Path, expected: str = "a text file",
              max_bytes: int | None = None) -> str:
    """Read a user's input file; every failure becomes one InputError line naming it.

    With ``max_bytes`` a larger file is refused before it is read. A pipe
    (``<(...)``, a named FIFO) is read as it comes, up to the same bound (or
    :data:`MAX_PIPE_BYTES`), and never waited on when nothing writes to it: it is
    opened without blocking, so a FIFO nobody writes reads as empty. A device
    or a socket is refused with one line.
    """
    p = Path(path)
    try:
        st = os.stat(p)
        if stat.S_ISFIFO(st.st_mode):
            return _read_pipe(p, expected, max_bytes or MAX_PIPE_BYTES)
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            raise InputError(str(p), f"is not a regular file or a pipe, expected {expected}")
        if max_bytes is not None:
            with p.open("rb") as f:
                data = f.read(max_bytes + 1)
            if len(data) > max_bytes:
                size = max(p.stat().st_size, len(data))
                raise InputError(str(p), f"file is {size / 2**20:.1f} MiB; the limit for "
                                 f"{expected} is {max_bytes / 2**20:g} MiB")
            return data.decode("utf-8")
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(p), "file not found") from None
    except IsADirectoryError:
        raise InputError(str(p), f"is a directory, expected {expected}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(str(p), f"cannot read: {e}") from None


#: what a pipe given as an input file may carry when the reader names no bound
MAX_PIPE_BYTES = 64 * 2**20


def _read_pipe(p: Path, expected: str, max_bytes: int) -> str:
    """A FIFO's content: opened non-blocking (an open for reading would otherwise wait
    for a writer for ever), then read blocking until its writers close it. With no
    writer at all, read() returns end-of-file at once (POSIX), so the result is ""."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            b = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not b:
                break
            chunks.append(b)
            size += len(b)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise InputError(str(p), f"the pipe carried more than {max_bytes / 2**20:g} MiB, the "
                         f"limit for {expected}")
    return b"".join(chunks).decode("utf-8")


def atomic_write(path: Path, text: str) -> None:
    """Write via a temp file and a rename, so a crash never leaves half a file.

    The file is created 0600 (mkstemp's mode): plans, scripts and state sit
    beside the state file and are the user's own.
    """
    atomic_write_with(path, lambda f: f.write(text.encode()))


#: what a write says when the disk or the user's quota is full
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def write_user_file(path: str | Path, data: str | bytes) -> None:
    """Write a file the user named (``--out``, ``-o``, ``--gantt``): whole or not at all.

    The data goes to a temporary file beside it and is renamed over it only once
    written, so a full disk or quota leaves the previous file as it was (a plain
    ``write_text`` had emptied it first). The file keeps its mode, or a new one gets
    the umask's (not 0600: a plan or a picture is the user's to share). A path that
    is not a regular file (``/dev/stdout``, a pipe) is written in place; a symbolic
    link is followed. Raises InputError naming the path.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        if os.path.exists(path) and not os.path.isfile(path):  # /dev/stdout, a pipe
            with open(path, "wb") as f:
                f.write(raw)
            return
        p = Path(os.path.realpath(path))
        if p.exists():
            mode = stat.S_IMODE(p.stat().st_mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        _replace_via_temp(p, lambda f: f.write(raw), mode)
    except OSError as e:
        raise InputError(str(path), f"cannot write: {e.strerror or e}"
                         + (" (the disk or your quota is full; the file was left as it was)"
                            if e.errno in NO_SPACE else "")) from None


def atomic_write_with(path: Path, write: Callable[[BinaryIO], object], *,
                      durable: bool = False) -> None:
    """``write(f)`` into a temp file beside ``path`` (0600), then rename it over ``path``.

    ``durable`` also fsyncs the file and its directory (checkpoints: a crash right
    after the rename must not lose them).
    """
    private_dir(path.parent)
    _replace_via_temp(path, write, 0o600, durable)


def _replace_via_temp(path: Path, write: Callable[[BinaryIO], object], mode: int,
                      durable: bool = False) -> None:
    """``write(f)`` into a temp file in ``path``'s folder, give it ``mode`` and rename it
    over ``path``; the temp file is removed when anything fails (see atomic_write_with)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
