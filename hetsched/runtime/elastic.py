"""Elastic batch size at run time: rescale in place, and the gradient noise scale.

A replan that changes a running job's global batch but keeps its GPUs writes
a *rescale request* (:func:`write_request`): a small JSON file
``{"seq": n, "local_batches": [...]}`` next to the job's checkpoint. Rank 0
polls it (one ``os.stat`` per step); a new ``seq`` rides in one slot of the
step's gradient all-reduce, so every rank learns it at the same step; rank 0
then broadcasts the request and every rank, at that step boundary and
without restarting:

* gives the sampler the new shares (its position is kept in samples, so no
  sample is dropped or repeated: :class:`~hetsched.runtime.sampler.ShareSampler`),
* rescales the learning rate by the job's rule relative to the user's batch
  (``linear``/``sqrt``/``none``, :class:`hetsched.core.spec.Elastic`),
* records a ``rescale`` report (old/new batches, pause in seconds).

A request for a different number of ranks cannot be applied in place: the
ranks checkpoint and stop (reason ``rescale``), and the job is resubmitted on
its new GPUs (checkpoint-restart), as for any other move.
Torch is imported lazily (the request helpers are used by the planner side).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetsched.core.efficiency import GNSTracker, gns_from_norms
from hetsched.io.files import atomic_write


def request_path(checkpoint: str | Path) -> Path:
    """Where the rescale request of the job checkpointing to ``checkpoint`` lives."""
    return Path(str(checkpoint) + ".rescale.json")


def write_request(path: str | Path, local_batches: list[int], seq: int | None = None) -> int:
    """Atomically write a rescale request; returns its sequence number (last + 1 by default)."""
    p = Path(path)
    if any(int(b) < 1 for b in local_batches) or not local_batches:
        raise ValueError(f"every rank needs a local batch >= 1, got {local_batches}")
    if seq is None:
        old = read_request(p)
        seq = (old.seq if old else 0) + 1
    text = json.dumps({"seq": seq, "local_batches": [int(b) for b in local_batches]})
    atomic_write(p, text)  # 0600 in a 0700 folder, like the checkpoint beside it
    return seq


@dataclass(frozen=True)
class Request:
    seq: int
    local_batches: list[int]


def read_request(path: str | Path) -> Request | None:
    try:
        d = json.loads(Path(path).read_text())
        return Request(int(d["seq"]), [int(b) for b in d["local_batches"]])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class RequestWatcher:
    """Rank 0's cheap poll: the request's seq when the file changed since the last look."""

    def __init__(self, path: str | Path | None, applied_seq: int = 0) -> None:
        self.path = Path(path) if path else None
        self.applied = applied_seq
        self._mtime = -1.0

    def pending_seq(self) -> int:
        """A seq newer than the applied one, else 0."""
        if self.path is None:
            return 0
        try:
            m = self.path.stat().st_mtime_ns
        except OSError:
            return 0
        if m == self._mtime:
            return 0
        req = read_request(self.path)
        if req is None:
            return 0
        self._mtime = m
        return req.seq if req.seq > self.applied else 0


def lr_factor(rule: str, batch: int, base_batch: int) -> float:
    r = batch / base_batch
    return r if rule == "linear" else r ** 0.5 if rule == "sqrt" else 1.0


def set_lr(optimizer: Any, rule: str, batch: int, base_batch: int) -> None:
    """Learning rate of every group = its value at the user's batch times the rule's factor."""
    f = lr_factor(rule, batch, base_batch)
    for g in optimizer.param_groups:
        g.setdefault("hetsched_base_lr", g["lr"])
        g["lr"] = g["hetsched_base_lr"] * f


#: the most ranks a rescale request may name (core.limits.MAX_TOTAL_GPUS)
MAX_REQUEST_RANKS = 100_000


def encode_request(req: Request | None) -> list[int]:
    """A request as integers ``[seq, n, b_1 .. b_n]`` (``[-1, 0]``: none): what crosses
    between ranks, never a pickled object."""
    if req is None:
        return [-1, 0]
    return [int(req.seq), len(req.local_batches), *(int(b) for b in req.local_batches)]


def decode_request(vals: list[int]) -> Request | None:
    if len(vals) < 2 or vals[0] < 0:
        return None
    n = vals[1]
    if not 0 <= n <= MAX_REQUEST_RANKS or len(vals) != 2 + n:
        raise RuntimeError(f"malformed rescale request from rank 0 ({len(vals)} values)")
    return Request(vals[0], list(vals[2:]))


def broadcast_request(path: str | Path | None, world: int) -> Request:
    """Rank 0 reads the request and sends it to every rank (called by all ranks).

    Two tensor broadcasts (the length, then the integers), so nothing is
    unpickled from another rank (``broadcast_object_list`` would unpickle).
    """
    import torch
    import torch.distributed as dist

    req = read_request(path) if path else None
    if world > 1:
        dev = torch.device("cpu")
        if dist.get_backend() == "nccl":
            dev = torch.device("cuda", torch.cuda.current_device())
        vals = encode_request(req) if dist.get_rank() == 0 else []
        if len(vals) > 2 + MAX_REQUEST_RANKS:
            vals = encode_request(None)  # a request for more ranks than exist: ignored
        n = torch.tensor([len(vals)], dtype=torch.int64, device=dev)
        dist.broadcast(n, src=0)
        size = int(n.item())
        if not 2 <= size <= 2 + MAX_REQUEST_RANKS:
            raise RuntimeError(f"malformed rescale request length {size} from rank 0")
        buf = torch.tensor(vals if vals else [0] * size, dtype=torch.int64, device=dev)
        dist.broadcast(buf, src=0)
        req = decode_request([int(v) for v in buf.cpu().tolist()])
    if req is None:
        raise RuntimeError("rescale request vanished between poll and apply")
    return req


class NoiseScale:
    """Per-step GNS from the ranks' local and the global gradient norms, smoothed."""

    def __init__(self, decay: float = 0.9) -> None:
        self.tracker = GNSTracker(decay)

    def update(self, local_sq: list[float], counts: list[int], global_sq: float) -> None:
        n = sum(counts)
        if n <= 0 or len({c for c in counts if c > 0} | {n}) < 2:
            return  # one rank: no second batch size this step
        self.tracker.update(gns_from_norms(local_sq, counts, global_sq, n))

    @property
    def value(self) -> float | None:
        v = self.tracker.noise_scale
        return None if v is None else round(v, 4)


