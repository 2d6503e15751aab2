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
    pp = PoolProblem(p, fuse=False)  # the step as profiled (fused passes: the tests below)
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
    assert "pool_costs_tasks_s" not in d["params"] and "smith_tasks_s" not in d["params"]
    assert d["params"]["order"] not in ("space-pool-costs", "smith-pool-costs")
    assert d == _plan(p, monkeypatch, seed=False)


def _small_batch(n_jobs: int) -> PlanningProblem:
    """Jobs of 8 samples a step whose pass has a large fixed cost, on 4 GPUs: split over
    several GPUs a step is mostly that cost, fused into passes of 80 it is not."""
    rows = [ProfileRow("w", "v100", b, 0.008 + 0.0003 * b, 0.0) for b in (1, 16, 80)]
    jobs = [Job(name=f"j{k}", workload="w", dataset_size=8 * 4000, epochs=1, global_batch=8)
            for k in range(n_jobs)]
    return PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 4),)),
                           ThroughputTable(rows, "<small batch>"))


def test_the_pool_costs_problem_steps_as_fused_passes_take_them() -> None:
    """The copy's step at a local batch is the round's steps in fused passes
    (fusion.fused_compute over N): exact at its knots, never above a step a pass, and with
    no pass's fixed cost up to the chunk."""
    from hetsched.planning.pool.fusion import fused_compute, pool_iteration_times

    p = _small_batch(3)
    pp = PoolProblem(p)
    q = space_seed.pool_costs_problem(p, pp)
    v, n, ch = p.types.index("v100"), int(pp.N.min()), int(pp.chunk[0, 0])
    assert ch == 80 and n > 1
    knots, steps = q.curves[0][v]
    assert knots.tolist() == sorted({1.0, float(max(1, ch // n)), 80.0})

    def one(_j: np.ndarray, _t: np.ndarray, b: np.ndarray) -> np.ndarray:
        return pool_iteration_times(0.008 + 0.0003 * b.astype(float), 0.0)

    for b, s in zip(knots.astype(int).tolist(), steps.tolist(), strict=True):
        want = fused_compute(one, np.zeros(1, np.int64), np.zeros(1, np.int64),
                             np.array([b]), np.array([n]), np.array([ch]))[0] / n
        assert s == pytest.approx(want)
    b = np.arange(1, 81, dtype=float)
    fused = q.step_times(0, b[:, None])[:, v]
    assert (fused <= p.step_times(0, b[:, None])[:, v] + 1e-12).all()
    # at the chunk a GPU runs at its peak: 80 samples in one pass
    assert float(q.per_gpu_rate(0)[v]) == pytest.approx(80 / (0.008 + 0.0003 * 80))
    # a round of one step fuses nothing: the step as profiled
    assert space_seed.fused_steps_curve(p, pp, 0, v, 1) is None


def test_the_space_plan_on_fused_costs_gives_small_batch_jobs_the_gpus_they_would_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Space mode on a step a pass sees a job of 8 samples gain little from a second GPU
    (the fixed cost stays); on fused passes it gains nearly all. The task plan of the
    space plan on the fused costs is far lower, and so is the plan kept."""
    p = _small_batch(3)
    fused = plan_pool(p, "hare")
    orig = space_seed.pool_costs_problem
    monkeypatch.setattr(space_seed, "pool_costs_problem",
                        lambda q, pp: orig(q, PoolProblem(q, fuse=False)))
    plain = plan_pool(p, "hare")
    assert fused.params["order"] in ("space-pool-costs", "smith-pool-costs")
    assert fused.params["pool_costs_tasks_s"] < 0.5 * plain.params["pool_costs_tasks_s"]
    assert fused.weighted_jct_s < plain.weighted_jct_s
    assert fused.weighted_jct_s <= fused.params["pool_costs_tasks_s"] + 1e-6
    from hetsched.io.plan_json import plan_from_dict

    again = plan_from_dict(fused.to_dict(), "<plan>")
    assert check_plan(PoolProblem(p), again) == pytest.approx(fused.weighted_jct_s,
                                                              rel=1e-6, abs=1e-4)
