"""Attacks on the pool executor's coordinator: each one fails, and the service stays up.

A real coordinator (real jobs' parameter servers) listens on 127.0.0.1; the
attacker is a plain TCP socket. After every attack a legitimate executor
still joins with the job's key and gets its answer. Every socket the test
opens has a timeout, so no test can hang on a coordinator that stopped
answering (a hang would be the failure).
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hetsched.errors import InputError, UnsafeFileError
from hetsched.io.secret import new_secret, read_secret, write_secret
from hetsched.runtime.executor import protocol
from hetsched.runtime.executor.coordinator import Coordinator
from hetsched.runtime.executor.plan import ExecPlan
from tests.runtime.exec_helpers import loopback_coordinator, small_exec_plan

#: every blocking socket call of the test gives up after this many seconds
T = 20.0


@pytest.fixture(scope="module")
def xplan(tmp_path_factory: pytest.TempPathFactory) -> ExecPlan:
    return small_exec_plan(tmp_path_factory.mktemp("sec"))


@pytest.fixture
def coord(xplan: ExecPlan) -> Any:
    c = loopback_coordinator(xplan)
    yield c
    c.close()


def raw(c: Any) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", c.port), timeout=T)
    s.settimeout(T)
    return s


def drained(s: socket.socket) -> bytes:
    """Everything the coordinator sends until it closes the connection (bounded by T)."""
    out = b""
    while True:
        try:
            b = s.recv(4096)
        except ConnectionResetError:
            return out
        if not b:
            return out
        out += b


def legit(c: Any, gpu: str | None = None) -> protocol.Channel:
    """A real executor's connection: it must still join after any attack."""
    ch = protocol.connect("127.0.0.1", c.port, c.key, gpu or c.gpus[0], timeout_s=T)
    ch.settimeout(T)
    return ch


def assert_still_serving(c: Any, gpu: str | None = None) -> None:
    assert c.accepting() and c.failed is None
    ch = legit(c, gpu)
    gpu = gpu or c.gpus[0]
    protocol.send(ch, {"op": "hello", "gpu": gpu})
    reply, _ = protocol.recv(ch)
    assert reply == {"rounds_done": {n: 0 for n in c.jobs}}
    protocol.send(ch, {"op": "bye", "gpu": gpu})
    assert protocol.recv(ch)[0] == {}
    ch.close()


def test_a_strangers_frame_without_the_key_is_dropped(coord: Any) -> None:
    s = raw(coord)
    greet = s.recv(4 + 32, socket.MSG_WAITALL)
    assert greet[:4] == protocol.MAGIC
    # what the old protocol took: a length-prefixed request, no proof of any key
    s.sendall(struct.pack("!Q", 40) + b'{"op": "hello", "gpu": "' + coord.gpus[1].encode()
              + b'"}' + b" " * 64)
    assert drained(s) == b""  # no reply of any kind, just closed
    s.close()
    assert coord.gpus[1] not in coord.joined and coord.hello == set()
    assert_still_serving(coord)


def test_a_guessed_key_from_the_old_derivation_is_refused(coord: Any) -> None:
    """The old key: sha256 of what squeue shows (plan id in the job name, job id)."""
    for job_id in ("1", "42", "threads"):
        guess = hashlib.sha256(f"hetsched-exec:{coord.plan.plan_id}:{job_id}".encode()).digest()
        with pytest.raises(protocol.PeerLost, match="refused this executor's key"):
            protocol.connect("127.0.0.1", coord.port, guess, coord.gpus[0], timeout_s=T)
    assert coord.joined == set()
    assert_still_serving(coord)


def test_a_scanners_reset_does_not_stop_the_listener(coord: Any) -> None:
    for when in ("at once", "after the greeting"):
        for _ in range(5):
            s = raw(coord)
            if when != "at once":
                s.recv(36, socket.MSG_WAITALL)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # SO_LINGER 0: a TCP reset, what a port scanner sends
    assert_still_serving(coord)


def test_a_four_byte_bad_length_frame_then_a_real_executor_joins(coord: Any) -> None:
    s = raw(coord)
    assert s.recv(36, socket.MSG_WAITALL)[:4] == protocol.MAGIC
    s.sendall(b"\xff\xff\xff\xff")  # never read as a length: the 64-byte proof comes first
    s2 = raw(coord)
    assert s2.recv(36, socket.MSG_WAITALL)[:4] == protocol.MAGIC
    s2.sendall(struct.pack("!Q", 2**63) + b"x" * 56)  # a huge "length" where the proof goes
    assert drained(s2) == b""  # closed: the proof is wrong, the length never read
    assert_still_serving(coord)
    assert drained(s) == b""  # closed by the handshake timeout, never served
    s.close()
    s2.close()
    assert coord.failed is None and coord.accepting() and coord.refused >= 2


def test_a_silent_connection_is_closed_by_the_handshake_timeout(coord: Any) -> None:
    s = raw(coord)
    assert s.recv(36, socket.MSG_WAITALL)[:4] == protocol.MAGIC
    assert drained(s) == b""  # closed after handshake_timeout_s (2 s), well before T
    s.close()
    assert coord.refused >= 1
    assert_still_serving(coord)


