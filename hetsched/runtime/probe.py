"""The probe job's body: measure one workload's step time on this GPU type.

For each local batch of the sweep (ascending): a few warm-up steps, then timed
steps (at least ``steps``, and at least 0.2 s of them: ``MIN_TIMED_S``) of
**the job's own step** (``runtime/step.py``: the sampler's indices, the batch
fed as a run feeds it, forward, the share-weighted backward, the
gradient reduction, the optimizer, the step's bookkeeping), as a one-rank job
of that local batch; on a GPU the timed steps run back to back between two
synchronisations, as a run's steady state does. On a GPU, the largest batch that fits
is found by catching CUDA's out-of-memory error: the sweep stops at the first
OOM, or, when every batch fits, keeps doubling and then bisects up to
``max_batch``. On CPU the sweep is capped at its largest batch (host memory is
not the constraint the planner models). The sync time is a gloo all-reduce of
a gradient-sized buffer between in-process ranks, i.e. the intra-node
exchange cost of this model, measured at 2 and 4 ranks (``sync_gpus``): the
one-GPU rows carry the 2-rank time in ``sync_time_s``, and one row per scale K
(``gpus`` = K, the largest batch's step time plus the K-rank sync) lets the
planner calibrate its communication model at several scales. Each row also
carries ``optimizer_s``, the optimizer step's share of its step (the step's
phase timer over the same timed steps): a pool job's task iterations have no
optimizer step, and the pool planner takes it off.

A time limit stops the sweep early with the rows measured so far (a probe that
measured nothing fails, and the profiler marks the pair unusable).
"""

from __future__ import annotations

import datetime
import math
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hetsched.runtime.emulate import emulation_for
from hetsched.runtime.sampler import ShareSampler
from hetsched.runtime.step import WARMUP_STEPS, Feeder, build_step, sync_device
from hetsched.runtime.workloads import Workload, load_workload


@dataclass
class ProbeResult:
    rows: list[Any]  # core.throughput.ProfileRow (imported after the steps: it needs scipy)
    max_batch: int
    oom_at: int | None
    elapsed_s: float
    device: str


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


#: a batch's timed steps last at least this long: 5 steps of a 1.5 ms step (7.5 ms) are at
#: the mercy of a GPU's clocks, which idle low, and of the host's kernel launches
MIN_TIMED_S = 0.2
#: at most this many timed steps per batch, however fast the step
MAX_TIMED_STEPS = 5000
#: at most this many blocks timed again to fill ``min_time_s``
MAX_REFILLS = 4


def _time_steps(wl: Workload, b: int, dev: torch.device, warmup: int, steps: int,
                gpu_type: str, feeder: Feeder | None = None, min_time_s: float = 0.0
                ) -> tuple[float, float]:
    """Seconds per training step at local batch ``b`` and the optimizer step's share of
    it: the job's own step (:class:`~hetsched.runtime.step.TrainStep`, fed by the
    sampler as a one-rank job of local batch ``b``), ``warmup`` steps first as a run's
    steady state starts after them, then the mean over the timed steps between two
    synchronisations (a step is not synchronised on its own, as in a run: its
    steady-state mean is measured the same way); when those steps take less than
    ``min_time_s`` together, as many as fill it are timed again instead; the
    optimizer's share is the mean of the same steps' phase timer
    (``StepClock.optimizer_s``)."""
    run_step = build_step(wl, dev, emulation=emulation_for(gpu_type), model=wl.model,
                          feeder=feeder)
    size = len(wl.dataset)  # type: ignore[arg-type]
    # a batch larger than the probe's data set (the GPU's memory search): indices repeat
    sampler = ShareSampler(max(size, b), [b], 0)

    def one(nxt: bool) -> None:
        idx, n = sampler.next()
        idx = idx % size
        run_step(idx, n, counts=[n], next_idx=(sampler.peek()[0][0] % size) if nxt else None)

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        for k in range(n):
            one(k + 1 < n)
        sync_device(dev)
        wall = time.perf_counter() - t0
        run_step.clock.flush()
        return wall

    for _ in range(warmup):
        one(True)
    sync_device(dev)
    run_step.clock.flush()  # the warm-up's phase times are not the timed steps'
    n = max(1, steps)
    wall = timed(n)
    for _ in range(MAX_REFILLS):
        if wall >= min_time_s or n >= MAX_TIMED_STEPS:
            break
        # too short to time (a GPU's clocks and launches, a host's timer): time again, as
        # many steps as fill ``min_time_s`` at the last block's pace; that block was a
        # warm-up. A cold block runs slower than the steady state, so its pace may ask
        # for too few steps: the loop times again until a block fills ``min_time_s``
        n = min(MAX_TIMED_STEPS, max(n + 1, math.ceil(min_time_s * n / max(wall, 1e-9))))
        wall = timed(n)
    return wall / n, min(run_step.clock.optimizer_s / n, wall / n)


