"""A partition with a MaxTime, on the real testbed.

Slurm keeps a job whose --time is above its partition's MaxTime pending for
ever (reason PartitionTimeLimit) unless the site enforces partition limits at
submission. hetsched's own limit (1.5x the prediction plus 10 minutes) is now
capped at MaxTime, where the job checkpoints and requeues itself; a `time`
the user gave above it, and a pool plan (no requeue) that needs more, are
refused in one line before anything is submitted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import contract_plan, wait_for

from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed

pytestmark = pytest.mark.slurm


@pytest.fixture()
def max_time_5(testbed: Testbed, client: CliSlurmClient, clean_queue: None) -> Iterator[None]:
    client.runner.run(["scontrol", "update", "PartitionName=gpu", "MaxTime=5"])
    try:
        yield
    finally:
        client.runner.run(["scontrol", "update", "PartitionName=gpu", "MaxTime=UNLIMITED"])


def _hetsched(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from hetsched.cli.main import main; main()",
                           *args], capture_output=True, text=True, timeout=120,
                          env=env or dict(os.environ))


def test_max_time_caps_hetscheds_limit_and_refuses_a_longer_one(
        max_time_5: None, client: CliSlurmClient, tmp_path: Path) -> None:
    assert client.partition_info("gpu").max_time_min == 5
    assert client.partition_info(None).max_time_min == 5  # gpu is the default partition
    assert not client.partition_info("gpu").exclusive
    # each segment is predicted at 100 s: hetsched's own limit would be 13 min
    plan = contract_plan("maxt1", {"mt": [[("v100-1", "v100", 8)]]})
    pf = tmp_path / "plan.json"
    pf.write_text(plan.to_json())
    state = tmp_path / "state.db"

    res = _hetsched("submit", str(pf), "--state", str(state), "--time", "20")
    assert res.returncode == 2
    assert not [j for j in client.jobs() if j.name == "mt"]  # nothing reached Slurm
    assert res.stderr.strip() == (
        "hetsched: error: job 'mt': time: 20 is above partition gpu's MaxTime of 5 min: "
        "Slurm would keep the job pending for ever (PartitionTimeLimit); give at most that, "
        "or no time (then hetsched's own limit stays within it and the job checkpoints and "
        "requeues itself at the limit)")

    res = _hetsched("submit", str(pf), "--state", str(state))
    assert res.returncode == 0, res.stderr
    assert "MaxTime of 5 min (mt 13 min)" in res.stderr
    [script] = (tmp_path / "state.db.files" / "scripts").rglob("mt-0.sh")
    lines = script.read_text().splitlines()
    assert "#SBATCH --time=5" in lines and "#SBATCH --signal=B:USR1@150" in lines
    [job] = [j for j in client.jobs() if j.name == "mt"]

    def started() -> bool:
        return any(j.state == "RUNNING" for j in client.jobs() if j.job_id == job.job_id)

    wait_for(started, 30, "the capped job to start (not PartitionTimeLimit)")
    assert job.time_limit_min == 5
