"""Smith's rule on the whole cluster: a space plan for pool mode to start from.

On the pool's costs (:func:`.space_seed.pool_costs_problem`) a job pays one
synchronisation per round and no pass's fixed cost per step (fused passes), so
its step falls nearly in proportion to the GPUs it gets: jobs are close to
perfectly divisible work. For divisible jobs that arrive together, running
them one at a time on the whole cluster, in order of weighted processing time
(Smith's rule), minimises the total weighted completion time (GPU types that
rank jobs differently, and arrivals, make it a heuristic: re-deciding at each
arrival is the usual one). The space planners instead give every admitted job
some GPUs at each event (HAS's and exhaustive's search starts there), which on
these costs only stretches every job.

:class:`WholeClusterSmith` is that order as a space policy: at each event the
jobs, by remaining iterations times their step on every GPU they may use,
over their weight, each take, fastest type first (or the types where it has an
advantage over the other jobs first), the free GPUs that each add at least a
share of their own speed (up to what its batch can use); what the first cannot
use goes to the next. Which share and type order are best depends on the jobs,
so :func:`smith_plan` keeps the lowest plan over a fixed grid of both (of those
whose task plan pool mode would make). It runs on the pool's costs only (on
space mode's own costs the intercepts make it a poor plan), so it is not a
registered policy. Pool mode turns its plan into a task plan and starts from
it where that is among the lowest (:func:`.space_seed.space_work`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Policy, Snapshot

#: a job takes more GPUs of a type only while they add at least this share of their own
#: samples a second each (so a job on a pool's costs, nearly divisible, takes most of the
#: cluster; one whose synchronisation grows with its GPUs stops where it stops paying).
#: No one share wins everywhere, and the plan moves in steps as the share crosses what
#: one job's next GPUs add (a job that stops early leaves GPUs to the next), so
#: :func:`smith_plan` simulates every share of this fixed grid, 1.0 down to 0.2 by 0.05,
#: and keeps the lowest plan: the same input gives the same plan
EFFICIENCIES = tuple(round(1.0 - 0.05 * k, 2) for k in range(17))
#: which types a job takes first: its fastest, or those where its speed relative to its
#: fastest is highest against the other jobs' ("advantage": a job nearly as fast on a
#: slow type as on its best leaves the best to jobs that need it); :func:`smith_plan`
#: tries both at every share
TYPE_ORDERS = ("fastest", "advantage")


class WholeClusterSmith(Policy):
    """Smith's rule over the whole cluster, re-decided at every event (module docstring)."""

    name = "whole-cluster-smith"
    summary = "jobs by weighted time alone on every GPU; each takes what shortens its step"
    paper = "Smith's rule (WSPT) for divisible jobs; pool mode's seed on its own costs"

    def __init__(self, efficiency: float = 0.5, types: str = "fastest") -> None:
        super().__init__()
        if types not in TYPE_ORDERS:
            raise ValueError(f"types: {types!r}; valid: {', '.join(TYPE_ORDERS)}")
        #: the least share of its own samples a second each GPU a job takes must add
        self.efficiency = float(efficiency)
        #: which of its types a job takes first (:data:`TYPE_ORDERS`)
        self.types = types
        #: job -> (its types in the order it takes them; one GPU's samples a second per type)
        self._rates: dict[int, tuple[list[int], np.ndarray]] = {}
        #: (T,) the jobs' mean speed on each type relative to their fastest ("advantage")
        self._demand: np.ndarray | None = None
        #: job -> its step on what it takes of the whole cluster, over its weight (inf:
        #: it cannot run); the same at every event
        self._alone: dict[int, float] = {}

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        key = np.full(len(snap.jobs), np.inf)
        for r, i in enumerate(snap.jobs.tolist()):
            if i not in self._alone:
                n = self._take(p, i, p.n_type)
                self._alone[i] = p.iter_time1(i, _tup(n)) / max(float(p.weight[i]), 1e-12) \
                    if n.sum() else np.inf
            key[r] = float(snap.remaining[r]) * self._alone[i]
        X = np.zeros((len(snap.jobs), p.T), dtype=int)
        free = snap.free.copy()
        for r in np.argsort(key, kind="stable").tolist():
            if not free.any():  # the rest get no GPU (and inf keys sort last)
                break
            if not np.isfinite(key[r]):
                continue
            n = self._take(p, int(snap.jobs[r]), free)
            X[r] = n
            free = free - n
        return X

    def _take(self, p: PlanningProblem, i: int, free: np.ndarray) -> np.ndarray:
        """Job i's counts from ``free``: each type in its order (:meth:`_order`), the
        most of its free GPUs (halving) that each add ``efficiency`` of their speed, or
        all of them while the job cannot run yet (fewer than its least GPUs, or its
        batch not held); up to ``min(hi, B)`` GPUs; zeros where nothing runs it."""
        if i not in self._rates:
            rate = p.per_gpu_rate(i)
            self._rates[i] = (self._order(p, i, rate), rate)
        order, rate = self._rates[i]
        n = np.zeros(p.T, dtype=int)
        best, left, lo = np.inf, int(min(p.hi[i], p.B[i])), int(p.lo[i])
        B = float(p.B[i])
        for t in order:
            c = min(int(free[t]), left)
            while c > 0:
                m = n.copy()
                m[t] = c
                step = p.iter_time1(i, _tup(m)) if m.sum() >= lo else np.inf
                if not np.isfinite(best):  # not running yet: take them all
                    n, best, left = m, step, left - c
                    break
                # the most GPUs of t that each add at least `efficiency` of their own speed
                if B / step - B / best >= self.efficiency * c * float(rate[t]):
                    n, best, left = m, step, left - c
                    break
                c //= 2
        return n if np.isfinite(best) else np.zeros(p.T, dtype=int)

    def _order(self, p: PlanningProblem, i: int, rate: np.ndarray) -> list[int]:
        """Job i's allowed types, fastest first, or ("advantage") by its speed on each
        relative to its fastest over the jobs' mean of that ratio: a type the job runs
        nearly as fast as its best while the others do not comes first."""
        key = rate
        if self.types == "advantage":
            if self._demand is None:
                rel = np.array([r / max(float(r.max()), 1e-300)
                                for r in (p.per_gpu_rate(j) for j in range(p.S))])
                self._demand = np.array([float(rel[p.allowed[:, t], t].mean())
                                         if p.allowed[:, t].any() else 1.0
                                         for t in range(p.T)])
            key = rate / max(float(rate.max()), 1e-300) / np.maximum(self._demand, 1e-300)
        return [t for t in np.argsort(-key, kind="stable").tolist() if p.allowed[i, t]]


