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
              running_gpus: dict[str, list[tuple[str, int]]] | None = None,
              running_fixed: bool = False,
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
    (planning/space/placer.py). ``running_gpus`` (replan: job -> the GPUs it runs on
    now) starts space mode's evaluator with those jobs there, so its keep-or-move
    decision (planning/space/decide.py) is what keeps or moves them;
    ``running_fixed`` (online replan) keeps them there until they end.
    ``budget_s``: seconds space mode's ``auto`` may spend (default: setting
    ``plan_budget_s``; app/plan.py passes it).
    Raises InputError for bad inputs and PlanningError when no plan can be made.
    The plan records these settings (``Plan.settings``) so replan can repeat them.
    """
    rep = reporter or NULL_REPORTER
    settings = PlanSettings(mode, policy, dict(params or {}), static, restart_cost_s,
                            task_iterations)
    jobs, predicted = predict_lengths(jobs, progress_history, epochs_done)
    problem = PlanningProblem(jobs, cluster, table, jobs_source=jobs_source,
                              progress_history=progress_history,
                              prefer_gpus=dict(prefer_gpus or {}),
                              running_gpus=dict(running_gpus or {}),
                              running_fixed=running_fixed)
    if mode == "pool":  # pool mode lives in its own package
        from hetsched.planning.pool import plan_pool

        if static:
            raise PlanningError("--static applies to space mode; pool mode plans every task")
        plan = plan_pool(problem, policy, params, task_iterations=task_iterations,
                         reporter=rep, restart_cost_s=restart_cost_s)
    elif mode == "space":
        plan = plan_problem(problem, policy, params, static=static,
                            restart_cost_s=restart_cost_s, reporter=rep, budget_s=budget_s)
    elif mode == "auto":  # space, or pool where it predicts POOL_MARGIN less
        plan = _plan_either(problem, policy, params, static=static,
                            restart_cost_s=restart_cost_s, task_iterations=task_iterations,
                            reporter=rep, budget_s=budget_s)
    else:
        raise PlanningError(f"unknown mode {mode!r}; expected space, pool or auto")
    plan.settings = settings
    for jp in plan.jobs:  # carried into the plan, so the next replan adds to it
        jp.epochs_done = max(0.0, float((epochs_done or {}).get(jp.name, 0.0)))
    if predicted is not None:
        plan.notes.length_prediction = predicted
    rep.planning_done(plan.policy, plan.weighted_jct_s, plan.planning_time_s)
    return plan


#: ``--mode auto`` keeps pool mode only when it predicts at least this share less
#: weighted JCT than space mode (:func:`_plan_either`)
POOL_MARGIN = 0.02


def _plan_either(problem: PlanningProblem, policy: str, params: dict[str, Any] | None, *,
                 static: bool, restart_cost_s: float, task_iterations: int | None,
                 reporter: BaseReporter, budget_s: float | None = None) -> Plan:
    """``--mode auto``: plan both modes (``policy`` where it exists, else auto) and keep the better.

    Pool mode is kept only when it predicts at least :data:`POOL_MARGIN` less weighted
    JCT than space mode: its plan starts from the space plan, so it is never above it,
    and a sliver below it (a few backfilled tasks) does not pay for a time-sharing
    executor whose per-task costs the profile knows only once it has run.

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
                sp = plans.get("space") if pol == "auto" else None
                plans[m] = plan_pool(problem, pol, params if pol == policy else None,
                                     task_iterations=task_iterations, reporter=reporter,
                                     restart_cost_s=restart_cost_s,
                                     space_plan=sp if sp is not None and sp.policy.startswith(
                                         "auto") else None)
        except PlanningError as e:
            skipped[m] = str(e)
    if not plans:
        raise PlanningError("--mode auto: neither mode produced a plan: "
                            + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    best = plans.get("space") or plans["pool"]
    if "pool" in plans and plans["pool"].weighted_jct_s < best.weighted_jct_s * (
            1 - POOL_MARGIN):
        best = plans["pool"]
    best.notes.mode_candidates = {m: round(pl.weighted_jct_s, 6) for m, pl in plans.items()}
    if skipped:
        best.notes.mode_skipped = skipped
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
        plan = _or_fallback(problem, pol, plan, static, restart_cost_s)
        if getattr(pol, "keep_fixed", False):
            fixed = _auto(problem, registry.auto_candidates("space"), static, restart_cost_s,
                          NULL_REPORTER, budget_s, workers)
            plan = _or_fixed(plan, fixed)
        if getattr(cls, "colocates", False) and not any(
                s.group is not None for jp in plan.jobs for s in jp.segments):
            from hetsched.core.memory import no_group_reason  # say why sharing never paid

            plan.notes.no_group = no_group_reason(problem)
            rep.note(f"{cls.name} formed no co-location group: {plan.notes.no_group}")
        return plan
    if params:
        raise PlanningError("--param applies to one policy; 'auto' runs each with its defaults")
    names = registry.auto_candidates("space")
    reg = registry.policies("space")
    if any(j.elastic for j in problem.jobs):  # elastic jobs: the batch-deciding ones too,
        # first among the searches (only they can change a batch)
        el = [n for n in sorted(reg) if getattr(reg[n], "auto_elastic", False) and n not in names]
        at = names.index("exhaustive") if "exhaustive" in names else len(names)
        names = (*names[:at], *el, *names[at:])
    rep.planning_started("space", "auto", names)
    return _auto(problem, names, static, restart_cost_s, rep, budget_s, workers)


def _or_fixed(plan: Plan, fixed: Plan) -> Plan:
    """A batch-deciding policy (``ones``) is never worse than the best fixed-batch plan
    (``auto`` over the fixed-batch policies): both are evaluated by the same evaluator and
    the lower weighted JCT is kept (``extra['fixed_start']`` says which and by how much)."""
    info = {"fixed": fixed.policy, "own_weighted_jct_s": float(plan.weighted_jct_s),
            "fixed_weighted_jct_s": float(fixed.weighted_jct_s)}
    if fixed.weighted_jct_s < plan.weighted_jct_s - 1e-9:
        fixed.planning_time_s += plan.planning_time_s
        fixed.params = {**plan.params, "kept": fixed.policy}
        fixed.policy = plan.policy
        fixed.extra.update({k: v for k, v in plan.extra.items() if k not in fixed.extra})
        fixed.notes = fixed.notes.merged_under(plan.notes)
        plan = fixed
    else:
        plan.planning_time_s += fixed.planning_time_s
    plan.notes.fixed_start = {**info, "kept": "fixed" if plan is fixed else "own"}
    return plan


def _auto(problem: PlanningProblem, names: tuple[str, ...], static: bool,
          restart_cost_s: float, rep: BaseReporter, budget_s: float | None,
          workers: int | None) -> Plan:
    """auto over ``names`` (planning/select.py): the best plan, with what it skipped."""
    t0 = time.perf_counter()
    reg = registry.policies("space")
    if budget_s is None:
        from hetsched import config

        budget_s = float(config.get("plan_budget_s"))
    if workers is None:
        workers = default_workers() if problem.S * problem.K > PARALLEL_MIN_SIZE else 1

    first: list[Plan] = []

    def run(name: str, limit: float | None) -> Plan:
        plan = simulate(problem, reg[name](), static=static, restart_cost_s=restart_cost_s,
                        reporter=rep if workers == 1 else None, work_limit=limit)
        if not first:
            first.append(plan)
        return plan

    def cost(name: str) -> float | None:
        """Predicted counted work, from the active jobs at each event of the first plan."""
        if not first:
            return None
        return reg[name].predict_work(problem, first[0].work[1],  # type: ignore[attr-defined]
                                      horizon_s=first[0].makespan_s)

    sel = best_of(names, run, lambda p: p.weighted_jct_s, reporter=rep, budget_s=budget_s,
                  cost=cost, work=lambda p: p.work[0],  # type: ignore[attr-defined]
                  workers=workers)
    if sel.best is None:
        raise PlanningError("auto: no candidate policy produced a plan: "
                            + "; ".join(f"{k}: {v}" for k, v in sel.not_run().items()))
    best = sel.best
    best.candidates = sel.scores
    best.params = {"chosen": best.policy, **best.params}
    best.policy = f"auto:{best.policy}"
    if sel.not_run():
        best.notes.skipped = sel.not_run()
    best.planning_time_s = time.perf_counter() - t0
    best.notes.predicted_work_s = {n: round(float(v or 0.0), 3)
                                      for n, v in sel.predicted.items()}
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
    plan.notes.fallback = {**info, "kept": "base" if plan.params.get("kept") else "own"}
    return plan


def __getattr__(name: str) -> Any:
    """``AUTO_CANDIDATES``: what space-mode auto runs (every registered policy, in order)."""
    if name == "AUTO_CANDIDATES":
        return registry.auto_candidates("space")
    raise AttributeError(name)


__all__ = ["make_plan", "plan_problem", "HetschedError", "InputError"]
