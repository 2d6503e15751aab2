"""Pool mode chooses each job's parallelism; --mode auto picks space or pool."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetsched.cli.main import main
from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.io.profiles import load_throughputs
from hetsched.planning.planner import make_plan
from hetsched.planning.pool.problem import PoolProblem

JOBS = [("resnet-50", 128, 3000, 98.0), ("resnet-18", 256, 4000, 45.0),
        ("transformer", 128, 2000, 250.0), ("lm", 80, 3000, 120.0)]


@pytest.fixture(scope="module")
def four_types(examples) -> tuple[list[Job], Cluster, ThroughputTable]:
    """4 jobs, 12 GPUs, 4 types: Gavel's V100/P100/K80 plus an A100-like type (2.5x V100)."""
    gavel = load_throughputs(examples["throughputs"])
    rows = list(gavel.all_rows()) + [
        ProfileRow(r.workload, "a100", r.local_batch, r.step_time_s / 2.5, gpus=r.gpus)
        for r in gavel.all_rows() if r.gpu_type == "v100"]
    table = ThroughputTable(rows, "gavel+a100")
    cluster = Cluster(nodes=tuple(Node(f"{t}-0", t, 3) for t in ("a100", "v100", "p100", "k80")),
                      intra_node_gbps=300.0, inter_node_gbps=10.0)
    jobs = [Job(name=f"j{k}", workload=w, dataset_size=gb * it, epochs=1, global_batch=gb,
                model_size_mb=mb) for k, (w, gb, it, mb) in enumerate(JOBS)]
    return jobs, cluster, table


def test_pool_chooses_parallelism_and_closes_the_gap_to_space(four_types) -> None:
    jobs, cluster, table = four_types
    old = PoolProblem(PlanningProblem(jobs, cluster, table), choose_parallelism=False)
    new = PoolProblem(PlanningProblem(jobs, cluster, table))
    assert old.P.sum() == 4  # the old rule: one task per round each
    assert new.P.sum() > 4
    space = make_plan(jobs, cluster, table, "auto")
    pool = make_plan(jobs, cluster, table, "auto", mode="pool")
    used = {(t["node"], t["gpu"]) for t in _tasks(pool)}
    assert len(used) > 4  # more than 4 of the 12 GPUs work
    assert pool.weighted_jct_s < 1.5 * space.weighted_jct_s  # was 1.9x with P = 1
    # whatever stays below the pool is explained, job by job
    if new.P.sum() < new.K:
        assert set(pool.params["idle_gpus_reason"]) == {j.name for j in jobs
                                                        if j.name in new.parallelism_notes}


def _tasks(plan) -> list[dict]:  # noqa: ANN001
    gpus = plan.tasks.gpus if plan.tasks is not None else []
    return [{"node": g.node, "gpu": g.gpu} for g in gpus if g.tasks]


def test_requested_gpus_is_kept(four_types) -> None:
    jobs, cluster, table = four_types
    fixed = [Job(**{**j.to_dict(), "requested_gpus": 3}) if k == 0 else j
             for k, j in enumerate(jobs)]
    pp = PoolProblem(PlanningProblem(fixed, cluster, table))
    assert pp.P[0] == 3


@pytest.mark.slow
def test_mode_auto_keeps_the_better_mode(runner, examples) -> None:
    args = ["plan", str(examples["jobs"]), "--cluster", str(examples["cluster"]),
            "--throughputs", str(examples["throughputs"]), "--format", "json"]
    res = runner.invoke(main, [*args, "--mode", "auto"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    cands = d["mode_candidates"]
    assert set(cands) == {"space", "pool"}
    from hetsched.planning.planner import POOL_MARGIN

    # pool only where it pays beyond the margin (it starts from the space plan)
    assert cands["pool"] <= cands["space"] * (1 + 1e-9)
    want = "pool" if cands["pool"] < cands["space"] * (1 - POOL_MARGIN) else "space"
    assert d["mode"] == want
    assert d["objective"]["weighted_jct_s"] == pytest.approx(cands[want], rel=1e-6)
    assert d["settings"]["mode"] == "auto"  # replan re-chooses


def test_a_task_pays_its_sync_once_so_more_workers_pay() -> None:
    """Sync of 60 ms a step against a 98 ms step: synchronising every iteration, a second
    worker is slower than one (50 + 60 ms); a task exchanges once for its iterations
    (about 10 of them at a 0.5 s task: 50 + 6 ms), so the job grows."""
    from hetsched.planning.pool.parallelism import choose_parallelism, iteration_times

    rows = [ProfileRow("w", "v100", b, 0.002 + 0.0015 * b, 0.06) for b in (8, 64)]
    p = PlanningProblem([Job(name="j", workload="w", dataset_size=64 * 400, epochs=1,
                             global_batch=64)],
                        Cluster(nodes=(Node("n1", "v100", 4),)), ThroughputTable(rows, "t"))
    floor, fixed = np.ones(1, dtype=int), np.zeros(1, dtype=bool)
    per_iteration, _ = choose_parallelism(p, floor, fixed)
    assert per_iteration[0] == 1  # every iteration synchronising: a worker more never pays
    pp = PoolProblem(p)
    assert pp.P[0] > 1
    T = iteration_times(p, 0, 2, pp._task_iterations)
    assert T[2] < T[1] < iteration_times(p, 0, 2)[2]
    # the plan's task pays the exchange once, whatever its iterations
    assert pp.s_task[0, 0] == pytest.approx(0.06)
    assert pp.s_it[0, 0] == pytest.approx(0.06 / pp.N[0])


def test_jobs_of_one_model_share_its_step_times_but_not_their_task_sizes(four_types) -> None:
    """choose_parallelism computes a model's compute and sync per worker count once
    (``memo``, keyed by ``model_key``); each job still spreads the sync over its own task
    size, which depends on its iterations. With the memo, every job's times are those
    computed alone, at every length asked, shorter or longer than the memo's."""
    from hetsched.planning.pool.parallelism import iteration_times

    jobs, cluster, table = four_types
    twins = [Job(name=f"t{k}", workload="resnet-18", dataset_size=256 * it, epochs=1,
                 global_batch=256, model_size_mb=45.0)
             for k, it in enumerate((40, 4000, 400_000))]
    p = PlanningProblem(twins + jobs, cluster, table)
    pp = PoolProblem(p, choose_parallelism=False)
    memo: dict[tuple, tuple[int, np.ndarray, np.ndarray]] = {}
    for i, kmax in [(0, 6), (1, 3), (2, 12), (3, 12), (4, 9), (1, 12), (0, 2)]:
        got = iteration_times(p, i, kmax, pp._task_iterations, memo)
        assert np.array_equal(got, iteration_times(p, i, kmax, pp._task_iterations))
    assert len(memo) == 2  # the twins and j1 share resnet-18 at batch 256; j0 has its own
    small, big = (iteration_times(p, i, 6, pp._task_iterations, memo) for i in (0, 2))
    assert small[6] > big[6]  # 40 iterations: a task of at most 40 pays its sync more often
