"""Executor <-> coordinator messages over TCP: mutual HMAC authentication, then
length-prefixed JSON headers and raw payloads. Nothing is ever unpickled.

**Handshake** (fixed sizes, so nothing a peer sends is read as a length before it
proved the key; every step under a timeout):

1. coordinator -> ``MAGIC`` + a fresh 32-byte nonce ``ns``;
2. executor -> its own nonce ``nc`` + ``HMAC(key, "C" ns nc)``; the coordinator checks it
   with :func:`hmac.compare_digest` and closes the connection on a mismatch;
3. coordinator -> ``HMAC(key, "S" nc ns)``: the executor checks the coordinator knows the
   key too (a stranger listening on the port first cannot feed it weights);
4. executor -> ``join {gpu}`` (the GPU it runs) -> ``{}``.

The key is the pool job's secret (:mod:`hetsched.io.secret`): random, in a 0600
file only the job's owner can read, never derived from what Slurm shows. Fresh
nonces on both sides make a recorded handshake useless to replay.

**Messages** after it: ``!Q`` header length (at most ``MAX_EXEC_HEADER``), a JSON
object, then, when the header says ``nbytes``, that many raw bytes (a job's flat
float32 parameters or a task's flat gradient contribution), received straight
into the receiver's buffer. Every receiver bounds ``nbytes`` before reading a
byte of the payload.

Requests (executor -> coordinator) and replies:

* ``hello {gpu, node?}`` -> ``{rounds_done: {job: k}, shm?: {params, grads}}`` (resume
  point from the checkpoints; with ``node`` equal to the coordinator's, the names of the
  shared memory segments for this GPU's jobs: :mod:`.shm`)
* ``shm {gpu, tokens}`` -> ``{shm: bool}``: the executor's answer to the offer (the
  tokens it read from the segments, or null: it stays on TCP)
* ``get {job, round, have}`` -> waits for the round barrier; ``{same: true}`` when
  the executor's resident copy (version ``have``) is current, ``{version, shm: true}``
  when it copies them from the job's segment, else ``{version, nbytes}`` + parameters
* ``put {job, round, task, nbytes}`` + gradient, or ``put {job, round, task, shm: {name,
  nbytes, seq}}`` (the gradient in this GPU's segment) -> ``{round_done, job_done}``
* ``bye {gpu}`` -> ``{}``

Any reply may be ``{error: "..."}``: the pool job failed (an executor was lost).
The wire is authenticated, not encrypted: the parameters cross the cluster network in
the clear, as with NCCL or gloo.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
import time
from typing import Any

from hetsched.core.limits import MAX_EXEC_HEADER

#: a header is a small JSON object; anything larger is not a peer of ours
MAX_HEADER = MAX_EXEC_HEADER
MAGIC = b"HSX2"
NONCE_BYTES = 32
MAC_BYTES = 32
#: seconds a connection has to complete the handshake and say which GPU it runs
HANDSHAKE_TIMEOUT_S = 10.0
#: an executor's connections: requests in line, and the parameter pulls and gradient
#: pushes that run beside its compute (runtime/executor/worker.py)
CHANNELS = ("main", "pull", "push")


class PeerLost(RuntimeError):
    """The other side of a connection went away or the pool job failed."""


class PeerIdle(PeerLost):
    """The other side sent nothing within the idle timeout."""


class PoolFailed(RuntimeError):
    """The pool job failed (an executor was lost); the message is the coordinator's line."""


class Refused(RuntimeError):
    """A connection that did not prove the key, or spoke out of turn: dropped."""


