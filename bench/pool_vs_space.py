"""Pool mode against space mode on one instance, before and after pool plans contain
space plans (used by bench_pool.py --space and bench_gavel_replay.py --pool).

For one PlanningProblem, all on the same space plan (space mode's ``auto``):

* ``space``: its weighted JCT, and ``idle``: the share of GPU time it leaves idle
  over its makespan (1 - busy GPU-seconds / (GPUs x makespan)); ``idle_waiting``:
  the part of it while some job waits (arrived, unfinished, on no GPU);
* ``off``: Hare on the pool model alone (``space=off``, the paper);
* ``before``: Hare as it was before the pool model could express space plans: its
  orders plus the space plan's order as a seed (equal slices, the pool model);
* ``after``: pool mode's default (``space=seed``): the lower of the space plan's exact
  task plan and that of space mode planned on the pool's costs (one exchange per round,
  no restart cost; up to 200 jobs), left-shifted, backfilled and its waiting jobs
  re-placed into the gaps, or Hare's own plan when lower; ``space_costs``: the same
  from the space plan on space mode's own costs only (the default before the pool's
  costs joined it); ``no_reinsert``: that without the re-placement (the default
  before it); all in the same run;
* ``exact``: the space plan's task plan as the pool evaluator times it (no
  improvement): equal to ``space`` up to whole-iteration rounding;
* ``bound``: the default plan's lower bound (min of the pool relaxation and the
  space bound): no plan of either kind is below it, so ``1 - bound / space`` is the
  most any could gain on the space plan.
"""

from __future__ import annotations

import time
from typing import Any

from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.planning.planner import plan_problem
from hetsched.planning.pool import plan_pool, reinsert
from hetsched.planning.pool import space_seed as seed_mod
from hetsched.planning.pool.evaluator import evaluate
from hetsched.planning.pool.from_space import space_tasks
from hetsched.planning.pool.policies import Hare
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.pool.relaxation import relaxation
from hetsched.planning.pool.space_seed import SpaceWork, space_seed

DEFAULT_WORK = reinsert.MAX_WORK


def idle_share(plan: Plan, gpus: int) -> float:
    """1 - busy GPU-seconds / (GPUs x makespan) of a space plan (restarts count as busy)."""
    busy = sum((s.end_s - s.start_s) * len(s.workers) for j in plan.jobs for s in j.segments)
    span = max((s.end_s for j in plan.jobs for s in j.segments), default=0.0)
    return 1.0 - busy / (gpus * span) if span > 0 else 0.0


def idle_while_waiting(plan: Plan, gpus: int) -> float:
    """Share of GPU time (over the makespan) a space plan leaves idle while some job has
    arrived, is not finished and runs on no GPU: idle capacity a waiting job could use."""
    segs = [(s.start_s, s.end_s, len(s.workers), j.name) for j in plan.jobs for s in j.segments]
    end = {j.name: max(s.end_s for s in j.segments) for j in plan.jobs}
    arr = {j.name: j.arrival_s for j in plan.jobs}
    times = sorted({t for a, b, _, _ in segs for t in (a, b)} | set(arr.values()))
    out = 0.0
    for a, b in zip(times[:-1], times[1:], strict=True):
        m = 0.5 * (a + b)
        now = [(k, n) for s0, s1, k, n in segs if s0 <= m < s1]
        running = {n for _, n in now}
        if any(arr[n] <= m < end[n] and n not in running for n in arr):
            out += (gpus - sum(k for k, _ in now)) * (b - a)
    span = max(end.values(), default=0.0)
    return out / (gpus * span) if span > 0 else 0.0


def before(p: PlanningProblem, space: Plan) -> float:
    """Hare before: its orders and the space plan's order as a seed, equal slices."""
    pp = PoolProblem(p)
    pol = Hare(space="seed")
    pol.space_source = lambda: SpaceWork(space, seed=space_seed(pp, space))
    return evaluate(pp, pol.schedule(pp, relaxation(pp))).objective


def compare(p: PlanningProblem, restart_cost_s: float | None = None) -> dict[str, Any]:
    """The numbers of the module docstring for ``p`` (ratios to the space plan)."""
    kw = {} if restart_cost_s is None else {"restart_cost_s": restart_cost_s}
    t0 = time.perf_counter()
    space = plan_problem(p, "auto", **kw)
    out: dict[str, Any] = {"space": space.weighted_jct_s, "space_policy": space.policy,
                           "idle": idle_share(space, p.K),
                           "idle_waiting": idle_while_waiting(space, p.K),
                           "space_s": round(time.perf_counter() - t0, 2)}
    pp = PoolProblem(p)
    got = space_tasks(pp, space)
    out["exact"] = evaluate(pp, got[0]).objective if got is not None else None
    t0 = time.perf_counter()
    out["before"] = before(p, space)
    out["before_s"] = round(time.perf_counter() - t0, 2)
    for tag, params in (("off", {"space": "off"}), ("no_reinsert", None), ("space_costs", None),
                        ("after", None)):
        t0 = time.perf_counter()
        # no_reinsert: the default without re-placing waiting jobs into the gaps, nor the
        # seed on the pool's costs; space_costs: without that seed
        reinsert.MAX_WORK = 0 if tag == "no_reinsert" else DEFAULT_WORK
        seed_mod.POOL_COSTS_SEED = tag == "after"
        try:
            plan = plan_pool(p, "hare", params, space_plan=space, **kw)
        finally:
            reinsert.MAX_WORK = DEFAULT_WORK
            seed_mod.POOL_COSTS_SEED = True
        out[tag] = plan.weighted_jct_s
        out[f"{tag}_s"] = round(time.perf_counter() - t0, 2)
        if tag == "after":
            out["after_order"] = plan.params.get("order")
            out["backfill_moves"] = plan.params.get("backfill_moves")
            out["reinserted_jobs"] = plan.params.get("reinserted_jobs")
            out["bound"] = plan.lower_bound_s
    out["bound_over_space"] = out["bound"] / space.weighted_jct_s
    for k in ("exact", "before", "off", "no_reinsert", "space_costs", "after"):
        if out[k] is not None:
            out[f"{k}_over_space"] = out[k] / space.weighted_jct_s
    return out


HEADER = ("| instance | space auto (s) | idle GPU share (while a job waits) | exact / space | paper (off) / space | "
          "before / space | no re-placement / space | space costs only / space | "
          "after / space | after's start | backfill moves | jobs re-placed | bound / space |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")


def row(name: str, r: dict[str, Any]) -> str:
    ex = f"{r['exact_over_space']:.4f}" if r.get("exact_over_space") is not None else "-"
    return (f"| {name} | {r['space']:.4g} ({r['space_policy']}) | {100 * r['idle']:.1f}% "
            f"({100 * r['idle_waiting']:.2f}%) | "
            f"{ex} | {r['off_over_space']:.3f} | {r['before_over_space']:.3f} | "
            f"{r['no_reinsert_over_space']:.4f} | {r['space_costs_over_space']:.4f} | "
            f"{r['after_over_space']:.4f} | {r['after_order']} | {r['backfill_moves'] or 0} | "
            f"{r['reinserted_jobs'] or 0} | {r['bound_over_space']:.3f} |")
