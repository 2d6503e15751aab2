"""A site whose GRES types have capitals (``gpu:A100:2``, ``gpu:Tesla_V100:1``), on a real Slurm.

Slurm matches GRES types case-sensitively, and hetsched names GPU types in
lower case. Every script that asks for a typed GPU (``--gres=gpu:TYPE:N``: a
probe, a pool plan's hetjob, a co-location group, a job not pinned to its
node) asked for ``gpu:a100:1``, which sbatch refused ("Requested node
configuration is not available"): every probe was marked unusable and no pool
plan could be submitted. Scripts now spell each type as sinfo does. GPUs with
no GRES type (``Gres=gpu:1``, hetsched's type ``gpu``) were asked for as
``gpu:gpu:1``; they are asked for as ``gpu:1``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import wait_for

from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.runner import Runner
from hetsched.slurm.testbed import Testbed

pytestmark = pytest.mark.slurm

JOBS = """
jobs:
  - {name: c1, workload: mlp, dataset_size: 960, epochs: 1, global_batch: 48,
     min_gpus: 1, max_gpus: 1, gpu_types: [A100, Tesla_V100, gpu]}
  - {name: c2, workload: mlp, dataset_size: 960, epochs: 1, global_batch: 48,
     min_gpus: 1, max_gpus: 1, gpu_types: [A100, Tesla_V100, gpu]}
"""


@pytest.fixture(scope="module")
def capital_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    if shutil.which("slurmctld") is None:
        pytest.skip("needs slurmctld/slurmd/munge (apt-get install slurmctld slurmd munge)")
    tb = Testbed(tmp_path_factory.mktemp("caps") / "tb", nodes="A100:1x2,Tesla_V100:1x1,gpu:1x1")
    try:
        tb.up(timeout_s=60)
        yield tb
    finally:
        tb.down()


def _hetsched(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from hetsched.cli.main import main; main()",
                           *args], capture_output=True, text=True, env=env, timeout=300)


def test_probes_and_typed_gres_scripts_use_slurms_spelling(capital_bed: Testbed,
                                                          tmp_path: Path) -> None:
    client = CliSlurmClient(Runner(env=capital_bed.env(), timeout_s=20, retries=2))
    real = tmp_path / "hetsched"  # the probes run the real `hetsched probe`
    real.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'from hetsched.cli.main import "
                    "main; main()' \"$@\"\n")
    real.chmod(0o755)
    env = {**os.environ, **capital_bed.env(), "HETSCHED_EXECUTABLE": str(real),
           "HETSCHED_STATE": str(tmp_path / "state.db")}
    (tmp_path / "jobs.yaml").write_text(JOBS)
    res = _hetsched(env, "profile", str(tmp_path / "jobs.yaml"))
    assert res.returncode == 0, res.stderr
    assert "3/3 probes ok" in res.stdout, res.stdout + res.stderr

    # the job steps: a stand-in that ends at once (Slurm taking the script is the point)
    env["HETSCHED_EXECUTABLE"] = "/bin/true"
    ids = []
    for mode, extra in (("space", ["--any-node"]), ("pool", [])):
        out = tmp_path / f"{mode}.json"
        res = _hetsched(env, "plan", str(tmp_path / "jobs.yaml"), "--mode", mode,
                        "--out", str(out), "--format", "json")
        assert res.returncode == 0, res.stderr
        state = str(tmp_path / f"{mode}.db")
        res = _hetsched(env, "submit", str(out), *extra, "--state", state)
        assert res.returncode == 0, res.stderr
        scripts = list((tmp_path / f"{mode}.db.files" / "scripts").rglob("*.sh"))
        gres = {line for s in scripts for line in s.read_text().splitlines()
                if line.startswith("#SBATCH --gres=gpu:")}
        assert gres and gres <= {f"#SBATCH --gres=gpu:{t}{k}" for t in ("A100:", "Tesla_V100:", "")
                                 for k in (1, 2)}, gres
        sub = json.loads(_hetsched(env, "status", "--state", state, "--format", "json").stdout)
        ids += sorted({str(j["slurm_id"]) for j in sub["jobs"]})

    def done() -> bool:
        states = {j.leader: j.state for j in client.jobs()}
        return all(states.get(i) == "COMPLETED" for i in ids)

    wait_for(done, 60, f"jobs {ids} to complete")