def _mac(key: bytes, side: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(key, b"hetsched-exec/2" + side + a + b, hashlib.sha256).digest()


_LEN = struct.Struct("!Q")


def _until(sock: socket.socket, deadline: float | None) -> None:
    """Before a receive: the time left to ``deadline`` as the socket's timeout (a peer
    trickling one byte at a time cannot stretch a bounded step)."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        sock.settimeout(left)


def _exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    buf = bytearray(n)
    mv = memoryview(buf)
    got = 0
    while got < n:
        _until(sock, deadline)
        k = sock.recv_into(mv[got:])
        if k == 0:
            raise EOFError("connection closed")
        got += k
    return bytes(buf)


class Channel:
    """Length-prefixed messages on a TCP socket, payloads received in place (``recv_into``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        #: while set, every receive must finish by it (the handshake's join)
        self.deadline: float | None = None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # a peer whose node vanished (no FIN ever comes) is noticed within ~1 minute
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, val in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)

    def settimeout(self, seconds: float | None) -> None:
        self.deadline = None
        self.sock.settimeout(seconds)

    def close(self) -> None:
        self.sock.close()

    def _read_into(self, mv: memoryview) -> None:
        got = 0
        while got < mv.nbytes:
            _until(self.sock, self.deadline)
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


def _lost(e: BaseException) -> PeerLost:
    if isinstance(e, TimeoutError):
        return PeerIdle(f"nothing received for {e.args[0] if e.args else 'the timeout'}")
    return PeerLost(f"connection lost: {e or type(e).__name__}")


def recv_header(ch: Channel, max_payload: int = 0) -> dict[str, Any]:
    """One header, its ``nbytes`` checked against ``max_payload`` (the payload not read).

    Raises PeerLost when the connection ends, Refused when the header is not ours
    (too long, not a JSON object, a bad ``nbytes``).
    """
    try:
        (n_head,) = _LEN.unpack(ch._read(_LEN.size))
        if n_head > MAX_HEADER:
            raise Refused(f"header of {n_head} bytes (the limit is {MAX_HEADER})")
        raw = ch._read(n_head)
    except (OSError, EOFError) as e:
        raise _lost(e) from None
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise Refused("malformed header (not JSON)") from None
    if not isinstance(header, dict):
        raise Refused("malformed header (not a JSON object)")
    n = header.get("nbytes", 0)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= max_payload:
        raise Refused(f"payload of {n!r} bytes (at most {max_payload} here)")
    return header


def recv_payload(ch: Channel, n: int, into: Any = None) -> bytes | None:
    """The ``n``-byte payload announced by a header (into ``into``, which must fit exactly)."""
    if not n:
        return None
    try:
        if into is not None:
            mv = memoryview(into).cast("B")
            if mv.nbytes != n:
                raise Refused(f"payload of {n} bytes for a buffer of {mv.nbytes}")
            ch._read_into(mv)
            return None
        return ch._read(n)
    except (OSError, EOFError) as e:
        raise _lost(e) from None


def recv(ch: Channel, into: Any = None, max_payload: int = 0
         ) -> tuple[dict[str, Any], bytes | None]:
    """Receive a header and its payload: into ``into`` when given (its exact size), else
    at most ``max_payload`` bytes. Any violation is PeerLost (the executor's view: the
    coordinator is gone or broken)."""
    limit = memoryview(into).nbytes if into is not None else max_payload
    try:
        header = recv_header(ch, limit)
        payload = recv_payload(ch, int(header.get("nbytes", 0)), into)
    except Refused as e:
        raise PeerLost(f"bad message: {e}") from None
    return header, payload


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` only (never all interfaces unless asked)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(256)
    except OSError:
        sock.close()
        raise
    sock.settimeout(0.5)  # the accept loop looks at its stop flag twice a second
    return sock


def server_handshake(sock: socket.socket, key: bytes,
                     timeout_s: float = HANDSHAKE_TIMEOUT_S) -> Channel:
    """Authenticate a new connection (module doc, steps 1-3); Refused if it does not
    prove the key within ``timeout_s`` seconds. Reads exactly 64 bytes before that."""
    deadline = time.monotonic() + timeout_s
    sock.settimeout(timeout_s)
    ns = secrets.token_bytes(NONCE_BYTES)
    try:
        sock.sendall(MAGIC + ns)
        got = _exact(sock, NONCE_BYTES + MAC_BYTES, deadline)
        nc, mac = got[:NONCE_BYTES], got[NONCE_BYTES:]
        if not hmac.compare_digest(mac, _mac(key, b"C", ns, nc)):
            raise Refused("the peer does not know the pool job's key")
        sock.sendall(_mac(key, b"S", nc, ns))
    except (OSError, EOFError) as e:
        raise Refused(f"handshake not completed: {e or type(e).__name__}") from None
    ch = Channel(sock)
    ch.deadline = deadline  # the join comes within it too
    return ch


def client_handshake(sock: socket.socket, key: bytes,
                     timeout_s: float = HANDSHAKE_TIMEOUT_S,
                     greeting_timeout_s: float | None = None) -> Channel:
    """The executor's side of the handshake (steps 1-3). Raises EOFError when the
    coordinator closed before its greeting (still starting, or busy), PeerLost when
    it refused the key or did not prove it knows it. The greeting may take up to
    ``greeting_timeout_s`` (rank 0 accepts once it has built every job's server)."""
    sock.settimeout(max(timeout_s, greeting_timeout_s or 0.0))
    try:
        greet = _exact(sock, len(MAGIC) + NONCE_BYTES)
    except OSError as e:
        raise EOFError(str(e)) from None
    sock.settimeout(timeout_s)
    if greet[:len(MAGIC)] != MAGIC:
        raise PeerLost("the process on the coordinator's port is not a hetsched coordinator")
    ns = greet[len(MAGIC):]
    nc = secrets.token_bytes(NONCE_BYTES)
    try:
        sock.sendall(nc + _mac(key, b"C", ns, nc))
        proof = _exact(sock, MAC_BYTES)
    except (OSError, EOFError):
        raise PeerLost("the coordinator refused this executor's key (the job's key file "
                       "differs from rank 0's)") from None
    if not hmac.compare_digest(proof, _mac(key, b"S", nc, ns)):
        raise PeerLost("the process on the coordinator's port does not know the pool "
                       "job's key")
    ch = Channel(sock)
    ch.settimeout(None)
    return ch


def connect(addr: str, port: int, key: bytes, gpu: str, timeout_s: float = 300.0,
            channel: str = "main") -> Channel:
    """Connect to the coordinator (retrying while it is still starting), authenticate,
    and join as ``gpu``'s ``channel`` (:data:`CHANNELS`: its executor's main connection,
    or one of the two that move parameters and gradients beside it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock = None
        try:
            sock = socket.create_connection((addr, port), timeout=HANDSHAKE_TIMEOUT_S)
            ch = client_handshake(sock, key,
                                  greeting_timeout_s=deadline - time.monotonic())
            break
        except (OSError, EOFError):
            if sock is not None:
                sock.close()
            if time.monotonic() > deadline:
                raise PeerLost(f"no coordinator at {addr}:{port} after {timeout_s:.0f} s"
                               ) from None
            time.sleep(0.1)
        except PeerLost:
            if sock is not None:
                sock.close()
            raise
    try:
        ch.settimeout(HANDSHAKE_TIMEOUT_S)
        send(ch, {"op": "join", "gpu": gpu, "channel": channel})
        reply, _ = recv(ch)
        ch.settimeout(None)
    except PeerLost:
        ch.close()
        raise
    if "error" in reply:
        ch.close()
        raise PeerLost(str(reply["error"]))
    return ch
