"""The keep / fresh / wait decision at a reset event (dynamic mode).

Three candidates: "keep" (running jobs stay put, free GPUs go to waiting
jobs), the policy's "fresh" allocation of all GPUs, and "wait" (running jobs
stay, waiting jobs are deferred to the next event). Another candidate
replaces keep only if its predicted weighted completion time, restart costs
included, is lower; so a running job is moved only when that pays off.
A co-locating policy's candidates are scored with their groups
(:meth:`Decider.group_timings`: the group model the timeline then times the
segments with), not with each member as if it ran alone.
``static`` (and non-preemptive policies) always keep.

This is the one keep-or-move rule. ``replan`` does not have its own: it starts
the evaluator with the running jobs where they run (``PlanningProblem.running_gpus``,
:meth:`Timeline.seed`: they have run, so moving one costs the restart), and the
decision of that first event keeps or moves them as at any event of a simulated
plan; replan then follows the plan and quotes the record (:attr:`Decider.first`,
the plan's note ``keep_or_move``). Online replan (``running_fixed``) keeps them
where they run until they end (:meth:`Decider.ask_all`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.groups import GroupTimer
from hetsched.planning.space.scorer import Evaluator, Timing
from hetsched.planning.space.timeline import EPS, Timeline, _mates

#: active jobs x GPUs up to which idle GPUs trigger a fresh reallocation at every event
REPLAN_EVERY_EVENT_MAX = 20_000

Alloc = dict[int, list[int]]
#: ask(jobs, free GPU mask, current allocation) -> placed allocation
Ask = Callable[[list[int], np.ndarray, Alloc], Alloc]


@dataclass
class Decider:
    """Chooses each event's allocation; ``pev``/``pp`` are what the policy predicts with."""

    tl: Timeline
    pev: Evaluator
    pp: PlanningProblem
    shares: str
    keep_only: bool
    restart_cost_s: float
    last_fresh: float = -np.inf
    idle_at_last: int = 0
    fresh_asked: bool = False
    #: which candidate the last decision kept: "keep", "fresh" or "wait"
    chosen: str = "keep"
    #: co-locating policies: times groups (as the timeline does) ...
    timer: GroupTimer | None = None
    #: ... and names each active job's group under a candidate ("keep", "fresh", "wait")
    groups_for: Callable[[str, list[int]], dict[int, str | None]] | None = None
    #: jobs kept on their GPUs until they end (online replan), never asked about
    fixed: frozenset[int] = frozenset()
    #: the first decision of a timeline started with running jobs (replan): which
    #: candidate, each candidate's score, the jobs scored (or why nothing was compared)
    first: dict[str, Any] | None = None

    def decide(self, active: list[int], ask: Ask) -> Alloc:
        """The allocation every active job runs on from this event on."""
        tl = self.tl
        K, t, alloc = tl.K, tl.t, tl.alloc
        running = [i for i in active if alloc.get(i)]
        waiting = [i for i in active if not alloc.get(i)]
        keep = dict(alloc)
        keep.update(ask(waiting, tl.owner < 0, {}))
        new = keep
        self.chosen = "keep"
        # A fresh reallocation can only pay off if keeping would leave GPUs
        # idle or jobs waiting; otherwise every move just costs a restart.
        kept_gpus = sum(len(g) for g in keep.values())
        idle = kept_gpus < K
        queued = any(not keep.get(i) for i in active)
        # Idle GPUs alone (nobody waiting) trigger a fresh reallocation at
        # every event on small problems: the remaining work changes, so a
        # reallocation rejected at one event can pay at the next. Past
        # REPLAN_EVERY_EVENT_MAX (active jobs x GPUs) a fresh plan costs
        # more than it is likely to bring at each of a thousand
        # completions (it was most of the planning time for 1,000 jobs),
        # so it waits until the GPUs freed since the last one are 2% of
        # the cluster or a restart cost of simulated time has passed:
        # growing a running job costs it a restart anyway.
        idle_gpus = K - kept_gpus
        idle_due = idle and (len(active) * K <= REPLAN_EVERY_EVENT_MAX
                             or idle_gpus - self.idle_at_last >= max(1, int(np.ceil(0.02 * K)))
                             or t >= self.last_fresh + self.restart_cost_s - EPS)
        self.fresh_asked = not self.keep_only and bool(running) and (queued or idle_due)
        why = ("static or non-preemptive policy: running jobs keep their GPUs"
               if self.keep_only else "no job waits and no GPU is idle: a move only "
               "costs its restart")
        if self.fresh_asked:
            self.last_fresh = t
            fresh = self.ask_all(active, ask)
            why = "the policy's allocation is the kept one"
            # Waiting a little for fast GPUs that are about to free up can
            # beat both starting now on slow ones and moving a job that is
            # about to finish (it would pay a whole restart).
            wait = dict(alloc)
            cands = [keep, fresh] + ([wait] if wait != keep else [])
            # a co-locating policy's candidates are timed with their groups; a job
            # whose group changes on the same GPUs differs too (it runs slower or faster)
            tms = [self.group_timings(n, c, active)
                   for n, c in zip(("keep", "fresh", "wait"), cands, strict=False)]
            diff = [i for i in active
                    if any(c.get(i, []) != keep.get(i, []) or tm.get(i) != tms[0].get(i)
                           for c, tm in zip(cands[1:], tms[1:], strict=True))]
            if diff:
                ref_alloc = {i: fresh.get(i) or keep.get(i) or [] for i in diff}
                scores = [self.score(c, ref_alloc, diff, tm)
                          for c, tm in zip(cands, tms, strict=True)]
                best = int(np.argmin(scores))
                if scores[best] < scores[0] - 1e-6:
                    new = cands[best]
                    self.chosen = ("keep", "fresh", "wait")[best]
                self.record({"chosen": self.chosen, "weighted_completion_s": {
                    n: round(float(v), 6) for n, v in zip(("keep", "fresh", "wait"), scores,
                                                          strict=False)},
                    "jobs": sorted(tl.p.jobs[i].name for i in diff)})
        self.record({"chosen": self.chosen, "why": why})
        return new

    def record(self, what: dict[str, Any]) -> None:
        """Keep the first decision of a timeline that started with running jobs (replan)."""
        if self.first is None and self.tl.seeded:
            self.first = what

    def ask_all(self, active: list[int], ask: Ask) -> Alloc:
        """The policy's allocation of every GPU to ``active`` ("fresh"); jobs kept until
        they end (``fixed``: online replan) keep their GPUs and the others share the rest."""
        tl = self.tl
        fixed = {i: tl.alloc[i] for i in active if i in self.fixed and tl.alloc.get(i)}
        if not fixed:
            return ask(active, np.ones(tl.K, dtype=bool), tl.alloc)
        free = ~np.isin(tl.owner, list(fixed))
        return {**fixed, **ask([i for i in active if i not in fixed], free, tl.alloc)}

    def applied(self) -> None:
        """After the decision is applied: the next idle trigger counts from the GPUs idle now."""
        if self.fresh_asked:
            self.idle_at_last = int((self.tl.owner < 0).sum())

    def group_timings(self, name: str, cand: Alloc, active: list[int]) -> dict[int, Timing]:
        """Timings of the jobs that share GPUs in candidate ``name`` (co-locating policies):
        the group model the timeline applies to the segments (eq. (1), serial without
        coordination, a measured pair), so the decision and the plan agree."""
        out: dict[int, Timing] = {}
        if self.timer is None or self.groups_for is None:
            return out
        mates = _mates(active, cand, self.groups_for(name, active))
        for i, ms in mates.items():
            if i in out:
                continue
            batches = {j: int(self.tl.batch[j]) for j in ms}
            tms = self.timer.timings(list(ms), sorted(cand[i]), self.shares, batches)
            out.update(zip(ms, tms, strict=True))
        return out

    def predicted_end(self, i: int, gs: list[int], moved: bool,
                      tm: Timing | None = None) -> float:
        tl = self.tl
        tm = tm or self.pev.timing(i, gs, self.shares)
        start = tl.t + (self.restart_cost_s if moved and tl.has_run[i] else 0.0)
        if not moved:
            start = max(tl.t, tl.ready_at[i])
        return start + tl.remaining[i] * tm.per_work_s

    def score(self, cand: Alloc, ref: Alloc, jobs: list[int],
              grouped: dict[int, Timing] | None = None) -> float:
        """Predicted weighted completion of ``jobs`` under allocation ``cand``.

        ``grouped``: the timings of the jobs that share GPUs in ``cand``
        (:meth:`group_timings`); every other job runs alone. A job ``cand``
        leaves waiting runs alone on its ``ref`` GPUs once some GPUs free up
        (the group a reference forms now is with the jobs running now).
        Only the jobs whose GPUs (or group timing) differ between the
        candidates (``jobs``) are scored; the others contribute equally to
        both, except through ``first_free``, for which their current
        predicted end is enough.
        Allocation lists are kept sorted, so they compare directly.
        """
        tl, pev, pp = self.tl, self.pev, self.pp
        t, remaining = tl.t, tl.remaining
        grouped = grouped or {}
        ends = {}
        for i, gs in cand.items():
            if not gs:
                continue
            tm = grouped.get(i)
            if gs == tl.alloc.get(i):
                ends[i] = (max(t, tl.ready_at[i])
                           + remaining[i] * (tm or pev.timing(i, gs, self.shares)).per_work_s)
            else:
                ends[i] = self.predicted_end(i, gs, True, tm)
        first_free = min(ends.values(), default=t)
        total = 0.0
        weight = tl.p.weight
        for i in jobs:
            if i in ends:
                total += weight[i] * ends[i]
                continue
            # It waits at least until some GPUs free up, then runs as the
            # reference (fresh, else keep) would run it: a job is not judged
            # slower merely for waiting (assuming it then gets only its
            # minimal set made every fresh plan look better than keeping); on
            # its minimal set if no candidate runs it now.
            gs_other = ref.get(i)
            if gs_other:
                best = pev.timing(i, gs_other, self.shares).per_work_s
            else:
                best = pp.iter_time(i, best_counts(pp, i))[0]
            # A job that has run pays the restart cost when it gets GPUs again;
            # leaving it out made preempting a running job look free, so fresh
            # plans preempted jobs whatever the cost.
            rc = self.restart_cost_s if tl.has_run[i] else 0.0
            total += weight[i] * (first_free + rc + remaining[i] * best)
        return total


def best_counts(p: PlanningProblem, i: int) -> np.ndarray:
    """The fewest of a job's fastest GPUs that hold its batch (for waiting-time estimates).

    min_gpus alone on the fastest type often cannot hold the global batch
    in memory: its iteration time was then inf, "keep" scored inf whenever
    such a job waited, and any fresh plan won, preempting running jobs
    whatever the restart cost.
    """
    from hetsched.planning.space.policies.common import fastest_types, min_feasible

    return min_feasible(p, i, p.n_type, fastest_types(p, i))


__all__ = ["Decider", "best_counts", "REPLAN_EVERY_EVENT_MAX"]
