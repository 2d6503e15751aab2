"""The probe job's body: measure one workload's step time on this GPU type.

For each local batch of the sweep (ascending): a few warm-up steps, then timed
steps of forward + backward + optimizer (with ``cuda.synchronize`` so the time
is the GPU's, not the launch queue's). On a GPU, the largest batch that fits
is found by catching CUDA's out-of-memory error: the sweep stops at the first
OOM, or, when every batch fits, keeps doubling and then bisects up to
``max_batch``. On CPU the sweep is capped at its largest batch (host memory is
not the constraint the planner models). The sync time is a gloo all-reduce of
a gradient-sized buffer between in-process ranks, i.e. the intra-node
exchange cost of this model, measured at 2 and 4 ranks (``sync_gpus``): the
one-GPU rows carry the 2-rank time in ``sync_time_s``, and one row per scale K
(``gpus`` = K, the largest batch's step time plus the K-rank sync) lets the
planner calibrate its communication model at several scales.

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

import torch

from hetsched.core.throughput import ProfileRow
from hetsched.runtime.emulate import emulation_for
from hetsched.runtime.workloads import Workload, gather, load_workload


@dataclass
class ProbeResult:
    rows: list[ProfileRow]
    max_batch: int
    oom_at: int | None
    elapsed_s: float
    device: str


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def _time_steps(wl: Workload, b: int, dev: torch.device, warmup: int, steps: int,
                gpu_type: str) -> float:
    """Median seconds per training step at local batch ``b``."""
    model = wl.model
    opt = wl.optimizer(model.parameters())
    n = len(wl.dataset)  # type: ignore[arg-type]
    idx = [i % n for i in range(b)]
    x, y = gather(wl.dataset, idx)
    x, y = x.to(dev), y.to(dev)
    emul = emulation_for(gpu_type)
    times: list[float] = []
    for k in range(warmup + steps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        wl.loss_fn(model(x), y).backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if emul is not None:
            emul.pad(b, t0)
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    del opt, x, y
    return statistics.median(times)


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


def probe(workload: str, gpu_type: str, batches: Sequence[int], *, entrypoint: str | None = None,
          warmup: int = 2, steps: int = 5, device: str | None = None,
          time_limit_s: float | None = None, max_batch: int = 4096, sync: bool = True,
          seed: int = 0, sync_gpus: Sequence[int] = (2, 4)) -> ProbeResult:
    """Sweep ``batches`` (see the module docstring); rows in the planner's CSV format."""
    t_start = time.perf_counter()
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    dev = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    if not use_cuda:
        from hetsched.runtime.launcher import cpu_threads

        torch.set_num_threads(cpu_threads())
    sweep = sorted({int(b) for b in batches if int(b) >= 1})
    if not sweep:
        raise ValueError("no local batch sizes to probe")
    size = max(max(sweep), 256)
    wl = load_workload(workload, entrypoint=entrypoint, dataset_size=size, seed=seed)
    wl.model.to(dev)
    measured: dict[int, float] = {}
    oom_at: int | None = None

    def over_time() -> bool:
        return time_limit_s is not None and time.perf_counter() - t_start > time_limit_s

    def attempt(b: int) -> bool:
        nonlocal oom_at
        try:
            measured[b] = _time_steps(wl, b, dev, warmup, steps, gpu_type)
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
    sync_s = None
    by_scale: dict[int, float] = {}
    if sync and measured:
        numel = sum(p.numel() for p in wl.model.parameters())
        for k in sorted({int(k) for k in sync_gpus if int(k) >= 2}):
            v = measure_sync(numel, ranks=k)
            if v is not None:
                by_scale[k] = v
        sync_s = by_scale.get(2)
    # a memory cap only where memory bounded the sweep (an out-of-memory on a GPU): on a CPU,
    # or a GPU that held every batch tried, the largest batch says nothing about memory
    mem_cap = cap if use_cuda and oom_at is not None and measured else None
    rows = [ProfileRow(workload, gpu_type.lower(), b, t, sync_s, mem_cap)
            for b, t in sorted(measured.items()) if math.isfinite(t)]
    if rows:  # one whole-iteration row per measured scale, at the largest batch
        top = rows[-1]
        rows += [ProfileRow(workload, gpu_type.lower(), top.local_batch, top.step_time_s + v, v,
                            mem_cap, gpus=k) for k, v in sorted(by_scale.items())]
    return ProbeResult(rows, cap, oom_at, time.perf_counter() - t_start, str(dev))
