"""One job of a co-location group on one GPU: its model, optimizer, data, residency.

``runtime.group`` runs several of these on the same GPU. Each keeps its
parameters in a ``JobSlot`` (executor/slots.py: a flat host buffer, pinned on
CUDA, and a device copy loaded layer by layer); the optimizer state moves with
them. Dynamic reloading (Harmony §IV-C): when the group's jobs do not fit the
memory budget together, an idle job (its COMM in flight, its next COMP later)
is spilled to host memory — device copy saved back, optimizer state copied
out, device tensors zeroed and freed — and reloaded before its next COMP.
Input data already is: each COMP gathers its batch on the host and moves it.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from hetsched.io.reports import ReportWriter
from hetsched.runtime.checkpoint import load_checkpoint, restore, save_checkpoint
from hetsched.runtime.elastic import set_lr, steps_left
from hetsched.runtime.executor.slots import JobSlot
from hetsched.runtime.hetdp import HeteroDataParallel
from hetsched.runtime.sampler import ShareSampler
from hetsched.runtime.workloads import gather, load_workload


class Member:
    """A group job's state on this rank (``cfg`` is its ``trainer.TrainConfig``)."""

    def __init__(self, cfg: Any, rank: int, dev: torch.device, pg: Any,
                 reporter: ReportWriter) -> None:
        self.cfg, self.rank, self.dev, self.pg, self.rep = cfg, rank, dev, pg, reporter
        self.cuda = dev.type == "cuda"
        wl = load_workload(cfg.workload, entrypoint=cfg.entrypoint,
                           dataset_size=cfg.dataset_size, seed=cfg.seed, workdir=cfg.workdir)
        self.wl = wl
        self.model = wl.model
        self.opt = wl.optimizer(self.model.parameters())
        self.sampler = ShareSampler(cfg.dataset_size, cfg.local_batches, rank, seed=cfg.seed)
        self.step = 0
        state = load_checkpoint(cfg.checkpoint) if cfg.checkpoint else None
        if state is not None:
            restore(state, model=self.model, optimizer=self.opt)
            self.sampler.load_state_dict(state["sampler"])
            self.step = int(state["step"])
        if cfg.lr_scaling != "none":  # an elastic job's segment batch, as trainer.py does
            set_lr(self.opt, cfg.lr_scaling, sum(cfg.local_batches),
                   cfg.base_batch or sum(cfg.local_batches))
        # rank 0's start: gloo broadcasts the host tensors now; NCCL needs them on the GPU
        # (broadcast at the end, after the first load)
        self.hdp = HeteroDataParallel(self.model, average=cfg.average,
                                      broadcast=not self.cuda)
        self.slot = JobSlot(self.model, dev)  # parameters now in the host buffer
        self.opt_host: dict[tuple[int, str], torch.Tensor] = {}
        self.total = self.step + steps_left(cfg.dataset_size, sum(cfg.local_batches),
                                            self.sampler.state.epoch,
                                            self.sampler.state.offset, cfg.epochs)
        self.future: Any = None  # this job's COMM in flight: -> (flat, comm_s)
        self.done = False
        self.stopped = False
        self.done_here = 0
        self.last_used = 0.0
        self.spills = self.reloads = 0
        self.losses: list[float] = []
        self.trace: list[tuple[int, list[int]]] = []
        self.acc = {"n": 0, "compute": 0.0, "sync": 0.0, "step": 0.0, "samples": 0,
                    "reload": 0.0}
        self.comp_s = 0.0  # the COMP part of the step in progress (optimizer step + compute)
        self.last_end: float | None = None
        self.epoch_t0 = time.perf_counter()
        self.epoch_steps = 0
        if self.cuda and self.hdp.world > 1:  # rank 0's start, on the GPU (NCCL)
            import torch.distributed as dist

            self.load()
            with torch.no_grad():
                for p in self.slot.params:
                    dist.broadcast(p.data, src=0)

    # -- residency -------------------------------------------------------------
    def footprint(self) -> int:
        """Bytes on the device while resident: parameters, gradients, optimizer state."""
        opt = sum(t.numel() * t.element_size() for st in self.opt.state.values()
                  for t in st.values() if torch.is_tensor(t) and t.dim() > 0)
        return 2 * self.slot.nbytes + opt

    @property
    def resident(self) -> bool:
        return self.slot.resident

    def load(self) -> None:
        """Parameters and optimizer state onto the device (nothing if already there)."""
        if self.slot.resident:
            return
        if self.spills:
            self.reloads += 1
        self.slot.load(self.step)
        self.slot.ready_all()  # the optimizer steps before the forward pass
        for (pid, key), host in self.opt_host.items():
            p = self._param(pid)
            self.opt.state[p][key] = host.to(self.dev, non_blocking=True) if self.cuda \
                else host.clone()
        if self.cuda:  # a restored optimizer state was loaded beside host parameters
            for st in self.opt.state.values():
                for key, t in st.items():
                    if torch.is_tensor(t) and t.dim() > 0 and t.device != self.dev:
                        st[key] = t.to(self.dev, non_blocking=True)
        if self.slot.cuda:
            torch.cuda.current_stream(self.dev).synchronize()

    def spill(self) -> None:
        """Save the device state to host memory and free the device copy."""
        if not self.slot.resident:
            return
        self.spills += 1
        self.slot.save_back()
        for pid, p in enumerate(self.slot.params):
            for key, t in self.opt.state.get(p, {}).items():
                if not torch.is_tensor(t) or t.dim() == 0:
                    continue
                host = self.opt_host.get((pid, key))
                if host is None:
                    host = torch.empty(t.shape, dtype=t.dtype, device="cpu",
                                       pin_memory=self.cuda)
                    self.opt_host[(pid, key)] = host
                host.copy_(t)
                t.zero_()
                self.opt.state[p][key] = host
            p.grad = None
        self.slot.evict()

    def _param(self, pid: int) -> torch.Tensor:
        return self.slot.params[pid]

    # -- subtasks ----------------------------------------------------------------
    def compute(self, stop: bool, emul: Any, trace: bool) -> torch.Tensor:
        """COMP: forward and backward on this rank's share; the packed gradients."""
        epoch = self.sampler.state.epoch
        idx, n_global = self.sampler.next()
        if trace:
            self.trace.append((epoch, [int(i) for i in idx]))
        t0 = time.perf_counter()
        for p in self.slot.params:
            p.grad = None
        if len(idx):
            x, y = gather(self.wl.dataset, idx)
            out = self.model(x.to(self.dev, non_blocking=True))
            loss = self.wl.loss_fn(out, y.to(self.dev, non_blocking=True))
            self.hdp.backward(loss, len(idx), n_global)
            self.losses.append(float(loss.detach()))
        if self.cuda:
            torch.cuda.synchronize(self.dev)
        if emul is not None:
            emul.pad(len(idx), t0)
        self.acc["samples"] += len(idx)
        flat = self.hdp.pack(stop)
        for p in self.slot.params:
            p.grad = None  # the gradients travel in ``flat``
        return flat

    def apply(self, flat: torch.Tensor) -> bool:
        """After the COMM: the reduced gradients, one optimizer step; whether to stop."""
        stop_any = self.hdp.unpack(flat)
        self.opt.step()
        for p in self.slot.params:
            p.grad = None
        if self.cuda:
            torch.cuda.synchronize(self.dev)
        self.step += 1
        self.done_here += 1
        self.epoch_steps += 1
        return stop_any

    # -- records -----------------------------------------------------------------
    def finish_step(self, comm_s: float, now: float) -> None:
        """Account one finished step (its COMP seconds are in ``comp_s``)."""
        a = self.acc
        a["n"] += 1
        a["compute"] += self.comp_s
        a["sync"] += comm_s
        a["step"] += (now - self.last_end) if self.last_end is not None else \
            self.comp_s + comm_s
        self.last_end = now
        self.comp_s = 0.0
        if a["n"] >= self.cfg.report_every or self.step >= self.total:
            self.report_steps()
        if self.sampler.state.offset == 0 and self.rank == 0:  # an epoch just ended
            el = time.perf_counter() - self.epoch_t0
            self.rep.write("epoch", epoch=self.sampler.state.epoch - 1, time_s=round(el, 6),
                           steps=self.epoch_steps, local_batches=self.cfg.local_batches,
                           samples_per_s=round(self.cfg.dataset_size / el, 3),
                           dataset_size=self.cfg.dataset_size,
                           loss=self.losses[-1] if self.losses else None,
                           first_loss=self.losses[0] if self.losses else None)
        if self.sampler.state.offset == 0:
            self.epoch_t0, self.epoch_steps = time.perf_counter(), 0
        if self.rank == 0 and self.cfg.checkpoint and (
                self.step % self.cfg.checkpoint_every == 0 or self.step >= self.total):
            self.checkpoint()

    def report_steps(self) -> None:
        a = self.acc
        n = a["n"]
        if not n:
            return
        self.rep.write("steps", step=self.step, n=n,
                       local_batch=self.cfg.local_batches[self.rank],
                       compute_s=round(a["compute"] / n, 6), sync_s=round(a["sync"] / n, 6),
                       step_s=round(a["step"] / n, 6), global_batch=sum(self.cfg.local_batches),
                       samples_per_s=round(a["samples"] / a["step"], 3) if a["step"] else None,
                       reload_s=round(a["reload"] / n, 6), spills=self.spills,
                       reloads=self.reloads)
        a.update(n=0, compute=0.0, sync=0.0, step=0.0, samples=0, reload=0.0)

    def checkpoint(self) -> None:
        save_checkpoint(self.cfg.checkpoint, model=self.model, optimizer=self.opt,
                        sampler=self.sampler.state_dict(), step=self.step,
                        extra={"local_batches": list(self.cfg.local_batches)})

    def params_cpu(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
