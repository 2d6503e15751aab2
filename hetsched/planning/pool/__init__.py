"""Pool mode (Hare, HPDC'22): a fixed set of GPUs shared by many jobs at task granularity.

``plan_pool`` is the entry point: it builds the Hare_Sched instance
(:mod:`.problem`), runs one policy (``hare`` or a baseline of
:mod:`.baselines`) or ``auto`` (all of them, keeping the lowest total weighted
JCT), validates and scores the schedule with the one evaluator
(:mod:`.evaluator`) and returns a :class:`~hetsched.core.plan.Plan` whose ``tasks``
section carries the per-GPU task sequences with the memory plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.errors import InputError
from hetsched.planning.pool.baselines import BASELINES
from hetsched.planning.pool.evaluator import TaskSchedule, evaluate, to_plan
from hetsched.planning.pool.hare import alpha, hare_from, hare_schedule, relaxation
from hetsched.planning.pool.problem import PoolProblem

#: pool policies: name -> (summary, paper)
POOL_POLICIES = {
    "hare": ("Relaxation order + Algorithm 1 list scheduling of tasks (relaxed scale-fixed sync)",
             "Hare, HPDC'22 §5.2"),
    "fifo": ("Gavel_FIFO: arrival order, fastest free GPUs, waits for its P GPUs", "Gavel, OSDI'20"),
    "srtf": ("Shortest remaining time first, preemptive at round boundaries", "Hare §7.1"),
    "homo": ("Sched_Homo: Smith's rule, intra-job parallelism, heterogeneity-oblivious",
             "Zhang et al. via Hare §7.1"),
    "allox": ("Sched_Allox: one GPU per job, min-cost matching to (GPU, position)",
              "AlloX, EuroSys'20"),
}
POOL_AUTO = ("hare", "allox", "srtf", "homo", "fifo")
HARE_PARAMS = {"pick": "best", "order": "best", "bound": "auto"}


def _run(pp: PoolProblem, name: str, params: dict[str, Any]) -> TaskSchedule:
    if name == "hare":
        res = hare_schedule(pp, **params)
        return res.schedule
    if params:
        raise InputError("--param", f"pool policy {name!r} takes no parameters")
    return BASELINES[name](pp)


def plan_pool(problem: PlanningProblem, policy: str = "auto", params: dict[str, Any] | None = None,
              *, task_iterations: int | None = None,
              progress: Callable[[str], None] | None = None) -> Plan:
    """Plan ``problem`` in pool mode with ``policy`` (a POOL_POLICIES name or ``auto``)."""
    t0 = time.perf_counter()
    params = dict(params or {})
    if policy != "auto" and policy not in POOL_POLICIES:
        raise InputError("--policy", f"unknown pool-mode policy {policy!r}; valid: "
                         f"{', '.join(POOL_POLICIES)}, auto")
    if policy == "auto" and params:
        raise InputError("--param", "--param applies to one policy; 'auto' runs each with "
                         "its defaults")
    if policy == "hare":
        bad = sorted(set(params) - set(HARE_PARAMS))
        if bad:
            raise InputError("--param", f"unknown hare parameter {bad[0]!r}; valid: "
                             f"{', '.join(HARE_PARAMS)}")
    pp = PoolProblem(problem, task_iterations=task_iterations)
    # the bound is the policy-independent relaxation (Hare reuses it for its order)
    rel = relaxation(pp, str(params.get("bound", "auto")))
    names = POOL_AUTO if policy == "auto" else (policy,)
    best: tuple[float, TaskSchedule] | None = None
    scores: dict[str, float] = {}
    for name in names:
        if name == "hare":
            s = _hare_with(pp, rel, params)
        else:
            s = _run(pp, name, params)
        v = evaluate(pp, s).objective
        scores[name] = v
        if progress:
            progress(f"pool {name}: weighted JCT {v:,.1f} s")
        if best is None or v < best[0] - 1e-9:
            best = (v, s)
    assert best is not None
    sched = best[1]
    ev = evaluate(pp, sched)
    extra: dict[str, Any] = {"bound": rel.method, "alpha": round(alpha(pp), 6),
                             "task_iterations": "auto" if task_iterations is None
                             else int(task_iterations)}
    if policy == "auto":
        extra["chosen"] = sched.policy
    plan = to_plan(pp, sched, ev, rel.value, params=extra)
    if policy == "auto":
        plan.policy = f"auto:{sched.policy}"
        plan.candidates = scores
    plan.planning_time_s = time.perf_counter() - t0
    return plan


def _hare_with(pp: PoolProblem, rel: Any, params: dict[str, Any]) -> TaskSchedule:
    """Hare reusing the already solved relaxation (the bound is computed once per plan)."""
    res = hare_from(pp, rel, str(params.get("pick", "best")), str(params.get("order", "best")))
    return res.schedule


__all__ = ["plan_pool", "POOL_POLICIES", "POOL_AUTO", "PoolProblem", "relaxation"]
