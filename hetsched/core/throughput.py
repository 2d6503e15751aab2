"""Throughput profiles: the CSV format, the affine step-time fit, and Gavel import.

A profile row says: workload W on GPU type G at local batch b took
``step_time_s`` per training step (forward + backward, no synchronisation) and,
optionally, ``sync_time_s`` for the gradient exchange measured on that type.
Per (workload, GPU type) the planner fits ``t(b) = a + c*b`` by non-negative
least squares (the papers' Fig. 2 shows step time is affine in the batch).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

CSV_COLUMNS = ("workload", "gpu_type", "local_batch", "step_time_s")
OPTIONAL_COLUMNS = ("sync_time_s", "max_local_batch")


@dataclass(frozen=True)
class ProfileRow:
    workload: str
    gpu_type: str
    local_batch: int
    step_time_s: float
    sync_time_s: float | None = None
    max_local_batch: int | None = None


@dataclass(frozen=True)
class StepFit:
    """Fitted step time ``a + c*b`` for local batch ``1 <= b <= max_batch``.

    ``max_batch`` is the memory cap: the largest profiled local batch unless a
    ``max_local_batch`` column gave one. ``sync_s`` is the mean measured
    synchronisation time (0 when none was profiled).
    """

    a: float
    c: float
    max_batch: int
    sync_s: float = 0.0
    points: int = 1
    rel_rmse: float = 0.0

    def step_time(self, b: float) -> float:
        return self.a + self.c * b

    def throughput(self, b: float) -> float:
        """Samples per second at local batch b."""
        return b / (self.a + self.c * b)

    @property
    def peak_throughput(self) -> float:
        """Best samples/s on one GPU: at the largest batch, since b/(a+cb) grows with b."""
        return self.throughput(self.max_batch)


def fit_affine(batches: np.ndarray, times: np.ndarray) -> tuple[float, float, float]:
    """Non-negative least-squares fit of ``t = a + c*b``; returns (a, c, relative RMSE).

    One distinct batch gives a line through the origin (a = 0): with one point
    the intercept is not identifiable, and a = 0 is the paper's proportional model.
    """
    b = np.asarray(batches, dtype=float)
    t = np.asarray(times, dtype=float)
    if len(np.unique(b)) < 2:
        c = float(np.mean(t / b))
        a = 0.0
    else:
        A = np.column_stack([np.ones_like(b), b])
        (a, c), _ = nnls(A, t)
        a, c = float(a), float(c)
        if c <= 0:  # flat or decreasing measurements: fall back to proportional
            c = float(np.mean(t / b))
            a = 0.0
    pred = a + c * b
    rel = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return a, c, rel


class ThroughputTable:
    """Fitted step-time models keyed by (workload, gpu_type)."""

    def __init__(self, rows: Iterable[ProfileRow], source: str = "<profiles>") -> None:
        self.source = source
        groups: dict[tuple[str, str], list[ProfileRow]] = {}
        for r in rows:
            groups.setdefault((r.workload, r.gpu_type), []).append(r)
        self.rows = groups
        self.fits: dict[tuple[str, str], StepFit] = {}
        for key, rs in groups.items():
            b = np.array([r.local_batch for r in rs], dtype=float)
            t = np.array([r.step_time_s for r in rs], dtype=float)
            a, c, rel = fit_affine(b, t)
            syncs = [r.sync_time_s for r in rs if r.sync_time_s is not None]
            caps = [r.max_local_batch for r in rs if r.max_local_batch is not None]
            cap = min(caps) if caps else int(b.max())
            self.fits[key] = StepFit(a=a, c=c, max_batch=cap,
                                     sync_s=float(np.mean(syncs)) if syncs else 0.0,
                                     points=len(rs), rel_rmse=rel)

    @property
    def workloads(self) -> list[str]:
        return sorted({w for w, _ in self.fits})

    @property
    def gpu_types(self) -> list[str]:
        return sorted({g for _, g in self.fits})

    def get(self, workload: str, gpu_type: str) -> StepFit | None:
        return self.fits.get((workload, gpu_type))

    def types_for(self, workload: str) -> list[str]:
        return sorted(g for w, g in self.fits if w == workload)

    def all_rows(self) -> list[ProfileRow]:
        return [r for key in sorted(self.rows) for r in self.rows[key]]
