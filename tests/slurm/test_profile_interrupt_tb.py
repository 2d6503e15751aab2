"""Ctrl-C during `hetsched profile` on a real Slurm: the probes still queued or running
are cancelled, the one that finished is recorded, and the exit code is 130.

Before, the CLI printed "interrupted" and left every probe job in the queue, where
they later took the partition's GPUs for results nobody read (the next `profile`
submitted them all again). Here the a100 and v100 nodes are held by other jobs, so
those probes wait in the queue, and the t4 probe runs to its end before the SIGINT.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import use_real_hetsched, wait_for

from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed

pytestmark = pytest.mark.slurm

JOBS = """
jobs:
  - {name: probe-me, workload: mlp, dataset_size: 256, epochs: 1, global_batch: 8}
"""


def test_ctrl_c_during_profile_cancels_its_probes_and_keeps_the_finished(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    use_real_hetsched(tmp_path, monkeypatch)
    for node in ("a100-1", "a100-2", "v100-1", "v100-2"):  # the other users' jobs
        client.runner.run(["sbatch", "-Q", "-p", "gpu", "-w", node, "--exclusive",
                           "-J", "other-user", "-o", "/dev/null", "--wrap", "sleep 600"])
    (tmp_path / "jobs.yaml").write_text(JOBS)
    env = {**os.environ, "HETSCHED_STATE": str(tmp_path / "state.db")}
    proc = subprocess.Popen([sys.executable, "-m", "hetsched", "profile",
                             str(tmp_path / "jobs.yaml"), "--force"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def probes() -> dict[str, str]:
            return {j.name.rsplit("-", 1)[-1]: j.state for j in client.jobs()
                    if j.name.startswith("hetsched-probe-") and not j.finished}

        wait_for(lambda: set(probes()) == {"a100", "v100", "t4"}, 60, "three probes queued")
        wait_for(lambda: set(probes()) == {"a100", "v100"}, 120, "the t4 probe to end",
                 every_s=1)
        assert set(probes().values()) == {"PENDING"}
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("hetsched: error: profile interrupted by SIGINT: cancelled 2 "
                           "probe job(s)"), err
    assert "1 finished probe(s) recorded" in last
    wait_for(lambda: not probes(), 30, "no probe job left in the queue")
    listed = subprocess.run([sys.executable, "-m", "hetsched", "profiles", "list",
                             "--format", "json"], env=env, text=True, capture_output=True,
                            check=True)
    assert [(r["workload"], r["gpu_type"], r["status"]) for r in json.loads(listed.stdout)
            ] == [("mlp", "t4", "ok")]  # nothing for the cancelled pairs: probed next time
