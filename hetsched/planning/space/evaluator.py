"""The one space-mode evaluator: turns a policy's per-event decisions into a timed Plan.

``simulate`` walks the reset events (job arrivals and completions) in named
steps, each in its own module:

* timeline (:mod:`.timeline`): who holds which GPUs, the work left, segments,
  restart costs; advancing time to the next event;
* decision (:mod:`.decide`): keep / fresh / wait, by predicted weighted
  completion time (dynamic mode; ``static`` and non-preemptive policies keep);
* placer (:mod:`.placer`): a policy's per-type counts onto concrete GPUs;
* scorer (:mod:`.scorer`): exact timing of a job on its GPUs (integer batch
  shares, the node layout's bandwidth).

Every policy goes through this same code, so their objectives are comparable.

Co-location (Harmony, docs/harmony.md): a policy with ``colocates`` also names
each job's group; a group's members share one placement and are timed
together (:mod:`.groups`: eq. (1) or measured pairs, GPU memory checked).

Elastic batches (docs/elastic.md): a policy with ``decides_batch`` (``ones``)
also chooses each elastic job's global batch (``batch_for(i)``); its
decision is applied as made at every event (it does its own selection), a
batch change on the same GPUs costs an in-place rescale instead of a
restart, and progress is counted in efficient samples (:mod:`.scorer`).
"""

from __future__ import annotations

import time

import numpy as np

from hetsched.config import DEFAULT_RESTART_COST_S
from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.core.report import BaseReporter
from hetsched.planning.base import OverBudget
from hetsched.planning.bounds import lower_bound_info
from hetsched.planning.space.decide import REPLAN_EVERY_EVENT_MAX, Ask, Decider, best_counts
from hetsched.planning.space.groups import GroupTimer, leaders, spread
from hetsched.planning.space.placer import Placer
from hetsched.planning.space.policies.base import Policy, Snapshot
from hetsched.planning.space.scorer import Evaluator, Timing
from hetsched.planning.space.timeline import EPS, Timeline


def _validate(problem: PlanningProblem, policy: Policy, snap: Snapshot, X: np.ndarray,
              lead: dict[int, list[int]] | None = None) -> None:
    """Shapes, bounds and free GPUs; with ``lead`` (co-located groups) each group's GPUs
    count once and every member must have its leader's counts."""
    if X.shape != (len(snap.jobs), problem.T):
        raise AssertionError(f"{policy.name}: allocation has shape {X.shape}")
    used = X
    if lead is not None:
        row = {int(i): r for r, i in enumerate(snap.jobs)}
        for i, ms in lead.items():
            if any((X[row[j]] != X[row[i]]).any() for j in ms):
                raise AssertionError(f"{policy.name}: group of job {problem.jobs[i].name} "
                                     "has members with different GPUs")
        used = X[[row[i] for i in lead]]
    if (X < 0).any() or (used.sum(axis=0) > snap.free).any():
        raise AssertionError(f"{policy.name}: allocation exceeds the free GPUs")
    J = snap.jobs
    k = X.sum(axis=1)
    bad = (k > 0) & ((k < problem.lo[J]) | (k > problem.hi[J])
                     | ((X > 0) & ~problem.allowed[J]).any(axis=1))
    if bad.any():
        r = int(np.argmax(bad))
        i = int(J[r])
        raise AssertionError(f"{policy.name}: job {problem.jobs[i].name} got {X[r]} "
                             f"outside its bounds [{problem.lo[i]}, {problem.hi[i]}]")


