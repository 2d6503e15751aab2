"""Executor <-> coordinator messages over TCP, never pickled.

A connection is authenticated with ``multiprocessing.connection``'s HMAC
handshake, then its socket carries length-prefixed messages: a JSON header
optionally followed by one raw payload (``nbytes`` in the header): a job's flat float32 parameters or a
task's flat gradient contribution. Payloads are received straight into the
receiver's (pinned) buffer. Nothing is unpickled, so a peer cannot make
another process run code; the connection's HMAC handshake (key derived from
the plan id and the Slurm job) keeps executors of different pool jobs apart.

Requests (executor -> coordinator) and replies:

* ``hello {gpu}`` -> ``{rounds_done: {job: k}}`` (resume point from the checkpoints)
* ``get {job, round, have}`` -> waits for the round barrier; ``{same: true}`` when
  the executor's resident copy (version ``have``) is current, else
  ``{version, nbytes}`` + parameters
* ``put {job, round, task, nbytes}`` + gradient -> ``{round_done, job_done}``
* ``bye {gpu}`` -> ``{}``

Any reply may be ``{error: "..."}``: the pool job failed (an executor was lost).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

#: a header is a small JSON object; anything larger is not a peer of ours
MAX_HEADER = 1 << 20


class PeerLost(RuntimeError):
    """The other side of a connection went away or the pool job failed."""


def authkey(plan_id: str, job_id: str) -> bytes:
    return hashlib.sha256(f"hetsched-exec:{plan_id}:{job_id}".encode()).digest()


_LEN = struct.Struct("!Q")


class Channel:
    """Length-prefixed messages on a TCP socket, payloads received in place (``recv_into``:
    no intermediate copies, unlike ``Connection.recv_bytes_into``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # a peer whose node vanished (no FIN ever comes) is noticed within ~1 minute
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, val in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)

    @classmethod
    def from_connection(cls, conn: Connection) -> Channel:
        """Take over an authenticated ``multiprocessing`` connection's socket."""
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        conn.close()
        sock.setblocking(True)
        return cls(sock)

    def close(self) -> None:
        self.sock.close()

    def _read_into(self, mv: memoryview) -> None:
        got = 0
        while got < mv.nbytes:
            n = self.sock.recv_into(mv[got:])
            if n == 0:
                raise EOFError("connection closed")
            got += n

    def _read(self, n: int) -> bytes:
        buf = bytearray(n)
        self._read_into(memoryview(buf))
        return bytes(buf)


def send(ch: Channel, header: dict[str, Any], payload: Any = None) -> None:
    """Send a header and, when given, a bytes-like payload (its size goes in the header)."""
    mv = memoryview(payload).cast("B") if payload is not None else None
    if mv is not None:
        header = {**header, "nbytes": mv.nbytes}
    head = json.dumps(header).encode()
    try:
        ch.sock.sendall(_LEN.pack(len(head)) + head)
        if mv is not None:
            ch.sock.sendall(mv)
    except OSError as e:
        raise PeerLost(f"connection lost while sending: {e}") from None


def recv(ch: Channel, into: Any = None) -> tuple[dict[str, Any], bytes | None]:
    """Receive a header and its payload (into ``into`` when given, which must fit exactly)."""
    try:
        (n_head,) = _LEN.unpack(ch._read(_LEN.size))
        if n_head > MAX_HEADER:
            raise PeerLost(f"header of {n_head} bytes")
        header = json.loads(ch._read(n_head))
        if not isinstance(header, dict):
            raise PeerLost("malformed message")
        n = int(header.get("nbytes", 0))
        payload: bytes | None = None
        if n:
            if into is not None:
                mv = memoryview(into).cast("B")
                if mv.nbytes != n:
                    raise PeerLost(f"payload of {n} bytes for a buffer of {mv.nbytes}")
                ch._read_into(mv)
            else:
                payload = ch._read(n)
    except (OSError, EOFError, ValueError) as e:
        raise PeerLost(f"connection lost: {e or type(e).__name__}") from None
    return header, payload


def listen(port: int, key: bytes, host: str = "0.0.0.0") -> Listener:
    return Listener((host, port), authkey=key, backlog=256)


def accept(listener: Listener) -> Channel:
    """The next authenticated connection (raises on a failed handshake)."""
    return Channel.from_connection(listener.accept())


def connect(addr: str, port: int, key: bytes, timeout_s: float = 120.0) -> Channel:
    """Connect to the coordinator, retrying while it is still starting."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Channel.from_connection(Client((addr, port), authkey=key))
        except (ConnectionRefusedError, OSError):
            if time.monotonic() > deadline:
                raise PeerLost(f"no coordinator at {addr}:{port} after {timeout_s:.0f} s"
                               ) from None
            time.sleep(0.1)
