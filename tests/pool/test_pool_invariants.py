"""Hypothesis invariants of every pool-mode policy on random instances."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pool_helpers import check_plan, instances

from hetsched.planning.pool import POOL_AUTO, plan_pool
from hetsched.planning.pool.evaluator import evaluate_tasks_section
from hetsched.planning.pool.problem import PoolProblem

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("policy", POOL_AUTO)
@SETTINGS
@given(p=instances(), n=st.sampled_from([None, 1, 3]))
def test_policy_plans_are_valid(policy: str, p, n) -> None:  # type: ignore[no-untyped-def]
    """No overlap on a GPU, round barriers with sync, no task before arrival,
    objective recomputed from the tasks = reported one, lower bound <= objective
    (hare seeded with the space plan by default; keeping it is tested below)."""
    plan = plan_pool(p, policy, task_iterations=n)
    pp = PoolProblem(p, task_iterations=n)
    obj = check_plan(pp, plan)
    assert obj == pytest.approx(plan.weighted_jct_s, rel=1e-6, abs=1e-4)
    d = plan.to_dict()
    assert d["objective"]["weighted_jct_s"] == pytest.approx(obj, rel=1e-6, abs=1e-4)
    assert evaluate_tasks_section(pp, plan.tasks).objective == pytest.approx(obj, rel=1e-6,
                                                                             abs=1e-4)
    assert plan.lower_bound_s <= plan.weighted_jct_s * (1 + 1e-9) + 1e-6
    # the foundation's keys keep their meaning: JCT = end - arrival, workers listed
    for j in d["jobs"]:
        assert j["jct_s"] == pytest.approx(j["end_s"] - j["arrival_s"], abs=1e-5)
        assert j["segments"] and j["segments"][0]["workers"]


@SETTINGS
@given(p=instances(), n=st.sampled_from([None, 1, 3]))
def test_pool_mode_is_never_worse_than_space_mode(p, n) -> None:  # type: ignore[no-untyped-def]
    """A space plan is a pool plan whose GPUs each run one job's work back to back: hare
    with space=keep plans both and keeps the better, so it is never above space mode's
    auto; a kept pool-model plan is a valid task schedule, a kept space plan a space plan.
    The default (space=seed) starts from the space plan's task plan: its plan stays a task
    plan (test_pool_space_tasks.py: never above the space plan beyond rounding)."""
    from hetsched.planning.planner import plan_problem

    space = plan_problem(p, "auto")
    seeded = plan_pool(p, "hare", task_iterations=n)
    assert seeded.mode == "pool" and seeded.notes.pool_vs_space["kept"].startswith("pool")
    off = plan_pool(p, "hare", {"space": "off"}, task_iterations=n)
    assert off.notes.pool_vs_space is None
    assert seeded.weighted_jct_s <= off.weighted_jct_s * (1 + 1e-12)  # more starts tried
    for params in ({"space": "keep"}, {"space": "keep", "order": "relaxation"}):
        plan = plan_pool(p, "hare", params, task_iterations=n)
        info = plan.notes.pool_vs_space
        assert plan.weighted_jct_s <= space.weighted_jct_s * (1 + 1e-9) + 1e-9
        assert info["space_weighted_jct_s"] == pytest.approx(space.weighted_jct_s, rel=1e-9)
        assert plan.weighted_jct_s == min(info["pool_weighted_jct_s"],
                                          info["space_weighted_jct_s"])
        assert plan.lower_bound_s <= plan.weighted_jct_s * (1 + 1e-9) + 1e-6
        assert plan.lower_bound_s == max(info["alone_bound_s"], info["pooled_bound_s"],
                                         info.get("lp_bound_s", 0.0))
        assert info["alone_bound_s"] <= info["space_bound_s"] + 1e-9
        # the union's bound is below both the pool plan and the space plan
        assert plan.lower_bound_s <= min(info["pool_weighted_jct_s"],
                                         info["space_weighted_jct_s"]) * (1 + 1e-9) + 1e-6
        if info["kept"] == "pool plan":
            assert plan.mode == "pool"
            check_plan(PoolProblem(p, task_iterations=n), plan)
        else:
            assert plan.mode == "space" and plan.tasks is None


@SETTINGS
@given(p=instances())
def test_pool_mode_alone_skips_the_space_seeds_joint_lp_and_plans_the_same(
        p) -> None:  # type: ignore[no-untyped-def]
    """``--mode pool`` plans its space seed without space mode's joint LP bound (only
    reported there; the union of task and space plans has its own bounds, union_bound.py,
    the LP on pool rates among them): the same plan, bound and seed as with the space LP
    solved first, as ``--mode auto`` does."""
    import copy

    from hetsched.planning import bounds
    from hetsched.planning.planner import plan_problem

    q = copy.deepcopy(p)
    solved: list[int] = []
    real = bounds.lp_lower_bound

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        solved.append(1)
        return real(*a, **k)

    bounds.lp_lower_bound = counted
    # one process: the space seed is planned here, where the count sees it
    workers = os.environ.get("HETSCHED_PLAN_WORKERS")
    os.environ["HETSCHED_PLAN_WORKERS"] = "1"
    try:
        alone = plan_pool(p, "hare")
        assert solved == [] and p.estimates.joint_lp is False
        space = plan_problem(q, "auto")
        assert solved  # the count sees the LP where it is solved
        with_lp = plan_pool(q, "hare", space_plan=space)
    finally:
        bounds.lp_lower_bound = real
        if workers is None:
            os.environ.pop("HETSCHED_PLAN_WORKERS", None)
        else:
            os.environ["HETSCHED_PLAN_WORKERS"] = workers
    assert alone.weighted_jct_s == with_lp.weighted_jct_s
    assert alone.lower_bound_s == with_lp.lower_bound_s
    assert alone.notes.pool_vs_space == with_lp.notes.pool_vs_space
    assert alone.to_dict()["tasks"] == with_lp.to_dict()["tasks"]


@SETTINGS
@given(p=instances(max_jobs=4))
def test_auto_is_never_worse_than_a_candidate(p) -> None:  # type: ignore[no-untyped-def]
    auto = plan_pool(p, "auto")
    for name, v in auto.candidates.items():
        assert auto.weighted_jct_s <= v * (1 + 1e-9) + 1e-9, name
    assert auto.policy == f"auto:{auto.params['chosen']}"


@pytest.mark.slow
@SETTINGS
@given(p=instances(max_jobs=4), n=st.sampled_from([1, 2]))
def test_lp_and_fluid_bounds_are_below_every_policy(p, n) -> None:  # type: ignore[no-untyped-def]
    from hetsched.planning.pool.relaxation import fluid_relaxation, lp_relaxation

    pp = PoolProblem(p, task_iterations=n)
    # the pool relaxations bound pool-model plans (hare space=off), not space plans
    best = min(plan_pool(p, pol, {"space": "off"} if pol == "hare" else None,
                         task_iterations=n).weighted_jct_s for pol in POOL_AUTO)
    assert lp_relaxation(pp).value <= best * (1 + 1e-7) + 1e-6
    assert fluid_relaxation(pp).value <= best * (1 + 1e-9) + 1e-6


def test_a_tie_keeps_the_space_plan_exactly() -> None:
    """One job on one GPU: the pool plan and the space plan are the same schedule, and
    their predictions differ only by rounding (0.008000000000000028 vs ...012 once). The
    kept plan is exactly the minimum, and a tie keeps the plainer plan."""
    from hetsched.core.problem import PlanningProblem
    from hetsched.core.spec import Cluster, Job, Node
    from hetsched.core.throughput import ProfileRow, ThroughputTable

    rows = [ProfileRow("w0", "v100", b, 0.001 * b, 0.0) for b in (8, 64)]
    job = Job(name="j0", workload="w0", dataset_size=8, epochs=1, global_batch=8,
              requested_gpus=2)
    p = PlanningProblem([job], Cluster(nodes=(Node("v100-1", "v100", 1),)),
                        ThroughputTable(rows, "<tie>"))
    for n in (None, 1):
        plan = plan_pool(p, "hare", {"space": "keep"}, task_iterations=n)
        info = plan.notes.pool_vs_space
        assert plan.weighted_jct_s == min(info["pool_weighted_jct_s"],
                                          info["space_weighted_jct_s"])
        if info["pool_weighted_jct_s"] >= info["space_weighted_jct_s"]:
            assert info["kept"] == "space plan" and plan.mode == "space"
