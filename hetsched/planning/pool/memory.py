"""Speculative memory management (Hare, section 4): which models stay resident on a GPU.

The plan fixes every GPU's task sequence in advance, so the executor can keep
a job's model state in GPU memory between two of its tasks instead of
reloading it. Hare's heuristic, per GPU, after each task:

1. the *next* task's model has priority: it stays if resident, and room is
   reserved for it otherwise;
2. then the models of the most recently finished tasks are kept, most recent
   first, until the next one does not fit (the paper's greedy; it stops at
   the first model that does not fit rather than searching for a packing).

Everything else is evicted. The outcome per task is ``keep`` (its own model
stays resident after it) or ``evict``, plus the other jobs' models to evict
after it (rare: only when the next task needs their room). A task *starts
warm* when its model is resident at its start, i.e. no reload is needed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class MemoryPlan:
    """Per task of one GPU's sequence: keep own model, other models to evict, warm start."""

    keep: list[bool]
    evict_others: list[list[int]]
    warm: list[bool]

    @property
    def loads(self) -> int:
        return sum(1 for w in self.warm if not w)


def plan_gpu_memory(seq: Sequence[int], mem_gb: Sequence[float], capacity_gb: float) -> MemoryPlan:
    """Keep/evict decisions for one GPU running jobs ``seq`` in order.

    ``mem_gb[j]`` is job j's resident model state; a model larger than the
    GPU is never kept (it streams, as without the optimisation).
    """
    resident: OrderedDict[int, None] = OrderedDict()  # least recent first
    keep: list[bool] = []
    evict_others: list[list[int]] = []
    warm: list[bool] = []
    n = len(seq)
    for idx, j in enumerate(seq):
        if 0 < idx < n - 1 and seq[idx - 1] == j == seq[idx + 1] and keep[-1]:
            # inside a run of one job's tasks, its model kept: the step before decided the
            # same resident set with the same next model, so this one changes nothing
            warm.append(True)
            keep.append(True)
            evict_others.append([])
            continue
        warm.append(j in resident)
        resident.pop(j, None)
        resident[j] = None  # most recent
        nxt = seq[idx + 1] if idx + 1 < n else None
        kept: set[int] = set()
        used = 0.0
        if nxt is not None:
            # the next task's model first: kept if resident, else its room is reserved
            used = float(mem_gb[nxt])
            if nxt in resident and used <= capacity_gb:
                kept.add(nxt)
        for r in reversed(resident):
            if r in kept:
                continue
            need = float(mem_gb[r])
            if used + need > capacity_gb:
                break  # the paper's greedy: keep until one does not fit
            kept.add(r)
            used += need
        keep.append(j in kept)
        gone = [r for r in resident if r not in kept]
        evict_others.append(sorted(r for r in gone if r != j))
        for r in gone:
            del resident[r]
    return MemoryPlan(keep, evict_others, warm)
