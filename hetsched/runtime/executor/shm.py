"""Shared memory between the coordinator and the executors of its own node.

Parameters and gradients of an executor on the coordinator's node do not cross
TCP: after the authenticated handshake the coordinator offers, over the main
connection, the names of

* one **parameter segment per job**: the job's master parameters themselves
  (the parameter server's flat tensor lives in it, so the optimizer step writes
  the next version in place), under a seqlock: the header's sequence number is
  odd while the coordinator writes, and names the version (rounds done) it
  holds when even; an executor copies the data out into its own (pinned) host
  buffer and checks the sequence did not move and the version is the one the
  ``get`` reply named, else the read is refused (the round barrier already
  keeps version ``r`` still while a task of round ``r`` reads it: round ``r``'s
  step needs that very task's gradient);
* one **gradient segment per (GPU, job)**: the executor writes a task's
  contribution there with its round, task and a fresh sequence number in the
  header, and sends only ``put {job, round, task, shm: {name, nbytes, seq}}``;
  the coordinator checks the name is the one it gave that GPU for that job, the
  size is the job's exact gradient size and the header says that round, task
  and sequence, then reduces straight from the segment. The executor touches
  the segment again only after the reply (its pushes run one at a time).

A segment is a file in ``/dev/shm`` created by the coordinator only
(``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600, space reserved with
``posix_fallocate`` so a full ``/dev/shm`` is an error at creation, never a
``SIGBUS`` later), named ``hetsched-x-`` + 32 random hex digits, told only over
the authenticated connection. An executor opens a name only if it has that
form and the file is a regular file it owns, mode 0600, of exactly the size
its own model implies; it then proves it sees the same memory by sending back
the random token in the segment's header. The coordinator unlinks a GPU's
gradient segments as soon as that GPU answered the offer, and the parameter
segments once every GPU of the pool said hello and answered (the mappings
stay valid), so after start-up nothing of the pool job is left in
``/dev/shm`` whatever is killed later; ``close`` and an ``atexit`` hook unlink
whatever a failed start left behind.
"""

from __future__ import annotations

import atexit
import mmap
import os
import re
import secrets
import socket
import stat
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np

#: where POSIX shared memory lives on Linux (``shm_open`` names are files here)
SHM_DIR = Path("/dev/shm")
PREFIX = "hetsched-x-"
_NAME = re.compile(r"hetsched-x-[0-9a-f]{32}")
#: environment variable: ``tcp`` forces every byte over TCP (debugging, tests);
#: ``auto`` (default) uses shared memory for executors on the coordinator's node
TRANSPORT_VAR = "HETSCHED_EXEC_TRANSPORT"
TRANSPORTS = ("auto", "tcp")
MAGIC = b"HSXSHM01"
#: magic, seq, version, nbytes, round, task, token (16 bytes): 64 bytes before the data
_HEAD = struct.Struct("<8sQqQqq16s")
HEADER = 64
assert _HEAD.size == HEADER


class ShmRefused(RuntimeError):
    """A segment this side will not use (wrong name, owner, mode, size or content)."""


class ShmUnavailable(RuntimeError):
    """No shared memory here (no /dev/shm, or not enough room in it)."""


def available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK | os.X_OK)


