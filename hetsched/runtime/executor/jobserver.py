"""One job's parameter server inside the pool coordinator (:mod:`.coordinator`).

:class:`JobServer` holds the job's master parameters (one flat float32 tensor the
model's parameters view, in a shared memory segment when executors of this node
read it: :mod:`.shm`), its optimizer and its version (rounds done); it checks each
contribution (:meth:`JobServer.check_put`, finite values) before adding it, applies one
optimizer step when a round's tasks have all arrived, and checkpoints.
:func:`shared_gradient` reads a contribution an executor wrote into its gradient
segment, after checking what its ``put`` announced. A request that breaks the
protocol raises :class:`BadRequest` (it fails the pool job with one line).
"""

from __future__ import annotations

import hmac
import math
import time
from pathlib import Path
from typing import Any

import torch

from hetsched.runtime.executor import shm, state
from hetsched.runtime.executor.plan import ExecJob


class BadRequest(ValueError):
    """An authenticated executor's request that breaks the protocol (fails the job)."""


def req_int(head: dict[str, Any], key: str, default: int | None = None) -> int:
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
                           dataset_size=1, seed=seed, workdir=job.spec.workdir)
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


def shared_gradient(srv: JobServer, head: dict[str, Any], seg: shm.Segment | None, gpu: str,
                rnd: int, task: int) -> torch.Tensor:
    """The contribution a ``put`` announces in shared memory, after checking the name is
    the one given to this GPU for this job, the size is the job's and the segment's
    header says this round, task and sequence. Nothing is read from a name the peer
    sent: the segment is the coordinator's own, looked up by (GPU, job): ``seg``, None when
    this GPU was given none for this job."""
    name = srv.job.name
    desc = head.get("shm")
    if not isinstance(desc, dict):
        desc = {}
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
