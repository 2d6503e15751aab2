"""Fast task switching (PipeSwitch, Hare section 4): a job's model between host and device.

A :class:`JobSlot` keeps one job's parameters in a flat host buffer (pinned
on CUDA, so copies are DMA and asynchronous) and, while the job is resident,
a device copy with the version (rounds done) it holds. Loading for a task:

* resident and current: nothing moves (the speculative plan kept it);
* otherwise the host buffer (just filled by the parameter server) is copied
  to the device **layer by layer**: on CUDA every layer's copy is enqueued
  on a side stream with an event, and a forward pre-hook makes the compute
  stream wait for *that layer's* event only, so layer k computes while
  layers k+1.. are still in flight; on CPU the same hooks copy each layer
  just before it runs (the same code path, nothing to overlap with).
  A resident but stale copy reuses its device tensors (no allocation).

Early task cleaning: on a task's last iteration a post-accumulate-grad hook
copies each gradient to the host buffer as soon as backward produced it,
zeroes it and frees it (autograd already frees activations as backward
goes). Eviction zeroes the device tensors before freeing them, and
:func:`scrub_free_memory` zeroes every free block the CUDA caching allocator
holds, so the next job's tensors never read this job's data.

A "layer" is a module with parameters of its own; a module of ``OPAQUE``
types (e.g. ``nn.MultiheadAttention``, whose ``out_proj`` weights are read
without calling ``out_proj``) takes its descendants' parameters with it.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from hetsched.runtime.executor.state import flatten_params

OPAQUE: tuple[type[nn.Module], ...] = (nn.MultiheadAttention,)


def _layers(model: nn.Module) -> list[tuple[nn.Module, list[int]]]:
    """(module, indices of the parameters it owns) in registration order."""
    index = {id(p): i for i, p in enumerate(model.parameters())}
    out: list[tuple[nn.Module, list[int]]] = []
    skip: set[int] = set()
    for m in model.modules():
        if id(m) in skip:
            continue
        if isinstance(m, OPAQUE):
            for d in m.modules():
                skip.add(id(d))
            own = [index[id(p)] for p in m.parameters()]
        else:
            own = [index[id(p)] for p in m.parameters(recurse=False)]
        if own:
            out.append((m, own))
    return out


class JobSlot:
    """One job's model on one executor: host buffer, device copy, hooks."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.cuda = device.type == "cuda"
        host, self.names = flatten_params(model)
        self.host = host.pin_memory() if self.cuda else host
        self.grad_host = torch.zeros_like(self.host)
        if self.cuda:
            self.grad_host = self.grad_host.pin_memory()
        self.params = list(model.parameters())
        self.host_views = self._views(self.host)
        self.grad_views = self._views(self.grad_host)
        #: second host buffers (allocated on first use): the executor receives the next
        #: task's parameters into ``spare_host`` while this task computes, and a task's
        #: gradient is pushed from one buffer while the next task collects into the other
        self.spare_host: torch.Tensor | None = None
        self.spare_grad: torch.Tensor | None = None
        self.layers = _layers(model)
        self.dev: list[torch.Tensor | None] = [None] * len(self.params)
        self.version = -1  # version held on the device; -1: not resident
        self.pending: dict[int, Any] = {}  # id(module) -> event (CUDA) or param list (CPU)
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self.collect = False  # last iteration: move gradients out as backward makes them
        for m, _ in self.layers:
            m.register_forward_pre_hook(self._ready)
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(self._make_grad_hook(i))
        for i, p in enumerate(self.params):  # not resident: parameters point at the host
            p.data = self.host_views[i]

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        out, off = [], 0
        for p in self.params:
            k = p.numel()
            out.append(flat[off:off + k].view_as(p))
            off += k
        return out

    def _new_host(self) -> torch.Tensor:
        t = torch.zeros_like(self.host)
        return t.pin_memory() if self.cuda else t

    def receive_buffer(self) -> torch.Tensor:
        """The spare host buffer, for parameters received while the current ones are in use."""
        if self.spare_host is None:
            self.spare_host = self._new_host()
        return self.spare_host

    def adopt_received(self) -> None:
        """The spare buffer (just filled) becomes the host copy; the old one the spare.
        Call between tasks: no copy from the old buffer may still be in flight."""
        assert self.spare_host is not None
        self.host, self.spare_host = self.spare_host, self.host
        self.host_views = self._views(self.host)
        if not self.resident:
            for i, p in enumerate(self.params):
                p.data = self.host_views[i]

    def swap_gradients(self) -> torch.Tensor:
        """The gradient buffer just filled (to push); later tasks collect into the other.
        The caller must not reuse the returned buffer's predecessor before its push ended."""
        if self.spare_grad is None:
            self.spare_grad = self._new_host()
        out = self.grad_host
        self.grad_host, self.spare_grad = self.spare_grad, self.grad_host
        self.grad_views = self._views(self.grad_host)
        return out

    @property
    def nbytes(self) -> int:
        return self.host.numel() * self.host.element_size()

    @property
    def resident(self) -> bool:
        return self.version >= 0

    # -- loading -------------------------------------------------------------
    def load(self, version: int) -> float:
        """Start moving the host buffer (``version``) to the device; returns the seconds
        until the first layer's weights are there (its part of the switch time)."""
        t0 = time.perf_counter()
        fresh = [i for i, d in enumerate(self.dev) if d is None]
        for i in fresh:
            self.dev[i] = torch.empty_like(self.host_views[i], device=self.device)
        if self.cuda:
            assert self.copy_stream is not None
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            for m, idx in self.layers:
                with torch.cuda.stream(self.copy_stream):
                    for i in idx:
                        d = self.dev[i]
                        assert d is not None
                        d.copy_(self.host_views[i], non_blocking=True)
                        d.record_stream(self.copy_stream)  # not reused while in flight
                    ev = torch.cuda.Event()
                    ev.record(self.copy_stream)
                self.pending[id(m)] = ev
        else:
            for m, idx in self.layers:
                self.pending[id(m)] = idx
        for i, p in enumerate(self.params):
            p.data = self.dev[i]  # type: ignore[assignment]
        if self.layers:  # the first layer, eagerly: the moment its first kernel can run
            first = self.layers[0][0]
            self._ready(first, ())
            if self.cuda:
                torch.cuda.current_stream(self.device).synchronize()
        self.version = version
        return time.perf_counter() - t0

    def _ready(self, module: nn.Module, _args: Any) -> None:
        item = self.pending.pop(id(module), None)
        if item is None:
            return
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(item)
        else:
            for i in item:
                d = self.dev[i]
                assert d is not None
                d.copy_(self.host_views[i])

    def ready_all(self) -> None:
        """Every layer ready now (a co-location group steps the optimizer before the
        forward pass: runtime/group.py); on CUDA the compute stream waits, the host not."""
        for m, _ in self.layers:
            self._ready(m, ())

    def save_back(self) -> None:
        """Copy the device copy into the host buffer (the device held the newer values:
        a group's job trains on the device and spills its state here)."""
        for i, d in enumerate(self.dev):
            if d is not None:
                self.host_views[i].copy_(d, non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def check_loaded(self) -> None:
        """After the first forward: every layer must have been made ready by its hook."""
        if self.pending:
            names = {id(m): n for n, m in self.model.named_modules()}
            left = [names.get(k, "?") for k in self.pending]
            raise RuntimeError(f"layers {left[:3]} were not called through their forward; "
                               "their weights were never loaded (add their type to OPAQUE)")

    # -- gradients -----------------------------------------------------------
    def _make_grad_hook(self, i: int) -> Any:
        def hook(p: torch.Tensor) -> None:
            if not self.collect or p.grad is None:
                return
            g = p.grad
            if self.cuda:
                assert self.copy_stream is not None
                self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(self.copy_stream):
                    self.grad_views[i].copy_(g, non_blocking=True)
                    g.zero_()
                g.record_stream(self.copy_stream)
            else:
                self.grad_views[i].copy_(g)
                g.zero_()
            p.grad = None
        return hook

    def finish_gradients(self) -> None:
        """Wait for the last gradient copies; parameters without a gradient send zeros."""
        for i, p in enumerate(self.params):
            if p.grad is not None:  # not reached by backward's hook (unused parameter)
                self.grad_views[i].copy_(p.grad)
                p.grad.zero_()
                p.grad = None
        if self.cuda:
            assert self.copy_stream is not None
            self.copy_stream.synchronize()

    # -- eviction ------------------------------------------------------------
    def evict(self) -> None:
        """Zero and free the device copy; parameters point at the host buffer again."""
        for i, d in enumerate(self.dev):
            if d is not None:
                d.zero_()
            self.dev[i] = None
        for i, p in enumerate(self.params):
            p.data = self.host_views[i]
        self.pending.clear()
        self.version = -1


def scrub_free_memory(device: torch.device) -> int:
    """Zero every free block the CUDA caching allocator holds; returns the bytes zeroed.

    Freed activations of the last task sit in those blocks; the next job's
    allocations would be carved from them. On CPU freed memory goes back to
    the C allocator, out of reach: this returns 0 there (the tensors the
    executor owns are zeroed by :meth:`JobSlot.evict`).
    """
    if device.type != "cuda":
        return 0
    # No synchronisation: the zeroing kernels run on the compute stream, so they finish
    # before any kernel of the next task there, and the next load's copy stream waits for
    # that stream first; the host goes on (pulling the next parameters) meanwhile.
    total = 0
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", device.index) != (device.index or 0):
            continue
        addr = int(seg["address"])
        for blk in seg.get("blocks", []):
            size = int(blk["size"])
            if blk.get("state") == "inactive" and size:
                _raw_view(addr, size, device).zero_()
                total += size
            addr += size
    return total


class _Raw:
    def __init__(self, ptr: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3}


def _raw_view(ptr: int, size: int, device: torch.device) -> torch.Tensor:
    """A non-owning uint8 view of device memory (used only to zero free blocks)."""
    return torch.as_tensor(_Raw(ptr, size), device=device)
