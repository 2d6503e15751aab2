"""The layout file `hetsched run` reads at start (io/layout.py, runtime/job.py): a replan
that changes a pending job in place rewrites it; the script carries no rank layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.errors import InputError
from hetsched.io.layout import Layout, read_layout, write_layout
from hetsched.runtime.job import layout_mismatch, read_job_layout

ROOT = Path(__file__).resolve().parents[2]

RANK1 = {"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_STEP_NUM_TASKS": "3",
         "SLURM_LOCALID": "0", "SLURMD_NODENAME": "t4-1", "SLURM_JOB_ID": "77",
         "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "a100-1,t4-1"}


def _layout(groups: tuple, plan: str = "/p.json", job: str = "j") -> Layout:
    return Layout(plan, "p1", job, 0, groups)


OLD = (("a100", "a100-1", (16, 16)), ("t4", "t4-1", (8,)))
NEW = (("v100", "v100-2", (20,)), ("t4", "t4-1", (6, 6)))


def test_round_trip_and_one_line_errors(tmp_path: Path) -> None:
    p = tmp_path / "l.json"
    write_layout(p, _layout(OLD))
    lay = read_layout(p)
    assert lay == _layout(OLD)
    assert [w["local_batch"] for w in lay.workers()] == [16, 16, 8]
    for bad, field in (({"version": 9}, "version"), ({**lay.to_dict(), "groups": []}, "groups"),
                       ({**lay.to_dict(), "segment": -1}, "segment"),
                       ({**lay.to_dict(), "groups": [{"gpu_type": "t4", "node": "t4-1",
                                                      "local_batches": [0]}]}, "groups")):
        p.write_text(json.dumps(bad))
        with pytest.raises(InputError) as ei:
            read_layout(p)
        assert field in str(ei.value) and "\n" not in str(ei.value)


def test_a_layout_must_match_the_allocation() -> None:
    env = {**RANK1, "SLURMD_NODENAME": "a100-1"}  # ranks 0, 1 on a100-1, rank 2 on t4-1
    assert layout_mismatch(_layout(OLD), "j", env) == ""
    assert "rank 1 on t4-1" in layout_mismatch(_layout(NEW), "j", env)
    assert "2 ranks" in layout_mismatch(_layout((("t4", "t4-1", (8, 8)),)), "j", env)
    assert "job 'x'" in layout_mismatch(_layout(OLD, job="x"), "j", env)
    assert layout_mismatch(_layout(NEW), "j", {}) == ""  # outside Slurm: nothing to check


def test_a_starting_job_waits_for_the_replan_to_write_its_layout(tmp_path: Path) -> None:
    """scontrol update lands first, the layout file right after: a job starting in between
    re-reads it; one that never matches fails with one line."""
    p = tmp_path / "l.json"
    write_layout(p, _layout(OLD))
    env = {**RANK1, "SLURMD_NODENAME": "t4-1"}  # the new allocation: rank 1 on t4-1
    naps: list[float] = []

    def replan_writes(s: float) -> None:
        naps.append(s)
        write_layout(p, _layout(NEW))

    assert read_job_layout(str(p), "j", env, sleep=replan_writes).groups == NEW
    assert len(naps) == 1
    write_layout(p, _layout(OLD))
    with pytest.raises(InputError, match="does not match this job's allocation: it puts "
                                         "rank 1 on a100-1, Slurm started it on t4-1"):
        read_job_layout(str(p), "j", env, wait_s=0.0, sleep=lambda s: None)


def test_run_takes_its_batch_from_the_layout_not_the_plan(tmp_path: Path) -> None:
    """The real `hetsched run` in command mode, as rank 1 of a 3-task step."""
    plan = {"version": 1, "policy": "test", "plan_id": "p1",
            "objective": {"weighted_jct_s": 1.0, "avg_jct_s": 1.0, "makespan_s": 1.0},
            "lower_bound": {"weighted_jct_s": 1.0},
            "jobs": [{"name": "j", "weight": 1.0, "arrival_s": 0.0, "start_s": 0.0,
                      "end_s": 1.0, "segments": [{"start_s": 0.0, "end_s": 1.0, "workers": [
                          {"node": "a100-1", "gpu_type": "a100", "gpu": g, "local_batch": 20}
                          for g in range(2)]}],
                      "spec": {"name": "j", "workload": "w", "global_batch": 40,
                               "dataset_size": 100, "epochs": 1,
                               "command": [sys.executable, "-c",
                                           "import os; print('batch', os.environ["
                                           "'HETSCHED_LOCAL_BATCH'], os.environ["
                                           "'HETSCHED_LOCAL_BATCHES'])"]}}]}
    pf = tmp_path / "plan.json"
    pf.write_text(json.dumps(plan))
    lf = tmp_path / "layout.json"
    # the replan moved the pending job: 3 ranks, 16 + 16 + 8 (global batch 40 kept)
    write_layout(lf, Layout(str(pf), "p1", "j", 0, OLD))
    env = {**os.environ, **RANK1, "SLURMD_NODENAME": "a100-1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "hetsched", "run", "--plan", "/nonexistent.json",
                        "--job", "j", "--layout", str(lf)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["batch", "16", "16,16,8"]
