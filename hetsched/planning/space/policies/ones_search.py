"""ONES's genome, its feasibility repair, its SRUF score (Bian et al., Sec. 3.2) and
the evolution's operators: uniform crossover, uniform mutation, selection (Sec. 3.3).

A candidate schedule maps every GPU (a *slot*: GPUs of one type are
interchangeable for the model, the evaluator's placer picks the concrete
ones and packs them onto few nodes) to a job or to nothing, and gives each
job on it a global batch. The per-GPU local batches follow from the global
batch by the evaluator's exact water-filling shares (ONES encodes them in
the genome directly; deriving them is what the paper's workers would be
told anyway, and it keeps every candidate's shares optimal).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hetsched.core.efficiency import efficiency
from hetsched.core.model import continuous_time_counts
from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.timeline import RESCALE_IN_PLACE_S

INF = float("inf")


@dataclass
class Cand:
    owner: np.ndarray  # (K,) job index per slot, -1 idle
    batch: dict[int, int] = field(default_factory=dict)

    def copy(self) -> Cand:
        return Cand(self.owner.copy(), dict(self.batch))

    def jobs(self) -> list[int]:
        return [int(i) for i in np.unique(self.owner) if i >= 0]

    def key(self, slot_type: np.ndarray, T: int) -> tuple[object, ...]:
        """Counts and batches (what the evaluator sees): equal keys are the same schedule."""
        out: list[object] = []
        for i in self.jobs():
            out.append((i, tuple(np.bincount(slot_type[self.owner == i], minlength=T).tolist()),
                        self.batch.get(i)))
        return tuple(out)


class Model:
    """Per-problem timing and the batch rules one candidate must satisfy."""

    def __init__(self, p: PlanningProblem, use_efficiency: bool) -> None:
        self.p = p
        self.slot_type = np.repeat(np.arange(p.T), p.n_type)
        self.K = len(self.slot_type)
        self.use_eff = use_efficiency
        self._it: dict[tuple[int, tuple[int, ...], int], float] = \
            p.estimates.extra.setdefault("ones_it", {})

    # -- batch ranges --------------------------------------------------
    def batch_range(self, i: int) -> tuple[int, int]:
        el = self.p.jobs[i].elastic
        B0 = int(self.p.B[i])
        return (el.min_batch, el.max_batch) if el is not None else (B0, B0)

    def counts(self, c: Cand, i: int) -> np.ndarray:
        return np.bincount(self.slot_type[c.owner == i], minlength=self.p.T)

    def feasible_batches(self, i: int, n: np.ndarray, limit: int | None) -> tuple[int, int]:
        """[lo, hi] of global batches job i may run with counts n (lo > hi: none)."""
        p = self.p
        k = int(n.sum())
        blo, bhi = self.batch_range(i)
        held = int((p.cap[i] * n).sum())
        hi = min(bhi, held, limit if limit is not None else bhi)
        lo = max(blo, k)
        if k < p.lo[i] or k > p.hi[i] or (n[~p.allowed[i]] > 0).any():
            return 1, 0
        return lo, hi

    # -- time ----------------------------------------------------------
    def iter_time(self, i: int, n: np.ndarray, B: int) -> float:
        key = (i, tuple(n.tolist()), B)
        hit = self._it.get(key)
        if hit is None:
            p = self.p
            # the evaluator's model: piecewise curves where the affine fit is poor
            comp = continuous_time_counts(p.a[i], p.c[i], p.cap[i], n[None, :], float(B),
                                          p.curves[i])[0]
            hit = float(comp + p.comm_estimate(i, n[None, :])[0])
            self._it[key] = hit
        return hit

    def per_work(self, i: int, n: np.ndarray, B: int) -> float:
        """Seconds per iteration of remaining work (counted at the spec's batch B0)."""
        p = self.p
        B0 = int(p.B[i])
        el = p.jobs[i].elastic
        eff = efficiency(B, B0, el.noise_scale) if (el is not None and self.use_eff) else 1.0
        return self.iter_time(i, n, B) * B0 / (B * eff)


def repair(m: Model, c: Cand, limit: dict[int, int], max_gpus: dict[int, int],
           frozen: set[int]) -> Cand:
    """Make ``c`` feasible: drop disallowed or surplus GPUs, clamp batches, drop what cannot run."""
    p = m.p
    for i in c.jobs():
        if i in frozen:
            continue
        slots = np.nonzero(c.owner == i)[0]
        bad = [s for s in slots if not p.allowed[i, m.slot_type[s]]]
        c.owner[bad] = -1
        slots = np.nonzero(c.owner == i)[0]
        cap_k = min(int(p.hi[i]), max_gpus.get(i, int(p.hi[i])))
        if len(slots) > cap_k:
            c.owner[slots[cap_k:]] = -1
        n = m.counts(c, i)
        lo, hi = m.feasible_batches(i, n, limit.get(i))
        if lo > hi:
            c.owner[c.owner == i] = -1
            c.batch.pop(i, None)
            continue
        c.batch[i] = int(min(max(c.batch.get(i, hi), lo), hi))
    for i in list(c.batch):
        if not (c.owner == i).any():
            c.batch.pop(i)
    return c


def reorder(m: Model, c: Cand) -> Cand:
    """ONES's reorder: within each GPU type, a job's slots become contiguous, jobs in order of
    first occurrence (the placer then packs each job onto few nodes)."""
    first: dict[int, int] = {}
    for s, i in enumerate(c.owner.tolist()):
        if i >= 0 and i not in first:
            first[i] = s
    for t in range(m.p.T):
        idx = np.nonzero(m.slot_type == t)[0]
        block = c.owner[idx].tolist()
        block.sort(key=lambda i: (i == -2, i == -1, first.get(i, 0)))
        c.owner[idx] = block
    return c


def sruf(m: Model, c: Cand, jobs: np.ndarray, W: np.ndarray,
         current: dict[int, tuple[tuple[int, ...], int]], restart_s: float,
         waiting_time: dict[int, tuple[int, float]]) -> float:
    """Expected SRUF utilization (ONES eq. 8): sum over jobs of GPUs x remaining time.

    ``W`` is (draws, len(jobs)) remaining work; a job the candidate leaves
    waiting counts its minimal GPU set for the time until the candidate's
    first job ends plus its own run there. The restart is priced as lost
    progress: a running job the candidate moves to other GPUs adds
    ``restart_s`` (the evaluator's restart cost; its GPUs idle meanwhile), one
    it preempts pays it when it resumes, and one rescaled in place (same GPUs,
    new batch) only the in-place overhead ``RESCALE_IN_PLACE_S``.

    A GPU the candidate leaves idle that an active job could use counts as
    wasted until the candidate's first job ends. ONES's candidates have none
    (its refresh fills every idle GPU); hetsched also scores the incumbent,
    which grows no running job when a move costs a restart, and without this
    term SRUF would prefer idle GPUs to any growth that costs a restart.
    """
    T = np.zeros(W.shape[0])
    run_T: list[np.ndarray] = []
    wait_rows: list[int] = []
    total = np.zeros(W.shape[0])
    for r, i in enumerate(jobs):
        i = int(i)
        n = m.counts(c, i)
        k = int(n.sum())
        if k == 0:
            wait_rows.append(r)
            continue
        B = c.batch[i]
        t = W[:, r] * m.per_work(i, n, B)
        cur = current.get(i)
        if cur is not None and cur[0] != tuple(n.tolist()):
            t = t + restart_s
        elif cur is not None and cur[1] != B:
            t = t + RESCALE_IN_PLACE_S
        run_T.append(t)
        total += k * t
    first = np.min(np.stack(run_T), axis=0) if run_T else T
    usable = m.p.allowed[jobs].any(axis=0)[m.slot_type[c.owner == -1]]
    total += int(usable.sum()) * first
    if wait_rows:
        for r in wait_rows:
            i = int(jobs[r])
            k_min, t_min = waiting_time[i]
            rc = restart_s if i in current else 0.0  # a preempted running job restarts later
            total += k_min * (first + rc + W[:, r] * t_min)
    return float(total.mean())


def crossover(rng: np.random.Generator, K: int, a: Cand, b: Cand) -> list[Cand]:
    """Uniform crossover: each of the ``K`` GPUs from one parent or the other."""
    mask = rng.random(K) < 0.5
    c1 = Cand(np.where(mask, a.owner, b.owner), {**b.batch, **a.batch})
    c2 = Cand(np.where(mask, b.owner, a.owner), {**a.batch, **b.batch})
    return [c1, c2]


def mutate(rng: np.random.Generator, rate: float, c: Cand, frozen: set[int]) -> Cand:
    """Uniform mutation: each job not ``frozen`` preempted with ``rate``, else its batch
    doubled or halved with ``rate``."""
    c = c.copy()
    for i in c.jobs():
        if i in frozen:
            continue
        if rng.random() < rate:
            c.owner[c.owner == i] = -1  # preempted; the fill gives its GPUs to others
        elif rng.random() < rate:
            c.batch[i] = int(c.batch[i] * (2.0 if rng.random() < 0.5 else 0.5))
    return c


def select(rng: np.random.Generator, m: Model, n_pop: int, cands: list[Cand],
           score: Callable[[Cand], float]) -> list[Cand]:
    """Unique candidates by score; the best kept, the rest sampled from the top 2P."""
    seen: dict[tuple[object, ...], Cand] = {}
    for c in cands:
        seen.setdefault(c.key(m.slot_type, m.p.T), c)
    uniq = list(seen.values())
    s = np.array([score(c) for c in uniq])
    order = np.argsort(s, kind="stable")[: 2 * n_pop]
    best = [uniq[int(order[0])]]
    rest = order[1:]
    if len(rest) > n_pop - 1:  # non-finite scores (a job that cannot run): least
        d = np.nan_to_num(s[rest] - s[order[0]], nan=np.inf)  # likely, never impossible
        fin = np.isfinite(d)
        spread = max(float(d[fin].std()) if fin.any() else 0.0, 1e-9)
        w = np.exp(-np.clip(np.where(fin, d, np.inf) / spread, 0.0, 700.0))
        rest = rng.choice(rest, size=n_pop - 1, replace=False, p=w / w.sum())
        rest = rest[np.argsort(s[rest], kind="stable")]
    return best + [uniq[int(j)] for j in rest]
