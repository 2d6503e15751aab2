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
    monkeypatch.setenv("HETSCHED_TEST_SLEEP", "1")  # the job steps' stand-in ends at once
    plan = contract_plan("apitb", {"short": [[("t4-1", "t4", 4)]],
                                   "other": [[("v100-1", "v100", 4)]]})
    batch = hetsched.submit(plan, state=tmp_path / "s.db", partition="gpu", client=client)
    assert batch["short"].wait(timeout_s=60, poll_s=0.5) == "COMPLETED"
    assert "fake hetsched" in batch["short"].stdout()
    res = batch["short"].result()
    assert res["actual_start"] and res["actual_end"] and res["placement"] == "t4-1:0"
    batch["other"].cancel(reason="api test")
    assert batch["other"].wait(timeout_s=30, poll_s=0.5) == "CANCELLED"
