"""`replan` in online mode on the real testbed: a started job's decision is stable."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_helpers import make_testbed_plan, throughput_rows, wait_for

from hetsched.app.replan import replan
from hetsched.app.submit import submit
from hetsched.core.throughput import ThroughputTable
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

pytestmark = pytest.mark.slurm

ELASTIC = """jobs:
  - {name: A, workload: w, dataset_size: 2000000, epochs: 1, global_batch: 64,
     gpu_types: [v100], min_gpus: 1, max_gpus: 8, command: [train]}
"""
NEW = """jobs:
  - {name: C, workload: w, dataset_size: 2000000, epochs: 1, global_batch: 64,
     gpu_types: [v100], min_gpus: 1, max_gpus: 8, command: [train]}
"""


def test_online_replan_keeps_a_started_job_and_places_the_new_one(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    table = ThroughputTable(throughput_rows())
    plan = make_testbed_plan(client, ELASTIC, policy="optimus")
    k = len(plan.job("A").segments[0].workers)
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(plan, st, client, partition="gpu").submitted)
        wait_for(lambda: {j.leader: j.state for j in client.jobs()}.get(ids["A"]) == "RUNNING",
                 30, "A to run")
        spool = tmp_path / "spool"
        spool.mkdir()
        (spool / "new.yaml").write_text(NEW)
        # offline, the keep-or-move decision may shrink A to share the v100s with C;
        # whichever it chose, the plan is what replan does with A in Slurm
        off = replan(st, client, table, partition="gpu", spool=spool, dry_run=True,
                     online=False)
        off_a = next(j for j in (off.plan or {})["jobs"] if j["name"] == "A")
        held = {(w["node"], w["gpu"]) for w in st.submissions(job="A")[-1].workers}
        off_held = {(w["node"], w["gpu"]) for w in off_a["segments"][0]["workers"]}
        assert (off_held == held) == ("A" in off.kept), (off_a, off.summary())
        chosen = (off.plan or {})["keep_or_move"]["chosen"]
        assert (off_held == held) == (chosen in ("keep", "wait")), chosen
        on = replan(st, client, table, partition="gpu", spool=spool, online=True)
        assert on.status == "replanned", on.summary()
        assert "A" in on.kept and not on.cancelled
        assert [j for j, _ in on.submitted] == ["C"]
        jobs = {j["name"]: j for j in (on.plan or {})["jobs"]}
        assert len(held) == k
        # online: A's decision is kept (same GPUs), C gets its window when they free up
        assert {(w["node"], w["gpu"]) for w in jobs["A"]["segments"][0]["workers"]} == held
        assert jobs["C"]["start_s"] >= jobs["A"]["end_s"] - 1e-6
        states = {j.leader: j.state for j in client.jobs()}
        assert states[ids["A"]] == "RUNNING"  # never touched
