"""A user's own code beside the jobs file, submitted from another directory.

A job's `entrypoint` module and its `command`'s relative paths live in the
user's project directory, beside jobs.yaml. `hetsched replan` under cron runs
in the home directory, and sbatch starts each step where it was called: before
a job had a working directory of its own, the entrypoint job failed with "No
module named 'mytrain'" and the command job with "can't open file
'//train_cmd.py'" whenever submit ran anywhere but the project directory.
Here every command runs with cwd "/", as cron's would be a stranger's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import use_real_hetsched, wait_for

from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed

pytestmark = pytest.mark.slurm

MODULE = """
import torch
from torch import nn
from torch.utils.data import TensorDataset

def build(dataset_size, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(dataset_size, 20, generator=g)
    y = (x.sum(1) > 0).long()
    return {"model": nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2)),
            "dataset": TensorDataset(x, y),
            "loss_fn": nn.functional.cross_entropy,
            "optimizer": lambda p: torch.optim.SGD(p, lr=0.1)}
"""
COMMAND = """
import os, sys
with open(sys.argv[1], "a") as f:
    f.write(f"rank {os.environ['RANK']} cwd {os.getcwd()}\\n")
"""
JOBS = """
jobs:
  - {name: own-code, workload: owncode, entrypoint: "mytrain:build", dataset_size: 256,
     epochs: 1, global_batch: 32, max_gpus: 2, gpu_types: [a100]}
  - {name: own-cmd, workload: owncmd, command: [python3, train_cmd.py, out.txt],
     dataset_size: 256, epochs: 1, global_batch: 32, max_gpus: 1, gpu_types: [a100]}
"""


def _hetsched(args: list[str], env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-m", "hetsched", *args], capture_output=True,
                       text=True, env=env, timeout=300, cwd="/")
    assert r.returncode == 0, (args, r.stderr)
    assert "Traceback" not in r.stderr
    return r.stdout


def test_own_code_beside_the_jobs_file_runs_wherever_submit_ran(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    use_real_hetsched(tmp_path, monkeypatch)
    project = tmp_path / "my project"  # a blank in the path, as users' folders have
    project.mkdir()
    (project / "mytrain.py").write_text(MODULE)
    (project / "train_cmd.py").write_text(COMMAND)
    (project / "jobs.yaml").write_text(JOBS)
    csv = tmp_path / "cmd.csv"
    csv.write_text("workload,gpu_type,local_batch,step_time_s\nowncmd,a100,32,0.02\n")
    env = {**os.environ, "HETSCHED_STATE": str(tmp_path / "state.db")}
    env.pop("PYTHONPATH", None)  # the module is found through the job's workdir only

    probes = json.loads(_hetsched(["profile", str(project / "jobs.yaml"), "--format", "json"],
                                  env))
    assert [(p["workload"], p["status"]) for p in probes["probes"]] == [("owncode", "ok")]
    _hetsched(["profiles", "import", str(csv)], env)
    _hetsched(["submit", str(project / "jobs.yaml")], env)

    def states() -> dict[str, str]:
        doc = json.loads(_hetsched(["status", "--format", "json"], env))
        return {j["job"]: j["state"] for j in doc["jobs"]}

    wait_for(lambda: all(s not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
                         for s in states().values()), 180, "the jobs to end", every_s=2)
    assert states() == {"own-code": "COMPLETED", "own-cmd": "COMPLETED"}
    assert (project / "out.txt").read_text() == f"rank 0 cwd {project}\n"
    [report] = (tmp_path / "state.db.files" / "reports").glob("*/own-code.jsonl")
    kinds = [json.loads(line)["kind"] for line in report.read_text().splitlines()]
    assert "done" in kinds
