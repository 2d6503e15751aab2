"""Smith's rule on the whole cluster: on the pool's costs jobs are nearly divisible
work, so one at a time on every GPU, in order of weighted time, is the plan to start
from (planning/pool/smith_seed.py)."""

from __future__ import annotations

import numpy as np
import pytest
from pool_helpers import check_plan

from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.planning.planner import plan_problem
from hetsched.planning.pool import plan_pool, space_seed
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.pool.smith_seed import smith_plan


def _divisible(weights: tuple[float, ...], iters: tuple[int, ...], gpus: int = 4,
               requested: int | None = None) -> PlanningProblem:
    """Jobs whose step is proportional to the local batch (no intercept, no sync): a
    step on k GPUs takes 1/k of one GPU's."""
    rows = [ProfileRow("w", "v100", b, 0.001 * b, 0.0) for b in (8, 64)]
    jobs = [Job(name=f"j{k}", workload="w", dataset_size=64 * n, epochs=1, global_batch=64,
                weight=w, requested_gpus=requested)
            for k, (w, n) in enumerate(zip(weights, iters, strict=True))]
    return PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", gpus),)),
                           ThroughputTable(rows, "<divisible>"))


def test_divisible_jobs_run_one_at_a_time_on_every_gpu_in_smiths_order() -> None:
    p = _divisible(weights=(1.0, 3.0, 1.0), iters=(400, 600, 100))
    plan = smith_plan(p)
    assert plan is not None
    # times alone on all 4 GPUs: 400, 600 and 100 steps of 0.064 / 4 s
    alone = {f"j{k}": n * 0.064 / 4 for k, n in enumerate((400, 600, 100))}
    # Smith's rule, time alone over weight, least first: j2 1.6, j1 9.6 / 3 = 3.2, j0 6.4
    order = sorted(alone, key=lambda j: alone[j] / {"j0": 1.0, "j1": 3.0, "j2": 1.0}[j])
    assert order == ["j2", "j1", "j0"]
    end, want = 0.0, 0.0
    for name in order:
        jp = next(j for j in plan.jobs if j.name == name)
        assert all(len(s.workers) == 4 for s in jp.segments)  # every GPU
        end += alone[name]
        assert jp.end_s == pytest.approx(end)
        want += jp.spec.weight * end
    assert plan.weighted_jct_s == pytest.approx(want)
    # and it is what the space planners do not find: each gives jobs some GPUs at once
    assert plan.weighted_jct_s <= plan_problem(p, "auto", restart_cost_s=0.0).weighted_jct_s


def test_a_job_gets_no_fewer_gpus_than_its_least_and_no_more_than_it_may_use() -> None:
    p = _divisible(weights=(1.0, 1.0), iters=(100, 300), requested=2)
    p.lo[:] = p.hi[:] = 2  # pinned to two GPUs each (Gavel's setting)
    plan = smith_plan(p)
    assert plan is not None
    assert {len(s.workers) for j in plan.jobs for s in j.segments} == {2}


def test_pool_mode_starts_from_it_where_its_task_plan_is_the_lowest() -> None:
    """Small-batch jobs whose passes fuse: on the pool's costs a job's step falls nearly in
    proportion to its GPUs, so Smith's whole-cluster plan is below the space planners'."""
    rows = [ProfileRow("w", "v100", b, 0.008 + 0.0003 * b, 0.0) for b in (1, 16, 80)]
    jobs = [Job(name=f"j{k}", workload="w", dataset_size=8 * 4000 * (k + 1), epochs=1,
                global_batch=8, weight=1.0 + k) for k in range(3)]
    p = PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 4),)),
                        ThroughputTable(rows, "<small batch>"))
    plan = plan_pool(p, "hare")
    params = plan.params
    assert params["order"] == "smith-pool-costs"
    assert plan.weighted_jct_s <= params["smith_tasks_s"] + 1e-6
    assert params["smith_tasks_s"] < params["pool_costs_tasks_s"]
    assert plan.lower_bound_s <= plan.weighted_jct_s
    from hetsched.io.plan_json import plan_from_dict

    again = plan_from_dict(plan.to_dict(), "<plan>")
    assert check_plan(PoolProblem(p), again) == pytest.approx(plan.weighted_jct_s,
                                                              rel=1e-6, abs=1e-4)
    # the plan the seed gives, on the pool's own costs
    q = space_seed.pool_costs_problem(p, PoolProblem(p))
    s = smith_plan(q)
    assert s is not None and all(
        len(seg.workers) == 4 for j in s.jobs for seg in j.segments)
    assert np.isfinite(s.weighted_jct_s)


