"""The pool job's coordinator: one parameter server per job, round barriers, fault detection.

It runs as threads inside rank 0's executor process (Hare runs a
``Hare_Parameter_Server`` per job beside its scheduler). Each job's server
holds the master parameters (one flat float32 tensor the parameters view) and
the optimizer. Round ``r``'s tasks each send their gradient contribution,
already weighted by their share of the round's samples; when all ``P`` have
arrived the server applies one optimizer step, the job's version becomes
``r + 1`` (its rounds done), the job is checkpointed (every round, or at the first
round boundary ``--checkpoint-every`` seconds after the last checkpoint, and after
its last round) and waiting ``get``\\ s for round ``r + 1`` are answered. So a round's tasks, wherever and in whatever
order they ran, make exactly one synchronous data-parallel step.

A connection that closes before its executor said ``bye`` (the process died:
the kernel closes its socket at once) fails the pool job: every waiting and
later request is answered with the error, so every executor exits non-zero
with that one line and the Slurm job fails; the checkpoints keep every round
completed so far.

What the listener accepts (it listens on one address, the one the executors
connect to): a connection must prove the pool job's key (:mod:`.protocol`)
and name a GPU of the plan that has not joined yet within
``HANDSHAKE_TIMEOUT_S``; anything else is closed and forgotten, whatever it
sent (a port scanner's reset, a bad length, a wrong key), and the listener
goes on accepting. At most ``MAX_PENDING`` connections may be in their
handshake at once. A joined executor's requests are checked before anything
is read or changed: a job of the plan, a round in range, the gradient's exact
size announced before it is read, finite values, the job's current round for
a ``put``; a violation fails the pool job with one line (it is one of our own
executors misbehaving). A joined executor silent for ``idle_timeout_s`` fails
the pool job too.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from pathlib import Path
from typing import Any

import torch

from hetsched.runtime.executor import protocol, shm
from hetsched.runtime.executor.jobserver import BadRequest, JobServer, req_int, shared_gradient
from hetsched.runtime.executor.offers import SharedOffers
from hetsched.runtime.executor.plan import ExecPlan

#: connections in their handshake at once; more are closed at once (a flood cannot
#: hold the coordinator's threads)
MAX_PENDING = 64
#: seconds :meth:`Coordinator.close` waits for its threads to finish
CLOSE_JOIN_S = 10.0
#: a joined executor silent this long (at least; see :func:`idle_bound`) fails the job
IDLE_FLOOR_S = 900.0
IDLE_FACTOR = 20.0


def idle_bound(xplan: ExecPlan) -> float:
    """Seconds a joined executor may send nothing: 20 times the plan's longest task,
    at least 15 minutes (a task's compute runs between its ``get`` and its ``put``)."""
    longest = max((t.end_s - t.start_s for g in xplan.gpus.values() for t in g.tasks),
                  default=0.0)
    if not math.isfinite(longest):
        longest = 0.0
    return max(IDLE_FLOOR_S, IDLE_FACTOR * longest)


class Coordinator(SharedOffers):
    """Serves every executor of one pool job (threads in rank 0's process)."""

    def __init__(self, xplan: ExecPlan, gpus: list[str], listener: socket.socket, key: bytes,
                 ckpt_dir: Path | None, seed: int = 0, hello_timeout_s: float = 120.0,
                 ckpt_every_s: float = 0.0,
                 handshake_timeout_s: float = protocol.HANDSHAKE_TIMEOUT_S,
                 idle_timeout_s: float | None = None, transport: str = "auto") -> None:
        self.plan = xplan
        self.gpus = list(gpus)
        self.listener = listener
        self.key = bytes(key)
        self.handshake_timeout_s = handshake_timeout_s
        self.idle_timeout_s = idle_bound(xplan) if idle_timeout_s is None else idle_timeout_s
        #: shared memory for executors of this node (:mod:`.shm`) unless TCP is forced
        self.shared = transport != "tcp" and shm.available()
        self.node = shm.node_identity() if self.shared else {}
        self.jobs: dict[str, JobServer] = {}
        try:
            for n, j in xplan.jobs.items():
                self.jobs[n] = JobServer(j, xplan.plan_id, ckpt_dir, seed, ckpt_every_s,
                                         shared=self.shared)
        except BaseException:
            self.unlink_segments()
            raise
        #: (GPU, job) -> the gradient segment given to that GPU's executor
        self.grad_segs: dict[tuple[str, str], shm.Segment] = {}
        self.offered: set[str] = set()  # GPUs offered shared memory, not answered yet
        self.shm_gpus: set[str] = set()  # GPUs that proved they map the same memory
        self.max_payload = max((s.flat.numel() * 4 for s in self.jobs.values()), default=0)
        self.cond = threading.Condition()
        self.failed: str | None = None
        self.joined: set[str] = set()  # GPUs whose executor joined (its main connection)
        self.channels: set[tuple[str, str]] = set()  # (GPU, channel) connections joined
        self.hello: set[str] = set()
        self.bye: set[str] = set()
        self.refused = 0  # connections dropped before they joined (strangers, scanners)
        self.closed = False
        self.pending = threading.BoundedSemaphore(MAX_PENDING)
        self.hello_deadline = time.monotonic() + hello_timeout_s
        self._accepter = threading.Thread(target=self._accept, daemon=True,
                                          name="coord-accept")
        #: every thread this coordinator started and the sockets they serve: close()
        #: ends and joins them (a daemon thread still inside a torch op when the
        #: interpreter exits aborts the process: "terminate called without an active
        #: exception", exit 134 instead of the job's own)
        self._threads: list[threading.Thread] = [self._accepter]
        self._socks: set[socket.socket] = set()
        self._accepter.start()
        watcher = threading.Thread(target=self._watch, daemon=True, name="coord-watch")
        self._threads.append(watcher)
        watcher.start()

    def rounds_done(self) -> dict[str, int]:
        return {n: s.version for n, s in self.jobs.items()}

    def accepting(self) -> bool:
        """Whether the accept loop still runs (it stops only on :meth:`close`)."""
        return self._accepter.is_alive()

    def close(self, join_s: float = CLOSE_JOIN_S) -> None:
        """Stop accepting, end every connection and wait (at most ``join_s``) for the
        coordinator's threads to finish, then remove the shared memory names."""
        with self.cond:
            self.closed = True
            socks = list(self._socks)
            self.cond.notify_all()
        self.listener.close()
        for sock in socks:  # wakes a thread blocked in recv (it may still answer)
            try:
                sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        deadline = time.monotonic() + join_s
        for t in list(self._threads):
            if t.is_alive() and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        self.unlink_segments()

    def fail(self, why: str) -> None:
        with self.cond:
            if self.failed is None:
                self.failed = why
            self.cond.notify_all()

    def wait_done(self, poll_s: float = 0.2) -> str | None:
        """Block until every executor said bye (None) or the pool job failed (the reason)."""
        with self.cond:
            while self.failed is None and set(self.gpus) - self.bye:
                self.cond.wait(poll_s)
            return self.failed

    def _watch(self) -> None:
        """Fail the pool job when an executor has not joined by the deadline."""
        while not self.closed:
            time.sleep(0.5)
            with self.cond:
                missing = sorted(set(self.gpus) - self.joined)
                if self.failed is not None or not missing or self.closed:
                    return
                if time.monotonic() > self.hello_deadline:
                    self.failed = f"executor for GPU {missing[0]} never connected"
                    self.cond.notify_all()
                    return

    def _accept(self) -> None:
        """Accept until :meth:`close`; no error of one connection ends the loop."""
        while not self.closed:
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self.closed or self.listener.fileno() < 0:
                    return  # closed by close()
                time.sleep(0.05)  # ECONNABORTED (a reset in the backlog), EMFILE...: go on
                continue
            if not self.pending.acquire(blocking=False):
                self._refuse()
                sock.close()
                continue
            try:
                t = threading.Thread(target=self._serve, args=(sock,), daemon=True,
                                     name="coord-conn")
                with self.cond:
                    if self.closed:
                        raise RuntimeError("closed")
                    self._socks.add(sock)
                    self._threads = [x for x in self._threads if x.is_alive()] + [t]
                t.start()
            except RuntimeError:  # no thread to be had: drop this one, keep accepting
                with self.cond:
                    self._socks.discard(sock)
                self.pending.release()
                sock.close()

    def _refuse(self) -> None:
        with self.cond:
            self.refused += 1

    def _join(self, sock: socket.socket) -> tuple[protocol.Channel, str, str] | None:
        """Authenticate a new connection and take its ``join``; None (closed) if it fails."""
        try:
            try:
                ch = protocol.server_handshake(sock, self.key, self.handshake_timeout_s)
                head = protocol.recv_header(ch)
            except (protocol.Refused, protocol.PeerLost):
                self._refuse()
                sock.close()
                return None
            gpu, channel = head.get("gpu"), head.get("channel", "main")
            why = None
            with self.cond:
                if head.get("op") != "join" or not isinstance(gpu, str):
                    why = "expected join {gpu}"
                elif gpu not in self.gpus:
                    why = f"GPU {gpu[:80]!r} is not an executor GPU of this pool job"
                elif channel not in protocol.CHANNELS:
                    why = f"unknown channel {str(channel)[:40]!r}"
                elif (gpu, channel) in self.channels or (
                        channel != "main" and gpu not in self.joined):
                    why = (f"GPU {gpu} has joined already" if channel == "main" else
                           f"GPU {gpu}'s {channel} connection is taken or comes first")
                else:
                    self.channels.add((gpu, channel))
                    if channel == "main":
                        self.joined.add(gpu)
            if why is not None:
                self._refuse()
                try:
                    protocol.send(ch, {"error": why})
                except protocol.PeerLost:
                    pass
                ch.close()
                return None
            protocol.send(ch, {})
            ch.settimeout(self.idle_timeout_s)
            return ch, str(gpu), str(channel)
        except protocol.PeerLost:
            sock.close()
            with self.cond:
                self.channels.discard((str(head.get("gpu")), str(head.get("channel", "main"))))
                if head.get("channel", "main") == "main":
                    self.joined.discard(str(head.get("gpu")))
            return None
        finally:
            self.pending.release()

    def _serve(self, sock: socket.socket) -> None:
        try:
            got = self._join(sock)
        except Exception:  # noqa: BLE001  (whatever a stranger caused: drop it, go on)
            sock.close()
            return
        if got is None:
            return
        conn, gpu, channel = got
        try:
            while True:
                head = protocol.recv_header(conn, self.max_payload)
                op = head.get("op")
                if op == "hello":
                    if head.get("gpu") != gpu:
                        raise BadRequest(f"hello for GPU {str(head.get('gpu'))[:80]!r} on "
                                         f"GPU {gpu}'s connection")
                    with self.cond:
                        offer = self._offer(gpu, head.get("node")) \
                            if channel == "main" and gpu not in self.hello else None
                        if channel == "main":
                            self.hello.add(gpu)
                            self._unlink_when_all_attached()
                    protocol.send(conn, {"rounds_done": self.rounds_done(),
                                         **({"shm": offer} if offer else {})})
                elif op == "shm" and channel == "main":
                    with self.cond:
                        ok = self._attach(gpu, head)
                    protocol.send(conn, {"shm": ok})
                elif op == "get":
                    self._get(conn, head, gpu)
                elif op == "put":
                    self._put(conn, head, gpu)
                elif op == "bye":
                    # answered before the GPU counts as done: rank 0's process ends once
                    # every GPU is, and must not take the last executor's reply with it
                    try:
                        protocol.send(conn, {})
                    except protocol.PeerLost:
                        pass  # it said bye: its work is done, whether or not it heard back
                    if channel == "main":  # an executor's side connections say bye first
                        with self.cond:
                            self.bye.add(gpu)
                            self.cond.notify_all()
                    return
                else:
                    raise BadRequest(f"unknown request {str(op)[:40]!r}")
                if head.get("nbytes") and op != "put":
                    raise BadRequest(f"request {op!r} carries a payload")
        except protocol.PeerIdle:
            self.fail(f"executor for GPU {gpu} sent nothing for {self.idle_timeout_s:.0f} s "
                      "(hung?)")
        except protocol.PeerLost:
            if gpu not in self.bye:
                self.fail(f"executor for GPU {gpu} lost (its connection closed before it "
                          "finished)")
        except (protocol.Refused, ValueError) as e:
            why = f"executor for GPU {gpu}: {e}"
            self.fail(why)
            try:
                protocol.send(conn, {"error": why})
            except protocol.PeerLost:
                pass
        finally:
            conn.close()
            with self.cond:
                self._socks.discard(sock)

    def _job(self, head: dict[str, Any]) -> JobServer:
        name = head.get("job")
        srv = self.jobs.get(name) if isinstance(name, str) else None
        if srv is None:
            raise BadRequest(f"request {head.get('op')!r} for job {str(name)[:80]!r}, "
                             "which is not a job of this plan")
        return srv

    def _get(self, conn: protocol.Channel, head: dict[str, Any], gpu: str = "") -> None:
        srv = self._job(head)
        rnd = req_int(head, "round")
        have = req_int(head, "have", -1)
        if not 0 <= rnd < srv.job.rounds:
            raise BadRequest(f"job {srv.job.name}: round {rnd} requested; the job has rounds "
                             f"0..{srv.job.rounds - 1}")
        with self.cond:
            while self.failed is None and srv.version < rnd and not self.closed:
                self.cond.wait(1.0)
            if self.failed is not None or self.closed:
                protocol.send(conn, {"error": self.failed or "the coordinator closed"})
                return
            if srv.version != rnd:
                raise BadRequest(f"job {srv.job.name}: round {rnd} requested after the job "
                                 f"reached round {srv.version}")
            version = srv.version
        if have == version:
            protocol.send(conn, {"same": True, "version": version})
            return
        if gpu in self.shm_gpus and (gpu, srv.job.name) in self.grad_segs:
            # the executor copies version r out of the job's segment (seqlocked; the round
            # barrier keeps it still: round r's step needs this very task's gradient)
            protocol.send(conn, {"version": version, "shm": True})
            return
        # sent outside the lock: round r's step needs this very task's gradient, so the
        # parameters of version r cannot change while a task of round r pulls them
        protocol.send(conn, {"version": version}, srv.flat.numpy())

    def _put(self, conn: protocol.Channel, head: dict[str, Any], gpu: str = "") -> None:
        srv = self._job(head)
        rnd, task = req_int(head, "round"), req_int(head, "task")
        want = srv.grad.numel() * 4
        if "shm" in head:
            seg = self.grad_segs.get((gpu, srv.job.name)) if gpu in self.shm_gpus else None
            contribution = shared_gradient(srv, head, seg, gpu, rnd, task)
        else:
            if head.get("nbytes") != want:  # checked before a byte of it is read
                raise BadRequest(f"job {srv.job.name}: gradient of {head.get('nbytes')!r} "
                                 f"bytes, expected {want}")
            buf = bytearray(want)  # the job's own size, checked above
            protocol.recv_payload(conn, want, buf)
            contribution = torch.frombuffer(buf, dtype=torch.float32)
        with self.cond:
            if self.failed is not None:
                protocol.send(conn, {"error": self.failed})
                return
            done = srv.add(rnd, task, contribution)
            if done:
                self.cond.notify_all()
            job_done = srv.version >= srv.job.rounds
        protocol.send(conn, {"round_done": done, "job_done": job_done and done})
