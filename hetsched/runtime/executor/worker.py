"""One GPU's executor: runs its task sequence from the plan, in order.

For each task (job i, round r, task t) of the sequence:

1. ``get`` job i's parameters of version r from its parameter server (this
   waits for round r-1's barrier; a resident copy of version r moves nothing);
2. load them layer by layer (:class:`~hetsched.runtime.executor.slots.JobSlot`);
3. run the task's N iterations: iteration k trains slice t of global batch
   ``r*N + k`` with the mean loss scaled by slice / (samples of the whole
   round), gradients accumulating, so the P tasks' contributions sum to the
   gradient of the mean loss over the round's samples;
4. ``put`` the contribution (the server applies the round's one step when
   all P arrived);
5. clean up as the plan's memory plan says (keep or evict the model, evict
   others) and zero free device memory when the next task is another job's.

Tasks of rounds a checkpoint already holds are skipped (resume).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hetsched.io.reports import ReportWriter
from hetsched.runtime.emulate import Emulation
from hetsched.runtime.executor import protocol
from hetsched.runtime.executor.plan import ExecGpu, ExecJob, ExecPlan, ExecTask
from hetsched.runtime.executor.slots import JobSlot, scrub_free_memory
from hetsched.runtime.sampler import split_counts


class PoolFailed(RuntimeError):
    """The pool job failed (an executor was lost); the message is the coordinator's line."""


@dataclass
class ExecOptions:
    device: torch.device
    seed: int = 0
    residency: bool = True  # follow the plan's keep decisions (False: evict after every task)
    average: bool = False  # WRONG aggregation kept for the equivalence test: plain averaging
    emulation: Emulation | None = None
    on_task: Callable[[dict[str, Any]], None] | None = None  # test hook after each task


@functools.lru_cache(maxsize=8)
def _permutation(seed: int, epoch: int, size: int) -> np.ndarray:
    """An epoch's sample order (cached: a task reads it once per iteration)."""
    perm = np.random.default_rng([seed, epoch]).permutation(size)
    perm.setflags(write=False)
    return perm


def task_indices(job: ExecJob, seed: int, rnd: int, task: int, k: int) -> np.ndarray:
    """Sample indices of task ``task``'s iteration ``k`` in round ``rnd``."""
    step = rnd * job.iterations + k
    epoch = step // job.steps_per_epoch()
    off, n = job.step_samples(step)
    perm = _permutation(seed, epoch, job.dataset_size)
    counts = split_counts(n, job.slices())
    lo = off + sum(counts[:task])
    return perm[lo:lo + counts[task]].copy()  # the cached order stays read-only


