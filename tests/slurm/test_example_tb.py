"""The README's "End to end on the local testbed", command by command, as a user types it:
probe the bundled testbed example, plan it from Slurm and the profile history, submit
it, and every job trains to its end through the real `hetsched run`."""

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

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "testbed-jobs.yaml"


def _hetsched(args: list[str], env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-m", "hetsched", *args], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, (args, r.stderr)
    assert "Traceback" not in r.stderr
    return r.stdout


def test_the_readme_testbed_walkthrough(testbed: Testbed, client: CliSlurmClient,
                                        clean_queue: None, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    use_real_hetsched(tmp_path, monkeypatch)
    env = {**os.environ, "HETSCHED_STATE": str(tmp_path / "state.db")}
    probes = json.loads(_hetsched(["profile", str(EXAMPLE), "--format", "json"], env))
    assert sorted((p["workload"], p["gpu_type"], p["status"]) for p in probes["probes"]) == [
        (w, g, "ok") for w in ("cnn", "mlp", "transformer") for g in ("a100", "t4", "v100")]
    _hetsched(["plan", str(EXAMPLE), "--out", str(tmp_path / "plan.json")], env)
    _hetsched(["submit", str(tmp_path / "plan.json")], env)

    def states() -> dict[str, str]:
        doc = json.loads(_hetsched(["status", "--format", "json"], env))
        return {j["job"]: j["state"] for j in doc["jobs"]}

    wait_for(lambda: all(s not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
                         for s in states().values()), 240, "the example's jobs to end",
             every_s=2)
    assert states() == {"mlp-small": "COMPLETED", "cnn-small": "COMPLETED",
                        "transformer-small": "COMPLETED"}
