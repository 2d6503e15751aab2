"""Heterogeneous data parallelism: ranks with different local batches, one exact global step.

Rank k computes the *mean* loss over its ``b_k`` samples. Plain DDP averages
the ranks' gradients, i.e. gives every rank weight ``1/K``: with uneven local
batches the samples of a small rank count more than those of a large one, so
the step is biased. Here rank k back-propagates ``loss_k * b_k / B`` (``B`` is
the step's global sample count) and the gradients are **summed** across
ranks, which is exactly the gradient of the mean loss over the whole global
batch: one step equals one single-process step on all B samples (up to
floating-point summation order). A rank with no samples in a step (the last,
partial batch of an epoch) contributes zeros.

The all-reduce runs on one flat buffer (one collective per step, not one per
tensor) and its time is measured separately from the computation so the
profiler can learn both.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class HeteroDataParallel:
    """Wraps a model for share-weighted gradient all-reduce.

    ``average=True`` gives plain DDP averaging instead (the biased baseline,
    kept for the equivalence test and the docs).
    """

    def __init__(self, model: nn.Module, *, average: bool = False, broadcast: bool = True
                 ) -> None:
        self.model = model
        self.average = average
        self.world = _world()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.rescale_seq = 0
        self.local_sq: list[float] | None = None
        self.global_sq: float | None = None
        #: an emulated slow link (runtime/emulate.py, testbed only): the COMM part's floor
        self.link: Any = None
        if broadcast and self.world > 1:
            # identical start on every rank, whatever each rank's seed did
            with torch.no_grad():
                for t in list(model.parameters()) + list(model.buffers()):
                    dist.broadcast(t.data, src=0)

    def loss_scale(self, local_n: int, global_n: int) -> float:
        """What this rank multiplies its mean loss by before backward."""
        if self.average:
            return 1.0
        return local_n / global_n if global_n else 0.0

    def backward(self, loss: torch.Tensor, local_n: int, global_n: int) -> None:
        (loss * self.loss_scale(local_n, global_n)).backward()

    def sync_gradients(self, stop: bool = False, *, counts: list[int] | None = None,
                       rescale_seq: int = 0) -> tuple[float, bool]:
        """All-reduce the gradients (sum, or mean when ``average``).

        Returns the seconds spent and whether *any* rank asked to stop. The stop
        request rides in one extra element of the same all-reduce, so every rank
        learns it at the same step and they all stop after it together (a rank
        stopping on its own would leave the others blocked in the next
        collective, and rank 0 could not checkpoint a consistent step).
        Two more kinds of slots ride along (runtime/elastic.py): rank 0's
        pending rescale request number (``self.rescale_seq`` afterwards), and,
        given every rank's sample ``counts`` for the step, each rank's
        squared local-gradient norm in its own slot (``self.local_sq``, with
        the global one in ``self.global_sq``) for the gradient noise scale.
        """
        self.rescale_seq, self.local_sq, self.global_sq = rescale_seq, None, None
        if self.world == 1:
            return 0.0, stop
        t0 = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        dt, dv = grads[0].dtype, grads[0].device
        gns = counts is not None and not self.average
        # the control slots are built on the host and copied once; the squared norm is
        # computed on the device: nothing here waits for the GPU before the all-reduce
        head = [1.0 if stop else 0.0, float(rescale_seq)] + [0.0] * (self.world if gns else 0)
        extra = torch.tensor(head, dtype=dt).to(dv, non_blocking=True)
        if gns and counts is not None:
            rank = dist.get_rank()
            n, mine = sum(counts), counts[rank]
            if mine > 0:  # this rank's gradient is its mean-loss gradient times mine/n
                sq = torch.stack([g.pow(2).sum() for g in grads]).sum()
                extra[2 + rank] = sq * (n / mine) ** 2
        n_grad = sum(g.numel() for g in grads)
        # the extra slots travel in the gradients' dtype (one buffer, one collective)
        flat = torch.cat([g.reshape(-1) for g in grads] + [extra])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        if self.link is not None:
            self.link.pad(flat.numel() * flat.element_size(), t0)
        # one read of the control slots (every rank must agree on stop and rescale now)
        tail = flat[n_grad:]
        if gns and counts is not None:
            tail = torch.cat([tail, flat[:n_grad].pow(2).sum().reshape(1)])
        host = tail.double().cpu()
        stop_any = bool(host[0].item() > 0)
        self.rescale_seq = int(round(float(host[1])))
        if gns and counts is not None:
            self.local_sq = [float(v) for v in host[2:-1]]
            self.global_sq = float(host[-1])
        if self.average:
            flat /= self.world
        off = 0
        for p, g in zip(self.params, grads, strict=True):
            n = g.numel()
            view = flat[off:off + n].view_as(g)
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)
            off += n
        return time.perf_counter() - t0, stop_any

    def gradient_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)

    # -- a co-location group's COMM (runtime/group.py): pack, all-reduce elsewhere, unpack
    def pack(self, stop: bool = False) -> torch.Tensor:
        """The gradients and a stop flag in one flat buffer (summed by the all-reduce)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        dt, dv = grads[0].dtype, grads[0].device
        extra = torch.tensor([1.0 if stop else 0.0], dtype=dt, device=dv)
        return torch.cat([g.reshape(-1) for g in grads] + [extra])

    def unpack(self, flat: torch.Tensor) -> bool:
        """Reduced gradients from ``flat`` into ``.grad``; whether any rank asked to stop."""
        if self.average and self.world > 1:
            flat = flat / self.world
        off = 0
        for p in self.params:
            n = p.numel()
            view = flat[off:off + n].view_as(p).to(p.device, non_blocking=True)
            if p.grad is None or p.grad.device != p.device:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)
            off += n
        return bool(float(flat[off]) > 0)