def test_a_trickling_peer_cannot_stretch_the_handshake(coord: Any) -> None:
    """One byte every half second: the handshake's 2 s is a deadline for all 64 bytes,
    not for each byte, so the coordinator hangs up long before the proof could be
    complete."""
    import select

    s = raw(coord)
    assert s.recv(36, socket.MSG_WAITALL)[:4] == protocol.MAGIC
    sent = 0
    closed = False
    while sent < 63 and not closed:
        try:
            s.send(b"x")
        except OSError:
            break
        sent += 1
        ready, _, _ = select.select([s], [], [], 0.5)
        if ready:
            try:
                closed = s.recv(1) == b""
            except ConnectionResetError:
                closed = True
    s.close()
    assert sent < 20, sent
    assert_still_serving(coord)


def test_a_flood_of_silent_connections_does_not_lock_out_the_executors(coord: Any) -> None:
    from hetsched.runtime.executor.coordinator import MAX_PENDING

    flood = [raw(coord) for _ in range(MAX_PENDING + 16)]
    try:
        assert_still_serving(coord)  # it retries until the flood's handshakes time out
    finally:
        for f in flood:
            f.close()
    assert coord.refused >= 16


def test_an_oversized_header_is_refused_before_it_is_read(coord: Any) -> None:
    """Even from a peer with the key: the length is bounded before anything is allocated,
    the pool job fails with one line, the process stays up."""
    ch = legit(coord)
    ch.sock.sendall(struct.pack("!Q", 10**15))
    reply, _ = protocol.recv(ch)  # at once: nothing of 10**15 bytes was awaited
    assert "header of 1000000000000000 bytes" in reply["error"]
    assert drained(ch.sock) == b""
    ch.close()
    assert coord.failed is not None and "header of 1000000000000000 bytes" in coord.failed
    assert coord.accepting()


def test_a_huge_nbytes_is_refused_before_the_payload_is_read(coord: Any) -> None:
    ch = legit(coord)
    protocol.send(ch, {"op": "put", "job": "a", "round": 0, "task": 0, "nbytes": 10**15})
    reply, _ = protocol.recv(ch)
    assert "error" in reply and "payload of 1000000000000000 bytes" in reply["error"]
    ch.close()
    assert all(float(s.grad.abs().sum()) == 0.0 for s in coord.jobs.values())


def test_an_unknown_job_name_is_refused_not_a_crash(coord: Any) -> None:
    ch = legit(coord)
    protocol.send(ch, {"op": "get", "job": "no-such-job", "round": 0, "have": -1})
    reply, _ = protocol.recv(ch)
    assert "no-such-job" in reply["error"] and "not a job of this plan" in reply["error"]
    ch.close()
    assert coord.accepting()


def test_an_out_of_round_put_is_refused_and_not_applied(coord: Any) -> None:
    srv = coord.jobs["a"]
    grad = bytearray(srv.grad.numel() * 4)
    for rnd in (1, 10**6, -1):
        c2 = _fresh(coord)
        ch = legit(c2)
        protocol.send(ch, {"op": "put", "job": "a", "round": rnd, "task": 0}, grad)
        reply, _ = protocol.recv(ch)
        assert f"gradient for round {rnd} while the job is at round 0" in reply["error"]
        ch.close()
        assert c2.jobs["a"].version == 0 and c2.jobs["a"].got == set()
        c2.close()


def test_a_nan_gradient_is_refused_and_not_applied(coord: Any) -> None:
    import numpy as np

    srv = coord.jobs["a"]
    before = srv.flat.clone()
    nan = np.full(srv.grad.numel(), np.nan, dtype=np.float32)
    ch = legit(coord)
    protocol.send(ch, {"op": "put", "job": "a", "round": 0, "task": 0}, nan)
    reply, _ = protocol.recv(ch)
    assert "NaN or infinite" in reply["error"]
    ch.close()
    assert srv.version == 0 and bool((srv.flat == before).all()) and srv.got == set()


def test_joining_as_an_unknown_or_taken_gpu_is_refused_and_the_job_goes_on(coord: Any) -> None:
    with pytest.raises(protocol.PeerLost, match="not an executor GPU"):
        protocol.connect("127.0.0.1", coord.port, coord.key, "intruder-g0", timeout_s=T)
    first = legit(coord, coord.gpus[0])
    with pytest.raises(protocol.PeerLost, match="has joined already"):
        protocol.connect("127.0.0.1", coord.port, coord.key, coord.gpus[0], timeout_s=T)
    assert coord.failed is None
    protocol.send(first, {"op": "hello", "gpu": coord.gpus[0]})  # the real one carries on
    assert "rounds_done" in protocol.recv(first)[0]
    protocol.send(first, {"op": "bye", "gpu": coord.gpus[0]})
    assert protocol.recv(first)[0] == {}
    first.close()
    assert_still_serving(coord, coord.gpus[1])


