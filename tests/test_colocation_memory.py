"""The memory model of co-location: a measured cap against the largest profiled batch,
and the reason a co-locating policy formed no group (said, not silent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from planner_helpers import make_cluster, make_job

from hetsched.core.memory import UNMEASURED_FILL, fill_batch, no_group_reason
from hetsched.core.problem import PlanningProblem
from hetsched.core.report import RecordingReporter
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.planning.planner import plan_problem

REPO = Path(__file__).resolve().parent.parent


def _rows(cap: int | None) -> list[ProfileRow]:
    """What a probe stores for two workloads swept up to batch 64: a GPU probe that hit
    out-of-memory above 64 (cap 64), or a CPU probe (no cap: memory unknown)."""
    return [ProfileRow(w, "v100", b, 0.01 + 0.001 * b, None, cap)
            for w in ("a", "b") for b in (16, 32, 64)]


def _problem(cap: int | None) -> PlanningProblem:
    jobs = [make_job("ja", "a", global_batch=64, dataset_size=64 * 50, model_size_mb=500.0),
            make_job("jb", "b", global_batch=64, dataset_size=64 * 50, model_size_mb=500.0)]
    return PlanningProblem(jobs, make_cluster([("n0", "v100", 1)]), ThroughputTable(_rows(cap)))


def test_fill_batch_tells_a_measured_cap_from_the_largest_profiled_batch() -> None:
    assert fill_batch(64, 48) == 48.0  # measured: memory ends there
    assert fill_batch(64, None) == pytest.approx(64 / UNMEASURED_FILL)
    assert fill_batch(0, None) >= 1.0


def test_an_unmeasured_cap_does_not_block_a_pair_a_gpu_would_hold() -> None:
    # one GPU: both jobs at local batch 64. Measured (64 fills the GPU): no pair fits.
    measured = _problem(64)
    assert measured.mem_cap[0, 0] == 64
    assert no_group_reason(measured).startswith("no pair of jobs fits one GPU's memory")
    # CPU-probe rows (no cap): 64 is only the largest batch tried; the pair fits
    unknown = _problem(None)
    assert unknown.cap[0, 0] == 64 and unknown.mem_cap[0, 0] == pytest.approx(64 / UNMEASURED_FILL)
    assert no_group_reason(unknown).startswith("1 of 1 pairs fit one GPU's memory")


def test_a_colocating_policy_says_why_it_formed_no_group() -> None:
    rep = RecordingReporter()
    plan = plan_problem(_problem(64), "naive-colocation", reporter=rep)
    notes = [str(a[0]) for a in rep.hooks("note")]
    assert not any(s.group for jp in plan.jobs for s in jp.segments)
    assert plan.notes.no_group.startswith("no pair of jobs fits")
    assert any("naive-colocation formed no co-location group: no pair" in n for n in notes)
    assert "no_group" in plan.to_dict()


def test_plan_prints_why_no_group_formed(examples: dict[str, Path], tmp_path: Path) -> None:
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "hetsched", "plan", str(examples["jobs"]),
                        "--cluster", str(examples["cluster"]), "--throughputs",
                        str(examples["throughputs"]), "--policy", "harmony-jct", "--no-gantt"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert "harmony-jct formed no co-location group:" in r.stderr
    assert "no group formed:" in r.stdout
