"""The `plan` use case: load inputs, run a policy (or `auto`) through the evaluator."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hetsched.config import DEFAULT_RESTART_COST_S
from hetsched.core.plan import Plan, PlanSettings
from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job
from hetsched.core.throughput import ThroughputTable
from hetsched.errors import HetschedError, PlanningError
from hetsched.planning.space.evaluator import simulate
from hetsched.planning.space.policies.base import REGISTRY, make_policy

#: what `auto` runs, in order; `has` is skipped (not failed) when too large
AUTO_CANDIDATES = ("has", "jps", "optimus-lb", "optimus", "srtf", "fifo", "allox", "homo")


def make_plan(jobs: list[Job], cluster: Cluster, table: ThroughputTable, policy: str = "auto",
              params: dict[str, Any] | None = None, *, static: bool = False,
              restart_cost_s: float = DEFAULT_RESTART_COST_S, jobs_source: str = "jobs",
              progress: Callable[[str], None] | None = None, mode: str = "space",
              task_iterations: int | None = None) -> Plan:
    """Plan ``jobs`` on ``cluster``. ``policy='auto'`` keeps the best of AUTO_CANDIDATES.

    ``mode='pool'`` plans task-level sharing of the whole pool instead
    (Hare; :mod:`hetsched.planning.pool`, docs/pool.md); ``task_iterations`` is its task size.
    Raises InputError for bad inputs and PlanningError when no plan can be made.
    The plan records these settings (``Plan.settings``) so replan can repeat them.
    """
    settings = PlanSettings(mode, policy, dict(params or {}), static, restart_cost_s,
                            task_iterations)
    problem = PlanningProblem(jobs, cluster, table, jobs_source=jobs_source)
    if mode == "pool":  # pool mode (issue 3) lives in its own package
        from hetsched.planning.pool import plan_pool

        if static:
            raise PlanningError("--static applies to space mode; pool mode plans every task")
        plan = plan_pool(problem, policy, params, task_iterations=task_iterations,
                         progress=progress)
    elif mode == "space":
        plan = plan_problem(problem, policy, params, static=static,
                            restart_cost_s=restart_cost_s, progress=progress)
    else:
        raise PlanningError(f"unknown mode {mode!r}; expected space or pool")
    plan.settings = settings
    return plan


def plan_problem(problem: PlanningProblem, policy: str = "auto",
                 params: dict[str, Any] | None = None, *, static: bool = False,
                 restart_cost_s: float = DEFAULT_RESTART_COST_S,
                 progress: Callable[[str], None] | None = None) -> Plan:
    if policy != "auto":
        return simulate(problem, make_policy(policy, params), static=static,
                        restart_cost_s=restart_cost_s)
    if params:
        raise PlanningError("--param applies to one policy; 'auto' runs each with its defaults")
    t0 = time.perf_counter()
    best: Plan | None = None
    scores: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for name in AUTO_CANDIDATES:
        if name not in REGISTRY:
            continue
        try:
            plan = simulate(problem, make_policy(name), static=static,
                            restart_cost_s=restart_cost_s)
        except PlanningError as e:  # e.g. has above its size limit
            skipped[name] = str(e)
            continue
        scores[name] = plan.weighted_jct_s
        if progress:
            progress(f"{name}: weighted JCT {plan.weighted_jct_s:,.1f} s")
        if best is None or plan.weighted_jct_s < best.weighted_jct_s - 1e-9:
            best = plan
    if best is None:
        raise PlanningError("auto: no candidate policy produced a plan: "
                            + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    best.candidates = scores
    best.params = {"chosen": best.policy, **best.params}
    best.policy = f"auto:{best.policy}"
    best.planning_time_s = time.perf_counter() - t0
    return best


__all__ = ["make_plan", "plan_problem", "AUTO_CANDIDATES", "HetschedError"]
