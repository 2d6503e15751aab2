"""One training step of a rank: what ``hetsched run`` executes and what the probe times.

:class:`TrainStep` is the whole step of a rank, in the order the job runs it:
zero the gradients, take the step's batch from the :class:`Feeder` (the
sampler's indices gathered, on the device), start feeding the next step's
batch, forward, the share-weighted backward (``hetdp``), the gradient
all-reduce with the stop/rescale/noise-scale slots, the optimizer step, the
emulated floor of everything but the all-reduce (testbed only), and the step's
bookkeeping (the loss kept on the
device). The trainer calls it for every step of a job; the probe calls the
same object for its warm-up and timed steps, so a profile row times exactly
the step the job runs (``tests/runtime/test_step.py`` counts the calls).

Nothing here synchronises with the GPU unless the step needs the value: the
loss stays on the device (read at a report or an epoch's end), and per-phase
times are CUDA events read when a caller closes a timing window
(:meth:`StepClock.flush`). Only a job of several ranks reads the all-reduce's
control slots (stop, rescale) every step, which it needs to agree on them.

The data path (:class:`Feeder`): a built-in ``TensorDataset`` that fits lives
on the GPU and is indexed there (no host gather, no copy); otherwise batches
are gathered into pinned host buffers allocated once (two, used in turn) and
copied on a side stream while the previous step computes. On CPU the batch is
gathered by indexing the dataset's tensors.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from hetsched.runtime.workloads import gather

#: steps a run treats as warm-up (its steady state starts after them) and the
#: probe's default warm-up: the same count on both sides
WARMUP_STEPS = 2
#: a TensorDataset lives on the GPU when it takes at most this share of free memory
DEVICE_DATA_SHARE = 0.1


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class _Staged:
    """One prefetched batch: its indices, device tensors and the copy's event."""

    def __init__(self, key: bytes, x: torch.Tensor, y: torch.Tensor, event: Any) -> None:
        self.key, self.x, self.y, self.event = key, x, y, event


