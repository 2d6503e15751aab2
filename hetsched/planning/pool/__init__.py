"""Pool mode (Hare, HPDC'22): a fixed set of GPUs shared by many jobs at task granularity.

``plan_pool`` is the entry point: it builds the Hare_Sched instance
(:mod:`.problem`), runs one registered policy (:mod:`.policies`: ``hare`` or a
baseline ``pool-fifo``, ``pool-srtf``, ``pool-homo``, ``pool-allox``) or
``auto`` (all of them through :func:`hetsched.planning.select.best_of`,
keeping the lowest total weighted JCT), validates and scores the schedule with the one evaluator
(:mod:`.evaluator`) and returns a :class:`~hetsched.core.plan.Plan` whose ``tasks``
section carries the per-GPU task sequences with the memory plan.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.core.report import NULL_REPORTER, BaseReporter
from hetsched.errors import InputError, PlanningError
from hetsched.planning.pool.evaluator import TaskSchedule, evaluate, to_plan
from hetsched.planning.pool.policies import POOL_REGISTRY
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.pool.relaxation import alpha, relaxation
from hetsched.planning.pool.union_bound import union_bound

if TYPE_CHECKING:
    from hetsched.planning.pool.space_seed import SpaceWork
    from hetsched.planning.select import Background


def __getattr__(name: str) -> Any:
    """``POOL_POLICIES`` (name -> (summary, paper)) and ``POOL_AUTO``, from the registry."""
    from hetsched.planning import registry

    if name == "POOL_POLICIES":
        return {n: (c.summary, c.paper) for n, c in registry.policies("pool").items()}
    if name == "POOL_AUTO":
        return registry.auto_candidates("pool")
    if name == "HARE_PARAMS":
        return POOL_REGISTRY["hare"].parameters()
    raise AttributeError(name)


def plan_pool(problem: PlanningProblem, policy: str = "auto", params: dict[str, Any] | None = None,
              *, task_iterations: int | None = None,
              reporter: BaseReporter | None = None, space_plan: Plan | None = None,
              restart_cost_s: float | None = None, fuse: bool = True) -> Plan:
    """Plan ``problem`` in pool mode with ``policy`` (a registered pool policy or ``auto``).

    ``space_plan``: the best space plan of ``problem`` when the caller has it (``--mode
    auto``); else, where a policy asks for it (``hare``'s ``space``), it is planned here
    (space mode's auto, with ``restart_cost_s``; None: the default). ``fuse=False``: one
    step's slice per executor pass (the model before fused passes, for comparisons; a
    plan so made runs as planned only by an executor told no ``chunk``, which its plan
    file then does not carry).
    """
    from hetsched.planning import registry

    rep = reporter or NULL_REPORTER
    t0 = time.perf_counter()
    params = dict(params or {})
    if policy == "auto" and params:
        raise InputError("--param", "--param applies to one policy; 'auto' runs each with "
                         "its defaults")
    if policy == "auto":
        names = registry.auto_candidates("pool")
        pols = {n: registry.resolve(n, "pool").build() for n in names}
    else:
        cls = registry.resolve(policy, "pool", rep)
        names = (cls.name,)
        pols = {cls.name: cls.build(params)}
    pp = PoolProblem(problem, task_iterations=task_iterations, fuse=fuse)
    if space_plan is None and problem.estimates.bound is None:
        # pool mode alone: its plans have their own bounds (union_bound.py, with the
        # joint LP on pool rates), so the space seed's joint LP would only be reported
        problem.estimates.joint_lp = False
    rep.planning_started("pool", policy, names)
    # the bound is the policy-independent relaxation (Hare reuses it for its order)
    rel = relaxation(pp, str(params.get("bound", "auto")))

    uses, work = _seed_space(problem, pp, pols, space_plan, restart_cost_s)
    try:
        # the bound of every plan pool mode may keep, while the space seed is planned
        # beside (its joint LP is 1-3 s of CPU at 30-200 jobs)
        bound = union_bound(problem, pp) if uses else None
        plan = _schedule(pp, policy, names, pols, rel, rep, task_iterations)
        space_plan = None if work is None else work.result().plan
    finally:
        if work is not None:
            work.close()
    if space_plan is not None and bound is not None and "keep" in uses:
        plan = _or_space(plan, space_plan, bound)
    elif space_plan is not None and bound is not None:  # seeded only: how the plans compare
        plan.notes.pool_vs_space = {"space_policy": space_plan.policy,
                                    "space_weighted_jct_s": float(space_plan.weighted_jct_s),
                                    "pool_weighted_jct_s": float(plan.weighted_jct_s),
                                    "kept": "pool plan (space=seed)"}
        _union_bound(plan, bound)
    plan.planning_time_s = time.perf_counter() - t0
    return plan


def _schedule(pp: PoolProblem, policy: str, names: tuple[str, ...], pols: dict[str, Any],
              rel: Any, rep: BaseReporter, task_iterations: int | None) -> Plan:
    """Run ``policy`` (or each of auto's ``names``) and make the best schedule a plan."""
    from hetsched.planning.select import best_of

    t0 = time.perf_counter()

    def run(name: str, deadline: float | None = None) -> tuple[TaskSchedule, float]:
        s = pols[name].schedule(pp, rel)
        return s, evaluate(pp, s).objective

    if policy == "auto":
        sel = best_of(names, run, lambda r: r[1], reporter=rep)
        if sel.best is None:
            raise PlanningError("auto: no pool policy produced a plan: "
                                + "; ".join(f"{k}: {v}" for k, v in sel.not_run().items()))
        sched, chosen, scores = sel.best[0], str(sel.best_name), sel.scores
    else:
        rep.candidate_started(names[0])
        sched, v = run(names[0])
        rep.candidate_done(names[0], v, time.perf_counter() - t0)
        chosen, scores = names[0], {}
    ev = evaluate(pp, sched)
    extra: dict[str, Any] = {"bound": rel.method, "alpha": round(alpha(pp), 6),
                             "task_iterations": "auto" if task_iterations is None
                             else int(task_iterations)}
    if policy == "auto":
        extra["chosen"] = chosen
    if int(pp.P.sum()) < pp.K and pp.parallelism_notes:
        # fewer task slots than GPUs: say why GPUs may idle while tasks wait
        extra["idle_gpus_reason"] = pp.parallelism_notes
    plan = to_plan(pp, sched, ev, rel.value, params=extra)
    plan.policy = f"auto:{chosen}" if policy == "auto" else chosen
    if policy == "auto":
        plan.candidates = scores
        if sel.not_run():
            plan.notes.skipped = sel.not_run()
    return plan


def _seed_space(problem: PlanningProblem, pp: PoolProblem, pols: dict[str, Any],
                space_plan: Plan | None, restart_cost_s: float | None
                ) -> tuple[set[str], Background[SpaceWork] | None]:
    """The policies' ``space`` uses, and the space plan's work they get (started here).

    A space plan is a pool plan whose GPUs each run one job's work back to back: plan
    it, seed Hare with it, keep it when time sharing does not beat it (space_seed.py).
    Up to ``POOL_COSTS_MAX_JOBS`` jobs space mode, and Smith's rule on the whole cluster
    (smith_seed.py), are also planned on the pool's costs (no restart cost, the pool's
    synchronisation, its fused steps), and the task plans within ``IMPROVE_WITHIN`` of
    the lowest are improved. Planning them, and making them task plans and improving
    them, needs nothing of Hare's own orders, so it runs beside them in forked processes
    where the machine has more than one core (``plan_workers``); the result is the same
    either way.
    """
    from hetsched.planning.pool import space_seed
    from hetsched.planning.select import Background, default_workers

    uses = {getattr(pol, "space", "off") for pol in pols.values()} - {"off"}
    if not uses:
        return uses, None
    given = space_plan

    def plan_it() -> Plan | None:
        if given is not None:  # a copy: the kept plan's notes are written on it
            return copy.deepcopy(given)
        return _space_plan(problem, restart_cost_s)  # the same plan space mode gives

    improve = any(getattr(pol, "improves_space", False) for pol in pols.values())

    def plan_pool_costs() -> dict[str, Plan | None]:  # on the pool's costs (space_seed.py)
        from hetsched.planning.pool.smith_seed import smith_plan

        q = space_seed.pool_costs_problem(problem, pp)
        return {"space-pool-costs": _space_plan(q, 0.0), "smith-pool-costs": smith_plan(
            q, lambda plan: space_seed.task_count(pp, plan) <= space_seed.SEED_MAX_TASKS)}

    costs = plan_pool_costs if space_seed.POOL_COSTS_SEED \
        and problem.S <= space_seed.POOL_COSTS_MAX_JOBS else None
    workers = default_workers()
    work = Background(lambda: space_seed.space_work(pp, plan_it, improve, costs, workers),
                      workers)
    for pol in pols.values():
        if getattr(pol, "space", "off") != "off":
            pol.space_source = work.result
    return uses, work


def _space_plan(problem: PlanningProblem, restart_cost_s: float | None,
                share: float | None = None) -> Plan | None:
    """The best space plan (space mode's auto; with ``share``, within that share of its
    budget ``plan_budget_s``), or None when space mode cannot plan."""
    from hetsched import config
    from hetsched.config import DEFAULT_RESTART_COST_S
    from hetsched.planning.planner import plan_problem

    rc = DEFAULT_RESTART_COST_S if restart_cost_s is None else restart_cost_s
    budget = None if share is None else share * float(config.get("plan_budget_s"))
    try:
        return plan_problem(problem, "auto", restart_cost_s=rc, budget_s=budget)
    except PlanningError:
        return None


def _union_bound(plan: Plan, bound: tuple[float, dict[str, float]]) -> None:
    """Set on ``plan`` the bound of every plan pool mode may keep (union_bound.py: each job
    alone, the pooled speed and, where it runs, the joint LP on pool rates, all on compute
    alone), with its kind and parts. An equal-slice plan
    is also above the pool relaxation, which the plan reports beside it."""
    value, parts = bound
    kind = ("the largest of three bounds on compute alone: each job alone, the pooled "
            "speed, the joint LP on pool rates" if "lp" in parts else
            "the larger of two bounds on compute alone: each job alone, the pooled speed")
    plan.lower_bound_extra = {
        **plan.lower_bound_extra, "kind": kind,
        "alone_s": float(parts["alone"]), "pooled_s": float(parts["pooled"]),
        **({"lp_s": float(parts["lp"])} if "lp" in parts else {}),
        # the pool relaxation bounds equal-slice plans only: reported, not the bound
        "pool_relaxation_s": float(plan.lower_bound_s)}
    plan.lower_bound_s = float(value)


def _or_space(plan: Plan, space: Plan, bound: tuple[float, dict[str, float]]) -> Plan:
    """Keep the task plan or the space plan, whichever predicts less weighted JCT.

    Time sharing must pay for itself: the task plan is kept only when strictly below the
    space plan, so a tie (one job, or rounding) keeps the plainer plan and the kept
    plan's weighted JCT is exactly the minimum of the two. The kept plan reports the
    bound of both sets (:func:`_union_bound`).
    """
    info = {"pool_policy": plan.policy, "pool_weighted_jct_s": float(plan.weighted_jct_s),
            "space_policy": space.policy, "space_weighted_jct_s": float(space.weighted_jct_s),
            "pool_bound_s": float(plan.lower_bound_s),
            "space_bound_s": float(space.lower_bound_s), "alone_bound_s": bound[1]["alone"],
            "pooled_bound_s": bound[1]["pooled"],
            **({"lp_bound_s": bound[1]["lp"]} if "lp" in bound[1] else {})}
    pool_bound = plan.lower_bound_s
    if not plan.weighted_jct_s < space.weighted_jct_s:
        space.extra.update({k: v for k, v in plan.extra.items()
                            if k in ("bound", "alpha", "task_iterations")})
        space.candidates = {**plan.candidates, space.policy: float(space.weighted_jct_s)}
        plan = space
        info["kept"] = "space plan"
    else:
        info["kept"] = "pool plan"
    plan.lower_bound_s = pool_bound
    _union_bound(plan, bound)
    plan.notes.pool_vs_space = info
    return plan


__all__ = ["plan_pool", "POOL_REGISTRY", "PoolProblem", "relaxation"]
