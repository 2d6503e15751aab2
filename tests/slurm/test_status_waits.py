"""`status` says a job waits (a replan could not place it) only while it is not running:
a job Slurm runs again does not keep "waits: ..." from an older replan."""

from __future__ import annotations

from pathlib import Path

from slurm_helpers import contract_plan

from hetsched.app.status import batch_status
from hetsched.app.submit import submit
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store


def test_waits_is_not_kept_on_a_job_that_runs_again(tmp_path: Path) -> None:
    plan = contract_plan("wait1", {"w1": [[("t4-1", "t4", 4)]]})
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        submit(plan, st, slurm)
        st.add_event("job-waiting", job="w1", detail="unknown GPU type 'x9'", handled=True)
        (job,) = batch_status(st, slurm)
        assert job.state == "PENDING" and job.reason == "waits: unknown GPU type 'x9'"
        assert slurm.schedule()  # Slurm starts it
        (job,) = batch_status(st, slurm)
        assert job.state == "RUNNING" and "waits" not in job.reason
