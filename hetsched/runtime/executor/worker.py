"""One GPU's executor: runs its task sequence from the plan, in order.

For each task (job i, round r, task t) of the sequence:

1. ``get`` job i's parameters of version r from its parameter server (this
   waits for round r-1's barrier; a resident copy of version r moves nothing);
2. load them layer by layer (:class:`~hetsched.runtime.executor.slots.JobSlot`);
3. run the task's N iterations: iteration k trains slice t of global batch
   ``r*N + k`` with the mean loss scaled by slice / (samples of the whole
   round), gradients accumulating, so the P tasks' contributions sum to the
   gradient of the mean loss over the round's samples (several steps' slices
   a pass where the plan's ``chunk`` allows: :meth:`ExecJob.passes`);
4. ``put`` the contribution (the server applies the round's one step when
   all P arrived);
5. clean up as the plan's memory plan says (keep or evict the model, evict
   others) and zero free device memory when the next task is another job's.

Tasks of rounds a checkpoint already holds are skipped (resume).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from hetsched.io.reports import ReportWriter
from hetsched.runtime.emulate import Emulation
from hetsched.runtime.executor import protocol, shm
from hetsched.runtime.executor.iteration import iteration, pass_indices
from hetsched.runtime.executor.plan import ExecGpu, ExecJob, ExecPlan, ExecTask
from hetsched.runtime.executor.protocol import PoolFailed
from hetsched.runtime.executor.slots import JobSlot, scrub_free_memory


@dataclass
class ExecOptions:
    device: torch.device
    seed: int = 0
    residency: bool = True  # follow the plan's keep decisions (False: evict after every task)
    average: bool = False  # WRONG aggregation kept for the equivalence test: plain averaging
    emulation: Emulation | None = None
    on_task: Callable[[dict[str, Any]], None] | None = None  # test hook after each task
    #: another authenticated connection to the coordinator: pulls ahead, pushes behind
    connect: Callable[[str], protocol.Channel] | None = None
    #: ``auto``: shared memory (:mod:`.shm`) where the coordinator offers it; ``tcp``: TCP
    transport: str = "auto"


class _Pulled:
    """A parameter pull in flight: its request's residency guess and its reply."""

    def __init__(self, task: ExecTask, have: int, future: Future[dict[str, Any]],
                 into_spare: bool) -> None:
        self.task, self.have, self.future, self.into_spare = task, have, future, into_spare