def simulate(problem: PlanningProblem, policy: Policy, *, static: bool = False,
             restart_cost_s: float = DEFAULT_RESTART_COST_S, reporter: BaseReporter | None = None,
             predicted: PlanningProblem | None = None,
             work_limit: float | None = None, stat_efficiency: bool = True,
             evaluator: Evaluator | None = None) -> Plan:
    """Run ``policy`` over the timeline of reset events and return the evaluated Plan.

    ``predicted`` (same jobs and cluster, other step times) is what the policy
    and the keep/fresh choice see, while time runs on ``problem`` (profile noise,
    ``hetsched simulate --noise``). A policy with ``next_wakeup(t)`` is also asked
    at the times it names; one with ``plan_extra()`` adds that to ``Plan.extra``.
    ``work_limit`` (reference seconds of counted work, auto's budget): raise
    OverBudget at the first event past it. Work is counted, never timed
    (``policy.event_work`` per event plus what the policy adds to ``work_s``),
    so the same input stops at the same event on a quiet and on a busy machine;
    the plan carries the count (``plan.work``: counted seconds, active jobs per
    event). ``stat_efficiency=False`` counts an elastic job's progress in plain
    samples (ONES's assumption) instead of efficient samples. ``evaluator``: an
    :class:`Evaluator` of ``problem`` (same ``stat_efficiency``) whose cached
    timings several runs on one problem share; a new one where None.
    """
    started_clock = time.perf_counter()
    p = problem
    ev = evaluator if evaluator is not None else Evaluator(p, stat_efficiency)
    pp = predicted if predicted is not None else p
    pev = Evaluator(pp, stat_efficiency) if predicted is not None else ev
    placer = Placer(ev)
    tl = Timeline(p, ev, restart_cost_s)
    oblivious = policy.placement == "oblivious"
    keep_only = static or not policy.preemptive
    decides = bool(getattr(policy, "decides_batch", False))
    want: dict[int, int] = {}
    coloc, timer, groups, asked = _colocation(p, ev, policy)
    decider = Decider(tl, pev, pp, policy.shares, keep_only, restart_cost_s)
    _score_groups(decider, timer, groups, asked)
    _seed_running(p, ev, tl, decider, policy)

    def ask(jobs: list[int], free_mask: np.ndarray, cur: dict[int, list[int]]
            ) -> dict[int, list[int]]:
        """The policy's counts for ``jobs`` on the free GPUs, placed."""
        if not jobs or not free_mask.any():
            return {}
        snap = _snapshot(p, ev, tl, jobs, free_mask, cur, restart_cost_s)
        X = np.asarray(policy.allocate(pp, snap), dtype=int)
        if coloc:  # one placement per group; its members share the GPUs (.groups)
            asked.append({i: policy.group_of(i) for i in jobs})  # type: ignore[attr-defined]
            lead = leaders(jobs, asked[-1])
            _validate(p, policy, snap, X, lead)
            return spread(placer.place({i: X[r] for r, i in enumerate(jobs) if i in lead},
                                       free_mask, cur, oblivious), lead)
        _validate(p, policy, snap, X)
        if decides:
            want.update(_validate_batches(p, policy, snap, X))
        counts = {int(i): X[r] for r, i in enumerate(jobs)}
        return placer.place(counts, free_mask, cur, oblivious)

    policy.work_s = 0.0
    work, per_event = 0.0, []
    while not tl.finished:
        active = tl.arrive()
        if reporter is not None:
            reporter.event(policy.name, tl.t, len(active), int(tl.done.sum()), p.S)
        _check_budget(work_limit, work + policy.work_s, tl, p.S)
        if active:
            work += policy.event_work(p, len(active))
            per_event.append(len(active))
            asked.clear()
            new = _decide(decider, active, ask, policy.name, decides and not keep_only)
            if coloc:
                _adopt(groups, asked, decider.chosen, active, tl.alloc, policy)
            tl.apply(new, active, policy.shares, policy.name, want,
                     groups if coloc else None, timer)
            decider.applied()
        tl.advance(getattr(policy, "next_wakeup", None), policy.name)
    plan = _plan(p, policy, tl, static, restart_cost_s, started_clock)
    if tl.seeded:  # replan: what its first decision did with the running jobs
        plan.notes.keep_or_move = {**(decider.first or {}), "started": sorted(
            p.jobs[i].name for i in tl.seeded)}
    plan.work = (work + policy.work_s, per_event)  # type: ignore[attr-defined]
    return plan


