"""Space plans inside pool mode: a seed for Hare, and the plan pool mode keeps when time
sharing does not beat it.

A space plan is a pool plan in which each GPU runs one job's work back to back
(docs/pool.md, "Pool plans contain space plans"). The pool model's tasks have
one size per job (``P_i`` equal slices), so a space plan with uneven shares,
several GPU types per job or a GPU count that changes at events is outside
it; pool mode therefore plans both and keeps the lower weighted JCT
(:func:`hetsched.planning.pool.plan_pool`). The space plan also seeds Hare:
:func:`space_seed` gives each round of each job the time the space plan
reaches that round's first iteration, an order for Algorithm 1
(:func:`hetsched.planning.pool.hare.seeded_order`).

Space mode plans on its own costs: a job synchronises every iteration and pays a
restart when its GPUs change. A pool job pays neither: its tasks exchange gradients
once per round of ``N`` iterations, and it moves between GPUs at a task switch. So
the space planners, which size jobs by the step plus that synchronisation, leave
GPUs idle that a pool job would use. And a pool task trains its round's steps in
fused passes (:mod:`.fusion`), so a small slice does not pay a pass's fixed cost
each step: a GPU more for a small-batch job gains nearly its whole speed, where
space mode sees it gain little. Pool mode therefore also plans space mode on the
pool's costs (:func:`pool_costs_problem`: the synchronisation divided by the round's
iterations, the step as fused passes take it, no restart cost), makes that plan a
task plan, improves it the same way, and starts from whichever improved plan is
lower. On those costs it also plans Smith's rule on the whole cluster
(:mod:`.smith_seed`); the task plans within :data:`IMPROVE_WITHIN` of the lowest are
improved. The space plan on its own costs stays the guarantee: the plan kept is
never above its task plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.planning.pool.evaluator import TaskSchedule
from hetsched.planning.pool.problem import PoolProblem

if TYPE_CHECKING:
    from hetsched.planning.pool.backfill import Improved


@dataclass
class SpaceWork:
    """The best space plan and what pool mode makes of it: the seed order, the exact
    task plan's weighted JCT and its improvement (the plan Hare may keep). None where
    there is no space plan, or the pool model cannot express it
    (:func:`~.from_space.space_tasks`)."""

    plan: Plan | None
    seed: TaskSchedule | None = None
    #: the exact task plan's total weighted JCT, before the improvement
    tasks_s: float | None = None
    improved: Improved | None = None
    #: which space plan ``improved`` starts from: "space" (space mode's own plan),
    #: "space-pool-costs" (space mode planned on the pool's costs, :func:`pool_costs_problem`)
    #: or "smith-pool-costs" (Smith's rule on the whole cluster there, :mod:`.smith_seed`)
    improved_from: str = "space"
    #: the exact task plan of the space plan on the pool's costs (None: not planned)
    pool_costs_tasks_s: float | None = None
    #: the exact task plan of Smith's rule on the pool's costs (None: not planned)
    smith_tasks_s: float | None = None
    #: the share of its own speed each GPU had to add in Smith's lowest plan
    #: (:data:`.smith_seed.EFFICIENCIES`), and which types its jobs took first
    #: (:data:`.smith_seed.TYPE_ORDERS`)
    smith_efficiency: float | None = None
    smith_types: str | None = None


#: whether pool mode also plans space mode on the pool's costs (benchmarks switch it off
#: to compare with the seed on space mode's own costs alone)
POOL_COSTS_SEED = True
#: up to this many jobs: on the pool's costs the space planners give jobs many more GPUs,
#: so planning, timing and improving that plan grow faster than the plan on space mode's
#: costs (1,000 jobs on 3,600 GPUs: minutes, where the rest of pool mode takes 45 s)
POOL_COSTS_MAX_JOBS = 200


#: a space plan on the pool's costs whose task plan would hold more tasks than this is not
#: made one: making, timing and improving a task plan costs about 10 us a task (Smith's
#: plan at 200 jobs on 720 GPUs: 3.0 million tasks, 11 s to make them alone, and it lost)
SEED_MAX_TASKS = 2_000_000


#: the seeds' task plans improved: the lowest and every one within this share above it
#: (one a little above may end lower: Smith's on Gavel's small_test, 6% above space
#: mode's on the pool's costs before the improvement, is 7% below it after)
IMPROVE_WITHIN = 0.10


def task_count(pp: PoolProblem, plan: Plan) -> int:
    """The tasks :func:`~.from_space.space_tasks` would make of ``plan`` (each segment's
    rounds of ``N_i`` iterations times its workers), without making them."""
    index = {job.name: i for i, job in enumerate(pp.base.jobs)}
    return int(sum(math.ceil(s.iterations / float(pp.N[index[jp.name]])) * len(s.workers)
                   for jp in plan.jobs if jp.name in index
                   for s in jp.segments if s.iterations > 0))


def space_work(pp: PoolProblem, plan_it: Callable[[], Plan | None], improve: bool,
               plan_pool_costs: Callable[[], dict[str, Plan | None]] | None = None,
               workers: int = 1) -> SpaceWork:
    """Plan space mode (``plan_it``), then turn its plan into the seed and the exact task
    plan, improved (``improve``): everything of the space plans that Hare uses, in one
    deterministic function, which plan_pool runs beside Hare's own orders.

    With ``plan_pool_costs`` (space plans on the pool's costs by label, planned beside
    ``plan_it`` in a forked process where ``workers`` > 1), the exact task plans within
    :data:`IMPROVE_WITHIN` of the lowest are improved and the lowest improved kept:
    improving one takes as long as planning it, and the seeds mostly differ by far
    more than an improvement moves either."""
    from hetsched.planning.pool.from_space import timed_space_tasks
    from hetsched.planning.select import Background

    other = Background(plan_pool_costs, workers) \
        if improve and plan_pool_costs is not None else None
    try:
        plan = plan_it()
        if plan is None:
            return SpaceWork(None)
        out = SpaceWork(plan, seed=space_seed(pp, plan))
        exact = timed_space_tasks(pp, plan)
        if exact is None:
            return out
        out.tasks_s = exact[2]
        if not improve:
            return out
        from hetsched.planning.pool.backfill import improve as improve_plan

        starts = [("space", exact[0], out.tasks_s)]
        for label, alt_plan in (other.result() if other is not None else {}).items():
            alt = timed_space_tasks(pp, alt_plan) if alt_plan is not None \
                and task_count(pp, alt_plan) <= SEED_MAX_TASKS else None
            if alt is None or alt_plan is None:
                continue
            v = alt[2]
            if label == "smith-pool-costs":
                out.smith_tasks_s = v
                out.smith_efficiency = alt_plan.params.get("efficiency")
                out.smith_types = alt_plan.params.get("types")
            else:
                out.pool_costs_tasks_s = v
            starts.append((label, alt[0], v))
        low = min(v for _, _, v in starts)
        for label, sched, v in starts:  # the lowest, and any within IMPROVE_WITHIN of it
            if v <= low * (1.0 + IMPROVE_WITHIN):
                im = improve_plan(pp, sched)
                if out.improved is None or im.objective < out.improved.objective:
                    out.improved, out.improved_from = im, label
        return out
    finally:
        if other is not None:
            other.close()


def pool_costs_problem(problem: PlanningProblem, pp: PoolProblem) -> PlanningProblem:
    """``problem`` with the pool model's costs: one exchange per round of ``N_i``
    iterations (a space planner charges ``sync / N`` per iteration) and, where the pool
    fuses steps (:mod:`.fusion`), each GPU's step at a local batch as the round's
    steps take it in fused passes (:func:`fused_steps_curve`).

    Jobs that space mode cannot tell apart (one ``model_key``) keep one model: each is
    charged over the fewest iterations per round among them (conservative for the
    others), so the planners' per-model tables stay shared. The arrays the costs are
    read from (``sync``, ``model_mb``, ``calibrated``, the step's line and curves) are
    the copy's own; the rest is shared, read-only, with ``problem``."""
    from hetsched.core.estimates import Estimates

    keys = [problem.model_key(i) for i in range(problem.S)]
    per: dict[tuple, int] = {}
    for key, n_i in zip(keys, pp.N.tolist(), strict=True):
        per[key] = min(per.get(key, int(n_i)), int(n_i))
    n = np.array([max(1, per[key]) for key in keys], dtype=np.int64)
    q = problem.scaled(sync=1.0 / n)
    if pp.fuse:
        q.a, q.c = q.a.copy(), q.c.copy()
        q.curves = [None if row is None else list(row) for row in q.curves]
        memo: dict[tuple, list[tuple[np.ndarray, np.ndarray] | None]] = {}
        for i in range(q.S):
            key = (keys[i], int(n[i]), pp.ok[i].tobytes(), pp.chunk[i].tobytes(),
                   pp.optimizer_s[i].tobytes())
            if key not in memo:
                memo[key] = [fused_steps_curve(problem, pp, i, t, int(n[i]))
                             for t in range(q.T)]
            for t, cv in enumerate(memo[key]):
                if cv is None:
                    continue
                row = q.curves[i] or [None] * q.T
                row[t], q.curves[i] = cv, row
                # the line through the cap's step (the curve is what the planners read)
                q.a[i, t], q.c[i, t] = 0.0, float(cv[1][-1] / cv[0][-1])
        q.estimates = Estimates.of(q)
    q.estimates.joint_lp = False  # a seed: its bound is never reported
    return q


def fused_steps_curve(problem: PlanningProblem, pp: PoolProblem, i: int, t: int, n: int
                      ) -> tuple[np.ndarray, np.ndarray] | None:
    """Job i's step on one GPU of type t as a pool round of ``n`` steps takes it, fused
    (:func:`~.fusion.fused_compute` over ``n``), as a piecewise-linear curve of the local
    batch: exact at its knots (1, ``chunk // n``, the chunk, the profile's knots above the
    chunk and the cap). Below ``chunk // n`` all ``n`` slices share a pass; up to the
    chunk a pass holds ``chunk // b`` of them, so the step is about ``b`` times the
    chunk's time per sample (no pass's fixed cost). None: nothing fuses there (the pool
    may not run the job on t, its chunk is one sample, or a round is one step)."""
    from hetsched.planning.pool.fusion import fused_compute, pass_times

    ch, cap = int(pp.chunk[i, t]), int(problem.cap[i, t])
    if not pp.ok[i, t] or ch <= 1 or n <= 1:
        return None
    row = problem.curves[i]
    cv = row[t] if row is not None else None
    above = [] if cv is None else [float(k) for k in cv[0] if ch < k < cap]
    knots = np.unique(np.array([1.0, max(1, ch // n), float(ch), *above, float(cap)]))
    k = len(knots)
    step = fused_compute(pass_times(problem, i, pp.optimizer_s[i]), np.zeros(k, np.int64),
                         np.full(k, t), knots.astype(np.int64), np.full(k, n),
                         np.full(k, ch)) / n
    return knots, np.maximum.accumulate(step)


def round_starts(pp: PoolProblem, plan: Plan) -> list[np.ndarray]:
    """Per job, the time the space ``plan`` starts each pool round's first iteration."""
    by_name = {jp.name: jp for jp in plan.jobs}
    out = []
    for i, job in enumerate(pp.base.jobs):
        R, N = int(pp.R[i]), int(pp.N[i])
        want = np.arange(R, dtype=float) * N * (
            float(pp.base.iters[i]) / max(float(pp.total_iters[i]), 1.0))
        segs = sorted(by_name[job.name].segments, key=lambda s: s.start_s) \
            if job.name in by_name else []
        t = np.full(R, float(pp.arrival[i]))
        done = 0.0
        k = 0
        for s in segs:
            ready = s.start_s + s.restart_s
            while k < R and want[k] <= done + s.iterations + 1e-9:
                t[k] = ready + max(0.0, want[k] - done) * s.iteration_s
                k += 1
            done += s.iterations
        if k < R and segs:
            t[k:] = segs[-1].end_s
        out.append(t)
    return out


def space_seed(pp: PoolProblem, plan: Plan) -> TaskSchedule:
    """A pseudo-schedule (one row per round) whose round starts are the space plan's;
    only :func:`~hetsched.planning.pool.hare.seeded_order` reads it."""
    starts = round_starts(pp, plan)
    job = np.repeat(np.arange(pp.S), pp.R)
    rnd = np.concatenate([np.arange(int(r)) for r in pp.R]) if pp.S else np.zeros(0, int)
    st = np.concatenate(starts) if pp.S else np.zeros(0)
    z = np.zeros(len(job), dtype=np.int64)
    return TaskSchedule(job.astype(np.int64), rnd.astype(np.int64), z, z, st, policy="space")


__all__ = ["round_starts", "space_seed", "SpaceWork", "space_work", "pool_costs_problem",
           "POOL_COSTS_SEED", "POOL_COSTS_MAX_JOBS",
           "fused_steps_curve", "SEED_MAX_TASKS", "task_count", "IMPROVE_WITHIN"]
