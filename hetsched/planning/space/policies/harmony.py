"""Harmony (Lee et al.): co-located job groups.

``harmony`` groups jobs with complementary COMP/COMM use onto shared GPUs
(Algorithm 1, :mod:`.harmony_model`) and regroups at arrivals and
completions with the paper's preference for small changes (§IV-B4): the
groups of the last event are kept (a finished member replaced by a waiting
job within 5% of its iteration time and comp/comm ratio; waiting jobs
grouped on the free GPUs); regrouping the finished job's group with the
smallest group, or everything, replaces that only if eq. (4)'s utilisation
rises by more than 5%. Free GPUs left over go to waiting jobs alone.
``naive-colocation`` is the paper's naively co-located baseline: random
groups of ``group_size``, GPUs split evenly, no subtask coordination (the
evaluator times its groups as time slicing); run it with several seeds for
the best and worst case. Isolated allocation is every other space policy.
The evaluator times every group (eq. (1) or Gavel's measured pairs) and
checks GPU memory (:mod:`hetsched.planning.space.groups`).
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

import numpy as np

from hetsched.core.colocation import fits_memory
from hetsched.core.memory import job_state_gb, type_memory_gb
from hetsched.core.problem import PlanningProblem
from hetsched.errors import InputError
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import fastest_types, min_feasible
from hetsched.planning.space.policies.harmony_model import (
    Grouping,
    Jobs,
    allocate_machines,
    min_dop,
    schedule,
    utilisation,
)

#: Harmony's threshold: a job is "similar" and a regrouping "pays" at 5% (§IV-B4)
SIMILAR = 0.05


def _score(u: tuple[float, float]) -> float:
    """GPU utilisation first (it is what makes progress), the network as a tie-break."""
    return u[0] + 1e-3 * u[1]


class _Colocating(Policy):
    """Shared by the co-locating policies: group ids kept stable across events, X built."""

    colocates: ClassVar[bool] = True
    coordinated: ClassVar[bool] = True
    auto = False

    def __init__(self) -> None:
        self._gid: dict[int, str] = {}
        self._sets: dict[frozenset[int], str] = {}
        self._count = 0

    def group_of(self, i: int) -> str | None:
        return self._gid.get(int(i))

    def adopt(self, groups: dict[int, str | None]) -> None:
        """The evaluator's word on the groups it applied (it may keep the running ones
        where moving them would not pay for their restarts)."""
        self._gid = {int(i): g for i, g in groups.items() if g is not None}
        sets: dict[str, set[int]] = {}
        for i, g in self._gid.items():
            sets.setdefault(g, set()).add(i)
        self._sets = {frozenset(v): g for g, v in sets.items()}

    def _emit(self, p: PlanningProblem, snap: Snapshot, J: Jobs, g: Grouping) -> np.ndarray:
        """Per-type counts (one type per group) and group ids; groups that fit nowhere wait."""
        X = np.zeros((len(snap.jobs), p.T), dtype=int)
        free = snap.free.astype(int).copy()
        mem = type_memory_gb(p.cluster, p.types)
        self._gid = {}
        sets: dict[frozenset[int], str] = {}
        # each group with its own type preference; a group split into singles has none
        queue: list[tuple[np.ndarray, int, list[int] | None]] = [
            (np.asarray(ms), int(m), pref)
            for ms, m, pref in zip(g.members, g.dop, _type_prefs(p, J, g, mem), strict=True)]
        while queue:
            members, m, pref = queue.pop(0)
            ids = [int(J.ids[k]) for k in members]
            fast = [t for t in pref if free[t] >= m] if pref is not None else []
            got = (fast[0], m) if fast else self._type_for(p, ids, m, free, mem)
            if got is None:  # a group that fits nowhere: its members try alone
                if len(members) > 1:
                    queue += [(members[k:k + 1], m, None) for k in range(len(members))]
                else:  # alone, on several types if one cannot hold its batch
                    x = min_feasible(p, ids[0], free, fastest_types(p, ids[0]))
                    X[members[0]] = x
                    free -= x
                continue
            t, m = got
            free[t] -= m
            X[members, t] = m
            key = frozenset(ids)
            gid = self._sets.get(key)
            if gid is None:
                self._count += 1
                gid = f"g{self._count}"
            sets[key] = gid
            for i in ids:
                self._gid[i] = gid
        self._sets = sets
        for r in np.nonzero(X.sum(axis=1) == 0)[0]:  # work conservation: the rest alone
            if not free.any():
                break
            i = int(snap.jobs[r])
            X[r] = min_feasible(p, i, free, fastest_types(p, i))
            free -= X[r]
        return X

    @staticmethod
    def _type_for(p: PlanningProblem, ids: list[int], m: int, free: np.ndarray,
                  mem: np.ndarray) -> tuple[int, int] | None:
        """(GPU type, GPU count) a group runs on: the type where its members compute
        fastest at ``m`` GPUs among those with ``m`` free, then the others by free GPUs
        (whether a running group's move pays is the evaluator's keep/fresh decision); the count nearest ``m`` (more first) that
        holds every member's batch and fits the GPU's memory."""
        state = [job_state_gb(p.jobs[i]) for i in ids]
        lo, hi = int(p.lo[ids].max()), int(min(p.hi[ids].min(), p.B[ids].min()))
        comp = (p.a[ids] + p.c[ids] * np.ceil(p.B[ids] / max(m, 1))[:, None]).sum(axis=0)
        comp = np.where(p.allowed[ids].all(axis=0) & (free >= m), comp, np.inf)
        order = [int(t) for t in np.argsort(comp, kind="stable") if np.isfinite(comp[t])]
        order += [int(t) for t in np.argsort(-free, kind="stable")]
        for t in order:
            if not p.allowed[ids, t].all():
                continue
            top = min(hi, int(free[t]))
            for k in [m, *range(m + 1, top + 1), *range(m - 1, lo - 1, -1)]:
                if not lo <= k <= top:
                    continue
                b = np.ceil(p.B[ids] / k)
                if (b > p.cap[ids, t]).any():
                    continue
                if len(ids) == 1 or fits_memory(state, b.tolist(), p.mem_cap[ids, t].tolist(),
                                            float(mem[t])):
                    return t, k
        return None


def _type_prefs(p: PlanningProblem, J: Jobs, g: Grouping, mem: np.ndarray) -> list[list[int]]:
    """Per group, the types on which it fits at its DoP as it is (members allowed, batches
    within the caps, memory), fastest first: the common case, vectorised over groups."""
    if not g.members:
        return []
    sizes = np.array([len(ms) for ms in g.members])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ids = J.ids[np.concatenate(g.members).astype(int)]
    m = np.repeat(g.dop, sizes)
    b = np.ceil(p.B[ids] / m)
    okj = p.allowed[ids] & (b[:, None] <= p.cap[ids]) & (m <= p.B[ids])[:, None] \
        & (m >= p.lo[ids])[:, None] & (m <= p.hi[ids])[:, None]
    ok = np.minimum.reduceat(okj.astype(int), starts, axis=0) > 0
    state = np.array([job_state_gb(p.jobs[i]) for i in ids])
    per = np.maximum(0.0, mem[None, :] - state[:, None]) / np.maximum(1, p.mem_cap[ids])
    used = np.add.reduceat(state[:, None] + per * b[:, None], starts, axis=0)
    ok &= (sizes[:, None] == 1) | (used <= mem[None, :] * (1 + 1e-9))
    comp = np.add.reduceat(p.a[ids] + p.c[ids] * b[:, None], starts, axis=0)
    comp = np.where(ok, comp, np.inf)
    order = np.argsort(comp, axis=1, kind="stable")
    return [[int(t) for t in row if np.isfinite(c[t])] for row, c in zip(order, comp,
                                                                         strict=True)]


def _ref_jobs(p: PlanningProblem, snap: Snapshot) -> tuple[Jobs, int]:
    return Jobs.build(p, snap.jobs, snap.free), int(snap.free.sum())


@register
class Harmony(_Colocating):
    name = "harmony"
    paper = "Lee et al., Harmony (Samsung Research / SNU), §IV-B Algorithm 1"
    summary = ("Co-locates jobs with complementary compute/communication on shared GPUs "
               "(opt-in; not in auto)")

    def __init__(self, *, grow: float = 1.25) -> None:
        """``grow``: factor by which Algorithm 1's rounds grow the jobs considered."""
        super().__init__()
        if not grow > 1.0:
            raise InputError("--param", f"grow must be > 1, got {grow!r}")
        self.grow = float(grow)

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        J, M = _ref_jobs(problem, snap)
        n = len(snap.jobs)
        running = snap.current.sum(axis=1) > 0
        order = np.concatenate([np.nonzero(running)[0], np.nonzero(~running)[0]])
        if not running.any():  # nothing to keep: Algorithm 1 on every job
            return self._emit(problem, snap, J, _fill(J, schedule(J, order, M, self.grow),
                                                      np.arange(n), M))
        keep = self._keep(J, snap, M)
        cands = [keep]
        if keep.members and len(keep.members) > 1:
            cands.append(self._partial(J, snap, keep, M))
        cands.append(schedule(J, order, M, self.grow))
        best = cands[0]
        for c in cands[1:]:  # fewer jobs regrouped first; more only for > 5% utilisation
            if _score(c.u) > _score(best.u) * (1 + SIMILAR):
                best = c
        best = _fill(J, best, np.arange(n), M)
        return self._emit(problem, snap, J, best)

    def _previous(self, snap: Snapshot) -> list[np.ndarray]:
        """Last event's groups among the running jobs (finished members gone)."""
        by: dict[str, list[int]] = {}
        for r, i in enumerate(snap.jobs):
            g = self._gid.get(int(i))
            if g is not None and snap.current[r].sum() > 0:
                by.setdefault(g, []).append(r)
        return [np.array(v) for v in by.values()]

    def _keep(self, J: Jobs, snap: Snapshot, M: int) -> Grouping:
        """Keep the groups; refill a shrunken group with a similar waiting job; group the rest."""
        groups = self._previous(snap)
        dop = np.array([float(snap.current[g[0]].sum()) for g in groups])
        waiting = [r for r in range(len(snap.jobs)) if snap.current[r].sum() == 0]
        before = Counter(self._gid.values())
        for k, ms in enumerate(groups):
            if before[self._gid[int(J.ids[ms[0]])]] <= len(ms) or not waiting:
                continue
            r = _similar(J, ms, waiting, float(dop[k]))
            if r is not None:
                groups[k] = np.append(ms, r)
                waiting.remove(r)
        g = Grouping(groups, dop)
        left = M - int(dop.sum())
        if waiting and left > 0:
            new = schedule(J, np.array(waiting), left, self.grow)
            g = Grouping(groups + new.members, np.concatenate([dop, new.dop]))
        g.u = utilisation(J, g, M)
        return g

    def _partial(self, J: Jobs, snap: Snapshot, keep: Grouping, M: int) -> Grouping:
        """Regroup the smallest group with the waiting jobs on their GPUs and the free ones."""
        k = int(np.argmin([len(g) for g in keep.members]))
        others = [j for j in range(len(keep.members)) if j != k]
        fixed = [keep.members[j] for j in others]
        used = int(keep.dop[others].sum())
        taken = set(np.concatenate(fixed).tolist()) if fixed else set()
        pool = np.array([r for r in range(len(snap.jobs)) if r not in taken])
        new = schedule(J, pool, M - used, self.grow)
        g = Grouping(fixed + new.members, np.concatenate([keep.dop[others], new.dop]))
        g.u = utilisation(J, g, M)
        return g


