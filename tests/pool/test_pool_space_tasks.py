"""Pool plans contain space plans: a space plan is a task plan with uneven tasks, the
evaluator gives it the space plan's weighted JCT (less the synchronisation its rounds
do not repeat every iteration), and Hare starts from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pool_helpers import check_plan, instances

from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.errors import InputError
from hetsched.planning.planner import plan_problem
from hetsched.planning.pool import plan_pool
from hetsched.planning.pool.evaluator import InvalidSchedule, evaluate, evaluate_tasks_section
from hetsched.planning.pool.from_space import space_tasks
from hetsched.planning.pool.problem import PoolProblem

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def rounding(plan: Plan, p: PlanningProblem) -> float:
    """How far whole iterations may move the weighted JCT: every segment of the plan may
    end up to one of its iterations off, and a delay passes on through the GPUs."""
    per_job = sum(s.iteration_s for j in plan.jobs for s in j.segments)
    return float(p.weight.sum()) * per_job + 1e-9


@SETTINGS
@given(p=instances(), n=st.sampled_from([None, 1, 3]), rc=st.sampled_from([0.0, 60.0]))
def test_a_space_plan_is_a_pool_plan_with_its_weighted_jct(p, n, rc) -> None:  # type: ignore[no-untyped-def]
    space = plan_problem(p, "auto", restart_cost_s=rc)
    # fused passes (several steps a pass) only make the task plan faster: the exact
    # equality is the model of one step a pass; fused, the task plan is never slower
    fused = PoolProblem(p, task_iterations=n)
    got = space_tasks(fused, space)
    assert got is not None
    assert evaluate(fused, got[0]).objective <= space.weighted_jct_s + rounding(space, p)
    pp = PoolProblem(p, task_iterations=n, fuse=False)
    got = space_tasks(pp, space)
    assert got is not None
    s, release = got
    ev = evaluate(pp, s)
    assert (np.asarray(s.start) >= release - 1e-9).all()
    one_segment = all(len([g for g in j.segments if g.iterations > 0]) == 1 for j in space.jobs)
    alone = all(len(g.workers) == 1 for j in space.jobs for g in j.segments)
    if one_segment and np.allclose(p.iters, np.round(p.iters)):
        if alone:  # no synchronisation: the same times exactly
            assert ev.objective == pytest.approx(space.weighted_jct_s, rel=1e-9, abs=1e-9)
        else:  # a round synchronises once where the space plan does every iteration
            assert ev.objective <= space.weighted_jct_s * (1 + 1e-9) + 1e-9
    else:
        assert ev.objective <= space.weighted_jct_s + rounding(space, p)
        if alone:
            assert abs(ev.objective - space.weighted_jct_s) <= rounding(space, p)
    # each GPU serves the job the space plan gave it, back to back
    gpus = {(w.node, w.gpu) for j in space.jobs for g in j.segments for w in g.workers}
    assert len(set(np.asarray(s.gpu).tolist())) == len(gpus)


@SETTINGS
@given(p=instances(), n=st.sampled_from([None, 1, 3]))
def test_hare_starts_from_the_space_plan_and_only_improves(p, n) -> None:  # type: ignore[no-untyped-def]
    """The default (space=seed) is a task plan never above the space plan's task plan,
    so never above the space plan beyond whole-iteration rounding; its bound is below both."""
    space = plan_problem(p, "auto")
    pp = PoolProblem(p, task_iterations=n)
    got = space_tasks(pp, space)
    assert got is not None
    start = evaluate(pp, got[0]).objective
    plan = plan_pool(p, "hare", task_iterations=n, space_plan=space)
    assert plan.mode == "pool" and plan.tasks is not None
    assert plan.weighted_jct_s <= start * (1 + 1e-9) + 1e-9
    assert plan.weighted_jct_s <= space.weighted_jct_s + rounding(space, p)
    assert check_plan(pp, plan) == pytest.approx(plan.weighted_jct_s, rel=1e-6, abs=1e-4)
    assert plan.lower_bound_s <= plan.weighted_jct_s * (1 + 1e-9) + 1e-6
    # below the space plan too (not always below its bound: the joint LP on pool rates
    # counts whole local batches, where space mode's alone bound splits the batch
    # continuously, so on one job it can be the higher of two valid bounds)
    assert plan.lower_bound_s <= space.weighted_jct_s * (1 + 1e-9) + 1e-9
    assert "each job alone" in plan.lower_bound_extra["kind"]


def _two_jobs(restart_cost_s: float = 60.0) -> tuple[PlanningProblem, Plan]:
    """A long and a short job on two GPUs: space mode does not give the long job the
    short one's GPU when it ends (a restart costs more than it gains)."""
    rows = [ProfileRow(w, "v100", b, 0.01 + 0.001 * b, 0.0) for w in ("wa", "wb")
            for b in (8, 64)]
    jobs = [Job(name="a", workload="wa", dataset_size=64 * 2000, epochs=1, global_batch=64),
            Job(name="b", workload="wb", dataset_size=64 * 200, epochs=1, global_batch=64)]
    p = PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 2),)),
                        ThroughputTable(rows, "<two>"))
    return p, plan_problem(p, "auto", restart_cost_s=restart_cost_s)


