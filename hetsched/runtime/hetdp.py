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

    def sync_gradients(self, stop: bool = False) -> tuple[float, bool]:
        """All-reduce the gradients (sum, or mean when ``average``).

        Returns the seconds spent and whether *any* rank asked to stop. The stop
        request rides in one extra element of the same all-reduce, so every rank
        learns it at the same step and they all stop after it together (a rank
        stopping on its own would leave the others blocked in the next
        collective, and rank 0 could not checkpoint a consistent step).
        """
        if self.world == 1:
            return 0.0, stop
        t0 = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flag = torch.ones(1, dtype=grads[0].dtype, device=grads[0].device) if stop else \
            torch.zeros(1, dtype=grads[0].dtype, device=grads[0].device)
        flat = torch.cat([g.reshape(-1) for g in grads] + [flag])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        stop_any = bool(flat[-1].item() > 0)
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
        if flat.is_cuda:
            torch.cuda.synchronize(flat.device)
        return time.perf_counter() - t0, stop_any

    def gradient_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)
