"""Runnability before submit and --skip-unplaceable, at the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from slurm_helpers import contract_plan

from hetsched.app.runnable import BUILTIN_SAMPLE_BYTES, UnrunnableError
from hetsched.app.submit import submit
from hetsched.io.plan_json import plan_from_dict
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOBS = """jobs:
  - {name: ok-cnn, workload: transformer, dataset_size: 2000, epochs: 1, global_batch: 32,
     command: [python, train.py]}
  - {name: too-big, workload: transformer, dataset_size: 2000, epochs: 1,
     global_batch: 100000}
  - {name: ok-2, workload: resnet-18, dataset_size: 5000, epochs: 1, global_batch: 64,
     entrypoint: "mypkg.train:build"}
"""


def test_builtin_table_matches_the_runtime() -> None:
    workloads = pytest.importorskip("hetsched.runtime.workloads")
    assert set(BUILTIN_SAMPLE_BYTES) == set(workloads.BUILTINS)


def _plan(tmp_path: Path, spec_over: dict[str, dict]) -> Path:
    d = contract_plan("run1", {n: [[("t4-1", "t4", 4)]] for n in spec_over}).to_dict()
    for j in d["jobs"]:
        j["spec"].pop("command")
        j["spec"].update(spec_over[j["name"]])
    p = tmp_path / "plan.json"
    p.write_text(plan_from_dict(d, "t").to_json())
    return p


def test_submit_names_the_jobs_that_would_fail(tmp_path: Path) -> None:
    pf = _plan(tmp_path, {"gavel": {"workload": "resnet-50"},
                          "huge": {"workload": "transformer", "dataset_size": 2_700_000_000},
                          "fine": {"workload": "mlp", "dataset_size": 4096}})
    plan = plan_from_dict(json.loads(pf.read_text()), "t")
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(UnrunnableError) as e:
            submit(plan, st, slurm)
        msg = str(e.value)
        assert "2 of 3 jobs would fail" in msg and "--skip-unplaceable" in msg
        assert "gavel (workload 'resnet-50' is not a built-in" in msg
        assert "huge (built-in 'transformer' would build a synthetic dataset" in msg
        assert slurm.count("sbatch") == 0
        res = submit(plan, st, slurm, skip_unrunnable=True)
    assert [n for n, _ in res.submitted] == ["fine"]
    assert sorted(n for n, _ in res.unrunnable) == ["gavel", "huge"]
    # the dry run shows every script and warns about the two
    r = subprocess.run(["hetsched", "submit", str(pf), "--dry-run"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.count("#!/bin/bash") == 3
    assert "warning: gavel would fail where it runs" in r.stderr


@pytest.mark.slow
def test_plan_skip_unplaceable(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    base = ["hetsched", "plan", str(jobs), "--cluster", str(EXAMPLES / "cluster.yaml"),
            "--throughputs", str(EXAMPLES / "gavel_throughputs.csv"), "--format", "json"]
    r = subprocess.run(base, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "too-big" in r.stderr and "pass --skip-unplaceable" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run(base + ["--skip-unplaceable"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert sorted(j["name"] for j in plan["jobs"]) == ["ok-2", "ok-cnn"]
    assert [s["job"] for s in plan["skipped_unplaceable"]] == ["too-big"]
    assert "skipped too-big: cannot be placed" in r.stderr