def node_identity() -> dict[str, str]:
    """What says two processes share ``/dev/shm``: host name, boot id and the device and
    inode of ``/dev/shm`` (a container with its own ``/dev/shm`` differs there)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    try:
        st = os.stat(SHM_DIR)
        dev = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        dev = ""
    return {"host": socket.gethostname(), "boot": boot, "shm": dev}


def same_node(theirs: Any, mine: dict[str, str]) -> bool:
    return (isinstance(theirs, dict) and all(isinstance(theirs.get(k), str) for k in mine)
            and all(mine[k] and theirs[k] == mine[k] for k in mine))


_live: dict[str, Path] = {}  # segments this process created and has not unlinked yet
_live_lock = threading.Lock()


@atexit.register
def _unlink_all() -> None:
    with _live_lock:
        paths = list(_live.values())
        _live.clear()
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def created_here() -> list[str]:
    """Names of segments this process created that are still linked (tests)."""
    with _live_lock:
        return sorted(_live)


class Segment:
    """One mapped segment: a 64-byte header, then ``nbytes`` of float32 data."""

    def __init__(self, name: str, mm: mmap.mmap, nbytes: int, writable: bool) -> None:
        self.name, self.mm, self.nbytes, self.writable = name, mm, nbytes, writable
        self.seq = 0
        self.token = b""

    # -- creation (the coordinator) and opening (an executor) -------------------------
    @classmethod
    def create(cls, nbytes: int) -> Segment:
        if not available():
            raise ShmUnavailable(f"{SHM_DIR} is not a writable folder")
        name = PREFIX + secrets.token_hex(16)
        path = SHM_DIR / name
        size = HEADER + nbytes
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            raise ShmUnavailable(f"cannot create {path}: {e.strerror}") from None
        with _live_lock:
            _live[name] = path
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.posix_fallocate(fd, 0, size)  # room now, or an error now (never SIGBUS later)
            mm = mmap.mmap(fd, size)
        except OSError as e:
            unlink(name)
            raise ShmUnavailable(f"no room for {size} bytes in {SHM_DIR}: {e.strerror}"
                                 ) from None
        finally:
            os.close(fd)
        seg = cls(name, mm, nbytes, True)
        seg.token = secrets.token_bytes(16)
        seg._write_head(0, -1, -1)
        return seg

    @classmethod
    def attach(cls, name: Any, nbytes: int, writable: bool) -> Segment:
        """Open a segment the coordinator named; ShmRefused (one line) unless it is ours,
        private, and exactly ``HEADER + nbytes`` long with that size in its header.
        FileNotFoundError when this process does not see it (another node or container)."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ShmRefused(f"shared memory name {str(name)[:60]!r} is not one the "
                             "coordinator makes (hetsched-x- and 32 hex digits)")
        path = SHM_DIR / name
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            want = HEADER + nbytes
            if not stat.S_ISREG(st.st_mode):
                raise ShmRefused(f"shared memory {path} is not a regular file")
            if st.st_uid != os.geteuid():
                raise ShmRefused(f"shared memory {path} belongs to uid {st.st_uid}, not to "
                                 "this job's user")
            if st.st_mode & 0o077:
                raise ShmRefused(f"shared memory {path} has mode {oct(st.st_mode & 0o777)}; "
                                 "others could read or change it (0600 expected)")
            if st.st_size != want:
                raise ShmRefused(f"shared memory {path} has {st.st_size} bytes; this job's "
                                 f"parameters need exactly {want}")
            mm = mmap.mmap(fd, want, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        finally:
            os.close(fd)
        seg = cls(name, mm, nbytes, writable)
        magic, seq, _, n, _, _, token = _HEAD.unpack_from(mm, 0)
        if magic != MAGIC or n != nbytes:
            mm.close()
            raise ShmRefused(f"shared memory {path} is not a segment of {nbytes} bytes "
                             f"(header says {n})")
        seg.token, seg.seq = token, seq
        return seg

    # -- the header ------------------------------------------------------------------
    def _write_head(self, version: int, rnd: int, task: int, seq: int | None = None) -> None:
        if seq is not None:
            self.seq = seq
        _HEAD.pack_into(self.mm, 0, MAGIC, self.seq, version, self.nbytes, rnd, task,
                        self.token)

    def head(self) -> tuple[int, int, int, int]:
        """(seq, version, round, task) as the header says now."""
        _, seq, version, _, rnd, task, _ = _HEAD.unpack_from(self.mm, 0)
        return seq, version, rnd, task

    def array(self) -> np.ndarray:
        """The data as float32 (writable when this side mapped it so)."""
        return np.frombuffer(self.mm, dtype=np.float32, count=self.nbytes // 4,
                             offset=HEADER)

    def tensor(self) -> Any:
        """The data as a torch float32 tensor sharing the memory (writable mappings only)."""
        import torch

        return torch.frombuffer(self.mm, dtype=torch.float32, count=self.nbytes // 4,
                                offset=HEADER)

    # -- parameters: seqlock --------------------------------------------------------
    def begin_write(self) -> None:
        """The coordinator is about to change the parameters: readers see an odd seq."""
        _, version, _, _ = self.head()
        self._write_head(version, -1, -1, self.seq + 1 if self.seq % 2 == 0 else self.seq)

    def publish(self, version: int) -> None:
        """The parameters are version ``version``, complete: an even seq."""
        self._write_head(version, -1, -1, self.seq + 1 if self.seq % 2 else self.seq + 2)

    def read_params(self, into: np.ndarray, version: int) -> None:
        """Copy version ``version`` into ``into``; ShmRefused if another version or a write
        in progress was seen before or after the copy."""
        s1, v1, _, _ = self.head()
        if s1 % 2 or v1 != version:
            what = "being written" if s1 % 2 else f"hold version {v1}"
            raise ShmRefused(f"shared parameters {what}, not version {version} as the "
                             "coordinator said")
        np.copyto(into.reshape(-1), self.array())
        s2, v2, _, _ = self.head()
        if (s2, v2) != (s1, v1):
            raise ShmRefused(f"shared parameters of version {version} changed while read")

    # -- gradients ------------------------------------------------------------------
    def write_grad(self, src: np.ndarray, rnd: int, task: int) -> int:
        """Write a task's contribution and its header; returns the sequence to announce."""
        np.copyto(self.array(), src.reshape(-1))
        self._write_head(0, rnd, task, self.seq + 1)
        return self.seq

    def unlink(self) -> None:
        unlink(self.name)


def unlink(name: str) -> None:
    """Remove a segment this process created (its mappings stay valid)."""
    with _live_lock:
        path = _live.pop(name, None)
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def transport(opts: dict[str, Any], env: Any) -> str:
    """The transport asked for: ``opts["transport"]``, else ``$HETSCHED_EXEC_TRANSPORT``,
    else ``auto``; anything else is one line (InputError)."""
    from hetsched.errors import InputError

    raw = opts.get("transport") or (env or {}).get(TRANSPORT_VAR) or "auto"
    if raw not in TRANSPORTS:
        raise InputError(TRANSPORT_VAR, f"{str(raw)[:40]!r} is not a transport "
                         f"(valid: {', '.join(TRANSPORTS)})")
    return str(raw)


def attach_offer(offer: Any, sizes: dict[str, int]) -> dict[str, tuple[Segment, Segment]]:
    """Open the segments a coordinator's offer names: job -> (its parameter segment, read
    only; this GPU's gradient segment, writable), each checked against the job's exact
    size (``sizes``: from the executor's own model). A name, owner, mode or size that is
    not right raises :class:`ShmRefused`; segments this process cannot see (another node
    or container after all) give ``{}``: stay on TCP."""
    segs: dict[str, tuple[Segment, Segment]] = {}
    params = offer.get("params") if isinstance(offer, dict) else None
    grads = offer.get("grads") if isinstance(offer, dict) else None
    if not isinstance(params, dict) or not isinstance(grads, dict) \
            or set(params) != set(grads) or not set(params) <= set(sizes):
        raise ShmRefused("the coordinator's shared memory offer names jobs this GPU does "
                         "not run")
    try:
        for job, pname in params.items():
            segs[job] = (Segment.attach(pname, sizes[job], writable=False),
                         Segment.attach(grads[job], sizes[job], writable=True))
    except OSError:
        return {}
    return segs