def _similar(J: Jobs, g: np.ndarray, waiting: list[int], m: float) -> int | None:
    """A waiting job within 5% of the group's mean iteration time and comp/comm ratio."""
    cp, cm = J.comp(m), J.comm(m)
    it, ratio = cp + cm, cp / np.maximum(cm, 1e-12)
    ref_it, ref_ratio = it[g].mean(), ratio[g].mean()
    for r in waiting:
        if abs(it[r] - ref_it) <= SIMILAR * ref_it and abs(ratio[r] - ref_ratio) <= \
                SIMILAR * ref_ratio and np.isfinite(min_dop(J, np.append(g, r))) and \
                min_dop(J, np.append(g, r)) <= m:
            return r
    return None


def _fill(J: Jobs, g: Grouping, rows: np.ndarray, M: int) -> Grouping:
    """Work conservation: GPUs no group uses go to waiting jobs, each alone."""
    grouped = set(np.concatenate(g.members).tolist()) if g.members else set()
    waiting = [r for r in rows if r not in grouped]
    left = M - int(g.dop.sum())
    if not waiting or left <= 0:
        return g
    alone = allocate_machines(J, [np.array([r]) for r in waiting], left)
    out = Grouping(g.members + alone.members, np.concatenate([g.dop, alone.dop]))
    out.u = utilisation(J, out, M)
    return out


