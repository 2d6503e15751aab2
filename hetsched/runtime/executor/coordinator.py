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
"""

from __future__ import annotations

import threading
import time
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

import torch

from hetsched.runtime.executor import protocol, state
from hetsched.runtime.executor.plan import ExecJob, ExecPlan


class JobServer:
    """The parameter server of one job (master weights, optimizer, version = rounds done)."""

    def __init__(self, job: ExecJob, plan_id: str, ckpt_dir: Path | None, seed: int,
                 ckpt_every_s: float = 0.0) -> None:
        from hetsched.runtime.workloads import load_workload

        self.job = job
        wl = load_workload(str(job.spec["workload"]), entrypoint=job.spec.get("entrypoint"),
                           dataset_size=1, seed=seed)
        self.model = wl.model
        self.flat, self.names = state.flatten_params(self.model)
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
                self.flat.copy_(saved["params"])
                self.opt.load_state_dict(saved["optimizer"])
                self.version = int(saved["rounds_done"])

    def add(self, rnd: int, task: int, contribution: torch.Tensor) -> bool:
        """Add one task's contribution; True when it completed the round (step applied)."""
        if rnd != self.version:
            raise ValueError(f"job {self.job.name}: gradient for round {rnd} while the job is "
                             f"at round {self.version}")
        if task in self.got or not 0 <= task < self.job.tasks_per_round:
            raise ValueError(f"job {self.job.name}: task {task} of round {rnd} sent twice or "
                             "out of range")
        self.grad += contribution
        self.got.add(task)
        if len(self.got) < self.job.tasks_per_round:
            return False
        self.opt.step()
        self.grad.zero_()
        self.got.clear()
        self.version += 1
        due = time.monotonic() - self.last_ckpt >= self.ckpt_every_s
        if self.ckpt is not None and (due or self.version >= self.job.rounds):
            state.save_job_checkpoint(self.ckpt, self.flat, self.names, self.opt.state_dict(),
                                      self.version, self.job.rounds)
            self.last_ckpt = time.monotonic()
        return True


class Coordinator:
    """Serves every executor of one pool job (threads in rank 0's process)."""

    def __init__(self, xplan: ExecPlan, gpus: list[str], listener: Listener,
                 ckpt_dir: Path | None, seed: int = 0, hello_timeout_s: float = 300.0,
                 ckpt_every_s: float = 0.0) -> None:
        self.plan = xplan
        self.gpus = list(gpus)
        self.listener = listener
        self.jobs = {n: JobServer(j, xplan.plan_id, ckpt_dir, seed, ckpt_every_s)
                     for n, j in xplan.jobs.items()}
        self.cond = threading.Condition()
        self.failed: str | None = None
        self.hello: set[str] = set()
        self.bye: set[str] = set()
        self.hello_deadline = time.monotonic() + hello_timeout_s
        threading.Thread(target=self._accept, daemon=True, name="coord-accept").start()
        threading.Thread(target=self._watch, daemon=True, name="coord-watch").start()

    def rounds_done(self) -> dict[str, int]:
        return {n: s.version for n, s in self.jobs.items()}

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
        """Fail the pool job when an executor has not connected by the deadline."""
        while True:
            time.sleep(0.5)
            with self.cond:
                missing = sorted(set(self.gpus) - self.hello)
                if self.failed is not None or not missing:
                    return
                if time.monotonic() > self.hello_deadline:
                    self.failed = f"executor for GPU {missing[0]} never connected"
                    self.cond.notify_all()
                    return

    def _accept(self) -> None:
        while True:
            try:
                conn = protocol.accept(self.listener)
            except OSError:
                return  # listener closed
            except Exception:  # noqa: BLE001  (a failed handshake: a stranger, ignore it)
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: protocol.Channel) -> None:
        gpu = "?"
        try:
            while True:
                head, payload = protocol.recv(conn)
                op = head.get("op")
                if op == "hello":
                    gpu = str(head.get("gpu"))
                    with self.cond:
                        self.hello.add(gpu)
                    protocol.send(conn, {"rounds_done": self.rounds_done()})
                elif op == "get":
                    self._get(conn, head)
                elif op == "put":
                    self._put(conn, head, payload)
                elif op == "bye":
                    with self.cond:
                        self.bye.add(gpu)
                        self.cond.notify_all()
                    protocol.send(conn, {})
                    return
                else:
                    protocol.send(conn, {"error": f"unknown request {op!r}"})
        except protocol.PeerLost:
            if gpu not in self.bye:
                self.fail(f"executor for GPU {gpu} lost (its connection closed before it "
                          "finished)")
        except ValueError as e:
            self.fail(str(e))
            try:
                protocol.send(conn, {"error": str(e)})
            except protocol.PeerLost:
                pass
        finally:
            conn.close()

    def _get(self, conn: protocol.Channel, head: dict[str, Any]) -> None:
        srv = self.jobs[str(head["job"])]
        rnd = int(head["round"])
        with self.cond:
            while self.failed is None and srv.version < rnd:
                self.cond.wait(1.0)
            if self.failed is not None:
                protocol.send(conn, {"error": self.failed})
                return
            if srv.version != rnd:
                raise ValueError(f"job {srv.job.name}: round {rnd} requested after the job "
                                 f"reached round {srv.version}")
            version = srv.version
        if int(head.get("have", -1)) == version:
            protocol.send(conn, {"same": True, "version": version})
            return
        # sent outside the lock: round r's step needs this very task's gradient, so the
        # parameters of version r cannot change while a task of round r pulls them
        protocol.send(conn, {"version": version}, srv.flat.numpy())

    def _put(self, conn: protocol.Channel, head: dict[str, Any], payload: bytes | None) -> None:
        srv = self.jobs[str(head["job"])]
        if payload is None or len(payload) != srv.grad.numel() * 4:
            raise ValueError(f"job {srv.job.name}: gradient of the wrong size")
        contribution = torch.frombuffer(bytearray(payload), dtype=torch.float32)
        with self.cond:
            if self.failed is not None:
                protocol.send(conn, {"error": self.failed})
                return
            done = srv.add(int(head["round"]), int(head["task"]), contribution)
            if done:
                self.cond.notify_all()
            job_done = srv.version >= srv.job.rounds
        protocol.send(conn, {"round_done": done, "job_done": job_done and done})