def steps_left(dataset_size: int, global_batch: int, epoch: int, offset: int,
               epochs: float) -> int:
    """Steps from sampler position (epoch, offset) until ``epochs`` epochs are done.

    The same count as ``ceil(epochs * steps_per_epoch)`` when nothing was
    rescaled; after a rescale it counts at the new batch from where the data is.
    """
    n, D, B = 0, dataset_size, global_batch
    while epoch + offset / D < epochs - 1e-9:
        if epochs >= epoch + 1:  # the rest of this epoch (its last batch may be partial)
            n += -(-(D - offset) // B)
            epoch, offset = epoch + 1, 0
        else:
            need = (epochs - epoch) * D - offset
            n += max(1, math.ceil(need / B - 1e-9 * D / B))
            break
    return n


class Rescaler:
    """One rank's side of in-place rescaling (see the module docstring)."""

    def __init__(self, path: str | Path | None, rank: int, world: int, rule: str,
                 base_batch: int) -> None:
        self.rank, self.world = rank, world
        self.path = path
        self.rule, self.base_batch = rule, base_batch
        self.watcher = RequestWatcher(path if rank == 0 else None)
        self.applied = 0
        self.restart_needed: list[int] | None = None

    def poll(self) -> int:
        """Rank 0: the seq to announce in this step's all-reduce (0: nothing new)."""
        return self.watcher.pending_seq() if self.rank == 0 else 0

    def apply(self, seq: int, sampler: Any, optimizer: Any) -> dict[str, Any] | None:
        """At the step boundary: new shares and LR if ``seq`` is new; None otherwise.

        A request for another number of ranks sets ``restart_needed`` (the
        trainer then checkpoints and stops) instead.
        """
        if seq <= self.applied:
            return None
        import time

        t0 = time.perf_counter()
        req = broadcast_request(self.path, self.world)
        self.applied = self.watcher.applied = req.seq
        old = list(sampler.shares)
        if len(req.local_batches) != self.world:
            self.restart_needed = req.local_batches
            return {"seq": req.seq, "old": old, "new": req.local_batches, "in_place": False}
        sampler.set_shares(req.local_batches)
        set_lr(optimizer, self.rule, sum(req.local_batches), self.base_batch)
        return {"seq": req.seq, "old": old, "new": req.local_batches, "in_place": True,
                "lr_factor": round(lr_factor(self.rule, sum(req.local_batches),
                                             self.base_batch), 6),
                "pause_s": round(time.perf_counter() - t0, 6)}
