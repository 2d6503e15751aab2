"""Executor <-> coordinator messages over TCP (``multiprocessing.connection``), never pickled.

Every message is a JSON header (one ``send_bytes``) optionally followed by one
raw payload (``nbytes`` in the header): a job's flat float32 parameters or a
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
from multiprocessing.connection import Client, Connection, Listener
from typing import Any


class PeerLost(RuntimeError):
    """The other side of a connection went away or the pool job failed."""


def authkey(plan_id: str, job_id: str) -> bytes:
    return hashlib.sha256(f"hetsched-exec:{plan_id}:{job_id}".encode()).digest()


def send(conn: Connection, header: dict[str, Any], payload: Any = None) -> None:
    """Send a header and, when given, a bytes-like payload (its size goes in the header)."""
    if payload is not None:
        mv = memoryview(payload).cast("B")
        header = {**header, "nbytes": mv.nbytes}
    try:
        conn.send_bytes(json.dumps(header).encode())
        if payload is not None:
            conn.send_bytes(mv)
    except (OSError, EOFError) as e:
        raise PeerLost(f"connection lost while sending: {e}") from None


def recv(conn: Connection, into: Any = None) -> tuple[dict[str, Any], bytes | None]:
    """Receive a header and its payload (into ``into`` when given, which must fit exactly)."""
    try:
        header = json.loads(conn.recv_bytes())
        n = int(header.get("nbytes", 0))
        payload: bytes | None = None
        if n:
            if into is not None:
                mv = memoryview(into).cast("B")
                if mv.nbytes != n:
                    raise PeerLost(f"payload of {n} bytes for a buffer of {mv.nbytes}")
                conn.recv_bytes_into(mv)
            else:
                payload = conn.recv_bytes()
    except (OSError, EOFError) as e:
        raise PeerLost(f"connection lost: {e or type(e).__name__}") from None
    if not isinstance(header, dict):
        raise PeerLost("malformed message")
    return header, payload


def listen(port: int, key: bytes, host: str = "0.0.0.0") -> Listener:
    return Listener((host, port), authkey=key, backlog=256)


def connect(addr: str, port: int, key: bytes, timeout_s: float = 120.0) -> Connection:
    """Connect to the coordinator, retrying while it is still starting."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client((addr, port), authkey=key)
        except (ConnectionRefusedError, OSError):
            if time.monotonic() > deadline:
                raise PeerLost(f"no coordinator at {addr}:{port} after {timeout_s:.0f} s"
                               ) from None
            time.sleep(0.1)