class Feeder:
    """The step's batch on the device (see the module docstring)."""

    def __init__(self, dataset: Dataset[Any], dev: torch.device) -> None:
        self.dataset, self.dev = dataset, dev
        self.cuda = dev.type == "cuda"
        self.tensors: list[torch.Tensor] | None = None
        self.on_device = False
        self.gathers = 0  # batches gathered (tests count them)
        if isinstance(dataset, TensorDataset):
            ts = list(dataset.tensors[:2])
            if self.cuda:
                need = sum(t.numel() * t.element_size() for t in ts)
                free, _ = torch.cuda.mem_get_info(dev)
                if need <= DEVICE_DATA_SHARE * free:
                    ts = [t.to(dev) for t in ts]
                    self.on_device = True
            self.tensors = ts
        self.stream = torch.cuda.Stream(dev) if self.cuda and not self.on_device else None
        self._host: list[list[torch.Tensor]] = [[], []]  # pinned, per buffer: x, y
        self._events: list[Any] = [None, None]
        self._turn = 0
        self._staged: _Staged | None = None

    @staticmethod
    def _key(idx: Any) -> bytes:
        return np.asarray(idx, dtype=np.int64).tobytes()

    def get(self, idx: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's batch (the prefetched one when it is for ``idx``)."""
        self.gathers += 1
        if self.tensors is None:  # a generic Dataset: collate on the host, then copy
            x, y = gather(self.dataset, idx)
            return x.to(self.dev, non_blocking=True), y.to(self.dev, non_blocking=True)
        if self.on_device:
            # non_blocking from pageable memory: staged at once, no wait for the stream's
            # queued kernels (a blocking copy would synchronise every step)
            i = torch.from_numpy(np.asarray(idx, dtype=np.int64)).to(self.dev,
                                                                     non_blocking=True)
            return self.tensors[0].index_select(0, i), self.tensors[1].index_select(0, i)
        if not self.cuda:
            i = torch.as_tensor(np.asarray(idx, dtype=np.int64))
            return self.tensors[0].index_select(0, i), self.tensors[1].index_select(0, i)
        st = self._staged
        self._staged = None
        if st is None or st.key != self._key(idx):
            st = self._stage(idx)
        cur = torch.cuda.current_stream(self.dev)
        cur.wait_event(st.event)
        st.x.record_stream(cur)  # not reused before this step's kernels are done
        st.y.record_stream(cur)
        return st.x, st.y

    def prefetch(self, idx: Any) -> None:
        """Start moving the next step's batch (CUDA, host-resident data only)."""
        if self.stream is not None and self.tensors is not None and len(idx):
            self._staged = self._stage(idx)

    def _stage(self, idx: Any) -> _Staged:
        assert self.tensors is not None and self.stream is not None
        k = self._turn
        self._turn ^= 1
        if self._events[k] is not None:
            self._events[k].synchronize()  # this pinned buffer's last copy is done
        i = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        n = len(i)
        host = self._host[k]
        if not host or host[0].shape[0] < n:  # allocated once per size seen (grows only)
            host[:] = [torch.empty((n, *t.shape[1:]), dtype=t.dtype).pin_memory()
                       for t in self.tensors]
        for t, h in zip(self.tensors, host, strict=True):
            torch.index_select(t, 0, i, out=h[:n])
        with torch.cuda.stream(self.stream):
            x = host[0][:n].to(self.dev, non_blocking=True)
            y = host[1][:n].to(self.dev, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        self._events[k] = ev
        return _Staged(self._key(idx), x, y, ev)


class StepClock:
    """Per-phase times of steps: host clock on CPU, CUDA events on a GPU (read at flush).

    A step's marks: its start, the end of forward/backward, the end of the gradient
    all-reduce, the end of the optimizer step, and its end (after the testbed's emulated
    floor). :meth:`flush` sums the compute and sync phases, and keeps the optimizer's share
    of the same steps in :attr:`optimizer_s` (what a step costs beyond a pool task's
    iteration, which has no optimizer step: ``hetsched.runtime.probe`` reports it).
    """

    def __init__(self, dev: torch.device) -> None:
        self.cuda = dev.type == "cuda"
        self.dev = dev
        self._marks: list[list[Any]] = []
        self._shares: list[float | None] = []
        #: the optimizer's share, summed over the steps of the last :meth:`flush`
        self.optimizer_s = 0.0

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.dev))
            return ev
        return time.perf_counter()

    def add(self, marks: list[Any], optimizer_share: float | None = None) -> None:
        """One step's five marks; ``optimizer_share``: the optimizer's share when the marks
        do not tell it (under an emulated floor, see :meth:`TrainStep.__call__`)."""
        self._marks.append(marks)
        self._shares.append(optimizer_share)

    def flush(self) -> tuple[float, float]:
        """(compute, sync) seconds summed over the steps since the last flush."""
        if self.cuda and self._marks:
            self._marks[-1][-1].synchronize()
        comp = sync = opt = 0.0
        for (m0, m1, m2, m3, m4), share in zip(self._marks, self._shares, strict=True):
            if self.cuda:
                comp += (m0.elapsed_time(m1) + m2.elapsed_time(m4)) / 1e3
                sync += m1.elapsed_time(m2) / 1e3
                o = m2.elapsed_time(m3) / 1e3
            else:
                comp += (m1 - m0) + (m4 - m2)
                sync += m2 - m1
                o = m3 - m2
            opt += o if share is None else share
        self._marks.clear()
        self._shares.clear()
        self.optimizer_s = opt
        return comp, sync