def test_a_gpu_idle_in_the_space_plan_is_backfilled(monkeypatch: pytest.MonkeyPatch) -> None:
    from hetsched.planning.pool import space_seed

    # the backfill of space mode's own plan (the seed on the pool's costs would give a
    # b's GPU at once: test_pool_costs_seed.py)
    monkeypatch.setattr(space_seed, "POOL_COSTS_SEED", False)
    p, space = _two_jobs()
    assert [len(j.segments) for j in space.jobs] == [1, 1]  # b's GPU idles after it ends
    plan = plan_pool(p, "hare", space_plan=space)
    assert plan.params["order"] == "space" and plan.params["backfill_moves"] >= 1
    assert plan.weighted_jct_s < 0.8 * space.weighted_jct_s
    a = next(j for j in plan.jobs if j.name == "a")
    assert len(a.segments[0].workers) == 2  # a took over b's GPU
    pp = PoolProblem(p)
    assert check_plan(pp, plan) == pytest.approx(plan.weighted_jct_s, rel=1e-6, abs=1e-4)
    # the paper's variant stays available: the pool model alone
    off = plan_pool(p, "hare", {"space": "off"})
    assert off.params["order"] != "space"


def test_uneven_plan_round_trips_through_its_file(tmp_path: Path) -> None:
    from hetsched.io.plan_json import load_plan

    p, space = _two_jobs()
    plan = plan_pool(p, "hare", space_plan=space)
    d = plan.to_dict()
    assert d["tasks"]["columns"][-2:] == ["local_batch", "iterations"]
    rows = [r for g in d["tasks"]["gpus"] for run in g["runs"] for r in run["tasks"]]
    assert {len(r) for r in rows} == {10}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    back = load_plan(path)
    assert back.tasks is not None
    pp = PoolProblem(p)
    assert evaluate_tasks_section(pp, back.tasks).objective == pytest.approx(
        plan.weighted_jct_s, rel=1e-6)
    assert back.tasks.to_dict() == d["tasks"]
    # a round whose batches no longer add up is not a plan
    g0 = d["tasks"]["gpus"][0]["runs"][0]["tasks"][0]
    g0[8] = g0[8] - 1
    path.write_text(json.dumps(d))
    with pytest.raises(InvalidSchedule, match="add up"):
        evaluate_tasks_section(pp, load_plan(path).tasks)  # type: ignore[arg-type]


@pytest.mark.parametrize("row, why", [
    (["a", 0, 0, 0.0, 1.0, 1.0, "keep", [], 8], "10 with the task's own"),
    (["a", 0, 0, 0.0, 1.0, 1.0, "keep", [], 0, 1], "local_batch"),
    (["a", 0, 0, 0.0, 1.0, 1.0, "keep", [], 8, 0], "iterations_per_task"),
])
def test_bad_uneven_rows_get_one_line(row: list[object], why: str) -> None:
    from hetsched.io.pool_tasks import parse_pool_tasks

    section = {"jobs": {"a": {"tasks_per_round": 1, "rounds": 1, "iterations_per_task": 1,
                              "last_round_iterations": 1, "local_batch": 8}},
               "gpus": [{"node": "n", "gpu": 0, "gpu_type": "v100", "tasks": 1,
                         "runs": [{"repeat": 1, "tasks": [row]}]}]}
    with pytest.raises(InputError, match=why):
        parse_pool_tasks(section, "p.json", {"a"})
    good = ["a", 0, 0, 0.0, 1.0, 1.0, "keep", [], 8, 1]
    section["gpus"][0]["runs"][0]["tasks"] = [good]  # type: ignore[index]
    t = parse_pool_tasks(section, "p.json", {"a"})
    assert t.gpus[0].rows()[0].local_batch == 8 and t.gpus[0].rows()[0].to_list() == good


