"""Factories, a hypothesis strategy and plan checks shared by the planner tests.

Kept in an importable module (not only in conftest.py) because hypothesis
strategies are used in ``@given`` decorators at import time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from hetsched.core.model import BITS_PER_MB
from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.planning.space.policies.base import Snapshot

REL = 1e-9  # relative tolerance for recomputed times


# ---------------------------------------------------------------------------
# factories


def affine_rows(workload: str, gpu_type: str, a: float, c: float,
                batches: Iterable[int], sync_s: float | None = None) -> list[ProfileRow]:
    """Exact profile rows of ``t(b) = a + c*b``; the largest batch becomes the cap."""
    return [ProfileRow(workload, gpu_type, int(b), a + c * b, sync_s) for b in batches]


def make_table(profiles: dict[tuple[str, str], tuple[float, float, int]],
               sync: dict[tuple[str, str], float] | None = None) -> ThroughputTable:
    """``{(workload, gpu_type): (a, c, cap)}`` -> fitted table (two exact points each)."""
    rows: list[ProfileRow] = []
    for (w, g), (a, c, cap) in profiles.items():
        lo = max(1, cap // 2) if cap > 1 else 1
        bs = [lo, cap] if lo != cap else [cap]
        rows += affine_rows(w, g, a, c, bs, (sync or {}).get((w, g)))
    return ThroughputTable(rows, "<test profiles>")


def make_cluster(nodes: Sequence[tuple[str, str, int]], intra: float = 300.0,
                 inter: float = 10.0) -> Cluster:
    """``[(node name, gpu type, gpus), ...]`` -> Cluster."""
    return Cluster(nodes=tuple(Node(n, t, k) for n, t, k in nodes),
                   intra_node_gbps=intra, inter_node_gbps=inter)


def make_job(name: str, workload: str, *, dataset_size: int = 1000, epochs: float = 1,
             global_batch: int = 10, **kw: object) -> Job:
    return Job(name=name, workload=workload, dataset_size=dataset_size, epochs=epochs,
               global_batch=global_batch, **kw)  # type: ignore[arg-type]


def snapshot(p: PlanningProblem, rows: Sequence[int] | None = None,
             free: Sequence[int] | None = None, remaining: Sequence[float] | None = None,
             t: float = 0.0) -> Snapshot:
    """A reset-event snapshot built by hand (all listed jobs waiting)."""
    jobs = np.arange(p.S) if rows is None else np.asarray(rows, dtype=int)
    rem = p.iters[jobs].astype(float) if remaining is None else np.asarray(remaining, float)
    fr = p.n_type.copy() if free is None else np.asarray(free, dtype=int)
    return Snapshot(t=t, jobs=jobs, remaining=rem, free=fr,
                    current=np.zeros((len(jobs), p.T), dtype=int),
                    waited=np.zeros(len(jobs)))


def snap_objective(p: PlanningProblem, snap: Snapshot, X: np.ndarray) -> float:
    """Policy-side objective of an allocation: sum of w * remaining * iter_time over placed jobs."""
    tot = 0.0
    for r, i in enumerate(snap.jobs):
        if X[r].sum():
            tot += p.weight[i] * snap.remaining[r] * float(p.iter_time(int(i), X[r][None, :])[0])
    return tot


def count_vectors(limit: Sequence[int]) -> list[tuple[int, ...]]:
    """Every per-type count vector x with 0 <= x <= limit."""
    return list(itertools.product(*[range(int(n) + 1) for n in limit]))


# ---------------------------------------------------------------------------
# hypothesis: small random instances

TYPE_NAMES = ("v100", "p100", "k80")


@dataclass
class Instance:
    jobs: list[Job]
    cluster: Cluster
    profiles: dict[tuple[str, str], tuple[float, float, int]]
    sync: dict[tuple[str, str], float]

    @property
    def table(self) -> ThroughputTable:
        return make_table(self.profiles, self.sync)

    def problem(self) -> PlanningProblem:
        return PlanningProblem(self.jobs, self.cluster, self.table)


@st.composite
def instances(draw: st.DrawFn, max_jobs: int = 5, max_gpus: int = 12) -> Instance:
    """1-5 jobs on 2-3 GPU types, 1-12 GPUs in nodes of 1-4, random affine profiles.

    Every job fits (global batch <= its caps on the GPUs it may use), so
    PlanningProblem accepts every instance; arrivals, weights, model sizes,
    measured sync times and min/max GPU bounds vary.
    """
    T = draw(st.integers(2, 3))
    types = TYPE_NAMES[:T]
    total = draw(st.integers(1, max_gpus))
    # split `total` GPUs over the types (some may get none) and into nodes of 1-4
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=T - 1, max_size=T - 1)))
    per_type = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
    nodes: list[tuple[str, str, int]] = []
    for t, n in zip(types, per_type, strict=True):
        k = 0
        while n > 0:
            size = min(n, draw(st.integers(1, 4)))
            nodes.append((f"{t}-{k}", t, size))
            n -= size
            k += 1
    present = [t for t, n in zip(types, per_type, strict=True) if n > 0]
    intra = draw(st.sampled_from([100.0, 300.0]))
    inter = draw(st.sampled_from([1.0, 10.0, 25.0]))
    cluster = make_cluster(nodes, intra, inter)

    S = draw(st.integers(1, max_jobs))
    profiles: dict[tuple[str, str], tuple[float, float, int]] = {}
    sync: dict[tuple[str, str], float] = {}
    jobs: list[Job] = []
    for s in range(S):
        wl = f"w{s}"
        # each job profiled on at least one present type, maybe more
        prof = [t for t in types if draw(st.booleans())] or [draw(st.sampled_from(present))]
        if not set(prof) & set(present):
            prof.append(draw(st.sampled_from(present)))
        caps = {}
        for t in prof:
            a = draw(st.sampled_from([0.0, 0.005, 0.02, 0.1]))
            c = draw(st.floats(0.0005, 0.01))
            cap = draw(st.integers(4, 64))
            profiles[(wl, t)] = (a, c, cap)
            caps[t] = cap
            if draw(st.booleans()):
                sync[(wl, t)] = draw(st.floats(0.0, 0.05))
        usable = sorted((caps[t] for t in prof if t in present for _ in range(
            per_type[types.index(t)])), reverse=True)
        gb = draw(st.integers(1, min(sum(usable), 96)))
        # GPUs that can hold gb at all, and the smallest such count
        k_need = next(k for k in range(1, len(usable) + 1) if sum(usable[:k]) >= gb)
        k_max = min(len(usable), gb)
        min_gpus = draw(st.integers(1, k_need)) if draw(st.booleans()) else 1
        max_gpus = draw(st.integers(k_need, k_max)) if draw(st.booleans()) else None
        jobs.append(Job(
            name=f"j{s}", workload=wl,
            dataset_size=draw(st.integers(gb, 200 * gb)),
            epochs=draw(st.sampled_from([1, 2, 3, 0.5])),
            global_batch=gb,
            weight=draw(st.sampled_from([1.0, 1.0, 2.0, 0.5, 3.0])),
            arrival_s=draw(st.sampled_from([0.0, 0.0, 5.0, 30.0, 120.0])),
            model_size_mb=draw(st.sampled_from([0.0, 0.0, 10.0, 100.0])),
            min_gpus=min_gpus, max_gpus=max_gpus,
            requested_gpus=draw(st.one_of(st.none(), st.integers(1, 4))),
        ))
    return Instance(jobs, cluster, profiles, sync)


# ---------------------------------------------------------------------------
# plan checks (independent of the evaluator's own bookkeeping)


def close(x: float, y: float, rel: float = 1e-7, abs_: float = 1e-6) -> bool:
    return math.isclose(x, y, rel_tol=rel, abs_tol=abs_)


def segment_iteration_time(p: PlanningProblem, i: int, seg) -> tuple[float, float]:  # noqa: ANN001
    """(compute, comm) of a segment recomputed from its workers and the model."""
    tindex = {t: k for k, t in enumerate(p.types)}
    comp = max(p.a[i, tindex[w.gpu_type]] + p.c[i, tindex[w.gpu_type]] * w.local_batch
               for w in seg.workers)
    K = len(seg.workers)
    if K == 1:
        return comp, 0.0
    single = len({w.node for w in seg.workers}) == 1
    bw = p.cluster.intra_node_gbps if single else p.cluster.inter_node_gbps
    if p.model_mb[i] > 0:
        comm = 2 * (K - 1) / K * p.model_mb[i] * BITS_PER_MB / (bw * 1e9)
    else:
        comm = max(p.sync[i, tindex[w.gpu_type]] for w in seg.workers)
    return float(comp), float(comm)


def check_plan(p: PlanningProblem, plan: Plan, *, restart_cost_s: float = 60.0) -> None:
    """Every invariant a plan of any policy must satisfy (see test_evaluator).

    A job of ``p.running_gpus`` the plan started there (replan: it ran before the plan)
    pays the restart in its first segment unless that segment continues it where it
    runs, from the start."""
    started = set((plan.notes.keep_or_move or {}).get("started", ()))
    assert started <= set(p.running_gpus)
    assert [j.name for j in plan.jobs] == [j.name for j in p.jobs]
    tindex = {t: k for k, t in enumerate(p.types)}
    gpu_set = {(g.node, g.gpu_type, g.index) for g in p.cluster.gpus}
    busy: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for i, (job, jp) in enumerate(zip(p.jobs, plan.jobs, strict=True)):
        assert jp.segments, f"{job.name} never ran"
        assert jp.start_s >= job.arrival_s - 1e-9, f"{job.name} starts before it arrives"
        its = 0.0
        prev_end = -math.inf
        prev_workers = None
        for k, seg in enumerate(jp.segments):
            assert seg.start_s <= seg.end_s + 1e-9
            assert seg.start_s >= prev_end - 1e-6, f"{job.name}: segments overlap"
            # local batches: sum to the global batch, each 1..cap of its GPU type
            assert sum(w.local_batch for w in seg.workers) == job.global_batch
            for w in seg.workers:
                assert (w.node, w.gpu_type, w.gpu) in gpu_set, f"unknown GPU {w}"
                t = tindex[w.gpu_type]
                assert p.allowed[i, t], f"{job.name} placed on a type it may not use"
                assert 1 <= w.local_batch <= p.cap[i, t]
            assert len({(w.node, w.gpu) for w in seg.workers}) == len(seg.workers)
            assert p.lo[i] <= len(seg.workers) <= p.hi[i]
            # the segment's timing follows from its workers and the model
            comp, comm = segment_iteration_time(p, i, seg)
            assert close(seg.compute_s, comp, 1e-9, 1e-12), (seg.compute_s, comp)
            assert close(seg.comm_s, comm, 1e-9, 1e-12), (seg.comm_s, comm)
            if seg.group is None:  # a co-located group's iteration: check_groups
                assert close(seg.iteration_s, comp + comm, 1e-9, 1e-12)
            key = sorted((w.node, w.gpu) for w in seg.workers)
            regrouped = k > 0 and key == prev_workers and close(seg.start_s, prev_end) and (
                seg.group is not None or jp.segments[k - 1].group is not None)
            # restart cost: charged exactly when the job had run before (not when only
            # its co-located group changed around it)
            ran = sorted((str(n), int(g)) for n, g in p.running_gpus.get(job.name, [])
                         if job.name in started)
            moved_first = k == 0 and bool(ran) and (key != ran or seg.start_s > 1e-9)
            assert seg.restart_s == (restart_cost_s if (k > 0 and not regrouped)
                                     or moved_first else 0.0), (job.name, k, seg.restart_s)
            if k > 0 and close(seg.start_s, prev_end) and not regrouped:
                assert key != prev_workers, f"{job.name}: new segment with the same workers"
            dur = seg.end_s - seg.start_s
            if seg.iterations > 0:
                assert close(dur, seg.restart_s + seg.iterations * seg.iteration_s, 1e-6, 1e-6)
            else:
                assert dur <= seg.restart_s + 1e-6
            its += seg.iterations
            prev_end = seg.end_s
            prev_workers = sorted((w.node, w.gpu) for w in seg.workers)
            for w in seg.workers:
                busy.setdefault((w.node, w.gpu), []).append((seg.start_s, seg.end_s, job.name,
                                                             seg.group))
        assert close(its, p.iters[i], 1e-7, 1e-6), (job.name, its, p.iters[i])
        assert close(jp.end_s, jp.segments[-1].end_s)
    # no GPU serves two jobs at overlapping times
    for g, spans in busy.items():
        spans.sort()
        for k, (s1, _e1, n1, g1) in enumerate(spans):  # co-located: only within one group
            for _s0, e0, n0, g0 in spans[:k]:
                assert s1 >= e0 - 1e-6 * max(1.0, e0) or (g0 is not None and g0 == g1), \
                    f"GPU {g}: {n0} and {n1} overlap"
    # the objective is what the job end times say
    wjct = sum(j.weight * (jp.end_s - j.arrival_s) for j, jp in zip(p.jobs, plan.jobs,
                                                                      strict=True))
    assert close(plan.weighted_jct_s, wjct)
    assert close(plan.avg_jct_s, sum(jp.end_s - j.arrival_s for j, jp in
                                     zip(p.jobs, plan.jobs, strict=True)) / p.S)
    assert close(plan.makespan_s, max(jp.end_s for jp in plan.jobs) - min(p.arrival))
    # a valid lower bound
    assert plan.lower_bound_s <= plan.weighted_jct_s * (1 + 1e-9) + 1e-9, (
        plan.policy, plan.lower_bound_s, plan.weighted_jct_s)


def moved_running_job(plan: Plan) -> bool:
    """True if any job was moved or preempted: a later segment on other GPUs, or after a gap.

    A new segment on the same GPUs right after the last is an elastic job's batch
    rescaled in place (docs/elastic.md), which costs no restart.
    """
    for jp in plan.jobs:
        for a, b in zip(jp.segments, jp.segments[1:], strict=False):
            gpus_a = sorted((w.node, w.gpu) for w in a.workers)
            gpus_b = sorted((w.node, w.gpu) for w in b.workers)
            if gpus_a != gpus_b or b.start_s > a.end_s + 1e-6:
                return True
    return False
