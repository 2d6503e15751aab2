"""On the real testbed: scancel sticks, a pinned job on a down node does not wedge
replan, and a replan after one completion changes only what it must."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lock_helpers import a_replan_holding
from slurm_helpers import invoke, make_testbed_plan, throughput_rows, wait_for

from hetsched.app.monitor import Monitor
from hetsched.app.replan import latest_rows, replan
from hetsched.app.submit import submit
from hetsched.cli import slurm as cli_slurm
from hetsched.core.throughput import ThroughputTable
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

pytestmark = pytest.mark.slurm

TWO = """jobs:
  - {name: P, workload: w, dataset_size: 100000, epochs: 1, global_batch: 64,
     gpu_types: [a100], min_gpus: 2, max_gpus: 2, command: [train]}
  - {name: Q, workload: w, dataset_size: 100000, epochs: 1, global_batch: 64,
     gpu_types: [t4], min_gpus: 2, max_gpus: 2, command: [train]}
"""


def _table() -> ThroughputTable:
    return ThroughputTable(throughput_rows())


def _state(client: CliSlurmClient, jid: str) -> str:
    return {j.leader: j.state for j in client.jobs()}.get(jid, "?")


def test_scancel_sticks(testbed: Testbed, client: CliSlurmClient, clean_queue: None,
                        tmp_path: Path) -> None:
    plan = make_testbed_plan(client, TWO)
    state = tmp_path / "s.db"
    with open_store(state) as st:
        ids = dict(submit(plan, st, client, partition="gpu").submitted)
        wait_for(lambda: _state(client, ids["P"]) == "RUNNING", 20, "P to run")
        Monitor(st, client, partition="gpu").poll()
        client.runner.run(["scancel", ids["P"]])  # the user, outside hetsched
        wait_for(lambda: _state(client, ids["P"]) == "CANCELLED", 20, "P to be cancelled")
        for _ in range(2):
            r = replan(st, client, _table(), partition="gpu", force=True)
            assert "P" not in dict(r.submitted) and r.user_cancelled == ["P"], r.summary()
        assert latest_rows(st)["P"].slurm_id == ids["P"]
    # and through hetsched, with a reason that status shows
    code, out = invoke(cli_slurm.cancel_cmd, ["Q", "--reason", "bad config",
                                              "--state", str(state)])
    assert code == 0 and f"cancelled Q (Slurm job {ids['Q']})" in out
    wait_for(lambda: _state(client, ids["Q"]) == "CANCELLED", 20, "Q to be cancelled")
    code, out = invoke(cli_slurm.status_cmd, ["--state", str(state), "--format", "json"])
    assert code == 0 and "bad config" in out
    with open_store(state) as st:
        r = replan(st, client, _table(), partition="gpu", force=True)
        assert r.submitted == [] and sorted(r.user_cancelled) == ["P", "Q"]


def test_pinned_job_on_a_down_node_waits_and_the_rest_is_replanned(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    plan = make_testbed_plan(client, TWO)
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(plan, st, client, partition="gpu").submitted)
        wait_for(lambda: all(_state(client, i) == "RUNNING" for i in ids.values()), 20,
                 "both to run")
        Monitor(st, client, partition="gpu").poll()
        for node in ("a100-1", "a100-2"):  # every a100 node: P has nowhere to go
            testbed.stop_node(node)
            client.runner.run(["scontrol", "update", f"nodename={node}", "state=down",
                               "reason=hetsched-test"])
        client.runner.run(["scancel", "--signal=KILL", ids["Q"]])  # Q fails meanwhile
        wait_for(lambda: _state(client, ids["Q"]) not in ("RUNNING", "COMPLETING"), 20,
                 "Q to end")
        logs: list[str] = []
        r = replan(st, client, _table(), partition="gpu", log=logs.append)
        assert [j for j, _ in r.waiting] == ["P"] and "a100" in r.waiting[0][1], r.summary()
        assert any("job P: waits" in m for m in logs)
        code, out = invoke(cli_slurm.status_cmd, ["--state", str(tmp_path / "s.db"),
                                                  "--format", "json"])
        assert code == 0
    for node in ("a100-1", "a100-2"):
        testbed.start_node(node)


def test_replan_after_one_completion_changes_only_what_it_must(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = "jobs:\n" + "".join(
        f"  - {{name: r{i}, workload: w, dataset_size: {20000 + 4000 * i}, epochs: 1, "
        "global_batch: 64, gpu_types: [v100], min_gpus: 2, max_gpus: 2, command: [train]}\n"
        for i in range(6))
    monkeypatch.setenv("HETSCHED_TEST_SLEEP", "300")
    plan = make_testbed_plan(client, jobs)
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(plan, st, client, partition="gpu").submitted)
        wait_for(lambda: sum(_state(client, i) == "RUNNING" for i in ids.values()) == 4, 30,
                 "four jobs (8 v100 GPUs) to run")
        Monitor(st, client, partition="gpu").poll()
        done = next(n for n, i in ids.items() if _state(client, i) == "RUNNING")
        client.runner.run(["scancel", "--signal=KILL", ids[done]])  # ends; KILL -> FAILED
        wait_for(lambda: _state(client, ids[done]) not in ("RUNNING", "COMPLETING"), 20,
                 "the job to end")
        running = {n for n, i in ids.items() if _state(client, i) == "RUNNING"}
        r = replan(st, client, _table(), partition="gpu", max_failures=0)
        cancelled = {j for j, _ in r.cancelled}
        assert not cancelled & running, r.summary()  # no running job was moved
        moved = {c.job for c in r.changes if "dependency" not in c.why}
        assert cancelled <= moved
        for n in running:
            assert _state(client, ids[n]) == "RUNNING"
            assert latest_rows(st)[n].slurm_id == ids[n]


def test_a_cancel_typed_while_a_replan_holds_the_batch_waits_and_says_so(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    """The real CLI: `hetsched cancel --all` while a replan holds the batch's lock waits
    for it, saying who it waits for, then cancels (tests/slurm/test_replan_races_memory.py:
    why)."""
    plan = make_testbed_plan(client, TWO)
    state = tmp_path / "s.db"
    with open_store(state) as st:
        ids = dict(submit(plan, st, client, partition="gpu").submitted)
    with a_replan_holding(state, 3):
        r = subprocess.run([sys.executable, "-m", "hetsched", "cancel", "--all"],
                           env={**os.environ, "HETSCHED_STATE": str(state)},
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"waiting for a replan (pid {os.getpid()}), which holds the "
                               "batch's lock, to finish"), r.stderr
    for name in ("P", "Q"):
        assert f"cancelled {name} (Slurm job {ids[name]})" in r.stdout
    wait_for(lambda: all(_state(client, i) in ("CANCELLED", "?") for i in ids.values()), 20,
             "both to be cancelled")
