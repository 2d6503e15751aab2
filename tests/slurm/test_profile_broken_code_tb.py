"""`hetsched profile` of a job whose code does not load, on a real Slurm: nothing is
recorded, the command exits 1, and after the fix a plain `profile` probes again.

Before, each probe ended FAILED and marked its pair unusable, on every GPU type: the
next `profile` skipped them all ("3 are marked unusable") after the user had fixed the
import, and `plan` refused the workload. The probe's program exits 2 (bad input), which
Slurm 22.05's `squeue --json` reports as the raw wait status 512.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import use_real_hetsched

from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed

pytestmark = pytest.mark.slurm

JOBS = """
jobs:
  - {name: mine, workload: mine, dataset_size: 256, epochs: 1, global_batch: 8,
     gpu_types: [t4], entrypoint: "mytrain:build"}
"""


def test_a_probe_whose_code_does_not_load_records_nothing(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    use_real_hetsched(tmp_path, monkeypatch)
    (tmp_path / "jobs.yaml").write_text(JOBS)
    (tmp_path / "mytrain.py").write_text("import a_module_nobody_installed\n")
    env = {**os.environ, "HETSCHED_STATE": str(tmp_path / "state.db")}

    def hetsched(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hetsched", *args], env=env, text=True,
                              capture_output=True, timeout=300)

    r = hetsched("profile", str(tmp_path / "jobs.yaml"))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "0/1 probes ok" in r.stdout and "1 did not load the job's code or data" in r.stdout
    assert "probe mine on t4: did not load (exit 2, the job's code or data; last line of " \
           "its log: hetsched: error: entrypoint: cannot import 'mytrain'" in r.stderr
    listed = hetsched("profiles", "list", "--format", "json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []  # no unusable mark
    (tmp_path / "mytrain.py").write_text(
        "from hetsched.runtime.workloads import mlp as build\n")
    r = hetsched("profile", str(tmp_path / "jobs.yaml"))  # no --retry-unusable needed
    assert r.returncode == 0 and "1/1 probes ok" in r.stdout, (r.stdout, r.stderr)