def test_a_seed_of_too_many_tasks_is_not_made_a_task_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Making, timing and improving a task plan costs per task: a seed on the pool's costs
    whose task plan would exceed SEED_MAX_TASKS is left out (counted without making it)."""
    from hetsched.planning.pool.from_space import space_tasks

    rows = [ProfileRow("w", "v100", b, 0.008 + 0.0003 * b, 0.0) for b in (1, 16, 80)]
    jobs = [Job(name=f"j{k}", workload="w", dataset_size=8 * 4000 * (k + 1), epochs=1,
                global_batch=8, weight=1.0 + k) for k in range(3)]
    p = PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 4),)),
                        ThroughputTable(rows, "<small batch>"))
    pp = PoolProblem(p)
    s = smith_plan(space_seed.pool_costs_problem(p, pp))
    assert s is not None
    made = space_tasks(pp, s)
    assert made is not None
    assert space_seed.task_count(pp, s) == pytest.approx(len(made[0].job), rel=0.05)
    monkeypatch.setattr(space_seed, "SEED_MAX_TASKS", space_seed.task_count(pp, s) - 1)
    plan = plan_pool(p, "hare")
    assert "smith_tasks_s" not in plan.params
    assert plan.params["order"] != "smith-pool-costs"


def test_improving_more_seeds_never_keeps_a_higher_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every seed within IMPROVE_WITHIN of the lowest is improved and the lowest improved
    plan kept: improving all of them is never above improving only the lowest."""
    from pool_helpers import tiny_instance

    monkeypatch.setenv("HETSCHED_PLAN_WORKERS", "1")
    for p in (tiny_instance(3), tiny_instance(4), _divisible((1.0, 2.0, 1.0), (300, 100, 50))):
        monkeypatch.setattr(space_seed, "IMPROVE_WITHIN", 0.0)
        lowest = plan_pool(p, "hare")
        monkeypatch.setattr(space_seed, "IMPROVE_WITHIN", 10.0)
        every = plan_pool(p, "hare")
        assert every.weighted_jct_s <= lowest.weighted_jct_s + 1e-9
        assert every.lower_bound_s <= every.weighted_jct_s


def test_smiths_plan_is_the_lowest_over_its_grid_of_shares_and_type_orders() -> None:
    """No one share of its own speed a GPU must add, nor one order of the types, wins
    everywhere: smith_plan keeps the lowest plan over TYPE_ORDERS x EFFICIENCIES, and
    on the bundled example that is not at the middle share."""
    from pool_helpers import tiny_instance
    from test_pool_units import example_problem

    from hetsched.planning.pool.smith_seed import EFFICIENCIES, TYPE_ORDERS, WholeClusterSmith
    from hetsched.planning.space.evaluator import simulate

    grid = [(e, o) for o in TYPE_ORDERS for e in EFFICIENCIES]
    for p in (example_problem(), tiny_instance(3), _divisible((1.0, 2.0), (300, 100))):
        q = space_seed.pool_costs_problem(p, PoolProblem(p))
        each = [simulate(q, WholeClusterSmith(e, o), static=False, restart_cost_s=0.0)
                .weighted_jct_s for e, o in grid]
        best = smith_plan(q)
        assert best is not None
        assert best.weighted_jct_s == min(each)
        assert (best.params["efficiency"], best.params["types"]) == grid[int(np.argmin(each))]
        if p.S == 6:  # the example: 0.7 and 0.65 lowest, 15% below one half (measured)
            assert best.weighted_jct_s < 0.9 * each[grid.index((0.5, "fastest"))]


def test_a_job_takes_first_the_type_where_it_has_an_advantage() -> None:
    """Two jobs, both fastest on the fast type; the second runs nearly as fast on the
    slow one, the first does not. By advantage, the second takes the slow GPUs first and
    leaves the fast ones to the first; fastest first, both want the fast ones."""
    from hetsched.planning.pool.smith_seed import WholeClusterSmith

    rows = [ProfileRow("a", "v100", b, 0.001 * b, 0.0) for b in (8, 64)]
    rows += [ProfileRow("a", "k80", b, 0.010 * b, 0.0) for b in (8, 64)]
    rows += [ProfileRow("b", "v100", b, 0.001 * b, 0.0) for b in (8, 64)]
    rows += [ProfileRow("b", "k80", b, 0.0012 * b, 0.0) for b in (8, 64)]
    jobs = [Job(name=w, workload=w, dataset_size=64 * 100, epochs=1, global_batch=64)
            for w in ("a", "b")]
    p = PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 2), Node("k80-1", "k80", 2))),
                        ThroughputTable(rows, "<advantage>"))
    v100, k80 = p.types.index("v100"), p.types.index("k80")
    for types, first in (("fastest", v100), ("advantage", k80)):
        assert WholeClusterSmith(0.5, types)._order(p, 1, p.per_gpu_rate(1))[0] == first
    assert WholeClusterSmith(0.5, "advantage")._order(p, 0, p.per_gpu_rate(0))[0] == v100
    with pytest.raises(ValueError, match="types"):
        WholeClusterSmith(0.5, "slowest")


def test_smiths_grid_keeps_only_plans_that_fit_and_stops_where_the_first_does_not() -> None:
    """Pool mode makes no task plan of a seed over SEED_MAX_TASKS: smith_plan keeps the
    lowest plan that ``fits`` accepts, and where the highest share's plan (about the
    fewest tasks) does not fit, simulates no other."""
    from test_pool_units import example_problem

    from hetsched.planning.pool.smith_seed import EFFICIENCIES

    p = example_problem()
    pp = PoolProblem(p)
    q = space_seed.pool_costs_problem(p, pp)
    free = smith_plan(q)
    assert free is not None
    seen: list[int] = []

    def fits(plan: Plan) -> bool:
        seen.append(space_seed.task_count(pp, plan))
        return plan.weighted_jct_s > free.weighted_jct_s  # every plan but the lowest

    kept = smith_plan(q, fits)
    assert kept is not None and len(seen) == 2 * len(EFFICIENCIES)
    assert kept.weighted_jct_s > free.weighted_jct_s
    assert kept.params["efficiency"] != free.params["efficiency"]
    seen.clear()

    def none_fits(plan: Plan) -> bool:
        seen.append(space_seed.task_count(pp, plan))
        return False

    assert smith_plan(q, none_fits) is None
    assert len(seen) == 1  # the highest share's plan did not fit: no other simulated
