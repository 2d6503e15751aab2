"""The `plan` use case: one policy, or `auto` over every registered one, through the evaluator."""

from __future__ import annotations

import time
from typing import Any

from hetsched.config import DEFAULT_RESTART_COST_S
from hetsched.core.plan import Plan, PlanSettings
from hetsched.core.problem import PlanningProblem
from hetsched.core.report import NULL_REPORTER, BaseReporter
from hetsched.core.spec import Cluster, Job
from hetsched.core.throughput import ThroughputTable
from hetsched.errors import HetschedError, InputError, PlanningError
from hetsched.planning import registry
from hetsched.planning.lengths import predict_lengths
from hetsched.planning.select import best_of, default_workers
from hetsched.planning.space.evaluator import simulate

#: active jobs x GPUs above which auto's candidates run in parallel processes
PARALLEL_MIN_SIZE = 20_000


def make_plan(jobs: list[Job], cluster: Cluster, table: ThroughputTable, policy: str = "auto",
              params: dict[str, Any] | None = None, *, static: bool = False,
              restart_cost_s: float = DEFAULT_RESTART_COST_S, jobs_source: str = "jobs",
              mode: str = "space",
              task_iterations: int | None = None,
              reporter: BaseReporter | None = None,
              progress_history: tuple[Any, Any] | None = None,
              epochs_done: dict[str, float] | None = None,
              prefer_gpus: dict[str, list[tuple[str, int]]] | None = None,
              budget_s: float | None = None) -> Plan:
    """Plan ``jobs`` on ``cluster``. ``policy='auto'`` keeps the best registered policy.

    ``mode='pool'`` plans task-level sharing of the whole pool instead
    (Hare; :mod:`hetsched.planning.pool`, docs/pool.md); ``task_iterations`` is its task size.
    ``reporter`` receives progress (:class:`hetsched.core.report.BaseReporter`).
    ``progress_history``:
    completed jobs' (features, progress) pairs from the state store, for the
    policies that predict remaining work (``ones``); with enough of it every policy
    plans a ``target_loss`` job at the predictor's expected length
    (planning/lengths.py; ``epochs_done``: job -> epochs it has run, replan, kept in
    each ``JobPlan.epochs_done``), and the plan records it (``length_prediction``).
    ``prefer_gpus`` (replan: job -> the (node, GPU index) it holds or waits for in
    Slurm) makes space mode keep those GPUs for a job given the same per-type counts
    (planning/space/placer.py). ``budget_s``: seconds space mode's ``auto`` may spend
    (default: setting ``plan_budget_s``; app/plan.py passes it).
    Raises InputError for bad inputs and PlanningError when no plan can be made.
    The plan records these settings (``Plan.settings``) so replan can repeat them.
    """
    rep = reporter or NULL_REPORTER
    settings = PlanSettings(mode, policy, dict(params or {}), static, restart_cost_s,
                            task_iterations)
    jobs, predicted = predict_lengths(jobs, progress_history, epochs_done)
    problem = PlanningProblem(jobs, cluster, table, jobs_source=jobs_source,
                              progress_history=progress_history,
                              prefer_gpus=dict(prefer_gpus or {}))
    if mode == "pool":  # pool mode (issue 3) lives in its own package
        from hetsched.planning.pool import plan_pool

        if static:
            raise PlanningError("--static applies to space mode; pool mode plans every task")
        plan = plan_pool(problem, policy, params, task_iterations=task_iterations,
                         reporter=rep)
    elif mode == "space":
        plan = plan_problem(problem, policy, params, static=static,
                            restart_cost_s=restart_cost_s, reporter=rep, budget_s=budget_s)
    elif mode == "auto":  # issue 11.4: space or pool, whichever predicts less weighted JCT
        plan = _plan_either(problem, policy, params, static=static,
                            restart_cost_s=restart_cost_s, task_iterations=task_iterations,
                            reporter=rep, budget_s=budget_s)
    else:
        raise PlanningError(f"unknown mode {mode!r}; expected space, pool or auto")
    plan.settings = settings
    for jp in plan.jobs:  # carried into the plan, so the next replan adds to it
        jp.epochs_done = max(0.0, float((epochs_done or {}).get(jp.name, 0.0)))
    if predicted is not None:
        plan.extra["length_prediction"] = predicted
    rep.planning_done(plan.policy, plan.weighted_jct_s, plan.planning_time_s)
    return plan


