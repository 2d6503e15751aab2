"""Pool mode also plans space mode on the pool's costs (a task exchanges gradients once
per round of N iterations; a job moves between GPUs at a task switch, with no restart)
and starts from whichever task plan is lower. The space plan on its own costs stays the
guarantee: the plan kept is never above its task plan."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pool_helpers import check_plan

from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.planning.planner import plan_problem
from hetsched.planning.pool import plan_pool, space_seed
from hetsched.planning.pool.problem import PoolProblem


def _sync_bound(n_jobs: int = 3) -> PlanningProblem:
    """Jobs of a large model on two 2-GPU nodes joined by a slow network: each
    iteration's all-reduce across nodes costs more than the step it saves, so space mode
    runs each job on few GPUs; one exchange per round of many iterations does not."""
    rows = [ProfileRow("big", "v100", b, 0.05 + 0.004 * b, 0.0) for b in (8, 64)]
    jobs = [Job(name=f"j{k}", workload="big", dataset_size=64 * 4000 * (k + 1), epochs=1,
                global_batch=64, model_size_mb=500.0) for k in range(n_jobs)]
    cluster = Cluster(nodes=(Node("n1", "v100", 2), Node("n2", "v100", 2)),
                      inter_node_gbps=1.0, intra_node_gbps=10.0)
    return PlanningProblem(jobs, cluster, ThroughputTable(rows, "<sync-bound>"))


def test_the_pool_costs_problem_divides_the_sync_by_the_rounds_iterations() -> None:
    p = _sync_bound()
    pp = PoolProblem(p)
    q = space_seed.pool_costs_problem(p, pp)
    counts = np.array([[1], [2], [4]])
    # the three jobs are one model to space mode: one divisor, the fewest iterations per
    # round among them (each job's sync no cheaper than its own rounds make it)
    n = int(pp.N.min())
    assert len({q.model_key(i) for i in range(q.S)}) == 1
    for i in range(p.S):
        assert np.allclose(q.compute_time(i, counts), p.compute_time(i, counts))
        assert np.allclose(q.comm_estimate(i, counts) * n, p.comm_estimate(i, counts))
        assert q.comm_estimate(i, counts)[2] > 0  # still a cost, only per round
        assert q.iter_time1(i, (4,)) == pytest.approx(float(q.iter_time(i, counts[2:])[0]))
    assert p.model_mb.tolist() == [500.0] * 3  # the problem given is left as it was


def _plan(p: PlanningProblem, monkeypatch: pytest.MonkeyPatch, seed: bool,
          workers: str = "1") -> dict[str, Any]:
    monkeypatch.setattr(space_seed, "POOL_COSTS_SEED", seed)
    monkeypatch.setenv("HETSCHED_PLAN_WORKERS", workers)
    d = plan_pool(p, "hare").to_dict()
    d.pop("planning_time_s", None)
    d.pop("plan_id", None)
    return d


def test_pool_mode_starts_from_space_mode_planned_on_the_pools_costs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = _sync_bound()
    space = plan_problem(p, "auto", restart_cost_s=60.0)
    without = _plan(p, monkeypatch, seed=False)
    with_it = _plan(p, monkeypatch, seed=True)
    params = with_it["params"]
    assert params["order"] == "space-pool-costs"
    # the seed on the pool's costs is the lower task plan, by far, and only improves
    assert params["pool_costs_tasks_s"] < 0.9 * params["space_tasks_s"]
    assert with_it["objective"]["weighted_jct_s"] <= params["pool_costs_tasks_s"] + 1e-6
    assert with_it["objective"]["weighted_jct_s"] < 0.9 * without["objective"]["weighted_jct_s"]
    # never above the space plan (the guarantee the space plan on its own costs gives)
    assert with_it["objective"]["weighted_jct_s"] <= space.weighted_jct_s
    # wider than space mode: some job runs a round on more GPUs than any space segment
    widest_space = max(len(s.workers) for j in space.jobs for s in j.segments)
    widest_pool = max(len(s["workers"]) for j in with_it["jobs"] for s in j["segments"])
    assert widest_pool > widest_space
    # the plan is what the evaluator times, and the same planned in one process or two
    from hetsched.io.plan_json import plan_from_dict

    plan = plan_from_dict(with_it, "<plan>")
    assert check_plan(PoolProblem(p), plan) == pytest.approx(with_it["objective"]["weighted_jct_s"],
                                                             rel=1e-6, abs=1e-4)
    assert _plan(p, monkeypatch, seed=True, workers="2") == with_it


def test_above_its_job_limit_the_pool_costs_seed_is_not_planned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = _sync_bound()
    monkeypatch.setattr(space_seed, "POOL_COSTS_MAX_JOBS", p.S - 1)
    d = _plan(p, monkeypatch, seed=True)
    assert "pool_costs_tasks_s" not in d["params"]
    assert d["params"]["order"] != "space-pool-costs"
    assert d == _plan(p, monkeypatch, seed=False)