def measure_sync(numel: int, repeats: int = 5, ranks: int = 2) -> float | None:
    """Median seconds of a gloo all-reduce of ``numel`` floats between ``ranks`` in-process ranks."""
    import torch.distributed as dist

    try:
        store = dist.HashStore()
        pgs: list[object] = [None] * ranks
        bufs = [torch.ones(numel) for _ in range(ranks)]
        times: list[float] = []
        barrier = threading.Barrier(ranks)

        def mk(r: int) -> None:
            pgs[r] = dist.ProcessGroupGloo(dist.PrefixStore(f"probe{ranks}", store), r, ranks,
                                           datetime.timedelta(seconds=30))

        def run(r: int) -> None:
            for _ in range(repeats + 1):
                barrier.wait()
                t0 = time.perf_counter()
                pgs[r].allreduce([bufs[r]]).wait()  # type: ignore[attr-defined]
                if r == 0:
                    times.append(time.perf_counter() - t0)

        for fn in (mk, run):
            ts = [threading.Thread(target=fn, args=(r,)) for r in range(ranks)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
        pgs.clear()
        return statistics.median(times[1:]) if len(times) > 1 else None
    except (RuntimeError, AttributeError):
        return None  # no in-process gloo on this build: the planner falls back to its model


def _sync_times(model: torch.nn.Module, sync_gpus: Sequence[int]) -> dict[int, float]:
    """The gradient all-reduce of ``model``'s size at each scale of ``sync_gpus`` (2+)."""
    numel = sum(p.numel() for p in model.parameters())
    out: dict[int, float] = {}
    for k in sorted({int(k) for k in sync_gpus if int(k) >= 2}):
        v = measure_sync(numel, ranks=k)
        if v is not None:
            out[k] = v
    return out


def probe(workload: str, gpu_type: str, batches: Sequence[int], *, entrypoint: str | None = None,
          warmup: int = WARMUP_STEPS, steps: int = 5, device: str | None = None,
          time_limit_s: float | None = None, max_batch: int = 4096, sync: bool = True,
          seed: int = 0, sync_gpus: Sequence[int] = (2, 4), dataset_size: int | None = None,
          workdir: str | None = None, min_time_s: float = MIN_TIMED_S) -> ProbeResult:
    """Sweep ``batches`` (module docstring; ``steps``, and ``min_time_s`` of them, at least):
    rows in the planner's CSV format. ``dataset_size``: build the workload's data set at the
    job's size (default 256); ``workdir``: where the entrypoint's module is imported from."""
    t_start = time.perf_counter()
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    dev = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    if not use_cuda:
        from hetsched.runtime.launcher import cpu_threads

        torch.set_num_threads(cpu_threads())
    sweep = sorted({int(b) for b in batches if int(b) >= 1})
    if not sweep:
        raise ValueError("no local batch sizes to probe")
    # the job's data set size when known (its gather reads from as much memory)
    size = max(max(sweep), dataset_size or 256)
    wl = load_workload(workload, entrypoint=entrypoint, dataset_size=size, seed=seed,
                       workdir=workdir)
    wl.model.to(dev)
    feeder = Feeder(wl.dataset, dev)  # built once: the data set may move to the GPU
    measured: dict[int, float] = {}
    optimizer: dict[int, float] = {}  # the optimizer's share of each measured step
    oom_at: int | None = None

    def over_time() -> bool:
        return time_limit_s is not None and time.perf_counter() - t_start > time_limit_s

    def attempt(b: int) -> bool:
        nonlocal oom_at
        try:
            measured[b], optimizer[b] = _time_steps(wl, b, dev, warmup, steps, gpu_type,
                                                    feeder, min_time_s)
            return True
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
            if not (use_cuda and _is_oom(e)):
                raise
            oom_at = b if oom_at is None else min(oom_at, b)
            wl.model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            return False

    for b in sweep:
        if over_time() or not attempt(b):
            break
    if use_cuda and oom_at is None and measured and not over_time():
        # everything fit: look for the memory limit above the sweep
        b = max(measured)
        while b * 2 <= max_batch and not over_time():
            b *= 2
            if not attempt(b):
                break
    if use_cuda and oom_at is not None and measured:
        lo, hi = max(measured), oom_at  # fits at lo, not at hi
        while hi - lo > max(1, lo // 8) and not over_time():
            mid = (lo + hi) // 2
            if attempt(mid):
                lo = mid
            else:
                hi = mid
    cap = max(measured) if measured else 0
    by_scale = _sync_times(wl.model, sync_gpus) if sync and measured else {}
    sync_s = by_scale.get(2)
    from hetsched.core.throughput import ProfileRow

    # a memory cap only where memory bounded the sweep (an out-of-memory on a GPU): on a CPU,
    # or a GPU that held every batch tried, the largest batch says nothing about memory
    mem_cap = cap if use_cuda and oom_at is not None and measured else None
    rows = [ProfileRow(workload, gpu_type.lower(), b, t, sync_s, mem_cap,
                       optimizer_s=optimizer.get(b))
            for b, t in sorted(measured.items()) if math.isfinite(t)]
    if rows:  # one whole-iteration row per measured scale, at the largest batch
        top = rows[-1]
        rows += [ProfileRow(workload, gpu_type.lower(), top.local_batch, top.step_time_s + v, v,
                            mem_cap, gpus=k, optimizer_s=top.optimizer_s)
                 for k, v in sorted(by_scale.items())]
    return ProbeResult(rows, cap, oom_at, time.perf_counter() - t_start, str(dev))