def _seed_running(p: PlanningProblem, ev: Evaluator, tl: Timeline, decider: Decider,
                  policy: Policy) -> None:
    """Replan: the running jobs start where they run (decide.py); online replan keeps
    them there until they end."""
    running = _running(p, ev)
    if running:
        tl.seed(running, policy.shares, policy.name)
        decider.fixed = frozenset(running) if p.running_fixed else frozenset()


def _decide(decider: Decider, active: list[int], ask: Ask, name: str,
            policy_decides: bool) -> dict[int, list[int]]:
    """The allocation from this event on: the Decider's keep/fresh/wait, or the
    policy's own where it chose GPUs and batches for every active job."""
    if not policy_decides:
        return decider.decide(active, ask)
    new = decider.ask_all(active, ask)
    decider.record({"chosen": "policy", "why": f"{name} decides every job's GPUs itself, "
                    "restart costs included"})
    return new


def _running(p: PlanningProblem, ev: Evaluator) -> dict[int, list[int]]:
    """``p.running_gpus`` as job index -> GPU ids: the jobs whose GPUs are all in the
    cluster, of a type the job may use, and held by no other job (a co-location group's
    shared GPUs are not started as such: those jobs are planned as waiting, and replan
    keeps them where they run, app/replan_changes.py)."""
    if not p.running_gpus:
        return {}
    gid = {(g.node, g.index): k for k, g in enumerate(p.cluster.gpus)}
    index = {job.name: i for i, job in enumerate(p.jobs)}
    out: dict[int, list[int]] = {}
    for name, gpus in p.running_gpus.items():
        ids = sorted({gid.get((str(n), int(k)), -1) for n, k in gpus})
        i = index.get(name)
        if i is None or not ids or ids[0] < 0 or p.arrival[i] > p.arrival.min() \
                or not p.allowed[i, ev.gpu_type[ids]].all():
            continue
        out[i] = ids
    held = np.bincount([g for gs in out.values() for g in gs], minlength=len(gid))
    return {i: gs for i, gs in out.items() if (held[gs] == 1).all()}


def _snapshot(p: PlanningProblem, ev: Evaluator, tl: Timeline, jobs: list[int],
              free_mask: np.ndarray, cur: dict[int, list[int]], restart_cost_s: float
              ) -> Snapshot:
    """What the policy sees of ``jobs`` now: work left, the free GPUs per type, the
    GPUs each holds in ``cur``, how long each has waited."""
    ja = np.array(jobs, dtype=int)
    return Snapshot(
        t=tl.t, jobs=ja, remaining=tl.remaining[ja].copy(),
        free=np.bincount(ev.gpu_type[free_mask], minlength=p.T),
        current=np.array([tl.counts_of(cur.get(i, [])) for i in jobs]).reshape(len(jobs), p.T),
        waited=tl.t - p.arrival[ja], restart_cost_s=restart_cost_s,
    )


def _check_budget(work_limit: float | None, work: float, tl: Timeline, n_jobs: int) -> None:
    """Raise OverBudget once the counted ``work`` passes ``work_limit`` (auto's budget)."""
    if work_limit is not None and work > work_limit:
        raise OverBudget(f"stopped at its work limit {work_limit:,.2f} s (auto's budget "
                         f"plan_budget_s, counted work, not timed) with "
                         f"{int(tl.done.sum())} of {n_jobs} jobs simulated", work_s=work)


def _colocation(p: PlanningProblem, ev: Evaluator, policy: Policy
                ) -> tuple[bool, GroupTimer | None, dict[int, str | None],
                           list[dict[int, str | None]]]:
    """Does the policy co-locate; its group timer; the groups applied; each ask's groups."""
    coloc = bool(getattr(policy, "colocates", False))
    timer = GroupTimer(p, ev, bool(getattr(policy, "coordinated", True))) if coloc else None
    return coloc, timer, {}, []


def _score_groups(decider: Decider, timer: GroupTimer | None, groups: dict[int, str | None],
                  asked: list[dict[int, str | None]]) -> None:
    """A co-locating policy's candidates are scored with their groups, timed as the
    timeline times them (on the predicted problem where there is one)."""
    if timer is None:
        return
    pev, tl = decider.pev, decider.tl
    decider.timer = timer if pev is timer.ev else GroupTimer(decider.pp, pev, timer.coordinated)
    decider.groups_for = lambda name, act: _cand_groups(groups, asked, name, act, tl.alloc)


