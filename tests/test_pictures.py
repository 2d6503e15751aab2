"""Pictures readable at 6, 60 and 600 jobs.

Each chart is drawn into ``$HETSCHED_ARTEFACTS`` (default: the test's tmp dir)
so a person can look at it; the assertions check its structure: per-GPU rows
with one colour per job when there are few jobs, per-job rows when there are
many, a time axis in human units (no raw seconds with a x1e6 offset), and the
predicted-vs-measured plot from status rows.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from planner_helpers import make_cluster, make_job, make_table

from hetsched.cli.pictures import png_gantt, png_predicted_vs_measured, time_unit
from hetsched.core.problem import PlanningProblem
from hetsched.planning.planner import plan_problem

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def artefacts(tmp_path: Path) -> Path:
    d = Path(os.environ.get("HETSCHED_ARTEFACTS", tmp_path))
    d.mkdir(parents=True, exist_ok=True)
    return d


def batch(n: int) -> PlanningProblem:
    rnd = random.Random(n)
    table = make_table({("big", "v100"): (0.01, 0.002, 64), ("big", "k80"): (0.02, 0.008, 32),
                        ("small", "v100"): (0.0, 0.004, 64), ("small", "k80"): (0.0, 0.010, 64)})
    nodes = max(2, n // 10)
    cluster = make_cluster([(f"v{i}", "v100", 2) for i in range(nodes)]
                           + [(f"k{i}", "k80", 2) for i in range(nodes)])
    jobs = [make_job(f"job-{k:03d}-{'big' if k % 3 else 'small'}", "big" if k % 3 else "small",
                     dataset_size=rnd.choice([6400, 32000, 128000]), global_batch=64,
                     arrival_s=rnd.uniform(0, 300 * n ** 0.5)) for k in range(n)]
    return PlanningProblem(jobs, cluster, table)


@pytest.mark.slow
@pytest.mark.parametrize(("n", "layout"), [(6, "per-gpu"), (60, "per-job"), (600, "summary")])
def test_gantt_is_readable_at_every_size(n: int, layout: str, artefacts: Path) -> None:
    plan = plan_problem(batch(n), "fifo")
    out = artefacts / f"gantt-{n}-jobs.png"
    info = png_gantt(plan, out)
    assert out.read_bytes()[:8] == PNG
    assert info["layout"] == layout
    # one row per job when there are many: every job is labelled
    assert info["rows"] == (n if layout == "per-job" else info["rows"])
    if layout == "summary":  # one screen: a panel per GPU type and one of jobs over time
        used = sorted({w.gpu_type for jp in plan.jobs for sg in jp.segments
                       for w in sg.workers})
        assert set(used) <= set(info["types"]) and info["rows"] == len(info["types"]) + 1
        assert info["inches"][1] <= 11.0
        jobs_png = artefacts / f"gantt-{n}-jobs-jobs.png"
        assert info["jobs_file"] == str(jobs_png) and info["jobs_rows"] == n
        assert jobs_png.read_bytes()[:8] == PNG
    size, unit = time_unit(plan.makespan_s)
    assert info["unit"] == unit and size > 1  # minutes or hours, not seconds
    ticks = [float(t.replace("\u2212", "-")) for t in info["xticks"] if t]
    assert ticks and max(ticks) < 1000  # human numbers, no offset or raw seconds
    assert max(ticks) * size >= 0.5 * plan.makespan_s  # and they span the plan


@pytest.mark.slow
def test_bundled_example_draws_per_gpu_with_names(artefacts: Path, examples) -> None:
    from hetsched.io.profiles import load_throughputs
    from hetsched.io.specs import load_cluster, load_jobs

    plan = plan_problem(PlanningProblem(load_jobs(examples["jobs"]),
                                        load_cluster(examples["cluster"]),
                                        load_throughputs(examples["throughputs"])), "has")
    info = png_gantt(plan, artefacts / "gantt-example.png")
    assert info["layout"] == "per-gpu" and info["unit"] in ("min", "h")
    # a name once per segment at most (not on every GPU row of it), where it fits
    segments = sum(len(jp.segments) for jp in plan.jobs)
    assert 0 < info["labels"] <= segments


def test_predicted_vs_measured(artefacts: Path) -> None:
    rows = [{"job": "a", "predicted_iter_s": 0.10, "measured_iter_s": 0.104},
            {"job": "b", "predicted_iter_s": 0.30, "measured_iter_s": 0.45},
            {"job": "c", "predicted_iter_s": 0.05, "measured_iter_s": None}]
    info = png_predicted_vs_measured(rows, artefacts / "predicted-vs-measured.png")
    assert info == {"points": 2, "within_10pct": 1, "labels": 2}
    # points that sit on top of each other: one label, the others left out (and said)
    close = [{"job": f"job-{k}", "predicted_iter_s": 0.10 + k * 1e-4,
              "measured_iter_s": 0.11 + k * 1e-4} for k in range(5)]
    info = png_predicted_vs_measured(close, artefacts / "pvm-close.png")
    assert info["points"] == 5 and info["labels"] == 1
    empty = png_predicted_vs_measured([], artefacts / "pvm-empty.png")
    assert empty["points"] == 0 and (artefacts / "pvm-empty.png").read_bytes()[:8] == PNG