class TrainStep:
    """One rank's training step (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Any,
                 feeder: Feeder, hdp: Any, dev: torch.device, emulation: Any = None,
                 noise: Any = None) -> None:
        self.model, self.opt, self.loss_fn = model, optimizer, loss_fn
        self.feeder, self.hdp, self.dev = feeder, hdp, dev
        self.emulation, self.noise = emulation, noise
        self.clock = StepClock(dev)
        self.calls = 0
        self.first_loss: torch.Tensor | None = None
        self.last_loss: torch.Tensor | None = None

    def __call__(self, idx: Any, n_global: int, *, counts: Sequence[int] | None = None,
                 stop: bool = False, rescale_seq: int = 0, next_idx: Any = None) -> bool:
        """Run the step on this rank's ``idx`` of a global step of ``n_global`` samples;
        ``next_idx`` (the sampler's next indices) starts feeding the next step. Returns
        whether any rank asked to stop (the all-reduce's stop slot)."""
        self.calls += 1
        t0 = time.perf_counter()
        m0 = self.clock.mark()
        self.opt.zero_grad(set_to_none=False)
        if len(idx):
            x, y = self.feeder.get(idx)
            if next_idx is not None:
                self.feeder.prefetch(next_idx)
            loss = self.loss_fn(self.model(x), y)
            self.hdp.backward(loss, len(idx), n_global)
            lv = loss.detach()
            if self.first_loss is None:
                self.first_loss = lv
            self.last_loss = lv
        elif next_idx is not None:
            self.feeder.prefetch(next_idx)
        m1 = self.clock.mark()
        s0 = time.perf_counter()
        _, stopped = self.hdp.sync_gradients(stop=stop, counts=list(counts) if counts else None,
                                             rescale_seq=rescale_seq)
        if self.noise is not None and counts and self.hdp.local_sq is not None \
                and self.hdp.global_sq is not None:
            self.noise.update(self.hdp.local_sq, list(counts), self.hdp.global_sq)
        s1 = time.perf_counter()
        m2 = self.clock.mark()
        self.opt.step()
        m3 = self.clock.mark()
        share: float | None = None
        if self.emulation is not None:  # testbed: the compute (all but the sync) has a floor
            _sync(self.dev)
            o1 = time.perf_counter()
            # the optimizer's share of a floored step: what the step takes beyond the same
            # step without it (forward/backward alone, floored alike)
            floor = self.emulation.step_time(len(idx))
            fb, opt = s0 - t0, o1 - s1
            share = max(fb + opt, floor) - max(fb, floor)
            self.emulation.pad(len(idx), t0 + (s1 - s0))
        self.clock.add([m0, m1, m2, m3, self.clock.mark()], share)
        return stopped

    def losses(self) -> tuple[float | None, float | None]:
        """(first, last) loss of the steps run so far (reads the device: call sparingly)."""
        f = float(self.first_loss) if self.first_loss is not None else None
        la = float(self.last_loss) if self.last_loss is not None else None
        return f, la


def build_step(wl: Any, dev: torch.device, *, average: bool = False, emulation: Any = None,
               noise: Any = None, model: torch.nn.Module | None = None,
               optimizer: torch.optim.Optimizer | None = None, feeder: Feeder | None = None
               ) -> TrainStep:
    """The step of workload ``wl`` on ``dev`` (the trainer passes its model and
    optimizer after restoring a checkpoint; the probe lets them be built here)."""
    from hetsched.runtime.hetdp import HeteroDataParallel

    model = model if model is not None else wl.model.to(dev)
    opt = optimizer if optimizer is not None else wl.optimizer(model.parameters())
    hdp = HeteroDataParallel(model, average=average)
    feeder = feeder if feeder is not None else Feeder(wl.dataset, dev)
    return TrainStep(model, opt, wl.loss_fn, feeder, hdp, dev, emulation, noise)


def sync_device(dev: torch.device) -> None:
    """Wait for the device (a timing window's boundary)."""
    _sync(dev)


def process_age() -> float | None:
    """Seconds since this process started (Linux ``/proc``; None elsewhere)."""
    import os

    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
