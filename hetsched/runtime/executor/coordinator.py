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

import hmac
import math
import socket
import threading
import time
from pathlib import Path
from typing import Any

import torch

from hetsched.runtime.executor import protocol, shm, state
from hetsched.runtime.executor.plan import ExecJob, ExecPlan

#: connections in their handshake at once; more are closed at once (a flood cannot
#: hold the coordinator's threads)
MAX_PENDING = 64
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


class BadRequest(ValueError):
    """An authenticated executor's request that breaks the protocol (fails the job)."""


def _int(head: dict[str, Any], key: str, default: int | None = None) -> int:
    v = head.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"request {head.get('op')!r}: {key!r} must be an integer, got "
                         f"{str(v)[:40]!r}")
    return v


class JobServer:
    """The parameter server of one job (master weights, optimizer, version = rounds done)."""

    def __init__(self, job: ExecJob, plan_id: str, ckpt_dir: Path | None, seed: int,
                 ckpt_every_s: float = 0.0, shared: bool = False) -> None:
        from hetsched.runtime.workloads import load_workload

        self.job = job
        wl = load_workload(job.spec.workload, entrypoint=job.spec.entrypoint,
                           dataset_size=1, seed=seed)
        self.model = wl.model
        self.flat, self.names = state.flatten_params(self.model)
        #: with ``shared``, the master parameters live in a shared memory segment that the
        #: executors of this node copy from (:mod:`.shm`); None: TCP only
        self.seg: shm.Segment | None = None
        if shared and self.flat.numel():
            try:
                self.seg = shm.Segment.create(self.flat.numel() * 4)
            except shm.ShmUnavailable:
                self.seg = None
            if self.seg is not None:
                view = self.seg.tensor()
                view.copy_(self.flat)
                self.flat = state.rebind_params(self.model, view)
        self.grad = torch.zeros_like(self.flat)
        state.attach_grads(self.model, self.grad)
        self.opt = wl.optimizer(self.model.parameters())
        self.ckpt = state.checkpoint_path(ckpt_dir, plan_id, job.name) if ckpt_dir else None
        self.version = 0
        self.got: set[int] = set()
        self.ckpt_every_s = ckpt_every_s
        self.last_ckpt = time.monotonic()
        if self.ckpt is not None:
            saved = state.load_job_checkpoint(self.ckpt, self.names)
            if saved is not None:
                from hetsched.runtime.checkpoint import CheckpointError

                try:
                    self.flat.copy_(saved["params"])
                    self.opt.load_state_dict(saved["optimizer"])
                except (RuntimeError, ValueError, KeyError, TypeError) as e:
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                    raise CheckpointError(self.ckpt, "does not fit this job's model or "
                                          f"optimizer ({first[:100]})") from None
                self.version = min(int(saved["rounds_done"]), job.rounds)
        if self.seg is not None:
            self.seg.publish(self.version)

    def check_put(self, rnd: int, task: int) -> None:
        """Refuse (BadRequest) a contribution that is not one this round still waits for."""
        if rnd != self.version:
            raise BadRequest(f"job {self.job.name}: gradient for round {rnd} while the job "
                             f"is at round {self.version}")
        if task in self.got or not 0 <= task < self.job.tasks_in(rnd):
            raise BadRequest(f"job {self.job.name}: task {task} of round {rnd} sent twice or "
                             "out of range")

    def add(self, rnd: int, task: int, contribution: torch.Tensor) -> bool:
        """Add one task's contribution; True when it completed the round (step applied)."""
        self.check_put(rnd, task)
        # one pass without a temporary: a NaN or infinity anywhere makes the sum non-finite;
        # only then (or when a huge but finite sum overflows) look element by element
        if not math.isfinite(float(contribution.sum())) \
                and not bool(torch.isfinite(contribution).all()):
            raise BadRequest(f"job {self.job.name}: task {task} of round {rnd} sent a "
                             "gradient with NaN or infinite values; nothing was applied")
        self.grad += contribution
        self.got.add(task)
        if len(self.got) < self.job.tasks_in(rnd):
            return False
        if self.seg is not None:  # readers of the shared copy see a write in progress
            self.seg.begin_write()
        self.opt.step()
        self.grad.zero_()
        self.got.clear()
        self.version += 1
        if self.seg is not None:
            self.seg.publish(self.version)
        due = time.monotonic() - self.last_ckpt >= self.ckpt_every_s
        if self.ckpt is not None and (due or self.version >= self.job.rounds):
            state.save_job_checkpoint(self.ckpt, self.flat, self.names, self.opt.state_dict(),
                                      self.version, self.job.rounds)
            self.last_ckpt = time.monotonic()
        return True


