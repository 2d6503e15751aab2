"""Slurm not answering, on the in-memory Slurm (fast; test_slurm_down.py has the real one).

A non-answer is never an empty queue: status, cancel and the monitor raise
SlurmUnavailable ("Slurm did not answer") and change nothing; watch waits it
out and says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_helpers import contract_plan

from hetsched.app.cancel import cancel_jobs
from hetsched.app.monitor import Monitor, watch
from hetsched.app.replan import latest_rows
from hetsched.app.status import batch_status
from hetsched.app.submit import submit
from hetsched.errors import EXIT_SLURM_DOWN
from hetsched.slurm.memory import MemorySlurm
from hetsched.slurm.runner import SlurmUnavailable
from hetsched.state.store import open_store


def test_a_non_answer_changes_nothing(tmp_path: Path) -> None:
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(contract_plan("dn1", {"x": [[("t4-1", "t4", 4)]]}), st, slurm,
                          partition="gpu").submitted)
        slurm.schedule()
        before = {n: (r.slurm_id, r.state) for n, r in latest_rows(st).items()}
        unhandled = [e["id"] for e in st.events(unhandled_only=True)]
        slurm.down = True
        for call in (lambda: batch_status(st, slurm), lambda: cancel_jobs(st, slurm, ["x"]),
                     lambda: Monitor(st, slurm, partition="gpu").poll()):
            with pytest.raises(SlurmUnavailable, match="^Slurm did not answer") as e:
                call()
            assert e.value.exit_code == EXIT_SLURM_DOWN
            assert {n: (r.slurm_id, r.state) for n, r in latest_rows(st).items()} == before
        # the failed cancel is on record, and is no reset event
        assert [e["id"] for e in st.events(unhandled_only=True)] == unhandled
        kinds = [e["kind"] for e in st.events()]
        assert kinds[-1] == "cancel-failed" and "job-cancelled" not in kinds
        assert slurm.jobs_by_id[ids["x"]].state == "RUNNING"
        slurm.down = False
        assert {j.job: j.state for j in batch_status(st, slurm)} == {"x": "RUNNING"}


def test_watch_waits_out_a_non_answer_and_says_so(tmp_path: Path) -> None:
    slurm = MemorySlurm()
    waits: list[str] = []
    polls = []
    with open_store(tmp_path / "s.db") as st:
        submit(contract_plan("dn2", {"y": [[("t4-1", "t4", 4)]]}), st, slurm, partition="gpu")
        slurm.down = True

        def sleep(_s: float) -> None:  # the controller comes back after two failed polls
            polls.append(_s)
            if len(waits) >= 2:
                slurm.down = False

        n = watch(Monitor(st, slurm, partition="gpu"), interval_s=1, cycles=1,
                  on_wait=waits.append, sleep=sleep)
    assert n == 1 and len(waits) == 2
    assert all(w.startswith("Slurm did not answer: ") and "retrying in" in w for w in waits)
