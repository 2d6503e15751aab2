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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hetsched.core.plan import Plan
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


def space_work(pp: PoolProblem, plan_it: Callable[[], Plan | None], improve: bool) -> SpaceWork:
    """Plan space mode (``plan_it``), then turn its plan into the seed and the exact task
    plan, improved (``improve``): everything of the space plan that Hare uses, in one
    deterministic function, which plan_pool runs beside Hare's own orders."""
    from hetsched.planning.pool.evaluator import evaluate
    from hetsched.planning.pool.from_space import space_tasks

    plan = plan_it()
    if plan is None:
        return SpaceWork(None)
    out = SpaceWork(plan, seed=space_seed(pp, plan))
    exact = space_tasks(pp, plan)
    if exact is not None:
        out.tasks_s = evaluate(pp, exact[0]).objective
        if improve:
            from hetsched.planning.pool.backfill import improve as improve_plan

            out.improved = improve_plan(pp, exact[0])
    return out


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


__all__ = ["round_starts", "space_seed", "SpaceWork", "space_work"]