class Coordinator:
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
        self._accepter.start()
        threading.Thread(target=self._watch, daemon=True, name="coord-watch").start()

    def rounds_done(self) -> dict[str, int]:
        return {n: s.version for n, s in self.jobs.items()}

    def accepting(self) -> bool:
        """Whether the accept loop still runs (it stops only on :meth:`close`)."""
        return self._accepter.is_alive()

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.unlink_segments()

    def unlink_segments(self) -> None:
        """Remove every shared memory segment's name (the mappings stay valid)."""
        for srv in self.jobs.values():
            if srv.seg is not None:
                srv.seg.unlink()
        for seg in list(getattr(self, "grad_segs", {}).values()):
            seg.unlink()

    def _offer(self, gpu: str, node: Any) -> dict[str, Any] | None:
        """Shared memory for ``gpu`` when its executor runs on this node: the names of its
        jobs' parameter segments and of a fresh gradient segment per job (under the lock)."""
        if not self.shared or not shm.same_node(node, self.node):
            return None
        params: dict[str, str] = {}
        grads: dict[str, str] = {}
        for name in dict.fromkeys(t.job for t in self.plan.gpus[gpu].tasks):
            srv = self.jobs[name]
            if srv.seg is None:
                continue
            key = (gpu, name)
            if key not in self.grad_segs:
                try:
                    self.grad_segs[key] = shm.Segment.create(srv.seg.nbytes)
                except shm.ShmUnavailable:
                    continue  # no room: this job's bytes go over TCP
            params[name], grads[name] = srv.seg.name, self.grad_segs[key].name
        if not params:
            return None
        self.offered.add(gpu)
        return {"params": params, "grads": grads}

    def _attach(self, gpu: str, head: dict[str, Any]) -> bool:
        """The executor's answer to the offer: the tokens it read from every segment (it
        maps the same memory) or nothing (it could not open them: TCP). Under the lock."""
        if gpu not in self.offered:
            raise BadRequest(f"GPU {gpu} answered a shared memory offer it was not made")
        self.offered.discard(gpu)
        tokens = head.get("tokens")
        ok = isinstance(tokens, dict)
        mine = {n: s for (g, n), s in self.grad_segs.items() if g == gpu}
        if ok:
            for name, seg in mine.items():
                got = tokens.get(name) if isinstance(tokens, dict) else None
                srv = self.jobs[name]
                assert srv.seg is not None
                want = srv.seg.token.hex() + seg.token.hex()
                if not isinstance(got, str) or not hmac.compare_digest(got, want):
                    ok = False
        for seg in mine.values():  # only this GPU opens these: their names can go now
            seg.unlink()
        if ok:
            self.shm_gpus.add(gpu)
        else:
            for (g, n) in [k for k in self.grad_segs if k[0] == gpu]:
                del self.grad_segs[(g, n)]
        self._unlink_when_all_attached()
        return ok

    def _unlink_when_all_attached(self) -> None:
        """Every GPU said hello and answered its offer: no one opens a name any more."""
        if set(self.gpus) <= self.hello and not self.offered:
            for srv in self.jobs.values():
                if srv.seg is not None:
                    srv.seg.unlink()

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
        while True:
            time.sleep(0.5)
            with self.cond:
                missing = sorted(set(self.gpus) - self.joined)
                if self.failed is not None or not missing:
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
                threading.Thread(target=self._serve, args=(sock,), daemon=True,
                                 name="coord-conn").start()
            except RuntimeError:  # no thread to be had: drop this one, keep accepting
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

    def _job(self, head: dict[str, Any]) -> JobServer:
        name = head.get("job")
        srv = self.jobs.get(name) if isinstance(name, str) else None
        if srv is None:
            raise BadRequest(f"request {head.get('op')!r} for job {str(name)[:80]!r}, "
                             "which is not a job of this plan")
        return srv

    def _get(self, conn: protocol.Channel, head: dict[str, Any], gpu: str = "") -> None:
        srv = self._job(head)
        rnd = _int(head, "round")
        have = _int(head, "have", -1)
        if not 0 <= rnd < srv.job.rounds:
            raise BadRequest(f"job {srv.job.name}: round {rnd} requested; the job has rounds "
                             f"0..{srv.job.rounds - 1}")
        with self.cond:
            while self.failed is None and srv.version < rnd:
                self.cond.wait(1.0)
            if self.failed is not None:
                protocol.send(conn, {"error": self.failed})
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

    def _shared_gradient(self, srv: JobServer, head: dict[str, Any], gpu: str, rnd: int,
                         task: int) -> torch.Tensor:
        """The contribution a ``put`` announces in shared memory, after checking the name is
        the one given to this GPU for this job, the size is the job's and the segment's
        header says this round, task and sequence. Nothing is read from a name the peer
        sent: the segment is the coordinator's own, looked up by (GPU, job)."""
        name = srv.job.name
        desc = head.get("shm")
        if not isinstance(desc, dict):
            desc = {}
        seg = self.grad_segs.get((gpu, name)) if gpu in self.shm_gpus else None
        if seg is None:
            raise BadRequest(f"job {name}: gradient in shared memory from GPU {gpu}, which "
                             "was given no shared memory for it; nothing was applied")
        if head.get("nbytes"):
            raise BadRequest(f"job {name}: a put names shared memory and carries a payload")
        got = desc.get("name")
        if not isinstance(got, str) or not hmac.compare_digest(got.encode(), seg.name.encode()):
            raise BadRequest(f"job {name}: gradient segment {str(got)[:60]!r} is not the one "
                             f"given to GPU {gpu} for this job; nothing was applied")
        want = srv.grad.numel() * 4
        if desc.get("nbytes") != want:
            raise BadRequest(f"job {name}: gradient of {str(desc.get('nbytes'))[:20]!r} bytes "
                             f"in shared memory, expected {want}; nothing was applied")
        seq, _, seg_rnd, seg_task = seg.head()
        if (seq, seg_rnd, seg_task) != (desc.get("seq"), rnd, task):
            raise BadRequest(f"job {name}: the gradient segment holds round {seg_rnd} task "
                             f"{seg_task} (seq {seq}), not the announced round {rnd} task "
                             f"{task} (seq {str(desc.get('seq'))[:20]}); nothing was applied")
        return seg.tensor()

    def _put(self, conn: protocol.Channel, head: dict[str, Any], gpu: str = "") -> None:
        srv = self._job(head)
        rnd, task = _int(head, "round"), _int(head, "task")
        want = srv.grad.numel() * 4
        if "shm" in head:
            contribution = self._shared_gradient(srv, head, gpu, rnd, task)
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