def _tup(n: np.ndarray) -> tuple[int, ...]:
    return tuple(int(v) for v in n)


def smith_plan(q: PlanningProblem, fits: Callable[[Plan], bool] | None = None
               ) -> Plan | None:
    """The lowest space plan of :class:`WholeClusterSmith` on ``q`` (the pool's costs:
    no restart cost) over :data:`TYPE_ORDERS` x :data:`EFFICIENCIES` (the first of
    equals) among those that ``fits`` accepts, or None where it cannot plan every job
    or none fits. ``params["efficiency"]`` and ``params["types"]`` say which made it.

    Each grid runs from the highest share down: there each job takes the fewest GPUs,
    so the first plan has about the fewest tasks of the grid; where ``fits`` (pool
    mode: at most ``SEED_MAX_TASKS`` tasks) refuses that one, no other is simulated."""
    from hetsched.errors import PlanningError
    from hetsched.planning.space.evaluator import simulate
    from hetsched.planning.space.scorer import Evaluator

    best: Plan | None = None
    ev = Evaluator(q)  # the placements' timings, shared by the grid's runs
    for k, (eff, types) in enumerate((e, o) for o in TYPE_ORDERS for e in EFFICIENCIES):
        try:
            plan = simulate(q, WholeClusterSmith(eff, types), static=False,
                            restart_cost_s=0.0, evaluator=ev)
        except PlanningError:
            return None
        if fits is not None and not fits(plan):
            if k == 0:
                return None
            continue
        if best is None or plan.weighted_jct_s < best.weighted_jct_s:
            plan.params.update(efficiency=eff, types=types)
            best = plan
    return best


__all__ = ["EFFICIENCIES", "TYPE_ORDERS", "WholeClusterSmith", "smith_plan"]
