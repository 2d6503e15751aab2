"""Share-proportional data sampling: each global batch split over ranks by their local batch.

An epoch is one permutation of the dataset (deterministic in ``seed`` and the
epoch number). Global step ``s`` takes the next ``global_batch`` indices of
that permutation and gives rank ``k`` the contiguous slice of length
``shares[k]`` (rank order). The epoch's last, partial batch is split in
proportion to the shares (largest remainder), so every sample is seen exactly
once per epoch whatever the shares are; nothing is dropped or padded.

The position is kept in *samples* of the permutation (epoch, offset), not in
steps or per-rank counters, so a job can resume from a checkpoint on a
different number of ranks or a different share split and continue exactly
where it stopped. Torch-free on purpose (numpy only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def split_counts(n: int, shares: Sequence[int]) -> list[int]:
    """Split ``n`` samples over ranks in proportion to ``shares`` (integers summing to n).

    ``n == sum(shares)`` gives the shares themselves; a smaller ``n`` (the last
    batch of an epoch) uses largest-remainder rounding, ties to the lower rank,
    so every rank computes the same split without talking to the others.
    """
    total = sum(shares)
    if n < 0 or total <= 0 or any(s < 0 for s in shares):
        raise ValueError(f"cannot split {n} samples by shares {list(shares)}")
    if n == total:
        return list(shares)
    if n > total:
        raise ValueError(f"{n} samples exceed the global batch {total}")
    exact = [n * s / total for s in shares]
    out = [int(x) for x in exact]
    left = n - sum(out)
    order = sorted(range(len(shares)), key=lambda k: (-(exact[k] - out[k]), k))
    for k in order[:left]:
        out[k] += 1
    return out


@dataclass
class SamplerState:
    """Where the job is in the data: epoch number and samples consumed in it."""

    epoch: int = 0
    offset: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}


class ShareSampler:
    """Yields this rank's indices for each global step (see the module docstring)."""

    def __init__(self, dataset_size: int, shares: Sequence[int], rank: int, *, seed: int = 0,
                 shuffle: bool = True) -> None:
        if dataset_size < 1:
            raise ValueError("dataset_size must be >= 1")
        if not shares or any(s < 1 for s in shares):
            raise ValueError(f"every rank needs a local batch >= 1, got {list(shares)}")
        if not 0 <= rank < len(shares):
            raise ValueError(f"rank {rank} outside 0..{len(shares) - 1}")
        self.dataset_size = dataset_size
        self.shares = [int(s) for s in shares]
        self.global_batch = sum(self.shares)
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.state = SamplerState()
        self._perm_epoch = -1
        self._perm = np.arange(0)

    def set_shares(self, shares: Sequence[int]) -> None:
        """New local batches from the next step on (an in-place rescale); position kept."""
        if len(shares) != len(self.shares) or any(int(s) < 1 for s in shares):
            raise ValueError(f"need {len(self.shares)} local batches >= 1, got {list(shares)}")
        self.shares = [int(s) for s in shares]
        self.global_batch = sum(self.shares)

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.dataset_size // self.global_batch)

    def permutation(self, epoch: int) -> np.ndarray:
        """The epoch's sample order: the same on every rank and every run."""
        if epoch != self._perm_epoch:
            if self.shuffle:
                self._perm = np.random.default_rng([self.seed, epoch]).permutation(
                    self.dataset_size)
            else:
                self._perm = np.arange(self.dataset_size)
            self._perm_epoch = epoch
        return self._perm

    def peek(self) -> tuple[list[np.ndarray], int]:
        """Every rank's indices for the next step and the step's global sample count."""
        perm = self.permutation(self.state.epoch)
        start = self.state.offset
        n = min(self.global_batch, self.dataset_size - start)
        counts = split_counts(n, self.shares)
        bounds = np.concatenate([[0], np.cumsum(counts)]) + start
        return [perm[bounds[k]:bounds[k + 1]] for k in range(len(counts))], n

    def next(self) -> tuple[np.ndarray, int]:
        """This rank's indices for the next global step and that step's global count; advances."""
        parts, n = self.peek()
        self.state.offset += n
        if self.state.offset >= self.dataset_size:
            self.state = SamplerState(self.state.epoch + 1, 0)
        return parts[self.rank], n

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.state.epoch, "offset": self.state.offset, "seed": self.seed,
                "dataset_size": self.dataset_size, "shuffle": self.shuffle}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Resume at a saved position; the shares and rank of this sampler may differ."""
        if int(d["dataset_size"]) != self.dataset_size:
            raise ValueError(f"checkpoint was taken on a dataset of {d['dataset_size']} "
                             f"samples, this job has {self.dataset_size}")
        self.seed = int(d["seed"])
        self.shuffle = bool(d.get("shuffle", True))
        self._perm_epoch = -1
        self.state = SamplerState(int(d["epoch"]), int(d["offset"]))
