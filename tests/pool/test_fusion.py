"""Fused passes: a pool task trains several of its round's step slices in one pass."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetsched.core.pool_tasks import fused_steps, step_groups
from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.errors import InputError
from hetsched.planning.pool import plan_pool
from hetsched.planning.pool.problem import PoolProblem


def test_the_rule_fits_as_many_steps_as_the_chunk_holds_and_no_more_than_the_task_has() -> None:
    assert fused_steps(80, 5, 20) == 16  # 16 slices of 5 fill the chunk of 80
    assert fused_steps(80, 5, 10) == 10  # ... but the task has only 10 steps
    assert fused_steps(80, 100, 20) == 1  # a slice larger than the chunk: one a pass
    assert fused_steps(None, 5, 20) == fused_steps(0, 5, 20) == 1  # a plan without chunk
    assert [list(g) for g in step_groups(5, 2)] == [[0, 1], [2, 3], [4]]
    assert [list(g) for g in step_groups(3, 1)] == [[0], [1], [2]]


def _small_batch(rows: list[ProfileRow], batch: int = 5, n: int = 2) -> PlanningProblem:
    jobs = [Job(name=f"j{k}", workload="w", dataset_size=batch * 4000, epochs=1,
                global_batch=batch) for k in range(n)]
    return PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 4),)),
                           ThroughputTable(rows, "<small batch>"))


def test_a_small_batch_job_runs_its_steps_in_fused_passes_and_gains_their_intercepts() -> None:
    """A line with an intercept: the time per sample falls up to the cap, so the chunk is
    the cap, and a task of N steps of 5 samples runs N/16 passes of 80."""
    rows = [ProfileRow("w", "v100", b, 0.008 + 0.0003 * b, 0.0) for b in (1, 16, 80)]
    p = _small_batch(rows)
    fused, plain = PoolProblem(p), PoolProblem(p, fuse=False)
    v = p.types.index("v100")
    assert int(fused.chunk[0, v]) == 80 and not plain.chunk.any()
    b, n = int(fused.slice_b[0]), int(fused.N[0])
    m = fused_steps(80, b, n)
    assert m > 1
    one = 0.008 + 0.0003 * b  # a step a pass
    per_step = ((n // m) * (0.008 + 0.0003 * m * b) + (
        (0.008 + 0.0003 * (n % m) * b) if n % m else 0.0)) / n
    assert float(fused.t_it[0, v]) == pytest.approx(per_step)
    assert float(plain.t_it[0, v]) == pytest.approx(0.008 + 0.0003 * int(plain.slice_b[0]))
    assert float(fused.t_it[0, v]) < 0.3 * one
    a, c = plan_pool(p, "hare"), plan_pool(p, "hare", fuse=False)
    assert a.weighted_jct_s < 0.5 * c.weighted_jct_s
    assert a.lower_bound_s <= a.weighted_jct_s  # the bound sees fused passes too


def test_the_chunk_stops_where_the_time_per_sample_starts_to_rise() -> None:
    """A curve whose last piece is steep (memory-bound): per sample it is cheapest at 64,
    dearer at 128, so passes never hold more than 64 samples."""
    rows = [ProfileRow("w", "v100", b, s, 0.0) for b, s in
            ((1, 0.010), (16, 0.014), (32, 0.018), (64, 0.026), (128, 0.090))]
    p = _small_batch(rows, batch=4, n=1)
    pp = PoolProblem(p)
    v = p.types.index("v100")
    assert int(pp.chunk[0, v]) == 64
    # and fusing never makes a task slower than one slice a pass
    assert float(pp.t_it[0, v]) <= float(PoolProblem(p, fuse=False).t_it[0, v])


def test_a_plan_carries_each_jobs_chunk_and_a_bad_one_is_one_clear_line(tmp_path: Path) -> None:
    from hetsched.io.plan_json import load_plan, save_plan

    rows = [ProfileRow("w", "v100", b, 0.008 + 0.0003 * b, 0.0) for b in (1, 16, 80)]
    plan = plan_pool(_small_batch(rows), "hare")
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    d = json.loads(path.read_text())
    assert d["tasks"]["jobs"]["j0"]["chunk"] == {"v100": 80}
    assert load_plan(path).tasks.jobs["j0"].chunk == {"v100": 80}
    for bad in (0, -3, "x", 1.5, {"a": 1}):
        d["tasks"]["jobs"]["j0"]["chunk"] = {"v100": bad}
        path.write_text(json.dumps(d))
        with pytest.raises(InputError) as e:
            load_plan(path)
        assert "chunk" in str(e.value) and "\n" not in str(e.value)


def test_fusion_never_lowers_a_plan_below_what_its_tasks_need() -> None:
    """Every task's compute in the fused model is at least its samples at the GPU's best
    time per sample (what the bounds assume)."""
    rows = [ProfileRow("w", "v100", b, 0.008 + 0.0003 * b, 0.0) for b in (1, 16, 80)]
    p = _small_batch(rows)
    pp = PoolProblem(p)
    v = p.types.index("v100")
    best = min((0.008 + 0.0003 * b) / b for b in range(1, 81))
    assert float(pp.t_it[0, v]) >= best * float(pp.slice_b[0]) * (1 - 1e-9)
    assert np.isfinite(pp.t_it[0, v])
