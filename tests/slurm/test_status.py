"""`hetsched status` on the testbed: every job, full names, JSON, and read-only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_helpers import contract_plan, invoke, wait_for

from hetsched.app.submit import files_dir, submit
from hetsched.cli import slurm as cli_slurm
from hetsched.io.jobfiles import JobFiles
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

pytestmark = pytest.mark.slurm

LONG = "a-very-long-job-name-that-a-table-would-usually-cut-" + "x" * 20


def test_status_is_read_only_and_shows_every_job(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    code, out = invoke(cli_slurm.status_cmd, ["--state", str(missing)])
    assert code == 0 and "no state file" in out and not missing.exists()

    state = tmp_path / "s.db"
    plan = contract_plan("st1", {LONG: [[("t4-1", "t4", 4)]], "second": [[("t4-1", "t4", 4)] * 4],
                                 "never": [[("a100-1", "a100", 8)]]})
    with open_store(state) as st:
        submit(plan, st, client, partition="gpu", only={LONG, "second"})
        report = JobFiles.of(files_dir(st), plan, LONG).report  # where its ranks write
        report.parent.mkdir(parents=True)
        report.write_text(
            json.dumps({"kind": "steps", "step_s": 0.25, "rank": 0}) + "\n")
        n_events = len(st.events())
    wait_for(lambda: any(j.state == "RUNNING" for j in client.jobs()
                         if j.comment.startswith("hetsched:st1:")), 20, "one job to run")
    # "second" needs all four t4 GPUs: it waits for LONG
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("s.db*")}
    code, out = invoke(cli_slurm.status_cmd, ["--state", str(state), "--format", "json"])
    assert code == 0, out
    data = json.loads(out)
    jobs = {j["job"]: j for j in data["jobs"]}
    assert set(jobs) == {LONG, "second", "never"}
    assert jobs[LONG]["state"] == "RUNNING" and jobs[LONG]["elapsed_s"] is not None
    assert jobs[LONG]["measured_iter_s"] == 0.25 and jobs[LONG]["predicted_end"]
    assert jobs["second"]["state"] == "PENDING" and jobs["second"]["reason"]
    assert jobs["never"]["state"] == "NOT_SUBMITTED"
    assert data["counts"]["running"] == 1 and data["commands"] == 1
    code, out = invoke(cli_slurm.status_cmd, ["--state", str(state)])
    assert code == 0 and LONG in out  # the full name, never cut
    with open_store(state) as st:
        assert len(st.events()) == n_events  # status recorded nothing
    after = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("s.db*")}
    assert after["s.db"] == before["s.db"]


def test_watch_prints_counts(testbed: Testbed, client: CliSlurmClient, clean_queue: None,
                             tmp_path: Path) -> None:
    state = tmp_path / "s.db"
    with open_store(state) as st:
        submit(contract_plan("wc1", {"w1": [[("t4-1", "t4", 4)]]}), st, client,
               partition="gpu")
    code, out = invoke(cli_slurm.watch_cmd, ["--state", str(state), "--cycles", "1",
                                             "--interval", "0.1"])
    assert code == 0 and ("pending 1" in out or "running 1" in out), out