def test_executor_reads_each_rounds_own_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor's view: per round the tasks' local batches and iterations."""
    from hetsched.planning.pool import space_seed
    from hetsched.runtime.executor.plan import exec_plan

    # the backfilled space plan, whose job a grows when b ends (the seeds on the pool's
    # costs give each job both GPUs from the start)
    monkeypatch.setattr(space_seed, "POOL_COSTS_SEED", False)
    p, space = _two_jobs()
    plan = plan_pool(p, "hare", space_plan=space)
    xp = exec_plan(plan)
    a = xp.jobs["a"]
    assert a.layout is not None and len(a.layout) == a.rounds
    assert all(sum(b) == 64 for _, b in a.layout)
    assert sum(n for n, _ in a.layout) == a.spec.iterations
    assert {a.tasks_in(r) for r in range(a.rounds)} == {1, 2}  # it grew when b ended
    r = next(r for r in range(a.rounds) if a.tasks_in(r) == 2)
    assert sum(a.task_counts(r, k)[0] for k in range(2)) == 64
    assert a.round_step(r) == sum(a.round_iterations(q) for q in range(r))


def test_iterations_before_reads_uneven_rounds() -> None:
    """What a replan of an uneven plan needs: the iterations its completed rounds ran."""
    p, space = _two_jobs()
    plan = plan_pool(p, "hare", space_plan=space)
    assert plan.tasks is not None
    meta = plan.tasks.jobs["a"]
    assert plan.tasks.iterations_before("a", meta.rounds) == 2000  # the job's iterations
    rows = [r for g in plan.tasks.gpus for r in g.rows() if r.job == "a" and r.task == 0]
    per = {r.round: r.iterations for r in rows}
    assert plan.tasks.iterations_before("a", 3) == per[0] + per[1] + per[2]
    eq = plan_pool(p, "hare", {"space": "off"})
    assert eq.tasks is not None
    assert eq.tasks.iterations_before("a", 3) == 3 * eq.tasks.jobs["a"].iterations_per_task


def test_uneven_rows_time_an_iteration_as_equal_rows_do() -> None:
    """With an optimizer share in the profile (the coordinator steps once per round), a
    plan of equal tasks and the same tasks written as uneven rows (each its batch and
    iterations) evaluate to the same times: both paths take the share off each iteration
    and pay it once per round. (The equal model spreads it over N iterations, so a short
    last round carries last/N of it; whole rounds here, so the two agree exactly.)"""
    rows = [ProfileRow(w, "v100", b, 0.01 + 0.002 * b, 0.001, optimizer_s=0.004)
            for w in ("wa", "wb") for b in (8, 64)]
    jobs = [Job(name=n, workload=w, dataset_size=it * 32, epochs=1, global_batch=32,
                requested_gpus=2) for n, w, it in (("a", "wa", 12), ("b", "wb", 6))]
    p = PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 4),)),
                        ThroughputTable(rows, "<share>"))
    pp = PoolProblem(p, task_iterations=3)
    assert (pp.optimizer_s > 0).all() and (pp.round_optimizer_s > 0).all()
    plan = plan_pool(p, "hare", {"space": "off"}, task_iterations=3)
    equal = evaluate_tasks_section(pp, plan.tasks)
    from hetsched.planning.pool.evaluator import schedule_from_tasks

    s, _, _ = schedule_from_tasks(pp, plan.tasks)
    assert s.batch is None
    job = np.asarray(s.job)
    rnd = np.asarray(s.rnd)
    s.batch = pp.slice_b[job].astype(np.int64)
    s.iters = np.where(rnd == pp.R[job] - 1, pp.last[job], pp.N[job]).astype(np.int64)
    uneven = evaluate(pp, s)
    assert uneven.objective == pytest.approx(equal.objective, rel=1e-9)
    assert np.allclose(uneven.sync_end, equal.sync_end)


def test_the_space_seed_beside_hare_gives_the_same_plan_as_in_one_process(
        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """plan_pool plans space mode and improves its task plan in a forked process while
    Hare runs its own orders; with one worker it does all in turn. Same plan either way."""
    from pool_helpers import tiny_instance

    def body(p: PlanningProblem, workers: str) -> dict[str, Any]:
        monkeypatch.setenv("HETSCHED_PLAN_WORKERS", workers)
        d = plan_pool(p, "hare").to_dict()
        d.pop("planning_time_s", None)
        d.pop("plan_id", None)
        return d

    for p in (_two_jobs()[0], tiny_instance(3), tiny_instance(4)):
        one, two = body(p, "1"), body(p, "2")
        assert one == two
        assert one["pool_vs_space"]["space_policy"].startswith("auto:")
    # the space plan improved in the child is the plan kept here: here one planned on
    # the pool's costs (in its own process beside it), which gives a b's GPU at once
    first = body(_two_jobs()[0], "2")
    params = first["params"]
    assert params["order"] in ("space-pool-costs", "smith-pool-costs")
    start = params["smith_tasks_s" if params["order"] == "smith-pool-costs"
                   else "pool_costs_tasks_s"]
    assert first["objective"]["weighted_jct_s"] <= start + 1e-6
    assert start == min(params["pool_costs_tasks_s"], params["smith_tasks_s"])
    assert start < params["space_tasks_s"]
