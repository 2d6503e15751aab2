"""The one keep-or-move rule (planning/space/decide.py) started from running jobs: what
replan plans with (``PlanningProblem.running_gpus``), checked for every policy.

The replan side (Slurm state in, moves out, the simulator agreeing) is in
tests/slurm/test_replan_memory.py.
"""

from __future__ import annotations

import pytest
from planner_helpers import check_plan, make_cluster, make_job, make_table

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.evaluator import simulate
from hetsched.planning.space.policies.base import REGISTRY, make_policy

RUNNING = {"r-t4": [("t4-1", 0), ("t4-1", 1)], "r-v100": [("v100-1", 2), ("v100-1", 3)]}


def _problem(fixed: bool = False) -> PlanningProblem:
    """Two running jobs (one on the slow t4s, one on v100s) and three waiting ones."""
    cluster = make_cluster([("v100-1", "v100", 4), ("t4-1", "t4", 4)])
    table = make_table({("w", "v100"): (0.01, 0.001, 64), ("w", "t4"): (0.03, 0.003, 64)})
    jobs = [make_job(n, "w", dataset_size=d, global_batch=32, min_gpus=1, max_gpus=4,
                     weight=wt)
            for n, d, wt in (("r-t4", 60000, 1.0), ("r-v100", 20000, 1.0),
                             ("a", 40000, 3.0), ("b", 8000, 1.0), ("c", 90000, 0.5))]
    return PlanningProblem(jobs, cluster, table, running_gpus=RUNNING, running_fixed=fixed)


def _first(plan, name: str):  # type: ignore[no-untyped-def]
    seg = plan.job(name).segments[0]
    return seg, sorted((w.node, w.gpu) for w in seg.workers)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_starts_from_the_running_jobs(name: str) -> None:
    """Valid plans; a running job continues where it runs at no cost, or its first
    segment pays the restart; the note says which candidate the decision chose, and
    only a moving choice moves anyone."""
    p = _problem()
    plan = simulate(p, make_policy(name), restart_cost_s=60.0)
    check_plan(p, plan, restart_cost_s=60.0)
    rec = plan.notes.keep_or_move
    assert rec is not None and rec["started"] == sorted(RUNNING), rec
    moved = set()
    for job, gpus in RUNNING.items():
        seg, got = _first(plan, job)
        if got == sorted(gpus) and seg.start_s == 0.0:
            assert seg.restart_s == 0.0
        else:
            moved.add(job)
    if moved:
        assert rec["chosen"] in ("fresh", "policy"), (rec, moved)
    if "weighted_completion_s" in rec:
        s = rec["weighted_completion_s"]
        assert s[rec["chosen"]] == min(s.values()) or rec["chosen"] == "keep"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_fixed_running_jobs_stay_until_they_end(name: str) -> None:
    """Online replan: every policy plans only the other jobs, around the running ones."""
    p = _problem(fixed=True)
    plan = simulate(p, make_policy(name), restart_cost_s=60.0)
    check_plan(p, plan, restart_cost_s=60.0)
    for job, gpus in RUNNING.items():
        jp = plan.job(job)
        assert len(jp.segments) == 1, (job, jp.segments)
        seg, got = _first(plan, job)
        assert got == sorted(gpus) and seg.start_s == 0.0 and seg.restart_s == 0.0


def _moved(plan) -> list[str]:  # type: ignore[no-untyped-def]
    return [j for j, g in RUNNING.items()
            if _first(plan, j)[1] != sorted(g) or _first(plan, j)[0].start_s > 0]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_prohibitive_restart_keeps_every_running_job(name: str) -> None:
    """The running jobs count as having run: a move pays the restart, so with a
    restart of a day no policy moves one (``srtf`` does when restarts are free)."""
    plan = simulate(_problem(), make_policy(name), restart_cost_s=86400.0)
    assert _moved(plan) == []
    if name == "srtf":
        free = simulate(_problem(), make_policy(name), restart_cost_s=0.0)
        assert _moved(free) and free.notes.keep_or_move["chosen"] == "fresh"


def test_running_jobs_that_cannot_start_where_they_run_are_planned_as_waiting() -> None:
    """Two jobs claiming one GPU (a co-location group) and one on a node gone from the
    partition are not started there; the others are (replan keeps the former as they run)."""
    p = _problem()
    claims = {"r-t4": [("t4-1", 0)], "r-v100": [("t4-1", 0)], "a": [("gone-1", 0)],
              "b": [("v100-1", 0)]}
    q = PlanningProblem(p.jobs, p.cluster, p.table, running_gpus=claims)
    plan = simulate(q, make_policy("srtf"), restart_cost_s=60.0)
    assert plan.notes.keep_or_move is not None
    assert plan.notes.keep_or_move["started"] == ["b"]
    check_plan(q, plan, restart_cost_s=60.0)