@register
class NaiveColocation(_Colocating):
    name = "naive-colocation"
    paper = "Harmony §V-A baseline (Gandiva-like): co-located without coordination"
    summary = "Random groups sharing GPUs evenly, no subtask coordination (baseline)"
    coordinated = False

    def __init__(self, *, group_size: int = 2, seed: int = 0) -> None:
        """``group_size``: jobs per group; ``seed``: the random grouping (best/worst over seeds)."""
        super().__init__()
        if group_size < 1:
            raise InputError("--param", f"group_size must be >= 1, got {group_size!r}")
        self.group_size, self.seed = int(group_size), int(seed)
        self.rng = np.random.default_rng(seed)

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        J, M = _ref_jobs(problem, snap)
        running = [r for r in range(len(snap.jobs)) if snap.current[r].sum() > 0]
        by: dict[str, list[int]] = {}
        for r in running:
            by.setdefault(self._gid.get(int(snap.jobs[r]), f"r{r}"), []).append(r)
        kept = [np.array(v) for v in by.values()]
        dop = np.array([float(snap.current[g[0]].sum()) for g in kept])
        waiting = np.array([r for r in range(len(snap.jobs)) if snap.current[r].sum() == 0])
        left = M - int(dop.sum())
        g = Grouping(kept, dop)
        if len(waiting) and left > 0:
            self.rng.shuffle(waiting)
            new = [waiting[k:k + self.group_size]
                   for k in range(0, len(waiting), self.group_size)]
            each = max(1, left // len(new))
            ok, dops = [], []
            while new:  # an even split, or a group's minimum where that is more
                n = new.pop(0)
                need = min_dop(J, n)
                m = min(max(float(each), need), float(J.hi[n].min()))
                if np.isfinite(need) and need <= m <= left:
                    ok.append(n)
                    dops.append(m)
                    left -= int(m)
                elif len(n) > 1:  # the group does not fit: its members try alone
                    new += [n[k:k + 1] for k in range(len(n))]
            g = Grouping(kept + ok, np.concatenate([dop, dops]) if ok else dop)
        return self._emit(problem, snap, J, g)


__all__ = ["Harmony", "NaiveColocation", "SIMILAR"]
