"""Submitting the same jobs file twice on the testbed, through the CLI, real `hetsched run`.

The same jobs file on the same partition plans to the same plan (same id).
The first batch trains and leaves the queue; `hetsched submit` of the same
file again is a second batch under ``PID.2`` whose job trains afresh: its own
report and checkpoint, as many steps as the first. The in-memory tests
(test_rerun_memory.py) hold the cases in between.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from slurm_helpers import invoke, use_real_hetsched, wait_for

from hetsched.cli import slurm as cli_slurm
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed

pytestmark = pytest.mark.slurm

JOBS = """
jobs:
  - {name: job1, workload: mlp, dataset_size: 480, epochs: 1, global_batch: 24,
     max_gpus: 1, gpu_types: [t4]}
"""
CSV = "workload,gpu_type,local_batch,step_time_s\n" + "".join(
    f"mlp,t4,{b},{0.001 * b:.4f}\n" for b in (8, 16, 24, 32))


def _done(client: CliSlurmClient, jid: str) -> bool:
    js = [j for j in client.jobs() if j.leader == jid]
    return bool(js) and all(j.finished for j in js)


def _steps(report: Path) -> int:
    return sum(1 for line in report.read_text().splitlines()
               if json.loads(line).get("kind") == "steps")


def test_the_same_jobs_file_submitted_again_is_a_new_batch(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    use_real_hetsched(tmp_path, monkeypatch)
    jobs, csv, state = tmp_path / "jobs.yaml", tmp_path / "p.csv", tmp_path / "s.db"
    jobs.write_text(JOBS)
    csv.write_text(CSV)
    args = [str(jobs), "--state", str(state), "--throughputs", str(csv), "--parsable"]

    code, out = invoke(cli_slurm.submit_cmd, args)
    assert code == 0, out
    first = out.split()[-1]
    wait_for(lambda: _done(client, first), 120, "the first batch to end")

    code, out = invoke(cli_slurm.submit_cmd, args[:-1])
    assert code == 0, out
    m = re.search(r"plan (\w+) ran to its end before: submitting its jobs again as plan "
                  r"(\w+\.2)\b", out)
    assert m, out
    pid, rid = m.groups()
    assert f"plan {rid}: 1 submitted, 0 already there" in out
    second = re.search(r"submitted job1 as Slurm job (\d+)", out).group(1)
    assert second != first
    wait_for(lambda: _done(client, second), 120, "the second batch to end")

    reports = state.parent / "s.db.files" / "reports"
    r1, r2 = reports / pid / "job1.jsonl", reports / rid / "job1.jsonl"
    assert _steps(r2) == _steps(r1) > 0  # trained afresh, not resumed from the end
    code, out = invoke(cli_slurm.status_cmd, ["--state", str(state), "--format", "json"])
    [row] = json.loads(out)["jobs"]
    assert row["slurm_id"] == second and row["state"] == "COMPLETED"
