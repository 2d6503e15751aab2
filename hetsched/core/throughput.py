"""Throughput profiles: the CSV format, the affine step-time fit, and Gavel import.

A profile row says: workload W on GPU type G at local batch b took
``step_time_s`` per training step (the job's whole step: forward, backward,
optimizer) and, optionally, ``sync_time_s`` for the gradient exchange measured
on that type and ``optimizer_s``, the optimizer step's share of the step (a
pool task's iteration has none: its job's coordinator steps the optimizer once
per round). Per (workload, GPU type) the planner fits ``t(b) = a + c*b`` by
non-negative least squares (the papers' Fig. 2 shows step time is affine in
the batch), and the optimizer's share as one constant (the median of the rows
that have it: the optimizer updates the parameters, whatever the batch).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import nnls

CSV_COLUMNS = ("workload", "gpu_type", "local_batch", "step_time_s")
OPTIONAL_COLUMNS = ("sync_time_s", "max_local_batch", "gpus", "colocated_with", "optimizer_s")
#: an affine fit missing a measured point by more than this (relative) is "poor":
#: the step time then follows a monotone piecewise-linear curve through the points
POOR_FIT = 0.20


@dataclass(frozen=True)
class ProfileRow:
    workload: str
    gpu_type: str
    local_batch: int
    step_time_s: float
    sync_time_s: float | None = None
    max_local_batch: int | None = None
    #: data-parallel workers of the measurement; above 1, step_time_s is the whole
    #: synchronous iteration (compute + synchronisation) at this per-worker batch
    gpus: int = 1
    #: ``"workload:local_batch"`` of a job sharing the same GPU during the measurement
    #: (Gavel's co-located pairs, Harmony); such rows are kept apart from the fits
    colocated_with: str | None = None
    #: the optimizer step's share of ``step_time_s`` (measured by the probe); None: unknown
    optimizer_s: float | None = None


@dataclass(frozen=True)
class StepFit:
    """Fitted step time ``a + c*b`` for local batch ``1 <= b <= max_batch``.

    ``max_batch`` bounds the local batch: the largest profiled local batch unless a
    ``max_local_batch`` column gave one. ``memory_cap`` is that column's value
    only (a batch a GPU was measured not to exceed), None when no row gave one:
    the memory model (:func:`hetsched.core.memory.fill_batch`) tells them apart. ``sync_s`` is the mean measured
    synchronisation time (0 when none was profiled). ``knots`` (batch, step
    time) replace the line in :meth:`step_time` when the affine fit is poor
    (``POOR_FIT``): a non-decreasing piecewise-linear curve through the
    measured points (isotonic where the measurements themselves dip).
    ``sync_curve`` ((workers, seconds), ...) is the synchronisation time
    calibrated from measurements at several scales (``gpus`` > 1); see
    :meth:`sync_at`. ``optimizer_s`` is the optimizer step's share of a step (the
    median over the rows that measured it, a constant in the batch); ``optimizer_rows``
    how many rows did (0: unknown, and ``optimizer_s`` is 0).
    """

    a: float
    c: float
    max_batch: int
    sync_s: float = 0.0
    points: int = 1
    rel_rmse: float = 0.0
    knots: tuple[tuple[float, float], ...] = ()
    sync_curve: tuple[tuple[int, float], ...] = ()
    max_rel_err: float = 0.0
    memory_cap: int | None = None
    optimizer_s: float = 0.0
    optimizer_rows: int = 0

    def step_time(self, b: float) -> float:
        if self.knots:
            return piecewise_step_time(self.knots, self.c, b)
        return self.a + self.c * b

    def curve(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The planner's piecewise model (None where the line is used): batches from 1 to
        the cap through the knots, and :meth:`step_time` there, made strictly increasing
        (by at most a relative 1e-9 per point, where the isotonic fit is flat) so that
        water-filling can invert it (``hetsched.core.model.Curve``)."""
        if not self.knots:
            return None
        cap = float(self.max_batch)
        bs = sorted({1.0, cap} | {b for b, _ in self.knots if 1.0 < b < cap})
        ts = [self.step_time(b) for b in bs]
        for k in range(1, len(ts)):
            ts[k] = max(ts[k], ts[k - 1] * (1 + 1e-9))
        return np.array(bs), np.array(ts)

    def throughput(self, b: float) -> float:
        """Samples per second at local batch b."""
        return b / self.step_time(b)

    @property
    def peak_throughput(self) -> float:
        """Best samples/s on one GPU: the most over the profiled batches up to the cap."""
        if self.knots:
            return max(b / t for b, t in self.knots if b <= self.max_batch) if any(
                b <= self.max_batch for b, _ in self.knots) else self.throughput(self.max_batch)
        return self.throughput(self.max_batch)

    def sync_at(self, workers: int) -> float | None:
        """Calibrated synchronisation time at ``workers`` GPUs; None when never measured.

        Linear between measured scales (and from 0 at one GPU); beyond the
        largest measured scale it grows like the ring all-reduce's
        ``2(K-1)/K``. It follows the measurements, which need not grow with the
        scale (Gavel's LM on V100 synchronises faster on 8 GPUs than on 4).
        """
        if not self.sync_curve:
            return None
        if workers <= 1:
            return 0.0
        ks = [1.0] + [float(k) for k, _ in self.sync_curve]
        vs = [0.0] + [v for _, v in self.sync_curve]
        if workers <= ks[-1]:
            return float(np.interp(workers, ks, vs))
        kmax = ks[-1]
        return vs[-1] * (2 * (workers - 1) / workers) / (2 * (kmax - 1) / kmax)

    def sync_at_many(self, workers: np.ndarray) -> np.ndarray:
        """:meth:`sync_at` for an array of worker counts (requires a ``sync_curve``)."""
        K = np.asarray(workers, dtype=float)
        ks = np.array([1.0] + [float(k) for k, _ in self.sync_curve])
        vs = np.array([0.0] + [v for _, v in self.sync_curve])
        kmax = ks[-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            ring = vs[-1] * ((K - 1) / K) / ((kmax - 1) / kmax)
        out = np.where(K <= kmax, np.interp(K, ks, vs), ring)
        return np.where(K <= 1, 0.0, out)


def piecewise_step_time(knots: tuple[tuple[float, float], ...], slope: float, b: float) -> float:
    """Step time on a piecewise-linear curve through ``knots``, extended with ``slope`` outside."""
    bs = [k[0] for k in knots]
    ts = [k[1] for k in knots]
    if b < bs[0]:
        return max(ts[0] - slope * (bs[0] - b), ts[0] * b / bs[0], 1e-12)
    if b > bs[-1]:
        return ts[-1] + slope * (b - bs[-1])
    return float(np.interp(b, bs, ts))


def isotonic(y: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in y:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2 = blocks.pop()
            m1, w1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return np.concatenate([np.full(int(w), m) for m, w in blocks])


def calibrate_sync(single: StepFit, multi: list[ProfileRow]) -> tuple[tuple[int, float], ...]:
    """Synchronisation time per scale from whole-iteration measurements at several GPUs.

    At each scale K, the median over batches of (measured iteration time -
    the one-GPU model's step time at that per-worker batch), at least 0. Not
    forced to grow with K: that fits Gavel's table worse (docs/model.md).
    """
    by_k: dict[int, list[float]] = {}
    for r in multi:
        by_k.setdefault(r.gpus, []).append(max(0.0, r.step_time_s - single.step_time(r.local_batch)))
    return tuple((k, float(np.median(by_k[k]))) for k in sorted(by_k))


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


def fit_rows(rs: list[ProfileRow], multi: list[ProfileRow] | None = None,
             piecewise: bool = True) -> StepFit:
    """Fit one (workload, GPU type): affine, piecewise when poor, sync calibrated from ``multi``."""
    b = np.array([r.local_batch for r in rs], dtype=float)
    t = np.array([r.step_time_s for r in rs], dtype=float)
    a, c, rel = fit_affine(b, t)
    max_err = float(np.max(np.abs((a + c * b - t) / t)))
    knots: tuple[tuple[float, float], ...] = ()
    ub = np.unique(b)
    if piecewise and max_err > POOR_FIT and len(ub) >= 3:
        mean_t = np.array([float(np.mean(t[b == v])) for v in ub])
        knots = tuple((float(x), float(y)) for x, y in zip(ub, isotonic(mean_t), strict=True))
    syncs = [r.sync_time_s for r in rs if r.sync_time_s is not None]
    caps = [r.max_local_batch for r in rs if r.max_local_batch is not None]
    opts = [r.optimizer_s for r in rs if r.optimizer_s is not None]
    cap = min(caps) if caps else int(b.max())
    fit = StepFit(a=a, c=c, max_batch=cap, sync_s=float(np.mean(syncs)) if syncs else 0.0,
                  points=len(rs), rel_rmse=rel, knots=knots, max_rel_err=max_err,
                  memory_cap=min(caps) if caps else None,
                  optimizer_s=float(np.median(opts)) if opts else 0.0,
                  optimizer_rows=len(opts))
    if multi:
        curve = calibrate_sync(fit, multi)
        # the scalar measured sync the model falls back on: the two-GPU value
        fit = replace(fit, sync_curve=curve, sync_s=fit.sync_s or curve[0][1])
    return fit


class ThroughputTable:
    """Fitted step-time models keyed by (workload, gpu_type)."""

    def __init__(self, rows: Iterable[ProfileRow], source: str = "<profiles>") -> None:
        self.source = source
        groups: dict[tuple[str, str], list[ProfileRow]] = {}
        #: (workload, batch, partner workload, partner batch, gpu_type) -> step seconds
        #: measured while sharing one GPU with the partner (co-located pairs)
        self.pairs: dict[tuple[str, int, str, int, str], float] = {}
        self.pair_rows: list[ProfileRow] = []
        for r in rows:
            if r.colocated_with is not None:
                w2, b2 = r.colocated_with.rsplit(":", 1)
                self.pairs[(r.workload, r.local_batch, w2, int(b2), r.gpu_type)] = r.step_time_s
                self.pair_rows.append(r)
                continue
            groups.setdefault((r.workload, r.gpu_type), []).append(r)
        self.rows = groups
        self.fits: dict[tuple[str, str], StepFit] = {}
        for key, all_rs in groups.items():
            rs = [r for r in all_rs if r.gpus == 1]
            if not rs:  # multi-GPU measurements alone: nothing to fit compute on
                continue
            self.fits[key] = fit_rows(rs, [r for r in all_rs if r.gpus > 1])

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
        return [r for key in sorted(self.rows) for r in self.rows[key]] + self.pair_rows

    def pair_step_s(self, workload: str, batch: int, other: str, other_batch: int,
                    gpu_type: str) -> float | None:
        """Measured step time of ``workload`` at ``batch`` sharing one GPU with ``other``."""
        return self.pairs.get((workload, batch, other, other_batch, gpu_type))