def test_side_connections_need_their_executor_and_come_once(coord: Any) -> None:
    """An executor's pull and push connections join beside its main one, never before it,
    never twice, and never under a channel name the protocol does not have."""
    g = coord.gpus[0]

    def side(channel: str) -> protocol.Channel:
        return protocol.connect("127.0.0.1", coord.port, coord.key, g, timeout_s=T,
                                channel=channel)

    with pytest.raises(protocol.PeerLost, match="comes first"):
        side("pull")  # no executor of that GPU has joined
    main = legit(coord, g)
    pull = side("pull")
    with pytest.raises(protocol.PeerLost, match="taken"):
        side("pull")
    with pytest.raises(protocol.PeerLost, match="unknown channel"):
        side("admin")
    assert coord.failed is None
    for ch in (pull, main):  # side connections say bye first; the main one ends the GPU
        protocol.send(ch, {"op": "bye", "gpu": g})
        assert protocol.recv(ch)[0] == {}
        ch.close()
    deadline = time.monotonic() + T  # the bye is answered first, then counted
    while g not in coord.bye and time.monotonic() < deadline:
        time.sleep(0.01)
    assert g in coord.bye and coord.failed is None
    assert_still_serving(coord, coord.gpus[1])


def test_an_executor_refuses_a_coordinator_without_the_key() -> None:
    """A stranger listening on the coordinator's port first cannot feed weights."""
    fake = socket.socket()
    fake.bind(("127.0.0.1", 0))
    fake.listen(1)
    fake.settimeout(T)

    def serve() -> None:
        conn, _ = fake.accept()
        conn.settimeout(T)
        conn.sendall(protocol.MAGIC + os.urandom(32))
        conn.recv(64, socket.MSG_WAITALL)
        conn.sendall(os.urandom(32))  # a proof made without the key
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with pytest.raises(protocol.PeerLost, match="does not know the pool job's key"):
        protocol.connect("127.0.0.1", fake.getsockname()[1], new_secret(), "g", timeout_s=T)
    t.join(T)
    fake.close()


def test_the_coordinator_listens_on_the_rendezvous_address_only(xplan: ExecPlan) -> None:
    import torch

    from hetsched.runtime.executor.entry import ExecFailed, run_gpu
    from hetsched.runtime.launcher import free_port

    box: list[Any] = []
    gpus = xplan.gpu_ids()
    seen: list[tuple[str, int]] = []

    def watch() -> None:
        while not box:
            threading.Event().wait(0.01)
        seen.append(box[0].listener.getsockname())

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    with pytest.raises(ExecFailed, match="never connected"):
        run_gpu(xplan, gpus[0], gpus, True, "localhost", free_port(), new_secret(),
                torch.device("cpu"), {"hello_timeout_s": 2.0}, coord_box=box)
    t.join(T)
    assert seen and seen[0][0] == "127.0.0.1"  # not 0.0.0.0


def _fresh(coord: Any) -> Any:
    lis = protocol.listen("127.0.0.1", 0)
    c = Coordinator(coord.plan, coord.gpus, lis, coord.key, None, hello_timeout_s=600.0,
                    handshake_timeout_s=2.0)
    c.port = lis.getsockname()[1]
    return c


# -- the key file -----------------------------------------------------------------------


def test_the_key_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        key = write_secret(tmp_path / "new" / "plans" / "p.key")
    finally:
        os.umask(old)
    p = tmp_path / "new" / "plans" / "p.key"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE(p.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    assert read_secret(p) == key and len(key) == 32
    assert write_secret(p) != key  # a new submission, a new secret


def test_a_key_file_others_can_read_or_replace_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    p = d / "p.key"
    write_secret(p)
    p.chmod(0o640)
    with pytest.raises(UnsafeFileError, match="lets others read it"):
        read_secret(p)
    p.chmod(0o600)
    d.chmod(0o770)
    with pytest.raises(UnsafeFileError, match="writable by its group"):
        read_secret(p)
    d.chmod(0o700)
    p.write_text("not hex\n")
    p.chmod(0o600)
    with pytest.raises(InputError, match="not a pool job key file"):
        read_secret(p)
    with pytest.raises(InputError, match="not found"):
        read_secret(d / "missing.key")


def test_close_ends_every_thread_of_the_coordinator(xplan: ExecPlan) -> None:
    """close() wakes a connection waiting for a round barrier (it hears why) and joins
    every thread the coordinator started: none is left inside a torch op when the
    process exits (that aborts it: exit 134 instead of the job's own)."""
    import threading

    c = loopback_coordinator(xplan)
    ch = legit(c)
    job = sorted(c.jobs)[0]
    got: list[Any] = []

    def wait_for_round_1() -> None:  # round 0 is not done: this get waits
        protocol.send(ch, {"op": "get", "job": job, "round": 1, "have": -1})
        got.append(protocol.recv(ch)[0])

    waiter = threading.Thread(target=wait_for_round_1)
    waiter.start()
    while not any(t.name == "coord-conn" for t in threading.enumerate()):
        time.sleep(0.01)
    time.sleep(0.2)  # inside the barrier's wait
    c.close()
    waiter.join(T)
    assert got and "closed" in str(got[0].get("error")), got
    assert not [t.name for t in c._threads if t.is_alive()]
    ch.close()
