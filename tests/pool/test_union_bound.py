"""Pool mode's bound of task and space plans alike: each job alone, and the pooled speed."""

from __future__ import annotations

import pytest

from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.planning.planner import plan_problem
from hetsched.planning.pool import plan_pool
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.pool.union_bound import seconds_per_sample, union_bound


def _queue(n: int = 6) -> PlanningProblem:
    """n equal jobs at t = 0 on one node of 2 GPUs: each alone would take the node, so
    together they queue; only a bound that sees the node's capacity sees the queue."""
    rows = [ProfileRow("w", "v100", b, 0.004 + 0.001 * b, 0.0) for b in (8, 64)]
    jobs = [Job(name=f"j{k}", workload="w", dataset_size=64 * 300, epochs=1, global_batch=64)
            for k in range(n)]
    return PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 2),)),
                           ThroughputTable(rows, "<queue>"))


def test_the_pooled_speed_sees_a_queue_that_each_job_alone_does_not() -> None:
    p = _queue()
    pp = PoolProblem(p)
    value, parts = union_bound(p, pp)
    assert parts["pooled"] > 2 * parts["alone"]  # six jobs share what each alone would have
    assert value == parts["pooled"]
    plan = plan_pool(p, "hare")
    assert plan.lower_bound_s == pytest.approx(value)
    assert "pooled speed" in plan.lower_bound_extra["kind"]
    # below every plan: the task plan, the paper's pool model alone, the space plan
    for other in (plan, plan_pool(p, "hare", {"space": "off"}), plan_problem(p, "auto")):
        assert value <= other.weighted_jct_s * (1 + 1e-9)
    # and close to the plan here (a queue on one node is what it models)
    assert value >= 0.7 * plan.weighted_jct_s


def test_a_sample_costs_at_least_the_best_local_batchs_share_of_an_iteration() -> None:
    """u_t: the least pool-iteration seconds per sample over the batches a GPU may hold;
    on a line with an intercept, the largest batch (the cap)."""
    p = _queue(1)
    pp = PoolProblem(p)
    u = seconds_per_sample(p, pp, 0)
    cap = int(p.cap[0, 0])
    step = float(p.step_times(0, [[float(cap)]])[0, 0])
    assert u[0] == pytest.approx(max(step - float(pp.optimizer_s[0, 0]), 0.05 * step) / cap)