class Executor:
    """Runs one GPU's sequence against the coordinator on ``conn``.

    With ``opts.connect`` (a second and third connection to the coordinator)
    parameters and gradients move off the critical path: a pull thread fetches
    the next task's parameters into the job's spare host buffer while the
    current task computes, and a push thread sends each task's gradient while
    the next task runs (separate connections, so a pull waiting for a round
    barrier never holds up a push). Without it, get and put run in line.
    """

    def __init__(self, xplan: ExecPlan, gpu: ExecGpu, conn: protocol.Channel, reporter: ReportWriter,
                 opts: ExecOptions) -> None:
        from hetsched.runtime.workloads import load_workload

        self.plan, self.gpu, self.conn, self.rep, self.opts = xplan, gpu, conn, reporter, opts
        self.slots: dict[str, JobSlot] = {}
        self.data: dict[str, Any] = {}
        self.loss: dict[str, Any] = {}
        for name in dict.fromkeys(t.job for t in gpu.tasks):  # structures built ahead
            j = xplan.jobs[name]
            wl = load_workload(j.spec.workload, entrypoint=j.spec.entrypoint,
                               workdir=j.spec.workdir, dataset_size=j.dataset_size, seed=opts.seed)
            self.slots[name] = JobSlot(wl.model.to(torch.float32), opts.device)
            self.data[name], self.loss[name] = wl.dataset, wl.loss_fn
        self.cleanup_s = 0.0
        self.side: list[protocol.Channel] = []  # the pull and push connections
        self.pull_pool: ThreadPoolExecutor | None = None
        self.push_pool: ThreadPoolExecutor | None = None
        self.pushes: dict[str, list[Future[Any]]] = {}  # job -> puts in flight, oldest first
        self.last_compute_end: float | None = None
        self.totals = {"compute": 0.0, "overhead": 0.0, "stall": 0.0}
        self.overheads: list[float] = []
        self.first_compute_age: float | None = None
        #: job -> (its parameter segment, this GPU's gradient segment) when the coordinator
        #: is on this node (shared memory); jobs not in it move over TCP
        self.shm: dict[str, tuple[shm.Segment, shm.Segment]] = {}

    def _call(self, head: dict[str, Any], payload: Any = None, into: Any = None,
              conn: protocol.Channel | None = None) -> dict[str, Any]:
        try:
            ch = self.conn if conn is None else conn
            protocol.send(ch, head, payload)
            reply, _ = protocol.recv(ch, into)
        except protocol.PeerLost as e:
            raise PoolFailed(f"coordinator lost ({e})") from None
        if "error" in reply:
            raise PoolFailed(str(reply["error"]))
        return reply

    def run(self) -> int:
        """Run the sequence; returns the number of tasks run (skipped ones not counted)."""
        hello: dict[str, Any] = {"op": "hello", "gpu": self.gpu.id}
        if self.opts.transport != "tcp" and shm.available():
            hello["node"] = shm.node_identity()
        reply = self._call(hello)
        done = reply["rounds_done"]
        if "shm" in reply:
            self._attach(reply["shm"])
        todo = [t for t in self.gpu.tasks if t.round >= int(done.get(t.job, 0))]
        self.last_compute_end = t_start = time.perf_counter()
        try:
            self._open_side()
            pulled = self._pull(todo[0], None) if todo else None
            for n, t in enumerate(todo):
                assert pulled is not None
                nxt = todo[n + 1] if n + 1 < len(todo) else None
                pulled = self._task(t, nxt, pulled)
            self._drain()
            wall = time.perf_counter() - t_start
            self._summary(wall, len(todo))
            for ch in [*self.side, self.conn]:  # the main connection's bye ends this GPU
                self._call({"op": "bye", "gpu": self.gpu.id}, conn=ch)
        finally:
            self._close_side()
        return len(todo)

    # -- shared memory ---------------------------------------------------------------------
    def _attach(self, offer: Any) -> None:
        """Open the segments the coordinator offered and prove it with their tokens; a name,
        owner, mode or size that is not right fails the pool job (one line); segments this
        process cannot see (another node or container after all) leave it on TCP."""
        try:
            segs = shm.attach_offer(offer, {j: slot.nbytes for j, slot in self.slots.items()})
        except shm.ShmRefused as e:
            raise PoolFailed(f"{e}; refused") from None
        tokens = {j: p.token.hex() + g.token.hex() for j, (p, g) in segs.items()} or None
        if self._call({"op": "shm", "gpu": self.gpu.id, "tokens": tokens}).get("shm"):
            self.shm = segs

    def _get(self, head: dict[str, Any], into: Any, conn: protocol.Channel | None = None
             ) -> dict[str, Any]:
        """``get`` the parameters into ``into``: received from the socket, or copied out of
        the job's shared segment when the reply says so (version checked, seqlocked)."""
        reply = self._call(head, into=into, conn=conn)
        if reply.get("shm"):
            segs = self.shm.get(str(head["job"]))
            if segs is None:
                raise PoolFailed(f"the coordinator answered job {head['job']}'s parameters "
                                 "through shared memory this executor did not attach")
            try:
                segs[0].read_params(into, int(reply["version"]))
            except shm.ShmRefused as e:
                raise PoolFailed(str(e)) from None
        return reply

    def _put_head(self, t: ExecTask, buf: Any) -> tuple[dict[str, Any], Any]:
        """The ``put`` for ``t``'s contribution in ``buf``: through this GPU's gradient
        segment (only the header crosses TCP) or with the bytes as payload."""
        head: dict[str, Any] = {"op": "put", "job": t.job, "round": t.round, "task": t.task}
        segs = self.shm.get(t.job)
        if segs is None:
            return head, buf
        seq = segs[1].write_grad(buf, t.round, t.task)
        head["shm"] = {"name": segs[1].name, "nbytes": segs[1].nbytes, "seq": seq}
        return head, None

    # -- the pull and push connections ---------------------------------------------------
    def _open_side(self) -> None:
        if self.opts.connect is None:
            return
        for channel in ("pull", "push"):
            ch = self.opts.connect(channel)
            self.side.append(ch)
            self._call({"op": "hello", "gpu": self.gpu.id}, conn=ch)
        self.pull_pool = ThreadPoolExecutor(1, thread_name_prefix=f"pull-{self.gpu.id}")
        self.push_pool = ThreadPoolExecutor(1, thread_name_prefix=f"push-{self.gpu.id}")

    def _close_side(self) -> None:
        for ch in self.side:  # unblocks a pull still waiting for a barrier (failure paths)
            ch.close()
        for pool in (self.pull_pool, self.push_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def _drain(self) -> None:
        """Wait for every push in flight (before ``bye``: the round barrier needs them)."""
        for futs in self.pushes.values():
            for f in futs:
                f.result()
        self.pushes.clear()

    def _predicted_have(self, t: ExecTask, prev: ExecTask | None, prev_version: int) -> int:
        """The version job ``t.job`` will hold on the device when ``t`` starts, given that
        ``prev`` (running now, with parameters of ``prev_version``) ends as the plan says."""
        if not self.opts.residency:
            return -1
        slot = self.slots[t.job]
        if prev is None:
            return slot.version if slot.resident else -1
        if prev.job == t.job:
            return prev_version if prev.keep else -1
        if t.job in prev.evict or not slot.resident:
            return -1
        return slot.version

    def _pull(self, t: ExecTask, prev: ExecTask | None, prev_version: int = -1) -> _Pulled:
        """Start fetching ``t``'s parameters (in line without a pull connection)."""
        slot = self.slots[t.job]
        have = self._predicted_have(t, prev, prev_version)
        # a job's current host buffer is in use while one of its tasks loads: receive into
        # the spare one whenever the previous task is this job's (or it is running now)
        spare = self.pull_pool is not None
        into = (slot.receive_buffer() if spare else slot.host).numpy()
        head = {"op": "get", "job": t.job, "round": t.round, "have": have}
        fut: Future[dict[str, Any]]
        if self.pull_pool is not None:
            fut = self.pull_pool.submit(self._get, head, into, self.side[0])
        else:
            fut = Future()
            fut.set_result({"deferred": True})
        return _Pulled(t, have, fut, spare)

    def _params(self, p: _Pulled, slot: JobSlot) -> dict[str, Any]:
        """The pulled reply for ``p.task``, its parameters in ``slot.host``."""
        t = p.task
        if self.pull_pool is None:
            have = slot.version if (slot.resident and self.opts.residency) else -1
            return self._get({"op": "get", "job": t.job, "round": t.round, "have": have},
                             slot.host.numpy())
        reply = p.future.result()
        if reply.get("same") and not (slot.resident and slot.version == int(reply["version"])):
            # the guess was wrong (an out-of-memory retry evicted it): fetch it now
            reply = self.pull_pool.submit(
                self._get, {"op": "get", "job": t.job, "round": t.round, "have": -1},
                slot.receive_buffer().numpy(), self.side[0]).result()
        if not reply.get("same"):
            slot.adopt_received()
        return reply

    def _push(self, t: ExecTask, slot: JobSlot, rec: dict[str, Any]) -> None:
        """Send ``t``'s gradient; the task's record is written when the server took it."""
        job = self.plan.jobs[t.job]
        if self.push_pool is None:
            t0 = time.perf_counter()
            head, payload = self._put_head(t, slot.grad_host.numpy())
            res = self._call(head, payload=payload)
            self._pushed(rec, res, job, time.perf_counter() - t0)
            return
        futs = self.pushes.setdefault(t.job, [])
        while len(futs) >= 1:  # the buffer about to collect was pushed by the one before
            futs.pop(0).result()
        buf = slot.swap_gradients()

        def send() -> None:
            t0 = time.perf_counter()
            head, payload = self._put_head(t, buf.numpy())
            res = self._call(head, payload, None, self.side[1])
            self._pushed(rec, res, job, time.perf_counter() - t0)

        futs.append(self.push_pool.submit(send))

    def _pushed(self, rec: dict[str, Any], res: dict[str, Any], job: ExecJob,
                sync_s: float) -> None:
        self.rep.write("task", **rec, sync_s=round(sync_s, 6))
        if res.get("job_done"):
            self.rep.write("job_done", job=rec["job"], rounds=job.rounds,
                           end=round(time.time(), 6))

    # -- one task ------------------------------------------------------------------------
    def _task(self, t: ExecTask, nxt: ExecTask | None, pulled: _Pulled) -> _Pulled | None:
        job, slot = self.plan.jobs[t.job], self.slots[t.job]
        start = time.time()
        t0 = time.perf_counter()
        warm = slot.resident  # the plan's "warm start": the model is on the device
        reply = self._params(pulled, slot)
        t1 = time.perf_counter()
        version = int(reply["version"])
        # the next task's parameters travel while this one computes
        ahead = self._pull(nxt, t, version) if nxt is not None and self.pull_pool else None
        try:
            load_s = 0.0 if reply.get("same") else slot.load(version)
            compute_s, samples, iters, c0 = self._compute(t, job, slot)
        except torch.OutOfMemoryError:
            # the plan's memory estimate was too small: drop every other resident model
            # and run the task again from its start (its parameters are in host memory)
            load_s = self._make_room(t.job, slot, version)
            compute_s, samples, iters, c0 = self._compute(t, job, slot)
        c1 = time.perf_counter()
        assert self.last_compute_end is not None
        overhead = c0 - self.last_compute_end  # the device idle between two computes
        self.last_compute_end = c1
        if self.first_compute_age is None:  # this process's start to its first compute
            from hetsched.runtime.step import process_age

            age = process_age()
            self.first_compute_age = (age - (time.perf_counter() - c0)) if age else None
        switch_s = self.cleanup_s + load_s
        end = time.time()
        rec = {"job": t.job, "round": t.round, "task": t.task, "gpu": self.gpu.id,
               "gpu_type": self.gpu.gpu_type, "iterations": iters, "samples": samples,
               "compute_s": round(compute_s, 6), "switch_s": round(switch_s, 6),
               "start": round(start, 6), "end": round(end, 6), "warm": warm,
               "wait_s": round(t1 - t0, 6), "overhead_s": round(overhead, 6),
               "load_s": round(load_s, 6), "bytes_in": 0 if reply.get("same") else slot.nbytes,
               "via": "shm" if t.job in self.shm else "tcp"}
        self.totals["compute"] += compute_s
        self.totals["overhead"] += overhead
        self.totals["stall"] += t1 - t0
        self.overheads.append(overhead)
        self._push(t, slot, rec)
        self.cleanup_s = self._cleanup(t, nxt)
        if self.opts.on_task is not None:
            self.opts.on_task({**rec, "resident": sorted(n for n, s in self.slots.items()
                                                         if s.resident)})
        if nxt is None:
            return None
        return ahead if ahead is not None else self._pull(nxt, t, version)

    def _summary(self, wall: float, tasks: int) -> None:
        """The executor's per-GPU totals: wall, compute and the critical-path overhead."""
        comp = self.totals["compute"]
        ov = sorted(self.overheads)
        self.rep.write("executor", gpu=self.gpu.id, gpu_type=self.gpu.gpu_type, tasks=tasks,
                       wall_s=round(wall, 6), compute_s=round(comp, 6),
                       overhead_s=round(self.totals["overhead"], 6),
                       stall_s=round(self.totals["stall"], 6),
                       overhead_p50_s=round(ov[len(ov) // 2], 6) if ov else None,
                       overhead_max_s=round(ov[-1], 6) if ov else None,
                       wall_over_compute=round(wall / comp, 4) if comp > 0 else None,
                       start_to_first_compute_s=round(self.first_compute_age, 3)
                       if self.first_compute_age is not None else None,
                       pipelined=self.pull_pool is not None,
                       transport="shm" if self.shm else "tcp")

    def _compute(self, t: ExecTask, job: ExecJob, slot: JobSlot
                 ) -> tuple[float, int, int, float]:
        """Run the task's iterations: (seconds, samples, iterations, perf_counter at start)."""
        counts = job.task_counts(t.round, t.task)
        total = job.round_samples(t.round)
        passes = job.passes(t.round, t.task, self.gpu.gpu_type)
        dev = self.opts.device
        model, loss_fn = slot.model, self.loss[t.job]
        model.train()
        t0 = time.perf_counter()
        for k, steps in enumerate(passes):
            tk = time.perf_counter()
            slot.collect = k == len(passes) - 1
            n = sum(counts[s] for s in steps)
            if n == 0:
                continue
            idx = pass_indices(job, self.opts.seed, t.round, t.task, steps)
            scale = len(steps) / (job.tasks_in(t.round) * len(counts)) if self.opts.average \
                else n / total
            iteration(model, loss_fn, self.data[t.job], idx, dev, scale)
            if k == 0:
                slot.check_loaded()
            if self.opts.emulation is not None:
                self.opts.emulation.pad(n, tk)
        slot.collect = False
        slot.finish_gradients()
        return time.perf_counter() - t0, sum(counts), len(passes), t0

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
