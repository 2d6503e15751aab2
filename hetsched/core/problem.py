"""PlanningProblem: jobs x GPU types as numpy arrays, built once and validated.

Policies see only this object. GPUs of one type are interchangeable for the
compute model, so most decisions are per-type counts; the node a GPU sits on
matters only for the communication bandwidth, which the placer and the
evaluator handle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from hetsched.core.estimates import Estimates
from hetsched.core.memory import fill_batch
from hetsched.core.model import (
    Curve,
    allreduce_time,
    continuous_time_counts,
    interp1,
    ring_allreduce_s,
    worker_time,
)
from hetsched.core.spec import Cluster, Job
from hetsched.core.throughput import StepFit, ThroughputTable
from hetsched.errors import InputError

INF = float("inf")


@dataclass
class PlanningProblem:
    jobs: list[Job]
    cluster: Cluster
    table: ThroughputTable
    jobs_source: str = "jobs"
    #: placement hint (replan): job name -> the (node, GPU index) it holds or waits for
    #: in Slurm now; the placer keeps them when the job gets the same per-type counts
    #: (planning/space/placer.py). Never changes a policy's decisions.
    prefer_gpus: dict[str, list[tuple[str, int]]] = field(default_factory=dict, repr=False,
                                                           compare=False)
    #: replan: job name -> the (node, GPU index) it runs on now. The evaluator starts
    #: it there, as having run (moving it costs the restart), and its keep-or-move
    #: decision (planning/space/decide.py) keeps or moves it like at any reset event.
    running_gpus: dict[str, list[tuple[str, int]]] = field(default_factory=dict, repr=False,
                                                            compare=False)
    #: online replan: the jobs of ``running_gpus`` stay on those GPUs until they end
    running_fixed: bool = field(default=False, repr=False, compare=False)
    #: completed jobs' (features, progress) pairs for ONES's progress predictor, from
    #: the state store (hetsched.state.progress.progress_points); None: no history
    progress_history: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False,
                                                                   compare=False)
    types: list[str] = field(init=False)
    n_type: np.ndarray = field(init=False)  # (T,) GPUs per type
    a: np.ndarray = field(init=False)  # (S, T) step-time intercept
    c: np.ndarray = field(init=False)  # (S, T) step-time slope
    cap: np.ndarray = field(init=False)  # (S, T) max local batch
    sync: np.ndarray = field(init=False)  # (S, T) measured sync time
    allowed: np.ndarray = field(init=False)  # (S, T) bool
    B: np.ndarray = field(init=False)  # (S,) global batch
    iters: np.ndarray = field(init=False)  # (S,) iterations
    weight: np.ndarray = field(init=False)
    arrival: np.ndarray = field(init=False)
    model_mb: np.ndarray = field(init=False)
    lo: np.ndarray = field(init=False)  # (S,) min GPUs
    hi: np.ndarray = field(init=False)  # (S,) max useful GPUs
    node_max: np.ndarray = field(init=False)  # (T,) largest node of each type
    #: (S,) the factor :meth:`scaled` applied to each job's steps, pairs too (1: as profiled)
    step_factor: np.ndarray = field(init=False)
    #: memoised model estimates every policy shares (hetsched.core.estimates)
    estimates: Estimates = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        jobs, cluster, table = self.jobs, self.cluster, self.table
        self.types = list(cluster.gpu_types)
        if not self.types:
            raise InputError(self.jobs_source, "empty partition: the cluster has no usable GPU")
        counts = cluster.count_by_type()
        self.n_type = np.array([counts[t] for t in self.types], dtype=int)
        S, T = len(jobs), len(self.types)
        self.a = np.zeros((S, T))
        self.c = np.ones((S, T))
        self.cap = np.ones((S, T), dtype=int)
        #: the local batch at which a job alone fills a GPU's memory (core.memory.fill_batch)
        self.mem_cap = np.ones((S, T))
        self.sync = np.zeros((S, T))
        #: per job: GPU type -> fit whose sync was calibrated at several scales
        self.calibrated: list[dict[int, StepFit]] = [{} for _ in range(S)]
        #: per job: None (every allowed type affine) or, per type, the piecewise curve
        #: where the affine fit is poor: predictions and batch shares use it
        self.curves: list[list[Curve] | None] = [None] * S
        self.allowed = np.zeros((S, T), dtype=bool)
        node_max = {t: 0 for t in self.types}
        for n in cluster.nodes:
            if n.usable:
                node_max[n.gpu_type] = max(node_max[n.gpu_type], n.gpus)
        self.node_max = np.array([node_max[t] for t in self.types], dtype=int)
        src = self.jobs_source
        for i, job in enumerate(jobs):
            where = f"job {job.name!r}"
            profiled = table.types_for(job.workload)
            if not profiled:
                known = ", ".join(table.workloads) or "none"
                raise InputError(src, f"workload {job.workload!r} has no throughput profile "
                                 f"(in {table.source}); profiled workloads: {known}", where)
            if job.gpu_types is not None:
                bad = [g for g in job.gpu_types if g not in self.types]
                if bad:
                    raise InputError(src, f"gpu_types: unknown GPU type {bad[0]!r}; the "
                                     f"partition has {', '.join(self.types)}", where)
            for t, g in enumerate(self.types):
                fit = table.get(job.workload, g)
                if fit is None or (job.gpu_types is not None and g not in job.gpu_types):
                    continue
                self._set_fit(i, t, fit)
            if not self.allowed[i].any():
                raise InputError(src, f"fits no GPU: workload {job.workload!r} is profiled on "
                                 f"{', '.join(profiled)}, the partition has "
                                 f"{', '.join(self.types)}"
                                 + (f", the job allows {', '.join(job.gpu_types)}"
                                    if job.gpu_types else ""), where)
        self.step_factor = np.ones(S)
        self.B = np.array([j.global_batch for j in jobs], dtype=int)
        self.iters = np.array([j.iterations for j in jobs], dtype=float)
        self.weight = np.array([j.weight for j in jobs], dtype=float)
        self.arrival = np.array([j.arrival_s for j in jobs], dtype=float)
        self.model_mb = np.array([j.model_size_mb for j in jobs], dtype=float)
        self.lo = np.array([j.min_gpus for j in jobs], dtype=int)
        avail = (self.allowed * self.n_type[None, :]).sum(axis=1)
        hi = np.minimum(avail, self.B)  # every worker needs at least one sample
        for i, j in enumerate(jobs):
            if j.max_gpus is not None:
                hi[i] = min(hi[i], j.max_gpus)
        self.hi = hi.astype(int)
        for i, job in enumerate(jobs):
            where = f"job {job.name!r}"
            if self.lo[i] > self.hi[i]:
                raise InputError(src, f"min_gpus {job.min_gpus} cannot be met: at most "
                                 f"{self.hi[i]} usable GPUs (allowed types with profiles: "
                                 f"{avail[i]}, global_batch {job.global_batch})", where)
            # can the global batch fit in memory on the best hi[i] GPUs?
            caps = np.repeat(self.cap[i][self.allowed[i]], self.n_type[self.allowed[i]])
            best = np.sort(caps)[::-1][: self.hi[i]].sum()
            if best < job.global_batch:
                raise InputError(src, f"fits no GPU set: global_batch {job.global_batch} exceeds "
                                 f"the largest local batches the GPUs can hold ({int(best)} "
                                 f"on {self.hi[i]} GPUs); lower global_batch or allow more GPUs",
                                 where)

        self.estimates = Estimates.of(self)

    def _set_fit(self, i: int, t: int, fit: StepFit) -> None:
        """Job i may use type t, whose step time is ``fit``."""
        self.allowed[i, t] = True
        self.a[i, t], self.c[i, t] = fit.a, fit.c
        self.cap[i, t] = fit.max_batch
        self.mem_cap[i, t] = fill_batch(fit.max_batch, fit.memory_cap)
        self.sync[i, t] = fit.sync_s
        if fit.sync_curve:
            self.calibrated[i][t] = fit
        curve = fit.curve()
        if curve is not None:
            row = self.curves[i]
            if row is None:
                row = self.curves[i] = [None] * len(self.types)
            row[t] = curve

    def clear_caches(self) -> None:
        """Forget memoised model evaluations (benchmarks time cold runs with this)."""
        self.estimates.clear()

    def pair_step_s(self, i: int, batch: int, j: int, other_batch: int,
                    gpu_type: str) -> float | None:
        """Measured step of job i at ``batch`` sharing a GPU with job j at ``other_batch``
        (None: not measured), scaled as job i's own steps are (:meth:`scaled`)."""
        t = self.table.pair_step_s(self.jobs[i].workload, batch, self.jobs[j].workload,
                                   other_batch, gpu_type)
        return None if t is None else t * float(self.step_factor[i])

    def scaled(self, step: np.ndarray | None = None,
               sync: np.ndarray | None = None) -> PlanningProblem:
        """A copy whose job i computes ``step[i]`` times as long (line, piecewise curve,
        measured pairs) and synchronises ``sync[i]`` times as long (measured sync, model
        size, calibrated curves); None leaves that part as it is. The arrays it changes
        are the copy's own, the rest shared read-only; its estimates start empty."""
        import copy
        import dataclasses

        q = copy.copy(self)
        if step is not None:
            f = np.asarray(step, dtype=float)
            q.a, q.c = self.a * f[:, None], self.c * f[:, None]
            q.step_factor = self.step_factor * f
            q.curves = [None if row is None else
                        [None if cv is None else (cv[0], cv[1] * f[i]) for cv in row]
                        for i, row in enumerate(self.curves)]
        if sync is not None:
            g = np.asarray(sync, dtype=float)
            q.sync, q.model_mb = self.sync * g[:, None], self.model_mb * g
            q.calibrated = [{t: dataclasses.replace(
                fit, sync_s=fit.sync_s * g[i],
                sync_curve=tuple((k, v * g[i]) for k, v in fit.sync_curve))
                for t, fit in cal.items()} for i, cal in enumerate(self.calibrated)]
        q.estimates = Estimates.of(q)
        return q

    @property
    def S(self) -> int:
        return len(self.jobs)

    @property
    def T(self) -> int:
        return len(self.types)

    @property
    def K(self) -> int:
        return int(self.n_type.sum())

    def bandwidth(self, single_node: bool) -> float:
        return self.cluster.intra_node_gbps if single_node else self.cluster.inter_node_gbps

    def compute_time(self, i: int, N: np.ndarray) -> np.ndarray:
        """Continuous optimal step time of job i for count rows N (M, T); inf if infeasible."""
        N = np.atleast_2d(N)
        bad = (N[:, ~self.allowed[i]] > 0).any(axis=1)
        out = continuous_time_counts(self.a[i], self.c[i], self.cap[i], N, float(self.B[i]),
                                     self.curves[i])
        out[bad] = np.inf
        out[N.sum(axis=1) > self.B[i]] = np.inf
        return out

    def comm_estimate(self, i: int, N: np.ndarray) -> np.ndarray:
        """Policy-side communication estimate for count rows N.

        Assumes a job on one GPU type that fits the largest node of that type
        runs inside one node (the placer packs it so); anything else crosses
        nodes. The evaluator recomputes it from the real placement.
        """
        N = np.atleast_2d(N)
        K = N.sum(axis=1)
        ntypes = (N > 0).sum(axis=1)
        fits_node = (ntypes == 1) & ((N <= self.node_max[None, :]) | (N == 0)).all(axis=1)
        bw = np.where(fits_node, self.cluster.intra_node_gbps, self.cluster.inter_node_gbps)
        if self.model_mb[i] > 0:
            with np.errstate(divide="ignore", invalid="ignore"):
                t = ring_allreduce_s(K, self.model_mb[i], bw)
        else:
            t = np.where(N > 0, self.sync[i][None, :], 0.0).max(axis=1)
        if self.calibrated[i]:  # measured at several scales: the measurement wins
            cal = np.full(len(K), -np.inf)
            for ty, fit in self.calibrated[i].items():
                cal = np.where(N[:, ty] > 0, np.maximum(cal, fit.sync_at_many(K)), cal)
            t = np.where(np.isfinite(cal), cal, t)
        return np.where(K > 1, t, 0.0)

    def calibrated_comm(self, i: int, types: Iterable[int], workers: int) -> float | None:
        """Sync time of job i on ``workers`` GPUs of ``types`` from multi-scale measurements.

        The largest calibrated value among the types used; None when none of
        them was measured at several scales (the model then estimates it).
        """
        vals = [fit.sync_at(workers) for ty, fit in self.calibrated[i].items() if ty in types]
        return max((v for v in vals if v is not None), default=None)

    def iter_time(self, i: int, N: np.ndarray) -> np.ndarray:
        """Policy-side iteration time (compute + communication) for count rows N."""
        N = np.atleast_2d(N)
        return self.compute_time(i, N) + self.comm_estimate(i, N)

    def model_key(self, i: int) -> tuple:
        """What :meth:`iter_time` of job i depends on: jobs with equal keys (one workload
        at one global batch) have equal iteration times at every count vector."""
        keys = self.estimates.model_key
        if i not in keys:
            curves = self.curves[i]
            keys[i] = (self.a[i].tobytes(), self.c[i].tobytes(), self.cap[i].tobytes(),
                       self.allowed[i].tobytes(), int(self.B[i]), float(self.model_mb[i]),
                       self.sync[i].tobytes(), tuple(sorted(self.calibrated[i].items())),
                       None if curves is None else tuple(
                           None if cv is None else (cv[0].tobytes(), cv[1].tobytes())
                           for cv in curves))
        return keys[i]

    def iter_time1(self, i: int, n: tuple[int, ...]) -> float:
        """Scalar, cached :meth:`iter_time` for one count vector (a tuple).

        Greedy policies evaluate the same (job, counts) pairs at event after
        event; plain Python on a handful of types beats a numpy call per pair
        by two orders of magnitude, and the cache removes the repeats.
        """
        est = self.estimates
        cache = est.iter_time
        key = (i, n)
        hit = cache.get(key)
        if hit is not None:
            return hit
        a, c, cap, allowed = est.rows[i]
        K = 0
        used = []
        for t, k in enumerate(n):
            if k:
                if not allowed[t]:
                    cache[key] = INF
                    return INF
                K += k
                used.append(t)
        B = est.batch[i]
        if K == 0 or K > B:
            cache[key] = INF
            return INF
        curves = self.curves[i]
        bent: dict[int, tuple[list[float], list[float]]] = {}
        for t in used:
            cv_t = curves[t] if curves is not None else None
            if cv_t is not None:
                bent[t] = (cv_t[0].tolist(), cv_t[1].tolist())

        def g(T: float) -> float:
            if not bent:
                return sum(n[t] * min(max((T - a[t]) / c[t], 1.0), cap[t]) for t in used)
            tot = 0.0
            for t in used:
                cv = bent.get(t)
                x = (T - a[t]) / c[t] if cv is None else interp1(T, cv[1], cv[0])
                tot += n[t] * min(max(x, 1.0), cap[t])
            return tot

        ends = [(a[t] + c[t], a[t] + c[t] * cap[t]) if t not in bent else
                (float(bent[t][1][0]), float(bent[t][1][-1])) for t in used]
        t0 = max(lo for lo, _ in ends)
        knots = {float(v) for cv in bent.values() for v in cv[1]}
        comp = INF
        prev, gprev = t0, g(t0)
        if gprev >= B - 1e-9:
            comp = t0
        else:
            for bp in sorted({hi for _, hi in ends} | {lo for lo, _ in ends} | knots):
                if bp <= t0:
                    continue
                gb = g(bp)
                if gb >= B - 1e-9:
                    comp = prev + (B - gprev) * (bp - prev) / (gb - gprev)
                    break
                prev, gprev = bp, gb
        cal = self.calibrated_comm(i, used, K) if K > 1 and self.calibrated[i] else None
        if cal is not None:
            comp += cal
        elif K > 1:
            if est.model_mb[i] > 0:
                single = len(used) == 1 and n[used[0]] <= est.node_max[used[0]]
                comp += allreduce_time(K, est.model_mb[i], self.bandwidth(single))
            else:
                comp += max(est.sync[i][t] for t in used)
        cache[key] = comp
        return comp

    def per_gpu_rate(self, i: int, local_batch: np.ndarray | float | None = None) -> np.ndarray:
        """Samples/s of one GPU of each type for job i (0 where not allowed).

        At ``local_batch`` (clipped to each type's cap), or the peak: at the cap, or
        the best knot of a piecewise curve.
        """
        b = self.cap[i].astype(float) if local_batch is None else np.minimum(
            np.maximum(local_batch, 1.0), self.cap[i])
        r = b / (self.a[i] + self.c[i] * b)
        for t, cv in enumerate(self.curves[i] or ()):
            if cv is None:
                continue
            if local_batch is None:  # peak: a rate on a linear piece is monotone, so at a knot
                r[t] = float((cv[0] / cv[1]).max())
            else:
                r[t] = b[t] / float(worker_time(0.0, 0.0, cv, b[t]))
        return np.where(self.allowed[i], r, 0.0)

    def step_times(self, i: int, b: np.ndarray) -> np.ndarray:
        """Job i's step time on one GPU of each type at local batches ``b`` (..., T)."""
        out = self.a[i] + self.c[i] * b
        for t, cv in enumerate(self.curves[i] or ()):
            if cv is not None:
                out[..., t] = np.interp(b[..., t], cv[0], cv[1])
        return out

    def type_order(self) -> list[int]:
        """GPU types in the order they first appear in the cluster's node list."""
        seen: list[int] = []
        for n in self.cluster.nodes:
            if n.usable:
                t = self.types.index(n.gpu_type)
                if t not in seen:
                    seen.append(t)
        return seen

    def equal_share_time(self, i: int, S: int | None = None) -> float:
        """Iteration time of job i with an equal 1/S share of every GPU type (fairness
        reference; fractional GPU counts allowed: a reference point, not a plan)."""
        S = S or self.S
        rate = (self.per_gpu_rate(i, self.B[i] / max(1.0, self.K / S)) * self.n_type / S).sum()
        return float(self.B[i] / rate) if rate > 0 else float("inf")
