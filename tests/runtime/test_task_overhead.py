"""The planner plans what the executor costs: pool task records' measured overhead is
folded into the profile history and added to every pool task's time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetsched.core.problem import PlanningProblem
from hetsched.io.profiles import load_throughputs
from hetsched.io.specs import load_cluster, load_jobs
from hetsched.planning.pool.problem import PoolProblem
from hetsched.state.history import import_rows, ingest_reports, table_from_store
from hetsched.state.overheads import task_overheads
from hetsched.state.store import open_store

EX = Path(__file__).resolve().parents[2] / "examples"


def _task(job: str, overhead: float) -> str:
    return json.dumps({"kind": "task", "job": job, "round": 0, "task": 0, "gpu": "n1-g0",
                       "gpu_type": "V100", "iterations": 4, "samples": 64, "compute_s": 0.4,
                       "switch_s": 0.001, "overhead_s": overhead}) + "\n"


def test_overhead_folds_into_history_and_pool_task_times(tmp_path: Path) -> None:
    rep = tmp_path / "gpu-n1-g0.jsonl"
    rep.write_text(_task("a", 0.010) + _task("a", 0.030) + _task("zzz", 5.0))
    gavel = load_throughputs(EX / "gavel_throughputs.csv")
    with open_store(tmp_path / "s.db") as st:
        import_rows(st, [r for rs in gavel.rows.values() for r in rs], "gavel")
        assert task_overheads(st) == {}
        ingest_reports(st, [rep], alpha=0.5, workloads={"a": "resnet-50"})
        # EWMA as the step times: 0.010, then 0.5 * 0.010 + 0.5 * 0.030; unknown jobs ignored
        assert task_overheads(st) == {("resnet-50", "v100"): pytest.approx(0.020)}
        with_ov = table_from_store(st)
    jobs, cluster = load_jobs(EX / "jobs.yaml"), load_cluster(EX / "cluster.yaml")
    pp = PoolProblem(PlanningProblem(jobs, cluster, with_ov), task_iterations=3)
    with_ov.task_overhead_s = {}  # type: ignore[attr-defined]  # the same table, no overhead
    base = PoolProblem(PlanningProblem(jobs, cluster, with_ov), task_iterations=3)
    i = [j.workload for j in jobs].index("resnet-50")
    t = pp.base.types.index("v100")
    assert pp.task_overhead_s[i, t] == pytest.approx(0.020)
    # each task pays the overhead once: N iterations * (t + overhead / N)
    assert pp.N[i] * pp.t_it[i, t] == pytest.approx(pp.N[i] * base.t_it[i, t] + 0.020,
                                                     rel=1e-4)
    others = np.ones_like(pp.t_it, dtype=bool)
    others[i, t] = False
    finite = others & np.isfinite(base.t_it)
    assert np.allclose(pp.t_it[finite], base.t_it[finite], rtol=1e-4)
