"""A pool task's iteration: which samples it trains, and the step it runs.

:func:`task_indices` names the samples of task ``t``'s iteration ``k`` in round ``r``
(the job's epoch order, the round's own slices: equal or uneven); :func:`iteration`
is the one step every task iteration runs (gather, copy, forward, scaled backward;
no optimizer step: the coordinator applies one per round); :func:`iteration_time`
times it as the executor holds the model, which is what a pool task costs.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
import torch

from hetsched.runtime.executor.plan import ExecJob
from hetsched.runtime.executor.slots import JobSlot
from hetsched.runtime.sampler import split_counts


@functools.lru_cache(maxsize=8)
def _permutation(seed: int, epoch: int, size: int) -> np.ndarray:
    """An epoch's sample order (cached: a task reads it once per iteration)."""
    perm = np.random.default_rng([seed, epoch]).permutation(size)
    perm.setflags(write=False)
    return perm


def task_indices(job: ExecJob, seed: int, rnd: int, task: int, k: int) -> np.ndarray:
    """Sample indices of task ``task``'s iteration ``k`` in round ``rnd``."""
    step = job.round_step(rnd) + k
    epoch = step // job.steps_per_epoch()
    off, n = job.step_samples(step)
    perm = _permutation(seed, epoch, job.dataset_size)
    counts = split_counts(n, job.slices(rnd))
    lo = off + sum(counts[:task])
    return perm[lo:lo + counts[task]].copy()  # the cached order stays read-only


def pass_indices(job: ExecJob, seed: int, rnd: int, task: int, steps: range) -> np.ndarray:
    """Sample indices of one pass of task ``task`` in round ``rnd``: its slices of
    ``steps`` (consecutive steps of the round, :meth:`ExecJob.passes`), in order."""
    return np.concatenate([task_indices(job, seed, rnd, task, k) for k in steps])


def iteration(model: Any, loss_fn: Any, data: Any, idx: np.ndarray, dev: torch.device,
              scale: float) -> None:
    """One iteration of a pool task: gather the slice, copy it to the device, forward, and
    the backward of the loss scaled by the slice's share, accumulating into the gradients.
    No optimizer step: the coordinator applies one per round."""
    from hetsched.runtime.workloads import gather

    x, y = gather(data, idx)
    x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    (loss_fn(model(x), y) * scale).backward()


def iteration_time(workload: str, local_batch: int, device: torch.device | str = "cpu", *,
                   steps: int = 20, warmup: int = 3, seed: int = 0,
                   entrypoint: str | None = None) -> float:
    """Median seconds of one pool-task iteration (:func:`iteration`, the executor's own,
    on a :class:`JobSlot` as the executor holds it) of ``local_batch`` samples: the step a
    pool job's task runs, which has no optimizer step, where the probe's step (a job of
    its own) has one."""
    from hetsched.runtime.workloads import load_workload

    dev = torch.device(device)
    size = max(local_batch * 4, 64)
    wl = load_workload(workload, entrypoint=entrypoint, dataset_size=size, seed=seed)
    slot = JobSlot(wl.model.to(torch.float32), dev)
    slot.load(0)
    slot.model.train()
    rng = np.random.default_rng(seed)
    times = []
    for k in range(warmup + steps):
        idx = rng.permutation(size)[:local_batch]
        t0 = time.perf_counter()
        iteration(slot.model, wl.loss_fn, wl.dataset, idx, dev, 1.0 / local_batch)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if k >= warmup:
            times.append(time.perf_counter() - t0)
        if k == 0:
            slot.check_loaded()
    slot.evict()
    return float(np.median(times))
