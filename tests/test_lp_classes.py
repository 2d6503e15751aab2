"""Identical jobs share one column set in the LP bound, and a solve the simplex cannot
finish within its iteration budget is done by the interior point method.

A sweep of one workload (the same job 30 times, or 30 sizes of it) made the LP
degenerate: the dual simplex pivoted through 100,000 iterations (25-60 s of CPU in
`hetsched plan`) and the plan fell back to a weaker bound. bench_bounds.py --sweeps
measures it (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from hetsched.core.problem import PlanningProblem
from hetsched.planning import bounds, lp_bound, lp_configs
from hetsched.planning.planner import plan_problem
from tests.planner_helpers import make_cluster, make_job, make_table


def sweep(n: int = 6, sizes: bool = False) -> PlanningProblem:
    """``n`` single-GPU jobs of one workload (the same, or each 10% larger), and one
    job of another, on 2 fast + 4 slow GPUs."""
    table = make_table({(w, t): (0.01, c, 64) for w in ("w", "x")
                        for t, c in (("v100", 0.001), ("k80", 0.004))})
    cluster = make_cluster([("v", "v100", 2), ("k", "k80", 4)])
    jobs = [make_job(f"s{k}", "w", dataset_size=int(64 * 300 * (1.1 ** k if sizes else 1)),
                     global_batch=64, max_gpus=1) for k in range(n)]
    jobs.append(make_job("other", "x", dataset_size=64 * 500, global_batch=64))
    return PlanningProblem(jobs, cluster, table)


def _lp(p: PlanningProblem) -> dict:
    sb = bounds._simple_bounds(p)
    out = lp_bound.lp_lower_bound(p, sb.lattices, confs=sb.confs)
    assert out is not None
    return out


def test_identical_jobs_are_one_class_and_the_optimum_is_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = sweep()
    cls = lp_configs.job_classes(p, bounds._simple_bounds(p).confs)
    assert sorted(len(c) for c in cls) == [1, 6]
    monkeypatch.setattr(lp_bound, "MAX_ROUNDS", 1)  # the LP's optimum itself, no cuts
    together = _lp(p)
    monkeypatch.setattr(lp_bound, "job_classes",  # as lp_bound calls it
                        lambda p, confs: [[i] for i in range(len(confs))])
    apart = _lp(p)
    assert together["classes"] == 2 and apart["classes"] == 7
    assert together["weighted_jct_s"] == pytest.approx(apart["weighted_jct_s"], rel=1e-6)
    assert together["columns"] < apart["columns"]
    # every job gets its class's completion, in the jobs' order
    assert len(together["completion_s"]) == p.S
    assert len(set(np.round(together["completion_s"][:6], 6))) == 1


def test_jobs_that_differ_in_arrival_weight_or_size_are_not_merged() -> None:
    p = sweep(4, sizes=True)
    assert len(lp_configs.job_classes(p, bounds._simple_bounds(p).confs)) == 5
    q = sweep(4)
    q.arrival = q.arrival.copy()
    q.arrival[1] = 100.0
    q.weight = q.weight.copy()
    q.weight[2] = 2.0
    assert sorted(len(c) for c in lp_configs.job_classes(q, bounds._simple_bounds(q).confs)
                  ) == [1, 1, 1, 2]


def test_the_class_bound_stays_below_every_plan() -> None:
    p = sweep()
    bound = bounds.lower_bound_info(p)
    assert bound["kind"] == "lp"
    for policy in ("exhaustive", "auto", "fifo"):
        assert bound["weighted_jct_s"] <= plan_problem(p, policy, restart_cost_s=0.0
                                                      ).weighted_jct_s * (1 + 1e-9)


def test_a_solve_past_the_simplex_budget_is_finished_by_the_interior_point_method(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bound (every round: IPM from the first solve on), counted, not timed."""
    import highspy

    p = sweep(5, sizes=True)
    simplex = _lp(p)
    solvers: list[str] = []
    run = highspy.Highs.run

    def counted(h: highspy.Highs) -> object:
        out = run(h)
        info = h.getInfo()
        solvers.append("ipm" if info.ipm_iteration_count else "simplex")
        return out

    monkeypatch.setattr(highspy.Highs, "run", counted)
    # the first solve takes about 3,000 simplex iterations; the interior point's own
    # crossover clean-up, a few
    monkeypatch.setattr(lp_bound, "ITERATION_LIMIT", 200)
    ipm = _lp(p)
    assert solvers[:2] == ["simplex", "ipm"] and set(solvers[2:]) == {"ipm"}
    assert ipm["rounds"] == simplex["rounds"]
    assert ipm["weighted_jct_s"] == pytest.approx(simplex["weighted_jct_s"], rel=1e-4)