class Executor:
    """Runs one GPU's sequence against the coordinator on ``conn``."""

    def __init__(self, xplan: ExecPlan, gpu: ExecGpu, conn: protocol.Channel, reporter: ReportWriter,
                 opts: ExecOptions) -> None:
        from hetsched.runtime.workloads import load_workload

        self.plan, self.gpu, self.conn, self.rep, self.opts = xplan, gpu, conn, reporter, opts
        self.slots: dict[str, JobSlot] = {}
        self.data: dict[str, Any] = {}
        self.loss: dict[str, Any] = {}
        for name in dict.fromkeys(t.job for t in gpu.tasks):  # structures built ahead
            j = xplan.jobs[name]
            wl = load_workload(str(j.spec["workload"]), entrypoint=j.spec.get("entrypoint"),
                               dataset_size=j.dataset_size, seed=opts.seed)
            self.slots[name] = JobSlot(wl.model.to(torch.float32), opts.device)
            self.data[name], self.loss[name] = wl.dataset, wl.loss_fn
        self.cleanup_s = 0.0

    def _call(self, head: dict[str, Any], payload: Any = None, into: Any = None
              ) -> dict[str, Any]:
        try:
            protocol.send(self.conn, head, payload)
            reply, _ = protocol.recv(self.conn, into)
        except protocol.PeerLost as e:
            raise PoolFailed(f"coordinator lost ({e})") from None
        if "error" in reply:
            raise PoolFailed(str(reply["error"]))
        return reply

    def run(self) -> int:
        """Run the sequence; returns the number of tasks run (skipped ones not counted)."""
        done = self._call({"op": "hello", "gpu": self.gpu.id})["rounds_done"]
        ran = 0
        seq = self.gpu.tasks
        for n, t in enumerate(seq):
            if t.round < int(done.get(t.job, 0)):
                continue
            self._task(t, seq[n + 1] if n + 1 < len(seq) else None)
            ran += 1
        self._call({"op": "bye", "gpu": self.gpu.id})
        return ran

    def _task(self, t: ExecTask, nxt: ExecTask | None) -> None:
        job, slot = self.plan.jobs[t.job], self.slots[t.job]
        start = time.time()
        t0 = time.perf_counter()
        warm = slot.resident  # the plan's "warm start": the model is on the device
        have = slot.version if (slot.resident and self.opts.residency) else -1
        reply = self._call({"op": "get", "job": t.job, "round": t.round, "have": have},
                           into=slot.host.numpy())
        t1 = time.perf_counter()
        try:
            load_s = 0.0 if reply.get("same") else slot.load(int(reply["version"]))
            compute_s, samples, iters = self._compute(t, job, slot)
        except torch.OutOfMemoryError:
            # the plan's memory estimate was too small: drop every other resident model
            # and run the task again from its start (its parameters are in host memory)
            load_s = self._make_room(t.job, slot, int(reply["version"]))
            compute_s, samples, iters = self._compute(t, job, slot)
        switch_s = self.cleanup_s + load_s
        t2 = time.perf_counter()
        res = self._call({"op": "put", "job": t.job, "round": t.round, "task": t.task},
                         payload=slot.grad_host.numpy())
        t3 = time.perf_counter()
        end = time.time()
        self.cleanup_s = self._cleanup(t, nxt)
        rec = {"job": t.job, "round": t.round, "task": t.task, "gpu": self.gpu.id,
               "gpu_type": self.gpu.gpu_type, "iterations": iters, "samples": samples,
               "compute_s": round(compute_s, 6), "switch_s": round(switch_s, 6),
               "start": round(start, 6), "end": round(end, 6), "warm": warm,
               "wait_s": round(t1 - t0, 6), "sync_s": round(t3 - t2, 6),
               "load_s": round(load_s, 6), "bytes_in": 0 if reply.get("same") else slot.nbytes}
        self.rep.write("task", **rec)
        if res.get("job_done"):
            self.rep.write("job_done", job=t.job, rounds=job.rounds, end=round(time.time(), 6))
        if self.opts.on_task is not None:
            self.opts.on_task({**rec, "resident": sorted(n for n, s in self.slots.items()
                                                         if s.resident)})

    def _compute(self, t: ExecTask, job: ExecJob, slot: JobSlot) -> tuple[float, int, int]:
        from hetsched.runtime.workloads import gather

        counts = job.task_counts(t.round, t.task)
        total = job.round_samples(t.round)
        dev = self.opts.device
        model, loss_fn = slot.model, self.loss[t.job]
        model.train()
        t0 = time.perf_counter()
        for k, n in enumerate(counts):
            tk = time.perf_counter()
            slot.collect = k == len(counts) - 1
            if n == 0:
                continue
            idx = task_indices(job, self.opts.seed, t.round, t.task, k)
            x, y = gather(self.data[t.job], idx)
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            scale = 1.0 / (job.tasks_per_round * len(counts)) if self.opts.average \
                else n / total
            (loss_fn(model(x), y) * scale).backward()
            if k == 0:
                slot.check_loaded()
            if self.opts.emulation is not None:
                self.opts.emulation.pad(n, tk)
        slot.collect = False
        slot.finish_gradients()
        return time.perf_counter() - t0, sum(counts), len(counts)

    def _make_room(self, job: str, slot: JobSlot, version: int) -> float:
        """After an out-of-memory error: evict every other job, reload this one."""
        for name, other in self.slots.items():
            if name != job:
                other.evict()
        slot.collect = False
        for p in slot.params:
            p.grad = None
        slot.evict()  # zeroes what it loaded; the host buffer still holds the parameters
        scrub_free_memory(self.opts.device)
        if self.opts.device.type == "cuda":
            torch.cuda.empty_cache()
        return slot.load(version)

    def _cleanup(self, t: ExecTask, nxt: ExecTask | None) -> float:
        """The plan's memory decisions after task ``t``; zero free memory before another job."""
        t0 = time.perf_counter()
        slot = self.slots[t.job]
        if not (t.keep and self.opts.residency):
            slot.evict()
        for other in t.evict:
            if other in self.slots:
                self.slots[other].evict()
        if nxt is None or nxt.job != t.job:
            scrub_free_memory(self.opts.device)
        return time.perf_counter() - t0