def _cand_groups(groups: dict[int, str | None], asked: list[dict[int, str | None]],
                 chosen: str, active: list[int], alloc: dict[int, list[int]]
                 ) -> dict[int, str | None]:
    """Each active job's group under the decider's candidate ``chosen``.

    "fresh" takes the last ask's groups (every active job); "keep" keeps the
    running jobs' and adds the waiting jobs' from the ask about them alone (if
    there were free GPUs to ask about); "wait" leaves the waiting jobs alone.
    """
    if chosen == "fresh" and asked:
        return {i: asked[-1].get(i) for i in active}
    first = asked[0] if asked and all(not alloc.get(i) for i in asked[0]) else {}
    return {i: groups.get(i) if alloc.get(i) else first.get(i) if chosen == "keep" else None
            for i in active}


def _adopt(groups: dict[int, str | None], asked: list[dict[int, str | None]], chosen: str,
           active: list[int], alloc: dict[int, list[int]], policy: Policy) -> None:
    """The groups of the allocation the decider kept (its candidates were scored with
    these groups, :meth:`Decider.group_timings`); the policy learns them."""
    groups.update(_cand_groups(groups, asked, chosen, active, alloc))
    adopt = getattr(policy, "adopt", None)
    if adopt is not None:
        adopt({i: groups.get(i) for i in active})


def _validate_batches(p: PlanningProblem, policy: Policy, snap: Snapshot, X: np.ndarray
                      ) -> dict[int, int]:
    """A decides_batch policy's global batches: in the job's range, held by its GPUs."""
    out = {}
    for r, i in enumerate(snap.jobs):
        i = int(i)
        k = int(X[r].sum())
        if k == 0:
            continue
        B = int(policy.batch_for(i))  # type: ignore[attr-defined]
        el = p.jobs[i].elastic
        lo, hi = (el.min_batch, el.max_batch) if el is not None else (int(p.B[i]), int(p.B[i]))
        held = int((p.cap[i] * X[r]).sum())
        if not (lo <= B <= hi and k <= B <= held):
            raise AssertionError(f"{policy.name}: job {p.jobs[i].name} got global batch {B} "
                                 f"on {k} GPUs holding {held}; its range is [{lo}, {hi}]")
        out[i] = B
    return out


def _plan(p: PlanningProblem, policy: Policy, tl: Timeline, static: bool,
          restart_cost_s: float, started_clock: float) -> Plan:
    """The evaluated Plan: segments, the problem's lower bound, fairness references."""
    ref = {j.name: float(p.iters[i] * p.equal_share_time(i)) for i, j in enumerate(p.jobs)}
    lb = lower_bound_info(p)
    bound, kind = lb["weighted_jct_s"], lb["kind"]
    if any(s.group is not None for jp in tl.plans for s in jp.segments):
        # GPUs shared by a group break the fluid and LP bounds' exclusive-GPU premise;
        # a job alone on the cluster (eq. (1): never faster in a group) still bounds it
        bound, kind = lb["bounds"].get("alone", 0.0), "alone (co-located plan)"
    plan = Plan(
        policy=policy.name, jobs=tl.plans, lower_bound_s=bound,
        lower_bound_extra={"kind": kind},
        params=policy.get_params(), static=static, restart_cost_s=restart_cost_s,
        cluster={"name": p.cluster.name, "gpus": {t: int(n) for t, n in
                                                  zip(p.types, p.n_type, strict=True)}},
        fairness_ref=ref,
    )
    extra = getattr(policy, "plan_extra", None)
    if extra is not None:
        plan.extra.update(extra())
    plan.planning_time_s = time.perf_counter() - started_clock
    return plan


_best_counts = best_counts  # former name

__all__ = ["simulate", "Evaluator", "Placer", "Timing", "EPS", "REPLAN_EVERY_EVENT_MAX"]