def _plan_either(problem: PlanningProblem, policy: str, params: dict[str, Any] | None, *,
                 static: bool, restart_cost_s: float, task_iterations: int | None,
                 reporter: BaseReporter, budget_s: float | None = None) -> Plan:
    """``--mode auto``: plan both modes (``policy`` where it exists, else auto) and keep the better.

    The plan says what each mode predicted (``mode_candidates``) and why a mode
    could not plan (``mode_skipped``).
    """
    from hetsched.planning import registry
    from hetsched.planning.pool import plan_pool

    plans: dict[str, Plan] = {}
    skipped: dict[str, str] = {}
    for m in ("space", "pool"):
        pol = policy if policy == "auto" or policy in registry.policies(m) else "auto"
        try:
            if m == "space":
                plans[m] = plan_problem(problem, pol, params if pol == policy else None,
                                        static=static, restart_cost_s=restart_cost_s,
                                        reporter=reporter, budget_s=budget_s)
            elif static:
                skipped[m] = "--static applies to space mode"
            else:
                plans[m] = plan_pool(problem, pol, params if pol == policy else None,
                                     task_iterations=task_iterations, reporter=reporter)
        except PlanningError as e:
            skipped[m] = str(e)
    if not plans:
        raise PlanningError("--mode auto: neither mode produced a plan: "
                            + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    best = min(plans.values(), key=lambda pl: pl.weighted_jct_s)
    best.extra["mode_candidates"] = {m: round(pl.weighted_jct_s, 6) for m, pl in plans.items()}
    if skipped:
        best.extra["mode_skipped"] = skipped
    return best


def plan_problem(problem: PlanningProblem, policy: str = "auto",
                 params: dict[str, Any] | None = None, *, static: bool = False,
                 restart_cost_s: float = DEFAULT_RESTART_COST_S,
                 reporter: BaseReporter | None = None,
                 budget_s: float | None = None, workers: int | None = None) -> Plan:
    """Space mode: one policy, or ``auto`` (every registered policy it can afford)."""
    rep = reporter or NULL_REPORTER
    if policy != "auto":
        cls = registry.resolve(policy, "space", rep)
        pol = cls.build(params)
        rep.planning_started("space", cls.name, [cls.name])
        rep.candidate_started(cls.name)
        plan = simulate(problem, pol, static=static, restart_cost_s=restart_cost_s,
                        reporter=rep)
        rep.candidate_done(cls.name, plan.weighted_jct_s, plan.planning_time_s)
        return _or_fallback(problem, pol, plan, static, restart_cost_s)
    if params:
        raise PlanningError("--param applies to one policy; 'auto' runs each with its defaults")
    t0 = time.perf_counter()
    names = registry.auto_candidates("space")
    reg = registry.policies("space")
    rep.planning_started("space", "auto", names)
    if budget_s is None:
        from hetsched import config

        budget_s = float(config.get("plan_budget_s"))
    if workers is None:
        workers = default_workers() if problem.S * problem.K > PARALLEL_MIN_SIZE else 1

    def run(name: str, deadline: float | None) -> Plan:
        return simulate(problem, reg[name](), static=static, restart_cost_s=restart_cost_s,
                        reporter=rep if workers == 1 else None, deadline=deadline)

    sel = best_of(names, run, lambda p: p.weighted_jct_s, reporter=rep, budget_s=budget_s,
                  cost=lambda n: reg[n].cost(problem), workers=workers)
    if sel.best is None:
        raise PlanningError("auto: no candidate policy produced a plan: "
                            + "; ".join(f"{k}: {v}" for k, v in sel.not_run().items()))
    best = sel.best
    best.candidates = sel.scores
    best.params = {"chosen": best.policy, **best.params}
    best.policy = f"auto:{best.policy}"
    if sel.not_run():
        best.extra["skipped"] = sel.not_run()
    best.planning_time_s = time.perf_counter() - t0
    return best


def _or_fallback(problem: PlanningProblem, pol: Any, plan: Plan, static: bool,
                 restart_cost_s: float) -> Plan:
    """A policy with ``fallback()`` (``harmony-jct``) is never worse than that policy:
    both are evaluated and the lower weighted JCT is kept (``extra['fallback']`` says which)."""
    fallback = getattr(pol, "fallback", None)
    if fallback is None:
        return plan
    alt = simulate(problem, fallback(), static=static, restart_cost_s=restart_cost_s)
    info = {"base": alt.policy, "own_weighted_jct_s": float(plan.weighted_jct_s),
            "base_weighted_jct_s": float(alt.weighted_jct_s)}
    if alt.weighted_jct_s < plan.weighted_jct_s:
        alt.planning_time_s += plan.planning_time_s
        alt.params = {**plan.params, "kept": alt.policy}
        alt.policy = plan.policy
        plan = alt
    else:
        plan.planning_time_s += alt.planning_time_s
    plan.extra["fallback"] = {**info, "kept": "base" if plan.params.get("kept") else "own"}
    return plan


def __getattr__(name: str) -> Any:
    """``AUTO_CANDIDATES``: what space-mode auto runs (every registered policy, in order)."""
    if name == "AUTO_CANDIDATES":
        return registry.auto_candidates("space")
    raise AttributeError(name)


__all__ = ["make_plan", "plan_problem", "HetschedError", "InputError"]
