"""`hetsched.submit`'s job handles on the real testbed: wait, log, cancel."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_helpers import contract_plan

import hetsched
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed

pytestmark = pytest.mark.slurm


def test_handles_wait_read_the_log_and_cancel(testbed: Testbed, client: CliSlurmClient,
                                              clean_queue: None, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSCHED_TEST_SLEEP", "120")  # the job steps' stand-in: "other" runs
    other = hetsched.submit(contract_plan("apitb2", {"other": [[("v100-1", "v100", 4)]]}),
                            state=tmp_path / "s.db", partition="gpu", client=client)
    monkeypatch.setenv("HETSCHED_TEST_SLEEP", "1")  # ... and "short" ends at once
    batch = hetsched.submit(contract_plan("apitb", {"short": [[("t4-1", "t4", 4)]]}),
                            state=tmp_path / "s.db", partition="gpu", client=client)
    assert batch["short"].wait(timeout_s=60, poll_s=0.5) == "COMPLETED"
    assert "fake hetsched" in batch["short"].stdout()
    res = batch["short"].result()
    assert res["actual_start"] and res["actual_end"] and res["placement"] == "t4-1:0"
    assert other["other"].state in ("PENDING", "RUNNING")
    other["other"].cancel(reason="api test")
    assert other["other"].wait(timeout_s=30, poll_s=0.5) == "CANCELLED"
    batch["short"].cancel()  # ended: left as it is
    assert batch["short"].wait(timeout_s=5, poll_s=0.5) == "COMPLETED"


def test_plan_without_a_cluster_reads_the_partition(testbed: Testbed, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """As `hetsched plan` without --cluster: the partition as Slurm reports it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    repo = Path(__file__).resolve().parents[2]
    rows = [{"workload": w, "gpu_type": t, "local_batch": b, "step_time_s": 0.001 * b}
            for w in ("mlp", "cnn", "transformer") for t in ("a100", "v100", "t4")
            for b in (16, 64)]
    plan = hetsched.plan(repo / "examples" / "testbed-jobs.yaml", None, rows, partition="gpu")
    assert plan.cluster["gpus"] == {"a100": 4, "t4": 4, "v100": 8}
    with pytest.raises(hetsched.HetschedError, match="partition 'nope'"):
        hetsched.plan(repo / "examples" / "testbed-jobs.yaml", None, rows, partition="nope")
